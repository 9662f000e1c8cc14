//! What to sort and with what: the options of an external sort.

use std::path::PathBuf;

use crate::codec::CodecChoice;

/// What to sort and with what.
#[derive(Debug, Clone)]
pub struct ExtsortOptions {
    pub record_size: usize,
    pub key_size: usize,
    /// Memory budget for buffers (`mem_bytes_max`).
    pub mem_bytes: u64,
    /// Where runs go (default: OUT's directory).
    pub tmp_dir: Option<PathBuf>,
    pub threads: usize,
    /// How runs may be stored (`--run-codec`).
    pub run_codec: CodecChoice,
    /// Where storage rates are cached ([`crate::probe`]); `None`: always
    /// measure.
    pub storage_rates_cache: Option<PathBuf>,
    /// Measure the storage even if its rates are cached (`--reprobe`).
    pub reprobe: bool,
    /// Run size M in place of the model's choice (`--run-size`).
    pub run_bytes: Option<u64>,
}
