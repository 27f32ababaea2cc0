// Tenant isolation of the prefix cache through `cache_salt`, against the real server.
//
// A request reports usage.prompt_tokens_details.cached_tokens. A salted request must never
// report cached tokens that came from another salt's entries, nor from the unsalted namespace,
// and the unsalted namespace never sees salted entries. Each "must be cold" request is the first
// of its namespace for its prompt, so it must report cached_tokens == 0, and — checked from the
// server side — /metrics must show no prefix-cache hit for it and every prompt token computed
// (deltaserve:prompt_tokens_computed_total grows by prompt_tokens).
//
// Timing side channel: a request whose prompt is cached under another salt must do exactly the
// work of a cold request, so that its latency cannot tell. The test asserts the cause, not the
// clock: the /metrics work counters (prompt tokens computed, prefix-cache lookups, hits, hit
// tokens, captures, capture and restore failures, preemptions, tokens generated) grow by the
// same amounts for "salt B after salt A cached the prompt" as for the first request of that
// prompt in any namespace. It also measures (without asserting) the time to first token of
// (a) cold salted, (b) salt B after salt A, (c) salt A hit, and prints medians and spreads
// (DS_SALT_TIMING_REPS repetitions of DS_SALT_TIMING_TOKENS-token prompts, 10 of 500 by default;
// the figures go to DS_RELIABILITY_OUT).
//
// The positive check ("salt A then salt A reports cached_tokens > 0") is active only when the
// server reports a working prefix cache in /metrics: deltaserve:prefix_cache_queries_total > 0
// after the first requests. Until then it prints a NOTE and the isolation checks still hold.
import fs from "node:fs";
import {
  makeModel, startServer, killAllServers, watchdog, post, metrics, test, pass, fail, failureCount, assert, eq, waitIdle, NAME,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "isolation.test.mjs");
const model = makeModel("ds-isolation-");
let srv;
try {
  // 64 snapshot slabs: every namespace of this file keeps its checkpoint (no eviction between a
  // first request and its repeat)
  srv = await startServer(model.dir, ["--max-model-len", "1024", "--snapshot-slabs", "64"]);
} catch (e) {
  fail("isolation_server_start", e.message);
  killAllServers();
  process.exit(1);
}
pass("isolation_server_start");

const nonce = `${process.pid}-${Date.now() % 100000}`;
const LONG = "The tide keeps its own ledger of every stone it has moved along the shore. ".repeat(10);
const chatMsgs = (tag) => [
  { role: "system", content: `${LONG} (${nonce} ${tag})` },
  { role: "user", content: "Summarise the ledger in one line." },
  { role: "assistant", content: "It records each moved stone." },
  { role: "user", content: "And then?" },
];
const idsPrompt = (tag) => Array.from({ length: 300 }, (_, i) => 200 + ((i * 131 + tag * 7) % 90000));

const V = (m, k) => m.vals[`deltaserve:${k}`] || 0;
const log = [];
let cacheLive = false;

/* Runs one request alone and returns its usage and the /metrics deltas it caused. */
async function run(kind, tag, salt, { stream = false } = {}) {
  await waitIdle(srv);
  const before = await metrics(srv);
  const body = kind === "chat" ? { messages: chatMsgs(tag), max_tokens: 2, temperature: 0 } : { prompt: idsPrompt(tag), max_tokens: 2, temperature: 0 };
  if (salt !== undefined) body.cache_salt = salt;
  if (stream) Object.assign(body, { stream: true, stream_options: { include_usage: true } });
  const r = await post(srv, kind === "chat" ? "/v1/chat/completions" : "/v1/completions", body);
  eq(r.status, 200, `${kind} salt=${JSON.stringify(salt)}: ${r.text.slice(0, 200)}`);
  let usage;
  if (stream) {
    for (const e of r.text.split("\n\n")) {
      if (!e.startsWith("data: {")) continue;
      const j = JSON.parse(e.slice(6));
      if (j.usage) usage = j.usage;
    }
  } else usage = r.json.usage;
  assert(usage && usage.prompt_tokens_details && Number.isInteger(usage.prompt_tokens_details.cached_tokens), "usage.prompt_tokens_details.cached_tokens present");
  await waitIdle(srv);
  const after = await metrics(srv);
  const d = (k) => V(after, k) - V(before, k);
  const out = { cached: usage.prompt_tokens_details.cached_tokens, prompt: usage.prompt_tokens, hits: d("prefix_cache_hits_total"), hitTokens: d("prefix_cache_hit_tokens_total"), queries: d("prefix_cache_queries_total"), computed: d("prompt_tokens_computed_total") };
  // the rest of the engine's work for this request (compared by the timing-side-channel test)
  out.work = { promptTokens: d("prompt_tokens_total"), generated: d("generation_tokens_total"), captures: d("prefix_cache_captures_total"), captureFailures: d("prefix_cache_capture_failures_total"), restoreFailures: d("prefix_cache_restore_failures_total"), preemptions: d("num_preemptions_total"), evictions: d("prefix_cache_evictions_total") };
  if (out.queries > 0) cacheLive = true;
  log.push(`${kind}#${tag} salt=${JSON.stringify(salt)}${stream ? " stream" : ""}: ${JSON.stringify(out)}`);
  return out;
}

/* The request was the first of its namespace for this prompt: nothing may come from a cache. */
function cold(o, what) {
  eq(o.cached, 0, `${what}: cached_tokens`);
  eq(o.hits, 0, `${what}: prefix_cache_hits_total grew`);
  eq(o.hitTokens, 0, `${what}: prefix_cache_hit_tokens_total grew`);
  eq(o.computed, o.prompt, `${what}: every prompt token computed (prompt_tokens_computed_total)`);
}
/* A repeat in the same namespace: once the prefix cache is live it must hit. */
function warm(o, what) {
  assert(o.cached >= 0 && o.cached <= o.prompt, `${what}: 0 <= cached_tokens <= prompt_tokens`);
  if (!cacheLive) return;
  assert(o.cached > 0, `${what}: a repeat in the same namespace reports cached_tokens > 0 (${JSON.stringify(o)})`);
  eq(o.hitTokens, o.cached, `${what}: prefix_cache_hit_tokens_total grows by cached_tokens`);
  eq(o.computed, o.prompt - o.cached, `${what}: computed tokens == prompt_tokens - cached_tokens`);
}

for (const kind of ["chat", "cmpl"]) {
  await test(`isolation_salts_${kind}`, async () => {
    const tag = kind === "chat" ? 1 : 2;
    cold(await run(kind, tag, "tenant-A"), "A first");
    warm(await run(kind, tag, "tenant-A"), "A repeat");
    cold(await run(kind, tag, "tenant-B"), "B after A");
    warm(await run(kind, tag, "tenant-B", { stream: true }), "B repeat (stream)");
    cold(await run(kind, tag, undefined), "unsalted after A and B");
    warm(await run(kind, tag, undefined), "unsalted repeat");
    cold(await run(kind, tag, "tenant-C", { stream: true }), "C (stream) after A, B, unsalted");
    // near-miss salts are different namespaces
    for (const s of ["tenant-a", "tenant-A ", " tenant-A", "tenant-A\n", "tenant-", "tenant-AA", "é", "e\u0301", "😀"]) cold(await run(kind, tag, s), `salt ${JSON.stringify(s)}`);
    warm(await run(kind, tag, "tenant-A"), "A again after the others");
  });
}

await test("isolation_unsalted_does_not_see_salted", async () => {
  cold(await run("chat", 3, "only-salted"), "salted first");
  warm(await run("chat", 3, "only-salted"), "salted repeat");
  cold(await run("chat", 3, undefined), "unsalted after salted");
  cold(await run("cmpl", 4, undefined), "unsalted first (ids)");
  cold(await run("cmpl", 4, "S"), "salted after unsalted (ids)");
});

await test("isolation_empty_salt", async () => {
  // "" is either refused or means the unsalted namespace; it never reaches another salt's entries
  const r = await post(srv, "/v1/completions", { prompt: idsPrompt(5), max_tokens: 1, cache_salt: "" });
  if (r.status === 400) {
    assert(r.json && r.json.error && r.json.error.param === "cache_salt", "400 names cache_salt");
    return;
  }
  eq(r.status, 200, "empty salt");
  cold(await run("cmpl", 5, "X"), "salt X after an empty salt");
});

await test("isolation_concurrent_fresh_salts", async () => {
  // warm one namespace, then 32 fresh salts at once with the same prompt: all must be cold
  await run("cmpl", 6, "warm");
  await run("cmpl", 6, "warm");
  const reqs = [];
  for (let i = 0; i < 32; i++) {
    const salt = i % 4 === 3 ? "warm" : `fresh-${i}`;
    reqs.push(post(srv, "/v1/completions", { prompt: idsPrompt(6), max_tokens: 2, temperature: 0, cache_salt: salt, ...(i % 2 ? { stream: true, stream_options: { include_usage: true } } : {}) }).then((r) => [salt, i, r]));
  }
  for (const [salt, i, r] of await Promise.all(reqs)) {
    eq(r.status, 200, `request ${i}`);
    let u = r.json && r.json.usage;
    if (!u) for (const e of r.text.split("\n\n")) if (e.startsWith("data: {")) { const j = JSON.parse(e.slice(6)); if (j.usage) u = j.usage; }
    assert(u, `usage of request ${i}`);
    if (salt.startsWith("fresh")) eq(u.prompt_tokens_details.cached_tokens, 0, `fresh salt ${salt} reports cached tokens`);
    else assert(u.prompt_tokens_details.cached_tokens <= u.prompt_tokens, "warm salt cached <= prompt");
  }
});

/* The work counters that must not depend on another namespace's cache (evictions may: they
 * depend on the cache's fill, and are printed only). */
const workOf = (o) => ({ cached: o.cached, prompt: o.prompt, computed: o.computed, queries: o.queries, hits: o.hits, hitTokens: o.hitTokens, promptTokens: o.work.promptTokens, generated: o.work.generated, captures: o.work.captures, captureFailures: o.work.captureFailures, restoreFailures: o.work.restoreFailures, preemptions: o.work.preemptions });

await test("isolation_cross_salt_same_work", async () => {
  // the same prompt: first in any namespace (X), then cached under A, then B
  for (const [kind, tag, stream] of [["cmpl", 7, false], ["chat", 8, false], ["cmpl", 9, true]]) {
    const x = await run(kind, tag, `work-X-${tag}`, { stream });
    cold(x, `${kind}#${tag} X (first anywhere)`);
    cold(await run(kind, tag, `work-A-${tag}`, { stream }), `${kind}#${tag} A after X`);
    warm(await run(kind, tag, `work-A-${tag}`, { stream }), `${kind}#${tag} A repeat`);
    const b = await run(kind, tag, `work-B-${tag}`, { stream });
    cold(b, `${kind}#${tag} B after A`);
    eq(workOf(b), workOf(x), `${kind}#${tag}${stream ? " stream" : ""}: work of salt B after salt A cached the prompt vs the first request of the prompt`);
    if (cacheLive) assert(x.work.captures > 0, `${kind}#${tag}: a cold request captures a checkpoint once the cache is live`);
  }
});

/* Time to first token of one streamed completion (ms), with its usage; no assertion on it. */
async function ttft(prompt, salt) {
  const body = { prompt, max_tokens: 2, temperature: 0, cache_salt: salt, stream: true, stream_options: { include_usage: true } };
  const t0 = performance.now();
  const resp = await fetch(`${srv.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (resp.status !== 200) throw new Error(`timing request: status ${resp.status}: ${(await resp.text()).slice(0, 200)}`);
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let text = "", first = null;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    if (first === null && /"text"/.test(text)) first = performance.now() - t0;
  }
  let usage = null;
  for (const e of text.split("\n\n")) if (e.startsWith("data: {")) { const j = JSON.parse(e.slice(6)); if (j.usage) usage = j.usage; }
  assert(first !== null && usage, "timing request: a token and usage");
  return { ms: first, cached: usage.prompt_tokens_details.cached_tokens, prompt: usage.prompt_tokens };
}
const stats = (a) => {
  const v = [...a].sort((p, q) => p - q);
  const q = (f) => v[Math.min(v.length - 1, Math.floor(f * (v.length - 1) + 0.5))];
  return { n: v.length, median: q(0.5), p25: q(0.25), p75: q(0.75), min: v[0], max: v[v.length - 1] };
};
let timing = null;
await test("isolation_salt_timing_measured", async () => {
  // per repetition fresh prompts P_i, Q_i (DS_SALT_TIMING_TOKENS token ids, 500 by default):
  // (a) salt a-i on P_i, the first request of P_i anywhere; (b) salt b-i on P_i, now cached
  // under a-i; (a) again: salt q-i on Q_i, cold, after (b) so that (a) is sampled on both sides
  // of (b) (an order effect shows as a difference between the two); (c) salt a-i on P_i, a hit.
  // Only the cached_tokens of each are asserted; times are reported.
  const reps = Number(process.env.DS_SALT_TIMING_REPS || 10);
  const len = Math.min(1000, Number(process.env.DS_SALT_TIMING_TOKENS || 500));
  const T = { a: [], b: [], c: [], a_before: [], a_after: [] };
  const P = (i) => Array.from({ length: len }, (_, k) => 500 + ((k * 211 + (i + 1000) * 7919 + 17) % 120000));
  await ttft(P(-1), "timing-warmup");
  for (let i = 0; i < reps; i++) {
    const p = P(i), tag = `${nonce}-${i}`;
    await waitIdle(srv);
    const a = await ttft(p, `a-${tag}`);
    await waitIdle(srv);
    const b = await ttft(p, `b-${tag}`);
    await waitIdle(srv);
    const a2 = await ttft(P(i + 100000), `q-${tag}`);
    await waitIdle(srv);
    const c = await ttft(p, `a-${tag}`);
    eq([a.cached, b.cached, a2.cached], [0, 0, 0], `rep ${i}: cached_tokens of (a) cold, (b) salt B after salt A, (a) cold after (b)`);
    if (cacheLive) assert(c.cached > 0, `rep ${i}: (c) salt A repeat reports cached tokens`);
    T.a.push(a.ms, a2.ms), T.a_before.push(a.ms), T.a_after.push(a2.ms), T.b.push(b.ms), T.c.push(c.ms);
  }
  // paired: (b) minus the mean of the cold requests on either side of it
  const diff = T.b.map((x, i) => x - (T.a_before[i] + T.a_after[i]) / 2);
  timing = { reps, prompt_tokens: len, a: stats(T.a), a_before: stats(T.a_before), a_after: stats(T.a_after), b: stats(T.b), c: stats(T.c), b_minus_a: stats(diff), raw: T };
  const f = (x) => `median ${x.median.toFixed(2)} ms (IQR ${x.p25.toFixed(2)}–${x.p75.toFixed(2)}, min ${x.min.toFixed(2)}, max ${x.max.toFixed(2)})`;
  console.log(`NOTE isolation timing (${reps} reps, ${len}-token prompts, TTFT measured by the client, not asserted): (a) cold salted ${f(timing.a)}; (b) salt B after salt A cached it ${f(timing.b)}; (c) salt A hit ${f(timing.c)}; paired (b) minus the mean of the cold requests around it: ${f(timing.b_minus_a)}`);
});

await test("isolation_prefix_cache_guard", async () => {
  if (!cacheLive) {
    console.log("NOTE isolation: deltaserve:prefix_cache_queries_total stayed 0 — the prefix cache is not live yet; the positive 'A then A reports cached_tokens > 0' checks were skipped, the isolation checks ran");
    return;
  }
  const m = await metrics(srv);
  assert(V(m, "prefix_cache_hits_total") > 0, "hits counted once the cache is live");
  console.log("NOTE isolation: prefix cache live (deltaserve:prefix_cache_queries_total > 0): positive checks active");
});

for (const l of log) console.log(`NOTE ${l}`);
await test("isolation_clean_exit", async () => eq((await srv.stop()).code, 0, "exit status"));
if (process.env.DS_RELIABILITY_OUT) fs.writeFileSync(process.env.DS_RELIABILITY_OUT, JSON.stringify({ cacheLive, timing, log }, null, 1));
stopWatchdog();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
