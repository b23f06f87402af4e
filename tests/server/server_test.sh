#!/usr/bin/env bash
# `moe serve` end to end: start it on a free port of 127.0.0.1 (the client
# test with the shipped demo model, the load test with a tiny synthetic one
# to bound its time), run a node script against it, stop it with SIGTERM and
# check that it drained and exited 0 (under ASan: without leaks).
#   client  OpenAI's official client (client.mjs; it sends the SIGTERM
#           itself, mid-stream)
#   load    32 concurrent clients, a few hundred requests (load.mjs)
# usage: server_test.sh client|load MOE SCRATCH_DIR
# Without node or the openai package the test is skipped (exit 77), unless
# MOE_REQUIRE_ORACLE=1 (CI), when it fails.
set -u
mode=$1 moe=$2 dir=$3
here=$(cd "$(dirname "$0")" && pwd)

missing() {
  if [ "${MOE_REQUIRE_ORACLE:-0}" = 1 ]; then echo "FAIL: $1 (MOE_REQUIRE_ORACLE=1)"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
command -v node >/dev/null || missing "node is not installed"
[ -f "$here/../oracle/node_modules/openai/package.json" ] \
  || missing "the openai package is not installed (npm ci --prefix tests/oracle)"

rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
if [ "$mode" = client ]; then
  cp "$here/../../models/moe-demo-q8_0.gguf" model.gguf || exit 1
else
  "$moe" synth -q --preset tiny --arch qwen3moe --type q8_0 model.gguf || exit 1
fi

case $mode in
  client) args=(--parallel 2 --queue 4 --ctx-size 2048 --api-key test-key --timeout 5 --max-body 65536
                --drain-timeout 1 --alias demo) ;;
  load) args=(--parallel 4 --queue 64 --ctx-size 512 --alias tiny --log-format json) ;;
  *) echo "usage: server_test.sh client|load MOE SCRATCH_DIR"; exit 2 ;;
esac
"$moe" serve -m model.gguf --port 0 "${args[@]}" 2>server.log &
pid=$!

port=
for _ in $(seq 300); do
  port=$(sed -n 's|^moe serve: listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' server.log)
  [ -n "$port" ] || ! kill -0 "$pid" 2>/dev/null && break
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "FAIL: the server did not start"; cat server.log; kill -KILL "$pid" 2>/dev/null; exit 1
fi

MOE_URL=http://127.0.0.1:$port MOE_SERVER_PID=$pid MOE_BIN=$moe MOE_MODEL_FILE=$dir/model.gguf \
  node "$here/$mode.mjs"
status=$?

# Stop it (the client test has already) and give the drain its bound.
kill -TERM "$pid" 2>/dev/null
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the server did not exit within 30 s of SIGTERM"; kill -KILL "$pid"; status=1
fi
wait "$pid"
server_status=$?
echo "--- server log (last lines)"; tail -n 15 server.log
if [ "$server_status" -ne 0 ]; then echo "FAIL: the server exited with $server_status"; status=1; fi
grep -q '^moe serve: stopped$' server.log || { echo "FAIL: no 'stopped' line"; status=1; }

if [ "$mode" = client ]; then
  # The two requests whose clients gave up (one streamed, one not) stopped
  # early: their generations are far from the 1500 tokens asked for.
  early=$(grep -E 'POST /v1/completions (200|-) .* aborted$' server.log |
          sed -n 's/.* completion=\([0-9]*\) .*/\1/p' | awk '$1 < 1000' | wc -l)
  if [ "$early" -lt 2 ]; then
    echo "FAIL: $early aborted requests stopped early in the log, expected 2"; grep aborted server.log; status=1
  fi
  [ "$(grep -c ' timeout$' server.log)" -ge 1 ] || { echo "FAIL: no request ended by the timeout in the log"; status=1; }
fi
if [ "$mode" = load ]; then
  lines=$(grep -c '^{"time"' server.log)
  [ "$lines" -ge 320 ] || { echo "FAIL: $lines JSON access-log lines, expected 320"; status=1; }
fi
exit "$status"
