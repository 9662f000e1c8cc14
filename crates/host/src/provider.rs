//! [`InsituTable`]: the DataFusion table provider of an insitu table.
//!
//! With pushdown on, a scan becomes a [`DeviceScanExec`] whose stage plan
//! evaluates the pushed filters, projection and limit on the devices
//! (filters are reported `Exact`, so DataFusion leaves no filter above it).
//! With pushdown off, the host reads the devices' Parquet files through the
//! link, like an engine reading a data lake, and does all the work itself.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result, Statistics};
use datafusion::datasource::TableType;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::LocalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;
use insitu_stage::PartitionScanExec;
use insitu_wire::Operator;

use crate::catalog::TableInfo;
use crate::pull::{pull_source, PullScan};
use crate::scan::DeviceScanExec;
use crate::stats::StageStatsSink;

/// Whether the devices run the data-reducing work or the host does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushdown {
    /// Per scan, whatever the cost model predicts fastest (see
    /// [`crate::placement`]).
    Auto,
    On,
    Off,
}

impl Pushdown {
    pub fn name(self) -> &'static str {
        match self {
            Pushdown::Auto => "auto",
            Pushdown::On => "on",
            Pushdown::Off => "off",
        }
    }
}

#[derive(Debug)]
pub struct InsituTable {
    info: TableInfo,
    pushdown: Pushdown,
    stats: Arc<StageStatsSink>,
    /// Planning statistics, from the manifests.
    statistics: Arc<Statistics>,
}

impl InsituTable {
    pub fn new(info: TableInfo, pushdown: Pushdown, stats: Arc<StageStatsSink>) -> Self {
        let statistics = Arc::new(info.statistics());
        Self {
            info,
            pushdown,
            stats,
            statistics,
        }
    }

    pub fn info(&self) -> &TableInfo {
        &self.info
    }

    /// Planning statistics of the whole table, from its manifests.
    pub fn statistics(&self) -> Arc<Statistics> {
        Arc::clone(&self.statistics)
    }

    /// Physical form of the pushed filters, over `schema`.
    fn physical_filters(
        &self,
        state: &dyn Session,
        filters: &[Expr],
        schema: &SchemaRef,
    ) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        let Some(predicate) = conjunction(filters.iter().cloned()) else {
            return Ok(None);
        };
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let predicate = unqualify(predicate)?;
        Ok(Some(state.create_physical_expr(predicate, &df_schema)?))
    }

    fn push_scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = &self.info.schema;
        // The device reads the projected columns plus those the filters need.
        let mut read: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..schema.fields().len()).collect());
        let wanted = read.clone();
        for f in filters {
            for c in f.column_refs() {
                let i = schema.index_of(&c.name)?;
                if !read.contains(&i) {
                    read.push(i);
                }
            }
        }
        let leaf = Arc::new(
            PartitionScanExec::try_new(
                self.info.name.clone(),
                vec![],
                Arc::clone(schema),
                Some(read.clone()),
            )?
            .with_statistics(Arc::clone(&self.statistics)),
        );
        let mut stage: Arc<dyn ExecutionPlan> = leaf.clone();
        if let Some(predicate) = self.physical_filters(state, filters, &leaf.schema())? {
            stage = Arc::new(FilterExec::try_new(predicate, stage)?);
        }
        // The wanted columns, without those only the filters read; on the
        // host if the devices do not project.
        let narrow = (read.len() != wanted.len()).then(|| {
            wanted
                .iter()
                .enumerate()
                .map(|(pos, _)| {
                    let field = leaf.schema().field(pos).clone();
                    let col: Arc<dyn PhysicalExpr> = Arc::new(
                        datafusion::physical_expr::expressions::Column::new(field.name(), pos),
                    );
                    (col, field.name().clone())
                })
                .collect::<Vec<_>>()
        });
        let device_projects = self.info.supports(Operator::Projection);
        if let (Some(exprs), true) = (&narrow, device_projects) {
            stage = Arc::new(ProjectionExec::try_new(exprs.clone(), stage)?);
        }
        if let (Some(n), true) = (limit, self.info.supports(Operator::Limit)) {
            stage = Arc::new(LocalLimitExec::new(stage, n));
        }
        let scan: Arc<dyn ExecutionPlan> = Arc::new(
            DeviceScanExec::new(stage, self.info.shares.clone(), Arc::clone(&self.stats))
                .with_auto(self.pushdown == Pushdown::Auto),
        );
        match (narrow, device_projects) {
            (Some(exprs), false) => Ok(Arc::new(ProjectionExec::try_new(exprs, scan)?)),
            _ => Ok(scan),
        }
    }

    fn pull_scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = &self.info.schema;
        let predicate = self.physical_filters(state, filters, schema)?;
        pull_source(
            &PullScan {
                shares: &self.info.shares,
                schema,
                statistics: &self.statistics,
                projection,
                predicate,
                limit,
            },
            state.config_options(),
        )
    }
}

/// Filters name columns of this table; drop whatever qualifier the query used.
fn unqualify(expr: Expr) -> Result<Expr> {
    Ok(expr
        .transform(|e| {
            Ok(match e {
                Expr::Column(c) => Transformed::yes(Expr::Column(Column::new_unqualified(c.name))),
                other => Transformed::no(other),
            })
        })?
        .data)
}

/// Whether a device can evaluate `expr` exactly.
fn device_can_evaluate(expr: &Expr) -> bool {
    let mut ok = true;
    let _ = expr.apply(|e| {
        match e {
            Expr::ScalarFunction(f)
                if f.func.signature().volatility
                    == datafusion::logical_expr::Volatility::Volatile =>
            {
                ok = false
            }
            Expr::ScalarSubquery(_)
            | Expr::Exists(_)
            | Expr::InSubquery(_)
            | Expr::OuterReferenceColumn(..)
            | Expr::Placeholder(_) => ok = false,
            _ => {}
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    ok
}

#[async_trait]
impl TableProvider for InsituTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.info.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match self.pushdown {
                Pushdown::On | Pushdown::Auto
                    if self.info.supports(Operator::Filter) && device_can_evaluate(f) =>
                {
                    TableProviderFilterPushDown::Exact
                }
                Pushdown::On | Pushdown::Auto => TableProviderFilterPushDown::Unsupported,
                Pushdown::Off => TableProviderFilterPushDown::Inexact,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match self.pushdown {
            Pushdown::On | Pushdown::Auto => self.push_scan(state, projection, filters, limit),
            Pushdown::Off => self.pull_scan(state, projection, filters, limit),
        }
    }
}
