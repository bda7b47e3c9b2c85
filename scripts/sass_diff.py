"""Is the SASS of the default SM90 kernels unchanged against a git revision's templates? For changes
meant to touch only non-default paths (tile options that are off) or comments: the GPU results of that
revision then still describe the default kernels. Needs nvcc and cuobjdump (+ nvdisasm beside it).
Usage: sass_diff.py REV --cuobjdump PATH"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import attngen  # noqa: E402
from attngen import build  # noqa: E402
from attngen.codegen import render_variant_inc  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("rev")
p.add_argument("--cuobjdump", required=True)
args = p.parse_args()

docs = torch.randint(0, 8, (8192,)).sort().values
cases = [("full", attngen.compile(), (64, 128, 256)), ("causal", attngen.compile(causal=True), (64, 128, 256)),
         ("softcap_causal", attngen.compile(softcap=30.0, causal=True), (128,)),
         ("alibi_causal", attngen.compile(score_mod=attngen.alibi(16), causal=True), (128,)),
         ("document", attngen.compile(mask_mod=attngen.document(docs)), (128, 256))]
work = Path(tempfile.mkdtemp(prefix="sass_diff_"))
old_templates = work / "old_templates"
old_templates.mkdir()
names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{args.rev}:attngen/templates"],
                       capture_output=True, text=True, check=True).stdout.split()
for n in names:
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.rev}:attngen/templates/{n}"],
                          capture_output=True, text=True, check=True).stdout
    (old_templates / n).write_text(text)
env = dict(os.environ, PATH=os.path.dirname(args.cuobjdump) + os.pathsep + os.environ.get("PATH", ""))


def sass(src: dict, d: Path) -> str:
    d.mkdir(parents=True)
    for k, v in src.items():
        (d / k).write_text(v)
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-I.", "-cubin",
                    build.KERNEL_SOURCE, "-o", "k.cubin"], cwd=d, check=True)
    out = subprocess.run([args.cuobjdump, "--dump-sass", "k.cubin"], cwd=d, capture_output=True, text=True,
                         env=env).stdout
    # instruction lines ("/*0a40*/  HGMMA ... /* 0x... */"), not the encoding-only continuation lines
    lines = [ln.split("/* 0x")[0].rstrip() for ln in out.splitlines()
             if ln.strip().startswith("/*") and not ln.strip().startswith("/* 0x")]
    if not lines:
        sys.exit(f"no SASS from {d}")
    return "\n".join(lines)


same = True
for name, attn, dims in cases:
    inc = render_variant_inc(attn.traced, attn.predicates)
    for hd in dims:
        new = build.render_sources(inc, torch.bfloat16, hd, "sm_90a", kernel="sm90")
        current = build.TEMPLATE_DIR
        headers = build.SM90_HEADERS
        build.TEMPLATE_DIR = old_templates  # the revision's templates, rendered by today's build.py
        build.SM90_HEADERS = tuple(h for h in headers  # headers the revision did not have yet are not used by it
                                   if (old_templates / h).exists() or (old_templates / (h + ".j2")).exists())
        build._jinja_env.cache_clear()      # (the Jinja environment is memoised with its loader's folder)
        try:
            old = build.render_sources(inc, torch.bfloat16, hd, "sm_90a", kernel="sm90")
        finally:
            build.TEMPLATE_DIR, build.SM90_HEADERS = current, headers
            build._jinja_env.cache_clear()
        for h in old_templates.glob("*.cuh"):  # headers the revision's kernel may include beyond today's list
            old.setdefault(h.name, h.read_text())
        if old == new:
            print(f"{name:16s} hd{hd:<4d} same sources", flush=True)
            continue
        a, b = sass(old, work / f"{name}{hd}old"), sass(new, work / f"{name}{hd}new")
        ok = a == b
        same &= ok
        print(f"{name:16s} hd{hd:<4d} {'identical' if ok else 'DIFFERENT'} ({len(b.splitlines())} SASS lines)", flush=True)
sys.exit(0 if same else 1)
