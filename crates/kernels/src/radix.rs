//! The radix core: a stable most-significant-digit radix sort of
//! (key, row index) pairs held in two parallel vectors.
//!
//! ```text
//!   level 0 (top byte)   histogram -> offsets -> scatter src -> scratch
//!                          (split over threads; buckets shared out after;
//!                          row numbers generated here, not read)
//!   level 1              each bucket scattered into a per-thread area that
//!                          stays in cache from bucket to bucket
//!   level 2 ..           a diverting pass on log2(rows) + 1 bits into a
//!                          small block in L1, then an insertion sort there
//!                          (the role of a hardware pre-sorter on short
//!                          runs); only the row indices go out
//! ```
//!
//! An order of wide keys (5 to 8 bytes of range, rows numbered) packs each
//! key's next 32 bits and its row into one word at the top level, and the
//! levels below move those words alone (`packed`).
//!
//! Keys are unsigned integers whose numeric order is the wanted order; the
//! callers in [`crate::argsort`] produce them with order-preserving bit
//! transforms. Before sorting, keys are rebased on their minimum and
//! narrowed to the smallest width that holds `max - min`, so a key with a
//! small range costs fewer passes and less memory traffic. Skewed buckets
//! (one digit holding many keys) fall back to byte-wide passes in place.

use std::ops::Range;
use std::sync::Mutex;

use crate::mem::{recycle, take_vec, take_vec_filled, Pod};

mod packed;

/// Buckets at most this long are finished by insertion sort.
const SMALL_BLOCK_ROWS: usize = 48;
/// Buckets at most this long take one last counting pass on as many bits
/// as they have rows' worth plus `DIVERT_EXTRA_BITS` (at most
/// `DIVERT_BITS_MAX`), leaving runs of about half a key, then one
/// insertion sort over the nearly sorted bucket. Fewer keys per digit mean
/// fewer mispredicted insertion branches, for a longer count table: at 100M
/// random u64 keys (`sortbench`, 2 threads) the bucket phase took a median
/// 0.52 s with this, 0.63 s with `log2(rows)` rounded down.
const DIVERT_ROWS_MAX: usize = 1 << 13;
const DIVERT_BITS_MAX: u32 = 12;
const DIVERT_EXTRA_BITS: u32 = 1;
/// A diverting pass gives up (and takes a byte-wide pass) if one of its
/// digits holds more keys than this: the insertion sort would not be short.
const DIVERT_RUN_MAX: usize = 24;
/// Inputs shorter than this are sorted by comparison: radix does not pay.
pub const RADIX_ROWS_MIN: usize = 256;
/// Inputs shorter than this are not split over threads.
const PARALLEL_ROWS_MIN: usize = 1 << 17;
/// Each thread finishing top-level buckets keeps a working area of at most
/// this many bytes; larger buckets are finished in their own memory.
const LOCAL_BYTES_MAX: usize = 8 << 20;

/// An unsigned key whose numeric order is the sort order.
pub trait RadixKey: Pod + Ord + Send + Sync + Default + std::fmt::Debug + 'static {
    const BYTES: usize;
    /// Byte `level` counted from the most significant (level 0).
    fn byte(self, level: usize) -> usize;
    fn wrapping_sub(self, other: Self) -> Self;
    /// Bytes needed to hold `self` (0 for zero).
    fn significant_bytes(self) -> usize;
    fn to_u128(self) -> u128;
    /// `self >> shift` truncated to usize.
    fn low_bits_after(self, shift: u32) -> usize;
}

macro_rules! radix_key {
    ($t:ty) => {
        impl RadixKey for $t {
            const BYTES: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn byte(self, level: usize) -> usize {
                ((self >> ((Self::BYTES - 1 - level) * 8)) & 0xff) as usize
            }
            #[inline(always)]
            fn wrapping_sub(self, other: Self) -> Self {
                <$t>::wrapping_sub(self, other)
            }
            fn significant_bytes(self) -> usize {
                (Self::BYTES * 8 - self.leading_zeros() as usize).div_ceil(8)
            }
            fn to_u128(self) -> u128 {
                self as u128
            }
            #[inline(always)]
            fn low_bits_after(self, shift: u32) -> usize {
                (self >> shift) as usize
            }
        }
    };
}
radix_key!(u32);
radix_key!(u64);
radix_key!(u128);

/// A row index: `u32` for up to 2^32 rows, `u64` beyond.
pub trait SortIndex: Pod + Ord + Send + Sync + Default + std::fmt::Debug + 'static {
    const MAX_ROWS: usize;
    fn from_usize(i: usize) -> Self;
    fn as_usize(self) -> usize;
}

impl SortIndex for u32 {
    const MAX_ROWS: usize = u32::MAX as usize + 1;
    #[inline(always)]
    fn from_usize(i: usize) -> Self {
        i as u32
    }
    #[inline(always)]
    fn as_usize(self) -> usize {
        self as usize
    }
}

impl SortIndex for u64 {
    const MAX_ROWS: usize = usize::MAX;
    #[inline(always)]
    fn from_usize(i: usize) -> Self {
        i as u64
    }
    #[inline(always)]
    fn as_usize(self) -> usize {
        self as usize
    }
}

/// What rides along with each key through the sort's passes, copied and
/// never looked at: a row index, or [`NoRow`] when the key carries its row.
pub(crate) trait Carried: Pod + Default + std::fmt::Debug {}
impl<T: Pod + Default + std::fmt::Debug> Carried for T {}

/// Nothing: what a key that carries its own row index takes along (the
/// passes then move keys alone; copies of it compile to nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NoRow;
// SAFETY: a zero-sized type has one value and no bits to be invalid.
unsafe impl Pod for NoRow {}

/// Sorts `keys` ascending, permuting `idx` alongside. Stable: equal keys
/// keep their input order. Rebases and narrows the keys first.
pub fn sort_pairs<K: RadixKey, I: SortIndex>(keys: Vec<K>, idx: &mut [I], threads: usize) {
    let (min, max) = min_max(&keys, threads);
    sort_pairs_in_range(keys, idx, threads, min, max)
}

/// [`sort_pairs`] of keys known to lie in `min..=max` (a caller that
/// produced the keys has seen them all; this saves a pass over them).
pub fn sort_pairs_in_range<K: RadixKey, I: SortIndex>(
    keys: Vec<K>,
    idx: &mut [I],
    threads: usize,
    min: K,
    max: K,
) {
    let rows = Rows {
        idx,
        numbered: false,
    };
    sort_in_range(keys, rows, threads, (min, max), None, false);
}

/// [`sort_pairs`], also returning where equal keys lie in the sorted
/// order: the ranges of positions (each at least 2 long, ascending) whose
/// keys are all equal. A caller that sorts on a key prefix finishes just
/// those ranges on the rest of the key.
///
/// ```
/// use insitu_kernels::radix::sort_pairs_with_ties;
/// let mut idx: Vec<u32> = (0..5).collect();
/// let ties = sort_pairs_with_ties(vec![7u64, 3, 7, 1, 3], &mut idx, 1);
/// assert_eq!(idx, [3, 1, 4, 0, 2]);
/// assert_eq!(ties, [1..3, 3..5]);
/// ```
pub fn sort_pairs_with_ties<K: RadixKey, I: SortIndex>(
    keys: Vec<K>,
    idx: &mut [I],
    threads: usize,
) -> Vec<Range<usize>> {
    let (min, max) = min_max(&keys, threads);
    let rows = Rows {
        idx,
        numbered: false,
    };
    sort_in_range(keys, rows, threads, (min, max), None, true)
}

/// The ranges of positions of sorted `keys` that hold equal keys, each at
/// least 2 long.
fn tie_ranges<K: RadixKey>(keys: &[K]) -> Vec<Range<usize>> {
    debug_assert!(keys.windows(2).all(|w| w[0] <= w[1]), "keys sorted");
    let mut ties = vec![];
    let mut start = 0;
    for i in 1..=keys.len() {
        if i == keys.len() || keys[i] != keys[start] {
            if i - start > 1 {
                ties.push(start..i);
            }
            start = i;
        }
    }
    ties
}

/// The row indices a sort permutes: `idx` as given, or, when `numbered`,
/// row `i`'s index is `i` and `idx` holds nothing yet (the sort writes
/// the numbers as it goes instead of reading them).
struct Rows<'a, I> {
    idx: &'a mut [I],
    numbered: bool,
}

impl<I: SortIndex> Rows<'_, I> {
    /// `idx` with the row numbers written in, if they are not yet.
    fn materialized(self) -> Self {
        if self.numbered {
            for (i, r) in self.idx.iter_mut().enumerate() {
                *r = I::from_usize(i);
            }
        }
        Rows {
            idx: self.idx,
            numbered: false,
        }
    }
}

/// Sorts `keys` (within `min..=max`) with their rows; `top`, counts of the
/// keys' top byte, is used when the keys are sorted unchanged (not rebased
/// or narrowed) and it was taken in the chunks the sort's threads take.
/// With `want_ties`, returns the ranges of equal keys ([`tie_ranges`]),
/// else nothing.
fn sort_in_range<K: RadixKey, I: SortIndex>(
    keys: Vec<K>,
    rows: Rows<I>,
    threads: usize,
    (min, max): (K, K),
    top: Option<ChunkCounts>,
    want_ties: bool,
) -> Vec<Range<usize>> {
    assert_eq!(keys.len(), rows.idx.len(), "one index per key");
    if keys.len() < 2 {
        rows.materialized();
        return vec![];
    }
    debug_assert!(
        keys.iter().all(|k| (min..=max).contains(k)),
        "keys within the given range"
    );
    let range = max.wrapping_sub(min);
    match range.significant_bytes() {
        0 => {
            // All keys equal: input order is the stable order.
            let n = rows.materialized().idx.len();
            match want_ties {
                true => vec![Range { start: 0, end: n }],
                false => vec![],
            }
        }
        n if n == K::BYTES => sort_narrowed(keys, rows, n, (threads, top), want_ties), // rebasing gains nothing
        n if n * 2 > K::BYTES || K::BYTES == 4 => {
            // Narrowing would not halve the width: rebase in place.
            let mut keys = keys;
            if min != K::default() {
                keys.iter_mut().for_each(|k| *k = k.wrapping_sub(min));
            }
            sort_narrowed(keys, rows, n, (threads, None), want_ties)
        }
        n @ 1..=4 => {
            let mut narrow: Vec<u32> = take_vec(keys.len());
            narrow.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128() as u32));
            recycle(keys);
            sort_narrowed(narrow, rows, n, (threads, None), want_ties)
        }
        n @ 5..=8 => {
            let mut narrow: Vec<u64> = take_vec(keys.len());
            narrow.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128() as u64));
            recycle(keys);
            sort_narrowed(narrow, rows, n, (threads, None), want_ties)
        }
        n => {
            let mut rebased: Vec<u128> = take_vec(keys.len());
            rebased.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128()));
            recycle(keys);
            sort_narrowed(rebased, rows, n, (threads, None), want_ties)
        }
    }
}

/// The smallest and largest of `keys`; zeros if there are none.
fn min_max<K: RadixKey>(keys: &[K], threads: usize) -> (K, K) {
    if keys.is_empty() {
        return (K::default(), K::default());
    }
    let fold = |part: &[K]| {
        part.iter()
            .fold((part[0], part[0]), |(lo, hi), &k| (lo.min(k), hi.max(k)))
    };
    if threads < 2 || keys.len() < PARALLEL_ROWS_MIN {
        return fold(keys);
    }
    let parts: Vec<(K, K)> = std::thread::scope(|s| {
        let handles: Vec<_> = keys
            .chunks(keys.len().div_ceil(threads))
            .map(|part| s.spawn(move || fold(part)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    parts
        .into_iter()
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
        .unwrap()
}

/// Sorts keys that use only their low `bytes` bytes; `top` and the
/// ranges returned `want_ties` as in [`sort_in_range`]. The sorted keys
/// end in `keys` whenever ties are wanted.
fn sort_narrowed<K: RadixKey, I: SortIndex>(
    mut keys: Vec<K>,
    rows: Rows<I>,
    bytes: usize,
    (threads, top): (usize, Option<ChunkCounts>),
    want_ties: bool,
) -> Vec<Range<usize>> {
    let first_level = K::BYTES - bytes;
    let n = keys.len();
    if n < RADIX_ROWS_MIN {
        comparison_sort(&mut keys, rows.materialized().idx);
    } else if n < PARALLEL_ROWS_MIN {
        let idx = rows.materialized().idx;
        // Written before read: pooled memory needs no clearing.
        let mut scratch_keys: Vec<K> = take_vec_filled(n);
        let mut scratch_idx: Vec<I> = take_vec_filled(n);
        let buffers = Buffers {
            keys: &mut keys,
            idx,
            scratch_keys: &mut scratch_keys,
            scratch_idx: &mut scratch_idx,
        };
        msd(buffers, first_level, true);
        debug_assert!(keys.windows(2).all(|w| w[0] <= w[1]), "keys sorted");
        recycle(scratch_keys);
        recycle(scratch_idx);
    } else {
        let threads = threads.max(1);
        let chunk = n.div_ceil(threads);
        let top = match top {
            Some(top) if top.chunk == chunk && top.level == first_level => top,
            _ => ChunkCounts::of(&keys, chunk, first_level),
        };
        if rows.numbered && !want_ties && packed::applies(&keys, bytes, &top) {
            packed::sort_order(&keys, bytes, rows.idx, threads, &top);
            recycle(keys);
            return vec![];
        }
        let mut scratch_keys: Vec<K> = take_vec_filled(n);
        let mut scratch_idx: Vec<I> = take_vec_filled(n);
        let buffers = TopLevel {
            keys: &mut keys,
            idx: rows.idx,
            idx_is_row_number: rows.numbered,
            scratch_keys: &mut scratch_keys,
            scratch_idx: &mut scratch_idx,
            keys_wanted: want_ties,
        };
        // Leaves the keys unsorted unless ties are wanted: else only the
        // order is.
        top_level(buffers, &top, threads);
        recycle(scratch_keys);
        recycle(scratch_idx);
    }
    let ties = match want_ties {
        true => tie_ranges(&keys),
        false => vec![],
    };
    recycle(keys);
    ties
}

/// Stable sort of a short input by (key, input position).
fn comparison_sort<K: RadixKey, I: SortIndex>(keys: &mut [K], idx: &mut [I]) {
    let mut pairs: Vec<(K, I)> = keys.iter().copied().zip(idx.iter().copied()).collect();
    pairs.sort_by_key(|p| p.0);
    for (i, (k, r)) in pairs.into_iter().enumerate() {
        keys[i] = k;
        idx[i] = r;
    }
}

/// The data being sorted and an equally long scratch area.
struct Buffers<'a, K, I> {
    keys: &'a mut [K],
    idx: &'a mut [I],
    scratch_keys: &'a mut [K],
    scratch_idx: &'a mut [I],
}

impl<'a, K: RadixKey, I: Carried> Buffers<'a, K, I> {
    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Splits into one `Buffers` per bucket, bucket `b` holding `sizes[b]`
    /// rows, with data and scratch swapped (the scatter wrote to scratch).
    fn split_swapped(self, sizes: &[usize; 256]) -> Vec<Buffers<'a, K, I>> {
        let (mut k, mut i) = (self.scratch_keys, self.scratch_idx);
        let (mut sk, mut si) = (self.keys, self.idx);
        let mut out = Vec::with_capacity(256);
        for &size in sizes.iter() {
            if size == 0 {
                continue;
            }
            let (k0, k1) = k.split_at_mut(size);
            let (i0, i1) = i.split_at_mut(size);
            let (sk0, sk1) = sk.split_at_mut(size);
            let (si0, si1) = si.split_at_mut(size);
            out.push(Buffers {
                keys: k0,
                idx: i0,
                scratch_keys: sk0,
                scratch_idx: si0,
            });
            (k, i, sk, si) = (k1, i1, sk1, si1);
        }
        out
    }

    fn copy_to_scratch(&mut self) {
        self.scratch_keys.copy_from_slice(self.keys);
        self.scratch_idx.copy_from_slice(self.idx);
    }
}

/// Sorts `buf` by bytes `level..`; the result ends in `buf.keys/idx` when
/// `result_in_data`, else in the scratch half.
fn msd<K: RadixKey, I: Carried>(mut buf: Buffers<K, I>, level: usize, result_in_data: bool) {
    let n = buf.len();
    if n <= SMALL_BLOCK_ROWS || level == K::BYTES {
        if level < K::BYTES {
            insertion_sort(buf.keys, buf.idx);
        }
        if !result_in_data {
            buf.copy_to_scratch();
        }
        return;
    }
    if n <= DIVERT_ROWS_MAX && diverting_pass(&mut buf, level, result_in_data) {
        return;
    }
    let counts = byte_counts(buf.keys, level);
    if counts.contains(&n) {
        return msd(buf, level + 1, result_in_data); // byte shared by all
    }
    scatter(
        buf.keys,
        buf.idx,
        level,
        &counts,
        buf.scratch_keys,
        buf.scratch_idx,
    );
    for bucket in buf.split_swapped(&counts) {
        msd(bucket, level + 1, !result_in_data);
    }
}

/// One counting pass on the next `log2(n)` bits from byte `level`, then an
/// insertion sort of the whole, nearly sorted, bucket. Returns false (and
/// changes nothing) if the digits are too skewed for that to be short.
fn diverting_pass<K: RadixKey, I: Carried>(
    buf: &mut Buffers<K, I>,
    level: usize,
    result_in_data: bool,
) -> bool {
    let (out_keys, out_idx) = (&mut *buf.scratch_keys, &mut *buf.scratch_idx);
    if !divert(buf.keys, buf.idx, level, out_keys, out_idx) {
        return false;
    }
    // Finish in scratch, or on the way back to data (one pass instead of a
    // sort and a copy).
    if result_in_data {
        insertion_sort_into(out_keys, out_idx, buf.keys, buf.idx);
    } else {
        insertion_sort(out_keys, out_idx);
    }
    true
}

/// Scatters `keys`/`idx` to `out_keys`/`out_idx` by the next `log2(n)`
/// bits from byte `level` (at most `DIVERT_BITS_MAX`), leaving runs of
/// about one key for an insertion sort to finish. Returns false, writing
/// nothing, if a digit holds more than `DIVERT_RUN_MAX` keys.
fn divert<K: RadixKey, I: Carried>(
    keys: &[K],
    idx: &[I],
    level: usize,
    out_keys: &mut [K],
    out_idx: &mut [I],
) -> bool {
    let n = keys.len();
    assert!(n <= DIVERT_ROWS_MAX, "a diverted bucket fits u16 counts");
    assert!(out_keys.len() == n && out_idx.len() == n && idx.len() == n);
    let bits_left = ((K::BYTES - level) * 8) as u32;
    let bits = (n.next_power_of_two().trailing_zeros() + DIVERT_EXTRA_BITS)
        .min(DIVERT_BITS_MAX)
        .min(bits_left);
    let shift = bits_left - bits;
    let digit = |k: K| k.low_bits_after(shift) & ((1usize << bits) - 1);
    let mut counts = [0u16; 1 << DIVERT_BITS_MAX];
    let counts = &mut counts[..1 << bits];
    for &k in keys.iter() {
        counts[digit(k)] += 1;
    }
    // The longest run in a pass of its own, which the compiler vectorizes,
    // then the prefix sums alone. One pass doing both kept a branchy max in
    // the sums' chain: at 100M random u64 keys (`sortbench`, 2 threads,
    // `perf record`) the finishing levels' samples fell from 0.85 to 0.80
    // of the (unchanged) scatters' when split.
    let run_max = counts.iter().fold(0u16, |m, &c| m.max(c));
    if run_max as usize > DIVERT_RUN_MAX {
        return false;
    }
    let mut sum = 0u16;
    for c in counts.iter_mut() {
        let here = *c;
        *c = sum;
        sum += here;
    }
    for (&k, &i) in keys.iter().zip(idx.iter()) {
        let slot = &mut counts[digit(k)];
        // SAFETY: the slots are the prefix sums of the digit counts, so
        // every one is below n, the length asserted above.
        unsafe {
            *out_keys.get_unchecked_mut(*slot as usize) = k;
            *out_idx.get_unchecked_mut(*slot as usize) = i;
        }
        *slot += 1;
    }
    true
}

/// Stable insertion sort of a small block from `keys`/`idx` into
/// `out_keys`/`out_idx`.
fn insertion_sort_into<K: RadixKey, I: Carried>(
    keys: &[K],
    idx: &[I],
    out_keys: &mut [K],
    out_idx: &mut [I],
) {
    for (n, (&k, &r)) in keys.iter().zip(idx).enumerate() {
        insert_sorted(out_keys, out_idx, n, k, r);
    }
}

/// Stable insertion sort of a small block.
fn insertion_sort<K: RadixKey, I: Carried>(keys: &mut [K], idx: &mut [I]) {
    for i in 1..keys.len() {
        let (k, r) = (keys[i], idx[i]);
        insert_sorted(keys, idx, i, k, r);
    }
}

/// Puts `(k, r)` into the sorted first `len` pairs (slot `len` is free),
/// after every key not greater: stable.
#[inline(always)]
fn insert_sorted<K: RadixKey, I: Carried>(keys: &mut [K], idx: &mut [I], len: usize, k: K, r: I) {
    let mut j = len;
    while j > 0 && keys[j - 1] > k {
        keys[j] = keys[j - 1];
        idx[j] = idx[j - 1];
        j -= 1;
    }
    keys[j] = k;
    idx[j] = r;
}

/// Raw output pointers shared by scatter threads; each thread writes only
/// the slots its own offsets reserve, so writes never overlap.
struct ScatterTarget<K, I> {
    keys: *mut K,
    idx: *mut I,
}
unsafe impl<K: Send, I: Send> Sync for ScatterTarget<K, I> {}

/// Slots per staged group: a bucket's keys and rows wait in a small stage
/// until they fill a group of this many slots aligned on the group size
/// (a whole cache line of u64 keys), then go out together.
const STAGE_ROWS: usize = 8;
/// How many groups past the one just written a bucket's output is
/// prefetched for writing. At 100M random u64 keys (`sortbench`, 2
/// threads) the top-level scatter took 580 ms writing row by row, 409 ms
/// staged in aligned groups, 357 ms prefetching 1 group ahead, 216 ms 2
/// ahead, and about as long 3 or 4 ahead. Streaming (non-temporal) stores
/// of the groups took 640-1066 ms.
const PREFETCH_GROUPS_AHEAD: usize = 2;

/// Writes `written(k, r)` for each key `k` of `keys` and the next row `r`
/// of `rows` (the pair itself, or a word that packs both) to slot
/// `offsets[b]` (then the next) of `target`, `b` being `k`'s byte `level`.
///
/// The writes go through a stage of `STAGE_ROWS` slots per bucket that
/// stays in L1, so the 256 far-apart output streams are written a cache
/// line at a time, with the lines a bucket writes next prefetched.
///
/// # Safety
/// For every `b`, the slots from `offsets[b]` on, as many as `keys` has
/// keys with byte value `b`, must be valid for writes and written by no one
/// else meanwhile.
unsafe fn scatter_raw<K: RadixKey, R, T: Carried, I: Carried>(
    keys: &[K],
    rows: impl Iterator<Item = R>,
    level: usize,
    offsets: [usize; 256],
    target: &ScatterTarget<T, I>,
    written: impl Fn(K, R) -> (T, I),
) {
    const LAST: usize = STAGE_ROWS - 1;
    let mut stage_keys = vec![T::default(); 256 * STAGE_ROWS];
    let mut stage_rows = vec![I::default(); 256 * STAGE_ROWS];
    let first = offsets;
    let mut next = offsets;
    // Copies the staged slots `lo..=hi` of bucket `b` (within one group) out.
    let copy_out = |b: usize, lo: usize, hi: usize, keys: &[T], rows: &[I]| {
        debug_assert!(lo >= first[b] && lo <= hi && lo / STAGE_ROWS == hi / STAGE_ROWS);
        let at = b * STAGE_ROWS + lo % STAGE_ROWS;
        // SAFETY: the caller's contract: `lo..=hi` are slots of bucket `b`
        // (every call passes `lo >= first[b]` and `hi < next[b]`, within
        // one group); `at..` holds them in the stage.
        unsafe {
            let n = hi + 1 - lo;
            if n == STAGE_ROWS {
                // A whole group: a copy of known size, inlined as a few
                // vector moves. Calls to `memmove` (size known only at
                // run time) held 18% of a 100M-key argsort's profile;
                // without them the stores still wait on memory, and the
                // sort (sortbench, 7 processes each, alternated) went
                // from a median 79.1 to 85.4 M keys/s.
                copy_group(keys.as_ptr().add(at), target.keys.add(lo));
                copy_group(rows.as_ptr().add(at), target.idx.add(lo));
            } else {
                copy_few(keys.as_ptr().add(at), target.keys.add(lo), n);
                copy_few(rows.as_ptr().add(at), target.idx.add(lo), n);
            }
        }
    };
    for (&k, i) in keys.iter().zip(rows) {
        let b = k.byte(level);
        let slot = next[b];
        next[b] = slot + 1;
        let at = b * STAGE_ROWS + slot % STAGE_ROWS;
        let (k, i) = written(k, i);
        // SAFETY: b < 256, so `at` is inside the stage.
        unsafe {
            *stage_keys.get_unchecked_mut(at) = k;
            *stage_rows.get_unchecked_mut(at) = i;
        }
        if slot % STAGE_ROWS == LAST {
            copy_out(
                b,
                (slot - LAST).max(first[b]),
                slot,
                &stage_keys,
                &stage_rows,
            );
            // Slot `slot + 1` starts the next group.
            let ahead = slot + 1 + (PREFETCH_GROUPS_AHEAD - 1) * STAGE_ROWS;
            prefetch_for_write(target.keys.wrapping_add(ahead));
            if std::mem::size_of::<I>() > 0 {
                prefetch_for_write(target.idx.wrapping_add(ahead));
            }
        }
    }
    for b in 0..256 {
        let end = next[b];
        let lo = (end - end % STAGE_ROWS).max(first[b]);
        if lo < end {
            copy_out(b, lo, end - 1, &stage_keys, &stage_rows);
        }
    }
}

/// Copies `STAGE_ROWS` values from `src` to `dst`.
///
/// # Safety
/// Both ranges valid for `STAGE_ROWS` values and not overlapping.
#[inline(always)]
unsafe fn copy_group<T: Copy>(src: *const T, dst: *mut T) {
    let group = src.cast::<[T; STAGE_ROWS]>().read_unaligned();
    dst.cast::<[T; STAGE_ROWS]>().write_unaligned(group);
}

/// Copies `n` values from `src` to `dst`: a partial group, at the ends of
/// a bucket. Kept out of line so that the compiler cannot fold the whole
/// groups' fixed-size copy into this one's `memcpy` call: with rows that
/// are not carried it did, and the call cost 7% of a 100M-key sort.
///
/// # Safety
/// Both ranges valid for `n` values and not overlapping.
#[cold]
#[inline(never)]
unsafe fn copy_few<T: Copy>(src: *const T, dst: *mut T, n: usize) {
    std::ptr::copy_nonoverlapping(src, dst, n);
}

/// A hint that the cache line at `p` will soon be written; never faults,
/// whatever `p` is.
#[inline(always)]
fn prefetch_for_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing and cannot fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        _mm_prefetch::<_MM_HINT_ET0>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Counts of each value of a byte of the keys, one histogram per chunk of
/// `chunk` consecutive keys (the last chunk may be shorter).
///
/// The top-level scatter trusts these counts to keep its threads' writes
/// apart (and within bounds), so they never leave this crate.
#[derive(Debug, Clone)]
pub(crate) struct ChunkCounts {
    pub(crate) chunk: usize,
    pub(crate) level: usize,
    pub(crate) counts: Vec<[usize; 256]>,
}

impl ChunkCounts {
    /// Counts byte `level` of `keys` in chunks of `chunk`, a thread each.
    pub(crate) fn of<K: RadixKey>(keys: &[K], chunk: usize, level: usize) -> Self {
        let counts = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .chunks(chunk.max(1))
                .map(|part| s.spawn(move || byte_counts(part, level)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        ChunkCounts {
            chunk,
            level,
            counts,
        }
    }
}

/// The stable sort order of `keys`: the row indices `i` (key `i` being row
/// `i`'s) in ascending key order. `range` (smallest and largest key) and
/// `top` (counts of the top byte) save a pass each when the caller has them.
///
/// Large inputs never materialize the row indices in input order: the
/// top-level scatter writes them as it goes.
///
/// `top`, if given, must count these very keys (its scatter's writes stay
/// in bounds only then); so this is not public.
pub(crate) fn sort_order<K: RadixKey, I: SortIndex>(
    keys: Vec<K>,
    threads: usize,
    range: Option<(K, K)>,
    top: Option<ChunkCounts>,
) -> Vec<I> {
    let n = keys.len();
    assert!(n <= I::MAX_ROWS, "row indices fit the index type");
    let range = range.unwrap_or_else(|| min_max(&keys, threads));
    let mut idx: Vec<I> = take_vec_filled(n);
    let rows = Rows {
        idx: &mut idx,
        numbered: true,
    };
    sort_in_range(keys, rows, threads, range, top, false);
    idx
}

/// The buffers of a top-level sort: data and equally long scratch. With
/// `idx_is_row_number`, `idx` holds nothing yet and row `i`'s index is `i`.
struct TopLevel<'a, K, I> {
    keys: &'a mut [K],
    idx: &'a mut [I],
    idx_is_row_number: bool,
    scratch_keys: &'a mut [K],
    scratch_idx: &'a mut [I],
    /// Whether the sorted keys must end in `keys` too.
    keys_wanted: bool,
}

/// Scatters the keys by the byte `top` counts (chunk `t` by thread `t`),
/// then finishes the buckets on `threads` threads. The order ends in `idx`.
fn top_level<K: RadixKey, I: SortIndex>(
    buffers: TopLevel<K, I>,
    top: &ChunkCounts,
    threads: usize,
) {
    let TopLevel {
        keys,
        idx,
        idx_is_row_number,
        scratch_keys,
        scratch_idx,
        keys_wanted,
    } = buffers;
    let (n, chunk, level) = (keys.len(), top.chunk, top.level);
    assert!(idx.len() == n && scratch_keys.len() == n && scratch_idx.len() == n);
    let (counts, starts) = bucket_starts(keys, top);
    let target = ScatterTarget {
        keys: scratch_keys.as_mut_ptr(),
        idx: scratch_idx.as_mut_ptr(),
    };
    std::thread::scope(|s| {
        let parts = keys.chunks(chunk).zip(idx.chunks(chunk)).zip(starts);
        for (t, ((part_k, part_i), offsets)) in parts.enumerate() {
            let target = &target;
            s.spawn(move || {
                let first_row = t * chunk;
                // SAFETY: slots [starts[t][b], starts[t][b] + h[b]) belong
                // to this thread alone and lie inside the n-long scratch
                // (each chunk's histogram counts that chunk's keys).
                unsafe {
                    if idx_is_row_number {
                        scatter_raw(
                            part_k,
                            (first_row..).map(I::from_usize),
                            level,
                            offsets,
                            target,
                            |k, r| (k, r),
                        )
                    } else {
                        let rows = part_i.iter().copied();
                        scatter_raw(part_k, rows, level, offsets, target, |k, r| (k, r))
                    }
                }
            });
        }
    });
    let buckets = Buffers {
        keys,
        idx,
        scratch_keys,
        scratch_idx,
    }
    .split_swapped(&counts);
    let local_rows = buckets
        .iter()
        .map(Buffers::len)
        .max()
        .unwrap_or(0)
        .min(LOCAL_BYTES_MAX / (K::BYTES + std::mem::size_of::<I>()));
    let queue = Mutex::new(buckets.into_iter());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut local = Local::take(local_rows);
                loop {
                    let next = queue.lock().unwrap().next();
                    match next {
                        Some(bucket) => finish_bucket(bucket, level + 1, &mut local, keys_wanted),
                        None => break,
                    }
                }
                local.recycle();
            });
        }
    });
}

/// The size of each top-level bucket, and where each chunk's thread
/// starts writing each bucket: after the threads of earlier chunks, so
/// the scatter is stable. Asserts that `top` counts these keys' chunks.
fn bucket_starts<K: RadixKey>(keys: &[K], top: &ChunkCounts) -> ([usize; 256], Vec<[usize; 256]>) {
    let (chunk, level) = (top.chunk, top.level);
    assert_eq!(
        top.counts.len(),
        keys.len().div_ceil(chunk),
        "one histogram per chunk"
    );
    assert!(
        keys.chunks(chunk)
            .zip(&top.counts)
            .all(|(part, h)| h.iter().sum::<usize>() == part.len()),
        "each chunk's histogram counts as many keys as the chunk holds"
    );
    debug_assert!(
        keys.chunks(chunk)
            .zip(&top.counts)
            .all(|(part, h)| byte_counts(part, level) == *h),
        "each chunk's histogram counts that chunk"
    );
    let histograms = &top.counts;
    let mut counts = [0usize; 256];
    for h in histograms {
        for b in 0..256 {
            counts[b] += h[b];
        }
    }
    let mut starts = vec![[0usize; 256]; histograms.len()];
    let mut sum = 0;
    for b in 0..256 {
        for (t, h) in histograms.iter().enumerate() {
            starts[t][b] = sum;
            sum += h[b];
        }
    }
    (counts, starts)
}

/// A thread's working space for finishing top-level buckets, reused from
/// bucket to bucket so that it stays in cache: the scatter of a bucket's
/// second level lands in `keys`/`idx` instead of cold memory, and a small
/// block's last scatter and insertion sort happen in `tiny_*`.
struct Local<K, I> {
    keys: Vec<K>,
    idx: Vec<I>,
    tiny_keys: Vec<K>,
    tiny_idx: Vec<I>,
}

impl<K: RadixKey, I: Carried> Local<K, I> {
    fn take(rows: usize) -> Self {
        Local {
            keys: take_vec_filled(rows),
            idx: take_carried(rows),
            tiny_keys: vec![K::default(); DIVERT_ROWS_MAX],
            tiny_idx: vec![I::default(); DIVERT_ROWS_MAX],
        }
    }

    fn recycle(self) {
        recycle(self.keys);
        if std::mem::size_of::<I>() > 0 {
            recycle(self.idx);
        }
    }
}

/// `n` carried values from the pool, or, for [`NoRow`], without it (the
/// pool deals in bytes, and these have none).
fn take_carried<I: Carried>(n: usize) -> Vec<I> {
    match std::mem::size_of::<I>() {
        0 => vec![I::default(); n],
        _ => take_vec_filled(n),
    }
}

/// Sorts a top-level bucket by bytes `level..` and writes its row indices
/// in order to `bucket.scratch_idx`, where [`msd`] with `result_in_data`
/// false would leave them; its sorted keys go to `bucket.scratch_keys`
/// only if `keys_wanted` (mostly only the order is), and the rest of the
/// bucket's memory is overwritten.
fn finish_bucket<K: RadixKey, I: Carried>(
    bucket: Buffers<K, I>,
    level: usize,
    local: &mut Local<K, I>,
    keys_wanted: bool,
) {
    let n = bucket.len();
    if n <= DIVERT_ROWS_MAX || n > local.keys.len() {
        return msd(bucket, level, false);
    }
    let Some((level, counts)) = first_split(bucket.keys, level) else {
        // All keys equal: input order is the stable order.
        if keys_wanted {
            bucket.scratch_keys.copy_from_slice(bucket.keys);
        }
        return bucket.scratch_idx.copy_from_slice(bucket.idx);
    };
    let (mut out, mut out_keys) = (bucket.scratch_idx, bucket.scratch_keys);
    let sorted = (bucket.keys, bucket.idx);
    sort_second_level(
        sorted,
        (level, &counts),
        local,
        |sorted_keys, sorted_idx| {
            let n = sorted_idx.len();
            let (o, rest_o) = std::mem::take(&mut out).split_at_mut(n);
            let (ok, rest_ok) = std::mem::take(&mut out_keys).split_at_mut(n);
            o.copy_from_slice(sorted_idx);
            if keys_wanted {
                ok.copy_from_slice(sorted_keys);
            }
            (out, out_keys) = (rest_o, rest_ok);
        },
    );
}

/// The first byte from `level` on that is not the same in all `keys`, and
/// its counts; `None` if the keys are all equal from `level` on.
fn first_split<K: RadixKey>(keys: &[K], level: usize) -> Option<(usize, [usize; 256])> {
    (level..K::BYTES)
        .map(|level| (level, byte_counts(keys, level)))
        .find(|(_, counts)| !counts.contains(&keys.len()))
}

/// Scatters a top-level bucket (`keys`/`idx`, which then serve as spare
/// room) by byte `level` (`counts` its counts) into `local`'s area, sorts
/// each second-level bucket on the bytes after, and hands each one's
/// sorted keys and rows to `done`, in order.
fn sort_second_level<K: RadixKey, I: Carried>(
    (keys, idx): (&mut [K], &mut [I]),
    (level, counts): (usize, &[usize; 256]),
    local: &mut Local<K, I>,
    mut done: impl FnMut(&[K], &[I]),
) {
    let n = keys.len();
    let (sorted_keys, sorted_idx) = (&mut local.keys[..n], &mut local.idx[..n]);
    scatter(keys, idx, level, counts, sorted_keys, sorted_idx);
    let (mut sorted_keys, mut sorted_idx) = (sorted_keys, sorted_idx);
    let (mut spare_keys, mut spare_idx) = (keys, idx);
    for &size in counts.iter().filter(|&&size| size > 0) {
        let (k, rest_k) = sorted_keys.split_at_mut(size);
        let (i, rest_i) = sorted_idx.split_at_mut(size);
        let (sk, rest_sk) = spare_keys.split_at_mut(size);
        let (si, rest_si) = spare_idx.split_at_mut(size);
        let tiny = (&mut local.tiny_keys[..], &mut local.tiny_idx[..]);
        let (in_order_keys, in_order_idx) = finish_small(k, i, sk, si, level + 1, tiny);
        done(in_order_keys, in_order_idx);
        (sorted_keys, sorted_idx) = (rest_k, rest_i);
        (spare_keys, spare_idx) = (rest_sk, rest_si);
    }
}

/// Sorts a second-level bucket by bytes `level..` and returns its keys and
/// row indices in order: from `tiny` when a diverting pass and an
/// insertion sort finish it there, else from `keys` and `idx`, sorted in
/// place with `spare_*` as scratch.
fn finish_small<'a, K: RadixKey, I: Carried>(
    keys: &'a mut [K],
    idx: &'a mut [I],
    spare_keys: &mut [K],
    spare_idx: &mut [I],
    level: usize,
    tiny: (&'a mut [K], &'a mut [I]),
) -> (&'a [K], &'a [I]) {
    let n = keys.len();
    if n <= SMALL_BLOCK_ROWS || level == K::BYTES {
        if level < K::BYTES {
            insertion_sort(keys, idx);
        }
        return (keys, idx);
    }
    if n <= DIVERT_ROWS_MAX {
        let (tiny_keys, tiny_idx) = (&mut tiny.0[..n], &mut tiny.1[..n]);
        if divert(keys, idx, level, tiny_keys, tiny_idx) {
            insertion_sort(tiny_keys, tiny_idx);
            debug_assert!(tiny_keys.windows(2).all(|w| w[0] <= w[1]), "keys sorted");
            return (tiny_keys, tiny_idx);
        }
    }
    let buffers = Buffers {
        keys,
        idx,
        scratch_keys: spare_keys,
        scratch_idx: spare_idx,
    };
    msd(buffers, level, true);
    (keys, idx)
}

/// How many of `keys` have each value of byte `level`.
fn byte_counts<K: RadixKey>(keys: &[K], level: usize) -> [usize; 256] {
    let mut counts = [0usize; 256];
    for &k in keys {
        counts[k.byte(level)] += 1;
    }
    counts
}

/// Stable scatter of `keys`/`idx` by byte `level` into `out_*`, given the
/// byte's counts.
fn scatter<K: RadixKey, I: Carried>(
    keys: &[K],
    idx: &[I],
    level: usize,
    counts: &[usize; 256],
    out_keys: &mut [K],
    out_idx: &mut [I],
) {
    let n = keys.len();
    assert!(out_keys.len() == n && out_idx.len() == n && idx.len() == n);
    assert_eq!(counts.iter().sum::<usize>(), n, "counts of these keys");
    let mut offsets = [0usize; 256];
    let mut sum = 0;
    for b in 0..256 {
        offsets[b] = sum;
        sum += counts[b];
    }
    let target = ScatterTarget {
        keys: out_keys.as_mut_ptr(),
        idx: out_idx.as_mut_ptr(),
    };
    // SAFETY: the offsets are the prefix sums of the byte counts, which sum
    // to n (asserted above), the length of both outputs.
    let rows = idx.iter().copied();
    unsafe { scatter_raw(keys, rows, level, offsets, &target, |k, r| (k, r)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn check<K: RadixKey>(keys: Vec<K>, threads: usize) {
        let mut idx: Vec<u32> = (0..keys.len() as u32).collect();
        let mut expected: Vec<(K, u32)> = keys.iter().copied().zip(idx.clone()).collect();
        expected.sort(); // (key, position): the stable order
        sort_pairs(keys, &mut idx, threads);
        let got: Vec<u32> = idx.clone();
        let want: Vec<u32> = expected.iter().map(|p| p.1).collect();
        assert_eq!(got, want);
    }

    /// The stable order of `keys`: positions sorted by (key, position).
    fn stable_order<K: RadixKey>(keys: &[K]) -> Vec<u32> {
        let mut pairs: Vec<(K, u32)> = keys.iter().copied().zip(0..).collect();
        pairs.sort();
        pairs.into_iter().map(|p| p.1).collect()
    }

    /// Keys spanning all 8 bytes whose top byte takes 4 values, so each
    /// top-level bucket is far larger than a diverting pass takes, with the
    /// lower 7 bytes drawn by `low`.
    fn four_buckets(
        n: usize,
        rng: &mut rand::rngs::StdRng,
        low: impl Fn(&mut rand::rngs::StdRng) -> u64,
    ) -> Vec<u64> {
        (0..n)
            .map(|_| (rng.random_range(0..4u64) * 85) << 56 | (low(rng) & ((1 << 56) - 1)))
            .collect()
    }

    /// Every way a top-level bucket is finished: a second-level scatter then
    /// diverting passes, second-level buckets too large to divert, digits
    /// too skewed to divert, and keys equal below the top byte.
    #[test]
    fn sort_order_matches_stable_comparison_sort() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let n = 300_001;
        let cases: Vec<(&str, Vec<u64>)> = vec![
            ("uniform", (0..n).map(|_| rng.random::<u64>()).collect()),
            ("diverted", four_buckets(n, &mut rng, |r| r.random())),
            (
                "second level too large to divert",
                four_buckets(n, &mut rng, |r| {
                    r.random_range(0..3u64) << 48 | r.random_range(0..1u64 << 40)
                }),
            ),
            (
                "digits too skewed to divert",
                four_buckets(n, &mut rng, |r| {
                    r.random_range(0..256u64) << 48 | r.random_range(0..4u64)
                }),
            ),
            (
                "equal below the top byte",
                four_buckets(n, &mut rng, |_| 12345),
            ),
            (
                "few values below the top byte",
                four_buckets(n, &mut rng, |r| r.random_range(0..5u64)),
            ),
        ];
        for (name, keys) in cases {
            let want = stable_order(&keys);
            for threads in [1, 2, 3] {
                let chunk = n.div_ceil(threads);
                let counted = Some(ChunkCounts::of(&keys, chunk, 0));
                let elsewhere = Some(ChunkCounts::of(&keys, chunk + 1, 0));
                for top in [None, counted, elsewhere] {
                    let got: Vec<u32> = sort_order(keys.clone(), threads, None, top);
                    assert!(got == want, "{name}, threads {threads}");
                }
            }
        }
    }

    /// The ranges of equal keys in `keys` once sorted, by a naive scan.
    fn naive_ties<K: RadixKey>(keys: &[K]) -> Vec<Range<usize>> {
        let mut sorted = keys.to_vec();
        sorted.sort();
        let mut ties = vec![];
        let mut i = 0;
        while i < sorted.len() {
            let j = (i..sorted.len())
                .find(|&j| sorted[j] != sorted[i])
                .unwrap_or(sorted.len());
            if j - i >= 2 {
                ties.push(i..j);
            }
            i = j;
        }
        ties
    }

    fn check_with_ties<K: RadixKey>(keys: Vec<K>, threads: usize, what: &str) {
        let mut idx: Vec<u32> = (0..keys.len() as u32).collect();
        let (want_order, want_ties) = (stable_order(&keys), naive_ties(&keys));
        let ties = sort_pairs_with_ties(keys, &mut idx, threads);
        assert!(idx == want_order, "{what}: order, threads {threads}");
        assert!(ties == want_ties, "{what}: ties, threads {threads}");
    }

    /// Every path (comparison sort, serial and parallel radix, each
    /// top-level bucket's way of finishing, narrowed and rebased keys, all
    /// equal) hands back the equal-key ranges of the sorted order.
    #[test]
    fn sort_pairs_with_ties_matches_a_naive_scan() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        for n in [0, 1, 2, 7, 49, 50, 51, 1000, 100_000, 300_001] {
            let values = (n / 3).max(1) as u64;
            let dups: Vec<u64> = (0..n).map(|_| rng.random_range(0..values) << 40).collect();
            let few: Vec<u64> = (0..n).map(|_| rng.random_range(0..5u64)).collect();
            let wide: Vec<u128> = (0..n)
                .map(|_| (rng.random_range(0..values) as u128) << 80 | 7)
                .collect();
            let unique: Vec<u64> = (0..n).map(|_| rng.random::<u64>()).collect();
            let diverted = four_buckets(n, &mut rng, |r| r.random_range(0..1u64 << 20));
            let equal = vec![42u32; n];
            for threads in [1, 2] {
                check_with_ties(dups.clone(), threads, "duplicates");
                check_with_ties(few.clone(), threads, "few values");
                check_with_ties(wide.clone(), threads, "u128 with duplicates");
                check_with_ties(unique.clone(), threads, "mostly unique");
                check_with_ties(diverted.clone(), threads, "diverted buckets");
                check_with_ties(equal.clone(), threads, "all equal");
            }
        }
    }

    #[test]
    fn sort_order_of_narrow_and_short_inputs_matches_stable_comparison_sort() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for n in [0, 1, 2, 7, 49, 50, 51, 1000, 200_000] {
            let narrow: Vec<u64> = (0..n).map(|_| rng.random_range(1000..1100u64)).collect();
            let wide: Vec<u128> = (0..n).map(|_| rng.random::<u128>()).collect();
            let small: Vec<u32> = (0..n).map(|_| rng.random::<u32>()).collect();
            for threads in [1, 2] {
                assert_eq!(
                    sort_order::<_, u32>(narrow.clone(), threads, None, None),
                    stable_order(&narrow)
                );
                assert_eq!(
                    sort_order::<_, u32>(wide.clone(), threads, None, None),
                    stable_order(&wide)
                );
                assert_eq!(
                    sort_order::<_, u32>(small.clone(), threads, None, None),
                    stable_order(&small)
                );
            }
        }
    }

    /// The staged scatter writes exactly the slots each bucket owns, in
    /// input order, whatever the buckets' sizes and alignment: slots owned
    /// by no one (a gap of 3 before every bucket) keep their sentinel.
    #[test]
    fn staged_scatter_writes_each_bucket_in_order_and_nothing_else() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        const GAP: usize = 3;
        for n in [0, 1, 2, 7, 49, 50, 51, 1000, 100_000] {
            let buckets_used = rng.random_range(1..=256usize);
            let keys: Vec<u64> = (0..n)
                .map(|_| {
                    (rng.random_range(0..buckets_used) as u64) << 56 | rng.random::<u32>() as u64
                })
                .collect();
            let counts = byte_counts(&keys, 0);
            let mut offsets = [0usize; 256];
            let mut end = 0;
            for b in 0..256 {
                offsets[b] = end + GAP;
                end += GAP + counts[b];
            }
            let mut out_keys = vec![u64::MAX; end + GAP];
            let mut out_rows = vec![u32::MAX; end + GAP];
            let target = ScatterTarget {
                keys: out_keys.as_mut_ptr(),
                idx: out_rows.as_mut_ptr(),
            };
            // SAFETY: bucket b's slots offsets[b].. (counts[b] of them) lie
            // inside the outputs and no one else writes them.
            unsafe { scatter_raw(&keys, 0..n as u32, 0, offsets, &target, |k, r| (k, r)) };
            let mut want_keys = vec![u64::MAX; end + GAP];
            let mut want_rows = vec![u32::MAX; end + GAP];
            let mut next = offsets;
            for (i, &k) in keys.iter().enumerate() {
                let b = k.byte(0);
                want_keys[next[b]] = k;
                want_rows[next[b]] = i as u32;
                next[b] += 1;
            }
            assert!(out_keys == want_keys, "keys, n = {n}");
            assert!(out_rows == want_rows, "rows, n = {n}");
        }
    }

    #[test]
    fn matches_stable_comparison_sort() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0, 1, 2, 7, 49, 50, 51, 255, 256, 1000, 100_000, 300_000] {
            for threads in [1, 2, 3] {
                check(
                    (0..n).map(|_| rng.random::<u64>()).collect::<Vec<_>>(),
                    threads,
                );
                check(
                    (0..n)
                        .map(|_| rng.random_range(0..5u32))
                        .collect::<Vec<_>>(),
                    threads,
                );
                check(
                    (0..n)
                        .map(|_| rng.random::<u128>() >> rng.random_range(0..128))
                        .collect::<Vec<_>>(),
                    threads,
                );
                check(
                    (0..n)
                        .map(|_| u64::MAX - rng.random_range(0..100_000u64))
                        .collect::<Vec<_>>(),
                    threads,
                );
            }
        }
    }
}
