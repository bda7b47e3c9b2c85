"""attngen.autograd on the CPU: gradients of ``attn(q, k, v)`` through the custom ops against torch.autograd
through the float64 golden (tests/reference64.py), gradcheck, opcheck of both ops, torch.compile(fullgraph=True),
and the routing in CompiledAttention.__call__ (inference never reaches the ops; the backward hook is asked first).

Small shapes throughout: every case is a few milliseconds, the torch.compile ones use the eager / aot_eager
backends (no inductor build on CI)."""
import functools
import types

import pytest
import torch

import attngen
import reference64
from attngen import autograd as ag
from helpers import training_variants

NPOS = 16  # absolute positions the captured tables cover (q_offset + Lq and Lk stay within)


@functools.lru_cache(maxsize=None)
def data() -> types.SimpleNamespace:
    """Captured tensors and compiled variants, made on first use (collection compiles nothing)."""
    gen = torch.Generator().manual_seed(7)
    slopes = (torch.rand(4, generator=gen, dtype=torch.float64) + 0.1).requires_grad_()
    table = (torch.randn(4, 2 * NPOS - 1, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
    docs = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 5, 5, 5, 5])  # sorted ids over NPOS positions

    variants = training_variants(slopes, table, docs, NPOS, window=3, softcap=0.5)
    return types.SimpleNamespace(slopes=slopes, table=table, docs=docs, variants=variants)


# name -> (B, Hq, Hkv, Lq, Lk, D, Dv, q_offset): between them GQA, MQA, q_len != kv_len, q_offset > 0, Dv != D
CASES = {
    "full": (2, 2, 2, 5, 7, 8, 6, 0),
    "causal": (1, 4, 2, 8, 8, 8, 8, 0),           # GQA
    "sliding_window": (1, 4, 1, 9, 9, 8, 8, 0),   # MQA
    "softcap": (2, 2, 2, 6, 4, 8, 8, 0),
    "alibi": (1, 4, 2, 5, 9, 8, 8, 4),            # decoding-like: q_offset = Lk - Lq
    "relpos": (1, 4, 4, 6, 10, 8, 8, 2),
    "document": (2, 2, 1, 16, 16, 8, 8, 0),       # fully masked rows
}


def _captured_leaves(name):
    d = data()
    return {"alibi": [d.slopes], "relpos": [d.table]}.get(name, [])


def _inputs(shape, dtype, seed=0):
    B, Hq, Hkv, Lq, Lk, D, Dv, _ = shape
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()

    return r(B, Hq, Lq, D), r(B, Hkv, Lk, D), r(B, Hkv, Lk, Dv)


def _loss(out, lse, w_out, w_lse):
    # rows with nothing kept have lse = -inf: leave them out of the loss (their gradient is 0 either way)
    return (out.double() * w_out).sum() + (torch.where(torch.isfinite(lse), lse.double(), 0.0) * w_lse).sum()


def _grads(name, dtype, use_lse=True):
    """(gradients through attn in `dtype`, gradients through the float64 golden), for q, k, v and captured."""
    attn = data().variants[name]
    shape = CASES[name]
    q_offset = shape[-1]
    q, k, v = _inputs(shape, dtype)
    caps = _captured_leaves(name)
    gen = torch.Generator().manual_seed(1)
    out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset)
    w_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    w_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64) * float(use_lse)
    got = torch.autograd.grad(_loss(out, lse, w_out, w_lse), [q, k, v, *caps])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = reference64.attention(q64, k64, v64, attn, q_offset=q_offset)
    want = torch.autograd.grad(_loss(ref_out, ref_lse, w_out, w_lse), [q64, k64, v64, *caps])
    return got, want, (out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("name", list(CASES))
def test_float64_gradients_match_the_golden(name):
    got, want, (out, lse, ref_out, ref_lse) = _grads(name, torch.float64)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_float32_gradients_match_the_golden(name):
    got, want, _ = _grads(name, torch.float32)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-4)


def test_without_lse_in_the_loss():
    got, want, _ = _grads("alibi", torch.float64, use_lse=False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_lse_alone_in_the_loss():
    attn = data().variants["alibi"]
    q, k, v = _inputs(CASES["alibi"], torch.float64)
    _, lse = attn(q, k, v, return_lse=True, q_offset=4)
    got = torch.autograd.grad(lse.sum(), [q, k, data().slopes])
    _, ref_lse = reference64.attention(q, k, v, attn, q_offset=4)
    want = torch.autograd.grad(ref_lse.sum(), [q, k, data().slopes])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_fully_masked_rows_get_zero_gradients():
    attn = data().variants["document"]
    q, k, v = _inputs(CASES["document"], torch.float32)
    out, lse = attn(q, k, v, return_lse=True)
    (dq,) = torch.autograd.grad(out.sum(), [q])
    empty = torch.isneginf(lse)
    assert empty.any() and not empty.all()
    assert (dq[empty] == 0).all() and torch.isfinite(dq).all()


def test_several_chunks_match_one(monkeypatch):
    got1, _, _ = _grads("relpos", torch.float64)
    monkeypatch.setattr(ag, "_CHUNK_ELEMENTS", 1)  # one query row per step
    got2, _, _ = _grads("relpos", torch.float64)
    for a, b in zip(got1, got2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["alibi", "relpos", "document"])
def test_gradcheck(name):
    attn = data().variants[name]
    q_offset = 2 if name != "document" else 0
    q, k, v = _inputs((1, 4, 2, 4, 6, 4, 4, 0), torch.float64, seed=3)
    caps = _captured_leaves(name)  # the mods read these objects: gradcheck perturbs them in place

    def fn(q, k, v, *caps_):
        out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset)
        return out, torch.where(torch.isfinite(lse), lse, 0.0)

    assert torch.autograd.gradcheck(fn, (q, k, v, *caps))


def test_only_the_needed_gradients():
    attn = data().variants["alibi"]
    q, k, v = _inputs(CASES["alibi"], torch.float32)
    k.requires_grad_(False)
    v.requires_grad_(False)
    out = attn(q, k, v, q_offset=4)
    assert out.grad_fn is not None
    dq, dslopes = torch.autograd.grad(out.sum(), [q, data().slopes])
    assert dq.shape == q.shape and dslopes.shape == data().slopes.shape
    # a captured tensor alone requiring grad also records a graph
    out = attn(q.detach(), k, v, q_offset=4)
    (dslopes2,) = torch.autograd.grad(out.sum(), [data().slopes])
    torch.testing.assert_close(dslopes2, dslopes)


def test_empty_key_set_gives_zero_gradients():
    attn = data().variants["causal"]
    q, k, v = _inputs((1, 2, 2, 3, 0, 8, 8, 0), torch.float32)
    out, lse = attn(q, k, v, return_lse=True)
    assert torch.isneginf(lse).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), [q, k, v], allow_unused=True)
    assert (dq == 0).all() and dk.numel() == 0 and dv.numel() == 0


def test_object_dropped_before_backward():
    q, k, v = _inputs((1, 2, 2, 4, 4, 8, 8, 0), torch.float32)
    attngen.compile(causal=True)(q, k, v).sum().backward()  # the compiled object is gone before backward
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_unknown_op_id_names_the_fix():
    with pytest.raises(attngen.InputError, match="Keep a reference"):
        ag._resolve("nothing/000000000000/0")


def test_op_ids_are_stable_and_distinct():
    a, b = attngen.compile(causal=True), attngen.compile(causal=True)
    assert a.op_id != b.op_id and a.op_id.startswith(a.name)
    assert ag._resolve(a.op_id) is a and ag._resolve(b.op_id) is b


# ----------------------------------------------------------------------------------------------------------
# routing


def test_inference_does_not_use_the_ops(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("inference went through the custom ops")

    monkeypatch.setattr(ag, "attention", refuse)
    attn = data().variants["alibi"]
    q, k, v = _inputs(CASES["alibi"], torch.float32)
    with torch.no_grad():
        attn(q, k, v, q_offset=4)
    with torch.inference_mode():
        attn(q.detach(), k.detach(), v.detach(), q_offset=4)
    attn2 = data().variants["causal"]
    out = attn2(*(t.detach() for t in _inputs(CASES["causal"], torch.float32)))  # grad mode, nothing requires grad
    assert out.grad_fn is None


def test_hot_path_hands_gradients_to_the_ops(monkeypatch):
    """A library ready for the inputs (as after a first CUDA call) still leaves calls that record a graph to the
    custom ops; only calls without one launch it (CPU tensors and a stubbed launch stand in for the GPU)."""
    attn = attngen.compile(causal=True)
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    attn._ready[(q.dtype, 64, q.get_device())] = "lib"
    launched = []
    monkeypatch.setattr(attn, "_run", lambda lib, *a: launched.append(lib) or "launched")
    assert attn(q, q, q) == "launched"
    qg = q.clone().requires_grad_()
    out = attn(qg, q, q)
    assert launched == ["lib"] and out.grad_fn is not None  # the op's reference forward ran on the CPU
    with torch.no_grad():
        assert attn(qg, q, q) == "launched"


def test_hot_path_hands_captured_gradients_to_the_ops(monkeypatch):
    """Learned slopes with frozen q/k/v (bias-only training): every call that records a graph goes through the
    ops, also once a library is ready for the inputs, so the slopes get their gradient on every step."""
    slopes = torch.full((2,), 0.25, requires_grad=True)
    attn = attngen.compile(score_mod=attngen.alibi(slopes), causal=True)
    q = torch.randn(1, 2, 8, 64)
    attn._ready[(q.dtype, 64, q.get_device())] = "lib"
    monkeypatch.setattr(attn, "_run", lambda lib, *a: "launched")
    for _ in range(2):
        out = attn(q, q, q)
        assert out.grad_fn is not None
        g, = torch.autograd.grad(out.sum(), [slopes])
        assert torch.isfinite(g).all() and g.abs().sum() > 0


@pytest.mark.parametrize("name", ["alibi", "relpos", "document"])
def test_eager_twin_matches_the_custom_ops(name, monkeypatch):
    """A plain call records the eager twin (autograd._EagerAttention), not the custom ops; its gradients, captured
    ones included, are the ops' bit for bit, LSE in the loss or not."""
    for use_lse in (True, False):
        got, _, (out, lse, _, _) = _grads(name, torch.float64, use_lse=use_lse)
        assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
        with monkeypatch.context() as m:
            m.setattr(ag, "_plain_eager", lambda *a: False)  # the custom ops
            want, _, (out2, _, _, _) = _grads(name, torch.float64, use_lse=use_lse)
        assert type(out2.grad_fn).__name__ != "_EagerAttentionBackward"
        assert len(got) == len(want) == 3 + len(_captured_leaves(name))
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_eager_twin_takes_parameters():
    """q, k, v or captured tensors held as nn.Parameter (a learned bias, a model's weights) take the eager twin."""
    slopes = torch.nn.Parameter(torch.full((2,), 0.25, dtype=torch.float64))
    attn = attngen.compile(score_mod=attngen.alibi(slopes), causal=True)
    q = torch.nn.Parameter(torch.randn(1, 2, 8, 8, dtype=torch.float64))
    out = attn(q, q.detach(), q.detach())
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
    g = torch.autograd.grad(out.sum(), [q, slopes])
    assert all(torch.isfinite(x).all() and x.abs().sum() > 0 for x in g)


def test_eager_twin_only_for_plain_tensors_and_no_modes():
    """A dispatch mode (as FlopCounter's or fake tensors') and a torch function mode see the custom op, and the
    twin refuses a second derivative rather than returning a silently wrong one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    attn = data().variants["causal"]
    q, k, v = _inputs(CASES["causal"], torch.float64)
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        out = attn(q, k, v)
    assert any("attngen.attention_fwd" in f for f in seen), seen[:5]
    with torch.device("cpu"):  # a torch function mode
        assert type(attn(q, k, v).grad_fn).__name__ != "_EagerAttentionBackward"
    w = torch.randn(q.shape, dtype=q.dtype, requires_grad=True)  # dout on the graph: a double backward's case
    dq, = torch.autograd.grad((attn(q, k, v) * w).sum(), [q], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.sum().backward()


def test_backward_kernel_hook_is_asked_first(monkeypatch):
    attn = data().variants["causal"]
    q, k, v = _inputs(CASES["causal"], torch.float32)
    seen = []

    def kernel(attn_, dout, dlse, q_, k_, v_, out, lse, captured, scale, q_offset, needs_grad):
        seen.append((attn_, dout.is_contiguous(), dlse, list(needs_grad), scale, q_offset))
        return torch.full_like(q_, 1.0), torch.full_like(k_, 2.0), torch.full_like(v_, 3.0), []

    monkeypatch.setattr(ag, "backward_kernel", kernel)
    dq, dk, dv = torch.autograd.grad(attn(q, k, v, scale=0.5).sum(), [q, k, v])
    assert seen == [(attn, True, None, [True, True, True], 0.5, 0)]
    assert (dq == 1).all() and (dk == 2).all() and (dv == 3).all()

    monkeypatch.setattr(ag, "backward_kernel", lambda *a: None)  # declined: the reference recompute runs
    dq2, = torch.autograd.grad(attn(q, k, v, scale=0.5).sum(), [q])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, = torch.autograd.grad(reference64.attention(q64, k64, v64, attn, scale=0.5)[0].sum(), [q64])
    torch.testing.assert_close(dq2.double(), want, rtol=1e-4, atol=1e-4)


def test_backward_kernel_declines_what_the_kernel_cannot_do():
    """The portable backward kernel takes 16-bit CUDA inputs without an LSE gradient or captured gradients:
    anything else goes to the reference recompute (checked before any build). Here only the CPU decline can
    be observed (both calls use CPU tensors); the LSE-gradient and captured-gradient declines are checked on the
    GPU by tests/gpu/test_autograd_gpu.py::test_gradients_bf16_match_float64, which asserts which path ran."""
    attn = data().variants["causal"]
    q, k, v = (t.detach() for t in _inputs(CASES["causal"], torch.float32))
    out, lse = attn(q, k, v, return_lse=True)
    args = (torch.ones_like(out), None, q, k, v, out, lse, [], 0.5, 0, [True, True, True])
    assert ag.backward_kernel(attn, *args) is None  # CPU tensors
    assert ag.backward_kernel(attn, args[0], torch.ones_like(lse), *args[2:]) is None  # an LSE gradient, on CPU


# ----------------------------------------------------------------------------------------------------------
# torch.library.opcheck and torch.compile


def _op_args(name):
    attn = data().variants[name]
    shape = CASES[name]
    q, k, v = (t.detach().requires_grad_() for t in _inputs(shape, torch.float32))
    caps = [c.tensor for c in attn.facts.captured]
    return attn, (q, k, v, caps, attn.op_id, 0.3, shape[-1], ag.param_values(attn))


@pytest.mark.parametrize("name", ["causal", "alibi", "sliding_window"])  # sliding_window: a runtime parameter
def test_opcheck(name):
    attn, args = _op_args(name)
    torch.library.opcheck(torch.ops.attngen.attention_fwd.default, args)
    q, k, v, caps, op_id, scale, q_offset, params = args
    with torch.no_grad():
        out, lse = torch.ops.attngen.attention_fwd(*args)
    needs = [True, True, True] + [c.dtype.is_floating_point for c in caps]
    bargs = (torch.randn_like(out), torch.randn_like(lse), q.detach(), k.detach(), v.detach(), out, lse,
             [c.detach() for c in caps], op_id, scale, q_offset, params, needs)
    torch.library.opcheck(torch.ops.attngen.attention_bwd.default, bargs)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()
    attn = data().variants["alibi"]
    slopes = data().slopes

    def step(q, k, v):
        out, lse = attn(q, k, v, return_lse=True, q_offset=4)
        return out.sum() + lse.sum()

    q, k, v = _inputs(CASES["alibi"], torch.float32)
    graphs = []

    def counting(gm, example_inputs):  # the graph dynamo captured, then the named backend
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    compiled = torch.compile(step, fullgraph=True, backend=counting)  # fullgraph: a graph break raises
    got = torch.autograd.grad(compiled(q, k, v), [q, k, v, slopes])
    assert len(graphs) == 1
    assert any(n.target in (torch.ops.attngen.attention_fwd, torch.ops.attngen.attention_fwd.default)
               for n in graphs[0].graph.nodes)
    want = torch.autograd.grad(step(q, k, v), [q, k, v, slopes])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_torch_compile_inference():
    torch._dynamo.reset()
    attn = data().variants["causal"]
    q, k, v = (t.detach() for t in _inputs(CASES["causal"], torch.float32))
    with torch.no_grad():
        got = torch.compile(lambda q, k, v: attn(q, k, v) * 2, fullgraph=True, backend="eager")(q, k, v)
        torch.testing.assert_close(got, attn(q, k, v) * 2)


def test_score_mod_singular_at_masked_positions_gives_finite_gradients():
    """A score_mod whose derivative is inf / NaN where the mask drops the score (sqrt(q - kv) above the causal
    diagonal) must not poison the gradients (0 * inf): the reference backward differentiates kept elements only,
    as the kernel does. Checked against float64 torch that computes the score only where kept."""
    slopes = torch.tensor([0.3, 0.7], dtype=torch.float64, requires_grad=True)

    def div_sqrt(s, b, h, q, kv):
        return s / torch.sqrt((q - kv) * 1.0 + 1.0)

    def sqrt_bias(s, b, h, q, kv):
        return s - slopes[h] * torch.sqrt((q - kv) * 1.0)

    L = 33
    qi, ki = torch.arange(L)[:, None], torch.arange(L)[None, :]
    keep = qi >= ki
    dist = torch.where(keep, (qi - ki) * 1.0, torch.zeros(()))
    hh = torch.arange(2).view(1, 2, 1, 1)
    for fn, want_mod in ((div_sqrt, lambda s: s / torch.sqrt(dist + 1.0)),
                         (sqrt_bias, lambda s: s - slopes[hh] * torch.sqrt(dist))):
        attn = attngen.compile(score_mod=attngen.ScoreMod(fn, fn.__name__), causal=True)
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, 2, L, 16, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
        leaves = [q, k, v] + ([slopes] if fn is sqrt_bias else [])
        got = torch.autograd.grad(attn(q, k, v).sum(), leaves)
        s = (q @ k.transpose(-1, -2)) * 16 ** -0.5
        ref = torch.softmax(torch.where(keep, want_mod(s), -torch.inf), -1) @ v
        want = torch.autograd.grad(ref.sum(), leaves)
        for a, b in zip(got, want):
            assert torch.isfinite(a).all(), fn.__name__
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------------------------------------
# runtime parameters: the backward recomputes with the values its forward ran


def _window_softcap_grads(set_between, compiled: bool):
    """Gradients of a sliding window 8 + softcap 0.5 variant (an int and a float runtime parameter) on CPU
    float64; with ``set_between`` both parameters change (window 32, cap 4.0) after the forward, before the
    backward. ``compiled``: through torch.compile(fullgraph=True, backend="aot_eager")."""
    attn = attngen.compile(softcap=0.5, window=8)
    window, cap = attn.params
    assert (window.name, cap.name) == ("window", "cap")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 24, 8, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    w_out = torch.randn(1, 2, 24, 8, dtype=torch.float64, generator=gen)
    w_lse = torch.randn(1, 2, 24, dtype=torch.float64, generator=gen)

    def loss_of(q, k, v):
        out, lse = attn(q, k, v, return_lse=True)
        return (out * w_out).sum() + (lse * w_lse).sum()  # the LSE's gradient too: dlse reaches the recompute

    if compiled:
        torch._dynamo.reset()
        loss_of = torch.compile(loss_of, fullgraph=True, backend="aot_eager")
    loss = loss_of(q, k, v)
    if set_between:
        window.set(32)
        cap.set(4.0)
    return torch.autograd.grad(loss, [q, k, v])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch_compile"])
def test_set_between_forward_and_backward_keeps_the_forward_values(compiled):
    """set() after the forward must not reach its backward: the saved LSE is the forward's, and recomputing P
    with other values gave gradients off by ~20 (the reference backward read the parameters' current values)."""
    want = _window_softcap_grads(set_between=False, compiled=compiled)
    got = _window_softcap_grads(set_between=True, compiled=compiled)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_backward_kernel_gets_the_forward_values(monkeypatch):
    """The kernel backward's arguments (CompiledAttention._param_fields) are the forward's values too, and the
    object's own values are untouched by the backward."""
    attn = attngen.compile(softcap=0.5, window=8)
    window, cap = attn.params
    forward_fields = attn._param_fields()
    seen = []

    def kernel(attn_, *args):
        seen.append(attn_._param_fields())
        return None  # declined: the reference recompute runs, under the same pinned values

    monkeypatch.setattr(ag, "backward_kernel", kernel)
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64).requires_grad_() for _ in range(3))
    out = attn(q, k, v)
    window.set(32)
    cap.set(4.0)
    out.sum().backward()
    assert seen == [forward_fields]
    assert (window.value, cap.value) == (32, 4.0)
    assert attn._param_fields() != forward_fields


def test_captured_atomics_follow_torch_deterministic_policy():
    """The sm90 kernel sums captured tensors' gradients with atomics: under torch.use_deterministic_algorithms that is
    an error (a warning with warn_only=True), as torch's own nondeterministic ops; under deterministic=True alone a
    warning once per process."""
    import warnings

    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="atomic additions .*requires_grad=False"):
            ag._alert_captured_atomics()
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="atomic additions"):
            ag._alert_captured_atomics()
    finally:
        torch.use_deterministic_algorithms(False)
    ag._warn_captured_atomics.cache_clear()
    with pytest.warns(UserWarning, match="atomic additions"):
        ag._alert_captured_atomics()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ag._alert_captured_atomics()  # once per process


def test_deterministic_where_the_kernel_does_not_apply():
    """deterministic=True (or torch's deterministic flag) off the sm90 kernel (here: CPU tensors) takes the recompute,
    which is deterministic already: the gradients of q, k, v and of a captured table are those of the plain
    variant, bit for bit, and the same on every run."""
    plain = data().variants["relpos"]
    det = attngen.compile(score_mod=plain.variant.score_mod, deterministic=True)
    assert det.deterministic and not plain.deterministic
    shape = CASES["relpos"]
    table = data().table

    def grads(attn):
        q, k, v = (t.detach().requires_grad_() for t in _inputs(shape, torch.float64))
        out = attn(q, k, v, q_offset=shape[-1])
        return torch.autograd.grad(out.square().sum(), (q, k, v, table))

    want = grads(plain)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(grads(det), want))
    torch.use_deterministic_algorithms(True)
    try:
        assert all(torch.equal(a, b) for a, b in zip(grads(plain), want))
    finally:
        torch.use_deterministic_algorithms(False)


def test_backward_launch_with_no_queries_returns_zero_kv_gradients_without_a_kernel(monkeypatch):
    """launch.backward with Lq = 0 (the device checks stubbed so it runs on the CPU): dK and dV are zeros, dQ is empty,
    and the library's entry point is never called (its statistics and dQ workspaces would be empty, and the C entry
    point refuses their null pointers: round A of session 21 on the H200)."""
    from attngen import launch

    monkeypatch.setattr(launch, "_check_qkv", lambda lib, q, k, v: None)
    monkeypatch.setattr(launch, "_capable_devices", {-1})
    lib = launch._Library.__new__(launch._Library)
    lib.path, lib.param_count = "libattngen_bwd.so", 0

    def refuse(*args):
        raise AssertionError("the backward kernel was called with Lq = 0")

    lib._bwd = refuse
    monkeypatch.setattr(launch, "call_on", refuse)
    k, v = (torch.randn(2, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2))
    # outputs poisoned: the zeros must be written, not found in fresh memory
    new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *a, **kw: new_empty(t, *a, **kw).fill_(float("nan")))
    q = torch.empty(2, 4, 0, 64, dtype=torch.bfloat16)
    dq, dk, dv = launch.backward(lib, q, k, v, torch.empty_like(q), torch.empty_like(q), torch.empty(2, 4, 0))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert (dk == 0).all() and (dv == 0).all()
