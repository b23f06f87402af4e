#!/usr/bin/env bash
# End-to-end: the shipped demo model. Its held-out perplexity under
# `moe perplexity` must match PyTorch's evaluation of the same weights
# (training/results/summary.json) within 1%, and the README's main-job
# command must produce text.
# usage: e2e_demo_model.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
moe=$1 dir=$3
root=$(dirname "$here")
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
. "$here/e2e_common.inc"

python3 -c "import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
  "$root/data/demo/heldout.txt.xz" >heldout.txt || exit 1
expect main_job env -u MOE_MODEL "$moe" run -p "Once upon a time" -n 64 --seed 1
# A sampled story may end (end of text) before 64 tokens: ask for a few
# sentences' worth, counted by the speed report's tokens and by words.
generated=$(sed -n 's/.*generated: \([0-9]*\) tokens.*/\1/p' main_job.err)
[ "${generated:-0}" -ge 16 ] && [ "$(wc -w <main_job.out)" -ge 10 ] && ok main_job_writes_text ||
  bad "main_job_writes_text (${generated:-no} tokens: $(head -c 200 main_job.out))"
expect perplexity "$moe" perplexity -m "$root/models/moe-demo-q8_0.gguf" -f heldout.txt --ctx 256
python3 - "$root/training/results/summary.json" "$(cat perplexity.out)" <<'PY' && ok matches_pytorch || bad matches_pytorch
import json, re, sys
summary = json.load(open(sys.argv[1]))
want = summary["heldout"]["perplexity"]
got = float(re.search(r"perplexity ([0-9.]+)", sys.argv[2]).group(1))
print("moe.c q8_0 %.3f, PyTorch fp32 %.3f" % (got, want))
assert abs(got - want) / want <= 0.01, (got, want)
PY
e2e_summary
