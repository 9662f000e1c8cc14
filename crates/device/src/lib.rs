//! The device runtime: runs stage plans next to the data.
//!
//! A [`Device`] owns a directory (its "flash"), a manifest of the partitions
//! it holds, a memory budget (`mem_bytes_max`, enforced by a DataFusion
//! memory pool) and a thread budget (its own tokio runtime). It accepts a
//! stage plan as bytes, binds it to its own files, runs it and answers with
//! an Arrow IPC stream followed by its statistics. It never sees SQL.

mod binder;
mod client;
mod error;
mod hybrid_sort;
mod ipc;
mod job;
mod kernel_sorts;
mod pool;
pub mod root;
mod sort;
mod spill;
mod store;

use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use insitu_client::DeviceMessage;
use insitu_format::{load_manifest, store_manifest, PartitionWriter, WriterOptions};
use insitu_stage::{bind_stage, decode_stage_unbound, MeteredPool};
use insitu_wire::{
    Capabilities, DeviceProfile, DeviceStats, Encoding, FormatDescriptor, LayoutKind, Manifest,
    Operator, StagePlanEnvelope, PLAN_BYTES_MAX, PROTOCOL_VERSION,
};
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::mpsc;

pub use client::{embedded, embedded_clients, EmbeddedClient};
pub use error::{DeviceError, DeviceErrorKind, DeviceResult};
pub use hybrid_sort::HybridSortExec;
pub use insitu_wire::StageStats;
pub use ipc::{IpcChunker, RESULT_CHUNK_BYTES_MAX};
pub use kernel_sorts::{use_kernel_sorts, SortConfig};
use sort::widen_sort_output;
pub use sort::KernelSortExec;

use binder::{widening_sort, DeviceBinder, VerifiedSet};
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
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Corrupt, e))?;
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

    /// What this device runs and stores, as it advertises it to hosts.
    pub fn capabilities(&self) -> Capabilities {
        let mut operators = self.config.operators.clone();
        operators.sort();
        operators.dedup();
        Capabilities {
            protocol_version: PROTOCOL_VERSION,
            device_id: self.config.id,
            operators,
            data_types: SUPPORTED_TYPES.iter().map(|s| s.to_string()).collect(),
            layouts: vec![
                layout_name(LayoutKind::Parquet),
                layout_name(LayoutKind::Hybrid),
            ],
            encodings: [
                Encoding::Plain,
                Encoding::Dictionary,
                Encoding::Rle,
                Encoding::DeltaBinaryPacked,
            ]
            .into_iter()
            .map(encoding_name)
            .collect(),
            mem_bytes_max: self.config.mem_bytes_max as u64,
            threads: self.config.threads as u32,
            profile: Some(self.profile.clone()),
        }
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

    /// Accepts a stage plan envelope and starts running it on the device's
    /// threads. Results arrive on the returned channel; dropping it cancels
    /// the stage.
    pub fn execute(
        self: &Arc<Self>,
        envelope: &[u8],
    ) -> DeviceResult<mpsc::Receiver<DeviceResult<DeviceMessage>>> {
        let envelope = StagePlanEnvelope::decode(envelope, PLAN_BYTES_MAX)
            .map_err(|e| self.err(DeviceErrorKind::BadPlan, e.to_string()))?;
        if envelope.device != self.config.id {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!("stage plan is addressed to device {}", envelope.device),
            ));
        }
        let (tx, rx) = mpsc::channel(RESULT_CHUNKS_IN_FLIGHT);
        let this = Arc::clone(self);
        self.runtime().spawn(async move {
            let _active = ActiveStream::enter(&this.counters.active_streams);
            let outcome = this.run_stage(envelope, &tx).await;
            let c = &this.counters;
            match outcome {
                Ok(()) => c.stages_ok.fetch_add(1, Ordering::Relaxed),
                Err(e) if e.kind == DeviceErrorKind::Cancelled => {
                    c.stages_cancelled.fetch_add(1, Ordering::Relaxed)
                }
                Err(e) => {
                    c.stages_failed.fetch_add(1, Ordering::Relaxed);
                    let _ = tx.send(Err(e)).await;
                    0
                }
            };
        });
        Ok(rx)
    }

    /// Checks that the host's descriptors match what this device holds.
    fn check_descriptors(&self, descriptors: &[FormatDescriptor]) -> DeviceResult<Manifest> {
        let manifest = self.manifest();
        for d in descriptors {
            let local = manifest.partition(&d.table, d.partition).ok_or_else(|| {
                self.err(
                    DeviceErrorKind::NotFound,
                    format!("holds no partition {} of table {}", d.partition, d.table),
                )
            })?;
            if local.crc32 != d.crc32 || local.byte_size != d.byte_size || local.fields != d.fields
            {
                return Err(self.err(
                    DeviceErrorKind::Corrupt,
                    format!(
                        "table {} partition {}: the plan's descriptor (crc32 {:08x}, {} bytes) \
                         does not match the device's (crc32 {:08x}, {} bytes)",
                        d.table, d.partition, d.crc32, d.byte_size, local.crc32, local.byte_size
                    ),
                ));
            }
        }
        Ok(manifest)
    }

    async fn run_stage(
        &self,
        envelope: StagePlanEnvelope,
        tx: &mpsc::Sender<DeviceResult<DeviceMessage>>,
    ) -> DeviceResult<()> {
        let started = Instant::now();
        let bytes_before = self.bytes_read();
        let id = self.config.id;
        let df_err = |e| DeviceError::from_datafusion(id, self.config.mem_bytes_max, e);
        let manifest = self.check_descriptors(&envelope.descriptors)?;
        let query_pool = self.query_pool(&envelope.query_id);
        let state = self.ctx.state();
        let task_ctx = self.task_ctx_with(Arc::clone(&query_pool));
        // Decoded unbound, its shape chooses the binding: a full sort
        // straight over a scan reads decimals narrow (widening_sort).
        let unbound = decode_stage_unbound(&envelope.plan, &task_ctx).map_err(df_err)?;
        let widened = widening_sort(&unbound, &manifest);
        let binder = self.binder(manifest, widened.is_some());
        let plan = bind_stage(unbound, binder.as_ref()).map_err(df_err)?;
        self.check_operators(&plan)?;
        let plan = use_kernel_sorts(plan, &self.sort_config(false)).map_err(df_err)?;
        let plan = match widened {
            Some(schema) => widen_sort_output(plan, schema).map_err(df_err)?,
            None => plan,
        };
        let plan = FilterPushdown::new()
            .optimize(plan, state.config_options())
            .map_err(df_err)?;
        // The post-optimization pass pushes dynamic filters (a TopK's
        // running threshold) into the scan, which prunes row groups.
        let plan = FilterPushdown::new_post_optimization()
            .optimize(plan, state.config_options())
            .map_err(df_err)?;
        let root: Arc<dyn ExecutionPlan> = if plan.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(Arc::clone(&plan)))
        } else {
            Arc::clone(&plan)
        };
        tracing::info!(device = id, query = %envelope.query_id, "stage started");
        let mut stream = root.execute(0, task_ctx).map_err(df_err)?;
        let schema: SchemaRef = root.schema();
        let ipc_err =
            |e: arrow::error::ArrowError| self.err(DeviceErrorKind::Execution, e.to_string());
        let mut chunker =
            IpcChunker::start_with(&schema, envelope.result_codec).map_err(ipc_err)?;
        let send = |msg| async {
            tx.send(Ok(msg))
                .await
                .map_err(|_| self.err(DeviceErrorKind::Cancelled, "host went away"))
        };
        // Chunks waiting in the channel are device memory: account for the
        // most the channel can hold, so the budget covers them too.
        let in_flight = MemoryConsumer::new("stage result chunks")
            .register(&(Arc::clone(&query_pool) as Arc<dyn MemoryPool>));
        let (mut rows_out, mut chunks, mut largest) = (0u64, 0usize, 0usize);
        while let Some(batch) = stream.next().await {
            let batch: RecordBatch = batch.map_err(df_err)?;
            if batch.num_rows() == 0 {
                continue;
            }
            rows_out += batch.num_rows() as u64;
            for chunk in chunker.batch(&batch).map_err(ipc_err)? {
                chunks += 1;
                largest = largest.max(chunk.len());
                in_flight
                    .try_resize(largest * chunks.min(RESULT_CHUNKS_IN_FLIGHT))
                    .map_err(df_err)?;
                send(DeviceMessage::Ipc(chunk)).await?;
            }
        }
        drop(in_flight);
        send(DeviceMessage::Ipc(chunker.finish().map_err(ipc_err)?)).await?;
        let stats = StageStats {
            rows_read: rows_scanned(&plan),
            bytes_read: self.bytes_read() - bytes_before,
            rows_out,
            elapsed_us: started.elapsed().as_micros() as u64,
            operator_us: operator_times(&root),
            spilled_runs: metric_sum(&root, "spilled_runs"),
            spilled_bytes: metric_sum(&root, "spilled_bytes"),
            mem_peak_bytes: query_pool.peak() as u64,
        };
        self.record(&stats);
        tracing::info!(
            device = id,
            query = %envelope.query_id,
            rows_read = stats.rows_read,
            rows_out = stats.rows_out,
            elapsed_us = stats.elapsed_us,
            "stage finished"
        );
        send(DeviceMessage::Done(stats)).await
    }

    /// The pool view of query `id` on this device: the one its running
    /// stages share, or a new one.
    fn query_pool(&self, id: &str) -> Arc<MeteredPool> {
        let mut pools = self.query_pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pools.get(id).and_then(Weak::upgrade) {
            return pool;
        }
        pools.retain(|_, p| p.strong_count() > 0);
        let label = format!(
            "device {} memory budget (mem_bytes_max {} bytes)",
            self.config.id, self.config.mem_bytes_max
        );
        let pool = Arc::new(MeteredPool::new(
            Arc::clone(&self.pool) as Arc<dyn MemoryPool>,
            label,
        ));
        pools.insert(id.to_string(), Arc::downgrade(&pool));
        pool
    }

    /// A task context whose operators reserve through `pool`.
    fn task_ctx_with(&self, pool: Arc<MeteredPool>) -> Arc<TaskContext> {
        let mut runtime = RuntimeEnv::clone(&self.ctx.runtime_env());
        runtime.memory_pool = pool;
        let state = SessionStateBuilder::new_from_existing(self.ctx.state())
            .with_runtime_env(Arc::new(runtime))
            .build();
        Arc::new(TaskContext::from(&state))
    }

    /// How this device's sorts run; `top_k` forces kernel top-k.
    pub(crate) fn sort_config(&self, top_k: bool) -> SortConfig {
        SortConfig {
            threads: self.config.threads.max(1),
            top_k: top_k || self.config.kernel_top_k,
            spill_dir: Some(self.dir.clone()),
            mem_bytes_max: query_bytes_max(self.config.mem_bytes_max),
        }
    }

    /// Binds stage scans to this device's files, as described by `manifest`.
    fn binder(&self, manifest: Manifest, narrow_decimals: bool) -> Arc<DeviceBinder> {
        Arc::new(DeviceBinder {
            device: self.config.id,
            dir: self.dir.clone(),
            manifest,
            verified: Arc::clone(&self.verified),
            config: Arc::new(self.ctx.state().config_options().as_ref().clone()),
            target_partitions: self.config.threads.max(1),
            narrow_decimals,
        })
    }

    fn record(&self, stats: &StageStats) {
        let c = &self.counters;
        c.rows_in.fetch_add(stats.rows_read, Ordering::Relaxed);
        c.rows_out.fetch_add(stats.rows_out, Ordering::Relaxed);
        c.spilled_runs
            .fetch_add(stats.spilled_runs, Ordering::Relaxed);
        c.spilled_bytes
            .fetch_add(stats.spilled_bytes, Ordering::Relaxed);
        let mut times = c.operator_us.lock().expect("operator times");
        for (op, us) in &stats.operator_us {
            *times.entry(op.clone()).or_default() += us;
        }
    }

    /// Rejects a plan that uses an operator this device does not run.
    fn check_operators(&self, plan: &Arc<dyn ExecutionPlan>) -> DeviceResult<()> {
        let mut needed = BTreeSet::new();
        let mut unknown = None;
        let _ = plan.apply(|node| {
            match operator_of(node) {
                Ok(Some(op)) => {
                    needed.insert(op);
                }
                Ok(None) => {}
                Err(name) => unknown = Some(name),
            }
            Ok(TreeNodeRecursion::Continue)
        });
        if let Some(name) = unknown {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!("stage plan uses operator {name}, which this device does not run"),
            ));
        }
        for op in needed {
            if !self.config.operators.contains(&op) {
                return Err(self.err(
                    DeviceErrorKind::BadPlan,
                    format!("stage plan uses operator {op}, which this device does not advertise"),
                ));
            }
        }
        Ok(())
    }

    /// Reads a byte range of a partition file (pull mode: the host reads the
    /// device's files through the link, like a data-lake reader).
    pub async fn read_range(
        self: &Arc<Self>,
        table: &str,
        partition: u32,
        range: Range<u64>,
    ) -> DeviceResult<Bytes> {
        let d = self
            .manifest()
            .partition(table, partition)
            .cloned()
            .ok_or_else(|| {
                self.err(
                    DeviceErrorKind::NotFound,
                    format!("holds no partition {partition} of table {table}"),
                )
            })?;
        if range.start > range.end || range.end > d.byte_size {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!(
                    "range {range:?} is outside table {table} partition {partition} ({} bytes)",
                    d.byte_size
                ),
            ));
        }
        let path = object_store::path::Path::from_absolute_path(self.dir.join(&d.file))
            .map_err(|e| self.err(DeviceErrorKind::NotFound, e.to_string()))?;
        let store = Arc::clone(&self.store);
        let id = self.config.id;
        self.runtime()
            .spawn(async move { store.get_range(&path, range).await })
            .await
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Execution, e.to_string()))?
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Execution, e.to_string()))
    }

    /// Writes one partition of `table` from `batches` and records it in the
    /// manifest. The partition becomes visible only when complete.
    pub fn write_partition(
        &self,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        batches: impl IntoIterator<Item = Result<RecordBatch, arrow::error::ArrowError>>,
        options: &WriterOptions,
    ) -> DeviceResult<FormatDescriptor> {
        let io =
            |e: insitu_format::FormatError| self.err(DeviceErrorKind::Execution, e.to_string());
        let mut writer =
            PartitionWriter::create(&self.dir, table, partition, schema, options).map_err(io)?;
        for batch in batches {
            let batch = batch.map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))?;
            writer.write(&batch).map_err(io)?;
        }
        let descriptor = writer.finish().map_err(io)?;
        self.publish(descriptor)
    }

    /// Records a finished partition in the manifest: from now on it is visible.
    fn publish(&self, descriptor: FormatDescriptor) -> DeviceResult<FormatDescriptor> {
        let io =
            |e: insitu_format::FormatError| self.err(DeviceErrorKind::Execution, e.to_string());
        self.counters
            .partitions_ingested
            .fetch_add(1, Ordering::Relaxed);
        let mut manifest = self.manifest.lock().expect("manifest lock");
        let mut next = manifest.clone();
        next.upsert(descriptor.clone());
        store_manifest(&self.dir, &next).map_err(io)?;
        *manifest = next;
        Ok(descriptor)
    }

    /// Removes a table: first from the manifest (atomically), then its files.
    pub fn drop_table(&self, table: &str) -> DeviceResult<()> {
        let mut manifest = self.manifest.lock().expect("manifest lock");
        let Some(parts) = manifest.tables.get(table).cloned() else {
            return Ok(());
        };
        let mut next = manifest.clone();
        next.tables.remove(table);
        store_manifest(&self.dir, &next)
            .map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))?;
        *manifest = next;
        for d in parts {
            let _ = std::fs::remove_file(self.dir.join(&d.file));
        }
        Ok(())
    }
}

/// Removes partition files a crashed writer left behind (`.NNNNN.parquet.tmp`
/// in a table directory); they were never in the manifest.
fn remove_stale_temp_files(dir: &Path, manifest: &Manifest) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for table_dir in entries.flatten().filter(|e| e.path().is_dir()) {
        let Ok(files) = std::fs::read_dir(table_dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                tracing::info!(device = manifest.device, file = %f.path().display(), "removing stale temp file");
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
}

/// Arrow types a device reads and computes on (what its Parquet reader and
/// DataFusion's kernels handle).
const SUPPORTED_TYPES: &[&str] = &[
    "Boolean",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float16",
    "Float32",
    "Float64",
    "Decimal128",
    "Decimal256",
    "Date32",
    "Date64",
    "Timestamp",
    "Time32",
    "Time64",
    "Utf8",
    "LargeUtf8",
    "Utf8View",
    "Binary",
    "LargeBinary",
    "BinaryView",
    "FixedSizeBinary",
    "Dictionary",
];

fn layout_name(layout: LayoutKind) -> String {
    serde_json::to_value(layout)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn encoding_name(encoding: Encoding) -> String {
    serde_json::to_value(encoding)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The advertised operator a plan node needs; `Ok(None)` for plumbing
/// that moves batches without computing, `Err(name)` for anything else.
fn operator_of(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Operator>, String> {
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
    let op = match node.name() {
        "DataSourceExec" | "PartitionScanExec" | "HybridScanExec" => Operator::Scan,
        "FilterExec" => Operator::Filter,
        "ProjectionExec" => Operator::Projection,
        "LocalLimitExec" | "GlobalLimitExec" => Operator::Limit,
        // "SortExec" or "SortExec(TopK)"
        name if name.starts_with("SortExec")
            || name == "KernelSortExec"
            || name == "HybridSortExec" =>
        {
            Operator::Sort
        }
        "AggregateExec"
            if node
                .downcast_ref::<AggregateExec>()
                .is_some_and(|a| *a.mode() == AggregateMode::Partial) =>
        {
            Operator::PartialAggregate
        }
        "CoalesceBatchesExec" | "CoalescePartitionsExec" | "RepartitionExec" | "UnionExec" => {
            return Ok(None)
        }
        other => return Err(other.to_string()),
    };
    Ok(Some(op))
}

/// Compute time per operator of an executed plan, in microseconds.
fn operator_times(plan: &Arc<dyn ExecutionPlan>) -> BTreeMap<String, u64> {
    let mut times = BTreeMap::new();
    let _ = plan.apply(|node| {
        if let Some(ns) = node.metrics().and_then(|m| m.elapsed_compute()) {
            *times.entry(node.name().to_string()).or_default() += ns as u64 / 1000;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    times
}

/// The sum of the metric `name` over every operator of an executed plan.
fn metric_sum(plan: &Arc<dyn ExecutionPlan>, name: &str) -> u64 {
    let mut sum = 0u64;
    let _ = plan.apply(|node| {
        if let Some(m) = node.metrics() {
            sum += m.sum_by_name(name).map_or(0, |v| v.as_usize() as u64);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    sum
}

/// Rows the scans of an executed plan decoded: rows that survived
/// row-group and page pruning, whether or not the pushed filter kept them.
fn rows_scanned(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    let mut rows = 0u64;
    let _ = plan.apply(|node| {
        if node.children().is_empty() {
            if let Some(m) = node.metrics() {
                let pruned_by_filter = m
                    .sum_by_name("pushdown_rows_pruned")
                    .map_or(0, |v| v.as_usize());
                rows += (m.output_rows().unwrap_or(0) + pruned_by_filter) as u64;
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryLimit;

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
}
