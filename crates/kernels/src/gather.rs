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

use crate::arena::{ChunkArena, OutputBuffer};
use crate::mem::{pooled_buffer, recycle, take_vec, take_vec_filled, Pod};

/// How far ahead the gather loops prefetch.
pub(crate) const PREFETCH_ROWS: usize = 16;
/// Per-core L2 assumed when the CPU does not say.
const L2_BYTES_DEFAULT: usize = 512 << 10;

/// This core's L2 in bytes, as the CPU reports it (CPUID leaf
/// 0x8000_0006, which Intel and AMD both fill), else
/// [`L2_BYTES_DEFAULT`].
pub(crate) fn l2_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            if __cpuid(0x8000_0000).eax >= 0x8000_0006 {
                let kib = (__cpuid(0x8000_0006).ecx >> 16) as usize;
                if kib > 0 {
                    return kib << 10;
                }
            }
        }
        L2_BYTES_DEFAULT
    })
}

/// Whether random reads from a source of this many bytes gain from
/// prefetching: only past half of L2. Past it they overlap the misses
/// (sortbench, dictionary decode of 64Ki 8-byte values, 512 KiB, before
/// the vector path: 0.61 -> 0.73-0.83 G/s with them); inside it they only
/// add work (64Ki entries into views, a 1 MiB table on a core with 2 MiB
/// of L2: 0.56 G rows/s with them, 0.64 without).
pub(crate) fn prefetch_pays(source_bytes: usize) -> bool {
    source_bytes > l2_bytes() / 2
}

/// Asks the CPU to bring `p`'s cache line into L1 for reading: a hint
/// that never faults, whatever the address.
///
/// ```
/// let values = [1u8, 2, 3];
/// // Past the end is fine: a prefetch never dereferences.
/// insitu_kernels::prefetch(values.as_ptr().wrapping_add(4096));
/// ```
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
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
    let prefetched = if prefetch_pays(std::mem::size_of_val(values)) {
        n.saturating_sub(PREFETCH_ROWS)
    } else {
        0
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
    // A row width known at compile time turns each row's copy into a few
    // vector moves instead of a call to memmove.
    macro_rules! by_width {
        ($($w:literal)*) => {
            match row_width {
                $($w => gather_rows_of::<$w>(rows, indices, out),)*
                _ => gather_rows_any(rows, row_width, indices, out),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64);
}

/// [`gather_rows_into`] for rows of `W` bytes.
fn gather_rows_of<const W: usize>(rows: &[u8], indices: &[u32], out: &mut [u8]) {
    let (rows, _) = rows.as_chunks::<W>();
    let (out, _) = out.as_chunks_mut::<W>();
    let base = rows.as_ptr();
    for (i, (&row, dst)) in indices.iter().zip(out).enumerate() {
        if let Some(&ahead) = indices.get(i + PREFETCH_ROWS) {
            prefetch(base.wrapping_add(ahead as usize));
        }
        *dst = rows[row as usize];
    }
}

/// [`gather_rows_into`] for rows of any width.
fn gather_rows_any(rows: &[u8], row_width: usize, indices: &[u32], out: &mut [u8]) {
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
    check_indices(indices, values.len())?;
    gather_in_range(values, indices)
}

/// [`gather`] of indices already checked to be in range.
pub(crate) fn gather_in_range(values: &dyn Array, indices: &[u32]) -> Result<ArrayRef, ArrowError> {
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
    let nulls = gather_nulls(values.logical_nulls().as_ref(), indices);
    let out = ArrayData::builder(values.data_type().clone())
        .len(indices.len())
        .add_buffer(values_buffer)
        .nulls(nulls)
        .build()?;
    Ok(arrow::array::make_array(out))
}

/// Gathers every column of `batch` by `indices` (`take` on each column).
///
/// A random gather misses the cache once per row and column, so for large
/// batches the fixed-width parts of the columns (primitive values, string
/// view structs, dictionary keys) are first packed into rows of at most
/// [`ROW_GROUP_BYTES_MAX`] bytes, the rows gathered, and the rows unpacked
/// into columns: one miss per row and group instead of per row and column.
/// The packing and unpacking are sequential passes in cache-sized blocks.
///
/// ```text
///  columns a b c d         rows [a b c d]       gathered rows      columns
///  ┌─┐┌─┐┌─┐┌─┐   pack    ┌───────┐  indices   ┌───────┐  unpack  ┌─┐┌─┐┌─┐┌─┐
///  │ ││ ││ ││ │  ──────▶  ├───────┤  ───────▶  ├───────┤  ──────▶ │ ││ ││ ││ │
///  └─┘└─┘└─┘└─┘           └───────┘            └───────┘          └─┘└─┘└─┘└─┘
/// ```
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch, StringViewArray};
/// let batch = RecordBatch::try_from_iter([
///     ("k", Arc::new(Int64Array::from(vec![3, 1, 2])) as _),
///     ("s", Arc::new(StringViewArray::from(vec!["c", "a", "b"])) as _),
/// ]).unwrap();
/// let out = insitu_kernels::gather_batch(&batch, &[1, 2, 0]).unwrap();
/// assert_eq!(out.column(1).as_ref(), &StringViewArray::from(vec!["a", "b", "c"]));
/// ```
pub fn gather_batch(batch: &RecordBatch, indices: &[u32]) -> Result<RecordBatch, ArrowError> {
    let rows = batch.num_rows();
    let row_bytes: usize = batch
        .columns()
        .iter()
        .filter_map(|c| fixed_part_width(c.data_type()))
        .sum();
    let by_rows = rows * row_bytes > ROW_WISE_BYTES_MIN && !indices.is_empty();
    gather_batch_with(batch, indices, by_rows)
}

/// Batches whose fixed-width columns hold more than this many bytes (past
/// the 512 KiB L2 of a core) are gathered row-wise: column-wise, each
/// column's gather would miss on every row.
const ROW_WISE_BYTES_MIN: usize = 1 << 20;

/// Widest row the row-wise shuffle packs, in bytes: one cache line, so
/// each gathered row costs one miss.
pub const ROW_GROUP_BYTES_MAX: usize = 64;
/// Rows are packed, gathered and unpacked in blocks of about this many
/// bytes, so a block stays in L1 between the passes over its columns.
pub(crate) const ROW_BLOCK_BYTES: usize = 32 << 10;

/// [`gather_batch`] with the choice of path made by the caller: `by_rows`
/// packs fixed-width columns into rows first (the tests force both paths).
#[doc(hidden)]
pub fn gather_batch_with(
    batch: &RecordBatch,
    indices: &[u32],
    by_rows: bool,
) -> Result<RecordBatch, ArrowError> {
    check_indices(indices, batch.num_rows())?;
    let mut columns: Vec<Option<ArrayRef>> = vec![None; batch.num_columns()];
    let fixed: Vec<(usize, usize)> = match by_rows {
        true => (batch.columns().iter().enumerate())
            .filter_map(|(i, c)| fixed_part_width(c.data_type()).map(|w| (i, w)))
            .collect(),
        false => vec![],
    };
    for group in row_groups(fixed) {
        if group.len() < 2 {
            continue; // nothing to share a row with: the column path is as good
        }
        let data: Vec<ArrayData> = group
            .iter()
            .map(|&(i, _)| batch.column(i).to_data())
            .collect();
        let widths: Vec<usize> = group.iter().map(|&(_, w)| w).collect();
        for (&(i, _), array) in group.iter().zip(gather_row_group(&data, &widths, indices)?) {
            columns[i] = Some(array);
        }
    }
    let columns = columns
        .into_iter()
        .zip(batch.columns())
        .map(|(done, c)| match done {
            Some(array) => Ok(array),
            None => gather_in_range(c.as_ref(), indices),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(indices.len()));
    RecordBatch::try_new_with_options(Arc::clone(&batch.schema()), columns, &options)
}

/// The validity of the gathered rows; `None` when no row is null.
pub(crate) fn gather_nulls(nulls: Option<&NullBuffer>, indices: &[u32]) -> Option<NullBuffer> {
    nulls.filter(|n| n.null_count() > 0).map(|n| {
        NullBuffer::new(BooleanBuffer::collect_bool(indices.len(), |i| {
            n.is_valid(indices[i] as usize)
        }))
    })
}

pub(crate) fn check_indices(indices: &[u32], len: usize) -> Result<(), ArrowError> {
    match indices.iter().find(|&&i| i as usize >= len) {
        Some(bad) => Err(ArrowError::InvalidArgumentError(format!(
            "gather index {bad} out of range for {len} rows"
        ))),
        None => Ok(()),
    }
}

/// Width in bytes of the per-row values in buffer 0 of arrays of type
/// `dt`, for types whose other buffers and children a gather leaves alone.
fn fixed_part_width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::Boolean => None,
        DataType::Utf8View | DataType::BinaryView => Some(16),
        DataType::Dictionary(key, _) => key.primitive_width(),
        dt if dt.is_primitive() => dt.primitive_width(),
        _ => None,
    }
}

/// Packs `(column, width)` pairs into groups of at most
/// [`ROW_GROUP_BYTES_MAX`] bytes, widest first (first-fit decreasing).
pub(crate) fn row_groups(mut fixed: Vec<(usize, usize)>) -> Vec<Vec<(usize, usize)>> {
    fixed.sort_by_key(|&(i, w)| (std::cmp::Reverse(w), i));
    let mut groups: Vec<(usize, Vec<(usize, usize)>)> = vec![];
    for (i, w) in fixed {
        match groups
            .iter_mut()
            .find(|(used, _)| used + w <= ROW_GROUP_BYTES_MAX)
        {
            Some((used, members)) => {
                *used += w;
                members.push((i, w));
            }
            None => groups.push((w, vec![(i, w)])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// Gathers arrays of equal length through one row layout of their
/// fixed-width parts, `widths[c]` bytes for array `c`. Indices must be in
/// range.
fn gather_row_group(
    data: &[ArrayData],
    widths: &[usize],
    indices: &[u32],
) -> Result<Vec<ArrayRef>, ArrowError> {
    assert!(
        data.iter().all(|d| d.len() == data[0].len()),
        "grouped columns have equal lengths"
    );
    let sources: Vec<&[u8]> = data
        .iter()
        .zip(widths)
        .map(|(d, &w)| fixed_part_bytes(d, w))
        .collect();
    let offsets = member_offsets(widths);
    let rows = pack_rows(&sources, widths, &offsets, data[0].len());
    let outputs = gather_packed(&rows, widths, indices);
    recycle(rows);
    data.iter()
        .zip(outputs)
        .map(|(d, out)| rebuild(d, out.into_buffer(), indices))
        .collect()
}

/// Where each member of a row starts: the running sum of the widths.
pub(crate) fn member_offsets(widths: &[usize]) -> Vec<usize> {
    (widths.iter())
        .scan(0, |at, w| Some(std::mem::replace(at, *at + w)))
        .collect()
}

/// Gathers packed rows (members `widths` bytes wide, in row order) by
/// `indices` (in range) and unpacks them into one buffer per member, a
/// block of rows at a time.
pub(crate) fn gather_packed(rows: &[u8], widths: &[usize], indices: &[u32]) -> Vec<OutputBuffer> {
    gather_packed_with(
        rows,
        widths,
        widths,
        indices,
        |m, block, row_width, offset, out| unpack_column(block, row_width, offset, widths[m], out),
        None,
    )
}

/// [`gather_packed`] with each member's values turned into `out_widths`
/// bytes per row by `unpack(member, gathered rows, row width, member
/// offset, output)`; the outputs are regions of `arena` while it has room.
pub(crate) fn gather_packed_with(
    rows: &[u8],
    widths: &[usize],
    out_widths: &[usize],
    indices: &[u32],
    unpack: impl Fn(usize, &[u8], usize, usize, &mut [u8]),
    arena: Option<&ChunkArena>,
) -> Vec<OutputBuffer> {
    assert_eq!(
        widths.len(),
        out_widths.len(),
        "one output width per member"
    );
    let row_width: usize = widths.iter().sum();
    let offsets = member_offsets(widths);
    let n = indices.len();
    let mut outputs: Vec<OutputBuffer> = out_widths
        .iter()
        .map(|w| OutputBuffer::in_arena_or_pooled(arena, n * w))
        .collect();
    let block_rows = (ROW_BLOCK_BYTES / row_width).max(1);
    let mut block: Vec<u8> = take_vec_filled(block_rows * row_width);
    for (b, chunk) in indices.chunks(block_rows).enumerate() {
        let gathered = &mut block[..chunk.len() * row_width];
        gather_rows_into(rows, row_width, chunk, gathered);
        for (m, (out, &w)) in outputs.iter_mut().zip(out_widths).enumerate() {
            let dst = &mut out.bytes_mut()[b * block_rows * w..][..chunk.len() * w];
            unpack(m, gathered, row_width, offsets[m], dst);
        }
    }
    recycle(block);
    outputs
}

/// The bytes of `data`'s `w`-byte per-row values (buffer 0, offset applied).
pub(crate) fn fixed_part_bytes(data: &ArrayData, w: usize) -> &[u8] {
    &data.buffers()[0].as_slice()[data.offset() * w..(data.offset() + data.len()) * w]
}

/// Packs the columns into rows of `widths.iter().sum()` bytes, column `c`
/// at byte `offsets[c]` of each row, a block of rows at a time.
fn pack_rows(sources: &[&[u8]], widths: &[usize], offsets: &[usize], len: usize) -> Vec<u8> {
    let row_width: usize = widths.iter().sum();
    let mut rows: Vec<u8> = take_vec_filled(len * row_width);
    let block_rows = (ROW_BLOCK_BYTES / row_width).max(1);
    for (b, block) in rows.chunks_mut(block_rows * row_width).enumerate() {
        let at = b * block_rows;
        let n = block.len() / row_width;
        for ((src, &w), &offset) in sources.iter().zip(widths).zip(offsets) {
            pack_column(&src[at * w..(at + n) * w], block, row_width, offset, w);
        }
    }
    rows
}

/// Writes `w`-byte values into byte `offset` of consecutive rows.
///
/// Packing and unpacking stay two functions, each with the column side's
/// stride known at compile time: one shared copy with both strides at run
/// time made the shuffle 1.39 s instead of 0.97 s (`sortbench
/// --only-shuffle`, 6.25M rows x 16 columns).
pub(crate) fn pack_column(
    values: &[u8],
    rows: &mut [u8],
    row_width: usize,
    offset: usize,
    w: usize,
) {
    fn pack<const W: usize>(values: &[u8], rows: &mut [u8], row_width: usize, offset: usize) {
        let (values, _) = values.as_chunks::<W>();
        for (v, row) in values.iter().zip(rows.chunks_exact_mut(row_width)) {
            row[offset..offset + W].copy_from_slice(v);
        }
    }
    match w {
        1 => pack::<1>(values, rows, row_width, offset),
        2 => pack::<2>(values, rows, row_width, offset),
        4 => pack::<4>(values, rows, row_width, offset),
        8 => pack::<8>(values, rows, row_width, offset),
        16 => pack::<16>(values, rows, row_width, offset),
        _ => {
            for (v, row) in values.chunks_exact(w).zip(rows.chunks_exact_mut(row_width)) {
                row[offset..offset + w].copy_from_slice(v);
            }
        }
    }
}

/// Reads the `w`-byte values at byte `offset` of consecutive rows into `out`.
pub(crate) fn unpack_column(
    rows: &[u8],
    row_width: usize,
    offset: usize,
    w: usize,
    out: &mut [u8],
) {
    fn unpack<const W: usize>(rows: &[u8], row_width: usize, offset: usize, out: &mut [u8]) {
        let (out, _) = out.as_chunks_mut::<W>();
        for (row, v) in rows.chunks_exact(row_width).zip(out) {
            v.copy_from_slice(&row[offset..offset + W]);
        }
    }
    match w {
        1 => unpack::<1>(rows, row_width, offset, out),
        2 => unpack::<2>(rows, row_width, offset, out),
        4 => unpack::<4>(rows, row_width, offset, out),
        8 => unpack::<8>(rows, row_width, offset, out),
        16 => unpack::<16>(rows, row_width, offset, out),
        _ => {
            for (row, v) in rows.chunks_exact(row_width).zip(out.chunks_exact_mut(w)) {
                v.copy_from_slice(&row[offset..offset + w]);
            }
        }
    }
}

/// `source` with its per-row values replaced by `values` (gathered by
/// `indices`) and its validity gathered the same way.
fn rebuild(source: &ArrayData, values: Buffer, indices: &[u32]) -> Result<ArrayRef, ArrowError> {
    let nulls = gather_nulls(source.nulls(), indices);
    let mut buffers = vec![values];
    buffers.extend(source.buffers()[1..].iter().cloned());
    let builder = ArrayData::builder(source.data_type().clone())
        .len(indices.len())
        .buffers(buffers)
        .child_data(source.child_data().to_vec())
        .nulls(nulls);
    // SAFETY: every value is a bit copy of a value of `source` (indices are
    // in range), so views still point inside the unchanged data buffers and
    // dictionary keys inside the unchanged dictionary; the buffer holds
    // exactly `len` values, allocated with 16-byte alignment.
    let data = unsafe { builder.build_unchecked() };
    debug_assert!(data.validate().is_ok());
    Ok(arrow::array::make_array(data))
}
