"""SM90 tile experiments: build one variant at several (BK, stages, overlap, pingpong) settings and time
each side by side (B=2, H=16, S=8192, D=128 bf16 by default), checked against SDPA / the default
library. Needs nvcc; timing needs a GPU (--build-only reports registers/spills without one).
Usage: tile_sweep.py [--variants full,causal,softcap] [--tiles 128x2,128x2-rt8,...] [--build-only]
(tile spec flags: see parse_tiles)."""
import argparse
import concurrent.futures as cf
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.codegen import render_variant_inc  # noqa: E402
from attngen.jit.ninja import LIBRARY_NAME, ptxas_spill_bytes, run_ninja, write_build_ninja  # noqa: E402
from attngen.jit.render import render_sources  # noqa: E402
from attngen.jit.tiles import Sm90Tiles  # noqa: E402
from bench_forward import heat_gpu, make_sdpa, make_variant  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--variants", default="full,causal,softcap")
p.add_argument("--tiles", default="128x2,144x2,160x2,176x2")
p.add_argument("--S", type=int, default=8192)
p.add_argument("--D", type=int, default=128)
p.add_argument("--B", type=int, default=2)
p.add_argument("--H", type=int, default=16)
p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (the median is reported)")
p.add_argument("--build-only", action="store_true")
args = p.parse_args()


def parse_tiles(spec):
    # 128x2, 128x2-nopp (no pingpong), 128x2-noov (no intra-warpgroup overlap), 128x2-pers (persistent),
    # 128x2-pers4096 (persistent grid up to 4096 kv rows), 128x2-rt8 (conditional rescale, threshold 8),
    # 128x2-pers-cross (a tile's epilogue under the next tile's first Q K^T), 128x2-pers-ost (O stored with TMA from
    # the tile's Q buffer, as the shipped rungs do; without -ost: O from registers)
    bk, rest = spec.split("x", 1)
    st, *flags = rest.split("-")
    pers = [f for f in flags if re.fullmatch(r"pers\d*", f)]
    return Sm90Tiles(int(bk), int(st), overlap="noov" not in flags, pingpong="nopp" not in flags,
                     persistent=bool(pers), persistent_max_kv=int(pers[0][4:] or 0) if pers else 0,
                     cross_tile="cross" in flags, o_staged="ost" in flags,
                     rescale_threshold=next((float(f[2:]) for f in flags if re.fullmatch(r"rt[\d.]+", f)), 0.0))


B, H, S, D = args.B, args.H, args.S, args.D
work = Path(tempfile.mkdtemp(prefix="tile_sweep_"))
jobs = []
for var in args.variants.split(","):
    score_mod, mask_mod = make_variant(var, S, H, "cuda" if torch.cuda.is_available() else "cpu")
    attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
    inc = render_variant_inc(attn.traced, attn.predicates)
    for spec in args.tiles.split(","):
        d = work / f"{var}-{spec}"
        d.mkdir()
        srcs = render_sources(inc, torch.bfloat16, D, "sm_90a", tiles=parse_tiles(spec), kernel="sm90")
        write_build_ninja(d, srcs, "sm_90a", flags=["-Xptxas", "-v"])
        jobs.append((var, spec, attn, d))


def run(job):
    var, spec, attn, d = job
    try:
        out = run_ninja(d)
    except Exception as e:  # noqa: BLE001 (a config that does not compile is a result too)
        return job, f"build failed: {str(e).splitlines()[-1][:200]}"
    regs = re.findall(r"Used (\d+) registers", out)
    return job, f"regs {regs[-1] if regs else '?'} spill {ptxas_spill_bytes(out)}"


with cf.ThreadPoolExecutor(8) as ex:
    built = list(ex.map(run, jobs))
for (var, spec, _, _), info in built:
    print(f"{var:10s} {spec:14s} {info}", flush=True)
if args.build_only:
    sys.exit(0)

from triton.testing import do_bench  # noqa: E402

from attngen.launch import forward, load_library  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
print(f"\n| variant | tiles | ms (median of {args.rounds} interleaved rounds) | TFLOP/s | rounds ms | max err vs default |")
print("|---|---|---|---|---|---|")
by_var = {}
for (var, spec, attn, d), info in built:
    if not info.startswith("build failed"):
        by_var.setdefault(var, []).append((spec, attn, d))
for var, configs in by_var.items():
    attn = configs[0][1]
    dens = attngen.reference.mask_density(attn.variant, B, H, S, S, device="cuda") if attn.traced.has_mask else 1.0
    ref = attn(q, k, v)
    fns, errs = {}, {}
    for spec, attn, d in configs:
        lib = load_library(d / LIBRARY_NAME)
        captured = [c.tensor for c in attn.traced.captured]
        tensors = {c.name: t for c, t in zip(attn.traced.captured, captured)}
        summaries = [sm.compute(tensors, lib.block_q, lib.block_k, S, S, 0) for sm in attn.predicates.summaries]
        # runtime parameters (a window's size, alibi's head count) are kernel arguments, as the call passes them
        lib.param_count = len(attn.facts.params)
        params = attn._param_fields()
        fn = (lambda lib=lib, captured=captured, summaries=summaries, params=params:
              forward(lib, q, k, v, captured=captured, summaries=summaries, params=params))
        errs[spec] = (fn().float() - ref.float()).abs().max().item()
        fns[spec] = fn
    if var in ("full", "causal"):
        sd = make_sdpa(var == "causal", "cudnn")
        fns["SDPA (cudnn)"] = lambda sd=sd: sd(q, k, v)
    # interleaved rounds: every configuration sees the same mix of GPU temperature and clocks
    heat_gpu("cuda", 1.0)
    times = {n: [] for n in fns}
    for _ in range(args.rounds):
        for n, fn in fns.items():
            ms = do_bench(fn, warmup=50, rep=200, quantiles=[0.5])
            times[n].append(ms[0] if isinstance(ms, (list, tuple)) else ms)
    for n, ts in times.items():
        ms = sorted(ts)[len(ts) // 2]
        tf = 4 * B * H * S * S * D * dens / ms / 1e9
        err = f"{errs[n]:.2e}" if n in errs else ""
        print(f"| {var} | {n} | {ms:.3f} | {tf:.1f} | {' '.join(f'{t:.3f}' for t in ts)} | {err} |", flush=True)
