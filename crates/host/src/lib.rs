//! The host: a DataFusion session extended with insitu tables.
//!
//! [`InsituHost`] discovers tables from device manifests, registers one
//! [`InsituTable`] per table, and adds the [`FoldIntoStages`] optimizer rule
//! so that partial aggregates, filters and projections run on the devices.
//! With [`Pushdown::Off`] it instead reads device files through the link
//! ([`PullStore`]) and does all the work itself (the in-host baseline).

pub mod catalog;
pub mod client;
pub mod decode;
pub mod merge;
pub mod provider;
pub mod pull;
pub mod rule;
pub mod scan;
pub mod stats;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use insitu_link::LinkCounters;

pub use catalog::{discover_tables, DeviceShare, TableInfo};
pub use client::{embedded_clients, DeviceClient, EmbeddedClient};
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
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            pushdown: Pushdown::On,
            target_partitions: std::thread::available_parallelism().map_or(2, |n| n.get()),
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

/// A SQL session over a set of devices.
pub struct InsituHost {
    ctx: SessionContext,
    clients: Vec<Arc<dyn DeviceClient>>,
    tables: BTreeMap<String, TableInfo>,
    stage_stats: Arc<StageStatsSink>,
    config: HostConfig,
}

impl InsituHost {
    pub async fn new(clients: Vec<Arc<dyn DeviceClient>>, config: HostConfig) -> Result<Self> {
        let tables = discover_tables(&clients).await?;
        let stage_stats = Arc::new(StageStatsSink::default());
        let session = SessionConfig::new()
            .with_target_partitions(config.target_partitions.max(1))
            .with_information_schema(true);
        let runtime = RuntimeEnvBuilder::new().build_arc()?;
        let url = url::Url::parse(PULL_STORE_URL).expect("pull store url");
        runtime.register_object_store(&url, Arc::new(PullStore::new(tables.values())));
        let state = SessionStateBuilder::new()
            .with_config(session)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(FoldIntoStages))
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
            stage_stats,
            config,
        })
    }

    pub fn context(&self) -> &SessionContext {
        &self.ctx
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
    /// last one's result) and measures it.
    pub async fn sql(&self, sql: &str) -> Result<QueryOutcome> {
        let started = Instant::now();
        let link_before = self.link_totals();
        let storage_before = self.storage_totals();
        let stages_before = self.stage_stats.snapshot();
        let query_id = QueryId::next();
        // A context per query carries its id down to the device scans.
        let mut state = self.ctx.state();
        state.config_mut().set_extension(Arc::new(query_id.clone()));
        let ctx = SessionContext::new_with_state(state);
        tracing::info!(query = %query_id, sql = %sql.trim(), "query started");
        let mut last = None;
        for statement in split_statements(sql) {
            let run = async {
                let df = ctx.sql(statement).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                let batches = df.collect().await?;
                Ok::<_, datafusion::error::DataFusionError>((schema, batches))
            };
            match run.await {
                Ok(result) => last = Some(result),
                Err(e) => {
                    tracing::warn!(query = %query_id, "query failed: {e}");
                    return Err(e);
                }
            }
        }
        let Some((schema, batches)) = last else {
            return Err(datafusion::error::DataFusionError::Plan(
                "no SQL statement given".into(),
            ));
        };
        let link = self.link_totals().since(&link_before);
        let stages = self.stage_stats.snapshot();
        let stats = QueryStats {
            device_rows_read: stages.rows_read - stages_before.rows_read,
            device_bytes_read: self.storage_totals() - storage_before,
            link_bytes_to_device: link.bytes_to_device,
            link_bytes_to_host: link.bytes_to_host,
            link_messages: link.messages,
            wall_secs: started.elapsed().as_secs_f64(),
            result_rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
        };
        tracing::info!(
            query = %query_id,
            rows = stats.result_rows,
            secs = stats.wall_secs,
            link_bytes = stats.link_bytes(),
            "query finished"
        );
        Ok(QueryOutcome {
            batches,
            schema,
            stats,
        })
    }
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
