"""Launch stage: load a compiled kernel library (ctypes) and launch it on torch tensors.

The library exports the C ABI of ``templates/attngen_common.cuh``::

    int         attngen_abi_version(void);
    int         attngen_kernel_info(AttngenKernelInfo*);
    int         attngen_fwd(const AttngenFwdArgs*, void* stream);   // cudaError_t, no sync
    const char* attngen_error_string(int);

``forward`` validates the inputs before launching (every problem raises ``InputError`` naming what was
expected, what was passed and the fix) and launches on the current torch stream of the inputs' device.
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Optional, Sequence

import torch

from .abi import (ABI_VERSION, DTYPE_CODES, ERROR_SCALE_NOT_POSITIVE, FP8_CODE, MAX_CAPTURED, MAX_PARAMS,
                  MAX_SUMMARIES, SUPPORTED_HEAD_DIMS)
from .errors import BuildError, InputError, KernelLaunchError

# q_offset + q_len and kv_len stay this far below 2**31: kernels compute indices a tile beyond them
_INDEX_MARGIN = 256

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
_MAX_GRID_YZ = 65535
_DTYPE_CODES = {code: getattr(torch, name) for code, name in DTYPE_CODES.items()}


# --------------------------------------------------------------------------------------------------
# ctypes mirror of the ABI structs (documentation, tests and debugging; the hot path packs bytes).


class CapturedArgs(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_void_p * MAX_CAPTURED),
        ("stride", (ctypes.c_longlong * 4) * MAX_CAPTURED),
        ("summary", ctypes.c_void_p * MAX_SUMMARIES),
        ("iparam", ctypes.c_int * MAX_PARAMS),
        ("fparam", ctypes.c_float * MAX_PARAMS),
    ]


class AttngenFwdArgs(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("q_stride", ctypes.c_longlong * 3),
        ("k_stride", ctypes.c_longlong * 3),
        ("v_stride", ctypes.c_longlong * 3),
        ("o_stride", ctypes.c_longlong * 3),
        ("B", ctypes.c_int),
        ("Hq", ctypes.c_int),
        ("Hkv", ctypes.c_int),
        ("Lq", ctypes.c_int),
        ("Lk", ctypes.c_int),
        ("D", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("q_offset", ctypes.c_int),
        ("captured", CapturedArgs),
        ("descale", ctypes.c_void_p),  # FP8 libraries only (attngen/fp8.py)
    ]


class AttngenKernelInfo(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int)
        for name in ("abi_version", "args_size", "head_dim", "dtype", "block_q", "block_k", "num_threads",
                     "smem_bytes", "arch")
    ]


# The same layout as one struct.pack call: 5 pointers, 4x3 int64 strides, 6 int32, float, int32,
# 8 captured pointers, 8x4 int64 captured strides, 16 summary pointers, 8 int32 and 8 float32 runtime
# parameters, the descale pointer. Little-endian, no padding (every field is already naturally aligned).
_PACK = struct.Struct("<5Q12q6ifi8Q32q16Q8i8fQ")
_PACK_HEAD = struct.Struct("<5Q12q6ifi")   # everything before `captured`
_PACK_TAIL = struct.Struct("<8Q32q16Q8i8f")  # CapturedArgs
_PACK_DESCALE = struct.Struct("<Q")  # descale: 0 (NULL) for 16-bit libraries
assert _PACK.size == _PACK_HEAD.size + _PACK_TAIL.size + _PACK_DESCALE.size == ctypes.sizeof(AttngenFwdArgs) == 688
assert _PACK_HEAD.size == AttngenFwdArgs.captured.offset
assert _PACK_HEAD.size + _PACK_TAIL.size == AttngenFwdArgs.descale.offset
_NO_DESCALE = _PACK_DESCALE.pack(0)
_ZERO_TAIL = bytes(_PACK_TAIL.size)  # CapturedArgs of a call without captures, summaries, parameters
_ZERO_FWD_TAIL = _ZERO_TAIL + _NO_DESCALE  # ... and the NULL descale of a 16-bit forward
_NO_PARAMS = (0,) * MAX_PARAMS + (0.0,) * MAX_PARAMS  # iparam, fparam of a variant without runtime parameters


class _Library:
    """What the forward and backward libraries share: the handle, what the library was built for
    (AttngenKernelInfo), attngen_error_string."""

    # captured tensors and block summaries its variant reads (set with param_count by CompiledAttention): a launch
    # passing fewer would hand the kernel null pointers
    captured_count = 0
    summary_count = 0

    def __init__(self, path: str, handle: ctypes.CDLL, info: AttngenKernelInfo):
        self.path = path
        self.handle = handle
        # runtime parameters its variant reads (set by CompiledAttention when it loads the library): a launch
        # without their values would run zeros
        self.param_count = 0
        self.head_dim = info.head_dim
        self.dtype = _DTYPE_CODES[info.dtype]
        self.block_q = info.block_q
        self.block_k = info.block_k
        self.num_threads = info.num_threads
        self.smem_bytes = info.smem_bytes
        self.arch = info.arch
        self._err = handle.attngen_error_string
        self._err.argtypes = [ctypes.c_int]
        self._err.restype = ctypes.c_char_p
        # debug builds (ATTNGEN_DEBUG=1) export the captured slot of their bounds record; None otherwise
        self.debug_slot = None
        debug_slot_fn = getattr(handle, "attngen_debug_slot", None)
        if debug_slot_fn is not None:
            debug_slot_fn.argtypes = []
            debug_slot_fn.restype = ctypes.c_int
            self.debug_slot = int(debug_slot_fn())

    def error_string(self, code: int) -> str:
        s = self._err(int(code))
        return s.decode(errors="replace") if s else f"CUDA error {code}"

    def __repr__(self):
        return (f"{type(self).__name__}({self.path!r}, {str(self.dtype).replace('torch.', '')}, "
                f"head_dim={self.head_dim}, tiles={self.block_q}x{self.block_k}, sm_{self.arch})")


def _refuse_fp8(path: str):
    def refuse(packed, stream):
        raise InputError(f"{path} is an FP8 library: call it through attngen.fp8.forward, or call the compiled object "
                         "with float8_e4m3fn q, k, v (it makes V^T and the descale block the kernel reads)")
    return refuse


class KernelLibrary(_Library):
    """A loaded kernel library and what it was built for."""

    def __init__(self, path: str, handle: ctypes.CDLL, info: AttngenKernelInfo):
        super().__init__(path, handle, info)
        self._fwd = handle.attngen_fwd
        self._fwd.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self._fwd.restype = ctypes.c_int
        # FP8 libraries: entered through attngen/fp8.py only (V^T and the descale block), which holds the entry as
        # _fwd_fp8; forward() reaching one is refused before anything runs
        self._fwd_fp8 = None
        if self.dtype == _DTYPE_CODES[FP8_CODE]:
            self._fwd_fp8, self._fwd = self._fwd, _refuse_fp8(path)
        self._fp8_v_transpose = getattr(handle, "attngen_fp8_v_transpose", None)
        if self._fp8_v_transpose is not None:
            self._fp8_v_transpose.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3 + \
                [ctypes.c_longlong] * 3 + [ctypes.c_void_p]
            self._fp8_v_transpose.restype = ctypes.c_int

    def launch(self, packed_args: bytes, stream: int) -> int:
        """attngen_fwd on a packed AttngenFwdArgs (see _PACK); returns the cudaError_t code."""
        return self._fwd(packed_args, stream)


def _open_library(path: str, info_name: str, entry: str, what: str) -> tuple:
    """ctypes handle of a library exporting attngen_abi_version, `info_name`, `entry` and attngen_error_string;
    (handle, attngen_abi_version(), its AttngenKernelInfo: all zero when the info call fails, which no check
    accepts). The info function is called only for a library of this ABI version: a stale one may fill a larger
    struct than ours, writing past it."""
    try:
        handle = ctypes.CDLL(path)
    except OSError as e:
        raise BuildError(f"could not load the kernel library {path}: {e}. Delete it so that it is rebuilt.") from e
    try:
        version_fn, info_fn = handle.attngen_abi_version, getattr(handle, info_name)
        getattr(handle, entry)
        handle.attngen_error_string
    except AttributeError as e:
        raise BuildError(f"{path} is not an attngen {what} ({e}); delete it so that it is rebuilt") from e
    version_fn.restype, version_fn.argtypes = ctypes.c_int, []
    version = version_fn()
    info = AttngenKernelInfo()
    if version != ABI_VERSION:
        return handle, version, info  # the callers' version checks reject it
    info_fn.argtypes = [ctypes.POINTER(AttngenKernelInfo)]
    info_fn.restype = ctypes.c_int
    if info_fn(ctypes.byref(info)) != 0:
        info = AttngenKernelInfo()
    return handle, version, info


def load_library(path) -> KernelLibrary:
    """Load a compiled kernel library and check that it speaks this ABI."""
    path = str(path)
    handle, version, info = _open_library(path, "attngen_kernel_info", "attngen_fwd", "kernel library")
    if version != ABI_VERSION:
        raise BuildError(
            f"{path} speaks attngen ABI version {version}, this attngen expects {ABI_VERSION}: it was built by "
            "another attngen version; delete it (or clear the kernel cache) so that it is rebuilt"
        )
    if info.args_size != _PACK.size or info.dtype not in _DTYPE_CODES:
        raise BuildError(
            f"{path} reports an argument block of {info.args_size} bytes (dtype code {info.dtype}); this attngen "
            f"packs {_PACK.size}: the library is stale, delete it so that it is rebuilt"
        )
    return KernelLibrary(path, handle, info)


# --------------------------------------------------------------------------------------------------
# launching

_capable_devices: set = set()  # device indices already checked to be sm80+


def _check_capability(dev: int) -> None:
    major, minor = torch.cuda.get_device_capability(dev)
    if major < 8:
        raise InputError(
            f"the attention kernels need a GPU of compute capability 8.0 (Ampere) or newer; cuda:{dev} "
            f"({torch.cuda.get_device_name(dev)}) is sm_{major}{minor}. Run on an sm80+ GPU, or use the "
            "reference implementation on this one"
        )
    _capable_devices.add(dev)


try:
    _current_device = torch._C._cuda_getDevice  # no lazy-init check: tensors on the GPU imply it is done
except AttributeError:  # pragma: no cover
    _current_device = torch.cuda.current_device


try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # the current stream's handle, without a Stream object
except AttributeError:  # pragma: no cover  (a torch without the private fast path)
    def _raw_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


def _name_shape(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)}"


def _check_qkv(lib: KernelLibrary, q, k, v) -> None:
    """InputError naming the fix unless q, k, v are what lib's forward reads. An FP8 library (attngen/fp8.py) takes
    e4m3 q, k, v, and v in any layout: its kernel reads the V^T copy fp8.py makes."""
    fp8 = lib.dtype == _DTYPE_CODES[FP8_CODE]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise InputError(f"{name} is on {t.device}, expected a CUDA tensor: move q, k and v to the GPU "
                             f"(e.g. {name}.cuda())")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, v on {v.device}: "
                         f"move them with .to({q.device})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if fp8 and t.dtype != lib.dtype:
            raise InputError(f"FP8 attention takes q, k and v in torch.float8_e4m3fn, got {name} {t.dtype}: quantise "
                             f"all three (e.g. ({name} / {name}_descale).to(torch.float8_e4m3fn))")
        if not fp8 and t.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{name} has dtype {t.dtype}, expected torch.bfloat16 or torch.float16: convert with "
                             f"{name}.to(torch.bfloat16)")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k and v must have one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}: convert them "
                         f"with .to({q.dtype})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise InputError(f"{name} has shape {_name_shape(t)} (rank {t.dim()}), expected rank 4 with layout "
                             "(batch, heads, seq_len, head_dim); add a batch dimension with .unsqueeze(0), or "
                             "transpose a (batch, seq_len, heads, head_dim) tensor with .transpose(1, 2)")
    B, Hq, Lq, D = q.shape
    Bk, Hkv, Lk, Dk = k.shape
    Bv, Hv, Lv, Dv = v.shape
    if not (B == Bk == Bv):
        raise InputError(f"batch sizes differ: q {B}, k {Bk}, v {Bv} (shapes q {_name_shape(q)}, k {_name_shape(k)}, "
                         f"v {_name_shape(v)}); expected one batch size")
    if D not in SUPPORTED_HEAD_DIMS:
        raise InputError(f"head dim {D} (q.shape[-1]) is not supported: supported head dims are "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}; pad q, k and v to one of them (and keep "
                         "the scale of the original head dim)")
    if not (Dk == D and Dv == D):
        raise InputError(f"head dims differ: q {D}, k {Dk}, v {Dv}; the kernels need q, k and v to share one "
                         "head dim (pad v to the qk head dim and slice the output)")
    if Hkv != Hv or Lk != Lv:
        raise InputError(f"k {_name_shape(k)} and v {_name_shape(v)} must have the same heads and sequence length")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) for grouped-query "
                         "attention; repeat k and v heads, or pass matching head counts")
    if B > _MAX_GRID_YZ or Hq > _MAX_GRID_YZ:
        raise InputError(f"batch ({B}) and query heads ({Hq}) must each be at most {_MAX_GRID_YZ}; split the call")
    if D != lib.head_dim or q.dtype != lib.dtype:
        raise InputError(f"this kernel library was compiled for head dim {lib.head_dim} and {lib.dtype}, got head "
                         f"dim {D} and {q.dtype}: compile the variant for these inputs")
    for name, t in ((("q", q), ("k", k)) if fp8 else (("q", q), ("k", k), ("v", v))):
        st, per16 = t.stride(), 16 // t.element_size()  # elements in 16 bytes
        if st[3] != 1:
            raise InputError(f"{name}'s last dimension must be contiguous (stride 1), got strides {tuple(st)}: pass "
                             f"{name}.contiguous()")
        if t.data_ptr() % 16 != 0 or any(st[d] % per16 != 0 and t.shape[d] > 1 for d in range(3)):
            raise InputError(f"{name} must be 16-byte aligned with batch/head/seq strides that are multiples of "
                             f"{per16} elements, got data_ptr % 16 = {t.data_ptr() % 16} and strides {tuple(st)}: "
                             f"pass {name}.contiguous() (or {name}.clone() for a misaligned storage offset)")


def _checked_call(lib, q, k, v, params, captured, summaries) -> int:
    """The device of a call of lib on q, k, v, after the checks every entry but forward's fast path makes: what lib's
    variant reads passed (_check_variant_inputs), q / k / v what lib reads (_check_qkv), a device that runs lib's
    kernels."""
    _check_variant_inputs(lib, params, captured, summaries)
    _check_qkv(lib, q, k, v)
    dev = q.get_device()
    if dev not in _capable_devices:
        _check_capability(dev)
    return dev


def _check_variant_inputs(lib, params, captured, summaries) -> None:
    """Runtime parameters, captured tensors and block summaries passed where lib's variant reads them: without them a
    kernel would run parameters as 0 and read null pointers."""
    if params is None and lib.param_count:
        raise _missing_params(lib)
    if len(captured) < lib.captured_count or len(summaries) < lib.summary_count:
        raise InputError(
            f"{lib.path} reads {lib.captured_count} captured tensor(s) and {lib.summary_count} block summaries, but "
            f"this launch passed {len(captured)} and {len(summaries)}; pass captured=[c.tensor for c in "
            "attn.facts.captured] and summaries=[s.compute(...) for s in attn.facts.summaries] (computed for "
            "lib.block_q / lib.block_k), or call the compiled object, which does")


def _missing_params(lib) -> InputError:
    return InputError(
        f"{lib.path} reads {lib.param_count} runtime parameter(s), but this launch passed none (params=None would run "
        "them as 0); pass params=attn._param_fields() (or launch.param_fields(attn.traced.params)), or call the "
        "compiled object, which does"
    )


def param_fields(params) -> tuple:
    """CapturedArgs.iparam and .fparam for ``params`` (ParamSlots), from the live parameters' current values,
    each checked again (RuntimeParam.check: a value set on the object bypassing set() must not reach a kernel)."""
    ints, floats = [0] * MAX_PARAMS, [0.0] * MAX_PARAMS
    for p in params:
        value = p.param.check(p.param.value)
        if p.integer:
            ints[p.slot] = value
        else:
            floats[p.slot] = value
    return (*ints, *floats)


def _captured_fields(device: torch.device, captured: Sequence[torch.Tensor],
                     summaries: Sequence[torch.Tensor], params: tuple = _NO_PARAMS) -> tuple:
    if len(captured) > MAX_CAPTURED:
        raise InputError(f"{len(captured)} captured tensors, at most {MAX_CAPTURED} are supported: combine some of "
                         "them into one tensor")
    if len(summaries) > MAX_SUMMARIES:
        raise InputError(f"{len(summaries)} block summaries, at most {MAX_SUMMARIES} are supported")
    ptrs = [0] * MAX_CAPTURED
    strides = [0] * (4 * MAX_CAPTURED)
    for n, t in enumerate(captured):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"captured tensor #{n} is a {type(t).__name__}, expected a torch.Tensor")
        if t.device != device:
            raise InputError(f"a tensor used by the score_mod/mask_mod (captured tensor #{n}, shape {tuple(t.shape)}) "
                             f"is on {t.device} but q is on {device}: move it with .to('{device}') before the call")
        if t.dim() > 4:
            raise InputError(f"captured tensor #{n} has rank {t.dim()}, at most 4 is supported: index a view of it")
        ptrs[n] = t.data_ptr()
        for d, s in enumerate(t.stride()):
            strides[4 * n + d] = s
    sums = [0] * MAX_SUMMARIES
    for n, t in enumerate(summaries):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"block summary #{n} is a {type(t).__name__}, expected a torch.Tensor")
        if t.device != device:
            raise InputError(f"block summary #{n} is on {t.device} but q is on {device}: compute it on {device}")
        if t.dtype not in (torch.int32, torch.float32) or (t.dim() != 1 and t.numel() > 1) or \
                (t.numel() > 1 and t.stride(-1) != 1):
            raise InputError(f"block summary #{n} must be a contiguous 1-D int32 or float32 tensor, got dtype "
                             f"{t.dtype}, shape {tuple(t.shape)}, strides {tuple(t.stride())}")
        sums[n] = t.data_ptr()
    return (*ptrs, *strides, *sums, *params)


def _layout_ok(t: torch.Tensor, shape: tuple) -> bool:
    """Contiguous last dim, 16-byte aligned, batch/head/seq strides in whole 16-byte vectors (where stepped)."""
    st = t.stride()
    return st[3] == 1 and t.data_ptr() % 16 == 0 and not any(st[d] % 8 and shape[d] > 1 for d in range(3))


def _check_out(out: torch.Tensor, shape: tuple, dtype: torch.dtype, device: torch.device, name: str = "out",
               fix: Optional[str] = None) -> None:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != dtype or out.device != device:
        got = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
               else type(out).__name__)
        raise InputError(f"{name} must be a {shape} {dtype} tensor on {device}, got {got}")
    if not _layout_ok(out, shape):
        raise InputError(f"{name} must have a contiguous last dim, 16-byte alignment and strides that are multiples "
                         f"of 8 elements, got strides {tuple(out.stride())}: {fix or f'pass a torch.empty{shape} tensor'}")


def _check_scalars(scale, q_offset, D: int, Lq: int, Lk: int) -> tuple:
    """(scale, q_offset) of a call, checked: a finite scale (None: 1/sqrt(D)), 0 <= q_offset, indices in int32."""
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif not math.isfinite(scale):
        raise InputError(f"scale must be a finite number, got {scale}; pass None for 1/sqrt(head_dim)")
    if q_offset.__class__ is not int:
        q_offset = int(q_offset)
    if q_offset < 0:  # generated code and block predicates rely on q_idx >= 0 (C division, numeric ranges)
        raise InputError(f"q_offset must be >= 0 (the absolute position of the first query), got {q_offset}")
    # kernels form indices up to a tile past the last row (the sm90 relative-score walk starts at q_idx + 8)
    if not (q_offset + Lq + _INDEX_MARGIN < 2**31 and Lk + _INDEX_MARGIN < 2**31):
        raise InputError(f"q_offset {q_offset} with {Lq} queries and {Lk} keys leaves the int32 range of q_idx / "
                         "kv_idx: use a smaller q_offset or shorter sequences")
    return scale, q_offset


def _check_lse_out(lse: torch.Tensor, shape: tuple, device: torch.device, name: str = "lse_out") -> None:
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != shape or lse.dtype != torch.float32 \
            or lse.device != device or not lse.is_contiguous():
        got = (f"{tuple(lse.shape)} {lse.dtype} on {lse.device}, contiguous={lse.is_contiguous()}"
               if isinstance(lse, torch.Tensor) else type(lse).__name__)
        raise InputError(f"{name} must be a contiguous {shape} float32 tensor on {device}, got {got}")


def forward(
    lib: KernelLibrary,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    q_offset: int = 0,
    return_lse: bool = False,
    captured: Sequence[torch.Tensor] = (),
    summaries: Sequence[torch.Tensor] = (),
    out: Optional[torch.Tensor] = None,
    lse_out: Optional[torch.Tensor] = None,
    params: Optional[tuple] = None,
):
    """Attention forward with a compiled variant. q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), bf16 or fp16,
    any strides with a contiguous last dim. Returns out (B, Hq, Lq, D) in q's dtype, or (out, lse)
    with lse (B, Hq, Lq) float32 natural-log (-inf for rows with nothing kept).
    ``captured``: tensors the mods read, in TracedVariant.captured order; ``summaries``: the per-block
    arrays of BlockPredicates.summaries, computed for lib.block_q / lib.block_k. ``out`` / ``lse_out``:
    optional preallocated outputs (out: any strides with a contiguous last dim; lse_out contiguous).
    ``params``: CapturedArgs.iparam + fparam (``param_fields``), None for a variant without runtime parameters."""
    _check_variant_inputs(lib, params, captured, summaries)
    if lib.debug_slot is not None and captured and len(captured) == lib.debug_slot:
        return _forward_debug(lib, q, k, v, captured, dict(scale=scale, q_offset=q_offset, return_lse=return_lse,
                                                           summaries=summaries, out=out, lse_out=lse_out,
                                                           params=params))
    # Fast path: one conjunction that implies every check of _check_qkv; only when it fails does the
    # detailed (slower) checker run, to raise the right message (or to accept a corner it allows).
    dt = lib.dtype
    try:
        dev = q.get_device()
        qsh, ksh, vsh = q.shape, k.shape, v.shape
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        fast_ok = (
            dev >= 0 and k.get_device() == dev and v.get_device() == dev
            and q.dtype is dt and k.dtype is dt and v.dtype is dt
            and len(qsh) == 4 and len(ksh) == 4 and ksh == vsh
            and qsh[0] == ksh[0] and qsh[3] == ksh[3] == lib.head_dim
            and ksh[1] > 0 and qsh[1] % ksh[1] == 0 and qsh[0] <= _MAX_GRID_YZ and qsh[1] <= _MAX_GRID_YZ
            and qs[3] == 1 and ks[3] == 1 and vs[3] == 1
            and ((qp | kp | vp) & 15) == 0
            and ((qs[0] | qs[1] | qs[2] | ks[0] | ks[1] | ks[2] | vs[0] | vs[1] | vs[2]) & 7) == 0
        )
    except (AttributeError, TypeError):
        fast_ok = False
    if not fast_ok:
        _check_qkv(lib, q, k, v)
        dev = q.get_device()
        qsh, ksh = q.shape, k.shape
        qs, ks, vs = q.stride(), k.stride(), v.stride()
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if dev not in _capable_devices:
        _check_capability(dev)

    B, Hq, Lq, D = qsh
    Hkv, Lk = ksh[1], ksh[2]
    scale, q_offset = _check_scalars(scale, q_offset, D, Lq, Lk)

    if out is None:
        out = q.new_empty((B, Hq, Lq, D))
        os_ = (Hq * Lq * D, Lq * D, D)  # contiguous
    else:
        _check_out(out, (B, Hq, Lq, D), dt, q.device)
        os_ = out.stride()
    lse = None
    if return_lse:
        if lse_out is None:
            lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device)
        else:
            _check_lse_out(lse_out, (B, Hq, Lq), q.device)
            lse = lse_out
    if B * Hq * Lq == 0:
        return (out, lse) if return_lse else out

    head = _PACK_HEAD.pack(
        qp, kp, vp, out.data_ptr(), lse.data_ptr() if lse is not None else 0,
        qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], os_[0], os_[1], os_[2],
        B, Hq, Hkv, Lq, Lk, D, float(scale), q_offset,
    )
    if captured or summaries or params:
        packed = head + _PACK_TAIL.pack(*_captured_fields(q.device, captured, summaries, params or _NO_PARAMS)) \
            + _NO_DESCALE
    else:
        packed = head + _ZERO_FWD_TAIL
    rc = call_on(dev, lib._fwd, packed)  # lib._fwd is lib.launch without the method call: the per-call hot path
    if rc == ERROR_SCALE_NOT_POSITIVE:
        # The SM90 kernel of a variant without score_mod (or whose score_mod is a(q - kv) * score) takes the
        # row max over raw q.k (a(d) q.k; the scale is folded into the exponent), which needs scale > 0. Both
        # rewrites are exact: softmax(s * qk) = softmax(|s| * (-q)k), and scale 0 makes every score 0, as q = 0
        # with scale 1 does.
        q2, scale2 = (-q, -scale) if scale < 0 else (torch.zeros_like(q), 1.0)
        return forward(lib, q2, k, v, scale=scale2, q_offset=q_offset, return_lse=return_lse, captured=captured,
                       summaries=summaries, out=out, lse_out=lse, params=params)
    if rc != 0:
        raise launch_failed(lib, "attention kernel", rc,
                            f"q {tuple(q.shape)}, k {tuple(k.shape)}, {q.dtype}, on {q.device}")
    return (out, lse) if return_lse else out


def call_on(dev: int, entry, packed: bytes) -> int:
    """A library entry point on packed arguments and device dev's current stream. The library's (static) CUDA runtime
    launches into the thread's current context: dev's is made current first when it is not already."""
    if dev == _current_device():
        return entry(packed, _raw_stream(dev))
    with torch.cuda.device(dev):
        return entry(packed, _raw_stream(dev))


def launch_failed(lib, kernel: str, rc: int, inputs: str) -> KernelLaunchError:
    """The error for a library entry point that returned rc != 0: which kernel, the CUDA (or attngen) error and
    what the call was given."""
    return KernelLaunchError(f"launching the {kernel} ({lib.path}) failed: CUDA error {rc} ({lib.error_string(rc)}); "
                             f"{inputs}", code=rc)


_DEBUG_RECORD = 4 * MAX_CAPTURED  # where ag_chk's {flag, tensor, dim, index} start in the bounds record


def debug_record(captured, device) -> torch.Tensor:
    """The bounds record of a debug build's call (ATTNGEN_DEBUG=1), passed after the captured tensors (in the
    library's debug slot): int32 sizes of each captured tensor, which ag_chk reads, then the first out-of-range
    read, which it writes (``check_debug_record``)."""
    sizes = [0] * (_DEBUG_RECORD + 4)
    for n, t in enumerate(captured):
        if isinstance(t, torch.Tensor) and t.numel() == 0:
            raise InputError(f"captured tensor t{n} ({t.dtype}, shape {tuple(t.shape)}) is empty, but the mod reads it; "
                             "give it at least one element per index the mod reads")
        for d, size in enumerate(getattr(t, "shape", ())[:4]):
            sizes[4 * n + d] = min(int(size), 2**31 - 1)
    return torch.tensor(sizes, dtype=torch.int32).to(device)


def _forward_debug(lib: KernelLibrary, q, k, v, captured, kwargs):
    """A call on a debug build (ATTNGEN_DEBUG=1): pass the bounds record in captured slot lib.debug_slot, wait for
    the kernel, and raise InputError naming the read if there was one (the kernel read element 0 instead)."""
    record = debug_record(captured, q.device)
    result = forward(lib, q, k, v, captured=list(captured) + [record], **kwargs)
    check_debug_record(record, captured)
    return result


def check_debug_record(record: torch.Tensor, captured) -> None:
    """InputError naming the first out-of-range captured-tensor read a debug build's kernel recorded, if any (waits
    for the kernel)."""
    flag, n, d, index = record[_DEBUG_RECORD:].tolist()
    if flag:
        t = captured[n]
        raise InputError(
            f"captured tensor t{n} ({t.dtype}, shape {tuple(t.shape)}) was read at index {index} of dim {d}, which "
            f"has size {t.shape[d]} (a debug build, ATTNGEN_DEBUG=1, caught the read; a normal build reads out of "
            "bounds). Fix: make the tensor cover every index the mod computes at these sizes, or clamp the index in "
            "the mod, e.g. table[torch.clamp(i, 0, n - 1)]"
        )


# --------------------------------------------------------------------------------------------------
# backward (templates/bwd_sm80.cuh; the ABI of templates/attngen_bwd_abi.cuh and host_abi_bwd.cuh)

BWD_ABI_VERSION = 8  # ATTNGEN_BWD_ABI_VERSION
# AttngenBwdArgs: 12 pointers, 8x3 int64 strides, 6 int32, float, int32, then CapturedArgs (_PACK_TAIL), then
# the captured tensors' gradient buffers, the deterministic mode's semaphores, the work-tile counter, the dQ
# accumulator's first-store flags and the work tiles' order (_PACK_BWD_OPTIONS).
_PACK_BWD_HEAD = struct.Struct("<12Q24q6ifi")
_PACK_BWD_OPTIONS = struct.Struct(f"<{MAX_CAPTURED}QQQQQ")
_BWD_ARGS_SIZE = _PACK_BWD_HEAD.size + _PACK_TAIL.size + _PACK_BWD_OPTIONS.size
assert _PACK_BWD_HEAD.size == 320 and _BWD_ARGS_SIZE == 928


class BwdKernelLibrary(_Library):
    """A loaded backward library (``attngen_bwd``) and what it was built for. ``block_q`` / ``block_k`` are the
    backward's tiles: the block summaries of a call are computed for them."""

    def __init__(self, path: str, handle: ctypes.CDLL, info: AttngenKernelInfo):
        super().__init__(path, handle, info)
        self._bwd = handle.attngen_bwd
        self._bwd.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self._bwd.restype = ctypes.c_int


def load_family_library(path, cls, what: str, prefix: str, family_version: int, args_size: int):
    """Load a library of a kernel family with its own entry point and argument block (``attngen_<prefix>``,
    ``attngen_<prefix>_kernel_info``; ``what`` names the family in messages) as ``cls``, checking the common ABI version, the family's version (the kernel
    info's abi_version) and the argument block's size."""
    path = str(path)
    handle, version, info = _open_library(path, f"attngen_{prefix}_kernel_info", f"attngen_{prefix}", f"{what} library")
    if version != ABI_VERSION or info.abi_version != family_version or info.args_size != args_size \
            or info.dtype not in _DTYPE_CODES:
        raise BuildError(
            f"{path} speaks another {what} ABI (ABI {version}, {what} ABI {info.abi_version}, argument block "
            f"{info.args_size} bytes; this attngen expects {ABI_VERSION}, {family_version}, {args_size}): delete it "
            "(or clear the kernel cache) so that it is rebuilt"
        )
    return cls(path, handle, info)


def load_bwd_library(path) -> BwdKernelLibrary:
    """Load a compiled backward library and check that it speaks this ABI."""
    return load_family_library(path, BwdKernelLibrary, "backward", "bwd", BWD_ABI_VERSION, _BWD_ARGS_SIZE)


def backward(
    lib: BwdKernelLibrary,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    *,
    scale: Optional[float] = None,
    q_offset: int = 0,
    captured: Sequence[torch.Tensor] = (),
    summaries: Sequence[torch.Tensor] = (),
    params: Optional[tuple] = None,
    captured_grads: Optional[Sequence[bool]] = None,
    deterministic: bool = False,
):
    """Attention backward with a compiled variant's backward library. q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D),
    ``out`` the forward's output and ``lse`` its (B, Hq, Lq) float32 natural-log LSE (``forward(...,
    return_lse=True)``), ``dout`` the gradient of ``out`` (any layout: copied when the kernel cannot read it).
    ``scale`` / ``q_offset`` / ``captured`` as in the forward call; ``summaries``: BlockPredicates.summaries
    computed for lib.block_q / lib.block_k; ``params`` as in the forward. Returns (dq, dk, dv), contiguous, in q's dtype; rows with nothing
    kept get zero gradients. Allocates the fp32 workspaces (dQ accumulator, delta, lse in log2) per call.
    ``captured_grads``: one bool per captured tensor (missing ones False), whether to sum its gradient in the
    kernel (the sm90 family; the portable one answers ERROR_BWD_OPTION); given, the call returns (dq, dk,
    dv, dcaptured) with dcaptured[i] a float32 tensor shaped like captured[i] where asked for, else None.
    ``deterministic``: dQ's additions in a fixed order, so that dq is bit-identical across runs (the sm90 family;
    dk and dv are written once per element by every family)."""
    dev = _checked_call(lib, q, k, v, params, captured, summaries)
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    shape = (B, Hq, Lq, D)
    _check_out(out, shape, q.dtype, q.device, "out", fix="pass the forward's output, or out.contiguous()")
    if isinstance(dout, torch.Tensor) and dout.shape == q.shape and not _layout_ok(dout, shape):
        dout = dout.contiguous()  # autograd hands out any layout (expanded zeros, transposes)
    _check_out(dout, shape, q.dtype, q.device, "dout", fix="pass dout.contiguous()")
    _check_lse_out(lse, shape[:3], q.device, "lse (the forward's, forward(..., return_lse=True))")
    scale, q_offset = _check_scalars(scale, q_offset, D, Lq, Lk)
    if Hkv > _MAX_GRID_YZ:
        raise InputError(f"key/value heads ({Hkv}) must be at most {_MAX_GRID_YZ}; split the call")

    captured, dcaptured = _captured_grad_buffers(captured, captured_grads or ())
    dq = q.new_empty(shape)
    dk = k.new_empty(k.shape)
    dv = v.new_empty(v.shape)
    if B * Hq == 0 or Lq == 0:  # no query keeps anything: zero gradients (the kernels' workspaces would be empty)
        return (dq, dk.zero_(), dv.zero_()) + ((dcaptured,) if captured_grads is not None else ())
    lq_pad = -(-Lq // lib.block_q) * lib.block_q
    # lse_log2, delta, 4 words whose first holds the work-tile counter (the rest keeps what follows 16-byte
    # aligned), 2 int32 flags per q-block (dq_written), then an int32 per work tile (tile_order), in one allocation
    # the preprocess fills
    rows = B * Hq * lq_pad
    work_tiles = B * Hkv * -(-Lk // lib.block_k)
    stats = torch.empty((2 * rows + 4 + 2 * (rows // lib.block_q) + work_tiles,), dtype=torch.float32,
                        device=q.device)
    dq_acc = torch.empty((B, Hq, lq_pad, D), dtype=torch.float32, device=q.device)  # layout: the kernel's
    lse_log2, delta = stats[:rows], stats[rows:2 * rows]
    tile_counter = stats.data_ptr() + 8 * rows
    dq_written = tile_counter + 16
    tile_order = dq_written + 8 * (rows // lib.block_q)
    qs, ks, vs, os_, ds = q.stride(), k.stride(), v.stride(), out.stride(), dout.stride()
    head = _PACK_BWD_HEAD.pack(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dq_acc.data_ptr(), delta.data_ptr(), lse_log2.data_ptr(),
        *qs[:3], *ks[:3], *vs[:3], *os_[:3], *ds[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        B, Hq, Hkv, Lq, Lk, D, float(scale), q_offset,
    )
    tail = (_PACK_TAIL.pack(*_captured_fields(q.device, captured, summaries, params or _NO_PARAMS))
            if captured or summaries or params else _ZERO_TAIL)
    # one turn counter per (b, h, q-block), zeroed: bwd_sm90.cuh's dq_turn
    sem = torch.zeros((B, Hq, lq_pad // lib.block_q), dtype=torch.int32, device=q.device) if deterministic else None
    options = _PACK_BWD_OPTIONS.pack(*[0 if g is None else g.data_ptr() for g in dcaptured],
                                     *[0] * (MAX_CAPTURED - len(dcaptured)), 0 if sem is None else sem.data_ptr(),
                                     tile_counter, dq_written, 0 if deterministic else tile_order)
    rc = call_on(dev, lib._bwd, head + tail + options)
    if rc != 0:
        raise launch_failed(lib, "attention backward kernel", rc,
                            f"q {tuple(q.shape)}, k {tuple(k.shape)}, {q.dtype}, on {q.device}")
    if captured_grads is not None:
        return dq, dk, dv, dcaptured
    return dq, dk, dv


def _captured_grad_buffers(captured: Sequence[torch.Tensor], wanted: Sequence[bool]):
    """(captured as the kernel reads it, zeroed float32 gradient buffers or None): a buffer shares its tensor's
    strides, since the kernel adds at the element offsets it reads with; a tensor whose elements overlap (an
    expanded view) is read from a contiguous copy instead, so that each of its elements has a slot of its own."""
    if len(wanted) > len(captured):
        raise InputError(f"captured_grads has {len(wanted)} entries for {len(captured)} captured tensors")
    captured = list(captured)
    buffers = []
    for n, want in enumerate(wanted):
        t = captured[n]
        if not want:
            buffers.append(None)
            continue
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise InputError(f"captured tensor #{n} has no gradient (dtype {getattr(t, 'dtype', type(t).__name__)}); "
                             "ask for gradients of floating-point captured tensors only")
        if not _dense(t):
            captured[n] = t = t.contiguous()
        buffers.append(torch.empty_strided(t.shape, t.stride(), dtype=torch.float32, device=t.device).zero_())
    return captured, buffers


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill their span once each (a permutation of a contiguous layout)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True
