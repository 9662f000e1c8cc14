#!/usr/bin/env python3
"""External sort benchmark: insitu extsort vs GNU sort vs DuckDB ORDER BY.

insitu runs three times: with the run codec its model picks (`--run-codec
auto`), with plain runs and with LZ4 runs. All sort the same ASCII TeraSort records (100-byte lines: a 10-byte
key, payload, CRLF) with the same memory budget and 2 threads, spilling to
the same temp directory; the input is 4x (or more) the budget. Beside them:
the I/O floor max(2N/R, 2N/W), with the read and write bandwidth R and W
that `insitu extsort --explain --reprobe` measures at the start of each rep
(untimed; the timed insitu runs reuse those rates from insitu's cache, as
any sort does within an hour of the last probe of the device), and the
model's predicted phase times next to the measured ones (paper 001, Table
IV style). The probe also measures C, the bytes per second read and written
in all while reading and writing at once, which the model uses (printed
beside R and W; it is no floor: the sort phase's one large reader got more
of the storage than the probe's C here). Page cache is dropped before every run when this process may (root), so every
engine reads its input from storage.

insitu's probe reads back 128 MiB it has just written, and on a virtual
disk that read can come from the disk's own cache: its read rate swung
from 1.4 to 2.9 GB/s between reps here. So each rep also measures the
rates the storage sustains at this scale: the input's first 2 GiB (or
all of it) read with direct I/O, cold, then written to the temp directory
with direct I/O and fsync. The table gives the share of both floors.

Run through bench/extsort.sh, which builds insitu and the venv.
"""
import argparse
import json
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import duckdb


# Seconds of rest before each run, after the last one's files are removed
# and synced (by drop_caches): the storage goes on absorbing a sort's
# writes after the sync returns. insitu's plain-run sort of 4.3 GB took
# 9.2-10.3 s after 3 s of rest (6 runs, after DuckDB or itself) and
# 8.6-8.7 s after 20 s (2 runs, after DuckDB).
SETTLE_SECS = 20


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(cmd, **kw):
    t = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
    return time.perf_counter() - t, done.stdout


def insitu_run(args, inp, out, tmp, codec="auto"):
    secs, text = timed([args.insitu, "extsort", inp, out, "--mem", f"{args.mem_mib}MiB", "--tmp", tmp,
                        "--run-codec", codec])
    phases = {}
    for row in re.finditer(r"^\| (sort|merge)[^|]*\| ([\d.]+) \| ([\d.]+) \|$", text, re.M):
        phases[row.group(1)] = (float(row.group(2)), float(row.group(3)))
    plan = re.search(r"^plan: .*$", text, re.M).group(0)
    runs = re.search(r"^runs: .*$", text, re.M).group(0)
    # Peak RSS (fixed part + growth during the sort), then the sort's heap peak.
    memory = "\n".join(re.findall(r"^memory: .*$", text, re.M))
    return {
        "secs": secs,
        "phases": phases,
        "plan": plan,
        "runs": runs,
        "memory": memory,
    }


def probe_storage(args, inp, out, tmp):
    """Storage rates (read, write, both at once) in MB/s, measured now and cached."""
    text = subprocess.run([args.insitu, "extsort", inp, out, "--mem", f"{args.mem_mib}MiB", "--tmp", tmp,
                           "--explain", "--reprobe"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"measured: read (\d+) MB/s, write (\d+) MB/s, (\d+) MB/s read and written at once "
                  r"\(probed now\)", text)
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


# Bytes the sustained-rate measurement reads and writes, and its request.
SUSTAINED_BYTES_MAX = 2 << 30
SUSTAINED_REQUEST_BYTES = 8 << 20
# Distinct input blocks the write cycles through (128 MiB of real records).
SUSTAINED_WRITE_BLOCKS = 16


def sustained_rates(inp, tmp):
    """Read and write rates in MB/s over up to 2 GiB with direct I/O: the
    input's first bytes read cold, then written to `tmp` and fsynced."""
    total = min(os.path.getsize(inp), SUSTAINED_BYTES_MAX)
    total -= total % SUSTAINED_REQUEST_BYTES
    blocks = [mmap.mmap(-1, SUSTAINED_REQUEST_BYTES) for _ in range(SUSTAINED_WRITE_BLOCKS)]
    fd = os.open(inp, os.O_RDONLY | os.O_DIRECT)
    try:
        t = time.perf_counter()
        for i, at in enumerate(range(0, total, SUSTAINED_REQUEST_BYTES)):
            if os.preadv(fd, [blocks[i % len(blocks)]], at) != SUSTAINED_REQUEST_BYTES:
                raise OSError(f"{inp}: short direct read at byte {at}")
        read = total / (time.perf_counter() - t) / 1e6
    finally:
        os.close(fd)
    path = os.path.join(tmp, "sustained-write")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    try:
        t = time.perf_counter()
        for i, at in enumerate(range(0, total, SUSTAINED_REQUEST_BYTES)):
            os.pwritev(fd, [blocks[i % len(blocks)]], at)
        os.fsync(fd)
        write = total / (time.perf_counter() - t) / 1e6
    finally:
        os.close(fd)
        os.remove(path)
    return read, write


def gnu_sort_run(args, inp, out, tmp):
    env = dict(os.environ, LC_ALL="C")
    cmd = ["sort", "-S", f"{args.mem_mib}M", "--parallel=2", "-T", tmp, "-o", out, inp]
    secs, _ = timed(cmd, env=env)
    return secs


def duckdb_run(args, inp, out, tmp):
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{args.mem_mib}MiB'")
    con.execute("SET threads = 2")
    con.execute(f"SET temp_directory = '{tmp}'")
    con.execute("SET preserve_insertion_order = false")
    t = time.perf_counter()
    con.execute(
        f"COPY (SELECT line FROM read_csv('{inp}', columns = {{'line': 'VARCHAR'}}, "
        f"header = false, delim = '\\t', quote = '', escape = '', auto_detect = false) "
        f"ORDER BY line) TO '{out}' (FORMAT csv, header false, quote '')"
    )
    secs = time.perf_counter() - t
    con.close()
    return secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--insitu", required=True)
    ap.add_argument("--input", required=True, help="ASCII records from `insitu gensort --ascii`")
    ap.add_argument("--work", required=True, help="directory for outputs and temp runs")
    ap.add_argument("--mem-mib", type=int, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", required=True, help="JSON lines of every run")
    ap.add_argument("--settle-secs", type=float, default=SETTLE_SECS,
                    help="rest before each run, after the last one's files are synced")
    args = ap.parse_args()
    n = os.path.getsize(args.input)
    tmp = os.path.join(args.work, "tmp")
    out = os.path.join(args.work, "out")
    # The model picks the run codec; the forced rows show both choices.
    plain = lambda a, i, o, t: insitu_run(a, i, o, t, codec="none")["secs"]
    lz4 = lambda a, i, o, t: insitu_run(a, i, o, t, codec="lz4")["secs"]
    engines = {
        "insitu extsort": insitu_run,
        "insitu extsort, plain runs": plain,
        "insitu extsort, LZ4 runs": lz4,
        "GNU sort": gnu_sort_run,
        "DuckDB": duckdb_run,
    }
    times = {e: [] for e in engines}
    insitu_runs = []
    probes = []
    sustained = []
    dropped = True
    with open(args.out, "w") as log:
        names = list(engines)
        for rep in range(args.runs):
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            dropped &= drop_caches()
            probes.append(probe_storage(args, args.input, out, tmp))
            dropped &= drop_caches()
            sustained.append(sustained_rates(args.input, tmp))
            # Each engine starts a rep in turn: the one after another's
            # multi-gigabyte writes can find the disk still busy.
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                run = engines[name]
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)
                if os.path.exists(out):
                    os.remove(out)
                dropped &= drop_caches()
                time.sleep(args.settle_secs)
                result = run(args, args.input, out, tmp)
                if name == "insitu extsort":
                    insitu_runs.append(result)
                    secs = result["secs"]
                    if rep == 0:
                        check = subprocess.run([args.insitu, "valsort", out], capture_output=True, text=True)
                        if check.returncode != 0:
                            print(check.stdout + check.stderr, file=sys.stderr)
                            return 1
                else:
                    secs = result
                times[name].append(secs)
                log.write(json.dumps({"rep": rep, "engine": name, "secs": secs, "bytes": n}) + "\n")
                log.flush()
                print(f"  rep {rep}: {name} {secs:.2f} s", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(out):
        os.remove(out)

    med = {e: statistics.median(t) for e, t in times.items()}
    r = statistics.median(p[0] for p in probes) * 1e6
    w = statistics.median(p[1] for p in probes) * 1e6
    floor = max(2 * n / r, 2 * n / w)
    mixed = statistics.median(p[2] for p in probes) * 1e6
    rs = statistics.median(p[0] for p in sustained) * 1e6
    ws = statistics.median(p[1] for p in sustained) * 1e6
    floor_s = max(2 * n / rs, 2 * n / ws)
    print(f"# External sort: {n / 1e9:.2f} GB of 100-byte ASCII records, --mem {args.mem_mib} MiB "
          f"({n / (args.mem_mib << 20):.1f}x), 2 threads, {args.runs} runs, medians")
    print()
    print(f"page cache dropped before each run: {'yes' if dropped else 'no (not root)'}")
    print(f"storage measured by insitu at the start of each rep: read R = {r / 1e6:.0f} MB/s, "
          f"write W = {w / 1e6:.0f} MB/s, reading and writing at once C = {mixed / 1e6:.0f} MB/s in all "
          f"(medians of {', '.join(f'{a:.0f}/{b:.0f}/{c:.0f}' for a, b, c in probes)})")
    print(f"storage sustained over {min(n, SUSTAINED_BYTES_MAX) / 2**30:.1f} GiB at the start of each rep "
          f"(direct I/O, 8 MiB requests): read R = {rs / 1e6:.0f} MB/s, write W = {ws / 1e6:.0f} MB/s "
          f"(medians of {', '.join(f'{a:.0f}/{b:.0f}' for a, b in sustained)})")
    print(f"insitu plan: {insitu_runs[0]['plan'][len('plan: '):]}")
    print(f"insitu {insitu_runs[0]['runs']}")
    for line in insitu_runs[0]["memory"].splitlines():
        print(f"insitu {line}")
    print()
    print("| engine | median (s) | MB/s | vs insitu | share of I/O floor speed (insitu's probe) "
          "| share of I/O floor speed (sustained rates) |")
    print("|---|---|---|---|---|---|")
    ours = med["insitu extsort"]
    share = lambda secs: f"{100 * floor / secs:.0f}% | {100 * floor_s / secs:.0f}%"
    print(f"| I/O floor max(2N/R, 2N/W), insitu's probe | {floor:.2f} | {n / floor / 1e6:.0f} | | {share(floor)} |")
    print(f"| I/O floor max(2N/R, 2N/W), sustained rates | {floor_s:.2f} | {n / floor_s / 1e6:.0f} | | {share(floor_s)} |")
    # On one device reads and writes take turns: each phase of a sort with
    # plain runs reads and writes N bytes, one after the other.
    turns = 2 * n / rs + 2 * n / ws
    print(f"| I/O floor with reads and writes taking turns, 2N/R + 2N/W, sustained rates | {turns:.2f} "
          f"| {n / turns / 1e6:.0f} | | {share(turns)} |")
    for e, s in med.items():
        print(f"| {e} | {s:.2f} | {n / s / 1e6:.0f} | {s / ours:.2f}x | {share(s)} |")
    print()
    print("Model vs measured, insitu (paper 001 Table IV style), medians:")
    print()
    print("| phase | predicted (s) | measured (s) |")
    print("|---|---|---|")
    for phase in ("sort", "merge"):
        pred = statistics.median(x["phases"][phase][0] for x in insitu_runs)
        meas = statistics.median(x["phases"][phase][1] for x in insitu_runs)
        print(f"| {phase} | {pred:.2f} | {meas:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
