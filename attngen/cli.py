"""Command line: ``python -m attngen demo | explain | compile | prebuild | cache``.

Errors (attngen's own, and the environment's OSErrors) print one line and exit 1; ``--verbose`` shows the
traceback instead (and sets ATTNGEN_VERBOSE=1, so cache hits and nvcc command lines are logged too).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from .errors import AttngenError, InputError
from .specs import ARCHS, VARIANT_HELP, parse_variant, resolve_arch

def _naive_float64(q, k, v, variant, scale, rows=None):
    """Dense float64 attention straight from the mods (independent of tracing and predicates), for the query
    rows `rows` (default: all)."""
    B, H, L, D = q.shape
    qi_all = torch.arange(L) if rows is None else torch.as_tensor(rows)
    qf, kf, vf = (t.double().cpu() for t in (q[:, :, qi_all], k, v))
    rep = H // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    qi = qi_all[None, None, :, None]
    ki = torch.arange(k.shape[2])[None, None, None, :]
    if variant.score_mod is not None:
        s = variant.score_mod(s, b, h, qi, ki)
    if variant.mask_mod is not None:
        s = s.masked_fill(~torch.as_tensor(variant.mask_mod(b, h, qi, ki)).expand_as(s), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ vf


DEMO_WINDOW = 4096


def cmd_demo(args) -> int:
    import attngen

    print(f"attngen demo: softcap(30) + sliding window {DEMO_WINDOW}\n")
    attn = attngen.compile(score_mod=attngen.softcap(30), window=DEMO_WINDOW)
    t0 = time.perf_counter()
    print(attn.explain(32768))
    print(f"(tracing + derivation + 32k block map: {time.perf_counter() - t0:.2f} s)\n")

    use_gpu = torch.cuda.is_available() and not args.cpu
    dev = "cuda" if use_gpu else "cpu"
    dtype = torch.bfloat16 if use_gpu else torch.float32
    # Longer than the window, so the window cuts the later rows: the run exercises the variant announced.
    B, H, L, D = 1, 2, DEMO_WINDOW + 1024, 64
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(dev, dtype) for _ in range(3))
    path = "GPU kernel" if use_gpu else "reference (no GPU here)"
    t0 = time.perf_counter()
    out = attn(q, k, v)
    if use_gpu:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    # float64 check on rows before the window starts cutting and after (dense float64 on all rows is 4 GiB)
    rows = torch.cat([torch.arange(0, 64), torch.arange(DEMO_WINDOW - 64, L, 8)])
    ref = _naive_float64(q, k, v, attn.variant, D ** -0.5, rows)
    err = (out[:, :, rows].double().cpu() - ref).abs().max().item()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ok = err <= tol
    print(f"attention B={B} H={H} L={L} D={D} {str(dtype).replace('torch.', '')}, softcap(30) + sliding window "
          f"{DEMO_WINDOW}, via {path}: {dt * 1e3:.1f} ms; max |err| vs float64 on {rows.numel()} rows (the window "
          f"cuts rows >= {DEMO_WINDOW}) = {err:.2e} (tolerance {tol:g}) -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def cmd_explain(args) -> int:
    import attngen

    variant = parse_variant(args.variant, max(args.q_len, args.kv_len or 0))
    print(attngen.explain(variant, args.q_len, args.kv_len, block=(args.block_q, args.block_k), png=args.png))
    return 0


def cmd_compile(args) -> int:
    from .frontend import compile as compile_variant

    arch, note = resolve_arch(args.arch, args.kernel)  # before any tracing or building
    if note:
        print(note, file=sys.stderr)
    variant = parse_variant(args.variant)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    attn = compile_variant(variant.score_mod, variant.mask_mod, fast_math=not args.no_fast_math)
    path = attn.spec(dtype, args.head_dim, arch, args.kernel).build_cached()
    print(path)
    return 0


def _csv(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def cmd_prebuild(args) -> int:
    from pathlib import Path

    from . import prebuild as pb

    out = Path(args.out)
    if args.wheel_only:
        pb.build_wheel(out, Path(args.wheel_dir))
        return 0
    try:
        head_dims = [int(h) for h in _csv(args.head_dims)]
    except ValueError:
        raise InputError(f"--head-dims takes comma-separated integers, e.g. 64,128,256; got {args.head_dims!r}") from None
    tasks = pb.plan(args.variants or list(pb.DEFAULT_VARIANTS), _csv(args.dtypes), head_dims, _csv(args.archs),
                    backward=not args.no_backward)
    doc = pb.prebuild(out, tasks, max(1, args.jobs), strip=not args.no_strip)
    if args.wheel:
        pb.build_wheel(out, Path(args.wheel_dir))
    return 1 if doc["last_run"]["failed"] and args.strict else 0


def cmd_cache(argv) -> int:
    from .cache.cli import main as cache_main

    return cache_main(argv)


def build_parser() -> argparse.ArgumentParser:
    verbose_help = "on an error, show the full traceback; log cache hits and nvcc commands"
    # accepted before or after the subcommand; SUPPRESS keeps a subcommand's default from undoing `-v cmd`
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    p = argparse.ArgumentParser(prog="python -m attngen",
                                description="attngen: compile attention variants into CUDA kernels")
    p.add_argument("--verbose", "-v", action="store_true", help=verbose_help)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", parents=[common], help=f"declare softcap(30) + sliding window {DEMO_WINDOW}, show the "
                       "derived predicates, run it and check against float64")
    d.add_argument("--cpu", action="store_true", help="use the reference path even if a GPU is present")
    e = sub.add_parser("explain", parents=[common], help="show the expressions, predicates and block map of a variant")
    e.add_argument("variant", help=VARIANT_HELP)
    e.add_argument("--q-len", type=int, default=32768)
    e.add_argument("--kv-len", type=int, default=None)
    e.add_argument("--block-q", type=int, default=128)
    e.add_argument("--block-k", type=int, default=128)
    e.add_argument("--png", default=None, help="write a picture of the block map here")
    c = sub.add_parser("compile", parents=[common], help="build a variant's kernel into the cache (no GPU needed)")
    c.add_argument("variant", help=VARIANT_HELP)
    c.add_argument("--arch", default="sm_90a", metavar="ARCH",
                   help=f"target, one of {', '.join(ARCHS)} (default sm_90a; sm_90 means sm_90a unless "
                        f"--kernel sm80)")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    c.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    c.add_argument("--kernel", default="auto", choices=["auto", "sm80", "sm90"],
                   help="kernel template: auto (sm90 on sm_90a, else sm80), sm80 (portable), sm90 (sm_90a only)")
    c.add_argument("--no-fast-math", action="store_true")
    b = sub.add_parser("prebuild", parents=[common], help="build the library variants ahead of time into a prebuilt "
                       "root (and the attngen-kernels wheel): deployments then need no nvcc (docs/deploy.md)")
    b.add_argument("--out", default="attngen-prebuilt", help="the prebuilt root to build into (default ./%(default)s;"
                   " a second run only builds what is missing)")
    b.add_argument("--variants", nargs="+", metavar="VARIANT", help="names (full, causal, sliding_window, local, "
                   "softcap, softcap_causal, softcap_window, alibi, alibi_causal, prefix_lm, chunked, document, "
                   "document_i32: the default is all) or variant specs; parameters are baked in (issue 14.1)")
    b.add_argument("--dtypes", default="bf16,fp16,fp8")
    b.add_argument("--head-dims", default="64,128,256")
    b.add_argument("--archs", default="sm_90a,sm_80")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel builds (default: CPU count)")
    b.add_argument("--no-backward", action="store_true", help="forward libraries only (default: also the backward each arch runs)")
    b.add_argument("--no-strip", action="store_true", help="keep the host symbol tables of the libraries")
    b.add_argument("--strict", action="store_true", help="exit 1 when a library fails to build")
    b.add_argument("--wheel", action="store_true", help="then package the root as the attngen-kernels wheel")
    b.add_argument("--wheel-only", action="store_true", help="package an existing --out root, build nothing")
    b.add_argument("--wheel-dir", default="dist", help="where the wheel goes (default ./%(default)s)")
    sub.add_parser("cache", help="cache ls | clear | info <key> | path")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "cache":
        return cmd_cache(argv[1:])
    args = build_parser().parse_args(argv)
    if args.verbose:
        os.environ["ATTNGEN_VERBOSE"] = "1"
    try:
        return {"demo": cmd_demo, "explain": cmd_explain, "compile": cmd_compile, "prebuild": cmd_prebuild}[args.cmd](args)
    except (AttngenError, OSError) as e:
        if args.verbose:
            raise
        from .cache.cli import error_line

        print(error_line(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
