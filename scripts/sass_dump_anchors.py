"""Build the anchor variants with the attngen on PYTHONPATH (through the variant's kernel spec, so each gets the tiles
its spill ladder picks) and write each library's SASS instruction lines to OUT/<variant>-hd<D>.sass.
Run it from git worktrees of two revisions and `cmp` the files to tell which kernels a change touched, or count an
instruction in both (`grep -cE ' (FADD|FMUL|FFMA) ' OUT/alibi_causal-hd128.sass`).
Usage: ATTNGEN_CACHE_DIR=... PYTHONPATH=<tree> python scripts/sass_dump_anchors.py OUT --cuobjdump PATH"""
import argparse
import os
import subprocess

import torch

import attngen

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--cuobjdump", required=True)
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
# cuobjdump --dump-sass runs nvdisasm, found on PATH: put the cuobjdump directory there too
env = dict(os.environ, PATH=os.path.dirname(args.cuobjdump) + os.pathsep + os.environ["PATH"])
docs = torch.randint(0, 8, (8192,), generator=torch.Generator().manual_seed(0)).sort().values
cases = [("full", attngen.compile(), (64, 128, 256)), ("causal", attngen.compile(causal=True), (64, 128, 256)),
         ("sliding", attngen.compile(window=1024), (128,)), ("softcap", attngen.compile(softcap=30.0), (128,)),
         ("softcap_causal", attngen.compile(softcap=30.0, causal=True), (128,)),
         ("alibi_causal", attngen.compile(score_mod=attngen.alibi(16), causal=True), (128,)),
         ("document", attngen.compile(mask_mod=attngen.document(docs)), (128,)),
         ("prefix", attngen.compile(mask_mod=attngen.prefix_lm(2048)), (128,)),
         # issue 15's division score mod (bench_forward.py's div_score)
         ("div_score", attngen.compile(score_mod=attngen.ScoreMod(
             lambda s, b, h, q, kv: s / (1 + 1e-4 * (q - kv) ** 2), "div_score")), (128,))]
for name, attn, dims in cases:
    for d in dims:
        lib = attn.spec(torch.bfloat16, d, "sm_90a", "sm90").build_cached()
        sass = subprocess.run([args.cuobjdump, "--dump-sass", str(lib)], capture_output=True, text=True, env=env).stdout
        # instruction lines ("/*0a40*/  HGMMA ... /* 0x... */"), not the encoding-only continuation lines
        lines = [ln.split("/* 0x")[0].rstrip() for ln in sass.splitlines()
                 if ln.strip().startswith("/*") and not ln.strip().startswith("/* 0x")]
        with open(os.path.join(args.out, f"{name}-hd{d}.sass"), "w") as f:
            f.write("\n".join(lines))
        print(name, d, len(lines), flush=True)
