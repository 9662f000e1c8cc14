#!/usr/bin/env bash
# The test command: formatting, lints, then every test of the workspace in
# release mode (the same build the CLI uses). INSITU_SLOW_TESTS=1 adds the
# slower TPC-H SF 0.1 tier and the load test of device servers.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/insitu-target}"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
if [ "${INSITU_SLOW_TESTS:-0}" = "1" ]; then
  cargo test --release -p insitu --test tpch_sf01 --test load_test -- --ignored --nocapture
fi
