//! [`GatherSource::scatter`]: every output batch of an order written at
//! once, each input row copied to its place as the input is read.
//!
//! ```text
//!   input batches (read once, in order)      output batches (arenas)
//!  ┌──────────────┐  dest[row] = (batch, slot) ┌────────┐ key a
//!  │ a c b a b c  │ ─────────────────────────▶ ├────────┤ key b
//!  └──────────────┘  one write stream per run  ├────────┤ key c
//!                    of the order              └────────┘
//! ```
//!
//! A stable sort of a key with few values (ORDER BY l_shipmode: 7) leaves
//! an order of few ascending runs. Gathering by it reads every column once
//! per run; packing rows first reads and writes the table twice more.
//! Scattering reads each column once, as a stream, and writes each run's
//! rows as a stream too: one pass over the table.

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::error::ArrowError;
use std::sync::Arc;

use super::{rebase_view, widen_decimal, ColumnSource, GatherSource};
use crate::arena::{ChunkArena, OutputBuffer};
use crate::gather::{fixed_part_bytes, gather_in_range};
use crate::mem::{recycle, take_vec};

/// Orders of at most this many ascending runs are scattered
/// ([`super::SourceLayout::Scattered`]): each run is one write stream per
/// column, and the line each is filling (1 MiB for this many) stays in
/// L2 until it is full. ORDER BY over all of TPC-H SF1 lineitem, two
/// devices, medians of 5: l_shipdate (2526 values) 0.90 s packed and
/// gathered, 0.81 s scattered; l_suppkey (10000) 0.91 s, 0.85 s; but
/// l_partkey (200000, runs of 15 rows) 1.14 s, 1.24 s.
pub(crate) const SCATTER_RUNS_MAX: usize = 16 * 1024;

/// The output batches of [`GatherSource::scatter`], in order.
pub struct ScatteredBatches<'a> {
    source: &'a GatherSource,
    /// Each part's rows of the order.
    chunks: std::slice::Chunks<'a, u32>,
    parts: std::vec::IntoIter<ScatteredPart>,
}

/// One output batch's arena and the scattered values of its columns
/// (`None` for columns gathered when the batch is built).
struct ScatteredPart {
    arena: ChunkArena,
    values: Vec<Option<OutputBuffer>>,
}

/// Rows of each scattered batch: the largest power of two up to
/// `batch_rows`, so a row's place splits into batch and slot by a shift.
fn scatter_batch_rows(batch_rows: usize) -> usize {
    1 << (usize::BITS - 1 - batch_rows.max(1).leading_zeros())
}

impl GatherSource {
    /// The rows in `order` (a permutation of the source's rows), as
    /// batches of the largest power of two of rows up to `batch_rows`.
    ///
    /// Every fixed-width column is written at once, for all batches, into
    /// their arenas: each input row's values are copied to the row's
    /// place as the batches are read in order, so an order of few
    /// ascending runs (see [`super::SourceLayout::Scattered`]) reads and
    /// writes each column as streams. Other columns, validity and view
    /// shrinking are done per batch as the iterator yields it. The source
    /// must keep its columns in their batches
    /// ([`super::SourceLayout::Columns`] or `Scattered`).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use arrow::array::{Int64Array, RecordBatch, StringViewArray};
    /// # use insitu_kernels::{GatherSource, SourceLayout};
    /// let batch = RecordBatch::try_from_iter([
    ///     ("k", Arc::new(Int64Array::from(vec![2, 1, 2, 1])) as _),
    ///     ("s", Arc::new(StringViewArray::from(vec!["w", "x", "y", "z"])) as _),
    /// ]).unwrap();
    /// let source =
    ///     GatherSource::with_layout(batch.schema(), &[batch], SourceLayout::Scattered).unwrap();
    /// let out: Vec<RecordBatch> =
    ///     source.scatter(&[1, 3, 0, 2], 3).unwrap().collect::<Result<_, _>>().unwrap();
    /// assert_eq!(out.iter().map(|b| b.num_rows()).collect::<Vec<_>>(), [2, 2]);
    /// let s = out[1].column(1).as_any().downcast_ref::<StringViewArray>().unwrap();
    /// assert_eq!(s.value(0), "w");
    /// ```
    pub fn scatter<'a>(
        &'a self,
        order: &'a [u32],
        batch_rows: usize,
    ) -> Result<ScatteredBatches<'a>, ArrowError> {
        if !self.groups.is_empty() {
            return Err(ArrowError::InvalidArgumentError(
                "scatter needs a gather source that keeps its columns in their batches".into(),
            ));
        }
        let batch_rows = scatter_batch_rows(batch_rows);
        let dest = self.destinations(order)?;
        let mut parts: Vec<ScatteredPart> = (order.chunks(batch_rows))
            .map(|chunk| self.scattered_part(chunk.len()))
            .collect();
        let shift = batch_rows.trailing_zeros();
        for c in 0..self.columns.len() {
            let ColumnSource::Batched {
                width,
                widened,
                parts: inputs,
                view_bases,
                ..
            } = &self.columns[c]
            else {
                continue;
            };
            let mut outs: Vec<&mut [u8]> = (parts.iter_mut())
                .map(|p| p.values[c].as_mut().expect("batched columns").bytes_mut())
                .collect();
            for (b, input) in inputs.iter().enumerate() {
                let rows = self.batch_starts[b]..self.batch_starts[b + 1];
                let dest = &dest[rows];
                if *widened {
                    scatter_widened(fixed_part_bytes(input, 8), dest, shift, &mut outs);
                    continue;
                }
                let values = fixed_part_bytes(input, *width);
                match (*width, view_bases) {
                    (16, Some(bases)) => scatter_views(values, dest, shift, bases[b], &mut outs),
                    (1, _) => scatter_w::<1>(values, dest, shift, &mut outs),
                    (2, _) => scatter_w::<2>(values, dest, shift, &mut outs),
                    (4, _) => scatter_w::<4>(values, dest, shift, &mut outs),
                    (8, _) => scatter_w::<8>(values, dest, shift, &mut outs),
                    (16, None) => scatter_w::<16>(values, dest, shift, &mut outs),
                    (w, _) => scatter_any(w, values, dest, shift, &mut outs),
                }
            }
        }
        recycle(dest);
        Ok(ScatteredBatches {
            source: self,
            chunks: order.chunks(batch_rows),
            parts: parts.into_iter(),
        })
    }

    /// Each source row's place in `order`: with batches of a power of two
    /// rows, `(batch << shift) | slot`. Checks that `order` is a
    /// permutation of the source's rows (every row once); places fit in
    /// u32 as the source's row count does.
    fn destinations(&self, order: &[u32]) -> Result<Vec<u32>, ArrowError> {
        if order.len() != self.rows {
            return Err(ArrowError::InvalidArgumentError(format!(
                "scatter order of {} rows for a source of {} rows",
                order.len(),
                self.rows
            )));
        }
        // Pooled: a device's sorts reuse memory already faulted in. One
        // fill, with the marker of a place not yet taken.
        let mut dest: Vec<u32> = take_vec(order.len());
        dest.resize(order.len(), u32::MAX);
        let mut repeated = false;
        for (place, &row) in order.iter().enumerate() {
            let slot = dest.get_mut(row as usize).ok_or_else(|| {
                ArrowError::InvalidArgumentError(format!(
                    "scatter index {row} out of range for {} rows",
                    self.rows
                ))
            })?;
            repeated |= *slot != u32::MAX;
            *slot = place as u32;
        }
        if repeated {
            recycle(dest);
            return Err(ArrowError::InvalidArgumentError(
                "scatter order repeats a row: not a permutation".into(),
            ));
        }
        Ok(dest)
    }

    /// An arena for an output batch of `rows` rows, with a region for each
    /// fixed-width column left in the batches.
    fn scattered_part(&self, rows: usize) -> ScatteredPart {
        let arena = self.arena_for(rows);
        let values = (self.columns.iter())
            .map(|source| match source {
                ColumnSource::Batched { width, .. } => {
                    Some(OutputBuffer::in_arena_or_pooled(Some(&arena), rows * width))
                }
                _ => None,
            })
            .collect();
        ScatteredPart { arena, values }
    }

    /// The output batch of the order's rows `indices`, from its scattered
    /// values and the columns gathered now.
    fn scattered_batch(
        &self,
        part: ScatteredPart,
        indices: &[u32],
    ) -> Result<RecordBatch, ArrowError> {
        let ScatteredPart { arena, values } = part;
        let columns = (values.into_iter().zip(&self.columns).enumerate())
            .map(|(c, (values, source))| match (values, source) {
                (
                    Some(values),
                    ColumnSource::Batched {
                        nulls,
                        data_buffers,
                        ..
                    },
                ) => Ok(self.fixed_width_array(
                    c,
                    values,
                    nulls,
                    data_buffers,
                    indices,
                    Some(&arena),
                )),
                (None, ColumnSource::Concatenated(array)) => gather_in_range(array, indices),
                _ => unreachable!("scattered parts hold exactly the batched columns"),
            })
            .collect::<Result<Vec<ArrayRef>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(indices.len()));
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
    }
}

impl Iterator for ScatteredBatches<'_> {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (part, indices) = (self.parts.next()?, self.chunks.next()?);
        Some(self.source.scattered_batch(part, indices))
    }
}

/// Copies each `W`-byte value to the batch and slot its place (in
/// `dest`) names.
fn scatter_w<const W: usize>(values: &[u8], dest: &[u32], shift: u32, outs: &mut [&mut [u8]]) {
    let (values, _) = values.as_chunks::<W>();
    let mask = (1usize << shift) - 1;
    for (v, &d) in values.iter().zip(dest) {
        let (batch, slot) = ((d as usize) >> shift, d as usize & mask);
        outs[batch][slot * W..][..W].copy_from_slice(v);
    }
}

/// [`scatter_w`] for i64 decimals, each written as an i128 one.
fn scatter_widened(values: &[u8], dest: &[u32], shift: u32, outs: &mut [&mut [u8]]) {
    let (values, _) = values.as_chunks::<8>();
    let mask = (1usize << shift) - 1;
    for (v, &d) in values.iter().zip(dest) {
        let (batch, slot) = ((d as usize) >> shift, d as usize & mask);
        outs[batch][slot * 16..][..16].copy_from_slice(&widen_decimal(*v));
    }
}

/// [`scatter_w`] for views, each rebased by its batch's `base` on the way.
fn scatter_views(values: &[u8], dest: &[u32], shift: u32, base: u32, outs: &mut [&mut [u8]]) {
    let (views, _) = values.as_chunks::<16>();
    let mask = (1usize << shift) - 1;
    for (v, &d) in views.iter().zip(dest) {
        let (batch, slot) = ((d as usize) >> shift, d as usize & mask);
        let view = rebase_view(u128::from_le_bytes(*v), base);
        outs[batch][slot * 16..][..16].copy_from_slice(&view.to_le_bytes());
    }
}

/// [`scatter_w`] with the width known at run time (decimal256).
fn scatter_any(w: usize, values: &[u8], dest: &[u32], shift: u32, outs: &mut [&mut [u8]]) {
    let mask = (1usize << shift) - 1;
    for (v, &d) in values.chunks_exact(w).zip(dest) {
        let (batch, slot) = ((d as usize) >> shift, d as usize & mask);
        outs[batch][slot * w..][..w].copy_from_slice(v);
    }
}
