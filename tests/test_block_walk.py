"""The kernels' tile walks, run on the host: templates/block_range.cuh (forward: the kv tiles of each q-block)
and block_range_bwd.cuh (backward: the q tiles of each kv-block), compiled by g++ with a variant.inc rendered
from the real derivation, must visit every tile that has a kept element and call FULL only tiles that are.
Union masks (local + global tokens, prefix-LM, window + global) walk one range per disjunct (block_parts.cuh)
and must jump the gaps between them: the classifier is asked about no tile outside the parts."""
from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

import attngen
from attngen.analysis import analyze
from attngen.codegen import render_variant_inc

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import mask_zoo  # noqa: E402
from codegen_cases import COMMON_STUB, param_setup, run_host_program  # noqa: E402

TEMPLATES = Path(attngen.__file__).parent / "templates"


def _local_global(b, h, q_idx, kv_idx):
    return (torch.abs(q_idx - kv_idx) <= 40) | (kv_idx < 9) | (q_idx < 5)


def _window_global(b, h, q_idx, kv_idx):
    return ((q_idx >= kv_idx) & (q_idx - kv_idx < 50)) | ((kv_idx < 6) & (q_idx >= kv_idx))


def _causal_and_union(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & ((q_idx - kv_idx < 30) | (kv_idx < 7))


CASES = {
    "local_global": attngen.MaskMod(_local_global, "local_global"),
    "window_global": attngen.MaskMod(_window_global, "window_global"),
    "causal_and_union": attngen.MaskMod(_causal_and_union, "causal_and_union"),
    "prefix_lm": attngen.prefix_lm(37),
    # five disjuncts (prefix-LM is two), runtime parameters in each: the walk's four parts are groups of them
    "union_of_five": attngen.prefix_lm(20) | attngen.sliding_window(45) | attngen.chunked(64) | attngen.local(3, 5),
    "causal": attngen.causal(),  # not a union: the walk without parts
    # integer division and clamps at image borders: the printer's lowering of floor / ceiling (FloorDiv) in
    # classifiers of thousands of operations, rebuilt without re-evaluation (printer.lower_int_division)
    "natten_2d": attngen.MaskMod(mask_zoo._natten_2d(256, W=32, K=2), "natten_2d"),
    "tiled_natten_2d": attngen.MaskMod(mask_zoo._tiled_natten_2d(512, W=32, T=4, K=1), "tiled_natten_2d"),
    "chunked_causal": attngen.MaskMod(mask_zoo.make("chunked_causal", 300, small=True), "chunked_causal"),
    "dilated_natten_1d": attngen.MaskMod(mask_zoo.make("dilated_natten_1d", 300, small=True), "dilated_natten_1d"),
}


# walks that visit no empty tile (the others are sound: unions grouped into parts are not exact, and the NATTEN
# masks are exact only within their image, which these shapes run past: block_map is inexact there too)
EXACT_WALKS = ("local_global", "window_global", "prefix_lm", "causal")


def _brute(mask, q_len, kv_len, q_off, BQ, BK):
    q = torch.arange(q_len)[:, None] + q_off
    kv = torch.arange(kv_len)[None, :]
    m = torch.broadcast_to(torch.as_tensor(mask(torch.tensor(0), torch.tensor(0), q, kv)), (q_len, kv_len))
    nqb, nkb = -(-q_len // BQ), -(-kv_len // BK)
    pad = torch.zeros(nqb * BQ, nkb * BK, dtype=torch.int8)
    valid = torch.zeros_like(pad)
    pad[:q_len, :kv_len] = m.to(torch.int8)
    valid[:q_len, :kv_len] = 1
    kept = pad.reshape(nqb, BQ, nkb, BK).sum((1, 3))
    size = valid.reshape(nqb, BQ, nkb, BK).sum((1, 3))
    return kept > 0, kept == size


def _program(name, shapes, setup):
    """A host program walking both directions for each (q_len, kv_len, q_off, BQ, BK): lines 'F i j full'
    (forward visits), 'B j i full' (backward visits), 'V j i' (the tiles q_tile_visited says kv block j's walk
    visits: the deterministic backward orders dQ's additions by it) and 'R j h i full' (the backward's walk rotated,
    block_range_bwd.cuh walk_rotation with shift 3, over two query heads of one kv head), then 'END'."""
    body = []
    for q_len, kv_len, q_off, BQ, BK in shapes:
        body.append(f"""  {{
    TileArgs t{{{q_len}, {kv_len}, {q_off}, 0, 0}};
    const int nqb = {-(-q_len // BQ)}, nkb = {-(-kv_len // BK)};
    forward = true;
    wasted = 0;
    for (int i = 0; i < nqb; ++i) {{
      const KvRange r = kv_range<{BQ}, {BK}>(c, t, i);
      for (int j = next_kv_tile<{BQ}, {BK}>(c, t, i, r.j_begin, r.j_end, r.f_lo, r.f_hi, r); j < r.j_end;
           j = next_kv_tile<{BQ}, {BK}>(c, t, i, j + 1, r.j_end, r.f_lo, r.f_hi, r)) {{
        const bool full = (j >= r.f_lo && j < r.f_hi) || (ATTNGEN_NEEDS_CLASSIFIER && tile_all<{BQ}, {BK}>(c, t, i, j));
        printf("F %d %d %d\\n", i, j, (int)full);
      }}
    }}
    forward = false;
    printf("W %d\\n", wasted);
    for (int j = 0; j < nkb; ++j) {{
      for (QStep s = next_q_tile<{BQ}, {BK}>(c, t, j, q_range<{BQ}, {BK}>(c, t, j), 1); s.h < 1;) {{
        printf("B %d %d %d\\n", j, s.i, (int)!q_tile_masked<{BQ}, {BK}>(c, t, s, j));
        ++s.i;
        s = next_q_tile<{BQ}, {BK}>(c, t, j, s, 1);
      }}
      for (int i = 0; i < nqb; ++i)
        if (q_tile_visited<{BQ}, {BK}>(c, t, i, j)) printf("V %d %d\\n", j, i);
      for (QStep s = next_q_tile<{BQ}, {BK}>(c, t, j, q_range<{BQ}, {BK}>(c, t, j, 3), 2, 3); s.h < 2;) {{
        printf("R %d %d %d %d\\n", j, s.h, s.i, (int)!q_tile_masked<{BQ}, {BK}>(c, t, s, j));
        ++s.i;
        s = next_q_tile<{BQ}, {BK}>(c, t, j, s, 2, 3);
      }}
    }}
    printf("END\\n");
  }}""")
    return f"""namespace v_{name} {{
#include "{name}.inc"
// the classifier, watched: how often the forward walk asks it about a tile that turns out EMPTY
static bool forward = false;
static int wasted = 0;
template <int BQ, int BK>
bool tile_any(const CapturedArgs& c, const TileArgs& t, int i, int j) {{
  const bool any = tile_any_derived<BQ, BK>(c, t, i, j);
  if (forward && !any) ++wasted;
  return any;
}}
#include "block_range.cuh"
#include "block_range_bwd.cuh"
using namespace attngen;
void run() {{
  CapturedArgs c;
  memset(&c, 0, sizeof(c));
{chr(10).join(setup)}
{chr(10).join(body)}
}}
}}  // namespace v_{name}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_tile_walks_visit_every_kept_tile_and_only_prove_full_tiles(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    shapes = [(300, 300, 0, 16, 8)]  # long gaps between the global columns and the band
    for _ in range(5):
        BQ, BK = rng.choice([8, 16, 32]), rng.choice([8, 16, 32])
        shapes.append((rng.randint(1, 300), rng.randint(1, 300), rng.choice([0, rng.randint(0, 90)]), BQ, BK))
    head = ("#define __host__\n#define __device__\n#define __forceinline__ inline\n#define ATTNGEN_DEV_INLINE inline\n"
            "#include <algorithm>\n#include <cmath>\n#include <cstdio>\n#include <cstring>\nusing std::max;\nusing std::min;\n"
            '#include "attngen_common.cuh"\n')
    preds, outs = {}, []
    for name, mod in CASES.items():  # one program each: the headers are #pragma once
        d = tmp_path / name
        d.mkdir()
        (d / "attngen_common.cuh").write_text(COMMON_STUB)
        for header in ("variant_math.cuh", "block_parts.cuh", "block_range.cuh", "block_range_bwd.cuh"):
            (d / header).write_text((TEMPLATES / header).read_text())
        traced, p = analyze(attngen.Variant(mask_mod=mod))
        preds[name] = p
        (d / f"{name}.inc").write_text(render_variant_inc(traced, p).replace(" tile_any(", " tile_any_derived("))
        outs.append(run_host_program(d, [head, _program(name, shapes, param_setup(traced))], [f"  v_{name}::run();"]))
    out = "".join(outs)
    assert preds["local_global"].kv_parts and preds["local_global"].q_parts  # the walk under test has parts
    assert not preds["causal"].kv_parts
    assert len(preds["union_of_five"].kv_parts) == 4 and len(preds["union_of_five"].q_parts) == 4

    blocks = out.split("END\n")
    turned = 0  # rotated walks that start elsewhere than the plain ones
    for n, name in enumerate(CASES):
        for s, (q_len, kv_len, q_off, BQ, BK) in enumerate(shapes):
            ctx = f"seed {seed}: {name} q_len={q_len} kv_len={kv_len} q_off={q_off} block=({BQ},{BK})"
            any_, all_ = _brute(CASES[name].fn, q_len, kv_len, q_off, BQ, BK)
            fwd = torch.zeros_like(any_, dtype=torch.int8)
            bwd = torch.zeros_like(any_, dtype=torch.int8)
            wasted = None
            lines = blocks[n * len(shapes) + s].strip().splitlines()
            # a rotated backward walk: per kv block and head (the masks do not read h), the plain walk's steps
            # turned around, head 0's before head 1's
            plain, rotated, heads, said_visited = {}, {}, {}, set()
            for ln in lines:
                if ln[0] == "V":
                    _, j, i = ln.split()
                    said_visited.add((int(j), int(i)))
                elif ln[0] == "B":
                    _, j, i, full = ln.split()
                    plain.setdefault(int(j), []).append((int(i), int(full)))
                elif ln[0] == "R":
                    _, j, h, i, full = ln.split()
                    rotated.setdefault((int(j), int(h)), []).append((int(i), int(full)))
                    heads.setdefault(int(j), []).append(int(h))
            for j, steps in plain.items():
                assert heads[j] == sorted(heads[j]), f"{ctx}: kv block {j}'s rotated walk goes back to an earlier head"
                for h in (0, 1):
                    got = rotated.get((j, h), [])
                    assert any(got == steps[k:] + steps[:k] for k in range(len(steps))), \
                        f"{ctx}: kv block {j}, head {h}: rotated walk {got} is not a turn of {steps}"
                    turned += got != steps
            assert {j for j, _ in rotated} <= set(plain), f"{ctx}: a rotated walk visits a kv block the plain one skips"
            walked = {(j, i) for j, steps in plain.items() for i, _ in steps}
            assert said_visited == walked, \
                f"{ctx}: q_tile_visited and the walk disagree on {sorted(said_visited ^ walked)[:5]}"
            for line in lines:
                if line.startswith("W "):
                    wasted = int(line.split()[1])
                    continue
                if line[0] in "RV":
                    continue
                kind, a, b, full = line.split()
                a, b, full = int(a), int(b), int(full)
                target, (i, j) = (fwd, (a, b)) if kind == "F" else (bwd, (b, a))
                assert target[i, j] == 0, f"{ctx}: tile ({i}, {j}) visited twice ({kind})"
                target[i, j] = 1 + full
            for walk, label in ((fwd, "forward"), (bwd, "backward")):
                missed = any_ & (walk == 0)
                assert not missed.any(), f"{ctx}: {label} walk skips kept tiles {missed.nonzero()[:5].tolist()}"
                wrong_full = (walk == 2) & ~all_
                assert not wrong_full.any(), f"{ctx}: {label} walk calls partial tiles FULL {wrong_full.nonzero()[:5].tolist()}"
            if name in EXACT_WALKS:  # no empty tile visited
                extra = (fwd > 0) & ~any_
                assert not extra.any(), f"{ctx}: forward walk visits empty tiles {extra.nonzero()[:5].tolist()}"
            if name in ("local_global", "window_global"):
                # the gaps are jumped, not classified tile by tile; an empty part may still offer one block
                # (block_range_from_hull), which the classifier turns down
                nqb = -(-q_len // BQ)
                limit = nqb * len(preds[name].kv_parts)
                assert wasted <= limit, f"{ctx}: the forward walk asked the classifier about {wasted} empty tiles"
    assert turned > 0, "no rotated walk started anywhere but at its range's first block: the rotation is untested"
