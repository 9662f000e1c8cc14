//! [`KernelSortExec`]: a stage's sort, run with the insitu kernels.
//!
//! ```text
//!   KernelSortExec (one sorted output partition)
//!     |  1. collect the input, reserving device memory per batch (for
//!     |     the batch and its sorted copy); with a fetch of k: compact to
//!     |     the best k rows as it goes
//!     |  2. evaluate the sort keys, argsort them (radix, dictionary ranks,
//!     |     row keys for several columns; top-k by selection)
//!     |  3. shuffle: gather every column by the sorted indices, one
//!     |     output batch at a time; or, for an order of few ascending
//!     |     runs (a key of few values), scatter every row to its place
//!     |     in all output batches at once
//!     |  past the budget, with a spill directory: 1-3 on what fits, write
//!     |  it as a sorted run, go on; at the end merge the runs (crate::spill)
//!   input (coalesced to one partition)
//! ```
//!
//! The host sends a DataFusion `SortExec` inside the stage plan; the device
//! swaps it for this operator after decoding ([`use_kernel_sorts`]). The
//! host merges the devices' sorted streams with a sort-preserving merge.
//!
//! The input batches are never concatenated; only the key columns are.
//! How output batches are gathered depends on the sorted order
//! ([`insitu_kernels::SourceLayout`]):
//!
//! - packed rows (the default): the fixed-width parts of every column are
//!   packed once into rows of at most a cache line, and each output batch
//!   is gathered from them (one cache miss per row, not per row and column);
//! - columns: an order that steps forward one or two rows almost
//!   everywhere (input nearly sorted) gathers each column as a stream;
//! - scattered: an order of at most 16Ki ascending runs (a key of few
//!   values) copies every input row to its place in all output batches at
//!   once, reading each column once;
//! - an order equal to the input's sends the batches as zero-copy slices.
//!
//! A sort may output wider types than its input holds
//! ([`KernelSortExec::with_output_schema`]): decimals its scan read as
//! Decimal64 are sorted and moved as 8 bytes and written out as the
//! Decimal128 the plan asked for.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{new_empty_array, Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{cast, concat, concat_batches, SortColumn};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    apply_expression_roots, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use futures::StreamExt;
use insitu_kernels::{
    argsort_columns, concat_views, widens_to, GatherSource, Parallelism, SourceLayout,
};

use crate::spill::{merge_runs, reduce_runs, rows_within, KeyEncoder, SpillRuns};

/// A spilling sort writes its run batches at 1/32 of its budget, so a
/// merge holding two batches per run in 3/4 of the budget merges 12 runs
/// at once.
const MERGE_FAN_IN_TARGET: usize = 32;

/// Output batches in flight between the sorting thread and the stage.
const SORTED_BATCHES_IN_FLIGHT: usize = 4;

/// Rows buffered before a top-k sort compacts them: at least this many,
/// and at least twice k, so each compaction discards half or more.
const TOP_K_COMPACT_ROWS_MIN: usize = 64 * 1024;

/// Sorts its single input partition with the insitu kernels.
#[derive(Debug)]
pub struct KernelSortExec {
    input: Arc<dyn ExecutionPlan>,
    ordering: LexOrdering,
    fetch: Option<usize>,
    /// Threads the argsort may use (the device's thread budget).
    threads: usize,
    spill_dir: Option<PathBuf>,
    /// What the sort outputs: its input's schema, or one with some
    /// Decimal64 columns widened to Decimal128.
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl KernelSortExec {
    /// Sorts `input` (coalesced first if it has several partitions).
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        ordering: LexOrdering,
        fetch: Option<usize>,
        threads: usize,
    ) -> Self {
        let input: Arc<dyn ExecutionPlan> = if input.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(input))
        } else {
            input
        };
        let schema = input.schema();
        Self {
            input,
            properties: Arc::new(Self::properties_for(&schema, &ordering)),
            ordering,
            fetch,
            threads: threads.max(1),
            spill_dir: None,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn properties_for(schema: &SchemaRef, ordering: &LexOrdering) -> PlanProperties {
        PlanProperties::new(
            EquivalenceProperties::new_with_orderings(Arc::clone(schema), [ordering.clone()]),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        )
    }

    /// Outputs `schema`: the input's, but for Decimal64 columns widened
    /// to Decimal128 of the same precision and scale (see
    /// [`insitu_kernels::widens_to`]). A full sort only: a top-k's
    /// compactions would mix narrow and wide batches.
    pub fn with_output_schema(mut self, schema: SchemaRef) -> Result<Self> {
        let input = self.input.schema();
        let same_names =
            (input.fields().iter().zip(schema.fields())).all(|(i, o)| i.name() == o.name());
        let widens = (input.fields().iter().zip(schema.fields())).all(|(i, o)| {
            i.data_type() == o.data_type() || widens_to(i.data_type(), o.data_type())
        });
        if input.fields().len() != schema.fields().len() || !same_names || !widens {
            return internal_err!("KernelSortExec cannot output {schema:?} from input {input:?}");
        }
        if self.fetch.is_some() && schema != input {
            return internal_err!("KernelSortExec widens the output of full sorts only");
        }
        self.properties = Arc::new(Self::properties_for(&schema, &self.ordering));
        self.schema = schema;
        Ok(self)
    }

    /// The kernel sort that does what `sort` asks.
    pub fn from_sort_exec(sort: &SortExec, threads: usize) -> Self {
        Self::new(
            Arc::clone(sort.input()),
            sort.expr().clone(),
            sort.fetch(),
            threads,
        )
    }

    /// Spills sorted runs under `dir` when the input outgrows the budget.
    pub fn with_spill_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.spill_dir = dir;
        self
    }

    pub fn ordering(&self) -> &LexOrdering {
        &self.ordering
    }

    pub fn fetch(&self) -> Option<usize> {
        self.fetch
    }
}

/// `plan`, a stage whose root is a kernel sort, with that sort writing
/// out `schema` (see [`KernelSortExec::with_output_schema`]).
pub(crate) fn widen_sort_output(
    plan: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(sort) = plan.downcast_ref::<KernelSortExec>() else {
        return internal_err!(
            "a widening stage's root is {}, not a kernel sort",
            plan.name()
        );
    };
    let input = Arc::clone(&sort.input);
    let widened = KernelSortExec::new(input, sort.ordering.clone(), sort.fetch, sort.threads)
        .with_spill_dir(sort.spill_dir.clone())
        .with_output_schema(schema)?;
    Ok(Arc::new(widened))
}

impl DisplayAs for KernelSortExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "KernelSortExec: expr=[{}]", self.ordering)?;
        if let Some(k) = self.fetch {
            write!(f, ", fetch={k}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for KernelSortExec {
    fn name(&self) -> &str {
        "KernelSortExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.ordering.iter().map(|sort| &sort.expr), f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            DataFusionError::Internal(format!("KernelSortExec: {} children", c.len()))
        })?;
        Ok(Arc::new(
            Self::new(input, self.ordering.clone(), self.fetch, self.threads)
                .with_spill_dir(self.spill_dir.clone())
                .with_output_schema(Arc::clone(&self.schema))?,
        ))
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("KernelSortExec has one partition, not {partition}");
        }
        let input = self.input.execute(0, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new("KernelSortExec").register(context.memory_pool());
        let job = Arc::new(SortJob {
            schema: self.schema(),
            input_schema: self.input.schema(),
            widened_columns: (self.input.schema().fields().iter())
                .zip(self.schema.fields())
                .filter(|(i, o)| i.data_type() != o.data_type())
                .count(),
            ordering: self.ordering.clone(),
            fetch: self.fetch,
            threads: self.threads,
            batch_rows: context.session_config().batch_size().max(1),
            spill_dir: self.spill_dir.clone(),
            metrics: BaselineMetrics::new(&self.metrics, partition),
            spilled_runs: MetricBuilder::new(&self.metrics).counter("spilled_runs", partition),
            spilled_bytes: MetricBuilder::new(&self.metrics).counter("spilled_bytes", partition),
        });
        Ok(sorted_stream(self.schema(), move |tx| async move {
            job.run(input, reservation, tx).await
        }))
    }
}

/// One execution of a [`KernelSortExec`].
struct SortJob {
    /// What the sort outputs (see [`KernelSortExec::with_output_schema`]).
    schema: SchemaRef,
    input_schema: SchemaRef,
    /// Columns the output holds as Decimal128 and the input as Decimal64.
    widened_columns: usize,
    ordering: LexOrdering,
    fetch: Option<usize>,
    threads: usize,
    batch_rows: usize,
    spill_dir: Option<PathBuf>,
    metrics: BaselineMetrics,
    spilled_runs: Count,
    spilled_bytes: Count,
}

/// Where a sort's worker task sends its sorted batches.
pub(crate) type Sender = tokio::sync::mpsc::Sender<Result<RecordBatch>>;

/// The output stream of a sort whose work runs in its own task: `work`
/// sends batches through the channel (bounded, so a slow consumer holds
/// it back); its error, if any, ends the stream. The task starts on the
/// first poll.
pub(crate) fn sorted_stream<F, Fut>(schema: SchemaRef, work: F) -> SendableRecordBatchStream
where
    F: FnOnce(Sender) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(SORTED_BATCHES_IN_FLIGHT);
    let run = async move {
        if let Err(e) = work(tx.clone()).await {
            let _ = tx.send(Err(e)).await;
        }
    };
    let stream = futures::stream::once(async move {
        tokio::spawn(run);
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
    })
    .flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

impl SortJob {
    async fn run(
        self: Arc<Self>,
        mut input: SendableRecordBatchStream,
        reservation: MemoryReservation,
        tx: Sender,
    ) -> Result<()> {
        let mut buffered: Vec<RecordBatch> = vec![];
        let mut rows = 0usize;
        let mut spill: Option<SpillRuns> = None;
        let mut spilled_batch_bytes = 0;
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            // The batch, and its share of the sorted copy (wider by the
            // columns it widens).
            let need = 2 * batch.get_array_memory_size() + self.widened_bytes(batch.num_rows());
            if let Err(full) = reservation.try_grow(need) {
                let dir = match &self.spill_dir {
                    Some(dir) if self.fetch.is_none() && !buffered.is_empty() => dir.clone(),
                    _ => return Err(full),
                };
                let runs = match spill.take() {
                    Some(runs) => runs,
                    None => SpillRuns::create(&dir)?,
                };
                // Run batches small enough for a wide merge in this budget.
                let batch_bytes = reservation.size() / MERGE_FAN_IN_TARGET;
                spill = Some(
                    self.spill(runs, std::mem::take(&mut buffered), batch_bytes)
                        .await?,
                );
                spilled_batch_bytes = batch_bytes;
                rows = 0;
                reservation.free();
                reservation.try_grow(need)?; // one batch must fit
            }
            rows += batch.num_rows();
            buffered.push(batch);
            if let Some(k) = self.fetch {
                if rows >= TOP_K_COMPACT_ROWS_MIN.max(2 * k) {
                    let kept = self.sorted(std::mem::take(&mut buffered), Some(k))?;
                    rows = kept.num_rows();
                    reservation.try_resize(2 * kept.get_array_memory_size())?;
                    buffered.push(kept);
                }
            }
        }
        match spill {
            None => {
                let worker = Arc::clone(&self);
                tokio::task::spawn_blocking(move || worker.send_sorted(buffered, &tx))
                    .await
                    .map_err(|e| DataFusionError::Execution(format!("sort worker failed: {e}")))?
            }
            Some(runs) => {
                let runs = match buffered.is_empty() {
                    true => runs,
                    false => self.spill(runs, buffered, spilled_batch_bytes).await?,
                };
                reservation.free();
                // The merge takes at most 3/4 of what the sort held, and
                // leaves the rest to the stage's result chunks.
                let merge_bytes = spilled_batch_bytes * MERGE_FAN_IN_TARGET / 4 * 3;
                self.merge(runs, reservation, merge_bytes, tx).await
            }
        }
    }

    /// Sorts `batches` and writes them as one more run, in batches of
    /// about `batch_bytes`.
    async fn spill(
        self: &Arc<Self>,
        mut runs: SpillRuns,
        batches: Vec<RecordBatch>,
        batch_bytes: usize,
    ) -> Result<SpillRuns> {
        let worker = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let sorted = worker.sorted(batches, None)?;
            let rows = rows_within(&sorted, batch_bytes, worker.batch_rows);
            runs.write(&sorted, rows)?;
            worker.spilled_runs.add(1);
            let bytes = runs.runs.last().map_or(0, |r| r.bytes);
            worker.spilled_bytes.add(bytes as usize);
            Ok(runs)
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("spill worker failed: {e}")))?
    }

    /// Merges the runs: as many at once as `merge_bytes` holds two
    /// batches of each for (at least two), in passes if there are more.
    async fn merge(
        self: Arc<Self>,
        mut runs: SpillRuns,
        reservation: MemoryReservation,
        merge_bytes: usize,
        tx: Sender,
    ) -> Result<()> {
        let per_run = 2 * runs
            .runs
            .iter()
            .map(|r| r.batch_bytes_max)
            .max()
            .unwrap_or(0);
        reservation.try_grow(per_run / 2)?; // the output batch
        let mut fan_in = 0;
        while fan_in < runs.runs.len()
            && reservation.size() + per_run <= merge_bytes
            && reservation.try_grow(per_run).is_ok()
        {
            fan_in += 1;
        }
        if fan_in < 2 {
            reservation.try_grow(per_run * (2 - fan_in))?;
            fan_in = 2;
        }
        let worker = Arc::clone(&self);
        tokio::task::spawn_blocking(move || {
            let _timer = worker.metrics.elapsed_compute().timer();
            let keys = KeyEncoder::new(&worker.ordering, &worker.schema)?;
            let spilled: usize = runs.runs.iter().map(|r| r.rows).sum();
            let rows = runs.merge_batch_rows(worker.batch_rows);
            let last = reduce_runs(&mut runs, &worker.schema, &keys, rows, fan_in)?;
            let (mut merged, mut open) = (0, true);
            let mut emit = |batch: RecordBatch| {
                merged += batch.num_rows();
                worker.metrics.record_output(batch.num_rows());
                open = tx.blocking_send(Ok(batch)).is_ok();
                Ok(open)
            };
            merge_runs(&last, &worker.schema, &keys, rows, &mut emit)?;
            if open && merged != spilled {
                return internal_err!("merged {merged} rows of {spilled} spilled");
            }
            drop(runs); // removes the run files
            drop(reservation);
            Ok(())
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("merge worker failed: {e}")))?
    }

    /// Bytes the sorted copy of `rows` rows takes beyond the input's:
    /// 8 per row and column widened from Decimal64 to Decimal128.
    fn widened_bytes(&self, rows: usize) -> usize {
        rows * self.widened_columns * 8
    }

    /// `batches` sorted (first `limit` rows), as one batch.
    fn sorted(&self, batches: Vec<RecordBatch>, limit: Option<usize>) -> Result<RecordBatch> {
        let sorted = self.sort_order(batches, limit)?;
        let _timer = self.metrics.elapsed_compute().timer();
        match sorted {
            Sorted::InOrder { batches, rows } => {
                let kept: Vec<RecordBatch> = slices_of(&batches, rows, usize::MAX)
                    .map(|b| widen(b, &self.schema))
                    .collect::<Result<_>>()?;
                Ok(concat_batches(&self.schema, &kept)?)
            }
            Sorted::Gather { source, order } => Ok(source.gather(&order)?),
            // One batch of every row: a single scattered part.
            Sorted::Scatter { source, order } => match source.scatter(&order, usize::MAX)?.next() {
                Some(batch) => Ok(batch?),
                None => internal_err!("a scatter of {} rows gave no batch", order.len()),
            },
        }
    }

    /// Sorts `batches` and sends them through `tx` a batch of `batch_rows`
    /// at a time, each gathered just before it is sent: no sorted copy of
    /// the whole input is ever built, and the consumer works on the first
    /// batches while later ones are gathered. Input in key order already
    /// goes out as slices of its own batches.
    fn send_sorted(&self, batches: Vec<RecordBatch>, tx: &Sender) -> Result<()> {
        let batch_rows = self.batch_rows.max(1);
        let send = |batch: RecordBatch| {
            self.metrics.record_output(batch.num_rows());
            tx.blocking_send(Ok(batch)).is_ok() // false: the stage was cancelled
        };
        match self.sort_order(batches, self.fetch)? {
            Sorted::InOrder { batches, rows } => {
                for slice in slices_of(&batches, rows, batch_rows) {
                    if !send(widen(slice, &self.schema)?) {
                        break;
                    }
                }
            }
            Sorted::Gather { source, order } => {
                for chunk in order.chunks(batch_rows) {
                    let batch = {
                        let _timer = self.metrics.elapsed_compute().timer();
                        source.gather(chunk)?
                    };
                    if !send(batch) {
                        break;
                    }
                }
            }
            Sorted::Scatter { source, order } => {
                let mut batches = {
                    let _timer = self.metrics.elapsed_compute().timer();
                    source.scatter(&order, batch_rows)?
                };
                loop {
                    let batch = {
                        let _timer = self.metrics.elapsed_compute().timer();
                        batches.next().transpose()?
                    };
                    if !batch.is_some_and(send) {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// The batches prepared for gathering, and the order of their rows
    /// (the first `limit` only); or the batches as they are, when that
    /// order is theirs.
    fn sort_order(&self, batches: Vec<RecordBatch>, limit: Option<usize>) -> Result<Sorted> {
        let _timer = self.metrics.elapsed_compute().timer();
        let columns = self
            .ordering
            .iter()
            .map(|e| {
                let parts = batches
                    .iter()
                    .map(|b| e.expr.evaluate(b)?.into_array(b.num_rows()))
                    .collect::<Result<Vec<_>>>()?;
                let values = match parts.is_empty() {
                    true => new_empty_array(&e.expr.data_type(&self.input_schema)?),
                    false => concat_keys(&parts)?,
                };
                Ok(SortColumn {
                    values,
                    options: Some(e.options),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let order: Vec<u32> = match rows {
            0 => vec![],
            _ => argsort_columns(&columns, limit, Parallelism(self.threads))?,
        };
        drop(columns);
        // Input in key order already (data stored sorted, e.g. by time)
        // goes out as it is: ORDER BY l_orderkey on TPC-H SF1 lineitem,
        // two devices, took 1.04-1.09 s, as long as a plain SELECT * of
        // it (1.02 s), instead of 1.34 s gathering from the batches.
        if is_identity(&order) {
            return Ok(Sorted::InOrder {
                batches,
                rows: order.len(),
            });
        }
        // Input that was nearly sorted already gathers from the batches as
        // a stream: packing it into rows would only cost a copy into fresh
        // memory (ORDER BY l_orderkey on TPC-H lineitem, which is generated
        // in that order, before it went out as it is: 1.01-1.05 s instead
        // of 1.12-1.19 s, SF1 on two devices, medians of 5).
        // An order of few ascending runs (a key of few values) is written
        // at once by scattering, in one pass over the input; a top-k's
        // few rows are gathered from the batches instead.
        let layout = match SourceLayout::for_order(&order) {
            SourceLayout::Scattered if order.len() < rows => SourceLayout::Columns,
            layout => layout,
        };
        let source = GatherSource::with_layout(Arc::clone(&self.schema), &batches, layout)?;
        drop(batches);
        Ok(match layout {
            SourceLayout::Scattered => Sorted::Scatter { source, order },
            _ => Sorted::Gather { source, order },
        })
    }
}

/// A key column's parts (one per batch) as one array: view columns
/// through [`concat_views`], which lists the data buffers the batches
/// share once, the rest through Arrow's `concat`.
fn concat_keys(parts: &[ArrayRef]) -> Result<ArrayRef> {
    Ok(match parts[0].data_type() {
        DataType::Utf8View => {
            let views: Vec<_> = parts.iter().map(|p| p.as_string_view()).collect();
            Arc::new(concat_views(&views)?)
        }
        DataType::BinaryView => {
            let views: Vec<_> = parts.iter().map(|p| p.as_binary_view()).collect();
            Arc::new(concat_views(&views)?)
        }
        _ => {
            let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            concat(&parts)?
        }
    })
}

/// `batch` with the columns `schema` holds wider cast to it (a copy of
/// those columns; the rest shared).
fn widen(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let columns = (batch.columns().iter().zip(schema.fields()))
        .map(|(c, f)| match c.data_type() == f.data_type() {
            true => Ok(Arc::clone(c)),
            false => cast(c, f.data_type()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// What a sort hands on.
enum Sorted {
    /// The first `rows` rows of the input are its sorted order already.
    InOrder {
        batches: Vec<RecordBatch>,
        rows: usize,
    },
    /// The input prepared for gathering, and the order to gather it in.
    Gather {
        source: GatherSource,
        order: Vec<u32>,
    },
    /// The input left in its batches, and an order of few ascending runs
    /// (all of its rows) to scatter them in.
    Scatter {
        source: GatherSource,
        order: Vec<u32>,
    },
}

/// `order` is `0, 1, 2, ...`: the rows are in sorted order as they lie.
fn is_identity(order: &[u32]) -> bool {
    order.iter().enumerate().all(|(i, &row)| row as usize == i)
}

/// The first `rows` rows of `batches`, as zero-copy slices of at most
/// `batch_rows` rows that never span two batches.
fn slices_of(
    batches: &[RecordBatch],
    rows: usize,
    batch_rows: usize,
) -> impl Iterator<Item = RecordBatch> + '_ {
    let mut left = rows;
    batches.iter().flat_map(move |batch| {
        let take = batch.num_rows().min(left);
        left -= take;
        (0..take)
            .step_by(batch_rows)
            .map(move |at| batch.slice(at, batch_rows.min(take - at)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{use_kernel_sorts, SortConfig};
    use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
    use arrow::compute::{concat_batches, SortOptions};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_expr::PhysicalSortExpr;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;
    use rand::{Rng, SeedableRng};

    /// `batches` batches of random rows with ties, nulls and NaN.
    fn input(batches: usize, rows: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("k", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut next_id = 0i64;
        let out = (0..batches)
            .map(|_| {
                let ids: Vec<i64> = (0..rows as i64).map(|i| next_id + i).collect();
                next_id += rows as i64;
                let k: Vec<Option<i64>> = (0..rows)
                    .map(|_| rng.random_bool(0.9).then(|| rng.random_range(-50..50)))
                    .collect();
                let f: Vec<Option<f64>> = (0..rows)
                    .map(|_| match rng.random_range(0..10) {
                        0 => None,
                        1 => Some(f64::NAN),
                        _ => Some(rng.random_range(-3..3) as f64 * 0.5),
                    })
                    .collect();
                let s: Vec<Option<String>> = (0..rows)
                    .map(|_| {
                        rng.random_bool(0.95)
                            .then(|| format!("w{}", rng.random_range(0..9)))
                    })
                    .collect();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(k)),
                    Arc::new(Float64Array::from(f)),
                    Arc::new(StringArray::from(s)),
                ];
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect();
        (schema, out)
    }

    fn ordering(schema: &SchemaRef) -> LexOrdering {
        let key = |name: &str, descending: bool, nulls_first: bool| PhysicalSortExpr {
            expr: col(name, schema).unwrap(),
            options: SortOptions {
                descending,
                nulls_first,
            },
        };
        LexOrdering::new(vec![
            key("s", true, false),
            key("k", false, true),
            key("id", false, false), // unique: one right answer
        ])
        .unwrap()
    }

    async fn run(plan: Arc<dyn ExecutionPlan>) -> RecordBatch {
        let ctx = SessionContext::new();
        let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
        concat_batches(&plan.schema(), &batches).unwrap()
    }

    #[tokio::test]
    async fn kernel_sort_and_top_k_match_datafusion_sort() {
        // 3 partitions of 12 x 7_001 rows: enough to trigger top-k compaction.
        let (schema, batches) = input(36, 7_001);
        let partitions: Vec<Vec<RecordBatch>> = batches.chunks(12).map(|c| c.to_vec()).collect();
        let source =
            || MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        let order = ordering(&schema);
        for fetch in [None, Some(0), Some(1), Some(1000), Some(300_000)] {
            let ours = run(Arc::new(KernelSortExec::new(
                source(),
                order.clone(),
                fetch,
                2,
            )))
            .await;
            if fetch == Some(0) {
                // DataFusion's TopK has no k = 0 to compare with.
                assert_eq!(ours.num_rows(), 0);
                continue;
            }
            let merged = Arc::new(CoalescePartitionsExec::new(source()));
            let reference = run(Arc::new(
                SortExec::new(order.clone(), merged).with_fetch(fetch),
            ))
            .await;
            assert_eq!(ours.num_rows(), reference.num_rows(), "fetch {fetch:?}");
            assert_eq!(ours, reference, "fetch {fetch:?}");
        }
    }

    /// Input already in key order goes out as slices of its own batches,
    /// with and without a fetch (past 64Ki rows a fetch compacts through
    /// `sorted` first); input nearly in key order is gathered from its
    /// batches (`SourceLayout::Columns`) rather than through packed rows.
    /// The answer is DataFusion's either way.
    #[tokio::test]
    async fn kernel_sort_of_presorted_input_matches_datafusion_sort() {
        let (schema, batches) = input(12, 7_001);
        let ids = |b: &RecordBatch| b.column(0).to_data().buffers()[0].as_ptr();
        let input_ids: Vec<_> = batches.iter().map(ids).collect();
        let partitions = vec![batches];
        let source =
            || MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        for (descending, fetch) in [
            (false, None),
            (false, Some(1000)),
            (true, None),
            (true, Some(9)),
        ] {
            let order = LexOrdering::new(vec![PhysicalSortExpr {
                expr: col("id", &schema).unwrap(),
                options: SortOptions {
                    descending,
                    nulls_first: false,
                },
            }])
            .unwrap();
            let plan = Arc::new(KernelSortExec::new(source(), order.clone(), fetch, 2));
            let ctx = SessionContext::new();
            let out = collect(plan, ctx.task_ctx()).await.unwrap();
            if !descending && fetch.is_none() {
                assert!(out.len() >= 12, "{} batches", out.len());
                assert!(
                    out.iter().all(|b| input_ids.contains(&ids(b))),
                    "not copied"
                );
            }
            let ours = concat_batches(&schema, &out).unwrap();
            let reference = run(Arc::new(SortExec::new(order, source()).with_fetch(fetch))).await;
            assert_eq!(ours.num_rows(), fetch.unwrap_or(12 * 7_001));
            assert_eq!(ours, reference, "descending {descending}, fetch {fetch:?}");
        }
        let ascending: Vec<u32> = (0..6 * 7_001).collect();
        assert_eq!(SourceLayout::for_order(&ascending), SourceLayout::Columns);
        assert!(is_identity(&ascending) && is_identity(&[]));
        assert!(!is_identity(&[0, 2, 1]) && !is_identity(&[1]));
    }

    /// Sorted by a key of few values (then by the row's id, so the order
    /// is a few ascending runs), the input is scattered: batches of the
    /// largest power of two of rows up to the session's batch size. The
    /// answer is DataFusion's.
    #[tokio::test]
    async fn kernel_sort_by_a_key_of_few_values_scatters() {
        let (schema, batches) = input(12, 7_001);
        let partitions = vec![batches];
        let source =
            || MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        let key = |name: &str, descending: bool| PhysicalSortExpr {
            expr: col(name, &schema).unwrap(),
            options: SortOptions {
                descending,
                nulls_first: false,
            },
        };
        let order = LexOrdering::new(vec![key("s", true), key("id", false)]).unwrap();
        for fetch in [None, Some(5000)] {
            let plan = Arc::new(KernelSortExec::new(source(), order.clone(), fetch, 2));
            let config = datafusion::prelude::SessionConfig::new().with_batch_size(1000);
            let ctx = SessionContext::new_with_config(config);
            let out = collect(plan, ctx.task_ctx()).await.unwrap();
            let ours = concat_batches(&schema, &out).unwrap();
            let reference = run(Arc::new(
                SortExec::new(order.clone(), source()).with_fetch(fetch),
            ))
            .await;
            assert_eq!(ours, reference, "fetch {fetch:?}");
            if fetch.is_none() {
                let sizes: Vec<usize> = out.iter().map(|b| b.num_rows()).collect();
                assert!(
                    sizes[..sizes.len() - 1].iter().all(|&n| n == 512),
                    "{sizes:?}"
                );
            }
        }
    }

    #[test]
    fn slices_of_cover_the_first_rows_without_spanning_batches() {
        let (_, batches) = input(3, 10);
        let lens = |rows, batch_rows| -> Vec<usize> {
            slices_of(&batches, rows, batch_rows)
                .map(|b| b.num_rows())
                .collect()
        };
        assert_eq!(lens(30, 4), [4, 4, 2, 4, 4, 2, 4, 4, 2]);
        assert_eq!(lens(13, 100), [10, 3]);
        assert_eq!(lens(0, 4), Vec::<usize>::new());
        let slices: Vec<RecordBatch> = slices_of(&batches, 25, 7).collect();
        let got = concat_batches(&batches[0].schema(), &slices).unwrap();
        let want = concat_batches(&batches[0].schema(), &batches).unwrap();
        assert_eq!(got, want.slice(0, 25));
    }

    fn config(top_k: bool) -> SortConfig {
        SortConfig {
            threads: 1,
            top_k,
            spill_dir: None,
            mem_bytes_max: 1 << 30,
        }
    }

    /// A sort over 6x its budget spills runs, merges them in passes, and
    /// gives DataFusion's answer; the runs are gone afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_sort_spills_past_the_budget() {
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let (schema, batches) = input(40, 7_001);
        let partitions: Vec<Vec<RecordBatch>> = batches.chunks(20).map(|c| c.to_vec()).collect();
        let source =
            || MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(GreedyMemoryPool::new(bytes / 6)))
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(Default::default(), runtime);
        let dir = tempfile::tempdir().unwrap();
        let plan = Arc::new(
            KernelSortExec::new(source(), ordering(&schema), None, 2)
                .with_spill_dir(Some(dir.path().to_path_buf())),
        );
        let ours = collect(Arc::clone(&plan) as _, ctx.task_ctx())
            .await
            .unwrap();
        let ours = concat_batches(&schema, &ours).unwrap();
        let reference = run(Arc::new(SortExec::new(
            ordering(&schema),
            Arc::new(CoalescePartitionsExec::new(source())),
        )))
        .await;
        assert_eq!(ours.num_rows(), 40 * 7_001);
        assert_eq!(ours, reference);
        let runs = plan
            .metrics()
            .unwrap()
            .sum_by_name("spilled_runs")
            .unwrap()
            .as_usize();
        assert!(runs > 4, "{runs} runs");
        let spill = dir.path().join(crate::spill::SPILL_DIR);
        assert_eq!(
            std::fs::read_dir(&spill).unwrap().count(),
            0,
            "runs removed"
        );
    }

    #[tokio::test]
    async fn kernel_sort_fails_cleanly_over_the_memory_budget() {
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let (schema, batches) = input(20, 10_000);
        let source =
            MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).unwrap();
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(GreedyMemoryPool::new(1 << 20)))
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(Default::default(), runtime);
        let plan = Arc::new(KernelSortExec::new(source, ordering(&schema), None, 1));
        let err = collect(plan, ctx.task_ctx()).await.unwrap_err().to_string();
        assert!(err.contains("KernelSortExec"), "{err}");
        assert!(err.to_lowercase().contains("resources exhausted"), "{err}");
    }

    /// `batches` with a decimal(15, 2) column added (random across the
    /// precision, negatives and nulls): as Decimal128, and as the
    /// Decimal64 a narrowing scan reads.
    fn with_decimals(batches: &[RecordBatch]) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
        use arrow::array::Decimal128Array;
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let top = 10i128.pow(15) - 1;
        let (mut wide, mut narrow) = (vec![], vec![]);
        for b in batches {
            let values: Decimal128Array = (0..b.num_rows())
                .map(|_| match rng.random_range(0..20) {
                    0 => None,
                    1 => Some(-top),
                    2 => Some(top),
                    _ => Some(rng.random_range(-top..=top)),
                })
                .collect();
            let values = values.with_precision_and_scale(15, 2).unwrap();
            let narrowed = cast(&values, &DataType::Decimal64(15, 2)).unwrap();
            let add = |column: ArrayRef| {
                let mut fields = b.schema().fields().to_vec();
                fields.push(Arc::new(Field::new(
                    "dec",
                    column.data_type().clone(),
                    true,
                )));
                let mut columns = b.columns().to_vec();
                columns.push(column);
                RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
            };
            wide.push(add(Arc::new(values)));
            narrow.push(add(narrowed));
        }
        (wide, narrow)
    }

    /// A sort over Decimal64 input that outputs Decimal128 gives
    /// DataFusion's answer over the Decimal128 input in each of its
    /// paths: gathered through packed rows (a decimal key), scattered (a
    /// key of few values), input in order already, and spilled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_sort_widens_decimals_read_as_i64_in_every_path() {
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let (_, batches) = input(12, 7_001);
        let (wide, narrow) = with_decimals(&batches);
        let (wide_schema, narrow_schema) = (wide[0].schema(), narrow[0].schema());
        let source = |batches: &[RecordBatch]| {
            let schema = batches[0].schema();
            MemorySourceConfig::try_new_exec(&[batches.to_vec()], schema, None).unwrap()
        };
        let key = |name: &str, descending: bool| PhysicalSortExpr {
            expr: col(name, &wide_schema).unwrap(),
            options: SortOptions {
                descending,
                nulls_first: descending,
            },
        };
        let bytes: usize = narrow.iter().map(|b| b.get_array_memory_size()).sum();
        let spilling = || {
            let pool = Arc::new(GreedyMemoryPool::new(bytes / 4));
            let runtime = RuntimeEnvBuilder::new().with_memory_pool(pool);
            SessionContext::new_with_config_rt(Default::default(), runtime.build_arc().unwrap())
        };
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "packed rows",
                vec![key("dec", true), key("id", false)],
                false,
            ),
            ("scattered", vec![key("s", false), key("id", false)], false),
            ("in order", vec![key("id", false)], false),
            ("spilled", vec![key("dec", false), key("id", true)], true),
        ];
        for (case, keys, spill) in cases {
            let order = LexOrdering::new(keys).unwrap();
            let plan = KernelSortExec::new(source(&narrow), order.clone(), None, 2)
                .with_spill_dir(Some(dir.path().to_path_buf()))
                .with_output_schema(Arc::clone(&wide_schema))
                .unwrap();
            let plan = Arc::new(plan);
            assert_eq!(plan.schema(), wide_schema);
            let ctx = if spill {
                spilling()
            } else {
                SessionContext::new()
            };
            let out = collect(Arc::clone(&plan) as _, ctx.task_ctx())
                .await
                .unwrap();
            let ours = concat_batches(&wide_schema, &out).unwrap();
            let reference = run(Arc::new(SortExec::new(order, source(&wide)))).await;
            assert_eq!(ours, reference, "{case}");
            let runs = plan.metrics().unwrap().sum_by_name("spilled_runs");
            assert_eq!(runs.is_some_and(|r| r.as_usize() > 1), spill, "{case}");
        }
        // A top-k, or a schema that is not the input's widened, is refused.
        let order = LexOrdering::new(vec![key("id", false)]).unwrap();
        let top_k = KernelSortExec::new(source(&narrow), order.clone(), Some(5), 2);
        assert!(top_k.with_output_schema(Arc::clone(&wide_schema)).is_err());
        let full = KernelSortExec::new(source(&wide), order, None, 2);
        assert!(full.with_output_schema(narrow_schema).is_err());
    }

    #[test]
    fn swaps_full_sorts_and_keeps_top_k_unless_asked() {
        let (schema, batches) = input(1, 10);
        let source =
            MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).unwrap();
        let full: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(ordering(&schema), Arc::clone(&source) as _));
        let top: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(ordering(&schema), source as _).with_fetch(Some(3)));
        assert_eq!(
            use_kernel_sorts(full, &config(false)).unwrap().name(),
            "KernelSortExec"
        );
        assert!(use_kernel_sorts(Arc::clone(&top), &config(false))
            .unwrap()
            .name()
            .starts_with("SortExec"));
        let swapped = use_kernel_sorts(top, &config(true)).unwrap();
        assert_eq!(swapped.name(), "KernelSortExec");
        assert_eq!(swapped.fetch(), Some(3));
    }
}
