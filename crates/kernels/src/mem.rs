//! Large working buffers: huge-page backed, and reusable through a
//! process-wide scratch pool.
//!
//! A 100M-row sort touches gigabytes of fresh memory. With 4 KiB pages most
//! of its time went to page faults (perf: 40% in `clear_page_erms`); with
//! huge pages the kernel still zeroes every fresh page, which perf showed
//! as 66% of a 100M-row argsort. Kernels therefore take their large buffers
//! from a pool of already-faulted allocations ([`take_vec`]) and give them
//! back when done ([`recycle`], or [`pooled_buffer`] for Arrow outputs,
//! which return to the pool when the last array using them is dropped).
//!
//! The pool retains at most [`scratch_pool_bytes_max`] bytes, 0 unless the
//! process opts in with [`set_scratch_pool_bytes_max`]: memory held for
//! reuse counts against whatever budget the process keeps, so the process
//! decides.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::buffer::Buffer;

/// Buffers at least this large ask for huge pages.
const HUGE_BYTES_MIN: usize = 4 << 20;
/// Buffers at least this large are pooled: a device's 64Ki-row batch
/// columns are (smaller ones come from the allocator's own free lists).
const POOLED_BYTES_MIN: usize = 64 << 10;
/// A parked buffer serves requests down to this fraction of its size, so
/// an array never pins far more memory than it reports using.
const POOLED_SLACK_MAX: usize = 2;
/// The pool holds at most this many buffers: enough for every result
/// chunk of a 6M-row sorted table (about 750 of 8192 rows) to come back.
const PARKED_MAX: usize = 4096;

/// Plain data: every bit pattern is a valid value, so memory a previous
/// user initialized may be handed out as-is.
///
/// # Safety
/// Implementors must be valid for any bit pattern and have no drop glue.
pub unsafe trait Pod: Copy + Send + Sync + 'static {}
// SAFETY: primitive integers are valid for every bit pattern.
unsafe impl Pod for u8 {}
unsafe impl Pod for u16 {}
unsafe impl Pod for u32 {}
unsafe impl Pod for u64 {}
unsafe impl Pod for u128 {}
unsafe impl Pod for i8 {}
unsafe impl Pod for i16 {}
unsafe impl Pod for i32 {}
unsafe impl Pod for i64 {}
unsafe impl Pod for i128 {}

/// An allocation parked in the pool: `bytes` long with alignment `align`,
/// the first `init_bytes` of it initialized.
struct Parked {
    ptr: NonNull<u8>,
    bytes: usize,
    align: usize,
    init_bytes: usize,
}
// SAFETY: a parked allocation is owned by the pool alone.
unsafe impl Send for Parked {}

/// Freed large allocations kept for reuse, up to a limit in bytes.
pub struct ScratchPool {
    shelf: Mutex<Shelf>,
    bytes_max: AtomicUsize,
}

/// Parked allocations by size, with their totals.
struct Shelf {
    by_bytes: BTreeMap<usize, Vec<Parked>>,
    bytes: usize,
    count: usize,
}

/// The process-wide pool the kernels use.
pub static SCRATCH_POOL: ScratchPool = ScratchPool::new();

/// How many bytes of freed scratch buffers the process-wide pool may retain.
pub fn scratch_pool_bytes_max() -> usize {
    SCRATCH_POOL.bytes_max()
}

/// Sets the process-wide pool's limit in bytes; lowering it frees what is
/// over.
pub fn set_scratch_pool_bytes_max(bytes: usize) {
    SCRATCH_POOL.set_bytes_max(bytes)
}

/// An empty vector with room for `n` values from the process-wide pool.
pub fn take_vec<T: Pod>(n: usize) -> Vec<T> {
    SCRATCH_POOL.take_vec(n)
}

/// `n` values of unspecified content from the process-wide pool.
pub fn take_vec_filled<T: Pod + Default>(n: usize) -> Vec<T> {
    SCRATCH_POOL.take_vec_filled(n)
}

/// Room for `n` values from the process-wide pool, holding as many
/// initialized values as it has ([`ScratchPool::take_vec_initialized`]).
pub fn take_vec_initialized<T: Pod>(n: usize) -> Vec<T> {
    SCRATCH_POOL.take_vec_initialized(n)
}

/// Gives `v`'s allocation to the process-wide pool.
pub fn recycle<T: Pod>(v: Vec<T>) {
    SCRATCH_POOL.recycle(v)
}

/// `v` as an Arrow buffer that returns to the process-wide pool.
pub fn pooled_buffer<T: Pod>(v: Vec<T>) -> Buffer {
    SCRATCH_POOL.pooled_buffer(v)
}

impl ScratchPool {
    /// An empty pool retaining nothing until given a limit.
    pub const fn new() -> Self {
        ScratchPool {
            shelf: Mutex::new(Shelf::new()),
            bytes_max: AtomicUsize::new(0),
        }
    }

    pub fn bytes_max(&self) -> usize {
        self.bytes_max.load(Ordering::Relaxed)
    }

    /// Sets the limit in bytes; lowering it frees what is over.
    pub fn set_bytes_max(&self, bytes: usize) {
        // A raised limit cannot need evictions: skip the lock, since the
        // device ledger changes the limit on every reservation.
        if self.bytes_max.swap(bytes, Ordering::Relaxed) > bytes {
            self.evict_to(bytes);
        }
    }

    /// Frees parked buffers, smallest first, until at most `bytes` remain.
    fn evict_to(&self, bytes: usize) {
        let mut evicted = Vec::new();
        let mut shelf = self.lock();
        while shelf.bytes > bytes {
            evicted.push(
                shelf
                    .pop_smallest()
                    .expect("a pool over its limit holds something"),
            );
        }
        drop(shelf);
        evicted.into_iter().for_each(free);
    }

    /// Bytes the pool holds now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shelf> {
        self.shelf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty vector with room for `n` values: a pooled allocation if one
    /// fits, else a fresh one, huge-page backed if large.
    pub fn take_vec<T: Pod>(&self, n: usize) -> Vec<T> {
        match self.take_parked::<T>(n) {
            // SAFETY: the allocation has T's alignment and a size that is a
            // multiple of T's, so it is exactly a Vec<T>'s of this capacity.
            Some(parked) => unsafe { parked.into_vec(0) },
            None => huge_vec_with_capacity(pooled_capacity::<T>(n)),
        }
    }

    /// `n` values of unspecified content (whatever a previous user left, or
    /// zeros), for buffers that are written before they are read.
    pub fn take_vec_filled<T: Pod + Default>(&self, n: usize) -> Vec<T> {
        let mut v = self.take_vec_initialized(n);
        // Zeroes only what no previous user initialized.
        v.resize(n, T::default());
        v
    }

    /// A vector with room for `n` values or more whose length is what of
    /// it is initialized: the values a previous user left (any content),
    /// or the whole capacity of a fresh allocation, which is zeroed. For
    /// callers that initialize only what they use of a generous capacity.
    pub fn take_vec_initialized<T: Pod>(&self, n: usize) -> Vec<T> {
        match self.take_parked::<T>(n) {
            Some(parked) => {
                let init = parked.init_bytes / std::mem::size_of::<T>();
                // SAFETY: as in `take_vec`; the first `init` values were
                // initialized by a previous user, and T is valid for any bits.
                unsafe { parked.into_vec(init) }
            }
            None => {
                let mut v = zeroed_huge_vec(pooled_capacity::<T>(n));
                // SAFETY: the allocation is zeroed and T (plain data) is
                // valid for any bits.
                unsafe { v.set_len(v.capacity()) };
                v
            }
        }
    }

    /// Smallest parked allocation that holds `n` values of T.
    fn take_parked<T: Pod>(&self, n: usize) -> Option<Parked> {
        let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
        let need = n.checked_mul(size)?;
        if need < POOLED_BYTES_MIN {
            return None;
        }
        self.lock()
            .take_fitting(need..=need.saturating_mul(POOLED_SLACK_MAX), size, align)
    }

    /// Parks `v`'s allocation for reuse, or frees it if the pool is full or
    /// `v` is small.
    pub fn recycle<T: Pod>(&self, v: Vec<T>) {
        let size = std::mem::size_of::<T>();
        let bytes = v.capacity() * size;
        if bytes < POOLED_BYTES_MIN {
            return;
        }
        let mut shelf = self.lock();
        let evicted = match shelf.make_room(bytes, self.bytes_max()) {
            Some(evicted) => evicted,
            None => return,
        };
        let mut v = std::mem::ManuallyDrop::new(v);
        shelf.push(Parked {
            ptr: NonNull::new(v.as_mut_ptr() as *mut u8).expect("a non-empty Vec has a pointer"),
            bytes,
            align: std::mem::align_of::<T>(),
            init_bytes: v.len() * size,
        });
        drop(shelf);
        evicted.into_iter().for_each(free);
    }

    /// `v` as an Arrow buffer whose memory returns to this pool (or is
    /// freed, if the pool does not take it) when the last array using it is
    /// dropped.
    pub fn pooled_buffer<T: Pod>(&'static self, v: Vec<T>) -> Buffer {
        let len = v.len() * std::mem::size_of::<T>();
        let ptr = NonNull::new(v.as_ptr() as *mut u8).expect("a non-empty Vec has a pointer");
        let owner = Arc::new(Recycled { vec: v, pool: self });
        // SAFETY: `ptr` points at `len` initialized bytes of the Vec the
        // owner holds; the Vec is not touched again until the owner drops.
        unsafe { Buffer::from_custom_allocation(ptr, len, owner) }
    }
}

impl Default for ScratchPool {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ScratchPool {
    fn drop(&mut self) {
        self.bytes_max.store(0, Ordering::Relaxed);
        self.evict_to(0);
    }
}

impl Parked {
    /// # Safety
    /// T must have this allocation's alignment, a size dividing its length,
    /// and `len` values must be initialized.
    unsafe fn into_vec<T>(self, len: usize) -> Vec<T> {
        let capacity = self.bytes / std::mem::size_of::<T>();
        Vec::from_raw_parts(self.ptr.as_ptr() as *mut T, len, capacity)
    }
}

/// Room for `n` values rounded up to a size class (steps of 1/8 of the
/// power of two below, so at most 12.5% more), so that requests of nearly
/// the same size, such as the byte buffers of successive decoded string
/// batches, fit what the previous one parked instead of each missing the
/// pool and faulting in fresh pages.
fn pooled_capacity<T>(n: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    let bytes = n.saturating_mul(size);
    if bytes < POOLED_BYTES_MIN {
        return n;
    }
    let step = (1usize << bytes.ilog2()) / 8;
    bytes.next_multiple_of(step).div_ceil(size)
}

impl Shelf {
    const fn new() -> Self {
        Shelf {
            by_bytes: BTreeMap::new(),
            bytes: 0,
            count: 0,
        }
    }

    fn push(&mut self, parked: Parked) {
        self.bytes += parked.bytes;
        self.count += 1;
        self.by_bytes.entry(parked.bytes).or_default().push(parked);
    }

    /// The smallest parked allocation with a size in `sizes` that holds
    /// values of `size` bytes aligned to `align`.
    fn take_fitting(
        &mut self,
        sizes: std::ops::RangeInclusive<usize>,
        size: usize,
        align: usize,
    ) -> Option<Parked> {
        let (bytes, i) = self.by_bytes.range(sizes).find_map(|(&bytes, list)| {
            list.iter()
                .position(|p| p.align == align && p.bytes.is_multiple_of(size))
                .map(|i| (bytes, i))
        })?;
        Some(self.remove(bytes, i))
    }

    fn pop_smallest(&mut self) -> Option<Parked> {
        let (&bytes, list) = self.by_bytes.iter().next()?;
        let last = list.len() - 1;
        Some(self.remove(bytes, last))
    }

    fn remove(&mut self, bytes: usize, i: usize) -> Parked {
        let list = self.by_bytes.get_mut(&bytes).expect("a listed size");
        let parked = list.swap_remove(i);
        if list.is_empty() {
            self.by_bytes.remove(&bytes);
        }
        self.bytes -= parked.bytes;
        self.count -= 1;
        parked
    }

    /// Makes room for a buffer of `bytes`: nothing to do if it fits; else,
    /// if evicting smaller buffers (smallest first) frees enough, removes
    /// and returns them; else `None` (the new buffer is not parked).
    ///
    /// Larger buffers win because a request is met only by a parked buffer
    /// of at least its size: a table sort's packed rows (hundreds of MiB)
    /// were turned away by a pool full of IPC chunks (a few MiB each, which
    /// any later chunk request can use), and the next sort faulted them in
    /// afresh.
    fn make_room(&mut self, bytes: usize, bytes_max: usize) -> Option<Vec<Parked>> {
        let fits = |freed: usize, evicted: usize| {
            self.bytes - freed + bytes <= bytes_max && self.count - evicted < PARKED_MAX
        };
        let (mut freed, mut evicted) = (0usize, 0usize);
        let mut smaller = self
            .by_bytes
            .range(..bytes)
            .flat_map(|(&b, list)| std::iter::repeat_n(b, list.len()));
        while !fits(freed, evicted) {
            // Out of smaller buffers: the new one is not parked.
            freed += smaller.next()?;
            evicted += 1;
        }
        Some((0..evicted).filter_map(|_| self.pop_smallest()).collect())
    }
}

fn free(parked: Parked) {
    let layout = std::alloc::Layout::from_size_align(parked.bytes, parked.align)
        .expect("parked layout was valid when allocated");
    // SAFETY: `ptr` came from the global allocator with exactly this layout
    // (a Vec's capacity times its element size, and its alignment).
    unsafe { std::alloc::dealloc(parked.ptr.as_ptr(), layout) }
}

/// Owns a vector behind an Arrow buffer and recycles it when the buffer's
/// last user drops it.
struct Recycled<T: Pod> {
    vec: Vec<T>,
    pool: &'static ScratchPool,
}

impl<T: Pod> Drop for Recycled<T> {
    fn drop(&mut self) {
        self.pool.recycle(std::mem::take(&mut self.vec));
    }
}

impl<T: Pod> std::panic::RefUnwindSafe for Recycled<T> {}

/// An empty vector with room for `n` values, huge-page backed if large.
pub fn huge_vec_with_capacity<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    advise_huge(v.as_ptr() as usize, n * std::mem::size_of::<T>());
    v
}

/// An empty vector with room for `n` values in zeroed memory, huge-page
/// backed if large. A large zeroed allocation comes straight from `mmap`,
/// already zero, so no page is touched (and faulted in) until used;
/// zeroing it with a write touched every page up front (perf: 4% of an
/// ORDER BY in `memset` under `GatherSource::new`).
fn zeroed_huge_vec<T: Pod>(n: usize) -> Vec<T> {
    let layout = std::alloc::Layout::array::<T>(n).expect("capacity overflows isize");
    if layout.size() == 0 {
        return Vec::new();
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    advise_huge(ptr as usize, layout.size());
    // SAFETY: `ptr` comes from the global allocator with `T`'s alignment
    // and room for exactly `n` values; the length is 0.
    unsafe { Vec::from_raw_parts(ptr, 0, n) }
}

/// A transparent huge page on x86-64 and most arm64 kernels: a buffer
/// smaller than one is never backed by one.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

#[cfg(target_os = "linux")]
fn advise_huge(addr: usize, len: usize) {
    if len < HUGE_BYTES_MIN {
        return;
    }
    // Only whole huge pages inside the allocation.
    let start = addr.next_multiple_of(HUGE_PAGE_BYTES);
    let end = (addr + len) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    advise(start, end, libc::MADV_HUGEPAGE);
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_addr: usize, _len: usize) {}

/// The size of a base page (`sysconf(_SC_PAGESIZE)`; 4096 if it cannot
/// say).
pub fn page_bytes() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// Advises `len` bytes at `addr`, memory the caller owns, to stay on base
/// pages: memory filled once and then read in order gains nothing from
/// huge pages, and where a fresh huge page faults in slowly it loses
/// (`insitu_extsort`'s read buffers). The advice stays with the memory
/// after it is freed, so it suits memory that is its own mapping.
pub fn advise_base_pages(addr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE_BYTES {
        let page = page_bytes();
        // Only whole pages inside the allocation.
        let start = (addr as usize).next_multiple_of(page);
        let end = (addr as usize + len) / page * page;
        advise(start, end, libc::MADV_NOHUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

/// `madvise(advice)` on `start..end`, page-aligned bounds inside memory
/// the caller owns. Advice changes no contents; a refusal only loses
/// speed.
#[cfg(target_os = "linux")]
fn advise(start: usize, end: usize, advice: i32) {
    if end > start {
        // SAFETY: as the caller promises, the range is whole pages of an
        // allocation it owns; the advice changes no contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, advice);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_within_its_limit_and_frees_beyond() {
        let pool: &'static ScratchPool = Box::leak(Box::new(ScratchPool::new()));
        let n = HUGE_BYTES_MIN / 8;
        pool.recycle(vec![7u64; n]);
        assert_eq!(pool.bytes(), 0, "a zero limit retains nothing");

        pool.set_bytes_max(4 * HUGE_BYTES_MIN);
        let v = vec![7u64; n];
        let ptr = v.as_ptr() as usize;
        pool.recycle(v);
        assert_eq!(pool.bytes(), HUGE_BYTES_MIN);
        assert!(
            pool.take_vec::<u128>(n).capacity() >= n,
            "too large: a fresh one"
        );
        let again: Vec<u64> = pool.take_vec_filled(n / 2);
        assert_eq!(again.as_ptr() as usize, ptr, "the parked buffer is reused");
        assert_eq!(again.len(), n / 2);
        assert!(again.iter().all(|&x| x == 7), "previous contents remain");
        assert_eq!(pool.bytes(), 0);

        // Arrow buffers go back to the pool when dropped.
        let buffer = pool.pooled_buffer(again);
        assert_eq!(buffer.len(), n / 2 * 8);
        assert_eq!(pool.bytes(), 0);
        drop(buffer);
        assert_eq!(pool.bytes(), HUGE_BYTES_MIN);

        // Over the limit: freed, not parked.
        for _ in 0..5 {
            pool.recycle(vec![1u32; HUGE_BYTES_MIN / 4]);
        }
        assert_eq!(pool.bytes(), 4 * HUGE_BYTES_MIN);
        // Small requests never come from the pool.
        assert!(pool.take_vec::<u8>(16).capacity() < HUGE_BYTES_MIN);
        // Far smaller requests do not pin a large parked buffer.
        assert!(pool.take_vec::<u32>(HUGE_BYTES_MIN / 4 / 3).capacity() < HUGE_BYTES_MIN / 4);
        assert_eq!(pool.bytes(), 4 * HUGE_BYTES_MIN);
        pool.set_bytes_max(HUGE_BYTES_MIN);
        assert_eq!(pool.bytes(), HUGE_BYTES_MIN);
        pool.set_bytes_max(0);
        assert_eq!(pool.bytes(), 0);
    }

    #[test]
    fn evicting_smaller_buffers_parks_a_larger_one() {
        let pool: &'static ScratchPool = Box::leak(Box::new(ScratchPool::new()));
        let unit = POOLED_BYTES_MIN;
        pool.set_bytes_max(10 * unit);
        // Full of small buffers: 1, 2, 3 and 4 units.
        for k in 1..=4 {
            pool.recycle(vec![k as u8; k * unit]);
        }
        assert_eq!(pool.bytes(), 10 * unit);
        // A 5-unit buffer evicts the smallest until it fits: 1, 2 and 3.
        let big = vec![9u8; 5 * unit];
        let big_ptr = big.as_ptr() as usize;
        pool.recycle(big);
        assert_eq!(pool.bytes(), 9 * unit, "4 + 5 units parked");
        let taken: Vec<u8> = pool.take_vec_filled(5 * unit);
        assert_eq!(
            taken.as_ptr() as usize,
            big_ptr,
            "the large buffer was kept"
        );
        pool.recycle(taken);
        // No room even after evicting every smaller buffer: nothing changes.
        pool.recycle(vec![0u8; 11 * unit]);
        assert_eq!(pool.bytes(), 9 * unit);
        // Smaller than everything parked and no room: not parked, nothing evicted.
        pool.recycle(vec![0u8; 2 * unit]);
        assert_eq!(pool.bytes(), 9 * unit);
        pool.set_bytes_max(0);
    }

    #[test]
    fn hundreds_of_result_chunks_are_all_parked_and_reused() {
        let pool: &'static ScratchPool = Box::leak(Box::new(ScratchPool::new()));
        let unit = POOLED_BYTES_MIN;
        pool.set_bytes_max(usize::MAX);
        let chunks: Vec<Vec<u8>> = (0..1000).map(|i| vec![0u8; unit + i]).collect();
        let mut ptrs: Vec<usize> = chunks.iter().map(|c| c.as_ptr() as usize).collect();
        chunks.into_iter().for_each(|c| pool.recycle(c));
        assert_eq!(pool.bytes(), (0..1000).map(|i| unit + i).sum::<usize>());
        let taken: Vec<Vec<u8>> = (0..1000).map(|i| pool.take_vec(unit + i)).collect();
        let mut again: Vec<usize> = taken.iter().map(|v| v.as_ptr() as usize).collect();
        ptrs.sort_unstable();
        again.sort_unstable();
        assert_eq!(again, ptrs, "each request met by a parked chunk");
        assert_eq!(pool.bytes(), 0);
    }

    #[test]
    fn fresh_pooled_buffers_round_up_to_a_size_class() {
        let pool: &'static ScratchPool = Box::leak(Box::new(ScratchPool::new()));
        pool.set_bytes_max(64 * HUGE_BYTES_MIN);
        for n in [POOLED_BYTES_MIN, POOLED_BYTES_MIN + 1, 1_000_003, 1 << 20] {
            let v: Vec<u8> = pool.take_vec(n);
            assert!(v.capacity() >= n, "room for {n}");
            assert!(v.capacity() <= n + n / 8, "at most 1/8 more than {n}");
        }
        assert_eq!(pooled_capacity::<u64>(10), 10, "small requests are exact");
        // A slightly larger request reuses what a slightly smaller one parked.
        let first: Vec<u8> = pool.take_vec(1_000_000);
        let ptr = first.as_ptr() as usize;
        pool.recycle(first);
        let second: Vec<u8> = pool.take_vec_filled(1_000_100);
        assert_eq!(second.as_ptr() as usize, ptr);
        assert_eq!(second.len(), 1_000_100);
    }
}
