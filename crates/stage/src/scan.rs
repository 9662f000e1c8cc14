//! The leaf of every stage plan.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{exec_err, Result, Statistics};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};

/// Scan of some partitions of a table, with an optional projection.
///
/// It names data, it does not read it: a device binds it to its own files
/// (see [`crate::PartitionBinder`]); executing it unbound is an error.
#[derive(Debug, Clone)]
pub struct PartitionScanExec {
    table: String,
    partitions: Vec<u32>,
    table_schema: SchemaRef,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
    /// Planning statistics of the whole table (the host's; never encoded).
    statistics: Option<Arc<Statistics>>,
}

impl PartitionScanExec {
    /// Scans `partitions` of `table`, whose full schema is `table_schema`,
    /// producing the columns in `projection` (all when `None`).
    pub fn try_new(
        table: impl Into<String>,
        partitions: Vec<u32>,
        table_schema: SchemaRef,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        let output_schema = match &projection {
            Some(p) => Arc::new(table_schema.project(p)?),
            None => Arc::clone(&table_schema),
        };
        let properties = PlanProperties::new(
            EquivalenceProperties::new(output_schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            table: table.into(),
            partitions,
            table_schema,
            projection,
            properties: Arc::new(properties),
            statistics: None,
        })
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn partitions(&self) -> &[u32] {
        &self.partitions
    }

    pub fn table_schema(&self) -> &SchemaRef {
        &self.table_schema
    }

    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }

    /// The same scan, reporting `statistics` (of the unprojected table) to
    /// the host's planner.
    pub fn with_statistics(&self, statistics: Arc<Statistics>) -> Self {
        Self {
            statistics: Some(statistics),
            ..self.clone()
        }
    }

    /// The table's planning statistics, if the host attached them.
    pub fn table_statistics(&self) -> Option<&Arc<Statistics>> {
        self.statistics.as_ref()
    }

    /// The same scan over other partitions (the host binds a template per device).
    pub fn with_partitions(&self, partitions: Vec<u32>) -> Self {
        Self {
            partitions,
            ..self.clone()
        }
    }
}

impl DisplayAs for PartitionScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PartitionScanExec: table={}", self.table)?;
        if !self.partitions.is_empty() {
            write!(f, ", partitions={:?}", self.partitions)?;
        }
        if let Some(p) = &self.projection {
            let names: Vec<_> = p
                .iter()
                .map(|i| self.table_schema.field(*i).name().as_str())
                .collect();
            write!(f, ", projection=[{}]", names.join(", "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for PartitionScanExec {
    fn name(&self) -> &str {
        "PartitionScanExec"
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

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let Some(table) = &self.statistics else {
            return Ok(Arc::new(Statistics::new_unknown(&self.schema())));
        };
        let mut projected = table.as_ref().clone().project(self.projection.as_ref());
        // `project` keeps the whole table's byte size; the join planner
        // weighs sides by it, so it must be the projected columns' own.
        projected.total_byte_size = projected
            .column_statistics
            .iter()
            .map(|c| c.byte_size)
            .fold(Precision::Exact(0), |sum, b| sum.add(&b))
            .to_inexact();
        Ok(Arc::new(projected))
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        exec_err!(
            "PartitionScanExec of table {} is not bound to device files; stage plans run on devices",
            self.table
        )
    }
}
