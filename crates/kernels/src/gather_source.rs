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
//! all batches' buffers, where consecutive batches that share theirs (one
//! row group's batches over its dictionary page) share one entry.
//! Decimals that fit in i64 and strings of at most 7 bytes are packed in 8
//! bytes and widened again when gathered (see `Packing`); decimals a scan
//! read as Decimal64 for a schema of Decimal128 (see [`widens_to`]) are
//! packed, gathered and scattered as they are and widened as they are
//! written out. Other columns
//! (booleans, dictionaries, offset strings, nested types) are concatenated
//! once and gathered with `take`.
//!
//! An order that walks the batches nearly row by row (input already
//! nearly sorted, such as a table clustered on the key) reads every column
//! as a stream anyway; for it [`SourceLayout::Columns`] skips the packing,
//! and its copy into fresh memory, and gathers each fixed-width column
//! from the batches where it lies. An order of few ascending runs (a key
//! of few values) is written whole by [`GatherSource::scatter`] instead
//! ([`SourceLayout::Scattered`], in `scatter.rs`).

use std::sync::Arc;

use arrow::array::BooleanBufferBuilder;
use arrow::array::{
    make_array, Array, ArrayData, ArrayRef, GenericByteViewArray, RecordBatch, RecordBatchOptions,
};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::compute::concat;
use arrow::datatypes::{ByteViewType, DataType, SchemaRef};
use arrow::error::ArrowError;

use crate::arena::{ChunkArena, OutputBuffer};
use crate::gather::{
    check_indices, fixed_part_bytes, gather_in_range, gather_nulls, gather_packed_with,
    member_offsets, pack_column, row_groups, unpack_column, ROW_BLOCK_BYTES,
};
use crate::mem::{pooled_buffer, recycle, take_vec, take_vec_filled};
use crate::views::shrink_views_in_place;
use crate::SHRINK_SLACK_BYTES;

mod scatter;
pub use scatter::ScatteredBatches;

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
    /// Global row number of each batch's first row, then `rows`.
    batch_starts: Vec<usize>,
    groups: Vec<PackedGroup>,
    /// How each column's values sit in the packed rows.
    packings: Vec<Packing>,
    columns: Vec<ColumnSource>,
}

/// How a [`GatherSource`] keeps its fixed-width columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceLayout {
    /// Packed into rows once, from every batch: a random gather then costs
    /// one cache miss per row and row group instead of one per column.
    Rows,
    /// Left in the batches, each column gathered where it lies: no packing
    /// pass and no memory for packed rows. For orders that read the
    /// batches nearly row by row.
    Columns,
    /// Left in the batches as for `Columns`, for an order of few ascending
    /// runs (a stable sort of a key with few values) to be written by
    /// [`GatherSource::scatter`]: each column read once as a stream, each
    /// run written as one.
    Scattered,
}

/// An order reads its batches nearly row by row when at least this many
/// of every 1024 steps go forward by at most [`SHORT_STEP_ROWS`].
const FORWARD_STEPS_PER_1024_MIN: usize = 960;

/// Steps this short (in rows) read each cache line of a column about
/// once. Longer ones do not pay: a stable sort of a key with K values
/// leaves K ascending runs, each reading every line of every column again
/// (ORDER BY l_shipmode, 7 runs with steps of ~7 rows: gathering from the
/// batches took a quarter of the device's time and the query was no
/// faster than through packed rows).
const SHORT_STEP_ROWS: u32 = 2;

impl SourceLayout {
    /// [`SourceLayout::Columns`] when nearly every step of `order` goes
    /// forward one or two rows; else [`SourceLayout::Scattered`] when it
    /// has at most 16Ki ascending runs; else [`SourceLayout::Rows`].
    ///
    /// ```
    /// use insitu_kernels::SourceLayout;
    /// // Input that was sorted already but for a few rows.
    /// let mut nearly: Vec<u32> = (0..5000).collect();
    /// nearly.swap(10, 4000);
    /// assert_eq!(SourceLayout::for_order(&nearly), SourceLayout::Columns);
    /// // A stable sort of a key with 7 values: 7 runs with steps of ~7 rows.
    /// let runs: Vec<u32> = (0..7).flat_map(|k| (k..5000).step_by(7)).collect();
    /// assert_eq!(SourceLayout::for_order(&runs), SourceLayout::Scattered);
    /// // A random order: about one run per two rows.
    /// let random: Vec<u32> = (0..1u32 << 16).map(|i| i.wrapping_mul(2654435761) >> 16).collect();
    /// assert_eq!(SourceLayout::for_order(&random), SourceLayout::Rows);
    /// ```
    pub fn for_order(order: &[u32]) -> Self {
        let steps = order.len().saturating_sub(1);
        let (mut forward, mut descents) = (0, 0);
        for w in order.windows(2) {
            forward += (w[1] > w[0] && w[1] - w[0] <= SHORT_STEP_ROWS) as usize;
            descents += (w[1] < w[0]) as usize;
        }
        if steps > 0 && forward * 1024 >= steps * FORWARD_STEPS_PER_1024_MIN {
            SourceLayout::Columns
        } else if descents < scatter::SCATTER_RUNS_MAX {
            SourceLayout::Scattered
        } else {
            SourceLayout::Rows
        }
    }
}

/// The fixed-width parts of some columns, packed into rows.
struct PackedGroup {
    rows: Vec<u8>,
    /// `(column, width)` of each member, in row order.
    members: Vec<(usize, usize)>,
}

/// How a packed column's values are stored in the rows. Narrower rows
/// mean fewer cache lines per gathered row: lineitem's 184 bytes of
/// fixed-width parts take three 64-byte row groups as they are, two with
/// its decimals and short strings narrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    /// The values' bytes as they are.
    Full,
    /// 16-byte decimals that all fit in i64: their low 8 bytes,
    /// sign-extended again when gathered.
    DecimalAsI64,
    /// Views that are all inline and at most 7 bytes long: the length's
    /// low byte, then the first 7 bytes of the value, widened again when
    /// gathered.
    ShortViewAs8,
}

/// The longest view [`Packing::ShortViewAs8`] holds.
const SHORT_VIEW_BYTES_MAX: u32 = 7;

impl Packing {
    /// How column `c` (of type `dt`) of `batches` is expected to pack:
    /// decimals of precision 18 or less (below 10^18, so within i64) and
    /// views whose first batch is all short, narrowed. Packing checks
    /// every value as it goes (null slots included, so no validity is
    /// read), and packs again in full if one does not fit.
    fn expect(c: usize, dt: &DataType, batches: &[RecordBatch]) -> Self {
        let first_short = || {
            (batches.iter().find(|b| b.num_rows() > 0))
                .is_some_and(|b| views_short(fixed_part_bytes(&b.column(c).to_data(), 16)))
        };
        match dt {
            DataType::Decimal128(precision, _) if *precision <= 18 => Packing::DecimalAsI64,
            DataType::Utf8View | DataType::BinaryView if first_short() => Packing::ShortViewAs8,
            _ => Packing::Full,
        }
    }

    /// Bytes a value of a column of `width` bytes takes in a row.
    fn packed_width(self, width: usize) -> usize {
        match self {
            Packing::Full => width,
            Packing::DecimalAsI64 | Packing::ShortViewAs8 => 8,
        }
    }

    /// Bytes a gathered value takes again, from `packed` bytes in a row.
    fn unpacked_width(self, packed: usize) -> usize {
        match self {
            Packing::Full => packed,
            Packing::DecimalAsI64 | Packing::ShortViewAs8 => 16,
        }
    }
}

/// Whether a column of type `narrow` in the batches is gathered as type
/// `wide`: decimals that a scan read as Decimal64 (8 bytes, not 16)
/// widen again to Decimal128 of the same precision and scale as they are
/// written out.
///
/// ```
/// use arrow::datatypes::DataType::{Decimal128, Decimal64};
/// assert!(insitu_kernels::widens_to(&Decimal64(15, 2), &Decimal128(15, 2)));
/// assert!(!insitu_kernels::widens_to(&Decimal64(15, 2), &Decimal128(16, 2)));
/// ```
pub fn widens_to(narrow: &DataType, wide: &DataType) -> bool {
    matches!((narrow, wide),
        (DataType::Decimal64(p, s), DataType::Decimal128(q, t)) if p == q && s == t)
}

/// Which columns `batches` hold narrower than `schema` (decimals a scan
/// read as Decimal64, see [`widens_to`]): every batch alike, each column
/// of `schema`'s type or widening to it.
fn widened_columns(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<bool>, ArrowError> {
    let want = schema.fields();
    let mut widened: Option<Vec<bool>> = None;
    for b in batches {
        let got = b.schema_ref().fields();
        let fits = got.len() == want.len()
            && (got.iter().zip(want)).all(|(g, w)| {
                g.data_type() == w.data_type() || widens_to(g.data_type(), w.data_type())
            });
        if !fits {
            let types = |f: &arrow::datatypes::Fields| -> Vec<DataType> {
                f.iter().map(|f| f.data_type().clone()).collect()
            };
            return Err(ArrowError::SchemaError(format!(
                "gather source batch has column types {:?}, expected {:?}",
                types(got),
                types(want)
            )));
        }
        let this: Vec<bool> = (got.iter().zip(want))
            .map(|(g, w)| g.data_type() != w.data_type())
            .collect();
        match &widened {
            Some(first) if *first != this => {
                return Err(ArrowError::SchemaError(
                    "gather source batches differ in which columns are widened".into(),
                ))
            }
            Some(_) => {}
            None => widened = Some(this),
        }
    }
    Ok(widened.unwrap_or_else(|| vec![false; want.len()]))
}

/// Whether every view in `values` is inline and at most
/// [`SHORT_VIEW_BYTES_MAX`] bytes long.
fn views_short(values: &[u8]) -> bool {
    let (views, _) = values.as_chunks::<16>();
    let longest = views.iter().fold(0u32, |longest, v| {
        longest.max(u32::from_le_bytes(v[..4].try_into().expect("4 bytes")))
    });
    longest <= SHORT_VIEW_BYTES_MAX
}

/// A short view's 8 packed bytes: its length (below 256), then the first
/// 7 bytes of its value (view bytes 4..11).
#[inline(always)]
fn narrow_view(view: u128) -> u64 {
    (view as u8 as u64) | ((view >> 32) as u64) << 8
}

/// An i64 decimal's little-endian bytes as the i128 one's (sign-extended).
#[inline(always)]
pub(crate) fn widen_decimal(narrow: [u8; 8]) -> [u8; 16] {
    (i64::from_le_bytes(narrow) as i128).to_le_bytes()
}

/// The view [`narrow_view`] packed.
#[inline(always)]
fn widen_view(narrowed: u64) -> u128 {
    (narrowed & 0xff) as u128 | ((narrowed >> 8) as u128) << 32
}

/// Reads the 8-byte narrowed values at byte `offset` of consecutive rows
/// into `out` as the 16-byte values they stand for.
fn unpack_widened(packing: Packing, rows: &[u8], row_width: usize, offset: usize, out: &mut [u8]) {
    let (out, _) = out.as_chunks_mut::<16>();
    let narrowed = rows
        .chunks_exact(row_width)
        .map(|row| u64::from_le_bytes(row[offset..offset + 8].try_into().expect("8 bytes")));
    // One loop per packing, so each is a plain conversion loop.
    match packing {
        Packing::DecimalAsI64 => {
            for (o, v) in out.iter_mut().zip(narrowed) {
                *o = widen_decimal(v.to_le_bytes());
            }
        }
        Packing::ShortViewAs8 => {
            for (o, v) in out.iter_mut().zip(narrowed) {
                *o = widen_view(v).to_le_bytes();
            }
        }
        Packing::Full => unreachable!("full values are not narrowed"),
    }
}

enum ColumnSource {
    /// A member of a packed group, with what its gathered arrays share.
    Packed {
        nulls: Option<NullBuffer>,
        /// The data buffers of every batch, for view columns.
        data_buffers: Vec<Buffer>,
    },
    /// A fixed-width column left in its batches ([`SourceLayout::Columns`]).
    Batched {
        /// Bytes per gathered value.
        width: usize,
        /// The batches hold i64 decimals, gathered as i128 ones.
        widened: bool,
        /// Each batch's array of this column.
        parts: Vec<ArrayData>,
        /// For view columns, where each batch's data buffers start in
        /// `data_buffers` (what its views' buffer indices are rebased by).
        view_bases: Option<Vec<u32>>,
        nulls: Option<NullBuffer>,
        data_buffers: Vec<Buffer>,
    },
    /// The batches' arrays, concatenated.
    Concatenated(ArrayRef),
}

impl GatherSource {
    /// Packs `batches` (all with the column types of `schema`) for
    /// gathering; the gathered batches have `schema`.
    pub fn new(schema: SchemaRef, batches: &[RecordBatch]) -> Result<Self, ArrowError> {
        Self::with_layout(schema, batches, SourceLayout::Rows)
    }

    /// Prepares `batches` for gathering with the fixed-width columns kept
    /// as `layout` says (see [`SourceLayout::for_order`]).
    pub fn with_layout(
        schema: SchemaRef,
        batches: &[RecordBatch],
        layout: SourceLayout,
    ) -> Result<Self, ArrowError> {
        let widened = widened_columns(&schema, batches)?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows > u32::MAX as usize {
            return Err(ArrowError::InvalidArgumentError(format!(
                "gather source of {rows} rows: u32 row indices reach {} rows",
                u32::MAX
            )));
        }
        let mut packings: Vec<Packing> = (schema.fields().iter().enumerate())
            .map(|(c, f)| match layout {
                SourceLayout::Rows => Packing::expect(c, f.data_type(), batches),
                SourceLayout::Columns | SourceLayout::Scattered => Packing::Full,
            })
            .collect();
        // Per column: for views, where each batch's data buffers start in
        // the list of all of them (what its buffer indices are rebased by).
        let mut view_bases: Vec<Option<Vec<u32>>> = vec![];
        let mut view_buffers: Vec<Vec<Buffer>> = vec![];
        for (c, f) in schema.fields().iter().enumerate() {
            let (bases, buffers) = match f.data_type() {
                DataType::Utf8View | DataType::BinaryView => {
                    let data: Vec<ArrayData> =
                        batches.iter().map(|b| b.column(c).to_data()).collect();
                    let list =
                        data_buffer_list(data.iter().map(|d| &d.buffers()[1..])).map_err(|e| {
                            ArrowError::InvalidArgumentError(format!("column {c}: {e}"))
                        })?;
                    (Some(list.bases), list.buffers)
                }
                _ => (None, vec![]),
            };
            view_bases.push(bases);
            view_buffers.push(buffers);
        }
        let groups: Vec<PackedGroup> = match layout {
            // Each retry packs one column more in full: at most one per
            // narrowed column.
            SourceLayout::Rows => loop {
                match pack_groups(&schema, batches, &packings, &view_bases, rows) {
                    Ok(groups) => break groups,
                    Err(misfits) => misfits
                        .into_iter()
                        .for_each(|c| packings[c] = Packing::Full),
                }
            },
            SourceLayout::Columns | SourceLayout::Scattered => vec![],
        };
        let mut batch_starts = Vec::with_capacity(batches.len() + 1);
        batch_starts.push(0);
        for b in batches {
            batch_starts.push(batch_starts.last().copied().unwrap_or(0) + b.num_rows());
        }
        let mut columns = Vec::with_capacity(schema.fields().len());
        let per_column = view_bases.into_iter().zip(view_buffers);
        for ((i, field), (view_bases, data_buffers)) in
            schema.fields().iter().enumerate().zip(per_column)
        {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(i).as_ref()).collect();
            columns.push(match (packed_width(field.data_type()), layout) {
                (Some(_), SourceLayout::Rows) => ColumnSource::Packed {
                    nulls: concat_nulls(&arrays),
                    data_buffers,
                },
                (Some(width), SourceLayout::Columns | SourceLayout::Scattered) => {
                    ColumnSource::Batched {
                        width,
                        widened: widened[i],
                        parts: arrays.iter().map(|a| a.to_data()).collect(),
                        view_bases,
                        nulls: concat_nulls(&arrays),
                        data_buffers,
                    }
                }
                (None, _) if arrays.is_empty() => {
                    ColumnSource::Concatenated(arrow::array::new_empty_array(field.data_type()))
                }
                (None, _) => ColumnSource::Concatenated(concat(&arrays)?),
            });
        }
        Ok(Self {
            schema,
            rows,
            batch_starts,
            groups,
            packings,
            columns,
        })
    }

    /// Rows in the source.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The rows at `indices` (global row numbers), as one batch.
    ///
    /// The batch's fixed-width buffers, and the compacted strings of view
    /// columns, lie in one [`ChunkArena`] with room for a message header,
    /// so that an encoder can ship them without copying.
    pub fn gather(&self, indices: &[u32]) -> Result<RecordBatch, ArrowError> {
        check_indices(indices, self.rows)?;
        let arena = self.arena_for(indices.len());
        let arena = Some(&arena);
        let mut out: Vec<Option<ArrayRef>> = vec![None; self.columns.len()];
        for group in &self.groups {
            let widths: Vec<usize> = group.members.iter().map(|&(_, w)| w).collect();
            let out_widths: Vec<usize> = (group.members.iter())
                .map(|&(c, w)| self.packings[c].unpacked_width(w))
                .collect();
            let unpack =
                |m: usize, rows: &[u8], row_width: usize, offset: usize, out: &mut [u8]| match self
                    .packings[group.members[m].0]
                {
                    Packing::Full => unpack_column(rows, row_width, offset, widths[m], out),
                    packing => unpack_widened(packing, rows, row_width, offset, out),
                };
            let values =
                gather_packed_with(&group.rows, &widths, &out_widths, indices, unpack, arena);
            for (&(c, _), values) in group.members.iter().zip(values) {
                let ColumnSource::Packed {
                    nulls,
                    data_buffers,
                } = &self.columns[c]
                else {
                    unreachable!("group members are packed columns");
                };
                out[c] =
                    Some(self.fixed_width_array(c, values, nulls, data_buffers, indices, arena));
            }
        }
        let columns = (out.into_iter().zip(&self.columns).enumerate())
            .map(|(c, (done, source))| match (done, source) {
                (Some(array), _) => Ok(array),
                (None, ColumnSource::Concatenated(array)) => gather_in_range(array, indices),
                (
                    None,
                    ColumnSource::Batched {
                        width,
                        widened,
                        parts,
                        view_bases,
                        nulls,
                        data_buffers,
                    },
                ) => {
                    let part_width = if *widened { 8 } else { *width };
                    let parts: Vec<&[u8]> = parts
                        .iter()
                        .map(|p| fixed_part_bytes(p, part_width))
                        .collect();
                    let source = BatchedColumn {
                        parts: &parts,
                        starts: &self.batch_starts,
                        view_bases: view_bases.as_deref(),
                    };
                    let values = match widened {
                        true => source.gather_widened(indices, arena),
                        false => source.gather(*width, indices, arena),
                    };
                    Ok(self.fixed_width_array(c, values, nulls, data_buffers, indices, arena))
                }
                (None, ColumnSource::Packed { .. }) => unreachable!("packed columns are gathered"),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(indices.len()));
        RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
    }

    /// An arena for a batch of `rows` rows: room for its fixed-width
    /// values and, for view columns, their strings at the source's
    /// average bytes per row (what compaction copies), plus slack for
    /// what an encoder copies in (validity, small dictionary pages).
    fn arena_for(&self, rows: usize) -> ChunkArena {
        let mut body = ARENA_SLACK_BYTES;
        let mut buffers = 0;
        for (c, source) in self.columns.iter().enumerate() {
            let data_buffers = match source {
                ColumnSource::Packed { data_buffers, .. }
                | ColumnSource::Batched { data_buffers, .. } => data_buffers,
                ColumnSource::Concatenated(array) => {
                    let bytes = array.get_array_memory_size() / self.rows.max(1);
                    body += (rows * bytes).next_multiple_of(64) + 64;
                    buffers += 3;
                    continue;
                }
            };
            let width = packed_width(self.schema.field(c).data_type()).unwrap_or(16);
            body += (rows * width).next_multiple_of(64) + (rows.div_ceil(8) + 64);
            let data: usize = data_buffers.iter().map(|b| b.len()).sum();
            body += (rows * data).div_ceil(self.rows.max(1)) * 5 / 4;
            body += data.min(SHRINK_SLACK_BYTES) + 64;
            buffers += 2 + data_buffers.len();
        }
        ChunkArena::new(HEADER_BYTES_BASE + buffers * HEADER_BYTES_PER_BUFFER, body)
    }

    /// Column `c` from its gathered values, with the validity of the
    /// gathered rows; view columns shrunk as [`crate::shrink_views`] would
    /// (strings compacted into `arena`) or sharing the source's buffers.
    fn fixed_width_array(
        &self,
        c: usize,
        mut values: OutputBuffer,
        nulls: &Option<NullBuffer>,
        data_buffers: &[Buffer],
        indices: &[u32],
        arena: Option<&ChunkArena>,
    ) -> ArrayRef {
        let nulls = gather_nulls(nulls.as_ref(), indices);
        let data_type = self.schema.field(c).data_type();
        let data_buffers = match data_type {
            DataType::Utf8View | DataType::BinaryView => {
                shrink_views_in_place(values.u128s_mut(), data_buffers, nulls.as_ref(), |bytes| {
                    OutputBuffer::in_arena_or_pooled(arena, bytes)
                })
            }
            _ => data_buffers.to_vec(),
        };
        let mut buffers = vec![values.into_buffer()];
        buffers.extend(data_buffers);
        let data = ArrayData::builder(data_type.clone())
            .len(indices.len())
            .buffers(buffers)
            .nulls(nulls);
        // SAFETY: every value is a bit copy of a source value, views
        // rebased to the same bytes in `data_buffers` (or, compacted, to a
        // copy of them); the buffer holds exactly `len` values, 64- or
        // 16-byte aligned.
        let data = unsafe { data.build_unchecked() };
        debug_assert!(data.validate_full().is_ok());
        make_array(data)
    }
}

/// Bytes of a message header besides its buffer entries.
const HEADER_BYTES_BASE: usize = 1024;
/// Header bytes per buffer (its offset and length, and its share of a
/// field node).
const HEADER_BYTES_PER_BUFFER: usize = 32;
/// Room in an arena beyond the estimate of what a batch holds.
const ARENA_SLACK_BYTES: usize = 64 << 10;

/// One fixed-width column left in its batches.
struct BatchedColumn<'a> {
    /// Each batch's values, `w` bytes per row.
    parts: &'a [&'a [u8]],
    /// Global row of each batch's first row, then the total.
    starts: &'a [usize],
    view_bases: Option<&'a [u32]>,
}

impl BatchedColumn<'_> {
    /// The `w`-byte values at `indices` (checked to be below the total),
    /// 16-byte aligned, in `arena` while it has room.
    fn gather(&self, w: usize, indices: &[u32], arena: Option<&ChunkArena>) -> OutputBuffer {
        let mut values = OutputBuffer::in_arena_or_pooled(arena, indices.len() * w);
        let out = values.bytes_mut();
        match (w, self.view_bases) {
            (16, Some(bases)) => self.gather_views(bases, indices, out),
            (1, _) => self.gather_w::<1>(indices, out),
            (2, _) => self.gather_w::<2>(indices, out),
            (4, _) => self.gather_w::<4>(indices, out),
            (8, _) => self.gather_w::<8>(indices, out),
            (16, None) => self.gather_w::<16>(indices, out),
            _ => self.gather_any(w, indices, out),
        }
        values
    }

    /// The i64 decimals at `indices` as i128 ones, in `arena` while it
    /// has room.
    fn gather_widened(&self, indices: &[u32], arena: Option<&ChunkArena>) -> OutputBuffer {
        let mut values = OutputBuffer::in_arena_or_pooled(arena, indices.len() * 16);
        let (out, _) = values.bytes_mut().as_chunks_mut::<16>();
        let mut at = BatchCursor::new(self.starts);
        for (&row, o) in indices.iter().zip(out) {
            let (b, local) = at.locate(row as usize);
            let (narrow, _) = self.parts[b].as_chunks::<8>();
            *o = widen_decimal(narrow[local]);
        }
        values
    }

    /// Other widths (decimal256's 32 bytes), with the width known at run
    /// time.
    fn gather_any(&self, w: usize, indices: &[u32], out: &mut [u8]) {
        let mut at = BatchCursor::new(self.starts);
        for (&row, o) in indices.iter().zip(out.chunks_exact_mut(w)) {
            let (b, local) = at.locate(row as usize);
            o.copy_from_slice(&self.parts[b][local * w..][..w]);
        }
    }

    fn gather_w<const W: usize>(&self, indices: &[u32], out: &mut [u8]) {
        let (out, _) = out.as_chunks_mut::<W>();
        let mut at = BatchCursor::new(self.starts);
        for (&row, o) in indices.iter().zip(out) {
            let (b, local) = at.locate(row as usize);
            o.copy_from_slice(&self.parts[b][local * W..][..W]);
        }
    }

    /// Views, each non-inline view's buffer index rebased by its batch's
    /// base (as packing does).
    fn gather_views(&self, bases: &[u32], indices: &[u32], out: &mut [u8]) {
        let (out, _) = out.as_chunks_mut::<16>();
        let mut at = BatchCursor::new(self.starts);
        for (&row, o) in indices.iter().zip(out) {
            let (b, local) = at.locate(row as usize);
            let (views, _) = self.parts[b].as_chunks::<16>();
            *o = rebase_view(u128::from_le_bytes(views[local]), bases[b]).to_le_bytes();
        }
    }
}

/// Finds the batch holding a global row; successive rows close together
/// (the orders [`SourceLayout::Columns`] is for) stay in the same batch
/// without a search.
struct BatchCursor<'a> {
    starts: &'a [usize],
    batch: usize,
}

impl<'a> BatchCursor<'a> {
    fn new(starts: &'a [usize]) -> Self {
        assert!(!starts.is_empty(), "batch starts end with the total");
        Self { starts, batch: 0 }
    }

    /// `(batch, row within it)` of global `row` (below the total).
    #[inline]
    fn locate(&mut self, row: usize) -> (usize, usize) {
        let s = self.starts;
        if row < s[self.batch] || row >= s[(self.batch + 1).min(s.len() - 1)] {
            // The last batch starting at or before `row`: empty batches
            // start where the next one does, so this skips them.
            self.batch = s.partition_point(|&start| start <= row) - 1;
        }
        (self.batch, row - s[self.batch])
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

/// Packs the packable columns of `batches` into row groups, as
/// `packings` says; or names the narrowed columns a value did not fit.
fn pack_groups(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    packings: &[Packing],
    view_bases: &[Option<Vec<u32>>],
    rows: usize,
) -> Result<Vec<PackedGroup>, Vec<usize>> {
    let packable: Vec<(usize, usize)> = (schema.fields().iter().enumerate())
        .filter_map(|(c, f)| {
            let width = packed_width(f.data_type())?;
            Some((c, packings[c].packed_width(width)))
        })
        .collect();
    let mut groups = vec![];
    let mut misfits = vec![];
    for members in row_groups(packable) {
        let (group, group_misfits) = pack_group(batches, members, packings, view_bases, rows);
        groups.push(group);
        misfits.extend(group_misfits);
    }
    if misfits.is_empty() {
        return Ok(groups);
    }
    groups.into_iter().for_each(|g| recycle(g.rows));
    Err(misfits)
}

/// Packs the `members` columns of every batch into rows, batch after
/// batch and block after block within a batch; also returns the narrowed
/// members a value did not fit.
///
/// A block of rows ([`ROW_BLOCK_BYTES`]) stays in L1 while each member
/// writes its part of it. Writing one member into a whole 32768-row batch
/// at a time (2 MiB of 64-byte rows, more than L2) pulled every row's
/// line back from memory once per member.
fn pack_group(
    batches: &[RecordBatch],
    members: Vec<(usize, usize)>,
    packings: &[Packing],
    view_bases: &[Option<Vec<u32>>],
    rows: usize,
) -> (PackedGroup, Vec<usize>) {
    let row_width: usize = members.iter().map(|&(_, w)| w).sum();
    let offsets = member_offsets(&members.iter().map(|&(_, w)| w).collect::<Vec<_>>());
    let block_rows = (ROW_BLOCK_BYTES / row_width).max(1);
    let mut packed: Vec<u8> = take_vec_filled(rows * row_width);
    let mut misfit = vec![false; members.len()];
    let mut at = 0;
    for (b, batch) in batches.iter().enumerate() {
        let n = batch.num_rows();
        let data: Vec<ArrayData> = members
            .iter()
            .map(|&(c, _)| batch.column(c).to_data())
            .collect();
        let dst = &mut packed[at * row_width..(at + n) * row_width];
        for (block, dst) in dst.chunks_mut(block_rows * row_width).enumerate() {
            let rows_in = block * block_rows..block * block_rows + dst.len() / row_width;
            for (m, &(c, w)) in members.iter().enumerate() {
                let base = view_bases[c].as_ref().map_or(0, |bases| bases[b]);
                let offset = offsets[m];
                match packings[c] {
                    Packing::Full => {
                        debug_assert!(
                            !holds_narrow_decimals(&data[m]),
                            "narrow decimals pack as i64"
                        );
                        let values =
                            &fixed_part_bytes(&data[m], w)[rows_in.start * w..rows_in.end * w];
                        match base {
                            0 => pack_column(values, dst, row_width, offset, w),
                            _ => pack_views(values, dst, row_width, offset, base),
                        }
                    }
                    // Decimals read as i64 already: copied as they are.
                    Packing::DecimalAsI64 if holds_narrow_decimals(&data[m]) => {
                        let values =
                            &fixed_part_bytes(&data[m], 8)[rows_in.start * 8..rows_in.end * 8];
                        pack_column(values, dst, row_width, offset, 8);
                    }
                    // Short views are inline: no buffer index to rebase.
                    packing => {
                        let values =
                            &fixed_part_bytes(&data[m], 16)[rows_in.start * 16..rows_in.end * 16];
                        misfit[m] |= !pack_narrowed(packing, values, dst, row_width, offset);
                    }
                }
            }
        }
        at += n;
    }
    let misfits = (members.iter().zip(&misfit))
        .filter(|(_, &m)| m)
        .map(|(&(c, _), _)| c)
        .collect();
    let group = PackedGroup {
        rows: packed,
        members,
    };
    (group, misfits)
}

/// Whether a column's values in a batch are i64 decimals to be gathered
/// as i128 ones (see [`widens_to`]).
fn holds_narrow_decimals(data: &ArrayData) -> bool {
    matches!(data.data_type(), DataType::Decimal64(_, _))
}

/// Packs 16-byte values narrowed to 8 bytes as `packing` says at byte
/// `offset` of consecutive rows; false if a value does not fit (the rows
/// then hold garbage for it).
fn pack_narrowed(
    packing: Packing,
    values: &[u8],
    rows: &mut [u8],
    row_width: usize,
    offset: usize,
) -> bool {
    let (values, _) = values.as_chunks::<16>();
    let rows = rows.chunks_exact_mut(row_width);
    // Misfits are OR-ed, not tested per value, so the loops stay plain.
    match packing {
        // Little-endian: an i64-sized i128's low 8 bytes are the i64, and
        // its high 8 bytes are the low ones' sign.
        Packing::DecimalAsI64 => {
            let mut misfits = 0u64;
            for (v, row) in values.iter().zip(rows) {
                let (low, high) = v.split_at(8);
                let low = i64::from_le_bytes(low.try_into().expect("8 bytes"));
                let high = i64::from_le_bytes(high.try_into().expect("8 bytes"));
                misfits |= (high ^ (low >> 63)) as u64;
                row[offset..offset + 8].copy_from_slice(&low.to_le_bytes());
            }
            misfits == 0
        }
        Packing::ShortViewAs8 => {
            let mut longest = 0u32;
            for (v, row) in values.iter().zip(rows) {
                let view = u128::from_le_bytes(*v);
                longest = longest.max(view as u32);
                row[offset..offset + 8].copy_from_slice(&narrow_view(view).to_le_bytes());
            }
            longest <= SHORT_VIEW_BYTES_MAX
        }
        Packing::Full => unreachable!("full values are not narrowed"),
    }
}

/// Packs 16-byte views at byte `offset` of consecutive rows, adding `base`
/// to the buffer index of each view that points into a data buffer.
fn pack_views(values: &[u8], rows: &mut [u8], row_width: usize, offset: usize, base: u32) {
    let (views, _) = values.as_chunks::<16>();
    for (v, row) in views.iter().zip(rows.chunks_exact_mut(row_width)) {
        let view = rebase_view(u128::from_le_bytes(*v), base);
        row[offset..offset + 16].copy_from_slice(&view.to_le_bytes());
    }
}

/// `view` with its data buffer index moved up by `base`, unless the value
/// is inline (12 bytes or fewer: no buffer). The index is bits 64..96; the
/// callers checked that every rebased index fits in u32, so nothing carries
/// past bit 96. Arithmetic only, no branch: inline and out-of-line views
/// mixed at random (a dictionary column of both kinds) mispredict none.
#[inline(always)]
pub(crate) fn rebase_view(view: u128, base: u32) -> u128 {
    let long = ((view as u32) > 12) as u128;
    view + ((long * base as u128) << 64)
}

/// Where each part's data buffers start in the list of all of them, and
/// that list. A part whose buffers are the previous part's (the batches of
/// one row group share its dictionary page) adds none: its views share the
/// previous part's base, so the list, and what each gathered array
/// carries, holds every distinct page once instead of once per batch.
/// Refuses more buffers than u32 buffer indices reach.
pub(crate) fn data_buffer_list<'a>(
    parts: impl Iterator<Item = &'a [Buffer]>,
) -> Result<DataBufferList, ArrowError> {
    let mut bases = vec![];
    let mut buffers: Vec<Buffer> = vec![];
    // Where the previous part's buffers lie in `buffers`.
    let mut previous = 0..0;
    for own in parts {
        let listed = &buffers[previous.clone()];
        if listed.len() == own.len() && listed.iter().zip(own).all(|(a, b)| a.ptr_eq(b)) {
            bases.push(previous.start as u32);
            continue;
        }
        let base = buffers.len() as u32;
        buffers.extend(own.iter().cloned());
        if u32::try_from(buffers.len()).is_err() {
            return Err(ArrowError::InvalidArgumentError(format!(
                "{} view data buffers exceed u32 buffer indices",
                buffers.len()
            )));
        }
        bases.push(base);
        previous = base as usize..buffers.len();
    }
    Ok(DataBufferList { bases, buffers })
}

/// `parts` one after another as one view array, equal to Arrow's
/// `concat` of them, built for a sort's key column: parts that share
/// their data buffers (the batches of one Parquet row group share its
/// dictionary page) list them once, so equal values keep equal views;
/// views are rebased without a branch (inline and out-of-line views mix
/// at random in a dictionary column); and their memory comes from the
/// scratch pool, already faulted in. Arrow's concat of 3M
/// `l_shipinstruct` views took 2.5% of an ORDER BY's CPU, half of it
/// faulting in fresh pages.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use insitu_kernels::concat_views;
/// let a = StringViewArray::from(vec!["a string past twelve bytes", "short"]);
/// let b = a.slice(0, 1);
/// let both = concat_views(&[&a, &b]).unwrap();
/// let want = ["a string past twelve bytes", "short", "a string past twelve bytes"];
/// assert_eq!(both, StringViewArray::from(want.to_vec()));
/// assert_eq!(both.data_buffers().len(), 1, "the shared buffer is listed once");
/// ```
pub fn concat_views<T: ByteViewType + ?Sized>(
    parts: &[&GenericByteViewArray<T>],
) -> Result<GenericByteViewArray<T>, ArrowError> {
    let list = data_buffer_list(parts.iter().map(|p| p.data_buffers()))?;
    let rows = parts.iter().map(|p| p.len()).sum();
    let mut views: Vec<u128> = take_vec(rows);
    for (part, &base) in parts.iter().zip(&list.bases) {
        views.extend(part.views().iter().map(|&v| rebase_view(v, base)));
    }
    let arrays: Vec<&dyn Array> = parts.iter().map(|p| *p as &dyn Array).collect();
    let nulls = concat_nulls(&arrays);
    let views = ScalarBuffer::new(pooled_buffer(views), 0, rows);
    // SAFETY: each valid view is a valid view of its part, its buffer
    // index moved by where that part's buffers (the same memory) start in
    // `list.buffers`, which holds them all within u32 indices; inline
    // views are unchanged. UTF-8 validity carries over.
    Ok(unsafe { GenericByteViewArray::new_unchecked(views, list.buffers, nulls) })
}

/// A view column's data buffers over all batches.
pub(crate) struct DataBufferList {
    /// Where each batch's buffers start in `buffers`.
    pub(crate) bases: Vec<u32>,
    pub(crate) buffers: Vec<Buffer>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Decimal128Array, Int64Array, StringViewArray, UInt32Array};
    use arrow::datatypes::{Field, Schema};

    /// Decimals of `precision`, not checked against it.
    fn decimals(precision: u8, values: Vec<Option<i128>>) -> ArrayRef {
        Arc::new(
            Decimal128Array::from(values)
                .with_precision_and_scale(precision, 2)
                .unwrap(),
        )
    }

    fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
        let fields: Vec<Field> = (columns.iter().enumerate())
            .map(|(i, a)| Field::new(format!("c{i}"), a.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    /// Gathers `batches` through packed rows in a scrambled order and
    /// compares with `take` over their concatenation; returns the source.
    fn gathers_like_take(batches: &[RecordBatch]) -> GatherSource {
        let schema = batches[0].schema();
        let source =
            GatherSource::with_layout(schema.clone(), batches, SourceLayout::Rows).unwrap();
        let whole = arrow::compute::concat_batches(&schema, batches).unwrap();
        let n = whole.num_rows() as u32;
        let order: Vec<u32> = (0..n).map(|i| (i * 7 + 3) % n).collect();
        let got = source.gather(&order).unwrap();
        let indices = UInt32Array::from(order);
        for c in 0..whole.num_columns() {
            let want = arrow::compute::take(whole.column(c), &indices, None).unwrap();
            got.column(c).to_data().validate_full().unwrap();
            assert_eq!(got.column(c).as_ref(), want.as_ref(), "column {c}");
        }
        source
    }

    /// Long strings from large buffers come out compacted into one buffer
    /// of just the gathered strings, in the same arena as the batch's
    /// other buffers; null rows' views are empty. In both layouts.
    #[test]
    fn long_strings_are_compacted_into_the_batch_arena() {
        let batches: Vec<RecordBatch> = (0..4)
            .map(|b| {
                let strings: StringViewArray = (0..500)
                    .map(|i| (i % 9 != 0).then(|| format!("batch {b} string {i} past twelve")))
                    .collect();
                let keys = Int64Array::from_iter_values((0..500).map(|i| i * 4 + b));
                batch(vec![Arc::new(keys), Arc::new(strings)])
            })
            .collect();
        let source = gathers_like_take(&batches);
        let order: Vec<u32> = (0..100).map(|i| i * 19 % 2000).collect();
        for layout in [SourceLayout::Rows, SourceLayout::Columns] {
            let source = GatherSource::with_layout(batches[0].schema(), &batches, layout).unwrap();
            let got = source.gather(&order).unwrap();
            let strings = got.column(1).as_string_view();
            let used: usize = strings.iter().flatten().map(|s| s.len()).sum();
            assert_eq!(strings.data_buffers().len(), 1, "{layout:?}");
            assert_eq!(strings.data_buffers()[0].len(), used, "{layout:?}");
            for (row, view) in strings.views().iter().enumerate() {
                assert!(
                    strings.is_valid(row) || *view == 0,
                    "null row {row} has a view"
                );
            }
            let keys = got.column(0).to_data().buffers()[0].clone();
            let arena = ChunkArena::containing(keys.as_ptr()).expect("keys in an arena");
            assert!(arena.body_offset(&strings.data_buffers()[0]).is_some());
            assert!(arena.body_offset(strings.views().inner()).is_some());
        }
        assert_eq!(source.num_rows(), 2000);
    }

    /// Batches that share their data buffers (one row group's batches over
    /// its dictionary page) list them once in what a gather returns, in
    /// both layouts; a batch with buffers of its own adds them after.
    /// (The pages are small enough, at most `SHRINK_SLACK_BYTES` in all,
    /// that the gather ships them as they are.)
    #[test]
    fn view_buffers_shared_by_consecutive_batches_are_listed_once() {
        let page = StringViewArray::from_iter_values(
            (0..60).map(|i| format!("a value past twelve, {}", i % 5)),
        );
        let slices: Vec<RecordBatch> = (0..6)
            .map(|i| batch(vec![Arc::new(page.slice(i * 10, 10))]))
            .collect();
        let other = StringViewArray::from(vec!["another page's value past twelve"]);
        let mut batches = slices.clone();
        batches.push(batch(vec![Arc::new(other.clone())]));
        batches.extend(slices);
        let source = gathers_like_take(&batches);
        let order: Vec<u32> = (0..source.num_rows() as u32).rev().collect();
        for layout in [SourceLayout::Rows, SourceLayout::Columns] {
            let source = GatherSource::with_layout(batches[0].schema(), &batches, layout).unwrap();
            let got = source.gather(&order).unwrap();
            let buffers = got.column(0).as_string_view().data_buffers().to_vec();
            assert_eq!(buffers.len(), 3, "page, other page, page again");
            assert!(buffers[0].ptr_eq(&page.data_buffers()[0]));
            assert!(buffers[1].ptr_eq(&other.data_buffers()[0]));
            assert!(buffers[2].ptr_eq(&page.data_buffers()[0]));
        }
    }

    #[test]
    fn decimals_narrow_when_their_precision_and_every_value_fit_i64() {
        let (min, max) = (i64::MIN as i128, i64::MAX as i128);
        let fits = |p| {
            batch(vec![decimals(
                p,
                vec![Some(min), None, Some(-1), Some(max)],
            )])
        };
        let other = |p| batch(vec![decimals(p, vec![Some(5), Some(-7)])]);
        let source = gathers_like_take(&[fits(18), other(18)]);
        assert_eq!(source.packings, [Packing::DecimalAsI64]);
        // Values past the precision (arrow-rs does not check on building)
        // are packed again in full, wherever they are.
        for outside in [max + 1, min - 1, i128::MAX] {
            let wide = batch(vec![decimals(18, vec![Some(1), Some(outside)])]);
            for batches in [[fits(18), wide.clone()], [wide.clone(), fits(18)]] {
                let source = gathers_like_take(&batches);
                assert_eq!(source.packings, [Packing::Full], "{outside}");
            }
        }
        // A precision past 18 is not narrowed even if the values fit.
        let source = gathers_like_take(&[fits(19), other(19)]);
        assert_eq!(source.packings, [Packing::Full]);
    }

    #[test]
    fn views_narrow_only_when_every_value_is_seven_bytes_or_fewer() {
        let short = |v: Vec<Option<&str>>| -> ArrayRef { Arc::new(StringViewArray::from(v)) };
        let fits = batch(vec![short(vec![
            Some(""),
            None,
            Some("a"),
            Some("REG AIR"),
        ])]);
        let more = batch(vec![short(vec![Some("7 bytes"), Some("AIR"), None])]);
        let empty = fits.slice(0, 0);
        let source = gathers_like_take(&[empty.clone(), fits.clone(), more]);
        assert_eq!(source.packings, [Packing::ShortViewAs8]);
        for longer in ["8 bytes!", "longer than twelve bytes"] {
            let other = batch(vec![short(vec![Some("x"), Some(longer)])]);
            // Found while packing (after a short first batch), or up front.
            for batches in [[fits.clone(), other.clone()], [other.clone(), fits.clone()]] {
                let source = gathers_like_take(&batches);
                assert_eq!(source.packings, [Packing::Full], "{longer}");
            }
        }
    }

    #[test]
    fn a_misfit_in_a_later_block_of_a_long_batch_packs_in_full() {
        // Rows are packed a block of a few hundred at a time: the misfit
        // lies blocks past the first, in a batch after a fitting one.
        let n = 4000;
        let fitting = |k: i128| decimals(18, (0..n).map(|i| Some(i * 3 + k)).collect());
        let mut values: Vec<Option<i128>> = (0..n).map(|i| Some(-i)).collect();
        values[3001] = Some(i64::MAX as i128 + 1);
        let words = |long: bool| -> ArrayRef {
            let mut v: Vec<String> = (0..n).map(|i| format!("w{}", i % 9)).collect();
            if long {
                v[2999] = "past seven".to_string();
            }
            Arc::new(StringViewArray::from_iter_values(v))
        };
        let first = batch(vec![fitting(0), words(false)]);
        let second = batch(vec![decimals(18, values), words(true)]);
        let source = gathers_like_take(&[first.clone(), second]);
        assert_eq!(source.packings, [Packing::Full, Packing::Full]);
        let source = gathers_like_take(&[first.clone(), first]);
        assert_eq!(
            source.packings,
            [Packing::DecimalAsI64, Packing::ShortViewAs8]
        );
    }

    #[test]
    fn narrowed_columns_take_fewer_row_groups() {
        // Four decimals, two short strings and two 8-byte integers: 128
        // bytes in full (two 64-byte groups), 64 narrowed (one).
        let n = 50;
        let mut columns: Vec<ArrayRef> = (0..4)
            .map(|k| decimals(15, (0..n).map(|i| Some(i * 100 + k)).collect()))
            .collect();
        for _ in 0..2 {
            let words = ["N", "O", "TRUCK"];
            let values = (0..n as usize).map(|i| Some(words[i % 3]));
            columns.push(Arc::new(StringViewArray::from_iter(values)));
        }
        for _ in 0..2 {
            columns.push(Arc::new(Int64Array::from_iter_values(0..n as i64)));
        }
        let source = gathers_like_take(&[batch(columns)]);
        assert_eq!(source.groups.len(), 1);
        let row_width: usize = source.groups[0].members.iter().map(|&(_, w)| w).sum();
        assert_eq!(row_width, 64);
    }

    /// Decimals a scan read as Decimal64 come out of every layout as the
    /// Decimal128 values they stand for: random values across the whole
    /// precision, negatives and nulls, batches of odd sizes.
    #[test]
    fn decimals_read_as_i64_widen_back_in_every_layout() {
        use arrow::array::Decimal64Array;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(64);
        let top = 10i64.pow(15) - 1;
        let mut wide_batches = vec![];
        let mut narrow_batches = vec![];
        for rows in [0, 1, 2, 7, 49, 50, 51, 1000] {
            let values: Vec<Option<i64>> = (0..rows)
                .map(|_| match rng.random_range(0..10) {
                    0 => None,
                    1 => Some(top),
                    2 => Some(-top),
                    _ => Some(rng.random_range(-top..=top)),
                })
                .collect();
            let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
            let wide = decimals(15, values.iter().map(|v| v.map(i128::from)).collect());
            let narrow = Decimal64Array::from(values)
                .with_precision_and_scale(15, 2)
                .unwrap();
            wide_batches.push(batch(vec![Arc::clone(&keys), wide]));
            narrow_batches.push(batch(vec![keys, Arc::new(narrow)]));
        }
        let schema = wide_batches[0].schema();
        let whole = arrow::compute::concat_batches(&schema, &wide_batches).unwrap();
        let n = whole.num_rows() as u32;
        let random: Vec<u32> = (0..n).map(|i| (i * 7 + 3) % n).collect();
        // A stable sort of a key of 3 values: 3 ascending runs.
        let runs: Vec<u32> = (0..3).flat_map(|k| (k..n).step_by(3)).collect();
        let want = |order: &[u32]| {
            let indices = UInt32Array::from(order.to_vec());
            arrow::compute::take_record_batch(&whole, &indices).unwrap()
        };
        for layout in [SourceLayout::Rows, SourceLayout::Columns] {
            let source =
                GatherSource::with_layout(schema.clone(), &narrow_batches, layout).unwrap();
            let got = source.gather(&random).unwrap();
            assert_eq!(got, want(&random), "{layout:?}");
        }
        let source =
            GatherSource::with_layout(schema.clone(), &narrow_batches, SourceLayout::Scattered)
                .unwrap();
        let parts: Vec<RecordBatch> = (source.scatter(&runs, 100).unwrap())
            .collect::<Result<_, _>>()
            .unwrap();
        let got = arrow::compute::concat_batches(&schema, &parts).unwrap();
        assert_eq!(got, want(&runs));
        // Batches that mix narrow and wide decimals, and a narrow type of
        // another precision, are refused.
        let mixed = [narrow_batches[7].clone(), wide_batches[7].clone()];
        let err = GatherSource::new(schema.clone(), &mixed).err().unwrap();
        assert!(err.to_string().contains("differ in which columns"), "{err}");
        let other = Arc::new(Schema::new(vec![
            Field::new("c0", DataType::Int64, true),
            Field::new("c1", DataType::Decimal128(16, 2), true),
        ]));
        let err = GatherSource::new(other, &narrow_batches).err().unwrap();
        assert!(err.to_string().contains("column types"), "{err}");
    }
}
