// soak_load — a time-based soak of a running `deltaserve serve` at full concurrency; the load
// half of scripts/device/soak.sh (which builds, starts the server and stops it).
//
//   node scripts/bench/soak_load.mjs --base-url http://127.0.0.1:18090 --server-pid PID --out FILE.json
//        [--clients 256] [--duration-s 600] [--warmup-s 30] [--max-tokens-min 16] [--max-tokens-max 256]
//        [--system-words 2400] [--id-prefix 2000] [--conv-chars 24000] [--vocab 151936] [--no-chat]
//        [--sample-s 10] [--idle-ceiling-s 240] [--grace-s 120] [--request-timeout-s 300]
//        [--wait-health-s 300] [--seed 1] [--meta JSON]
//
// Plain fetch and raw sockets (no client library). N closed-loop clients each loop over a mix:
// agent-style chat conversations that grow turn by turn over a long shared system prompt,
// one-shot chats with the shared system prompt, short chats, /v1/completions with a shared
// token-id prefix (return_token_ids) and short text completions, each streamed or not, with
// random max_tokens in [min, max]; streams cancelled by the client after a few chunks; raw
// sockets destroyed mid-request (before the body is whole, while waiting, or mid-stream); a few
// malformed bodies. --no-chat (a server started with --skip-tokenizer-init) keeps only the
// token-id completions. The mix first runs --warmup-s seconds, then the server is let go idle and
// the baseline is sampled (RSS, GPU memory, pools), then the soak proper runs --duration-s.
//
// Every valid request must end in a complete response (stream: data events only, a
// finish_reason, usage within max_tokens, [DONE]; with ignore_eos and finish_reason "length"
// exactly max_tokens tokens; completions: the streamed token_ids add up to completion_tokens)
// or an explicit OpenAI error. Errors (the verdict's count): 5xx, 400 on a request we consider
// valid, SSE error events, connection failures, protocol violations, requests that hung past the
// grace after the load; 429 is reported as a rejection, not an error. Malformed bodies must get a
// 4xx OpenAI error.
//
// Every --sample-s seconds: the server's VmRSS and thread count (/proc/PID/status), its GPU memory
// (nvidia-smi --query-compute-apps; null when nvidia-smi is absent or does not list the PID) and
// the device's memory in use, the /metrics gauges, /health. After the load: waits for
// running = waiting = 0 (ceiling --idle-ceiling-s), for KV pages / state slots in use to return
// to the baseline, samples again, sends one more request. Writes the JSON (samples, tallies,
// latency percentiles, verdict) and prints a short table; exit status 0 when the verdict passes.
import fs from "node:fs";
import net from "node:net";
import { execFile } from "node:child_process";

// ---------------------------------------------------------------------------------------------
// flags
function parseArgs(argv) {
  const o = {
    baseUrl: "http://127.0.0.1:18090", serverPid: 0, out: null, clients: 256, durationS: 600, warmupS: 30,
    maxTokensMin: 16, maxTokensMax: 256, systemWords: 2400, idPrefix: 2000, convChars: 24000, vocab: 151936,
    chat: true, sampleS: 10, idleCeilingS: 240, graceS: 120, requestTimeoutS: 300, waitHealthS: 300, seed: 1, meta: {},
  };
  const num = (k, v) => {
    const x = Number(v);
    if (!Number.isFinite(x)) throw new Error(`${k}: not a number: ${v}`);
    return x;
  };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i];
    if (k === "--help" || k === "-h") {
      console.log(fs.readFileSync(new URL(import.meta.url)).toString().split("\n").filter((l) => l.startsWith("//")).join("\n"));
      process.exit(0);
    }
    if (k === "--no-chat") {
      o.chat = false;
      continue;
    }
    const v = argv[++i];
    if (v === undefined) throw new Error(`${k} needs a value`);
    switch (k) {
      case "--base-url": o.baseUrl = v.replace(/\/+$/, "").replace(/\/v1$/, ""); break;
      case "--server-pid": o.serverPid = num(k, v); break;
      case "--out": o.out = v; break;
      case "--clients": o.clients = num(k, v); break;
      case "--duration-s": o.durationS = num(k, v); break;
      case "--warmup-s": o.warmupS = num(k, v); break;
      case "--max-tokens-min": o.maxTokensMin = num(k, v); break;
      case "--max-tokens-max": o.maxTokensMax = num(k, v); break;
      case "--system-words": o.systemWords = num(k, v); break;
      case "--id-prefix": o.idPrefix = num(k, v); break;
      case "--conv-chars": o.convChars = num(k, v); break;
      case "--vocab": o.vocab = num(k, v); break;
      case "--sample-s": o.sampleS = num(k, v); break;
      case "--idle-ceiling-s": o.idleCeilingS = num(k, v); break;
      case "--grace-s": o.graceS = num(k, v); break;
      case "--request-timeout-s": o.requestTimeoutS = num(k, v); break;
      case "--wait-health-s": o.waitHealthS = num(k, v); break;
      case "--seed": o.seed = num(k, v); break;
      case "--meta": o.meta = JSON.parse(v); break;
      default: throw new Error(`unknown flag ${k}`);
    }
  }
  if (!o.out) throw new Error("--out FILE.json is required");
  if (o.clients < 1 || o.maxTokensMin < 1 || o.maxTokensMax < o.maxTokensMin) throw new Error("need --clients >= 1 and 1 <= --max-tokens-min <= --max-tokens-max");
  return o;
}
if (process.argv[2] === "--table") {
  // prints the table of a finished run's JSON (used by soak.sh collect)
  printTable(JSON.parse(fs.readFileSync(process.argv[3], "utf8")));
  process.exit(0);
}
const O = parseArgs(process.argv);
const ROOT = O.baseUrl;
const T_START = performance.now();
const nowS = () => (performance.now() - T_START) / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (s) => console.log(`soak_load: [${nowS().toFixed(0)} s] ${s}`);

// mulberry32: deterministic, so runs with the same seed send the same mix
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(O.seed);
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (a) => a[Math.floor(rand() * a.length)];

function percentile(values, p) {
  if (values.length === 0) return null;
  const v = Float64Array.from(values).sort();
  const r = (p / 100) * (v.length - 1);
  const lo = Math.floor(r), hi = Math.ceil(r);
  return v[lo] + (v[hi] - v[lo]) * (r - lo);
}

// ---------------------------------------------------------------------------------------------
// the workload's shared parts
const WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not but " +
  "river stone lamp north quiet glass bread seven harbor field letter engine garden window market winter signal " +
  "table record answer check number follow report careful short source step result plan tool call file line").split(" ");
const SYSTEM = (() => {
  const r = rng(O.seed + 101);
  const w = [];
  for (let i = 0; i < O.systemWords; i++) w.push(WORDS[Math.floor(r() * WORDS.length)] + (i % 17 === 16 ? "." : ""));
  return `You are a careful agent. Follow the rules below.\n${w.join(" ")}\nAnswer briefly.`;
})();
const ID_PREFIX = (() => {
  const r = rng(O.seed + 202);
  return Array.from({ length: O.idPrefix }, () => 10 + Math.floor(r() * (O.vocab - 10)));
})();
const randIds = (n) => Array.from({ length: n }, () => 10 + Math.floor(rand() * (O.vocab - 10)));
const sentence = (n) => Array.from({ length: n }, () => pick(WORDS)).join(" ");

// ---------------------------------------------------------------------------------------------
// tallies, one per phase ("warmup", "soak")
function newTally() {
  return {
    sent: 0, valid: 0, completed_ok: 0, streams: 0, by_kind: {}, statuses: {}, rejected_429: 0, errors: 0,
    error_kinds: {}, cancels: 0, cancels_finished_first: 0, disconnects: 0, bad: 0, bad_rejected: 0,
    completion_tokens: 0, prompt_tokens: 0, cached_tokens: 0, e2e_ms: [], ttft_ms: [], first_errors: [],
  };
}
const TALLY = { warmup: newTally(), soak: newTally() };
let phase = "warmup";
const tally = () => TALLY[phase];
function error(t, what, detail) {
  t.errors++;
  t.error_kinds[what] = (t.error_kinds[what] || 0) + 1;
  if (t.first_errors.length < 20) t.first_errors.push(`${what}: ${String(detail).slice(0, 200)}`);
}
const isOpenAIError = (j) => !!(j && j.error && typeof j.error.message === "string" && j.error.message.length > 0);

// the in-flight requests, so the ones still running past the grace can be aborted
const inflight = new Set();
const sockets = new Set(); // the raw sockets of disconnectRequest, destroyed on the hard stop
let hardStop = new AbortController(); // aborted past the grace: ends the requests still in flight
let hardStopped = false; // errors seen while it fires count as "hung"

async function fetchT(url, init = {}, timeoutS = O.requestTimeoutS) {
  const signals = [AbortSignal.timeout(timeoutS * 1000)];
  if (init.signal) signals.push(init.signal);
  signals.push(hardStop.signal);
  return fetch(url, { ...init, signal: AbortSignal.any(signals) });
}

/* Reads an SSE body; returns {events: [parsed JSON], done, bad, ttftMs}. onEvent(j, n) may
 * return true to stop (the caller aborts). */
async function readSSE(resp, t0, isFirstToken, onEvent) {
  const out = { events: 0, done: false, bad: null, ttftMs: null, error: null, finish: null, usage: null, tokenIds: 0, content: "" };
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ")) {
        out.bad = `non-data event ${JSON.stringify(ev.slice(0, 60))}`;
        continue;
      }
      const d = ev.slice(6);
      if (d === "[DONE]") {
        if (out.done) out.bad = "two [DONE]";
        out.done = true;
        continue;
      }
      if (out.done) out.bad = "data after [DONE]";
      let j;
      try {
        j = JSON.parse(d);
      } catch {
        out.bad = `unparsable chunk ${JSON.stringify(d.slice(0, 60))}`;
        continue;
      }
      out.events++;
      if (j.error) out.error = j.error;
      if (j.usage) out.usage = j.usage;
      for (const c of j.choices || []) {
        if (c.finish_reason) out.finish = c.finish_reason;
        if (Array.isArray(c.token_ids)) out.tokenIds += c.token_ids.length;
        if (c.delta && typeof c.delta.content === "string") out.content += c.delta.content;
        if (out.ttftMs === null && isFirstToken(c)) out.ttftMs = performance.now() - t0;
      }
      if (onEvent && onEvent(j, out.events)) return out;
    }
  }
  if (buf.trim().length) out.bad = `trailing bytes ${JSON.stringify(buf.slice(0, 60))}`;
  return out;
}
const firstTokenChat = (c) => !!c.delta && ((typeof c.delta.content === "string" && c.delta.content.length > 0) ||
  (typeof c.delta.reasoning_content === "string" && c.delta.reasoning_content.length > 0) || Array.isArray(c.delta.tool_calls));
const firstTokenCmpl = (c) => (Array.isArray(c.token_ids) && c.token_ids.length > 0) || (typeof c.text === "string" && c.text.length > 0);

/* One valid request. kind: "chat" | "cmpl"; returns the assistant text (chat) or null. */
async function validRequest(label, route, body, stream) {
  const t = tally();
  t.sent++;
  t.valid++;
  t.by_kind[label] = (t.by_kind[label] || 0) + 1;
  const chat = route.endsWith("/chat/completions");
  const maxTokens = body.max_tokens;
  if (stream) {
    t.streams++;
    body = { ...body, stream: true, stream_options: { include_usage: true } };
  }
  const t0 = performance.now();
  const tok = { id: Symbol() };
  inflight.add(tok);
  try {
    let resp;
    try {
      resp = await fetchT(`${ROOT}${route}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    } catch (e) {
      return error(t, hardStopped ? "hung" : "connection", `${label}: ${e.cause ? e.cause.code || e.cause.message : e.message}`), null;
    }
    t.statuses[resp.status] = (t.statuses[resp.status] || 0) + 1;
    if (resp.status !== 200) {
      const text = await resp.text().catch(() => "");
      let j = null;
      try {
        j = JSON.parse(text);
      } catch {}
      if (!isOpenAIError(j)) return error(t, "protocol", `${label}: status ${resp.status} without an OpenAI error: ${text.slice(0, 100)}`), null;
      if (resp.status === 429) t.rejected_429++;
      else if (resp.status >= 500) error(t, `status_${resp.status}`, `${label}: ${j.error.message}`);
      else error(t, `status_${resp.status}`, `${label}: a valid request got ${resp.status}: ${j.error.message}`);
      return null;
    }
    let finish, usage, content = null;
    if (stream) {
      let s;
      try {
        s = await readSSE(resp, t0, chat ? firstTokenChat : firstTokenCmpl);
      } catch (e) {
        return error(t, hardStopped ? "hung" : "stream_broken", `${label}: ${e.cause ? e.cause.code || e.cause.message : e.message}`), null;
      }
      if (s.bad) return error(t, "protocol", `${label}/stream: ${s.bad}`), null;
      if (s.error) return error(t, "stream_error", `${label}/stream: error event ${JSON.stringify(s.error).slice(0, 150)}`), null;
      if (!s.done) return error(t, "protocol", `${label}/stream: no [DONE] after ${s.events} events`), null;
      if (!s.usage) return error(t, "protocol", `${label}/stream: no usage chunk`), null;
      if (!chat && body.return_token_ids && s.tokenIds !== s.usage.completion_tokens)
        return error(t, "protocol", `${label}/stream: ${s.tokenIds} streamed token ids != completion_tokens ${s.usage.completion_tokens}`), null;
      finish = s.finish;
      usage = s.usage;
      content = s.content;
      if (s.ttftMs !== null) t.ttft_ms.push(s.ttftMs);
    } else {
      let j;
      try {
        j = await resp.json();
      } catch (e) {
        return error(t, hardStopped ? "hung" : "protocol", `${label}: unreadable 200 body (${e.message})`), null;
      }
      if (!j || !Array.isArray(j.choices) || j.choices.length !== 1 || !j.usage) return error(t, "protocol", `${label}: malformed 200 ${JSON.stringify(j).slice(0, 100)}`), null;
      finish = j.choices[0].finish_reason;
      usage = j.usage;
      if (chat) content = j.choices[0].message ? j.choices[0].message.content : null;
      else if (body.return_token_ids && (!Array.isArray(j.choices[0].token_ids) || j.choices[0].token_ids.length !== usage.completion_tokens))
        return error(t, "protocol", `${label}: token_ids length != completion_tokens ${usage.completion_tokens}`), null;
    }
    if (finish !== "stop" && finish !== "length") return error(t, "protocol", `${label}: finish_reason ${JSON.stringify(finish)}`), null;
    const ct = usage.completion_tokens;
    if (!(Number.isInteger(ct) && ct >= 0 && ct <= maxTokens)) return error(t, "protocol", `${label}: completion_tokens ${ct} outside 0..${maxTokens}`), null;
    if (body.ignore_eos && finish === "length" && ct !== maxTokens) return error(t, "protocol", `${label}: finish "length" after ${ct} of ${maxTokens} tokens`), null;
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    if (cached > usage.prompt_tokens) return error(t, "protocol", `${label}: cached_tokens ${cached} > prompt_tokens ${usage.prompt_tokens}`), null;
    t.completed_ok++;
    t.completion_tokens += ct;
    t.prompt_tokens += usage.prompt_tokens || 0;
    t.cached_tokens += cached;
    t.e2e_ms.push(performance.now() - t0);
    return typeof content === "string" ? content : "";
  } finally {
    inflight.delete(tok);
  }
}

/* A long stream the client aborts after a few chunks. */
async function cancelRequest() {
  const t = tally();
  t.sent++;
  t.cancels++;
  const ac = new AbortController();
  const chat = O.chat && rand() < 0.5;
  const maxTokens = O.maxTokensMax * 2;
  const body = chat
    ? { messages: [{ role: "system", content: SYSTEM }, { role: "user", content: `Go on about the ${pick(WORDS)}.` }], max_tokens: maxTokens, ignore_eos: true, stream: true }
    : { prompt: [...ID_PREFIX, ...randIds(randInt(1, 40))], max_tokens: maxTokens, ignore_eos: true, stream: true };
  const after = randInt(1, 4);
  try {
    const resp = await fetchT(`${ROOT}${chat ? "/v1/chat/completions" : "/v1/completions"}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: ac.signal,
    });
    t.statuses[resp.status] = (t.statuses[resp.status] || 0) + 1;
    if (resp.status !== 200) {
      await resp.text().catch(() => "");
      if (resp.status === 429) t.rejected_429++;
      else error(t, `status_${resp.status}`, `cancel: status ${resp.status}`);
      return;
    }
    const s = await readSSE(resp, performance.now(), () => false, (_j, n) => n >= after);
    if (s.bad) return error(t, "protocol", `cancel/stream: ${s.bad}`);
    if (s.error) return error(t, "stream_error", `cancel/stream: ${JSON.stringify(s.error).slice(0, 150)}`);
    if (s.done) t.cancels_finished_first++;
    ac.abort();
  } catch (e) {
    if (!ac.signal.aborted) error(t, hardStopped ? "hung" : "connection", `cancel: ${e.cause ? e.cause.code || e.cause.message : e.message}`);
  }
}

/* A raw socket destroyed mid-request: half a request, a whole one closed while waiting, or a
 * stream closed once its first bytes arrive. */
function disconnectRequest() {
  const t = tally();
  t.sent++;
  t.disconnects++;
  const how = pick(["half", "waiting", "mid_stream"]);
  const body = JSON.stringify({ prompt: [...ID_PREFIX.slice(0, 64), ...randIds(randInt(1, 30))], max_tokens: O.maxTokensMax, ignore_eos: true, stream: how === "mid_stream" });
  const port = Number(new URL(ROOT).port || 80);
  const host = new URL(ROOT).hostname;
  return new Promise((resolve) => {
    let timer = null;
    const s = net.connect(port, host, () => {
      const req = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
      s.write(how === "half" ? req.slice(0, Math.floor(req.length / 2)) : req);
      if (how !== "mid_stream") timer = setTimeout(() => s.destroy(), randInt(0, 200));
      else timer = setTimeout(() => s.destroy(), O.requestTimeoutS * 1000);
    });
    if (how === "mid_stream") s.on("data", (d) => d.toString().includes("data: ") && s.destroy());
    sockets.add(s);
    s.on("error", () => {});
    s.on("close", () => {
      sockets.delete(s);
      clearTimeout(timer);
      resolve();
    });
  });
}

const BAD_BODIES = ["{", "[1]", '{"messages":"x"}', '{"prompt":[1,-1],"max_tokens":2}', '{"prompt":[1],"max_tokens":0}',
  '{"messages":[{"role":"robot","content":"x"}]}', '{"prompt":[1],"temperature":"hot"}', "\xff\xfe", '{"prompt":[999999999]}'];
async function badRequest() {
  const t = tally();
  t.sent++;
  t.bad++;
  const b = pick(BAD_BODIES);
  const route = O.chat && rand() < 0.5 ? "/v1/chat/completions" : "/v1/completions";
  try {
    const r = await fetchT(`${ROOT}${route}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: b });
    const text = await r.text();
    let j = null;
    try {
      j = JSON.parse(text);
    } catch {}
    if (r.status >= 400 && r.status < 500 && isOpenAIError(j)) t.bad_rejected++;
    else error(t, "protocol", `bad body ${JSON.stringify(b)} on ${route}: ${r.status} ${text.slice(0, 80)}`);
  } catch (e) {
    error(t, "connection", `bad body: ${e.cause ? e.cause.code || e.cause.message : e.message}`);
  }
}

// ---------------------------------------------------------------------------------------------
// a client: loops over the mix until stopAt; keeps its own agent conversation
const sampling = () => {
  const x = rand();
  const s = { max_tokens: randInt(O.maxTokensMin, O.maxTokensMax), ignore_eos: rand() < 0.8 };
  if (x < 0.5) s.temperature = 0;
  else if (x < 0.8) Object.assign(s, { temperature: 0.8, top_p: 0.95, seed: randInt(1, 1e6) });
  else Object.assign(s, { temperature: 1.0, top_k: 40 });
  return s;
};
async function client(stopAt) {
  let conv = null, turns = 0;
  while (performance.now() < stopAt) {
    const x = rand();
    const stream = rand() < 0.6;
    if (O.chat && x < 0.30) {
      // agent-style: the conversation grows turn by turn over the shared system prompt
      if (!conv || turns >= randInt(3, 10) || JSON.stringify(conv).length > O.convChars) {
        conv = [{ role: "system", content: SYSTEM }];
        turns = 0;
      }
      conv.push({ role: "user", content: `Step ${turns + 1}: ${sentence(randInt(5, 40))}` });
      const reply = await validRequest("chat_agent", "/v1/chat/completions", { messages: conv, ...sampling() }, rand() < 0.7);
      if (reply === null) conv = null;
      else {
        conv.push({ role: "assistant", content: reply.length ? reply : "ok" });
        turns++;
      }
    } else if (O.chat && x < 0.48) {
      const s = sampling();
      if (!stream && rand() < 0.3) Object.assign(s, { logprobs: true, top_logprobs: 2 });
      await validRequest("chat_system", "/v1/chat/completions", { messages: [{ role: "system", content: SYSTEM }, { role: "user", content: sentence(randInt(4, 30)) }], ...s }, stream);
    } else if (O.chat && x < 0.56) {
      await validRequest("chat_short", "/v1/chat/completions", { messages: [{ role: "user", content: `Tell me about the ${pick(WORDS)}.` }], ...sampling() }, stream);
    } else if (x < (O.chat ? 0.74 : 0.70)) {
      await validRequest("cmpl_prefix", "/v1/completions", { prompt: [...ID_PREFIX, ...randIds(randInt(1, 200))], return_token_ids: true, ...sampling() }, stream);
    } else if (x < (O.chat ? 0.80 : 0.82)) {
      if (O.chat) await validRequest("cmpl_text", "/v1/completions", { prompt: sentence(randInt(3, 60)), ...sampling() }, stream);
      else await validRequest("cmpl_ids", "/v1/completions", { prompt: randIds(randInt(1, 300)), return_token_ids: true, ...sampling() }, stream);
    } else if (x < 0.90) await cancelRequest();
    else if (x < 0.97) await disconnectRequest();
    else await badRequest();
  }
}

/* Runs the clients until stopAt, then waits up to the grace for the in-flight ones; the rest are
 * aborted and counted as hung. */
async function runPhase(name, seconds) {
  phase = name;
  const stopAt = performance.now() + seconds * 1000;
  log(`${name}: ${O.clients} clients for ${seconds} s`);
  const all = Promise.all(Array.from({ length: O.clients }, () => client(stopAt)));
  const untilStop = Math.max(0, stopAt - performance.now());
  let finished = false;
  all.then(() => (finished = true));
  await Promise.race([all, sleep(untilStop + O.graceS * 1000)]);
  if (!finished) {
    log(`${name}: ${inflight.size} requests still in flight ${O.graceS} s after the end: aborting them (counted as hung)`);
    hardStopped = true;
    hardStop.abort();
    for (const s of sockets) s.destroy();
    await Promise.race([all, sleep(30000)]);
    hardStop = new AbortController();
    hardStopped = false;
  }
}

// ---------------------------------------------------------------------------------------------
// observation
function parseMetrics(text) {
  const v = {};
  for (const line of text.split("\n")) {
    const m = /^deltaserve:([a-zA-Z_]+)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (!m || (m[2] && m[2].includes("le="))) continue;
    const lab = m[2] ? /(finished_reason|status)="([^"]*)"/.exec(m[2]) : null;
    v[lab ? `${m[1]}{${lab[1]}=${lab[2]}}` : m[1]] = Number(m[3]);
  }
  return v;
}
async function metrics() {
  try {
    const r = await fetchT(`${ROOT}/metrics`, {}, 15);
    return r.ok ? parseMetrics(await r.text()) : null;
  } catch {
    return null;
  }
}
async function health() {
  try {
    const r = await fetchT(`${ROOT}/health`, {}, 15);
    await r.text();
    return r.status;
  } catch {
    return 0;
  }
}
function procStatus() {
  if (!O.serverPid) return { alive: null, rss_mib: null, threads: null };
  try {
    const s = fs.readFileSync(`/proc/${O.serverPid}/status`, "utf8");
    const rss = /VmRSS:\s+(\d+) kB/.exec(s), th = /Threads:\s+(\d+)/.exec(s), st = /State:\s+(\S)/.exec(s);
    return { alive: !(st && st[1] === "Z"), rss_mib: rss ? Number(rss[1]) / 1024 : null, threads: th ? Number(th[1]) : null };
  } catch {
    return { alive: false, rss_mib: null, threads: null };
  }
}
const sh = (cmd, args) => new Promise((res) => execFile(cmd, args, { timeout: 15000 }, (e, out) => res(e ? null : String(out))));
let gpuName = null;
async function gpuMem() {
  const apps = await sh("nvidia-smi", ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]);
  if (apps === null) return { gpu_mib: null, gpu_device_used_mib: null };
  let mine = null;
  const others = [];
  for (const line of apps.split("\n")) {
    if (!line.trim()) continue;
    const [pid, mem] = line.split(",").map((x) => x.trim());
    if (Number(pid) === O.serverPid) mine = (mine || 0) + Number(mem);
    else others.push(`${pid}:${mem}`);
  }
  const dev = await sh("nvidia-smi", ["--query-gpu=memory.used,name", "--format=csv,noheader,nounits"]);
  let used = null;
  if (dev) {
    const [m, ...n] = dev.split("\n")[0].split(",");
    used = Number(m);
    gpuName = n.join(",").trim() || gpuName;
  }
  // in a PID namespace nvidia-smi may list the process under another PID: the other apps are
  // kept (and the device's total) so the growth can still be judged by eye
  return { gpu_mib: mine, gpu_device_used_mib: used, ...(mine === null && others.length ? { gpu_other_apps: others.join(" ") } : {}) };
}
const GAUGES = ["num_requests_running", "num_requests_waiting", "kv_pages_used", "kv_pages_cached", "kv_pages_capacity", "state_slots_used",
  "state_slots_capacity", "snapshot_slabs_used", "snapshot_slabs_capacity", "generation_tokens_total", "prompt_tokens_total",
  "prefix_cache_hits_total", "prefix_cache_queries_total", "prefix_cache_hit_tokens_total", "prefix_cache_evictions_total",
  "num_preemptions_total", "engine_requests_failed_total"];
const samples = [];
async function sample(label) {
  const [m, g, h] = await Promise.all([metrics(), gpuMem(), health()]);
  const p = procStatus();
  const s = { t_s: Math.round(nowS() * 10) / 10, label, phase, ...p, ...g, health: h, inflight: inflight.size };
  if (m) for (const k of GAUGES) if (k in m) s[k] = m[k];
  for (const k of ["sent", "completed_ok", "errors"]) s[k] = TALLY.warmup[k] + TALLY.soak[k];
  samples.push(s);
  return { s, m };
}
let sampling_on = false;
async function samplerLoop() {
  while (sampling_on) {
    const { s } = await sample("periodic");
    const f = (x) => (x === null || x === undefined ? "-" : Math.round(x));
    log(`${phase}: sent ${s.sent} ok ${s.completed_ok} errors ${s.errors}; running ${f(s.num_requests_running)} waiting ${f(s.num_requests_waiting)} ` +
      `kv ${f(s.kv_pages_used)}+${f(s.kv_pages_cached)}/${f(s.kv_pages_capacity)} slots ${f(s.state_slots_used)}/${f(s.state_slots_capacity)}; ` +
      `RSS ${f(s.rss_mib)} MiB GPU ${f(s.gpu_mib)} MiB; health ${s.health}`);
    for (let i = 0; i < O.sampleS * 4 && sampling_on; i++) await sleep(250);
  }
}
let healthChecks = 0, healthFailures = 0, health_on = false;
async function healthLoop() {
  while (health_on) {
    healthChecks++;
    if ((await health()) !== 200) healthFailures++;
    await sleep(1000);
  }
}
async function poll(fn, ceilingS, everyMs = 500) {
  const end = performance.now() + ceilingS * 1000;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (performance.now() > end) return null;
    await sleep(everyMs);
  }
}
const idle = (m) => m && m.num_requests_running === 0 && m.num_requests_waiting === 0;

// ---------------------------------------------------------------------------------------------
function summarize(t, wallS) {
  const f = (x) => (x === null ? null : Math.round(x * 10) / 10);
  const { e2e_ms, ttft_ms, ...rest } = t;
  return {
    ...rest,
    wall_s: f(wallS),
    e2e_ms_p50: f(percentile(e2e_ms, 50)), e2e_ms_p99: f(percentile(e2e_ms, 99)),
    ttft_ms_p50: f(percentile(ttft_ms, 50)), ttft_ms_p99: f(percentile(ttft_ms, 99)), ttft_samples: ttft_ms.length,
    output_tok_s: wallS > 0 ? f(t.completion_tokens / wallS) : null,
    requests_per_s: wallS > 0 ? Math.round((t.completed_ok / wallS) * 100) / 100 : null,
    cache_hit_rate_usage: t.prompt_tokens > 0 ? Math.round((t.cached_tokens / t.prompt_tokens) * 1000) / 1000 : null,
  };
}

async function main() {
  const ok = await poll(async () => (await health()) === 200, O.waitHealthS, 500);
  if (!ok) throw new Error(`server at ${ROOT} not healthy after ${O.waitHealthS} s`);
  const res = {
    kind: "soak", date: new Date().toISOString(), base_url: ROOT, server_pid: O.serverPid, ...O.meta,
    workload: {
      clients: O.clients, duration_s: O.durationS, warmup_s: O.warmupS, max_tokens: [O.maxTokensMin, O.maxTokensMax],
      system_prompt_chars: SYSTEM.length, id_prefix_tokens: O.idPrefix, conv_chars_cap: O.convChars, chat: O.chat, seed: O.seed,
      mix: O.chat ? "30% agent chat, 18% chat+system, 8% short chat, 18% completions id-prefix, 6% text completions, 10% cancels, 7% disconnects, 3% bad bodies"
        : "70% completions id-prefix, 12% completions ids, 8% cancels, 7% disconnects, 3% bad bodies",
    },
  };
  const write = () => fs.writeFileSync(O.out, JSON.stringify(res, null, 1) + "\n");
  sampling_on = true;
  const sampler = samplerLoop();
  await sample("start");

  // warm-up, then the post-warm-up baseline
  let w0 = performance.now();
  await runPhase("warmup", O.warmupS);
  res.warmup = summarize(TALLY.warmup, (performance.now() - w0) / 1000);
  const idle1 = await poll(async () => idle(await metrics()), O.idleCeilingS);
  await sleep(2000);
  const base = (await sample("baseline")).s;
  res.baseline = base;
  res.baseline_idle = !!idle1;
  write();

  // the soak
  health_on = true;
  const hl = healthLoop();
  const m0 = await metrics();
  w0 = performance.now();
  await runPhase("soak", O.durationS);
  const soakWall = (performance.now() - w0) / 1000;
  health_on = false;
  await hl;
  phase = "drain";
  res.soak = summarize(TALLY.soak, soakWall);

  // drain: idle, pools back, then the final samples
  const tIdle = performance.now();
  const idleM = await poll(async () => {
    const m = await metrics();
    return idle(m) ? m : null;
  }, O.idleCeilingS);
  const idleS = (performance.now() - tIdle) / 1000;
  log(`drain: ${idleM ? `idle after ${idleS.toFixed(1)} s` : `NOT idle after ${O.idleCeilingS} s`}`);
  await poll(async () => {
    const m = await metrics();
    return m && m.kv_pages_used === base.kv_pages_used && m.state_slots_used === base.state_slots_used;
  }, 60);
  await poll(async () => procStatus().threads <= (base.threads || 0) + 8, 30);
  await sleep(3000);
  sampling_on = false;
  await sampler;
  const fin = await sample("final");
  const end = fin.s, m1 = fin.m;
  // still serving
  let after = 0;
  try {
    const r = await fetchT(`${ROOT}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 4 }) }, 120);
    await r.text();
    after = r.status;
  } catch {
    after = 0;
  }
  const d = (k) => (m0 && m1 && k in m0 && k in m1 ? m1[k] - m0[k] : null);
  res.engine_delta = Object.fromEntries(["generation_tokens_total", "prompt_tokens_total", "prompt_tokens_computed_total", "engine_requests_finished_total",
    "engine_requests_cancelled_total", "engine_requests_failed_total", "num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
    "prefix_cache_hit_tokens_total", "prefix_cache_captures_total", "prefix_cache_capture_failures_total", "prefix_cache_evictions_total",
    "prefix_cache_restore_failures_total", "request_success_total{finished_reason=error}", "request_rejected_total{status=500}",
    "request_rejected_total{status=503}", "request_rejected_total{status=429}"].map((k) => [k, d(k)]));
  res.final = end;
  res.gpu = gpuName;
  res.samples = samples;
  const errors = TALLY.warmup.errors + TALLY.soak.errors;
  const rssGrowth = end.rss_mib !== null && base.rss_mib !== null ? Math.round(end.rss_mib - base.rss_mib) : null;
  const gpuGrowth = end.gpu_mib !== null && base.gpu_mib !== null ? Math.round(end.gpu_mib - base.gpu_mib) : null;
  const v = {
    errors,
    server_alive: end.alive === true,
    health_final: end.health,
    health_failures_during_soak: healthFailures,
    health_checks_during_soak: healthChecks,
    idle_after_s: idleM ? Math.round(idleS * 10) / 10 : null,
    pools_back: !!(idle(m1) && end.kv_pages_used === base.kv_pages_used && end.state_slots_used === base.state_slots_used &&
      end.kv_pages_cached + end.kv_pages_used <= end.kv_pages_capacity && end.snapshot_slabs_used <= end.snapshot_slabs_capacity),
    pools: { baseline: { kv_pages_used: base.kv_pages_used, kv_pages_cached: base.kv_pages_cached, state_slots_used: base.state_slots_used, snapshot_slabs_used: base.snapshot_slabs_used },
      final: { kv_pages_used: end.kv_pages_used, kv_pages_cached: end.kv_pages_cached, state_slots_used: end.state_slots_used, snapshot_slabs_used: end.snapshot_slabs_used } },
    engine_failed: d("engine_requests_failed_total"),
    request_after_soak: after,
    rss_baseline_mib: base.rss_mib === null ? null : Math.round(base.rss_mib),
    rss_final_mib: end.rss_mib === null ? null : Math.round(end.rss_mib),
    rss_max_mib: Math.round(Math.max(...samples.map((s) => s.rss_mib || 0))),
    rss_growth_mib: rssGrowth,
    rss_flat: rssGrowth !== null && rssGrowth <= 256,
    threads: [base.threads, end.threads],
    gpu_baseline_mib: base.gpu_mib,
    gpu_final_mib: end.gpu_mib,
    gpu_max_mib: samples.some((s) => s.gpu_mib !== null) ? Math.max(...samples.map((s) => s.gpu_mib || 0)) : null,
    gpu_growth_mib: gpuGrowth,
    gpu_flat: gpuGrowth === null ? null : Math.abs(gpuGrowth) <= 64,
    gpu_device_growth_mib: end.gpu_device_used_mib !== null && base.gpu_device_used_mib !== null ? end.gpu_device_used_mib - base.gpu_device_used_mib : null,
    /* reported, not judged: growth over the second half of the soak's samples (a leak keeps
     * growing there; a cache or buffer that fills up to its size does not) */
    ...secondHalfGrowth(samples.filter((x) => x.phase === "soak")),
  };
  v.pass = v.errors === 0 && v.server_alive && v.health_final === 200 && v.health_failures_during_soak === 0 && v.pools_back &&
    v.rss_flat && v.gpu_flat !== false && (v.engine_failed === 0 || v.engine_failed === null) && v.request_after_soak === 200;
  res.verdict = v;
  write();
  printTable(res);
  process.exit(v.pass ? 0 : 1);
}

function secondHalfGrowth(ss) {
  const h = ss.slice(Math.floor(ss.length / 2));
  const g = (k) => (h.length >= 2 && h[0][k] != null && h[h.length - 1][k] != null ? Math.round(h[h.length - 1][k] - h[0][k]) : null);
  return { rss_growth_second_half_mib: g("rss_mib"), gpu_growth_second_half_mib: g("gpu_mib") };
}

function printTable(res) {
  const v = res.verdict, s = res.soak, w = res.warmup;
  const f = (x, d = 0) => (x === null || x === undefined ? "-" : Number(x).toFixed(d));
  const kinds = { ...w.error_kinds };
  for (const [k, n] of Object.entries(s.error_kinds)) kinds[k] = (kinds[k] || 0) + n;
  const lines = [
    `soak ${res.mode || ""} ${res.commit ? res.commit.slice(0, 12) : ""} ${res.gpu || ""}: ${res.workload.clients} clients, ${f(s.wall_s)} s (+${f(w.wall_s)} s warm-up)`,
    `  requests  sent ${s.sent}, completed ok ${s.completed_ok}, streams ${s.streams}, cancels ${s.cancels}, disconnects ${s.disconnects}, bad ${s.bad} (rejected ${s.bad_rejected}), 429 ${s.rejected_429}`,
    `  statuses  ${JSON.stringify(s.statuses)}`,
    `  errors    ${v.errors} ${JSON.stringify(kinds)}${s.first_errors.length || w.first_errors.length ? ` first: ${[...w.first_errors, ...s.first_errors][0]}` : ""}`,
    `  latency   e2e p50 ${f(s.e2e_ms_p50)} p99 ${f(s.e2e_ms_p99)} ms; TTFT p50 ${f(s.ttft_ms_p50)} p99 ${f(s.ttft_ms_p99)} ms`,
    `  tokens    ${s.completion_tokens} out (${f(s.output_tok_s, 1)} tok/s, ${f(s.requests_per_s, 2)} req/s), prompt ${s.prompt_tokens}, cached ${s.cached_tokens} (${f(s.cache_hit_rate_usage, 3)})`,
    `  memory    RSS ${f(v.rss_baseline_mib)} -> ${f(v.rss_final_mib)} MiB (growth ${f(v.rss_growth_mib)}, max ${f(v.rss_max_mib)}) ${v.rss_growth_mib === null ? "n/a" : v.rss_flat ? "flat" : "GROWS"}; ` +
      `GPU ${f(v.gpu_baseline_mib)} -> ${f(v.gpu_final_mib)} MiB (growth ${f(v.gpu_growth_mib)}) ${v.gpu_flat === null ? "n/a" : v.gpu_flat ? "flat" : "GROWS"}` +
      (v.gpu_device_growth_mib === null || v.gpu_device_growth_mib === undefined ? "" : `, whole device ${f(v.gpu_device_growth_mib)} MiB`),
    `  pools     ${v.pools_back ? "back at baseline" : "NOT back"} ${JSON.stringify(v.pools.final)}; idle after ${f(v.idle_after_s, 1)} s; threads ${v.threads.join(" -> ")}`,
    `  server    alive ${v.server_alive}, /health ${v.health_final} (${v.health_failures_during_soak}/${v.health_checks_during_soak} failed during the soak), request after ${v.request_after_soak}, engine failed ${f(v.engine_failed)}`,
    `  verdict   ${v.pass ? "PASS" : "FAIL"}`,
  ];
  console.log(lines.join("\n"));
}

main().catch((e) => {
  console.error(`soak_load: ${e.stack || e.message}`);
  process.exit(2);
});
