#!/bin/bash
# FA4's SM90 forward (hd128, bf16, B=2 S=8192 H=16) compiled for sm_90a on the CPU, its PTX, cubin and SASS kept
# (a helper's run in session 41; /tmp/venv holds nvidia-cutlass-dsl 4.6.2 and quack-kernels 0.6.4, /tmp/fa4src FA4 at
# 0251105a). Usage: bash fa4_compile_fwd.sh REPO OUTDIR
set -e
repo=$1 out=$2
export PATH=/tmp/cudabin2/nvidia/cu13/bin:$PATH
for n in causal noncausal; do
  d=$out/dump_$n; rm -rf "$d"; mkdir -p "$d"  # the dump folder must exist, or nothing is kept
  CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=$d /tmp/venv/bin/python "$repo/scripts/fa4_sm90_compile.py" fwd $n
  cp "$d"/*.ptx "$out/fwd_sm90_$n.ptx"; cp "$d"/*.cubin "$out/fwd_sm90_$n.cubin"
  nvdisasm -c "$out/fwd_sm90_$n.cubin" > "$out/fwd_sm90_$n.sass" 2>/dev/null  # labels, no encodings
  cuobjdump -res-usage "$out/fwd_sm90_$n.cubin" > "$out/fwd_sm90_$n.res.txt"
done
