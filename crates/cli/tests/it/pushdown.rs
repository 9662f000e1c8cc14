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
            insitu_device::embedded_clients(devices(()), profile),
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

/// Over 1 GbE the cost model pulls a scan that keeps every row (its
/// stored pages are smaller than its Arrow rows) and pushes one that
/// keeps 0.1% of them; EXPLAIN shows every candidate's prediction, and
/// the answers are push's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_pulls_a_scan_keeping_every_row_and_pushes_a_selective_one() {
    use insitu_device::root::DeviceBudget;
    use insitu_host::{HostConfig, InsituHost};
    use insitu_wire::{StageStarts, StartCost};
    let root = common::tpch_root(0.01, 4);
    let link: insitu_link::LinkProfile = "1gbe".parse().expect("link");
    // Equal starts both ways, so that the rows a stage keeps decide: at SF
    // 0.01 a scan is small enough that measured starts, which move with
    // the machine's load, would.
    let mut profile = insitu_calibrate::measure_host_profile(2);
    let start = StartCost {
        once_secs: 1e-3,
        per_device_secs: 0.0,
    };
    profile.stage_starts.insert(
        "1gbe".into(),
        StageStarts {
            push: start,
            pull: start,
        },
    );
    let devices = common::open_devices(&root, &DeviceBudget::default());
    let config = HostConfig {
        pushdown: Pushdown::Auto,
        target_partitions: 2,
        profile: Some(profile),
        ..Default::default()
    };
    let auto = InsituHost::new(insitu_device::embedded_clients(devices, link), config)
        .await
        .expect("auto host");
    let push = common::host(&root, Pushdown::On).await;
    let explain = |sql: String| {
        let auto = &auto;
        async move {
            let out = auto.sql(&format!("explain {sql}")).await.expect("explain");
            arrow::util::pretty::pretty_format_batches(&out.batches)
                .expect("format")
                .to_string()
        }
    };
    let every_row = "select l_shipdate, l_returnflag, l_shipmode, l_quantity from lineitem";
    let text = explain(every_row.into()).await;
    assert!(
        text.contains("PlacementExec: placement=pull (predicted pull: "),
        "{text}"
    );
    assert!(!text.contains("DeviceScanExec"), "{text}");
    // l_orderkey runs from 1 to 60,000 at SF 0.01.
    let selective = "select sum(l_extendedprice) as s from lineitem where l_orderkey < 60";
    let text = explain(selective.into()).await;
    assert!(text.contains("DeviceScanExec"), "{text}");
    // EXPLAIN weighs plain results against compressed ones; one row of
    // result gains nothing from compressing.
    assert!(text.contains("placement=push (predicted pull: "), "{text}");
    assert!(text.contains(", push lz4: "), "{text}");
    assert!(text.contains(", push zstd: "), "{text}");
    assert!(!text.contains("PlacementExec"), "{text}");
    for sql in [every_row, selective] {
        let a = auto.sql(sql).await.expect("auto");
        let p = push.sql(sql).await.expect("push");
        assert_eq!(a.stats.result_rows, p.stats.result_rows, "{sql}");
        let render = |b: &[arrow::record_batch::RecordBatch]| {
            let mut rows: Vec<String> = arrow::util::pretty::pretty_format_batches(b)
                .expect("format")
                .to_string()
                .lines()
                .map(str::to_string)
                .collect();
            rows.sort();
            rows
        };
        assert_eq!(render(&a.batches), render(&p.batches), "{sql}");
        assert_eq!(a.stats.placements.len(), 1, "{sql}");
    }
    // The pulled scan moved its pages; the pushed one almost nothing.
    let pulled = auto.sql(every_row).await.expect("auto");
    let pushed = auto.sql(selective).await.expect("auto");
    assert!(
        pulled.stats.link_bytes_to_host > 100_000,
        "{:?}",
        pulled.stats
    );
    assert!(
        pushed.stats.link_bytes_to_host < 5_000,
        "{:?}",
        pushed.stats
    );
    let measured = pushed.stats.placements[0].measured_secs;
    assert!(measured.is_some_and(|s| s > 0.0), "{:?}", pushed.stats);
    // Each stage runs on its own too, pulled or pushed, as placed in the
    // query; that is what the model's predictions are checked against.
    for (sql, placed) in [(every_row, "pull"), (selective, "push")] {
        let alone = auto.time_stages(sql).await.expect("stages alone");
        assert_eq!(alone.len(), 1, "{sql}");
        assert_eq!(alone[0].choice.chosen.name(), placed, "{sql}");
        assert!(alone[0].alone_secs.is_some_and(|s| s > 0.0), "{alone:?}");
    }
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
/// compresses the stages whose plain results would outweigh their pages,
/// and every stage over 1 GbE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_results_match_duckdb_in_fewer_link_bytes() {
    use insitu_device::embedded_clients;
    use insitu_device::root::DeviceBudget;
    use insitu_host::{HostConfig, InsituHost};
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
    // Even over an unlimited link, the lineitem scan's plain results
    // would outweigh the pages pull would move: they travel compressed.
    assert!(
        lz4 <= auto && auto < none,
        "auto {auto}, lz4 {lz4}, none {none}"
    );

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
    // Over 1 GbE the model compresses every stage whose results are worth
    // it; a stage of a few rows may stay plain.
    let slow_bytes = outcome.stats.link_bytes_to_host;
    assert!(
        slow_bytes <= lz4 + lz4 / 20,
        "auto over 1 GbE moved {slow_bytes}, all-LZ4 {lz4}"
    );
    let e = slow
        .sql("set insitu.result_compression = 'snappy'")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto, none, lz4, zstd"), "{e}");
}

/// `insitu simulate` projects a measured auto run: SmartSSD-like devices
/// keep a pushed scan's time flat as devices (and their data) are added,
/// while pulling grows with them; a report without stages is refused.
#[test]
fn simulate_projects_a_measured_run_to_more_devices() {
    let root = common::tpch_root(0.01, 4);
    let dir = tempfile::tempdir().unwrap();
    let q6 = common::query_sql(6);
    let (ok, out, err) = common::insitu(&[
        "bench",
        "sql",
        &q6,
        "--runs",
        "1",
        "--pushdown",
        "auto",
        "--link",
        "10gbe",
        "--root",
        root.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let report = dir.path().join("q6.json");
    std::fs::write(&report, out).unwrap();
    let out_dir = dir.path().join("sim");
    let (ok, _, err) = common::insitu(&[
        "simulate",
        report.to_str().unwrap(),
        "--devices",
        "1,4,16",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let csv = std::fs::read_to_string(out_dir.join("devices.csv")).unwrap();
    let rows: Vec<Vec<String>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let secs = |machine: &str, n: &str, col: usize| -> f64 {
        rows.iter()
            .find(|r| r[0] == machine && r[1] == n)
            .unwrap_or_else(|| panic!("{machine} {n} in {csv}"))[col]
            .parse()
            .unwrap()
    };
    let (push, pull) = (2, 3);
    let flat = secs("SmartSSD-like", "16", push) / secs("SmartSSD-like", "1", push);
    assert!((0.9..1.1).contains(&flat), "{csv}");
    assert!(
        secs("SmartSSD-like", "16", pull) > 8.0 * secs("SmartSSD-like", "1", pull),
        "{csv}"
    );
    for file in [
        "devices.svg",
        "selectivity.svg",
        "links.svg",
        "selectivity.csv",
        "links.csv",
    ] {
        let text = std::fs::read_to_string(out_dir.join(file)).unwrap();
        assert!(text.len() > 100, "{file}: {text}");
    }
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "{\"queries\": []}").unwrap();
    let (ok, _, err) = common::insitu(&["simulate", empty.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("holds no placed stages"), "{err}");
}
