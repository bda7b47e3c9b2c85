"""Decode kernel tiles and split counts at head dim 128 (full attention, 32 query / 8 kv heads, bf16), TB/s of K/V
per configuration at the shapes of benchmarks/bench_decode.py: what jit/tiles.DECODE_TILES and
decode.num_splits_heuristic are chosen from. One process; each configuration is its own library (the tiles are
part of the cache key); every call is one CUDA graph replayed under triton's do_bench.

    python scripts/decode_tile_sweep.py [--out DIR] [--configs 0 2 ...]
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import attngen  # noqa: E402
import bench_decode as bd  # noqa: E402
import bench_forward as bf  # noqa: E402
from attngen.jit import tiles  # noqa: E402

C = tiles.DecodeTileConfig
CONFIGS = [C(block_k=64, stages=3), C(block_k=128, stages=2, num_warps=8), C(block_k=64, stages=4),
           C(block_k=64, stages=3, pdl=False)]
SPLITS = {8: (0,), 64: (0,), 1: (0, 32)}  # 0: the heuristic


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--configs", nargs="+", type=int, default=None, help="indices into CONFIGS (default: all)")
    args = p.parse_args()
    dev = torch.device("cuda")
    bf.heat_gpu(dev)
    rows = []
    for B, L in ((8, 32768), (64, 4096), (1, 131072)):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, bd.HQ, 1, bd.D, generator=g).to(dev, torch.bfloat16)
        kc = torch.randn(B, bd.HKV, L, bd.D, generator=g).to(dev, torch.bfloat16)
        vc = torch.randn(B, bd.HKV, L, bd.D, generator=g).to(dev, torch.bfloat16)
        lens = torch.full((B,), L, dtype=torch.int32, device=dev)
        nbytes = B * bd.HKV * L * bd.D * 4
        for cfg in [CONFIGS[k] for k in args.configs] if args.configs is not None else CONFIGS:
            tiles.DECODE_TILES[bd.D] = (cfg,)
            attn = attngen.compile()
            for splits in SPLITS[B]:
                try:
                    replay, _ = bd.graphed(lambda: attn.with_kvcache(q, kc, vc, cache_seqlens=lens,  # noqa: B023
                                                                     num_splits=splits))  # noqa: B023
                    us = bf.bench_ms(replay) * 1e3
                    tbps = nbytes / (us * 1e-6) / 1e12
                except Exception as e:  # noqa: BLE001
                    us = tbps = None
                    bf.err_line(f"{cfg} splits {splits}", e)
                row = {"B": B, "L": L, "tiles": repr(cfg), "smem": cfg.smem_bytes(bd.D), "splits": splits, "us": us,
                       "tbps": tbps}
                print(f"B={B} L={L} {cfg} splits={splits or 'auto'}: {bf.fmt(tbps, 2)} TB/s ({bf.fmt(us, 1)} us)",
                      flush=True)
                rows.append(row)
        del q, kc, vc
        bf._free()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "decode_tile_sweep.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
