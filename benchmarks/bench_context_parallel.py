#!/usr/bin/env python
"""Context-parallel benchmark (issue 13): attngen.distributed over the GPUs of one host, beside the single-GPU
kernel and torch's ``context_parallel`` on SDPA, one torchrun job.

Every rank times, for each variant: attngen's context-parallel forward + backward of a sequence of S positions
sharded over the R ranks (zigzag), and rank 0 also the single-GPU attngen kernel on the whole sequence. Per-GPU
throughput = 4 B H S^2 D density 3.5 / time / R (forward + backward work, as bench_training.py), against the single
GPU's. torch's ``context_parallel`` (SDPA, causal and full only) runs beside it where this torch has it. Before
timing, the context-parallel output is compared with the single-GPU one (max abs difference printed).

    torchrun --nproc_per_node 2 benchmarks/bench_context_parallel.py --seq 131072 --out DIR
    torchrun --nproc_per_node 2 benchmarks/bench_context_parallel.py --cpu --seq 256 --heads 2 --head-dim 16  # plumbing

Results (rank 0): a markdown table and JSON in --out, with attngen.distributed.last_stats() per variant.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402  (the anchors' variants, the result files)

VARIANTS = ["causal", "sliding_window", "document"]


def make(key: str, S: int, H: int, device):
    """attngen's attention for a variant key: bench_forward.py's anchors, but a sliding window of 4096 (a quarter of
    the sequence when that is shorter), the width long-context runs use."""
    import attngen

    if key == "sliding_window":
        return attngen.compile(window=min(4096, S // 4))
    return bf.make_attngen(*bf.make_variant(key, S, H, device))


def join_group(cpu: bool):
    """This process in the torchrun job's group: gloo on CPU float32 tensors (the reference path, plumbing only),
    or NCCL on the GPU LOCAL_RANK names with bfloat16. Returns (device, dtype, world, rank)."""
    import torch
    import torch.distributed as dist

    if cpu:
        dist.init_process_group("gloo")
        device, dtype = torch.device("cpu"), torch.float32
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
        device, dtype = torch.device("cuda"), torch.bfloat16
    return device, dtype, dist.get_world_size(), dist.get_rank()


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps, every rank in step (a barrier before each)."""
    import torch
    import torch.distributed as dist

    times = []
    for _ in range(reps):
        dist.barrier()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--seq", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="gloo on CPU tensors (the reference path): plumbing only")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    from attngen.distributed import context_parallel_attention, last_stats, shard_sequence, unshard_sequence

    device, dtype, world, rank = join_group(args.cpu)
    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    gen = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device, dtype) for _ in range(4))
    rows = []
    for key in args.variants:
        attn = make(key, S, H, device)
        row = {"variant": key, "B": B, "H": H, "S": S, "D": D, "world": world}
        local = [shard_sequence(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        dlocal = shard_sequence(dout, layout="zigzag")

        def cp_step():
            out = context_parallel_attention(attn, *local, layout="zigzag")
            torch.autograd.grad(out, local, dlocal)

        with torch.no_grad():
            got = unshard_sequence(context_parallel_attention(attn, *[t.detach() for t in local]), layout="zigzag")
        if rank == 0:
            want = attn(q, k, v)
            row["max_abs_diff_vs_one_gpu"] = (got.float() - want.float()).abs().max().item()
            full = [t.clone().requires_grad_() for t in (q, k, v)]

            def one_step():
                torch.autograd.grad(attn(*full), full, dout)

            row["one_gpu_s"] = timed_local(one_step, args.reps, device)
        cp_step()  # builds, plans, warms the communicators
        row["cp_s"] = timed(cp_step, args.reps)
        stats = last_stats()
        row["stats"] = vars(stats)
        if key == "causal" and not args.cpu:
            row.update(torch_cp(q, k, v, dout, world, args.reps))
        if rank == 0:
            rows.append(row)
            print(json.dumps(row), flush=True)
    if rank == 0:
        bf.write_results(args.out, "context_parallel", args, rows, table(rows))
    dist.destroy_process_group()


def timed_local(fn, reps: int, device) -> float:
    """Median seconds of fn() on this rank alone (the single-GPU figure)."""
    import torch

    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def torch_cp(q, k, v, dout, world: int, reps: int) -> dict:
    """torch's context_parallel on SDPA (causal), timed alike; its error line where this torch lacks it."""
    import torch
    import torch.nn.functional as F

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cuda", (world,))
        qq, kk, vv, dd = (t.clone() for t in (q, k, v, dout))
        with context_parallel(mesh, buffers=[qq, kk, vv, dd], buffer_seq_dims=[2, 2, 2, 2]):
            ins = [t.requires_grad_() for t in (qq, kk, vv)]

            def step():
                out = F.scaled_dot_product_attention(*ins, is_causal=True)
                torch.autograd.grad(out, ins, dd)

            step()
            return {"torch_cp_s": timed(step, reps)}
    except Exception as e:  # noqa: BLE001
        return {"torch_cp_error": f"{type(e).__name__}: {e}"[:300]}


def table(rows) -> str:
    lines = ["| variant | ranks | S | one GPU s | context parallel s | per-GPU ÷ one GPU | torch CP s | max abs diff | "
             "pairs computed / skipped (rank 0) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eff = r["one_gpu_s"] / (r["cp_s"] * r["world"]) if r.get("one_gpu_s") else None
        lines.append(f"| {r['variant']} | {r['world']} | {r['S']} | {r.get('one_gpu_s', float('nan')):.4f} | "
                     f"{r['cp_s']:.4f} | {'' if eff is None else f'{eff:.2f}'} | "
                     f"{r.get('torch_cp_s', r.get('torch_cp_error', '–'))} | {r.get('max_abs_diff_vs_one_gpu', 0):.2e} | "
                     f"{r['stats']['pairs_computed']} / {r['stats']['pairs_skipped']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
