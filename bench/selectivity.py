#!/usr/bin/env python3
"""Selectivity sweep: SELECT sum(l_extendedprice) FROM lineitem WHERE
l_partkey <= <bound keeping a fraction a of the rows>, for a in FRACTIONS, on
every link profile, with insitu's pushdown on, off and auto (each a process
of its own through `insitu bench sql`), and the cost model's predictions for
push and pull next to what each measured.

l_partkey is uniform and not clustered, so no row group is pruned: the
fraction a is what the devices keep (paper 003 Fig. 6's x axis).

Writes bench/results/selectivity-sf{SF}.{json,md,svg}: medians, auto against
the better of push and pull, link bytes, and the model's error
|predicted - measured| / measured (median and 90th percentile over all
cells)."""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FRACTIONS = [0.001, 0.01, 0.1, 0.5, 1.0]
FRACTIONS = list(DEFAULT_FRACTIONS)
LINKS = ["unlimited", "pcie3x4", "10gbe", "sata3", "1gbe"]
MODES = ["on", "off", "auto"]
PARTKEYS_PER_SF = 200_000


def query(sf: float, fraction: float) -> str:
    bound = max(1, round(PARTKEYS_PER_SF * sf * fraction))
    return f"select sum(l_extendedprice) as s from lineitem where l_partkey <= {bound}"


def run(args, link: str, mode: str, sql: str) -> dict:
    cmd = [
        args.insitu, "bench", "sql", sql, "--runs", str(args.runs),
        "--pushdown", mode, "--link", link, "--root", args.root,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        tail = " / ".join(out.stderr.strip().splitlines()[-2:])
        raise SystemExit(f"{' '.join(cmd)} failed: {tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def predicted(auto: dict, placement: str):
    """The model's predicted seconds for `placement` of the sweep's one scan."""
    stages = auto.get("placements") or []
    if len(stages) != 1:
        return None
    for c in stages[0]["candidates"]:
        if c["placement"] == placement:
            return c["predicted_secs"]
    return None


def error(pred, measured):
    if pred is None or not measured:
        return None
    return abs(pred - measured) / measured


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(p * (len(values) - 1))))
    return values[k]


def svg(cells, path: Path):
    """One panel per link: time against the kept fraction (log x) for push,
    pull and auto, and the model's push and pull predictions dashed."""
    w, h, pad = 300, 220, 40
    colors = {"push": "#1f77b4", "pull": "#d62728", "auto": "#2ca02c"}
    links = [l for l in LINKS if any(c["link"] == l for c in cells)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(links)}" height="{h + 30}" '
        'font-family="sans-serif" font-size="10">'
    ]
    import math
    for i, link in enumerate(links):
        mine = [c for c in cells if c["link"] == link]
        top = max(max(c[m] for m in ("push", "pull", "auto")) for c in mine) * 1.1
        x0 = i * w

        def px(a):
            lo, hi = math.log10(FRACTIONS[0]), math.log10(FRACTIONS[-1])
            return x0 + pad + (math.log10(a) - lo) / (hi - lo) * (w - 2 * pad)

        def py(t):
            return h - pad + 10 - t / top * (h - 2 * pad)

        parts.append(f'<text x="{x0 + w / 2}" y="14" text-anchor="middle">{link}</text>')
        parts.append(
            f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + w - pad}" y2="{py(0)}" stroke="black"/>'
            f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + pad}" y2="{py(top)}" stroke="black"/>'
            f'<text x="{x0 + 4}" y="{py(top) + 4}">{top * 1000:.0f} ms</text>'
        )
        for a in FRACTIONS:
            parts.append(f'<text x="{px(a)}" y="{py(0) + 12}" text-anchor="middle">{a:g}</text>')
        for mode, dash in [("push", ""), ("pull", ""), ("auto", ""),
                           ("push_predicted", "4 3"), ("pull_predicted", "4 3")]:
            pts = [(px(c["fraction"]), py(c[mode])) for c in mine if c.get(mode) is not None]
            color = colors[mode.split("_")[0]]
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(
                f'<polyline points="{line}" fill="none" stroke="{color}" '
                f'stroke-dasharray="{dash}" stroke-width="1.5"/>'
            )
    parts.append(
        f'<text x="10" y="{h + 24}">time vs fraction of rows kept; solid: measured push (blue), '
        'pull (red), auto (green); dashed: predicted</text></svg>'
    )
    path.write_text("".join(parts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--links", default=",".join(LINKS))
    ap.add_argument("--fractions", default=",".join(str(a) for a in DEFAULT_FRACTIONS))
    ap.add_argument("--insitu", required=True)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()
    FRACTIONS[:] = [float(a) for a in args.fractions.split(",")]
    cells = []
    for link in args.links.split(","):
        for a in FRACTIONS:
            sql = query(args.sf, a)
            r = {m: run(args, link, m, sql) for m in MODES}
            rows = {r[m]["rows"] for m in MODES}
            if len(rows) != 1:
                raise SystemExit(f"{link} a={a}: modes disagree on rows: {rows}")
            auto = r["auto"]
            cell = {
                "link": link,
                "fraction": a,
                "push": r["on"]["median_secs"],
                "pull": r["off"]["median_secs"],
                "auto": auto["median_secs"],
                "auto_placed": (auto.get("placements") or [{}])[0].get("chosen"),
                "push_predicted": predicted(auto, "push"),
                "pull_predicted": predicted(auto, "pull"),
                "link_bytes": {m: r[k]["link_bytes_to_host"] for m, k in
                               [("push", "on"), ("pull", "off"), ("auto", "auto")]},
            }
            cell["auto_vs_best"] = cell["auto"] / min(cell["push"], cell["pull"])
            cells.append(cell)
            print(
                f"{link:>9} a={a:<6} push {cell['push']:.3f}s (pred {cell['push_predicted'] or 0:.3f}) "
                f"pull {cell['pull']:.3f}s (pred {cell['pull_predicted'] or 0:.3f}) "
                f"auto {cell['auto']:.3f}s [{cell['auto_placed']}] {cell['auto_vs_best']:.2f}x the better",
                file=sys.stderr,
            )
    errors = [e for c in cells for e in (error(c["push_predicted"], c["push"]),
                                         error(c["pull_predicted"], c["pull"])) if e is not None]
    summary = {
        "model_error_median": statistics.median(errors) if errors else None,
        "model_error_p90": percentile(errors, 0.9),
        "auto_within_1_10x_of_better": sum(c["auto_vs_best"] <= 1.10 for c in cells),
        "cells": len(cells),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"selectivity-sf{args.sf:g}"
    path = lambda ext: out / f"{stem}.{ext}"  # noqa: E731
    report = {"sf": args.sf, "runs": args.runs, "summary": summary, "cells": cells}
    tmp = path("json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path("json"))
    lines = [
        f"# Selectivity sweep, TPC-H SF {args.sf:g} lineitem, medians of {args.runs}",
        "",
        "| link | kept | push (s) | predicted | pull (s) | predicted | auto (s) | auto ran | "
        "auto vs the better | link bytes push / pull / auto |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for c in cells:
        lb = c["link_bytes"]
        lines.append(
            f"| {c['link']} | {c['fraction']:g} | {c['push']:.3f} | {c['push_predicted'] or 0:.3f} | "
            f"{c['pull']:.3f} | {c['pull_predicted'] or 0:.3f} | {c['auto']:.3f} | {c['auto_placed']} | "
            f"{c['auto_vs_best']:.2f}x | {lb['push']:,} / {lb['pull']:,} / {lb['auto']:,} |"
        )
    lines += [
        "",
        f"Model error over {len(errors)} predictions: median {summary['model_error_median']:.0%}, "
        f"90th percentile {summary['model_error_p90']:.0%}. Auto within 1.10x of the better mode "
        f"in {summary['auto_within_1_10x_of_better']} of {len(cells)} cells.",
    ]
    path("md").write_text("\n".join(lines) + "\n")
    svg(cells, path("svg"))
    print("\n".join(lines))
    print(f"wrote {path('json')}, .md and .svg", file=sys.stderr)


if __name__ == "__main__":
    main()
