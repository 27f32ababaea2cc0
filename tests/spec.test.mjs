// spec.test.mjs — `serve --speculative-config` end to end on the CPU fixture model (token-id
// prompts, no tokenizer): the same tokens as a server without it (greedy and seeded sampling,
// requests at once), vLLM's spec_decode counters in /metrics and consistent, each request's
// log line with its own counters and acceptance length (summing to /metrics'), and a config the
// server does not implement refused at start with one line; and the same with MTP drafts over a
// gen-random checkpoint that has an MTP head.
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { BIN, assert, eq, failureCount, killAllServers, poll, startServer, test, watchdog } from "./lib/server_harness.mjs";

const MODEL = "tests/fixtures/models/dense_bf16";
// disable_by_batch_size: every step may draft (the default decides by measured speed)
const SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2, "disable_by_batch_size": 1024}';
const done = watchdog(300000, "spec.test.mjs");

async function complete(s, body) {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", return_token_ids: true, ...body }),
  });
  const j = await r.json();
  assert(r.status === 200, `status ${r.status}: ${JSON.stringify(j).slice(0, 200)}`);
  return j.choices[0].token_ids;
}

// prompts that repeat themselves, so that the n-gram drafter finds something
const prompts = [];
for (let i = 0; i < 6; i++) {
  const p = [];
  for (let j = 0; j < 30 + i; j++) p.push(((j % (2 + (i % 3))) * 31 + 5 * i) % 250);
  prompts.push(p);
}
const bodies = prompts.flatMap((p, i) => [
  { prompt: p, max_tokens: 24, temperature: 0 },
  { prompt: p, max_tokens: 24, temperature: 0.8, top_p: 0.9, seed: 100 + i },
]);

async function runAll(s) {
  return Promise.all(bodies.map((b) => complete(s, b)));
}

// the request log's lines (request_log.h) of /v1/completions, with the spec fields when present
const LOG_LINE =
  /request id=\S+ method=POST route=\/v1\/completions status=200 .*?finish=\S+(?: spec_drafts=(\d+) spec_draft_tokens=(\d+) spec_accepted_tokens=(\d+) acceptance_length=(\S+))?$/gm;
const logLines = (srv) => [...srv.log.matchAll(LOG_LINE)].map((m) => (m[1] === undefined ? null : { drafts: +m[1], tokens: +m[2], accepted: +m[3], length: m[4] }));

function metric(text, name) {
  const m = new RegExp(`^\\w+:${name}\\{[^}]*\\} (\\d+)`, "m").exec(text);
  return m ? Number(m[1]) : null;
}

await test("spec_same_tokens_and_metrics", async () => {
  const plain = await startServer(MODEL, ["--skip-tokenizer-init"]);
  let want;
  try {
    want = await runAll(plain);
    const mt = await (await fetch(`${plain.url}/metrics`)).text();
    eq(metric(mt, "spec_decode_num_drafts_total"), null, "no spec_decode series without the flag");
    const ll = await poll(() => { const l = logLines(plain); return l.length >= bodies.length && l; }, "the plain server's request lines");
    assert(ll.every((l) => l === null), "no spec fields without the flag");
  } finally {
    await plain.stop();
  }
  const spec = await startServer(MODEL, ["--skip-tokenizer-init", "--speculative-config", SPEC]);
  try {
    const got = await runAll(spec);
    for (let i = 0; i < bodies.length; i++) eq(got[i], want[i], `request ${i} (temperature ${bodies[i].temperature})`);
    const mt = await (await fetch(`${spec.url}/metrics`)).text();
    const drafts = metric(mt, "spec_decode_num_drafts_total");
    const dt = metric(mt, "spec_decode_num_draft_tokens_total");
    const acc = metric(mt, "spec_decode_num_accepted_tokens_total");
    assert(drafts > 0, `drafts ${drafts}`);
    assert(dt >= drafts && dt <= 3 * drafts, `draft tokens ${dt} for ${drafts} drafts`);
    assert(acc !== null && acc <= dt, `accepted ${acc} of ${dt}`);
    let sum = 0;
    for (let p = 0; p < 3; p++) {
      const m = new RegExp(`^\\w+:spec_decode_num_accepted_tokens_per_pos_total\\{[^}]*position="${p}"\\} (\\d+)`, "m").exec(mt);
      assert(m, `position ${p} missing`);
      sum += Number(m[1]);
    }
    eq(sum, acc, "accepted by position sums to accepted");
    // each request's line: its own counters, summing to the server's; acceptance length 1 + a / d
    const ll = await poll(() => { const l = logLines(spec); return l.length >= bodies.length && l; }, "the request lines");
    eq(ll.length, bodies.length, "one line per request");
    const sp = ll.filter((l) => l !== null);
    assert(sp.length > 0, "some request verified drafts");
    for (const l of sp) {
      assert(l.drafts > 0 && l.tokens >= l.drafts && l.tokens <= 3 * l.drafts && l.accepted <= l.tokens, JSON.stringify(l));
      eq(l.length, (1 + l.accepted / l.drafts).toFixed(2), `acceptance length of ${JSON.stringify(l)}`);
    }
    const tot = (k) => sp.reduce((a, l) => a + l[k], 0);
    eq([tot("drafts"), tot("tokens"), tot("accepted")], [drafts, dt, acc], "the lines sum to /metrics");
  } finally {
    await spec.stop();
  }
});

// MTP drafts from the checkpoint's own head: the same tokens as the plain server, drafts made
await test("spec_mtp_same_tokens", async () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ds-spec-mtp-"));
  try {
    const cfg = path.join(tmp, "config.json");
    fs.writeFileSync(
      cfg,
      JSON.stringify({
        model_type: "qwen3_5_text", vocab_size: 256, hidden_size: 48, intermediate_size: 80,
        num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
        linear_num_key_heads: 2, linear_num_value_heads: 4, linear_key_head_dim: 8,
        linear_value_head_dim: 12, linear_conv_kernel_dim: 4, partial_rotary_factor: 0.5,
        tie_word_embeddings: false, mtp_num_hidden_layers: 1,
      }),
    );
    const dir = path.join(tmp, "m");
    execFileSync(BIN, ["gen-random", "--config", cfg, "--out", dir, "--threads", "2"], { stdio: "pipe" });
    const plain = await startServer(dir, ["--skip-tokenizer-init"]);
    let want;
    try {
      want = await runAll(plain);
    } finally {
      await plain.stop();
    }
    const spec = await startServer(dir, ["--skip-tokenizer-init", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2, "disable_by_batch_size": 1024}']);
    try {
      const got = await runAll(spec);
      for (let i = 0; i < bodies.length; i++) eq(got[i], want[i], `mtp: request ${i} (temperature ${bodies[i].temperature})`);
      const mt = await (await fetch(`${spec.url}/metrics`)).text();
      const drafts = metric(mt, "spec_decode_num_drafts_total");
      const dt = metric(mt, "spec_decode_num_draft_tokens_total");
      assert(drafts > 0 && dt >= drafts && dt <= 2 * drafts, `mtp: drafts ${drafts}, draft tokens ${dt}`);
    } finally {
      await spec.stop();
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

await test("spec_config_refused", async () => {
  for (const [cfg, why] of [
    ['{"method": "mtp", "num_speculative_tokens": 2}', "mtp"],
    ['{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', '"model"'],
    ['{"method": "ngram"}', "num_speculative_tokens"],
    ["not json", "JSON"],
  ]) {
    const r = spawnSync(BIN, ["serve", "--model", MODEL, "--skip-tokenizer-init", "--port", "0", "--speculative-config", cfg], { encoding: "utf8", timeout: 60000 });
    assert(r.status !== 0, `${cfg}: exit ${r.status}`);
    const lines = r.stderr.trim().split("\n").filter((l) => /speculative-config/.test(l));
    eq(lines.length, 1, `${cfg}: one line (${r.stderr.slice(-300)})`);
    assert(lines[0].includes(why), `${cfg}: '${lines[0]}'`);
  }
});

done();
killAllServers();
process.exit(failureCount() ? 1 : 0);
