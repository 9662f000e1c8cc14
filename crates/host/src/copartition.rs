//! Co-partitioned tables: when every pair of rows that an equi-join can
//! match lies on one device, the join can run device by device.
//!
//! ```text
//!  orders   range on o_orderkey        lineitem  range on l_orderkey
//!   p0 [1, 1.5M]        dev0   ◀──same──▶  p0 [1, 1.5M]        dev0
//!   p1 [1.5M+, 3M]      dev1   ◀──same──▶  p1 [1.5M+, 3M]      dev1
//!  ON o_orderkey = l_orderkey: co-partitioned
//! ```
//!
//! What a table records ([`Partitioning`]) is checked against what it
//! holds before the host relies on it: its partitions agree on one
//! partitioning and are numbered `0..partitions`, each once; a range
//! table's key bounds (from its row-group statistics) ascend with the
//! partition id and do not overlap. A table that fails a check is treated
//! as not partitioned. Two range tables are co-partitioned on their keys
//! when every left and right partition whose bounds overlap are on the
//! same device; two hash tables when they have as many partitions and
//! partition `p` of both is on one device.

use std::cmp::Ordering;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::ScalarValue;
use insitu_wire::{FormatDescriptor, PartitionScheme, Partitioning};

use crate::catalog::TableInfo;

/// One partition: its device and the bounds of its keys (`None` when it
/// holds no non-null key, so no row of it can join).
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionPlace {
    pub device: u32,
    pub bounds: Option<(ScalarValue, ScalarValue)>,
}

/// A table's checked partitioning and where each partition is.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionMap {
    pub partitioning: Partitioning,
    /// The key columns' types, in key order.
    pub key_types: Vec<DataType>,
    /// Indexed by partition id.
    pub places: Vec<PartitionPlace>,
}

impl PartitionMap {
    /// The map of `table`, or `None` if it records no partitioning or
    /// what it records does not hold (see the module docs).
    pub fn of(table: &TableInfo) -> Option<Self> {
        let parts = table
            .shares
            .iter()
            .flat_map(|s| s.descriptors.iter().map(|d| (s.client.id(), d)));
        Self::from_parts(&table.schema, parts)
    }

    /// The map of a table of `schema` whose partitions are `parts`
    /// (device id, descriptor).
    pub fn from_parts<'a>(
        schema: &Schema,
        parts: impl IntoIterator<Item = (u32, &'a FormatDescriptor)>,
    ) -> Option<Self> {
        let parts: Vec<(u32, &FormatDescriptor)> = parts.into_iter().collect();
        let partitioning = parts.first()?.1.partitioning.clone()?;
        if parts
            .iter()
            .any(|(_, d)| d.partitioning.as_ref() != Some(&partitioning))
            || parts.len() != partitioning.partitions as usize
        {
            return None;
        }
        let key_types = partitioning
            .columns
            .iter()
            .map(|c| Some(schema.field_with_name(c).ok()?.data_type().clone()))
            .collect::<Option<Vec<_>>>()?;
        let mut places: Vec<Option<PartitionPlace>> = vec![None; parts.len()];
        for (device, d) in parts {
            let slot = places.get_mut(d.partition as usize)?;
            if slot.is_some() {
                return None; // a partition id twice
            }
            let bounds = match partitioning.scheme {
                PartitionScheme::Range => key_bounds(d, &partitioning.columns[0], &key_types[0])?,
                PartitionScheme::Hash => None,
            };
            *slot = Some(PartitionPlace { device, bounds });
        }
        let places: Vec<PartitionPlace> = places.into_iter().collect::<Option<_>>()?;
        let map = Self {
            partitioning,
            key_types,
            places,
        };
        map.holds().then_some(map)
    }

    /// Whether the recorded scheme holds: a range table by one column
    /// whose partitions' key ranges ascend without overlapping.
    fn holds(&self) -> bool {
        match self.partitioning.scheme {
            PartitionScheme::Hash => true,
            PartitionScheme::Range => {
                let bounds: Vec<_> = self
                    .places
                    .iter()
                    .filter_map(|p| p.bounds.as_ref())
                    .collect();
                self.partitioning.columns.len() == 1
                    && bounds
                        .windows(2)
                        .all(|w| compare(&w[0].1, &w[1].0) == Some(Ordering::Less))
            }
        }
    }
}

/// The smallest and largest key of partition `d` over its row groups:
/// `Some(None)` when it holds no non-null key, `None` when a row group
/// lacks statistics or they do not parse.
fn key_bounds(
    d: &FormatDescriptor,
    column: &str,
    data_type: &DataType,
) -> Option<Option<(ScalarValue, ScalarValue)>> {
    let mut bounds: Option<(ScalarValue, ScalarValue)> = None;
    for rg in d.row_groups.iter().filter(|rg| rg.row_count > 0) {
        let stats = rg.columns.iter().find(|c| c.column == column)?;
        let parse = |text: &Option<String>| {
            ScalarValue::try_from_string(text.clone()?, data_type)
                .ok()
                .filter(|v| !v.is_null())
        };
        let (min, max) = match (parse(&stats.min), parse(&stats.max)) {
            (Some(min), Some(max)) => (min, max),
            // Only nulls: no key of this group can join.
            (None, None) if stats.null_count == Some(rg.row_count) => continue,
            _ => return None,
        };
        bounds = Some(match bounds {
            None => (min, max),
            Some((lo, hi)) => (
                pick(lo, min, Ordering::Less)?,
                pick(hi, max, Ordering::Greater)?,
            ),
        });
    }
    if bounds.is_none() && d.row_count > 0 && d.row_groups.is_empty() {
        return None; // rows without statistics
    }
    Some(bounds)
}

fn pick(a: ScalarValue, b: ScalarValue, want: Ordering) -> Option<ScalarValue> {
    Some(if compare(&b, &a)? == want { b } else { a })
}

fn compare(a: &ScalarValue, b: &ScalarValue) -> Option<Ordering> {
    a.partial_cmp(b)
}

/// Whether `left` and `right` are co-partitioned for an equi-join on
/// `on` (pairs of left and right key columns): each partitioning key
/// column is joined to its counterpart, and rows that can match lie on
/// one device.
pub fn co_partitioned(left: &PartitionMap, right: &PartitionMap, on: &[(&str, &str)]) -> bool {
    let (lp, rp) = (&left.partitioning, &right.partitioning);
    let keys_joined = lp.columns.len() == rp.columns.len()
        && lp
            .columns
            .iter()
            .zip(&rp.columns)
            .all(|(l, r)| on.iter().any(|(a, b)| a == l && b == r));
    if !keys_joined || lp.scheme != rp.scheme {
        return false;
    }
    match lp.scheme {
        PartitionScheme::Hash => {
            lp.partitions == rp.partitions
                && left
                    .key_types
                    .iter()
                    .zip(&right.key_types)
                    .all(|(l, r)| hash_compatible(l, r))
                && left
                    .places
                    .iter()
                    .zip(&right.places)
                    .all(|(l, r)| l.device == r.device)
        }
        PartitionScheme::Range => left.places.iter().all(|l| {
            right.places.iter().all(|r| match (&l.bounds, &r.bounds) {
                (Some(a), Some(b)) => !overlap(a, b) || l.device == r.device,
                _ => true,
            })
        }),
    }
}

/// Whether two key types hash equal values to the same partition: any
/// two integer types (hashed as i64), else the same type.
fn hash_compatible(a: &DataType, b: &DataType) -> bool {
    a == b || (a.is_integer() && b.is_integer())
}

/// Whether two closed ranges share a value; `true` when they cannot be
/// compared (the safe answer).
fn overlap(a: &(ScalarValue, ScalarValue), b: &(ScalarValue, ScalarValue)) -> bool {
    let before = |x: &ScalarValue, y: &ScalarValue| compare(x, y) == Some(Ordering::Less);
    !(before(&a.1, &b.0) || before(&b.1, &a.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use insitu_wire::{ColumnStats, LayoutKind, RowGroupStats};

    /// Partition `partition` of a table partitioned as `p`, whose row
    /// groups hold keys in `groups` (rows, min, max).
    fn part(p: &Partitioning, partition: u32, groups: &[(u64, i64, i64)]) -> FormatDescriptor {
        FormatDescriptor {
            version: insitu_wire::DESCRIPTOR_VERSION,
            table: "t".into(),
            partition,
            file: format!("t/{partition}.parquet"),
            layout: LayoutKind::Parquet,
            fields: vec![],
            row_count: groups.iter().map(|g| g.0).sum(),
            byte_size: 0,
            crc32: 0,
            row_groups: groups
                .iter()
                .map(|&(n, min, max)| RowGroupStats {
                    row_count: n,
                    byte_size: 0,
                    columns: vec![ColumnStats {
                        column: "k".into(),
                        min: Some(min.to_string()),
                        max: Some(max.to_string()),
                        null_count: Some(0),
                        compressed_bytes: None,
                    }],
                })
                .collect(),
            hybrid: None,
            partitioning: Some(p.clone()),
        }
    }

    fn schema(t: DataType) -> Schema {
        Schema::new(vec![Field::new("k", t, true)])
    }

    fn range(n: u32) -> Partitioning {
        Partitioning::new(vec!["k".into()], PartitionScheme::Range, n)
    }

    /// A range table of `ranges` (device, min, max), partition i the i-th.
    fn range_map(ranges: &[(u32, i64, i64)]) -> Option<PartitionMap> {
        let p = range(ranges.len() as u32);
        let parts: Vec<_> = ranges
            .iter()
            .enumerate()
            .map(|(i, &(dev, lo, hi))| (dev, part(&p, i as u32, &[(10, lo, hi), (5, lo, lo)])))
            .collect();
        PartitionMap::from_parts(
            &schema(DataType::Int64),
            parts.iter().map(|(dev, d)| (*dev, d)),
        )
    }

    #[test]
    fn range_tables_on_the_same_devices_are_co_partitioned() {
        let orders = range_map(&[(0, 1, 100), (1, 101, 200), (2, 201, 300)]).unwrap();
        // Narrower ranges inside the same devices' ranges still match.
        let lineitem = range_map(&[(0, 3, 90), (1, 120, 200), (2, 201, 250)]).unwrap();
        let on = [("k", "k")];
        assert!(co_partitioned(&orders, &lineitem, &on));
        assert!(co_partitioned(&lineitem, &orders, &on));
        assert_eq!(
            orders.places[1].bounds,
            Some((ScalarValue::Int64(Some(101)), ScalarValue::Int64(Some(200))))
        );
        // A range that reaches into another device's is not.
        let shifted = range_map(&[(0, 1, 150), (1, 151, 200), (2, 201, 300)]).unwrap();
        assert!(!co_partitioned(&orders, &shifted, &on));
        // The same ranges on other devices are not.
        let moved = range_map(&[(1, 1, 100), (0, 101, 200), (2, 201, 300)]).unwrap();
        assert!(!co_partitioned(&orders, &moved, &on));
        // Not joined on the partitioning keys.
        assert!(!co_partitioned(&orders, &lineitem, &[("k", "other")]));
        assert!(!co_partitioned(&orders, &lineitem, &[]));
    }

    #[test]
    fn a_recorded_range_that_does_not_hold_is_ignored() {
        assert!(range_map(&[(0, 1, 100), (1, 50, 200)]).is_none(), "overlap");
        assert!(
            range_map(&[(0, 101, 200), (1, 1, 100)]).is_none(),
            "descending"
        );
        assert!(
            range_map(&[(0, 1, 100), (1, 100, 200)]).is_none(),
            "shared bound"
        );
        assert!(range_map(&[(0, 7, 7)]).is_some(), "one partition");
        let p = range(3);
        let d = [part(&p, 0, &[(1, 1, 1)]), part(&p, 1, &[(1, 2, 2)])];
        let s = schema(DataType::Int64);
        assert!(
            PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_none(),
            "a partition missing"
        );
        let d = [
            part(&p, 0, &[(1, 1, 1)]),
            part(&p, 0, &[(1, 2, 2)]),
            part(&p, 2, &[(1, 3, 3)]),
        ];
        assert!(
            PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_none(),
            "an id twice"
        );
        let mut d = [
            part(&p, 0, &[(1, 1, 1)]),
            part(&p, 1, &[(1, 2, 2)]),
            part(&p, 2, &[(1, 3, 3)]),
        ];
        assert!(PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_some());
        d[1].partitioning = Some(Partitioning::new(
            vec!["k".into()],
            PartitionScheme::Hash,
            3,
        ));
        assert!(
            PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_none(),
            "disagree"
        );
        d[1].partitioning = None;
        assert!(
            PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_none(),
            "unrecorded"
        );
        d[1].partitioning = d[0].partitioning.clone();
        d[1].row_groups[0].columns[0].min = None;
        assert!(
            PartitionMap::from_parts(&s, d.iter().map(|d| (0, d))).is_none(),
            "no statistics"
        );
        let unknown_column = Schema::new(vec![Field::new("x", DataType::Int64, true)]);
        assert!(PartitionMap::from_parts(&unknown_column, d.iter().map(|d| (0, d))).is_none());
    }

    #[test]
    fn empty_and_all_null_partitions_join_nothing() {
        let p = range(3);
        let mut d = [
            part(&p, 0, &[(4, 1, 9)]),
            part(&p, 1, &[]),
            part(&p, 2, &[(4, 20, 29)]),
        ];
        d[1].row_count = 0;
        let mut nulls = part(&p, 1, &[(3, 0, 0)]);
        nulls.row_groups[0].columns[0] = ColumnStats {
            column: "k".into(),
            min: None,
            max: None,
            null_count: Some(3),
            compressed_bytes: None,
        };
        let s = schema(DataType::Int64);
        for middle in [d[1].clone(), nulls] {
            d[1] = middle;
            let m = PartitionMap::from_parts(&s, d.iter().map(|d| (d.partition, d))).unwrap();
            assert_eq!(m.places[1].bounds, None);
        }
    }

    #[test]
    fn hash_tables_need_the_same_count_and_devices() {
        let s = schema(DataType::Int32);
        let map = |n: u32, devices: &[u32]| {
            let p = Partitioning::new(vec!["k".into()], PartitionScheme::Hash, n);
            let d: Vec<_> = (0..n).map(|i| part(&p, i, &[(1, 0, 0)])).collect();
            PartitionMap::from_parts(&s, d.iter().zip(devices).map(|(d, &dev)| (dev, d))).unwrap()
        };
        let on = [("k", "k")];
        assert!(co_partitioned(
            &map(4, &[0, 0, 1, 1]),
            &map(4, &[0, 0, 1, 1]),
            &on
        ));
        assert!(!co_partitioned(
            &map(4, &[0, 0, 1, 1]),
            &map(4, &[0, 1, 0, 1]),
            &on
        ));
        assert!(!co_partitioned(
            &map(4, &[0, 0, 1, 1]),
            &map(2, &[0, 1]),
            &on
        ));
        let mut wide = map(4, &[0, 0, 1, 1]);
        wide.key_types = vec![DataType::Int64];
        assert!(
            co_partitioned(&map(4, &[0, 0, 1, 1]), &wide, &on),
            "integers hash as i64"
        );
        wide.key_types = vec![DataType::Utf8];
        assert!(!co_partitioned(&map(4, &[0, 0, 1, 1]), &wide, &on));
        let range_side = range_map(&[(0, 1, 1), (0, 2, 2), (1, 3, 3), (1, 4, 4)]).unwrap();
        assert!(
            !co_partitioned(&map(4, &[0, 0, 1, 1]), &range_side, &on),
            "schemes differ"
        );
    }
}
