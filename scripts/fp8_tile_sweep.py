"""FP8 forward tile experiments: build the e4m3 sm90 forward of a few variants at several Sm90Tiles settings and time
the attention kernel alone (V^T made once), beside the variant's bf16 call, at B2 H16 S8192 D128 (the bench_fp8.py
shape). Also times the library's V transpose. Needs nvcc and an sm_90 GPU.
Usage: fp8_tile_sweep.py [--variants full,causal] [--tiles 2,3,2-pp,2-nopin,2-bk128]
(a tile spec: stages, then -noov (no intra-warpgroup overlap, hence no pinning), -nopp / -pp (pingpong off / on),
-pin / -nopin (softmax pinned ahead of the P V wait or not), -pers / -nopers (persistent grid forced on / off), -bkN
(BK = N kv columns), -rtN (rescale threshold N: FP8 takes a whole N <= 8); the rest as the ladder's first rung, so a
spec names another setting once that rung changes: scripts/round_s16.sh's comments say which each round meant).
Session 15's round H also swept an FMA-pipe exp2 for every n-th exponential, since taken out: docs/performance.md,
"FP8")."""
import argparse
import concurrent.futures as cf
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import attngen  # noqa: E402
from attngen import fp8  # noqa: E402
from attngen.jit.ninja import LIBRARY_NAME, ptxas_spill_bytes, run_ninja, write_build_ninja  # noqa: E402
from attngen.jit.render import render_sources  # noqa: E402
from attngen.launch import load_library  # noqa: E402
from bench_fp8 import quantise  # noqa: E402
from bench_forward import bench_ms, heat_gpu, make_variant, tflops  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--variants", default="full,causal")
p.add_argument("--tiles", default="2,3,2-pp,2-nopin,2-bk128")
p.add_argument("--S", type=int, default=8192)
p.add_argument("--rounds", type=int, default=3)
args = p.parse_args()
E4M3 = torch.float8_e4m3fn
B, H, S, D = 2, 16, args.S, 128


FLAGS = {"noov": dict(overlap=False, pin_softmax=False), "nopp": dict(pingpong=False), "pp": dict(pingpong=True),
         "pin": dict(pin_softmax=True), "nopin": dict(pin_softmax=False),
         "pers": dict(persistent=True, persistent_max_kv=0), "nopers": dict(persistent=False),
         "cross": dict(cross_tile=True), "nocross": dict(cross_tile=False)}


def tiles_for(spec, text):
    base = spec.tile_choices()[0]
    parts = text.split("-")
    t = replace(base, stages=int(parts[0]))
    for flag in parts[1:]:
        if flag.startswith("bk"):
            t = replace(t, block_k=int(flag[2:]))
        elif flag.startswith("rt"):
            t = replace(t, rescale_threshold=float(flag[2:]))
        elif flag in FLAGS:
            t = replace(t, **FLAGS[flag])
        else:
            raise SystemExit(f"tile spec {text!r}: unknown flag {flag!r} (expected bkN, rtN or one of {sorted(FLAGS)})")
    return t


def build(job):
    key, text, spec, inc = job
    t = tiles_for(spec, text)
    d = Path(tempfile.mkdtemp(prefix=f"fp8_{key}_{text}_"))
    write_build_ninja(d, render_sources(inc, E4M3, D, "sm_90a", tiles=t, kernel="sm90"), "sm_90a", ["-Xptxas", "-v"])
    spill = ptxas_spill_bytes(run_ninja(d, jobs=1), "attngen_fwd_kernel") or 0
    return key, text, t, d / LIBRARY_NAME, spill


gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, generator=gen).to("cuda", torch.bfloat16) for _ in range(3))
(q8, qd), (k8, kd), (v8, vd) = quantise(q, H), quantise(k, H), quantise(v, H)
jobs, attns = [], {}
for key in args.variants.split(","):
    sm, mm = make_variant(key, S, H, "cuda")
    attn = attngen.compile(score_mod=sm, mask_mod=mm)
    attns[key] = attn
    spec = attn.spec(E4M3, D, "sm_90a")
    inc = spec.variant_inc()
    jobs += [(key, text, spec, inc) for text in args.tiles.split(",")]
with cf.ThreadPoolExecutor(8) as ex:
    built = list(ex.map(build, jobs))
heat_gpu("cuda")
vt = None
print("| variant | tiles | spill | FP8 kernel ms | FP8 kernel TFLOP/s | bf16 call ms | kernel ÷ bf16 | max diff vs "
      "the default FP8 library |")
print("|---|---|---|---|---|---|---|---|")
for key, text, t, path, spill in built:
    lib = load_library(path)
    if vt is None:
        vt = fp8.v_transposed_on_gpu(lib, v8)
        assert torch.equal(vt.view(torch.uint8), fp8.v_transposed(v8).view(torch.uint8))
        print(f"(V transpose by the library: {bench_ms(lambda: fp8.v_transposed_on_gpu(lib, v8)):.4f} ms; "
              f"torch ops: {bench_ms(lambda: fp8.v_transposed(v8)):.4f} ms)")
    attn = attns[key]
    params = attn._param_fields()
    ref = attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    out = fp8.forward(lib, q8, k8, v8, (qd, kd, vd), params=params, vt=vt)
    diff = (out.float() - ref.float()).abs().max().item()
    assert diff < 5e-2, (key, text, diff)
    run8 = lambda: fp8.forward(lib, q8, k8, v8, (qd, kd, vd), params=params, vt=vt)  # noqa: E731
    run16 = lambda: attn(q, k, v)  # noqa: E731
    t8, t16 = [], []
    for _ in range(args.rounds):
        t8.append(bench_ms(run8))
        t16.append(bench_ms(run16))
    m8, m16 = sorted(t8)[len(t8) // 2], sorted(t16)[len(t16) // 2]
    density = 0.5 if key == "causal" else 1.0
    print(f"| {key} | {text} (BK {t.block_k}, threshold {t.rescale_threshold:g}, stages {t.stages}, overlap "
          f"{t.overlap}, pingpong {t.pingpong}, pin {t.pin_softmax}, persistent "
          f"{t.persistent}/{t.persistent_max_kv}) | {spill} | {m8:.4f} | {tflops(B, H, S, D, density, m8):.1f} | "
          f"{m16:.4f} | {m16 / m8:.3f}x | {diff:.2e} |", flush=True)
