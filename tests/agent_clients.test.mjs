// Agent clients end to end, on a fixture model whose output is a fixed text (tests/lib/
// chain_model.mjs): the AI SDK's default OpenAI provider (Responses), Claude Code's print mode
// (Anthropic Messages) and Codex CLI's exec (Responses), each through a recording proxy so that
// the test sees the route and shape of what the client sent. Each client must exit cleanly and
// print exactly the text the server generated. The same fixture's tagged chain (a text, one call,
// more text) checks parallel_tool_calls false / disable_parallel_tool_use with tool_choice auto
// on the three APIs (the output ends after the call), and drives one tool round trip through
// each CLI (the call, the client's result sent back, the answer to it printed).
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { generateText, streamText, jsonSchema, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { makeChainModel } from "./lib/chain_model.mjs";
import { startServer, killAllServers, watchdog, test, assert, eq, failureCount } from "./lib/server_harness.mjs";

const KEY = "sk-agent-clients-test";
const TEXT = "Hello from deltaserve.";
const CALL = 'Let me check:<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call> Done!';
const stopWatch = watchdog(240000, "agent_clients.test.mjs");
const model = makeChainModel([{ text: TEXT }, { tag: "[call]", text: CALL }], "ds-agents-");
const home = fs.mkdtempSync(path.join(os.tmpdir(), "ds-agents-home-"));

// A pass-through proxy that records each request (method, path, parsed body, status).
function startProxy(target) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      let json = null;
      try {
        json = JSON.parse(body.toString("utf8"));
      } catch {}
      const rec = { method: req.method, url: req.url, headers: req.headers, json, status: 0 };
      seen.push(rec);
      const up = http.request(target + req.url, { method: req.method, headers: { ...req.headers, host: new URL(target).host } }, (r) => {
        rec.status = r.statusCode;
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      });
      up.on("error", (e) => {
        res.writeHead(502);
        res.end(String(e));
      });
      up.end(body);
    });
  });
  // Codex tries a websocket first and falls back to HTTP when it is refused, as our server does
  srv.on("upgrade", (req, sock) => {
    seen.push({ method: req.method, url: req.url, upgrade: true });
    sock.end("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
  });
  return new Promise((ok) => srv.listen(0, "127.0.0.1", () => ok({ url: `http://127.0.0.1:${srv.address().port}`, seen, close: () => srv.close() })));
}

// Runs a CLI to its end (no stdin); {status, signal, stdout, stderr}.
function run(cmd, args, env, cwd) {
  return new Promise((ok) => {
    const p = spawn(cmd, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "",
      stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    const t = setTimeout(() => p.kill("SIGKILL"), 60000);
    p.on("close", (status, signal) => {
      clearTimeout(t);
      ok({ status, signal, stdout, stderr });
    });
  });
}

let srv, px;
try {
  srv = await startServer(model.dir, ["--api-key", KEY, "--max-model-len", "1024"]);
  px = await startProxy(srv.url);
} catch (e) {
  console.log(`FAIL agent_clients_server_start: ${e.message}`);
  killAllServers();
  process.exit(1);
}
const since = (n) => px.seen.slice(n).filter((r) => !r.upgrade);
const oa = new OpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, maxRetries: 0 });
const an = new Anthropic({ apiKey: KEY, baseURL: srv.url, maxRetries: 0 });
const weather = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };

await test("fixture_text_is_fixed", async () => {
  for (const temperature of [0, 1]) {
    const r = await oa.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }], temperature });
    eq(r.choices[0].message.content, TEXT, `content at temperature ${temperature}`);
  }
});

await test("one_call_with_auto_chat", async () => {
  const req = { model: "tiny", messages: [{ role: "user", content: "weather [call]" }], tools: [{ type: "function", function: { name: "get_weather", parameters: weather } }] };
  const all = await oa.chat.completions.create(req);
  eq(all.choices[0].message.content, "Let me check: Done!", "parallel: the text after the call stays");
  const one = await oa.chat.completions.create({ ...req, parallel_tool_calls: false });
  const m = one.choices[0].message;
  eq(m.content, "Let me check:", "one call: the output ends after the call");
  eq(m.tool_calls?.length, 1, "one call");
  eq([m.tool_calls[0].function.name, JSON.parse(m.tool_calls[0].function.arguments)], ["get_weather", { city: "Paris" }], "the call");
  eq(one.choices[0].finish_reason, "tool_calls", "finish_reason");
  let content = "";
  let calls = 0;
  for await (const ch of await oa.chat.completions.create({ ...req, parallel_tool_calls: false, stream: true })) {
    content += ch.choices[0]?.delta?.content || "";
    calls += (ch.choices[0]?.delta?.tool_calls || []).filter((c) => c.function?.name).length;
  }
  eq([content, calls], ["Let me check:", 1], "streamed = non-streamed");
  for (const bad of [{ n: 2 }, { min_tokens: 4 }, { parallel_tool_calls: "no" }]) {
    try {
      await oa.chat.completions.create({ ...req, parallel_tool_calls: false, ...bad });
      throw new Error(`no error for ${JSON.stringify(bad)}`);
    } catch (e) {
      eq(e.status, 400, `${JSON.stringify(bad)}: ${e.message}`);
    }
  }
});

await test("one_call_with_auto_responses_and_messages", async () => {
  const rtools = [{ type: "function", name: "get_weather", parameters: weather }];
  const r = await oa.responses.create({ model: "tiny", input: "weather [call]", tools: rtools, parallel_tool_calls: false });
  eq(r.output.map((o) => o.type), ["message", "function_call"], "items");
  eq(r.output[0].content[0].text, "Let me check:", "text before the call only");
  const r2 = await oa.responses.create({ model: "tiny", input: "weather [call]", tools: rtools });
  eq(r2.output[0].content[0].text, "Let me check: Done!", "parallel: the text after the call stays");
  const atools = [{ name: "get_weather", input_schema: weather }];
  const messages = [{ role: "user", content: "weather [call]" }];
  const a = await an.messages.create({ model: "tiny", max_tokens: 100, tools: atools, tool_choice: { type: "auto", disable_parallel_tool_use: true }, messages });
  eq(a.content.map((b) => b.type), ["text", "tool_use"], "blocks");
  eq(a.content[0].text, "Let me check:", "text before the call only");
  eq(a.content[1].input, { city: "Paris" }, "tool_use input");
  eq(a.stop_reason, "tool_use", "stop_reason");
  const a2 = await an.messages.create({ model: "tiny", max_tokens: 100, tools: atools, messages });
  assert(a2.content.some((b) => b.type === "text" && /Done!/.test(b.text)), `parallel: the text after the call stays: ${JSON.stringify(a2.content)}`);
});

await test("ai_sdk_openai_provider", async () => {
  const openai = createOpenAI({ apiKey: KEY, baseURL: `${px.url}/v1` });
  const n0 = px.seen.length;
  const g = await generateText({ model: openai("tiny"), prompt: "Say hello", maxRetries: 0 });
  eq(g.text, TEXT, "generateText");
  const reqs = since(n0);
  eq(reqs.map((r) => [r.method, r.url, r.status]), [["POST", "/v1/responses", 200]], "the Responses route, by default");
  eq(reqs[0].json.model, "tiny", "model");
  const s = streamText({ model: openai("tiny"), prompt: "Say hello", maxRetries: 0 });
  let streamed = "";
  for await (const d of s.textStream) streamed += d;
  eq(streamed, TEXT, "streamText");
  const t = await generateText({
    model: openai("tiny"),
    prompt: "weather [call]",
    tools: { get_weather: tool({ description: "The weather", inputSchema: jsonSchema(weather) }) },
    maxRetries: 0,
  });
  eq(t.toolCalls.map((c) => [c.toolName, c.input]), [["get_weather", { city: "Paris" }]], "tool call");
});

const claudeEnv = () => ({
    PATH: process.env.PATH,
    HOME: home,
    ANTHROPIC_BASE_URL: px.url,
    ANTHROPIC_API_KEY: KEY,
    CLAUDE_CODE_MAX_OUTPUT_TOKENS: "256", // its default (32000) is over --max-model-len
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_TELEMETRY: "1",
    DISABLE_ERROR_REPORTING: "1",
});

await test("claude_code_print_mode", async () => {
  const n0 = px.seen.length;
  const r = await run(path.resolve("node_modules/.bin/claude"), ["-p", "Say hello", "--model", "tiny"], claudeEnv(), home);
  eq([r.status, r.signal], [0, null], `exit (stderr: ${r.stderr.slice(0, 300)}; stdout: ${r.stdout.slice(0, 300)})`);
  eq(r.stdout.trim(), TEXT, "printed text");
  const msgs = since(n0).filter((q) => q.url.startsWith("/v1/messages"));
  assert(msgs.length >= 1, `requests: ${JSON.stringify(since(n0).map((q) => q.url))}`);
  const main = msgs.find((q) => Array.isArray(q.json?.tools) && q.json.tools.length > 0);
  assert(main, "a request with Claude Code's tools");
  eq([main.json.model, main.json.stream, main.status], ["tiny", true, 200], "model, stream, status");
  assert(main.headers["x-api-key"] === KEY && main.headers["anthropic-version"], "x-api-key and anthropic-version headers");
});

const codexEnv = () => ({ PATH: process.env.PATH, HOME: home, CODEX_HOME: home, DS_KEY: KEY });
const codexArgs = (prompt) => {
  const cfg = [
    'model_provider="deltaserve"',
    `model_providers.deltaserve={name="deltaserve", base_url="${px.url}/v1", env_key="DS_KEY", wire_api="responses"}`,
    'web_search="disabled"', // a hosted tool: refused by the server (function tools only)
    "analytics.enabled=false",
    "feedback.enabled=false",
    "check_for_update_on_startup=false",
  ].flatMap((c) => ["-c", c]);
  return ["exec", "--skip-git-repo-check", ...cfg, "-m", "tiny", prompt];
};

await test("codex_exec", async () => {
  const n0 = px.seen.length;
  const r = await run(path.resolve("node_modules/.bin/codex"), codexArgs("Say hello"), codexEnv(), home);
  eq([r.status, r.signal], [0, null], `exit (stderr: ${r.stderr.slice(-400)})`);
  eq(r.stdout.trim(), TEXT, "printed text");
  const reqs = since(n0);
  eq(reqs.map((q) => [q.method, q.url, q.status]), [["POST", "/v1/responses", 200]], "one Responses request");
  const b = reqs[0].json;
  eq([b.model, b.stream, b.store, b.include], ["tiny", true, false, ["reasoning.encrypted_content"]], "model, stream, store, include");
  const types = [...new Set(b.tools.map((t) => t.type))].sort();
  eq(types, ["function", "namespace"], "function tools, and its sub-agent tools as a namespace tool");
});

// A turn with a tool call: the tagged chain calls get_weather, which neither CLI has; each sends
// the failure back as the call's result, and the server's answer to that (the default chain,
// since the last message is the result) is what it prints.
await test("claude_code_tool_round_trip", async () => {
  const n0 = px.seen.length;
  const r = await run(path.resolve("node_modules/.bin/claude"), ["-p", "Weather in Paris? [call]", "--model", "tiny"], claudeEnv(), home);
  eq([r.status, r.signal], [0, null], `exit (stderr: ${r.stderr.slice(0, 300)}; stdout: ${r.stdout.slice(0, 300)})`);
  eq(r.stdout.trim(), TEXT, "printed text: the answer after the tool result");
  const turns = since(n0).filter((q) => q.url.startsWith("/v1/messages") && Array.isArray(q.json?.tools) && q.json.tools.length > 0);
  assert(turns.length >= 2, `requests with its tools: ${turns.length}`);
  const last = turns[turns.length - 1].json.messages;
  const use = last.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).find((b) => b.type === "tool_use");
  const result = last.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).find((b) => b.type === "tool_result");
  assert(use && use.name === "get_weather" && use.input.city === "Paris", `tool_use sent back: ${JSON.stringify(use)}`);
  assert(result && result.tool_use_id === use.id, `tool_result for it: ${JSON.stringify(result)}`);
  eq(turns.every((q) => q.status === 200), true, "statuses");
});

await test("codex_tool_round_trip", async () => {
  const n0 = px.seen.length;
  const r = await run(path.resolve("node_modules/.bin/codex"), codexArgs("Weather in Paris? [call]"), codexEnv(), home);
  eq([r.status, r.signal], [0, null], `exit (stderr: ${r.stderr.slice(-400)})`);
  eq(r.stdout.trim(), TEXT, "printed text");
  const reqs = since(n0);
  eq(reqs.map((q) => [q.url, q.status]), [["/v1/responses", 200], ["/v1/responses", 200]], "two Responses requests");
  const input = reqs[1].json.input;
  const call = input.find((i) => i.type === "function_call");
  const out = input.find((i) => i.type === "function_call_output");
  assert(call && call.name === "get_weather" && JSON.parse(call.arguments).city === "Paris", `function_call sent back: ${JSON.stringify(call)}`);
  assert(out && out.call_id === call.call_id, `its output: ${JSON.stringify(out)}`);
});

px.close();
await test("agent_clients_server_exit_clean", async () => {
  const ex = await srv.stop();
  assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(srv.log), `sanitizer report: ${srv.log.slice(-300)}`);
  eq(ex.code, 0, `exit status (${JSON.stringify(ex)})`);
});
stopWatch();
model.cleanup();
fs.rmSync(home, { recursive: true, force: true });
process.exit(failureCount() ? 1 : 0);
