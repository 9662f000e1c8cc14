//! The bounded load test (slow tier): 8 concurrent clients for 30 s of
//! mixed TPC-H queries at SF 0.1 against 4 device servers on loopback.
//! `insitu bench load` fails on any query error or on a device whose
//! memory high-water mark exceeds its budget, or whose server's resident
//! memory exceeds it plus `rss_overhead_bytes`; its report is checked here.

use crate::common::{insitu, TestCluster};

#[test]
#[ignore = "slow tier: INSITU_SLOW_TESTS=1 scripts/test.sh"]
fn eight_clients_thirty_seconds_sf01_no_errors_within_memory_budget() {
    let cluster = TestCluster::up(4, &["--mem", "512MiB"]);
    cluster.gen_tpch("0.1");
    let (ok, out, err) = insitu(&[
        "bench",
        "load",
        "--cluster",
        cluster.file_arg(),
        "--clients",
        "8",
        "--secs",
        "30",
    ]);
    eprintln!("{err}");
    assert!(ok, "load test failed:\n{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json report");
    assert_eq!(report["errors"].as_array().unwrap().len(), 0);
    assert!(report["queries_ok"].as_u64().unwrap() >= 8, "{report}");
    assert_eq!(report["memory_within_budget"], true);
    for d in report["devices"].as_array().unwrap() {
        assert_eq!(d["mem_bytes_max"].as_u64(), Some(512 << 20));
        assert!(d["mem_peak_bytes"].as_u64().unwrap() > 0, "{d}");
        assert!(d["mem_peak_bytes"].as_u64().unwrap() <= 512 << 20, "{d}");
        assert_eq!(d["stages_failed"].as_u64(), Some(0), "{d}");
        let rss = d["process_rss_peak_bytes"].as_u64().unwrap();
        let overhead = insitu_host::budget::RSS_OVERHEAD_BYTES;
        assert!(rss > 0 && rss <= (512 << 20) + overhead, "{d}");
    }
}
