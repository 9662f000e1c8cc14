"""numpy and Polars argsort of u64 keys read from a file; prints name<TAB>median seconds."""
import statistics
import sys
import time

import numpy as np
import polars as pl

path, reps = sys.argv[1], int(sys.argv[2])
keys = np.fromfile(path, dtype=np.uint64)


def median(f):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


print(f"numpy argsort (stable radix)\t{median(lambda: np.argsort(keys, kind='stable'))}")
print(f"numpy argsort (quicksort)\t{median(lambda: np.argsort(keys))}")
series = pl.Series("k", keys)
print(f"polars arg_sort\t{median(lambda: series.arg_sort())}")
