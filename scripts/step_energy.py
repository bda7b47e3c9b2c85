"""Energy per training step (forward + torch.autograd.grad of q, k, v, bench_training.py's step) of attngen, cuDNN SDPA
and flex side by side in one process: each implementation runs back to back for about --seconds per round, in
interleaved rounds, while the card's energy counter (NVML's total energy consumption, mJ) is read before and after
and nvidia-smi samples the SM clock and power every 100 ms. Per implementation, the median round: ms per step (CUDA
events), joules per step, mean watts, median SM clock, and TFLOP/s and TFLOP per joule (4 B H S^2 D density 3.5 FLOP
per step). Tells whether a step runs at the card's power limit and how much work each joule buys. Needs a GPU and
nvidia-smi (NVML for the counter; without it, joules from the power samples).

    python scripts/step_energy.py [--variants full causal] [--set SETTING ...] [--seconds 2] [--rounds 3] [--no-flex]

--set: attngen at other sm90 backward settings too (bwd_tiles_ab.py's syntax, one rung each), beside the shipped ladder.
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402
from bench_training import FLOP_FACTOR, step_fn  # noqa: E402
from tile_settings import bwd_rung_ladder  # noqa: E402


class EnergyCounter:
    """The card's energy counter since the driver loaded, in millijoules, read through NVML
    (nvmlDeviceGetTotalEnergyConsumption, ctypes on libnvidia-ml); `read` is None where NVML cannot give it, and the
    joules then come from the power samples (mean watts over the window times its length)."""

    def __init__(self, index: int = 0):
        import ctypes

        self.read = None
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            handle = ctypes.c_void_p()
            if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return
            value = ctypes.c_ulonglong()

            def read():
                rc = nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(value))
                return float(value.value) if rc == 0 else None

            if read() is not None:
                self.read = read
        except OSError:
            pass


def measure(fn, seconds: float, counter: EnergyCounter):
    """(ms per step, joules per step or None, steps, wall window (t0, t1)) over about `seconds` of back-to-back
    steps."""
    import torch

    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(5, int(seconds / max(time.perf_counter() - t, 1e-4)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0, w0 = counter.read() if counter.read else None, time.time()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    w1, e1 = time.time(), counter.read() if counter.read else None
    joules = (e1 - e0) / 1000.0 / n if e0 is not None and e1 is not None else None
    return start.elapsed_time(end) / n, joules, n, (w0, w1)


def samples_in(rows, window):
    """(median SM clock MHz, median power W) of the nvidia-smi rows inside the window."""
    inside = [(mhz, w) for t, mhz, w in rows if window[0] <= t <= window[1]]
    if not inside:
        return None, None
    return sorted(m for m, _ in inside)[len(inside) // 2], sorted(w for _, w in inside)[len(inside) // 2]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["full", "causal"])
    p.add_argument("--set", nargs="*", default=[], dest="settings", metavar="FIELD=VALUE")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-flex", action="store_true")
    args = p.parse_args(argv)
    import tempfile

    import torch

    import attngen.jit.spec as spec

    B, H, S, D = 2, 16, 8192, 128
    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    shipped = spec.sm90_bwd_ladder
    ladders = {"attngen": shipped}
    ladders.update({f"attngen {s}": bwd_rung_ladder(s) for s in args.settings})

    def under(name, fn):
        def step():
            spec.sm90_bwd_ladder = ladders[name]
            return fn()
        return step

    counter = EnergyCounter(torch.cuda.current_device())
    log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=log, stderr=subprocess.DEVNULL)
    try:
        bf.heat_gpu(device)
        results = []
        for key in args.variants:
            score_mod, mask_mod = bf.make_variant(key, S, H, device)
            density = bf.density_of(score_mod, mask_mod, B, H, S, device)
            fns = {name: under(name, step_fn(bf.make_attngen(score_mod, mask_mod), q, k, v, dout)) for name in ladders}
            if key in ("full", "causal"):
                sd, backend = bf.sdpa_for(q, k, v, key == "causal")
                if sd is not None:
                    fns[f"sdpa ({backend})"] = step_fn(sd, q, k, v, dout)
            if not args.no_flex:
                fns["flex"] = step_fn(bf.Flex().make(score_mod, mask_mod, S, device, None), q, k, v, dout)
            runs = {name: [] for name in fns}
            for r in range(args.rounds):
                for name in bf.rotated(fns, r):  # each implementation in turn first
                    runs[name].append(measure(fns[name], args.seconds, counter))
            flop = 4 * B * H * S * S * D * density * FLOP_FACTOR
            for name, rs in runs.items():
                results.append((key, name, flop) + sorted(rs, key=lambda r: r[0])[len(rs) // 2])
    finally:
        smi.terminate()
        smi.wait()
    rows = []
    log.close()
    samples = Path(log.name)
    lines = samples.read_text().splitlines()
    samples.unlink()
    for line in lines:
        parts = [x.strip() for x in line.split(",")]
        try:
            stamp, _, frac = parts[0].partition(".")
            t = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
            rows.append((t, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    source = "NVML's energy counter" if counter.read else "the power samples (mean W x window)"
    print(f"joules from {source}; SM clock and power: nvidia-smi every 100 ms, medians over each window\n")
    print("| variant | implementation | ms / step | J / step | W | SM MHz | W (samples) | TFLOP/s | TFLOP / J |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, name, flop, ms, joules, n, window in results:
        mhz, watts = samples_in(rows, window)
        if joules is None and watts is not None:
            joules = watts * (window[1] - window[0]) / n
        j = f"{joules:.3f} | {joules / ms * 1000:.0f}" if joules else "- | -"
        eff = f"{flop / joules / 1e12:.3f}" if joules else "-"
        print(f"| {key} | {name} | {ms:.3f} | {j} | {mhz if mhz else '-'} | {watts if watts else '-'} | "
              f"{flop / ms / 1e9:.1f} | {eff} |", flush=True)


if __name__ == "__main__":
    main()
