"""Build stage tests (CPU only): template rendering, nvcc discovery, build.ninja, and real nvcc
compiles of fixture variants for sm_80 and sm_90a (one ninja run, -j2), with a ptxas spill check.
Also the host side of the C ABI (loading a library needs no GPU)."""
from __future__ import annotations

import ctypes
import importlib
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attngen.jit import ninja, render, tiles, toolchain
from attngen import abi, launch
from attngen.errors import BuildError, InputError
from helpers import add_library, fixture_inc

FIXTURES = ("full", "causal", "softcap", "sliding", "alibi_doc", "bias2d_pad")
_REAL_PIP_CANDIDATES = toolchain._pip_nvcc_candidates


# --------------------------------------------------------------------------------------------------
# architectures and tiles


def test_arch_flags():
    assert toolchain.arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert toolchain.arch_flags("sm_80") == ["-gencode=arch=compute_80,code=sm_80"]
    assert toolchain.arch_flags("sm_86") == ["-gencode=arch=compute_86,code=sm_86"]
    with pytest.raises(BuildError, match="sm_90a"):
        toolchain.arch_flags("90")


@pytest.mark.parametrize("cap,arch", [((9, 0), "sm_90a"), ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((12, 0), "sm_120")])
def test_current_arch(monkeypatch, cap, arch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    assert toolchain.current_arch() == arch


def test_current_arch_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BuildError, match="arch="):
        toolchain.current_arch()


@pytest.mark.parametrize("arch,limit", [("sm_80", 166912), ("sm_86", 101376), ("sm_89", 101376),
                                        ("sm_90a", 232448), ("sm_120", 101376)])
def test_tiles_fit_shared_memory(arch, limit):
    for hd in abi.SUPPORTED_HEAD_DIMS:
        cfg = tiles.tile_config(hd, arch)
        assert cfg.smem_bytes(hd) <= limit
        assert cfg.block_q % (16 * cfg.num_warps) == 0 and cfg.block_k % 16 == 0
    with pytest.raises(BuildError, match="64, 128, 256"):
        tiles.tile_config(96, arch)


# --------------------------------------------------------------------------------------------------
# rendering


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd", abi.SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("name", FIXTURES)
def test_render_sources(name, dtype, hd):
    inc = fixture_inc(name)
    src = render.render_sources(inc, dtype, hd, "sm_90a")
    assert set(src) == {render.KERNEL_SOURCE, render.DECODE_SOURCE, render.VARIANT_INCLUDE, *render.headers()}
    assert src[render.VARIANT_INCLUDE] == inc
    cu = src[render.KERNEL_SOURCE]
    cfg = tiles.tile_config(hd, "sm_90a")
    assert f"constexpr int D = {hd};" in cu
    assert f"constexpr int BQ = {cfg.block_q};" in cu and f"constexpr int BK = {cfg.block_k};" in cu
    assert f"constexpr int NWARPS = {cfg.num_warps};" in cu
    assert ("using Elem = __nv_bfloat16;" if dtype == torch.bfloat16 else "using Elem = __half;") in cu
    assert '#include "variant.inc"' in cu
    assert "{{" not in cu and "{%" not in cu and "}}" not in cu.replace("}}  //", "")


@pytest.mark.parametrize("build_set", ["sm80 suite sm_90a", "sm80 suite sm_80", "sm90 suite"])
def test_gpu_suite_build_sets_compile_every_unit_beside_its_variant(build_set):
    # the GPU suites build many libraries in one ninja graph; a unit left at the top (the KV-cache unit was, in the
    # sm80 suite) fails there on its missing variant.inc, and only on a GPU machine
    from kernel_suite import suite_sources
    from sm90_builds import sm90_sources

    if build_set == "sm90 suite":
        sources = sm90_sources([(n, torch.bfloat16, 128, None) for n in ("causal", "full")])
    else:
        sources = suite_sources(build_set.split()[-1])
    units = [n for n in sources if n.endswith(".cu")]
    assert len({n.rsplit("/", 1)[0] for n in units}) == len(units) // 2  # a kernel and a KV-cache unit each
    for n in units:
        assert "/" in n and f"{n.rsplit('/', 1)[0]}/{render.VARIANT_INCLUDE}" in sources, n


def test_render_rejects_bad_inputs():
    with pytest.raises(BuildError, match="bfloat16"):
        render.render_sources(fixture_inc("full"), torch.float32, 64, "sm_90a")
    with pytest.raises(BuildError, match="64, 128, 256"):
        render.render_sources(fixture_inc("full"), torch.bfloat16, 80, "sm_90a")
    assert render.render_sources(fixture_inc("full"), "bf16", 64, "sm_80")[render.KERNEL_SOURCE] == \
        render.render_sources(fixture_inc("full"), torch.bfloat16, 64, "sm_80")[render.KERNEL_SOURCE]


def test_template_hash(tmp_path, monkeypatch):
    h = render.template_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", h) and h == render.template_hash()
    copy = tmp_path / "templates"
    shutil.copytree(render.TEMPLATE_DIR, copy)
    assert render.template_hash(copy) == h
    (copy / "sm80_copy.cuh").write_text((copy / "sm80_copy.cuh").read_text() + "\n// changed\n")
    render.template_hash.cache_clear()  # memoised per process: templates do not change under a running program
    assert render.template_hash(copy) != h


# --------------------------------------------------------------------------------------------------
# nvcc discovery


def _fake_nvcc(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_nvcc_anywhere(monkeypatch, tmp_path):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for var in ("CUDA_HOME", "CUDA_PATH", "ATTNGEN_NVCC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(toolchain, "_pip_nvcc_candidates", lambda: [])


def test_nvcc_missing_says_how_to_get_one(no_nvcc_anywhere, tmp_path):
    with pytest.raises(BuildError) as e:
        toolchain.find_nvcc()
    msg = str(e.value)
    assert "pip install attngen[jit]" in msg and "CUDA_HOME" in msg and "nvcc" in msg
    with pytest.raises(BuildError, match=r"attngen\[jit\]"):
        ninja.write_build_ninja(tmp_path / "b", render.render_sources(fixture_inc("full"), "bf16", 64, "sm_80"),
                                "sm_80")


def test_find_nvcc_from_cuda_home(no_nvcc_anywhere, monkeypatch, tmp_path):
    nvcc = _fake_nvcc(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert toolchain.find_nvcc() == str(nvcc)
    assert toolchain.nvcc_version(str(nvcc)) == (12, 4)


def test_find_nvcc_from_pip_package(no_nvcc_anywhere, monkeypatch, tmp_path):
    # the nvidia-cuda-nvcc wheel layout: <site>/nvidia/cu13/bin/nvcc inside the `nvidia` namespace package
    site = tmp_path / "site"
    nvcc = _fake_nvcc(site / "nvidia" / "cu13" / "bin" / "nvcc")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    importlib.invalidate_caches()
    monkeypatch.setattr(toolchain, "_pip_nvcc_candidates", _REAL_PIP_CANDIDATES)
    assert toolchain.find_nvcc() == str(nvcc)


@pytest.mark.requires_nvcc
def test_nvcc_version_real():
    major, minor = toolchain.nvcc_version()
    assert (major, minor) >= (12, 0)


# --------------------------------------------------------------------------------------------------
# build.ninja


@pytest.mark.requires_nvcc  # writes nvcc's path into build.ninja
def test_write_build_ninja(tmp_path):
    src = render.render_sources(fixture_inc("causal"), torch.bfloat16, 64, "sm_90a")
    libs = ninja.write_build_ninja(tmp_path, src, "sm_90a", ["-Xptxas", "-v"])
    assert libs == [str(tmp_path.resolve() / ninja.LIBRARY_NAME)]
    text = (tmp_path / "build.ninja").read_text()
    for flag in ("-O3", "-std=c++17", "-Xcompiler -fPIC", "-shared", "-gencode=arch=compute_90a,code=sm_90a",
                 "-cudart static", "-Xptxas -v", "deps = gcc"):
        assert flag in text, flag
    assert "-lcuda" not in text and "-arch=" not in text
    for name, body in src.items():
        assert (tmp_path / name).read_text() == body
    # unchanged sources keep their mtime (ninja rebuilds only what changed)
    before = (tmp_path / render.KERNEL_SOURCE).stat().st_mtime_ns
    ninja.write_build_ninja(tmp_path, src, "sm_90a", ["-Xptxas", "-v"])
    assert (tmp_path / render.KERNEL_SOURCE).stat().st_mtime_ns == before


# --------------------------------------------------------------------------------------------------
# real compiles: one ninja over a representative set, both archs

# (fixture, dtype, head dim, arch)
COMPILE_SET = [
    *[("causal", torch.bfloat16, hd, "sm_90a") for hd in (64, 128, 256)],
    ("full", torch.float16, 128, "sm_90a"),
    ("softcap", torch.float16, 64, "sm_90a"),
    ("sliding", torch.bfloat16, 128, "sm_90a"),
    ("alibi_doc", torch.float16, 128, "sm_90a"),
    ("bias2d_pad", torch.bfloat16, 128, "sm_90a"),
    *[("causal", torch.bfloat16, hd, "sm_80") for hd in (64, 128, 256)],
    ("alibi_doc", torch.float16, 256, "sm_80"),
    ("bias2d_pad", torch.float16, 64, "sm_80"),
]


def _subdir(name, dtype, hd, arch):
    return f"{arch}/{name}_{str(dtype).replace('torch.', '')}_{hd}"


@pytest.fixture(scope="module")
def compiled(requires_nvcc, tmp_path_factory):  # requires_nvcc: every test using it is in the nvcc lane
    root = tmp_path_factory.mktemp("attngen_build")
    outputs, libs = {}, {}
    # One build.ninja per arch (the arch is a build-wide flag), each run with -j2.
    for arch in ("sm_90a", "sm_80"):
        sources = {}
        for name, dtype, hd, a in COMPILE_SET:
            if a != arch:
                continue
            sub = _subdir(name, dtype, hd, arch).split("/", 1)[1]
            add_library(sources, sub, render.render_sources(fixture_inc(name), dtype, hd, arch))
        ninja.write_build_ninja(root / arch, sources, arch, ["-Xptxas", "-v"])
        outputs[arch] = ninja.run_ninja(root / arch, jobs=2)
        for name, dtype, hd, a in COMPILE_SET:
            if a == arch:
                libs[(name, dtype, hd, a)] = root / _subdir(name, dtype, hd, arch) / ninja.LIBRARY_NAME
    return root, outputs, libs


def _ptxas_report(output: str) -> dict:
    """{object directory: (registers, spill store bytes, spill load bytes)} from ninja + -Xptxas -v output
    (ninja prints each edge's status line, then that edge's output)."""
    report, cur, regs = {}, None, None
    for line in output.splitlines():
        m = re.search(r"NVCC (\S+)/(\w+)\.o", line)
        if m:  # the forward kernel's object; the KV-cache unit beside it (DECODE_SOURCE) is not reported here
            cur = m.group(1) if m.group(2) == render.KERNEL_SOURCE[:-3] else None
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            report.setdefault(cur, [None, 0, 0])[1:] = [int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            report.setdefault(cur, [None, 0, 0])[0] = int(m.group(1))
    return {k: tuple(v) for k, v in report.items()}


def test_compiles_links_and_loads(compiled):
    root, outputs, libs = compiled
    for (name, dtype, hd, arch), path in libs.items():
        assert path.is_file(), path
        lib = launch.load_library(path)  # no GPU needed: ABI version and kernel info only
        cfg = tiles.tile_config(hd, arch)
        assert (lib.head_dim, lib.dtype, lib.block_q, lib.block_k) == (hd, dtype, cfg.block_q, cfg.block_k)
        assert lib.num_threads == 32 * cfg.num_warps and lib.smem_bytes == cfg.smem_bytes(hd)
        assert lib.arch == int(arch[3:5])
        assert lib.error_string(0) == "no error"


def test_library_links_cudart_statically_and_exports_only_the_abi(compiled):
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("needs binutils")
    _, _, libs = compiled
    path = libs[("causal", torch.bfloat16, 128, "sm_90a")]
    dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    assert not any(n.startswith(("libcuda.so", "libcudart.so")) for n in needed), needed
    syms = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()
    exported = {s for s in syms if s.startswith("attngen_")}
    assert exported == {"attngen_fwd", "attngen_abi_version", "attngen_kernel_info", "attngen_error_string",
                        "attngen_decode", "attngen_decode_kernel_info", "attngen_decode_heads_per_cta"}  # + KV cache
    assert not any(s.startswith("cuda") for s in syms), "cudart symbols leak from the library"


def test_no_register_spills_on_sm90a_hd128(compiled):
    _, outputs, _ = compiled
    report = {("sm_90a", k): v for k, v in _ptxas_report(outputs["sm_90a"]).items()}
    report.update({("sm_80", k): v for k, v in _ptxas_report(outputs["sm_80"]).items()})
    expected = {(a, _subdir(n, d, hd, a).split("/", 1)[1]) for n, d, hd, a in COMPILE_SET}
    assert set(report) == expected, "could not find ptxas -v reports for every object"
    lines = [f"{a:7s} {k:28s} {r} registers, {ss} B spill stores, {sl} B spill loads"
             for (a, k), (r, ss, sl) in sorted(report.items())]
    print("\nptxas:\n" + "\n".join(lines))
    for (arch, key), (regs, spill_st, _) in report.items():
        assert regs is not None and regs <= 255
        if arch == "sm_90a" and key.endswith("_128"):
            assert spill_st == 0, f"{arch} {key} spills {spill_st} bytes"


def test_incremental_rebuild_is_a_no_op(compiled):
    root, _, _ = compiled
    out = ninja.run_ninja(root / "sm_80")
    assert "no work to do" in out


@pytest.mark.requires_nvcc
def test_compile_error_carries_compiler_output(tmp_path):
    bad = fixture_inc("full").replace("return score; }", "return scor; }")
    src = render.render_sources(bad, torch.bfloat16, 64, "sm_80")
    ninja.write_build_ninja(tmp_path, src, "sm_80")
    with pytest.raises(BuildError) as e:
        ninja.run_ninja(tmp_path)
    msg = str(e.value)
    assert "variant.inc" in msg and "scor" in msg and "ATTNGEN_VERBOSE" in msg


@pytest.mark.requires_nvcc
def test_python_integer_semantics(tmp_path):
    """py_floordiv / py_mod (int and long long) against Python's // and %."""
    (tmp_path / "attngen_common.cuh").write_text((render.TEMPLATE_DIR / "attngen_common.cuh").read_text())
    vals = [-7, -6, -5, -3, -1, 0, 1, 2, 3, 5, 6, 7, 64, -64, 127, -129]
    divs = [-7, -3, -2, -1, 1, 2, 3, 64, -64]
    big = [-(2**40) - 3, 2**40 + 5, -(2**35), 3 * 2**33 + 1]
    bigdivs = [-(2**20) - 1, 2**33 + 7, 5, -3]
    prog = ['#include <cstdio>', '#include "attngen_common.cuh"', "int main() {"]
    expect = []
    for a in vals:
        for b in divs:
            prog.append(f'  printf("%d %d\\n", py_floordiv({a}, {b}), py_mod({a}, {b}));')
            expect.append(f"{a // b} {a % b}")
    for a in big:
        for b in bigdivs:
            prog.append(f'  printf("%lld %lld\\n", py_floordiv({a}LL, {b}LL), py_mod({a}LL, {b}LL));')
            expect.append(f"{a // b} {a % b}")
    prog.append(f'  printf("%lld %lld\\n", py_floordiv(-{2**40}LL, 3), py_mod(7, -{2**33}LL));')
    expect.append(f"{-(2**40) // 3} {7 % -(2**33)}")
    prog += ["  return 0;", "}"]
    (tmp_path / "t.cu").write_text("\n".join(prog) + "\n")
    exe = tmp_path / "t"
    subprocess.run([toolchain.find_nvcc(), "-std=c++17", "-I", str(tmp_path), str(tmp_path / "t.cu"),
                    "-o", str(exe)], check=True, capture_output=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert got[: len(expect)] == expect


# --------------------------------------------------------------------------------------------------
# host side of the ABI


def test_abi_struct_layout():
    A = launch.AttngenFwdArgs
    assert ctypes.sizeof(A) == 688 and ctypes.sizeof(launch.CapturedArgs) == 512
    assert (A.q.offset, A.q_stride.offset, A.B.offset, A.scale.offset, A.q_offset.offset, A.captured.offset,
            A.descale.offset) == (0, 40, 136, 160, 164, 168, 680)
    # the packed bytes the hot path sends decode to the same fields through the ctypes mirror
    vals = (1, 2, 3, 4, 5, *range(10, 22), 7, 8, 4, 100, 200, 128, 0.125, -3,
            *range(1000, 1008), *range(2000, 2032), *range(3000, 3016), *range(-4, 4), *[k / 4 for k in range(8)],
            4096)
    a = A.from_buffer_copy(launch._PACK.pack(*vals))
    assert (a.q, a.k, a.v, a.o, a.lse) == (1, 2, 3, 4, 5)
    assert list(a.q_stride) == [10, 11, 12] and list(a.o_stride) == [19, 20, 21]
    assert (a.B, a.Hq, a.Hkv, a.Lq, a.Lk, a.D, a.scale, a.q_offset) == (7, 8, 4, 100, 200, 128, 0.125, -3)
    assert list(a.captured.ptr) == list(range(1000, 1008))
    assert list(a.captured.stride[1]) == [2004, 2005, 2006, 2007]
    assert list(a.captured.summary) == list(range(3000, 3016))
    assert list(a.captured.iparam) == list(range(-4, 4)) and list(a.captured.fparam) == [k / 4 for k in range(8)]
    assert a.descale == 4096
    assert launch._PACK_HEAD.pack(*vals[:25]) + launch._PACK_TAIL.pack(*vals[25:-1]) + launch._PACK_DESCALE.pack(
        vals[-1]) == launch._PACK.pack(*vals)


def test_forward_rejects_cpu_tensors(compiled):
    _, _, libs = compiled
    lib = launch.load_library(libs[("causal", torch.bfloat16, 64, "sm_90a")])
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(InputError, match="CUDA"):
        launch.forward(lib, q, q, q)
    with pytest.raises(InputError, match="torch.Tensor"):
        launch.forward(lib, "q", q, q)


def test_load_library_rejects_other_files(tmp_path):
    p = tmp_path / "not_a_lib.so"
    p.write_text("nope")
    with pytest.raises(BuildError, match="rebuilt"):
        launch.load_library(p)


def test_signature_covers_tile_settings(monkeypatch):
    """Tile settings live in jit/tiles.py, outside the hashed templates: they must still change the cache key."""
    from dataclasses import replace

    import torch

    import attngen
    from attngen.cache import cache_key

    attn = attngen.compile(causal=True)
    fields = attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").fields()
    ladder = dict(tiles.SM90_LADDER)  # the key covers the whole ladder: any rung may be the one built
    ladder[128] = ladder[128][:-1] + (replace(ladder[128][-1], pingpong=not ladder[128][-1].pingpong),)
    monkeypatch.setattr(tiles, "SM90_LADDER", ladder)
    changed = attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").fields()
    assert cache_key(changed) != cache_key(fields)
    sm80 = attn.spec(torch.bfloat16, 128, "sm_80", "sm80").fields()
    assert "block_k" in sm80["tiles"] and sm80["tiles"] != fields["tiles"]


def test_signature_covers_the_generator_sources(tmp_path, monkeypatch):
    """Codegen, predicates and build flags live in Python, outside the hashed templates: a change to any of them
    must change the cache key (kernels rendered by older code are not served)."""
    import shutil

    import torch

    import attngen
    from attngen.cache import cache_key
    from attngen.jit import render

    pkg = Path(render.__file__).resolve().parent.parent
    assert {"codegen.py", "predicates.py", "printer.py", "gradients.py", "jit/ninja.py"} <= set(render.GENERATOR_SOURCES)
    attn = attngen.compile(causal=True)
    before = cache_key(attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").fields())
    copy = tmp_path / "attngen"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__", "templates"))
    with open(copy / "codegen.py", "a") as f:
        f.write("\n# a change\n")
    monkeypatch.setattr(render, "__file__", str(copy / "jit" / "render.py"))
    render.generator_hash.cache_clear()
    try:
        after = cache_key(attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").fields())
    finally:
        monkeypatch.undo()
        render.generator_hash.cache_clear()
    assert after != before
    assert cache_key(attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").fields()) == before


def test_spill_bytes_of_one_entry_among_a_librarys_kernels():
    """The forward library also compiles the decode kernels: the spill ladder reads its own kernel's spills only."""
    out = ("ptxas info    : Function properties for _ZN12_GLOBAL__N_118attngen_fwd_kernelE14AttngenFwdArgs\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Function properties for _ZN12_GLOBAL__N_121attngen_decode_kernelE17AttngenDecodeArgs\n"
           "    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n")
    assert ninja.ptxas_spill_bytes(out) == 20
    assert ninja.ptxas_spill_bytes(out, "attngen_fwd_kernel") == 0
    assert ninja.ptxas_spill_bytes(out, "attngen_decode_kernel") == 20
    assert ninja.ptxas_spill_bytes(out, "attngen_bwd_kernel") is None and ninja.ptxas_spill_bytes("") is None
