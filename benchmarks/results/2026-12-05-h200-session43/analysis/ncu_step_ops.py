"""Session 43, ad hoc: opcodes per step (instructions executed 1.6M-1.7M times, divided by the steps x warps given) and
their stall samples, FA4's against attngen's. Usage: ncu_step_ops.py FA4.csv.gz attngen.csv.gz 1687552"""
import csv, gzip, sys, collections, re
def step_ops(p, lo):
    with gzip.open(p, 'rt') as f:
        r = csv.reader(f); next(r); h = next(r); ix = {k: i for i, k in enumerate(h)}
        c = collections.Counter(); s = collections.Counter()
        for row in r:
            e = int(row[ix['Instructions Executed']] or 0)
            if not (1_600_000 <= e <= 1_700_000) or 'NANOSLEEP' in row[1]: continue
            src = row[1].strip()
            src = re.sub(r'^@!?U?P\w+\s+', '', src)
            op = src.split()[0]
            op = op.split('.')[0] if not op.startswith(('HGMMA','WARPGROUP','SYNCS','BAR')) else '.'.join(op.split('.')[:2])
            c[op] += e / lo_norm[p]
            s[op] += int(float(row[ix['Warp Stall Sampling (All Samples)']] or 0))
    return c, s
lo_norm = {}
a, b, lo = sys.argv[1], sys.argv[2], int(sys.argv[3])
lo_norm[a] = lo_norm[b] = lo
ca, sa = step_ops(a, lo); cb, sb = step_ops(b, lo)
ops = sorted(set(ca) | set(cb), key=lambda o: -(cb[o] - ca[o]))
print(f"{'op':24s} {'FA4/iter':>9s} {'ours/iter':>9s} {'FA4 smp':>8s} {'ours smp':>8s}")
for o in ops:
    print(f"{o:24s} {ca[o]:9.1f} {cb[o]:9.1f} {sa[o]:8d} {sb[o]:8d}")
print('total', sum(ca.values()), sum(cb.values()), sum(sa.values()), sum(sb.values()))
