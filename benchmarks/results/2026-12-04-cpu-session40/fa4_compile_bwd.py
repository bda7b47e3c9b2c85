import os, sys, math
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
    o = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=dev)
    do = torch.empty(B, S, H, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, H, S, dtype=torch.float32, device=dev)
    I._flash_attn_bwd(q, k, v, o, do, lse, causal=causal)
print("done")
