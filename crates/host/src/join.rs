//! [`JoinStrategy`]: a physical optimizer rule that turns a hash join
//! whose build side would not fit the host budget into a sort-merge join,
//! which spills (its sorts spill, and so does the buffered side of a key).
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
use datafusion::common::JoinSide;
use datafusion::common::Result;
use datafusion::config::ConfigOptions;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, StatisticsArgs, StatisticsContext};

use crate::options::{InsituOptions, JoinChoice};
use crate::statistics::VARIABLE_VALUE_BYTES_ASSUMED;

/// Share of the host budget one hash join's build side may be expected to
/// take (`build_share_of_budget`, as a divisor): the budget also holds
/// the other operators running beside it, and estimates after filters
/// are rough.
pub const BUILD_SHARE_OF_BUDGET: usize = 2;

/// Bytes a hash table adds per build row (its hash and chain entries,
/// and the hashes computed on the way).
pub const HASH_TABLE_BYTES_PER_ROW: usize = 32;

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
        if options.join_strategy == JoinChoice::Hash {
            return Ok(plan);
        }
        let always = options.join_strategy == JoinChoice::SortMerge;
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
                let outgrows = || build_bytes_estimate(join).is_some_and(|b| b > share);
                if join.null_aware || !(always || outgrows()) {
                    return Ok(Transformed::no(node));
                }
                Ok(Transformed::yes(sort_merge_of(join)?))
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

/// Bytes the build side's hash table is expected to hold, if the plan's
/// statistics tell.
pub fn build_bytes_estimate(join: &HashJoinExec) -> Option<usize> {
    let stats = StatisticsContext::new()
        .compute(join.left().as_ref(), &StatisticsArgs::new())
        .ok()?;
    let rows = *stats.num_rows.get_value()?;
    let data = match stats.total_byte_size.get_value() {
        Some(bytes) => *bytes,
        None => {
            let schema = join.left().schema();
            let width: usize = schema
                .fields()
                .iter()
                .map(|f| {
                    f.data_type()
                        .primitive_width()
                        .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED)
                })
                .sum();
            rows.saturating_mul(width)
        }
    };
    Some(data.saturating_add(rows.saturating_mul(HASH_TABLE_BYTES_PER_ROW)))
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
