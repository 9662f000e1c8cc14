//! Calibration: measures how fast this machine reads and computes, for
//! the cost model's profiles ([`insitu_wire::DeviceProfile`],
//! [`insitu_wire::HostProfile`]).
//!
//! ```text
//!  Device::open ──▶ <dir>/profile.json? ──valid──▶ use it
//!                          │ missing              │ corrupt: error naming the
//!                          ▼                      ▼ file (`insitu calibrate`
//!            measure (once per process for         measures it again)
//!            compute; storage per device)
//!                          ▼
//!            write it: temp file, fsync, rename
//! ```
//!
//! Each rate is the best of a few single-thread runs over
//! [`CALIBRATION_ROWS`] rows of TPC-H-like columns (an integer, a
//! decimal-like integer, a 24-byte string), so one calibration takes a
//! fraction of a second. Parquet decode is timed through DataFusion's
//! Parquet source on a file in the temp directory, as stages decode; the
//! stage start (planning and opening a file of a few rows) is a median.
//! Storage is measured by reading the device's own
//! files (the rate its scans will see, page cache included), or a probe
//! file when it holds too little.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::compute::kernels::cmp::lt;
use arrow::compute::{filter_record_batch, sort_to_indices, take};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_ipc::CompressionType;
use bytes::Bytes;
use insitu_wire::{
    ComputeRates, DeviceProfile, HostProfile, DEVICE_PROFILE_FILE, HOST_PROFILE_FILE,
    PROFILE_VERSION,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};

/// What went wrong reading, measuring or writing a profile, and where.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("cannot read profile {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "profile {}: {message}; fix it, or delete it or run `insitu calibrate` to measure it again",
        path.display()
    )]
    Corrupt { path: PathBuf, message: String },
    #[error("cannot write profile {}: {message}", path.display())]
    Write { path: PathBuf, message: String },
    #[error("cannot measure storage under {}: {source}", dir.display())]
    Storage {
        dir: PathBuf,
        source: std::io::Error,
    },
}

pub type CalibrateResult<T> = Result<T, CalibrateError>;

/// Rows each compute measurement runs over.
pub const CALIBRATION_ROWS: usize = 1 << 20;

/// Runs per measurement; the fastest counts (the others warm caches).
const RUNS: usize = 3;

/// Bytes of device files a storage measurement reads at most.
pub const STORAGE_PROBE_BYTES_MAX: u64 = 256 << 20;

/// Bytes below which a device's files are too few to time, and a probe
/// file is written and read instead.
pub const STORAGE_PROBE_BYTES_MIN: u64 = 16 << 20;

/// The compute rates of this machine, measured once per process.
pub fn compute_rates() -> ComputeRates {
    static RATES: OnceLock<ComputeRates> = OnceLock::new();
    RATES
        .get_or_init(|| {
            // Own thread: callers may be inside an async runtime.
            std::thread::spawn(measure_compute_rates)
                .join()
                .expect("calibration thread")
        })
        .clone()
}

fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A freshly measured profile of the device in `dir` running `threads`.
pub fn measure_device_profile(dir: &Path, threads: u32) -> std::io::Result<DeviceProfile> {
    Ok(DeviceProfile {
        version: PROFILE_VERSION,
        storage_read_bytes_per_sec: storage_read_bytes_per_sec(dir)?,
        threads: threads.max(1),
        rates: compute_rates(),
        source: format!("measured at unix time {}", now_unix_secs()),
    })
}

/// A freshly measured profile of this host computing with `threads`.
pub fn measure_host_profile(threads: u32) -> HostProfile {
    HostProfile {
        version: PROFILE_VERSION,
        threads: threads.max(1),
        rates: compute_rates(),
        source: format!("measured at unix time {}", now_unix_secs()),
        stage_starts: Default::default(),
    }
}

/// Where the profile of the device in `dir` lives.
pub fn device_profile_path(dir: &Path) -> PathBuf {
    dir.join(DEVICE_PROFILE_FILE)
}

/// Where the host's profile of the root `root` lives.
pub fn host_profile_path(root: &Path) -> PathBuf {
    root.join(HOST_PROFILE_FILE)
}

/// The profile of the device in `dir`: read from its file, or measured
/// and written there when there is none (or one of another format
/// version). A file that cannot be parsed is an error naming it, never
/// replaced silently: it may hold a user's edits.
pub fn device_profile(dir: &Path, threads: u32) -> CalibrateResult<DeviceProfile> {
    let path = device_profile_path(dir);
    if let Some(profile) = read_profile(&path, DeviceProfile::from_json)? {
        return Ok(profile);
    }
    let profile =
        measure_device_profile(dir, threads).map_err(|source| CalibrateError::Storage {
            dir: dir.to_path_buf(),
            source,
        })?;
    save(&path, &profile.to_json())?;
    Ok(profile)
}

/// The host profile kept in `root`, measured and written when missing.
pub fn host_profile(root: &Path, threads: u32) -> CalibrateResult<HostProfile> {
    let path = host_profile_path(root);
    if let Some(profile) = read_profile(&path, HostProfile::from_json)? {
        return Ok(profile);
    }
    let profile = measure_host_profile(threads);
    save(&path, &profile.to_json())?;
    Ok(profile)
}

/// The profile in `path`; `None` if there is none or it is of another
/// format version (to be measured again).
fn read_profile<T>(
    path: &Path,
    parse: fn(&str) -> insitu_wire::WireResult<T>,
) -> CalibrateResult<Option<T>> {
    match std::fs::read_to_string(path) {
        Ok(text) if of_another_version(&text) => Ok(None),
        Ok(text) => parse(&text).map(Some).map_err(|e| CalibrateError::Corrupt {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CalibrateError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn of_another_version(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("version")?.as_u64())
        .is_some_and(|v| v != u64::from(PROFILE_VERSION))
}

/// Writes a profile file atomically.
pub fn save(path: &Path, text: &str) -> CalibrateResult<()> {
    insitu_format::write_atomically(path, text.as_bytes()).map_err(|e| CalibrateError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Bytes per second of reading the files under `dir` (at most
/// [`STORAGE_PROBE_BYTES_MAX`]), or of a probe file written there.
pub fn storage_read_bytes_per_sec(dir: &Path) -> std::io::Result<f64> {
    let mut files = vec![];
    collect_files(dir, &mut files);
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    if total >= STORAGE_PROBE_BYTES_MIN {
        return time_reads(&files);
    }
    let probe = dir.join(format!(".storage-probe-{}", std::process::id()));
    let result = (|| {
        let block = vec![0x5Au8; 1 << 20];
        let mut f = std::fs::File::create(&probe)?;
        for _ in 0..(STORAGE_PROBE_BYTES_MIN >> 20) {
            std::io::Write::write_all(&mut f, &block)?;
        }
        f.sync_all()?;
        time_reads(&[(probe.clone(), STORAGE_PROBE_BYTES_MIN)])
    })();
    let _ = std::fs::remove_file(&probe);
    result
}

fn collect_files(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let path = entry.path();
        if meta.is_dir() {
            collect_files(&path, out);
        } else if meta.is_file() && !entry.file_name().to_string_lossy().starts_with('.') {
            out.push((path, meta.len()));
        }
    }
}

fn time_reads(files: &[(PathBuf, u64)]) -> std::io::Result<f64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut read = 0u64;
    let started = Instant::now();
    for (path, _) in files {
        let mut f = std::fs::File::open(path)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 || read >= STORAGE_PROBE_BYTES_MAX {
                break;
            }
            read += n as u64;
        }
        if read >= STORAGE_PROBE_BYTES_MAX {
            break;
        }
    }
    Ok(read as f64 / started.elapsed().as_secs_f64().max(1e-6))
}

/// Seconds of the fastest of [`RUNS`] runs of `f`.
fn best_secs(f: impl FnMut()) -> f64 {
    timed_runs(RUNS, f)
        .into_iter()
        .fold(f64::INFINITY, f64::min)
}

/// Seconds of each of `runs` calls of `f` (at least a nanosecond each).
fn timed_runs(runs: usize, mut f: impl FnMut()) -> Vec<f64> {
    (0..runs.max(1))
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64().max(1e-9)
        })
        .collect()
}

/// Runs timed for the stage start, which varies more than a rate.
const STAGE_START_RUNS: usize = 9;

fn median_secs(runs: usize, f: impl FnMut()) -> f64 {
    let mut secs = timed_runs(runs, f);
    secs.sort_by(f64::total_cmp);
    secs[secs.len() / 2]
}

/// Calibration data, columns of the kinds TPC-H stores: a key of 4
/// values and a key of `rows / 8` values (dictionary-encoded and
/// many-group fixed width), an amount of many values (plain), a
/// 3-value flag and a 30-byte comment (dictionary and plain strings).
fn sample_batch(rows: usize) -> RecordBatch {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let many = (rows / 8).max(1) as u64;
    let keys: Int64Array = (0..rows).map(|_| (next() % 4) as i64).collect();
    let groups: Int64Array = (0..rows).map(|_| (next() % many) as i64).collect();
    let amounts: Int64Array = (0..rows).map(|_| (next() % 10_000_000) as i64).collect();
    let flags: StringArray = (0..rows)
        .map(|_| Some(["A", "N", "R"][(next() % 3) as usize]))
        .collect();
    let words = [
        "furiously",
        "quickly",
        "slyly",
        "carefully",
        "blithely",
        "even",
    ];
    let text: StringArray = (0..rows)
        .map(|_| {
            let a = words[(next() % 6) as usize];
            let b = words[(next() % 6) as usize];
            Some(format!("{a} {b} {:08}", next() % 100_000_000))
        })
        .collect();
    let schema = Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("g", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new("f", DataType::Utf8, false),
        Field::new("s", DataType::Utf8, false),
    ]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(keys),
        Arc::new(groups),
        Arc::new(amounts),
        Arc::new(flags),
        Arc::new(text),
    ];
    RecordBatch::try_new(Arc::new(schema), columns).expect("calibration batch")
}

/// Column indexes of [`sample_batch`].
const KEY: usize = 0;
const AMOUNT: usize = 2;
const FLAG: usize = 3;
const COMMENT: usize = 4;

/// Per-value and per-byte rates from two columns of a kind, one with
/// few stored bytes per value and one with many: `secs = rows / values
/// + bytes / bytes_rate` through both points.
fn fit(rows: f64, small: (f64, f64), large: (f64, f64)) -> (f64, f64) {
    let ((b1, t1), (b2, t2)) = (small, large);
    let per_byte = if b2 > b1 && t2 > t1 {
        (t2 - t1) / (b2 - b1)
    } else {
        0.0
    };
    let per_value = ((t1 - per_byte * b1) / rows).max(t1 * 0.1 / rows);
    let bytes_rate = if per_byte > 0.0 {
        1.0 / per_byte
    } else {
        f64::MAX
    };
    (1.0 / per_value, bytes_rate)
}

fn measure_compute_rates() -> ComputeRates {
    let batch = sample_batch(CALIBRATION_ROWS);
    let rows = batch.num_rows() as f64;
    let (parquet, stored) = parquet_bytes(&batch);
    let through_datafusion = DataFusionScan::new(&parquet, "rates");
    let decode = |column: usize| {
        let secs = match &through_datafusion {
            // What a stage's scan costs: DataFusion's Parquet source, its
            // batches and schema adaptation, not only the decoder's loop
            // (which measured 30-45% faster and left the model short on
            // TPC-H's large scans).
            Some(scan) => best_secs(|| scan.columns(Some(batch.schema().field(column).name()))),
            None => best_secs(|| {
                let builder = ParquetRecordBatchReaderBuilder::try_new(parquet.clone())
                    .expect("calibration parquet");
                let mask = ProjectionMask::roots(builder.parquet_schema(), [column]);
                for b in builder.with_projection(mask).build().expect("reader") {
                    std::hint::black_box(b.expect("decode"));
                }
            }),
        };
        (stored[column] as f64, secs)
    };
    let fixed = fit(rows, decode(KEY), decode(AMOUNT));
    let strings = fit(rows, decode(FLAG), decode(COMMENT));
    let amounts = batch.column(AMOUNT).clone();
    let bound = Int64Array::new_scalar(5_000_000);
    let filter = best_secs(|| {
        let mask = lt(&amounts, &bound).expect("compare");
        std::hint::black_box(filter_record_batch(&batch, &mask).expect("filter"));
    });
    let few_groups = aggregate_secs(&batch, "k");
    let many_groups = aggregate_secs(&batch, "g");
    let sort = best_secs(|| {
        let order = sort_to_indices(&amounts, None, None).expect("sort");
        std::hint::black_box(take(&amounts, &order, None).expect("take"));
    });
    let arrow_bytes = batch.get_array_memory_size() as f64;
    let plain = ipc_bytes(&batch, None);
    let encode = best_secs(|| {
        std::hint::black_box(ipc_bytes(&batch, None));
    });
    let compress = best_secs(|| {
        std::hint::black_box(ipc_bytes(&batch, Some(CompressionType::LZ4_FRAME)));
    });
    let compress_zstd = best_secs(|| {
        std::hint::black_box(ipc_bytes(&batch, Some(CompressionType::ZSTD)));
    });
    let decode_ipc = best_secs(|| {
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&plain), None)
            .expect("ipc");
        for b in reader {
            std::hint::black_box(b.expect("ipc decode"));
        }
    });
    ComputeRates {
        decode_fixed_values_per_sec: fixed.0,
        decode_fixed_bytes_per_sec: fixed.1,
        decode_string_values_per_sec: strings.0,
        decode_string_bytes_per_sec: strings.1,
        filter_rows_per_sec: rows / filter,
        // Two aggregate functions (a sum and a count) per row.
        aggregate_rows_per_sec: 2.0 * rows / few_groups,
        aggregate_many_groups_rows_per_sec: 2.0 * rows / many_groups,
        sort_rows_per_sec: rows / sort,
        ipc_encode_bytes_per_sec: arrow_bytes / encode,
        ipc_decode_bytes_per_sec: plain.len() as f64 / decode_ipc,
        // What compressing adds to encoding.
        lz4_compress_bytes_per_sec: arrow_bytes / (compress - encode).max(encode * 0.1),
        zstd_compress_bytes_per_sec: arrow_bytes / (compress_zstd - encode).max(encode * 0.1),
        stages_started_per_sec: 1.0 / stage_start_secs(),
    }
}

/// Seconds from a plan to the rows of a Parquet file of a few rows on
/// this machine's storage: DataFusion plans the scan, opens the file,
/// reads its footer and decodes it. What a stage costs however few rows
/// it reads.
fn stage_start_secs() -> f64 {
    let (parquet, _) = parquet_bytes(&sample_batch(16));
    // The median, not the best: a start is allocations, system calls and
    // thread hops, and a typical one is what every stage pays. Without a
    // writable temp directory, a stage start of a millisecond.
    DataFusionScan::new(&parquet, "start").map_or(1e-3, |scan| {
        median_secs(STAGE_START_RUNS, || scan.columns(None))
    })
}

/// The calibration file on this machine's storage, scanned by DataFusion
/// on one thread as a device's stage scans its partitions.
struct DataFusionScan {
    dir: PathBuf,
    path: String,
    ctx: datafusion::prelude::SessionContext,
    runtime: tokio::runtime::Runtime,
}

impl DataFusionScan {
    /// `parquet` written as a temp file named after `name`; `None` when
    /// it cannot be written.
    fn new(parquet: &Bytes, name: &str) -> Option<Self> {
        use datafusion::prelude::{SessionConfig, SessionContext};
        let dir =
            std::env::temp_dir().join(format!("insitu-calibrate-{name}-{}", std::process::id()));
        let file = dir.join(format!("{name}.parquet"));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(&file, parquet).ok()?;
        let runtime = tokio::runtime::Builder::new_current_thread().build().ok()?;
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        Some(Self {
            path: file.to_string_lossy().into_owned(),
            dir,
            ctx,
            runtime,
        })
    }

    /// Plans a scan of the whole file and decodes `column` (every column
    /// when `None`).
    fn columns(&self, column: Option<&str>) {
        use datafusion::prelude::ParquetReadOptions;
        self.runtime.block_on(async {
            let mut df = self
                .ctx
                .read_parquet(&self.path, ParquetReadOptions::default())
                .await
                .expect("calibration scan");
            if let Some(name) = column {
                df = df.select_columns(&[name]).expect("calibration column");
            }
            let mut stream = df.execute_stream().await.expect("calibration stream");
            while let Some(batch) = futures::StreamExt::next(&mut stream).await {
                std::hint::black_box(batch.expect("calibration decode"));
            }
        })
    }
}

impl Drop for DataFusionScan {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Seconds of DataFusion's hash aggregate summing the amounts by `key`,
/// on one thread.
fn aggregate_secs(batch: &RecordBatch, key: &str) -> f64 {
    use datafusion::prelude::{SessionConfig, SessionContext};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("calibration runtime");
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
    ctx.register_batch("t", batch.clone())
        .expect("calibration table");
    let sql = format!("select {key}, sum(v), count(*) from t group by {key}");
    best_secs(|| {
        runtime.block_on(async {
            let df = ctx.sql(&sql).await.expect("calibration query");
            std::hint::black_box(df.collect().await.expect("calibration aggregate"));
        })
    })
}

/// The batch as a Parquet file, and each column's stored bytes.
fn parquet_bytes(batch: &RecordBatch) -> (Bytes, Vec<u64>) {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut out = vec![];
    let mut writer =
        ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).expect("calibration writer");
    writer.write(batch).expect("calibration write");
    let meta = writer.close().expect("calibration close");
    let mut stored = vec![0u64; batch.num_columns()];
    for rg in meta.row_groups() {
        for (i, c) in rg.columns().iter().enumerate() {
            stored[i] += c.compressed_size().max(0) as u64;
        }
    }
    (Bytes::from(out), stored)
}

fn ipc_bytes(batch: &RecordBatch, codec: Option<CompressionType>) -> Vec<u8> {
    insitu_format::compressibility::ipc_stream(batch, codec).expect("ipc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_rates_are_valid_and_plausible() {
        let rates = compute_rates();
        rates.validate().unwrap();
        // Any machine that runs insitu decodes more than 1 M values a second.
        assert!(rates.decode_fixed_values_per_sec > 1e6, "{rates:?}");
        assert!(rates.decode_string_values_per_sec > 1e5, "{rates:?}");
        // Starting a scan of a tiny file takes between 10 µs and 100 ms.
        assert!(rates.stages_started_per_sec > 10.0, "{rates:?}");
        assert!(rates.stages_started_per_sec < 1e5, "{rates:?}");
        eprintln!("{rates:?}");
    }

    #[test]
    fn a_missing_profile_is_measured_and_kept_and_a_corrupt_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let first = device_profile(dir.path(), 2).unwrap();
        assert_eq!(first.threads, 2);
        assert!(first.storage_read_bytes_per_sec > 0.0);
        // Read back, not measured again.
        let again = device_profile(dir.path(), 2).unwrap();
        assert_eq!(first, again);
        let path = device_profile_path(dir.path());
        std::fs::write(&path, "{ not json").unwrap();
        let err = device_profile(dir.path(), 2).unwrap_err();
        assert!(matches!(&err, CalibrateError::Corrupt { path: p, .. } if *p == path));
        let err = err.to_string();
        assert!(err.contains("profile.json"), "{err}");
        assert!(err.contains("insitu calibrate"), "{err}");
        // The user's file is left as it was.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
        // A valid file with a rate out of range is named with the rate.
        let mut bad = first.clone();
        bad.rates.filter_rows_per_sec = 0.0;
        std::fs::write(&path, bad.to_json()).unwrap();
        let err = device_profile(dir.path(), 2).unwrap_err().to_string();
        assert!(err.contains("filter_rows_per_sec"), "{err}");
        // A file of another format version is measured again.
        std::fs::write(&path, "{\"version\": 0}").unwrap();
        let measured = device_profile(dir.path(), 2).unwrap();
        assert_eq!(measured.version, PROFILE_VERSION);
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(DeviceProfile::from_json(&kept).unwrap(), measured);
    }
}
