//! `argsort`: an Arrow array in, the row indices that sort it out.
//!
//! Keys go through an order-preserving bit transform into unsigned
//! integers and are sorted by the radix core ([`crate::radix`]):
//!
//! | type | transform |
//! |---|---|
//! | unsigned, boolean | as is |
//! | signed, date, time, timestamp, duration, decimal128 | flip the sign bit |
//! | float | negative: flip all bits; positive: flip the sign bit |
//! | dictionary | rank of the value in the sorted dictionary ([`crate::dictionary`]) |
//!
//! Descending order flips all bits. NaN sorts above every other float (as
//! in DuckDB and PostgreSQL), and every NaN is equal to every other; `-0.0`
//! and `0.0` are equal. Nulls go first or last as the options say. Every
//! path is stable: rows with equal keys keep their input order, so
//! `argsort` is also the stable variant. Types without a transform (strings,
//! lists, ...) fall back to a stable comparison sort.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, UInt32Array, UInt64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

use crate::dictionary::{dictionary_ranks, low_cardinality_ranks};
use crate::keys::{
    check_index_fits, comparison_argsort, f32_key, f64_key, normalize_plain, split, IntegerKey,
    NormalizedKeys,
};
use crate::radix::SortIndex;
use crate::Parallelism;

/// Returns the indices that sort `values` (as `UInt32Array`, or
/// `UInt64Array` past 2^32 rows).
///
/// ```
/// use arrow::array::{Float64Array, UInt32Array};
/// use arrow::compute::SortOptions;
/// use insitu_kernels::argsort;
///
/// let values = Float64Array::from(vec![Some(2.5), None, Some(f64::NAN), Some(-1.0)]);
/// let order = argsort(&values, SortOptions { descending: false, nulls_first: false }).unwrap();
/// let order = order.as_any().downcast_ref::<UInt32Array>().unwrap();
/// assert_eq!(order.values(), &[3, 0, 2, 1]);
/// ```
pub fn argsort(values: &dyn Array, options: SortOptions) -> Result<ArrayRef, ArrowError> {
    if values.len() <= u32::MAX as usize {
        let idx: Vec<u32> = argsort_to(values, options, Parallelism::default())?;
        Ok(Arc::new(UInt32Array::from(idx)))
    } else {
        let idx: Vec<u64> = argsort_to(values, options, Parallelism::default())?;
        Ok(Arc::new(UInt64Array::from(idx)))
    }
}

/// [`argsort`] into a plain vector of `I`, with a thread budget.
pub fn argsort_to<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
    threads: Parallelism,
) -> Result<Vec<I>, ArrowError> {
    check_index_fits::<I>(values.len())?;
    let keys = match normalize(values, options, threads.0)? {
        Some(keys) => keys,
        None => return comparison_argsort(values, options),
    };
    let out = keys.sort(threads.0);
    debug_assert_eq!(out.len(), values.len());
    Ok(out)
}

/// The first `k` indices of `argsort(values)`, found without a full sort.
///
/// ```
/// use arrow::array::Int64Array;
/// use arrow::compute::SortOptions;
/// use insitu_kernels::argsort_top_k;
///
/// let values = Int64Array::from(vec![5, 1, 4, 1, 3]);
/// let top: Vec<u32> = argsort_top_k(&values, SortOptions::default(), 3).unwrap();
/// assert_eq!(top, vec![1, 3, 4]);
/// ```
pub fn argsort_top_k<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
    k: usize,
) -> Result<Vec<I>, ArrowError> {
    let k = k.min(values.len());
    let out = match normalize::<I>(values, options, 1)? {
        Some(keys) => keys.top_k(k, 1),
        None => {
            let mut all = comparison_argsort(values, options)?;
            all.truncate(k);
            all
        }
    };
    debug_assert_eq!(out.len(), k);
    Ok(out)
}

/// Order-preserving transform of `values`, or `None` if the type has none:
/// dictionaries and low-cardinality strings by their ranks, the rest as
/// [`normalize_plain`] does.
pub(crate) fn normalize<I: SortIndex>(
    values: &dyn Array,
    options: SortOptions,
    threads: usize,
) -> Result<Option<NormalizedKeys<I>>, ArrowError> {
    let (desc, nf) = (options.descending, options.nulls_first);
    let ranks = match values.data_type() {
        DataType::Dictionary(_, _) => dictionary_ranks(values)?,
        _ => match normalize_plain(values, options, threads)? {
            Some(keys) => return Ok(Some(keys)),
            None => match low_cardinality_ranks(values)? {
                Some(ranks) => ranks,
                None => return Ok(None),
            },
        },
    };
    let r = ranks.ranks.values();
    let n = values.len();
    Ok(Some(NormalizedKeys::U32(split(
        n,
        ranks.ranks.nulls(),
        desc,
        nf,
        threads,
        |i| r[i],
    ))))
}

/// One row's sort key as a single comparable value: nulls 0 (when they
/// come first) or `u128::MAX` (last); a value its order-preserving image
/// (inverted when descending) plus one. A decimal128's image takes all
/// 128 bits and is clamped to `1..=u128::MAX - 1`: only `i128::MIN` and
/// `i128::MAX`, beyond every decimal precision, tie with their neighbours.
pub type KeyImage = u128;

/// Each row's [`KeyImage`] under `options`: rows compare as their images
/// do, in the order [`argsort`] sorts them (NaN above every number, `-0.0`
/// equal to `0.0`). `None` for types without a bit transform (strings,
/// dictionaries, nested types); compare those in `arrow::row` format.
///
/// Merging sorted streams by one fixed-width key compares these instead
/// of row-format keys: no encoding into a byte buffer, no `memcmp`.
///
/// ```
/// use arrow::array::Int64Array;
/// use arrow::compute::SortOptions;
/// use insitu_kernels::key_images;
///
/// let values = Int64Array::from(vec![Some(-2), None, Some(7)]);
/// let options = SortOptions { descending: false, nulls_first: true };
/// let images = key_images(&values, options).unwrap().unwrap();
/// assert!(images[1] < images[0] && images[0] < images[2]);
/// ```
pub fn key_images(
    values: &dyn Array,
    options: SortOptions,
) -> Result<Option<Vec<KeyImage>>, ArrowError> {
    use DataType::*;
    // The transforms of `normalize`, but not its dictionary and string
    // ranks: those order one array's rows, and images must compare across
    // arrays.
    let data = values.to_data();
    let images = match values.data_type() {
        Boolean => {
            let bits = values.as_boolean().values().iter();
            images_of(values, options, 1, bits.map(|b| b as u128))
        }
        Float32 => {
            let v = data.buffer::<f32>(0)[..values.len()].iter();
            images_of(values, options, 32, v.map(|&x| f32_key(x) as u128))
        }
        Float64 => {
            let v = data.buffer::<f64>(0)[..values.len()].iter();
            images_of(values, options, 64, v.map(|&x| f64_key(x) as u128))
        }
        Int8 => integer_images::<i8>(values, options, &data),
        Int16 => integer_images::<i16>(values, options, &data),
        Int32 | Date32 | Time32(_) | Decimal32(_, _) => {
            integer_images::<i32>(values, options, &data)
        }
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => {
            integer_images::<i64>(values, options, &data)
        }
        UInt8 => integer_images::<u8>(values, options, &data),
        UInt16 => integer_images::<u16>(values, options, &data),
        UInt32 => integer_images::<u32>(values, options, &data),
        UInt64 => integer_images::<u64>(values, options, &data),
        Decimal128(_, _) => integer_images::<i128>(values, options, &data),
        _ => return Ok(None),
    };
    debug_assert_eq!(images.len(), values.len());
    Ok(Some(images))
}

fn integer_images<T: IntegerKey>(
    values: &dyn Array,
    options: SortOptions,
    data: &arrow::array::ArrayData,
) -> Vec<KeyImage> {
    let bits = 8 * std::mem::size_of::<T>() as u32;
    let v = data.buffer::<T>(0)[..values.len()].iter();
    images_of(values, options, bits, v.map(|x| x.key()))
}

/// The [`KeyImage`]s of `values`, whose rows' order-preserving images
/// (`bits` wide) `keys` yields.
fn images_of(
    values: &dyn Array,
    options: SortOptions,
    bits: u32,
    keys: impl Iterator<Item = u128>,
) -> Vec<KeyImage> {
    let flip = match options.descending {
        true => u128::MAX >> (128 - bits),
        false => 0,
    };
    let image = |k: u128| match bits {
        128 => (k ^ flip).clamp(1, u128::MAX - 1),
        _ => (k ^ flip) + 1,
    };
    let null_image = if options.nulls_first { 0 } else { u128::MAX };
    match values.nulls().filter(|n| n.null_count() > 0) {
        None => keys.map(image).collect(),
        Some(valid) => (keys.zip(valid.iter()))
            .map(|(k, valid)| if valid { image(k) } else { null_image })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Decimal128Array;

    /// Nulls stay before (or after) every value, also the extremes of
    /// 128-bit decimals, in either direction.
    #[test]
    fn decimal_extremes_stay_between_the_nulls() {
        let values = Decimal128Array::from(vec![
            Some(i128::MIN),
            Some(-1),
            None,
            Some(0),
            Some(i128::MAX),
        ]);
        for descending in [false, true] {
            for nulls_first in [false, true] {
                let options = SortOptions {
                    descending,
                    nulls_first,
                };
                let images = key_images(&values, options).unwrap().unwrap();
                let null = images[2];
                let others = [images[0], images[1], images[3], images[4]];
                assert!(others
                    .iter()
                    .all(|&v| (null < v) == nulls_first && null != v));
                let ascending = images[1] < images[3];
                assert_eq!(ascending, !descending);
                assert!(
                    ascending == (images[0] < images[1]) && ascending == (images[3] < images[4])
                );
            }
        }
    }
}
