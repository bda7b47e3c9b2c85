"""attngen.gradients and the gradient functions codegen prints into variant.inc

* the derivatives of library and hand-written score_mods (softcap, ALiBi with and without a slopes tensor, a
  relative-position table, where, tanh/atan/erf/pow/sigmoid/max ...) match torch autograd of the reference
  evaluation, in float64: d score_mod / d score elementwise, and the gradient of every captured tensor as the
  scatter of the sites' derivatives at their indices;
* score_mod_grad / grad_site / grad_site_slot, compiled on the host (g++) from the printed text, give those
  derivatives and the flat element offsets of the loaded elements (wrapped negative indices, transposed strides,
  bf16 / fp16 tensors, an index read from an int tensor);
* the forward code of variant.inc is unchanged by them (no score_mod: the same text but for the new functions).
"""
import os
from pathlib import Path
import random
import re
import shutil
import subprocess

import pytest
import sympy
import torch

import attngen
import attngen.codegen as codegen
from attngen.codegen import render_variant_inc
from attngen.errors import BuildError
from attngen.gradients import GradSite, ScoreGradients, derive_gradients, score_gradients
from attngen.printer import torch_function
from attngen.symbols import B, H, KV, Q, SCORE, load
from attngen.trace import trace

from codegen_cases import COMMON_STUB, MATH, UNDEF, VARIANT_MATH, gradient_tensors, make_tensors
from codegen_cases import check_rendering_across_hash_seeds, run_host_program, param_setup, traced_gradient_variants, variants
from helpers import param_values

GXX = shutil.which("g++")
ARGS = (SCORE, B, H, Q, KV)
NH, QLEN, KVLEN = 4, 20, 90  # q_idx - kv_idx + REL_L - 1 goes below 0: the relative table wraps


def _values(expr, *vals, tensors):
    """expr evaluated by attngen.printer's torch evaluator, broadcast to the score shape."""
    out = torch_function(expr, ARGS)(*vals, tensors=tensors)
    return torch.broadcast_to(torch.as_tensor(out, dtype=torch.float64), vals[0].shape)


def _flat_index(site, tensor, vals, tensors):
    """Flat element offset (tensor's strides, from its first element) of the element the site reads, with
    torch's wrap of negative indices."""
    off = torch.zeros(vals[0].shape, dtype=torch.int64)
    for d, i in enumerate(site.index):
        idx = torch.broadcast_to(torch.as_tensor(torch_function(i, ARGS)(*vals, tensors=tensors)), vals[0].shape)
        idx = torch.where(idx < 0, idx + tensor.shape[d], idx)
        off += idx * tensor.stride(d)
    return off


def _storage_grad(tensor, grad):
    """``grad`` (shaped like ``tensor``) laid out at the tensor's element offsets, as a flat float64 buffer."""
    span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    flat = torch.zeros(span, dtype=torch.float64)
    flat.as_strided(tensor.shape, tensor.stride()).copy_(grad)
    return flat


def _autograd(tv, S, idx):
    """torch autograd of sum(W * score_mod(S)) on the reference evaluation (float64): W, dL/dS, and dL/d
    every float captured tensor (float64 copies of them)."""
    leaves = {c.name: (c.tensor.detach().to(torch.float64).requires_grad_() if not c.integer else c.tensor)
              for c in tv.captured}
    S = S.detach().clone().requires_grad_()
    W = torch.randn(S.shape, dtype=torch.float64)
    out = _values(tv.score.xreplace(param_values(tv.params)), S, *idx, tensors=leaves)
    (W * out).sum().backward()
    grads = {n: t.grad if t.grad is not None else torch.zeros(t.shape, dtype=torch.float64)
             for n, t in leaves.items() if t.dtype == torch.float64}
    return W, S.grad, grads


def _indices(q_offset):
    h = torch.arange(NH).view(NH, 1, 1)
    q = torch.arange(q_offset, q_offset + QLEN).view(1, QLEN, 1)
    kv = torch.arange(KVLEN).view(1, 1, KVLEN)
    return torch.tensor(1), h, q, kv


@pytest.fixture(scope="module")
def grad_variants():
    return traced_gradient_variants(gradient_tensors(0))


# ---------------------------------------------------------------------------------------------------------
# derivation


@pytest.mark.parametrize("name", sorted(traced_gradient_variants(gradient_tensors(0))))
def test_derivatives_match_torch_autograd(name, grad_variants):
    tv, _ = grad_variants[name]
    torch.manual_seed(1)
    idx = _indices(q_offset=7)
    S = torch.randn(NH, QLEN, KVLEN, dtype=torch.float64) * 12
    W, dS, dT = _autograd(tv, S, idx)
    g = derive_gradients(tv)
    values = param_values(tv.params)  # the derivatives are symbolic in runtime parameters (softcap's cap)
    torch.testing.assert_close(W * _values(g.dscore.xreplace(values), S, *idx, tensors=_tensors64(tv)), dS,
                               rtol=1e-9, atol=1e-12)
    caps = {c.name: c for c in tv.captured}
    for name_, grad in dT.items():
        t = caps[name_].tensor
        got = torch.zeros(_storage_grad(t, grad).shape, dtype=torch.float64)
        for site in g.sites:
            if site.tensor == name_:
                d = _values(site.derivative.xreplace(values), S, *idx, tensors=_tensors64(tv))
                got.index_add_(0, _flat_index(site, t, (S,) + idx, _tensors64(tv)).flatten(), (W * d).flatten())
        torch.testing.assert_close(got, _storage_grad(t, grad), rtol=1e-9, atol=1e-9,
                                   msg=lambda m: f"{name}: gradient of {name_}: {m}")


def _tensors64(tv):
    return {c.name: c.tensor if c.integer else c.tensor.to(torch.float64) for c in tv.captured}


def test_sites_are_the_distinct_float_loads(grad_variants):
    def sites(k):
        return [(s.tensor, s.index) for s in derive_gradients(grad_variants[k][0]).sites]

    assert sites("g_softcap") == [] and sites("g_alibi") == []
    assert sites("g_alibi_slopes") == [("t0", (H,))]
    assert sites("g_relpos") == [("t0", (H, Q - KV + 63))]
    assert sites("g_where_pair") == [("t0", (H,)), ("t1", (Q, KV))]
    # a tensor read twice at one index: one site, both uses summed
    (site,) = derive_gradients(grad_variants["g_repeated"][0]).sites
    assert site.derivative.has(SCORE) and site.derivative.has(site.load)
    # the int table t0 gives no site; it is part of the float table's index
    (site,) = derive_gradients(grad_variants["g_indirect"][0]).sites
    assert site.tensor == "t1" and site.index == (H, load("t0", KV, integer=True))


def test_no_score_mod_and_integer_parts():
    assert derive_gradients(trace(attngen.causal())) == ScoreGradients(sympy.Integer(1), ())
    # floor, //, % of integers, sign, a condition used as 0/1: derivative 0
    g = score_gradients(SCORE + sympy.floor(SCORE / 3) + sympy.sign(SCORE) * 2
                        + sympy.Piecewise((1, SCORE > 0), (0, True)) * load("t0", H))
    assert g == ScoreGradients(sympy.Integer(1), (GradSite("t0", (H,), sympy.Piecewise((1, SCORE > 0), (0, True))),))
    # a float load seen only through an integer-valued part has no site
    assert score_gradients(SCORE * sympy.floor(load("t0", H))).sites == ()


def test_sigmoid_derivative_is_finite_where_exp_overflows():
    sig = 1 / (1 + sympy.exp(-SCORE))
    d = score_gradients(4 * sig).dscore
    s = torch.tensor([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=torch.float64)
    got = torch_function(d, [SCORE])(s)
    want = 4 * torch.sigmoid(s) * (1 - torch.sigmoid(s))
    torch.testing.assert_close(got, want)


def test_an_undifferentiable_node_is_named():
    mystery = sympy.Function("mystery")
    with pytest.raises(BuildError, match=r"cannot differentiate `mystery\(score\)` with respect to the score.*Fix"):
        score_gradients(SCORE + mystery(SCORE))
    with pytest.raises(BuildError, match=r"mystery\(t0\[h\]\)` with respect to the captured element t0\[h\]"):
        score_gradients(SCORE + mystery(load("t0", H)))


def test_codegen_nodes_are_integer_valued():
    """ToFloat / FloorDiv / WrapIndex (codegen's nodes) of integers: constants for the derivative."""
    from attngen.printer import FloorDiv, ToFloat, WrapIndex

    g = score_gradients(SCORE * ToFloat(FloorDiv(Q, 2)) + ToFloat(sympy.floor(SCORE))
                        + load("t0", WrapIndex(Q - KV, 9)) * SCORE)
    assert g.dscore == ToFloat(FloorDiv(Q, 2)) + load("t0", WrapIndex(Q - KV, 9))
    assert g.sites == (GradSite("t0", (WrapIndex(Q - KV, 9),), SCORE),)


@pytest.mark.heavy  # fresh interpreters (torch import each): ~8 s on 2 cores
def test_printed_gradients_are_deterministic_across_processes_and_hash_seeds():
    V = traced_gradient_variants(gradient_tensors(0))
    check_rendering_across_hash_seeds("t.traced_gradient_variants(t.gradient_tensors(0))",
                                      {k: render_variant_inc(*v) for k, v in V.items()})


# ---------------------------------------------------------------------------------------------------------
# printed functions


def _all_cases():
    return {**variants(make_tensors(0)), **traced_gradient_variants(gradient_tensors(0))}


def test_gradient_functions_are_defined():
    for k, (tv, preds) in _all_cases().items():
        text = render_variant_inc(tv, preds)
        n = len(derive_gradients(tv).sites)
        assert f"#define ATTNGEN_NUM_GRAD_SITES {n}\n" in text, k
        for sig in ("__device__ __forceinline__ float score_mod_grad(float score, const CapturedArgs& c, const HeadCtx& hc, "
                    "const RowCtx& rc, const ColCtx& cc,\n    int q_idx, int kv_idx)",
                    "__device__ __forceinline__ float grad_site(int k, float score, const CapturedArgs& c, const HeadCtx& hc, "
                    "const RowCtx& rc, const ColCtx& cc,\n    int q_idx, int kv_idx, long long& offset)",
                    "__device__ __forceinline__ constexpr int grad_site_slot(int "):
            assert sig in text, (k, sig)
        if not tv.has_score_mod:
            assert "score_mod_grad(float score, const CapturedArgs& c, const HeadCtx& hc, const RowCtx& rc, const " \
                   "ColCtx& cc,\n    int q_idx, int kv_idx) {\n  return 1.0f;\n}" in text, k


def _bodies(text):
    """name -> text of every function and struct of a variant.inc, the gradient functions left out."""
    out = {}
    for m in re.finditer(r"^(?:struct (\w+) \{|.*?\b(\w+)\([^;{]*\) \{)\n(.*?)^\}", text, re.S | re.M):
        name = m.group(1) or m.group(2)
        if name not in ("score_mod_grad", "grad_site", "grad_site_slot", "grad_site_kind", "grad_site_bin"):
            out[name] = m.group(3)
    return out


def test_forward_code_is_unchanged(monkeypatch):
    """The gradient functions add nothing the forward kernels run: without a score_mod the text is the same but
    for them; with one, the forward functions are the same and the context structs only gain fields (computed
    in the contexts, never read by score_mod / mask_mod, so dead code for the forward kernels)."""
    cases = {**_all_cases(), "relbias_debug": variants(make_tensors(0))["relbias"]}
    new = {k: render_variant_inc(*v, debug=k.endswith("_debug")) for k, v in cases.items()}
    monkeypatch.setattr(codegen, "_hoist_gradients", lambda *a: (sympy.Integer(1), ()))
    monkeypatch.setattr(codegen, "_gradient_functions", lambda *a: [])
    old = {k: render_variant_inc(*v, debug=k.endswith("_debug")) for k, v in cases.items()}
    for k, (tv, _) in cases.items():
        a, b = _bodies(old[k]), _bodies(new[k])
        assert a.keys() == b.keys(), k
        for name in a:
            if name in ("HeadCtx", "RowCtx", "ColCtx") and tv.has_score_mod:
                assert b[name].startswith(a[name]), (k, name)  # new fields after the old ones
            elif name in ("head_ctx", "row_ctx", "col_ctx") and tv.has_score_mod:
                continue  # CSE may name a shared subexpression of a new field; the values stored are the same
            else:
                assert a[name] == b[name], (k, name)
        if not tv.has_score_mod:
            stripped = re.sub(r"// d score_mod / d score.*?grad_site_bin\(int k\) \{\n  return -1;\n\}\n\n", "",
                              new[k], flags=re.S)
            assert stripped == old[k], k


def test_gradient_functions_are_hoisted_and_checked(grad_variants):
    r = {k: render_variant_inc(*grad_variants[k]) for k in ("g_softcap", "g_alibi_slopes", "g_relpos")}
    sm = codegen_body(r["g_softcap"], "score_mod_grad")
    assert sm.count("ag_tanh(") == 1 and "ag_ld" not in sm, sm
    site = codegen_body(r["g_alibi_slopes"], "grad_site")
    assert "offset = (long long)hc.h;" in site, site
    site = codegen_body(r["g_relpos"], "grad_site")
    # the table is transposed (strides (1, 4)): h with a literal unit stride, the wrapped index times its stride
    assert "offset = c.stride[0][1] * (long long)ag_wrap(rc.r0 - kv_idx, 127) + (long long)hc.h;" in site, site
    assert "return 1.0f;" in site, site
    assert "grad_site_slot(int k) {\n  return k == 0 ? 0 : -1;\n}" in r["g_relpos"]
    # debug builds check the site's indices as score_mod's
    dbg = render_variant_inc(*grad_variants["g_relpos"], debug=True)
    assert "ag_chk(c.ptr[1], 0, 1, " in codegen_body(dbg, "grad_site")


def codegen_body(text, fname):
    m = re.search(r"\b" + fname + r"\([^)]*\)[^{]*\{\n(.*?)\n\}", text, re.S)
    assert m, f"{fname} not found in\n{text}"
    return m.group(1)


# ---------------------------------------------------------------------------------------------------------
# host semantics: the printed functions compiled by g++ give autograd's derivatives and the loaded offsets


def _c_bytes(name: str, t: torch.Tensor) -> str:
    base = t._base if t._base is not None else t
    assert base.is_contiguous() and base.storage_offset() == 0
    raw = base.reshape(-1).view(torch.uint8).tolist()
    return f"alignas(16) static const unsigned char {name}[{len(raw)}] = {{{', '.join(map(str, raw))}}};"


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_gradient_functions_host_semantics_match_autograd(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    V = traced_gradient_variants(gradient_tensors(seed))
    q_offset = rng.randint(0, 30)
    S = (torch.randn(NH, QLEN, KVLEN, generator=torch.Generator().manual_seed(seed)) * 12).to(torch.float32)
    (tmp_path / "attngen_common.cuh").write_text(COMMON_STUB)
    (tmp_path / "variant_math.cuh").write_text(VARIANT_MATH.read_text())
    src = ["#define __host__\n#define __device__\n#define __forceinline__ inline\n#include <cstdio>\n#include <cstring>\n"
           '#include "attngen_common.cuh"\n' + MATH,
           f"static const float S[{S.numel()}] = {{{', '.join(repr(float(x)) + 'f' for x in S.flatten().tolist())}}};"]
    for k, (tv, preds) in V.items():
        (tmp_path / f"{k}.inc").write_text(render_variant_inc(tv, preds))
        setup = ["  CapturedArgs c; memset(&c, 0, sizeof(c));"] + param_setup(tv)
        for n, ct in enumerate(tv.captured):
            src.append(_c_bytes(f"{k}_{ct.name}", ct.tensor))
            setup.append(f"  c.ptr[{n}] = {k}_{ct.name} + {ct.tensor.storage_offset() * ct.tensor.element_size()};")
            setup += [f"  c.stride[{n}][{d}] = {st};" for d, st in enumerate(ct.tensor.stride())]
        src.append(f"namespace v_{k} {{\n#include \"{k}.inc\"\n" + f"""
static_assert(grad_site_slot(ATTNGEN_NUM_GRAD_SITES) == -1, "grad_site_slot is a constant expression");
void run() {{
{chr(10).join(setup)}
  for (int h = 0; h < {NH}; ++h) {{
    HeadCtx hc = head_ctx(c, 1, h);
    for (int r = 0; r < {QLEN}; ++r) {{
      const int q = r + {q_offset};
      RowCtx rc = row_ctx(c, hc, q);
      for (int kv = 0; kv < {KVLEN}; ++kv) {{
        ColCtx cc = col_ctx(c, hc, kv);
        const float s = S[(h * {QLEN} + r) * {KVLEN} + kv];
        printf("%.9g", score_mod_grad(s, c, hc, rc, cc, q, kv));
        for (int k = 0; k < ATTNGEN_NUM_GRAD_SITES; ++k) {{
          long long offset = -1;
          const float d = grad_site(k, s, c, hc, rc, cc, q, kv, offset);
          printf(" %.9g %lld %d", d, offset, grad_site_slot(k));
        }}
        printf("\\n");
      }}
    }}
  }}
  printf("END\\n");
}}
}}  // namespace
""" + UNDEF)
    out = run_host_program(tmp_path, src, (f"  v_{k}::run();" for k in V)).split("END\n")

    idx = _indices(q_offset)
    S64 = S.to(torch.float64)
    for n, (k, (tv, _)) in enumerate(V.items()):
        g = derive_gradients(tv)
        rows = torch.tensor([[float(x) for x in ln.split()] for ln in out[n].strip().split("\n")], dtype=torch.float64)
        assert rows.shape == (NH * QLEN * KVLEN, 1 + 3 * len(g.sites)), k
        rows = rows.view(NH, QLEN, KVLEN, -1)
        W, dS, dT = _autograd(tv, S64, idx)
        msg = f"seed {seed}: {k}"
        torch.testing.assert_close(W * rows[..., 0], dS, rtol=2e-5, atol=1e-5, msg=lambda m: f"{msg}: score_mod_grad: {m}")
        caps = {c.name: (slot, c) for slot, c in enumerate(tv.captured)}
        got = {name: torch.zeros(_storage_grad(c.tensor, dT[name]).shape, dtype=torch.float64)
               for name, (_, c) in caps.items() if name in dT}
        for j, site in enumerate(g.sites):
            slot, ct = caps[site.tensor]
            d, off, sl = rows[..., 1 + 3 * j], rows[..., 2 + 3 * j].to(torch.int64), rows[..., 3 + 3 * j]
            assert (sl == slot).all(), f"{msg}: grad_site_slot({j})"
            want_off = _flat_index(site, ct.tensor, (S64,) + idx, _tensors64(tv))
            assert torch.equal(off, want_off), f"{msg}: site {j} offsets differ at {(off != want_off).nonzero()[:5].tolist()}"
            torch.testing.assert_close(d, _values(site.derivative, S64, *idx, tensors=_tensors64(tv)), rtol=2e-5,
                                       atol=1e-5, msg=lambda m: f"{msg}: site {j} derivative: {m}")
            got[site.tensor].index_add_(0, off.flatten(), (W * d).flatten())
        for name, grad in got.items():  # what a kernel accumulates, against autograd
            want = _storage_grad(caps[name][1].tensor, dT[name])
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-3, msg=lambda m: f"{msg}: gradient of {name}: {m}")


# ---------------------------------------------------------------------------------------------------------
# nvcc: a forward-style kernel (contexts per row / column, score_mod and mask_mod per element) compiles to the
# same cubin with and without the gradient functions, their new context fields included

_FORWARD_LIKE = r"""
#include "attngen_common.cuh"
#include "v.inc"
__global__ void forward_like(CapturedArgs c, TileArgs t, const float* S, float* out) {
  HeadCtx hc = head_ctx(c, t.b, t.h);
  RowCtx rc[2][2];
  int qi[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      qi[m][r] = (int)blockIdx.x * 32 + m * 16 + r * 8 + (int)threadIdx.x / 4 + t.QOFF;
      rc[m][r] = row_ctx(c, hc, qi[m][r]);
    }
  float acc = 0.0f;
  for (int kv0 = 0; kv0 < t.KVLEN; kv0 += 8) {
    const int kv = kv0 + ((int)threadIdx.x & 3) * 2;
    const ColCtx cc = col_ctx(c, hc, kv);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float s = score_mod(S[qi[m][r] * 128 + kv], c, hc, rc[m][r], cc, qi[m][r], kv);
        acc += mask_mod(c, hc, rc[m][r], cc, qi[m][r], kv) ? s : 0.0f;
      }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""


@pytest.mark.requires_nvcc
def test_forward_cubin_is_unchanged(tmp_path, monkeypatch, nvcc_path):
    from concurrent.futures import ThreadPoolExecutor

    from codegen_cases import REAL_COMMON

    # variants whose gradient sites add context fields: a per-row offset, a per-column offset and value, per-head
    cases = {k: v for k, v in _all_cases().items() if k in ("compound", "g_indirect", "g_where_pair", "g_relpos")}
    texts = {(k, "new"): render_variant_inc(*v) for k, v in cases.items()}
    monkeypatch.setattr(codegen, "_hoist_gradients", lambda *a: (sympy.Integer(1), ()))
    monkeypatch.setattr(codegen, "_gradient_functions", lambda *a: [])
    texts.update({(k, "old"): render_variant_inc(*v) for k, v in cases.items()})
    assert all(texts[k, "new"] != texts[k, "old"] for k in cases)

    def cubin(key):
        d = tmp_path / "_".join(key)
        d.mkdir()
        (d / "v.inc").write_text(texts[key])
        (d / "k.cu").write_text(_FORWARD_LIKE)
        cmd = [nvcc_path, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-I", str(REAL_COMMON.parent),
               "-I", str(d), "-cubin", "-o", str(d / "k.cubin"), str(d / "k.cu")]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{key}: nvcc failed:\n{r.stderr[:4000]}"
        return (d / "k.cubin").read_bytes()

    with ThreadPoolExecutor(2) as ex:
        built = dict(zip(texts, ex.map(cubin, texts)))
    for k in cases:
        assert built[k, "new"] == built[k, "old"], f"{k}: the forward code changed with the gradient functions"


def test_a_score_mod_without_derivatives_keeps_its_forward():
    """A score_mod whose derivative cannot be printed (a negative constant to a score-dependent power) still
    renders for the forward kernels: no ATTNGEN_NUM_GRAD_SITES, a comment naming why, and the backward
    template's #error for that case."""
    import attngen
    from attngen.codegen import render_variant_inc

    slopes = torch.rand(4)
    for fn in (lambda s, b, h, q, k: s + (-2.0) ** (s / 100),
               # a derivative term that would be hoisted to a per-head field before failing to print
               lambda s, b, h, q, k: s + (-2.0) ** (s / 100) * slopes[h] + slopes[h] * q):
        attn = attngen.compile(score_mod=attngen.ScoreMod(fn, "negpow"))
        inc = render_variant_inc(attn.traced, attn.predicates)
        assert "#define ATTNGEN_NUM_GRAD_SITES" not in inc and "score_mod_grad" not in inc
        assert "// no score_mod gradients (backward kernels unavailable): " in inc and "not real" in inc
        assert "__device__ __forceinline__ float score_mod(" in inc
    bwd = (Path(attngen.__file__).parent / "templates" / "bwd_probs.cuh").read_text()
    assert "#if ATTNGEN_HAS_SCORE_MOD && !defined(ATTNGEN_NUM_GRAD_SITES)" in bwd


def test_grad_site_kinds_follow_what_the_offset_reads():
    """How the sm90 backward sums a site (bwd_grad_sites.cuh) follows from its element offset: once per tile when
    it reads neither q_idx nor kv_idx, once per diagonal when it reads q_idx - kv_idx only (wrapped or clamped
    as a function of the difference too, at most GRAD_DIAG_SITES of them), else per element."""
    from attngen.codegen import GRAD_DIAG_SITES, GRAD_SITE_DIAG, GRAD_SITE_ELEM, GRAD_SITE_TILE, grad_site_kinds

    t, s1 = sympy.symbols("t s1", integer=True)
    cases = {
        H * s1 + B: GRAD_SITE_TILE,                                        # slopes[b, h]
        H * s1 + Q - KV + 255: GRAD_SITE_DIAG,                             # table[h, q - kv + 255]
        H * s1 + sympy.Max(0, sympy.Min(Q - KV, 31)): GRAD_SITE_DIAG,      # table[h, clamp(q - kv, 0, 31)]
        H * s1 + sympy.Mod(Q - KV, 2 * t): GRAD_SITE_DIAG,                 # a wrapped negative index
        Q * s1 + KV: GRAD_SITE_ELEM,                                       # bias[q, kv]
        H * s1 + Q: GRAD_SITE_ELEM,                                        # bias[h, q]
        H * s1 + sympy.Min(Q, 100) - KV: GRAD_SITE_ELEM,                   # clamps q alone: not a difference
        H * s1 + sympy.Piecewise((1, SCORE > 0), (0, True)): GRAD_SITE_ELEM,  # t[h, where(s > 0, 1, 0)]
        H * s1 + Q - KV + sympy.floor(SCORE): GRAD_SITE_ELEM,              # the score shifts the diagonal
    }
    assert grad_site_kinds(list(cases)) == tuple(cases.values())
    many = [H * s1 + Q - KV + n for n in range(GRAD_DIAG_SITES + 2)]
    assert grad_site_kinds(many) == (GRAD_SITE_DIAG,) * GRAD_DIAG_SITES + (GRAD_SITE_ELEM,) * 2


def test_grad_site_kind_and_bin_are_printed(grad_variants):
    text = render_variant_inc(*grad_variants["g_relpos"])
    assert "#define ATTNGEN_GRAD_DIAG_SITES 1\n" in text
    assert "grad_site_kind(int k) {\n  return k == 0 ? 2 : 0;\n}" in text
    assert "grad_site_bin(int k) {\n  return k == 0 ? 0 : -1;\n}" in text
    text = render_variant_inc(*grad_variants["g_alibi_slopes"])
    assert "#define ATTNGEN_GRAD_DIAG_SITES 0\n" in text
    assert "grad_site_kind(int k) {\n  return k == 0 ? 1 : 0;\n}" in text
