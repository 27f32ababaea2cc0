// End-to-end tests of POST /v1/responses (OpenAI Responses API, stateless) with the official
// `openai` client against `deltaserve serve` on a random-weight model with the real Qwen3
// tokenizer: create with string and item input, the streamed events in order and their final
// response equal to the non-streamed one (greedy), the function-call round-trip input items,
// text.format json_schema, the stateless refusals, cached input tokens on a repeat.
// The function_call output path (a canned generation) is tested in tests/test_responses.c.
import OpenAI from "openai";
import { makeModel, startServer, killAllServers, watchdog, test, assert, eq, failureCount } from "./lib/server_harness.mjs";

const KEY = "sk-responses-test";
const model = makeModel("ds-responses-");
const stopWatch = watchdog(300000, "responses.test.mjs");
let srv;
try {
  srv = await startServer(model.dir, ["--api-key", KEY, "--max-model-len", "1024"]);
} catch (e) {
  console.log(`FAIL responses_server_start: ${e.message}`);
  killAllServers();
  process.exit(1);
}
const oa = new OpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, maxRetries: 0 });
const raw = async (body) => {
  const r = await fetch(`${srv.url}/v1/responses`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
};

function checkResponse(r, what) {
  assert(/^resp_/.test(r.id), `${what}: id ${r.id}`);
  eq(r.object, "response", `${what}: object`);
  assert(Number.isInteger(r.created_at), `${what}: created_at`);
  assert(["completed", "incomplete"].includes(r.status), `${what}: status ${r.status}`);
  if (r.status === "incomplete") eq(r.incomplete_details, { reason: "max_output_tokens" }, `${what}: incomplete_details`);
  eq(r.model, "tiny", `${what}: model`);
  const u = r.usage;
  assert(u && u.input_tokens > 0 && u.output_tokens > 0 && u.total_tokens === u.input_tokens + u.output_tokens, `${what}: usage ${JSON.stringify(u)}`);
  assert(Number.isInteger(u.input_tokens_details.cached_tokens) && Number.isInteger(u.output_tokens_details.reasoning_tokens), `${what}: usage details`);
  const msg = r.output.find((o) => o.type === "message");
  assert(msg && msg.role === "assistant" && /^msg_/.test(msg.id) && msg.content[0].type === "output_text", `${what}: message item ${JSON.stringify(r.output).slice(0, 200)}`);
  eq(msg.content[0].annotations, [], `${what}: annotations`);
  eq(typeof r.output_text, "string", `${what}: output_text (the SDK's convenience)`);
  for (const k of ["tools", "tool_choice", "parallel_tool_calls", "text", "reasoning", "metadata", "instructions", "temperature", "top_p", "max_output_tokens"])
    assert(k in r, `${what}: echo field ${k}`);
}

await test("responses_create_string_input", async () => {
  const r = await oa.responses.create({ model: "tiny", input: "Say hello.", max_output_tokens: 8, temperature: 0 });
  checkResponse(r, "string input");
  eq(r.max_output_tokens, 8, "echo max_output_tokens");
  eq(r.text, { format: { type: "text" } }, "echo text");
  eq(r.tool_choice, "auto", "echo tool_choice");
  assert(r.usage.output_tokens <= 8, "max_output_tokens bounds the output");
});

await test("responses_create_items_instructions", async () => {
  const r = await oa.responses.create({
    model: "tiny",
    instructions: "Answer briefly.",
    input: [
      { role: "developer", content: "Be polite." },
      { type: "message", role: "user", content: [{ type: "input_text", text: "Hi" }, { type: "input_text", text: " there" }] },
      { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "They greet." }] },
      { type: "message", role: "assistant", content: [{ type: "output_text", text: "Hello!" }] },
      { role: "user", content: "How are you?" },
    ],
    max_output_tokens: 6,
    temperature: 0,
    metadata: { k: "v" },
    reasoning: { effort: "minimal" },
  });
  checkResponse(r, "items");
  eq(r.instructions, "Answer briefly.", "echo instructions");
  eq(r.metadata, { k: "v" }, "echo metadata");
  eq(r.reasoning.effort, "minimal", "echo reasoning");
});

await test("responses_function_call_round_trip_input", async () => {
  const tools = [{ type: "function", name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }, strict: true }];
  const r = await oa.responses.create({
    model: "tiny",
    tools,
    input: [
      { role: "user", content: "Weather in Paris?" },
      { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
      { type: "function_call_output", call_id: "call_1", output: '{"temp":21}' },
    ],
    max_output_tokens: 6,
    temperature: 0,
  });
  eq(r.status === "completed" || r.status === "incomplete", true, "status");
  eq(r.tools[0].name, "get_weather", "echo tools in the Responses shape");
  // the rendered prompt holds the call and its output: more input than without them
  const plain = await oa.responses.create({ model: "tiny", tools, input: [{ role: "user", content: "Weather in Paris?" }], max_output_tokens: 1 });
  assert(r.usage.input_tokens > plain.usage.input_tokens + 10, `the call items are rendered (${r.usage.input_tokens} vs ${plain.usage.input_tokens})`);
});

const strip = (r) => {
  // ids and times differ between two requests; everything else is the same answer
  const c = structuredClone(r);
  delete c.id;
  delete c.created_at;
  delete c.output_parsed; // the SDK's own, as output_text
  delete c.output_text;
  for (const o of c.output) delete o.id;
  delete c.usage.input_tokens_details; // the repeat may hit the prefix cache
  for (const o of c.output) for (const p of o.content || []) delete p.parsed; // the SDK's own
  return canon(c);
};
// JSON with sorted keys: the SDK's accumulated snapshot orders keys by the events' order
const canon = (v) =>
  Array.isArray(v) ? v.map(canon) : v && typeof v === "object" ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])])) : v;

await test("responses_stream_events_and_final", async () => {
  const body = { model: "tiny", input: "Count to five.", max_output_tokens: 24, temperature: 0 };
  const ref = await oa.responses.create(body);
  const events = [];
  const stream = oa.responses.stream(body);
  for await (const ev of stream) events.push(ev);
  const fin = await stream.finalResponse();
  const types = events.map((e) => e.type);
  eq(types.slice(0, 2), ["response.created", "response.in_progress"], "first events");
  eq(events[0].response.status, "in_progress", "created status");
  const last = types[types.length - 1];
  eq(last, ref.status === "completed" ? "response.completed" : "response.incomplete", "last event");
  events.forEach((e, i) => eq(e.sequence_number, i, "sequence_number"));
  const msgAt = types.indexOf("response.output_item.added");
  eq(types.slice(msgAt, msgAt + 2), ["response.output_item.added", "response.content_part.added"], "item opens");
  const di = types.indexOf("response.output_text.done");
  eq(types.slice(di, di + 3), ["response.output_text.done", "response.content_part.done", "response.output_item.done"], "item closes");
  const deltas = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  eq(deltas, ref.output_text, "deltas concatenate to the non-streamed text");
  eq(strip(fin), strip(ref), "the streamed final response equals the non-streamed one");
  eq(strip(events[events.length - 1].response), strip(ref), "the completed event's response");
});

await test("responses_create_stream_true", async () => {
  const s = await oa.responses.create({ model: "tiny", input: "Hi", max_output_tokens: 4, stream: true });
  const types = [];
  for await (const ev of s) types.push(ev.type);
  eq(types[0], "response.created", "first");
  assert(["response.completed", "response.incomplete"].includes(types[types.length - 1]), `last: ${types[types.length - 1]}`);
});

await test("responses_text_format_json_schema", async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 8 }, ok: { type: "boolean" } },
    required: ["name", "ok"],
    additionalProperties: false,
  };
  const r = await oa.responses.create({ model: "tiny", input: "JSON please", max_output_tokens: 300, temperature: 0, text: { format: { type: "json_schema", name: "t", schema, strict: true } } });
  eq(r.status, "completed", `status (${r.output_text})`);
  const v = JSON.parse(r.output_text);
  eq(Object.keys(v), ["name", "ok"], "keys");
  assert(typeof v.name === "string" && typeof v.ok === "boolean", `values ${r.output_text}`);
  eq(r.text.format.type, "json_schema", "echo text.format");
});

await test("responses_stateless_refusals", async () => {
  for (const [body, param, word] of [
    [{ store: true }, "store", "stateless"],
    [{ previous_response_id: "resp_123" }, "previous_response_id", "stateless"],
    [{ tool_choice: { type: "function" }, tools: [{ type: "function", name: "f", parameters: {} }] }, "tool_choice", "must be"],
    [{ input: [{ type: "item_reference", id: "msg_1" }] }, "input[0]", "stateless"],
    [{ tools: [{ type: "web_search" }] }, "tools[0]", "only function tools"],
    [{ input: 5 }, "input", "input"],
    [{ text: { format: { type: "json_schema", schema: { type: "object", properties: { a: { type: "string", unknownKeyword: 1 } } } } } }, "text.format", ""],
  ]) {
    const r = await raw({ model: "tiny", input: "x", max_output_tokens: 1, ...body });
    eq(r.status, 400, `${JSON.stringify(body)} status`);
    eq(r.json.error.type, "invalid_request_error", "error type");
    eq(r.json.error.param, param, `${JSON.stringify(body)} param`);
    assert(r.json.error.message.includes(word), `${JSON.stringify(body)} message: ${r.json.error.message}`);
  }
  // the SDK raises a BadRequestError; store: false is fine
  let threw = null;
  try {
    await oa.responses.create({ model: "tiny", input: "x", store: true });
  } catch (e) {
    threw = e;
  }
  assert(threw && threw.status === 400, "SDK error on store: true");
  const ok = await oa.responses.create({ model: "tiny", input: "x", store: false, max_output_tokens: 1 });
  eq(ok.store, false, "store false accepted");
  const nf = await raw({ model: "nope", input: "x" });
  eq(nf.status, 404, "unknown model");
});

await test("responses_cached_tokens_on_repeat", async () => {
  const input = [
    { role: "system", content: "You are a meticulous assistant. ".repeat(20) },
    { role: "user", content: "Describe the sea in two sentences." },
  ];
  await oa.responses.create({ model: "tiny", input, max_output_tokens: 2, temperature: 0 });
  const b = await oa.responses.create({ model: "tiny", input, max_output_tokens: 2, temperature: 0 });
  assert(b.usage.input_tokens_details.cached_tokens > 0, `cached_tokens ${JSON.stringify(b.usage)}`);
});

// the Qwen3.5 template's generation prompt opens a <think> block, which the random model never
// closes: its whole output is reasoning, returned as a reasoning item (and an empty message)
await test("responses_reasoning_item_qwen35", async () => {
  const fs = await import("node:fs");
  const path = await import("node:path");
  const dir35 = path.join(model.tmp, "model35");
  fs.mkdirSync(dir35);
  for (const f of fs.readdirSync(model.dir)) fs.copyFileSync(path.join(model.dir, f), path.join(dir35, f));
  const cfg = JSON.parse(fs.readFileSync(path.join(dir35, "tokenizer_config.json"), "utf8"));
  delete cfg.chat_template;
  fs.writeFileSync(path.join(dir35, "tokenizer_config.json"), JSON.stringify(cfg));
  const s35 = await startServer(dir35, []);
  try {
    const c = new OpenAI({ apiKey: "x", baseURL: `${s35.url}/v1`, maxRetries: 0 });
    const body = { model: "tiny", input: "Why?", max_output_tokens: 10, temperature: 1.0, seed: 42 };
    const r = await c.responses.create(body);
    eq(r.output.map((o) => o.type), ["reasoning", "message"], "items");
    const rs = r.output[0];
    assert(/^rs_/.test(rs.id) && rs.content[0].type === "reasoning_text" && rs.content[0].text.length > 0, `reasoning item ${JSON.stringify(rs)}`);
    eq(rs.summary, [], "summary");
    eq(r.output_text, "", "no text while the think block never closed");
    assert(r.usage.output_tokens_details.reasoning_tokens > 0, `reasoning_tokens ${JSON.stringify(r.usage)}`);
    const events = [];
    const st = c.responses.stream(body);
    for await (const ev of st) events.push(ev);
    const fin = await st.finalResponse();
    const text = events.filter((e) => e.type === "response.reasoning_text.delta").map((e) => e.delta).join("");
    eq(text, rs.content[0].text, "reasoning deltas concatenate to the reasoning text");
    eq(strip(fin), strip(r), "streamed final == non-streamed");
    // effort "none": thinking off, no reasoning item
    const off = await c.responses.create({ ...body, reasoning: { effort: "none" } });
    eq(off.output.map((o) => o.type), ["message"], "thinking off");
  } finally {
    await s35.stop();
  }
});

await test("responses_server_exit_clean", async () => {
  const ex = await srv.stop();
  assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(srv.log), `sanitizer report: ${srv.log.slice(-300)}`);
  eq(ex.code, 0, `exit status (${JSON.stringify(ex)})`);
});
stopWatch();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
