// spec.test.mjs — `serve --speculative-config` end to end on the CPU fixture model (token-id
// prompts, no tokenizer): the same tokens as a server without it (greedy and seeded sampling,
// requests at once), vLLM's spec_decode counters in /metrics and consistent, and a config the
// server does not implement refused at start with one line.
import { spawnSync } from "node:child_process";
import { BIN, assert, eq, failureCount, killAllServers, startServer, test, watchdog } from "./lib/server_harness.mjs";

const MODEL = "tests/fixtures/models/dense_bf16";
const SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}';
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
  } finally {
    await spec.stop();
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
