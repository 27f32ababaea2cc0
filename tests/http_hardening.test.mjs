// http_hardening — the HTTP connection layer against hostile and careless clients (issue 47):
// the key and the size limit decided from the head before any body byte is read, /metrics
// behind the key on request, the error JSON for framing errors, abandoned HTTP/1.0 requests
// cancelled, a bounded shutdown, and service kept under thousands of slow connections.
// Loopback only; every wait is an event with a generous ceiling, never a speed assertion.
// Run: DS_BUILD=build node tests/http_hardening.test.mjs
import net from "node:net";
import {
  makeModel, startServer, killAllServers, watchdog, test, assert, eq, poll, sleep, get, post,
  rawSocket, parseRawResponse, metrics, healthy, failureCount,
} from "./lib/server_harness.mjs";

const KEY = "sk-hardening";
const AUTH = { Authorization: `Bearer ${KEY}` };
const CHAT = "/v1/chat/completions";
const M = [{ role: "user", content: "hi" }];

/* A metric's value (the keyed /metrics). */
async function counter(srv, name) {
  const r = await get(srv, "/metrics", AUTH);
  const m = new RegExp(`^${name.replace(/[:]/g, "[:]")}(\\{[^}]*\\})? (\\S+)$`, "m").exec(r.text);
  return m ? Number(m[2]) : 0;
}

/* n connections from the given local addresses (round robin), each sending the start of a
 * request head; x.closed turns true when the server closes one. */
async function openSlow(port, n, addrs) {
  const socks = [];
  const ready = [];
  for (let i = 0; i < n; i++) {
    const x = { closed: false };
    x.s = net.connect({ port, host: "127.0.0.1", localAddress: addrs[i % addrs.length] });
    x.s.on("error", () => (x.closed = true));
    x.s.on("close", () => (x.closed = true));
    x.s.on("data", () => {});
    ready.push(new Promise((r) => { x.s.on("connect", () => { x.s.write("GET /health HTTP/1.1\r\nX-Slow: "); r(); }); x.s.on("close", r); }));
    socks.push(x);
  }
  await Promise.all(ready);
  return socks;
}

const stopWatchdog = watchdog(300000, "http_hardening");
const model = makeModel("ds-http-");
let srv;
try {
  srv = await startServer(model.dir, ["--api-key", KEY, "--max-request-bytes", "65536", "--metrics-require-api-key"]);

  // ---- the key and the size limit from the head: the answer comes before any body byte ----
  // Each request announces a 31 MB body and sends none of it: the server must answer from the
  // head alone (a server that waits for the body answers nothing until the ceiling).
  const head = (extra) => `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 31000000\r\n${extra}\r\n`;
  const cases = [
    ["no key", head(""), 401],
    ["no key, Expect: 100-continue", head("Expect: 100-continue\r\n"), 401],
    ["wrong key", head("Authorization: Bearer nope\r\n"), 401],
    ["key, body over the limit", head(`Authorization: Bearer ${KEY}\r\n`), 413],
    ["key, body over the limit, Expect: 100-continue", head(`Authorization: Bearer ${KEY}\r\nExpect: 100-continue\r\n`), 413],
  ];
  for (const [name, h, want] of cases)
    await test(`head_decides_before_body (${name})`, async () => {
      const r = await rawSocket(srv.port, [h], { holdMs: 15000 });
      const p = parseRawResponse(r.data);
      assert(p, `no answer before any body byte was sent (got ${JSON.stringify(r.data.toString("latin1").slice(0, 80))})`);
      eq(p.status, want, "status");
      eq(p.interim, 0, "no 100 Continue for a refused request");
      assert(p.json && p.json.error && p.json.error.message, "the OpenAI error JSON");
    });

  // ---- /metrics behind the key (--metrics-require-api-key) ----
  await test("metrics_require_api_key", async () => {
    eq((await get(srv, "/metrics")).status, 401, "/metrics without the key");
    eq((await get(srv, "/metrics", { Authorization: "Bearer nope" })).status, 401, "/metrics with a wrong key");
    const ok = await get(srv, "/metrics", AUTH);
    eq(ok.status, 200, "/metrics with the key");
    assert(/deltaserve:num_requests_running/.test(ok.text), "the metrics text");
    eq((await get(srv, "/health")).status, 200, "/health stays open");
  });

  // ---- framing errors: the OpenAI error JSON, one response, the connection closed ----
  const body = JSON.stringify({ prompt: "hi", max_tokens: 1 });
  const post1 = (extra) => `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n${extra}\r\n${body}`;
  const framing = [
    ["Content-Length not a number", post1("Content-Length: abc\r\n"), 400],
    ["Content-Length negative", post1("Content-Length: -1\r\n"), 400],
    ["Content-Length over 2^63", post1("Content-Length: 99999999999999999999999\r\n"), 413],
    ["Content-Length with Transfer-Encoding", post1(`Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n`), 400],
    ["unknown Transfer-Encoding", post1("Transfer-Encoding: gzip\r\n"), 400],
    ["header line without a colon", "GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400],
    ["malformed request line", "GET /health\r\n\r\n", 400],
    ["HTTP/9.9", "GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 505],
    ["10000 header lines", `GET /health HTTP/1.1\r\nHost: x\r\n${"X-A: 1\r\n".repeat(10000)}\r\n`, 431],
  ];
  for (const [name, raw, want] of framing)
    await test(`framing_error_json (${name})`, async () => {
      const r = await rawSocket(srv.port, [raw], { holdMs: 15000 });
      const p = parseRawResponse(r.data);
      assert(p, `no answer (${JSON.stringify(r.data.toString("latin1").slice(0, 80))})`);
      eq(p.status, want, "status");
      assert(p.json && p.json.error && p.json.error.message, `the OpenAI error JSON, got ${JSON.stringify(p.text.slice(0, 80))}`);
      eq((r.data.toString("latin1").match(/HTTP\/1\.[01] \d{3}/g) || []).length, 1, "one response");
    });

  // ---- an abandoned HTTP/1.0 request is cancelled (no 1xx probe exists for HTTP/1.0) ----
  await test("http10_abandoned_request_cancelled", async () => {
    const before = await counter(srv, "deltaserve:engine_requests_cancelled_total");
    const b = JSON.stringify({ prompt: [1, 2, 3], max_tokens: 6000, ignore_eos: true });
    const s = net.connect(srv.port, "127.0.0.1", () =>
      s.write(`POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`));
    s.on("error", () => {});
    await poll(async () => (await counter(srv, "deltaserve:num_requests_running")) > 0, "the request to run", 30000);
    s.destroy(); // the client goes away while the request runs
    await poll(async () => (await counter(srv, "deltaserve:num_requests_running")) === 0, "the request to end", 120000);
    const after = await counter(srv, "deltaserve:engine_requests_cancelled_total");
    assert(after > before, `the engine cancelled the request (${before} -> ${after}); it ran to its end instead`);
  });

  // ---- thousands of slow connections: /health and a real request are still served ----
  await test("slow_connections_keep_service", async () => {
    const N = 2000, ADDRS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    const socks = await openSlow(srv.port, N, ADDRS);
    try {
      const t = setInterval(() => { for (const x of socks) if (!x.closed) x.s.write("a"); }, 1000);
      try {
        await sleep(2500); // a few slow header bytes each
        const open = socks.filter((x) => !x.closed).length;
        assert(open >= N * 0.95, `the server dropped slow connections early: ${open} of ${N} open`);
        eq((await get(srv, "/health")).status, 200, `/health with ${open} slow connections held`);
        const r = await post(srv, CHAT, { messages: M, max_tokens: 8 }, AUTH);
        eq(r.status, 200, `a completion with ${open} slow connections held`);
        assert(r.json && r.json.choices && r.json.choices.length === 1, "the completion's body");
        console.log(`NOTE ${open} slow connections held; /health 200 and a completion served`);
      } finally {
        clearInterval(t);
      }
    } finally {
      for (const x of socks) x.s.destroy();
    }
    await poll(async () => (await get(srv, "/health")).status === 200, "/health after the slow connections", 30000);
  });

  // one address holds at most its share; the others are still served
  await test("slow_connections_per_address_limit", async () => {
    const N = 1100;
    const socks = await openSlow(srv.port, N, ["127.0.0.6"]);
    try {
      await poll(() => socks.filter((x) => x.closed).length >= N - 1024, "the connections over the per-address limit to be refused", 30000);
      eq((await get(srv, "/health")).status, 200, "/health from another address");
    } finally {
      for (const x of socks) x.s.destroy();
    }
  });

  // ---- SIGTERM with streaming clients that stopped reading: bounded by the grace ----
  await test("shutdown_bounded_with_stuck_readers", async () => {
    const GRACE = 1;
    // short engine steps: the prefill of the long prompts below ends at the step after SIGTERM
    const s2 = await startServer(model.dir, ["--shutdown-grace", String(GRACE), "--max-num-batched-tokens", "256"]);
    const stuck = [];
    try {
      // two streaming clients that never read; each stream's first chunks echo a prompt of
      // 16,000 tokens of 128 spaces (id 56940) three times (n: 3), some 6 MB, more than the
      // socket buffers take: the server's sends block at once
      const body = JSON.stringify({ prompt: new Array(16000).fill(56940), echo: true, max_tokens: 4000, ignore_eos: true, stream: true, n: 3 });
      for (let i = 0; i < 2; i++) {
        const c = net.connect(s2.port, "127.0.0.1", () =>
          c.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`));
        c.on("error", () => {});
        c.pause(); // never reads
        stuck.push(c);
      }
      await poll(async () => {
        const r = await get(s2, "/metrics");
        const m = /^deltaserve:num_requests_running(?:\{[^}]*\})? (\S+)$/m.exec(r.text);
        return m && Number(m[1]) > 0;
      }, "the streams to run", 60000);
      await sleep(1000);
      const t0 = Date.now();
      s2.p.kill("SIGTERM");
      const ceiling = (GRACE + 15) * 1000;
      const ex = await poll(() => s2.exited, "the server to exit", ceiling).catch(() => null);
      const took = (Date.now() - t0) / 1000;
      assert(ex, `still running ${ceiling / 1000} s after SIGTERM (--shutdown-grace ${GRACE})`);
      eq(ex.code, 0, "exit status");
      console.log(`NOTE SIGTERM with 2 stuck streaming readers: exited in ${took.toFixed(1)} s (--shutdown-grace ${GRACE})`);
    } finally {
      for (const c of stuck) c.destroy();
      if (!s2.exited) s2.p.kill("SIGKILL");
    }
  });
} catch (e) {
  console.log(`FAIL http_hardening: ${e && e.message ? e.message : e}`);
} finally {
  if (srv) await srv.stop().catch(() => {});
  killAllServers();
  model.cleanup();
  stopWatchdog();
}
process.exit(failureCount() ? 1 : 0);
