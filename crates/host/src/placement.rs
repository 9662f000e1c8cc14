//! [`ChoosePlacement`]: a physical optimizer rule that decides, per device
//! scan, whether the devices run its stage (push), only its scan part
//! (push scan), or ship their stored pages for the host to run it (pull),
//! from the cost model in `insitu-model`.
//!
//! ```text
//!  DeviceScanExec (auto)          push: unchanged
//!   stage: AggregateExec(Partial)  push scan: AggregateExec(Partial)      [host]
//!            FilterExec                         DeviceScanExec: FilterExec <- scan
//!              PartitionScanExec   pull: PlacementExec
//!                                          AggregateExec(Partial)         [host]
//!                                            FilterExec
//!                                              DataSourceExec (pages over the link)
//! ```
//!
//! It runs after [`crate::rule::FoldIntoStages`], so the candidates weigh
//! everything a device could run. Only scans planned with
//! `--pushdown auto` are placed; `on` and `off` stay as they were asked.
//! The model's inputs come from the manifests (rows, stored bytes per
//! column chunk), DataFusion's statistics over the stage (selectivity,
//! output rows), the devices' profiles in their capabilities, the host's
//! profile and the link's profile.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    ReplaceChildrenOptions, StatisticsArgs, StatisticsContext,
};
use insitu_model::{DeviceInput, Machine, Placement, ResultEncoding, StageShape};
use insitu_stage::PartitionScanExec;
use insitu_wire::{
    ColumnStats, DeviceProfile, FormatDescriptor, HostProfile, IpcCompression, ResultCodec,
    RowGroupStats, PROFILE_VERSION,
};

use crate::catalog::DeviceShare;
use crate::options::{CompressionChoice, InsituOptions};
pub use crate::placement_choice::PlacementChoice;
use crate::pull::{pull_source, PullScan};
use crate::result_filter;
use crate::scan::DeviceScanExec;
use crate::starts;
use crate::statistics::VARIABLE_VALUE_BYTES_ASSUMED;

/// Link bytes per Arrow byte of LZ4-compressed device results, assumed
/// for a column whose descriptor records no sample of its own (TPC-H SF1
/// Q3 over 1 GbE: 141 MiB plain, 37 MiB LZ4).
pub const LZ4_RESULT_RATIO_ASSUMED: f64 = 0.4;

/// [`LZ4_RESULT_RATIO_ASSUMED`] for Zstandard.
pub const ZSTD_RESULT_RATIO_ASSUMED: f64 = 0.3;

/// One placed scan of an executed plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlacement {
    pub table: String,
    pub choice: PlacementChoice,
    /// The slowest device's stage time, for a stage the devices ran.
    pub measured_secs: Option<f64>,
    /// The stage's time when it ran on its own ([`time_stages_alone`]).
    pub alone_secs: Option<f64>,
}

impl serde::Serialize for StagePlacement {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Candidate {
            placement: &'static str,
            compressed: bool,
            codec: &'static str,
            predicted_secs: f64,
            predicted_link_bytes: f64,
        }
        #[derive(serde::Serialize)]
        struct View<'a> {
            table: &'a str,
            chosen: &'static str,
            codec: &'static str,
            predicted_secs: f64,
            measured_secs: Option<f64>,
            alone_secs: Option<f64>,
            candidates: Vec<Candidate>,
            shape: &'a StageShape,
            machine: &'a Machine,
        }
        View {
            table: &self.table,
            chosen: self.choice.chosen.name(),
            codec: self.choice.codec.name(),
            predicted_secs: self.choice.chosen_secs(),
            measured_secs: self.measured_secs,
            alone_secs: self.alone_secs,
            candidates: self
                .choice
                .candidates
                .iter()
                .map(|p| Candidate {
                    placement: p.placement.name(),
                    compressed: p.compressed(),
                    codec: p.codec.name(),
                    predicted_secs: p.total_secs,
                    predicted_link_bytes: p.link_bytes,
                })
                .collect(),
            shape: &self.choice.shape,
            machine: &self.choice.machine,
        }
        .serialize(serializer)
    }
}

/// The placed scans of `plan`, with what they measured if it ran.
pub fn placements(plan: &Arc<dyn ExecutionPlan>) -> Vec<StagePlacement> {
    placed_nodes(plan).iter().filter_map(placement_of).collect()
}

/// The nodes of `plan` the placement rule placed: pushed device scans and
/// pulled stages, in plan order.
fn placed_nodes(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut out = vec![];
    let _ = plan.apply(|node| {
        let placed = node
            .downcast_ref::<DeviceScanExec>()
            .is_some_and(|scan| scan.placement().is_some());
        let pulled = node.is::<PlacementExec>();
        if placed || pulled {
            out.push(Arc::clone(node));
        }
        // A pulled stage's own scan is not a device scan; nothing below
        // it is placed.
        Ok(if pulled {
            TreeNodeRecursion::Jump
        } else {
            TreeNodeRecursion::Continue
        })
    });
    out
}

fn placement_of(node: &Arc<dyn ExecutionPlan>) -> Option<StagePlacement> {
    if let Some(scan) = node.downcast_ref::<DeviceScanExec>() {
        let elapsed = scan.metrics().and_then(|m| {
            m.iter()
                .filter(|m| m.value().name() == "device_elapsed_us")
                .map(|m| m.value().as_usize())
                .max()
        });
        return Some(StagePlacement {
            table: stage_table(scan.stage()),
            choice: scan.placement()?.clone(),
            measured_secs: elapsed.filter(|&us| us > 0).map(|us| us as f64 / 1e6),
            alone_secs: None,
        });
    }
    let pulled = node.downcast_ref::<PlacementExec>()?;
    Some(StagePlacement {
        table: pulled.table.clone(),
        choice: pulled.choice.as_ref().clone(),
        measured_secs: None,
        alone_secs: None,
    })
}

/// The placed stages of `plan`, each run on its own (all its partitions
/// at once, results drained), with the time that took: what the model
/// predicts, free of the waits a stage sees inside a query (a probe side
/// waits for its build side; stages share the link and the cores).
pub async fn time_stages_alone(
    plan: &Arc<dyn ExecutionPlan>,
    context: Arc<datafusion::execution::TaskContext>,
) -> Result<Vec<StagePlacement>> {
    let mut out = vec![];
    for node in placed_nodes(plan) {
        let started = std::time::Instant::now();
        drain_all_partitions(&node, &context).await?;
        let secs = started.elapsed().as_secs_f64();
        if let Some(mut placement) = placement_of(&node) {
            placement.alone_secs = Some(secs);
            out.push(placement);
        }
    }
    Ok(out)
}

/// Runs every partition of `node` on its own task and drops the batches.
async fn drain_all_partitions(
    node: &Arc<dyn ExecutionPlan>,
    context: &Arc<datafusion::execution::TaskContext>,
) -> Result<()> {
    use futures::StreamExt;
    let partitions = node.properties().output_partitioning().partition_count();
    let mut tasks = Vec::with_capacity(partitions);
    for partition in 0..partitions {
        let mut stream = node.execute(partition, Arc::clone(context))?;
        tasks.push(tokio::spawn(async move {
            while let Some(batch) = stream.next().await {
                batch?;
            }
            Ok::<_, datafusion::error::DataFusionError>(())
        }));
    }
    let mut outcome = Ok(());
    for task in tasks {
        if outcome.is_err() {
            task.abort();
            continue;
        }
        outcome = task
            .await
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
            .and_then(|drained| drained);
    }
    outcome
}

/// The table a device stage reads.
fn stage_table(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut name = String::new();
    let _ = plan.apply(|node| {
        if let Some(leaf) = node.downcast_ref::<PartitionScanExec>() {
            name = leaf.table().to_string();
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    name
}

/// Places every auto device scan of a plan.
#[derive(Debug)]
pub struct ChoosePlacement {
    host: HostProfile,
    /// Cores the embedded devices share with the host.
    cores: u32,
    /// The placement every auto scan gets, priced as the model prices
    /// it (for measuring stage starts); `None` lets the model choose.
    forced: Option<Placement>,
}

impl ChoosePlacement {
    pub fn new(host: HostProfile) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        Self {
            host,
            cores,
            forced: None,
        }
    }

    /// Places every auto scan as `placement`, whatever the model predicts.
    pub fn forcing(mut self, placement: Placement) -> Self {
        self.forced = Some(placement);
        self
    }
}

impl PhysicalOptimizerRule for ChoosePlacement {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(plan
            .transform_up(|node| {
                let Some(scan) = node.downcast_ref::<DeviceScanExec>() else {
                    return Ok(Transformed::no(node));
                };
                if scan.is_auto() {
                    return Ok(Transformed::yes(self.place(scan, config)?));
                }
                match self.encode(scan, config)? {
                    Some(encoded) => Ok(Transformed::yes(encoded)),
                    None => Ok(Transformed::no(node)),
                }
            })?
            .data)
    }

    fn name(&self) -> &str {
        "insitu_choose_placement"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A stage as a chain, top first, ending in its leaf scan.
struct Chain {
    nodes: Vec<Arc<dyn ExecutionPlan>>,
    /// Index of the top of the scan part: filters and projections right
    /// above the leaf, and the leaf.
    scan_top: usize,
}

impl Chain {
    fn of(stage: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let mut nodes = vec![Arc::clone(stage)];
        loop {
            let last = nodes.last().expect("non-empty");
            if last.is::<PartitionScanExec>() {
                break;
            }
            let children = last.children();
            if children.len() != 1 {
                return None;
            }
            nodes.push(Arc::clone(children[0]));
        }
        let mut scan_top = nodes.len() - 1;
        while scan_top > 0 && is_row_local(&nodes[scan_top - 1]) {
            scan_top -= 1;
        }
        Some(Self { nodes, scan_top })
    }

    fn leaf(&self) -> &PartitionScanExec {
        self.nodes
            .last()
            .and_then(|n| n.downcast_ref::<PartitionScanExec>())
            .expect("chain ends in its leaf")
    }

    /// The nodes above `from` rebuilt over `input`, bottom up.
    fn rebuild_above(
        &self,
        from: usize,
        input: Arc<dyn ExecutionPlan>,
        per_partition: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut plan = input;
        for node in self.nodes[..from].iter().rev() {
            plan = match node.downcast_ref::<SortExec>() {
                // A stage sorts one device's rows; on the host each input
                // partition is sorted on its own and merged above.
                Some(sort) if per_partition => Arc::new(
                    SortExec::new(sort.expr().clone(), plan)
                        .with_fetch(sort.fetch())
                        .with_preserve_partitioning(true),
                ),
                _ => Arc::clone(node).replace_children(
                    vec![plan],
                    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
                )?,
            };
        }
        Ok(plan)
    }

    fn has(&self, upper: impl Fn(&Arc<dyn ExecutionPlan>) -> bool) -> bool {
        self.nodes[..self.scan_top].iter().any(upper)
    }
}

/// The result encodings a pushed stage may use under the session's
/// `insitu.result_compression`: `auto` weighs plain, LZ4 and Zstandard
/// per scan, a fixed codec is the only one. `ratios` are the stage's
/// results' bytes per codec ([`result_ratios`]).
fn result_encodings(config: &ConfigOptions, ratios: IpcCompression) -> Vec<ResultEncoding> {
    let encoding = |codec| ResultEncoding {
        codec,
        bytes_ratio: match codec {
            ResultCodec::None => 1.0,
            ResultCodec::Lz4Frame => ratios.lz4_ratio,
            ResultCodec::Zstd => ratios.zstd_ratio,
        },
    };
    match compression_choice(config) {
        CompressionChoice::Auto => ResultCodec::ALL.into_iter().map(encoding).collect(),
        CompressionChoice::Fixed(codec) => vec![encoding(codec)],
    }
}

fn compression_choice(config: &ConfigOptions) -> CompressionChoice {
    config
        .extensions
        .get::<InsituOptions>()
        .map(|o| o.result_compression)
        .unwrap_or_default()
}

/// Whether the session leaves the results' codec to the model.
fn chooses_codec(config: &ConfigOptions) -> bool {
    compression_choice(config) == CompressionChoice::Auto
}

fn descriptors(scan: &DeviceScanExec) -> Vec<&FormatDescriptor> {
    scan.shares().iter().flat_map(|s| &s.descriptors).collect()
}

/// How the results of a stage producing `schema` compress: each column's
/// ratios as its partitions' descriptors record them (assumed where they
/// do not), weighted by the column's Arrow width.
fn result_ratios(schema: &Schema, descriptors: &[&FormatDescriptor]) -> IpcCompression {
    let recorded = |name: &str| {
        descriptors
            .iter()
            .flat_map(|d| &d.fields)
            .find(|f| f.name == name)
            .and_then(|f| f.ipc_compression)
    };
    let (mut weight, mut lz4, mut zstd) = (0.0, 0.0, 0.0);
    for field in schema.fields() {
        let width = field
            .data_type()
            .primitive_width()
            .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED) as f64;
        let ratios = recorded(field.name()).unwrap_or(IpcCompression {
            lz4_ratio: LZ4_RESULT_RATIO_ASSUMED,
            zstd_ratio: ZSTD_RESULT_RATIO_ASSUMED,
        });
        weight += width;
        lz4 += width * ratios.lz4_ratio;
        zstd += width * ratios.zstd_ratio;
    }
    if weight == 0.0 {
        return IpcCompression {
            lz4_ratio: LZ4_RESULT_RATIO_ASSUMED,
            zstd_ratio: ZSTD_RESULT_RATIO_ASSUMED,
        };
    }
    IpcCompression {
        lz4_ratio: lz4 / weight,
        zstd_ratio: zstd / weight,
    }
}

fn is_row_local(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.is::<FilterExec>() || node.is::<ProjectionExec>()
}

impl ChoosePlacement {
    fn place(
        &self,
        scan: &DeviceScanExec,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(chain) = Chain::of(scan.stage()) else {
            return Ok(Arc::new(scan.clone().with_auto(false)));
        };
        let shape = self.shape(scan, &chain)?;
        let machine = self.machine(scan.shares());
        let encodings = result_encodings(config, result_ratios(&scan.schema(), &descriptors(scan)));
        let (best, candidates) = match self.forced {
            Some(placement) => {
                insitu_model::choose_encoding(&shape, placement, &machine, &encodings)
            }
            None => insitu_model::choose_encodings(&shape, &machine, &encodings),
        };
        let choice = Arc::new(PlacementChoice::of(best, candidates, shape, machine));
        tracing::debug!(table = chain.leaf().table(), %choice, "placed a device scan");
        let partitions = scan.properties().output_partitioning().partition_count();
        let placed: Arc<dyn ExecutionPlan> = match best.placement {
            Placement::Push => return Ok(Arc::new(scan.with_placement(choice))),
            Placement::PushScan => {
                let devices = scan
                    .with_stage(Arc::clone(&chain.nodes[chain.scan_top]))
                    .with_placement(Arc::clone(&choice));
                chain.rebuild_above(chain.scan_top, Arc::new(devices), false)?
            }
            Placement::Pull => {
                let source = self.pull(scan, &chain, config)?;
                let above = chain.rebuild_above(chain.nodes.len() - 1, source, true)?;
                Arc::new(PlacementExec::new(above, choice, chain.leaf().table()))
            }
        };
        let placed = result_filter::on_host(placed, scan.result_filters())?;
        Ok(keep_partitioning(placed, partitions, scan))
    }

    /// A scan pushed by the user's choice (`--pushdown on`), with its
    /// results' encoding chosen by the model when the session leaves it
    /// to `auto`: plain results that would outweigh the pages pull would
    /// move travel compressed. `None` when there is nothing to choose.
    fn encode(
        &self,
        scan: &DeviceScanExec,
        config: &ConfigOptions,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if !chooses_codec(config) || scan.placement().is_some() {
            return Ok(None);
        }
        let encodings = result_encodings(config, result_ratios(&scan.schema(), &descriptors(scan)));
        let Some(chain) = Chain::of(scan.stage()) else {
            return Ok(None);
        };
        let shape = self.shape(scan, &chain)?;
        let machine = self.machine(scan.shares());
        let (best, candidates) =
            insitu_model::choose_encoding(&shape, Placement::Push, &machine, &encodings);
        let choice = PlacementChoice::of(best, candidates, shape, machine);
        Ok(Some(Arc::new(scan.with_placement(Arc::new(choice)))))
    }

    /// The host plan reading the stage's columns over the link.
    fn pull(
        &self,
        scan: &DeviceScanExec,
        chain: &Chain,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let leaf = chain.leaf();
        let schema = leaf.table_schema();
        let projection = leaf.projection().map(|p| p.to_vec());
        let predicate = pushed_predicate(chain)?;
        let unknown = Statistics::new_unknown(schema);
        let statistics = leaf.table_statistics().map_or(&unknown, |s| s.as_ref());
        pull_source(
            &PullScan {
                shares: scan.shares(),
                schema,
                statistics,
                projection: projection.as_ref(),
                predicate,
                limit: None,
            },
            config,
        )
    }

    fn shape(&self, scan: &DeviceScanExec, chain: &Chain) -> Result<StageShape> {
        let leaf = chain.leaf();
        let leaf_schema = leaf.schema();
        let read: Vec<&arrow::datatypes::Field> =
            leaf_schema.fields().iter().map(|f| f.as_ref()).collect();
        let names: Vec<&str> = read.iter().map(|f| f.name().as_str()).collect();
        let strings = read.iter().filter(|f| is_variable(f.data_type())).count() as u32;
        let table_schema = leaf.table_schema();
        let pruning = pushed_predicate(chain)?.and_then(|p| {
            PruningPredicateBuilder::new()
                .with_file_schema(Arc::clone(table_schema))
                .build(p)
        });
        let devices: Vec<DeviceInput> = scan
            .shares()
            .iter()
            .map(|s| {
                s.descriptors
                    .iter()
                    .map(|d| scanned(d, &names, table_schema, pruning.as_deref()))
                    .fold(
                        DeviceInput {
                            rows: 0,
                            stored_bytes: 0,
                            string_stored_bytes: 0,
                        },
                        |a, b| DeviceInput {
                            rows: a.rows + b.rows,
                            stored_bytes: a.stored_bytes + b.stored_bytes,
                            string_stored_bytes: a.string_stored_bytes + b.string_stored_bytes,
                        },
                    )
            })
            .collect();
        let table_rows: u64 = scan
            .shares()
            .iter()
            .flat_map(|s| &s.descriptors)
            .map(|d| d.row_count)
            .sum();
        let rows_in: u64 = devices.iter().map(|d| d.rows).sum();
        // DataFusion estimates over the whole table; the kept row groups
        // hold at most what it keeps.
        let scan_rows = estimated_rows(&chain.nodes[chain.scan_top])?
            .unwrap_or(table_rows)
            .min(rows_in);
        let rows_out = rows_out(chain, scan_rows, scan.shares());
        let aggregate = chain.nodes[..chain.scan_top]
            .iter()
            .find_map(|n| n.downcast_ref::<AggregateExec>());
        Ok(StageShape {
            devices,
            fixed_columns: read.len() as u32 - strings,
            string_columns: strings,
            filter: chain.nodes[chain.scan_top..]
                .iter()
                .any(|n| n.is::<FilterExec>()),
            selectivity: if rows_in == 0 {
                1.0
            } else {
                (scan_rows as f64 / rows_in as f64).clamp(0.0, 1.0)
            },
            scan_row_bytes: row_bytes(&chain.nodes[chain.scan_top].schema()),
            aggregate: aggregate.is_some(),
            groups: aggregate.map_or(0, |agg| aggregate_groups(agg, leaf)),
            aggregates: aggregate.map_or(0, |agg| agg.aggr_expr().len() as u32),
            sort: chain.has(|n| n.is::<SortExec>()),
            rows_out,
            out_row_bytes: row_bytes(&chain.nodes[0].schema()),
            // Set once an encoding is chosen.
            result_bytes_ratio: 1.0,
            result_codec: ResultCodec::None,
        })
    }

    fn machine(&self, shares: &[DeviceShare]) -> Machine {
        let devices = shares
            .iter()
            .map(|s| {
                s.client
                    .capabilities()
                    .profile
                    .clone()
                    .unwrap_or_else(|| self.assumed_device(s.client.capabilities().threads))
            })
            .collect();
        let embedded = !shares.is_empty() && shares.iter().all(|s| s.client.in_process());
        let link = shares.first().map(|s| s.client.link().profile());
        Machine {
            devices,
            host: self.host.clone(),
            link_bytes_per_sec: link.and_then(|l| l.bytes_per_sec),
            shared_cores: embedded.then_some(self.cores),
            starts: link.and_then(|l| self.host.stage_starts.get(&starts::link_key(&l)).copied()),
        }
    }

    /// A device that reports no profile is assumed to compute like the
    /// host and to read at [`ASSUMED_STORAGE_READ_BYTES_PER_SEC`].
    fn assumed_device(&self, threads: u32) -> DeviceProfile {
        DeviceProfile {
            version: PROFILE_VERSION,
            storage_read_bytes_per_sec: ASSUMED_STORAGE_READ_BYTES_PER_SEC,
            threads: threads.max(1),
            rates: self.host.rates.clone(),
            source: "assumed: the device reported no profile".into(),
        }
    }
}

/// Distinct values assumed of a grouping column whose statistics do not
/// bound them (strings, expressions).
pub const GROUP_KEYS_ASSUMED: u64 = 64;

/// Rows the whole stage sends, from the `scan_rows` its scan part keeps:
/// a partial aggregate sends a row per group and device thread, a top-k
/// or limit at most its count per device.
fn rows_out(chain: &Chain, scan_rows: u64, shares: &[DeviceShare]) -> u64 {
    let devices = shares.len().max(1) as u64;
    let threads: u64 = shares
        .iter()
        .map(|s| u64::from(s.client.capabilities().threads.max(1)))
        .sum::<u64>()
        .max(1);
    let leaf = chain.leaf();
    let mut rows = scan_rows;
    for node in chain.nodes[..chain.scan_top].iter().rev() {
        if let Some(agg) = node.downcast_ref::<AggregateExec>() {
            let groups = aggregate_groups(agg, leaf);
            rows = rows.min(groups.saturating_mul(threads));
        } else if let Some(n) = node.downcast_ref::<SortExec>().and_then(|s| s.fetch()) {
            rows = rows.min((n as u64).saturating_mul(devices));
        } else if let Some(limit) =
            node.downcast_ref::<datafusion::physical_plan::limit::LocalLimitExec>()
        {
            rows = rows.min((limit.fetch() as u64).saturating_mul(devices));
        }
    }
    rows
}

/// Groups of `agg`: the product of its grouping columns' value ranges,
/// from the table's min/max, or [`GROUP_KEYS_ASSUMED`] each.
fn aggregate_groups(agg: &AggregateExec, leaf: &PartitionScanExec) -> u64 {
    let stats = leaf.table_statistics();
    let schema = leaf.table_schema();
    agg.group_expr()
        .expr()
        .iter()
        .map(|(expr, _)| {
            let column = expr.downcast_ref::<Column>();
            let bounded = column
                .and_then(|c| schema.index_of(c.name()).ok())
                .and_then(|i| stats.and_then(|s| s.column_statistics.get(i)))
                .and_then(|c| {
                    let (min, max) = (c.min_value.get_value()?, c.max_value.get_value()?);
                    min.distance(max)
                });
            bounded.map_or(GROUP_KEYS_ASSUMED, |d| d as u64 + 1)
        })
        .fold(1u64, u64::saturating_mul)
}

/// Storage read rate assumed for a device without a profile (an NVMe SSD).
pub const ASSUMED_STORAGE_READ_BYTES_PER_SEC: f64 = 2e9;

/// The old plan's single partition kept: a parent planned on one device's
/// stream (a final aggregate over one device) must not see several.
fn keep_partitioning(
    plan: Arc<dyn ExecutionPlan>,
    partitions: usize,
    scan: &DeviceScanExec,
) -> Arc<dyn ExecutionPlan> {
    if partitions != 1 || plan.output_partitioning().partition_count() == 1 {
        return plan;
    }
    match scan.properties().output_ordering() {
        Some(ordering) => Arc::new(SortPreservingMergeExec::new(ordering.clone(), plan)),
        None => Arc::new(CoalescePartitionsExec::new(plan)),
    }
}

/// The predicate of the filter right above the leaf, over the table's
/// columns: it prunes row groups.
fn pushed_predicate(chain: &Chain) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    chain
        .nodes
        .get(chain.nodes.len().wrapping_sub(2))
        .and_then(|n| n.downcast_ref::<FilterExec>())
        .map(|f| over_table_columns(f.predicate(), chain.leaf().table_schema()))
        .transpose()
}

/// `predicate` over a projection of `schema`, rewritten over `schema`.
fn over_table_columns(
    predicate: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(Arc::clone(predicate)
        .transform(|e| {
            Ok(match e.downcast_ref::<Column>() {
                Some(c) => {
                    let index = schema.index_of(c.name())?;
                    Transformed::yes(Arc::new(Column::new(c.name(), index)) as _)
                }
                None => Transformed::no(e),
            })
        })?
        .data)
}

fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<u64>> {
    let stats = StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new())?;
    Ok(stats.num_rows.get_value().map(|&n| n as u64))
}

fn is_variable(t: &DataType) -> bool {
    t.primitive_width().is_none()
}

fn row_bytes(schema: &Schema) -> f64 {
    schema
        .fields()
        .iter()
        .map(|f| {
            f.data_type()
                .primitive_width()
                .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED) as f64
        })
        .sum()
}

/// Rows and stored bytes of the columns `names` that a scan reads of one
/// partition: the row groups `pruning` cannot rule out, each with its
/// column chunks' sizes where the descriptor records them, else its size
/// split by the columns' in-memory widths.
fn scanned(
    d: &FormatDescriptor,
    names: &[&str],
    schema: &Schema,
    pruning: Option<&PruningPredicate>,
) -> DeviceInput {
    let width = |name: &str| {
        schema
            .field_with_name(name)
            .ok()
            .and_then(|f| f.data_type().primitive_width())
            .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED) as u64
    };
    let all: u64 = schema.fields().iter().map(|f| width(f.name())).sum();
    let wanted: u64 = names.iter().map(|n| width(n)).sum();
    let estimate = |size: u64| size.saturating_mul(wanted) / all.max(1);
    let strings: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            schema
                .field_with_name(n)
                .is_ok_and(|f| is_variable(f.data_type()))
        })
        .collect();
    let string_share = |bytes: u64| {
        let w: u64 = strings.iter().map(|n| width(n)).sum();
        bytes.saturating_mul(w) / wanted.max(1)
    };
    if d.row_groups.is_empty() {
        let stored = estimate(d.byte_size);
        return DeviceInput {
            rows: d.row_count,
            stored_bytes: stored,
            string_stored_bytes: string_share(stored),
        };
    }
    let keep = pruning
        .and_then(|p| {
            p.prune(&RowGroupBounds {
                groups: &d.row_groups,
                schema,
            })
            .ok()
        })
        .unwrap_or_else(|| vec![true; d.row_groups.len()]);
    let mut input = DeviceInput {
        rows: 0,
        stored_bytes: 0,
        string_stored_bytes: 0,
    };
    for (rg, _) in d.row_groups.iter().zip(keep).filter(|(_, k)| *k) {
        let chunk = |n: &&str| {
            rg.columns
                .iter()
                .find(|c| c.column == *n)
                .and_then(|c| c.compressed_bytes)
        };
        let recorded: Option<u64> = names.iter().map(chunk).sum();
        let recorded_strings: Option<u64> = strings.iter().map(chunk).sum();
        input.rows += rg.row_count;
        match (recorded, recorded_strings) {
            (Some(all), Some(strings)) => {
                input.stored_bytes += all;
                input.string_stored_bytes += strings;
            }
            _ => {
                let stored = estimate(rg.byte_size);
                input.stored_bytes += stored;
                input.string_stored_bytes += string_share(stored);
            }
        }
    }
    input
}

/// The min/max of a partition's row groups, for DataFusion's pruning.
struct RowGroupBounds<'a> {
    groups: &'a [RowGroupStats],
    schema: &'a Schema,
}

impl RowGroupBounds<'_> {
    fn bounds(
        &self,
        column: &datafusion::common::Column,
        pick: fn(&ColumnStats) -> Option<&String>,
    ) -> Option<arrow::array::ArrayRef> {
        let data_type = self.schema.field_with_name(&column.name).ok()?.data_type();
        let unknown = ScalarValue::try_from(data_type).ok()?;
        let values = self.groups.iter().map(|rg| {
            rg.columns
                .iter()
                .find(|c| c.column == column.name)
                .and_then(pick)
                .and_then(|text| ScalarValue::try_from_string(text.clone(), data_type).ok())
                .unwrap_or_else(|| unknown.clone())
        });
        ScalarValue::iter_to_array(values).ok()
    }
}

impl PruningStatistics for RowGroupBounds<'_> {
    fn min_values(&self, column: &datafusion::common::Column) -> Option<arrow::array::ArrayRef> {
        self.bounds(column, |c| c.min.as_ref())
    }

    fn max_values(&self, column: &datafusion::common::Column) -> Option<arrow::array::ArrayRef> {
        self.bounds(column, |c| c.max.as_ref())
    }

    fn num_containers(&self) -> usize {
        self.groups.len()
    }

    fn null_counts(&self, _column: &datafusion::common::Column) -> Option<arrow::array::ArrayRef> {
        None
    }

    fn row_counts(&self) -> Option<arrow::array::ArrayRef> {
        None
    }

    fn contained(
        &self,
        _column: &datafusion::common::Column,
        _values: &std::collections::HashSet<ScalarValue>,
    ) -> Option<arrow::array::BooleanArray> {
        None
    }
}

/// Marks a stage the placement rule pulled to the host, with what it
/// predicted; rows pass through unchanged.
#[derive(Debug)]
pub struct PlacementExec {
    input: Arc<dyn ExecutionPlan>,
    choice: Arc<PlacementChoice>,
    /// The table the pulled stage reads.
    table: String,
}

impl PlacementExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        choice: Arc<PlacementChoice>,
        table: impl Into<String>,
    ) -> Self {
        Self {
            input,
            choice,
            table: table.into(),
        }
    }

    pub fn choice(&self) -> &PlacementChoice {
        &self.choice
    }
}

impl DisplayAs for PlacementExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PlacementExec: {}", self.choice)
    }
}

impl ExecutionPlan for PlacementExec {
    fn name(&self) -> &str {
        "PlacementExec"
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(
            &Arc<dyn PhysicalExpr>,
        ) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.pop() {
            Some(input) if children.is_empty() => Ok(Arc::new(Self::new(
                input,
                Arc::clone(&self.choice),
                self.table.clone(),
            ))),
            _ => datafusion::common::internal_err!("PlacementExec has one child"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<datafusion::execution::TaskContext>,
    ) -> Result<datafusion::execution::SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(input_stats
            .first()
            .cloned()
            .unwrap_or_else(|| Arc::new(Statistics::new_unknown(&self.schema()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_model::Prediction;
    use insitu_wire::LayoutKind;

    fn descriptor(recorded: bool) -> FormatDescriptor {
        let column = |name: &str, bytes: u64| ColumnStats {
            column: name.into(),
            min: None,
            max: None,
            null_count: None,
            compressed_bytes: recorded.then_some(bytes),
        };
        FormatDescriptor {
            version: insitu_wire::DESCRIPTOR_VERSION,
            table: "t".into(),
            partition: 0,
            file: "t/0.parquet".into(),
            layout: LayoutKind::Parquet,
            fields: vec![],
            row_count: 10,
            byte_size: 1200,
            crc32: 0,
            row_groups: vec![RowGroupStats {
                row_count: 10,
                byte_size: 1200,
                columns: vec![column("a", 100), column("s", 1000)],
            }],
            hybrid: None,
            partitioning: None,
        }
    }

    fn schema() -> Schema {
        Schema::new(vec![
            arrow::datatypes::Field::new("a", DataType::Int64, false),
            arrow::datatypes::Field::new("s", DataType::Utf8, false),
        ])
    }

    fn stored(d: &FormatDescriptor, names: &[&str], pruning: Option<&PruningPredicate>) -> u64 {
        scanned(d, names, &schema(), pruning).stored_bytes
    }

    #[test]
    fn results_compress_as_their_columns_recorded_weighted_by_width() {
        let mut d = descriptor(true);
        let field = |name: &str, lz4_ratio| insitu_wire::FieldFormat {
            name: name.into(),
            arrow_type: "Int64".into(),
            width_bytes: Some(8),
            nullable: false,
            byte_order: "little".into(),
            encodings: vec![],
            ipc_compression: Some(IpcCompression {
                lz4_ratio,
                zstd_ratio: lz4_ratio / 2.0,
            }),
        };
        d.fields = vec![field("a", 0.2)];
        // a: 8 bytes at 0.2; s: 32 bytes, nothing recorded, assumed 0.4.
        let r = result_ratios(&schema(), &[&d]);
        let lz4 = (8.0 * 0.2 + 32.0 * LZ4_RESULT_RATIO_ASSUMED) / 40.0;
        let zstd = (8.0 * 0.1 + 32.0 * ZSTD_RESULT_RATIO_ASSUMED) / 40.0;
        assert!((r.lz4_ratio - lz4).abs() < 1e-12, "{r:?}");
        assert!((r.zstd_ratio - zstd).abs() < 1e-12, "{r:?}");
        d.fields.push(field("s", 0.5));
        let r = result_ratios(&schema(), &[&d]);
        assert!((r.lz4_ratio - (8.0 * 0.2 + 32.0 * 0.5) / 40.0).abs() < 1e-12);
    }

    #[test]
    fn stored_bytes_come_from_column_chunks_or_widths() {
        assert_eq!(stored(&descriptor(true), &["a"], None), 100);
        assert_eq!(stored(&descriptor(true), &["a", "s"], None), 1100);
        // 8 of 8 + 32 bytes wide: a fifth of the row group.
        assert_eq!(stored(&descriptor(false), &["a"], None), 240);
    }

    #[test]
    fn row_groups_the_predicate_rules_out_are_not_counted() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{lit, BinaryExpr};
        let mut d = descriptor(true);
        d.row_groups.push(d.row_groups[0].clone());
        for (rg, (min, max)) in d.row_groups.iter_mut().zip([(0, 9), (10, 19)]) {
            rg.columns[0].min = Some(min.to_string());
            rg.columns[0].max = Some(max.to_string());
        }
        let a_below = |n: i64| {
            let a: Arc<dyn PhysicalExpr> = Arc::new(Column::new("a", 0));
            let e: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(a, Operator::Lt, lit(n)));
            PruningPredicateBuilder::new()
                .with_file_schema(Arc::new(schema()))
                .try_build(e)
                .unwrap()
        };
        let input = scanned(&d, &["a"], &schema(), Some(&a_below(5)));
        assert_eq!((input.rows, input.stored_bytes), (10, 100));
        let input = scanned(&d, &["a"], &schema(), Some(&a_below(15)));
        assert_eq!((input.rows, input.stored_bytes), (20, 200));
        let input = scanned(&d, &["a"], &schema(), Some(&a_below(0)));
        assert_eq!((input.rows, input.stored_bytes), (0, 0));
    }

    #[test]
    fn a_choice_prints_every_candidate() {
        let p = |placement, total_secs, result_bytes_ratio, codec| Prediction {
            placement,
            device_secs: 0.0,
            link_secs: 0.0,
            host_secs: 0.0,
            link_bytes: 1e6 * result_bytes_ratio,
            result_bytes_ratio,
            codec,
            total_secs,
        };
        let host = HostProfile {
            version: PROFILE_VERSION,
            threads: 1,
            rates: insitu_calibrate::compute_rates(),
            source: "test".into(),
            stage_starts: Default::default(),
        };
        let mut choice = PlacementChoice {
            chosen: Placement::Pull,
            codec: ResultCodec::None,
            candidates: vec![
                p(Placement::Pull, 0.0042, 1.0, ResultCodec::None),
                p(Placement::Push, 0.25, 1.0, ResultCodec::None),
                p(Placement::Push, 0.12, 0.4, ResultCodec::Lz4Frame),
                p(Placement::Push, 0.15, 0.3, ResultCodec::Zstd),
            ],
            shape: StageShape {
                devices: vec![],
                fixed_columns: 0,
                string_columns: 0,
                filter: false,
                selectivity: 1.0,
                scan_row_bytes: 0.0,
                aggregate: false,
                groups: 0,
                aggregates: 0,
                sort: false,
                rows_out: 0,
                out_row_bytes: 0.0,
                result_bytes_ratio: 1.0,
                result_codec: ResultCodec::None,
            },
            machine: Machine {
                devices: vec![],
                host,
                link_bytes_per_sec: None,
                shared_cores: None,
                starts: None,
            },
        };
        assert_eq!(
            choice.to_string(),
            "placement=pull (predicted pull: 4.20 ms, 1000000 link bytes, \
             push: 250 ms, 1000000 link bytes, push lz4: 120 ms, 400000 link bytes, \
             push zstd: 150 ms, 300000 link bytes)"
        );
        assert_eq!(choice.chosen_secs(), 0.0042);
        choice.chosen = Placement::Push;
        choice.codec = ResultCodec::Lz4Frame;
        assert!(choice
            .to_string()
            .starts_with("placement=push, results=lz4 (predicted"));
        assert_eq!(choice.chosen_secs(), 0.12);
    }
}
