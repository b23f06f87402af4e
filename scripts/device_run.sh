#!/usr/bin/env bash
# scripts/device_run.sh — the one command the GPU machine runs for the CUDA
# backend (issue 5): build, check every kernel and whole models against the
# CPU, benchmark the synthetic Qwen3-30B-A3B, and leave logs and a results
# page in $OUT. Made to end inside 9 minutes: every step has its own time
# limit and a step that fails or times out does not stop the ones after it.
#
# Needs: the .deb files of scripts/fetch_debs.sh in .debs/ (carried), nvcc,
# cmake and a GPU. Run from anywhere:  bash scripts/device_run.sh
#
# $OUT gets (8 files at most come back):
#   results.md   the summary (also printed last)
#   bench.md     moe bench, llama-bench style, beside the measured read bandwidth,
#                the decode step timed stage by stage (--profile=512), and
#                pp512 with decode at depth 4096 (f32 and f16 KV cache)
#   bench.json   the same as JSON
#   build.log    configure + build, with ptxas' registers/spills per kernel
#   kernels.log  tests/test_cuda_kernels (every GEMV type, experts by id),
#                at the end of forward.log
#   forward.log  tests/test_cuda_forward (tiny/small models of every
#                architecture) and the engine test, moe run --device cuda
#   forward30b.log  the 30B-A3B q4_k file: GPU vs CPU over 64 positions, and
#                the CPU against itself (scripts/reference_spread.sh)
#   env.txt      nvidia-smi, nvcc, SASS facts (16-byte loads, local memory),
#                at the end of build.log
#   lab.md       moe lab: GEMVs and expert kernels beside pure reads, launch chains
#   ncu.log      (MOE_NCU=1) Nsight Compute metrics of one decode step's kernels
#   ncu_stalls.log  (MOE_NCU=1) where one layer's kernels' warps wait
#
# Switches: MOE_QUICK=1 (decode bench only, no 30B test), MOE_LAB=0 (no lab),
# MOE_TESTS=0 (no correctness tests: measurements only), MOE_NCU=1,
# MOE_DEADLINE=S (end by S seconds, 525 by default), MOE_EXPERIMENT="cmds"
# (run after the bench with $MOE and $MODEL set; experiment.log; an A/B
# against other commits in the same run: scripts/device_ab.sh).
set -u
OUT=${OUT:-/tmp/moe-device-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
DEADLINE=${MOE_DEADLINE:-525} # seconds: the 30B test and the JSON bench fit in what is left
log() { echo "[$(elapsed)s] $*"; }
declare -A STATUS

# step NAME LIMIT_S LOGFILE CMD...: run with a time limit, append to the log,
# remember the exit status.
step() {
    local name=$1 limit=$2 logf=$3
    shift 3
    log "$name (limit ${limit}s)"
    echo "=== $name: $*" >>"$logf"
    timeout --kill-after=5 "$limit" "$@" >>"$logf" 2>&1
    local rc=$?
    STATUS[$name]=$rc
    log "$name: exit $rc"
    return $rc
}

# ---------------------------------------------------------------- packages
. scripts/device_packages.sh

{
    echo "# environment"
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    nvcc --version 2>&1 | tail -2
    cmake --version | head -1
    nproc
    free -g | head -2
} >"$OUT/env.txt" 2>&1

# ---------------------------------------------------------------- build
BUILD=${MOE_BUILD_DIR:-/tmp/moe-build}
# a build directory configured from another checkout cannot be reused
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT\$" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
fi
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
# (MOE_SKIP_BUILD=1 MOE_BUILD_DIR=... MOE_PRESET=tiny: a dry run of this
# script elsewhere, e.g. with the CPU simulator build)
[ "${MOE_SKIP_BUILD:-0}" = 1 ] || step configure 120 "$OUT/build.log" cmake -S . -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON \
    -DMOE_CUDA_VERBOSE=ON -DMOE_BENCH=OFF -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_LIBRARY_PATH="$LIBDIR"
TARGETS="moe test_cuda_kernels test_cuda_forward test_engine"
[ "${MOE_TESTS:-1}" = 1 ] || TARGETS=moe # measurements only: the tests' binaries would take build time for nothing
[ "${MOE_SKIP_BUILD:-0}" = 1 ] || step build 330 "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)" --target $TARGETS
MOE=$BUILD/moe
# An A/B's variants (scripts/device_ab.sh) compile beside the synth and the
# tests instead of after the bench; device_ab.sh run waits for them.
if ls .carry/*.tar.gz >/dev/null 2>&1 && [[ "${MOE_EXPERIMENT:-}" == *device_ab.sh* ]]; then
    log "variants' builds in the background"
    bash scripts/device_ab.sh build >/tmp/ab-prebuild.log 2>&1 &
fi

# what the compiler made of the kernels: registers, spills, 16-byte loads
{
    echo
    echo "# ptxas: kernels with stack frames or spills (none expected but the attention's libm calls)"
    grep -E "Compiling entry|Used|spill" "$OUT/build.log" | paste - - - 2>/dev/null | grep -vE "0 bytes stack frame, 0 bytes spill stores" | sed -E 's/ptxas info *: //g' | cut -c1-240 | head -20
    echo
    echo "# SASS per gemv/ffn kernel: 128-bit global loads, local memory loads/stores"
    if command -v cuobjdump >/dev/null; then
        cuobjdump -sass "$BUILD"/CMakeFiles/moecore.dir/src/cuda/q4_k.cu.o "$BUILD"/CMakeFiles/moecore.dir/src/cuda/q6_k.cu.o 2>/dev/null |
            awk '/Function : /{name=$3} /LDG\.E\.(128|ENL2\.128|.*128)/{g[name]++} /LDL|STL/{l[name]++} END{for (n in g) printf "%-60s LDG.128 %4d  LDL/STL %d\n", n, g[n], l[n]+0}' | sort
    else
        echo "cuobjdump not found"
    fi
} >>"$OUT/env.txt" 2>&1

# ---------------------------------------------------------------- the reference at scale (issue 4), in the background
# MOE_AT_SCALE=1: the 2-layer Qwen3-30B-A3B-wide checkpoint against
# transformers (scripts/at_scale_check.sh), CPU side, beside the GPU tests.
if [ "${MOE_AT_SCALE:-0}" = 1 ] && [ -x "$MOE" ]; then
    log "at-scale check in the background"
    (timeout 420 bash scripts/at_scale_check.sh "$MOE" /tmp/moe-at-scale >"$OUT/at_scale.log" 2>&1
     echo "at_scale exit $?" >>"$OUT/at_scale.log") &
    AT_SCALE_PID=$!
fi

# ---------------------------------------------------------------- model for the benchmark (in the background)
PRESET=${MOE_PRESET:-qwen3-30b-a3b}
MODEL=/tmp/$PRESET-q4_k.gguf
if [ -x "$MOE" ]; then
    log "synth $PRESET q4_k in the background"
    (timeout 240 "$MOE" synth --preset "$PRESET" --type q4_k "$MODEL" >"$OUT/synth.tmp" 2>&1; echo "synth exit $?" >>"$OUT/synth.tmp") &
    SYNTH_PID=$!
fi

# ---------------------------------------------------------------- tests (MOE_TESTS=0: skipped, for quick measurements)
[ "${MOE_TESTS:-1}" = 1 ] || log "tests skipped (MOE_TESTS=0)"
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_kernels" ]; then
    step kernels 120 "$OUT/kernels.log" "$BUILD/tests/test_cuda_kernels"
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_forward" ]; then
    step forward 200 "$OUT/forward.log" "$BUILD/tests/test_cuda_forward"
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_forward" ]; then
    # the same comparison with prompts run through the decode step token by token
    step forward_decode 200 "$OUT/forward.log" env MOE_CUDA_PREFILL=0 "$BUILD/tests/test_cuda_forward"
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_forward" ] && [ -x "$MOE" ]; then
    # every transformers fixture (f32, bf16, q8_0) on the GPU against the CPU
    step golden_gpu 150 "$OUT/forward.log" bash scripts/golden_gpu_check.sh "$MOE" "$BUILD/tests/test_cuda_forward" /tmp/moe-golden
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_engine" ]; then
    step engine 60 "$OUT/forward.log" "$BUILD/tests/test_engine"
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_forward" ]; then
    # the batched prefill with the experts dequantized and a cuBLAS call
    # per expert, as builds without the grouped call run it (after engine:
    # results.md counts the lines)
    step forward_each 200 "$OUT/forward.log" env MOE_CUDA_EXPERTS=each "$BUILD/tests/test_cuda_forward"
fi
if [ "${MOE_TESTS:-1}" = 1 ] && [ -x "$BUILD/tests/test_cuda_forward" ]; then
    # the attention's three ways in one sequence (head blocks to position
    # 10, per head, grouped from 20; by default 128 and 2048): each step's
    # three captured graphs, switched mid-sequence (after forward_each:
    # results.md counts the lines)
    step forward_grouped 200 "$OUT/forward.log" env MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL=10 MOE_CUDA_ATTN_GROUPED_FROM=20 \
        "$BUILD/tests/test_cuda_forward"
fi

if [ -n "${SYNTH_PID:-}" ]; then
    log "waiting for synth"
    wait "$SYNTH_PID"
    cat "$OUT/synth.tmp" | tr '\r' '\n' | tail -3 >>"$OUT/forward30b.log"
    rm -f "$OUT/synth.tmp"
fi

if [ -f "$MODEL" ]; then
    # MOE_QUICK=1: decode only, fewer repetitions, and no 30B forward test
    if [ "${MOE_QUICK:-0}" = 1 ]; then
        step bench 150 "$OUT/bench.log.tmp" "$MOE" bench -m "$MODEL" -p 0 -n 128 -r 3 --device cuda --profile=512
    else
        step bench 200 "$OUT/bench.log.tmp" "$MOE" bench -m "$MODEL" -p 512 -n 128 -r 5 --device cuda --profile=512
    fi
    sed -n '/^| model/,$p' "$OUT/bench.log.tmp" >"$OUT/bench.md"
    grep -v "^| \|^$\|^Read\|^A decoded\|^GPU memory\|^Repetitions" "$OUT/bench.log.tmp" >>"$OUT/build.log" 2>/dev/null
    rm -f "$OUT/bench.log.tmp"
    if [ "${MOE_QUICK:-0}" != 1 ]; then
        # decode at depth 4096 (its cache reads counted) beside pp512, one more table in bench.md
        step bench_depth 150 "$OUT/bench.log.tmp" "$MOE" bench -m "$MODEL" -p 512 -n 64 -r 3 -d 4096 --device cuda
        { echo; echo "### depth 4096"; echo; sed -n '/^| model/,$p' "$OUT/bench.log.tmp"; } >>"$OUT/bench.md"
        rm -f "$OUT/bench.log.tmp"
        # the same depth with the KV cache in f16 (half its bytes a position)
        step bench_depth_f16 100 "$OUT/bench.log.tmp" "$MOE" bench -m "$MODEL" -p 0 -n 64 -r 3 -d 4096 --device cuda \
            --cache-type f16
        { echo; echo "### depth 4096, f16 KV cache"; echo; sed -n '/^| model/,$p' "$OUT/bench.log.tmp"; } >>"$OUT/bench.md"
        rm -f "$OUT/bench.log.tmp"
    fi
    # MOE_EXPERIMENT="commands": run with $MOE and $MODEL set, output to
    # experiment.log (an A/B beside the bench without a new script)
    if [ -n "${MOE_EXPERIMENT:-}" ]; then
        step experiment 360 "$OUT/experiment.log" env MOE="$MOE" MODEL="$MODEL" bash -c "$MOE_EXPERIMENT"
    fi
    # the kernel lab: each GEMV against a pure read of the same bytes, the
    # expert kernels, launch chains with and without graphs/PDL
    [ "${MOE_LAB:-1}" = 1 ] && step lab 300 "$OUT/lab.md" "$MOE" lab -r 20
    # MOE_NCU=1: Nsight Compute on one decode step's kernels (durations in
    # isolation, DRAM bytes, occupancy): the kernels of layers 1-2 at position ~64
    if [ "${MOE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
        step ncu 150 "$OUT/ncu.log" env MOE_CUDA_GRAPH=0 ncu --clock-control none --csv \
            -k "regex:gemv|ffn|attention|embed|set_step" --launch-skip 400 --launch-count 16 \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed \
            "$MOE" bench -m "$MODEL" -p 0 -n 16 -r 1 --device cuda
        # where the warps of one layer's kernels wait, caches as the step left them
        step ncu_stalls 150 "$OUT/ncu_stalls.log" env MOE_CUDA_GRAPH=0 ncu --clock-control none --cache-control none \
            -k "regex:attention|router|gemv|ffn" --launch-skip 300 --launch-count 6 \
            --section WarpStateStats --section SourceCounters --section LaunchStats --print-details all \
            "$MOE" bench -m "$MODEL" -p 0 -n 16 -r 1 --device cuda
    fi
    remaining=$((DEADLINE - 45 - $(elapsed)))
    [ "${MOE_QUICK:-0}" = 1 ] && remaining=0
    if [ "$remaining" -gt 100 ]; then
        # the CPU reference against itself on the same file: the floor under the GPU-vs-CPU figure below
        step reference_spread 40 "$OUT/forward30b.log" bash scripts/reference_spread.sh "$MOE" "$MODEL" /tmp/moe-spread
        remaining=$((DEADLINE - 45 - $(elapsed)))
    fi
    if [ "$remaining" -gt 60 ]; then
        # the CPU reference at its fastest kernels here (the synthetic cases use the portable ones)
        step forward30b "$remaining" "$OUT/forward30b.log" env MOE_CPU_ISA=avx512 MOE_TEST_MODEL="$MODEL" MOE_TEST_SKIP_SYNTH=1 "$BUILD/tests/test_cuda_forward"
    else
        log "no time left for the 30B forward test"
        STATUS[forward30b]=skipped
    fi
    if [ $((520 - $(elapsed))) -gt 30 ]; then
        step run_cuda 30 "$OUT/forward.log" "$MOE" run -m "$MODEL" --device cuda -p "Once upon a time" -n 32 --temp 0
        # the default sampling chain (top-k, top-p, min-p), sampled from the GPU's top logits
        step run_cuda_sampled 30 "$OUT/forward.log" "$MOE" run -m "$MODEL" --device cuda -p "Once upon a time" -n 128
    fi
    if [ "${MOE_QUICK:-0}" != 1 ] && [ $((DEADLINE - $(elapsed))) -gt 20 ]; then
        step bench_json $((DEADLINE - $(elapsed))) "$OUT/bench.json.tmp" "$MOE" bench -m "$MODEL" -p 0 -n 128 -r 3 --device cuda -o json
        sed -n '/^{/,$p' "$OUT/bench.json.tmp" >"$OUT/bench.json"
        rm -f "$OUT/bench.json.tmp"
    fi
else
    log "no model file: bench and the 30B test skipped"
fi

if [ -n "${AT_SCALE_PID:-}" ]; then
    log "waiting for the at-scale check"
    wait "$AT_SCALE_PID"
    STATUS[at_scale]=$(sed -n 's/^at_scale exit //p' "$OUT/at_scale.log")
fi

# ---------------------------------------------------------------- summary
{
    echo "# moe.c CUDA backend: device run"
    echo
    echo "$(head -3 "$OUT/env.txt" | tail -2 | tr '\n' ' ')"
    echo
    echo "| step | exit | what |"
    echo "| --- | --- | --- |"
    for s in configure build kernels forward forward_decode golden_gpu engine forward_each forward_grouped bench lab reference_spread forward30b run_cuda run_cuda_sampled bench_json at_scale; do
        echo "| $s | ${STATUS[$s]:-not run} | $(case $s in
            kernels) grep -E "passed|FAIL" "$OUT/kernels.log" 2>/dev/null | tail -1 ;;
            forward) grep -E "^[0-9]+ passed" "$OUT/forward.log" 2>/dev/null | head -1 ;;
            forward_decode) grep -E "^[0-9]+ passed" "$OUT/forward.log" 2>/dev/null | sed -n 2p ;;
            golden_gpu) grep -E "^golden on the GPU" "$OUT/forward.log" 2>/dev/null | tail -1 ;;
            engine) grep -E "^[0-9]+ passed" "$OUT/forward.log" 2>/dev/null | sed -n 3p ;;
            forward_each) grep -E "^[0-9]+ passed" "$OUT/forward.log" 2>/dev/null | sed -n 4p ;;
            forward_grouped) grep -E "^[0-9]+ passed" "$OUT/forward.log" 2>/dev/null | sed -n 5p ;;
            reference_spread) grep -E " vs avx512:" "$OUT/forward30b.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200 ;;
            forward30b) grep -E "worst rel L2|passed" "$OUT/forward30b.log" 2>/dev/null | grep -v " vs avx512:" | tr '\n' ' ' | cut -c1-200 ;;
            run_cuda) grep -E "tok/s" "$OUT/forward.log" 2>/dev/null | tail -2 | head -1 | cut -c1-200 ;;
            run_cuda_sampled) grep -E "tok/s" "$OUT/forward.log" 2>/dev/null | tail -1 | cut -c1-200 ;;
            at_scale) grep -E "^at scale" "$OUT/at_scale.log" 2>/dev/null | tr '\n' ' ' | cut -c1-240 ;;
        esac) |"
    done
    echo
    echo "## kernels (worst |gpu - cpu| / sum|wx| per type)"
    grep -E "^  (gemv|experts)" "$OUT/kernels.log" 2>/dev/null
    echo
    echo "## forward (GPU vs CPU, per model)"
    grep -E "worst rel L2|FAIL" "$OUT/forward.log" "$OUT/forward30b.log" 2>/dev/null | sed 's/^[^:]*://' | head -60
    echo
    echo "## bench"
    cat "$OUT/bench.md" 2>/dev/null
    echo
    echo "total $(elapsed)s"
} >"$OUT/results.md"
cat "$OUT/results.md"
# what comes back from the device is limited to eight files: the kernel
# tests' log travels inside forward.log, env.txt inside build.log (with
# experiment.log, that leaves eight)
fold() { # fold FILE INTO
    [ -f "$OUT/$1" ] || return 0
    { echo "=== $1"; cat "$OUT/$1"; } >>"$OUT/$2"
    rm -f "$OUT/$1"
}
fold kernels.log forward.log
fold env.txt build.log
