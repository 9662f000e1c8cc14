//! The device runtime: runs stage plans next to the data.
//!
//! A [`Device`] owns a directory (its "flash"), a manifest of the partitions
//! it holds, a memory budget (`mem_bytes_max`, enforced by a DataFusion
//! memory pool) and a thread budget (its own tokio runtime). It accepts a
//! stage plan as bytes, binds it to its own files, runs it and answers with
//! an Arrow IPC stream followed by its statistics. It never sees SQL.

mod binder;
mod capabilities;
mod client;
mod error;
mod hybrid_sort;
mod ipc;
mod job;
mod kernel_sorts;
mod partitions;
mod pool;
pub mod root;
mod sort;
mod spill;
mod stage;
mod store;

use std::collections::HashMap;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use insitu_format::load_manifest;
use insitu_stage::MeteredPool;
use insitu_wire::{DeviceProfile, DeviceStats, Manifest, Operator};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

pub use client::{embedded, embedded_clients, EmbeddedClient};
pub use error::{DeviceError, DeviceErrorKind, DeviceResult};
pub use hybrid_sort::HybridSortExec;
pub use insitu_wire::StageStats;
pub use ipc::{IpcChunker, RESULT_CHUNK_BYTES_MAX};
pub use kernel_sorts::{use_kernel_sorts, SortConfig};
pub use sort::KernelSortExec;

use binder::VerifiedSet;
use partitions::remove_stale_temp_files;
use pool::PeakTrackingPool;
use store::CountingStore;

/// Result chunks a device runs ahead of a slow host (backpressure bound).
pub const RESULT_CHUNKS_IN_FLIGHT: usize = 8;

/// Most rows per batch a device's operators produce (`batch_rows_max`).
/// Also the Parquet reader's batch: its cost per batch (page and view
/// bookkeeping, one IPC chunk each) made a `SELECT *` of lineitem SF1 on
/// two devices take 0.586 and 0.611 s at 8192 rows against 0.539 and
/// 0.550 s at 32768, and ORDER BY l_shipmode 1.108-1.140 s against
/// 1.025-1.054 s; 65536 rows were no faster than 32768 (`insitu bench
/// sql ... --runs 5 --threads 1`, medians).
pub const BATCH_ROWS_MAX: usize = 32768;

/// Share of a device's `mem_bytes_max` its queries may not reserve, kept
/// for the kernels' scratch pool, which keeps pre-faulted buffers between
/// calls (fresh gigabyte buffers cost more in page zeroing than the sort
/// itself). Queries get the rest ([`query_bytes_max`]); the pool may
/// retain whatever part of the budget they have not reserved (see
/// `pool::scratch`), so reservations and retained scratch together stay
/// within the budget.
pub const SCRATCH_POOL_SHARE_OF_BUDGET: usize = 8;

/// Bytes of a device's budget its queries may not reserve.
pub fn unreservable_bytes(mem_bytes_max: usize) -> usize {
    mem_bytes_max / SCRATCH_POOL_SHARE_OF_BUDGET
}

/// Bytes of a device's budget its queries may reserve: the budget less
/// the scratch pool's share.
pub fn query_bytes_max(mem_bytes_max: usize) -> usize {
    mem_bytes_max - unreservable_bytes(mem_bytes_max)
}

/// Rows per batch for a memory budget: [`BATCH_ROWS_MAX`], or fewer under
/// 512 MiB (one row per 16 KiB of budget, at least 256), so that a sort
/// that spills holds dozens of batches.
pub fn batch_rows_for(mem_bytes_max: usize) -> usize {
    (mem_bytes_max >> 14).clamp(256, BATCH_ROWS_MAX)
}

/// Budgets and identity of a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub id: u32,
    /// Device DRAM available to query execution, in bytes.
    pub mem_bytes_max: usize,
    /// Worker threads of the device runtime.
    pub threads: usize,
    /// Evaluate filters inside the Parquet reader, decoding the remaining
    /// columns only for matching rows.
    pub late_materialization: bool,
    /// Operators this device runs (and advertises); plans using others are
    /// rejected.
    pub operators: Vec<Operator>,
    /// Run top-k (ORDER BY ... LIMIT k) with the kernels too. Off by
    /// default: DataFusion's TopK keeps a dynamic filter of its current
    /// k-th key that prunes row groups before they are read; a kernel
    /// top-k has to read every row first.
    pub kernel_top_k: bool,
}

impl DeviceConfig {
    pub fn new(id: u32) -> Self {
        Self {
            id,
            mem_bytes_max: 4 << 30,
            threads: 2,
            late_materialization: false,
            operators: Operator::ALL.to_vec(),
            kernel_top_k: false,
        }
    }
}

/// A device: one directory, one manifest, one memory and thread budget.
pub struct Device {
    config: DeviceConfig,
    dir: PathBuf,
    manifest: Mutex<Manifest>,
    ctx: SessionContext,
    runtime: Option<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    bytes_read: Arc<AtomicU64>,
    verified: VerifiedSet,
    pool: Arc<PeakTrackingPool>,
    /// Each running query's view of the pool, shared by its stages, so a
    /// stage can report the query's peak on this device.
    query_pools: Mutex<HashMap<String, Weak<MeteredPool>>>,
    counters: Counters,
    /// How fast this device reads and computes, for the host's cost model.
    profile: DeviceProfile,
}

/// Running totals behind [`Device::stats`].
#[derive(Debug, Default)]
struct Counters {
    rows_in: AtomicU64,
    rows_out: AtomicU64,
    stages_ok: AtomicU64,
    stages_failed: AtomicU64,
    stages_cancelled: AtomicU64,
    partitions_ingested: AtomicU64,
    active_streams: AtomicU64,
    spilled_runs: AtomicU64,
    spilled_bytes: AtomicU64,
    operator_us: Mutex<BTreeMap<String, u64>>,
}

/// Counts a stage as active from creation until drop.
struct ActiveStream<'a>(&'a AtomicU64);

impl<'a> ActiveStream<'a> {
    fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for ActiveStream<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}, {})", self.config.id, self.dir.display())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Dropping a runtime from inside another runtime must not block.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        pool::scratch::remove_budget(self.config.mem_bytes_max);
    }
}

impl Device {
    /// The id of the device in `dir`: its manifest's, which `requested`
    /// may confirm but not change; for a directory without a manifest,
    /// `requested` (default 0).
    pub fn id_for(dir: &Path, requested: Option<u32>) -> DeviceResult<u32> {
        let fallback = requested.unwrap_or(0);
        let has_manifest = dir
            .join(insitu_wire::MANIFEST_FILE)
            .try_exists()
            .map_err(|e| {
                DeviceError::new(
                    fallback,
                    DeviceErrorKind::NotFound,
                    format!("device directory {}: {e}", dir.display()),
                )
            })?;
        if !has_manifest {
            return Ok(fallback);
        }
        let stored = load_manifest(dir, fallback)
            .map_err(|e| DeviceError::new(fallback, DeviceErrorKind::Corrupt, e.to_string()))?
            .device;
        match requested {
            Some(r) if r != stored => Err(DeviceError::new(
                r,
                DeviceErrorKind::Config,
                format!("{} belongs to device {stored}, not {r}", dir.display()),
            )),
            _ => Ok(stored),
        }
    }

    /// Opens an existing device directory.
    pub fn open(dir: &Path, config: DeviceConfig) -> DeviceResult<Arc<Self>> {
        let id = config.id;
        if !dir.is_dir() {
            return Err(DeviceError::new(
                id,
                DeviceErrorKind::NotFound,
                format!("device directory {} does not exist", dir.display()),
            ));
        }
        let manifest = load_manifest(dir, id)
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Corrupt, e.to_string()))?;
        remove_stale_temp_files(dir, &manifest);
        // Runs of sorts that were running when their process died.
        spill::remove_stale_runs(dir);
        // Scans name files by absolute path (the object store's), so a
        // relative directory is resolved against the working directory now.
        let dir = std::path::absolute(dir).map_err(|e| {
            DeviceError::new(
                id,
                DeviceErrorKind::NotFound,
                format!("device directory {}: {e}", dir.display()),
            )
        })?;
        let mut profile = insitu_calibrate::device_profile(&dir, config.threads as u32)
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Corrupt, e.to_string()))?;
        // Threads are configured, not measured.
        profile.threads = config.threads.max(1) as u32;
        Self::start(&dir, config, manifest, profile)
    }

    /// Creates the device directory if needed, then opens it.
    pub fn create(dir: &Path, config: DeviceConfig) -> DeviceResult<Arc<Self>> {
        std::fs::create_dir_all(dir).map_err(|e| {
            DeviceError::new(
                config.id,
                DeviceErrorKind::NotFound,
                format!("cannot create device directory {}: {e}", dir.display()),
            )
        })?;
        Self::open(dir, config)
    }

    fn start(
        dir: &Path,
        config: DeviceConfig,
        manifest: Manifest,
        profile: DeviceProfile,
    ) -> DeviceResult<Arc<Self>> {
        let id = config.id;
        let internal = |e: String| DeviceError::new(id, DeviceErrorKind::Execution, e);
        let threads = config.threads.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name(format!("insitu-dev{id}"))
            .enable_all()
            .build()
            .map_err(|e| internal(format!("cannot start runtime: {e}")))?;
        let bytes_read = Arc::new(AtomicU64::new(0));
        let store: Arc<dyn ObjectStore> = Arc::new(CountingStore::new(
            Arc::new(LocalFileSystem::new()),
            Arc::clone(&bytes_read),
        ));
        let pool = Arc::new(PeakTrackingPool::new(Arc::new(TrackConsumersPool::new(
            GreedyMemoryPool::new(query_bytes_max(config.mem_bytes_max)),
            std::num::NonZeroUsize::new(3).expect("nonzero"),
        ))));
        let runtime_env = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::clone(&pool) as Arc<dyn MemoryPool>)
            .build_arc()
            .map_err(|e| internal(e.to_string()))?;
        let url = url::Url::parse("file://").expect("file url");
        runtime_env.register_object_store(&url, Arc::clone(&store));
        let mut session = SessionConfig::new()
            .with_target_partitions(threads)
            .with_batch_size(batch_rows_for(config.mem_bytes_max));
        let parquet = &mut session.options_mut().execution.parquet;
        // Late materialization (decode other columns only for rows that pass
        // the filter) measured slower on TPC-H Q6 at SF1 (0.26 s vs 0.15 s
        // with 4 devices on 2 cores), so it is opt-in.
        parquet.pushdown_filters = config.late_materialization;
        parquet.reorder_filters = true;
        let ctx = SessionContext::new_with_config_rt(session, runtime_env);
        // Undone when the device drops.
        pool::scratch::add_budget(config.mem_bytes_max);
        Ok(Arc::new(Self {
            config,
            dir: dir.to_path_buf(),
            manifest: Mutex::new(manifest),
            ctx,
            runtime: Some(runtime),
            store,
            bytes_read,
            verified: Arc::new(Mutex::new(HashSet::new())),
            pool,
            query_pools: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            profile,
        }))
    }

    pub fn id(&self) -> u32 {
        self.config.id
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> Manifest {
        self.manifest.lock().expect("manifest lock").clone()
    }

    /// Total bytes this device has read from its storage.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// How fast this device reads and computes.
    pub fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// Counters since the device started.
    pub fn stats(&self) -> DeviceStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceStats {
            device_id: self.config.id,
            bytes_read: self.bytes_read(),
            bytes_sent: 0,
            bytes_received: 0,
            rows_in: get(&c.rows_in),
            rows_out: get(&c.rows_out),
            stages_ok: get(&c.stages_ok),
            stages_failed: get(&c.stages_failed),
            stages_cancelled: get(&c.stages_cancelled),
            partitions_ingested: get(&c.partitions_ingested),
            active_streams: get(&c.active_streams),
            mem_in_use_bytes: self.pool.reserved() as u64,
            mem_peak_bytes: self.pool.peak() as u64,
            mem_bytes_max: self.config.mem_bytes_max as u64,
            operator_us: c.operator_us.lock().expect("operator times").clone(),
            spilled_runs: get(&c.spilled_runs),
            spilled_bytes: get(&c.spilled_bytes),
            // A device server fills in its process's (an embedded device
            // shares the host's).
            process_rss_bytes: 0,
            process_rss_peak_bytes: 0,
        }
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("runtime lives as long as the device")
    }

    fn err(&self, kind: DeviceErrorKind, msg: impl Into<String>) -> DeviceError {
        DeviceError::new(self.config.id, kind, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};

    /// The scratch pool's share is carved out of the budget: queries may
    /// reserve only the rest, and a reservation past it is refused.
    #[test]
    fn queries_reserve_the_budget_less_the_scratch_share() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 64 << 20;
        let config = DeviceConfig {
            mem_bytes_max: budget,
            ..DeviceConfig::new(0)
        };
        let device = Device::create(dir.path(), config).unwrap();
        let query = query_bytes_max(budget);
        assert_eq!(query + unreservable_bytes(budget), budget);
        assert!(query < budget);
        assert!(matches!(device.pool.memory_limit(), MemoryLimit::Finite(n) if n == query));
        let pool: Arc<dyn MemoryPool> = device.pool.clone();
        let reservation = MemoryConsumer::new("test").register(&pool);
        assert!(reservation.try_grow(query).is_ok());
        assert!(reservation.try_grow(1).is_err(), "past the query share");
        assert_eq!(device.sort_config(false).mem_bytes_max, query);
    }

    #[test]
    fn the_manifest_decides_the_id() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Device::id_for(dir.path(), None).unwrap(), 0);
        assert_eq!(Device::id_for(dir.path(), Some(5)).unwrap(), 5);
        insitu_format::store_manifest(dir.path(), &Manifest::new(3)).unwrap();
        assert_eq!(Device::id_for(dir.path(), None).unwrap(), 3);
        assert_eq!(Device::id_for(dir.path(), Some(3)).unwrap(), 3);
        let e = Device::id_for(dir.path(), Some(4)).unwrap_err();
        assert_eq!(e.kind, DeviceErrorKind::Config);
        assert!(e.to_string().contains("belongs to device 3, not 4"), "{e}");
        std::fs::write(dir.path().join(insitu_wire::MANIFEST_FILE), b"{").unwrap();
        let e = Device::id_for(dir.path(), None).unwrap_err();
        assert_eq!(e.kind, DeviceErrorKind::Corrupt);
    }
}
