//! [`JoinStrategy`]: a physical optimizer rule that turns a hash join
//! whose build side would not fit the host budget into a sort-merge join,
//! which spills (its sorts spill, and so does the buffered side of a key),
//! and builds an inner hash join on its side of fewer bytes.
//!
//! ```text
//!  HashJoinExec [projection]          ProjectionExec (the hash join's)
//!    build (estimated > share)  ==>     SortMergeJoinExec
//!    probe                                build   (sorted, hash-partitioned
//!                                         probe    by the rules that follow)
//! ```
//!
//! It runs right after DataFusion's join selection (sides and modes are
//! chosen) and before the distribution and sort enforcement, which add
//! the repartitions and sorts a sort-merge join needs. The estimate comes
//! from the plan's statistics (the manifests' row counts and sizes, see
//! [`crate::statistics`]); when it is too low and a build side runs out of
//! memory anyway, [`crate::InsituHost::sql`] plans the query again with
//! `join_strategy = sort_merge`.

use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::Schema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::common::{JoinSide, JoinType};
use datafusion::config::ConfigOptions;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, StatisticsArgs, StatisticsContext};

use crate::options::{InsituOptions, JoinChoice};
use crate::reorder;
use crate::statistics::VARIABLE_VALUE_BYTES_ASSUMED;

/// Share of the host budget one hash join's build side may be expected to
/// take (`build_share_of_budget`, as a divisor): the budget also holds
/// the other operators running beside it, and estimates after filters
/// are rough.
pub const BUILD_SHARE_OF_BUDGET: usize = 2;

/// Bytes a hash table adds per build row (its hash and chain entries,
/// and the hashes computed on the way).
pub const HASH_TABLE_BYTES_PER_ROW: usize = 32;

/// How many times smaller in bytes the probe side of an inner join must
/// be expected to be before its sides swap (`swap_margin`). DataFusion's
/// join selection weighs rows when a join's input has no byte size (any
/// join's output): TPC-H Q7 at SF10 built 1.5 GB of lineitem rows
/// rather than the 15 M narrow orders rows it probed with.
pub const SWAP_MARGIN: usize = 2;

#[derive(Debug, Default)]
pub struct JoinStrategy;

impl PhysicalOptimizerRule for JoinStrategy {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = config
            .extensions
            .get::<InsituOptions>()
            .cloned()
            .unwrap_or_default();
        let share = match options.host_mem_bytes_max {
            0 => usize::MAX,
            budget => budget / BUILD_SHARE_OF_BUDGET,
        };
        Ok(plan
            .transform_up(|node| {
                let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                    return Ok(Transformed::no(node));
                };
                // Sort-merge joins lack null-aware anti join semantics
                // (NOT IN over a nullable subquery).
                if join.null_aware {
                    return Ok(Transformed::no(node));
                }
                let inner = *join.join_type() == JoinType::Inner;
                let left = hash_table_bytes_estimate(join.left());
                let right = hash_table_bytes_estimate(join.right());
                // An inner join builds on the smaller side, once swapped.
                let build = match (left, right) {
                    (Some(l), Some(r)) if inner => Some(l.min(r)),
                    (l, _) => l,
                };
                let merge = match options.join_strategy {
                    JoinChoice::SortMerge => true,
                    JoinChoice::Hash => false,
                    JoinChoice::Auto => build.is_some_and(|b| b > share),
                };
                if merge {
                    return Ok(Transformed::yes(sort_merge_of(join)?));
                }
                match (left, right) {
                    (Some(l), Some(r)) if inner && r.saturating_mul(SWAP_MARGIN) < l => {
                        Ok(Transformed::yes(join.swap_inputs(*join.partition_mode())?))
                    }
                    _ => Ok(Transformed::no(node)),
                }
            })?
            .data)
    }

    fn name(&self) -> &str {
        "insitu_join_strategy"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `filter` with its columns reordered left side first: DataFusion's
/// sort-merge join builds a filter's input that way, whatever the filter
/// says, while join selection swaps a hash join's sides (and its
/// filter's) without moving the columns (TPC-H Q19 failed with "column
/// types must match schema types").
fn left_columns_first(filter: &JoinFilter) -> Result<JoinFilter> {
    let indices = filter.column_indices();
    let mut order: Vec<usize> = (0..indices.len()).collect();
    order.sort_by_key(|&i| indices[i].side != JoinSide::Left);
    // new position of each old column
    let mut moved = vec![0; order.len()];
    for (new, &old) in order.iter().enumerate() {
        moved[old] = new;
    }
    let expression = Arc::clone(filter.expression())
        .transform(|e| {
            Ok(match e.downcast_ref::<Column>() {
                Some(c) => Transformed::yes(
                    Arc::new(Column::new(c.name(), moved[c.index()])) as Arc<dyn PhysicalExpr>
                ),
                None => Transformed::no(e),
            })
        })?
        .data;
    let columns = order.iter().map(|&i| indices[i].clone()).collect();
    let schema = filter.schema();
    let fields: Vec<_> = order.iter().map(|&i| schema.field(i).clone()).collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(JoinFilter::new(expression, columns, schema))
}

/// Bytes a hash table built on `side` is expected to hold, if the plan's
/// statistics tell its rows: rows times the width of its columns (from
/// the schema: joins and projections carry byte sizes on loosely) plus
/// [`HASH_TABLE_BYTES_PER_ROW`].
pub fn hash_table_bytes_estimate(side: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let rows = rows_estimate(side)?.rows as usize;
    let width: usize = side
        .schema()
        .fields()
        .iter()
        .map(|f| {
            f.data_type()
                .primitive_width()
                .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED)
        })
        .sum();
    Some(rows.saturating_mul(width + HASH_TABLE_BYTES_PER_ROW))
}

/// Estimated rows of a plan and distinct values of its columns.
struct RowsEstimate {
    rows: f64,
    distinct: Vec<Option<f64>>,
}

/// Rows of `plan` by DataFusion's statistics, except that an inner hash
/// join's output is estimated as the join reorder does
/// ([`reorder::joined_rows`], several key columns as one composite key)
/// and nodes above it scale that estimate as DataFusion scales theirs.
/// DataFusion divides by the distinct values of one key column only, so
/// TPC-H Q9's part-partsupp-lineitem join (3.3 M rows at SF10) looked
/// like 48 M, and the hash table went on the 15 M orders (887 MB).
fn rows_estimate(plan: &Arc<dyn ExecutionPlan>) -> Option<RowsEstimate> {
    if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        if *join.join_type() == JoinType::Inner {
            return joined_estimate(join);
        }
    }
    let statistics = |p: &Arc<dyn ExecutionPlan>| {
        StatisticsContext::new()
            .compute(p.as_ref(), &StatisticsArgs::new())
            .ok()
    };
    let stats = statistics(plan)?;
    let rows = *stats.num_rows.get_value()? as f64;
    let schema = plan.schema();
    let own = RowsEstimate {
        rows,
        distinct: stats
            .column_statistics
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| Some(reorder::distinct_values(c, f.data_type(), rows)))
            .collect(),
    };
    let [child] = plan.children()[..] else {
        return Some(own);
    };
    let (Some(below), Some(child_rows)) = (
        rows_estimate(child),
        statistics(child).and_then(|s| s.num_rows.get_value().copied()),
    ) else {
        return Some(own);
    };
    let scale = if child_rows == 0 {
        1.0
    } else {
        rows / child_rows as f64
    };
    let rows = (below.rows * scale).max(1.0);
    let distinct = if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        projection
            .expr()
            .iter()
            .map(|e| {
                let column = e.expr.downcast_ref::<Column>()?;
                below.distinct.get(column.index()).copied().flatten()
            })
            .collect()
    } else if schema.fields().len() == child.schema().fields().len() {
        below.distinct
    } else {
        own.distinct
    };
    let distinct = distinct
        .into_iter()
        .map(|d| d.map(|d| d.min(rows)))
        .collect();
    Some(RowsEstimate { rows, distinct })
}

fn joined_estimate(join: &HashJoinExec) -> Option<RowsEstimate> {
    let left = rows_estimate(join.left())?;
    let right = rows_estimate(join.right())?;
    let left_keys = distinct_keys(&left, join.on().iter().map(|(l, _)| l));
    let right_keys = distinct_keys(&right, join.on().iter().map(|(_, r)| r));
    let rows = reorder::joined_rows(
        (left.rows, left_keys),
        (right.rows, right_keys),
        join.filter().is_some(),
    );
    let mut distinct: Vec<Option<f64>> = left
        .distinct
        .into_iter()
        .chain(right.distinct)
        .map(|d| d.map(|d| d.min(rows)))
        .collect();
    if let Some(projection) = &join.projection {
        distinct = projection
            .iter()
            .map(|&i| distinct.get(i).copied().flatten())
            .collect();
    }
    Some(RowsEstimate { rows, distinct })
}

/// Distinct combinations of `keys` on `side`, at most its rows.
fn distinct_keys<'a>(
    side: &RowsEstimate,
    keys: impl Iterator<Item = &'a Arc<dyn PhysicalExpr>>,
) -> f64 {
    keys.map(|key| {
        key.downcast_ref::<Column>()
            .and_then(|c| side.distinct.get(c.index()).copied().flatten())
            .unwrap_or(side.rows)
    })
    .product::<f64>()
    .min(side.rows)
}

/// The same join as a sort-merge join, with the hash join's projection.
fn sort_merge_of(join: &HashJoinExec) -> Result<Arc<dyn ExecutionPlan>> {
    let on = join.on().to_vec();
    let filter = join.filter().map(left_columns_first).transpose()?;
    let merge: Arc<dyn ExecutionPlan> = Arc::new(SortMergeJoinExec::try_new(
        Arc::clone(join.left()),
        Arc::clone(join.right()),
        on.clone(),
        filter,
        *join.join_type(),
        vec![SortOptions::default(); on.len()],
        join.null_equality(),
    )?);
    let Some(projection) = &join.projection else {
        return Ok(merge);
    };
    let schema = merge.schema();
    let exprs = projection
        .iter()
        .map(|&i| {
            let field = schema.field(i);
            let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), i));
            (col, field.name().clone())
        })
        .collect::<Vec<_>>();
    Ok(Arc::new(ProjectionExec::try_new(exprs, merge)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch, StringViewArray};
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A session over tables `a` (`rows` rows) and `b` (10 rows), with the
    /// join rule after DataFusion's join selection, as the host has it.
    fn session(choice: JoinChoice, budget: usize, rows: i64) -> SessionContext {
        let mut config = SessionConfig::new().with_target_partitions(2);
        config.options_mut().extensions.insert(InsituOptions {
            join_strategy: choice,
            host_mem_bytes_max: budget,
            ..Default::default()
        });
        config
            .options_mut()
            .optimizer
            .hash_join_single_partition_threshold = 0;
        let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        let after = rules
            .iter()
            .position(|r| r.name() == "join_selection")
            .unwrap()
            + 1;
        rules.insert(after, Arc::new(JoinStrategy));
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        let table = |n: i64| {
            // One null key, so that NOT IN over the column is null-aware.
            let k = Int64Array::from_iter((0..n).map(Some).chain([None]));
            let s = StringViewArray::from_iter_values((0..=n).map(|i| format!("name {i}")));
            let batch = RecordBatch::try_from_iter([
                ("k", Arc::new(k) as arrow::array::ArrayRef),
                ("s", Arc::new(s) as _),
            ])
            .unwrap();
            Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap())
        };
        ctx.register_table("a", table(rows)).unwrap();
        ctx.register_table("b", table(10)).unwrap();
        ctx
    }

    async fn plan_and_rows(ctx: &SessionContext, sql: &str) -> (String, usize) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let text = displayable(plan.as_ref()).indent(true).to_string();
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap();
        (text, batches.iter().map(|b| b.num_rows()).sum())
    }

    const JOIN: &str = "select a.k, a.s, b.s from a join b on a.k = b.k and a.s <> b.k::varchar";

    #[tokio::test]
    async fn a_build_side_past_half_the_budget_becomes_a_sort_merge_join() {
        // The build side is b's 11 rows of (8 + 32) bytes, plus 32 per row
        // in the table: 792 bytes.
        let small = session(JoinChoice::Auto, 1 << 30, 1000);
        let (plan, rows) = plan_and_rows(&small, JOIN).await;
        assert!(plan.contains("HashJoinExec"), "{plan}");
        assert_eq!(rows, 10);
        let tight = session(JoinChoice::Auto, 1024, 1000);
        let (plan, merged) = plan_and_rows(&tight, JOIN).await;
        assert!(plan.contains("SortMergeJoinExec"), "{plan}");
        assert!(!plan.contains("HashJoinExec"), "{plan}");
        assert_eq!(merged, rows, "same answer either way");
    }

    #[tokio::test]
    async fn forced_strategies_are_kept_whatever_the_budget() {
        let (plan, _) = plan_and_rows(&session(JoinChoice::SortMerge, 1 << 30, 1000), JOIN).await;
        assert!(plan.contains("SortMergeJoinExec"), "{plan}");
        let (plan, _) = plan_and_rows(&session(JoinChoice::Hash, 1024, 1000), JOIN).await;
        assert!(plan.contains("HashJoinExec"), "{plan}");
    }

    #[tokio::test]
    async fn null_aware_anti_joins_stay_hash_joins() {
        let ctx = session(JoinChoice::SortMerge, 1 << 30, 100);
        let sql = "select k from b where k not in (select k from a)";
        let (plan, rows) = plan_and_rows(&ctx, sql).await;
        assert!(plan.contains("HashJoinExec"), "{plan}");
        assert_eq!(rows, 0, "a null in the subquery leaves no row");
    }

    #[test]
    fn a_filter_keeps_its_meaning_with_left_columns_first() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::BinaryExpr;
        use datafusion::physical_plan::joins::utils::ColumnIndex;
        // right.x (index 0) < left.y (index 1)
        let expr: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("x", 0)),
            Operator::Lt,
            Arc::new(Column::new("y", 1)),
        ));
        let columns = vec![
            ColumnIndex {
                index: 3,
                side: JoinSide::Right,
            },
            ColumnIndex {
                index: 5,
                side: JoinSide::Left,
            },
        ];
        let schema = Arc::new(Schema::new(vec![
            arrow::datatypes::Field::new("x", arrow::datatypes::DataType::Int64, true),
            arrow::datatypes::Field::new("y", arrow::datatypes::DataType::Utf8, true),
        ]));
        let moved = left_columns_first(&JoinFilter::new(expr, columns, schema)).unwrap();
        assert_eq!(moved.column_indices()[0].side, JoinSide::Left);
        assert_eq!(moved.column_indices()[0].index, 5);
        assert_eq!(moved.schema().field(0).name(), "y");
        assert_eq!(moved.expression().to_string(), "x@1 < y@0");
    }
}
