//! External merge sort for data larger than memory (paper 001, FANS), and
//! the TeraSort record tools around it.
//!
//! | module | what |
//! |---|---|
//! | [`record`] | `gensort` (TeraSort records, binary or ASCII, skewed keys) and `valsort` (order, duplicates, CRC32-sum checksum) |
//! | [`model`] | paper 001's model: run size M, fan-in l, predicted phase times |
//! | [`probe`] | the storage's read and write rates: measured by a probe file, or reused from a cache per device |
//! | [`loser`] | the loser tree behind every k-way merge |
//! | [`sort`] | the two-phase sort: radix-sorted runs, then loser-tree merge passes, with reader and writer threads overlapping I/O |
//! | [`codec`] | compressed runs: frames of records, LZ4 or Snappy, and the codecs' measured rates |
//! | [`blocks`] | reader and writer threads: blocks read ahead and written behind, compressed frame by frame |
//! | [`direct`] | direct I/O: aligned buffers, whole-page requests, the sink that writes blocks in place |
//! | [`files`] | output that appears only when complete; run directories tagged with their process |
//! | [`heap`] | the allocator-level meter behind the memory report (heap bytes at the sort's peak) |
//! | [`rss`] | the process's resident memory now and at its peak |
//!
//! ```text
//!   plan   read and write rates (probed, or cached per device), sort and
//!          merge rates on a sample, LZ4 and Snappy on the input's first
//!          4 MiB ─▶ model ─▶ run size M, fan-in l, passes, run codec
//!   sort   reader thread ─▶ [buf A | buf B] ─▶ radix argsort of the keys
//!          ─▶ run writer thread: gather records [compress frames] ─▶
//!          writer thread ─▶ run files under --tmp
//!   merge  per run a double-buffered block reader ─▶ loser tree of l
//!          cursors ─▶ writer thread (direct, whole-page writes) ─▶ next
//!          run, or OUT (temp name, fsync, rename); with room beside the
//!          merge, the last chunk is merged from memory, never written
//! ```
//!
//! Limits: `mem_bytes_max` (the `--mem` budget for buffers),
//! `merge_block_bytes_min` ([`model::MERGE_BLOCK_BYTES_MIN`]),
//! `probe_bytes` ([`sort::PROBE_BYTES_MAX`]), `storage_rates_age_max`
//! ([`probe::STORAGE_RATES_AGE_MAX`]).

pub mod blocks;
pub mod codec;
pub mod direct;
pub mod files;
pub mod heap;
pub mod loser;
mod merge_phase;
pub mod model;
mod options;
pub mod probe;
pub mod record;
mod report;
pub mod rss;
mod run_phase;
pub mod sort;

pub use codec::{CodecChoice, RunCodec};
pub use model::{Plan, Rates};
pub use record::{gensort, valsort, GenOptions, Validation, KEY_BYTES, RECORD_BYTES};
pub use sort::{extsort, plan_sort, ExtsortOptions, Measured, Phase, PhaseTimes, SortTimes};

/// Errors of the external sort and the record tools; each names the file
/// or the limit involved.
#[derive(Debug, thiserror::Error)]
pub enum ExtsortError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Input { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, ExtsortError>;
