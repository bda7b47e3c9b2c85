"""On the GPU: the float functions added in issue 15 (tan, atan, log1p, expm1, erf, sign, float powers) against
the float64 reference; a captured tensor too short for a call raising InputError before the launch; and a debug
build (ATTNGEN_DEBUG=1) turning an out-of-range captured read into InputError instead of reading out of bounds."""
import pytest
import torch

import attngen
import reference64

pytestmark = pytest.mark.requires_gpu

B, H, L, D = 1, 2, 256, 64


def math_score(s, b, h, q, kv):
    return (torch.atan(s) + torch.tan(torch.tanh(s / 4)) + torch.log1p(s.abs()) + torch.expm1(-s.abs() / 8)
            + torch.erf(s / 2) + torch.sign(s) * torch.sign(q - kv) + s.abs() ** 1.5 + torch.pow(s.abs(), 0.5))


def _qkv(seed=15):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=gen).to(torch.bfloat16) for _ in range(3)]


@pytest.mark.parametrize("fast_math", [True, False])
def test_math_functions_match_float64(fast_math):
    q, k, v = _qkv()
    out = attngen.compile(score_mod=math_score, causal=True, fast_math=fast_math)(q.cuda(), k.cuda(), v.cuda())
    torch.cuda.synchronize()
    ref = reference64.attention(q.double(), k.double(), v.double(), score_mod=math_score,
                                mask_mod=lambda b, h, qi, kv: qi >= kv)[0]
    torch.testing.assert_close(out.double().cpu(), ref, atol=2e-2, rtol=0)


def test_short_captured_tensor_raises_before_the_launch():
    doc = torch.zeros(L // 2, dtype=torch.int32, device="cuda")
    attn = attngen.compile(mask_mod=attngen.document(doc))
    q, k, v = (t.cuda() for t in _qkv())
    with pytest.raises(attngen.InputError, match="needs size >= 256"):
        attn(q, k, v)


def test_debug_build_reports_an_out_of_range_read(monkeypatch):
    monkeypatch.setenv("ATTNGEN_DEBUG", "1")
    table = torch.randn(L, device="cuda")
    # kv * 2 reaches 2 L - 2: an index form the per-call extent check does not bound, so only the debug build sees it
    attn = attngen.compile(score_mod=lambda s, b, h, q, kv: s + table[kv * 2])
    q, k, v = (t.cuda() for t in _qkv())
    with pytest.raises(attngen.InputError, match=r"t0 .*read at index \d+ of dim 0, which has size 256"):
        attn(q, k, v)
    ok = attngen.compile(score_mod=lambda s, b, h, q, kv: s + table[kv // 2])  # in range: runs, same as normal
    out = ok(q, k, v)
    monkeypatch.delenv("ATTNGEN_DEBUG")
    torch.testing.assert_close(out, attngen.compile(score_mod=lambda s, b, h, q, kv: s + table[kv // 2])(q, k, v))


def test_debug_build_relative_table_with_linear_bias_stays_in_range(monkeypatch):
    """s * table[q - kv + L - 1] + slope * (kv - q): the sm90 kernel's score_rel path with a d-indexed load and a bias
    stepped from b(d0) (SCORE_REL_LOADS and SCORE_REL_LINEAR). The table covers exactly the d of in-range pairs, so a
    read at an unclamped d (up to 8 past the last row's) would raise in the debug build; the result matches float64."""
    monkeypatch.setenv("ATTNGEN_DEBUG", "1")
    table = 1 + 0.1 * torch.randn(2 * L - 1, device="cuda")

    def rel(s, b, h, q, kv):
        return s * table[q - kv + L - 1] + 0.01 * (kv - q)

    q, k, v = (x.cuda() for x in _qkv(seed=18))
    out = attngen.compile(score_mod=rel, causal=True)(q, k, v)
    torch.cuda.synchronize()
    # on the GPU too: the mod indexes the CUDA table
    ref = reference64.attention(q.double(), k.double(), v.double(), score_mod=rel,
                                mask_mod=lambda b, h, qi, kv: qi >= kv)[0]
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=0)
