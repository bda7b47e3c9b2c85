"""How long one variant's sm90 forward library takes to build, on this machine, in a fresh cache: the variant of
tests/gpu/test_mod_checks_gpu.py with every float function issue 15 added (math_score, causal; the heaviest score
mod the GPU suites build) or causal alone, at a head dim, with the ladder as shipped or every rung cross-tile.
Prints the build seconds, the chosen tiles and their spill bytes (the library's meta.json).

    python scripts/build_time.py --variant math --head-dim 64 [--cross-tile]
"""
import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--variant", choices=["math", "causal"], default="math")
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--cross-tile", action="store_true", help="every rung of the ladder with cross_tile on")
args = p.parse_args()

with tempfile.TemporaryDirectory(prefix="attngen_build_time_") as cache:
    import os

    os.environ["ATTNGEN_CACHE_DIR"] = cache  # a fresh cache, never the user's
    import torch

    import attngen
    from attngen.jit import spec as spec_mod

    if args.cross_tile:
        shipped = spec_mod.sm90_ladder
        spec_mod.sm90_ladder = lambda *a: tuple(replace(t, cross_tile=True) for t in shipped(*a))
    if args.variant == "math":
        from test_mod_checks_gpu import math_score

        attn = attngen.compile(score_mod=math_score, causal=True)
    else:
        attn = attngen.compile(causal=True)
    t0 = time.perf_counter()
    lib = attn.spec(torch.bfloat16, args.head_dim, "sm_90a").build_cached()
    seconds = time.perf_counter() - t0
    meta = json.loads((Path(lib).parent / "meta.json").read_text())
    print(f"{args.variant} hd{args.head_dim} cross_tile={args.cross_tile}: {seconds:.1f} s, "
          f"tiles {meta.get('tiles')}, spill {meta.get('spill_bytes')} bytes")
