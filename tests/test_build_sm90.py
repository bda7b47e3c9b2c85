"""The sm90 (Hopper) kernel template, attngen/templates/fwd_sm90.cuh (rendered through attngen_fwd.cu.j2).

CPU part (needs nvcc, no GPU): render the template around fixture variant.inc files and really compile
them for sm_90a in one ninja run (-j2), then check what ptxas reports (registers, spills, no wgmma
serialization) and, where cuobjdump + nvdisasm are installed, the SASS itself (HGMMA with the transposed
V operand, TMA loads, setmaxnreg, no local memory). The host side of the C ABI is exercised by loading
the libraries (no GPU needed).

The GPU part (the kernel correctness suite against sm90 libraries) is tests/gpu/test_kernel_sm90.py; the
build-set helpers both use are in tests/helpers.py.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest
import torch

from attngen.jit import ninja, render, tiles
from attngen import launch
from helpers import ERR_NO_TMA_ENCODER, ERR_TMA_LAYOUT, fixture_inc
from sm90_builds import LADDER, SM90_TILES, render_sm90, sm90_key, sm90_sources

SMEM_LIMIT = 232448  # opt-in shared memory per block on sm90


def _sass_tools(nvcc: str) -> Optional[str]:
    """cuobjdump, with nvdisasm reachable (cuobjdump --dump-sass runs it): next to nvcc, on PATH, or from the
    nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels. None if either is missing."""
    dirs = [str(Path(nvcc).parent)]
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
    cu = src[render.KERNEL_SOURCE]
    cfg = SM90_TILES[hd]
    assert f"constexpr int D = {hd};" in cu and "constexpr int BQ = 128;" in cu
    assert f"constexpr int BK = {cfg.block_k};" in cu and f"constexpr int STAGES = {cfg.stages};" in cu
    assert "constexpr bool PINGPONG = true;" in cu and "constexpr bool OVERLAP = true;" in cu
    assert "constexpr bool PERSISTENT = false;" in cu
    assert ("using Elem = __nv_bfloat16;" if dtype == torch.bfloat16 else "using Elem = __half;") in cu
    assert '#include "variant.inc"' in cu and "{{" not in cu and "{%" not in cu
    seen, todo = set(), [render.KERNEL_SOURCE]  # every local include resolves among the rendered files
    src = render_sm90(fixture_inc("causal"), dtype, hd)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            assert name in src, f"{name} is included but not rendered"
            todo += re.findall(r'^\s*#\s*include\s+"([^"]+)"', src[name], re.M)
    assert {"fwd_sm90.cuh", "sm90_wgmma.cuh", "host_abi.cuh", "variant.inc"} <= seen
    off = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, overlap=False, pingpong=False, persistent=True))
    assert "constexpr bool PERSISTENT = true;" in off[render.KERNEL_SOURCE]
    assert "constexpr bool PINGPONG = false;" in off[render.KERNEL_SOURCE]
    assert "constexpr bool OVERLAP = false;" in off[render.KERNEL_SOURCE]
    assert "constexpr bool PIN_SOFTMAX = false;" in off[render.KERNEL_SOURCE]
    pinned = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, pin_softmax=True))
    assert "constexpr bool PIN_SOFTMAX = true;" in pinned[render.KERNEL_SOURCE]
    assert "constexpr bool CROSS_TILE = false;" in cu  # off by default (tiles.py says why)
    cross = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, persistent=True, cross_tile=True))
    assert "constexpr bool CROSS_TILE = true;" in cross[render.KERNEL_SOURCE]
    assert "constexpr bool REL_STAGE = true;" in cu  # relative score mods' terms staged per warp by default
    assert "constexpr bool O_STAGED = true;" in cu  # O stored with TMA from the tile's Q buffer by default
    regs = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, o_staged=False))
    assert "constexpr bool O_STAGED = false;" in regs[render.KERNEL_SOURCE]
    walk = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, rel_stage=False))
    assert "constexpr bool REL_STAGE = false;" in walk[render.KERNEL_SOURCE]
    for pdl in (False, True):  # launched as a programmatic dependent (pdl.cuh)
        cu_pdl = render_sm90(fixture_inc("causal"), dtype, hd, replace(cfg, pdl=pdl))[render.KERNEL_SOURCE]
        assert f"constexpr bool PDL = {'true' if pdl else 'false'};" in cu_pdl


def test_render_needs_every_parameter():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render._jinja_env(str(render.TEMPLATE_DIR)).get_template(render.KERNEL_TEMPLATE).render(head_dim=128, kernel="sm90")


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
    ("causal", torch.bfloat16, 128, replace(SM90_TILES[128], pingpong=False, pin_softmax=True)),
]


@pytest.fixture(scope="module")
def compiled(requires_nvcc, tmp_path_factory):  # requires_nvcc: every test using it is in the nvcc lane
    root = tmp_path_factory.mktemp("attngen_sm90")
    sources = sm90_sources(COMPILE_SET)
    ninja.write_build_ninja(root, sources, "sm_90a", ["-Xptxas", "-v"])
    output = ninja.run_ninja(root, jobs=2)
    return root, output


def _ptxas_report(output: str) -> dict:
    """{object directory: [registers, spill store bytes, spill load bytes, stack bytes]} from ninja output."""
    report, cur = {}, None
    for line in output.splitlines():
        m = re.search(r"NVCC (\S+)/(\w+)\.o", line)
        if m:  # the forward kernel's object; the KV-cache unit beside it (DECODE_SOURCE) is not reported here
            cur = m.group(1) if m.group(2) == render.KERNEL_SOURCE[:-3] else None
            if cur is not None:
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


def test_ptxas_registers_and_no_spills(compiled):
    root, output = compiled
    report = _ptxas_report(output)
    expected = {sm90_key(*c) for c in COMPILE_SET}
    assert set(report) == expected, f"missing ptxas reports: {expected - set(report)}"
    print("\nptxas (sm_90a; 'registers' is the entry cap of __launch_bounds__(384, 1): setmaxnreg then gives the "
          "consumers 240 and the producer 24):")
    for key, (regs, st, ld, stack) in sorted(report.items()):
        print(f"  {key:48s} {regs} registers, {stack} B stack, {st} B spill stores, {ld} B spill loads")
    for key, (regs, st, ld, stack) in report.items():
        assert regs == 168, f"{key}: expected the 168-register entry cap of 384 threads, got {regs}"
        assert st == 0 and ld == 0 and stack == 0, f"{key}: spills ({st} B stores, {ld} B loads, {stack} B stack)"


def test_no_wgmma_serialization_or_setmaxnreg_warnings(compiled):
    _, output = compiled
    # ptxas warns when it has to serialize the wgmma pipeline (a register of an in-flight wgmma touched)
    # or ignores setmaxnreg (no register cap at entry).
    assert "serialized" not in output, output
    assert "setmaxnreg" not in output.lower(), output
    assert "warning" not in output.lower(), output


def test_sass(compiled, nvcc_path):
    cuobjdump = _sass_tools(nvcc_path)
    if cuobjdump is None:
        pytest.skip("needs cuobjdump and nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    root, _ = compiled
    for name, dtype, hd, tiles in COMPILE_SET:
        t = tiles or SM90_TILES[hd]
        obj = root / sm90_key(name, dtype, hd, tiles) / "attngen_fwd.o"
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
        if t.pin_softmax:  # the softmax's ex2s between the wait for S(next) and the wait for P V
            after_s = sass.split("WARPGROUP.DEPBAR.LE gsb0, 0x1", 1)[1]
            assert "MUFU.EX2" in after_s.split("WARPGROUP.DEPBAR.LE gsb0, 0x0", 1)[0], f"{obj}: softmax not pinned"
        local = [l for l in sass.splitlines() if re.search(r"\b(LDL|STL)\b", l)]
        assert not local, f"{obj}: local memory in the SASS:\n" + "\n".join(local[:10])
        assert not re.search(r"\bHMMA\b", sass), "mma.sync in the sm90 kernel: wgmma path not taken"


# --------------------------------------------------------------------------------------------------
# host side of the C ABI (no GPU needed to load a library)


def test_kernel_info_and_abi(compiled):
    root, _ = compiled
    for name, dtype, hd, tiles in COMPILE_SET:
        t = tiles or SM90_TILES[hd]
        path = root / sm90_key(name, dtype, hd, tiles) / ninja.LIBRARY_NAME
        lib = launch.load_library(path)
        assert (lib.head_dim, lib.dtype, lib.block_q, lib.block_k) == (hd, dtype, 128, t.block_k)
        assert lib.num_threads == 384 and lib.arch == 90 and lib.smem_bytes == t.smem_bytes(hd)
        assert lib.error_string(0) == "no error"
        assert "sm80" in lib.error_string(ERR_TMA_LAYOUT) and "TMA" in lib.error_string(ERR_TMA_LAYOUT)
        assert "cuTensorMapEncodeTiled" in lib.error_string(ERR_NO_TMA_ENCODER)


def _packed_args(q=16, k=16, v=16, o=16, B=1, Hq=2, Hkv=1, Lq=8, Lk=8, D=128, strides=None):
    st = strides or [Hq * Lq * D, Lq * D, D] * 4
    return launch._PACK.pack(q, k, v, o, 0, *st, B, Hq, Hkv, Lq, Lk, D, 0.1, 0, *([0] * (8 + 32 + launch.MAX_SUMMARIES)), *launch._NO_PARAMS, 0)


def test_attngen_fwd_argument_checks_without_gpu(compiled):
    root, _ = compiled
    lib = launch.load_library(root / sm90_key("causal", torch.bfloat16, 128, None) / ninja.LIBRARY_NAME)
    assert lib.launch(_packed_args(B=0), 0) == 0                         # nothing to do: no CUDA call at all
    assert lib.launch(_packed_args(D=64), 0) == 1                        # cudaErrorInvalidValue
    assert lib.launch(_packed_args(Hq=3, Hkv=2), 0) == 1
    assert lib.launch(_packed_args(q=24), 0) == 716                      # cudaErrorMisalignedAddress
    assert lib.launch(_packed_args(strides=[2 * 8 * 128, 8 * 128, 132] + [2 * 8 * 128, 8 * 128, 128] * 3), 0) == 716
    if ctypes.util.find_library("cuda") is None and not torch.cuda.is_available():
        # no driver: the launch stops at making the device current (before any driver call), with CUDA's own
        # error (insufficient driver, or no device), which nothing can fall back from
        assert lib.launch(_packed_args(), 0) in (35, 100)


def test_library_exports_only_the_abi(compiled):
    if shutil.which("nm") is None or shutil.which("readelf") is None:
        pytest.skip("needs binutils")
    root, _ = compiled
    path = root / sm90_key("causal", torch.bfloat16, 128, None) / ninja.LIBRARY_NAME
    syms = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert {s for s in syms if s.startswith("attngen")} == {"attngen_fwd", "attngen_abi_version",
                                                           "attngen_kernel_info", "attngen_error_string",
                                                           "attngen_decode", "attngen_decode_kernel_info",
                                                           "attngen_decode_heads_per_cta"}  # + the KV-cache unit
    assert not any("tma_encode" in s or s.startswith("cuda") for s in syms)
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    assert not any(n.startswith(("libcuda.so", "libcudart.so")) for n in needed), needed




def test_gpu_suite_helpers_are_importable():
    """The sm90 GPU suite (tests/gpu/test_kernel_sm90.py) reuses the sm80 suite's checked call; fail here (on CPU
    CI) if it moved."""
    import kernel_suite as g

    assert callable(g.run_case) and callable(g.fixture_mods) and callable(g.make_captured)
    assert callable(g.check_side_stream) and callable(g.check_empty_kv)


@pytest.mark.requires_nvcc
def test_build_takes_first_ladder_rung_without_spills(tmp_path):
    """The default tiles of a heavy fixture (alibi + document, fp16, hd256) spill; the build moves down
    SM90_LADDER to a rung that does not, and a light variant keeps the default tiles."""
    from attngen.jit.spec import build_first_without_spills as build_sm90_ladder

    chosen, spill = build_sm90_ladder(tmp_path / "heavy", fixture_inc("sm90_alibi_document"), torch.float16, 256, "sm_90a",
                                    LADDER[256])
    assert (chosen, spill) == (LADDER[256][1], 0)
    # the rungs after the first build side by side in subdirectories; the chosen one's library and
    # sources end up in the build directory, and the subdirectories are gone
    lib = launch.load_library(tmp_path / "heavy" / ninja.LIBRARY_NAME)  # kernel info only: no GPU needed
    assert (lib.block_k, lib.head_dim) == (LADDER[256][1].block_k, 256)
    assert f"BK {LADDER[256][1].block_k}," in (tmp_path / "heavy" / render.KERNEL_SOURCE).read_text()
    assert not list((tmp_path / "heavy").glob("rung*"))
    chosen, spill = build_sm90_ladder(tmp_path / "light", fixture_inc("causal"), torch.bfloat16, 128, "sm_90a", LADDER[128])
    assert (chosen, spill) == (SM90_TILES[128], 0)
    # without a mask the ladder starts at the wide tiles (plain attention on the persistent grid): full
    # keeps them, softcap spills there and drops to the default BK
    # masked variants: the same rungs, on the persistent grid at every kv length
    pers = lambda t: replace(t, persistent=True)  # noqa: E731
    assert tiles.sm90_ladder(128, True, False) == tiles.sm90_ladder(128, True, True) == tuple(map(pers, LADDER[128]))
    assert tiles.sm90_ladder(128, False, True) == (tiles.SM90_WIDE[128],) + LADDER[128]
    assert tiles.sm90_ladder(128, False, False) == tuple(map(pers, (tiles.SM90_WIDE[128],) + LADDER[128]))
    assert tiles.sm90_ladder(256, False, False) == tuple(map(pers, LADDER[256]))
    chosen, spill = build_sm90_ladder(tmp_path / "full", fixture_inc("full"), torch.bfloat16, 128, "sm_90a",
                                     tiles.sm90_ladder(128, False, False))
    assert (chosen, spill) == (pers(tiles.SM90_WIDE[128]), 0)
    chosen, spill = build_sm90_ladder(tmp_path / "softcap", fixture_inc("softcap"), torch.bfloat16, 128, "sm_90a",
                                     tiles.sm90_ladder(128, False, True))
    assert (chosen, spill) == (SM90_TILES[128], 0)


def test_cross_tile_only_first_in_half_plane_mask_ladders_at_head_dim_64():
    """cross_tile leads the ladder of half-plane masks (causal-like) without a score_mod at head dim 64 (where it
    was measured faster), as a twin of the shipped first rung; every other ladder has none."""
    pers = lambda t: replace(t, persistent=True)  # noqa: E731
    masked = tuple(map(pers, LADDER[64]))
    assert tiles.sm90_ladder(64, True, False, half_plane=True) == (replace(masked[0], cross_tile=True),) + masked
    assert tiles.sm90_ladder(64, True, True, half_plane=True) == tiles.sm90_ladder(64, True, False) == masked
    for hd in (64, 128, 256):
        for has_mask, has_score_mod in ((False, False), (False, True), (True, True), (True, False)):
            for half_plane in (False, True):
                if (hd, has_mask, has_score_mod, half_plane) != (64, True, False, True):
                    assert not any(t.cross_tile for t in tiles.sm90_ladder(hd, has_mask, has_score_mod, half_plane))


@pytest.mark.parametrize("kwargs, half_plane", [
    (dict(causal=True), True), (dict(mask_mod="local(100, None)"), True), (dict(mask_mod="local(None, 5)"), True),
    (dict(causal=True, softcap=30.0), True), (dict(window=1024), False), (dict(mask_mod="dilated(1024, 2)"), False),
    (dict(mask_mod="prefix_lm(64)"), False), (dict(), False),
    (dict(mask_mod=lambda b, h, q, kv: q * q >= kv), False), (dict(mask_mod=lambda b, h, q, kv: q // 2 >= kv), False),
    (dict(mask_mod=lambda b, h, q, kv: kv <= h), False),
], ids=["causal", "local-left", "local-right", "softcap-causal", "window", "dilated", "prefix", "full", "square",
        "floordiv", "head"])
def test_half_plane_masks(kwargs, half_plane):
    """facts.half_plane, which puts cross_tile in the ladder: one inequality linear in q_idx, kv_idx and the
    runtime parameters, nothing else."""
    import attngen
    from attngen.specs import parse_variant

    if isinstance(kwargs.get("mask_mod"), str):
        kwargs = dict(kwargs, mask_mod=parse_variant(kwargs["mask_mod"]).mask_mod)
    assert attngen.compile(**kwargs).facts.half_plane is half_plane


SERIALIZED = ("ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
              "program dependence on compiler-inserted WG.AR in divergent path in the function '_ZN4_GLOBAL_18attngen_"
              "fwd_kernelE14AttngenFwdArgs'\n")


def _fake_ptxas_output(spill: int, serialized: bool) -> str:
    """The lines of a `-Xptxas -v` report the ladder reads, for the forward kernel."""
    return (SERIALIZED if serialized else "") + (
        "ptxas info    : Function properties for _ZN4_GLOBAL_18attngen_fwd_kernelE14AttngenFwdArgs\n"
        f"    0 bytes stack frame, {spill // 2} bytes spill stores, {spill - spill // 2} bytes spill loads\n")


def test_ptxas_serialized_wgmma_is_read_per_kernel():
    assert ninja.ptxas_serialized_wgmma(SERIALIZED) and ninja.ptxas_serialized_wgmma(SERIALIZED, "attngen_fwd_kernel")
    assert not ninja.ptxas_serialized_wgmma(SERIALIZED, "attngen_decode_kernel")
    assert not ninja.ptxas_serialized_wgmma(_fake_ptxas_output(0, False))


@pytest.mark.parametrize("reports, chosen, built", [
    # (spill bytes, serialized) per rung: cross rung, its plain twin, a lighter rung
    (((0, False), (0, False), (0, False)), 0, {0}),
    (((0, True), (0, False), (0, False)), 1, {0, 1, 2}),   # serialized wgmmas: not clean
    (((16, False), (0, True), (0, False)), 2, {0, 1, 2}),
    (((4, False), (20, False), (30, False)), 1, {0, 1, 2}),  # a cross rung only when clean
    (((20, False), (20, False), (8, True)), 1, {0, 1, 2}),   # unserialized first, then fewest spills
], ids=["cross-clean", "cross-serialized", "third", "cross-spills-least", "serialized-last"])
def test_ladder_takes_the_first_clean_rung(monkeypatch, tmp_path, reports, chosen, built):
    """build_first_without_spills on fake ptxas reports: the first rung builds alone, the rest only when it fails;
    the chosen rung's files end up in the build directory."""
    from attngen.jit import spec

    ladder = (replace(SM90_TILES[64], persistent=True, cross_tile=True), replace(SM90_TILES[64], persistent=True),
              LADDER[64][1])
    ran = []

    def write_build_ninja(d, sources, arch, flags, library):
        d.mkdir(parents=True, exist_ok=True)
        (d / "rung.txt").write_text(str(sources))

    def run_ninja(d):
        n = [str(t) for t in ladder].index((d / "rung.txt").read_text())
        ran.append(n)
        return _fake_ptxas_output(*reports[n])

    monkeypatch.setattr(spec, "render_sources", lambda *a, tiles, kernel: tiles)
    monkeypatch.setattr(spec, "write_build_ninja", write_build_ninja)
    monkeypatch.setattr(spec, "run_ninja", run_ninja)
    got = spec.build_first_without_spills(tmp_path, "", torch.bfloat16, 64, "sm_90a", ladder)
    assert got == (ladder[chosen], reports[chosen][0])
    assert set(ran) == built and len(ran) == len(built)
    assert (tmp_path / "rung.txt").read_text() == repr(ladder[chosen])
    assert not list(tmp_path.glob("rung*/"))


def test_relative_loads_clamped_with_a_linear_bias(nvcc_path, tmp_path):
    """score_tile_rel with a captured table read at d = q - kv in a(d) and a bias linear in d (SCORE_REL_LOADS and
    SCORE_REL_LINEAR): b is stepped from b(d0), which must come from the same d-clamped score_rel call as the
    others. Taken from an unclamped call, the table read at d0 (up to 8 rows past the last row's d) stays in the
    PTX (an __ldg is volatile): the kernel's PTX then holds more table reads than with LINEAR off."""
    import attngen
    from attngen.codegen import render_variant_inc

    table = torch.linspace(0.5, 1.5, 511)

    def rel(s, b, h, q, kv):
        return s * table[q - kv + 255] + 0.01 * (kv - q)

    attn = attngen.compile(score_mod=rel, causal=True)
    inc = render_variant_inc(attn.traced, attn.predicates)
    assert "#define ATTNGEN_SCORE_REL_LOADS 1" in inc and "#define ATTNGEN_SCORE_REL_LINEAR 1" in inc
    loads = {}
    for linear in (1, 0):
        d = tmp_path / f"linear{linear}"
        d.mkdir()
        # each thread's own walk in both (rel_stage would stage the terms of the non-linear one in shared memory)
        srcs = render.render_sources(inc.replace("#define ATTNGEN_SCORE_REL_LINEAR 1",
                                                 f"#define ATTNGEN_SCORE_REL_LINEAR {linear}"),
                                     torch.bfloat16, 64, "sm_90a", tiles=replace(SM90_TILES[64], rel_stage=False),
                                     kernel="sm90")
        for name, text in srcs.items():
            (d / name).write_text(text)
        ptx = subprocess.run([nvcc_path, "-ptx", "-arch=sm_90a", "-std=c++17", "-O3", "-o", "-",
                              str(d / render.KERNEL_SOURCE)], capture_output=True, text=True)
        assert ptx.returncode == 0, ptx.stderr[-2000:]
        loads[linear] = ptx.stdout.count("ld.global.nc")
    assert loads[1] == loads[0] > 0, loads


@pytest.mark.requires_nvcc
def test_relative_terms_staged_per_warp_without_spills(nvcc_path, tmp_path):
    """A table read at q - kv (s + table[h, q - kv + L - 1]): its staged terms (Sm90Tiles.rel_stage, the default)
    build without spills on the first rung of the forward's ladder at head dim 128 (each thread's own walk spilled
    there), in the shared memory the tiles account for (b alone per diagonal: 4-byte slots); the PTX reads the table
    once per slot a lane stages (5 per kv tile) instead of once per diagonal of each thread (34)."""
    import attngen
    from attngen.jit.spec import build_first_without_spills

    table = torch.randn(16, 2 * 8192 - 1)

    def relpos(s, b, h, q, kv):
        return s + table[h, q - kv + 8191]

    attn = attngen.compile(score_mod=relpos)
    spec = attn.spec(torch.bfloat16, 128, "sm_90a", "sm90")
    first = spec.tile_choices()[0]
    assert first.rel_stage
    inc = spec.variant_inc()
    assert "#define ATTNGEN_SCORE_REL_A_CONST 1" in inc and "#define ATTNGEN_SCORE_REL_LINEAR 0" in inc
    chosen, spill = build_first_without_spills(tmp_path / "staged", inc, torch.bfloat16, 128, "sm_90a", (first,))
    assert (chosen, spill) == (first, 0)
    lib = launch.load_library(tmp_path / "staged" / ninja.LIBRARY_NAME)  # kernel info only: no GPU needed
    assert lib.smem_bytes == first.smem_bytes(128, staged_rel=4) > first.smem_bytes(128)
    loads = {}
    for staged in (True, False):
        d = tmp_path / f"ptx{int(staged)}"
        d.mkdir()
        tiles = replace(first, rel_stage=staged)
        for name, text in render.render_sources(inc, torch.bfloat16, 128, "sm_90a", tiles=tiles, kernel="sm90").items():
            (d / name).write_text(text)
        ptx = subprocess.run([nvcc_path, "-ptx", "-arch=sm_90a", "-std=c++17", "-O3", "-o", "-",
                              str(d / render.KERNEL_SOURCE)], capture_output=True, text=True)
        assert ptx.returncode == 0, ptx.stderr[-2000:]
        assert ptx.stdout.count(".entry") == 1  # the attention kernel alone
        loads[staged] = (ptx.stdout.count("ld.global.nc"), ptx.stdout.count("st.shared.f32"))
    assert loads[True][1] > 0 == loads[False][1] and 0 < loads[True][0] < loads[False][0], loads


@pytest.mark.requires_nvcc
def test_o_staged_for_a_tma_store_where_it_applies(nvcc_path, tmp_path):
    """Sm90Tiles.o_staged (the default): the epilogue stages O with stmatrix in the tile's Q buffer and one thread per
    consumer stores it with a 4-d TMA store, on the persistent grid (two Q buffers: the buffer handed back after the
    next tile's first Q K^T; one Q buffer, BK 176: at once) and with one CTA per work tile. O from registers (no
    stmatrix, no TMA store) where it is off, and with cross_tile (the epilogue under the next tile's Q K^T)."""
    cases = {"persistent": ("causal", replace(SM90_TILES[128], persistent=True), True),
             "one_q_buffer": ("full", replace(tiles.SM90_WIDE[128], persistent=True), True),
             "one_cta_per_tile": ("softcap", SM90_TILES[128], True),
             "off": ("causal", replace(SM90_TILES[128], persistent=True, o_staged=False), False),
             "cross_tile": ("causal", replace(SM90_TILES[64], persistent=True, cross_tile=True), False)}
    for name, (fixture, t, staged) in cases.items():
        d = tmp_path / name
        d.mkdir()
        hd = 64 if t.cross_tile else 128
        for f, text in render_sm90(fixture_inc(fixture), torch.bfloat16, hd, t).items():
            (d / f).write_text(text)
        ptx = subprocess.run([nvcc_path, "-ptx", "-arch=sm_90a", "-std=c++17", "-O3", "-o", "-",
                              str(d / render.KERNEL_SOURCE)], capture_output=True, text=True)
        assert ptx.returncode == 0, ptx.stderr[-2000:]
        stores = ptx.stdout.count("cp.async.bulk.tensor.4d.global.shared::cta")
        assert (ptx.stdout.count("stmatrix.sync.aligned.m8n8.x4") > 0) == staged, name
        assert (stores > 0) == staged, name
        # every store complete before the CTA exits; on the persistent grid, its reads before the buffer goes back
        if staged:
            assert "cp.async.bulk.wait_group 0" in ptx.stdout, name
            assert ("cp.async.bulk.wait_group.read 0" in ptx.stdout) == t.persistent, name


@pytest.mark.requires_nvcc
def test_union_mask_forward_builds_clean_on_its_first_rung(tmp_path):
    """A union mask (prefix-LM: causal or a prefix, two kv parts) orders its work tiles at run time: thread 0 writes
    the order to shared memory before the roles split and the producer reads it once per work tile (fwd_sm90.cuh
    ascending_order). Computed in the producer, its two walk estimates stayed live through the first announce and
    spilled from its 24 registers, so the build tried every rung of the ladder (all spilling) before taking the
    first."""
    import attngen
    from attngen.jit.spec import build_first_without_spills

    attn = attngen.compile(mask_mod=attngen.variants.prefix_lm(2048))
    spec = attn.spec(torch.bfloat16, 128, "sm_90a", "sm90")
    ladder = spec.tile_choices()
    inc = spec.variant_inc()
    assert "#define ATTNGEN_KV_PARTS 2" in inc
    chosen, spill = build_first_without_spills(tmp_path, inc, torch.bfloat16, 128, "sm_90a", ladder)
    assert (chosen, spill) == (ladder[0], 0)
