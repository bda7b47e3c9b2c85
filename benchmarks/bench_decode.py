#!/usr/bin/env python
"""Decode benchmark (issue 12): attngen's KV-cache kernel (attn.with_kvcache) vs torch.compile(flex_attention) vs
SDPA, one process, bytes of K and V read per second.

One query row per sequence (q_len 1) at position L after a cache of L keys, 32 query heads over 8 kv heads, head
dim 128, bf16, at the shapes of the issue (B=8 L=32768, B=64 L=4096, B=1 L=131072). Variants: full, sliding
window 4096, softcap 30, ALiBi. Bytes count only the K/V rows the variant keeps (a window reads W rows, not L):
TB/s = B * Hkv * kept * D * 2 (K and V) * 2 bytes / time. Every implementation is one CUDA graph of one call,
replayed under triton's do_bench (median), so launch overheads are alike (a call capture refuses is timed eagerly,
marked so); SDPA runs only where it expresses the variant (full). Outputs are compared with flex's before timing.

    python benchmarks/bench_decode.py --out DIR [--variants full sliding_window ...] [--shapes 8x32768 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402  (timing helpers)

SHAPES = ["8x32768", "64x4096", "1x131072"]
VARIANTS = ["full", "sliding_window", "softcap", "alibi"]
HQ, HKV, D = 32, 8, 128


def mods(key: str):
    import attngen

    return {"full": (None, None), "sliding_window": (None, attngen.sliding_window(4096)),
            "softcap": (attngen.softcap(30.0), None), "alibi": (attngen.alibi(HQ), None)}[key]


def kept_keys(mask_mod, L: int) -> int:
    """Keys the query at position L keeps of the cache's L (the bytes a variant has to read)."""
    import torch

    if mask_mod is None:
        return L
    kv = torch.arange(L)
    return int(mask_mod(torch.tensor(0), torch.tensor(0), torch.tensor(L), kv).sum())


def graphed(fn):
    """fn() captured in a CUDA graph after two warm-up calls; returns (replay, output)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay, out


def run(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import attngen

    dev = torch.device("cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    bf.heat_gpu(dev)
    rows = []
    for shape in args.shapes:
        B, L = (int(x) for x in shape.split("x"))
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(B, HQ, 1, D, generator=gen).to(dev, torch.bfloat16)
        kc = torch.randn(B, HKV, L, D, generator=gen).to(dev, torch.bfloat16)
        vc = torch.randn(B, HKV, L, D, generator=gen).to(dev, torch.bfloat16)
        lens = torch.full((B,), L, dtype=torch.int32, device=dev)
        for key in args.variants:
            print(f"[{key} B={B} L={L}]", flush=True)
            score_mod, mask_mod = mods(key)
            kept = kept_keys(mask_mod, L)
            row = {"key": key, "B": B, "L": L, "Hq": HQ, "Hkv": HKV, "D": D, "kept": kept,
                   "bytes": B * HKV * kept * D * 2 * 2}
            fns = {}
            attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
            fns["attngen"] = lambda: attn.with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: B023
            sm = getattr(score_mod, "fn", score_mod)
            mm = getattr(mask_mod, "fn", mask_mod)
            # flex sees q_idx 0 for the one query: shift it to the position attngen's kernel gives it (L)
            fsm = (lambda s, b, h, qi, ki: sm(s, b, h, qi + L, ki)) if sm is not None else None  # noqa: B023
            bm = (create_block_mask(lambda b, h, qi, ki: mm(b, h, qi + L, ki), None, None, 1, L, device=dev)  # noqa: B023
                  if mm is not None else None)
            fns["flex"] = lambda: flex(q, kc, vc, score_mod=fsm, block_mask=bm, enable_gqa=True)  # noqa: B023
            if key == "full":
                fns["sdpa"] = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)  # noqa: B023
            replays, outs = {}, {}
            for n, fn in fns.items():
                try:
                    replays[n], outs[n] = graphed(fn)
                except Exception as e:  # noqa: BLE001
                    bf.err_line(f"{n} in a CUDA graph (timed eagerly instead)", e)
                    try:  # flex's decode path copies from the host at some shapes, which capture refuses
                        outs[n] = fn()
                        replays[n] = fn
                        row[f"{n}_eager"] = True
                    except Exception as e2:  # noqa: BLE001
                        row[f"{n}_error"] = bf.err_line(n, e2)
            if "flex" in outs and "attngen" in outs:
                row["max_abs_diff_vs_flex"] = (outs["attngen"].float() - outs["flex"].float()).abs().max().item()
                print(f"  attngen vs flex: {row['max_abs_diff_vs_flex']:.3e}", flush=True)
            bf.interleaved_ms(replays, row)
            for n in replays:
                if f"{n}_ms" in row:
                    row[f"{n}_us"] = row[f"{n}_ms"] * 1e3
                    row[f"{n}_tbps"] = row["bytes"] / (row[f"{n}_us"] * 1e-6) / 1e12
            bf.speed_ratios(row)
            print("  " + ", ".join(f"{n}={bf.fmt(row.get(n + '_tbps'), 2)} TB/s" for n in ("attngen", "flex", "sdpa")),
                  flush=True)
            rows.append(row)
            del replays, outs, fns
            bf._free()
        del q, kc, vc
        bf._free()
    return rows


def ratio(x) -> str:
    return "–" if x is None else f"{x:.2f}x"


def table(rows) -> str:
    head = ("| variant | B | L | keys read | attngen µs | attngen TB/s | flex TB/s | SDPA TB/s | ÷ flex | ÷ SDPA |"
            " max abs diff vs flex |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['key']} | {r['B']} | {r['L']} | {r['kept']} | {bf.fmt(r.get('attngen_us'), 1)} | "
             f"{bf.fmt(r.get('attngen_tbps'), 2)} | {bf.fmt(r.get('flex_tbps'), 2)}{' (eager)' * bool(r.get('flex_eager'))}"
             f" | {bf.fmt(r.get('sdpa_tbps'), 2)} | "
             f"{ratio(r.get('attngen_over_flex'))} | {ratio(r.get('attngen_over_sdpa'))} | "
             f"{bf.fmt(r.get('max_abs_diff_vs_flex'), 4)} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--shapes", nargs="+", default=SHAPES, metavar="BxL")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = p.parse_args(argv)
    rows = run(args)
    bf.write_results(args.out, "decode", args, rows, table(rows))


if __name__ == "__main__":
    main()
