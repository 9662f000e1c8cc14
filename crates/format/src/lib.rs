//! Partition files and their explicit format descriptors.
//!
//! A partition is written once, to a temporary name, fsynced and renamed
//! into place; its [`FormatDescriptor`](insitu_wire::FormatDescriptor) is
//! built from what was written and recorded in the device manifest, which
//! is itself replaced atomically.
//! Nothing here knows about queries.

mod atomic;
pub mod compressibility;
mod descriptor;
pub mod hybrid;
mod writer;

pub use atomic::{load_manifest, store_manifest, write_atomically};
pub use descriptor::{file_crc32, schema_of, verify_file};
pub use writer::{PartitionLayout, PartitionWriter, WriterOptions};

/// Errors of partition and manifest I/O; each names the file involved.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parquet {
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{0}")]
    Wire(#[from] insitu_wire::WireError),
    #[error(
        "device {device}: table {table} partition {partition}: checksum mismatch in {path} \
         (manifest says crc32 {expected:08x}, file has {found:08x}): the partition is corrupt"
    )]
    Checksum {
        device: u32,
        table: String,
        partition: u32,
        path: String,
        expected: u32,
        found: u32,
    },
    #[error(
        "device {device}: table {table} partition {partition}: {path} is {found} bytes, \
         manifest says {expected}: the partition is corrupt"
    )]
    Size {
        device: u32,
        table: String,
        partition: u32,
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("{0}")]
    Invalid(String),
}

pub type FormatResult<T> = Result<T, FormatError>;

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> FormatError + '_ {
    move |source| FormatError::Io {
        path: path.display().to_string(),
        source,
    }
}
