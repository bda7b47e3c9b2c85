"""attngen.reference (the library's chunked reference / CPU path) on a CUDA device gives what it gives on the CPU."""
import pytest
import torch

import attngen.variants as V
from attngen.mods import Variant
from attngen.reference import attention, dense_mask
from helpers import assert_lse_close, rand_qkv


@pytest.mark.requires_gpu
def test_cuda_matches_cpu():
    gen = torch.Generator().manual_seed(13)
    q, k, v = rand_qkv(gen, 2, 4, 2, 40, 70, 32, 32, dtype=torch.float32)
    doc_ids = torch.randint(0, 4, (90,), generator=gen).sort().values.to(torch.int32)

    def variant(ids):
        return Variant(score_mod=V.alibi(4), mask_mod=V.causal() & V.document(ids))

    out, lse = attention(q, k, v, variant(doc_ids), return_lse=True, q_offset=30, chunk=16)
    out_c, lse_c = attention(q.cuda(), k.cuda(), v.cuda(), variant(doc_ids.cuda()), return_lse=True, q_offset=30,
                             chunk=16)
    assert out_c.is_cuda and lse_c.is_cuda
    torch.testing.assert_close(out_c.cpu(), out, atol=1e-5, rtol=1e-5)
    assert_lse_close(lse_c.cpu(), lse.double(), atol=1e-5, rtol=1e-5)
    assert torch.equal(dense_mask(variant(doc_ids.cuda()), 2, 4, 40, 70, q_offset=30, device="cuda").cpu(),
                       dense_mask(variant(doc_ids), 2, 4, 40, 70, q_offset=30))
