//! Writes one partition file and produces its format descriptor.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use insitu_wire::FormatDescriptor;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::atomic::sync_dir;
use crate::descriptor::describe;
use crate::{io_err, FormatError, FormatResult};

/// Knobs of the partition writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Rows per Parquet row group (`row_group_rows_max`): the unit of pruning.
    pub row_group_rows_max: usize,
    pub compression: Compression,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            row_group_rows_max: 122_880,
            compression: Compression::SNAPPY,
        }
    }
}

/// A `Write` that checksums and counts what passes through it, so the file
/// is never read back to compute its descriptor.
struct ChecksummingFile {
    inner: BufWriter<File>,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Write for ChecksummingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Streams record batches into a partition file. The file appears under its
/// final name only when [`PartitionWriter::finish`] succeeds; dropping the
/// writer earlier removes the temporary file.
pub struct PartitionWriter {
    writer: Option<ArrowWriter<ChecksummingFile>>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    relative_file: String,
    table: String,
    partition: u32,
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
        let table_dir = device_dir.join(table);
        fs::create_dir_all(&table_dir).map_err(io_err(&table_dir))?;
        let relative_file = format!("{table}/{partition:05}.parquet");
        let final_path = device_dir.join(&relative_file);
        let tmp_path = table_dir.join(format!(".{partition:05}.parquet.tmp"));
        let file = File::create(&tmp_path).map_err(io_err(&tmp_path))?;
        let sink = ChecksummingFile {
            inner: BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let props = WriterProperties::builder()
            .set_dictionary_enabled(true)
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_row_count(Some(options.row_group_rows_max))
            .set_compression(options.compression)
            .build();
        let writer = ArrowWriter::try_new(sink, schema, Some(props)).map_err(|source| {
            FormatError::Parquet {
                path: tmp_path.display().to_string(),
                source,
            }
        })?;
        Ok(Self {
            writer: Some(writer),
            tmp_path,
            final_path,
            relative_file,
            table: table.to_string(),
            partition,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> FormatResult<()> {
        let writer = self.writer.as_mut().expect("write after finish");
        writer.write(batch).map_err(|source| FormatError::Parquet {
            path: self.tmp_path.display().to_string(),
            source,
        })
    }

    /// Closes the file, makes it durable under its final name and returns
    /// its descriptor. The caller records the descriptor in the manifest.
    pub fn finish(mut self) -> FormatResult<FormatDescriptor> {
        let mut writer = self.writer.take().expect("finish once");
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
        let descriptor = describe(
            &self.table,
            self.partition,
            &self.relative_file,
            &metadata,
            bytes,
            crc,
        )?;
        fs::rename(&self.tmp_path, &self.final_path).map_err(io_err(&self.final_path))?;
        sync_dir(self.final_path.parent().expect("table dir"))?;
        Ok(descriptor)
    }
}

impl Drop for PartitionWriter {
    fn drop(&mut self) {
        if self.writer.is_some() || self.tmp_path.exists() {
            let _ = fs::remove_file(&self.tmp_path);
        }
    }
}
