//! Wire types of insitu.
//!
//! Everything that crosses the host/device boundary or is persisted on a
//! device is defined here, and only here: partition format descriptors
//! (paper 002's explicit cross-layer format), the per-device manifest, the
//! stage-plan envelope and device errors. Types are plain data with serde
//! encodings; no I/O happens in this crate.

pub mod descriptor;
pub mod envelope;
pub mod error;
pub mod manifest;
pub mod partitioning;
pub mod profile;
pub mod protocol;
pub mod units;

pub use descriptor::{
    ColumnStats, Encoding, FieldFormat, FormatDescriptor, HybridBlock, HybridLayout,
    IpcCompression, LayoutKind, RowGroupStats, RowSlot, Section, DESCRIPTOR_VERSION,
};
pub use envelope::{
    ResultCodec, StagePlanEnvelope, ENVELOPE_MAGIC, ENVELOPE_VERSION, PLAN_BYTES_MAX,
};
pub use error::{WireError, WireResult};
pub use manifest::{Manifest, PartitionRef, MANIFEST_FILE, MANIFEST_VERSION};
pub use partitioning::{PartitionScheme, Partitioning, PARTITIONING_VERSION};
pub use profile::{
    ComputeRates, DeviceProfile, HostProfile, StageStarts, StartCost, DEVICE_PROFILE_FILE,
    FEW_GROUPS_MAX, HOST_PROFILE_FILE, PROFILE_VERSION,
};
pub use protocol::{
    Capabilities, DeviceStats, Operator, PutCommit, PutRequest, SampleKeysRequest, SortKey,
    SortTableRequest, StageStats, PROTOCOL_VERSION, SAMPLE_ROWS_MAX,
};
