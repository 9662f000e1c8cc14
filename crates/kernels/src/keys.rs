//! Order-preserving keys of plain arrays: each value's bits transformed
//! into an unsigned integer that sorts as the value does (see
//! [`crate::argsort`] for the table), split from the null rows, and the
//! radix sorts over them. Dictionaries and strings get their keys from
//! ranks in [`crate::argsort`]; this module knows neither, so
//! [`crate::dictionary`] can sort its values here without a circle.

use arrow::array::{Array, AsArray};
use arrow::buffer::NullBuffer;
use arrow::compute::SortOptions;
use arrow::datatypes::{ArrowNativeType, DataType};
use arrow::error::ArrowError;

use crate::mem::take_vec;
use crate::radix::{sort_order, sort_pairs, sort_pairs_in_range, ChunkCounts, RadixKey, SortIndex};
use crate::Parallelism;

/// The row order of a plain array: its keys radix-sorted, or a stable
/// comparison sort for types without keys. Stable either way.
pub(crate) fn argsort_plain<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
    threads: Parallelism,
) -> Result<Vec<I>, ArrowError> {
    check_index_fits::<I>(values.len())?;
    let out = match normalize_plain(values, options, threads.0)? {
        Some(keys) => keys.sort(threads.0),
        None => comparison_argsort(values, options)?,
    };
    debug_assert_eq!(out.len(), values.len());
    Ok(out)
}

/// An error unless `rows` rows can be numbered by `I`.
pub(crate) fn check_index_fits<I: SortIndex>(rows: usize) -> Result<(), ArrowError> {
    if rows > I::MAX_ROWS {
        return Err(ArrowError::InvalidArgumentError(format!(
            "argsort of {rows} rows does not fit the index type (at most {} rows)",
            I::MAX_ROWS
        )));
    }
    Ok(())
}

/// Keys as unsigned integers for the non-null rows, plus the null rows.
pub(crate) enum NormalizedKeys<I> {
    U32(Split<u32, I>),
    U64(Split<u64, I>),
    U128(Split<u128, I>),
}

/// Non-null keys with their row indices, and null rows in input order.
pub(crate) struct Split<K, I> {
    pub keys: Vec<K>,
    /// The row of each key; `None` when key `i` is row `i`'s (no nulls).
    pub rows: Option<Vec<I>>,
    pub nulls: Vec<I>,
    pub nulls_first: bool,
    /// The smallest and largest key, if known (saves the sort a pass).
    pub range: Option<(K, K)>,
    /// Counts of the keys' top byte, if known (saves the sort a pass).
    pub top_counts: Option<ChunkCounts>,
}

/// Row indices `0..n`.
fn row_numbers<I: SortIndex>(n: usize) -> Vec<I> {
    let mut rows = take_vec(n);
    rows.extend((0..n).map(I::from_usize));
    rows
}

impl<K: RadixKey, I: SortIndex> Split<K, I> {
    fn sort(self, threads: usize) -> Vec<I> {
        let Split {
            keys,
            rows,
            nulls,
            nulls_first,
            range,
            top_counts,
        } = self;
        let sorted_rows = match rows {
            Some(mut rows) => {
                match range {
                    Some((min, max)) => sort_pairs_in_range(keys, &mut rows, threads, min, max),
                    None => sort_pairs(keys, &mut rows, threads),
                }
                rows
            }
            None => sort_order(keys, threads, range, top_counts),
        };
        join_nulls(sorted_rows, nulls, nulls_first)
    }

    /// The first `k` rows of the sorted order, without sorting the rest.
    fn top_k(self, k: usize, threads: usize) -> Vec<I> {
        let Split {
            keys,
            rows,
            nulls,
            nulls_first,
            range: _,
            top_counts: _,
        } = self;
        let rows = rows.unwrap_or_else(|| row_numbers(keys.len()));
        if nulls_first && nulls.len() >= k {
            return nulls[..k].to_vec();
        }
        let wanted = if nulls_first { k - nulls.len() } else { k };
        let mut sorted_rows = if wanted < keys.len() / 2 {
            let mut pairs: Vec<(K, I)> = keys.into_iter().zip(rows).collect();
            // (key, row) order is the stable order; rows make pairs unique.
            if wanted > 0 {
                pairs.select_nth_unstable(wanted - 1);
            }
            pairs.truncate(wanted);
            pairs.sort_unstable();
            pairs.into_iter().map(|p| p.1).collect()
        } else {
            let mut rows = rows;
            sort_pairs(keys, &mut rows, threads);
            rows.truncate(wanted);
            rows
        };
        sorted_rows.truncate(wanted);
        let mut out = join_nulls(sorted_rows, nulls, nulls_first);
        out.truncate(k);
        out
    }
}

fn join_nulls<I: Copy>(rows: Vec<I>, nulls: Vec<I>, nulls_first: bool) -> Vec<I> {
    if nulls.is_empty() {
        return rows;
    }
    let (mut head, tail) = if nulls_first {
        (nulls, rows)
    } else {
        (rows, nulls)
    };
    head.extend_from_slice(&tail);
    head
}

impl<I: SortIndex> NormalizedKeys<I> {
    pub(crate) fn sort(self, threads: usize) -> Vec<I> {
        match self {
            NormalizedKeys::U32(s) => s.sort(threads),
            NormalizedKeys::U64(s) => s.sort(threads),
            NormalizedKeys::U128(s) => s.sort(threads),
        }
    }

    /// (row, key widened to u128) of every non-null row.
    pub(crate) fn row_keys(&self) -> Vec<(usize, u128)> {
        fn pairs<K: RadixKey, I: SortIndex>(s: &Split<K, I>) -> Vec<(usize, u128)> {
            let keys = s.keys.iter().map(|k| k.to_u128());
            match &s.rows {
                Some(rows) => rows.iter().map(|r| r.as_usize()).zip(keys).collect(),
                None => keys.enumerate().collect(),
            }
        }
        match self {
            NormalizedKeys::U32(s) => pairs(s),
            NormalizedKeys::U64(s) => pairs(s),
            NormalizedKeys::U128(s) => pairs(s),
        }
    }

    pub(crate) fn top_k(self, k: usize, threads: usize) -> Vec<I> {
        match self {
            NormalizedKeys::U32(s) => s.top_k(k, threads),
            NormalizedKeys::U64(s) => s.top_k(k, threads),
            NormalizedKeys::U128(s) => s.top_k(k, threads),
        }
    }
}

/// Order-preserving transform of a plain (not dictionary-encoded) array,
/// or `None` if its type has none (strings, dictionaries, nested types).
pub(crate) fn normalize_plain<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
    threads: usize,
) -> Result<Option<NormalizedKeys<I>>, ArrowError> {
    use DataType::*;
    let (desc, nf) = (options.descending, options.nulls_first);
    let nulls = values.nulls();
    let n = values.len();
    let data = values.to_data();
    let keys = match values.data_type() {
        Boolean => {
            let a = values.as_boolean();
            NormalizedKeys::U32(split(n, nulls, desc, nf, threads, |i| a.value(i) as u32))
        }
        Float32 => {
            let v = data.buffer::<f32>(0);
            NormalizedKeys::U32(split(n, nulls, desc, nf, threads, |i| f32_key(v[i])))
        }
        Float64 => {
            let v = data.buffer::<f64>(0);
            NormalizedKeys::U64(split(n, nulls, desc, nf, threads, |i| f64_key(v[i])))
        }
        Int8 => NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<i8, _>(&data))),
        Int16 => NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<i16, _>(&data))),
        Int32 | Date32 | Time32(_) | Decimal32(_, _) => {
            NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<i32, _>(&data)))
        }
        UInt8 => NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<u8, _>(&data))),
        UInt16 => NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<u16, _>(&data))),
        UInt32 => NormalizedKeys::U32(split(n, nulls, desc, nf, threads, keys_of::<u32, _>(&data))),
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => {
            NormalizedKeys::U64(split(n, nulls, desc, nf, threads, keys_of::<i64, _>(&data)))
        }
        UInt64 => NormalizedKeys::U64(split(n, nulls, desc, nf, threads, keys_of::<u64, _>(&data))),
        Decimal128(_, _) => {
            let v = data.buffer::<i128>(0);
            NormalizedKeys::U128(split(n, nulls, desc, nf, threads, |i| v[i].key()))
        }
        _ => return Ok(None),
    };
    Ok(Some(keys))
}

/// The key of row `i` of a primitive array whose values are `T`.
fn keys_of<'a, T: IntegerKey, K: FromKey>(
    data: &'a arrow::array::ArrayData,
) -> impl Fn(usize) -> K + Sync + 'a {
    let v = data.buffer::<T>(0);
    move |i| K::from_key(v[i].key())
}

/// Truncation of a key image to the radix width (the image fits by type).
pub(crate) trait FromKey {
    fn from_key(k: u128) -> Self;
}
impl FromKey for u32 {
    #[inline(always)]
    fn from_key(k: u128) -> Self {
        k as u32
    }
}
impl FromKey for u64 {
    #[inline(always)]
    fn from_key(k: u128) -> Self {
        k as u64
    }
}

/// Applies `key` to every row: non-null rows to `keys`/`rows`, null rows to
/// `nulls`. Descending order inverts the keys. Without nulls, large inputs
/// are transformed on `threads` threads.
pub(crate) fn split<K: RadixKey + std::ops::Not<Output = K>, I: SortIndex>(
    n: usize,
    nulls: Option<&NullBuffer>,
    descending: bool,
    nulls_first: bool,
    threads: usize,
    key: impl Fn(usize) -> K + Sync,
) -> Split<K, I> {
    let flip = |k: K| if descending { !k } else { k };
    let Some(valid) = nulls.filter(|b| b.null_count() > 0) else {
        let mut keys = take_vec(n);
        let filled = fill_keys(&mut keys, n, threads, |i| flip(key(i)));
        return Split {
            keys,
            rows: None,
            nulls: vec![],
            nulls_first,
            range: filled.as_ref().map(|f| f.range),
            top_counts: filled.map(|f| f.top_counts),
        };
    };
    let null_count = valid.null_count();
    let mut keys = take_vec(n - null_count);
    let mut rows = take_vec(n - null_count);
    let mut nulls = Vec::with_capacity(null_count);
    for i in 0..n {
        if valid.is_valid(i) {
            keys.push(flip(key(i)));
            rows.push(I::from_usize(i));
        } else {
            nulls.push(I::from_usize(i));
        }
    }
    Split {
        keys,
        rows: Some(rows),
        nulls,
        nulls_first,
        range: None,
        top_counts: None,
    }
}

/// Inputs shorter than this are transformed on one thread.
const PARALLEL_SPLIT_ROWS_MIN: usize = 1 << 20;

/// What [`fill_keys`] learns of the keys on the way, saving the sort a
/// pass each.
struct Filled<K> {
    /// The smallest and largest key.
    range: (K, K),
    /// Counts of the keys' top byte, per chunk of the fill's threads.
    top_counts: ChunkCounts,
}

/// `keys[i] = key(i)` for `i < n`, into an empty vector with room for `n`,
/// split over `threads`. Returns the keys' range and top-byte counts (None
/// if `n` is 0).
fn fill_keys<K: RadixKey>(
    keys: &mut Vec<K>,
    n: usize,
    threads: usize,
    key: impl Fn(usize) -> K + Sync,
) -> Option<Filled<K>> {
    assert!(keys.is_empty() && keys.capacity() >= n);
    let fill = |start: usize, k: &mut [std::mem::MaybeUninit<K>]| -> ((K, K), [usize; 256]) {
        let first = key(start);
        let (mut lo, mut hi) = (first, first);
        let mut counts = [0usize; 256];
        for (j, k) in k.iter_mut().enumerate() {
            let v = key(start + j);
            lo = lo.min(v);
            hi = hi.max(v);
            counts[v.byte(0)] += 1;
            k.write(v);
        }
        ((lo, hi), counts)
    };
    if n == 0 {
        return None;
    }
    let out = &mut keys.spare_capacity_mut()[..n];
    let chunk = if threads < 2 || n < PARALLEL_SPLIT_ROWS_MIN {
        n
    } else {
        n.div_ceil(threads)
    };
    let parts: Vec<((K, K), [usize; 256])> = if chunk == n {
        vec![fill(0, out)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = out
                .chunks_mut(chunk)
                .enumerate()
                .map(|(t, k)| {
                    let fill = &fill;
                    s.spawn(move || fill(t * chunk, k))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("key fill thread panicked"))
                .collect()
        })
    };
    // SAFETY: every one of the first n slots was written above.
    unsafe { keys.set_len(n) };
    let range = parts
        .iter()
        .map(|p| p.0)
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
        .expect("n > 0 keys make a chunk");
    let top_counts = ChunkCounts {
        chunk,
        level: 0,
        counts: parts.into_iter().map(|p| p.1).collect(),
    };
    Some(Filled { range, top_counts })
}

/// Order-preserving image of an f64: NaN above +inf, -0.0 equal to 0.0.
#[inline(always)]
pub(crate) fn f64_key(x: f64) -> u64 {
    if x.is_nan() {
        return u64::MAX;
    }
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

/// Order-preserving image of an f32: NaN above +inf, -0.0 equal to 0.0.
#[inline(always)]
pub(crate) fn f32_key(x: f32) -> u32 {
    if x.is_nan() {
        return u32::MAX;
    }
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | (1 << 31)
    }
}

/// A native integer with an order-preserving unsigned image.
pub(crate) trait IntegerKey: ArrowNativeType {
    fn key(self) -> u128;
}

macro_rules! signed_key {
    ($t:ty, $u:ty) => {
        impl IntegerKey for $t {
            #[inline(always)]
            fn key(self) -> u128 {
                ((self as $u) ^ (1 << (<$u>::BITS - 1))) as u128
            }
        }
    };
}
macro_rules! unsigned_key {
    ($t:ty) => {
        impl IntegerKey for $t {
            #[inline(always)]
            fn key(self) -> u128 {
                self as u128
            }
        }
    };
}
signed_key!(i8, u8);
signed_key!(i16, u16);
signed_key!(i32, u32);
signed_key!(i64, u64);
signed_key!(i128, u128);
unsigned_key!(u8);
unsigned_key!(u16);
unsigned_key!(u32);
unsigned_key!(u64);

/// Stable comparison sort for types without a bit transform.
pub(crate) fn comparison_argsort<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
) -> Result<Vec<I>, ArrowError> {
    let compare = arrow::array::make_comparator(values, values, options)?;
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| compare(a, b));
    Ok(idx.into_iter().map(I::from_usize).collect())
}
