"""The per-block min / max summaries the kernels read (int32, float32) are never tighter than the captured values:
integers int32 cannot hold are refused with an InputError (a wrapped bound made tiles look full across documents),
float64 bounds are rounded outwards; the block map stays sound next to int32's limits."""
import pytest
import torch

import attngen
from attngen.blockmap import EMPTY, FULL, block_map
from attngen.summaries import _narrowed, check_value_ranges

L, BLK = 512, 64


def _unsound_tiles(attn, ids):
    """Tiles the block map calls EMPTY with a kept pair or FULL with a masked one, against the dense mask."""
    bm = block_map(attn, L, L, block=(BLK, BLK))
    dense = ids[:, None] == ids[None, :]
    bad = 0
    for i in range(bm.shape[0]):
        for j in range(bm.shape[1]):
            t = dense[i * BLK:(i + 1) * BLK, j * BLK:(j + 1) * BLK]
            bad += int((bm[i, j] == EMPTY and bool(t.any())) or (bm[i, j] == FULL and not bool(t.all())))
    return bad, bm


def test_int64_ids_next_to_int32s_limit_keep_the_block_map_sound():
    # documents of 100 positions, the largest id int32's maximum: every bound fits, the map has full tiles
    ids = (torch.arange(L) // 100).to(torch.int64) + (torch.iinfo(torch.int32).max - 5)
    bad, bm = _unsound_tiles(attngen.compile(mask_mod=attngen.document(ids)), ids)
    assert bad == 0 and (bm == FULL).any() and (bm == EMPTY).any()


@pytest.mark.parametrize("base", [2 ** 31 - 2, -2 ** 31 - 3, 2 ** 40])
def test_int64_ids_outside_int32_are_refused(base):
    # the ids 2^31 - 2 .. 2^31 + 3 wrapped to negative bounds in the int32 summaries: seven tiles read FULL across
    # two documents (attention across documents, silently) before the check
    ids = (torch.arange(L) // 100).to(torch.int64) + base
    attn = attngen.compile(mask_mod=attngen.document(ids))  # on the CPU: the reference path needs no summaries
    with pytest.raises(attngen.InputError, match=r"outside int32's range .*torch\.unique"):
        block_map(attn, L, L, block=(BLK, BLK))
    with pytest.raises(attngen.InputError, match=r"captured tensor t0 \(torch\.int64\)"):
        _narrowed(ids, "max", "t0", ids.dtype)
    check_value_ranges(attn.facts.summaries, {"t0": ids})  # a CPU tensor feeds no kernel: compile does not refuse
    # the fix the message names keeps the map (order and equality) and passes
    fixed = torch.unique(ids, sorted=True, return_inverse=True)[1].to(torch.int32)
    bad, _ = _unsound_tiles(attngen.compile(mask_mod=attngen.document(fixed)), fixed)
    assert bad == 0


def test_an_in_place_update_out_of_range_is_caught_when_the_summaries_are_recomputed():
    ids = (torch.arange(L) // 100).to(torch.int64)
    attn = attngen.compile(mask_mod=attngen.document(ids))
    assert _unsound_tiles(attn, ids)[0] == 0
    ids.add_(2 ** 31 - 2)
    with pytest.raises(attngen.InputError, match="outside int32's range"):
        block_map(attn, L, L, block=(BLK, BLK))


def test_float64_bounds_round_outwards():
    x = torch.tensor([1.0 + 2.0 ** -40, -(1.0 + 2.0 ** -40), 3.0, 1e300, -1e300], dtype=torch.float64)
    lo, hi = _narrowed(x, "min", "t0", x.dtype), _narrowed(x, "max", "t0", x.dtype)
    assert lo.dtype == hi.dtype == torch.float32
    assert (lo.double() <= x).all() and (hi.double() >= x).all()
    assert lo[0] < hi[0] and lo[2] == hi[2] == 3.0  # exact values stay exact, others straddle the truth
    # int32 and narrower integers pass through unchanged
    i = torch.tensor([-7, 0, 2 ** 31 - 1], dtype=torch.int32)
    assert torch.equal(_narrowed(i, "min", "t0", i.dtype), i)
