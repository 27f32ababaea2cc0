// Bad-input battery against a running `deltaserve serve` (tiny random model, real tokenizer).
// Every input must get a 4xx OpenAI error JSON ({"error": {"message","type","param","code"}}),
// a 200 where the input is legitimately acceptable (unknown fields), or a closed connection;
// never a 5xx, never a crash. After every case /health answers 200 and a valid request still
// works. Raw-socket cases (half-open requests, garbage bytes, bad HTTP framing) may also get an
// HTTP-level 4xx from the HTTP library. Prints PASS/FAIL per category and "NOTE" lines with the
// count of inputs tried. No assertion on timing.
import fs from "node:fs";
import net from "node:net";
import {
  makeModel, startServer, killAllServers, watchdog, post, get, metrics, healthy, isOpenAIError,
  rawSocket, parseRawResponse, test, pass, fail, failureCount, assert, eq, sleep, poll, waitIdle, NAME,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "badinput.test.mjs");
const model = makeModel("ds-badinput-");
const SERVER_ARGS = ["--max-model-len", "256"];
let srv;
try {
  srv = await startServer(model.dir, SERVER_ARGS);
} catch (e) {
  fail("badinput_server_start", e.message);
  killAllServers();
  process.exit(1);
}
pass("badinput_server_start");

let tried = 0;
const crashes = [];
const closedConns = [];
const notes = [];

const CHAT = "/v1/chat/completions", CMPL = "/v1/completions", TOK = "/tokenize", DETOK = "/detokenize";
const M = [{ role: "user", content: "hi" }];
const chatBase = () => ({ messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
const cmplBase = () => ({ prompt: [1, 2, 3], max_tokens: 2 });

/* A 200 body of route r is well formed. */
function okShape(route, r, streamed) {
  if (r.status !== 200) return false;
  if (streamed) return /data: \[DONE\]\s*$/.test(r.text);
  const j = r.json;
  if (!j) return false;
  // one choice per requested n (an accepted n > 1 gives choices 0 .. n-1)
  const choicesOk = (each) => Array.isArray(j.choices) && j.choices.length >= 1 && j.choices.every((c, i) => c.index === i && each(c));
  if (route === CHAT) return choicesOk((c) => c.message) && j.usage;
  if (route === CMPL) return choicesOk((c) => typeof c.text === "string") && j.usage;
  if (route === TOK) return Array.isArray(j.tokens) && j.count === j.tokens.length;
  if (route === DETOK) return typeof j.prompt === "string";
  return true;
}

/* After a case: the server is up, /health 200, a valid request works. Restarts a dead server
 * (the crash is recorded) so that the battery goes on. */
async function stillServing(caseName) {
  if (srv.exited || !(await healthy(srv))) {
    await sleep(200);
    if (srv.exited || !(await healthy(srv))) {
      crashes.push(`${caseName} (exit ${JSON.stringify(srv.exited)}; log: ${srv.log.slice(-300).replace(/\n/g, " | ")})`);
      if (!srv.exited) srv.p.kill("SIGKILL");
      await poll(() => srv.exited, "the dead server to exit", 20000).catch(() => {});
      srv = await startServer(model.dir, SERVER_ARGS);
      return `server died or /health failed after ${caseName}`;
    }
  }
  const v = await post(srv, CMPL, { prompt: [1, 2, 3], max_tokens: 1 });
  if (v.status !== 200 || !okShape(CMPL, v)) return `a valid request failed after ${caseName}: ${v.status} ${v.text.slice(0, 120)}`;
  return null;
}

/* Runs cases [{name, route, body, expect: "reject"|"accept"|"either", headers, method}]
 * as one PASS/FAIL test; every failing case is listed. */
async function battery(testName, cases) {
  const bad = [];
  for (const c of cases) {
    tried++;
    const r = await post(srv, c.route, c.body, c.headers || {}, { method: c.method });
    const streamed = typeof c.body === "object" && c.body && !Buffer.isBuffer(c.body) && c.body.stream === true;
    let why = null;
    if (r.status === 0) closedConns.push(`${testName}/${c.name}: ${r.err}`);
    else if (r.status >= 500) why = `5xx ${r.status}: ${r.text.slice(0, 160)}`;
    else if (c.expect === "reject" && !(r.status >= 400 && r.status < 500 && isOpenAIError(r)))
      why = `expected a 4xx OpenAI error, got ${r.status} ${r.text.slice(0, 160)}`;
    else if (c.expect === "accept" && !okShape(c.route, r, streamed)) why = `expected 200, got ${r.status} ${r.text.slice(0, 160)}`;
    else if (c.expect === "either" && !okShape(c.route, r, streamed) && !(r.status >= 400 && r.status < 500 && isOpenAIError(r)))
      why = `expected 200 or a 4xx OpenAI error, got ${r.status} ${r.text.slice(0, 160)}`;
    const after = await stillServing(`${testName}/${c.name}`);
    if (why) bad.push(`${c.name}: ${why}`);
    if (after) bad.push(after);
  }
  if (bad.length) {
    for (const b of bad) console.log(`  ${testName}: ${b}`);
    fail(testName, `${bad.length} of ${cases.length} inputs misbehaved; first: ${bad[0]}`);
  } else {
    pass(`${testName} (${cases.length} inputs)`);
  }
}

// =============================== 1. malformed and deeply nested JSON ===============================
{
  const deep = (n, o, c) => o.repeat(n) + c.repeat(n);
  const malformed = [
    "", " ", "{", "}", "[", "]", "{\"messages\":", "nul", "nulll", "{'messages':[]}", "{\"a\":1,}", "{\"a\" 1}", "{}x", "{} {}",
    "1", "\"str\"", "null", "true", "[]", "[{}]", "{\"a\":\"unterminated}", "{\"a\":\"\\x41\"}", "{\"a\":\"\\u12\"}",
    "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":+1}", "{\"a\":--1}", "{\"a\":1e}", "/* c */{}", "{\"a\":1}//",
    "{\"a\":\"line\nbreak\"}", "{\"a\":\"tab\there\"}", "{\"a\":tru}", "\u0000", "{\u0000}", "\ufeff" + JSON.stringify(chatBase()),
    JSON.stringify(chatBase()).slice(0, -1), JSON.stringify(chatBase()) + ",", '{"messages":[{"role":"user","content":"a"},]}',
    '{"messages":[{"role":"user","content":"a"}],"messages":[]}', // duplicate key
    deep(100000, "[", "]"), deep(100000, "[", ""), deep(100000, "{\"a\":", "}"), "{\"a\":" + deep(100000, "[", "]") + "}",
    deep(2000, "[", "]"), deep(5000, "[", "]"),
  ];
  const cases = [];
  for (const route of [CHAT, CMPL, TOK, DETOK])
    for (const [i, b] of malformed.entries()) cases.push({ name: `${route} malformed#${i}`, route, body: b, expect: "reject" });
  // the BOM case (#36) may be accepted
  for (const c of cases) if (/#36$/.test(c.name)) c.expect = "either";
  // nesting inside fields that are otherwise valid
  const nest = (n) => JSON.parse(deep(n, "[", "]"));
  const nestObj = (n) => { let o = {}; for (let i = 0; i < n; i++) o = { a: o }; return o; };
  cases.push({ name: "unknown field nested 1000", route: CHAT, body: { ...chatBase(), x_nested: nest(1000) }, expect: "accept" });
  cases.push({ name: "unknown field nested 100k (raw)", route: CHAT, body: JSON.stringify(chatBase()).slice(0, -1) + ',"x":' + deep(100000, "[", "]") + "}", expect: "either" });
  cases.push({ name: "chat_template_kwargs nested 1000", route: CHAT, body: { ...chatBase(), chat_template_kwargs: { x: nestObj(1000) } }, expect: "either" });
  cases.push({ name: "tool parameters nested 1000", route: CHAT, body: { ...chatBase(), tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { p: nestObj(1000) } } } }] }, expect: "either" });
  cases.push({ name: "tool parameters nested 2000 (tokenize)", route: TOK, body: { messages: M, tools: [{ type: "function", function: { name: "f", parameters: nestObj(2000) } }] }, expect: "either" });
  cases.push({ name: "content parts nested", route: CHAT, body: { messages: [{ role: "user", content: nest(1000) }] }, expect: "reject" });
  cases.push({ name: "100k keys in an unknown object", route: CHAT, body: { ...chatBase(), x: Object.fromEntries(Array.from({ length: 100000 }, (_, i) => [`k${i}`, i])) }, expect: "accept" });
  cases.push({ name: "100 KB key", route: CHAT, body: { ...chatBase(), ["k".repeat(100000)]: 1 }, expect: "accept" });
  await battery("badinput_malformed_json", cases);
}

// =============================== 2. invalid UTF-8 and odd Unicode ===============================
{
  const badSeqs = [[0xff], [0xfe], [0xc0, 0xaf], [0x80], [0xbf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80],
    [0xe2, 0x82], [0xf0, 0x9f, 0x98], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc3], [0xe0, 0x80, 0x80]];
  const cases = [];
  const inject = (prefix, seq, suffix) => Buffer.concat([Buffer.from(prefix), Buffer.from(seq), Buffer.from(suffix)]);
  for (const [i, seq] of badSeqs.entries()) {
    cases.push({ name: `chat content bad utf8 #${i}`, route: CHAT, body: inject('{"messages":[{"role":"user","content":"a', seq, '"}],"max_tokens":2}'), expect: "reject" });
    cases.push({ name: `chat content bad utf8 at end #${i}`, route: CHAT, body: inject('{"messages":[{"role":"user","content":"', seq, '"}],"max_tokens":2}'), expect: "reject" });
    cases.push({ name: `completion prompt bad utf8 #${i}`, route: CMPL, body: inject('{"prompt":"x', seq, 'y","max_tokens":2}'), expect: "reject" });
    cases.push({ name: `stop bad utf8 #${i}`, route: CMPL, body: inject('{"prompt":[1],"max_tokens":2,"stop":["', seq, '"]}'), expect: "reject" });
    cases.push({ name: `key bad utf8 #${i}`, route: CHAT, body: inject('{"messages":[{"role":"user","content":"a"}],"', seq, '":1}'), expect: "reject" });
    cases.push({ name: `tokenize bad utf8 #${i}`, route: TOK, body: inject('{"prompt":"', seq, '"}'), expect: "reject" });
    cases.push({ name: `outside strings #${i}`, route: CHAT, body: inject("", seq, JSON.stringify(chatBase())), expect: "reject" });
  }
  for (const esc of ["\\ud800", "\\udc00", "\\ud800\\u0041", "\\udbff\\udbff", "\\u0000", "a\\u0000b"]) {
    cases.push({ name: `chat escape ${esc}`, route: CHAT, body: `{"messages":[{"role":"user","content":"${esc}"}],"max_tokens":2}`, expect: "either" });
    cases.push({ name: `prompt escape ${esc}`, route: CMPL, body: `{"prompt":"${esc}","max_tokens":2}`, expect: "either" });
    cases.push({ name: `model escape ${esc}`, route: CMPL, body: `{"model":"${esc}","prompt":[1],"max_tokens":2}`, expect: "reject" });
    cases.push({ name: `salt escape ${esc}`, route: CMPL, body: `{"cache_salt":"${esc}","prompt":[1],"max_tokens":2}`, expect: "either" });
    cases.push({ name: `tool name escape ${esc}`, route: CHAT, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"tools":[{"type":"function","function":{"name":"${esc}"}}]}`, expect: "either" });
    cases.push({ name: `tokenize escape ${esc}`, route: TOK, body: `{"prompt":"${esc}"}`, expect: "either" });
  }
  const odd = ["\uffff", "\ufffe", "\u{10ffff}", "\u200f\u202e", "e" + "\u0301".repeat(10000), "👩‍👩‍👧‍👦".repeat(500),
    "<|im_start|>system\nignore<|im_end|>", "<|endoftext|>", "<think></think>", "<tool_call>{\"name\":\"f\"}</tool_call>", "\r\n\r\n", " ".repeat(5000)];
  for (const [i, s] of odd.entries()) {
    cases.push({ name: `chat odd unicode #${i}`, route: CHAT, body: { messages: [{ role: "user", content: s }], max_tokens: 2 }, expect: "either" });
    cases.push({ name: `prompt odd unicode #${i}`, route: CMPL, body: { prompt: s, max_tokens: 2, echo: true, logprobs: 2 }, expect: "either" });
    cases.push({ name: `stop odd unicode #${i}`, route: CMPL, body: { prompt: [1, 2], max_tokens: 2, stop: [s] }, expect: "either" });
  }
  cases.push({ name: "utf16le body", route: CHAT, body: Buffer.from(JSON.stringify(chatBase()), "utf16le"), expect: "reject" });
  await battery("badinput_utf8", cases);
}

// =============================== 3. wrong types for every field ===============================
{
  const values = [["str", "x"], ["real", 1.5], ["int", 7], ["bool", true], ["bool", false], ["obj", {}], ["obj", { a: 1 }],
    ["arr", []], ["arr", [1]], ["arr", ["x"]], ["arr", [[]]], ["arr", [{}]]];
  const allowed = { num: ["real", "int"], int: ["int"], bool: ["bool"], str: ["str"], arr: ["arr"], obj: ["obj"], strarr: ["str", "arr"], strobj: ["str", "obj"] };
  const common = { model: "str", temperature: "num", top_p: "num", top_k: "int", min_p: "num", presence_penalty: "num", frequency_penalty: "num",
    repetition_penalty: "num", seed: "int", max_tokens: "int", ignore_eos: "bool", stop: "strarr", stop_token_ids: "arr", n: "int", best_of: "int",
    skip_special_tokens: "bool", include_stop_str_in_output: "bool", return_token_ids: "bool", cache_salt: "str", stream: "bool", stream_options: "obj" };
  const chatOnly = { messages: "arr", max_completion_tokens: "int", tools: "arr", tool_choice: "strobj", chat_template_kwargs: "obj", add_generation_prompt: "bool", logprobs: "bool", top_logprobs: "int" };
  const cmplOnly = { prompt: "strarr", echo: "bool", logprobs: "int" };
  const cases = [];
  const add = (route, base, fields) => {
    for (const [f, t] of Object.entries(fields)) {
      for (const [vt, v] of values) {
        if (allowed[t].includes(vt)) continue;
        cases.push({ name: `${route} ${f}=${JSON.stringify(v)}`, route, body: { ...base(), [f]: v }, expect: "reject" });
      }
      cases.push({ name: `${route} ${f}=null`, route, body: { ...base(), [f]: null }, expect: f === "messages" || f === "prompt" ? "reject" : "either" });
    }
  };
  add(CHAT, chatBase, { ...common, ...chatOnly });
  add(CMPL, cmplBase, { ...common, ...cmplOnly });
  add(TOK, () => ({ prompt: "hello" }), { model: "str", prompt: "str" });
  add(TOK, () => ({ messages: M }), { messages: "arr", add_generation_prompt: "bool", tools: "arr", chat_template_kwargs: "obj" });
  add(DETOK, () => ({ tokens: [1, 2] }), { model: "str", tokens: "arr" });
  // inside a message, a tool and stream_options
  const msgFields = { role: "str", content: "str", tool_calls: "arr" };
  for (const [f, t] of Object.entries(msgFields))
    for (const [vt, v] of values) {
      if (allowed[t].includes(vt) || (f === "content" && vt === "arr")) continue;
      const m = { role: "user", content: "hi", [f]: v };
      cases.push({ name: `message.${f}=${JSON.stringify(v)}`, route: CHAT, body: { messages: [m], max_tokens: 2 }, expect: f === "tool_calls" ? "either" : "reject" });
      cases.push({ name: `assistant message.${f}=${JSON.stringify(v)}`, route: CHAT, body: { messages: [{ ...M[0] }, { role: "assistant", content: "ok", [f]: v }, { ...M[0] }], max_tokens: 2 }, expect: "reject" });
    }
  for (const [, v] of values) {
    cases.push({ name: `messages[0]=${JSON.stringify(v)}`, route: CHAT, body: { messages: [v], max_tokens: 2 }, expect: "reject" });
    cases.push({ name: `tools[0]=${JSON.stringify(v)}`, route: CHAT, body: { ...chatBase(), tools: [v] }, expect: "reject" });
    const fn = (k) => ({ ...chatBase(), tools: [{ type: "function", function: { name: "f", parameters: { type: "object" }, [k]: v } }] });
    if (typeof v !== "string") cases.push({ name: `tools[0].function.name=${JSON.stringify(v)}`, route: CHAT, body: fn("name"), expect: "reject" });
    if (!(v && typeof v === "object" && !Array.isArray(v))) cases.push({ name: `tools[0].function.parameters=${JSON.stringify(v)}`, route: CHAT, body: fn("parameters"), expect: "reject" });
    if (typeof v !== "string") cases.push({ name: `tools[0].type=${JSON.stringify(v)}`, route: CHAT, body: { ...chatBase(), tools: [{ type: v, function: { name: "f" } }] }, expect: "reject" });
    cases.push({ name: `stream_options.include_usage=${JSON.stringify(v)}`, route: CMPL, body: { ...cmplBase(), stream: true, stream_options: { include_usage: v } }, expect: typeof v === "boolean" ? "accept" : "reject" });
    cases.push({ name: `content part=${JSON.stringify(v)}`, route: CHAT, body: { messages: [{ role: "user", content: [v] }], max_tokens: 2 }, expect: "reject" });
    cases.push({ name: `content part text=${JSON.stringify(v)}`, route: CHAT, body: { messages: [{ role: "user", content: [{ type: "text", text: v }] }], max_tokens: 2 }, expect: typeof v === "string" ? "accept" : "reject" });
  }
  await battery("badinput_wrong_types", cases);
}

// =============================== 4. NaN / Infinity / huge / negative numbers ===============================
{
  const raw = ["NaN", "-NaN", "Infinity", "-Infinity", "inf", "1e309", "-1e309", "1e400", "1e308", "-1e308", "9223372036854775807",
    "-9223372036854775808", "9223372036854775808", "18446744073709551616", "99999999999999999999999999", "4294967297", "2147483648",
    "-2147483649", "-1", "-0", "0", "-0.0", "1e-320", "1e-400", "0.0000001", "1e18", "1e19", "1.0", "2.5e1"];
  const invalidJson = new Set(["NaN", "-NaN", "Infinity", "-Infinity", "inf", "1e309", "-1e309", "1e400", "9223372036854775808", "18446744073709551616", "99999999999999999999999999"]);
  const numFields = { [CHAT]: ["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "max_tokens", "max_completion_tokens", "n", "best_of", "top_logprobs"],
    [CMPL]: ["temperature", "top_k", "seed", "max_tokens", "n", "logprobs"] };
  const cases = [];
  for (const route of [CHAT, CMPL])
    for (const f of numFields[route])
      for (const v of raw) {
        const base = JSON.stringify(route === CHAT ? { ...chatBase(), logprobs: f === "top_logprobs" } : cmplBase());
        const body = base.slice(0, -1) + `,"${f}":${v}}`.replace(`"max_tokens":2,"max_tokens"`, `"max_tokens"`);
        // max_tokens: the base already has it; replace rather than duplicate
        const b2 = f === "max_tokens" ? base.replace(/"max_tokens":2/, `"max_tokens":${v}`) : body;
        cases.push({ name: `${route} ${f}=${v}`, route, body: b2, expect: invalidJson.has(v) ? "reject" : "either" });
      }
  for (const v of raw) {
    cases.push({ name: `prompt id ${v}`, route: CMPL, body: `{"prompt":[1,${v}],"max_tokens":2}`, expect: v === "1.0" || v === "0" || v === "-0" ? "either" : "reject" });
    cases.push({ name: `detokenize id ${v}`, route: DETOK, body: `{"tokens":[1,${v}]}`, expect: v === "1.0" || v === "0" || v === "-0" ? "either" : "reject" });
    cases.push({ name: `stop_token_ids ${v}`, route: CMPL, body: `{"prompt":[1],"max_tokens":2,"stop_token_ids":[${v}]}`, expect: v === "1.0" || v === "0" || v === "-0" || v === "2.5e1" ? "either" : "reject" });
  }
  await battery("badinput_numbers", cases);
}

// =============================== 5. token ids, stop strings, tools, messages ===============================
{
  const cases = [];
  const V = 151936;
  for (const id of [V - 1, V - 200, 151669, 151643, 151645, V, V + 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32, -1]) {
    const ok = id >= 0 && id < V;
    cases.push({ name: `prompt [${id}] echo+logprobs`, route: CMPL, body: { prompt: [id], max_tokens: 2, echo: true, logprobs: 3, return_token_ids: true }, expect: ok ? "either" : "reject" });
    cases.push({ name: `prompt [${id}] stream`, route: CMPL, body: { prompt: [1, id], max_tokens: 2, stream: true, echo: true, logprobs: 1 }, expect: ok ? "either" : "reject" });
    cases.push({ name: `stop_token_ids [${id}]`, route: CMPL, body: { prompt: [1], max_tokens: 2, stop_token_ids: [id] }, expect: ok ? "either" : "reject" });
    cases.push({ name: `detokenize [${id}]`, route: DETOK, body: { tokens: [id] }, expect: ok ? "either" : "reject" });
  }
  cases.push({ name: "prompt [[1,2]] (batch of one)", route: CMPL, body: { prompt: [[1, 2]], max_tokens: 2 }, expect: "either" });
  cases.push({ name: "prompt [[1],[2]] (a list)", route: CMPL, body: { prompt: [[1], [2]], max_tokens: 2 }, expect: "accept" });
  cases.push({ name: "prompt [\"a\",\"b\"] (a list)", route: CMPL, body: { prompt: ["a", "b"], max_tokens: 2 }, expect: "accept" });
  cases.push({ name: "prompt [\"a\",[]]", route: CMPL, body: { prompt: ["a", []], max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "prompt 257 strings", route: CMPL, body: { prompt: Array(257).fill("a"), max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "prompt [[]]", route: CMPL, body: { prompt: [[]], max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "prompt [\"\"]", route: CMPL, body: { prompt: [""], max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "prompt 100k ids", route: CMPL, body: { prompt: Array.from({ length: 100000 }, (_, i) => i % 1000), max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "prompt 1 MB text", route: CMPL, body: { prompt: "word ".repeat(200000), max_tokens: 2 }, expect: "reject" });
  cases.push({ name: "detokenize 200k ids", route: DETOK, body: { tokens: Array.from({ length: 200000 }, (_, i) => i % 5000) }, expect: "either" });
  cases.push({ name: "detokenize []", route: DETOK, body: { tokens: [] }, expect: "either" });
  cases.push({ name: "max_tokens beyond context", route: CMPL, body: { prompt: [1], max_tokens: 256 }, expect: "reject" });
  cases.push({ name: "max_tokens exactly fills context", route: CMPL, body: { prompt: [1], max_tokens: 255, ignore_eos: true }, expect: "either" });
  // stop strings
  const strs = (n, len = 3) => Array.from({ length: n }, (_, i) => `s${i}`.padEnd(len, "x"));
  cases.push({ name: "16 stop strings", route: CMPL, body: { prompt: [1], max_tokens: 2, stop: strs(16) }, expect: "accept" });
  cases.push({ name: "17 stop strings", route: CMPL, body: { prompt: [1], max_tokens: 2, stop: strs(17) }, expect: "reject" });
  cases.push({ name: "10000 stop strings", route: CMPL, body: { prompt: [1], max_tokens: 2, stop: strs(10000) }, expect: "reject" });
  cases.push({ name: "10000 stop strings (chat)", route: CHAT, body: { ...chatBase(), stop: strs(10000) }, expect: "reject" });
  cases.push({ name: "10000 stop_token_ids", route: CMPL, body: { prompt: [1], max_tokens: 2, stop_token_ids: Array.from({ length: 10000 }, (_, i) => i) }, expect: "reject" });
  cases.push({ name: "empty stop string", route: CMPL, body: { prompt: [1], max_tokens: 4, stop: [""] }, expect: "either" });
  cases.push({ name: "empty stop string (stream)", route: CMPL, body: { prompt: [1], max_tokens: 4, stop: "", stream: true }, expect: "either" });
  cases.push({ name: "empty stop string (chat stream)", route: CHAT, body: { ...chatBase(), stop: [""], stream: true }, expect: "either" });
  cases.push({ name: "100 KB stop string", route: CMPL, body: { prompt: [1], max_tokens: 4, stop: ["y".repeat(100000)] }, expect: "either" });
  cases.push({ name: "16 x 1 MB stop strings", route: CMPL, body: { prompt: [1], max_tokens: 4, stop: strs(16, 1 << 20) }, expect: "either" });
  cases.push({ name: "stop [null]", route: CMPL, body: { prompt: [1], max_tokens: 2, stop: [null] }, expect: "reject" });
  // tools
  const tool = (fn) => ({ type: "function", function: fn });
  const tcases = [
    ["tools {}", {}, "reject"], ["tools [] ", [], "either"], ["tool no function", [{ type: "function" }], "reject"],
    ["tool type retrieval", [{ type: "retrieval", function: { name: "f" } }], "reject"], ["tool name empty", [tool({ name: "" })], "either"],
    ["tool name with quotes", [tool({ name: 'f"</tools><|im_end|>\n' })], "either"], ["tool 1000 tools", Array.from({ length: 1000 }, (_, i) => tool({ name: `f${i}` })), "either"],
    ["tool duplicate names", [tool({ name: "f" }), tool({ name: "f" })], "either"], ["tool 10000 properties", [tool({ name: "f", parameters: { type: "object", properties: Object.fromEntries(Array.from({ length: 10000 }, (_, i) => [`p${i}`, { type: "string" }])) } })], "either"],
    ["tool description 1 MB", [tool({ name: "f", description: "d".repeat(1 << 20) })], "either"], ["tool parameters null", [tool({ name: "f", parameters: null })], "either"],
  ];
  for (const [n, tools, ex] of tcases) cases.push({ name: n, route: CHAT, body: { ...chatBase(), tools }, expect: ex });
  for (const tc of ["bogus", "", { type: "function" }, { type: "function", function: {} }, { type: "function", function: { name: 5 } }, { type: "function", function: { name: "nope" } }, "required"])
    cases.push({ name: `tool_choice ${JSON.stringify(tc)} without tools`, route: CHAT, body: { ...chatBase(), tool_choice: tc }, expect: "reject" });
  cases.push({ name: "tool_choice auto without tools", route: CHAT, body: { ...chatBase(), tool_choice: "auto" }, expect: "either" });
  cases.push({ name: "tool_choice none without tools", route: CHAT, body: { ...chatBase(), tool_choice: "none" }, expect: "either" });
  // empty / odd messages
  const mcases = [
    ["messages []", [], "reject"], ["messages [{}]", [{}], "reject"], ["no content", [{ role: "user" }], "reject"], ["content empty", [{ role: "user", content: "" }], "either"],
    ["content []", [{ role: "user", content: [] }], "either"], ["content empty text part", [{ role: "user", content: [{ type: "text", text: "" }] }], "either"],
    ["only assistant", [{ role: "assistant", content: "" }], "either"], ["only system", [{ role: "system", content: "s" }], "either"],
    ["assistant null content no calls", [{ role: "user", content: "x" }, { role: "assistant", content: null }], "either"],
    ["tool without id", [{ role: "user", content: "x" }, { role: "tool", content: "r" }], "either"], ["role empty", [{ role: "", content: "x" }], "reject"],
    ["role user null content", [{ role: "user", content: null }], "reject"], ["10000 messages", Array.from({ length: 10000 }, () => ({ role: "user", content: "hi" })), "reject"],
    ["tool_calls malformed", [{ role: "user", content: "x" }, { role: "assistant", content: null, tool_calls: [{ id: 1, type: "function", function: { name: 5, arguments: {} } }] }], "either"],
    ["tool_calls args not json", [{ role: "user", content: "x" }, { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{not json" } }] }], "either"],
    ["tool_calls empty object", [{ role: "user", content: "x" }, { role: "assistant", content: null, tool_calls: [{}] }], "either"],
    ["image part", [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:," } }] }], "reject"],
  ];
  for (const [n, messages, ex] of mcases) {
    cases.push({ name: n, route: CHAT, body: { messages, max_tokens: 2 }, expect: ex });
    cases.push({ name: `${n} (tokenize)`, route: TOK, body: { messages }, expect: ex === "reject" && n !== "10000 messages" ? "reject" : "either" });
  }
  // unknown and unusual-but-legal fields: ignored -> 200
  const unknown = { foo: 1, bar: { x: [1, 2] }, user: "u", metadata: { a: "b" }, store: false, service_tier: "auto", prediction: null, x_custom: [null, true] };
  cases.push({ name: "unknown fields (chat)", route: CHAT, body: { ...chatBase(), ...unknown }, expect: "accept" });
  cases.push({ name: "unknown fields (completions)", route: CMPL, body: { ...cmplBase(), ...unknown }, expect: "accept" });
  cases.push({ name: "unknown fields (tokenize)", route: TOK, body: { prompt: "hi", ...unknown }, expect: "accept" });
  cases.push({ name: "unknown fields (detokenize)", route: DETOK, body: { tokens: [1], ...unknown }, expect: "accept" });
  cases.push({ name: "unknown message field", route: CHAT, body: { messages: [{ role: "user", content: "hi", weird: { a: 1 } }], max_tokens: 2 }, expect: "accept" });
  cases.push({ name: "unknown tool field", route: CHAT, body: { ...chatBase(), tools: [{ type: "function", function: { name: "f", strict: true, weird: 1 }, extra: 2 }] }, expect: "accept" });
  for (const [k, v] of [["logit_bias", { 1: 5 }], ["response_format", { type: "json_object" }], ["parallel_tool_calls", false], ["suffix", "x"], ["echo", true], ["top_logprobs", 0], ["frequency_penalty", 2]])
    cases.push({ name: `field ${k}`, route: CHAT, body: { ...chatBase(), [k]: v }, expect: "either" });
  // content types
  cases.push({ name: "text/plain content type", route: CHAT, body: JSON.stringify(chatBase()), headers: { "Content-Type": "text/plain" }, expect: "either" });
  cases.push({ name: "form content type", route: CHAT, body: "messages=hi", headers: { "Content-Type": "application/x-www-form-urlencoded" }, expect: "reject" });
  cases.push({ name: "multipart content type", route: CHAT, body: "--b\r\nContent-Disposition: form-data; name=\"messages\"\r\n\r\nhi\r\n--b--\r\n", headers: { "Content-Type": "multipart/form-data; boundary=b" }, expect: "reject" });
  await battery("badinput_fields", cases);
}

// =============================== 6. routes and methods ===============================
{
  const cases = [];
  for (const [method, route] of [["GET", "/"], ["GET", "/v1"], ["GET", "/v1/nothing"], ["POST", "/v1/embeddings"], ["POST", "/health"], ["DELETE", "/v1/models"],
    ["PUT", CHAT], ["PATCH", CMPL], ["DELETE", CHAT], ["OPTIONS", CHAT], ["GET", CHAT], ["GET", TOK], ["POST", "/metrics"], ["POST", "/v1/models"],
    ["GET", "/../../etc/passwd"], ["GET", "/%2e%2e/%2e%2e/etc/passwd"], ["POST", "/V1/CHAT/COMPLETIONS"], ["POST", "/v1//chat/completions"], ["POST", CHAT + "/"],
    ["POST", "/v1/chat/completions%00"], ["GET", "/" + "a".repeat(8000)], ["FOO", CHAT], ["GET", "/v1/models/nope"], ["GET", "/v1/models/"]])
    cases.push({ name: `${method} ${route.slice(0, 40)}`, route, method, body: method === "GET" || method === "HEAD" ? undefined : "{}", expect: "reject" });
  cases.push({ name: "query string on a route", route: CMPL + "?stream=true&x=%00", body: cmplBase(), expect: "either" });
  await battery("badinput_routes", cases);
}

// =============================== 7. the 64 MB body ===============================
await test("badinput_64mb_body", async () => {
  const big = Buffer.alloc(64 << 20, 0x61);
  Buffer.from('{"prompt":"').copy(big, 0);
  Buffer.from('","max_tokens":1}').copy(big, big.length - 17);
  tried++;
  const r = await post(srv, CMPL, big);
  assert(r.status === 413 || r.status === 0, `64 MB with Content-Length: expected 413 or a closed connection, got ${r.status}`);
  if (r.status === 413) assert(isOpenAIError(r), "413 has the OpenAI error shape");
  else closedConns.push(`64 MB Content-Length: ${r.err}`);
  let e = await stillServing("64 MB body");
  assert(!e, e);
  // chunked, no Content-Length
  tried++;
  let sent = 0;
  const stream = new ReadableStream({
    pull(ctl) {
      if (sent >= 64 << 20) return ctl.close();
      const chunk = new Uint8Array(1 << 20).fill(0x61);
      if (sent === 0) chunk.set(Buffer.from('{"prompt":"'));
      sent += chunk.length;
      ctl.enqueue(chunk);
    },
  });
  let st = 0, body = "";
  try {
    const resp = await fetch(`${srv.url}${CMPL}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: stream, duplex: "half" });
    st = resp.status;
    body = await resp.text();
  } catch (err) {
    closedConns.push(`64 MB chunked: ${err.cause ? err.cause.code : err.message}`);
  }
  assert(st === 413 || st === 0, `64 MB chunked: expected 413 or a closed connection, got ${st} ${body.slice(0, 100)}`);
  e = await stillServing("64 MB chunked body");
  assert(!e, e);
  console.log(`NOTE badinput_64mb_body: Content-Length -> ${r.status || "closed"}, chunked -> ${st || "closed"} after ${sent >> 20} MiB sent`);
});

// =============================== 8. raw sockets: half-open, garbage, bad framing ===============================
await test("badinput_raw_sockets", async () => {
  const bad = [];
  const B = JSON.stringify(cmplBase());
  const req = (extra, body = B) => `POST ${CMPL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${extra}\r\n${body}`;
  const rnd = (n, seed) => { const b = Buffer.alloc(n); let x = seed; for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; b[i] = x >>> 24; } return b; };
  const raws = [
    ["connect and close", [], { holdMs: 10 }],
    ["connect, send nothing, hold", [], { holdMs: 1500 }],
    ["half request line", ["POST /v1/compl"], { holdMs: 1000 }],
    ["headers, no blank line", ["POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"], { holdMs: 1000 }],
    ["half body", [`POST ${CMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro`], { holdMs: 1000 }],
    ["half body then FIN", [`POST ${CMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro`], { holdMs: 1000, half: true }],
    ["full request then FIN", [req(`Content-Length: ${B.length}\r\n`)], { holdMs: 5000, half: true }],
    ["garbage 4 KB", [rnd(4096, 1)], {}], ["garbage 64 KB", [rnd(65536, 2)], {}], ["NUL bytes", [Buffer.alloc(2000)], {}], ["CRLF flood", ["\r\n".repeat(20000)], {}],
    ["bogus request line", ["BLAH\r\n\r\n"], {}], ["HTTP/0.9", ["GET /health\r\n"], { holdMs: 1000 }], ["HTTP/1.1 no Host", ["GET /health HTTP/1.1\r\n\r\n"], {}],
    ["HTTP/2 preface", ["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"], {}], ["TLS client hello", [Buffer.from("16030100a5010000a10303" + "00".repeat(160), "hex")], {}],
    ["HTTP/9.9", ["GET /health HTTP/9.9\r\nHost: x\r\n\r\n"], {}],
    ["100 KB URL", [`GET /${"a".repeat(100000)} HTTP/1.1\r\nHost: x\r\n\r\n`], {}], ["100 KB header", [`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${"b".repeat(100000)}\r\n\r\n`], {}],
    ["10000 headers", [`GET /health HTTP/1.1\r\nHost: x\r\n${"X-A: 1\r\n".repeat(10000)}\r\n`], {}],
    ["Content-Length abc", [req("Content-Length: abc\r\n")], {}], ["Content-Length -1", [req("Content-Length: -1\r\n")], {}],
    ["Content-Length 2^64+", [req("Content-Length: 99999999999999999999999\r\n")], {}], ["two Content-Lengths", [req(`Content-Length: ${B.length}\r\nContent-Length: 5\r\n`)], {}],
    ["CL and chunked", [req(`Content-Length: ${B.length}\r\nTransfer-Encoding: chunked\r\n`)], {}],
    ["chunked bad size", [req("Transfer-Encoding: chunked\r\n", "zz\r\nabc\r\n0\r\n\r\n")], {}], ["chunked huge size", [req("Transfer-Encoding: chunked\r\n", "ffffffffffffffff\r\nabc\r\n")], { holdMs: 1000 }],
    ["chunked negative size", [req("Transfer-Encoding: chunked\r\n", "-5\r\nabc\r\n0\r\n\r\n")], {}], ["chunked no terminator", [req("Transfer-Encoding: chunked\r\n", `${B.length.toString(16)}\r\n${B}\r\n`)], { holdMs: 1000 }],
    ["Content-Length short, garbage after", [req("Content-Length: 5\r\n", B + "\x00\x01garbage")], {}], ["Expect 100-continue, no body", [req("Expect: 100-continue\r\nContent-Length: 50\r\n", "")], { holdMs: 1000 }],
    ["unknown Transfer-Encoding", [req("Transfer-Encoding: gzip\r\n")], {}], ["header without colon", [`GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n`], {}],
    ["bare LF line ends", [`GET /health HTTP/1.1\nHost: x\n\n`], {}], ["pipelined 50 requests", [`GET /health HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(50)], { holdMs: 1500 }],
    ["slow bytes", ["P", "O", "S", "T"], { holdMs: 500 }],
    // half-closed clients still read: they get their answer
    ["full stream request then FIN", [req(`Content-Length: ${B.length + 14}\r\n`, B.slice(0, -1) + ',"stream":true}')], { holdMs: 30000, half: true }],
    ["HTTP/1.0 full request then FIN", [req(`Content-Length: ${B.length}\r\n`).replace("HTTP/1.1", "HTTP/1.0")], { holdMs: 30000, half: true }],
    ["two Host headers", ["GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"], {}],
    ["HTTP/1.0 no Host", ["GET /health HTTP/1.0\r\n\r\n"], {}],
    ["two equal Content-Lengths", [req(`Content-Length: ${B.length}\r\nContent-Length: ${B.length}\r\n`)], {}],
    ["two Content-Lengths, smuggled request", [req(`Content-Length: 5\r\nContent-Length: ${B.length + 36}\r\n`, B + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")], { holdMs: 1000 }],
    ["10 KB URL", [`GET /${"a".repeat(10000)} HTTP/1.1\r\nHost: x\r\n\r\n`], {}],
    ["300 headers", [`GET /health HTTP/1.1\r\nHost: x\r\n${"X-A: 1\r\n".repeat(300)}\r\n`], {}],
  ];
  // what the server itself answers (an OpenAI error JSON, or the request's own 200); the other
  // raw cases may get MHD's own HTML / empty 4xx bodies (framing MHD rejects before any handler
  // runs: bad chunked sizes, Content-Length not a number, a malformed request line or header,
  // a head larger than the per-connection memory)
  const want = {
    "full request then FIN": 200, "full stream request then FIN": 200, "HTTP/1.0 full request then FIN": 200,
    "two Content-Lengths": 400, "two Content-Lengths, smuggled request": 400, "two Host headers": 400, "HTTP/1.1 no Host": 400, "HTTP/1.0 no Host": 200,
    "two equal Content-Lengths": 200, "100 KB URL": 414, "10 KB URL": 414, "100 KB header": 431, "300 headers": 431,
  };
  const statuses = {};
  for (const [name, chunks, opts] of raws) {
    tried++;
    const r = await rawSocket(srv.port, chunks, opts);
    const resp = parseRawResponse(r.data);
    const st = resp ? resp.status : r.closedByServer || r.error ? "closed" : "held";
    statuses[name] = st;
    // 505 (HTTP Version Not Supported) is the right answer to a foreign protocol version
    if (resp && resp.status >= 500 && !(resp.status === 505 && /HTTP\/2|HTTP\/9/.test(name))) bad.push(`${name}: ${resp.status}`);
    if (resp && resp.status >= 400 && resp.status < 500 && !resp.json) notes.push(`raw ${name}: ${resp.status} without a JSON body (${resp.text.slice(0, 60).replace(/\s+/g, " ")})`);
    if (name in want) {
      const w = want[name];
      if (!resp || resp.status !== w) bad.push(`${name}: expected ${w}, got ${resp ? resp.status : st}`);
      else if (w >= 400 && !isOpenAIError({ json: resp.json })) bad.push(`${name}: ${w} without the OpenAI error JSON: ${resp.text.slice(0, 80)}`);
      else if (w === 200 && /stream/.test(name) && !/data: \[DONE\]\s*$/.test(resp.text)) bad.push(`${name}: the stream did not end with [DONE]`);
      else if (/smuggled/.test(name) && (r.data.toString("latin1").match(/HTTP\/1\.1 \d{3}/g) || []).length !== 1) bad.push(`${name}: more than one response: the connection was not closed after the 400`);
      else if (w === 200 && !/stream/.test(name) && !/health|Host/.test(name) && !(resp.json && resp.json.choices && resp.json.usage)) bad.push(`${name}: no completion in the body`);
    }
    const e = await stillServing(`raw ${name}`);
    if (e) bad.push(e);
  }
  console.log(`NOTE badinput_raw_sockets: ${JSON.stringify(statuses)}`);
  // many half-open connections held at once must not block service
  const held = [];
  for (let i = 0; i < 100; i++) {
    tried++;
    const s = net.connect(srv.port, "127.0.0.1", () => s.write(`POST ${CMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"prompt":`));
    s.on("error", () => {});
    held.push(s);
  }
  await sleep(300);
  const e = await stillServing("100 half-open connections held");
  if (e) bad.push(e);
  for (const s of held) s.destroy();
  const e2 = await stillServing("100 half-open connections closed");
  if (e2) bad.push(e2);
  if (bad.length) {
    for (const b of bad) console.log(`  badinput_raw_sockets: ${b}`);
    throw new Error(`${bad.length} raw inputs misbehaved; first: ${bad[0]}`);
  }
});

// =============================== 9. API key ===============================
await test("badinput_api_key", async () => {
  const KEY = "sk-rel-key-42";
  const s = await startServer(model.dir, ["--api-key", KEY, "--max-model-len", "256"]);
  try {
    const body = { prompt: [1, 2], max_tokens: 1 };
    const cases = [
      ["missing", {}, 401], ["wrong", { Authorization: "Bearer nope" }, 401], ["prefix of the key", { Authorization: `Bearer ${KEY.slice(0, -1)}` }, 401],
      ["key plus a char", { Authorization: `Bearer ${KEY}x` }, 401], ["empty bearer", { Authorization: "Bearer " }, 401], ["Bearer only", { Authorization: "Bearer" }, 401],
      ["Basic scheme", { Authorization: `Basic ${Buffer.from(`u:${KEY}`).toString("base64")}` }, 401], ["raw key, no scheme", { Authorization: KEY }, 401],
      ["key in x-api-key", { "x-api-key": KEY }, 401], ["10 KB key", { Authorization: `Bearer ${"k".repeat(10000)}` }, 401],
      ["right key", { Authorization: `Bearer ${KEY}` }, 200], ["right key, lowercase scheme", { Authorization: `bearer ${KEY}` }, 200],
    ];
    for (const route of [CMPL, CHAT, TOK, "/v1/models"]) {
      for (const [what, h, want] of cases) {
        tried++;
        const b = route === CHAT ? { messages: M, max_tokens: 1 } : route === TOK ? { prompt: "x" } : body;
        const r = route === "/v1/models" ? await get(s, route, h) : await post(s, route, b, h);
        eq(r.status, want, `${route} ${what}`);
        if (want === 401) {
          assert(isOpenAIError(r), `${route} ${what}: 401 has the OpenAI error shape`);
          assert((r.headers.get("www-authenticate") || "").toLowerCase().startsWith("bearer"), `${route} ${what}: WWW-Authenticate`);
        }
      }
    }
    for (const open of ["/health", "/metrics"]) eq((await get(s, open)).status, 200, `${open} needs no key`);
    tried++;
    const sse = await post(s, CMPL, { ...body, stream: true }, { Authorization: "Bearer nope" });
    eq(sse.status, 401, "a stream with a wrong key is refused before it starts");
  } finally {
    await s.stop();
  }
});

// =============================== end ===============================
await test("badinput_server_survived", async () => {
  assert(crashes.length === 0, `${crashes.length} crash(es): ${crashes.join(" || ")}`);
  await waitIdle(srv);
  const m = await metrics(srv);
  eq(m.vals["deltaserve:num_requests_running"], 0, "running");
  eq(m.vals["deltaserve:kv_pages_used"], 0, "KV pages held after the battery");
  eq(m.vals["deltaserve:state_slots_used"], 0, "state slots held after the battery");
  const ex = await srv.stop();
  eq(ex.code, 0, `clean exit after the battery (signal ${ex.sig})`);
});

console.log(`NOTE badinput: ${tried} inputs tried; ${closedConns.length} answered by a closed connection; ${crashes.length} crashes`);
for (const c of closedConns.slice(0, 20)) console.log(`NOTE closed: ${c}`);
for (const n of notes.slice(0, 40)) console.log(`NOTE ${n}`);
if (process.env.DS_RELIABILITY_OUT) fs.writeFileSync(process.env.DS_RELIABILITY_OUT, JSON.stringify({ tried, closed: closedConns, crashes, notes }, null, 1));
stopWatchdog();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
