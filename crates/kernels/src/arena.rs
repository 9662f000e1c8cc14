//! [`ChunkArena`]: one allocation that holds every buffer of a batch, with
//! room in front for a message header, so that the batch can be shipped as
//! one contiguous message without copying its buffers.
//!
//! ```text
//!  base        body                                   cursor
//!   │ reserve   │ region │pad│ region │pad│ region    │ free …
//!   └───────────┴────────┴───┴────────┴───┴───────────┴───────
//!        ▲ header written here, ending at `body`, when sealed
//!        └──────────── sealed chunk: [header | body .. cursor] ───┘
//! ```
//!
//! Kernels that build a batch ([`crate::GatherSource::gather`]) take their
//! output buffers from an arena with [`OutputBuffer::in_arena_or_pooled`].
//! An encoder that finds the batch's buffers in an arena
//! ([`ChunkArena::containing`]) writes the message header into the reserve
//! ([`ChunkArena::seal`]) and ships `[header | body]` as it lies. Regions
//! are 64-byte aligned and the gaps between them zeroed, so the body holds
//! nothing but the batch's bytes and zeros.
//!
//! An arena's capacity is an upper bound of what its batch takes, so its
//! memory is initialized only as far as regions are handed out (zeroed
//! past what a previous user of the pooled memory initialized): filling
//! all of it when the arena was made took 1.6% of an ORDER BY's CPU.
//!
//! The memory comes from the scratch pool and returns to it when the last
//! buffer or chunk that uses the arena is dropped.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use arrow::buffer::Buffer;

use crate::mem::{pooled_buffer, recycle, take_vec_filled, take_vec_initialized};

/// Alignment of every region in an arena (Arrow's buffer alignment).
const REGION_ALIGN: usize = 64;

/// One batch's buffers in one allocation, with a header reserve in front.
///
/// ```
/// use insitu_kernels::arena::{ChunkArena, OutputBuffer};
/// let arena = ChunkArena::new(64, 1024);
/// let mut out = OutputBuffer::in_arena_or_pooled(Some(&arena), 100);
/// out.bytes_mut().fill(7);
/// let values = out.into_buffer();
/// assert_eq!(arena.body_offset(&values), Some(0));
/// let same = ChunkArena::containing(values.as_ptr()).expect("in the arena");
/// assert_eq!(arena.body_len(), 104); // 100 bytes padded to 8
/// let chunk = same.seal(&[1; 16], 104).expect("header fits the reserve");
/// assert_eq!(chunk.len(), 16 + 104); // header, then 100 bytes padded to 8
/// assert_eq!(&chunk[16..116], &[7; 100]);
/// ```
#[derive(Clone)]
pub struct ChunkArena {
    inner: Arc<Arena>,
}

struct Arena {
    /// 64-byte aligned start of the header reserve.
    base: NonNull<u8>,
    /// Offset of the body from `base` (the reserve's size).
    body: usize,
    /// Bytes from `base` to the end of the allocation.
    capacity: usize,
    state: Mutex<ArenaState>,
    /// The pooled allocation, returned to the pool on drop. Its length
    /// is kept at what was initialized when the arena was made; the
    /// state's `initialized` says how far that has grown.
    memory: Vec<u128>,
}

// SAFETY: `base` points into `memory`, which the arena owns; regions are
// handed out disjoint (under the state lock) and written only through the
// one `OutputBuffer` that owns each, before it becomes a shared `Buffer`.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}
impl std::panic::RefUnwindSafe for Arena {}

#[derive(Default)]
struct ArenaState {
    /// End of the last region, from `base`.
    cursor: usize,
    /// Regions handed out and not yet turned into buffers (still written).
    open: usize,
    /// A header was written: no more regions.
    sealed: bool,
    /// Each region handed out, `(start from base, bytes)`, in order.
    regions: Vec<(usize, usize)>,
    /// Bytes from `base` that are initialized (zeros, or what a previous
    /// user of the memory left): every region and gap lies below.
    initialized: usize,
}

/// Live arenas by start address (with their end), so that an encoder can
/// find the arena a batch's buffers lie in: the batches in flight, and the
/// chunks a host still holds (hundreds for a large sorted result).
static LIVE: Mutex<BTreeMap<usize, (usize, Weak<Arena>)>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, (usize, Weak<Arena>)>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

impl ChunkArena {
    /// An arena with `header_bytes_max` bytes reserved in front of a body
    /// of `body_bytes`.
    pub fn new(header_bytes_max: usize, body_bytes: usize) -> Self {
        let body = header_bytes_max.next_multiple_of(REGION_ALIGN);
        let capacity = body + body_bytes.next_multiple_of(REGION_ALIGN);
        let mut memory: Vec<u128> = take_vec_initialized((capacity + REGION_ALIGN) / 16);
        let start = memory.as_mut_ptr() as *mut u8;
        let skip = start.align_offset(REGION_ALIGN);
        // The bytes in front of `base` are never used: initialize them
        // (fewer than 64), so what is initialized is one prefix of the
        // allocation, `skip + initialized` bytes long, when it goes back
        // to the pool.
        let before = memory.len() * 16;
        if before < skip {
            // SAFETY: `skip` < 64 and the allocation has 64 bytes to spare.
            unsafe { std::ptr::write_bytes(start.add(before), 0, skip - before) };
        }
        // SAFETY: `skip` < 64 and the allocation has 64 bytes to spare.
        let base = NonNull::new(unsafe { start.add(skip) }).expect("a Vec's pointer is not null");
        let inner = Arc::new(Arena {
            base,
            body,
            capacity,
            state: Mutex::new(ArenaState {
                cursor: body,
                initialized: before.saturating_sub(skip),
                ..ArenaState::default()
            }),
            memory,
        });
        let at = base.as_ptr() as usize;
        live().insert(at, (at + capacity, Arc::downgrade(&inner)));
        ChunkArena { inner }
    }

    /// The live arena whose memory holds `ptr`, if any.
    pub fn containing(ptr: *const u8) -> Option<ChunkArena> {
        let at = ptr as usize;
        let live = live();
        let (_, (end, arena)) = live.range(..=at).next_back()?;
        (at < *end)
            .then(|| arena.upgrade())
            .flatten()
            .map(|inner| ChunkArena { inner })
    }

    /// A region of `bytes` bytes (64-byte aligned; content unspecified until
    /// written), or `None` if the arena is full or sealed.
    pub fn alloc(&self, bytes: usize) -> Option<OutputBuffer> {
        let mut state = self.inner.lock_state();
        let start = state.cursor.next_multiple_of(REGION_ALIGN);
        let end = start.checked_add(bytes)?;
        if state.sealed || end > self.inner.capacity {
            return None;
        }
        // One write zeroes the gap and, when the region passes the
        // initialized prefix, everything from the prefix's end to the
        // region's (before the first region, the reserve's tail too).
        let from = state.cursor.min(state.initialized);
        let to = if end > state.initialized { end } else { start };
        // SAFETY: `from..to` lies within the allocation, past every region
        // handed out, so nothing else reads or writes it.
        unsafe { std::ptr::write_bytes(self.inner.base.as_ptr().add(from), 0, to - from) };
        state.initialized = state.initialized.max(end);
        state.cursor = end;
        state.open += 1;
        state.regions.push((start, bytes));
        Some(OutputBuffer(Some(Out::Region {
            arena: Arc::clone(&self.inner),
            start,
            bytes,
        })))
    }

    /// Where `bytes` starts in the body, if all of it lies in a region.
    pub fn body_offset(&self, bytes: &[u8]) -> Option<usize> {
        let body = self.inner.base.as_ptr() as usize + self.inner.body;
        let end = self.inner.base.as_ptr() as usize + self.inner.lock_state().cursor;
        let at = bytes.as_ptr() as usize;
        (at >= body && at + bytes.len() <= end).then(|| at - body)
    }

    /// Whether `bytes` is exactly one region of this arena (not part of
    /// one: a slice of an array written there is not).
    pub fn is_region(&self, bytes: &[u8]) -> bool {
        let Some(at) = (bytes.as_ptr() as usize).checked_sub(self.inner.base.as_ptr() as usize)
        else {
            return false;
        };
        let state = self.inner.lock_state();
        state.regions.binary_search(&(at, bytes.len())).is_ok()
    }

    /// Bytes of the body so far: every region, padded to 8 bytes.
    pub fn body_len(&self) -> usize {
        self.inner.lock_state().cursor.next_multiple_of(8) - self.inner.body
    }

    /// Writes `header` just in front of the body and returns
    /// `[header | body]`; `None` if the body is no longer `body_len` bytes
    /// (what the header was written for: [`ChunkArena::body_len`]), the
    /// header does not fit the reserve, the arena was sealed before, or a
    /// region is still being written. No region is handed out after.
    pub fn seal(&self, header: &[u8], body_len: usize) -> Option<Buffer> {
        let mut state = self.inner.lock_state();
        let end = state.cursor.next_multiple_of(8);
        if state.sealed
            || state.open > 0
            || header.len() > self.inner.body
            || end - self.inner.body != body_len
        {
            return None;
        }
        state.sealed = true;
        let start = self.inner.body - header.len();
        // SAFETY: the header's bytes lie in the reserve and the padding
        // past the cursor in the allocation (the capacity is a multiple
        // of 64); no region covers either.
        unsafe {
            let base = self.inner.base.as_ptr();
            std::ptr::write_bytes(base.add(state.cursor), 0, end - state.cursor);
            std::ptr::copy_nonoverlapping(header.as_ptr(), base.add(start), header.len());
        }
        Some(self.inner.buffer(start, end - start))
    }
}

impl Arena {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, ArenaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` bytes from `start` (from `base`) as a buffer that keeps the
    /// arena alive.
    fn buffer(self: &Arc<Self>, start: usize, len: usize) -> Buffer {
        // SAFETY: `start + len` lies within the allocation, below what
        // regions and the sealed header initialized; the owner keeps it.
        unsafe {
            let ptr = NonNull::new_unchecked(self.base.as_ptr().add(start));
            Buffer::from_custom_allocation(ptr, len, Arc::clone(self) as _)
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let at = self.base.as_ptr() as usize;
        live().remove(&at);
        let skip = at - self.memory.as_ptr() as usize;
        let initialized = skip + self.lock_state().initialized;
        let mut memory = std::mem::take(&mut self.memory);
        // SAFETY: the first `initialized` bytes of the allocation are
        // initialized (see `new` and `alloc`; never fewer than its length
        // then, nor more than it holds), and any bits are a u128.
        unsafe { memory.set_len(initialized / 16) };
        recycle(memory);
    }
}

/// A buffer being written by one owner: a region of a [`ChunkArena`], or
/// pooled memory when there is no arena or it has no room.
pub struct OutputBuffer(Option<Out>);

enum Out {
    Pooled {
        memory: Vec<u128>,
        bytes: usize,
    },
    Region {
        arena: Arc<Arena>,
        start: usize,
        bytes: usize,
    },
}

impl OutputBuffer {
    /// `bytes` bytes of pooled memory, 16-byte aligned.
    pub fn pooled(bytes: usize) -> Self {
        OutputBuffer(Some(Out::Pooled {
            memory: take_vec_filled(bytes.div_ceil(16)),
            bytes,
        }))
    }

    /// `bytes` bytes from `arena` if it has room, else pooled.
    pub fn in_arena_or_pooled(arena: Option<&ChunkArena>, bytes: usize) -> Self {
        arena
            .and_then(|a| a.alloc(bytes))
            .unwrap_or_else(|| Self::pooled(bytes))
    }

    /// Whether the buffer is a region of an arena.
    pub fn in_arena(&self) -> bool {
        matches!(self.0, Some(Out::Region { .. }))
    }

    /// The buffer's bytes, to write (content unspecified until written).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self.0.as_mut().expect("not yet a buffer") {
            Out::Pooled { memory, bytes } => &mut as_bytes_mut(memory)[..*bytes],
            // SAFETY: the region lies in the arena's initialized memory, and
            // this buffer is its only user until `into_buffer`.
            Out::Region {
                arena,
                start,
                bytes,
            } => unsafe { std::slice::from_raw_parts_mut(arena.base.as_ptr().add(*start), *bytes) },
        }
    }

    /// The buffer's bytes as 16-byte values (views); the length must be a
    /// multiple of 16.
    pub fn u128s_mut(&mut self) -> &mut [u128] {
        let bytes = self.bytes_mut();
        assert!(
            bytes.len().is_multiple_of(16),
            "{} bytes are not whole u128s",
            bytes.len()
        );
        assert!(
            bytes.as_ptr().cast::<u128>().is_aligned(),
            "16-byte aligned"
        );
        // SAFETY: aligned (asserted), the length covers whole values, and
        // any bits are a valid u128.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / 16) }
    }

    /// The written bytes as an Arrow buffer (shared from now on).
    pub fn into_buffer(mut self) -> Buffer {
        match self.0.take().expect("not yet a buffer") {
            Out::Pooled { memory, bytes } => pooled_buffer(memory).slice_with_length(0, bytes),
            Out::Region {
                arena,
                start,
                bytes,
            } => {
                let buffer = arena.buffer(start, bytes);
                arena.lock_state().open -= 1;
                buffer
            }
        }
    }
}

impl Drop for OutputBuffer {
    /// A region dropped unwritten is closed (it stays in the body, unused).
    fn drop(&mut self) {
        if let Some(Out::Region { arena, .. }) = &self.0 {
            arena.lock_state().open -= 1;
        }
    }
}

/// The bytes of `v`, for writing into an arena's 16-byte-aligned memory.
fn as_bytes_mut(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: any bytes are a valid u8, u8 has alignment 1, and the length
    // covers exactly the same memory.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(arena: &ChunkArena, bytes: usize, byte: u8) -> Option<Buffer> {
        let mut out = arena.alloc(bytes)?;
        out.bytes_mut().fill(byte);
        Some(out.into_buffer())
    }

    /// Regions are aligned, the gaps between them zeroed, and the sealed
    /// chunk is the header followed by exactly the body.
    #[test]
    fn a_sealed_chunk_is_the_header_then_the_regions_and_zeroed_gaps() {
        let arena = ChunkArena::new(100, 300);
        let a = filled(&arena, 10, 0xAA).unwrap();
        let b = filled(&arena, 3, 0xBB).unwrap();
        assert_eq!(arena.body_offset(&a), Some(0));
        assert_eq!(arena.body_offset(&b), Some(64));
        assert!(arena.is_region(&a) && arena.is_region(&b));
        assert!(!arena.is_region(&a[..9]) && !arena.is_region(&a[1..]));
        assert_eq!(arena.body_len(), 72);
        assert!(
            arena.seal(&[9; 24], 64).is_none(),
            "header for another body"
        );
        let chunk = arena.seal(&[9; 24], 72).unwrap();
        let mut want = vec![9u8; 24];
        want.extend([0xAA; 10]);
        want.extend([0; 54]);
        want.extend([0xBB; 3]);
        want.extend([0; 5]);
        assert_eq!(chunk.as_slice(), &want[..]);
        assert!(arena.alloc(1).is_none(), "no region after sealing");
        assert!(arena.seal(&[9; 8], 72).is_none(), "sealed once");
    }

    /// Over pooled memory a previous user left partly written (with
    /// ones), a sealed chunk is still exactly the header, the regions and
    /// zeroed gaps; what the arena initialized returns to the pool as
    /// initialized.
    #[test]
    fn reuses_pooled_memory_initializing_only_what_it_hands_out() {
        crate::mem::set_scratch_pool_bytes_max(64 << 20);
        let body_bytes = (3 << 20) + 4096; // a size no other test asks for
        let words = (64 + body_bytes + REGION_ALIGN) / 16;
        let mut stale: Vec<u128> = crate::mem::take_vec(words);
        stale.resize(words / 4, u128::MAX);
        let stale_at = stale.as_ptr() as usize;
        recycle(stale);
        let arena = ChunkArena::new(64, body_bytes);
        // Another test may have taken the parked memory first.
        let reused = arena.inner.memory.as_ptr() as usize == stale_at;
        let a = filled(&arena, 10, 0xAA).unwrap();
        let b = filled(&arena, 1 << 20, 0xBB).unwrap(); // past the ones
        let end = arena.inner.lock_state().initialized;
        assert!(end >= 64 + 64 + (1 << 20), "initialized to {end}");
        let body_len = arena.body_len();
        let chunk = arena.seal(&[9; 24], body_len).unwrap();
        let mut want = vec![9u8; 24];
        want.extend([0xAA; 10]);
        want.extend([0; 54]);
        want.extend(vec![0xBB; 1 << 20]);
        assert_eq!(chunk.as_slice(), &want[..]);
        drop((a, b, chunk, arena));
        let again: Vec<u128> = crate::mem::take_vec_initialized(words);
        if reused && again.as_ptr() as usize == stale_at {
            assert!(
                again.len() * 16 >= end,
                "{} of {end} bytes",
                again.len() * 16
            );
        }
        recycle(again);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let arena = ChunkArena::new(16, 128);
        assert!(filled(&arena, 100, 1).is_some());
        assert!(arena.alloc(65).is_none(), "past the capacity");
        let body_len = arena.body_len();
        assert!(
            arena.seal(&[0; 72], body_len).is_none(),
            "header past the reserve"
        );
        let fallback = OutputBuffer::in_arena_or_pooled(Some(&arena), 65);
        assert!(!fallback.in_arena());
        let outside = [0u8; 8];
        assert_eq!(arena.body_offset(&outside), None);
    }

    #[test]
    fn no_seal_while_a_region_is_written() {
        let arena = ChunkArena::new(64, 64);
        let open = arena.alloc(8).unwrap();
        assert!(arena.seal(&[0; 8], 8).is_none());
        drop(open.into_buffer());
        assert!(arena.seal(&[0; 8], 8).is_some());
    }

    #[test]
    fn a_dropped_arena_is_no_longer_found() {
        let arena = ChunkArena::new(64, 64);
        let buffer = filled(&arena, 8, 1).unwrap();
        let at = buffer.as_ptr();
        let weak = Arc::downgrade(&arena.inner);
        drop(arena);
        let found = ChunkArena::containing(at).expect("kept alive by its buffer");
        assert!(Arc::ptr_eq(&found.inner, &weak.upgrade().unwrap()));
        drop((found, buffer));
        assert!(weak.upgrade().is_none());
        // Another test's arena may reuse the memory, but not this one.
        assert!(ChunkArena::containing(at)
            .is_none_or(|a| !Weak::ptr_eq(&Arc::downgrade(&a.inner), &weak)));
    }
}
