//! Per-query statistics gathered from devices and links.

use std::collections::BTreeMap;
use std::sync::Mutex;

use insitu_wire::StageStats;

/// Device-side counters reported by stage runs: summed over a session,
/// or over one query when the query installs a sink of its own (see
/// [`crate::InsituHost::sql`]).
#[derive(Debug, Default)]
pub struct StageStatsSink {
    totals: Mutex<Totals>,
}

#[derive(Debug, Default, Clone)]
struct Totals {
    stages: StageStats,
    /// Highest memory each device reported for its stages.
    device_mem_peaks: BTreeMap<u32, u64>,
}

impl StageStatsSink {
    /// Records a stage's statistics as `device` reported them.
    pub fn add(&self, device: u32, s: &StageStats) {
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.stages.rows_read += s.rows_read;
        t.stages.bytes_read += s.bytes_read;
        t.stages.rows_out += s.rows_out;
        t.stages.elapsed_us = t.stages.elapsed_us.max(s.elapsed_us);
        t.stages.spilled_runs += s.spilled_runs;
        t.stages.spilled_bytes += s.spilled_bytes;
        let peak = t.device_mem_peaks.entry(device).or_default();
        *peak = (*peak).max(s.mem_peak_bytes);
    }

    pub fn snapshot(&self) -> StageStats {
        let t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.stages.clone()
    }

    /// Each device's highest reported memory peak.
    pub fn device_mem_peaks(&self) -> BTreeMap<u32, u64> {
        let t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.device_mem_peaks.clone()
    }
}

/// What one query cost.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct QueryStats {
    /// Rows decoded on devices (push mode).
    pub device_rows_read: u64,
    /// Bytes devices read from their storage (both modes).
    pub device_bytes_read: u64,
    pub link_bytes_to_device: u64,
    pub link_bytes_to_host: u64,
    pub link_messages: u64,
    pub wall_secs: f64,
    pub result_rows: u64,
    /// The most the query's host operators reserved at once, and the
    /// host's budget.
    pub host_mem_peak_bytes: u64,
    pub host_mem_bytes_max: u64,
    /// Each device's most reserved at once for the query (push mode).
    pub device_mem_peak_bytes: BTreeMap<u32, u64>,
    /// Bytes the query's device sorts spilled to device storage.
    pub device_spilled_bytes: u64,
    /// Bytes the query's host operators spilled to the spill directory.
    pub host_spilled_bytes: u64,
    /// Why the query ran a second time, if it did (a hash join's build
    /// side outgrew the host budget, and the joins were re-planned).
    pub replanned: Option<String>,
    /// Where each auto scan ran, what the model predicted, and how long
    /// its device stages took.
    pub placements: Vec<crate::StagePlacement>,
}

impl QueryStats {
    pub fn link_bytes(&self) -> u64 {
        self.link_bytes_to_device + self.link_bytes_to_host
    }

    /// One line: the host's peak against its budget, each device's peak,
    /// what spilled, and whether the joins were re-planned.
    pub fn memory_summary(&self) -> String {
        let mut text = format!(
            "host peak {} of {}",
            human_bytes(self.host_mem_peak_bytes),
            human_bytes(self.host_mem_bytes_max)
        );
        if !self.device_mem_peak_bytes.is_empty() {
            let peaks: Vec<String> = self
                .device_mem_peak_bytes
                .iter()
                .map(|(d, b)| format!("{d}: {}", human_bytes(*b)))
                .collect();
            text.push_str(&format!(", device peaks {}", peaks.join(", ")));
        }
        if self.host_spilled_bytes > 0 {
            text.push_str(&format!(
                ", host spilled {}",
                human_bytes(self.host_spilled_bytes)
            ));
        }
        if self.device_spilled_bytes > 0 {
            text.push_str(&format!(
                ", devices spilled {}",
                human_bytes(self.device_spilled_bytes)
            ));
        }
        if let Some(why) = &self.replanned {
            text.push_str(&format!(", re-planned: {why}"));
        }
        text
    }
}

fn human_bytes(n: u64) -> String {
    insitu_wire::units::human_bytes(n)
}
