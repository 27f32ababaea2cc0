// tool_choice enforced by constrained decoding, through the openai and Anthropic SDKs and the
// Responses API, with the random demo model and Qwen3's template (JSON tool calls): the
// model's output is forced by the mask, so "required" / a named tool must come back as tool calls
// of the allowed tools whose arguments are valid JSON matching the schema; parallel_tool_calls
// false / disable_parallel_tool_use give exactly one call. Qwen3.5's template (XML calls) is
// forced the same way; a template asking for neither format gets a 400 that says so.
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { makeModel, startServer, killAllServers, watchdog, test, assert, eq, failureCount } from "./lib/server_harness.mjs";

const KEY = "sk-tool-choice-test";
const model = makeModel("ds-toolchoice-");
fs.copyFileSync("tests/fixtures/jinja/templates/Qwen3.jinja", path.join(model.dir, "chat_template.jinja"));
const xmlModel = makeModel("ds-toolchoice-xml-");
fs.copyFileSync("tests/fixtures/chat/qwen35_chat_template.jinja", path.join(xmlModel.dir, "chat_template.jinja"));
const stopWatch = watchdog(300000, "tool_choice.test.mjs");
let srv, xml;
try {
  srv = await startServer(model.dir, ["--api-key", KEY, "--max-model-len", "2048"]);
  xml = await startServer(xmlModel.dir, ["--api-key", KEY, "--max-model-len", "1024"]);
} catch (e) {
  console.log(`FAIL tool_choice_server_start: ${e.message}`);
  killAllServers();
  process.exit(1);
}
const oa = new OpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, maxRetries: 0 });
const an = new Anthropic({ apiKey: KEY, baseURL: srv.url, maxRetries: 0 });

const params = {
  get_weather: { type: "object", properties: { city: { type: "string", maxLength: 5 }, days: { type: "integer", minimum: 1, maximum: 3 } }, required: ["city", "days"], additionalProperties: false },
  lookup: { type: "object", properties: { id: { type: "integer", minimum: 0, maximum: 9 } }, required: ["id"], additionalProperties: false },
};
const tools = Object.entries(params).map(([name, parameters]) => ({ type: "function", function: { name, parameters } }));
const user = [{ role: "user", content: "Weather?" }];

function checkArgs(name, args) {
  const a = typeof args === "string" ? JSON.parse(args) : args;
  if (name === "get_weather") {
    assert(typeof a.city === "string" && [...a.city].length <= 5 && Number.isInteger(a.days) && a.days >= 1 && a.days <= 3, `get_weather args ${JSON.stringify(a)}`);
    eq(Object.keys(a).length, 2, "get_weather keys");
  } else {
    eq(name, "lookup", "tool name");
    assert(Number.isInteger(a.id) && a.id >= 0 && a.id <= 9 && Object.keys(a).length === 1, `lookup args ${JSON.stringify(a)}`);
  }
}

await test("chat_required", async () => {
  for (let seed = 1; seed <= 3; seed++) {
    const r = await oa.chat.completions.create({ model: "tiny", messages: user, tools, tool_choice: "required", max_tokens: 400, seed, temperature: 1 });
    const m = r.choices[0].message;
    assert(m.tool_calls && m.tool_calls.length >= 1, `tool calls: ${JSON.stringify(m)}`);
    eq(r.choices[0].finish_reason, "tool_calls", "finish_reason");
    for (const c of m.tool_calls) checkArgs(c.function.name, c.function.arguments);
  }
});

await test("chat_named_and_single", async () => {
  const r = await oa.chat.completions.create({ model: "tiny", messages: user, tools, tool_choice: { type: "function", function: { name: "lookup" } }, parallel_tool_calls: false, max_tokens: 400 });
  const m = r.choices[0].message;
  eq(m.tool_calls?.length, 1, `one call: ${JSON.stringify(m)}`);
  eq(m.tool_calls[0].function.name, "lookup", "named tool");
  checkArgs("lookup", m.tool_calls[0].function.arguments);
});

await test("chat_required_stream", async () => {
  const s = await oa.chat.completions.create({ model: "tiny", messages: user, tools, tool_choice: "required", max_tokens: 400, stream: true });
  const calls = {};
  for await (const ch of s) for (const tc of ch.choices[0]?.delta?.tool_calls || []) {
    const c = (calls[tc.index] ||= { name: "", args: "" });
    if (tc.function?.name) c.name += tc.function.name;
    if (tc.function?.arguments) c.args += tc.function.arguments;
  }
  const list = Object.values(calls);
  assert(list.length >= 1, "streamed calls");
  for (const c of list) checkArgs(c.name, c.args);
});

await test("chat_none_is_content", async () => {
  const r = await oa.chat.completions.create({ model: "tiny", messages: user, tools, tool_choice: "none", max_tokens: 8 });
  assert(!r.choices[0].message.tool_calls, "no tool calls with none");
});

await test("anthropic_any_and_tool", async () => {
  const atools = Object.entries(params).map(([name, input_schema]) => ({ name, input_schema }));
  const r = await an.messages.create({ model: "tiny", max_tokens: 400, tools: atools, tool_choice: { type: "any" }, messages: user });
  const uses = r.content.filter((b) => b.type === "tool_use");
  assert(uses.length >= 1, `tool_use blocks: ${JSON.stringify(r.content)}`);
  eq(r.stop_reason, "tool_use", "stop_reason");
  for (const u of uses) checkArgs(u.name, u.input);
  const one = await an.messages.create({ model: "tiny", max_tokens: 400, tools: atools, tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true }, messages: user });
  const u1 = one.content.filter((b) => b.type === "tool_use");
  eq(u1.length, 1, "one tool_use");
  eq(u1[0].name, "get_weather", "named tool");
  checkArgs("get_weather", u1[0].input);
});

await test("responses_required_and_named", async () => {
  const rtools = Object.entries(params).map(([name, parameters]) => ({ type: "function", name, parameters }));
  const r = await oa.responses.create({ model: "tiny", input: "Weather?", tools: rtools, tool_choice: "required", max_output_tokens: 400 });
  const calls = r.output.filter((o) => o.type === "function_call");
  assert(calls.length >= 1, `function calls: ${JSON.stringify(r.output)}`);
  for (const c of calls) checkArgs(c.name, c.arguments);
  const one = await oa.responses.create({ model: "tiny", input: "Weather?", tools: rtools, tool_choice: { type: "function", name: "lookup" }, parallel_tool_calls: false, max_output_tokens: 400 });
  const c1 = one.output.filter((o) => o.type === "function_call");
  eq(c1.length, 1, "one function call");
  eq(c1[0].name, "lookup", "named");
  checkArgs("lookup", c1[0].arguments);
});

// Qwen3.5's template: the calls are XML blocks (<function=NAME> <parameter=P>), forced the same way
// (Qwen3.5's template opens a think block, which the random model never closes: thinking off)
const noThink = { chat_template_kwargs: { enable_thinking: false } };
await test("xml_chat_required_named_stream", async () => {
  const x = new OpenAI({ apiKey: KEY, baseURL: `${xml.url}/v1`, maxRetries: 0 });
  for (let seed = 1; seed <= 2; seed++) {
    const r = await x.chat.completions.create({ model: "tiny", messages: user, ...noThink, tools, tool_choice: "required", max_tokens: 400, seed, temperature: 1 });
    const m = r.choices[0].message;
    assert(m.tool_calls && m.tool_calls.length >= 1, `tool calls: ${JSON.stringify(m)}`);
    eq(r.choices[0].finish_reason, "tool_calls", "finish_reason");
    for (const c of m.tool_calls) checkArgs(c.function.name, c.function.arguments);
  }
  const one = await x.chat.completions.create({ model: "tiny", messages: user, ...noThink, tools, tool_choice: { type: "function", function: { name: "get_weather" } }, parallel_tool_calls: false, max_tokens: 400 });
  eq(one.choices[0].message.tool_calls?.length, 1, `one call: ${JSON.stringify(one.choices[0].message)}`);
  eq(one.choices[0].message.tool_calls[0].function.name, "get_weather", "named tool");
  checkArgs("get_weather", one.choices[0].message.tool_calls[0].function.arguments);
  // streamed = non-streamed (greedy, the same request)
  const req = { model: "tiny", messages: user, ...noThink, tools, tool_choice: "required", max_tokens: 400, temperature: 0 };
  const full = await x.chat.completions.create(req);
  const s = await x.chat.completions.create({ ...req, stream: true });
  const calls = {};
  for await (const ch of s) for (const tc of ch.choices[0]?.delta?.tool_calls || []) {
    const c = (calls[tc.index] ||= { name: "", args: "" });
    if (tc.function?.name) c.name += tc.function.name;
    if (tc.function?.arguments) c.args += tc.function.arguments;
  }
  const list = Object.values(calls);
  eq(JSON.stringify(list.map((c) => [c.name, JSON.parse(c.args)])), JSON.stringify(full.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)])), "streamed calls = non-streamed");
});

await test("xml_anthropic_and_responses", async () => {
  const ax = new Anthropic({ apiKey: KEY, baseURL: xml.url, maxRetries: 0 });
  const atools = Object.entries(params).map(([name, input_schema]) => ({ name, input_schema }));
  const r = await ax.messages.create({ model: "tiny", max_tokens: 400, tools: atools, tool_choice: { type: "tool", name: "lookup", disable_parallel_tool_use: true }, messages: user });
  const uses = r.content.filter((b) => b.type === "tool_use");
  eq(uses.length, 1, `one tool_use: ${JSON.stringify(r.content)}`);
  eq(uses[0].name, "lookup", "named tool");
  checkArgs("lookup", uses[0].input);
  const x = new OpenAI({ apiKey: KEY, baseURL: `${xml.url}/v1`, maxRetries: 0 });
  const rtools = Object.entries(params).map(([name, parameters]) => ({ type: "function", name, parameters }));
  const rr = await x.responses.create({ model: "tiny", input: "Weather?", reasoning: { effort: "none" }, tools: rtools, tool_choice: "required", max_output_tokens: 400 });
  const calls = rr.output.filter((o) => o.type === "function_call");
  assert(calls.length >= 1, `function calls: ${JSON.stringify(rr.output)}`);
  for (const c of calls) checkArgs(c.name, c.arguments);
});

await test("xml_unrepresentable_and_other_formats_refused", async () => {
  const x = new OpenAI({ apiKey: KEY, baseURL: `${xml.url}/v1`, maxRetries: 0 });
  const bad = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { "a>b": { type: "string" } } } } }];
  try {
    await x.chat.completions.create({ model: "tiny", messages: user, tools: bad, tool_choice: "required", max_tokens: 4 });
    throw new Error("no error");
  } catch (e) {
    eq(e.status, 400, `status (${e.message})`);
    assert(/a>b/.test(e.message) && /XML/.test(e.message), `message names the parameter: ${e.message}`);
  }
  // a template whose tools section asks for neither format
  const plain = "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}{%- if tools %}tools: {{ tools | tojson }}{%- endif %}{%- if add_generation_prompt %}assistant: {%- endif %}";
  try {
    await oa.chat.completions.create({ model: "tiny", messages: user, tools, tool_choice: "required", max_tokens: 4, chat_template: plain });
    throw new Error("no error");
  } catch (e) {
    eq(e.status, 400, `status (${e.message})`);
    assert(/neither/.test(e.message), `message says the format is unknown: ${e.message}`);
  }
});

stopWatch();
killAllServers();
model.cleanup();
xmlModel.cleanup();
process.exit(failureCount() ? 1 : 0);
