#!/usr/bin/env python3
"""Checks `insitu simulate` where this machine can measure: TPC-H at SF
PER_DEVICE x n on n = 1..4 embedded devices (each device holds the same
amount, as in paper 000 Fig. 16), a query measured with pushdown on and
off on every n, against what `insitu simulate` projects from the run on
one device.

Usage: simulate_check.py --insitu PATH [--per-device-sf 0.25] [--query 6]
                         [--link 10gbe] [--runs 3] [--data DIR] [--out DIR]
Writes OUT/simulate-check-q{QUERY}-{LINK}.md and prints it.
"""
import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sh(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed: {out.stderr.strip()[-600:]}")
    return out.stdout


def bench_sql(args, root, mode, sql):
    out = sh([args.insitu, "bench", "sql", sql, "--runs", str(args.runs), "--pushdown", mode,
              "--link", args.link, "--root", str(root)])
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--insitu", required=True)
    ap.add_argument("--per-device-sf", type=float, default=0.25)
    ap.add_argument("--query", type=int, default=6)
    ap.add_argument("--link", default="10gbe")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    sql = (REPO / "queries" / "tpch" / f"q{args.query}.sql").read_text()
    data = Path(args.data or tempfile.mkdtemp(prefix="insitu-simcheck-"))
    measured = {}
    report = None
    for n in range(1, 5):
        root = data / f"sf{args.per_device_sf * n:g}-{n}dev"
        if not (root / f"dev{n - 1}" / "manifest.json").exists():
            sh([args.insitu, "gen", "tpch", "--sf", f"{args.per_device_sf * n:g}", "--devices",
                str(n), "--root", str(root), "--replace"])
        push = bench_sql(args, root, "on", sql)
        pull = bench_sql(args, root, "off", sql)
        measured[n] = (push["median_secs"], pull["median_secs"])
        if n == 1:
            report = data / "one-device.json"
            report.write_text(json.dumps(bench_sql(args, root, "auto", sql)))
        print(f"{n} devices: push {push['median_secs']:.3f}s pull {pull['median_secs']:.3f}s",
              file=sys.stderr)
    sim = data / "sim"
    sh([args.insitu, "simulate", str(report), "--devices", "1,2,3,4", "--out", str(sim)])
    projected = {}
    with open(sim / "devices.csv") as f:
        for row in csv.DictReader(f):
            if row["machine"] == "this machine":
                projected[int(row["devices"])] = (float(row["push_secs"]), float(row["pull_secs"]))
    lines = [
        f"# insitu simulate against measurements: TPC-H Q{args.query}, SF {args.per_device_sf:g} "
        f"per device, link {args.link}, medians of {args.runs}",
        "",
        "Projected from the run on one device; measured on each device count.",
        "",
        "| devices | push measured (s) | push projected (s) | error | pull measured (s) | "
        "pull projected (s) | error |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors = []
    for n in range(1, 5):
        (mp, ml), (pp, pl) = measured[n], projected[n]
        ep, el = abs(pp - mp) / mp, abs(pl - ml) / ml
        errors += [ep, el]
        lines.append(f"| {n} | {mp:.3f} | {pp:.3f} | {ep:.0%} | {ml:.3f} | {pl:.3f} | {el:.0%} |")
    lines += ["", f"Median error {statistics.median(errors):.0%}, largest {max(errors):.0%}."]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"simulate-check-q{args.query}-{args.link}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
