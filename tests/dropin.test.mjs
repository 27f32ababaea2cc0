// deltaserve as a drop-in for vLLM users (issue: launch lines, metrics, HTTP surface):
// /metrics under --metrics-prefix vllm (vLLM's names, labels, units; promtool where installed),
// then the HTTP surface vLLM clients use. The official `openai` client where it applies.
import { spawnSync } from "node:child_process";
import OpenAI from "openai";
import {
  makeModel, startServer, killAllServers, watchdog, post, get, poll, test, failureCount, assert, eq, NAME,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "dropin.test.mjs");
const model = makeModel("ds-dropin-");
const hasPromtool = spawnSync("sh", ["-c", "command -v promtool"]).status === 0;

async function metricsText(srv) {
  const r = await fetch(`${srv.url}/metrics`);
  return r.text();
}
// the value of one sample, matched by name and a label subset
function sample(text, name, labels = {}) {
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const ls = Object.fromEntries([...(m[2] || "").matchAll(/([a-z_]+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => ls[k] === v)) return Number(m[3]);
  }
  return undefined;
}

let srv;
try {
  srv = await startServer(model.dir, ["--max-model-len", "1024", "--metrics-prefix", "vllm"]);
  const oa = new OpenAI({ apiKey: "x", baseURL: `${srv.url}/v1`, maxRetries: 0 });

  await test("metrics_vllm_names_and_units", async () => {
    const prompt = "The quick brown fox jumps over the lazy dog";
    const a = await oa.completions.create({ model: NAME, prompt, max_tokens: 4, ignore_eos: true, temperature: 0 });
    const b = await oa.completions.create({ model: NAME, prompt, max_tokens: 4, ignore_eos: true, temperature: 0 });
    const t = await metricsText(srv);
    assert(!/^deltaserve:/m.test(t), "no deltaserve: names under --metrics-prefix vllm");
    const L = { model_name: NAME, engine: "0" };
    // prefix-cache queries in tokens: every prompt token of both lookups
    const q = sample(t, "vllm:prefix_cache_queries_total", L);
    eq(q, a.usage.prompt_tokens + b.usage.prompt_tokens, "prefix_cache_queries_total counts prompt tokens");
    const cached = (b.usage.prompt_tokens_details || {}).cached_tokens || 0;
    eq(sample(t, "vllm:prefix_cache_hits_total", L), cached, "prefix_cache_hits_total counts cached tokens");
    eq(sample(t, "vllm:request_success_total", { ...L, finished_reason: "length" }), 2, "two length finishes");
    eq(sample(t, "vllm:request_prompt_tokens_count", L), 2);
    eq(sample(t, "vllm:request_prompt_tokens_sum", L), a.usage.prompt_tokens + b.usage.prompt_tokens);
    eq(sample(t, "vllm:request_generation_tokens_sum", L), 8);
    eq(sample(t, "vllm:request_params_max_tokens_sum", L), 8);
    eq(sample(t, "vllm:request_params_n_sum", L), 2);
    for (const h of ["request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
      "request_inference_time_seconds", "e2e_request_latency_seconds", "time_to_first_token_seconds"]) {
      eq(sample(t, `vllm:${h}_count`, L), 2, `${h} observed per request`);
      eq(sample(t, `vllm:${h}_bucket`, { ...L, le: "+Inf" }), 2, `${h} +Inf`);
    }
    // e2e covers queue + inference
    assert(sample(t, "vllm:e2e_request_latency_seconds_sum", L) + 1e-6 >=
      sample(t, "vllm:request_queue_time_seconds_sum", L) + sample(t, "vllm:request_inference_time_seconds_sum", L) - 0.05,
    "e2e >= queue + inference");
    eq(sample(t, "vllm:inter_token_latency_seconds_count", L), 6, "3 intervals per 4-token request");
    eq(sample(t, "vllm:time_per_output_token_seconds_count", L), 6);
    // every step fed at least one token: the iteration histogram's sum is the tokens fed
    const steps = sample(t, "vllm:iteration_tokens_total_count", L);
    assert(steps >= 2, `iteration_tokens_total_count ${steps}`);
    eq(sample(t, "vllm:iteration_tokens_total_bucket", { ...L, le: "1.0" }) >= 6, true, "decode steps of 1 token");
    assert(/^vllm:cache_config_info\{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="[0-9.]+",num_gpu_blocks="\d+"\} 1\.0$/m.test(t), "cache_config_info");
    eq(sample(t, "vllm:request_prompt_tokens_bucket", { ...L, le: "1000.0" }), 2, "1-2-5 bounds up to max_model_len");
    eq(sample(t, "vllm:request_prompt_tokens_bucket", { ...L, le: "2000.0" }), undefined);
    assert(sample(t, "vllm:kv_cache_usage_perc", L) >= 0, "kv_cache_usage_perc");
    eq(sample(t, "vllm:num_requests_running", L), 0);
    // deltaserve's own series keep their names under the prefix
    eq(sample(t, "vllm:prefix_cache_lookups_total", L), 2);
    assert(sample(t, "vllm:kv_pages_capacity", L) > 0, "kv_pages_capacity");
  });

  await test("metrics_promtool_check", async () => {
    if (!hasPromtool) {
      console.log("NOTE metrics_promtool_check: promtool not installed (scripts/setup.sh installs it); skipped");
      return;
    }
    const t = await metricsText(srv);
    const r = spawnSync("promtool", ["check", "metrics"], { input: t, encoding: "utf8" });
    const out = (r.stdout + r.stderr).split("\n").filter((l) => l.trim());
    // the ':' lint every vLLM name gets, and vLLM's own histogram named *_total
    const other = out.filter((l) => !/metric names should not contain ':'/.test(l) &&
      !/iteration_tokens_total non-counter metrics should not have "_total" suffix/.test(l));
    eq(other, [], "promtool findings");
    assert(r.status === 0 || r.status === 3, `promtool exit ${r.status}`);
  });
} finally {
  if (srv) await srv.stop().catch(() => {});
  model.cleanup();
  stopWatchdog();
  killAllServers();
}
process.exit(failureCount() ? 1 : 0);
