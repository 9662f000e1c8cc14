//! Multi-column sort keys: each row's key columns encoded as one
//! byte-comparable string (arrow-row), fed to the radix core when every
//! string has the same width of at most 16 bytes, else compared bytewise.
//!
//! Dictionary columns enter as their dense ranks ([`crate::dictionary`]), so
//! a dictionary-encoded string key costs 4 bytes of row key, not its length.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, UInt32Array, UInt64Array};
use arrow::compute::SortColumn;
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use arrow::error::ArrowError;
use arrow::row::{RowConverter, Rows, SortField};

use crate::argsort::{argsort_to, argsort_top_k};
use crate::keys::{f32_key, f64_key, NormalizedKeys, Split};
use crate::radix::SortIndex;
use crate::Parallelism;

/// Indices that sort rows by several key columns (lexicographically, each
/// with its own direction and null placement); only the first `limit` if
/// given. Stable.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int32Array, StringArray};
/// use arrow::compute::{SortColumn, SortOptions};
/// use insitu_kernels::argsort_columns;
///
/// let a = SortColumn { values: Arc::new(Int32Array::from(vec![2, 1, 2, 1])), options: None };
/// let b = SortColumn {
///     values: Arc::new(StringArray::from(vec!["x", "y", "w", "y"])),
///     options: Some(SortOptions { descending: true, nulls_first: false }),
/// };
/// let order: Vec<u32> = argsort_columns(&[a, b], None, Default::default()).unwrap();
/// assert_eq!(order, vec![1, 3, 0, 2]);
/// ```
pub fn argsort_columns<I: SortIndex>(
    columns: &[SortColumn],
    limit: Option<usize>,
    threads: Parallelism,
) -> Result<Vec<I>, ArrowError> {
    let Some(first) = columns.first() else {
        return Err(ArrowError::InvalidArgumentError(
            "sort needs at least one key column".into(),
        ));
    };
    let n = first.values.len();
    if let Some(bad) = columns.iter().find(|c| c.values.len() != n) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "sort key columns differ in length: {n} and {}",
            bad.values.len()
        )));
    }
    if n > I::MAX_ROWS {
        return Err(ArrowError::InvalidArgumentError(format!(
            "sort of {n} rows does not fit the index type"
        )));
    }
    if columns.len() == 1 {
        let options = first.options.unwrap_or_default();
        return match limit {
            Some(k) => argsort_top_k(first.values.as_ref(), options, k),
            None => argsort_to(first.values.as_ref(), options, threads),
        };
    }
    let rows = encode_rows(columns)?;
    let k = limit.unwrap_or(n).min(n);
    let out = match fixed_width_keys::<I>(&rows) {
        Some(keys) if k < n => keys.top_k(k, threads.0),
        Some(keys) => keys.sort(threads.0),
        None => compare_rows(&rows, k),
    };
    debug_assert_eq!(out.len(), k);
    Ok(out)
}

/// Encodes the key columns row-wise; dictionary columns as their ranks.
fn encode_rows(columns: &[SortColumn]) -> Result<Rows, ArrowError> {
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for c in columns {
        let values = match c.values.data_type() {
            DataType::Dictionary(_, _) => {
                Arc::new(crate::dictionary_ranks(c.values.as_ref())?.ranks) as ArrayRef
            }
            // arrow-row orders floats by total_cmp; these keys give the
            // kernels' order (NaN equal and greatest, -0.0 == 0.0).
            DataType::Float64 => {
                let v = c.values.as_primitive::<Float64Type>();
                Arc::new(UInt64Array::new(
                    v.values().iter().map(|&x| f64_key(x)).collect(),
                    v.nulls().cloned(),
                )) as ArrayRef
            }
            DataType::Float32 => {
                let v = c.values.as_primitive::<Float32Type>();
                Arc::new(UInt32Array::new(
                    v.values().iter().map(|&x| f32_key(x)).collect(),
                    v.nulls().cloned(),
                )) as ArrayRef
            }
            _ => match crate::dictionary::low_cardinality_ranks(c.values.as_ref())? {
                Some(ranks) => Arc::new(ranks.ranks) as ArrayRef,
                None => Arc::clone(&c.values),
            },
        };
        fields.push(SortField::new_with_options(
            values.data_type().clone(),
            c.options.unwrap_or_default(),
        ));
        arrays.push(values);
    }
    RowConverter::new(fields)?.convert_columns(&arrays)
}

/// Row keys packed into integers when all have one width of <= 16 bytes.
fn fixed_width_keys<I: SortIndex>(rows: &Rows) -> Option<NormalizedKeys<I>> {
    let width = rows.iter().next()?.as_ref().len();
    if width > 16 || rows.iter().any(|r| r.as_ref().len() != width) {
        return None;
    }
    let packed = |r: arrow::row::Row<'_>| {
        let mut bytes = [0u8; 16];
        bytes[..width].copy_from_slice(r.as_ref());
        u128::from_be_bytes(bytes)
    };
    fn split<K, I: SortIndex>(keys: Vec<K>) -> Split<K, I> {
        Split {
            keys,
            rows: None,
            nulls: vec![],
            nulls_first: false,
            range: None,
            top_counts: None,
        }
    }
    Some(match width {
        0..=4 => NormalizedKeys::U32(split(
            rows.iter().map(|r| (packed(r) >> 96) as u32).collect(),
        )),
        5..=8 => NormalizedKeys::U64(split(
            rows.iter().map(|r| (packed(r) >> 64) as u64).collect(),
        )),
        _ => NormalizedKeys::U128(split(rows.iter().map(packed).collect())),
    })
}

/// Stable bytewise comparison sort of row keys, first `k` rows only.
fn compare_rows<I: SortIndex>(rows: &Rows, k: usize) -> Vec<I> {
    let mut idx: Vec<usize> = (0..rows.num_rows()).collect();
    let by_row = |a: &usize, b: &usize| rows.row(*a).cmp(&rows.row(*b)).then(a.cmp(b));
    if k > 0 && k < idx.len() / 2 {
        idx.select_nth_unstable_by(k - 1, by_row);
        idx.truncate(k);
    }
    idx.sort_by(by_row);
    idx.truncate(k);
    idx.into_iter().map(I::from_usize).collect()
}
