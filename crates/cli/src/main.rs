//! `insitu`: near-data analytics over computational storage devices.

mod allocator;
mod bench;
mod calibrate;
mod console;
mod demo;
mod error;
mod output;
mod server;
mod simulate;
mod sort;
mod terasort;
mod tpch_queries;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};
use error::CliResult;
use insitu_link::LinkProfile;

#[derive(Parser, Debug)]
#[command(
    name = "insitu",
    version,
    about = "Near-data analytics: SQL whose data-reducing work runs on the storage devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate benchmark data onto devices.
    Gen {
        #[command(subcommand)]
        what: GenWhat,
    },
    /// Load Parquet or CSV files into a table spread over the devices.
    Load(LoadArgs),
    /// Run SQL (interactive prompt when no query is given).
    Sql(SqlArgs),
    /// Sort a whole table into a new table, range-partitioned over the
    /// devices: reading it in partition order is globally sorted.
    Sort(sort::SortArgs),
    /// Write TeraSort records (100 bytes, 10-byte keys; gensort's format).
    Gensort(terasort::GensortArgs),
    /// Check a file of records for order; print its record count,
    /// duplicate keys and checksum (sum of CRC32s, as valsort does).
    Valsort(terasort::ValsortArgs),
    /// Sort a file of fixed-size records larger than memory (two-phase
    /// external merge sort; run size and fan-in from paper 001's model).
    Extsort(terasort::ExtsortArgs),
    /// Build TPC-H SF1 on 4 devices (once) and compare pushdown, pull and
    /// the cost model's choice.
    Demo(DemoArgs),
    /// Measure the devices' and the host's read and compute rates again
    /// and write their profiles (the cost model plans with them).
    Calibrate(calibrate::CalibrateArgs),
    /// Project a measured run's stages to other device counts, links and
    /// SmartSSD-like devices with the cost model; writes CSV and SVG.
    Simulate(simulate::SimulateArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Run a device as an Arrow Flight server.
    Device {
        #[command(subcommand)]
        what: DeviceWhat,
    },
    /// Start, stop and inspect local clusters of device servers.
    Cluster {
        #[command(subcommand)]
        what: ClusterWhat,
    },
}

#[derive(Subcommand, Debug)]
enum DeviceWhat {
    /// Serve one device directory over Arrow Flight until SIGTERM/SIGINT.
    Serve(server::ServeArgs),
}

#[derive(Subcommand, Debug)]
enum ClusterWhat {
    /// Start one device server process per device and write the cluster file.
    Up(server::ClusterUpArgs),
    /// Stop the device servers that `cluster up` started.
    Down(server::ClusterFileArgs),
    /// Show each device's counters.
    Status(server::ClusterFileArgs),
}

#[derive(Subcommand, Debug)]
enum GenWhat {
    /// All 8 TPC-H tables, generated in-process (dbgen-compatible).
    Tpch(GenTpchArgs),
}

#[derive(Subcommand, Debug)]
enum BenchWhat {
    /// TPC-H queries with pushdown on and off; writes JSON and Markdown.
    Tpch(bench::BenchArgs),
    /// Concurrent clients running TPC-H queries against a cluster.
    Load(bench::LoadArgs),
    /// One SQL query run repeatedly (results collected, not printed);
    /// prints each run's time, the median and the process's peak
    /// resident memory as JSON.
    Sql(bench::SqlBenchArgs),
}

/// Where the devices are and what budget each gets.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Data root holding the device directories dev0, dev1, ...
    #[arg(long, env = "INSITU_ROOT", default_value_os_t = insitu_session::default_root())]
    pub root: PathBuf,
    /// Cluster file listing device servers (instead of --root): work goes
    /// over Arrow Flight.
    #[arg(long, env = "INSITU_CLUSTER", conflicts_with = "root")]
    pub cluster: Option<PathBuf>,
    /// Memory budget per device (mem_bytes_max), e.g. 4GiB [default: the
    /// root's device_mem, else 4GiB, scaled down to fit the machine]
    #[arg(long, value_parser = units::parse_bytes)]
    pub mem: Option<usize>,
    /// Memory budget of the host's query operators (host_mem_bytes_max):
    /// past it they spill, e.g. 8GiB [default: the root's or cluster's
    /// host_mem, else what 80% of the machine's memory leaves beside the
    /// devices' budgets]
    #[arg(long, value_parser = units::parse_bytes)]
    pub host_mem: Option<usize>,
    /// Worker threads per device.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

impl DeviceArgs {
    /// The session library's options, telling notes on stderr.
    pub fn options(&self) -> insitu_session::DeviceOptions {
        insitu_session::DeviceOptions {
            root: self.root.clone(),
            cluster: self.cluster.clone(),
            mem: self.mem,
            host_mem: self.host_mem,
            threads: self.threads,
            notify: console::print_note,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// PAX: Parquet row groups of column chunks.
    Parquet,
    /// Key columns column-wise, the other columns row-wise (fast table sorts by the key).
    Hybrid,
}

/// The partition layout of new tables.
#[derive(Args, Debug, Clone)]
pub struct LayoutArgs {
    /// Partition layout of the new table(s).
    #[arg(long, value_enum, default_value_t = LayoutArg::Parquet)]
    pub layout: LayoutArg,
    /// Key columns the hybrid layout stores column-wise, comma-separated
    /// (default: the table's first column; with gen, each table keys on the
    /// listed columns it has).
    #[arg(long, value_delimiter = ',')]
    pub hybrid_key: Vec<String>,
}

impl LayoutArgs {
    pub fn choice(&self) -> CliResult<insitu_ingest::LayoutChoice> {
        match self.layout {
            LayoutArg::Parquet if !self.hybrid_key.is_empty() => {
                Err("--hybrid-key needs --layout hybrid".into())
            }
            LayoutArg::Parquet => Ok(insitu_ingest::LayoutChoice::Parquet),
            LayoutArg::Hybrid => Ok(insitu_ingest::LayoutChoice::Hybrid {
                keys: self.hybrid_key.clone(),
            }),
        }
    }
}

#[derive(Args, Debug)]
struct GenTpchArgs {
    /// Scale factor (1 = 6M lineitem rows).
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Number of devices to spread the tables over (with --cluster: the cluster's).
    #[arg(long, default_value_t = 4)]
    devices: u32,
    /// Partitions per device for every table but nation and region.
    #[arg(long, default_value_t = 1)]
    partitions_per_device: u32,
    /// Overwrite tables that already exist.
    #[arg(long)]
    replace: bool,
    #[command(flatten)]
    layout: LayoutArgs,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// Name of the table to create.
    #[arg(long)]
    table: String,
    /// Number of devices (creates the root if needed; with --cluster: the cluster's).
    #[arg(long, default_value_t = 4)]
    devices: u32,
    /// Overwrite the table if it exists.
    #[arg(long)]
    replace: bool,
    #[command(flatten)]
    layout: LayoutArgs,
    #[command(flatten)]
    device: DeviceArgs,
    /// Parquet (.parquet) or CSV with header (.csv) files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Where a query's data-reducing work runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PushdownArg {
    /// Per scan, whatever the cost model predicts fastest.
    Auto,
    /// On the devices, everything they can run.
    On,
    /// On the host: devices ship their stored pages.
    Off,
}

impl PushdownArg {
    pub fn mode(self) -> insitu_host::Pushdown {
        match self {
            PushdownArg::Auto => insitu_host::Pushdown::Auto,
            PushdownArg::On => insitu_host::Pushdown::On,
            PushdownArg::Off => insitu_host::Pushdown::Off,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

#[derive(Args, Debug)]
struct SqlArgs {
    /// The query; omit for an interactive prompt.
    query: Option<String>,
    /// Link between host and each device: unlimited, pcie3x4, 10gbe, sata3, 1gbe, or bytes/s
    /// (default: unlimited, or a cluster file's per-device links).
    #[arg(long)]
    link: Option<LinkProfile>,
    /// Where the data-reducing work runs: per scan as the cost model
    /// predicts fastest (auto), on the devices (on) or on the host (off).
    #[arg(long, value_enum, default_value_t = PushdownArg::Auto)]
    pushdown: PushdownArg,
    /// Output format of results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where the demo data lives, generated on the first run and reused
    /// after [default: demo-tpch-sf{SF}-{DEVICES}dev in the data directory]
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Links to compare over, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1gbe,10gbe")]
    pub link: Vec<LinkProfile>,
    /// Scale factor of the demo data.
    #[arg(long, default_value_t = 1.0)]
    pub sf: f64,
    /// Embedded devices the data is spread over.
    #[arg(long, default_value_t = 4)]
    pub devices: u32,
    /// Run on the device servers of this cluster file instead of embedded devices.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Memory budget of the host's query operators (host_mem_bytes_max)
    /// [default: what 80% of the machine's memory leaves beside the devices']
    #[arg(long, value_parser = units::parse_bytes)]
    pub host_mem: Option<usize>,
}

/// mimalloc or glibc's allocator (chosen and tuned in `allocator`),
/// counting heap bytes while `extsort` meters its sort (one relaxed load
/// per allocation otherwise).
#[global_allocator]
static ALLOCATOR: insitu_extsort::heap::MeteredAllocator<allocator::ProcessAllocator> =
    insitu_extsort::heap::MeteredAllocator(allocator::ProcessAllocator);

fn main() -> ExitCode {
    if let Err(e) = allocator::tune() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("INSITU_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // No colour codes in log files (device servers log to files).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tracing::debug!("{}", allocator::describe());
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> CliResult<()> {
    match cli.command {
        Command::Gen {
            what: GenWhat::Tpch(a),
        } => gen_tpch(a).await,
        Command::Load(a) => load(a).await,
        Command::Sql(a) => {
            let host =
                insitu_session::open_host(&a.device.options(), a.link, a.pushdown.mode()).await?;
            match a.query {
                Some(q) => console::run_and_print(&host, &q, a.format).await,
                None => console::repl(&host, a.format).await,
            }
        }
        Command::Sort(a) => sort::run(a).await,
        Command::Gensort(a) => console::blocking(move || terasort::gensort(a)).await,
        Command::Valsort(a) => console::blocking(move || terasort::valsort(a)).await,
        Command::Extsort(a) => console::blocking(move || terasort::extsort(a)).await,
        Command::Demo(a) => demo::run(a).await,
        Command::Calibrate(a) => calibrate::run(a).await,
        Command::Simulate(a) => simulate::run(a),
        Command::Bench {
            what: BenchWhat::Tpch(a),
        } => bench::run(a).await,
        Command::Bench {
            what: BenchWhat::Load(a),
        } => bench::load(a).await,
        Command::Bench {
            what: BenchWhat::Sql(a),
        } => bench::sql(a).await,
        Command::Device {
            what: DeviceWhat::Serve(a),
        } => server::serve(a).await,
        Command::Cluster { what } => match what {
            ClusterWhat::Up(a) => server::cluster_up(a),
            ClusterWhat::Down(a) => server::cluster_down(a),
            ClusterWhat::Status(a) => server::cluster_status(a).await,
        },
    }
}

async fn gen_tpch(a: GenTpchArgs) -> CliResult<()> {
    let gen = insitu_session::GenTpch {
        sf: a.sf,
        devices: a.devices,
        per_device: a.partitions_per_device,
        replace: a.replace,
        layout: a.layout.choice()?,
    };
    let options = a.device.options();
    let devices =
        insitu_session::gen_tpch(&options, gen, Arc::new(console::Bars::default())).await?;
    let place = match &options.cluster {
        Some(cluster) => format!("the {devices} devices of {}", cluster.display()),
        None => format!("{devices} devices under {}", options.root.display()),
    };
    eprintln!("TPC-H SF {} on {place}", a.sf);
    Ok(())
}

async fn load(a: LoadArgs) -> CliResult<()> {
    let request = insitu_session::LoadRequest {
        table: a.table.clone(),
        devices: a.devices,
        replace: a.replace,
        layout: a.layout.choice()?,
        files: a.files,
    };
    let bars = Arc::new(console::Bars::default());
    let (rows, devices) = insitu_session::load(&a.device.options(), request, bars).await?;
    eprintln!("loaded {rows} rows into {} on {devices} devices", a.table);
    Ok(())
}
