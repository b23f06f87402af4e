#!/usr/bin/env bash
# session 33 run 2: the f16 KV cache as an option of both backends (--cache-type f16): the GPU kernel test (every
# attention case with an f16 cache too), the forward test (GPU f16 vs CPU f16 on the variant models), the 30B file
# against the CPU with both caches in f16 over 64 positions, then f32 against f16 at tg128 and depths 1024 and 4096
# in one build, and `moe run --cache-type f16`. Carried with [".debs"]; about 200 s.
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_build.sh
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
t kernels; timeout 100 $B/tests/test_cuda_kernels 2>&1 | grep -E "attention.*f16|FAIL|passed" | grep -E "2040|T=70|FAIL|passed"
t forward; timeout 60 $B/tests/test_cuda_forward 2>&1 | grep -E "f16|^ok|FAIL|passed"
wait $SYN; t synth
t "30B vs CPU, f32 and f16 caches"; MOE_TEST_KV_F16=1 MOE_TEST_MODEL=$MODEL MOE_TEST_SKIP_SYNTH=1 timeout 120 \
  $B/tests/test_cuda_forward 2>&1 | grep -E "worst|FAIL|passed"
for ct in f32 f16; do
  for d in 0 1024 4096; do
    t "d$d $ct"; timeout 40 $MOE bench -m $MODEL -p 0 -n 64 -r 3 -d $d --device cuda --cache-type $ct | grep "graph+PDL"
  done
done
t "moe run --cache-type f16"; timeout 30 $MOE run -m $MODEL --device cuda -p "Once upon a time" -n 32 --temp 0 --cache-type f16 2>&1 | tail -2
t done
} > $OUT/experiment.log 2>&1
