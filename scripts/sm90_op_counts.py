"""Spilled bytes and SASS instruction counts of an sm90 main kernel, the backward's (default) or the forward's
(--forward), per variant and tile setting (Sm90BwdTiles, or the first rung of the forward's ladder with the fields
set), built on this machine (no GPU): global loads (LDG), shared-memory CAS loops (ATOMS: float atomics on sm90),
shuffles, MUFU, shared loads and stores, local memory and the instruction total, as cuobjdump prints them. Variants:
bench_forward.py's anchors and bench_training.py's learnable ones. cuobjdump needs nvdisasm on PATH
(scripts/bwd_sass_cmp.py says where to get both).

    python scripts/sm90_op_counts.py [--variants relpos_learnable div_score] [--head-dim 128 64]
        [--set rel_walk=1 rel_walk=0] [--cuobjdump PATH]
    python scripts/sm90_op_counts.py --forward --set rel_stage=1 rel_stage=0

--ladder builds over the whole ladder the spec would (the fields set on every rung) and names the rung's BK the build
takes (the first without spills, else the one that spills least). --sass-dir DIR also writes each main kernel's SASS there (<variant>-hd<D>-<fwd|bwd>-<setting>.sass, the anonymous
namespace's per-source hash dropped), so that two trees' kernels can be compared line by line (`diff -r`).
"""
import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tile_settings import setting_fields  # noqa: E402

OPS = ("LDG", "ATOMS", "SHFL", "MUFU", "LDS", "STS", "LDL", "STL")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["relpos_learnable"])
    p.add_argument("--head-dim", nargs="+", type=int, default=[128, 64])
    p.add_argument("--set", nargs="+", default=["rel_walk=1", "rel_walk=0"], dest="settings", metavar="FIELD=VALUE")
    p.add_argument("--cuobjdump", default="cuobjdump")
    p.add_argument("--forward", action="store_true", help="the forward kernel (default: the backward)")
    p.add_argument("--sass-dir", help="also write each main kernel's SASS here")
    p.add_argument("--ladder", action="store_true", help="build over the whole ladder, not its first rung")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        import os

        os.environ["ATTNGEN_CACHE_DIR"] = cache  # nothing here reads or writes the user's cache
        import torch

        import attngen
        import bench_forward as bf
        from bench_training import LEARNABLE, make_learnable
        from attngen.jit.spec import SM90_BWD_KERNEL, build_first_without_spills

        kernel = "sm90" if args.forward else SM90_BWD_KERNEL
        library, entry = ("libattngen_fwd.so", "attngen_fwd_kernel") if args.forward else \
            ("libattngen_bwd.so", "attngen_bwd_kernel")

        print("| variant | D | setting | BK built | spilled bytes | " + " | ".join(OPS) + " | instructions |")
        print("|---|---|---|---|---|" + "---|" * (len(OPS) + 1))
        for key in args.variants:
            if key in LEARNABLE:
                score_mod, mask_mod, _ = make_learnable(key, 8192, 16, "cpu")
            else:
                score_mod, mask_mod = bf.make_variant(key, 8192, 16, "cpu")
            attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
            for hd in args.head_dim:
                spec = attn.spec(torch.bfloat16, hd, "sm_90a", kernel=kernel)
                inc = spec.variant_inc()
                ladder = tuple(spec.tile_choices())
                ladder = ladder if args.ladder else ladder[:1]
                for setting in args.settings:
                    fields = setting_fields(setting)
                    with tempfile.TemporaryDirectory() as d:
                        built, spill = build_first_without_spills(Path(d), inc, torch.bfloat16, hd, "sm_90a",
                                                                  tuple(replace(t, **fields) for t in ladder),
                                                                  kernel=kernel)
                        sass = subprocess.run([args.cuobjdump, "-sass", str(Path(d) / library)],
                                              capture_output=True, text=True, check=True).stdout
                    main_kernel = next(f for f in sass.split("Function : ")[1:]  # not the pre / post kernels
                                       if f"{len(entry)}{entry}E" in f.split("\n", 1)[0])
                    if args.sass_dir:
                        Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
                        lines = [re.sub(r"_GLOBAL__N__\w+?_attngen_\w+?_cu_\w+?\d+", "ANON", line)
                                 for line in main_kernel.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
                        name = f"{key}-hd{hd}-{'fwd' if args.forward else 'bwd'}-{setting.replace(',', '_')}.sass"
                        (Path(args.sass_dir) / name).write_text("\n".join(lines) + "\n")
                    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", main_kernel)
                    c = Counter(o.split(".")[0] for o in ops)
                    print(f"| {key} | {hd} | {setting} | {built.block_k} | {spill} | " + " | ".join(str(c[o]) for o in OPS)
                          + f" | {len(ops)} |", flush=True)


if __name__ == "__main__":
    main()
