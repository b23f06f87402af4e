#!/usr/bin/env bash
# scripts/golden_gpu_check.sh — every transformers fixture (tests/golden)
# on the GPU against the CPU reference: each is converted with `moe
# convert` to f32, bf16 and q8_0 and run through tests/test_cuda_forward:
# teacher-forced logits over 64 positions through the decode step (held to
# 1e-3). Prompts go through the decode step (MOE_CUDA_PREFILL=0): the
# batched bf16 prefill is held to its own bound by the synthetic models
# and the 30B file, and on these tiny random MoE fixtures its bf16
# roundings flip near-tied routing choices more often than that bound's
# one position in 16 (bench/results/2026-11-29-final/forward.log).
# Prints one line per file and a closing count. MOE_GOLDEN_TYPES narrows
# the types (CI runs "f32 q8_0" on the CPU simulator of the GPU).
# usage: golden_gpu_check.sh MOE TEST_CUDA_FORWARD SCRATCH_DIR
set -u
moe=$1 test=$2 dir=$3
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
passed=0 failed=0
for fixture in "$root"/tests/golden/fixtures/*/; do
    name=$(basename "$fixture")
    for type in ${MOE_GOLDEN_TYPES:-f32 bf16 q8_0}; do
        out=$dir/$name.$type.gguf
        if ! "$moe" convert -q --type "$type" "$fixture" "$out" >"$dir/convert.log" 2>&1; then
            echo "FAIL $name $type: moe convert: $(head -c 200 "$dir/convert.log")"
            failed=$((failed + 1))
            continue
        fi
        if MOE_CUDA_PREFILL=0 MOE_TEST_SKIP_SYNTH=1 MOE_TEST_MODEL=$out "$test" >"$dir/run.log" 2>&1; then
            passed=$((passed + 1))
            grep -E "worst rel L2" "$dir/run.log" | sed "s|$dir/||" | head -2
        else
            failed=$((failed + 1))
            echo "FAIL $name $type"
            grep -E "FAIL|worst" "$dir/run.log" | sed "s|$dir/||" | head -4
        fi
    done
done
echo "golden on the GPU: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
