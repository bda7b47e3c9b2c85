"""The hottest SASS lines of an Nsight Compute source page (`ncu --import R --page source --csv --print-source sass`,
as `gpu_round.sh profile` writes it; .csv or .csv.gz): each line's share of all warp-stall samples, with the two
instructions before it (what a wait follows); with --opcodes, instead, the warp instructions executed per opcode and
each opcode's share of the stall samples. Usage: python scripts/ncu_hot_lines.py FILE [--top N] [--opcodes]"""
import argparse
import csv
import gzip
import io
import re
from collections import Counter

p = argparse.ArgumentParser()
p.add_argument("file")
p.add_argument("--top", type=int, default=20)
p.add_argument("--opcodes", action="store_true", help="instructions executed and stall share per opcode")
args = p.parse_args()
raw = gzip.open(args.file, "rt") if args.file.endswith(".gz") else open(args.file)
rows = list(csv.reader(io.StringIO(raw.read())))
header, data = rows[1], rows[2:]
addr, src = header.index("Address"), header.index("Source")
samples, executed = header.index("Warp Stall Sampling (All Samples)"), header.index("Instructions Executed")
total = sum(float(r[samples] or 0) for r in data)
if args.opcodes:
    runs, stalls = Counter(), Counter()
    for r in data:
        op = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", r[src]).group(1)
        runs[op] += int(r[executed] or 0)
        stalls[op] += float(r[samples] or 0)
    n = sum(runs.values())
    print(f"warp instructions executed: {n}")
    for op, c in runs.most_common(args.top):
        print(f"{op:10s} {c:12d} {100 * c / n:5.1f}%  stall samples {100 * stalls[op] / total:5.1f}%")
    raise SystemExit
for k in sorted(range(len(data)), key=lambda k: -float(data[k][samples] or 0))[: args.top]:
    r = data[k]
    before = " | ".join(x[src].strip()[:40] for x in data[max(0, k - 2):k])
    print(f"{r[addr][-5:]} {100 * float(r[samples]) / total:5.1f}%  executed {r[executed]:>7}  {r[src].strip()[:60]}"
          f"   <- {before}")
