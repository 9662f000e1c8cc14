//! TPC-H generation with the `tpchgen` crates (byte-compatible with dbgen).
//!
//! `orders` and `lineitem` are generated in the same parts, and part `p`
//! of both holds the same orderkey range, so the two tables are
//! range-partitioned on orderkey and co-located device by device. So are
//! `part` and `partsupp` on partkey; `customer` and `supplier` are range
//! partitioned on their keys. Every partition records its table's
//! partitioning ([`insitu_wire::Partitioning`]).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use insitu_format::WriterOptions;
use insitu_wire::{PartitionScheme, Partitioning};
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow,
    RecordBatchIterator, RegionArrow, SupplierArrow,
};

use crate::{
    device_for_partition, prepare_table, IngestError, IngestResult, LayoutChoice, PartitionSink,
    Progress,
};

/// The eight TPC-H tables, largest first.
pub const TPCH_TABLES: [&str; 8] = [
    "lineitem", "orders", "partsupp", "part", "customer", "supplier", "nation", "region",
];

#[derive(Debug, Clone)]
pub struct TpchOptions {
    pub scale_factor: f64,
    /// Partitions per device of each table but nation and region.
    pub partitions_per_device: u32,
    pub replace: bool,
    pub batch_rows: usize,
    pub writer: WriterOptions,
    pub layout: LayoutChoice,
}

impl Default for TpchOptions {
    fn default() -> Self {
        Self {
            scale_factor: 1.0,
            partitions_per_device: 1,
            replace: false,
            batch_rows: 8192,
            writer: WriterOptions::default(),
            layout: LayoutChoice::Parquet,
        }
    }
}

/// The key each table's parts are ranges of: part `p` of the generator
/// holds the `p`-th range of it (lineitem's orderkeys follow their orders').
pub fn partition_key(table: &str) -> &'static str {
    match table {
        "lineitem" => "l_orderkey",
        "orders" => "o_orderkey",
        "partsupp" => "ps_partkey",
        "part" => "p_partkey",
        "customer" => "c_custkey",
        "supplier" => "s_suppkey",
        "nation" => "n_nationkey",
        _ => "r_regionkey",
    }
}

/// `table` range-partitioned on its key into `parts` partitions.
fn partitioning(table: &str, parts: u32) -> Partitioning {
    Partitioning::new(
        vec![partition_key(table).to_string()],
        PartitionScheme::Range,
        parts,
    )
}

/// Rows TPC-H has at `sf`, per table (lineitem is an estimate: 4 per order).
pub fn expected_rows(table: &str, sf: f64) -> u64 {
    let parts = |f: fn(f64, i32, i32) -> i64| f(sf, 1, 1).max(0) as u64;
    match table {
        "lineitem" => 4 * parts(OrderGenerator::calculate_row_count),
        "orders" => parts(OrderGenerator::calculate_row_count),
        "partsupp" => parts(PartSuppGenerator::calculate_row_count),
        "part" => parts(PartGenerator::calculate_row_count),
        "customer" => parts(CustomerGenerator::calculate_row_count),
        "supplier" => parts(SupplierGenerator::calculate_row_count),
        "nation" => 25,
        "region" => 5,
        _ => 0,
    }
}

fn generator(
    table: &str,
    sf: f64,
    part: i32,
    parts: i32,
    batch: usize,
) -> Box<dyn RecordBatchIterator> {
    match table {
        "lineitem" => Box::new(
            LineItemArrow::new(LineItemGenerator::new(sf, part, parts)).with_batch_size(batch),
        ),
        "orders" => {
            Box::new(OrderArrow::new(OrderGenerator::new(sf, part, parts)).with_batch_size(batch))
        }
        "partsupp" => Box::new(
            PartSuppArrow::new(PartSuppGenerator::new(sf, part, parts)).with_batch_size(batch),
        ),
        "part" => {
            Box::new(PartArrow::new(PartGenerator::new(sf, part, parts)).with_batch_size(batch))
        }
        "customer" => Box::new(
            CustomerArrow::new(CustomerGenerator::new(sf, part, parts)).with_batch_size(batch),
        ),
        "supplier" => Box::new(
            SupplierArrow::new(SupplierGenerator::new(sf, part, parts)).with_batch_size(batch),
        ),
        "nation" => {
            Box::new(NationArrow::new(NationGenerator::new(sf, part, parts)).with_batch_size(batch))
        }
        "region" => {
            Box::new(RegionArrow::new(RegionGenerator::new(sf, part, parts)).with_batch_size(batch))
        }
        other => unreachable!("not a TPC-H table: {other}"),
    }
}

/// Generates `tables` (all eight when empty) at the options' scale factor
/// onto `devices`. Devices write in parallel, one thread each, bounded by
/// one row group of buffered rows per writer.
pub fn gen_tpch<S: PartitionSink + ?Sized>(
    devices: &[Arc<S>],
    tables: &[&str],
    options: &TpchOptions,
    progress: Progress<'_>,
) -> IngestResult<()> {
    let sf = options.scale_factor;
    if !(sf.is_finite() && sf > 0.0) {
        return Err(IngestError::Invalid(format!(
            "scale factor must be positive, got {sf}"
        )));
    }
    if devices.is_empty() {
        return Err(IngestError::Invalid("no devices to write to".into()));
    }
    let tables: Vec<&str> = if tables.is_empty() {
        TPCH_TABLES.to_vec()
    } else {
        tables.to_vec()
    };
    for t in &tables {
        if !TPCH_TABLES.contains(t) {
            return Err(IngestError::Invalid(format!("{t} is not a TPC-H table")));
        }
        prepare_table(devices, t, options.replace)?;
    }
    for table in tables {
        let parts: u32 = match table {
            "nation" | "region" => 1,
            _ => devices.len() as u32 * options.partitions_per_device.max(1),
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(dev_idx, device)| {
                    scope.spawn(move || -> IngestResult<()> {
                        for p in 0..parts {
                            if device_for_partition(p, parts, devices.len()) != dev_idx {
                                continue;
                            }
                            let gen = generator(
                                table,
                                sf,
                                p as i32 + 1,
                                parts as i32,
                                options.batch_rows,
                            );
                            let schema: SchemaRef = Arc::clone(gen.schema());
                            let mut writer = options.layout.writer_options(
                                &options.writer,
                                table,
                                &schema,
                                false,
                            )?;
                            writer.partitioning = Some(partitioning(table, parts));
                            let mut batches = gen.map(|b: RecordBatch| {
                                progress(b.num_rows() as u64);
                                Ok(b)
                            });
                            device.write_partition(table, p, schema, &mut batches, &writer)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("generator thread panicked"))
                .collect::<IngestResult<Vec<()>>>()
        })?;
    }
    Ok(())
}
