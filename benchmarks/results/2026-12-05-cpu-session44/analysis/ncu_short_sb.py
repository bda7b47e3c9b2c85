"""Session 44, ad hoc: in an Nsight Compute source page (sass.csv.gz), the kernel's stall samples in all, and within a
step (instructions executed LO-HI times) the short-scoreboard stall samples on its FFMA (the exponentials, waiting on
lse's shared-memory loads) and on its FADD (dS^T, waiting on delta's). Usage: ncu_short_sb.py sass.csv.gz LO HI"""
import csv
import gzip
import sys

p, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with gzip.open(p, 'rt') as f:
    r = csv.reader(f); next(r); h = next(r); ix = {k: i for i, k in enumerate(h)}
    rows = list(r)
samples = lambda row, k: int(float(row[ix[k]] or 0))  # noqa: E731
total = sum(samples(row, 'Warp Stall Sampling (All Samples)') for row in rows)
by_op = {'FFMA': 0, 'FADD': 0}
for row in rows:
    if lo <= int(row[ix['Instructions Executed']] or 0) <= hi:
        words = row[1].split()
        op = (words[1] if words[0].startswith('@') else words[0]).split('.')[0]
        if op in by_op:
            by_op[op] += samples(row, 'stall_short_sb')
print(f"{p}: kernel stall samples {total}; step ({lo}-{hi} executions) short_sb on FFMA {by_op['FFMA']}, "
      f"on FADD {by_op['FADD']}")
