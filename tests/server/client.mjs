// `moe serve` through OpenAI's official node client (the openai package of
// tests/oracle), plus raw HTTP where a client would hide what is checked
// (the SSE framing, malformed bodies, stalled connections).
//
// Run by server_test.sh, which starts the server with a synthetic model:
//   --parallel 2 --queue 4 --ctx-size 2048 --api-key test-key --timeout 5
//   --max-body 65536 --drain-timeout 1 --alias demo (the shipped demo model)
// and passes MOE_URL, MOE_SERVER_PID, MOE_BIN and MOE_MODEL_FILE. The last
// test stops the server with SIGTERM while a stream is running.
//
// The prompt-token check renders the chat with ChatML by hand, the template
// of the synthetic model (and of Qwen's).
import test from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import net from "node:net";

const require = createRequire(new URL("../oracle/package.json", import.meta.url));
const { OpenAI, APIError, APIUserAbortError } = require("openai");

const base = process.env.MOE_URL;
const KEY = "test-key";
const MODEL = "demo";
const CTX = 2048;
const MAX_BODY = 65536;
const TIMEOUT_S = 5;
// A prompt the synthetic model continues greedily for a long time (no EOS
// within 1500 tokens): generations that must still be running when the
// test does something to them.
// A generation that runs until it is stopped: the demo model at this
// temperature does not end its text by itself within 1500 tokens.
const LONG = { prompt: "Once upon a time", temperature: 2, top_k: 0, top_p: 1, min_p: 0, seed: 2, max_tokens: 1500 };

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });

async function raw(method, path, { body, headers = {}, key = KEY } = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (key) h.authorization = `Bearer ${key}`;
  const res = await fetch(base + path, { method, headers: h, body });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON: left null */ }
  return { status: res.status, headers: res.headers, text, json };
}

function tokenCount(text) {
  const ids = execFileSync(process.env.MOE_BIN, ["tokenize", "-m", process.env.MOE_MODEL_FILE, "-p", text, "--ids"]);
  return ids.toString().trim().split(",").length;
}

const chatml = (messages) =>
  messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join("") + "<|im_start|>assistant\n";

function assertError(e, status, param) {
  assert.ok(e instanceof APIError, `expected an APIError, got ${e}`);
  assert.equal(e.status, status);
  assert.equal(e.error.type, status >= 500 ? "server_error" : "invalid_request_error");
  assert.equal(typeof e.error.message, "string");
  if (param !== undefined) assert.equal(e.error.param, param);
}

async function rejects(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assertError(e, status, param);
    return e;
  }
  assert.fail(`expected a ${status}`);
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

const hello = [{ role: "user", content: "Hello" }];

test("GET /v1/models lists the model", async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, MODEL);
  assert.equal(models.data[0].object, "model");
});

test("GET /health", async () => {
  const r = await raw("GET", "/health", { key: null });
  assert.equal(r.status, 200);
  assert.equal(r.json.status, "ok");
  assert.equal(r.json.slots, 2);
  assert.equal(r.json.n_ctx, CTX);
});

test("chat completion: shape and usage", async () => {
  const before = Math.floor(Date.now() / 1000);
  const r = await client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 16, temperature: 0 });
  assert.match(r.id, /^chatcmpl-[A-Za-z0-9]{24}$/);
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, MODEL);
  assert.ok(r.created >= before - 1 && r.created <= Date.now() / 1000 + 1);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, "assistant");
  assert.equal(typeof c.message.content, "string");
  assert.ok(["stop", "length"].includes(c.finish_reason));
  assert.equal(r.usage.prompt_tokens, tokenCount(chatml(hello)));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 16);
  if (c.finish_reason === "length") assert.equal(r.usage.completion_tokens, 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("completion: shape and usage", async () => {
  const prompt = "Once upon a time";
  const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 12, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, "text_completion");
  assert.equal(typeof r.choices[0].text, "string");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.prompt_tokens, tokenCount(prompt));
  assert.equal(r.usage.completion_tokens, 12);
});

test("streamed chat: role, then deltas, then finish_reason and usage; same text as unstreamed", async () => {
  // A seed makes the slot start afresh, so both texts are computed the same
  // way (not one of them partly from a cached prefix).
  const params = { model: MODEL, messages: hello, max_tokens: 24, temperature: 0, seed: 5 };
  const whole = await client.chat.completions.create(params);
  const chunks = await collect(
    await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } }),
  );
  assert.ok(chunks.length >= 3);
  for (const c of chunks) {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, chunks[0].id);
    assert.match(c.id, /^chatcmpl-/);
  }
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  const last = chunks.at(-2).choices[0];
  assert.equal(last.finish_reason, whole.choices[0].finish_reason);
  const deltas = chunks.slice(1, -2).map((c) => c.choices[0]);
  assert.ok(deltas.length >= 1);
  for (const d of deltas) {
    assert.equal(d.finish_reason, null);
    assert.equal(typeof d.delta.content, "string");
  }
  assert.equal(deltas.map((d) => d.delta.content).join(""), whole.choices[0].message.content);
  assert.equal(usage.usage.prompt_tokens, tokenCount(chatml(hello)));
  assert.equal(usage.usage.completion_tokens, whole.usage.completion_tokens);
  // Text is sent as it becomes final, one event per generated token, except
  // where the detokenizer holds back an incomplete UTF-8 sequence or a
  // possible stop string: never more events than tokens.
  assert.ok(deltas.length <= usage.usage.completion_tokens);
});

test("streamed completion: same text as unstreamed", async () => {
  const params = { model: MODEL, prompt: "Once upon a time", max_tokens: 20, temperature: 0, seed: 5 };
  const whole = await client.completions.create(params);
  const chunks = await collect(await client.completions.create({ ...params, stream: true }));
  assert.equal(chunks.map((c) => c.choices[0].text).join(""), whole.choices[0].text);
  assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
  for (const c of chunks) assert.equal(c.object, "text_completion");
});

test("SSE framing: data lines, then data: [DONE]", async () => {
  const r = await raw("POST", "/v1/chat/completions", {
    body: JSON.stringify({ messages: hello, max_tokens: 8, stream: true }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get("content-type"), /^text\/event-stream/);
  const events = r.text.split("\n\n");
  assert.equal(events.pop(), "");
  assert.equal(events.pop(), "data: [DONE]");
  for (const e of events) {
    assert.ok(e.startsWith("data: {"), e);
    JSON.parse(e.slice(6));
  }
});

test("same seed and temperature give the same text; other seeds differ", async () => {
  const ask = (seed) =>
    client.chat.completions
      .create({ model: MODEL, messages: hello, max_tokens: 32, temperature: 0.9, seed })
      .then((r) => r.choices[0].message.content);
  const [a, b] = await Promise.all([ask(1234), ask(1234)]); // on both slots at once
  assert.equal(a, b);
  assert.equal(await ask(1234), a);
  const others = await Promise.all([ask(1), ask(2), ask(3)]);
  assert.ok(others.some((t) => t !== a));
});

test("stop sequences cut the text before the first match", async () => {
  const params = { model: MODEL, prompt: "Once upon a time", temperature: 0.9, max_tokens: 40 };
  let text = "", seed = 0;
  while (text.length < 8 && seed < 20) {
    seed++;
    text = (await client.completions.create({ ...params, seed })).choices[0].text;
  }
  assert.ok(text.length >= 8, "no seed gave a long enough text");
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 2);
  const want = text.slice(0, text.indexOf(stop));
  const cut = await client.completions.create({ ...params, seed, stop: [stop, "never-seen-stop"] });
  assert.equal(cut.choices[0].text, want);
  assert.equal(cut.choices[0].finish_reason, "stop");
  const streamed = await collect(await client.completions.create({ ...params, seed, stop, stream: true }));
  assert.equal(streamed.map((c) => c.choices[0].text).join(""), want);
});

test("a conversation's next turn reuses the cached prefix", async () => {
  const first = [{ role: "user", content: "Tell me a story about a cached prefix." }];
  const r1 = await client.chat.completions.create({ model: MODEL, messages: first, max_tokens: 8, temperature: 0 });
  const next = [...first, { role: "assistant", content: r1.choices[0].message.content },
    { role: "user", content: "And then?" }];
  const r2 = await client.chat.completions.create({ model: MODEL, messages: next, max_tokens: 8, temperature: 0 });
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= tokenCount(chatml(first)),
    `cached ${r2.usage.prompt_tokens_details.cached_tokens}`);
});

test("errors: malformed JSON, wrong types, n=2, empty messages, roles", async () => {
  let r = await raw("POST", "/v1/chat/completions", { body: '{"messages": [' });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, "invalid_request_error");
  assert.equal(r.json.error.code, "invalid_json");
  r = await raw("POST", "/v1/chat/completions", { body: "[1, 2]" });
  assert.equal(r.status, 400);
  r = await raw("POST", "/v1/completions", { body: "" });
  assert.equal(r.status, 400);
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, n: 2 }), 400, "n");
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, temperature: "hot" }), 400,
    "temperature");
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, temperature: 3 }), 400, "temperature");
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 1.5 }), 400, "max_tokens");
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, stop: [1] }), 400, "stop[0]");
  await rejects(client.chat.completions.create({ model: MODEL, messages: [] }), 400, "messages");
  await rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: "tool", content: "x" }] }), 400,
    "messages[0].role");
  await rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: 5 }] }), 400,
    "messages[0].content");
  await rejects(client.chat.completions.create({ model: MODEL, messages: hello, stream_options: { include_usage: true } }),
    400, "stream_options");
  await rejects(client.completions.create({ model: MODEL, prompt: ["a", "b"] }), 400, "prompt");
});

test("unknown fields are ignored; null means not given", async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: hello, max_tokens: 4, frobnicate: { x: 1 }, temperature: null, stop: null, user: "me",
  });
  assert.equal(r.object, "chat.completion");
});

test("a prompt longer than the context is a 400 naming the limit", async () => {
  const prompt = "x ".repeat(CTX + 10);
  const e = await rejects(client.completions.create({ model: MODEL, prompt, max_tokens: 4 }), 400, "prompt");
  assert.equal(e.error.code, "context_length_exceeded");
  assert.match(e.error.message, new RegExp(`context holds ${CTX}`));
});

test("API key: wrong or missing is a 401; /health needs none", async () => {
  const wrong = new OpenAI({ baseURL: `${base}/v1`, apiKey: "wrong-key", maxRetries: 0 });
  const e = await rejects(wrong.models.list(), 401);
  assert.equal(e.error.code, "invalid_api_key");
  const r = await raw("POST", "/v1/completions", { key: null, body: JSON.stringify({ prompt: "a" }) });
  assert.equal(r.status, 401);
  assert.equal(r.headers.get("www-authenticate"), "Bearer");
});

test("unknown path 404, wrong method 405, oversized body 413", async () => {
  let r = await raw("GET", "/v1/nope");
  assert.equal(r.status, 404);
  assert.equal(r.json.error.type, "invalid_request_error");
  r = await raw("POST", "/v1/embeddings", { body: "{}" });
  assert.equal(r.status, 404);
  r = await raw("GET", "/v1/chat/completions");
  assert.equal(r.status, 405);
  assert.equal(r.headers.get("allow"), "POST");
  r = await raw("POST", "/v1/completions", { body: JSON.stringify({ prompt: "y".repeat(MAX_BODY) }) });
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, new RegExp(`${MAX_BODY}`));
});

test("chunked request bodies: taken whole, and a 413 past the limit", async () => {
  const send = (text) => {
    const bytes = new TextEncoder().encode(text);
    const body = new ReadableStream({
      start(c) {
        for (let at = 0; at < bytes.length; at += 1000) c.enqueue(bytes.slice(at, at + 1000));
        c.close();
      },
    });
    return fetch(`${base}/v1/completions`, {
      method: "POST", duplex: "half", body,
      headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    });
  };
  let res = await send(JSON.stringify({ prompt: "chunked", max_tokens: 2, filler: "z".repeat(5000) }));
  assert.equal(res.status, 200);
  assert.equal((await res.json()).object, "text_completion");
  res = await send(JSON.stringify({ prompt: "z".repeat(MAX_BODY * 2) }));
  assert.equal(res.status, 413);
  await res.text();
});

test("a full queue answers 503; the accepted requests complete", async () => {
  // 2 slots and a queue of 4: of 12 long requests sent at once, 6 wait or run.
  const results = await Promise.all(
    Array.from({ length: 12 }, () =>
      raw("POST", "/v1/completions", { body: JSON.stringify({ ...LONG, max_tokens: 1000 }) })),
  );
  const ok = results.filter((r) => r.status === 200).length;
  const busy = results.filter((r) => r.status === 503);
  assert.equal(ok, 6);
  assert.equal(busy.length, 6);
  assert.match(busy[0].json.error.message, /busy/);
});

test("a client that aborts mid-stream frees its slot", async () => {
  const ctl = new AbortController();
  const stream = await client.completions.create({ model: MODEL, ...LONG, stream: true }, { signal: ctl.signal });
  let n = 0;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.text && ++n === 3) {
        ctl.abort();
        break;
      }
    }
  } catch (e) {
    assert.ok(e instanceof APIUserAbortError, String(e));
  }
  assert.equal(n, 3);
  // The generation stops at its next token (a full one takes a second or more).
  let busy = -1;
  for (let i = 0; i < 50 && busy !== 0; i++) {
    await new Promise((ok) => setTimeout(ok, 20));
    busy = (await raw("GET", "/health")).json.busy;
  }
  assert.equal(busy, 0);
  const r = await client.completions.create({ model: MODEL, prompt: "after", max_tokens: 4 });
  assert.equal(r.object, "text_completion");
});

test("a client that gives up on a whole (unstreamed) reply frees its slot", async () => {
  const ctl = new AbortController();
  const pending = client.completions.create({ model: MODEL, ...LONG }, { signal: ctl.signal });
  await new Promise((ok) => setTimeout(ok, 50));
  ctl.abort();
  await assert.rejects(pending, APIUserAbortError);
  let busy = -1;
  for (let i = 0; i < 50 && busy !== 0; i++) {
    await new Promise((ok) => setTimeout(ok, 20));
    busy = (await raw("GET", "/health")).json.busy;
  }
  assert.equal(busy, 0);
});

test("stalled connections time out and do not block others", async () => {
  const stall = (bytes) =>
    new Promise((resolve) => {
      const started = Date.now();
      const s = net.connect(Number(new URL(base).port), "127.0.0.1", () => s.write(bytes));
      s.on("error", () => {});
      s.on("close", () => resolve((Date.now() - started) / 1000));
    });
  const halfHeaders = stall("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  const halfBody = stall(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
    "Content-Length: 100\r\n\r\n{\"prompt\":");
  const r = await client.completions.create({ model: MODEL, prompt: "meanwhile", max_tokens: 4 });
  assert.equal(r.object, "text_completion");
  for (const seconds of await Promise.all([halfHeaders, halfBody]))
    assert.ok(seconds >= TIMEOUT_S - 1 && seconds < TIMEOUT_S + 5, `closed after ${seconds} s`);
});

test("SIGTERM drains: the running stream ends with [DONE], new connections are refused", async () => {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ ...LONG, stream: true }),
  });
  const reader = res.body.getReader();
  let text = new TextDecoder().decode((await reader.read()).value);
  process.kill(Number(process.env.MOE_SERVER_PID), "SIGTERM");
  for (let part; !(part = await reader.read()).done;) text += new TextDecoder().decode(part.value);
  assert.ok(text.endsWith("data: [DONE]\n\n"));
  assert.match(text, /"finish_reason":"(length|stop)"/);
  // A new connection is refused; one the client kept alive gets a 503.
  const after = await fetch(`${base}/health`).then((r) => r.status, () => "refused");
  assert.ok(after === "refused" || after === 503, `after SIGTERM: ${after}`);
});
