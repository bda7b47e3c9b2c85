"""One anchor-shaped launch for Nsight Compute: B=2, H=16, S=8192, D=128, bf16 (or --S/--D), after a
warm-up launch, so `ncu --launch-skip 1 --launch-count 1 -k regex:attngen_fwd` profiles a warm kernel;
`--backward` also runs the backward (its kernels: `-k regex:attngen_bwd_kernel`); `--fp8` calls the FP8 forward on the
inputs quantised as bench_fp8.py does (its attention kernel: `-k regex:attngen_fwd_kernel`, not the V^T kernel).
`--build` only fills the kernel cache (run it outside ncu). VARIANT: bench_forward.py's, or bench_training.py's learnable
ones (relpos_learnable: with --backward the table's gradient too). `--bwd-set` builds the sm90 backward at other fields of
jit.tiles.Sm90BwdTiles than the shipped ladder's (bwd_tiles_ab.py's syntax, e.g. `sections=1`). `--fa4` runs
FlashAttention-4's step instead (bench_training.py's FA4_ARGS variants; `-k regex:FlashAttentionBackwardSm90` for its
backward's main kernel, `regex:FlashAttentionForwardSm90` for its forward), its package on the path
(scripts/fa4_pack.py env).
Usage: profile_case.py VARIANT [--build] [--backward | --fp8 | --fa4 [--backward]] [--bwd-set FIELD=VALUE,...]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_forward import make_variant  # noqa: E402
from bench_training import FA4_ARGS, LEARNABLE, fa4_step, import_fa4, make_learnable  # noqa: E402

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
p.add_argument("--fa4", action="store_true")
args = p.parse_args()
if args.fa4 and (args.variant not in FA4_ARGS or args.fp8 or args.bwd_set):
    p.error(f"--fa4 takes one of {sorted(FA4_ARGS)}, without --fp8 or --bwd-set")
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
if args.fa4:
    flash_attn_func, error = import_fa4()
    if flash_attn_func is None:
        sys.exit(f"--fa4: {error}")
    if args.backward:
        fa4_call = fa4_step(flash_attn_func, FA4_ARGS[args.variant], q, k, v, torch.randn_like(q))
    else:  # its (B, S, H, D) layout, copied once
        qf, kf, vf = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v))
        fa4_call = lambda: flash_attn_func(qf, kf, vf, **FA4_ARGS[args.variant])  # noqa: E731


def call():
    if args.fa4:
        fa4_call()
        return
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
print("profiled", f"FA4 {args.variant}" if args.fa4 else attn.name)
