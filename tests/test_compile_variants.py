"""Every library variant, through the whole pipeline (trace -> predicates -> codegen -> template),
really compiles with nvcc for sm_80 and sm_90a: one ninja graph, all objects built in parallel."""
import os

import pytest
import torch

import attngen
from attngen.jit import ninja, render
from attngen.codegen import render_variant_inc

pytestmark = pytest.mark.requires_nvcc


def library() -> dict:
    """The library variants, compiled (traced and derived) when the test runs, not at collection."""
    _DOCS = torch.randint(0, 8, (4096,)).sort().values
    _TABLE = torch.randn(16, 8192, dtype=torch.bfloat16)
    return {
        "causal": attngen.compile(causal=True),
        "sliding_window": attngen.compile(window=1024),
        "local": attngen.compile(window=(256, 128)),
        "softcap": attngen.compile(softcap=30.0),
        "alibi": attngen.compile(score_mod=attngen.alibi(16), causal=True),
        "alibi_tensor": attngen.compile(score_mod=attngen.alibi(torch.rand(16))),
        "prefix_lm": attngen.compile(mask_mod=attngen.prefix_lm(2048)),
        "chunked": attngen.compile(mask_mod=attngen.chunked(1024)),
        "document": attngen.compile(mask_mod=attngen.document(_DOCS)),
        "block_diagonal": attngen.compile(mask_mod=attngen.block_diagonal(512)),
        "dilated": attngen.compile(mask_mod=attngen.dilated(1024, 4)),
        # library numbers baked in (specialize=True): the constant-folded form of the runtime-parameter builds above
        "softcap_window_specialised": attngen.compile(score_mod=attngen.softcap(30.0, specialize=True),
                                                      mask_mod=attngen.sliding_window(1024, specialize=True)),
        "chunked_dilated_specialised": attngen.compile(mask_mod=attngen.chunked(1024, specialize=True)
                                                       | attngen.dilated(512, 4, specialize=True)),
        "combo": attngen.compile(score_mod=lambda s, b, h, q, k: s + _TABLE[h, q - k + 4096], softcap=20.0,
                                 mask_mod=(attngen.prefix_lm(64) | attngen.sliding_window(512)) & ~attngen.block_diagonal(2048)),
    }


def test_every_library_variant_compiles(tmp_path):
    LIBRARY = library()
    TARGETS = [(n, arch) for arch in ("sm_80", "sm_90a") for n in LIBRARY]
    sources, shared = {}, {}
    for name, arch in TARGETS:
        attn = LIBRARY[name]
        inc = render_variant_inc(attn.traced, attn.predicates)
        files = render.render_sources(inc, torch.bfloat16, 128, arch)
        d = f"{arch}/{name}"
        for fn, text in files.items():
            if fn.endswith(".cu") or fn == render.VARIANT_INCLUDE:
                sources[f"{d}/{fn}"] = text
            else:
                shared[fn] = text
    by_arch = {}
    for path, text in sources.items():
        by_arch.setdefault(path.split("/")[0], {})[path.split("/", 1)[1]] = text
    libs = []
    for arch, files in by_arch.items():
        bd = tmp_path / arch
        libs += ninja.write_build_ninja(bd, {**shared, **files}, arch)
    # one ninja per arch directory; jobs = cores
    for arch in by_arch:
        ninja.run_ninja(tmp_path / arch, jobs=os.cpu_count() or 2)
    for lib in libs:
        assert os.path.getsize(lib) > 10000, lib
    assert len(libs) == len(TARGETS)
