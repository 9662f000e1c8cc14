//! The process's allocator: glibc's, tuned, for every command; mimalloc
//! when asked for. [`ProcessAllocator`] (inside the extsort heap meter,
//! the binary's `#[global_allocator]`) passes every call to the one chosen
//! at the process's first allocation.
//!
//! ```text
//!  first allocation ─▶ INSITU_ALLOCATOR=mimalloc? ──yes──▶ mimalloc
//!                                 │ no
//!                                 └────────────────────▶ glibc's malloc
//!  main ─▶ tune(): what does the process want?
//!     mimalloc (INSITU_ALLOCATOR=mimalloc) ─▶ purge_delay = -1: freed
//!                               memory stays committed for the next query
//!     glibc ─▶ GLIBC_TUNABLES not set: exec /proc/self/exe, same
//!       arguments, GLIBC_TUNABLES=tunables() (unless the user tuned
//!       glibc: MALLOC_* or GLIBC_TUNABLES set)
//!         └─▶ start (marker set): drop the variables it added, run
//! ```
//!
//! Why glibc for queries: its one arena serves the host's and every
//! embedded device's threads, so memory one thread frees another reuses,
//! and the process holds about what its operators hold. mimalloc keeps
//! a heap per thread; with four devices of two threads and the host's,
//! TPC-H at SF1 on 4 devices peaked at 2 to 3 times the resident memory
//! and ran no faster (`insitu bench sql Q --runs 5`, medians, mimalloc
//! against glibc tuned as below): Q1 0.535 s / 504 MiB against 0.547 s /
//! 206 MiB, Q9 0.774 s / 848 MiB against 0.699 s / 399 MiB, Q18 1.113 s /
//! 1075 MiB against 1.004 s / 609 MiB, Q21 0.860 s / 911 MiB against
//! 0.782 s / 381 MiB. ORDER BY over all of lineitem SF1 took the same
//! time (by l_partkey 1.578 and 1.610 s against 1.516 and 1.679 s, by
//! l_shipinstruct 1.096 and 1.027 s against 1.082 and 1.142 s) in 3.6
//! GiB against 2.7-2.9 GiB. mimalloc's default purge delay lowers its
//! peaks less (Q18 833 MiB) and costs page faults again on every query.
//!
//! `extsort`, whose memory must stay within `--mem`, needs glibc: the
//! kernels' huge-page advice stays on memory mimalloc reuses for small
//! blocks, so an 8 MiB sort held 33-43 MiB besides its heap under
//! mimalloc (at most 1.56 MiB under glibc), and turning huge pages off for
//! the process (`PR_SET_THP_DISABLE`) made a 1.5 GB sort take 11.35-12.12 s
//! in three of four runs against 8.98-9.58 s under glibc.
//!
//! Why each glibc tunable:
//!
//! - By default glibc maps blocks past 128 KiB fresh from the kernel and
//!   trims freed heap memory back to it, so each run pays page faults and
//!   kernel page zeroing again for the buffers the last one freed (half of
//!   an ORDER BY over lineitem SF1 was `clear_page_erms`): blocks up to
//!   32 MiB come from the heap (`mmap_threshold`), freed heap memory is
//!   kept (`trim_threshold`; `extsort` lowers the mmap threshold again so
//!   its phases' big buffers leave the process), one arena (`arena_max`;
//!   a second arena gets 64 MiB heaps it unmaps as soon as they are empty:
//!   5832 `munmap` calls in one invocation of 8 queries).
//! - Transparent huge pages for the heap (`hugetlb=1`, which has glibc
//!   `madvise` its heap; kernels set to THP "madvise", the common
//!   default, otherwise give it 4 KiB pages), for the sort's gathers.
//!
//! Huge pages can only be asked for through `GLIBC_TUNABLES`, which glibc
//! reads once at start, hence the re-execution (about 7 ms: `insitu
//! --version` took 14.5 ms against 7.5 ms with `GLIBC_TUNABLES` set,
//! medians of 20). The re-executed process removes the variables it was
//! given, so programs it starts choose for themselves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::error::CliResult;
use libmimalloc_sys::{mi_option_get, mi_option_set, mi_option_t};
use mimalloc::MiMalloc;

/// The variable that chooses the allocator: `system` (glibc's, the
/// default) or `mimalloc`.
pub const ALLOCATOR_VAR: &str = "INSITU_ALLOCATOR";

/// [`ALLOCATOR_VAR`] as the C string `getenv` takes.
const ALLOCATOR_VAR_C: &std::ffi::CStr = c"INSITU_ALLOCATOR";

/// Which allocator serves the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mimalloc,
    /// The C library's malloc (glibc's on Linux).
    System,
}

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;
static KIND: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The allocator of this process, decided at its first allocation from
/// [`ALLOCATOR_VAR`] and never changed after.
#[inline(always)]
pub fn kind() -> Kind {
    match KIND.load(Relaxed) {
        MIMALLOC => Kind::Mimalloc,
        SYSTEM => Kind::System,
        _ => decide(),
    }
}

#[cold]
fn decide() -> Kind {
    // SAFETY: getenv reads the environment without allocating; the first
    // allocation comes before `tune` edits the environment, and while
    // the process has one thread. The name is NUL-terminated.
    let value = unsafe { libc::getenv(ALLOCATOR_VAR_C.as_ptr()) };
    // SAFETY: a non-null getenv result is a NUL-terminated string.
    let mimalloc =
        !value.is_null() && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"mimalloc";
    // Threads racing here read the same variable and store the same value.
    let (code, kind) = match mimalloc {
        true => (MIMALLOC, Kind::Mimalloc),
        false => (SYSTEM, Kind::System),
    };
    KIND.store(code, Relaxed);
    kind
}

/// The global allocator: every call goes to the allocator [`kind`] chose.
pub struct ProcessAllocator;

// SAFETY: the choice is made before the first allocation and never
// changes, so every block is freed and resized by the allocator that
// allocated it; each call is passed on unchanged.
unsafe impl GlobalAlloc for ProcessAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match kind() {
            Kind::Mimalloc => MiMalloc.alloc(layout),
            Kind::System => System.alloc(layout),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match kind() {
            Kind::Mimalloc => MiMalloc.alloc_zeroed(layout),
            Kind::System => System.alloc_zeroed(layout),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match kind() {
            Kind::Mimalloc => MiMalloc.dealloc(ptr, layout),
            Kind::System => System.dealloc(ptr, layout),
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match kind() {
            Kind::Mimalloc => MiMalloc.realloc(ptr, layout, new_size),
            Kind::System => System.realloc(ptr, layout, new_size),
        }
    }
}

/// mimalloc's `mi_option_purge_delay` (milliseconds before freed memory is
/// decommitted; -1 never), which `libmimalloc-sys` does not name: its
/// place in `mi_option_e` of the mimalloc 3 it builds. The integration
/// tests check it is the option `MIMALLOC_PURGE_DELAY` sets.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// Blocks up to this size come from glibc's heap, larger ones are mapped
/// fresh (`mmap_threshold`; 32 MiB is glibc's largest).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Freed memory at the heap's top kept rather than returned
/// (`trim_threshold`): all of it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD_BYTES: i32 = i32::MAX;
/// Arenas glibc may create (`arena_max`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS_MAX: i32 = 1;

/// The `GLIBC_TUNABLES` value the process re-executes itself with (see
/// the module doc): huge pages, and what [`set_with_mallopt`] sets.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tunables() -> String {
    format!(
        "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}:\
         glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}:glibc.malloc.arena_max={ARENAS_MAX}"
    )
}

/// Set when re-executing, to the comma-separated names of the variables
/// the re-execution added, so the new process can remove them again.
const REEXEC_MARKER: &str = "INSITU_ALLOCATOR_TUNED";

/// What [`tune`] settled on, for [`describe`].
static SETUP: OnceLock<String> = OnceLock::new();

/// Tunes the allocator as the module doc says. Call first thing in
/// `main`, before any thread exists: it may replace the process, and it
/// edits the environment. Fails only on a bad [`ALLOCATOR_VAR`].
pub fn tune() -> CliResult<()> {
    let wanted = wanted_kind()?;
    if let Some(added) = std::env::var_os(REEXEC_MARKER) {
        // SAFETY (of the environment edits): no other thread exists yet.
        std::env::remove_var(REEXEC_MARKER);
        let mut given = vec![];
        for name in added.to_string_lossy().split(',').filter(|n| !n.is_empty()) {
            let value = std::env::var_os(name).unwrap_or_default();
            given.push(format!("{name}={}", value.to_string_lossy()));
            std::env::remove_var(name);
        }
        let _ = SETUP.set(format!("re-executed with {}", given.join(" ")));
        return Ok(());
    }
    match wanted {
        Kind::Mimalloc => keep_freed_memory(),
        Kind::System => switch_to_tuned_glibc(),
    }
    Ok(())
}

/// One line saying which allocator serves the process and how it is
/// tuned (logged at debug level at start).
pub fn describe() -> String {
    let setup = SETUP.get().map_or("", String::as_str);
    match kind() {
        Kind::Mimalloc => {
            // SAFETY: mi_option_get only reads an option value.
            let delay = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
            format!("allocator: mimalloc, purge_delay {delay} ms; {setup}")
        }
        Kind::System => format!("allocator: system (glibc); {setup}"),
    }
}

/// The allocator the environment asks for: [`ALLOCATOR_VAR`] if set,
/// else glibc's.
fn wanted_kind() -> CliResult<Kind> {
    match std::env::var_os(ALLOCATOR_VAR) {
        None => Ok(Kind::System),
        Some(value) => match value.to_str() {
            Some("mimalloc") => Ok(Kind::Mimalloc),
            Some("system") => Ok(Kind::System),
            _ => Err(format!("{ALLOCATOR_VAR} must be mimalloc or system, not {value:?}").into()),
        },
    }
}

/// mimalloc keeps freed memory committed unless the user set a delay.
fn keep_freed_memory() {
    // mimalloc read its variables when the process started: a value the
    // user set is already in force.
    let user_set = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if user_set {
        let _ = SETUP.set("purge delay set by the user".into());
        return;
    }
    // SAFETY: mi_option_set only stores an option value.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
    let _ = SETUP.set("freed memory kept".into());
}

/// Re-executes the process on glibc's allocator with insitu's tunables
/// (the user's, if they set any); returns if it cannot.
fn switch_to_tuned_glibc() {
    let mut added: Vec<(&str, String)> = vec![];
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !user_tuned_glibc() {
        added.push(("GLIBC_TUNABLES", tunables()));
    }
    if added.is_empty() {
        let _ = SETUP.set("tuned by the user".into());
        return;
    }
    let error = reexec_with(&added);
    // Still here: the exec failed (no /proc). mallopt does what it can.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if kind() == Kind::System {
        set_with_mallopt();
    }
    let _ = SETUP.set(format!("could not re-execute: {error}"));
}

/// Whether the environment already tunes glibc's allocator.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn user_tuned_glibc() -> bool {
    std::env::vars_os().any(|(k, _)| {
        let k = k.to_string_lossy();
        k.starts_with("MALLOC_") || k == "GLIBC_TUNABLES"
    })
}

/// Replaces this process with a fresh run of the same executable and
/// arguments with `added` in its environment; returns only the error if
/// it cannot.
fn reexec_with(added: &[(&str, String)]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new("/proc/self/exe");
    if let Some(argv0) = args.next() {
        command.arg0(argv0);
    }
    let names: Vec<&str> = added.iter().map(|(name, _)| *name).collect();
    command
        .args(args)
        .envs(added.iter().map(|(k, v)| (k, v)))
        .env(REEXEC_MARKER, names.join(","))
        .exec()
}

/// [`tunables`] less huge pages, which mallopt cannot set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_with_mallopt() {
    // SAFETY: mallopt only sets allocator parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_read_at_the_first_allocation_is_the_documented_one() {
        assert_eq!(ALLOCATOR_VAR_C.to_str(), Ok(ALLOCATOR_VAR));
    }
}
