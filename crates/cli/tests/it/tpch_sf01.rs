//! The slower tier: all 22 TPC-H queries at SF 0.1 on 4 devices, pushdown
//! on and off, against DuckDB's answers (tests/fixtures/tpch-sf0.1).
//! Ignored by default; `INSITU_SLOW_TESTS=1 scripts/test.sh` runs it.

use crate::common;

use insitu_host::Pushdown;

async fn check(devices: u32, pushdown: Pushdown) {
    let root = common::tpch_root(0.1, devices);
    let host = common::host(&root, pushdown).await;
    let failures = common::check_all(&host, "tpch-sf0.1").await;
    assert!(
        failures.is_empty(),
        "{devices} devices, {pushdown:?}:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow tier: run with --ignored"]
async fn sf01_four_devices_pushdown_on() {
    check(4, Pushdown::On).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow tier: run with --ignored"]
async fn sf01_four_devices_pushdown_off() {
    check(4, Pushdown::Off).await;
}
