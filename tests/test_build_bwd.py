"""The backward libraries (kernel families 'sm80_bwd', templates/bwd_sm80.cuh, and 'sm90_bwd', bwd_sm90.cuh), CPU
only: tile policy, which family a signature gets, rendering, real nvcc builds for sm_80 and sm_90a without spills
(the sm90 one on wgmma), and the transposed block predicates variant.inc prints
(q_block_lo/q_block_hi/q_full_lo/q_full_hi) computed by g++ against BlockPredicates and a brute-force map."""
from __future__ import annotations

import dataclasses
import random
import re
import shutil
import subprocess

import pytest
import torch

import attngen
from attngen import abi
from attngen.codegen import render_variant_inc
from attngen.jit import render, tiles
from attngen.jit.ninja import BWD_LIBRARY_NAME, run_ninja, write_build_ninja
from attngen.jit.spec import BWD_KERNEL, SM90_BWD_KERNEL, build_first_without_spills, choose_bwd_kernel, ptxas_report
from attngen.symbols import BK, BQ, B, H, J, KVLEN, QLEN, QOFF

from codegen_cases import COMMON_STUB, MATH, UNDEF, VARIANT_MATH, py_eval, param_setup, run_host_program
from helpers import param_values, predicates_with_values, tile_classes

GXX = shutil.which("g++")
NPOS = 400


def _variants():
    docs = torch.randint(0, 5, (NPOS,), generator=torch.Generator().manual_seed(3)).sort().values
    return {
        "full": attngen.compile(),
        "causal": attngen.compile(causal=True),
        "sliding_window": attngen.compile(window=96),
        "document": attngen.compile(mask_mod=attngen.document(docs)),
    }


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90a", "sm_120"])
def test_bwd_tiles_fit_shared_memory(arch):
    limit = tiles.SMEM_PER_BLOCK.get(int(arch[3:].rstrip("a")), tiles.SMEM_DEFAULT)
    for hd in abi.SUPPORTED_HEAD_DIMS:
        cfg = tiles.bwd_tile_config(hd, arch)
        wm = cfg.num_warps // cfg.warps_d
        assert cfg.smem_bytes(hd) <= limit
        assert cfg.block_k % (16 * wm) == 0 and cfg.block_q % 16 == 0 and (hd // cfg.warps_d) % 16 == 0


def test_render_bwd_sources():
    inc = "// variant.inc stand-in\n"
    src = render.render_sources(inc, torch.bfloat16, 128, "sm_90a", kernel=BWD_KERNEL)
    assert set(src) == {render.BWD_KERNEL_SOURCE, render.VARIANT_INCLUDE, *render.headers()}
    cu = src[render.BWD_KERNEL_SOURCE]
    cfg = tiles.bwd_tile_config(128, "sm_90a")
    assert f"constexpr int BQ = {cfg.block_q};" in cu and f"constexpr int BK = {cfg.block_k};" in cu
    assert f"constexpr int WN = {cfg.warps_d};" in cu and '#include "bwd_sm80.cuh"' in cu
    assert "{{" not in cu and "{%" not in cu


def test_bwd_spec_key_differs_from_forward():
    attn = attngen.compile(causal=True)
    fwd = attn.spec(torch.bfloat16, 128, "sm_90a", kernel="sm80")
    bwd = attn.spec(torch.bfloat16, 128, "sm_90a", kernel=BWD_KERNEL)
    assert bwd.kernel == BWD_KERNEL and bwd.uri.endswith("sm80_bwd")
    assert fwd.fields()["kernel"] != bwd.fields()["kernel"] and fwd.fields()["tiles"] != bwd.fields()["tiles"]


def test_sm90_backward_family_and_tiles():
    assert choose_bwd_kernel("sm_90a", 64) == choose_bwd_kernel("sm_90a", 128) == SM90_BWD_KERNEL
    assert choose_bwd_kernel("sm_90a", 256) == choose_bwd_kernel("sm_80", 128) == BWD_KERNEL
    for hd, cfg in tiles.SM90_BWD_TILES.items():
        assert cfg.smem_bytes(hd) <= tiles.SM90_SMEM_LIMIT
    with pytest.raises(attngen.InputError, match="sm_90a"):
        attngen.compile(causal=True).spec(torch.bfloat16, 128, "sm_80", kernel=SM90_BWD_KERNEL)
    with pytest.raises(attngen.BuildError, match="head dim"):
        render.render_sources("", torch.bfloat16, 256, "sm_90a", kernel=SM90_BWD_KERNEL)
    with pytest.raises(attngen.InputError, match="head dims"):
        attngen.compile(causal=True).spec(torch.bfloat16, 256, "sm_90a", kernel=SM90_BWD_KERNEL)
    # backend='sm80' keeps the backward portable too; otherwise the sm90 one first, the portable one behind it
    assert attngen.compile(causal=True, backend="sm80").backward_kernels(128, 0) == (BWD_KERNEL,)
    src = render.render_sources("", torch.float16, 64, "sm_90a", kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    assert '#include "bwd_sm90.cuh"' in src and "constexpr int STAGES = 2;" in src and "{{" not in src
    # the probabilities split under the products: the ladder's first rung without a score_mod, none with one
    assert "constexpr bool SPLIT_PROBS = 0;" in src
    assert [t.split_probs for t in tiles.sm90_bwd_ladder(64)] == [True, False, False]
    assert not any(t.split_probs for t in tiles.sm90_bwd_ladder(64, has_score_mod=True))
    # dK and dV staged first only on the split rung of a mask other than a half plane (a window, documents, a union)
    assert [t.dkv_staged for t in tiles.sm90_bwd_ladder(64, has_mask=True)] == [True, False, False, False]
    # at head dim 128 that rung with each step's S^T issued by the step before
    # and the split rung again without the waits' suspend-time hint before the one pass
    assert [(t.dkv_staged, t.s_ahead, t.wait_ns) for t in tiles.sm90_bwd_ladder(128, has_mask=True)] \
        == [(True, 2, 2000), (False, 0, 2000), (False, 0, 0), (False, 0, 2000), (False, 0, 2000)]
    assert all(t.split_probs for t in tiles.sm90_bwd_ladder(128, has_mask=True)[:3])
    assert not any(t.dkv_staged for t in tiles.sm90_bwd_ladder(128, has_mask=True, half_plane=True)
                   + tiles.sm90_bwd_ladder(128, has_score_mod=True, has_mask=True) + tiles.sm90_bwd_ladder(128))
    # full attention at head dim 128 first tries 80 q rows per step, dS^T from the packed P^T, S^T a step ahead; no
    # other ladder has 80 rows
    assert tiles.sm90_bwd_ladder(128)[0] == dataclasses.replace(tiles.SM90_BWD_TILES[128], split_probs=True,
                                                                block_q=80, ds_from_packed=True, s_ahead=2)
    assert tiles.sm90_bwd_ladder(128)[1:] == (
        dataclasses.replace(tiles.SM90_BWD_TILES[128], split_probs=True), tiles.SM90_BWD_TILES[128],
        dataclasses.replace(tiles.SM90_BWD_TILES[128], producer_regs=56, consumer_regs=224))
    assert [(hd, kw) for hd in (64, 128) for kw in ({}, dict(has_mask=True), dict(has_mask=True, half_plane=True),
                                                    dict(has_score_mod=True))
            for r in tiles.sm90_bwd_ladder(hd, **kw) if r.block_q == 80 or r.ds_from_packed] == [(128, {})]
    assert attngen.compile(window=64).spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL).tile_choices()[0] \
        == dataclasses.replace(tiles.SM90_BWD_TILES[128], split_probs=True, dkv_staged=True, s_ahead=2)
    assert not attngen.compile(causal=True).spec(torch.bfloat16, 128, "sm_90a",
                                                 kernel=SM90_BWD_KERNEL).tile_choices()[0].dkv_staged
    split = dataclasses.replace(tiles.SM90_BWD_TILES[64], split_probs=True)
    text = render.render_sources("", torch.float16, 64, "sm_90a", tiles=split,
                                 kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    assert "constexpr bool SPLIT_PROBS = 1;" in text
    assert "constexpr bool DKV_STAGED = 0;" in src  # dK and dV from registers unless asked for
    staged = dataclasses.replace(tiles.SM90_BWD_TILES[64], dkv_staged=True)
    assert "constexpr bool DKV_STAGED = 1;" in render.render_sources(
        "", torch.float16, 64, "sm_90a", tiles=staged, kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    # the walk's rotation: off unless asked for, and bounded
    assert "constexpr int WALK_SHIFT = 0;" in src
    shifted = dataclasses.replace(tiles.SM90_BWD_TILES[64], walk_shift=2)
    assert "constexpr int WALK_SHIFT = 2;" in render.render_sources(
        "", torch.float16, 64, "sm_90a", tiles=shifted, kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    with pytest.raises(attngen.BuildError, match="walk_shift"):
        tiles.Sm90BwdTiles(walk_shift=-1)
    # how dQ_acc starts out: first stores unless asked otherwise
    assert "constexpr int DQ_INIT = 1;" in src
    plain = dataclasses.replace(tiles.SM90_BWD_TILES[64], dq_init=0)
    assert "constexpr int DQ_INIT = 0;" in render.render_sources(
        "", torch.float16, 64, "sm_90a", tiles=plain, kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    with pytest.raises(attngen.BuildError, match="dq_init"):
        tiles.Sm90BwdTiles(dq_init=2)
    # relative score mods: walked per diagonal, their terms staged per warp, unless asked otherwise
    assert "constexpr bool REL_WALK = 1;" in src and "constexpr bool REL_STAGE = 1;" in src
    walk = dataclasses.replace(tiles.SM90_BWD_TILES[64], rel_stage=False)
    assert "constexpr bool REL_STAGE = 0;" in render.render_sources(
        "", torch.float16, 64, "sm_90a", tiles=walk, kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    # the step's launches as programmatic dependents (pdl.cuh): the switch reaches the launches
    for pdl in (False, True):
        t = dataclasses.replace(tiles.SM90_BWD_TILES[64], pdl=pdl)
        assert f"constexpr bool PDL = {int(pdl)};" in render.render_sources(
            "", torch.float16, 64, "sm_90a", tiles=t, kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
    # the work tiles' order: sections of heads, each sorted by its walks' lengths at run time (tile_sections.cuh)
    for sections, order in ((False, False), (True, False), (True, True)):
        t = dataclasses.replace(tiles.SM90_BWD_TILES[64], sections=sections, order=order)
        text = render.render_sources("", torch.float16, 64, "sm_90a", tiles=t,
                                     kernel=SM90_BWD_KERNEL)[render.BWD_KERNEL_SOURCE]
        assert f"constexpr bool SECTIONS = {int(sections)};" in text and f"constexpr bool ORDER = {int(order)};" in text
    headers = render.headers()
    assert "launch_bwd_pre<OrderSection>(a, BQ, stream, PDL, ordered_walks(a) ? order_sections(a) : 0)" \
        in headers["bwd_sm90.cuh"]
    assert "a.tile_order[w]" in headers["bwd_sm90.cuh"]
    # the main kernel and the postprocess
    assert headers["bwd_sm90.cuh"].count("launch_kernel(PDL, ") == 2


def test_prebuild_plans_the_backward_each_arch_runs():
    from attngen.prebuild import plan

    kinds = {(t.arch, t.head_dim, t.kernel) for t in plan(["causal"], ["bf16"], [64, 128, 256], ["sm_90a", "sm_80"])}
    bwd = {("sm_90a", 64): "sm90_bwd", ("sm_90a", 128): "sm90_bwd", ("sm_90a", 256): "sm80_bwd",
           ("sm_80", 64): "sm80_bwd", ("sm_80", 128): "sm80_bwd", ("sm_80", 256): "sm80_bwd"}
    assert kinds == {(a, hd, k) for (a, hd), b in bwd.items() for k in ("auto", b)}


def _ladder_builds(tmp_path, attns: dict) -> dict:
    """Each (name, head dim) of ``attns`` (name -> compiled variant) built as the spec builds it, on the sm90
    backward's ladder (the spec's tile_choices, jit/tiles.py sm90_bwd_ladder: the first rung ptxas compiles without
    spills): name_hd -> (tiles, spill bytes of the main kernel)."""
    built = {}
    for n, attn in attns.items():
        for hd, dt in ((64, torch.float16), (128, torch.bfloat16)):
            spec = attn.spec(dt, hd, "sm_90a", kernel=SM90_BWD_KERNEL)
            built[f"{n}_{hd}"] = build_first_without_spills(tmp_path / f"{n}_{hd}", spec.variant_inc(), dt, hd,
                                                            "sm_90a", spec.tile_choices(), kernel=SM90_BWD_KERNEL)
    return built


@pytest.mark.requires_nvcc
def test_sm90_backward_builds_on_wgmma_without_spills(tmp_path):
    """bwd_sm90.cuh for a mask, a score_mod and a captured tensor at both head dims: a rung of the ladder without
    spills, every product on wgmma (dQ = dS K with both operands transposed), read from the PTX. The document's ids
    are int32, as the benchmarks' (int64 ids cost registers: at head dim 128 its staged rungs spill, and it builds the
    split rung)."""
    docs = torch.randint(0, 5, (NPOS,), generator=torch.Generator().manual_seed(3)).sort().values.to(torch.int32)
    V = {"causal": attngen.compile(causal=True), "softcap_causal": attngen.compile(softcap=20.0, causal=True),
         "document": attngen.compile(mask_mod=attngen.document(docs)), "full": attngen.compile()}
    built = _ladder_builds(tmp_path, V)
    assert len(built) == 2 * len(V)
    for key, (t, spill) in built.items():
        assert spill == 0, f"{key}: every rung spills (the least: {t}, {spill} bytes)"
        # the probabilities split under the products where no score_mod needs the raw score beside dP^T
        assert t.split_probs == (not key.startswith("softcap")), key
        # dK and dV staged for TMA stores only under a mask that is not a half plane, at head dim 128 with each
        # step's S^T issued by the step before (without it the document's staged rung spills 12 bytes); so is full
        # attention's 80-row rung
        assert t.dkv_staged == key.startswith("document"), key
        assert t.s_ahead == (2 if key in ("document_128", "full_128") else 0), key
        # full attention at head dim 128 at 80 q rows, dS^T from the packed P^T (without it that rung spills)
        assert (t.block_q, t.ds_from_packed) == ((80, True) if key == "full_128" else (64, False)), key
        assert (tmp_path / key / BWD_LIBRARY_NAME).is_file()
    from attngen.jit.toolchain import find_nvcc

    for key in ("causal_128", "softcap_causal_128", "full_128"):
        d = tmp_path / key
        out = subprocess.run([find_nvcc(), "-std=c++17", "-cubin", "-arch=sm_90a", "-I", str(d), "-Xptxas", "-v",
                              str(d / render.BWD_KERNEL_SOURCE), "-o", str(tmp_path / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
        assert "serializ" not in out.lower(), f"{key}: ptxas serialised the wgmmas"
    d = tmp_path / "causal_128"
    ptx = _bwd_ptx(d)
    # per consumer and q-block: S^T, dP^T (8 k16 steps each), dV, dK (4 each), dQ (8, both operands transposed)
    assert ptx.count("wgmma.mma_async") == 32, "a product is missing from wgmma"
    assert ptx.count("p, 1, 1, 1, 1;") == 8, "dQ = dS K does not read both operands MN-major"
    # causal takes the split rung: P^T under dP^T's product, dS^T under dV's (a wait for all but one group each)
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == 2, "the probabilities are not split under the products"
    # dQ leaves through the staged buffer and one bulk reduction per q-block, not per-thread reductions
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in ptx
    assert "red.global.add" not in ptx, "dQ fell back to per-thread reductions (its staging no longer fits)"


@pytest.mark.requires_nvcc
def test_int64_document_ids_build_the_split_rung_without_the_hint(tmp_path):
    """Documents with int64 ids (torch's default for randint and cumsum) at head dim 128: the staged rung and the split
    rung with the waits' suspend-time hint spill, and the ladder's next rung is the split rung without the hint (the
    kernel they were measured on, session 35-36), not the one pass, built clean."""
    docs = torch.randint(0, 5, (NPOS,), generator=torch.Generator().manual_seed(3)).sort().values
    assert docs.dtype == torch.int64
    spec = attngen.compile(mask_mod=attngen.document(docs)).spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
    t, spill = build_first_without_spills(tmp_path, spec.variant_inc(), torch.bfloat16, 128, "sm_90a",
                                          spec.tile_choices(), kernel=SM90_BWD_KERNEL)
    assert spill == 0 and t == spec.tile_choices()[2], t
    assert t.split_probs and not t.dkv_staged and t.wait_ns == 0


@pytest.mark.requires_nvcc
def test_sm90_backward_sums_captured_gradients_without_spills(tmp_path):
    """A score_mod reading a per-head slope (summed once per tile), a relative-position table (per diagonal, in
    shared-memory bins) and a pair bias (per element): the sm90 backward builds without spills at both head dims,
    its PTX adds the sums with red.shared / red.global, dQ is staged where the bins leave room, and the portable
    backward refuses gradient buffers."""
    slopes, table, pair = torch.rand(4), torch.randn(4, 2 * NPOS - 1), torch.randn(NPOS, NPOS)

    def learnable(s, b, h, q, kv):
        return s + slopes[h] * (kv - q) + table[h, q - kv + NPOS - 1] + pair[q, kv]

    attn = attngen.compile(score_mod=learnable, causal=True)
    inc = attn.spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL).variant_inc()
    assert "#define ATTNGEN_GRAD_DIAG_SITES 1" in inc
    for key, (t, spill) in _ladder_builds(tmp_path, {"l": attn}).items():
        assert spill == 0, f"{key}: every rung spills (the least: {t}, {spill} bytes)"
    d = tmp_path / "l_128"
    ptx = _bwd_ptx(d)
    assert "red.shared.add.f32" in ptx, "the table's diagonal bins"
    assert ptx.count("red.global.add.f32") >= 3, "slope per tile, table per bin, pair bias per element"
    # one site's bins leave room for the staged dQ (one bulk reduction per q-block, no per-thread dQ reductions)
    assert "cp.reduce.async.bulk" in ptx and "red.global.add.v2.f32" not in ptx
    assert "return ATTNGEN_ERROR_BWD_OPTION;" in render.headers()["bwd_sm80.cuh"]


@pytest.mark.requires_nvcc
def test_sm90_backward_stages_dq_beside_the_most_gradient_bins(tmp_path):
    """codegen.GRAD_DIAG_SITES diagonal sites' bins still leave room for the staged dQ at both head dims (the
    kernel has no other dQ path): with one more table, the extra site is summed per element, and the kernel builds
    and adds dQ by bulk reductions, never per thread."""
    from attngen.codegen import GRAD_DIAG_SITES

    tables = [torch.randn(4, 2 * NPOS - 1) for _ in range(GRAD_DIAG_SITES + 1)]

    def many_tables(s, b, h, q, kv):
        return s + sum(t[h, q - kv + NPOS - 1] for t in tables)

    inc = attngen.compile(score_mod=many_tables).spec(torch.bfloat16, 128, "sm_90a",
                                                      kernel=SM90_BWD_KERNEL).variant_inc()
    assert f"#define ATTNGEN_GRAD_DIAG_SITES {GRAD_DIAG_SITES}" in inc
    for hd in (128, 64):
        ptx = _rendered_ptx(tmp_path / f"h{hd}", inc, torch.bfloat16, hd)
        assert "cp.reduce.async.bulk" in ptx and "red.global.add.v2.f32" not in ptx, hd


def test_captured_gradient_buffers_share_the_tensors_strides():
    """The kernel adds at the element offsets it reads with, so a gradient buffer has its tensor's strides; an
    overlapping view is read from a contiguous copy instead (each element its own slot); int tensors have none."""
    from attngen.errors import InputError
    from attngen.launch import _captured_grad_buffers

    t = torch.randn(6, 5).t()                       # transposed: strides (1, 5)
    e = torch.tensor(0.5).expand(4)                 # stride 0
    i = torch.arange(4, dtype=torch.int32)
    caps, bufs = _captured_grad_buffers([t, e, i], [True, True])
    assert caps[0] is t and bufs[0].stride() == t.stride() and bufs[0].dtype == torch.float32
    assert bufs[0].abs().sum() == 0
    assert caps[1].stride() == (1,) and caps[1].data_ptr() != e.data_ptr() and bufs[1].shape == (4,)
    assert caps[2] is i and len(bufs) == 2
    with pytest.raises(InputError, match="no gradient"):
        _captured_grad_buffers([t, e, i], [False, False, True])


@pytest.mark.requires_nvcc
def test_bwd_libraries_build_without_spills(tmp_path):
    """Every (variant, head dim) for sm_80 and sm_90a: one build.ninja per arch, the libraries in subdirectories."""
    V = _variants()
    incs = {n: a.spec(torch.bfloat16, 64, "sm_80", kernel=BWD_KERNEL).variant_inc() for n, a in V.items()}
    for arch in ("sm_80", "sm_90a"):
        sources = dict(render.headers())
        for n, inc in incs.items():
            for hd in abi.SUPPORTED_HEAD_DIMS:
                dt = torch.bfloat16 if hd != 128 else torch.float16
                src = render.render_sources(inc, dt, hd, arch, kernel=BWD_KERNEL)
                sources[f"{n}_{hd}/{render.BWD_KERNEL_SOURCE}"] = src[render.BWD_KERNEL_SOURCE]
                sources[f"{n}_{hd}/{render.VARIANT_INCLUDE}"] = inc
        libs = write_build_ninja(tmp_path / arch, sources, arch, ["-Xptxas", "-v"], library=BWD_LIBRARY_NAME)
        out = run_ninja(tmp_path / arch)
        report = ptxas_report(out)
        assert report["spill_bytes"] == 0, f"{arch}: spills\n{out[-4000:]}"
        assert len(libs) == len(incs) * len(abi.SUPPORTED_HEAD_DIMS)
        for lib in libs:
            syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
            for s in ("attngen_bwd", "attngen_bwd_kernel_info", "attngen_abi_version", "attngen_error_string"):
                assert f" T {s}\n" in syms, f"{lib} does not export {s}"


# ---------------------------------------------------------------------------------------------------------
# the transposed predicates: g++ evaluates the printed functions


def _c_bytes(name, t):
    raw = t.contiguous().reshape(-1).view(torch.uint8).tolist()
    return f"alignas(16) static const unsigned char {name}[{len(raw)}] = {{{', '.join(map(str, raw))}}};"


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_transposed_predicates_match_block_predicates(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    V = _variants()
    (tmp_path / "attngen_common.cuh").write_text(COMMON_STUB)
    (tmp_path / "variant_math.cuh").write_text(VARIANT_MATH.read_text())
    tiles_ = [(16, 32), (32, 16), (64, 64)]
    cases = [(rng.randint(1, 200), rng.randint(1, 200), rng.randint(0, 150)) for _ in range(4)]
    src = ["#define __host__\n#define __device__\n#define __forceinline__ inline\n#include <cstdio>\n#include <cstring>\n"
           '#include "attngen_common.cuh"\n' + MATH]
    runs, expect = [], []
    for n, attn in V.items():
        traced, preds = attn.traced, attn.predicates
        (tmp_path / f"{n}.inc").write_text(render_variant_inc(traced, preds))
        tensors = {c.name: c.tensor for c in traced.captured}
        for c in traced.captured:
            src.append(_c_bytes(f"{n}_{c.name}", c.tensor))
        body = []
        for (bq, bk) in tiles_:
            for (ql, kl, qo) in cases:
                sums = [s.compute(tensors, bq, bk, ql, kl, qo) for s in preds.summaries]
                tag = f"{n}_{bq}_{bk}_{ql}_{kl}_{qo}"
                body.append("  {\n  CapturedArgs c; memset(&c, 0, sizeof(c));")
                body += param_setup(traced)
                for m, c in enumerate(traced.captured):
                    body.append(f"  c.ptr[{m}] = {n}_{c.name};")
                    body += [f"  c.stride[{m}][{d}] = {st};" for d, st in enumerate(c.tensor.stride())]
                for m, s in enumerate(sums):
                    src.append(_c_bytes(f"s_{tag}_{m}", s.to(torch.int32 if preds.summaries[m].integer else torch.float32)))
                    body.append(f"  c.summary[{m}] = s_{tag}_{m};")
                nkb = -(-kl // bk)
                body.append(f"  TileArgs t{{{ql}, {kl}, {qo}, 0, 0}};\n  for (int j = 0; j < {nkb}; ++j) printf(\"%d %d %d %d\\n\", "
                            f"q_block_lo<{bq}, {bk}>(c, t, j), q_block_hi<{bq}, {bk}>(c, t, j), q_full_lo<{bq}, {bk}>(c, t, j), "
                            f"q_full_hi<{bq}, {bk}>(c, t, j));\n  }}")
                expect.append((n, attn, bq, bk, ql, kl, qo, {s.name: t for s, t in zip(preds.summaries, sums)}))
        src.append(f"namespace v_{n} {{\n#include \"{n}.inc\"\nvoid run() {{\n" + "\n".join(body) + "\n}\n}\n" + UNDEF)
        runs.append(f"  v_{n}::run();")
    lines = iter(run_host_program(tmp_path, src, runs).splitlines())
    for n, attn, bq, bk, ql, kl, qo, sums in expect:
        preds = predicates_with_values(attn.predicates, param_values(attn.traced.params))  # the values the host program ran
        nqb, nkb = -(-ql // bq), -(-kl // bk)
        j = torch.arange(nkb)
        got = torch.tensor([[int(x) for x in next(lines).split()] for _ in range(nkb)])
        args = (J, BQ, BK, QLEN, KVLEN, QOFF, B, H)
        for col, e in enumerate((preds.q_lo, preds.q_hi, preds.q_full_lo, preds.q_full_hi)):
            want = torch.broadcast_to(torch.as_tensor(py_eval(e, args, sums, j, bq, bk, ql, kl, qo, 0, 0)), (nkb,))
            want = want.clamp(-2**30, 2**30)
            assert got[:, col].tolist() == want.tolist(), f"seed {seed}: {n} {bq}x{bk} {ql},{kl},{qo}: {e}"
        # sound against the brute-force map: every non-EMPTY tile in range, every tile in the FULL range FULL
        b_, h_, qi, kv = (torch.arange(1).view(1, 1), torch.zeros(1, 1, dtype=torch.long),
                          (torch.arange(ql) + qo).view(ql, 1), torch.arange(kl).view(1, kl))
        mm = attn.variant.mask_mod
        m = torch.ones(ql, kl, dtype=torch.bool) if mm is None else torch.broadcast_to(
            torch.as_tensor(mm(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long), qi, kv)), (ql, kl))
        cls = tile_classes(m, bq, bk)
        for jj in range(nkb):
            lo, hi, flo, fhi = got[jj].tolist()
            for ii in range(nqb):
                if cls[ii, jj] != 0:
                    assert max(lo, 0) <= ii < min(hi, nqb), f"seed {seed}: {n}: tile ({ii}, {jj}) kept but out of range"
                if flo <= ii < fhi:
                    assert cls[ii, jj] == 2, f"seed {seed}: {n}: tile ({ii}, {jj}) in the FULL range but not full"


@pytest.mark.requires_nvcc
@pytest.mark.parametrize("hd", [64, 128])
def test_sm90_backward_stages_kv_grads_for_tma_stores(tmp_path, hd):
    """Sm90BwdTiles.dkv_staged: dK and dV leave through shared memory (stmatrix) and one TMA store per 64 columns of
    each, the last tile's stores waited for before the CTA exits; without it every thread stores from registers.
    Causal's split rung builds without spills either way."""
    from attngen.jit.spec import build_first_without_spills
    spec = attngen.compile(causal=True).spec(torch.bfloat16, hd, "sm_90a", kernel=SM90_BWD_KERNEL)
    first = spec.tile_choices()[0]
    waits = {}
    for staged in (False, True):
        t = dataclasses.replace(first, dkv_staged=staged)
        d = tmp_path / f"staged{int(staged)}"
        chosen, spill = build_first_without_spills(d, spec.variant_inc(), torch.bfloat16, hd, "sm_90a", (t,),
                                                   kernel=SM90_BWD_KERNEL)
        assert (chosen, spill) == (t, 0)
        ptx = _bwd_ptx(d)
        stores = ptx.count("cp.async.bulk.tensor.4d.global.shared::cta")
        assert stores == (2 * hd // 64 if staged else 0), stores
        assert ("stmatrix.sync.aligned.m8n8.x4" in ptx) == staged
        waits[staged] = (ptx.count("cp.async.bulk.wait_group 0;"), ptx.count("cp.async.bulk.wait_group.read 0;"))
    # the staged kernel waits once more for its stores' completion (at exit) and for their reads (the next tile)
    assert waits[True][0] > waits[False][0] and waits[True][1] > waits[False][1], waits


@pytest.mark.requires_nvcc
def test_sm90_backward_builds_80_query_rows(tmp_path):
    """Sm90BwdTiles.block_q = 80 at head dim 128 (not on the ladder: docs/performance.md): its build passes the
    layout's compile-time checks (sm90_bwd_layout.cuh: the transposed dQ_acc chunk's offsets against the staging
    order and the postprocess's reads) and computes dQ^T on m64n80 products with both operands MN-major, dS^T read
    through 32-byte swizzle descriptors; 80 rows are refused with dkv_staged and other counts are refused."""
    spec = attngen.compile().spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
    t = dataclasses.replace(spec.tile_choices()[0], block_q=80, split_probs=True)
    assert t.smem_bytes(128) <= tiles.SMEM_PER_BLOCK[90]
    d = tmp_path / "bq80"
    chosen, _ = build_first_without_spills(d, spec.variant_inc(), torch.bfloat16, 128, "sm_90a", (t,),
                                           kernel=SM90_BWD_KERNEL)
    assert chosen == t
    ptx = _bwd_ptx(d)
    assert "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16" in ptx
    assert ptx.count("m64n80k16") >= 3 * 8  # S^T, dP^T (K = 128) and dQ^T (K = BK = 128): 8 k16 steps each
    with pytest.raises(attngen.BuildError, match="block_q"):
        tiles.Sm90BwdTiles(block_q=80, dkv_staged=True)
    with pytest.raises(attngen.BuildError, match="block_q"):
        tiles.Sm90BwdTiles(block_q=96)


def _bwd_ptx(d) -> str:
    """The PTX of the backward kernel source written in build directory d (nvcc -ptx for compute_90a)."""
    from attngen.jit.toolchain import find_nvcc

    return subprocess.run([find_nvcc(), "-std=c++17", "-ptx", "-arch=compute_90a", "-I", str(d),
                           str(d / render.BWD_KERNEL_SOURCE), "-o", "-"], capture_output=True, text=True,
                          check=True).stdout


def _rendered_ptx(d, variant_inc: str, dtype, head_dim: int, tiles=None) -> str:
    """The PTX of the sm90 backward for variant_inc at a tile setting (the renderer's default: None), its sources
    (render.render_sources: the kernel, the variant include and the headers) written into a new directory d; no ptxas."""
    d.mkdir()
    for name, text in render.render_sources(variant_inc, dtype, head_dim, "sm_90a", tiles=tiles,
                                            kernel=SM90_BWD_KERNEL).items():
        (d / name).write_text(text)
    return _bwd_ptx(d)


def _clean_rung_ptx(d, spec, t) -> str:
    """Rung t of spec's sm90 backward built in d with ptxas's report: asserts no spills and its wgmmas not serialized
    (ptxas serializes all of them around one issued conditionally or in flight over a loop's back edge); the PTX."""
    from attngen.jit.ninja import ptxas_serialized_wgmma
    d.mkdir()
    sources = render.render_sources(spec.variant_inc(), torch.bfloat16, 128, "sm_90a", tiles=t, kernel=SM90_BWD_KERNEL)
    write_build_ninja(d, sources, "sm_90a", ["-Xptxas", "-v"], library=BWD_LIBRARY_NAME)
    out = run_ninja(d)
    assert not ptxas_serialized_wgmma(out, "attngen_bwd_kernel"), f"{t}: wgmmas serialized"
    assert ptxas_report(out)["spill_bytes"] == 0, f"{t}: spills"
    return _bwd_ptx(d)


@pytest.mark.requires_nvcc
def test_sm90_backward_wait_hint_builds_clean(tmp_path):
    """Sm90BwdTiles.wait_ns (2000 on every rung but one): the tile loader's, the producer's and the dQ writers' waits
    take a suspend-time hint, the writers' end comes through dq_full (after dq_done) instead of a second barrier
    polled in the same loop; the consumers' waits keep no hint. Full attention's split rung and the document's staged
    rung at head dim 128 build clean with it (no spills, wgmmas not serialized); without it the PTX has no hinted
    wait. Bad values are refused."""
    docs = torch.randint(0, 5, (NPOS,), generator=torch.Generator().manual_seed(3)).sort().values.to(torch.int32)
    hinted = re.compile(r"mbarrier\.try_wait\.parity\.shared::cta\.b64 p, \[%r\d+\], %r\d+, %r\d+;")
    for name, attn in (("full", attngen.compile()), ("document", attngen.compile(mask_mod=attngen.document(docs)))):
        spec = attn.spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
        first = spec.tile_choices()[0]
        assert first.wait_ns == 2000
        for ns in (0, 2000):
            d = tmp_path / f"{name}{ns}"
            ptx = _clean_rung_ptx(d, spec, dataclasses.replace(first, wait_ns=ns))
            assert f"constexpr uint32_t WAIT_NS = {ns};" in (d / render.BWD_KERNEL_SOURCE).read_text()
            # the loader's kv_empty, the producer's tile_full and ring slots, the writers' dq_full: four sites
            assert len(hinted.findall(ptx)) == (4 if ns else 0), (name, ns, len(hinted.findall(ptx)))
            # the writers' end check after each staging tests dq_done without suspending (a try_wait there held every
            # staging for its time limit: round D of session 36, the step 1.8x slower)
            assert ptx.count("mbarrier.test_wait.parity") == (1 if ns else 0), (name, ns)
    # on every rung but one: the split rung of masks at head dim 128, tried again without it
    # (test_sm90_backward_family_and_tiles)
    rungs = [r for hd in (64, 128) for r in tiles.sm90_bwd_ladder(hd) + tiles.sm90_bwd_ladder(hd, has_mask=True)
             + tiles.sm90_bwd_ladder(hd, has_score_mod=True, has_mask=True)]
    assert [r for r in rungs if r.wait_ns != 2000] == [dataclasses.replace(tiles.sm90_bwd_ladder(128, has_mask=True)[1],
                                                                           wait_ns=0)]
    for bad in (-1, 10_000_001):
        with pytest.raises(attngen.BuildError, match="wait_ns"):
            tiles.Sm90BwdTiles(wait_ns=bad)


@pytest.mark.requires_nvcc
@pytest.mark.parametrize("variant", ["full", "causal"])
def test_sm90_backward_scores_ahead_build_clean(variant, tmp_path):
    """Each step's S^T issued by the step before (Sm90BwdTiles.s_ahead = 2, under dQ's product; only on the staged
    rung at head dim 128) builds clean on full attention's and causal's split rung: no spills and its wgmmas not
    serialized (ptxas serializes all of them around one issued conditionally, which is why a walk's last step issues
    one on K's rows); its PTX has one S^T product more per step than each step issuing its own (the walk's first, the
    prologue's). Bad settings are refused."""
    attn = attngen.compile(causal=variant == "causal")
    spec = attn.spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
    first = next(r for r in spec.tile_choices() if r.block_q == 64)  # the split rung at 64 q rows (full: the second)
    assert first.split_probs and not first.s_ahead and not first.dkv_staged
    kmajor = {}
    for ahead in (2, 0):
        ptx = _clean_rung_ptx(tmp_path / f"ahead{ahead}", spec, dataclasses.replace(first, s_ahead=ahead))
        # S^T and dP^T are the kernel's only K-major (trans 0, 0) m64n64 products, 8 k16 steps each
        kmajor[ahead] = len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, "
                                       r"%rd\d+, %rd\d+, p, 1, 1, 0, 0;", ptx))
    assert kmajor == {0: 16, 2: 24}, kmajor
    # on the staged rung of masks at head dim 128 and on full attention's 80-row rung there, nowhere else
    assert not any(r.s_ahead for hd in (64, 128) for r in tiles.sm90_bwd_ladder(hd)[hd == 128:] + tiles.sm90_bwd_ladder(
        hd, has_mask=True, half_plane=True) + tiles.sm90_bwd_ladder(hd, has_score_mod=True, has_mask=True))
    assert [r.s_ahead for hd in (64, 128) for r in tiles.sm90_bwd_ladder(hd, has_mask=True) if r.s_ahead] == [2]
    assert tiles.sm90_bwd_ladder(128)[0].s_ahead == 2 and tiles.sm90_bwd_ladder(128)[0].block_q == 80
    with pytest.raises(attngen.BuildError, match="s_ahead"):
        tiles.Sm90BwdTiles(s_ahead=3)


def test_bad_tile_setting_is_its_own_error(monkeypatch):
    """A tile setting that cannot build (the packed dS^T multiply without the split pass) surfaces as that BuildError
    from the build, not as the one about a missing nvcc that a failure to compute the cache key otherwise becomes."""
    import attngen.jit.spec as spec

    monkeypatch.setattr(spec, "sm90_bwd_ladder",
                        lambda hd, **kw: (dataclasses.replace(tiles.SM90_BWD_TILES[hd], ds_mul_packed=True),))
    s = attngen.compile(causal=True).spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
    with pytest.raises(attngen.BuildError, match="set split_probs=True with it") as err:
        s.build_cached()
    assert "nvcc" not in str(err.value)


@pytest.mark.requires_nvcc
def test_sm90_backward_ds_stmatrix_and_packed_multiply_build_clean(tmp_path):
    """dS^T stored with stmatrix (Sm90BwdTiles.ds_stmatrix) and multiplied as bf16 pairs (ds_mul_packed), with delta
    read early (stats_early 1), on no rung: full attention's 80-row rung and causal's split rung build clean with the
    three (no spills, wgmmas not serialized; causal's spilled 648 bytes while P^T was packed after its masked paths
    joined), their PTX stores dS^T with stmatrix, multiplies with mul.rn.bf16x2 and reads delta with BQ / 8 loads of
    its own (lse too with stats_early 3), which the shipped rungs do not; an fp16 build keeps the fp32 products.
    ds_mul_packed and stats_early without the split pass are refused."""
    early_loads = re.compile(r"// begin inline asm\s*\n\s*ld\.shared\.v2\.f32")  # load_stat_pairs' volatile loads
    tid_reads = re.compile(r"mov\.u32 \t?%r\d+, %tid\.x;")
    for name, attn in (("full", attngen.compile()), ("causal", attngen.compile(causal=True))):
        spec = attn.spec(torch.bfloat16, 128, "sm_90a", kernel=SM90_BWD_KERNEL)
        first = spec.tile_choices()[0]
        # the shipped rung reads the statistics where they are used
        assert not early_loads.search(_rendered_ptx(tmp_path / f"{name}-shipped", spec.variant_inc(), torch.bfloat16,
                                                    128, first)), name
        assert not (first.ds_stmatrix or first.ds_mul_packed or first.stats_early)
        assert first.split_probs
        ptx = _clean_rung_ptx(tmp_path / name, spec, dataclasses.replace(first, ds_stmatrix=True, ds_mul_packed=True,
                                                                         stats_early=1))
        assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "mul.rn.bf16x2" in ptx, name
        assert len(early_loads.findall(ptx)) == first.block_q // 8, name
        # lse early too: the thread's place read again where each step and each tile's end use it (place_now), which
        # keeps full attention's 80 rows clean (held across the walk, it spilled 28 bytes)
        both = _clean_rung_ptx(tmp_path / f"{name}-both", spec, dataclasses.replace(
            first, ds_stmatrix=True, ds_mul_packed=True, stats_early=3))
        assert len(early_loads.findall(both)) == 2 * first.block_q // 8, name
        assert len(tid_reads.findall(both)) > len(tid_reads.findall(ptx)), name
        # lse and delta early without dS^T's options
        alone = _rendered_ptx(tmp_path / f"{name}-alone", spec.variant_inc(), torch.bfloat16, 128,
                              dataclasses.replace(first, stats_early=3))
        assert len(early_loads.findall(alone)) == 2 * first.block_q // 8, name
    shipped = [r for hd in (64, 128) for kw in ({}, dict(has_mask=True), dict(has_mask=True, half_plane=True),
                                                dict(has_score_mod=True)) for r in tiles.sm90_bwd_ladder(hd, **kw)]
    assert not any(r.ds_stmatrix or r.ds_mul_packed for r in shipped)
    fp16_inc = attngen.compile().spec(torch.float16, 128, "sm_90a", kernel=SM90_BWD_KERNEL).variant_inc()
    ptx = _rendered_ptx(tmp_path / "fp16", fp16_inc, torch.float16, 128, dataclasses.replace(first, ds_mul_packed=True))
    assert "constexpr bool DS_MUL_PACKED = 1;" in (tmp_path / "fp16" / render.BWD_KERNEL_SOURCE).read_text()
    assert "mul.rn.bf16x2" not in ptx and "mul.rn.f16x2" not in ptx
    with pytest.raises(attngen.BuildError, match="ds_mul_packed"):
        tiles.Sm90BwdTiles(ds_mul_packed=True)
    # the statistics read early (Sm90BwdTiles.stats_early, on no rung) need the split pass too
    with pytest.raises(attngen.BuildError, match="stats_early"):
        tiles.Sm90BwdTiles(stats_early=1)
    with pytest.raises(attngen.BuildError, match="stats_early must be 0"):
        tiles.Sm90BwdTiles(split_probs=True, stats_early=4)
