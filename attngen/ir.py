"""Hand-off types between pipeline stages: trace -> predicates -> codegen -> build -> runtime.

Expressions use the vocabulary of ``attngen.symbols``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Tuple

import torch

from .abi import MAX_CAPTURED, MAX_SUMMARIES  # noqa: F401  (re-exported: the C ABI's slot counts)
from .mods import Variant

if TYPE_CHECKING:  # sympy is imported by the stages that build expressions, not by the hand-off types
    import sympy


@dataclass(frozen=True)
class CapturedTensor:
    """A tensor a mod indexed (``bias[h]``, ``doc[q_idx]``): a runtime input keyed by dtype and rank."""

    name: str  # 't0', 't1', ... in first-use order
    tensor: torch.Tensor = field(compare=False, repr=False)  # the live object, re-read at every call
    dtype: torch.dtype = torch.float32
    rank: int = 1
    # Dims whose stride was 1 at trace time. Generated code indexes them with a literal unit stride, so the
    # compiler folds the per-column address arithmetic into load offsets (docs/performance.md); every call
    # checks the stride is still 1 (CompiledAttention).
    unit_stride_dims: Tuple[int, ...] = ()
    # (dim, size) for the dims some index may be negative in (``table[h, q_idx - kv_idx]``). Generated code
    # wraps such an index as torch does (-1 is the last element) with the size baked in as a constant,
    # since the kernel ABI carries no shapes; every call checks the size is unchanged (check_layout).
    wrapped_dims: Tuple[Tuple[int, int], ...] = ()
    # (dim, axis, c) for every index of the form axis + c, axis one of 'b', 'h', 'q', 'kv' (q_idx is
    # absolute: q_offset + row). Recorded at trace time so each call checks the tensor is long enough with
    # a few integer comparisons (check_extents), instead of an IndexError on the CPU path or an
    # out-of-bounds read in the kernel. Other index forms are not bounded here (ATTNGEN_DEBUG=1 checks them).
    extent_rules: Tuple[Tuple[int, str, int], ...] = field(default=(), compare=False)
    source: str = field(default="", compare=False)  # the mod that first indexed it, e.g. "mask_mod 'document'"

    @property
    def integer(self) -> bool:
        return not (self.dtype.is_floating_point or self.dtype.is_complex)

    def check_layout(self, t: torch.Tensor) -> Optional[str]:
        """None if the kernel built for this capture can read ``t`` (the live tensor at call time), else
        the InputError message: a dim traced with stride 1 (unit_stride_dims) must keep it, and a dim whose
        size is baked in (wrapped_dims) must keep that size."""
        desc = f"captured tensor {self.name} ({t.dtype}, shape {tuple(t.shape)})"
        keep = "Keep the captured tensor's layout (copy new values in with .copy_()), or compile the variant again"
        if t.dim() != self.rank:
            return f"{desc} had rank {self.rank} when the variant was compiled, now {t.dim()}. {keep}"
        for d in self.unit_stride_dims:
            if t.stride(d) != 1 and t.shape[d] > 1:
                return (f"{desc} had stride 1 in dim {d} when the variant was compiled, and the kernel was built "
                        f"for it; now its strides are {tuple(t.stride())}. {keep}")
        for d, n in self.wrapped_dims:
            if t.shape[d] != n:
                return (f"{desc} had size {n} in dim {d} when the variant was compiled, and the kernel wraps "
                        f"negative indices of that dim with that size (torch semantics: -1 is the last element); "
                        f"now the size is {t.shape[d]}. {keep}")
        return None


_AXIS_INDEX = {"b": "b", "h": "h", "q": "q_idx", "kv": "kv_idx"}
_AXIS_FIX = {
    "b": "one entry per batch element (q.shape[0])",
    "h": "one entry per query head (q.shape[1])",
    "q": "one entry per absolute query position (q_offset + q.shape[2])",
    "kv": "one entry per key position (k.shape[2])",
}


def check_extents(captured, tensors, B: int, H: int, q_len: int, kv_len: int, q_offset: int) -> None:
    """Raise InputError when a captured tensor is too short for the indices its extent rules describe at
    this call's sizes (``CapturedTensor.extent_rules``); ``tensors`` are the live tensors, in order."""
    for c, t in zip(captured, tensors):
        for dim, axis, const in c.extent_rules:
            if axis == "q":
                first, count = q_offset, q_len
            else:
                first, count = 0, {"b": B, "h": H, "kv": kv_len}[axis]
            if count <= 0 or dim >= t.dim():
                continue
            lo, hi = first + const, first + count - 1 + const
            need = max(hi + 1, -lo)  # torch indexing reaches -n .. n-1
            if t.shape[dim] >= need:
                continue
            from .errors import InputError

            index = _AXIS_INDEX[axis] + (f" + {const}" if const > 0 else f" - {-const}" if const < 0 else "")
            sizes = f"q_offset={q_offset}, q_len={q_len}" if axis == "q" else f"{_AXIS_INDEX[axis]} < {count}"
            origin = f" from {c.source}" if c.source else ""
            raise InputError(
                f"captured tensor {c.name}{origin} ({t.dtype}, shape {tuple(t.shape)}) is indexed in dim {dim} with "
                f"`{index}`, which reaches {hi if hi + 1 >= -lo else lo} at this call ({sizes}): dim {dim} needs "
                f"size >= {need}, it has {t.shape[dim]}. Fix: give the tensor {_AXIS_FIX[axis]} in dim {dim} "
                "(e.g. pad it) and compile the variant with that tensor, or pass inputs the tensor covers"
            )


@dataclass(frozen=True)
class ParamSlot:
    """A runtime parameter a mod read (attngen/params.py): kernel argument ``slot``, symbol ``p<slot>``.

    Keyed by name, kind and lower bound, never by value: the live parameter's current value is read at every call."""

    slot: int
    label: str  # the parameter's name, e.g. 'window'
    integer: bool
    minimum: Optional[int] = None
    param: object = field(default=None, compare=False, repr=False)  # the live RuntimeParam

    @property
    def symbol(self):
        from .symbols import param_symbol

        return param_symbol(self.slot, self.integer, self.minimum)

    def key(self) -> str:
        kind = "int" if self.integer else "real>0"
        return f"p{self.slot}:{self.label}:{kind}" + (f">={self.minimum}" if self.minimum is not None else "")


@dataclass(frozen=True)
class TracedVariant:
    """A variant as expressions. ``score`` has every score-independent -inf branch hoisted into ``mask``."""

    variant: Variant = field(compare=False, repr=False)
    score: sympy.Expr  # in SCORE, B, H, Q, KV, Load/ILoad
    mask: sympy.Basic  # boolean in B, H, Q, KV, ILoad/Load; sympy.true when nothing is masked
    captured: Tuple[CapturedTensor, ...] = ()
    params: Tuple[ParamSlot, ...] = ()  # runtime parameters, in slot order

    @property
    def has_mask(self) -> bool:
        import sympy

        return self.mask is not sympy.true

    @property
    def has_score_mod(self) -> bool:
        from .symbols import SCORE

        return self.score != SCORE

    def canonical(self) -> str:
        """Canonical text of the variant: equal for two spellings of one variant, different for
        different constants. Captured tensors enter by name, dtype, rank, the dims generated code indexes
        with a literal unit stride (unit_stride_dims) and the sizes it wraps negative indices with
        (wrapped_dims; absent when there are none, so other variants keep their keys), never by value."""
        import sympy

        caps = ";".join(f"{c.name}:{c.dtype}:{c.rank}:{''.join(map(str, c.unit_stride_dims))}"
                        + "".join(f":w{d}={n}" for d, n in c.wrapped_dims) for c in self.captured)
        text = f"score={sympy.srepr(self.score)}|mask={sympy.srepr(self.mask)}|captured={caps}"
        # parameters by name and kind only (their values are kernel arguments); absent when there are none
        return text + ("|params=" + ";".join(p.key() for p in self.params) if self.params else "")


@dataclass(frozen=True)
class Summary:
    """A runtime per-block array the predicates read as ``ILoad(Symbol(name), I)`` (or J).

    ``spec`` is a plain tuple naming what to compute (attngen/summaries.py), so an analysis record on disk
    can describe it; ``compute(tensors, BQ, BK, QLEN, KVLEN, QOFF)`` builds it on the tensors' device in
    O(N), ``tensors`` mapping captured names to live tensors. ``axis`` says which block index it is indexed by.
    """

    name: str
    axis: str  # 'q' (indexed by I, length ceil(QLEN/BQ)) or 'kv' (by J, length ceil(KVLEN/BK))
    spec: Tuple = ()
    integer: bool = True
    key: str = ""  # canonical description of what is computed (enters cache keys)

    def compute(self, tensors, BQ, BK, QLEN, KVLEN, QOFF):
        from .summaries import compute_fn

        return compute_fn(self.spec)(tensors, BQ, BK, QLEN, KVLEN, QOFF)


@dataclass(frozen=True)
class BlockPredicates:
    """Closed-form block-skip predicates derived from a mask.

    For q-block I: kv blocks outside [kv_lo, kv_hi) are EMPTY; blocks in [kv_full_lo, kv_full_hi) are FULL
    (clamp both to [0, ceil(KVLEN/BK))). Transposed for kv-block J: q blocks in [q_lo, q_hi), full
    [q_full_lo, q_full_hi). For any tile (I, J) in range: ``tile_any`` False => EMPTY, ``tile_all``
    True => FULL, else PARTIAL. ``needs_classifier`` is False when the ranges alone give the exact map
    (interval patterns), so a kernel need not evaluate tile_any/tile_all per tile.
    All are sound: EMPTY/FULL only when provably so.
    """

    kv_lo: sympy.Expr
    kv_hi: sympy.Expr
    kv_full_lo: sympy.Expr
    kv_full_hi: sympy.Expr
    q_lo: sympy.Expr
    q_hi: sympy.Expr
    q_full_lo: sympy.Expr
    q_full_hi: sympy.Expr
    tile_any: sympy.Basic
    tile_all: sympy.Basic
    needs_classifier: bool = True
    summaries: Tuple[Summary, ...] = ()
    # A union mask (an Or, or an And over Ors) refines the ranges per disjunct: (lo, hi, full_lo, full_hi)
    # each, for q-block I (kv_parts) and kv-block J (q_parts). A tile outside every part's [lo, hi) is
    # EMPTY, one inside any part's [full_lo, full_hi) FULL; () when the mask is not a union.
    kv_parts: Tuple[Tuple[sympy.Expr, ...], ...] = ()
    q_parts: Tuple[Tuple[sympy.Expr, ...], ...] = ()
    notes: Tuple[str, ...] = ()  # what a reader of explain or the build log should know (a coarse map)
    analysis_steps: int = 0  # work the derivation did, in predicates.WORK_BUDGET's steps

    def walk_reads(self, symbol) -> bool:
        """Whether a q-block's kv walk (its ranges, FULL ranges, parts and tile classifier) depends on ``symbol``
        (B or H): then a map or a schedule made for one batch / head does not stand for the others."""
        import sympy  # the expressions are sympy's; this module leaves sympy unimported

        exprs = [self.kv_lo, self.kv_hi, self.kv_full_lo, self.kv_full_hi, self.tile_any, self.tile_all]
        exprs += [e for part in self.kv_parts for e in part]
        return any(symbol in sympy.sympify(e).free_symbols for e in exprs)
