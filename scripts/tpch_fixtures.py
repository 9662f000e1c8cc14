#!/usr/bin/env python3
"""Regenerate the TPC-H answer fixtures with DuckDB, an engine independent of insitu.

Usage:
    insitu gen tpch --sf 0.01 --devices 1 --root /tmp/tpch-0.01
    scripts/venv.sh  # once: creates .venv with scripts/requirements.txt
    .venv/bin/python scripts/tpch_fixtures.py --root /tmp/tpch-0.01 --out tests/fixtures/tpch-sf0.01

DuckDB reads the very Parquet partitions insitu wrote (every device of the
root), runs queries/tpch/qN.sql, and writes qN.json:

    {"query": N, "columns": [...], "kinds": ["text"|"exact"|"float", ...],
     "rows": [[...], ...]}

"exact" values (integers, decimals) are written as strings and compared
exactly; "float" values as JSON numbers, compared to 1e-6 relative; "text"
values (strings, dates) as strings. NULL is null.
"""
import argparse
import datetime
import decimal
import glob
import json
import os
import pathlib
import sys

import duckdb

TABLES = ["lineitem", "orders", "partsupp", "part", "customer", "supplier", "nation", "region"]
REPO = pathlib.Path(__file__).resolve().parent.parent


def kind_of(type_name: str) -> str:
    t = type_name.upper()
    if t in ("DOUBLE", "FLOAT", "REAL"):
        return "float"
    if t.startswith("DECIMAL") or t in ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT", "UINTEGER"):
        return "exact"
    return "text"


def render(value, kind):
    if value is None:
        return None
    if kind == "float":
        return float(value)
    if kind == "exact":
        return str(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return str(value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="insitu data root holding TPC-H")
    ap.add_argument("--out", required=True, help="directory for qN.json")
    ap.add_argument("--queries", default=str(REPO / "queries" / "tpch"))
    args = ap.parse_args()

    con = duckdb.connect()
    for t in TABLES:
        files = sorted(glob.glob(os.path.join(args.root, "dev*", t, "*.parquet")))
        if not files:
            print(f"error: no partitions of {t} under {args.root}", file=sys.stderr)
            return 1
        con.execute(f"create view {t} as select * from read_parquet({files!r})")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for n in range(1, 23):
        sql = (pathlib.Path(args.queries) / f"q{n}.sql").read_text()
        rel = con.sql(sql)
        kinds = [kind_of(str(t)) for t in rel.types]
        rows = [[render(v, k) for v, k in zip(row, kinds)] for row in rel.fetchall()]
        doc = {"query": n, "columns": rel.columns, "kinds": kinds, "rows": rows}
        tmp = out / f".q{n}.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, out / f"q{n}.json")
        print(f"q{n}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
