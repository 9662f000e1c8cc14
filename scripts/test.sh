#!/usr/bin/env bash
# The test command: formatting, lints, doc links, then every test of the
# workspace in release mode (the same build the CLI uses).
# INSITU_SLOW_TESTS=1 adds the slower TPC-H SF 0.1 tier, the load test of
# device servers, and every benchmark run once at a tiny size (the
# end-to-end ones need python3 to make bench/.venv with the pinned
# competitors).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo fmt --all -- --check
# The crate graph's layers: the host never depends on a device crate.
scripts/check_layers.sh
cargo clippy --release --workspace --all-targets -- -D warnings
# Doc links that do not resolve (or name private items) fail like lints.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo test --release --workspace
if [ "${INSITU_SLOW_TESTS:-0}" = "1" ]; then
  # One at a time: the load test's 30 s of clients must not share the
  # cores with the SF 0.1 suite.
  cargo test --release -p insitu --test it -- --ignored --nocapture --test-threads=1
  # The kernel benchmarks live outside the workspace (their competitor
  # crates stay out of the product build); run each once so they do not rot.
  bench_target="$CARGO_TARGET_DIR/bench-kernels"
  cargo fmt --manifest-path bench/kernels/Cargo.toml -- --check
  CARGO_TARGET_DIR="$bench_target" cargo clippy --release --manifest-path bench/kernels/Cargo.toml --all-targets -- -D warnings
  CARGO_TARGET_DIR="$bench_target" cargo bench --manifest-path bench/kernels/Cargo.toml --bench kernels -- --test
  CARGO_TARGET_DIR="$bench_target" cargo run --release --manifest-path bench/kernels/Cargo.toml --bin sortbench -- --rows 100000 --reps 1
  # The end-to-end benchmarks at tiny sizes, so neither they nor the
  # competitors' APIs they call rot (bench/.venv is made on first use).
  # orderby.py fails if the engines return different row counts.
  smoke=$(mktemp -d)
  trap 'rm -rf "$smoke"' EXIT
  INSITU_BENCH_DATA="$smoke/orderby" bench/orderby.sh 0.01 1 2 2
  # All 22 TPC-H queries, every engine and mode; fails on a failed query
  # or a row count other than DuckDB's.
  # LINKS adds `insitu bench tpch` (push, pull and auto in one process).
  INSITU_BENCH_DATA="$smoke/tpch" INSITU_BENCH_OUT="$smoke/tpch-results" LINKS=1gbe \
    bench/tpch.sh 0.01 all 1
  # The selectivity sweep on the same data, two links and two fractions;
  # fails if the modes return different row counts.
  INSITU_BENCH_DATA="$smoke/tpch" INSITU_BENCH_OUT="$smoke/tpch-results" LINKS=1gbe,unlimited \
    FRACTIONS=0.01,1 bench/selectivity.sh 0.01 1
  # 128 MiB: DuckDB 2.0's ORDER BY ran out of memory at its 64 MiB limit
  # on these 38 MiB (and at 96 MiB on 114 MiB); insitu's merge paths are
  # covered by the extsort tests.
  INSITU_BENCH_SETTLE_SECS=0 bench/extsort.sh 400000 128 1 "$smoke/extsort"
fi
