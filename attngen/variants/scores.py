"""Library score mods: softcap and ALiBi.

Every function returns a ``ScoreMod`` around a plain ``score_mod(score, b, h, q_idx, kv_idx)`` whose
body uses only operators and the torch functions the tracer understands (see masks.py). ``score`` is
the already-scaled q.k value. Chain score mods with ``a.then(b)`` or ``attngen.mods.compose(a, b)``.
"""
from __future__ import annotations

from typing import Union

import torch

from ..mods import ScoreMod
from ..params import RuntimeParam
from .masks import VariantArgumentError, _as_int, _fmt, _real, _shown


def softcap(cap: float, *, specialize: bool = False) -> ScoreMod:
    """Gemma-2 / Grok style logit soft-capping: ``cap * tanh(score / cap)``, squashing scores into (-cap, cap).
    ``cap`` is a kernel argument (one build serves every cap) unless ``specialize=True``."""
    c = RuntimeParam("cap", _real("softcap", "cap", cap, "softcap(30.0)"), integer=False, specialize=specialize)

    def softcap_score(score, b, h, q_idx, kv_idx):
        return c * torch.tanh(score / c)

    return ScoreMod(softcap_score, lambda v: f"softcap({_shown(c, v)})")


def alibi(heads_or_slopes: Union[int, torch.Tensor], *, specialize: bool = False) -> ScoreMod:
    """ALiBi: ``score + slope[h] * (kv_idx - q_idx)`` (a penalty growing with distance for kv < q).

    ``alibi(num_heads)`` uses the geometric slopes ``2 ** (-8 (h + 1) / num_heads)`` of the ALiBi paper,
    computed from ``h`` inside the mod (no tensor captured); ``num_heads`` must equal the number of query
    heads, and is a kernel argument (one build serves every head count) unless ``specialize=True``. ``alibi(slopes)`` takes a 1-D floating tensor of per-query-head slopes (read as ``slopes[h]``,
    on the inputs' device), e.g. for head counts that are not a power of two or learned slopes.
    """
    if isinstance(heads_or_slopes, torch.Tensor):
        slopes = heads_or_slopes
        if not slopes.dtype.is_floating_point:
            raise VariantArgumentError(
                f"alibi(): a slopes tensor must be floating point, got {slopes.dtype}; pass slopes.float(), "
                "or pass the number of heads as a Python int, e.g. alibi(16)"
            )
        if slopes.dim() != 1 or slopes.numel() == 0:
            raise VariantArgumentError(
                f"alibi(): a slopes tensor must be 1-D with one slope per query head, got shape "
                f"{tuple(slopes.shape)}; pass e.g. slopes.reshape(-1)"
            )

        def alibi_score(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        return ScoreMod(alibi_score, f"alibi(slopes[{slopes.shape[0]}])")

    if isinstance(heads_or_slopes, float) and float(heads_or_slopes).is_integer():
        heads_or_slopes = int(heads_or_slopes)
    n = RuntimeParam("num_heads", _as_int("alibi", "num_heads", heads_or_slopes, 1,
                                          "alibi(16) or alibi(torch.tensor(slopes))"),
                     integer=True, minimum=1, specialize=specialize)

    def alibi_score(score, b, h, q_idx, kv_idx):
        # the slope stays an expression in h (no captured table): the kernel computes it per head
        return score + 2.0 ** (-8.0 * (h + 1) / n) * (kv_idx - q_idx)

    return ScoreMod(alibi_score, lambda v: f"alibi({_shown(n, v)})")
