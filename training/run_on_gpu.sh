#!/usr/bin/env bash
# run_on_gpu.sh OUTDIR [--smoke] [train_demo.py options...]
#
# Trains moe.c's demo model in one go on a machine with one CUDA GPU and
# PyTorch, transformers, tokenizers, safetensors and numpy: tokenizer
# (training/train_tokenizer.py), model training within a wall-clock budget,
# held-out evaluation, export, samples (training/train_demo.py). Reads the
# corpus from data/demo/*.xz (training/prepare_corpus.py makes it); needs no
# network. OUTDIR receives what should come back: demo-moe.tar.partNN (the
# model folder; `cat demo-moe.tar.part* | tar x`), train_log.csv,
# summary.json, samples.txt and run.log: at most 8 files.
#
#   training/run_on_gpu.sh "$OUT"               the real run (budget 7 min)
#   training/run_on_gpu.sh "$OUT" --smoke       a tiny model, 20 steps, with an
#                                               interruption and --resume at step 10
#   MAX_MINUTES=5 training/run_on_gpu.sh "$OUT" another training budget
#
# Checkpoints and intermediate files go to $MOE_DEMO_WORK (default
# training/run, git-ignored; kept between calls while the machine stays
# warm): run the same command again with --resume to continue a cut run.
set -euo pipefail

OUT=${1:?usage: run_on_gpu.sh OUTDIR [--smoke] [train_demo.py options]}
shift
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then
    SMOKE=1
    shift
fi
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
CORPUS=${MOE_DEMO_CORPUS:-$ROOT/data/demo}
WORK=${MOE_DEMO_WORK:-$HERE/run}
MAX_MINUTES=${MAX_MINUTES:-7}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

start=$(date +%s)
echo "run_on_gpu.sh: $(date -u +%FT%TZ) smoke=$SMOKE budget=${MAX_MINUTES} min corpus=$CORPUS work=$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if [ "$SMOKE" = 1 ]; then
    WORK=$WORK-smoke
    rm -rf "$WORK"
    mkdir -p "$WORK"
    python3 "$HERE/train_tokenizer.py" --corpus "$CORPUS" --out "$WORK/tokenizer" --vocab 1024
    common=(--corpus "$CORPUS" --tokenizer "$WORK/tokenizer" --work "$WORK" --out "$OUT" --smoke "$@")
    python3 "$HERE/train_demo.py" "${common[@]}" --stop-after 10
    python3 "$HERE/train_demo.py" "${common[@]}" --resume
else
    mkdir -p "$WORK"
    resume=0
    for a in "$@"; do [ "$a" = "--resume" ] && resume=1; done
    if [ "$resume" = 0 ] || [ ! -f "$WORK/tokenizer/tokenizer.json" ]; then
        python3 "$HERE/train_tokenizer.py" --corpus "$CORPUS" --out "$WORK/tokenizer" --vocab 8192
    fi
    python3 "$HERE/train_demo.py" --corpus "$CORPUS" --tokenizer "$WORK/tokenizer" --work "$WORK" --out "$OUT" \
        --max-minutes "$MAX_MINUTES" "$@"
fi

echo "run_on_gpu.sh: done in $(( $(date +%s) - start )) s; files in $OUT:"
ls -l "$OUT"
