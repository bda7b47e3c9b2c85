"""Device acceptance of the prebuilt kernels (issue 14.2): with nvcc hidden, every library of a prebuilt root (or
attngen-kernels wheel) for this GPU's arch runs with 0 builds: the forward, the backward and the KV-cache kernel
of each variant, dtype and head dim, each first call (timed alone) within BUDGET_MS. One fresh process per variant
(compile, then per dtype and head dim the first forward call, the first backward, the first with_kvcache call);
every output is checked against attngen's float32 reference on the same GPU.

    python scripts/prebuilt_check.py dist/attngen_kernels-*.whl      # installs it into a temporary directory
    python scripts/prebuilt_check.py attngen-prebuilt                # a prebuilt root (ATTNGEN_CACHE_READONLY)
    python scripts/prebuilt_check.py WHEEL --only document document_i32   # some variants only

Exit 1 when a variant builds, fails, is wrong or is over budget. Also reports whether the analysis records
matched (no sympy import): they hold for the Python / torch / sympy versions prebuilt.json names.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_MS = 50.0
REPO = Path(__file__).resolve().parents[1]


def child(name: str, targets: str) -> None:
    t0 = time.perf_counter()
    import torch

    import attngen
    from attngen.prebuild import variant_of

    dev = torch.device("cuda")
    attn = attngen.compile(*(lambda v: (v.score_mod, v.mask_mod))(variant_of(name, "cuda", 4096)))
    t_compile = time.perf_counter()
    rows = []
    for dtype_name, hd in json.loads(targets):
        if dtype_name == "fp8":  # the FP8 forward alone (no backward, no KV-cache kernel), against its reference
            q8, k8, v8 = (torch.randn(1, 16, 4096, hd, device=dev).to(torch.float8_e4m3fn) for _ in range(3))
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = attn(q8, k8, v8, q_descale=0.5, k_descale=0.5)
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t) * 1e3
            ref = attngen.compile(*(lambda v: (v.score_mod, v.mask_mod))(attn.variant), backend="reference")(
                q8, k8, v8, q_descale=0.5, k_descale=0.5)
            rows.append({"dtype": dtype_name, "head_dim": hd, "first_call_ms": round(first_ms, 2),
                         "max_err": (out.float() - ref.float()).abs().max().item()})
            continue
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        q, k, v = (torch.randn(1, 16, 4096, hd, device=dev, dtype=dtype) for _ in range(3))
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = attn(q, k, v)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t) * 1e3
        ref = attngen.compile(*(lambda v: (v.score_mod, v.mask_mod))(attn.variant), backend="reference")(
            q.float(), k.float(), v.float())
        err = (out.float() - ref).abs().max().item()
        rows.append({"dtype": dtype_name, "head_dim": hd, "first_call_ms": round(first_ms, 2), "max_err": err})
        # the backward: its library's first call (autograd's thread; the forward's library is loaded already)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        o = attn(qg, kg, vg)
        dout = torch.randn_like(o)
        torch.cuda.synchronize()
        t = time.perf_counter()
        grads = torch.autograd.grad(o, (qg, kg, vg), dout)
        torch.cuda.synchronize()
        bwd_ms = (time.perf_counter() - t) * 1e3
        bad = not all(bool(torch.isfinite(g).all()) for g in grads)
        rows.append({"dtype": dtype_name, "head_dim": hd, "kind": "backward", "first_call_ms": round(bwd_ms, 2),
                     "max_err": float("inf") if bad else 0.0})
        # the KV-cache kernel: one query per sequence against a cache of 4000 positions, appending one
        qd = torch.randn(2, 16, 1, hd, device=dev, dtype=dtype)
        kc, vc = (torch.randn(2, 4, 4096, hd, device=dev, dtype=dtype) for _ in range(2))
        kn, vn = (torch.randn(2, 4, 1, hd, device=dev, dtype=dtype) for _ in range(2))
        lens = torch.tensor([4000, 77], dtype=torch.int32, device=dev)
        caches = (kc.float(), vc.float())
        torch.cuda.synchronize()
        t = time.perf_counter()
        od = attn.with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=lens)
        torch.cuda.synchronize()
        dec_ms = (time.perf_counter() - t) * 1e3
        ref_attn = attngen.compile(*(lambda v: (v.score_mod, v.mask_mod))(attn.variant), backend="reference")
        refd = ref_attn.with_kvcache(qd.float(), *caches, kn.float(), vn.float(), cache_seqlens=lens)
        rows.append({"dtype": dtype_name, "head_dim": hd, "kind": "decode", "first_call_ms": round(dec_ms, 2),
                     "max_err": (od.float() - refd).abs().max().item()})
    print(json.dumps({"variant": name, "compile_ms": round((t_compile - t0) * 1e3, 1), "rows": rows,
                      "sympy": "sympy" in sys.modules, "traced": attn._analysis is not None}))


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    only = sys.argv[3:] if len(sys.argv) > 3 and sys.argv[2] == "--only" else None
    if len(sys.argv) != 2 and only is None:
        raise SystemExit(__doc__)
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    src = Path(sys.argv[1]).resolve()
    work = Path(tempfile.mkdtemp(prefix="attngen-prebuilt-check-"))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "ATTNGEN_NVCC")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not os.path.exists(os.path.join(p, "nvcc")))  # nvcc removed from PATH
    env.update(ATTNGEN_CACHE_DIR=str(work / "user"), ATTNGEN_VERBOSE="1")
    env.pop("ATTNGEN_CACHE_READONLY", None)
    if src.suffix == ".whl":
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(work / "site"), str(src)],
                       check=True, capture_output=True)
        root, extra_path = work / "site" / "attngen_kernels", str(work / "site")
    else:
        root, extra_path = src, ""
        env["ATTNGEN_CACHE_READONLY"] = str(src)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(REPO), env.get("PYTHONPATH", "")) if p)
    doc = json.loads((root / "prebuilt.json").read_text())
    targets = {}
    for e in doc["entries"]:
        t = e.get("task")
        if t and t["arch"] == arch and t["kernel"] == "auto" and (only is None or t["variant"] in only):
            targets.setdefault(t["variant"], []).append((t["dtype"], t["head_dim"]))
    print(f"{len(doc['entries'])} libraries built with nvcc {doc['pins']['nvcc']} for attngen {doc['attngen']} "
          f"(records for Python {doc['python']}, torch {doc['torch']}); {arch}: {len(targets)} variants; nvcc hidden")
    failed = False
    for name, tg in sorted(targets.items()):
        p = subprocess.run([sys.executable, __file__, "--child", name, json.dumps(sorted(tg))], env=env,
                           capture_output=True, text=True)
        builds = p.stderr.count("attngen: building")
        if p.returncode != 0:
            print(f"{name}: FAILED\n{p.stderr[-2000:]}")
            failed = True
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        worst = max(r["rows"], key=lambda x: x["first_call_ms"])
        # FP8 rows: P rounded to e4m3 gives rows with few keys errors of ~0.02 |v| (1e-1 bounds randn inputs)
        bad = [x for x in r["rows"] if x["first_call_ms"] > BUDGET_MS or x["max_err"] > (1e-1 if x["dtype"] == "fp8"
                                                                                             else 3e-2)]
        failed |= bool(bad) or builds > 0
        print(f"{name:15s} builds {builds}, hits {p.stderr.count('cache hit prebuilt')}, compile {r['compile_ms']} ms,"
              f" first call max {worst['first_call_ms']} ms ({worst.get('kind', 'forward')} {worst['dtype']} "
              f"hd{worst['head_dim']}), max err "
              f"{max(x['max_err'] for x in r['rows']):.1e}, sympy {r['sympy']}, traced {r['traced']}"
              f"{'  <-- ' + json.dumps(bad) if bad else ''}")
        kinds = {}
        for x in r["rows"]:
            kinds[x.get("kind", "forward")] = max(kinds.get(x.get("kind", "forward"), 0.0), x["first_call_ms"])
        print(" " * 16 + "first call max by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in kinds.items()))
    print("OK" if not failed else "FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
