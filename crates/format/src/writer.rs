//! Writes one partition file and produces its format descriptor.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use insitu_wire::{FormatDescriptor, LayoutKind, Partitioning, WireError};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::atomic::sync_dir;
use crate::compressibility::Sampler;
use crate::descriptor::{describe, describe_hybrid};
use crate::hybrid::{ChecksummingFile, HybridWriter};
use crate::{io_err, FormatError, FormatResult};

/// How a partition's records are laid out in its file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PartitionLayout {
    /// PAX: Parquet row groups of column chunks, dictionary-encoded.
    #[default]
    Parquet,
    /// Key columns column-wise, the rest row-wise ([`crate::hybrid`]).
    Hybrid { key_columns: Vec<String> },
}

impl PartitionLayout {
    pub fn kind(&self) -> LayoutKind {
        match self {
            PartitionLayout::Parquet => LayoutKind::Parquet,
            PartitionLayout::Hybrid { .. } => LayoutKind::Hybrid,
        }
    }
}

/// Knobs of the partition writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Rows per Parquet row group or hybrid block (`row_group_rows_max`):
    /// the unit of pruning and of reads.
    pub row_group_rows_max: usize,
    pub compression: Compression,
    pub layout: PartitionLayout,
    /// The table's partitioning, recorded in the partition's descriptor.
    pub partitioning: Option<Partitioning>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            row_group_rows_max: 122_880,
            compression: Compression::SNAPPY,
            layout: PartitionLayout::Parquet,
            partitioning: None,
        }
    }
}

enum Inner {
    Parquet(Box<ArrowWriter<ChecksummingFile>>),
    Hybrid(Box<HybridWriter>),
}

/// Streams record batches into a partition file. The file appears under its
/// final name only when [`PartitionWriter::finish`] succeeds; dropping the
/// writer earlier removes the temporary file.
pub struct PartitionWriter {
    writer: Option<Inner>,
    tmp_path: PathBuf,
    /// The hybrid layout's row and heap side files.
    side_paths: [PathBuf; 2],
    final_path: PathBuf,
    relative_file: String,
    table: String,
    partition: u32,
    schema: SchemaRef,
    /// The first rows written, for the columns' compressibility.
    sample: Sampler,
    partitioning: Option<Partitioning>,
}

/// A partitioning a partition may be written under: valid, by columns
/// of its schema, with the partition among its partitions.
fn check_partitioning(
    table: &str,
    partition: u32,
    schema: &SchemaRef,
    partitioning: Option<&Partitioning>,
) -> FormatResult<()> {
    let Some(p) = partitioning else {
        return Ok(());
    };
    let what = format!("table {table} partition {partition}");
    p.check(&what)?;
    let bad = |reason: String| {
        FormatError::Wire(WireError::Partitioning {
            what: what.clone(),
            reason,
        })
    };
    if let Some(c) = p.columns.iter().find(|c| schema.index_of(c).is_err()) {
        return Err(bad(format!("no column {c} to partition by")));
    }
    if partition >= p.partitions {
        return Err(bad(format!(
            "partition id past its {} partitions",
            p.partitions
        )));
    }
    Ok(())
}

impl PartitionWriter {
    /// Starts partition `partition` of `table` under the device directory.
    pub fn create(
        device_dir: &Path,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        options: &WriterOptions,
    ) -> FormatResult<Self> {
        check_partitioning(table, partition, &schema, options.partitioning.as_ref())?;
        let table_dir = device_dir.join(table);
        fs::create_dir_all(&table_dir).map_err(io_err(&table_dir))?;
        let ext = match options.layout {
            PartitionLayout::Parquet => "parquet",
            PartitionLayout::Hybrid { .. } => "hyb",
        };
        let relative_file = format!("{table}/{partition:05}.{ext}");
        let final_path = device_dir.join(&relative_file);
        let tmp_path = table_dir.join(format!(".{partition:05}.{ext}.tmp"));
        let side_paths = [
            table_dir.join(format!(".{partition:05}.rows.tmp")),
            table_dir.join(format!(".{partition:05}.heap.tmp")),
        ];
        let file = File::create(&tmp_path).map_err(io_err(&tmp_path))?;
        let mut this = Self {
            writer: None,
            tmp_path,
            side_paths,
            final_path,
            relative_file,
            table: table.to_string(),
            partition,
            schema: Arc::clone(&schema),
            sample: Sampler::new(Arc::clone(&schema)),
            partitioning: options.partitioning.clone(),
        };
        this.writer = Some(match &options.layout {
            PartitionLayout::Parquet => {
                Inner::Parquet(Box::new(this.parquet(file, schema, options)?))
            }
            PartitionLayout::Hybrid { key_columns } => {
                Inner::Hybrid(Box::new(HybridWriter::create(
                    file,
                    &this.side_paths[0],
                    &this.side_paths[1],
                    schema,
                    key_columns,
                    options.row_group_rows_max,
                )?))
            }
        });
        Ok(this)
    }

    fn parquet(
        &self,
        file: File,
        schema: SchemaRef,
        options: &WriterOptions,
    ) -> FormatResult<ArrowWriter<ChecksummingFile>> {
        let sink = ChecksummingFile::new(file);
        let props = WriterProperties::builder()
            .set_dictionary_enabled(true)
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(options.row_group_rows_max))
            .set_compression(options.compression)
            .build();
        ArrowWriter::try_new(sink, schema, Some(props)).map_err(|source| FormatError::Parquet {
            path: self.tmp_path.display().to_string(),
            source,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> FormatResult<()> {
        self.sample.offer(batch);
        match self.writer.as_mut().expect("write after finish") {
            Inner::Parquet(w) => w.write(batch).map_err(|source| FormatError::Parquet {
                path: self.tmp_path.display().to_string(),
                source,
            }),
            Inner::Hybrid(w) => w.write(batch, &self.tmp_path),
        }
    }

    /// Closes the file, makes it durable under its final name and returns
    /// its descriptor. The caller records the descriptor in the manifest.
    pub fn finish(mut self) -> FormatResult<FormatDescriptor> {
        let mut descriptor = match self.writer.take().expect("finish once") {
            Inner::Parquet(w) => self.finish_parquet(*w)?,
            Inner::Hybrid(w) => self.finish_hybrid(*w)?,
        };
        for (field, ratios) in descriptor.fields.iter_mut().zip(self.sample.finish()) {
            field.ipc_compression = ratios;
        }
        descriptor.partitioning = self.partitioning.take();
        fs::rename(&self.tmp_path, &self.final_path).map_err(io_err(&self.final_path))?;
        sync_dir(self.final_path.parent().expect("table dir"))?;
        Ok(descriptor)
    }

    fn finish_hybrid(&self, writer: HybridWriter) -> FormatResult<FormatDescriptor> {
        let [rows_path, heap_path] = &self.side_paths;
        let (layout, row_count, stats, crc, bytes) =
            writer.finish(&self.tmp_path, rows_path, heap_path)?;
        for side in &self.side_paths {
            let _ = fs::remove_file(side);
        }
        describe_hybrid(
            &self.table,
            self.partition,
            &self.relative_file,
            layout,
            row_count,
            stats,
            bytes,
            crc,
            &self.schema,
        )
    }

    fn finish_parquet(
        &self,
        mut writer: ArrowWriter<ChecksummingFile>,
    ) -> FormatResult<FormatDescriptor> {
        let parquet_err = |source| FormatError::Parquet {
            path: self.tmp_path.display().to_string(),
            source,
        };
        let metadata = writer.finish().map_err(parquet_err)?;
        // The writer is finished; its sink holds the whole file's checksum.
        let sink = writer.inner_mut();
        let (crc, bytes) = (sink.crc.clone().finalize(), sink.bytes);
        sink.inner.flush().map_err(io_err(&self.tmp_path))?;
        sink.inner
            .get_ref()
            .sync_all()
            .map_err(io_err(&self.tmp_path))?;
        drop(writer);
        describe(
            &self.table,
            self.partition,
            &self.relative_file,
            &metadata,
            bytes,
            crc,
        )
    }
}

impl Drop for PartitionWriter {
    fn drop(&mut self) {
        if self.writer.is_some() || self.tmp_path.exists() {
            let _ = fs::remove_file(&self.tmp_path);
        }
        for side in &self.side_paths {
            let _ = fs::remove_file(side);
        }
    }
}
