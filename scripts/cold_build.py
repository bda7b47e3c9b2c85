#!/usr/bin/env python
"""Cold build of one variant's forward (with its KV-cache unit) and backward libraries into an empty cache
(issue 11: at most 15 s), timed per library, each with the tiles its ladder chose and their spill bytes (the
library's meta.json). No GPU needed: the libraries are built for --arch.

``--variant`` is a variant spec (attngen.specs), ``full`` (no score mod, no mask), or ``math``:
tests/gpu/test_mod_checks_gpu.py's score mod with every float function issue 15 added, with causal (the heaviest score
mod the GPU suites build). ``--forward-only`` skips
the backward; ``--cross-tile all`` builds the sm90 forward with cross_tile on every rung of its ladder, ``none`` on none
(default ``ladder``: where jit/tiles.py's ladder has it).

    python scripts/cold_build.py [--variant "softcap(30)+causal()"] [--head-dim 128] [--arch sm_90a]
    python scripts/cold_build.py --variant math --head-dim 64 --forward-only [--cross-tile all]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]  # tests: the math variant


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="softcap(30)+causal()")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--cross-tile", choices=("ladder", "all", "none"), default="ladder",
                   help="cross_tile in the sm90 forward's rungs: as the ladder has it, on every rung, or on none")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNGEN_CACHE_DIR"] = cache  # empty: every library is built, and never the user's cache
        import torch

        import attngen
        from attngen.jit import spec as spec_mod
        from attngen.jit.spec import choose_bwd_kernel
        from attngen.specs import parse_variant

        if args.cross_tile != "ladder":
            shipped, on = spec_mod.sm90_ladder, args.cross_tile == "all"
            spec_mod.sm90_ladder = lambda *a: tuple(dict.fromkeys(replace(t, cross_tile=on) for t in shipped(*a)))
        t0 = time.perf_counter()
        if args.variant == "math":
            from test_mod_checks_gpu import math_score

            attn = attngen.compile(score_mod=math_score, causal=True)
        elif args.variant == "full":
            attn = attngen.compile()
        else:
            variant = parse_variant(args.variant)
            attn = attngen.compile(variant.score_mod, variant.mask_mod)
        times, chosen = {"analysis": time.perf_counter() - t0}, {}
        kernels = ["sm90" if args.arch == "sm_90a" else "sm80"]
        if not args.forward_only:
            kernels.append(choose_bwd_kernel(args.arch, args.head_dim))
        for kernel in kernels:
            t = time.perf_counter()
            lib = attn.spec(torch.bfloat16, args.head_dim, args.arch, kernel).build_cached()
            times[kernel] = time.perf_counter() - t
            meta = json.loads((Path(lib).parent / "meta.json").read_text())
            chosen[kernel] = f"{kernel}: tiles {meta.get('tiles')}, spill {meta.get('spill_bytes')} bytes"
        total = sum(times.values())
        print(f"{args.variant} hd{args.head_dim} {args.arch}{'' if args.cross_tile == 'ladder' else ' cross_tile ' + args.cross_tile}: "
              + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()) + f"; total {total:.2f} s on {os.cpu_count()} cores")
        for line in chosen.values():
            print("  " + line)


if __name__ == "__main__":
    main()
