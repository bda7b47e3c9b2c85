"""The sm90 backward at other tile settings than jit/tiles.py's, side by side in one process: forward + backward
steps (bench_training.py's) of each variant at each setting (--set: fields of jit.tiles.Sm90BwdTiles, e.g.
`stages=3` for the Q / dO ring, `rel_walk=0` for score_mod per element, `walk_shift=2` for the rotated walk, `persistent=0`;
fields of the forward's jit.tiles.Sm90Tiles prefixed `fwd.`, set on every rung of its ladder, e.g. `fwd.rel_stage=0`;
one setting per argument, fields joined by commas; `ladder` for the shipped ladders, whose first rung without spills a
build takes). A setting is one rung: jit.tiles.SM90_BWD_TILES's one-pass tiles with its fields replaced, so the split
rung that variants without a score_mod ship is `split_probs=1`, and a switch is compared on that rung with
`split_probs=1,FIELD=...`;
interleaved rounds of triton's do_bench (each round's order rotated by one), the median; gradients compared with the
first setting's; with --flex, flex's step (bench_training.py's) timed in the same rounds, each setting's ratio to it
printed. Shared
memory allows 3 stages at head dim 128 (the staged dQ still fitting beside them, sm90_bwd_layout.cuh). Needs a GPU.

    python scripts/bwd_tiles_ab.py [--variants causal full sliding_window document] [--set stages=2 stages=3]
        [--head-dim 128] [--seq 8192] [--flex]

Variants: bench_forward.py's anchors and bench_training.py's learnable ones (relpos_learnable, ...).
"""
import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402
from bench_training import FLEX_RETRY_OPTIONS, FLOP_FACTOR, LEARNABLE, make_learnable, step_fn  # noqa: E402
from tile_settings import bwd_rung_ladder, setting_fields  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["causal", "full", "sliding_window", "document"])
    p.add_argument("--set", nargs="+", default=["stages=2", "stages=3"], dest="settings", metavar="FIELD=VALUE")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--flex", action="store_true", help="time flex_attention's step beside the settings")
    p.add_argument("--rounds", type=int, default=bf.ROUNDS,
                   help="interleaved rounds (as many as settings, flex included, put each in every place once)")
    args = p.parse_args(argv)
    import torch

    import attngen.jit.spec as spec

    B, H, S, D = 2, 16, args.seq, args.head_dim
    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    # the ladders a build (and every call's cache key) reads: the backward's one rung at this setting, the forward's
    # shipped ladder with the setting's fwd. fields on every rung
    # "ladder": the shipped ladders themselves (jit/tiles.py), whose first spill-free rung a build takes
    shipped, shipped_fwd = spec.sm90_bwd_ladder, spec.sm90_ladder
    ladders = {s: shipped if s == "ladder" else bwd_rung_ladder(s) for s in args.settings}
    fwd_ladders = {s: shipped_fwd if s == "ladder" or not setting_fields(s, fwd=True) else
                   (lambda *a, f=setting_fields(s, fwd=True), **kw: tuple(replace(t, **f) for t in shipped_fwd(*a, **kw)))
                   for s in args.settings}

    def under(setting, fn):
        def step():
            spec.sm90_bwd_ladder = ladders[setting]
            spec.sm90_ladder = fwd_ladders[setting]
            return fn()
        return step

    bf.heat_gpu(device)
    for key in args.variants:
        if key in LEARNABLE:  # the step also differentiates the captured tensor (bench_training.py's)
            score_mod, mask_mod, leaves = make_learnable(key, S, H, device)
        else:
            (score_mod, mask_mod), leaves = bf.make_variant(key, S, H, device), []
        density = bf.density_of(score_mod, mask_mod, B, H, S, device)
        fns, first = {}, None
        for s in args.settings:
            fn = under(s, step_fn(bf.make_attngen(score_mod, mask_mod), q, k, v, dout, leaves))
            grads = [g.float() for g in fn()]
            torch.cuda.synchronize()
            if first is None:
                first = grads
            diff = max((g - r).abs().max().item() for g, r in zip(grads, first))
            print(f"[{key}] {s}: max |grad - grad at {args.settings[0]}| = {diff:.3e}", flush=True)
            fns[s] = fn
        for options in [None] + FLEX_RETRY_OPTIONS if args.flex else []:  # bench_training.py's retries
            try:
                fns["flex"] = step_fn(bf.Flex().make(score_mod, mask_mod, S, device, options), q, k, v, dout, leaves)
                fns["flex"]()
                if options:
                    print(f"[{key}] flex ran with kernel_options={options}", flush=True)
                break
            except Exception as e:  # noqa: BLE001
                fns.pop("flex", None)
                if "out of resource" not in str(e):
                    raise
        times = {s: [] for s in fns}
        for r in range(args.rounds):
            for s in bf.rotated(fns, r):  # each setting in turn first (bench_forward.py rotated)
                times[s].append(bf.bench_ms(fns[s]))
        medians = {s: sorted(ts)[len(ts) // 2] for s, ts in times.items()}
        for s, ms in medians.items():
            vs_flex = f", {medians['flex'] / ms:.3f}x flex" if "flex" in medians and s != "flex" else ""
            print(f"[{key}] D {D} {s}: {ms:.3f} ms, "
                  f"{bf.tflops(B, H, S, D, density, ms) * FLOP_FACTOR:.1f} TFLOP/s{vs_flex} "
                  f"(rounds: {' '.join(f'{t:.3f}' for t in times[s])})", flush=True)


if __name__ == "__main__":
    main()
