"""One anchor-shaped launch for Nsight Compute: B=2, H=16, S=8192, D=128, bf16 (or --S/--D), after a
warm-up launch, so `ncu --launch-skip 1 --launch-count 1 -k regex:attngen_fwd` profiles a warm kernel;
`--backward` also runs the backward (its kernels: `-k regex:attngen_bwd_kernel`); `--fp8` calls the FP8 forward on the
inputs quantised as bench_fp8.py does (its attention kernel: `-k regex:attngen_fwd_kernel`, not the V^T kernel).
`--build` only fills the kernel cache (run it outside ncu). VARIANT: bench_forward.py's, or bench_training.py's learnable
ones (relpos_learnable: with --backward the table's gradient too). `--bwd-set` builds the sm90 backward at other fields of
jit.tiles.Sm90BwdTiles than the shipped ladder's (bwd_tiles_ab.py's syntax, e.g. `sections=1`).
Usage: profile_case.py VARIANT [--build] [--backward | --fp8] [--bwd-set FIELD=VALUE,...]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_forward import make_variant  # noqa: E402
from bench_training import LEARNABLE, make_learnable  # noqa: E402

import attngen  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("variant")
p.add_argument("--build", action="store_true")
p.add_argument("--backend", default="auto")
p.add_argument("--S", type=int, default=8192)
p.add_argument("--D", type=int, default=128)
p.add_argument("--backward", action="store_true")
p.add_argument("--fp8", action="store_true")
p.add_argument("--bwd-set", default="")
args = p.parse_args()
if args.bwd_set:
    import attngen.jit.spec as spec

    from tile_settings import bwd_rung_ladder

    spec.sm90_bwd_ladder = bwd_rung_ladder(args.bwd_set)
B, H = 2, 16
if args.variant in LEARNABLE:
    score_mod, mask_mod, leaves = make_learnable(args.variant, args.S, H, "cuda")
else:
    (score_mod, mask_mod), leaves = make_variant(args.variant, args.S, H, "cuda"), []
attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod, backend=args.backend)
q, k, v = (torch.randn(B, H, args.S, args.D, device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
           for _ in range(3))


if args.fp8:
    from bench_fp8 import quantise  # noqa: E402

    (q8, qd), (k8, kd), (v8, vd) = (quantise(t, H) for t in (q, k, v))


def call():
    if args.fp8:
        attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
        return
    out = attn(q, k, v)
    if args.backward:
        torch.autograd.grad(out, (q, k, v, *leaves), torch.randn_like(out))


call()  # builds (or loads) the kernels; with --build that is all
if not args.build:
    call()
torch.cuda.synchronize()
print("profiled", attn.name)
