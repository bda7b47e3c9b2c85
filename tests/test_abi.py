"""The C ABI's facts have one Python home (attngen/abi.py): it must agree with the C headers."""
import re

from attngen import abi
from attngen.jit.render import TEMPLATE_DIR

_DEFINE = re.compile(r"^\s*#\s*define\s+(ATTNGEN_\w+)\s+(.+?)\s*(//.*)?$", re.M)


def _c_defines() -> dict:
    found = {}
    for p in sorted(TEMPLATE_DIR.iterdir()):
        if p.suffix in (".cuh", ".cu", ".h", ".j2"):
            for name, value, _ in _DEFINE.findall(p.read_text()):
                assert found.get(name, value) == value, f"{name} is defined twice with different values"
                found[name] = value
    return found


def _int(text: str) -> int:
    return int(text.strip("()"))


def test_python_abi_facts_match_the_c_headers():
    c = _c_defines()
    assert _int(c["ATTNGEN_ABI_VERSION"]) == abi.ABI_VERSION
    assert _int(c["ATTNGEN_MAX_CAPTURED"]) == abi.MAX_CAPTURED
    assert _int(c["ATTNGEN_MAX_SUMMARIES"]) == abi.MAX_SUMMARIES
    assert _int(c["ATTNGEN_MAX_PARAMS"]) == abi.MAX_PARAMS
    assert tuple(int(x) for x in re.findall(r"\d+", c["ATTNGEN_HEAD_DIMS"])) == abi.SUPPORTED_HEAD_DIMS
    codes = {name[len("ATTNGEN_"):]: _int(v) for name, v in c.items() if name.startswith("ATTNGEN_ERROR_")}
    python_codes = {name: getattr(abi, name) for name in dir(abi) if name.startswith("ERROR_")}
    assert codes == python_codes
    assert set(abi.SM90_FALLBACK_CODES) <= set(codes.values())


def test_no_other_module_restates_abi_facts():
    """Return codes and slot counts are imported from attngen.abi, never written again as literals."""
    from pathlib import Path

    root = Path(abi.__file__).parent
    for p in root.rglob("*.py"):
        if p.name == "abi.py":
            continue
        text = p.read_text()
        for code in (abi.ERROR_SM90_TMA_LAYOUT, abi.ERROR_SM90_NO_TMA_ENCODER, abi.ERROR_SCALE_NOT_POSITIVE):
            assert str(code) not in text, f"{p.relative_to(root)} restates return code {code}: import it from attngen.abi"
        assert not re.search(r"^\s*(MAX_CAPTURED|MAX_SUMMARIES|MAX_PARAMS|ABI_VERSION|SUPPORTED_HEAD_DIMS)\s*=", text, re.M), \
            f"{p.relative_to(root)} defines an ABI fact: import it from attngen.abi"


def _stale_library(version: int, called: list):
    """A stand-in for a ctypes handle: an attngen library of ABI `version` whose kernel-info functions record
    that they ran (a library of another ABI may fill a larger info struct than launch.AttngenKernelInfo)."""
    from types import SimpleNamespace

    def fn(result, name=None):
        def f(*args):
            if name:
                called.append(name)
            return result
        return f

    return SimpleNamespace(attngen_abi_version=fn(version), attngen_kernel_info=fn(0, "attngen_kernel_info"),
                           attngen_bwd_kernel_info=fn(0, "attngen_bwd_kernel_info"), attngen_fwd=fn(0),
                           attngen_bwd=fn(0), attngen_error_string=fn(b""),
                           attngen_decode_kernel_info=fn(0, "attngen_decode_kernel_info"), attngen_decode=fn(0))


def test_loaders_check_the_abi_version_before_the_kernel_info(monkeypatch):
    import pytest

    from attngen import launch
    from attngen.errors import BuildError

    called: list = []
    monkeypatch.setattr(launch.ctypes, "CDLL", lambda path: _stale_library(abi.ABI_VERSION + 1, called))
    with pytest.raises(BuildError, match=f"speaks attngen ABI version {abi.ABI_VERSION + 1}, this attngen expects"):
        launch.load_library("stale.so")
    with pytest.raises(BuildError, match=f"another backward ABI \\(ABI {abi.ABI_VERSION + 1}, backward ABI 0"):
        launch.load_bwd_library("stale_bwd.so")
    from attngen.decode import load_decode_library

    with pytest.raises(BuildError, match=f"another KV-cache ABI \\(ABI {abi.ABI_VERSION + 1}, KV-cache ABI 0"):
        load_decode_library("stale_decode.so")
    assert called == []
