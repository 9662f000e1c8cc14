//! `insitu sort`: the flags of a table sort and its report; the job
//! itself is `insitu_session::table_sort`.

use clap::Args;
use insitu_session::{sort_table, TableSort};

use crate::console::Bars;
use crate::error::CliResult;
use crate::units::human_bytes;
use crate::{DeviceArgs, LayoutArg};

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

pub async fn run(a: SortArgs) -> CliResult<()> {
    let sort = TableSort {
        table: a.table.clone(),
        into: a.into.clone(),
        by: a.by.clone(),
        descending: a.desc,
        nulls_first: a.nulls_first,
        hybrid: a.layout == LayoutArg::Hybrid,
        partition_rows: a.partition_rows,
    };
    let report = sort_table(&a.device.options(), &sort, &Bars::default()).await?;
    eprintln!(
        "sorted {} rows of {} into {} ({} partitions on {} devices) in {:.2} s: \
         sample {:.2} s, shuffle {:.2} s, device sorts {:.2} s | link: {} to devices, {} to host",
        report.rows,
        a.table,
        a.into,
        report.partitions,
        report.devices,
        report.total_secs,
        report.sample_secs,
        report.shuffle_secs,
        report.sort_secs,
        human_bytes(report.link_to_devices),
        human_bytes(report.link_to_host),
    );
    Ok(())
}
