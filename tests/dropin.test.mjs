// deltaserve as a drop-in for vLLM users (issue: launch lines, metrics, HTTP surface):
// /metrics under --metrics-prefix vllm (vLLM's names, labels, units; promtool where installed),
// then the HTTP surface vLLM clients use. The official `openai` client where it applies.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import {
  BIN, makeModel, startServer, killAllServers, watchdog, post, get, poll, test, failureCount, assert, eq, NAME,
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
  srv = await startServer(model.dir, ["--max-model-len", "1024", "--metrics-prefix", "vllm", "--served-model-name", NAME, "tiny-alias"]);
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
    eq(sample(t, "vllm:request_max_num_generation_tokens_sum", L), 8, "each request's most");
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
    // the engine's snapshot settles after the last step
    await poll(async () => sample(await metricsText(srv), "vllm:num_requests_running", L) === 0, "running 0", 30000);
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
  await test("served_model_names", async () => {
    const list = await oa.models.list();
    eq(list.data.map((m) => m.id), [NAME, "tiny-alias"], "/v1/models lists every served name");
    const m = await oa.models.retrieve("tiny-alias");
    eq([m.id, m.object, m.max_model_len], ["tiny-alias", "model", 1024], "/v1/models/{id}");
    let err = null;
    try {
      await oa.models.retrieve("nope");
    } catch (e) {
      err = e;
    }
    eq(err && err.status, 404, "an unknown id is 404");
    // the alias is accepted; the first name is the one reported
    const c = await oa.completions.create({ model: "tiny-alias", prompt: "Hi", max_tokens: 1 });
    eq(c.model, NAME, "responses report the first name");
  });

  await test("cors_default_any_origin", async () => {
    const pre = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { Origin: "http://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type" },
    });
    eq(pre.status, 200, "preflight answered");
    eq(pre.headers.get("access-control-allow-origin"), "*");
    eq(pre.headers.get("access-control-allow-methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
    eq(pre.headers.get("access-control-allow-headers"), "authorization, content-type");
    eq(pre.headers.get("access-control-max-age"), "600");
    const r = await fetch(`${srv.url}/v1/models`, { headers: { Origin: "http://app.example" } });
    eq(r.headers.get("access-control-allow-origin"), "*", "a simple request carries the origin header");
    const s = await fetch(`${srv.url}/v1/completions`, {
      method: "POST", headers: { Origin: "http://app.example", "Content-Type": "application/json" },
      body: JSON.stringify({ prompt: "Hi", max_tokens: 2, stream: true }),
    });
    eq(s.headers.get("access-control-allow-origin"), "*", "a stream too");
    await s.text();
    const none = await fetch(`${srv.url}/v1/models`);
    eq(none.headers.get("access-control-allow-origin"), null, "no Origin, no CORS headers");
    // OPTIONS without the preflight headers is no preflight: the route's 405
    eq((await fetch(`${srv.url}/v1/models`, { method: "OPTIONS" })).status, 405);
  });

  await test("busy_port_fails_with_one_line", async () => {
    const r = spawnSync(BIN, ["serve", "--model", model.dir, "--port", String(srv.port), "--threads", "1"], { encoding: "utf8", timeout: 60000 });
    assert(r.status !== 0, `a second server on a busy port exited ${r.status}`);
    const lines = r.stderr.split("\n").filter((l) => l.trim());
    eq(lines, [`deltaserve serve: port ${srv.port} on 127.0.0.1 is in use (another server?): pick another with --port`]);
  });
  await test("completions_prompt_list", async () => {
    const prompts = ["Hello there", "The sea is", [9707, 11, 1879]];
    const body = { model: NAME, max_tokens: 4, ignore_eos: true, temperature: 1, seed: 7, n: 2 };
    const all = await oa.completions.create({ ...body, prompt: prompts, echo: true });
    eq(all.choices.length, 6, "prompts x n choices");
    eq(all.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5], "indexed prompt-major, as OpenAI does");
    let promptTokens = 0;
    for (let p = 0; p < prompts.length; p++) {
      // each prompt alone gives the same choices (seed + j for its j-th)
      const one = await oa.completions.create({ ...body, prompt: prompts[p], echo: true });
      promptTokens += one.usage.prompt_tokens;
      for (let j = 0; j < 2; j++) eq(all.choices[p * 2 + j].text, one.choices[j].text, `prompt ${p} choice ${j}`);
    }
    assert(all.choices[0].text.startsWith("Hello there") && all.choices[2].text.startsWith("The sea is"), "each choice echoes its prompt");
    eq(all.usage.prompt_tokens, promptTokens, "each prompt's tokens counted once");
    eq(all.usage.completion_tokens, 24);
    // vLLM's requests are one per prompt: n observed per prompt, their most generated each
    const mt = await metricsText(srv);
    const L = { model_name: NAME, engine: "0" };
    const nCount = sample(mt, "vllm:request_params_n_count", L);
    const mgCount = sample(mt, "vllm:request_max_num_generation_tokens_count", L);
    const before = { n: nCount, mg: mgCount };
    await oa.completions.create({ ...body, prompt: prompts });
    const mt2 = await metricsText(srv);
    eq(sample(mt2, "vllm:request_params_n_count", L) - before.n, 3, "n observed per prompt");
    eq(sample(mt2, "vllm:request_params_n_sum", L) - sample(mt, "vllm:request_params_n_sum", L), 6);
    await poll(async () => sample(await metricsText(srv), "vllm:request_max_num_generation_tokens_count", L) - before.mg === 3, "3 prompts' max generation observed", 10000);
    // streamed: every index gets its text and a finish
    const st = await oa.completions.create({ ...body, n: 1, prompt: prompts, stream: true });
    const seen = new Map();
    for await (const ch of st) for (const c of ch.choices) seen.set(c.index, (seen.get(c.index) || "") + c.text);
    eq([...seen.keys()].sort(), [0, 1, 2]);
    // refusals, one line each
    const bad = async (b, param) => {
      const r = await post(srv, "/v1/completions", { model: NAME, max_tokens: 1, ...b });
      eq([r.status, r.json && r.json.error && r.json.error.param], [400, param], JSON.stringify(b).slice(0, 80));
    };
    await bad({ prompt: Array(257).fill("x") }, "prompt");
    await bad({ prompt: Array(100).fill("x"), n: 3 }, "n");
    await bad({ prompt: ["a", ""] }, "prompt");
    await bad({ prompt: ["a", [1, -2]] }, "prompt");
    await bad({ prompt: ["a", "b"], response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } } }, "prompt");
  });

  await test("truncate_prompt_tokens", async () => {
    const text = "One two three four five six seven eight nine ten";
    const ids = (await post(srv, "/tokenize", { model: NAME, prompt: text, add_special_tokens: false })).json.tokens;
    assert(ids.length > 5, `${ids.length} prompt tokens`);
    const k = 4;
    const cut = await oa.completions.create({ model: NAME, prompt: text, max_tokens: 5, temperature: 0, truncate_prompt_tokens: k, echo: true });
    const ref = await oa.completions.create({ model: NAME, prompt: ids.slice(-k), max_tokens: 5, temperature: 0, echo: true });
    eq(cut.usage.prompt_tokens, k, "the prompt's last k tokens served");
    eq(cut.choices[0].text, ref.choices[0].text, "the same as sending the last k ids (echo: the kept prompt)");
    // longer than the prompt: nothing cut; -1: the model's length
    const all = await oa.completions.create({ model: NAME, prompt: text, max_tokens: 1, temperature: 0, truncate_prompt_tokens: 1000 });
    eq(all.usage.prompt_tokens, ids.length);
    const m1 = await oa.completions.create({ model: NAME, prompt: text, max_tokens: 1, temperature: 0, truncate_prompt_tokens: -1 });
    eq(m1.usage.prompt_tokens, ids.length);
    // chat: the rendered prompt's last k
    const c = await oa.chat.completions.create({ model: NAME, messages: [{ role: "user", content: text }], max_tokens: 1, truncate_prompt_tokens: 5 });
    eq(c.usage.prompt_tokens, 5, "chat prompt truncated");
    const r = await post(srv, "/v1/completions", { model: NAME, prompt: text, max_tokens: 1, truncate_prompt_tokens: 0 });
    eq([r.status, r.json.error.param], [400, "truncate_prompt_tokens"]);
  });

  await test("stream_continuous_usage_stats", async () => {
    for (const kind of ["chat", "completions"]) {
      const args = { model: NAME, max_tokens: 4, ignore_eos: true, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } };
      const st = kind === "chat"
        ? await oa.chat.completions.create({ ...args, messages: [{ role: "user", content: "Hi" }] })
        : await oa.completions.create({ ...args, prompt: "Hi there" });
      const chunks = [];
      for await (const ch of st) chunks.push(ch);
      const withChoices = chunks.filter((c) => c.choices.length);
      assert(withChoices.length >= 4, `${kind}: ${withChoices.length} chunks`);
      let last = -1;
      for (const c of withChoices) {
        assert(c.usage, `${kind}: a chunk without usage`);
        assert(c.usage.completion_tokens >= last, `${kind}: usage went back`);
        eq(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
        last = c.usage.completion_tokens;
      }
      eq(last, 4, `${kind}: the last chunk counts every token`);
      eq(chunks[chunks.length - 1].usage.completion_tokens, 4, `${kind}: the final usage chunk`);
      // without continuous_usage_stats only the final chunk carries usage
      const plain = kind === "chat"
        ? await oa.chat.completions.create({ ...args, stream_options: { include_usage: true }, messages: [{ role: "user", content: "Hi" }] })
        : await oa.completions.create({ ...args, stream_options: { include_usage: true }, prompt: "Hi there" });
      const pc = [];
      for await (const ch of plain) pc.push(ch);
      eq(pc.filter((c) => c.usage).length, 1, `${kind}: usage once`);
    }
  });

  await test("ready_line_only_once_serving", async () => {
    // the listening line comes after the model's lines, and /health is 200 by then
    const iLoad = srv.log.indexOf("deltaserve: loading ");
    const iModel = srv.log.indexOf("deltaserve: model ");
    const iListen = srv.log.indexOf("deltaserve: listening on ");
    assert(iLoad >= 0 && iModel > iLoad && iListen > iModel, `order of the start-up lines: ${srv.log.slice(0, 600)}`);
    // a model that fails to load: no listening line, one error line, exit 1
    const bad = fs.mkdtempSync(path.join(os.tmpdir(), "ds-dropin-bad-"));
    fs.copyFileSync(path.join(model.dir, "config.json"), path.join(bad, "config.json"));
    const r = spawnSync(BIN, ["serve", bad, "--port", "0", "--threads", "1"], { encoding: "utf8", timeout: 60000 });
    fs.rmSync(bad, { recursive: true, force: true });
    eq(r.status, 1, r.stderr);
    assert(!/listening on/.test(r.stderr), `a listening line before a failed load: ${r.stderr}`);
    assert(/no model\.safetensors/.test(r.stderr), r.stderr);
  });

  await test("ipv6_and_cors_restricted", async () => {
    const p = spawn(BIN, ["serve", model.dir, "--host", "::1", "--port", "0", "--threads", "1", "--served-model-name", NAME,
      "--allowed-origins", '["http://ok.example"]', "--allowed-methods", '["POST"]', "--allowed-headers", '["Authorization"]',
      "--allow-credentials"], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    p.stderr.on("data", (d) => (log += d));
    try {
      const port = await poll(() => {
        const m = /listening on http:\/\/\[::1\]:(\d+)/.exec(log);
        return m && Number(m[1]);
      }, "the IPv6 listening line", 60000);
      const url = `http://[::1]:${port}`;
      const c = new OpenAI({ apiKey: "x", baseURL: `${url}/v1`, maxRetries: 0 });
      const r = await c.completions.create({ model: NAME, prompt: "Hi", max_tokens: 2, ignore_eos: true });
      eq(r.usage.completion_tokens, 2, "served over IPv6");
      const pre = (headers) => fetch(`${url}/v1/completions`, { method: "OPTIONS", headers: { "Access-Control-Request-Method": "POST", ...headers } });
      const ok = await pre({ Origin: "http://ok.example", "Access-Control-Request-Headers": "authorization, content-type" });
      eq(ok.status, 200);
      eq(ok.headers.get("access-control-allow-origin"), "http://ok.example", "the origin echoed");
      eq(ok.headers.get("access-control-allow-credentials"), "true");
      eq(ok.headers.get("access-control-allow-methods"), "POST");
      eq(ok.headers.get("vary"), "Origin");
      const badOrigin = await pre({ Origin: "http://evil.example" });
      eq([badOrigin.status, await badOrigin.text(), badOrigin.headers.get("access-control-allow-origin")], [400, "Disallowed CORS origin", null]);
      const badMethod = await fetch(`${url}/v1/completions`, { method: "OPTIONS", headers: { Origin: "http://ok.example", "Access-Control-Request-Method": "DELETE" } });
      eq([badMethod.status, await badMethod.text()], [400, "Disallowed CORS method"]);
      const badHeader = await pre({ Origin: "http://ok.example", "Access-Control-Request-Headers": "x-secret" });
      eq([badHeader.status, await badHeader.text()], [400, "Disallowed CORS headers"]);
      const other = await fetch(`${url}/v1/models`, { headers: { Origin: "http://evil.example" } });
      eq(other.headers.get("access-control-allow-origin"), null, "a disallowed origin gets no CORS headers");
      // a bad list is refused at start with one line
      const r2 = spawnSync(BIN, ["serve", model.dir, "--port", "0", "--allowed-origins", "*"], { encoding: "utf8", timeout: 30000 });
      eq(r2.status, 2);
      assert(/--allowed-origins: expected a JSON list of strings/.test(r2.stderr), r2.stderr);
    } finally {
      p.kill("SIGTERM");
      await poll(() => p.exitCode !== null || p.signalCode !== null, "the IPv6 server to exit", 30000).catch(() => p.kill("SIGKILL"));
    }
    eq(p.exitCode, 0, `the IPv6 server's exit: ${log.slice(-300)}`);
    assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(log), `sanitizer report: ${log.slice(-400)}`);
  });
  await test("cors_empty_list_allows_none", async () => {
    const s2 = await startServer(model.dir, ["--allowed-origins", "[]"]);
    try {
      const r = await fetch(`${s2.url}/v1/completions`, { method: "OPTIONS", headers: { Origin: "http://a.example", "Access-Control-Request-Method": "POST" } });
      eq([r.status, await r.text()], [400, "Disallowed CORS origin"]);
      const g = await fetch(`${s2.url}/v1/models`, { headers: { Origin: "http://a.example" } });
      eq(g.headers.get("access-control-allow-origin"), null);
    } finally {
      const ex = await s2.stop();
      eq(ex.code, 0);
    }
  });

  await test("dropin_clean_exit", async () => {
    const ex = await srv.stop();
    eq(ex.code, 0, `exit ${JSON.stringify(ex)}: ${srv.log.slice(-300)}`);
    assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(srv.log), `sanitizer report: ${srv.log.slice(-400)}`);
  });
} finally {
  if (srv) await srv.stop().catch(() => {});
  model.cleanup();
  stopWatchdog();
  killAllServers();
}
process.exit(failureCount() ? 1 : 0);
