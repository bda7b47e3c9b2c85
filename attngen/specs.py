"""What the command line names, for the CLI and `prebuild`: variant specs ('softcap(30)+causal()', parsed from the
text, never evaluated) and the build targets `--arch` accepts."""
from __future__ import annotations

import ast

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
