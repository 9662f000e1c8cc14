//! Per-query statistics gathered from devices and links.

use std::sync::Mutex;

use insitu_device::StageStats;

/// Device-side counters reported by stage runs, summed over a session.
#[derive(Debug, Default)]
pub struct StageStatsSink {
    totals: Mutex<StageStats>,
}

impl StageStatsSink {
    pub fn add(&self, s: &StageStats) {
        let mut t = self.totals.lock().expect("stats lock");
        t.rows_read += s.rows_read;
        t.bytes_read += s.bytes_read;
        t.rows_out += s.rows_out;
        t.elapsed_us = t.elapsed_us.max(s.elapsed_us);
    }

    pub fn snapshot(&self) -> StageStats {
        self.totals.lock().expect("stats lock").clone()
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
}

impl QueryStats {
    pub fn link_bytes(&self) -> u64 {
        self.link_bytes_to_device + self.link_bytes_to_host
    }
}
