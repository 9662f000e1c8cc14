//! [`FoldIntoStages`]: a physical optimizer rule that moves data-reducing
//! host operators into the device stage plans beneath them.
//!
//! ```text
//!  before                                   after
//!  AggregateExec(Final)                     AggregateExec(Final)
//!    CoalescePartitionsExec                   CoalescePartitionsExec
//!      AggregateExec(Partial)                   DeviceScanExec
//!        ProjectionExec                           stage: AggregateExec(Partial)
//!          RepartitionExec(RoundRobin)                     <- ProjectionExec
//!            DeviceScanExec                                <- FilterExec <- PartitionScanExec
//!              stage: FilterExec <- PartitionScanExec
//! ```
//!
//! Folded: a partial aggregate (and the filters, projections and
//! repartitions between it and the device scan), filters/projections
//! directly above a device scan, and sorts (with their top-k fetch)
//! directly above a device scan, merged on the host by a [`DeviceMergeExec`]
//! (see `fold_sort` and `device_merge`). Repartitions are dropped: a
//! device spreads its own work over its threads. A fold happens only if the grown stage
//! encodes and decodes and every device holding the table advertises the
//! operators it adds, so a device never receives a plan it cannot run.

use std::sync::{Arc, OnceLock};

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::config::ConfigOptions;
use datafusion::execution::TaskContext;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions,
};
use datafusion::prelude::SessionContext;
use insitu_stage::{decode_stage_unbound, encode_stage};
use insitu_wire::Operator;

use crate::catalog::supported_by_all;
use crate::merge::DeviceMergeExec;
use crate::result_filter;
use crate::scan::DeviceScanExec;

#[derive(Debug, Default)]
pub struct FoldIntoStages;

impl PhysicalOptimizerRule for FoldIntoStages {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan.transform_up(|node| Ok(fold(node)))?.data)
    }

    fn name(&self) -> &str {
        "insitu_fold_into_stages"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn is_row_local(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.is::<FilterExec>() || node.is::<ProjectionExec>()
}

/// Folds `node` into the device scan below it, if it can.
fn fold(node: Arc<dyn ExecutionPlan>) -> Transformed<Arc<dyn ExecutionPlan>> {
    if let Some(folded) = fold_sort(&node) {
        return Transformed::yes(folded);
    }
    if let Some(merge) = device_merge(&node) {
        return Transformed::yes(merge);
    }
    let foldable_aggregate = node
        .downcast_ref::<AggregateExec>()
        .is_some_and(|a| *a.mode() == AggregateMode::Partial);
    if !(foldable_aggregate || is_row_local(&node)) {
        return Transformed::no(node);
    }
    // Walk down through operators that can move to the device.
    let mut chain: Vec<Arc<dyn ExecutionPlan>> = vec![];
    let mut cursor = Arc::clone(&node);
    let scan = loop {
        let children = cursor.children();
        if children.len() != 1 {
            return Transformed::no(node);
        }
        let child = Arc::clone(children[0]);
        if let Some(scan) = child.downcast_ref::<DeviceScanExec>() {
            break scan.clone();
        }
        let passable =
            is_row_local(&child) || (foldable_aggregate && child.is::<RepartitionExec>());
        if !passable {
            return Transformed::no(node);
        }
        chain.push(Arc::clone(&cursor));
        cursor = child;
    };
    chain.push(cursor);
    if !chain.iter().all(|op| devices_run(&scan, op)) {
        return Transformed::no(node);
    }
    // Rebuild the chain on top of the stage, skipping repartitions; the
    // result filters follow the columns they test.
    let mut stage = Arc::clone(scan.stage());
    let mut filters = scan.result_filters().to_vec();
    for op in chain.into_iter().rev() {
        filters = result_filter::lift_through(&filters, &op);
        if op.is::<RepartitionExec>() {
            continue;
        }
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        stage = match op.replace_children(vec![stage], options) {
            Ok(s) => s,
            Err(_) => return Transformed::no(node),
        };
    }
    if !round_trips(&stage) {
        return Transformed::no(node);
    }
    Transformed::yes(Arc::new(
        scan.with_stage(stage).with_result_filters(filters),
    ))
}

/// A sort directly above a device scan moves into the stage: each device
/// sorts its share (top-k only, with a fetch) and the host merges the
/// sorted streams, passing long runs through uncopied ([`DeviceMergeExec`]).
///
/// ```text
///  SortPreservingMergeExec [fetch]          DeviceMergeExec [fetch]
///    SortExec [fetch], per partition  ==>     DeviceScanExec (sorted per device)
///      DeviceScanExec                           stage: SortExec [fetch] <- ...
/// ```
fn fold_sort(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let sort = node.downcast_ref::<SortExec>()?;
    let scan = sort.input().downcast_ref::<DeviceScanExec>()?;
    if !supported_by_all(scan.shares(), Operator::Sort) {
        return None;
    }
    let stage_sort = SortExec::new(sort.expr().clone(), Arc::clone(scan.stage()))
        .with_fetch(sort.fetch())
        .with_preserve_partitioning(false);
    let stage: Arc<dyn ExecutionPlan> = Arc::new(stage_sort);
    if !round_trips(&stage) {
        return None;
    }
    let sorted_scan: Arc<dyn ExecutionPlan> = Arc::new(
        scan.with_stage(stage)
            .with_result_filters(scan.result_filters().to_vec()),
    );
    let merges_itself = !sort.preserve_partitioning();
    if merges_itself && sorted_scan.output_partitioning().partition_count() > 1 {
        let merge = DeviceMergeExec::new(sort.expr().clone(), sorted_scan).with_fetch(sort.fetch());
        return Some(Arc::new(merge));
    }
    Some(sorted_scan)
}

/// DataFusion's merge of the devices' sorted streams (planned when the sort
/// kept its partitioning) becomes a [`DeviceMergeExec`], which passes long
/// runs through uncopied. The plan's ordering requirement guarantees the
/// scan's streams are sorted.
fn device_merge(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let merge = node.downcast_ref::<SortPreservingMergeExec>()?;
    merge.input().downcast_ref::<DeviceScanExec>()?;
    let device_merge = DeviceMergeExec::new(merge.expr().clone(), Arc::clone(merge.input()))
        .with_fetch(merge.fetch());
    Some(Arc::new(device_merge))
}

/// Whether every device under `scan` advertises the operator `op` needs.
fn devices_run(scan: &DeviceScanExec, op: &Arc<dyn ExecutionPlan>) -> bool {
    let needed = if op.is::<FilterExec>() {
        Operator::Filter
    } else if op.is::<ProjectionExec>() {
        Operator::Projection
    } else if op.is::<AggregateExec>() {
        Operator::PartialAggregate
    } else {
        return true; // repartitions are dropped, not shipped
    };
    supported_by_all(scan.shares(), needed)
}

/// Whether a device could decode `stage`: some plans encode but only decode
/// inside a host-side context (scalar subqueries, for one). Devices know
/// DataFusion's built-in functions, and so does this check.
fn round_trips(stage: &Arc<dyn ExecutionPlan>) -> bool {
    static DEVICE_FUNCTIONS: OnceLock<Arc<TaskContext>> = OnceLock::new();
    let ctx = DEVICE_FUNCTIONS.get_or_init(|| SessionContext::new().task_ctx());
    encode_stage(Arc::clone(stage))
        .and_then(|bytes| decode_stage_unbound(&bytes, ctx))
        .is_ok()
}
