//! [`GatherSource`]: many batches prepared once for many gathers by global
//! row index, so that a sort can stream its output a batch at a time
//! without first concatenating its input or gathering it whole.
//!
//! ```text
//!   batch 0   batch 1   batch 2            packed rows (fixed-width parts,
//!  ┌─┬─┬─┐   ┌─┬─┬─┐   ┌─┬─┬─┐  pack once   row groups of <= 64 bytes)
//!  │ │ │ │   │ │ │ │   │ │ │ │  ─────────▶  ┌───────┐
//!  └─┴─┴─┘   └─┴─┴─┘   └─┴─┴─┘              ├───────┤  gather(indices)  ┌─┬─┬─┐
//!                                           ├───────┤  ──────────────▶  │ │ │ │ one output
//!  view data buffers, validity: shared      └───────┘   per chunk       └─┴─┴─┘ batch
//! ```
//!
//! Fixed-width columns (primitives and the 16-byte views of string and
//! binary view columns) are packed into rows once, from every batch; each
//! gather then costs one cache miss per row and row group, as in
//! [`crate::gather_batch`]. View columns keep their data buffers: a view's
//! buffer index is rebased while packing so that it points into the list of
//! all batches' buffers. Other columns (booleans, dictionaries, offset
//! strings, nested types) are concatenated once and gathered with `take`.

use std::sync::Arc;

use arrow::array::BooleanBufferBuilder;
use arrow::array::{make_array, Array, ArrayData, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::buffer::{Buffer, NullBuffer};
use arrow::compute::concat;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;

use crate::gather::{
    check_indices, fixed_part_bytes, gather_in_range, gather_nulls, gather_packed, pack_column,
    row_groups,
};
use crate::mem::{pooled_buffer, recycle, take_vec_filled};

/// Batches prepared for repeated gathers; row `i` of the source is row
/// `i - start(b)` of the batch `b` holding it, batches in the order given.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, RecordBatch, StringViewArray};
/// let batch = |k: Vec<i64>, s: Vec<&str>| RecordBatch::try_from_iter([
///     ("k", Arc::new(Int64Array::from(k)) as _),
///     ("s", Arc::new(StringViewArray::from(s)) as _),
/// ]).unwrap();
/// let a = batch(vec![3, 1], vec!["c", "a value past twelve bytes"]);
/// let b = batch(vec![2], vec!["b"]);
/// let source = insitu_kernels::GatherSource::new(a.schema(), &[a, b]).unwrap();
/// let out = source.gather(&[1, 2, 0]).unwrap();
/// assert_eq!(out, batch(vec![1, 2, 3], vec!["a value past twelve bytes", "b", "c"]));
/// ```
pub struct GatherSource {
    schema: SchemaRef,
    rows: usize,
    groups: Vec<PackedGroup>,
    columns: Vec<ColumnSource>,
}

/// The fixed-width parts of some columns, packed into rows.
struct PackedGroup {
    rows: Vec<u8>,
    /// `(column, width)` of each member, in row order.
    members: Vec<(usize, usize)>,
}

enum ColumnSource {
    /// A member of a packed group, with what its gathered arrays share.
    Packed {
        nulls: Option<NullBuffer>,
        /// The data buffers of every batch, for view columns.
        data_buffers: Vec<Buffer>,
    },
    /// The batches' arrays, concatenated.
    Concatenated(ArrayRef),
}

impl GatherSource {
    /// Packs `batches` (all with the column types of `schema`) for
    /// gathering; the gathered batches have `schema`.
    pub fn new(schema: SchemaRef, batches: &[RecordBatch]) -> Result<Self, ArrowError> {
        let types = |s: &SchemaRef| -> Vec<DataType> {
            s.fields().iter().map(|f| f.data_type().clone()).collect()
        };
        if let Some(b) = batches
            .iter()
            .find(|b| types(&b.schema()) != types(&schema))
        {
            return Err(ArrowError::SchemaError(format!(
                "gather source batch has column types {:?}, expected {:?}",
                types(&b.schema()),
                types(&schema)
            )));
        }
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows > u32::MAX as usize {
            return Err(ArrowError::InvalidArgumentError(format!(
                "gather source of {rows} rows: u32 row indices reach {} rows",
                u32::MAX
            )));
        }
        let packable: Vec<(usize, usize)> = (schema.fields().iter().enumerate())
            .filter_map(|(i, f)| packed_width(f.data_type()).map(|w| (i, w)))
            .collect();
        let groups: Vec<PackedGroup> = row_groups(packable)
            .into_iter()
            .map(|members| pack_group(batches, members, rows))
            .collect::<Result<_, _>>()?;
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (i, field) in schema.fields().iter().enumerate() {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
            columns.push(match packed_width(field.data_type()) {
                Some(_) => ColumnSource::Packed {
                    nulls: concat_nulls(&arrays),
                    data_buffers: arrays
                        .iter()
                        .flat_map(|a| a.to_data().buffers()[1..].to_vec())
                        .collect(),
                },
                None if arrays.is_empty() => {
                    ColumnSource::Concatenated(arrow::array::new_empty_array(field.data_type()))
                }
                None => ColumnSource::Concatenated(concat(&arrays)?),
            });
        }
        Ok(Self {
            schema,
            rows,
            groups,
            columns,
        })
    }

    /// Rows in the source.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The rows at `indices` (global row numbers), as one batch.
    pub fn gather(&self, indices: &[u32]) -> Result<RecordBatch, ArrowError> {
        check_indices(indices, self.rows)?;
        let mut out: Vec<Option<ArrayRef>> = vec![None; self.columns.len()];
        for group in &self.groups {
            let widths: Vec<usize> = group.members.iter().map(|&(_, w)| w).collect();
            let values = gather_packed(&group.rows, &widths, indices);
            for (&(c, w), values) in group.members.iter().zip(values) {
                let ColumnSource::Packed {
                    nulls,
                    data_buffers,
                } = &self.columns[c]
                else {
                    unreachable!("group members are packed columns");
                };
                let mut buffers =
                    vec![pooled_buffer(values).slice_with_length(0, indices.len() * w)];
                buffers.extend(data_buffers.iter().cloned());
                let data = ArrayData::builder(self.schema.field(c).data_type().clone())
                    .len(indices.len())
                    .buffers(buffers)
                    .nulls(gather_nulls(nulls.as_ref(), indices));
                // SAFETY: every value is a bit copy of a source value, views
                // rebased to the same bytes in `data_buffers`; the buffer
                // holds exactly `len` values with 16-byte alignment.
                let data = unsafe { data.build_unchecked() };
                debug_assert!(data.validate_full().is_ok());
                out[c] = Some(make_array(data));
            }
        }
        let columns = (out.into_iter().zip(&self.columns))
            .map(|(done, source)| match (done, source) {
                (Some(array), _) => Ok(array),
                (None, ColumnSource::Concatenated(array)) => gather_in_range(array, indices),
                (None, ColumnSource::Packed { .. }) => unreachable!("packed columns are gathered"),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(indices.len()));
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
    }
}

impl Drop for GatherSource {
    fn drop(&mut self) {
        for group in self.groups.drain(..) {
            recycle(group.rows);
        }
    }
}

/// Width of the values a column of type `dt` packs into rows: primitives
/// and views. Dictionary keys are not packed: batches may have different
/// dictionaries.
fn packed_width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::Utf8View | DataType::BinaryView => Some(16),
        DataType::Boolean => None,
        dt if dt.is_primitive() => dt.primitive_width(),
        _ => None,
    }
}

/// Packs the `members` columns of every batch into rows, batch after batch.
fn pack_group(
    batches: &[RecordBatch],
    members: Vec<(usize, usize)>,
    rows: usize,
) -> Result<PackedGroup, ArrowError> {
    let row_width: usize = members.iter().map(|&(_, w)| w).sum();
    let mut packed: Vec<u8> = take_vec_filled(rows * row_width);
    let mut at = 0;
    // Buffers of each member's earlier batches: where this batch's view
    // buffer indices start in the shared list.
    let mut buffer_bases = vec![0usize; members.len()];
    for batch in batches {
        let n = batch.num_rows();
        let dst = &mut packed[at * row_width..(at + n) * row_width];
        let mut offset = 0;
        for (m, &(c, w)) in members.iter().enumerate() {
            let data = batch.column(c).to_data();
            let values = fixed_part_bytes(&data, w);
            let is_view = matches!(data.data_type(), DataType::Utf8View | DataType::BinaryView);
            let base = buffer_bases[m];
            buffer_bases[m] += data.buffers().len() - 1;
            if u32::try_from(buffer_bases[m]).is_err() {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "column {c}: {} view data buffers exceed u32 buffer indices",
                    buffer_bases[m]
                )));
            }
            match is_view && base > 0 {
                true => pack_views(values, dst, row_width, offset, base as u32),
                false => pack_column(values, dst, row_width, offset, w),
            }
            offset += w;
        }
        at += n;
    }
    Ok(PackedGroup {
        rows: packed,
        members,
    })
}

/// Packs 16-byte views at byte `offset` of consecutive rows, adding `base`
/// to the buffer index of each view that points into a data buffer.
fn pack_views(values: &[u8], rows: &mut [u8], row_width: usize, offset: usize, base: u32) {
    let (views, _) = values.as_chunks::<16>();
    for (v, row) in views.iter().zip(rows.chunks_exact_mut(row_width)) {
        let mut view = u128::from_le_bytes(*v);
        if (view as u32) > 12 {
            // The buffer index is bits 64..96; the caller checked that
            // every rebased index fits, so nothing carries past bit 96.
            view += (base as u128) << 64;
        }
        row[offset..offset + 16].copy_from_slice(&view.to_le_bytes());
    }
}

/// The validity of the arrays one after another; `None` if none has nulls.
fn concat_nulls(arrays: &[&dyn Array]) -> Option<NullBuffer> {
    if arrays.iter().all(|a| a.null_count() == 0) {
        return None;
    }
    let mut bits = BooleanBufferBuilder::new(arrays.iter().map(|a| a.len()).sum());
    for a in arrays {
        match a.nulls() {
            Some(n) => bits.append_buffer(n.inner()),
            None => bits.append_n(a.len(), true),
        }
    }
    Some(NullBuffer::new(bits.finish()))
}
