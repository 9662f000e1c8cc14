//! `insitu bench tpch`: TPC-H queries with pushdown on and off over the same
//! devices and link, medians of several runs, written as JSON and Markdown.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use insitu_device::root::{device_count, open_root};
use insitu_device::Device;
use insitu_host::{InsituHost, QueryStats};
use insitu_link::LinkProfile;
use serde::Serialize;

use crate::session::{budget, gen_tpch_into, host_over};
use crate::tpch_queries::{parse_list, query};
use crate::units::human_bytes;
use crate::DeviceArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Scale factor.
    #[arg(long, default_value_t = 1.0)]
    pub sf: f64,
    /// Number of devices.
    #[arg(long, default_value_t = 4)]
    pub devices: u32,
    /// Link profile between host and each device.
    #[arg(long, default_value = "10gbe")]
    pub link: LinkProfile,
    /// Queries to run, e.g. 1,6,14 or all.
    #[arg(long, default_value = "1,6,14")]
    pub queries: String,
    /// Timed runs per query and mode (after one warm-up run); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Directory for the JSON and Markdown results.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Data root; generated if it holds no TPC-H data
    /// (default: a per-scale-factor root under the insitu data directory).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Memory budget per device.
    #[arg(long, default_value = "4GiB", value_parser = crate::units::parse_bytes)]
    pub mem: usize,
    /// Worker threads per device.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// One mode's measurements of one query.
#[derive(Debug, Clone, Serialize)]
pub struct ModeResult {
    pub median_secs: f64,
    pub runs_secs: Vec<f64>,
    pub link_bytes: u64,
    pub device_bytes_read: u64,
    pub device_rows_read: u64,
    pub result_rows: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    pub query: usize,
    pub push: ModeResult,
    pub pull: ModeResult,
    /// pull time / push time.
    pub speedup: f64,
    /// pull link bytes / push link bytes.
    pub link_reduction: f64,
    /// Whether both modes returned the same rows.
    pub answers_match: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    scale_factor: f64,
    devices: u32,
    link: String,
    link_throttled: bool,
    runs: usize,
    host_threads: usize,
    device_threads: usize,
    root: String,
    queries: Vec<QueryResult>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// Result rows rendered for comparing the two modes (order-insensitive).
fn fingerprint(batches: &[arrow::record_batch::RecordBatch]) -> Vec<String> {
    let mut rows = vec![];
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| {
                arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &Default::default())
                    .expect("formatter")
            })
            .collect();
        for r in 0..b.num_rows() {
            rows.push(
                formatters
                    .iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    rows.sort();
    rows
}

async fn run_once(host: &InsituHost, sql: &str) -> Result<(QueryStats, Vec<String>), String> {
    let outcome = host.sql(sql).await.map_err(|e| e.to_string())?;
    Ok((outcome.stats, fingerprint(&outcome.batches)))
}

/// Runs `queries` in both modes, alternating, `runs` timed runs each.
pub async fn compare(
    devices: &[Arc<Device>],
    link: LinkProfile,
    queries: &[usize],
    runs: usize,
    mut on_result: impl FnMut(&QueryResult),
) -> Result<Vec<QueryResult>, String> {
    let push = host_over(devices.to_vec(), link, true).await?;
    let pull = host_over(devices.to_vec(), link, false).await?;
    let mut results = vec![];
    for &q in queries {
        let sql = query(q).ok_or_else(|| format!("no TPC-H query {q}"))?;
        let (_, push_rows) = run_once(&push, sql)
            .await
            .map_err(|e| format!("Q{q} pushdown on: {e}"))?;
        let (_, pull_rows) = run_once(&pull, sql)
            .await
            .map_err(|e| format!("Q{q} pushdown off: {e}"))?;
        let (mut push_stats, mut pull_stats) = (vec![], vec![]);
        for _ in 0..runs.max(1) {
            push_stats.push(run_once(&push, sql).await?.0);
            pull_stats.push(run_once(&pull, sql).await?.0);
        }
        let summarize = |stats: &[QueryStats]| {
            let times: Vec<f64> = stats.iter().map(|s| s.wall_secs).collect();
            let last = stats.last().cloned().unwrap_or_default();
            ModeResult {
                median_secs: median(&times),
                runs_secs: times,
                link_bytes: last.link_bytes(),
                device_bytes_read: last.device_bytes_read,
                device_rows_read: last.device_rows_read,
                result_rows: last.result_rows,
            }
        };
        let (p, l) = (summarize(&push_stats), summarize(&pull_stats));
        let result = QueryResult {
            query: q,
            speedup: l.median_secs / p.median_secs,
            link_reduction: l.link_bytes as f64 / p.link_bytes.max(1) as f64,
            push: p,
            pull: l,
            answers_match: push_rows == pull_rows,
        };
        on_result(&result);
        results.push(result);
    }
    Ok(results)
}

pub fn markdown_table(results: &[QueryResult]) -> String {
    let mut md = String::from(
        "| query | push (s) | pull (s) | speedup | link bytes push | link bytes pull | link reduction | device bytes read push | device bytes read pull | answers match |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in results {
        md.push_str(&format!(
            "| Q{} | {:.3} | {:.3} | {:.2}x | {} | {} | {:.0}x | {} | {} | {} |\n",
            r.query,
            r.push.median_secs,
            r.pull.median_secs,
            r.speedup,
            human_bytes(r.push.link_bytes),
            human_bytes(r.pull.link_bytes),
            r.link_reduction,
            human_bytes(r.push.device_bytes_read),
            human_bytes(r.pull.device_bytes_read),
            if r.answers_match { "yes" } else { "NO" },
        ));
    }
    md
}

/// Opens `root` if it holds TPC-H at this size, else generates it.
pub fn tpch_devices(
    root: &std::path::Path,
    args: &DeviceArgs,
    sf: f64,
    devices: u32,
) -> Result<Vec<Arc<Device>>, String> {
    let existing = device_count(root).map_err(|e| e.to_string())?;
    if existing == Some(devices) {
        let devs = open_root(root, &budget(args)).map_err(|e| e.to_string())?;
        if devs
            .iter()
            .all(|d| d.manifest().tables.contains_key("lineitem"))
        {
            return Ok(devs);
        }
    }
    eprintln!(
        "generating TPC-H SF {sf} on {devices} devices under {}",
        root.display()
    );
    gen_tpch_into(root, &budget(args), sf, devices, 1, true)
}

pub async fn run(a: BenchArgs) -> Result<(), String> {
    let queries = parse_list(&a.queries)?;
    let root = a.root.clone().unwrap_or_else(|| {
        crate::session::default_root()
            .with_file_name(format!("bench-tpch-sf{}-{}dev", a.sf, a.devices))
    });
    let dargs = DeviceArgs {
        root: root.clone(),
        mem: a.mem,
        threads: a.threads,
    };
    let devices = tpch_devices(&root, &dargs, a.sf, a.devices)?;
    eprintln!(
        "link {} | {} devices x {} threads | {} timed runs per query and mode",
        a.link, a.devices, a.threads, a.runs
    );
    let results = compare(&devices, a.link, &queries, a.runs, |r| {
        eprintln!(
            "Q{:<2} push {:.3}s pull {:.3}s speedup {:.2}x link {} vs {}",
            r.query,
            r.push.median_secs,
            r.pull.median_secs,
            r.speedup,
            human_bytes(r.push.link_bytes),
            human_bytes(r.pull.link_bytes)
        )
    })
    .await?;
    let report = Report {
        scale_factor: a.sf,
        devices: a.devices,
        link: a.link.to_string(),
        link_throttled: a.link.is_throttled(),
        runs: a.runs,
        host_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        device_threads: a.threads,
        root: root.display().to_string(),
        queries: results.clone(),
    };
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let stem = format!("tpch-sf{}-{}dev-{}", a.sf, a.devices, a.link.name);
    let json_path = a.out.join(format!("{stem}.json"));
    let md_path = a.out.join(format!("{stem}.md"));
    let json = serde_json::to_vec_pretty(&report).map_err(|e| e.to_string())?;
    write_atomically(&json_path, &json)?;
    let md = format!(
        "# TPC-H SF {} on {} devices, link {}\n\nMedians of {} runs; throttled links are emulated.\n\n{}",
        a.sf, a.devices, a.link, a.runs, markdown_table(&results)
    );
    write_atomically(&md_path, md.as_bytes())?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    insitu_format::write_atomically(path, bytes).map_err(|e| e.to_string())
}
