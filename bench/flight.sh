#!/usr/bin/env bash
# Protocol overhead of device servers: the same TPC-H queries on the same
# data through 4 embedded devices and through 4 local `insitu device serve`
# processes (Arrow Flight over loopback), in one run.
#
#   bench/flight.sh [SF] [QUERIES] [RUNS]      e.g. bench/flight.sh 1 1,6,14 5
#
# Writes bench/results/tpch-sf{SF}-4dev-unlimited.json (embedded),
# tpch-sf{SF}-4dev-flight-unlimited.json (servers) and flight-sf{SF}.md.
set -euo pipefail
cd "$(dirname "$0")/.."
sf="${1:-1}"
queries="${2:-1,6,14}"
runs="${3:-5}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
root="${XDG_DATA_HOME:-$HOME/.local/share}/insitu/bench-tpch-sf${sf}-4dev"
# Embedded first (generates the data once), then the same directories served.
"$insitu" bench tpch --sf "$sf" --devices 4 --link unlimited --queries "$queries" --runs "$runs" --root "$root" --out bench/results
"$insitu" cluster up --devices 4 --root "$root" >/dev/null
trap '"$insitu" cluster down --root "$root"' EXIT
"$insitu" bench tpch --sf "$sf" --link unlimited --queries "$queries" --runs "$runs" --cluster "$root/cluster.toml" --out bench/results
python3 bench/flight_compare.py \
  "bench/results/tpch-sf${sf}-4dev-unlimited.json" \
  "bench/results/tpch-sf${sf}-4dev-flight-unlimited.json" | tee "bench/results/flight-sf${sf}.md"
