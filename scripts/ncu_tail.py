"""How much of a grid idles at its end, from Nsight Compute's raw page (`--csv --page raw` with the metrics
sm__cycles_active.{avg,min,max}, sm__cycles_elapsed.max and gpu__time_duration.sum; device_step.sh's ncu_tail):
per kernel, the SMs' mean active cycles over the elapsed ones (1 - that is the share of the SMs' time idle, which
for a persistent grid is its tail), the least and most active SM's share, and the kernel's time.

    python scripts/ncu_tail.py TAIL.csv [CASE]   # markdown rows on stdout
"""
import csv
import re
import sys


def rows(path):
    """The kernel rows of an ncu raw CSV (its first line the column names, the second their units)."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    table = list(csv.reader(lines))
    if len(table) < 3:
        sys.exit(f"{path}: no kernel rows (ncu's log beside it says why)")
    header = table[0]
    return [dict(zip(header, r)) for r in table[2:]]


def number(text):
    return float(text.replace(",", ""))


def main(argv):
    path, case = argv[0], (argv[1] if len(argv) > 1 else "")
    print("| case | kernel | time (µs) | SM active, mean | least | most |")
    print("|---|---|---|---|---|---|")
    for r in rows(path):
        elapsed = number(r["sm__cycles_elapsed.max"])
        share = {k: number(r[f"sm__cycles_active.{k}"]) / elapsed for k in ("avg", "min", "max")}
        name = (re.search(r"attngen_\w+", r["Kernel Name"]) or re.search(r"\w+", r["Kernel Name"])).group(0)
        us = number(r["gpu__time_duration.sum"]) / 1e3  # ncu reports ns
        print(f"| {case} | {name} | {us:.1f} | {share['avg']:.3f} | {share['min']:.3f} | {share['max']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
