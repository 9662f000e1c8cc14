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
rates the storage sustains at this scale: a quarter of the input (up to
1 GiB) read with direct I/O, then written to the temp directory with
direct I/O and fsync, in requests of 8, 64 and 256 MiB (reads; each size
its own quarter) and 8 and 64 MiB (writes); the floor takes each
direction's best. It also measures C at this scale, one reader (of the
last quarter) and one writer at once. The table
gives the share of both floors, and a third floor, 4N/C: both phases
read N and write N at once, and storage whose reads and writes share one
channel moves C < R + W bytes per second in all.

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
import threading
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


def cpu_stolen_secs():
    """Seconds of CPU time the hypervisor has given other guests instead of
    this machine since boot, all CPUs together (the steal column of
    /proc/stat); None where the kernel does not count it. Printed for each
    insitu run, so that a rep whose in-memory work ran slow can be put down
    to the hypervisor, or not."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def insitu_run(args, inp, out, tmp, codec="auto"):
    stolen = cpu_stolen_secs()
    secs, text = timed([args.insitu, "extsort", inp, out, "--mem", f"{args.mem_mib}MiB", "--tmp", tmp,
                        "--run-codec", codec])
    if stolen is not None:
        stolen = cpu_stolen_secs() - stolen
    phases = {}
    for row in re.finditer(r"^\| (sort|merge)[^|]*\| ([\d.]+) \| ([\d.]+) \|$", text, re.M):
        phases[row.group(1)] = (float(row.group(2)), float(row.group(3)))
    plan = re.search(r"^plan: .*$", text, re.M).group(0)
    runs = re.search(r"^runs: .*$", text, re.M).group(0)
    # Peak RSS (fixed part + growth during the sort), then the sort's heap peak.
    memory = "\n".join(re.findall(r"^memory: .*$", text, re.M))
    # Where each phase's time went: waits for storage, and its own work.
    times = re.findall(r"^time: (.*)$", text, re.M)
    return {
        "stolen_secs": stolen,
        "secs": secs,
        "phases": phases,
        "plan": plan,
        "runs": runs,
        "memory": memory,
        "times": times,
    }


def probe_storage(args, inp, out, tmp):
    """Storage rates (read, write, both at once) in MB/s, measured now and cached."""
    text = subprocess.run([args.insitu, "extsort", inp, out, "--mem", f"{args.mem_mib}MiB", "--tmp", tmp,
                           "--explain", "--reprobe"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"measured: read (\d+) MB/s, write (\d+) MB/s, (\d+) MB/s read and written at once "
                  r"\(probed now\)", text)
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


# Bytes each sustained-rate measurement reads or writes at most.
SUSTAINED_BYTES_MAX = 1 << 30
# Request sizes tried, each one request in flight: this virtual disk
# read 1.1 GB/s in 8 MiB requests, 1.7 GB/s in 64 MiB and 1.9 GB/s in
# 256 MiB (dd iflag=direct), while its writes were 1.9-2.2 GB/s at every
# size. insitu's sort phase reads whole chunks (hundreds of MiB) in one
# request, so the floor takes each direction's best rate.
SUSTAINED_READ_REQUESTS = (8 << 20, 64 << 20, 256 << 20)
SUSTAINED_WRITE_REQUESTS = (8 << 20, 64 << 20)
# Buffers of real records the writes cycle through, at most this much.
SUSTAINED_BUFFER_BYTES = 256 << 20


def request_buffers(request):
    return [mmap.mmap(-1, request) for _ in range(max(2, SUSTAINED_BUFFER_BYTES // request))]


def direct_read(inp, start, total, request, blocks, stop=None):
    """Reads `total` bytes of `inp` from `start` in `request`-byte direct
    reads into `blocks` in turn; returns (bytes, seconds). Stops early
    when `stop` is set."""
    fd = os.open(inp, os.O_RDONLY | os.O_DIRECT)
    done = 0
    try:
        t = time.perf_counter()
        for i, at in enumerate(range(start, start + total, request)):
            if stop is not None and stop.is_set():
                break
            if os.preadv(fd, [blocks[i % len(blocks)]], at) != request:
                raise OSError(f"{inp}: short direct read at byte {at}")
            done += request
        return done, time.perf_counter() - t
    finally:
        os.close(fd)


def direct_write(path, total, request, blocks, stop=None):
    """Writes `total` bytes of `blocks` in turn to a new file `path` in
    `request`-byte direct writes, then fsyncs and removes it; returns
    (bytes, seconds). Stops early when `stop` is set."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    done = 0
    try:
        t = time.perf_counter()
        for i, at in enumerate(range(0, total, request)):
            if stop is not None and stop.is_set():
                break
            os.pwritev(fd, [blocks[i % len(blocks)]], at)
            done += request
        os.fsync(fd)
        return done, time.perf_counter() - t
    finally:
        os.close(fd)
        os.remove(path)


def sustained_regions(size):
    """Bytes each sustained-rate measurement reads, and where each of the
    four starts: a quarter of the input each, up to 1 GiB, or all of one
    region if a quarter is under 8 MiB."""
    # Whole MiB: direct reads start at aligned offsets.
    region = min(size // 4, SUSTAINED_BYTES_MAX) >> 20 << 20
    if region < SUSTAINED_READ_REQUESTS[0]:
        return min(size, SUSTAINED_BYTES_MAX), [0, 0, 0, 0]
    return region, [0, region, 2 * region, 3 * region]


def sustained_rates(inp, tmp):
    """The storage's rates in MB/s with direct I/O, one request in flight:
    the best read rate over the request sizes, the best write rate (the
    records read written to `tmp` and fsynced), each size's rates, and C,
    the bytes per second moved in all by one reader and one writer at
    once in 64 MiB requests (until the first is done). Each read size, and
    C's reader, reads its own region of the input (a quarter of it, up to
    1 GiB): a virtual disk's host can cache what was just read, and a
    second read of the same bytes here ran at 3.0 GB/s where the first
    ran at 1.2 GB/s. Inputs too small for 8 MiB regions share one."""
    size = os.path.getsize(inp)
    region, starts = sustained_regions(size)
    reads, writes = {}, {}
    # Buffers each read size filled with records: what its writes (and C's
    # writer) write, so no write is of zeros a thin disk could skip.
    filled = {}
    for start, request in zip(starts, SUSTAINED_READ_REQUESTS):
        whole = region - region % request
        if whole == 0:
            continue
        blocks = request_buffers(request)
        got, secs = direct_read(inp, start, whole, request, blocks)
        reads[request] = got / secs / 1e6
        filled[request] = blocks
        if request in SUSTAINED_WRITE_REQUESTS:
            put, secs = direct_write(os.path.join(tmp, "sustained-write"), whole, request, blocks)
            writes[request] = put / secs / 1e6
    if not reads:
        raise SystemExit(f"{inp}: {size} bytes, less than one {SUSTAINED_READ_REQUESTS[0] >> 20} MiB request "
                         "to measure the storage with; use more records")
    request = SUSTAINED_WRITE_REQUESTS[-1] if region >= SUSTAINED_WRITE_REQUESTS[-1] else SUSTAINED_WRITE_REQUESTS[0]
    whole = region - region % request
    mixed_start = starts[3]
    stop = threading.Event()
    result = {}

    def run(name, f):
        try:
            result[name] = f()
        except OSError as e:
            result[name] = e
        finally:
            stop.set()

    r_blocks, w_blocks = request_buffers(request), filled[request]
    threads = [
        threading.Thread(target=run, args=("r", lambda: direct_read(inp, mixed_start, whole, request, r_blocks,
                                                                    stop))),
        threading.Thread(target=run, args=("w", lambda: direct_write(
            os.path.join(tmp, "sustained-mixed"), whole, request, w_blocks, stop))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in result.values():
        if isinstance(r, OSError):
            raise r
    mixed = sum(b / s for b, s in result.values()) / 1e6
    return max(reads.values()), max(writes.values()), reads, writes, mixed


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
    log_tmp = args.out + ".tmp"  # renamed once every run is done
    with open(log_tmp, "w") as log:
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
                row = {"rep": rep, "engine": name, "secs": secs, "bytes": n}
                if name == "insitu extsort":
                    row["runs"] = result["runs"]
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(f"  rep {rep}: {name} {secs:.2f} s", file=sys.stderr)
    os.replace(log_tmp, args.out)
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
    mixed_s = statistics.median(p[4] for p in sustained) * 1e6
    sizes = lambda rates: ", ".join(f"{q >> 20} MiB {v:.0f}" for q, v in rates.items())
    floor_s = max(2 * n / rs, 2 * n / ws)
    print(f"# External sort: {n / 1e9:.2f} GB of 100-byte ASCII records, --mem {args.mem_mib} MiB "
          f"({n / (args.mem_mib << 20):.1f}x), 2 threads, {args.runs} runs, medians")
    print()
    print(f"page cache dropped before each run: {'yes' if dropped else 'no (not root)'}")
    print(f"storage measured by insitu at the start of each rep: read R = {r / 1e6:.0f} MB/s, "
          f"write W = {w / 1e6:.0f} MB/s, reading and writing at once C = {mixed / 1e6:.0f} MB/s in all "
          f"(medians of {', '.join(f'{a:.0f}/{b:.0f}/{c:.0f}' for a, b, c in probes)})")
    print(f"storage sustained over {sustained_regions(n)[0] / 2**30:.2f} GiB per measurement at the start of each rep "
          f"(direct I/O, one request in flight, best request size): read R = {rs / 1e6:.0f} MB/s, "
          f"write W = {ws / 1e6:.0f} MB/s, one reader and one writer at once C = {mixed_s / 1e6:.0f} MB/s "
          f"in all (medians of {', '.join(f'{p[0]:.0f}/{p[1]:.0f}/{p[4]:.0f}' for p in sustained)})")
    for i, p in enumerate(sustained):
        print(f"  rep {i} by request size: read {sizes(p[2])}; write {sizes(p[3])}")
    print(f"insitu plan: {insitu_runs[0]['plan'][len('plan: '):]}")
    print(f"insitu {insitu_runs[0]['runs']}")
    # The model picks the run codec from each rep's own probe.
    picked = [r["runs"].split()[1].rstrip(";") for r in insitu_runs]
    print(f"insitu run codec its model picked, per rep: {', '.join(picked)}")
    for line in insitu_runs[0]["memory"].splitlines():
        print(f"insitu {line}")
    print()
    print("| engine | median (s) | MB/s | vs insitu | share of I/O floor speed (insitu's probe) "
          "| share of I/O floor speed (best sustained rates) |")
    print("|---|---|---|---|---|---|")
    ours = med["insitu extsort"]
    share = lambda secs: f"{100 * floor / secs:.0f}% | {100 * floor_s / secs:.0f}%"
    print(f"| I/O floor max(2N/R, 2N/W), insitu's probe | {floor:.2f} | {n / floor / 1e6:.0f} | | {share(floor)} |")
    print(f"| I/O floor max(2N/R, 2N/W), best sustained rates | {floor_s:.2f} | {n / floor_s / 1e6:.0f} | | {share(floor_s)} |")
    # On one device reads and writes take turns: each phase of a sort with
    # plain runs reads and writes N bytes, one after the other.
    turns = 2 * n / rs + 2 * n / ws
    print(f"| I/O floor with reads and writes taking turns, 2N/R + 2N/W, sustained rates | {turns:.2f} "
          f"| {n / turns / 1e6:.0f} | | {share(turns)} |")
    # Storage whose reads and writes share one channel moves C bytes per
    # second in all while a phase reads N and writes N at once.
    shared = 4 * n / mixed_s
    print(f"| I/O floor with reads and writes at once at the sustained mixed rate, 4N/C | {shared:.2f} "
          f"| {n / shared / 1e6:.0f} | | {share(shared)} |")
    for e, s in med.items():
        print(f"| {e} | {s:.2f} | {n / s / 1e6:.0f} | {s / ours:.2f}x | {share(s)} |")
    print()
    print(f"insitu extsort at {100 * shared / ours:.0f}% of the speed of the 4N/C floor "
          f"(C = {mixed_s / 1e6:.0f} MB/s read and written in all, against R + W = {(rs + ws) / 1e6:.0f} MB/s "
          "that max(2N/R, 2N/W) assumes at once)")
    print()
    print("Model vs measured, insitu (paper 001 Table IV style), medians:")
    print()
    print("| phase | predicted (s) | measured (s) |")
    print("|---|---|---|")
    for phase in ("sort", "merge"):
        pred = statistics.median(x["phases"][phase][0] for x in insitu_runs)
        meas = statistics.median(x["phases"][phase][1] for x in insitu_runs)
        print(f"| {phase} | {pred:.2f} | {meas:.2f} |")
    print()
    print("Where insitu's phase times went (planned runs), per rep:")
    print()
    for i, run in enumerate(insitu_runs):
        for line in run["times"]:
            print(f"- rep {i}: {line}")
        if run["stolen_secs"] is not None:
            print(f"- rep {i}: CPU time stolen by the hypervisor during the run: {run['stolen_secs']:.2f} s "
                  f"(all CPUs, of {run['secs']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
