//! Opening a data root as a SQL session, and the commands that write data.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use insitu_device::root::{create_root, device_count, open_root, root_settings, DeviceBudget};
use insitu_device::Device;
use insitu_device::{embedded, embedded_clients};
use insitu_flight::{ClusterFile, FlightDeviceClient};
use insitu_host::budget::{machine_memory_bytes, plan_budgets, BudgetRequest, Budgets};
use insitu_host::{DeviceClient, HostConfig, InsituHost, Pushdown, QueryStats};
use insitu_ingest::{
    gen_tpch as ingest_tpch, load_files, LayoutChoice, LoadOptions, PartitionSink, TpchOptions,
    TPCH_TABLES,
};
use insitu_link::LinkProfile;

use crate::output::print_batches;
use crate::units::human_bytes;
use crate::{DeviceArgs, Format};

fn data_home() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("insitu")
}

pub fn default_root() -> PathBuf {
    data_home().join("default")
}

/// Where `insitu demo` keeps TPC-H at `sf` on `devices` devices.
pub fn default_demo_root(sf: f64, devices: u32) -> PathBuf {
    data_home().join(format!("demo-tpch-sf{sf}-{devices}dev"))
}

/// Budgets for a command over `embedded_devices` devices in this process
/// (and device servers on this machine holding `local_servers_bytes`):
/// the flags, else the root's settings, else defaults fitted to this
/// machine. Prints the plan's note, once per process.
pub fn plan_memory(
    args: &DeviceArgs,
    embedded_devices: u32,
    local_servers_bytes: u64,
) -> Result<Budgets, String> {
    let settings = match &args.cluster {
        Some(_) => Default::default(),
        None => root_settings(&args.root).map_err(|e| e.to_string())?,
    };
    let cluster_host_mem = match &args.cluster {
        Some(path) => ClusterFile::load(path)
            .map_err(|e| e.to_string())?
            .host_mem(),
        None => None,
    };
    let request = BudgetRequest {
        host: args.host_mem.or(settings.host_mem).or(cluster_host_mem),
        device: args.mem.or(settings.device_mem),
        embedded_devices,
        local_servers_bytes,
    };
    // A machine whose memory cannot be read gets the defaults as they are.
    let machine = machine_memory_bytes().unwrap_or(u64::MAX / 2);
    let budgets = plan_budgets(&request, machine);
    if let Some(note) = &budgets.note {
        static NOTED: std::sync::Once = std::sync::Once::new();
        NOTED.call_once(|| eprintln!("{note}"));
    }
    Ok(budgets)
}

/// The device budget of `args` for a root of `devices` devices.
pub fn budget_for(args: &DeviceArgs, devices: u32) -> Result<DeviceBudget, String> {
    Ok(DeviceBudget {
        mem_bytes_max: plan_memory(args, devices, 0)?.device,
        threads: args.threads.max(1),
    })
}

/// The device budget of `args` for the root it names (which must exist).
pub fn budget(args: &DeviceArgs) -> Result<DeviceBudget, String> {
    let devices = device_count(&args.root)
        .map_err(|e| e.to_string())?
        .unwrap_or(1);
    budget_for(args, devices)
}

fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows ({per_sec}, eta {eta})")
            .expect("progress template"),
    );
    bar.set_message(what.to_string());
    bar
}

/// Connects to the device servers of a cluster file.
pub async fn connect_cluster(
    path: &Path,
    link: Option<LinkProfile>,
) -> Result<Vec<Arc<FlightDeviceClient>>, String> {
    insitu_flight::connect_cluster(path, link, Default::default())
        .await
        .map_err(|e| e.to_string())
}

/// What `gen tpch` generates.
#[derive(Debug, Clone)]
pub struct GenTpch {
    pub sf: f64,
    pub devices: u32,
    pub per_device: u32,
    pub replace: bool,
    pub layout: LayoutChoice,
}

impl GenTpch {
    /// Every table at `sf` in Parquet on `devices`, replacing what is there.
    pub fn parquet(sf: f64, devices: u32) -> Self {
        Self {
            sf,
            devices,
            per_device: 1,
            replace: true,
            layout: LayoutChoice::Parquet,
        }
    }
}

/// Generates TPC-H onto `sinks`, with a progress bar per table.
pub fn gen_tpch_onto<S: PartitionSink + ?Sized>(
    sinks: &[Arc<S>],
    gen: &GenTpch,
) -> Result<(), String> {
    let options = TpchOptions {
        scale_factor: gen.sf,
        partitions_per_device: gen.per_device,
        replace: gen.replace,
        layout: gen.layout.clone(),
        ..Default::default()
    };
    for table in TPCH_TABLES {
        let bar = progress_bar(insitu_ingest::tpch_expected_rows(table, gen.sf), table);
        let tick = |n: u64| bar.inc(n);
        ingest_tpch(sinks, &[table], &options, &tick).map_err(|e| e.to_string())?;
        bar.finish();
    }
    Ok(())
}

/// Generates TPC-H onto the root, with a progress bar per table.
pub fn gen_tpch_into(
    root: &Path,
    budget: &DeviceBudget,
    gen: &GenTpch,
) -> Result<Vec<Arc<Device>>, String> {
    let devs = create_root(root, gen.devices, budget).map_err(|e| e.to_string())?;
    gen_tpch_onto(&embedded(devs.clone(), LinkProfile::UNLIMITED), gen)?;
    Ok(devs)
}

/// Runs blocking ingest work off the async threads (Flight sinks block on
/// the runtime from there).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("ingest task failed: {e}"))?
}

pub async fn gen_tpch(args: &DeviceArgs, gen: GenTpch) -> Result<(), String> {
    let sf = gen.sf;
    if let Some(cluster) = &args.cluster {
        let clients = connect_cluster(cluster, None).await?;
        let n = clients.len();
        blocking(move || gen_tpch_onto(&clients, &gen)).await?;
        eprintln!("TPC-H SF {sf} on the {n} devices of {}", cluster.display());
        return Ok(());
    }
    let (root, devices) = (args.root.clone(), gen.devices);
    let budget = budget_for(args, devices)?;
    blocking(move || gen_tpch_into(&root, &budget, &gen).map(drop)).await?;
    eprintln!(
        "TPC-H SF {sf} on {devices} devices under {}",
        args.root.display()
    );
    Ok(())
}

pub async fn load(
    args: &DeviceArgs,
    table: &str,
    devices: u32,
    replace: bool,
    layout: LayoutChoice,
    files: &[PathBuf],
) -> Result<(), String> {
    let (table, files) = (table.to_string(), files.to_vec());
    let options = LoadOptions {
        replace,
        layout,
        ..Default::default()
    };
    let rows = if let Some(cluster) = &args.cluster {
        let clients = connect_cluster(cluster, None).await?;
        blocking(move || load_onto(&clients, &table, &options, &files)).await?
    } else {
        let (root, budget) = (args.root.clone(), budget_for(args, devices)?);
        blocking(move || {
            let devs = create_root(&root, devices, &budget).map_err(|e| e.to_string())?;
            load_onto(
                &embedded(devs, LinkProfile::UNLIMITED),
                &table,
                &options,
                &files,
            )
        })
        .await?
    };
    tracing::debug!(rows, "load finished");
    Ok(())
}

fn load_onto<S: PartitionSink + ?Sized>(
    devs: &[Arc<S>],
    table: &str,
    options: &LoadOptions,
    files: &[PathBuf],
) -> Result<u64, String> {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {human_pos} rows loaded ({per_sec})")
            .expect("template"),
    );
    let tick = |n: u64| bar.inc(n);
    load_files(devs, table, files, options, &tick).map_err(|e| e.to_string())?;
    bar.finish();
    eprintln!(
        "loaded {} rows into {table} on {} devices",
        bar.position(),
        devs.len()
    );
    Ok(bar.position())
}

/// The devices a command works on: in this process, or device servers.
#[derive(Debug, Clone)]
pub enum Target {
    Embedded(Vec<Arc<Device>>),
    Cluster(PathBuf),
}

impl Target {
    pub fn of(args: &DeviceArgs) -> Result<Self, String> {
        match &args.cluster {
            Some(c) => Ok(Target::Cluster(c.clone())),
            None => Ok(Target::Embedded(
                open_root(&args.root, &budget(args)?).map_err(|e| e.to_string())?,
            )),
        }
    }

    /// Clients behind links of `link`: for embedded devices, one shared
    /// throttle (the host's port, default unlimited); for a cluster, the
    /// file's per-device links unless `link` overrides them.
    pub async fn clients(
        &self,
        link: Option<LinkProfile>,
    ) -> Result<Vec<Arc<dyn DeviceClient>>, String> {
        match self {
            Target::Embedded(devices) => Ok(embedded_clients(
                devices.clone(),
                link.unwrap_or(LinkProfile::UNLIMITED),
            )),
            Target::Cluster(path) => Ok(connect_cluster(path, link)
                .await?
                .into_iter()
                .map(|c| c as Arc<dyn DeviceClient>)
                .collect()),
        }
    }
}

/// Opens the devices of `args` and starts a host over them.
pub async fn open_host(
    args: &DeviceArgs,
    link: Option<LinkProfile>,
    pushdown: Pushdown,
) -> Result<InsituHost, String> {
    let target = Target::of(args)?;
    let clients = target.clients(link).await?;
    let memory = HostMemorySettings::of(args, &target, &clients)?;
    host_with(clients, pushdown, &memory).await
}

/// The host's budget and spill root for a command.
#[derive(Debug, Clone)]
pub struct HostMemorySettings {
    pub mem_bytes_max: usize,
    pub spill_root: PathBuf,
    /// The host's profile kept in the root (embedded devices); measured
    /// when the session starts otherwise.
    pub host_profile: Option<insitu_wire::HostProfile>,
    /// Where the profile is kept, to save what the session measures.
    pub host_profile_path: Option<PathBuf>,
}

impl HostMemorySettings {
    /// For `target` as `args` name it: embedded devices share the
    /// machine with the host; so do device servers on loopback.
    pub fn of(
        args: &DeviceArgs,
        target: &Target,
        clients: &[Arc<dyn DeviceClient>],
    ) -> Result<Self, String> {
        match target {
            Target::Embedded(devices) => Ok(Self {
                mem_bytes_max: plan_memory(args, devices.len() as u32, 0)?.host,
                spill_root: args.root.join(insitu_device::root::HOST_SPILL_DIR),
                host_profile: Some(insitu_calibrate::host_profile(&args.root, host_threads())?),
                host_profile_path: Some(insitu_calibrate::host_profile_path(&args.root)),
            }),
            Target::Cluster(path) => {
                let file = ClusterFile::load(path).map_err(|e| e.to_string())?;
                let local: u64 = clients
                    .iter()
                    .filter(|c| {
                        file.devices
                            .iter()
                            .any(|d| d.id == c.id() && is_loopback(&d.endpoint))
                    })
                    .map(|c| c.capabilities().mem_bytes_max)
                    .sum();
                Ok(Self {
                    mem_bytes_max: plan_memory(args, 0, local)?.host,
                    spill_root: file.host_spill_root(path),
                    host_profile: None,
                    host_profile_path: None,
                })
            }
        }
    }
}

/// The host's memory settings for `target`, connecting to a cluster's
/// servers to read their budgets.
pub async fn host_memory_for(
    args: &DeviceArgs,
    target: &Target,
) -> Result<HostMemorySettings, String> {
    let clients = match target {
        Target::Embedded(_) => vec![],
        Target::Cluster(_) => target.clients(None).await?,
    };
    HostMemorySettings::of(args, target, &clients)
}

/// Threads the host computes with (DataFusion's target partitions).
pub fn host_threads() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Whether an endpoint URL names this machine.
fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host = rest.split(['/', ':']).next().unwrap_or("");
    let bracketed = rest.starts_with("[::1]");
    bracketed
        || host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub async fn host_with(
    clients: Vec<Arc<dyn DeviceClient>>,
    pushdown: Pushdown,
    memory: &HostMemorySettings,
) -> Result<InsituHost, String> {
    let config = HostConfig {
        pushdown,
        mem_bytes_max: memory.mem_bytes_max,
        profile: memory.host_profile.clone(),
        profile_path: memory.host_profile_path.clone(),
        spill_root: memory.spill_root.clone(),
        ..Default::default()
    };
    InsituHost::new(clients, config)
        .await
        .map_err(|e| e.to_string())
}

pub fn stats_footer(stats: &QueryStats, host: &InsituHost) -> String {
    let link = host
        .clients()
        .first()
        .map(|c| c.link().profile())
        .unwrap_or(LinkProfile::UNLIMITED);
    let mode = format!("pushdown {}", host.config().pushdown.name());
    format!(
        "{} rows in {:.3} s ({mode}, link {link}) | devices read {} rows, {} | link: {} to devices, {} to host | memory: {}",
        stats.result_rows,
        stats.wall_secs,
        stats.device_rows_read,
        human_bytes(stats.device_bytes_read),
        human_bytes(stats.link_bytes_to_device),
        human_bytes(stats.link_bytes_to_host),
        stats.memory_summary(),
    )
}

pub async fn run_and_print(host: &InsituHost, sql: &str, format: Format) -> Result<(), String> {
    let outcome = host.sql(sql).await.map_err(|e| e.to_string())?;
    print_batches(&outcome.schema, &outcome.batches, format)?;
    eprintln!("{}", stats_footer(&outcome.stats, host));
    Ok(())
}

/// Reads statements ending in `;` from stdin until EOF or `\q`.
pub async fn repl(host: &InsituHost, format: Format) -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut buffer = String::new();
    eprintln!(
        "insitu SQL ({} tables). End statements with ';', quit with \\q or Ctrl-D.",
        host.tables().len()
    );
    loop {
        eprint!(
            "{}",
            if buffer.is_empty() {
                "insitu> "
            } else {
                "   ...> "
            }
        );
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(());
        }
        if line.trim() == "\\q" {
            return Ok(());
        }
        buffer.push_str(&line);
        if line.trim_end().ends_with(';') {
            if let Err(e) = run_and_print(host, &buffer, format).await {
                eprintln!("error: {e}");
            }
            buffer.clear();
        }
    }
}
