"""Command line: ``python -m attngen demo | explain | compile | cache``."""
from __future__ import annotations

import argparse
import ast
import sys
import time

import torch

VARIANT_HELP = (
    "variant spec: library calls joined with & | ~ and score mods with '+', e.g. "
    "'causal()', 'sliding_window(1024)', 'softcap(30)+causal()', 'prefix_lm(2048) | sliding_window(512)', "
    "'alibi(16)+causal()', 'document(sorted_random(8))'"
)


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
    tree = ast.parse(spec.strip(), mode="eval").body

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
            return names[node.func.id](*[ev(a) for a in node.args], **{k.arg: ev(k.value) for k in node.keywords})
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.Add)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.BitAnd):
                return a & b
            if isinstance(node.op, ast.BitOr):
                return a | b
            return [a, b]
        raise SystemExit(f"attngen: cannot parse variant spec {spec!r} at {ast.dump(node)[:60]}\n  {VARIANT_HELP}")

    def flatten(x):
        return sum((flatten(e) for e in x), []) if isinstance(x, list) else [x]

    mods = flatten(ev(tree))
    score = [m for m in mods if isinstance(m, attngen.ScoreMod)]
    mask = [m for m in mods if isinstance(m, attngen.MaskMod)]
    if len(mask) > 1:
        raise SystemExit("attngen: combine masks with & or |, not +")
    return Variant(score_mod=compose(*score), mask_mod=mask[0] if mask else None)


def _naive_float64(q, k, v, variant, scale):
    """Dense float64 attention straight from the mods (independent of tracing and predicates)."""
    B, H, L, D = q.shape
    qf, kf, vf = (t.double().cpu() for t in (q, k, v))
    rep = H // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    qi = torch.arange(L)[None, None, :, None]
    ki = torch.arange(k.shape[2])[None, None, None, :]
    if variant.score_mod is not None:
        s = variant.score_mod(s, b, h, qi, ki)
    if variant.mask_mod is not None:
        s = s.masked_fill(~torch.as_tensor(variant.mask_mod(b, h, qi, ki)).expand_as(s), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ vf


def cmd_demo(args) -> int:
    import attngen

    print("attngen demo: softcap(30) + sliding window 4096\n")
    attn = attngen.compile(score_mod=attngen.softcap(30), window=4096)
    t0 = time.perf_counter()
    print(attn.explain(32768))
    print(f"(tracing + derivation + 32k block map: {time.perf_counter() - t0:.2f} s)\n")

    use_gpu = torch.cuda.is_available() and not args.cpu
    dev = "cuda" if use_gpu else "cpu"
    dtype = torch.bfloat16 if use_gpu else torch.float32
    B, H, L, D = 1, 4, 1000, 64
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(dev, dtype) for _ in range(3))
    small = attngen.compile(score_mod=attngen.softcap(30), window=256)
    path = "GPU kernel" if use_gpu else "reference (no GPU here)"
    t0 = time.perf_counter()
    out = small(q, k, v)
    if use_gpu:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ref = _naive_float64(q, k, v, small.variant, D ** -0.5)
    err = (out.double().cpu() - ref).abs().max().item()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ok = err <= tol
    print(f"attention B={B} H={H} L={L} D={D} {str(dtype).replace('torch.', '')}, softcap(30) + window 256, via {path}: "
          f"{dt * 1e3:.1f} ms; max |err| vs float64 = {err:.2e} (tolerance {tol:g}) -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def cmd_explain(args) -> int:
    import attngen

    variant = parse_variant(args.variant, max(args.q_len, args.kv_len or 0))
    print(attngen.explain(variant, args.q_len, args.kv_len, block=(args.block_q, args.block_k), png=args.png))
    return 0


def cmd_compile(args) -> int:
    from .frontend import compile as compile_variant

    variant = parse_variant(args.variant)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    attn = compile_variant(variant.score_mod, variant.mask_mod, fast_math=not args.no_fast_math)
    path = attn.spec(dtype, args.head_dim, args.arch, args.kernel).build_cached()
    print(path)
    return 0


def cmd_cache(argv) -> int:
    from .cache.cli import main as cache_main

    return cache_main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "cache":
        return cmd_cache(argv[1:])
    p = argparse.ArgumentParser(prog="python -m attngen", description="attngen: compile attention variants into CUDA kernels")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="declare softcap(30) + window 4096, show the derived predicates, run and check")
    d.add_argument("--cpu", action="store_true", help="use the reference path even if a GPU is present")
    e = sub.add_parser("explain", help="show the expressions, predicates and block map of a variant")
    e.add_argument("variant", help=VARIANT_HELP)
    e.add_argument("--q-len", type=int, default=32768)
    e.add_argument("--kv-len", type=int, default=None)
    e.add_argument("--block-q", type=int, default=128)
    e.add_argument("--block-k", type=int, default=128)
    e.add_argument("--png", default=None, help="write a picture of the block map here")
    c = sub.add_parser("compile", help="build a variant's kernel into the cache (no GPU needed)")
    c.add_argument("variant", help=VARIANT_HELP)
    c.add_argument("--arch", default="sm_90a", help="target, e.g. sm_90a, sm_80 (default sm_90a)")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    c.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    c.add_argument("--kernel", default="auto", choices=["auto", "sm80", "sm90"], help="kernel template")
    c.add_argument("--no-fast-math", action="store_true")
    sub.add_parser("cache", help="cache ls | clear | info <key> | path")
    args = p.parse_args(argv)
    return {"demo": cmd_demo, "explain": cmd_explain, "compile": cmd_compile}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
