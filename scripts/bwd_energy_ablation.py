"""Where the training step's joules go in the sm90 backward: the step measured with one part of the backward taken out
at a time. Each ablation is a text change of the templates, made in a copy of the tree under --work (never in this
one, never in the real kernel cache); the copies' libraries are built in parallel, then `scripts/step_energy.py
--no-flex` runs in each copy in turn (attngen on the shipped ladder and cuDNN SDPA, interleaved rounds). An ablated
kernel computes wrong gradients on purpose: what it tells is how much time and energy the step would save if that
part cost nothing, an upper bound on what making it cheaper can buy. Under the card's power limit a step's joules
and its time move together; the cuDNN rows of each process show the run-to-run drift. Needs a GPU, except --build-only.

    python scripts/bwd_energy_ablation.py [--ablations base dq_add ...] [--variants causal full] [--work DIR]
        [--rounds 3] [--seconds 1.5] [--build-only] [--cuobjdump PATH]

Ablations (each a change of `ABLATIONS`' (file, old text, new text); the old text must occur where the entry says):
    base        none: the copy as it is, so the copies' drift against each other shows
    dq_add      the dQ writers hand the staged dQ back without adding it to dQ_acc (no bulk store or reduction)
    dq_stage    dq_add, and the consumers do not stage dQ in shared memory (the stores skipped at run time, so that
                dQ's product stays: --cuobjdump's HGMMA counts show which products a build kept)
    dq_product  dq_stage, and no dQ = dS K product (dQ zero)
    dq_product_only  no dQ = dS K product (dQ zero, staged and added as usual)
    ds_store    dS^T not stored to shared memory (dQ's product reads what is there)
    exp         P = exp2(y) replaced by one multiply of y (no MUFU.EX2; P of a similar magnitude, wrong)
    dk_product  no dK += dS^T Q product (dK zero): one register-operand product's share
    stage_half  dq_add, and the consumers stage half of dQ's floats (the same steps, half the bytes)
    dq_half     the consumers stage half of dQ's floats and the writers add half the bytes (first stores as well): the
                dQ path of a design whose partial sums cover twice the kv rows (a 2-CTA cluster exchanging dS)
    stage_nofence  dq_add, and no proxy fence between the staging stores and the writer's hand-over
    ds_bar      the consumers' barrier before dQ's product (both consumers' dS^T written) per consumer instead of
                across both, so that the two warpgroups do not run in step (dQ reads the other's half unfinished)

--set: attngen at other sm90 backward settings too in each copy (step_energy.py's, bwd_tiles_ab.py's syntax), built
with the copies.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T = "attngen/templates/"

# the stores skipped at run time (the scale is never 0), not compiled out: with dQ's accumulator unread ptxas drops
# dQ's product too (session 39's round A ran that form, so its dq_stage measured dq_product)
STAGE_DQ = ("bwd_sm90.cuh", "      stage_dq(sm.dq(cw), dq, p.tid);\n",
            "      if (a.scale == 0.f) stage_dq(sm.dq(cw), dq, p.tid);\n", 1)
DQ_ADD = ("bwd_dq.cuh", "        store_or_add_dq(a.dq_written + 2 * tile + DQ_CHUNK * cw, dst, buf);\n",
          "        (void)dst;\n", 1)
DQ_PRODUCT = ("bwd_sm90.cuh",
              "      wgmma_ss_mnmajor<Elem, DQ_T ? BQ : DQ_N, DQ_KSTEPS, 2048, DS_SW32 ? 512 : 2048>(dq, DQ_T ? desc_kt : desc_ds,\n"
              "                                                                                      DQ_T ? desc_ds : desc_kt);\n",
              "      (void)desc_ds;\n#pragma unroll\n      for (int x = 0; x < NDQ; ++x) dq[x] = 0.f;\n", 1)
STAGE_HALF = ("bwd_sm90.cuh", "  for (int v = 0; v < NDQ / 4; ++v)\n    asm volatile(\"st.shared.v4.f32",
              "  for (int v = 0; v < NDQ / 8; ++v)\n    asm volatile(\"st.shared.v4.f32", 1)
# (file under attngen/templates, old, new, occurrences: an exact count, or 0 for "at least one")
ABLATIONS = {
    "base": [],
    "dq_add": [DQ_ADD],
    "dq_stage": [DQ_ADD, STAGE_DQ],
    "dq_product": [DQ_ADD, STAGE_DQ, DQ_PRODUCT],
    "dq_product_only": [DQ_PRODUCT],
    "ds_store": [("bwd_sm90.cuh", "store_ds(ds, da, cw * 64 + p.r0, p.tig);", "fence_regs(da);", 0)],
    "exp": [("bwd_probs.cuh", "x = keep ? fast_exp2(y) : 0.f;", "x = keep ? y * 1e-5f : 0.f;", 0)],
    "stage_half": [DQ_ADD, STAGE_HALF],
    "dq_half": [STAGE_HALF,
                ("bwd_dq.cuh", "    bulk_store(dst, buf, DQ_STAGE_BYTES);\n", "    bulk_store(dst, buf, DQ_STAGE_BYTES / 2);\n", 1),
                ("bwd_dq.cuh", "  bulk_reduce_add_f32(dst, buf, DQ_STAGE_BYTES);\n",
                 "  bulk_reduce_add_f32(dst, buf, DQ_STAGE_BYTES / 2);\n", 0)],
    "stage_nofence": [DQ_ADD, ("bwd_sm90.cuh",
                               "      fence_proxy_async_smem();  // generic stores, read by the bulk reduction (the async proxy)\n",
                               "", 1)],
    "ds_bar": [("bwd_sm90.cuh", "if (DQ_SPLIT_D) named_bar_sync(BAR_DS, 128 * NUM_CONSUMERS);",
                "if (DQ_SPLIT_D) named_bar_sync(BAR_DS + cw, 128);", 1)],
    "dk_product": [("bwd_sm90.cuh",
                    "wgmma_rs_mnmajor<Elem, D, KSTEPS_Q>(dk, da, make_smem_desc_sw128(sm.q(stage), Q_BLOCK_BYTES, 1024));",
                    "fence_regs(da);", 0)],
}

BUILD = """
import sys
sys.path.insert(0, "benchmarks")
sys.path.insert(0, "scripts")
import torch
import attngen.jit.spec as spec
import bench_forward as bf
from tile_settings import bwd_rung_ladder
settings, keys = sys.argv[1].split(), sys.argv[2:]
shipped = spec.sm90_bwd_ladder
for key in keys:
    score_mod, mask_mod = bf.make_variant(key, 8192, 16, "cpu")
    attn = bf.make_attngen(score_mod, mask_mod)
    attn.spec(torch.bfloat16, 128, "sm_90a", "sm90").build_cached()
    for ladder in [shipped] + [bwd_rung_ladder(s) for s in settings]:
        spec.sm90_bwd_ladder = ladder
        attn.spec(torch.bfloat16, 128, "sm_90a", "sm90_bwd").build_cached()
"""


def hgmma_count(lib: Path, cuobjdump: str) -> int:
    """HGMMA instructions in the backward's main kernel of `lib` (an ablation must not lose products it keeps)."""
    out = subprocess.run([cuobjdump, "--dump-sass", str(lib)], capture_output=True, text=True, check=True).stdout
    body = out.split("attngen_bwd_kernel", 1)[1].split("Function :", 1)[0] if "attngen_bwd_kernel" in out else ""
    return sum("HGMMA" in line for line in body.splitlines())


def ablated_templates(name: str, templates: Path = ROOT / T) -> dict:
    """{template file name: its text with the ablation's changes made}, from the templates at `templates`; raises
    ValueError where an old text does not occur as often as its entry says (the template changed)."""
    texts = {}
    for file, old, new, count in ABLATIONS[name]:
        text = texts.get(file, (templates / file).read_text())
        found = text.count(old)
        if (count and found != count) or found == 0:
            raise ValueError(f"ablation {name}: {file} has {found} occurrences of {old.strip()[:60]!r}, expected "
                             f"{count or 'at least 1'}: the template changed, update ABLATIONS")
        texts[file] = text.replace(old, new)
    return texts


def make_copy(name: str, work: Path) -> Path:
    """A copy of the tree (package, scripts, benchmarks' code) under work/name with the ablation's changes made."""
    changed = ablated_templates(name)
    tree = work / name
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    shutil.copytree(ROOT / "attngen", tree / "attngen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "scripts", tree / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "benchmarks", tree / "benchmarks", ignore=shutil.ignore_patterns("results", "__pycache__"))
    for file, text in changed.items():
        (tree / T / file).write_text(text)
    return tree


def env_for(tree: Path, work: Path, name: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree), ATTNGEN_CACHE_DIR=str(work / f"cache-{name}"))


def rows_of(table: str) -> list:
    """(variant, implementation, ms, J) of step_energy.py's table."""
    out = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"[0-9.]+", cells[2]):
            joules = float(cells[3]) if re.fullmatch(r"[0-9.]+", cells[3]) else None
            out.append((cells[0], cells[1], float(cells[2]), joules))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ablations", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    p.add_argument("--variants", nargs="+", default=["causal", "full"])
    p.add_argument("--work", default="/tmp/attngen-ablation")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--build-only", action="store_true")
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump"),
                   help="prints each build's HGMMA count (default: cuobjdump on PATH; needs nvdisasm beside it)")
    p.add_argument("--set", nargs="*", default=[], dest="settings", metavar="FIELD=VALUE")
    args = p.parse_args(argv)
    work = Path(args.work)
    try:
        trees = {name: make_copy(name, work) for name in args.ablations}
    except ValueError as e:
        raise SystemExit(str(e))
    builds = {name: subprocess.Popen([sys.executable, "-c", BUILD, " ".join(args.settings), *args.variants], cwd=tree,
                                     env=env_for(tree, work, name), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
              for name, tree in trees.items()}
    failed = []
    for name, proc in builds.items():
        out, _ = proc.communicate()
        print(f"[build {name}] rc={proc.returncode} {out.strip().splitlines()[-1] if out.strip() else ''}", flush=True)
        if proc.returncode != 0:
            print(out[-3000:])
            failed.append(name)
        elif args.cuobjdump:
            libs = sorted((work / f"cache-{name}" / "entries").glob("*sm90_bwd*/libattngen_bwd.so"))
            print(f"  HGMMA in the main kernel: " + ", ".join(f"{lib.parent.name.split('_bf16')[0]} "
                                                          f"{hgmma_count(lib, args.cuobjdump)}" for lib in libs))
    if args.build_only:
        return 1 if failed else 0
    results = {}
    for name, tree in trees.items():
        if name in failed:
            continue
        run = subprocess.run([sys.executable, "scripts/step_energy.py", "--no-flex", "--variants", *args.variants,
                              "--rounds", str(args.rounds), "--seconds", str(args.seconds),
                              *(["--set", *args.settings] if args.settings else [])], cwd=tree,
                             env=env_for(tree, work, name), capture_output=True, text=True)
        print(f"[{name}] rc={run.returncode}\n{run.stdout.strip()}", flush=True)
        if run.returncode != 0:
            print(run.stderr[-3000:])
            continue
        results[name] = rows_of(run.stdout)
    base = {(v, i): (ms, j) for v, i, ms, j in results.get("base", [])}
    print("\n| ablation | variant | implementation | ms | J | cuDNN ms (same process) | ms vs base | J vs base |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        sdpa = {v: ms for v, i, ms, _ in rows if i.startswith("sdpa")}
        for v, i, ms, j in rows:
            if not i.startswith("attngen"):
                continue
            b = base.get((v, i))
            dms = f"{(ms / b[0] - 1) * 100:+.1f}%" if b else "-"
            dj = f"{(j / b[1] - 1) * 100:+.1f}%" if b and j and b[1] else "-"
            print(f"| {name} | {v} | {i} | {ms:.3f} | {j if j is not None else '-'} | {sdpa.get(v, '-')} | {dms} | {dj} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
