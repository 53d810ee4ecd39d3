// The official `openai` SDK against a running clocherd (tests/http/openai_sdk.py starts it and
// sets CLOCHER_HTTP, CLOCHER_MODEL, CLOCHER_KEY, CLOCHER_KEY_BOB, CLOCHER_METRICS).
// CLOCHER_ONLY=toolCalls runs only the tool-calling round trip, against a model forced to call
// get_weather({"city":"Oslo"}) (tests/http/test_tools.py starts that daemon).
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.env.CLOCHER_HTTP;
const model = process.env.CLOCHER_MODEL;
const client = new OpenAI({ baseURL, apiKey: process.env.CLOCHER_KEY, maxRetries: 0 });
const bob = new OpenAI({ baseURL, apiKey: process.env.CLOCHER_KEY_BOB, maxRetries: 0 });
const messages = [{ role: "user", content: "Tell me a story" }];

async function metric(name, label) {
  const text = await (await fetch(process.env.CLOCHER_METRICS)).text();
  let sum = 0;
  for (const line of text.split("\n"))
    if (line.startsWith(name) && (!label || line.includes(label)))
      sum += Number(line.split(" ").pop());
  return sum;
}

async function rejects(p, cls, status, param) {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof cls, `${e} is not a ${cls.name}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param);
    return e;
  }
  assert.fail(`expected a ${status}`);
}

const tests = {
  async models() {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids.sort(), [model, "ad1"].sort());
  },
  async chat() {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 8, seed: 7 });
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices[0].message.role, "assistant");
    assert.ok(r.usage.completion_tokens <= 8 && r.usage.prompt_tokens > 0);
  },
  async chatStream() {
    const s = await client.chat.completions.create({
      model, messages, max_tokens: 6, stream: true, stream_options: { include_usage: true },
    });
    let text = "", usage = null, finish = null;
    for await (const ch of s) {
      if (ch.usage) usage = ch.usage;
      if (ch.choices.length) {
        text += ch.choices[0].delta.content ?? "";
        finish = ch.choices[0].finish_reason ?? finish;
      }
    }
    assert.ok(usage && usage.completion_tokens <= 6);
    assert.ok(finish === "length" || finish === "stop");
    assert.equal(typeof text, "string");
  },
  async completion() {
    const r = await client.completions.create({ model, prompt: "Once upon", max_tokens: 5,
                                                temperature: 0 });
    const s = await client.completions.create({ model, prompt: "Once upon", max_tokens: 5,
                                                temperature: 0, stream: true });
    let text = "";
    for await (const ch of s) text += ch.choices[0].text;
    assert.equal(text, r.choices[0].text);
  },
  async logprobs() {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 4,
                                                     temperature: 0, logprobs: true,
                                                     top_logprobs: 2 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const e of content) {
      assert.ok(e.logprob <= 0 && Array.isArray(e.bytes) && e.top_logprobs.length === 2);
      assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5); // greedy
    }
    const c = await client.completions.create({ model, prompt: "Once upon", max_tokens: 3,
                                                temperature: 0, logprobs: 1, stream: true });
    let n = 0;
    for await (const ch of c) {
      const lp = ch.choices[0].logprobs;
      if (lp) n += lp.tokens.length, assert.equal(lp.token_logprobs.length, lp.tokens.length);
    }
    assert.ok(n >= 1 && n <= 3);
  },
  async adapterByName() {
    const r = await client.chat.completions.create({ model: "ad1", messages, max_tokens: 4 });
    assert.equal(r.model, "ad1");
  },
  async errors() {
    await rejects(client.chat.completions.create({ model, messages, top_p: 7 }),
                  OpenAI.BadRequestError, 400, "top_p");
    await rejects(client.chat.completions.create({ model, messages, logprobs: true,
                                                   top_logprobs: 21 }),
                  OpenAI.BadRequestError, 400, "top_logprobs");
    const nokey = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
    await rejects(nokey.chat.completions.create({ model, messages }),
                  OpenAI.AuthenticationError, 401);
    await rejects(client.chat.completions.create({ model: "nope", messages }),
                  OpenAI.NotFoundError, 404, "model");
    await rejects(bob.chat.completions.create({ model: "ad1", messages }),
                  OpenAI.NotFoundError, 404, "model");
    // vLLM's run-time adapter endpoint through the SDK's generic post: bob may not manage
    // adapters (403, OpenAI's permission_error), alice may, and a missing folder is hers to fix
    await rejects(bob.post("/load_lora_adapter",
                           { body: { lora_name: "x1", lora_path: "/nonexistent" } }),
                  OpenAI.PermissionDeniedError, 403);
    await rejects(client.post("/load_lora_adapter", { body: { lora_name: "x1" } }),
                  OpenAI.BadRequestError, 400, "lora_path");
    await rejects(client.completions.create({ model, prompt: "word ".repeat(300) }),
                  OpenAI.APIError, 413, "prompt");
    // bob may hold one stream: a second is 429 while the first runs
    const first = await bob.completions.create({ model, prompt: "Once", max_tokens: 1000,
                                                 stream: true });
    const it = first[Symbol.asyncIterator]();
    await it.next();
    await rejects(bob.completions.create({ model, prompt: "x" }), OpenAI.RateLimitError, 429);
    first.controller.abort();
  },
  async abortCancels() {
    const before = await metric("clocher_requests_total", 'status="CANCELLED"');
    const s = await client.completions.create({ model, prompt: "Once", max_tokens: 1000, n: 8,
                                                stream: true });
    const it = s[Symbol.asyncIterator]();
    await it.next();
    s.controller.abort();
    for (let i = 0; i < 100; i++) {
      if ((await metric("clocher_requests_total", 'status="CANCELLED"')) > before) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.fail("the aborted stream was not cancelled");
  },
  // last: SIGTERM makes the daemon drain; while a stream holds the drain open, a new request
  // is 503 (the SDK's InternalServerError) naming the drain
  async drain503() {
    const s = await client.completions.create({ model, prompt: "Once", max_tokens: 1000,
                                                stream: true });
    const it = s[Symbol.asyncIterator]();
    await it.next();
    process.kill(Number(process.env.CLOCHER_PID), "SIGTERM");
    let e = null;
    for (let i = 0; i < 200 && !e; i++) {
      try {
        await client.completions.create({ model, prompt: "x", max_tokens: 1 });
        await new Promise((r) => setTimeout(r, 50));
      } catch (x) {
        e = x;
      }
    }
    assert.ok(e instanceof OpenAI.InternalServerError, `${e}`);
    assert.equal(e.status, 503);
    assert.match(e.message, /draining/);
    s.controller.abort();
  },
};

// Tool calling as SDK users write it: tools in, tool_calls out (whole, and assembled from the
// stream by the SDK's own helper), the tool's answer sent back with the assistant message.
const toolTests = {
  async toolCalls() {
    const tools = [{ type: "function", function: {
      name: "get_weather", description: "Weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } },
                    required: ["city"] } } }];
    const ask = [{ role: "user", content: "Weather in Oslo?" }];
    const r = await client.chat.completions.create({ model, messages: ask, tools,
                                                     tool_choice: "auto", max_tokens: 40,
                                                     temperature: 0 });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.equal(m.role, "assistant");
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    const call = m.tool_calls[0];
    assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(call.type, "function");
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: "Oslo" });
    // streamed: the SDK's helper assembles the deltas (index, id, name, then arguments)
    const s = client.beta.chat.completions.stream({ model, messages: ask, tools, max_tokens: 40,
                                                    temperature: 0 });
    const fin = await s.finalChatCompletion();
    const sc = fin.choices[0];
    assert.equal(sc.finish_reason, "tool_calls");
    assert.equal(sc.message.tool_calls.length, 1);
    assert.equal(sc.message.tool_calls[0].function.name, "get_weather");
    assert.equal(sc.message.tool_calls[0].function.arguments, call.function.arguments);
    assert.match(sc.message.tool_calls[0].id, /^call_/);
    // the round trip: the assistant message as the SDK returned it, then the tool's answer
    const back = await client.chat.completions.create({
      model, tools, max_tokens: 40, temperature: 0,
      messages: [...ask, m, { role: "tool", tool_call_id: call.id, content: "3C, clear" }],
    });
    assert.equal(back.object, "chat.completion");
    assert.ok(back.usage.prompt_tokens > r.usage.prompt_tokens);
    // a named tool_choice: the reply is that tool's call (the server opens it)
    const named = await client.chat.completions.create({
      model, messages: ask, tools, max_tokens: 40, temperature: 0,
      tool_choice: { type: "function", function: { name: "get_weather" } } });
    assert.equal(named.choices[0].message.tool_calls.length, 1);
    assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_weather");
    // a tool_choice naming no tool of the request is a 400 naming it
    await rejects(client.chat.completions.create({
      model, messages: ask, tools,
      tool_choice: { type: "function", function: { name: "get_time" } } }),
                  OpenAI.BadRequestError, 400, "tool_choice");
  },
};

const only = process.env.CLOCHER_ONLY;
const run = only ? { [only]: (tests[only] || toolTests[only]) } : tests;
let failed = 0;
for (const [name, fn] of Object.entries(run)) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}
process.exit(failed ? 1 : 0);
