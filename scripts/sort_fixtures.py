#!/usr/bin/env python3
"""Regenerate the ORDER BY fixtures with DuckDB, an engine independent of insitu.

Usage:
    scripts/venv.sh  # once
    .venv/bin/python scripts/sort_fixtures.py --out tests/fixtures/sort

Writes sortdata.parquet (a seeded random table with many key types, ties,
NULLs, NaN, infinities and negative zero) and queries.json: for each query,
DuckDB's first result column in order, rendered as text (NULL is null).
Queries that end in a unique tiebreaker (id) have one right order; queries
without one return only their sort key, whose sequence is unique too.

With --tpch-root (a root from `insitu gen tpch --sf 0.01`), also writes
lineitem.json: ORDER BY queries over all of lineitem, each with its row
count and the CRC32 of its rows rendered as "orderkey|linenumber|
extendedprice|shipmode|comment" lines, so a test can check a 60k-row order
(sorted past a small device memory budget) without storing it.
"""
import argparse
import datetime
import decimal
import json
import math
import os
import pathlib
import random
import sys

import zlib

import duckdb

ROWS = 4000
SEED = 20261122
MODES = ["AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB", "REG AIR", ""]
KEYS = ["i8", "i32", "i64", "f", "r", "dec", "d", "ts", "s", "w", "b"]


def maybe(rng, value, null_rate=0.08):
    return None if rng.random() < null_rate else value


def special_float(rng):
    pick = rng.randrange(14)
    if pick == 0:
        return math.nan
    if pick == 1:
        return math.inf
    if pick == 2:
        return -math.inf
    if pick == 3:
        return -0.0
    if pick == 4:
        return 0.0
    if pick < 8:
        return float(rng.randrange(-5, 5)) / 2
    return rng.uniform(-1e6, 1e6)


def rows(rng):
    ids = list(range(ROWS))
    rng.shuffle(ids)
    epoch = datetime.date(1992, 1, 1)
    for i in ids:
        yield (
            i,
            maybe(rng, rng.randrange(-128, 128)),
            maybe(rng, rng.randrange(-50, 50) * 1000),
            maybe(rng, rng.choice([rng.randrange(-2**63, 2**63), rng.randrange(-3, 3)])),
            maybe(rng, special_float(rng)),
            maybe(rng, special_float(rng)),
            maybe(rng, decimal.Decimal(rng.randrange(-10**7, 10**7)) / 100),
            maybe(rng, epoch + datetime.timedelta(days=rng.randrange(0, 2500))),
            maybe(rng, datetime.datetime(2020, 1, 1) + datetime.timedelta(seconds=rng.randrange(0, 10**6) * 7)),
            maybe(rng, rng.choice(MODES)),
            maybe(rng, "".join(rng.choice("abcde") for _ in range(rng.randrange(0, 8)))),
            maybe(rng, rng.random() < 0.3),
        )


def queries():
    out = []
    for k in KEYS:
        for direction in ["ASC", "DESC"]:
            for nulls in ["FIRST", "LAST"]:
                out.append(f"SELECT id, {k} FROM sortdata ORDER BY {k} {direction} NULLS {nulls}, id")
        out.append(f"SELECT {k} FROM sortdata ORDER BY {k} DESC NULLS LAST")
    out += [
        "SELECT id FROM sortdata ORDER BY s DESC NULLS LAST, f ASC NULLS FIRST, id",
        "SELECT id FROM sortdata ORDER BY b NULLS FIRST, dec DESC NULLS LAST, id",
        "SELECT id FROM sortdata ORDER BY d NULLS LAST, w NULLS LAST, id DESC",
        "SELECT id FROM sortdata ORDER BY i8 DESC NULLS FIRST, ts NULLS LAST, id",
        "SELECT id FROM sortdata ORDER BY r NULLS LAST, i32 DESC NULLS LAST, id LIMIT 37",
        "SELECT id FROM sortdata ORDER BY f DESC NULLS LAST, id LIMIT 17",
        "SELECT id FROM sortdata ORDER BY s NULLS FIRST, id LIMIT 500",
        "SELECT id, i8, i32, i64, f, r, dec, d, ts, s, w, b FROM sortdata ORDER BY dec NULLS LAST, id",
        "SELECT id FROM sortdata WHERE i32 > 0 ORDER BY w NULLS LAST, id",
        "SELECT id FROM sortdata ORDER BY i32 + i8 NULLS LAST, id",
    ]
    return out


def render(value):
    if value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return repr(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat(sep=" ") if isinstance(value, datetime.datetime) else value.isoformat()
    return str(value)


LINEITEM_ORDERS = [
    "l_partkey",
    "l_shipmode, l_shipinstruct",
    "l_extendedprice DESC",
    "l_comment",
]


def lineitem_fixture(root: pathlib.Path, out: pathlib.Path) -> None:
    files = sorted(str(p) for p in root.glob("dev*/lineitem/*.parquet"))
    if not files:
        raise SystemExit(f"error: no lineitem partitions under {root}")
    con = duckdb.connect()
    con.execute(f"create view lineitem as select * from read_parquet({files!r})")
    doc = []
    for keys in LINEITEM_ORDERS:
        sql = f"SELECT * FROM lineitem ORDER BY {keys}, l_orderkey, l_linenumber"
        lines = con.sql(
            f"SELECT l_orderkey, l_linenumber, l_extendedprice, l_shipmode, l_comment "
            f"FROM ({sql})"
        ).fetchall()
        crc = 0
        for row in lines:
            crc = zlib.crc32(("|".join(str(v) for v in row) + "\n").encode(), crc)
        doc.append({"sql": sql, "rows": len(lines), "crc32": crc})
    tmp = out / ".lineitem.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / "lineitem.json")
    print(f"{len(doc)} lineitem queries over {doc[0]['rows']} rows")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tpch-root", type=pathlib.Path, help="root of `insitu gen tpch --sf 0.01`")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tpch_root:
        lineitem_fixture(args.tpch_root, out)
    con = duckdb.connect()
    con.execute(
        "create table sortdata (id integer, i8 tinyint, i32 integer, i64 bigint, f double, r real, "
        "dec decimal(15,2), d date, ts timestamp, s varchar, w varchar, b boolean)"
    )
    con.executemany("insert into sortdata values (?,?,?,?,?,?,?,?,?,?,?,?)", list(rows(random.Random(SEED))))
    tmp = out / ".sortdata.parquet.tmp"
    con.execute(f"copy sortdata to '{tmp}' (format parquet, row_group_size 1000)")
    os.replace(tmp, out / "sortdata.parquet")
    doc = []
    for sql in queries():
        first = [render(row[0]) for row in con.sql(sql).fetchall()]
        doc.append({"sql": sql, "expect": first})
    tmp = out / ".queries.json.tmp"
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, out / "queries.json")
    print(f"{len(doc)} queries over {ROWS} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
