"""scripts/gpu_round.sh's split of the GPU suite over two device calls (steps tests1 / tests2) covers every GPU
test file exactly once, so a file added to tests/gpu/ is not silently left out of the device rounds."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_tests1_and_tests2_cover_every_gpu_test_file_once():
    script = (ROOT / "scripts" / "gpu_round.sh").read_text()
    first, second = (re.findall(r"tests/gpu/(test_\w+\.py)", block)
                     for block in re.findall(r'files="([^"]*)"', script, re.S))
    files = sorted(p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert sorted(first + second) == files, "each GPU test file in exactly one of tests1 / tests2"
