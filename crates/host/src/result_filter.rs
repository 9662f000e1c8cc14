//! Run-time filters on device results: DataFusion's dynamic filters (a
//! hash join's build-side keys, a top-k's running threshold) that reach a
//! [`DeviceScanExec`](crate::scan::DeviceScanExec) are applied to its
//! results as they arrive, before any host operator holds them.
//!
//! ```text
//!  HashJoinExec (build: 86 K partsupp keys) ──┐ dynamic filter
//!    AggregateExec(Final)                      │ (keys of the build side)
//!      DeviceScanExec ◄────────────────────────┘
//!        rows whose keys the build side lacks are dropped on arrival
//! ```
//!
//! TPC-H Q20 at SF10: the final aggregate over lineitem held 5.4 M groups
//! although the semi join above it keeps 59 K; filtered on arrival, it holds
//! the groups the join can match.
//!
//! A dynamic filter is only a hint: the operator that made it still applies
//! its own condition. So a scan reports every filter as not pushed down and
//! may drop one it cannot carry (an operator folded into the stage that
//! computes the filtered columns). A filter that is not complete yet passes
//! every row.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::{batch_filter, FilterExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::ExecutionPlan;

/// Whether `filter` is a run-time hint (a dynamic filter) rather than a
/// condition the plan depends on.
pub fn is_dynamic(filter: &Arc<dyn PhysicalExpr>) -> bool {
    filter.downcast_ref::<DynamicFilterPhysicalExpr>().is_some()
}

/// `filters` over `op`'s input rewritten over its output, for the filters
/// whose columns `op` passes on unchanged; the others are dropped.
pub fn lift_through(
    filters: &[Arc<dyn PhysicalExpr>],
    op: &Arc<dyn ExecutionPlan>,
) -> Vec<Arc<dyn PhysicalExpr>> {
    let Some(moves) = passed_columns(op) else {
        return vec![];
    };
    let schema = op.schema();
    filters
        .iter()
        .filter_map(|filter| {
            let mut complete = true;
            let lifted = Arc::clone(filter)
                .transform_up(|expr| {
                    let Some(column) = expr.downcast_ref::<Column>() else {
                        return Ok(Transformed::no(expr));
                    };
                    let Some(&to) = moves.get(&column.index()) else {
                        complete = false;
                        return Ok(Transformed::no(expr));
                    };
                    let moved = Column::new(schema.field(to).name(), to);
                    Ok(Transformed::yes(Arc::new(moved) as Arc<dyn PhysicalExpr>))
                })
                .ok()?
                .data;
            complete.then_some(lifted)
        })
        .collect()
}

/// For each input column `op` outputs unchanged, its output index.
fn passed_columns(op: &Arc<dyn ExecutionPlan>) -> Option<HashMap<usize, usize>> {
    let input_width = op.children().first()?.schema().fields().len();
    let identity = || (0..input_width).map(|i| (i, i)).collect();
    if op.is::<RepartitionExec>() || op.is::<SortExec>() {
        return Some(identity());
    }
    if let Some(filter) = op.downcast_ref::<FilterExec>() {
        return Some(match filter.projection() {
            None => identity(),
            Some(projection) => projection
                .iter()
                .enumerate()
                .map(|(to, &from)| (from, to))
                .collect(),
        });
    }
    let outputs: Vec<&Arc<dyn PhysicalExpr>> = if let Some(p) = op.downcast_ref::<ProjectionExec>()
    {
        p.expr().iter().map(|e| &e.expr).collect()
    } else if let Some(a) = op.downcast_ref::<AggregateExec>() {
        // Groups of a partial aggregate are its first output columns.
        if *a.mode() != AggregateMode::Partial || !a.group_expr().is_single() {
            return None;
        }
        a.group_expr().expr().iter().map(|(e, _)| e).collect()
    } else {
        return None;
    };
    let mut moves = HashMap::new();
    for (to, expr) in outputs.into_iter().enumerate() {
        if let Some(column) = expr.downcast_ref::<Column>() {
            moves.entry(column.index()).or_insert(to);
        }
    }
    Some(moves)
}

/// `plan` (which replaced a device scan with result filters) under a
/// filter with them: the placement rule moved the scan's work to the host.
pub fn on_host(
    plan: Arc<dyn ExecutionPlan>,
    filters: &[Arc<dyn PhysicalExpr>],
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(predicate) = conjunction_of(filters) else {
        return Ok(plan);
    };
    Ok(Arc::new(FilterExec::try_new(predicate, plan)?))
}

fn conjunction_of(filters: &[Arc<dyn PhysicalExpr>]) -> Option<Arc<dyn PhysicalExpr>> {
    filters.iter().cloned().reduce(|a, b| {
        Arc::new(BinaryExpr::new(
            a,
            datafusion::logical_expr::Operator::And,
            b,
        )) as _
    })
}

/// The rows of `batch` that pass every filter.
pub fn apply(filters: &[Arc<dyn PhysicalExpr>], batch: RecordBatch) -> Result<RecordBatch> {
    filters
        .iter()
        .try_fold(batch, |batch, filter| batch_filter(&batch, filter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, lit};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::projection::ProjectionExpr;

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]))
    }

    fn dynamic_on(column: &str, index: usize) -> Arc<DynamicFilterPhysicalExpr> {
        let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new(column, index));
        Arc::new(DynamicFilterPhysicalExpr::new(vec![key], lit(true)))
    }

    fn key_at_least(filter: &DynamicFilterPhysicalExpr, index: usize, min: i64) {
        let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new("k", index));
        let at_least = binary(key, Operator::GtEq, lit(min), &schema()).unwrap();
        filter.update(at_least).unwrap();
    }

    fn batch() -> RecordBatch {
        let keys = Int64Array::from(vec![Some(1), None, Some(5), Some(7), Some(3)]);
        let strings = StringArray::from(vec!["a", "b", "c", "d", "e"]);
        RecordBatch::try_new(schema(), vec![Arc::new(keys), Arc::new(strings)]).unwrap()
    }

    #[test]
    fn an_empty_dynamic_filter_keeps_every_row_and_an_updated_one_filters() {
        let filter = dynamic_on("k", 0);
        let filters: Vec<Arc<dyn PhysicalExpr>> = vec![filter.clone()];
        assert!(is_dynamic(&filters[0]));
        assert_eq!(apply(&filters, batch()).unwrap().num_rows(), 5);
        key_at_least(&filter, 0, 4);
        let kept = apply(&filters, batch()).unwrap();
        let keys = kept
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        // A null key never passes a comparison.
        assert_eq!(keys.values().to_vec(), vec![5, 7]);
    }

    #[test]
    fn a_filter_follows_its_column_through_a_projection_and_is_dropped_without_it() {
        let input = Arc::new(EmptyExec::new(schema()));
        let swap: Arc<dyn ExecutionPlan> = Arc::new(
            ProjectionExec::try_new(
                vec![
                    ProjectionExpr::new(Arc::new(Column::new("s", 1)), "s".to_string()),
                    ProjectionExpr::new(Arc::new(Column::new("k", 0)), "k".to_string()),
                ],
                input.clone(),
            )
            .unwrap(),
        );
        let filter = dynamic_on("k", 0);
        let lifted = lift_through(&[filter.clone() as Arc<dyn PhysicalExpr>], &swap);
        assert_eq!(lifted.len(), 1);
        key_at_least(&filter, 0, 4);
        let swapped = RecordBatch::try_new(
            swap.schema(),
            vec![batch().column(1).clone(), batch().column(0).clone()],
        )
        .unwrap();
        assert_eq!(apply(&lifted, swapped).unwrap().num_rows(), 2);

        let only_s: Arc<dyn ExecutionPlan> = Arc::new(
            ProjectionExec::try_new(
                vec![ProjectionExpr::new(
                    Arc::new(Column::new("s", 1)),
                    "s".to_string(),
                )],
                input,
            )
            .unwrap(),
        );
        assert!(lift_through(&[filter as Arc<dyn PhysicalExpr>], &only_s).is_empty());
    }
}
