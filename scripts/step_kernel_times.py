"""Where a forward + backward step's time goes, kernel by kernel: attngen's and flex's steps
(bench_training.py's) under torch.profiler, each kernel's mean time per step, beside the 64 x 128 tiles that hold a
kept element (blockmap.block_map on the CPU: what an exact backward walk visits), per kv head, the partial ones
among them, and each backward kernel's time over that count. Sliding windows of several widths (--windows) give the same kernels
over walks of several lengths, which separates a CTA's fixed cost from a tile's. Needs a GPU, except --fit,
which reads a table this script printed and fits the backward's time to a tile cost and a CTA cost (least
squares over the rows of --fit-rows).

    python scripts/step_kernel_times.py [--variants causal full document document_aligned] [--windows 256 1024 4096]
    python scripts/step_kernel_times.py --fit TABLE.md [--fit-rows full "sliding_window(4096)" ...]
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402
from bench_training import step_fn  # noqa: E402


def kernel_means(fn, steps: int) -> dict:
    """{kernel name: mean µs per step} over `steps` profiled steps (after a warm-up one)."""
    return profile_steps(fn, steps)[0]


def profile_steps(fn, steps: int) -> tuple:
    """(kernel_means' dict, the GPU's span per step): the span runs from the first kernel's start to the last one's
    end over the steps issued back to back, so that span - the kernels' sum is the time the GPU waited between them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    total = defaultdict(float)
    first, last = float("inf"), float("-inf")
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.time_range.elapsed_us()
            first, last = min(first, e.time_range.start), max(last, e.time_range.end)
    return {name: us / steps for name, us in total.items()}, ((last - first) / steps if total else 0.0)


def short(name: str) -> str:
    for key in ("attngen_bwd_kernel", "bwd_pre", "bwd_post", "attngen_fwd", "flex_attention_backward",
                "flex_attention", "triton_"):
        if key in name:
            return key if key != "triton_" else name[:40]
    return name[:40]


def tiles(variant_mask, S):
    """(kept, partial) 64 x 128 tiles of one kv head (an exact walk's visits), or (all, 0) without a mask."""
    from attngen import blockmap

    nq, nk = S // 64, S // 128
    if variant_mask is None:
        return nq * nk, 0
    bm = blockmap.block_map(variant_mask, S, S, block=(64, 128))
    return int((bm > 0).sum()), int((bm == 1).sum())


B, H, S, D = 2, 16, 8192, 128
CTAS = S // 128 * B * H  # the sm90 backward's grid: one CTA per kv block of 128 rows, kv head and batch
SMS = 132  # the H200's


def fit(table: str, names) -> str:
    """time = a * tiles + b * CTAs over attngen's backward rows of ``names`` in a table main() printed."""
    import torch

    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[1] == "attngen" and cells[2] == "attngen_bwd_kernel" and cells[0] in names:
            rows[cells[0]] = (float(cells[4]) * B * H, float(cells[3]) * 1e3)  # tiles, ns
    if len(rows) < 2:
        raise SystemExit(f"--fit needs two or more backward rows of {list(names)}, found {sorted(rows)}")
    x = torch.tensor([[t, CTAS] for t, _ in rows.values()], dtype=torch.float64)
    y = torch.tensor([ns for _, ns in rows.values()], dtype=torch.float64)[:, None]
    a, b = torch.linalg.lstsq(x, y).solution.flatten().tolist()
    return (f"rows {sorted(rows)}: {a:.2f} ns per tile, {b:.1f} ns per CTA of the whole GPU "
            f"({b * SMS / 1e3:.2f} µs of one SM, {b / a:.2f} tiles' worth)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["causal", "full", "document", "document_aligned", "prefix_lm"])
    p.add_argument("--windows", nargs="*", type=int, default=[256, 1024, 4096])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--fit", metavar="TABLE.md", help="fit a printed table's backward times instead of running")
    p.add_argument("--fit-rows", nargs="+", default=["full", "sliding_window(4096)", "sliding_window(1024)"])
    args = p.parse_args(argv)
    if args.fit:
        print(fit(Path(args.fit).read_text(), args.fit_rows))
        return
    import torch

    from attngen import variants as V

    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    cases = [(key, *bf.make_variant(key, S, H, device)) for key in args.variants]
    cases += [(f"sliding_window({w})", None, V.sliding_window(w)) for w in args.windows]
    flex = None if args.no_flex else bf.Flex()
    bf.heat_gpu(device)
    print("| variant | impl | kernel | µs / step | kept tiles / head | partial | ns / kept tile |")
    print("|---|---|---|---|---|---|---|")
    for name, score_mod, mask_mod in cases:
        cpu_mask = mask_mod
        if mask_mod is not None and name.startswith("document"):  # the block map reads the ids on the CPU
            cpu_mask = bf.make_variant(name, S, H, "cpu")[1]
        kept, partial = tiles(cpu_mask, S)
        impls = {"attngen": bf.make_attngen(score_mod, mask_mod)}
        if flex is not None:
            impls["flex"] = flex.make(score_mod, mask_mod, S, device)
        for impl, f in impls.items():
            try:
                means, span = profile_steps(step_fn(f, q, k, v, dout), args.steps)
            except Exception as e:  # noqa: BLE001  (one implementation failing leaves the others' rows)
                print(f"| {name} | {impl} | {bf.err_line('error', e)} | | | | |", flush=True)
                continue
            by_kernel = defaultdict(float)
            for kname, us in means.items():
                by_kernel[short(kname)] += us
            for kname, us in sorted(by_kernel.items(), key=lambda kv: -kv[1]):
                per_tile = ""
                if kname in ("attngen_bwd_kernel", "flex_attention_backward"):
                    per_tile = f"{1e3 * us / (kept * B * H):.1f}"
                print(f"| {name} | {impl} | {kname} | {us:.1f} | {kept} | {partial} | {per_tile} |", flush=True)
            print(f"| {name} | {impl} | (step total) | {sum(means.values()):.1f} | | | |", flush=True)
            print(f"| {name} | {impl} | (GPU span) | {span:.1f} | | | |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
