//! Criterion benches of every kernel at 1M rows (`cargo bench` here; with
//! `-- --test` each runs once, which CI does so the benches do not rot).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, Date32Array, Decimal128Array, DictionaryArray, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, StringViewArray, UInt32Array, UInt64Array,
};
use arrow::compute::{SortColumn, SortOptions};
use arrow::datatypes::{Field, Schema};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use insitu_kernel_bench::{random_indices, random_u64};
use insitu_kernels::*;

const ROWS: usize = 1 << 20;

fn argsorts(c: &mut Criterion) {
    let mut g = c.benchmark_group("argsort");
    g.throughput(Throughput::Elements(ROWS as u64));
    let u64s = UInt64Array::from(random_u64(ROWS, 1));
    g.bench_function("u64 random", |b| {
        b.iter(|| argsort(&u64s, SortOptions::default()).unwrap())
    });
    g.bench_function("u64 random, 2 threads", |b| {
        b.iter(|| argsort_to::<u32>(&u64s, SortOptions::default(), Parallelism(2)).unwrap())
    });
    let f64s = Float64Array::from(
        random_u64(ROWS, 2)
            .into_iter()
            .map(|k| k as f64 - 9e18)
            .collect::<Vec<_>>(),
    );
    g.bench_function("f64 descending", |b| {
        b.iter(|| {
            argsort(
                &f64s,
                SortOptions {
                    descending: true,
                    nulls_first: false,
                },
            )
            .unwrap()
        })
    });
    let small = Int32Array::from(
        random_indices(ROWS, 200_000, 3)
            .into_iter()
            .map(|v| v as i32)
            .collect::<Vec<_>>(),
    );
    g.bench_function("i32 range 200k", |b| {
        b.iter(|| argsort(&small, SortOptions::default()).unwrap())
    });
    g.bench_function("u64 top 100", |b| {
        b.iter(|| argsort_top_k::<u32>(&u64s, SortOptions::default(), 100).unwrap())
    });
    g.finish();
    // The host merge's keys of one fixed-width column.
    let mut g = c.benchmark_group("key_images");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.bench_function("u64", |b| {
        b.iter(|| key_images(&u64s, SortOptions::default()).unwrap())
    });
    let decimals = Decimal128Array::from(
        random_u64(ROWS, 4)
            .into_iter()
            .map(|k| (k % 10_000_000) as i128 - 5_000_000)
            .collect::<Vec<_>>(),
    );
    g.bench_function("decimal128 descending", |b| {
        let options = SortOptions {
            descending: true,
            nulls_first: false,
        };
        b.iter(|| key_images(&decimals, options).unwrap())
    });
    g.finish();
}

fn dictionary_string_column() -> ArrayRef {
    let words: Vec<String> = (0..7).map(|i| format!("SHIPMODE-{i}")).collect();
    let codes = Int32Array::from(
        random_indices(ROWS, 7, 4)
            .into_iter()
            .map(|c| c as i32)
            .collect::<Vec<_>>(),
    );
    Arc::new(DictionaryArray::new(
        codes,
        Arc::new(StringArray::from(words)),
    ))
}

fn dictionaries(c: &mut Criterion) {
    let mut g = c.benchmark_group("dictionary");
    g.throughput(Throughput::Elements(ROWS as u64));
    let dict = dictionary_string_column();
    g.bench_function("sort_dictionary strings", |b| {
        b.iter(|| sort_dictionary(dict.as_ref(), SortOptions::default()).unwrap())
    });
    // What an ORDER BY of a low-cardinality string column ranks: views
    // as the Parquet reader gives them, into one dictionary page, half of
    // them out of line.
    let page = StringViewArray::from(vec![
        "DELIVER IN PERSON",
        "TAKE BACK RETURN",
        "NONE",
        "COLLECT COD",
    ]);
    let views = StringViewArray::new(
        (random_indices(ROWS, 4, 7).into_iter())
            .map(|c| page.views()[c as usize])
            .collect(),
        page.data_buffers().to_vec(),
        None,
    );
    g.bench_function("low_cardinality_ranks views", |b| {
        b.iter(|| low_cardinality_ranks(&views).unwrap().unwrap())
    });
    g.bench_function("dictionary_ranks strings", |b| {
        b.iter(|| dictionary_ranks(dict.as_ref()).unwrap())
    });
    g.bench_function("decode strings", |b| {
        b.iter(|| dictionary_decode(dict.as_ref()).unwrap())
    });
    g.bench_function("decode strings to views", |b| {
        b.iter(|| dictionary_decode_to_views(dict.as_ref()).unwrap())
    });
    let codes = Int32Array::from(
        random_indices(ROWS, 1 << 16, 5)
            .into_iter()
            .map(|c| c as i32)
            .collect::<Vec<_>>(),
    );
    let fixed = DictionaryArray::new(codes, Arc::new(UInt64Array::from(random_u64(1 << 16, 6))));
    g.bench_function("decode u64", |b| {
        b.iter(|| dictionary_decode(&fixed).unwrap())
    });
    // 64Ki entries of 1-32 bytes, decoded in 64Ki-row batches by one
    // decoder, as a scan of one column chunk does.
    let words = Arc::new(StringArray::from_iter_values(
        (0..1 << 16).map(|i| format!("{:0width$}", i, width = 1 + i % 32)),
    ));
    let large = DictionaryArray::new(fixed.keys().clone(), words);
    let batches: Vec<_> = (0..ROWS)
        .step_by(1 << 16)
        .map(|at| large.slice(at, (1 << 16).min(ROWS - at)))
        .collect();
    let mut decoder = DictionaryDecoder::new();
    g.bench_function("decoder strings 64Ki entries", |b| {
        b.iter(|| {
            let decoded = batches
                .iter()
                .map(|batch| decoder.decode(batch).unwrap().len());
            decoded.sum::<usize>()
        })
    });
    g.finish();
}

fn multi_column(c: &mut Criterion) {
    let mut g = c.benchmark_group("argsort_columns");
    g.throughput(Throughput::Elements(ROWS as u64));
    let a: ArrayRef = dictionary_string_column();
    let b: ArrayRef = Arc::new(Int32Array::from(
        random_indices(ROWS, 1 << 20, 7)
            .into_iter()
            .map(|v| v as i32)
            .collect::<Vec<_>>(),
    ));
    let cols = vec![
        SortColumn {
            values: a,
            options: None,
        },
        SortColumn {
            values: b,
            options: Some(SortOptions {
                descending: true,
                nulls_first: false,
            }),
        },
    ];
    g.bench_function("dictionary string + i32", |bch| {
        bch.iter(|| argsort_columns::<u32>(&cols, None, Parallelism(1)).unwrap())
    });
    g.finish();
}

fn gathers(c: &mut Criterion) {
    let mut g = c.benchmark_group("gather");
    g.throughput(Throughput::Elements(ROWS as u64));
    let values = random_u64(ROWS * 8, 8);
    let idx = random_indices(ROWS, ROWS * 8, 9);
    g.bench_function("u64 values, random", |b| {
        b.iter(|| gather_values(&values, &idx))
    });
    let rows: Vec<u8> = random_u64(ROWS * 2, 10)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let row_idx = random_indices(ROWS, ROWS, 11);
    let mut out = Vec::new();
    g.bench_function("16-byte rows, random", |b| {
        b.iter(|| gather_rows(&rows, 16, &row_idx, &mut out))
    });
    // Hybrid lineitem's row width: wider than the fixed-width copy loops.
    let wide: Vec<u8> = random_u64(ROWS * 158 / 8, 13)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let wide_idx = random_indices(ROWS, wide.len() / 158, 14);
    g.bench_function("158-byte rows, random", |b| {
        b.iter(|| gather_rows(&wide, 158, &wide_idx, &mut out))
    });
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", arrow::datatypes::DataType::UInt64, false),
            Field::new("s", dictionary_string_column().data_type().clone(), false),
        ])),
        vec![
            Arc::new(UInt64Array::from(random_u64(ROWS, 12))),
            dictionary_string_column(),
        ],
    )
    .unwrap();
    let batch_idx = random_indices(ROWS, ROWS, 13);
    g.bench_function("batch (u64 + dictionary)", |b| {
        b.iter(|| gather_batch(&batch, &batch_idx).unwrap())
    });
    // The same rows held as 8192-row batches, gathered 8192 rows at a time
    // as a device sort streams its output.
    let pieces = device_batches(&batch);
    g.bench_function("gather source (u64 + dictionary), 8192-row chunks", |b| {
        b.iter(|| {
            let source = GatherSource::new(batch.schema(), &pieces).unwrap();
            batch_idx
                .chunks(8192)
                .map(|c| source.gather(c).unwrap().num_rows())
                .sum::<usize>()
        })
    });
    // ORDER BY a key of 7 values: a stable sort leaves 7 ascending runs.
    // Packed rows gathered a chunk at a time, against one scatter; with
    // memory reused from the scratch pool, as on a device.
    mem::set_scratch_pool_bytes_max(1 << 30);
    let runs: Vec<u32> = (0..7u32)
        .flat_map(|k| (k..ROWS as u32).step_by(7))
        .collect();
    let strings = StringViewArray::from_iter_values(
        random_u64(ROWS, 15)
            .iter()
            .map(|v| ["AIR", "MAIL", "SHIP", "TRUCK"][(*v % 4) as usize]),
    );
    let wide = RecordBatch::try_from_iter([
        (
            "a",
            Arc::new(UInt64Array::from(random_u64(ROWS, 16))) as ArrayRef,
        ),
        (
            "b",
            Arc::new(UInt64Array::from(random_u64(ROWS, 17))) as ArrayRef,
        ),
        ("s", Arc::new(strings) as ArrayRef),
    ])
    .unwrap();
    let wide_pieces = device_batches(&wide);
    g.bench_function("7 key runs (2 x u64 + view), packed rows", |b| {
        b.iter(|| {
            let source = GatherSource::new(wide.schema(), &wide_pieces).unwrap();
            runs.chunks(8192)
                .map(|c| source.gather(c).unwrap().num_rows())
                .sum::<usize>()
        })
    });
    g.bench_function("7 key runs (2 x u64 + view), scatter", |b| {
        b.iter(|| {
            let layout = SourceLayout::Scattered;
            let source = GatherSource::with_layout(wide.schema(), &wide_pieces, layout).unwrap();
            (source.scatter(&runs, 8192).unwrap())
                .map(|batch| batch.unwrap().num_rows())
                .sum::<usize>()
        })
    });
    mem::set_scratch_pool_bytes_max(0);
    g.finish();
}

/// `batch` as the 8192-row batches a device sort collects.
fn device_batches(batch: &RecordBatch) -> Vec<RecordBatch> {
    (0..batch.num_rows())
        .step_by(8192)
        .map(|at| batch.slice(at, 8192.min(batch.num_rows() - at)))
        .collect()
}

/// Compaction of a string view column gathered at random: strings of 13 to
/// 43 bytes (like TPC-H comments) spread over many source buffers; and of
/// one gathered from batches sharing a dictionary page (like TPC-H
/// l_shipinstruct), listed once instead of copied.
fn views(c: &mut Criterion) {
    let mut g = c.benchmark_group("views");
    g.throughput(Throughput::Elements(ROWS as u64));
    let strings: Vec<String> = random_u64(ROWS, 14)
        .iter()
        .map(|v| format!("{v:016x}").repeat(3)[..13 + (*v % 31) as usize].to_string())
        .collect();
    let pieces: Vec<ArrayRef> = strings
        .chunks(8192)
        .map(|c| Arc::new(StringViewArray::from_iter_values(c)) as ArrayRef)
        .collect();
    let pieces: Vec<&dyn arrow::array::Array> = pieces.iter().map(|p| p.as_ref()).collect();
    let whole = arrow::compute::concat(&pieces).unwrap();
    let idx = UInt32Array::from(random_indices(ROWS, ROWS, 15));
    let gathered = arrow::compute::take(&whole, &idx, None).unwrap();
    let gathered = gathered.as_string_view();
    g.bench_function("compact_views, random gather", |b| {
        b.iter(|| compact_views(gathered))
    });
    g.bench_function("arrow gc, random gather", |b| b.iter(|| gathered.gc()));
    g.bench_function("shrink_views, random gather", |b| {
        b.iter(|| shrink_views(gathered))
    });
    // A gather over batches decoded from one dictionary page: the page's
    // buffer listed once per 8192-row source batch.
    let page = StringViewArray::from(vec!["DELIVER IN PERSON", "TAKE BACK RETURN", "NONE"]);
    let sources = ROWS.div_ceil(8192) as u128;
    let views: Vec<u128> = random_u64(ROWS, 16)
        .iter()
        .map(|r| {
            let v = page.views()[(r % 3) as usize];
            match v as u32 > 12 {
                true => v | (((*r as u128 >> 8) % sources) << 64),
                false => v,
            }
        })
        .collect();
    let buffers = vec![page.data_buffers()[0].clone(); sources as usize];
    let paged = StringViewArray::try_new(views.into(), buffers, None).unwrap();
    g.bench_function("dedup_view_buffers, one page's buffer per source", |b| {
        b.iter(|| dedup_view_buffers(&paged))
    });
    g.bench_function("compact_views, one page's buffer per source", |b| {
        b.iter(|| compact_views(&paged))
    });
    g.bench_function("shrink_views, one page's buffer per source", |b| {
        b.iter(|| shrink_views(&paged))
    });
    g.finish();
}
/// Arrays shaped like a sorted lineitem batch's string columns, as the
/// host receives them: compacted comments, and dictionary-page strings.
fn validation(c: &mut Criterion) {
    let mut g = c.benchmark_group("validate_utf8_views");
    g.throughput(Throughput::Elements(ROWS as u64));
    let comments: Vec<StringViewArray> = random_u64(ROWS, 17)
        .chunks(8192)
        .map(|c| {
            let strings = c.iter().map(|v| {
                let s = format!("{v:016x} carefully final deposits sleep");
                s[..10 + (*v % 34) as usize].to_string()
            });
            compact_views(&StringViewArray::from_iter_values(strings))
        })
        .collect();
    g.bench_function("comments 10-43 bytes, compacted", |b| {
        b.iter(|| {
            for a in &comments {
                validate_utf8_views(a.views(), a.data_buffers()).unwrap();
            }
        })
    });
    let page = StringViewArray::from(vec![
        "DELIVER IN PERSON",
        "TAKE BACK RETURN",
        "NONE",
        "COLLECT COD",
    ]);
    let instructions: Vec<u128> = random_u64(ROWS, 18)
        .iter()
        .map(|r| page.views()[(r % 4) as usize])
        .collect();
    g.bench_function("dictionary page, half inline", |b| {
        b.iter(|| {
            for v in instructions.chunks(8192) {
                validate_utf8_views(v, page.data_buffers()).unwrap();
            }
        })
    });
    g.finish();
}

/// A merge's copy of short runs: two sorted inputs of 32768 rows with
/// lineitem's column types, interleaved 8192 rows at a time at random
/// (runs of about two rows, as ORDER BY a key with many values gives).
fn interleaves(c: &mut Criterion) {
    let rows = 32768;
    let input = |seed: u64| -> RecordBatch {
        let r = random_u64(rows, seed);
        let ints = |k: u64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                r.iter().map(|v| (v >> k) as i64),
            ))
        };
        let decimals = |k: u64| -> ArrayRef {
            let values = r.iter().map(|v| ((v >> k) % 10_000_000) as i128);
            Arc::new(
                Decimal128Array::from_iter_values(values)
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            )
        };
        let dates = |k: u64| -> ArrayRef {
            Arc::new(Date32Array::from_iter_values(
                r.iter().map(|v| ((v >> k) % 2500) as i32),
            ))
        };
        let words = |list: &[&str], k: u64| -> ArrayRef {
            let values = r
                .iter()
                .map(|v| list[((v >> k) % list.len() as u64) as usize]);
            Arc::new(StringViewArray::from_iter_values(values))
        };
        let instructions = [
            "NONE",
            "COLLECT COD",
            "DELIVER IN PERSON",
            "TAKE BACK RETURN",
        ];
        let comment: Vec<String> = (r.iter())
            .map(|v| format!("comment {v} past twelve bytes"))
            .collect();
        let mut columns = vec![ints(1), ints(2), ints(3)];
        columns.push(Arc::new(Int32Array::from_iter_values(
            r.iter().map(|v| (v % 7) as i32),
        )));
        columns.extend((4..8).map(decimals));
        columns.push(words(&["A", "N", "R"], 9));
        columns.push(words(&["F", "O"], 10));
        columns.extend((11..14).map(dates));
        columns.push(words(&instructions, 14));
        columns.push(words(
            &["AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB", "REG AIR"],
            15,
        ));
        columns.push(Arc::new(StringViewArray::from_iter_values(comment)));
        let fields: Vec<Field> = (columns.iter().enumerate())
            .map(|(i, a)| Field::new(format!("c{i}"), a.data_type().clone(), false))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    };
    let (a, b) = (input(21), input(22));
    let picks = random_u64(8192, 23);
    let mut next = [0usize; 2];
    let indices: Vec<(usize, usize)> = (picks.iter())
        .map(|p| {
            let from = (p & 1) as usize;
            next[from] += 1;
            (from, next[from] - 1)
        })
        .collect();
    let mut g = c.benchmark_group("interleave");
    g.throughput(Throughput::Elements(indices.len() as u64));
    g.bench_function("arrow interleave_record_batch", |bench| {
        bench.iter(|| arrow::compute::interleave_record_batch(&[&a, &b], &indices).unwrap())
    });
    g.bench_function("interleave_batches", |bench| {
        bench.iter(|| interleave_batches(&[&a, &b], &indices).unwrap())
    });
    g.finish();
}

criterion_group!(
    benches,
    argsorts,
    dictionaries,
    multi_column,
    gathers,
    views,
    validation,
    interleaves
);
criterion_main!(benches);
