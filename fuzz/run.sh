#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] — fuzz the GGUF reader and writer for SECONDS
# (default 60).
#
# Builds the libFuzzer target with clang into build-fuzz, runs it on a
# working copy of the seed corpus (fuzz/corpus-run/gguf, kept between runs,
# not committed) with the dictionary fuzz/gguf.dict, and prints libFuzzer's
# final stats and a summary line. An input that crashes is saved under
# fuzz/corpus-run/artifacts/; replay it with build-fuzz/fuzz/fuzz_gguf FILE.
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
work=$root/fuzz/corpus-run
log=$work/fuzz.log

mkdir -p "$work/gguf" "$work/artifacts"
if ! { cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DMOE_FUZZ=ON -DMOE_CUDA=OFF \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build "$build" --target fuzz_gguf -j"$(nproc)"; } >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log"
    echo "fuzz/run.sh: build failed (full log: $work/build.log)" >&2
    exit 1
fi
cp -n "$root"/fuzz/corpus/gguf/* "$work/gguf/"

crashes_before=$(find "$work/artifacts" -type f | wc -l)
status=0
"$build/fuzz/fuzz_gguf" -max_total_time="$seconds" -dict="$root/fuzz/gguf.dict" -max_len=16384 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/gguf" >"$log" 2>&1 || status=$?
crashes=$(( $(find "$work/artifacts" -type f | wc -l) - crashes_before ))

if [ "$status" -ne 0 ]; then
    grep -m1 -B2 -A30 'ERROR: \|==ERROR\|runtime error\|deadly signal' "$log" || tail -n 40 "$log"
fi
grep -E '^(Done|stat::)' "$log" || true
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
elapsed=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
echo "fuzz_gguf: ${execs:-?} executions in ${elapsed:-?} s, ${crashes} crash(es), corpus $(ls "$work/gguf" | wc -l) files"
exit "$status"
