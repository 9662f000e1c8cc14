#!/usr/bin/env python3
"""TPC-H: insitu (pushdown on, off and auto) against DuckDB and DataFusion-Python,
time and peak resident memory per query, all engines in the same run.

Every engine reads the very Parquet partitions insitu's devices hold; the
competitors read them from local disk (no link). Each (engine, query) runs
in a process of its own: one warm-up run, then --runs timed runs, and its
peak resident memory is the process's high-water mark (wait4's ru_maxrss),
so no query's memory shows in another's. A query that fails, is killed or
times out is recorded as failed and the run goes on; the exit status is
1 if any did, or returned another row count than DuckDB.

Usage: tpch.py --root DIR --sf SF [--queries all] [--runs 3] [--link 10gbe]
               [--modes push,pull,auto] [--engines insitu,duckdb,datafusion]
               [--insitu PATH] [--out bench/results] [--timeout 1800]
Writes OUT/tpch-sf{SF}-{link}.memory.{json,md}.
"""
import argparse
import glob
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
TABLES = ["lineitem", "orders", "partsupp", "part", "customer", "supplier", "nation", "region"]
MIB = 1 << 20
# insitu's rss_overhead_bytes (insitu_host::budget::RSS_OVERHEAD_BYTES).
RSS_OVERHEAD_BYTES = 256 * MIB


def query_sql(q: int) -> str:
    return (REPO / "queries" / "tpch" / f"q{q}.sql").read_text()


def parse_queries(text: str) -> list:
    if text == "all":
        return list(range(1, 23))
    return [int(q) for q in text.split(",") if q.strip()]


# ---------------------------------------------------------------- workers


def table_dirs(root: str, scratch: str) -> dict:
    """One directory of symlinks per table, so each engine sees a table as a folder."""
    dirs = {}
    for t in TABLES:
        d = os.path.join(scratch, t)
        os.makedirs(d)
        files = sorted(glob.glob(os.path.join(root, "dev*", t, "*.parquet")))
        if not files:
            sys.exit(f"error: no Parquet partitions of {t} under {root}")
        for f in files:
            dev = pathlib.Path(f).parent.parent.name
            os.symlink(f, os.path.join(d, f"{dev}-{os.path.basename(f)}"))
        dirs[t] = d
    return dirs


def worker(engine: str, root: str, q: int, runs: int, threads: int) -> int:
    """Runs one query in this process and prints its times as JSON."""
    sql = query_sql(q)
    with tempfile.TemporaryDirectory() as scratch:
        dirs = table_dirs(root, scratch)
        if engine == "duckdb":
            import duckdb

            con = duckdb.connect()
            con.execute(f"set threads = {threads}")
            for t, d in dirs.items():
                con.execute(f"create view {t} as select * from read_parquet('{d}/*.parquet')")
            run = lambda: len(con.sql(sql).fetchall())  # noqa: E731
            version = duckdb.__version__
        elif engine == "datafusion":
            import datafusion

            ctx = datafusion.SessionContext(
                datafusion.SessionConfig().with_target_partitions(threads)
            )
            for t, d in dirs.items():
                ctx.register_parquet(t, d)
            run = lambda: sum(b.num_rows for b in ctx.sql(sql).collect())  # noqa: E731
            version = datafusion.__version__
        else:
            sys.exit(f"error: unknown engine {engine}")
        rows = run()  # warm-up
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            rows = run()
            times.append(time.perf_counter() - start)
    print(json.dumps({"runs_secs": times, "rows": rows, "version": version}))
    return 0


# ------------------------------------------------------------ the driver


def run_measured(cmd: list, timeout: float) -> dict:
    """Runs `cmd`, returning its stdout, stderr tail, status and peak RSS."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        status, rusage = None, None
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, rusage = os.wait4(proc.pid, 0)
                status = "timeout"
                break
            time.sleep(0.05)
        proc.returncode = 0  # reaped above
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    result = {"peak_rss_bytes": rusage.ru_maxrss * 1024, "stdout": stdout}
    if status == "timeout":
        result["error"] = f"timed out after {timeout:.0f} s"
    elif os.WIFSIGNALED(status):
        result["error"] = f"killed by signal {os.WTERMSIG(status)}"
    elif os.WEXITSTATUS(status) != 0:
        tail = [l for l in stderr.strip().splitlines() if l.strip()][-3:]
        result["error"] = " / ".join(tail)[:600] or f"exit status {os.WEXITSTATUS(status)}"
    return result


def measure_insitu(args, q: int, mode: str) -> dict:
    cmd = [
        args.insitu, "bench", "sql", query_sql(q), "--runs", str(args.runs),
        "--pushdown", {"push": "on", "pull": "off", "auto": "auto"}[mode], "--link", args.link,
        "--root", args.root,
    ]
    if args.host_mem:
        cmd += ["--host-mem", args.host_mem]
    result, out = measure_worker(cmd, args.timeout)
    if out is not None:
        result["budgets_bytes"] = out.get("budgets_bytes")
        result["memory"] = out.get("memory", "")
    return result


def measure_worker(cmd: list, timeout: float):
    """Runs `cmd`, whose last stdout line is its JSON report: the result
    (median, runs, rows, peak RSS, or the error) and the report itself
    (None when the run failed)."""
    r = run_measured(cmd, timeout)
    if "error" in r:
        return {"error": r["error"], "peak_rss_bytes": r["peak_rss_bytes"]}, None
    out = json.loads(r["stdout"].strip().splitlines()[-1])
    result = {
        "median_secs": statistics.median(out["runs_secs"]),
        "runs_secs": out["runs_secs"],
        "rows": out["rows"],
        "peak_rss_bytes": r["peak_rss_bytes"],
    }
    return result, out


def measure_competitor(args, q: int, engine: str) -> dict:
    cmd = [
        sys.executable, __file__, "--worker", engine, "--root", args.root,
        "--query", str(q), "--runs", str(args.runs), "--threads", str(args.threads),
    ]
    result, out = measure_worker(cmd, args.timeout)
    if out is not None:
        result["version"] = out["version"]
    return result


def rss_target(duckdb_rss: int) -> int:
    """The memory target: 2x DuckDB's peak or DuckDB's plus 512 MiB, whichever is larger."""
    return max(2 * duckdb_rss, duckdb_rss + 512 * MIB)


def cell(m: dict) -> str:
    if m is None:
        return "–"
    if "error" in m:
        return "failed"
    return f"{m['median_secs']:.3f} s, {m['peak_rss_bytes'] / MIB:,.0f} MiB"


def markdown(report: dict) -> str:
    cols = report["columns"]
    lines = [
        f"# TPC-H SF {report['sf']}, time and peak RSS per query",
        "",
        f"insitu on {report['devices']} embedded devices, link {report['link']}; DuckDB and "
        f"DataFusion-Python read the same Parquet files locally with {report['threads']} threads. "
        f"Medians of {report['runs']} runs after a warm-up; peak RSS of a process running "
        "the one query. Memory target: at most 2x DuckDB's peak or DuckDB's plus 512 MiB, "
        "whichever is larger.",
        "",
        "| query | " + " | ".join(cols) + " | insitu within memory target |",
        "|---|" + "---|" * len(cols) + "---|",
    ]
    for r in report["queries"]:
        verdict = []
        duck = r.get("duckdb")
        for mode in ("push", "pull", "auto"):
            m = r.get(f"insitu {mode}")
            if m is None or duck is None or "error" in duck:
                continue
            if "error" in m:
                verdict.append(f"{mode}: failed")
                continue
            ok = m["peak_rss_bytes"] <= rss_target(duck["peak_rss_bytes"])
            ratio = m["peak_rss_bytes"] / duck["peak_rss_bytes"]
            verdict.append(f"{mode}: {'yes' if ok else 'NO'} ({ratio:.2f}x)")
        lines.append(
            f"| Q{r['query']} | " + " | ".join(cell(r.get(c)) for c in cols) + " | "
            + ", ".join(verdict) + " |"
        )
    lines.append("")
    failures = [
        f"- Q{r['query']} {c}: {r[c]['error']}"
        for r in report["queries"]
        for c in cols
        if r.get(c) and "error" in r[c]
    ]
    if failures:
        lines += ["Failures:", ""] + failures + [""]
    for mode in ("push", "pull", "auto"):
        col = f"insitu {mode}"
        ms = [r[col] for r in report["queries"] if col in r and "error" not in r[col]]
        limit = lambda m: m["budgets_bytes"] + RSS_OVERHEAD_BYTES  # noqa: E731
        over = [m for m in ms if m.get("budgets_bytes") and m["peak_rss_bytes"] > limit(m)]
        if ms and ms[0].get("budgets_bytes"):
            lines.append(
                f"insitu {mode}: peak RSS above the configured budgets plus rss_overhead_bytes "
                f"({limit(ms[0]) / MIB:,.0f} MiB) in {len(over)} of {len(ms)} queries."
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--sf", default="1")
    ap.add_argument("--queries", default="all")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--link", default="10gbe")
    ap.add_argument("--modes", default="push,pull,auto")
    ap.add_argument("--engines", default="insitu,duckdb,datafusion")
    ap.add_argument("--insitu", default=None)
    ap.add_argument("--host-mem", default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--query", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.root, args.query, args.runs, args.threads)
    if args.insitu is None:
        target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
        args.insitu = os.path.join(target, "release", "insitu")
    engines = args.engines.split(",")
    modes = [m for m in args.modes.split(",") if m] if "insitu" in engines else []
    columns = [f"insitu {m}" for m in modes] + [e for e in engines if e != "insitu"]
    devices = len(glob.glob(os.path.join(args.root, "dev*", "")))
    report = {
        "sf": args.sf, "devices": devices, "link": args.link, "runs": args.runs,
        "threads": args.threads, "root": args.root, "columns": columns, "queries": [],
    }
    for q in parse_queries(args.queries):
        row = {"query": q}
        for mode in modes:
            row[f"insitu {mode}"] = measure_insitu(args, q, mode)
        for engine in engines:
            if engine != "insitu":
                row[engine] = measure_competitor(args, q, engine)
        report["queries"].append(row)
        print(f"Q{q}: " + "; ".join(f"{c} {cell(row.get(c))}" for c in columns), file=sys.stderr, flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"tpch-sf{args.sf}-{args.link}.memory"
    for suffix, text in ((".json", json.dumps(report, indent=1) + "\n"), (".md", markdown(report))):
        path = out / (stem + suffix)
        tmp = out / (stem + suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    print(markdown(report))
    problems = check(report)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


def check(report: dict) -> list:
    """Failed runs, and row counts that differ from DuckDB's."""
    problems = []
    for r in report["queries"]:
        duck = r.get("duckdb")
        for col in report["columns"]:
            m = r.get(col)
            if m is None:
                continue
            if "error" in m:
                problems.append(f"Q{r['query']} {col} failed: {m['error']}")
            elif duck and "error" not in duck and m["rows"] != duck["rows"]:
                problems.append(f"Q{r['query']} {col} returned {m['rows']} rows, DuckDB {duck['rows']}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
