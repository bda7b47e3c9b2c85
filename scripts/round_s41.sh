#!/usr/bin/env bash
# Session 41's device calls (scripts/round_s41.sh X on the H200; results in
# benchmarks/results/<date>-h200-session41/round-X/). Session 41 had no device lent: every round is prepared, none run.
# D: session 40's round D (scripts/round_s40.sh D): the dS^T options' GPU test, their step A/B on full attention's and
#    causal's rungs, joules per step beside cuDNN.
# E: the training table with those options on every split rung (wip/ds-rungs.patch applied in this call's copy of the
#    tree: the ladder and its tests as they would land), then which rung each anchor's backward built. Run it after D
#    finds the options faster; the table is the one docs/performance.md would cite once the patch lands unchanged.
# C: the backward, deterministic and autograd suites and the small cases under memcheck and racecheck on the landed
#    tree (session 41 took the kv-block pairs out; with E's patch applied first when it lands).
# B: session 39's prepared round B (scripts/round_s39.sh B): dQ's staging alone, its product alone, half the staged
#    bytes, no fence, the consumers' dS barrier per consumer.
set -uo pipefail
cd "$(dirname "$0")/.."
case "$1" in
  D) bash scripts/round_s40.sh D ;;
  E)
    source scripts/device_step.sh  # environment, $R, training_table, pack_results
    git apply wip/ds-rungs.patch 2>/dev/null || patch -p1 < wip/ds-rungs.patch || exit 1
    python -c "import attngen.jit.tiles as t; r = t.sm90_bwd_ladder(128)[0]; print('first rung', r)" | tee "$R/rung.txt"
    training_table 420
    python - "$ATTNGEN_CACHE_DIR" <<'EOF' | tee "$R/built_rungs.txt"
import json, sys
from pathlib import Path
for meta in sorted(Path(sys.argv[1]).rglob("meta.json")):
    m = json.loads(meta.read_text())
    if str(m.get("tiles")).startswith("Sm90BwdTiles("):  # the rung each backward built, and its spills
        print(m.get("name", meta.parent.name), m.get("spill_bytes"), m.get("tiles"))
EOF
    pack_results ;;
  C) bash scripts/round_s40.sh C ;;
  B) bash scripts/round_s39.sh B ;;
esac
