"""Generated kernels through the public API vs the float64 golden, tests/reference64.py (needs a CUDA GPU).

Judged as FlexAttention's and FlashAttention's tests judge bf16/fp16 kernels: the kernel's error
against float64 may be at most ~2x the error of an eager implementation in the same dtype (plus a
tiny absolute slack). Fresh random inputs every case; outputs are poisoned by the runtime being given
no preallocated buffers, and any NaN/inf in a kept row fails.
"""
import concurrent.futures as cf
import functools
import json
import os
import types

import pytest
import torch

import attngen
import reference64
from helpers import assert_matches_float64

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
# ATTNGEN_TEST_BACKEND=sm90 runs the same suite against the SM90 (TMA + wgmma) template
BACKEND = os.environ.get("ATTNGEN_TEST_BACKEND", "auto")
NPOS = 2100  # positions covered by the captured tables below


def _rowsink(b, h, q, k):
    # queries 0..99 see nothing: fully masked rows
    return (q >= 100) & (k <= q)


@functools.lru_cache(maxsize=None)
def data() -> types.SimpleNamespace:
    """The captured tensors (on the GPU) and the compiled variants, made on first use: the module imports (and
    its tests skip) on a machine without a GPU, and collection compiles nothing."""
    _GEN = torch.Generator(device="cpu").manual_seed(1234)
    DOCS = torch.randint(0, 5, (NPOS,), generator=_GEN).sort().values.to(DEV)
    DOCS_B = torch.randint(0, 4, (2, NPOS), generator=_GEN).sort(dim=1).values.to(DEV)
    SLOPES = torch.exp2(-torch.arange(1, 9, dtype=torch.float32)).to(DEV)
    BIAS = (torch.randn(8, 2 * NPOS, generator=_GEN) * 0.5).to(DEV, torch.bfloat16)
    VALID = (torch.rand(NPOS, generator=_GEN) > 0.3).to(DEV)
    DOCS_2 = torch.randint(0, 9, (NPOS,), generator=_GEN).sort().values.to(DEV)
    PAD = attngen.MaskMod(lambda b, h, q, k: VALID[k], "valid")
    # per-head factors of both signs and zero: the sm90 kernel keeps q.k raw only where scale * factor > 0
    HEAD_FACTOR = torch.tensor([1.5, -0.7, 0.0, 0.3, 2.0, -1.2, 0.9, 1.0], device=DEV)

    def _bias_mod(s, b, h, q, k):
        return s + BIAS[h, q - k + 2100]

    def _head_factor(s, b, h, q, k):
        return s * HEAD_FACTOR[h]

    VARIANTS = _variants(DOCS, DOCS_B, SLOPES, DOCS_2, PAD, _bias_mod, _head_factor)
    assert list(VARIANTS) == VARIANT_NAMES
    return types.SimpleNamespace(DOCS=DOCS, VARIANTS=VARIANTS)


def _variants(DOCS, DOCS_B, SLOPES, DOCS_2, PAD, _bias_mod, _head_factor):
    return {
        "full": attngen.compile(backend=BACKEND),
        "causal": attngen.compile(causal=True, backend=BACKEND),
        "sliding_window": attngen.compile(window=256, backend=BACKEND),
        "local": attngen.compile(window=(100, 50), backend=BACKEND),
        "softcap": attngen.compile(softcap=30.0, backend=BACKEND),
        "softcap_causal": attngen.compile(softcap=30.0, causal=True, backend=BACKEND),
        "alibi_causal": attngen.compile(score_mod=attngen.alibi(8), causal=True, backend=BACKEND),
        "alibi_tensor": attngen.compile(score_mod=attngen.alibi(SLOPES), backend=BACKEND),
        "prefix_lm": attngen.compile(mask_mod=attngen.prefix_lm(300), backend=BACKEND),
        "chunked": attngen.compile(mask_mod=attngen.chunked(192), backend=BACKEND),
        "document": attngen.compile(mask_mod=attngen.document(DOCS), backend=BACKEND),
        "document_batched_causal": attngen.compile(mask_mod=attngen.document(DOCS_B), causal=True, backend=BACKEND),
        "block_diagonal": attngen.compile(mask_mod=attngen.block_diagonal(200), backend=BACKEND),
        "dilated": attngen.compile(mask_mod=attngen.dilated(512, 3), backend=BACKEND),
        "prefix_or_window_not_chunk": attngen.compile(mask_mod=(attngen.prefix_lm(64) | attngen.sliding_window(128)) & ~attngen.chunked(500), backend=BACKEND),
        "bias_table": attngen.compile(score_mod=_bias_mod, causal=True, backend=BACKEND),
        "masked_rows": attngen.compile(mask_mod=_rowsink, backend=BACKEND),
        "key_padding_document": attngen.compile(mask_mod=attngen.document(DOCS) & PAD, causal=True, backend=BACKEND),
        "two_documents": attngen.compile(mask_mod=attngen.document(DOCS) & attngen.document(DOCS_2), backend=BACKEND),
        # a relative score mod with a factor of q - kv (the sm90 kernel's score_rel path), in a window
        "rel_div": attngen.compile(score_mod=attngen.ScoreMod(lambda s, b, h, q, k: s / (1 + 1e-3 * (q - k) ** 2), "rel_div"),
                                   window=256, backend=BACKEND),
        # score_mod(s) = a[h] s (the kernel's per-head factor path), masked and not
        "head_factor": attngen.compile(score_mod=attngen.ScoreMod(_head_factor, "head_factor"), backend=BACKEND),
        "head_factor_causal": attngen.compile(score_mod=attngen.ScoreMod(_head_factor, "head_factor"), causal=True,
                                              backend=BACKEND),
    }


VARIANT_NAMES = ["full", "causal", "sliding_window", "local", "softcap", "softcap_causal", "alibi_causal", "alibi_tensor",
                 "prefix_lm", "chunked", "document", "document_batched_causal", "block_diagonal", "dilated",
                 "prefix_or_window_not_chunk", "bias_table", "masked_rows", "key_padding_document", "two_documents",
                 "rel_div", "head_factor", "head_factor_causal"]
# (variant, dtype, head dim) signatures exercised below; built in parallel up front
MAIN = [(n, torch.bfloat16, 128) for n in VARIANT_NAMES]
DTYPE_DIM = [(n, dt, d) for n in ("full", "causal", "softcap_causal", "document")
             for dt, d in ((torch.float16, 128), (torch.bfloat16, 64), (torch.bfloat16, 256), (torch.float16, 64), (torch.float16, 256))]


@pytest.fixture(scope="module", autouse=True)
def prebuilt(requires_gpu):
    """Build every signature once, in parallel (each build runs nvcc in its own process)."""
    VARIANTS = data().VARIANTS

    todo = sorted(set(MAIN + DTYPE_DIM), key=lambda x: (x[0], str(x[1]), x[2]))
    with cf.ThreadPoolExecutor(max_workers=int(os.environ.get("ATTNGEN_TEST_BUILD_JOBS", "8"))) as ex:
        kernel = BACKEND if BACKEND in ("sm80", "sm90") else "auto"
        futs = {ex.submit(lambda a, dt, d: a.spec(dt, d, kernel=kernel).build_cached(), VARIANTS[n], dt, d): (n, dt, d)
                for n, dt, d in todo}
        for f in cf.as_completed(futs):
            f.result()


def _run_case(name, dtype=torch.bfloat16, D=128, B=2, Hq=8, Hkv=8, Lq=777, Lk=777, q_offset=0, layout="bhld",
              scale=None):
    attn = data().VARIANTS[name]
    g = torch.Generator(device=DEV).manual_seed(hash((name, str(dtype), D, Lq, Lk, Hkv, q_offset)) % (2 ** 31))
    if layout == "blhd":  # (B, L, H, D) storage viewed as (B, H, L, D): non-contiguous strides
        q = torch.randn(B, Lq, Hq, D, device=DEV, dtype=dtype, generator=g).transpose(1, 2)
        k = torch.randn(B, Lk, Hkv, D, device=DEV, dtype=dtype, generator=g).transpose(1, 2)
        v = torch.randn(B, Lk, Hkv, D, device=DEV, dtype=dtype, generator=g).transpose(1, 2)
    else:
        q, k, v = (torch.randn(B, H, L, D, device=DEV, dtype=dtype, generator=g)
                   for H, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    given = scale
    scale = D ** -0.5 if scale is None else scale
    out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset, scale=given)
    torch.cuda.synchronize()
    err, eager_err = assert_matches_float64(f"{name} {dtype} D={D}", out, lse, q, k, v, attn.variant, scale, q_offset)
    return err, eager_err


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_every_variant_bf16_hd128(name):
    _run_case(name)


@pytest.mark.parametrize("name,dtype,D", DTYPE_DIM, ids=[f"{n}-{str(dt)[6:]}-d{d}" for n, dt, d in DTYPE_DIM])
def test_dtypes_and_head_dims(name, dtype, D):
    _run_case(name, dtype=dtype, D=D, Lq=515, Lk=515)


@pytest.mark.parametrize("Hq,Hkv", [(8, 2), (8, 1)])
@pytest.mark.parametrize("name", ["causal", "softcap", "document", "alibi_causal"])
def test_gqa_mqa(name, Hq, Hkv):
    _run_case(name, Hq=Hq, Hkv=Hkv)


@pytest.mark.parametrize("Lq,Lk,q_offset", [(1, 1, 0), (1, 2000, 1999), (77, 1000, 923), (1000, 77, 0), (129, 1031, 0),
                                             (300, 2000, 1700), (2000, 300, 0),
                                             # past 4096 kv rows (where masked variants once left the persistent grid)
                                             (300, 4500, 4200)])
@pytest.mark.parametrize("name", ["full", "causal", "sliding_window", "prefix_lm", "document", "alibi_causal", "bias_table",
                                  "rel_div"])
def test_odd_lengths_and_offsets(name, Lq, Lk, q_offset):
    if name in ("document", "bias_table") and max(q_offset + Lq, Lk) > NPOS:
        pytest.skip("captured tables shorter than the positions")
    _run_case(name, Lq=Lq, Lk=Lk, q_offset=q_offset)


@pytest.mark.parametrize("Lq,Lk,q_offset", [(77, 1000, 923), (1000, 77, 0), (129, 1031, 0), (300, 4500, 4200)])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm"])
def test_head_dim_64_masks_on_their_ladder(name, Lq, Lk, q_offset):
    """Causal-like masks without a score_mod at head dim 64 build with cross_tile (jit.tiles.sm90_ladder: a work
    tile's epilogue under the next one's first Q K^T), the window and prefix-LM without. Odd lengths end work tiles
    at every row."""
    if BACKEND == "sm80" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernel's ladder")
    info = json.loads((data().VARIANTS[name].spec(torch.bfloat16, 64, kernel="sm90").build_cached().parent
                       / "meta.json").read_text())
    assert ("cross_tile=True" in info["tiles"]) == (name == "causal"), info["tiles"]
    _run_case(name, D=64, Lq=Lq, Lk=Lk, q_offset=q_offset)


@pytest.mark.parametrize("scale", [0.3, -0.08, 0.0])
@pytest.mark.parametrize("name", ["full", "causal", "softcap", "alibi_causal", "rel_div", "head_factor"])
def test_explicit_scale(name, scale):
    """Scales other than 1/sqrt(D), negative and zero included (the SM90 kernel folds the scale into
    the exponent for variants without score_mod or with a(q - kv) * score: rel_div; the API rewrites scale <= 0
    exactly)."""
    _run_case(name, scale=scale, Lq=300, Lk=500)


@pytest.mark.parametrize("name", ["causal", "bias_table"])
def test_non_contiguous_layout(name):
    _run_case(name, layout="blhd")


def test_captured_tensor_update_is_seen():
    """Captured tensors are runtime inputs: changing their values in place changes the result."""
    docs = data().DOCS.clone()
    attn = attngen.compile(mask_mod=attngen.document(docs), backend=BACKEND)
    q, k, v = (torch.randn(1, 2, 600, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    a = attn(q, k, v).clone()
    docs.copy_(torch.randint(0, 3, (docs.numel(),), device=DEV).sort().values)
    b = attn(q, k, v)
    ref, _ = reference64.attention(q, k, v, attn.variant)
    assert (b.double() - ref).abs().max() < 2e-2
    assert not torch.equal(a, b)


def test_ids_outside_the_summary_bound_are_refused():
    """Document ids outside (-2^30, 2^30): compile refuses them with the fix (the kernels' per-block bounds are int32
    and the classifier subtracts them; a wrapped bound made tiles look full across documents); ids within it, and the
    renumbered ones, match float64."""
    base = torch.arange(600, device=DEV) // 150
    q, k, v = (torch.randn(1, 2, 600, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(attngen.InputError, match=r"outside \(-2\^30, 2\^30\) .*torch\.unique"):
        attngen.compile(mask_mod=attngen.document(base + 2 ** 31 - 2), backend=BACKEND)
    fixed = torch.unique(base + 2 ** 31 - 2, sorted=True, return_inverse=True)[1].to(torch.int32)
    for ids in (base + 2 ** 30 - 5, fixed):
        attn = attngen.compile(mask_mod=attngen.document(ids), backend=BACKEND)
        ref, _ = reference64.attention(q, k, v, attn.variant)
        assert (attn(q, k, v).double() - ref).abs().max() < 2e-2


def test_bad_inputs_raise_clear_errors():
    attn = data().VARIANTS["causal"]
    q = torch.randn(1, 2, 64, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(attngen.InputError, match="float32"):
        attn(q.float(), q.float(), q.float())
    with pytest.raises(attngen.InputError, match="head dim"):
        x = torch.randn(1, 2, 64, 96, device=DEV, dtype=torch.bfloat16)
        attn(x, x, x)
    with pytest.raises(attngen.InputError):
        attn(q, q[:, :1].expand(1, 3, 64, 128), q[:, :1].expand(1, 3, 64, 128))
    with pytest.raises(attngen.InputError, match="contiguous"):
        x = torch.randn(1, 2, 128, 64, device=DEV, dtype=torch.bfloat16).transpose(-1, -2)
        attn(x, x, x)


def test_hot_path_matches_first_call_and_still_checks():
    """After the first call, a variant without captured tensors launches straight through
    launch.forward (CompiledAttention._ready): same result, same input checks."""
    attn = attngen.compile(causal=True, backend=BACKEND)
    q, k, v = (torch.randn(1, 2, 300, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    first = attn(q, k, v).clone()
    assert (torch.bfloat16, 128, q.get_device()) in attn._ready
    again = attn(q, k, v)
    assert torch.equal(first, again)
    ref, _ = reference64.attention(q, k, v, attn.variant)
    assert (again.double() - ref).abs().max() < 2e-2
    with pytest.raises(attngen.InputError, match="batch sizes differ"):
        attn(q, torch.cat([k, k]), torch.cat([v, v]))
    with pytest.raises(attngen.InputError, match="q_offset"):
        attn(q, k, v, q_offset=2 ** 31 - 100)
    doc = attngen.compile(mask_mod=attngen.document(data().DOCS), backend=BACKEND)
    doc(q, k, v)
    assert not doc._ready  # captured tensors: the full path checks their device and block summaries each call


def test_captured_tensor_strides():
    """A captured tensor traced with unit stride is indexed with a literal stride 1 (codegen): one with another
    stride gets the general code and the same results, and one whose layout changes after compile is refused."""
    DOCS = data().DOCS
    q, k, v = (torch.randn(1, 2, 700, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    base = torch.zeros(2 * DOCS.numel(), dtype=DOCS.dtype, device=DEV)
    base[::2] = DOCS
    strided = attngen.compile(mask_mod=attngen.document(base[::2]), backend=BACKEND)
    assert strided.traced.captured[0].unit_stride_dims == ()
    ref, _ = reference64.attention(q, k, v, strided.variant)
    assert (strided(q, k, v).double() - ref).abs().max() < 2e-2

    docs = DOCS.clone()
    attn = attngen.compile(mask_mod=attngen.document(docs), backend=BACKEND)
    assert attn.traced.captured[0].unit_stride_dims == (0,)
    # two builds, which the spill ladder may give different K/V tiles (another summation order): equal up to
    # rounding, and each within the float64 bound
    unit = attn(q, k, v)
    assert (unit.double() - ref).abs().max() < 2e-2
    torch.testing.assert_close(unit, strided(q, k, v), atol=2e-2, rtol=0)
    docs.set_(base.untyped_storage(), 0, (DOCS.numel(),), (2,))  # same values, stride 2
    with pytest.raises(attngen.InputError, match="stride 1"):
        attn(q, k, v)


def test_persistent_grid_counters():
    """Plain attention runs on the persistent grid, whose CTAs take tiles from a per-stream counter that each
    launch leaves at zero (sm90_tile_counter.cuh). More tiles than SMs; back-to-back launches, two streams at
    once and a CUDA graph replayed between eager calls all give the eager result (the kernel is deterministic)."""
    from pathlib import Path

    from attngen.jit import render

    attn = attngen.compile(backend=BACKEND)
    B, H, L = 2, 16, 1100  # 9 q-blocks x 32 heads = 288 tiles
    qs = [tuple(torch.randn(B, H, L, 128, device=DEV, dtype=torch.bfloat16) for _ in range(3)) for _ in range(2)]
    refs = [attn(*x).clone() for x in qs]
    sm90_builds = 0
    for lib in attn._libraries.values():  # an sm90 build must be the persistent one (its source header says so)
        head = (Path(lib.path).parent / render.KERNEL_SOURCE).read_text()[:2000]
        if "fwd_sm90.cuh" in head:
            assert "persistent True" in head
            sm90_builds += 1
    assert sm90_builds == (1 if BACKEND != "sm80" and torch.cuda.get_device_capability() == (9, 0) else 0)
    ref64, _ = reference64.attention(*qs[0], attn.variant)
    assert (refs[0].double() - ref64).abs().max() < 2e-2
    for _ in range(3):
        assert torch.equal(attn(*qs[0]), refs[0])

    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [None, None]
    for _ in range(3):
        for n, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs[n] = attn(*qs[n])
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        for n in range(2):
            assert torch.equal(outs[n], refs[n])

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attn(*qs[0])
    for _ in range(3):
        captured.zero_()
        graph.replay()
        eager = attn(*qs[1])
        torch.cuda.synchronize()
        assert torch.equal(captured, refs[0])
        assert torch.equal(eager, refs[1])


def test_compile_runs_the_block_summaries_once(monkeypatch):
    """A variant with block summaries on a CUDA tensor runs each summary at compile over several blocks, whole and
    with a partial last block, so that torch's lazily loaded kernels load there, not on the first call (the
    prebuilt wheel's first-call budget)."""
    import attngen.summaries as summaries

    calls = []
    blocks_of = summaries._blocks_of
    monkeypatch.setattr(summaries, "_blocks_of", lambda *a: calls.append(a[1:]) or blocks_of(*a))
    ids = torch.zeros(300, dtype=torch.int32, device="cuda")
    attn = attngen.compile(mask_mod=attngen.document(ids))
    assert attn.facts.summaries and calls
    assert {c[1] for c in calls} == {300, 299} and all(c[2] == 37 for c in calls)  # (length, block) of each run
