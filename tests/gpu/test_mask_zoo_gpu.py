"""The masks researchers write (benchmarks/mask_zoo.py at test scale: NATTEN 1D/2D/tiled/dilated, local +
global tokens, windows with prefixes, chunks, dilation, strided) through the generated kernels vs the float64
golden: the derived ranges and tile classes the kernels skip by must be right, not only the block map."""
import concurrent.futures as cf
import functools
import os
import sys
from pathlib import Path

import pytest
import torch

import attngen
from attngen.mods import MaskMod
from helpers import assert_matches_float64

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import mask_zoo  # noqa: E402

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
BACKEND = os.environ.get("ATTNGEN_TEST_BACKEND", "auto")
L = 2048
NAMES = [n for n in mask_zoo.ZOO if not n.startswith("document")]  # documents: tests/gpu/test_gpu_api.py


@functools.lru_cache(maxsize=None)
def compiled():
    """Each mask compiled once and its bf16 hd128 library built, all builds at once."""
    out = {n: attngen.compile(mask_mod=MaskMod(mask_zoo.make(n, L, small=True, device=DEV), n), backend=BACKEND) for n in NAMES}
    kernel = BACKEND if BACKEND in ("sm80", "sm90") else "auto"
    with cf.ThreadPoolExecutor(max_workers=int(os.environ.get("ATTNGEN_TEST_BUILD_JOBS", "8"))) as ex:
        for f in [ex.submit(lambda a: a.spec(torch.bfloat16, 128, kernel=kernel).build_cached(), a) for a in out.values()]:
            f.result()
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("Lq,Lk,q_offset", [(L, L, 0), (777, L, 1100), (L - 3, L - 5, 0)])
def test_zoo_mask_kernel_matches_float64(requires_gpu, name, Lq, Lk, q_offset):
    attn = compiled()[name]
    g = torch.Generator(device=DEV).manual_seed(hash((name, Lq, Lk, q_offset)) % (2 ** 31))
    q = torch.randn(1, 4, Lq, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 4, Lk, 128, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset)
    torch.cuda.synchronize()
    assert_matches_float64(f"{name} Lq={Lq} Lk={Lk} q_offset={q_offset}", out, lse, q, k, v, attn.variant,
                           128 ** -0.5, q_offset)
