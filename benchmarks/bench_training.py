#!/usr/bin/env python
"""Forward + backward benchmark (issue 11): attngen vs torch.compile(flex_attention) vs SDPA (cuDNN), one process.

The anchor variants of bench_forward.py at B=2, H=16, S=8192, D=128, bf16 (--variants to choose). One step is
``out = attn(q, k, v)`` then ``torch.autograd.grad(out, (q, k, v), dout)`` (no .grad accumulation). Before
timing, attngen's dq, dk, dv are compared with flex's (max abs difference printed). Every implementation of a
variant is built first, then timed in 3 interleaved rounds (triton's do_bench median each, after 1 s of
matmuls); the figure is the median of the rounds.
TFLOP/s = 4 * B * H * S^2 * D * density * 3.5 / time (the forward's work plus 2.5 times it for the backward),
density as in bench_forward.py: masked-out pairs are not counted, for every implementation alike.
``--bwd-kernel sm80_bwd`` times attngen with the portable backward instead of the sm90 one (the "before").
``--fa4`` adds FlashAttention-4 (``flash_attn.cute``, its SM90 kernels on an H100/H200) in the same rounds, on the
variants its arguments express (FA4_ARGS), with its own (B, S, H, D) copies of q, k, v and dout; its gradients are
compared with flex's as attngen's are. FA4 is not a dependency: ``scripts/fa4_pack.py`` packs it for the device.
The learnable variants (LEARNABLE) capture a tensor that requires grad, and their step differentiates it too:
``relpos_learnable`` is issue 11's ``s + table[h, q - kv + S - 1]``, ``alibi_learnable`` ALiBi + causal with
learnable slopes, ``relpos_frozen`` the relative-position step with the table not requiring grad (the control).

    python benchmarks/bench_training.py --out DIR [--variants causal full ...] [--bwd-kernel sm80_bwd]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_forward as bf  # noqa: E402  (the variants, flex / SDPA wrappers and timing helpers)

VARIANTS = ["causal", "full", "sliding_window", "softcap_causal", "alibi_causal", "document", "prefix_lm"]
LEARNABLE = ["relpos_learnable", "alibi_learnable", "relpos_frozen"]
# flex's default tiles can exceed the GPU's shared memory (the learnable table's backward at S = 8192): it is
# retried with these, smallest last, and the row says which ran
FLEX_RETRY_OPTIONS = [{"num_stages": 1},
                      {"num_stages": 1, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64,
                       "BLOCK_N2": 32}]
FLOP_FACTOR = 3.5  # forward + backward work over the forward's
GRAD_NAMES = ("dq", "dk", "dv", "dcaptured")
# FA4's flash_attn_func arguments for the anchors it has (sliding_window(1024) keeps kv in [q - 1023, q])
FA4_ARGS = {"full": {}, "causal": {"causal": True}, "softcap_causal": {"causal": True, "softcap": 30.0},
            "sliding_window": {"window_size": (1023, 0)}}


def make_learnable(key: str, S: int, H: int, device, seed: int = 0):
    """(score_mod, mask_mod, leaves) of a learnable variant: plain functions over captured leaves, as a flex user
    writes them."""
    import torch

    from attngen import variants as V
    from attngen.mods import ScoreMod

    gen = torch.Generator().manual_seed(seed)
    if key in ("relpos_learnable", "relpos_frozen"):  # frozen: the same step without the table's gradient
        table = (torch.randn(H, 2 * S - 1, generator=gen) * 0.1).to(device).requires_grad_(key == "relpos_learnable")

        def relpos(score, b, h, q_idx, kv_idx):
            return score + table[h, q_idx - kv_idx + S - 1]

        return ScoreMod(relpos, key), None, [table] if table.requires_grad else []
    if key == "alibi_learnable":
        slopes = torch.exp2(-8.0 * torch.arange(1, H + 1) / H).to(device).requires_grad_()

        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        return ScoreMod(alibi, "alibi_learnable"), V.causal(), [slopes]
    raise KeyError(key)


def step_fn(fn, q, k, v, dout, leaves=()):
    import torch

    def step():
        out = bf._out(fn(q, k, v))
        return torch.autograd.grad(out, (q, k, v, *leaves), dout)

    return step


def grad_diffs(name, grads, ref) -> dict:
    """Max abs difference of each gradient from flex's (``ref``), by GRAD_NAMES, printed as ``name`` vs flex."""
    errs = dict(zip(GRAD_NAMES, [(g.float() - r).abs().max().item() for g, r in zip(grads, ref)]))
    print(f"  {name} vs flex: " + ", ".join(f"{n} {e:.3e}" for n, e in errs.items()), flush=True)
    return errs


def fa4_step(flash_attn_func, kwargs, q, k, v, dout):
    """FA4's step on its own (B, S, H, D) copies of q, k, v and dout (its layout), its gradients returned as views in
    attngen's (B, H, S, D)."""
    import torch

    qf, kf, vf = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    df = dout.transpose(1, 2).contiguous()

    def step():
        out = bf._out(flash_attn_func(qf, kf, vf, **kwargs))
        return tuple(g.transpose(1, 2) for g in torch.autograd.grad(out, (qf, kf, vf), df))

    return step


def import_fa4():
    """(flash_attn_func, None) or (None, the error line) for --fa4."""
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, None
    except Exception as e:  # noqa: BLE001
        return None, bf.err_line("FA4 import", e)


def run(args):
    import torch

    device = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.bwd_kernel:
        from attngen.frontend import CompiledAttention

        # the families autograd.backward_kernel tries, for every variant of this run
        CompiledAttention.backward_kernels = lambda self, head_dim, device_index: (args.bwd_kernel,)
    B, H, S, D = args.batch, args.heads, args.seq, args.head_dim
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    q, k, v, dout = (torch.randn(B, H, S, D, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    bf.heat_gpu(device)
    flex = bf.Flex()
    fa4_func, fa4_error = import_fa4() if args.fa4 else (None, None)
    rows = []
    for key in args.variants:
        print(f"[{key}]", flush=True)
        row = {"key": key, "B": B, "H": H, "S": S, "D": D, "dtype": args.dtype}
        if key in LEARNABLE:
            score_mod, mask_mod, leaves = make_learnable(key, S, H, device, seed=args.seed)
        else:
            (score_mod, mask_mod), leaves = bf.make_variant(key, S, H, device, seed=args.seed), []
        row["variant"] = bf.LABELS.get(key) or bf.variant_name(score_mod, mask_mod)
        row["density"] = bf.density_of(score_mod, mask_mod, B, H, S, device)
        fns, ref = {}, None
        for options in [None] + FLEX_RETRY_OPTIONS:
            try:
                f = step_fn(flex.make(score_mod, mask_mod, S, device, options), q, k, v, dout, leaves)
                ref = [g.float() for g in f()]
                fns["flex"] = f
                if options:
                    row["flex_kernel_options"] = options
                    print(f"  flex ran with kernel_options={options}", flush=True)
                break
            except Exception as e:  # noqa: BLE001
                row["flex_error"] = bf.err_line("flex", e)
                if "out of resource" not in str(e):
                    break
        if "flex" in fns:
            row.pop("flex_error", None)
        try:
            t0 = time.perf_counter()
            attn = bf.make_attngen(score_mod, mask_mod)
            attn.deterministic = args.deterministic
            a = step_fn(attn, q, k, v, dout, leaves)
            grads = a()
            torch.cuda.synchronize()
            row["attngen_first_step_s"] = time.perf_counter() - t0
            if ref is not None:
                row["max_abs_diff_vs_flex"] = grad_diffs("attngen", grads, ref)
                row["max_abs_grad_flex"] = dict(zip(GRAD_NAMES, [r.abs().max().item() for r in ref]))
            del grads
            fns["attngen"] = a
        except Exception as e:  # noqa: BLE001
            row["attngen_error"] = bf.err_line("attngen", e)
        if key in ("full", "causal"):
            sd, backend = bf.sdpa_for(q, k, v, key == "causal")
            if sd is not None:
                fns["sdpa"] = step_fn(sd, q, k, v, dout)
                row["sdpa_backend"] = backend
        if args.fa4 and key in FA4_ARGS and fa4_error:
            row["fa4_error"] = fa4_error
        elif args.fa4 and key in FA4_ARGS:
            try:
                f = fa4_step(fa4_func, FA4_ARGS[key], q, k, v, dout)
                grads = f()
                if ref is not None:
                    row["fa4_max_abs_diff_vs_flex"] = grad_diffs("FA4", grads, ref)
                del grads
                fns["fa4"] = f
            except Exception as e:  # noqa: BLE001
                row["fa4_error"] = bf.err_line("FA4", e)
        bf.heat_gpu(device, 1.0)
        bf.interleaved_ms(fns, row, order=("attngen", "flex", "sdpa", "fa4"))
        for n in fns:
            if f"{n}_ms" in row:
                row[f"{n}_tflops"] = bf.tflops(B, H, S, D, row["density"], row[f"{n}_ms"]) * FLOP_FACTOR
        bf.speed_ratios(row)
        if row.get("attngen_ms") and row.get("fa4_ms"):
            row["attngen_over_fa4"] = row["fa4_ms"] / row["attngen_ms"]
        print("  " + ", ".join(f"{n}={bf.fmt(row.get(n + '_tflops'))} TFLOP/s" for n in ("attngen", "flex", "sdpa", "fa4")
                               if n != "fa4" or args.fa4), flush=True)
        rows.append(row)
        bf._free()
    return rows


def table(rows, bwd_kernel, deterministic: bool = False, fa4: bool = False) -> str:
    """The run's markdown table; with ``fa4``, FA4's TFLOP/s, attngen over it and FA4's gradients against flex's too."""
    fa4_head = " FA4 TFLOP/s | ÷ FA4 | FA4 max abs diff vs flex |" if fa4 else ""
    head = ("| variant | attngen ms | attngen TFLOP/s | flex TFLOP/s | cuDNN TFLOP/s | ÷ flex | ÷ cuDNN |" + fa4_head +
            " density | max abs diff vs flex (dq, dk, dv[, dcaptured]) |\n|---|---|---|---|---|---|---|---|---|"
            + ("---|---|---|" if fa4 else "") + "\n")
    lines, notes = [], []
    for r in rows:
        d = r.get("max_abs_diff_vs_flex") or {}
        if r.get("flex_kernel_options"):
            notes.append(f"{r['variant']}: flex with kernel_options={r['flex_kernel_options']} (its defaults exceed "
                         "shared memory)")
        if r.get("fa4_error"):
            notes.append(f"{r['variant']}: FA4 failed: {r['fa4_error']}")
        fa4_cells = ""
        if fa4:
            d4 = r.get("fa4_max_abs_diff_vs_flex") or {}
            fa4_cells = (f" {bf.fmt(r.get('fa4_tflops'))} | {bf.fmt_ratio(r.get('attngen_over_fa4'))} | "
                         f"{', '.join(f'{x:.2e}' for x in d4.values()) or 'n/a'} |")
        lines.append(f"| {r['variant']} | {bf.fmt(r.get('attngen_ms'), 3)} | {bf.fmt(r.get('attngen_tflops'))} | "
                     f"{bf.fmt(r.get('flex_tflops'))} | {bf.fmt(r.get('sdpa_tflops'))} | "
                     f"{bf.fmt_ratio(r.get('attngen_over_flex'))} | {bf.fmt_ratio(r.get('attngen_over_sdpa'))} |"
                     f"{fa4_cells} "
                     f"{r['density']:.3f} | {', '.join(f'{x:.2e}' for x in d.values()) or 'n/a'} |")
    return (f"attngen backward: {bwd_kernel or 'default (sm90_bwd on sm_90a at D 64 / 128)'}"
            f"{', deterministic' if deterministic else ''}\n\n" + head
            + "\n".join(lines) + "\n" + "".join(f"\n{n}\n" for n in notes))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=bf.ANCHORS + bf.EXTRA + LEARNABLE,
                   metavar="NAME")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bwd-kernel", choices=["sm80_bwd", "sm90_bwd"], default=None)
    p.add_argument("--deterministic", action="store_true", help="attngen's backward with dQ in a fixed order")
    p.add_argument("--fa4", action="store_true", help="FlashAttention-4 (flash_attn.cute) in the same rounds")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = p.parse_args(argv)
    rows = run(args)
    bf.write_results(args.out, "training", args, rows, table(rows, args.bwd_kernel, args.deterministic, args.fa4))


if __name__ == "__main__":
    main()
