//! Every kernel against a naive reference, on seeded random inputs at odd
//! sizes, with duplicates, nulls and NaN.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::*;
use arrow::compute::{SortColumn, SortOptions};
use arrow::datatypes::*;
use insitu_kernels::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SIZES: [usize; 9] = [0, 1, 2, 7, 49, 50, 51, 1000, 100_000];

/// A row's key as the reference sees it.
#[derive(Debug, Clone)]
enum RefKey {
    Null,
    Int(i128),
    Float(f64),
    Bytes(Vec<u8>),
}

/// SQL order: NaN above everything and equal to itself, -0.0 == 0.0.
fn cmp_non_null(a: &RefKey, b: &RefKey) -> Ordering {
    match (a, b) {
        (RefKey::Int(x), RefKey::Int(y)) => x.cmp(y),
        (RefKey::Float(x), RefKey::Float(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => x.partial_cmp(y).unwrap(),
        },
        (RefKey::Bytes(x), RefKey::Bytes(y)) => x.cmp(y),
        _ => panic!("mixed key kinds"),
    }
}

fn cmp_ref(a: &RefKey, b: &RefKey, o: SortOptions) -> Ordering {
    match (a, b) {
        (RefKey::Null, RefKey::Null) => Ordering::Equal,
        (RefKey::Null, _) => {
            if o.nulls_first {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (_, RefKey::Null) => {
            if o.nulls_first {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        _ => {
            let c = cmp_non_null(a, b);
            if o.descending {
                c.reverse()
            } else {
                c
            }
        }
    }
}

/// Row keys of an array, read through Arrow's typed accessors (a
/// dictionary through Arrow's own cast, not through our decode).
fn ref_keys(array: &dyn Array) -> Vec<RefKey> {
    if let DataType::Dictionary(_, value_type) = array.data_type() {
        let plain = arrow::compute::cast(array, value_type).unwrap();
        return ref_keys(plain.as_ref());
    }
    (0..array.len())
        .map(|i| {
            if array.is_null(i) {
                return RefKey::Null;
            }
            match array.data_type() {
                DataType::Int8 => RefKey::Int(array.as_primitive::<Int8Type>().value(i) as i128),
                DataType::Int32 => RefKey::Int(array.as_primitive::<Int32Type>().value(i) as i128),
                DataType::Int64 => RefKey::Int(array.as_primitive::<Int64Type>().value(i) as i128),
                DataType::UInt16 => {
                    RefKey::Int(array.as_primitive::<UInt16Type>().value(i) as i128)
                }
                DataType::UInt64 => {
                    RefKey::Int(array.as_primitive::<UInt64Type>().value(i) as i128)
                }
                DataType::Date32 => {
                    RefKey::Int(array.as_primitive::<Date32Type>().value(i) as i128)
                }
                DataType::Timestamp(TimeUnit::Millisecond, _) => {
                    RefKey::Int(array.as_primitive::<TimestampMillisecondType>().value(i) as i128)
                }
                DataType::Decimal128(_, _) => {
                    RefKey::Int(array.as_primitive::<Decimal128Type>().value(i))
                }
                DataType::Boolean => RefKey::Int(array.as_boolean().value(i) as i128),
                DataType::Float32 => {
                    RefKey::Float(array.as_primitive::<Float32Type>().value(i) as f64)
                }
                DataType::Float64 => RefKey::Float(array.as_primitive::<Float64Type>().value(i)),
                DataType::Utf8 => {
                    RefKey::Bytes(array.as_string::<i32>().value(i).as_bytes().to_vec())
                }
                DataType::Utf8View => {
                    RefKey::Bytes(array.as_string_view().value(i).as_bytes().to_vec())
                }
                DataType::Binary => RefKey::Bytes(array.as_binary::<i32>().value(i).to_vec()),
                t => panic!("no reference for {t}"),
            }
        })
        .collect()
}

/// The stable order the reference expects for several key columns.
fn ref_order(columns: &[(ArrayRef, SortOptions)]) -> Vec<u32> {
    let keys: Vec<Vec<RefKey>> = columns.iter().map(|(a, _)| ref_keys(a.as_ref())).collect();
    let n = columns[0].0.len();
    let mut idx: Vec<u32> = (0..n as u32).collect();
    idx.sort_by(|&a, &b| {
        for (col, (_, o)) in keys.iter().zip(columns) {
            let c = cmp_ref(&col[a as usize], &col[b as usize], *o);
            if c != Ordering::Equal {
                return c;
            }
        }
        Ordering::Equal
    });
    idx
}

fn null_mask(rng: &mut StdRng, n: usize) -> Vec<bool> {
    (0..n).map(|_| rng.random_range(0..10) != 0).collect()
}

/// One random array per key type, with few distinct values (duplicates),
/// nulls, NaN, negative zero and extremes.
fn random_arrays(rng: &mut StdRng, n: usize) -> Vec<ArrayRef> {
    let small = |rng: &mut StdRng| rng.random_range(-20i64..20);
    let wide = |rng: &mut StdRng| {
        if rng.random_bool(0.5) {
            rng.random::<i64>()
        } else {
            rng.random_range(-3..3)
        }
    };
    let float = |rng: &mut StdRng| match rng.random_range(0..12) {
        0 => f64::NAN,
        1 => -f64::NAN,
        2 => -0.0,
        3 => 0.0,
        4 => f64::INFINITY,
        5 => f64::NEG_INFINITY,
        6 => (rng.random_range(-5..5) as f64) * 0.5,
        _ => rng.random::<f64>() * 1e6 - 5e5,
    };
    let word = |rng: &mut StdRng| -> String {
        let len = rng.random_range(0..6);
        (0..len)
            .map(|_| (b'a' + rng.random_range(0..4u8)) as char)
            .collect()
    };
    let mask = null_mask(rng, n);
    let m = |i: usize| mask[i];
    let strings: Vec<Option<String>> = (0..n).map(|i| m(i).then(|| word(rng))).collect();
    let modes = ["AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB", "REG AIR", ""];
    let few_words: Vec<Option<&str>> = (0..n)
        .map(|i| m(i).then(|| modes[rng.random_range(0..modes.len())]))
        .collect();
    let dict_values = StringArray::from(vec![
        Some("pear"),
        Some("apple"),
        None,
        Some("fig"),
        Some("apple"),
        Some(""),
    ]);
    let dict_keys = Int32Array::from(
        (0..n)
            .map(|i| m(i).then(|| rng.random_range(0..6)))
            .collect::<Vec<_>>(),
    );
    let float_dict_values = Float64Array::from(vec![2.5, f64::NAN, -1.0, 0.0, -0.0, 2.5]);
    let float_dict_keys = Int16Array::from(
        (0..n)
            .map(|i| m(i).then(|| rng.random_range(0..6i16)))
            .collect::<Vec<_>>(),
    );
    let dec_dict_values = Decimal128Array::from(vec![105, -3, 999_999_999_999, 0])
        .with_precision_and_scale(15, 2)
        .unwrap();
    let dec_dict_keys = Int8Array::from(
        (0..n)
            .map(|i| m(i).then(|| rng.random_range(0..4i8)))
            .collect::<Vec<_>>(),
    );
    let bin_dict_values = BinaryArray::from(vec![&b"\xff"[..], b"", b"\x00\x01", b"\x00"]);
    let bin_dict_keys = UInt16Array::from(
        (0..n)
            .map(|_| rng.random_range(0..4u16))
            .collect::<Vec<_>>(),
    );
    vec![
        Arc::new(Int8Array::from(
            (0..n)
                .map(|i| m(i).then(|| small(rng) as i8))
                .collect::<Vec<_>>(),
        )),
        Arc::new(Int32Array::from(
            (0..n)
                .map(|i| m(i).then(|| small(rng) as i32 * 1000))
                .collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            (0..n).map(|i| m(i).then(|| wide(rng))).collect::<Vec<_>>(),
        )),
        Arc::new(Int64Array::from(
            (0..n).map(|_| wide(rng)).collect::<Vec<_>>(),
        )),
        Arc::new(UInt16Array::from(
            (0..n)
                .map(|i| m(i).then(|| rng.random::<u16>()))
                .collect::<Vec<_>>(),
        )),
        Arc::new(UInt64Array::from(
            (0..n)
                .map(|i| m(i).then(|| rng.random::<u64>() >> rng.random_range(0..64)))
                .collect::<Vec<_>>(),
        )),
        Arc::new(Float32Array::from(
            (0..n)
                .map(|i| m(i).then(|| float(rng) as f32))
                .collect::<Vec<_>>(),
        )),
        Arc::new(Float64Array::from(
            (0..n).map(|i| m(i).then(|| float(rng))).collect::<Vec<_>>(),
        )),
        Arc::new(Date32Array::from(
            (0..n)
                .map(|i| m(i).then(|| rng.random_range(-1000..20000)))
                .collect::<Vec<_>>(),
        )),
        Arc::new(TimestampMillisecondArray::from(
            (0..n).map(|i| m(i).then(|| wide(rng))).collect::<Vec<_>>(),
        )),
        Arc::new(
            Decimal128Array::from(
                (0..n)
                    .map(|i| m(i).then(|| rng.random_range(-10_000_000i128..10_000_000)))
                    .collect::<Vec<_>>(),
            )
            .with_precision_and_scale(15, 2)
            .unwrap(),
        ),
        Arc::new(
            Decimal128Array::from(
                (0..n)
                    .map(|i| m(i).then(|| rng.random::<i128>() >> 2))
                    .collect::<Vec<_>>(),
            )
            .with_precision_and_scale(38, 0)
            .unwrap(),
        ),
        Arc::new(BooleanArray::from(
            (0..n)
                .map(|i| m(i).then(|| rng.random_bool(0.3)))
                .collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(strings)),
        // Few distinct values: sorted through ranks of an on-the-fly dictionary.
        Arc::new(StringArray::from(few_words.clone())),
        Arc::new(StringViewArray::from(few_words)),
        Arc::new(DictionaryArray::new(dict_keys, Arc::new(dict_values))),
        Arc::new(DictionaryArray::new(
            float_dict_keys,
            Arc::new(float_dict_values),
        )),
        Arc::new(DictionaryArray::new(
            dec_dict_keys,
            Arc::new(dec_dict_values),
        )),
        Arc::new(DictionaryArray::new(
            bin_dict_keys,
            Arc::new(bin_dict_values),
        )),
    ]
}

/// Past a million rows without nulls, the key transform is split over
/// threads; the order must not change.
#[test]
fn argsort_of_large_inputs_on_threads_matches_reference() {
    let mut rng = StdRng::seed_from_u64(1 << 20);
    let n = (1 << 20) + 7;
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..n).map(|_| rng.random_range(-50_000i64..50_000)),
    ));
    let floats: ArrayRef = Arc::new(Float64Array::from_iter_values((0..n).map(|i| {
        if i % 97 == 0 {
            f64::NAN
        } else {
            rng.random_range(-1e3..1e3f64).round()
        }
    })));
    // Full-width keys with few top bytes: large top-level buckets, sorted
    // from counts the key transform took on its threads.
    let wide: ArrayRef =
        Arc::new(UInt64Array::from_iter_values((0..n).map(|_| {
            (rng.random_range(0..4u64) * 85) << 56 | rng.random_range(0..1u64 << 20)
        })));
    for array in [ints, floats, wide] {
        for o in all_options() {
            let want = ref_order(&[(Arc::clone(&array), o)]);
            for threads in [1, 2, 3] {
                let got: Vec<u32> = argsort_to(array.as_ref(), o, Parallelism(threads)).unwrap();
                assert!(
                    got == want,
                    "{} n={n} {o:?} threads={threads}",
                    array.data_type()
                );
            }
        }
    }
}

fn all_options() -> [SortOptions; 4] {
    [(false, false), (false, true), (true, false), (true, true)].map(|(descending, nulls_first)| {
        SortOptions {
            descending,
            nulls_first,
        }
    })
}

#[test]
fn argsort_matches_reference() {
    let mut rng = StdRng::seed_from_u64(42);
    for n in SIZES {
        for array in random_arrays(&mut rng, n) {
            for o in all_options() {
                let want = ref_order(&[(Arc::clone(&array), o)]);
                let got = argsort(array.as_ref(), o).unwrap();
                let got = got.as_primitive::<UInt32Type>().values().to_vec();
                assert_eq!(got, want, "argsort {} n={n} {o:?}", array.data_type());
                for threads in [2, 3] {
                    let par: Vec<u32> =
                        argsort_to(array.as_ref(), o, Parallelism(threads)).unwrap();
                    assert_eq!(par, want, "parallel argsort {} n={n}", array.data_type());
                }
                let wide: Vec<u64> = argsort_to(array.as_ref(), o, Parallelism(1)).unwrap();
                assert!(wide.iter().map(|&i| i as u32).eq(want.iter().copied()));
                for k in [0, 1, 3, n / 2, n] {
                    let top: Vec<u32> = argsort_top_k(array.as_ref(), o, k).unwrap();
                    assert_eq!(
                        top,
                        want[..k.min(n)],
                        "top {k} {} n={n} {o:?}",
                        array.data_type()
                    );
                }
            }
        }
    }
}

/// `encode_views` against Arrow's cast to a dictionary: every valid row
/// decodes to its value, nulls stay null, one code per distinct value,
/// also when equal values sit at several places in several buffers; past
/// its limit of distinct views it declines.
#[test]
fn encode_views_matches_cast() {
    let mut rng = StdRng::seed_from_u64(51);
    let words = [
        "",
        "AIR",
        "NONE",
        "exactly12byt",
        "thirteen byte",
        "TAKE BACK RETURN",
        "DELIVER IN PERSON",
    ];
    for n in SIZES {
        let pieces: Vec<ArrayRef> = (0..3)
            .map(|_| {
                let values: Vec<Option<&str>> = (0..n)
                    .map(|_| {
                        rng.random_bool(0.9)
                            .then(|| words[rng.random_range(0..words.len())])
                    })
                    .collect();
                Arc::new(StringViewArray::from(values)) as ArrayRef
            })
            .collect();
        let refs: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
        let strings = arrow::compute::concat(&refs).unwrap();
        let binary = arrow::compute::cast(&strings, &DataType::BinaryView).unwrap();
        let distinct: std::collections::HashSet<&str> =
            strings.as_string_view().iter().flatten().collect();
        for array in [&strings, &binary] {
            let dict: ArrayRef = match array.data_type() {
                DataType::Utf8View => {
                    Arc::new(encode_views(array.as_string_view(), usize::MAX).unwrap())
                }
                _ => Arc::new(encode_views(array.as_binary_view(), usize::MAX).unwrap()),
            };
            let decoded = arrow::compute::cast(&dict, array.data_type()).unwrap();
            assert_eq!(&decoded, array, "{} n={n}", array.data_type());
            assert_eq!(dict.as_any_dictionary().values().len(), distinct.len());
        }
        if distinct.len() > 1 {
            assert!(encode_views(strings.as_string_view(), 1).is_none());
        }
    }
}

/// More distinct views than `encode_views`' table of recent views has
/// slots, so views share slots: each row still gets its own value's code.
#[test]
fn encode_views_with_views_sharing_table_slots() {
    let mut rng = StdRng::seed_from_u64(52);
    let words: Vec<String> = (0..3000)
        .map(|i| "w".repeat(1 + i % 20) + &i.to_string())
        .collect();
    for n in [1000, 100_000] {
        let values: Vec<Option<&str>> = (0..n)
            .map(|_| {
                rng.random_bool(0.95)
                    .then(|| words[rng.random_range(0..words.len())].as_str())
            })
            .collect();
        let page = StringViewArray::from(values.clone());
        let dict = encode_views(&page, usize::MAX).unwrap();
        let decoded = arrow::compute::cast(&dict, &DataType::Utf8View).unwrap();
        assert_eq!(decoded.as_string_view(), &page, "n={n}");
        let distinct: std::collections::HashSet<&str> = values.iter().flatten().copied().collect();
        assert_eq!(dict.values().len(), distinct.len(), "n={n}");
    }
}

/// A valid key past the dictionary is a broken precondition (a panic
/// naming the key); a null key may hold any code.
#[test]
fn dictionary_ranks_check_only_valid_keys() {
    let values: ArrayRef = Arc::new(StringArray::from(vec!["b", "a"]));
    let keys = Int32Array::from(vec![Some(1), None, Some(0)]);
    // The null key holds a code past the dictionary.
    let (_, codes, nulls) = keys.into_parts();
    let mut raw = codes.to_vec();
    raw[1] = 7;
    let keys = Int32Array::new(raw.into(), nulls);
    let dict = unsafe { DictionaryArray::new_unchecked(keys.clone(), Arc::clone(&values)) };
    let ranks = dictionary_ranks(&dict).unwrap();
    assert_eq!(ranks.ranks, UInt32Array::from(vec![Some(0), None, Some(1)]));
    let (_, codes, _) = keys.into_parts();
    let all_valid = Int32Array::new(codes, None);
    let dict = unsafe { DictionaryArray::new_unchecked(all_valid, values) };
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dictionary_ranks(&dict)))
        .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("dictionary key 7 out of range"),
        "{message}"
    );
}

/// `concat_views` against Arrow's `concat`: parts that are slices of one
/// array (sharing its buffers), arrays with buffers of their own, empty
/// parts, nulls, inline and out-of-line strings, and binary views.
#[test]
fn concat_views_matches_concat() {
    let mut rng = StdRng::seed_from_u64(53);
    for n in SIZES {
        let value = |rng: &mut StdRng| {
            rng.random_bool(0.9).then(|| {
                let len = rng.random_range(0..30);
                (0..len)
                    .map(|_| rng.random_range(b'a'..=b'z') as char)
                    .collect::<String>()
            })
        };
        let whole: StringViewArray = (0..n).map(|_| value(&mut rng)).collect();
        let other: StringViewArray = (0..n / 3 + 1).map(|_| value(&mut rng)).collect();
        let mut parts: Vec<StringViewArray> = vec![];
        let mut at = 0;
        while at < n {
            let len = rng.random_range(0..=(n - at).min(700));
            parts.push(whole.slice(at, len));
            if rng.random_bool(0.3) {
                parts.push(other.clone());
            }
            at += len;
        }
        parts.push(whole.slice(0, 0));
        let refs: Vec<&StringViewArray> = parts.iter().collect();
        let dyn_refs: Vec<&dyn Array> = parts.iter().map(|p| p as &dyn Array).collect();
        let got = concat_views(&refs).unwrap();
        let want = arrow::compute::concat(&dyn_refs).unwrap();
        assert_eq!(&got as &dyn Array, want.as_ref(), "n={n}");
        assert!(got.data_buffers().len() <= want.as_string_view().data_buffers().len());
        let binary: Vec<BinaryViewArray> = parts
            .iter()
            .map(|p| {
                arrow::compute::cast(p, &DataType::BinaryView)
                    .unwrap()
                    .as_binary_view()
                    .clone()
            })
            .collect();
        let binary_refs: Vec<&BinaryViewArray> = binary.iter().collect();
        let dyn_binary: Vec<&dyn Array> = binary.iter().map(|p| p as &dyn Array).collect();
        let got = concat_views(&binary_refs).unwrap();
        assert_eq!(
            &got as &dyn Array,
            arrow::compute::concat(&dyn_binary).unwrap().as_ref()
        );
    }
}

#[test]
fn multi_column_matches_reference() {
    let mut rng = StdRng::seed_from_u64(43);
    for n in SIZES {
        let arrays = random_arrays(&mut rng, n);
        for _ in 0..6 {
            let width = rng.random_range(2..4);
            let columns: Vec<(ArrayRef, SortOptions)> = (0..width)
                .map(|_| {
                    let a = Arc::clone(&arrays[rng.random_range(0..arrays.len())]);
                    (a, all_options()[rng.random_range(0..4)])
                })
                .collect();
            let sort_columns: Vec<SortColumn> = columns
                .iter()
                .map(|(a, o)| SortColumn {
                    values: Arc::clone(a),
                    options: Some(*o),
                })
                .collect();
            let types: Vec<String> = columns
                .iter()
                .map(|(a, _)| a.data_type().to_string())
                .collect();
            let want = ref_order(&columns);
            let got: Vec<u32> = argsort_columns(&sort_columns, None, Parallelism(2)).unwrap();
            assert_eq!(got, want, "columns {types:?} n={n}");
            let k = rng.random_range(0..=n);
            let top: Vec<u32> = argsort_columns(&sort_columns, Some(k), Parallelism(1)).unwrap();
            assert_eq!(top, want[..k], "top {k} of {types:?} n={n}");
        }
    }
}

#[test]
fn dictionary_sort_and_ranks_match_reference() {
    let mut rng = StdRng::seed_from_u64(44);
    for n in SIZES {
        for array in random_arrays(&mut rng, n) {
            if !matches!(array.data_type(), DataType::Dictionary(_, _)) {
                continue;
            }
            let o = SortOptions {
                descending: rng.random_bool(0.5),
                nulls_first: rng.random_bool(0.5),
            };
            let (order, sorted) = sort_dictionary(array.as_ref(), o).unwrap();
            assert_eq!(order, ref_order(&[(Arc::clone(&array), o)]));
            // The sorted column decodes to the input rows in sorted order.
            let plain = dictionary_decode(&sorted).unwrap();
            let want = arrow::compute::take(
                &arrow::compute::cast(array.as_ref(), plain.data_type()).unwrap(),
                &UInt32Array::from(order.clone()),
                None,
            )
            .unwrap();
            let (a, b) = (ref_keys(plain.as_ref()), ref_keys(want.as_ref()));
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(cmp_ref(x, y, o), Ordering::Equal, "decoded sorted column");
            }
            // Equal values get equal ranks, and rank order is value order.
            let ranks = dictionary_ranks(array.as_ref()).unwrap();
            let keys = ref_keys(array.as_ref());
            for _ in 0..200.min(n * n) {
                let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
                let (ri, rj) = (
                    ranks.ranks.is_valid(i).then(|| ranks.ranks.value(i)),
                    ranks.ranks.is_valid(j).then(|| ranks.ranks.value(j)),
                );
                match (&keys[i], &keys[j]) {
                    (RefKey::Null, _) => assert!(ri.is_none()),
                    (_, RefKey::Null) => assert!(rj.is_none()),
                    (a, b) => assert_eq!(ri.cmp(&rj), cmp_non_null(a, b)),
                }
            }
        }
    }
}

/// `arrays` plus columns the row-wise batch gather must carry whole: string
/// views with values past the 12 inlined bytes, and a sliced column.
fn batch_for_gather(rng: &mut StdRng, arrays: &[ArrayRef]) -> RecordBatch {
    let n = arrays.first().map_or(0, |a| a.len());
    let long: StringViewArray = (0..n)
        .map(|i| {
            (i % 5 != 0).then(|| {
                format!(
                    "a value longer than twelve bytes {}",
                    rng.random_range(0..n)
                )
            })
        })
        .collect();
    let wide: Int64Array = (0..n as i64 + 3)
        .map(|i| (i % 7 != 0).then_some(i * 3))
        .collect();
    let mut columns = arrays.to_vec();
    columns.push(Arc::new(long));
    columns.push(Arc::new(wide.slice(3, n)));
    let fields: Vec<Field> = columns
        .iter()
        .enumerate()
        .map(|(i, a)| Field::new(format!("c{i}"), a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

#[test]
fn gather_matches_take() {
    let mut rng = StdRng::seed_from_u64(45);
    for n in SIZES {
        let arrays = random_arrays(&mut rng, n);
        let m = if n == 0 {
            0
        } else {
            rng.random_range(0..2 * n)
        };
        let idx: Vec<u32> = (0..m).map(|_| rng.random_range(0..n as u32)).collect();
        for array in &arrays {
            let got = gather(array.as_ref(), &idx).unwrap();
            let want = arrow::compute::take(array.as_ref(), &UInt32Array::from(idx.clone()), None)
                .unwrap();
            assert_eq!(
                got.to_data(),
                want.to_data(),
                "gather {} n={n}",
                array.data_type()
            );
        }
        let batch = batch_for_gather(&mut rng, &arrays);
        let want: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .map(|c| {
                arrow::compute::take(c.as_ref(), &UInt32Array::from(idx.clone()), None).unwrap()
            })
            .collect();
        for by_rows in [false, true] {
            let out = gather_batch_with(&batch, &idx, by_rows).unwrap();
            assert_eq!(out.num_rows(), m);
            for (c, (got, want)) in out.columns().iter().zip(&want).enumerate() {
                assert_eq!(
                    got.to_data(),
                    want.to_data(),
                    "gather_batch column {c} n={n} by_rows={by_rows}"
                );
            }
        }
        assert_eq!(
            gather_batch(&batch, &idx).unwrap(),
            RecordBatch::try_new(batch.schema(), want).unwrap()
        );
        if n > 0 {
            let err = gather_batch_with(&batch, &[n as u32], true).unwrap_err();
            assert!(err.to_string().contains("out of range"), "{err}");
            let err = gather(arrays[0].as_ref(), &[n as u32]).unwrap_err();
            assert!(err.to_string().contains("out of range"), "{err}");
        }
        // Row layout: the same gather over rows of every width up to 64
        // bytes (each has its own copy loop) and wider ones (moved in
        // 32-byte pieces, the last overlapping).
        for width in (1..=66).chain([95, 96, 97, 112, 131]) {
            let rows: Vec<u8> = (0..n * width).map(|_| rng.random()).collect();
            let mut out = vec![7u8; 3]; // reused buffer: old contents must go
            gather_rows(&rows, width, &idx, &mut out);
            let want: Vec<u8> = idx
                .iter()
                .flat_map(|&i| rows[i as usize * width..][..width].to_vec())
                .collect();
            assert_eq!(out, want, "{width}-byte rows, n={n}");
        }
    }
}

/// Cuts `batch` into pieces of random sizes, empty ones included, and
/// some longer than the blocks rows are packed in.
fn random_pieces(rng: &mut StdRng, batch: &RecordBatch) -> Vec<RecordBatch> {
    let mut pieces = vec![];
    let mut at = 0;
    while at < batch.num_rows() || pieces.len() < 2 {
        let longest = if rng.random_bool(0.3) { 5000 } else { 300 };
        let len = rng.random_range(0..=(batch.num_rows() - at).min(longest));
        pieces.push(batch.slice(at, len));
        at += len;
    }
    pieces
}

/// Random indices; ascending runs (what a stable sort of a key with few
/// distinct values gives); and nearly sorted rows (what
/// `SourceLayout::Columns` is for).
fn gather_orders(rng: &mut StdRng, n: usize) -> [Vec<u32>; 3] {
    let m = if n == 0 {
        0
    } else {
        rng.random_range(0..2 * n)
    };
    let random: Vec<u32> = (0..m).map(|_| rng.random_range(0..n as u32)).collect();
    let [runs, _, nearly] = permutations(rng, n, 3);
    [random, runs, nearly]
}

#[test]
fn gather_source_matches_take() {
    let mut rng = StdRng::seed_from_u64(47);
    for n in SIZES {
        let arrays = random_arrays(&mut rng, n);
        let batch = batch_for_gather(&mut rng, &arrays);
        let pieces = random_pieces(&mut rng, &batch);
        for layout in [
            SourceLayout::Rows,
            SourceLayout::Columns,
            SourceLayout::Scattered,
        ] {
            let source = GatherSource::with_layout(batch.schema(), &pieces, layout).unwrap();
            assert_eq!(source.num_rows(), n);
            for idx in gather_orders(&mut rng, n) {
                let m = idx.len();
                // Gathered a chunk at a time, as a sort streams its output.
                for chunk in idx.chunks(rng.random_range(1..=m.max(1))) {
                    let got = source.gather(chunk).unwrap();
                    assert_eq!(got.num_rows(), chunk.len());
                    for (c, column) in batch.columns().iter().enumerate() {
                        let indices = UInt32Array::from(chunk.to_vec());
                        let want = arrow::compute::take(column.as_ref(), &indices, None).unwrap();
                        let got = got.column(c);
                        got.to_data().validate_full().unwrap();
                        assert_eq!(got.as_ref(), want.as_ref(), "column {c} n={n} {layout:?}");
                    }
                }
            }
            if n > 0 {
                let err = source.gather(&[n as u32]).err().unwrap();
                assert!(err.to_string().contains("out of range"), "{err}");
            }
        }
        // Only the nearly sorted order reads the batches row by row.
        let [runs, _, nearly] = permutations(&mut rng, n, 3);
        if n >= 1000 {
            assert_eq!(
                SourceLayout::for_order(&nearly),
                SourceLayout::Columns,
                "n={n}"
            );
            assert_eq!(
                SourceLayout::for_order(&runs),
                SourceLayout::Scattered,
                "n={n}"
            );
        }
        // A random order of 100000 rows has about 50000 ascending runs:
        // too many streams to scatter.
        if n >= 100_000 {
            let random: Vec<u32> = (0..n).map(|_| rng.random_range(0..n as u32)).collect();
            assert_eq!(
                SourceLayout::for_order(&random),
                SourceLayout::Rows,
                "n={n}"
            );
        }
    }
    let arrays = random_arrays(&mut rng, 3);
    let a = batch_for_gather(&mut rng, &arrays);
    let other = Schema::new(vec![Field::new("x", DataType::Int8, true)]);
    let b = RecordBatch::new_empty(Arc::new(other));
    let err = GatherSource::new(a.schema(), &[a, b]).err().unwrap();
    assert!(err.to_string().contains("expected"), "{err}");
}

/// Permutations of `0..n`: ascending runs of a stable sort of a key with
/// `keys` values, a random shuffle, and nearly sorted.
fn permutations(rng: &mut StdRng, n: usize, keys: u8) -> [Vec<u32>; 3] {
    let key: Vec<u8> = (0..n).map(|_| rng.random_range(0..keys)).collect();
    let key = &key;
    let runs: Vec<u32> = (0..keys)
        .flat_map(|k| (0..n as u32).filter(move |&i| key[i as usize] == k))
        .collect();
    let mut shuffled: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        shuffled.swap(i, rng.random_range(0..=i));
    }
    let mut nearly: Vec<u32> = (0..n as u32).collect();
    for _ in 0..n / 100 {
        nearly.swap(rng.random_range(0..n), rng.random_range(0..n));
    }
    [runs, shuffled, nearly]
}

/// `batch` with each string view column's values copied into buffers of
/// its own.
fn with_own_view_buffers(batch: &RecordBatch) -> RecordBatch {
    let columns = (batch.columns().iter())
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(c.as_string_view().gc()) as ArrayRef,
            _ => Arc::clone(c),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns).unwrap()
}

#[test]
fn scatter_matches_take() {
    let mut rng = StdRng::seed_from_u64(48);
    for n in SIZES {
        let arrays = random_arrays(&mut rng, n);
        let batch = batch_for_gather(&mut rng, &arrays);
        // Every other piece with view buffers of its own, so that views
        // are rebased by several bases.
        let pieces: Vec<RecordBatch> = (random_pieces(&mut rng, &batch).into_iter().enumerate())
            .map(|(i, p)| match i % 2 {
                0 => p,
                _ => with_own_view_buffers(&p),
            })
            .collect();
        let source =
            GatherSource::with_layout(batch.schema(), &pieces, SourceLayout::Scattered).unwrap();
        let keys = rng.random_range(1..=70);
        for order in permutations(&mut rng, n, keys) {
            for batch_rows in [1usize, 3, 64, 1000, 8192, usize::MAX] {
                let rows_per_batch = 1 << batch_rows.ilog2();
                let out: Vec<RecordBatch> = source
                    .scatter(&order, batch_rows)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert_eq!(out.len(), n.div_ceil(rows_per_batch), "n={n}");
                for (chunk, got) in order.chunks(rows_per_batch).zip(&out) {
                    assert_eq!(got.num_rows(), chunk.len());
                    let indices = UInt32Array::from(chunk.to_vec());
                    for (c, column) in batch.columns().iter().enumerate() {
                        let want = arrow::compute::take(column.as_ref(), &indices, None).unwrap();
                        let got = got.column(c);
                        got.to_data().validate_full().unwrap();
                        assert_eq!(
                            got.as_ref(),
                            want.as_ref(),
                            "column {c} n={n} keys={keys} batch_rows={batch_rows}"
                        );
                    }
                }
            }
        }
        // Only permutations of the source's rows scatter.
        let err = |order: &[u32]| source.scatter(order, 64).err().unwrap().to_string();
        assert!(err(&vec![0; n + 1]).contains("rows for a source"));
        if n >= 2 {
            let mut repeated: Vec<u32> = (0..n as u32).collect();
            repeated[1] = 0;
            assert!(err(&repeated).contains("repeats a row"), "n={n}");
            let mut outside: Vec<u32> = (0..n as u32).collect();
            outside[1] = n as u32;
            assert!(err(&outside).contains("out of range"), "n={n}");
        }
        if n > 0 {
            let packed = GatherSource::new(batch.schema(), &pieces).unwrap();
            let order: Vec<u32> = (0..n as u32).collect();
            let err = packed.scatter(&order, 64).err().unwrap().to_string();
            assert!(err.contains("keeps its columns in their batches"), "{err}");
        }
    }
}

#[test]
fn dictionary_decode_matches_cast() {
    let mut rng = StdRng::seed_from_u64(46);
    for n in SIZES {
        let values: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![
                Some("alpha"),
                None,
                Some(""),
                Some("a much longer string value here!"),
            ])),
            Arc::new(LargeStringArray::from(vec![
                Some("x"),
                Some("yy"),
                None,
                Some("zzz"),
            ])),
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00"[..]),
                Some(b"\xff\xfe"),
                None,
                Some(b""),
            ])),
            Arc::new(Int32Array::from(vec![
                Some(1),
                None,
                Some(-7),
                Some(i32::MAX),
            ])),
            Arc::new(Int64Array::from(vec![
                Some(1),
                Some(2),
                None,
                Some(i64::MIN),
            ])),
            Arc::new(Float64Array::from(vec![
                Some(f64::NAN),
                Some(-0.0),
                None,
                Some(1.5),
            ])),
            Arc::new(
                Decimal128Array::from(vec![Some(1), None, Some(-5), Some(7)])
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                Some(true),
            ])),
        ];
        let keys = Int32Array::from(
            (0..n)
                .map(|_| rng.random_bool(0.9).then(|| rng.random_range(0..4)))
                .collect::<Vec<_>>(),
        );
        for v in values {
            let dict = DictionaryArray::new(keys.clone(), Arc::clone(&v));
            let got = dictionary_decode(&dict).unwrap();
            let want = arrow::compute::cast(&dict, v.data_type()).unwrap();
            assert_eq!(got.len(), n);
            assert_eq!(
                got.to_data().nulls(),
                want.to_data().nulls().filter(|b| b.null_count() > 0),
                "{}",
                v.data_type()
            );
            for i in 0..n {
                if want.is_valid(i) {
                    assert_eq!(
                        got.slice(i, 1).to_data(),
                        want.slice(i, 1).to_data(),
                        "row {i} of {}",
                        v.data_type()
                    );
                }
            }
        }
    }
}

/// String decode over dictionaries large enough to take the prefetching
/// and 32-byte-move paths, values at and past 32 bytes (the two-pass
/// path), nulls on both sides, and sliced keys.
#[test]
fn string_decode_matches_cast_on_large_dictionaries() {
    let mut rng = StdRng::seed_from_u64(47);
    for entries in [1usize, 7, 300, 5000, 40_000] {
        for longest in [0usize, 8, 32, 33, 100] {
            let words: StringArray = (0..entries)
                .map(|_| {
                    let len = rng.random_range(0..=longest);
                    rng.random_bool(0.95).then(|| {
                        (0..len)
                            .map(|_| rng.random_range(b'a'..=b'z') as char)
                            .collect::<String>()
                    })
                })
                .collect();
            let words: ArrayRef = Arc::new(words);
            for n in [0usize, 1, 51, 3000, 20_000] {
                let keys = Int32Array::from(
                    (0..n + 3)
                        .map(|_| {
                            rng.random_bool(0.9)
                                .then(|| rng.random_range(0..entries as i32))
                        })
                        .collect::<Vec<_>>(),
                );
                let no_nulls = Int32Array::from(keys.values().to_vec());
                for keys in [keys, no_nulls] {
                    let dict = DictionaryArray::new(keys, Arc::clone(&words)).slice(3, n);
                    let got = dictionary_decode(&dict).unwrap();
                    let want = arrow::compute::cast(&dict, &DataType::Utf8).unwrap();
                    assert_eq!(
                        got.as_string::<i32>().iter().collect::<Vec<_>>(),
                        want.as_string::<i32>().iter().collect::<Vec<_>>(),
                        "{entries} entries up to {longest} bytes, {n} rows"
                    );
                    // Fixed-width values from the same codes (the direct,
                    // prefetching path when the keys have no nulls).
                    let numbers: ArrayRef = Arc::new(Int64Array::from_iter_values(
                        (0..entries as i64).map(|v| v * 3),
                    ));
                    let dict = DictionaryArray::new(dict.keys().clone(), numbers);
                    let got = dictionary_decode(&dict).unwrap();
                    let want = arrow::compute::cast(&dict, &DataType::Int64).unwrap();
                    assert_eq!(got.as_ref(), want.as_ref(), "{entries} fixed-width entries");
                }
            }
        }
    }
}

/// Dictionaries of short values without nulls decode through a table of
/// 32-byte slots once they decode four rows per entry: every size, 1 to
/// 4097 entries, values up to 31, 32 and 33 bytes (past a slot), all
/// three byte array types, keys sliced and with nulls (the other paths).
#[test]
fn string_decode_through_slots_matches_cast() {
    let mut rng = StdRng::seed_from_u64(48);
    for entries in [1usize, 2, 7, 49, 50, 51, 256, 4096, 4097] {
        for longest in [0usize, 1, 31, 32, 33] {
            let words: Vec<String> = (0..entries)
                .map(|_| {
                    let len = rng.random_range(0..=longest);
                    (0..len)
                        .map(|_| rng.random_range(b'a'..=b'z') as char)
                        .collect()
                })
                .collect();
            let values: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from_iter_values(&words)),
                Arc::new(LargeStringArray::from_iter_values(&words)),
                Arc::new(BinaryArray::from_iter_values(&words)),
            ];
            for n in SIZES.into_iter().chain([4 * entries, 4 * entries - 1]) {
                let codes: Vec<i32> = (0..n + 2)
                    .map(|_| rng.random_range(0..entries as i32))
                    .collect();
                let plain = Int32Array::from(codes.clone());
                let nullable =
                    Int32Array::from_iter(codes.iter().map(|&c| rng.random_bool(0.9).then_some(c)));
                for v in &values {
                    for keys in [&plain, &nullable] {
                        let dict = DictionaryArray::new(keys.clone(), Arc::clone(v)).slice(2, n);
                        let got = dictionary_decode(&dict).unwrap();
                        let want = arrow::compute::cast(&dict, v.data_type()).unwrap();
                        assert_eq!(
                            got.to_data(),
                            want.to_data(),
                            "{entries} entries up to {longest} bytes, {n} rows, {}",
                            v.data_type()
                        );
                    }
                }
            }
        }
    }
}

/// One [`DictionaryDecoder`] over a stream of batches that switch between
/// dictionaries (some sharing buffers, one an equal-content copy, one
/// with a value past a slot, one of 64Ki entries and one past that), to
/// plain values and to views, matches Arrow's cast batch by batch.
#[test]
fn dictionary_decoder_across_batches_matches_cast() {
    let mut rng = StdRng::seed_from_u64(49);
    let mut words = |entries: usize, longest: usize| -> ArrayRef {
        Arc::new(StringArray::from_iter_values((0..entries).map(|_| {
            let len = rng.random_range(0..=longest);
            (0..len)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect::<String>()
        })))
    };
    let small = words(7, 32);
    let medium = words(300, 20);
    let medium_copy: ArrayRef = Arc::new(StringArray::from_iter_values(
        medium.as_string::<i32>().iter().flatten(),
    ));
    let long = words(50, 40);
    let most = words(1 << 16, 12);
    let past = words((1 << 16) + 1, 12);
    let dictionaries = [small, medium, medium_copy, long, most, past];
    let mut decoder = DictionaryDecoder::new();
    let mut to_views = DictionaryDecoder::new();
    for step in 0..120 {
        // Runs of batches over one dictionary, so tables get built.
        let dictionary = &dictionaries[(step / 6) % dictionaries.len()];
        let entries = dictionary.len();
        // The last three of a run are large enough together to build
        // the table by the last (4 rows per entry, 16 past 4096 entries).
        let n = match step % 6 {
            0..3 => [0, 1, 2, 7, 49, 50, 51, 1000][rng.random_range(0..8)],
            _ if entries > 4096 => 400_000,
            _ => 100_000,
        };
        let keys = Int32Array::from_iter((0..n).map(|_| {
            (step % 4 != 3 || rng.random_bool(0.9)).then(|| rng.random_range(0..entries as i32))
        }));
        let dict = DictionaryArray::new(keys, Arc::clone(dictionary));
        let want = arrow::compute::cast(&dict, &DataType::Utf8).unwrap();
        let got = decoder.decode(&dict).unwrap();
        assert_eq!(
            got.to_data(),
            want.to_data(),
            "step {step}: {entries} entries, {n} rows"
        );
        let views = to_views.decode_to_views(&dict).unwrap();
        assert_eq!(
            views.as_string_view().iter().collect::<Vec<_>>(),
            want.as_string::<i32>().iter().collect::<Vec<_>>(),
            "step {step}: views of {entries} entries, {n} rows"
        );
    }
}

/// A dictionary's values in every byte layout `dictionary_decode_to_views`
/// takes, from one list (sliced once so offsets do not start at zero).
fn byte_value_arrays(values: &[Option<Vec<u8>>]) -> Vec<ArrayRef> {
    let mut padded = vec![Some(b"skipped".to_vec())];
    padded.extend(values.iter().cloned());
    let as_str = |v: &Option<Vec<u8>>| v.as_ref().map(|b| String::from_utf8(b.clone()).unwrap());
    let strings: Vec<Option<String>> = padded.iter().map(as_str).collect();
    let bins: Vec<Option<&[u8]>> = padded.iter().map(|v| v.as_deref()).collect();
    let all: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(strings.clone())),
        Arc::new(LargeStringArray::from(strings.clone())),
        Arc::new(StringViewArray::from(strings)),
        Arc::new(BinaryArray::from(bins.clone())),
        Arc::new(LargeBinaryArray::from(bins.clone())),
        Arc::new(BinaryViewArray::from(bins)),
    ];
    all.into_iter().map(|a| a.slice(1, values.len())).collect()
}

/// Decoding to views against the naive answer (each key's value, or null),
/// for string and binary dictionaries of every layout, values on both
/// sides of the 12-byte inline limit, nulls in keys and values, sliced
/// keys, and dictionaries from empty to larger than L2.
#[test]
fn dictionary_decode_to_views_matches_naive() {
    let mut rng = StdRng::seed_from_u64(48);
    for entries in [0usize, 1, 7, 300, 40_000] {
        for longest in [0usize, 12, 13, 40] {
            let values: Vec<Option<Vec<u8>>> = (0..entries)
                .map(|_| {
                    let len = rng.random_range(0..=longest);
                    rng.random_bool(0.95)
                        .then(|| (0..len).map(|_| rng.random_range(b'a'..=b'z')).collect())
                })
                .collect();
            for n in SIZES {
                let key = |rng: &mut StdRng| {
                    let valid = entries > 0 && rng.random_bool(0.9);
                    valid.then(|| rng.random_range(0..entries as i32))
                };
                let keys = Int32Array::from((0..n + 2).map(|_| key(&mut rng)).collect::<Vec<_>>());
                let no_nulls = Int32Array::from(keys.values().to_vec());
                let key_sets = if entries > 0 {
                    vec![keys, no_nulls]
                } else {
                    vec![keys]
                };
                for keys in key_sets {
                    let keys = keys.slice(2, n);
                    let want: Vec<Option<&[u8]>> = keys
                        .iter()
                        .map(|k| k.and_then(|k| values[k as usize].as_deref()))
                        .collect();
                    for dictionary in byte_value_arrays(&values) {
                        let context = format!(
                            "{} of {entries} entries up to {longest} bytes, {n} rows",
                            dictionary.data_type()
                        );
                        let dict = DictionaryArray::new(keys.clone(), Arc::clone(&dictionary));
                        let got = dictionary_decode_to_views(&dict).unwrap();
                        got.to_data().validate_full().unwrap();
                        let rows: Vec<Option<&[u8]>> = match got.data_type() {
                            DataType::Utf8View => {
                                let utf8 = matches!(
                                    dictionary.data_type(),
                                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                                );
                                assert!(utf8, "{context}");
                                got.as_string_view()
                                    .iter()
                                    .map(|v| v.map(str::as_bytes))
                                    .collect()
                            }
                            DataType::BinaryView => got.as_binary_view().iter().collect(),
                            t => panic!("{context}: decoded to {t}"),
                        };
                        assert_eq!(rows, want, "{context}");
                        assert_eq!(
                            got.null_count(),
                            want.iter().filter(|v| v.is_none()).count()
                        );
                        // Views into the dictionary's bytes, never a copy.
                        let data = got.to_data();
                        let dictionary_data = dictionary.to_data();
                        let owned: Vec<*const u8> = dictionary_data.buffers()
                            [dictionary_data.buffers().len().min(1)..]
                            .iter()
                            .map(|b| b.as_ptr())
                            .collect();
                        for b in &data.buffers()[1..] {
                            assert!(owned.contains(&b.as_ptr()), "{context}: copied bytes");
                        }
                        // The view dictionaries decode to views on the plain path too.
                        if matches!(
                            dictionary.data_type(),
                            DataType::Utf8View | DataType::BinaryView
                        ) {
                            let plain = dictionary_decode(&dict).unwrap();
                            assert_eq!(plain.as_ref(), got.as_ref(), "{context}");
                        }
                    }
                }
            }
        }
    }
    let numbers = DictionaryArray::new(
        Int32Array::from(vec![0]),
        Arc::new(Int64Array::from(vec![1])),
    );
    let err = dictionary_decode_to_views(&numbers).unwrap_err();
    assert!(
        err.to_string()
            .contains("string or binary values, got Int64"),
        "{err}"
    );
    let err = dictionary_decode_to_views(&Int32Array::from(vec![1])).unwrap_err();
    assert!(err.to_string().contains("needs a dictionary"), "{err}");
    // An empty dictionary under null keys decodes to nulls on every path.
    let nothing = DictionaryArray::new(
        Int32Array::from(vec![None, None]),
        Arc::new(Int64Array::from(Vec::<i64>::new())),
    );
    let got = dictionary_decode(&nothing).unwrap();
    assert_eq!((got.len(), got.null_count()), (2, 2));
}

/// Decoding to views with no null anywhere (the unrolled 16-byte gather)
/// against the naive answer: every size, dictionaries from one entry to
/// past half of L2 (70,000 views, 1.1 MB), sliced keys, one decoder
/// reused across batches as a scan uses it.
#[test]
fn dictionary_decode_to_views_without_nulls_matches_naive() {
    let mut rng = StdRng::seed_from_u64(49);
    for entries in [1usize, 300, 70_000] {
        let values: Vec<String> = (0..entries)
            .map(|i| format!("{i:0width$}", width = 1 + i % 20))
            .collect();
        let dictionary: ArrayRef = Arc::new(StringArray::from(values.clone()));
        let mut decoder = DictionaryDecoder::new();
        for n in SIZES {
            let codes: Vec<i32> = (0..n + 3)
                .map(|_| rng.random_range(0..entries as i32))
                .collect();
            let keys = Int32Array::from(codes.clone()).slice(3, n);
            let dict = DictionaryArray::new(keys, Arc::clone(&dictionary));
            let want: Vec<&str> = codes[3..]
                .iter()
                .map(|&c| values[c as usize].as_str())
                .collect();
            for got in [
                dictionary_decode_to_views(&dict).unwrap(),
                decoder.decode_to_views(&dict).unwrap(),
            ] {
                got.to_data().validate_full().unwrap();
                let rows: Vec<&str> = got.as_string_view().iter().map(Option::unwrap).collect();
                assert_eq!(rows, want, "{entries} entries, {n} rows");
            }
        }
    }
}

#[test]
fn kernels_reject_bad_input() {
    let err = argsort_columns::<u32>(&[], None, Parallelism(1)).unwrap_err();
    assert!(err.to_string().contains("at least one key column"), "{err}");
    let a = SortColumn {
        values: Arc::new(Int32Array::from(vec![1, 2])),
        options: None,
    };
    let b = SortColumn {
        values: Arc::new(Int32Array::from(vec![1])),
        options: None,
    };
    let err = argsort_columns::<u32>(&[a, b], None, Parallelism(1)).unwrap_err();
    assert!(err.to_string().contains("differ in length"), "{err}");
    let err = dictionary_decode(&Int32Array::from(vec![1])).unwrap_err();
    assert!(err.to_string().contains("needs a dictionary"), "{err}");
}

/// Arrow's verdict on views and buffers as a `Utf8View` array.
fn arrow_accepts_views(views: &[u128], buffers: &[arrow::buffer::Buffer]) -> bool {
    let mut all = vec![arrow::buffer::Buffer::from_vec(views.to_vec())];
    all.extend(buffers.iter().cloned());
    let builder = ArrayDataBuilder::new(DataType::Utf8View)
        .len(views.len())
        .buffers(all);
    // SAFETY: only validated, never read as an array.
    let data = unsafe { builder.build_unchecked() };
    data.validate_values().is_ok()
}

#[test]
fn utf8_view_validation_matches_arrow() {
    let mut rng = StdRng::seed_from_u64(41);
    // All-ASCII data takes the chunked fast path, the rest the exact one.
    let alphabets: [&[&str]; 2] = [
        &["a", "Z", "0", " ", "é", "ß", "≈", "中", "🦀"],
        &["a", "Z", "0", " ", "~"],
    ];
    for (n, alphabet) in [0usize, 1, 2, 7, 49, 50, 51, 1000, 100_000]
        .into_iter()
        .flat_map(|n| alphabets.map(|a| (n, a)))
    {
        let strings: Vec<String> = (0..n)
            .map(|_| {
                let len = rng.random_range(0..24);
                (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect()
            })
            .collect();
        let array = StringViewArray::from_iter_values(&strings);
        let (views, buffers) = (array.views().to_vec(), array.data_buffers().to_vec());
        assert!(validate_utf8_views(&views, &buffers).is_ok(), "n={n}");
        assert!(arrow_accepts_views(&views, &buffers));
        if n == 0 {
            continue;
        }
        // Corrupt one view bit or one data byte at a time; both checks
        // must reach the same verdict.
        let mut rejected = 0;
        for trial in 0..200 {
            let (mut views, mut buffers) = (views.clone(), buffers.clone());
            if trial % 2 == 0 || buffers.is_empty() {
                let i = rng.random_range(0..n);
                views[i] ^= 1u128 << rng.random_range(0..128);
            } else {
                let b = rng.random_range(0..buffers.len());
                let mut bytes = buffers[b].to_vec();
                if bytes.is_empty() {
                    continue;
                }
                let at = rng.random_range(0..bytes.len());
                bytes[at] = [0x80, 0xff, 0xc3, b'x'][rng.random_range(0..4)];
                buffers[b] = arrow::buffer::Buffer::from_vec(bytes);
            }
            let ours = validate_utf8_views(&views, &buffers).is_ok();
            assert_eq!(
                ours,
                arrow_accepts_views(&views, &buffers),
                "n={n} trial={trial}"
            );
            rejected += usize::from(!ours);
        }
        assert!(rejected > 20, "n={n}: only {rejected} corruptions caught");
    }
}

/// Bytes of the data buffers that the valid out-of-line views reference.
fn referenced_view_bytes<T: ByteViewType + ?Sized>(a: &GenericByteViewArray<T>) -> usize {
    (a.views().iter().enumerate())
        .filter(|&(i, &v)| v as u32 > 12 && a.is_valid(i))
        .map(|(_, &v)| v as u32 as usize)
        .sum()
}

#[test]
fn compact_views_matches_arrow_gc() {
    let mut rng = StdRng::seed_from_u64(43);
    for n in SIZES {
        // Lengths around the inline limit (12) and the block copy (32),
        // with duplicates, nulls, several source buffers, and strings
        // ending at their buffer's end.
        let value = |rng: &mut StdRng| -> Option<String> {
            let len = [0, 1, 11, 12, 13, 20, 31, 32, 33, 70][rng.random_range(0..10)];
            rng.random_bool(0.9).then(|| {
                (0..len)
                    .map(|_| ["a", "é", "🦀", "7"][rng.random_range(0..4)])
                    .collect::<String>()
                    .chars()
                    .take(len)
                    .collect()
            })
        };
        let parts: Vec<StringViewArray> = (0..3)
            .map(|_| {
                let values: Vec<Option<String>> = (0..n / 3 + 1).map(|_| value(&mut rng)).collect();
                StringViewArray::from(values)
            })
            .collect();
        let parts: Vec<&dyn Array> = parts.iter().map(|p| p as &dyn Array).collect();
        let whole = arrow::compute::concat(&parts).unwrap();
        let whole = whole.as_string_view().slice(0, n);
        // A random gather: views pointing all over every buffer.
        let indices =
            UInt32Array::from_iter_values((0..n).map(|_| rng.random_range(0..n.max(1)) as u32));
        let gathered = match n {
            0 => whole.clone(),
            _ => arrow::compute::take(&whole, &indices, None)
                .unwrap()
                .as_string_view()
                .clone(),
        };
        let start = rng.random_range(0..=n);
        let sliced = gathered.slice(start, rng.random_range(0..=n - start));
        for array in [&whole, &gathered, &sliced] {
            let ours = compact_views(array);
            assert_eq!(ours, array.gc(), "n={n}");
            assert_eq!(ours, *array, "n={n}");
            ours.to_data().validate_full().unwrap();
            let bytes: usize = ours.data_buffers().iter().map(|b| b.len()).sum();
            assert_eq!(
                bytes,
                referenced_view_bytes(array),
                "n={n}: only what views use"
            );
            assert!(ours.data_buffers().len() <= 1);
            let binary = array.clone().to_binary_view();
            assert_eq!(compact_views(&binary), binary, "n={n}");
            assert_shrunk(array, n);
        }
    }
}

/// `shrink_views(array)` equals `array` and its buffers hold at most twice
/// the bytes its views use plus the slack.
fn assert_shrunk(array: &StringViewArray, n: usize) {
    let shrunk = shrink_views(array);
    assert_eq!(shrunk, *array, "n={n}");
    shrunk.to_data().validate_full().unwrap();
    let held: usize = shrunk.data_buffers().iter().map(|b| b.len()).sum();
    let used = referenced_view_bytes(array);
    assert!(
        held <= 2 * used + SHRINK_SLACK_BYTES,
        "n={n}: {held} bytes held for {used} used"
    );
}

/// Views spread over a list that names the same few buffers many times
/// (and some never): the same values, each referenced buffer once, no
/// unreferenced one, none copied.
#[test]
fn dedup_view_buffers_keeps_values_and_lists_each_buffer_once() {
    let mut rng = StdRng::seed_from_u64(53);
    let pages: Vec<StringViewArray> = (0..4)
        .map(|p| {
            StringViewArray::from_iter_values(
                (0..20).map(|i| format!("page {p} value {i} {}", "x".repeat(i % 15))),
            )
        })
        .collect();
    for n in SIZES {
        // Buffer list: each page's buffer several times over, plus an
        // unreferenced one at the end.
        let mut buffers = vec![];
        for _ in 0..5 {
            for page in &pages {
                buffers.push(page.data_buffers()[0].clone());
            }
        }
        buffers.push(arrow::buffer::Buffer::from_vec(vec![0u8; 64]));
        let views: Vec<u128> = (0..n)
            .map(|_| {
                let slot = rng.random_range(0..20);
                let copy = rng.random_range(0..5);
                let page = rng.random_range(0..4);
                let v = pages[page].views()[slot];
                match v as u32 > 12 {
                    true => v | (((copy * 4 + page) as u128) << 64),
                    false => v,
                }
            })
            .collect();
        let nulls = (n % 2 == 1)
            .then(|| arrow::buffer::NullBuffer::from_iter((0..n).map(|_| rng.random_bool(0.8))));
        let array = StringViewArray::try_new(views.into(), buffers.clone(), nulls).unwrap();
        let start = rng.random_range(0..=n);
        let sliced = array.slice(start, rng.random_range(0..=n - start));
        for a in [&array, &sliced] {
            let ours = dedup_view_buffers(a);
            assert_eq!(ours, *a, "n={n}");
            ours.to_data().validate_full().unwrap();
            let kept = ours.data_buffers();
            for (i, b) in kept.iter().enumerate() {
                assert!(
                    pages.iter().any(|p| p.data_buffers()[0].ptr_eq(b)),
                    "n={n}: buffer {i} is a page's, not a copy"
                );
                assert!(
                    kept[..i].iter().all(|o| !o.ptr_eq(b)),
                    "n={n}: buffer {i} listed twice"
                );
                let used = ours.views().iter().enumerate().any(|(row, &v)| {
                    v as u32 > 12 && ours.is_valid(row) && (v >> 64) as u32 as usize == i
                });
                assert!(used, "n={n}: buffer {i} unreferenced");
            }
            let binary = a.clone().to_binary_view();
            assert_eq!(dedup_view_buffers(&binary), binary, "n={n}");
            assert_shrunk(a, n);
            // Pages' buffers are small against what a large array uses:
            // listed, not copied.
            if referenced_view_bytes(a) > 4 * SHRINK_SLACK_BYTES {
                let shrunk = shrink_views(a);
                assert!(shrunk
                    .data_buffers()
                    .iter()
                    .all(|b| pages.iter().any(|p| p.data_buffers()[0].ptr_eq(b))));
            }
        }
    }
}

/// Keys without nulls take the direct path (vector gathers where the CPU
/// has them): 1- to 16-byte values, i32 and u32 keys, every size, with the
/// tails past the last full vector block.
#[test]
fn dictionary_decode_without_nulls_matches_cast() {
    let mut rng = StdRng::seed_from_u64(47);
    let values: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from_iter_values(-50..50)),
        Arc::new(UInt16Array::from_iter_values(0..1000)),
        Arc::new(Int32Array::from_iter_values((0..70_000).map(|i| i * 7 - 3))),
        Arc::new(Float32Array::from_iter_values([
            f32::NAN,
            -0.0,
            1.5,
            f32::MIN,
        ])),
        Arc::new(Int64Array::from_iter_values((0..300).map(|i| i64::MIN + i))),
        Arc::new(Float64Array::from_iter_values(
            (0..70_000).map(|i| i as f64 / 3.0),
        )),
        Arc::new(
            Decimal128Array::from_iter_values((0..500).map(|i| i * 1_000_003))
                .with_precision_and_scale(38, 2)
                .unwrap(),
        ),
    ];
    for n in SIZES {
        for v in &values {
            let codes: Vec<u32> = (0..n)
                .map(|_| rng.random_range(0..v.len() as u32))
                .collect();
            let signed = Int32Array::from_iter_values(codes.iter().map(|&c| c as i32));
            let by_i32 = DictionaryArray::new(signed, Arc::clone(v));
            let by_u32 = DictionaryArray::new(UInt32Array::from(codes), Arc::clone(v));
            for dict in [&by_i32 as &dyn Array, &by_u32] {
                let got = dictionary_decode(dict).unwrap();
                let want = arrow::compute::cast(dict, v.data_type()).unwrap();
                assert_eq!(got.to_data(), want.to_data(), "n={n} {}", v.data_type());
            }
        }
    }
}

#[test]
fn interleave_batches_matches_arrow() {
    let mut rng = StdRng::seed_from_u64(53);
    for n in SIZES {
        // Batches with buffers of their own, and slices of them at several
        // offsets (some empty), as a merge holds the rest of each input
        // batch.
        let mut pieces = vec![];
        for _ in 0..3 {
            let arrays = random_arrays(&mut rng, n);
            let batch = batch_for_gather(&mut rng, &arrays);
            pieces.extend(random_pieces(&mut rng, &batch));
            pieces.push(batch);
        }
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        let nonempty: Vec<usize> = (0..refs.len())
            .filter(|&b| refs[b].num_rows() > 0)
            .collect();
        let m = if n == 0 {
            0
        } else {
            rng.random_range(0..2 * n)
        };
        let indices: Vec<(usize, usize)> = (0..m)
            .map(|_| {
                let b = nonempty[rng.random_range(0..nonempty.len())];
                (b, rng.random_range(0..refs[b].num_rows()))
            })
            .collect();
        let got = interleave_batches(&refs, &indices).unwrap();
        let want = arrow::compute::interleave_record_batch(&refs, &indices).unwrap();
        assert_eq!(got.num_rows(), m);
        for (c, (got, want)) in got.columns().iter().zip(want.columns()).enumerate() {
            got.to_data().validate_full().unwrap();
            assert_eq!(got.as_ref(), want.as_ref(), "column {c} n={n}");
        }
        if n > 0 {
            let err = interleave_batches(&refs, &[(0, n + 1)]).unwrap_err();
            assert!(err.to_string().contains("interleave index 0"), "{err}");
        }
    }
}

/// `key_images` against the reference order: rows adjacent in the
/// reference's sorted order, and random pairs, compare as their images
/// do; types without an image say so.
#[test]
fn key_images_order_like_reference() {
    let mut rng = StdRng::seed_from_u64(47);
    for n in SIZES {
        for array in random_arrays(&mut rng, n) {
            for o in all_options() {
                let Some(images) = key_images(array.as_ref(), o).unwrap() else {
                    assert!(matches!(
                        array.data_type(),
                        DataType::Utf8
                            | DataType::Utf8View
                            | DataType::Binary
                            | DataType::Dictionary(_, _)
                    ));
                    continue;
                };
                assert_eq!(images.len(), n);
                let keys = ref_keys(array.as_ref());
                let order = ref_order(&[(Arc::clone(&array), o)]);
                let random_pairs = (0..n).map(|_| (rng.random_range(0..n), rng.random_range(0..n)));
                let adjacent = order.windows(2).map(|w| (w[0] as usize, w[1] as usize));
                for (a, b) in adjacent.chain(random_pairs) {
                    assert_eq!(
                        images[a].cmp(&images[b]),
                        cmp_ref(&keys[a], &keys[b], o),
                        "{} n={n} {o:?} rows {a} and {b}",
                        array.data_type()
                    );
                }
            }
        }
    }
}
