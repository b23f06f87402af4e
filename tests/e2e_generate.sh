#!/usr/bin/env bash
# End-to-end: `moe synth`, `run`, `chat`, `tokenize` and `logits` through
# the built program, and their errors on bad input.
# usage: e2e_generate.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
moe=$1 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
. "$here/e2e_common.inc"

# --- synth: every architecture, and the help
expect help_synth "$moe" synth --help
for arch in qwen3moe qwen2moe olmoe llama qwen3 qwen2; do
  expect "synth_$arch" "$moe" synth -q --arch "$arch" --preset tiny --type q8_0 "$arch.gguf"
done
expect synth_mixtral "$moe" synth -q --arch llama --mixtral --preset tiny --type q4_k_m mixtral.gguf
"$moe" inspect --json mixtral.gguf | python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(d['model']['experts'] != 8)" \
  && ok mixtral_has_experts || bad mixtral_has_experts
expect_fail synth_bad_arch 1 "unknown architecture 'gpt5'" "$moe" synth -q --arch gpt5 x.gguf
expect_fail synth_preset_mismatch 1 "preset qwen3-30b-a3b is a qwen3moe model" \
  "$moe" synth -q --arch llama --preset qwen3-30b-a3b x.gguf
expect_fail synth_bad_type 2 "unknown type" "$moe" synth -q --type q9_z x.gguf
"$moe" synth -q --seed 5 --type q4_k a.gguf && "$moe" synth -q --seed 5 --type q4_k -t 1 b.gguf && cmp -s a.gguf b.gguf \
  && ok synth_deterministic || bad synth_deterministic

# --- run
expect help_run "$moe" run --help
for arch in qwen3moe qwen2moe olmoe llama qwen3 qwen2; do
  expect "run_$arch" "$moe" run -m "$arch.gguf" -p "Once upon a time" -n 16 --seed 1
done
grep -qE "prompt: [0-9]+ tokens .* tok/s\); generated: 16 tokens" run_qwen3moe.err && ok run_reports_speed \
  || bad run_reports_speed
"$moe" run -m qwen3moe.gguf -p "abc" -n 24 --seed 42 -q >s1.out 2>/dev/null
"$moe" run -m qwen3moe.gguf -p "abc" -n 24 --seed 42 -q >s2.out 2>/dev/null
"$moe" run -m qwen3moe.gguf -p "abc" -n 24 --seed 43 -q >s3.out 2>/dev/null
cmp -s s1.out s2.out && ok same_seed_same_text || bad same_seed_same_text
cmp -s s1.out s3.out && bad other_seed_other_text || ok other_seed_other_text
"$moe" run -m qwen3moe.gguf -p "abc" -n 24 --temp 0 -q --seed 1 >g1.out 2>/dev/null
"$moe" run -m qwen3moe.gguf -p "abc" -n 24 --temp 0 -q --seed 2 >g2.out 2>/dev/null
cmp -s g1.out g2.out && ok greedy_ignores_seed || bad greedy_ignores_seed
expect run_f16_cache "$moe" run -m qwen3moe.gguf -p "abc" -n 24 --temp 0 -q --cache-type f16
expect_fail run_bad_cache_type 2 "bad value 'f8' for --cache-type" "$moe" run -m qwen3moe.gguf -p hi --cache-type f8
expect_fail run_missing_model 1 "nothing.gguf" "$moe" run -m nothing.gguf -p hi
expect run_default_model env -u MOE_MODEL "$moe" run -p "The meaning of life is" -n 8 --seed 1
expect_fail run_model_from_env 1 "/nonexistent/m.gguf" env MOE_MODEL=/nonexistent/m.gguf "$moe" run -p hi
expect_fail run_empty_prompt 2 "prompt is empty" "$moe" run -m qwen3moe.gguf -p ""
expect_fail run_unknown_flag 2 "unknown option" "$moe" run -m qwen3moe.gguf -p hi --frobnicate
expect_fail run_bad_temp 2 "bad value '-1' for --temp" "$moe" run -m qwen3moe.gguf -p hi --temp -1
expect_fail run_context_overflow 1 "the prompt has [0-9]+ tokens but the context holds 8" \
  "$moe" run -m qwen3moe.gguf -p "this prompt is longer than eight tokens" --ctx-size 8
printf 'GGUF\003\000\000\000' >broken.gguf
expect_fail run_broken_file 1 "broken.gguf" "$moe" run -m broken.gguf -p hi
"$moe" synth -q --preset tiny --arch qwen3moe unknown_arch.gguf
sed 's/qwen3moe/qwen9moe/g' unknown_arch.gguf >wrong_arch.gguf
expect_fail run_wrong_arch 1 "architecture 'qwen9moe' is not supported" "$moe" run -m wrong_arch.gguf -p hi

# --- chat
expect help_chat "$moe" chat --help
printf 'Hello\nTell me more\n/reset\nAgain\n' >turns.txt
expect chat_turns "$moe" chat -m qwen3moe.gguf -n 8 --seed 1 <turns.txt
expect_fail chat_bad_template 1 "unknown chat template \"nonsense\"" "$moe" chat -m qwen3moe.gguf --chat-template nonsense

# --- tokenize
expect tokenize_pieces "$moe" tokenize -m qwen3moe.gguf -p "Hi <|im_start|>"
grep -q "<|im_start|>" tokenize_pieces.out && ok tokenize_special || bad tokenize_special
expect tokenize_ids "$moe" tokenize -m qwen3moe.gguf -p "Hi" --ids
[ "$(cat tokenize_ids.out)" = "72,105" ] && ok tokenize_ids_value || bad "tokenize_ids_value ($(cat tokenize_ids.out))"
printf 'from a file\n' >text.txt
expect tokenize_file "$moe" tokenize -m qwen3moe.gguf -f text.txt --ids
expect_fail tokenize_both 2 "exactly one" "$moe" tokenize -m qwen3moe.gguf -p a -f text.txt

# --- logits: teacher-forced logits, raw float32
expect logits_out "$moe" logits -m qwen3moe.gguf --tokens 72,105,33,10 --out logits.bin
[ "$(stat -c %s logits.bin)" -eq $((4 * 512 * 4)) ] && ok logits_size || bad logits_size
python3 - <<'PY' && ok logits_finite || bad logits_finite
import array, math
a = array.array("f"); a.frombytes(open("logits.bin", "rb").read())
assert all(math.isfinite(v) for v in a) and max(abs(v) for v in a) < 100
PY
expect_fail logits_bad_tokens 2 "comma-separated" "$moe" logits -m qwen3moe.gguf --tokens 1,x
expect_fail logits_out_of_vocab 1 "outside the vocabulary" "$moe" logits -m qwen3moe.gguf --tokens 1,99999

# --- perplexity equals exp(mean NLL) computed from `moe logits` in Python
printf 'The quick brown fox jumps over the lazy dog. It was the best of times.\n' >ppl.txt
expect help_perplexity "$moe" perplexity --help
expect perplexity "$moe" perplexity -m qwen3moe.gguf -f ppl.txt --ctx 16 --max-windows 2
ids=$("$moe" tokenize -m qwen3moe.gguf -f ppl.txt --ids)
first32=$(echo "$ids" | cut -d, -f1-32)
"$moe" logits -m qwen3moe.gguf --tokens "$(echo "$first32" | cut -d, -f1-16)" --out w0.bin >/dev/null 2>&1
"$moe" logits -m qwen3moe.gguf --tokens "$(echo "$first32" | cut -d, -f17-32)" --out w1.bin >/dev/null 2>&1
python3 - "$first32" "$(cat perplexity.out)" <<'PY' && ok perplexity_matches_logits || bad perplexity_matches_logits
import array, math, re, sys
ids = [int(x) for x in sys.argv[1].split(",")]
nll = []
for w, name in enumerate(["w0.bin", "w1.bin"]):
    a = array.array("f"); a.frombytes(open(name, "rb").read())
    window = ids[16 * w:16 * w + 16]
    for i in range(15):
        row = a[i * 512:(i + 1) * 512]; m = max(row)
        nll.append(math.log(sum(math.exp(v - m) for v in row)) + m - row[window[i + 1]])
want = math.exp(sum(nll) / len(nll))
got = float(re.search(r"perplexity ([0-9.]+)", sys.argv[2]).group(1))
assert abs(got - want) / want < 1e-4, (got, want)
PY
expect_fail perplexity_short_text 1 "fewer than one window" "$moe" perplexity -m qwen3moe.gguf -f ppl.txt --ctx 4096

e2e_summary
