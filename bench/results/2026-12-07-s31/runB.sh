#!/usr/bin/env bash
# session 31 run B (a short budget; written, never started): session 30's one-build A/B of head blocks against
# main's per-head kernel (its run2.sh: GPU kernel and forward tests, tg128 alternated, depths 512 and 1024, the
# layer timeline at 512 both ways; about 200 s on an H200), then `moe lab -r 10` while DEADLINE (400 s) allows.
# Here: `git apply bench/results/2026-12-07-s30/head-blocks.patch`, copy this to .carry/runB.sh; on the device
# `DEADLINE=400 bash .carry/runB.sh` with carry [".debs", ".carry"].
set -u
T0=$(date +%s)
bash bench/results/2026-12-07-s30/run2.sh
left() { echo $((${DEADLINE:-400} - $(date +%s) + T0)); }
[ "$(left)" -gt 100 ] || exit 0
export LD_LIBRARY_PATH=/tmp/moe-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout $(($(left) - 20)) /tmp/moe-build/moe lab -r 10 >"$OUT/lab.md" 2>&1
echo "lab exit $?" >>"$OUT/experiment.log"
