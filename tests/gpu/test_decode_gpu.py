"""The decode kernel (templates/fwd_decode.cuh, attngen/decode.py) behind attn.with_kvcache on CUDA tensors, against
the reference of attngen/kvcache.py run in float64 on the same cache contents: every library variant (and a mask
whose kv walk depends on the head), head dims 64 / 128 / 256, per-sequence lengths, appends with and without RoPE,
GQA / MQA / MHA, splits; paged caches of page sizes 1 to 256 equal to the contiguous cache bit for bit; a decode
step captured in a CUDA graph. Outputs start as NaN (the caching allocator's small pool is poisoned), so a row the
kernel fails to write shows up.
"""
import functools

import pytest
import torch

import attngen
from attngen.errors import InputError

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
L_MAX = 704  # cache positions per sequence (11 tiles of 64)
WIN = torch.tensor([16, 64, 200, 1000, 16, 64, 200, 1000], dtype=torch.int32)


def _per_head_window(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < WIN_DEV[h])


WIN_DEV = WIN.to(DEV) if torch.cuda.is_available() else WIN


@functools.lru_cache(maxsize=None)
def variants():
    docs = torch.sort(torch.randint(0, 5, (L_MAX + 16,), generator=torch.Generator().manual_seed(3))).values.to(DEV)
    out = {
        "full": {},
        "causal": dict(causal=True),
        "sliding_window": dict(window=100),
        "softcap_causal": dict(softcap=30.0, causal=True),
        "alibi_causal": dict(score_mod=attngen.alibi(8), causal=True),
        "prefix_lm": dict(mask_mod=attngen.prefix_lm(50)),
        "chunked": dict(mask_mod=attngen.chunked(128)),
        "document": dict(mask_mod=attngen.document(docs)),
        "per_head_window": dict(mask_mod=_per_head_window),
    }
    return {name: (attngen.compile(**kw), attngen.compile(**kw, backend="reference")) for name, kw in out.items()}


def _poison():
    """NaN (0xFF bytes, in every float dtype) in the blocks the caching allocator hands out next: outputs and
    workspaces here are small, served from its small pool (blocks up to 1 MB), so that pool is filled and freed."""
    blocks = [torch.full((n,), 0xFF, dtype=torch.uint8, device=DEV) for n in (512, 4096, 32768, 262144, 1 << 20)
              for _ in range(16)]
    del blocks


def _case(B, Hq, Hkv, Lq, L_new, D, dtype, seed, paged_size=0):
    g = torch.Generator().manual_seed(seed)
    seqlens = torch.randint(0, L_MAX - L_new - 1, (B,), generator=g, dtype=torch.int32)
    seqlens[0] = L_MAX - L_new  # one sequence fills its cache
    q = torch.randn(B, Hq, Lq, D, generator=g)
    kc = torch.randn(B, Hkv, L_MAX, D, generator=g)
    vc = torch.randn(B, Hkv, L_MAX, D, generator=g)
    k = torch.randn(B, Hkv, L_new, D, generator=g) if L_new else None
    v = torch.randn(B, Hkv, L_new, D, generator=g) if L_new else None
    cast = lambda t: None if t is None else t.to(DEV, dtype)  # noqa: E731
    return dict(q=cast(q), k_cache=cast(kc), v_cache=cast(vc), k=cast(k), v=cast(v), cache_seqlens=seqlens.to(DEV))


def _reference(ref, case, **kw):
    """The reference on float64 copies of the inputs (caches cloned: the append writes them)."""
    c64 = {n: (t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for n, t in case.items()}
    c64["k_cache"], c64["v_cache"] = c64["k_cache"].clone(), c64["v_cache"].clone()
    extra = {n: (t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for n, t in kw.items()}
    out, lse = ref.with_kvcache(**c64, **extra, return_lse=True)
    return out, lse, c64["k_cache"], c64["v_cache"]


def _assert_close(out, lse, ref_out, ref_lse, what):
    _assert_out_close(out, ref_out, what)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: rows with nothing kept differ"
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() <= 2e-2, what


def _assert_out_close(out, ref_out, what):
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (a row not written?)"
    err = (out.double() - ref_out).abs().max().item()
    assert err <= 2e-2 * max(1.0, ref_out.abs().max().item()), f"{what}: max error {err}"


@pytest.mark.parametrize("name", ["full", "causal", "sliding_window", "softcap_causal", "alibi_causal", "prefix_lm",
                                  "chunked", "document", "per_head_window"])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_every_variant_matches_the_reference(name, hd):
    attn, ref = variants()[name]
    case = _case(B=3, Hq=8, Hkv=2, Lq=2, L_new=3, D=hd, dtype=torch.bfloat16, seed=hd)
    want, want_lse, want_k, want_v = _reference(ref, case)
    _poison()
    out, lse = attn.with_kvcache(**case, return_lse=True)
    _assert_close(out, lse, want, want_lse, f"{name} hd{hd}")
    assert torch.equal(case["k_cache"].double(), want_k) and torch.equal(case["v_cache"].double(), want_v)


@pytest.mark.parametrize("Hq,Hkv,Lq", [(8, 8, 1), (8, 1, 1), (12, 4, 3), (16, 2, 16), (4, 2, 33)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_heads_rows_and_dtypes(Hq, Hkv, Lq, dtype):
    attn, ref = variants()["causal"]  # Lq new keys: query i of a sequence sees keys up to its own position
    case = _case(B=2, Hq=Hq, Hkv=Hkv, Lq=Lq, L_new=Lq, D=128, dtype=dtype, seed=Hq * 100 + Lq)
    want, want_lse, _, _ = _reference(ref, case)
    _poison()
    out, lse = attn.with_kvcache(**case, return_lse=True)
    _assert_close(out, lse, want, want_lse, f"Hq {Hq} Hkv {Hkv} Lq {Lq} {dtype}")


def test_splits_agree_within_fp32_rounding():
    attn, _ = variants()["sliding_window"]
    case = _case(B=2, Hq=8, Hkv=2, Lq=1, L_new=0, D=128, dtype=torch.bfloat16, seed=5)
    one, lse1 = attn.with_kvcache(**case, num_splits=1, return_lse=True)
    for n in (2, 3, 7, 11, 40):
        out, lse = attn.with_kvcache(**case, num_splits=n, return_lse=True)
        assert (out.float() - one.float()).abs().max().item() <= 2 ** -7 * one.float().abs().max().item()
        assert (lse - lse1).abs().max().item() <= 1e-5 * lse1.abs().max().item() + 1e-6


@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
def test_paged_equals_contiguous_bit_for_bit(page_size):
    attn, _ = variants()["causal"]
    B, Hkv, D = 3, 2, 128
    case = _case(B=B, Hq=8, Hkv=Hkv, Lq=2, L_new=2, D=D, dtype=torch.bfloat16, seed=page_size)
    pages_per_seq = -(-L_MAX // page_size)
    perm = torch.randperm(B * pages_per_seq, generator=torch.Generator().manual_seed(1))
    table = perm.view(B, pages_per_seq).to(torch.int32).to(DEV)
    kp = torch.zeros(B * pages_per_seq, Hkv, page_size, D, dtype=torch.bfloat16, device=DEV)
    vp = torch.zeros_like(kp)
    for b in range(B):  # the same cache contents, position p of sequence b at page table[b, p // ps]
        for j in range(pages_per_seq):
            n = min(page_size, L_MAX - j * page_size)
            kp[table[b, j].item(), :, :n] = case["k_cache"][b, :, j * page_size:j * page_size + n]
            vp[table[b, j].item(), :, :n] = case["v_cache"][b, :, j * page_size:j * page_size + n]
    for splits in (1, 4):
        contiguous = dict(case, k_cache=case["k_cache"].clone(), v_cache=case["v_cache"].clone())
        want, want_lse = attn.with_kvcache(**contiguous, num_splits=splits, return_lse=True)
        paged = dict(case, k_cache=kp.clone(), v_cache=vp.clone(), page_table=table)
        got, got_lse = attn.with_kvcache(**paged, num_splits=splits, return_lse=True)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse), f"page size {page_size}, {splits} splits"
        for b in range(B):  # the appended keys and values landed in the same positions of both layouts
            for j in range(pages_per_seq):
                n = min(page_size, L_MAX - j * page_size)
                for pc, cc in ((paged["k_cache"], contiguous["k_cache"]), (paged["v_cache"], contiguous["v_cache"])):
                    assert torch.equal(pc[table[b, j].item(), :, :n], cc[b, :, j * page_size:j * page_size + n])


@pytest.mark.parametrize("interleaved", [False, True])
def test_append_with_rotary_equals_rotating_in_pytorch(interleaved):
    attn, ref = variants()["causal"]
    D = 128
    case = _case(B=3, Hq=8, Hkv=2, Lq=2, L_new=2, D=D, dtype=torch.bfloat16, seed=11 + interleaved)
    pos = torch.arange(L_MAX + 8, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))  # rotary_dim 64 of 128
    cos, sin = (f(pos[:, None] * inv[None, :]).to(DEV, torch.bfloat16) for f in (torch.cos, torch.sin))
    rot = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    want, want_lse, want_k, want_v = _reference(ref, case, **rot)
    out, lse = attn.with_kvcache(**case, **rot, return_lse=True)
    _assert_close(out, lse, want, want_lse, f"rotary interleaved={interleaved}")
    # the keys the kernel path appended equal the reference's on the same bf16 inputs (rotated in float32,
    # rounded once), bit for bit
    fresh = _case(B=3, Hq=8, Hkv=2, Lq=2, L_new=2, D=D, dtype=torch.bfloat16, seed=11 + interleaved)
    ref.with_kvcache(**fresh, **rot)
    assert torch.equal(case["k_cache"], fresh["k_cache"]) and torch.equal(case["v_cache"], fresh["v_cache"])


def test_cache_batch_idx_and_int_lengths():
    attn, ref = variants()["causal"]
    case = _case(B=2, Hq=8, Hkv=2, Lq=1, L_new=1, D=64, dtype=torch.bfloat16, seed=21)
    big_k = torch.randn(5, 2, L_MAX, 64, device=DEV).to(torch.bfloat16)
    big_v = torch.randn(5, 2, L_MAX, 64, device=DEV).to(torch.bfloat16)
    rows = torch.tensor([4, 1], dtype=torch.int32, device=DEV)
    case = dict(case, k_cache=big_k, v_cache=big_v, cache_seqlens=300, cache_batch_idx=rows)
    want, want_lse, want_k, _ = _reference(ref, case)
    out, lse = attn.with_kvcache(**case, return_lse=True)
    _assert_close(out, lse, want, want_lse, "cache_batch_idx")
    assert torch.equal(big_k.double(), want_k)


def test_decode_step_in_a_cuda_graph():
    attn, ref = variants()["sliding_window"]
    case = _case(B=4, Hq=8, Hkv=2, Lq=1, L_new=1, D=128, dtype=torch.bfloat16, seed=31)
    case["cache_seqlens"] = torch.tensor([100, 5, 600, 0], dtype=torch.int32, device=DEV)
    start = case["cache_seqlens"].clone()
    k_snap, v_snap = case["k_cache"].clone(), case["v_cache"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        attn.with_kvcache(**case)  # warm-up: library loaded before capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn.with_kvcache(**case)
    for step in range(3):  # each replay appends at the lengths the tensor holds now
        case["cache_seqlens"].copy_(start + step)
        graph.replay()
        torch.cuda.synchronize()
        eager = dict(case, k_cache=k_snap, v_cache=v_snap)
        want, _, _, _ = _reference(ref, eager)
        _assert_out_close(out, want, f"graph step {step}")
        k_snap.copy_(case["k_cache"])
        v_snap.copy_(case["v_cache"])


def test_value_errors_before_anything_is_written():
    attn, _ = variants()["causal"]
    case = _case(B=2, Hq=8, Hkv=2, Lq=1, L_new=1, D=64, dtype=torch.bfloat16, seed=41)
    before = case["k_cache"].clone()
    with pytest.raises(InputError, match="capacity"):
        attn.with_kvcache(**dict(case, cache_seqlens=torch.tensor([L_MAX, 0], dtype=torch.int32, device=DEV)))
    table = torch.tensor([[0, 99], [1, 2]], dtype=torch.int32, device=DEV)
    kp = torch.zeros(3, 2, 256, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(InputError, match="not a page"):
        attn.with_kvcache(**dict(case, k_cache=kp, v_cache=kp.clone(), page_table=table,
                                 cache_seqlens=torch.tensor([300, 3], dtype=torch.int32, device=DEV)))
    assert not kp.any()
    assert torch.equal(case["k_cache"], before)
