#!/usr/bin/env bash
# session 34 run 1's experiment (MOE_EXPERIMENT of scripts/device_run.sh, $MOE and $MODEL set; carry [".debs",
# ".carry"] with .carry/f16b.tar from `bash scripts/device_ab.sh pack f16b=HEAD+bench/results/2026-12-07-s34/f16-batches.patch`):
#  1. the decode step by stage and layer 24's timeline at position 64, where tg128 runs (head blocks);
#  2. an f16 KV cache's batches of raw f16 pairs (f16-batches.patch: 16 positions a batch per head instead of 8, head
#     blocks to 256 positions) built beside main ($MOE), interleaved: tg32 at depths 0, 160, 512, 1024, 2048,
#     and tg32 at 512 with an f32 cache (unchanged kernels: the control).
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
(bash scripts/device_ab.sh build > /tmp/ab-build.log 2>&1 &&
  cmake --build /tmp/ab-f16b-build -j16 --target test_cuda_kernels > /tmp/ab-test-build.log 2>&1) &
AB=$!
t "profile at 64"
timeout 90 $MOE bench -m $MODEL -p 0 -n 16 -r 1 --device cuda --profile=64 | sed -n '/^### decode step/,$p'
wait $AB; t "f16b built: $(tail -1 /tmp/ab-build.log)"
NEW=/tmp/ab-f16b-build/moe
for r in 1 2; do
  for d in 0 160 512 1024 2048; do
    for v in new main; do
      m=$MOE; [ $v = new ] && m=$NEW
      t "$v f16 d$d: $(timeout 40 $m bench -m $MODEL -p 0 -n 32 -r 2 -d $d --device cuda --cache-type f16 | grep 'graph+PDL' | awk -F'|' '{print $6, $7, $8}')"
    done
  done
  for v in new main; do
    m=$MOE; [ $v = new ] && m=$NEW
    t "$v f32 d512: $(timeout 40 $m bench -m $MODEL -p 0 -n 32 -r 2 -d 512 --device cuda | grep 'graph+PDL' | awk -F'|' '{print $6, $7, $8}')"
  done
done
t "f16b kernel test: $(tail -1 /tmp/ab-test-build.log)"
timeout 100 /tmp/ab-f16b-build/tests/test_cuda_kernels 2>&1 | grep -E "decode attention.*(pos=(2040|700|130|200)).*f16|FAIL|passed"
t done
