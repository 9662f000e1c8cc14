//! Jobs that write tables onto every device: TPC-H generation and loads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use insitu_device::root::{create_root, DeviceBudget};
use insitu_device::{embedded, Device};
use insitu_ingest::{
    gen_tpch as ingest_tpch, load_files, tpch_expected_rows, LayoutChoice, LoadOptions,
    PartitionSink, TpchOptions, TPCH_TABLES,
};
use insitu_link::LinkProfile;

use crate::target::connect;
use insitu_device::root::{device_count, open_root};
use insitu_host::DeviceClient;

use crate::{blocking, budget_for, DeviceOptions, Progress, SessionError, SessionResult, Target};

/// What `gen tpch` generates.
#[derive(Debug, Clone)]
pub struct GenTpch {
    pub sf: f64,
    /// Devices of a new root (a cluster has its own count).
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

/// Generates TPC-H onto `sinks`, one progress phase per table.
pub fn gen_tpch_onto<S: PartitionSink + ?Sized>(
    sinks: &[Arc<S>],
    gen: &GenTpch,
    progress: &dyn Progress,
) -> SessionResult<()> {
    let options = TpchOptions {
        scale_factor: gen.sf,
        partitions_per_device: gen.per_device,
        replace: gen.replace,
        layout: gen.layout.clone(),
        ..Default::default()
    };
    for table in TPCH_TABLES {
        progress.phase(table, Some(tpch_expected_rows(table, gen.sf)));
        let tick = |n: u64| progress.advance(n);
        let result = ingest_tpch(sinks, &[table], &options, &tick);
        progress.done();
        result?;
    }
    Ok(())
}

/// Generates TPC-H onto a new root of `gen.devices` devices at `root`.
pub fn gen_tpch_into(
    root: &Path,
    budget: &DeviceBudget,
    gen: &GenTpch,
    progress: &dyn Progress,
) -> SessionResult<Vec<Arc<Device>>> {
    let devs = create_root(root, gen.devices, budget)?;
    gen_tpch_onto(
        &embedded(devs.clone(), LinkProfile::UNLIMITED),
        gen,
        progress,
    )?;
    Ok(devs)
}

/// Generates TPC-H onto the cluster of `options`, or a root of
/// `gen.devices` devices. Returns how many devices hold it.
pub async fn gen_tpch(
    options: &DeviceOptions,
    gen: GenTpch,
    progress: Arc<dyn Progress>,
) -> SessionResult<usize> {
    if let Some(cluster) = &options.cluster {
        let clients = connect(cluster, None).await?;
        let n = clients.len();
        blocking("TPC-H generation", move || {
            gen_tpch_onto(&clients, &gen, progress.as_ref())
        })
        .await?;
        return Ok(n);
    }
    let (root, budget) = (options.root.clone(), budget_for(options, gen.devices)?);
    let n = gen.devices as usize;
    blocking("TPC-H generation", move || {
        gen_tpch_into(&root, &budget, &gen, progress.as_ref()).map(drop)
    })
    .await?;
    Ok(n)
}

/// Files to load into one table.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub table: String,
    /// Devices of a new root (a cluster has its own count).
    pub devices: u32,
    pub replace: bool,
    pub layout: LayoutChoice,
    /// Parquet (`.parquet`) or CSV with a header (`.csv`).
    pub files: Vec<PathBuf>,
}

/// Loads `request.files` onto the cluster of `options`, or a root
/// (created if needed). Returns the rows loaded and the device count.
pub async fn load(
    options: &DeviceOptions,
    request: LoadRequest,
    progress: Arc<dyn Progress>,
) -> SessionResult<(u64, usize)> {
    let load_options = LoadOptions {
        replace: request.replace,
        layout: request.layout.clone(),
        ..Default::default()
    };
    if let Some(cluster) = &options.cluster {
        let clients = connect(cluster, None).await?;
        let n = clients.len();
        let rows = blocking("load", move || {
            load_onto(&clients, &request, &load_options, progress.as_ref())
        })
        .await?;
        return Ok((rows, n));
    }
    let (root, budget) = (options.root.clone(), budget_for(options, request.devices)?);
    blocking("load", move || {
        let devs = create_root(&root, request.devices, &budget)?;
        let n = devs.len();
        let sinks = embedded(devs, LinkProfile::UNLIMITED);
        let rows = load_onto(&sinks, &request, &load_options, progress.as_ref())?;
        Ok((rows, n))
    })
    .await
}

fn load_onto<S: PartitionSink + ?Sized>(
    sinks: &[Arc<S>],
    request: &LoadRequest,
    options: &LoadOptions,
    progress: &dyn Progress,
) -> SessionResult<u64> {
    progress.phase("load", None);
    let rows = std::sync::atomic::AtomicU64::new(0);
    let tick = |n: u64| {
        rows.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        progress.advance(n);
    };
    let result = load_files(sinks, &request.table, &request.files, options, &tick);
    progress.done();
    result?;
    Ok(rows.into_inner())
}

/// TPC-H orders rows per unit of scale factor (dbgen's count, exact).
const ORDERS_ROWS_PER_SF: f64 = 1_500_000.0;

/// The devices of `options.root` if they hold TPC-H at `sf` on
/// `devices` devices; else TPC-H generated there first.
pub fn open_or_gen_tpch(
    options: &DeviceOptions,
    sf: f64,
    devices: u32,
    progress: &dyn Progress,
) -> SessionResult<Vec<Arc<Device>>> {
    let root = &options.root;
    let budget = budget_for(options, devices)?;
    if device_count(root)? == Some(devices) {
        let devs = open_root(root, &budget)?;
        if devs
            .iter()
            .all(|d| d.manifest().tables.contains_key("lineitem"))
        {
            check_scale_factor(root, &devs, sf)?;
            return Ok(devs);
        }
    }
    (options.notify)(&format!(
        "generating TPC-H SF {sf} on {devices} devices under {}",
        root.display()
    ));
    gen_tpch_into(root, &budget, &GenTpch::parquet(sf, devices), progress)
}

/// Refuses TPC-H data under `root` generated at another scale factor than
/// `sf`: reused silently, it would be reported as `sf`.
fn check_scale_factor(root: &Path, devices: &[Arc<Device>], sf: f64) -> SessionResult<()> {
    let orders: u64 = devices
        .iter()
        .map(|d| {
            let manifest = d.manifest();
            let parts = manifest.tables.get("orders");
            parts.map_or(0, |parts| parts.iter().map(|p| p.row_count).sum())
        })
        .sum();
    let want = (ORDERS_ROWS_PER_SF * sf).round() as u64;
    if orders == want {
        return Ok(());
    }
    Err(SessionError::OtherScaleFactor {
        root: root.to_path_buf(),
        orders,
        held: orders as f64 / ORDERS_ROWS_PER_SF,
        sf,
        want,
    })
}

/// The cluster of the file `path`, with TPC-H at `sf` generated over
/// Flight first if its devices hold none.
pub async fn open_or_gen_tpch_cluster(
    path: &Path,
    sf: f64,
    notify: fn(&str),
    progress: Arc<dyn Progress>,
) -> SessionResult<Target> {
    let clients = connect(path, None).await?;
    let mut have = true;
    for c in &clients {
        have &= c.manifest().await?.tables.contains_key("lineitem");
    }
    if !have {
        notify(&format!(
            "generating TPC-H SF {sf} on the devices of {}",
            path.display()
        ));
        blocking("TPC-H generation", move || {
            gen_tpch_onto(&clients, &GenTpch::parquet(sf, 0), progress.as_ref())
        })
        .await?;
    }
    Ok(Target::Cluster(path.to_path_buf()))
}
