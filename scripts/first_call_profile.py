"""Where the first call of a cached variant spends its time: one process builds (or finds) the variant's kernels,
then a fresh one compiles it and runs the first call per (dtype, head dim) under cProfile, as
scripts/prebuilt_check.py times it (compile with a 4096-long captured tensor on the GPU, inputs (1, 16, 4096, hd)).

    python scripts/first_call_profile.py document [document_i32 causal ...]   (ATTNGEN_CACHE_DIR: the cache used)
"""
import cProfile
import os
import pstats
import subprocess
import sys
import time

TARGETS = [("bf16", 64), ("bf16", 128)]


def child(name: str, profile: bool) -> None:
    import torch

    import attngen
    from attngen.prebuild import variant_of

    v = variant_of(name, "cuda", 4096)
    t0 = time.perf_counter()
    attn = attngen.compile(v.score_mod, v.mask_mod)
    print(f"{name}: compile {1e3 * (time.perf_counter() - t0):.1f} ms")
    for dtype_name, hd in TARGETS:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        q, k, vv = (torch.randn(1, 16, 4096, hd, device="cuda", dtype=dtype) for _ in range(3))
        torch.cuda.synchronize()
        prof = cProfile.Profile() if profile else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        attn(q, k, vv)
        torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t)
        if prof:
            prof.disable()
        t = time.perf_counter()
        attn(q, k, vv)
        torch.cuda.synchronize()
        print(f"{name} {dtype_name} hd{hd}: first call {ms:.1f} ms, second {1e3 * (time.perf_counter() - t):.1f} ms")
        if prof:
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(22)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2], os.environ.get("FIRST_CALL_PROFILE") == "1")
        return 0
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for name in sys.argv[1:]:
        subprocess.run([sys.executable, __file__, "--child", name], check=True, capture_output=True)  # builds
        subprocess.run([sys.executable, __file__, "--child", name], check=True)  # timed, cached
        subprocess.run([sys.executable, __file__, "--child", name], check=True,
                       env=dict(os.environ, FIRST_CALL_PROFILE="1"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
