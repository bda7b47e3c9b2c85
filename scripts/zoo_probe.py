"""Device probe: build every mask-zoo variant (bf16 hd128, as tests/gpu/test_mask_zoo_gpu.py does) one at a time,
printing each build's time, then run each in the test's three shapes, printing before and after each call, so a
slow build or a kernel that never returns names itself. Usage: python scripts/zoo_probe.py [names...]"""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]
import torch  # noqa: E402

import attngen  # noqa: E402
import mask_zoo  # noqa: E402
from attngen.mods import MaskMod  # noqa: E402
from helpers import assert_matches_float64  # noqa: E402

names = sys.argv[1:] or [n for n in mask_zoo.ZOO if not n.startswith("document")]
L = 2048
built = {}
for n in names:
    t0 = time.time()
    a = attngen.compile(mask_mod=MaskMod(mask_zoo.make(n, L, small=True, device="cuda"), n))
    a.spec(torch.bfloat16, 128).build_cached()
    built[n] = a
    print(f"build {n}: {time.time() - t0:.1f} s", flush=True)
for n, a in built.items():
    for Lq, Lk, qo in [(L, L, 0), (777, L, 1100), (L - 3, L - 5, 0)]:
        print(f"run {n} {Lq} {Lk} {qo} ...", end=" ", flush=True)
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(1, 4, Lq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, 4, Lk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        t0 = time.time()
        out, lse = a(q, k, v, return_lse=True, q_offset=qo)
        torch.cuda.synchronize()
        try:
            assert_matches_float64(n, out, lse, q, k, v, a.variant, 128 ** -0.5, qo)
            print(f"ok {time.time() - t0:.2f} s", flush=True)
        except AssertionError as e:
            print(f"FAIL {str(e)[:300]}", flush=True)
