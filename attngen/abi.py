"""Facts of the kernels' C ABI, in one Python home. The C side states them in
``templates/attngen_common.cuh``; ``tests/test_abi.py`` checks the two agree."""

__version__ = "0.1.0"  # the package version: part of every kernel's cache key

ABI_VERSION = 4  # ATTNGEN_ABI_VERSION
MAX_CAPTURED = 8  # ATTNGEN_MAX_CAPTURED: captured-tensor slots of CapturedArgs
MAX_SUMMARIES = 16  # ATTNGEN_MAX_SUMMARIES: per-block summary slots of CapturedArgs
MAX_PARAMS = 8  # ATTNGEN_MAX_PARAMS: runtime-parameter slots of CapturedArgs (iparam / fparam)

SUPPORTED_HEAD_DIMS = (64, 128, 256)  # ATTNGEN_HEAD_DIMS
DTYPE_CODES = {0: "float16", 1: "bfloat16", 2: "float8_e4m3fn"}  # AttngenKernelInfo.dtype
FP8_CODE = 2  # AttngenKernelInfo.dtype of an FP8 library
FP8_DTYPE = "float8_e4m3fn"  # code 2: the sm90 forward only, bfloat16 output, V passed as V^T (attngen/fp8.py)
FP8_HEAD_DIMS = (128,)  # sm90_layout.cuh: the FP8 forward's head dims

# Return codes of attngen_fwd beyond cudaError_t (ATTNGEN_ERROR_*).
ERROR_SM90_TMA_LAYOUT = 9001  # q/k/v cannot be described by a TMA tensor map
ERROR_SM90_NO_TMA_ENCODER = 9002  # the driver does not provide cuTensorMapEncodeTiled
ERROR_SCALE_NOT_POSITIVE = 9003  # scale <= 0 without score_mod (or with a(d) * score): the caller rewrites the call exactly
ERROR_BWD_OPTION = 9004  # a backward asked for captured-tensor gradients or determinism it lacks (sm80)
# Codes meaning "this call cannot run on the sm90 kernel; run the portable sm80 kernel instead".
SM90_FALLBACK_CODES = (ERROR_SM90_TMA_LAYOUT, ERROR_SM90_NO_TMA_ENCODER)
