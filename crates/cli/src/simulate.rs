//! `insitu simulate`: projects the stages of a measured run to other
//! machines with the cost model: more devices, other links, SmartSSD-like
//! devices. Writes CSV and SVG plots in the shapes of paper 000 Fig. 16
//! (time against devices, data growing with them), paper 003 Fig. 6
//! (throughput against selectivity) and Fig. 9 (time against link
//! bandwidth).
//!
//! The input is any report that carries placed stages with their shapes
//! and machines: `insitu bench tpch`'s JSON, or `insitu bench sql
//! --pushdown auto`'s.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::CliResult;
use clap::Args;
use insitu_model::{
    predict, smartssd_profile, Machine, Placement, StageShape, SMARTSSD_LINK_BYTES_PER_SEC,
};
use plotters::prelude::*;

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// A report with placed stages: `insitu bench tpch` JSON, or `insitu
    /// bench sql --pushdown auto` JSON.
    pub from: PathBuf,
    /// Device counts to project to.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,8,16")]
    pub devices: Vec<usize>,
    /// Directory for the CSV files and SVG plots.
    #[arg(long, default_value = "bench/results/simulate")]
    pub out: PathBuf,
}

/// Fractions of rows kept in the selectivity projection.
const FRACTIONS: [f64; 7] = [0.0001, 0.001, 0.01, 0.1, 0.3, 0.5, 1.0];

/// Link bandwidths of the link projection, bytes per second.
const LINK_RATES: [f64; 8] = [0.125e9, 0.25e9, 0.55e9, 1.2e9, 2.5e9, 3.2e9, 6.4e9, 12.8e9];

/// One stage of the measured run.
struct Stage {
    label: String,
    shape: StageShape,
    machine: Machine,
}

/// A machine to project to.
struct Variant {
    name: &'static str,
    /// The machine for `devices` devices, from the measured one.
    build: fn(&Machine, usize) -> Machine,
}

fn this_machine(m: &Machine, n: usize) -> Machine {
    m.with_devices(n, None)
}

fn smartssd(m: &Machine, n: usize) -> Machine {
    let device = smartssd_profile(&m.host.rates);
    let mut out = m.with_devices(n, Some(&device));
    out.link_bytes_per_sec = Some(SMARTSSD_LINK_BYTES_PER_SEC);
    out.shared_cores = None;
    // Starts measured here say nothing of another machine's.
    out.starts = None;
    out
}

const VARIANTS: [Variant; 2] = [
    Variant {
        name: "this machine",
        build: this_machine,
    },
    Variant {
        name: "SmartSSD-like",
        build: smartssd,
    },
];

pub fn run(a: SimulateArgs) -> CliResult<()> {
    let text = std::fs::read_to_string(&a.from)
        .map_err(|e| format!("cannot read {}: {e}", a.from.display()))?;
    let report: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", a.from.display()))?;
    let stages = stages_of(&report, &a.from)?;
    if a.devices.is_empty() || a.devices.contains(&0) {
        return Err("--devices: counts must be at least 1".into());
    }
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let largest = stages
        .iter()
        .max_by_key(|s| s.shape.stored_bytes())
        .expect("at least one stage");
    eprintln!(
        "{} stages from {}; selectivity and link projections use the largest, {}",
        stages.len(),
        a.from.display(),
        largest.label
    );
    let devices = project_devices(&stages, &a.devices);
    let selectivity = project_selectivity(largest);
    let links = project_links(largest);
    write(&a.out.join("devices.csv"), &devices.csv)?;
    write(&a.out.join("selectivity.csv"), &selectivity.csv)?;
    write(&a.out.join("links.csv"), &links.csv)?;
    plot(
        &a.out.join("devices.svg"),
        &devices,
        "devices",
        "seconds",
        false,
    )?;
    plot(
        &a.out.join("selectivity.svg"),
        &selectivity,
        "fraction of rows kept",
        "GB/s scanned",
        true,
    )?;
    plot(
        &a.out.join("links.svg"),
        &links,
        "link GB/s",
        "seconds",
        true,
    )?;
    println!("{}", devices.csv);
    eprintln!(
        "wrote devices, selectivity and links .csv and .svg under {}",
        a.out.display()
    );
    Ok(())
}

/// Every object in `report` with a stage's `shape` and `machine`.
fn stages_of(report: &serde_json::Value, path: &Path) -> CliResult<Vec<Stage>> {
    let mut out = vec![];
    collect(report, None, &mut out)?;
    if out.is_empty() {
        return Err(format!(
            "{} holds no placed stages: run `insitu bench tpch` or `insitu bench sql \
             --pushdown auto` and pass its JSON",
            path.display()
        )
        .into());
    }
    Ok(out)
}

fn collect(v: &serde_json::Value, query: Option<u64>, out: &mut Vec<Stage>) -> CliResult<()> {
    match v {
        serde_json::Value::Object(map) => {
            let query = map.get("query").and_then(|q| q.as_u64()).or(query);
            if let (Some(shape), Some(machine)) = (map.get("shape"), map.get("machine")) {
                let shape: StageShape = serde_json::from_value(shape.clone())
                    .map_err(|e| format!("a stage's shape: {e}"))?;
                let machine: Machine = serde_json::from_value(machine.clone())
                    .map_err(|e| format!("a stage's machine: {e}"))?;
                if shape.devices.is_empty() || machine.devices.is_empty() {
                    return Ok(());
                }
                let table = map.get("table").and_then(|t| t.as_str()).unwrap_or("?");
                let label = match query {
                    Some(q) => format!("Q{q} {table}"),
                    None => table.to_string(),
                };
                out.push(Stage {
                    label,
                    shape,
                    machine,
                });
                return Ok(());
            }
            for child in map.values() {
                collect(child, query, out)?;
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                collect(item, query, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Series of (x, y) per name, and the same as CSV.
struct Projection {
    series: Vec<(String, Vec<(f64, f64)>)>,
    csv: String,
}

fn push_or_pull(shape: &StageShape, machine: &Machine) -> [(&'static str, f64); 2] {
    [
        ("push", predict(shape, Placement::Push, machine).total_secs),
        ("pull", predict(shape, Placement::Pull, machine).total_secs),
    ]
}

/// Paper 000 Fig. 16: every stage over n devices that each hold what a
/// device holds now; the times of all stages summed.
fn project_devices(stages: &[Stage], counts: &[usize]) -> Projection {
    let mut csv = String::from("machine,devices,push_secs,pull_secs\n");
    let mut series = vec![];
    for v in &VARIANTS {
        let mut push = vec![];
        let mut pull = vec![];
        for &n in counts {
            let (mut p, mut l) = (0.0, 0.0);
            for s in stages {
                let [(_, a), (_, b)] =
                    push_or_pull(&s.shape.with_devices(n), &(v.build)(&s.machine, n));
                p += a;
                l += b;
            }
            let _ = writeln!(csv, "{},{n},{p:.6},{l:.6}", v.name);
            push.push((n as f64, p));
            pull.push((n as f64, l));
        }
        series.push((format!("{}: push", v.name), push));
        series.push((format!("{}: pull", v.name), pull));
    }
    Projection { series, csv }
}

/// Paper 003 Fig. 6: the largest stage's scan part (a filtered scan that
/// ships the rows it keeps) in stored bytes scanned per second, against
/// the fraction its filter keeps.
fn project_selectivity(stage: &Stage) -> Projection {
    let n = stage.shape.devices.len();
    let mut csv = String::from("machine,fraction,push_gb_per_sec,pull_gb_per_sec\n");
    let mut series = vec![];
    for v in &VARIANTS {
        let machine = (v.build)(&stage.machine, n);
        let mut push = vec![];
        let mut pull = vec![];
        for &a in &FRACTIONS {
            let shape = stage.shape.scan_part().with_selectivity(a);
            let bytes = shape.stored_bytes() as f64 / 1e9;
            let [(_, p), (_, l)] = push_or_pull(&shape, &machine);
            let (p, l) = (bytes / p.max(1e-12), bytes / l.max(1e-12));
            let _ = writeln!(csv, "{},{a},{p:.6},{l:.6}", v.name);
            push.push((a, p));
            pull.push((a, l));
        }
        series.push((format!("{}: in-storage (push)", v.name), push));
        series.push((format!("{}: in-host (pull)", v.name), pull));
    }
    Projection { series, csv }
}

/// Paper 003 Fig. 9: the largest stage's time against link bandwidth.
fn project_links(stage: &Stage) -> Projection {
    let n = stage.shape.devices.len();
    let mut csv = String::from("machine,link_bytes_per_sec,push_secs,pull_secs\n");
    let mut series = vec![];
    for v in &VARIANTS {
        let mut push = vec![];
        let mut pull = vec![];
        for &rate in &LINK_RATES {
            let mut machine = (v.build)(&stage.machine, n);
            machine.link_bytes_per_sec = Some(rate);
            let [(_, p), (_, l)] = push_or_pull(&stage.shape, &machine);
            let _ = writeln!(csv, "{},{rate},{p:.6},{l:.6}", v.name);
            push.push((rate / 1e9, p));
            pull.push((rate / 1e9, l));
        }
        series.push((format!("{}: push", v.name), push));
        series.push((format!("{}: pull", v.name), pull));
    }
    Projection { series, csv }
}

fn write(path: &Path, text: &str) -> CliResult<()> {
    insitu_format::write_atomically(path, text.as_bytes()).map_err(|e| e.to_string().into())
}

/// A line plot of every series, x on a log scale if `log_x`.
fn plot(path: &Path, p: &Projection, x_label: &str, y_label: &str, log_x: bool) -> CliResult<()> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let points = p.series.iter().flat_map(|(_, s)| s.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root);
        chart.margin(12).x_label_area_size(36).y_label_area_size(56);
        let colors = [BLUE, RED, GREEN, MAGENTA];
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(x_label)
                    .y_desc(y_label)
                    .draw()
                    .map_err(|e| err(&e))?;
                for (i, (name, series)) in p.series.iter().enumerate() {
                    let color = colors[i % colors.len()];
                    chart
                        .draw_series(LineSeries::new(series.iter().copied(), color))
                        .map_err(|e| err(&e))?
                        .label(name.as_str())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
                }
                chart
                    .configure_series_labels()
                    .border_style(BLACK)
                    .background_style(WHITE)
                    .draw()
                    .map_err(|e| err(&e))?;
            }};
        }
        let y = 0f64..(y1 * 1.1).max(1e-9);
        if log_x {
            draw!(chart
                .build_cartesian_2d((x0..x1).log_scale(), y)
                .map_err(|e| err(&e))?);
        } else {
            draw!(chart.build_cartesian_2d(x0..x1, y).map_err(|e| err(&e))?);
        }
        root.present().map_err(|e| err(&e))?;
    }
    write(path, &svg)
}
