//! [`DeviceMergeExec`]: merges the devices' sorted streams into one sorted
//! stream, passing long runs through without copying them.
//!
//! ```text
//!                DeviceMergeExec [fetch]        one sorted output stream
//!                       |
//!     +-----------------+-----------------+
//!  device 0 (sorted)  device 1 (sorted) ...   DeviceScanExec partitions
//!
//!  device 0:  A A A A A B B C ...            runs found by galloping
//!  device 1:  A A A B B B B B ...
//!  output:    [A A A A A]0 [A A A]1 [B B]0 [B B B B B]1 ...
//!             slices of the input batches when a run is long,
//!             rows interleaved into a new batch when runs are short
//! ```
//!
//! DataFusion's `SortPreservingMergeExec` copies every row into new output
//! batches. After a device sort, equal or adjacent keys often come from one
//! device in long runs (a key with few distinct values, or devices holding
//! key ranges); copying them costs as much as the devices' whole gather.
//! This merge finds each run with an exponential search over the run's
//! stream, compares keys (one fixed-width key as the kernels' key images,
//! any other ordering in Arrow's row format), and emits a run of at least
//! [`SLICE_ROWS_MIN`] rows as a zero-copy slice of the device's batch;
//! shorter runs are interleaved into batches of `batch_size` rows (by the
//! kernels' `interleave_batches`).
//!
//! Ties between streams go to the lower partition first, so the merge is
//! stable across devices. Memory held: one batch per input, plus the input
//! batches referenced by the rows waiting to be interleaved (at most
//! `batch_size` rows).
//!
//! An interleaved batch copies its rows' fixed-width values and string
//! views, but its views point at the strings where they lie. A device's
//! batch arrives with every buffer slicing the one allocation its message
//! came in, so before its first rows are interleaved, the batch's string
//! bytes are copied out (`with_own_string_bytes`); otherwise the output
//! would keep whole messages alive, every column of them, as long as it
//! lives (a sorted lineitem SF1 collected on the host: 4.3 GiB peak
//! resident memory instead of 3.1 GiB).

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use arrow::array::{
    new_empty_array, ArrayRef, AsArray, GenericByteViewArray, RecordBatch, RecordBatchOptions,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{ByteViewType, DataType, SchemaRef};
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{LexOrdering, OrderingRequirements, PhysicalExpr};
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::execution_plan::EvaluationType;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    apply_expression_roots, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan,
    ExecutionPlanProperties, Partitioning, PlanProperties,
};
use futures::StreamExt;
use insitu_kernels::{key_images, KeyImage};

/// A run from one stream at least this long leaves the merge as a slice of
/// its input batch instead of being copied.
pub const SLICE_ROWS_MIN: usize = 256;

/// Merges sorted input partitions into one sorted partition.
#[derive(Debug, Clone)]
pub struct DeviceMergeExec {
    input: Arc<dyn ExecutionPlan>,
    ordering: LexOrdering,
    fetch: Option<usize>,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl DeviceMergeExec {
    /// Merges every partition of `input`, each sorted by `ordering`.
    pub fn new(ordering: LexOrdering, input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = Arc::new(Self::properties_for(&input, &ordering));
        Self {
            input,
            ordering,
            fetch: None,
            metrics: ExecutionPlanMetricsSet::new(),
            properties,
        }
    }

    /// Stops after `fetch` rows (ORDER BY ... LIMIT).
    pub fn with_fetch(mut self, fetch: Option<usize>) -> Self {
        self.fetch = fetch;
        self
    }

    pub fn ordering(&self) -> &LexOrdering {
        &self.ordering
    }

    fn properties_for(input: &Arc<dyn ExecutionPlan>, ordering: &LexOrdering) -> PlanProperties {
        let mut equivalences = input.equivalence_properties().clone();
        equivalences.clear_per_partition_constants();
        equivalences.add_ordering(ordering.iter().cloned());
        PlanProperties::new(
            equivalences,
            Partitioning::UnknownPartitioning(1),
            input.pipeline_behavior(),
            input.boundedness(),
        )
        .with_evaluation_type(EvaluationType::Eager)
    }
}

impl DisplayAs for DeviceMergeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DeviceMergeExec: [{}]", self.ordering)?;
        if let Some(fetch) = self.fetch {
            write!(f, ", fetch={fetch}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for DeviceMergeExec {
    fn name(&self) -> &str {
        "DeviceMergeExec"
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

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::UnspecifiedDistribution]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        vec![Some(OrderingRequirements::from(self.ordering.clone()))]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn fetch(&self) -> Option<usize> {
        self.fetch
    }

    fn with_fetch(&self, fetch: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(self.clone().with_fetch(fetch)))
    }

    fn supports_limit_pushdown(&self) -> bool {
        true
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("DeviceMergeExec takes one child, got {}", children.len());
        }
        let merge = Self::new(self.ordering.clone(), children.swap_remove(0));
        Ok(Arc::new(merge.with_fetch(self.fetch)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("DeviceMergeExec has one partition, not {partition}");
        }
        let partitions = self.input.output_partitioning().partition_count();
        // Each input decodes on its own task, ahead of the merge by a batch.
        let inputs = (0..partitions)
            .map(|p| {
                Ok(spawn_buffered(
                    self.input.execute(p, Arc::clone(&context))?,
                    1,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let merge = RunMerge::try_new(
            inputs,
            self.schema(),
            self.ordering.clone(),
            context.session_config().batch_size(),
            self.fetch,
            BaselineMetrics::new(&self.metrics, partition),
        )?;
        let stream = futures::stream::unfold(Some(merge), |state| async move {
            let mut merge = state?;
            match merge.next_batch().await {
                Ok(Some(batch)) => Some((Ok(batch), Some(merge))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One input's current batch, its keys and the next row.
struct Cursor {
    batch: RecordBatch,
    keys: BatchKeys,
    next: usize,
    /// Index of `batch` in [`Pending::batches`], once a row of it waits there.
    pending_slot: Option<usize>,
    /// Whether `batch`'s string bytes are its own copy already.
    owns_strings: bool,
}

impl Cursor {
    fn key(&self) -> Key<'_> {
        self.keys.row(self.next)
    }
}

/// A batch's sort keys. In row format, a sorted batch whose first and
/// last keys are equal holds one key in every row: ORDER BY a column of a
/// few values (`l_shipmode`) sends mostly such batches, and one key
/// stands for all their rows instead of each row's being encoded.
enum BatchKeys {
    /// Each row's key.
    Each(Rows),
    /// One key (a single row) for all `rows` rows.
    Same { key: Rows, rows: usize },
    /// Each row's key image (an ordering by one fixed-width key).
    Images(Vec<KeyImage>),
}

impl BatchKeys {
    fn row(&self, i: usize) -> Key<'_> {
        match self {
            BatchKeys::Each(keys) => Key::Row(keys.row(i)),
            BatchKeys::Same { key, rows } => {
                debug_assert!(i < *rows, "row {i} of {rows}");
                Key::Row(key.row(0))
            }
            BatchKeys::Images(images) => Key::Image(images[i]),
        }
    }

    fn num_rows(&self) -> usize {
        match self {
            BatchKeys::Each(keys) => keys.num_rows(),
            BatchKeys::Same { rows, .. } => *rows,
            BatchKeys::Images(images) => images.len(),
        }
    }
}

/// One row's sort key. All batches of a merge hold keys of one kind; keys
/// of different kinds are unordered (every comparison of them is false).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key<'a> {
    Row(Row<'a>),
    Image(KeyImage),
}

impl PartialOrd for Key<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self, other) {
            (Key::Row(a), Key::Row(b)) => Some(a.cmp(b)),
            (Key::Image(a), Key::Image(b)) => Some(a.cmp(b)),
            _ => None,
        }
    }
}

/// Rows from short runs waiting to be interleaved into one output batch.
#[derive(Default)]
struct Pending {
    batches: Vec<RecordBatch>,
    rows: Vec<(usize, usize)>,
}

/// The merge state behind [`DeviceMergeExec`]'s output stream.
struct RunMerge {
    inputs: Vec<SendableRecordBatchStream>,
    /// `None` once an input is exhausted (or before its first batch).
    cursors: Vec<Option<Cursor>>,
    exhausted: Vec<bool>,
    converter: RowConverter,
    /// Keys are compared as [`KeyImage`]s: the ordering is one key of a
    /// type that has them. Else in row format.
    by_image: bool,
    ordering: LexOrdering,
    batch_size: usize,
    /// Rows still to emit: `fetch`, or unbounded.
    remaining: usize,
    pending: Pending,
    ready: std::collections::VecDeque<RecordBatch>,
    /// Every input is merged; only pending rows may be left.
    finished: bool,
    metrics: BaselineMetrics,
}

impl RunMerge {
    fn try_new(
        inputs: Vec<SendableRecordBatchStream>,
        schema: SchemaRef,
        ordering: LexOrdering,
        batch_size: usize,
        fetch: Option<usize>,
        metrics: BaselineMetrics,
    ) -> Result<Self> {
        let fields = ordering
            .iter()
            .map(|sort| {
                Ok(SortField::new_with_options(
                    sort.expr.data_type(&schema)?,
                    sort.options,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // Whether the key's type has images: an empty array of it says.
        let by_image = match ordering.len() {
            1 => {
                let empty = new_empty_array(&ordering[0].expr.data_type(&schema)?);
                key_images(&empty, ordering[0].options)?.is_some()
            }
            _ => false,
        };
        let n = inputs.len();
        Ok(Self {
            inputs,
            cursors: (0..n).map(|_| None).collect(),
            exhausted: vec![false; n],
            converter: RowConverter::new(fields)?,
            by_image,
            ordering,
            batch_size: batch_size.max(1),
            remaining: fetch.unwrap_or(usize::MAX),
            pending: Pending::default(),
            ready: Default::default(),
            finished: false,
            metrics,
        })
    }

    /// The next output batch, or `None` when every input is merged.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if self.remaining == 0 || self.finished {
                self.flush()?;
            }
            if let Some(batch) = self.ready.pop_front() {
                self.metrics.record_output(batch.num_rows());
                self.metrics.output_batches().add(1);
                return Ok(Some(batch));
            }
            if self.remaining == 0 || self.finished {
                return Ok(None);
            }
            self.fill_cursors().await?;
            let elapsed = self.metrics.elapsed_compute().clone();
            let timer = elapsed.timer();
            self.finished = !self.merge_until_ready()?;
            timer.done();
        }
    }

    /// Gives every unfinished input a cursor with at least one row left.
    async fn fill_cursors(&mut self) -> Result<()> {
        for i in 0..self.inputs.len() {
            while self.cursors[i].is_none() && !self.exhausted[i] {
                match self.inputs[i].next().await.transpose()? {
                    None => self.exhausted[i] = true,
                    Some(batch) if batch.num_rows() == 0 => {}
                    Some(batch) => {
                        let keys = self.key_rows(&batch)?;
                        self.cursors[i] = Some(Cursor {
                            batch,
                            keys,
                            next: 0,
                            pending_slot: None,
                            owns_strings: false,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// `batch`'s keys: each row's image when the merge compares images;
    /// else one row-format key for all rows if its first and last rows
    /// have the same key (the batch is sorted, so every row between has
    /// it too), else each row's.
    fn key_rows(&self, batch: &RecordBatch) -> Result<BatchKeys> {
        let rows = batch.num_rows();
        let columns = self
            .ordering
            .iter()
            .map(|sort| sort.expr.evaluate(batch)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        if self.by_image {
            return match key_images(columns[0].as_ref(), self.ordering[0].options)? {
                Some(images) => Ok(BatchKeys::Images(images)),
                None => internal_err!("no key images for {}", columns[0].data_type()),
            };
        }
        if rows > 1 {
            let row_at = |i: usize| -> Result<Rows> {
                let one: Vec<ArrayRef> = columns.iter().map(|c| c.slice(i, 1)).collect();
                Ok(self.converter.convert_columns(&one)?)
            };
            let (first, last) = (row_at(0)?, row_at(rows - 1)?);
            if first.row(0) == last.row(0) {
                return Ok(BatchKeys::Same { key: first, rows });
            }
        }
        Ok(BatchKeys::Each(self.converter.convert_columns(&columns)?))
    }

    /// Merges runs until an output batch is ready or some input's batch
    /// runs out (it must be refilled before the merge can go on). Returns
    /// false when no input has rows left.
    fn merge_until_ready(&mut self) -> Result<bool> {
        loop {
            let Some(winner) = self.smallest_head() else {
                return Ok(false);
            };
            let end = self.run_end(winner).min(self.remaining_in(winner));
            self.take_run(winner, end)?;
            let cursor = self.cursors[winner].as_ref().expect("winner has a cursor");
            if cursor.next == cursor.batch.num_rows() {
                self.cursors[winner] = None;
                return Ok(true);
            }
            if !self.ready.is_empty() || self.remaining == 0 {
                return Ok(true);
            }
        }
    }

    /// The input whose next row comes first; ties go to the lower input.
    fn smallest_head(&self) -> Option<usize> {
        let mut best: Option<(usize, Key<'_>)> = None;
        for (i, cursor) in self.cursors.iter().enumerate() {
            let Some(cursor) = cursor else { continue };
            let key = cursor.key();
            if best.is_none_or(|(_, b)| key < b) {
                best = Some((i, key));
            }
        }
        best.map(|(i, _)| i)
    }

    /// End (exclusive) of the run `winner` can emit before another input's
    /// head must come first.
    fn run_end(&self, winner: usize) -> usize {
        let cursor = self.cursors[winner].as_ref().expect("winner has a cursor");
        let mut bound: Option<(usize, Key<'_>)> = None;
        for (i, other) in self.cursors.iter().enumerate() {
            let Some(other) = other.as_ref().filter(|_| i != winner) else {
                continue;
            };
            let key = other.key();
            if bound.is_none_or(|(_, b)| key < b) {
                bound = Some((i, key));
            }
        }
        match bound {
            None => cursor.batch.num_rows(),
            // Rows equal to the bound stay in the run when the winner is
            // the lower input: ties go to the lower input.
            Some((i, key)) => gallop(&cursor.keys, cursor.next, key, winner < i),
        }
    }

    /// How far `winner`'s run may go without passing `fetch`.
    fn remaining_in(&self, winner: usize) -> usize {
        let cursor = self.cursors[winner].as_ref().expect("winner has a cursor");
        cursor.next.saturating_add(self.remaining)
    }

    /// Emits `winner`'s rows up to `end`: as a slice when the run is long,
    /// else into the pending rows.
    fn take_run(&mut self, winner: usize, end: usize) -> Result<()> {
        let cursor = self.cursors[winner].as_mut().expect("winner has a cursor");
        let start = cursor.next;
        debug_assert!(end > start, "a run holds at least the winner's head");
        self.remaining -= end - start;
        if end - start >= SLICE_ROWS_MIN {
            let slice = cursor.batch.slice(start, end - start);
            cursor.next = end;
            self.flush()?;
            self.ready.push_back(slice);
            return Ok(());
        }
        let mut next = start;
        while next < end {
            let cursor = self.cursors[winner].as_mut().expect("winner has a cursor");
            let slot = match cursor.pending_slot {
                Some(slot) => slot,
                None => {
                    if !cursor.owns_strings {
                        cursor.batch = with_own_string_bytes(&cursor.batch)?;
                        cursor.owns_strings = true;
                    }
                    self.pending.batches.push(cursor.batch.clone());
                    let slot = self.pending.batches.len() - 1;
                    cursor.pending_slot = Some(slot);
                    slot
                }
            };
            let room = self.batch_size - self.pending.rows.len();
            let upto = end.min(next + room);
            self.pending
                .rows
                .extend((next..upto).map(|row| (slot, row)));
            cursor.next = upto;
            next = upto;
            if self.pending.rows.len() == self.batch_size {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Interleaves the pending rows into one output batch.
    fn flush(&mut self) -> Result<()> {
        if self.pending.rows.is_empty() {
            return Ok(());
        }
        let batches: Vec<&RecordBatch> = self.pending.batches.iter().collect();
        let batch = insitu_kernels::interleave_batches(&batches, &self.pending.rows)?;
        self.ready.push_back(batch);
        self.pending.rows.clear();
        self.pending.batches.clear();
        for cursor in self.cursors.iter_mut().flatten() {
            cursor.pending_slot = None;
        }
        Ok(())
    }
}

/// `batch` with the string bytes of its view columns copied into buffers
/// of their own (views unchanged: same buffer indices and offsets).
fn with_own_string_bytes(batch: &RecordBatch) -> Result<RecordBatch> {
    fn own<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> ArrayRef {
        let (views, buffers, nulls) = array.clone().into_parts();
        let buffers: Vec<Buffer> = (buffers.iter())
            .map(|b| Buffer::from_slice_ref::<u8, _>(b.as_slice()))
            .collect();
        // SAFETY: the same views over byte-for-byte copies of their buffers.
        Arc::new(unsafe { GenericByteViewArray::<T>::new_unchecked(views, buffers, nulls) })
    }
    let columns = (batch.columns().iter())
        .map(|column| match column.data_type() {
            DataType::Utf8View => own(column.as_string_view()),
            DataType::BinaryView => own(column.as_binary_view()),
            _ => Arc::clone(column),
        })
        .collect();
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &options,
    )?)
}

/// First position at or after `start` whose key is past `bound` (or equal
/// to it, unless `take_ties`). The key at `start` must be in the run.
/// Exponential then binary search: a run of length r costs O(log r)
/// comparisons.
fn gallop(keys: &BatchKeys, start: usize, bound: Key<'_>, take_ties: bool) -> usize {
    let in_run = |i: usize| {
        let key = keys.row(i);
        if take_ties {
            key <= bound
        } else {
            key < bound
        }
    };
    debug_assert!(in_run(start), "the run's first row precedes the bound");
    let len = keys.num_rows();
    // Invariant: rows before `lo` are in the run; `hi` is not (or is `len`).
    let mut lo = start + 1;
    let mut step = 1;
    let mut hi = loop {
        let probe = start.saturating_add(step).min(len);
        if probe == len || !in_run(probe) {
            break probe;
        }
        lo = probe + 1;
        step *= 2;
    };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if in_run(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        Array, Float64Array, Int32Array, StringArray, StringViewArray, UInt32Array,
    };
    use arrow::compute::SortOptions;
    use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch, SortColumn};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_expr::PhysicalSortExpr;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A tiny deterministic generator (xorshift) for seeded inputs.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("origin", DataType::UInt32, false),
        ]))
    }

    /// `rows` random rows from input `origin`, keys drawn from `distinct`
    /// values, with nulls and NaN.
    fn random_batch(rng: &mut Rng, rows: usize, distinct: u64, origin: u32) -> RecordBatch {
        let k: Int32Array = (0..rows)
            .map(|_| (rng.below(10) != 0).then(|| rng.below(distinct) as i32))
            .collect();
        let f: Float64Array = (0..rows)
            .map(|_| match rng.below(12) {
                0 => None,
                1 => Some(f64::NAN),
                _ => Some(rng.below(distinct) as f64 - 3.5),
            })
            .collect();
        let s: StringArray = (0..rows)
            .map(|_| (rng.below(9) != 0).then(|| format!("v{}", rng.below(distinct))))
            .collect();
        let origin = UInt32Array::from(vec![origin; rows]);
        let columns: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(f), Arc::new(s), Arc::new(origin)];
        RecordBatch::try_new(schema(), columns).unwrap()
    }

    fn ordering(options: &[(&str, SortOptions)]) -> LexOrdering {
        let schema = schema();
        LexOrdering::new(options.iter().map(|(name, opts)| PhysicalSortExpr {
            expr: col(name, &schema).unwrap(),
            options: *opts,
        }))
        .unwrap()
    }

    fn sort_batch(batch: &RecordBatch, ordering: &LexOrdering) -> RecordBatch {
        let columns: Vec<SortColumn> = ordering
            .iter()
            .map(|s| SortColumn {
                values: s
                    .expr
                    .evaluate(batch)
                    .unwrap()
                    .into_array(batch.num_rows())
                    .unwrap(),
                options: Some(s.options),
            })
            .collect();
        // Stable: ties keep input order, so each partition stays sorted by
        // (key, row) and the expected output is well defined.
        let mut with_row = columns;
        with_row.push(SortColumn {
            values: Arc::new(UInt32Array::from_iter_values(0..batch.num_rows() as u32)),
            options: None,
        });
        let indices = lexsort_to_indices(&with_row, None).unwrap();
        take_record_batch(batch, &indices).unwrap()
    }

    /// Cuts a sorted partition into batches of random sizes, empty ones too.
    fn cut(rng: &mut Rng, sorted: &RecordBatch) -> Vec<RecordBatch> {
        let mut out = vec![];
        let mut at = 0;
        while at < sorted.num_rows() {
            let len = (rng.below(300) as usize).min(sorted.num_rows() - at);
            out.push(sorted.slice(at, len));
            at += len;
        }
        out
    }

    /// What the merge must produce: all rows stably sorted by the ordering,
    /// ties ordered by input then by position in it.
    fn expected(
        partitions: &[RecordBatch],
        ordering: &LexOrdering,
        fetch: Option<usize>,
    ) -> RecordBatch {
        let all = concat_batches(&schema(), partitions).unwrap();
        let sorted = sort_batch(&all, ordering);
        sorted.slice(0, fetch.unwrap_or(usize::MAX).min(sorted.num_rows()))
    }

    async fn merged(
        partitions: Vec<Vec<RecordBatch>>,
        ordering: &LexOrdering,
        fetch: Option<usize>,
        batch_size: usize,
    ) -> Vec<RecordBatch> {
        let input = MemorySourceConfig::try_new_exec(&partitions, schema(), None).unwrap();
        let merge = DeviceMergeExec::new(ordering.clone(), input).with_fetch(fetch);
        let config = SessionConfig::new().with_batch_size(batch_size);
        let ctx = SessionContext::new_with_config(config);
        collect(Arc::new(merge), ctx.task_ctx()).await.unwrap()
    }

    const DESC_NULLS_LAST: SortOptions = SortOptions {
        descending: true,
        nulls_first: false,
    };

    /// [`merged`], asserting that the output is the stable sort of the
    /// `sorted` inputs the `partitions` were cut from; `label` names the
    /// inputs in the failure message.
    async fn merged_checked(
        sorted: &[RecordBatch],
        partitions: &[Vec<RecordBatch>],
        ordering: &LexOrdering,
        fetch: Option<usize>,
        batch_size: usize,
        label: &str,
    ) -> Vec<RecordBatch> {
        let out = merged(partitions.to_vec(), ordering, fetch, batch_size).await;
        let got = concat_batches(&schema(), &out).unwrap();
        assert_eq!(
            got,
            expected(sorted, ordering, fetch),
            "{label}, fetch {fetch:?}, batch size {batch_size}, ordering {ordering}"
        );
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merge_matches_a_stable_sort_of_all_inputs() {
        let asc = SortOptions::default();
        let orderings = [
            ordering(&[("k", asc)]),
            ordering(&[("f", DESC_NULLS_LAST)]),
            ordering(&[("s", asc), ("k", DESC_NULLS_LAST)]),
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (case, &rows) in [0usize, 1, 2, 7, 49, 50, 51, 1000, 5000].iter().enumerate() {
            for distinct in [1u64, 3, 1000] {
                for ordering in &orderings {
                    let inputs = 1 + case % 4;
                    let sorted: Vec<RecordBatch> = (0..inputs)
                        .map(|i| {
                            let n = rows / inputs + (i == 0) as usize * (rows % inputs);
                            sort_batch(&random_batch(&mut rng, n, distinct, i as u32), ordering)
                        })
                        .collect();
                    let partitions: Vec<Vec<RecordBatch>> =
                        sorted.iter().map(|p| cut(&mut rng, p)).collect();
                    let label = format!("rows {rows}, distinct {distinct}, inputs {inputs}");
                    for fetch in [None, Some(0), Some(1), Some(rows / 2 + 1)] {
                        let batch_size = 1 + rng.below(700) as usize;
                        let out = merged_checked(
                            &sorted,
                            &partitions,
                            ordering,
                            fetch,
                            batch_size,
                            &label,
                        )
                        .await;
                        assert!(out.iter().all(|b| b.num_rows() <= batch_size.max(300)));
                    }
                }
            }
        }
    }

    /// Two inputs whose keys interleave finely, coarsely (long runs,
    /// sliced), with ties between the inputs, and one running out of
    /// batches first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_inputs_merge_like_a_stable_sort() {
        let asc = SortOptions::default();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for (rows_a, rows_b) in [(20_000, 20_000), (20_000, 3_000), (7, 20_000)] {
            for distinct in [3u64, 1000, 1 << 20] {
                for ordering in [ordering(&[("k", asc)]), ordering(&[("f", DESC_NULLS_LAST)])] {
                    let sorted = [(rows_a, 0), (rows_b, 1)].map(|(n, i)| {
                        sort_batch(&random_batch(&mut rng, n, distinct, i), &ordering)
                    });
                    let partitions: Vec<Vec<RecordBatch>> =
                        sorted.iter().map(|p| cut(&mut rng, p)).collect();
                    let label = format!("rows {rows_a} and {rows_b}, distinct {distinct}");
                    for fetch in [None, Some(rows_b / 3)] {
                        let batch_size = [7, 300, 4096][rng.below(3) as usize];
                        merged_checked(&sorted, &partitions, &ordering, fetch, batch_size, &label)
                            .await;
                    }
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_runs_leave_as_slices_of_the_input() {
        let asc = SortOptions::default();
        let ordering = ordering(&[("k", asc)]);
        // Input 0 holds keys 0..1000, input 1 keys 1000..2000: two runs.
        let batch = |origin: u32, base: i32| {
            let k = Int32Array::from_iter_values(base..base + 1000);
            let f = Float64Array::from(vec![0.0; 1000]);
            let s = StringArray::from(vec!["x"; 1000]);
            let o = UInt32Array::from(vec![origin; 1000]);
            let columns: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(f), Arc::new(s), Arc::new(o)];
            RecordBatch::try_new(schema(), columns).unwrap()
        };
        let (zero, one) = (batch(0, 0), batch(1, 1000));
        let out = merged(
            vec![vec![one.clone()], vec![zero.clone()]],
            &ordering,
            None,
            4096,
        )
        .await;
        assert_eq!(out.len(), 2, "each run is one slice, not one copied batch");
        let same_buffer = |a: &RecordBatch, b: &RecordBatch| {
            a.column(0).to_data().buffers()[0].as_ptr()
                == b.column(0).to_data().buffers()[0].as_ptr()
        };
        assert!(same_buffer(&out[0], &zero) && same_buffer(&out[1], &one));
        assert_eq!(out[0].column(0).len(), 1000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interleaved_rows_keep_no_input_string_bytes_alive() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let long = |k: i32| format!("string number {k}, past twelve bytes");
        // Input 0 holds the even keys, input 1 the odd ones: runs of one.
        let input = |first: i32| {
            let keys: Vec<i32> = (0..500).map(|i| first + 2 * i).collect();
            let strings: StringViewArray = keys
                .iter()
                .map(|&k| (k % 7 != 0).then(|| long(k)))
                .collect();
            let columns: Vec<ArrayRef> = vec![Arc::new(Int32Array::from(keys)), Arc::new(strings)];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        };
        let inputs = [input(0), input(1)];
        let partitions: Vec<Vec<RecordBatch>> = inputs.iter().map(|b| vec![b.clone()]).collect();
        let source =
            MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        let ordering = LexOrdering::new([PhysicalSortExpr {
            expr: col("k", &schema).unwrap(),
            options: SortOptions::default(),
        }])
        .unwrap();
        let merge = DeviceMergeExec::new(ordering, source);
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_batch_size(128));
        let out = collect(Arc::new(merge), ctx.task_ctx()).await.unwrap();

        let got = concat_batches(&schema, &out).unwrap();
        let keys: Vec<i32> = (0..1000).collect();
        let strings: StringViewArray = keys
            .iter()
            .map(|&k| (k % 7 != 0).then(|| long(k)))
            .collect();
        let want = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int32Array::from(keys)), Arc::new(strings)],
        )
        .unwrap();
        assert_eq!(got, want);
        let ranges = |batch: &RecordBatch| -> Vec<std::ops::Range<*const u8>> {
            let views = batch.column(1).as_string_view();
            views
                .data_buffers()
                .iter()
                .map(|b| b.as_slice().as_ptr_range())
                .collect()
        };
        let input_ranges: Vec<_> = inputs.iter().flat_map(ranges).collect();
        for batch in &out {
            for range in ranges(batch) {
                assert!(
                    input_ranges
                        .iter()
                        .all(|i| range.end <= i.start || i.end <= range.start),
                    "an output string buffer lies in an input's memory"
                );
            }
        }
    }

    /// A merge state by `keys` over no inputs, to look at how it keys batches.
    fn merge_of_no_inputs(keys: &[(&str, SortOptions)]) -> RunMerge {
        let metrics = BaselineMetrics::new(&ExecutionPlanMetricsSet::new(), 0);
        RunMerge::try_new(vec![], schema(), ordering(keys), 100, None, metrics).unwrap()
    }

    /// A batch whose first and last keys match keeps one key for all its
    /// rows; a batch whose keys differ, or that holds one row, keeps each
    /// row's.
    #[test]
    fn a_batch_of_one_key_keeps_one_row_of_keys() {
        let asc = SortOptions::default();
        let merge = merge_of_no_inputs(&[("s", asc), ("k", asc)]);
        let batch = |k: Vec<i32>, s: Vec<&str>| {
            let n = k.len();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int32Array::from(k)),
                Arc::new(Float64Array::from(vec![0.0; n])),
                Arc::new(StringArray::from(s)),
                Arc::new(UInt32Array::from(vec![0; n])),
            ];
            RecordBatch::try_new(schema(), columns).unwrap()
        };
        let same = merge.key_rows(&batch(vec![4; 5], vec!["a"; 5])).unwrap();
        assert!(matches!(same, BatchKeys::Same { rows: 5, .. }));
        assert_eq!(same.num_rows(), 5);
        assert_eq!(same.row(4), same.row(0));
        // Same first column, different second: each row's key.
        let each = merge
            .key_rows(&batch(vec![1, 2, 4], vec!["a", "a", "a"]))
            .unwrap();
        assert!(matches!(each, BatchKeys::Each(_)));
        assert!(each.row(0) < each.row(2));
        let one = merge.key_rows(&batch(vec![1], vec!["a"])).unwrap();
        assert!(matches!(one, BatchKeys::Each(_)));
        // A run over a batch of one key ends at the batch's end or its
        // start, as the bound falls.
        let bound = merge.key_rows(&batch(vec![4], vec!["a"])).unwrap();
        assert_eq!(gallop(&same, 1, bound.row(0), true), 5);
        let above = merge.key_rows(&batch(vec![5], vec!["a"])).unwrap();
        assert_eq!(gallop(&same, 2, above.row(0), false), 5);
    }

    /// One fixed-width key is compared as key images (the merge test
    /// above runs such orderings); strings and several keys in row format.
    #[test]
    fn one_fixed_width_key_is_compared_as_images() {
        let by = |keys: &[(&str, SortOptions)]| merge_of_no_inputs(keys).by_image;
        let asc = SortOptions::default();
        assert!(by(&[("k", asc)]) && by(&[("f", asc)]));
        assert!(!by(&[("s", asc)]) && !by(&[("k", asc), ("f", asc)]));
    }

    /// In row format and as key images alike.
    #[test]
    fn gallop_finds_the_end_of_a_run() {
        let asc = SortOptions::default();
        let converter = RowConverter::new(vec![SortField::new(DataType::Int32)]).unwrap();
        let images = |a: &ArrayRef| key_images(a.as_ref(), asc).unwrap().unwrap();
        let values = [1, 2, 2, 2, 3, 5, 5, 8, 9, 9, 9, 9, 9, 9, 9, 12];
        let column: ArrayRef = Arc::new(Int32Array::from(values.to_vec()));
        let rows = converter.convert_columns(&[Arc::clone(&column)]).unwrap();
        let keys = [BatchKeys::Each(rows), BatchKeys::Images(images(&column))];
        for bound in 0..14 {
            let probe: ArrayRef = Arc::new(Int32Array::from(vec![bound]));
            let probe_row = converter.convert_columns(&[Arc::clone(&probe)]).unwrap();
            let probes = [Key::Row(probe_row.row(0)), Key::Image(images(&probe)[0])];
            for (keys, probe) in keys.iter().zip(probes) {
                for start in 0..values.len() {
                    for take_ties in [false, true] {
                        let in_run = |v: i32| if take_ties { v <= bound } else { v < bound };
                        if !in_run(values[start]) {
                            continue;
                        }
                        let want =
                            start + values[start..].iter().take_while(|&&v| in_run(v)).count();
                        assert_eq!(gallop(keys, start, probe, take_ties), want);
                    }
                }
            }
        }
    }
}
