"""Analysis records: the fingerprint of a variant's mods (fingerprint.py), the record of its analysis on disk
(analysis_cache.py), and a compile served from a record: no trace, no sympy, the same kernel cache key."""
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

torch = pytest.importorskip("torch")
import attngen  # noqa: E402
from attngen import analysis, analysis_cache  # noqa: E402
from attngen.cache import cache_key  # noqa: E402
from attngen.fingerprint import fingerprint  # noqa: E402
from attngen.jit import spec as spec_module  # noqa: E402

WINDOW = 64  # read by window_from_global below: a module global is part of the fingerprint


def window_from_global(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


def digest(**options):
    fp = fingerprint(attngen.make_variant(**options))
    return None if fp is None else fp.digest


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache root and no in-memory analysis: what a new process sees."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    forget_in_memory()
    yield root
    forget_in_memory()


def forget_in_memory():
    with analysis._LOCK:
        analysis._ANALYSIS.clear()
    with analysis_cache._LOCK:
        analysis_cache._RECORDS.clear()


@pytest.fixture
def trace_calls(monkeypatch):
    """The number of trace() calls the analysis makes from now on."""
    calls = []
    real = analysis.trace

    def counting(variant):
        calls.append(variant)
        return real(variant)

    monkeypatch.setattr(analysis, "trace", counting)
    return calls


def records(root):
    d = root / analysis_cache.RECORD_DIR
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# ----------------------------------------------------------------------------------------------------------
# fingerprint


def test_fingerprint_is_stable_across_calls_and_compiled_objects():
    ids = torch.arange(64, dtype=torch.int32) // 16
    for options in (dict(causal=True), dict(softcap=30.0, window=128), dict(mask_mod=attngen.document(ids)),
                    dict(score_mod=attngen.alibi(8), mask_mod=window_from_global)):
        v = attngen.make_variant(**options)
        first = fingerprint(v)
        assert first is not None, options
        assert fingerprint(v).digest == first.digest
        assert digest(**options) == first.digest  # new mod objects, same code and values
    a, b = attngen.compile(causal=True), attngen.compile(causal=True)
    assert a.variant.mask_mod is not b.variant.mask_mod
    assert fingerprint(a.variant).digest == fingerprint(b.variant).digest


def test_fingerprint_changes_with_constants_tensor_metadata_and_code(monkeypatch):
    def user_window(w):
        return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < w)

    assert digest(mask_mod=user_window(128)) != digest(mask_mod=user_window(256))  # a closure constant
    # library numbers are runtime parameters: keyed by name and kind, never by value, unless specialised
    assert digest(window=128) == digest(window=256)
    assert digest(softcap=30.0) == digest(softcap=30.5)
    specialised = [digest(mask_mod=attngen.sliding_window(w, specialize=True)) for w in (128, 256)]
    assert specialised[0] != specialised[1] and digest(window=128) not in specialised
    ids = torch.zeros(64, dtype=torch.int32)
    base = digest(mask_mod=attngen.document(ids))
    assert digest(mask_mod=attngen.document(ids.long())) != base  # dtype
    assert digest(mask_mod=attngen.document(torch.zeros(128, dtype=torch.int32))) != base  # shape
    strided = digest(mask_mod=attngen.document(torch.zeros(2, 64, dtype=torch.int32)[:, 0]))
    assert strided == digest(mask_mod=attngen.document(torch.ones(2, 64, dtype=torch.int32)[:, 0]))
    assert strided != digest(mask_mod=attngen.document(torch.zeros(2, dtype=torch.int32)))  # stride 64 vs 1
    assert digest(mask_mod=attngen.document(torch.ones(64, dtype=torch.int32))) == base  # values are not keyed

    def shifted(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)  # one operator differs from window_from_global

    assert digest(mask_mod=shifted) != digest(mask_mod=window_from_global)  # the code body
    before = digest(mask_mod=window_from_global)
    monkeypatch.setattr(sys.modules[__name__], "WINDOW", 65)
    assert digest(mask_mod=window_from_global) != before  # a global the code reads


def test_no_fingerprint_for_values_the_walk_cannot_describe():
    class Limits:
        window = 64

    limits = Limits()

    def from_object(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < limits.window

    assert digest(mask_mod=from_object) is None
    assert digest(mask_mod=from_object, causal=True) is None  # also inside a composition
    attn = attngen.compile(mask_mod=from_object)  # still compiles, by tracing
    assert attn.traced.has_mask


# ----------------------------------------------------------------------------------------------------------
# records


def test_a_recorded_variant_compiles_without_tracing(fresh_cache, trace_calls):
    ids = torch.arange(64, dtype=torch.int32) // 16
    first = attngen.compile(mask_mod=attngen.document(ids), causal=True)
    assert len(trace_calls) == 1 and len(records(fresh_cache)) == 1
    forget_in_memory()
    second = attngen.compile(mask_mod=attngen.document(ids), causal=True)
    assert len(trace_calls) == 1, "a recorded variant must not be traced again"
    assert second.facts.canonical == first.traced.canonical()
    assert second.facts.summaries == first.predicates.summaries
    assert [c.tensor for c in second.facts.captured] == [ids]
    for got, want in zip(second.facts.captured, first.traced.captured):
        assert (got, got.extent_rules, got.source) == (want, want.extent_rules, want.source)
    q = torch.randn(1, 2, 64, 32)
    torch.testing.assert_close(second(q, q, q), first(q, q, q))
    assert len(trace_calls) == 1, "the CPU call of a recorded variant must not trace either"
    assert second.traced.canonical() == first.traced.canonical()  # traced on first use
    assert len(trace_calls) == 2


def test_whether_a_mod_reads_b_comes_from_the_record(fresh_cache, trace_calls):
    """facts.reads_b (varlen's kernel path refuses such variants) is recorded: a new process learns it without
    tracing the variant again."""
    bias = torch.randn(2)

    def per_batch(score, b, h, q_idx, kv_idx):
        return score + bias[b]

    for mod, reads_b in ((per_batch, True), (attngen.softcap(20.0), False)):
        assert attngen.compile(score_mod=mod).facts.reads_b is reads_b
        n = len(trace_calls)
        forget_in_memory()
        assert attngen.compile(score_mod=mod).facts.reads_b is reads_b
        assert len(trace_calls) == n, "read from the record"


def test_a_trace_that_read_tensor_values_is_not_recorded(fresh_cache, trace_calls):
    lengths = torch.tensor([40, 48])

    def up_to_longest(b, h, q_idx, kv_idx):
        return kv_idx < int(lengths.max())  # a value baked in at trace time: not keyed by the fingerprint

    attngen.compile(mask_mod=up_to_longest)
    assert records(fresh_cache) == []
    forget_in_memory()
    attngen.compile(mask_mod=up_to_longest)
    assert len(trace_calls) == 2


def test_a_damaged_record_is_a_miss_and_is_rewritten(fresh_cache, trace_calls):
    attngen.compile(window=32)
    (name,) = records(fresh_cache)
    path = fresh_cache / analysis_cache.RECORD_DIR / name
    path.write_text('{"format": 1, "canonical": 3}')
    forget_in_memory()
    attn = attngen.compile(window=32)
    assert len(trace_calls) == 2 and attn.facts.has_mask
    assert json.loads(path.read_text())["canonical"] == attn.traced.canonical()


def test_an_unwritable_cache_root_only_costs_the_record(tmp_path, monkeypatch, trace_calls):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / analysis_cache.RECORD_DIR).write_text("a file where the records directory would go")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(root))
    forget_in_memory()
    attn = attngen.compile(causal=True)
    q = torch.randn(1, 1, 16, 32)
    out = attn(q, q, q)
    assert out.shape == q.shape and len(trace_calls) == 1
    forget_in_memory()


@pytest.mark.parametrize("options", [
    dict(causal=True),
    dict(softcap=30.0, causal=True),
    dict(mask_mod="document", causal=True),
    dict(score_mod="alibi slopes"),
    dict(score_mod=attngen.alibi(8), window=(64, 0)),
], ids=["causal", "softcap", "document", "alibi-slopes", "alibi-local"])
def test_cache_key_from_a_record_equals_the_key_from_the_analysis(fresh_cache, trace_calls, monkeypatch, options):
    monkeypatch.setattr(spec_module, "nvcc_version", lambda: (13, 0))  # the key without needing nvcc here
    ids = torch.arange(256, dtype=torch.int32) // 100
    slopes = torch.linspace(0.5, 0.01, 8)
    live = {"document": attngen.document(ids), "alibi slopes": attngen.alibi(slopes)}
    options = {k: live.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    analysed = attngen.compile(**options)
    forget_in_memory()
    recorded = attngen.compile(**options)
    assert recorded._analysis is None and len(trace_calls) == 1
    for arch, kernel, dtype, head_dim in (("sm_90a", "sm90", torch.bfloat16, 128), ("sm_80", "sm80", torch.float16, 64)):
        full = spec_module.KernelSpec.create(analysed.traced, analysed.predicates, name=analysed.name, dtype=dtype,
                                             head_dim=head_dim, arch=arch, kernel=kernel)
        fast = recorded.spec(dtype, head_dim, arch, kernel)
        assert fast.fields() == full.fields()
        assert cache_key(fast.fields()) == cache_key(full.fields())
    assert len(trace_calls) == 1, "a cache key from a record needs no trace"


def test_import_and_a_recorded_compile_do_not_import_sympy(fresh_cache):
    """In a new process: `import attngen` leaves sympy out, and so do compiling a recorded variant and its
    CPU call."""
    attngen.compile(causal=True, softcap=20.0)  # writes the record the new process finds
    code = textwrap.dedent("""
        import sys
        import attngen
        assert "sympy" not in sys.modules, "import attngen imported sympy"
        import torch
        attn = attngen.compile(causal=True, softcap=20.0)
        q = torch.randn(1, 1, 16, 32)
        attn(q, q, q)
        assert attn._analysis is None, "the recorded variant was traced"
        assert "sympy" not in sys.modules, "a recorded compile imported sympy"
        print("ok")
    """)
    env = dict(os.environ, ATTNGEN_CACHE_DIR=str(fresh_cache))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# found in review: state a mod reads that the walk once missed (a stale record would run the wrong kernel)

def test_function_attribute_read_by_the_mod_is_part_of_the_fingerprint():
    # a mod reading an attribute of itself (or of any plain function it reaches): fn.__dict__ is not walked
    def win(b, h, q, kv):
        return (q - kv >= 0) & (q - kv <= win.w)

    win.w = 3
    a = attngen.compile(mask_mod=win, backend="reference")  # writes the analysis record
    win.w = 40
    b = attngen.compile(mask_mod=win, backend="reference")  # hits the record of w=3
    fresh = attngen.trace(attngen.Variant(mask_mod=win)).canonical()
    assert a.facts.canonical != fresh          # the variants differ ...
    assert b.facts.canonical == fresh, (       # ... but b got a's facts (kernel key, summaries): wrong kernel on GPU
        f"stale analysis record: facts say {b.facts.canonical!r}, the mod traces to {fresh!r}")


def test_user_module_attributes_read_by_a_second_function_are_part_of_the_fingerprint():
    # _Walk._module describes a user module once, with the attribute names of the FIRST function that reaches
    # it; a second function reaching it gets a back-reference, so the attributes only it reads are not hashed
    cfg = types.ModuleType("review_cfg")
    cfg.A, cfg.B = 0, 3
    sys.modules["review_cfg"] = cfg
    g = {"cfg": cfg, "__name__": "review_user"}
    exec("def helper(q, kv):\n    return q - kv <= cfg.B\n"
         "def mask(b, h, q, kv):\n    return (q >= kv + cfg.A) & helper(q, kv)\n", g)
    a = attngen.compile(mask_mod=g["mask"], backend="reference")
    cfg.B = 40
    b = attngen.compile(mask_mod=g["mask"], backend="reference")
    fresh = attngen.trace(attngen.Variant(mask_mod=g["mask"])).canonical()
    assert a.facts.canonical != fresh
    assert b.facts.canonical == fresh, f"stale analysis record: {b.facts.canonical!r} vs {fresh!r}"


def test_fingerprint_of_library_closures_covers_their_closure():
    # torch's and_masks returns a closure whose __module__ is torch: described by name only, so two different
    # combinations share one fingerprint. (Not reachable end to end today: the tracer rejects b.new_ones.)
    from torch.nn.attention.flex_attention import and_masks

    def causal(b, h, q, kv):
        return q >= kv

    def window(w):
        def m(b, h, q, kv):
            return q - kv <= w
        return m

    f1 = fingerprint(attngen.Variant(mask_mod=and_masks(causal, window(3))))
    f2 = fingerprint(attngen.Variant(mask_mod=and_masks(causal, window(50))))
    assert f1 is None or f2 is None or f1.digest != f2.digest
