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
    let smallest = bound(|c| c.min.as_ref()).and_then(|v| extreme(v, std::cmp::Ordering::Less));
    let largest = bound(|c| c.max.as_ref()).and_then(|v| extreme(v, std::cmp::Ordering::Greater));
    if let (Some(min), Some(max)) = (smallest, largest) {
        stats.min_value = Precision::Inexact(min);
        stats.max_value = Precision::Inexact(max);
    }
    stats
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
