"""Where the sm90 forward's staged relative terms (Sm90Tiles.rel_stage) and each thread's own walk give different
outputs, for a mod with factor and bias read from a table at q - kv and kv - q (tests/gpu/test_relative_gpu.py's
"both"): each setting's max error against float64, the rows that differ (by q position, its row in a 16-row warp
slice, its q tile) and the error of each setting there. Needs an H100 / H200.

    python scripts/rel_stage_diff.py [--head-dim 64] [--window 700]
"""
import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=700)
    p.add_argument("--probs", action="store_true",
                   help="also read each setting's attention weights (v one-hot over 64 keys at a time) and say on which "
                        "(q, kv) and diagonals they differ")
    args = p.parse_args(argv)
    import torch

    import attngen
    import attngen.jit.spec as spec
    from attngen import reference
    from attngen.jit.tiles import sm90_ladder

    L, hd, dev = 2600, args.head_dim, "cuda"
    table = (torch.randn(4, 2 * L, generator=torch.Generator().manual_seed(7)) * 0.5).to(dev)

    def both(s, b, h, q, kv):
        return s * (1 + 0.5 * table[h, q - kv + L - 1]) + table[h, kv - q + L - 1]

    B, Hq, Hkv, Lq, Lk, off = 2, 4, 2, 1100, 2450, 130
    gen = torch.Generator(device="cpu").manual_seed(hd)
    q = torch.randn(B, Hq, Lq, hd, generator=gen).to(dev, torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Lk, hd, generator=gen).to(dev, torch.bfloat16) for _ in range(2))
    outs, attns = {}, {}
    for staged in (True, False):
        spec.sm90_ladder = lambda *a, s=staged, **kw: tuple(replace(t, rel_stage=s) for t in sm90_ladder(*a, **kw))
        attn = attns[staged] = attngen.compile(score_mod=attngen.ScoreMod(both, "rel_both"), window=args.window)
        outs[staged] = [attn(q, k, v, return_lse=True, q_offset=off) for _ in range(2)]
    torch.cuda.synchronize()
    if args.probs and hd >= 64:
        probs = {}
        for staged, a in attns.items():
            cols = []
            for c in range(0, Lk, 64):
                w = min(64, Lk - c)
                one = torch.zeros(B, Hkv, Lk, hd, device=dev, dtype=torch.bfloat16)
                one[:, :, c:c + w, :w] = torch.eye(w, device=dev, dtype=torch.bfloat16)
                cols.append(a(q, k, one, q_offset=off)[..., :w].float())
            probs[staged] = torch.cat(cols, -1)  # (B, Hq, Lq, Lk): the weights, each rounded to bf16
        d = (probs[True] - probs[False]).abs()
        nz = d.nonzero()
        print(f"weights: {len(nz)} of {d.numel()} differ, max {d.max().item():.3e} "
              f"(largest weight {probs[False].max().item():.3e})")
        if len(nz):
            qi, kv = nz[:, 2] + off, nz[:, 3]
            print("by diagonal d = q - kv (most common):", Counter((qi - kv).tolist()).most_common(12))
            print("by kv % 128:", sorted(Counter((kv % 128).tolist()).items())[:20], "...")
            print("by q % 16:", sorted(Counter((nz[:, 2] % 16).tolist()).items()))
            for b, h, i, j in nz[:8].tolist():
                print(f"  b{b} h{h} q {i + off} kv {j}: {probs[True][b, h, i, j].item():.6e} staged, "
                      f"{probs[False][b, h, i, j].item():.6e} walk")
    for staged, runs in outs.items():
        print(f"staged {staged}: two runs equal {torch.equal(runs[0][0], runs[1][0])}")
    ref = reference.attention(q.double(), k.double(), v.double(), attn.variant, q_offset=off)
    (o1, l1), (o0, l0) = outs[True][0], outs[False][0]
    e1, e0 = (o1.double() - ref).abs(), (o0.double() - ref).abs()
    print(f"max err vs float64: staged {e1.max().item():.3e}, walk {e0.max().item():.3e}")
    rows = ((o1 != o0).any(-1) | (l1 != l0)).nonzero().tolist()
    print(f"{len(rows)} of {B * Hq * Lq} rows differ")
    print("by q % 16:", sorted(Counter(r[2] % 16 for r in rows).items()))
    print("by q tile (128 rows):", sorted(Counter(r[2] // 128 for r in rows).items()))
    print("by head:", sorted(Counter(r[1] for r in rows).items()))
    for b, h, i in rows[:12]:
        print(f"  b{b} h{h} q {i} (q_idx {i + off}): row err staged {e1[b, h, i].max().item():.3e} "
              f"walk {e0[b, h, i].max().item():.3e}; lse {l1[b, h, i].item():.6f} / {l0[b, h, i].item():.6f}")


if __name__ == "__main__":
    main()
