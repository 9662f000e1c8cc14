//! How `gen tpch` lays tables out over devices.

use crate::common;

use insitu_device::root::{open_root, DeviceBudget};
use insitu_wire::FormatDescriptor;

fn key_range(d: &FormatDescriptor, column: &str) -> (i64, i64) {
    let stats = d
        .row_groups
        .iter()
        .flat_map(|rg| rg.columns.iter().filter(|c| c.column == column));
    let mins = stats
        .clone()
        .filter_map(|c| c.min.as_deref()?.parse::<i64>().ok());
    let maxes = stats.filter_map(|c| c.max.as_deref()?.parse::<i64>().ok());
    (mins.min().expect("min"), maxes.max().expect("max"))
}

#[test]
fn orders_and_lineitem_are_range_partitioned_and_co_located() {
    let root = common::tpch_root(0.01, 3);
    let devices = open_root(&root, &DeviceBudget::default()).expect("devices");
    let mut previous_max = i64::MIN;
    for device in &devices {
        let manifest = device.manifest();
        let orders = &manifest.tables["orders"];
        let lineitem = &manifest.tables["lineitem"];
        assert_eq!(orders.len(), 1, "one orders partition per device");
        assert_eq!(
            orders[0].partition, lineitem[0].partition,
            "same partition ids"
        );
        let (o_lo, o_hi) = key_range(&orders[0], "o_orderkey");
        let (l_lo, l_hi) = key_range(&lineitem[0], "l_orderkey");
        // The lineitems of a device's orders are on the same device...
        assert!(
            l_lo >= o_lo && l_hi <= o_hi,
            "device {}: lineitem {l_lo}..{l_hi} outside orders {o_lo}..{o_hi}",
            device.id()
        );
        // ...and devices hold increasing, disjoint key ranges.
        assert!(
            o_lo > previous_max,
            "device {} overlaps the previous one",
            device.id()
        );
        previous_max = o_hi;
        // Every descriptor says how its file is laid out and encoded.
        for d in orders.iter().chain(lineitem) {
            assert_eq!(d.layout, insitu_wire::LayoutKind::Parquet);
            assert!(d.row_count > 0 && d.byte_size > 0 && !d.row_groups.is_empty());
            assert!(d
                .fields
                .iter()
                .any(|f| f.encodings.contains(&insitu_wire::Encoding::Dictionary)));
        }
    }
    // Small dimension tables live whole on one device.
    let holders = devices
        .iter()
        .filter(|d| d.manifest().tables.contains_key("nation"))
        .count();
    assert_eq!(holders, 1);
}

/// A data root given as a relative path works like an absolute one for
/// generating, querying (Parquet and hybrid partitions) and sorting.
#[test]
fn relative_roots_work() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let (ok, out, err) = common::insitu_in(dir.path(), args);
        assert!(ok, "{args:?}: {err}");
        out
    };
    let gen = "gen tpch --sf 0.01 --devices 2 --root data";
    run(&gen.split(' ').collect::<Vec<_>>());
    let count = "select count(*) from lineitem";
    let out = run(&["sql", count, "--root", "data", "--format", "csv"]);
    assert!(out.contains("60175"), "{out}");
    let sort = "sort --table lineitem --by l_partkey --into by_part --layout hybrid --root data";
    run(&sort.split(' ').collect::<Vec<_>>());
    let sql = "select count(*), min(l_partkey) from by_part";
    let out = run(&["sql", sql, "--root", "./data", "--format", "csv"]);
    assert!(out.contains("60175,1"), "{out}");
}
