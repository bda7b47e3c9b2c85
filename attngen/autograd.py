"""Autograd and torch.compile for attngen: attention as two torch custom ops.

A kernel launched through ctypes is invisible to autograd and breaks a torch.compile graph. So a call that
needs gradients, or that torch.compile is tracing, goes through two ``torch.library.custom_op`` ops instead
(CompiledAttention.__call__ decides; the inference hot path never comes here):

    attngen::attention_fwd(q, k, v, captured, variant, scale, q_offset, params) -> (out, lse)
    attngen::attention_bwd(dout, dlse, q, k, v, out, lse, captured, variant, scale, q_offset, params, needs_grad)
        -> (dq, dk, dv, dcaptured)

``variant`` is the op id of a live CompiledAttention (``register``): ops take only tensors and plain values,
so the mods travel by name. ``captured`` are the variant's captured tensors, passed so that autograd routes
gradients to the float ones that require grad (ALiBi slopes, a bias table). ``params`` are the variant's runtime
parameter values (``param_values``), read once when the forward is called: the forward runs them and the backward
recomputes with them (params.pinned_values), so a ``set()`` between forward and backward cannot make the gradients
disagree with the saved LSE, and torch.compile sees them as arguments. The forward saves q, k, v, out and the LSE,
never the probabilities; the backward recomputes them.

A plain eager call (plain tensors, no torch.compile tracing, no Python dispatch or torch function mode) takes
``_EagerAttention`` instead: an autograd.Function over the same forward and backward, cheaper for the host to
dispatch than a custom op with its autograd (a short training step's issue time comes near its GPU time:
docs/performance.md).

The backward asks ``backward_kernel`` first (the portable backward kernel on CUDA inputs it supports) and otherwise
runs ``reference_backward``: float32 (float64 for float64 inputs) torch ops, chunked over query rows so memory
stays O(chunk x Lk). Correct, not fast.

The ops are defined with the first CompiledAttention (``register``), not at import: defining them costs a few
milliseconds that ``import attngen`` need not pay.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import math
import threading
import warnings
import weakref
from typing import List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from . import reference
from .errors import InputError
from .params import pinned_values

# Query rows per backward step are chosen so one (B, Hq, rows, Lk) score block has about this many elements;
# a step holds ~8 such blocks (scores, modified scores, P, dP, dS and the score_mod's autograd graph), so
# ~128 MiB in float32.
_CHUNK_ELEMENTS = 1 << 22

# ----------------------------------------------------------------------------------------------------------
# op ids: CompiledAttention objects by name, since a custom op takes no Python objects

_COMPILED: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
_IDS = itertools.count()


def register(attn) -> str:
    """Give a CompiledAttention its op id (its canonical variant's hash plus a counter: stable for the object,
    never reused) and make it resolvable by that id while the object lives."""
    digest = hashlib.sha256(attn.facts.canonical.encode()).hexdigest()[:12]
    op_id = f"{attn.variant.name}/{digest}/{next(_IDS)}"
    _COMPILED[op_id] = attn
    _ensure_ops()
    return op_id


def _resolve(op_id: str):
    attn = _COMPILED.get(op_id)
    if attn is None:
        raise InputError(
            f"no live attngen.compile(...) object has op id {op_id!r}: it was garbage-collected while a compiled "
            "graph still calls it. Keep a reference to the object returned by attngen.compile for as long as the "
            "function calling it (or its torch.compile'd version) is used"
        )
    return attn


# ----------------------------------------------------------------------------------------------------------
# entry point (CompiledAttention.__call__ when gradients are needed or torch.compile is tracing)


def attention(attn, q, k, v, *, scale: Optional[float], return_lse: bool, q_offset: int):
    """``attn(q, k, v, ...)`` differentiable in q, k, v and the captured tensors: through the custom ops when
    torch.compile traces or a tensor subclass or dispatch mode is about, else through their eager twin."""
    _, _, _, _, _, D, _ = reference._check_inputs(q, k, v)
    scale = reference._check_scale(scale, D)
    captured = [c.tensor for c in attn.facts.captured]
    params = param_values(attn)
    if _plain_eager(q, k, v, captured):
        out, lse = _EagerAttention.apply(q, k, v, attn, scale, q_offset, params, *captured)
    else:
        out, lse = torch.ops.attngen.attention_fwd(q, k, v, captured, attn.op_id, scale, q_offset, params)
    return (out, lse) if return_lse else out


def _plain_eager(q, k, v, captured) -> bool:
    """Whether a call may skip the custom ops: plain tensors, no torch.compile tracing and no Python mode that
    would want to see the op (fake tensors, FlopCounter, a torch function mode such as ``with torch.device``)."""
    return (q.__class__ in _PLAIN and k.__class__ in _PLAIN and v.__class__ in _PLAIN
            and all(c.__class__ in _PLAIN for c in captured) and not torch.compiler.is_compiling()
            and _dispatch_mode() is None and not _function_mode_enabled())


# tensors that dispatch as plain ones (nn.Parameter turns its __torch_function__ off; a learned bias is one)
_PLAIN = (torch.Tensor, torch.nn.Parameter)

# torch's private probes of the Python modes in force; a torch without them sends every call to the custom ops
try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode
except ImportError:  # pragma: no cover
    def _dispatch_mode():
        return "unknown"
_function_mode_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' eager twin: the same ``_forward`` / ``_backward`` under a plain autograd.Function, cheaper
    for the host to dispatch than a custom op with its autograd.
    Arguments: q, k, v, the CompiledAttention, scale, q_offset, params, then the captured tensors one by one so
    that autograd routes their gradients."""

    @staticmethod
    def forward(ctx, q, k, v, attn, scale, q_offset, params, *captured):
        out, lse = _forward(attn, q, k, v, scale, q_offset, params)
        ctx.save_for_backward(q, k, v, out, lse, *captured)
        ctx.attn, ctx.scale, ctx.q_offset, ctx.params = attn, scale, q_offset, params
        ctx.set_materialize_grads(False)  # dlse stays None unless the LSE enters the loss, as with the ops
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *captured = ctx.saved_tensors
        if dout is None:  # only the LSE was used
            dout = torch.zeros_like(out)
        needs = ctx.needs_input_grad
        needs_grad = [bool(n) for n in needs[:3]] + [bool(n) for n in needs[7:]]
        dq, dk, dv, dcap = _backward(ctx.attn, dout, dlse, q, k, v, out, lse, captured, ctx.scale, ctx.q_offset,
                                     ctx.params, needs_grad)
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None, None, None, None, None,
                *[g if n else None for g, n in zip(dcap, needs_grad[3:])])


def param_values(attn) -> List[float]:
    """The op argument ``params``: the current value of each of ``attn.params``, in slot order, as floats (an int
    parameter is within int32, so exact)."""
    return [float(p.param.value) for p in attn.facts.params]


def _pinned(attn, params: Sequence[float]):
    """A context manager: within it, in this thread, ``attn.params`` read the op argument ``params``
    (``param_values``), for the kernel arguments (CompiledAttention._param_fields) and the mods alike."""
    if len(params) != len(attn.facts.params):
        raise InputError(
            f"{attn.variant.name} takes {len(attn.facts.params)} runtime parameters but the op got {len(params)} "
            "values; pass autograd.param_values(attn)"
        )
    # back to ints for the int parameters; a fractional value stays a float, for RuntimeParam.check to reject
    values = [int(v) if s.integer and float(v).is_integer() else v for s, v in zip(attn.facts.params, params)]
    return pinned_values([s.param for s in attn.facts.params], values)


def needs_grad(attn, q, k, v) -> bool:
    """Whether a call with grad mode on records a graph: an input or a captured tensor requires grad."""
    return (q.requires_grad or k.requires_grad or v.requires_grad
            or any(c.tensor.requires_grad for c in attn.facts.captured))


# ----------------------------------------------------------------------------------------------------------
# the backward hook and its dispatch


def backward_kernel(attn, dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, captured: Sequence[torch.Tensor],
                    scale: float, q_offset: int, needs_grad: Sequence[bool]):
    """The kernel backward of one call, or None to use ``reference_backward``.

    ``attn`` is the CompiledAttention; ``dout`` is contiguous, shaped like ``out``; ``dlse`` (B, Hq, Lq) float32
    or None (the LSE's gradient: add ``P * dlse`` to dS); ``lse`` the forward's natural-log LSE (-inf on fully
    masked rows); ``needs_grad`` one bool per q, k, v and captured tensor. Returns ``(dq, dk, dv, dcaptured)``:
    dq/dk/dv shaped and typed like q/k/v (values ignored where not needed), ``dcaptured[i]`` shaped and typed
    like ``captured[i]`` where ``needs_grad[3 + i]`` and ``captured[i]`` is floating point, else anything
    (replaced by an empty tensor). The backward kernels (launch.backward: templates/bwd_sm90.cuh on sm_90a at
    head dims 64 / 128, else the portable bwd_sm80.cuh, which also takes a call whose layout TMA cannot
    describe) take 16-bit CUDA inputs of one head dim; they decline (None) an LSE gradient and variants whose
    backward library does not build (a score_mod without derivatives). Gradients of captured tensors are summed
    by the sm90 kernel only (templates/bwd_grad_sites.cuh), and so is dQ in a fixed order (``deterministic``:
    the CompiledAttention's flag, or torch.use_deterministic_algorithms): such a call declines elsewhere.
    """
    if dlse is not None or not q.is_cuda or getattr(attn, "backend", None) == "reference":
        return None
    if q.dtype not in (torch.bfloat16, torch.float16) or v.shape[-1] != q.shape[-1]:
        return None
    from .abi import SM90_FALLBACK_CODES, SUPPORTED_HEAD_DIMS
    from .errors import BuildError, KernelLaunchError
    from .jit.spec import SM90_BWD_KERNEL
    from .launch import backward

    D, dev = q.shape[-1], q.get_device()
    if D not in SUPPORTED_HEAD_DIMS:
        return None
    # the sm90 backward where there is one, else (or when this call's layout has no TMA map) the portable kernel
    wanted = [bool(n) and c.dtype.is_floating_point for n, c in zip(needs_grad[3:], captured)]
    deterministic = bool(getattr(attn, "deterministic", False)) or torch.are_deterministic_algorithms_enabled()
    for kernel in attn.backward_kernels(D, dev):
        key = (attn.op_id, q.dtype, D, dev, kernel)
        if key in _NO_KERNEL or ((any(wanted) or deterministic) and kernel != SM90_BWD_KERNEL):
            continue
        try:
            lib = attn.backward_library(q.dtype, D, dev, kernel)
        except BuildError:
            _NO_KERNEL.add(key)  # built once, failed: the next family (or the reference) from now on, no rebuild
            continue
        summaries = attn._bwd_summaries.get(attn, list(captured), lib, q.shape[2], k.shape[2], q_offset)
        if deterministic and any(wanted):
            _alert_captured_atomics()
        try:
            # the values _backward pinned (the forward's), not whatever set() left since
            dq, dk, dv, dcap = backward(lib, q, k, v, out, dout, lse, scale=scale, q_offset=q_offset,
                                        captured=list(captured), summaries=summaries, params=attn._param_fields(),
                                        captured_grads=wanted, deterministic=deterministic)
        except KernelLaunchError as e:
            if e.code in SM90_FALLBACK_CODES:
                continue
            raise
        return dq, dk, dv, [None if g is None else g.to(c.dtype) for g, c in zip(dcap, captured)]
    return None


# (op id, dtype, head dim, device, kernel family) whose backward library failed to build
_NO_KERNEL: set = set()


_CAPTURED_ATOMICS = ("attngen backward: the gradients of captured tensors are summed with atomic additions and may "
                     "differ in their last bits between runs (dq, dk and dv are bit-identical in deterministic mode)")


def _alert_captured_atomics() -> None:
    """Under torch.use_deterministic_algorithms, what torch does for its own nondeterministic ops (an error, or a
    warning with warn_only=True); under attngen's deterministic=True alone, one warning per process."""
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        raise RuntimeError(_CAPTURED_ATOMICS + ", but torch.use_deterministic_algorithms(True) is on. Fix: freeze the "
                           "captured tensors (requires_grad=False), or pass warn_only=True to accept this")
    if torch.are_deterministic_algorithms_enabled():
        warnings.warn(_CAPTURED_ATOMICS, stacklevel=3)
    else:
        _warn_captured_atomics()


@functools.lru_cache(maxsize=None)
def _warn_captured_atomics() -> None:
    warnings.warn(_CAPTURED_ATOMICS, stacklevel=4)


def _backward(attn, dout, dlse, q, k, v, out, lse, captured, scale, q_offset, params, needs_grad):
    """The backward, with the forward's parameter values ``params`` pinned: a kernel when ``backward_kernel`` has
    one, else the float32 recompute."""
    dout = dout.contiguous()  # autograd hands e.g. out.sum()'s gradient over as an expanded (stride 0) tensor
    with _pinned(attn, params):
        grads = backward_kernel(attn, dout, dlse, q, k, v, out, lse, captured, scale, q_offset, needs_grad)
        if grads is None:
            grads = reference_backward(attn.variant, dout, dlse, q, k, v, out, lse, captured,
                                       [c.tensor for c in attn.facts.captured], scale, q_offset, needs_grad)
    dq, dk, dv, dcap = grads
    # the layout the fake implementation promises (torch.compile plans memory with it): contiguous, and an
    # empty tensor for each captured gradient nobody asked for
    dcap = [g.contiguous() if n and c.dtype.is_floating_point else c.new_empty(0)
            for g, c, n in zip(dcap, captured, needs_grad[3:])]
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dcap


# ----------------------------------------------------------------------------------------------------------
# reference backward: recompute P from the saved LSE, chunk by chunk


# Autograd's dispatch keys. A custom op's kernel runs with them excluded for the thread (it sits below
# autograd), so torch ops inside it record no graph even under enable_grad.
_AUTOGRAD_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
                  | torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView))


@contextlib.contextmanager
def _autograd_inside_op():
    """torch.autograd for the duration of the block, inside a custom op's kernel: the score_mod's derivative is
    taken by autograd on one chunk's elementwise evaluation. (torch.func.vjp needs no key juggling, but its
    wrapper tensors have no storage, which breaks dispatch modes that read storages: opcheck's checks, the
    fake-tensor cross-check.)"""
    C = torch._C
    with C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(),
                                  C._dispatch_tls_local_exclude_set() - _AUTOGRAD_KEYS), torch.enable_grad():
        yield


class _Substitute(TorchFunctionMode):
    """Inside a score_mod: use ``leaves[i]`` wherever the mod reads the live captured tensor ``live[i]``.

    A mod reads its captured tensors from its closure, so autograd cannot reach them from the op's inputs;
    swapping them at every torch call (indexing included) for leaves that require grad gives their gradients."""

    def __init__(self, live, leaves):
        super().__init__()
        self.swap = {id(t): (t, leaf) for t, leaf in zip(live, leaves)}

    def _sub(self, x):
        pair = self.swap.get(id(x)) if isinstance(x, torch.Tensor) else None
        return pair[1] if pair is not None and pair[0] is x else x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(self._sub, (args, kwargs or {}))
        return func(*args, **kwargs)


def reference_backward(variant, dout, dlse, q, k, v, out, lse, captured, live_captured, scale: float,
                       q_offset: int, needs_grad: Sequence[bool], chunk: Optional[int] = None):
    """Gradients of attention by recomputation from the saved LSE (FlashAttention's backward, in torch ops).

    Per chunk of query rows: S = scale q k^T, S' = score_mod(S) masked to -inf, P = exp(S' - lse),
    dV += P^T dO, dP = dO V^T, dS' = P (dP - rowsum(dO * O) + dlse), dS = dS' dS'/dS (torch.autograd through
    the score_mod, which also gives the captured tensors' gradients), dQ = scale dS K, dK += scale dS^T Q; with GQA
    dK and dV sum over the query heads of each kv head. Fully masked rows (lse = -inf) give P = 0: zero
    gradients. ``captured`` are the op's tensors (the values differentiated), ``live_captured`` the objects the
    mods close over. Math in float32, float64 for float64 inputs."""
    _, score_mod, mask_mod = reference._mods(variant)
    B, Hq, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // Hkv
    compute = reference.compute_dtype(q.dtype)
    want_q, want_k, want_v = needs_grad[:3]
    want_cap = [bool(n) and c.dtype.is_floating_point for n, c in zip(needs_grad[3:], captured)]
    dq = torch.zeros(B, Hq, Lq, D, dtype=compute, device=q.device)
    dk = torch.zeros(B, Hkv, Lk, D, dtype=compute, device=q.device)
    dv = torch.zeros(B, Hkv, Lk, Dv, dtype=compute, device=q.device)
    dcap = [torch.zeros(c.shape, dtype=compute, device=c.device) if w else c.new_empty(0)
            for c, w in zip(captured, want_cap)]

    if B * Hq * Lq * Lk > 0:
        if chunk is None:
            chunk = max(1, _CHUNK_ELEMENTS // (B * Hq * Lk))
        qf = q.to(compute).reshape(B, Hkv, G, Lq, D)
        kf = k.to(compute).unsqueeze(2)  # (B, Hkv, 1, Lk, D): broadcast over the group's query heads
        vf = v.to(compute).unsqueeze(2)
        dof = dout.to(compute)
        delta = (dof * out.to(compute)).sum(-1)  # rowsum(dO * O), (B, Hq, Lq)
        if dlse is not None:
            delta = delta - dlse.to(compute)
        dof = dof.reshape(B, Hkv, G, Lq, Dv)
        # exp(S' - inf) = 0 on rows with nothing kept, where exp(S' - lse) would be exp(-inf + inf) = NaN
        lse_safe = torch.where(torch.isneginf(lse), math.inf, lse.to(compute))
        sub_idx = [i for i, w in enumerate(want_cap) if w]
        sm_name = score_mod.name if score_mod is not None else None
        for lo in range(0, Lq, chunk):
            hi = min(lo + chunk, Lq)
            C = hi - lo
            qc = qf[:, :, :, lo:hi]
            s = torch.matmul(qc, kf.transpose(-1, -2)).mul(scale).reshape(B, Hq, C, Lk)
            idx = reference._index_tensors(B, Hq, lo + q_offset, hi + q_offset, Lk, q.device)
            graph = None
            keep = None
            if mask_mod is not None:
                keep = reference._eval_mask(mask_mod, idx, s.shape, s.device, mask_mod.name)
            if score_mod is not None:
                # The score_mod's graph covers kept elements only: at a masked one its local derivative may be
                # inf or NaN (sqrt(q - kv) above the diagonal), and 0 * inf would poison dS and the captured
                # tensors' gradients. Kept elements are gathered flat (mods are elementwise). The gather's size
                # is data-dependent (a host sync), which a CUDA graph capture forbids: there every element is
                # differentiated, as the mask-after-mod forward does.
                s_in, idx_in = s, idx
                if keep is not None and not (s.is_cuda and torch.cuda.is_current_stream_capturing()):
                    s_in, idx_in = s[keep], tuple(t.expand(s.shape)[keep] for t in idx)
                with _autograd_inside_op():
                    leaves = [s_in.detach().requires_grad_()] + [captured[i].detach().to(compute).requires_grad_()
                                                                 for i in sub_idx]
                    with _Substitute([live_captured[i] for i in sub_idx], leaves[1:]):
                        s_mod = reference._eval_score(score_mod, leaves[0], idx_in, sm_name)
                graph = (s_mod, leaves) if s_mod.requires_grad else None  # None: the score_mod ignores s
                gathered = s_in is not s
                if not gathered:
                    s = s_mod.detach() if keep is None else torch.where(keep, s_mod.detach(), -math.inf)
                else:
                    s = s.new_full(s.shape, -math.inf).masked_scatter_(keep, s_mod.detach())
            elif keep is not None:
                s = torch.where(keep, s, -math.inf)
            p = torch.exp(s - lse_safe[:, :, lo:hi, None])  # (B, Hq, C, Lk)
            pg = p.reshape(B, Hkv, G * C, Lk)  # the group's rows side by side: one matmul sums over them
            doc = dof[:, :, :, lo:hi]  # (B, Hkv, G, C, Dv)
            if want_v:
                dv += torch.matmul(pg.transpose(-1, -2), doc.reshape(B, Hkv, G * C, Dv))
            if not (want_q or want_k or any(want_cap)):
                continue
            dp = torch.matmul(doc, vf.transpose(-1, -2)).reshape(B, Hq, C, Lk)
            ds = p * (dp - delta[:, :, lo:hi, None])
            if score_mod is not None:
                if graph is None:
                    ds = torch.zeros_like(ds)
                else:
                    with _autograd_inside_op():
                        ds_out = ds[keep] if gathered else ds
                        ds_in, *dleaves = torch.autograd.grad(graph[0], graph[1], ds_out, allow_unused=True)
                    if ds_in is None:
                        ds = torch.zeros_like(p)
                    elif gathered:
                        ds = torch.zeros_like(p).masked_scatter_(keep, ds_in)
                    else:
                        ds = ds_in
                    for i, g in zip(sub_idx, dleaves):
                        if g is not None:
                            dcap[i] += g
            if want_q:
                dq[:, :, lo:hi] = torch.matmul(ds.reshape(B, Hkv, G, C, Lk), kf).reshape(B, Hq, C, D).mul_(scale)
            if want_k:
                dk += torch.matmul(ds.reshape(B, Hkv, G * C, Lk).transpose(-1, -2),
                                   qc.reshape(B, Hkv, G * C, D)).mul_(scale)
    dcap = [g.to(c.dtype) if w else g for g, c, w in zip(dcap, captured, want_cap)]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dcap


# ----------------------------------------------------------------------------------------------------------
# the forward impl


def _forward(attn, q, k, v, scale: float, q_offset: int, params: Sequence[float]):
    """(out, lse) of one call, with parameter values ``params``, on the path a plain call takes: the GPU kernel, or
    the reference on the CPU or with backend='reference'. The LSE is float32 (float64 for float64 inputs on the
    reference)."""
    with _pinned(attn, params):
        if attn.backend == "reference" or not q.is_cuda:
            with torch.no_grad():  # the op's own autograd formula is the backward, not the reference's graph
                out, lse = attn._reference(q, k, v, scale, True, q_offset)
        else:
            dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
            out, lse = attn._run(attn.library(q.dtype, q.shape[-1], dev), q, k, v, scale, True, q_offset)
    return out.contiguous(), lse.contiguous()  # as the fake implementation promises (no-ops as things are)


# ----------------------------------------------------------------------------------------------------------
# the custom ops, defined with the first CompiledAttention (register): they exist before torch.compile can
# trace a call, and `import attngen` does not pay for them

_OPS_DEFINED = False
_OPS_LOCK = threading.Lock()


def _ensure_ops() -> None:
    global _OPS_DEFINED
    if not _OPS_DEFINED:
        with _OPS_LOCK:
            if not _OPS_DEFINED:
                _define_ops()
                _OPS_DEFINED = True


def _define_ops() -> None:
    @torch.library.custom_op("attngen::attention_fwd", mutates_args=())
    def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, captured: List[torch.Tensor],
                      variant: str, scale: float, q_offset: int, params: List[float]
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
        return _forward(_resolve(variant), q, k, v, scale, q_offset, params)

    @attention_fwd.register_fake
    def _(q, k, v, captured, variant, scale, q_offset, params):
        B, Hq, Lq, _ = q.shape
        return q.new_empty((B, Hq, Lq, v.shape[3])), q.new_empty((B, Hq, Lq), dtype=reference.compute_dtype(q.dtype))

    @torch.library.custom_op("attngen::attention_bwd", mutates_args=())
    def attention_bwd(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, captured: List[torch.Tensor],
                      variant: str, scale: float, q_offset: int, params: List[float], needs_grad: List[bool]
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[torch.Tensor]]:
        dq, dk, dv, dcap = _backward(_resolve(variant), dout, dlse, q, k, v, out, lse, captured, scale, q_offset,
                                     params, needs_grad)
        # an op's outputs may not alias its inputs: a kernel (or a .to() that was a no-op) could return one
        inputs = {t.data_ptr() for t in (dout, q, k, v, out, lse, *captured) if t.numel()}
        fresh = [t.clone() if t.numel() and t.data_ptr() in inputs else t for t in (dq, dk, dv, *dcap)]
        return fresh[0], fresh[1], fresh[2], fresh[3:]

    @attention_bwd.register_fake
    def _(dout, dlse, q, k, v, out, lse, captured, variant, scale, q_offset, params, needs_grad):
        dcap = [c.new_empty(c.shape) if n and c.dtype.is_floating_point else c.new_empty(0)
                for c, n in zip(captured, needs_grad[3:])]
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dcap

    def setup_context(ctx, inputs, output):
        q, k, v, captured, variant, scale, q_offset, params = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, *captured)
        # params: the values the forward ran, which the backward must recompute with (the LSE is theirs)
        ctx.variant, ctx.scale, ctx.q_offset, ctx.params = variant, scale, q_offset, list(params)
        # an output nobody used gets None instead of zeros: dlse is None unless the LSE enters the loss, so a
        # kernel without an LSE gradient can take the common case
        ctx.set_materialize_grads(False)
        # a strong reference: `attngen.compile(...)(q, k, v).sum().backward()` drops the object before backward
        ctx.attn = _COMPILED.get(variant)

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *captured = ctx.saved_tensors
        if dout is None:  # only the LSE was used
            dout = torch.zeros_like(out)
        needs = ctx.needs_input_grad  # (q, k, v, [one per captured], variant, scale, q_offset, params)
        needs_grad = [bool(n) for n in needs[:3]] + [bool(n) for n in needs[3]]
        dq, dk, dv, dcap = torch.ops.attngen.attention_bwd(
            dout, dlse, q, k, v, out, lse, captured, ctx.variant, ctx.scale, ctx.q_offset, ctx.params, needs_grad)
        dcap = [g if n else None for g, n in zip(dcap, needs_grad[3:])]
        # params' gradient: torch's custom-op autograd takes a list of numbers as one leaf (gradient None) but an
        # empty list as a list that could have held tensors (gradient [])
        return (dq if needs_grad[0] else None, dk if needs_grad[1] else None, dv if needs_grad[2] else None,
                dcap, None, None, None, None if ctx.params else [])

    attention_fwd.register_autograd(backward, setup_context=setup_context)
