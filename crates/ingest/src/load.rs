//! Loading a user's Parquet or CSV files into a table.
//!
//! Rows are dealt to devices batch by batch, round-robin, one partition per
//! device; each device writes its partition as the batches arrive, so memory
//! stays bounded by the channel depth and one row group per writer. If any
//! file or device fails, the table is removed from every device again.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use arrow::csv::reader::Format;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use insitu_format::WriterOptions;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::{prepare_table, IngestError, IngestResult, LayoutChoice, PartitionSink, Progress};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub replace: bool,
    pub batch_rows: usize,
    pub writer: WriterOptions,
    pub layout: LayoutChoice,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            replace: false,
            batch_rows: 8192,
            writer: WriterOptions::default(),
            layout: LayoutChoice::Parquet,
        }
    }
}

/// Batches in flight per device writer.
const BATCHES_IN_FLIGHT: usize = 4;

enum Kind {
    Parquet,
    Csv,
}

fn kind_of(path: &Path) -> IngestResult<Kind> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("parquet") | Some("pq") => Ok(Kind::Parquet),
        Some("csv") => Ok(Kind::Csv),
        _ => Err(input_err(
            path,
            "unsupported file type: expected .parquet or .csv",
        )),
    }
}

fn input_err(path: &Path, message: impl std::fmt::Display) -> IngestError {
    IngestError::Input {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

type BatchIter = Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>> + Send>;

fn open(path: &Path, batch_rows: usize) -> IngestResult<(SchemaRef, BatchIter)> {
    let file = File::open(path).map_err(|e| input_err(path, e))?;
    match kind_of(path)? {
        Kind::Parquet => {
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| input_err(path, format!("not a readable Parquet file: {e}")))?
                .with_batch_size(batch_rows)
                .build()
                .map_err(|e| input_err(path, e))?;
            Ok((reader.schema(), Box::new(reader)))
        }
        Kind::Csv => {
            let (schema, _) = Format::default()
                .with_header(true)
                .infer_schema(&file, Some(1000))
                .map_err(|e| input_err(path, format!("cannot infer CSV schema: {e}")))?;
            let file = File::open(path).map_err(|e| input_err(path, e))?;
            let reader = arrow::csv::ReaderBuilder::new(Arc::new(schema))
                .with_header(true)
                .with_batch_size(batch_rows)
                .build(file)
                .map_err(|e| input_err(path, e))?;
            Ok((reader.schema(), Box::new(reader)))
        }
    }
}

/// Loads `files` into `table` across `devices`.
pub fn load_files<S: PartitionSink + ?Sized>(
    devices: &[Arc<S>],
    table: &str,
    files: &[PathBuf],
    options: &LoadOptions,
    progress: Progress<'_>,
) -> IngestResult<()> {
    if files.is_empty() {
        return Err(IngestError::Invalid("no input files given".into()));
    }
    if table.is_empty() || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(IngestError::Invalid(format!(
            "table name '{table}' must be letters, digits and underscores"
        )));
    }
    // Open the first file up front: its schema is the table's.
    let (schema, first) = open(&files[0], options.batch_rows)?;
    let writer = options
        .layout
        .writer_options(&options.writer, table, &schema, true)?;
    prepare_table(devices, table, options.replace)?;
    let result = deal(
        devices, table, files, schema, first, options, &writer, progress,
    );
    if result.is_err() {
        for d in devices {
            let _ = d.drop_table(table);
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn deal<S: PartitionSink + ?Sized>(
    devices: &[Arc<S>],
    table: &str,
    files: &[PathBuf],
    schema: SchemaRef,
    first: BatchIter,
    options: &LoadOptions,
    writer: &WriterOptions,
    progress: Progress<'_>,
) -> IngestResult<()> {
    std::thread::scope(|scope| {
        let mut senders: Vec<SyncSender<Result<RecordBatch, ArrowError>>> = vec![];
        let mut writers = vec![];
        for device in devices {
            let (tx, rx): (_, Receiver<Result<RecordBatch, ArrowError>>) =
                sync_channel(BATCHES_IN_FLIGHT);
            senders.push(tx);
            let schema = Arc::clone(&schema);
            writers.push(scope.spawn(move || {
                device.write_partition(table, 0, schema, &mut rx.into_iter(), writer)
            }));
        }
        let read = (|| -> IngestResult<()> {
            let mut next_device = 0usize;
            let mut current = Some(first);
            for (i, path) in files.iter().enumerate() {
                let batches = match current.take() {
                    Some(b) => b,
                    None => {
                        let (s, b) = open(path, options.batch_rows)?;
                        if s.fields() != schema.fields() {
                            return Err(input_err(
                                path,
                                format!("schema differs from {}'s", files[0].display()),
                            ));
                        }
                        b
                    }
                };
                debug_assert!(i > 0 || current.is_none());
                for batch in batches {
                    let batch = batch.map_err(|e| input_err(path, e))?;
                    progress(batch.num_rows() as u64);
                    if senders[next_device].send(Ok(batch)).is_err() {
                        break; // that writer failed; its error is reported below
                    }
                    next_device = (next_device + 1) % senders.len();
                }
            }
            Ok(())
        })();
        if let Err(e) = &read {
            for tx in &senders {
                let _ = tx.send(Err(ArrowError::ExternalError(e.to_string().into())));
            }
        }
        drop(senders);
        let written: Vec<_> = writers
            .into_iter()
            .map(|w| w.join().expect("writer thread panicked"))
            .collect();
        read?;
        for w in written {
            w?;
        }
        Ok(())
    })
}
