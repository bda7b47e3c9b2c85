"""Small cases for compute-sanitizer (memcheck / racecheck / synccheck): one per head dim through the
public API, checked against the float64 reference. `--build` only fills the kernel cache (run it
outside the sanitizer so nvcc is not traced). Usage: sanitize_case.py [--build] [--backend sm90]"""
import argparse
import sys

import torch

import attngen

p = argparse.ArgumentParser()
p.add_argument("--build", action="store_true")
p.add_argument("--backend", default="auto")
args = p.parse_args()

docs = torch.randint(0, 3, (320,), generator=torch.Generator().manual_seed(0)).sort().values.cuda()
cases = [
    (64, attngen.compile(softcap=30.0, causal=True, backend=args.backend), 200, 200, 0),
    (128, attngen.compile(mask_mod=attngen.document(docs), backend=args.backend), 130, 300, 20),
    (256, attngen.compile(window=100, backend=args.backend), 190, 257, 67),
    # no mask: the wide K/V tiles (jit.tiles.SM90_WIDE) on the persistent grid at hd64 and hd128; the second
    # has 4 heads x 36 q-blocks = 144 work tiles, more than the 132 SMs: some CTAs walk two tiles
    (64, attngen.compile(backend=args.backend), 150, 400, 0),
    (128, attngen.compile(backend=args.backend), 4500, 300, 0, 4),
]
if args.build:
    for d, attn, *_ in cases:
        attn.spec(torch.bfloat16, d).build_cached()
    sys.exit(0)
bad = 0
for d, attn, lq, lk, off, *heads in cases:
    H = heads[0] if heads else 2
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(1, H, lq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, H, lk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attn(q, k, v, return_lse=True, q_offset=off)
    torch.cuda.synchronize()
    ref = attngen.reference.attention(q.double(), k.double(), v.double(), attn.variant, q_offset=off)
    err = (out.double() - ref).abs().max().item()
    ok = err < 3e-2 and bool(torch.isfinite(out).all())
    bad += not ok
    print(f"hd{d} {attn.name}: max err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
print("SANITIZE CASES DONE", "ok" if bad == 0 else f"{bad} FAILED")
sys.exit(1 if bad else 0)
