//! [`PushSemiJoinDown`]: a semi join (`IN (subquery)`, `EXISTS`) filters
//! the table its keys come from, before that table is joined to others.
//!
//! ```text
//!  LeftSemi o_orderkey = sq.l_orderkey          Inner c_custkey = o_custkey
//!    Inner c_custkey = o_custkey        ==>       customer
//!      customer                                   LeftSemi o_orderkey = sq.l_orderkey
//!      orders                                       orders
//!    sq                                             sq
//! ```
//!
//! DataFusion decorrelates a subquery into a semi join where the predicate
//! stood, above every join of the `FROM` list. TPC-H Q18 then joins all
//! 60 M lineitem rows at SF10 with orders and customer (spilling 2.7 GiB
//! on the host) before the `IN` keeps 624 orders of them. A semi join is a
//! filter on its left rows; a predicate on one input of an inner join may
//! run before that join, so the rewrite returns the same rows.
//!
//! Only semi joins without a non-equi filter move: such a filter (Q21's
//! `l2.l_suppkey <> l1.l_suppkey`) usually means a large subquery whose
//! probe grows when moved below a selective join, and without row
//! estimates nothing says it pays. The semi join moves through inner joins
//! and through projections that only pass columns on.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result};
use datafusion::logical_expr::{Join, JoinType, LogicalPlan, Projection};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::prelude::Expr;

/// Moves equi semi joins below the inner joins under them; see the module
/// docs.
#[derive(Debug, Default)]
pub struct PushSemiJoinDown;

impl OptimizerRule for PushSemiJoinDown {
    fn name(&self) -> &str {
        "insitu_push_semi_join_down"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(semi) = plan else {
            return Ok(Transformed::no(plan));
        };
        if !is_movable_semi_join(&semi) {
            return Ok(Transformed::no(LogicalPlan::Join(semi)));
        }
        let keys = key_columns(&semi);
        match push_into(&semi.left, &semi, &keys)? {
            Some(pushed) => Ok(Transformed::yes(pushed)),
            None => Ok(Transformed::no(LogicalPlan::Join(semi))),
        }
    }
}

fn is_movable_semi_join(join: &Join) -> bool {
    join.join_type == JoinType::LeftSemi && join.filter.is_none() && !join.on.is_empty()
}

/// The left-side columns the semi join's keys read.
fn key_columns(semi: &Join) -> Vec<Column> {
    semi.on
        .iter()
        .flat_map(|(left, _)| left.column_refs())
        .cloned()
        .collect()
}

/// `input` with the semi join applied as deep inside it as its keys allow,
/// or `None` when it cannot move below `input`'s root.
fn push_into(input: &LogicalPlan, semi: &Join, keys: &[Column]) -> Result<Option<LogicalPlan>> {
    match input {
        LogicalPlan::Projection(projection) if passes_columns_on(projection) => {
            let Some(inner) = push_into(&projection.input, semi, keys)? else {
                return Ok(None);
            };
            let moved = Projection::try_new(projection.expr.clone(), Arc::new(inner))?;
            Ok(Some(LogicalPlan::Projection(moved)))
        }
        LogicalPlan::Join(join) if join.join_type == JoinType::Inner => {
            let holds = |side: &LogicalPlan| keys.iter().all(|c| side.schema().has_column(c));
            let mut moved = join.clone();
            if holds(&join.left) {
                moved.left = Arc::new(semi_join_onto(&join.left, semi, keys)?);
            } else if holds(&join.right) {
                moved.right = Arc::new(semi_join_onto(&join.right, semi, keys)?);
            } else {
                return Ok(None);
            }
            // A semi join keeps its left input's schema, so the join's
            // own schema stays as it was.
            Ok(Some(LogicalPlan::Join(moved)))
        }
        _ => Ok(None),
    }
}

/// `semi` with `side` as its left input, itself pushed further down when
/// it can be.
fn semi_join_onto(side: &Arc<LogicalPlan>, semi: &Join, keys: &[Column]) -> Result<LogicalPlan> {
    if let Some(deeper) = push_into(side, semi, keys)? {
        return Ok(deeper);
    }
    let join = Join::try_new(
        Arc::clone(side),
        Arc::clone(&semi.right),
        semi.on.clone(),
        None,
        JoinType::LeftSemi,
        semi.join_constraint,
        semi.null_equality,
        semi.null_aware,
    )?;
    Ok(LogicalPlan::Join(join))
}

fn passes_columns_on(projection: &Projection) -> bool {
    projection.expr.iter().all(|e| matches!(e, Expr::Column(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    fn table(columns: &[&str], rows: &[&[i64]]) -> Arc<MemTable> {
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(*c, DataType::Int64, true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let arrays = (0..columns.len())
            .map(|i| Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r[i]))) as _)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap();
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())
    }

    fn context(with_rule: bool) -> SessionContext {
        let mut builder = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(2))
            .with_default_features();
        if with_rule {
            builder = builder.with_optimizer_rule(Arc::new(PushSemiJoinDown));
        }
        let ctx = SessionContext::new_with_state(builder.build());
        let customers: Vec<&[i64]> = vec![&[1, 10], &[2, 20], &[3, 30]];
        let orders: Vec<&[i64]> = vec![&[100, 1], &[101, 1], &[102, 2], &[103, 3], &[104, 3]];
        let items: Vec<&[i64]> = vec![&[100, 5], &[100, 7], &[102, 1], &[103, 9], &[104, 2]];
        ctx.register_table("c", table(&["c_key", "c_v"], &customers))
            .unwrap();
        ctx.register_table("o", table(&["o_key", "o_c"], &orders))
            .unwrap();
        ctx.register_table("l", table(&["l_o", "l_q"], &items))
            .unwrap();
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> (String, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().into_optimized_plan().unwrap();
        let plan = plan.display_indent().to_string();
        let rows = pretty_format_batches(&df.collect().await.unwrap())
            .unwrap()
            .to_string();
        (plan, rows)
    }

    const Q18_SHAPE: &str = "select c_v, o_key, sum(l_q) as q from c, o, l \
        where o_key in (select l_o from l group by l_o having sum(l_q) > 4) \
        and c_key = o_c and o_key = l_o group by c_v, o_key order by o_key";

    /// The `IN` lands on `o`, under both inner joins, and the rows do not
    /// change.
    #[tokio::test]
    async fn an_in_subquery_filters_its_table_before_the_joins() {
        let (plan, rows) = run(&context(true), Q18_SHAPE).await;
        let (plain_plan, plain_rows) = run(&context(false), Q18_SHAPE).await;
        assert_eq!(rows, plain_rows);
        assert!(rows.contains("| 100   | 12"), "{rows}");
        let semi = plan
            .lines()
            .position(|l| l.contains("LeftSemi Join"))
            .unwrap();
        let inner = plan.lines().position(|l| l.contains("Inner Join")).unwrap();
        assert!(semi > inner, "semi join still above the joins:\n{plan}");
        let plain_semi = plain_plan.lines().position(|l| l.contains("LeftSemi Join"));
        assert!(plain_semi.unwrap() < inner, "{plain_plan}");
    }

    /// A semi join whose condition compares columns beyond its keys stays
    /// where it was.
    #[tokio::test]
    async fn a_semi_join_with_a_filter_stays_in_place() {
        let sql = "select c_v, o_key from c, o where c_key = o_c and exists \
            (select 1 from l where l_o = o_key and l_q > c_v - 25)";
        let (plan, rows) = run(&context(true), sql).await;
        let (plain_plan, plain_rows) = run(&context(false), sql).await;
        assert_eq!(rows, plain_rows);
        assert_eq!(plan, plain_plan);
        let semi = plan.lines().position(|l| l.contains("LeftSemi Join"));
        let inner = plan.lines().position(|l| l.contains("Inner Join"));
        assert!(semi.is_some() && semi < inner, "{plan}");
    }

    /// Keys from both sides of the join below leave the semi join above it.
    #[tokio::test]
    async fn keys_from_both_sides_stay_above_the_join() {
        let sql = "select o_key from c, o where c_key = o_c and exists \
            (select 1 from l where l_o = o_key and l_q = c_v - 5)";
        let (plan, rows) = run(&context(true), sql).await;
        let (_, plain_rows) = run(&context(false), sql).await;
        assert_eq!(rows, plain_rows);
        let semi = plan.lines().position(|l| l.contains("LeftSemi Join"));
        let inner = plan.lines().position(|l| l.contains("Inner Join"));
        assert!(semi < inner, "{plan}");
    }
}
