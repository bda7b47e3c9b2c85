#!/usr/bin/env python
"""Context-parallel accuracy (issue 13's first acceptance point), one torchrun job: forward and backward of a
sequence sharded over the ranks (zigzag) against the single-GPU kernel on the whole sequence, both judged against
a float64 reference (attngen.reference, chunked): the context-parallel error of out, dq, dk, dv (and of a learnable
table's gradient) must stay within twice the single-GPU kernel's own error, plus a small absolute slack. Variants:
causal, sliding window, softcap + causal, document ids and a learnable relative-position bias.

    torchrun --nproc_per_node 2 benchmarks/cp_acceptance.py --seq-per-rank 32768 --out DIR
    torchrun --nproc_per_node 2 benchmarks/cp_acceptance.py --cpu --seq-per-rank 64 --heads 2 --head-dim 16

Results (rank 0): a markdown table and JSON in --out; the exit status is 1 when a variant fails.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402  (the result files)
from bench_context_parallel import join_group, make  # noqa: E402

VARIANTS = ["causal", "sliding_window", "softcap_causal", "document", "relpos_learnable"]
ATOL = 1e-3  # slack where both errors are tiny (rows whose gradient is near zero)


def make_judged(key: str, S: int, H: int, device):
    """(compiled attention, the same variant for the float64 reference, the learnable leaves and their float64
    twins): bench_context_parallel.make's variants, and a learnable relative-position table, which the reference
    reads as a float64 copy so that its gradient is the golden one."""
    import torch

    import attngen

    if key != "relpos_learnable":
        a = make(key, S, H, device)
        return a, a, [], []
    init = torch.randn(H, 2 * S - 1, generator=torch.Generator().manual_seed(1)) * 0.5
    table = init.to(device).requires_grad_()
    table64 = init.to(device, torch.float64).requires_grad_()

    def relpos(t):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + t[h, q_idx - kv_idx + S - 1]
        return score_mod

    return attngen.compile(score_mod=relpos(table)), attngen.compile(score_mod=relpos(table64)), [table], [table64]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--seq-per-rank", type=int, default=32768)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--cpu", action="store_true", help="gloo on CPU tensors (the reference path): plumbing only")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import attngen
    from attngen.distributed import context_parallel_attention, last_stats, shard_sequence, unshard_sequence

    device, dtype, world, rank = join_group(args.cpu)
    B, H, D = 1, args.heads, args.head_dim
    S = args.seq_per_rank * world
    gen = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device, dtype) for _ in range(4))
    rows, failed = [], 0
    for key in args.variants:
        attn, attn64, leaves, leaves64 = make_judged(key, S, H, device)
        row = {"variant": key, "S": S, "world": world, "H": H, "D": D}
        local = [shard_sequence(t, layout="zigzag").requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(attn, *local, layout="zigzag")
        grads = torch.autograd.grad(out, local + leaves, shard_sequence(dout, layout="zigzag"))
        row["stats"] = vars(last_stats())
        cp = [unshard_sequence(t.detach(), layout="zigzag") for t in (out, *grads[:3])]
        for g in grads[3:]:  # each rank's share of a captured tensor's gradient
            g = g.clone()
            dist.all_reduce(g)
            cp.append(g)
        del out, grads, local
        if rank == 0:
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            one_out = attn(*full)
            one = [one_out.detach(), *torch.autograd.grad(one_out, full + leaves, dout)]
            del one_out, full
            full64 = [t.double().requires_grad_() for t in (q, k, v)]
            ref_out = attngen.reference.attention(*full64, attn64)
            ref = [ref_out.detach(), *torch.autograd.grad(ref_out, full64 + leaves64, dout.double())]
            del ref_out, full64
            names = ["out", "dq", "dk", "dv"] + [f"d{n}" for n in ("table",)[:len(leaves)]]
            row["errors"] = {}
            ok = True
            for n, c, o, r in zip(names, cp, one, ref):
                e_cp = (c.double() - r).abs().max().item()
                e_one = (o.double() - r).abs().max().item()
                row["errors"][n] = {"cp": e_cp, "one_gpu": e_one, "ref_max": r.abs().max().item()}
                ok = ok and e_cp <= 2.0 * e_one + ATOL * max(1.0, r.abs().max().item())
            row["ok"] = ok
            failed += not ok
            print(json.dumps(row), flush=True)
            rows.append(row)
        dist.barrier()
    if rank == 0:
        bf.write_results(args.out, "cp_acceptance", args, rows, table(rows))
    dist.destroy_process_group()
    return 1 if failed else 0


def table(rows) -> str:
    lines = ["| variant | ranks | S | tensor | context-parallel err | one-GPU err | max abs ref | variant passes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for n, e in r["errors"].items():
            lines.append(f"| {r['variant']} | {r['world']} | {r['S']} | {n} | {e['cp']:.3e} | {e['one_gpu']:.3e} | "
                         f"{e['ref_max']:.3e} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
