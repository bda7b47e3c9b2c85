"""Small cases for compute-sanitizer (memcheck / racecheck / synccheck): one per head dim through the
public API, checked against the float64 reference; with `--backward` also the gradients of q, k, v and of a
learnable table (the backward kernels: sm90 at head dims 64 / 128 on H100/H200, the portable one at 256); with
`--decode` the KV-cache kernel instead (attn.with_kvcache: paged and contiguous caches, appends, splits and their
combine). `--build` only fills the kernel cache (run it outside the sanitizer so nvcc is not traced); `--cases`
keeps the listed cases of the forward / backward list (0-based), for a shorter run; `--set FIELD=VALUE,...` sets
fields of jit.tiles.Sm90BwdTiles on every rung of each variant's sm90 backward ladder (an option on no rung, e.g.
`ds_stmatrix=1`), in the build and the run alike.
Usage: sanitize_case.py [--build] [--backend sm90] [--backward | --decode] [--cases 0 1] [--set ds_stmatrix=1]"""
import argparse
import sys

import torch

import attngen

p = argparse.ArgumentParser()
p.add_argument("--build", action="store_true")
p.add_argument("--backend", default="auto")
p.add_argument("--backward", action="store_true")
p.add_argument("--decode", action="store_true")
p.add_argument("--cases", type=int, nargs="+", default=None, metavar="N")
p.add_argument("--set", default="", dest="setting", metavar="FIELD=VALUE,...")
args = p.parse_args()
if args.setting:
    from dataclasses import replace

    import attngen.jit.spec as spec
    from attngen.jit.tiles import sm90_bwd_ladder
    from tile_settings import setting_fields  # scripts/, this script's directory

    fields = setting_fields(args.setting)
    spec.sm90_bwd_ladder = lambda d, **kw: tuple(replace(t, **fields) for t in sm90_bwd_ladder(d, **kw))


def decode_cases() -> int:
    """with_kvcache on small caches, one case per head dim, against the float64 reference; returns failures."""
    docs = torch.randint(0, 3, (400,), generator=torch.Generator().manual_seed(1)).sort().values.cuda()
    cases = [  # (head dim, variant, page size or 0, num_splits)
        (64, attngen.compile(causal=True), 16, 3),
        (128, attngen.compile(mask_mod=attngen.document(docs)), 0, 1),
        (256, attngen.compile(window=100, softcap=20.0), 0, 0),
    ]
    if args.build:
        for d, attn, *_ in cases:
            attn.spec(torch.bfloat16, d).build_cached()  # the forward library holds the decode kernel
        return 0
    bad = 0
    for d, attn, page, splits in cases:
        g = torch.Generator().manual_seed(d)
        B, Hq, Hkv, L = 2, 8, 2, 384
        lens = torch.tensor([300, 17], dtype=torch.int32)
        q, k, v = (torch.randn(B, h, n, d, generator=g) for h, n in ((Hq, 1), (Hkv, 2), (Hkv, 2)))
        kc, vc = (torch.randn(B, Hkv, L, d, generator=g) for _ in range(2))
        kw = {}
        if page:
            per = L // page
            table = torch.randperm(B * per, generator=g).view(B, per).to(torch.int32)
            kc = kc.view(B, Hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(B * per, Hkv, page, d)
            vc = vc.view(B, Hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(B * per, Hkv, page, d)
            kc[table.view(-1).long()], vc[table.view(-1).long()] = kc.clone(), vc.clone()
            kw["page_table"] = table.cuda()
        ins = dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v)
        cuda = {n: t.cuda().to(torch.bfloat16) for n, t in ins.items()}
        out = attn.with_kvcache(**cuda, cache_seqlens=lens.cuda(), num_splits=splits, **kw)
        torch.cuda.synchronize()
        ref_attn = attngen.compile(attn.variant.score_mod, attn.variant.mask_mod, backend="reference")
        c64 = {n: t.double() for n, t in cuda.items()}
        c64["k_cache"], c64["v_cache"] = c64["k_cache"].clone(), c64["v_cache"].clone()
        c64 = {n: (t.cuda() if t.device.type != "cuda" else t) for n, t in c64.items()}
        ref = ref_attn.with_kvcache(**c64, cache_seqlens=lens.cuda(), **kw)
        err = (out.double() - ref).abs().max().item()
        ok = err < 3e-2 and bool(torch.isfinite(out).all())
        bad += not ok
        print(f"decode hd{d} {attn.name}: max err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return bad


if args.decode:
    failed = decode_cases()
    if not args.build:
        print("SANITIZE CASES DONE", "ok" if failed == 0 else f"{failed} FAILED")
    sys.exit(1 if failed else 0)

docs = torch.randint(0, 3, (320,), generator=torch.Generator().manual_seed(0)).sort().values.cuda()
table = (torch.randn(2, 600, generator=torch.Generator().manual_seed(1)) * 0.5).cuda().requires_grad_()


def relpos(s, b, h, q, kv):
    return s + table[h, q - kv + 299]


def division(s, b, h, q, kv):  # a relative factor, no bias: the staged terms hold a alone
    return s / (1 + 1e-3 * (q - kv) ** 2)


def rel_both(s, b, h, q, kv):  # factor and bias both read at d: the staged terms hold both
    return s * (1 + 0.5 * table[h, q - kv + 299]) + table[h, kv - q + 299]


cases = [
    (64, attngen.compile(softcap=30.0, causal=True, backend=args.backend), 200, 200, 0),
    (128, attngen.compile(mask_mod=attngen.document(docs), backend=args.backend), 130, 300, 20),
    (256, attngen.compile(window=100, backend=args.backend), 190, 257, 67),
    # no mask: the wide K/V tiles (jit.tiles.SM90_WIDE) on the persistent grid at hd64 and hd128; the second
    # has 4 heads x 36 q-blocks = 144 work tiles, more than the 132 SMs: some CTAs walk two tiles
    (64, attngen.compile(backend=args.backend), 150, 400, 0),
    (128, attngen.compile(backend=args.backend), 4500, 300, 0, 4),
    # the same for the sm90 backward's persistent CTAs: 4 heads x 36 kv blocks of 2 q-blocks each (at 4500 x 4500
    # racecheck took more than 100 s over this case, round C2 of session 20)
    (128, attngen.compile(causal=True, backend=args.backend), 100, 4500, 4400, 4),
    # deterministic: the sm90 backward's dQ writers wait for their turns (kv blocks in order)
    (128, attngen.compile(causal=True, deterministic=True, backend=args.backend), 300, 300, 0),
    # a learnable relative-position table under a window: its gradient summed in the kernel's shared-memory bins;
    # relative score mods' terms staged per warp in shared memory (b alone, a alone, both; the wide K/V tiles at hd128)
    (64, attngen.compile(score_mod=relpos, window=90, backend=args.backend), 200, 230, 10, 2, [table]),
    (128, attngen.compile(score_mod=relpos, window=90, backend=args.backend), 200, 230, 10, 2, [table]),
    (128, attngen.compile(score_mod=attngen.ScoreMod(division, "division"), backend=args.backend), 150, 260, 0),
    (64, attngen.compile(score_mod=attngen.ScoreMod(rel_both, "rel_both"), causal=True, backend=args.backend), 130, 200,
     70, 2, [table]),
    # masks other than a half plane without a score_mod: the sm90 backward's dK and dV staged for TMA stores (the
    # first rung of jit/tiles.py sm90_bwd_ladder), at both head dims (at 128 with each step's S^T issued by the step
    # before, s_ahead 2)
    (128, attngen.compile(window=70, backend=args.backend), 200, 330, 40),
    (64, attngen.compile(mask_mod=attngen.document(docs), backend=args.backend), 130, 300, 20),
]
if args.cases is not None:
    cases = [cases[n] for n in args.cases]
if args.build:
    for d, attn, *_ in cases:
        attn.spec(torch.bfloat16, d).build_cached()
        if args.backward:
            dev = torch.cuda.current_device()
            attn.spec(torch.bfloat16, d, kernel=attn.backward_kernels(d, dev)[0]).build_cached()
    sys.exit(0)
bad = 0
for d, attn, lq, lk, off, *rest in cases:
    H = rest[0] if rest else 2
    leaves = rest[1] if len(rest) > 1 and args.backward else []  # captured tensors whose gradients are checked
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(1, H, lq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, H, lk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    if args.backward:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
    # the LSE written too, but not with --backward: an LSE in the graph sends the backward to the float32
    # recompute, not the kernel
    out = attn(q, k, v, q_offset=off) if args.backward else attn(q, k, v, return_lse=True, q_offset=off)[0]
    torch.cuda.synchronize()
    ins = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = attngen.reference.attention(*ins, attn.variant, q_offset=off)
    err = (out.double() - ref).abs().max().item()
    ok = err < 3e-2 and bool(torch.isfinite(out).all())
    if args.backward:
        dout = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        grads = torch.autograd.grad(out, (q, k, v, *leaves), dout)
        torch.cuda.synchronize()
        refs = torch.autograd.grad(ref, ins + leaves, dout.double())
        gerr = max((x.double() - r).abs().max().item() / max(1.0, r.abs().max().item()) for x, r in zip(grads, refs))
        ok = ok and gerr < 5e-2 and all(bool(torch.isfinite(x).all()) for x in grads)
        err = max(err, gerr)
    bad += not ok
    print(f"hd{d} {attn.name}: max err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
print("SANITIZE CASES DONE", "ok" if bad == 0 else f"{bad} FAILED")
sys.exit(1 if bad else 0)
