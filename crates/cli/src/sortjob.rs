//! `insitu sort`: sorts a whole table into a new, range-partitioned table.
//!
//! ```text
//!   1. sample   every device samples its sort keys      -> host picks D-1 splitters
//!   2. shuffle  devices scan T; the host routes each row to the device
//!               of its key range (staging table on that device)
//!   3. sort     every device sorts its staging rows with the kernels and
//!               writes them as partitions of T2 (each published atomically)
//!   4. clean    staging tables dropped; on failure T2 is dropped too
//! ```
//!
//! Device i holds the i-th key range and its partitions are numbered after
//! device i-1's, so reading T2 in partition order is globally sorted.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch, SortColumn, SortOptions};
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::row::{RowConverter, Rows, SortField};
use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use insitu_format::WriterOptions;
use insitu_host::DeviceClient;
use insitu_ingest::PartitionSink;
use insitu_kernels::{argsort_columns, Parallelism};
use insitu_link::LinkProfile;
use insitu_wire::{SampleKeysRequest, SortKey, SortTableRequest};

use crate::session::{connect_cluster, Target};
use crate::units::human_bytes;
use crate::{DeviceArgs, LayoutArg};

/// Key rows sampled over all devices to pick splitters (`sample_rows`).
const SAMPLE_ROWS: u64 = 100_000;
/// Batches in flight to each staging writer.
const BATCHES_IN_FLIGHT: usize = 4;

#[derive(Args, Debug)]
pub struct SortArgs {
    /// The table to sort.
    #[arg(long)]
    pub table: String,
    /// Sort key columns, comma-separated, most significant first.
    #[arg(long, value_delimiter = ',', required = true)]
    pub by: Vec<String>,
    /// Descending order (for every key column).
    #[arg(long)]
    pub desc: bool,
    /// Nulls before other values (default: after, ascending or not).
    #[arg(long)]
    pub nulls_first: bool,
    /// The new table; it must not exist.
    #[arg(long)]
    pub into: String,
    /// Layout of the new table; hybrid keys it on the sort columns.
    #[arg(long, value_enum, default_value_t = LayoutArg::Parquet)]
    pub layout: LayoutArg,
    /// Most rows per partition of the new table (0: one partition per device).
    #[arg(long, default_value_t = 0)]
    pub partition_rows: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// A device as the job uses it: to query and to write.
struct JobDevice {
    client: Arc<dyn DeviceClient>,
    sink: Arc<dyn PartitionSink>,
}

/// The devices of `target`, each one client that both reads and writes,
/// so the shuffle's bytes cross its link both ways, embedded as over Flight.
async fn job_devices(target: &Target) -> Result<Vec<JobDevice>, String> {
    fn both<C: DeviceClient + PartitionSink + 'static>(c: Arc<C>) -> JobDevice {
        JobDevice {
            client: Arc::clone(&c) as _,
            sink: c as _,
        }
    }
    Ok(match target {
        Target::Embedded(devices) => {
            insitu_device::embedded(devices.clone(), LinkProfile::UNLIMITED)
                .into_iter()
                .map(both)
                .collect()
        }
        Target::Cluster(path) => connect_cluster(path, None)
            .await?
            .into_iter()
            .map(both)
            .collect(),
    })
}

pub async fn run(a: SortArgs) -> Result<(), String> {
    check_name(&a.into)?;
    let target = Target::of(&a.device)?;
    let devices = job_devices(&target).await?;
    let clients: Vec<Arc<dyn DeviceClient>> =
        devices.iter().map(|d| Arc::clone(&d.client)).collect();
    let memory = crate::session::HostMemorySettings::of(&a.device, &target, &clients)?;
    let host = crate::session::host_with(clients, insitu_host::Pushdown::On, &memory).await?;
    let info = host
        .tables()
        .get(&a.table)
        .ok_or_else(|| format!("no table {} on these devices", a.table))?
        .clone();
    if host.tables().contains_key(&a.into) {
        return Err(format!(
            "table {} already exists; choose another name for the sorted table",
            a.into
        ));
    }
    if a.by.iter().any(|c| c.trim().is_empty()) {
        return Err(format!("--by {} has an empty column name", a.by.join(",")));
    }
    if let Some(twice) =
        a.by.iter()
            .enumerate()
            .find(|(i, c)| a.by[..*i].contains(c))
    {
        return Err(format!("--by names column {} twice", twice.1));
    }
    let keys: Vec<SortKey> =
        a.by.iter()
            .map(|c| {
                info.schema
                    .field_with_name(c)
                    .map_err(|_| format!("table {} has no column {c} to sort by", a.table))?;
                Ok(SortKey {
                    column: c.clone(),
                    descending: a.desc,
                    nulls_first: a.nulls_first,
                })
            })
            .collect::<Result<_, String>>()?;
    let job = SortJob {
        table: a.table.clone(),
        into: a.into.clone(),
        staging: format!("{}__staging", a.into),
        keys,
        schema: Arc::clone(&info.schema),
        total_rows: info.row_count(),
        hybrid: a.layout == LayoutArg::Hybrid,
        partition_rows: a.partition_rows,
        devices,
    };
    let started = Instant::now();
    let result = job.run(&host).await;
    job.drop_everywhere(&job.staging);
    if result.is_err() {
        job.drop_everywhere(&job.into);
    }
    let report = result?;
    eprintln!(
        "sorted {} rows of {} into {} ({} partitions on {} devices) in {:.2} s: \
         sample {:.2} s, shuffle {:.2} s, device sorts {:.2} s | link: {} to devices, {} to host",
        report.rows,
        a.table,
        a.into,
        report.partitions,
        job.devices.len(),
        started.elapsed().as_secs_f64(),
        report.sample_secs,
        report.shuffle_secs,
        report.sort_secs,
        human_bytes(report.link_to_devices),
        human_bytes(report.link_to_host),
    );
    Ok(())
}

fn check_name(table: &str) -> Result<(), String> {
    if table.is_empty() || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "table name '{table}' must be letters, digits and underscores"
        ));
    }
    Ok(())
}

struct SortJob {
    table: String,
    into: String,
    staging: String,
    keys: Vec<SortKey>,
    schema: SchemaRef,
    total_rows: u64,
    hybrid: bool,
    partition_rows: u64,
    devices: Vec<JobDevice>,
}

#[derive(Debug, Default)]
struct Report {
    rows: u64,
    partitions: usize,
    sample_secs: f64,
    shuffle_secs: f64,
    sort_secs: f64,
    link_to_devices: u64,
    link_to_host: u64,
}

impl SortJob {
    fn options(&self) -> Vec<SortOptions> {
        self.keys
            .iter()
            .map(|k| SortOptions {
                descending: k.descending,
                nulls_first: k.nulls_first,
            })
            .collect()
    }

    fn key_columns(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.column.clone()).collect()
    }

    async fn run(&self, host: &insitu_host::InsituHost) -> Result<Report, String> {
        let links_before = self.link_totals();
        let mut report = Report::default();
        let t = Instant::now();
        let splitters = self.splitters().await?;
        report.sample_secs = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let counts = self.shuffle(host, &splitters).await?;
        report.shuffle_secs = t.elapsed().as_secs_f64();
        report.rows = counts.iter().sum();

        let t = Instant::now();
        report.partitions = self.sort_ranges(&counts).await?;
        report.sort_secs = t.elapsed().as_secs_f64();
        let (to_devices, to_host) = self.link_totals();
        report.link_to_devices = to_devices - links_before.0;
        report.link_to_host = to_host - links_before.1;
        Ok(report)
    }

    fn link_totals(&self) -> (u64, u64) {
        self.devices.iter().fold((0, 0), |(d, h), dev| {
            let c = dev.client.link().counters();
            (d + c.bytes_to_device, h + c.bytes_to_host)
        })
    }

    /// Samples every device's keys and picks one splitter per range
    /// boundary: row-encoded keys, so comparing them is comparing in the
    /// sort's order (directions and null placement included).
    async fn splitters(&self) -> Result<Rows, String> {
        let converter = self.converter()?;
        let mut samples = vec![];
        for d in &self.devices {
            let manifest = d.client.manifest().await.map_err(|e| e.to_string())?;
            let rows: u64 = manifest
                .tables
                .get(&self.table)
                .map(|p| p.iter().map(|d| d.row_count).sum())
                .unwrap_or(0);
            if rows == 0 {
                continue;
            }
            let request = SampleKeysRequest {
                table: self.table.clone(),
                columns: self.key_columns(),
                rows: (SAMPLE_ROWS * rows).div_ceil(self.total_rows.max(1)).max(1),
            };
            samples.push(
                d.client
                    .sample_keys(&request)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let ranges = self.devices.len();
        let Some(first) = samples.first() else {
            return Ok(converter.empty_rows(0, 0));
        };
        let sample = concat_batches(&first.schema(), &samples).map_err(|e| e.to_string())?;
        let columns: Vec<SortColumn> = sample
            .columns()
            .iter()
            .zip(self.options())
            .map(|(values, options)| SortColumn {
                values: Arc::clone(values),
                options: Some(options),
            })
            .collect();
        let order: Vec<u32> =
            argsort_columns(&columns, None, Parallelism(1)).map_err(|e| e.to_string())?;
        let n = order.len();
        let picks = UInt32Array::from_iter_values((1..ranges).map(|i| order[i * n / ranges]));
        let chosen = take_record_batch(&sample, &picks).map_err(|e| e.to_string())?;
        converter
            .convert_columns(chosen.columns())
            .map_err(|e| e.to_string())
    }

    fn converter(&self) -> Result<RowConverter, String> {
        let fields = self
            .keys
            .iter()
            .zip(self.options())
            .map(|(k, options)| {
                let field = self
                    .schema
                    .field_with_name(&k.column)
                    .map_err(|e| e.to_string())?;
                Ok(SortField::new_with_options(
                    field.data_type().clone(),
                    options,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        RowConverter::new(fields).map_err(|e| e.to_string())
    }

    /// Streams the table out of the devices and each row into the staging
    /// table of the device owning its key range. Returns rows per device.
    async fn shuffle(
        &self,
        host: &insitu_host::InsituHost,
        splitters: &Rows,
    ) -> Result<Vec<u64>, String> {
        let bar = ProgressBar::new(self.total_rows);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>10} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows ({per_sec}, eta {eta})",
            )
            .expect("progress template"),
        );
        bar.set_message("shuffle");
        let sql = format!("SELECT * FROM \"{}\"", self.table);
        let mut stream = host
            .context()
            .sql(&sql)
            .await
            .map_err(|e| e.to_string())?
            .execute_stream()
            .await
            .map_err(|e| e.to_string())?;
        let converter = self.converter()?;
        let key_idx: Vec<usize> = self
            .keys
            .iter()
            .map(|k| self.schema.index_of(&k.column).expect("checked"))
            .collect();
        let mut counts = vec![0u64; self.devices.len()];
        let result = std::thread::scope(|scope| {
            let mut senders: Vec<SyncSender<Result<RecordBatch, ArrowError>>> = vec![];
            let mut writers = vec![];
            for (i, d) in self.devices.iter().enumerate() {
                let (tx, rx) = sync_channel(BATCHES_IN_FLIGHT);
                senders.push(tx);
                let (sink, schema, staging) =
                    (Arc::clone(&d.sink), Arc::clone(&self.schema), &self.staging);
                writers.push(scope.spawn(move || {
                    sink.write_partition(
                        staging,
                        i as u32,
                        schema,
                        &mut rx.into_iter(),
                        &WriterOptions::default(),
                    )
                }));
            }
            let handle = tokio::runtime::Handle::current();
            let route = (|| -> Result<(), String> {
                while let Some(batch) =
                    tokio::task::block_in_place(|| handle.block_on(stream.next()))
                {
                    let batch = batch.map_err(|e| e.to_string())?;
                    let keys: Vec<_> = key_idx
                        .iter()
                        .map(|&i| Arc::clone(batch.column(i)))
                        .collect();
                    let rows = converter
                        .convert_columns(&keys)
                        .map_err(|e| e.to_string())?;
                    let mut routes: Vec<Vec<u32>> = vec![vec![]; senders.len()];
                    for (r, row) in rows.iter().enumerate() {
                        routes[range_of(splitters, row)].push(r as u32);
                    }
                    for (i, idx) in routes.into_iter().enumerate() {
                        if idx.is_empty() {
                            continue;
                        }
                        counts[i] += idx.len() as u64;
                        let part = take_record_batch(&batch, &UInt32Array::from(idx))
                            .map_err(|e| e.to_string())?;
                        if senders[i].send(Ok(part)).is_err() {
                            return Err(format!("the staging writer of device {i} stopped"));
                        }
                    }
                    bar.inc(batch.num_rows() as u64);
                }
                Ok(())
            })();
            if let Err(e) = &route {
                for tx in &senders {
                    let _ = tx.send(Err(ArrowError::ExternalError(e.clone().into())));
                }
            }
            drop(senders);
            let written: Vec<_> = writers
                .into_iter()
                .map(|w| w.join().expect("staging writer panicked"))
                .collect();
            // A writer's own error explains a routing failure best.
            for w in written {
                w.map_err(|e| e.to_string())?;
            }
            route
        });
        bar.finish();
        result.map(|()| counts)
    }

    /// Every device sorts its staging rows into its partitions of the new
    /// table, all devices at once. Returns the partitions written.
    async fn sort_ranges(&self, counts: &[u64]) -> Result<usize, String> {
        let partitions_of = |rows: u64| match self.partition_rows {
            0 => u64::from(rows > 0),
            max => rows.div_ceil(max),
        };
        let bar = ProgressBar::new_spinner();
        bar.set_message(format!("sorting on {} devices", self.devices.len()));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        let mut first_partition = 0u32;
        let mut calls = vec![];
        for (d, &rows) in self.devices.iter().zip(counts) {
            let request = SortTableRequest {
                source: self.staging.clone(),
                into: self.into.clone(),
                by: self.keys.clone(),
                first_partition,
                partition_rows_max: match self.partition_rows {
                    0 => rows.max(1),
                    max => max,
                },
                row_group_rows_max: WriterOptions::default().row_group_rows_max as u64,
                hybrid: self.hybrid,
            };
            first_partition += partitions_of(rows) as u32;
            let client = Arc::clone(&d.client);
            calls.push(async move { client.sort_table(&request).await });
        }
        let results = futures::future::join_all(calls).await;
        bar.finish_and_clear();
        let mut written = 0;
        for r in results {
            written += r.map_err(|e| e.to_string())?.len();
        }
        Ok(written)
    }

    /// Drops `table` from every device, best effort (cleanup).
    fn drop_everywhere(&self, table: &str) {
        for d in &self.devices {
            let sink = Arc::clone(&d.sink);
            let table = table.to_string();
            // Flight sinks block on their runtime: keep them off this one.
            let _ = std::thread::spawn(move || sink.drop_table(&table)).join();
        }
    }
}

/// The key range `row` falls in: how many splitters are at or below it.
fn range_of(splitters: &Rows, row: arrow::row::Row<'_>) -> usize {
    let (mut lo, mut hi) = (0, splitters.num_rows());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if splitters.row(mid) <= row {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}
