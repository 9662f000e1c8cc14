//! Sessions over devices: where the devices are ([`Target`]), what memory
//! host and devices get ([`HostMemorySettings`]), and the jobs that span
//! all devices (generate TPC-H, load files, sort a table).
//!
//! ```text
//!   DeviceOptions ──▶ Target::open ──▶ Embedded(devices in this process)
//!   (root | cluster,                │   or Cluster(cluster file)
//!    budgets)                       ▼
//!                     clients over links ──▶ InsituHost (SQL)
//!                                        └─▶ jobs: gen, load, sort_table
//! ```
//!
//! The CLI parses flags into [`DeviceOptions`], draws [`Progress`] and
//! prints; everything that decides lives here, with [`SessionError`]
//! naming what went wrong and where.

mod memory;
pub mod table_sort;
mod target;
mod write;

use std::path::PathBuf;

pub use memory::{
    budget, budget_for, host_memory_for, host_threads, host_with, open_host, plan_memory,
    HostMemorySettings,
};
pub use table_sort::{sort_table, TableSort, TableSortReport};
pub use target::{JobDevice, Target};
pub use write::{
    gen_tpch, gen_tpch_into, gen_tpch_onto, load, open_or_gen_tpch, open_or_gen_tpch_cluster,
    GenTpch, LoadRequest,
};

/// What went wrong in a session or job, naming the table, column, device
/// or file.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Root(#[from] insitu_device::root::RootError),
    #[error("{0}")]
    Device(#[from] insitu_device::DeviceError),
    #[error("{0}")]
    Flight(#[from] insitu_flight::FlightError),
    #[error("{0}")]
    Ingest(#[from] insitu_ingest::IngestError),
    #[error("{0}")]
    Calibrate(#[from] insitu_calibrate::CalibrateError),
    #[error("{0}")]
    Query(#[from] datafusion::error::DataFusionError),
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("table name '{name}' must be letters, digits and underscores")]
    BadTableName { name: String },
    #[error("no table {table} on these devices")]
    NoTable { table: String },
    #[error("table {table} already exists; choose another name for the sorted table")]
    TableExists { table: String },
    #[error("sort keys {keys}: {problem}")]
    BadSortKeys { keys: String, problem: String },
    #[error("table {table} has no column {column} to sort by")]
    NoColumn { table: String, column: String },
    #[error(
        "{} holds TPC-H with {orders} orders rows (SF {held}), not SF {sf} ({want} rows); \
         pass --sf {held} or another --root",
        root.display()
    )]
    OtherScaleFactor {
        root: PathBuf,
        orders: u64,
        held: f64,
        sf: f64,
        want: u64,
    },
    #[error("the staging writer of device {device} stopped")]
    StagingWriter { device: u32 },
    #[error("{what} failed: {message}")]
    Task { what: &'static str, message: String },
}

pub type SessionResult<T> = Result<T, SessionError>;

/// Where the devices are and what budget each gets.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Data root holding the device directories dev0, dev1, ...
    pub root: PathBuf,
    /// Cluster file listing device servers (instead of `root`).
    pub cluster: Option<PathBuf>,
    /// Memory budget per device (`mem_bytes_max`); `None`: the root's,
    /// else the default fitted to the machine.
    pub mem: Option<usize>,
    /// Memory budget of the host's operators (`host_mem_bytes_max`).
    pub host_mem: Option<usize>,
    /// Worker threads per device.
    pub threads: usize,
    /// Called with each note worth telling the user (a budget scaled
    /// down to fit the machine, say).
    pub notify: fn(&str),
}

impl DeviceOptions {
    /// The devices under `root`, with default budgets and no notes.
    pub fn root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            cluster: None,
            mem: None,
            host_mem: None,
            threads: 2,
            notify: |_| {},
        }
    }
}

/// What a long job reports as it goes; the CLI draws bars from it.
pub trait Progress: Send + Sync {
    /// A phase of `total` rows begins (`None`: not known in advance).
    fn phase(&self, name: &str, total: Option<u64>);
    /// `rows` more rows of the current phase are done.
    fn advance(&self, rows: u64);
    /// The current phase is over.
    fn done(&self);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn phase(&self, _: &str, _: Option<u64>) {}
    fn advance(&self, _: u64) {}
    fn done(&self) {}
}

fn data_home() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("insitu")
}

/// The data root commands use when none is named.
pub fn default_root() -> PathBuf {
    data_home().join("default")
}

/// Where `insitu demo` keeps TPC-H at `sf` on `devices` devices.
pub fn default_demo_root(sf: f64, devices: u32) -> PathBuf {
    data_home().join(format!("demo-tpch-sf{sf}-{devices}dev"))
}

/// Runs blocking work off the async threads (Flight sinks block on the
/// runtime from there).
async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> SessionResult<T> + Send + 'static,
) -> SessionResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SessionError::Task {
            what,
            message: e.to_string(),
        })?
}
