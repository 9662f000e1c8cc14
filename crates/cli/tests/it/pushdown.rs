//! What pushdown moves over the link, and what the CLI shows of it.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};

use insitu_host::Pushdown;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_and_limits_run_on_devices_and_shrink_link_traffic() {
    let root = common::tpch_root(0.01, 4);
    let push = common::host(&root, Pushdown::On).await;
    let pull = common::host(&root, Pushdown::Off).await;
    let q6 = common::query_sql(6);
    let (p, l) = (
        push.sql(&q6).await.expect("push"),
        pull.sql(&q6).await.expect("pull"),
    );
    // Pull moves the columns it needs; push moves partial sums and plans.
    assert!(l.stats.link_bytes_to_host > 100_000, "{:?}", l.stats);
    assert!(p.stats.link_bytes_to_host < 4_000, "{:?}", p.stats);
    assert!(p.stats.device_rows_read > 50_000, "{:?}", p.stats);

    let limited = push
        .sql("select l_orderkey, l_comment from lineitem limit 5")
        .await
        .expect("limit");
    assert_eq!(limited.stats.result_rows, 5);
    // Each device stops after its first batch instead of streaming its share.
    assert!(
        limited.stats.link_bytes_to_host < 200_000,
        "{:?}",
        limited.stats
    );

    let plan = push
        .sql("explain select l_returnflag, count(*) from lineitem where l_quantity < 10 group by l_returnflag")
        .await
        .expect("explain");
    let text = arrow::util::pretty::pretty_format_batches(&plan.batches)
        .expect("format")
        .to_string();
    assert!(
        text.contains("DeviceScanExec: devices=[0:[0], 1:[1], 2:[2], 3:[3]]"),
        "{text}"
    );
    assert!(text.contains("AggregateExec: mode=Partial"), "{text}");
    assert!(text.contains("PartitionScanExec: table=lineitem"), "{text}");
    assert!(
        text.contains("mode=FinalPartitioned") || text.contains("mode=Final"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_link_slows_pull_more_than_push() {
    let root = common::tpch_root(0.01, 4);
    let devices = |_: ()| common::open_devices(&root, &Default::default());
    let profile: insitu_link::LinkProfile = "5MB/s".parse().expect("profile");
    let host = |pushdown| {
        insitu_host::InsituHost::new(
            insitu_host::embedded_clients(devices(()), profile),
            insitu_host::HostConfig {
                pushdown,
                target_partitions: 2,
                ..Default::default()
            },
        )
    };
    let (push, pull) = (
        host(Pushdown::On).await.expect("push"),
        host(Pushdown::Off).await.expect("pull"),
    );
    let q6 = common::query_sql(6);
    let p = push.sql(&q6).await.expect("push").stats;
    let l = pull.sql(&q6).await.expect("pull").stats;
    // Pull moves > 500 kB at 5 MB/s through the shared host port: > 100 ms.
    assert!(l.link_bytes() > 500_000, "{l:?}");
    assert!(l.wall_secs > 0.1, "{l:?}");
    assert!(p.wall_secs < l.wall_secs, "push {p:?} pull {l:?}");
}

#[test]
fn interactive_prompt_runs_statements_until_eof() {
    let root = common::tpch_root(0.01, 4);
    let mut child = Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args([
            "sql",
            "--root",
            root.to_str().expect("utf-8"),
            "--format",
            "csv",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"select count(*) as n\n  from region;\nselect nope;\nselect 2 as two;\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "n\n5\ntwo\n2\n");
    assert!(
        stderr.contains("error:") && stderr.contains("nope"),
        "{stderr}"
    );
}

/// Compressed results give DuckDB's answers in fewer link bytes; `auto`
/// compresses over 1 GbE and not over an unlimited link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_results_match_duckdb_in_fewer_link_bytes() {
    use insitu_device::root::DeviceBudget;
    use insitu_host::{embedded_clients, HostConfig, InsituHost};
    use insitu_link::LinkProfile;

    let root = common::tpch_root(0.01, 4);
    let host = common::host(&root, Pushdown::On).await;
    let q3 = common::query_sql(3);
    let fx = common::fixture("tpch-sf0.01", 3);
    let mut bytes = vec![];
    for codec in ["none", "lz4", "zstd", "auto"] {
        let sql = format!("set insitu.result_compression = '{codec}'; {q3}");
        let outcome = host
            .sql(&sql)
            .await
            .unwrap_or_else(|e| panic!("{codec}: {e}"));
        common::compare(3, &outcome.batches, &fx).unwrap();
        bytes.push(outcome.stats.link_bytes_to_host);
    }
    let [none, lz4, zstd, auto] = bytes[..] else {
        unreachable!()
    };
    assert!(
        lz4 * 2 < none && zstd < lz4,
        "none {none}, lz4 {lz4}, zstd {zstd}"
    );
    assert_eq!(auto, none, "an unlimited link ships plain batches");

    let devices = common::open_devices(&root, &DeviceBudget::default());
    let gbe: LinkProfile = "1gbe".parse().unwrap();
    let slow = InsituHost::new(
        embedded_clients(devices, gbe),
        HostConfig {
            pushdown: Pushdown::On,
            target_partitions: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let outcome = slow.sql(&q3).await.unwrap();
    common::compare(3, &outcome.batches, &fx).unwrap();
    assert_eq!(
        outcome.stats.link_bytes_to_host, lz4,
        "auto picks LZ4 over 1 GbE"
    );
    let e = slow
        .sql("set insitu.result_compression = 'snappy'")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto, none, lz4, zstd"), "{e}");
}
