# Compile FA4 (CuTe DSL) SM90 forward for sm_90a on a CPU-only machine (no GPU), keeping PTX + cubin.
# Usage: CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=<dir> /tmp/venv/bin/python compile_fwd.py causal|noncausal
import os, sys
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
sys.path.insert(0, "/tmp/fa4src")
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import interface as I
causal = sys.argv[1] == "causal"
B, S, H, D = 2, 8192, 16, 128
with FakeTensorMode():
    dev = "cuda"
    q = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=dev)
    k = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=dev)
    v = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=dev)
    # Same call as FlashAttnFunc.forward (iface:3093-3113) with flash_attn_func defaults.
    # return_lse=True: LSE is written, as in a training forward (inputs requiring grad
    # also allocate lse, iface:~740), so the kernel is the one the backward consumes.
    out, lse, _, _ = I._flash_attn_fwd(q, k, v, causal=causal, num_splits=1, return_lse=True)
    print("out", tuple(out.shape), "lse", tuple(lse.shape))
for key in I._flash_attn_fwd.compile_cache.keys() if hasattr(I._flash_attn_fwd.compile_cache, "keys") else []:
    print("compile_key", key)
print("done")
