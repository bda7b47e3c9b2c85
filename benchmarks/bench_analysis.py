"""Analysis time of `attngen.compile` (trace + block predicates, no kernel build) for the masks researchers
write, on the machine it runs on.

    python benchmarks/bench_analysis.py [--out DIR] [--random N] [--seed S]

Part 1, the mask zoo (benchmarks/mask_zoo.py at S = 8192: the cookbook's masks, NATTEN 1D/2D/tiled/dilated,
local + global, window + global, ALiBi tensor + window + global, dilated windows): each mask in a fresh
process with an empty cache directory, timing `attngen.compile(mask_mod=..., backend="reference")` alone
(after `import attngen`), so nothing is memoised or read from an analysis record.
Part 2, random masks of 2 to 12 atoms (& | ~ over windows, prefixes, chunks, congruences, clamped NATTEN
centres, image columns), in one process with sympy's cache cleared before each: the time and the analysis
steps each took against the budget (attngen.predicates.WORK_BUDGET).
Writes analysis.md and analysis.json to --out (default benchmarks/results/<date>-<host>-<commit>/).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent

_ONE_MASK = r"""
import sys, time, json
sys.path[:0] = [{root!r}, {bench!r}]
import torch, attngen, mask_zoo
from attngen.mods import MaskMod
mm = MaskMod(mask_zoo.make({name!r}, {L}), {name!r})
t = time.perf_counter()
import attngen.predicates, attngen.trace  # sympy: the first compile of a process pays its import
t1 = time.perf_counter()
attn = attngen.compile(mask_mod=mm, backend="reference")
t2 = time.perf_counter()
p = attn.predicates
print(json.dumps(dict(seconds=t2 - t, sympy_import=t1 - t, analysis=t2 - t1, steps=p.analysis_steps, notes=list(p.notes),
                      atoms=len(attn.traced.mask.atoms(__import__("sympy").core.relational.Relational)))))
"""


def zoo_rows(L: int):
    import mask_zoo

    rows = []
    for name, (_, exact) in mask_zoo.ZOO.items():
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, ATTNGEN_CACHE_DIR=cache, HOME=cache)
            code = _ONE_MASK.format(root=str(ROOT), bench=str(BENCH), name=name, L=L)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            rows.append(dict(name=name, error=out.stderr.strip().splitlines()[-1:]))
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(dict(name=name, exact_family=exact, **r))
        print(f"{name:24s} {r['seconds']:6.3f} s (sympy import {r['sympy_import']:.3f} + analysis {r['analysis']:.3f})"
              f"  steps {r['steps']:5d}  {'; '.join(r['notes'])}", flush=True)
    return rows


# ---------------------------------------------------------------- random masks

def _atom(r):
    import torch

    k = r.randrange(9)
    c = r.choice([0, 1, 7, 64, 128, 300, 1024])
    if k == 0:
        return f"q - kv <= {c}", lambda q, kv: q - kv <= c
    if k == 1:
        return f"kv < {c}", lambda q, kv: kv < c
    if k == 2:
        return f"q >= {c}", lambda q, kv: q >= c
    if k == 3:
        return f"|q - kv| <= {c}", lambda q, kv: torch.abs(q - kv) <= c
    if k == 4:
        C = r.choice([64, 256, 1000])
        return f"q // {C} == kv // {C}", lambda q, kv: q // C == kv // C
    if k == 5:
        d = r.choice([2, 3, 4])
        return f"(q - kv) % {d} == 0", lambda q, kv: (q - kv) % d == 0
    if k == 6:
        return (f"|clamp(q, {c}, {8191 - c}) - kv| <= 64",
                lambda q, kv: torch.abs(torch.clamp(q, c, 8191 - c) - kv) <= 64)
    if k == 7:
        W = r.choice([64, 128])
        return f"|q % {W} - kv % {W}| <= 3", lambda q, kv: torch.abs(q % W - kv % W) <= 3
    return "q >= kv", lambda q, kv: q >= kv


def random_mask(r, n: int):
    """(text, fn(q, kv)) of a random formula with ``n`` atoms."""
    if n == 1:
        return _atom(r)
    k = r.randint(1, n - 1)
    (ta, a), (tb, b) = random_mask(r, k), random_mask(r, n - k)
    op = r.randrange(3)
    if op == 0:
        return f"({ta}) & ({tb})", lambda q, kv: a(q, kv) & b(q, kv)
    if op == 1:
        return f"({ta}) | ({tb})", lambda q, kv: a(q, kv) | b(q, kv)
    return f"({ta}) & ~({tb})", lambda q, kv: a(q, kv) & ~b(q, kv)


def random_rows(count: int, seed: int):
    import sympy.core.cache

    import attngen
    from attngen.mods import MaskMod
    from attngen.predicates import WORK_BUDGET

    r = random.Random(seed)
    rows = []
    for i in range(count):
        n = r.randint(2, 12)
        text, fn = random_mask(r, n)
        mm = MaskMod(lambda b, h, q, kv, fn=fn: fn(q, kv), f"random{i}")
        sympy.core.cache.clear_cache()
        t = time.perf_counter()
        attn = attngen.compile(mask_mod=mm, backend="reference")
        seconds = time.perf_counter() - t
        p = attn.predicates
        rows.append(dict(index=i, atoms=n, seconds=seconds, steps=p.analysis_steps, over_budget=bool(p.notes),
                         mask=text))
        print(f"random{i:<3d} atoms {n:2d} {seconds:6.3f} s  steps {p.analysis_steps:5d}/{WORK_BUDGET}"
              f"{'  OVER BUDGET' if p.notes else ''}", flush=True)
    return rows


def _default_out() -> Path:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    host = socket.gethostname().split(".")[0] or "cpu"
    return ROOT / "benchmarks" / "results" / f"{_dt.date.today().isoformat()}-cpu-{host[:12]}-{commit}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--length", type=int, default=8192, help="sequence length the zoo masks are built for")
    ap.add_argument("--random", type=int, default=100, help="how many random masks (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(BENCH)]
    os.environ.setdefault("ATTNGEN_CACHE_DIR", tempfile.mkdtemp(prefix="attngen-bench-analysis-"))

    from attngen.predicates import WORK_BUDGET

    zoo = zoo_rows(args.length)
    rnd = random_rows(args.random, args.seed) if args.random else []
    out = args.out or _default_out()
    out.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count()
    lines = [f"# Analysis time of attngen.compile, {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
             "", f"Command: `python benchmarks/bench_analysis.py --length {args.length} --random {args.random} "
             f"--seed {args.seed}`; {cpus} CPUs; budget {WORK_BUDGET} steps.", "",
             "## Mask zoo (fresh process each, empty cache, compile only)", "",
             "Compile = the first `attngen.compile` of a process: importing the sympy stages (once per process) "
             "plus tracing and deriving the predicates.", "",
             "| mask | exact family | compile s | of which sympy import s | analysis s | steps | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in zoo:
        if "error" in r:
            lines.append(f"| {r['name']} | | error | | | | {r['error']} |")
        else:
            lines.append(f"| {r['name']} | {'yes' if r['exact_family'] else ''} | {r['seconds']:.3f} | "
                         f"{r['sympy_import']:.3f} | {r['analysis']:.3f} | {r['steps']} | {'; '.join(r['notes'])} |")
    ok = [r for r in zoo if "error" not in r]
    if ok:
        lines += ["", f"Slowest: {max(r['seconds'] for r in ok):.3f} s; over budget: "
                      f"{sum(1 for r in ok if r['notes'])} of {len(ok)}."]
    if rnd:
        by = sorted(rnd, key=lambda r: -r["seconds"])
        lines += ["", f"## {len(rnd)} random masks of 2-12 atoms (one process, sympy cache cleared before each)", "",
                  f"Slowest {by[0]['seconds']:.3f} s, median {sorted(r['seconds'] for r in rnd)[len(rnd) // 2]:.3f} s; "
                  f"most steps {max(r['steps'] for r in rnd)} of {WORK_BUDGET}; over budget: "
                  f"{sum(r['over_budget'] for r in rnd)} of {len(rnd)}.", "",
                  "| # | atoms | compile s | steps | mask |", "|---|---|---|---|---|"]
        for r in by[:10]:
            lines.append(f"| {r['index']} | {r['atoms']} | {r['seconds']:.3f} | {r['steps']} | `{r['mask']}` |")
    (out / "analysis.md").write_text("\n".join(lines) + "\n")
    (out / "analysis.json").write_text(json.dumps(dict(budget=WORK_BUDGET, zoo=zoo, random=rnd), indent=1))
    print(f"wrote {out / 'analysis.md'}")


if __name__ == "__main__":
    main()
