#!/usr/bin/env bash
# Selectivity sweep: sum(l_extendedprice) over the lineitem rows a filter
# keeps (a = 0.001, 0.01, 0.1, 0.5, 1) on every link profile, pushdown on,
# off and auto, with the cost model's predictions and a plot
# (bench/selectivity.py).
#
#   bench/selectivity.sh [SF] [RUNS]        e.g. bench/selectivity.sh 10 3
#
# Generates TPC-H at SF on 4 devices once (the same root bench/tpch.sh uses),
# writes bench/results/selectivity-sf{SF}.{json,md,svg}. LINKS and FRACTIONS
# (comma-separated) narrow the sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
sf="${1:-1}"
runs="${2:-3}"
out="${INSITU_BENCH_OUT:-bench/results}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
data="${INSITU_BENCH_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/insitu/bench-tpch-sf${sf}-4dev}"
if [ ! -f "$data/dev3/manifest.json" ] || ! grep -q lineitem "$data/dev3/manifest.json"; then
  "$insitu" gen tpch --sf "$sf" --devices 4 --root "$data" --replace
fi
python3 bench/selectivity.py --root "$data" --sf "$sf" --runs "$runs" --insitu "$insitu" \
  --out "$out" ${LINKS:+--links "$LINKS"} ${FRACTIONS:+--fractions "$FRACTIONS"}
