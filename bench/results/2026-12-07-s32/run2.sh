#!/usr/bin/env bash
# session 32 run 2 (H100, warm after run 1): head blocks' switch point in one build (run 1's /tmp/moe-build, /tmp/q.gguf)
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MOE=/tmp/moe-build/moe MODEL=/tmp/q.gguf
ls -la $MOE $MODEL || exit 1
{
for r in 1 2; do for u in 0 128 512; do
  t "tg128 UNTIL=$u"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"
done; done
for d in 128 256 384; do for u in 0 1024; do
  t "d$d UNTIL=$u"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 64 -r 2 -d $d --device cuda | grep "graph+PDL"
done; done
t done
} > $OUT/experiment2.log 2>&1
