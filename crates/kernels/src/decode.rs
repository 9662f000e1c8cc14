//! Dictionary decode (NASCENT2 section 3.6): codes in, plain values out.
//!
//! ```text
//!   fixed width:  out[i] = values[code[i]]                 (a gather)
//!   strings:      index[code] = (offsets[code], offsets[code+1] - offsets[code])
//!                 (the dictionary's own Arrow offsets: nothing to build)
//!                 pass 1: out offsets = prefix sum of index[code[i]].len,
//!                         start[i] = index[code[i]].offset
//!                 pass 2: copy bytes[start[i] ..] to out[offsets[i] ..],
//!                         one 32-byte move per value of at most 32 bytes
//!   dictionaries of short strings (no nulls, at most 64Ki values of at
//!   most 32 bytes, once 4 rows per value have been decoded with it, 16
//!   past 4096 values):
//!                 slot[code] = value padded to 32 bytes, len[code]
//!                 pass 1: out offsets = prefix sum of len[code[i]]
//!                 pass 2: move slot[code[i]] to out[offsets[i] ..]
//!   to views:     table[code] = view(offset, len), once per dictionary
//!                 out[i] = table[code[i]]           (a 16-byte gather)
//! ```
//!
//! The tables are built once per dictionary: [`DictionaryDecoder`] keeps
//! them while its batches share the dictionary's buffers, so a scan of a
//! column chunk (one dictionary, many batches) builds them once; the free
//! functions build them per call.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::builder::make_view;
use arrow::array::{
    make_array, new_null_array, Array, ArrayData, ArrayRef, AsArray, BinaryViewArray,
    DictionaryArray, GenericByteArray, PrimitiveArray, StringViewArray,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::ArrowNativeType;
use arrow::datatypes::{
    ArrowDictionaryKeyType, BinaryType, ByteArrayType, DataType, LargeBinaryType, LargeUtf8Type,
    Utf8Type,
};
use arrow::downcast_dictionary_array;
use arrow::error::ArrowError;

use crate::gather::{gather_values, prefetch, prefetch_pays, PREFETCH_ROWS};
use crate::mem::{pooled_buffer, recycle, take_vec, Pod};
use crate::views::INLINE_BYTES_MAX;

/// Decodes a dictionary array into a plain array of its value type.
///
/// ```
/// use arrow::array::{Array, DictionaryArray, StringArray};
/// use arrow::datatypes::Int32Type;
/// use insitu_kernels::dictionary_decode;
///
/// let dict: DictionaryArray<Int32Type> = vec!["AIR", "RAIL", "AIR"].into_iter().collect();
/// let plain = dictionary_decode(&dict).unwrap();
/// assert_eq!(plain.as_any().downcast_ref::<StringArray>().unwrap(),
///            &StringArray::from(vec!["AIR", "RAIL", "AIR"]));
/// ```
pub fn dictionary_decode(array: &dyn Array) -> Result<ArrayRef, ArrowError> {
    DictionaryDecoder::new().decode(array)
}

/// Decodes batch after batch of dictionary arrays, building what a
/// dictionary needs (its slot table, its view table) once and reusing it
/// while the batches share that dictionary, as the batches Parquet's
/// reader makes from one column chunk do.
///
/// A dictionary is "the same" when its values are the same buffers (the
/// decoder holds on to them, so their addresses cannot be reused while it
/// compares). The slot table of a dictionary is built once it has
/// decoded four rows per entry (16 past 4096 entries); the view table on
/// first use. 100M rows in 64Ki-row batches from 64Ki entries of 1-32
/// bytes decoded in 0.111 s against 0.189 s building per call, and to
/// views in 0.108 s against 0.262 s (`sortbench --only-decode`).
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Array, DictionaryArray, Int32Array, StringArray};
/// use insitu_kernels::DictionaryDecoder;
///
/// let words = Arc::new(StringArray::from(vec!["AIR", "RAIL", "SHIP"]));
/// let mut decoder = DictionaryDecoder::new();
/// for keys in [vec![0, 2], vec![1, 1, 0]] {
///     let batch = DictionaryArray::new(Int32Array::from(keys.clone()), words.clone());
///     let plain = decoder.decode(&batch).unwrap();
///     let want: StringArray = keys.iter().map(|&k| Some(words.value(k as usize))).collect();
///     assert_eq!(plain.as_any().downcast_ref::<StringArray>().unwrap(), &want);
/// }
/// ```
#[derive(Default)]
pub struct DictionaryDecoder {
    prepared: Option<Prepared>,
}

/// What the decoder built for the dictionary it saw last.
struct Prepared {
    /// The dictionary's values, held so their buffers stay the ones compared.
    dictionary: ArrayData,
    /// Rows decoded with this dictionary so far, this batch's included.
    rows: usize,
    slots: SlotState,
    views: Option<ViewTable>,
}

enum SlotState {
    /// Not built: too few rows so far.
    Unbuilt,
    Built(SlotTable),
    /// The dictionary has a value too long for a slot, or too many entries.
    Unfit,
}

impl DictionaryDecoder {
    /// A decoder that has seen no dictionary yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes a dictionary array into a plain array of its value type, as
    /// [`dictionary_decode`] does.
    pub fn decode(&mut self, array: &dyn Array) -> Result<ArrayRef, ArrowError> {
        downcast_dictionary_array!(
            array => {
                let prepared = self.prepare(array.values(), array.len());
                decode_typed(array, prepared)
            },
            t => Err(not_a_dictionary(t))
        )
    }

    /// Decodes a dictionary array of strings or binaries into views, as
    /// [`dictionary_decode_to_views`] does.
    pub fn decode_to_views(&mut self, array: &dyn Array) -> Result<ArrayRef, ArrowError> {
        downcast_dictionary_array!(
            array => {
                let prepared = self.prepare(array.values(), array.len());
                decode_to_views(array, prepared)
            },
            t => Err(not_a_dictionary(t))
        )
    }

    /// The prepared state for `values`: kept if they are the dictionary
    /// seen last, else fresh; `rows` more rows counted against it.
    fn prepare(&mut self, values: &ArrayRef, rows: usize) -> &mut Prepared {
        let data = values.to_data();
        let same = matches!(&self.prepared, Some(p) if p.dictionary.ptr_eq(&data));
        if !same {
            self.prepared = Some(Prepared {
                dictionary: data,
                rows: 0,
                slots: SlotState::Unbuilt,
                views: None,
            });
        }
        let prepared = self.prepared.as_mut().expect("set above");
        prepared.rows = prepared.rows.saturating_add(rows);
        prepared
    }
}

impl Prepared {
    /// The slot table, built now if the dictionary has decoded enough rows
    /// for it to pay and every value fits a slot.
    fn slot_table<O: ArrowNativeType>(
        &mut self,
        bytes: &[u8],
        value_offsets: &[O],
    ) -> Option<&SlotTable> {
        if matches!(self.slots, SlotState::Unbuilt) {
            let entries = value_offsets.len().saturating_sub(1);
            if entries.saturating_mul(slot_table_rows_per_entry(entries)) > self.rows {
                return None;
            }
            self.slots = match slot_table(bytes, value_offsets) {
                Some(table) => SlotState::Built(table),
                None => SlotState::Unfit,
            };
        }
        match &self.slots {
            SlotState::Built(table) => Some(table),
            _ => None,
        }
    }

    /// The view table, built on first use.
    fn view_table(&mut self, values: &dyn Array) -> Result<&ViewTable, ArrowError> {
        if self.views.is_none() {
            self.views = Some(view_table(values)?);
        }
        Ok(self.views.as_ref().expect("set above"))
    }
}

fn not_a_dictionary(t: &DataType) -> ArrowError {
    ArrowError::InvalidArgumentError(format!(
        "dictionary decode needs a dictionary array, got {t}"
    ))
}

fn decode_typed<K: ArrowDictionaryKeyType>(
    dict: &DictionaryArray<K>,
    prepared: &mut Prepared,
) -> Result<ArrayRef, ArrowError> {
    let values = dict.values();
    let keys = dict.keys();
    let fixed_width = values.data_type().is_primitive() && values.data_type() != &DataType::Boolean;
    if fixed_width && keys.null_count() == 0 && values.logical_null_count() == 0 {
        return decode_fixed_direct(keys.values(), values.as_ref());
    }
    if matches!(
        values.data_type(),
        DataType::Utf8View | DataType::BinaryView
    ) {
        return decode_to_views(dict, prepared);
    }
    if keys.null_count() == 0 && values.logical_null_count() == 0 {
        if let Some(out) = decode_bytes_through_slots(values.as_ref(), keys, prepared) {
            return out;
        }
    }
    let codes = codes_in_range(keys, values.len());
    if values.is_empty() {
        // Every code was checked, so every row is null.
        recycle_codes(codes);
        return Ok(new_null_array(values.data_type(), keys.len()));
    }
    let nulls = row_nulls(dict, &codes);
    let out = match values.data_type() {
        DataType::Utf8 => decode_bytes(values.as_bytes::<Utf8Type>(), &codes, nulls),
        DataType::LargeUtf8 => decode_bytes(values.as_bytes::<LargeUtf8Type>(), &codes, nulls),
        DataType::Binary => decode_bytes(values.as_bytes::<BinaryType>(), &codes, nulls),
        DataType::LargeBinary => decode_bytes(values.as_bytes::<LargeBinaryType>(), &codes, nulls),
        dt if dt.is_primitive() && !matches!(dt, DataType::Boolean) => {
            decode_fixed(values.as_ref(), &codes, nulls)
        }
        _ => arrow::compute::cast(dict, values.data_type()),
    };
    recycle_codes(codes);
    out
}

/// The codes as u32 indices; null rows get code 0 (their output is masked).
/// Panics naming the first valid row whose code is past the dictionary.
/// 4-byte keys without nulls are borrowed, not copied (a negative i32
/// reads as a u32 past any dictionary, so the range check still sees it).
fn codes_in_range<K: ArrowDictionaryKeyType>(
    keys: &PrimitiveArray<K>,
    dictionary_len: usize,
) -> Cow<'_, [u32]> {
    let check = |i: usize, code: usize| {
        if code >= dictionary_len {
            key_out_of_range_at(code, i, dictionary_len);
        }
    };
    let check_widest = |codes: &[u32]| {
        if let Some(code) = widest_code(codes).filter(|&c| c >= dictionary_len) {
            let row = codes.iter().position(|&c| c as usize == code);
            check(row.unwrap_or(0), code);
        }
    };
    match keys.nulls().filter(|n| n.null_count() > 0) {
        None if std::mem::size_of::<K::Native>() == 4 => {
            let values = keys.values();
            // SAFETY: 4-byte keys are i32 or u32, each readable as u32.
            let codes: &[u32] =
                unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), values.len()) };
            check_widest(codes);
            Cow::Borrowed(codes)
        }
        None => {
            // Convert in a loop that vectorizes, check once. Keys wider
            // than u32 are checked before they are narrowed.
            let mut codes = take_vec(keys.len());
            let widest = keys.values().iter().map(|k| k.as_usize()).max();
            if let Some(code) = widest.filter(|&c| c >= dictionary_len) {
                let row = keys.values().iter().position(|k| k.as_usize() == code);
                check(row.unwrap_or(0), code);
            }
            codes.extend(keys.values().iter().map(|k| k.as_usize() as u32));
            Cow::Owned(codes)
        }
        Some(nulls) => {
            let mut codes = take_vec(keys.len());
            codes.extend(keys.values().iter().enumerate().map(|(i, k)| {
                if nulls.is_null(i) {
                    return 0;
                }
                let code = k.as_usize();
                check(i, code);
                code as u32
            }));
            Cow::Owned(codes)
        }
    }
}

/// The largest code, in a loop compiled for AVX2 where the CPU has it:
/// without, the unsigned max is emulated in SSE2 and took 16% of string
/// decode (perf, 64Ki entries); with it, 3%.
fn widest_code(codes: &[u32]) -> Option<usize> {
    // SAFETY: reading a slice has no preconditions.
    unsafe { with_avx2(|| codes.iter().copied().max().map(|c| c as usize)) }
}

/// Returns an owned code vector to the scratch pool.
fn recycle_codes(codes: Cow<'_, [u32]>) {
    if let Cow::Owned(codes) = codes {
        recycle(codes);
    }
}

#[cold]
fn key_out_of_range_at(code: usize, row: usize, dictionary_len: usize) -> ! {
    panic!("dictionary key {code} at row {row} out of range ({dictionary_len} values)")
}

/// A row is null if its key is null or the value its key names is null.
fn row_nulls<K: ArrowDictionaryKeyType>(
    dict: &DictionaryArray<K>,
    codes: &[u32],
) -> Option<NullBuffer> {
    let value_nulls = dict.values().logical_nulls().filter(|n| n.null_count() > 0);
    let key_nulls = dict.keys().nulls().filter(|n| n.null_count() > 0);
    if value_nulls.is_none() && key_nulls.is_none() {
        return None;
    }
    let valid = BooleanBuffer::collect_bool(codes.len(), |i| {
        key_nulls.is_none_or(|n| n.is_valid(i))
            && value_nulls
                .as_ref()
                .is_none_or(|n| n.is_valid(codes[i] as usize))
    });
    Some(NullBuffer::new(valid))
}

/// The common case in one pass: no nulls, keys used as indices directly.
fn decode_fixed_direct<N: ArrowNativeType>(
    keys: &[N],
    values: &dyn Array,
) -> Result<ArrayRef, ArrowError> {
    let data = values.to_data();
    let buffer = match values.data_type().primitive_width() {
        Some(1) => gather_by_keys(keys, data.buffer::<u8>(0)),
        Some(2) => gather_by_keys(keys, data.buffer::<u16>(0)),
        Some(4) => gather_by_keys(keys, data.buffer::<u32>(0)),
        Some(8) => gather_by_keys(keys, data.buffer::<u64>(0)),
        Some(16) => gather_by_keys(keys, data.buffer::<u128>(0)),
        w => {
            return Err(ArrowError::NotYetImplemented(format!(
                "dictionary decode of {}-byte values",
                w.unwrap_or(0)
            )))
        }
    };
    let out = ArrayData::builder(values.data_type().clone())
        .len(keys.len())
        .add_buffer(buffer)
        .build()?;
    Ok(make_array(out))
}

/// `values[keys[i]]` for every key, none null. Panics naming the first
/// key past the dictionary, after the gather.
fn gather_by_keys<N: ArrowNativeType, T: ArrowNativeType + Pod>(
    keys: &[N],
    values: &[T],
) -> Buffer {
    let Some(last) = values.len().checked_sub(1) else {
        match keys.first() {
            Some(k) => key_out_of_range(k.as_usize(), 0),
            None => return Buffer::from(Vec::<T>::new()),
        }
    };
    // The range check rides along the gather: clamp, remember, panic
    // after. A separate checking pass took half the decode time
    // (perf, 64Ki-entry dictionaries), and a branch per row keeps the
    // loop from unrolling.
    // A plain loop over locals: through `extend` and a captured flag
    // the flag went to memory every row.
    let n = keys.len();
    let mut out: Vec<T> = take_vec(n);
    #[cfg(target_arch = "x86_64")]
    if let Some(widest) = simd::try_gather(keys, values, &mut out.spare_capacity_mut()[..n]) {
        // SAFETY: `try_gather` wrote all n slots.
        unsafe { out.set_len(n) };
        if widest > last {
            let bad = keys
                .iter()
                .find(|k| k.as_usize() > last)
                .expect("a bad key");
            key_out_of_range(bad.as_usize(), values.len());
        }
        return pooled_buffer(out);
    }
    let mut out_of_range = false;
    let dst = &mut out.spare_capacity_mut()[..n];
    // Dictionaries that crowd L2 miss on most rows: prefetch ahead so
    // the misses overlap.
    let prefetched = if prefetch_pays(std::mem::size_of_val(values)) {
        n.saturating_sub(PREFETCH_ROWS)
    } else {
        0
    };
    let base = values.as_ptr();
    let mut gather = |i: usize| {
        let k = keys[i].as_usize();
        out_of_range |= k > last;
        // SAFETY: `min(last)` keeps the index inside `values`.
        dst[i].write(unsafe { *values.get_unchecked(k.min(last)) });
    };
    for i in 0..prefetched {
        prefetch(base.wrapping_add(keys[i + PREFETCH_ROWS].as_usize()));
        gather(i);
    }
    for i in prefetched..n {
        gather(i);
    }
    // SAFETY: all n slots were written above.
    unsafe { out.set_len(n) };
    if out_of_range {
        let bad = keys
            .iter()
            .find(|k| k.as_usize() > last)
            .expect("a bad key");
        key_out_of_range(bad.as_usize(), values.len());
    }
    pooled_buffer(out)
}

/// AVX2 gathers for 4-byte keys into 4- and 8-byte values: eight (or
/// four) values per instruction instead of one load each; 16-byte values
/// (views) by unrolled loads.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use arrow::datatypes::ArrowNativeType;

    /// Gathers `values[keys[i]]` into `dst` (keys clamped to the last
    /// value) and returns the widest key, if this CPU and these types have
    /// a vector path; `None` (and nothing written) otherwise. AVX-512
    /// gathers (16 4-byte or 8 8-byte lanes) measured no faster than these
    /// AVX2 ones: from 64Ki entries both run at the rate L2 hands out lines.
    pub(super) fn try_gather<N: ArrowNativeType, T: Copy>(
        keys: &[N],
        values: &[T],
        dst: &mut [MaybeUninit<T>],
    ) -> Option<usize> {
        let fits = std::mem::size_of::<N>() == 4
            && !values.is_empty()
            && values.len() <= i32::MAX as usize
            && dst.len() == keys.len();
        if !fits || !std::is_x86_feature_detected!("avx2") {
            return None;
        }
        // SAFETY: 4-byte dictionary keys are i32 or u32, either of which
        // reads as u32 (a negative key becomes a key past any dictionary).
        let keys: &[u32] = unsafe { std::slice::from_raw_parts(keys.as_ptr().cast(), keys.len()) };
        // SAFETY: AVX2 was detected above; the sizes match the casts.
        unsafe {
            match std::mem::size_of::<T>() {
                4 => Some(gather_4(
                    keys,
                    values.as_ptr().cast(),
                    values.len(),
                    dst.as_mut_ptr().cast(),
                )),
                8 => Some(gather_8(
                    keys,
                    values.as_ptr().cast(),
                    values.len(),
                    dst.as_mut_ptr().cast(),
                )),
                16 => Some(gather_16(
                    keys,
                    values.as_ptr().cast(),
                    values.len(),
                    dst.as_mut_ptr().cast(),
                )),
                _ => None,
            }
        }
    }

    /// # Safety
    /// AVX2 available; `values` has `len` (1..=i32::MAX) elements; `dst`
    /// has room for `keys.len()`.
    #[target_feature(enable = "avx2")]
    unsafe fn gather_4(keys: &[u32], values: *const i32, len: usize, dst: *mut i32) -> usize {
        let last = (len - 1) as u32;
        let clamp = _mm256_set1_epi32(last as i32);
        let mut widest = _mm256_setzero_si256();
        let blocks = keys.len() / 8;
        for b in 0..blocks {
            if b % 2 == 0 {
                prefetch_keys(keys, b * 8);
            }
            let k = _mm256_loadu_si256(keys.as_ptr().add(b * 8).cast());
            widest = _mm256_max_epu32(widest, k);
            let v = _mm256_i32gather_epi32::<4>(values, _mm256_min_epu32(k, clamp));
            _mm256_storeu_si256(dst.add(b * 8).cast(), v);
        }
        let lanes: [u32; 8] = std::mem::transmute(widest);
        let widest = lanes.into_iter().max().unwrap_or(0);
        scalar_tail(keys, blocks * 8, values, last, dst, widest)
    }

    /// # Safety
    /// As for [`gather_4`].
    #[target_feature(enable = "avx2")]
    unsafe fn gather_8(keys: &[u32], values: *const i64, len: usize, dst: *mut i64) -> usize {
        let last = (len - 1) as u32;
        let clamp = _mm_set1_epi32(last as i32);
        let mut widest = _mm_setzero_si128();
        let blocks = keys.len() / 4;
        for b in 0..blocks {
            if b % 4 == 0 {
                prefetch_keys(keys, b * 4);
            }
            let k = _mm_loadu_si128(keys.as_ptr().add(b * 4).cast());
            widest = _mm_max_epu32(widest, k);
            let v = _mm256_i32gather_epi64::<8>(values, _mm_min_epu32(k, clamp));
            _mm256_storeu_si256(dst.add(b * 4).cast(), v);
        }
        let lanes: [u32; 4] = std::mem::transmute(widest);
        let widest = lanes.into_iter().max().unwrap_or(0);
        scalar_tail(keys, blocks * 4, values, last, dst, widest)
    }

    /// 16-byte values (string views) four rows at a time, one unaligned
    /// 16-byte load each: no gather instruction moves 16-byte lanes, and
    /// four independent loads keep as many misses in flight. sortbench,
    /// views of 64Ki entries (1 MiB), one decoder: 0.64-0.65 G rows/s
    /// through the scalar loop, 0.65-0.76 this way.
    ///
    /// # Safety
    /// As for [`gather_4`].
    #[target_feature(enable = "avx2")]
    unsafe fn gather_16(
        keys: &[u32],
        values: *const __m128i,
        len: usize,
        dst: *mut __m128i,
    ) -> usize {
        let last = (len - 1) as u32;
        let mut widest = 0u32;
        let blocks = keys.len() / 4;
        for b in 0..blocks {
            if b % 4 == 0 {
                prefetch_keys(keys, b * 4);
            }
            let k = keys.as_ptr().add(b * 4);
            let (k0, k1, k2, k3) = (*k, *k.add(1), *k.add(2), *k.add(3));
            widest = widest.max(k0.max(k1).max(k2.max(k3)));
            let v0 = _mm_loadu_si128(values.add(k0.min(last) as usize));
            let v1 = _mm_loadu_si128(values.add(k1.min(last) as usize));
            let v2 = _mm_loadu_si128(values.add(k2.min(last) as usize));
            let v3 = _mm_loadu_si128(values.add(k3.min(last) as usize));
            let out = dst.add(b * 4);
            _mm_storeu_si128(out, v0);
            _mm_storeu_si128(out.add(1), v1);
            _mm_storeu_si128(out.add(2), v2);
            _mm_storeu_si128(out.add(3), v3);
        }
        scalar_tail(keys, blocks * 4, values, last, dst, widest)
    }

    /// Keys read ahead of the gathers (in keys): the gathers' misses crowd
    /// out the hardware's stream prefetch of the keys. `sortbench
    /// --only-decode` (100M keys streamed from memory, one core), G values/s
    /// without and with: 64Ki entries 1.37 -> 1.44-1.69 (4-byte values),
    /// 1.21 -> 1.44-1.51 (8-byte); 256 entries 1.66 -> 2.4-3.0 and 1.77 ->
    /// 2.2-2.7. 256 and 4096 keys ahead measured the same as 1024.
    const KEYS_PREFETCH_AHEAD: usize = 1024;

    /// Prefetches the cache line of keys `KEYS_PREFETCH_AHEAD` past `at`.
    #[inline(always)]
    fn prefetch_keys(keys: &[u32], at: usize) {
        // SAFETY: a prefetch is a hint: it reads nothing and cannot fault.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(keys.as_ptr().wrapping_add(at + KEYS_PREFETCH_AHEAD).cast())
        }
    }

    /// The keys from `from` on, one at a time (clamped to `last`); returns
    /// the widest of them and `widest`.
    ///
    /// # Safety
    /// `values` has `last + 1` elements; `dst` has room for `keys.len()`.
    #[inline(always)]
    unsafe fn scalar_tail<T: Copy>(
        keys: &[u32],
        from: usize,
        values: *const T,
        last: u32,
        dst: *mut T,
        widest: u32,
    ) -> usize {
        let mut out = widest;
        for (i, &k) in keys.iter().enumerate().skip(from) {
            out = out.max(k);
            *dst.add(i) = *values.add(k.min(last) as usize);
        }
        out as usize
    }
}

#[cold]
fn key_out_of_range(key: usize, dictionary_len: usize) -> ! {
    panic!("dictionary key {key} out of range ({dictionary_len} values)")
}

fn decode_fixed(
    values: &dyn Array,
    codes: &[u32],
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef, ArrowError> {
    let data = values.to_data();
    let buffer = match values.data_type().primitive_width() {
        Some(1) => pooled_buffer(gather_values(data.buffer::<u8>(0), codes)),
        Some(2) => pooled_buffer(gather_values(data.buffer::<u16>(0), codes)),
        Some(4) => pooled_buffer(gather_values(data.buffer::<u32>(0), codes)),
        Some(8) => pooled_buffer(gather_values(data.buffer::<u64>(0), codes)),
        Some(16) => pooled_buffer(gather_values(data.buffer::<u128>(0), codes)),
        w => {
            return Err(ArrowError::NotYetImplemented(format!(
                "dictionary decode of {}-byte values",
                w.unwrap_or(0)
            )))
        }
    };
    let out = ArrayData::builder(values.data_type().clone())
        .len(codes.len())
        .add_buffer(buffer)
        .nulls(nulls)
        .build()?;
    Ok(make_array(out))
}

/// Variable-length values through the (offset, length) the dictionary's
/// offsets give each code, in two passes: each row's start and output
/// offset (the running sum of lengths), then the bytes. Knowing every
/// row's output offset before copying makes each copy one 32-byte move
/// whose address does not wait on the previous row's length; one pass
/// that did both took 8-16% longer (the two loops benchmarked alone, 256
/// and 64Ki entries). Small dictionaries of short values without nulls
/// go through a table of 32-byte slots instead ([`copy_through_slots`]).
fn decode_bytes<T: ByteArrayType>(
    values: &GenericByteArray<T>,
    codes: &[u32],
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef, ArrowError>
where
    T::Offset: Pod,
{
    let bytes = values.value_data();
    let value_offsets = values.value_offsets();
    let is_valid = |row: usize| nulls.as_ref().is_none_or(|n| n.is_valid(row));
    // Starts as u32 when they fit: half the scratch of u64.
    let starts_fit_u32 = u32::try_from(bytes.len()).is_ok();
    let (out_offsets, out_bytes) = match (starts_fit_u32, &nulls) {
        (true, None) => copy_in_two_passes::<T, u32>(bytes, value_offsets, codes, |_| true)?,
        (true, Some(_)) => copy_in_two_passes::<T, u32>(bytes, value_offsets, codes, is_valid)?,
        (false, _) => copy_in_two_passes::<T, u64>(bytes, value_offsets, codes, is_valid)?,
    };
    Ok(byte_array::<T>(out_offsets, out_bytes, nulls))
}

/// The decoded rows as an Arrow byte array.
fn byte_array<T: ByteArrayType>(
    out_offsets: Vec<T::Offset>,
    out_bytes: Vec<u8>,
    nulls: Option<NullBuffer>,
) -> ArrayRef
where
    T::Offset: Pod,
{
    debug_assert!(out_offsets.windows(2).all(|w| w[0] <= w[1]));
    // SAFETY: the offsets are a running sum of lengths from 0, so they
    // are monotonic (checking that again cost 6% of string decode, perf).
    let offsets =
        unsafe { OffsetBuffer::new_unchecked(ScalarBuffer::from(pooled_buffer(out_offsets))) };
    // SAFETY: each row's bytes are one whole value of the dictionary
    // (valid for T, UTF-8 included) and the offsets are their running sum.
    let out =
        unsafe { GenericByteArray::<T>::new_unchecked(offsets, pooled_buffer(out_bytes), nulls) };
    Arc::new(out)
}

/// Strings or binaries without nulls through the dictionary's slot table;
/// `None` when `values` are not of a byte type or have no slot table
/// (yet). Panics naming the first key past the dictionary.
fn decode_bytes_through_slots<K: ArrowDictionaryKeyType>(
    values: &dyn Array,
    keys: &PrimitiveArray<K>,
    prepared: &mut Prepared,
) -> Option<Result<ArrayRef, ArrowError>> {
    fn through<T: ByteArrayType, K: ArrowDictionaryKeyType>(
        values: &GenericByteArray<T>,
        keys: &PrimitiveArray<K>,
        prepared: &mut Prepared,
    ) -> Option<Result<ArrayRef, ArrowError>>
    where
        T::Offset: Pod,
    {
        let table = prepared.slot_table(values.value_data(), values.value_offsets())?;
        let codes = codes_in_range(keys, table.slots.len());
        let out = copy_through_slots::<T>(table, &codes).map(|(o, b)| byte_array::<T>(o, b, None));
        recycle_codes(codes);
        Some(out)
    }
    match values.data_type() {
        DataType::Utf8 => through(values.as_bytes::<Utf8Type>(), keys, prepared),
        DataType::LargeUtf8 => through(values.as_bytes::<LargeUtf8Type>(), keys, prepared),
        DataType::Binary => through(values.as_bytes::<BinaryType>(), keys, prepared),
        DataType::LargeBinary => through(values.as_bytes::<LargeBinaryType>(), keys, prepared),
        _ => None,
    }
}

/// Pass 1 records each row's start in `bytes` (type S) and output offset;
/// pass 2 copies. Null rows are empty.
/// Precondition: every valid row's code indexes the dictionary (checked
/// by `codes_in_range`, which panics otherwise).
fn copy_in_two_passes<T: ByteArrayType, S: ArrowNativeType + Pod>(
    bytes: &[u8],
    value_offsets: &[T::Offset],
    codes: &[u32],
    is_valid: impl Fn(usize) -> bool,
) -> Result<(Vec<T::Offset>, Vec<u8>), ArrowError>
where
    T::Offset: Pod,
{
    let entries = value_offsets.len().saturating_sub(1);
    debug_assert!(codes.iter().all(|&c| (c as usize) < entries.max(1)));
    let n = codes.len();
    let mut out_offsets: Vec<T::Offset> = take_vec(n + 1);
    let mut starts: Vec<S> = take_vec(n);
    let mut total = 0usize;
    let offset_slots = &mut out_offsets.spare_capacity_mut()[..n + 1];
    offset_slots[0].write(T::Offset::usize_as(0));
    let rows = codes
        .iter()
        .zip(&mut starts.spare_capacity_mut()[..n])
        .zip(&mut offset_slots[1..]);
    for (row, ((&code, start_slot), offset_slot)) in rows.enumerate() {
        let (start, len) = if is_valid(row) {
            // SAFETY: the caller checked every valid row's code against
            // the dictionary, so `code + 1` indexes its offsets.
            let (a, b) = unsafe {
                (
                    value_offsets.get_unchecked(code as usize).as_usize(),
                    value_offsets.get_unchecked(code as usize + 1).as_usize(),
                )
            };
            (a, b - a)
        } else {
            (0, 0)
        };
        start_slot.write(S::usize_as(start));
        total += len;
        offset_slot.write(T::Offset::usize_as(total));
    }
    // SAFETY: the loop wrote all n + 1 offsets and n starts.
    unsafe {
        out_offsets.set_len(n + 1);
        starts.set_len(n);
    }
    if let Err(e) = offsets_hold::<T>(total) {
        recycle(starts);
        return Err(e);
    }
    let mut out: Vec<u8> = take_vec(total + SHORT_VALUE_BYTES);
    // SAFETY: each start and length come from a valid byte array's
    // offsets, so `start + len <= bytes.len()`; the output offsets are
    // their running sum up to `total`, and `out` has room for `total + 32`.
    unsafe { copy_rows(bytes, &starts, &out_offsets, out.as_mut_ptr()) };
    recycle(starts);
    // SAFETY: bytes [0, total) were all written by `copy_rows`.
    unsafe { out.set_len(total) };
    Ok((out_offsets, out))
}

/// Whether `T`'s offsets can address `total` bytes of decoded values.
fn offsets_hold<T: ByteArrayType>(total: usize) -> Result<(), ArrowError> {
    match T::Offset::from_usize(total) {
        Some(_) => Ok(()),
        None => Err(ArrowError::InvalidArgumentError(format!(
            "decoded values reach {total} bytes, past what {} offsets hold",
            T::DATA_TYPE
        ))),
    }
}

/// Bytes copied per value in one move (instead of a variable-length
/// memcpy call) when the value is at most this long.
const SHORT_VALUE_BYTES: usize = 32;

/// Largest dictionary decoded through a slot table
/// (`slot_table_entries_max`): 64Ki slots of 32 bytes, 2 MiB, plus 64 KiB
/// of lengths.
const SLOT_TABLE_ENTRIES_MAX: usize = 1 << 16;

/// Rows per entry a dictionary decodes before its slot table is built:
/// building costs about a row per entry while the table stays in L2, more
/// past it (fresh pages, L3). Per call, 100M rows from 64Ki entries took
/// 0.230 s through slots against 0.178 s without in 256Ki-row batches (4
/// rows per entry), 0.182 against 0.219 s in 1Mi-row batches (16).
fn slot_table_rows_per_entry(entries: usize) -> usize {
    match entries <= SLOT_TABLE_CHEAP_ENTRIES {
        true => 4,
        false => 16,
    }
}

/// Dictionaries up to this many entries have slot tables (128 KiB) that
/// stay in L2 and build in about a row's time per entry.
const SLOT_TABLE_CHEAP_ENTRIES: usize = 4096;

/// One dictionary value, zero-padded to a 32-byte move.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Slot([u8; SHORT_VALUE_BYTES]);

/// Each value of a dictionary padded into a [`Slot`], and its length.
///
/// For large dictionaries a packed index instead (one u32 of start and
/// length per entry, 32-byte moves from the dictionary's own bytes: 1.3
/// MiB touched instead of 2 MiB for 64Ki entries) was no faster: 0.40-0.58 s
/// against 0.39-0.42 s for 100M rows (`sortbench --only-decode`, one
/// decoder); a value often spans two cache lines.
struct SlotTable {
    slots: Vec<Slot>,
    /// One byte a value: at most 32, and 64Ki of them stay in L2.
    lens: Vec<u8>,
}

/// The slot table of a dictionary; `None` when a value is longer than a
/// slot or there are no entries or more than [`SLOT_TABLE_ENTRIES_MAX`].
fn slot_table<O: ArrowNativeType>(bytes: &[u8], value_offsets: &[O]) -> Option<SlotTable> {
    let entries = value_offsets.len().saturating_sub(1);
    if entries == 0 || entries > SLOT_TABLE_ENTRIES_MAX {
        return None;
    }
    let mut slots = Vec::with_capacity(entries);
    let mut lens = Vec::with_capacity(entries);
    for ends in value_offsets.windows(2) {
        let value = &bytes[ends[0].as_usize()..ends[1].as_usize()];
        if value.len() > SHORT_VALUE_BYTES {
            return None;
        }
        let mut slot = Slot([0; SHORT_VALUE_BYTES]);
        slot.0[..value.len()].copy_from_slice(value);
        slots.push(slot);
        lens.push(value.len() as u8);
    }
    Some(SlotTable { slots, lens })
}

/// String decode through a slot table: pass 1 sums the lengths into the
/// output offsets, pass 2 moves each row's slot to its offset. Against the
/// two passes over the dictionary's own offsets this keeps no start per
/// row, reads one length instead of two offsets and moves every row
/// without a branch: 100M rows from 256 entries of 1-32 bytes decoded in
/// 0.102 s against 0.155 s (`sortbench --only-decode`, 64Ki-row batches).
/// Precondition: every code indexes the table (checked by
/// `codes_in_range`, which panics otherwise; checking in pass 1 instead,
/// clamped, made the decode 15% slower).
fn copy_through_slots<T: ByteArrayType>(
    table: &SlotTable,
    codes: &[u32],
) -> Result<(Vec<T::Offset>, Vec<u8>), ArrowError>
where
    T::Offset: Pod,
{
    let SlotTable { slots, lens } = table;
    assert_eq!(slots.len(), lens.len(), "a length per slot");
    debug_assert!(codes.iter().all(|&c| (c as usize) < slots.len()));
    let n = codes.len();
    let mut out_offsets: Vec<T::Offset> = take_vec(n + 1);
    let offset_slots = &mut out_offsets.spare_capacity_mut()[..n + 1];
    offset_slots[0].write(T::Offset::usize_as(0));
    let mut total = 0usize;
    for (&code, offset_slot) in codes.iter().zip(&mut offset_slots[1..]) {
        // SAFETY: the caller checked every code against the dictionary.
        total += unsafe { *lens.get_unchecked(code as usize) } as usize;
        offset_slot.write(T::Offset::usize_as(total));
    }
    // SAFETY: the loop wrote all n + 1 offsets.
    unsafe { out_offsets.set_len(n + 1) };
    if let Err(e) = offsets_hold::<T>(total) {
        recycle(out_offsets);
        return Err(e);
    }
    let mut out: Vec<u8> = take_vec(total + SHORT_VALUE_BYTES);
    // SAFETY: codes index `slots`; the offsets are the running sum of the
    // slots' lengths up to `total`, and `out` has room for `total + 32`.
    unsafe { copy_slots(slots, codes, &out_offsets, out.as_mut_ptr()) };
    // SAFETY: bytes [0, total) were all written by `copy_slots`.
    unsafe { out.set_len(total) };
    Ok((out_offsets, out))
}

/// Rows ahead whose slot [`copy_slots`] prefetches when the table crowds
/// L2: criterion `decoder strings 64Ki entries` (a 2 MiB table, 2 MiB L2)
/// 4.29 ms without, 3.84 ms 16 rows ahead, 3.74 ms 32, 3.71 ms 64.
const SLOT_PREFETCH_ROWS: usize = 32;

/// Moves row `i`'s whole slot to `dst + offsets[i]`, in row order: the
/// padding past the value lands where the next row's value goes. One
/// 32-byte load and store a row with AVX2 ([`with_avx2`]).
///
/// # Safety
/// Every code indexes `slots`; `offsets.len() == codes.len() + 1`,
/// monotonic; `dst` writable for `offsets[last] + 32` bytes.
unsafe fn copy_slots<O: ArrowNativeType>(
    slots: &[Slot],
    codes: &[u32],
    offsets: &[O],
    dst: *mut u8,
) {
    with_avx2(|| copy_slots_inline(slots, codes, offsets, dst))
}

/// # Safety
/// As for [`copy_slots`].
#[inline(always)]
unsafe fn copy_slots_inline<O: ArrowNativeType>(
    slots: &[Slot],
    codes: &[u32],
    offsets: &[O],
    dst: *mut u8,
) {
    debug_assert_eq!(offsets.len(), codes.len() + 1);
    let move_slot = |row: usize, code: u32| {
        let slot = slots.get_unchecked(code as usize).0;
        let at = offsets.get_unchecked(row).as_usize();
        (dst.add(at) as *mut [u8; SHORT_VALUE_BYTES]).write_unaligned(slot);
    };
    let prefetched = match prefetch_pays(std::mem::size_of_val(slots)) {
        true => codes.len().saturating_sub(SLOT_PREFETCH_ROWS),
        false => 0,
    };
    for (row, &code) in codes[..prefetched].iter().enumerate() {
        let ahead = *codes.get_unchecked(row + SLOT_PREFETCH_ROWS);
        prefetch(slots.as_ptr().wrapping_add(ahead as usize));
        move_slot(row, code);
    }
    for (row, &code) in codes.iter().enumerate().skip(prefetched) {
        move_slot(row, code);
    }
}

/// Copies row `i`'s value (`bytes[starts[i]..]`, as long as its output
/// offsets say) to `dst + offsets[i]`, in row order: a 32-byte move may
/// run past its row, and the next row overwrites the excess. With AVX2
/// the move is one instruction; with SSE it is two, and the loop took 41%
/// longer (benchmarked alone, 256 entries).
///
/// # Safety
/// `offsets.len() == starts.len() + 1`, monotonic; every
/// `starts[i] + (offsets[i + 1] - offsets[i]) <= bytes.len()`; `dst`
/// writable for `offsets[last] + 32` bytes, not overlapping `bytes`.
unsafe fn copy_rows<O: ArrowNativeType, S: ArrowNativeType>(
    bytes: &[u8],
    starts: &[S],
    offsets: &[O],
    dst: *mut u8,
) {
    with_avx2(|| copy_rows_inline(bytes, starts, offsets, dst))
}

/// Runs `body` compiled for AVX2 where the CPU has it (a 32-byte move is
/// then one instruction), else as it is. `body` must inline into it.
///
/// # Safety
/// `body`'s own preconditions.
#[inline(always)]
unsafe fn with_avx2<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        return avx2(body);
    }
    body()
}

/// # Safety
/// AVX2 available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2<R>(body: impl FnOnce() -> R) -> R {
    body()
}

/// # Safety
/// As for [`copy_rows`].
#[inline(always)]
unsafe fn copy_rows_inline<O: ArrowNativeType, S: ArrowNativeType>(
    bytes: &[u8],
    starts: &[S],
    offsets: &[O],
    dst: *mut u8,
) {
    debug_assert_eq!(offsets.len(), starts.len() + 1);
    for (row, start) in starts.iter().enumerate() {
        let at = offsets.get_unchecked(row).as_usize();
        let len = offsets.get_unchecked(row + 1).as_usize() - at;
        copy_value(bytes, start.as_usize(), len, dst.add(at));
    }
}

/// Copies `bytes[start..start + len]` to `dst`: one 32-byte move when the
/// value is short and 32 bytes are readable from `start`, else out of line.
///
/// # Safety
/// `start + len <= bytes.len()`, and `dst` writable for `max(len, 32)`
/// bytes that do not overlap `bytes`.
#[inline(always)]
unsafe fn copy_value(bytes: &[u8], start: usize, len: usize, dst: *mut u8) {
    if len <= SHORT_VALUE_BYTES && start + SHORT_VALUE_BYTES <= bytes.len() {
        let chunk = (bytes.as_ptr().add(start) as *const [u8; SHORT_VALUE_BYTES]).read_unaligned();
        (dst as *mut [u8; SHORT_VALUE_BYTES]).write_unaligned(chunk);
    } else {
        copy_near_end(bytes.as_ptr().add(start), dst, len);
    }
}

/// The rare copy of a value too long, or too near the end of the
/// dictionary's bytes, for one 32-byte move. Out of line on purpose:
/// inlined, LLVM merged both branches into one `memcpy` call per row with
/// the length picked by a `cmov`, which made string decode 3x slower.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cold]
#[inline(never)]
unsafe fn copy_near_end(src: *const u8, dst: *mut u8, len: usize) {
    std::ptr::copy_nonoverlapping(src, dst, len)
}

/// Decodes a dictionary of strings or binaries into a view array
/// (`Utf8View` or `BinaryView`) whose views point into the dictionary's
/// own value bytes: one 16-byte gather per row, and no string byte copied.
///
/// ```text
///   table[code] = view(offsets[code], length)   once per dictionary
///                 (the (offset, length) index; values of at most 12
///                 bytes are inline in their view)
///   out[i]      = table[code[i]]                a 16-byte gather
/// ```
///
/// The output keeps the dictionary's value buffer alive while any view of
/// a value longer than 12 bytes does. Dictionaries of more than 4 GiB of
/// values (past a view's u32 offset) are refused.
///
/// ```
/// use arrow::array::{Array, DictionaryArray, StringViewArray};
/// use arrow::datatypes::Int32Type;
/// use insitu_kernels::dictionary_decode_to_views;
///
/// let dict: DictionaryArray<Int32Type> =
///     vec!["DELIVER IN PERSON", "NONE", "DELIVER IN PERSON"].into_iter().collect();
/// let plain = dictionary_decode_to_views(&dict).unwrap();
/// assert_eq!(plain.as_any().downcast_ref::<StringViewArray>().unwrap(),
///            &StringViewArray::from(vec!["DELIVER IN PERSON", "NONE", "DELIVER IN PERSON"]));
/// ```
pub fn dictionary_decode_to_views(array: &dyn Array) -> Result<ArrayRef, ArrowError> {
    DictionaryDecoder::new().decode_to_views(array)
}

fn decode_to_views<K: ArrowDictionaryKeyType>(
    dict: &DictionaryArray<K>,
    prepared: &mut Prepared,
) -> Result<ArrayRef, ArrowError> {
    let table = prepared.view_table(dict.values().as_ref())?;
    let keys = dict.keys();
    let (views, nulls) = if keys.null_count() == 0 && dict.values().logical_null_count() == 0 {
        (gather_by_keys(keys.values(), &table.views), None)
    } else {
        let codes = codes_in_range(keys, table.views.len());
        let nulls = row_nulls(dict, &codes);
        let views = if table.views.is_empty() {
            // Every code was checked, so every row is null: empty views.
            Buffer::from(vec![0u128; codes.len()])
        } else {
            pooled_buffer(gather_values(&table.views, &codes))
        };
        recycle_codes(codes);
        (views, nulls)
    };
    let views = ScalarBuffer::<u128>::new(views, 0, keys.len());
    // SAFETY: every view is one of the table's, each made from one whole
    // value of the dictionary (UTF-8 checked when `utf8`) or taken from a
    // valid view array, and pointing into `table.buffers`.
    let out: ArrayRef = if table.utf8 {
        Arc::new(unsafe { StringViewArray::new_unchecked(views, table.buffers.clone(), nulls) })
    } else {
        Arc::new(unsafe { BinaryViewArray::new_unchecked(views, table.buffers.clone(), nulls) })
    };
    Ok(out)
}

/// A dictionary's values as one view per entry, the buffers those views
/// point into, and whether they are strings.
struct ViewTable {
    views: ScalarBuffer<u128>,
    buffers: Vec<Buffer>,
    utf8: bool,
}

fn view_table(values: &dyn Array) -> Result<ViewTable, ArrowError> {
    match values.data_type() {
        DataType::Utf8 => views_of(values.as_bytes::<Utf8Type>(), true),
        DataType::LargeUtf8 => views_of(values.as_bytes::<LargeUtf8Type>(), true),
        DataType::Binary => views_of(values.as_bytes::<BinaryType>(), false),
        DataType::LargeBinary => views_of(values.as_bytes::<LargeBinaryType>(), false),
        DataType::Utf8View => {
            let v = values.as_string_view();
            let (views, buffers) = (v.views().clone(), v.data_buffers().to_vec());
            Ok(ViewTable {
                views,
                buffers,
                utf8: true,
            })
        }
        DataType::BinaryView => {
            let v = values.as_binary_view();
            let (views, buffers) = (v.views().clone(), v.data_buffers().to_vec());
            Ok(ViewTable {
                views,
                buffers,
                utf8: false,
            })
        }
        t => Err(ArrowError::InvalidArgumentError(format!(
            "dictionary decode to views needs string or binary values, got {t}"
        ))),
    }
}

/// One view per value of `values`, into its own value buffer (shared, not
/// copied; not kept at all when every value is inline).
fn views_of<T: ByteArrayType>(
    values: &GenericByteArray<T>,
    utf8: bool,
) -> Result<ViewTable, ArrowError> {
    let bytes = values.values();
    if u32::try_from(bytes.len()).is_err() {
        return Err(ArrowError::InvalidArgumentError(format!(
            "dictionary values hold {} bytes, past the {} bytes a view can address",
            bytes.len(),
            u32::MAX
        )));
    }
    let offsets = values.value_offsets();
    let entries = offsets.len().saturating_sub(1);
    // From the scratch pool, and back to it when the last view array
    // decoded from it is dropped.
    let mut views: Vec<u128> = take_vec(entries);
    // A plain loop over locals: through `extend` and a captured `longest`
    // (in memory every entry) the table took 0.321 s per 100M entries,
    // this 0.291 s.
    let mut longest = 0usize;
    let bytes_read: &[u8] = bytes;
    for (slot, w) in views.spare_capacity_mut()[..entries]
        .iter_mut()
        .zip(offsets.windows(2))
    {
        let (start, end) = (w[0].as_usize(), w[1].as_usize());
        longest = longest.max(end - start);
        slot.write(view_of_value(bytes_read, start, end));
    }
    // SAFETY: all `entries` slots were written above.
    unsafe { views.set_len(entries) };
    let buffers = if longest > INLINE_BYTES_MAX as usize {
        vec![bytes.clone()]
    } else {
        Vec::new()
    };
    let views = ScalarBuffer::new(pooled_buffer(views), 0, entries);
    Ok(ViewTable {
        views,
        buffers,
        utf8,
    })
}

/// The view of `bytes[start..end]` in buffer 0, as Arrow's `make_view`
/// builds it: length, then the value itself when it is at most 12 bytes,
/// else its first 4 bytes, the buffer index and `start`. Away from the
/// end of `bytes` this reads 16 bytes at once and masks them, with no
/// copy of a variable length: decoding 100M rows to views a 64Ki-row call
/// at a time from 64Ki entries of 1-32 bytes, each call building its
/// table, took 0.43-0.44 s through `make_view`, 0.40-0.41 s through this
/// (`sortbench --only-decode`).
/// Precondition: `start <= end <= bytes.len() <= u32::MAX` (checked by the
/// caller for the length; the slice bounds for the rest).
#[inline(always)]
fn view_of_value(bytes: &[u8], start: usize, end: usize) -> u128 {
    let len = end - start;
    let Some(word) = bytes.get(start..start + 16) else {
        // Within 16 bytes of the end: the value is short, this is rare.
        return make_view(&bytes[start..end], 0, start as u32);
    };
    assert!(len <= bytes.len() - start, "value within the bytes");
    let raw = u128::from_le_bytes(word.try_into().expect("16 bytes"));
    let head = if len <= INLINE_BYTES_MAX as usize {
        raw & ((1u128 << (8 * len)) - 1)
    } else {
        // `start` fits in u32: the caller checked `bytes.len()`.
        (raw & 0xffff_ffff) | (start as u128) << 64
    };
    head << 32 | len as u128
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;
    use arrow::array::{Int32Array, StringArray, UInt64Array};
    use arrow::datatypes::{Int32Type, UInt32Type};

    /// A dictionary whose keys are not checked against its values.
    fn unchecked(keys: Int32Array, values: ArrayRef) -> DictionaryArray<Int32Type> {
        // SAFETY: deliberately invalid, to test that decode refuses it.
        unsafe { DictionaryArray::new_unchecked(keys, values) }
    }

    fn panic_message(f: impl FnOnce() -> ArrayRef) -> String {
        let f = std::panic::AssertUnwindSafe(f);
        let err = std::panic::catch_unwind(f).expect_err("decode must refuse the key");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    /// Every length up to past the inline limit, at every position up to
    /// the end of the bytes (where the 16-byte read does not fit), gives
    /// the view Arrow's `make_view` gives.
    #[test]
    fn view_of_value_matches_make_view() {
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for start in 0..=bytes.len() {
            for len in 0..=(bytes.len() - start).min(40) {
                let value = &bytes[start..start + len];
                assert_eq!(
                    view_of_value(&bytes, start, start + len),
                    make_view(value, 0, start as u32),
                    "start {start}, length {len}"
                );
            }
        }
    }

    /// Starts kept as u64 (dictionaries past 4 GiB of values, too large
    /// to build in a test) copy the same bytes as u32 starts.
    #[test]
    fn wide_starts_copy_the_same_rows() {
        let words: Vec<String> = (0..300).map(|i| "x".repeat(i % 45)).collect();
        let values = arrow::array::LargeStringArray::from_iter_values(&words);
        let codes: Vec<u32> = (0..1001u32).map(|i| (i * 7919) % 300).collect();
        let valid = |row: usize| row % 5 != 3;
        let (bytes, offsets) = (values.value_data(), values.value_offsets());
        let narrow =
            copy_in_two_passes::<LargeUtf8Type, u32>(bytes, offsets, &codes, valid).unwrap();
        let wide = copy_in_two_passes::<LargeUtf8Type, u64>(bytes, offsets, &codes, valid).unwrap();
        assert_eq!(narrow, wide);
        let (out_offsets, out) = wide;
        for (row, &code) in codes.iter().enumerate() {
            let (a, b) = (out_offsets[row] as usize, out_offsets[row + 1] as usize);
            let want = if valid(row) {
                words[code as usize].as_str()
            } else {
                ""
            };
            assert_eq!(&out[a..b], want.as_bytes(), "row {row}");
        }
    }

    /// The slot table is built only where it fits: values of at most 32
    /// bytes, 1 to 64Ki entries.
    #[test]
    fn slot_table_only_for_dictionaries_of_short_values() {
        let short = StringArray::from_iter_values((0..256).map(|i| "s".repeat(i % 33)));
        let (bytes, offsets) = (short.value_data(), short.value_offsets());
        let SlotTable { slots, lens } = slot_table(bytes, offsets).expect("256 short values");
        assert_eq!(slots.len(), 256);
        for (i, (slot, &len)) in slots.iter().zip(&lens).enumerate() {
            assert_eq!(len as usize, i % 33);
            assert_eq!(&slot.0[..len as usize], short.value(i).as_bytes());
            assert!(slot.0[len as usize..].iter().all(|&b| b == 0), "padding");
        }
        let long = StringArray::from(
            vec!["a"; 100]
                .into_iter()
                .chain(["x".repeat(33).as_str()])
                .collect::<Vec<_>>(),
        );
        assert!(slot_table(long.value_data(), long.value_offsets()).is_none());
        let most = StringArray::from_iter_values((0..1 << 16).map(|i| (i % 7).to_string()));
        assert!(slot_table(most.value_data(), most.value_offsets()).is_some());
        let many = StringArray::from_iter_values((0..(1 << 16) + 1).map(|i| (i % 7).to_string()));
        assert!(slot_table(many.value_data(), many.value_offsets()).is_none());
        let empty = StringArray::from(Vec::<&str>::new());
        assert!(slot_table(empty.value_data(), empty.value_offsets()).is_none());
    }

    fn slot_state(decoder: &DictionaryDecoder) -> &'static str {
        match decoder.prepared.as_ref().map(|p| &p.slots) {
            None => "no dictionary",
            Some(SlotState::Unbuilt) => "unbuilt",
            Some(SlotState::Built(_)) => "built",
            Some(SlotState::Unfit) => "unfit",
        }
    }

    /// A decoder builds a dictionary's slot table once the dictionary has
    /// decoded four rows per entry over all its batches, keeps it while
    /// the batches share the dictionary's buffers, and starts over on
    /// another dictionary, even one of equal content.
    #[test]
    fn decoder_builds_the_slot_table_once_per_dictionary() {
        let words: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..100).map(|i| format!("w{i}")),
        ));
        let batch = |keys: Vec<i32>, words: &ArrayRef| {
            DictionaryArray::new(Int32Array::from(keys), Arc::clone(words))
        };
        let mut decoder = DictionaryDecoder::new();
        assert_eq!(slot_state(&decoder), "no dictionary");
        for (rows, want) in [
            (150, "unbuilt"),
            (249, "unbuilt"),
            (1, "built"),
            (5, "built"),
        ] {
            let keys: Vec<i32> = (0..rows).map(|i| i % 100).collect();
            let got = decoder.decode(&batch(keys.clone(), &words)).unwrap();
            let want_values: StringArray = keys.iter().map(|k| Some(format!("w{k}"))).collect();
            assert_eq!(got.as_string::<i32>(), &want_values);
            assert_eq!(slot_state(&decoder), want, "after {rows} more rows");
        }
        // The same values in new buffers are another dictionary.
        let copy: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..100).map(|i| format!("w{i}")),
        ));
        decoder.decode(&batch(vec![0; 10], &copy)).unwrap();
        assert_eq!(slot_state(&decoder), "unbuilt");
        // A value past a slot: marked unfit once, decoded the other way.
        let long: ArrayRef = Arc::new(StringArray::from(vec!["x".repeat(40), "y".into()]));
        decoder.decode(&batch(vec![1; 10], &long)).unwrap();
        assert_eq!(slot_state(&decoder), "unfit");
        let got = decoder.decode(&batch(vec![0, 1], &long)).unwrap();
        assert_eq!(got.as_string::<i32>().value(0), "x".repeat(40));
        // A bad key once the table is built is refused, naming it.
        let mut decoder = DictionaryDecoder::new();
        decoder.decode(&batch(vec![3; 400], &words)).unwrap();
        assert_eq!(slot_state(&decoder), "built");
        let bad = unchecked(Int32Array::from(vec![1, 100, 2]), Arc::clone(&words));
        let msg = panic_message(|| decoder.decode(&bad).unwrap());
        assert!(msg.contains("key 100 at row 1 out of range"), "{msg}");
    }

    #[test]
    fn keys_out_of_range_are_refused_on_every_path() {
        let fixed: ArrayRef = Arc::new(UInt64Array::from(vec![10, 20, 30]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "bb", "ccc"]));
        for values in [fixed, strings] {
            for keys in [
                Int32Array::from(vec![0, 2, 3, 1]),
                Int32Array::from(vec![Some(0), None, Some(7)]),
                Int32Array::from(vec![-1, 0]),
            ] {
                let dict = unchecked(keys.clone(), Arc::clone(&values));
                let msg = panic_message(|| dictionary_decode(&dict).unwrap());
                assert!(msg.contains("out of range"), "{keys:?}: {msg}");
            }
            // In range (the last value, a null key over a bad code) is fine.
            let keys = Int32Array::from(vec![Some(2), None, Some(0)]);
            let out = dictionary_decode(&unchecked(keys, Arc::clone(&values))).unwrap();
            assert_eq!(out.len(), 3);
            assert!(out.is_null(1));
        }
        // A bad key inside a vector block (not only in the scalar tail), as
        // a large u32 and as a negative i32, for 4- and 8-byte values.
        let four: ArrayRef = Arc::new(Int32Array::from(vec![5, 6, 7]));
        let eight: ArrayRef = Arc::new(UInt64Array::from(vec![5, 6, 7]));
        // 37 codes over three values, code 5 replaced by `bad`.
        let with_bad_key = |bad: i32, values: &ArrayRef| {
            let mut codes: Vec<i32> = (0..37).map(|i| i % 3).collect();
            codes[5] = bad;
            unchecked(Int32Array::from(codes), Arc::clone(values))
        };
        for values in [four, eight] {
            for bad in [3, -1, i32::MIN] {
                let dict = with_bad_key(bad, &values);
                let msg = panic_message(|| dictionary_decode(&dict).unwrap());
                assert!(msg.contains("out of range"), "{bad}: {msg}");
            }
            let codes: Vec<u32> = (0..37).map(|i| [2, 0, u32::MAX][i % 3]).collect();
            // SAFETY: deliberately invalid, to test that decode refuses it.
            let dict = unsafe {
                DictionaryArray::<UInt32Type>::new_unchecked(codes.into(), Arc::clone(&values))
            };
            let msg = panic_message(|| dictionary_decode(&dict).unwrap());
            assert!(msg.contains("out of range"), "u32::MAX: {msg}");
        }
        // And in a block of the 16-byte view gather.
        let words: ArrayRef = Arc::new(StringArray::from(vec!["a", "bb", "past twelve bytes"]));
        for bad in [3, -1, i32::MIN] {
            let dict = with_bad_key(bad, &words);
            let msg = panic_message(|| dictionary_decode_to_views(&dict).unwrap());
            assert!(msg.contains("out of range"), "{bad}: {msg}");
        }
        let empty: ArrayRef = Arc::new(UInt64Array::from(Vec::<u64>::new()));
        let none = unchecked(Int32Array::from(Vec::<i32>::new()), Arc::clone(&empty));
        assert_eq!(dictionary_decode(&none).unwrap().len(), 0);
        let one = unchecked(Int32Array::from(vec![0]), empty);
        let msg = panic_message(|| dictionary_decode(&one).unwrap());
        assert!(msg.contains("out of range (0 values)"), "{msg}");
    }
}
