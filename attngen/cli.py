"""Command line: ``python -m attngen demo | explain | compile | cache``.

Errors (attngen's own, and the environment's OSErrors) print one line and exit 1; ``--verbose`` shows the
traceback instead (and sets ATTNGEN_VERBOSE=1, so cache hits and nvcc command lines are logged too).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
import time

import torch

from .errors import AttngenError, InputError

VARIANT_HELP = (
    "variant spec: library calls joined with & | ~ and score mods with '+', e.g. "
    "'causal()', 'sliding_window(1024)', 'softcap(30)+causal()', 'chunked(2048) | sliding_window(512)', "
    "'alibi(16)+causal()', 'document(sorted_random(8))'"
)

# Targets `compile --arch` builds for. sm_90 means sm_90a for the sm90 kernel (TMA + wgmma exist only in the
# arch-specific sm_90a target), and plain sm_90 for the portable kernel (`--kernel sm80`).
ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a")


def resolve_arch(arch: str, kernel: str) -> tuple[str, str | None]:
    """(arch to build for, a note to print or None) for `compile --arch ARCH --kernel KERNEL`; InputError for a
    target attngen does not build, or a kernel the target cannot run."""
    a = arch.strip().lower()
    if a not in ARCHS:
        raise InputError(
            f"--arch {arch} is not a target attngen builds: expected one of {', '.join(ARCHS)} "
            f"(Ampere sm_80/86/87, Ada sm_89, Hopper sm_90a). Older GPUs (sm_75 and below) are not supported."
        )
    if a == "sm_90" and kernel in ("auto", "sm90"):
        return "sm_90a", ("attngen: --arch sm_90 builds for sm_90a (H100/H200): the sm90 kernel needs the "
                          "arch-specific target. For the portable kernel on sm_90, pass --kernel sm80.")
    if kernel == "sm90" and a != "sm_90a":
        raise InputError(f"--kernel sm90 needs --arch sm_90a (H100/H200), got --arch {arch}. Fix: pass --arch "
                         f"sm_90a, or --kernel sm80 (the portable kernel) for {arch}.")
    return a, None


def _sorted_random(n_docs: int, length: int = 32768):
    return torch.randint(0, n_docs, (length,)).sort().values


def parse_variant(spec: str, length: int = 32768):
    """Parse a variant spec into a Variant. Only library names and literals are accepted (the spec is
    parsed, never passed to eval)."""
    import attngen
    from attngen.mods import Variant, compose

    names = {n: getattr(attngen, n) for n in ("causal", "sliding_window", "local", "prefix_lm", "chunked",
                                              "document", "block_diagonal", "dilated", "softcap", "alibi")}
    names["sorted_random"] = lambda n: _sorted_random(n, length)
    try:
        tree = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as e:
        raise InputError(f"cannot parse variant spec {spec!r}: {e.msg}. {VARIANT_HELP}") from None

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, type(None))):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return ~ev(node.operand)
        if isinstance(node, ast.Tuple):
            return tuple(ev(e) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            args, kwargs = [ev(a) for a in node.args], {k.arg: ev(k.value) for k in node.keywords}
            try:
                return names[node.func.id](*args, **kwargs)
            except AttngenError:
                raise
            except TypeError as e:  # wrong argument count
                raise InputError(f"variant spec {spec!r}: {ast.unparse(node)}: {e}. {VARIANT_HELP}") from None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.Add)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.BitAnd):
                return a & b
            if isinstance(node.op, ast.BitOr):
                return a | b
            return [a, b]
        raise InputError(f"cannot parse variant spec {spec!r} at {ast.unparse(node)!r}: only library calls, "
                         f"numbers and & | ~ + are accepted. {VARIANT_HELP}")

    def flatten(x):
        return sum((flatten(e) for e in x), []) if isinstance(x, list) else [x]

    mods = flatten(ev(tree))
    score = [m for m in mods if isinstance(m, attngen.ScoreMod)]
    mask = [m for m in mods if isinstance(m, attngen.MaskMod)]
    if len(mask) > 1:
        raise InputError(f"variant spec {spec!r} joins two masks with '+': combine masks with & or |")
    return Variant(score_mod=compose(*score), mask_mod=mask[0] if mask else None)


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


def cmd_cache(argv) -> int:
    from .cache.cli import main as cache_main

    return cache_main(argv)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true",
                        help="on an error, show the full traceback; log cache hits and nvcc commands")
    p = argparse.ArgumentParser(prog="python -m attngen", parents=[common],
                                description="attngen: compile attention variants into CUDA kernels")
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
        return {"demo": cmd_demo, "explain": cmd_explain, "compile": cmd_compile}[args.cmd](args)
    except (AttngenError, OSError) as e:
        if args.verbose:
            raise
        from .cache.cli import error_line

        print(error_line(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
