// serve_load — drives a running `deltaserve serve` with the official OpenAI client and reports
// serving latency and throughput as JSON.
//
//   node scripts/bench/serve_load.mjs --base-url http://127.0.0.1:8000/v1 --out FILE.json
//        [--label cache_on] [--clients 8,32,64] [--requests-per-client 2]
//        [--prefix-tokens 12000] [--suffix-min 50] [--suffix-max 200] [--max-tokens 128]
//        [--vocab 151936] [--level-time-s 40] [--deadline-s 0] [--wait-health-s 300] [--seed 1]
//
// Workload (one run per server; run it once with prefix caching on and once off): a shared
// "system prompt" of --prefix-tokens random token ids, the same for every request of the run,
// followed by a unique suffix of suffix-min..suffix-max random ids; --max-tokens greedy tokens
// with ignore_eos, streamed (/v1/completions with a token-id prompt, so a random-weight model
// without a tokenizer works). For each concurrency level N, N closed-loop clients each send
// --requests-per-client requests one after another; a client sends no new request once the
// level has run --level-time-s seconds (the in-flight ones finish); no level starts once the
// run has taken --deadline-s seconds (0: no limit). The JSON is rewritten after every level, so
// a run killed from outside keeps the levels it finished.
//
// Per level: TTFT p50/p99 (send -> first chunk carrying tokens), inter-token latency p50/p99
// (gap between chunks, split evenly over the tokens a chunk carries), output tokens/s (all
// completion tokens over the level's wall time), cache hit rate from the responses
// (usage.prompt_tokens_details.cached_tokens / prompt_tokens) and from /metrics deltas
// (prefix_cache_hit_tokens_total / prompt_tokens_total, hits / queries). Prints one summary line
// per level on stderr and writes the JSON.
import fs from "node:fs";
import { pathToFileURL } from "node:url";
import OpenAI from "openai";

function parseArgs(argv) {
  const o = {
    baseUrl: "http://127.0.0.1:8000/v1", out: null, label: "run", clients: [8, 32, 64],
    requestsPerClient: 2, prefixTokens: 12000, suffixMin: 50, suffixMax: 200, maxTokens: 128,
    vocab: 151936, levelTimeS: 40, deadlineS: 0, waitHealthS: 300, seed: 1, model: null, timeoutS: 600,
  };
  const num = (k, v) => {
    const x = Number(v);
    if (!Number.isFinite(x)) throw new Error(`${k}: not a number: ${v}`);
    return x;
  };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i], v = argv[i + 1];
    if (k === "--help" || k === "-h") {
      console.log(fs.readFileSync(new URL(import.meta.url)).toString().split("\n").filter((l) => l.startsWith("//")).join("\n"));
      process.exit(0);
    }
    if (v === undefined) throw new Error(`${k} needs a value`);
    i++;
    switch (k) {
      case "--base-url": o.baseUrl = v.replace(/\/+$/, ""); break;
      case "--out": o.out = v; break;
      case "--label": o.label = v; break;
      case "--model": o.model = v; break;
      case "--clients": o.clients = v.split(",").map((x) => num(k, x)); break;
      case "--requests-per-client": o.requestsPerClient = num(k, v); break;
      case "--prefix-tokens": o.prefixTokens = num(k, v); break;
      case "--suffix-min": o.suffixMin = num(k, v); break;
      case "--suffix-max": o.suffixMax = num(k, v); break;
      case "--max-tokens": o.maxTokens = num(k, v); break;
      case "--vocab": o.vocab = num(k, v); break;
      case "--level-time-s": o.levelTimeS = num(k, v); break;
      case "--wait-health-s": o.waitHealthS = num(k, v); break;
      case "--deadline-s": o.deadlineS = num(k, v); break;
      case "--timeout-s": o.timeoutS = num(k, v); break;
      case "--seed": o.seed = num(k, v); break;
      default: throw new Error(`unknown flag ${k}`);
    }
  }
  if (!o.out) throw new Error("--out FILE.json is required");
  if (o.suffixMin < 1 || o.suffixMax < o.suffixMin) throw new Error("need 1 <= --suffix-min <= --suffix-max");
  return o;
}

// mulberry32: a small deterministic generator, so runs with the same seed send the same prompts.
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

export function percentile(values, p) {
  if (values.length === 0) return null;
  const v = [...values].sort((a, b) => a - b);
  const r = (p / 100) * (v.length - 1); // linear interpolation between closest ranks
  const lo = Math.floor(r), hi = Math.ceil(r);
  return v[lo] + (v[hi] - v[lo]) * (r - lo);
}

// Prometheus text -> { name: value } for the unlabelled-by-bucket series we need.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^deltaserve:([a-zA-Z_]+)(\{[^}]*\})?\s+(\S+)$/);
    if (!m || (m[2] && m[2].includes("le="))) continue;
    const key = m[2] && /finished_reason|status=/.test(m[2]) ? `${m[1]}${m[2]}` : m[1];
    out[key] = Number(m[3]);
  }
  return out;
}

async function fetchMetrics(root) {
  try {
    const r = await fetch(`${root}/metrics`);
    if (!r.ok) return null;
    return parseMetrics(await r.text());
  } catch {
    return null;
  }
}

async function waitHealth(root, seconds) {
  const end = Date.now() + seconds * 1000;
  let last = "";
  while (Date.now() < end) {
    try {
      const r = await fetch(`${root}/health`);
      if (r.status === 200) return;
      last = `status ${r.status}`;
    } catch (e) {
      last = e.message;
    }
    await new Promise((res) => setTimeout(res, 250));
  }
  throw new Error(`server at ${root} not healthy after ${seconds} s (${last})`);
}

// One streamed request; returns its timings.
async function oneRequest(client, model, prompt, maxTokens) {
  const t0 = performance.now();
  const rec = { ttft_ms: null, itl_ms: [], tokens: 0, prompt_tokens: prompt.length, cached_tokens: 0, error: null };
  let last = null;
  try {
    const stream = await client.completions.create({
      model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
      stream_options: { include_usage: true }, ignore_eos: true, return_token_ids: true,
    });
    for await (const chunk of stream) {
      const now = performance.now();
      const c = chunk.choices && chunk.choices[0];
      const k = c && Array.isArray(c.token_ids) ? c.token_ids.length : c && c.text ? 1 : 0;
      if (k > 0) {
        if (last === null) rec.ttft_ms = now - t0;
        else for (let j = 0; j < k; j++) rec.itl_ms.push((now - last) / k);
        last = now;
        rec.tokens += k;
      }
      if (chunk.usage) {
        rec.usage_completion_tokens = chunk.usage.completion_tokens;
        rec.prompt_tokens = chunk.usage.prompt_tokens ?? rec.prompt_tokens;
        rec.cached_tokens = chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
      }
    }
    if (rec.usage_completion_tokens !== undefined) rec.tokens = rec.usage_completion_tokens;
    if (rec.ttft_ms === null) rec.error = "no tokens streamed";
  } catch (e) {
    rec.error = String(e && e.message ? e.message : e);
  }
  rec.e2e_ms = performance.now() - t0;
  return rec;
}

async function runLevel(o, client, model, root, prefix, rand, n) {
  const m0 = await fetchMetrics(root);
  const t0 = performance.now();
  const deadline = t0 + o.levelTimeS * 1000;
  const recs = [];
  const client_loop = async () => {
    for (let r = 0; r < o.requestsPerClient; r++) {
      if (r > 0 && performance.now() > deadline) break;
      const len = o.suffixMin + Math.floor(rand() * (o.suffixMax - o.suffixMin + 1));
      const prompt = prefix.slice();
      for (let i = 0; i < len; i++) prompt.push(Math.floor(rand() * o.vocab));
      recs.push(await oneRequest(client, model, prompt, o.maxTokens));
    }
  };
  await Promise.all(Array.from({ length: n }, client_loop));
  const wall = (performance.now() - t0) / 1000;
  const m1 = await fetchMetrics(root);
  const ok = recs.filter((r) => !r.error);
  const ttft = ok.map((r) => r.ttft_ms), itl = ok.flatMap((r) => r.itl_ms);
  const toks = ok.reduce((s, r) => s + r.tokens, 0);
  const ptoks = ok.reduce((s, r) => s + r.prompt_tokens, 0);
  const ctoks = ok.reduce((s, r) => s + r.cached_tokens, 0);
  const d = (k) => (m0 && m1 && k in m0 && k in m1 ? m1[k] - m0[k] : null);
  const hitTok = d("prefix_cache_hit_tokens_total"), promptTok = d("prompt_tokens_total");
  const hits = d("prefix_cache_hits_total"), queries = d("prefix_cache_queries_total");
  return {
    clients: n,
    requests: recs.length,
    errors: recs.length - ok.length,
    first_error: recs.find((r) => r.error)?.error ?? null,
    duration_s: wall,
    ttft_ms_p50: percentile(ttft, 50),
    ttft_ms_p99: percentile(ttft, 99),
    itl_ms_p50: percentile(itl, 50),
    itl_ms_p99: percentile(itl, 99),
    e2e_ms_p50: percentile(ok.map((r) => r.e2e_ms), 50),
    output_tokens: toks,
    output_tok_s: wall > 0 ? toks / wall : null,
    prompt_tokens: ptoks,
    cached_tokens: ctoks,
    cache_hit_rate_usage: ptoks > 0 ? ctoks / ptoks : null,
    cache_hit_rate_metrics: hitTok !== null && promptTok ? hitTok / promptTok : null,
    prefix_hits_per_query: hits !== null && queries ? hits / queries : null,
    metrics_delta: {
      prompt_tokens_total: promptTok,
      prompt_tokens_computed_total: d("prompt_tokens_computed_total"),
      prefix_cache_queries_total: queries,
      prefix_cache_hits_total: hits,
      prefix_cache_hit_tokens_total: hitTok,
      prefix_cache_captures_total: d("prefix_cache_captures_total"),
      num_preemptions_total: d("num_preemptions_total"),
    },
    ttft_ms: ttft.map((x) => Math.round(x * 1000) / 1000),
  };
}

async function main() {
  const o = parseArgs(process.argv);
  const root = o.baseUrl.replace(/\/v1$/, "");
  await waitHealth(root, o.waitHealthS);
  const client = new OpenAI({ baseURL: o.baseUrl, apiKey: process.env.DS_API_KEY || "none", maxRetries: 0, timeout: o.timeoutS * 1000 });
  let model = o.model;
  if (!model) {
    const list = await client.models.list();
    model = list.data[0].id;
  }
  const rand = rng(o.seed);
  const prefix = Array.from({ length: o.prefixTokens }, () => Math.floor(rand() * o.vocab));
  const levels = [];
  const res = {
    label: o.label,
    base_url: o.baseUrl,
    model,
    date: new Date().toISOString(),
    workload: {
      prefix_tokens: o.prefixTokens, suffix_min: o.suffixMin, suffix_max: o.suffixMax,
      max_tokens: o.maxTokens, requests_per_client: o.requestsPerClient, level_time_s: o.levelTimeS,
      vocab: o.vocab, seed: o.seed, stream: true, ignore_eos: true, temperature: 0,
    },
    levels,
    skipped_levels: [],
  };
  const t0 = performance.now();
  for (const n of o.clients) {
    if (o.deadlineS > 0 && performance.now() - t0 > o.deadlineS * 1000) {
      res.skipped_levels.push(n);
      console.error(`serve_load ${o.label}: ${n} clients skipped (past --deadline-s ${o.deadlineS})`);
      continue;
    }
    const lv = await runLevel(o, client, model, root, prefix, rand, n);
    levels.push(lv);
    fs.writeFileSync(o.out, JSON.stringify(res, null, 2) + "\n");
    const f = (x, d = 1) => (x === null || x === undefined ? "-" : x.toFixed(d));
    console.error(
      `serve_load ${o.label}: ${n} clients, ${lv.requests} requests (${lv.errors} errors) in ${f(lv.duration_s)} s: ` +
        `TTFT p50 ${f(lv.ttft_ms_p50)} p99 ${f(lv.ttft_ms_p99)} ms, ITL p50 ${f(lv.itl_ms_p50, 2)} p99 ${f(lv.itl_ms_p99, 2)} ms, ` +
        `${f(lv.output_tok_s)} tok/s out, cache hit ${f(lv.cache_hit_rate_usage, 3)} (usage) ${f(lv.cache_hit_rate_metrics, 3)} (metrics)` +
        (lv.first_error ? `; first error: ${lv.first_error}` : ""),
    );
  }
  fs.writeFileSync(o.out, JSON.stringify(res, null, 2) + "\n");
  const errors = levels.reduce((s, l) => s + l.errors, 0);
  if (errors > 0) console.error(`serve_load ${o.label}: ${errors} requests failed`);
  process.exit(errors > 0 && levels.every((l) => l.errors === l.requests) ? 1 : 0);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e) => {
    console.error(`serve_load: ${e.message}`);
    process.exit(1);
  });
}
