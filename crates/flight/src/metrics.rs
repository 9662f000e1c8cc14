//! Prometheus text exposition of a device server's counters, served at
//! `GET /metrics` on the `--metrics` address.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::service::ServerState;

/// Renders every counter and gauge in the Prometheus text format (0.0.4).
pub fn render(state: &ServerState) -> String {
    let s = state.stats();
    let c = &state.counters;
    let device = s.device_id;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(out, "# HELP insitu_device_{name} {help}");
        let _ = writeln!(out, "# TYPE insitu_device_{name} {kind}");
        let _ = writeln!(out, "insitu_device_{name}{{device=\"{device}\"}} {value}");
    };
    metric(
        "bytes_read_total",
        "counter",
        "Bytes read from the device's storage.",
        s.bytes_read,
    );
    metric(
        "bytes_sent_total",
        "counter",
        "Bytes sent to hosts (results, ranges, manifests).",
        s.bytes_sent,
    );
    metric(
        "bytes_received_total",
        "counter",
        "Bytes received from hosts (plans, uploads).",
        s.bytes_received,
    );
    metric(
        "rows_in_total",
        "counter",
        "Rows scanned by stages.",
        s.rows_in,
    );
    metric(
        "rows_out_total",
        "counter",
        "Rows sent by stages.",
        s.rows_out,
    );
    metric(
        "stages_ok_total",
        "counter",
        "Stages that ran to the end.",
        s.stages_ok,
    );
    metric(
        "stages_failed_total",
        "counter",
        "Stages that failed.",
        s.stages_failed,
    );
    metric(
        "stages_cancelled_total",
        "counter",
        "Stages cancelled because the host went away.",
        s.stages_cancelled,
    );
    metric(
        "partitions_ingested_total",
        "counter",
        "Partitions written by uploads and loads.",
        s.partitions_ingested,
    );
    metric(
        "puts_rejected_total",
        "counter",
        "Uploads rejected (cut off, bad checksum).",
        c.puts_rejected.load(Ordering::Relaxed),
    );
    metric(
        "calls_unauthenticated_total",
        "counter",
        "Calls rejected for a missing or wrong token.",
        c.calls_unauthenticated.load(Ordering::Relaxed),
    );
    metric(
        "active_streams",
        "gauge",
        "Stages running now.",
        s.active_streams,
    );
    metric(
        "memory_in_use_bytes",
        "gauge",
        "Memory reserved in the device's pool now.",
        s.mem_in_use_bytes,
    );
    metric(
        "memory_peak_bytes",
        "gauge",
        "Highest memory reservation since start.",
        s.mem_peak_bytes,
    );
    metric(
        "memory_limit_bytes",
        "gauge",
        "The device's memory budget (mem_bytes_max).",
        s.mem_bytes_max,
    );
    metric(
        "resident_bytes",
        "gauge",
        "Resident memory of the server process now.",
        s.process_rss_bytes,
    );
    metric(
        "resident_peak_bytes",
        "gauge",
        "Highest resident memory of the server process since start.",
        s.process_rss_peak_bytes,
    );
    metric(
        "spilled_runs_total",
        "counter",
        "Sorted runs written to storage by sorts past the memory budget.",
        s.spilled_runs,
    );
    metric(
        "spilled_bytes_total",
        "counter",
        "Bytes of sorted runs written to storage by sorts past the memory budget.",
        s.spilled_bytes,
    );
    let _ = writeln!(
        out,
        "# HELP insitu_device_operator_seconds_total Compute time per operator."
    );
    let _ = writeln!(out, "# TYPE insitu_device_operator_seconds_total counter");
    for (op, us) in &s.operator_us {
        let _ = writeln!(
            out,
            "insitu_device_operator_seconds_total{{device=\"{device}\",operator=\"{op}\"}} {:.6}",
            *us as f64 / 1e6
        );
    }
    out
}

/// The metrics endpoint's routes.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let state = Arc::clone(&state);
            async move {
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(&state),
                )
                    .into_response()
            }
        }),
    )
}
