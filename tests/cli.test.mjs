// The command line a vLLM user types: `deltaserve serve MODEL`, every flag as `--flag value` and
// `--flag=value` (serve, run, bench, tokenize), sizes such as 32k, --version, vLLM's flags
// accepted with one log line or refused with one line, the API key from VLLM_API_KEY /
// DELTASERVE_API_KEY, and `make run PORT=... HOST=...`. Prints "PASS name" / "FAIL name: why".
import { spawn, spawnSync } from "node:child_process";
import path from "node:path";
import { BIN, BUILD, test, assert, eq, poll, healthy, makeModel, killAllServers, watchdog, failureCount } from "./lib/server_harness.mjs";

const done = watchdog(240000, "cli.test.mjs");
const model = makeModel("ds-cli-");

/* deltaserve ARGS to its end: {code, out, err} */
function ds(args, opts = {}) {
  const r = spawnSync(BIN, args, { encoding: "utf8", timeout: 60000, ...opts });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

/* `deltaserve serve ARGS` (no --model added) until /health 200; env: extra environment. */
const procs = [];
async function serve(args, env = {}) {
  const p = spawn(BIN, ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
  const srv = { p, log: "", exited: null };
  procs.push(srv);
  p.stderr.on("data", (d) => (srv.log += d.toString()));
  p.on("exit", (code, sig) => (srv.exited = { code, sig }));
  const port = await poll(() => {
    if (srv.exited) throw new Error(`serve exited (${JSON.stringify(srv.exited)}): ${srv.log.slice(-400)}`);
    const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(srv.log);
    return m && Number(m[1]);
  }, "the listening line");
  srv.url = `http://127.0.0.1:${port}`;
  await poll(() => healthy(srv), "/health 200");
  srv.stop = async () => {
    p.kill("SIGTERM");
    await poll(() => srv.exited, "serve to exit");
  };
  return srv;
}
async function models(srv, key) {
  const r = await fetch(`${srv.url}/v1/models`, { headers: key ? { Authorization: `Bearer ${key}` } : {} });
  return { status: r.status, body: r.status === 200 ? await r.json() : null };
}

await test("version", async () => {
  for (const flag of ["--version", "-v"]) {
    const r = ds([flag]);
    eq(r.code, 0, `${flag} exit status`);
    assert(/^deltaserve \d+\.\d+\S* ?(\(git [0-9a-f]+\))?\n$/.test(r.out), `${flag} printed '${r.out}'`);
  }
});

// vLLM's flags that mean nothing here: each must start the server and log one line.
const accepted = [
  ["--trust-remote-code"],
  ["--dtype", "auto"],
  ["--pipeline-parallel-size=1"],
  ["--enable-auto-tool-choice"],
  ["--tool-call-parser", "qwen3_coder"],
  ["--reasoning-parser=qwen3"],
  ["--uvicorn-log-level", "warning"],
  ["--enforce-eager"],
  ["--mamba-ssm-cache-dtype", "float32"],
  ["--language-model-only"],
  ["--enable-expert-parallel"],
];

let srv = null;
await test("serve_positional_model_and_flag_equals_value", async () => {
  // the model as `vllm serve MODEL` takes it (also named again by --model: the same folder),
  // every deltaserve flag as --flag=value, a size, and the key from VLLM_API_KEY
  srv = await serve(
    [model.dir, `--model=${model.dir}/`, "--port=0", "--threads=2", "--served-model-name=tiny", "--max-model-len=1k",
     "--max-num-seqs=4", "--gpu-memory-utilization=0.5", "--enable-prefix-caching",
     "--disable-log-requests", "--disable-log-stats", "--log-level=info", ...accepted.flat()],
    { VLLM_API_KEY: "vllm-key", DELTASERVE_API_KEY: "" },
  );
  const m = await models(srv, "vllm-key");
  eq(m.status, 200, "GET /v1/models with the key");
  eq(m.body.data[0].id, "tiny", "served name");
  eq(m.body.data[0].max_model_len, 1000, "--max-model-len=1k");
  assert(/limits: max_model_len 1000, max_num_seqs 4/.test(srv.log), "the limits line");
  // GET /version names the version --version prints (one definition, base/version.h)
  const number = ds(["--version"]).out.split(" ")[1].trim();
  eq(await (await fetch(`${srv.url}/version`)).json(), { version: `deltaserve ${number}` }, "/version");
});

for (const a of accepted) {
  await test(`serve_accepts ${a.join(" ")}`, async () => {
    assert(srv, "no server");
    const [flag, value] = a[0].includes("=") ? a[0].split("=") : a;
    const line = `${flag}${value ? " " + value : ""}: accepted, no effect: `;
    eq(srv.log.split("\n").filter((l) => l.includes(line)).length, 1, `log lines with '${line}'`);
  });
}

await test("serve_api_key_from_environment", async () => {
  assert(srv, "no server");
  eq((await models(srv)).status, 401, "without a key");
  eq((await models(srv, "wrong")).status, 401, "a wrong key");
  assert(srv.log.includes("API key from $VLLM_API_KEY"), "the key's log line");
  await srv.stop();
  // DELTASERVE_API_KEY first; --api-key over both
  const s2 = await serve([model.dir, "--port", "0", "--threads", "2"], { VLLM_API_KEY: "v", DELTASERVE_API_KEY: "d" });
  eq((await models(s2, "d")).status, 200, "DELTASERVE_API_KEY");
  eq((await models(s2, "v")).status, 401, "VLLM_API_KEY after DELTASERVE_API_KEY");
  await s2.stop();
  const s3 = await serve([model.dir, "--port", "0", "--threads", "2", "--api-key", "flag"], { VLLM_API_KEY: "v" });
  eq((await models(s3, "flag")).status, 200, "--api-key");
  eq((await models(s3, "v")).status, 401, "VLLM_API_KEY under --api-key");
  await s3.stop();
});

// vLLM's flags and values deltaserve cannot honour: exit 2 with one line naming the flag.
const refused = [
  [["--dtype", "float16"], "change the results"],
  [["--dtype=float32"], "change the results"],
  [["--tensor-parallel-size", "0"], "[1, 64]"],
  [["--data-parallel-size", "2"], "data parallelism"],
  [["--tool-call-parser", "mistral"], "<tool_call>"],
  [["--reasoning-parser", "granite"], "<think>"],
  [["--kv-cache-dtype", "fp8_e5m2"], "e4m3"],
  [["--kv-cache-dtype", "int8"], "accepted: auto, bfloat16, fp8, fp8_e4m3"],
  [["--seed", "0"], "'seed' field"],
  [["--tokenizer", "x"], "model folder"],
  [["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'], "MTP head"],
  [["--enable-lora"], "LoRA"],
  [["--hf-overrides", "{}"], "config.json"],
  [["--ssl-keyfile", "k.pem"], "TLS"],
  [["--kv-cache-memory-bytes", "8G"], "--kv-cache-tokens"],
  [["--max-model-len", "1.5K"], "decimals are not allowed with binary suffixes"],
  [["--max-model-len=32x"], "32k = 32000"],
];
for (const [args, why] of refused) {
  await test(`serve_refuses ${args.join(" ")}`, async () => {
    const r = ds(["serve", model.dir, "--port", "0", ...args]);
    eq(r.code, 2, "exit status");
    const lines = r.err.trim().split("\n");
    eq(lines.length, 1, `one line (${r.err.trim()})`);
    const flag = args[0].split("=")[0];
    assert(lines[0].includes(flag) && lines[0].includes(why), `'${lines[0]}' names ${flag} and '${why}'`);
  });
}

// --kv-cache-dtype fp8: FP8 K/V pages (test_kv_fp8 checks the numbers); the server runs on them
await test("serve_kv_cache_dtype_fp8", async () => {
  const s = await serve([model.dir, "--port", "0", "--threads", "2", "--kv-cache-dtype", "fp8"]);
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "hello", max_tokens: 4, temperature: 0, ignore_eos: true }),
  });
  eq(r.status, 200, "completion with fp8 K/V");
  eq((await r.json()).usage.completion_tokens, 4, "tokens");
  const m = await (await fetch(`${s.url}/metrics`)).text();
  assert(/cache_config_info\{[^}]*cache_dtype="fp8"/.test(m), "cache_config_info's cache_dtype");
  await s.stop();
});

// --tensor-parallel-size (docs/tensor-parallel.md): the demo shape over 2 CPU ranks gives the
// greedy text of 1; a size that does not divide a head count, or one on CUDA, is refused naming it
await test("serve_tensor_parallel", async () => {
  const body = JSON.stringify({ prompt: "hello", max_tokens: 8, temperature: 0, ignore_eos: true });
  const texts = [];
  for (const tp of ["1", "2"]) {
    const s = await serve([model.dir, "--port", "0", "--threads", "2", "--device", "cpu", "-tp", tp]);
    const r = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "Content-Type": "application/json" }, body });
    eq(r.status, 200, `-tp ${tp}`);
    texts.push((await r.json()).choices[0].text);
    if (tp === "2") assert(/tensor parallel over 2 ranks/.test(s.log), "the ranks' log line");
    await s.stop();
  }
  eq(texts[1], texts[0], "-tp 2 text");
  const r = ds(["serve", model.dir, "--port", "0", "--device", "cpu", "--tensor-parallel-size=4"]);
  assert(r.code !== 0 && r.err.includes("--tensor-parallel-size 4 does not divide the DeltaNet key heads (2)"), r.err);
  const r2 = ds(["serve", model.dir, "--port", "0", "--device", "cuda", "-tp", "2"]);
  assert(r2.code !== 0 && r2.err.includes("--tensor-parallel-size > 1 needs NCCL builds"), r2.err);
});

await test("serve_two_models", async () => {
  const r = ds(["serve", model.dir, "--model", model.tmp]);
  eq(r.code, 2, "exit status");
  assert(/two models given/.test(r.err), r.err);
  const r2 = ds(["serve", model.dir, "other"]);
  eq(r2.code, 2, "exit status");
  assert(/unexpected argument 'other'/.test(r2.err), r2.err);
  const r3 = ds(["serve", path.join(model.tmp, "nosuch")]);
  eq(r3.code, 1, "exit status");
  assert(/no such folder/.test(r3.err), r3.err);
  const r4 = ds(["serve", "Qwen/Qwen3.5-0.8B-nosuch"]); // a Hugging Face id, as vLLM takes it
  eq(r4.code, 1, "exit status");
  assert(r4.err.includes("huggingface-cli download Qwen/Qwen3.5-0.8B-nosuch --local-dir DIR"), r4.err);
});

await test("run_flag_equals_value", async () => {
  const a = ds(["run", "--model", model.dir, "--prompt-ids", "1,2,3", "--max-tokens", "3"]);
  const b = ds(["run", `--model=${model.dir}`, "--prompt-ids=1,2,3", "--max-tokens=3"]);
  eq(a.code, 0, `run: ${a.err}`);
  eq(b.code, 0, `run with =: ${b.err}`);
  eq(b.out, a.out, "the same tokens");
  assert(/^\d+ \d+ \d+\n$/.test(b.out), b.out);
});

await test("tokenize_flag_equals_value", async () => {
  const a = ds(["tokenize", "--tokenizer", model.dir], { input: "hello world" });
  const b = ds(["tokenize", `--tokenizer=${model.dir}`], { input: "hello world" });
  eq(a.code, 0, a.err);
  eq(b.code, 0, b.err);
  eq(b.out, a.out, "the same ids");
});

await test("bench_flag_equals_value", async () => {
  // the flag is read (its check runs) rather than refused as unknown
  const r = ds(["bench", `--model=${model.dir}`, "--out=/dev/null", "--decode-conc=3"]);
  eq(r.code, 2, "exit status");
  assert(/--decode-conc N needs --only decode/.test(r.err), r.err);
  const s = ds(["bench", `--model=${model.dir}`, "--out=/dev/null", "--decode-prompt=1.5K"]);
  eq(s.code, 2, "exit status");
  assert(/decimals are not allowed/.test(s.err), s.err);
});

await test("make_run_port_host", async () => {
  const mk = (vars, extra = {}) => {
    const env = { ...process.env, ...extra };
    if (!extra.HOST) delete env.HOST;
    delete env.PORT;
    const r = spawnSync("make", ["-n", "--no-print-directory", "run", `BUILD=${BUILD}`, ...vars], { encoding: "utf8", env });
    return r.stdout.split("\n").find((l) => l.includes(" serve ")) || "";
  };
  const a = mk(["PORT=8123", "HOST=0.0.0.0"]);
  assert(a.includes("--host 0.0.0.0 --port 8123"), a);
  const b = mk([], { HOST: "my-laptop" }); // a shell's HOST is the machine's name, not an address
  assert(b.includes("--host 127.0.0.1 --port 8000"), b);
});

killAllServers();
for (const s of procs) if (!s.exited) s.p.kill("SIGKILL");
model.cleanup();
done();
process.exit(failureCount() ? 1 : 0);
