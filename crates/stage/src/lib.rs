//! Stage plans: the pushed-down part of a query, as bytes.
//!
//! A stage plan is a DataFusion physical plan whose leaf is a
//! [`PartitionScanExec`]: it names a table and partition ids, never file
//! paths. The host encodes it with datafusion-proto and [`StageCodec`]; the
//! device decodes it with a [`PartitionBinder`] that replaces the leaf with a
//! scan of its own files.
//!
//! ```text
//!   host                                   device
//!   AggregateExec(Partial)                 AggregateExec(Partial)
//!     FilterExec            --bytes-->       FilterExec
//!       PartitionScanExec                      DataSourceExec (local Parquet,
//!         (table, partitions)                    row-group pruning)
//! ```

mod codec;
pub mod hybrid_scan;
pub mod memory;
mod scan;

pub use codec::{
    bind_stage, decode_stage_unbound, describe_stage, encode_stage, PartitionBinder, StageCodec,
};
pub use hybrid_scan::{HybridFile, HybridScanExec};
pub use memory::MeteredPool;
pub use scan::PartitionScanExec;
