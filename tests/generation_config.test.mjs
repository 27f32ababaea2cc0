// The model folder's generation_config.json as the sampling defaults of requests that leave the
// fields out (vLLM's --generation-config): auto (the model folder), vllm (none), a folder of its
// own, and the start-up errors. Greedy from the file shows as the same text for any seed;
// max_new_tokens as the completion's length; what a request sets wins. No timing assertions.
import fs from "node:fs";
import path from "node:path";
import {
  makeModel, startServer, killAllServers, watchdog, post, test, fail, failureCount, assert, eq,
} from "./lib/server_harness.mjs";

const stopWatchdog = watchdog(170000, "generation_config.test.mjs");
const model = makeModel("ds-gencfg-");
const writeCfg = (dir, cfg) => fs.writeFileSync(path.join(dir, "generation_config.json"), typeof cfg === "string" ? cfg : JSON.stringify(cfg));
const complete = (srv, extra) => post(srv, "/v1/completions", { prompt: "The weather today", ignore_eos: true, ...extra });
const text = (r) => {
  assert(r.status === 200, `status ${r.status}: ${r.text.slice(0, 200)}`);
  return r.json.choices[0].text;
};

writeCfg(model.dir, { do_sample: true, temperature: 0, top_k: 20, max_new_tokens: 5, eos_token_id: [1, 2] });
let srv;
try {
  srv = await startServer(model.dir, ["--max-model-len", "512"]);
  await test("gencfg_auto_logged", async () => {
    assert(/sampling defaults from .*generation_config\.json.*temperature=0 top_k=20 max_tokens=5/.test(srv.log), `start-up log: ${srv.log.slice(-600)}`);
  });
  await test("gencfg_auto_max_new_tokens", async () => {
    const r = await complete(srv, { seed: 1 });
    text(r);
    eq(r.json.usage.completion_tokens, 5, "completion tokens without max_tokens");
    eq(r.json.choices[0].finish_reason, "length", "finish reason");
    const c = await post(srv, "/v1/chat/completions", { messages: [{ role: "user", content: "Hi" }], ignore_eos: true });
    assert(c.status === 200, `chat status ${c.status}`);
    eq(c.json.usage.completion_tokens, 5, "chat completion tokens without max_tokens");
  });
  await test("gencfg_auto_temperature", async () => {
    // temperature 0 from the file: greedy, the same text whatever the seed
    const a = text(await complete(srv, { seed: 1 })), b = text(await complete(srv, { seed: 2 }));
    eq(a, b, "seeds 1 and 2 under the file's temperature 0");
  });
  await test("gencfg_request_wins", async () => {
    const r = await complete(srv, { seed: 1, temperature: 1.0, max_tokens: 12 });
    const a = text(r), b = text(await complete(srv, { seed: 2, temperature: 1.0, max_tokens: 12 }));
    eq(r.json.usage.completion_tokens, 12, "the request's max_tokens");
    assert(a !== b, `temperature 1 from the request: seeds 1 and 2 gave the same text '${a}'`);
    // null is no value: the file's default applies
    eq(text(await complete(srv, { seed: 3, temperature: null })), text(await complete(srv, { seed: 4 })), "temperature null");
  });
  await test("gencfg_auto_clean_exit", async () => eq((await srv.stop()).code, 0, "exit status"));

  srv = await startServer(model.dir, ["--max-model-len", "512", "--generation-config", "vllm"]);
  await test("gencfg_vllm_none", async () => {
    assert(!/sampling defaults from/.test(srv.log), "no defaults logged");
    const r = await complete(srv, { seed: 1, max_tokens: 12 });
    const a = text(r), b = text(await complete(srv, { seed: 2, max_tokens: 12 }));
    assert(a !== b, `temperature 1 (no file defaults): seeds 1 and 2 gave the same text '${a}'`);
  });
  await test("gencfg_vllm_clean_exit", async () => eq((await srv.stop()).code, 0, "exit status"));

  const other = fs.mkdtempSync(path.join(model.tmp, "cfg-"));
  writeCfg(other, { temperature: 0.0, max_new_tokens: 3 });
  srv = await startServer(model.dir, ["--max-model-len", "512", "--generation-config", other]);
  await test("gencfg_folder", async () => {
    const r = await complete(srv, { seed: 1 });
    text(r);
    eq(r.json.usage.completion_tokens, 3, "max_new_tokens of the other folder's file");
  });
  await test("gencfg_folder_clean_exit", async () => eq((await srv.stop()).code, 0, "exit status"));

  // start-up errors: not a folder; a file that is not JSON
  const startFails = async (args, says) => {
    let msg = "";
    try {
      const s = await startServer(model.dir, args);
      await s.stop();
    } catch (e) {
      msg = e.message;
    }
    assert(msg.includes("server exited early") && msg.includes(says), `expected a start-up error with '${says}', got '${msg.slice(0, 300)}'`);
  };
  await test("gencfg_not_a_folder", () => startFails(["--generation-config", path.join(model.tmp, "nope")], "not auto, vllm or a folder"));
  await test("gencfg_bad_file", async () => {
    writeCfg(other, "{\"temperature\": ");
    await startFails(["--generation-config", other], "--generation-config:");
    writeCfg(other, { top_p: 2 });
    await startFails(["--generation-config", other], "'top_p'");
  });
} catch (e) {
  fail("gencfg", e.message);
}
stopWatchdog();
killAllServers();
model.cleanup();
process.exit(failureCount() ? 1 : 0);
