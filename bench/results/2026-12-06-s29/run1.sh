#!/usr/bin/env bash
# session 29 run 1: main beside main + q6k/q80 act-in-registers patches (lab heads, tg128, kernel test of both)
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_BENCH=OFF -DCMAKE_PREFIX_PATH=$PREFIX/usr \
  -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe test_cuda_kernels >> $OUT/build.log 2>&1; t "built: $?"
MOE=$B/moe MODEL=/tmp/q.gguf A=/tmp/ab-act-build
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
(bash scripts/device_ab.sh build > /tmp/ab.log 2>&1; cmake --build $A -j16 --target test_cuda_kernels >> /tmp/ab.log 2>&1) &
ABP=$!
TYPES=q6_k,q8_0,iq4_nl,q4_0,q5_0,q4_k
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 90 $B/tests/test_cuda_kernels 2>&1 | tail -2
t "lab main"; $MOE lab --type $TYPES -r 20 2>&1 | grep -E "output head|^Read|^## moe lab"
wait $ABP; t "act built: $(tail -1 /tmp/ab.log)"
t "kernels act"; timeout 90 $A/tests/test_cuda_kernels 2>&1 | tail -2
t "lab act"; $A/moe lab --type $TYPES -r 20 2>&1 | grep -E "output head|^Read|^## moe lab"
t "lab main again"; $MOE lab --type q6_k,q8_0,iq4_nl -r 20 2>&1 | grep -E "output head|^Read|^## moe lab"
t "lab act again"; $A/moe lab --type q6_k,q8_0,iq4_nl -r 20 2>&1 | grep -E "output head|^Read|^## moe lab"
wait $SYN; t synth
for v in $MOE $A/moe $MOE $A/moe; do t "tg128 $v"; $v bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"; done
t done
} > $OUT/experiment.log 2>&1
