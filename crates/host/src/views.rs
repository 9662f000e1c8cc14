//! [`ShrinkViewsExec`]: string and binary view columns that hold no more
//! memory than their rows use, above every join of the host's plan.
//!
//! ```text
//!  SortExec                         SortExec
//!    HashJoinExec          ==>        ShrinkViewsExec
//!      build: supplier                  HashJoinExec
//!      probe: lineitem                    build: supplier
//!                                         probe: lineitem
//! ```
//!
//! A join gathers its output rows with `take`, and a gathered view array
//! keeps every data buffer of its source: each output batch of
//! `supplier ⋈ lineitem` names all of the supplier's `s_name` bytes. The
//! memory pool counts those buffers once per batch, so at TPC-H SF10 a
//! sort above Q21's joins counted 16.3 GB for 580 MB of rows and asked the
//! host budget for 1.75 GiB to take a single batch. Shrunk (each buffer
//! listed once, or the strings copied when the buffers hold more than
//! twice what the rows use, see [`insitu_kernels::shrink_views`]), a batch
//! holds and reports what it uses.
//!
//! [`SortPlainStrings`] does the same for host sorts, whose sorted output
//! chunks are `take`s of their input: each chunk of a sorted view column
//! names all the input's string bytes (Q21's right join input, 700 K rows
//! at SF10, asked for 1.75 GiB). A sort by plain columns gets its view
//! columns as `LargeUtf8` / `LargeBinary` and hands them on as views
//! again:
//!
//! ```text
//!  SortExec [k]                 CastViewsExec (to views)
//!    input (s: Utf8View)  ==>     SortExec [k]
//!                                   CastViewsExec (to plain: s LargeUtf8)
//!                                     input (s: Utf8View)
//! ```

use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Result};
use datafusion::config::ConfigOptions;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec,
};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;
use insitu_kernels::shrink_views;

/// Passes its input's batches on with their view columns shrunk.
#[derive(Debug, Clone)]
pub struct ShrinkViewsExec {
    input: Arc<dyn ExecutionPlan>,
    metrics: ExecutionPlanMetricsSet,
}

impl ShrinkViewsExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            input,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for ShrinkViewsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ShrinkViewsExec")
    }
}

impl ExecutionPlan for ShrinkViewsExec {
    fn name(&self) -> &str {
        "ShrinkViewsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("ShrinkViewsExec takes one child, got {}", children.len());
        }
        Ok(Arc::new(Self::new(children.swap_remove(0))))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let stream = input.map(move |batch| {
            let _timer = metrics.elapsed_compute().timer();
            let shrunk = batch.and_then(|b| Ok(shrink_batch_views(&b)?));
            if let Ok(b) = &shrunk {
                metrics.record_output(b.num_rows());
            }
            shrunk
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// `batch` with each string or binary view column shrunk.
pub fn shrink_batch_views(batch: &RecordBatch) -> arrow::error::Result<RecordBatch> {
    if !has_views(batch.schema_ref()) {
        return Ok(batch.clone());
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(shrink_views(c.as_string_view())) as ArrayRef,
            DataType::BinaryView => Arc::new(shrink_views(c.as_binary_view())) as ArrayRef,
            _ => Arc::clone(c),
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

fn has_views(schema: &Schema) -> bool {
    schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView))
}

fn is_join(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<HashJoinExec>()
        || plan.is::<SortMergeJoinExec>()
        || plan.is::<NestedLoopJoinExec>()
        || plan.is::<CrossJoinExec>()
}

/// Puts a [`ShrinkViewsExec`] above every join whose output has view
/// columns.
#[derive(Debug, Default)]
pub struct ShrinkJoinViews;

impl PhysicalOptimizerRule for ShrinkJoinViews {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan
            .transform_up(|node| {
                let node = shrink_build_side(node)?;
                if is_join(node.as_ref()) && has_views(&node.schema()) {
                    Ok(Transformed::yes(Arc::new(ShrinkViewsExec::new(node)) as _))
                } else {
                    Ok(Transformed::no(node))
                }
            })?
            .data)
    }

    fn name(&self) -> &str {
        "insitu_shrink_join_views"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A hash join whose build side has view columns, with that side shrunk
/// as it arrives: the repartition under it `take`s rows into batches that
/// each name all the buffers of their source, and the join holds them
/// all (TPC-H Q10 at SF10 held 436 MB for 573 K rows of customers).
fn shrink_build_side(node: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(join) = node.downcast_ref::<HashJoinExec>() else {
        return Ok(node);
    };
    let build = join.left();
    if !has_views(&build.schema()) || build.is::<ShrinkViewsExec>() {
        return Ok(node);
    }
    let shrunk = Arc::new(ShrinkViewsExec::new(Arc::clone(build))) as Arc<dyn ExecutionPlan>;
    let probe = Arc::clone(join.right());
    // The build side's partitioning and order stay as they were.
    let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    Arc::clone(&node).replace_children(vec![shrunk, probe], options)
}

/// Which way a [`CastViewsExec`] casts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewCast {
    /// `Utf8View` to `LargeUtf8`, `BinaryView` to `LargeBinary`.
    ToPlain,
    /// Back: `LargeUtf8` to `Utf8View`, `LargeBinary` to `BinaryView`.
    ToViews,
}

impl ViewCast {
    fn cast(self, t: &DataType) -> Option<DataType> {
        match (self, t) {
            (ViewCast::ToPlain, DataType::Utf8View) => Some(DataType::LargeUtf8),
            (ViewCast::ToPlain, DataType::BinaryView) => Some(DataType::LargeBinary),
            (ViewCast::ToViews, DataType::LargeUtf8) => Some(DataType::Utf8View),
            (ViewCast::ToViews, DataType::LargeBinary) => Some(DataType::BinaryView),
            _ => None,
        }
    }

    fn schema(self, schema: &Schema) -> SchemaRef {
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| match self.cast(f.data_type()) {
                Some(t) => f.as_ref().clone().with_data_type(t),
                None => f.as_ref().clone(),
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }
}

/// Casts its input's string and binary columns between views and plain
/// (`Large*`) arrays, keeping rows, order and partitioning.
#[derive(Debug, Clone)]
pub struct CastViewsExec {
    input: Arc<dyn ExecutionPlan>,
    cast: ViewCast,
    properties: Arc<PlanProperties>,
}

impl CastViewsExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, cast: ViewCast) -> Self {
        let schema = cast.schema(&input.schema());
        // Orderings by plain columns hold after the cast (same rows, same
        // indices); anything else is dropped rather than rewritten.
        let orderings = input
            .output_ordering()
            .filter(|o| o.iter().all(|e| e.expr.is::<Column>()))
            .map(|o| o.iter().cloned().collect::<Vec<_>>());
        let eq = EquivalenceProperties::new_with_orderings(Arc::clone(&schema), orderings);
        let properties = PlanProperties::new(
            eq,
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Self {
            input,
            cast,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for CastViewsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.cast {
            ViewCast::ToPlain => write!(f, "CastViewsExec: to plain"),
            ViewCast::ToViews => write!(f, "CastViewsExec: to views"),
        }
    }
}

impl ExecutionPlan for CastViewsExec {
    fn name(&self) -> &str {
        "CastViewsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("CastViewsExec takes one child, got {}", children.len());
        }
        Ok(Arc::new(Self::new(children.swap_remove(0), self.cast)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let (schema, cast) = (self.schema(), self.cast);
        let out = Arc::clone(&schema);
        let stream = input.map(move |batch| {
            let batch = batch?;
            let columns = batch
                .columns()
                .iter()
                .map(|c| match cast.cast(c.data_type()) {
                    Some(t) => arrow::compute::cast(c, &t),
                    None => Ok(Arc::clone(c)),
                })
                .collect::<arrow::error::Result<Vec<_>>>()?;
            Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Sorts view columns as plain arrays (see the module doc): every full
/// sort (not a top-k, whose heap copies its rows) by plain columns over
/// an input with view columns.
#[derive(Debug, Default)]
pub struct SortPlainStrings;

impl PhysicalOptimizerRule for SortPlainStrings {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan.transform_up(|node| Ok(sort_plain(node)))?.data)
    }

    fn name(&self) -> &str {
        "insitu_sort_plain_strings"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn sort_plain(node: Arc<dyn ExecutionPlan>) -> Transformed<Arc<dyn ExecutionPlan>> {
    let Some(sort) = node.downcast_ref::<SortExec>() else {
        return Transformed::no(node);
    };
    let by_columns = sort.expr().iter().all(|e| e.expr.is::<Column>());
    if sort.fetch().is_some() || !by_columns || !has_views(&sort.input().schema()) {
        return Transformed::no(node);
    }
    let plain = Arc::new(CastViewsExec::new(
        Arc::clone(sort.input()),
        ViewCast::ToPlain,
    ));
    let sorted = SortExec::new(sort.expr().clone(), plain)
        .with_preserve_partitioning(sort.preserve_partitioning());
    Transformed::yes(Arc::new(CastViewsExec::new(
        Arc::new(sorted),
        ViewCast::ToViews,
    )))
}

/// Bytes a batch's arrays hold, each buffer counted once per array (what
/// DataFusion's memory accounting counts).
pub fn held_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.get_array_memory_size())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BinaryViewArray, Int64Array, StringViewArray, UInt32Array};
    use arrow::compute::take;
    use arrow::datatypes::Field;

    fn names(n: usize) -> StringViewArray {
        StringViewArray::from_iter_values((0..n).map(|i| format!("Supplier#{i:012}")))
    }

    /// A gathered batch as a join emits it: a few rows naming all of a
    /// large source's buffers.
    fn gathered(source_rows: usize, rows: usize) -> RecordBatch {
        let source = names(source_rows);
        let idx =
            UInt32Array::from_iter_values((0..rows as u32).map(|i| i * 7 % source_rows as u32));
        let s = take(&source, &idx, None).unwrap();
        let k = Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        RecordBatch::try_new(schema, vec![k, s]).unwrap()
    }

    #[test]
    fn a_gathered_batch_shrinks_to_what_its_rows_use_and_stays_equal() {
        for (source_rows, rows) in [(100_000, 0), (100_000, 1), (100_000, 7), (100_000, 4096)] {
            let batch = gathered(source_rows, rows);
            let shrunk = shrink_batch_views(&batch).unwrap();
            assert_eq!(shrunk, batch, "{rows} rows");
            let used = rows * (16 + 21) + 8 * rows;
            assert!(
                rows == 0 || held_bytes(&batch) > 1_000_000,
                "{rows}: {}",
                held_bytes(&batch)
            );
            assert!(
                held_bytes(&shrunk) <= 2 * used + 64 * 1024,
                "{rows} rows hold {} bytes",
                held_bytes(&shrunk)
            );
        }
    }

    #[test]
    fn batches_without_views_and_small_ones_pass_as_they_are() {
        let k = Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])) as ArrayRef;
        let batch = RecordBatch::try_from_iter([("k", k)]).unwrap();
        assert_eq!(shrink_batch_views(&batch).unwrap(), batch);
        let s = Arc::new(StringViewArray::from(vec![
            Some("a string past twelve"),
            None,
        ]));
        let b = Arc::new(BinaryViewArray::from(vec![Some(&b"bytes"[..]), None]));
        let batch =
            RecordBatch::try_from_iter([("s", s as ArrayRef), ("b", b as ArrayRef)]).unwrap();
        assert_eq!(shrink_batch_views(&batch).unwrap(), batch);
    }

    #[test]
    fn the_rule_wraps_joins_with_view_output_only() {
        use datafusion::prelude::SessionContext;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let ctx = SessionContext::new();
            let sql = "select a.s, b.k from (values (1, arrow_cast('x', 'Utf8View'))) a(k, s) \
                       join (values (1)) b(k) on a.k = b.k";
            let plan = ctx
                .sql(sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let plan = ShrinkJoinViews
                .optimize(plan, &ConfigOptions::new())
                .unwrap();
            let text = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(text.contains("ShrinkViewsExec"), "{text}");
            let ints = "select a.k from (values (1)) a(k) join (values (1)) b(k) on a.k = b.k";
            let plan = ctx
                .sql(ints)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let plan = ShrinkJoinViews
                .optimize(plan, &ConfigOptions::new())
                .unwrap();
            let text = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(!text.contains("ShrinkViewsExec"), "{text}");
        });
    }

    /// A sort of a gathered view column within a small pool: as planned
    /// by DataFusion every sorted chunk counts the source's buffers and
    /// the pool refuses it; sorted as plain strings it fits, and the
    /// answer is the same with the same schema.
    #[test]
    fn sorts_of_gathered_views_fit_a_small_pool_as_plain_strings() {
        use datafusion::datasource::MemTable;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::execution::SessionStateBuilder;
        use datafusion::prelude::{SessionConfig, SessionContext};
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batch = gathered(200_000, 20_000);
        let run = |rule: bool| {
            let batch = batch.clone();
            rt.block_on(async move {
                let runtime = RuntimeEnvBuilder::new()
                    .with_memory_limit(16 << 20, 1.0)
                    .build_arc()
                    .unwrap();
                let config = SessionConfig::new()
                    .with_target_partitions(1)
                    .with_batch_size(1024);
                let state = SessionStateBuilder::new()
                    .with_config(config)
                    .with_runtime_env(runtime)
                    .with_default_features()
                    .build();
                let ctx = SessionContext::new_with_state(state);
                let table = MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
                ctx.register_table("t", Arc::new(table)).unwrap();
                let df = ctx.sql("select k, s from t order by s, k").await.unwrap();
                let mut plan = df.create_physical_plan().await.unwrap();
                if rule {
                    plan = SortPlainStrings
                        .optimize(plan, &ConfigOptions::new())
                        .unwrap();
                }
                let text = datafusion::physical_plan::displayable(plan.as_ref())
                    .indent(true)
                    .to_string();
                let out = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await;
                (text, out)
            })
        };
        let (_, plain) = run(false);
        let e = plain.expect_err("DataFusion's sort counts every chunk's buffers");
        assert!(e.to_string().contains("Resources exhausted"), "{e}");
        let (plan, sorted) = run(true);
        assert!(plan.contains("CastViewsExec: to plain"), "{plan}");
        let sorted = arrow::compute::concat_batches(&batch.schema(), &sorted.unwrap()).unwrap();
        assert_eq!(sorted.schema(), batch.schema(), "views again");
        // The reference: arrow's sort of the same rows.
        let by = [
            arrow::compute::SortColumn {
                values: Arc::clone(batch.column(1)),
                options: None,
            },
            arrow::compute::SortColumn {
                values: Arc::clone(batch.column(0)),
                options: None,
            },
        ];
        let order = arrow::compute::lexsort_to_indices(&by, None).unwrap();
        let expected = arrow::compute::take_record_batch(&batch, &order).unwrap();
        assert_eq!(sorted, expected);
    }
}
