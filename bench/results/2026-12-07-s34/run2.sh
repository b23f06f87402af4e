#!/usr/bin/env bash
# session 34 run 2: the f16 batches as landed (wide batches in the per-head way only; head blocks keep f32's 8
# positions, which run 1 found 2.3% faster at depth 0) against main packed beside it (carry [".debs", ".carry"],
# .carry/main.tar from `bash scripts/device_ab.sh pack main=HEAD` at 2b33695): the GPU kernel test on the working tree,
# then tg32 with an f16 cache at depths 0, 160, 512 and 1024 and with an f32 cache at 512, the builds in turn.
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_CUDA_VERBOSE=ON -DMOE_BENCH=OFF \
  -DCMAKE_PREFIX_PATH=$PREFIX/usr -DCMAKE_LIBRARY_PATH=$LIBDIR > $OUT/build.log 2>&1
cmake --build $B -j16 --target moe >> $OUT/build.log 2>&1; echo "built: $?" >> $OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
(timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1) &
SYN=$!
(bash scripts/device_ab.sh build > /tmp/ab-build.log 2>&1) &
AB=$!
cmake --build $B -j16 --target test_cuda_kernels >> $OUT/build.log 2>&1; echo "tests built: $?" >> $OUT/build.log
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 100 $B/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(pos=(2040|700|200)).*f16|FAIL|passed"
wait $SYN; t "synth: $(tr '\r' '\n' < /tmp/synth.log | tail -1)"
wait $AB; t "main built: $(tail -1 /tmp/ab-build.log)"
MAIN=/tmp/ab-main-build/moe
for r in 1 2; do
  for d in 0 160 512 1024; do
    for v in new main; do
      m=$MOE; [ $v = main ] && m=$MAIN
      t "$v f16 d$d: $(timeout 40 $m bench -m $MODEL -p 0 -n 32 -r 2 -d $d --device cuda --cache-type f16 | grep 'graph+PDL' | awk -F'|' '{print $6, $7, $8}')"
    done
  done
  for v in new main; do
    m=$MOE; [ $v = main ] && m=$MAIN
    t "$v f32 d512: $(timeout 40 $m bench -m $MODEL -p 0 -n 32 -r 2 -d 512 --device cuda | grep 'graph+PDL' | awk -F'|' '{print $6, $7, $8}')"
  done
done
t done
} > $OUT/experiment.log 2>&1
