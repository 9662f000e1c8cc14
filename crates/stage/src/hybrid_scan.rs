//! [`HybridScanExec`]: reads partitions stored in the hybrid layout (key
//! columns column-wise, the rest row-wise; see `insitu_format::hybrid`).
//!
//! ```text
//!   HybridScanExec (files dealt round-robin to output partitions)
//!     for each block of each file, one ranged read of
//!       key block (Arrow IPC)  +  row slots  +  heap bytes
//!     -> decode the projected columns -> batches of batch_size rows
//! ```
//!
//! It reads through an `ObjectStore` named by URL, so the same operator
//! serves a device (its own files, every byte counted) and the host's pull
//! mode (range reads over the link).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{FieldRef, SchemaRef};
use bytes::Bytes;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use insitu_format::hybrid::{check_layout, decode_key_block, decode_rows, INLINE_VAR_BYTES_MAX};
use insitu_wire::{FormatDescriptor, HybridLayout, RowSlot};
use object_store::path::Path;
use object_store::ObjectStore;

/// One hybrid partition file: where it is and its descriptor (with blocks).
#[derive(Debug, Clone)]
pub struct HybridFile {
    pub path: Path,
    pub descriptor: FormatDescriptor,
}

impl HybridFile {
    /// Refuses a descriptor without a hybrid layout, or whose layout's
    /// slots readers could not slice ([`check_layout`]).
    pub fn new(path: Path, descriptor: FormatDescriptor) -> Result<Self> {
        let Some(layout) = descriptor.hybrid.as_ref() else {
            return internal_err!(
                "table {} partition {} is not in the hybrid layout",
                descriptor.table,
                descriptor.partition
            );
        };
        if let Err(e) = check_layout(layout, INLINE_VAR_BYTES_MAX) {
            return internal_err!(
                "table {} partition {}: hybrid layout: {e}",
                descriptor.table,
                descriptor.partition
            );
        }
        Ok(Self { path, descriptor })
    }

    pub fn layout(&self) -> &HybridLayout {
        self.descriptor.hybrid.as_ref().expect("checked in new")
    }

    pub fn row_count(&self) -> u64 {
        self.descriptor.row_count
    }
}

/// Which columns of a hybrid file a reader wants, and where each comes from.
#[derive(Debug, Clone)]
pub struct HybridProjection {
    /// Output fields, in output order.
    pub fields: Vec<FieldRef>,
    /// For each output field: `Key(i)` = column i of the key batch,
    /// `Row(j)` = position j in `row_slots`.
    pub sources: Vec<Source>,
    /// The row-wise fields to decode: (field number in the layout, slot).
    pub row_slots: Vec<(usize, RowSlot)>,
    /// Fields decoded from the row slots, in `row_slots` order.
    pub row_fields: Vec<FieldRef>,
}

#[derive(Debug, Clone, Copy)]
pub enum Source {
    Key(usize),
    Row(usize),
}

impl HybridProjection {
    /// Maps `output` (fields of the table) onto `layout`.
    pub fn new(output: &SchemaRef, layout: &HybridLayout) -> Result<Self> {
        let mut sources = Vec::with_capacity(output.fields().len());
        let (mut row_slots, mut row_fields) = (vec![], vec![]);
        for field in output.fields() {
            if let Some(k) = layout.key_columns.iter().position(|c| c == field.name()) {
                sources.push(Source::Key(k));
            } else if let Some(j) = layout.slots.iter().position(|s| s.name == *field.name()) {
                sources.push(Source::Row(row_slots.len()));
                row_slots.push((j, layout.slots[j].clone()));
                row_fields.push(Arc::clone(field));
            } else {
                return internal_err!("column {} is not in the hybrid layout", field.name());
            }
        }
        Ok(Self {
            fields: output.fields().iter().cloned().collect(),
            sources,
            row_slots,
            row_fields,
        })
    }

    pub fn needs_keys(&self) -> bool {
        self.sources.iter().any(|s| matches!(s, Source::Key(_)))
    }

    pub fn needs_rows(&self) -> bool {
        !self.row_slots.is_empty()
    }

    pub fn needs_heap(&self) -> bool {
        self.row_slots.iter().any(|(_, s)| s.variable_length)
    }

    /// Decodes `bytes.slots` (whole rows) and assembles the output batch
    /// with the key columns `keys` (already in the same row order).
    pub fn assemble(
        &self,
        schema: &SchemaRef,
        keys: &[ArrayRef],
        bytes: RowBytes<'_>,
        layout: &HybridLayout,
        rows: usize,
    ) -> Result<RecordBatch> {
        let RowBytes {
            slots,
            heap,
            heap_base,
        } = bytes;
        let slot_refs: Vec<(usize, &RowSlot)> =
            self.row_slots.iter().map(|(j, s)| (*j, s)).collect();
        let decoded = if self.needs_rows() {
            decode_rows(
                slots,
                layout.row_width_bytes,
                &slot_refs,
                &self.row_fields,
                heap,
                heap_base,
            )
            .map_err(|e| DataFusionError::External(Box::new(e)))?
        } else {
            vec![]
        };
        let columns: Vec<ArrayRef> = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Key(k) => Arc::clone(&keys[*k]),
                Source::Row(j) => Arc::clone(&decoded[*j]),
            })
            .collect();
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            columns,
            &options,
        )?)
    }
}

/// Row slots (whole rows) and the heap bytes they point into, which start
/// at heap offset `heap_base`.
#[derive(Debug, Clone, Copy)]
pub struct RowBytes<'a> {
    pub slots: &'a [u8],
    pub heap: &'a [u8],
    pub heap_base: u64,
}

/// Reads `ranges` of `file` in one request.
pub async fn read_ranges(
    store: &Arc<dyn ObjectStore>,
    file: &HybridFile,
    ranges: &[Range<u64>],
) -> Result<Vec<Bytes>> {
    let wanted: Vec<Range<u64>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
    let mut got = if wanted.is_empty() {
        vec![]
    } else {
        store
            .get_ranges(&file.path, &wanted)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
    }
    .into_iter();
    Ok(ranges
        .iter()
        .map(|r| {
            if r.is_empty() {
                Bytes::new()
            } else {
                got.next().expect("one answer per range")
            }
        })
        .collect())
}

/// Scans hybrid partition files in row order.
#[derive(Debug)]
pub struct HybridScanExec {
    store_url: ObjectStoreUrl,
    files: Vec<HybridFile>,
    table_schema: SchemaRef,
    projection: Option<Vec<usize>>,
    output_schema: SchemaRef,
    partitions: usize,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl HybridScanExec {
    /// Scans `files` (all of one table, whose schema is `table_schema`)
    /// through the store at `store_url`, spread over up to `partitions`
    /// output partitions.
    pub fn try_new(
        store_url: ObjectStoreUrl,
        files: Vec<HybridFile>,
        table_schema: SchemaRef,
        projection: Option<Vec<usize>>,
        partitions: usize,
    ) -> Result<Self> {
        let output_schema = match &projection {
            Some(p) => Arc::new(table_schema.project(p)?),
            None => Arc::clone(&table_schema),
        };
        for f in &files {
            HybridProjection::new(&output_schema, f.layout())?;
        }
        let partitions = partitions.clamp(1, files.len().max(1));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&output_schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            store_url,
            files,
            table_schema,
            projection,
            output_schema,
            partitions,
            metrics: ExecutionPlanMetricsSet::new(),
            properties: Arc::new(properties),
        })
    }

    pub fn files(&self) -> &[HybridFile] {
        &self.files
    }

    pub fn store_url(&self) -> &ObjectStoreUrl {
        &self.store_url
    }

    pub fn table_schema(&self) -> &SchemaRef {
        &self.table_schema
    }

    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }

    /// Whether every file stores each of `columns` column-wise.
    pub fn keys_are_columnar(&self, columns: &[&str]) -> bool {
        self.files.iter().all(|f| {
            columns
                .iter()
                .all(|c| f.layout().key_columns.iter().any(|k| k == c))
        })
    }
}

impl DisplayAs for HybridScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys = self
            .files
            .first()
            .map(|f| f.layout().key_columns.join(", "))
            .unwrap_or_default();
        write!(
            f,
            "HybridScanExec: files={}, keys=[{keys}]",
            self.files.len()
        )?;
        if self.projection.is_some() {
            let names: Vec<_> = self
                .output_schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            write!(f, ", projection=[{}]", names.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for HybridScanExec {
    fn name(&self) -> &str {
        "HybridScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.partitions {
            return internal_err!("HybridScanExec has {} partitions", self.partitions);
        }
        let store = context.runtime_env().object_store(&self.store_url)?;
        let batch_rows = context.session_config().batch_size().max(1);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let rows_read = MetricBuilder::new(&self.metrics).counter("rows_read", partition);
        let mut work = vec![];
        for file in self.files.iter().skip(partition).step_by(self.partitions) {
            let projection = HybridProjection::new(&self.output_schema, file.layout())?;
            let file = Arc::new(file.clone());
            let projection = Arc::new(projection);
            let mut row_start = 0u64;
            for b in 0..file.layout().blocks.len() {
                work.push(BlockRead {
                    file: Arc::clone(&file),
                    projection: Arc::clone(&projection),
                    block: b,
                    row_start,
                });
                row_start += file.layout().blocks[b].rows;
            }
        }
        let schema = Arc::clone(&self.output_schema);
        let stream = futures::stream::iter(work)
            .then(move |read| {
                let (store, schema) = (Arc::clone(&store), Arc::clone(&schema));
                async move { read.run(&store, &schema).await }
            })
            .map_ok(move |batch| {
                let n = batch.num_rows();
                let pieces: Vec<Result<RecordBatch>> = (0..n)
                    .step_by(batch_rows)
                    .map(|at| Ok(batch.slice(at, batch_rows.min(n - at))))
                    .collect();
                futures::stream::iter(pieces)
            })
            .try_flatten()
            .inspect_ok(move |b| {
                baseline.record_output(b.num_rows());
                count(&rows_read, b.num_rows());
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.output_schema),
            stream,
        )))
    }
}

fn count(counter: &Count, n: usize) {
    counter.add(n);
}

/// One block of one file, to read and decode.
struct BlockRead {
    file: Arc<HybridFile>,
    projection: Arc<HybridProjection>,
    block: usize,
    row_start: u64,
}

impl BlockRead {
    async fn run(&self, store: &Arc<dyn ObjectStore>, schema: &SchemaRef) -> Result<RecordBatch> {
        let layout = self.file.layout();
        let block = &layout.blocks[self.block];
        let width = layout.row_width_bytes as u64;
        let p = &self.projection;
        let empty = 0..0;
        let key_range = if p.needs_keys() {
            block.key.range()
        } else {
            empty.clone()
        };
        let row_range = if p.needs_rows() {
            let start = layout.row_section.offset + self.row_start * width;
            start..start + block.rows * width
        } else {
            empty.clone()
        };
        let heap_range = if p.needs_heap() {
            block.heap.range()
        } else {
            empty
        };
        let [keys, slots, heap] = <[Bytes; 3]>::try_from(
            read_ranges(store, &self.file, &[key_range, row_range, heap_range]).await?,
        )
        .expect("three ranges");
        let key_columns = if p.needs_keys() {
            decode_key_block(&keys, block.rows)
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .columns()
                .to_vec()
        } else {
            vec![]
        };
        let heap_base = block.heap.offset - layout.heap_section.offset;
        let bytes = RowBytes {
            slots: &slots,
            heap: &heap,
            heap_base,
        };
        p.assemble(schema, &key_columns, bytes, layout, block.rows as usize)
    }
}
