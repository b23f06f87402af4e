#!/usr/bin/env bash
# End-to-end: `moe serve`'s command line and life cycle, without an HTTP
# client (tests/server has those): help, usage errors, a port in use, and
# SIGINT stopping it with status 0.
# usage: e2e_serve.sh MOE FIXTURE_MODEL SCRATCH_DIR
set -u
moe=$1 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
passed=0 failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
expect_fail() { # expect_fail NAME STATUS PATTERN COMMAND...: fails with STATUS, stderr matches PATTERN
  local name=$1 status=$2 pattern=$3; shift 3
  timeout 30 "$@" >"$name.out" 2>"$name.err" </dev/null # a server that wrongly starts is stopped (124)
  local got=$?
  if [ "$got" -eq "$status" ] && grep -qE -- "$pattern" "$name.err"; then ok "$name"
  else bad "$name (exit $got, stderr: $(head -c 300 "$name.err"))"; fi
}
# start NAME ARGS...: a server on a free port; sets pid and port
start() {
  local name=$1; shift
  "$moe" serve -m model.gguf --port 0 "$@" 2>"$name.err" &
  pid=$! port=
  for _ in $(seq 300); do
    port=$(sed -n 's|^moe serve: listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$name.err")
    [ -n "$port" ] || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.1
  done
}

"$moe" synth -q --preset tiny --arch qwen3moe --type q8_0 model.gguf || exit 1

"$moe" serve --help >help.out 2>&1 && grep -q -- "--parallel N" help.out && ok help || bad help
expect_fail bad_parallel 2 "--parallel wants a number from 1" "$moe" serve -m model.gguf --parallel 0
expect_fail bad_port 2 "--port wants a number" "$moe" serve -m model.gguf --port 70000
expect_fail bad_log_format 2 "--log-format wants text or json" "$moe" serve -m model.gguf --log-format xml
expect_fail unknown_flag 2 "unknown option" "$moe" serve -m model.gguf --frobnicate
expect_fail bad_template 1 "unknown chat template" "$moe" serve -m model.gguf --chat-template nonsense --port 0
expect_fail bad_host 1 "cannot resolve --host no.such.host.invalid" \
  "$moe" serve -m model.gguf --host no.such.host.invalid --port 0

start first --parallel 2
if [ -n "$port" ]; then
  ok starts
  grep -q "2 slots of 512 positions, queue 64" first.err && ok reports_slots || bad reports_slots
  expect_fail port_in_use 1 "cannot listen on 127.0.0.1 port $port" "$moe" serve -m model.gguf --port "$port"
  kill -INT "$pid"
  wait "$pid"
  status=$?
  [ "$status" -eq 0 ] && grep -q '^moe serve: stopped$' first.err && ok sigint_exits_0 || bad "sigint_exits_0 ($status)"
else
  bad "starts ($(head -c 300 first.err))"
  kill -KILL "$pid" 2>/dev/null
fi

start f16 --cache-type f16
grep -q "1 slot of 512 positions in an f16 KV cache" f16.err && ok reports_f16_cache || bad "reports_f16_cache ($(head -c 300 f16.err))"
kill -INT "$pid" 2>/dev/null
wait "$pid"
expect_fail bad_cache_type 2 "bad value 'q4' for --cache-type" "$moe" serve -m model.gguf --cache-type q4

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
