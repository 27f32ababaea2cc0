// Server-level fault walk: every request-time fault site of src/ (found by grepping the source for
// fault_hit("...")) is failed on purpose inside the real `deltaserve serve`, through the test-only
// environment variable DS_FAULT="SITE:N[:sticky]" (src/cli/cmd_serve.c arms it just before
// /health turns 200 and logs "fault fired at SITE" to stderr on each fire, and
// "faults fired: F of H hits" on exit).
//
// For each site: a run with the fault on its 1st hit tells whether the mix reaches the site and
// how many hits it makes (H); then the fault is put on further hits (the middle, the last one;
// "*" walks more) and on the 1st hit sticky (every later hit fails too). Each run starts a fresh server, sends a
// fixed mix (chat, completions with token ids and text, streaming, shared prefixes captured and
// then restored, salted requests, enough distinct prefixes to evict to the host tier, concurrent
// phases) and checks:
//   - every request ends in either the exact response of a fault-free baseline run (greedy:
//     same token ids / text, same finish_reason and completion_tokens), or an explicit error
//     (HTTP 4xx/5xx with the OpenAI error JSON, or an SSE error event) — never a hang (a
//     generous per-request ceiling) nor a dropped connection;
//   - the server never dies; afterwards (polled) nothing runs or waits, no KV page or state slot
//     is held by a request, cache holdings stay within their pools, /health is 200, and a fresh
//     request completes exactly (non-sticky runs; sticky runs accept an explicit error);
//   - SIGTERM exits 0, and the stderr log shows the fault fired (the run counts as injected).
// No assertion is on wall-clock time. DS_FAULTS_SITES=a,b limits the walk (debugging);
// DS_RELIABILITY_OUT=file.json dumps the tallies.
import fs from "node:fs";
import path from "node:path";
import {
  makeModel, startServer, killAllServers, watchdog, post, metrics, healthy, isOpenAIError, parseSSE,
  test, pass, fail, failureCount, assert, eq, poll, waitIdle,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(Number(process.env.DS_FAULTS_WATCHDOG_MS || 290000), "faults.test.mjs");
const REQ_CEILING_MS = 60000;
const SERVER_ARGS = ["--max-model-len", "1024", "--snapshot-interval", "64", "--snapshot-slabs", "6", "--host-cache-gib", "0.002", "--kv-cache-tokens", "2048", "--shutdown-grace", "2"];

// ---- the fault sites, from the source ----
function listSites() {
  const sites = new Set();
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.c$/.test(e.name) && !p.endsWith(path.join("base", "fault.c")))
        for (const m of fs.readFileSync(p, "utf8").matchAll(/fault_hit\("([A-Za-z0-9_]+)"\)/g)) sites.add(m[1]);
    }
  };
  walk("src");
  return [...sites].sort();
}
// "*" walks the hits of every site together (the n-th request-time fault_hit of any site)
let SITES = [...listSites(), "*"];
if (process.env.DS_FAULTS_SITES) SITES = process.env.DS_FAULTS_SITES.split(",");

// ---- the request mix ----
const SYSTEM = "The lighthouse keeper writes the weather into a blue book every evening. ".repeat(8);
const ids = (tag, n) => Array.from({ length: n }, (_, i) => 300 + ((i * 97 + tag * 13) % 40000));
const SHARED_IDS = ids(1, 200);
const chat = (q, extra = {}) => ({ route: "/v1/chat/completions", body: { messages: [{ role: "system", content: SYSTEM }, { role: "user", content: q }], max_tokens: 6, temperature: 0, ...extra } });
const cmplIds = (prompt, extra = {}) => ({ route: "/v1/completions", body: { prompt, max_tokens: 6, temperature: 0, return_token_ids: true, ...extra } });
const cmplText = (prompt, extra = {}) => ({ route: "/v1/completions", body: { prompt, max_tokens: 6, temperature: 0, return_token_ids: true, ...extra } });
const STREAM = { stream: true, stream_options: { include_usage: true } };
/* Phases run one after another; the requests of a phase run at the same time. */
const PHASES = [
  // 1: first sight of the shared prefixes (captures), one at a time
  [chat("What colour is the book?")],
  [cmplIds([...SHARED_IDS, 5, 6])],
  [chat("Who writes in it?", { cache_salt: "tenant-A" })],
  // 2: restores of those prefixes, concurrent with fresh work, streamed and not
  [
    chat("What colour is the book?"),
    chat("When does he write?", STREAM),
    cmplIds([...SHARED_IDS, 5, 6], STREAM),
    cmplIds([...SHARED_IDS, 7]),
    chat("Who writes in it?", { cache_salt: "tenant-A", ...STREAM }),
    chat("Who writes in it?", { cache_salt: "tenant-B" }),
    cmplText("Once upon a time the sea was quiet and the ships stayed home."),
    cmplIds(ids(9, 40), STREAM),
  ],
  // 3: more distinct prefixes than snapshot slabs (evictions, host tier), one at a time
  ...[2, 3, 4, 5, 6, 7, 8].map((t) => [cmplIds(ids(t, 150))]),
  // 4: back to the first prefixes (restores, possibly from the host tier), concurrent
  [
    cmplIds([...SHARED_IDS, 5, 6]),
    cmplIds(ids(2, 150), STREAM),
    chat("What colour is the book?", STREAM),
    cmplIds(ids(3, 150)),
    chat("Who writes in it?", { cache_salt: "tenant-A" }),
  ],
];
const AFTER = cmplIds([...SHARED_IDS, 11]); // a fresh request once the run is over

/* Sends one request; returns {kind: "ok", result} | {kind: "error", status, message} |
 * {kind: "problem", why}. `result` is what must match the baseline. */
async function send(srv, { route, body }) {
  const ac = new AbortController();
  const t = setTimeout(() => ac.abort(), REQ_CEILING_MS);
  const r = await post(srv, route, body, {}, { signal: ac.signal });
  clearTimeout(t);
  if (r.status === 0) return { kind: "problem", why: ac.signal.aborted ? `no answer within ${REQ_CEILING_MS / 1000} s (hang)` : `connection failed (${r.err})` };
  if (r.status !== 200) {
    if (r.status >= 400 && isOpenAIError(r)) return { kind: "error", status: r.status, message: r.json.error.message };
    return { kind: "problem", why: `status ${r.status} without an OpenAI error: ${r.text.slice(0, 120)}` };
  }
  if (body.stream) {
    const s = parseSSE(r.text);
    if (s.bad) return { kind: "problem", why: s.bad };
    if (s.error) {
      if (typeof s.error.message !== "string" || !s.error.message) return { kind: "problem", why: `SSE error event without a message: ${JSON.stringify(s.error)}` };
      return { kind: "error", status: "sse", message: s.error.message };
    }
    if (!s.done) return { kind: "problem", why: `stream without [DONE] or an error event (${r.text.length} bytes)` };
    if (!s.finish || !s.usage) return { kind: "problem", why: "stream without finish_reason or usage" };
    return { kind: "ok", result: { content: s.content, ids: s.tokenIds.length ? s.tokenIds : undefined, finish: s.finish, n: s.usage.completion_tokens } };
  }
  const j = r.json;
  if (!j || !Array.isArray(j.choices) || j.choices.length !== 1 || !j.usage) return { kind: "problem", why: `malformed 200: ${r.text.slice(0, 120)}` };
  const c = j.choices[0];
  const u = j.usage;
  if (!(u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens >= 0 && u.prompt_tokens_details.cached_tokens <= u.prompt_tokens)) return { kind: "problem", why: `bad usage ${JSON.stringify(u)}` };
  return { kind: "ok", result: { content: c.message ? c.message.content : c.text, ids: c.token_ids || undefined, finish: c.finish_reason, n: u.completion_tokens } };
}

const V = (m, k) => m.vals[`deltaserve:${k}`];

/* One server run with DS_FAULT = spec (null: the baseline). */
async function runOnce(model, spec, baseline) {
  const out = { spec, ok: 0, errors: 0, errorStatuses: {}, problems: [], fired: 0, hits: null, results: [], crashed: false, exitCode: null };
  const problem = (w) => out.problems.length < 20 && out.problems.push(w);
  if (spec) process.env.DS_FAULT = spec;
  else delete process.env.DS_FAULT;
  let srv;
  try {
    srv = await startServer(model.dir, SERVER_ARGS);
  } finally {
    delete process.env.DS_FAULT;
  }
  const check = (i, res, req) => {
    if (res.kind === "problem") return problem(`request ${i} (${req.route}${req.body.stream ? " stream" : ""}): ${res.why}`);
    if (res.kind === "error") {
      out.errors++;
      out.errorStatuses[res.status] = (out.errorStatuses[res.status] || 0) + 1;
      if (!baseline) problem(`baseline request ${i} failed: ${res.status} ${res.message}`);
      return;
    }
    out.ok++;
    if (baseline && baseline.results[i] && JSON.stringify(res.result) !== JSON.stringify(baseline.results[i]))
      problem(`request ${i} (${req.route}${req.body.stream ? " stream" : ""}) differs from the baseline: ${JSON.stringify(res.result)} vs ${JSON.stringify(baseline.results[i])}`);
    out.results[i] = res.result;
  };
  let i = 0;
  for (const phase of PHASES) {
    const first = i;
    const got = await Promise.all(phase.map((req) => send(srv, req)));
    got.forEach((res, k) => check(first + k, res, phase[k]));
    i += phase.length;
    if (srv.exited) break;
  }
  if (srv.exited) {
    out.crashed = true;
    problem(`the server died: ${JSON.stringify(srv.exited)}: ${srv.log.split("\n").slice(-4).join(" | ")}`);
    return out;
  }
  // afterwards: idle, pools back, healthy, a fresh request, clean exit
  try {
    await waitIdle(srv, 60000);
  } catch (e) {
    problem(e.message);
  }
  let m;
  await poll(async () => {
    m = await metrics(srv);
    return V(m, "kv_pages_used") === 0 && V(m, "state_slots_used") === 0;
  }, "pools back", 30000).catch(() => {});
  out.pools = { kv_pages_used: V(m, "kv_pages_used"), kv_pages_cached: V(m, "kv_pages_cached"), kv_pages_total: V(m, "kv_pages_capacity"), state_slots_used: V(m, "state_slots_used"), snapshot_slabs_used: V(m, "snapshot_slabs_used"), snapshot_slabs_total: V(m, "snapshot_slabs_capacity") };
  out.engine = { failed: V(m, "engine_requests_failed_total"), captures: V(m, "prefix_cache_captures_total"), captureFailures: V(m, "prefix_cache_capture_failures_total"), hits: V(m, "prefix_cache_hits_total"), restoreFailures: V(m, "prefix_cache_restore_failures_total"), evictions: V(m, "prefix_cache_evictions_total") };
  const p = out.pools;
  if (p.kv_pages_used !== 0) problem(`kv_pages_used ${p.kv_pages_used} after the run (baseline 0)`);
  if (p.state_slots_used !== 0) problem(`state_slots_used ${p.state_slots_used} after the run (baseline 0)`);
  if (!(p.kv_pages_cached >= 0 && p.kv_pages_cached + p.kv_pages_used <= p.kv_pages_total)) problem(`kv_pages_cached ${p.kv_pages_cached} outside the pool`);
  if (!(p.snapshot_slabs_used >= 0 && p.snapshot_slabs_used <= p.snapshot_slabs_total)) problem(`snapshot_slabs_used ${p.snapshot_slabs_used} outside the pool`);
  if (!(await healthy(srv))) problem("/health is not 200 after the run");
  const sticky = spec && /:sticky$/.test(spec);
  // a non-sticky fault that has not fired yet may fire on this request: an explicit error is
  // then the right answer
  const firedBefore = /^deltaserve: fault fired at /m.test(srv.log);
  const after = await send(srv, AFTER);
  if (after.kind === "problem") problem(`the request after the run: ${after.why}`);
  else if (after.kind === "error") {
    out.errors++;
    if (!sticky && firedBefore) problem(`the request after the run failed although the fault was not sticky and had fired: ${after.status} ${after.message}`);
  } else {
    out.ok++;
    if (baseline && JSON.stringify(after.result) !== JSON.stringify(baseline.after)) problem(`the request after the run differs from the baseline: ${JSON.stringify(after.result)} vs ${JSON.stringify(baseline.after)}`);
    out.after = after.result;
  }
  const ex = await srv.stop().catch((e) => ({ code: null, sig: e.message }));
  out.exitCode = ex.code;
  if (ex.code !== 0) {
    out.crashed = ex.sig !== null && ex.sig !== undefined;
    problem(`exit status ${ex.code} (signal ${ex.sig}) on SIGTERM: ${srv.log.split("\n").slice(-3).join(" | ")}`);
  }
  out.fired = (srv.log.match(/^deltaserve: fault fired at /gm) || []).length;
  const fm = /^deltaserve: faults fired: (\d+) of (\d+) hits$/m.exec(srv.log);
  if (spec && !fm) problem("no 'faults fired' line on exit");
  if (fm) {
    out.fireCount = Number(fm[1]);
    out.hits = Number(fm[2]);
  }
  return out;
}

const model = makeModel("ds-faults-");
const T = { runs: 0, injected: 0, survived: 0, fires: 0, unreached: [], clientBlamed: [], perSite: {}, problems: [] };
let baseline;

await test("faults_baseline", async () => {
  baseline = await runOnce(model, null, null);
  assert(baseline.problems.length === 0, baseline.problems.join(" || "));
  eq(baseline.errors, 0, "errors in the fault-free run");
  const e = baseline.engine;
  console.log(`NOTE faults baseline: ${baseline.ok} requests complete; prefix cache captures ${e.captures}, hits ${e.hits}, evictions ${e.evictions}; pools ${JSON.stringify(baseline.pools)}`);
  assert(e.captures > 0 && e.hits > 0, "the mix captures and restores prefix-cache checkpoints");
});
if (!baseline || baseline.problems.length) {
  stopWatchdog();
  killAllServers();
  model.cleanup();
  process.exit(1);
}

async function site(s) {
  const st = (T.perSite[s] = { hits: 0, runs: [] });
  const one = async (n, sticky) => {
    const spec = `${s}:${n}${sticky ? ":sticky" : ""}`;
    const r = await runOnce(model, spec, baseline);
    T.runs++;
    const fired = r.fireCount > 0;
    if (fired) {
      T.injected++;
      T.fires += r.fireCount;
      if (!r.problems.length) T.survived++;
    }
    st.runs.push({ spec, fired: r.fireCount || 0, ok: r.ok, errors: r.errors, errorStatuses: r.errorStatuses, problems: r.problems.length });
    for (const p of r.problems) T.problems.length < 60 && T.problems.push(`${spec}: ${p}`);
    // an injected out-of-memory is the server's fault, not the client's: note 4xx answers
    if (Object.keys(r.errorStatuses).some((k) => /^4/.test(k)) && !T.clientBlamed.includes(s)) T.clientBlamed.push(s);
    if (fired && r.fired === 0) T.problems.push(`${spec}: fired ${r.fireCount} times but no 'fault fired at' line`);
    return r;
  };
  const first = await one(1, false);
  st.hits = first.hits || 0;
  if (!first.fireCount) {
    T.unreached.push(s);
    return;
  }
  // under AddressSanitizer (slower; LeakSanitizer checks every exit for leaks) a shorter walk
  const H = st.hits;
  // (DS_FAULTS_FULL=1 adds N = 2 for every site)
  const picks = process.env.DS_ASAN ? [Math.ceil(H / 2)] : s === "*" ? [2, Math.ceil(H / 8), Math.ceil(H / 4), Math.ceil(H / 2), Math.ceil((3 * H) / 4), H] : [...(process.env.DS_FAULTS_FULL ? [2] : []), Math.ceil(H / 2), H];
  const ns = [...new Set(picks)].filter((n) => n >= 2 && n <= H);
  for (const n of ns) await one(n, false);
  await one(1, true);
}

await test("faults_walk", async () => {
  // two sites at a time (each run is mostly a single-threaded server start-up)
  const queue = [...SITES];
  const worker = async () => {
    while (queue.length) await site(queue.shift());
  };
  await Promise.all([worker(), worker()]);
  for (const s of SITES) {
    const st = T.perSite[s];
    console.log(`NOTE faults ${s}: ${st.hits} hits in the mix; ` + st.runs.map((r) => `${r.spec.slice(s.length + 1)} fired ${r.fired} -> ok ${r.ok}, errors ${r.errors}${Object.keys(r.errorStatuses).length ? " " + JSON.stringify(r.errorStatuses) : ""}${r.problems ? `, PROBLEMS ${r.problems}` : ""}`).join("; "));
  }
  console.log(`NOTE faults: ${SITES.length} sites, ${T.runs} fault runs; faults injected in ${T.injected} runs (${T.fires} fires), survived ${T.survived}; unreached by the mix: ${T.unreached.join(", ") || "none"}`);
  if (T.clientBlamed.length) console.log(`NOTE faults: an injected fault was answered with a 4xx (client error) at: ${T.clientBlamed.join(", ")} — a server-side failure would better be a 5xx`);
  for (const p of T.problems) console.log(`  fault problem: ${p}`);
  assert(T.problems.length === 0, `${T.problems.length} problems; first: ${T.problems[0]}`);
  eq(T.survived, T.injected, "runs with an injected fault that survived");
});

await test("faults_sites_reached", async () => {
  // the sites the serving path must reach with this mix (the host tier, tokenizer and prefix
  // cache included); a site missing here means the mix or the server changed
  const must = ["kv_pages_alloc", "state_pool_slot_alloc", "request_init", "engine_submit", "tokenizer_encode", "checkpoint_pages", "prefix_cache_node"];
  for (const s of must) if (SITES.includes(s)) assert(!T.unreached.includes(s), `site ${s} not reached by the mix`);
});

if (process.env.DS_RELIABILITY_OUT) fs.writeFileSync(process.env.DS_RELIABILITY_OUT, JSON.stringify({ sites: SITES, ...T, baseline: { engine: baseline.engine, pools: baseline.pools } }, null, 1));
stopWatchdog();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
