//! Generic sort of dictionary-encoded keys (NASCENT2 section 3.3).
//!
//! ```text
//!   dictionary values   sort once (small)      sorted unique values
//!   ["USA","Brazil",..] ------------------->   ["Brazil",...,"USA"]
//!                        key mapping table
//!                        old code -> rank      [5, 2, 3, 0, ...]
//!   codes [0,2,4,1,3]  --map------------->     ranks [5,2,3,4,0]
//!   ranks --radix argsort--> sorted ranks --decode--> sorted values
//! ```
//!
//! Ranks are dense (equal values share a rank), so the order of ranks is
//! the order of values and ties stay ties. Works for any dictionary value
//! type Arrow can compare: strings, binary, floats, decimals, ...

use std::sync::Arc;

/// Hash maps keyed by views and value bytes: ahash, as Arrow's own
/// dictionary builder uses.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

use arrow::array::{
    make_comparator, Array, ArrayRef, AsArray, DictionaryArray, GenericByteViewArray,
    GenericByteViewBuilder, PrimitiveArray, UInt32Array,
};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::SortOptions;
use arrow::datatypes::{
    ArrowDictionaryKeyType, ArrowNativeType, ByteViewType, DataType, UInt32Type,
};
use arrow::downcast_dictionary_array;
use arrow::error::ArrowError;

use crate::keys::{argsort_plain, normalize_plain};
use crate::mem::{pooled_buffer, take_vec};
use crate::Parallelism;

/// Each row's dense rank in the sorted dictionary, and the sorted values.
#[derive(Debug)]
pub struct DictionaryRanks {
    /// Row `i`'s rank; null where the key or its value is null.
    pub ranks: UInt32Array,
    /// `sorted_values[r]` is the value of rank `r`; ascending, no nulls.
    pub sorted_values: ArrayRef,
}

/// Maps every row of a dictionary array to its value's rank (NKey).
///
/// ```
/// use arrow::array::{DictionaryArray, StringArray, UInt32Array};
/// use arrow::datatypes::Int32Type;
/// use insitu_kernels::dictionary_ranks;
///
/// let dict: DictionaryArray<Int32Type> =
///     vec!["USA", "Chile", "Brazil", "USA"].into_iter().collect();
/// let r = dictionary_ranks(&dict).unwrap();
/// assert_eq!(r.ranks, UInt32Array::from(vec![2, 1, 0, 2]));
/// assert_eq!(r.sorted_values.len(), 3);
/// ```
pub fn dictionary_ranks(array: &dyn Array) -> Result<DictionaryRanks, ArrowError> {
    downcast_dictionary_array!(
        array => ranks_of(array),
        t => Err(ArrowError::InvalidArgumentError(format!(
            "dictionary ranks need a dictionary array, got {t}"
        )))
    )
}

fn ranks_of<K: ArrowDictionaryKeyType>(
    dict: &DictionaryArray<K>,
) -> Result<DictionaryRanks, ArrowError> {
    let values = dict.values();
    let (mapping, sorted_values) = key_mapping_table(values.as_ref())?;
    let keys = dict.keys();
    // Code -> rank, with null values at rank 0 (their rows become null).
    let table: Vec<u32> = mapping.iter().map(|r| r.unwrap_or(0)).collect();
    // One pass, no branch per row: null keys may hold any code, so an
    // out-of-range code reads as rank 0 and is checked for afterwards.
    let mut ranks: Vec<u32> = take_vec(keys.len());
    let mut widest = 0usize;
    ranks.extend(keys.values().iter().map(|&code| {
        let code = code.as_usize();
        widest = widest.max(code);
        table.get(code).copied().unwrap_or(0)
    }));
    if widest >= table.len() {
        // Precondition: every non-null key indexes the dictionary.
        if let Some(code) = (keys.iter().flatten())
            .map(|k| k.as_usize())
            .find(|&code| code >= table.len())
        {
            panic!(
                "dictionary key {code} out of range (dictionary has {} values)",
                table.len()
            );
        }
    }
    let nulls = rank_nulls(keys, &mapping);
    let ranks = UInt32Array::new(pooled_buffer(ranks).into(), nulls);
    debug_assert!(ranks
        .iter()
        .flatten()
        .all(|r| (r as usize) < sorted_values.len()));
    Ok(DictionaryRanks {
        ranks,
        sorted_values,
    })
}

/// Rows whose rank is null: a null key, or a key whose value is null.
/// Without null values these are just the keys' nulls.
fn rank_nulls<K: ArrowDictionaryKeyType>(
    keys: &PrimitiveArray<K>,
    mapping: &[Option<u32>],
) -> Option<NullBuffer> {
    let nulls = match mapping.iter().all(Option::is_some) {
        true => keys.nulls().cloned(),
        false => {
            let codes = keys.values();
            let valid = BooleanBuffer::collect_bool(keys.len(), |i| {
                keys.is_valid(i)
                    && mapping
                        .get(codes[i].as_usize())
                        .is_some_and(Option::is_some)
            });
            Some(NullBuffer::new(valid))
        }
    };
    nulls.filter(|n| n.null_count() > 0)
}

/// Sorts the dictionary values once: old code -> dense rank (None for a
/// null value), and the distinct values in ascending order.
pub fn key_mapping_table(values: &dyn Array) -> Result<(Vec<Option<u32>>, ArrayRef), ArrowError> {
    let options = SortOptions {
        descending: false,
        nulls_first: false,
    };
    if values.len() > u32::MAX as usize {
        return Err(ArrowError::InvalidArgumentError(format!(
            "dictionary of {} values has more than 2^32 ranks",
            values.len()
        )));
    }
    let order: Vec<u32> = argsort_plain(values, options, Parallelism::default())?;
    let same = value_equality(values, options)?;
    let mut mapping = vec![None; values.len()];
    let mut firsts: Vec<u32> = Vec::new();
    for &code in &order {
        if values.is_null(code as usize) {
            continue; // nulls sort last; they have no rank
        }
        let same_as_previous = firsts
            .last()
            .is_some_and(|&p| same(p as usize, code as usize));
        if !same_as_previous {
            firsts.push(code);
        }
        mapping[code as usize] = Some(firsts.len() as u32 - 1);
    }
    let sorted_values = arrow::compute::take(values, &UInt32Array::from(firsts), None)?;
    Ok((mapping, sorted_values))
}

/// Equality of two values in the sort's sense: through the order-preserving
/// keys where the type has them (so NaN == NaN and -0.0 == 0.0, as the sort
/// orders them), else Arrow's comparator.
fn value_equality(
    values: &dyn Array,
    options: SortOptions,
) -> Result<Box<dyn Fn(usize, usize) -> bool>, ArrowError> {
    Ok(match normalize_plain::<u32>(values, options, 1)? {
        Some(keys) => {
            let mut by_row = vec![0u128; values.len()];
            for (row, key) in keys.row_keys() {
                by_row[row] = key;
            }
            Box::new(move |a, b| by_row[a] == by_row[b])
        }
        None => {
            let compare = make_comparator(values, values, options)?;
            Box::new(move |a, b| compare(a, b).is_eq())
        }
    })
}

/// Sorts a dictionary column: the row order and the sorted column itself,
/// still dictionary-encoded (ranks as keys into the sorted values). Decode
/// it with [`crate::dictionary_decode`] when plain values are wanted.
///
/// ```
/// use arrow::array::{Array, DictionaryArray, StringArray};
/// use arrow::compute::SortOptions;
/// use arrow::datatypes::Int8Type;
/// use insitu_kernels::{dictionary_decode, sort_dictionary};
///
/// let dict: DictionaryArray<Int8Type> = vec!["b", "c", "a", "b"].into_iter().collect();
/// let (order, sorted) = sort_dictionary(&dict, SortOptions::default()).unwrap();
/// assert_eq!(order, vec![2, 0, 3, 1]);
/// let plain = dictionary_decode(&sorted).unwrap();
/// let plain = plain.as_any().downcast_ref::<StringArray>().unwrap();
/// assert_eq!(plain.iter().flatten().collect::<Vec<_>>(), ["a", "b", "b", "c"]);
/// ```
pub fn sort_dictionary(
    array: &dyn Array,
    options: SortOptions,
) -> Result<(Vec<u32>, DictionaryArray<UInt32Type>), ArrowError> {
    if !matches!(array.data_type(), DataType::Dictionary(_, _)) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "sort_dictionary needs a dictionary array, got {}",
            array.data_type()
        )));
    }
    let ranks = dictionary_ranks(array)?;
    let order: Vec<u32> = argsort_plain(&ranks.ranks, options, Parallelism::default())?;
    let sorted_ranks = arrow::compute::take(&ranks.ranks, &UInt32Array::from(order.clone()), None)?;
    let keys: PrimitiveArray<UInt32Type> = sorted_ranks.as_primitive::<UInt32Type>().clone();
    let sorted = DictionaryArray::try_new(keys, Arc::clone(&ranks.sorted_values))?;
    Ok((order, sorted))
}

/// Rows sampled to guess whether a plain string column has few distinct
/// values, and the most distinct values in that sample for it to count.
const CARDINALITY_SAMPLE_ROWS: usize = 1024;
const CARDINALITY_SAMPLE_DISTINCT_MAX: usize = 64;

/// Ranks of a plain (not dictionary-encoded) string or binary column with
/// few distinct values, by dictionary-encoding it first (Arrow's cast) and
/// ranking the dictionary; `None` if the column is not such a column. This
/// turns a string sort into an integer radix sort.
pub fn low_cardinality_ranks(values: &dyn Array) -> Result<Option<DictionaryRanks>, ArrowError> {
    use DataType::*;
    if !matches!(
        values.data_type(),
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView
    ) || values.len() < CARDINALITY_SAMPLE_ROWS
    {
        return Ok(None);
    }
    let step = values.len() / CARDINALITY_SAMPLE_ROWS;
    let sample_idx =
        UInt32Array::from_iter_values((0..CARDINALITY_SAMPLE_ROWS).map(|i| (i * step) as u32));
    let sample = arrow::compute::take(values, &sample_idx, None)?;
    let dictionary_type =
        |v: &DataType| Dictionary(Box::new(DataType::UInt32), Box::new(v.clone()));
    let sample_dict = arrow::compute::cast(&sample, &dictionary_type(values.data_type()))?;
    if sample_dict.as_any_dictionary().values().len() > CARDINALITY_SAMPLE_DISTINCT_MAX {
        return Ok(None);
    }
    let by_views: Option<ArrayRef> =
        match values.data_type() {
            Utf8View => encode_views(values.as_string_view(), VIEW_CODES_MAX)
                .map(|d| Arc::new(d) as ArrayRef),
            BinaryView => encode_views(values.as_binary_view(), VIEW_CODES_MAX)
                .map(|d| Arc::new(d) as ArrayRef),
            _ => None,
        };
    let dict = match by_views {
        Some(dict) => dict,
        None => arrow::compute::cast(values, &dictionary_type(values.data_type()))?,
    };
    dictionary_ranks(dict.as_ref()).map(Some)
}

/// Slots of [`encode_views`]' table of recent views. Rows of a
/// low-cardinality column in random order (`l_shipinstruct`'s 4 values)
/// hit it nearly always, where a hash map lookup per row cost three
/// times as much (`cargo bench -- low_cardinality_ranks` in bench/kernels,
/// 1Mi rows: 9.6 ms with the map alone, 4.5 ms with the table).
const RECENT_VIEW_SLOTS: usize = 256;

/// A view's slot in the table of recent views: its two halves mixed by a
/// multiply, top 8 bits.
#[inline(always)]
fn recent_view_slot(view: u128) -> usize {
    let mixed =
        (view as u64 ^ ((view >> 64) as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> (64 - RECENT_VIEW_SLOTS.trailing_zeros())) as usize
}

/// Most distinct views [`encode_views`] tracks before it gives up.
const VIEW_CODES_MAX: usize = 1 << 16;

/// Dictionary-encodes a string or binary view array by its views: a view
/// is the value's length and bytes (inline up to 12 bytes) or its length,
/// prefix and place in a data buffer, so equal views are equal values and
/// each row costs one lookup of its 16-byte view; only a view not seen
/// before has its bytes compared. Values stored at several places (a
/// column concatenated from batches whose views each point into their
/// own dictionary page) get one code. `None` when the array has more than
/// `distinct_views_max` distinct views.
///
/// Arrow's cast to a dictionary hashes and compares every row's bytes:
/// on 3M rows of `l_shipinstruct` it took 6% of an ORDER BY's CPU
/// (perf), this a fraction of that.
///
/// ```
/// use arrow::array::{Array, AsArray, StringViewArray};
/// use insitu_kernels::encode_views;
///
/// let a = StringViewArray::from(vec![Some("TAKE BACK RETURN"), None, Some("NONE"), Some("TAKE BACK RETURN")]);
/// let d = encode_views(&a, 16).unwrap();
/// assert_eq!(d.values().len(), 2);
/// assert_eq!(d.keys().values().to_vec(), vec![0, 0, 1, 0]);
/// assert!(d.is_null(1));
/// ```
pub fn encode_views<T: ByteViewType + ?Sized>(
    array: &GenericByteViewArray<T>,
    distinct_views_max: usize,
) -> Option<DictionaryArray<UInt32Type>> {
    let mut view_codes: HashMap<u128, u32> = HashMap::default();
    let mut value_codes: HashMap<&[u8], u32> = HashMap::default();
    let mut distinct = GenericByteViewBuilder::<T>::new();
    let mut codes: Vec<u32> = take_vec(array.len());
    // Most lookups end here: a direct-mapped table of recently seen views
    // and their codes (code + 1; 0 marks an empty slot).
    let mut recent = vec![(0u128, 0u32); RECENT_VIEW_SLOTS];
    for (i, &view) in array.views().iter().enumerate() {
        if array.is_null(i) {
            codes.push(0);
            continue;
        }
        let slot = &mut recent[recent_view_slot(view)];
        if slot.1 != 0 && slot.0 == view {
            codes.push(slot.1 - 1);
            continue;
        }
        let code = match view_codes.get(&view) {
            Some(&code) => code,
            None => {
                if view_codes.len() == distinct_views_max {
                    crate::mem::recycle(codes);
                    return None;
                }
                let value = array.value(i);
                let next = value_codes.len() as u32;
                let code = *value_codes.entry(value.as_ref()).or_insert_with(|| {
                    distinct.append_value(value);
                    next
                });
                view_codes.insert(view, code);
                code
            }
        };
        *slot = (view, code + 1);
        codes.push(code);
    }
    let values = distinct.finish();
    // Postcondition: every valid row's code indexes the distinct values.
    debug_assert!(codes
        .iter()
        .enumerate()
        .all(|(i, &c)| array.is_null(i) || (c as usize) < values.len()));
    let keys = UInt32Array::new(pooled_buffer(codes).into(), array.nulls().cloned());
    Some(DictionaryArray::new(keys, Arc::new(values)))
}
