#!/usr/bin/env python3
"""Sums ncu's per-kernel durations (an `ncu --csv --metrics gpu__time_duration.sum` log of
`kasoku-cuda-check pass MODEL DEPTH K REPS`) by kernel and grid, leaving out the prefill's
kernels (the GEMM, its attention and 512-row grids), largest first. The README's per-layer
numbers are these averages.
Usage: python3 kernels_by_time.py diag/ncu_pass_512_16.csv.gz"""
import collections
import csv
import gzip
import sys

path = sys.argv[1]
opener = gzip.open if path.endswith(".gz") else open
with opener(path, "rt") as f:
    lines = [line for line in f if line.startswith('"')]
rows = list(csv.reader(lines))[1:]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
total = collections.defaultdict(lambda: [0, 0.0])
for r in rows:
    if len(r) < 15:
        continue
    name, grid = r[4].split("(")[0], r[8]
    if "gemm" in name or "prefill" in name or grid.startswith("(512") or grid == "(35840, 1, 1)":
        continue
    us = float(r[14].replace(",", "")) * scale[r[13]]
    total[(name, grid)][0] += 1
    total[(name, grid)][1] += us
for (name, grid), (n, us) in sorted(total.items(), key=lambda t: -t[1][1]):
    print(f"{us:9.1f} us  {n:4d} launches  {us / n:7.2f} us each  {name} {grid}")
