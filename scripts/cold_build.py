#!/usr/bin/env python
"""Cold build of one variant's forward (with its KV-cache unit) and backward libraries into an empty cache
(issue 11: at most 15 s), timed per library. No GPU needed: the libraries are built for --arch.

    python scripts/cold_build.py [--variant "softcap(30)+causal()"] [--head-dim 128] [--arch sm_90a]
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="softcap(30)+causal()")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--arch", default="sm_90a")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNGEN_CACHE_DIR"] = cache  # empty: every library is built
        import torch

        import attngen
        from attngen.jit.spec import choose_bwd_kernel
        from attngen.specs import parse_variant

        t0 = time.perf_counter()
        variant = parse_variant(args.variant)
        attn = attngen.compile(variant.score_mod, variant.mask_mod)
        times = {"analysis": time.perf_counter() - t0}
        fwd = "sm90" if args.arch == "sm_90a" else "sm80"
        for kernel in (fwd, choose_bwd_kernel(args.arch, args.head_dim)):
            t = time.perf_counter()
            attn.spec(torch.bfloat16, args.head_dim, args.arch, kernel).build_cached()
            times[kernel] = time.perf_counter() - t
        total = sum(times.values())
        print(f"{args.variant} hd{args.head_dim} {args.arch}: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
              + f"; total {total:.2f} s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
