"""The hottest SASS lines of an Nsight Compute source page (`ncu --import R --page source --csv --print-source sass`,
as `gpu_round.sh profile` writes it; .csv or .csv.gz): each line's share of all warp-stall samples, with the two
instructions before it (what a wait follows); with --opcodes, instead, the warp instructions executed per opcode and
each opcode's share of the stall samples; with --waits, the warp instructions executed in mbarrier try_wait polling
loops (the TRYWAIT, the branch back after it, a YIELD before it run as often), per barrier operand, and their share of
all; with --match REGEX, every line whose instruction matches, in address order, with its share and their sum.
Usage: python scripts/ncu_hot_lines.py FILE [--top N] [--opcodes | --waits | --match REGEX]"""
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
p.add_argument("--waits", action="store_true", help="instructions executed in try_wait polling loops, per barrier")
p.add_argument("--match", help="every line whose instruction matches this regex, and their summed share")
args = p.parse_args()
raw = gzip.open(args.file, "rt") if args.file.endswith(".gz") else open(args.file)
rows = list(csv.reader(io.StringIO(raw.read())))
header, data = rows[1], rows[2:]
addr, src = header.index("Address"), header.index("Source")
samples, executed = header.index("Warp Stall Sampling (All Samples)"), header.index("Instructions Executed")
total = sum(float(r[samples] or 0) for r in data)
if args.waits:
    n = sum(int(r[executed] or 0) for r in data)
    loops = []
    for k, r in enumerate(data):
        if "TRYWAIT" not in r[src]:
            continue
        runs = int(r[executed] or 0)
        yielded = k > 0 and "YIELD" in data[k - 1][src] and data[k - 1][executed] == r[executed]
        loops.append((runs * (3 if yielded else 2), runs, re.search(r"\[(.*?)\]", r[src]).group(1), r[addr][-5:]))
    print(f"warp instructions executed: {n}; in try_wait loops: {sum(x[0] for x in loops)} "
          f"({100 * sum(x[0] for x in loops) / n:.1f}%)")
    for instr, runs, bar, a in sorted(loops, reverse=True)[: args.top]:
        print(f"{a} [{bar}] polls {runs:>10d}  loop instructions {instr:>10d} ({100 * instr / n:4.1f}%)")
    raise SystemExit
if args.match:
    hits = [r for r in data if re.search(args.match, r[src])]
    for r in hits:
        print(f"{r[addr][-5:]} {100 * float(r[samples] or 0) / total:5.2f}%  executed {r[executed]:>7}  "
              f"{r[src].strip()[:70]}")
    print(f"{len(hits)} lines, {100 * sum(float(r[samples] or 0) for r in hits) / total:.2f}% of the stall samples")
    raise SystemExit
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
