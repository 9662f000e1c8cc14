//! [`ReorderJoins`]: the inner joins of a query in an order that keeps
//! the intermediate results small.
//!
//! ```text
//!  Inner n2                                   Inner o_orderkey = l_orderkey
//!    Inner n1                                   Inner c_custkey = o_custkey
//!      Inner c                                    Inner c_nationkey = n2
//!        Inner o                       ==>          customer, n2
//!          Inner s_suppkey = l_suppkey            orders
//!            supplier, lineitem                 Inner s_suppkey = l_suppkey
//!                                                 Inner s_nationkey = n1
//!                                                   supplier, n1
//!                                                 lineitem
//! ```
//!
//! DataFusion joins the tables of a `FROM` list in the order written.
//! TPC-H Q7 thus joins every shipped lineitem with every order before the
//! nation filters keep 2 of 25 nations; at SF10 the hash table on orders
//! holds 15 M rows. This rule flattens each tree of inner equi-joins
//! (through projections that pass columns on, and filters between the
//! joins) into its inputs, its equi-conditions and its other predicates,
//! and builds it again greedily: join the two connected inputs whose
//! result is estimated smallest, until one input is left (greedy operator
//! ordering). Each predicate runs at the first join that sees all its
//! columns; a projection on top restores the region's columns and their
//! order, so nothing above the region changes.
//!
//! Estimates come from the tables' statistics: rows, the selectivity of
//! pushed filters by DataFusion's interval analysis, and distinct keys
//! bounded by an integer column's range. A join of `A` and `B` on keys
//! with `d_A` and `d_B` distinct values (combinations, for several key
//! columns) returns `|A| |B| / max(d_A, d_B)` rows. Estimates are rough, so the new order replaces the written one
//! only when the sum of its intermediate rows is [`REORDER_GAIN_MIN`]
//! times smaller; a region with an input the rule cannot estimate, or
//! whose inputs are not all connected by equi-conditions, stays as
//! written.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ColumnStatistics, DFSchema, NullEquality, Result, Statistics};
use datafusion::datasource::source_as_provider;
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, Filter, Join, JoinConstraint, JoinType, LogicalPlan, Projection, TableScan,
};
use datafusion::optimizer::eliminate_cross_join::EliminateCrossJoin;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::intervals::utils::check_support;
use datafusion::physical_expr::{analyze, create_physical_expr, AnalysisContext};
use datafusion::prelude::Expr;

use crate::options::InsituOptions;
use crate::provider::InsituTable;

/// How many times smaller the estimated intermediate rows of the greedy
/// order must be before it replaces the written order.
pub const REORDER_GAIN_MIN: f64 = 2.0;

/// Regions of more inputs than this stay as written.
pub const REGION_INPUTS_MAX: usize = 16;

/// Share of rows a predicate keeps when no statistics say more
/// (DataFusion's default filter selectivity).
pub const DEFAULT_SELECTIVITY: f64 = 0.2;

/// The statistics of the table a scan reads, when known.
pub type StatisticsLookup = Arc<dyn Fn(&TableScan) -> Option<Arc<Statistics>> + Send + Sync>;

/// Reorders trees of inner equi-joins; see the module docs.
pub struct ReorderJoins {
    lookup: StatisticsLookup,
}

impl fmt::Debug for ReorderJoins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReorderJoins")
    }
}

impl ReorderJoins {
    /// A rule that estimates scans with `lookup`.
    pub fn new(lookup: StatisticsLookup) -> Self {
        Self { lookup }
    }

    /// A rule that estimates scans of [`InsituTable`]s from their
    /// manifests; other tables are not estimated.
    pub fn for_insitu_tables() -> Self {
        Self::new(Arc::new(|scan: &TableScan| {
            let provider = source_as_provider(&scan.source).ok()?;
            let table = provider.downcast_ref::<InsituTable>()?;
            Some(table.statistics())
        }))
    }

    fn reorder_all(&self, plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
        plan.transform_down(|node| {
            if !is_region_join(&node) {
                return Ok(Transformed::no(node));
            }
            match self.reorder_region(&node)? {
                Some(reordered) => Ok(Transformed::new(reordered, true, TreeNodeRecursion::Jump)),
                None => Ok(Transformed::no(node)),
            }
        })
    }

    /// The region rooted at `top` in greedy order, with its inputs
    /// reordered in turn, or `None` when it stays as written.
    fn reorder_region(&self, top: &LogicalPlan) -> Result<Option<LogicalPlan>> {
        let mut region = Region::default();
        let written = region.flatten(top);
        if region.inputs.len() < 3 || region.inputs.len() > REGION_INPUTS_MAX {
            return Ok(None);
        }
        let estimates: Option<Vec<Estimate>> =
            region.inputs.iter().map(|p| self.estimate(p)).collect();
        let Some(estimates) = estimates else {
            return Ok(None);
        };
        let Some(graph) = Graph::new(&region, estimates) else {
            return Ok(None);
        };
        let Some(written_cost) = graph.cost_of(&written) else {
            return Ok(None);
        };
        let Some(order) = graph.greedy() else {
            return Ok(None);
        };
        if order.cost * REORDER_GAIN_MIN > written_cost {
            return Ok(None);
        }
        tracing::debug!(
            written_rows = written_cost,
            reordered_rows = order.cost,
            input_rows = ?graph.estimates.iter().map(|e| e.rows.round()).collect::<Vec<_>>(),
            order = ?order.shape,
            "reordering {} joined inputs",
            region.inputs.len()
        );
        let inputs = region
            .inputs
            .into_iter()
            .map(|p| self.reorder_all(p).map(|t| t.data))
            .collect::<Result<Vec<_>>>()?;
        let joined = graph.build(&order.shape, &inputs)?;
        let columns = top
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        let restored = Projection::try_new(columns, Arc::new(joined))?;
        Ok(Some(LogicalPlan::Projection(restored)))
    }

    /// Rows and distinct values per column of `plan`'s output, or `None`
    /// when a part of it cannot be estimated.
    fn estimate(&self, plan: &LogicalPlan) -> Option<Estimate> {
        match plan {
            LogicalPlan::TableScan(scan) => self.estimate_scan(scan),
            LogicalPlan::SubqueryAlias(alias) => {
                let input = self.estimate(&alias.input)?;
                Some(input.renamed(&alias.input.schema().columns(), &alias.schema.columns()))
            }
            LogicalPlan::Projection(projection) => {
                let input = self.estimate(&projection.input)?;
                Some(input.projected(&projection.expr, &projection.schema))
            }
            LogicalPlan::Filter(filter) => {
                let input = self.estimate(&filter.input)?;
                Some(input.scaled(DEFAULT_SELECTIVITY))
            }
            LogicalPlan::Aggregate(aggregate) => {
                let input = self.estimate(&aggregate.input)?;
                Some(input.grouped(aggregate))
            }
            LogicalPlan::Join(join) => match join.join_type {
                JoinType::LeftSemi | JoinType::LeftAnti => self.estimate(&join.left),
                JoinType::RightSemi | JoinType::RightAnti => self.estimate(&join.right),
                JoinType::Inner => {
                    let left = self.estimate(&join.left)?;
                    let right = self.estimate(&join.right)?;
                    Some(Estimate::joined(
                        &left,
                        &right,
                        &join.on,
                        join.filter.is_some(),
                    ))
                }
                _ => None,
            },
            LogicalPlan::Sort(sort) => {
                let input = self.estimate(&sort.input)?;
                Some(match sort.fetch {
                    Some(fetch) => input.capped(fetch as f64),
                    None => input,
                })
            }
            LogicalPlan::Limit(limit) => {
                let input = self.estimate(&limit.input)?;
                match limit.get_fetch_type().ok()? {
                    datafusion::logical_expr::FetchType::Literal(Some(n)) => {
                        Some(input.capped(n as f64))
                    }
                    _ => Some(input),
                }
            }
            LogicalPlan::Distinct(_) | LogicalPlan::Window(_) | LogicalPlan::Repartition(_) => {
                let [input] = plan.inputs()[..] else {
                    return None;
                };
                let estimate = self.estimate(input)?;
                // Window and distinct keep the input's columns first.
                Some(estimate.renamed(&input.schema().columns(), &plan.schema().columns()))
            }
            _ => None,
        }
    }

    fn estimate_scan(&self, scan: &TableScan) -> Option<Estimate> {
        let statistics = (self.lookup)(scan)?;
        let table_rows = *statistics.num_rows.get_value()? as f64;
        let kept = scan_selectivity(scan, &statistics);
        let mut rows = table_rows * kept;
        if let Some(fetch) = scan.fetch {
            rows = rows.min(fetch as f64);
        }
        let source = scan.source.schema();
        let columns = scan.projected_schema.columns();
        let mut distinct = HashMap::with_capacity(columns.len());
        for (i, column) in columns.into_iter().enumerate() {
            let index = scan.projection.as_ref().map_or(i, |p| p[i]);
            let Some(stats) = statistics.column_statistics.get(index) else {
                continue;
            };
            let data_type = source.field(index).data_type();
            distinct.insert(column, distinct_values(stats, data_type, table_rows));
        }
        Some(Estimate { rows, distinct }.capped(rows))
    }
}

impl OptimizerRule for ReorderJoins {
    fn name(&self) -> &str {
        "insitu_reorder_joins"
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let enabled = config
            .options()
            .extensions
            .get::<InsituOptions>()
            .is_none_or(|o| o.reorder_joins);
        if !enabled {
            return Ok(Transformed::no(plan));
        }
        self.reorder_all(plan)
    }
}

/// `rules` (DataFusion's logical rules) with cross joins eliminated only
/// while there are some ([`CrossJoinsOnly`]) and `reorder` last.
pub fn with_reordering(
    rules: Vec<Arc<dyn OptimizerRule + Send + Sync>>,
    reorder: ReorderJoins,
) -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    let mut rules: Vec<Arc<dyn OptimizerRule + Send + Sync>> = rules
        .into_iter()
        .map(|rule| -> Arc<dyn OptimizerRule + Send + Sync> {
            if rule.name() == EliminateCrossJoin::new().name() {
                Arc::new(CrossJoinsOnly::default())
            } else {
                rule
            }
        })
        .collect();
    rules.push(Arc::new(reorder));
    rules
}

/// DataFusion's [`EliminateCrossJoin`], run only on plans that hold a
/// cross join.
///
/// That rule turns a `FROM` list's cross joins into equi-joins, and on
/// the way flattens every tree of inner joins into a left-deep one in
/// the order of its inputs, which would undo a bushy order chosen by
/// [`ReorderJoins`] in the optimizer's next pass. Once no cross join is
/// left it has nothing to eliminate.
#[derive(Debug, Default)]
pub struct CrossJoinsOnly(EliminateCrossJoin);

impl OptimizerRule for CrossJoinsOnly {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let mut cross = false;
        plan.apply_with_subqueries(|node| {
            cross = matches!(node, LogicalPlan::Join(j)
                if j.join_type == JoinType::Inner && j.on.is_empty() && j.filter.is_none());
            Ok(if cross {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        })?;
        if cross {
            self.0.rewrite(plan, config)
        } else {
            Ok(Transformed::no(plan))
        }
    }
}

/// An inner equi-join that can be part of a reordered region.
fn is_region_join(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Join(join) => is_reorderable(join),
        _ => false,
    }
}

fn is_reorderable(join: &Join) -> bool {
    join.join_type == JoinType::Inner
        && join.join_constraint == JoinConstraint::On
        && join.null_equality == NullEquality::NullEqualsNothing
        && !join.null_aware
        && !join.on.is_empty()
        && join.filter.as_ref().is_none_or(is_movable_predicate)
}

/// A region join, possibly under projections that pass columns on and
/// filters.
fn leads_to_region_join(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Join(join) => is_reorderable(join),
        LogicalPlan::Projection(p) => passes_columns_on(p) && leads_to_region_join(&p.input),
        LogicalPlan::Filter(f) => {
            is_movable_predicate(&f.predicate) && leads_to_region_join(&f.input)
        }
        _ => false,
    }
}

fn passes_columns_on(projection: &Projection) -> bool {
    projection.expr.iter().all(|e| matches!(e, Expr::Column(_)))
}

/// A predicate that may run at another join of the region: deterministic
/// and free of subqueries.
fn is_movable_predicate(predicate: &Expr) -> bool {
    !predicate.is_volatile()
        && !predicate
            .exists(|e| {
                Ok(matches!(
                    e,
                    Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
                ) || matches!(e, Expr::OuterReferenceColumn(..)))
            })
            .unwrap_or(true)
}

/// Share of a table's rows that its scan's pushed filters keep.
fn scan_selectivity(scan: &TableScan, statistics: &Statistics) -> f64 {
    if scan.filters.is_empty() {
        return 1.0;
    }
    let schema = scan.source.schema();
    let Ok(df_schema) = DFSchema::try_from_qualified_schema(scan.table_name.clone(), &schema)
    else {
        return DEFAULT_SELECTIVITY;
    };
    let props = ExecutionProps::new();
    let planning = PhysicalPlanningContext::default();
    let mut analysable = Vec::new();
    let mut kept = 1.0;
    for filter in &scan.filters {
        match create_physical_expr(filter, &df_schema, &props, &planning) {
            Ok(physical) if check_support(&physical, &schema) => analysable.push(filter.clone()),
            _ => kept *= DEFAULT_SELECTIVITY,
        }
    }
    let Some(predicate) = conjunction(analysable) else {
        return kept;
    };
    let analysed =
        create_physical_expr(&predicate, &df_schema, &props, &planning).and_then(|physical| {
            let context =
                AnalysisContext::try_from_statistics(&schema, &statistics.column_statistics)?;
            analyze(&physical, context, &schema)
        });
    match analysed {
        Ok(context) => kept * context.selectivity.unwrap_or(1.0),
        Err(_) => kept * DEFAULT_SELECTIVITY,
    }
}

/// Rows of an inner equi-join of inputs of `(rows, distinct keys)`:
/// every key of the side with fewer distinct keys finds its matches on
/// the other, `|A| |B| / max(d_A, d_B)`, and a further predicate keeps
/// [`DEFAULT_SELECTIVITY`] of them (`filtered`).
pub(crate) fn joined_rows(left: (f64, f64), right: (f64, f64), filtered: bool) -> f64 {
    let keys = left.1.max(right.1).max(1.0);
    let rows = left.0 * right.0 / keys;
    let rows = if filtered {
        rows * DEFAULT_SELECTIVITY
    } else {
        rows
    };
    rows.max(1.0)
}

/// Distinct values of a column of `rows` rows: its recorded count, else
/// at most the width of an integer column's range.
pub(crate) fn distinct_values(stats: &ColumnStatistics, data_type: &DataType, rows: f64) -> f64 {
    if let Some(&n) = stats.distinct_count.get_value() {
        return (n as f64).max(1.0);
    }
    let integral =
        data_type.is_integer() || matches!(data_type, DataType::Date32 | DataType::Date64);
    if let (true, Precision::Exact(min) | Precision::Inexact(min)) = (integral, &stats.min_value) {
        if let Some(max) = stats.max_value.get_value() {
            if let Some(width) = min.distance(max) {
                return rows.min(width as f64 + 1.0).max(1.0);
            }
        }
    }
    rows.max(1.0)
}

/// Estimated rows of a plan and distinct values of its columns.
#[derive(Debug, Clone)]
struct Estimate {
    rows: f64,
    distinct: HashMap<Column, f64>,
}

impl Estimate {
    /// Distinct values of `key` (at most the rows); an expression other
    /// than a column counts as unique.
    fn distinct_of(&self, key: &Expr) -> f64 {
        let n = match key {
            Expr::Column(c) => self.distinct.get(c).copied().unwrap_or(self.rows),
            _ => self.rows,
        };
        n.min(self.rows).max(1.0)
    }

    /// Distinct combinations of `keys`: the product of their distinct
    /// values, at most the rows. A key of several columns (`ps_partkey`,
    /// `ps_suppkey`) thus counts as unique on a table whose rows it
    /// identifies.
    fn distinct_keys<'a>(&self, keys: impl Iterator<Item = &'a Expr>) -> f64 {
        keys.map(|k| self.distinct_of(k))
            .fold(1.0f64, |product, n| product * n)
            .min(self.rows)
            .max(1.0)
    }

    fn capped(mut self, rows: f64) -> Self {
        self.rows = self.rows.min(rows).max(1.0);
        for n in self.distinct.values_mut() {
            *n = n.min(self.rows);
        }
        self
    }

    fn scaled(self, share: f64) -> Self {
        let rows = self.rows * share;
        self.capped(rows)
    }

    fn renamed(&self, from: &[Column], to: &[Column]) -> Self {
        let distinct = from
            .iter()
            .zip(to)
            .filter_map(|(f, t)| Some((t.clone(), *self.distinct.get(f)?)))
            .collect();
        Self {
            rows: self.rows,
            distinct,
        }
    }

    fn projected(&self, exprs: &[Expr], schema: &DFSchema) -> Self {
        let distinct = exprs
            .iter()
            .zip(schema.columns())
            .filter_map(|(e, out)| {
                let Expr::Column(c) = e.clone().unalias() else {
                    return None;
                };
                Some((out, *self.distinct.get(&c)?))
            })
            .collect();
        Self {
            rows: self.rows,
            distinct,
        }
    }

    fn grouped(&self, aggregate: &Aggregate) -> Self {
        let outputs = aggregate.schema.columns();
        let mut groups = 1.0f64;
        let mut distinct = HashMap::new();
        for (expr, out) in aggregate.group_expr.iter().zip(outputs) {
            let n = self.distinct_of(&expr.clone().unalias());
            groups *= n;
            distinct.insert(out, n);
        }
        Self {
            rows: self.rows,
            distinct,
        }
        .capped(groups)
    }

    /// The inner join of `left` and `right` on `on`, with `filtered` when
    /// a further predicate runs there.
    fn joined(left: &Self, right: &Self, on: &[(Expr, Expr)], filtered: bool) -> Self {
        let rows = joined_rows(
            (left.rows, left.distinct_keys(on.iter().map(|(l, _)| l))),
            (right.rows, right.distinct_keys(on.iter().map(|(_, r)| r))),
            filtered,
        );
        let mut distinct = left.distinct.clone();
        distinct.extend(right.distinct.iter().map(|(c, n)| (c.clone(), *n)));
        Self { rows, distinct }.capped(rows)
    }
}

/// A written or chosen join order over a region's inputs.
#[derive(Debug, Clone)]
enum Shape {
    Input(usize),
    Join(Box<Shape>, Box<Shape>),
}

/// A tree of inner joins taken apart.
#[derive(Debug, Default)]
struct Region {
    inputs: Vec<LogicalPlan>,
    equalities: Vec<(Expr, Expr)>,
    predicates: Vec<Expr>,
}

impl Region {
    /// Takes `plan` apart into the region and returns its written shape.
    fn flatten(&mut self, plan: &LogicalPlan) -> Shape {
        match plan {
            LogicalPlan::Join(join) if is_reorderable(join) => {
                let left = self.flatten(&join.left);
                let right = self.flatten(&join.right);
                self.equalities.extend(join.on.iter().cloned());
                if let Some(filter) = &join.filter {
                    self.predicates
                        .extend(split_conjunction(filter).into_iter().cloned());
                }
                Shape::Join(Box::new(left), Box::new(right))
            }
            LogicalPlan::Projection(p)
                if passes_columns_on(p) && leads_to_region_join(&p.input) =>
            {
                self.flatten(&p.input)
            }
            LogicalPlan::Filter(f)
                if is_movable_predicate(&f.predicate) && leads_to_region_join(&f.input) =>
            {
                self.predicates
                    .extend(split_conjunction(&f.predicate).into_iter().cloned());
                self.flatten(&f.input)
            }
            _ => {
                self.inputs.push(plan.clone());
                Shape::Input(self.inputs.len() - 1)
            }
        }
    }
}

/// Inputs as bits of a `u64`.
type InputSet = u64;

/// An equi-condition between two inputs.
#[derive(Debug, Clone)]
struct Edge {
    left: Expr,
    left_input: usize,
    right: Expr,
    right_input: usize,
    /// Columns equal to each other through edges share a class; an
    /// edge over other expressions has none.
    class: Option<usize>,
}

/// Gives column edges their classes and adds the edges that follow from
/// them: `a = b` and `b = c` give `a = c` (inner equi-joins drop nulls),
/// so two inputs keyed through a third may join directly (TPC-H Q9's
/// part and partsupp, both joined to lineitem on the part key).
fn close_over_keys(edges: &mut Vec<Edge>) {
    let mut members: Vec<(Expr, usize)> = Vec::new();
    let mut parent: Vec<usize> = Vec::new();
    let mut member = |expr: &Expr, input: usize, parent: &mut Vec<usize>| -> usize {
        if let Some(i) = members.iter().position(|(e, n)| e == expr && *n == input) {
            return i;
        }
        members.push((expr.clone(), input));
        parent.push(parent.len());
        parent.len() - 1
    };
    fn root(parent: &[usize], mut i: usize) -> usize {
        while parent[i] != i {
            i = parent[i];
        }
        i
    }
    let mut column_edges = Vec::new();
    for (k, edge) in edges.iter().enumerate() {
        if !matches!(edge.left, Expr::Column(_)) || !matches!(edge.right, Expr::Column(_)) {
            continue;
        }
        let a = member(&edge.left, edge.left_input, &mut parent);
        let b = member(&edge.right, edge.right_input, &mut parent);
        let (ra, rb) = (root(&parent, a), root(&parent, b));
        parent[ra] = rb;
        column_edges.push((k, a));
    }
    for (k, a) in column_edges {
        edges[k].class = Some(root(&parent, a));
    }
    for i in 0..members.len() {
        for j in i + 1..members.len() {
            let (class, other) = (root(&parent, i), root(&parent, j));
            let ((ei, ni), (ej, nj)) = (&members[i], &members[j]);
            if class != other || ni == nj {
                continue;
            }
            let known = edges
                .iter()
                .any(|e| (e.left == *ei && e.right == *ej) || (e.left == *ej && e.right == *ei));
            if !known {
                edges.push(Edge {
                    left: ei.clone(),
                    left_input: *ni,
                    right: ej.clone(),
                    right_input: *nj,
                    class: Some(class),
                });
            }
        }
    }
}

/// A predicate over the inputs it reads.
#[derive(Debug, Clone)]
struct Predicate {
    expr: Expr,
    inputs: InputSet,
}

/// The region as inputs (with their own predicates applied), edges and
/// predicates over several inputs.
struct Graph {
    estimates: Vec<Estimate>,
    /// Predicates over one input, by input.
    local: Vec<Vec<Expr>>,
    edges: Vec<Edge>,
    predicates: Vec<Predicate>,
}

/// A greedy order and its estimated intermediate rows.
struct Order {
    shape: Shape,
    cost: f64,
}

/// A joined part of the region during costing.
struct Part {
    inputs: InputSet,
    estimate: Estimate,
    cost: f64,
}

impl Graph {
    /// `None` when a column of the region is found in no input.
    fn new(region: &Region, mut estimates: Vec<Estimate>) -> Option<Self> {
        let schemas: Vec<&DFSchema> = region.inputs.iter().map(|p| p.schema().as_ref()).collect();
        let input_of = |expr: &Expr| -> Option<InputSet> {
            let mut set = 0;
            for column in expr.column_refs() {
                let i = schemas.iter().position(|s| s.has_column(column))?;
                set |= 1 << i;
            }
            Some(set)
        };
        let mut local = vec![Vec::new(); region.inputs.len()];
        let mut edges = Vec::new();
        let mut predicates = Vec::new();
        for (l, r) in &region.equalities {
            let (ls, rs) = (input_of(l)?, input_of(r)?);
            if ls.count_ones() == 1 && rs.count_ones() == 1 && ls != rs {
                edges.push(Edge {
                    left: l.clone(),
                    left_input: ls.trailing_zeros() as usize,
                    right: r.clone(),
                    right_input: rs.trailing_zeros() as usize,
                    class: None,
                });
            } else {
                let expr = l.clone().eq(r.clone());
                predicates.push(Predicate {
                    expr,
                    inputs: ls | rs,
                });
            }
        }
        close_over_keys(&mut edges);
        for expr in &region.predicates {
            predicates.push(Predicate {
                expr: expr.clone(),
                inputs: input_of(expr)?,
            });
        }
        predicates.retain(|p| {
            if p.inputs.count_ones() > 1 {
                return true;
            }
            let i = p.inputs.trailing_zeros() as usize;
            let i = if p.inputs == 0 { 0 } else { i };
            if i < local.len() {
                local[i].push(p.expr.clone());
                estimates[i] = estimates[i].clone().scaled(DEFAULT_SELECTIVITY);
            }
            false
        });
        Some(Self {
            estimates,
            local,
            edges,
            predicates,
        })
    }

    fn leaf(&self, i: usize) -> Part {
        Part {
            inputs: 1 << i,
            estimate: self.estimates[i].clone(),
            cost: 0.0,
        }
    }

    /// The join of two parts, `None` when no equi-condition links them.
    fn join(&self, a: &Part, b: &Part) -> Option<Part> {
        let on = self.edges_between(a.inputs, b.inputs);
        if on.is_empty() {
            return None;
        }
        let filtered = !self.predicates_at(a.inputs, b.inputs).is_empty();
        let estimate = Estimate::joined(&a.estimate, &b.estimate, &on, filtered);
        Some(Part {
            inputs: a.inputs | b.inputs,
            cost: a.cost + b.cost + estimate.rows,
            estimate,
        })
    }

    /// Equi-conditions from `a` to `b`, oriented `(a side, b side)`.
    /// One edge per class: the others of a class hold already.
    fn edges_between(&self, a: InputSet, b: InputSet) -> Vec<(Expr, Expr)> {
        let within = |set: InputSet, i: usize| set & (1 << i) != 0;
        let mut classes = Vec::new();
        let mut on = Vec::new();
        for e in &self.edges {
            let pair = if within(a, e.left_input) && within(b, e.right_input) {
                (e.left.clone(), e.right.clone())
            } else if within(b, e.left_input) && within(a, e.right_input) {
                (e.right.clone(), e.left.clone())
            } else {
                continue;
            };
            if let Some(class) = e.class {
                if classes.contains(&class) {
                    continue;
                }
                classes.push(class);
            }
            on.push(pair);
        }
        on
    }

    /// Predicates that first see all their inputs in the join of `a` and
    /// `b`.
    fn predicates_at(&self, a: InputSet, b: InputSet) -> Vec<Expr> {
        let both = a | b;
        self.predicates
            .iter()
            .filter(|p| p.inputs & !both == 0 && p.inputs & !a != 0 && p.inputs & !b != 0)
            .map(|p| p.expr.clone())
            .collect()
    }

    /// Estimated intermediate rows of `shape`; `None` when one of its
    /// joins has no equi-condition.
    fn cost_of(&self, shape: &Shape) -> Option<f64> {
        self.part_of(shape).map(|p| p.cost)
    }

    fn part_of(&self, shape: &Shape) -> Option<Part> {
        match shape {
            Shape::Input(i) => Some(self.leaf(*i)),
            Shape::Join(l, r) => self.join(&self.part_of(l)?, &self.part_of(r)?),
        }
    }

    /// Joins the two linked parts of fewest estimated rows until one is
    /// left; `None` when the inputs are not all linked.
    fn greedy(&self) -> Option<Order> {
        let mut parts: Vec<(Part, Shape)> = (0..self.estimates.len())
            .map(|i| (self.leaf(i), Shape::Input(i)))
            .collect();
        while parts.len() > 1 {
            let mut best: Option<(usize, usize, Part)> = None;
            for i in 0..parts.len() {
                for j in i + 1..parts.len() {
                    let Some(joined) = self.join(&parts[i].0, &parts[j].0) else {
                        continue;
                    };
                    let better = best
                        .as_ref()
                        .is_none_or(|(_, _, b)| joined.estimate.rows < b.estimate.rows);
                    if better {
                        best = Some((i, j, joined));
                    }
                }
            }
            let (i, j, joined) = best?;
            let (b, b_shape) = parts.remove(j);
            let (a, a_shape) = parts.remove(i);
            // The smaller side first: DataFusion builds its hash table on
            // the left input.
            let shape = if a.estimate.rows <= b.estimate.rows {
                Shape::Join(Box::new(a_shape), Box::new(b_shape))
            } else {
                Shape::Join(Box::new(b_shape), Box::new(a_shape))
            };
            parts.push((joined, shape));
        }
        let (part, shape) = parts.pop()?;
        Some(Order {
            shape,
            cost: part.cost,
        })
    }

    /// The logical plan of `shape` over `inputs`.
    fn build(&self, shape: &Shape, inputs: &[LogicalPlan]) -> Result<LogicalPlan> {
        Ok(self.build_part(shape, inputs)?.0)
    }

    fn build_part(&self, shape: &Shape, inputs: &[LogicalPlan]) -> Result<(LogicalPlan, InputSet)> {
        match shape {
            Shape::Input(i) => {
                let plan = inputs[*i].clone();
                let plan = match conjunction(self.local[*i].clone()) {
                    Some(predicate) => {
                        LogicalPlan::Filter(Filter::try_new(predicate, Arc::new(plan))?)
                    }
                    None => plan,
                };
                Ok((plan, 1 << i))
            }
            Shape::Join(l, r) => {
                let (left, a) = self.build_part(l, inputs)?;
                let (right, b) = self.build_part(r, inputs)?;
                let join = Join::try_new(
                    Arc::new(left),
                    Arc::new(right),
                    self.edges_between(a, b),
                    conjunction(self.predicates_at(a, b)),
                    JoinType::Inner,
                    JoinConstraint::On,
                    NullEquality::NullEqualsNothing,
                    false,
                )?;
                Ok((LogicalPlan::Join(join), a | b))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};
    use arrow::record_batch::RecordBatch;
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::common::ScalarValue;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::optimizer::Optimizer;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A table of Int64 columns `columns`, row `i` holding `f(i, column)`.
    fn table(
        columns: &[&str],
        rows: i64,
        f: impl Fn(i64, usize) -> i64,
    ) -> (Arc<MemTable>, Statistics) {
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(*c, DataType::Int64, false))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let values: Vec<Vec<i64>> = (0..columns.len())
            .map(|c| (0..rows).map(|i| f(i, c)).collect())
            .collect();
        let arrays = values
            .iter()
            .map(|v| Arc::new(Int64Array::from(v.clone())) as _)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap();
        let mut stats = Statistics::new_unknown(&schema);
        stats.num_rows = Precision::Inexact(rows as usize);
        for (c, v) in values.iter().enumerate() {
            let min = v.iter().min().copied();
            let max = v.iter().max().copied();
            stats.column_statistics[c].min_value = Precision::Inexact(ScalarValue::Int64(min));
            stats.column_statistics[c].max_value = Precision::Inexact(ScalarValue::Int64(max));
        }
        let table = Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap());
        (table, stats)
    }

    /// `a` and `b`: 1000 rows, unique `k`; `b.j` in 0..100; `c`: 10
    /// rows, `j` and `f` in 0..10; `x` and `y`: 100 rows, `f` in 0..10;
    /// `z`: 1000 rows, unique `k` and `j`.
    fn context(with_rule: bool, known: &[&str]) -> SessionContext {
        let tables = [
            (
                "a",
                table(&["k", "v"], 1000, |i, c| if c == 0 { i } else { i % 7 }),
            ),
            (
                "b",
                table(&["k", "j"], 1000, |i, c| if c == 0 { i } else { i % 100 }),
            ),
            ("c", table(&["j", "f"], 10, |i, _| i)),
            (
                "x",
                table(&["k", "f"], 100, |i, c| if c == 0 { i * 3 } else { i % 10 }),
            ),
            (
                "y",
                table(&["j", "f"], 100, |i, c| if c == 0 { i } else { i % 10 }),
            ),
            (
                "z",
                table(&["k", "j"], 1000, |i, c| if c == 0 { i } else { 999 - i }),
            ),
        ];
        let statistics: HashMap<String, Arc<Statistics>> = tables
            .iter()
            .filter(|(name, _)| known.contains(name))
            .map(|(name, (_, stats))| (name.to_string(), Arc::new(stats.clone())))
            .collect();
        let lookup: StatisticsLookup =
            Arc::new(move |scan: &TableScan| statistics.get(scan.table_name.table()).cloned());
        let mut builder = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(2))
            .with_default_features();
        if with_rule {
            builder = builder.with_optimizer_rules(with_reordering(
                Optimizer::new().rules,
                ReorderJoins::new(lookup),
            ));
        }
        let ctx = SessionContext::new_with_state(builder.build());
        for (name, (table, _)) in tables {
            ctx.register_table(name, table).unwrap();
        }
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> (LogicalPlan, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().into_optimized_plan().unwrap();
        let rows = pretty_format_batches(&df.collect().await.unwrap())
            .unwrap()
            .to_string();
        (plan, rows)
    }

    /// The equi-conditions of the joins from the top down, left first.
    fn join_keys(plan: &LogicalPlan) -> Vec<String> {
        let mut keys = Vec::new();
        plan.apply(|node| {
            if let LogicalPlan::Join(join) = node {
                let on: Vec<String> = join.on.iter().map(|(l, r)| format!("{l}={r}")).collect();
                keys.push(on.join(","));
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        keys
    }

    /// A join with a join under each input (through projections).
    fn has_bushy_join(plan: &LogicalPlan) -> bool {
        fn holds_join(plan: &LogicalPlan) -> bool {
            match plan {
                LogicalPlan::Join(_) => true,
                LogicalPlan::Projection(p) => holds_join(&p.input),
                LogicalPlan::Filter(f) => holds_join(&f.input),
                _ => false,
            }
        }
        plan.exists(|node| {
            Ok(matches!(node, LogicalPlan::Join(j) if holds_join(&j.left) && holds_join(&j.right)))
        })
        .unwrap()
    }

    const CHAIN: &str = "select count(*) as n, sum(a.v) as v from a, b, c \
        where a.k = b.k and b.j = c.j and c.f = 1";

    /// Written: `a` with `b` (1000 rows) first. Reordered: the one `c`
    /// row with `b` first, then `a`.
    #[tokio::test]
    async fn the_selective_join_runs_first_and_the_rows_do_not_change() {
        let all = ["a", "b", "c", "x", "y"];
        let (plan, rows) = run(&context(true, &all), CHAIN).await;
        let (written, written_rows) = run(&context(false, &all), CHAIN).await;
        assert_eq!(rows, written_rows);
        assert!(rows.contains("| 10 |"), "{rows}");
        assert_eq!(join_keys(&written)[0], "b.j=c.j", "{written}");
        let keys = join_keys(&plan);
        assert_eq!(keys.len(), 2, "{plan}");
        assert!(keys[0].contains("a.k"), "{plan}");
        assert!(keys[1].contains("b.j"), "{plan}");
    }

    /// A table without statistics leaves its region as written.
    #[tokio::test]
    async fn a_table_without_statistics_keeps_the_written_order() {
        let (plan, _) = run(&context(true, &["b", "c"]), CHAIN).await;
        let (written, _) = run(&context(false, &[]), CHAIN).await;
        assert_eq!(join_keys(&plan), join_keys(&written));
    }

    /// Two selective pairs join each on their own, then with each other,
    /// and the optimizer's later passes keep that shape.
    #[tokio::test]
    async fn a_bushy_order_survives_the_optimizer_passes() {
        let sql = "select count(*) as n from a, z, x, y \
            where a.k = z.k and a.k = x.k and z.j = y.j and x.f = 1 and y.f = 2 \
            and a.v + y.f > x.f";
        let all = ["a", "x", "y", "z"];
        let (plan, rows) = run(&context(true, &all), sql).await;
        let (written, written_rows) = run(&context(false, &all), sql).await;
        assert_eq!(rows, written_rows);
        assert!(!has_bushy_join(&written), "{written}");
        assert!(has_bushy_join(&plan), "{plan}");
        // The predicate over a, x and y runs at the top join.
        let top_filter = plan
            .exists(|n| Ok(matches!(n, LogicalPlan::Join(j) if j.filter.is_some())))
            .unwrap();
        assert!(top_filter, "{plan}");
    }

    #[test]
    fn distinct_values_are_bounded_by_rows_and_integer_ranges() {
        let mut stats = ColumnStatistics::new_unknown();
        assert_eq!(distinct_values(&stats, &DataType::Int64, 50.0), 50.0);
        stats.min_value = Precision::Inexact(ScalarValue::Int64(Some(3)));
        stats.max_value = Precision::Inexact(ScalarValue::Int64(Some(9)));
        assert_eq!(distinct_values(&stats, &DataType::Int64, 50.0), 7.0);
        assert_eq!(distinct_values(&stats, &DataType::Int64, 2.0), 2.0);
        stats.distinct_count = Precision::Inexact(4);
        assert_eq!(distinct_values(&stats, &DataType::Int64, 50.0), 4.0);
        let strings = ColumnStatistics::new_unknown();
        assert_eq!(distinct_values(&strings, &DataType::Utf8, 0.0), 1.0);
    }
}
