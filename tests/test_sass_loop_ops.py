"""scripts/sass_loop_ops.py finds a kernel's step loop in SASS text (branch targets as addresses or as labels) and
counts its opcodes, skipping the address ranges it is given."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("sass_loop_ops", ROOT / "scripts" / "sass_loop_ops.py")
loop_ops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loop_ops)


def sass(lines, labels=None):
    """cuobjdump-style lines, one instruction per 16 bytes from 0; labels: {index: name} put before instruction i."""
    out = []
    for i, text in enumerate(lines):
        if labels and i in labels:
            out.append(f"{labels[i]}:")
        out.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0000000000000000 */")
    return "\n".join(out)


# an outer loop (0x10 .. 0x90) around an inner one (0x20 .. 0x70) holding two HGMMA and a masked path (0x40 .. 0x60)
BODY = ["MOV R1, R2", "IADD3 R3, R3, 0x1, RZ", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
        "@P0 BRA 0x60", "@!P1 MUFU.EX2 R5, R5", "FSEL R6, R6, RZ, P2", "MUFU.EX2 R7, R7",
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24", "@P3 BRA 0x20", "@P4 BRA 0x10", "EXIT"]


def test_innermost_loop_with_addresses():
    (start, end), c = loop_ops.loop_ops(sass(BODY), min_hgmma=2)
    assert (start, end) == (0x20, 0x80)
    assert sum(c.values()) == 7 and c["HGMMA.64x64x16.F32.BF16"] == 2 and c["BRA"] == 2 and c["MUFU.EX2"] == 2


def test_labels_and_skipped_ranges():
    text = sass([t.replace("BRA 0x20", "BRA `(.L_x_1)") for t in BODY], labels={2: ".L_x_1"})
    (start, end), c = loop_ops.loop_ops(text, min_hgmma=2, skips=[(0x40, 0x60)])
    assert (start, end) == (0x20, 0x80)
    assert sum(c.values()) == 5 and c["FSEL"] == 0 and c["MUFU.EX2"] == 1  # the masked path's two left out


def test_no_loop_with_enough_products():
    with pytest.raises(SystemExit, match="no loop holds 3 HGMMA"):
        loop_ops.loop_ops(sass(BODY), min_hgmma=3)
