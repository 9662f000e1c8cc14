//! Memory budgets: queries spill within a small host budget and still
//! give DuckDB's answers; a budget too small fails clearly and the host
//! keeps serving; the peaks are reported; budgets hold as resident memory.

use std::path::Path;

use insitu_device::embedded_clients;
use insitu_device::root::DeviceBudget;
use insitu_host::{HostConfig, InsituHost, JoinChoice, Pushdown};
use insitu_link::LinkProfile;

use crate::common;

/// A host over `root` whose operators may reserve `mem_bytes_max`.
async fn host_with_memory(
    root: &Path,
    pushdown: Pushdown,
    mem_bytes_max: usize,
    spill_root: &Path,
) -> InsituHost {
    let devices = common::open_devices(root, &DeviceBudget::default());
    InsituHost::new(
        embedded_clients(devices, LinkProfile::UNLIMITED),
        HostConfig {
            pushdown,
            target_partitions: 2,
            mem_bytes_max,
            spill_root: spill_root.to_path_buf(),
            ..Default::default()
        },
    )
    .await
    .expect("host")
}

/// Q18 and Q21 at SF 0.1 in 16 MiB of host memory: their joins,
/// aggregates and sorts spill, and the answers are DuckDB's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q18_and_q21_spill_within_a_small_host_budget_and_match_duckdb() {
    let root = common::tpch_root(0.1, 4);
    for pushdown in [Pushdown::On, Pushdown::Off] {
        let spill = tempfile::tempdir().unwrap();
        let host = host_with_memory(&root, pushdown, 16 << 20, spill.path()).await;
        for q in [18, 21] {
            let outcome = host
                .sql(&common::query_sql(q))
                .await
                .unwrap_or_else(|e| panic!("Q{q} {pushdown:?}: {e}"));
            let fx = common::fixture("tpch-sf0.1", q);
            common::compare(q, &outcome.batches, &fx).unwrap();
            let s = &outcome.stats;
            assert!(
                s.host_spilled_bytes > 0,
                "Q{q} {pushdown:?} spilled nothing: {}",
                s.memory_summary()
            );
            assert!(s.host_mem_peak_bytes <= s.host_mem_bytes_max);
            assert_eq!(s.host_mem_bytes_max, 16 << 20);
        }
        let left: Vec<_> = std::fs::read_dir(host.memory().spill_dir())
            .unwrap()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .collect();
        assert!(
            left.is_empty(),
            "spill files outlived their queries: {left:?}"
        );
    }
}

/// A budget no plan fits fails with an error naming the budget and an
/// operator, and the same host answers the next query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_too_small_fails_clearly_and_the_host_answers_the_next_query() {
    let root = common::tpch_root(0.1, 4);
    let spill = tempfile::tempdir().unwrap();
    let host = host_with_memory(&root, Pushdown::On, 1 << 20, spill.path()).await;
    let e = host
        .sql(&common::query_sql(18))
        .await
        .expect_err("1 MiB cannot hold Q18")
        .to_string();
    assert!(
        e.contains("host memory budget of 1.00 MiB is too small"),
        "{e}"
    );
    assert!(e.contains("could not reserve"), "names the operator: {e}");
    assert!(e.contains("--host-mem"), "says what to do: {e}");
    let next = host
        .sql("select count(*) from nation")
        .await
        .expect("the host still answers");
    assert_eq!(next.stats.result_rows, 1);
}

/// The interactive prompt reports the error and answers the next statement.
#[test]
fn the_prompt_survives_a_query_that_outgrows_the_host_budget() {
    use std::io::Write;
    let root = common::tpch_root(0.1, 4);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args(["sql", "--format", "csv", "--host-mem", "1MiB", "--root"])
        .arg(&root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the prompt");
    let script = format!(
        "{};\nselect 40 + 2 as answer;\n\\q\n",
        common::query_sql(18).trim().trim_end_matches(';')
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("is too small for this query"), "{stderr}");
    assert!(stdout.contains("answer\n42"), "{stdout}\n{stderr}");
}

/// A hash join whose build side outgrows the budget is planned again
/// with sort-merge joins, and the answers stay DuckDB's; forcing either
/// strategy with `SET insitu.join_strategy` gives the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_strategies_give_duckdbs_answers() {
    let root = common::tpch_root(0.01, 4);
    for choice in [JoinChoice::SortMerge, JoinChoice::Hash] {
        let devices = common::open_devices(&root, &DeviceBudget::default());
        let host = InsituHost::new(
            embedded_clients(devices, LinkProfile::UNLIMITED),
            HostConfig {
                target_partitions: 2,
                join_strategy: choice,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let failures = common::check_all(&host, "tpch-sf0.01").await;
        assert!(failures.is_empty(), "{choice}:\n{}", failures.join("\n"));
    }
    let host = common::host(&root, Pushdown::On).await;
    host.sql("set insitu.join_strategy = 'sort_merge'")
        .await
        .unwrap();
    let plan = host
        .sql(&format!("explain {}", common::query_sql(3)))
        .await
        .unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&plan.batches)
        .unwrap()
        .to_string();
    assert!(text.contains("SortMergeJoinExec"), "SET lasts: {text}");
    let e = host
        .sql("set insitu.join_strategy = 'grace'")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto, hash, sort_merge"), "{e}");
}

/// A join whose build side the planner underestimates (`<>` on a comment
/// is guessed to keep a fifth of the rows; it keeps them all) runs out of
/// a 12 MiB budget as a hash join: the host plans it again with
/// sort-merge joins, says so, and answers as it does with room to spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_join_that_runs_out_of_memory_is_planned_again() {
    let root = common::tpch_root(0.1, 4);
    let sql = "select o_orderpriority, count(*) as n, sum(l_quantity) as q \
        from orders join lineitem on o_orderkey = l_orderkey \
        where o_comment <> 'x' and l_comment <> 'x' \
        group by o_orderpriority order by o_orderpriority";
    let spill = tempfile::tempdir().unwrap();
    let roomy = host_with_memory(&root, Pushdown::On, 256 << 20, spill.path()).await;
    let expected = roomy.sql(sql).await.unwrap();
    assert!(expected.stats.replanned.is_none());
    let tight = host_with_memory(&root, Pushdown::On, 12 << 20, spill.path()).await;
    let outcome = tight.sql(sql).await.unwrap();
    assert_eq!(outcome.batches, expected.batches);
    assert_eq!(outcome.stats.result_rows, 5);
    let summary = outcome.stats.memory_summary();
    assert!(
        summary
            .contains("re-planned: a hash join's build side outgrew the host budget of 12.00 MiB"),
        "{summary}"
    );
}

/// The footer and EXPLAIN ANALYZE report the host's and every device's peak.
#[test]
fn the_footer_and_explain_analyze_report_memory_peaks() {
    let root = common::tpch_root(0.01, 4);
    let root = root.to_str().unwrap();
    let q = common::query_sql(3);
    let (ok, _, err) = common::insitu(&[
        "sql",
        "--root",
        root,
        "--pushdown",
        "on",
        "--format",
        "csv",
        &q,
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("memory: host peak "), "{err}");
    assert!(err.contains("device peaks 0: "), "{err}");
    let analyze = format!("explain analyze {q}");
    let (ok, out, err) = common::insitu(&[
        "sql",
        "--root",
        root,
        "--pushdown",
        "on",
        "--format",
        "csv",
        &analyze,
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("Memory,\"host peak "), "{out}");
    assert!(out.contains("device_mem_peak="), "{out}");
}

/// Budgets in the root's `insitu-root.json` apply, flags override them,
/// and a misspelt setting is refused by name.
#[test]
fn root_settings_set_budgets_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let root_arg = root.to_str().unwrap();
    let (ok, _, err) = common::insitu(&[
        "gen",
        "tpch",
        "--sf",
        "0.01",
        "--devices",
        "2",
        "--root",
        root_arg,
    ]);
    assert!(ok, "{err}");
    let file = root.join("insitu-root.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    meta["host_mem"] = "300MiB".into();
    std::fs::write(&file, serde_json::to_vec(&meta).unwrap()).unwrap();
    let q = "select count(*) from orders";
    let (ok, _, err) = common::insitu(&["sql", "--root", root_arg, q]);
    assert!(ok, "{err}");
    assert!(err.contains("of 300.00 MiB"), "{err}");
    let (ok, _, err) = common::insitu(&["sql", "--root", root_arg, "--host-mem", "200MiB", q]);
    assert!(ok, "{err}");
    assert!(err.contains("of 200.00 MiB"), "{err}");
    // Generating again keeps the user's setting.
    let (ok, _, err) = common::insitu(&[
        "gen",
        "tpch",
        "--sf",
        "0.01",
        "--devices",
        "2",
        "--replace",
        "--root",
        root_arg,
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::insitu(&["sql", "--root", root_arg, q]);
    assert!(ok && err.contains("of 300.00 MiB"), "{err}");
    meta["host_memory"] = "1GiB".into();
    std::fs::write(&file, serde_json::to_vec(&meta).unwrap()).unwrap();
    let (ok, _, err) = common::insitu(&["sql", "--root", root_arg, q]);
    assert!(!ok);
    assert!(
        err.contains("host_memory"),
        "names the unknown setting: {err}"
    );
}

/// Without flags, the host's and the devices' budgets together stay
/// within 80% of this machine's memory.
#[test]
fn default_budgets_fit_this_machine() {
    let root = common::tpch_root(0.01, 4);
    let root = root.to_str().unwrap();
    let (ok, out, err) =
        common::insitu(&["bench", "sql", "select 1", "--runs", "1", "--root", root]);
    assert!(ok, "{err}");
    let result: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let budgets = result["budgets_bytes"].as_u64().unwrap();
    let machine = insitu_host::budget::machine_memory_bytes().expect("machine memory");
    assert!(budgets > 0);
    assert!(
        budgets <= machine / 100 * insitu_host::budget::BUDGETS_SHARE_OF_MEMORY_PERCENT,
        "budgets {budgets} on a machine of {machine}"
    );
}

/// Peak resident memory stays within the process's budgets plus the
/// documented overhead, with budgets small enough that operators hit them.
#[test]
fn resident_memory_stays_within_the_budgets_and_the_overhead() {
    let root = common::tpch_root(0.1, 4);
    let root = root.to_str().unwrap();
    for q in [9, 18, 21] {
        let sql = common::query_sql(q);
        let args = [
            "bench",
            "sql",
            &sql,
            "--runs",
            "1",
            "--root",
            root,
            "--host-mem",
            "48MiB",
            "--mem",
            "64MiB",
        ];
        let (ok, out, err) = common::insitu(&args);
        assert!(ok, "Q{q}: {err}");
        let result: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let rss = result["peak_rss_bytes"].as_u64().unwrap();
        let budgets = result["budgets_bytes"].as_u64().unwrap();
        assert_eq!(budgets, (48 << 20) + 4 * (64 << 20));
        let limit = budgets + insitu_host::budget::RSS_OVERHEAD_BYTES;
        assert!(
            rss <= limit,
            "Q{q}: peak RSS {rss} above budgets {budgets} plus overhead ({}): {}",
            insitu_host::budget::RSS_OVERHEAD_BYTES,
            result["memory"]
        );
    }
}

/// A device server whose budget a stage outgrows answers with an error
/// naming the device and its budget, and goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_server_survives_a_stage_past_its_budget() {
    let cluster = common::TestCluster::up(1, &["--mem", "4096"]);
    let csv = cluster.root.path().join("t.csv");
    let rows: String = (0..2000).map(|i| format!("{i},{}\n", i % 7)).collect();
    std::fs::write(&csv, format!("x,y\n{rows}")).unwrap();
    cluster.load("t", &csv);
    let push = cluster.host(Pushdown::On).await;
    let e = push
        .sql("select x, count(*) from t group by x")
        .await
        .expect_err("4096 bytes cannot hold the stage")
        .to_string();
    assert!(e.contains("device 0"), "{e}");
    assert!(e.contains("mem_bytes_max=4096 bytes"), "{e}");
    let pid = cluster.pid(0);
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the server lives"
    );
    let pull = cluster.host(Pushdown::Off).await;
    let outcome = pull
        .sql("select count(*) as n, sum(y) as s from t")
        .await
        .expect("the server still serves");
    let text = arrow::util::pretty::pretty_format_batches(&outcome.batches)
        .unwrap()
        .to_string();
    assert!(text.contains("2000") && text.contains("5995"), "{text}");
}

/// The EXPLAIN ANALYZE text of `query` after the statement `set`.
async fn explain_analyze(host: &InsituHost, set: &str, query: &str) -> String {
    let analyze = host
        .sql(&format!("{set}; explain analyze {query}"))
        .await
        .expect("explain analyze");
    arrow::util::pretty::pretty_format_batches(&analyze.batches)
        .expect("format")
        .to_string()
}

/// The largest `build_input_rows` of the hash joins in an EXPLAIN
/// ANALYZE text ("build_input_rows=1.50 K").
fn largest_build_rows(explain: &str) -> f64 {
    largest_metric(explain, "build_input_rows")
}

/// The largest value of metric `name` in an EXPLAIN ANALYZE text
/// ("name=1.50 K"), 0 without one.
fn largest_metric(explain: &str, name: &str) -> f64 {
    let key = format!("{name}=");
    explain
        .match_indices(&key)
        .filter(|(at, _)| {
            let before = explain[..*at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, _)| &explain[at + key.len()..])
        .map(|rest| {
            let mut words = rest
                .split([',', ']'])
                .next()
                .unwrap_or("")
                .split_whitespace();
            let number: f64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0.0);
            match words.next() {
                Some("K") => number * 1e3,
                Some("M") => number * 1e6,
                Some("B") => number * 1e9,
                _ => number,
            }
        })
        .fold(0.0, f64::max)
}

/// The largest `output_rows` of the EXPLAIN ANALYZE lines holding `operator`.
fn output_rows_of(explain: &str, operator: &str) -> f64 {
    explain
        .lines()
        .filter(|line| line.contains(operator))
        .map(|line| largest_metric(line, "output_rows"))
        .fold(0.0, f64::max)
}

/// Q7 joins its nations to suppliers and customers before orders and
/// lineitem meet them, so no hash table holds all orders; the written
/// order (`insitu.reorder_joins = false`) builds one on 15,000 orders
/// at SF 0.01. Both give the same rows. Join filters are off: how many
/// rows they drop before a build depends on which build finishes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_joins_build_smaller_hash_tables_with_the_same_answers() {
    let root = common::tpch_root(0.01, 4);
    let q7 = common::query_sql(7);
    let mut builds = Vec::new();
    let mut answers = Vec::new();
    for reorder in [true, false] {
        let host = common::host(&root, Pushdown::On).await;
        host.sql("set datafusion.optimizer.enable_join_dynamic_filter_pushdown = false")
            .await
            .expect("set");
        let set = format!("set insitu.reorder_joins = {reorder}");
        let text = explain_analyze(&host, &set, &q7).await;
        builds.push(largest_build_rows(&text));
        let out = host.sql(&q7).await.expect("q7");
        answers.push(
            arrow::util::pretty::pretty_format_batches(&out.batches)
                .expect("format")
                .to_string(),
        );
    }
    assert!(builds[1] >= 15_000.0, "written order builds {}", builds[1]);
    assert!(
        builds[0] * 4.0 < builds[1],
        "reordered builds {} rows, written {}",
        builds[0],
        builds[1]
    );
    assert_eq!(answers[0], answers[1]);
}

/// Q20's semi join keeps the partsupp rows of few parts; its dynamic filter
/// drops the lineitem groups of other parts as the devices' results
/// arrive, so the final aggregate holds far fewer groups than without it.
/// Both give DuckDB's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_filters_drop_device_results_before_the_host_aggregates_them() {
    let root = common::tpch_root(0.01, 4);
    let q20 = common::query_sql(20);
    let mut groups = Vec::new();
    for dynamic in [true, false] {
        let host = common::host(&root, Pushdown::On).await;
        let set =
            format!("set datafusion.optimizer.enable_join_dynamic_filter_pushdown = {dynamic}");
        let text = explain_analyze(&host, &set, &q20).await;
        let dropped = largest_metric(&text, "result_filter_dropped_rows");
        assert_eq!(dropped > 0.0, dynamic, "dropped {dropped} rows:\n{text}");
        assert_eq!(
            text.contains("result_filter=[DynamicFilter"),
            dynamic,
            "{text}"
        );
        groups.push(output_rows_of(
            &text,
            "AggregateExec: mode=FinalPartitioned, gby=[l_partkey",
        ));
        let out = host.sql(&q20).await.expect("q20");
        common::compare(20, &out.batches, &common::fixture("tpch-sf0.01", 20)).expect("q20 rows");
    }
    assert!(
        groups[1] > 1000.0,
        "without the filter: {} groups",
        groups[1]
    );
    assert!(
        groups[0] * 10.0 < groups[1],
        "with the filter {} groups, without {}",
        groups[0],
        groups[1]
    );
}
