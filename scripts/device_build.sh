# scripts/device_build.sh — sourced from the repository root by the GPU
# machine's short run scripts (bench/results/*/run*.sh): the carried
# packages (device_packages.sh), `moe` built into $B with ptxas' registers
# and spills in $OUT/build.log, the synthetic Qwen3-30B-A3B Q4_K file made
# at $MODEL in the background (pid $SYN) while the CUDA tests build.
# Sets PREFIX, LIBDIR, B, MOE, MODEL and SYN.
. scripts/device_packages.sh
B=/tmp/moe-build
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_CUDA_VERBOSE=ON -DMOE_BENCH=OFF \
    -DCMAKE_PREFIX_PATH=$PREFIX/usr -DCMAKE_LIBRARY_PATH=$LIBDIR >$OUT/build.log 2>&1
cmake --build $B -j16 --target moe >>$OUT/build.log 2>&1
echo "built: $?" >>$OUT/build.log
export MOE=$B/moe MODEL=/tmp/q.gguf
[ -f $MODEL ] || (timeout 200 $MOE synth --preset qwen3-30b-a3b --type q4_k $MODEL >/tmp/synth.log 2>&1) &
SYN=$!
cmake --build $B -j16 --target test_cuda_kernels test_cuda_forward >>$OUT/build.log 2>&1
echo "tests built: $?" >>$OUT/build.log
