"""Deterministic backward (``attngen.compile(..., deterministic=True)`` or torch.use_deterministic_algorithms): the
sm90 kernel adds dQ in kv-block order (bwd_sm90.cuh's dq_turn), so dq, dk, dv are bit-identical over repeated
runs, for masks whose kv blocks visit a q block in runs with gaps (document ids, a union with global tokens), GQA,
head dims 64 and 128, and still match float64 as the plain backward does. The plain backward, whose dQ additions
land in any order, is run alongside and its run-to-run differences printed (session 11: 4, 4, 2, 4 and 0 of 4 runs
differed), as evidence that repeated runs can differ at all; they are not asserted (a plain run may happen to
repeat itself). A CPU test (tests/test_autograd.py) covers deterministic=True where the kernel does not apply.
"""
import functools
import math

import pytest
import torch

import attngen
import reference64

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
L = 1500  # 12 kv blocks of 128 add into every q block of the full mask


def _local_global(b, h, q, kv):
    return ((q - kv).abs() <= 200) | (kv < 64) | (q < 64)


@functools.lru_cache(maxsize=None)
def variants(deterministic: bool):
    docs = torch.randint(0, 5, (L,), generator=torch.Generator().manual_seed(2)).sort().values.to(DEV)
    mk = functools.partial(attngen.compile, deterministic=deterministic)
    return {
        "full": mk(),
        "causal": mk(causal=True),
        "document": mk(mask_mod=attngen.document(docs)),
        "local_global": mk(mask_mod=attngen.MaskMod(_local_global, "local_global")),
        "softcap_causal": mk(softcap=20.0, causal=True),
    }


CASES = [("full", 128, 2, 8, 2), ("causal", 64, 1, 4, 1), ("document", 128, 1, 4, 4), ("local_global", 64, 2, 4, 2),
         ("softcap_causal", 128, 1, 4, 2)]


def _grads(attn, q, k, v, dout):
    out = attn(q, k, v)
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.fixture(scope="module", autouse=True)
def sm90(requires_gpu):
    if attngen.jit.toolchain.current_arch() != "sm_90a":
        pytest.skip("the deterministic dQ order is the sm90 backward's (H100/H200)")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-hd{c[1]}-{c[2]}x{c[3]}x{c[4]}")
def test_deterministic_backward_is_bit_identical(case, monkeypatch):
    import attngen.autograd as ag

    name, D, B, Hq, Hkv = case
    gen = torch.Generator(device=DEV).manual_seed(3)
    q, k, v = (torch.randn(B, h, L, D, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (Hq, Hkv, Hkv))
    dout = torch.randn(B, Hq, L, D, device=DEV, dtype=torch.bfloat16, generator=gen)
    ran = []
    hook = ag.backward_kernel
    monkeypatch.setattr(ag, "backward_kernel", lambda *a: ran.append(hook(*a)) or ran[-1])

    det = variants(True)[name]
    first = _grads(det, q, k, v, dout)
    for _ in range(4):
        again = _grads(det, q, k, v, dout)
        for n, a, b in zip("q k v".split(), first, again):
            assert torch.equal(a, b), f"{name}: d{n} differs between deterministic runs"
    assert len(ran) == 5 and all(r is not None for r in ran), "the sm90 kernel ran, not the float32 recompute"

    plain = variants(False)[name]
    runs = [_grads(plain, q, k, v, dout)[0] for _ in range(5)]
    print(f"\n{name}: plain backward, dq runs differing from the first: "
          f"{sum(not torch.equal(runs[0], r) for r in runs[1:])} of 4")

    # the same accuracy as the plain backward against float64
    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = reference64.attention(*ins, det, scale=1 / math.sqrt(D))
    gold = torch.autograd.grad(ref, ins, dout.double())
    plain_g = _grads(plain, q, k, v, dout)
    for n, a, p, r in zip("q k v".split(), first, plain_g, gold):
        err, perr = (a.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 1.5 * perr + 1e-3 * r.abs().max().item(), f"{name} d{n}: {err:.3e} vs plain {perr:.3e}"


def test_torch_deterministic_algorithms_select_the_ordered_dq(monkeypatch):
    import attngen.autograd as ag

    name, D, B, Hq, Hkv = CASES[1]
    ran = []
    hook = ag.backward_kernel
    monkeypatch.setattr(ag, "backward_kernel", lambda *a: ran.append(hook(*a)) or ran[-1])
    gen = torch.Generator(device=DEV).manual_seed(4)
    q, k, v = (torch.randn(B, h, L, D, device=DEV, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (Hq, Hkv, Hkv))
    dout = torch.randn(B, Hq, L, D, device=DEV, dtype=torch.bfloat16, generator=gen)
    plain = variants(False)[name]
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        runs = [_grads(plain, q, k, v, dout) for _ in range(4)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(ran) == 4 and all(r is not None for r in ran), "the sm90 kernel ran, not the float32 recompute"
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))
