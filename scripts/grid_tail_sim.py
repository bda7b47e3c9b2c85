"""How far past its ideal end a persistent grid runs under a given work-tile order: a model of the dynamic deal (each
CTA that frees up takes the next tile in order, as the tile counters do), with a tile's cost its block count plus a
fixed overhead. The backward's tiles at B2 H16 S8192 (kv blocks of 128 rows walking q blocks of 64) under causal, the
sliding window of 1024 and 8 documents of 1024, in three orders: kv block fastest, one head after another (the
backward's order before session 27); sections of 2 heads with the kv block slowest (Sm90BwdTiles.sections); and each
section sorted by walk length (Sm90BwdTiles.order). Prints the makespan over the ideal (total work / SMs). No GPU.

    python scripts/grid_tail_sim.py [--sms 132] [--overhead 2]
"""
import argparse
import heapq

HEADS, KV_BLOCKS = 32, 64  # (batch, head) pairs and kv blocks of 128 rows at S = 8192


def walks(mask):
    """Steps (q blocks of 64 rows) of kv block j's walk."""
    if mask == "causal":
        return lambda j: 128 - 2 * j
    if mask == "window":  # q - kv in [0, 1024]: q blocks 2j .. 2j + 17
        return lambda j: min(127, 2 * j + 17) - 2 * j + 1
    if mask == "document":  # 8 documents of 1024 rows: q blocks from 2j to the document's end
        return lambda j: (j * 128 // 1024 + 1) * 1024 // 64 - 2 * j
    raise ValueError(mask)


def order(walk, kind, section=2):
    """Tile costs in the order the grid takes them."""
    if kind == "kv_fastest":
        return [walk(j) for _ in range(HEADS) for j in range(KV_BLOCKS)]
    tiles = []
    for _ in range(0, HEADS, section):
        run = [walk(j) for j in range(KV_BLOCKS) for _ in range(section)]  # kv block slowest
        tiles += sorted(run, reverse=True) if kind == "sorted" else run
    return tiles


def makespan(costs, sms):
    free = [(0.0, s) for s in range(sms)]
    for c in costs:
        t, s = heapq.heappop(free)
        heapq.heappush(free, (t + c, s))
    return max(t for t, _ in free)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--overhead", type=float, default=2.0, help="a tile's fixed cost, in walk steps")
    args = p.parse_args()
    print("| mask | kv block fastest | sections | sections, sorted |")
    print("|---|---|---|---|")
    for mask in ("causal", "window", "document"):
        cells = []
        for kind in ("kv_fastest", "sections", "sorted"):
            costs = [w + args.overhead for w in order(walks(mask), kind)]
            ideal = sum(costs) / args.sms
            cells.append(f"+{(makespan(costs, args.sms) / ideal - 1) * 100:.2f}%")
        print(f"| {mask} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
