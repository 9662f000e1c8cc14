//! Partition format descriptors: the explicit cross-layer format of paper 002.
//!
//! A descriptor tells a device everything it needs to read a partition
//! without asking the host: schema, per-field formats, layout, encodings,
//! statistics, byte size and a checksum of the file.

use serde::{Deserialize, Serialize};

use crate::{WireError, WireResult};

/// The descriptor version this build writes and reads.
pub const DESCRIPTOR_VERSION: u32 = 1;

/// How records are laid out in a partition file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutKind {
    /// PAX: Parquet row groups with column chunks (the only layout written today).
    Parquet,
    /// Row-wise N-ary storage model.
    RowWise,
    /// Column-wise decomposition storage model.
    ColumnWise,
    /// Key columns column-wise, the rest row-wise (paper 000, Fig. 8c).
    Hybrid,
}

/// Value encodings used by a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Plain,
    Dictionary,
    Rle,
    DeltaBinaryPacked,
    Other,
}

/// The physical format of one field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldFormat {
    pub name: String,
    /// Arrow logical type, as Arrow prints it (`Int64`, `Decimal128(15, 2)`, `Utf8View`).
    pub arrow_type: String,
    /// Width in bytes of a fixed-width value; `None` for variable-length values.
    pub width_bytes: Option<u32>,
    pub nullable: bool,
    /// Little-endian for every layout written today; explicit so that a
    /// device with another byte order can tell.
    pub byte_order: String,
    pub encodings: Vec<Encoding>,
}

/// Min/max of one column in one row group, rendered as strings so that the
/// descriptor stays readable and type-agnostic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    pub column: String,
    pub min: Option<String>,
    pub max: Option<String>,
    pub null_count: Option<u64>,
}

/// Statistics of one row group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowGroupStats {
    pub row_count: u64,
    pub byte_size: u64,
    pub columns: Vec<ColumnStats>,
}

/// The self-describing format of one partition file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatDescriptor {
    pub version: u32,
    pub table: String,
    pub partition: u32,
    /// File name relative to the device's table directory.
    pub file: String,
    pub layout: LayoutKind,
    pub fields: Vec<FieldFormat>,
    pub row_count: u64,
    pub byte_size: u64,
    /// CRC32 (IEEE) of the whole file.
    pub crc32: u32,
    pub row_groups: Vec<RowGroupStats>,
}

impl FormatDescriptor {
    /// The descriptor without per-row-group statistics: what travels with a
    /// stage plan. The format (schema, field formats, layout, encodings),
    /// identity and checksum go along; a device prunes with the statistics
    /// in its own manifest, so shipping them again would only cost link
    /// bytes (at SF 10 they were most of a Q6 pushdown's traffic).
    pub fn format_only(&self) -> Self {
        Self {
            row_groups: vec![],
            ..self.clone()
        }
    }

    /// Rejects descriptors written by an unknown format version.
    pub fn check_version(&self) -> WireResult<()> {
        if self.version != DESCRIPTOR_VERSION {
            return Err(WireError::DescriptorVersion {
                table: self.table.clone(),
                partition: self.partition,
                found: self.version,
                supported: DESCRIPTOR_VERSION,
            });
        }
        Ok(())
    }
}
