"""Inspection: the block map computed from the derived predicates, and a readable report.

``block_map`` never evaluates the mask per element. It evaluates the per-q-block ranges (O(N/B)),
fills the provably full runs, and runs the tile classifier only on the tiles inside a kv range that
are not provably full, so its cost follows the number of boundary tiles, and its memory is the map
itself plus O(N/B) vectors.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import sympy
import torch

from . import symbols as S
from .analysis import analyze
from .errors import InputError
from .ir import BlockPredicates, TracedVariant
from .printer import torch_function

EMPTY, PARTIAL, FULL = 0, 1, 2
_ROW_ARGS = (S.I, S.BQ, S.BK, S.QLEN, S.KVLEN, S.QOFF, S.B, S.H)
_TILE_ARGS = (S.I, S.J, S.BQ, S.BK, S.QLEN, S.KVLEN, S.QOFF, S.B, S.H)
_COL_ARGS = (S.J, S.BQ, S.BK, S.QLEN, S.KVLEN, S.QOFF, S.B, S.H)


@dataclass
class _Evaluators:
    kv_range: tuple
    q_range: tuple
    tile_any: object
    tile_all: object
    kv_parts: tuple = ()  # per part, (lo, hi, full_lo, full_hi) evaluators (BlockPredicates.kv_parts)


@functools.lru_cache(maxsize=64)
def _compile_evaluators(preds: BlockPredicates, params: tuple = ()) -> _Evaluators:
    """Evaluators of the symbolic predicates, taking the runtime parameters ``params`` (symbols) as trailing
    arguments: substituting values into the expressions instead would rebuild them at every call."""
    summaries = {s.name: s.integer for s in preds.summaries}

    def fn(e, args):
        return torch_function(e, args + params, summaries=summaries or None)

    return _Evaluators(
        kv_range=tuple(fn(e, _ROW_ARGS) for e in (preds.kv_lo, preds.kv_hi, preds.kv_full_lo, preds.kv_full_hi)),
        q_range=tuple(fn(e, _COL_ARGS) for e in (preds.q_lo, preds.q_hi, preds.q_full_lo, preds.q_full_hi)),
        tile_any=fn(preds.tile_any, _TILE_ARGS),
        tile_all=fn(preds.tile_all, _TILE_ARGS),
        kv_parts=tuple(tuple(fn(e, _ROW_ARGS) for e in part) for part in preds.kv_parts),
    )


def _evaluators(traced: TracedVariant, preds: BlockPredicates) -> _Evaluators:
    """The compiled evaluators with the parameters' current values bound."""
    ev = _compile_evaluators(preds, tuple(p.symbol for p in traced.params))
    if not traced.params:
        return ev
    values = tuple(p.param.value for p in traced.params)

    def bind(f):
        return lambda *args, **kw: f(*args, *values, **kw)

    return _Evaluators(
        kv_range=tuple(map(bind, ev.kv_range)), q_range=tuple(map(bind, ev.q_range)), tile_any=bind(ev.tile_any),
        tile_all=bind(ev.tile_all), kv_parts=tuple(tuple(map(bind, part)) for part in ev.kv_parts),
    )


def _runtime_arrays(traced: TracedVariant, preds: BlockPredicates, BQ, BK, QLEN, KVLEN, QOFF, overrides) -> Dict[str, torch.Tensor]:
    tensors = {}
    for c in traced.captured:
        t = overrides.get(c.name, c.tensor)
        if t.dtype != c.dtype or t.dim() != c.rank:
            raise InputError(
                f"captured tensor {c.name} was traced as {c.dtype} rank {c.rank}, got {t.dtype} rank {t.dim()}; "
                "pass a tensor of the traced dtype and rank (or re-trace the variant)"
            )
        tensors[c.name] = t.detach().cpu()
    arrays = dict(tensors)
    for s in preds.summaries:
        arrays[s.name] = s.compute(tensors, BQ, BK, QLEN, KVLEN, QOFF).cpu()
    return arrays


def _as_i64(x, n):
    t = x if isinstance(x, torch.Tensor) else torch.tensor(x)
    return t.to(torch.int64).expand(n) if t.dim() == 0 else t.to(torch.int64)


def kv_ranges(traced, preds, q_len, kv_len, block, b=0, h=0, q_offset=0, captured=None):
    """Per q-block (lo, hi, full_lo, full_hi) int64 vectors, clamped to [0, n_kv_blocks], and per part of a
    union mask (lo, hi) vectors, as the kernels walk them (block_range.cuh): the FULL run is then the parts'
    widest one."""
    BQ, BK = block
    nqb, nkb = -(-q_len // BQ), -(-kv_len // BK)
    arrays = _runtime_arrays(traced, preds, BQ, BK, q_len, kv_len, q_offset, captured or {})
    ev = _evaluators(traced, preds)
    i = torch.arange(nqb, dtype=torch.int64)

    def run(f):
        return _as_i64(f(i, BQ, BK, q_len, kv_len, q_offset, b, h, tensors=arrays), nqb)

    parts = [[run(f) for f in part] for part in ev.kv_parts]
    # with parts the kernels take the parts' widest FULL run, not the whole mask's range
    full = widest_full_run([p[2] for p in parts], [p[3] for p in parts]) if parts else (run(f) for f in ev.kv_range[2:])
    lo, hi, flo, fhi = [x.clamp(0, nkb) for x in (run(ev.kv_range[0]), run(ev.kv_range[1]), *full)]
    return (lo, hi, flo, fhi), [(p[0].clamp(0, nkb), p[1].clamp(0, nkb)) for p in parts], arrays, ev


def widest_full_run(flos, fhis):
    """block_parts.cuh's widest_full_run over vectors: the parts' FULL ranges, overlapping or adjacent ones
    merged, otherwise the widest."""
    f_lo, f_hi = flos[0], fhis[0]
    for a, z in zip(flos[1:], fhis[1:]):
        live = z > a
        take = live & (f_hi <= f_lo)
        merge = live & ~take & (a <= f_hi) & (f_lo <= z)
        wider = live & ~take & ~merge & (z - a > f_hi - f_lo)
        f_lo = torch.where(take | wider, a, torch.where(merge, torch.minimum(f_lo, a), f_lo))
        f_hi = torch.where(take | wider, z, torch.where(merge, torch.maximum(f_hi, z), f_hi))
    return f_lo, f_hi


def block_map(variant, q_len: int, kv_len: int, block: Tuple[int, int] = (128, 128), b: int = 0, h: int = 0,
              q_offset: int = 0, **captured) -> torch.Tensor:
    """int8 tensor (n_q_blocks, n_kv_blocks): 0 empty, 1 partial, 2 full, from the derived predicates.

    ``variant``: anything ``attngen.compile`` returns, a Variant, MaskMod or ScoreMod.
    ``captured``: replacement values for captured tensors by traced name (``t0=doc_ids``).
    """
    if q_len <= 0 or kv_len <= 0:
        raise InputError(f"block_map needs positive lengths, got q_len={q_len}, kv_len={kv_len}")
    if q_offset < 0:
        raise InputError(f"q_offset must be >= 0 (the absolute position of the first query), got {q_offset}")
    BQ, BK = block
    if BQ <= 0 or BK <= 0:
        raise InputError(f"block sizes must be positive, got block={block}")
    traced, preds = analyze(variant)
    nqb, nkb = -(-q_len // BQ), -(-kv_len // BK)
    out = torch.zeros(nqb, nkb, dtype=torch.int8)
    (lo, hi, flo, fhi), parts, arrays, ev = kv_ranges(traced, preds, q_len, kv_len, block, b, h, q_offset, captured)
    # a union mask visits only its parts' ranges (within [lo, hi)); otherwise [lo, hi) is the one range
    spans = [(torch.maximum(a, lo), torch.minimum(z, hi)) for a, z in parts] or [(lo, hi)]
    in_span = [(a < z) for a, z in spans]
    fhi = torch.maximum(flo, torch.minimum(fhi, hi))
    flo = torch.maximum(flo, lo).minimum(fhi)
    for i, (a, z) in enumerate(zip(flo.tolist(), fhi.tolist())):
        if z > a:
            out[i, a:z] = FULL
    # tiles in a span but not provably full: [a, flo) and [fhi, z) of each span, each tile once
    rows = torch.arange(nqb, dtype=torch.int64)
    cand_i, cand_j = [], []
    for (a, z), live in zip(spans, in_span):
        for s0, s1 in ((a, torch.minimum(z, flo)), (torch.maximum(a, fhi), z)):
            n = torch.where(live, s1 - s0, 0).clamp(min=0)
            cand_i.append(rows.repeat_interleave(n))
            cand_j.append(s0.repeat_interleave(n) + _ragged_arange(n))
    cand_i, cand_j = torch.cat(cand_i), torch.cat(cand_j)
    if len(spans) > 1:
        cell = torch.unique(cand_i * nkb + cand_j)
        cand_i, cand_j = cell // nkb, cell % nkb
    chunk = 1 << 20
    for s in range(0, cand_i.numel(), chunk):
        i, j = cand_i[s : s + chunk], cand_j[s : s + chunk]
        args = (i, j, BQ, BK, q_len, kv_len, q_offset, b, h)
        if preds.needs_classifier:
            anyv = _as_bool(ev.tile_any(*args, tensors=arrays), i.numel())
            allv = _as_bool(ev.tile_all(*args, tensors=arrays), i.numel())
            cls = torch.where(allv, FULL, torch.where(anyv, PARTIAL, EMPTY)).to(torch.int8)
        else:
            cls = torch.full_like(i, PARTIAL, dtype=torch.int8)
        out[i, j] = cls
    return out


def _ragged_arange(n: torch.Tensor) -> torch.Tensor:
    """concat(arange(n0), arange(n1), ...) without a Python loop."""
    total = int(n.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    ends = torch.cumsum(n, 0)
    starts = (ends - n).repeat_interleave(n)
    return torch.arange(total, dtype=torch.int64) - starts


def _as_bool(x, n):
    t = x if isinstance(x, torch.Tensor) else torch.tensor(bool(x))
    return t.to(torch.bool).expand(n) if t.dim() == 0 else t.to(torch.bool)


# ----------------------------------------------------------------------------------------------
# explain
# ----------------------------------------------------------------------------------------------

def _fmt(e) -> str:
    return sympy.sstr(e)


def explain(variant, q_len: int = 32768, kv_len: Optional[int] = None, block: Tuple[int, int] = (128, 128),
            png: Optional[str] = None, **captured) -> str:
    """A readable report: simplified mask and score expressions, kv-range formulas, sparsity, and
    (with ``png=path``) a picture of the block map."""
    kv_len = q_len if kv_len is None else kv_len
    traced, preds = analyze(variant)
    bm = block_map(variant, q_len, kv_len, block, **captured)
    n = bm.numel()
    n_empty = int((bm == EMPTY).sum())
    n_full = int((bm == FULL).sum())
    n_part = n - n_empty - n_full
    lines = [
        f"variant: {traced.variant.name}",
        f"score:   {_fmt(traced.score)}",
        f"mask:    {_fmt(traced.mask)}",
    ]
    if traced.captured:
        lines.append("captured: " + ", ".join(f"{c.name}: {c.dtype} rank {c.rank}" for c in traced.captured))
    if traced.params:
        lines.append("runtime parameters (kernel arguments; the block map below uses these values): "
                     + ", ".join(f"p{p.slot} = {p.label} = {p.param.value}" for p in traced.params))
    lines += [
        "",
        "derived block predicates (i: q-block, j: kv-block; BQ, BK block sizes; QOFF q offset):",
        f"  kv blocks visited for q-block i: [{_fmt(preds.kv_lo)}, {_fmt(preds.kv_hi)})",
        f"  kv blocks provably full:         [{_fmt(preds.kv_full_lo)}, {_fmt(preds.kv_full_hi)})"
        if not preds.kv_parts else "  kv blocks provably full:         the widest of the parts' full runs (below)",
        f"  q blocks per kv-block j (bwd):   [{_fmt(preds.q_lo)}, {_fmt(preds.q_hi)})",
    ]
    if preds.kv_parts:
        lines.append(f"  a union of {len(preds.kv_parts)} parts, each visited on its own (the gaps between them skipped):")
        lines += [f"    part {k}: kv blocks [{_fmt(lo)}, {_fmt(hi)}), full [{_fmt(flo)}, {_fmt(fhi)})"
                  for k, (lo, hi, flo, fhi) in enumerate(preds.kv_parts)]
    lines += [f"  note: {n}" for n in preds.notes]
    if preds.summaries:
        lines.append("  runtime per-block summaries: " + "; ".join(f"{s.name} = {s.key}" for s in preds.summaries))
    ta = _fmt(preds.tile_any)
    lines.append(f"  tile classifier: EMPTY unless {ta if len(ta) < 400 else ta[:400] + ' ...'}")
    lines += [
        "",
        f"block map at q_len={q_len}, kv_len={kv_len}, block={block[0]}x{block[1]}: {bm.shape[0]}x{bm.shape[1]} tiles",
        f"  empty {n_empty} ({100.0 * n_empty / n:.1f}%), partial {n_part} ({100.0 * n_part / n:.1f}%), "
        f"full {n_full} ({100.0 * n_full / n:.1f}%)",
        f"  work relative to dense attention: {100.0 * (n_full + n_part) / n:.1f}% of tiles",
    ]
    if png:
        write_png(bm, png, block=block)
        lines.append(f"  picture: {png}")
    return "\n".join(lines)


# A 5x7 bitmap font (rows top to bottom, 5 bits each, MSB left) for the picture's labels: the PNG is written
# without an imaging library, so attngen needs neither matplotlib nor PIL. Lowercase letters print as capitals.
_FONT = {
    "0": "0e11131519110e", "1": "040c040404040e", "2": "0e11010204081f", "3": "1f02040201110e",
    "4": "02060a121f0202", "5": "1f101e0101110e", "6": "0608101e11110e", "7": "1f010204080808",
    "8": "0e11110e11110e", "9": "0e11110f01020c", "A": "0e1111111f1111", "B": "1e11111e11111e",
    "C": "0e11101010110e", "D": "1c12111111121c", "E": "1f10101e10101f", "F": "1f10101e101010",
    "G": "0e11101711110f", "H": "1111111f111111", "I": "0e04040404040e",
    "J": "0702020202120c", "K": "11121418141211", "L": "1010101010101f", "M": "111b1515111111",
    "N": "11111915131111", "O": "0e11111111110e", "P": "1e11111e101010", "Q": "0e11111115120d",
    "R": "1e11111e141211", "S": "0f10100e01011e", "T": "1f040404040404", "U": "1111111111110e",
    "V": "1111110a0a0404", "W": "1111111515150a", "X": "11110a040a1111", "Y": "1111110a040404",
    "Z": "1f01020408101f", " ": "00000000000000", ".": "00000000000c0c", ",": "000000000c0408",
    ":": "000c0c000c0c00", "(": "02040808080402", ")": "08040202020408", "-": "0000001f000000",
    "=": "00001f001f0000", "/": "00010204081000", "%": "18190204081303", "x": "0000110a040a11",
    "?": "0e110102040004",
}
_INK = (40, 40, 40)
_PALETTE = ((255, 255, 255), (240, 140, 40), (30, 60, 140))  # EMPTY, PARTIAL, FULL
_LEGEND = (("EMPTY", EMPTY), ("PARTIAL", PARTIAL), ("FULL", FULL))


def _text_mask(text: str, scale: int = 2) -> torch.Tensor:
    """Bool (7*scale, 6*scale*len) bitmap of `text` in the 5x7 font, one blank column after each glyph."""
    cols = []
    for ch in text:
        code = _FONT.get(ch) or _FONT.get(ch.upper()) or _FONT["?"]
        rows = [int(code[i:i + 2], 16) for i in range(0, 14, 2)]
        g = torch.tensor([[(r >> (4 - c)) & 1 for c in range(5)] + [0] for r in rows], dtype=torch.bool)
        cols.append(g)
    m = torch.cat(cols, 1) if cols else torch.zeros(7, 0, dtype=torch.bool)
    return m.repeat_interleave(scale, 0).repeat_interleave(scale, 1)


def _paste(canvas: torch.Tensor, mask: torch.Tensor, y: int, x: int, color=_INK) -> None:
    h, w = mask.shape
    y, x = max(0, y), max(0, x)
    h, w = min(h, canvas.shape[0] - y), min(w, canvas.shape[1] - x)
    if h > 0 and w > 0:
        region = canvas[y:y + h, x:x + w]
        region[mask[:h, :w]] = torch.tensor(color, dtype=torch.uint8)


def _ticks(n: int) -> list:
    """Block indices to label on an axis of n blocks: 0 and the multiples of a 1/2/5 x 10^k step, at most 6."""
    step = 1
    while -(-n // step) > 6:
        step = next(step * f for f in (2, 5, 10) if -(-n // (step * f)) <= 6 or f == 10)
    return list(range(0, n, step))


def write_png(bm: torch.Tensor, path: str, max_side: int = 1024, block: Optional[Tuple[int, int]] = None) -> None:
    """Write the block map as a PNG (white empty, orange partial, dark blue full; q blocks down, kv blocks
    across) with axes, tick labels, a legend and a title giving the tile size (`block`). No imaging
    dependency: a 5x7 bitmap font, zlib and a hand-made PNG container. Large maps are downsampled (a cell
    shows partial if any of its tiles is partial, else full if any is full)."""
    import struct
    import zlib

    nq, nk = bm.shape
    m = bm
    step = max(1, -(-max(m.shape) // max_side))
    if step > 1:
        H, W = -(-m.shape[0] // step), -(-m.shape[1] // step)
        pad = torch.zeros(H * step, W * step, dtype=torch.int8)
        pad[: m.shape[0], : m.shape[1]] = m
        # partial dominates (it is where mask work happens), then full
        v = pad.reshape(H, step, W, step)
        has_part = (v == PARTIAL).any(3).any(1)
        has_full = (v == FULL).any(3).any(1)
        m = torch.where(has_part, PARTIAL, torch.where(has_full, FULL, EMPTY)).to(torch.int8)
    scale = max(1, 512 // max(m.shape))
    m = m.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    palette = torch.tensor(_PALETTE, dtype=torch.uint8)
    img = palette[m.long()]
    ppb = scale / step  # pixels per block along either axis
    mh, mw = int(round(nq * ppb)), int(round(nk * ppb))  # the map's pixels (padding of a downsampled map cut)
    img = img[:max(1, mh), :max(1, mw)]
    mh, mw = img.shape[0], img.shape[1]

    fs, ch, cw = 2, 14, 12  # font scale, glyph height and advance in pixels
    title = f"BLOCK MAP, {nq} X {nk} TILES" + (f" OF {block[0]}x{block[1]} (Q X KV)" if block else "")
    if step > 1:
        title += f", 1 PIXEL = {step}x{step} TILES" if scale == 1 else f", 1 CELL = {step}x{step} TILES"
    yt, xt = _ticks(nq), _ticks(nk)
    ylab_w = max(len(str(t)) for t in yt) * cw
    left = 8 + ch + 8 + ylab_w + 6
    top = 8 + ch + 12
    legend_w = 16 + ch + 6 + len("PARTIAL") * cw + 8
    width = max(left + mw + legend_w, len(title) * cw + 16)
    height = top + mh + 6 + ch + 8 + ch + 10
    canvas = torch.full((height, width, 3), 255, dtype=torch.uint8)

    canvas[top:top + mh, left:left + mw] = img
    frame = torch.tensor((120, 120, 120), dtype=torch.uint8)
    canvas[top - 1, left - 1:left + mw + 1] = frame
    canvas[top + mh, left - 1:left + mw + 1] = frame
    canvas[top - 1:top + mh + 1, left - 1] = frame
    canvas[top - 1:top + mh + 1, left + mw] = frame

    _paste(canvas, _text_mask(title, fs), 8, 8)
    for t in xt:  # kv blocks across, below the map
        x = left + int(t * ppb)
        canvas[top + mh + 1:top + mh + 5, x] = torch.tensor(_INK, dtype=torch.uint8)
        lab = _text_mask(str(t), fs)
        _paste(canvas, lab, top + mh + 6, min(x - lab.shape[1] // 2 if t else x, width - lab.shape[1]))
    xlabel = _text_mask("KV BLOCK", fs)
    _paste(canvas, xlabel, top + mh + 6 + ch + 6, left + (mw - xlabel.shape[1]) // 2)
    for t in yt:  # q blocks down, left of the map
        y = top + int(t * ppb)
        canvas[y, left - 5:left - 1] = torch.tensor(_INK, dtype=torch.uint8)
        lab = _text_mask(str(t), fs)
        _paste(canvas, lab, y if t == 0 else y - ch // 2, left - 6 - lab.shape[1])
    ylabel = _text_mask("Q BLOCK", fs).T.flip(0)  # rotated a quarter turn, reading upwards
    _paste(canvas, ylabel, top + (mh - ylabel.shape[0]) // 2, 8)
    lx, ly = left + mw + 16, top
    for i, (name, cls) in enumerate(_LEGEND):
        y = ly + i * (ch + 8)
        canvas[y:y + ch, lx:lx + ch] = torch.tensor(_INK, dtype=torch.uint8)
        canvas[y + 1:y + ch - 1, lx + 1:lx + ch - 1] = palette[cls]
        _paste(canvas, _text_mask(name, fs), y, lx + ch + 6)

    raw = b"".join(b"\x00" + bytes(row.flatten().tolist()) for row in canvas)

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    hdr = struct.pack(">IIBBBBB", canvas.shape[1], canvas.shape[0], 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", hdr) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
