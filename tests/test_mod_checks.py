"""Checks on what users pass as mods and captured tensors:

* plain functions are accepted wherever a variant is (block_map, explain, reference.attention, compile),
  decided by signature: 4 positional parameters make a mask_mod, 5 a score_mod;
* a mod passed in the other role (a score_mod as mask_mod=...) raises ModSignatureError naming the fix,
  at compile time, and nothing valid is rejected (defaults, *args, partials, callable objects);
* a captured tensor too short for the sizes of a call raises InputError before anything runs;
* ATTNGEN_DEBUG=1 builds check every captured-tensor read (the generated code, the spec's cache key).
"""
import functools

import pytest
import torch

import attngen
from attngen.codegen import render_variant_inc
from attngen.errors import InputError, ModSignatureError
from attngen.ir import check_extents
from attngen.mods import as_variant, mod_role
from attngen.reference import attention


def _qkv(B=1, H=2, L=64, D=16, Lk=None):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=gen), torch.randn(B, H, Lk or L, D, generator=gen),
            torch.randn(B, H, Lk or L, D, generator=gen))


# ---------------------------------------------------------------- plain functions by signature

def causal_fn(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def test_plain_mask_function_in_block_map_and_explain():
    want = attngen.block_map(attngen.causal(), 512, 512, (128, 128))
    assert torch.equal(attngen.block_map(causal_fn, 512, 512, (128, 128)), want)
    assert "causal_fn" in attngen.explain(causal_fn, 512)


def test_plain_functions_on_the_reference_path():
    q, k, v = _qkv()
    torch.testing.assert_close(attention(q, k, v, causal_fn), attention(q, k, v, attngen.causal()))
    doubled = attention(q, k, v, lambda s, b, h, qi, kv: s * 2)
    torch.testing.assert_close(doubled, attention(q, k, v, scale=2 / 4))


@pytest.mark.parametrize("fn,role", [
    (causal_fn, "mask_mod"),
    (lambda s, b, h, q, kv: s, "score_mod"),
    (lambda b, h, q, kv, extra=0: q >= kv, "mask_mod"),            # its required parameters decide
    (functools.partial(lambda w, s, b, h, q, kv: s * w, 2.0), "score_mod"),
    (attngen.causal(), "mask_mod"),
    (attngen.softcap(30), "score_mod"),
    (lambda *args: args[0], None),                                # cannot tell
])
def test_role_by_signature(fn, role):
    assert mod_role(fn) == role


def test_ambiguous_plain_function_says_how_to_wrap_it():
    with pytest.raises(ModSignatureError, match="MaskMod"):
        as_variant(lambda *args: args[0])
    with pytest.raises(TypeError, match="Variant"):  # not callable at all: unchanged
        as_variant(42)


# ---------------------------------------------------------------- swapped mods

def score_fn(score, b, h, q_idx, kv_idx):
    return score


class CallableMask:
    def __call__(self, b, h, q_idx, kv_idx):
        return q_idx >= kv_idx


@pytest.mark.parametrize("make,words", [
    (lambda: attngen.compile(mask_mod=score_fn), ["'score_fn'", "mask_mod", "score_mod(score, b, h, q_idx, kv_idx)",
                                                   "pass it as score_mod="]),
    (lambda: attngen.compile(score_mod=causal_fn), ["'causal_fn'", "pass it as mask_mod="]),
    (lambda: attngen.compile(score_mod=CallableMask()), ["pass it as mask_mod="]),
    (lambda: attngen.Variant(mask_mod=attngen.softcap(30)), ["ScoreMod", "pass it as score_mod="]),
    (lambda: attngen.Variant(score_mod=attngen.causal()), ["MaskMod", "pass it as mask_mod="]),
    (lambda: attngen.MaskMod(score_fn), ["pass it as score_mod="]),
    (lambda: attngen.ScoreMod(functools.partial(score_fn, 1.0)), ["takes 4", "pass it as mask_mod="]),
    (lambda: attngen.compile(mask_mod=lambda b, h: True), ["takes 2", "mask_mod(b, h, q_idx, kv_idx)"]),
])
def test_swapped_mods_raise_naming_the_fix(make, words):
    with pytest.raises(ModSignatureError) as ei:
        make()
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert isinstance(ei.value, InputError) and isinstance(ei.value, TypeError)


@pytest.mark.parametrize("kw", [
    dict(mask_mod=lambda *idx: idx[2] >= idx[3]),
    dict(mask_mod=lambda b, h, q, kv, *rest: q >= kv),
    dict(mask_mod=lambda b, h, q, kv, unused=None: q >= kv),
    dict(score_mod=lambda s, *idx: s + idx[2]),
    dict(score_mod=functools.partial(lambda c, s, b, h, q, kv: s * c, 0.5)),
    dict(mask_mod=CallableMask()),
])
def test_valid_signatures_are_accepted(kw):
    attn = attngen.compile(**kw)
    assert attn.traced.has_mask or attn.traced.has_score_mod


# ---------------------------------------------------------------- captured tensors too short for the call

def test_short_document_ids_name_the_tensor_and_the_fix():
    doc = torch.zeros(100, dtype=torch.int32)
    attn = attngen.compile(mask_mod=attngen.document(doc))
    q, k, v = _qkv(L=64)
    attn(q, k, v)
    with pytest.raises(InputError) as ei:
        attn(q, k, v, q_offset=50)
    msg = str(ei.value)
    for w in ["t0", "shape (100,)", "q_idx", "needs size >= 114", "q_offset"]:
        assert w in msg, f"{w!r} not in {msg!r}"
    q, k, v = _qkv(L=128)
    with pytest.raises(InputError, match="needs size >= 128"):
        attn(q, k, v)


def test_short_slopes_and_key_tables():
    slopes = torch.ones(2)
    attn = attngen.compile(score_mod=lambda s, b, h, q, kv: s + slopes[h] * (kv - q))
    attn(*_qkv(H=2))
    with pytest.raises(InputError, match=r"`h`.*one entry per query head"):
        attn(*_qkv(H=4))
    table = torch.zeros(64)
    attn = attngen.compile(score_mod=lambda s, b, h, q, kv: s + table[kv + 1], mask_mod=lambda b, h, q, kv: kv < 63)
    with pytest.raises(InputError, match=r"score_mod '<lambda>'.*`kv_idx \+ 1`.*needs size >= 65"):
        attn(*_qkv(L=64))


def test_indices_the_check_cannot_bound_are_left_alone():
    table = torch.zeros(40)
    attn = attngen.compile(score_mod=lambda s, b, h, q, kv: s + table[kv // 2])  # 64 keys read 0..31: fine
    assert attn.traced.captured[0].extent_rules == ()
    attn(*_qkv(L=64))


def test_check_extents_negative_constants_wrap_like_torch():
    from dataclasses import replace

    attn = attngen.compile(score_mod=lambda s, b, h, q, kv: s + torch.zeros(8)[q - 3])
    c = attn.traced.captured[0]
    assert c.extent_rules == ((0, "q", -3),)
    check_extents((c,), (torch.zeros(8),), 1, 1, 8, 8, 0)   # reads -3 .. 4
    with pytest.raises(InputError, match="reaches -3"):
        check_extents((c,), (torch.zeros(2),), 1, 1, 2, 2, 0)  # -3 is out of range for 2 entries
    check_extents((replace(c, extent_rules=()),), (torch.zeros(1),), 1, 1, 64, 64, 0)


# ---------------------------------------------------------------- ATTNGEN_DEBUG builds

def _doc_variant():
    doc = torch.zeros(100, dtype=torch.int32)
    return attngen.compile(score_mod=lambda s, b, h, q, kv: s + doc[kv * 2], mask_mod=attngen.document(doc))


def test_debug_render_checks_every_captured_read():
    attn = _doc_variant()
    normal = render_variant_inc(attn.traced, attn.predicates)
    debug = render_variant_inc(attn.traced, attn.predicates, debug=True)
    assert "ag_chk" not in normal and "ATTNGEN_DEBUG_SLOT" not in normal
    assert "#define ATTNGEN_DEBUG_SLOT 1" in debug
    loads = debug.count("ag_ld_i32(")
    assert loads >= 2 and debug.count("ag_chk(c.ptr[1], 0, 0, ") == loads


@pytest.mark.requires_nvcc
def test_debug_builds_have_their_own_cache_key(monkeypatch):
    attn = _doc_variant()
    monkeypatch.delenv("ATTNGEN_DEBUG", raising=False)
    normal = attn.spec(torch.bfloat16, 64, "sm_80")
    monkeypatch.setenv("ATTNGEN_DEBUG", "1")
    debug = attn.spec(torch.bfloat16, 64, "sm_80")
    assert not normal.debug and debug.debug
    assert "debug" not in normal.fields() and debug.fields()["debug"] is True
    assert "ag_chk" in debug.variant_inc() and "ag_chk" not in normal.variant_inc()


@pytest.mark.requires_nvcc
def test_debug_variant_inc_compiles_with_nvcc(tmp_path, nvcc_path):
    import subprocess
    from pathlib import Path

    attn = _doc_variant()
    (tmp_path / "variant.inc").write_text(render_variant_inc(attn.traced, attn.predicates, debug=True))
    (tmp_path / "debug.cu").write_text(r"""
#include "attngen_common.cuh"
#include "variant.inc"
__global__ void exercise(CapturedArgs c, float* out) {
  HeadCtx hc = head_ctx(c, 0, 0);
  int q = (int)threadIdx.x, k = (int)threadIdx.y;
  RowCtx rc = row_ctx(c, hc, q);
  ColCtx cc = col_ctx(c, hc, k);
  out[threadIdx.x] = mask_mod(c, hc, rc, cc, q, k) ? score_mod(1.0f, c, hc, rc, cc, q, k) : 0.0f;
}
extern "C" int debug_slot() { return ATTNGEN_DEBUG_SLOT; }
""")
    templates = Path(attngen.__file__).parent / "templates"
    r = subprocess.run([nvcc_path, "-std=c++17", "-O3", "-gencode=arch=compute_80,code=sm_80", "-I", str(templates),
                        "-I", str(tmp_path), "-c", str(tmp_path / "debug.cu"), "-o", str(tmp_path / "debug.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:6000]
