#!/usr/bin/env bash
# The reference at scale (issue 4), on the GPU machine: make the 2-layer
# Qwen3-30B-A3B-wide checkpoint and transformers' logits, convert it with
# `moe convert`, run `moe logits` on the CPU, and require max |Δ| / rms of
# the reference <= 1e-4 at every position.
# usage: at_scale_check.sh MOE WORKDIR
set -euo pipefail
moe=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$work" && mkdir -p "$work"
python3 "$here/tests/golden/at_scale.py" "$work/hf"
"$moe" convert -q --type f32 "$work/hf" "$work/model.gguf"
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$work/hf/reference.json")
"$moe" logits -m "$work/model.gguf" --device cpu --tokens "$ids" --out "$work/moe_logits.f32" >/dev/null
python3 - "$work" <<'PY'
import json, sys
import numpy as np
work = sys.argv[1]
vocab = json.load(open(work + "/hf/reference.json"))["vocab"]
ref = np.fromfile(work + "/hf/reference_logits.f32", dtype="<f4").reshape(-1, vocab).astype(np.float64)
got = np.fromfile(work + "/moe_logits.f32", dtype="<f4").reshape(-1, vocab).astype(np.float64)
worst = max(np.abs(g - r).max() / np.sqrt((r * r).mean()) for g, r in zip(got, ref))
print("at scale: %d positions, worst max|Δlogit|/rms %.3g (bound 1e-4), argmax agree %d/%d" % (
    len(ref), worst, int((got.argmax(1) == ref.argmax(1)).sum()), len(ref)))
sys.exit(0 if worst <= 1e-4 else 1)
PY
