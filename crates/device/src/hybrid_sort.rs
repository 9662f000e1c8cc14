//! [`HybridSortExec`]: a table sort over hybrid partitions, the way paper
//! 000 (section 3.5) lays it out: key sort, then shuffle.
//!
//! ```text
//!   HybridSortExec (one sorted output partition; a leaf: it reads itself)
//!     1. read the key sections, one sequential read per file
//!     2. argsort the keys -> sorted row indices      (insitu kernels)
//!     3. read the row slots and heaps, one sequential read each
//!     4. per output batch: gather whole row slots by index, decode them,
//!        gather the key columns by the same indices
//! ```
//!
//! The device swaps a stage's `SortExec` for it when the sort reads a
//! [`HybridScanExec`] directly and sorts by columns that layout stores
//! column-wise ([`hybrid_sort_for`]). Every buffer it holds is reserved in
//! the device's memory pool first.

use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::{concat_batches, SortColumn};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{
    apply_expression_roots, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning,
    PlanProperties,
};
use insitu_format::hybrid::decode_key_block;
use insitu_kernels::{argsort_columns, gather, gather_rows, Parallelism};
use insitu_stage::hybrid_scan::{read_ranges, HybridProjection, RowBytes};
use insitu_stage::{HybridFile, HybridScanExec};
use insitu_wire::{HybridLayout, RowSlot};
use object_store::ObjectStore;

use crate::sort::{sorted_stream, Sender};

/// A [`HybridSortExec`] doing what `sort` asks, if `sort` reads a hybrid
/// scan directly and sorts by its column-wise keys; `None` otherwise.
pub fn hybrid_sort_for(
    sort: &SortExec,
    threads: usize,
    mem_bytes_max: usize,
) -> Option<HybridSortExec> {
    let scan = sort.input().downcast_ref::<HybridScanExec>()?;
    if hybrid_sort_bytes(scan.files()) > mem_bytes_max as u64 {
        return None; // the kernel sort spills; this one would not fit
    }
    let schema = scan.schema();
    let mut names = vec![];
    for e in sort.expr().iter() {
        let col = e.expr.downcast_ref::<Column>()?;
        names.push(schema.field(col.index()).name().as_str());
    }
    let first = scan.files().first()?.layout();
    let same_rows = scan
        .files()
        .iter()
        .all(|f| f.layout().slots == first.slots && f.layout().key_columns == first.key_columns);
    (same_rows && scan.keys_are_columnar(&names)).then(|| {
        HybridSortExec::new(
            Arc::new(clone_scan(scan)),
            sort.expr().clone(),
            sort.fetch(),
            threads,
        )
    })
}

/// Memory a hybrid sort of `files` holds: decoded keys (about twice their
/// IPC bytes), row slots, heaps and a 4-byte index per row.
fn hybrid_sort_bytes(files: &[HybridFile]) -> u64 {
    files
        .iter()
        .map(|f| {
            let l = f.layout();
            2 * l.key_section.len + l.row_section.len + l.heap_section.len + 4 * f.row_count()
        })
        .sum()
}

fn clone_scan(scan: &HybridScanExec) -> HybridScanExec {
    HybridScanExec::try_new(
        scan.store_url().clone(),
        scan.files().to_vec(),
        Arc::clone(scan.table_schema()),
        scan.projection().map(<[usize]>::to_vec),
        1,
    )
    .expect("the scan was valid")
}

/// Most rows per output batch: each is gathered from row slots and decoded
/// while its rows stay in cache. At the device's 32768-row batches ORDER BY
/// l_partkey on hybrid lineitem SF1 took 1.365 s against 1.123 s at 8192
/// (`bench/orderby.sh 1 5 2 2`).
const GATHER_BATCH_ROWS_MAX: usize = 8192;

/// Sorts hybrid partitions by their column-wise key: key sort + shuffle.
#[derive(Debug)]
pub struct HybridSortExec {
    scan: Arc<HybridScanExec>,
    ordering: LexOrdering,
    fetch: Option<usize>,
    threads: usize,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl HybridSortExec {
    pub fn new(
        scan: Arc<HybridScanExec>,
        ordering: LexOrdering,
        fetch: Option<usize>,
        threads: usize,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new_with_orderings(scan.schema(), [ordering.clone()]),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            scan,
            ordering,
            fetch,
            threads: threads.max(1),
            metrics: ExecutionPlanMetricsSet::new(),
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for HybridSortExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "HybridSortExec: expr=[{}]", self.ordering)?;
        if let Some(k) = self.fetch {
            write!(f, ", fetch={k}")?;
        }
        write!(f, ", ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for HybridSortExec {
    fn name(&self) -> &str {
        "HybridSortExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_expression_roots(self.ordering.iter().map(|sort| &sort.expr), f)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
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
            return internal_err!("HybridSortExec has one partition, not {partition}");
        }
        let store = context.runtime_env().object_store(self.scan.store_url())?;
        let reservation = MemoryConsumer::new("HybridSortExec").register(context.memory_pool());
        let phase = |name: &'static str| MetricBuilder::new(&self.metrics).subset_time(name, 0);
        let job = Arc::new(HybridSortJob {
            files: self.scan.files().to_vec(),
            schema: self.schema(),
            ordering: self.ordering.clone(),
            fetch: self.fetch,
            threads: self.threads,
            batch_rows: context
                .session_config()
                .batch_size()
                .clamp(1, GATHER_BATCH_ROWS_MAX),
            baseline: BaselineMetrics::new(&self.metrics, 0),
            key_read: phase("key_read_time"),
            key_sort: phase("key_sort_time"),
            row_read: phase("row_read_time"),
            shuffle: phase("shuffle_time"),
        });
        Ok(sorted_stream(self.schema(), move |tx| async move {
            job.run(store, reservation, tx).await
        }))
    }
}

/// One execution of a [`HybridSortExec`].
struct HybridSortJob {
    files: Vec<HybridFile>,
    schema: SchemaRef,
    ordering: LexOrdering,
    fetch: Option<usize>,
    threads: usize,
    batch_rows: usize,
    baseline: BaselineMetrics,
    key_read: Time,
    key_sort: Time,
    row_read: Time,
    shuffle: Time,
}

/// The row slots and heaps of all files, concatenated.
struct Rows {
    slots: Bytes,
    heap: Bytes,
}

impl HybridSortJob {
    async fn run(
        self: Arc<Self>,
        store: Arc<dyn ObjectStore>,
        reservation: MemoryReservation,
        tx: Sender,
    ) -> Result<()> {
        let layout = self.files[0].layout().clone();
        let projection = HybridProjection::new(&self.schema, &layout)?;
        let keys = self.read_keys(&store, &reservation).await?;
        let worker = Arc::clone(&self);
        let sort_keys = keys.clone();
        let order = tokio::task::spawn_blocking(move || worker.argsort(&sort_keys))
            .await
            .map_err(|e| DataFusionError::Execution(format!("sort worker failed: {e}")))??;
        reservation.try_grow(order.len() * 4)?;
        let rows = if projection.needs_rows() {
            self.read_rows(&store, &reservation, &layout).await?
        } else {
            Rows {
                slots: Bytes::new(),
                heap: Bytes::new(),
            }
        };
        let worker = Arc::clone(&self);
        tokio::task::spawn_blocking(move || {
            worker.shuffle(&keys, &order, &rows, &layout, &projection, &tx)
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("shuffle worker failed: {e}")))??;
        drop(reservation);
        Ok(())
    }

    /// Every file's key section, decoded and concatenated.
    async fn read_keys(
        &self,
        store: &Arc<dyn ObjectStore>,
        reservation: &MemoryReservation,
    ) -> Result<RecordBatch> {
        let _timer = self.key_read.timer();
        let mut batches = vec![];
        for file in &self.files {
            let layout = file.layout();
            reservation.try_grow(2 * layout.key_section.len as usize)?;
            let [section] = <[Bytes; 1]>::try_from(
                read_ranges(store, file, &[layout.key_section.range()]).await?,
            )
            .expect("one range");
            for block in &layout.blocks {
                let at = (block.key.offset - layout.key_section.offset) as usize;
                let bytes = section
                    .get(at..at + block.key.len as usize)
                    .ok_or_else(|| corrupt(file, "a key block lies outside the key section"))?;
                batches.push(decode_key_block(bytes, block.rows).map_err(external)?);
            }
        }
        let key_schema = match batches.first() {
            Some(b) => b.schema(),
            None => {
                return Ok(RecordBatch::new_empty(Arc::new(
                    arrow::datatypes::Schema::empty(),
                )))
            }
        };
        Ok(concat_batches(&key_schema, &batches)?)
    }

    /// The sorted row indices (the first `fetch` of them, if set).
    fn argsort(&self, keys: &RecordBatch) -> Result<Vec<u32>> {
        let _timer = self.key_sort.timer();
        if keys.num_rows() == 0 {
            return Ok(vec![]);
        }
        let columns = self
            .ordering
            .iter()
            .map(|e| {
                let name = e
                    .expr
                    .downcast_ref::<Column>()
                    .map(Column::name)
                    .ok_or_else(|| DataFusionError::Internal("sort key is not a column".into()))?;
                let values = keys.column_by_name(name).ok_or_else(|| {
                    DataFusionError::Internal(format!("{name} is not a key column"))
                })?;
                Ok(SortColumn {
                    values: Arc::clone(values),
                    options: Some(e.options),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(argsort_columns(
            &columns,
            self.fetch,
            Parallelism(self.threads),
        )?)
    }

    /// Every file's row slots and heap, one sequential read each; with
    /// several files, heap offsets are rebased onto the concatenated heap.
    async fn read_rows(
        &self,
        store: &Arc<dyn ObjectStore>,
        reservation: &MemoryReservation,
        layout: &HybridLayout,
    ) -> Result<Rows> {
        let _timer = self.row_read.timer();
        let mut parts = vec![];
        for file in &self.files {
            let l = file.layout();
            reservation.try_grow((l.row_section.len + l.heap_section.len) as usize)?;
            let [slots, heap] = <[Bytes; 2]>::try_from(
                read_ranges(
                    store,
                    file,
                    &[l.row_section.range(), l.heap_section.range()],
                )
                .await?,
            )
            .expect("two ranges");
            parts.push((slots, heap));
        }
        if parts.len() == 1 {
            let (slots, heap) = parts.pop().expect("one file");
            return Ok(Rows { slots, heap });
        }
        reservation.try_grow(parts.iter().map(|(s, h)| s.len() + h.len()).sum())?;
        let width = layout.row_width_bytes as usize;
        let (mut slots, mut heap) = (Vec::new(), Vec::new());
        for (s, h) in parts {
            let start = slots.len();
            slots.extend_from_slice(&s);
            rebase_heap_offsets(&mut slots[start..], width, &layout.slots, heap.len() as u64);
            heap.extend_from_slice(&h);
        }
        Ok(Rows {
            slots: slots.into(),
            heap: heap.into(),
        })
    }

    /// Gathers and decodes the sorted rows, one output batch at a time.
    fn shuffle(
        &self,
        keys: &RecordBatch,
        order: &[u32],
        rows: &Rows,
        layout: &HybridLayout,
        projection: &HybridProjection,
        tx: &Sender,
    ) -> Result<()> {
        let width = layout.row_width_bytes as usize;
        let mut slots = Vec::with_capacity(self.batch_rows * width);
        for chunk in order.chunks(self.batch_rows) {
            let batch = {
                let _timer = self.shuffle.timer();
                if projection.needs_rows() {
                    gather_rows(&rows.slots, width, chunk, &mut slots);
                }
                let key_columns = layout
                    .key_columns
                    .iter()
                    .map(|name| {
                        let column = keys.column_by_name(name).ok_or_else(|| {
                            DataFusionError::Internal(format!("key column {name} was not read"))
                        })?;
                        Ok(gather(column.as_ref(), chunk)?)
                    })
                    .collect::<Result<Vec<ArrayRef>>>()?;
                let bytes = RowBytes {
                    slots: &slots,
                    heap: &rows.heap,
                    heap_base: 0,
                };
                projection.assemble(&self.schema, &key_columns, bytes, layout, chunk.len())?
            };
            self.baseline.record_output(batch.num_rows());
            if tx.blocking_send(Ok(batch)).is_err() {
                return Ok(()); // the consumer went away: the stage was cancelled
            }
        }
        Ok(())
    }
}

/// Adds `base` to every heap offset in `slots` (whole rows of `width`);
/// values inline in their slots have none.
fn rebase_heap_offsets(slots: &mut [u8], width: usize, layout_slots: &[RowSlot], base: u64) {
    for row in slots.chunks_exact_mut(width) {
        for s in layout_slots.iter().filter(|s| s.variable_length) {
            let at = s.offset_bytes as usize;
            let len = u32::from_le_bytes(row[at + 8..at + 12].try_into().expect("4 bytes"));
            if len <= s.inline_bytes_max {
                continue;
            }
            let off = u64::from_le_bytes(row[at..at + 8].try_into().expect("8 bytes"));
            row[at..at + 8].copy_from_slice(&(off + base).to_le_bytes());
        }
    }
}

fn external(e: insitu_format::FormatError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn corrupt(file: &HybridFile, msg: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "table {} partition {}: hybrid partition is corrupt: {msg}",
        file.descriptor.table, file.descriptor.partition
    ))
}
