"""Is the sm90 backward's SASS unchanged against a git revision? Builds each variant's sm90_bwd library (or, with
--kernel, another family's: `sm90` builds the forward library, whose second unit is the KV-cache kernel) at head
dims 64 and 128 from this tree and from REV (a `git worktree` of it, imported in a subprocess), each side into a
cache of its own, dumps both with cuobjdump and compares the instruction text (addresses and encodings kept; the
file header and the anonymous namespace's per-source hash in the function names dropped), kernel by kernel, naming
the kernels that differ: the order the kernels lie in the library is where their sources define them, not a
difference. scripts/sass_diff.py does this for the forward kernels from their sources; this one goes through each
tree's whole build (its ladder, codegen and renderer). No GPU needed.

    python scripts/bwd_sass_cmp.py REV [--variants causal document softcap_causal] [--cuobjdump PATH] [--keep DIR]
        [--kernel sm90_bwd]

--keep writes both sides' SASS of every case that differs into DIR (<variant>-hd<D>.{rev,here}.sass). A kernel whose
instructions and order are the same but whose registers were assigned otherwise is named "(registers renamed only)".

cuobjdump needs nvdisasm on PATH (or NVDISASM_PATH) to dump SASS; without it the build's dump fails here.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# variants by name, as an expression over attngen and torch (each side evaluates it with its own attngen)
VARIANTS = {
    "full": "attngen.compile()",
    "causal": "attngen.compile(causal=True)",
    "window": "attngen.compile(window=1024)",
    "document": "attngen.compile(mask_mod=attngen.document(torch.arange(4096) // 700))",
    "softcap_causal": "attngen.compile(softcap=30.0, causal=True)",
    "alibi_causal": "attngen.compile(score_mod=attngen.alibi(16), causal=True)",
}

DUMP = """
import os, subprocess, sys, torch
sys.path.insert(0, sys.argv[1])
import attngen
assert attngen.__file__.startswith(sys.argv[1]), attngen.__file__
variants = eval(sys.argv[3])
kernel = sys.argv[4]
for name, hd in ((n, int(h)) for n, h in (x.split(":") for x in sys.argv[5:])):
    lib = variants[name].spec(torch.bfloat16, hd, "sm_90a", kernel).build_cached()
    out = subprocess.run([sys.argv[2], "--dump-sass", str(lib)], capture_output=True, text=True, check=True).stdout
    print(f"== {name} {hd}")
    print("\\n".join(l for l in out.splitlines() if l.strip().startswith(("/*", "Function"))))
"""


def dump(tree: Path, cuobjdump: str, cases, cache: str, kernel: str) -> dict:
    """{(variant, head dim): SASS text} of tree's builds."""
    env = dict(os.environ, ATTNGEN_CACHE_DIR=cache, PYTHONPATH=str(tree))
    table = "{" + ", ".join(f"{n!r}: {VARIANTS[n]}" for n in dict.fromkeys(n for n, _ in cases)) + "}"
    args = [f"{n}:{hd}" for n, hd in cases]
    run = subprocess.run([sys.executable, "-c", DUMP, str(tree), cuobjdump, table, kernel, *args], env=env,
                         cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"building or dumping at {tree} failed:\n{run.stderr[-3000:]}")
    out = run.stdout
    parts = {}
    for block in out.split("== ")[1:]:
        head, _, body = block.partition("\n")
        name, hd = head.split()
        parts[(name, int(hd))] = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", body)
    return parts


def by_kernel(sass: str) -> dict:
    """{kernel name: its SASS} of one library's dump."""
    kernels, name = {}, None
    for line in sass.splitlines():
        if line.strip().startswith("Function"):
            name = line.split(":", 1)[1].strip()
            kernels[name] = []
        elif name is not None:
            kernels[name].append(line)
    return {n: "\n".join(body) for n, body in kernels.items()}


def opcodes_and_operands(sass: str) -> str:
    """The SASS with register numbers (general, uniform, predicate), encodings and spacing dropped: equal for two
    kernels that issue the same instructions in the same order and differ only in how the registers were assigned."""
    text = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", sass)
    text = re.sub(r"\bU?(R|P)\d+\b", r"\1", text)
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def kernel_name(mangled: str) -> str:
    """A kernel's own name in its mangled one (attngen_bwd_pre_kernel, ...): after the namespace's attngen_bwd_cu."""
    tail = mangled[mangled.rfind("attngen_"):]
    return tail[:tail.find("kernel") + len("kernel")] if "kernel" in tail else mangled


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rev")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    p.add_argument("--keep", default=None, metavar="DIR", help="write the SASS of cases that differ here")
    p.add_argument("--kernel", default="sm90_bwd", help="the family whose libraries are built (sm90_bwd, sm90, sm80)")
    args = p.parse_args(argv)
    cases = [(n, hd) for n in args.variants for hd in (64, 128)]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "rev"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), args.rev], check=True)
        try:
            before = dump(old, args.cuobjdump, cases, str(Path(tmp) / "cache-rev"), args.kernel)
            after = dump(ROOT, args.cuobjdump, cases, str(Path(tmp) / "cache-here"), args.kernel)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    same = True
    for case in cases:
        old_k, new_k = by_kernel(before[case]), by_kernel(after[case])
        equal = old_k == new_k
        same &= equal
        differ = sorted({kernel_name(k) + (" (registers renamed only)" if k in old_k and k in new_k and
                                           opcodes_and_operands(old_k[k]) == opcodes_and_operands(new_k[k]) else "")
                         for k in old_k.keys() | new_k.keys() if old_k.get(k) != new_k.get(k)})
        print(f"{case[0]} hd{case[1]}: {'same SASS' if equal else 'SASS differs: ' + ', '.join(differ)} "
              f"({len(after[case].splitlines())} lines here, {len(before[case].splitlines())} at {args.rev})")
        if not equal and args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for side, text in (("rev", before[case]), ("here", after[case])):
                (Path(args.keep) / f"{case[0]}-hd{case[1]}.{side}.sass").write_text(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
