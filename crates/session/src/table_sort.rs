//! Sorting a whole table into a new, range-partitioned table.
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
use futures::StreamExt;
use insitu_format::WriterOptions;
use insitu_host::{InsituHost, Pushdown};
use insitu_kernels::{argsort_columns, Parallelism};
use insitu_wire::{PartitionScheme, Partitioning, SampleKeysRequest, SortKey, SortTableRequest};

use crate::{
    host_with, DeviceOptions, HostMemorySettings, JobDevice, Progress, SessionError, SessionResult,
    Target,
};

/// Key rows sampled over all devices to pick splitters (`sample_rows`).
pub const SAMPLE_ROWS: u64 = 100_000;
/// Batches in flight to each staging writer.
const BATCHES_IN_FLIGHT: usize = 4;

/// What to sort, by what, into what.
#[derive(Debug, Clone)]
pub struct TableSort {
    /// The table to sort.
    pub table: String,
    /// The new table; it must not exist.
    pub into: String,
    /// Key columns, most significant first.
    pub by: Vec<String>,
    /// Descending order (for every key column).
    pub descending: bool,
    /// Nulls before other values.
    pub nulls_first: bool,
    /// The new table in the hybrid layout, keyed on the sort columns.
    pub hybrid: bool,
    /// Most rows per partition of the new table (0: one per device).
    pub partition_rows: u64,
}

/// What a table sort did and how long each phase took.
#[derive(Debug, Default, Clone)]
pub struct TableSortReport {
    pub rows: u64,
    pub partitions: usize,
    pub devices: usize,
    pub total_secs: f64,
    pub sample_secs: f64,
    pub shuffle_secs: f64,
    pub sort_secs: f64,
    pub link_to_devices: u64,
    pub link_to_host: u64,
}

/// Sorts `sort.table` on the devices of `options` into `sort.into`.
/// On failure nothing of the new table or its staging rows is left.
pub async fn sort_table(
    options: &DeviceOptions,
    sort: &TableSort,
    progress: &dyn Progress,
) -> SessionResult<TableSortReport> {
    check_name(&sort.into)?;
    let target = Target::open(options)?;
    let devices = target.job_devices().await?;
    let clients: Vec<_> = devices.iter().map(|d| Arc::clone(&d.client)).collect();
    let memory = HostMemorySettings::of(options, &target, &clients)?;
    let host = host_with(clients, Pushdown::On, &memory).await?;
    let info = host
        .tables()
        .get(&sort.table)
        .ok_or_else(|| SessionError::NoTable {
            table: sort.table.clone(),
        })?
        .clone();
    if host.tables().contains_key(&sort.into) {
        return Err(SessionError::TableExists {
            table: sort.into.clone(),
        });
    }
    let job = SortJob {
        table: sort.table.clone(),
        into: sort.into.clone(),
        staging: format!("{}__staging", sort.into),
        keys: sort_keys(sort, &info.schema)?,
        schema: Arc::clone(&info.schema),
        total_rows: info.row_count(),
        hybrid: sort.hybrid,
        partition_rows: sort.partition_rows,
        devices,
    };
    let started = Instant::now();
    let result = job.run(&host, progress).await;
    job.drop_everywhere(&job.staging);
    if result.is_err() {
        job.drop_everywhere(&job.into);
    }
    let mut report = result?;
    report.devices = job.devices.len();
    report.total_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

fn check_name(table: &str) -> SessionResult<()> {
    if table.is_empty() || !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(SessionError::BadTableName {
            name: table.to_string(),
        });
    }
    Ok(())
}

/// The sort's keys, each a column of `schema`, none empty or twice.
fn sort_keys(sort: &TableSort, schema: &SchemaRef) -> SessionResult<Vec<SortKey>> {
    let bad = |problem: String| SessionError::BadSortKeys {
        keys: sort.by.join(","),
        problem,
    };
    if sort.by.is_empty() {
        return Err(bad("no key column given".into()));
    }
    if sort.by.iter().any(|c| c.trim().is_empty()) {
        return Err(bad("a column name is empty".into()));
    }
    if let Some((_, twice)) = sort
        .by
        .iter()
        .enumerate()
        .find(|(i, c)| sort.by[..*i].contains(c))
    {
        return Err(bad(format!("column {twice} is named twice")));
    }
    sort.by
        .iter()
        .map(|c| {
            schema
                .field_with_name(c)
                .map_err(|_| SessionError::NoColumn {
                    table: sort.table.clone(),
                    column: c.clone(),
                })?;
            Ok(SortKey {
                column: c.clone(),
                descending: sort.descending,
                nulls_first: sort.nulls_first,
            })
        })
        .collect()
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

    async fn run(
        &self,
        host: &InsituHost,
        progress: &dyn Progress,
    ) -> SessionResult<TableSortReport> {
        let links_before = self.link_totals();
        let mut report = TableSortReport::default();
        let t = Instant::now();
        let splitters = self.splitters().await?;
        report.sample_secs = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let counts = self.shuffle(host, &splitters, progress).await?;
        report.shuffle_secs = t.elapsed().as_secs_f64();
        report.rows = counts.iter().sum();

        let t = Instant::now();
        report.partitions = self.sort_ranges(&counts, progress).await?;
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
    async fn splitters(&self) -> SessionResult<Rows> {
        let converter = self.converter()?;
        let mut samples = vec![];
        for d in &self.devices {
            let manifest = d.client.manifest().await?;
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
            samples.push(d.client.sample_keys(&request).await?);
        }
        let ranges = self.devices.len();
        let Some(first) = samples.first() else {
            return Ok(converter.empty_rows(0, 0));
        };
        let sample = concat_batches(&first.schema(), &samples)?;
        let columns: Vec<SortColumn> = sample
            .columns()
            .iter()
            .zip(self.options())
            .map(|(values, options)| SortColumn {
                values: Arc::clone(values),
                options: Some(options),
            })
            .collect();
        let order: Vec<u32> = argsort_columns(&columns, None, Parallelism(1))?;
        let n = order.len();
        let picks = UInt32Array::from_iter_values((1..ranges).map(|i| order[i * n / ranges]));
        let chosen = take_record_batch(&sample, &picks)?;
        Ok(converter.convert_columns(chosen.columns())?)
    }

    fn converter(&self) -> SessionResult<RowConverter> {
        let fields = self
            .keys
            .iter()
            .zip(self.options())
            .map(|(k, options)| {
                let field = self.schema.field_with_name(&k.column)?;
                Ok(SortField::new_with_options(
                    field.data_type().clone(),
                    options,
                ))
            })
            .collect::<SessionResult<Vec<_>>>()?;
        Ok(RowConverter::new(fields)?)
    }

    /// Streams the table out of the devices and each row into the staging
    /// table of the device owning its key range. Returns rows per device.
    async fn shuffle(
        &self,
        host: &InsituHost,
        splitters: &Rows,
        progress: &dyn Progress,
    ) -> SessionResult<Vec<u64>> {
        progress.phase("shuffle", Some(self.total_rows));
        let sql = format!("SELECT * FROM \"{}\"", self.table);
        let mut stream = host.context().sql(&sql).await?.execute_stream().await?;
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
            let route = (|| -> SessionResult<()> {
                while let Some(batch) =
                    tokio::task::block_in_place(|| handle.block_on(stream.next()))
                {
                    let batch = batch?;
                    let keys: Vec<_> = key_idx
                        .iter()
                        .map(|&i| Arc::clone(batch.column(i)))
                        .collect();
                    let rows = converter.convert_columns(&keys)?;
                    let mut routes: Vec<Vec<u32>> = vec![vec![]; senders.len()];
                    for (r, row) in rows.iter().enumerate() {
                        routes[range_of(splitters, row)].push(r as u32);
                    }
                    for (i, idx) in routes.into_iter().enumerate() {
                        if idx.is_empty() {
                            continue;
                        }
                        counts[i] += idx.len() as u64;
                        let part = take_record_batch(&batch, &UInt32Array::from(idx))?;
                        if senders[i].send(Ok(part)).is_err() {
                            return Err(SessionError::StagingWriter {
                                device: self.devices[i].sink.device_id(),
                            });
                        }
                    }
                    progress.advance(batch.num_rows() as u64);
                }
                Ok(())
            })();
            if let Err(e) = &route {
                for tx in &senders {
                    let _ = tx.send(Err(ArrowError::ExternalError(e.to_string().into())));
                }
            }
            drop(senders);
            let written: Vec<_> = writers
                .into_iter()
                .map(|w| w.join().expect("staging writer panicked"))
                .collect();
            // A writer's own error explains a routing failure best.
            for w in written {
                w?;
            }
            route
        });
        progress.done();
        result.map(|()| counts)
    }

    /// Every device sorts its staging rows into its partitions of the new
    /// table, all devices at once. Returns the partitions written.
    async fn sort_ranges(&self, counts: &[u64], progress: &dyn Progress) -> SessionResult<usize> {
        let partitions_of = |rows: u64| match self.partition_rows {
            0 => u64::from(rows > 0),
            max => rows.div_ceil(max),
        };
        progress.phase("sort", None);
        let partitions: u64 = counts.iter().map(|&rows| partitions_of(rows)).sum();
        // Ascending keys: partition ids ascend with the key ranges.
        let partitioning = (self.keys.iter().all(|k| !k.descending) && partitions > 0).then(|| {
            Partitioning::new(
                self.key_columns(),
                PartitionScheme::Range,
                partitions as u32,
            )
        });
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
                partitioning: partitioning.clone(),
            };
            first_partition += partitions_of(rows) as u32;
            let client = Arc::clone(&d.client);
            calls.push(async move { client.sort_table(&request).await });
        }
        let results = futures::future::join_all(calls).await;
        progress.done();
        let mut written = 0;
        for r in results {
            written += r?.len();
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    fn sort(by: &[&str]) -> TableSort {
        TableSort {
            table: "t".into(),
            into: "t2".into(),
            by: by.iter().map(|c| c.to_string()).collect(),
            descending: true,
            nulls_first: false,
            hybrid: false,
            partition_rows: 0,
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn keys_are_columns_named_once() {
        let keys = sort_keys(&sort(&["b", "a"]), &schema()).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].column, "b");
        assert!(keys[1].descending && !keys[1].nulls_first);
        for (by, says) in [
            (vec![], "no key column"),
            (vec!["a", " "], "empty"),
            (vec!["a", "b", "a"], "column a is named twice"),
        ] {
            let e = sort_keys(&sort(&by), &schema()).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        let e = sort_keys(&sort(&["c"]), &schema()).unwrap_err();
        assert_eq!(e.to_string(), "table t has no column c to sort by");
    }

    #[test]
    fn table_names_are_identifiers() {
        assert!(check_name("lineitem_by_date2").is_ok());
        for bad in ["", "a-b", "a b", "t;drop", "ä"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    /// Range of each row against splitters, compared with counting
    /// splitters at or below it, at odd sizes with duplicates.
    #[test]
    fn range_of_counts_splitters_at_or_below() {
        let converter = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        for splitter_values in [vec![], vec![5], vec![2, 2, 7], vec![1, 3, 3, 3, 9, 11, 20]] {
            let splitters = converter
                .convert_columns(&[Arc::new(Int64Array::from(splitter_values.clone())) as _])
                .unwrap();
            let values: Vec<i64> = (-1..23).collect();
            let rows = converter
                .convert_columns(&[Arc::new(Int64Array::from(values.clone())) as _])
                .unwrap();
            for (v, row) in values.iter().zip(rows.iter()) {
                let expected = splitter_values.iter().filter(|s| *s <= v).count();
                assert_eq!(
                    range_of(&splitters, row),
                    expected,
                    "{v} {splitter_values:?}"
                );
            }
        }
    }
}
