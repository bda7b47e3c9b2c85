"""Resource/SASS report of the built SM90 kernels (no GPU needed): registers, spills, shared memory,
HGMMA / LDL / STL counts. Needs cuobjdump (CUDA toolkit, or `pip install nvidia-cuda-cuobjdump`).
Usage: python scripts/sass_report.py [--cuobjdump PATH] > report.md"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import torch

import attngen
from attngen.jit.render import KERNEL_SOURCE
from attngen.launch import load_library

p = argparse.ArgumentParser()
p.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
p.add_argument("--kernel", default="sm90")
args = p.parse_args()
if not args.cuobjdump:
    sys.exit("cuobjdump not found: install the CUDA toolkit or `pip install nvidia-cuda-cuobjdump`, or pass --cuobjdump")

docs = torch.randint(0, 8, (8192,)).sort().values
docs2 = torch.randint(0, 9, (8192,)).sort().values
bias = torch.randn(8, 16384).to(torch.bfloat16)


def bias_mod(s, b, h, q, k):
    return s + bias[h, q - k + 8192]


cases = [
    ("full", attngen.compile(), (64, 128, 256)),
    ("causal", attngen.compile(causal=True), (64, 128, 256)),
    ("sliding_window(1024)", attngen.compile(window=1024), (128,)),
    ("softcap(30)", attngen.compile(softcap=30.0), (128,)),
    ("softcap(30)+causal", attngen.compile(softcap=30.0, causal=True), (128,)),
    ("alibi(16)+causal", attngen.compile(score_mod=attngen.alibi(16), causal=True), (128,)),
    ("document", attngen.compile(mask_mod=attngen.document(docs)), (128,)),
    ("prefix_lm(2048)", attngen.compile(mask_mod=attngen.prefix_lm(2048)), (128,)),
    # heavy mods of the GPU suite, which spill at the default tiles and move down the spill ladder
    ("two documents", attngen.compile(mask_mod=attngen.document(docs) & attngen.document(docs2)), (128,)),
    ("bias table + causal", attngen.compile(score_mod=bias_mod, causal=True), (128,)),
]
print("| variant | head dim | kernel | tiles (BQ x BK) | grid | registers | spill stores/loads (bytes) | smem (static) "
      "| HGMMA | LDL | STL |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, attn, dims in cases:
    for d in dims:
        lib = attn.spec(torch.bfloat16, d, "sm_90a", args.kernel).build_cached()
        res = subprocess.run([args.cuobjdump, "--dump-resource-usage", str(lib)], capture_output=True, text=True).stdout
        # cuobjdump --dump-sass runs nvdisasm, found on PATH: put the cuobjdump directory there too
        env = dict(os.environ, PATH=os.path.dirname(args.cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
        done = subprocess.run([args.cuobjdump, "--dump-sass", str(lib)], capture_output=True, text=True, env=env)
        sass = done.stdout
        if "Function :" not in sass:
            sys.exit(f"cuobjdump --dump-sass gave no SASS for {lib} (is nvdisasm on PATH?): {done.stderr[-500:]}")
        m = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res, re.S)
        reg, shared, local = (m.groups() if m else ("?", "?", "?"))
        n_hgmma, n_ldl, n_stl = (len(re.findall(pat, sass)) for pat in (r"HGMMA", r"\bLDL", r"\bSTL"))
        info = load_library(lib)  # reads the kernel info block only: no GPU needed
        src = lib.parent / KERNEL_SOURCE  # its header comment states the tile settings it was rendered with
        grid = "persistent" if src.exists() and "persistent True" in src.read_text()[:2000] else "CTA per tile"
        print(f"| {name} | {d} | {args.kernel} | {info.block_q}x{info.block_k} | {grid} | {reg} | local {local} "
              f"| {shared} | {n_hgmma} | {n_ldl} | {n_stl} |", flush=True)
