"""The docs' examples run as written: the ```python blocks of README.md, docs/user-guide.md and docs/cookbook.md,
and the mask specs of their `python -m attngen explain "..."` commands.

Convention (stated at the top of each page): a page's python blocks run in order, as one script, on a CPU-only
install (CPU tensors take the reference implementation). A block whose first line is `# needs: gpu` is skipped
without a CUDA GPU. Blocks fenced as anything but ```python (```text, bare ```) are not run.

Each page runs in a fresh temporary working directory (explain's png= writes there) and with the session's
isolated kernel cache (tests/conftest.py), so nothing reaches the user's home or cache.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/user-guide.md", "docs/cookbook.md"]
_BLOCK_RE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_EXPLAIN_RE = re.compile(r'python -m attngen explain "([^"]+)"((?:\s+--[\w-]+(?:\s+[^\s`-][^\s`]*)?)*)')


def python_blocks(page: str) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block of `page`."""
    text = (REPO / page).read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in _BLOCK_RE.finditer(text) if m.group(1) == "python"]


def test_blocks_are_found():
    counts = {page: len(python_blocks(page)) for page in PAGES}
    assert counts["README.md"] >= 1 and counts["docs/user-guide.md"] >= 4 and counts["docs/cookbook.md"] >= 7, counts
    assert explain_commands(), "no `explain` example found: test_explain_examples_have_no_dead_parts would run none"


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_run_on_cpu(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {"__name__": f"docs:{page}"}
    skipped = []
    for line, src in python_blocks(page):
        first = src.lstrip().splitlines()[0] if src.strip() else ""
        if first.startswith("# needs: gpu") and not torch.cuda.is_available():
            skipped.append(line)  # the block says it needs a GPU; this machine has none
            continue
        code = compile(src, f"{page}:{line}", "exec")
        try:
            exec(code, namespace)
        except Exception as e:
            raise AssertionError(f"the python block at {page}:{line} fails on CPU: {type(e).__name__}: {e}") from e
    if "png=" in "".join(src for _, src in python_blocks(page)):
        assert any(tmp_path.glob("*.png"))
    if skipped:
        pytest.skip(f"ran the other blocks of {page}; those at lines {skipped} start with `# needs: gpu` and this "
                    f"machine has no CUDA GPU")


def explain_commands() -> list[tuple[str, str, int]]:
    """(page, spec, q_len) of each `python -m attngen explain "SPEC" ...` in the docs."""
    out = []
    for page in PAGES:
        for m in _EXPLAIN_RE.finditer((REPO / page).read_text()):
            q_len = re.search(r"--q-len\s+(\d+)", m.group(2))
            out.append((page, m.group(1), int(q_len.group(1)) if q_len else 32768))
    return out


def _operands(node: ast.expr, op: type) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, op):
        return _operands(node.left, op) + _operands(node.right, op)
    return [node]


@pytest.mark.parametrize("page, spec, q_len", explain_commands())
def test_explain_examples_have_no_dead_parts(page, spec, q_len):
    """Every part of a documented combination changes the block map: dropping any operand of its top-level | or &
    gives another map (a `prefix_lm(2048) | sliding_window(512)` example showed a window that did nothing)."""
    import attngen
    from attngen.specs import parse_variant

    tree = ast.parse(spec, mode="eval").body
    op = type(tree.op) if isinstance(tree, ast.BinOp) and isinstance(tree.op, (ast.BitOr, ast.BitAnd)) else None
    if op is None:
        return
    parts = _operands(tree, op)
    sym = "|" if op is ast.BitOr else "&"
    full = attngen.block_map(parse_variant(spec, q_len), q_len, q_len)
    for i, dropped in enumerate(parts):
        rest = f" {sym} ".join(ast.unparse(p) for j, p in enumerate(parts) if j != i)
        assert not torch.equal(attngen.block_map(parse_variant(rest, q_len), q_len, q_len), full), (
            f"{page}: in `{spec}`, the part `{ast.unparse(dropped)}` changes nothing at q_len={q_len}"
        )
