//! `gen tpch` records each table's partitioning, and the host tells the
//! tables co-partitioned on a join's keys from those that are not,
//! checking the recorded ranges against the partitions' statistics.

use insitu_device::root::{create_root, DeviceBudget};
use insitu_host::{InsituHost, Pushdown};
use insitu_ingest::{gen_tpch, TpchOptions};
use insitu_wire::PartitionScheme;

use crate::common;

fn check_tpch(host: &InsituHost, partitions: u32) {
    for (table, key) in [("orders", "o_orderkey"), ("lineitem", "l_orderkey")] {
        let info = &host.tables()[table];
        for d in info.shares.iter().flat_map(|s| &s.descriptors) {
            let p = d.partitioning.as_ref().expect("recorded");
            assert_eq!(p.columns, [key]);
            assert_eq!(p.scheme, PartitionScheme::Range);
            assert_eq!(p.partitions, partitions);
        }
    }
    let yes = [
        ("orders", "lineitem", ("o_orderkey", "l_orderkey")),
        ("lineitem", "orders", ("l_orderkey", "o_orderkey")),
        ("part", "partsupp", ("p_partkey", "ps_partkey")),
    ];
    for (left, right, on) in yes {
        assert!(host.co_partitioned(left, right, &[on]), "{left} {right}");
    }
    let no = [
        // Joined on keys the tables are not partitioned by.
        ("orders", "customer", ("o_custkey", "c_custkey")),
        ("lineitem", "part", ("l_partkey", "p_partkey")),
        ("lineitem", "partsupp", ("l_partkey", "ps_partkey")),
        // Partitioned by their keys, but not joined on them.
        ("orders", "lineitem", ("o_custkey", "l_orderkey")),
        ("nope", "lineitem", ("x", "l_orderkey")),
    ];
    for (left, right, on) in no {
        assert!(!host.co_partitioned(left, right, &[on]), "{left} {right}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_orders_and_lineitem_are_co_partitioned_on_orderkey() {
    for devices in [1, 3, 4] {
        let root = common::tpch_root(0.01, devices);
        let host = common::host(&root, Pushdown::Auto).await;
        check_tpch(&host, devices);
    }
}

/// Several partitions per device: partition p of both tables still sits
/// on one device, and the ranges still ascend with the partition id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_partitions_per_device_stay_co_partitioned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let devs = create_root(dir.path(), 3, &DeviceBudget::default()).expect("root");
    let options = TpchOptions {
        scale_factor: 0.01,
        partitions_per_device: 2,
        ..Default::default()
    };
    let sinks = insitu_device::embedded(devs, insitu_link::LinkProfile::UNLIMITED);
    gen_tpch(&sinks, &[], &options, &|_| {}).expect("gen tpch");
    drop(sinks);
    let host = common::host(dir.path(), Pushdown::Auto).await;
    check_tpch(&host, 6);
}
