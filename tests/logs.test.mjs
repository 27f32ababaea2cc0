// The server's logs as vLLM users read them: one line per finished request (id, route, status,
// prompt / cached / generated tokens, TTFT, duration, finish reason) for a completion, a
// streamed chat, a 400 and a cancelled stream; --disable-log-requests; the periodic stats line
// under load and not while idle (--log-stats-interval, --disable-log-stats); --log-level.
// No timing assertions: waits poll with generous ceilings.
import { spawnSync } from "node:child_process";
import {
  BIN, makeModel, startServer, killAllServers, watchdog, post, poll, sleep, parseSSE, test, fail,
  failureCount, assert, eq,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "logs.test.mjs");
const model = makeModel("ds-logs-");
const LINE =
  /request id=(\S+) method=(\S+) route=(\S+) status=(\d+) prompt_tokens=(\d+) cached_tokens=(\d+) generated_tokens=(\d+) ttft_ms=(\S+) duration_ms=(\S+) finish=(\S+)/g;
const STATS =
  /Avg prompt throughput: ([\d.]+) tokens\/s, Avg generation throughput: ([\d.]+) tokens\/s, Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: ([\d.]+)%, Prefix cache hit rate: ([\d.]+)%/g;
const lines = (srv) =>
  [...srv.log.matchAll(LINE)].map((m) => ({
    id: m[1], method: m[2], route: m[3], status: +m[4], prompt: +m[5], cached: +m[6], generated: +m[7],
    ttft: m[8], duration: +m[9], finish: m[10],
  }));
const stats = (srv) => [...srv.log.matchAll(STATS)].map((m) => ({ prompt: +m[1], gen: +m[2], running: +m[3], waiting: +m[4], kv: +m[5], hit: +m[6] }));
// a clean exit on SIGTERM (the stats thread stopped before the engine), no sanitizer report
const stopClean = (srv, what) =>
  test(`logs_clean_exit_${what}`, async () => {
    const ex = await srv.stop();
    eq(ex.code, 0, `exit ${JSON.stringify(ex)}: ${srv.log.slice(-300)}`);
    assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(srv.log), `sanitizer report: ${srv.log.slice(-300)}`);
  });
const lineOf = (srv, pred, what) => poll(() => lines(srv).find(pred), what, 30000);

let srv;
try {
  srv = await startServer(model.dir, ["--max-model-len", "1024", "--log-stats-interval", "0.2"]);

  await test("logs_no_stats_while_idle_at_start", async () => {
    await sleep(800);
    eq(stats(srv).length, 0, "stats lines before any request");
  });

  await test("logs_request_completion", async () => {
    const r = await post(srv, "/v1/completions", { prompt: "The weather today", max_tokens: 5, ignore_eos: true });
    eq(r.status, 200, r.text.slice(0, 200));
    const l = await lineOf(srv, (l) => l.id === r.json.id, `the line of ${r.json.id}`);
    eq([l.method, l.route, l.status, l.prompt, l.cached, l.generated, l.finish],
      ["POST", "/v1/completions", 200, r.json.usage.prompt_tokens, 0, 5, "length"]);
    assert(Number(l.ttft) >= 0 && l.duration >= Number(l.ttft), `ttft ${l.ttft} duration ${l.duration}`);
    // the same prompt again: its cached share is logged as usage reports it
    const r2 = await post(srv, "/v1/completions", { prompt: "The weather today", max_tokens: 5, ignore_eos: true });
    const l2 = await lineOf(srv, (l) => l.id === r2.json.id, `the line of ${r2.json.id}`);
    eq(l2.cached, (r2.json.usage.prompt_tokens_details || {}).cached_tokens || 0, "cached tokens");
  });

  await test("logs_request_streamed_chat", async () => {
    const r = await post(srv, "/v1/chat/completions", {
      messages: [{ role: "user", content: "Hi there" }], max_tokens: 7, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    });
    eq(r.status, 200);
    const ev = parseSSE(r.text);
    const id = JSON.parse(r.text.split("\n\n")[0].slice(6)).id;
    const l = await lineOf(srv, (l) => l.id === id, `the line of ${id}`);
    eq([l.route, l.status, l.prompt, l.generated, l.finish], ["/v1/chat/completions", 200, ev.usage.prompt_tokens, 7, "length"]);
    assert(l.ttft !== "-", "ttft");
  });

  await test("logs_request_error_400", async () => {
    const before = lines(srv).length;
    const r = await post(srv, "/v1/completions", { prompt: "x", max_tokens: -3 });
    eq(r.status, 400, r.text.slice(0, 200));
    const l = await lineOf(srv, (l, i) => i >= before && l.status === 400, "the 400's line");
    eq([l.id, l.route, l.generated, l.ttft, l.finish], ["-", "/v1/completions", 0, "-", "-"]);
  });

  await test("logs_request_cancelled_stream", async () => {
    const ac = new AbortController();
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 900, ignore_eos: true, stream: true }), signal: ac.signal,
    });
    const reader = res.body.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    const id = JSON.parse(first.split("\n\n")[0].slice(6)).id;
    ac.abort();
    const l = await lineOf(srv, (l) => l.id === id, `the line of ${id}`);
    eq([l.status, l.finish], [200, "abort"]);
    assert(l.generated < 900, `generated ${l.generated}`);
  });

  await test("logs_health_metrics_not_logged", async () => {
    await fetch(`${srv.url}/health`);
    await fetch(`${srv.url}/metrics`);
    await sleep(200);
    assert(!lines(srv).some((l) => l.route === "/health" || l.route === "/metrics"), "a /health or /metrics line");
  });

  await test("logs_stats_under_load_then_quiet", async () => {
    let busy = true;
    const load = (async () => {
      while (busy) await Promise.all([0, 1, 2].map(() => post(srv, "/v1/completions", { prompt: "Tell me a story", max_tokens: 200, ignore_eos: true })));
    })();
    try {
      await poll(() => stats(srv).some((s) => s.gen > 0 && s.running > 0), "a stats line with running requests", 60000);
    } finally {
      busy = false;
      await load;
    }
    const s = stats(srv).find((s) => s.gen > 0 && s.running > 0);
    assert(s.kv >= 0 && s.kv <= 100 && s.hit >= 0 && s.hit <= 100, JSON.stringify(s));
    await sleep(1000); // the engine drains; one more (zero) line may follow
    const n = stats(srv).length;
    await sleep(1500);
    eq(stats(srv).length, n, "stats lines while idle");
  });
  await stopClean(srv, "stats");

  // --disable-log-requests, --disable-log-stats (vLLM's) and --log-level warning
  srv = await startServer(model.dir, ["--max-model-len", "1024", "--disable-log-requests", "--disable-log-stats", "--log-stats-interval", "0.1"]);
  await test("logs_disable_log_requests_and_stats", async () => {
    for (let i = 0; i < 3; i++) eq((await post(srv, "/v1/completions", { prompt: "Hello", max_tokens: 20, ignore_eos: true })).status, 200);
    eq((await post(srv, "/v1/completions", { prompt: "x", max_tokens: -3 })).status, 400);
    await sleep(500);
    eq(lines(srv).length, 0, "request lines");
    eq(stats(srv).length, 0, "stats lines");
    assert(!/accepted, no effect/.test(srv.log), "the flags are not no-ops any more");
  });
  await stopClean(srv, "disabled");

  srv = await startServer(model.dir, ["--max-model-len", "1024", "--log-level", "error", "--log-stats-interval", "0.1"]);
  await test("logs_level_error_hides_info", async () => {
    for (let i = 0; i < 3; i++) eq((await post(srv, "/v1/completions", { prompt: "Hello", max_tokens: 20, ignore_eos: true })).status, 200);
    await sleep(500);
    assert(!/deltaserve info:/.test(srv.log), `an info line: ${(/deltaserve info:.*/.exec(srv.log) || [""])[0]}`);
    eq(lines(srv).length + stats(srv).length, 0);
  });
  await stopClean(srv, "level_error");

  await test("logs_level_names", async () => {
    for (const lv of ["debug", "INFO", "warning", "warn", "critical"]) {
      const r = spawnSync(BIN, ["serve", "--model", model.dir, "--log-level", lv, "--help"], { encoding: "utf8" });
      eq(r.status, 0, `--log-level ${lv}: ${r.stderr}`);
    }
    const r = spawnSync(BIN, ["serve", "--model", model.dir, "--log-level=verbose"], { encoding: "utf8" });
    eq(r.status, 2);
    assert(/--log-level: expected debug, info, warning, error or critical, got 'verbose'/.test(r.stderr), r.stderr);
    const r2 = spawnSync(BIN, ["serve", "--model", model.dir, "--log-stats-interval", "0"], { encoding: "utf8" });
    eq(r2.status, 2, r2.stderr);
  });
} catch (e) {
  fail("logs", e.message);
}
stopWatchdog();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
