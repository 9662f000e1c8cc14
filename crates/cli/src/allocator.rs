//! Tuning of glibc's allocator for the whole process, unless the user
//! tuned it (`MALLOC_*` or `GLIBC_TUNABLES` in the environment).
//!
//! ```text
//!  start ──user tuned?──yes──▶ run as told
//!    │ no
//!    ├──▶ exec /proc/self/exe, same arguments, GLIBC_TUNABLES = tunables()
//!    │      └──▶ start (marker set): drop marker and GLIBC_TUNABLES, run
//!    └──▶ exec failed (no /proc): mallopt what mallopt can set, run
//! ```
//!
//! Why each tunable:
//!
//! - By default glibc maps blocks past 128 KiB fresh from the kernel and
//!   trims freed heap memory back to it, so each query pays page faults
//!   and kernel page zeroing again for the batches the last one freed:
//!   perf showed half of an ORDER BY over lineitem SF1 in
//!   `clear_page_erms`. With blocks up to 32 MiB taken from the heap
//!   (`mmap_threshold`), freed heap memory kept (`trim_threshold`) and one
//!   arena (`arena_max`), the same query took 1.31M page faults over 5
//!   runs instead of 2.19M (`perf stat -e page-faults insitu bench sql ...
//!   --runs 4`).
//! - One arena, not two: glibc gives a second arena its memory in 64 MiB
//!   heaps and unmaps each heap as soon as it is empty, so an invocation
//!   sometimes spent its time creating and deleting heaps (5832 `munmap`
//!   calls and 22.2 s of CPU for 8 queries, against 119 and 14.0 s for the
//!   next invocation). Over three alternating invocations of `bench sql
//!   "select * from lineitem order by l_partkey" --runs 7 --threads 1`,
//!   one arena gave medians of 0.818-0.874 s, two arenas 0.936-0.996 s.
//! - Transparent huge pages for the heap (`hugetlb=1`, which has glibc
//!   `madvise` its heap; kernels set to THP "madvise", the common default,
//!   otherwise give it 4 KiB pages). A sort's gathers read strings and rows
//!   at random from hundreds of megabytes, and with 4 KiB pages nearly
//!   every read also misses the TLB. Over four alternating invocations of
//!   `bench sql "SELECT * FROM lineitem ORDER BY l_partkey" --runs 5
//!   --threads 1` on SF1, medians were 2.10-2.22 s with huge pages against
//!   2.15-2.52 s without; by l_extendedprice 2.20 and 2.29 s against 2.56
//!   and 2.66 s.
//!
//! Huge pages can only be asked for through `GLIBC_TUNABLES`, which glibc
//! reads once at start, so the process re-executes itself with it set. The
//! re-executed process removes the variable again: programs it starts do
//! not inherit an allocator tuned for insitu (insitu processes it starts
//! tune themselves). The re-execution costs about 7 ms per invocation
//! (`insitu --version`: 14.5 ms against 7.5 ms with `GLIBC_TUNABLES` set,
//! medians of 20).
//!
//! mimalloc as the global allocator instead (freed memory kept, `purge_delay
//! = -1`) made ORDER BY over lineitem SF1 on 2 devices about 10% faster
//! (by l_partkey medians 1.68-1.98 s against 2.09-2.19 s, three alternating
//! invocations), but not `extsort`: the kernels' huge-page advice stays on
//! memory mimalloc reuses for small blocks, so an 8 MiB sort held 33-43 MiB
//! besides its heap (against at most 1.56 MiB here), and turning
//! transparent huge pages off for the sort (`PR_SET_THP_DISABLE`) made a
//! 1.5 GB sort take 11.35-12.12 s in three of four runs against 8.98-9.58 s.

/// Blocks up to this size come from the heap, larger ones are mapped
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

/// Set beside [`tunables`] when re-executing, so the new process knows
/// `GLIBC_TUNABLES` holds insitu's tunables, not the user's.
const REEXEC_MARKER: &str = "INSITU_ALLOCATOR_TUNED";

/// Tunes the allocator as the module doc says. Call first thing in
/// `main`, before any thread exists: it may replace the process, and it
/// edits the environment.
pub fn tune() {
    if std::env::var_os(REEXEC_MARKER).is_some() {
        // SAFETY (of the environment edits): no other thread exists yet.
        std::env::remove_var(REEXEC_MARKER);
        std::env::remove_var("GLIBC_TUNABLES");
        return;
    }
    if user_tuned() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Returns only if the exec failed; then mallopt does what it can.
        let _ = reexec_with_tunables();
        set_with_mallopt();
    }
}

/// Whether the environment already tunes glibc's allocator.
fn user_tuned() -> bool {
    std::env::vars_os().any(|(k, _)| {
        let k = k.to_string_lossy();
        k.starts_with("MALLOC_") || k == "GLIBC_TUNABLES"
    })
}

/// Replaces this process with a fresh run of the same executable and
/// arguments under [`tunables`]; returns only the error if it cannot.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn reexec_with_tunables() -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new("/proc/self/exe");
    if let Some(argv0) = args.next() {
        command.arg0(argv0);
    }
    command
        .args(args)
        .env("GLIBC_TUNABLES", tunables())
        .env(REEXEC_MARKER, "1")
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
