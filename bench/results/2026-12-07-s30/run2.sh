#!/usr/bin/env bash
# session 30 run 2 (short budget; written, never started): decode attention by head blocks (head-blocks.patch
# applied) against the per-head way in one build
# (MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=0: per head at every position, main's kernel): GPU kernel and forward
# tests, tg128 alternated, depths 512 and 1024, the layer timeline at 512 both ways.
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_BENCH=OFF \
  -DCMAKE_PREFIX_PATH=$PREFIX/usr -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe test_cuda_kernels test_cuda_forward >> $OUT/build.log 2>&1; echo "built: $?" >> $OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 60 stdbuf -oL $B/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(2040|700)|FAIL|passed"
t forward; timeout 60 $B/tests/test_cuda_forward 2>&1 | grep -E "^ok|FAIL|passed"
wait $SYN; t synth
for r in 1 2; do for u in 0 512; do
  t "tg128 UNTIL=$u"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"
done; done
for d in 512 1024; do for u in 0 1024; do
  t "d$d UNTIL=$u"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 32 -r 2 -d $d --device cuda | grep "graph+PDL"
done; done
for gb in 2 4; do
  t "d512 MOE_CUDA_ATTN_BLOCK_HEADS=$gb"
  MOE_CUDA_ATTN_BLOCK_HEADS=$gb $MOE bench -m $MODEL -p 0 -n 32 -r 2 -d 512 --device cuda | grep "graph+PDL"
done
for u in 0 512; do
  t "timeline 512 UNTIL=$u"
  MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 16 -r 1 --device cuda --profile=512 2>&1 |
    awk -F'|' '/decode step by stage/{s=1} /inside the graph/{s=2}
      s==1 && /^\| [a-z*]/ && $2 !~ /stage/{printf "|%s| in graph %s us/token |\n", $2, $(NF-2)}
      s==2 && /^\| [a-z]/'
done
t done
} > $OUT/experiment.log 2>&1
