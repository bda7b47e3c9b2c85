"""Runtime parameters (attngen/params.py): one derivation and one kernel serve every value.

Library numbers (windows, chunk and prefix lengths, local bounds, dilation, softcap's cap, ALiBi's head count)
are kernel arguments by default. Checked here: the block predicates derived ONCE, symbolic in the parameters,
are exact (interval families) and sound against brute force for many values; the kernel key, fingerprint and
analysis record do not depend on the value (a specialised value does); the generated code reads the values
from CapturedArgs (run under g++ for several values); bad values fail with the problem and the fix.
"""
import random
import shutil
import threading

import pytest
import sympy
import torch

import attngen
from attngen import analysis, analysis_cache, launch
from attngen.analysis import analyze
from attngen.blockmap import EMPTY, FULL, _compile_evaluators, _runtime_arrays
from attngen.codegen import render_variant_inc
from attngen.fingerprint import fingerprint
from attngen.params import ParamValueError, pinned_values
from codegen_cases import COMMON_STUB, MATH, VARIANT_MATH, param_setup, run_host_program
from helpers import param_values, predicates_with_values, tile_classes

GXX = shutil.which("g++")


def _brute(variant, q_len, kv_len, BQ, BK, q_offset):
    m = attngen.reference.dense_mask(attngen.Variant(mask_mod=variant.mask_mod), 1, 1, q_len, kv_len,
                                     q_offset=q_offset)[0, 0]
    return tile_classes(m, BQ, BK)


def _dilated_runtime(w, d):
    """dilated() with its dilation as a runtime parameter too (the library keeps it in the build)."""
    wp, dp = attngen.param("window", w, minimum=1), attngen.param("dilation", d, minimum=1)

    def dilated_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < wp) & ((q_idx - kv_idx) % dp == 0)

    return attngen.MaskMod(dilated_mask, "dilated_runtime")


def _families():
    """name -> (variant factory taking the values, value tuples to try, exact)."""
    sw = lambda w: attngen.sliding_window(w)  # noqa: E731
    return {
        "sliding_window": (lambda w: sw(w), [(1,), (7,), (64,), (129,), (1000,)], True),
        "local": (lambda a, b: attngen.local(a, b), [(0, 0), (3, 40), (64, 0), (200, 17)], True),
        "local_left": (lambda a: attngen.local(a, None), [(0,), (33,), (500,)], True),
        "causal_and_local": (lambda a, b: attngen.causal() & attngen.local(a, b), [(1, 5), (50, 0), (300, 9)], True),
        "prefix_lm": (lambda n: attngen.prefix_lm(n), [(0,), (1,), (70,), (256,), (2000,)], True),
        "chunked": (lambda c: attngen.chunked(c), [(1,), (16,), (100,), (128,), (1000,)], True),
        "block_diagonal": (lambda c: attngen.block_diagonal(c), [(1,), (37,), (64,), (300,)], True),
        "dilated": (lambda w: attngen.dilated(w, 3), [(64,), (100,), (257,), (5,), (2,)], True),
        "dilated_runtime": (_dilated_runtime, [(64, 1), (100, 3), (257, 8), (5, 4), (40, 2)], True),
        "chunked_or_local": (lambda c, a, b: attngen.chunked(c) | attngen.local(a, b),
                             [(130, 30, 10), (64, 0, 0), (200, 100, 3)], False),
        "prefix_or_window": (lambda n, w: attngen.prefix_lm(n) | sw(w), [(64, 300), (0, 1), (500, 40)], True),
    }


def _shapes(rng, n):
    for _ in range(n):
        BQ, BK = rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128])
        q_len = rng.choice([1, 7, rng.randint(1, 600), BQ * rng.randint(1, 4)])
        kv_len = rng.choice([1, rng.randint(1, 600), BK * rng.randint(1, 4), q_len])
        yield q_len, kv_len, BQ, BK, rng.choice([0, rng.randint(0, 200), max(0, kv_len - q_len)])


@pytest.mark.parametrize("name", list(_families()))
def test_one_derivation_is_exact_and_sound_for_every_value(name):
    make, values, exact = _families()[name]
    mask = make(*values[0])
    traced, preds = analyze(mask)
    symbols = {p.symbol for p in traced.params}
    assert len(traced.params) == len(values[0]) and symbols
    assert not preds.notes, "the symbolic derivation ran out of its work budget (a coarse map)"
    assert symbols & (preds.kv_lo.free_symbols | preds.kv_hi.free_symbols | preds.tile_any.free_symbols), \
        "the predicates do not depend on the parameters: a value was baked in"
    rng = random.Random(name)
    for vals in values:
        for p, v in zip(traced.params, vals):
            p.param.set(v)
        assert analyze(mask)[1] is preds  # one derivation serves every value
        valued = predicates_with_values(preds, param_values(traced.params))
        assert not (valued.tile_any.free_symbols & symbols)
        for q_len, kv_len, BQ, BK, q_offset in _shapes(rng, 6):
            got = attngen.block_map(mask, q_len, kv_len, (BQ, BK), q_offset=q_offset)
            want = _brute(attngen.Variant(mask_mod=mask), q_len, kv_len, BQ, BK, q_offset)
            ctx = f"{name}{vals} q_len={q_len} kv_len={kv_len} block=({BQ},{BK}) q_offset={q_offset}"
            assert not ((got == EMPTY) & (want != EMPTY)).any(), f"unsound EMPTY ({ctx})"
            assert not ((got == FULL) & (want != FULL)).any(), f"unsound FULL ({ctx})"
            if exact:
                assert torch.equal(got, want), f"inexact ({ctx})"
            # the backward's transposed ranges, from the same derivation
            arrays = _runtime_arrays(traced, valued, BQ, BK, q_len, kv_len, q_offset, {})
            ev = _compile_evaluators(valued)
            nqb, nkb = want.shape
            j = torch.arange(nkb)
            lo, hi, flo, fhi = [torch.as_tensor(f(j, BQ, BK, q_len, kv_len, q_offset, 0, 0, tensors=arrays))
                                .expand(nkb).clamp(0, nqb) for f in ev.q_range]
            i = torch.arange(nqb)[:, None]
            assert not ((want != EMPTY) & ((i < lo) | (i >= hi))).any(), f"kept tile outside its q range ({ctx})"
            assert not ((want != FULL) & (i >= flo) & (i < fhi)).any(), f"non-full tile in the full q range ({ctx})"


def test_values_share_the_kernel_key_and_fingerprint_specialised_values_do_not():
    def facts(v):
        traced, preds = analyze(attngen.Variant(**v))
        return traced.canonical(), fingerprint(attngen.Variant(**v)).digest

    for make in (lambda x: dict(mask_mod=attngen.sliding_window(x)), lambda x: dict(mask_mod=attngen.chunked(x)),
                 lambda x: dict(score_mod=attngen.softcap(float(x))), lambda x: dict(score_mod=attngen.alibi(x))):
        assert facts(make(16)) == facts(make(4096))
    assert facts(dict(mask_mod=attngen.sliding_window(16, specialize=True)))[0] != \
        facts(dict(mask_mod=attngen.sliding_window(4096, specialize=True)))[0]
    assert facts(dict(mask_mod=attngen.sliding_window(16, specialize=True)))[0] != \
        facts(dict(mask_mod=attngen.sliding_window(16)))[0]
    a, b = attngen.compile(window=128, softcap=30.0), attngen.compile(window=65536, softcap=50.0)
    assert a.variant.key_name == b.variant.key_name == "softcap(cap)+sliding_window(window)"
    assert a.name == "softcap(30)+sliding_window(128)" and b.name == "softcap(50)+sliding_window(65536)"
    assert a.facts.canonical == b.facts.canonical


def _forget_in_memory():
    with analysis._LOCK:
        analysis._ANALYSIS.clear()
    with analysis_cache._LOCK:
        analysis_cache._RECORDS.clear()


def test_the_analysis_record_serves_every_value(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    _forget_in_memory()
    try:
        first = attngen.compile(mask_mod=attngen.chunked(256) | attngen.sliding_window(128))
        assert first._analysis is not None  # analysed here, record written
        assert list((tmp_path / "cache" / analysis_cache.RECORD_DIR).iterdir())
        second = attngen.compile(mask_mod=attngen.chunked(8192) | attngen.sliding_window(4096))
        assert second._analysis is None  # from the record: no trace, no derivation
        assert second.facts.canonical == first.facts.canonical
        assert [p.param.value for p in second.facts.params] == [8192, 4096]  # bound to the live parameters
        assert second.params[1] is not first.params[1]
        # a specialised value is another record
        third = attngen.compile(mask_mod=attngen.chunked(256, specialize=True) | attngen.sliding_window(128))
        assert third._analysis is not None and third.facts.canonical != first.facts.canonical
    finally:
        _forget_in_memory()


def test_reference_runs_the_current_value():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 32, dtype=torch.float64) for _ in range(3))
    attn = attngen.compile(score_mod=attngen.softcap(5.0), mask_mod=attngen.chunked(64) | attngen.sliding_window(30))
    cap, size, window = attn.params[2], attn.params[0], attn.params[1]
    assert (cap.name, size.name, window.name) == ("cap", "size", "window")
    for c, s, w in ((5.0, 64, 30), (0.5, 17, 1), (40.0, 200, 150)):
        cap.set(c), size.set(s), window.set(w)
        baked = attngen.compile(score_mod=attngen.softcap(c, specialize=True),
                                mask_mod=attngen.chunked(s, specialize=True) | attngen.sliding_window(w, specialize=True))
        torch.testing.assert_close(attn(q, k, v), baked(q, k, v), rtol=0, atol=0)


def test_user_mods_take_runtime_parameters():
    cap = attngen.param("cap", 20.0)
    width = attngen.param("width", 48, minimum=1)

    def capped(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx - kv_idx < width, cap * torch.tanh(score / cap), score - 1.0)

    traced, _ = analyze(attngen.Variant(score_mod=capped))
    assert [(p.label, p.integer, p.minimum) for p in traced.params] == [("width", True, 1), ("cap", False, None)]
    s = torch.linspace(-50, 50, 11)
    q, kv = torch.arange(11) + 40, torch.zeros(11, dtype=torch.long)
    want = torch.where(q - kv < 48, 20.0 * torch.tanh(s / 20.0), s - 1.0)
    torch.testing.assert_close(capped(s, 0, 0, q, kv), want)
    # a plain Python constant in a user mod is baked in, as before
    traced_const, _ = analyze(attngen.Variant(score_mod=lambda s_, b, h, q_, k_: 20.0 * torch.tanh(s_ / 20.0)))
    assert traced_const.params == ()


def test_bad_values_name_the_problem_and_the_fix():
    w = attngen.sliding_window(128).fn.__closure__[0].cell_contents
    assert isinstance(w, attngen.RuntimeParam)
    for bad, words in ((0, "must be in [1, 1073741823]"), (2**30, "int32"), (2**31, "int32"),
                       (1.5, "made from an int"), (True, "must be an int")):
        with pytest.raises(ParamValueError, match=words.replace("[", r"\[").replace("]", r"\]")) as e:
            w.set(bad)
        assert "pass" in str(e.value)
    cap = attngen.softcap(30.0).fn.__closure__[0].cell_contents
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e-40, "30"):
        with pytest.raises(ParamValueError, match="cap"):
            cap.set(bad)
    baked = attngen.sliding_window(128, specialize=True).fn.__closure__[0].cell_contents
    with pytest.raises(ParamValueError, match="specialize=True"):
        baked.set(256)
    # a value smuggled past set() is still refused before it reaches a kernel
    traced, _ = analyze(attngen.sliding_window(64))
    traced.params[0].param._value = -5
    with pytest.raises(ParamValueError, match="window"):
        launch.param_fields(traced.params)
    with pytest.raises(attngen.VariantArgumentError, match="sliding_window"):
        attngen.sliding_window(0)  # construction keeps its own message


def test_too_many_parameters_names_the_fix():
    ps = [attngen.param(f"w{k}", k + 1, minimum=1) for k in range(9)]

    def many(b, h, q_idx, kv_idx):
        out = q_idx >= kv_idx
        for p in ps:
            out = out & (q_idx - kv_idx < p)
        return out

    with pytest.raises(attngen.UnsupportedOperation, match="specialize=True"):
        attngen.trace(attngen.Variant(mask_mod=many))


def test_param_fields_fill_the_slots_by_kind():
    traced, _ = analyze(attngen.Variant(score_mod=attngen.softcap(12.5), mask_mod=attngen.local(300, 7)))
    fields = launch.param_fields(traced.params)
    packed = launch._PACK_TAIL.pack(*launch._captured_fields(torch.device("cpu"), (), (), fields))
    c = launch.CapturedArgs.from_buffer_copy(packed)
    assert list(c.iparam[:2]) == [300, 7] and c.fparam[2] == 12.5 and list(c.iparam[2:]) == [0] * 6


def test_generated_code_reads_the_slots_not_the_values():
    traced, preds = analyze(attngen.Variant(score_mod=attngen.softcap(30.0), mask_mod=attngen.sliding_window(1024)))
    inc = render_variant_inc(traced, preds)
    assert "c.iparam[0]" in inc and "c.fparam[1]" in inc and "1024" not in inc
    assert not any(s.name == "p0" for e in (traced.mask,) for s in e.free_symbols) or "p0" not in inc.split("#pragma once")[1]
    baked, bpreds = analyze(attngen.Variant(score_mod=attngen.softcap(30.0, specialize=True),
                                            mask_mod=attngen.sliding_window(1024, specialize=True)))
    binc = render_variant_inc(baked, bpreds)
    assert "iparam" not in binc and "fparam" not in binc and "1024" in binc


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_one_variant_inc_runs_every_value_under_gxx(tmp_path):
    """The printed code with the values in CapturedArgs (as launch.py passes them) against the mods on tensors."""
    attn = attngen.compile(score_mod=attngen.softcap(7.0), mask_mod=attngen.chunked(48) | attngen.sliding_window(20))
    traced, preds = attn.traced, attn.predicates
    (tmp_path / "attngen_common.cuh").write_text(COMMON_STUB)
    (tmp_path / "variant_math.cuh").write_text(VARIANT_MATH.read_text())
    (tmp_path / "v.inc").write_text(render_variant_inc(traced, preds, fast_tanh=False, fast_exp2=False, fast_div=False))
    QL, KL, QOFF = 70, 90, 11
    S = torch.linspace(-40, 40, QL * KL).reshape(QL, KL)
    values = [(48, 20, 7.0), (5, 1, 0.25), (64, 70, 30.0)]
    src = ["#define __host__\n#define __device__\n#define __forceinline__ inline\n#include <cstdio>\n#include <cstring>\n"
           '#include <cmath>\n#include "attngen_common.cuh"\n' + MATH,
           f"static const float S[{QL * KL}] = {{{', '.join(repr(float(x)) + 'f' for x in S.flatten().tolist())}}};"]
    src.append('namespace v {\n#include "v.inc"\nvoid run(const CapturedArgs& c) {' + f"""
  HeadCtx hc = head_ctx(c, 0, 0);
  for (int r = 0; r < {QL}; ++r) {{
    RowCtx rc = row_ctx(c, hc, r + {QOFF});
    for (int k = 0; k < {KL}; ++k) {{
      ColCtx cc = col_ctx(c, hc, k);
      printf("%.6g %d\\n", score_mod(S[r * {KL} + k], c, hc, rc, cc, r + {QOFF}, k), (int)mask_mod(c, hc, rc, cc, r + {QOFF}, k));
    }}
  }}
}}
}}
""")
    runs = []
    for vals in values:  # one variant.inc, the values in CapturedArgs as launch.param_fields puts them
        for p, v in zip(attn.params, vals):
            p.set(v)
        runs.append("  {\n  CapturedArgs c; memset(&c, 0, sizeof(c));\n" + "\n".join(param_setup(traced)) + "\n  v::run(c);\n  }")
    lines = run_host_program(tmp_path, src, runs).splitlines()
    q = torch.arange(QL)[:, None] + QOFF
    kv = torch.arange(KL)[None, :]
    for n, vals in enumerate(values):
        for p, v in zip(attn.params, vals):
            p.set(v)
        got = torch.tensor([[float(x) for x in ln.split()] for ln in lines[n * QL * KL:(n + 1) * QL * KL]])
        want_s = attn.variant.score_mod(S, 0, 0, q, kv).flatten()
        want_m = attn.variant.mask_mod(0, 0, q, kv).flatten()
        torch.testing.assert_close(got[:, 0], want_s.float(), rtol=1e-5, atol=1e-5, msg=lambda m: f"values {vals}: {m}")
        assert torch.equal(got[:, 1].bool(), want_m), f"values {vals}: mask_mod differs"


def test_predicates_carry_the_parameter_assumptions():
    traced, _ = analyze(attngen.Variant(score_mod=attngen.softcap(3.0), mask_mod=attngen.prefix_lm(10)
                                        | attngen.sliding_window(5)))
    syms = {p.label: p.symbol for p in traced.params}
    assert syms["window"].is_integer and syms["window"].is_positive
    assert syms["prefix"].is_integer and syms["prefix"].is_nonnegative and syms["prefix"].is_positive is None
    assert syms["cap"].is_positive and syms["cap"].is_integer is None
    assert isinstance(syms["cap"], sympy.Symbol)


# ----------------------------------------------------------------------------------------------------------
# threads: a trace, and a pinned backward, are per thread


def _sliding_window_by_hand(q, k, v, window):
    """Causal sliding-window attention in plain torch (kv in (q - window, q]), float64."""
    L = q.shape[2]
    qi, ki = torch.arange(L)[:, None], torch.arange(L)[None, :]
    keep = (qi >= ki) & (qi - ki < window)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(torch.where(keep, s, -torch.inf), -1) @ v


def test_a_trace_in_one_thread_leaves_parameters_in_another_alone():
    """While thread A traces (blocked inside its mask_mod), thread B compiles and runs a parameterised variant on
    CPU tensors. The tracer's symbolic readers used to be process-global: B's mod read A's proxy for its window
    (UnsupportedOperation in B) and A's trace gained a 'window' slot it never read."""
    width = attngen.param("a_width", 5, minimum=1)
    inside_trace, b_finished = threading.Event(), threading.Event()

    def slow_mask(b, h, q_idx, kv_idx):
        kept = (q_idx >= kv_idx) & (q_idx - kv_idx < width)
        inside_trace.set()
        b_finished.wait(timeout=120)  # a deadlock guard only: B sets it as soon as it is done
        return kept & (kv_idx >= 0)

    traced_a = {}

    def thread_a():
        try:
            traced_a["traced"] = attngen.trace(attngen.Variant(mask_mod=slow_mask))
        except BaseException as e:  # reported by the main thread
            traced_a["error"] = e
            inside_trace.set()  # B need not wait for a trace that failed

    a = threading.Thread(target=thread_a, name="tracer-A")
    a.start()
    try:
        assert inside_trace.wait(timeout=120), "thread A never reached its mask_mod"
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.float64) for _ in range(3))
        attn = attngen.compile(window=16)
        got = attn(q, k, v)
        with torch.enable_grad():  # the autograd custom ops too (they pin the values in this thread)
            qg = q.clone().requires_grad_()
            got_grad_path = attn(qg, k, v)
    finally:
        b_finished.set()
        a.join(timeout=120)
    assert not a.is_alive()
    assert "error" not in traced_a, traced_a.get("error")
    want = _sliding_window_by_hand(q, k, v, 16)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad_path.detach(), want, rtol=1e-12, atol=1e-12)
    assert [p.label for p in traced_a["traced"].params] == ["a_width"]


def test_pinned_values_are_per_thread_nested_and_restored():
    window, cap = attngen.param("window", 8, minimum=1), attngen.param("cap", 2.0)
    other_thread_saw = []
    with pinned_values([window, cap], [32, 4.0]):
        assert (window.value, cap.value, window + 0, cap * 1) == (32, 4.0, 32, 4.0)
        reader = threading.Thread(target=lambda: other_thread_saw.append((window.value, cap.value)))
        reader.start()
        reader.join()
        with pinned_values([window], [2]):
            assert (window.value, cap.value) == (2, 4.0)
        assert window.value == 32
        window.set(100)  # set() changes the parameter, not what a pinned block reads
        assert window.value == 32
    assert other_thread_saw == [(8, 2.0)]
    assert (window.value, cap.value) == (100, 2.0)
    with pytest.raises(RuntimeError, match="inside"):
        with pinned_values([window], [7]):
            raise RuntimeError("inside")
    assert window.value == 100
    with pytest.raises(ParamValueError, match="'window'"):
        pinned_values([window], [0]).__enter__()  # checked like set(): the kernels cannot take a window of 0
    assert window.value == 100
    with pytest.raises(ValueError, match="one per parameter"):
        pinned_values([window, cap], [7]).__enter__()


def test_a_parameter_compares_as_its_number():
    w = attngen.param("w", 64)
    assert w == 64 and not (w != 64) and w != 65 and not (w == 65)
    assert w != attngen.param("w", 64) and w == w  # two parameters: equal only to themselves
    assert len({w, attngen.param("w", 64)}) == 2  # hashed by identity
    traced, _ = analyze(attngen.Variant(mask_mod=lambda b, h, q, kv: (w == q - kv) | (q == kv)))
    assert len(traced.params) == 1  # the == inside a mod is traced, not decided by identity


def test_union_of_many_disjuncts_with_parameters_renders_and_stays_sound():
    """Five disjuncts with runtime parameters: the walk groups them into four parts, and neither codegen nor
    block_map substitutes values into the (large) tile expressions."""
    mod = attngen.prefix_lm(20) | attngen.sliding_window(45) | attngen.chunked(64) | attngen.local(3, 5)
    traced, preds = analyze(mod)
    assert len(preds.kv_parts) == 4 and len(traced.params) == 5
    text = render_variant_inc(traced, preds)
    assert "#define ATTNGEN_KV_PARTS 4" in text and "c.iparam[" in text
    rng = random.Random(5)
    for vals in (dict(prefix=20, window=45, size=64, left=3, right=5), dict(prefix=1, window=200, size=7, left=0,
                                                                             right=40)):
        for p in traced.params:
            p.param.set(vals[p.label])
        for q_len, kv_len, BQ, BK, q_offset in _shapes(rng, 4):
            got = attngen.block_map(mod, q_len, kv_len, (BQ, BK), q_offset=q_offset)
            want = _brute(attngen.Variant(mask_mod=mod), q_len, kv_len, BQ, BK, q_offset)
            assert not ((got == EMPTY) & (want != EMPTY)).any() and not ((got == FULL) & (want != FULL)).any()


def test_a_direct_launch_without_the_variants_captured_tensors_is_refused():
    """launch.forward / launch.backward without the captured tensors or block summaries a library's variant reads
    would hand its kernel null pointers (an illegal address on the GPU): refused before any input check, naming the
    fix."""
    lib = launch._Library.__new__(launch._Library)
    lib.path, lib.param_count, lib.captured_count, lib.summary_count = "libattngen_bwd.so", 0, 1, 4
    x = torch.zeros(1)
    for captured, summaries in (((), ()), ((x,), ()), ((x,), (x, x, x))):
        for call in (lambda: launch.forward(lib, x, x, x, captured=captured, summaries=summaries),
                     lambda: launch.backward(lib, x, x, x, x, x, x, captured=captured, summaries=summaries)):
            with pytest.raises(attngen.InputError, match=r"reads 1 captured tensor\(s\) and 4 block summaries.*"
                                                         r"attn\.facts\.captured"):
                call()


def test_a_direct_launch_without_parameter_values_is_refused():
    """launch.forward / launch.backward with params=None on a library whose variant reads parameters would run them
    as 0 (a window of 0 masks everything): refused before any input check, naming the fix."""
    lib = launch._Library.__new__(launch._Library)  # no kernel needed: the check comes first
    lib.path, lib.param_count = "libattngen_fwd.so", 1
    x = torch.zeros(1)
    for call in (lambda: launch.forward(lib, x, x, x), lambda: launch.backward(lib, x, x, x, x, x, x)):
        with pytest.raises(attngen.InputError, match=r"params=attn._param_fields\(\)"):
            call()
