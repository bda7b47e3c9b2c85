"""Derived block predicates vs brute-force per-element evaluation of the mask.

Soundness: a tile is EMPTY only if every element is masked, FULL only if every element is kept, and
no kept element lies outside the kv range of its q-block (or the q range of its kv-block).
Exactness: for masks built from affine comparisons, floor-div / mod by constants, abs, min/max and
their & | ~ combinations (and sorted document ids) the derived map equals the brute-force map.
"""
import random
import types
import zlib

import pytest
import torch

import attngen
from attngen import blockmap, reference
from attngen.blockmap import EMPTY, FULL, PARTIAL, _compile_evaluators, _runtime_arrays
from attngen.analysis import analyze
from helpers import param_values, predicates_with_values, tile_classes

torch.manual_seed(0)
_DOCS = torch.randint(0, 7, (3000,)).sort().values
_DOCS_UNSORTED = torch.randint(0, 40, (3000,))
_DOCS_B = torch.randint(0, 5, (2, 3000)).sort(dim=1).values
_DOCS_2 = torch.randint(0, 11, (3000,)).sort().values
_VALID = torch.rand(3000) > 0.2  # key padding
_PAD = attngen.MaskMod(lambda b, h, q, k: _VALID[k], "valid")


def _custom_min(b, h, q, k):
    return torch.minimum(q, k) >= 130


def _custom_abs(b, h, q, k):
    return abs(q - k) <= 40


def _custom_max(b, h, q, k):
    return torch.maximum(q - 300, k) <= q


def _custom_mod(b, h, q, k):
    return ((q + 2 * k) % 5 != 0) & (k < q + 64)


def _custom_scoremask(s, b, h, q, k):
    return torch.where((q // 64) >= (k // 64), s, float("-inf"))


# (name, variant, exact?) -- exactness is required for the affine/floor/mod/abs families and sorted docs
EXACT = [
    ("causal", attngen.causal()),
    ("sliding_window", attngen.sliding_window(300)),
    ("local", attngen.local(50, 70)),
    ("local_left_only", attngen.local(100, None)),
    ("prefix_lm", attngen.prefix_lm(200)),
    ("chunked", attngen.chunked(96)),
    ("block_diagonal", attngen.block_diagonal(100)),
    ("dilated", attngen.dilated(300, 3)),
    ("document_sorted", attngen.document(_DOCS)),
    ("document_batched", attngen.document(_DOCS_B)),
    ("prefix_or_window", attngen.prefix_lm(64, specialize=True) & ~attngen.block_diagonal(100, specialize=True)
     | attngen.sliding_window(300, specialize=True)),
    ("not_causal", ~attngen.causal()),
    ("causal_and_doc", attngen.causal() & attngen.document(_DOCS)),
    ("min", attngen.MaskMod(_custom_min, "min")),
    ("abs", attngen.MaskMod(_custom_abs, "abs")),
    ("max", attngen.MaskMod(_custom_max, "max")),
    ("prefix_and_dilated", attngen.prefix_lm(100) | attngen.dilated(200, 4)),
    # difference and floor forms in one conjunction (chunk >= block: exact by cutting rows at chunk edges, which
    # takes a chunk size that is a number: specialized)
    ("window_and_not_chunk", attngen.local(64, 64, specialize=True) & ~attngen.chunked(128, specialize=True)),
    ("window_and_not_block_diagonal", attngen.sliding_window(300, specialize=True)
     & ~attngen.block_diagonal(130, specialize=True)),
    ("chunk_or_window", attngen.chunked(130) | attngen.local(30, 10)),
]
SOUND_ONLY = [
    # difference form mixed with a floor form whose chunk (40) is narrower than most blocks: blocks that
    # span three or more chunks fall back to the per-form decision (see docs/architecture.md)
    ("window_and_not_narrow_chunk", attngen.local(20, 20) & ~attngen.chunked(40)),
    # the same with the chunk size a kernel argument (the library's default): no cut at chunk edges, so a tile whose
    # kv block spans one may be PARTIAL where nothing (or everything) is kept
    # (test_runtime_chunk_sizes_keep_the_per_form_decision)
    ("window_and_not_chunk_runtime", attngen.local(64, 64) & ~attngen.chunked(128)),
    ("window_and_not_block_diagonal_runtime", attngen.sliding_window(300) & ~attngen.block_diagonal(130)),
    # (exact at tile widths up to 128; at 176, where a kv block spans three chunks of 100, some FULL tiles are PARTIAL)
    ("prefix_or_window_runtime", attngen.prefix_lm(64) & ~attngen.block_diagonal(100) | attngen.sliding_window(300)),
    ("document_unsorted", attngen.document(_DOCS_UNSORTED)),
    ("mod_two_vars", attngen.MaskMod(_custom_mod, "mod2")),
    ("key_padding", _PAD),
    ("document_and_padding_causal", attngen.document(_DOCS) & _PAD & attngen.causal()),
    # 20 runtime arrays wanted, 16 slots in the kernel ABI: the FULL-range searches are dropped, still sound
    ("two_documents", attngen.document(_DOCS) & attngen.document(_DOCS_2)),
]


def _brute(variant, q_len, kv_len, BQ, BK, q_offset, b=0, h=0):
    variant = attngen.mods.as_variant(variant)
    m = reference.dense_mask(attngen.Variant(mask_mod=variant.mask_mod), b + 1, h + 1, q_len, kv_len, q_offset=q_offset)[b, h]
    if variant.score_mod is not None:
        # a score_mod's -inf branches are part of the mask (hoisted by the tracer)
        s = torch.zeros(q_len, kv_len)
        qi = torch.arange(q_len)[:, None] + q_offset
        ki = torch.arange(kv_len)[None, :]
        m = m & torch.isfinite(variant.score_mod(s, torch.tensor(b), torch.tensor(h), qi, ki))
    return tile_classes(m, BQ, BK)


def _shapes(rng, n):
    for _ in range(n):
        BQ = rng.choice([16, 32, 64, 128])
        BK = rng.choice([16, 32, 64, 128])
        q_len = rng.choice([1, 7, rng.randint(1, 700), BQ * rng.randint(1, 5)])
        kv_len = rng.choice([1, 13, rng.randint(1, 700), BK * rng.randint(1, 5), q_len])
        q_offset = rng.choice([0, 0, rng.randint(0, 200), max(0, kv_len - q_len)])
        yield q_len, kv_len, BQ, BK, q_offset


def _check(variant, q_len, kv_len, BQ, BK, q_offset, exact, b=0, h=0):
    got = attngen.block_map(variant, q_len, kv_len, (BQ, BK), b=b, h=h, q_offset=q_offset)
    want = _brute(variant, q_len, kv_len, BQ, BK, q_offset, b, h)
    ctx = f"q_len={q_len} kv_len={kv_len} block=({BQ},{BK}) q_offset={q_offset}"
    unsound_empty = (got == EMPTY) & (want != EMPTY)
    unsound_full = (got == FULL) & (want != FULL)
    assert not unsound_empty.any(), f"tile marked EMPTY but has kept elements at {unsound_empty.nonzero()[:5].tolist()} ({ctx})"
    assert not unsound_full.any(), f"tile marked FULL but has masked elements at {unsound_full.nonzero()[:5].tolist()} ({ctx})"
    if exact:
        diff = got != want
        assert not diff.any(), f"inexact at {diff.nonzero()[:5].tolist()}: got {got[diff][:5].tolist()} want {want[diff][:5].tolist()} ({ctx})"
    _check_q_ranges(variant, q_len, kv_len, BQ, BK, q_offset, want, b, h)


def _check_q_ranges(variant, q_len, kv_len, BQ, BK, q_offset, want, b, h):
    """The transposed ranges (q blocks per kv block, for the backward pass) must be sound too."""
    traced, preds = analyze(variant)
    preds = predicates_with_values(preds, param_values(traced.params))
    arrays = _runtime_arrays(traced, preds, BQ, BK, q_len, kv_len, q_offset, {})
    ev = _compile_evaluators(preds)
    nqb, nkb = want.shape
    j = torch.arange(nkb)
    lo, hi, flo, fhi = [torch.as_tensor(f(j, BQ, BK, q_len, kv_len, q_offset, b, h, tensors=arrays)).expand(nkb).clamp(0, nqb)
                        for f in ev.q_range]
    i = torch.arange(nqb)[:, None]
    outside = (i < lo[None, :]) | (i >= hi[None, :])
    assert not ((want != EMPTY) & outside).any(), "kept tile outside its kv-block's q range"
    in_full = (i >= flo[None, :]) & (i < fhi[None, :])
    assert not ((want != FULL) & in_full).any(), "non-full tile inside the provably full q range"


def _params(cases):
    return [pytest.param(n, v, id=n) for n, v in cases]


@pytest.mark.parametrize("name,variant", _params(EXACT))
def test_block_map_exact_and_sound(name, variant):
    rng = random.Random(zlib.crc32(name.encode()))  # stable across processes
    for shape in _shapes(rng, 12):
        _check(variant, *shape, exact=True)


def test_runtime_chunk_sizes_keep_the_per_form_decision():
    """Chunk forms next to a window, on the shapes where scripts/predicate_stress.py found tiles PARTIAL though
    nothing (or, at 176-column tiles, everything) is kept: with the chunk size a number (specialize=True) the rows are
    cut at chunk edges and the map is exact; with a kernel argument (the library's default) they are not (the cut's
    predicates grew the variant's code 1.65-2.04x and made its kernels spill more, docs/architecture.md), and the map
    stays sound."""
    window_cases = [(396, 336, 16, 128, 19), (48, 512, 16, 32, 99), (640, 231, 128, 64, 0), (620, 261, 32, 16, 0),
                    (64, 384, 32, 128, 65), (640, 256, 128, 64, 98), (256, 459, 128, 32, 203)]
    cases = [(lambda sp: attngen.sliding_window(300, specialize=sp) & ~attngen.block_diagonal(130, specialize=sp),
              window_cases),
             (lambda sp: attngen.local(64, 64, specialize=sp) & ~attngen.chunked(128, specialize=sp), window_cases),
             (lambda sp: attngen.prefix_lm(64, specialize=sp) & ~attngen.block_diagonal(100, specialize=sp)
              | attngen.sliding_window(300, specialize=sp),
              [(1072, 1685, 64, 176, 0), (256, 704, 128, 176, 448), (1024, 1024, 128, 176, 0)])]
    for specialize in (True, False):
        for make, shapes in cases:
            for shape in shapes:
                _check(make(specialize), *shape, exact=specialize)


@pytest.mark.parametrize("name,variant", _params(SOUND_ONLY))
def test_block_map_sound(name, variant):
    rng = random.Random(7)
    for shape in _shapes(rng, 10):
        _check(variant, *shape, exact=False)


def test_score_mod_mask_is_hoisted_into_block_map():
    v = attngen.compile(score_mod=_custom_scoremask)
    traced, _ = analyze(v)
    assert traced.score == attngen.trace(attngen.Variant()).score  # the score part is the plain score
    for shape in _shapes(random.Random(3), 6):
        _check(v.variant, *shape, exact=True)


def test_batched_document_uses_batch_index():
    for b in (0, 1):
        _check(attngen.document(_DOCS_B), 500, 700, 64, 32, 0, exact=True, b=b)


def test_alibi_and_softcap_are_dense():
    v = attngen.compile(score_mod=attngen.alibi(8).then(attngen.softcap(20)))
    bm = v.block_map(300, 200, (64, 64))
    assert (bm == FULL).all()


def _count_block_map_work(monkeypatch, variant):
    """Counters of what block_map does, patched into attngen.blockmap: elements the per-q-block range evaluators
    see, tiles enumerated one by one (the ragged ranges of not-provably-full tiles), elements the tile classifier
    sees, and calls of the mask itself."""
    work = types.SimpleNamespace(range_elements=0, range_calls=0, tiles_enumerated=0, classified=0, mask_calls=0)
    real_evaluators, real_ragged = blockmap._compile_evaluators, blockmap._ragged_arange

    def counted(fn, kind):
        def f(first, *args, **kw):
            n = torch.as_tensor(first).numel()
            if kind == "range":
                work.range_elements += n
                work.range_calls += 1
            else:
                work.classified += n
            return fn(first, *args, **kw)
        return f

    def evaluators(preds, params=()):
        ev = real_evaluators(preds, params)
        return blockmap._Evaluators(kv_range=tuple(counted(f, "range") for f in ev.kv_range), q_range=ev.q_range,
                                    tile_any=counted(ev.tile_any, "tile"), tile_all=counted(ev.tile_all, "tile"))

    def ragged(n):
        out = real_ragged(n)
        work.tiles_enumerated += out.numel()
        return out

    def mask(*a, real=variant.fn):
        work.mask_calls += 1
        return real(*a)

    monkeypatch.setattr(blockmap, "_compile_evaluators", evaluators)
    monkeypatch.setattr(blockmap, "_ragged_arange", ragged)
    monkeypatch.setattr(variant, "fn", mask)
    return work


_MILLION = [attngen.causal(), attngen.sliding_window(4096), attngen.document(torch.randint(0, 8, (1 << 20,)).sort().values)]
_MILLION_IDS = ["causal", "sliding_window", "document"]


@pytest.mark.parametrize("variant", _MILLION, ids=_MILLION_IDS)
def test_block_map_at_one_million_tokens_does_linear_work(variant, monkeypatch):
    """block_map at 1M tokens (8192 x 8192 tiles) is fast because its work is O(N/B), not O((N/B)^2): the kv
    ranges are evaluated once per q-block, provably full runs are filled as slices, and only the tiles in range
    but not provably full are enumerated (and classified where the mask needs it); the mask is never evaluated
    per element. Counted here at N and N/4 (no wall-clock assertion: that failed CI on a loaded machine)."""
    n = 1 << 20
    analyze(variant)  # tracing and derivation are one-time costs, not block_map's
    for tokens in (n // 4, n):
        nqb = tokens // 128
        with monkeypatch.context() as mp:
            work = _count_block_map_work(mp, variant)
            bm = attngen.block_map(variant, tokens, tokens)
        assert bm.dtype == torch.int8 and bm.shape == (nqb, nqb)
        assert work.mask_calls == 0, "block_map evaluated the mask itself"
        assert work.range_calls == 4 and work.range_elements == 4 * nqb  # kv_lo, kv_hi, kv_full_lo, kv_full_hi
        # O(N/B): at most 16 tiles per q-block looked at one by one, of nqb * nkb = 2^26 at 1M tokens
        assert 0 < work.tiles_enumerated <= 16 * nqb, (tokens, work)
        assert work.classified <= 2 * work.tiles_enumerated, (tokens, work)  # tile_any + tile_all on those only
        assert int((bm == PARTIAL).sum()) <= work.tiles_enumerated  # every partial tile was one of them


@pytest.mark.heavy  # 4 x 2^27 mask elements per variant: seconds on a 2-core box
@pytest.mark.parametrize("variant", _MILLION, ids=_MILLION_IDS)
def test_block_map_at_one_million_tokens_spot_rows(variant):
    """A few rows of the 1M-token map against brute force on the row's tiles."""
    n = 1 << 20
    bm = attngen.block_map(variant, n, n)
    assert bm.dtype == torch.int8 and bm.shape == (8192, 8192)
    cols = 8192  # every element of the row is evaluated, 64 tiles at a time (temporaries stay in cache)
    for i in (0, 1, 4000, 8191):
        rows = torch.arange(i * 128, (i + 1) * 128)[:, None]
        want = []
        for c in range(0, n, cols):
            kv = torch.arange(c, c + cols)[None, :]
            m = torch.as_tensor(variant(torch.tensor(0), torch.tensor(0), rows, kv)).expand(128, cols)
            t = m.reshape(128, cols // 128, 128)  # (row in block, kv block, column in block)
            want.append(torch.where(t.all(2).all(0), FULL, torch.where(t.any(2).any(0), PARTIAL, EMPTY)).to(torch.int8))
        assert torch.equal(bm[i], torch.cat(want))


def test_runtime_summaries_fit_the_kernel_abi():
    from attngen.ir import MAX_SUMMARIES

    for v in (attngen.document(_DOCS) & attngen.document(_DOCS_2), attngen.document(_DOCS) & _PAD):
        _, preds = analyze(v)
        assert len(preds.summaries) <= MAX_SUMMARIES
    _, one = analyze(attngen.document(_DOCS))
    # min/max per q and kv block, then block range and full range searches along kv (the forward's walk) and
    # block range searches along q (the backward's)
    assert len(one.summaries) == 10


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("rank", [1, 2])
def test_document_q_ranges_of_the_backward_walk(sort, rank):
    """The backward walks q-blocks per kv-block: for document ids its range comes from the same equal-value
    searches as the forward's (the atom doc[q] == doc[kv] seen from the q side), so a kv-block's walk covers its
    documents' q rows only, not every q-block; exact for sorted ids, sound for any; per batch row for (B, S) ids.
    No FULL run along q is derived (predicates.py: tile_all classifies those tiles)."""
    from attngen import blockmap

    rng = random.Random(7 + sort + 2 * rank)
    for _ in range(12):
        q_len, kv_len = rng.randint(1, 700), rng.randint(1, 700)
        q_off = rng.choice([0, rng.randint(0, 200)])
        BQ, BK = rng.choice([16, 64]), rng.choice([32, 128])
        gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
        ids = torch.randint(0, rng.randint(1, 9), (3, q_off + max(q_len, kv_len)), generator=gen)
        ids = (ids.sort(dim=1).values if sort else ids).to(torch.int32)
        b = rng.randrange(3) if rank == 2 else 0
        v = attngen.document(ids if rank == 2 else ids[0])
        traced, preds = analyze(v)
        nqb, nkb = -(-q_len // BQ), -(-kv_len // BK)
        arrays = blockmap._runtime_arrays(traced, preds, BQ, BK, q_len, kv_len, q_off, {})
        ev = blockmap._evaluators(traced, preds)
        j = torch.arange(nkb, dtype=torch.int64)
        lo, hi, flo, fhi = (blockmap._as_i64(f(j, BQ, BK, q_len, kv_len, q_off, b, 0, tensors=arrays), nkb).clamp(0, nqb)
                            for f in ev.q_range)
        assert (flo >= fhi).all(), "a FULL run along q from the equal-value searches"
        row = ids[b]
        classes = tile_classes(row[q_off:q_off + q_len, None] == row[None, :kv_len], BQ, BK)
        for jj in range(nkb):
            rows = (classes[:, jj] > 0).nonzero().flatten()
            ctx = f"sort={sort} rank={rank} b={b} q_len={q_len} kv_len={kv_len} q_off={q_off} block=({BQ},{BK}) j={jj}"
            if rows.numel():  # sound: every kept tile inside [lo, hi)
                assert lo[jj] <= rows.min() and rows.max() < hi[jj], ctx
                if sort:  # exact for sorted ids
                    assert (lo[jj], hi[jj]) == (rows.min(), rows.max() + 1), ctx


def test_key_padding_tiles_are_exact_at_the_block_level():
    valid = torch.ones(1024, dtype=torch.bool)
    valid[300:700] = False
    bm = attngen.block_map(attngen.MaskMod(lambda b, h, q, k: valid[k], "valid"), 256, 1024, (64, 128))
    assert bm[:, 3].eq(EMPTY).all() and bm[:, 0].eq(FULL).all() and bm[:, 2].eq(PARTIAL).all()


def test_block_map_with_an_infinite_full_range_does_not_crash():
    # an empty full range can print as ceiling(oo / BK): the torch evaluator keeps +-inf (the CUDA printer clamps it)
    def m(b, h, q, kv):
        return (torch.minimum(torch.abs(torch.maximum(kv - 1, kv)), torch.abs((kv - 14) + (kv + 40)))
                < ((q // 7) + torch.minimum(q, kv + 9)) // 7)

    attn = attngen.compile(mask_mod=m, backend="reference")
    attngen.block_map(attn, 10, 10, (4, 4))


def test_block_map_refuses_a_negative_q_offset():
    # predicates and generated code rely on q_idx >= 0 (C division of row terms, numeric ranges of QOFF)
    with pytest.raises(attngen.InputError, match="q_offset must be >= 0"):
        attngen.block_map(attngen.compile(causal=True, backend="reference"), 10, 10, (4, 4), q_offset=-1)
