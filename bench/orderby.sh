#!/usr/bin/env bash
# ORDER BY benchmark, competitors side by side in one run on the same Parquet:
# insitu (Parquet partitions, and hybrid partitions keyed on the sort column)
# vs DuckDB, Polars and DataFusion-Python, all columns of lineitem sorted by
# an integer, two dictionary-encoded strings, a decimal, and the integer key
# lineitem is generated in (input already sorted).
#
#   bench/orderby.sh [SF] [RUNS] [DEVICES] [THREADS] [ROUNDS]    e.g. bench/orderby.sh 1 3 2 2 3
#
# Data: TPC-H lineitem at SF on DEVICES devices (generated once under the
# insitu data directory). Every engine gets THREADS threads; insitu devices
# get THREADS/DEVICES each. With ROUNDS (default 1) above 1, the engines take
# turns ROUNDS times per key, RUNS timed runs each time, and each median is
# over all of them. Writes bench/results/orderby-sf{SF}.{md,jsonl}.
set -euo pipefail
cd "$(dirname "$0")/.."
sf="${1:-1}"
runs="${2:-3}"
devices="${3:-2}"
threads="${4:-2}"
rounds="${5:-1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
venv=bench/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet -r bench/requirements.txt
data="${INSITU_BENCH_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/insitu/bench-orderby-sf${sf}-${devices}dev}"
per_device=$(( threads / devices > 0 ? threads / devices : 1 ))
if [ ! -f "$data/parquet/dev0/manifest.json" ]; then
  "$insitu" gen tpch --sf "$sf" --devices "$devices" --root "$data/parquet" --replace
fi
for key in l_partkey l_shipmode l_shipinstruct l_extendedprice l_orderkey; do
  if [ ! -f "$data/hybrid/$key/dev0/manifest.json" ]; then
    "$insitu" load --table lineitem --devices "$devices" --root "$data/hybrid/$key" \
      --layout hybrid --hybrid-key "$key" --replace "$data"/parquet/dev*/lineitem/*.parquet
  fi
done
mkdir -p bench/results
out="bench/results/orderby-sf${sf}"
# A failed run leaves no partial results behind.
trap 'rm -f "$out.md.tmp" "$out.jsonl.tmp"' EXIT
"$venv/bin/python" bench/orderby.py --insitu "$insitu" --root "$data/parquet" \
  --hybrid-root "$data/hybrid" --runs "$runs" --rounds "$rounds" --threads "$threads" \
  --device-threads "$per_device" --out "$out.jsonl" > "$out.md.tmp"
mv "$out.md.tmp" "$out.md"
cat "$out.md"
