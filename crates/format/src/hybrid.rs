//! The hybrid partition layout (paper 000, section 3.5 and Fig. 8c): the
//! sort key columns column-wise, every other column row-wise.
//!
//! ```text
//! | magic | key section       | row section           | heap        | footer (JSON) | footer len u64 | magic |
//! |       | one Arrow IPC     | row_count fixed-width | var-length  | HybridLayout  |                |       |
//! |       | stream per block  | slots, in row order   | bytes       |               |                |       |
//! ```
//!
//! A sort reads the key section sequentially, argsorts it, then gathers
//! whole rows: row `i` is the slot at `row_section.offset + i * row_width`,
//! one contiguous read per row. A slot holds a validity bitmap of the
//! row-wise fields, then each fixed-width value in place, and for each
//! variable-length value its heap offset (u64, from the heap section start;
//! rows of one block with the same value may share one copy in the block's
//! heap) and length (u32). Everything is little-endian.
//!
//! This module encodes and decodes; it does no query work. The descriptor
//! ([`insitu_wire::HybridLayout`]) says where everything is, and the file's
//! footer repeats it, so the file describes itself.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use arrow::array::builder::make_view;
use arrow::array::{
    make_array, Array, ArrayData, ArrayRef, AsArray, BinaryViewArray, BooleanArray,
    LargeBinaryArray, RecordBatch, StringViewArray,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use insitu_kernels::mem::{pooled_buffer, take_vec, Pod};
use insitu_kernels::{prefetch, validate_utf8_views};
use insitu_wire::{HybridBlock, HybridLayout, RowGroupStats, RowSlot, Section};

use crate::{io_err, FormatError, FormatResult};

/// Opens and closes a hybrid partition file.
pub const HYBRID_MAGIC: &[u8; 8] = b"INSHYB02";
/// The magic of files written before short values were inlined (every
/// variable-length value in the heap); still read.
const HYBRID_MAGIC_V1: &[u8; 8] = b"INSHYB01";
/// Bytes a variable-length value takes in its slot: u64 offset + u32 length.
const VAR_SLOT_BYTES: u32 = 12;
/// Variable-length values of at most this many bytes are stored in their
/// slot, in place of the heap offset ([`RowSlot::inline_bytes_max`]).
/// Sorting lineitem by `l_partkey` on this layout, decoding
/// `l_returnflag`, `l_linestatus` and `l_shipmode` (1 to 7 bytes) from the
/// heap took 0.21 s of 0.87 s: one cache miss per value.
pub const INLINE_VAR_BYTES_MAX: u32 = 8;
/// Largest footer a reader accepts (`hybrid_footer_bytes_max`).
pub const HYBRID_FOOTER_BYTES_MAX: u64 = 64 << 20;

/// Width in bytes of a value of `data_type` in a row slot; `None` if the
/// type cannot be stored row-wise.
fn slot_width(data_type: &DataType) -> Option<(u32, bool)> {
    use DataType::*;
    match data_type {
        Boolean => Some((1, false)),
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView => {
            Some((VAR_SLOT_BYTES, true))
        }
        FixedSizeBinary(n) if *n > 0 => Some((*n as u32, false)),
        t if t.is_primitive() => t.primitive_width().map(|w| (w as u32, false)),
        _ => None,
    }
}

/// The row slot layout for the fields of `schema` that are not key columns.
pub fn plan_rows(
    schema: &Schema,
    key_columns: &[String],
) -> FormatResult<(Vec<RowSlot>, u32, u32)> {
    for key in key_columns {
        if schema.field_with_name(key).is_err() {
            return Err(FormatError::Invalid(format!(
                "hybrid layout: key column '{key}' is not in the table (columns: {})",
                column_names(schema)
            )));
        }
    }
    if key_columns.is_empty() {
        return Err(FormatError::Invalid(
            "hybrid layout needs at least one key column".into(),
        ));
    }
    let row_fields: Vec<&FieldRef> = schema
        .fields()
        .iter()
        .filter(|f| !key_columns.contains(f.name()))
        .collect();
    let validity_bytes = row_fields.len().div_ceil(8) as u32;
    let mut offset = validity_bytes;
    let mut slots = Vec::with_capacity(row_fields.len());
    for f in row_fields {
        let (width, variable_length) = slot_width(f.data_type()).ok_or_else(|| {
            FormatError::Invalid(format!(
                "hybrid layout: column '{}' of type {} cannot be stored row-wise \
                 (fixed-width, boolean, string and binary columns can)",
                f.name(),
                f.data_type()
            ))
        })?;
        slots.push(RowSlot {
            name: f.name().clone(),
            offset_bytes: offset,
            width_bytes: width,
            variable_length,
            inline_bytes_max: if variable_length {
                INLINE_VAR_BYTES_MAX
            } else {
                0
            },
        });
        offset += width;
    }
    Ok((slots, offset.max(1), validity_bytes))
}

fn column_names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Encodes the row-wise columns of `batch` into slots (appended to
/// `slots`) and heap bytes (appended to `heap`, whose current length plus
/// `heap_base` is the first value's heap offset).
pub fn encode_rows(
    batch: &RecordBatch,
    layout_slots: &[RowSlot],
    row_width: u32,
    heap_base: u64,
    slots: &mut Vec<u8>,
    heap: &mut Vec<u8>,
) -> FormatResult<()> {
    let n = batch.num_rows();
    let width = row_width as usize;
    let start = slots.len();
    slots.resize(start + n * width, 0);
    let out = &mut slots[start..];
    for (field_no, slot) in layout_slots.iter().enumerate() {
        let column = batch.column_by_name(&slot.name).ok_or_else(|| {
            FormatError::Invalid(format!(
                "hybrid layout: batch has no column '{}'",
                slot.name
            ))
        })?;
        let at = slot.offset_bytes as usize;
        let (byte, bit) = (field_no / 8, 1u8 << (field_no % 8));
        for row in 0..n {
            if column.is_valid(row) {
                out[row * width + byte] |= bit;
            }
        }
        if slot.variable_length {
            let inline = slot.inline_bytes_max as usize;
            encode_var(column.as_ref(), inline, heap_base, heap, |row, bytes| {
                out[row * width + at..row * width + at + 12].copy_from_slice(bytes)
            })?;
        } else if let Some(bools) = column.as_boolean_opt() {
            for row in 0..n {
                out[row * width + at] = bools.value(row) as u8;
            }
        } else {
            let data = column.to_data();
            let w = slot.width_bytes as usize;
            let values = &data.buffers()[0].as_slice()[data.offset() * w..];
            for row in 0..n {
                out[row * width + at..row * width + at + w]
                    .copy_from_slice(&values[row * w..row * w + w]);
            }
        }
    }
    Ok(())
}

/// Distinct long values of a column that a block's heap stores once each
/// (`heap_shared_values_max`); once a column has shown this many, its
/// further values are appended as they come, unhashed.
const HEAP_SHARED_VALUES_MAX: usize = 64;

/// Hands each value of a string or binary column to `put` as its slot
/// bytes: the value itself if it has at most `inline` bytes, else its
/// offset in `heap`; then its length. A long value already in this call's
/// heap (among the first [`HEAP_SHARED_VALUES_MAX`] distinct ones) points
/// at that copy, else it is appended: the rows of a low-cardinality
/// column such as `l_shipinstruct` share a few heap values, which stay in
/// cache when a sort reads them in random order.
fn encode_var<'c>(
    column: &'c dyn Array,
    inline: usize,
    heap_base: u64,
    heap: &mut Vec<u8>,
    mut put: impl FnMut(usize, &[u8; 12]),
) -> FormatResult<()> {
    debug_assert!(
        inline <= INLINE_VAR_BYTES_MAX as usize,
        "inline values fit the offset's 8 bytes"
    );
    let mut shared: HashMap<&'c [u8], u64> = HashMap::new();
    let mut push = |row: usize, value: Option<&'c [u8]>| {
        let value = value.unwrap_or_default();
        let mut slot = [0u8; 12];
        if value.len() <= inline {
            slot[..value.len()].copy_from_slice(value);
        } else {
            let offset = match shared.len() < HEAP_SHARED_VALUES_MAX {
                true => *shared.entry(value).or_insert_with(|| {
                    heap.extend_from_slice(value);
                    heap_base + (heap.len() - value.len()) as u64
                }),
                false => {
                    heap.extend_from_slice(value);
                    heap_base + (heap.len() - value.len()) as u64
                }
            };
            slot[..8].copy_from_slice(&offset.to_le_bytes());
        }
        slot[8..].copy_from_slice(&(value.len() as u32).to_le_bytes());
        put(row, &slot);
    };
    macro_rules! each {
        ($array:expr) => {{
            let a = $array;
            for row in 0..a.len() {
                let v = a.is_valid(row).then(|| AsRef::<[u8]>::as_ref(a.value(row)));
                if v.is_some_and(|v| v.len() > u32::MAX as usize) {
                    return Err(FormatError::Invalid(
                        "hybrid layout: a value is longer than 4 GiB".into(),
                    ));
                }
                push(row, v);
            }
        }};
    }
    match column.data_type() {
        DataType::Utf8 => each!(column.as_string::<i32>()),
        DataType::LargeUtf8 => each!(column.as_string::<i64>()),
        DataType::Utf8View => each!(column.as_string_view()),
        DataType::Binary => each!(column.as_binary::<i32>()),
        DataType::LargeBinary => each!(column.as_binary::<i64>()),
        DataType::BinaryView => each!(column.as_binary_view()),
        t => {
            return Err(FormatError::Invalid(format!(
                "hybrid layout: {t} is not a variable-length type"
            )))
        }
    }
    Ok(())
}

/// Decodes row slots back into Arrow columns: `fields[i]` is stored in
/// `layout_slots[i]`. `slots` holds whole rows; `heap` holds the heap bytes
/// from heap offset `heap_base` on. Offsets and lengths are checked.
pub fn decode_rows(
    slots: &[u8],
    row_width: u32,
    layout_slots: &[(usize, &RowSlot)],
    fields: &[FieldRef],
    heap: &[u8],
    heap_base: u64,
) -> FormatResult<Vec<ArrayRef>> {
    let width = row_width as usize;
    if width == 0 || !slots.len().is_multiple_of(width) {
        return Err(corrupt(format!(
            "row data of {} bytes is not whole rows of {width} bytes",
            slots.len()
        )));
    }
    let n = slots.len() / width;
    layout_slots
        .iter()
        .zip(fields)
        .map(|(&(field_no, slot), field)| {
            let (byte, bit) = (field_no / 8, 1u8 << (field_no % 8));
            let valid = BooleanBuffer::collect_bool(n, |row| slots[row * width + byte] & bit != 0);
            let nulls = Some(NullBuffer::new(valid)).filter(|n| n.null_count() > 0);
            let at = slot.offset_bytes as usize;
            if slot.variable_length {
                let var = VarColumn {
                    at,
                    inline: slot.inline_bytes_max as u64,
                    field,
                };
                decode_var(slots, width, &var, n, nulls, heap, heap_base)
            } else {
                decode_fixed(slots, width, at, slot.width_bytes as usize, n, nulls, field)
            }
        })
        .collect()
}

fn corrupt(msg: String) -> FormatError {
    FormatError::Invalid(format!("hybrid partition is corrupt: {msg}"))
}

fn decode_fixed(
    slots: &[u8],
    width: usize,
    at: usize,
    w: usize,
    n: usize,
    nulls: Option<NullBuffer>,
    field: &Field,
) -> FormatResult<ArrayRef> {
    if *field.data_type() == DataType::Boolean {
        let values = BooleanBuffer::collect_bool(n, |row| slots[row * width + at] != 0);
        return Ok(Arc::new(BooleanArray::new(values, nulls)));
    }
    let rows = slots.chunks_exact(width).take(n);
    let values = match w {
        1 => fixed_column::<u8>(rows, at),
        2 => fixed_column::<u16>(rows, at),
        4 => fixed_column::<u32>(rows, at),
        8 => fixed_column::<u64>(rows, at),
        16 => fixed_column::<u128>(rows, at),
        _ => {
            let mut values = Vec::with_capacity(n * w);
            rows.for_each(|row| values.extend_from_slice(&row[at..at + w]));
            Buffer::from_vec(values)
        }
    };
    let data = ArrayData::builder(field.data_type().clone())
        .len(n)
        .add_buffer(values)
        .nulls(nulls)
        .build()
        .map_err(|e| corrupt(format!("column {}: {e}", field.name())))?;
    Ok(make_array(data))
}

/// The `T`-sized value at byte `at` of each row, as one buffer from the
/// kernels' scratch pool: a fixed-size load a row instead of a memmove
/// call a row, into memory already faulted in by an earlier batch.
fn fixed_column<'a, T: Pod>(rows: impl ExactSizeIterator<Item = &'a [u8]>, at: usize) -> Buffer {
    let mut values: Vec<T> = take_vec(rows.len());
    values.extend(rows.map(|row| {
        let bytes = &row[at..at + std::mem::size_of::<T>()];
        // SAFETY: `bytes` holds exactly size_of::<T>() bytes, and T (plain
        // data) is valid for any bits.
        unsafe { (bytes.as_ptr() as *const T).read_unaligned() }
    }));
    pooled_buffer(values)
}

/// Where a variable-length column sits in each row slot, how short its
/// values must be to sit in the slot itself, and its field (for errors).
struct VarColumn<'f> {
    at: usize,
    inline: u64,
    field: &'f Field,
}

/// A variable-length slot: its first 8 bytes (the heap offset, or the
/// value itself if inline) and the value's length.
fn var_slot(slots: &[u8], width: usize, at: usize, row: usize) -> (u64, u64) {
    let slot = &slots[row * width + at..row * width + at + 12];
    let off = u64::from_le_bytes(slot[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(slot[8..].try_into().expect("4 bytes")) as u64;
    (off, len)
}

/// The value of `row`: in its slot if short enough to be inline, else in
/// `heap` (which starts at heap offset `heap_base`), or an error naming
/// the column if the slot points outside it.
fn var_value<'a>(
    slots: &'a [u8],
    width: usize,
    column: &VarColumn,
    row: usize,
    heap: &'a [u8],
    heap_base: u64,
) -> FormatResult<&'a [u8]> {
    let (off, len) = var_slot(slots, width, column.at, row);
    if len <= column.inline {
        let start = row * width + column.at;
        return Ok(&slots[start..start + len as usize]);
    }
    let start = off
        .checked_sub(heap_base)
        .filter(|s| s.saturating_add(len) <= heap.len() as u64)
        .ok_or_else(|| {
            corrupt(format!(
                "column {}: value at heap offset {off} ({len} bytes) is outside \
                 the heap bytes read ({heap_base}..{})",
                column.field.name(),
                heap_base + heap.len() as u64
            ))
        })? as usize;
    Ok(&heap[start..start + len as usize])
}

/// Rows ahead whose heap value [`decode_views`] fetches into cache.
const HEAP_PREFETCH_ROWS: usize = 16;

fn decode_var(
    slots: &[u8],
    width: usize,
    column: &VarColumn,
    n: usize,
    nulls: Option<NullBuffer>,
    heap: &[u8],
    heap_base: u64,
) -> FormatResult<ArrayRef> {
    let field = column.field;
    if matches!(field.data_type(), DataType::Utf8View | DataType::BinaryView) {
        if let Some(views) = decode_views(slots, width, column, n, &nulls, heap, heap_base)? {
            return Ok(views);
        }
    }
    let mut offsets: Vec<i64> = Vec::with_capacity(n + 1);
    offsets.push(0);
    let mut values = Vec::new();
    for row in 0..n {
        values.extend_from_slice(var_value(slots, width, column, row, heap, heap_base)?);
        offsets.push(values.len() as i64);
    }
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    let values = Buffer::from_vec(values);
    let bad = |e: ArrowError| corrupt(format!("column {}: {e}", field.name()));
    let binary: ArrayRef = match field.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Arc::new(arrow::array::LargeStringArray::try_new(offsets, values, nulls).map_err(bad)?)
        }
        _ => Arc::new(LargeBinaryArray::try_new(offsets, values, nulls).map_err(bad)?),
    };
    if binary.data_type() == field.data_type() {
        return Ok(binary);
    }
    arrow::compute::cast(&binary, field.data_type()).map_err(bad)
}

/// A string or binary view column built straight from the slots: values of
/// up to 12 bytes inside their views, longer ones copied into one buffer
/// (not through a large-offsets array and a cast, which copied every value
/// twice). Rows come in sort order, so the heap is read at random: the
/// value [`HEAP_PREFETCH_ROWS`] rows ahead is fetched into cache while this
/// one copies (values inline in their slots need no fetch). `None` if the
/// long values pass 4 GiB (one view buffer's offsets are u32). Strings are
/// checked as UTF-8 before use.
fn decode_views(
    slots: &[u8],
    width: usize,
    column: &VarColumn,
    n: usize,
    nulls: &Option<NullBuffer>,
    heap: &[u8],
    heap_base: u64,
) -> FormatResult<Option<ArrayRef>> {
    let field = column.field;
    let long_bytes: u64 = (0..n)
        .map(|row| var_slot(slots, width, column.at, row).1)
        .filter(|&len| len > 12)
        .sum();
    if long_bytes > u32::MAX as u64 {
        return Ok(None);
    }
    let mut data: Vec<u8> = take_vec(long_bytes as usize);
    let mut views: Vec<u128> = take_vec(n);
    for row in 0..n {
        if row + HEAP_PREFETCH_ROWS < n {
            let (off, len) = var_slot(slots, width, column.at, row + HEAP_PREFETCH_ROWS);
            let start = off.wrapping_sub(heap_base) as usize;
            if len > column.inline && start < heap.len() {
                prefetch(heap[start..].as_ptr());
            }
        }
        let (bits, len) = var_slot(slots, width, column.at, row);
        if len <= column.inline {
            views.push(inline_view(bits, len));
            continue;
        }
        let value = var_value(slots, width, column, row, heap, heap_base)?;
        // Long values were summed above: the room is there and fits u32.
        views.push(view_of(value, data.len() as u32));
        if value.len() > 12 {
            append_value(&mut data, value);
        }
    }
    let buffers = match data.is_empty() {
        true => vec![],
        false => vec![pooled_buffer(data)],
    };
    let bad = |e: ArrowError| corrupt(format!("column {}: {e}", field.name()));
    if *field.data_type() == DataType::Utf8View {
        validate_utf8_views(&views, &buffers).map_err(bad)?;
        let views = ScalarBuffer::from(views);
        // SAFETY: each view was made by `make_view` over a copy of its value
        // (inline, or at its offset in buffer 0), and the values are UTF-8
        // (checked just above).
        let array = unsafe { StringViewArray::new_unchecked(views, buffers, nulls.clone()) };
        return Ok(Some(Arc::new(array)));
    }
    let views = ScalarBuffer::from(views);
    // SAFETY: each view was made by `make_view` over a copy of its value.
    let array = unsafe { BinaryViewArray::new_unchecked(views, buffers, nulls.clone()) };
    Ok(Some(Arc::new(array)))
}

/// The view of a value inline in its slot: `bits` are the slot's first
/// 8 bytes (the value, zero-padded by the writer; masked to `len` here
/// all the same, since inline views compare as whole integers).
/// Precondition: `len <= 8` (`inline_bytes_max` is at most 8).
#[inline(always)]
fn inline_view(bits: u64, len: u64) -> u128 {
    debug_assert!(len <= 8);
    let mask = match len {
        8 => u64::MAX,
        _ => (1u64 << (8 * len)) - 1,
    };
    len as u128 | ((bits & mask) as u128) << 32
}

/// The view of `value`, inline if at most 12 bytes, else at `offset` of
/// buffer 0: what arrow's `make_view` builds, but inlined into the decode
/// loop (`make_view` is never inlined, and took 5.8% of a hybrid ORDER BY
/// by `l_partkey` in calls alone).
#[inline(always)]
fn view_of(value: &[u8], offset: u32) -> u128 {
    let len = value.len();
    let word = |at: usize| u32::from_le_bytes(value[at..at + 4].try_into().expect("4 bytes"));
    match len {
        0..=8 => make_view(value, 0, offset),
        9..=12 => {
            let head = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
            // The last 4 bytes, shifted so that byte 8 comes first.
            let rest = word(len - 4) >> (8 * (12 - len));
            len as u128 | (head as u128) << 32 | (rest as u128) << 96
        }
        _ => len as u128 | (word(0) as u128) << 32 | (offset as u128) << 96,
    }
}

/// Appends `value` to `data`, which has room for it: values of 8 to 64
/// bytes move as two fixed-size loads and stores (the first from the
/// value's start, the second ending at its end, overlapping) instead of
/// a memmove call per value.
fn append_value(data: &mut Vec<u8>, value: &[u8]) {
    let (at, len) = (data.len(), value.len());
    let spare = data.spare_capacity_mut();
    assert!(len <= spare.len(), "room for the value");
    let dst = spare.as_mut_ptr() as *mut u8;
    // SAFETY: `dst` is writable for `len` bytes (asserted) and does not
    // overlap `value`; `head_and_tail` reads and writes within `len`.
    unsafe {
        match len {
            8..=16 => head_and_tail::<8>(value, dst),
            17..=32 => head_and_tail::<16>(value, dst),
            33..=64 => head_and_tail::<32>(value, dst),
            _ => std::ptr::copy_nonoverlapping(value.as_ptr(), dst, len),
        }
        data.set_len(at + len);
    }
}

/// Copies `value` (`W` to `2 * W` bytes long) to `dst` as its first `W`
/// bytes and its last `W` bytes.
///
/// # Safety
/// `W <= value.len() <= 2 * W`; `dst` writable for `value.len()` bytes.
#[inline(always)]
unsafe fn head_and_tail<const W: usize>(value: &[u8], dst: *mut u8) {
    let len = value.len();
    debug_assert!((W..=2 * W).contains(&len));
    let head = (value.as_ptr() as *const [u8; W]).read_unaligned();
    let tail = (value.as_ptr().add(len - W) as *const [u8; W]).read_unaligned();
    (dst as *mut [u8; W]).write_unaligned(head);
    (dst.add(len - W) as *mut [u8; W]).write_unaligned(tail);
}

/// Encodes one block's key columns as a self-contained Arrow IPC stream.
pub fn encode_key_block(keys: &RecordBatch) -> FormatResult<Vec<u8>> {
    let ipc = |e: ArrowError| FormatError::Invalid(format!("hybrid layout: key block: {e}"));
    let mut writer = StreamWriter::try_new(Vec::new(), &keys.schema()).map_err(ipc)?;
    writer.write(keys).map_err(ipc)?;
    writer.finish().map_err(ipc)?;
    writer.into_inner().map_err(ipc)
}

/// Decodes one block's key batch (the bytes of [`HybridBlock::key`]).
pub fn decode_key_block(bytes: &[u8], rows: u64) -> FormatResult<RecordBatch> {
    let bad = |e: ArrowError| corrupt(format!("key block: {e}"));
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(bad)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    let batch = concat_batches(&schema, &batches).map_err(bad)?;
    if batch.num_rows() as u64 != rows {
        return Err(corrupt(format!(
            "key block holds {} rows, the layout says {rows}",
            batch.num_rows()
        )));
    }
    Ok(batch)
}

/// Reads the layout back from the end of a hybrid file (`tail` holds the
/// file's last bytes, at least the footer and its trailer).
pub fn parse_footer(tail: &[u8]) -> FormatResult<HybridLayout> {
    let n = tail.len();
    let magic = tail.get(n.saturating_sub(8)..).unwrap_or_default();
    if n < 16 || (magic != HYBRID_MAGIC && magic != HYBRID_MAGIC_V1) {
        return Err(corrupt("no hybrid trailer at the end of the file".into()));
    }
    let len = u64::from_le_bytes(tail[n - 16..n - 8].try_into().expect("8 bytes"));
    if len > HYBRID_FOOTER_BYTES_MAX || len as usize > n - 16 {
        return Err(corrupt(format!("footer length {len} is out of range")));
    }
    let json = &tail[n - 16 - len as usize..n - 16];
    let layout: HybridLayout =
        serde_json::from_slice(json).map_err(|e| corrupt(format!("footer: {e}")))?;
    let inline_max = match magic == HYBRID_MAGIC_V1 {
        true => 0,
        false => INLINE_VAR_BYTES_MAX,
    };
    check_layout(&layout, inline_max).map_err(|e| corrupt(format!("footer: {e}")))?;
    Ok(layout)
}

/// Checks that `layout`'s row slots can be read as it says, whether it
/// came from a file's footer or a manifest: every slot lies inside the
/// row after the validity bitmap, the bitmap has a bit per slot, a
/// variable-length slot is 12 bytes, and values inline in a slot are at
/// most `inline_max` bytes (none in fixed-width slots). Readers slice
/// slots at these offsets; a layout that failed this would make them
/// read out of bounds.
pub fn check_layout(layout: &HybridLayout, inline_max: u32) -> Result<(), String> {
    let width = u64::from(layout.row_width_bytes);
    if u64::from(layout.validity_bytes) * 8 < layout.slots.len() as u64
        || u64::from(layout.validity_bytes) > width
    {
        return Err(format!(
            "a validity bitmap of {} bytes in rows of {width} bytes cannot flag {} row-wise columns",
            layout.validity_bytes,
            layout.slots.len()
        ));
    }
    for slot in &layout.slots {
        let (start, end) = (
            u64::from(slot.offset_bytes),
            u64::from(slot.offset_bytes) + u64::from(slot.width_bytes),
        );
        if start < u64::from(layout.validity_bytes) || end > width || slot.width_bytes == 0 {
            return Err(format!(
                "column {} sits at bytes {start}..{end}, outside rows of {width} bytes after a {}-byte validity bitmap",
                slot.name, layout.validity_bytes
            ));
        }
        if slot.variable_length && slot.width_bytes != VAR_SLOT_BYTES {
            return Err(format!(
                "column {} is variable-length in a {}-byte slot; such slots are {VAR_SLOT_BYTES} bytes",
                slot.name, slot.width_bytes
            ));
        }
        let allowed = if slot.variable_length { inline_max } else { 0 };
        if slot.inline_bytes_max > allowed {
            return Err(format!(
                "column {} says values of up to {} bytes sit in its slot; at most {allowed} can",
                slot.name, slot.inline_bytes_max
            ));
        }
    }
    Ok(())
}

/// A file being written through a running CRC32 and byte count.
pub(crate) struct ChecksummingFile {
    pub inner: BufWriter<File>,
    pub crc: crc32fast::Hasher,
    pub bytes: u64,
}

impl ChecksummingFile {
    pub fn new(file: File) -> Self {
        Self {
            inner: BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }
}

impl Write for ChecksummingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Streams batches into a hybrid file. Row slots and heap bytes go to two
/// side files while the key blocks go to the main file; `finish` appends
/// them, so each section is contiguous.
pub(crate) struct HybridWriter {
    schema: SchemaRef,
    key_schema: SchemaRef,
    main: ChecksummingFile,
    rows: BufWriter<File>,
    heap: BufWriter<File>,
    layout: HybridLayout,
    block_rows_max: usize,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    heap_len: u64,
    row_count: u64,
    stats: Vec<RowGroupStats>,
}

impl HybridWriter {
    pub fn create(
        main: File,
        rows_path: &Path,
        heap_path: &Path,
        schema: SchemaRef,
        key_columns: &[String],
        block_rows_max: usize,
    ) -> FormatResult<Self> {
        let (slots, row_width, validity_bytes) = plan_rows(&schema, key_columns)?;
        let key_fields: Vec<FieldRef> = schema
            .fields()
            .iter()
            .filter(|f| key_columns.contains(f.name()))
            .cloned()
            .collect();
        let mut main = ChecksummingFile::new(main);
        main.write_all(HYBRID_MAGIC).map_err(io_err(rows_path))?;
        let open = |p: &Path| {
            File::create(p)
                .map(|f| BufWriter::with_capacity(1 << 20, f))
                .map_err(io_err(p))
        };
        let layout = HybridLayout {
            key_columns: key_fields.iter().map(|f| f.name().clone()).collect(),
            key_section: Section {
                offset: HYBRID_MAGIC.len() as u64,
                len: 0,
            },
            row_section: Section { offset: 0, len: 0 },
            heap_section: Section { offset: 0, len: 0 },
            row_width_bytes: row_width,
            validity_bytes,
            slots,
            blocks: vec![],
        };
        Ok(Self {
            key_schema: Arc::new(Schema::new(key_fields)),
            schema,
            main,
            rows: open(rows_path)?,
            heap: open(heap_path)?,
            layout,
            block_rows_max: block_rows_max.max(1),
            pending: vec![],
            pending_rows: 0,
            heap_len: 0,
            row_count: 0,
            stats: vec![],
        })
    }

    pub fn write(&mut self, batch: &RecordBatch, path: &Path) -> FormatResult<()> {
        if batch.schema().fields() != self.schema.fields() {
            return Err(FormatError::Invalid(format!(
                "{}: batch schema differs from the partition's",
                path.display()
            )));
        }
        self.pending_rows += batch.num_rows();
        self.pending.push(batch.clone());
        if self.pending_rows >= self.block_rows_max {
            self.flush_block(path)?;
        }
        Ok(())
    }

    fn flush_block(&mut self, path: &Path) -> FormatResult<()> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let invalid = |e: ArrowError| FormatError::Invalid(format!("{}: {e}", path.display()));
        let block = concat_batches(&self.schema, &self.pending).map_err(invalid)?;
        self.pending.clear();
        self.pending_rows = 0;
        let keys = block
            .project(
                &self
                    .key_schema
                    .fields()
                    .iter()
                    .map(|f| self.schema.index_of(f.name()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(invalid)?,
            )
            .map_err(invalid)?;
        let key_bytes = encode_key_block(&keys)?;
        let key = Section {
            offset: self.layout.key_section.end(),
            len: key_bytes.len() as u64,
        };
        self.main.write_all(&key_bytes).map_err(io_err(path))?;
        self.layout.key_section.len += key.len;
        let (mut slots, mut heap) = (Vec::new(), Vec::new());
        encode_rows(
            &block,
            &self.layout.slots,
            self.layout.row_width_bytes,
            self.heap_len,
            &mut slots,
            &mut heap,
        )?;
        self.rows.write_all(&slots).map_err(io_err(path))?;
        self.heap.write_all(&heap).map_err(io_err(path))?;
        self.heap_len += heap.len() as u64;
        self.row_count += block.num_rows() as u64;
        self.layout.blocks.push(HybridBlock {
            rows: block.num_rows() as u64,
            key,
            heap: Section {
                offset: self.heap_len - heap.len() as u64,
                len: heap.len() as u64,
            },
        });
        self.stats.push(RowGroupStats {
            row_count: block.num_rows() as u64,
            byte_size: key.len + slots.len() as u64 + heap.len() as u64,
            columns: vec![],
        });
        Ok(())
    }

    /// Appends the row and heap sections and the footer; returns the file's
    /// layout, row count, block statistics and (CRC32, size).
    pub fn finish(
        mut self,
        path: &Path,
        rows_path: &Path,
        heap_path: &Path,
    ) -> FormatResult<(HybridLayout, u64, Vec<RowGroupStats>, u32, u64)> {
        self.flush_block(path)?;
        let flush = |w: BufWriter<File>, p: &Path| -> FormatResult<File> {
            w.into_inner().map_err(|e| FormatError::Io {
                path: p.display().to_string(),
                source: e.into_error(),
            })
        };
        drop(flush(self.rows, rows_path)?);
        drop(flush(self.heap, heap_path)?);
        let mut layout = self.layout;
        layout.row_section = Section {
            offset: layout.key_section.end(),
            len: self.row_count * layout.row_width_bytes as u64,
        };
        layout.heap_section = Section {
            offset: layout.row_section.end(),
            len: self.heap_len,
        };
        for (side, section) in [
            (rows_path, layout.row_section),
            (heap_path, layout.heap_section),
        ] {
            let mut f = File::open(side).map_err(io_err(side))?;
            let copied = std::io::copy(&mut f, &mut self.main).map_err(io_err(path))?;
            if copied != section.len {
                return Err(FormatError::Invalid(format!(
                    "{}: copied {copied} bytes, expected {}",
                    side.display(),
                    section.len
                )));
            }
        }
        // Heap offsets in the blocks are absolute in the file from here on.
        for b in &mut layout.blocks {
            b.heap.offset += layout.heap_section.offset;
        }
        let footer = serde_json::to_vec(&layout)
            .map_err(|e| FormatError::Invalid(format!("hybrid footer: {e}")))?;
        self.main.write_all(&footer).map_err(io_err(path))?;
        self.main
            .write_all(&(footer.len() as u64).to_le_bytes())
            .map_err(io_err(path))?;
        self.main.write_all(HYBRID_MAGIC).map_err(io_err(path))?;
        self.main.flush().map_err(io_err(path))?;
        self.main.inner.get_ref().sync_all().map_err(io_err(path))?;
        let (crc, bytes) = (self.main.crc.clone().finalize(), self.main.bytes);
        Ok((layout, self.row_count, self.stats, crc, bytes))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
        StringArray, StringViewArray,
    };
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::{PartitionLayout, PartitionWriter, WriterOptions};

    fn table(rows: usize, seed: u64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("f", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("d", DataType::Date32, false),
            Field::new("m", DataType::Decimal128(15, 2), true),
            Field::new("v", DataType::Utf8View, true),
            Field::new("i", DataType::Int32, false),
        ]));
        let x = |i: usize| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter(
                (0..rows).map(|i| (x(i) % 7 != 0).then(|| (x(i) % 1000) as i64 - 500)),
            )),
            Arc::new(StringArray::from_iter((0..rows).map(|i| {
                (x(i) % 5 != 0).then(|| "ab".repeat((x(i) % 9) as usize))
            }))),
            Arc::new(Float64Array::from_iter((0..rows).map(|i| match x(i) % 6 {
                0 => None,
                1 => Some(f64::NAN),
                _ => Some(x(i) as f64 / 3.0),
            }))),
            Arc::new(BooleanArray::from_iter(
                (0..rows).map(|i| (x(i) % 3 != 0).then_some(x(i) % 2 == 0)),
            )),
            Arc::new(Date32Array::from_iter_values(
                (0..rows).map(|i| (x(i) % 9000) as i32),
            )),
            Arc::new(
                Decimal128Array::from_iter((0..rows).map(|i| (i % 4 != 0).then_some(x(i) as i128)))
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            // Inline (up to 12 bytes) and out-of-line values, some not ASCII.
            Arc::new(StringViewArray::from_iter((0..rows).map(|i| {
                (i % 2 == 0).then(|| match x(i) % 3 {
                    0 => format!("a long value number {i}"),
                    1 => format!("é{}", i % 100),
                    _ => format!("über-long value {i} 🦀"),
                })
            }))),
            Arc::new(Int32Array::from_iter_values((0..rows).map(|i| i as i32))),
        ];
        RecordBatch::try_new(schema, cols).unwrap()
    }

    fn write(
        dir: &Path,
        batch: &RecordBatch,
        keys: &[&str],
        block: usize,
    ) -> insitu_wire::FormatDescriptor {
        let options = WriterOptions {
            row_group_rows_max: block,
            layout: PartitionLayout::Hybrid {
                key_columns: keys.iter().map(|k| k.to_string()).collect(),
            },
            ..Default::default()
        };
        let mut w = PartitionWriter::create(dir, "t", 3, batch.schema(), &options).unwrap();
        for at in (0..batch.num_rows()).step_by(100) {
            w.write(&batch.slice(at, 100.min(batch.num_rows() - at)))
                .unwrap();
        }
        w.finish().unwrap()
    }

    /// Reads a hybrid file back whole, block by block.
    fn read_back(dir: &Path, d: &insitu_wire::FormatDescriptor, schema: &SchemaRef) -> RecordBatch {
        let bytes = std::fs::read(dir.join(&d.file)).unwrap();
        let layout = d.hybrid.as_ref().unwrap();
        assert_eq!(
            &parse_footer(&bytes).unwrap(),
            layout,
            "the file describes itself"
        );
        let row_fields: Vec<FieldRef> = layout
            .slots
            .iter()
            .map(|s| Arc::new(schema.field_with_name(&s.name).unwrap().clone()))
            .collect();
        let slot_refs: Vec<(usize, &RowSlot)> = layout.slots.iter().enumerate().collect();
        let width = layout.row_width_bytes as u64;
        let mut out = vec![];
        let mut row = 0u64;
        for block in &layout.blocks {
            let keys = decode_key_block(
                &bytes[block.key.offset as usize..block.key.end() as usize],
                block.rows,
            )
            .unwrap();
            let start = layout.row_section.offset + row * width;
            let slots = &bytes[start as usize..(start + block.rows * width) as usize];
            let heap = &bytes[block.heap.offset as usize..block.heap.end() as usize];
            let base = block.heap.offset - layout.heap_section.offset;
            let rows = decode_rows(
                slots,
                layout.row_width_bytes,
                &slot_refs,
                &row_fields,
                heap,
                base,
            )
            .unwrap();
            let columns: Vec<ArrayRef> = schema
                .fields()
                .iter()
                .map(|f| match keys.column_by_name(f.name()) {
                    Some(c) => Arc::clone(c),
                    None => {
                        let j = layout
                            .slots
                            .iter()
                            .position(|s| s.name == *f.name())
                            .unwrap();
                        Arc::clone(&rows[j])
                    }
                })
                .collect();
            out.push(RecordBatch::try_new(Arc::clone(schema), columns).unwrap());
            row += block.rows;
        }
        concat_batches(schema, &out).unwrap()
    }

    #[test]
    fn round_trips_every_row_type_at_odd_sizes() {
        for rows in [0usize, 1, 2, 7, 49, 50, 51, 1000] {
            for keys in [&["k"][..], &["s", "i"][..]] {
                let dir = tempfile::tempdir().unwrap();
                let batch = table(rows, rows as u64);
                let d = write(dir.path(), &batch, keys, 128);
                assert_eq!(d.layout, insitu_wire::LayoutKind::Hybrid);
                assert_eq!(d.row_count, rows as u64);
                assert_eq!(d.hybrid.as_ref().unwrap().blocks.len(), rows.div_ceil(200));
                assert_eq!(crate::schema_of(&d).unwrap(), *batch.schema());
                crate::verify_file(0, dir.path(), &d).unwrap();
                let back = read_back(dir.path(), &d, &batch.schema());
                // NaN != NaN in arrays' PartialEq: compare the printed form.
                let show = |b: &RecordBatch| {
                    arrow::util::pretty::pretty_format_batches(std::slice::from_ref(b))
                        .unwrap()
                        .to_string()
                };
                assert_eq!(show(&back), show(&batch), "rows {rows} keys {keys:?}");
            }
        }
    }

    #[test]
    fn rejects_unknown_keys_unstorable_types_and_bad_offsets() {
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("l", DataType::new_list(DataType::Int32, true), true),
        ]);
        let err = plan_rows(&schema, &["nope".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("'nope'") && err.contains("k, l"), "{err}");
        let err = plan_rows(&schema, &["k".into()]).unwrap_err().to_string();
        assert!(
            err.contains("column 'l'") && err.contains("row-wise"),
            "{err}"
        );
        let err = plan_rows(&schema, &[]).unwrap_err().to_string();
        assert!(err.contains("at least one key column"), "{err}");

        let batch = table(10, 1);
        let (slots_plan, width, _) = plan_rows(&batch.schema(), &["k".into()]).unwrap();
        let (mut slots, mut heap) = (vec![], vec![]);
        encode_rows(&batch, &slots_plan, width, 0, &mut slots, &mut heap).unwrap();
        let s = slots_plan.iter().position(|s| s.name == "s").unwrap();
        let field = Arc::new(batch.schema().field_with_name("s").unwrap().clone());
        // The first value too long to sit in its slot gets a far offset.
        let at = slots_plan[s].offset_bytes as usize;
        let row = (0..10)
            .find(|&row| var_slot(&slots, width as usize, at, row).1 > 8)
            .unwrap();
        let at = row * width as usize + at;
        slots[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let err = decode_rows(&slots, width, &[(s, &slots_plan[s])], &[field], &heap, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("corrupt") && err.contains("outside"), "{err}");
        // A view column's slot pointing past the heap, and its bytes turned
        // into invalid UTF-8: both name the column.
        let (mut slots, mut heap) = (vec![], vec![]);
        encode_rows(&batch, &slots_plan, width, 0, &mut slots, &mut heap).unwrap();
        let v = slots_plan.iter().position(|s| s.name == "v").unwrap();
        let field = Arc::new(batch.schema().field_with_name("v").unwrap().clone());
        let decode_v = |slots: &[u8], heap: &[u8]| {
            decode_rows(
                slots,
                width,
                &[(v, &slots_plan[v])],
                std::slice::from_ref(&field),
                heap,
                0,
            )
            .map_err(|e| e.to_string())
        };
        assert!(decode_v(&slots, &heap).is_ok());
        let err = decode_v(&slots, &heap[..heap.len() / 2]).unwrap_err();
        assert!(err.contains("column v") && err.contains("outside"), "{err}");
        // The first value past 13 bytes (out of line) gets a stray byte.
        let at = slots_plan[v].offset_bytes as usize;
        let (off, _) = (0..10)
            .map(|row| var_slot(&slots, width as usize, at, row))
            .find(|&(_, len)| len > 13)
            .unwrap();
        heap[off as usize + 13] = 0xff;
        let err = decode_v(&slots, &heap).unwrap_err();
        assert!(err.contains("column v") && err.contains("UTF-8"), "{err}");
        assert!(parse_footer(b"not a hybrid file at all").is_err());
    }

    /// The slots and heap of `batch` under `plan`, and its columns decoded
    /// back from them.
    fn encode_decode(
        batch: &RecordBatch,
        plan: &[RowSlot],
        width: u32,
    ) -> (Vec<u8>, Vec<ArrayRef>) {
        let (mut slots, mut heap) = (vec![], vec![]);
        encode_rows(batch, plan, width, 0, &mut slots, &mut heap).unwrap();
        let refs: Vec<(usize, &RowSlot)> = plan.iter().enumerate().collect();
        let fields: Vec<FieldRef> = plan
            .iter()
            .map(|s| Arc::new(batch.schema().field_with_name(&s.name).unwrap().clone()))
            .collect();
        let columns = decode_rows(&slots, width, &refs, &fields, &heap, 0).unwrap();
        (heap, columns)
    }

    #[test]
    fn short_values_sit_in_their_slots_and_older_files_still_read() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Utf8View, true),
        ]));
        let short = ["", "N", "MAIL", "é", "12345678", "🦀🦀"];
        for rows in [0usize, 1, 2, 7, 49, 50, 51, 1000] {
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                    Arc::new(StringArray::from_iter(
                        (0..rows).map(|i| (i % 5 != 0).then_some(short[i % short.len()])),
                    )),
                    Arc::new(StringViewArray::from_iter_values(
                        (0..rows).map(|i| short[(i * 7) % short.len()]),
                    )),
                ],
            )
            .unwrap();
            let (plan, width, _) = plan_rows(&schema, &["k".into()]).unwrap();
            assert!(plan
                .iter()
                .all(|s| s.inline_bytes_max == INLINE_VAR_BYTES_MAX));
            let (heap, columns) = encode_decode(&batch, &plan, width);
            assert!(heap.is_empty(), "values of up to 8 bytes take no heap");
            assert_eq!(&columns[0], batch.column(1), "rows {rows}");
            assert_eq!(&columns[1], batch.column(2), "rows {rows}");
            // A file written before inlining keeps every value in the heap.
            let old: Vec<RowSlot> = plan
                .iter()
                .map(|s| RowSlot {
                    inline_bytes_max: 0,
                    ..s.clone()
                })
                .collect();
            let (heap, columns) = encode_decode(&batch, &old, width);
            // Each column's heap holds each of its distinct values once.
            let bytes = |c: usize| -> usize {
                let a = batch.column(c);
                let values = arrow::compute::cast(a, &DataType::Utf8).unwrap();
                let values = values.as_string::<i32>();
                let distinct: std::collections::HashSet<&str> = values.iter().flatten().collect();
                distinct.iter().map(|v| v.len()).sum()
            };
            assert_eq!(heap.len(), bytes(1) + bytes(2), "rows {rows}");
            assert_eq!(
                &columns[0],
                batch.column(1),
                "rows {rows}, every value in the heap"
            );
            assert_eq!(
                &columns[1],
                batch.column(2),
                "rows {rows}, every value in the heap"
            );
        }
        // An inline value that is not UTF-8 names its column.
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values([1])),
                Arc::new(StringArray::from_iter_values(["ok"])),
                Arc::new(StringViewArray::from_iter_values(["MAIL"])),
            ],
        )
        .unwrap();
        let (plan, width, _) = plan_rows(&schema, &["k".into()]).unwrap();
        for (column, name) in [(0usize, "s"), (1, "v")] {
            let (mut slots, mut heap) = (vec![], vec![]);
            encode_rows(&batch, &plan, width, 0, &mut slots, &mut heap).unwrap();
            slots[plan[column].offset_bytes as usize] = 0xff;
            let field = Arc::new(schema.field_with_name(name).unwrap().clone());
            let err = decode_rows(
                &slots,
                width,
                &[(column, &plan[column])],
                &[field],
                &heap,
                0,
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains(&format!("column {name}")) && err.contains("UTF-8"),
                "{err}"
            );
        }
    }

    #[test]
    fn repeated_long_values_share_one_heap_copy_up_to_the_limit() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("few", DataType::Utf8View, true),
            Field::new("many", DataType::Utf8, false),
        ]));
        let few = [
            "DELIVER IN PERSON",
            "TAKE BACK RETURN",
            "NONE",
            "COLLECT COD",
        ];
        let many = |i: usize| format!("value number {i:06} of many");
        for rows in [0usize, 1, 2, 7, 49, 50, 51, 1000] {
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                    Arc::new(StringViewArray::from_iter(
                        (0..rows).map(|i| (i % 7 != 3).then_some(few[(i * 5) % few.len()])),
                    )),
                    // Every value twice in a row: past the limit, repeats
                    // are stored again.
                    Arc::new(StringArray::from_iter_values(
                        (0..rows).map(|i| many(i / 2)),
                    )),
                ],
            )
            .unwrap();
            let (plan, width, _) = plan_rows(&schema, &["k".into()]).unwrap();
            let (heap, columns) = encode_decode(&batch, &plan, width);
            assert_eq!(&columns[0], batch.column(1), "rows {rows}");
            assert_eq!(&columns[1], batch.column(2), "rows {rows}");
            let few_bytes: usize = few
                .iter()
                .filter(|v| v.len() > INLINE_VAR_BYTES_MAX as usize)
                .filter(|v| (0..rows).any(|i| i % 7 != 3 && few[(i * 5) % few.len()] == **v))
                .map(|v| v.len())
                .sum();
            // `many` shares its first HEAP_SHARED_VALUES_MAX distinct values
            // (each seen twice, stored once) until the last of them fills
            // the table; from its second row on, every row's is stored.
            let shared_rows = rows.min(2 * HEAP_SHARED_VALUES_MAX - 1);
            let many_bytes =
                shared_rows.div_ceil(2) * many(0).len() + (rows - shared_rows) * many(0).len();
            assert_eq!(heap.len(), few_bytes + many_bytes, "rows {rows}");
        }
    }

    #[test]
    fn views_built_in_the_decode_loop_match_arrows() {
        // Every byte value appears somewhere; offsets use all 32 bits.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 32) as u32
        };
        for len in 0..=40usize {
            let value: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let offset = next();
            assert_eq!(
                view_of(&value, offset),
                make_view(&value, 0, offset),
                "{len} bytes"
            );
            if len <= 8 {
                // The slot's padding is masked off, whatever it holds.
                let mut slot = [0xa5u8; 8];
                slot[..len].copy_from_slice(&value);
                let bits = u64::from_le_bytes(slot);
                assert_eq!(
                    inline_view(bits, len as u64),
                    make_view(&value, 0, 0),
                    "{len} bytes"
                );
            }
        }
    }

    /// The layout `plan_rows` gives `table`'s rows keyed on `k`, with empty
    /// sections and no blocks: what a footer's checks look at.
    fn planned_layout() -> HybridLayout {
        let (slots, width, validity) = plan_rows(&table(1, 0).schema(), &["k".into()]).unwrap();
        let section = Section { offset: 0, len: 0 };
        HybridLayout {
            key_columns: vec!["k".into()],
            key_section: section,
            row_section: section,
            heap_section: section,
            row_width_bytes: width,
            validity_bytes: validity,
            slots,
            blocks: vec![],
        }
    }

    /// `layout` as the tail of a file: JSON, its length, then `magic`.
    fn footer_tail(layout: &HybridLayout, magic: &[u8; 8]) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(layout).unwrap();
        bytes.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        bytes.extend_from_slice(magic);
        bytes
    }

    #[test]
    fn a_footer_claiming_more_inline_bytes_than_its_version_allows_is_refused() {
        let planned = planned_layout();
        let layout = |inline: u32| HybridLayout {
            slots: planned
                .slots
                .iter()
                .map(|s| RowSlot {
                    inline_bytes_max: if s.variable_length { inline } else { 0 },
                    ..s.clone()
                })
                .collect(),
            ..planned.clone()
        };
        assert_eq!(
            parse_footer(&footer_tail(&layout(8), HYBRID_MAGIC)).unwrap(),
            layout(8)
        );
        assert_eq!(
            parse_footer(&footer_tail(&layout(0), HYBRID_MAGIC_V1)).unwrap(),
            layout(0)
        );
        for (inline, magic) in [(9, HYBRID_MAGIC), (8, HYBRID_MAGIC_V1)] {
            let err = parse_footer(&footer_tail(&layout(inline), magic))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("column s") && err.contains(&format!("up to {inline} bytes")),
                "{err}"
            );
        }
    }

    /// A layout (from a footer or a manifest) whose slots a reader would
    /// slice out of bounds is refused, naming what is wrong.
    #[test]
    fn a_layout_whose_slots_leave_the_row_is_refused() {
        let good = planned_layout();
        let width = good.row_width_bytes;
        assert_eq!(check_layout(&good, INLINE_VAR_BYTES_MAX), Ok(()));
        let last = good.slots.len() - 1;
        let var = good.slots.iter().position(|s| s.variable_length).unwrap();
        let narrow = HybridLayout {
            row_width_bytes: width - 1,
            ..good.clone()
        };
        let mut short_var = good.clone();
        short_var.slots[var].width_bytes = 8;
        let mut in_bitmap = good.clone();
        in_bitmap.slots[0].offset_bytes = 0;
        let no_bitmap = HybridLayout {
            validity_bytes: 0,
            ..good.clone()
        };
        let cases = [
            (narrow, format!("column {}", good.slots[last].name)),
            (
                short_var,
                format!("column {} is variable-length", good.slots[var].name),
            ),
            (in_bitmap, format!("column {}", good.slots[0].name)),
            (no_bitmap, "validity bitmap of 0 bytes".to_string()),
        ];
        for (layout, want) in cases {
            let err = check_layout(&layout, INLINE_VAR_BYTES_MAX).unwrap_err();
            assert!(err.contains(&want), "{err} (want {want})");
            let err = parse_footer(&footer_tail(&layout, HYBRID_MAGIC))
                .unwrap_err()
                .to_string();
            assert!(err.contains("corrupt") && err.contains(&want), "{err}");
        }
    }

    #[test]
    fn abandoned_hybrid_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let batch = table(300, 2);
        let options = WriterOptions {
            layout: PartitionLayout::Hybrid {
                key_columns: vec!["k".into()],
            },
            row_group_rows_max: 100,
            ..Default::default()
        };
        let mut w = PartitionWriter::create(dir.path(), "t", 0, batch.schema(), &options).unwrap();
        w.write(&batch).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path().join("t")).unwrap().count(), 0);
    }
}
