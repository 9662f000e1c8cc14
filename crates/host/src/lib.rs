//! The host: a DataFusion session extended with insitu tables.
//!
//! [`InsituHost`] discovers tables from device manifests, registers one
//! [`InsituTable`] per table, and adds the [`FoldIntoStages`] optimizer rule
//! so that partial aggregates, filters and projections run on the devices.
//! With [`Pushdown::Off`] it instead reads device files through the link
//! ([`PullStore`]) and does all the work itself (the in-host baseline).
//! Host operators share one memory budget ([`HostMemory`]) and spill
//! under the host's spill directory; [`JoinStrategy`] makes joins whose
//! build side would not fit sort-merge joins, which spill.

pub mod budget;
pub mod catalog;
pub mod copartition;
pub mod join;
pub mod memory;
pub mod merge;
pub mod options;
pub mod placement;
mod placement_choice;
mod provider;
pub mod pull;
pub mod reorder;
pub mod result_decoder;
pub mod result_filter;
pub mod rule;
pub mod scan;
pub mod semijoin;
pub mod starts;
pub mod statistics;
pub mod stats;
pub mod views;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::config::ConfigNonZeroUsize;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::SessionStateBuilder;
use datafusion::optimizer::{Optimizer, OptimizerRule};
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use insitu_link::LinkCounters;

pub use catalog::{discover_tables, DeviceShare, TableInfo};
pub use insitu_client::{DeviceClient, DeviceMessage};
pub use join::JoinStrategy;
pub use memory::HostMemory;
pub use options::{InsituOptions, JoinChoice};
pub use placement::{ChoosePlacement, PlacementChoice, PlacementExec, StagePlacement};
pub use provider::{InsituTable, Pushdown};
pub use pull::{PullStore, PULL_STORE_URL};
pub use rule::FoldIntoStages;
pub use scan::DeviceScanExec;
pub use stats::{QueryStats, StageStatsSink};

/// Host settings.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub pushdown: Pushdown,
    /// Host threads used by DataFusion for what stays on the host.
    pub target_partitions: usize,
    /// The memory the host's query operators may reserve, all queries
    /// together (`host_mem_bytes_max`); past it they spill or fail.
    pub mem_bytes_max: usize,
    /// Where host operators spill (a directory of this process's own is
    /// made inside it).
    pub spill_root: PathBuf,
    /// How equi-joins run (`insitu.join_strategy`).
    pub join_strategy: JoinChoice,
    /// How fast the host computes, for the placement of auto scans;
    /// measured when the session starts if `None`.
    pub profile: Option<insitu_wire::HostProfile>,
    /// Where the profile is kept, to save stage starts measured when the
    /// session starts; `None` keeps them for this session only.
    pub profile_path: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            pushdown: Pushdown::Auto,
            target_partitions: std::thread::available_parallelism().map_or(2, |n| n.get()),
            mem_bytes_max: budget::HOST_MEM_BYTES_DEFAULT,
            spill_root: std::env::temp_dir().join("insitu-spill"),
            join_strategy: JoinChoice::Auto,
            profile: None,
            profile_path: None,
        }
    }
}

/// Names one query in host and device logs; travels in every stage plan
/// envelope the query sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryId(pub String);

impl QueryId {
    /// A new id, unique within this process and unlikely to repeat across
    /// processes (time-seeded prefix).
    pub fn next() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::OnceLock;
        static PREFIX: OnceLock<u32> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let prefix = PREFIX.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            ((nanos ^ (std::process::id() as u64) << 20) % 0xFFFF_FFFF) as u32
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self(format!("{prefix:08x}-{n}"))
    }
}

impl std::fmt::Display for QueryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A query's result and what it cost.
#[derive(Debug)]
pub struct QueryOutcome {
    pub batches: Vec<RecordBatch>,
    pub schema: arrow::datatypes::SchemaRef,
    pub stats: QueryStats,
}

/// Bytes a repartition writes to one spill file before it starts the next
/// (`repartition_spill_file_bytes_max`): 1, a file per spilled batch.
pub const REPARTITION_SPILL_FILE_BYTES_MAX: usize = 1;

/// A SQL session over a set of devices.
pub struct InsituHost {
    ctx: SessionContext,
    clients: Vec<Arc<dyn DeviceClient>>,
    tables: BTreeMap<String, TableInfo>,
    memory: HostMemory,
    config: HostConfig,
}

/// DataFusion's physical optimizer rules with insitu's: the join strategy
/// right after join selection (before distribution and sorts are
/// enforced, which a sort-merge join needs), the fold into stages, then
/// the string view rules ([`views`]) last.
fn physical_rules(placement: ChoosePlacement) -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = PhysicalOptimizer::new().rules;
    let after = rules
        .iter()
        .position(|r| r.name() == "join_selection")
        .map_or(0, |i| i + 1);
    rules.insert(after, Arc::new(JoinStrategy));
    rules.push(Arc::new(FoldIntoStages));
    rules.push(Arc::new(placement));
    rules.push(Arc::new(views::ShrinkJoinViews));
    rules.push(Arc::new(views::SortPlainStrings));
    rules
}

/// DataFusion's logical rules and insitu's: semi joins moved down, inner
/// joins reordered (see [`reorder::with_reordering`]).
fn logical_rules() -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    let mut rules = Optimizer::new().rules;
    rules.push(Arc::new(semijoin::PushSemiJoinDown));
    reorder::with_reordering(rules, reorder::ReorderJoins::for_insitu_tables())
}

impl InsituHost {
    /// A session over `clients`' tables. With `auto` pushdown, stage
    /// starts not yet in the host profile for the clients' link are
    /// measured first ([`starts`]) and saved to `config.profile_path`
    /// when it is set.
    pub async fn new(clients: Vec<Arc<dyn DeviceClient>>, mut config: HostConfig) -> Result<Self> {
        let tables = discover_tables(&clients).await?;
        let threads = config.target_partitions.max(1) as u32;
        let mut profile = match config.profile.take() {
            Some(p) => p,
            None => insitu_calibrate::measure_host_profile(threads),
        };
        // Only auto places scans by their predicted times; `on` and `off`
        // sessions start no probe stages on the devices.
        let auto = config.pushdown == Pushdown::Auto;
        if let Some(link) = clients
            .first()
            .map(|c| starts::link_key(&c.link().profile()))
        {
            if auto && !profile.stage_starts.contains_key(&link) {
                Self::measure_starts(&clients, &tables, &config, &mut profile, &link).await;
            }
        }
        Self::assemble(clients, tables, config, profile, None)
    }

    /// Adds the stage starts over `link` to `profile`, saved where the
    /// config says; a failed measurement leaves the profile's rates to
    /// price starts, with a warning.
    async fn measure_starts(
        clients: &[Arc<dyn DeviceClient>],
        tables: &BTreeMap<String, TableInfo>,
        config: &HostConfig,
        profile: &mut insitu_wire::HostProfile,
        link: &str,
    ) {
        let limit = std::time::Duration::from_secs(starts::START_PROBE_SECS_MAX);
        let measured = tokio::time::timeout(
            limit,
            starts::measure(clients, tables, config, profile, link),
        )
        .await;
        let starts = match measured {
            Ok(Ok(starts)) => starts,
            Ok(Err(e)) => {
                tracing::warn!("stage starts over {link} not measured: {e}");
                return;
            }
            Err(_) => {
                tracing::warn!(
                    "stage starts over {link} not measured within {} s",
                    starts::START_PROBE_SECS_MAX
                );
                return;
            }
        };
        tracing::info!(link, ?starts, "measured stage starts");
        profile.stage_starts.insert(link.to_string(), starts);
        if let Some(path) = &config.profile_path {
            if let Err(e) = insitu_calibrate::save(path, &profile.to_json()) {
                tracing::warn!("{e}");
            }
        }
    }

    /// The session over `tables` with `profile`; `forced` places every
    /// auto scan so (for [`starts`]).
    fn assemble(
        clients: Vec<Arc<dyn DeviceClient>>,
        tables: BTreeMap<String, TableInfo>,
        mut config: HostConfig,
        profile: insitu_wire::HostProfile,
        forced: Option<insitu_model::Placement>,
    ) -> Result<Self> {
        let stage_stats = Arc::new(StageStatsSink::default());
        let mut session = SessionConfig::new()
            .with_target_partitions(config.target_partitions.max(1))
            .with_batch_size(memory::batch_rows_for(config.mem_bytes_max))
            .with_information_schema(true);
        let options = InsituOptions {
            join_strategy: config.join_strategy,
            host_mem_bytes_max: config.mem_bytes_max,
            ..Default::default()
        };
        session.options_mut().extensions.insert(options);
        // What each sort sets aside to merge its spilled runs; DataFusion's
        // 10 MiB each would hold most of a small budget in a plan of many sorts.
        session.options_mut().execution.sort_spill_reservation_bytes =
            memory::sort_merge_reservation_bytes(config.mem_bytes_max);
        // One spill file per batch a repartition spills. With files shared
        // by its input tasks, DataFusion 55.2's repartition can wait forever
        // for a batch written to a newer file (apache/datafusion#24883; Q18
        // at SF 0.1 in 10 MiB hung in about 1 of 45 runs); a file finished
        // right after its one batch never holds the reader back.
        session.options_mut().execution.max_spill_file_size_bytes =
            ConfigNonZeroUsize::try_new(REPARTITION_SPILL_FILE_BYTES_MAX)?;
        let memory = HostMemory::new(config.mem_bytes_max, &config.spill_root)?;
        let mut placement = ChoosePlacement::new(profile.clone());
        if let Some(p) = forced {
            placement = placement.forcing(p);
        }
        config.profile = Some(profile);
        let runtime = memory.runtime()?;
        let url = url::Url::parse(PULL_STORE_URL).expect("pull store url");
        runtime.register_object_store(&url, Arc::new(PullStore::new(tables.values())));
        let state = SessionStateBuilder::new()
            .with_config(session)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_optimizer_rules(logical_rules())
            .with_physical_optimizer_rules(physical_rules(placement))
            .build();
        let ctx = SessionContext::new_with_state(state);
        for info in tables.values() {
            let table = InsituTable::new(info.clone(), config.pushdown, Arc::clone(&stage_stats));
            ctx.register_table(info.name.as_str(), Arc::new(table))?;
        }
        Ok(Self {
            ctx,
            clients,
            tables,
            memory,
            config,
        })
    }

    /// The host's memory budget and spill directory.
    pub fn memory(&self) -> &HostMemory {
        &self.memory
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Whether tables `left` and `right` are co-partitioned for an
    /// equi-join on `on` (pairs of left and right key columns): every pair
    /// of rows the join can match lies on one device
    /// ([`copartition`]). `false` for an unknown table.
    pub fn co_partitioned(&self, left: &str, right: &str, on: &[(&str, &str)]) -> bool {
        let map = |t: &str| self.tables.get(t).and_then(copartition::PartitionMap::of);
        match (map(left), map(right)) {
            (Some(l), Some(r)) => copartition::co_partitioned(&l, &r, on),
            _ => false,
        }
    }

    pub fn tables(&self) -> &BTreeMap<String, TableInfo> {
        &self.tables
    }

    pub fn clients(&self) -> &[Arc<dyn DeviceClient>] {
        &self.clients
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    fn link_totals(&self) -> LinkCounters {
        self.clients.iter().fold(LinkCounters::default(), |acc, c| {
            let n = c.link().counters();
            LinkCounters {
                bytes_to_device: acc.bytes_to_device + n.bytes_to_device,
                bytes_to_host: acc.bytes_to_host + n.bytes_to_host,
                messages: acc.messages + n.messages,
            }
        })
    }

    fn storage_totals(&self) -> u64 {
        self.clients.iter().map(|c| c.storage_bytes_read()).sum()
    }

    /// Runs one SQL statement (or several separated by `;`, returning the
    /// last one's result) and measures it. A statement whose hash join
    /// runs out of the host budget runs once more with sort-merge joins,
    /// which spill (see [`JoinStrategy`]).
    pub async fn sql(&self, sql: &str) -> Result<QueryOutcome> {
        let started = Instant::now();
        let link_before = self.link_totals();
        let storage_before = self.storage_totals();
        let query_id = QueryId::next();
        let query = QueryMemory {
            id: query_id.clone(),
            pool: self.memory.query_pool(),
            stages: Arc::new(StageStatsSink::default()),
        };
        tracing::info!(query = %query_id, sql = %sql.trim(), "query started");
        let statements = split_statements(sql);
        if statements.is_empty() {
            return Err(DataFusionError::Plan("no SQL statement given".into()));
        }
        let mut last = None;
        let mut replanned = None;
        for statement in statements {
            let mut outcome = self.run_statement(statement, &query, None).await;
            if let Some(reason) = outcome.as_ref().err().and_then(|e| self.replan_reason(e)) {
                tracing::info!(query = %query_id, "{reason}; planning again with sort-merge joins");
                replanned = Some(reason);
                outcome = self
                    .run_statement(statement, &query, Some(JoinChoice::SortMerge))
                    .await;
            }
            match outcome {
                Ok(result) => last = Some(result),
                Err(e) => {
                    tracing::info!(query = %query_id, "query failed: {e}");
                    return Err(self.with_memory_hint(e));
                }
            }
        }
        let Some(mut last) = last else {
            return Err(DataFusionError::Plan("no SQL statement given".into()));
        };
        let link = self.link_totals().since(&link_before);
        let stages = query.stages.snapshot();
        let stats = QueryStats {
            device_rows_read: stages.rows_read,
            device_bytes_read: self.storage_totals() - storage_before,
            link_bytes_to_device: link.bytes_to_device,
            link_bytes_to_host: link.bytes_to_host,
            link_messages: link.messages,
            wall_secs: started.elapsed().as_secs_f64(),
            result_rows: last.batches.iter().map(|b| b.num_rows() as u64).sum(),
            host_mem_peak_bytes: query.pool.peak() as u64,
            host_mem_bytes_max: self.memory.budget() as u64,
            device_mem_peak_bytes: query.stages.device_mem_peaks(),
            device_spilled_bytes: stages.spilled_bytes,
            host_spilled_bytes: last.host_spilled_bytes,
            replanned,
            placements: std::mem::take(&mut last.placements),
        };
        if last.analyzed {
            last.batches.push(memory_report(&last.schema, &stats)?);
        }
        tracing::info!(
            query = %query_id,
            rows = stats.result_rows,
            secs = stats.wall_secs,
            link_bytes = stats.link_bytes(),
            host_mem_peak = stats.host_mem_peak_bytes,
            "query finished"
        );
        Ok(QueryOutcome {
            batches: last.batches,
            schema: last.schema,
            stats,
        })
    }

    /// Plans `sql`'s last statement (running the `SET`s before it) and
    /// runs each of its placed stages on its own, timed: the model's
    /// predictions are for stages alone
    /// ([`placement::time_stages_alone`]).
    pub async fn time_stages(&self, sql: &str) -> Result<Vec<StagePlacement>> {
        let statements = split_statements(sql);
        let Some((last, sets)) = statements.split_last() else {
            return Err(DataFusionError::Plan("no SQL statement given".into()));
        };
        for set in sets.iter().filter(|s| is_set_statement(s)) {
            self.ctx.sql(set).await?.collect().await?;
        }
        let query = QueryMemory {
            id: QueryId::next(),
            pool: self.memory.query_pool(),
            stages: Arc::new(StageStatsSink::default()),
        };
        let ctx = self.query_context(&query, None);
        let plan = ctx.sql(last).await?.create_physical_plan().await?;
        placement::time_stages_alone(&plan, ctx.task_ctx()).await
    }

    /// Plans and runs one statement within `query`'s memory; `joins`
    /// overrides the session's join strategy. `SET` statements change
    /// the session itself, so they last beyond the query.
    async fn run_statement(
        &self,
        statement: &str,
        query: &QueryMemory,
        joins: Option<JoinChoice>,
    ) -> Result<StatementResult> {
        if is_set_statement(statement) {
            let df = self.ctx.sql(statement).await?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            return Ok(StatementResult::plain(schema, batches));
        }
        let ctx = self.query_context(query, joins);
        let df = ctx.sql(statement).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let plan = df.create_physical_plan().await?;
        let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        Ok(StatementResult {
            schema,
            batches,
            host_spilled_bytes: spilled_bytes(&plan),
            analyzed: plan.name() == "AnalyzeExec",
            placements: placement::placements(&plan),
        })
    }

    /// A session for one query: its memory view, its stage statistics
    /// and id (which travel to the device scans), and its join strategy.
    fn query_context(&self, query: &QueryMemory, joins: Option<JoinChoice>) -> SessionContext {
        let mut runtime = RuntimeEnv::clone(self.ctx.runtime_env().as_ref());
        runtime.memory_pool = Arc::clone(&query.pool) as _;
        let mut state = SessionStateBuilder::new_from_existing(self.ctx.state())
            .with_runtime_env(Arc::new(runtime))
            .build();
        let config = state.config_mut();
        config.set_extension(Arc::new(query.id.clone()));
        config.set_extension(Arc::clone(&query.stages));
        if let Some(choice) = joins {
            if let Some(o) = config.options_mut().extensions.get_mut::<InsituOptions>() {
                o.join_strategy = choice;
            }
        }
        SessionContext::new_with_state(state)
    }

    /// Why a failed statement should run again with sort-merge joins: a
    /// hash join's build side ran out of the host budget while the join
    /// strategy is `auto`.
    fn replan_reason(&self, e: &DataFusionError) -> Option<String> {
        let text = e.to_string();
        let host_join = memory::is_out_of_memory(e)
            && text.contains(memory::HOST_BUDGET_LABEL)
            && text.contains("allocation failed for HashJoinInput");
        let auto = self
            .ctx
            .state()
            .config()
            .options()
            .extensions
            .get::<InsituOptions>()
            .is_some_and(|o| o.join_strategy == JoinChoice::Auto);
        (host_join && auto).then(|| {
            format!(
                "a hash join's build side outgrew the host budget of {}",
                insitu_wire::units::human_bytes(self.memory.budget() as u64)
            )
        })
    }

    /// Says which budget ran out, for which operator, and what to do.
    fn with_memory_hint(&self, e: DataFusionError) -> DataFusionError {
        if !memory::is_out_of_memory(&e) {
            return e;
        }
        let root = e.find_root().to_string();
        if !root.contains(memory::HOST_BUDGET_LABEL) {
            let hint = "a device needs more memory than its budget: raise the device's --mem";
            return DataFusionError::ResourcesExhausted(format!("{hint}. {root}"));
        }
        let what = memory::refused_reservation(&root).map_or_else(String::new, |(op, size)| {
            format!(": {op} could not reserve {size} more")
        });
        DataFusionError::ResourcesExhausted(format!(
            "the host memory budget of {} is too small for this query{what}; raise --host-mem \
             (or host_mem in the root or cluster config). Operators holding the most:\n{}",
            insitu_wire::units::human_bytes(self.memory.budget() as u64),
            memory::top_consumers(&root),
        ))
    }
}

/// One query's memory view and stage statistics, shared by its statements.
struct QueryMemory {
    id: QueryId,
    pool: Arc<insitu_stage::MeteredPool>,
    stages: Arc<StageStatsSink>,
}

/// What one statement returned.
struct StatementResult {
    schema: arrow::datatypes::SchemaRef,
    batches: Vec<RecordBatch>,
    host_spilled_bytes: u64,
    /// An EXPLAIN ANALYZE, whose result gets a memory line.
    analyzed: bool,
    placements: Vec<StagePlacement>,
}

impl StatementResult {
    fn plain(schema: arrow::datatypes::SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            schema,
            batches,
            host_spilled_bytes: 0,
            analyzed: false,
            placements: vec![],
        }
    }
}

fn is_set_statement(statement: &str) -> bool {
    let words: Vec<String> = statement
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .flat_map(|l| l.split_whitespace())
        .take(1)
        .map(|w| w.to_ascii_lowercase())
        .collect();
    words.first().is_some_and(|w| w == "set")
}

/// Bytes the operators of an executed plan spilled.
fn spilled_bytes(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    let mut sum = 0u64;
    let _ = plan.apply(|node| {
        if let Some(m) = node.metrics() {
            sum += m.spilled_bytes().unwrap_or(0) as u64;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    sum
}

/// EXPLAIN ANALYZE's extra row: the host's and each device's memory peak.
fn memory_report(schema: &arrow::datatypes::SchemaRef, stats: &QueryStats) -> Result<RecordBatch> {
    let text = stats.memory_summary();
    let columns = schema
        .fields()
        .iter()
        .zip(["Memory", text.as_str()])
        .map(|(field, value)| {
            let array: arrow::array::ArrayRef =
                Arc::new(arrow::array::StringArray::from(vec![value]));
            arrow::compute::cast(&array, field.data_type()).map_err(DataFusionError::from)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Splits a script on `;` outside quotes and comments, dropping empty parts.
pub fn split_statements(sql: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quote, mut comment) = (0usize, None::<u8>, false);
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if comment {
            comment = b != b'\n';
        } else if let Some(q) = quote {
            if b == q {
                quote = None;
            }
        } else if b == b'\'' || b == b'"' {
            quote = Some(b);
        } else if b == b'-' && bytes.get(i + 1) == Some(&b'-') {
            comment = true;
        } else if b == b';' {
            parts.push(&sql[start..i]);
            start = i + 1;
        }
        i += 1;
    }
    parts.push(&sql[start..]);
    parts
        .into_iter()
        .filter(|s| {
            s.lines()
                .map(|l| l.split("--").next().unwrap_or("").trim())
                .any(|l| !l.is_empty())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_statements;

    #[test]
    fn splits_statements_outside_quotes_and_comments() {
        let s = "create view v as select ';' as x; -- a; comment\nselect * from v;\n";
        let parts = split_statements(s);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert!(parts[0].contains("';'"));
        assert!(
            parts[1].trim_start().starts_with("-- a; comment")
                || parts[1].contains("select * from v")
        );
        assert!(split_statements("  ;  -- nothing\n").is_empty());
    }
}
