#!/usr/bin/env bash
# TPC-H benchmark: insitu with pushdown on and off, DuckDB and
# DataFusion-Python, on the same Parquet files in the same run: time and
# peak resident memory per query, each (engine, query) in a process of its
# own (bench/tpch.py). A query that fails is recorded as failed and the run
# goes on.
#
#   bench/tpch.sh [SF] [QUERIES] [RUNS]      e.g. bench/tpch.sh 10 all 3
#
# Generates TPC-H at SF on 4 devices once (under the insitu data directory,
# or INSITU_BENCH_DATA), writes bench/results/tpch-sf{SF}-{LINK}.memory.{json,md}.
# LINK (default 10gbe) is the emulated link insitu's devices sit behind.
# LINKS="unlimited pcie3x4 10gbe sata3 1gbe" adds, for each link, `insitu
# bench tpch` (pushdown against pull in one process, link bytes) with
# bench/compare.py's DuckDB and DataFusion-Python columns.
set -euo pipefail
cd "$(dirname "$0")/.."
sf="${1:-1}"
queries="${2:-all}"
runs="${3:-3}"
link="${LINK:-10gbe}"
links="${LINKS:-}"
out="${INSITU_BENCH_OUT:-bench/results}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
venv=bench/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet -r bench/requirements.txt
data="${INSITU_BENCH_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/insitu/bench-tpch-sf${sf}-4dev}"
if [ ! -f "$data/dev3/manifest.json" ] || ! grep -q lineitem "$data/dev3/manifest.json"; then
  "$insitu" gen tpch --sf "$sf" --devices 4 --root "$data" --replace
fi
"$venv/bin/python" bench/tpch.py --root "$data" --sf "$sf" --queries "$queries" \
  --runs "$runs" --link "$link" --insitu "$insitu" --out "$out"
for l in $links; do
  "$insitu" bench tpch --sf "$sf" --devices 4 --root "$data" --link "$l" \
    --queries "$queries" --runs "$runs" --out "$out"
  "$venv/bin/python" bench/compare.py "$out/tpch-sf${sf}-4dev-${l}.json"
done
