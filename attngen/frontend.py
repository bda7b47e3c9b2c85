"""``attngen.compile``: declare a variant, get a callable that runs it.

Tracing and predicate derivation run once per variant (analysis.py), and their sympy-free facts are
recorded on disk by the mods' fingerprint (analysis_cache.py), so a new process compiling a variant it has
seen before neither traces nor imports sympy. A kernel library is built lazily on the first CUDA call per
(dtype, head dim, device) from its spec (jit/spec.py), cached on disk, and memoised on the compiled
object, so a later call costs a dict lookup plus the launch (launch.py). A call that records an autograd graph,
or that torch.compile traces, goes through the custom ops of autograd.py instead.
"""
from __future__ import annotations

import threading
from typing import Optional, Tuple, Union

import torch

from . import autograd as _autograd
from . import fp8 as _fp8
from .abi import SM90_FALLBACK_CODES
from .analysis_cache import variant_facts
from .errors import InputError, KernelLaunchError
from .jit.spec import BWD_KERNEL, KernelSpec, choose_bwd_kernel
from .jit.toolchain import current_arch
from .ir import check_extents
from .launch import forward, load_bwd_library, load_library, param_fields
from .mods import Variant, as_mask_mod, compose
from .reference import _check_offset
from .sequences import check_bool
from .summaries import check_value_ranges

_BUILD_LOCK = threading.Lock()
# bound once: the hot path calls them on every launch (torch.compile recognises the functions themselves)
_grad_enabled = torch.is_grad_enabled
_compiling = torch.compiler.is_compiling


def _mask_from_options(mask_mod, causal: bool, window):
    from .variants import causal as causal_mask, local, sliding_window

    parts = []
    if window is not None:
        if isinstance(window, (tuple, list)):
            if len(window) != 2:
                raise InputError(f"window must be an int (sliding window) or a (left, right) pair, got {window!r}")
            parts.append(local(window[0], window[1]))
            if causal:
                parts.append(causal_mask())
        else:
            parts.append(sliding_window(window))  # already causal
    elif causal:
        parts.append(causal_mask())
    if mask_mod is not None:
        parts.insert(0, as_mask_mod(mask_mod))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def make_variant(score_mod=None, mask_mod=None, *, causal: bool = False, window=None, softcap=None) -> Variant:
    from .variants import softcap as softcap_mod

    score = compose(softcap_mod(softcap) if softcap is not None else None, score_mod)
    return Variant(score_mod=score, mask_mod=_mask_from_options(mask_mod, causal, window))


class CompiledAttention:
    """A compiled variant. Call it like ``attn(q, k, v)`` with (B, H, L, D) tensors.

    CUDA tensors run the generated kernel (built on first use per dtype/head dim, then cached on
    disk); CPU tensors run ``attngen.reference.attention``.
    """

    def __init__(self, variant: Variant, backend: str = "auto", fast_math: bool = True, deterministic: bool = False):
        if backend not in ("auto", "sm90", "sm80", "reference"):
            raise InputError(f"backend must be one of 'auto', 'sm90', 'sm80', 'reference', got {backend!r}")
        self.variant = variant
        self.backend = backend
        self.fast_math = fast_math
        self.deterministic = check_bool("deterministic", deterministic)
        # facts: what calls and cache keys need (captured tensors, summaries, canonical text); the analysis
        # (traced variant, predicates) when it ran here, else None until something asks for it
        self.facts, self._analysis = variant_facts(variant)
        self._libraries = {}  # (dtype, head dim, device index, kernel, loader) -> loaded library
        self._ready = {}      # (dtype, head dim, device index) -> the library a call launches: the hot path
        self._summaries = _SummaryCache()
        self._bwd_summaries = _SummaryCache()  # the backward kernel's tiles differ from the forward's
        # checked on the hot path (learned slopes): usually empty, as `_ready` holds variants without captures
        self._captured_tensors = tuple(c.tensor for c in self.facts.captured)
        if self.facts.summaries:
            check_value_ranges(self.facts.summaries, {c.name: c.tensor for c in self.facts.captured})
        # the name the autograd custom ops know this object by (they take no Python objects)
        self.op_id = _autograd.register(self)
        if self.facts.summaries and any(t.is_cuda for t in self._captured_tensors):
            self._warm_summaries()

    def _warm_summaries(self):
        """Run each block summary on a few blocks of the captured tensors, once with a partial last block: torch
        loads a CUDA kernel's module on its first use in a process, and the summaries' kernels (min / max, cummax,
        flip, all, searchsorted, ...) would otherwise load on the first call (docs/performance.md, first call of a
        prebuilt variant). A one-position warm-up is not enough: torch skips kernels on one-element and empty
        tensors."""
        tensors = {c.name: c.tensor for c in self.facts.captured}
        n = min([t.shape[-1] for t in tensors.values() if t.dim() >= 1] + [4096])  # the kernels do not depend on n
        for s in self.facts.summaries:
            for length in (n, n - 1):
                blk = max(1, length // 8)
                try:
                    s.compute(tensors, blk, blk, length, length, 0)
                except Exception:  # noqa: BLE001  (only a warm-up: whatever fails here, the call reports it)
                    pass

    @property
    def traced(self):
        """The traced variant (TracedVariant); traced on first use when the facts came from the disk."""
        return self._analyze()[0]

    @property
    def predicates(self):
        """The block predicates (BlockPredicates); derived on first use when the facts came from the disk."""
        return self._analyze()[1]

    def _analyze(self):
        if self._analysis is None:
            from .analysis import analyze  # sympy: only for what needs the expressions

            self._analysis = analyze(self.variant)
        return self._analysis

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def params(self) -> tuple:
        """The runtime parameters (attngen/params.py) the kernels take as arguments, in slot order: change one with
        ``attn.params[k].set(value)``; the next call runs the new value on the same kernel."""
        return tuple(p.param for p in self.facts.params)

    def _param_fields(self):
        """CapturedArgs.iparam / fparam of this call (the parameters' current values), None without parameters."""
        return param_fields(self.facts.params) if self.facts.params else None

    def __repr__(self):
        return f"attngen.compile({self.variant.name}, backend={self.backend!r})"

    def spec(self, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128, arch: Optional[str] = None,
             kernel: Optional[str] = None) -> KernelSpec:
        """The kernel spec of this variant for one signature (``arch`` defaults to the current GPU's)."""
        if kernel is None:
            kernel = self.backend if self.backend in ("sm80", "sm90") else "auto"
        # the key name: runtime parameters by name, as one library serves all their values
        return KernelSpec.for_facts(self.facts, self._analyze, name=self.variant.key_name, dtype=dtype,
                                    head_dim=head_dim, arch=arch or current_arch(), kernel=kernel,
                                    fast_math=self.fast_math)

    def library(self, dtype: torch.dtype, head_dim: int, device_index: int, kernel: Optional[str] = None):
        """The loaded library for one signature on one device, built (or found in the cache) on first use."""
        lib = self._load(dtype, head_dim, device_index, kernel, load_library)
        if kernel is None and not self.facts.captured and dtype != _fp8.FP8:
            # the hot path: variants that read no captured tensors need no per-call layout checks
            self._ready[(dtype, head_dim, device_index)] = lib
        return lib

    def backward_kernels(self, head_dim: int, device_index: int) -> tuple:
        """The backward families a call on this device tries, in order: 'sm90_bwd' on sm_90a at head dims 64 / 128
        (unless backend='sm80'), then the portable 'sm80_bwd' (any sm80+ GPU; it also takes a call whose layout
        TMA cannot describe)."""
        first = BWD_KERNEL if self.backend == "sm80" else choose_bwd_kernel(current_arch(device_index), head_dim)
        return tuple(dict.fromkeys((first, BWD_KERNEL)))

    def backward_library(self, dtype: torch.dtype, head_dim: int, device_index: int, kernel: Optional[str] = None):
        """The loaded backward library (launch.backward) for one signature on one device, built (or found in the
        cache) on first use: the first of ``backward_kernels`` unless ``kernel`` names a family. Its block_q /
        block_k size the block summaries of a backward call."""
        kernel = kernel or self.backward_kernels(head_dim, device_index)[0]
        return self._load(dtype, head_dim, device_index, kernel, load_bwd_library)

    def decode_library(self, dtype: torch.dtype, head_dim: int, device_index: int):
        """The KV-cache kernel (decode.decode, any sm80+ GPU) for one signature on one device: the forward library's
        second entry point, so built (or found in the cache) with the forward on first use."""
        from .decode import load_decode_library

        return self._load(dtype, head_dim, device_index, None, load_decode_library)

    def _load(self, dtype: torch.dtype, head_dim: int, device_index: int, kernel: Optional[str], loader):
        """The library of one signature and kernel family, seen through `loader` (the forward library is loaded
        twice: as the forward and as the KV-cache kernel): memoised, else built (or found in the cache) and loaded
        under the build lock (checked again inside it)."""
        key = (dtype, head_dim, device_index, kernel, loader)
        lib = self._libraries.get(key)
        if lib is None:
            with _BUILD_LOCK:
                lib = self._libraries.get(key)
                if lib is None:
                    spec = self.spec(dtype, head_dim, current_arch(device_index), kernel)
                    lib = self._libraries[key] = loader(spec.build_cached())
                    lib.param_count = len(self.facts.params)
                    lib.captured_count = len(self.facts.captured)
                    lib.summary_count = len(self.facts.summaries)
        return lib

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
                 return_lse: bool = False, q_offset: int = 0, q_descale=None, k_descale=None, v_descale=None):
        """``out = attn(q, k, v)``: q (B, Hq, Lq, D), k / v (B, Hkv, Lk, D). FP8 inputs (torch.float8_e4m3fn, the sm90
        forward, attngen/fp8.py) take ``q_descale`` / ``k_descale`` / ``v_descale`` of shape (B, Hkv) and return
        bfloat16."""
        # Hot path: a library already loaded for this dtype, head dim and device, and no autograd graph to
        # record; forward() checks the rest. Anything unusual (not a tensor, CPU tensors, a first call,
        # gradients, torch.compile tracing, FP8) takes the full path below.
        try:
            lib = self._ready.get((q.dtype, q.shape[-1], q.get_device()))
        except (AttributeError, IndexError, TypeError):
            lib = None
        if lib is not None and q_offset.__class__ is int and q_offset >= 0 and not _compiling() and not (
                _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                     or any(t.requires_grad for t in self._captured_tensors))) \
                and q_descale is None and k_descale is None and v_descale is None:
            return self._run(lib, q, k, v, scale, return_lse, q_offset)
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            raise InputError("q, k, v must be torch tensors of shape (B, H, L, D)")
        if q_offset.__class__ is not int or q_offset < 0:
            q_offset = _check_offset(q_offset)
        descales = (q_descale, k_descale, v_descale)
        if q.dtype == _fp8.FP8:
            return self._fp8(q, k, v, descales, scale, return_lse, q_offset)
        if any(d is not None for d in descales):
            raise InputError(f"q_descale / k_descale / v_descale are for torch.float8_e4m3fn inputs (the FP8 forward), "
                             f"got q in {q.dtype}: drop them, or pass q, k and v quantised to e4m3")
        if _compiling() or (_grad_enabled() and _autograd.needs_grad(self, q, k, v)):
            # the custom ops: differentiable, and one opaque node in a torch.compile graph (autograd.py)
            return _autograd.attention(self, q, k, v, scale=scale, return_lse=return_lse, q_offset=q_offset)
        if self.backend == "reference" or not q.is_cuda:
            return self._reference(q, k, v, scale, return_lse, q_offset)
        if q.dim() != 4:
            raise InputError(f"q must have shape (B, H, L, D), got {tuple(q.shape)}")
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        return self._run(self.library(q.dtype, q.shape[-1], dev), q, k, v, scale, return_lse, q_offset)

    def _fp8(self, q, k, v, descales, scale, return_lse, q_offset):
        """The FP8 forward (attngen/fp8.py): the e4m3 sm90 kernel, or its reference on the CPU / backend='reference'.
        Inference only: no autograd, no torch.compile graph."""
        if _compiling():
            raise InputError("the FP8 forward runs eagerly: call it outside the torch.compile'd region (wrap the call "
                             "in torch.compiler.disable), or use bfloat16 inputs inside it")
        if _grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise InputError("the FP8 forward is inference-only: q, k, v require grad; run it under torch.no_grad(), "
                             "or train with bfloat16 inputs")
        if self.backend == "reference" or not q.is_cuda:
            self._check_reference_extents(q, k, q_offset)
            return _fp8.reference_forward(self.variant, q, k, v, descales, scale=scale, return_lse=return_lse,
                                          q_offset=q_offset)
        if self.backend == "sm80":
            raise InputError("backend='sm80' has no FP8 kernel (the FP8 forward is the sm90 kernel's): compile with "
                             "backend='auto', or pass bfloat16 inputs")
        if q.dim() != 4:
            raise InputError(f"q must have shape (B, H, L, D), got {tuple(q.shape)}")
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        lib = self._load(_fp8.FP8, q.shape[-1], dev, None, load_library)
        return self._launch(lib, q, k, v, scale, return_lse, q_offset, entry=_fp8.forward, descales=descales)

    def _reference(self, q, k, v, scale, return_lse, q_offset):
        """The call on the reference implementation (CPU tensors, or backend='reference')."""
        from . import reference

        self._check_reference_extents(q, k, q_offset)
        return reference.attention(q, k, v, self.variant, scale=scale, return_lse=return_lse, q_offset=q_offset)

    def _check_reference_extents(self, q, k, q_offset):
        """The captured tensors' extents against the call's shapes, before a reference run (a clear error, not an
        IndexError from inside torch)."""
        if q.dim() == 4 and k.dim() == 4 and self.facts.captured:
            check_extents(self.facts.captured, [c.tensor for c in self.facts.captured], q.shape[0],
                          q.shape[1], q.shape[2], k.shape[2], q_offset)

    def _run(self, lib, q, k, v, scale, return_lse, q_offset):
        """Launch on ``lib``; a layout the sm90 kernel's TMA cannot describe runs on the portable kernel."""
        try:
            return self._launch(lib, q, k, v, scale, return_lse, q_offset)
        except KernelLaunchError as e:
            if e.code not in SM90_FALLBACK_CODES:
                raise
            portable = self.library(q.dtype, q.shape[-1], q.get_device(), "sm80")
            return self._launch(portable, q, k, v, scale, return_lse, q_offset)

    def _launch(self, lib, q, k, v, scale, return_lse, q_offset, entry=None, **kw):
        """``entry`` (launch.forward when None, or fp8.forward with its ``descales`` in kw) on lib, with the variant's
        captured tensors and block summaries when it reads any."""
        entry = entry or forward
        if not self.facts.captured:
            return entry(lib, q, k, v, scale=scale, q_offset=q_offset, return_lse=return_lse,
                         params=self._param_fields(), **kw)
        captured = self.captured_on(q.device)
        check_extents(self.facts.captured, captured, q.shape[0], q.shape[1], q.shape[2], k.shape[2], int(q_offset))
        summaries = self._summaries.get(self, captured, lib, q.shape[2], k.shape[2], int(q_offset))
        return entry(lib, q, k, v, scale=scale, q_offset=int(q_offset), return_lse=return_lse,
                     captured=captured, summaries=summaries, params=self._param_fields(), **kw)

    def captured_on(self, device: torch.device) -> list:
        """The captured tensors a kernel call on ``device`` passes, each checked to be there and in the layout its
        generated code reads (InputError naming the fix otherwise)."""
        captured = [c.tensor for c in self.facts.captured]
        for c, t in zip(self.facts.captured, captured):
            if t.device != device:
                raise InputError(
                    f"captured tensor {c.name} ({t.dtype}, shape {tuple(t.shape)}) is on {t.device} but q is on "
                    f"{device}; move it before compiling (e.g. doc_ids.to('{device}'))"
                )
            problem = c.check_layout(t)
            if problem is not None:
                raise InputError(problem)
        return captured

    def with_kvcache(self, q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None,
                     rotary_cos=None, rotary_sin=None, rotary_interleaved=False, cache_batch_idx=None, num_splits=0,
                     return_lse=False, scale=None):
        """Attention against a KV cache, appending ``k``/``v`` in place (flash_attn_with_kvcache, (B, H, L, D)).

        q (B, Hq, Lq, D); cache (B, Hkv, L_max, D), or paged (num_pages, Hkv, page_size, D) with an int32
        ``page_table`` (B, max_pages); ``cache_seqlens`` (int or int32 (B,)) the cached lengths s_b before the
        append. Query i of batch b sits at position s_b + i; keys are cache positions 0 .. s_b + L_new - 1.
        Returns out (B, Hq, Lq, Dv) (and lse (B, Hq, Lq)). CUDA tensors run the decode kernel (split-KV, GQA heads
        packed per CTA, any page size; ``num_splits`` 0 picks the split count); CPU tensors and
        ``backend='reference'`` run the reference (attngen/kvcache.py)."""
        from .kvcache import with_kvcache

        return with_kvcache(self, q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos, rotary_sin,
                            rotary_interleaved, cache_batch_idx, num_splits, return_lse, scale)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
               scale=None, return_lse=False):
        """Packed variable-length sequences (flash_attn_varlen_func's layout): q (total_q, Hq, D), k/v
        (total_k, Hkv, D), int32 ``cu_seqlens_q``/``cu_seqlens_k`` (B + 1,). Indices are local to each
        sequence, queries aligned to the end of its keys. Returns out (total_q, Hq, Dv) (and lse (Hq, total_q)).
        CUDA tensors run the forward kernel once per sequence (attngen/varlen.py), CPU tensors the reference."""
        from .varlen import varlen

        return varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, scale,
                      return_lse)

    def block_map(self, q_len: int, kv_len: Optional[int] = None, block=(128, 128), **kw):
        from .blockmap import block_map

        return block_map(self, q_len, q_len if kv_len is None else kv_len, block, **kw)

    def explain(self, q_len: int = 32768, kv_len: Optional[int] = None, **kw) -> str:
        from .blockmap import explain

        return explain(self, q_len, kv_len, **kw)


class _SummaryCache:
    """Per-block summaries of captured tensors, recomputed only when a tensor or a length changes
    (keyed by data pointer and torch's in-place version counter).

    Key and value are stored as one tuple and a call returns the value it computed or read: with two fields,
    threads calling one variant could return each other's summaries. Inference tensors
    (``torch.inference_mode``) have no version counter: their summaries are recomputed on every call."""

    def __init__(self):
        self.entry = (None, ())  # (key, summaries)

    def get(self, attn, captured, lib, Lq, Lk, q_offset):
        summaries = attn.facts.summaries
        if not summaries:
            return ()
        key = None
        if not any(t.is_inference() for t in captured):
            key = (lib.block_q, lib.block_k, Lq, Lk, q_offset,
                   tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in captured))
            entry = self.entry
            if key == entry[0]:
                return entry[1]
        tensors = {c.name: t for c, t in zip(attn.facts.captured, captured)}
        value = tuple(s.compute(tensors, lib.block_q, lib.block_k, Lq, Lk, q_offset) for s in summaries)
        if key is not None:
            self.entry = (key, value)
        return value


def compile(score_mod=None, mask_mod=None, *, causal: bool = False, window: Union[None, int, Tuple] = None,
            softcap: Optional[float] = None, backend: str = "auto", fast_math: bool = True,
            deterministic: bool = False) -> CompiledAttention:
    """Compile an attention variant.

    Args:
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention signature), or a
            library ScoreMod (``attngen.softcap(30)``, ``attngen.alibi(16)``).
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool``, or a library MaskMod; combined with the
            options below by ``&``.
        causal: add a causal mask.
        window: ``int`` W for a causal sliding window (kv in (q-W, q]); ``(left, right)`` for a local
            window (kv in [q-left, q+right], FA3 semantics; None on a side means unbounded).
        softcap: ``c`` applies ``c * tanh(score / c)`` before ``score_mod``.
        backend: 'auto' (SM90 kernel on Hopper when available, else the portable SM80 kernel),
            'sm80', 'sm90', or 'reference' (the chunked PyTorch implementation).
        fast_math: use the approximate tanh/exp2 instructions in score mods.
        deterministic: a backward whose dq, dk, dv are bit-identical across runs (the sm90 kernel adds dQ in a
            fixed order; elsewhere the float32 recompute runs). ``torch.use_deterministic_algorithms(True)``
            asks for the same.

    Example:
        >>> attn = attngen.compile(score_mod=attngen.softcap(30), window=4096)
        >>> out = attn(q, k, v)
    """
    return CompiledAttention(make_variant(score_mod, mask_mod, causal=causal, window=window, softcap=softcap),
                             backend=backend, fast_math=fast_math, deterministic=deterministic)
