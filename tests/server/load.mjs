// A bounded load test of `moe serve` on loopback: CLIENTS concurrent
// clients send REQUESTS requests in all, a mix of streamed and whole chat
// completions and completions. server_test.sh starts the server with
// --parallel 4 --queue 64, so no request should be refused: any 5xx fails
// the test (a 503 would only be deliberate with a smaller queue), and so
// does a reply that is not a complete, well-formed response. Prints the
// latency distribution and the throughput.
//
// env: MOE_URL (the server), LOAD_CLIENTS, LOAD_REQUESTS (defaults 32, 320).
const base = process.env.MOE_URL;
const CLIENTS = Number(process.env.LOAD_CLIENTS ?? 32);
const REQUESTS = Number(process.env.LOAD_REQUESTS ?? 320);
const DEADLINE_MS = 50_000; // stop sending after this, whatever is left

// A small deterministic generator, so that a failing mix can be replayed.
let state = 12345;
const rand = () => ((state = (state * 1103515245 + 12345) % 2147483648) / 2147483648);

function makeRequest(i) {
  const max_tokens = 8 + Math.floor(rand() * 25);
  const kind = i % 4; // 0, 1: streamed chat; 2: whole chat; 3: completion (streamed every other time)
  if (kind === 3) {
    return { path: "/v1/completions", stream: i % 8 === 3,
      body: { prompt: `Request ${i}: once upon a time`, max_tokens, stream: i % 8 === 3 } };
  }
  const stream = kind < 2;
  return { path: "/v1/chat/completions", stream,
    body: { messages: [{ role: "user", content: `Request ${i}: say something.` }], max_tokens, stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}) } };
}

// A streamed reply must be data events ending in [DONE], with usage when asked.
function checkStream(text, withUsage) {
  const events = text.split("\n\n");
  if (events.pop() !== "" || events.pop() !== "data: [DONE]") throw new Error("stream does not end with [DONE]");
  const chunks = events.map((e) => {
    if (!e.startsWith("data: ")) throw new Error(`bad event: ${e.slice(0, 80)}`);
    return JSON.parse(e.slice(6));
  });
  if (chunks.some((c) => c.error)) throw new Error(`error event: ${JSON.stringify(chunks.find((c) => c.error))}`);
  const last = chunks.at(withUsage ? -2 : -1);
  if (!last.choices[0].finish_reason) throw new Error("no finish_reason");
  if (withUsage && !chunks.at(-1).usage) throw new Error("no usage chunk");
  return withUsage ? chunks.at(-1).usage.completion_tokens : 0;
}

// A whole reply must be a completion with a finish_reason and usage.
function checkWhole(text) {
  const r = JSON.parse(text);
  if (!["chat.completion", "text_completion"].includes(r.object)) throw new Error(`bad object ${r.object}`);
  if (!r.choices?.[0]?.finish_reason || !r.usage) throw new Error(`incomplete reply: ${text.slice(0, 200)}`);
  return r.usage.completion_tokens;
}

async function send(i) {
  const req = makeRequest(i);
  const started = performance.now();
  const res = await fetch(base + req.path, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(req.body),
  });
  const text = await res.text();
  const ms = performance.now() - started;
  let tokens = 0;
  if (res.status === 200) {
    if (req.stream) tokens = checkStream(text, req.body.stream_options !== undefined);
    else tokens = checkWhole(text);
  }
  return { status: res.status, ms, tokens, text };
}

const results = [];
const failures = [];
let next = 0;
const t0 = performance.now();

async function clientLoop() {
  while (next < REQUESTS && performance.now() - t0 < DEADLINE_MS) {
    const i = next++;
    try {
      const r = await send(i);
      results.push(r);
      if (r.status >= 500) failures.push(`request ${i}: ${r.status} ${r.text.slice(0, 200)}`);
      else if (r.status !== 200) failures.push(`request ${i}: unexpected ${r.status} ${r.text.slice(0, 200)}`);
    } catch (e) {
      failures.push(`request ${i}: ${e.message}`);
    }
  }
}

await Promise.all(Array.from({ length: CLIENTS }, clientLoop));
const seconds = (performance.now() - t0) / 1000;

const ms = results.map((r) => r.ms).sort((a, b) => a - b);
const pct = (p) => ms[Math.min(ms.length - 1, Math.floor((p / 100) * ms.length))] ?? NaN;
const byStatus = {};
for (const r of results) byStatus[r.status] = (byStatus[r.status] ?? 0) + 1;
const tokens = results.reduce((n, r) => n + r.tokens, 0);
console.log(`load: ${results.length} requests from ${CLIENTS} clients in ${seconds.toFixed(2)} s: ` +
  `${(results.length / seconds).toFixed(1)} requests/s; statuses ${JSON.stringify(byStatus)}`);
console.log(`latency ms: p50 ${pct(50).toFixed(1)}  p90 ${pct(90).toFixed(1)}  p99 ${pct(99).toFixed(1)}  ` +
  `max ${ms.at(-1)?.toFixed(1)}`);
console.log(`completion tokens (where usage was asked for): ${tokens}, ${(tokens / seconds).toFixed(0)} tokens/s`);

for (const f of failures.slice(0, 20)) console.log(`FAIL ${f}`);
if (failures.length > 20) console.log(`... and ${failures.length - 20} more`);
if (results.length < REQUESTS) console.log(`FAIL only ${results.length} of ${REQUESTS} requests ran before the deadline`);
const ok = results.length === REQUESTS && failures.length === 0;
console.log(`${ok ? 1 : 0} passed, ${ok ? 0 : 1} failed`);
process.exit(ok ? 0 : 1);
