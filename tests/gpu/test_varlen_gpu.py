"""``attn.varlen`` on CUDA tensors: the forward kernel once per sequence on views of the packed tensors. Equal bit
for bit to per-sequence ``attn(q, k, v, q_offset=...)`` calls (issue 12: "varlen equals per-sequence calls"),
within bf16 noise of the float32 reference for a sliding window, softcap + causal, a document mask whose ids are
local to each sequence, GQA, sequences with no queries, no keys or more queries than keys, and ``seqused_k``
padding filled with NaN that must never be read.
"""
import pytest
import torch

import attngen

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
I32 = torch.int32


def _packed(gen, n_q, n_k, Hq, Hkv, D):
    q = torch.randn(sum(n_q), Hq, D, generator=gen).to(DEV, torch.bfloat16)
    k, v = (torch.randn(sum(n_k), Hkv, D, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=I32, device=DEV)  # noqa: E731
    return q, k, v, cu(n_q), cu(n_k)


def _variants():
    docs = (torch.arange(600) // 97).to(DEV)  # ids by local position: every sequence has several documents
    return {
        "sliding_window": dict(window=64),
        "softcap_causal": dict(softcap=20.0, causal=True),
        "document": dict(mask_mod=attngen.document(docs)),
        "full": dict(),
    }


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["sliding_window", "softcap_causal", "document", "full"])
def test_varlen_kernel_equals_per_sequence_calls_and_the_reference(name, D):
    n_q, n_k = [300, 1, 0, 257, 130, 40], [300, 513, 70, 200, 0, 599]  # no queries; more queries; no keys
    gen = torch.Generator().manual_seed(D)
    q, k, v, cu_q, cu_k = _packed(gen, n_q, n_k, 8, 2, D)
    kw = _variants()[name]
    attn, ref = attngen.compile(**kw), attngen.compile(**kw, backend="reference")
    out, lse = attn.varlen(q, k, v, cu_q, cu_k, return_lse=True)
    want, want_lse = ref.varlen(q.float(), k.float(), v.float(), cu_q, cu_k, return_lse=True)
    for b in range(len(n_q)):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if n_q[b] and n_k[b]:
            o, l = attn(q[rq].transpose(0, 1)[None], k[rk].transpose(0, 1)[None], v[rk].transpose(0, 1)[None],
                        return_lse=True, q_offset=max(n_k[b] - n_q[b], 0))
            assert torch.equal(out[rq], o[0].transpose(0, 1)) and torch.equal(lse[:, rq], l[0]), b
    assert (out[sum(n_q[:4]):sum(n_q[:5])] == 0).all()  # the sequence without keys
    fin = torch.isfinite(want_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (out.float() - want).abs().max().item() < 2e-2
    assert (lse[fin] - want_lse[fin]).abs().max().item() < 1e-2


def test_varlen_kernel_never_reads_the_padding_past_seqused_k():
    n_q, n_k = [64, 3], [256, 300]
    q, k, v, cu_q, cu_k = _packed(torch.Generator().manual_seed(5), n_q, n_k, 4, 4, 64)
    used = torch.tensor([200, 300], dtype=I32, device=DEV)
    k[200:256] = float("nan")
    v[200:256] = float("nan")
    attn = attngen.compile(causal=True)
    out = attn.varlen(q, k, v, cu_q, cu_k, seqused_k=used)
    keep = torch.cat([torch.arange(200), torch.arange(256, 556)]).to(DEV)
    expected = attn.varlen(q, k[keep], v[keep], cu_q, torch.tensor([0, 200, 500], dtype=I32, device=DEV))
    assert torch.isfinite(out).all() and torch.equal(out, expected)
