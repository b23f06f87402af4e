#!/usr/bin/env bash
# End-to-end: `moe bench` on the CPU with the fixture model: the table, the
# JSON, and -d (generation after a filled KV cache: "tgN @ dD", its bytes per
# token counting the cache at that depth).
# usage: e2e_bench.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
here=$(cd "$(dirname "$0")" && pwd)
moe=$1 fixture=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
. "$here/e2e_common.inc"

"$fixture" model.gguf f32 || { echo "cannot build the fixture"; exit 1; }

expect help_bench "$moe" bench --help
grep -q -- "--depth" help_bench.out && ok help_depth || bad help_depth

expect table "$moe" bench -m model.gguf --device cpu --threads 2 -p 8 -n 4 -r 1
grep -qE "\| pp8 +\|" table.out && grep -qE "\| tg4 +\|" table.out && ok table_rows || bad table_rows

expect depth "$moe" bench -m model.gguf --device cpu --threads 2 -p 0 -n 4 -d 16 -r 1
grep -qE "\| tg4 @ d16 +\|" depth.out && ok depth_row || bad depth_row

expect depth_json "$moe" bench -m model.gguf --device cpu --threads 2 -p 0 -n 4 -d 16 -r 1 -o json
expect flat_json "$moe" bench -m model.gguf --device cpu --threads 2 -p 0 -n 4 -r 1 -o json
# 4 tokens at positions 16..19 read 17..20 cached positions, at 0..3 read 1..4: 16 more each
python3 - depth_json.out flat_json.out <<'PY' && ok depth_bytes || bad depth_bytes
import json, sys
deep, flat = (json.load(open(p)) for p in sys.argv[1:3])
assert deep["depth"] == 16 and deep["tests"][0]["test"] == "tg4 @ d16"
extra = deep["tests"][0]["bytes_per_token"] - flat["tests"][0]["bytes_per_token"]
kv = 2 * 4 * 2 * 64 * 4  # tests/fixture_model.c: K and V x 4 layers x 2 KV heads x 64 x f32, per position
assert extra > 0 and abs(extra - 16 * kv) <= 1, (extra, 16 * kv)
PY

# an f16 cache: the backend says so and a cached position counts half the
# bytes (positions 16..19 read 18.5 cached positions on average)
expect depth_f16_json "$moe" bench -m model.gguf --device cpu --threads 2 -p 0 -n 4 -d 16 -r 1 -o json --cache-type f16
python3 - depth_f16_json.out depth_json.out <<'PY' && ok f16_cache_bytes || bad f16_cache_bytes
import json, sys
f16, f32 = (json.load(open(p)) for p in sys.argv[1:3])
assert f16["backend"] == "CPU (f16 KV)" and f32["backend"] == "CPU", (f16["backend"], f32["backend"])
kv = 2 * 4 * 2 * 64 * 4  # f32 bytes a position, as above
saved = f32["tests"][0]["bytes_per_token"] - f16["tests"][0]["bytes_per_token"]
assert abs(saved - 18.5 * kv / 2) <= 1, (saved, 18.5 * kv / 2)
PY
expect_fail bad_cache_type 2 "--cache-type wants f32 or f16, not 'q8_0'" "$moe" bench -m model.gguf --device cpu --cache-type q8_0

expect_fail depth_without_gen 2 "-n is 0" "$moe" bench -m model.gguf --device cpu -p 8 -n 0 -d 4
expect_fail bad_depth 2 "bad -d" "$moe" bench -m model.gguf --device cpu -d -1

e2e_summary
