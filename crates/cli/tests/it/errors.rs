//! Bad input gets a clear error naming what was wrong and where.

use crate::common;

use std::path::{Path, PathBuf};

use insitu_device::embedded_clients;
use insitu_device::root::{create_root, open_root, DeviceBudget};
use insitu_host::{HostConfig, InsituHost, Pushdown};
use insitu_ingest::{gen_tpch, TpchOptions};
use insitu_link::LinkProfile;
use insitu_wire::StagePlanEnvelope;

/// A fresh root with lineitem and nation at SF 0.01 on 3 devices, for tests
/// that damage it.
fn scratch_root() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let devs = create_root(&root, 3, &DeviceBudget::default()).expect("root");
    let options = TpchOptions {
        scale_factor: 0.01,
        ..Default::default()
    };
    let sinks = insitu_device::embedded(devs, LinkProfile::UNLIMITED);
    gen_tpch(&sinks, &["lineitem", "nation"], &options, &|_| {}).expect("gen");
    (dir, root)
}

async fn host_with(root: &Path, budget: DeviceBudget) -> Result<InsituHost, String> {
    let devices = open_root(root, &budget).map_err(|e| e.to_string())?;
    InsituHost::new(
        embedded_clients(devices, LinkProfile::UNLIMITED),
        HostConfig {
            pushdown: insitu_host::Pushdown::On,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| e.to_string())
}

async fn sql_error(host: &InsituHost, sql: &str) -> String {
    match host.sql(sql).await {
        Ok(_) => panic!("expected an error from {sql}"),
        Err(e) => e.to_string(),
    }
}

fn error_of<T>(r: Result<T, String>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn assert_contains(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "expected {p:?} in: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_table_column_and_syntax() {
    let root = common::tpch_root(0.01, 3);
    let host = common::host(&root, Pushdown::On).await;
    let e = sql_error(&host, "select * from no_such_table").await;
    assert_contains(&e, &["no_such_table", "not found"]);
    let e = sql_error(&host, "select no_such_column from lineitem").await;
    assert_contains(&e, &["no_such_column"]);
    let e = sql_error(&host, "selec l_orderkey from lineitem").await;
    assert_contains(&e, &["selec", "Expected"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_device_directory_names_the_device() {
    let (_dir, root) = scratch_root();
    std::fs::remove_dir_all(root.join("dev1")).expect("remove dev1");
    let e = error_of(host_with(&root, DeviceBudget::default()).await);
    assert_contains(&e, &["device 1", "dev1", "does not exist"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_partition_is_a_checksum_error_naming_device_and_partition() {
    let (_dir, root) = scratch_root();
    let file = root.join("dev2/lineitem/00002.parquet");
    let mut bytes = std::fs::read(&file).expect("partition file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&file, &bytes).expect("write");
    let host = host_with(&root, DeviceBudget::default())
        .await
        .expect("host");
    let e = sql_error(&host, "select sum(l_quantity) from lineitem").await;
    assert_contains(
        &e,
        &[
            "device 2",
            "table lineitem partition 2",
            "checksum mismatch",
        ],
    );
    // Other tables on the same device still work.
    host.sql("select count(*) from nation")
        .await
        .expect("nation is intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_manifest_names_the_file() {
    let (_dir, root) = scratch_root();
    let manifest = root.join("dev0/manifest.json");
    let bytes = std::fs::read(&manifest).expect("manifest");
    std::fs::write(&manifest, &bytes[..bytes.len() / 3]).expect("truncate");
    let e = error_of(host_with(&root, DeviceBudget::default()).await);
    assert_contains(&e, &["device 0", "manifest.json", "not a valid manifest"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_plans_are_errors() {
    let root = common::tpch_root(0.01, 3);
    let devices = open_root(&root, &DeviceBudget::default()).expect("devices");
    let e = error_of(
        devices[0]
            .execute(b"\x00garbage plan bytes")
            .map_err(|e| e.to_string()),
    );
    assert_contains(&e, &["device 0", "not a stage plan"]);
    let oversized = vec![b'I'; insitu_wire::PLAN_BYTES_MAX + 1];
    let e = error_of(devices[0].execute(&oversized).map_err(|e| e.to_string()));
    assert_contains(&e, &["device 0", "plan_bytes_max"]);
    // A well-formed envelope around garbage plan bytes fails on the device
    // and the error comes back through the result channel.
    let envelope = StagePlanEnvelope {
        query_id: "t".into(),
        device: 0,
        descriptors: vec![],
        result_codec: Default::default(),
        plan: b"\x0a\x05hello garbage".to_vec(),
    };
    let mut rx = devices[0].execute(&envelope.encode()).expect("accepted");
    let e = error_of(
        rx.recv()
            .await
            .expect("a message")
            .map_err(|e| e.to_string()),
    );
    assert_contains(&e, &["device 0", "stage plan does not decode"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_budget_too_small_is_resources_exhausted_naming_the_device() {
    let root = common::tpch_root(0.01, 3);
    let budget = DeviceBudget {
        mem_bytes_max: 4096,
        threads: 1,
    };
    let host = host_with(&root, budget).await.expect("host");
    let e = sql_error(
        &host,
        "select l_orderkey, l_partkey, count(*) from lineitem group by l_orderkey, l_partkey",
    )
    .await;
    assert_contains(&e, &["device", "mem_bytes_max=4096 bytes"]);
}

#[test]
fn cli_reports_errors_and_exits_nonzero() {
    let root = common::tpch_root(0.01, 3);
    let root = root.to_str().expect("utf-8 path");
    let (ok, _, err) = common::insitu(&["sql", "select * from nope", "--root", root]);
    assert!(!ok);
    assert_contains(&err, &["error:", "nope"]);
    let (ok, _, err) = common::insitu(&["sql", "select 1", "--root", root, "--link", "warp9"]);
    assert!(!ok);
    assert_contains(&err, &["unknown link profile 'warp9'"]);
    let (ok, _, err) = common::insitu(&["sql", "select 1", "--root", "/nonexistent/insitu"]);
    assert!(!ok);
    assert_contains(&err, &["/nonexistent/insitu", "not a data root"]);
    let (ok, out, err) = common::insitu(&[
        "sql",
        "select count(*) as n from nation",
        "--root",
        root,
        "--format",
        "csv",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "n\n25\n");
    assert_contains(&err, &["1 rows", "link:"]);
}

#[test]
fn gen_refuses_to_overwrite_without_replace() {
    let (_dir, root) = scratch_root();
    let root = root.to_str().expect("utf-8 path");
    let (ok, _, err) = common::insitu(&[
        "gen",
        "tpch",
        "--sf",
        "0.01",
        "--devices",
        "3",
        "--root",
        root,
    ]);
    assert!(!ok);
    assert_contains(&err, &["table lineitem already exists", "--replace"]);
    let (ok, _, err) = common::insitu(&[
        "gen",
        "tpch",
        "--sf",
        "0.01",
        "--devices",
        "4",
        "--root",
        root,
    ]);
    assert!(!ok);
    assert_contains(&err, &["already holds 3 devices"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_descriptor_version_names_device_table_and_partition() {
    let (_dir, root) = scratch_root();
    let manifest = root.join("dev1/manifest.json");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    doc["tables"]["lineitem"][0]["version"] = serde_json::json!(99);
    std::fs::write(&manifest, serde_json::to_vec(&doc).expect("json")).expect("write");
    let e = error_of(host_with(&root, DeviceBudget::default()).await);
    assert_contains(
        &e,
        &[
            "device 1",
            "table lineitem partition 1",
            "unknown version 99",
        ],
    );
}

/// The demo generates its data once and reuses it, but not when asked for
/// another scale factor than the data holds: it would report the wrong one.
#[test]
fn demo_refuses_data_of_another_scale_factor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("demo");
    let root = root.to_str().expect("utf-8 path");
    let demo = |sf: &str| common::insitu(&["demo", "--root", root, "--sf", sf, "--devices", "2"]);
    let (ok, out, err) = demo("0.01");
    assert!(ok, "{err}");
    assert_contains(
        &out,
        &[
            "## Link 1gbe",
            "## Link 10gbe",
            "| Q1 |",
            "| Q14 |",
            "x faster",
        ],
    );
    let (ok, out, err) = demo("0.01");
    assert!(ok && !err.contains("generating"), "{err}");
    assert_contains(&out, &["| Q6 |"]);
    let (ok, _, err) = demo("0.02");
    assert!(!ok);
    assert_contains(
        &err,
        &["15000 orders rows (SF 0.01), not SF 0.02", "--sf 0.01"],
    );
}
