// amplify — requests whose cost in server memory is many times their size on the wire: a short
// non-streamed request asking for n choices with top_logprobs (the response), and a large body
// of small JSON values (the parse). Memory is read from /proc/<pid>/status: VmHWM (the peak)
// and VmRSS. The bounds are a small constant times the bytes the request or response holds, plus
// a little slack for allocator granularity; the amplifying code paths exceed them many times.
// Under AddressSanitizer (DS_ASAN=1) freed memory sits in ASan's quarantine, so the memory
// bounds are not checked there; the requests still run and their answers are checked.
import fs from "node:fs";
import { makeModel, startServer, post, test, assert, eq, watchdog, killAllServers, failureCount, NAME } from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(150000, "amplify.test.mjs");
const ASAN = !!process.env.DS_ASAN;
const MiB = 1 << 20;

function mem(srv) {
  const s = fs.readFileSync(`/proc/${srv.pid}/status`, "utf8");
  return { hwm: Number(/VmHWM:\s+(\d+) kB/.exec(s)[1]) * 1024, rss: Number(/VmRSS:\s+(\d+) kB/.exec(s)[1]) * 1024 };
}
const mb = (x) => (x / MiB).toFixed(1);
const user = (content) => [{ role: "user", content }];

const model = makeModel("ds-amplify-");
const srv = await startServer(model.dir);

try {
  // ---- responses: n x max_tokens x top_logprobs is capped, the cap is in the message
  await test("amplify_logprob_cap_stated", async () => {
    const r = await post(srv, "/v1/chat/completions", { model: NAME, messages: user("hi"), n: 8, max_tokens: 8000, logprobs: true, top_logprobs: 20 });
    eq(r.status, 400, "status");
    const msg = r.json && r.json.error && r.json.error.message;
    assert(/1048576/.test(msg) && /8 x 8000 x 20/.test(msg), `the cap and the product in the message: ${msg}`);
    // max_tokens left out: the rest of the context counts
    const c = await post(srv, "/v1/completions", { model: NAME, prompt: "hi", n: 64, logprobs: 20 });
    eq(c.status, 400, "completions status");
    assert(/1048576/.test(c.json.error.message), `cap in the message: ${c.json.error.message}`);
    const ok = await post(srv, "/v1/completions", { model: NAME, prompt: "hi", n: 2, max_tokens: 3, logprobs: 20 });
    eq(ok.status, 200, "a request under the cap");
  });

  // ---- responses: peak memory a small constant factor of the bytes sent
  await test("amplify_response_memory", async () => {
    const n = 4, max_tokens = ASAN ? 30 : 120;
    const body = { model: NAME, messages: user("tell me"), n, max_tokens, ignore_eos: true, seed: 1 };
    // the same generations without logprobs first: what the engine and the text take is counted
    // before the measured request
    eq((await post(srv, "/v1/chat/completions", body)).status, 200, "warm-up");
    const before = mem(srv);
    const r = await post(srv, "/v1/chat/completions", { ...body, logprobs: true, top_logprobs: 20 });
    const after = mem(srv);
    eq(r.status, 200, "status");
    eq(r.json.choices.length, n, "choices");
    for (const c of r.json.choices) {
      eq(c.logprobs.content.length, max_tokens, "a logprob entry per token");
      eq(c.logprobs.content[0].top_logprobs.length, 20, "20 top logprobs");
    }
    const bytes = Buffer.byteLength(r.text), grew = after.hwm - before.hwm;
    console.log(`NOTE amplify_response_memory: ${mb(bytes)} MiB sent, peak +${mb(grew)} MiB (${(grew / bytes).toFixed(2)} x)`);
    if (!ASAN) assert(grew <= 4 * bytes + 3 * MiB, `peak grew ${mb(grew)} MiB for a ${mb(bytes)} MiB response`);
  });

  // ---- requests: a body of small JSON values is refused before a tree is built; two at once
  // peak at a small multiple of their bytes and give the memory back
  await test("amplify_request_memory", async () => {
    const N = 14 * MiB; // "1," each: a 28 MiB body, under the default 32 MiB limit
    const body = '{"model":"' + NAME + '","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"x":[' + "1,".repeat(N) + "1]}";
    const before = mem(srv);
    const rs = await Promise.all([post(srv, "/v1/chat/completions", body), post(srv, "/v1/chat/completions", body)]);
    for (const r of rs) {
      eq(r.status, 400, "status");
      assert(/JSON values/.test(r.json.error.message), `message: ${r.json.error.message}`);
    }
    const after = mem(srv), total = 2 * body.length, grew = after.hwm - before.hwm, held = after.rss - before.rss;
    console.log(`NOTE amplify_request_memory: 2 x ${mb(body.length)} MiB bodies, peak +${mb(grew)} MiB (${(grew / total).toFixed(2)} x), held +${mb(held)} MiB`);
    if (!ASAN) {
      assert(grew <= 3 * total, `peak grew ${mb(grew)} MiB for ${mb(total)} MiB of bodies`);
      assert(held <= total / 2, `${mb(held)} MiB still held after ${mb(total)} MiB of bodies`);
    }
    // a long list of token ids (of 5 and 6 digits, as real ones are) is still accepted
    const ids = Array.from({ length: 40000 }, (_, i) => 10000 + ((i * 7919) % 140000));
    const ok = await post(srv, "/detokenize", { model: NAME, tokens: ids });
    eq(ok.status, 200, `40,000 ids: ${ok.text.slice(0, 200)}`);
  });
} finally {
  await srv.stop().catch(() => {});
  killAllServers();
  model.cleanup();
  stopWatchdog();
}
process.exit(failureCount() ? 1 : 0);
