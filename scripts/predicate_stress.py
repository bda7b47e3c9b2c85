"""The block-skip predicates against brute force on many more shapes than the test suite draws (lengths up to 2000),
for a time budget: tests/test_predicates.py's library variants and combinations (its EXACT list checked for
exactness, its SOUND_ONLY list for soundness), with --random-masks random formulas of up to 8 atoms
(benchmarks/bench_analysis.py's random_mask, checked for soundness), with --zoo benchmarks/mask_zoo.py's masks at
test scale (its exact families checked for exactness, built for 2048 positions). Every check is
test_predicates._check: the block map (EMPTY only where no element is kept, FULL only where every one is) and the
backward's q ranges. Prints each failure and a count; exit status 1 when any failed. CPU only.

    python scripts/predicate_stress.py [--seconds 600] [--seed 1] [--random-masks | --zoo]
"""
import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


POSITIONS = 3000  # test_predicates' captured tensors (document ids, key padding) cover this many positions
ZOO_POSITIONS = 2048  # the zoo's masks at test scale (tests/test_mask_zoo.py's L)


def random_shape(rng, positions=POSITIONS):
    """(q_len, kv_len, BQ, BK, q_offset) with the kernels' tile sizes among others, lengths up to 2000 and every
    position inside ``positions`` (the captured tensors' length)."""
    BQ = rng.choice([16, 32, 64, 80, 128])
    BK = rng.choice([16, 32, 64, 128, 176])
    q_len = min(2000, rng.choice([1, rng.randint(1, 2000), BQ * rng.randint(1, 12)]))
    kv_len = min(2000, rng.choice([1, rng.randint(1, 2000), BK * rng.randint(1, 12), q_len]))
    q_offset = max(0, min(positions - q_len, rng.choice([0, rng.randint(0, 1000), max(0, kv_len - q_len)])))
    return q_len, kv_len, BQ, BK, q_offset


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=1)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--random-masks", action="store_true")
    which.add_argument("--zoo", action="store_true")
    args = p.parse_args(argv)
    import bench_analysis
    import mask_zoo
    import test_predicates as tp
    from attngen.mods import MaskMod

    rng = random.Random(args.seed)
    t0, checks, failures = time.time(), 0, 0
    library = [(n, v, True) for n, v in tp.EXACT] + [(n, v, False) for n, v in tp.SOUND_ONLY]
    positions = POSITIONS
    if args.zoo:
        library = [(n, MaskMod(mask_zoo.make(n, ZOO_POSITIONS, small=True), n), exact)
                   for n, (_, exact) in mask_zoo.ZOO.items()]
        positions = ZOO_POSITIONS
    while time.time() - t0 < args.seconds:
        if args.random_masks:
            text, fn = bench_analysis.random_mask(rng, rng.randint(1, 8))
            name, variant, exact = text, MaskMod(lambda b, h, q, kv, fn=fn: fn(q, kv), "random"), False
        else:
            name, variant, exact = rng.choice(library)
        for _ in range(4):
            shape = random_shape(rng, positions)
            try:
                tp._check(variant, *shape, exact=exact)
            except AssertionError as e:
                failures += 1
                print(f"FAIL {name} (q_len, kv_len, BQ, BK, q_offset) = {shape}: {str(e)[:300]}", flush=True)
            checks += 1
    kind = "random masks" if args.random_masks else "the mask zoo" if args.zoo else "library variants"
    print(f"seed {args.seed}, {kind}: {checks} checks, {failures} failed, {time.time() - t0:.0f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
