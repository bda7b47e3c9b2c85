"""Compile FlashAttention-4's (CuTe DSL) SM90 forward or backward for sm_90a without a GPU, at the anchors' shape
(B=2, S=8192, H=16, D=128, bf16, (B, S, H, D) layout), through its interface under torch's FakeTensorMode, so that
its PTX and cubin can be kept (CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=DIR) and disassembled beside ours
(scripts/sass_loop_ops.py). Needs FA4's source (flash_attn/cute) at --fa4-src and a Python with nvidia-cutlass-dsl
and quack-kernels (benchmarks/results/2026-12-04-cpu-session40/ and -session41/ say which versions were used).

    CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=DIR python scripts/fa4_sm90_compile.py fwd|bwd causal|noncausal
        [--fa4-src /tmp/fa4src]
"""
import argparse
import os
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", choices=["fwd", "bwd"])
    p.add_argument("mask", choices=["causal", "noncausal"])
    p.add_argument("--fa4-src", default="/tmp/fa4src", help="a checkout holding flash_attn/cute")
    args = p.parse_args(argv)
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")  # an H200's
    sys.path.insert(0, args.fa4_src)
    import torch
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    causal = args.mask == "causal"
    B, S, H, D = 2, 8192, 16, 128
    with FakeTensorMode():
        q, k, v = (torch.empty(B, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        if args.kernel == "fwd":
            # FlashAttnFunc.forward's call with flash_attn_func's defaults; the LSE written, as a training forward's
            interface._flash_attn_fwd(q, k, v, causal=causal, num_splits=1, return_lse=True)
        else:
            o, do = torch.empty_like(q), torch.empty_like(q)
            lse = torch.empty(B, H, S, dtype=torch.float32, device="cuda")
            interface._flash_attn_bwd(q, k, v, o, do, lse, causal=causal)
    print(f"compiled FA4's sm90 {args.kernel} ({args.mask})")


if __name__ == "__main__":
    main()
