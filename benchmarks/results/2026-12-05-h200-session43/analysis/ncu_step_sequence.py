"""Session 43, ad hoc: a step's SASS in order (instructions executed LO-HI times), the products, waits and barriers
and every instruction with at least THR stall samples, with the samples since the previous line and the top two stall
reasons. Usage: ncu_step_sequence.py sass.csv.gz LO HI THR"""
import csv, gzip, sys
p, lo, hi, thr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with gzip.open(p, 'rt') as f:
    r = csv.reader(f); next(r); h = next(r); ix = {k: i for i, k in enumerate(h)}
    rows = list(r)
stall = [k for k in h if k.startswith('stall_') and 'Not Issued' not in k]
acc = 0; accn = 0
for row in rows:
    e = int(row[ix['Instructions Executed']] or 0)
    if not (lo <= e <= hi): continue
    smp = int(float(row[ix['Warp Stall Sampling (All Samples)']] or 0))
    src = row[1].strip()
    key = any(t in src for t in ('HGMMA', 'DEPBAR', 'BAR.', 'SYNCS', 'FENCE', 'MEMBAR', 'BRA', 'STSM', 'ARRIVE'))
    acc += smp; accn += 1
    if smp >= thr or key:
        top = sorted(((int(float(row[ix[k]] or 0)), k[6:]) for k in stall), reverse=True)[:2]
        print(f"{row[0][-5:]} +{accn:3d} {acc:6d} {smp:6d} {src[:60]:60s} {top}")
        acc = 0; accn = 0
