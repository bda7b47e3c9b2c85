#!/usr/bin/env python
"""Forward-pass benchmark: attngen vs torch.compile(flex_attention) vs SDPA (cuDNN), on one CUDA GPU.

Everything runs in ONE process (plus two short subprocesses for the warm/cold build figures):

  anchors   (--set anchors, the default) B=2, H=16, S=8192, D=128, bf16: full, causal, sliding_window(1024), softcap(30),
            softcap(30)+causal, alibi(16)+causal, document (8 sorted random ids per position, as the anchor
            probe), document_cuts (8 documents at random cut points), prefix_lm(2048).
            attngen's output is checked against flex's (max abs error printed) before timing.
  --sweep   S in 1k..32k x D in 64/128/256, full and causal, attngen vs SDPA. FlashAttention's
            convention keeps the work per point comparable: B = tokens // S, H = hidden // D
            (--sweep-tokens 16384, --sweep-hidden 2048).
  compile   cold build (fresh ATTNGEN_CACHE_DIR, fresh process), warm load from the disk cache
            (another fresh process), in-process call overhead of a tiny problem (host time per call,
            and wall time per call minus kernel time).

Timing: triton.testing.do_bench median, warmup 50 ms, rep 200 ms. Anchors: every implementation of a
variant is compiled first, then timed in 3 interleaved rounds (attngen, flex, SDPA) after 1 s of heat-up;
the figure is the median of the rounds.
TFLOP/s = 4 * B * H * S^2 * D * density / time, density = fraction of unmasked (q, kv) pairs counted
with the brute-force mask (attngen.reference.mask_density, chunked on the GPU): masked-out pairs are
not counted as work, for every implementation alike.

Results (markdown table + JSON with date, device, torch version) go to --out (default benchmarks/results/latest/;
scripts/gpu_round.sh names a run's folder <date>-<device>-<commit>).
A failure in one variant or implementation is printed and the run goes on.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

ANCHORS = ["full", "causal", "sliding_window", "softcap", "softcap_causal", "alibi_causal", "document", "document_cuts",
           "prefix_lm"]
# issue 15 point 4: variants whose cost is in the partial tiles (mask / score evaluated per element); --set issue15
ISSUE15 = ["dilated_window", "div_score", "head_scale", "document_unsorted", "local_global"]
# the document anchor with its ids as the anchor probe makes them (torch.randint: int64); the "document" row converts
# them to int32, which costs the kernels fewer registers
EXTRA = ["document_i64"]
SETS = {"anchors": ANCHORS, "issue15": ISSUE15}
# table labels where the variant's own name does not tell two anchors apart
LABELS = {"document": "document(8 docs of ~S/8, anchor probe)", "document_cuts": "document(8 docs, random cuts)",
          "document_i64": "document(8 docs of ~S/8, anchor probe, int64 ids)"}
WARMUP_MS, REP_MS = 50, 200
ROUNDS = 3  # interleaved timing rounds per anchor variant (attngen, flex, SDPA)
CHECK_TOL = {"bfloat16": 2e-2, "float16": 5e-3}


# ---------------------------------------------------------------- variants

def make_variant(key: str, S: int, H: int, device, seed: int = 0, specialize: bool = False):
    """(score_mod, mask_mod) for an anchor key; each is an attngen mod (a plain-callable wrapper) or None.
    ``specialize``: library numbers baked into the kernel instead of runtime parameters (the cost of not
    specialising is the difference of two runs, with and without --specialize)."""
    import functools
    import types

    import torch

    from attngen import variants as V

    if specialize:  # the same library calls with their numbers baked in
        V = types.SimpleNamespace(causal=V.causal, document=V.document,
                                  **{n: functools.partial(getattr(V, n), specialize=True)
                                     for n in ("sliding_window", "softcap", "alibi", "prefix_lm")})

    if key == "full":
        return None, None
    if key == "causal":
        return None, V.causal()
    if key == "sliding_window":
        return None, V.sliding_window(1024)
    if key == "softcap":
        return V.softcap(30.0), None
    if key == "softcap_causal":
        return V.softcap(30.0), V.causal()
    if key == "alibi_causal":
        return V.alibi(H), V.causal()
    if key in ("document", "document_i64"):
        # the anchor probe's definition (../shared/anchors/flex_cudnn_probe.py): an id in [0, 8) drawn per
        # position, sorted: 8 documents of about S / 8 tokens each (density ~ 1/8); int32 but for document_i64
        gen = torch.Generator().manual_seed(seed)
        doc_ids = torch.randint(0, 8, (S,), generator=gen).sort().values
        return None, V.document((doc_ids if key == "document_i64" else doc_ids.to(torch.int32)).to(device))
    if key == "document_cuts":
        gen = torch.Generator().manual_seed(seed)
        # 8 documents of uneven lengths: 7 distinct random cut points, ids sorted by construction (this
        # benchmark's "document" row until 2026-11-29; density 0.219 at S = 8192, seed 0)
        cuts = torch.randperm(S - 1, generator=gen)[:7].add(1).sort().values
        doc_ids = torch.searchsorted(cuts, torch.arange(S), right=True).to(torch.int32)
        return None, V.document(doc_ids.to(device))
    if key == "document_aligned":
        # not an anchor: 8 documents of exactly S / 8 tokens (multiples of the 128-row tiles), so every visited
        # tile is FULL; against "document" it separates the cost of partial tiles from the rest
        doc_ids = (torch.arange(S) // max(1, S // 8)).clamp(max=7).to(torch.int32)
        return None, V.document(doc_ids.to(device))
    if key == "prefix_lm":
        return None, V.prefix_lm(2048)
    if key in ISSUE15:
        return _issue15_variant(key, S, H, device, seed)
    raise KeyError(f"unknown variant {key!r}; choose from {', '.join(ANCHORS + ISSUE15)}")


def _issue15_variant(key: str, S: int, H: int, device, seed: int):
    """Issue 15 point 4's partial-tile variants, written as a user writes them for flex (plain functions)."""
    import torch

    from attngen.mods import MaskMod, ScoreMod

    if key == "dilated_window":
        def dilated_window(b, h, q_idx, kv_idx):
            return (torch.abs(q_idx - kv_idx) <= 1024) & ((q_idx - kv_idx) % 2 == 0)

        return None, MaskMod(dilated_window, "dilated_window(1024, 2)")
    if key == "div_score":
        def div_score(score, b, h, q_idx, kv_idx):
            return score / (1 + 1e-4 * (q_idx - kv_idx) ** 2)

        return ScoreMod(div_score, "div_score"), None
    if key == "head_scale":
        scale = (0.5 + torch.rand(H, generator=torch.Generator().manual_seed(seed))).to(device)

        def head_scale(score, b, h, q_idx, kv_idx):
            return score * scale[h]

        return ScoreMod(head_scale, "head_scale"), None
    if key == "document_unsorted":
        # 5 ids drawn at random per position, not sorted: every tile is partial, none can be skipped
        doc = torch.randint(0, 5, (S,), generator=torch.Generator().manual_seed(seed)).to(torch.int32).to(device)

        def document_unsorted(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]

        return None, MaskMod(document_unsorted, "document_unsorted(5 ids)")
    if key == "local_global":
        def local_global(b, h, q_idx, kv_idx):
            return (torch.abs(q_idx - kv_idx) <= 512) | (kv_idx < 64) | (q_idx < 64)

        return None, MaskMod(local_global, "local_global(512, 64)")
    raise KeyError(key)


def variant_name(score_mod, mask_mod) -> str:
    from attngen.mods import Variant

    return Variant(score_mod=score_mod, mask_mod=mask_mod).name


# ---------------------------------------------------------------- timing helpers

def bench_ms(fn) -> float:
    """Median milliseconds per call (triton.testing.do_bench, warmup 50 ms, rep 200 ms)."""
    from triton.testing import do_bench

    try:
        r = do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
    except TypeError:  # older triton: no return_mode
        r = do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, quantiles=[0.5])
    if isinstance(r, (list, tuple)):
        r = r[0]
    return float(r)


def rotated(order, r: int) -> list:
    """``order`` started at its (r mod len)-th entry: round r's order, so that over len(order) rounds each
    implementation is timed once in each place of a round (on the power-capped H200 one place of a round read 3-5%
    slower than the others for the same kernel: docs/performance.md)."""
    order = list(order)
    k = r % len(order) if order else 0
    return order[k:] + order[:k]


def interleaved_ms(fns: dict, row: dict, order=("attngen", "flex", "sdpa")) -> None:
    """fns (by name: attngen, flex, sdpa, or those of ``order``) timed in ROUNDS interleaved rounds (bench_ms each,
    round r in ``order`` rotated by r, ``rotated``): row[name + '_ms'] the median, row[name + '_ms_rounds'] the rounds;
    an implementation that fails is dropped, its error in row[name + '_error']."""
    times = {n: [] for n in fns}
    live = dict(fns)
    present = [n for n in order if n in fns]
    for r in range(ROUNDS):
        for n in rotated(present, r):
            if n in live:
                try:
                    times[n].append(bench_ms(live[n]))
                except Exception as e:  # noqa: BLE001
                    row[f"{n}_error"] = err_line(n, e)
                    del live[n]
    for n, ts in times.items():
        if ts and n in live:
            row[f"{n}_ms"] = sorted(ts)[len(ts) // 2]
            row[f"{n}_ms_rounds"] = ts


def speed_ratios(row: dict, skip=()) -> None:
    """row['attngen_over_' + other] = other's time / attngen's (> 1: attngen is faster), for flex and sdpa."""
    for other in ("flex", "sdpa"):
        if other not in skip and row.get("attngen_ms") and row.get(f"{other}_ms"):
            row[f"attngen_over_{other}"] = row[f"{other}_ms"] / row["attngen_ms"]


def tflops(B, H, S, D, density, ms) -> float:
    if ms is None or not ms or ms <= 0:
        return float("nan")
    return 4.0 * B * H * S * S * D * density / (ms * 1e-3) / 1e12


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{nd}f}"


def fmt_ratio(x):
    """A ratio of two implementations' figures, "1.41x", or "n/a" where one of them did not run."""
    text = fmt(x, 2)
    return text if text == "n/a" else text + "x"


def err_line(what: str, e: BaseException) -> str:
    tb = traceback.format_exception_only(type(e), e)[-1].strip()
    print(f"  !! {what} failed: {tb}", flush=True)
    if os.environ.get("BENCH_TRACEBACK"):
        traceback.print_exc()
    return tb


def density_of(score_mod, mask_mod, B, H, S, device) -> float:
    from attngen.reference import mask_density

    if mask_mod is None:
        return 1.0
    rows = max(1, (1 << 27) // max(1, B * H * S))  # ~128M bools per step
    return mask_density(mask_mod, B, H, S, S, device=device, chunk=rows)


def _free():
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def write_results(out_dir, prefix: str, args, rows, md: str, extra: Optional[dict] = None) -> None:
    """<prefix>-<stamp>.md (the run's meta line, then the table) and .json (meta, rows and ``extra``'s entries) in
    out_dir, and the table on stdout: the result files of every benchmark script."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    meta = {"date": stamp, "device": device, "torch": torch.__version__, "args": vars(args)}
    (out / f"{prefix}-{stamp}.md").write_text(f"{meta}\n\n{md}")
    (out / f"{prefix}-{stamp}.json").write_text(json.dumps({"meta": meta, "rows": rows, **(extra or {})}, indent=1,
                                                           default=str))
    print(md)


# ---------------------------------------------------------------- implementations

class Flex:
    """torch.compile(flex_attention) with a create_block_mask block mask (same mods as attngen)."""

    def __init__(self):
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        # one compiled graph per (score_mod, block mask structure): raise dynamo's recompile limits
        for name, val in (("cache_size_limit", 256), ("accumulated_cache_size_limit", 4096)):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), val))
        self.fn = torch.compile(flex_attention, dynamic=False)

    @staticmethod
    def block_mask(mask_mod, S, device):
        from torch.nn.attention.flex_attention import create_block_mask

        if mask_mod is None:
            return None
        fn = getattr(mask_mod, "fn", mask_mod)
        # B=None, H=None: the anchor masks do not depend on b or h, so one mask is broadcast
        try:
            return create_block_mask(fn, None, None, S, S, device=device, _compile=True)
        except TypeError:
            return create_block_mask(fn, None, None, S, S, device=device)

    def make(self, score_mod, mask_mod, S, device, kernel_options=None):
        bm = self.block_mask(mask_mod, S, device)
        sm = getattr(score_mod, "fn", score_mod)
        if kernel_options:
            return lambda q, k, v: self.fn(q, k, v, score_mod=sm, block_mask=bm, kernel_options=kernel_options)
        return lambda q, k, v: self.fn(q, k, v, score_mod=sm, block_mask=bm)


BACKEND = "auto"  # --backend


def make_attngen(score_mod, mask_mod):
    import attngen

    return attngen.compile(score_mod=score_mod, mask_mod=mask_mod, backend=BACKEND)


def make_sdpa(causal: bool, backend: str):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run(q, k, v):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def sdpa_for(q, k, v, causal: bool):
    """(fn, label) of an SDPA call that runs on these inputs: cuDNN first; if cuDNN refuses the problem,
    flash, labelled so in the table. (None, None) if neither runs."""
    for backend in ("cudnn", "flash"):
        try:
            fn = make_sdpa(causal, backend)
            fn(q, k, v)
            return fn, backend
        except Exception as e:  # noqa: BLE001
            err_line(f"SDPA[{backend}]", e)
    return None, None


def sdpa_time(q, k, v, causal: bool):
    """(ms, label) of sdpa_for's call."""
    fn, backend = sdpa_for(q, k, v, causal)
    return (bench_ms(lambda: fn(q, k, v)), backend) if fn is not None else (None, None)


def _out(x):
    return x[0] if isinstance(x, (tuple, list)) else x


# ---------------------------------------------------------------- anchors

def heat_gpu(device, seconds: float = 3.0):
    """Run bf16 matmuls for a few seconds so that the first timed kernel does not get the boost clock
    of an idle (cool, unthrottled) GPU that later ones do not."""
    import torch

    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def run_anchors(args, dtype, device):
    import torch

    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    q, k, v = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
    heat_gpu(device)
    flex = None
    try:
        flex = Flex()
    except Exception as e:  # noqa: BLE001
        err_line("torch.compile(flex_attention) setup", e)

    rows = []
    for key in args.variants:
        print(f"[{key}]", flush=True)
        row = {"key": key, "B": B, "H": H, "S": S, "D": D, "dtype": str(dtype).replace("torch.", "")}
        try:
            score_mod, mask_mod = make_variant(key, S, H, device, seed=args.seed, specialize=args.specialize)
            row["variant"] = LABELS.get(key) or variant_name(score_mod, mask_mod)
            row["density"] = density_of(score_mod, mask_mod, B, H, S, device)
        except Exception as e:  # noqa: BLE001
            row["error"] = err_line("variant setup", e)
            rows.append(row)
            continue

        # Make every callable first (flex and attngen compile here, leaving the GPU idle for seconds),
        # then time them interleaved: ROUNDS rounds of attngen, flex, SDPA (each round starting one further
        # on) after a short heat-up, each figure the median of its rounds. Timing each right after its own
        # compile let a kernel run on a GPU that had cooled while the compiler worked, and the next one on a
        # hot GPU.
        fns = {}
        ref_out = None
        if flex is not None:
            try:
                f = flex.make(score_mod, mask_mod, S, device)
                ref_out = _out(f(q, k, v)).float()
                fns["flex"] = lambda f=f: f(q, k, v)
            except Exception as e:  # noqa: BLE001
                row["flex_error"] = err_line("flex", e)
        try:
            t0 = time.perf_counter()
            attn = make_attngen(score_mod, mask_mod)
            out = _out(attn(q, k, v))
            torch.cuda.synchronize()
            row["attngen_first_call_s"] = time.perf_counter() - t0
            if ref_out is not None:
                row["max_abs_err_vs_flex"] = (out.float() - ref_out).abs().max().item()
                tol = CHECK_TOL.get(row["dtype"], 1e-3)
                flag = "ok" if row["max_abs_err_vs_flex"] <= tol else f"MISMATCH (> {tol})"
                print(f"  attngen vs flex: max abs err {row['max_abs_err_vs_flex']:.3e} {flag}", flush=True)
            del out
            fns["attngen"] = lambda: attn(q, k, v)
        except Exception as e:  # noqa: BLE001
            row["attngen_error"] = err_line("attngen", e)
        if (score_mod is None and key in ("full", "causal")) or key in ISSUE15:
            # issue 15's variants: SDPA without the mod, as the dense reference (its TFLOP/s count every pair)
            sd, backend = sdpa_for(q, k, v, key == "causal")
            if sd is not None:
                fns["sdpa"] = lambda sd=sd: sd(q, k, v)
                row["sdpa_backend"] = backend + (" dense" if key in ISSUE15 else "")
        heat_gpu(device, 1.0)
        interleaved_ms(fns, row)
        _fill_rates(row)
        print("  " + ", ".join(f"{n}={fmt(row.get(n + '_tflops'))} TFLOP/s" for n in ("attngen", "flex", "sdpa")),
              flush=True)
        rows.append(row)
        ref_out = None
        _free()
    return rows


def _fill_rates(row):
    d = row.get("density", float("nan"))
    dense_sdpa = "dense" in (row.get("sdpa_backend") or "")  # SDPA without the variant's mask: all pairs
    for impl in ("attngen", "flex", "sdpa"):
        ms = row.get(f"{impl}_ms")
        if ms is not None:
            row[f"{impl}_tflops"] = tflops(row["B"], row["H"], row["S"], row["D"],
                                           1.0 if impl == "sdpa" and dense_sdpa else d, ms)
    # a time ratio against SDPA's dense work would mislead
    speed_ratios(row, skip=("sdpa",) if dense_sdpa and d != 1.0 else ())


def anchors_table(rows) -> str:
    head = ("| variant | attngen ms | attngen TFLOP/s | flex TFLOP/s | SDPA TFLOP/s | attngen/flex | attngen/SDPA "
            "| density | max abs err vs flex |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        sdpa = fmt(r.get("sdpa_tflops"))
        if r.get("sdpa_backend") and r["sdpa_backend"] != "cudnn":
            sdpa += f" ({r['sdpa_backend']})"
        err = r.get("max_abs_err_vs_flex")
        lines.append(
            f"| {r.get('variant', r['key'])} | {fmt(r.get('attngen_ms'), 3)} | {fmt(r.get('attngen_tflops'))} "
            f"| {fmt(r.get('flex_tflops'))} | {sdpa} | {fmt_ratio(r.get('attngen_over_flex'))} "
            f"| {fmt_ratio(r.get('attngen_over_sdpa'))} "
            f"| {fmt(r.get('density'), 3)} | {'n/a' if err is None else f'{err:.2e}'} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- sweep

SWEEP_S = [1024, 2048, 4096, 8192, 16384, 32768]
SWEEP_D = [64, 128, 256]


def run_sweep(args, dtype, device):
    import torch

    from attngen import variants as V

    heat_gpu(device)
    rows = []
    compiled = {}
    for D in SWEEP_D:
        for S in SWEEP_S:
            B = max(1, args.sweep_tokens // S)
            H = max(1, args.sweep_hidden // D)
            gen = torch.Generator().manual_seed(args.seed)
            try:
                q, k, v = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=dtype) for _ in range(3))
            except Exception as e:  # noqa: BLE001
                err_line(f"sweep inputs S={S} D={D}", e)
                continue
            for causal in (False, True):
                name = "causal" if causal else "full"
                row = {"variant": name, "B": B, "H": H, "S": S, "D": D,
                       "density": (S + 1) / (2 * S) if causal else 1.0}
                print(f"[sweep {name} S={S} D={D} B={B} H={H}]", flush=True)
                try:
                    if name not in compiled:
                        compiled[name] = make_attngen(None, V.causal() if causal else None)
                    attn = compiled[name]
                    out = _out(attn(q, k, v))
                    try:  # correctness spot check against SDPA (any backend)
                        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        row["max_abs_err_vs_sdpa"] = (out.float() - ref.float()).abs().max().item()
                        del ref
                    except Exception as e:  # noqa: BLE001
                        err_line("SDPA reference output", e)
                    del out
                    row["attngen_ms"] = bench_ms(lambda: attn(q, k, v))
                except Exception as e:  # noqa: BLE001
                    row["attngen_error"] = err_line("attngen", e)
                row["sdpa_ms"], row["sdpa_backend"] = sdpa_time(q, k, v, causal)
                _fill_rates(row)
                rows.append(row)
            del q, k, v
            _free()
    return rows


def sweep_table(rows) -> str:
    lines = ["| mask | S | D | B | H | attngen ms | attngen TFLOP/s | SDPA TFLOP/s | attngen/SDPA | max abs err vs SDPA |",
             "|" + "---|" * 10]
    for r in rows:
        sdpa = fmt(r.get("sdpa_tflops"))
        if r.get("sdpa_backend") and r["sdpa_backend"] != "cudnn":
            sdpa += f" ({r['sdpa_backend']})"
        err = f"{r['max_abs_err_vs_sdpa']:.2e}" if r.get("max_abs_err_vs_sdpa") is not None else "n/a"
        lines.append(f"| {r['variant']} | {r['S']} | {r['D']} | {r['B']} | {r['H']} | {fmt(r.get('attngen_ms'), 3)} "
                     f"| {fmt(r.get('attngen_tflops'))} | {sdpa} | {fmt_ratio(r.get('attngen_over_sdpa'))} | {err} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- compile figures

_PROBE = r"""
import json, sys, time
import torch
spec = json.loads(sys.argv[1])
dev = torch.device("cuda")
dtype = getattr(torch, spec["dtype"])
q, k, v = (torch.randn(spec["B"], spec["H"], spec["S"], spec["D"], device=dev, dtype=dtype) for _ in range(3))
torch.cuda.synchronize()  # CUDA context and allocator are not attngen's cost
dev_index = torch.cuda.current_device()
t0 = time.perf_counter()
import attngen
from attngen import frontend  # noqa: F401  (the JIT and launch layers: an import cost, not a load cost)
from attngen import variants as V
t1 = time.perf_counter()
attn = attngen.compile(mask_mod=V.causal())
ta = time.perf_counter()  # trace + derive
attn.library(dtype, spec["D"], dev_index)  # disk cache lookup (or build) + dlopen
tb = time.perf_counter()
out = attn(q, k, v)
out = out[0] if isinstance(out, (tuple, list)) else out
torch.cuda.synchronize()
t2 = time.perf_counter()
print("PROBE " + json.dumps({"import_s": t1 - t0, "compile_and_first_call_s": t2 - t1, "trace_derive_s": ta - t1,
                             "library_s": tb - ta, "first_call_s": t2 - tb}))
"""


def _probe(cache_dir: str, spec: dict) -> dict:
    env = dict(os.environ, ATTNGEN_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(spec)], env=env, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("PROBE "):
            r = json.loads(line[6:])
            r["process_wall_s"] = wall
            return r
    raise RuntimeError(f"probe exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}")


def _kernel_us_per_call(fn, n: int) -> float:
    """Device time per call summed over every GPU activity the profiler sees (CUPTI catches ctypes launches)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            total += e.time_range.elapsed_us()
    return total / n


def _overhead(fn, n: int) -> dict:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t_host = time.perf_counter() - t0
    torch.cuda.synchronize()
    t_wall = time.perf_counter() - t0
    r = {"host_us_per_call": t_host / n * 1e6, "wall_us_per_call": t_wall / n * 1e6}
    try:
        r["kernel_us_per_call"] = _kernel_us_per_call(fn, min(n, 200))
        r["overhead_us_per_call"] = r["wall_us_per_call"] - r["kernel_us_per_call"]
    except Exception as e:  # noqa: BLE001
        r["kernel_error"] = err_line("profiler", e)
    return r


def run_compile_figures(args, dtype, device):
    import torch

    res = {}
    spec = {"B": args.batch, "H": args.heads, "S": 1024, "D": args.head_dim, "dtype": str(dtype).replace("torch.", "")}
    res["probe_problem"] = spec
    with tempfile.TemporaryDirectory(prefix="attngen-bench-cache-") as cache_dir:
        for phase in ("cold", "warm"):  # same fresh cache dir: the first process builds, the second loads
            print(f"[compile: {phase} (fresh process, ATTNGEN_CACHE_DIR={cache_dir})]", flush=True)
            try:
                res[phase] = _probe(cache_dir, spec)
                print(f"  {phase}: compile + first call {res[phase]['compile_and_first_call_s']:.3f} s "
                      f"(import {res[phase]['import_s']:.3f} s)", flush=True)
            except Exception as e:  # noqa: BLE001
                res[phase] = {"error": err_line(f"{phase} build probe", e)}

    print("[compile: in-process call overhead, B=1 H=1 S=128]", flush=True)
    n = args.overhead_calls
    q, k, v = (torch.randn(1, 1, 128, args.head_dim, device=device, dtype=dtype) for _ in range(3))
    try:
        import attngen
        from attngen import variants as V

        attn = make_attngen(None, V.causal())
        attn(q, k, v)
        t0 = time.perf_counter()
        for _ in range(100):
            attngen.compile(mask_mod=V.causal())
        res["attngen_compile_object_us"] = (time.perf_counter() - t0) / 100 * 1e6  # re-compile of a known variant
        res["attngen_overhead"] = _overhead(lambda: attn(q, k, v), n)
    except Exception as e:  # noqa: BLE001
        res["attngen_overhead"] = {"error": err_line("attngen overhead", e)}
    try:
        from attngen import variants as V

        f = Flex().make(None, V.causal(), 128, device)
        res["flex_overhead"] = _overhead(lambda: f(q, k, v), n)
    except Exception as e:  # noqa: BLE001
        res["flex_overhead"] = {"error": err_line("flex overhead", e)}
    try:
        sd = make_sdpa(True, "cudnn")
        res["sdpa_overhead"] = _overhead(lambda: sd(q, k, v), n)
    except Exception as e:  # noqa: BLE001
        res["sdpa_overhead"] = {"error": err_line("SDPA overhead", e)}
    for name in ("attngen", "flex", "sdpa"):
        o = res.get(f"{name}_overhead", {})
        if "host_us_per_call" in o:
            print(f"  {name}: host {o['host_us_per_call']:.1f} us/call, wall {o['wall_us_per_call']:.1f} us/call, "
                  f"kernel {fmt(o.get('kernel_us_per_call'))} us, overhead {fmt(o.get('overhead_us_per_call'))} us",
                  flush=True)
    return res


def compile_table(res) -> str:
    lines = ["| figure | value |", "|---|---|"]
    for phase in ("cold", "warm"):
        r = res.get(phase, {})
        if "compile_and_first_call_s" in r:
            what = "cold build (empty cache)" if phase == "cold" else "warm load from disk cache"
            lines.append(f"| {what}, fresh process: compile + first call | {r['compile_and_first_call_s']:.3f} s |")
            lines.append(f"| {phase}: import attngen | {r['import_s']:.3f} s |")
            if "library_s" in r:
                what = "build into the cache + dlopen" if phase == "cold" else "load from disk cache (lookup + dlopen)"
                lines.append(f"| {phase}: trace + derive predicates | {r['trace_derive_s'] * 1e3:.1f} ms |")
                lines.append(f"| {phase}: {what} | {r['library_s'] * 1e3:.1f} ms |")
                lines.append(f"| {phase}: first launch (incl. module load on the GPU) | {r['first_call_s'] * 1e3:.1f} ms |")
        else:
            lines.append(f"| {phase} probe | failed: {r.get('error', 'n/a')} |")
    if "attngen_compile_object_us" in res:
        lines.append(f"| attngen.compile() of an already built variant | {res['attngen_compile_object_us']:.1f} us |")
    for name in ("attngen", "flex", "sdpa"):
        o = res.get(f"{name}_overhead", {})
        if "host_us_per_call" in o:
            lines.append(f"| {name}: host time per call (tiny problem) | {o['host_us_per_call']:.1f} us |")
            lines.append(f"| {name}: wall - kernel time per call | {fmt(o.get('overhead_us_per_call'))} us "
                         f"(kernel {fmt(o.get('kernel_us_per_call'))} us) |")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=None, choices=ANCHORS + ISSUE15 + EXTRA, metavar="NAME",
                   help=f"variants to time (default: the --set): {' '.join(ANCHORS + ISSUE15 + EXTRA)}")
    p.add_argument("--set", default="anchors", choices=sorted(SETS),
                   help="named set of variants when --variants is not given: anchors (default) or issue15")
    p.add_argument("--seq", type=int, default=8192, help="sequence length S (q and kv), default 8192")
    p.add_argument("--batch", type=int, default=2, help="batch B, default 2")
    p.add_argument("--heads", type=int, default=16, help="heads H, default 16")
    p.add_argument("--head-dim", type=int, default=128, help="head dim D, default 128")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also run S 1k..32k x D 64/128/256, full/causal, vs SDPA")
    p.add_argument("--sweep-tokens", type=int, default=16384, help="sweep batch = tokens // S (default 16384)")
    p.add_argument("--sweep-hidden", type=int, default=2048, help="sweep heads = hidden // D (default 2048)")
    p.add_argument("--no-anchors", action="store_true", help="skip the anchor table")
    p.add_argument("--specialize", action="store_true",
                   help="bake library numbers (window, cap, ...) into the kernels instead of passing them as arguments")
    p.add_argument("--backend", default="auto", choices=["auto", "sm80", "sm90"], help="attngen kernel (default auto)")
    p.add_argument("--no-compile-figures", action="store_true", help="skip cold/warm build and call overhead")
    p.add_argument("--overhead-calls", type=int, default=1000, help="calls timed for the call overhead (1000)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"), help="output directory")
    return p.parse_args(argv)


def main(argv=None):
    global BACKEND
    args = parse_args(argv)
    if args.variants is None:
        args.variants = list(SETS[args.set])
    BACKEND = args.backend
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_forward.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "args": vars(args),
        "timing": f"triton.testing.do_bench median, warmup {WARMUP_MS} ms, rep {REP_MS} ms; anchors: median of "
                  f"{ROUNDS} interleaved rounds",
        "tflops_formula": "4*B*H*S^2*D*density / time",
    }
    try:
        import attngen

        meta["attngen"] = getattr(attngen, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        err_line("import attngen", e)
    print(f"{meta['device']}  torch {meta['torch']}  cuda {meta['cuda']}", flush=True)

    result = {"meta": meta}
    md = [f"# attngen forward benchmark\n\n{meta['date']} - {meta['device']} - torch {meta['torch']} "
          f"(CUDA {meta['cuda']}, cuDNN {meta['cudnn']}) - {args.dtype}\n"]
    # compile figures first, while the GPU is otherwise idle (the probes run in their own processes)
    if not args.no_compile_figures:
        result["compile"] = run_compile_figures(args, dtype, device)
        md.append("## Compile and call overhead\n\n" + compile_table(result["compile"]) + "\n")
    if not args.no_anchors:
        rows = run_anchors(args, dtype, device)
        result["anchors"] = rows
        md.append(f"## Anchors (B={args.batch}, H={args.heads}, S={args.seq}, D={args.head_dim})\n\n"
                  + anchors_table(rows) + "\n\nattngen/X > 1 means attngen is faster. TFLOP/s count unmasked pairs only.\n")
    if args.sweep:
        rows = run_sweep(args, dtype, device)
        result["sweep"] = rows
        md.append(f"## Sweep (B = {args.sweep_tokens} // S, H = {args.sweep_hidden} // D)\n\n" + sweep_table(rows) + "\n")

    text = "\n".join(md)
    print("\n" + text, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / f"forward-{stamp}.md").write_text(text)
    (out / f"forward-{stamp}.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out / f'forward-{stamp}.md'} and .json", flush=True)


if __name__ == "__main__":
    main()
