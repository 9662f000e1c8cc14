//! Shared helpers of the integration tests: TPC-H roots built once per
//! process, and comparison of results with DuckDB's fixtures.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::Array;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use arrow::util::display::ArrayFormatter;
use insitu_device::embedded_clients;
use insitu_device::root::{create_root, DeviceBudget};
use insitu_device::Device;
use insitu_host::{HostConfig, InsituHost, Pushdown};
use insitu_ingest::{gen_tpch, TpchOptions};
use insitu_link::LinkProfile;

/// The repository root. Cargo sets `CARGO_MANIFEST_DIR` when it runs a test
/// binary; reading it at run time keeps a test binary reused from a build
/// cache shared between checkouts pointing at this checkout's fixtures.
pub fn repo_dir() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.join("../..")
}

pub fn query_sql(n: usize) -> String {
    std::fs::read_to_string(repo_dir().join(format!("queries/tpch/q{n}.sql"))).expect("query file")
}

/// A TPC-H root at `sf` on `devices` devices, generated once per process.
pub fn tpch_root(sf: f64, devices: u32) -> PathBuf {
    static ROOTS: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{sf}-{devices}");
    let mut roots = ROOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    roots
        .entry(key.clone())
        .or_insert_with(|| {
            let dir = tpch_roots_dir().join(format!("{key}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("tpch root dir");
            let devs = create_root(&dir, devices, &DeviceBudget::default()).expect("root");
            let options = TpchOptions {
                scale_factor: sf,
                ..Default::default()
            };
            let sinks = insitu_device::embedded(devs, insitu_link::LinkProfile::UNLIMITED);
            gen_tpch(&sinks, &[], &options, &|_| {}).expect("gen tpch");
            dir
        })
        .clone()
}

/// Where the TPC-H roots live: a test process has no hook at its end to
/// remove its own, so each process first removes those of processes that
/// are gone, and at most one set per live test process stays.
fn tpch_roots_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join("insitu-test-tpch-roots");
        std::fs::create_dir_all(&dir).expect("tpch roots dir");
        for entry in std::fs::read_dir(&dir).expect("tpch roots dir").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            // This process has made none yet: one with its id is stale.
            let alive = pid.is_some_and(|p| {
                p != std::process::id() && Path::new(&format!("/proc/{p}")).exists()
            });
            if !alive {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        dir
    })
    .clone()
}

pub fn open_devices(root: &Path, budget: &DeviceBudget) -> Vec<Arc<Device>> {
    insitu_device::root::open_root(root, budget).expect("open root")
}

pub async fn host(root: &Path, pushdown: Pushdown) -> InsituHost {
    host_with_budget(root, pushdown, &DeviceBudget::default()).await
}

/// A host over the devices under `root` behind a link of `profile`.
pub async fn host_over(root: &Path, pushdown: Pushdown, profile: LinkProfile) -> InsituHost {
    host_of(root, pushdown, &DeviceBudget::default(), profile).await
}

/// A host over the devices under `root`, each opened with `budget`.
pub async fn host_with_budget(
    root: &Path,
    pushdown: Pushdown,
    budget: &DeviceBudget,
) -> InsituHost {
    host_of(root, pushdown, budget, LinkProfile::UNLIMITED).await
}

async fn host_of(
    root: &Path,
    pushdown: Pushdown,
    budget: &DeviceBudget,
    link: LinkProfile,
) -> InsituHost {
    let devices = open_devices(root, budget);
    InsituHost::new(
        embedded_clients(devices, link),
        HostConfig {
            pushdown,
            target_partitions: 2,
            ..Default::default()
        },
    )
    .await
    .expect("host")
}

#[derive(serde::Deserialize)]
pub struct Fixture {
    pub columns: Vec<String>,
    pub kinds: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
}

pub fn fixture(dir: &str, n: usize) -> Fixture {
    let path = repo_dir().join(format!("tests/fixtures/{dir}/q{n}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture json")
}

/// TPC-H queries whose ORDER BY makes the row order total.
pub const TOTAL_ORDER: [usize; 17] = [1, 2, 4, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 19, 20, 21, 22];

/// One result cell: None for NULL, else its text and whether it is a float.
type Cell = Option<(String, bool)>;

fn cells(batches: &[RecordBatch]) -> Vec<Vec<Cell>> {
    let mut rows = vec![];
    for b in batches {
        let fmts: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &Default::default()).expect("formatter"))
            .collect();
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .zip(&fmts)
                    .map(|(c, f)| {
                        (!c.is_null(r)).then(|| {
                            let is_float = matches!(
                                c.data_type(),
                                DataType::Float16 | DataType::Float32 | DataType::Float64
                            );
                            (f.value(r).to_string(), is_float)
                        })
                    })
                    .collect(),
            );
        }
    }
    rows
}

/// Normalizes a decimal or integer literal: no trailing fraction zeros.
fn normalize_exact(s: &str) -> String {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let body = if frac.is_empty() {
        int.to_string()
    } else {
        format!("{int}.{frac}")
    };
    if neg && body != "0" {
        format!("-{body}")
    } else {
        body
    }
}

fn ulp(decimal_text: &str) -> f64 {
    let scale = decimal_text.split_once('.').map_or(0, |(_, f)| f.len());
    10f64.powi(-(scale as i32)) * (1.0 + 1e-9)
}

fn close(a: f64, b: f64) -> bool {
    let scale = a.abs().max(b.abs());
    (a - b).abs() <= 1e-6 * scale || (a - b).abs() < 1e-9
}

fn cell_matches(ours: &Cell, expected: &serde_json::Value, kind: &str) -> bool {
    match (ours, expected) {
        (None, serde_json::Value::Null) => true,
        (None, _) | (Some(_), serde_json::Value::Null) => false,
        (Some((text, is_float)), exp) => match kind {
            "float" => match (text.parse::<f64>(), exp.as_f64()) {
                // A decimal result is as exact as its scale: allow one unit in
                // its last place (DataFusion's AVG of DECIMAL(15,2) has scale 6
                // and truncates).
                (Ok(a), Some(b)) if !is_float => close(a, b) || (a - b).abs() <= ulp(text),
                (Ok(a), Some(b)) => close(a, b),
                _ => false,
            },
            "exact" => {
                let exp = exp
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| exp.to_string());
                if normalize_exact(text) == normalize_exact(&exp) {
                    return true;
                }
                *is_float
                    && matches!((text.parse::<f64>(), exp.parse::<f64>()), (Ok(a), Ok(b)) if close(a, b))
            }
            _ => exp.as_str() == Some(text.as_str()),
        },
    }
}

fn row_matches(ours: &[Cell], expected: &[serde_json::Value], kinds: &[String]) -> bool {
    ours.len() == expected.len()
        && ours
            .iter()
            .zip(expected)
            .zip(kinds)
            .all(|((o, e), k)| cell_matches(o, e, k))
}

fn sort_key(row: &[Cell]) -> String {
    row.iter()
        .map(|c| c.as_ref().map_or("NULL".to_string(), |(t, _)| t.clone()))
        .collect::<Vec<_>>()
        .join("|")
}

fn fixture_key(row: &[serde_json::Value], kinds: &[String]) -> String {
    row.iter()
        .zip(kinds)
        .map(|(v, k)| match v {
            serde_json::Value::Null => "NULL".to_string(),
            serde_json::Value::String(s) if k == "exact" => normalize_exact(s),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Compares a result with a fixture; returns a description of the first
/// difference, if any.
pub fn compare(n: usize, batches: &[RecordBatch], fx: &Fixture) -> Result<(), String> {
    let mut ours = cells(batches);
    let mut expected = fx.rows.clone();
    if ours.len() != expected.len() {
        return Err(format!(
            "Q{n}: {} rows, DuckDB has {}",
            ours.len(),
            expected.len()
        ));
    }
    if !TOTAL_ORDER.contains(&n) {
        // Ties may come in any order: compare as multisets.
        ours.sort_by_key(|r| {
            r.iter()
                .map(|c| {
                    c.as_ref().map_or("NULL".to_string(), |(t, f)| {
                        if *f {
                            t.clone()
                        } else {
                            normalize_exact_or_text(t)
                        }
                    })
                })
                .collect::<Vec<_>>()
                .join("|")
        });
        expected.sort_by_key(|r| fixture_key(r, &fx.kinds));
    }
    for (i, (o, e)) in ours.iter().zip(&expected).enumerate() {
        if !row_matches(o, e, &fx.kinds) {
            return Err(format!(
                "Q{n} row {i}: ours [{}], DuckDB {:?}",
                sort_key(o),
                e
            ));
        }
    }
    Ok(())
}

fn normalize_exact_or_text(t: &str) -> String {
    if t.parse::<f64>().is_ok() {
        normalize_exact(t)
    } else {
        t.to_string()
    }
}

/// Runs all 22 queries against the fixtures in `dir`; returns every failure.
pub async fn check_all(host: &InsituHost, dir: &str) -> Vec<String> {
    let mut failures = vec![];
    for n in 1..=22 {
        let fx = fixture(dir, n);
        match host.sql(&query_sql(n)).await {
            Ok(outcome) => {
                if let Err(e) = compare(n, &outcome.batches, &fx) {
                    failures.push(e);
                }
            }
            Err(e) => failures.push(format!("Q{n}: error: {e}")),
        }
    }
    failures
}

/// Runs the `insitu` binary; returns (success, stdout, stderr).
pub fn insitu(args: &[&str]) -> (bool, String, String) {
    insitu_with_env(args, &[])
}

/// As [`insitu`], with `env` added to the environment.
pub fn insitu_with_env(args: &[&str], env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"));
    command.args(args).envs(env.iter().copied());
    outcome(command)
}

/// As [`insitu`], run in the working directory `cwd`.
pub fn insitu_in(cwd: &Path, args: &[&str]) -> (bool, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"));
    command.args(args).current_dir(cwd);
    outcome(command)
}

/// Runs `command`; returns (success, stdout, stderr).
fn outcome(mut command: std::process::Command) -> (bool, String, String) {
    let out = command.output().expect("run insitu");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Device server processes started with `insitu cluster up`, stopped on drop.
pub struct TestCluster {
    pub root: tempfile::TempDir,
    pub file: PathBuf,
}

impl TestCluster {
    pub fn up(devices: u32, extra: &[&str]) -> Self {
        let root = tempfile::Builder::new()
            .prefix("insitu-cluster-")
            .tempdir()
            .expect("tempdir");
        let root_arg = root.path().to_str().expect("utf-8 path").to_string();
        let n = devices.to_string();
        let mut args = vec!["cluster", "up", "--devices", &n, "--root", &root_arg];
        if !extra.contains(&"--mem") {
            args.extend(["--mem", "1GiB"]);
        }
        if !extra.contains(&"--threads") {
            args.extend(["--threads", "1"]);
        }
        args.extend_from_slice(extra);
        let (ok, out, err) = insitu(&args);
        assert!(ok, "cluster up failed:\n{out}\n{err}");
        let file = root.path().join("cluster.toml");
        Self { root, file }
    }

    pub fn file_arg(&self) -> &str {
        self.file.to_str().expect("utf-8 path")
    }

    /// Loads `files` into `table` over Flight with `insitu load --cluster`.
    pub fn load(&self, table: &str, file: &Path) {
        let file = file.to_str().expect("utf-8 path");
        let (ok, _, err) = insitu(&["load", "--table", table, "--cluster", self.file_arg(), file]);
        assert!(ok, "load {table}: {err}");
    }

    /// Generates TPC-H over Flight with `insitu gen tpch --cluster`.
    pub fn gen_tpch(&self, sf: &str) {
        let args = ["gen", "tpch", "--sf", sf, "--cluster", self.file_arg()];
        let (ok, _, err) = insitu(&args);
        assert!(ok, "gen tpch --sf {sf}: {err}");
    }

    pub fn entries(&self) -> Vec<insitu_flight::DeviceEntry> {
        insitu_flight::ClusterFile::load(&self.file)
            .expect("cluster file")
            .devices
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.root.path().join("cluster.token")).expect("token")
    }

    /// Address (host:port) of device `id`.
    pub fn addr(&self, id: u32) -> String {
        let e = self
            .entries()
            .into_iter()
            .find(|e| e.id == id)
            .expect("device");
        e.endpoint.trim_start_matches("http://").to_string()
    }

    pub fn pid(&self, id: u32) -> u32 {
        let e = self
            .entries()
            .into_iter()
            .find(|e| e.id == id)
            .expect("device");
        e.pid.expect("pid")
    }

    pub async fn clients(&self) -> Vec<Arc<dyn insitu_host::DeviceClient>> {
        insitu_flight::connect_cluster(&self.file, None, Default::default())
            .await
            .expect("connect cluster")
            .into_iter()
            .map(|c| c as Arc<dyn insitu_host::DeviceClient>)
            .collect()
    }

    pub async fn host(&self, pushdown: Pushdown) -> InsituHost {
        InsituHost::new(
            self.clients().await,
            HostConfig {
                pushdown,
                target_partitions: 2,
                ..Default::default()
            },
        )
        .await
        .expect("host over cluster")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = insitu(&["cluster", "down", "--cluster", self.file_arg()]);
    }
}
