//! Stage starts measured end to end: what a stage costs before its first
//! row, through this session's devices and link.
//!
//! The model prices a stage's reads, compute and transfers from the
//! profiles. What those leave out (the host planning the stage and
//! sending it, or opening each device's files over the link; the devices
//! planning and opening theirs) it prices as a start, linear in the
//! stage's device count ([`StartCost`]). On small tables the start is
//! the whole stage: a pulled scan of TPC-H's nation takes about a
//! millisecond, nearly all of it opening the file.
//!
//! ```text
//!   measured alone ─┐
//!                   ├─ residual = start ──► fit once + per_device × devices
//!   predicted, no  ─┘   (median of START_PROBE_RUNS,
//!   start              the smallest table, and the smallest on the most devices)
//! ```
//!
//! The host measures them once per link profile, forcing each placement
//! on the smallest tables, and keeps them in the host profile.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use insitu_link::LinkProfile;
use insitu_model::Placement;
use insitu_wire::{HostProfile, StageStarts, StartCost};

use crate::catalog::TableInfo;
use crate::{HostConfig, InsituHost, Pushdown};
use insitu_client::DeviceClient;

/// Timed runs of each probe; their median counts (after one warm-up).
pub const START_PROBE_RUNS: usize = 5;

/// Seconds all probes of a session may take before the host gives up on
/// them and prices starts from the profiles.
pub const START_PROBE_SECS_MAX: u64 = 10;

/// The name a link's stage starts are kept under in the host profile.
pub fn link_key(link: &LinkProfile) -> String {
    match link.bytes_per_sec {
        Some(rate) if link.name == "custom" => format!("{rate:.0} bytes/s"),
        _ => link.name.to_string(),
    }
}

/// Measures the stage starts of `clients` over their link, pushed and
/// pulled, on the smallest of `tables`.
pub(crate) async fn measure(
    clients: &[Arc<dyn DeviceClient>],
    tables: &BTreeMap<String, TableInfo>,
    config: &HostConfig,
    profile: &HostProfile,
    link: &str,
) -> Result<StageStarts> {
    let probes = probe_tables(tables);
    if probes.is_empty() {
        return Err(DataFusionError::Plan(
            "no table with rows to measure stage starts on".into(),
        ));
    }
    // Predictions without a start: what the probe measures beyond them
    // is the start.
    let mut unstarted = profile.clone();
    let zero = StartCost {
        once_secs: 0.0,
        per_device_secs: 0.0,
    };
    unstarted.stage_starts.insert(
        link.to_string(),
        StageStarts {
            push: zero,
            pull: zero,
        },
    );
    // Auto scans, so that the probe hosts' placement rule forces them.
    let config = HostConfig {
        pushdown: Pushdown::Auto,
        ..config.clone()
    };
    let mut fitted = [zero; 2];
    for (slot, placement) in fitted.iter_mut().zip([Placement::Push, Placement::Pull]) {
        let host = InsituHost::assemble(
            clients.to_vec(),
            tables.clone(),
            config.clone(),
            unstarted.clone(),
            Some(placement),
        )?;
        let mut points = vec![];
        for table in &probes {
            points.push((table.shares.len(), residual_secs(&host, table).await?));
        }
        *slot = fit(&points);
    }
    Ok(StageStarts {
        push: fitted[0],
        pull: fitted[1],
    })
}

/// The table with the fewest rows, and the one with the fewest among
/// those on the most devices (when that is another), so that the fit
/// sees two device counts.
fn probe_tables(tables: &BTreeMap<String, TableInfo>) -> Vec<&TableInfo> {
    let with_rows: Vec<&TableInfo> = tables
        .values()
        .filter(|t| t.row_count() > 0 && !t.shares.is_empty())
        .collect();
    let Some(smallest) = with_rows.iter().min_by_key(|t| t.row_count()) else {
        return vec![];
    };
    let most = with_rows.iter().map(|t| t.shares.len()).max().unwrap_or(0);
    let widest = with_rows
        .iter()
        .filter(|t| t.shares.len() == most)
        .min_by_key(|t| t.row_count());
    match widest {
        Some(w) if w.shares.len() != smallest.shares.len() => vec![smallest, w],
        _ => vec![smallest],
    }
}

/// Seconds a scan of `table`'s narrowest column takes beyond what the
/// model predicts of it without a start: the median of
/// [`START_PROBE_RUNS`] runs, after one to warm up.
async fn residual_secs(host: &InsituHost, table: &TableInfo) -> Result<f64> {
    let column = narrowest_column(table);
    let sql = format!("SELECT \"{column}\" FROM \"{}\"", table.name);
    let mut residuals = Vec::with_capacity(START_PROBE_RUNS);
    for run in 0..=START_PROBE_RUNS {
        let stages = host.time_stages(&sql).await?;
        let [stage] = stages.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "probe of {} placed {} stages, not one",
                table.name,
                stages.len()
            )));
        };
        let alone = stage.alone_secs.unwrap_or(0.0);
        if run > 0 {
            residuals.push((alone - stage.choice.chosen_secs()).max(0.0));
        }
    }
    residuals.sort_by(f64::total_cmp);
    Ok(residuals[residuals.len() / 2])
}

/// The column with the narrowest fixed width (the first column when
/// none is fixed-width).
fn narrowest_column(table: &TableInfo) -> &str {
    let fields = table.schema.fields();
    fields
        .iter()
        .filter_map(|f| Some((f.data_type().primitive_width()?, f)))
        .min_by_key(|(width, _)| *width)
        .map(|(_, f)| f)
        .or(fields.first())
        .map_or("", |f| f.name().as_str())
}

/// The line through `(devices, secs)` points: its slope per device and
/// its intercept, neither below 0. One device count gives no intercept.
fn fit(points: &[(usize, f64)]) -> StartCost {
    let (first, last) = match (points.first(), points.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => {
            return StartCost {
                once_secs: 0.0,
                per_device_secs: 0.0,
            }
        }
    };
    if first.0 == last.0 {
        return StartCost {
            once_secs: 0.0,
            per_device_secs: first.1.max(last.1) / first.0.max(1) as f64,
        };
    }
    let slope = ((last.1 - first.1) / (last.0 as f64 - first.0 as f64)).max(0.0);
    StartCost {
        once_secs: (first.1 - slope * first.0 as f64).max(0.0),
        per_device_secs: slope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_device_counts_fit_a_line() {
        let cost = fit(&[(1, 0.002), (4, 0.004)]);
        assert!(
            (cost.per_device_secs - 0.002 / 3.0).abs() < 1e-12,
            "{cost:?}"
        );
        assert!((cost.secs(1) - 0.002).abs() < 1e-12, "{cost:?}");
        assert!((cost.secs(4) - 0.004).abs() < 1e-12, "{cost:?}");
    }

    #[test]
    fn a_falling_line_costs_no_less_than_nothing() {
        // Noise can make four devices start faster than one.
        let cost = fit(&[(1, 0.003), (4, 0.002)]);
        assert_eq!(cost.per_device_secs, 0.0);
        assert_eq!(cost.once_secs, 0.003);
        let cost = fit(&[(2, 0.0), (4, 0.004)]);
        assert_eq!(cost.once_secs, 0.0);
        assert_eq!(cost.per_device_secs, 0.002);
    }

    #[test]
    fn one_device_count_is_all_per_device() {
        let cost = fit(&[(2, 0.004)]);
        assert_eq!((cost.once_secs, cost.per_device_secs), (0.0, 0.002));
        assert_eq!(fit(&[]).secs(3), 0.0);
    }

    #[test]
    fn a_custom_link_is_kept_under_its_rate() {
        let named: LinkProfile = "1gbe".parse().expect("1gbe");
        assert_eq!(link_key(&named), "1gbe");
        let custom: LinkProfile = "250mb/s".parse().expect("250 MB/s");
        assert_eq!(link_key(&custom), "250000000 bytes/s");
    }
}
