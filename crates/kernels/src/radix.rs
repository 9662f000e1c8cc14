//! The radix core: a stable most-significant-digit radix sort of
//! (key, row index) pairs held in two parallel vectors.
//!
//! ```text
//!   level 0 (top byte)   histogram -> offsets -> scatter src -> scratch
//!                          (split over threads; buckets shared out after)
//!   level 1 ..           the same inside each bucket, ping-ponging between
//!                          the two buffers, skipping bytes all keys share
//!   small buckets        insertion sort of the block in cache (the role of
//!                          a hardware pre-sorter on short runs)
//! ```
//!
//! Keys are unsigned integers whose numeric order is the wanted order; the
//! callers in [`crate::argsort`] produce them with order-preserving bit
//! transforms. Before sorting, keys are rebased on their minimum and
//! narrowed to the smallest width that holds `max - min`, so a key with a
//! small range costs fewer passes and less memory traffic.

use std::sync::Mutex;

use crate::mem::{recycle, take_vec, take_vec_filled, Pod};

/// Buckets at most this long are finished by insertion sort.
const SMALL_BLOCK_ROWS: usize = 48;
/// Buckets at most this long take one last counting pass on as many bits
/// as they have rows' worth (at most `DIVERT_BITS_MAX`), leaving runs of
/// about one key, then one insertion sort over the nearly sorted bucket.
const DIVERT_ROWS_MAX: usize = 1 << 13;
const DIVERT_BITS_MAX: u32 = 11;
/// A diverting pass gives up (and takes a byte-wide pass) if one of its
/// digits holds more keys than this: the insertion sort would not be short.
const DIVERT_RUN_MAX: usize = 24;
/// Inputs shorter than this are sorted by comparison: radix does not pay.
pub const RADIX_ROWS_MIN: usize = 256;
/// Inputs shorter than this are not split over threads.
const PARALLEL_ROWS_MIN: usize = 1 << 17;

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

/// Sorts `keys` ascending, permuting `idx` alongside. Stable: equal keys
/// keep their input order. Rebases and narrows the keys first.
pub fn sort_pairs<K: RadixKey, I: SortIndex>(keys: Vec<K>, idx: &mut [I], threads: usize) {
    if keys.len() < 2 {
        return sort_pairs_in_range(keys, idx, threads, K::default(), K::default());
    }
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
    assert_eq!(keys.len(), idx.len(), "one index per key");
    if keys.len() < 2 {
        return;
    }
    debug_assert!(
        keys.iter().all(|k| (min..=max).contains(k)),
        "keys within the given range"
    );
    let range = max.wrapping_sub(min);
    match range.significant_bytes() {
        0 => {} // all keys equal: input order is the stable order
        n if n == K::BYTES => sort_narrowed(keys, idx, n, threads), // rebasing gains nothing
        n if n * 2 > K::BYTES || K::BYTES == 4 => {
            // Narrowing would not halve the width: rebase in place.
            let mut keys = keys;
            if min != K::default() {
                keys.iter_mut().for_each(|k| *k = k.wrapping_sub(min));
            }
            sort_narrowed(keys, idx, n, threads);
        }
        1..=4 => {
            let mut narrow: Vec<u32> = take_vec(keys.len());
            narrow.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128() as u32));
            recycle(keys);
            sort_narrowed(narrow, idx, range.significant_bytes(), threads);
        }
        5..=8 => {
            let mut narrow: Vec<u64> = take_vec(keys.len());
            narrow.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128() as u64));
            recycle(keys);
            sort_narrowed(narrow, idx, range.significant_bytes(), threads);
        }
        n => {
            let mut rebased: Vec<u128> = take_vec(keys.len());
            rebased.extend(keys.iter().map(|&k| k.wrapping_sub(min).to_u128()));
            recycle(keys);
            sort_narrowed(rebased, idx, n, threads);
        }
    }
}

fn min_max<K: RadixKey>(keys: &[K], threads: usize) -> (K, K) {
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

/// Sorts keys that use only their low `bytes` bytes.
fn sort_narrowed<K: RadixKey, I: SortIndex>(
    mut keys: Vec<K>,
    idx: &mut [I],
    bytes: usize,
    threads: usize,
) {
    let first_level = K::BYTES - bytes;
    if keys.len() < RADIX_ROWS_MIN {
        comparison_sort(&mut keys, idx);
        return;
    }
    // Written before read: pooled memory needs no clearing.
    let mut scratch_keys: Vec<K> = take_vec_filled(keys.len());
    let mut scratch_idx: Vec<I> = take_vec_filled(idx.len());
    if threads > 1 && keys.len() >= PARALLEL_ROWS_MIN {
        parallel_top_level(
            &mut keys,
            idx,
            &mut scratch_keys,
            &mut scratch_idx,
            first_level,
            threads,
        );
    } else {
        msd(
            Buffers {
                keys: &mut keys,
                idx,
                scratch_keys: &mut scratch_keys,
                scratch_idx: &mut scratch_idx,
            },
            first_level,
            true,
        );
    }
    debug_assert!(keys.windows(2).all(|w| w[0] <= w[1]), "keys sorted");
    recycle(keys);
    recycle(scratch_keys);
    recycle(scratch_idx);
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

impl<'a, K: RadixKey, I: SortIndex> Buffers<'a, K, I> {
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
fn msd<K: RadixKey, I: SortIndex>(mut buf: Buffers<K, I>, level: usize, result_in_data: bool) {
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
    let mut counts = [0usize; 256];
    for &k in buf.keys.iter() {
        counts[k.byte(level)] += 1;
    }
    if counts.contains(&n) {
        return msd(buf, level + 1, result_in_data); // byte shared by all
    }
    let mut offsets = [0usize; 256];
    let mut sum = 0;
    for b in 0..256 {
        offsets[b] = sum;
        sum += counts[b];
    }
    let (out_keys, out_idx) = (&mut *buf.scratch_keys, &mut *buf.scratch_idx);
    assert!(out_keys.len() == n && out_idx.len() == n && buf.idx.len() == n);
    for (&k, &i) in buf.keys.iter().zip(buf.idx.iter()) {
        let slot = &mut offsets[k.byte(level)];
        // SAFETY: the offsets are the prefix sums of the byte counts, so
        // every slot is below n, the length asserted above.
        unsafe {
            *out_keys.get_unchecked_mut(*slot) = k;
            *out_idx.get_unchecked_mut(*slot) = i;
        }
        *slot += 1;
    }
    for bucket in buf.split_swapped(&counts) {
        msd(bucket, level + 1, !result_in_data);
    }
}

/// One counting pass on the next `log2(n)` bits from byte `level`, then an
/// insertion sort of the whole, nearly sorted, bucket. Returns false (and
/// changes nothing) if the digits are too skewed for that to be short.
fn diverting_pass<K: RadixKey, I: SortIndex>(
    buf: &mut Buffers<K, I>,
    level: usize,
    result_in_data: bool,
) -> bool {
    let n = buf.len();
    let bits_left = ((K::BYTES - level) * 8) as u32;
    let bits = n
        .next_power_of_two()
        .trailing_zeros()
        .min(DIVERT_BITS_MAX)
        .min(bits_left);
    let shift = bits_left - bits;
    let digit = |k: K| k.low_bits_after(shift) & ((1usize << bits) - 1);
    let mut counts = [0u16; 1 << DIVERT_BITS_MAX];
    let counts = &mut counts[..1 << bits];
    for &k in buf.keys.iter() {
        counts[digit(k)] += 1;
    }
    // Prefix sums and the longest run in one pass over the counts.
    let (mut sum, mut run_max) = (0u16, 0u16);
    for c in counts.iter_mut() {
        let here = *c;
        run_max = run_max.max(here);
        *c = sum;
        sum += here;
    }
    if run_max as usize > DIVERT_RUN_MAX {
        return false;
    }
    // Scatter to scratch, then finish there, or on the way back to data
    // (one pass instead of a sort and a copy).
    let (out_keys, out_idx) = (&mut *buf.scratch_keys, &mut *buf.scratch_idx);
    assert!(out_keys.len() == n && out_idx.len() == n && buf.idx.len() == n);
    for (&k, &i) in buf.keys.iter().zip(buf.idx.iter()) {
        let slot = &mut counts[digit(k)];
        // SAFETY: the slots are the prefix sums of the digit counts, so
        // every one is below n, the length asserted above.
        unsafe {
            *out_keys.get_unchecked_mut(*slot as usize) = k;
            *out_idx.get_unchecked_mut(*slot as usize) = i;
        }
        *slot += 1;
    }
    if result_in_data {
        insertion_sort_into(out_keys, out_idx, buf.keys, buf.idx);
    } else {
        insertion_sort(out_keys, out_idx);
    }
    true
}

/// Stable insertion sort of a small block from `keys`/`idx` into
/// `out_keys`/`out_idx`.
fn insertion_sort_into<K: RadixKey, I: SortIndex>(
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
fn insertion_sort<K: RadixKey, I: SortIndex>(keys: &mut [K], idx: &mut [I]) {
    for i in 1..keys.len() {
        let (k, r) = (keys[i], idx[i]);
        insert_sorted(keys, idx, i, k, r);
    }
}

/// Puts `(k, r)` into the sorted first `len` pairs (slot `len` is free),
/// after every key not greater: stable.
#[inline(always)]
fn insert_sorted<K: RadixKey, I: SortIndex>(keys: &mut [K], idx: &mut [I], len: usize, k: K, r: I) {
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

/// The top level split over `threads`: per-thread histograms, a stable
/// parallel scatter, then buckets shared out to threads as they free up.
fn parallel_top_level<K: RadixKey, I: SortIndex>(
    keys: &mut [K],
    idx: &mut [I],
    scratch_keys: &mut [K],
    scratch_idx: &mut [I],
    level: usize,
    threads: usize,
) {
    let n = keys.len();
    let chunk = n.div_ceil(threads);
    let histograms: Vec<[usize; 256]> = std::thread::scope(|s| {
        let handles: Vec<_> = keys
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut c = [0usize; 256];
                    for &k in part {
                        c[k.byte(level)] += 1;
                    }
                    c
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut counts = [0usize; 256];
    for h in &histograms {
        for b in 0..256 {
            counts[b] += h[b];
        }
    }
    // Thread t's slots for bucket b follow those of threads < t: stable.
    let mut starts = vec![[0usize; 256]; histograms.len()];
    let mut sum = 0;
    for b in 0..256 {
        for (t, h) in histograms.iter().enumerate() {
            starts[t][b] = sum;
            sum += h[b];
        }
    }
    let target = ScatterTarget {
        keys: scratch_keys.as_mut_ptr(),
        idx: scratch_idx.as_mut_ptr(),
    };
    std::thread::scope(|s| {
        for ((part_k, part_i), mut offsets) in keys.chunks(chunk).zip(idx.chunks(chunk)).zip(starts)
        {
            let target = &target;
            s.spawn(move || {
                for (&k, &i) in part_k.iter().zip(part_i) {
                    let slot = &mut offsets[k.byte(level)];
                    // SAFETY: slots [starts[t][b], starts[t][b] + h[b]) belong
                    // to this thread alone and lie inside the n-long scratch.
                    unsafe {
                        *target.keys.add(*slot) = k;
                        *target.idx.add(*slot) = i;
                    }
                    *slot += 1;
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
    let queue = Mutex::new(buckets.into_iter());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let next = queue.lock().unwrap().next();
                match next {
                    Some(bucket) => msd(bucket, level + 1, false),
                    None => break,
                }
            });
        }
    });
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
