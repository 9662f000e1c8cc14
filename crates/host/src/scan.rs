//! [`DeviceScanExec`]: the host operator that runs a stage plan on every
//! device holding the table and streams their results back.
//!
//! ```text
//!                 DeviceScanExec (one output partition per device)
//!               /        |        \
//!   stage plan bytes  ...        (link: metered, throttled)
//!          |                          |
//!      device 0                   device N-1
//!   (binds, runs, answers with Arrow IPC + stats)
//! ```

use std::fmt;
use std::sync::Arc;

use crate::result_decoder::ResultDecoder;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, Result, Statistics};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use datafusion::physical_plan::{StatisticsArgs, StatisticsContext};
use futures::{StreamExt, TryStreamExt};
use insitu_client::DeviceMessage;
use insitu_stage::{describe_stage, encode_stage, PartitionScanExec};
use insitu_wire::{ResultCodec, StagePlanEnvelope};

use crate::catalog::DeviceShare;
use crate::options::InsituOptions;
use crate::result_filter;
use crate::stats::StageStatsSink;

/// Runs a stage plan on each device that holds part of a table.
#[derive(Debug, Clone)]
pub struct DeviceScanExec {
    /// The stage with an unbound leaf; each device gets its own partitions.
    stage: Arc<dyn ExecutionPlan>,
    shares: Vec<DeviceShare>,
    stats: Arc<StageStatsSink>,
    properties: Arc<PlanProperties>,
    /// Per device (partition): what its stage reported, for EXPLAIN ANALYZE.
    metrics: ExecutionPlanMetricsSet,
    /// Whether the placement rule may move this stage's work to the host.
    auto: bool,
    /// What the placement rule predicted for each candidate, and chose.
    placement: Option<Arc<crate::placement_choice::PlacementChoice>>,
    /// Dynamic filters over the results, applied as they arrive
    /// ([`result_filter`](crate::result_filter)).
    result_filters: Vec<Arc<dyn PhysicalExpr>>,
}

impl DeviceScanExec {
    pub fn new(
        stage: Arc<dyn ExecutionPlan>,
        shares: Vec<DeviceShare>,
        stats: Arc<StageStatsSink>,
    ) -> Self {
        // Each device's stream has the stage's properties: sorted if the
        // stage ends in a sort.
        let properties = PlanProperties::new(
            stage.equivalence_properties().clone(),
            Partitioning::UnknownPartitioning(shares.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        )
        // Results arrive through tokio channels, which yield to the scheduler.
        .with_scheduling_type(SchedulingType::Cooperative);
        Self {
            stage,
            shares,
            stats,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            auto: false,
            placement: None,
            result_filters: vec![],
        }
    }

    /// The same scan, which the placement rule may pull to the host.
    pub fn with_auto(mut self, auto: bool) -> Self {
        self.auto = auto;
        self
    }

    /// What the placement rule predicted and chose for this scan.
    pub fn placement(&self) -> Option<&crate::placement_choice::PlacementChoice> {
        self.placement.as_deref()
    }

    pub fn is_auto(&self) -> bool {
        self.auto
    }

    /// The same scan, placed by the rule as `choice` says.
    pub fn with_placement(&self, choice: Arc<crate::placement_choice::PlacementChoice>) -> Self {
        let mut out = self.clone();
        out.auto = false;
        out.metrics = ExecutionPlanMetricsSet::new();
        out.placement = Some(choice);
        out
    }

    pub fn shares(&self) -> &[DeviceShare] {
        &self.shares
    }

    pub fn stage(&self) -> &Arc<dyn ExecutionPlan> {
        &self.stage
    }

    /// The same devices running a bigger stage (the optimizer folds host
    /// operators into it). The result filters are dropped: they filter the
    /// old stage's output; see [`Self::with_result_filters`].
    pub fn with_stage(&self, stage: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(stage, self.shares.clone(), Arc::clone(&self.stats)).with_auto(self.auto)
    }

    /// Dynamic filters applied to the results as they arrive.
    pub fn result_filters(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.result_filters
    }

    /// The same scan with `filters` (over its output) on its results.
    pub fn with_result_filters(mut self, filters: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        self.result_filters = filters;
        self
    }

    /// The stage bound to one device's partitions, encoded in its envelope.
    pub fn envelope_for(
        &self,
        share: &DeviceShare,
        query_id: &str,
        result_codec: ResultCodec,
    ) -> Result<Vec<u8>> {
        let partitions = share.partition_ids();
        let bound = Arc::clone(&self.stage)
            .transform_up(|node| {
                Ok(match node.downcast_ref::<PartitionScanExec>() {
                    Some(scan) => {
                        Transformed::yes(Arc::new(scan.with_partitions(partitions.clone())) as _)
                    }
                    None => Transformed::no(node),
                })
            })?
            .data;
        let plan = encode_stage(bound)?;
        Ok(StagePlanEnvelope {
            query_id: query_id.to_string(),
            device: share.client.id(),
            descriptors: share.descriptors.iter().map(|d| d.format_only()).collect(),
            result_codec,
            plan,
        }
        .encode())
    }
}

impl DisplayAs for DeviceScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let devices: Vec<String> = self
            .shares
            .iter()
            .map(|s| format!("{}:{:?}", s.client.id(), s.partition_ids()))
            .collect();
        write!(
            f,
            "DeviceScanExec: devices=[{}], stage=[{}]",
            devices.join(", "),
            describe_stage(&self.stage)
        )?;
        if let Some(choice) = &self.placement {
            write!(f, ", {choice}")?;
        }
        if !self.result_filters.is_empty() {
            let filters: Vec<String> = self.result_filters.iter().map(|e| e.to_string()).collect();
            write!(f, ", result_filter=[{}]", filters.join(" AND "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for DeviceScanExec {
    fn name(&self) -> &str {
        "DeviceScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// The result filters: a hash join computes its dynamic filter only
    /// when it finds a consumer among its probe side's expressions.
    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for filter in &self.result_filters {
            if f(filter)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    /// Keeps the dynamic filters DataFusion pushes after optimization and
    /// reports every filter as not pushed down: the scan may drop them
    /// when operators fold into its stage.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &datafusion::config::ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let dynamic: Vec<Arc<dyn PhysicalExpr>> = child_pushdown_result
            .parent_filters
            .iter()
            .map(|f| &f.filter)
            .filter(|f| result_filter::is_dynamic(f))
            .cloned()
            .collect();
        let unsupported = FilterPushdownPropagation::all_unsupported(child_pushdown_result);
        if phase != FilterPushdownPhase::Post || dynamic.is_empty() {
            return Ok(unsupported);
        }
        let mut filters = self.result_filters.clone();
        filters.extend(dynamic);
        let updated = self.clone().with_result_filters(filters);
        Ok(unsupported.with_updated_node(Arc::new(updated)))
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    /// The stage's statistics over the whole table, or over one device's
    /// share of it: the leaf carries the table's, from the manifests.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let stage = match args.partition().and_then(|i| self.shares.get(i)) {
            None => Arc::clone(&self.stage),
            Some(share) => {
                Arc::clone(&self.stage)
                    .transform_up(|node| {
                        Ok(match node.downcast_ref::<PartitionScanExec>() {
                            Some(scan) => {
                                let own = share.statistics(scan.table_schema());
                                Transformed::yes(Arc::new(scan.with_statistics(Arc::new(own))) as _)
                            }
                            None => Transformed::no(node),
                        })
                    })?
                    .data
            }
        };
        let stats = StatisticsContext::new().compute(stage.as_ref(), &StatisticsArgs::new())?;
        Ok(Arc::new(with_row_width_bytes(
            stats.as_ref().clone(),
            &self.schema(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.schema();
        let Some(share) = self.shares.get(partition).cloned() else {
            if self.shares.is_empty() && partition == 0 {
                return Ok(Box::pin(RecordBatchStreamAdapter::new(
                    schema,
                    futures::stream::empty(),
                )));
            }
            return internal_err!("DeviceScanExec has no partition {partition}");
        };
        let query_id = context
            .session_config()
            .get_extension::<crate::QueryId>()
            .map_or_else(|| context.session_id(), |q| q.0.clone());
        // A placed stage encodes as its placement chose.
        let codec = match &self.placement {
            Some(choice) => choice.codec,
            None => result_codec(context.session_config().options(), &share),
        };
        let envelope = self.envelope_for(&share, &query_id, codec)?;
        // The query's own sink when it installed one, else the session's.
        let stats = context
            .session_config()
            .get_extension::<StageStatsSink>()
            .unwrap_or_else(|| Arc::clone(&self.stats));
        let reports = StageReports::new(&self.metrics, partition);
        if let Some(choice) = &self.placement {
            MetricBuilder::new(&self.metrics)
                .gauge("predicted_stage_us", partition)
                .set((choice.chosen_secs() * 1e6) as usize);
        }
        let out_schema = Arc::clone(&schema);
        let stream = futures::stream::once(async move {
            let messages = share.client.execute(envelope).await?;
            Ok::<_, DataFusionError>(decode_results(
                messages,
                out_schema,
                stats,
                reports,
                share.client.id(),
            ))
        })
        .try_flatten();
        if self.result_filters.is_empty() {
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)));
        }
        let filters = self.result_filters.clone();
        let dropped =
            MetricBuilder::new(&self.metrics).counter("result_filter_dropped_rows", partition);
        let filtered = stream.try_filter_map(move |batch| {
            let rows = batch.num_rows();
            let kept = result_filter::apply(&filters, batch).map(|kept| {
                dropped.add(rows - kept.num_rows());
                (kept.num_rows() > 0).then_some(kept)
            });
            futures::future::ready(kept)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, filtered)))
    }
}

/// How `share`'s device compresses its results under the session's
/// `insitu.result_compression` and the device's link rate; the placement
/// rule prices stages with the same choice.
pub fn result_codec(
    config: &datafusion::config::ConfigOptions,
    share: &DeviceShare,
) -> ResultCodec {
    config
        .extensions
        .get::<InsituOptions>()
        .map(|o| o.result_compression)
        .unwrap_or_default()
        .codec_for(share.client.link().profile().bytes_per_sec)
}

/// `stats` with its byte size made rows times the width of `schema`'s
/// columns: a stage's filters scale the byte size of all the columns
/// they read, and the join planner builds on the side with fewer bytes
/// (TPC-H Q12 built on 15 M orders rather than on the filtered lineitem).
fn with_row_width_bytes(mut stats: Statistics, schema: &arrow::datatypes::Schema) -> Statistics {
    let width: usize = schema
        .fields()
        .iter()
        .map(|f| {
            f.data_type()
                .primitive_width()
                .unwrap_or(crate::statistics::VARIABLE_VALUE_BYTES_ASSUMED)
        })
        .sum();
    stats.total_byte_size = stats
        .num_rows
        .multiply(&datafusion::common::stats::Precision::Exact(width))
        .to_inexact();
    stats
}

/// One device's stage statistics as EXPLAIN ANALYZE shows them.
#[derive(Debug, Clone)]
struct StageReports {
    output_rows: datafusion::physical_plan::metrics::Count,
    device_rows_read: datafusion::physical_plan::metrics::Count,
    device_mem_peak: datafusion::physical_plan::metrics::Gauge,
    device_spilled_bytes: datafusion::physical_plan::metrics::Count,
    device_elapsed_us: datafusion::physical_plan::metrics::Gauge,
}

impl StageReports {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            output_rows: MetricBuilder::new(metrics).output_rows(partition),
            device_rows_read: MetricBuilder::new(metrics).counter("device_rows_read", partition),
            device_mem_peak: MetricBuilder::new(metrics).gauge("device_mem_peak", partition),
            device_spilled_bytes: MetricBuilder::new(metrics)
                .counter("device_spilled_bytes", partition),
            device_elapsed_us: MetricBuilder::new(metrics).gauge("device_elapsed_us", partition),
        }
    }

    fn record(&self, s: &insitu_wire::StageStats) {
        self.output_rows.add(s.rows_out as usize);
        self.device_rows_read.add(s.rows_read as usize);
        self.device_mem_peak.set_max(s.mem_peak_bytes as usize);
        self.device_spilled_bytes.add(s.spilled_bytes as usize);
        self.device_elapsed_us.set_max(s.elapsed_us as usize);
    }
}

/// Turns a device's messages into record batches of `schema`.
fn decode_results(
    messages: futures::stream::BoxStream<'static, Result<DeviceMessage>>,
    schema: SchemaRef,
    stats: Arc<StageStatsSink>,
    reports: StageReports,
    device: u32,
) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
    let state = (messages, ResultDecoder::new(), false);
    futures::stream::unfold(state, move |(mut messages, mut decoder, done)| {
        let schema = Arc::clone(&schema);
        let stats = Arc::clone(&stats);
        let reports = reports.clone();
        async move {
            if done {
                return None;
            }
            loop {
                match messages.next().await {
                    None => {
                        let err = DataFusionError::Execution(format!(
                            "device {device}: result stream ended before the stage finished"
                        ));
                        return Some((Err(err), (messages, decoder, true)));
                    }
                    Some(Err(e)) => return Some((Err(e), (messages, decoder, true))),
                    Some(Ok(DeviceMessage::Done(s))) => {
                        stats.add(device, &s);
                        reports.record(&s);
                        return None;
                    }
                    Some(Ok(DeviceMessage::Batch(batch))) => {
                        let out = with_schema(batch, &schema, device);
                        let done = out.is_err();
                        return Some((out, (messages, decoder, done)));
                    }
                    Some(Ok(DeviceMessage::Ipc(bytes))) => {
                        match decode_chunk(&mut decoder, bytes, &schema, device) {
                            Ok(Some(batch)) => {
                                return Some((Ok(batch), (messages, decoder, false)))
                            }
                            Ok(None) => continue,
                            Err(e) => return Some((Err(e), (messages, decoder, true))),
                        }
                    }
                }
            }
        }
    })
    .boxed()
}

/// Decodes one IPC chunk (one whole message: schema, batch or end marker).
fn decode_chunk(
    decoder: &mut ResultDecoder,
    bytes: bytes::Bytes,
    schema: &SchemaRef,
    device: u32,
) -> Result<Option<RecordBatch>> {
    let ipc_err = |e: arrow::error::ArrowError| {
        DataFusionError::Execution(format!("device {device}: malformed result stream: {e}"))
    };
    let out = decoder.decode(Buffer::from(bytes)).map_err(ipc_err)?;
    out.map(|batch| with_schema(batch, schema, device))
        .transpose()
}

/// Relabels a decoded batch with the stage's output schema (the wire form
/// does not carry field metadata such as nullability exactly).
fn with_schema(batch: RecordBatch, schema: &SchemaRef, device: u32) -> Result<RecordBatch> {
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), batch.columns().to_vec(), &options)
        .map_err(|e| {
            DataFusionError::Execution(format!("device {device}: malformed result stream: {e}"))
        })
}
