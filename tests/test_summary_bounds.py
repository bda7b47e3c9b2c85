"""The per-block min / max summaries the kernels read (int32, float32) are never tighter than the captured values:
integers outside (-2^30, 2^30) are refused with an InputError (an int64 bound wrapped to int32 made tiles look full
across documents, and the kernels' classifier subtracts two bounds in int32), float64 bounds are rounded outwards;
the block map stays sound next to the limit."""
import pytest
import torch

import attngen
from attngen.blockmap import EMPTY, FULL, block_map
from attngen.summaries import _narrowed, check_value_ranges, device_assert_message

L, BLK = 512, 64
BOUND = 2 ** 30


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


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("base", [BOUND - 6, -BOUND + 1])
def test_ids_next_to_the_limit_keep_the_block_map_sound(base, dtype):
    # documents of 100 positions, the ids reaching the bound's last value on either side: full and empty tiles
    ids = ((torch.arange(L) // 100) + base).to(dtype)
    bad, bm = _unsound_tiles(attngen.compile(mask_mod=attngen.document(ids)), ids)
    assert bad == 0 and (bm == FULL).any() and (bm == EMPTY).any()


@pytest.mark.parametrize("dtype,base", [(torch.int64, 2 ** 31 - 2), (torch.int64, -2 ** 31 - 3), (torch.int64, 2 ** 40),
                                        (torch.int64, BOUND - 2), (torch.int32, 2 ** 31 - 6), (torch.int32, -BOUND)])
def test_ids_outside_the_limit_are_refused(base, dtype):
    # int64 ids 2^31 - 2 .. 2^31 + 3 wrapped to negative int32 bounds: seven tiles read FULL across two documents
    # (attention across documents, silently) before the check; int32 ids spanning more than 2^31 overflow the
    # classifier's differences in the kernels
    ids = ((torch.arange(L) // 100) + base).to(dtype)
    attn = attngen.compile(mask_mod=attngen.document(ids))  # on the CPU: the reference path needs no summaries
    check_value_ranges(attn.facts.summaries, {"t0": ids})  # a CPU tensor feeds no kernel: compile does not refuse
    with pytest.raises(attngen.InputError, match=r"outside \(-2\^30, 2\^30\) .*torch\.unique"):
        block_map(attn, L, L, block=(BLK, BLK))
    with pytest.raises(attngen.InputError, match=rf"captured tensor t0 \({str(dtype).replace('.', '[.]')}\)"):
        _narrowed(ids, "max", "t0", ids.dtype)
    # the fix the message names keeps the map (order and equality) and passes
    fixed = torch.unique(ids, sorted=True, return_inverse=True)[1].to(torch.int32)
    assert _unsound_tiles(attngen.compile(mask_mod=attngen.document(fixed)), fixed)[0] == 0


def test_an_in_place_update_out_of_range_is_caught_when_the_summaries_are_recomputed():
    ids = (torch.arange(L) // 100).to(torch.int64)
    attn = attngen.compile(mask_mod=attngen.document(ids))
    assert _unsound_tiles(attn, ids)[0] == 0
    ids.add_(2 ** 31 - 2)
    with pytest.raises(attngen.InputError, match=r"outside \(-2\^30, 2\^30\)"):
        block_map(attn, L, L, block=(BLK, BLK))


@pytest.mark.parametrize("name", ["t0", "document_ids_of_every_sequence_in_the_packed_batch" * 4])
def test_the_device_assert_message_fits_torchs_cap(name):
    """torch's CUDA _assert_async refuses messages of 255 characters or more (the CPU one does not, so only the length
    can be checked here): a longer one made every GPU call with a captured integer tensor raise."""
    message = device_assert_message(name, torch.int64)
    assert len(message) < 255 and "(-2^30, 2^30)" in message and "torch.unique" in message


def test_float64_bounds_round_outwards():
    x = torch.tensor([1.0 + 2.0 ** -40, -(1.0 + 2.0 ** -40), 3.0, 1e300, -1e300], dtype=torch.float64)
    lo, hi = _narrowed(x, "min", "t0", x.dtype), _narrowed(x, "max", "t0", x.dtype)
    assert lo.dtype == hi.dtype == torch.float32
    assert (lo.double() <= x).all() and (hi.double() >= x).all()
    assert lo[0] < hi[0] and lo[2] == hi[2] == 3.0  # exact values stay exact, others straddle the truth
    # integers within the bound pass through as int32
    i = torch.tensor([-BOUND + 1, 0, BOUND - 1], dtype=torch.int64)
    assert torch.equal(_narrowed(i, "min", "t0", i.dtype), i.to(torch.int32))
