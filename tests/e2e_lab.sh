#!/usr/bin/env bash
# End-to-end: `moe lab` (the kernel lab) without a GPU: its help, its usage
# errors, and its one-line refusal with exit status 1, whether the build has
# no CUDA or the GPU is hidden (CUDA_VISIBLE_DEVICES empty). The lab itself
# runs on the GPU machine (scripts/device_run.sh).
# usage: e2e_lab.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
moe=$1 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
. "$here/e2e_common.inc"

expect help_top "$moe" --help
grep -qE "^  lab +" help_top.out && ok lab_listed || bad lab_listed
expect help_lab "$moe" lab --help
grep -q "pure read" help_lab.out && grep -q -- "--type" help_lab.out && ok help_lab_text || bad help_lab_text

expect_fail bad_type 2 "q2_k" "$moe" lab --type q2_k
expect_fail type_twice 2 "listed twice" "$moe" lab --type q4_k,q8_0,q4_k
expect_fail bad_reps 2 "-r wants" "$moe" lab -r 0
expect_fail bad_output 2 "-o wants" "$moe" lab -o xml
expect_fail stray_argument 2 "unexpected argument" "$moe" lab model.gguf

expect_fail no_gpu 1 "^moe lab: (no CUDA GPU found|this build of moe.c has no CUDA backend)" \
  env CUDA_VISIBLE_DEVICES= MOE_CUDA_SIM=0 "$moe" lab --type q4_k
[ "$(wc -l <no_gpu.err)" -eq 1 ] && [ ! -s no_gpu.out ] && ok no_gpu_one_line || bad no_gpu_one_line

e2e_summary
