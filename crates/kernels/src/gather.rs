//! Shuffle: gather rows by sorted indices (`out[i] = values[indices[i]]`),
//! column-wise for Arrow arrays and row-wise for fixed-width row data.
//!
//! Random gathers from large arrays miss the cache on almost every row;
//! the fixed-width loops prefetch the row `PREFETCH_ROWS` ahead so those
//! misses overlap instead of stalling one at a time.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, ArrayRef, RecordBatch, UInt32Array};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

use crate::mem::{pooled_buffer, take_vec, Pod};

/// How far ahead the gather loops prefetch.
const PREFETCH_ROWS: usize = 16;
/// Sources up to this size are assumed to sit in cache (L2 is 1 MiB per
/// core on the machines we measure on).
const CACHED_BYTES_MAX: usize = 1 << 20;

#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `out[i] = values[indices[i]]` for plain fixed-width values, prefetching.
///
/// ```
/// let out = insitu_kernels::gather_values(&[10u64, 20, 30], &[2, 0, 0]);
/// assert_eq!(out, vec![30, 10, 10]);
/// ```
pub fn gather_values<T: Pod>(values: &[T], indices: &[u32]) -> Vec<T> {
    let n = indices.len();
    let mut out = take_vec(n);
    let dst = &mut out.spare_capacity_mut()[..n];
    // A source that stays in cache gains nothing from prefetching.
    let prefetched = if std::mem::size_of_val(values) <= CACHED_BYTES_MAX {
        0
    } else {
        n.saturating_sub(PREFETCH_ROWS)
    };
    let base = values.as_ptr();
    for i in 0..prefetched {
        // wrapping_add: the address is only a hint, never dereferenced.
        prefetch(base.wrapping_add(indices[i + PREFETCH_ROWS] as usize));
        dst[i].write(values[indices[i] as usize]); // bounds-checked: indices in range
    }
    for i in prefetched..n {
        dst[i].write(values[indices[i] as usize]);
    }
    // SAFETY: all n slots were written above.
    unsafe { out.set_len(n) };
    out
}

/// Gathers fixed-width rows of `row_width` bytes into `out` (cleared and
/// reused, so a caller looping over chunks keeps one warm buffer).
///
/// ```
/// let rows = [1u8, 1, 2, 2, 3, 3];
/// let mut out = Vec::new();
/// insitu_kernels::gather_rows(&rows, 2, &[2, 0], &mut out);
/// assert_eq!(out, vec![3, 3, 1, 1]);
/// ```
pub fn gather_rows(rows: &[u8], row_width: usize, indices: &[u32], out: &mut Vec<u8>) {
    out.clear();
    out.resize(indices.len() * row_width, 0);
    gather_rows_into(rows, row_width, indices, out);
}

/// [`gather_rows`] into a slice of exactly `indices.len() * row_width`
/// bytes, so that threads can each fill a part of one output.
///
/// ```
/// let rows = [1u8, 1, 2, 2, 3, 3];
/// let mut out = [0u8; 4];
/// insitu_kernels::gather_rows_into(&rows, 2, &[1, 2], &mut out);
/// assert_eq!(out, [2, 2, 3, 3]);
/// ```
pub fn gather_rows_into(rows: &[u8], row_width: usize, indices: &[u32], out: &mut [u8]) {
    assert!(row_width > 0, "rows have a width");
    assert_eq!(rows.len() % row_width, 0, "whole rows only");
    assert_eq!(
        out.len(),
        indices.len() * row_width,
        "one output row per index"
    );
    let base = rows.as_ptr();
    for (i, (&row, dst)) in indices
        .iter()
        .zip(out.chunks_exact_mut(row_width))
        .enumerate()
    {
        if let Some(&ahead) = indices.get(i + PREFETCH_ROWS) {
            prefetch(base.wrapping_add(ahead as usize * row_width));
        }
        let start = row as usize * row_width;
        dst.copy_from_slice(&rows[start..start + row_width]);
    }
}

/// Gathers one column: own prefetching loop for fixed-width primitives,
/// Arrow's `take` for everything else.
///
/// ```
/// use arrow::array::{Array, Int32Array};
/// let col = Int32Array::from(vec![Some(1), None, Some(3)]);
/// let out = insitu_kernels::gather(&col, &[2, 1, 0]).unwrap();
/// assert_eq!(out.as_any().downcast_ref::<Int32Array>().unwrap(),
///            &Int32Array::from(vec![Some(3), None, Some(1)]));
/// ```
pub fn gather(values: &dyn Array, indices: &[u32]) -> Result<ArrayRef, ArrowError> {
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= values.len()) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "gather index {bad} out of range for {} rows",
            values.len()
        )));
    }
    let data = values.to_data();
    let width = match values.data_type() {
        dt if dt.is_primitive() && !matches!(dt, DataType::Boolean) => dt.primitive_width(),
        _ => None,
    };
    let values_buffer: Buffer = match width {
        Some(1) => pooled_buffer(gather_values(data.buffer::<u8>(0), indices)),
        Some(2) => pooled_buffer(gather_values(data.buffer::<u16>(0), indices)),
        Some(4) => pooled_buffer(gather_values(data.buffer::<u32>(0), indices)),
        Some(8) => pooled_buffer(gather_values(data.buffer::<u64>(0), indices)),
        Some(16) => pooled_buffer(gather_values(data.buffer::<u128>(0), indices)),
        _ => {
            let idx = UInt32Array::from(indices.to_vec());
            return arrow::compute::take(values, &idx, None);
        }
    };
    let nulls = values
        .logical_nulls()
        .filter(|n| n.null_count() > 0)
        .map(|n| {
            NullBuffer::new(BooleanBuffer::collect_bool(indices.len(), |i| {
                n.is_valid(indices[i] as usize)
            }))
        });
    let out = ArrayData::builder(values.data_type().clone())
        .len(indices.len())
        .add_buffer(values_buffer)
        .nulls(nulls)
        .build()?;
    Ok(arrow::array::make_array(out))
}

/// Gathers every column of `batch` by `indices`.
pub fn gather_batch(batch: &RecordBatch, indices: &[u32]) -> Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .map(|c| gather(c.as_ref(), indices))
        .collect::<Result<Vec<_>, _>>()?;
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(indices.len()));
    RecordBatch::try_new_with_options(Arc::clone(&batch.schema()), columns, &options)
}
