//! The device protocol spoken over Arrow Flight.
//!
//! | Flight call   | insitu meaning                                              |
//! |---------------|-------------------------------------------------------------|
//! | `handshake`   | bearer token in, [`Capabilities`] (JSON) out                 |
//! | `do_get`      | ticket = [`crate::StagePlanEnvelope`] bytes; the answer is a |
//! |               | standard Flight record batch stream, then one message with  |
//! |               | no data and [`StageStats`] (JSON) as `app_metadata`          |
//! | `do_put`      | descriptor cmd = [`PutRequest`]; batches, then a message    |
//! |               | with no data and [`PutCommit`] as `app_metadata`             |
//! | `do_action`   | [`action`] names below; bodies and results are JSON          |
//!
//! Every call but `handshake` carries `authorization: Bearer <token>` when
//! the device has a token.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Manifest, WireError, WireResult};

/// Version of this protocol; a host and a device must agree on it.
pub const PROTOCOL_VERSION: u32 = 2; // 2: the sort operator, hybrid layout, sort jobs

/// Largest gRPC message either side accepts (`grpc_message_bytes_max`):
/// plans are at most [`crate::PLAN_BYTES_MAX`], and result batches are
/// bounded by the device's batch size.
pub const GRPC_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Bytes per `read_range` result message (`range_chunk_bytes`).
pub const RANGE_CHUNK_BYTES: usize = 1 << 20;

/// Names of `do_action` actions.
pub mod action {
    /// Body: none. Result: [`super::Capabilities`].
    pub const CAPABILITIES: &str = "capabilities";
    /// Body: none. Result: the device's [`crate::Manifest`].
    pub const LIST_TABLES: &str = "list_tables";
    /// Body: none. Result: [`super::DeviceStats`].
    pub const STATS: &str = "stats";
    /// Body: [`super::ReadRangeRequest`]. Result: the bytes, in chunks.
    pub const READ_RANGE: &str = "read_range";
    /// Body: [`super::DropTableRequest`]. Result: none.
    pub const DROP_TABLE: &str = "drop_table";
    /// Body: [`super::SampleKeysRequest`]. Result: an Arrow IPC stream of
    /// the sampled key rows.
    pub const SAMPLE_KEYS: &str = "sample_keys";
    /// Body: [`super::SortTableRequest`]. Result: the JSON list of
    /// [`crate::FormatDescriptor`]s of the partitions written.
    pub const SORT_TABLE: &str = "sort_table";
}

/// Operators a device can run inside a stage plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operator {
    /// Reading partitions (always required).
    Scan,
    /// Filter predicates, inside the scan or as a separate operator.
    Filter,
    /// Column selection and expression evaluation.
    Projection,
    /// Partial (pre-)aggregation.
    PartialAggregate,
    /// Row limits.
    Limit,
    /// Sorts and top-k (ORDER BY [LIMIT k]) with the insitu kernels.
    Sort,
}

impl Operator {
    pub const ALL: [Operator; 6] = [
        Operator::Scan,
        Operator::Filter,
        Operator::Projection,
        Operator::PartialAggregate,
        Operator::Limit,
        Operator::Sort,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operator::Scan => "scan",
            Operator::Filter => "filter",
            Operator::Projection => "projection",
            Operator::PartialAggregate => "partial_aggregate",
            Operator::Limit => "limit",
            Operator::Sort => "sort",
        }
    }

    pub fn parse(s: &str) -> WireResult<Self> {
        Self::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|o| o.name()).collect();
                WireError::Protocol(format!(
                    "unknown operator '{s}' (known: {})",
                    known.join(", ")
                ))
            })
    }
}

impl std::fmt::Display for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a device can do; the host pushes only what is listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capabilities {
    pub protocol_version: u32,
    pub device_id: u32,
    pub operators: Vec<Operator>,
    /// Arrow type names the device reads and computes on.
    pub data_types: Vec<String>,
    /// Partition layouts it stores ([`crate::LayoutKind`] names).
    pub layouts: Vec<String>,
    /// Column encodings it decodes ([`crate::Encoding`] names).
    pub encodings: Vec<String>,
    pub mem_bytes_max: u64,
    pub threads: u32,
    /// How fast the device reads and computes, for the host's cost model;
    /// absent from devices that predate profiles.
    #[serde(default)]
    pub profile: Option<crate::DeviceProfile>,
}

impl Capabilities {
    pub fn supports(&self, op: Operator) -> bool {
        self.operators.contains(&op)
    }
}

/// Statistics of one stage run, sent after its last result batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageStats {
    pub rows_read: u64,
    pub bytes_read: u64,
    pub rows_out: u64,
    pub elapsed_us: u64,
    /// Compute time per operator name (DataFusion's `elapsed_compute`).
    #[serde(default)]
    pub operator_us: BTreeMap<String, u64>,
    /// Sorted runs sorts wrote to storage because their input outgrew
    /// the memory budget, and their bytes.
    #[serde(default)]
    pub spilled_runs: u64,
    #[serde(default)]
    pub spilled_bytes: u64,
    /// The most memory the stage's query held on the device at once (its
    /// stages together, up to this one's end).
    #[serde(default)]
    pub mem_peak_bytes: u64,
}

impl StageStats {
    /// Adds `other` into `self`.
    pub fn accumulate(&mut self, other: &StageStats) {
        self.rows_read += other.rows_read;
        self.bytes_read += other.bytes_read;
        self.rows_out += other.rows_out;
        self.elapsed_us += other.elapsed_us;
        self.spilled_runs += other.spilled_runs;
        self.spilled_bytes += other.spilled_bytes;
        self.mem_peak_bytes = self.mem_peak_bytes.max(other.mem_peak_bytes);
        for (op, us) in &other.operator_us {
            *self.operator_us.entry(op.clone()).or_default() += us;
        }
    }
}

/// Counters of a device since it started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device_id: u32,
    /// Bytes read from the device's storage.
    pub bytes_read: u64,
    /// Bytes of results, ranges and manifests sent to hosts.
    pub bytes_sent: u64,
    /// Bytes received from hosts (plans and ingested partitions).
    pub bytes_received: u64,
    /// Rows scanned by stages.
    pub rows_in: u64,
    /// Rows sent by stages.
    pub rows_out: u64,
    pub stages_ok: u64,
    pub stages_failed: u64,
    /// Stages whose host went away before the end (LIMIT met, query aborted).
    pub stages_cancelled: u64,
    pub partitions_ingested: u64,
    pub active_streams: u64,
    pub mem_in_use_bytes: u64,
    /// Highest memory reservation seen (`mem_in_use_bytes` high-water mark).
    pub mem_peak_bytes: u64,
    pub mem_bytes_max: u64,
    /// Compute time per operator name, summed over stages.
    pub operator_us: BTreeMap<String, u64>,
    /// Sorted runs spilled to storage past the memory budget, and bytes.
    #[serde(default)]
    pub spilled_runs: u64,
    #[serde(default)]
    pub spilled_bytes: u64,
    /// Resident memory of the process serving the device, now and at its
    /// peak (device servers; 0 for embedded devices, whose process is the
    /// host's). A server stays within `mem_bytes_max` plus the
    /// documented `rss_overhead_bytes`.
    #[serde(default)]
    pub process_rss_bytes: u64,
    #[serde(default)]
    pub process_rss_peak_bytes: u64,
}

/// Body of [`action::READ_RANGE`]: bytes `start..end` of a partition file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadRangeRequest {
    pub table: String,
    pub partition: u32,
    pub start: u64,
    pub end: u64,
}

/// Body of [`action::DROP_TABLE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DropTableRequest {
    pub table: String,
}

/// Most rows a device returns for one [`SampleKeysRequest`] (`sample_rows_max`).
pub const SAMPLE_ROWS_MAX: u64 = 1 << 20;

/// Body of [`action::SAMPLE_KEYS`]: up to `rows` rows of `columns` of
/// `table`, evenly spaced over the device's partitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleKeysRequest {
    pub table: String,
    pub columns: Vec<String>,
    pub rows: u64,
}

/// One sort key column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SortKey {
    pub column: String,
    pub descending: bool,
    pub nulls_first: bool,
}

/// Body of [`action::SORT_TABLE`]: sort every partition of `source` this
/// device holds by `by` and write the result as partitions
/// `first_partition, first_partition + 1, ...` of `into`, each of at most
/// `partition_rows_max` rows, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SortTableRequest {
    pub source: String,
    pub into: String,
    pub by: Vec<SortKey>,
    pub first_partition: u32,
    pub partition_rows_max: u64,
    pub row_group_rows_max: u64,
    /// Write `into` in the hybrid layout keyed on the sort columns
    /// (else Parquet).
    pub hybrid: bool,
    /// `into`'s partitioning over all devices, recorded with each
    /// partition (key ranges when the sort ascends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<crate::Partitioning>,
}

/// The `do_put` descriptor command: which partition the stream becomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutRequest {
    pub table: String,
    pub partition: u32,
    /// Rows per Parquet row group (or hybrid block) on the device.
    pub row_group_rows_max: u64,
    /// Key columns to store column-wise in the hybrid layout; empty for
    /// Parquet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hybrid_key_columns: Vec<String>,
    /// The table's partitioning, recorded in the partition's descriptor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitioning: Option<crate::Partitioning>,
}

/// The last `do_put` message: proves the upload complete. `crc32` covers
/// every preceding message's `data_header` then `data_body`, in order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PutCommit {
    pub rows: u64,
    pub messages: u64,
    pub crc32: u32,
}

/// The `do_put` answer: the partition as the device now describes it.
pub type PutResult = crate::FormatDescriptor;

/// Encodes a protocol value as JSON bytes.
pub fn to_json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("protocol types serialize")
}

/// Decodes a protocol value, naming `what` in the error.
pub fn from_json_bytes<T: for<'a> Deserialize<'a>>(bytes: &[u8], what: &str) -> WireResult<T> {
    serde_json::from_slice(bytes).map_err(|e| WireError::Protocol(format!("{what}: {e}")))
}

/// The manifest as `list_tables` sends it.
pub fn manifest_from_json_bytes(bytes: &[u8], device: u32) -> WireResult<Manifest> {
    Manifest::from_json(bytes, &format!("device {device} manifest"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_round_trip_by_name_and_reject_unknown_ones() {
        for op in Operator::ALL {
            assert_eq!(Operator::parse(op.name()).unwrap(), op);
        }
        let err = Operator::parse("hash_join").unwrap_err().to_string();
        assert!(err.contains("unknown operator 'hash_join'"), "{err}");
        assert!(err.contains("partial_aggregate"), "{err}");
    }

    #[test]
    fn stage_stats_accumulate_per_operator() {
        let mut a = StageStats {
            rows_read: 1,
            operator_us: [("FilterExec".to_string(), 5)].into(),
            ..Default::default()
        };
        let b = StageStats {
            rows_read: 2,
            rows_out: 3,
            operator_us: [("FilterExec".to_string(), 7), ("X".to_string(), 1)].into(),
            ..Default::default()
        };
        a.accumulate(&b);
        assert_eq!(a.rows_read, 3);
        assert_eq!(a.rows_out, 3);
        assert_eq!(a.operator_us["FilterExec"], 12);
        assert_eq!(a.operator_us["X"], 1);
    }

    #[test]
    fn garbage_protocol_json_names_what_was_decoded() {
        let err = from_json_bytes::<PutRequest>(b"{\"table\":1}", "put request")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("protocol: put request:"), "{err}");
    }
}
