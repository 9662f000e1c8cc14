//! Planning statistics of insitu tables, from the descriptors in the
//! device manifests: row counts, in-memory sizes, min/max and null counts
//! per column.
//!
//! DataFusion uses them to choose join sides and modes (build the smaller
//! input, collect tiny ones) and to estimate filter selectivity; the join
//! strategy rule uses the sizes to weigh a hash table against the host
//! budget. They steer plans only: every value is `Inexact`, so no rule
//! answers a query from them.

use arrow::datatypes::{DataType, Schema};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use insitu_wire::FormatDescriptor;

/// Assumed in-memory bytes of one variable-length value (a 16-byte
/// string view plus its bytes when they do not fit inline): descriptors
/// record no per-column sizes, and TPC-H's strings average 10 to 70 bytes.
pub const VARIABLE_VALUE_BYTES_ASSUMED: usize = 32;

/// Statistics of a table made of the partitions `descriptors` describe.
pub fn table_statistics<'a>(
    schema: &Schema,
    descriptors: impl IntoIterator<Item = &'a FormatDescriptor>,
) -> Statistics {
    let descriptors: Vec<&FormatDescriptor> = descriptors.into_iter().collect();
    let rows: u64 = descriptors.iter().map(|d| d.row_count).sum();
    let rows = usize::try_from(rows).unwrap_or(usize::MAX);
    let columns: Vec<ColumnStatistics> = schema
        .fields()
        .iter()
        .map(|f| column_statistics(f.name(), f.data_type(), rows, &descriptors))
        .collect();
    let total = columns
        .iter()
        .filter_map(|c| c.byte_size.get_value().copied())
        .fold(0usize, usize::saturating_add);
    Statistics {
        num_rows: Precision::Inexact(rows),
        total_byte_size: Precision::Inexact(total),
        column_statistics: columns,
    }
}

fn column_statistics(
    name: &str,
    data_type: &DataType,
    rows: usize,
    descriptors: &[&FormatDescriptor],
) -> ColumnStatistics {
    let width = data_type
        .primitive_width()
        .unwrap_or(VARIABLE_VALUE_BYTES_ASSUMED);
    let mut stats = ColumnStatistics::new_unknown();
    stats.byte_size = Precision::Inexact(rows.saturating_mul(width));
    let chunks = || {
        descriptors
            .iter()
            .flat_map(|d| &d.row_groups)
            .map(|rg| rg.columns.iter().find(|c| c.column == name))
    };
    // Bounds and null counts only when every row group has them.
    let nulls: Option<u64> = chunks().map(|c| c.and_then(|c| c.null_count)).sum();
    if let Some(n) = nulls {
        stats.null_count = Precision::Inexact(usize::try_from(n).unwrap_or(usize::MAX));
    }
    let bound = |pick: fn(&insitu_wire::ColumnStats) -> Option<&String>| {
        chunks()
            .map(|c| {
                let text = c.and_then(pick)?;
                ScalarValue::try_from_string(text.clone(), data_type).ok()
            })
            .collect::<Option<Vec<ScalarValue>>>()
    };
    let (Some(mins), Some(maxes)) = (bound(|c| c.min.as_ref()), bound(|c| c.max.as_ref())) else {
        return stats;
    };
    if is_integral(data_type) {
        let group_rows = descriptors
            .iter()
            .flat_map(|d| &d.row_groups)
            .map(|rg| rg.row_count);
        if let Some(n) = distinct_bound(&mins, &maxes, group_rows) {
            stats.distinct_count = Precision::Inexact(n.min(rows));
        }
    }
    let smallest = extreme(mins, std::cmp::Ordering::Less);
    let largest = extreme(maxes, std::cmp::Ordering::Greater);
    if let (Some(min), Some(max)) = (smallest, largest) {
        stats.min_value = Precision::Inexact(min);
        stats.max_value = Precision::Inexact(max);
    }
    stats
}

/// Integers and dates: types whose values between two bounds can be
/// counted.
fn is_integral(data_type: &DataType) -> bool {
    data_type.is_integer() || matches!(data_type, DataType::Date32 | DataType::Date64)
}

/// At most how many distinct values the row groups hold: a group of `n`
/// rows between `min` and `max` holds at most `min(n, max - min + 1)`,
/// and the table at most the width of its overall range. A column stored
/// in key order (`l_orderkey`) thus counts its keys, not its rows.
/// `None` when a distance cannot be taken.
fn distinct_bound(
    mins: &[ScalarValue],
    maxes: &[ScalarValue],
    group_rows: impl Iterator<Item = u64>,
) -> Option<usize> {
    let mut sum = 0usize;
    for ((min, max), rows) in mins.iter().zip(maxes).zip(group_rows) {
        let width = min.distance(max)?.saturating_add(1);
        sum = sum.saturating_add(width.min(usize::try_from(rows).unwrap_or(usize::MAX)));
    }
    let lowest = extreme(mins.to_vec(), std::cmp::Ordering::Less)?;
    let highest = extreme(maxes.to_vec(), std::cmp::Ordering::Greater)?;
    let overall = lowest.distance(&highest)?.saturating_add(1);
    Some(sum.min(overall))
}

/// The least (`Less`) or greatest (`Greater`) of `values`; `None` when
/// there are none or two do not compare (strings truncated differently).
fn extreme(values: Vec<ScalarValue>, keep: std::cmp::Ordering) -> Option<ScalarValue> {
    let mut values = values.into_iter();
    let mut best = values.next()?;
    for v in values {
        if v.partial_cmp(&best)? == keep {
            best = v;
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use insitu_wire::{ColumnStats, LayoutKind, RowGroupStats};

    fn descriptor(rows: &[(u64, i64, i64)]) -> FormatDescriptor {
        FormatDescriptor {
            version: 1,
            table: "t".into(),
            partition: 0,
            file: "t/0.parquet".into(),
            layout: LayoutKind::Parquet,
            fields: vec![],
            row_count: rows.iter().map(|r| r.0).sum(),
            byte_size: 0,
            crc32: 0,
            row_groups: rows
                .iter()
                .map(|&(n, min, max)| RowGroupStats {
                    row_count: n,
                    byte_size: 0,
                    columns: vec![ColumnStats {
                        column: "k".into(),
                        min: Some(min.to_string()),
                        max: Some(max.to_string()),
                        null_count: Some(1),
                        compressed_bytes: None,
                    }],
                })
                .collect(),
            hybrid: None,
            partitioning: None,
        }
    }

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8View, true),
        ])
    }

    #[test]
    fn sums_rows_and_merges_bounds_over_partitions() {
        let a = descriptor(&[(10, 5, 9), (20, -3, 4)]);
        let b = descriptor(&[(7, 0, 100)]);
        let stats = table_statistics(&schema(), [&a, &b]);
        assert_eq!(stats.num_rows, Precision::Inexact(37));
        let k = &stats.column_statistics[0];
        assert_eq!(
            k.min_value,
            Precision::Inexact(ScalarValue::Int64(Some(-3)))
        );
        assert_eq!(
            k.max_value,
            Precision::Inexact(ScalarValue::Int64(Some(100)))
        );
        assert_eq!(k.null_count, Precision::Inexact(3));
        // Groups of 10 rows in 5..=9 (5 values), 20 in -3..=4 (8), 7 in
        // 0..=100 (7): at most 20 distinct, within the 104 of -3..=100.
        assert_eq!(k.distinct_count, Precision::Inexact(20));
        assert_eq!(k.byte_size, Precision::Inexact(37 * 8));
        // The string column has no row-group statistics: sizes only.
        let s = &stats.column_statistics[1];
        assert_eq!(s.min_value, Precision::Absent);
        assert_eq!(s.null_count, Precision::Absent);
        assert_eq!(
            s.byte_size,
            Precision::Inexact(37 * VARIABLE_VALUE_BYTES_ASSUMED)
        );
        assert_eq!(
            stats.total_byte_size,
            Precision::Inexact(37 * (8 + VARIABLE_VALUE_BYTES_ASSUMED))
        );
    }

    #[test]
    fn no_partitions_is_an_empty_table_and_bad_bounds_are_dropped() {
        let stats = table_statistics(&schema(), []);
        assert_eq!(stats.num_rows, Precision::Inexact(0));
        let mut odd = descriptor(&[(3, 1, 2)]);
        odd.row_groups[0].columns[0].max = Some("not a number".into());
        let stats = table_statistics(&schema(), [&odd]);
        assert_eq!(stats.column_statistics[0].max_value, Precision::Absent);
        assert_eq!(stats.column_statistics[0].min_value, Precision::Absent);
    }
}
