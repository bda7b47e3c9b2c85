#!/bin/bash
# Reproduce: compile FA4 SM90 forward (hd128, bf16, B=2 S=8192 H=16) for sm_90a on CPU; dump PTX/cubin/SASS.
set -e
cd /tmp/s41/fa4fwd
export PATH=/tmp/cudabin2/nvidia/cu13/bin:$PATH
for n in causal noncausal; do
  d=dump_$([ $n = causal ] && echo c || echo nc); rm -rf $d; mkdir -p $d
  CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=$PWD/$d /tmp/venv/bin/python compile_fwd.py $n
  cp $d/*.ptx fwd_sm90_$n.ptx; cp $d/*.cubin fwd_sm90_$n.cubin
  nvdisasm -c fwd_sm90_$n.cubin > fwd_sm90_$n.sass 2>/dev/null          # labels, no hex (same form as the bwd artifacts)
  cuobjdump -sass fwd_sm90_$n.cubin > fwd_sm90_$n.cuobjdump.sass 2>/dev/null
  cuobjdump -res-usage fwd_sm90_$n.cubin > fwd_sm90_$n.res.txt
done
python3 loops.py fwd_sm90_noncausal.sass fwd_sm90_causal.sass > loops.txt
