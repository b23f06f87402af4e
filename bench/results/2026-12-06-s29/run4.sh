#!/usr/bin/env bash
# session 29 run 4: the attention's merge spread over G blocks (working tree) beside main (dcb4f3f):
# GPU kernel and forward tests (per head and grouped), tg128, depth 4096, the layer timeline at 512
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_BENCH=OFF -DCMAKE_PREFIX_PATH=$PREFIX/usr \
  -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe test_cuda_kernels test_cuda_forward >> $OUT/build.log 2>&1; echo "built: $?" >> $OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
(bash scripts/device_ab.sh build > /tmp/ab.log 2>&1) &
ABP=$!
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 120 stdbuf -oL $B/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(2040|700)|FAIL|passed"
wait $ABP; t "base built: $(tail -1 /tmp/ab.log)"
wait $SYN; t synth
t "a/b"; MOE_AB_TIMELINE=512 timeout 330 bash scripts/device_ab.sh run
for s in 0 1; do t "tg128 MOE_CUDA_ATTN_SPREAD=$s"; MOE_CUDA_ATTN_SPREAD=$s $MOE bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"; done
t forward; timeout 150 $B/tests/test_cuda_forward 2>&1 | grep -E "^ok|FAIL|passed"
t done
} > $OUT/experiment.log 2>&1
