"""Session 43, ad hoc: stall samples by group of instructions (executed per step, once per q-block, sleeping waits,
the rest) and stall reason. Usage: ncu_stall_groups.py sass.csv.gz ..."""
import csv, gzip, sys, collections
def load(p):
    with gzip.open(p, 'rt') as f:
        r = csv.reader(f); next(r); h = next(r); rows = list(r)
    return h, rows
for p in sys.argv[1:]:
    h, rows = load(p)
    ix = {k: i for i, k in enumerate(h)}
    stall = [k for k in h if k.startswith('stall_') and 'Not Issued' not in k]
    groups = collections.defaultdict(lambda: collections.Counter())
    ninst = collections.Counter()
    exe = collections.Counter()
    for row in rows:
        e = int(row[ix['Instructions Executed']] or 0)
        g = 'step(>=1.6M)' if e >= 1_600_000 and 'NANOSLEEP' not in row[1] else ('sleep' if 'NANOSLEEP' in row[1] else ('per-iter-1x' if e >= 200_000 else 'other'))
        ninst[g] += 1; exe[g] += e
        for k in stall: groups[g][k] += int(float(row[ix[k]] or 0))
        groups[g]['ALL'] += int(float(row[ix['Warp Stall Sampling (All Samples)']] or 0))
    tot = sum(groups[g]['ALL'] for g in groups)
    print(p.split('/')[-1], 'total samples', tot)
    for g in groups:
        c = groups[g]
        top = ', '.join(f"{k[6:]} {v}" for k, v in c.most_common(9) if k != 'ALL')
        print(f"  {g:14s} static {ninst[g]:5d} executed {exe[g]:>11d} samples {c['ALL']:7d}: {top}")
