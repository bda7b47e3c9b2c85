#!/usr/bin/env bash
# Session 42's device calls (scripts/round_s42.sh X on the H200; results in
# benchmarks/results/<date>-h200-session42/round-X/). Session 42 had no device lent: every round is prepared, none run.
# D: session 40's round D (the dS^T options' GPU test, their step A/B on full attention's and causal's rungs, joules
#    per step beside cuDNN), after unpacking FA4's first archive when the call carries it (carry [".fa4/a.tar.xz"]:
#    `python scripts/fa4_pack.py pack` makes both archives here).
# F: the next call, while the machine is still warm (its idle release is 30 s; carry [".fa4/b.tar.xz"]): FA4's second
#    archive unpacked beside the first, then bench_training.py --fa4 on the four anchors FA4's arguments express
#    (causal, full, softcap + causal, the window): FA4's SM90 forward + backward in the same rounds as attngen, flex and
#    cuDNN, the side-by-side figure issue 11's FA4 column has never had. Without the first archive it stops at once.
# G: after F on the same warm machine (FA4 unpacked there; carry nothing): Nsight Compute's full set on one warm launch
#    of FA4's backward main kernel and of ours (`G causal`, then `G full` in a call of its own), for the stall
#    reasons, pipes and traffic side by side (device_step.sh's ncu_profile; scripts/profile_case.py --fa4).
# H: where head dim 256 trains today (the portable sm80 backward on the H200: no sm90 backward has tiles for it):
#    bench_training.py at D = 256 on causal and full beside flex and cuDNN, the figure a sm90 backward at 256 (FA3's
#    64 x 64 tiles with dK and dV split over the head dim) would be measured against.
# E, C, B: session 41's (scripts/round_s41.sh): E the training table with wip/ds-rungs.patch (only after D finds the
#    options faster), C the backward suites and sanitizers on the landed tree, B session 39's dQ ablations.
set -uo pipefail
cd "$(dirname "$0")/.."
case "$1" in
  D)
    [ -f .fa4/a.tar.xz ] && python scripts/fa4_pack.py unpack .fa4/a.tar.xz
    bash scripts/round_s40.sh D ;;
  F)
    source scripts/device_step.sh  # environment, $R, pack_results
    python scripts/fa4_pack.py unpack .fa4/b.tar.xz || exit 1
    eval "$(python scripts/fa4_pack.py env)" || exit 1
    python -c "import flash_attn.cute, cutlass; print('FA4 from', flash_attn.cute.__file__)" 2>&1 | tail -n 3
    timeout 480 python benchmarks/bench_training.py --fa4 --variants causal full softcap_causal sliding_window \
      --out "$R" > "$R/training.log" 2>&1
    grep -E "^\||rror|FA4" "$R/training.log"
    pack_results ;;
  G)
    source scripts/device_step.sh  # environment, $R, ncu_profile, pack_results
    eval "$(python scripts/fa4_pack.py env)" || exit 1
    m=${2:-causal}
    ncu_profile "fa4-bwd-$m" FlashAttentionBackwardSm90 240 "$m" --fa4 --backward
    ncu_profile "bwd-$m" attngen_bwd_kernel 240 "$m" --backward
    pack_results ;;
  H)
    source scripts/device_step.sh  # environment, $R, pack_results
    timeout 540 python benchmarks/bench_training.py --head-dim 256 --variants causal full --out "$R" \
      > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    pack_results ;;
  E|C|B) bash scripts/round_s41.sh "$1" ;;
esac
