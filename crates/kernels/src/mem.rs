//! Large working buffers backed by transparent huge pages where the kernel
//! offers them only on request (`madvise` mode). A 100M-row sort touches
//! gigabytes of fresh memory; with 4 KiB pages most of its time went to
//! page faults (perf: 40% in `clear_page_erms` before this).

/// Buffers at least this large ask for huge pages.
const HUGE_BYTES_MIN: usize = 4 << 20;

/// An empty vector with room for `n` values, huge-page backed if large.
pub fn huge_vec_with_capacity<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    advise_huge(v.as_ptr() as usize, n * std::mem::size_of::<T>());
    v
}

/// `n` copies of `fill`, huge-page backed if large.
pub fn huge_vec<T: Clone>(n: usize, fill: T) -> Vec<T> {
    let mut v = huge_vec_with_capacity(n);
    v.resize(n, fill);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(addr: usize, len: usize) {
    const HUGE_PAGE: usize = 2 << 20;
    if len < HUGE_BYTES_MIN {
        return;
    }
    // Only whole huge pages inside the allocation.
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = (addr + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside an allocation we own; MADV_HUGEPAGE
        // is advice and changes no contents. A failure only loses speed.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_addr: usize, _len: usize) {}
