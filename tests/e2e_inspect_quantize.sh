#!/usr/bin/env bash
# End-to-end: `moe inspect` and `moe quantize` through the built program.
# usage: e2e_inspect_quantize.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
moe=$1 fixture=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
. "$here/e2e_common.inc"

"$fixture" model.gguf f32 || { echo "cannot build the fixture"; exit 1; }

# --- help and usage
expect help_top "$moe" --help
expect help_inspect "$moe" inspect --help
expect help_quantize "$moe" quantize --help
grep -q "q4_k_m" help_quantize.out && ok help_lists_types || bad help_lists_types
expect_fail unknown_command 2 "unknown command" "$moe" frobnicate
expect_fail unknown_option 2 "--help" "$moe" inspect --bogus model.gguf

# --- inspect
expect inspect_text "$moe" inspect model.gguf
grep -q "qwen3moe: 4 layers, hidden size 256" inspect_text.out && ok inspect_summary || bad inspect_summary
grep -q "blk.3.ffn_down_exps.weight" inspect_text.out && ok inspect_tensor_table || bad inspect_tensor_table
grep -qE "tokenizer.ggml.tokens +string\[512\] +\[.*more\]" inspect_text.out && ok inspect_abbreviates_arrays \
  || bad inspect_abbreviates_arrays
grep -qE "^  f32 +51 tensors" inspect_text.out && ok inspect_totals || bad inspect_totals
expect inspect_json "$moe" inspect --json model.gguf
json inspect_json.out "d['model']['experts']==8 and d['model']['experts_used']==2 and len(d['tensors'])==51 \
  and d['metadata']['tokenizer.ggml.tokens']['count']==512" && ok inspect_json_fields || bad inspect_json_fields

# --- inspect: bad files
expect_fail inspect_missing 1 "nothing.gguf" "$moe" inspect nothing.gguf
head -c 1000 model.gguf >truncated.gguf
expect_fail inspect_truncated 1 "truncated.gguf" "$moe" inspect truncated.gguf
printf 'not a gguf file at all, just text' >text.gguf
expect_fail inspect_bad_magic 1 "magic" "$moe" inspect text.gguf

# --- quantize (4 layers: layers 2 and 3 get more bits in the _m mixes)
expect quantize_q4_k_m "$moe" quantize -t 2 model.gguf q4km.gguf q4_k_m
expect inspect_q4km "$moe" inspect --json q4km.gguf
json inspect_q4km.out "
{t['name']: t['type'] for t in d['tensors']}['output.weight'] == 'q6_k' and
{t['name']: t['type'] for t in d['tensors']}['blk.0.attn_v.weight'] == 'q4_k' and
{t['name']: t['type'] for t in d['tensors']}['blk.2.attn_v.weight'] == 'q6_k' and
{t['name']: t['type'] for t in d['tensors']}['blk.3.ffn_down_exps.weight'] == 'q6_k' and
{t['name']: t['type'] for t in d['tensors']}['blk.2.ffn_up_exps.weight'] == 'q4_k' and
{t['name']: t['type'] for t in d['tensors']}['blk.2.ffn_gate_inp.weight'] == 'f32' and
{t['name']: t['type'] for t in d['tensors']}['blk.2.attn_norm.weight'] == 'f32' and
d['metadata']['general.file_type'] == 15 and d['metadata']['general.name'] == 'moe.c test fixture'" \
  && ok q4_k_m_recipe || bad q4_k_m_recipe
expect quantize_q8_0_from_quantized "$moe" quantize -q q4km.gguf q8.gguf q8_0
json <("$moe" inspect --json q8.gguf) "{t['name']: t['type'] for t in d['tensors']}['output.weight'] == 'q8_0'" \
  && ok q8_0_head || bad q8_0_head
for type in q4_0 q4_1 q5_0 q5_1 q5_k_m q6_k iq4_nl mxfp4 bf16 f16; do
  expect "quantize_$type" "$moe" quantize -q model.gguf "$type.gguf" "$type"
done

# --- quantize: refusals leave nothing behind
cp model.gguf keep.gguf
expect_fail quantize_onto_input 1 "refusing to overwrite" "$moe" quantize model.gguf model.gguf q8_0
ln -sf model.gguf alias.gguf
expect_fail quantize_onto_input_alias 1 "refusing to overwrite" "$moe" quantize model.gguf alias.gguf q8_0
cmp -s model.gguf keep.gguf && ok input_untouched || bad input_untouched
expect_fail quantize_unknown_type 2 "unknown type" "$moe" quantize model.gguf out.gguf q3_xyz
expect_fail quantize_bad_input 1 "truncated.gguf" "$moe" quantize truncated.gguf out.gguf q8_0
expect_fail quantize_missing_args 2 "expected IN OUT TYPE" "$moe" quantize model.gguf
[ ! -e out.gguf ] && ! ls ./*.tmp.* >/dev/null 2>&1 && ok no_partial_output || bad no_partial_output

# --- a second, independent reader: Hugging Face's GGUF parser
oracle="$here/oracle"
if [ -d "$oracle/node_modules/@huggingface/gguf" ] && command -v node >/dev/null; then
  for f in model.gguf q4km.gguf mxfp4.gguf; do
    node "$oracle/gguf_summary.mjs" "$f" >"hf_$f.json" 2>"hf_$f.err" && "$moe" inspect --json "$f" >"moe_$f.json"
    python3 - "hf_$f.json" "moe_$f.json" <<'PY' && ok "hf_parser_agrees_$f" || bad "hf_parser_agrees_$f"
import json, sys
hf, moe = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ids = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_k": 12, "q5_k": 13,
       "q6_k": 14, "iq4_nl": 20, "bf16": 30, "mxfp4": 39}
assert hf["data_offset"] == moe["data_offset"], (hf["data_offset"], moe["data_offset"])
assert hf["metadata_keys"] == list(moe["metadata"].keys())
assert len(hf["tensors"]) == len(moe["tensors"])
for a, b in zip(hf["tensors"], moe["tensors"]):
    assert a["name"] == b["name"] and a["shape"] == b["shape"] and a["offset"] == b["offset"], (a, b)
    assert a["type"] == ids[b["type"]], (a, b)
PY
  done
else
  echo "skip hf_parser_agrees (run 'npm ci --prefix tests/oracle')"
fi

e2e_summary
