//! The process's allocator: mimalloc (the binary's `#[global_allocator]`,
//! inside the extsort heap meter), tuned for a query engine that frees
//! and reallocates the same large buffers query after query.
//!
//! ```text
//!  main ─▶ tune(): purge_delay = -1 (unless MIMALLOC_PURGE_DELAY is set)
//!                  freed memory stays committed for the next query
//!  extsort ─▶ hold_only_used_memory(): purge_delay = 0, no huge pages
//! ```
//!
//! Measured with `insitu bench sql "select * from lineitem order by K"
//! --runs 5` on SF1 over 2 devices, alternating invocations (medians):
//!
//! - mimalloc against glibc's allocator (tuned then to keep freed heap
//!   memory, one arena and huge pages, through a re-execution of the
//!   process with `GLIBC_TUNABLES`): by l_partkey 1.68-1.98 s against
//!   2.09-2.19 s, by l_shipinstruct 1.50-1.66 s against 1.66-1.73 s (three
//!   invocations each, all six faster); by l_extendedprice 1.79 and 1.95 s
//!   against 2.15 and 2.15 s, with 23.3 and 25.6 s of CPU for the whole
//!   invocation against 25.5 and 26.8 s (`perf stat -e task-clock`).
//! - Freed memory kept: by default mimalloc decommits freed memory after a
//!   delay, and each query pays page faults and kernel page zeroing again
//!   for the batches the last one freed: by l_partkey 2.21-3.06 s with the
//!   default delay against 2.05-2.17 s for glibc in the same three rounds.
//! - Transparent huge pages, which mimalloc asks for on its arenas by
//!   default, are kept for queries: a sort's gathers read rows at random
//!   from hundreds of megabytes, and with 4 KiB pages nearly every read
//!   also misses the TLB (by l_partkey 1.49-1.80 s against 1.77-2.36 s
//!   with `MIMALLOC_ALLOW_THP=0`). Allowing large OS pages as well
//!   (`MIMALLOC_ALLOW_LARGE_OS_PAGES=1`) made no difference we could
//!   measure.
//! - The external sort wants the opposite: its sort phase's buffers must
//!   leave the process before the merge phase allocates its own, and
//!   memory faulted in 2 MiB at a time would hold more than `--mem`.

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc's `mi_option_purge_delay` (milliseconds before freed memory is
/// decommitted; -1 never, 0 at once), which `libmimalloc-sys` does not
/// name: its place in `mi_option_e` of the mimalloc 3 it builds.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// Tunes the allocator as the module doc says. Call first thing in `main`.
pub fn tune() {
    // mimalloc read its variables when the process started: a value the
    // user set is already in force.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
        && std::env::var_os("MIMALLOC_RESET_DELAY").is_none()
    {
        // SAFETY: mi_option_set only stores an option value.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
    }
}

/// Makes the process hold only memory it uses (for `extsort`, whose
/// phases must not hold each other's buffers): freed memory goes back to
/// the OS at once, and memory is no longer faulted in 2 MiB at a time.
pub fn hold_only_used_memory() {
    // SAFETY: mi_option_set only stores an option value.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    // Huge pages made small allocations scattered over mimalloc's arena
    // resident 2 MiB at a time: 25 MiB besides the heap for an 8 MiB
    // sort, against 1.6 MiB without.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    const CHILD: &str = "INSITU_ALLOCATOR_TEST_CHILD";

    /// `MI_OPTION_PURGE_DELAY` is the option mimalloc reads from
    /// `MIMALLOC_PURGE_DELAY`: a child test process started with the
    /// variable set reports its value through that option number.
    #[test]
    fn purge_delay_option_is_the_one_its_variable_sets() {
        if std::env::var_os(CHILD).is_some() {
            // SAFETY: mi_option_get only reads an option value.
            let delay = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
            println!("purge_delay={delay}");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "allocator::tests::purge_delay_option_is_the_one_its_variable_sets",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("MIMALLOC_PURGE_DELAY", "4321")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("purge_delay=4321"), "{stdout}");
    }

    #[test]
    fn freed_memory_goes_back_when_asked() {
        hold_only_used_memory();
        // SAFETY: mi_option_get only reads an option value.
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 0);
        tune();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
    }
}
