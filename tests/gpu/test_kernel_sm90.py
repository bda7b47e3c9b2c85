"""GPU part of the sm90 (Hopper) kernel template's tests (H100 / H200 only): the sm80 kernel's correctness suite
(tests/kernel_suite.py: float64 golden, poisoned outputs, lengths, GQA, strides, q offsets, fully masked rows, ...)
run against sm90 libraries, plus the non-default template paths and the TMA fallback code. The CPU part (render,
ptxas, SASS, ABI) is tests/test_build_sm90.py.

Set ATTNGEN_TEST_BUILD_DIR_SM90 to keep (and reuse) the compiled libraries between runs.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import kernel_suite as ref  # the sm80 suite's checked call
import reference64
from attngen.jit import ninja, tiles
from attngen import launch
from helpers import ERR_TMA_LAYOUT
from sm90_builds import LADDER, SM90_TILES, sm90_key, sm90_sources

# requires_sm90: skipped at collection (tests/conftest.py), before the module's build fixtures compile anything
pytestmark = pytest.mark.requires_sm90

GPU_VARIANTS = ("full", "causal", "softcap", "sliding", "alibi_doc", "bias2d_pad")
GPU_DTYPES = (torch.bfloat16, torch.float16)
GPU_HEAD_DIMS = (64, 128, 256)
# Non-default template paths, each checked on a few cases: (name suffix, tiles per head dim)
GPU_ALT = {
    "noov": {hd: replace(SM90_TILES[hd], overlap=False) for hd in GPU_HEAD_DIMS},
    "nopp": {hd: replace(SM90_TILES[hd], pingpong=False) for hd in GPU_HEAD_DIMS},
    "plain": {hd: replace(SM90_TILES[hd], overlap=False, pingpong=False) for hd in GPU_HEAD_DIMS},
    "persistent": {hd: replace(SM90_TILES[hd], persistent=True) for hd in GPU_HEAD_DIMS},
    # a tile's epilogue under the next tile's first Q K^T (hd 256 has one Q buffer: the switch does nothing there)
    "cross": {hd: replace(SM90_TILES[hd], persistent=True, cross_tile=True) for hd in (64, 128)},
    "cross_nopp": {hd: replace(SM90_TILES[hd], persistent=True, cross_tile=True, pingpong=False) for hd in (64, 128)},
    # O stored from registers by every thread (the default stages it in the tile's Q buffer for a TMA store), on the
    # persistent grid and with one CTA per work tile
    "o_registers": {hd: replace(SM90_TILES[hd], persistent=True, o_staged=False) for hd in GPU_HEAD_DIMS},
    "o_registers_single": {hd: replace(SM90_TILES[hd], o_staged=False) for hd in GPU_HEAD_DIMS},
    "rescale_on_growth": {hd: replace(SM90_TILES[hd], rescale_threshold=0.0) for hd in GPU_HEAD_DIMS},
    "pinned": {hd: replace(SM90_TILES[hd], pingpong=False, pin_softmax=True) for hd in GPU_HEAD_DIMS},
    "wide": {hd: tiles.SM90_WIDE.get(hd, SM90_TILES[hd]) for hd in GPU_HEAD_DIMS},  # hd128: (176, 2)
    "wide_persistent": {hd: replace(tiles.SM90_WIDE.get(hd, SM90_TILES[hd]), persistent=True) for hd in GPU_HEAD_DIMS},
    "ladder1": {hd: LADDER[hd][1] for hd in GPU_HEAD_DIMS},
    "ladder_mid": {hd: LADDER[hd][len(LADDER[hd]) // 2] for hd in GPU_HEAD_DIMS},  # hd128: (96, 2)
    "ladder_last": {hd: LADDER[hd][-1] for hd in GPU_HEAD_DIMS},
}


@pytest.fixture(scope="module")
def sm90_build(requires_sm90, tmp_path_factory):
    root = Path(os.environ.get("ATTNGEN_TEST_BUILD_DIR_SM90") or tmp_path_factory.mktemp("attngen_sm90_gpu"))
    wanted = [(n, d, hd, None) for n in GPU_VARIANTS for d in GPU_DTYPES for hd in GPU_HEAD_DIMS]
    wanted += [(n, torch.bfloat16, hd, tiles) for alt in GPU_ALT.values() for n in ("causal", "alibi_doc")
               for hd, tiles in alt.items()]
    sources = sm90_sources(wanted)
    ninja.write_build_ninja(root, sources, "sm_90a")
    ninja.run_ninja(root, jobs=os.cpu_count())
    cache = {}

    def get(name, dtype, hd, tiles=None):
        key = sm90_key(name, dtype, hd, tiles)
        if key not in cache:
            cache[key] = launch.load_library(root / key / ninja.LIBRARY_NAME)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def libs(sm90_build):
    return lambda name, dtype, hd: sm90_build(name, dtype, hd)


@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_gpu_variant(libs, name, dtype, hd):
    q_offset = 100 if name in ("alibi_doc", "bias2d_pad", "causal") else 0
    ref.run_case(libs, name, dtype, hd, Lq=77, Lk=300, q_offset=q_offset)
    ref.run_case(libs, name, dtype, hd, B=1, Hq=2, Hkv=1, Lq=600, Lk=1000, q_offset=q_offset, seed=1)


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 77), (77, 1), (77, 77), (128, 128), (129, 64), (1000, 1000),
                                   (130, 1000), (1000, 130), (256, 81), (300, 2000)])
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("name", ["full", "causal"])
def test_gpu_lengths(libs, name, hd, Lq, Lk):
    ref.run_case(libs, name, torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=Lq, Lk=Lk, q_offset=max(Lk - Lq, 0))


@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
def test_gpu_gqa_mqa_and_strides(libs, dtype, hd):
    ref.run_case(libs, "causal", dtype, hd, B=3, Hq=8, Hkv=1, Lq=150, Lk=150, layout="blhd")  # MQA, (B,L,H,D)
    ref.run_case(libs, "softcap", dtype, hd, B=2, Hq=6, Hkv=3, Lq=65, Lk=333, layout="blhd")  # GQA


@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("q_offset", [-300, -50, 7, 500])
def test_gpu_q_offset(libs, hd, q_offset):
    if q_offset < 0:  # refused before launch: generated code and block predicates rely on q_idx >= 0
        from attngen.errors import InputError

        with pytest.raises(InputError, match="q_offset must be >= 0"):
            ref.run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
        return
    ref.run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
    ref.run_case(libs, "sliding", torch.float16, hd, Lq=200, Lk=900, q_offset=q_offset)


@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("name", ["alibi_doc", "bias2d_pad"])
def test_gpu_fully_masked_rows(libs, name, hd):
    q_offset = 170 if name == "alibi_doc" else 0
    ref.run_case(libs, name, torch.bfloat16, hd, Lq=90, Lk=170, q_offset=q_offset, all_masked=True)


@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
def test_gpu_documents_long_and_no_lse(libs, hd):
    ref.run_case(libs, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=2, Lq=1000, Lk=1500, q_offset=500, seed=3)
    ref.run_case(libs, "alibi_doc", torch.float16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=700, q_offset=0, seed=4)
    ref.run_case(libs, "full", torch.float16, hd, Lq=100, Lk=100, return_lse=False, scale=0.3)
    ref.run_case(libs, "softcap", torch.bfloat16, hd, Lq=100, Lk=100, scale=1.0)
    ref.run_case(libs, "full", torch.bfloat16, hd, Lq=100, Lk=100, scale=-0.2)  # negative scale


@pytest.mark.parametrize("alt,hd", [(alt, hd) for alt in sorted(GPU_ALT) for hd in GPU_ALT[alt]],
                         ids=lambda x: str(x))
def test_gpu_template_paths(sm90_build, alt, hd):
    tiles = GPU_ALT[alt][hd]
    libs_alt = lambda name, dtype, h: sm90_build(name, dtype, h, tiles)  # noqa: E731
    ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=2, Hq=4, Hkv=2, Lq=333, Lk=700, q_offset=367)
    ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=1, Lk=1)
    ref.run_case(libs_alt, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=900, q_offset=100, seed=5)
    if tiles.persistent:
        # more work tiles (2 x 12 x 9 = 216) than an H100/H200 has SMs: CTAs walk several tiles, in snake rounds
        ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=2, Hq=12, Hkv=4, Lq=1100, Lk=1300, q_offset=200)
        # and a masked variant whose tiles' kv walks differ in length, across tiles (cross_tile's hand-over)
        ref.run_case(libs_alt, "alibi_doc", torch.bfloat16, hd, B=2, Hq=12, Hkv=4, Lq=1100, Lk=1300, q_offset=200,
                     seed=6)
    # O's TMA map (or its rows from registers) with q, k, v in a (B, L, H, D) layout, Lq not a multiple of 64: the
    # rows past Lq (the canaries) are never written
    ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=3, Hq=8, Hkv=1, Lq=150, Lk=150, layout="blhd")


def test_gpu_empty_kv_and_side_stream(libs):
    ref.check_empty_kv(libs("full", torch.bfloat16, 64))
    ref.check_side_stream(libs("causal", torch.bfloat16, 128))


def test_gpu_tma_fallback_code(libs):
    """A layout TMA may refuse (k/v expanded over the batch: stride 0) either runs correctly or returns the
    documented fallback code, never garbage."""
    lib = libs("causal", torch.bfloat16, 128)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 100, 128, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(1, 2, 150, 128, generator=g).to(torch.bfloat16).cuda().expand(3, -1, -1, -1)
    v = torch.randn(1, 2, 150, 128, generator=g).to(torch.bfloat16).cuda().expand(3, -1, -1, -1)
    try:
        out = launch.forward(lib, q, k, v, q_offset=50)
    except launch.KernelLaunchError as e:
        assert f"error {ERR_TMA_LAYOUT}" in str(e) and "sm80" in str(e), str(e)
        return
    torch.cuda.synchronize()
    score_mod, mask_mod = ref.fixture_mods("causal", [])
    o_ref, _ = reference64.attention(q, k.contiguous(), v.contiguous(), score_mod=score_mod, mask_mod=mask_mod,
                                     scale=1 / math.sqrt(128), q_offset=50)
    assert (out.double() - o_ref).abs().max().item() < 2e-2
