// End-to-end tests of POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages)
// with the official `@anthropic-ai/sdk` client against `deltaserve serve` on a random-weight
// model with the real Qwen3 tokenizer: messages.create, messages.stream (the raw events in
// Anthropic's order, and the SDK's final message equal to the non-streamed one, greedy),
// stop_sequences, countTokens, a tool round trip (tool_use and tool_result blocks sent back and
// rendered), thinking, and errors in Anthropic's shape (bad key, missing max_tokens, refused
// tool_choice, unknown field, unknown model). The tool_use output path and the thinking
// blocks of a generation are tested on canned generations in tests/test_anthropic.c (the
// random model cannot be made to call a tool).
import Anthropic from "@anthropic-ai/sdk";
import { makeModel, startServer, killAllServers, watchdog, test, assert, eq, post, failureCount } from "./lib/server_harness.mjs";

const KEY = "sk-anthropic-test";
const model = makeModel("ds-anthropic-");
const stopWatch = watchdog(300000, "anthropic.test.mjs");
let srv;
try {
  srv = await startServer(model.dir, ["--api-key", KEY, "--max-model-len", "1024"]);
} catch (e) {
  console.log(`FAIL anthropic_server_start: ${e.message}`);
  killAllServers();
  process.exit(1);
}
const client = new Anthropic({ apiKey: KEY, baseURL: srv.url, maxRetries: 0 });
const HEADERS = { "x-api-key": KEY, "anthropic-version": "2023-06-01" };
const ask = (extra = {}) => ({
  model: "tiny",
  max_tokens: 12,
  temperature: 0,
  system: "You are terse.",
  messages: [{ role: "user", content: "Name three colors." }],
  ...extra,
});

function checkMessage(m, what) {
  assert(/^msg_/.test(m.id), `${what}: id ${m.id}`);
  eq(m.type, "message", `${what}: type`);
  eq(m.role, "assistant", `${what}: role`);
  eq(m.model, "tiny", `${what}: model`);
  assert(Array.isArray(m.content), `${what}: content`);
  assert(["end_turn", "max_tokens", "stop_sequence", "tool_use"].includes(m.stop_reason), `${what}: stop_reason ${m.stop_reason}`);
  const u = m.usage;
  assert(u && Number.isInteger(u.input_tokens) && u.output_tokens > 0, `${what}: usage ${JSON.stringify(u)}`);
  assert(Number.isInteger(u.cache_read_input_tokens) && u.cache_creation_input_tokens === 0, `${what}: cache usage`);
}
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
// the fields that two runs of one greedy request share (ids and cache reads differ)
const same = (m) => ({ content: m.content, stop_reason: m.stop_reason, stop_sequence: m.stop_sequence, output_tokens: m.usage.output_tokens });

let created;
await test("anthropic_create", async () => {
  created = await client.messages.create(ask());
  checkMessage(created, "create");
  eq(created.stop_reason, "max_tokens", "12 tokens of a random model");
  eq(created.usage.output_tokens, 12, "output_tokens");
  assert(created.content.every((b) => b.type === "text"), "thinking off by default: text only");
});

await test("anthropic_stream_events_in_order", async () => {
  const r = await post(srv, "/v1/messages", ask({ stream: true }), HEADERS);
  eq(r.status, 200, "status");
  assert(/text\/event-stream/.test(r.headers.get("content-type")), "content type");
  const events = r.text
    .split("\n\n")
    .filter((e) => e.length && !e.startsWith(":"))
    .map((e) => {
      const m = /^event: (\S+)\ndata: (.*)$/s.exec(e);
      assert(m, `malformed event ${JSON.stringify(e.slice(0, 80))}`);
      const d = JSON.parse(m[2]);
      eq(d.type, m[1], "event name = data type");
      return d;
    });
  const types = events.map((e) => e.type);
  eq(types.slice(0, 2), ["message_start", "ping"], "first events");
  eq(types.slice(-2), ["message_delta", "message_stop"], "last events");
  const start = events[0].message;
  eq(start.content, [], "message_start content");
  assert(start.usage.input_tokens > 0, "message_start input tokens");
  let open = -1;
  for (const e of events.slice(2, -2)) {
    if (e.type === "content_block_start") (assert(open === -1, "nested block"), (open = e.index));
    else if (e.type === "content_block_delta") assert(e.index === open && ["text_delta", "thinking_delta", "input_json_delta"].includes(e.delta.type), "delta");
    else if (e.type === "content_block_stop") (assert(e.index === open, "stop index"), (open = -1));
    else if (e.type !== "ping") throw new Error(`unexpected ${e.type}`);
  }
  eq(open, -1, "every block stopped");
  const md = events.at(-2);
  eq(md.delta.stop_reason, "max_tokens", "stop_reason");
  eq(md.usage.output_tokens, 12, "output_tokens");
});

await test("anthropic_stream_final_equals_create", async () => {
  const stream = client.messages.stream(ask());
  const seen = [];
  stream.on("streamEvent", (e) => seen.push(e.type));
  let text = "";
  stream.on("text", (t) => (text += t));
  const final = await stream.finalMessage();
  checkMessage(final, "stream");
  eq(same(final), same(created), "streamed = non-streamed");
  eq(text, textOf(created), "text events");
  eq(seen[0], "message_start", "first event");
  eq(seen.at(-1), "message_stop", "last event");
});

await test("anthropic_stop_sequences", async () => {
  const full = textOf(created);
  const stop = full.slice(3, 5);
  assert(stop.length === 2, `a stop string from the output (${JSON.stringify(full)})`);
  const m = await client.messages.create(ask({ stop_sequences: [stop] }));
  eq(m.stop_reason, "stop_sequence", "stop_reason");
  eq(m.stop_sequence, stop, "stop_sequence");
  eq(textOf(m), full.slice(0, full.indexOf(stop)), "text cut before the stop string");
});

await test("anthropic_count_tokens", async () => {
  const a = await client.messages.countTokens({ model: "tiny", messages: [{ role: "user", content: "Name three colors." }], system: "You are terse." });
  assert(Number.isInteger(a.input_tokens) && a.input_tokens > 5, `input_tokens ${a.input_tokens}`);
  eq(a.input_tokens, created.usage.input_tokens + created.usage.cache_read_input_tokens, "the prompt /v1/messages ran");
  const tools = [{ name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
  const b = await client.messages.countTokens({ model: "tiny", messages: [{ role: "user", content: "Name three colors." }], system: "You are terse.", tools });
  assert(b.input_tokens > a.input_tokens + 10, `tools are rendered (${b.input_tokens} vs ${a.input_tokens})`);
});

await test("anthropic_tool_round_trip", async () => {
  const tools = [{ name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
  const messages = [
    { role: "user", content: "Weather in Paris?" },
    {
      role: "assistant",
      content: [
        { type: "text", text: "Let me check." },
        { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Paris" } },
      ],
    },
    {
      role: "user",
      content: [
        { type: "tool_result", tool_use_id: "toolu_01", content: [{ type: "text", text: "sunny, 24 C" }], cache_control: { type: "ephemeral" } },
        { type: "text", text: "Thanks." },
      ],
    },
  ];
  const m = await client.messages.create({ model: "tiny", max_tokens: 4, tools, tool_choice: { type: "auto" }, messages, metadata: { user_id: "u1" } });
  checkMessage(m, "round trip");
  const base = await client.messages.countTokens({ model: "tiny", tools, messages: messages.slice(0, 1) });
  const all = await client.messages.countTokens({ model: "tiny", tools, messages });
  assert(all.input_tokens > base.input_tokens + 15, `the tool call and its result are rendered (${all.input_tokens} vs ${base.input_tokens})`);
  eq(all.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens, "count = served prompt");
});

await test("anthropic_thinking_switch", async () => {
  const on = await client.messages.countTokens({ model: "tiny", thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "hi" }] });
  const off = await client.messages.countTokens({ model: "tiny", thinking: { type: "disabled" }, messages: [{ role: "user", content: "hi" }] });
  assert(on.input_tokens !== off.input_tokens, `thinking changes the rendered prompt (${on.input_tokens} / ${off.input_tokens})`);
  const m = await client.messages.create(ask({ thinking: { type: "enabled", budget_tokens: 1024 }, max_tokens: 6 }));
  checkMessage(m, "thinking");
});

await test("anthropic_claude_code_request_shape", async () => {
  // as Claude Code sends it: ?beta=true, system blocks with cache_control, a system message in
  // the conversation, adaptive thinking, context_management that clears nothing, effort high
  const body = {
    model: "tiny",
    max_tokens: 6,
    stream: true,
    system: [{ type: "text", text: "You are an agent.", cache_control: { type: "ephemeral" } }],
    messages: [
      { role: "user", content: [{ type: "text", text: "<system-reminder>ctx</system-reminder>" }, { type: "text", text: "Say hi", cache_control: { type: "ephemeral" } }] },
      { role: "system", content: "Available agents: none." },
    ],
    tools: [{ name: "Bash", description: "Run a command", input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"], additionalProperties: false, $schema: "http://json-schema.org/draft-07/schema#" } }],
    metadata: { user_id: JSON.stringify({ device_id: "d", session_id: "s" }) },
    thinking: { type: "adaptive" },
    context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
    output_config: { effort: "high" },
  };
  const r = await post(srv, "/v1/messages?beta=true", body, { ...HEADERS, "anthropic-beta": "claude-code-20250219,context-management-2025-06-27" });
  eq(r.status, 200, `status (${r.text.slice(0, 200)})`);
  assert(/event: message_stop/.test(r.text), "a whole stream");
});

await test("anthropic_output_format_json_schema", async () => {
  const schema = { type: "object", properties: { ok: { type: "boolean" } }, required: ["ok"], additionalProperties: false };
  const m = await client.messages.create(ask({ max_tokens: 40, output_config: { format: { type: "json_schema", schema } } }));
  checkMessage(m, "format");
  const v = JSON.parse(textOf(m));
  eq(Object.keys(v), ["ok"], "the object's keys");
  eq(typeof v.ok, "boolean", "ok is a boolean");
});

async function expectError(fn, status, type, what, re) {
  try {
    await fn();
  } catch (e) {
    eq(e.status, status, `${what}: status`);
    eq(e.error && e.error.type, "error", `${what}: body type`);
    eq(e.error.error && e.error.error.type, type, `${what}: error type`);
    if (re) assert(re.test(e.error.error.message), `${what}: message ${e.error.error.message}`);
    return;
  }
  throw new Error(`${what}: no error`);
}

await test("anthropic_errors", async () => {
  const bad = new Anthropic({ apiKey: "sk-wrong", baseURL: srv.url, maxRetries: 0 });
  await expectError(() => bad.messages.create(ask()), 401, "authentication_error", "bad key");
  await expectError(() => client.messages.create({ model: "tiny", messages: [{ role: "user", content: "hi" }] }), 400, "invalid_request_error", "no max_tokens", /max_tokens/);
  await expectError(
    () => client.messages.create(ask({ tools: [{ name: "f", input_schema: { type: "object" } }], tool_choice: { type: "tool" } })),
    400,
    "invalid_request_error",
    "tool_choice tool without a name",
    /tool_choice\.name/,
  );
  await expectError(() => client.messages.create(ask({ frobnicate: 1 })), 400, "invalid_request_error", "unknown field", /frobnicate: Extra inputs/);
  await expectError(() => client.messages.create(ask({ model: "other" })), 404, "not_found_error", "unknown model");
  const r = await post(srv, "/v1/messages/count_tokens", { model: "tiny", messages: [{ role: "user", content: "hi" }] }, {});
  eq(r.status, 401, "count_tokens without a key");
  eq(r.json && r.json.error && r.json.error.type, "authentication_error", "count_tokens error shape");
  const s = await post(srv, "/v1/messages", { ...ask(), stream: true, max_tokens: 5000 }, HEADERS);
  eq(s.status, 400, "a stream refused before it starts is a plain error");
  eq(s.json && s.json.type, "error", "its body");
});

stopWatch();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
