#!/usr/bin/env bash
# Golden test: every checkpoint under FIXTURES (made with Transformers by
# make_fixtures.py) converted with `moe convert` and run through moe.c,
# against the logits and greedy continuations Transformers computed.
# usage: test_golden.sh MOE GOLDEN_CHECK FIXTURES_DIR SCRATCH_DIR
# Skipped (exit 77) while FIXTURES_DIR holds no fixture.
#
# The bounds, per output type: the largest error at any position relative
# to the rms of that position's reference logits, then the relative L2
# error over all positions (see golden_check.c). f32 must reproduce
# Transformers' float32 computation (measured: at most 3.2e-6) and its
# greedy tokens. The others round the weights, so their bounds are about
# twice to four times the worst measured on the 16 fixtures of
# make_fixtures.py (bf16 0.12 / 6.2e-3, f16 3.2e-3 / 5.2e-4, q8_0
# 0.88 / 3.7e-2): the L2 bound carries q8_0, whose largest single errors
# come from tokens routed to other experts. Fixtures stored in bf16 convert
# to bf16 and f16 exactly, within the f32 bounds.
set -u
moe=$1 check=$2 fixtures=$3 dir=$4
if ! ls "$fixtures"/*/reference.json >/dev/null 2>&1; then
  echo "SKIP: no fixtures in $fixtures (make them with tests/golden/make_fixtures.py)"
  exit 77
fi
rm -rf "$dir" && mkdir -p "$dir" || exit 1
passed=0 failed=0
for fixture in "$fixtures"/*/; do
  name=$(basename "$fixture")
  for spec in "f32 1e-4 0 --greedy" "bf16 0.3 1.5e-2" "f16 1e-2 2e-3" "q8_0 1.5 8e-2"; do
    set -- $spec
    type=$1 bounds=("${@:2:2}") greedy=${4:-}
    [ "${bounds[1]}" = 0 ] && bounds=("${bounds[0]}")
    out=$dir/$name.$type.gguf
    if ! "$moe" convert -q --type "$type" "$fixture" "$out" 2>"$dir/$name.$type.err"; then
      echo "FAIL $name $type: moe convert: $(head -c 300 "$dir/$name.$type.err")"
      failed=$((failed + 1))
    elif result=$("$check" "$out" "$fixture" "${bounds[@]}" $greedy 2>"$dir/$name.$type.err"); then
      printf 'ok   %-28s %-5s %s\n' "$name" "$type" "$result"
      passed=$((passed + 1))
    else
      printf 'FAIL %-28s %-5s %s\n' "$name" "$type" "$result"
      cat "$dir/$name.$type.err"
      failed=$((failed + 1))
    fi
    rm -f "$out"
  done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
