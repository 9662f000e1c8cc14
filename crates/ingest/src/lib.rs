//! Data in: TPC-H generation and loading of user files, partitioned across
//! devices. Every partition is written by its device (temp file, fsync,
//! rename, manifest update), so a failed ingest leaves no partial partition.

mod load;
mod tpch;

use std::sync::Arc;

use insitu_device::Device;

pub use load::{load_files, LoadOptions};
pub use tpch::{expected_rows as tpch_expected_rows, gen_tpch, TpchOptions, TPCH_TABLES};

/// Errors of ingest; each names the table, file or device involved.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("table {table} already exists on device {device}; pass --replace to overwrite it")]
    TableExists { table: String, device: u32 },
    #[error("{0}")]
    Device(#[from] insitu_device::DeviceError),
    #[error("{path}: {message}")]
    Input { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

pub type IngestResult<T> = Result<T, IngestError>;

/// Progress callback: called with the number of rows just written.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Refuses to overwrite `table` unless `replace`; with `replace`, drops it
/// from every device first.
pub fn prepare_table(devices: &[Arc<Device>], table: &str, replace: bool) -> IngestResult<()> {
    for d in devices {
        if d.manifest().tables.contains_key(table) {
            if !replace {
                return Err(IngestError::TableExists {
                    table: table.to_string(),
                    device: d.id(),
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
