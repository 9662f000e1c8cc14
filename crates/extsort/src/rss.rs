//! The process's resident memory, for the sort's memory report, and the
//! allocator setting that returns a phase's large buffers to the system.

use insitu_kernels::mem::page_bytes;

/// Makes large buffers go back to the OS when freed. glibc raises its
/// mmap threshold after big frees and then keeps freed buffers in its
/// heap, so a sort phase's buffers would stay resident through the merge
/// phase and the process would hold more than the budget.
pub fn return_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Resident memory of this process now, in bytes (0 if unknown).
pub fn current_rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let page = page_bytes() as u64;
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// Peak resident memory of this process so far, in bytes: the high-water
/// mark of its own address space (`VmHWM`). `getrusage`'s `ru_maxrss` is
/// not used where `/proc` answers: it also counts the process before its
/// `exec`, so a sort started by a large parent through `fork` reported the
/// parent's size (a 424 MiB peak for an 8 MiB sort spawned from a test
/// process holding 420 MiB).
pub fn peak_rss_bytes() -> u64 {
    if let Some(hwm) = proc_status_kib("VmHWM:") {
        return hwm * 1024;
    }
    // SAFETY: getrusage fills the struct we pass; zeroed is a valid start.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 {
            return usage.ru_maxrss as u64 * 1024;
        }
    }
    0
}

/// A `kB` field of `/proc/self/status`, such as `VmHWM:`.
fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_covers_memory_touched_since_start() {
        let before = peak_rss_bytes();
        assert!(before > 0, "no peak RSS on this system");
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(current_rss_bytes() >= 64 << 20);
        assert!(
            peak_rss_bytes() >= before.max(64 << 20),
            "{}",
            peak_rss_bytes()
        );
        drop(touched);
    }
}
