//! Heap metering for the memory report: how many bytes the sort itself
//! allocated at its peak, apart from the stacks, code and libraries that
//! RSS also counts.
//!
//! ```text
//!   MeteredAllocator<A>  (the binary's #[global_allocator], wraps A)
//!        | every alloc / realloc / dealloc while a HeapMeter runs
//!        v
//!   live += size change;  peak = max(peak, live)
//! ```
//!
//! The counters are the net change since [`HeapMeter::start`]: memory
//! allocated before and freed during the sort counts negatively, so the
//! peak is what the sort added at most. Outside a meter each allocation
//! costs one relaxed atomic load more than `A`'s.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::Relaxed};

/// The allocator `A` (the system's unless told), counting bytes while a
/// [`HeapMeter`] runs. Install it with `#[global_allocator]` in a binary
/// that reports memory.
pub struct MeteredAllocator<A = System>(pub A);

static METERING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// Calls counted while metering: nonzero only through [`MeteredAllocator`].
static CALLS: AtomicUsize = AtomicUsize::new(0);

#[inline(always)]
fn note(delta: isize) {
    if METERING.load(Relaxed) {
        CALLS.fetch_add(1, Relaxed);
        let live = LIVE.fetch_add(delta, Relaxed) + delta;
        PEAK.fetch_max(live, Relaxed);
    }
}

// SAFETY: every call is passed to `A` unchanged; the counting only reads
// sizes and touches atomics.
unsafe impl<A: GlobalAlloc> GlobalAlloc for MeteredAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.0.alloc(layout);
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.0.alloc_zeroed(layout);
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.0.dealloc(ptr, layout);
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = self.0.realloc(ptr, layout, new_size);
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// A running count of the heap bytes allocated since it started. One at a
/// time per process (the counters are global); stops when dropped.
pub struct HeapMeter {
    installed: bool,
}

impl HeapMeter {
    /// Starts counting from zero.
    pub fn start() -> Self {
        LIVE.store(0, Relaxed);
        PEAK.store(0, Relaxed);
        CALLS.store(0, Relaxed);
        METERING.store(true, Relaxed);
        // A probe allocation tells whether `MeteredAllocator` is the
        // global allocator at all (else nothing is ever counted).
        let probe = std::hint::black_box(Box::new([0u8; 64]));
        drop(probe);
        let installed = CALLS.load(Relaxed) > 0;
        PEAK.store(LIVE.load(Relaxed), Relaxed);
        HeapMeter { installed }
    }

    /// The most bytes live at once since the start, net of what was freed;
    /// `None` when the global allocator is not [`MeteredAllocator`].
    pub fn peak_bytes(&self) -> Option<u64> {
        self.installed.then(|| PEAK.load(Relaxed).max(0) as u64)
    }
}

impl Drop for HeapMeter {
    fn drop(&mut self) {
        METERING.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary keeps the default allocator: the meter says so
    /// rather than report a peak of zero.
    #[test]
    fn without_the_metered_allocator_nothing_is_reported() {
        let meter = HeapMeter::start();
        let v = vec![1u8; 1 << 20];
        assert_eq!(meter.peak_bytes(), None);
        std::hint::black_box(v);
    }
}
