"""How many of the sm90 backward's dQ reductions kv-block pairs would merge (wip/dq-pair.patch): per anchor, the
(q block, kv block) steps the backward walks (tiles of its block map not EMPTY, at its BQ x BK), and how many q blocks
both kv blocks 2p and 2p + 1 of a head visit (one reduction for the two instead of two). Read from attngen.block_map
on the CPU, the anchors as bench_forward.py builds them; no GPU needed.

    python scripts/dq_pair_share.py [--variants causal full ...] [--seq 8192] [--block-q 64] [--block-k 128]
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["full", "causal", "sliding_window", "document", "prefix_lm"])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--block-q", type=int, default=64)
    p.add_argument("--block-k", type=int, default=128)
    args = p.parse_args(argv)

    import attngen
    from attngen.blockmap import EMPTY

    print("| variant | steps | reductions with pairs | share |")
    print("|---|---|---|---|")
    for key in args.variants:
        score_mod, mask_mod = bf.make_variant(key, args.seq, 16, "cpu")
        walked = attngen.block_map(attngen.compile(score_mod=score_mod, mask_mod=mask_mod), args.seq, args.seq,
                                   block=(args.block_q, args.block_k)) != EMPTY  # (q blocks, kv blocks)
        first, second = walked[:, 0::2], walked[:, 1::2]
        both = int((first[:, :second.shape[1]] & second).sum())
        steps = int(walked.sum())
        print(f"| {key} | {steps} | {steps - both} | {(steps - both) / steps:.3f} |")


if __name__ == "__main__":
    main()
