#!/usr/bin/env bash
# Kernel benchmark, competitors side by side in one run: argsort of random
# u64 keys (insitu radix vs std, rdst, voracious_radix_sort, numpy, Polars),
# gather and dictionary decode next to a STREAM-like copy.
#
#   bench/sort.sh [ROWS] [REPS] [THREADS]      e.g. bench/sort.sh 100000000 5 2
#
# Writes bench/results/sortbench-{ROWS}.md (table) and .jsonl (one line per row).
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-100000000}"
reps="${2:-5}"
threads="${3:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/bench-kernels"
cargo build --release --quiet --manifest-path bench/kernels/Cargo.toml --bin sortbench
venv=bench/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet -r bench/requirements.txt
mkdir -p bench/results
out="bench/results/sortbench-${rows}"
# A failed run leaves no partial results behind.
trap 'rm -f "$out.md.tmp" "$out.jsonl.tmp"' EXIT
"$CARGO_TARGET_DIR/release/sortbench" --rows "$rows" --reps "$reps" --threads "$threads" \
  --python "$venv/bin/python" > "$out.md.tmp" 2> "$out.jsonl.tmp"
mv "$out.md.tmp" "$out.md"
mv "$out.jsonl.tmp" "$out.jsonl"
cat "$out.md"
