//! The cost model of near-data planning: how long a stage takes when the
//! devices run it (push), when they only ship their stored pages and the
//! host runs it (pull), or when they run its scan part and the host the
//! rest.
//!
//! ```text
//!            push                 push scan              pull
//!  device  read+decode+filter    read+decode+filter     read pages
//!          +aggregate/sort       +IPC encode            ───────────▶
//!          +IPC encode           ──filtered rows──▶     link: stored bytes
//!          ──result rows──▶      link                   host: decode+filter
//!  link    result bytes          host: IPC decode         +aggregate/sort
//!  host    IPC decode              +aggregate/sort
//! ```
//!
//! The shape follows paper 003 §4.2: a scan's time is the device's
//! storage read, its compute over every record and its transfer of the
//! selected fraction α of them (eq. 7), against the host reading all
//! records over the link and computing on each (eq. 10). Two changes fit
//! insitu: the steps are pipelined (a device streams batch by batch, so
//! as in eqs. 2 and 4 the slowest step sets the pace, `max` instead of a
//! sum), and the devices run in parallel while sharing the host's link
//! (`link_secs` sums all their bytes). Where devices and host share one
//! machine's cores (embedded devices), the CPU seconds of all of them
//! divided by the cores bound the time from below. Every stage also pays
//! a start (planning, opening a file, reading its footer) once per device
//! file, whatever it reads.
//!
//! This crate is arithmetic only: no I/O, no clocks. Rates come from
//! [`insitu_wire::DeviceProfile`] and [`insitu_wire::HostProfile`].

use std::fmt;

use insitu_wire::{ComputeRates, DeviceProfile, HostProfile, ResultCodec, StageStarts};
use serde::{Deserialize, Serialize};

/// Where a stage's operators run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Devices ship stored pages; the host runs the whole stage.
    Pull,
    /// Devices scan, filter and project; the host runs what is above.
    PushScan,
    /// Devices run the whole stage.
    Push,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Pull => "pull",
            Placement::PushScan => "push scan",
            Placement::Push => "push",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One device's share of a stage's input.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceInput {
    /// Rows the scan reads.
    pub rows: u64,
    /// Stored (compressed) bytes of the columns it reads.
    pub stored_bytes: u64,
    /// The part of `stored_bytes` that holds string columns.
    pub string_stored_bytes: u64,
}

/// What a stage reads, keeps and produces, summed over its devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageShape {
    pub devices: Vec<DeviceInput>,
    /// Fixed-width columns the scan decodes.
    pub fixed_columns: u32,
    /// Variable-width (string) columns the scan decodes.
    pub string_columns: u32,
    /// Whether the scan part evaluates a predicate.
    pub filter: bool,
    /// Fraction of scanned rows the scan part keeps (α in paper 003).
    pub selectivity: f64,
    /// Arrow bytes of one row the scan part produces.
    pub scan_row_bytes: f64,
    /// Whether a (partial) aggregate runs above the scan part.
    pub aggregate: bool,
    /// The aggregate's estimated groups.
    pub groups: u64,
    /// Aggregate functions it computes (each costs a pass over its rows).
    pub aggregates: u32,
    /// Whether a sort runs above the scan part.
    pub sort: bool,
    /// Rows the whole stage produces (all devices).
    pub rows_out: u64,
    /// Arrow bytes of one row the whole stage produces.
    pub out_row_bytes: f64,
    /// Link bytes per Arrow byte of device results (1 uncompressed).
    pub result_bytes_ratio: f64,
    /// How the devices compress their results, at `result_bytes_ratio`.
    #[serde(default)]
    pub result_codec: ResultCodec,
}

/// One way a pushed stage's results may travel: a codec and the link
/// bytes it leaves per Arrow byte (1 for plain results).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ResultEncoding {
    pub codec: ResultCodec,
    pub bytes_ratio: f64,
}

impl ResultEncoding {
    pub const PLAIN: Self = Self {
        codec: ResultCodec::None,
        bytes_ratio: 1.0,
    };

    /// Arrow bytes per second one device thread compresses under it.
    fn compress_bytes_per_sec(self, r: &ComputeRates) -> f64 {
        match self.codec {
            ResultCodec::None => f64::INFINITY,
            ResultCodec::Lz4Frame => r.lz4_compress_bytes_per_sec,
            ResultCodec::Zstd => r.zstd_compress_bytes_per_sec,
        }
    }
}

impl StageShape {
    pub fn rows_in(&self) -> u64 {
        self.devices.iter().map(|d| d.rows).sum()
    }

    pub fn stored_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.stored_bytes).sum()
    }

    /// Whether anything runs above the scan part, so that push and push
    /// scan differ.
    pub fn has_upper(&self) -> bool {
        self.aggregate || self.sort
    }

    /// The same stage over `n` devices that each hold what one device
    /// holds here on average: the data grows with the devices (paper 000
    /// Fig. 16's scaling), and so do the rows it produces.
    pub fn with_devices(&self, n: usize) -> Self {
        let have = self.devices.len().max(1) as u64;
        let avg = DeviceInput {
            rows: self.rows_in() / have,
            stored_bytes: self.stored_bytes() / have,
            string_stored_bytes: self
                .devices
                .iter()
                .map(|d| d.string_stored_bytes)
                .sum::<u64>()
                / have,
        };
        let mut out = self.clone();
        out.devices = vec![avg; n];
        out.rows_out = self.rows_out.saturating_mul(n as u64) / have;
        out
    }

    /// The same stage with a filter keeping `fraction` of the rows (paper
    /// 003 Fig. 6's x axis); what an aggregate or top-k produces stays.
    pub fn with_selectivity(&self, fraction: f64) -> Self {
        let mut out = self.clone();
        out.filter = true;
        out.selectivity = fraction.clamp(0.0, 1.0);
        if !self.has_upper() {
            out.rows_out = out.kept(out.rows_in()).round() as u64;
        }
        out
    }

    /// Only the scan part: what a plain filtered scan would do, shipping
    /// the rows it keeps.
    pub fn scan_part(&self) -> Self {
        let mut out = self.clone();
        out.aggregate = false;
        out.sort = false;
        out.groups = 0;
        out.aggregates = 0;
        out.rows_out = out.kept(out.rows_in()).round() as u64;
        out.out_row_bytes = out.scan_row_bytes;
        out
    }

    /// How the devices' results travel.
    pub fn result_encoding(&self) -> ResultEncoding {
        ResultEncoding {
            codec: self.result_codec,
            bytes_ratio: self.result_bytes_ratio,
        }
    }

    /// The same stage with its results travelling under `encoding`.
    pub fn with_encoding(&self, encoding: ResultEncoding) -> Self {
        Self {
            result_bytes_ratio: encoding.bytes_ratio,
            result_codec: encoding.codec,
            ..self.clone()
        }
    }

    /// Rows the scan part keeps, of `rows` scanned.
    fn kept(&self, rows: u64) -> f64 {
        rows as f64 * self.selectivity.clamp(0.0, 1.0)
    }

    /// Single-thread seconds of the scan part over one device's input
    /// (eq. 6's `N_rec · t_scan_comp`: decode and predicate per record;
    /// decoding costs per value and per stored byte).
    fn scan_cpu_secs(&self, input: &DeviceInput, r: &ComputeRates) -> f64 {
        let n = input.rows as f64;
        let strings = input.string_stored_bytes.min(input.stored_bytes) as f64;
        let fixed = input.stored_bytes as f64 - strings;
        let decode = n * f64::from(self.fixed_columns) / r.decode_fixed_values_per_sec
            + fixed / r.decode_fixed_bytes_per_sec
            + n * f64::from(self.string_columns) / r.decode_string_values_per_sec
            + strings / r.decode_string_bytes_per_sec;
        let filter = if self.filter {
            n / r.filter_rows_per_sec
        } else {
            0.0
        };
        decode + filter
    }

    /// Single-thread seconds of what runs above the scan part over the
    /// rows it kept of `rows` scanned (eq. 6's `α · t_scan_update`).
    fn upper_cpu_secs(&self, rows: u64, r: &ComputeRates) -> f64 {
        let kept = self.kept(rows);
        let mut secs = 0.0;
        if self.aggregate {
            secs += kept * f64::from(self.aggregates.max(1))
                / if self.groups <= insitu_wire::FEW_GROUPS_MAX {
                    r.aggregate_rows_per_sec
                } else {
                    r.aggregate_many_groups_rows_per_sec
                };
        }
        if self.sort {
            secs += kept / r.sort_rows_per_sec;
        }
        secs
    }

    /// Arrow bytes a device sends for `rows` scanned under `placement`.
    fn result_bytes(&self, rows: u64, placement: Placement) -> f64 {
        match placement {
            Placement::Pull => 0.0,
            Placement::PushScan => self.kept(rows) * self.scan_row_bytes,
            Placement::Push => {
                let share = rows as f64 / self.rows_in().max(1) as f64;
                self.rows_out as f64 * share * self.out_row_bytes
            }
        }
    }
}

/// The machine a stage runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// One profile per device, in the order of [`StageShape::devices`].
    pub devices: Vec<DeviceProfile>,
    pub host: HostProfile,
    /// Bytes per second of the host's link, all devices together; `None`
    /// is unlimited.
    pub link_bytes_per_sec: Option<f64>,
    /// Cores that devices and host share when they run on one machine
    /// (embedded devices); `None` when each has its own.
    pub shared_cores: Option<u32>,
    /// Stage starts measured end to end over this machine's link; `None`
    /// prices them from the profiles' `stages_started_per_sec`.
    #[serde(default)]
    pub starts: Option<StageStarts>,
}

/// Predicted seconds of one stage under one placement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub placement: Placement,
    /// The slowest device: its storage read or its compute.
    pub device_secs: f64,
    /// All devices' bytes over the shared link.
    pub link_secs: f64,
    /// The host's part of the stage.
    pub host_secs: f64,
    /// Link bytes the stage moves.
    pub link_bytes: f64,
    /// Link bytes per Arrow byte of the devices' results: 1 plain, less
    /// compressed (pull ships stored pages: 1).
    #[serde(default = "plain_ratio")]
    pub result_bytes_ratio: f64,
    /// The codec of the devices' results (pull: none).
    #[serde(default)]
    pub codec: ResultCodec,
    /// The stage's time: its slowest pipelined step (pushed) or its
    /// transfer plus the host's compute (pulled), or the shared cores' CPU
    /// seconds, whichever is longer.
    pub total_secs: f64,
}

fn plain_ratio() -> f64 {
    1.0
}

impl Prediction {
    /// Whether the devices compress this candidate's results.
    pub fn compressed(&self) -> bool {
        self.placement != Placement::Pull && self.codec != ResultCodec::None
    }
}

impl Machine {
    /// The same machine with `n` devices like its first (or like `like`).
    pub fn with_devices(&self, n: usize, like: Option<&DeviceProfile>) -> Self {
        let device = like
            .or(self.devices.first())
            .cloned()
            .expect("a machine with a device, or a profile to copy");
        let mut out = self.clone();
        out.devices = vec![device; n];
        out
    }
}

/// A SmartSSD-like device, the papers' computational storage drive:
/// 3 GB/s from its flash, 4 cores computing at `rates` (the host's, as
/// the templates would run them), 4 GiB of DRAM (not modelled: stages
/// that outgrow it spill), reached over PCIe 3.0 x4 (3.2 GB/s).
pub fn smartssd_profile(rates: &ComputeRates) -> DeviceProfile {
    DeviceProfile {
        version: insitu_wire::PROFILE_VERSION,
        storage_read_bytes_per_sec: 3e9,
        threads: 4,
        rates: rates.clone(),
        source: "SmartSSD-like: 3 GB/s flash, 4 threads, 4 GiB, PCIe 3.0 x4".into(),
    }
}

/// The SmartSSD's link to the host, bytes per second (PCIe 3.0 x4).
pub const SMARTSSD_LINK_BYTES_PER_SEC: f64 = 3.2e9;

/// Predicts `shape` run under `placement` on `machine`.
///
/// # Panics
/// If `machine` has fewer device profiles than `shape` has devices.
pub fn predict(shape: &StageShape, placement: Placement, machine: &Machine) -> Prediction {
    assert!(
        machine.devices.len() >= shape.devices.len(),
        "one device profile per device"
    );
    let host = &machine.host.rates;
    let mut device_secs: f64 = 0.0;
    let mut cpu_secs = 0.0;
    let mut link_bytes = 0.0;
    let mut host_cpu = 0.0;
    for (input, profile) in shape.devices.iter().zip(&machine.devices) {
        let read = input.stored_bytes as f64 / profile.storage_read_bytes_per_sec;
        let (device_cpu, shipped) = match placement {
            Placement::Pull => {
                host_cpu +=
                    shape.scan_cpu_secs(input, host) + shape.upper_cpu_secs(input.rows, host);
                (0.0, input.stored_bytes as f64)
            }
            Placement::PushScan | Placement::Push => {
                let arrow = shape.result_bytes(input.rows, placement);
                let mut cpu = shape.scan_cpu_secs(input, &profile.rates)
                    + arrow / profile.rates.ipc_encode_bytes_per_sec;
                cpu += arrow
                    / shape
                        .result_encoding()
                        .compress_bytes_per_sec(&profile.rates);
                if placement == Placement::Push {
                    cpu += shape.upper_cpu_secs(input.rows, &profile.rates);
                } else {
                    host_cpu += shape.upper_cpu_secs(input.rows, host);
                }
                host_cpu += arrow / host.ipc_decode_bytes_per_sec;
                (cpu, arrow * shape.result_bytes_ratio)
            }
        };
        // Eq. 2's pipelined read and compute: the slower sets the pace.
        device_secs = device_secs.max(read.max(device_cpu / f64::from(profile.threads)));
        cpu_secs += device_cpu;
        link_bytes += shipped;
    }
    let link_secs = machine
        .link_bytes_per_sec
        .map_or(0.0, |rate| link_bytes / rate);
    let host_secs = host_cpu / f64::from(machine.host.threads);
    let mut total_secs = match placement {
        // Eq. 10: the host fetches a row group's pages, then decodes
        // them; its fetches and its compute take turns.
        Placement::Pull => device_secs.max(link_secs) + host_secs,
        // Eq. 7 pipelined: devices stream batches while the host decodes.
        Placement::PushScan | Placement::Push => device_secs.max(link_secs).max(host_secs),
    };
    if let Some(cores) = machine.shared_cores {
        total_secs = total_secs.max((cpu_secs + host_cpu) / f64::from(cores.max(1)));
    }
    total_secs += start_secs(shape, placement, machine);
    Prediction {
        placement,
        device_secs,
        link_secs,
        host_secs,
        link_bytes,
        result_bytes_ratio: match placement {
            Placement::Pull => 1.0,
            _ => shape.result_bytes_ratio,
        },
        codec: match placement {
            Placement::Pull => ResultCodec::None,
            _ => shape.result_codec,
        },
        total_secs,
    }
}

/// What starting the stage costs before its first row, paid once per
/// device file (a term paper 003 leaves out: its scans are long, while a
/// TPC-H query also scans nation and region): pushed, each device plans its stage
/// and opens its file, devices in parallel (on shared cores, the cores
/// take turns); pulled, the host opens every device's file, its threads
/// in parallel.
///
/// Starts measured end to end ([`Machine::starts`]) take the place of
/// these parts: they hold what the parts leave out (the host's planning,
/// the request, the link's first bytes).
fn start_secs(shape: &StageShape, placement: Placement, machine: &Machine) -> f64 {
    let devices = shape.devices.len();
    if let Some(starts) = &machine.starts {
        return match placement {
            Placement::Pull => starts.pull.secs(devices),
            Placement::Push | Placement::PushScan => starts.push.secs(devices),
        };
    }
    match placement {
        Placement::Pull => {
            let per_file = 1.0 / machine.host.rates.stages_started_per_sec;
            devices as f64 * per_file / f64::from(machine.host.threads.max(1))
        }
        Placement::Push | Placement::PushScan => {
            let per_device = machine.devices[..devices]
                .iter()
                .map(|d| 1.0 / d.rates.stages_started_per_sec);
            let (slowest, all) = per_device.fold((0.0, 0.0), |(m, s), t| (f64::max(m, t), s + t));
            match machine.shared_cores {
                Some(cores) => slowest.max(all / f64::from(cores.max(1))),
                None => slowest,
            }
        }
    }
}

/// The placements worth weighing for `shape`: push scan only when
/// something runs above the scan part.
pub fn candidates(shape: &StageShape) -> Vec<Placement> {
    if shape.has_upper() {
        vec![Placement::Pull, Placement::PushScan, Placement::Push]
    } else {
        vec![Placement::Pull, Placement::Push]
    }
}

/// How much faster pull must be predicted than the best push to be
/// chosen. A pushed stage runs on the devices' own threads beside the
/// host's joins, which the model does not see: at TPC-H SF1 on 4
/// embedded devices over 10 GbE, Q21 pulled three lineitem scans the
/// model predicted 1.17x faster pulled and ran 1.26x slower than push.
pub const PULL_MARGIN: f64 = 1.25;

/// Every candidate's prediction and the chosen one: the fastest push
/// (ties go to more work on the devices) that moves no more link bytes
/// than pull would (a stage never sends more than the pages it replaces),
/// unless pull beats it by [`PULL_MARGIN`].
pub fn choose(shape: &StageShape, machine: &Machine) -> (Prediction, Vec<Prediction>) {
    choose_encodings(shape, machine, &[shape.result_encoding()])
}

/// [`choose`], with every push priced once per result encoding in
/// `encodings`, so that compressing is chosen where it pays: it costs
/// the devices CPU time and saves link time and bytes.
pub fn choose_encodings(
    shape: &StageShape,
    machine: &Machine,
    encodings: &[ResultEncoding],
) -> (Prediction, Vec<Prediction>) {
    let mut all = vec![predict(shape, Placement::Pull, machine)];
    for placement in candidates(shape).into_iter().skip(1) {
        for &encoding in encodings {
            all.push(predict(&shape.with_encoding(encoding), placement, machine));
        }
    }
    let pull = all[0];
    let push = all[1..]
        .iter()
        .copied()
        .filter(|p| p.link_bytes <= pull.link_bytes)
        .reduce(|a, b| if b.total_secs <= a.total_secs { b } else { a });
    let best = match push {
        Some(push) if pull.total_secs * PULL_MARGIN >= push.total_secs => push,
        _ => pull,
    };
    (best, all)
}

/// The encoding of a stage's results under a placement the user fixed
/// (`--pushdown on`), priced once per encoding in `encodings`: the
/// fastest that moves no more link bytes than pull would, else the one
/// that moves the fewest. Pull's prediction comes first in the list.
pub fn choose_encoding(
    shape: &StageShape,
    placement: Placement,
    machine: &Machine,
    encodings: &[ResultEncoding],
) -> (Prediction, Vec<Prediction>) {
    assert!(!encodings.is_empty(), "at least one encoding");
    let pull = predict(shape, Placement::Pull, machine);
    let mut all = vec![pull];
    for &encoding in encodings {
        all.push(predict(&shape.with_encoding(encoding), placement, machine));
    }
    let encodings = all[1..].iter().copied();
    let best = encodings
        .clone()
        .filter(|p| p.link_bytes <= pull.link_bytes)
        .reduce(|a, b| if b.total_secs < a.total_secs { b } else { a })
        .or_else(|| encodings.reduce(|a, b| if b.link_bytes < a.link_bytes { b } else { a }))
        .expect("at least one encoding");
    (best, all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_wire::{StartCost, PROFILE_VERSION};

    /// Round numbers, so that the expectations below are done by hand.
    fn rates() -> ComputeRates {
        ComputeRates {
            decode_fixed_values_per_sec: 100e6,
            decode_fixed_bytes_per_sec: f64::INFINITY,
            decode_string_values_per_sec: 10e6,
            decode_string_bytes_per_sec: f64::INFINITY,
            filter_rows_per_sec: 100e6,
            aggregate_rows_per_sec: 50e6,
            aggregate_many_groups_rows_per_sec: 10e6,
            sort_rows_per_sec: 10e6,
            ipc_encode_bytes_per_sec: 1e9,
            ipc_decode_bytes_per_sec: 2e9,
            lz4_compress_bytes_per_sec: 500e6,
            zstd_compress_bytes_per_sec: 100e6,
            stages_started_per_sec: 1e3,
        }
    }

    fn machine(devices: usize, link: Option<f64>, shared: Option<u32>) -> Machine {
        Machine {
            devices: (0..devices)
                .map(|_| DeviceProfile {
                    version: PROFILE_VERSION,
                    storage_read_bytes_per_sec: 1e9,
                    threads: 1,
                    rates: rates(),
                    source: "test".into(),
                })
                .collect(),
            host: HostProfile {
                version: PROFILE_VERSION,
                threads: 2,
                rates: rates(),
                source: "test".into(),
                stage_starts: Default::default(),
            },
            link_bytes_per_sec: link,
            shared_cores: shared,
            starts: None,
        }
    }

    /// 2 devices × 100 M rows, 200 MB stored each; one fixed column,
    /// filter keeping `selectivity`, 8-byte rows.
    fn scan(selectivity: f64) -> StageShape {
        StageShape {
            devices: vec![
                DeviceInput {
                    rows: 100_000_000,
                    stored_bytes: 200_000_000,
                    string_stored_bytes: 0,
                };
                2
            ],
            fixed_columns: 1,
            string_columns: 0,
            filter: true,
            selectivity,
            scan_row_bytes: 8.0,
            aggregate: false,
            groups: 0,
            aggregates: 1,
            sort: false,
            rows_out: (200e6 * selectivity) as u64,
            out_row_bytes: 8.0,
            result_bytes_ratio: 1.0,
            result_codec: ResultCodec::None,
        }
    }

    fn lz4(bytes_ratio: f64) -> ResultEncoding {
        ResultEncoding {
            codec: ResultCodec::Lz4Frame,
            bytes_ratio,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn pull_reads_stored_pages_over_the_link_and_computes_on_the_host() {
        let p = predict(&scan(0.5), Placement::Pull, &machine(2, Some(100e6), None));
        // Device: 200 MB / 1 GB/s = 0.2 s. Link: 400 MB / 100 MB/s = 4 s.
        // Host: 200 M rows × (1/100e6 decode + 1/100e6 filter) = 4 s on 2 threads = 2 s.
        assert!(close(p.device_secs, 0.2), "{p:?}");
        assert!(close(p.link_secs, 4.0), "{p:?}");
        assert!(close(p.host_secs, 2.0), "{p:?}");
        // Fetching and decoding take turns: 4 s + 2 s, after the host
        // opened the 2 devices' files (1 ms each) on its 2 threads.
        assert!(close(p.total_secs, 6.0 + 0.001), "{p:?}");
        assert!(close(p.link_bytes, 400e6), "{p:?}");
    }

    #[test]
    fn push_ships_the_kept_rows() {
        let p = predict(&scan(0.5), Placement::Push, &machine(2, Some(100e6), None));
        // Device: 100 M × 2e-8 = 2 s compute + 50 M × 8 B / 1 GB/s = 0.4 s encode = 2.4 s
        // (read 0.2 s overlaps). Link: 2 × 400 MB / 100 MB/s = 8 s.
        // Host: 800 MB / 2 GB/s = 0.4 s on 2 threads = 0.2 s.
        assert!(close(p.device_secs, 2.4), "{p:?}");
        assert!(close(p.link_secs, 8.0), "{p:?}");
        assert!(close(p.host_secs, 0.2), "{p:?}");
        // The link sets the pace, after the devices started their
        // stages (1 ms each, in parallel).
        assert!(close(p.total_secs, 8.0 + 0.001), "{p:?}");
    }

    #[test]
    fn a_selective_filter_is_pushed_and_a_keep_all_scan_is_pulled() {
        // 1 GbE: both read 200 M values on the same 2 cores, but pull
        // also moves 400 MB over the link.
        let m = machine(2, Some(125e6), Some(2));
        let (best, _) = choose(&scan(0.001), &m);
        assert_eq!(best.placement, Placement::Push);
        let mut keep_all = scan(1.0);
        keep_all.filter = false;
        let (best, all) = choose(&keep_all, &m);
        assert_eq!(best.placement, Placement::Pull, "{all:?}");
    }

    #[test]
    fn results_are_compressed_where_the_link_pays_for_it() {
        let encodings = [ResultEncoding::PLAIN, lz4(0.25)];
        // 100 MB/s, half the rows kept: plain push ships 800 MB, twice
        // pull's pages; compressed, 200 MB in 3.2 s against pull's 6 s.
        let (best, all) = choose_encodings(&scan(0.5), &machine(2, Some(100e6), None), &encodings);
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(best.placement, Placement::Push, "{all:?}");
        assert!(best.compressed(), "{best:?}");
        assert!(close(best.link_bytes, 200e6), "{best:?}");
        // No link limit, a tenth kept: compressing only costs CPU time.
        let (best, all) = choose_encodings(&scan(0.1), &machine(2, None, None), &encodings);
        assert_eq!(best.placement, Placement::Push, "{all:?}");
        assert!(!best.compressed(), "{all:?}");
        assert!(!all[0].compressed(), "pull ships pages: {all:?}");
    }

    #[test]
    fn a_fixed_push_compresses_when_plain_results_outweigh_the_pages() {
        let encodings = [ResultEncoding::PLAIN, lz4(0.25)];
        // No link limit: plain is faster, but ships 800 MB against
        // pull's 400 MB.
        let m = machine(2, None, None);
        let (best, all) = choose_encoding(&scan(0.5), Placement::Push, &m, &encodings);
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(best.compressed(), "{all:?}");
        // A tenth kept: 160 MB plain fits, and is faster.
        let (best, all) = choose_encoding(&scan(0.1), Placement::Push, &m, &encodings);
        assert!(!best.compressed(), "{all:?}");
        // Only plain allowed: plain, whatever it ships.
        let (best, _) = choose_encoding(&scan(0.5), Placement::Push, &m, &[ResultEncoding::PLAIN]);
        assert!(!best.compressed());
    }

    #[test]
    fn the_slower_codec_pays_on_a_slow_link() {
        let zstd = ResultEncoding {
            codec: ResultCodec::Zstd,
            bytes_ratio: 0.125,
        };
        let encodings = [ResultEncoding::PLAIN, lz4(0.25), zstd];
        // Half kept, 800 MB of results over 2 devices. At 10 MB/s: LZ4
        // 200 MB in 20 s, Zstd 100 MB in 10 s (its 4 s of CPU hide).
        let (best, _) = choose_encodings(&scan(0.5), &machine(2, Some(10e6), None), &encodings);
        assert_eq!(best.codec, ResultCodec::Zstd, "{best:?}");
        assert!(close(best.link_secs, 10.0), "{best:?}");
        // At 1 GB/s the link is no bottleneck; Zstd's 4 s per device
        // (400 MB at 100 MB/s) lose to LZ4's 0.8 s.
        let m = machine(2, Some(1e9), None);
        let (best, _) = choose_encoding(&scan(0.5), Placement::Push, &m, &encodings);
        assert_eq!(best.codec, ResultCodec::Lz4Frame, "{best:?}");
    }

    #[test]
    fn a_stage_of_a_few_rows_costs_its_starts() {
        let mut tiny = scan(1.0);
        for d in &mut tiny.devices {
            *d = DeviceInput {
                rows: 25,
                stored_bytes: 1_000,
                string_stored_bytes: 0,
            };
        }
        tiny.rows_out = 50;
        // Pushed on devices of their own: both start at once, 1 ms; on one
        // shared core they take turns, 2 ms. Pulled: the host opens 2 files
        // on 2 threads, 1 ms. Reading and computing 50 rows is microseconds.
        let own = predict(&tiny, Placement::Push, &machine(2, None, None));
        assert!((own.total_secs - 0.001).abs() < 1e-5, "{own:?}");
        let shared = predict(&tiny, Placement::Push, &machine(2, None, Some(1)));
        assert!((shared.total_secs - 0.002).abs() < 1e-5, "{shared:?}");
        let pulled = predict(&tiny, Placement::Pull, &machine(2, None, None));
        assert!((pulled.total_secs - 0.001).abs() < 1e-5, "{pulled:?}");
        // Measured starts replace the profiles' parts: pushed 1 ms + 2 ×
        // 2 ms, pulled 2 × 1 ms.
        let mut measured = machine(2, None, Some(1));
        measured.starts = Some(StageStarts {
            push: StartCost {
                once_secs: 0.001,
                per_device_secs: 0.002,
            },
            pull: StartCost {
                once_secs: 0.0,
                per_device_secs: 0.001,
            },
        });
        let pushed = predict(&tiny, Placement::Push, &measured);
        assert!((pushed.total_secs - 0.005).abs() < 1e-5, "{pushed:?}");
        let pulled = predict(&tiny, Placement::Pull, &measured);
        assert!((pulled.total_secs - 0.002).abs() < 1e-5, "{pulled:?}");
    }

    #[test]
    fn shared_cores_bound_the_time_by_all_cpu_seconds() {
        let shape = scan(0.001);
        let p = predict(&shape, Placement::Push, &machine(2, None, Some(1)));
        // Devices: 2 × (2 s + 0.2 MB/1 GB/s) CPU; host: 1.6 MB / 2 GB/s. One core,
        // on which the two devices' starts (1 ms each) take turns.
        let cpu = 2.0 * (2.0 + 0.0008) + 0.0008 + 2.0 * 0.001;
        assert!(close(p.total_secs, cpu), "{p:?} vs {cpu}");
    }

    #[test]
    fn an_aggregate_above_the_scan_makes_three_candidates() {
        let mut shape = scan(1.0);
        shape.aggregate = true;
        shape.rows_out = 8;
        let m = machine(2, Some(50e6), None);
        let (best, all) = choose(&shape, &m);
        assert_eq!(all.len(), 3);
        assert_eq!(best.placement, Placement::Push);
        // Pull: 400 MB over 50 MB/s; push scan ships every row, 1.6 GB.
        assert!(close(all[0].link_secs, 8.0), "{all:?}");
        assert!(close(all[1].link_secs, 32.0), "{all:?}");
        // Push: device 100 M × (2e-8 + 1/50e6) = 4 s, plus 32 bytes to encode.
        assert!(close(best.device_secs, 4.0 + 32.0 / 1e9), "{best:?}");
    }

    #[test]
    fn decoding_costs_per_value_and_per_stored_byte() {
        let mut m = machine(1, None, None);
        m.devices[0].rates.decode_fixed_bytes_per_sec = 1e9;
        m.devices[0].rates.decode_string_bytes_per_sec = 100e6;
        let mut shape = scan(1.0);
        shape.filter = false;
        shape.string_columns = 1;
        shape.devices = vec![DeviceInput {
            rows: 10_000_000,
            stored_bytes: 300_000_000,
            string_stored_bytes: 100_000_000,
        }];
        shape.rows_out = 0;
        let p = predict(&shape, Placement::Push, &m);
        // 10 M × (1/100e6 + 1/10e6) + 200 MB / 1 GB/s + 100 MB / 100 MB/s
        // = 0.1 + 1 + 0.2 + 1 = 2.3 s (reading 300 MB takes 0.3 s).
        assert!(close(p.device_secs, 2.3), "{p:?}");
    }

    #[test]
    fn many_groups_aggregate_at_their_own_rate() {
        let mut shape = scan(1.0);
        shape.filter = false;
        shape.aggregate = true;
        shape.rows_out = 0;
        let m = machine(2, None, None);
        shape.groups = 4;
        let few = predict(&shape, Placement::Push, &m).device_secs;
        shape.groups = 1 << 20;
        let many = predict(&shape, Placement::Push, &m).device_secs;
        // 100 M rows at 50 M/s, then at 10 M/s, after 1 s of decoding.
        assert!(close(few, 3.0), "{few}");
        assert!(close(many, 11.0), "{many}");
        shape.aggregates = 3;
        let three = predict(&shape, Placement::Push, &m).device_secs;
        assert!(close(three, 31.0), "{three}");
    }

    #[test]
    fn compressed_results_cost_device_time_and_save_link_bytes() {
        let shape = scan(0.5).with_encoding(lz4(0.25));
        let p = predict(&shape, Placement::Push, &machine(2, Some(100e6), None));
        // 400 MB per device: +0.8 s of LZ4, a quarter of the bytes on the link.
        assert!(close(p.device_secs, 3.2), "{p:?}");
        assert!(close(p.link_secs, 2.0), "{p:?}");
    }

    #[test]
    fn a_push_that_moves_more_than_the_pages_is_not_chosen() {
        // Pushing every row of an 8-byte column stored in 2 bytes a row:
        // faster on an unlimited link, but 4x the link bytes.
        let mut shape = scan(1.0);
        shape.filter = false;
        let mut m = machine(2, None, None);
        // Push 1.8 s on the devices; pull 2 s on one host thread.
        m.host.threads = 1;
        let (best, all) = choose(&shape, &m);
        assert!(all[1].total_secs < all[0].total_secs, "{all:?}");
        assert!(all[1].link_bytes > all[0].link_bytes, "{all:?}");
        assert_eq!(best.placement, Placement::Pull);
    }

    #[test]
    fn pull_must_win_by_the_margin() {
        // Devices at half the host's rates: pushing keeps 20%, 320 MB of
        // results, and takes each device 100 M × 4e-8 s + 160 MB / 0.5 GB/s
        // = 4.32 s; pulling moves 400 MB and takes the host 2 s.
        let shape = scan(0.2);
        let at = |rate: Option<f64>| {
            let mut m = machine(2, rate, None);
            for d in &mut m.devices {
                d.rates.decode_fixed_values_per_sec /= 2.0;
                d.rates.filter_rows_per_sec /= 2.0;
                d.rates.ipc_encode_bytes_per_sec /= 2.0;
            }
            choose(&shape, &m).0.placement
        };
        // Unlimited: pull 2 s against 4.32 s, past the margin.
        assert_eq!(at(None), Placement::Pull);
        // 400 MB/s: pull 1 s + 2 s = 3 s; 1.44x faster.
        assert_eq!(at(Some(400e6)), Placement::Pull);
        // 250 MB/s: pull 1.6 s + 2 s = 3.6 s; 1.2x, within the margin.
        assert_eq!(at(Some(250e6)), Placement::Push);
    }

    #[test]
    fn scaling_devices_keeps_each_devices_share() {
        let shape = scan(0.5).with_devices(8);
        assert_eq!(shape.devices.len(), 8);
        assert_eq!(shape.rows_in(), 800_000_000);
        assert_eq!(shape.rows_out, 400_000_000);
        let m = machine(2, Some(100e6), None).with_devices(8, None);
        // Push: each device's time stays; the shared link carries 4x more.
        let two = predict(&scan(0.5), Placement::Push, &machine(2, Some(100e6), None));
        let eight = predict(&shape, Placement::Push, &m);
        assert!(close(eight.device_secs, two.device_secs), "{eight:?}");
        assert!(close(eight.link_secs, 4.0 * two.link_secs), "{eight:?}");
    }

    #[test]
    fn selectivity_sets_the_rows_a_scan_keeps() {
        let shape = scan(1.0).with_selectivity(0.01);
        assert_eq!(shape.rows_out, 2_000_000);
        let mut agg = scan(1.0);
        agg.aggregate = true;
        agg.rows_out = 8;
        assert_eq!(agg.with_selectivity(0.01).rows_out, 8);
    }

    #[test]
    fn no_devices_predict_nothing() {
        let mut shape = scan(0.5);
        shape.devices.clear();
        let (best, all) = choose(&shape, &machine(0, None, None));
        assert_eq!(all.len(), 2);
        assert_eq!(best.total_secs, 0.0);
    }
}
