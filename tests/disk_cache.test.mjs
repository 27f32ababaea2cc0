// --disk-cache-dir end to end: a server writes its prefix-cache checkpoints to the directory at
// shutdown; a second server on the same directory while the first runs is refused with one
// line; a restarted server restores a long prefix from the files (cached tokens in usage, the
// same greedy tokens, the disk metrics); corrupt files are dropped and counted, never restored.
// The TTFT of the long-prefix request cold and warm is printed (a measurement, never asserted).
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {
  BIN, makeModel, startServer, killAllServers, watchdog, post, metrics, test, fail, failureCount, assert, eq,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "disk_cache.test.mjs");
const model = makeModel("ds-disk-");
const dir = path.join(model.tmp, "disk-cache");
const args = ["--max-model-len", "8192", "--disk-cache-dir", dir, "--disk-cache-gib", "1"];
const N = 1200; // the long prefix, as token ids
const prompt = Array.from({ length: N }, (_, i) => 1000 + ((i * 7919) % 50000));
const clean = (s) => assert(!/AddressSanitizer|LeakSanitizer|runtime error/.test(s.log), `sanitizer report: ${s.log.slice(-300)}`);
const ckpts = () => (fs.existsSync(dir) ? fs.readdirSync(dir).filter((f) => f.endsWith(".ckpt")) : []);

async function complete(srv) {
  const t0 = performance.now();
  const r = await post(srv, "/v1/completions", { prompt, max_tokens: 1, temperature: 0, ignore_eos: true });
  const ms = performance.now() - t0; // one token: the request's time is its TTFT
  eq(r.status, 200, r.text.slice(0, 300));
  return { text: r.json.choices[0].text, cached: (r.json.usage.prompt_tokens_details || {}).cached_tokens || 0, ms };
}

let srv;
try {
  let cold, warm;
  await test("disk_cache_flags_refused_before_loading", async () => {
    for (const [extra, want] of [
      [["--disk-cache-dir", dir], /--disk-cache-dir needs --disk-cache-gib/],
      [["--disk-cache-gib", "1"], /--disk-cache-gib needs --disk-cache-dir/],
      [[...args, "--no-enable-prefix-caching"], /--disk-cache-dir needs the prefix cache/],
    ]) {
      const r = spawnSync(BIN, ["serve", "--model", model.dir, "--port", "0", ...extra], { encoding: "utf8", timeout: 60000 });
      eq(r.status, 2, `${extra.join(" ")}: ${r.stderr.slice(-300)}`);
      assert(want.test(r.stderr), r.stderr.slice(-300));
    }
    assert(!fs.existsSync(dir), "the directory was created by a refused server");
  });

  srv = await startServer(model.dir, args);

  await test("disk_cache_cold_run", async () => {
    cold = await complete(srv);
    eq(cold.cached, 0, "cached tokens on a cold server");
    const m = await metrics(srv);
    eq(m.vals["deltaserve:disk_cache_capacity_bytes"], 1024 ** 3, "capacity");
  });

  await test("disk_cache_second_server_refused", async () => {
    const r = spawnSync(BIN, ["serve", "--model", model.dir, "--port", "0", "--threads", "2", ...args], {
      encoding: "utf8", timeout: 60000,
    });
    assert(r.status !== 0, `the second server exited with ${r.status}`);
    assert(/in use by another deltaserve process \(pid \d+\)/.test(r.stderr), r.stderr.slice(-400));
  });

  await test("disk_cache_written_at_shutdown", async () => {
    const ex = await srv.stop();
    eq(ex.code, 0, `exit ${JSON.stringify(ex)}: ${srv.log.slice(-300)}`);
    clean(srv);
    assert(ckpts().length >= 1, `files: ${fs.readdirSync(dir)}`);
    assert(!fs.readdirSync(dir).some((f) => f.endsWith(".tmp")), "a temporary file was left");
  });

  srv = await startServer(model.dir, args);
  await test("disk_cache_restart_hits", async () => {
    warm = await complete(srv);
    eq(warm.cached, N - 1, "cached tokens after the restart");
    eq(warm.text, cold.text, "the restored run's token");
    const m = await metrics(srv);
    eq(m.vals["deltaserve:disk_cache_hits_total"], 1, "disk hits");
    eq(m.vals["deltaserve:disk_cache_errors_total"], 0, "disk errors");
    assert(m.vals["deltaserve:disk_cache_files"] >= 1 && m.vals["deltaserve:disk_cache_bytes"] > 0, "files gauge");
    console.log(`  TTFT of a ${N}-token prompt on the CPU fixture: cold ${cold.ms.toFixed(1)} ms, ` +
      `warm after a restart ${warm.ms.toFixed(1)} ms (restored ${warm.cached} tokens from disk)`);
  });

  await test("disk_cache_corrupt_files_dropped", async () => {
    eq((await srv.stop()).code, 0);
    clean(srv);
    for (const f of ckpts()) { // one byte of each payload
      const p = path.join(dir, f), fd = fs.openSync(p, "r+"), b = Buffer.alloc(1);
      const at = fs.fstatSync(fd).size - 100;
      fs.readSync(fd, b, 0, 1, at);
      b[0] ^= 0x40;
      fs.writeSync(fd, b, 0, 1, at);
      fs.closeSync(fd);
    }
    srv = await startServer(model.dir, args);
    const r = await complete(srv);
    eq(r.cached, 0, "a corrupt checkpoint was restored");
    eq(r.text, cold.text, "the cold run's token");
    const m = await metrics(srv);
    assert(m.vals["deltaserve:disk_cache_errors_total"] >= 1, "errors not counted");
    eq(m.vals["deltaserve:disk_cache_hits_total"], 0, "disk hits");
    eq((await srv.stop()).code, 0);
    clean(srv);
  });
} catch (e) {
  fail("disk_cache_setup", e.stack || String(e));
} finally {
  killAllServers();
  stopWatchdog();
  model.cleanup();
}
process.exit(failureCount() ? 1 : 0);
