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
    (start, end), c, _ = loop_ops.loop_ops(sass(BODY), min_hgmma=2)
    assert (start, end) == (0x20, 0x80)
    assert sum(c.values()) == 7 and c["HGMMA.64x64x16.F32.BF16"] == 2 and c["BRA"] == 2 and c["MUFU.EX2"] == 2


def test_labels_and_skipped_ranges():
    text = sass([t.replace("BRA 0x20", "BRA `(.L_x_1)") for t in BODY], labels={2: ".L_x_1"})
    (start, end), c, _ = loop_ops.loop_ops(text, min_hgmma=2, skips=[(0x40, 0x60)])
    assert (start, end) == (0x20, 0x80)
    assert sum(c.values()) == 5 and c["FSEL"] == 0 and c["MUFU.EX2"] == 1  # the masked path's two left out


def test_no_loop_with_enough_products():
    with pytest.raises(SystemExit, match="no loop holds 3 HGMMA"):
        loop_ops.loop_ops(sass(BODY), min_hgmma=3)


def test_attngen_skips_find_the_deterministic_block_and_the_masked_paths():
    """--attngen: the block the loop's first BSSY guards (a forward branch to its BSYNC) and the paths after the
    unmasked exponentials' unconditional branch, up to where it goes."""
    body = ["MOV R1, R2",                                   # 0x00
            "BSSY B0, 0x50",                                 # 0x10 loop top: the deterministic block's reconvergence
            "@P0 BRA 0x40",                                  # 0x20 not deterministic: to the BSYNC
            "STS [UR8+0x100], R9",                           # 0x30 the turn (skipped)
            "BSYNC B0",                                      # 0x40
            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",  # 0x50
            "@P1 BRA 0x90",                                  # 0x60 masked: to its path
            "MUFU.EX2 R5, R5",                               # 0x70 unmasked exponentials
            "BRA 0xb0",                                      # 0x80 to the join
            "FSEL R6, R6, RZ, P2",                           # 0x90 masked path (skipped)
            "@!P2 MUFU.EX2 R6, R6",                          # 0xa0
            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24",  # 0xb0 join
            "@P3 BRA 0x10",                                  # 0xc0
            "EXIT"]
    text = sass(body)
    _, c, skips = loop_ops.loop_ops(text, 2, attngen=True)
    assert skips == [(0x30, 0x40), (0x90, 0xb0)]
    assert sum(c.values()) == 9 and c["FSEL"] == 0 and c["STS"] == 0 and c["MUFU.EX2"] == 1


def test_attngen_skips_follow_each_join_up_to_the_next_product():
    """P^T packed on each of the masked / unmasked sides: the unmasked exponentials branch over the bounded path to
    their side's packing, which branches over the masked side to the join; both jumps are skipped, and nothing after
    the next product."""
    body = ["BSSY B0, 0x40",                                 # 0x00 loop top
            "@P0 BRA 0x30",                                  # 0x10
            "STS [UR8+0x100], R9",                           # 0x20 the deterministic turn (skipped)
            "BSYNC B0",                                      # 0x30
            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",  # 0x40
            "@P1 BRA 0xc0",                                  # 0x50 to the masked side
            "@P2 BRA 0x90",                                  # 0x60 to the bounded path
            "MUFU.EX2 R5, R5",                               # 0x70 unmasked, unbounded
            "BRA 0xa0",                                      # 0x80 to this side's packing
            "@!P5 MUFU.EX2 R5, R5",                          # 0x90 bounded (skipped)
            "F2FP.BF16.F32.PACK_AB R8, R5, R5",              # 0xa0 packing
            "BRA 0xe0",                                      # 0xb0 to the join
            "@!P3 MUFU.EX2 R6, R6",                          # 0xc0 masked side (skipped)
            "F2FP.BF16.F32.PACK_AB R8, R6, R6",              # 0xd0
            "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24",  # 0xe0 join: dV's product
            "@P4 BRA 0x0",                                   # 0xf0
            "EXIT"]
    text = sass(body)
    _, c, skips = loop_ops.loop_ops(text, 2, attngen=True)
    assert skips == [(0x20, 0x30), (0x90, 0xa0), (0xc0, 0xe0)]
    assert sum(c.values()) == 12 and c["MUFU.EX2"] == 1 and c["F2FP.BF16.F32.PACK_AB"] == 1


def test_op_classes_and_their_rows(tmp_path, capsys):
    assert [loop_ops.op_class(op) for op in ("HGMMA.64x64x16.F32.BF16", "WARPGROUP.DEPBAR.LE", "UIADD3.64", "UMOV",
                                             "BRA", "BSSY", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "BAR.SYNC.DEFER_BLOCKING",
                                             "MEMBAR.ALL.CTA", "FENCE.VIEW.ASYNC.S", "FFMA", "MUFU.EX2", "PLOP3.LUT",
                                             "R2UR", "STSM.16.M88.4")] == \
        ["tensor"] * 2 + ["uniform"] * 2 + ["control and sync"] * 6 + ["vector"] * 5
    f = tmp_path / "k.sass"
    f.write_text(sass(BODY))
    loop_ops.main([str(f), "--min-hgmma", "2", "--classes"])
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1].rstrip(" |") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| (") or line.startswith("| all")}
    # the inner loop 0x20 .. 0x80: HGMMA, BRA, MUFU, FSEL, MUFU, HGMMA, BRA
    assert rows == {"all": "7", "(vector)": "3", "(uniform)": "0", "(control and sync)": "2", "(tensor)": "2"}
