//! String and binary views: validation of received ones, compaction of
//! gathered ones.
//!
//! Validation: Arrow's own check (`validate_string_view` in arrow-data,
//! which `ArrayData::validate_values` calls) runs `from_utf8` on every
//! view's bytes, one call per row. A data buffer that holds only whole
//! strings (what a compacted `StringViewArray` holds) is valid UTF-8 as a
//! whole, so one pass over each buffer plus a char-boundary test at both
//! ends of each view proves the same thing: a slice of valid UTF-8 that
//! starts and ends on char boundaries is valid UTF-8. Buffers that fail the
//! whole-buffer pass (garbage between strings is legal) fall back to the
//! per-view check. Before all that, ASCII (most data) is proved valid 64
//! views at a time with no branch per view: any slice of ASCII is UTF-8.
//!
//! Compaction: a gathered view array points into every source batch's
//! buffers; [`compact_views`] copies just the bytes its views reference
//! into one buffer. Arrow's `gc` does the same with one `memcpy` call per
//! string; short strings (most are) here move as one fixed 32-byte copy.
//! When the views share a few buffers (a dictionary page's, repeated once
//! per source batch), [`dedup_view_buffers`] lists each buffer once
//! instead, copying no string.

use arrow::array::{Array, ArrayData, GenericByteViewArray};
use arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use arrow::datatypes::{ByteViewType, DataType};
use arrow::error::ArrowError;

use crate::arena::OutputBuffer;
use crate::gather::{prefetch, PREFETCH_ROWS};
use crate::mem::{pooled_buffer, take_vec};

/// Longest value a view holds itself (Arrow's layout); longer values
/// live in a data buffer. The one name for this limit in the kernels.
pub(crate) const INLINE_BYTES_MAX: u32 = 12;

/// Checks `views` against `buffers` as a `Utf8View` array: inline strings
/// are UTF-8 with zeroed padding, out-of-line views name an existing
/// buffer, lie inside it, carry their string's first four bytes as prefix,
/// and cover valid UTF-8. It accepts exactly what Arrow's
/// `validate_string_view` accepts, faster when the buffers hold only
/// whole strings.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use insitu_kernels::validate_utf8_views;
/// let a = StringViewArray::from(vec!["short", "a string longer than twelve bytes"]);
/// assert!(validate_utf8_views(a.views(), a.data_buffers()).is_ok());
/// ```
pub fn validate_utf8_views(views: &[u128], buffers: &[Buffer]) -> Result<(), ArrowError> {
    let ascii = AsciiBuffers::of(buffers);
    // Its tables are built per call: only for views that fill a chunk.
    let wide = (views.len() >= VALIDATE_CHUNK_VIEWS)
        .then(|| WideCheck::detect(&ascii))
        .flatten();
    let mut whole_utf8: Option<Vec<bool>> = None;
    for (chunk_at, chunk) in views.chunks(VALIDATE_CHUNK_VIEWS).enumerate() {
        let proved = match &wide {
            Some(wide) if chunk.len() == VALIDATE_CHUNK_VIEWS => wide.proves_valid(chunk),
            _ => chunk.iter().fold(true, |ok, &v| ok & ascii.proves_valid(v)),
        };
        if proved {
            continue;
        }
        // Something in the chunk is not plain ASCII (or is wrong): check
        // each view exactly, and name the first bad one.
        let whole_utf8 = whole_utf8.get_or_insert_with(|| {
            (buffers.iter())
                .map(|b| std::str::from_utf8(b).is_ok())
                .collect()
        });
        for (i, &view) in chunk.iter().enumerate() {
            let len = view as u32;
            let checked = if len <= INLINE_BYTES_MAX {
                check_inline(view, len)
            } else {
                check_out_of_line(view, len, buffers, whole_utf8)
            };
            if let Err(what) = checked {
                let idx = chunk_at * VALIDATE_CHUNK_VIEWS + i;
                return Err(ArrowError::InvalidArgumentError(format!(
                    "string view at index {idx}: {what}"
                )));
            }
        }
    }
    Ok(())
}

/// Views checked at a time on the fast path: a chunk that fails is
/// checked again view by view.
const VALIDATE_CHUNK_VIEWS: usize = 64;

/// The data buffers of a view array, as [`AsciiBuffers::proves_valid`]
/// reads them.
struct AsciiBuffers<'a> {
    /// Each buffer, then one that indices past the last map to.
    buffers: Vec<AsciiBuffer<'a>>,
}

struct AsciiBuffer<'a> {
    /// The buffer's bytes, or [`NO_BYTES`] when it holds fewer than 4: no
    /// view's prefix can be read past the end of either.
    bytes: &'a [u8],
    /// The buffer's length if it is all ASCII, else 0: the bytes a view
    /// may cover and still be proved valid.
    ascii_len: usize,
}

/// What stands in for buffers too short to hold an out-of-line string.
const NO_BYTES: &[u8] = &[0; 4];

impl<'a> AsciiBuffers<'a> {
    fn of(buffers: &'a [arrow::buffer::Buffer]) -> Self {
        let entry = |bytes: &'a [u8]| {
            let long = bytes.len() >= 4;
            AsciiBuffer {
                bytes: if long { bytes } else { NO_BYTES },
                ascii_len: if long && bytes.is_ascii() {
                    bytes.len()
                } else {
                    0
                },
            }
        };
        let mut buffers: Vec<AsciiBuffer> = buffers.iter().map(|b| entry(b)).collect();
        buffers.push(entry(&[]));
        Self { buffers }
    }

    /// Whether `view` is a valid ASCII string view: inline, with ASCII
    /// bytes and zeroed padding; or out-of-line, inside an all-ASCII
    /// buffer, with its prefix matching. Any slice of ASCII is UTF-8
    /// starting and ending on char boundaries. `false` proves nothing:
    /// the view may still be valid, and is checked exactly.
    ///
    /// No branch depends on the view: sorted lineitem's dictionary
    /// strings mix inline and out-of-line views at random, and a branch
    /// per view mispredicted on half of them (1Mi such views: 10.6 ms
    /// checked one by one, 4.4 ms this way; `cargo bench --
    /// validate_utf8_views` in bench/kernels).
    #[inline(always)]
    fn proves_valid(&self, view: u128) -> bool {
        let len = view as u32;
        let data = view >> 32;
        let inline_ok = (len <= INLINE_BYTES_MAX)
            & (data >> (len.min(INLINE_BYTES_MAX) * 8) == 0)
            & (data & INLINE_HIGH_BITS == 0);
        let index = ((view >> 64) as u32 as usize).min(self.buffers.len() - 1);
        let buffer = &self.buffers[index];
        let start = (view >> 96) as u32 as usize;
        let in_range = (len > INLINE_BYTES_MAX) & (start + len as usize <= buffer.ascii_len);
        // Views out of range (inline ones too) read their buffer's first
        // bytes instead, so that no branch depends on the view.
        let at = std::hint::select_unpredictable(in_range, start, 0);
        let prefix =
            u32::from_le_bytes(buffer.bytes[at..at + 4].try_into().expect("a 4-byte slice"));
        inline_ok | (in_range & (prefix == data as u32))
    }
}

/// [`AsciiBuffers::proves_valid`] for 16 views at a time in 512-bit
/// registers, where the CPU has AVX-512F. 1Mi views took 1.33 ms against
/// 4.80 ms one view at a time for a dictionary page's (half inline, like
/// sorted l_shipinstruct), 3.85 ms against 7.43 ms for compacted
/// comments (`cargo bench -- validate_utf8_views` in bench/kernels).
struct WideCheck {
    /// Each buffer's first byte, then the stand-in for indices past the
    /// last (as in [`AsciiBuffers`]).
    starts: Vec<u64>,
    /// Each buffer's all-ASCII length (0 if not all ASCII), likewise.
    ascii_lens: Vec<u64>,
}

impl WideCheck {
    /// The check for `ascii`'s buffers, if this CPU runs it.
    fn detect(ascii: &AsciiBuffers) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && ascii.buffers.len() < i32::MAX as usize
        {
            return Some(WideCheck {
                starts: ascii
                    .buffers
                    .iter()
                    .map(|b| b.bytes.as_ptr() as u64)
                    .collect(),
                ascii_lens: ascii.buffers.iter().map(|b| b.ascii_len as u64).collect(),
            });
        }
        let _ = ascii;
        None
    }

    /// Whether every view of `chunk` (64 of them) is proved valid.
    fn proves_valid(&self, chunk: &[u128]) -> bool {
        assert_eq!(chunk.len(), VALIDATE_CHUNK_VIEWS);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `detect` found AVX-512F; the chunk holds 64 views and
        // the tables one entry per buffer plus the stand-in.
        unsafe {
            chunk.chunks_exact(16).all(|views| self.proves_16(views))
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("detected on x86_64 only")
    }

    /// 16 views: transposed into lengths, prefixes, buffer indices and
    /// offsets, one per 32-bit lane; then the same arithmetic as
    /// [`AsciiBuffers::proves_valid`], each out-of-line prefix read by a
    /// gather (masked: only views inside their buffer read it).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn proves_16(&self, views: &[u128]) -> bool {
        use std::arch::x86_64::*;
        debug_assert_eq!(views.len(), 16);
        let p = views.as_ptr() as *const __m512i;
        let (a, b, c, d) = (
            _mm512_loadu_si512(p),
            _mm512_loadu_si512(p.add(1)),
            _mm512_loadu_si512(p.add(2)),
            _mm512_loadu_si512(p.add(3)),
        );
        // Lanes 0, 1 (length, prefix) and 2, 3 (index, offset) of 8 views.
        let low = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
        let high = _mm512_add_epi32(low, _mm512_set1_epi32(2));
        let (ab_lo, ab_hi) = (
            _mm512_permutex2var_epi32(a, low, b),
            _mm512_permutex2var_epi32(a, high, b),
        );
        let (cd_lo, cd_hi) = (
            _mm512_permutex2var_epi32(c, low, d),
            _mm512_permutex2var_epi32(c, high, d),
        );
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        let len = _mm512_permutex2var_epi32(ab_lo, even, cd_lo);
        let prefix = _mm512_permutex2var_epi32(ab_lo, odd, cd_lo);
        let index = _mm512_permutex2var_epi32(ab_hi, even, cd_hi);
        let offset = _mm512_permutex2var_epi32(ab_hi, odd, cd_hi);

        // Inline: in data dword k, bytes past the string are zero and the
        // rest ASCII: the dword lies within 0x7f7f7f7f >> (32 - 8 * n),
        // n = clamp(len - 4k, 0, 4) (shifts of 32 give 0).
        let twelve = _mm512_set1_epi32(INLINE_BYTES_MAX as i32);
        let is_inline = _mm512_cmple_epu32_mask(len, twelve);
        let short_len = _mm512_min_epu32(len, twelve);
        let mut outside = _mm512_setzero_si512();
        for (k, data) in [prefix, index, offset].into_iter().enumerate() {
            let n = _mm512_sub_epi32(short_len, _mm512_set1_epi32(4 * k as i32));
            let n = _mm512_max_epi32(
                _mm512_min_epi32(n, _mm512_set1_epi32(4)),
                _mm512_setzero_si512(),
            );
            let shift = _mm512_sub_epi32(_mm512_set1_epi32(32), _mm512_slli_epi32::<3>(n));
            let allowed = _mm512_srlv_epi32(_mm512_set1_epi32(0x7f7f_7f7f), shift);
            outside = _mm512_or_si512(outside, _mm512_andnot_si512(allowed, data));
        }
        let inline_ok = is_inline & _mm512_testn_epi32_mask(outside, outside);

        // Out-of-line: inside an all-ASCII buffer, prefix matching.
        let last = _mm512_set1_epi32(self.starts.len() as i32 - 1);
        let index = _mm512_min_epu32(index, last);
        let mut out_of_line_ok: u16 = 0;
        for half in 0..2 {
            let pick = |v: __m512i| match half {
                0 => _mm512_castsi512_si256(v),
                _ => _mm512_extracti64x4_epi64::<1>(v),
            };
            let index = pick(index);
            let start = _mm512_i32gather_epi64::<8>(index, self.starts.as_ptr() as *const i64);
            let ascii_len =
                _mm512_i32gather_epi64::<8>(index, self.ascii_lens.as_ptr() as *const i64);
            let len = _mm512_cvtepu32_epi64(pick(len));
            let offset = _mm512_cvtepu32_epi64(pick(offset));
            let end = _mm512_add_epi64(offset, len);
            let in_range = _mm512_cmpgt_epu64_mask(len, _mm512_set1_epi64(INLINE_BYTES_MAX as i64))
                & _mm512_cmple_epu64_mask(end, ascii_len);
            let at = _mm512_add_epi64(start, offset);
            let read = _mm512_mask_i64gather_epi32::<1>(
                _mm256_setzero_si256(),
                in_range,
                at,
                std::ptr::null(),
            );
            let matches = _mm512_cmpeq_epi64_mask(
                _mm512_cvtepu32_epi64(read),
                _mm512_cvtepu32_epi64(pick(prefix)),
            );
            out_of_line_ok |= ((in_range & matches) as u16) << (8 * half);
        }
        inline_ok | out_of_line_ok == u16::MAX
    }
}

/// The high bit of each of an inline view's 12 data bytes.
const INLINE_HIGH_BITS: u128 = 0x8080_8080_8080_8080_8080_8080;

/// What `ArrayData::validate_full` checks (structure, null counts,
/// values, recursively through children), with string views checked by
/// [`validate_utf8_views`].
pub fn validate_full_fast(data: &ArrayData) -> Result<(), ArrowError> {
    data.validate()?;
    data.validate_nulls()?;
    if data.data_type() == &DataType::Utf8View {
        let views = &data.buffer::<u128>(0)[..data.len()];
        validate_utf8_views(views, &data.buffers()[1..])?;
    } else {
        data.validate_values()?;
    }
    data.child_data().iter().try_for_each(validate_full_fast)
}

/// Bytes [`compact_views`] may write past a string's end: strings up to
/// this long are copied as one fixed-size block.
const COPY_BLOCK_BYTES: usize = 32;

/// `array` with the out-of-line bytes of its valid views copied, in view
/// order, into one new data buffer: equal to `array`, and holding no byte
/// no view references. Null views become empty. Same result as Arrow's
/// `GenericByteViewArray::gc`, faster for short strings.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use insitu_kernels::compact_views;
/// let a = StringViewArray::from(vec!["tiny", "a string past twelve bytes", "another long string"]);
/// let slice = a.slice(1, 1);
/// let compact = compact_views(&slice);
/// assert_eq!(compact, slice);
/// assert_eq!(compact.data_buffers()[0].len(), "a string past twelve bytes".len());
/// ```
pub fn compact_views<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
) -> GenericByteViewArray<T> {
    let (_, used) = buffer_use(array.views(), array.data_buffers().len(), array.nulls());
    compact_referenced(array, used)
}

/// [`compact_views`] given the bytes its valid out-of-line views hold.
fn compact_referenced<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
    total: usize,
) -> GenericByteViewArray<T> {
    if total > u32::MAX as usize {
        // One buffer's offsets are u32; Arrow's gc splits into several.
        return array.gc();
    }
    let mut views = copied_views(array);
    let buffers = compact_in_place(
        &mut views,
        array.data_buffers(),
        array.nulls(),
        total,
        OutputBuffer::pooled,
    );
    let views = ScalarBuffer::new(pooled_buffer(views), 0, array.len());
    // SAFETY: every view is the source's view (inline), an empty view (a
    // null), or the source's length and prefix over a copy of the same
    // bytes at its recorded offset in buffer 0; UTF-8 validity carries over.
    unsafe { GenericByteViewArray::new_unchecked(views, buffers, array.nulls().cloned()) }
}

/// `array`'s views in pooled memory, to rewrite in place.
fn copied_views<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> Vec<u128> {
    let mut views: Vec<u128> = take_vec(array.len());
    views.extend_from_slice(array.views());
    views
}

/// Copies the bytes of the valid out-of-line `views` (`total` of them, at
/// most `u32::MAX`) into one buffer from `data(bytes)` and points the
/// views there, in place; null views become empty. Returns the buffers the
/// views then name: that one, or none if no string is out of line.
fn compact_in_place(
    views: &mut [u128],
    buffers: &[Buffer],
    nulls: Option<&NullBuffer>,
    total: usize,
    data: impl FnOnce(usize) -> OutputBuffer,
) -> Vec<Buffer> {
    assert!(total <= u32::MAX as usize, "view offsets are u32");
    let is_valid = |i: usize| nulls.is_none_or(|n| n.is_valid(i));
    let mut out = data(total + COPY_BLOCK_BYTES);
    let bytes = out.bytes_mut();
    let dst = bytes.as_mut_ptr();
    let mut at = 0usize;
    for i in 0..views.len() {
        // Gathered views point anywhere in megabytes of strings: fetch the
        // bytes of a view ahead while this one copies.
        if let Some(&ahead) = views.get(i + PREFETCH_ROWS) {
            if let Some(b) = buffers.get((ahead >> 64) as u32 as usize) {
                prefetch(b.as_ptr().wrapping_add((ahead >> 96) as u32 as usize));
            }
        }
        let view = views[i];
        let len = view as u32 as usize;
        if len <= INLINE_BYTES_MAX as usize {
            continue;
        }
        if !is_valid(i) {
            views[i] = 0;
            continue;
        }
        let index = (view >> 64) as u32 as usize;
        let start = (view >> 96) as u32 as usize;
        let src = buffers[index].as_slice();
        assert!(
            start + len <= src.len() && at + len <= total,
            "view {i} lies outside its buffer or the counted total"
        );
        // SAFETY: `src[start..start + len]` is in bounds (asserted), and so
        // is the block copy's read when `start + 32 <= src.len()`; `bytes`
        // has room for `total + 32` bytes and `at + len <= total`.
        unsafe {
            let from = src.as_ptr().add(start);
            if len <= COPY_BLOCK_BYTES && start + COPY_BLOCK_BYTES <= src.len() {
                std::ptr::copy_nonoverlapping(from, dst.add(at), COPY_BLOCK_BYTES);
            } else {
                std::ptr::copy_nonoverlapping(from, dst.add(at), len);
            }
        }
        views[i] = (view & u64::MAX as u128) | ((at as u128) << 96);
        at += len;
    }
    assert_eq!(at, total, "copied bytes match the counted total");
    // What block copies wrote past the last string is not the column's:
    // zero it, since a chunk arena ships the whole region.
    bytes[total..].fill(0);
    match total {
        0 => vec![],
        _ => vec![out.into_buffer().slice_with_length(0, total)],
    }
}

/// `array` with each data buffer its valid views reference listed once,
/// and no other: buffers that share memory (same address and length)
/// become one, unreferenced buffers go, and views are renumbered to match.
/// No string byte is copied. Null views become empty.
///
/// A gather over batches decoded from one Parquet dictionary page lists
/// the page's buffer once per source batch; shipped as they are, the same
/// bytes would cross the link hundreds of times, and [`compact_views`]
/// would copy every row's string to avoid that.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use arrow::compute::concat;
/// # use insitu_kernels::dedup_view_buffers;
/// let a = StringViewArray::from(vec!["a string past twelve bytes"]);
/// let twice = concat(&[&a, &a]).unwrap();
/// let twice = twice.as_any().downcast_ref::<StringViewArray>().unwrap();
/// let b = StringViewArray::new(twice.views().clone(), vec![a.data_buffers()[0].clone(); 2], None);
/// let shared = dedup_view_buffers(&b);
/// assert_eq!(shared, b);
/// assert_eq!(shared.data_buffers().len(), 1);
/// ```
pub fn dedup_view_buffers<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
) -> GenericByteViewArray<T> {
    let (referenced, _) = buffer_use(array.views(), array.data_buffers().len(), array.nulls());
    let (kept, renumber) = distinct_buffers(array.data_buffers(), &referenced);
    renumbered(array, kept, &renumber)
}

/// Data buffers may hold this many bytes past twice what the views use
/// before [`shrink_views`] copies the strings.
pub const SHRINK_SLACK_BYTES: usize = 4096;

/// `array` with data buffers holding little more than its views use, for
/// shipping (IPC sends whole buffers): as it is when all its buffers
/// together hold at most [`SHRINK_SLACK_BYTES`] (a gather over dictionary
/// pages: nothing to gain, and no pass over the views); else each
/// referenced buffer listed once ([`dedup_view_buffers`]), or, when those
/// still hold more than twice the referenced bytes plus
/// [`SHRINK_SLACK_BYTES`], the strings copied into one buffer
/// ([`compact_views`]). One pass over the views decides.
///
/// ```
/// # use arrow::array::{Array, StringViewArray};
/// # use insitu_kernels::shrink_views;
/// let a = StringViewArray::from_iter_values((0..1000).map(|i| format!("a string past twelve bytes, {i}")));
/// let slice = a.slice(10, 2);
/// let shrunk = shrink_views(&slice);
/// assert_eq!(shrunk, slice);
/// assert!(shrunk.data_buffers()[0].len() < 100);
/// ```
pub fn shrink_views<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
) -> GenericByteViewArray<T> {
    match plan_shrink(array.views(), array.data_buffers(), array.nulls()) {
        Shrink::Keep => array.clone(),
        Shrink::Compact { used } => compact_referenced(array, used),
        Shrink::Renumber { kept, renumber } => renumbered(array, kept, &renumber),
    }
}

/// What [`shrink_views`] does to a view array.
enum Shrink {
    /// Nothing: buffers small, or each referenced once, in order.
    Keep,
    /// Copy the `used` bytes of the valid out-of-line strings into one
    /// buffer.
    Compact { used: usize },
    /// List each referenced buffer once: `kept`, old index -> new index.
    Renumber {
        kept: Vec<Buffer>,
        renumber: Vec<u32>,
    },
}

/// Decides [`shrink_views`] for `views` over `buffers`: at most one pass
/// over the views.
fn plan_shrink(views: &[u128], buffers: &[Buffer], nulls: Option<&NullBuffer>) -> Shrink {
    if buffers.iter().map(|b| b.len()).sum::<usize>() <= SHRINK_SLACK_BYTES {
        return Shrink::Keep;
    }
    let (referenced, used) = buffer_use(views, buffers.len(), nulls);
    let (kept, renumber) = distinct_buffers(buffers, &referenced);
    let held: usize = kept.iter().map(|b| b.len()).sum();
    if held > 2 * used + SHRINK_SLACK_BYTES {
        Shrink::Compact { used }
    } else if kept.len() == buffers.len() {
        Shrink::Keep // each referenced once, in order: no change
    } else {
        Shrink::Renumber { kept, renumber }
    }
}

/// [`shrink_views`] of the views being written in `views` (over `buffers`,
/// validity `nulls`), in place: returns the data buffers the views name
/// after. Compacted strings go to a buffer from `data(bytes)`; more than
/// `u32::MAX` of them stay where they are.
pub(crate) fn shrink_views_in_place(
    views: &mut [u128],
    buffers: &[Buffer],
    nulls: Option<&NullBuffer>,
    data: impl FnOnce(usize) -> OutputBuffer,
) -> Vec<Buffer> {
    match plan_shrink(views, buffers, nulls) {
        Shrink::Compact { used } if used <= u32::MAX as usize => {
            compact_in_place(views, buffers, nulls, used, data)
        }
        Shrink::Keep | Shrink::Compact { .. } => buffers.to_vec(),
        Shrink::Renumber { kept, renumber } => {
            renumber_in_place(views, nulls, &renumber);
            kept
        }
    }
}

/// `array` over `kept` buffers, its views renumbered by `renumber` (old
/// buffer index -> index in `kept`).
fn renumbered<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
    kept: Vec<Buffer>,
    renumber: &[u32],
) -> GenericByteViewArray<T> {
    let views = array.views();
    let nulls = array.nulls();
    if kept.len() == array.data_buffers().len() {
        return array.clone(); // each referenced once, in order: no change
    }
    if kept.is_empty() && nulls.is_none() {
        // Every string inline: the views stay, the buffers go.
        // SAFETY: no view names a buffer.
        return unsafe { GenericByteViewArray::new_unchecked(views.clone(), kept, None) };
    }
    let mut out = copied_views(array);
    renumber_in_place(&mut out, nulls, renumber);
    let views = ScalarBuffer::new(pooled_buffer(out), 0, array.len());
    // SAFETY: every valid out-of-line view keeps its length, prefix and
    // offset and names a buffer that is the same memory as the one it
    // named; inline views are unchanged and null views are empty. UTF-8
    // validity carries over.
    unsafe { GenericByteViewArray::new_unchecked(views, kept, nulls.cloned()) }
}

/// Renumbers the out-of-line views' buffer indices by `renumber`, in
/// place; null views become empty.
fn renumber_in_place(views: &mut [u128], nulls: Option<&NullBuffer>, renumber: &[u32]) {
    // Branch-free: strings inline or out of line alternate at random.
    for view in views.iter_mut() {
        let long = *view as u32 > INLINE_BYTES_MAX;
        let index = (*view >> 64) as u32 as usize * long as usize;
        let renumbered = (*view & !BUFFER_INDEX_BITS) | ((renumber[index] as u128) << 64);
        if long {
            *view = renumbered;
        }
    }
    if let Some(nulls) = nulls {
        for row in (0..views.len()).filter(|&row| nulls.is_null(row)) {
            views[row] = 0;
        }
    }
}

/// A view's buffer index (bits 64..96 of an out-of-line view).
const BUFFER_INDEX_BITS: u128 = (u32::MAX as u128) << 64;

/// Which of `buffer_count` buffers the valid out-of-line views name, and
/// the bytes those views hold.
fn buffer_use(
    views: &[u128],
    buffer_count: usize,
    nulls: Option<&NullBuffer>,
) -> (Vec<bool>, usize) {
    // At least one entry, so inline views can mark entry 0 (with false)
    // without a branch.
    let mut referenced = vec![false; buffer_count.max(1)];
    let mut used = 0usize;
    for (row, &view) in views.iter().enumerate() {
        let len = view as u32;
        let long = len > INLINE_BYTES_MAX && nulls.is_none_or(|n| n.is_valid(row));
        let index = (view >> 64) as u32 as usize * long as usize;
        match referenced.get_mut(index) {
            Some(r) if index < buffer_count || !long => *r |= long,
            _ => panic!("view {row} names buffer {index} of {buffer_count}"),
        }
        used += len as usize * long as usize;
    }
    referenced.truncate(buffer_count);
    (referenced, used)
}

/// The referenced buffers, each distinct one once (in first-reference
/// order of the list), and each old index's new index.
fn distinct_buffers(buffers: &[Buffer], referenced: &[bool]) -> (Vec<Buffer>, Vec<u32>) {
    let mut kept: Vec<Buffer> = vec![];
    let mut index_of = std::collections::HashMap::new();
    // At least one entry: inline views read entry 0 and ignore it.
    let mut renumber = vec![u32::MAX; buffers.len().max(1)];
    let mut last: Option<((usize, usize), u32)> = None;
    for (old, buffer) in buffers.iter().enumerate() {
        if !referenced[old] {
            continue;
        }
        // Batches of one row group share its dictionary page: most repeats
        // are of the buffer just seen.
        let key = (buffer.as_ptr() as usize, buffer.len());
        if last.is_some_and(|(k, _)| k == key) {
            renumber[old] = last.expect("checked").1;
            continue;
        }
        let new = *index_of.entry(key).or_insert_with(|| {
            kept.push(buffer.clone());
            kept.len() as u32 - 1
        });
        renumber[old] = new;
        last = Some((key, new));
    }
    (kept, renumber)
}

fn check_inline(view: u128, len: u32) -> Result<(), &'static str> {
    if len < INLINE_BYTES_MAX && (view >> (32 + len * 8)) != 0 {
        return Err("non-zero padding after an inline string");
    }
    // Padding is zero, so all-ASCII is one mask test over the 12 bytes.
    let ascii = (view >> 32) & 0x8080_8080_8080_8080_8080_8080 == 0;
    let bytes = view.to_le_bytes();
    if ascii || std::str::from_utf8(&bytes[4..4 + len as usize]).is_ok() {
        Ok(())
    } else {
        Err("inline string is not UTF-8")
    }
}

fn check_out_of_line(
    view: u128,
    len: u32,
    buffers: &[Buffer],
    whole_utf8: &[bool],
) -> Result<(), &'static str> {
    let index = (view >> 64) as u32 as usize;
    let start = (view >> 96) as u32 as usize;
    let end = start + len as usize;
    let buffer = buffers.get(index).ok_or("buffer index out of range")?;
    let s = buffer
        .get(start..end)
        .ok_or("string runs past its buffer")?;
    if s[..4] != ((view >> 32) as u32).to_le_bytes() {
        return Err("prefix does not match the string");
    }
    let utf8 = if whole_utf8[index] {
        is_char_boundary(buffer, start) && is_char_boundary(buffer, end)
    } else {
        std::str::from_utf8(s).is_ok()
    };
    utf8.then_some(()).ok_or("string is not UTF-8")
}

/// Whether `at` is a char boundary of UTF-8 `bytes` (their end counts).
fn is_char_boundary(bytes: &[u8], at: usize) -> bool {
    // Continuation bytes are 0b10xxxxxx, i.e. -64..-1 as i8.
    bytes.get(at).is_none_or(|&b| (b as i8) >= -0x40)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 512-bit check proves exactly the chunks the per-view one does:
    /// views valid and not (lengths around 12, prefixes off by a bit,
    /// offsets past a buffer, indices past the last), over ASCII buffers,
    /// a non-ASCII one and one too short for any prefix.
    #[test]
    fn wide_check_matches_the_per_view_check() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let ascii: Vec<u8> = (0..300).map(|_| rng.random_range(b'a'..=b'z')).collect();
        let mut accented = ascii.clone();
        accented[150..152].copy_from_slice("é".as_bytes());
        let buffers = [
            Buffer::from_vec(ascii.clone()),
            Buffer::from_vec(accented),
            Buffer::from_vec(b"ab".to_vec()),
            Buffer::from_vec(ascii[..100].to_vec()),
        ];
        let checks = AsciiBuffers::of(&buffers);
        let Some(wide) = WideCheck::detect(&checks) else {
            return; // no AVX-512F here: only the per-view check runs
        };
        // Clean views are valid; the others often are not.
        let view = |rng: &mut rand::rngs::StdRng, clean: bool| -> u128 {
            let len = [0u32, 3, 11, 12, 13, 20, 60][rng.random_range(0..7)];
            let mut v = if len <= INLINE_BYTES_MAX {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&len.to_le_bytes());
                (4..4 + len as usize).for_each(|i| bytes[i] = rng.random_range(b'a'..=b'z'));
                u128::from_le_bytes(bytes)
            } else {
                let index = match clean {
                    true => [0, 3][rng.random_range(0..2)],
                    false => rng.random_range(0..5u32),
                };
                let bytes = buffers
                    .get(index as usize)
                    .map_or(&[][..], |b| b.as_slice());
                let offset = match clean {
                    true => rng.random_range(0..=bytes.len() as u32 - len),
                    false => rng.random_range(0..bytes.len() as u32 + 20),
                };
                let prefix = (bytes.get(offset as usize..offset as usize + 4))
                    .map_or(0, |p| u32::from_le_bytes(p.try_into().unwrap()));
                len as u128
                    | (prefix as u128) << 32
                    | (index as u128) << 64
                    | (offset as u128) << 96
            };
            if !clean && rng.random_bool(0.3) {
                v ^= 1 << rng.random_range(0..128);
            }
            v
        };
        let (mut proved, mut refused) = (0, 0);
        for _ in 0..2000 {
            let mut chunk: Vec<u128> = (0..VALIDATE_CHUNK_VIEWS)
                .map(|_| view(&mut rng, true))
                .collect();
            if rng.random_bool(0.5) {
                chunk[rng.random_range(0..VALIDATE_CHUNK_VIEWS)] = view(&mut rng, false);
            }
            let want = chunk.iter().all(|&v| checks.proves_valid(v));
            assert_eq!(wide.proves_valid(&chunk), want, "{chunk:x?}");
            (proved, refused) = (proved + want as usize, refused + !want as usize);
        }
        assert!(
            proved > 0 && refused > 0,
            "{proved} proved, {refused} refused"
        );
    }
    use arrow::array::StringViewArray;
    use arrow::buffer::Buffer;

    fn view(len: u32, prefix: [u8; 4], buffer: u32, offset: u32) -> u128 {
        len as u128
            | (u32::from_le_bytes(prefix) as u128) << 32
            | (buffer as u128) << 64
            | (offset as u128) << 96
    }

    /// Buffers that hold little in all are shipped as they are, without a
    /// pass over the views; past that, each is listed once.
    #[test]
    fn shrink_keeps_small_buffers_as_they_are() {
        let page = StringViewArray::from(vec!["DELIVER IN PERSON", "TAKE BACK RETURN"]);
        let listed = |times: usize| {
            let buffers = vec![page.data_buffers()[0].clone(); times];
            StringViewArray::try_new(page.views().clone(), buffers, None).unwrap()
        };
        let page_bytes = page.data_buffers()[0].len();
        let few = listed(SHRINK_SLACK_BYTES / page_bytes);
        let shrunk = shrink_views(&few);
        assert!(
            shrunk.views().inner().ptr_eq(few.views().inner()),
            "views untouched"
        );
        assert_eq!(shrunk.data_buffers().len(), few.data_buffers().len());
        let many = listed(SHRINK_SLACK_BYTES / page_bytes + 1);
        let shrunk = shrink_views(&many);
        assert_eq!(shrunk, many);
        assert_eq!(shrunk.data_buffers().len(), 1, "listed once");
    }

    #[test]
    fn accepts_what_arrow_builds() {
        let a = StringViewArray::from(vec!["", "ascii", "ünïcödé strings, long ones", "≈"]);
        validate_utf8_views(a.views(), a.data_buffers()).unwrap();
    }

    #[test]
    fn rejects_a_view_that_splits_a_char() {
        // "aaaaaaaaaaaaé" is 13 ASCII bytes then a 2-byte char; a view of 14
        // bytes ends inside it.
        let buffer = Buffer::from("aaaaaaaaaaaaaé".as_bytes());
        let ok = view(15, *b"aaaa", 0, 0);
        let split = view(14, *b"aaaa", 0, 0);
        validate_utf8_views(&[ok], std::slice::from_ref(&buffer)).unwrap();
        let err = validate_utf8_views(&[ok, split], &[buffer]).unwrap_err();
        assert!(
            err.to_string().contains("index 1: string is not UTF-8"),
            "{err}"
        );
    }

    /// A bad view past the first chunk of ASCII views is named by its
    /// own index, whichever check finds it.
    #[test]
    fn names_the_first_bad_view_of_a_later_chunk() {
        let buffer = Buffer::from("0123456789abcdefgh".as_bytes());
        let good = [view(13, *b"0123", 0, 0), view(3, *b"abc\0", 0, 0)];
        let bad = [
            (view(13, *b"x123", 0, 0), "prefix does not match"),
            (view(13, *b"0123", 0, 6), "runs past its buffer"),
            (view(2, *b"ab\0x", 0, 0), "non-zero padding"),
        ];
        for (wrong, what) in bad {
            let mut views: Vec<u128> = (0..200).map(|i| good[i % 2]).collect();
            views[130] = wrong;
            views[150] = wrong;
            let err = validate_utf8_views(&views, std::slice::from_ref(&buffer)).unwrap_err();
            let err = err.to_string();
            assert!(err.contains("index 130: ") && err.contains(what), "{err}");
        }
    }

    #[test]
    fn checks_each_view_when_its_buffer_is_not_all_utf8() {
        // Bytes no view covers may be anything, here a lone 0xff.
        let buffer = Buffer::from(b"0123456789abcd\xff".as_slice());
        validate_utf8_views(&[view(14, *b"0123", 0, 0)], std::slice::from_ref(&buffer)).unwrap();
        validate_utf8_views(&[view(15, *b"0123", 0, 0)], &[buffer]).unwrap_err();
    }

    #[test]
    fn rejects_bad_structure() {
        let buffer = Buffer::from("0123456789abcdefgh".as_bytes());
        let cases = [
            view(13, *b"0123", 1, 0), // no buffer 1
            view(13, *b"0123", 0, 6), // runs past the end
            view(13, *b"x123", 0, 0), // wrong prefix
            1 | (0xffu128 << 40),     // inline padding not zero
            2 | (0xc3u128 << 32),     // inline string not UTF-8
        ];
        for v in cases {
            assert!(validate_utf8_views(&[v], std::slice::from_ref(&buffer)).is_err());
        }
    }
}
