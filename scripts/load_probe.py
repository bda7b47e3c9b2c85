"""Where the warm load from the disk cache goes, in a fresh process (run it twice: the first run fills
the cache): cache lookup (key + entry checks) and dlopen timed apart, for two variants in one process,
the host time per call of a tiny problem, three times, and that time split by layer (the C entry point on
pre-packed arguments, ctypes alone, the output allocation) beside one small torch op and SDPA.
Usage: load_probe.py"""
import time

t0 = time.perf_counter()
import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.launch import load_library  # noqa: E402

t1 = time.perf_counter()
print(f"import torch + attngen {1e3 * (t1 - t0):.1f} ms")
torch.cuda.init()
dev = torch.cuda.current_device()
for spec in ({"causal": True}, {"window": 256}):
    a = time.perf_counter()
    attn = attngen.compile(**spec)
    _ = attn.traced, attn.predicates
    b = time.perf_counter()
    path = attn.spec(torch.bfloat16, 128).build_cached()
    c = time.perf_counter()
    lib = load_library(path)
    d = time.perf_counter()
    attn._libraries[(torch.bfloat16, 128, dev, None)] = attn._ready[(torch.bfloat16, 128, dev)] = lib
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


# Where the host time of one call goes: each layer of the call timed alone (best of 3 x 3000 calls).
def per_call_us(fn, n=3000):
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        a = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - a)
        torch.cuda.synchronize()
    return 1e6 * best / n


from attngen import launch  # noqa: E402

lib = next(iter(attn._libraries.values()))
packed = launch._PACK_HEAD.pack(q.data_ptr(), q.data_ptr(), q.data_ptr(), torch.empty_like(q).data_ptr(), 0,
                                 *q.stride()[:3], *q.stride()[:3], *q.stride()[:3], *q.stride()[:3],
                                 *q.shape[:2], q.shape[1], q.shape[2], q.shape[2], q.shape[3], 0.088, 0) \
    + launch._ZERO_FWD_TAIL
stream = launch._raw_stream(dev)
abi = lib.handle.attngen_abi_version
rows = [
    ("attn(q, k, v)", lambda: attn(q, q, q)),
    ("launch.forward(lib, q, k, v)", lambda: launch.forward(lib, q, q, q)),
    ("C attngen_fwd on packed args (ctypes + tensor maps + launch)", lambda: lib._fwd(packed, stream)),
    ("ctypes call of an empty C function", abi),
    ("q.new_empty(shape) (output allocation)", lambda: q.new_empty(q.shape)),
    ("torch.mul(q, 2) (one small torch op)", lambda: torch.mul(q, 2)),
    ("F.scaled_dot_product_attention(q, k, v)", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)),
]
for name, fn in rows:
    print(f"{name}: {per_call_us(fn):.1f} us")
