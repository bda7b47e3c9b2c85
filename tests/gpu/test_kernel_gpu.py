"""GPU tests of the sm80 forward kernel: compiled fixture variants (tests/data/*.inc) against the float64
golden (tests/reference64.py), with the error bound max(2 x error of an eager same-dtype torch
implementation, small atol); the checked call is tests/kernel_suite.py's run_case.

Set ATTNGEN_TEST_BUILD_DIR to keep (and reuse) the compiled libraries between runs.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernel_suite import (DTYPES, HEAD_DIMS, VARIANTS, check_empty_kv, check_side_stream, run_case, suite_sources,
                          suite_subdir)

pytestmark = pytest.mark.requires_gpu


# --------------------------------------------------------------------------------------------------
# building every (variant, dtype, head dim) once, in one parallel ninja run


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    from attngen import launch
    from attngen.jit import ninja, toolchain

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the kernels need sm80+")
    arch = toolchain.current_arch()
    build_dir = Path(os.environ.get("ATTNGEN_TEST_BUILD_DIR") or tmp_path_factory.mktemp("attngen_gpu_build"))
    ninja.write_build_ninja(build_dir, suite_sources(arch), arch)
    ninja.run_ninja(build_dir, jobs=os.cpu_count())
    cache = {}

    def get(name, dtype, hd):
        key = (name, dtype, hd)
        if key not in cache:
            cache[key] = launch.load_library(build_dir / suite_subdir(name, dtype, hd) / ninja.LIBRARY_NAME)
        return cache[key]

    return get


# --------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", VARIANTS)
def test_variant(libs, name, dtype, hd):
    q_offset = 100 if name in ("alibi_doc", "bias2d_pad", "causal") else 0
    run_case(libs, name, dtype, hd, Lq=77, Lk=300, q_offset=q_offset)


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 77), (77, 1), (77, 77), (128, 128), (129, 64), (1000, 1000),
                                   (130, 1000), (1000, 130)])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("name", ["full", "causal"])
def test_lengths(libs, name, hd, Lq, Lk):
    # q_offset = Lk - Lq aligns the last query with the last key (decode / chunked prefill)
    run_case(libs, name, torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=Lq, Lk=Lk, q_offset=max(Lk - Lq, 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_gqa_mqa_and_strides(libs, dtype, hd):
    run_case(libs, "causal", dtype, hd, B=3, Hq=8, Hkv=1, Lq=150, Lk=150, layout="blhd")  # MQA
    run_case(libs, "softcap", dtype, hd, B=2, Hq=6, Hkv=3, Lq=65, Lk=333, layout="blhd")  # GQA


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("q_offset", [-300, -50, 7, 500])
def test_q_offset(libs, hd, q_offset):
    if q_offset < 0:  # refused before launch: generated code and block predicates rely on q_idx >= 0
        from attngen.errors import InputError

        with pytest.raises(InputError, match="q_offset must be >= 0"):
            run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
        return
    run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
    run_case(libs, "sliding", torch.float16, hd, Lq=200, Lk=900, q_offset=q_offset)


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("name", ["alibi_doc", "bias2d_pad"])
def test_fully_masked_rows(libs, name, hd):
    # alibi_doc: the queries (q_idx >= Lk) sit in a document of their own, so the classifier finds every
    # tile EMPTY and the kernel visits none; bias2d_pad: every key is padding, tiles visited, all masked.
    q_offset = 170 if name == "alibi_doc" else 0
    run_case(libs, name, torch.bfloat16, hd, Lq=90, Lk=170, q_offset=q_offset, all_masked=True)


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_documents_long(libs, hd):
    # sorted documents: EMPTY tiles skipped (also before the first visited one), FULL and PARTIAL tiles
    run_case(libs, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=2, Lq=1000, Lk=1500, q_offset=500, seed=3)
    run_case(libs, "alibi_doc", torch.float16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=700, q_offset=0, seed=4)


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_without_lse_and_scale(libs, hd):
    run_case(libs, "full", torch.float16, hd, Lq=100, Lk=100, return_lse=False, scale=0.3)
    run_case(libs, "softcap", torch.bfloat16, hd, Lq=100, Lk=100, scale=1.0)  # large scores: cap matters


def test_empty_kv(libs):
    from attngen import launch

    lib = libs("full", torch.bfloat16, 64)
    q, k = check_empty_kv(lib)
    out = launch.forward(lib, q[:, :, :0], k, k)
    assert out.shape == (1, 2, 0, 64)


def test_on_side_stream(libs):
    check_side_stream(libs("causal", torch.bfloat16, 128))


def test_input_errors_before_launch(libs):
    from attngen import launch
    from attngen.errors import InputError

    lib = libs("full", torch.bfloat16, 64)
    q = torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="float16"):
        launch.forward(lib, q.float(), q.float(), q.float())
    with pytest.raises(InputError, match="one dtype"):
        launch.forward(lib, q, q.half(), q)
    with pytest.raises(InputError, match="CUDA"):
        launch.forward(lib, q.cpu(), q.cpu(), q.cpu())
    with pytest.raises(InputError, match="rank 4"):
        launch.forward(lib, q[0], q[0], q[0])
    with pytest.raises(InputError, match="64, 128, 256"):
        x = torch.randn(1, 4, 16, 96, device="cuda", dtype=torch.bfloat16)
        launch.forward(lib, x, x, x)
    with pytest.raises(InputError, match="multiple"):
        launch.forward(lib, q, q[:, :3], q[:, :3])
    with pytest.raises(InputError, match="batch"):
        launch.forward(lib, q, torch.cat([q, q]), torch.cat([q, q]))
    with pytest.raises(InputError, match="contiguous"):
        x = torch.randn(1, 4, 16, 128, device="cuda", dtype=torch.bfloat16)[..., ::2]
        launch.forward(lib, x, x, x)
    with pytest.raises(InputError, match="captured tensor #0"):
        launch.forward(lib, q, q, q, captured=[torch.zeros(3)])
    with pytest.raises(InputError, match="head dim 128"):
        x = torch.randn(1, 4, 16, 128, device="cuda", dtype=torch.bfloat16)
        launch.forward(lib, x, x, x)
