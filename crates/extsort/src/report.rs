//! What a sort measured: each phase's time and where it went, against
//! what the model predicted.

use std::time::Instant;

/// Which phase a progress report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Sort,
    /// Merge pass `n` (1-based); the last one writes OUT.
    Merge(u32),
}

/// Seconds each phase took, and where they went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub sort_secs: f64,
    pub merge_secs: f64,
    /// The sort phase's time as its two threads spent it.
    pub sort_times: SortTimes,
    /// The merge phase's, all passes together.
    pub merge_times: PhaseTimes,
    /// Runs written to storage.
    pub runs_written: u64,
    /// Runs merged from memory without being written (0 or 1).
    pub runs_in_memory: u64,
    /// Bytes written to runs (after compression) and to OUT.
    pub bytes_written: u64,
}

/// Where a phase's time went, on the thread that drives it: waiting for
/// storage (or for the threads that read and write it), and its own work.
/// What the fields leave of the phase's time is its own work too: in the
/// merge phase, the merge itself.
///
/// A phase that waits little for storage is bound by its own work; one
/// that waits most of its time is bound by storage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Waiting for the next block of input or of a run.
    pub read_wait_secs: f64,
    /// Waiting for a writer to take a block, or to finish a file (the
    /// sort phase's key sort: for the run writer to take a chunk).
    pub write_wait_secs: f64,
    /// Sorting keys (the sort phase's main thread).
    pub sort_keys_secs: f64,
    /// Gathering records in key order, and compressing them if runs are
    /// compressed (the sort phase's run writer).
    pub gather_secs: f64,
}

/// The sort phase's time on its two threads, which overlap: the one
/// that sorts keys (`main`: reads, key sorts, waits for the run writer to
/// take a chunk or to finish the last) and the run writer (gathers
/// records and waits for the block writer).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SortTimes {
    pub main: PhaseTimes,
    pub run_writer: PhaseTimes,
}

/// Runs `f`, adding the time it took to `secs`.
pub(crate) fn timed<T>(secs: &mut f64, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    *secs += start.elapsed().as_secs_f64();
    out
}
