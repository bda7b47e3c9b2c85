"""attngen.codegen.render_variant_inc: the generated variant.inc

* compiles with nvcc for sm_80 and sm_90a, every contract function instantiated and called;
* computes, on the host (g++, same text), what Python computes for the variant's expressions and
  block predicates (the torch evaluator of attngen.printer is the reference, itself checked against
  sympy in test_printer.py);
* hoists per-head/-row/-column work out of score_mod/mask_mod;
* is byte-identical across runs and hash seeds.
"""
import dataclasses
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sympy
import torch

from attngen.codegen import render_variant_inc
from attngen.errors import BuildError
from attngen.ir import BlockPredicates, CapturedTensor, TracedVariant
from attngen.mods import ScoreMod, Variant
from attngen.symbols import B, BK, BQ, H, I, J, KV, KVLEN, Q, QLEN, QOFF, SCORE, load

from codegen_cases import (COMMON_STUB, REPO, VARIANT_MATH, causal_preds, full_preds, make_tensors, variants)
from codegen_cases import check_rendering_across_hash_seeds, param_setup, run_host_program
from codegen_cases import gradient_tensors, traced_gradient_variants
from codegen_cases import MATH as _MATH
from helpers import param_values, predicates_with_values

sys.path.insert(0, str(REPO / "benchmarks"))
import mask_zoo  # noqa: E402
from codegen_cases import UNDEF as _UNDEF
from codegen_cases import py_eval as _py
from codegen_cases import write_includes as _write_includes

GXX = shutil.which("g++")


_HEAD_SCALE = torch.tensor([0.5, -1.25, 2.0, 0.75])
_REL_TABLE = torch.linspace(0.5, 1.5, 127)  # d = q - kv in [-63, 63]


def derived_variants():
    """Library variants through the real tracer and predicate derivation (no captured tensors), so the
    printed tile functions the kernels run are checked against the same expressions block_map evaluates."""
    import attngen
    from attngen.analysis import analyze

    mods = {
        "d_chunked": attngen.chunked(64),
        "d_window_not_chunk": attngen.local(40, 24) & ~attngen.chunked(64),
        "d_prefix_or_window_not_bd": (attngen.prefix_lm(20) | attngen.sliding_window(48)) & ~attngen.block_diagonal(70),
        "d_dilated": attngen.dilated(90, 3),
        "d_abs_min": attngen.MaskMod(lambda b, h, q, k: (abs(q - k) <= 30) & (torch.minimum(q, k) >= 10), "abs_min"),
        # issue 15's partial-tile masks: row/column splits of windows and congruences, global tokens
        "d_dilated_window": attngen.MaskMod(lambda b, h, q, k: (torch.abs(q - k) <= 40) & ((q - k) % 2 == 0), "dw"),
        "d_local_global": attngen.MaskMod(lambda b, h, q, k: (torch.abs(q - k) <= 20) | (k < 7) | (q < 9), "lg"),
        "d_congruences": attngen.MaskMod(lambda b, h, q, k: ((q - k + 3) % 5 == 2) | ((2 * k - q) % 4 != 1)
                                         | ((k - q) // 8 == 1) | (k % 3 == q // 16 % 3), "congr"),
        "d_div_square": Variant(score_mod=attngen.ScoreMod(lambda s, b, h, q, k: s / (1 + 1e-3 * (q - k) ** 2), "div")),
        "d_head_scale": Variant(score_mod=attngen.ScoreMod(lambda s, b, h, q, k: s * _HEAD_SCALE[h], "hs")),
        # integer division under clamps (printer.lower_int_division rebuilds their parents unevaluated)
        "d_natten_2d": attngen.MaskMod(mask_zoo._natten_2d(256, W=16, K=2), "natten_2d"),
        "d_tiled_natten_2d": attngen.MaskMod(mask_zoo._tiled_natten_2d(256, W=32, T=4, K=1), "tiled_natten_2d"),
        "d_chunked_causal": attngen.MaskMod(mask_zoo._chunked_causal(256, C=48), "chunked_causal"),
    }
    return {k: analyze(m) for k, m in mods.items()}


def body(text: str, fname: str) -> str:
    m = re.search(r"\b" + fname + r"\([^)]*\)[^{]*\{\n(.*?)\n\}", text, re.S)
    assert m, f"{fname} not found in\n{text}"
    return m.group(1)


@pytest.fixture(scope="module")
def rendered():
    tensors = make_tensors(0)
    return {k: render_variant_inc(t, p) for k, (t, p) in variants(tensors).items()}


# ---------------------------------------------------------------------------------------------------------
# structure


def test_macros(rendered):
    def macros(text):
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define ATTNGEN_(\w+) (\d)", text)}

    plain = {"SCORE_HEAD_SCALE": 0, "SCORE_REL": 0, "SCORE_REL_LOADS": 0, "SCORE_REL_SCALES": 0, "SCORE_REL_LINEAR": 0,
             "SCORE_REL_A_CONST": 0, "KV_PARTS": 0, "Q_PARTS": 0, "NUM_SUMMARIES": 0, "TILES_READ_HEAD": 0,
             "GRAD_DIAG_SITES": 0}
    assert macros(rendered["causal"]) == {"HAS_SCORE_MOD": 0, "HAS_MASK": 1, "NEEDS_CLASSIFIER": 0, **plain,
                                          "NUM_GRAD_SITES": 0}
    assert macros(rendered["softcap"]) == {"HAS_SCORE_MOD": 1, "HAS_MASK": 0, "NEEDS_CLASSIFIER": 0, **plain,
                                           "NUM_GRAD_SITES": 0}
    assert macros(rendered["document"]) == {"HAS_SCORE_MOD": 0, "HAS_MASK": 1, "NEEDS_CLASSIFIER": 1, **plain,
                                            "NUM_GRAD_SITES": 0, "NUM_SUMMARIES": 4}
    assert macros(rendered["compound"]) == {"HAS_SCORE_MOD": 1, "HAS_MASK": 1, "NEEDS_CLASSIFIER": 1, **plain,
                                            "NUM_GRAD_SITES": 1}  # the fp16 per-head bias t1[h, q % 160]


def test_issue15_partial_tile_reductions():
    """Per-element work of issue 15's partial-tile variants: row and column parts hoisted apart, congruences as
    one compare, a per-head factor folded into the kernel's per-tile multiplier, fast division."""
    V = derived_variants()
    r = {k: render_variant_inc(*V[k]) for k in ("d_dilated_window", "d_local_global", "d_div_square", "d_head_scale")}
    mm = body(r["d_dilated_window"], "mask_mod").strip()
    assert mm == "return cc.k0 == rc.r0 && kv_idx >= rc.r2 && kv_idx <= rc.r1;", mm
    assert "(q_idx & 1)" in body(r["d_dilated_window"], "row_ctx") and "(kv_idx & 1)" in body(r["d_dilated_window"], "col_ctx")
    mm = body(r["d_local_global"], "mask_mod")
    assert "ag_abs" not in mm and "kv_idx >= rc." in mm and "kv_idx <= rc." in mm, mm
    sm = body(r["d_div_square"], "score_mod")
    assert "ag_fdiv(score," in sm and "(float)" not in sm and "ag_powi(cc.k0 + rc.r0, 2)" in sm, sm
    assert "#define ATTNGEN_SCORE_HEAD_SCALE 1" in r["d_head_scale"]
    assert body(r["d_head_scale"], "score_head_scale").strip() == "return hc.h0;"
    assert "/" not in body(render_variant_inc(*V["d_div_square"], fast_div=False), "score_mod").replace("score / ", "")


def test_relative_score_mods_get_score_rel():
    """score_mod(s) = a(d) s + b(d), d = q - kv: a score_rel of d and float(d) (no int square, no conversion per
    call); loads indexed by d ask the kernel to clamp d. Other score forms keep the generic path."""
    V = {**variants(make_tensors(0)), **derived_variants()}
    r = {k: render_variant_inc(*V[k]) for k in ("alibi", "relbias", "d_div_square", "bias", "softcap", "compound")}

    def macros(text):
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define ATTNGEN_(SCORE_REL\w*) (\d)", text)}

    # SCORE_REL_SCALES: b(d) is 0, so the softmax factor may carry the scale (alibi and relbias add, the
    # division scales)
    # SCORE_REL_LINEAR: b(d) = slope * d (alibi), stepped along a row with one FFMA per d
    # SCORE_REL_A_CONST: a free of d (alibi, a table bias): the kernels stage b alone per diagonal
    assert macros(r["alibi"]) == {"SCORE_REL": 1, "SCORE_REL_LOADS": 0, "SCORE_REL_SCALES": 0, "SCORE_REL_LINEAR": 1,
                                  "SCORE_REL_A_CONST": 1}
    assert macros(r["relbias"]) == {"SCORE_REL": 1, "SCORE_REL_LOADS": 1, "SCORE_REL_SCALES": 0, "SCORE_REL_LINEAR": 0,
                                    "SCORE_REL_A_CONST": 1}
    assert macros(r["d_div_square"]) == {"SCORE_REL": 1, "SCORE_REL_LOADS": 0, "SCORE_REL_SCALES": 1,
                                         "SCORE_REL_LINEAR": 0, "SCORE_REL_A_CONST": 0}
    for k in ("bias", "softcap", "compound"):
        assert macros(r[k]) == {"SCORE_REL": 0, "SCORE_REL_LOADS": 0, "SCORE_REL_SCALES": 0, "SCORE_REL_LINEAR": 0,
                                "SCORE_REL_A_CONST": 0}, k
        assert "score_rel" not in r[k]
    assert body(r["alibi"], "score_rel_slope").strip() == "return hc.h1;", body(r["alibi"], "score_rel_slope")
    # a d-indexed load in a(d) with a linear b(d): the kernel clamps d for the loads and steps b from b(d0)
    t = _traced(ScoreMod(lambda s, b, h, q, k: s * _REL_TABLE[q - k + 63] + 0.5 * (k - q), "table_slope"))
    assert macros(render_variant_inc(*t)) == {"SCORE_REL": 1, "SCORE_REL_LOADS": 1, "SCORE_REL_SCALES": 0,
                                              "SCORE_REL_LINEAR": 1, "SCORE_REL_A_CONST": 0}
    alibi = body(r["alibi"], "score_rel")
    assert "fd * hc.h" in alibi and "(float)" not in alibi, alibi
    div = body(r["d_div_square"], "score_rel")
    assert "fd * fd" in div and "d * d" not in div.replace("fd * fd", ""), div
    # an integer polynomial of d used as a float (a divisor here) is evaluated on fd too: no int square to overflow
    t = _traced(ScoreMod(lambda s, b, h, q, k: s / (1 + (q - k) ** 2), "int_div"))
    div = body(render_variant_inc(*t), "score_rel")
    assert "fd * fd + 1.0f" in div and "(float)" not in div, div


def test_every_contract_function_is_defined(rendered):
    for text in rendered.values():
        for sig in ("HeadCtx head_ctx(const CapturedArgs& c, int b, int h)",
                    "RowCtx row_ctx(const CapturedArgs& c, const HeadCtx& hc, int q_idx)",
                    "ColCtx col_ctx(const CapturedArgs& c, const HeadCtx& hc, int kv_idx)",
                    "float score_mod(float score, const CapturedArgs& c, const HeadCtx& hc, const RowCtx& rc, const ColCtx& cc,",
                    "bool mask_mod(const CapturedArgs& c, const HeadCtx& hc, const RowCtx& rc, const ColCtx& cc,"):
            assert sig in text
        for f in ("kv_block_lo", "kv_block_hi", "kv_full_lo", "kv_full_hi"):
            assert f"template <int BQ, int BK>\n__device__ __forceinline__ int {f}(const CapturedArgs& c, const TileArgs& t, int i)" in text
        for f in ("tile_any", "tile_all"):
            assert f"bool {f}(const CapturedArgs& c, const TileArgs& t, int i, int j)" in text
        # the transposed q-block ranges of kv-block j: the backward kernel's walk (block_range_bwd.cuh)
        for f in ("q_block_lo", "q_block_hi", "q_full_lo", "q_full_hi"):
            assert f"template <int BQ, int BK>\n__device__ __forceinline__ int {f}(const CapturedArgs& c, const TileArgs& t, int j)" in text
        # the ag_* helpers come from the header, never inline
        assert '#include "variant_math.cuh"' in text and "__forceinline__ float ag_" not in text


def test_work_is_hoisted_out_of_the_element_functions(rendered):
    r = rendered
    # causal: nothing to hoist, the mask is one comparison
    assert body(r["causal"], "mask_mod").strip() in ("return q_idx >= kv_idx;", "return kv_idx <= q_idx;")
    assert body(r["causal"], "score_mod").strip() == "return score;"
    # softcap: 1/30 folded into a multiply, one tanh per element
    sm = body(r["softcap"], "score_mod")
    assert sm.count("ag_tanh(") == 1 and "0.033333335f" in sm and "/" not in sm
    # alibi: the slope's exp2 is per head; no int->float conversion per element
    sm = body(r["alibi"], "score_mod")
    assert "exp2" not in sm and "(float)" not in sm, sm
    assert "ag_exp2" in body(r["alibi"], "head_ctx")
    assert "(float)" in body(r["alibi"], "row_ctx") and "(float)" in body(r["alibi"], "col_ctx")
    # document: both loads are per row / per column, the element compares two registers
    mm = body(r["document"], "mask_mod")
    assert "ag_ld" not in mm and "==" in mm
    assert "ag_ld_i32" in body(r["document"], "row_ctx") and "ag_ld_i32" in body(r["document"], "col_ctx")
    # chunked: the chunk index of q and of kv is computed once per row / column
    assert "py_floordiv" not in body(r["chunked"], "mask_mod")
    assert "(q_idx >> 8)" in body(r["chunked"], "row_ctx")
    assert "(kv_idx >> 8)" in body(r["chunked"], "col_ctx")
    # bias table: the 64-bit offset is split into a per-row and a per-column part
    sm = body(r["bias"], "score_mod")
    assert sm.count("ag_ld_bf16(") == 1 and "stride" not in sm and "long long" not in sm and "ag_wrap" not in sm, sm
    assert "stride" in body(r["bias"], "row_ctx") and "stride" in body(r["bias"], "col_ctx")
    # relative table: the wrapped index is per element, the per-head part of the offset is not
    sm = body(r["relbias"], "score_mod")
    assert sm.count("ag_wrap(q_idx - kv_idx, 2048)") == 1 and "hc.h0" in sm, sm
    # compound: per-element work keeps only what needs both q and kv
    sm = body(r["compound"], "score_mod")
    assert "exp2" not in sm and sm.count("ag_tanh(") == 1 and sm.count("ag_ld_f16(") == 0, sm
    mm = body(r["compound"], "mask_mod")
    assert "ag_ld" not in mm and "py_mod(" not in mm and "cc.k1 == rc." in mm, mm  # congruences split by row / column


@pytest.mark.heavy  # fresh interpreters (torch import each): ~8 s on 2 cores
def test_output_is_deterministic_across_processes_and_hash_seeds(rendered):
    check_rendering_across_hash_seeds("t.variants(t.make_tensors(0))", rendered)
    again = {k: render_variant_inc(t, p) for k, (t, p) in variants(make_tensors(0)).items()}
    assert again == rendered


def test_fast_path_switches():
    t, p = variants(make_tensors(0))["compound"]
    slow = render_variant_inc(t, p, fast_tanh=False, fast_exp2=False)
    assert "tanhf(" in slow and "exp2f(" in slow and "ag_tanh" not in slow and "ag_exp2" not in slow
    fast = render_variant_inc(t, p)
    assert "ag_tanh(" in fast and "ag_exp2(" in fast and "tanhf(" not in fast and "exp2f(" not in fast
    assert "tanh.approx.f32" in VARIANT_MATH.read_text() and "ex2.approx.ftz.f32" in VARIANT_MATH.read_text()


def test_errors_name_the_problem():
    tensors = make_tensors(0)
    cap = (CapturedTensor("t0", tensors["bias"], torch.bfloat16, 2),)
    with pytest.raises(BuildError, match="rank 2"):
        render_variant_inc(TracedVariant(Variant(), SCORE + load("t0", Q), sympy.true, cap), full_preds())
    with pytest.raises(BuildError, match="t5"):
        render_variant_inc(TracedVariant(Variant(), SCORE + load("t5", Q), sympy.true, cap), full_preds())
    with pytest.raises(BuildError, match="score"):
        render_variant_inc(TracedVariant(Variant(), SCORE, SCORE > 0), full_preds())
    bad = causal_preds()
    bad = BlockPredicates(**{**bad.__dict__, "kv_hi": J + 1})
    with pytest.raises(BuildError, match="kv_block_hi"):
        render_variant_inc(TracedVariant(Variant(), SCORE, Q >= KV), bad)
    with pytest.raises(BuildError, match="mystery"):
        render_variant_inc(TracedVariant(Variant(), sympy.Function("mystery")(SCORE), sympy.true), full_preds())
    # an index that may be negative needs the dim's size (trace records it in wrapped_dims)
    with pytest.raises(BuildError, match=r"dim 1 of captured tensor t0 with `-kv_idx \+ q_idx`, which may be negative"):
        render_variant_inc(TracedVariant(Variant(), SCORE + load("t0", H, Q - KV), sympy.true, cap), full_preds())


# ---------------------------------------------------------------------------------------------------------
# captured indices that may be negative: torch wraps them (t[-1] is the last element), so the kernel does


def _traced(score_mod=None, mask_mod=None):
    from attngen.predicates import derive
    from attngen.trace import trace

    t = trace(Variant(score_mod=score_mod, mask_mod=mask_mod))
    return t, derive(t)


def test_negative_index_wraps_with_the_size_traced():
    table = torch.randn(2, 511)
    t, p = _traced(lambda s, b, h, q, kv: s + table[h, q - kv])
    assert t.captured[0].wrapped_dims == ((1, 511),)
    text = render_variant_inc(t, p)
    assert "ag_wrap(q_idx - kv_idx, 511)" in text, text
    assert "dim 1 wraps at 511" in text  # the header comment says so too
    # the baked size is part of the variant's canonical form (the cache key); values are not
    t_same, _ = _traced(lambda s, b, h, q, kv: s + torch.zeros(2, 511)[h, q - kv])
    t_other, _ = _traced(lambda s, b, h, q, kv: s + torch.zeros(2, 513)[h, q - kv])
    assert t.canonical() == t_same.canonical()
    assert t.canonical() != t_other.canonical()
    # an offset does not make the index provably non-negative (kv can exceed q + 255)
    t2, p2 = _traced(lambda s, b, h, q, kv: s + table[h, q - kv + 255])
    assert t2.captured[0].wrapped_dims == ((1, 511),) and "ag_wrap(" in render_variant_inc(t2, p2)
    # an index loaded from another tensor may be negative; the dims of doc itself (doc[q_idx]) are not
    doc = torch.zeros(64, dtype=torch.int64)
    t3, p3 = _traced(lambda s, b, h, q, kv: s + table[h, doc[q]])
    assert [c.wrapped_dims for c in t3.captured] == [(), ((1, 511),)]
    assert "ag_wrap(ag_ld_i64(c.ptr[0], (long long)q_idx), 511LL)" in render_variant_inc(t3, p3)


def test_provably_nonnegative_indices_are_not_wrapped():
    doc = torch.sort(torch.randint(0, 4, (300,))).values
    slopes = torch.rand(8)
    bias = torch.randn(8, 300, 300)
    table = torch.randn(8, 16)
    cases = [
        (None, lambda b, h, q, kv: doc[q] == doc[kv]),
        (lambda s, b, h, q, kv: s + slopes[h] * (kv - q), lambda b, h, q, kv: q >= kv),
        (lambda s, b, h, q, kv: s + bias[h, q, kv], None),
        (lambda s, b, h, q, kv: s + table[(h + 3) % 8, (q - kv) % 16] + table[h, abs(q - kv) // 64], None),
    ]
    for sm, mm in cases:
        t, p = _traced(sm, mm)
        assert all(c.wrapped_dims == () for c in t.captured), t.captured
        assert ":w" not in t.canonical().split("|captured=")[1]  # the keys of such variants are unchanged
        assert "ag_wrap" not in render_variant_inc(t, p)


def test_check_layout_names_a_changed_size_or_stride():
    table = torch.randn(2, 511)
    t, _ = _traced(lambda s, b, h, q, kv: s + table[h, q - kv])
    c = t.captured[0]
    assert c.unit_stride_dims == (1,) and c.check_layout(table) is None
    assert c.check_layout(torch.zeros(2, 511)) is None  # new values, same layout
    msg = c.check_layout(torch.zeros(2, 512))
    assert msg and "size 511 in dim 1" in msg and "now the size is 512" in msg
    msg = c.check_layout(torch.zeros(511, 2).t())
    assert msg and "stride 1 in dim 1" in msg
    assert "rank 2" in c.check_layout(torch.zeros(1022))
    doc = torch.zeros(64, dtype=torch.int32)
    t, _ = _traced(None, lambda b, h, q, kv: doc[q] == doc[kv])
    assert t.captured[0].check_layout(torch.zeros(128, dtype=torch.int32)) is None  # no size baked in


# ---------------------------------------------------------------------------------------------------------
# nvcc: every function instantiated and called from a kernel, sm_80 and sm_90a in parallel


@pytest.mark.requires_nvcc
def test_variant_inc_compiles_with_nvcc(tmp_path, rendered, nvcc_path):
    # with the score_mods of tests/test_gradients.py, whose gradient sites read fp32 / bf16 / fp16 tensors
    rendered = {**rendered, **{k: render_variant_inc(t, p) for k, (t, p) in
                               traced_gradient_variants(gradient_tensors(0)).items()}}
    inc = _write_includes(tmp_path, rendered)
    parts = ['#include "attngen_common.cuh"', _MATH]
    calls = []
    for k in rendered:
        parts.append(f"namespace v_{k} {{\n#include \"{k}.inc\"\n" + r"""
template <int BQ_, int BK_>
__device__ float exercise(const CapturedArgs& c, const TileArgs& t) {
  HeadCtx hc = head_ctx(c, t.b, t.h);
  int q = (int)threadIdx.x + t.QOFF, k = (int)threadIdx.y;
  RowCtx rc = row_ctx(c, hc, q);
  ColCtx cc = col_ctx(c, hc, k);
  float s = score_mod(0.5f * (float)threadIdx.z, c, hc, rc, cc, q, k);
  bool m = mask_mod(c, hc, rc, cc, q, k);
  int i = (int)blockIdx.x, j = (int)blockIdx.y;
  int r = kv_block_lo<BQ_, BK_>(c, t, i) + kv_block_hi<BQ_, BK_>(c, t, i) + kv_full_lo<BQ_, BK_>(c, t, i)
        + kv_full_hi<BQ_, BK_>(c, t, i);
  bool any = tile_any<BQ_, BK_>(c, t, i, j), all = tile_all<BQ_, BK_>(c, t, i, j);
  // the backward kernels' derivatives: d score_mod / d score, and every gradient site
  float g = score_mod_grad(0.25f * (float)threadIdx.z, c, hc, rc, cc, q, k);
  static_assert(grad_site_slot(ATTNGEN_NUM_GRAD_SITES) == -1, "grad_site_slot is a constant expression");
#pragma unroll
  for (int site = 0; site < ATTNGEN_NUM_GRAD_SITES; ++site) {
    long long offset;
    g += grad_site(site, 0.25f * (float)threadIdx.z, c, hc, rc, cc, q, k, offset) * (float)(offset + grad_site_slot(site));
  }
  return (m ? s : -INFINITY) + (float)r + (any ? 1.0f : 0.0f) + (all ? 2.0f : 0.0f) + g
       + ATTNGEN_HAS_SCORE_MOD + ATTNGEN_HAS_MASK + ATTNGEN_NEEDS_CLASSIFIER;
}
}  // namespace
""" + _UNDEF)
        calls.append(f"  acc += v_{k}::exercise<128, 128>(c, t) + v_{k}::exercise<64, 176>(c, t);")
    parts.append("__global__ void exercise_all(CapturedArgs c, TileArgs t, float* out) {\n  float acc = 0.0f;\n"
                 + "\n".join(calls) + "\n  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;\n}\n")
    cu = tmp_path / "all_variants.cu"
    cu.write_text("\n".join(parts))

    def compile_for(arch):
        out = tmp_path / f"all_{arch}.o"
        cmd = [nvcc_path, "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", *inc, "-c", str(cu), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        return arch, r, out

    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(compile_for, ["80", "90a"]))
    for arch, r, out in results:
        assert r.returncode == 0, f"nvcc sm_{arch} failed:\n{r.stderr[:8000]}"
        assert out.stat().st_size > 0


# ---------------------------------------------------------------------------------------------------------
# host semantics: the same text compiled by g++ computes what Python computes


def _c_bytes(name: str, t: torch.Tensor) -> str:
    base = t._base if t._base is not None else t
    assert base.is_contiguous() and base.storage_offset() == 0
    raw = base.reshape(-1).view(torch.uint8).tolist()
    return f"alignas(16) static const unsigned char {name}[{len(raw)}] = {{{', '.join(map(str, raw))}}};"


@pytest.mark.heavy  # derives 5 library variants and builds every case with g++: ~15 s on 2 cores
@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_variant_inc_host_semantics_match_python(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    tensors = make_tensors(seed)
    V = {**variants(tensors), **derived_variants()}
    rendered = {k: render_variant_inc(t, p) for k, (t, p) in V.items()}
    (tmp_path / "attngen_common.cuh").write_text(COMMON_STUB)
    (tmp_path / "variant_math.cuh").write_text(VARIANT_MATH.read_text())
    for k, text in rendered.items():
        (tmp_path / f"{k}.inc").write_text(text)
    QLEN_, KVLEN_, QOFF_ = 37, 150, rng.randint(0, 100)
    BQ_, BK_ = 16, 32
    b_, h_ = rng.randint(0, 1), rng.randint(0, 3)
    nqb, nkb = -(-QLEN_ // BQ_), -(-KVLEN_ // BK_)
    summaries = {f"s{n}": torch.randint(0, 6, (8,), dtype=torch.int32) for n in range(4)}
    scores = torch.randn(QLEN_, KVLEN_, dtype=torch.float64) * 20
    scores32 = scores.to(torch.float32)

    src = [r"""
#define __host__
#define __device__
#define __forceinline__ inline
#include <cmath>
#include <cstdio>
#include <cstring>
#include "attngen_common.cuh"
""" + _MATH]
    for k, (tv, _) in V.items():
        for ct in tv.captured:
            src.append(_c_bytes(f"{k}_{ct.name}", ct.tensor))
    for n, s in summaries.items():
        src.append(_c_bytes(f"sum_{n}", s))
    src.append(f"static const float S[{QLEN_ * KVLEN_}] = {{{', '.join(repr(float(x)) + 'f' for x in scores32.flatten().tolist())}}};")
    for k, (tv, preds) in V.items():
        setup = ["  CapturedArgs c; memset(&c, 0, sizeof(c));"] + param_setup(tv)
        for n, ct in enumerate(tv.captured):
            setup.append(f"  c.ptr[{n}] = {k}_{ct.name} + {ct.tensor.storage_offset() * ct.tensor.element_size()};")
            setup += [f"  c.stride[{n}][{d}] = {st};" for d, st in enumerate(ct.tensor.stride())]
        for n, s in enumerate(preds.summaries):
            setup.append(f"  c.summary[{n}] = sum_{s.name};")
        src.append(f"namespace v_{k} {{\n#include \"{k}.inc\"\n" + f"""
void run() {{
{chr(10).join(setup)}
  TileArgs t{{{QLEN_}, {KVLEN_}, {QOFF_}, {b_}, {h_}}};
  HeadCtx hc = head_ctx(c, {b_}, {h_});
  for (int r = 0; r < {QLEN_}; ++r) {{
    int q = r + {QOFF_};
    RowCtx rc = row_ctx(c, hc, q);
    for (int k = 0; k < {KVLEN_}; ++k) {{
      ColCtx cc = col_ctx(c, hc, k);
      const float sc = S[r * {KVLEN_} + k];
#if ATTNGEN_SCORE_REL
      const RelTerms rel = score_rel(c, hc, q - k, (float)(q - k));
      const float via_rel = rel.a * sc + rel.b;
#else
      const float via_rel = score_mod(sc, c, hc, rc, cc, q, k);
#endif
      printf("%.9g %d %.9g\\n", score_mod(sc, c, hc, rc, cc, q, k), (int)mask_mod(c, hc, rc, cc, q, k), via_rel);
    }}
  }}
  for (int i = 0; i < {nqb}; ++i)
    printf("%d %d %d %d\\n", kv_block_lo<{BQ_}, {BK_}>(c, t, i), kv_block_hi<{BQ_}, {BK_}>(c, t, i),
           kv_full_lo<{BQ_}, {BK_}>(c, t, i), kv_full_hi<{BQ_}, {BK_}>(c, t, i));
  for (int i = 0; i < {nqb}; ++i)
    for (int j = 0; j < {nkb}; ++j)
      printf("%d %d\\n", (int)tile_any<{BQ_}, {BK_}>(c, t, i, j), (int)tile_all<{BQ_}, {BK_}>(c, t, i, j));
  printf("END\\n");
}}
}}  // namespace
""" + _UNDEF)
    out = run_host_program(tmp_path, src, (f"  v_{k}::run();" for k in V)).split("END\n")

    q = torch.arange(QLEN_)[:, None] + QOFF_
    kv = torch.arange(KVLEN_)[None, :]
    i = torch.arange(nqb)
    j = torch.arange(nkb)
    tile_args = (BQ, BK, QLEN, KVLEN, QOFF, B, H)
    tile_vals = (BQ_, BK_, QLEN_, KVLEN_, QOFF_, b_, h_)
    for k, (tv, preds) in V.items():
        lines = out[list(V).index(k)].strip().split("\n")
        caps = {ct.name: ct.tensor for ct in tv.captured}
        # the values the host program ran with (param_setup): Python evaluates the same expressions with them
        values = param_values(tv.params)
        tv = dataclasses.replace(tv, score=tv.score.xreplace(values), mask=tv.mask.xreplace(values))
        preds = predicates_with_values(preds, values)
        el = torch.tensor([[float(x) for x in ln.split()] for ln in lines[: QLEN_ * KVLEN_]], dtype=torch.float64)
        got_score = el[:, 0].reshape(QLEN_, KVLEN_)
        got_mask = el[:, 1].reshape(QLEN_, KVLEN_).bool()
        want_score = torch.broadcast_to(torch.as_tensor(
            _py(tv.score, [SCORE, B, H, Q, KV], caps, scores32.to(torch.float64), b_, h_, q, kv), dtype=torch.float64), (QLEN_, KVLEN_))
        want_mask = torch.broadcast_to(torch.as_tensor(_py(tv.mask, [B, H, Q, KV], caps, b_, h_, q, kv)), (QLEN_, KVLEN_))
        assert torch.equal(got_mask, want_mask), f"seed {seed}: {k}: mask_mod differs at {(got_mask != want_mask).nonzero()[:5].tolist()}"
        torch.testing.assert_close(got_score, want_score, rtol=2e-6, atol=2e-5,
                                   msg=lambda m: f"seed {seed}: {k}: score_mod: {m}")
        # relative score mods: a(d) s + b(d) from score_rel, as the sm90 kernel applies them
        torch.testing.assert_close(el[:, 2].reshape(QLEN_, KVLEN_), want_score, rtol=2e-6, atol=2e-5,
                                   msg=lambda m: f"seed {seed}: {k}: score_rel: {m}")
        pos = QLEN_ * KVLEN_
        rows = torch.tensor([[int(x) for x in ln.split()] for ln in lines[pos: pos + nqb]])
        for col, e in enumerate((preds.kv_lo, preds.kv_hi, preds.kv_full_lo, preds.kv_full_hi)):
            want = torch.broadcast_to(torch.as_tensor(_py(e, (I,) + tile_args, summaries, i, *tile_vals)), (nqb,))
            assert rows[:, col].tolist() == want.tolist(), f"seed {seed}: {k}: kv bound {e}"
        pos += nqb
        rows = torch.tensor([[int(x) for x in ln.split()] for ln in lines[pos: pos + nqb * nkb]]).reshape(nqb, nkb, 2)
        for col, e in enumerate((preds.tile_any, preds.tile_all)):
            want = torch.broadcast_to(torch.as_tensor(
                _py(e, (I, J) + tile_args, summaries, i[:, None], j[None, :], *tile_vals)), (nqb, nkb))
            assert rows[..., col].bool().tolist() == want.bool().tolist(), f"seed {seed}: {k}: {e}"
