//! Side-by-side kernel benchmark: argsort against other sorts, gather and
//! dictionary decode against a copy of the same bytes. Prints medians and
//! ratios as a markdown table and JSON lines.
//!
//! Usage: sortbench [--rows N] [--reps R] [--threads T] [--python PY] [--only-insitu-argsort] [--only-shuffle] [--only-decode]

use std::process::Command;
use std::sync::Arc;

use arrow::array::{DictionaryArray, Int32Array, StringArray, UInt64Array};
use arrow::compute::SortOptions;
use insitu_kernel_bench::{median_secs, random_indices, random_u64};
use insitu_kernels::{
    argsort_to, dictionary_decode, dictionary_decode_to_views, gather_values, DictionaryDecoder,
    Parallelism,
};

/// A (key, row) pair as rdst and std sort it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Pair {
    key: u64,
    row: u32,
}

impl rdst::RadixKey for Pair {
    const LEVELS: usize = 8;
    #[inline]
    fn get_level(&self, level: usize) -> u8 {
        (self.key >> (level * 8)) as u8
    }
}

/// The same pair for voracious_radix_sort, ordered by key alone.
#[derive(Clone, Copy, Debug, Default)]
struct PairV(Pair);

impl PartialOrd for PairV {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.0.key.partial_cmp(&other.0.key)
    }
}
impl PartialEq for PairV {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}
impl voracious_radix_sort::Radixable<u64> for PairV {
    type Key = u64;
    #[inline]
    fn key(&self) -> u64 {
        self.0.key
    }
}

const USAGE: &str = "sortbench [--rows N] [--reps R] [--threads T] [--python PY] [--only-insitu-argsort] [--only-shuffle] [--only-decode]";

struct Args {
    rows: usize,
    reps: usize,
    threads: usize,
    python: Option<String>,
    /// Only insitu's argsort (for profiling).
    only_insitu: bool,
    /// Only the whole-batch shuffle (for profiling).
    only_shuffle: bool,
    /// Only dictionary decode, next to a copy (for profiling).
    only_decode: bool,
}

fn parse_args() -> Args {
    parse(std::env::args().skip(1)).unwrap_or_else(|e| {
        eprintln!("error: {e}\nusage: {USAGE}");
        std::process::exit(2)
    })
}

/// The arguments, or what is wrong with them.
fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        rows: 100_000_000,
        reps: 5,
        threads: 2,
        python: None,
        only_insitu: false,
        only_shuffle: false,
        only_decode: false,
    };
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{a} takes a whole number, not {v:?}"))
        };
        match a.as_str() {
            "--rows" => args.rows = number(value()?)?,
            "--reps" => args.reps = number(value()?)?,
            "--threads" => args.threads = number(value()?)?,
            "--python" => args.python = Some(value()?),
            "--only-insitu-argsort" => args.only_insitu = true,
            "--only-shuffle" => args.only_shuffle = true,
            "--only-decode" => args.only_decode = true,
            "--help" | "-h" => {
                println!("usage: {USAGE}");
                std::process::exit(0)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.reps == 0 || args.threads == 0 {
        return Err("--reps and --threads must be at least 1".into());
    }
    Ok(args)
}

fn row(group: &str, name: &str, secs: f64, items: usize, baseline: f64) {
    println!(
        "| {group} | {name} | {secs:.3} | {:.1} | {:.2}x |",
        items as f64 / secs / 1e6,
        secs / baseline
    );
    eprintln!(
        "{}",
        serde_json::json!({"group": group, "name": name, "median_s": secs, "items": items})
    );
}

fn main() {
    let args = parse_args();
    let n = args.rows;
    let reps = args.reps;
    let t = args.threads;
    // Kernels reuse pre-faulted scratch between calls, as a device's do.
    let pool_bytes = 4usize << 30;
    insitu_kernels::mem::set_scratch_pool_bytes_max(pool_bytes);
    println!(
        "rows={n} reps={reps} threads={t} scratch_pool_bytes_max={pool_bytes} (median seconds; ratio = time / insitu time)\n"
    );
    println!("| group | implementation | median s | M items/s | time ratio |");
    println!("|---|---|---:|---:|---:|");
    if args.only_shuffle {
        return shuffle_batch(n / 16, reps);
    }
    if args.only_decode {
        let copy = copy_bandwidth(&random_u64(n, 1), reps);
        return decode_section(n, reps, copy);
    }

    // argsort of random u64 keys with u32 row indices.
    let keys = random_u64(n, 1);
    let keys_array = UInt64Array::from(keys.clone());
    let ours = median_secs(
        reps,
        || (),
        |_| {
            let order = argsort_to::<u32>(&keys_array, SortOptions::default(), Parallelism(t));
            // A device gathers by the order, then hands the memory back.
            insitu_kernels::mem::recycle(order.expect("argsort of u64 keys"));
        },
    );
    let pairs = || {
        keys.iter()
            .enumerate()
            .map(|(i, &key)| Pair { key, row: i as u32 })
            .collect::<Vec<_>>()
    };
    row("argsort u64", "insitu radix", ours, n, ours);
    if args.only_insitu {
        return;
    }
    let std_t = median_secs(reps, pairs, |mut p| {
        p.sort_unstable_by_key(|x| x.key);
        p
    });
    row("argsort u64", "std sort_unstable (pairs)", std_t, n, ours);
    let std_stable = median_secs(reps, pairs, |mut p| {
        p.sort_by_key(|x| x.key);
        p
    });
    row(
        "argsort u64",
        "std sort (stable, pairs)",
        std_stable,
        n,
        ours,
    );
    let rdst_t = median_secs(reps, pairs, |mut p| {
        use rdst::RadixSort;
        p.radix_sort_builder().with_parallel(t > 1).sort();
        p
    });
    row("argsort u64", "rdst (pairs)", rdst_t, n, ours);
    let vor = median_secs(
        reps,
        || pairs().into_iter().map(PairV).collect::<Vec<_>>(),
        |mut p| {
            use voracious_radix_sort::RadixSort;
            if t > 1 {
                p.voracious_mt_sort(t);
            } else {
                p.voracious_sort();
            }
            p
        },
    );
    row("argsort u64", "voracious (pairs)", vor, n, ours);
    if let Some(py) = &args.python {
        for (name, secs) in python_argsorts(py, n, reps, t) {
            row("argsort u64", &name, secs, n, ours);
        }
    }
    drop(keys_array);
    // STREAM-like copy and gathers over the same 8-byte values. Outputs go
    // to warm buffers, as in an engine working batch by batch: a fresh
    // buffer per call would measure page faults, not the kernel.
    let copy = copy_bandwidth(&keys, reps);
    let random_idx = random_indices(n, n, 2);
    let g = median_secs(
        reps,
        || (),
        |_| in_batches(&random_idx, |idx| gather_values(&keys, idx)),
    );
    row(
        "bandwidth",
        "gather 8-byte values, random, 64Ki-row batches",
        g,
        n,
        copy,
    );
    let seq: Vec<u32> = (0..n as u32).collect();
    let gs = median_secs(
        reps,
        || (),
        |_| in_batches(&seq, |idx| gather_values(&keys, idx)),
    );
    row(
        "bandwidth",
        "gather 8-byte values, sequential, 64Ki-row batches",
        gs,
        n,
        copy,
    );
    let keys_array = UInt64Array::from(keys.clone());
    let take = median_secs(
        reps,
        || (),
        |_| {
            in_batches(&random_idx, |idx| {
                arrow::compute::take(
                    &keys_array,
                    &arrow::array::UInt32Array::from(idx.to_vec()),
                    None,
                )
                .unwrap()
            })
        },
    );
    row(
        "bandwidth",
        "arrow take 8-byte values, random, 64Ki-row batches",
        take,
        n,
        copy,
    );
    drop((random_idx, seq, keys_array));

    decode_section(n, reps, copy);
    println!();
    shuffle_batch(n / 16, reps);
}

/// A device's shuffle after a sort: every column of a lineitem-shaped
/// batch (3 i64, i32, 4 decimal128, 3 date32, 5 string views: 184 bytes of
/// fixed-width parts per row) gathered by one random permutation, column
/// by column, through rows, and by Arrow's take, next to a copy of the
/// same bytes.
fn shuffle_batch(rows: usize, reps: usize) {
    use arrow::array::{
        ArrayRef, Date32Array, Decimal128Array, Int32Array, Int64Array, RecordBatch,
        StringViewArray,
    };
    use insitu_kernels::gather_batch_with;
    let ints = |seed| {
        Arc::new(Int64Array::from_iter_values(
            random_u64(rows, seed).into_iter().map(|v| (v >> 40) as i64),
        )) as ArrayRef
    };
    let decimals = |seed| {
        let values = random_u64(rows, seed)
            .into_iter()
            .map(|v| (v >> 44) as i128);
        Arc::new(
            Decimal128Array::from_iter_values(values)
                .with_precision_and_scale(15, 2)
                .expect("decimal(15,2)"),
        ) as ArrayRef
    };
    let dates = |seed| {
        Arc::new(Date32Array::from_iter_values(
            random_u64(rows, seed)
                .into_iter()
                .map(|v| (v % 2500) as i32 + 8000),
        )) as ArrayRef
    };
    let words = |seed, len: usize| {
        let values = random_u64(rows, seed)
            .into_iter()
            .map(|v| format!("{v:0len$}")[..len].to_string());
        Arc::new(StringViewArray::from_iter_values(values)) as ArrayRef
    };
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("orderkey", ints(20)),
        ("partkey", ints(21)),
        ("suppkey", ints(22)),
        (
            "linenumber",
            Arc::new(Int32Array::from_iter_values(
                (0..rows as i32).map(|i| i % 7),
            )),
        ),
        ("quantity", decimals(23)),
        ("extendedprice", decimals(24)),
        ("discount", decimals(25)),
        ("tax", decimals(26)),
        ("returnflag", words(27, 1)),
        ("linestatus", words(28, 1)),
        ("shipdate", dates(29)),
        ("commitdate", dates(30)),
        ("receiptdate", dates(31)),
        ("shipinstruct", words(32, 17)),
        ("shipmode", words(33, 7)),
        ("comment", words(34, 27)),
    ];
    let batch = RecordBatch::try_from_iter(columns).expect("lineitem-shaped batch");
    let order = random_permutation(rows, 35);
    let bytes = rows * 184;
    let src = vec![7u8; bytes];
    let mut dst = vec![1u8; bytes];
    let copy = median_secs(reps, || (), |_| dst.copy_from_slice(&src));
    drop((src, dst));
    let by_rows = median_secs(
        reps,
        || (),
        |_| gather_batch_with(&batch, &order, true).expect("shuffle"),
    );
    let by_columns = median_secs(
        reps,
        || (),
        |_| gather_batch_with(&batch, &order, false).expect("shuffle"),
    );
    let idx = arrow::array::UInt32Array::from(order.clone());
    let take = median_secs(
        reps,
        || (),
        |_| arrow::compute::take_record_batch(&batch, &idx).expect("take"),
    );
    let group = format!("shuffle {rows} rows x 16 columns");
    row(
        &group,
        "copy of the same 184 bytes/row (warm)",
        copy,
        rows,
        by_rows,
    );
    row(
        &group,
        "insitu gather_batch through rows",
        by_rows,
        rows,
        by_rows,
    );
    row(
        &group,
        "insitu gather_batch column by column",
        by_columns,
        rows,
        by_rows,
    );
    row(&group, "arrow take_record_batch", take, rows, by_rows);
    println!(
        "\nshuffle through rows moves {:.2} GB/s of fixed-width parts (read + write) vs copy {:.2} GB/s",
        2.0 * bytes as f64 / by_rows / 1e9,
        2.0 * bytes as f64 / copy / 1e9
    );
}

/// A seeded random permutation of `0..n`.
fn random_permutation(n: usize, seed: u64) -> Vec<u32> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    order
}

const BATCH_ROWS: usize = 1 << 16;

/// Runs `f` over `indices` in batches, as a device does.
fn in_batches<R>(indices: &[u32], mut f: impl FnMut(&[u32]) -> R) -> usize {
    indices
        .chunks(BATCH_ROWS)
        .map(|c| {
            let _ = f(c);
            c.len()
        })
        .sum()
}

/// numpy argsort and Polars arg_sort on the same keys (same seed, regenerated
/// in Python as the same bytes through a file).
fn python_argsorts(py: &str, n: usize, reps: usize, threads: usize) -> Vec<(String, f64)> {
    let path = std::env::temp_dir().join(format!("insitu-sortbench-{}.u64", std::process::id()));
    let keys = random_u64(n, 1);
    let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    std::fs::write(&path, bytes).expect("write keys for python");
    drop(keys);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../argsort_py.py");
    let out = Command::new(py)
        .arg(script)
        .arg(&path)
        .arg(reps.to_string())
        .env("POLARS_MAX_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .expect("run python argsort benchmark");
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        eprintln!(
            "python argsort failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return vec![];
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, secs) = l.split_once('\t')?;
            Some((name.to_string(), secs.parse().ok()?))
        })
        .collect()
}

/// Dictionary decode of 4- and 8-byte values and of strings, next to the
/// copy bandwidth `copy` (seconds for `n` 8-byte values).
fn decode_section(n: usize, reps: usize, copy: f64) {
    // Dictionary decode: 64Ki-entry dictionaries, random codes, decoded
    // 64Ki rows at a time.
    let codes = Int32Array::from(
        random_indices(n, 1 << 16, 3)
            .into_iter()
            .map(|c| c as i32)
            .collect::<Vec<_>>(),
    );
    let decode_with =
        |dict: &DictionaryArray<arrow::datatypes::Int32Type>,
         kernel: &mut dyn FnMut(&dyn arrow::array::Array) -> arrow::array::ArrayRef| {
            median_secs(
                reps,
                || (),
                |_| {
                    (0..n)
                        .step_by(BATCH_ROWS)
                        .map(|at| kernel(&dict.slice(at, BATCH_ROWS.min(n - at))).len())
                        .sum::<usize>()
                },
            )
        };
    let decode = |dict: &DictionaryArray<arrow::datatypes::Int32Type>| {
        decode_with(dict, &mut |a| dictionary_decode(a).unwrap())
    };
    let to_views = |dict: &DictionaryArray<arrow::datatypes::Int32Type>| {
        decode_with(dict, &mut |a| dictionary_decode_to_views(a).unwrap())
    };
    // One decoder for all batches of a dictionary, as a scan of one
    // column chunk uses it: the slot and view tables are built once.
    let decode_reusing = |dict: &DictionaryArray<arrow::datatypes::Int32Type>| {
        let mut decoder = DictionaryDecoder::new();
        decode_with(dict, &mut |a| decoder.decode(a).unwrap())
    };
    let to_views_reusing = |dict: &DictionaryArray<arrow::datatypes::Int32Type>| {
        let mut decoder = DictionaryDecoder::new();
        decode_with(dict, &mut |a| decoder.decode_to_views(a).unwrap())
    };
    let dict8 = DictionaryArray::new(
        codes.clone(),
        Arc::new(UInt64Array::from(random_u64(1 << 16, 4))),
    );
    let d8 = decode(&dict8);
    row(
        "dictionary decode",
        "8-byte values, 64Ki entries",
        d8,
        n,
        copy,
    );
    let dict4 = DictionaryArray::new(
        codes.clone(),
        Arc::new(Int32Array::from((0..1 << 16).collect::<Vec<i32>>())),
    );
    let d4 = decode(&dict4);
    row(
        "dictionary decode",
        "4-byte values, 64Ki entries",
        d4,
        n,
        copy,
    );
    // The same with 256-entry dictionaries (l_shipmode has 7 values): the
    // dictionary stays in L1, so this is the kernel's own speed; the 64Ki
    // rows above mostly wait on L2 and L3.
    let small_codes = Int32Array::from_iter_values(codes.values().iter().map(|c| c & 0xff));
    let small8 = DictionaryArray::new(
        small_codes.clone(),
        Arc::new(UInt64Array::from(random_u64(256, 5))),
    );
    let s8 = decode(&small8);
    row(
        "dictionary decode",
        "8-byte values, 256 entries",
        s8,
        n,
        copy,
    );
    let small4 = DictionaryArray::new(
        small_codes.clone(),
        Arc::new(Int32Array::from_iter_values(0..256)),
    );
    let s4 = decode(&small4);
    row(
        "dictionary decode",
        "4-byte values, 256 entries",
        s4,
        n,
        copy,
    );
    let words: Vec<String> = (0..1 << 16)
        .map(|i| format!("{:0width$}", i, width = 1 + i % 32))
        .collect();
    let dict_s = DictionaryArray::new(codes.clone(), Arc::new(StringArray::from(words)));
    let avg_len: f64 = (0..1 << 16).map(|i| (1 + i % 32) as f64).sum::<f64>() / 65536.0;
    let ds = decode(&dict_s);
    row(
        "dictionary decode",
        &format!("strings 1-32 bytes (avg {avg_len:.1})"),
        ds,
        n,
        copy,
    );
    // The same strings from a 256-entry dictionary (TPC-H's dictionary
    // columns have 3 to 25 values): the dictionary stays in L1.
    let small_words = Arc::new(StringArray::from_iter_values(
        (0..256).map(|i| format!("{:0width$}", i, width = 1 + i % 32)),
    ));
    let small_dict_s = DictionaryArray::new(small_codes, small_words);
    let ss = decode(&small_dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes (avg 16.5), 256 entries",
        ss,
        n,
        copy,
    );
    // Into views on the dictionary's bytes: the (offset, length) index is
    // the view, so each row is a 16-byte gather and no string is copied.
    let vs = to_views(&dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes to views, 64Ki entries",
        vs,
        n,
        copy,
    );
    let vss = to_views(&small_dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes to views, 256 entries",
        vss,
        n,
        copy,
    );
    let dsr = decode_reusing(&dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes, 64Ki entries, one decoder for all batches",
        dsr,
        n,
        copy,
    );
    let ssr = decode_reusing(&small_dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes, 256 entries, one decoder for all batches",
        ssr,
        n,
        copy,
    );
    let vsr = to_views_reusing(&dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes to views, 64Ki entries, one decoder for all batches",
        vsr,
        n,
        copy,
    );
    let vssr = to_views_reusing(&small_dict_s);
    row(
        "dictionary decode",
        "strings 1-32 bytes to views, 256 entries, one decoder for all batches",
        vssr,
        n,
        copy,
    );
    let cast_views = decode_with(&dict_s, &mut |a| {
        arrow::compute::cast(a, &arrow::datatypes::DataType::Utf8View).unwrap()
    });
    row(
        "dictionary decode",
        "arrow cast strings to views (64Ki entries)",
        cast_views,
        n,
        copy,
    );
    let cast = median_secs(
        reps,
        || (),
        |_| {
            (0..n)
                .step_by(BATCH_ROWS)
                .map(|at| {
                    arrow::compute::cast(
                        &dict_s.slice(at, BATCH_ROWS.min(n - at)),
                        &arrow::datatypes::DataType::Utf8,
                    )
                    .unwrap()
                    .len()
                })
                .sum::<usize>()
        },
    );
    row(
        "dictionary decode",
        "arrow cast strings (same input)",
        cast,
        n,
        copy,
    );
    // Per row: 4-byte code read, value bytes written, 4-byte offset written.
    let string_bytes = n as f64 * (avg_len + 8.0);
    let copy_bytes_per_s = n as f64 * 16.0 / copy; // read + write
    for (entries, secs) in [
        ("64Ki entries", ds),
        ("256 entries", ss),
        ("64Ki entries, one decoder", dsr),
        ("256 entries, one decoder", ssr),
    ] {
        println!(
            "\nstring decode, {entries}: {:.2} GB/s (codes read + bytes written) vs copy {:.2} GB/s (read + write) = {:.0}% of copy bandwidth",
            string_bytes / secs / 1e9,
            copy_bytes_per_s / 1e9,
            100.0 * (string_bytes / secs) / copy_bytes_per_s
        );
    }
    // Per row: 4-byte code read, 16-byte view written.
    let view_bytes = n as f64 * 20.0;
    for (entries, secs) in [
        ("64Ki entries", vs),
        ("256 entries", vss),
        ("64Ki entries, one decoder", vsr),
        ("256 entries, one decoder", vssr),
    ] {
        println!(
            "\nstring decode to views, {entries}: {:.2} G rows/s, {:.2} GB/s (codes read + views written) = {:.0}% of copy bandwidth",
            n as f64 / secs / 1e9,
            view_bytes / secs / 1e9,
            100.0 * (view_bytes / secs) / copy_bytes_per_s
        );
    }
    println!(
        "fixed-width decode per core: 4-byte {:.2} G values/s, 8-byte {:.2} G values/s (64Ki entries); 4-byte {:.2}, 8-byte {:.2} (256 entries) (single-threaded kernels)",
        n as f64 / d4 / 1e9,
        n as f64 / d8 / 1e9,
        n as f64 / s4 / 1e9,
        n as f64 / s8 / 1e9
    );
    let measured = [(256, s4, s8), (1 << 16, d4, d8)];
    fixed_width_decode_by_dictionary_size(&codes, &decode, &measured);
}

/// Fixed-width decode rates against the dictionary's size, from 256 to
/// 64Ki entries (the codes masked to fewer bits: still uniform), each
/// timed by `decode`, beside the rates `measured` already (entries,
/// 4-byte s, 8-byte s): where the
/// dictionary outgrows L1, every row's load misses it, and the rate
/// becomes the rate L1 is refilled at, whatever loads the values.
fn fixed_width_decode_by_dictionary_size(
    codes: &Int32Array,
    decode: &dyn Fn(&DictionaryArray<arrow::datatypes::Int32Type>) -> f64,
    measured: &[(usize, f64, f64)],
) {
    let n = codes.len();
    println!("\nfixed-width decode by dictionary size (one core, 64Ki-row batches)\n");
    println!(
        "| entries | 4-byte table KiB | 4-byte G values/s | 8-byte table KiB | 8-byte G values/s |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for entries in [256usize, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10] {
        let (s4, s8) = match measured.iter().find(|m| m.0 == entries) {
            Some(&(_, s4, s8)) => (s4, s8),
            None => {
                let mask = entries as i32 - 1;
                let masked = Int32Array::from_iter_values(codes.values().iter().map(|c| c & mask));
                let values4 = Arc::new(Int32Array::from_iter_values(0..entries as i32));
                let values8 = Arc::new(UInt64Array::from(random_u64(entries, 6)));
                (
                    decode(&DictionaryArray::new(masked.clone(), values4)),
                    decode(&DictionaryArray::new(masked, values8)),
                )
            }
        };
        println!(
            "| {entries} | {} | {:.2} | {} | {:.2} |",
            entries * 4 / 1024,
            n as f64 / s4 / 1e9,
            entries * 8 / 1024,
            n as f64 / s8 / 1e9
        );
        eprintln!(
            "{}",
            serde_json::json!({"group": "dictionary decode by size", "entries": entries,
                "median_s_4": s4, "median_s_8": s8, "items": n})
        );
    }
}

/// Seconds (median) to copy `src` into a warm buffer, printed as the
/// STREAM-like copy row the other rows compare with.
fn copy_bandwidth(src: &[u64], reps: usize) -> f64 {
    let mut dst = vec![1u64; src.len()];
    let copy = median_secs(reps, || (), |_| dst.copy_from_slice(src));
    row(
        "bandwidth",
        "copy 8-byte values (STREAM copy, warm)",
        copy,
        src.len(),
        copy,
    );
    copy
}
