"""Where a decode call's time goes (issue 12's bandwidth bar), attngen's with_kvcache beside SDPA at one of
bench_decode.py's shapes: each kernel's mean µs per call under torch.profiler, their sum and the CUDA-graph replay
time (do_bench) as TB/s of K/V, so a gap between kernels and between a kernel and the copy ceiling show apart.
`--ncu` instead makes one warm call of each inside an NVTX range "profiled", for
`ncu --nvtx --nvtx-include "profiled/"` (scripts/device_step.sh, ncu_nvtx).

    python scripts/profile_decode.py [--B 8 --L 32768] [--variant full] [--splits 0] [--ncu]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attngen  # noqa: E402
import bench_decode as bd  # noqa: E402
import bench_forward as bf  # noqa: E402
from step_kernel_times import kernel_means  # noqa: E402  (scripts/: mean µs per call of each kernel)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--L", type=int, default=32768)
    p.add_argument("--variant", default="full", choices=bd.VARIANTS)
    p.add_argument("--splits", type=int, default=0)
    p.add_argument("--ncu", action="store_true")
    args = p.parse_args()
    dev = torch.device("cuda")
    B, L = args.B, args.L
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, bd.HQ, 1, bd.D, generator=g).to(dev, torch.bfloat16)
    kc = torch.randn(B, bd.HKV, L, bd.D, generator=g).to(dev, torch.bfloat16)
    vc = torch.randn(B, bd.HKV, L, bd.D, generator=g).to(dev, torch.bfloat16)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    score_mod, mask_mod = bd.mods(args.variant)
    attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
    fns = {"attngen": lambda: attn.with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=args.splits)}
    if args.variant == "full":
        fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    nbytes = B * bd.HKV * bd.kept_keys(mask_mod, L) * bd.D * 4
    if args.ncu:
        for name, fn in fns.items():
            fn()
            torch.cuda.synchronize()
            with torch.cuda.nvtx.range("profiled"):
                fn()
            torch.cuda.synchronize()
        print("profiled", ", ".join(fns))
        return
    bf.heat_gpu(dev)
    print(f"B={B} L={L} {args.variant}: {nbytes / 1e6:.1f} MB of K/V")
    for name, fn in fns.items():
        replay, _ = bd.graphed(fn)
        us = bf.bench_ms(replay) * 1e3
        kernels = kernel_means(fn, 20)
        print(f"  {name}: graph replay {us:.1f} us = {nbytes / (us * 1e-6) / 1e12:.2f} TB/s; kernels "
              f"{sum(kernels.values()):.1f} us")
        for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"    {v:8.1f} us  {nbytes / (v * 1e-6) / 1e12:5.2f} TB/s  {k[:70]}")


if __name__ == "__main__":
    main()
