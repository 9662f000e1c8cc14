#!/usr/bin/env python3
"""ORDER BY benchmark: insitu vs DuckDB, Polars and DataFusion-Python, in one
run, on the same Parquet files (the partitions insitu's devices hold).

Every engine sorts all columns of lineitem by one key and materializes the
whole sorted result in memory (insitu: Arrow batches on the host; DuckDB:
an Arrow table; Polars: a DataFrame; DataFusion: Arrow batches), and all
must return the same number of rows. Each query runs once to warm up, then
--runs times; medians and ratios are printed. A further DuckDB column times
the query until DuckDB hands over a reader of the sorted result, before it
produces the sorted rows: what its sort alone costs (not in the ratios).

Every engine runs in a process of its own, started afresh for each key
(insitu's `bench sql`, and this script with --worker for the others), so
that none is timed beside what another keeps allocated between queries,
and each starts from the same state.

With --rounds R, every engine runs R times in turn for each key (a fresh
process, a warm-up and --runs timed runs each time) and its median is taken
over all R x --runs times: a shared machine whose speed drifts over minutes
then slows every engine alike instead of whichever ran during the slow
minutes.

Each process also reports its peak resident memory (its VmHWM: the
warm-up and all runs, interpreter or embedded devices included), printed
as a second table: what holding the sorted result costs each engine.

Usage: orderby.py --insitu BIN --root ROOT [--hybrid-root ROOT] [--runs N] [--rounds R] [--threads N]
Prints a Markdown table; --out FILE also writes the rows as JSON lines.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

KEYS = [
    ("l_partkey", "integer"),
    ("l_shipmode", "dictionary-encoded string"),
    ("l_shipinstruct", "dictionary-encoded string"),
    ("l_extendedprice", "decimal"),
    ("l_orderkey", "integer, input already in key order"),
]


def timed(fn, runs: int, count) -> tuple:
    """Times of `runs` calls of fn after one warm-up, and count() of the
    last call's result (taken after its timing)."""
    fn()  # warm-up
    times = []
    for _ in range(runs - 1):
        start = time.perf_counter()
        fn()  # its result is dropped here: DuckDB runs one query per connection at a time
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
    return times, count(result)


def report_of(command: list, what: str) -> dict:
    """The JSON report a timing process prints last; exits naming `what`,
    with the process's error output, if it fails."""
    try:
        out = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"error: {what}: cannot start {command[0]}: {e}")
    if out.returncode != 0:
        sys.exit(f"error: {what} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def insitu_times(binary: str, root: str, sql: str, runs: int, devices_threads: int) -> tuple:
    report = report_of(
        [binary, "bench", "sql", sql, "--runs", str(runs), "--root", root, "--threads", str(devices_threads)],
        f"insitu on {sql} ({root})",
    )
    return report["runs_secs"], report["rows"], report["peak_rss_bytes"]


ENGINES = ["duckdb", "duckdb_unread", "polars", "datafusion"]


def engine_times(engine: str, pattern: str, key: str, runs: int, threads: int) -> tuple:
    """Times, result rows and version of ORDER BY `key` by one engine, in
    a process of its own."""
    report = report_of(
        [sys.executable, os.path.abspath(__file__), "--worker", engine, "--pattern", pattern,
         "--key", key, "--runs", str(runs), "--threads", str(threads)],
        f"{engine} on ORDER BY {key}",
    )
    return report["times"], report["rows"], report["version"], report["peak_rss_bytes"]


def peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM where /proc has it
    (ru_maxrss would count the parent's memory before exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(engine: str, pattern: str, key: str, runs: int, threads: int) -> dict:
    """The --worker process: times one engine's ORDER BY `key`."""
    sql = f"SELECT * FROM lineitem ORDER BY {key}"
    if engine in ("duckdb", "duckdb_unread"):
        import duckdb

        duck = duckdb.connect()
        duck.execute(f"set threads = {threads}")
        duck.execute(f"create view lineitem as select * from read_parquet('{pattern}')")
        if engine == "duckdb":
            times, rows = timed(lambda: duck.sql(sql).to_arrow_table(), runs, len)
        else:
            # Until DuckDB hands over a reader of the sorted result: the
            # sort is done, the sorted rows not yet produced. Not a
            # materialized result; shown for what the sort alone costs.
            times, rows = timed(lambda: duck.sql(sql).arrow(), runs, lambda reader: reader.read_all().num_rows)
        version = duckdb.__version__
    elif engine == "polars":
        # Read when Polars starts its thread pool: set before the import.
        os.environ["POLARS_MAX_THREADS"] = str(threads)
        import polars as pl

        times, rows = timed(lambda: pl.scan_parquet(pattern).sort(key).collect(), runs, len)
        version = pl.__version__
    elif engine == "datafusion":
        import datafusion

        dfx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(threads))
        dfx.register_parquet("lineitem", os.path.dirname(pattern))
        times, rows = timed(lambda: dfx.sql(sql).collect(), runs, lambda batches: sum(b.num_rows for b in batches))
        version = datafusion.__version__
    else:
        sys.exit(f"error: unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    return {"times": times, "rows": rows, "version": version, "peak_rss_bytes": peak_rss_bytes()}


def worker_main() -> int:
    ap = argparse.ArgumentParser(description="one engine's timings, as JSON (used by orderby.py itself)")
    ap.add_argument("--worker", required=True, choices=ENGINES)
    ap.add_argument("--pattern", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()
    print(json.dumps(worker(args.worker, args.pattern, args.key, args.runs, args.threads)))
    return 0


def main() -> int:
    if "--worker" in sys.argv:
        return worker_main()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--insitu", required=True)
    ap.add_argument("--root", required=True, help="insitu data root with lineitem in Parquet")
    ap.add_argument("--hybrid-root", help="the same lineitem in the hybrid layout, keyed per query")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per process, after one warm-up")
    ap.add_argument("--rounds", type=int, default=1, help="processes per engine and key, the engines taking turns")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine")
    ap.add_argument("--device-threads", type=int, default=1, help="threads per insitu device")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit("error: --runs must be at least 1")
    if args.rounds < 1:
        sys.exit("error: --rounds must be at least 1")
    files = sorted(glob.glob(os.path.join(args.root, "dev*", "lineitem", "*.parquet")))
    if not files:
        sys.exit(f"error: no lineitem partitions under {args.root}")
    with tempfile.TemporaryDirectory() as scratch:
        for f in files:
            dev = os.path.basename(os.path.dirname(os.path.dirname(f)))
            os.symlink(f, os.path.join(scratch, f"{dev}-{os.path.basename(f)}"))
        pattern = os.path.join(scratch, "*.parquet")
        rows = []
        versions = {}
        for key, kind in KEYS:
            sql = f"SELECT * FROM lineitem ORDER BY {key}"
            row = {"key": key, "kind": kind, "runs": args.runs, "rounds": args.rounds}
            counts = {}

            def add(engine: str, times: list, count: int, rss: int) -> None:
                row[engine] = row.get(engine, []) + times
                row[f"{engine}_rss"] = max(row.get(f"{engine}_rss", 0), rss)
                counts.setdefault(engine, set()).add(count)

            hroot = os.path.join(args.hybrid_root, key) if args.hybrid_root else None
            for _ in range(args.rounds):
                add("insitu", *insitu_times(args.insitu, args.root, sql, args.runs, args.device_threads))
                if hroot and os.path.isdir(hroot):
                    add("insitu_hybrid", *insitu_times(args.insitu, hroot, sql, args.runs, args.device_threads))
                for engine in ENGINES:
                    times, count, versions[engine], rss = engine_times(engine, pattern, key, args.runs, args.threads)
                    add(engine, times, count, rss)
            # A timing of an engine that returned a different result is no
            # comparison (the answers themselves are checked by the tests).
            if len(set().union(*counts.values())) != 1:
                sys.exit(f"error: ORDER BY {key} returned different row counts: {counts}")
            row["rows"] = counts["insitu"].pop()
            rows.append(row)
            print(f"{key}: " + ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in row.items() if isinstance(v, list)), file=sys.stderr)
    engines = ["insitu"] + (["insitu_hybrid"] if any("insitu_hybrid" in r for r in rows) else []) + ENGINES
    runs = f"{args.runs}" if args.rounds == 1 else f"{args.rounds * args.runs} ({args.rounds} rounds of {args.runs}, engines taking turns)"
    print(f"ORDER BY on lineitem ({len(files)} Parquet partitions), all columns, {args.threads} threads, median of {runs}, "
          f"every engine in a process of its own; DuckDB {versions['duckdb']}, Polars {versions['polars']}, "
          f"DataFusion {versions['datafusion']}\n")
    labels = {
        "insitu": "insitu, Parquet",
        "insitu_hybrid": "insitu, hybrid",
        "duckdb": "DuckDB",
        "duckdb_unread": "DuckDB, sorted result unread",
        "polars": "Polars",
        "datafusion": "DataFusion",
    }
    print("| key | " + " | ".join(f"{labels[e]} (s)" for e in engines) + " | DuckDB / insitu | Polars / insitu | DataFusion / insitu |")
    print("|---" * (len(engines) + 4) + "|")
    for r in rows:
        med = {e: statistics.median(r[e]) for e in engines if e in r}
        # Against insitu on the same Parquet files as the others read.
        cells = [f"{med[e]:.3f}" if e in med else "-" for e in engines]
        ratios = [f"{med[e] / med['insitu']:.2f}x" for e in ("duckdb", "polars", "datafusion")]
        print(f"| {r['key']} ({r['kind']}) | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    print("\nPeak resident memory of each engine's process (GiB; warm-up and all runs):\n")
    print("| key | " + " | ".join(labels[e] for e in engines) + " |")
    print("|---" * (len(engines) + 1) + "|")
    for r in rows:
        cells = [f"{r[e + '_rss'] / 2**30:.2f}" if e + "_rss" in r else "-" for e in engines]
        print(f"| {r['key']} | " + " | ".join(cells) + " |")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
