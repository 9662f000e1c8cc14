//! Wide keys sorted as packed words. Below the top-level digit, each key
//! travels as one `u64` that holds the key's next 32 bits above its row
//! number, so the later passes move 8 bytes a key instead of 12 (a `u64`
//! key and a `u32` row) and carry no row array at all.
//!
//! ```text
//!   key (5 to 8 significant bytes)   | top byte | slice: 32 bits | rest |
//!                                         |            |
//!                        top-level bucket +            v
//!   word (u64)                                  | slice          | row  |
//! ```
//!
//! Words sort by (slice, row), so keys equal in their top 40 bits come out
//! in row order. When keys are wider than 40 bits (`rest` not empty), each
//! run of equal slices is then settled by a stable sort on the full keys,
//! looked up by row. A sample of the keys decides whether such runs are
//! rare enough for that to pay; if they are not, the caller sorts
//! (key, row) pairs instead. (Many equal slices would cost even 40-bit
//! keys, which need no settling: the passes would go on through the rows'
//! bytes, where the pairs path stops at the key's last byte.)
//!
//! At 100M random u64 keys and 2 threads (`sortbench --rows 100000000
//! --reps 5 --threads 2 --only-insitu-argsort`, 12 runs each, alternated
//! with the pairs path) this was faster in 9 of 12 pairs; the median of
//! the runs' medians was 1.58 s against 1.64 s. The fastest of 8 sorts
//! (`argsort_once 100000000 2 8`, 5 runs each, alternated) had a median
//! of 1.52 s against 1.61 s.

use super::*;

/// Keys sampled to judge whether the slices of keys wider than 40 bits
/// tie rarely. A sample of `s` keys out of `n` shows a given tied pair
/// with odds `(s / n)^2`, so no tie in it makes more than about
/// `(n / s)^2` tied pairs unlikely: 2.3M at 100M keys, each settled by
/// two look-ups of full keys.
const TIE_SAMPLE_ROWS: usize = 1 << 16;
/// Top-level buckets at most this share of the keys (as 1/n). A bucket
/// larger than a thread's local area is sorted with a spare area of its
/// own size; bounding buckets to 1/16 of the keys keeps the path's
/// memory (20 bytes a key: keys, words and rows, plus that spare per
/// thread) below the 24 bytes a key of the pairs path.
const BUCKET_SHARE_MAX: usize = 16;

/// Whether the keys (using their low `bytes` bytes, key `i` being row
/// `i`'s; `top` counts their top byte) are sorted as packed words.
pub(super) fn applies<K: RadixKey>(keys: &[K], bytes: usize, top: &ChunkCounts) -> bool {
    (5..=8).contains(&bytes)
        && bytes <= K::BYTES
        && keys.len() <= u32::MAX as usize + 1
        && (0..256).all(|b| {
            let size: usize = top.counts.iter().map(|h| h[b]).sum();
            size <= (keys.len() / BUCKET_SHARE_MAX).max(LOCAL_BYTES_MAX / 8)
        })
        && slices_rarely_tie(keys, bytes)
}

/// Bits of a key with `bytes` significant bytes below its slice.
fn rest_bits(bytes: usize) -> u32 {
    (bytes as u32 - 5) * 8
}

/// Whether no two of a sample of `keys` share their top 40 significant
/// bits. The sample takes positions `i * step mod n` for a step coprime
/// to `n` (so no position twice) near `n` times the golden ratio (so
/// neighbours are sampled about as often as in a random sample).
fn slices_rarely_tie<K: RadixKey>(keys: &[K], bytes: usize) -> bool {
    let n = keys.len();
    let mut step = (n as f64 * 0.618_034) as usize | 1;
    while gcd(step, n) != 1 {
        step += 2;
    }
    let mut prefixes: Vec<usize> = (0..TIE_SAMPLE_ROWS.min(n))
        .map(|i| keys[(i as u128 * step as u128 % n as u128) as usize])
        .map(|k| k.low_bits_after(rest_bits(bytes)))
        .collect();
    prefixes.sort_unstable();
    prefixes.windows(2).all(|w| w[0] != w[1])
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}

/// The word of key `k` (with `rest` bits below its slice) of row `row`.
#[inline(always)]
fn word<K: RadixKey>(k: K, row: usize, rest: u32) -> u64 {
    ((k.low_bits_after(rest) as u32 as u64) << 32) | row as u64
}

/// Writes to `idx` the stable sort order of `keys`, which use their low
/// `bytes` bytes ([`applies`] said yes), on `threads` threads; `top`
/// counts the keys' top byte in chunks of `keys.len().div_ceil(threads)`.
pub(super) fn sort_order<K: RadixKey, I: SortIndex>(
    keys: &[K],
    bytes: usize,
    idx: &mut [I],
    threads: usize,
    top: &ChunkCounts,
) {
    let n = keys.len();
    let level = K::BYTES - bytes;
    assert!((5..=8).contains(&bytes) && n <= u32::MAX as usize + 1);
    assert!(idx.len() == n && top.level == level);
    if n < 2 {
        return idx.iter_mut().for_each(|r| *r = I::from_usize(0));
    }
    let (counts, starts) = bucket_starts(keys, top);
    let rest = rest_bits(bytes);
    let mut words: Vec<u64> = take_vec_filled(n);
    let target = ScatterTarget {
        keys: words.as_mut_ptr(),
        idx: std::ptr::NonNull::<NoRow>::dangling().as_ptr(),
    };
    std::thread::scope(|s| {
        for (t, (part, offsets)) in keys.chunks(top.chunk).zip(starts).enumerate() {
            let target = &target;
            s.spawn(move || {
                let rows = t * top.chunk..;
                // SAFETY: as in `top_level`: slots [starts[t][b],
                // starts[t][b] + h[b]) are this thread's alone and lie
                // inside the n-long `words` (each histogram counts its
                // chunk's keys). `NoRow` writes touch no memory.
                unsafe {
                    scatter_raw(part, rows, level, offsets, target, |k, r| {
                        (word(k, r, rest), NoRow)
                    })
                }
            });
        }
    });
    let full = (rest > 0).then_some(keys);
    finish_buckets(&mut words, idx, &counts, full, threads);
    recycle(words);
}

/// Sorts each top-level bucket of `words` (bucket `b` holding `counts[b]`
/// words) on `threads` threads and writes its rows in order to the same
/// stretch of `idx`.
fn finish_buckets<K: RadixKey, I: SortIndex>(
    words: &mut [u64],
    idx: &mut [I],
    counts: &[usize; 256],
    full: Option<&[K]>,
    threads: usize,
) {
    let mut buckets = Vec::with_capacity(256);
    let (mut words, mut idx) = (words, idx);
    for &size in counts.iter().filter(|&&size| size > 0) {
        let (w, rest_w) = words.split_at_mut(size);
        let (i, rest_i) = idx.split_at_mut(size);
        buckets.push((w, i));
        (words, idx) = (rest_w, rest_i);
    }
    let local_rows = counts.iter().copied().max().unwrap_or(0);
    let local_rows = local_rows.min(LOCAL_BYTES_MAX / std::mem::size_of::<u64>());
    let queue = Mutex::new(buckets.into_iter());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut local = Local::<u64, NoRow>::take(local_rows);
                loop {
                    let next = queue.lock().unwrap().next();
                    match next {
                        Some((words, out)) => finish_bucket(words, out, full, &mut local),
                        None => break,
                    }
                }
                local.recycle();
            });
        }
    });
}

/// Sorts one top-level bucket's words and writes their rows in order to
/// `out`; `words` is overwritten.
fn finish_bucket<K: RadixKey, I: SortIndex>(
    words: &mut [u64],
    out: &mut [I],
    full: Option<&[K]>,
    local: &mut Local<u64, NoRow>,
) {
    let n = words.len();
    // Zero-sized: these vectors allocate nothing.
    let mut no_rows = vec![NoRow; n];
    if n <= DIVERT_ROWS_MAX || n > local.keys.len() {
        let mut pooled: Vec<u64> = vec![];
        let spare = match n <= local.keys.len() {
            true => &mut local.keys[..n],
            false => {
                pooled = take_vec_filled(n);
                &mut pooled[..]
            }
        };
        let buffers = Buffers {
            keys: &mut *words,
            idx: &mut no_rows,
            scratch_keys: spare,
            scratch_idx: &mut vec![NoRow; n],
        };
        msd(buffers, 0, true);
        recycle(pooled);
        return emit(words, out, full);
    }
    // Words are distinct (their rows are), so some byte splits them.
    let split = first_split(words, 0).expect("distinct words differ in some byte");
    let mut out = out;
    sort_second_level(
        (words, &mut no_rows),
        (split.0, &split.1),
        local,
        |sorted, _| {
            let (o, rest_o) = std::mem::take(&mut out).split_at_mut(sorted.len());
            emit(sorted, o, full);
            out = rest_o;
        },
    );
}

/// Writes the rows of sorted `words` to `out`, then, if the keys have bits
/// below their slices (`full`, the keys by row), puts each run of rows
/// with equal slices in full-key order.
fn emit<K: RadixKey, I: SortIndex>(words: &[u64], out: &mut [I], full: Option<&[K]>) {
    debug_assert!(words.windows(2).all(|w| w[0] < w[1]), "words sorted");
    for (o, &w) in out.iter_mut().zip(words) {
        *o = I::from_usize(w as u32 as usize);
    }
    let Some(full) = full.filter(|_| words.len() > 1) else {
        return;
    };
    // Most blocks hold no tie: find that out in one branch-free pass.
    let tied = words.iter().zip(&words[1..]);
    if tied
        .map(|(a, b)| ((a ^ b) >> 32 == 0) as usize)
        .sum::<usize>()
        == 0
    {
        return;
    }
    let mut start = 0;
    for i in 1..=words.len() {
        if i == words.len() || words[i] >> 32 != words[start] >> 32 {
            if i - start > 1 {
                // Stable: rows of equal keys stay in row order.
                out[start..i].sort_by_key(|r| full[r.as_usize()]);
            }
            start = i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Positions sorted by (key, position): the stable order.
    fn stable_order<K: RadixKey>(keys: &[K]) -> Vec<u32> {
        let mut pairs: Vec<(K, u32)> = keys.iter().copied().zip(0..).collect();
        pairs.sort();
        pairs.into_iter().map(|p| p.1).collect()
    }

    fn packed_order(keys: &[u64], bytes: usize, threads: usize) -> Vec<u32> {
        let chunk = keys.len().div_ceil(threads).max(1);
        let top = ChunkCounts::of(keys, chunk, 8 - bytes);
        let mut idx = vec![u32::MAX; keys.len()];
        sort_order(keys, bytes, &mut idx, threads, &top);
        idx
    }

    /// Keys using exactly `bytes` bytes, whose top byte takes `tops`
    /// values (and 0xff), drawn by `low` below the top byte.
    fn keys_of(
        (n, bytes, tops): (usize, usize, u64),
        rng: &mut rand::rngs::StdRng,
        low: impl Fn(&mut rand::rngs::StdRng) -> u64,
    ) -> Vec<u64> {
        let below_top = (bytes as u32 - 1) * 8;
        let mut keys: Vec<u64> = (0..n)
            .map(|_| rng.random_range(0..tops) << below_top | (low(rng) & ((1 << below_top) - 1)))
            .collect();
        if let Some(k) = keys.first_mut() {
            *k |= 0xff << below_top; // the top byte is significant
        }
        keys
    }

    /// Every way a bucket is finished (sorted whole when small, by a
    /// second-level scatter when large) and every way ties fall: none,
    /// slices equal with different rests, and keys equal in full.
    #[test]
    fn packed_order_matches_stable_comparison_sort() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let sizes = [0, 1, 2, 7, 49, 50, 51, 1000, 100_000, 300_001];
        for (n, bytes, tops) in sizes.into_iter().flat_map(|n| {
            [5, 6, 8]
                .into_iter()
                .flat_map(move |bytes| [(n, bytes, 256), (n, bytes, 4)])
        }) {
            let shape = (n, bytes, tops);
            let cases: Vec<(&str, Vec<u64>)> = vec![
                ("uniform", keys_of(shape, &mut rng, |r| r.random())),
                (
                    "slices tie, rests differ",
                    keys_of(shape, &mut rng, |r| {
                        r.random_range(0..64u64) << 32 | r.random::<u32>() as u64
                    }),
                ),
                (
                    "few distinct keys",
                    keys_of(shape, &mut rng, |r| {
                        r.random_range(0..3u64) * 0x0101_0101_0101
                    }),
                ),
                (
                    "equal below the top byte",
                    keys_of(shape, &mut rng, |_| 777),
                ),
            ];
            for (name, keys) in cases {
                let want = stable_order(&keys);
                for threads in [1, 2, 3] {
                    let got = packed_order(&keys, bytes, threads);
                    assert!(got == want, "{name}, {shape:?}, threads {threads}");
                }
            }
        }
    }

    /// Buckets larger than a thread's local area sort in a spare area of
    /// their own.
    #[test]
    fn buckets_larger_than_the_local_area_sort_too() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        let n = 5 * LOCAL_BYTES_MAX / 8 / 2;
        for low in [|r: &mut rand::rngs::StdRng| r.random(), |_: &mut _| 5] {
            let keys = keys_of((n, 7, 2), &mut rng, low);
            assert_eq!(packed_order(&keys, 7, 2), stable_order(&keys));
        }
    }

    #[test]
    fn applies_to_wide_keys_whose_slices_rarely_tie() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        let n = 1 << 18;
        let applies = |keys: &[u64], bytes| {
            let top = ChunkCounts::of(keys, keys.len().div_ceil(2), 8 - bytes);
            super::applies(keys, bytes, &top)
        };
        let uniform = keys_of((n, 8, 256), &mut rng, |r| r.random());
        assert!(applies(&uniform, 8));
        assert!(!applies(&uniform, 4), "4 bytes sort as u32 pairs");
        let big = 3 * LOCAL_BYTES_MAX / 8;
        let skewed = keys_of((big, 8, 2), &mut rng, |r| r.random());
        assert!(!applies(&skewed, 8), "one bucket holds half the keys");
        let spread = keys_of((big, 8, 32), &mut rng, |r| r.random());
        assert!(applies(&spread, 8));
        let pairs: Vec<u64> = uniform[..n / 2].iter().flat_map(|&k| [k, k]).collect();
        assert!(!applies(&pairs, 8), "every key twice: ties everywhere");
        let five = keys_of((n, 5, 256), &mut rng, |r| r.random());
        assert!(applies(&five, 5));
        let few = keys_of((n, 5, 256), &mut rng, |r| r.random_range(0..4u64));
        assert!(!applies(&few, 5), "few values: passes on rows' bytes");
        let clustered = keys_of((n, 6, 256), &mut rng, |r| r.random_range(0..1024u64) << 8);
        assert!(!applies(&clustered, 6), "slices take few values");
    }
}
