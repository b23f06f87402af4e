#!/usr/bin/env bash
# session 32 run 3 (H100, warm): the f16 KV cache (kv-f16.patch on ee3232e, packed as .carry/kv.tar by `device_ab.sh pack kv=BRANCH`) in one build: f32 vs f16 at depth, accuracy vs the CPU
set -u
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. scripts/device_packages.sh
[ -f /tmp/q.gguf ] || { echo "no /tmp/q.gguf: cold machine"; }
{
t "gpu: $(nvidia-smi --query-gpu=name,clocks.max.mem --format=csv,noheader)"
bash scripts/device_ab.sh build > /tmp/ab.log 2>&1; t "built: $(tail -1 /tmp/ab.log)"
(cmake --build /tmp/ab-kv-build -j16 --target test_cuda_kernels test_cuda_forward > /tmp/abt.log 2>&1; echo "tests built $?" >> /tmp/abt.log) &
TB=$!
M=/tmp/ab-kv-build/moe MODEL=/tmp/q.gguf
[ -f $MODEL ] || (timeout 200 $M synth --preset qwen3-30b-a3b --type q4_k $MODEL > /tmp/synth.log 2>&1)
for r in 1 2; do for f in 0 1; do
  t "d4096 KV_F16=$f"; MOE_CUDA_KV_F16=$f timeout 60 $M bench -m $MODEL -p 0 -n 32 -r 2 -d 4096 --device cuda | grep "graph+PDL"
done; done
for f in 0 1; do t "tg128 KV_F16=$f"; MOE_CUDA_KV_F16=$f timeout 60 $M bench -m $MODEL -p 0 -n 128 -r 3 --device cuda | grep "graph+PDL"; done
for f in 0 1; do t "d1024 KV_F16=$f"; MOE_CUDA_KV_F16=$f timeout 60 $M bench -m $MODEL -p 0 -n 32 -r 2 -d 1024 --device cuda | grep "graph+PDL"; done
t "pp512 + d4096 KV_F16=1"; MOE_CUDA_KV_F16=1 timeout 60 $M bench -m $MODEL -p 512 -n 0 -r 2 --device cuda | grep "pp512"
wait $TB; t "$(tail -1 /tmp/abt.log)"
t "kernels"; timeout 100 /tmp/ab-kv-build/tests/test_cuda_kernels 2>&1 | grep -E "f16.*(2040|T=70)|FAIL|passed"
t "30B vs CPU, KV_F16=1"; MOE_CUDA_KV_F16=1 MOE_TEST_MODEL=$MODEL MOE_TEST_SKIP_SYNTH=1 timeout 150 /tmp/ab-kv-build/tests/test_cuda_forward 2>&1 | tail -8
t done
} > $OUT/experiment3.log 2>&1
