"""The sm90 (Hopper) kernel template, attngen/templates/fwd_sm90.cu.j2.

CPU part (needs nvcc, no GPU): render the template around fixture variant.inc files and really compile
them for sm_90a in one ninja run (-j2), then check what ptxas reports (registers, spills, no wgmma
serialization) and, where cuobjdump + nvdisasm are installed, the SASS itself (HGMMA with the transposed
V operand, TMA loads, setmaxnreg, no local memory). The host side of the C ABI is exercised by loading
the libraries (no GPU needed).

GPU part (@pytest.mark.gpu): the sm80 kernel's correctness suite (tests/test_kernel_gpu.py: float64
references, poisoned outputs, lengths, GQA, strides, q offsets, fully masked rows, ...) run against
sm90 libraries, plus the non-default template paths and the TMA fallback code.

The template is rendered here directly; SM90_TILES below is the proposed default for build.py.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import pytest
import torch

from attngen import build, runtime
from attngen.errors import BuildError

DATA = Path(__file__).parent / "data"
TEMPLATE = "fwd_sm90.cu.j2"
SM90_HEADERS = build.SM90_HEADERS
SMEM_LIMIT = 232448  # opt-in shared memory per block on sm90
ERR_TMA_LAYOUT = 9001
ERR_NO_TMA_ENCODER = 9002


Sm90Tiles = build.Sm90Tiles
SM90_TILES = build.SM90_TILES
LADDER = build.SM90_LADDER

def render_sm90(variant_inc: str, dtype, head_dim: int, tiles: Optional[Sm90Tiles] = None) -> dict:
    """{filename: text} of one sm90 kernel library (kernel source, variant.inc, headers)."""
    return build.render_sources(variant_inc, dtype, head_dim, "sm_90a", tiles=tiles, kernel="sm90")


def fixture_inc(name: str) -> str:
    return (DATA / f"{name}.inc").read_text()


_have_nvcc = build.nvcc_available


def _sass_tools() -> Optional[str]:
    """cuobjdump, with nvdisasm reachable (cuobjdump --dump-sass runs it): next to nvcc, on PATH, or from the
    nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels. None if either is missing."""
    dirs = []
    if _have_nvcc():
        dirs.append(str(Path(build.find_nvcc()).parent))
    dirs += os.environ.get("PATH", "").split(os.pathsep)
    try:
        import nvidia  # type: ignore

        for root in nvidia.__path__:
            dirs += sorted(glob.glob(os.path.join(root, "*", "bin")))
    except ImportError:
        pass
    cuobjdump = next((os.path.join(d, "cuobjdump") for d in dirs if os.access(os.path.join(d, "cuobjdump"), os.X_OK)),
                     None)
    nvdisasm = next((d for d in dirs if os.access(os.path.join(d, "nvdisasm"), os.X_OK)), None)
    if cuobjdump is None or nvdisasm is None:
        return None
    os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + nvdisasm
    return cuobjdump


# --------------------------------------------------------------------------------------------------
# pure Python: tiles and rendering


@pytest.mark.parametrize("hd", (64, 128, 256))
def test_tiles_fit_and_are_valid(hd):
    for cfg in LADDER[hd]:
        assert cfg.smem_bytes(hd) <= SMEM_LIMIT, (hd, cfg)
        assert cfg.block_k % 16 == 0 and 64 <= cfg.block_k <= 192 and cfg.stages >= 2
        assert (cfg.block_k * 128) % 1024 == 0  # 1024-aligned swizzle atoms in every tile
    print(f"\nhd{hd}: " + ", ".join(f"BK={c.block_k} stages={c.stages} overlap={c.overlap}: {c.smem_bytes(hd)} B"
                                    for c in LADDER[hd]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd", (64, 128, 256))
def test_render(hd, dtype):
    src = render_sm90(fixture_inc("causal"), dtype, hd)
    cu = src[build.KERNEL_SOURCE]
    cfg = SM90_TILES[hd]
    assert f"constexpr int D = {hd};" in cu and "constexpr int BQ = 128;" in cu
    assert f"constexpr int BK = {cfg.block_k};" in cu and f"constexpr int STAGES = {cfg.stages};" in cu
    assert "constexpr bool PINGPONG = true;" in cu and "constexpr bool OVERLAP = true;" in cu
    assert "constexpr bool PERSISTENT = false;" in cu
    assert ("using Elem = __nv_bfloat16;" if dtype == torch.bfloat16 else "using Elem = __half;") in cu
    assert '#include "variant.inc"' in cu and "{{" not in cu and "{%" not in cu
    for h in SM90_HEADERS:
        assert f'#include "{h}"' in cu
    off = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, overlap=False, pingpong=False, persistent=True))
    assert "constexpr bool PERSISTENT = true;" in off[build.KERNEL_SOURCE]
    assert "constexpr bool PINGPONG = false;" in off[build.KERNEL_SOURCE]
    assert "constexpr bool OVERLAP = false;" in off[build.KERNEL_SOURCE]


def test_render_needs_every_parameter():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        build._jinja_env().get_template(TEMPLATE).render(head_dim=128)


# --------------------------------------------------------------------------------------------------
# real compiles for sm_90a: one ninja, -j2

# (fixture, dtype, head dim, tiles or None for the default); alibi_doc / sm90_alibi_document are the
# captured-tensor variants (summaries + classifier), sm90_* are real codegen output (ag_tanh fast paths).
COMPILE_SET = [
    ("full", torch.bfloat16, 128, None),
    ("causal", torch.bfloat16, 128, None),
    ("softcap", torch.bfloat16, 128, None),
    ("sm90_softcap_causal", torch.bfloat16, 128, None),
    ("causal", torch.bfloat16, 64, None),
    ("causal", torch.bfloat16, 256, None),
    ("causal", torch.float16, 128, None),
    ("alibi_doc", torch.bfloat16, 128, LADDER[128][1]),
    ("sm90_alibi_document", torch.float16, 256, LADDER[256][1]),
    ("sliding", torch.bfloat16, 128, replace(SM90_TILES[128], overlap=False, pingpong=False)),
]


def _key(name, dtype, hd, tiles):
    t = tiles or SM90_TILES[hd]
    return (f"{name}_{str(dtype).replace('torch.', '')}_{hd}_bk{t.block_k}s{t.stages}"
            f"{'' if t.overlap else '_noov'}{'' if t.pingpong else '_nopp'}{'_pers' if t.persistent else ''}"
            f"{f'_rt{t.rescale_threshold:g}' if t.rescale_threshold else ''}{f'_pe{t.poly_exp2}' if t.poly_exp2 else ''}"
            f"{'_fl' if t.fold_log2e else ''}")


def _sources(configs) -> dict:
    """One build.ninja for many libraries: each (fixture, dtype, head dim, tiles) in its own subdirectory,
    the shared headers at the top."""
    sources = {}
    for name, dtype, hd, tiles in configs:
        src = render_sm90(fixture_inc(name), dtype, hd, tiles)
        sub = _key(name, dtype, hd, tiles)
        sources[f"{sub}/{build.KERNEL_SOURCE}"] = src.pop(build.KERNEL_SOURCE)
        sources[f"{sub}/{build.VARIANT_INCLUDE}"] = src.pop(build.VARIANT_INCLUDE)
        sources.update(src)
    return sources


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if not _have_nvcc():
        pytest.skip("needs nvcc")
    root = tmp_path_factory.mktemp("attngen_sm90")
    sources = _sources(COMPILE_SET)
    build.write_build_ninja(root, sources, "sm_90a", ["-Xptxas", "-v"])
    output = build.run_ninja(root, jobs=2)
    return root, output


def _ptxas_report(output: str) -> dict:
    """{object directory: [registers, spill store bytes, spill load bytes, stack bytes]} from ninja output."""
    report, cur = {}, None
    for line in output.splitlines():
        m = re.search(r"NVCC (\S+)/" + re.escape(build.KERNEL_SOURCE[:-3]) + r"\.o", line)
        if m:
            cur = m.group(1)
            report.setdefault(cur, [None, 0, 0, 0])
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            report[cur][1:] = [int(m.group(2)), int(m.group(3)), int(m.group(1))]
        m = re.search(r"Used (\d+) registers", line)
        if m:
            report[cur][0] = int(m.group(1))
    return report


@pytest.mark.nvcc
def test_ptxas_registers_and_no_spills(compiled):
    root, output = compiled
    report = _ptxas_report(output)
    expected = {_key(*c) for c in COMPILE_SET}
    assert set(report) == expected, f"missing ptxas reports: {expected - set(report)}"
    print("\nptxas (sm_90a; 'registers' is the entry cap of __launch_bounds__(384, 1): setmaxnreg then gives the "
          "consumers 240 and the producer 24):")
    for key, (regs, st, ld, stack) in sorted(report.items()):
        print(f"  {key:48s} {regs} registers, {stack} B stack, {st} B spill stores, {ld} B spill loads")
    for key, (regs, st, ld, stack) in report.items():
        assert regs == 168, f"{key}: expected the 168-register entry cap of 384 threads, got {regs}"
        assert st == 0 and ld == 0 and stack == 0, f"{key}: spills ({st} B stores, {ld} B loads, {stack} B stack)"


@pytest.mark.nvcc
def test_no_wgmma_serialization_or_setmaxnreg_warnings(compiled):
    _, output = compiled
    # ptxas warns when it has to serialize the wgmma pipeline (a register of an in-flight wgmma touched)
    # or ignores setmaxnreg (no register cap at entry).
    assert "serialized" not in output, output
    assert "setmaxnreg" not in output.lower(), output
    assert "warning" not in output.lower(), output


@pytest.mark.nvcc
def test_sass(compiled):
    cuobjdump = _sass_tools()
    if cuobjdump is None:
        pytest.skip("needs cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    root, _ = compiled
    for name, dtype, hd, tiles in COMPILE_SET:
        t = tiles or SM90_TILES[hd]
        obj = root / _key(name, dtype, hd, tiles) / "attngen_fwd.o"
        sass = subprocess.run([cuobjdump, "--dump-sass", str(obj)], capture_output=True, text=True, check=True).stdout
        ty = r"\.BF16" if dtype == torch.bfloat16 else ""  # fp16 inputs print no type suffix
        qk = re.findall(rf"HGMMA\.64x{t.block_k}x16\.F32{ty} R\d+, gdesc", sass)
        pv = re.findall(rf"HGMMA\.64x{hd}x16\.F32{ty} R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", sass)
        assert qk, f"{obj}: no S = Q K^T HGMMA (SS, 64x{t.block_k}) in the SASS"
        assert pv, f"{obj}: no O += P V HGMMA (RS, transposed V, 64x{hd}) in the SASS"
        assert len(qk) % (hd // 16) == 0 and len(pv) % (t.block_k // 16) == 0
        assert "UTMALDG.4D" in sass and "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass
        assert "USETMAXREG.TRY_ALLOC.CTAPOOL" in sass and "0xf0" in sass
        assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass  # mbarrier waits
        if t.overlap:
            assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass, "the overlapped loop waits for S(next) only"
        local = [l for l in sass.splitlines() if re.search(r"\b(LDL|STL)\b", l)]
        assert not local, f"{obj}: local memory in the SASS:\n" + "\n".join(local[:10])
        assert not re.search(r"\bHMMA\b", sass), "mma.sync in the sm90 kernel: wgmma path not taken"


# --------------------------------------------------------------------------------------------------
# host side of the C ABI (no GPU needed to load a library)


@pytest.mark.nvcc
def test_kernel_info_and_abi(compiled):
    root, _ = compiled
    for name, dtype, hd, tiles in COMPILE_SET:
        t = tiles or SM90_TILES[hd]
        path = root / _key(name, dtype, hd, tiles) / build.LIBRARY_NAME
        lib = runtime.load_library(path)
        assert (lib.head_dim, lib.dtype, lib.block_q, lib.block_k) == (hd, dtype, 128, t.block_k)
        assert lib.num_threads == 384 and lib.arch == 90 and lib.smem_bytes == t.smem_bytes(hd)
        assert lib.error_string(0) == "no error"
        assert "sm80" in lib.error_string(ERR_TMA_LAYOUT) and "TMA" in lib.error_string(ERR_TMA_LAYOUT)
        assert "cuTensorMapEncodeTiled" in lib.error_string(ERR_NO_TMA_ENCODER)


def _packed_args(q=16, k=16, v=16, o=16, B=1, Hq=2, Hkv=1, Lq=8, Lk=8, D=128, strides=None):
    st = strides or [Hq * Lq * D, Lq * D, D] * 4
    return runtime._PACK.pack(q, k, v, o, 0, *st, B, Hq, Hkv, Lq, Lk, D, 0.1, 0, *([0] * 48))


@pytest.mark.nvcc
def test_attngen_fwd_argument_checks_without_gpu(compiled):
    root, _ = compiled
    lib = runtime.load_library(root / _key("causal", torch.bfloat16, 128, None) / build.LIBRARY_NAME)
    assert lib.launch(_packed_args(B=0), 0) == 0                         # nothing to do: no CUDA call at all
    assert lib.launch(_packed_args(D=64), 0) == 1                        # cudaErrorInvalidValue
    assert lib.launch(_packed_args(Hq=3, Hkv=2), 0) == 1
    assert lib.launch(_packed_args(q=24), 0) == 716                      # cudaErrorMisalignedAddress
    assert lib.launch(_packed_args(strides=[2 * 8 * 128, 8 * 128, 132] + [2 * 8 * 128, 8 * 128, 128] * 3), 0) == 716
    if ctypes.util.find_library("cuda") is None and not torch.cuda.is_available():
        # no driver: the tensor-map encoder cannot be had, so the call asks for the sm80 fallback
        assert lib.launch(_packed_args(), 0) == ERR_NO_TMA_ENCODER


@pytest.mark.nvcc
def test_library_exports_only_the_abi(compiled):
    if shutil.which("nm") is None or shutil.which("readelf") is None:
        pytest.skip("needs binutils")
    root, _ = compiled
    path = root / _key("causal", torch.bfloat16, 128, None) / build.LIBRARY_NAME
    syms = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert {s for s in syms if s.startswith("attngen")} == {"attngen_fwd", "attngen_abi_version",
                                                           "attngen_kernel_info", "attngen_error_string"}
    assert not any("tma_encode" in s or s.startswith("cuda") for s in syms)
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    assert not any(n.startswith(("libcuda.so", "libcudart.so")) for n in needed), needed


# --------------------------------------------------------------------------------------------------
# GPU: the sm80 kernel's correctness suite against sm90 libraries (H100 / H200 only)


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# skipif (not a skip in the body): evaluated before the module's build fixtures would compile anything
needs_sm90 = pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (H100 / H200)")
GPU_VARIANTS = ("full", "causal", "softcap", "sliding", "alibi_doc", "bias2d_pad")
GPU_DTYPES = (torch.bfloat16, torch.float16)
GPU_HEAD_DIMS = (64, 128, 256)
# Non-default template paths, each checked on a few cases: (name suffix, tiles per head dim)
GPU_ALT = {
    "noov": {hd: replace(SM90_TILES[hd], overlap=False) for hd in GPU_HEAD_DIMS},
    "nopp": {hd: replace(SM90_TILES[hd], pingpong=False) for hd in GPU_HEAD_DIMS},
    "plain": {hd: replace(SM90_TILES[hd], overlap=False, pingpong=False) for hd in GPU_HEAD_DIMS},
    "persistent": {hd: replace(SM90_TILES[hd], persistent=True) for hd in GPU_HEAD_DIMS},
    "rescale_always": {hd: replace(SM90_TILES[hd], rescale_threshold=0.0) for hd in GPU_HEAD_DIMS},
    "wide": {hd: build.SM90_WIDE.get(hd, SM90_TILES[hd]) for hd in GPU_HEAD_DIMS},  # hd128: (176, 2)
    "wide_persistent": {hd: replace(build.SM90_WIDE.get(hd, SM90_TILES[hd]), persistent=True) for hd in GPU_HEAD_DIMS},
    "poly3_fold": {hd: replace(SM90_TILES[hd], poly_exp2=3, fold_log2e=True) for hd in GPU_HEAD_DIMS},
    "ladder1": {hd: LADDER[hd][1] for hd in GPU_HEAD_DIMS},
    "ladder_mid": {hd: LADDER[hd][len(LADDER[hd]) // 2] for hd in GPU_HEAD_DIMS},  # hd128: (96, 2)
    "ladder_last": {hd: LADDER[hd][-1] for hd in GPU_HEAD_DIMS},
}


def test_gpu_suite_helpers_are_importable():
    """The GPU part reuses the sm80 suite's checked call; fail here (on CPU CI) if it moved."""
    import test_kernel_gpu as g

    assert callable(g.run_case) and callable(g.attention) and callable(g.make_captured)
    assert callable(g.check_side_stream) and callable(g.check_empty_kv)


@pytest.fixture(scope="module")
def sm90_build(tmp_path_factory):
    root = Path(os.environ.get("ATTNGEN_TEST_BUILD_DIR_SM90") or tmp_path_factory.mktemp("attngen_sm90_gpu"))
    wanted = [(n, d, hd, None) for n in GPU_VARIANTS for d in GPU_DTYPES for hd in GPU_HEAD_DIMS]
    wanted += [(n, torch.bfloat16, hd, alt[hd]) for alt in GPU_ALT.values() for n in ("causal", "alibi_doc")
               for hd in GPU_HEAD_DIMS]
    sources = _sources(wanted)
    build.write_build_ninja(root, sources, "sm_90a")
    build.run_ninja(root, jobs=os.cpu_count())
    cache = {}

    def get(name, dtype, hd, tiles=None):
        key = _key(name, dtype, hd, tiles)
        if key not in cache:
            cache[key] = runtime.load_library(root / key / build.LIBRARY_NAME)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def ref():
    import test_kernel_gpu  # the sm80 suite's run_case and float64 references

    return test_kernel_gpu


@pytest.fixture(scope="module")
def libs(sm90_build):
    return lambda name, dtype, hd: sm90_build(name, dtype, hd)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_gpu_variant(libs, ref, name, dtype, hd):
    q_offset = 100 if name in ("alibi_doc", "bias2d_pad", "causal") else 0
    ref.run_case(libs, name, dtype, hd, Lq=77, Lk=300, q_offset=q_offset)
    ref.run_case(libs, name, dtype, hd, B=1, Hq=2, Hkv=1, Lq=600, Lk=1000, q_offset=q_offset, seed=1)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 77), (77, 1), (77, 77), (128, 128), (129, 64), (1000, 1000),
                                   (130, 1000), (1000, 130), (256, 81), (300, 2000)])
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("name", ["full", "causal"])
def test_gpu_lengths(libs, ref, name, hd, Lq, Lk):
    ref.run_case(libs, name, torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=Lq, Lk=Lk, q_offset=max(Lk - Lq, 0))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
def test_gpu_gqa_mqa_and_strides(libs, ref, dtype, hd):
    ref.run_case(libs, "causal", dtype, hd, B=3, Hq=8, Hkv=1, Lq=150, Lk=150, layout="blhd")  # MQA, (B,L,H,D)
    ref.run_case(libs, "softcap", dtype, hd, B=2, Hq=6, Hkv=3, Lq=65, Lk=333, layout="blhd")  # GQA


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("q_offset", [-300, -50, 7, 500])
def test_gpu_q_offset(libs, ref, hd, q_offset):
    ref.run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
    ref.run_case(libs, "sliding", torch.float16, hd, Lq=200, Lk=900, q_offset=q_offset)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
@pytest.mark.parametrize("name", ["alibi_doc", "bias2d_pad"])
def test_gpu_fully_masked_rows(libs, ref, name, hd):
    q_offset = 170 if name == "alibi_doc" else 0
    ref.run_case(libs, name, torch.bfloat16, hd, Lq=90, Lk=170, q_offset=q_offset, all_masked=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
def test_gpu_documents_long_and_no_lse(libs, ref, hd):
    ref.run_case(libs, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=2, Lq=1000, Lk=1500, q_offset=500, seed=3)
    ref.run_case(libs, "alibi_doc", torch.float16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=700, q_offset=0, seed=4)
    ref.run_case(libs, "full", torch.float16, hd, Lq=100, Lk=100, return_lse=False, scale=0.3)
    ref.run_case(libs, "softcap", torch.bfloat16, hd, Lq=100, Lk=100, scale=1.0)
    ref.run_case(libs, "full", torch.bfloat16, hd, Lq=100, Lk=100, scale=-0.2)  # negative scale


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("alt", sorted(GPU_ALT))
@pytest.mark.parametrize("hd", GPU_HEAD_DIMS)
def test_gpu_template_paths(sm90_build, ref, alt, hd):
    tiles = GPU_ALT[alt][hd]
    libs_alt = lambda name, dtype, h: sm90_build(name, dtype, h, tiles)  # noqa: E731
    ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=2, Hq=4, Hkv=2, Lq=333, Lk=700, q_offset=367)
    ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=1, Lk=1)
    ref.run_case(libs_alt, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=900, q_offset=100, seed=5)
    if tiles.persistent:
        # more work tiles (2 x 12 x 9 = 216) than an H100/H200 has SMs: CTAs walk several tiles, in snake rounds
        ref.run_case(libs_alt, "causal", torch.bfloat16, hd, B=2, Hq=12, Hkv=4, Lq=1100, Lk=1300, q_offset=200)


@pytest.mark.gpu
@needs_sm90
def test_gpu_empty_kv_and_side_stream(libs, ref):
    ref.check_empty_kv(libs("full", torch.bfloat16, 64))
    ref.check_side_stream(libs("causal", torch.bfloat16, 128))


@pytest.mark.gpu
@needs_sm90
def test_gpu_tma_fallback_code(libs, ref):
    """A layout TMA may refuse (k/v expanded over the batch: stride 0) either runs correctly or returns the
    documented fallback code, never garbage."""
    lib = libs("causal", torch.bfloat16, 128)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 100, 128, generator=g).to(torch.bfloat16).cuda()
    k = torch.randn(1, 2, 150, 128, generator=g).to(torch.bfloat16).cuda().expand(3, -1, -1, -1)
    v = torch.randn(1, 2, 150, 128, generator=g).to(torch.bfloat16).cuda().expand(3, -1, -1, -1)
    try:
        out = runtime.forward(lib, q, k, v, q_offset=50)
    except runtime.KernelLaunchError as e:
        assert f"error {ERR_TMA_LAYOUT}" in str(e) and "sm80" in str(e), str(e)
        return
    torch.cuda.synchronize()
    o_ref, _ = ref.attention("causal", q, k.contiguous(), v.contiguous(), scale=1 / math.sqrt(128), q_offset=50,
                             captured=[], dtype=torch.float64)
    assert (out.double() - o_ref).abs().max().item() < 2e-2


@pytest.mark.nvcc
def test_build_takes_first_ladder_rung_without_spills(tmp_path):
    """The default tiles of a heavy fixture (alibi + document, fp16, hd256) spill; the build moves down
    SM90_LADDER to a rung that does not, and a light variant keeps the default tiles."""
    if not _have_nvcc():
        pytest.skip("needs nvcc")
    from attngen.kernels import build_sm90_ladder

    tiles, spill = build_sm90_ladder(tmp_path / "heavy", fixture_inc("sm90_alibi_document"), torch.float16, 256, "sm_90a")
    assert (tiles, spill) == (LADDER[256][1], 0)
    # the rungs after the first build side by side in subdirectories; the chosen one's library and
    # sources end up in the build directory, and the subdirectories are gone
    lib = runtime.load_library(tmp_path / "heavy" / build.LIBRARY_NAME)  # kernel info only: no GPU needed
    assert (lib.block_k, lib.head_dim) == (LADDER[256][1].block_k, 256)
    assert f"BK {LADDER[256][1].block_k}," in (tmp_path / "heavy" / build.KERNEL_SOURCE).read_text()
    assert not list((tmp_path / "heavy").glob("rung*"))
    tiles, spill = build_sm90_ladder(tmp_path / "light", fixture_inc("causal"), torch.bfloat16, 128, "sm_90a")
    assert (tiles, spill) == (SM90_TILES[128], 0)
    # without a mask the ladder starts at the wide tiles (plain attention on the persistent grid): full
    # keeps them, softcap spills there and drops to the default BK
    assert build.sm90_ladder(128, True, False) == build.sm90_ladder(128, True, True) == LADDER[128]
    pers = lambda t: replace(t, persistent=True)  # noqa: E731
    assert build.sm90_ladder(128, False, True) == (build.SM90_WIDE[128],) + LADDER[128]
    assert build.sm90_ladder(128, False, False) == tuple(map(pers, (build.SM90_WIDE[128],) + LADDER[128]))
    assert build.sm90_ladder(256, False, False) == tuple(map(pers, LADDER[256]))
    tiles, spill = build_sm90_ladder(tmp_path / "full", fixture_inc("full"), torch.bfloat16, 128, "sm_90a",
                                     ladder=build.sm90_ladder(128, False, False))
    assert (tiles, spill) == (pers(build.SM90_WIDE[128]), 0)
    tiles, spill = build_sm90_ladder(tmp_path / "softcap", fixture_inc("softcap"), torch.bfloat16, 128, "sm_90a",
                                     ladder=build.sm90_ladder(128, False, True))
    assert (tiles, spill) == (SM90_TILES[128], 0)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_exp2_poly_matches_exp2(tmp_path):
    """fast_math.cuh's exp2_poly (the FMA-pipe exponential of the POLY_EXP2 option), compiled as host
    C++: relative error <= 1e-4 over the softmax argument range, exactly 0 below -126 and at -inf."""
    # (in [-126, -125) results near 2^-126 lose precision at the denormal boundary: weights that small
    # are below any fp32 row sum's resolution)
    hdr = Path(build.TEMPLATE_DIR) / "fast_math.cuh"
    (tmp_path / "t.cpp").write_text(f'#include "{hdr}"\n' + r'''
#include <stdio.h>
int main() {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    float x = -125.f + 133.f * (float)i / 2000000.f;  // [-125, 8]
    double rel = fabs((double)attngen::exp2_poly(x) / exp2((double)x) - 1.0);
    if (rel > worst) worst = rel;
  }
  printf("%.3e %g %g %g\n", worst, attngen::exp2_poly(-126.5f), attngen::exp2_poly(-1e30f),
         attngen::exp2_poly(-INFINITY));
  return 0;
}
''')
    exe = tmp_path / "t"
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", str(exe), str(tmp_path / "t.cpp"), "-lm"], check=True)
    worst, a, b, c = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert float(worst) <= 1e-4, worst
    assert float(a) == float(b) == float(c) == 0.0
