"""Session 43, ad hoc: a consumer warp's cycles per backward step attributed to runs of its step's SASS (instructions
executed 1.6M-1.7M times: the 80-row step of full attention, 8 consumer warps x 210944 steps), as each run's share of the
step's stall samples times the cycles per step (elapsed cycles / steps per SM: 6,745,389 / 1598 = 4221 for FA4,
7,942,144 / 1598 = 4970 for attngen). Usage: ncu_step_cycles.py FA4.csv.gz 4221 attngen.csv.gz 4970"""
# cycles per step per consumer warp attributed to instruction groups: samples / all consumer samples * cycles per step
import csv, gzip, sys, re
def load(p):
    with gzip.open(p, 'rt') as f:
        r = csv.reader(f); next(r); h = next(r); ix = {k: i for i, k in enumerate(h)}
        return [(row[0][-5:], row[1].strip(), int(row[ix['Instructions Executed']] or 0),
                 int(float(row[ix['Warp Stall Sampling (All Samples)']] or 0))) for row in r]
def phases(rows, lo, hi, cps):
    step = [x for x in rows if lo <= x[2] <= hi]
    tot = sum(x[3] for x in step)
    # phase boundaries: at each HGMMA group start (first HGMMA after non-HGMMA) and at waits / barriers
    out = []; cur = None; acc = 0; n = 0
    for a, s, e, smp in step:
        op = s.split()[0] if not s.startswith('@') else s.split()[1]
        if op.startswith('HGMMA'):
            tag = 'HGMMA ' + s.split()[1 if not s.startswith('@') else 2][:0] + op.split('.')[1]
        elif 'DEPBAR' in op: tag = 'wgmma wait'
        elif op.startswith('BAR.SYNC'): tag = 'named bar.sync'
        elif 'SYNCS' in op or op == 'BRA': tag = 'mbarrier/branch'
        elif op.startswith('FENCE') or op.startswith('MEMBAR'): tag = 'fence'
        else: tag = 'alu/lsu'
        out.append((a, tag, smp, s))
    return out, tot, cps
for p, lo, hi, cps in [(sys.argv[1], 1600000, 1700000, float(sys.argv[2])), (sys.argv[3], 1600000, 1700000, float(sys.argv[4]))]:
    rows = load(p)
    out, tot, cps = phases(rows, lo, hi, cps)
    # segments: consecutive runs, merged
    segs = []
    for a, tag, smp, s in out:
        if segs and segs[-1][1] == tag: segs[-1][2] += smp; segs[-1][3] += 1
        else: segs.append([a, tag, smp, 1, s[:50]])
    print(p.split('/')[-1], f"step {cps:.0f} cycles, consumer samples {tot}")
    for a, tag, smp, n, s in segs:
        c = smp / tot * cps
        if c >= 25: print(f"  {a} {tag:16s} x{n:3d} {c:6.0f} cyc   {s}")
