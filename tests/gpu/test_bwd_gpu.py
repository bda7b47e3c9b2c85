"""The backward kernels (bwd_sm80.cuh everywhere, bwd_sm90.cuh on sm_90a at head dims 64 / 128; launch.backward)
against float64 autograd of the golden
(tests/reference64.py), judged as tests/gpu/test_gpu_api.py judges the forward: each of dq, dk, dv within ~2x
the error of a same-dtype eager implementation's autograd (plus a small slack). The caching allocator is
filled with NaN before every call, so outputs the kernel fails to write show up; fully masked rows must get
exactly zero gradients.
"""
import concurrent.futures as cf
import functools
import math
import zlib

import pytest
import torch

import attngen
import reference64
from attngen.jit.tiles import SM90_BWD_TILES

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
NPOS = 512


def _late(b, h, q, k):
    return q >= 40  # queries 0..39 see nothing: fully masked rows


def make_variant(name, **options):
    """A fresh compiled variant of the cases (its own libraries), attngen.compile's options added."""
    if name == "document_masked_rows":
        docs = torch.randint(0, 4, (NPOS,), generator=torch.Generator().manual_seed(7)).sort().values.to(DEV)
        return attngen.compile(mask_mod=attngen.document(docs) & attngen.MaskMod(_late, "late"), **options)
    return attngen.compile(**{
        "full": {}, "causal": dict(causal=True), "sliding_window": dict(window=64),
        # score_mods: dS carries d score_mod / d score (variant.inc's score_mod_grad)
        "softcap_causal": dict(softcap=20.0, causal=True), "alibi": dict(score_mod=attngen.alibi(4)),
    }[name], **options)


@functools.lru_cache(maxsize=None)
def variants():
    return {n: make_variant(n, backend="sm80")
            for n in ("full", "causal", "sliding_window", "document_masked_rows", "softcap_causal", "alibi")}


# (variant, dtype, head dim, B, Hq, Hkv, Lq, Lk, q_offset)
CASES = [(n, torch.bfloat16, hd, 2, 4, 2, 200, 200, 0) for n in ("full", "causal", "sliding_window",
                                                                   "document_masked_rows") for hd in (64, 128, 256)]
CASES += [
    ("causal", torch.float16, 128, 1, 4, 4, 131, 131, 0),
    ("document_masked_rows", torch.float16, 64, 2, 2, 1, 190, 190, 0),
    ("sliding_window", torch.float16, 256, 1, 2, 2, 97, 97, 0),
    ("causal", torch.bfloat16, 64, 1, 4, 1, 150, 150, 0),            # MQA
    ("causal", torch.bfloat16, 128, 2, 4, 2, 77, 300, 150),           # q_len != kv_len, q_offset
    ("sliding_window", torch.bfloat16, 64, 1, 2, 1, 130, 61, 5),
    ("document_masked_rows", torch.bfloat16, 128, 1, 2, 2, 100, 333, 60),
    ("full", torch.bfloat16, 256, 1, 1, 1, 1, 33, 0),
    # one q-block, partial (the sm90 postprocess stores only its first Lq rows)
    ("full", torch.bfloat16, 64, 1, 2, 1, 33, 80, 0),
    ("causal", torch.float16, 128, 1, 2, 2, 33, 33, 0),
    ("softcap_causal", torch.bfloat16, 128, 2, 4, 2, 200, 200, 0),
    ("softcap_causal", torch.float16, 256, 1, 2, 1, 90, 150, 30),
    ("alibi", torch.float16, 64, 1, 4, 2, 120, 170, 0),
    # many q-blocks per kv block (the sm90 kernel's Q / dO ring wraps), across the query heads of a kv head
    ("causal", torch.bfloat16, 128, 1, 8, 2, 700, 900, 200),
    ("softcap_causal", torch.bfloat16, 64, 2, 4, 1, 517, 517, 0),
    ("alibi", torch.bfloat16, 128, 1, 2, 2, 1024, 1024, 0),
    ("document_masked_rows", torch.bfloat16, 64, 1, 4, 4, 512, 512, 0),
    # more kv blocks than SMs (288 and 192 work tiles): the sm90 kernel's persistent CTAs walk several each
    ("causal", torch.bfloat16, 128, 2, 8, 4, 4608, 4608, 0),
    ("alibi", torch.bfloat16, 64, 3, 4, 2, 4096, 4096, 0),
]
FAMILIES = ("sm80_bwd", "sm90_bwd")
# (case, family): the sm90 backward has kernels at head dims 64 and 128 only (256 runs the portable one)
RUNS = [(c, f) for c in CASES for f in FAMILIES if f == "sm80_bwd" or c[2] in SM90_BWD_TILES]


def _has_family(family, hd):
    """Whether this GPU runs the family at this head dim (sm90_bwd: sm_90a only)."""
    return family == "sm80_bwd" or (attngen.jit.toolchain.current_arch() == "sm_90a" and hd in SM90_BWD_TILES)


@functools.lru_cache(maxsize=None)
def prebuilt():
    """Build every library the cases need at once (the libraries' build lock would serialise them)."""
    specs = set()
    for n, dt, hd, *_ in CASES:
        specs.add((n, dt, hd, "sm80"))
        specs.update((n, dt, hd, f) for f in FAMILIES if _has_family(f, hd))
    V = variants()
    arch = attngen.jit.toolchain.current_arch()
    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda s: V[s[0]].spec(s[1], s[2], arch, s[3]).build_cached(), sorted(specs, key=str)))
    return True


def eager(q, k, v, variant, scale, q_offset):
    """Same-dtype eager attention with a guarded softmax (finite gradients for fully masked rows)."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ kk.transpose(-1, -2)) * scale
    b, h, qi, kv = reference64.index_grid(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q_offset, q.device)
    if variant.score_mod is not None:
        s = variant.score_mod(s, b, h, qi, kv).to(q.dtype)
    if variant.mask_mod is not None:
        s = s.masked_fill(~torch.as_tensor(variant.mask_mod(b, h, qi, kv)).expand_as(s), float("-inf"))
    s = s.float()
    m = s.detach().amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    p = (p / p.sum(-1, keepdim=True).clamp_min(1e-30)).to(q.dtype)
    return p @ vv


def poison_allocator(nbytes):
    x = torch.full((nbytes // 4,), float("nan"), device=DEV)
    del x


@pytest.mark.parametrize("case,family", RUNS, ids=lambda x: x if isinstance(x, str) else
                         f"{x[0]}-{str(x[1])[6:]}-hd{x[2]}-{x[3]}x{x[4]}x{x[5]}-{x[6]}x{x[7]}+{x[8]}")
def test_backward_matches_float64(case, family):
    name, dt, hd, B, Hq, Hkv, Lq, Lk, q_offset = case
    if not _has_family(family, hd):
        pytest.skip(f"{family} needs an sm_90a GPU (H100/H200)")
    prebuilt()
    attn = variants()[name]
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(repr(case).encode()) & 0xFFFF)  # the same in every process
    q, k, v, do = (torch.randn(*s, generator=gen, dtype=torch.float64)
                   for s in ((B, Hq, Lq, hd), (B, Hkv, Lk, hd), (B, Hkv, Lk, hd), (B, Hq, Lq, hd)))
    qd, kd, vd, dod = (t.to(DEV, dt) for t in (q, k, v, do))
    scale = 1.0 / math.sqrt(hd)

    out, lse = attn(qd, kd, vd, scale=scale, q_offset=q_offset, return_lse=True)
    dev = qd.get_device()
    lib = attn.backward_library(dt, hd, dev, family)
    captured = [c.tensor for c in attn.facts.captured]
    tensors = {c.name: c.tensor for c in attn.facts.captured}
    summaries = tuple(s.compute(tensors, lib.block_q, lib.block_k, Lq, Lk, q_offset) for s in attn.facts.summaries)
    poison_allocator(64 << 20)
    dq, dk, dv = attngen.launch.backward(lib, qd, kd, vd, out, dod, lse, scale=scale, q_offset=q_offset,
                                         captured=captured, summaries=summaries, params=attn._param_fields())
    torch.cuda.synchronize()

    assert_grads_match_float64({"": (dq, dk, dv)}, q, k, v, do, dt, attn, scale, q_offset)
    if name == "document_masked_rows":
        rows = torch.arange(Lq, device=DEV) + q_offset < 40
        assert (dq[:, :, rows] == 0).all(), "fully masked rows must get zero dq"


def assert_grads_match_float64(runs, q, k, v, do, dt, attn, scale, q_offset):
    """Each run's (dq, dk, dv) (runs: by label) within 2x a same-dtype eager implementation's error against float64
    autograd of the golden, on the float64 inputs q, k, v, do as the kernel saw them (rounded to dt)."""
    ins = [t.to(dt).to(DEV, torch.float64).requires_grad_() for t in (q, k, v)]
    ref_out, _ = reference64.attention(*ins, attn.variant, scale=scale, q_offset=q_offset)
    dod = do.to(DEV, dt)
    refs = torch.autograd.grad(ref_out, ins, dod.double())
    ins_e = [t.detach().to(dt).requires_grad_() for t in ins]
    eagers = torch.autograd.grad(eager(*ins_e, attn.variant, scale, q_offset), ins_e, dod)
    for label, grads in runs.items():
        for what, got, ref, e in zip(("dq", "dk", "dv"), grads, refs, eagers):
            what = f"{label} {what}".strip()
            assert got.shape == ref.shape and got.dtype == dt
            assert torch.isfinite(got).all(), f"{what}: non-finite values"
            err = (got.double() - ref).abs().max().item()
            eager_err = (e.double() - ref).abs().max().item()
            print(f"{what}: err {err:.3e} eager {eager_err:.3e} |ref| {ref.abs().max().item():.3e}")
            assert err <= 2.0 * eager_err + 1e-3, f"{what}: kernel err {err:.3e} > 2 x eager err {eager_err:.3e}"


def _sm90_bwd_library(monkeypatch, hd, attn, dtype=torch.bfloat16, **setting):
    """attn's sm90 backward library built with fields of jit.tiles.Sm90BwdTiles set (its own cache entry): the
    spec's ladder (jit/spec.py reads it) patched to the shipped one (jit/tiles.py's) with the setting replaced."""
    import attngen.jit.spec as spec
    from dataclasses import replace

    from attngen.jit.tiles import sm90_bwd_ladder

    monkeypatch.setattr(spec, "sm90_bwd_ladder",
                        lambda d, **kw: tuple(replace(t, **setting) for t in sm90_bwd_ladder(d, **kw)))
    return attn.backward_library(dtype, hd, torch.cuda.current_device(), "sm90_bwd")


def _grads_per_setting(monkeypatch, hd, shape, settings, make_variant, grad_captured=False, q_offset=0,
                       deterministic=False):
    """(dq, dk, dv) of the sm90 backward at each setting (Sm90BwdTiles fields by name), each from a fresh variant
    and its own library, on the same random inputs (B, Hq, Hkv, Lq, Lk), with poisoned memory before each call, the
    variant's captured tensors and block summaries passed as the frontend passes them; with `grad_captured`,
    (dq, dk, dv, dcaptured), every captured tensor's gradient asked for."""
    B, Hq, Hkv, Lq, Lk = shape
    gen = torch.Generator(device="cpu").manual_seed(hd)
    q, do = (torch.randn(B, Hq, Lq, hd, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Lk, hd, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    grads, paths = {}, set()
    for name, setting in settings.items():
        attn = make_variant()
        lib = _sm90_bwd_library(monkeypatch, hd, attn, **setting)
        paths.add(lib.path)
        out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset)
        poison_allocator(256 << 20)
        tensors = [c.tensor for c in attn.facts.captured]
        summaries = [s.compute(dict(zip((c.name for c in attn.facts.captured), tensors)), lib.block_q, lib.block_k,
                               Lq, Lk, q_offset) for s in attn.facts.summaries]
        extra = dict(captured_grads=[True] * len(tensors)) if grad_captured else {}
        grads[name] = attngen.launch.backward(lib, q, k, v, out, do, lse, q_offset=q_offset, captured=tensors,
                                              summaries=summaries, params=attn._param_fields(),
                                              deterministic=deterministic, **extra)
        torch.cuda.synchronize()
    assert len(paths) == len(settings), "two settings loaded one library"
    return grads


# (B, Hq, Hkv, Lq, Lk): 512 work tiles, about four per SM; then most kv blocks with an empty walk (past the last
# query under causal) between a few full ones in every head, the CTAs' cheapest tiles one after another
PERSISTENT_SHAPES = [(4, 8, 2, 8192, 8192), (4, 4, 4, 1024, 8192)]


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_persistent_walks_match_a_cta_per_tile(hd, shape, monkeypatch):
    """The sm90 backward's persistent CTAs (kv blocks from a counter, several per CTA) against a CTA per kv block:
    dK and dV bit for bit (each element is written once, from the same walk), dQ within its fp32 additions' order."""
    grads = _grads_per_setting(monkeypatch, hd, shape, {True: dict(persistent=True), False: dict(persistent=False)},
                               lambda: attngen.compile(causal=True))
    (dq, dk, dv), (dq1, dk1, dv1) = grads[True], grads[False]
    assert torch.equal(dk, dk1) and torch.equal(dv, dv1)
    assert torch.isfinite(dq).all()
    assert (dq.float() - dq1.float()).abs().max().item() <= 2 ** -7 * dq1.float().abs().max().item()
    Lq, Lk = shape[3:]
    if Lq < Lk:  # kv blocks past the last query: nothing kept, zero gradients
        assert (dk[:, :, Lq:] == 0).all() and (dv[:, :, Lq:] == 0).all()


def _causal_from_200(b, h, q, k):
    return (q >= 200) & (k <= q)  # q-blocks 0..2 (64 rows each) keep nothing: no kv block adds to their dQ


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
def test_dq_acc_starts_match_zeroing_in_the_preprocess(hd, monkeypatch):
    """dQ_acc not zeroed, the first addition into each chunk a store (Sm90BwdTiles.dq_init 1), against the
    preprocess zeroing it (0): dK and dV bit for bit, dQ within its fp32 additions' order, and the q-blocks no kv
    block visits zero (their dQ_acc holds poisoned memory, which the postprocess must not read). GQA, more work
    tiles than SMs, kv longer than q."""
    grads = _grads_per_setting(monkeypatch, hd, (2, 8, 2, 2000, 4200), {0: dict(dq_init=0), 1: dict(dq_init=1)},
                               lambda: attngen.compile(mask_mod=attngen.MaskMod(_causal_from_200, "causal_from_200")))
    (dq0, dk0, dv0), (dq, dk, dv) = grads[0], grads[1]
    assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    assert torch.isfinite(dq).all()
    assert (dq[:, :, :200] == 0).all()
    assert (dq.float() - dq0.float()).abs().max().item() <= 2 ** -7 * dq0.float().abs().max().item()


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("variant", ["causal", "window", "softcap_causal"])
def test_staged_kv_grads_match_register_stores(hd, variant, monkeypatch):
    """dK and dV staged in shared memory and stored with TMA (Sm90BwdTiles.dkv_staged) against every thread storing
    its rows from registers: the same values written once, so dK and dV bit for bit, dQ within its fp32 additions'
    order. More work tiles than SMs (a CTA's next tile waits for the last one's stores to have read its dS^T rows and
    staged dQ), GQA, a last kv block past Lk (rows the maps drop), kv blocks past the last query (zero gradients), on
    the split rung (causal, window) and the one pass (softcap)."""
    make = {"causal": lambda: attngen.compile(causal=True),
            "window": lambda: attngen.compile(window=700),
            "softcap_causal": lambda: attngen.compile(softcap=30.0, causal=True)}[variant]
    grads = _grads_per_setting(monkeypatch, hd, (2, 8, 4, 1500, 4450),
                               {False: dict(dkv_staged=False), True: dict(dkv_staged=True)}, make, q_offset=2000)
    (dq0, dk0, dv0), (dq, dk, dv) = grads[False], grads[True]
    assert dk0.abs().max().item() > 0 and torch.isfinite(dq).all()
    assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    assert (dq.float() - dq0.float()).abs().max().item() <= 2 ** -7 * dq0.float().abs().max().item()
    assert (dk[:, :, 3500:] == 0).all() and (dv[:, :, 3500:] == 0).all()  # past the last query (q_idx 3499)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("variant", ["causal", "window", "document", "softcap_causal"])
def test_wait_hint_matches_no_hint(hd, variant, monkeypatch):
    """The loader's, producer's and dQ writers' waits with a suspend-time hint and the writers' end told through
    dq_full (Sm90BwdTiles.wait_ns) against no hint: the same arithmetic, so dK and dV bit for bit, dQ within
    its fp32 additions' order, and in deterministic mode (the writers wait for their turns) dQ bit for bit too. More
    work tiles than SMs (persistent CTAs, each writer ending once after many tiles), GQA, kv blocks past the last
    query, a captured-tensor mask, the split, staged and one-pass rungs."""
    _assert_setting_keeps_grads(monkeypatch, hd, variant, dict(wait_ns=0), dict(wait_ns=100000))


def _assert_setting_keeps_grads(monkeypatch, hd, variant, before, after):
    """The sm90 backward at settings `before` and `after` (Sm90BwdTiles fields) on one variant, more work tiles than
    SMs, GQA, an odd count of kv blocks, kv blocks past the last query: dK and dV bit for bit, dQ within its fp32
    additions' order, and in deterministic mode dQ bit for bit too."""
    make = {"full": lambda: attngen.compile(), "causal": lambda: attngen.compile(causal=True),
            "window": lambda: attngen.compile(window=700),
            "document": lambda: attngen.compile(mask_mod=_document_ids_mask(4450)),
            "softcap_causal": lambda: attngen.compile(softcap=30.0, causal=True)}[variant]
    for deterministic in (False, True):
        grads = _grads_per_setting(monkeypatch, hd, (2, 8, 4, 1500, 4450), {0: before, 1: after}, make,
                                   q_offset=0 if variant == "document" else 2000, deterministic=deterministic)
        (dq0, dk0, dv0), (dq, dk, dv) = grads[0], grads[1]
        assert dk0.abs().max().item() > 0 and torch.isfinite(dq).all()
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
        if deterministic:
            assert torch.equal(dq, dq0)
        else:
            assert (dq.float() - dq0.float()).abs().max().item() <= 2 ** -7 * dq0.float().abs().max().item()


def _document_ids_mask(L):
    """Sorted document ids over L positions, about one document per 250."""
    ids = torch.cumsum(torch.rand(L, generator=torch.Generator().manual_seed(5)) < 0.004, 0).to(DEV)
    return attngen.MaskMod(lambda b, h, q, kv: ids[q] == ids[kv], "doc_ids_split")


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("mask", ["causal", "window", "document"])
def test_split_probabilities_match_one_pass(hd, mask, monkeypatch):
    """P^T taken while dP^T's product runs and dS^T under dV's (Sm90BwdTiles.split_probs, the first rung of a
    variant without score_mod) against one pass over both once the products are done: the same arithmetic per
    element, so dK and dV bit for bit and dQ to its fp32 additions' order. Odd lengths, GQA, q_offset, kv longer than
    q, partial and FULL tiles, a captured-tensor mask (through autograd: the call's captured tensors and block
    summaries with it)."""
    B, Hq, Hkv, Lq, Lk = 2, 4, 2, 1100, 2450
    q_offset = 0 if mask == "document" else 130
    make = {"causal": lambda: attngen.compile(causal=True),
            "window": lambda: attngen.compile(window=700),
            "document": lambda: attngen.compile(mask_mod=_document_ids_mask(Lk))}[mask]
    gen = torch.Generator(device="cpu").manual_seed(hd)
    q, do = (torch.randn(B, Hq, Lq, hd, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, Hkv, Lk, hd, generator=gen).to(DEV, torch.bfloat16).requires_grad_() for _ in range(2))
    q.requires_grad_()
    # s_ahead off in both (the staged rung at head dim 128 has it; test_scores_ahead_match_each_step_its_own tests it)
    settings = {"one pass": dict(split_probs=False, s_ahead=0), "split": dict(split_probs=True, s_ahead=0)}
    grads, paths = {}, set()
    for name, setting in settings.items():
        attn = make()
        paths.add(_sm90_bwd_library(monkeypatch, hd, attn, **setting).path)
        out = attn(q, k, v, q_offset=q_offset)
        poison_allocator(256 << 20)
        grads[name] = torch.autograd.grad(out, (q, k, v), do)
        torch.cuda.synchronize()
    assert len(paths) == len(settings), "two settings loaded one library"
    dq1, dk1, dv1 = grads["one pass"]
    dq, dk, dv = grads["split"]
    assert torch.isfinite(dq).all() and dk.abs().max().item() > 0
    assert torch.equal(dk, dk1) and torch.equal(dv, dv1)
    assert (dq.float() - dq1.float()).abs().max().item() <= 2 ** -7 * dq1.float().abs().max().item()


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("mask", ["full", "causal", "window", "document", "softcap_causal"])
def test_scores_ahead_match_each_step_its_own(hd, mask, monkeypatch):
    """Each step's S^T issued by the step before (Sm90BwdTiles.s_ahead 1: under dQ's staging, 2: under dQ's product;
    the walk's first by a prologue, a walk's last issue a discarded product on K's rows) against every step issuing
    its own, on every rung of the variant's ladder: the same arithmetic per element, so dK and dV bit for bit, dq to
    its fp32 additions' order, and in deterministic mode dq bit for bit too; the ahead runs also against float64. GQA
    (walks over two query heads), odd lengths, q_offset, kv longer than q (empty walks under causal), partial tiles,
    a captured-tensor mask, the one pass (softcap), the split and the split with dK and dV staged (window,
    document)."""
    B, Hq, Hkv, Lq, Lk = 2, 4, 2, 1100, 2450
    q_offset = 0 if mask == "document" else 130
    make = {"full": lambda: attngen.compile(), "causal": lambda: attngen.compile(causal=True),
            "window": lambda: attngen.compile(window=700),
            "document": lambda: attngen.compile(mask_mod=_document_ids_mask(Lk)),
            "softcap_causal": lambda: attngen.compile(softcap=20.0, causal=True)}[mask]
    settings = {"own": dict(s_ahead=0), "ahead 1": dict(s_ahead=1), "ahead 2": dict(s_ahead=2)}
    gen = torch.Generator(device="cpu").manual_seed(hd + 7)
    q, k, v, do = (torch.randn(*s, generator=gen, dtype=torch.float64)
                   for s in ((B, Hq, Lq, hd), (B, Hkv, Lk, hd), (B, Hkv, Lk, hd), (B, Hq, Lq, hd)))
    qd, kd, vd, dod = (t.to(DEV, torch.bfloat16) for t in (q, k, v, do))
    scale = 1.0 / math.sqrt(hd)
    runs, paths = {}, set()
    for name, setting in settings.items():
        attn = make()
        lib = _sm90_bwd_library(monkeypatch, hd, attn, **setting)
        paths.add(lib.path)
        out, lse = attn(qd, kd, vd, scale=scale, q_offset=q_offset, return_lse=True)
        tensors = {c.name: c.tensor for c in attn.facts.captured}
        summaries = tuple(s.compute(tensors, lib.block_q, lib.block_k, Lq, Lk, q_offset) for s in attn.facts.summaries)
        for deterministic in (False, True):
            poison_allocator(256 << 20)
            runs[name, deterministic] = attngen.launch.backward(
                lib, qd, kd, vd, out, dod, lse, scale=scale, q_offset=q_offset, captured=list(tensors.values()),
                summaries=summaries, params=attn._param_fields(), deterministic=deterministic)
            torch.cuda.synchronize()
    assert len(paths) == len(settings), "two settings loaded one library"
    dq1, dk1, dv1 = runs["own", False]
    for name in settings:
        dq, dk, dv = runs[name, False]
        assert torch.isfinite(dq).all() and dk.abs().max().item() > 0, name
        assert torch.equal(dk, dk1) and torch.equal(dv, dv1), name
        assert (dq.float() - dq1.float()).abs().max().item() <= 2 ** -7 * dq1.float().abs().max().item(), name
        assert all(torch.equal(a, b) for a, b in zip(runs[name, True], runs["own", True])), f"{name}, deterministic"
    assert_grads_match_float64({name: runs[name, False] for name in settings if name != "own"}, q, k, v, do,
                               torch.bfloat16, make(), scale, q_offset)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("mod", ["table", "division", "both"])
def test_relative_walk_matches_score_mod_per_element(hd, mod, monkeypatch):
    """A relative score mod walked once per diagonal of a thread's elements (Sm90BwdTiles.rel_walk: score_rel's
    table loads shared by the two elements of one d, the table's gradient summed in registers first), with each
    warp's terms staged once per diagonal in shared memory (rel_stage) and without, against score_mod per element:
    b from a table (the slots hold b alone), a = 1 / (1 + c d^2) (a alone), both from the table (the whole terms);
    under a sliding window, odd lengths, q_offset, GQA, more work tiles than SMs. Staged against unstaged: dk, dv
    bit for bit (the same terms, each element written once), dq and the table's gradient to their fp32 sums' order.
    Against score_mod per element, all agree to a bf16 rounding of the same products (the score's two spellings
    differ in the last fp32 bit)."""
    L = 2600
    table = (torch.randn(4, 2 * L, generator=torch.Generator().manual_seed(3)) * 0.5).to(DEV)
    fn = {"table": lambda s, b, h, q, kv: s + table[h, q - kv + L - 1],
          "division": lambda s, b, h, q, kv: s / (1 + 1e-3 * (q - kv) ** 2),
          "both": lambda s, b, h, q, kv: s * (1 + 0.5 * table[h, q - kv + L - 1]) + table[h, kv - q + L - 1]}[mod]
    captured = [] if mod == "division" else [table]
    settings = {"staged": dict(rel_walk=True, rel_stage=True), "walk": dict(rel_walk=True, rel_stage=False),
                "element": dict(rel_walk=False)}
    grads = _grads_per_setting(monkeypatch, hd, (2, 4, 2, 1100, 2450), settings,
                               lambda: attngen.compile(score_mod=attngen.ScoreMod(fn, f"rel_{mod}"), window=700),
                               grad_captured=bool(captured), q_offset=130)
    names = ("dq", "dk", "dv") + (("dtable",) if captured else ())
    flat = {k: tuple(g[:3]) + (tuple(g[3]) if captured else ()) for k, g in grads.items()}
    for what, g, g1, g0 in zip(names, flat["staged"], flat["walk"], flat["element"]):
        assert torch.isfinite(g).all(), what
        if what in ("dk", "dv"):
            assert torch.equal(g, g1), what
        top = g0.float().abs().max().item()
        assert top > 0, what
        for other in (g1, g0):
            assert (g.float() - other.float()).abs().max().item() <= 2 ** -7 * top, what


@pytest.mark.requires_sm90
def test_no_queries_give_zero_kv_gradients():
    """Lq = 0: nothing is kept, so dK and dV are zeros (launch.backward returns them without a launch: the kernel's
    statistics and dQ workspaces would be empty, and the C entry point refuses their null pointers); poisoned
    memory first, so the zeros are written, not found."""
    k, v = (torch.randn(2, 2, 300, 128, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    q = torch.empty(2, 4, 0, 128, device=DEV, dtype=torch.bfloat16)
    attn = attngen.compile(causal=True)
    lib = attn.backward_library(torch.bfloat16, 128, torch.cuda.current_device(), "sm90_bwd")
    poison_allocator(64 << 20)
    dq, dk, dv = attngen.launch.backward(lib, q, k, v, torch.empty_like(q), torch.empty_like(q),
                                         torch.empty(2, 4, 0, device=DEV), params=attn._param_fields())
    torch.cuda.synchronize()
    assert dq.shape == q.shape and (dk == 0).all() and (dv == 0).all()


# (variant, dtype, B, Hq, Hkv, Lq, Lk, q_offset) at head dim 128 with 80-row q-blocks: odd lengths (a last q-block
# of 32 rows at 8192 - 102 x 80), one partial q-block, GQA / MQA, q_len != kv_len with q_offset, fully masked rows,
# fp16, more work tiles than SMs
BQ80_CASES = [
    ("full", torch.bfloat16, 2, 4, 2, 200, 200, 0),
    ("full", torch.float16, 1, 4, 1, 333, 517, 0),
    ("full", torch.bfloat16, 1, 2, 2, 33, 90, 0),
    ("full", torch.bfloat16, 2, 8, 4, 2000, 4450, 0),
    ("causal", torch.bfloat16, 2, 4, 2, 77, 300, 150),
    ("sliding_window", torch.float16, 1, 2, 1, 700, 700, 0),
    ("document_masked_rows", torch.bfloat16, 1, 4, 4, 512, 512, 0),
]


@pytest.mark.requires_sm90
@pytest.mark.parametrize("packed", [False, True], ids=["fp32_p", "packed_p"])
@pytest.mark.parametrize("case", BQ80_CASES,
                         ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}x{c[6]}+{c[7]}")
def test_block_q_80_matches_float64(case, packed, monkeypatch):
    """80 q rows per step (Sm90BwdTiles.block_q: dQ^T = K^T dS^T, dS^T in 32-byte swizzle rows, a transposed dQ_acc
    chunk the postprocess reads back), dS^T from the fp32 P^T or from P^T as packed for dV's product
    (ds_from_packed), against float64 autograd, judged as test_backward_matches_float64; fully masked rows get zero
    dq."""
    assert _setting_matches_float64(monkeypatch, case, dict(block_q=80, split_probs=True, dkv_staged=False, s_ahead=0,
                                                            ds_from_packed=packed)) == 80


def _setting_matches_float64(monkeypatch, case, setting):
    """The sm90 backward at head dim 128 built with `setting` (Sm90BwdTiles fields) on case (variant, dtype, B, Hq,
    Hkv, Lq, Lk, q_offset), against float64 autograd as test_backward_matches_float64 judges it, a deterministic run
    too (two of them bit-identical); fully masked rows get zero dq. Returns the library's block_q."""
    name, dt, B, Hq, Hkv, Lq, Lk, q_offset = case
    hd = 128
    attn = make_variant(name)
    lib = _sm90_bwd_library(monkeypatch, hd, attn, dt, **setting)
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(repr(case).encode()) & 0xFFFF)
    q, k, v, do = (torch.randn(*s, generator=gen, dtype=torch.float64)
                   for s in ((B, Hq, Lq, hd), (B, Hkv, Lk, hd), (B, Hkv, Lk, hd), (B, Hq, Lq, hd)))
    qd, kd, vd, dod = (t.to(DEV, dt) for t in (q, k, v, do))
    scale = 1.0 / math.sqrt(hd)
    out, lse = attn(qd, kd, vd, scale=scale, q_offset=q_offset, return_lse=True)
    captured = [c.tensor for c in attn.facts.captured]
    tensors = {c.name: c.tensor for c in attn.facts.captured}
    summaries = tuple(s.compute(tensors, lib.block_q, lib.block_k, Lq, Lk, q_offset) for s in attn.facts.summaries)
    runs = []
    for deterministic in (False, True, True):
        poison_allocator(256 << 20)
        runs.append(attngen.launch.backward(lib, qd, kd, vd, out, dod, lse, scale=scale, q_offset=q_offset,
                                            captured=captured, summaries=summaries, params=attn._param_fields(),
                                            deterministic=deterministic))
        torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(runs[1], runs[2])), "deterministic mode: runs differ"
    assert_grads_match_float64({"": runs[0], "deterministic": runs[1]}, q, k, v, do, dt, attn, scale, q_offset)
    if name == "document_masked_rows":
        rows = torch.arange(Lq, device=DEV) + q_offset < 40
        assert (runs[0][0][:, :, rows] == 0).all(), "fully masked rows must get zero dq"
    return lib.block_q


# (variant, dtype, B, Hq, Hkv, Lq, Lk, q_offset)
DS_STORE_CASES = [
    ("full", torch.bfloat16, 2, 4, 2, 200, 200, 0),
    ("full", torch.bfloat16, 2, 8, 4, 2000, 4450, 0),
    ("full", torch.float16, 1, 4, 1, 333, 517, 0),  # ds_mul_packed: fp16 keeps the fp32 products
    ("causal", torch.bfloat16, 2, 4, 2, 77, 300, 150),
    ("sliding_window", torch.bfloat16, 1, 2, 1, 700, 700, 0),
    ("document_masked_rows", torch.bfloat16, 1, 4, 4, 512, 512, 0),
]
BOTH = dict(ds_stmatrix=True, ds_mul_packed=True)
# both at 64 and 80 q rows on every case; each alone on full attention at 80 rows and causal at 64; the stores on the
# one pass of score_mod variants (which the packed multiply leaves alone)
DS_STORE_RUNS = [(c, bq, BOTH) for c in DS_STORE_CASES for bq in (64, 80)] + [
    (c, bq, f) for f in (dict(ds_stmatrix=True), dict(ds_mul_packed=True))
    for c, bq in ((DS_STORE_CASES[0], 80), (DS_STORE_CASES[3], 64))] + [
    (("softcap_causal", torch.bfloat16, 2, 4, 2, 200, 200, 0), 64, BOTH),
    (("alibi", torch.float16, 1, 2, 2, 300, 257, 0), 64, BOTH)]


def _setting_run_id(x):
    """A (case, block_q, fields) parameter's id: the case, its q rows, its fields (`stats_early3+ds_stmatrix`)."""
    if isinstance(x, int):
        return str(x)
    if isinstance(x, dict):
        return "+".join(f"{k}{'' if v is True else v}" for k, v in x.items())
    return f"{x[0]}-{str(x[1])[6:]}-{x[2]}x{x[3]}x{x[4]}-{x[5]}x{x[6]}+{x[7]}"


@pytest.mark.requires_sm90
@pytest.mark.parametrize("case,block_q,fields", DS_STORE_RUNS, ids=_setting_run_id)
def test_ds_stores_and_packed_multiply_match_float64(case, block_q, fields, monkeypatch):
    """dS^T stored with stmatrix (Sm90BwdTiles.ds_stmatrix) and multiplied as bf16 pairs (ds_mul_packed) on the split
    rung at 64 q rows (causal's) and at 80 (full attention's first rung: dS^T in 32-byte swizzle rows, from the packed
    P^T, S^T a step ahead), and the stores on the one pass of score_mod variants, against float64 autograd as
    test_backward_matches_float64 judges it."""
    bq80 = block_q == 80
    rung = dict(block_q=block_q, split_probs=True, dkv_staged=False, s_ahead=2 if bq80 else 0, ds_from_packed=bq80)
    assert _setting_matches_float64(monkeypatch, case, {**rung, **fields}) == block_q


# the row statistics read early (Sm90BwdTiles.stats_early: 1 delta, 2 lse, 3 both) on the split rung at 64 and 80 q
# rows, alone and with dS^T's options; the one pass of a score_mod variant, which takes no statistics early
STATS_EARLY_RUNS = [(c, bq, dict(stats_early=3)) for c in DS_STORE_CASES for bq in (64, 80)] + [
    (DS_STORE_CASES[3], 64, dict(stats_early=2, **BOTH)), (DS_STORE_CASES[0], 80, dict(stats_early=1, **BOTH))] + [
    (c, bq, dict(stats_early=3, **BOTH)) for c, bq in ((DS_STORE_CASES[1], 80), (DS_STORE_CASES[3], 64),
                                                       (DS_STORE_CASES[5], 64))] + [
    (("softcap_causal", torch.bfloat16, 2, 4, 2, 200, 200, 0), 64, dict(stats_early=3))]


@pytest.mark.requires_sm90
@pytest.mark.parametrize("case,block_q,fields", STATS_EARLY_RUNS, ids=_setting_run_id)
def test_statistics_read_early_match_float64(case, block_q, fields, monkeypatch):
    """lse and delta read into registers ahead of the products (Sm90BwdTiles.stats_early) on the split rung at 64 q
    rows (causal's) and at 80 (full attention's first rung), with and without dS^T's stmatrix stores and packed
    multiply, against float64 autograd as test_backward_matches_float64 judges it."""
    bq80 = block_q == 80
    rung = dict(block_q=block_q, split_probs=True, dkv_staged=False, s_ahead=2 if bq80 else 0, ds_from_packed=bq80)
    assert _setting_matches_float64(monkeypatch, case, {**rung, **fields}) == block_q
