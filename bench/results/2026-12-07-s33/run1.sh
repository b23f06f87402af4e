#!/usr/bin/env bash
# session 33 run 1: main with head blocks up to 128 positions (fact 80) on whatever card came: the GPU
# kernel test, the forward test with the attention's three ways in one sequence, tg128 + pp512, the head-block
# switch in one build (0 vs 128), depth 4096, then the lab. Carried with [".debs"]; ends by DEADLINE (400 s).
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( ${DEADLINE:-400} - $(date +%s) + T0 )); }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_CUDA_VERBOSE=ON -DMOE_BENCH=OFF \
  -DCMAKE_PREFIX_PATH=$PREFIX/usr -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe >> $OUT/build.log 2>&1; echo "built: $?" >> $OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
cmake --build $B -j16 --target test_cuda_kernels test_cuda_forward >> $OUT/build.log 2>&1; echo "tests built: $?" >> $OUT/build.log
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 100 $B/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(2040|700)|FAIL|passed"
t "forward, three ways"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=10 MOE_CUDA_ATTN_GROUPED_FROM=20 timeout 100 \
  $B/tests/test_cuda_forward 2>&1 | grep -E "^ok|FAIL|passed"
wait $SYN; t "synth: $(tr '\r' '\n' < /tmp/synth.log | tail -1)"
t "tg128 + pp512 (default)"; timeout 90 $MOE bench -m $MODEL -p 512 -n 128 -r 3 --device cuda > /tmp/b1.log 2>&1
sed -n '/^Read/,$p' /tmp/b1.log
for r in 1 2; do for u in 0 128; do
  t "tg128 UNTIL=$u"; MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=$u timeout 40 $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"
done; done
t "d4096"; timeout 60 $MOE bench -m $MODEL -p 0 -n 32 -r 2 -d 4096 --device cuda | grep "graph+PDL"
t done
} > $OUT/experiment.log 2>&1
[ "$(left)" -gt 60 ] || exit 0
timeout $(( $(left) - 10 )) $MOE lab -r 10 > $OUT/lab.md 2>&1; t "lab exit $?" >> $OUT/experiment.log
