#!/usr/bin/env bash
# scripts/device_profile_staging.sh — where the decode's activation staging
# spends its time, on the GPU machine: builds moe, dumps the SASS of `moe
# lab`'s staging probes (the stagings of kernels.cuh, alone in a kernel)
# and runs Nsight Compute on their first launches (the products' Q8_K
# staging, ffn_up's, the floor, o's), warp states and the source lines
# the warps stall at.
#
# Needs the .deb files of scripts/fetch_debs.sh in .debs/ (carried), nvcc,
# cmake, ncu and a GPU. $OUT gets build.log, sass_staging.txt and
# ncu_staging.txt.
set -u
OUT=${OUT:-/tmp/moe-profile-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
. scripts/device_packages.sh
BUILD=/tmp/moe-profile-build
{
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_BENCH=OFF \
        -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_LIBRARY_PATH="$LIBDIR" &&
        cmake --build "$BUILD" -j "$(nproc)" --target moe
} >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }

# the probes' SASS, one function after another
cuobjdump -sass "$BUILD/CMakeFiles/moecore.dir/src/cuda/lab.cu.o" |
    awk '/Function : /{keep = index($0, "stage_probe") > 0} keep' >"$OUT/sass_staging.txt"

# caches as the lab leaves them (its cold runs sweep L2 and the code first)
timeout 300 ncu --clock-control none --cache-control none -k regex:stage_probe --launch-count 16 \
    --section WarpStateStats --section SourceCounters --section LaunchStats --print-details all \
    "$BUILD/moe" lab --type q4_k -r 1 >"$OUT/ncu_staging.txt" 2>&1
echo "ncu exit $?"
grep -E "stage_probe_kernel|Stall|Warp Cycles Per Issued" "$OUT/ncu_staging.txt" | head -60
