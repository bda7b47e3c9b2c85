"""Instructions per step of an attention kernel's main loop, from SASS text (cuobjdump -sass of one kernel, or the
files scripts/sm90_op_counts.py --sass-dir writes), side by side for several kernels: the innermost loop (a backward
branch and its target) holding at least --min-hgmma HGMMA, its opcodes counted (predicates dropped, modifiers kept).
Branch targets may be addresses (cuobjdump) or labels (nvdisasm's `(.L_x_12)`). A loop holding paths of which a step
takes one (a masked and an unmasked exponential, say) counts them all; --skip drops a range of addresses from one
file's count, so the table can show the path a step takes. No GPU needed.

    python scripts/sass_loop_ops.py ours.sass theirs.sass [--names ours FA4] [--skip 0:0x19e0-0x25c0] [--top 40]
        [--classes]

--skip I:START-END (hex, END exclusive) applies to the I-th file; it may be given more than once. --attngen I finds the
two ranges an interior step of attngen's sm90 backward does not take, in the I-th file: the block its first
reconvergence (BSSY) guards at the loop's top (the deterministic mode's turn, skipped by a forward branch) and, from
the unmasked exponentials to the next product, what each unconditional forward branch jumps over (the paths of masked
and bounded tiles). --classes adds a row per class of instruction (op_class): what each lane executes (vector), what
the uniform datapath executes once per warp, branches and synchronization, and the tensor cores' issues.
"""
import argparse
import re
from collections import Counter

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def parse(text: str) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(address, instruction text) in order, and each label's address (the next instruction's)."""
    insns, labels, pending = [], {}, []
    for line in text.splitlines():
        lm = LABEL.match(line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = INSN.match(line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((p, addr) for p in pending)
            pending = []
            insns.append((addr, m.group(2)))
    return insns, labels


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0]


def innermost_loop(insns, labels, min_hgmma: int) -> tuple[int, int]:
    """[start, end] addresses of the smallest loop (backward branch) holding at least min_hgmma HGMMA."""
    loops = []
    for addr, text in insns:
        if not opcode(text).startswith("BRA"):
            continue
        target = branch_target(text, labels)
        if target is None or target >= addr:
            continue
        body = [t for a, t in insns if target <= a <= addr]
        if sum(opcode(t).startswith("HGMMA") for t in body) >= min_hgmma:
            loops.append((len(body), target, addr))
    if not loops:
        raise SystemExit(f"no loop holds {min_hgmma} HGMMA")
    _, start, end = min(loops)
    return start, end


# op_class's classes, in the table's order
CLASSES = ("vector", "uniform", "control and sync", "tensor")
CONTROL = ("BRA", "BSSY", "BSYNC", "NOP", "EXIT", "RET", "CALL", "WARPSYNC", "NANOSLEEP", "SYNCS", "BAR", "MEMBAR",
           "FENCE", "ERRBAR", "DEPBAR")


def op_class(op: str) -> str:
    """The class of an opcode: tensor (HGMMA and its warpgroup fences and waits), uniform (the uniform datapath's U*
    instructions), control and sync (branches, reconvergence, barriers, fences), else vector."""
    if op.startswith(("HGMMA", "WARPGROUP")):
        return "tensor"
    if op.startswith("U"):
        return "uniform"
    if op.split(".")[0] in CONTROL:
        return "control and sync"
    return "vector"


def branch_target(text: str, labels) -> int | None:
    hexed = re.search(r"(0x[0-9a-f]+)\s*$", text)
    named = re.search(r"\((\.L_x_\d+)\)", text)
    return int(hexed.group(1), 16) if hexed else labels.get(named.group(1)) if named else None


def attngen_skips(body, labels) -> list[tuple[int, int]]:
    """The deterministic-mode block and the masked / bounded paths of attngen's sm90 backward step (--attngen), in the
    loop's (address, instruction) list."""
    bssy = next(k for k, (a, t) in enumerate(body) if opcode(t) == "BSSY")
    sync = branch_target(body[bssy][1], labels)
    det = next(k for k in range(bssy, len(body)) if body[k][1].startswith("@") and opcode(body[k][1]) == "BRA"
               and branch_target(body[k][1], labels) == sync - 0x10)
    skips = [(body[det][0] + 0x10, sync - 0x10)]
    # from the unmasked exponentials, each unconditional forward branch before the next product jumps over paths the
    # step does not take (masked or bounded tiles), to a join
    k = next(k for k, (a, t) in enumerate(body) if opcode(t) == "MUFU.EX2")
    index = {a: i for i, (a, _) in enumerate(body)}
    while True:
        k = next(i for i in range(k, len(body))
                 if opcode(body[i][1]).startswith("HGMMA") or body[i][1].startswith("BRA"))
        target = branch_target(body[k][1], labels) if body[k][1].startswith("BRA") else None
        if target is None or target <= body[k][0]:
            return skips
        skips.append((body[k][0] + 0x10, target))
        k = index[target]


def loop_ops(text: str, min_hgmma: int, skips=(), attngen: bool = False):
    """((start, end) of the step loop, its opcode counts, the ranges skipped: `skips` and with `attngen` those of
    attngen_skips)."""
    insns, labels = parse(text)
    start, end = innermost_loop(insns, labels, min_hgmma)
    body = [(a, t) for a, t in insns if start <= a <= end]
    skips = list(skips) + (attngen_skips(body, labels) if attngen else [])
    kept = [t for a, t in body if not any(lo <= a < hi for lo, hi in skips)]
    return (start, end), Counter(opcode(t) for t in kept), skips


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sass", nargs="+")
    p.add_argument("--names", nargs="+")
    p.add_argument("--skip", action="append", default=[], metavar="I:START-END")
    p.add_argument("--attngen", type=int, action="append", default=[], metavar="I",
                   help="skip the paths an interior step of attngen's sm90 backward does not take, in the I-th file")
    p.add_argument("--min-hgmma", type=int, default=20)
    p.add_argument("--top", type=int, default=40, help="rows of opcodes (most frequent over all files first)")
    p.add_argument("--classes", action="store_true", help="a row per class of instruction (op_class) after `all`")
    args = p.parse_args(argv)
    names = args.names or args.sass
    if len(names) != len(args.sass):
        p.error("--names needs one name per file")
    skips = {i: [] for i in range(len(args.sass))}
    for s in args.skip:
        m = re.fullmatch(r"(\d+):(0x[0-9a-f]+)-(0x[0-9a-f]+)", s)
        if not m or int(m.group(1)) >= len(args.sass):
            p.error(f"--skip {s!r}: expected I:0xSTART-0xEND with I a file's index")
        skips[int(m.group(1))].append((int(m.group(2), 16), int(m.group(3), 16)))
    counts = []
    for i, path in enumerate(args.sass):
        with open(path) as f:
            text = f.read()
        (start, end), c, skipped = loop_ops(text, args.min_hgmma, skips[i], attngen=i in args.attngen)
        counts.append(c)
        print(f"{names[i]}: loop {start:#x}-{end:#x}" + "".join(f", skipping {lo:#x}-{hi:#x}" for lo, hi in skipped))
    print("| opcode | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    print("| all | " + " | ".join(str(sum(c.values())) for c in counts) + " |")
    if args.classes:
        for cls in CLASSES:
            print(f"| ({cls}) | " + " | ".join(str(sum(n for op, n in c.items() if op_class(op) == cls)) for c in counts)
                  + " |")
    total = sum(counts, Counter())
    for op, _ in total.most_common(args.top):
        print(f"| {op} | " + " | ".join(str(c[op]) for c in counts) + " |")


if __name__ == "__main__":
    main()
