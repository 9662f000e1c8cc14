//! Data in: TPC-H generation and loading of user files, partitioned across
//! devices. Every partition is written by its device (temp file, fsync,
//! rename, manifest update), so a failed ingest leaves no partial partition.

mod load;
mod tpch;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use insitu_client::{batch_to_ipc, ipc_to_batch, DeviceClient, REQUEST_HEADER_BYTES};
use insitu_device::EmbeddedClient;
use insitu_format::{PartitionLayout, WriterOptions};
use insitu_link::Direction;

pub use load::{load_files, LoadOptions};
pub use tpch::{expected_rows as tpch_expected_rows, gen_tpch, TpchOptions, TPCH_TABLES};

/// Errors of ingest; each names the table, file or device involved.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("table {table} already exists on device {device}; pass --replace to overwrite it")]
    TableExists { table: String, device: u32 },
    #[error("{0}")]
    Device(#[from] insitu_device::DeviceError),
    /// A device server refused or failed a request; the message names it.
    #[error("{0}")]
    Remote(String),
    #[error("{path}: {message}")]
    Input { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

pub type IngestResult<T> = Result<T, IngestError>;

/// The layout new tables get.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LayoutChoice {
    #[default]
    Parquet,
    /// Hybrid, with these key columns stored column-wise (none named: the
    /// table's first column).
    Hybrid { keys: Vec<String> },
}

impl LayoutChoice {
    /// The layout of a table with `schema`. With `strict`, every named key
    /// column must be in the table; without (one choice for several
    /// tables), a table keys on the named columns it has, or on its first
    /// column if it has none of them.
    pub fn for_schema(
        &self,
        table: &str,
        schema: &SchemaRef,
        strict: bool,
    ) -> IngestResult<PartitionLayout> {
        let LayoutChoice::Hybrid { keys } = self else {
            return Ok(PartitionLayout::Parquet);
        };
        let has = |k: &String| schema.field_with_name(k).is_ok();
        if strict {
            if let Some(missing) = keys.iter().find(|k| !has(k)) {
                return Err(IngestError::Invalid(format!(
                    "hybrid key column '{missing}' is not a column of table {table}"
                )));
            }
        }
        let mut key_columns: Vec<String> = keys.iter().filter(|k| has(k)).cloned().collect();
        if key_columns.is_empty() {
            let first = schema
                .fields()
                .first()
                .ok_or_else(|| IngestError::Invalid(format!("table {table} has no columns")))?;
            key_columns.push(first.name().clone());
        }
        Ok(PartitionLayout::Hybrid { key_columns })
    }

    /// `base` with this choice's layout for `table`.
    pub fn writer_options(
        &self,
        base: &WriterOptions,
        table: &str,
        schema: &SchemaRef,
        strict: bool,
    ) -> IngestResult<WriterOptions> {
        Ok(WriterOptions {
            layout: self.for_schema(table, schema, strict)?,
            ..base.clone()
        })
    }
}

/// Progress callback: called with the number of rows just written.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Batches ingest hands to a device, in order.
pub type BatchSource<'a> = &'a mut dyn Iterator<Item = Result<RecordBatch, ArrowError>>;

/// Where ingest writes partitions: a device in this process, or a device
/// server reached over the network. A partition becomes visible only once
/// complete; a failed write leaves nothing behind.
pub trait PartitionSink: Send + Sync {
    fn device_id(&self) -> u32;
    fn has_table(&self, table: &str) -> IngestResult<bool>;
    fn drop_table(&self, table: &str) -> IngestResult<()>;
    fn write_partition(
        &self,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        batches: BatchSource<'_>,
        options: &WriterOptions,
    ) -> IngestResult<()>;
}

/// A device in this process takes partitions over its link, as a device
/// server does over the network: each batch crosses as Arrow IPC bytes,
/// counted and throttled, and the device writes what it decodes.
impl PartitionSink for EmbeddedClient {
    fn device_id(&self) -> u32 {
        self.device().id()
    }

    fn has_table(&self, table: &str) -> IngestResult<bool> {
        let link = self.link();
        link.transfer_blocking(Direction::HostToDevice, REQUEST_HEADER_BYTES);
        let has = self.device().manifest().tables.contains_key(table);
        link.transfer_blocking(Direction::DeviceToHost, REQUEST_HEADER_BYTES);
        Ok(has)
    }

    fn drop_table(&self, table: &str) -> IngestResult<()> {
        let link = self.link();
        link.transfer_blocking(Direction::HostToDevice, REQUEST_HEADER_BYTES);
        self.device().drop_table(table)?;
        link.transfer_blocking(Direction::DeviceToHost, REQUEST_HEADER_BYTES);
        Ok(())
    }

    fn write_partition(
        &self,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        batches: BatchSource<'_>,
        options: &WriterOptions,
    ) -> IngestResult<()> {
        let link = self.link();
        link.transfer_blocking(Direction::HostToDevice, REQUEST_HEADER_BYTES);
        let mut crossed = batches.map(|batch| {
            let bytes = batch_to_ipc(&batch?)?;
            link.transfer_blocking(Direction::HostToDevice, bytes.len());
            ipc_to_batch(&bytes)
        });
        self.device()
            .write_partition(table, partition, schema, &mut crossed, options)?;
        // The commit's answer.
        link.transfer_blocking(Direction::DeviceToHost, REQUEST_HEADER_BYTES);
        Ok(())
    }
}

/// Refuses to overwrite `table` unless `replace`; with `replace`, drops it
/// from every device first.
pub fn prepare_table<S: PartitionSink + ?Sized>(
    devices: &[Arc<S>],
    table: &str,
    replace: bool,
) -> IngestResult<()> {
    for d in devices {
        if d.has_table(table)? {
            if !replace {
                return Err(IngestError::TableExists {
                    table: table.to_string(),
                    device: d.device_id(),
                });
            }
            d.drop_table(table)?;
        }
    }
    Ok(())
}

/// The device that holds partition `partition` of `partitions`: contiguous
/// ranges, so range-partitioned tables keep their order across devices.
pub fn device_for_partition(partition: u32, partitions: u32, devices: usize) -> usize {
    (partition as usize * devices) / partitions.max(1) as usize
}
