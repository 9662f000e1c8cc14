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
    /// PAX: Parquet row groups with column chunks.
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
    /// How well this column's values compress as Arrow IPC, measured on
    /// a sample when the file was written; absent in older descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_compression: Option<IpcCompression>,
}

/// Arrow IPC body bytes per plain body byte of one column's sample, per
/// codec: what a device's compressed results of it would weigh.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct IpcCompression {
    pub lz4_ratio: f64,
    pub zstd_ratio: f64,
}

/// Min/max of one column in one row group, rendered as strings so that the
/// descriptor stays readable and type-agnostic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    pub column: String,
    pub min: Option<String>,
    pub max: Option<String>,
    pub null_count: Option<u64>,
    /// Bytes of this column chunk as stored (compressed pages); absent in
    /// descriptors written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_bytes: Option<u64>,
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
    /// Where the sections of a [`LayoutKind::Hybrid`] file are and how its
    /// rows are laid out; `None` for every other layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridLayout>,
    /// How the table's rows are spread over its partitions, if it was
    /// written by a key ([`crate::partitioning`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<crate::Partitioning>,
}

/// A byte range of a partition file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    pub offset: u64,
    pub len: u64,
}

impl Section {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.end()
    }
}

/// One field stored row-wise: where it sits in a row slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowSlot {
    pub name: String,
    /// Byte offset of the field inside a row.
    pub offset_bytes: u32,
    /// Fixed-width values: their width. Variable-length values: 12 (an
    /// 8-byte heap offset, then a 4-byte length, both little-endian).
    pub width_bytes: u32,
    pub variable_length: bool,
    /// Variable-length values of at most this many bytes (at most 8) sit
    /// in the slot's first 8 bytes instead of the heap, zero-padded: a
    /// sorted read fetches them with the row, not from a random place in
    /// the heap. 0 in files written before short values were inlined.
    #[serde(default)]
    pub inline_bytes_max: u32,
}

/// One block of rows (at most `row_group_rows_max`): its key batch and the
/// heap bytes of its rows. Its slots follow from the rows before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridBlock {
    pub rows: u64,
    /// The block's key columns: a complete Arrow IPC stream inside the key
    /// section.
    pub key: Section,
    /// The heap bytes of the block's rows (absolute in the file); rows
    /// with the same value may point at one copy of it.
    pub heap: Section,
}

/// The hybrid layout of paper 000 (Fig. 8c): key columns column-wise, the
/// other columns row-wise in fixed-width slots.
///
/// ```text
/// | magic | key section: Arrow IPC stream | row section: row_count x row_width | heap | footer | footer len | magic |
/// ```
///
/// A row slot starts with a validity bitmap of the row-wise fields (bit
/// set = valid, LSB first), then each field at its [`RowSlot`] offset.
/// Variable-length values live in the heap; a slot holds their offset and
/// length. Row `i` of the partition is slot `i`, so a gather by sorted
/// indices reads whole rows, one contiguous slot each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridLayout {
    /// The columns stored column-wise, in schema order.
    pub key_columns: Vec<String>,
    pub key_section: Section,
    pub row_section: Section,
    pub heap_section: Section,
    /// Bytes per row slot (validity bitmap included).
    pub row_width_bytes: u32,
    /// Bytes of the validity bitmap at the start of each slot.
    pub validity_bytes: u32,
    /// The row-wise fields, in schema order.
    pub slots: Vec<RowSlot>,
    pub blocks: Vec<HybridBlock>,
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
            hybrid: self.hybrid.as_ref().map(|h| HybridLayout {
                blocks: vec![],
                ..h.clone()
            }),
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
        if let Some(p) = &self.partitioning {
            p.check(&format!(
                "table {} partition {}",
                self.table, self.partition
            ))?;
            if self.partition >= p.partitions {
                return Err(WireError::Partitioning {
                    what: format!("table {} partition {}", self.table, self.partition),
                    reason: format!("partition id past its {} partitions", p.partitions),
                });
            }
        }
        Ok(())
    }
}
