#!/usr/bin/env python3
"""Add DuckDB and DataFusion-Python columns to an `insitu bench tpch` report.

Both engines read the very Parquet partitions insitu's devices hold, from
local disk (no link), with as many threads as the machine has. Each query
runs once to warm up, then --runs times; medians are reported next to
insitu's pushdown and pull times from the same run.

Usage: compare.py REPORT.json [--runs N]
Writes REPORT.compare.json and REPORT.compare.md beside the report.
"""
import argparse
import glob
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import datafusion
import duckdb

TABLES = ["lineitem", "orders", "partsupp", "part", "customer", "supplier", "nation", "region"]
REPO = pathlib.Path(__file__).resolve().parent.parent


def table_dirs(root: str, scratch: str) -> dict:
    """One directory of symlinks per table, so both engines see a table as a folder."""
    dirs = {}
    for t in TABLES:
        d = os.path.join(scratch, t)
        os.makedirs(d)
        files = sorted(glob.glob(os.path.join(root, "dev*", t, "*.parquet")))
        if not files:
            sys.exit(f"error: no partitions of {t} under {root}")
        for f in files:
            dev = pathlib.Path(f).parent.parent.name
            os.symlink(f, os.path.join(d, f"{dev}-{os.path.basename(f)}"))
        dirs[t] = d
    return dirs


def timed(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args()
    report = json.loads(pathlib.Path(args.report).read_text())
    runs = args.runs or report["runs"]
    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        dirs = table_dirs(report["root"], scratch)
        duck = duckdb.connect()
        duck.execute(f"set threads = {threads}")
        for t, d in dirs.items():
            duck.execute(f"create view {t} as select * from read_parquet('{d}/*.parquet')")
        cfg = datafusion.SessionConfig().with_target_partitions(threads)
        df = datafusion.SessionContext(cfg)
        for t, d in dirs.items():
            df.register_parquet(t, d)
        for q in report["queries"]:
            sql = (REPO / "queries" / "tpch" / f"q{q['query']}.sql").read_text()
            q["duckdb_median_secs"] = timed(lambda: duck.sql(sql).fetchall(), runs)
            q["datafusion_python_median_secs"] = timed(lambda: df.sql(sql).collect(), runs)
            q["push_vs_duckdb"] = q["duckdb_median_secs"] / q["push"]["median_secs"]
            q["push_vs_datafusion_python"] = q["datafusion_python_median_secs"] / q["push"]["median_secs"]
            print(
                f"Q{q['query']}: insitu push {q['push']['median_secs']:.3f}s, pull {q['pull']['median_secs']:.3f}s, "
                f"duckdb {q['duckdb_median_secs']:.3f}s, datafusion-python {q['datafusion_python_median_secs']:.3f}s",
                file=sys.stderr,
            )
    report["competitors"] = {
        "duckdb": duckdb.__version__,
        "datafusion_python": datafusion.__version__,
        "threads": threads,
        "note": "competitors read the same Parquet files from local disk, no link",
    }
    stem = pathlib.Path(args.report).with_suffix("")
    pathlib.Path(f"{stem}.compare.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"# TPC-H SF {report['scale_factor']}, {report['devices']} devices, link {report['link']}",
        "",
        f"Medians of {runs} runs. insitu columns include the emulated link; DuckDB {duckdb.__version__} and "
        f"DataFusion-Python {datafusion.__version__} read the same Parquet files locally with {threads} threads.",
        "",
        "| query | insitu push (s) | insitu pull (s) | push speedup vs pull | DuckDB (s) | DataFusion-Python (s) | link bytes push | link bytes pull | push/pull link bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for q in report["queries"]:
        push, pull = q["push"], q["pull"]
        lines.append(
            f"| Q{q['query']} | {push['median_secs']:.3f} | {pull['median_secs']:.3f} | {q['speedup']:.2f}x | "
            f"{q['duckdb_median_secs']:.3f} | {q['datafusion_python_median_secs']:.3f} | {push['link_bytes']:,} | "
            f"{pull['link_bytes']:,} | {100.0 * push['link_bytes'] / max(pull['link_bytes'], 1):.4f}% |"
        )
    md = "\n".join(lines) + "\n"
    pathlib.Path(f"{stem}.compare.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
