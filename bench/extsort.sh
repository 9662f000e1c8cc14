#!/usr/bin/env bash
# External sort benchmark, competitors side by side in one run on the same
# records: insitu extsort vs GNU sort (LC_ALL=C, -S the same memory,
# --parallel=2) vs DuckDB ORDER BY (memory_limit the same, 2 threads), next
# to the I/O floor and the model's predicted phase times.
#
#   bench/extsort.sh [RECORDS] [MEM_MIB] [RUNS] [DIR]    e.g. bench/extsort.sh 80000000 2048 3
#
# RECORDS 100-byte ASCII TeraSort records (default 80M = 8 GB) are made
# once with `insitu gensort --ascii` under DIR (default: the insitu data
# directory); outputs and temp runs go to DIR too, so it needs about 3x the
# data free. Writes bench/results/extsort-{RECORDS}.{md,jsonl}.
# INSITU_BENCH_SETTLE_SECS sets the rest before each run (default 20 s).
set -euo pipefail
cd "$(dirname "$0")/.."
records="${1:-80000000}"
mem_mib="${2:-2048}"
runs="${3:-3}"
dir="${4:-${INSITU_BENCH_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/insitu}/bench-extsort}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --quiet
insitu="$CARGO_TARGET_DIR/release/insitu"
venv=bench/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet -r bench/requirements.txt
mkdir -p "$dir"
input="$dir/records-$records.ascii"
if [ ! -f "$input" ]; then
  "$insitu" gensort "$records" "$input" --ascii
fi
mkdir -p bench/results
out="bench/results/extsort-$records"
# A failed run leaves no partial results behind.
trap 'rm -f "$out.md.tmp" "$out.jsonl.tmp"' EXIT
"$venv/bin/python" bench/extsort.py --insitu "$insitu" --input "$input" --work "$dir/work" \
  --mem-mib "$mem_mib" --runs "$runs" --settle-secs "${INSITU_BENCH_SETTLE_SECS:-20}" \
  --out "$out.jsonl" > "$out.md.tmp"
mv "$out.md.tmp" "$out.md"
cat "$out.md"
