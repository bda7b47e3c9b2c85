"""Session 44, ad hoc: rows LO-HI of an Nsight Compute source page (sass.csv.gz, as session 43's analysis/ scripts read
it) that have at least THR stall samples or are atomics, bulk copies or mbarrier operations: address, executions,
stall samples, instruction, top two stall reasons; then the rows' sum of samples.
Usage: ncu_rows.py sass.csv.gz LO HI THR"""
import csv
import gzip
import sys

p, lo, hi, thr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with gzip.open(p, 'rt') as f:
    r = csv.reader(f); next(r); h = next(r); ix = {k: i for i, k in enumerate(h)}
    rows = list(r)
stall = [k for k in h if k.startswith('stall_') and 'Not Issued' not in k]
tot = 0
for row in rows[lo:hi + 1]:
    e = int(row[ix['Instructions Executed']] or 0)
    s = int(float(row[ix['Warp Stall Sampling (All Samples)']] or 0))
    tot += s
    top = sorted(((int(float(row[ix[k]] or 0)), k[6:]) for k in stall), reverse=True)[:2]
    if s >= thr or any(t in row[1] for t in ('ATOMG', 'UBLK', 'SYNCS')):
        print(row[0][-5:], f"{e:7d} {s:6d}", row[1].strip()[:60], top)
print(f"# rows {lo}-{hi}, all samples: {tot}")
