"""Spill bytes of the sm90 backward kernel at every rung of its ladder (jit/tiles.py sm90_bwd_ladder) for the
training anchors: which register split (producer / consumers) each variant builds clean at, as ptxas reports it for
the main kernel. No GPU needed (nvcc builds for sm_90a); one build per variant and rung. `--set` replaces fields of
every rung that takes them (jit.tiles.Sm90BwdTiles, bwd_tiles_ab.py's syntax: `--set dkv_staged=1`); a rung that
refuses them (ds_mul_packed on a rung without split_probs) is built as it is and marked "as is".

    python scripts/bwd_ladder_spills.py [--variants causal full ...] [--head-dim 128] [--set FIELD=VALUE,...]
"""
import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402
from bench_training import VARIANTS  # noqa: E402
from tile_settings import setting_fields  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--set", default="", help="Sm90BwdTiles fields set on every rung, e.g. dkv_staged=1")
    args = p.parse_args(argv)
    fields = setting_fields(args.set)
    with tempfile.TemporaryDirectory() as cache:
        import os

        os.environ["ATTNGEN_CACHE_DIR"] = cache  # nothing here reads or writes the user's cache
        import torch

        import attngen
        from attngen.jit.spec import SM90_BWD_KERNEL, build_first_without_spills

        hd = args.head_dim
        print("| variant | rungs (producer / consumer registers, split_probs, dkv_staged, s_ahead): spilled bytes |")
        print("|---|---|")
        for key in args.variants:
            score_mod, mask_mod = bf.make_variant(key, 8192, 16, "cpu")
            attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
            spec = attn.spec(torch.bfloat16, hd, "sm_90a", kernel=SM90_BWD_KERNEL)
            inc = spec.variant_inc()
            ladder, as_is = [], []
            for t in spec.tile_choices():
                try:
                    ladder.append(replace(t, **fields))
                    as_is.append(False)
                except attngen.BuildError:
                    ladder.append(t)
                    as_is.append(True)
            spills = []
            for rung in ladder:
                with tempfile.TemporaryDirectory() as d:
                    _, spill = build_first_without_spills(Path(d), inc, torch.bfloat16, hd, "sm_90a", (rung,),
                                                          kernel=SM90_BWD_KERNEL)
                spills.append(spill)
            rungs = [f"{t.producer_regs} / {t.consumer_regs}{' split' if t.split_probs else ''}"
                     f"{' staged' if t.dkv_staged else ''}{f' ahead {t.s_ahead}' if t.s_ahead else ''}"
                     f"{' (as is)' if kept else ''}: {s} B"
                     for t, s, kept in zip(ladder, spills, as_is)]
            print(f"| {key} | {', '.join(rungs)} |", flush=True)


if __name__ == "__main__":
    main()
