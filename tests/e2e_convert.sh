#!/usr/bin/env bash
# End-to-end: `moe convert` on tiny Hugging Face checkpoints written by
# tests/hf_model.py (standard library only: no torch needed), and its errors.
#
# Numbers against Transformers are the golden test's (tests/golden); here
# the converter is held to itself in ways that need no reference:
#  - every architecture converts, loads and runs;
#  - one set of weights as a llama and as a qwen2 checkpoint (zero biases)
#    gives the same logits, although llama's q/k rows are reordered for
#    GGUF's adjacent RoPE pairs and qwen2's are not: this pins the
#    reordering. Mixtral against Qwen2-MoE does the same for experts;
#  - layouts that hold the same numbers give byte-identical files: fused
#    (Transformers 5) or per-expert experts, one file or shards, bf16/f16
#    weights or their values stored as f32;
#  - every malformed input is one clear error, exit 1, and no output.
# usage: e2e_convert.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
moe=$1 dir=$3
make_hf="python3 $(cd "$(dirname "$0")" && pwd)/hf_model.py"
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
expect() { # expect NAME COMMAND...: the command succeeds
  local name=$1; shift
  if "$@" >"$name.out" 2>"$name.err"; then ok "$name"; else bad "$name (exit $?)"; cat "$name.err"; fi
}
same_file() { # same_file NAME A B: byte-identical
  cmp -s "$2" "$3" && ok "$1" || bad "$1 ($2 and $3 differ)"
}
tokens=5,70,200,3,9,100,44,12,250,1
same_logits() { # same_logits NAME A.gguf B.gguf: logits agree to 1e-5 of their rms
  "$moe" logits -m "$2" --tokens $tokens --out "$1.a" >/dev/null 2>&1 &&
  "$moe" logits -m "$3" --tokens $tokens --out "$1.b" >/dev/null 2>&1 &&
  python3 - "$1.a" "$1.b" <<'PY' && ok "$1" || bad "$1"
import array, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:])
rms = (sum(x * x for x in a) / len(a)) ** 0.5
diff = max(abs(x - y) for x, y in zip(a, b))
print("max diff %.3g, rms %.3g" % (diff, rms))
sys.exit(not (len(a) == len(b) and diff <= 1e-5 * rms))
PY
}
expect_fail() { # expect_fail NAME PATTERN DIR: converting DIR fails with exit 1, PATTERN, no output
  local name=$1 pattern=$2 src=$3
  "$moe" convert -q "$src" "$name.gguf" >"$name.out" 2>"$name.err"
  local got=$?
  if [ "$got" -eq 1 ] && grep -qE -- "$pattern" "$name.err" && [ ! -e "$name.gguf" ] &&
     [ -z "$(ls | grep '\.tmp\.')" ]; then ok "$name"
  else bad "$name (exit $got, stderr: $(head -c 300 "$name.err"))"; fi
}

# --- every architecture: converts, loads, runs
expect help_convert "$moe" convert --help
for arch in llama mistral mixtral qwen2 qwen2moe qwen3 qwen3moe olmoe; do
  extra=""
  [ "$arch" = qwen2moe ] && extra="--shared-ff 48"
  [ "$arch" = qwen3 ] && extra="--head-dim 24"
  $make_hf "$arch" "hf_$arch" $extra
  expect "convert_$arch" "$moe" convert "hf_$arch" "$arch.gguf"
  expect "run_$arch" "$moe" run -m "$arch.gguf" -p "Hello" -n 4 --temp 0 -q
done
python3 - "$moe" <<'PY' && ok inspect_hparams || bad inspect_hparams
import json, subprocess, sys
want = {"llama": ("llama", 0), "mistral": ("llama", 0), "mixtral": ("llama", 4), "qwen2": ("qwen2", 0),
        "qwen2moe": ("qwen2moe", 4), "qwen3": ("qwen3", 0), "qwen3moe": ("qwen3moe", 4), "olmoe": ("olmoe", 4)}
for name, (arch, experts) in want.items():
    d = json.loads(subprocess.run([sys.argv[1], "inspect", "--json", name + ".gguf"], capture_output=True).stdout)
    m = d["model"]
    assert (m["architecture"], m.get("experts", 0)) == (arch, experts), (name, m)
    assert m["head_dim"] == (24 if name == "qwen3" else 16), (name, m)
    names = {t["name"] for t in d["tensors"]}
    assert ("blk.0.ffn_gate_exps.weight" in names) == (experts > 0), name
    assert ("blk.0.ffn_gate_inp_shexp.weight" in names) == (name == "qwen2moe"), name
    assert ("blk.0.attn_q.bias" in names) == name.startswith("qwen2"), name
    meta = d["metadata"]
    assert meta["general.name"] == name, meta["general.name"]
PY

# --- the llama q/k reordering and the expert mapping, without a reference
$make_hf llama same_llama --name same
$make_hf qwen2 same_qwen2 --name same --zero-bias
"$moe" convert -q same_llama same_llama.gguf && "$moe" convert -q same_qwen2 same_qwen2.gguf
same_logits llama_equals_neox_qwen2 same_llama.gguf same_qwen2.gguf
$make_hf mixtral same_mixtral --name same --norm-topk
$make_hf qwen2moe same_qwen2moe --name same --zero-bias --norm-topk
"$moe" convert -q same_mixtral same_mixtral.gguf && "$moe" convert -q same_qwen2moe same_qwen2moe.gguf
same_logits mixtral_equals_neox_qwen2moe same_mixtral.gguf same_qwen2moe.gguf
$make_hf mistral same_mistral --name same
"$moe" convert -q same_mistral same_mistral.gguf
same_file mistral_is_llama same_llama.gguf same_mistral.gguf

# --- layouts of the same numbers give the same file
for arch in mixtral qwen3moe; do
  $make_hf "$arch" "fused_$arch" --name "$arch" --fused
  "$moe" convert -q "fused_$arch" "fused_$arch.gguf"
  same_file "fused_experts_$arch" "$arch.gguf" "fused_$arch.gguf"
done
$make_hf qwen2moe sharded --name qwen2moe --shared-ff 48 --shards 4
"$moe" convert -q sharded sharded.gguf
same_file sharded_checkpoint qwen2moe.gguf sharded.gguf
for half in bf16 f16; do
  $make_hf qwen3 "$half" --name h --dtype "$half"
  $make_hf qwen3 "${half}_as_f32" --name h --round "$half"
  "$moe" convert -q --type f32 "$half" "$half.gguf" && "$moe" convert -q "${half}_as_f32" "${half}_as_f32.gguf"
  same_file "${half}_weights" "$half.gguf" "${half}_as_f32.gguf"
  "$moe" convert -q "$half" "$half.default.gguf" && "$moe" convert -q --type "$half" "$half" "$half.typed.gguf"
  same_file "${half}_default_type" "$half.default.gguf" "$half.typed.gguf"
done

# --- quantizing from the checkpoint: the recipe's types, logits close to f32
$make_hf qwen3moe wide --hidden 256 --heads 4 --head-dim 64 --expert-ff 256
expect convert_q4_k_m "$moe" convert -q --type q4_k_m wide wide_q4.gguf
"$moe" convert -q wide wide_f32.gguf
"$moe" inspect --json wide_q4.gguf | python3 -c "
import json, sys
types = {t['name']: t['type'] for t in json.load(sys.stdin)['tensors']}
assert types['blk.0.ffn_up_exps.weight'] == 'q4_k' and types['blk.0.ffn_down_exps.weight'] == 'q4_k', types
assert types['blk.1.ffn_down_exps.weight'] == 'q6_k', types  # the last eighth of the layers
assert types['blk.0.ffn_gate_inp.weight'] == 'f32' and types['output.weight'] == 'q6_k', types
" && ok q4_k_m_types || bad q4_k_m_types
"$moe" logits -m wide_f32.gguf --tokens $tokens --out wide_f32.bin >/dev/null 2>&1
"$moe" logits -m wide_q4.gguf --tokens $tokens --out wide_q4.bin >/dev/null 2>&1
python3 - <<'PY' && ok q4_k_m_logits || bad q4_k_m_logits
import array
a, b = (array.array("f", open(p, "rb").read()) for p in ("wide_f32.bin", "wide_q4.bin"))
num = sum((x - y) ** 2 for x, y in zip(a, b)); den = sum(x * x for x in a)
print("relative L2 %.3g" % (num / den) ** 0.5)
assert len(a) == len(b) and (num / den) ** 0.5 < 0.3
PY

# --- errors: one clear message, exit 1, no output file
mkdir empty
expect_fail no_config "empty/config.json" empty
expect_fail no_dir "nowhere/config.json" nowhere
cp -r hf_llama no_weights && rm no_weights/model.safetensors
expect_fail no_weights "has neither model.safetensors nor model.safetensors.index.json" no_weights
cp -r hf_llama truncated && truncate -s -100 truncated/model.safetensors
expect_fail truncated "truncated" truncated
cp -r hf_llama garbage && printf 'GGUF\003\000\000\000garbage' >garbage/model.safetensors
expect_fail bad_header_length "header length" garbage
cp -r hf_llama bad_json && printf '\020\000\000\000\000\000\000\000{"a": [1, 2,}   ' >bad_json/model.safetensors
expect_fail bad_header_json "bad JSON header" bad_json
cp -r hf_llama broken_config && printf '{"architectures": ' >broken_config/config.json
expect_fail broken_config "config.json" broken_config
$make_hf llama wrong_shape --set intermediate_size=100
expect_fail wrong_shape "tensor model.layers.0.mlp.gate_proj.weight has shape \[96, 64\], but config.json implies \[100, 64\]" wrong_shape
$make_hf llama unknown_arch --set 'architectures=["GPT2LMHeadModel"]'
expect_fail unknown_arch "architecture GPT2LMHeadModel is not supported" unknown_arch
$make_hf llama missing_tensor --drop model.layers.1.self_attn.k_proj.weight
expect_fail missing_tensor "tensor model.layers.1.self_attn.k_proj.weight is missing" missing_tensor
$make_hf llama unused_tensor --extra model.layers.0.self_attn.o_proj.bias:64
expect_fail unused_tensor "tensor model.layers.0.self_attn.o_proj.bias .* has no place in a LlamaForCausalLM" unused_tensor
$make_hf llama yarn --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0}'
expect_fail unsupported_rope "RoPE scaling \"yarn\" is not supported" yarn
$make_hf qwen3moe dense_layer --set 'mlp_only_layers=[1]'
expect_fail dense_layer "layer 1 is dense" dense_layer
$make_hf olmoe clip --set clip_qkv=8
expect_fail clip_qkv "clip_qkv is set" clip
$make_hf qwen2moe bad_shard --shards 2
sed -i 's/model-00002-of-00002/..\/elsewhere/' bad_shard/model.safetensors.index.json
expect_fail shard_outside_dir "bad shard name" bad_shard
$make_hf qwen2moe lost_shard --shards 2
rm lost_shard/model-00002-of-00002.safetensors
expect_fail missing_shard "cannot open .*model-00002-of-00002.safetensors" lost_shard
printf 'old' >kept.gguf
"$moe" convert -q truncated kept.gguf 2>/dev/null
[ "$(cat kept.gguf)" = old ] && ok failure_keeps_old_output || bad failure_keeps_old_output
"$moe" convert -q hf_llama hf_llama/model.safetensors >overwrite.out 2>overwrite.err
[ $? -eq 1 ] && grep -q "refusing to overwrite" overwrite.err && ok refuses_own_checkpoint || bad refuses_own_checkpoint
"$moe" convert -q --type q9_z hf_llama x.gguf 2>bad_type.err
[ $? -eq 2 ] && grep -q "unknown type 'q9_z'" bad_type.err && ok bad_type || bad bad_type

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
