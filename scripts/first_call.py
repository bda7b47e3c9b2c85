"""New-process first call of a cached variant: the seconds from after `import torch` (and the inputs on
the device) to the first output, i.e. `import attngen` + `attngen.compile(...)` + the first call (+ CUDA
synchronize), each measurement in a fresh Python process, after a warm-up process per variant has filled
the caches (analysis records, kernel libraries). Also says whether sympy got imported (it must not be on
this path). CUDA inputs when torch sees a GPU (the kernel path: cache lookup + dlopen), else CPU inputs
(the reference path).

Usage: first_call.py [--runs N] [--cache-dir DIR | --fresh-cache] [--variants causal,softcap,document,user]
    (the default cache is the one attngen uses: $ATTNGEN_CACHE_DIR or ~/.cache/attngen)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_S = 0.3  # issue 15: first call of a cached variant within this many seconds beyond `import torch`
VARIANTS = ("causal", "softcap", "document", "user")


def user_mask(b, h, q_idx, kv_idx):
    # a plain function, as a user writes one (the fingerprint walks its code, not a library object)
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 256)


def child(variant: str) -> None:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    cuda = torch.cuda.is_available()
    if cuda:
        shape, dtype, device = (1, 8, 1024, 128), torch.bfloat16, "cuda"
    else:
        shape, dtype, device = (1, 2, 256, 64), torch.float32, "cpu"
    q, k, v = (torch.randn(shape, dtype=dtype, device=device) for _ in range(3))
    doc_ids = torch.repeat_interleave(torch.arange(4, dtype=torch.int32, device=device), shape[2] // 4)
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    import attngen

    t3 = time.perf_counter()
    options = {
        "causal": lambda: dict(causal=True),
        "softcap": lambda: dict(softcap=30.0, causal=True),
        "document": lambda: dict(mask_mod=attngen.document(doc_ids), causal=True),
        "user": lambda: dict(mask_mod=user_mask),
    }[variant]()
    attn = attngen.compile(**options)
    t4 = time.perf_counter()
    out = attn(q, k, v)
    if cuda:
        torch.cuda.synchronize()
    t5 = time.perf_counter()
    assert out.shape == q.shape
    print(json.dumps({"variant": variant, "device": torch.cuda.get_device_name() if cuda else "cpu",
                      "import_torch": t1 - t0, "import_attngen": t3 - t2, "compile": t4 - t3, "call": t5 - t4,
                      "first_call": t5 - t2, "sympy": "sympy" in sys.modules,
                      "traced": getattr(attn, "_analysis", None) is not None}))


def start_child(variant: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", variant], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result_of(variant: str, proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: the measuring process failed (exit {proc.returncode}):\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def run_child(variant: str, env: dict) -> dict:
    return result_of(variant, start_child(variant, env))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=5, help="measured processes per variant (default 5)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--cache-dir", help="the attngen cache to use (ATTNGEN_CACHE_DIR)")
    where.add_argument("--fresh-cache", action="store_true", help="an empty temporary cache (kernels get built)")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {','.join(VARIANTS)}")
    env = dict(os.environ)
    tmp = tempfile.TemporaryDirectory(prefix="attngen-first-call-") if args.fresh_cache else None
    if tmp is not None:
        env["ATTNGEN_CACHE_DIR"] = tmp.name
    elif args.cache_dir:
        env["ATTNGEN_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    print(f"cache: {env.get('ATTNGEN_CACHE_DIR', 'attngen default')}; {args.runs} fresh processes per variant")
    failed = False
    # warm-up: one process per variant, all at once (their kernel builds are independent), fills the analysis
    # records and builds or finds the kernel libraries
    warming = {variant: start_child(variant, env) for variant in variants}
    warmed = {variant: result_of(variant, proc) for variant, proc in warming.items()}
    for variant in variants:
        warm = warmed[variant]
        runs = [run_child(variant, env) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("import_torch", "import_attngen", "compile",
                                                                     "call", "first_call")}
        sympy = any(r["sympy"] for r in runs)
        traced = any(r["traced"] for r in runs)
        ok = med["first_call"] <= BUDGET_S and not sympy and not traced
        failed |= not ok
        print(f"{variant:9s} {runs[0]['device']}: first call {med['first_call']:.3f} s beyond import torch "
              f"(median; min {min(r['first_call'] for r in runs):.3f}) = import attngen {med['import_attngen']:.3f}"
              f" + compile {med['compile']:.3f} + call {med['call']:.3f}; import torch {med['import_torch']:.2f} s; "
              f"sympy imported: {'yes' if sympy else 'no'}; traced: {'yes' if traced else 'no'}; warm-up process "
              f"{warm['first_call']:.2f} s; {'ok' if ok else 'OVER BUDGET'} ({BUDGET_S} s)")
    if tmp is not None:
        tmp.cleanup()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
