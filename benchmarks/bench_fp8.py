#!/usr/bin/env python
"""FP8 forward benchmark (issue 12): attngen with e4m3 q, k, v against attngen bf16, flex (bf16) and SDPA (cuDNN,
bf16) in one process, at B2 H16 S8192 D128 by default, full and causal (--variants adds more anchors).

The FP8 inputs are the bf16 inputs quantised per (batch, kv head) with descale = amax / 448. The FP8 call is timed
as a user makes it: its V^T copy (attngen/fp8.py) included; that copy is also timed alone. Timing as
bench_forward.py (triton do_bench medians, ROUNDS interleaved rounds after a heat-up). "V^T ms": the library's V^T
kernel alone (part of the FP8 call); rounds F-H of session 15 timed the torch-ops version there (0.208 ms).

Errors (max abs, on the last --check-rows query rows of every batch and head, against float64 attention):
  bf16           attngen bf16 vs float64 on the bf16 inputs
  fp8 kernel     attngen FP8 vs float64 on the dequantised FP8 inputs (the kernel's own error: P rounded to e4m3,
                 bf16 output)
  fp8 end-to-end attngen FP8 vs float64 on the bf16 inputs (adds the inputs' quantisation)
Results (markdown + JSON) go to --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import bench_forward as bf  # noqa: E402


def quantise(x, Hkv: int):
    """(x in e4m3, descale (B, Hkv)): x / descale rounded to e4m3, descale = amax over each (batch, kv head's
    heads) / 448."""
    import torch

    B, H = x.shape[:2]
    amax = x.float().abs().reshape(B, Hkv, -1).amax(-1).clamp_min(1e-12)
    d = amax / 448.0
    q8 = (x.float() / d.repeat_interleave(H // Hkv, dim=1)[:, :, None, None]).to(torch.float8_e4m3fn)
    return q8, d


def run(args):
    import torch

    import attngen
    from attngen import fp8, reference
    from attngen.launch import load_library

    device = torch.device("cuda")
    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    q, k, v = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = quantise(q, H), quantise(k, H), quantise(v, H)
    bf.heat_gpu(device)
    flex = bf.Flex()
    rows = []
    for key in args.variants:
        print(f"[{key}]", flush=True)
        score_mod, mask_mod = bf.make_variant(key, S, H, device, seed=args.seed)
        row = {"key": key, "variant": bf.variant_name(score_mod, mask_mod), "B": B, "H": H, "S": S, "D": D,
               "density": bf.density_of(score_mod, mask_mod, B, H, S, device)}
        attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
        lib8 = attn._load(fp8.FP8, D, torch.cuda.current_device(), None, load_library)  # its V^T kernel, timed alone
        f = flex.make(score_mod, mask_mod, S, device)
        out16 = attn(q, k, v)
        out8 = attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
        f(q, k, v)
        torch.cuda.synchronize()
        # errors on the last check rows (q_offset = S - n keeps a causal row's keys)
        n = min(args.check_rows, S)
        lo = S - n
        exact16 = reference.attention(q[:, :, lo:].double(), k.double(), v.double(), attn.variant, q_offset=lo)
        # the dequantised inputs' float64 attention (fp8.reference_forward rounds its output to bf16: not here)
        deq = lambda t, d: t.double() * d.double()[:, :, None, None]  # noqa: E731  (H == Hkv here)
        exact8 = reference.attention(deq(q8[:, :, lo:], qd), deq(k8, kd), deq(v8, vd), attn.variant, q_offset=lo)
        row["err_bf16"] = (out16[:, :, lo:].double() - exact16).abs().max().item()
        row["err_fp8_kernel"] = (out8[:, :, lo:].double() - exact8).abs().max().item()
        row["err_fp8_end_to_end"] = (out8[:, :, lo:].double() - exact16).abs().max().item()
        del exact16, exact8, out16, out8
        torch.cuda.empty_cache()
        fns = {"attngen": lambda: attn(q, k, v), "fp8": lambda: attn(q8, k8, v8, q_descale=qd, k_descale=kd,
                                                                   v_descale=vd),
               "flex": lambda: f(q, k, v), "v_transpose": lambda: fp8.v_transposed_on_gpu(lib8, v8)}
        if score_mod is None and key in ("full", "causal"):
            sd, backend = bf.sdpa_for(q, k, v, key == "causal")
            if sd is not None:
                fns["sdpa"] = lambda sd=sd: sd(q, k, v)
                row["sdpa_backend"] = backend
        bf.heat_gpu(device, 1.0)
        bf.interleaved_ms(fns, row, order=tuple(fns))
        for name in ("attngen", "fp8", "flex", "sdpa"):
            if row.get(f"{name}_ms"):
                row[f"{name}_tflops"] = bf.tflops(B, H, S, D, row["density"], row[f"{name}_ms"])
        for other, key in (("attngen", "bf16"), ("flex", "flex"), ("sdpa", "sdpa")):
            if row.get("fp8_ms") and row.get(f"{other}_ms"):
                row[f"fp8_over_{key}"] = row[f"{other}_ms"] / row["fp8_ms"]
        print("  " + ", ".join(f"{n}={bf.fmt(row.get(n + '_tflops'))} TFLOP/s" for n in ("fp8", "attngen", "flex",
                                                                                        "sdpa"))
              + f", fp8/bf16 {bf.fmt(row.get('fp8_over_bf16'), 3)}x, errors bf16 {row['err_bf16']:.2e} fp8 kernel "
              f"{row['err_fp8_kernel']:.2e} end-to-end {row['err_fp8_end_to_end']:.2e}", flush=True)
        rows.append(row)
    return rows


def table(rows) -> str:
    lines = ["| variant | FP8 TFLOP/s (ms) | bf16 TFLOP/s (ms) | FP8 / bf16 | flex bf16 TFLOP/s | SDPA bf16 TFLOP/s "
             "| V^T copy ms | max abs err bf16 | FP8 kernel | FP8 end-to-end |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {bf.fmt(r.get('fp8_tflops'))} ({bf.fmt(r.get('fp8_ms'), 3)}) | "
            f"{bf.fmt(r.get('attngen_tflops'))} ({bf.fmt(r.get('attngen_ms'), 3)}) | "
            f"**{bf.fmt(r.get('fp8_over_bf16'), 3)}×** | {bf.fmt(r.get('flex_tflops'))} | "
            f"{bf.fmt(r.get('sdpa_tflops'))} | {bf.fmt(r.get('v_transpose_ms'), 3)} | {r['err_bf16']:.2e} | "
            f"{r['err_fp8_kernel']:.2e} | {r['err_fp8_end_to_end']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--variants", nargs="+", default=["full", "causal"])
    ap.add_argument("--check-rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = ap.parse_args(argv)
    rows = run(args)
    bf.write_results(args.out, "fp8", args, rows, table(rows))


if __name__ == "__main__":
    main()
