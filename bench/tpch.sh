#!/usr/bin/env bash
# TPC-H benchmark: insitu pushdown vs pull on every link profile, with
# DuckDB and DataFusion-Python on the same Parquet files in the same run.
#
#   bench/tpch.sh [SF] [QUERIES] [RUNS]      e.g. bench/tpch.sh 10 1,6,14 3
#
# Generates TPC-H at SF on 4 devices once (under the insitu data directory),
# writes bench/results/tpch-sf{SF}-4dev-{link}.{json,md} and *.compare.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
sf="${1:-1}"
queries="${2:-1,6,14}"
runs="${3:-3}"
links="${LINKS:-unlimited pcie3x4 10gbe sata3 1gbe}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/insitu-target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
venv=bench/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet -r bench/requirements.txt
for link in $links; do
  "$insitu" bench tpch --sf "$sf" --devices 4 --link "$link" --queries "$queries" --runs "$runs" --out bench/results
  "$venv/bin/python" bench/compare.py "bench/results/tpch-sf${sf}-4dev-${link}.json"
done
