"""Where the warm load from the disk cache goes, in a fresh process (run it twice: the first run fills
the cache): cache lookup (key + entry checks) and dlopen timed apart, for two variants in one process,
and the host time per call of a tiny problem, three times. Usage: load_probe.py"""
import time

t0 = time.perf_counter()
import torch  # noqa: E402

import attngen  # noqa: E402
from attngen import kernels  # noqa: E402
from attngen.runtime import load_library  # noqa: E402

t1 = time.perf_counter()
print(f"import torch + attngen {1e3 * (t1 - t0):.1f} ms")
torch.cuda.init()
dev = torch.cuda.current_device()
for spec in ({"causal": True}, {"window": 256}):
    a = time.perf_counter()
    attn = attngen.compile(**spec)
    _ = attn.traced, attn.predicates
    b = time.perf_counter()
    path = kernels.build_kernel(attn, torch.bfloat16, 128, kernels.current_arch(dev), "auto")
    c = time.perf_counter()
    lib = load_library(path)
    d = time.perf_counter()
    attn._kernels[(torch.bfloat16, 128, dev, "auto")] = lib
    q = torch.randn(1, 1, 64, 128, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    e = time.perf_counter()
    attn(q, q, q)
    torch.cuda.synchronize()
    f = time.perf_counter()
    print(f"{attn.name}: trace+derive {1e3 * (b - a):.1f} ms, lookup {1e3 * (c - b):.1f} ms, dlopen {1e3 * (d - c):.1f} ms, "
          f"first call {1e3 * (f - e):.1f} ms")
for rep in range(3):
    n = 3000
    torch.cuda.synchronize()
    a = time.perf_counter()
    for _ in range(n):
        attn(q, q, q)
    b = time.perf_counter()
    torch.cuda.synchronize()
    print(f"host time per call: {1e6 * (b - a) / n:.1f} us")
