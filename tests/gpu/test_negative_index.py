"""A captured-tensor index that may be negative (``table[h, q_idx - kv_idx]``) reads what torch indexing
reads: index -1 is the last element. The CPU path (attngen.reference, torch indexing) always did; the
generated kernels now wrap such indices with the dim's size baked in at trace time (codegen's WrapIndex,
``ag_wrap`` in templates/variant_math.cuh). Before, the kernel read memory before the table: results
differed from the CPU path and compute-sanitizer reported out-of-bounds reads.
"""
import pytest
import torch

import attngen
import reference64

pytestmark = pytest.mark.requires_gpu

B, H, L, D = 1, 2, 256, 64
N = 2 * L - 1  # 511 table entries per head


def _mods(table):
    """(negative, non-negative): two score_mods over one table; the first indexes with q - kv, which is
    negative above the diagonal, the second with q - kv + 255, which is not for L = 256 (sympy cannot
    prove that without the lengths, so it is wrapped too, harmlessly)."""
    return (lambda s, b, h, q, kv: s + table[h, q - kv],
            lambda s, b, h, q, kv: s + table[h, q - kv + (L - 1)])


def _dense64(q, k, v, table, offset):
    """float64 attention (tests/reference64.py) with the bias gathered by explicit Python-style wrapping of the
    index (no reliance on torch's negative indexing, no attngen code)."""
    q, k, v, table = (x.detach().double().cpu() for x in (q, k, v, table))

    def bias(s, b, h, qi, kv):
        i = qi - kv + offset
        return s + table[h, torch.where(i < 0, i + table.shape[1], i)]

    return reference64.attention(q, k, v, score_mod=bias)[0]


@pytest.mark.parametrize("which,offset", [("negative", 0), ("nonnegative", L - 1)])
def test_negative_captured_index_matches_torch_indexing(which, offset):
    gen = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(B, H, L, D, generator=gen).to(torch.bfloat16) for _ in range(3))
    table = torch.randn(H, N, generator=gen)
    pick = 0 if which == "negative" else 1
    gpu = attngen.compile(score_mod=_mods(table.cuda())[pick])
    cpu = attngen.compile(score_mod=_mods(table)[pick])  # CPU tensors run attngen.reference (torch indexing)
    traced = gpu.traced.captured[0]
    assert traced.wrapped_dims == ((1, N),)

    out = gpu(q.cuda(), k.cuda(), v.cuda())
    torch.cuda.synchronize()
    got = out.float().cpu()
    assert torch.isfinite(got).all()
    ref_cpu = cpu(q, k, v).float()
    ref64 = _dense64(q, k, v, table, offset)
    torch.testing.assert_close(got, ref_cpu, atol=2e-2, rtol=0, msg=lambda m: f"{which}: GPU vs CPU path: {m}")
    torch.testing.assert_close(got.double(), ref64, atol=2e-2, rtol=0, msg=lambda m: f"{which}: GPU vs float64: {m}")
    if which == "negative":
        # a table that is large only where negative indices land (q - kv in [-255, -1] -> [256, 510]): a
        # kernel that did not wrap would miss exactly these entries
        far = torch.zeros(H, N)
        far[:, L:] = 4.0
        out_far = attngen.compile(score_mod=_mods(far.cuda())[0])(q.cuda(), k.cuda(), v.cuda()).float().cpu()
        torch.testing.assert_close(out_far.double(), _dense64(q, k, v, far, 0), atol=2e-2, rtol=0,
                                   msg=lambda m: f"table non-zero only at wrapped entries: {m}")
