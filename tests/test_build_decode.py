"""The KV-cache kernel (templates/fwd_decode.cuh, the second unit of every forward library; attngen/decode.py),
CPU only: tile policy, rendering, the split-count rule, and real nvcc builds of forward libraries for sm_80 and
sm_90a whose decode kernel compiles without spills and whose host side (the C ABI, how many query heads a CTA
walks) is loaded and called here without a GPU."""
from __future__ import annotations

import ctypes
import dataclasses
import subprocess

import pytest
import torch

import attngen
from attngen import abi
from attngen.codegen import render_variant_inc
from attngen.decode import CTA_COST_TILES, DECODE_ABI_VERSION, load_decode_library, num_splits_heuristic
from attngen.jit import render, tiles
from attngen.jit.ninja import LIBRARY_NAME, run_ninja, write_build_ninja

NPOS = 300


def _head_window(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < WINDOWS[h])


WINDOWS = torch.tensor([8, 32, 64, 128], dtype=torch.int32)


def _variants():
    docs = torch.randint(0, 4, (NPOS,), generator=torch.Generator().manual_seed(2)).sort().values
    return {
        "causal": attngen.compile(causal=True),
        "softcap_window": attngen.compile(softcap=30.0, window=256),
        "document": attngen.compile(mask_mod=attngen.document(docs)),
        "head_window": attngen.compile(mask_mod=_head_window),
    }


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90a", "sm_120"])
def test_decode_tiles_fit_shared_memory(arch):
    limit = tiles.SMEM_PER_BLOCK.get(int(arch[3:].rstrip("a")), tiles.SMEM_DEFAULT)
    for hd in abi.SUPPORTED_HEAD_DIMS:
        cfg = tiles.decode_tile_config(hd, arch)
        assert cfg.smem_bytes(hd) <= limit and cfg.block_q == 16 and cfg.stages >= 2
        assert (cfg.block_k // cfg.num_warps) % 16 == 0 and cfg.block_k % (cfg.num_warps * 32 // (hd // 8)) == 0
        assert (cfg.block_k // cfg.num_warps) % max(1, 32 // (hd // 8)) == 0  # a warp copies its own rows
        merge = cfg.num_warps * cfg.block_q * (hd + 2) * 4  # the warps' softmax states, merged in the K/V ring
        assert merge <= 2 * cfg.stages * cfg.block_k * hd * 2 and hd % 64 == 0  # unpadded rows, 8-chunk swizzle


def test_forward_sources_hold_the_decode_unit_and_its_tiles_enter_the_key():
    for kernel, arch in (("sm90", "sm_90a"), ("sm80", "sm_80")):
        src = render.render_sources("// stand-in\n", torch.bfloat16, 128, arch, kernel=kernel)
        cu = src[render.DECODE_SOURCE]
        cfg = tiles.decode_tile_config(128, arch)
        assert '#include "fwd_decode.cuh"' in cu and f"constexpr int STAGES = {cfg.stages};" in cu
        assert f"constexpr int BK = {cfg.block_k};" in cu and "#define ATTNGEN_SECOND_UNIT 1" in cu
        assert "ATTNGEN_SECOND_UNIT" not in src[render.KERNEL_SOURCE] and "{{" not in cu and "{%" not in cu
        assert f"constexpr bool PDL = {'true' if cfg.pdl else 'false'};" in cu
        with_pdl = render.decode_source(torch.bfloat16, 128, arch, tiles=dataclasses.replace(cfg, pdl=True))
        assert "constexpr bool PDL = true;" in with_pdl and "constexpr bool DECODE_PDL = PDL && kArch >= 90;" in \
            render.headers()["decode_layout.cuh"]  # an sm_80 build launches plainly (no griddepcontrol there)
    spec = attngen.compile(causal=True).spec(torch.bfloat16, 128, "sm_80", kernel="sm80")
    assert spec.fields()["decode_tiles"] == repr(tiles.decode_tile_config(128, "sm_80"))
    assert "decode_tiles" not in attngen.compile(causal=True).spec(torch.bfloat16, 128, "sm_80",
                                                                     kernel="sm80_bwd").fields()


def test_variant_inc_says_whether_the_kv_walk_reads_the_head():
    V = _variants()
    for name, reads in (("causal", 0), ("softcap_window", 0), ("document", 0), ("head_window", 1)):
        inc = render_variant_inc(V[name].traced, V[name].predicates)
        assert f"#define ATTNGEN_TILES_READ_HEAD {reads}\n" in inc, name
    assert "#define ATTNGEN_NUM_SUMMARIES 0\n" in render_variant_inc(V["causal"].traced, V["causal"].predicates)
    doc = V["document"]
    assert f"#define ATTNGEN_NUM_SUMMARIES {len(doc.predicates.summaries)}\n" in render_variant_inc(
        doc.traced, doc.predicates)
    assert doc.predicates.summaries  # the decode kernel walks every tile for such a variant


def test_num_splits_heuristic_minimises_the_critical_path():
    slots = 132
    assert num_splits_heuristic(512, slots, 64) == 1  # the CTAs fill the GPU already
    assert num_splits_heuristic(8, slots, 4) == 1  # too few kv tiles to split

    def path(ctas, slots, tiles, s):  # waves times a CTA's time: one split's tiles and its fixed cost
        return -(-ctas * s // slots) * (-(-tiles // s) + CTA_COST_TILES)

    for ctas, sl, n_tiles in ((64, 132, 512), (8, 132, 2048), (8, 264, 2048), (64, 264, 64), (3, 132, 10),
                            (1, 264, 100000), (20, 264, 37)):
        s = num_splits_heuristic(ctas, sl, n_tiles)
        best = min(path(ctas, sl, n_tiles, n) for n in range(1, min(128, n_tiles) + 1))
        assert path(ctas, sl, n_tiles, s) == best and all(path(ctas, sl, n_tiles, n) > best for n in range(1, s))
        assert 1 <= s <= min(128, n_tiles)
    assert num_splits_heuristic(64, slots, 512) == 2  # B8 x 8 kv heads: two splits, 128 of 132 slots, 256 tiles
    assert num_splits_heuristic(8, 264, 2048) == 33  # one wave of 264 CTAs, 63 tiles each (32 splits: 64)
    assert num_splits_heuristic(64, 264, 64) == 4  # a window of 64 tiles over B8: 16 tiles per CTA in one wave


def test_packed_arguments_land_in_their_ctypes_fields():
    from attngen.decode import _HEAD_FIELDS, AttngenDecodeArgs, pack_head

    values, nxt = {}, 1
    for name, n in _HEAD_FIELDS:
        values[name] = tuple(range(nxt, nxt + n)) if n else nxt
        nxt += max(n, 1)
    values["scale"] = 0.5
    args = AttngenDecodeArgs.from_buffer_copy(pack_head(values) + bytes(ctypes.sizeof(AttngenDecodeArgs) - 240))
    for name, n in _HEAD_FIELDS:
        got = tuple(getattr(args, name)) if n else getattr(args, name)
        assert got == values[name], name


@pytest.mark.requires_nvcc
def test_ctypes_mirror_matches_the_c_struct(tmp_path):
    """Every field's offset in AttngenDecodeArgs as the host compiler lays it out (offsetof, through nvcc) equals the
    ctypes mirror's, whose order the launch packs."""
    from attngen.decode import AttngenDecodeArgs
    from attngen.jit.toolchain import find_nvcc

    names = [name for name, _ in AttngenDecodeArgs._fields_]
    prog = ['#include <cstdio>', '#include <cstddef>', '#include "attngen_decode_abi.cuh"', "int main() {"]
    prog += [f'  std::printf("{n} %zu\\n", offsetof(AttngenDecodeArgs, {n}));' for n in names]
    prog += ['  std::printf("size %zu\\n", sizeof(AttngenDecodeArgs));', "  return 0;", "}"]
    (tmp_path / "offsets.cu").write_text("\n".join(prog) + "\n")
    exe = tmp_path / "offsets"
    subprocess.run([find_nvcc(), "-std=c++17", "-I", str(render.TEMPLATE_DIR), str(tmp_path / "offsets.cu"), "-o",
                    str(exe)], check=True, capture_output=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                        check=True).stdout.splitlines())
    want = {n: getattr(AttngenDecodeArgs, n).offset for n in names}
    assert {n: int(got[n]) for n in names} == want and int(got["size"]) == ctypes.sizeof(AttngenDecodeArgs)


def _spills_by_object(output: str) -> dict:
    """{object: spill store bytes} from ninja + -Xptxas -v output (each edge's status line, then its output)."""
    import re

    spills, cur = {}, None
    for line in output.splitlines():
        m = re.search(r"NVCC (\S+\.o)", line)
        if m:
            cur = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and cur:
            spills[cur] = spills.get(cur, 0) + int(m.group(1))
    return spills


@pytest.mark.requires_nvcc
def test_forward_libraries_carry_the_decode_kernel_without_spills(tmp_path):
    """Forward libraries (sm_80: every variant and head dim; sm_90a: each variant at head dim 128) built as attngen
    builds them: the decode unit compiles without spills, and each library exports the decode entry points, loads as
    a KV-cache library (launch checks its ABI version and argument block) and says how many heads a CTA walks."""
    V = _variants()
    incs = {n: a.spec(torch.bfloat16, 64, "sm_80", kernel="sm80").variant_inc() for n, a in V.items()}
    for arch, kernel, dims in (("sm_80", "sm80", abi.SUPPORTED_HEAD_DIMS), ("sm_90a", "sm90", (128,))):
        sources = dict(render.headers())
        for n, inc in incs.items():
            for hd in dims:
                dt = torch.bfloat16 if hd != 128 else torch.float16
                src = render.render_sources(inc, dt, hd, arch, kernel=kernel)
                for f in (render.KERNEL_SOURCE, render.DECODE_SOURCE, render.VARIANT_INCLUDE):
                    sources[f"{n}_{hd}/{f}"] = src[f]
        libs = write_build_ninja(tmp_path / arch, sources, arch, ["-Xptxas", "-v"])
        out = run_ninja(tmp_path / arch)
        decode_objs = {o: b for o, b in _spills_by_object(out).items() if o.endswith("attngen_decode.o")}
        assert len(decode_objs) == len(incs) * len(dims)
        assert not any(decode_objs.values()), f"{arch}: the decode unit spills\n{out[-4000:]}"
        assert len(libs) == len(incs) * len(dims)
        for path in libs:
            assert path.endswith(LIBRARY_NAME)
            syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
            for s in ("attngen_fwd", "attngen_decode", "attngen_decode_kernel_info", "attngen_decode_heads_per_cta",
                      "attngen_abi_version", "attngen_error_string"):
                assert f" T {s}\n" in syms, f"{path} does not export {s}"
            lib = load_decode_library(path)
            assert lib.block_q == 16 and lib.head_dim in abi.SUPPORTED_HEAD_DIMS
            if "head_window" in str(path):
                assert [lib.heads_per_cta(g) for g in (1, 4, 8)] == [1, 1, 1]
            else:
                groups = (1, 2, 3, 4, 6, 8, 7, 16, 32, 48)
                assert [lib.heads_per_cta(g) for g in groups] == [1, 2, 1, 4, 2, 8, 1, 16, 16, 16]
    header = (render.TEMPLATE_DIR / "attngen_decode_abi.cuh").read_text()
    assert f"#define ATTNGEN_DECODE_ABI_VERSION {DECODE_ABI_VERSION}\n" in header
