"""Hand-built variant.inc cases shared by tests/test_codegen.py (structure, nvcc, host semantics, determinism
across processes) and tests/gpu/test_codegen_gpu.py (device semantics): traced variants with hand-written block
predicates, their captured tensors, and the harness pieces that compile several variant.inc files together."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import sympy
import torch

from attngen.ir import BlockPredicates, CapturedTensor, Summary, TracedVariant
from attngen.mods import Variant
from attngen.printer import torch_function
from attngen.symbols import B, BK, BQ, H, I, J, KV, Q, QLEN, QOFF, SCORE, load

REPO = Path(__file__).resolve().parents[1]
REAL_COMMON = REPO / "attngen" / "templates" / "attngen_common.cuh"
VARIANT_MATH = REPO / "attngen" / "templates" / "variant_math.cuh"  # the ag_* helpers variant.inc includes

# Minimal stand-in for attngen/templates/attngen_common.cuh (used while that file does not exist),
# exactly the declarations of docs/kernel-interface.md.
COMMON_STUB = (Path(__file__).parent / "data" / "common_host_stub.cuh").read_text()

BIG = 2**30  # what an unbounded (+-oo) block bound prints as
fl = sympy.floor


# ---------------------------------------------------------------------------------------------------------
# hand-built variants and predicates


def causal_preds(needs_classifier=False):
    return BlockPredicates(
        kv_lo=sympy.Integer(0), kv_hi=fl((I * BQ + BQ - 1 + QOFF) / BK) + 1,
        kv_full_lo=sympy.Integer(0), kv_full_hi=fl((I * BQ + QOFF + 1) / BK),
        q_lo=fl((J * BK - QOFF) / BQ), q_hi=fl((QLEN + BQ - 1) / BQ),
        q_full_lo=sympy.ceiling((J * BK + BK - 1 - QOFF) / BQ), q_full_hi=fl((QLEN + BQ - 1) / BQ),
        tile_any=I * BQ + BQ - 1 + QOFF >= J * BK, tile_all=I * BQ + QOFF >= J * BK + BK - 1,
        needs_classifier=needs_classifier,
    )


def full_preds():
    return BlockPredicates(
        kv_lo=sympy.Integer(0), kv_hi=sympy.oo, kv_full_lo=sympy.Integer(0), kv_full_hi=sympy.oo,
        q_lo=sympy.Integer(0), q_hi=sympy.oo, q_full_lo=sympy.Integer(0), q_full_hi=sympy.oo,
        tile_any=sympy.true, tile_all=sympy.true, needs_classifier=False,
    )


def doc_preds():
    s0 = Summary("s0", "q", ("reduce", "t0", "q", "min", 1), True, "min doc id per q-block")
    s1 = Summary("s1", "kv", ("reduce", "t0", "q", "min", 1), True, "max doc id per kv-block")
    s2 = Summary("s2", "q", ("reduce", "t0", "q", "min", 1), True, "max doc id per q-block")
    s3 = Summary("s3", "kv", ("reduce", "t0", "q", "min", 1), True, "min doc id per kv-block")
    rng = sympy.Integer(0)
    any_ = sympy.And(load("s0", I, integer=True) <= load("s1", J, integer=True),
                     load("s3", J, integer=True) <= load("s2", I, integer=True))
    all_ = sympy.And(sympy.Eq(load("s0", I, integer=True), load("s2", I, integer=True)),
                     sympy.Eq(load("s3", J, integer=True), load("s1", J, integer=True)),
                     sympy.Eq(load("s0", I, integer=True), load("s1", J, integer=True)))
    return BlockPredicates(
        kv_lo=rng, kv_hi=sympy.oo, kv_full_lo=rng, kv_full_hi=rng, q_lo=rng, q_hi=sympy.oo, q_full_lo=rng,
        q_full_hi=rng, tile_any=any_, tile_all=all_, needs_classifier=True, summaries=(s0, s1, s2, s3))


def make_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    doc = torch.sort(torch.randint(0, 6, (200,), generator=g, dtype=torch.int32)).values
    doc2 = torch.sort(torch.randint(0, 4, (2, 200), generator=g, dtype=torch.int64), dim=1).values
    bias = torch.randn(4, 2048, generator=g).to(torch.bfloat16)
    hbias = torch.randn(160, 4, generator=g, dtype=torch.float16).t()  # (4, 160), strides (1, 4)
    return dict(doc=doc, doc2=doc2, bias=bias, hbias=hbias)


def variants(tensors):
    slope = 2 ** (-8 * (H + 1) / sympy.Integer(16))
    V = {}
    V["causal"] = (TracedVariant(Variant(), SCORE, Q >= KV), causal_preds())
    V["softcap"] = (TracedVariant(Variant(), 30 * sympy.tanh(SCORE / 30), sympy.true), full_preds())
    V["alibi"] = (TracedVariant(Variant(), SCORE + slope * (KV - Q), sympy.true), full_preds())
    V["document"] = (
        TracedVariant(Variant(), SCORE, sympy.Eq(load("t0", Q, integer=True), load("t0", KV, integer=True)),
                      (CapturedTensor("t0", tensors["doc"], torch.int32, 1),)),
        doc_preds())
    V["chunked"] = (TracedVariant(Variant(), SCORE, sympy.And(sympy.Eq(fl(Q / 256), fl(KV / 256)), Q >= KV)),
                    causal_preds(needs_classifier=True))
    V["bias"] = (
        TracedVariant(Variant(), SCORE + load("t0", H, Q + KV + 17), sympy.true,
                      (CapturedTensor("t0", tensors["bias"], torch.bfloat16, 2),)),
        full_preds())
    # relative-position table: q - kv is negative above the diagonal and wraps as torch indexing does
    V["relbias"] = (
        TracedVariant(Variant(), SCORE + load("t0", H, Q - KV), sympy.true,
                      (CapturedTensor("t0", tensors["bias"], torch.bfloat16, 2, wrapped_dims=((1, 2048),)),)),
        full_preds())
    # everything at once: softcap of alibi + a per-head fp16 bias, dilated head-dependent window,
    # per-batch int64 documents
    V["compound"] = (
        TracedVariant(
            Variant(),
            30 * sympy.tanh((SCORE + slope * (KV - Q) + load("t1", H, sympy.Mod(Q, 160))) / 30),
            sympy.And(Q >= KV, sympy.Eq(sympy.Mod(Q - KV, 3), 0), Q - KV < 16 * (H + 1),
                      sympy.Eq(load("t0", B, Q, integer=True), load("t0", B, KV, integer=True))),
            (CapturedTensor("t0", tensors["doc2"], torch.int64, 2), CapturedTensor("t1", tensors["hbias"], torch.float16, 2)),
        ),
        causal_preds(needs_classifier=True))
    # the float functions beyond tanh/exp/log (issue 15): arguments kept where fp32 is well conditioned
    from sympy.codegen.cfunctions import expm1, log1p

    V["mathfns"] = (
        TracedVariant(
            Variant(),
            sympy.atan(SCORE) + sympy.tan(sympy.tanh(SCORE / 40)) + log1p(sympy.Abs(SCORE) / 10)
            + expm1(-sympy.Abs(SCORE) / 30) + sympy.erf(SCORE / 8) + sympy.sign(SCORE) * sympy.sign(Q - KV)
            + (sympy.Abs(SCORE) / 10) ** sympy.Float(1.5) + sympy.Abs(SCORE) ** sympy.Float(0.25),
            sympy.true),
        full_preds())
    return V


# ---------------------------------------------------------------------------------------------------------
# harness pieces


def param_setup(traced) -> list:
    """C statements filling CapturedArgs `c` with the runtime parameters' current values (launch.param_fields)."""
    return [f"  c.{'i' if p.integer else 'f'}param[{p.slot}] = {p.param.value!r}{'' if p.integer else 'f'};"
            for p in traced.params]


def write_includes(tmp: Path, rendered) -> list:
    """Write each rendered variant.inc as <name>.inc into tmp; nvcc -I flags for them and the common header."""
    if REAL_COMMON.exists():
        inc = ["-I", str(REAL_COMMON.parent)]
    else:
        (tmp / "attngen_common.cuh").write_text(COMMON_STUB)
        inc = ["-I", str(tmp)]
    for k, text in rendered.items():
        (tmp / f"{k}.inc").write_text(text)
    return inc


UNDEF = ("#undef ATTNGEN_HAS_SCORE_MOD\n#undef ATTNGEN_HAS_MASK\n#undef ATTNGEN_NEEDS_CLASSIFIER\n"
         "#undef ATTNGEN_SCORE_HEAD_SCALE\n#undef ATTNGEN_SCORE_REL\n#undef ATTNGEN_SCORE_REL_LOADS\n"
         "#undef ATTNGEN_SCORE_REL_SCALES\n#undef ATTNGEN_SCORE_REL_LINEAR\n#undef ATTNGEN_SCORE_REL_A_CONST\n"
         "#undef ATTNGEN_NUM_GRAD_SITES\n#undef ATTNGEN_KV_PARTS\n#undef ATTNGEN_Q_PARTS\n")
# These harnesses include several variant.inc files, each inside its own namespace. Each .inc includes
# variant_math.cuh (#pragma once); included first at global scope, its helpers are visible to all of them.
MATH = '#include "variant_math.cuh"'


def py_eval(expr, args, tensors, *vals):
    """What Python computes for `expr` (attngen.printer's torch evaluator; +-oo printed as +-BIG)."""
    expr = sympy.sympify(expr).xreplace({sympy.oo: sympy.Integer(BIG), -sympy.oo: sympy.Integer(-BIG)})
    return torch_function(expr, args)(*vals, tensors=tensors)


# ---------------------------------------------------------------------------------------------------------
# score_mods with gradients (tests/test_gradients.py; the nvcc compile test of tests/test_codegen.py)

REL_L = 64  # relative-position table of 2 * REL_L - 1 entries per head: q_idx - kv_idx + REL_L - 1 wraps below 0


def gradient_tensors(seed):
    """Captured tensors of gradient_variants: fp32 / bf16 / fp16, contiguous and transposed (strides that are
    not row-major), and an int32 table whose values index another tensor."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        slopes=torch.rand(4, generator=g) + 0.5,
        table=torch.randn(2 * REL_L - 1, 4, generator=g).t(),  # (4, 127), strides (1, 4)
        pair=torch.randn(160, 64, generator=g).to(torch.bfloat16).t(),  # (64, 160) bf16, strides (1, 64)
        head_bias=torch.randn(4, generator=g, dtype=torch.float16),
        doc=torch.randint(0, 5, (160,), generator=g, dtype=torch.int32),
        doc_bias=torch.randn(4, 5, generator=g),
    )


def gradient_variants(tensors):
    """name -> ScoreMod whose derivatives (score_mod_grad, grad_site) the tests check against torch autograd."""
    import attngen

    t = tensors
    L = REL_L

    def relpos(s, b, h, q, kv):
        return s + t["table"][h, q - kv + L - 1]

    def where_pair(s, b, h, q, kv):
        return torch.where(s > 0, s * t["slopes"][h], 0.1 * s + t["pair"][q, kv])

    def math_fns(s, b, h, q, kv):
        return (torch.atan(s / 4) + torch.erf(s / 8) + torch.tanh(s / 10) ** 2 + (abs(s) / 10) ** 1.5
                + torch.clamp(s, -5, 5) * t["slopes"][h] + torch.tan(s / 100))

    def pow_slope(s, b, h, q, kv):
        return t["slopes"][h] ** (s / 20) + torch.exp(-abs(s) / 30) * torch.log1p(abs(s))

    def sigmoid_max(s, b, h, q, kv):
        return 4 * torch.sigmoid(s) + torch.maximum(s / 2, t["pair"][q, kv]) + torch.expm1(s / 50)

    def repeated(s, b, h, q, kv):
        return s * t["head_bias"][h] + t["head_bias"][h] ** 2 - s * torch.sign(s) * t["head_bias"][h]

    def indirect(s, b, h, q, kv):  # the float table's index is read from an int table: no site for the int one
        return s + t["doc_bias"][h, t["doc"][kv]] * (s % 7.0) + s // 3

    return {
        "g_softcap": attngen.softcap(30.0),
        "g_alibi": attngen.alibi(4),
        "g_alibi_slopes": attngen.alibi(t["slopes"]),
        "g_relpos": attngen.ScoreMod(relpos, "relpos"),
        "g_div_square": attngen.ScoreMod(lambda s, b, h, q, kv: s / (1 + 1e-3 * (q - kv) ** 2), "div_square"),
        "g_where_pair": attngen.ScoreMod(where_pair, "where_pair"),
        "g_math_fns": attngen.ScoreMod(math_fns, "math_fns"),
        "g_pow_slope": attngen.ScoreMod(pow_slope, "pow_slope"),
        "g_sigmoid_max": attngen.ScoreMod(sigmoid_max, "sigmoid_max"),
        "g_repeated": attngen.ScoreMod(repeated, "repeated"),
        "g_indirect": attngen.ScoreMod(indirect, "indirect"),
    }


def traced_gradient_variants(tensors):
    """name -> (TracedVariant, BlockPredicates) of gradient_variants (no masks: full predicates)."""
    from attngen.trace import trace

    out = {}
    for k, m in gradient_variants(tensors).items():
        tv = trace(Variant(score_mod=m))
        assert tv.mask is sympy.true, k
        out[k] = (tv, full_preds())
    return out


def run_host_program(tmp_path: Path, src: list, runs) -> str:
    """Compile the C++ pieces `src` with g++ (headers found in tmp_path), a main() calling `runs` (statements)
    in order, and run it: its stdout."""
    src = [*src, "int main() {\n" + "\n".join(runs) + "\n  return 0;\n}\n"]
    (tmp_path / "host.cpp").write_text("\n".join(src))
    exe = tmp_path / "host"
    r = subprocess.run([shutil.which("g++"), "-std=c++17", "-O1", "-I", str(tmp_path), "-o", str(exe),
                        str(tmp_path / "host.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:8000]
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def check_rendering_across_hash_seeds(factory: str, rendered: dict) -> None:
    """variant.inc of every case of `factory` (an expression over this module, named t, giving {name: (traced,
    predicates)}) rendered in fresh interpreters under two PYTHONHASHSEEDs is `rendered` ({name: text}, what this
    process rendered)."""
    import hashlib

    from helpers import run_with_hash_seeds

    code = (
        "import sys, hashlib; sys.path.insert(0, %r)\n"
        "import codegen_cases as t\n"
        "from attngen.codegen import render_variant_inc\n"
        "V = %s\n"
        "print('\\n'.join(hashlib.sha256(render_variant_inc(a, b).encode()).hexdigest() for a, b in V.values()))\n"
    ) % (str(Path(__file__).parent), factory)
    want = "\n".join(hashlib.sha256(t.encode()).hexdigest() for t in rendered.values())
    for seed, (rc, out, err) in run_with_hash_seeds(code, ("0", "777"), cwd=REPO).items():
        assert rc == 0, err
        assert out.strip() == want, f"PYTHONHASHSEED={seed}"
