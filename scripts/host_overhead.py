"""The host's share of a training step (bench_training.py's step): how long the CPU takes to issue one step, against
how long the GPU takes to run it. A step whose issue time comes near its GPU time leaves the GPU idle between
kernels, which the benchmark counts and a kernel-by-kernel profile (step_kernel_times.py) does not.

For each variant: the GPU time of a step (CUDA events around 50 back-to-back steps, no L2 flush, the host far
ahead), the host time of a step (wall clock of 50 steps issued behind a long torch.cuda._sleep, so that no launch
waits for the GPU; a step that synchronises shows here as the sleep's length), the benchmark's figure (do_bench
with its L2 flush) and cProfile's top functions over 50 steps (--profile). attngen's step runs twice: through
autograd.py's eager twin of its custom ops (what a plain call takes) and through the custom ops themselves (what
torch.compile sees; "attngen-op"). Needs a GPU.

    python scripts/host_overhead.py [--variants sliding_window document causal] [--flex] [--profile]
    python scripts/host_overhead.py --cpu   # no GPU: the twin against the custom ops on a tiny CPU step
"""
import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402
from bench_training import step_fn  # noqa: E402

STEPS = 50


def gpu_us(fn) -> float:
    """Mean µs per step of `fn` issued back to back (the host far ahead after the first few)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)  # the host queues the steps while the GPU sleeps
    start.record()
    for _ in range(STEPS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / STEPS


def host_us(fn, profile: bool = False):
    """(mean µs of host time per step, cProfile text or None): the steps issued behind a GPU sleep long enough that
    the GPU is still asleep when the host finishes, unless a step waits for it."""
    import torch

    torch.cuda._sleep(2_000_000_000)  # about a second at 1.98 GHz
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(STEPS):
        fn()
    if prof:
        prof.disable()
    t = (time.perf_counter() - t0) * 1e6 / STEPS
    asleep = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    text = None
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        s.write("\n")
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
        text = s.getvalue()
    return t, asleep, text


@contextlib.contextmanager
def custom_ops():
    """Within the block, differentiable calls take attngen's custom ops (autograd._plain_eager answering False)
    rather than their eager twin."""
    from attngen import autograd

    plain, autograd._plain_eager = autograd._plain_eager, lambda *a: False
    try:
        yield
    finally:
        autograd._plain_eager = plain


def custom_op_step(attn, q, k, v, dout):
    """bench_training's step through the custom ops."""
    step = step_fn(attn, q, k, v, dout)

    def forced():
        with custom_ops():
            return step()

    return forced


def cpu_dispatch(rounds: int = 3, steps: int = 500) -> None:
    """Host µs per training step of causal attention on (1, 1, 16, 16) CPU tensors (the reference path: its
    arithmetic is a few µs), through the eager twin and through the custom ops, alternated ``rounds`` times."""
    import torch

    import attngen

    attn = attngen.compile(causal=True)
    q, k, v = (torch.randn(1, 1, 16, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 1, 16, 16)
    step = step_fn(attn, q, k, v, dout)
    for _ in range(rounds):
        for name, mode in (("eager twin", contextlib.nullcontext), ("custom ops", custom_ops)):
            with mode():
                for _ in range(50):
                    step()
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                print(f"{name}: {(time.perf_counter() - t0) * 1e6 / steps:.1f} µs / step", flush=True)


def main(argv=None):
    if argv is None and "--cpu" in sys.argv[1:]:
        return cpu_dispatch()
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["sliding_window", "document", "causal"], choices=bf.ANCHORS)
    p.add_argument("--flex", action="store_true", help="flex's step beside attngen's")
    p.add_argument("--profile", action="store_true", help="cProfile of attngen's host time")
    p.add_argument("--seq", type=int, default=8192)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    B, H, S, D = 2, 16, args.seq, 128
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    flex = bf.Flex() if args.flex else None
    print("| variant | impl | GPU µs / step | host µs / step | GPU still asleep after issue | do_bench µs (L2 flush) |")
    print("|---|---|---|---|---|---|")
    profiles = []
    for key in args.variants:
        score_mod, mask_mod = bf.make_variant(key, S, H, device)
        attn = bf.make_attngen(score_mod, mask_mod)
        fns = {"attngen": step_fn(attn, q, k, v, dout), "attngen-op": custom_op_step(attn, q, k, v, dout)}
        if flex is not None:
            fns["flex"] = step_fn(flex.make(score_mod, mask_mod, S, device, None), q, k, v, dout)
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            g = gpu_us(fn)
            h, asleep, _ = host_us(fn)
            d = bf.bench_ms(fn) * 1e3
            print(f"| {key} | {name} | {g:.1f} | {h:.1f} | {asleep} | {d:.1f} |", flush=True)
            if args.profile and name == "attngen":  # a pass of its own: the profiler's cost stays out of the table
                profiles.append(f"### {key}\n\n```\n{host_us(fn, profile=True)[2]}```\n")
        bf._free()
    for text in profiles:
        print(text)


if __name__ == "__main__":
    main()
