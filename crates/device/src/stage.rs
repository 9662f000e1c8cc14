//! Running a stage: the envelope is checked against the manifest, the plan
//! decoded and bound to local files, its operators checked against what
//! this device advertises, then run on the device's threads within its
//! memory pool, streaming Arrow IPC chunks and ending with statistics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::StreamExt;
use insitu_client::DeviceMessage;
use insitu_stage::{bind_stage, decode_stage_unbound, MeteredPool};
use insitu_wire::{FormatDescriptor, Manifest, Operator, StagePlanEnvelope, PLAN_BYTES_MAX};
use tokio::sync::mpsc;

use crate::binder::{widening_sort, DeviceBinder};
use crate::sort::widen_sort_output;
use crate::{
    query_bytes_max, use_kernel_sorts, ActiveStream, Device, DeviceError, DeviceErrorKind,
    DeviceResult, IpcChunker, SortConfig, StageStats, RESULT_CHUNKS_IN_FLIGHT,
};

impl Device {
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
    pub(crate) fn binder(&self, manifest: Manifest, narrow_decimals: bool) -> Arc<DeviceBinder> {
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
