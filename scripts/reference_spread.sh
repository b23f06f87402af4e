#!/usr/bin/env bash
# scripts/reference_spread.sh — how far the CPU reference agrees with
# itself on a quantized model: the same teacher-forced logits (`moe logits`,
# 64 positions of fixed random tokens) through the CPU's AVX-512, AVX2 and
# portable kernels, each against the first level as relative L2 error per
# position. The levels sum in different orders, so now and then an
# activation lands on the other side of an int8 rounding boundary; the
# spread this prints is the floor under any GPU-vs-CPU comparison that does
# not reproduce the reference's order of additions (issue 5's 1e-3 limit on
# the synthetic 30B-A3B file; bench/decode-plan.md, "Correctness").
# Levels this CPU lacks are skipped (MOE_CPU_ISA lowers, never raises).
# usage: reference_spread.sh MOE MODEL [SCRATCH_DIR]
set -u
moe=$1 model=$2 dir=${3:-/tmp/moe-reference-spread}
mkdir -p "$dir"
positions=64
tokens=$(python3 -c "import random; random.seed(5); print(','.join(str(random.randrange(1000, 30000)) for _ in range($positions)))")
levels=()
for isa in avx512 avx2 portable; do
    out="$dir/logits-$isa.bin"
    if MOE_CPU_ISA=$isa "$moe" logits -m "$model" --tokens "$tokens" --out "$out" --device cpu 2>"$dir/$isa.log" >/dev/null &&
        ! grep -q "MOE_CPU_ISA" "$dir/$isa.log"; then
        levels+=("$isa")
    else
        echo "$isa: skipped ($(tail -1 "$dir/$isa.log"))"
    fi
done
[ ${#levels[@]} -ge 2 ] || { echo "fewer than two kernel levels ran" >&2; exit 1; }
python3 - "$dir" "$positions" "${levels[@]}" <<'EOF'
import array, math, sys
d, n, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(isa):
    a = array.array('f')
    with open(f"{d}/logits-{isa}.bin", 'rb') as f:
        a.frombytes(f.read())
    return a
ref = load(levels[0])
vocab = len(ref) // n
for isa in levels[1:]:
    other = load(isa)
    errs = []
    for p in range(n):
        x, y = other[p * vocab:(p + 1) * vocab], ref[p * vocab:(p + 1) * vocab]
        num = sum((u - v) * (u - v) for u, v in zip(x, y))
        den = sum(v * v for v in y)
        errs.append(math.sqrt(num / den) if den > 0 else 0.0)
    first = next((p for p, e in enumerate(errs) if e > 1e-5), None)
    print(f"{isa} vs {levels[0]}: worst rel L2 {max(errs):.3g}, median {sorted(errs)[n // 2]:.3g}, "
          f"first position above 1e-5: {first}")
EOF
