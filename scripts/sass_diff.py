"""Is every kernel's SASS unchanged against a git revision? For restructurings of the kernel sources
(templates, headers, the renderer) that must not change what runs on the GPU.

The revision's whole tree is unpacked (`git archive`) and its sources are rendered by ITS OWN renderer
(a subprocess importing that tree); today's are rendered by today's attngen.jit.render. Both sides get
the same variant.inc (today's codegen), so a difference is the kernel sources' doing; where the
revision's own codegen writes a different variant.inc, that pair is compiled as well and reported on
its own line. Each side is compiled with nvcc -cubin and dumped with cuobjdump; the instruction text
(addresses and encodings stripped) and the per-function resource usage are compared, and "encodings
identical" says whether the control words (stall counts, barriers) match too.

Cases: the landed set, every rung of each variant's sm90 tile ladder (jit.tiles.sm90_ladder), plus the
sm80 kernel on sm_80; `--quick` takes a handful of them. Compiled results are cached by content, so a
rerun compiles only what changed.

Usage: python scripts/sass_diff.py REV [--quick] [--jobs 2] [--cuobjdump PATH] [--cache DIR] [--keep DIR]
Needs nvcc, and cuobjdump with nvdisasm beside it (PATH, next to nvcc, the nvidia-cuda-cuobjdump /
nvidia-cuda-nvdisasm wheels, or --cuobjdump); exit status 0 when every case is identical. To find what
makes a kernel differ, --keep the sources and diff the two sides' PTX (nvcc -ptx): ptxas gives the same
SASS for the same PTX, and small source changes (a helper function, a struct field instead of a local)
can reorder it."""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.codegen import render_variant_inc  # noqa: E402
from attngen.jit import render, tiles as jtiles  # noqa: E402
from attngen.jit.toolchain import find_nvcc  # noqa: E402

# name -> expression evaluated in either tree (`attngen` and `docs` in scope): the landed anchors
VARIANTS = {
    "full": "attngen.compile()",
    "causal": "attngen.compile(causal=True)",
    "sliding": "attngen.compile(window=1024)",
    "softcap_causal": "attngen.compile(softcap=30.0, causal=True)",
    "alibi_causal": "attngen.compile(score_mod=attngen.alibi(16), causal=True)",
    "document": "attngen.compile(mask_mod=attngen.document(docs))",
    "prefix": "attngen.compile(mask_mod=attngen.prefix_lm(2048))",
    "softcap": "attngen.compile(softcap=30.0)",
}
SM80_VARIANTS = ("full", "causal", "softcap", "document")
HEAD_DIMS = (64, 128, 256)
# --quick: (kernel, variant, head dim, rung index into the variant's ladder; sm80: None); prefix: a union mask's
# run-time work-tile order
QUICK = [("sm90", "causal", 128, 0), ("sm90", "causal", 128, -1), ("sm90", "full", 128, 0),
         ("sm90", "softcap_causal", 64, 0), ("sm90", "document", 256, -1), ("sm90", "prefix", 128, 0),
         ("sm80", "causal", 128, None),
         ("sm80", "document", 256, None)]
FLAGS = {"sm90": ["-gencode=arch=compute_90a,code=sm_90a"], "sm80": ["-gencode=arch=compute_80,code=sm_80"]}
ARCH = {"sm90": "sm_90a", "sm80": "sm_80"}

# Runs inside the revision's tree: renders every job with that tree's own renderer (attngen.jit.render, or
# attngen.build before the jit/ split, e.g. at 44b2352) around its own codegen's variant.inc. Tile fields
# today's dataclasses have and the revision's lack are dropped (reported); fields only the revision has
# keep its defaults (at 44b2352: poly_exp2 = 0, fold_log2e = False, what every landed build used).
OLD_RENDER = r"""
import dataclasses, json, sys
import torch
import attngen
job = json.load(sys.stdin)
assert attngen.__file__.startswith(job["tree"]), attngen.__file__
try:
    from attngen.jit.render import render_sources
    from attngen.jit.tiles import Sm90Tiles, TileConfig
except ImportError:
    from attngen.build import render_sources, Sm90Tiles, TileConfig
from attngen.codegen import render_variant_inc
docs = torch.tensor(job["docs"])
incs = {}
for name, expr in job["variants"].items():
    attn = eval(expr)
    incs[name] = render_variant_inc(attn.traced, attn.predicates)
out = {"incs": incs, "sources": {}, "dropped": []}
for key, c in job["cases"].items():
    cls = Sm90Tiles if c["kernel"] == "sm90" else TileConfig
    known = {f.name for f in dataclasses.fields(cls)}
    out["dropped"] += sorted(set(c["tiles"]) - known)
    t = cls(**{k: v for k, v in c["tiles"].items() if k in known})
    out["sources"][key] = render_sources(incs[c["variant"]], c["dtype"], c["head_dim"], c["arch"], tiles=t,
                                         kernel=c["kernel"])
out["dropped"] = sorted(set(out["dropped"]))
json.dump(out, sys.stdout)
"""


def find_cuobjdump(explicit):
    if explicit:
        return explicit
    dirs = [str(Path(find_nvcc()).parent)] + os.environ.get("PATH", "").split(os.pathsep)
    try:
        import nvidia  # type: ignore

        for r in nvidia.__path__:
            dirs += sorted(glob.glob(os.path.join(r, "*", "bin")))
    except ImportError:
        pass
    for d in dirs:
        if os.access(os.path.join(d, "cuobjdump"), os.X_OK) and os.access(os.path.join(d, "nvdisasm"), os.X_OK):
            return os.path.join(d, "cuobjdump")
    sys.exit("cuobjdump + nvdisasm not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or --cuobjdump")


def cases(quick: bool):
    """[(key, kernel, variant, head dim, tiles)], tiles today's dataclass."""
    out = []

    def add(kernel, name, hd, rung):
        if kernel == "sm80":
            t = jtiles.tile_config(hd, "sm_80")
            out.append((f"sm80 {name} hd{hd}", kernel, name, hd, t))
            return
        attn_kind = VARIANT_KIND[name]
        ladder = jtiles.sm90_ladder(hd, *attn_kind)
        idx = range(len(ladder)) if rung is None else [rung % len(ladder)]
        for r in idx:
            t = ladder[r]
            tag = (f"r{r} bk{t.block_k}s{t.stages}{'' if t.overlap else ' no-overlap'}"
                   f"{' persistent' if t.persistent else ''}{'' if t.pingpong else ' no-pingpong'}{' cross' if t.cross_tile else ''}")
            out.append((f"sm90 {name} hd{hd} {tag}", kernel, name, hd, t))

    if quick:
        for kernel, name, hd, rung in QUICK:
            add(kernel, name, hd, rung)
    else:
        for name in VARIANTS:
            for hd in HEAD_DIMS:
                add("sm90", name, hd, None)
        for name in SM80_VARIANTS:
            for hd in HEAD_DIMS:
                add("sm80", name, hd, None)
    return out


def normalize(dump: str) -> tuple:
    """(instruction text without addresses / encodings, encodings) of a cuobjdump --dump-sass output."""
    text, enc = [], []
    for ln in dump.splitlines():
        s = ln.strip()
        if s.startswith("Function :"):
            text.append(s)
        elif s.startswith("/* 0x"):
            enc.append(s)
        elif s.startswith("/*"):
            m = re.match(r"/\*[0-9a-f]+\*/\s*(.*?)\s*(/\* 0x[0-9a-f]+ \*/)?$", s)
            text.append(m.group(1))
            if m.group(2):
                enc.append(m.group(2))
    return "\n".join(text), "\n".join(enc)


def compile_sass(files: dict, kernel: str, cache: Path, cuobjdump: str, nvcc: str) -> dict:
    h = hashlib.sha256(json.dumps([nvcc, FLAGS[kernel], sorted(files.items())]).encode()).hexdigest()[:32]
    hit = cache / f"{h}.json"
    if hit.exists():
        return json.loads(hit.read_text())
    d = Path(tempfile.mkdtemp(prefix="sass_diff_"))
    try:
        for k, v in files.items():
            (d / k).write_text(v)
        cmd = [nvcc, "-O3", "-std=c++17", *FLAGS[kernel], "-I.", "-cubin", render.KERNEL_SOURCE, "-o", "k.cubin"]
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed in {d}:\n{p.stderr[-4000:]}")
        env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
        dump = subprocess.run([cuobjdump, "--dump-sass", "k.cubin"], cwd=d, capture_output=True, text=True,
                              env=env, check=True).stdout
        res = subprocess.run([cuobjdump, "--dump-resource-usage", "k.cubin"], cwd=d, capture_output=True,
                             text=True, env=env, check=True).stdout
        text, enc = normalize(dump)
        if not text:
            raise RuntimeError(f"no SASS from {d}")
        usage = "\n".join(ln.strip() for ln in res.splitlines() if "REG:" in ln or "Function" in ln)
        result = {"sass": text, "enc": hashlib.sha256(enc.encode()).hexdigest(), "usage": usage}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    hit.write_text(json.dumps(result))
    return result


def _unnamed(text: str) -> str:
    """Internal-linkage names carry a per-translation-unit hash (_GLOBAL__N__47a1eab8_, _INTERNAL_28fab708_)."""
    return re.sub(r"_(GLOBAL__N_|INTERNAL)_[0-9a-f]+_", r"_\1_", text)


def verdict(a: dict, b: dict) -> str:
    a, b = ({k: _unnamed(v) for k, v in x.items()} for x in (a, b))
    if a["sass"] != b["sass"] or a["usage"] != b["usage"]:
        la, lb = a["sass"].splitlines(), b["sass"].splitlines()
        first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
        return (f"DIFFERENT ({len(la)} vs {len(lb)} SASS lines, first difference at line {first}"
                f"{'' if a['usage'] == b['usage'] else '; resource usage differs'})")
    n = len(b["sass"].splitlines())
    return f"identical ({n} SASS lines, encodings {'identical' if a['enc'] == b['enc'] else 'DIFFER'})"


VARIANT_KIND = {}  # name -> (has_mask, has_score_mod), filled in main


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rev", help="the revision to compare with, e.g. 44b2352")
    p.add_argument("--quick", action="store_true", help="a handful of cases instead of the whole landed set")
    p.add_argument("--jobs", type=int, default=2, help="nvcc compiles at a time (default 2)")
    p.add_argument("--cuobjdump")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/attngen_sass_diff"))
    p.add_argument("--keep", metavar="DIR", help="also write each build's sources to DIR/<case>/<side>/ (to diff "
                   "their PTX: nvcc -ptx)")
    args = p.parse_args()
    cuobjdump = find_cuobjdump(args.cuobjdump)
    nvcc = find_nvcc()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)

    docs = torch.randint(0, 8, (8192,), generator=torch.Generator().manual_seed(0)).sort().values
    incs, inc_error = {}, None
    for name, expr in VARIANTS.items():
        attn = eval(expr, {"attngen": attngen, "docs": docs})
        VARIANT_KIND[name] = (attn.traced.has_mask, attn.traced.has_score_mod)  # as jit.spec picks the ladder
        try:
            incs[name] = render_variant_inc(attn.traced, attn.predicates)
        except Exception as e:  # today's codegen mid-change: both sides take the revision's variant.inc
            inc_error = f"{type(e).__name__}: {e}"
    todo = cases(args.quick)

    with tempfile.TemporaryDirectory(prefix="sass_diff_tree_") as tree:
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=arch, check=True)
        job = {"tree": tree, "docs": docs.tolist(), "variants": VARIANTS, "cases": {
            key: {"kernel": kernel, "variant": name, "head_dim": hd, "dtype": "bfloat16", "arch": ARCH[kernel],
                  "tiles": dataclasses.asdict(t)} for key, kernel, name, hd, t in todo}}
        env = dict(os.environ, PYTHONPATH=tree)
        p_old = subprocess.run([sys.executable, "-c", OLD_RENDER], input=json.dumps(job), capture_output=True,
                               text=True, env=env, cwd=tree)
        if p_old.returncode != 0:
            sys.exit(f"rendering with {args.rev}'s own code failed:\n{p_old.stderr[-4000:]}")
        old = json.loads(p_old.stdout)
    if inc_error is not None:
        print(f"note: today's codegen failed ({inc_error}); both sides get {args.rev}'s variant.inc", flush=True)
        incs = dict(old["incs"])

    builds = {}  # (key, side) -> files
    for key, kernel, name, hd, t in todo:
        new = render.render_sources(incs[name], torch.bfloat16, hd, ARCH[kernel], tiles=t, kernel=kernel)
        o = dict(old["sources"][key], **{render.VARIANT_INCLUDE: incs[name]})
        for k, v in new.items():  # headers today's variant.inc may include that the revision did not have
            if k.endswith((".cuh", ".h")):
                o.setdefault(k, v)
        builds[(key, "old")] = o
        builds[(key, "new")] = new
        if old["incs"][name] != incs[name]:
            builds[(key, "old_own")] = old["sources"][key]  # rendered around the revision's own variant.inc
    kernel_of = {key: kernel for key, kernel, *_ in todo}
    if args.keep:
        for (key, side), files in builds.items():
            d = Path(args.keep) / re.sub(r"[^A-Za-z0-9_.-]+", "_", key) / side
            d.mkdir(parents=True, exist_ok=True)
            for k, v in files.items():
                (d / k).write_text(v)
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"{args.rev} vs working tree: {len(todo)} kernels, {len(builds)} builds, nvcc {args.jobs} at a time "
          f"({ver}; {cuobjdump})", flush=True)
    if old["dropped"]:
        print(f"  note: {args.rev}'s tile dataclasses lack {', '.join(old['dropped'])}: its kernels are built "
              "without them", flush=True)
    for name in VARIANTS:
        if old["incs"][name] != incs[name]:
            print(f"  note: {args.rev}'s codegen writes a different variant.inc for {name}: also compared "
                  "(old sources + old variant.inc vs new sources + new variant.inc)", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {k: ex.submit(compile_sass, f, kernel_of[k[0]], cache, cuobjdump, nvcc) for k, f in builds.items()}
        same = True
        for key, kernel, name, hd, t in todo:
            try:
                a, b = futs[(key, "old")].result(), futs[(key, "new")].result()
                v = verdict(a, b)
            except RuntimeError as e:
                b, v = None, f"FAILED: {e}"
            same &= v.startswith("identical")
            print(f"{key:56s} {v}", flush=True)
            if (key, "old_own") in futs and b is not None:
                try:
                    v = verdict(futs[(key, "old_own")].result(), b)
                except RuntimeError as e:
                    v = f"FAILED: {e}"
                same &= v.startswith("identical")
                print(f"{'  (each side its own variant.inc)':56s} {v}", flush=True)
    print("all identical" if same else "SOME KERNELS DIFFER")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
