#!/usr/bin/env bash
# Session 35's experiment, for the next device call (decode-plan facts 86 and 87). Here, first:
#   git apply bench/results/2026-12-07-s35/published-squares.patch bench/results/2026-12-07-s35/fadd-rounding.patch
#   bash scripts/device_ab.sh pack main=HEAD
# then on the device (carry [".debs", ".carry"]):
#   MOE_EXPERIMENT='bash bench/results/2026-12-07-s35/exp1.sh' MOE_LAB=0 bash scripts/device_run.sh
# so that every GPU test runs on the two patches together ($MOE), and this script compares three variants:
#   both   $MOE: the norm's squares published by x's writer, the staging's codes rounded by adds
#   round  $MOE with MOE_CUDA_OWN_SQUARES=1: the same binary, every norm summing its own squares
#   main   main built beside it (/tmp/ab-main-build/moe)
# both against round is fact 86 in one binary; round against main is fact 87.
set -u
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0))s] $*"; }
(bash scripts/device_ab.sh build >/tmp/ab-build.log 2>&1) &
AB=$!
# the staging rows of `moe lab` (the lab runs every Q4_K row first)
staging() { timeout 150 "$@" lab --type q4_k -r 20 2>&1 | sed -n '/^### Staging/,/^Staging rows/p' | grep "^| [a-z]"; }
t "staging rows, both (main building beside)"
staging "$MOE"
wait $AB
t "main built: $(tail -1 /tmp/ab-build.log)"
MAIN=/tmp/ab-main-build/moe
declare -A RUN=([both]="$MOE" [round]="env MOE_CUDA_OWN_SQUARES=1 $MOE" [main]="$MAIN")
# the decode row's test, tok/s, spread and fraction of the read bandwidth
decode() {
    timeout 60 ${RUN[$1]} bench -m "$MODEL" --device cuda -p 0 "${@:2}" | grep 'graph+PDL' |
        awk -F'|' '{print $6, $7, $8, $12}'
}
for round in 1 2; do
    for v in both round main; do t "$v tg128: $(decode $v -n 128 -r 3)"; done
done
for v in both round main; do t "$v tg32 d512: $(decode $v -n 32 -r 2 -d 512)"; done
for v in both round main; do
    t "$v at position 64, each stage's cost in the graph (us a token):"
    timeout 60 ${RUN[$v]} bench -m "$MODEL" -p 0 -n 16 -r 1 --device cuda --profile=64 2>&1 |
        awk -F'|' '/decode step by stage/{s=1} /inside the graph/{s=0}
            s && /^\| [a-z*]/ && $2 !~ /stage/{printf "|%s| %s |\n", $2, $(NF-2)}'
done
t "staging rows, main"
staging "$MAIN"
t done
