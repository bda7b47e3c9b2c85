"""The command line: `--arch` acceptance and refusals, one-line errors (traceback only with --verbose), the
demo running what it announces, and the explain picture (axes, legend, tile size)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from attngen import cli, specs
from attngen.errors import BuildError, CacheError, InputError

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------- --arch


@pytest.mark.parametrize("arch, kernel, want", [
    ("sm_80", "auto", "sm_80"), ("sm_86", "auto", "sm_86"), ("sm_87", "sm80", "sm_87"), ("sm_89", "auto", "sm_89"),
    ("sm_90a", "auto", "sm_90a"), ("sm_90a", "sm90", "sm_90a"), ("SM_90A", "auto", "sm_90a"),
    ("sm_90", "sm80", "sm_90"),  # the portable kernel, asked for: plain sm_90, no note
])
def test_accepted_archs(arch, kernel, want):
    assert specs.resolve_arch(arch, kernel) == (want, None)


@pytest.mark.parametrize("kernel", ["auto", "sm90"])
def test_sm_90_means_sm_90a_for_the_sm90_kernel_and_says_so(kernel):
    arch, note = specs.resolve_arch("sm_90", kernel)
    assert arch == "sm_90a" and "sm_90a" in note and "--kernel sm80" in note


@pytest.mark.parametrize("arch", ["sm_75", "sm_70", "sm_100a", "sm_120", "90", "compute_90", "sm_90f", ""])
def test_other_archs_are_refused_listing_the_accepted_ones(arch):
    with pytest.raises(InputError) as ei:
        specs.resolve_arch(arch, "auto")
    msg = str(ei.value)
    assert f"--arch {arch} is not a target" in msg and all(a in msg for a in specs.ARCHS)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_sm90_kernel_on_another_arch_is_refused(arch):
    with pytest.raises(InputError, match=r"--kernel sm90 needs --arch sm_90a.*--kernel sm80"):
        specs.resolve_arch(arch, "sm90")


def test_arch_is_refused_before_anything_is_traced(monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("the variant was parsed before the arch was checked")

    monkeypatch.setattr(cli, "parse_variant", boom)
    assert cli.main(["compile", "causal()", "--arch", "sm_75"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attngen: error: --arch sm_75 is not a target")


class _Built(Exception):
    pass


def _fake_build(monkeypatch, result):
    from attngen.jit.spec import KernelSpec

    seen = {}

    def build_cached(self):
        seen.update(arch=self.arch, kernel=self.kernel)
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(KernelSpec, "build_cached", build_cached)
    return seen


def test_compile_sm_90_builds_the_sm90_kernel_for_sm_90a(monkeypatch, capsys, tmp_path):
    seen = _fake_build(monkeypatch, tmp_path / "lib.so")
    assert cli.main(["compile", "causal()", "--arch", "sm_90"]) == 0
    out, err = capsys.readouterr()
    assert seen == {"arch": "sm_90a", "kernel": "sm90"}
    assert out.strip() == str(tmp_path / "lib.so") and "builds for sm_90a" in err
    seen = _fake_build(monkeypatch, tmp_path / "lib.so")
    assert cli.main(["compile", "causal()", "--arch", "sm_90", "--kernel", "sm80"]) == 0
    assert seen == {"arch": "sm_90", "kernel": "sm80"}


# ----------------------------------------------------------------------------------------- one-line errors

COMPILER_OUTPUT = ("compiling the attention kernel failed in /x/tmp/abc (ninja exit 1). Compiler output:\n"
                   "[1/2] nvcc -c kernel.cu\nkernel.cu(12): error: identifier \"foo\" is undefined\n"
                   "1 error detected\nRe-run with ATTNGEN_VERBOSE=1 to see the command lines.")


@pytest.mark.parametrize("error, expect", [
    (BuildError(COMPILER_OUTPUT), 'First error: kernel.cu(12): error: identifier "foo" is undefined'),
    (CacheError("attngen cache: cannot write /c/tmp (Permission denied) while building x. Fix: ..."),
     "attngen: error: attngen cache: cannot write /c/tmp (Permission denied)"),
    (PermissionError(13, "Permission denied", "/c/locks/x.lock"), "attngen: error: Permission denied: /c/locks/x.lock"),
])
def test_errors_print_one_line_and_exit_1(monkeypatch, capsys, error, expect):
    _fake_build(monkeypatch, error)
    assert cli.main(["compile", "causal()", "--arch", "sm_80"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expect in err and "Traceback" not in err
    if isinstance(error, BuildError):
        assert "rerun with --verbose" in err
    # --verbose: the exception itself (the traceback, with the full compiler output)
    with pytest.raises(type(error)):
        cli.main(["compile", "causal()", "--arch", "sm_80", "--verbose"])


def test_bad_variant_spec_is_one_line(capsys):
    for spec in ["causal(", "sliding_window()", "open('x')", "causal() + causal()"]:
        assert cli.main(["explain", spec, "--q-len", "256"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("attngen: error:"), err


def test_cache_cli_error_is_one_line(tmp_path, capsys):
    from attngen.cache import ArtifactCache
    from attngen.cache.cli import main

    root = tmp_path / "open"
    root.mkdir()
    (root / "entries").mkdir()
    os.chmod(root, 0o777)
    assert main(["ls"], cache=ArtifactCache(root, prebuilt=None, readonly=())) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by group/others" in err and "chmod go-w" in err
    with pytest.raises(CacheError):
        main(["ls", "--verbose"], cache=ArtifactCache(root, prebuilt=None, readonly=()))


def test_python_dash_m_attngen_refusal_is_one_line_and_nonzero(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "ATTNGEN_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "attngen", "compile", "causal()", "--arch", "sm_75"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "sm_75 is not a target" in r.stderr and "sm_90a" in r.stderr
    assert not (tmp_path / "cache").exists()  # refused before anything touched the cache


# -------------------------------------------------------------------------------------------------- demo


@pytest.mark.heavy  # the reference at 5120 tokens and a 32k explain: a few seconds on 2 cores
def test_demo_runs_the_variant_it_announces(capsys):
    assert cli.main(["demo", "--cpu"]) == 0
    out = capsys.readouterr().out
    first, run = out.splitlines()[0], out.strip().splitlines()[-1]
    assert f"sliding window {cli.DEMO_WINDOW}" in first and f"sliding window {cli.DEMO_WINDOW}," in run
    assert "variant: softcap(30)+sliding_window(4096)" in out
    L = int(run.split(" L=")[1].split()[0])
    assert L > cli.DEMO_WINDOW and run.endswith("-> OK")  # long enough for the window to cut


# ------------------------------------------------------------------------------------------- explain png


def read_png(path: Path) -> torch.Tensor:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if tag == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = hdr[0], hdr[1]
    raw = torch.frombuffer(bytearray(zlib.decompress(idat)), dtype=torch.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(h, w, 3)


def _has_color(img, rgb):
    return bool((img == torch.tensor(rgb, dtype=torch.uint8)).all(-1).any())


def test_explain_png_has_axes_legend_and_tile_size(tmp_path):
    import attngen
    from attngen.blockmap import _PALETTE, _INK, _text_mask, _ticks

    png = tmp_path / "map.png"
    report = attngen.explain(attngen.chunked(512) | attngen.sliding_window(128), q_len=2048, block=(64, 64), png=str(png))
    assert f"picture: {png}" in report
    img = read_png(png)
    bm = attngen.block_map(attngen.chunked(512) | attngen.sliding_window(128), 2048, 2048, block=(64, 64))
    assert img.shape[0] > 512 and img.shape[1] > 512 + 100  # room for the axes, labels and legend
    for rgb in _PALETTE:  # the legend swatches at least (the map has all three classes too)
        assert _has_color(img, rgb)
    assert _has_color(img, _INK)

    ink = (img == torch.tensor(_INK, dtype=torch.uint8)).all(-1).float()[None, None]

    H, W = img.shape[:2]

    def find(mask, rows=(0, H), cols=(0, W)):  # the text drawn in ink there: its pixels inked, nothing else
        m = mask.float()[None, None]
        area = ink[..., rows[0]:rows[1], cols[0]:cols[1]]
        hits = torch.nn.functional.conv2d(area, m) == m.sum()
        inked = torch.nn.functional.conv2d(area, torch.ones_like(m)) == m.sum()
        return bool((hits & inked).any())

    bottom, left, right = (H - 60, H), (0, 80), (W - 200, W)
    assert find(_text_mask("BLOCK MAP, 32 X 32 TILES OF 64x64 (Q X KV)"), rows=(0, 40))
    assert find(_text_mask("KV BLOCK"), rows=bottom)
    assert find(_text_mask("Q BLOCK").T.flip(0), cols=(0, 40))  # the vertical axis label
    for text in ["EMPTY", "PARTIAL", "FULL"]:
        assert find(_text_mask(text), rows=(0, 150), cols=right), text
    for t in _ticks(32)[1:]:
        assert find(_text_mask(str(t)), rows=bottom) and find(_text_mask(str(t)), cols=left), t
    # the map: 16 x 16 pixels per tile, plus one 12 x 12 legend swatch per class
    for cls in (1, 2):
        n = int((img == torch.tensor(_PALETTE[cls], dtype=torch.uint8)).all(-1).sum())
        assert n == int((bm == cls).sum()) * 16 * 16 + 12 * 12, cls


def test_explain_png_of_a_downsampled_map_says_so(tmp_path):
    from attngen.blockmap import FULL, _INK, _text_mask, write_png

    bm = torch.full((2500, 3000), FULL, dtype=torch.int8)
    png = tmp_path / "big.png"
    write_png(bm, str(png), block=(128, 64))
    img = read_png(png)
    ink = (img == torch.tensor(_INK, dtype=torch.uint8)).all(-1)
    title = _text_mask("BLOCK MAP, 2500 X 3000 TILES OF 128x64 (Q X KV), 1 PIXEL = 3x3 TILES")
    assert bool((ink[8:8 + title.shape[0], 8:8 + title.shape[1]] == title).all())


def test_verbose_is_accepted_before_and_after_the_subcommand():
    """`-v cmd` and `cmd -v` both set it (a subcommand's own default must not undo the top-level flag)."""
    from attngen.cache import cli as cache_cli

    assert cli.build_parser().parse_args(["--verbose", "explain", "causal()"]).verbose is True
    assert cli.build_parser().parse_args(["explain", "causal()", "-v"]).verbose is True
    assert cli.build_parser().parse_args(["explain", "causal()"]).verbose is False
    assert cache_cli.build_parser().parse_args(["-v", "ls"]).verbose is True
    assert cache_cli.build_parser().parse_args(["ls"]).verbose is False
