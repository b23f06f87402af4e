#!/usr/bin/env bash
# session 30 run 1 (written, never started: no device came): decode attention by head blocks (the working
# tree with head-blocks.patch applied) beside main (`bash scripts/device_ab.sh pack main=HEAD` first): GPU
# kernel and forward tests, tg128 x2, depths 512/1024/4096, the layer timeline at 512, the head-block switch
# point and heads a block (1, 2, 4); then the full lab on this card, the streamed head in the step, and Nsight
# Compute on the Q4_K head.
# Carried as .carry/runA.sh with [".debs", ".carry"]; ends by DEADLINE seconds (560).
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_CUDA_VERBOSE=ON -DMOE_BENCH=OFF \
  -DCMAKE_PREFIX_PATH=$PREFIX/usr -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe test_cuda_kernels test_cuda_forward >> $OUT/build.log 2>&1; echo "built: $?" >> $OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
(bash scripts/device_ab.sh build > /tmp/ab.log 2>&1) &
ABP=$!
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 120 stdbuf -oL $B/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(2040|700)|FAIL|passed"
t forward; timeout 150 $B/tests/test_cuda_forward 2>&1 | grep -E "^ok|FAIL|passed"
wait $ABP; t "base built: $(tail -1 /tmp/ab.log)"
wait $SYN; t synth
t "a/b"; MOE_AB_SASS=attention MOE_AB_TIMELINE=512 MOE_AB_DEPTHS="512 1024 4096" timeout 300 bash scripts/device_ab.sh run
for u in 0 512 1024 2048; do
  for d in 512 1024; do
    t "d$d MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u"
    MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u $MOE bench -m $MODEL -p 0 -n 64 -r 2 -d $d --device cuda | grep "graph+PDL"
  done
done
for gb in 1 2 4; do
  t "tg128 MOE_CUDA_ATTN_BLOCK_HEADS=$gb"
  MOE_CUDA_ATTN_BLOCK_HEADS=$gb $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"
  for d in 512 1024; do
    t "d$d MOE_CUDA_ATTN_BLOCK_HEADS=$gb UNTIL=1024"
    MOE_CUDA_ATTN_BLOCK_HEADS=$gb MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=1024 $MOE bench -m $MODEL -p 0 -n 64 -r 2 -d $d \
      --device cuda | grep "graph+PDL"
  done
done
for mb in 0 64; do t "tg128 MOE_CUDA_STREAM_MB=$mb"; MOE_CUDA_STREAM_MB=$mb $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"; done
t done
} > $OUT/experiment.log 2>&1
left() { echo $(( ${DEADLINE:-560} - $(date +%s) + T0 )); }
[ "$(left)" -gt 150 ] || exit 0
timeout $(( $(left) - 90 )) $MOE lab -r 10 > $OUT/lab.md 2>&1; t "lab exit $?" >> $OUT/experiment.log
[ "$(left)" -gt 60 ] || exit 0
# the Q4_K GEMVs of the lab (ROWS_ACT and ROWS_STREAM): grid, time and where warps wait, every launch
timeout $(( $(left) - 15 )) ncu --clock-control base -k "regex:gemv_kernelI8fmt_q4_kLi0ELi[12]E" --launch-count 24 \
  --section LaunchStats --section WarpStateStats --section SourceCounters --section SpeedOfLight --print-details all \
  $MOE lab --type q4_k -r 2 > $OUT/ncu_q4k_head.txt 2>&1
t "ncu exit $?" >> $OUT/experiment.log
gzip -9 $OUT/ncu_q4k_head.txt
