#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] [TARGET] — run a libFuzzer target for SECONDS
# (default 60). TARGET (default gguf):
#   gguf     the GGUF reader and writer (fuzz_gguf)
#   request  the server's request layer, JSON body to generation request
#            and the responses made from it (fuzz_request)
#   safetensors  the safetensors reader of `moe convert` (fuzz_safetensors)
#   tokenizer    encoding and decoding with a fixed vocabulary, and loading
#                vocabularies made from the input (fuzz_tokenizer)
#   chat_template  the chat template families: detection from a template
#                  source, its default system message, and rendering
#                  conversations (fuzz_chat_template)
#
# Builds the target with clang into build-fuzz ($MOE_FUZZ_BUILD if set),
# runs it on a working copy of its seed corpus (fuzz/corpus-run/TARGET,
# kept between runs, not committed) with the dictionary fuzz/TARGET.dict,
# and prints libFuzzer's final stats and a summary line. An input that
# crashes is saved as fuzz/corpus-run/artifacts/TARGET-crash-*; replay it
# with build-fuzz/fuzz/fuzz_TARGET FILE. Targets may run side by side once
# built: each has its own corpus, log and artifacts. The committed seeds
# come from fuzz/gguf_seeds.c (gguf) and fuzz/make_seeds.py (safetensors,
# tokenizer, chat_template).
set -euo pipefail

seconds=${1:-60}
target=${2:-gguf}
case $target in
  gguf) max_len=16384 ;;
  request | tokenizer | chat_template) max_len=4096 ;;
  safetensors) max_len=8192 ;;
  *) echo "fuzz/run.sh: unknown target '$target' (gguf, request, safetensors, tokenizer or chat_template)" >&2
     exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_FUZZ_BUILD:-$root/build-fuzz}
work=$root/fuzz/corpus-run
log=$work/fuzz_$target.log
program=$build/fuzz/fuzz_$target

mkdir -p "$work/$target" "$work/artifacts"
if ! { cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DMOE_FUZZ=ON -DMOE_CUDA=OFF \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$build" --target "fuzz_$target" -j"$(nproc)"; } >"$work/build_$target.log" 2>&1; then
    tail -n 40 "$work/build_$target.log"
    echo "fuzz/run.sh: build failed (full log: $work/build_$target.log)" >&2
    exit 1
fi
cp -n "$root/fuzz/corpus/$target"/* "$work/$target/"

artifacts() { find "$work/artifacts" -type f -name "$target-*" | wc -l; }
crashes_before=$(artifacts)
status=0
"$program" -max_total_time="$seconds" -dict="$root/fuzz/$target.dict" -max_len="$max_len" -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$target-" "$work/$target" >"$log" 2>&1 || status=$?
crashes=$(( $(artifacts) - crashes_before ))

if [ "$status" -ne 0 ]; then
    grep -m1 -B2 -A30 'ERROR: \|==ERROR\|runtime error\|deadly signal' "$log" || tail -n 40 "$log"
fi
grep -E '^(Done|stat::)' "$log" || true
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
elapsed=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
echo "fuzz_$target: ${execs:-?} executions in ${elapsed:-?} s, ${crashes} crash(es), corpus $(ls "$work/$target" | wc -l) files"
exit "$status"
