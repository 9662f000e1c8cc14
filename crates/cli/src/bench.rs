//! `insitu bench tpch`: TPC-H queries with pushdown on and off over the same
//! devices and link, medians of several runs, written as JSON and Markdown.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use insitu_host::{InsituHost, Pushdown, QueryStats};
use insitu_link::LinkProfile;
use serde::Serialize;

use insitu_session::{
    host_memory_for, host_with, open_or_gen_tpch, open_or_gen_tpch_cluster, DeviceOptions,
    HostMemorySettings, Target,
};

use crate::console::{print_note, Bars};
use crate::error::CliResult;
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
    #[arg(long, default_value = "all")]
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
    /// Memory budget per device [default: 4GiB, scaled down to fit the machine].
    #[arg(long, value_parser = crate::units::parse_bytes)]
    pub mem: Option<usize>,
    /// Memory budget of the host's query operators [default: what 80% of
    /// the machine's memory leaves beside the devices'].
    #[arg(long, value_parser = crate::units::parse_bytes)]
    pub host_mem: Option<usize>,
    /// Worker threads per device.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Run on the device servers of this cluster file (TPC-H is generated
    /// over Flight if absent) instead of embedded devices under --root.
    #[arg(long, conflicts_with = "root")]
    pub cluster: Option<PathBuf>,
}

/// One mode's measurements of one query.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeResult {
    /// Why the mode failed, if it did (its numbers are then zero).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub median_secs: f64,
    pub runs_secs: Vec<f64>,
    pub link_bytes: u64,
    pub device_bytes_read: u64,
    pub device_rows_read: u64,
    pub result_rows: u64,
    /// The host's and devices' memory peaks and spills of the last run.
    pub memory: String,
    /// Bytes that crossed the loopback interface during the last run
    /// (device servers on this machine only; includes TCP/IP headers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loopback_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    pub query: usize,
    pub push: ModeResult,
    pub pull: ModeResult,
    /// `--pushdown auto`: per scan, what the cost model predicts fastest.
    pub auto: ModeResult,
    /// Auto's time over the better of push and pull's.
    pub auto_vs_best: f64,
    /// Where auto placed each scan, what the model predicted for each
    /// candidate, and (for stages the devices ran) the slowest device's
    /// measured stage time, from auto's last run.
    pub placements: Vec<insitu_host::StagePlacement>,
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
    /// "embedded", or the cluster file the devices were served from.
    transport: String,
    runs: usize,
    host_threads: usize,
    device_threads: usize,
    root: String,
    /// Predicted vs measured time of auto's stages, each run on its own.
    model_error: ModelError,
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

/// Bytes received on the loopback interface so far (Linux), for the real
/// wire cost of device servers on this machine.
fn loopback_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/dev").ok()?;
    let line = text.lines().find(|l| l.trim_start().starts_with("lo:"))?;
    line.split_once(':')?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

struct Run {
    stats: QueryStats,
    rows: Vec<String>,
    loopback_bytes: Option<u64>,
}

async fn run_once(host: &InsituHost, sql: &str) -> CliResult<Run> {
    let before = loopback_bytes();
    let outcome = host.sql(sql).await.map_err(|e| e.to_string())?;
    let after = loopback_bytes();
    Ok(Run {
        stats: outcome.stats,
        rows: fingerprint(&outcome.batches),
        loopback_bytes: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
    })
}

/// Runs `queries` in both modes, alternating, `runs` timed runs each. A
/// query that fails in a mode is recorded as failed and the run goes on.
pub async fn compare(
    target: &Target,
    link: LinkProfile,
    memory: &HostMemorySettings,
    queries: &[usize],
    runs: usize,
    mut on_result: impl FnMut(&QueryResult),
) -> CliResult<Vec<QueryResult>> {
    let push = host_with(target.clients(Some(link)).await?, Pushdown::On, memory).await?;
    let pull = host_with(target.clients(Some(link)).await?, Pushdown::Off, memory).await?;
    let auto = host_with(target.clients(Some(link)).await?, Pushdown::Auto, memory).await?;
    let over_network = matches!(target, Target::Cluster(_));
    let mut results = vec![];
    for &q in queries {
        let sql = query(q).ok_or_else(|| format!("no TPC-H query {q}"))?;
        let (mut push_runs, mut pull_runs, mut auto_runs) = (Ok(vec![]), Ok(vec![]), Ok(vec![]));
        // One warm-up run each, then the timed runs, modes taking turns.
        for i in 0..=runs.max(1) {
            for (host, runs) in [
                (&push, &mut push_runs),
                (&pull, &mut pull_runs),
                (&auto, &mut auto_runs),
            ] {
                if let Ok(list) = runs {
                    match run_once(host, sql).await {
                        Ok(run) if i > 0 => list.push(run),
                        Ok(_) => {}
                        Err(e) => *runs = Err(e),
                    }
                }
            }
        }
        let summarize = |runs: &CliResult<Vec<Run>>| match runs {
            Err(e) => ModeResult {
                error: Some(e.to_string()),
                ..Default::default()
            },
            Ok(runs) => {
                let times: Vec<f64> = runs.iter().map(|r| r.stats.wall_secs).collect();
                let last = runs.last().expect("at least one run");
                ModeResult {
                    error: None,
                    median_secs: median(&times),
                    runs_secs: times,
                    link_bytes: last.stats.link_bytes(),
                    device_bytes_read: last.stats.device_bytes_read,
                    device_rows_read: last.stats.device_rows_read,
                    result_rows: last.stats.result_rows,
                    memory: last.stats.memory_summary(),
                    loopback_bytes: last.loopback_bytes.filter(|_| over_network),
                }
            }
        };
        let (p, l, a) = (
            summarize(&push_runs),
            summarize(&pull_runs),
            summarize(&auto_runs),
        );
        let answers_match = match (&push_runs, &pull_runs, &auto_runs) {
            (Ok(a), Ok(b), Ok(c)) => {
                let last = |runs: &Vec<Run>| runs.last().map(|r| r.rows.clone());
                last(a) == last(b) && last(b) == last(c)
            }
            _ => false,
        };
        let placements = auto_runs
            .as_ref()
            .ok()
            .and_then(|runs| runs.last())
            .map(|r| r.stats.placements.clone())
            .unwrap_or_default();
        let placements = with_stages_alone(&auto, sql, runs, placements).await;
        let result = QueryResult {
            query: q,
            auto_vs_best: a.median_secs / p.median_secs.min(l.median_secs),
            auto: a,
            placements,
            speedup: l.median_secs / p.median_secs,
            link_reduction: l.link_bytes as f64 / p.link_bytes.max(1) as f64,
            push: p,
            pull: l,
            answers_match,
        };
        on_result(&result);
        results.push(result);
    }
    Ok(results)
}

/// `placements` with each stage's median time when run on its own
/// (`runs` times): what the model's predictions are checked against.
async fn with_stages_alone(
    host: &InsituHost,
    sql: &str,
    runs: usize,
    mut placements: Vec<insitu_host::StagePlacement>,
) -> Vec<insitu_host::StagePlacement> {
    let mut times: Vec<Vec<f64>> = vec![vec![]; placements.len()];
    for _ in 0..runs.max(1) {
        let Ok(alone) = host.time_stages(sql).await else {
            return placements;
        };
        if alone.len() != placements.len() {
            return placements;
        }
        for (list, stage) in times.iter_mut().zip(&alone) {
            list.extend(stage.alone_secs);
        }
    }
    for (placement, list) in placements.iter_mut().zip(&times) {
        placement.alone_secs = (!list.is_empty()).then(|| median(list));
    }
    placements
}

/// The model's error over the stages run on their own:
/// |predicted - measured| / measured.
#[derive(Debug, Clone, Serialize)]
pub struct ModelError {
    pub stages: usize,
    pub median: f64,
    pub p90: f64,
}

pub fn model_error(results: &[QueryResult]) -> ModelError {
    let mut errors: Vec<f64> = results
        .iter()
        .flat_map(|r| &r.placements)
        .filter_map(|p| {
            let alone = p.alone_secs.filter(|&s| s > 0.0)?;
            Some((p.choice.chosen_secs() - alone).abs() / alone)
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    ModelError {
        stages: errors.len(),
        median: median(&errors),
        p90: percentile(&errors, 0.9),
    }
}

pub fn markdown_table(results: &[QueryResult]) -> String {
    let mut md = String::from(
        "| query | push (s) | pull (s) | auto (s) | push vs pull | auto vs the better | link bytes push | link bytes pull | link bytes auto | auto placed | device bytes read push | device bytes read pull | answers match |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n",
    );
    for r in results {
        let failed = [("push", &r.push), ("pull", &r.pull), ("auto", &r.auto)]
            .into_iter()
            .find_map(|(name, m)| m.error.as_ref().map(|e| (name, e)));
        if let Some((which, e)) = failed {
            md.push_str(&format!(
                "| Q{} | failed ({which}): {} | | | | | | | | | | | NO |\n",
                r.query,
                e.replace('|', "/").replace('\n', " ")
            ));
            continue;
        }
        md.push_str(&format!(
            "| Q{} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.query,
            r.push.median_secs,
            r.pull.median_secs,
            r.auto.median_secs,
            crate::units::speed_words(r.speedup),
            crate::units::speed_words(1.0 / r.auto_vs_best),
            human_bytes(r.push.link_bytes),
            human_bytes(r.pull.link_bytes),
            human_bytes(r.auto.link_bytes),
            placed_words(&r.placements),
            human_bytes(r.push.device_bytes_read),
            human_bytes(r.pull.device_bytes_read),
            if r.answers_match { "yes" } else { "NO" },
        ));
    }
    md
}

/// How auto placed a query's scans, e.g. `3 push, 1 pull`.
pub fn placed_words(placements: &[insitu_host::StagePlacement]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for p in placements {
        *counts.entry(p.choice.chosen.name()).or_insert(0) += 1;
    }
    if counts.is_empty() {
        return "–".into();
    }
    counts
        .iter()
        .map(|(name, n)| format!("{n} {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// TPC-H at `sf` on the cluster of `options` or on `devices` devices
/// under its root, generated first where missing: the target, its
/// device count and where it is, in words.
pub async fn tpch_target(
    options: &DeviceOptions,
    sf: f64,
    devices: u32,
) -> CliResult<(Target, u32, String)> {
    let bars = Arc::new(Bars::default());
    Ok(match &options.cluster {
        Some(cluster) => {
            let target = open_or_gen_tpch_cluster(cluster, sf, print_note, bars).await?;
            let devices = insitu_flight::ClusterFile::load(cluster)?.devices.len() as u32;
            (
                target,
                devices,
                format!("device servers of {}", cluster.display()),
            )
        }
        None => {
            let devs = open_or_gen_tpch(options, sf, devices, bars.as_ref())?;
            let location = format!(
                "{devices} embedded devices under {}",
                options.root.display()
            );
            (Target::Embedded(devs), devices, location)
        }
    })
}

pub async fn run(a: BenchArgs) -> CliResult<()> {
    let queries = parse_list(&a.queries)?;
    let root = a.root.clone().unwrap_or_else(|| {
        insitu_session::default_root()
            .with_file_name(format!("bench-tpch-sf{}-{}dev", a.sf, a.devices))
    });
    let options = DeviceOptions {
        root,
        cluster: a.cluster.clone(),
        mem: a.mem,
        host_mem: a.host_mem,
        threads: a.threads,
        notify: print_note,
    };
    let (target, devices, _) = tpch_target(&options, a.sf, a.devices).await?;
    // The report names the data by its path: bench/compare.py reads it.
    let location = options.cluster.as_ref().unwrap_or(&options.root);
    let memory = host_memory_for(&options, &target).await?;
    let location = location.display().to_string();
    report(&a, &queries, &target, &memory, devices, &location).await
}

async fn report(
    a: &BenchArgs,
    queries: &[usize],
    target: &Target,
    memory: &HostMemorySettings,
    devices: u32,
    location: &str,
) -> CliResult<()> {
    let transport = match target {
        Target::Embedded(_) => "embedded",
        Target::Cluster(_) => "flight",
    };
    eprintln!(
        "link {} | {devices} {transport} devices | {} timed runs per query and mode",
        a.link, a.runs
    );
    let results = compare(target, a.link, memory, queries, a.runs, |r| {
        let failed = [&r.push, &r.pull, &r.auto]
            .into_iter()
            .find_map(|m| m.error.as_ref());
        if let Some(e) = failed {
            eprintln!("Q{:<2} failed: {e}", r.query);
            return;
        }
        eprintln!(
            "Q{:<2} push {:.3}s pull {:.3}s auto {:.3}s ({}) link {} / {} / {}",
            r.query,
            r.push.median_secs,
            r.pull.median_secs,
            r.auto.median_secs,
            placed_words(&r.placements),
            human_bytes(r.push.link_bytes),
            human_bytes(r.pull.link_bytes),
            human_bytes(r.auto.link_bytes),
        )
    })
    .await?;
    let report = Report {
        scale_factor: a.sf,
        devices,
        link: a.link.to_string(),
        link_throttled: a.link.is_throttled(),
        transport: transport.to_string(),
        runs: a.runs,
        host_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        device_threads: a.threads,
        root: location.to_string(),
        model_error: model_error(&results),
        queries: results.clone(),
    };
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let stem = match target {
        Target::Embedded(_) => format!("tpch-sf{}-{devices}dev-{}", a.sf, a.link.name),
        Target::Cluster(_) => format!("tpch-sf{}-{devices}dev-flight-{}", a.sf, a.link.name),
    };
    let json_path = a.out.join(format!("{stem}.json"));
    let md_path = a.out.join(format!("{stem}.md"));
    let json = serde_json::to_vec_pretty(&report).map_err(|e| e.to_string())?;
    write_atomically(&json_path, &json)?;
    let error = &report.model_error;
    let md = format!(
        "# TPC-H SF {} on {devices} {transport} devices, link {}\n\nMedians of {} runs; throttled links are emulated.\n\n{}\n\
         Model error over auto's {} stages, each run on its own: median {:.0}%, 90th percentile {:.0}%.\n",
        a.sf,
        a.link,
        a.runs,
        markdown_table(&results),
        error.stages,
        error.median * 100.0,
        error.p90 * 100.0
    );
    write_atomically(&md_path, md.as_bytes())?;
    println!("{md}");
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> CliResult<()> {
    insitu_format::write_atomically(path, bytes).map_err(|e| e.to_string().into())
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Cluster file of the device servers under load.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Concurrent clients, each with its own host session and connections.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 30.0)]
    pub secs: f64,
    /// TPC-H queries the clients cycle through, each from a different start.
    #[arg(long, default_value = "1,3,5,6,10,12,14,19")]
    pub queries: String,
}

#[derive(Debug, Serialize)]
struct LoadReport {
    clients: usize,
    secs: f64,
    queries_ok: u64,
    errors: Vec<String>,
    queries_per_sec: f64,
    latency_p50_secs: f64,
    latency_p95_secs: f64,
    devices: Vec<insitu_wire::DeviceStats>,
    memory_within_budget: bool,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `insitu bench load`: clients running TPC-H queries against a cluster for
/// a fixed time; fails on any error or a device over its memory budget.
pub async fn load(a: LoadArgs) -> CliResult<()> {
    let queries = parse_list(&a.queries)?;
    let target = Target::Cluster(a.cluster.clone());
    let options = DeviceOptions {
        cluster: Some(a.cluster.clone()),
        threads: 1,
        notify: print_note,
        ..DeviceOptions::root(insitu_session::default_root())
    };
    let memory = host_memory_for(&options, &target).await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(a.secs);
    let mut tasks = vec![];
    for client in 0..a.clients.max(1) {
        let host = host_with(target.clients(None).await?, Pushdown::On, &memory).await?;
        let queries = queries.clone();
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut errors) = (vec![], vec![]);
            let mut i = client;
            while std::time::Instant::now() < deadline {
                let q = queries[i % queries.len()];
                i += 1;
                let started = std::time::Instant::now();
                match host.sql(query(q).expect("known query")).await {
                    Ok(_) => latencies.push(started.elapsed().as_secs_f64()),
                    Err(e) => errors.push(format!("client {client} Q{q}: {e}")),
                }
            }
            (latencies, errors)
        }));
    }
    let started = std::time::Instant::now();
    let (mut latencies, mut errors) = (vec![], vec![]);
    for t in tasks {
        let (l, e) = t.await.map_err(|e| e.to_string())?;
        latencies.extend(l);
        errors.extend(e);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let mut devices = vec![];
    for c in target.clients(None).await? {
        devices.push(c.stats().await.map_err(|e| e.to_string())?);
    }
    let report = LoadReport {
        clients: a.clients,
        secs: elapsed,
        queries_ok: latencies.len() as u64,
        queries_per_sec: latencies.len() as f64 / elapsed,
        latency_p50_secs: percentile(&latencies, 0.5),
        latency_p95_secs: percentile(&latencies, 0.95),
        memory_within_budget: devices.iter().all(within_budget),
        devices,
        errors,
    };
    eprintln!(
        "{} clients, {:.1} s: {} queries ok, {} errors, {:.2} queries/s, latency p50 {:.3} s p95 {:.3} s",
        report.clients,
        report.secs,
        report.queries_ok,
        report.errors.len(),
        report.queries_per_sec,
        report.latency_p50_secs,
        report.latency_p95_secs
    );
    for d in &report.devices {
        eprintln!(
            "device {}: memory peak {} of {} budget, resident peak {}, {} stages ok, {} failed, {} cancelled",
            d.device_id,
            human_bytes(d.mem_peak_bytes),
            human_bytes(d.mem_bytes_max),
            human_bytes(d.process_rss_peak_bytes),
            d.stages_ok,
            d.stages_failed,
            d.stages_cancelled
        );
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    );
    if let Some(first) = report.errors.first() {
        return Err(format!("{} queries failed; first: {first}", report.errors.len()).into());
    }
    if !report.memory_within_budget {
        return Err(
            "a device exceeded its memory budget (reservations past mem_bytes_max, or resident \
             memory past it plus rss_overhead_bytes)"
                .into(),
        );
    }
    Ok(())
}

/// Whether a device held to its budget: its reservations within
/// `mem_bytes_max`, and its server process's resident memory within it
/// plus `rss_overhead_bytes`.
fn within_budget(d: &insitu_wire::DeviceStats) -> bool {
    let rss_limit = d.mem_bytes_max + insitu_host::budget::RSS_OVERHEAD_BYTES;
    d.mem_peak_bytes <= d.mem_bytes_max && d.process_rss_peak_bytes <= rss_limit
}

/// The budgets of the devices in this process.
fn embedded_budgets(host: &InsituHost) -> u64 {
    host.clients()
        .iter()
        .filter(|c| c.in_process())
        .map(|c| c.capabilities().mem_bytes_max)
        .sum()
}

#[derive(Args, Debug)]
pub struct SqlBenchArgs {
    /// The query.
    pub query: String,
    /// Timed runs (after one untimed warm-up run).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Run the data-reducing work on the devices (on) or on the host (off).
    #[arg(long, value_enum, default_value_t = crate::PushdownArg::Auto)]
    pub pushdown: crate::PushdownArg,
    /// Link between host and each device (default: unlimited).
    #[arg(long)]
    pub link: Option<LinkProfile>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// What `bench sql` prints: one JSON object.
#[derive(Debug, Serialize)]
struct SqlBenchResult {
    query: String,
    /// `auto`, `on` or `off`.
    pushdown: &'static str,
    rows: u64,
    runs_secs: Vec<f64>,
    median_secs: f64,
    link_bytes_to_host: u64,
    /// The process's peak resident memory over the warm-up and all runs
    /// (host, devices and results together: embedded devices share it).
    peak_rss_bytes: u64,
    /// The budgets this process holds: the host's and its embedded
    /// devices' (device servers hold theirs in their own processes).
    budgets_bytes: u64,
    /// The last run's memory peaks and spills.
    memory: String,
    /// With `--pushdown auto`: where each scan ran and what the model
    /// predicted for every candidate (the last run).
    placements: Vec<insitu_host::StagePlacement>,
}

pub async fn sql(a: SqlBenchArgs) -> CliResult<()> {
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let pushdown = a.pushdown.mode();
    let host = insitu_session::open_host(&a.device.options(), a.link, pushdown).await?;
    // Only the statistics are kept: a result held on to would make the
    // next run allocate its own afresh.
    let mut last = host.sql(&a.query).await.map_err(|e| e.to_string())?.stats;
    let mut runs = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let outcome = host.sql(&a.query).await.map_err(|e| e.to_string())?;
        runs.push(outcome.stats.wall_secs);
        last = outcome.stats;
    }
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    let result = SqlBenchResult {
        query: a.query,
        pushdown: pushdown.name(),
        rows: last.result_rows,
        median_secs: sorted[sorted.len() / 2],
        runs_secs: runs,
        link_bytes_to_host: last.link_bytes_to_host,
        peak_rss_bytes: insitu_extsort::rss::peak_rss_bytes(),
        budgets_bytes: host.memory().budget() as u64 + embedded_budgets(&host),
        memory: last.memory_summary(),
        placements: last.placements.clone(),
    };
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    Ok(())
}
