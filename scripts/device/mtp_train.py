#!/usr/bin/env python3
"""mtp_train.py — a real MTP head for issue #45's measurement (b), and the MTP forward's PyTorch
parity fixture.

On the GPU machine (torch + transformers there), in one call:
  1. trains a small byte-level Qwen3.5 model (transformers' Qwen3_5ForCausalLM) together with an
     MTP head of vLLM's Qwen3.5 definition on the Python sources of the machine's installed
     packages (torch's), for --seconds of wall time; the head is written as the released
     checkpoints keep it (mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.layers.0.*, mtp.norm;
     config mtp_num_hidden_layers 1) next to the model;
  2. serves it with deltaserve (--skip-tokenizer-init, token-id prompts) on held-out text of the
     same kind (transformers' sources) at 1 / 8 / 64 concurrent requests, plain and with
     --speculative-config mtp (every step drafting, and the default measured choice), and
     reports tokens per second, the ratio to plain and the acceptance length from /metrics;
  3. writes a tiny random model with an MTP head and the head's logits computed here in fp32
     (the parity fixture tests/fixtures/mtp_parity: config.json, model.safetensors,
     ref.json), which tests/test_spec_mtp.c checks qwen35_mtp_forward against.

The MTP head (vLLM qwen3_5_mtp / qwen3_next_mtp): for the target's final-normed hidden state h_p
and the next token t = x_{p+1}:
  x = fc(cat(norm_e(embed(t)), norm_h(h_p)));  y = norm(decoder_layer(x));  logits = lm_head(y)
with a full-attention decoder layer over the MTP's own rows at positions p (causal), the
target's embedding and lm-head. Trained to predict x_{p+2}.

usage: mtp_train.py --out DIR --bin build-cuda/deltaserve [--seconds 150] [--no-serve]
         [--conc 1,8,64] [--variants plain,mtp3_always,ngram3_always,...] [--loads text,edit]
Writes DIR/mtp-train.json (and .md) and DIR/mtp_parity/.
"""
import argparse
import glob
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--bin", default="build-cuda/deltaserve")
ap.add_argument("--seconds", type=float, default=150.0)
ap.add_argument("--no-serve", action="store_true")
ap.add_argument("--conc", default="1,8,64", help="concurrent requests of the serve runs")
ap.add_argument("--variants", default="plain,mtp3_always,mtp3_measured")
ap.add_argument("--loads", default="text",
                help="text: held-out text; edit: a held-out file piece, then its start again "
                     "(an agent re-emitting a file it read, with n-gram drafts to find)")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
T0 = time.time()

import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 256  # bytes


def rope(hd):
    """Qwen3.5's rotary settings for head_dim hd (text only: the mrope sections see one position,
    so how the rotated half is split among them does not change a value)."""
    half = int(hd * 0.25) // 2
    return {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": [half - 2 * (half // 3), half // 3, half // 3],
            "mrope_interleaved": True}


class ZNorm(nn.Module):
    """Qwen3.5's RMSNorm: x / rms(x) * (1 + w), in fp32."""

    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(h))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def text_config(h, inter, layers, heads, kv, hd, lk, lv, dk, dv, types, vocab=VOCAB):
    return Qwen3_5TextConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv, head_dim=hd, linear_num_key_heads=lk,
                             linear_num_value_heads=lv, linear_key_head_dim=dk,
                             linear_value_head_dim=dv, linear_conv_kernel_dim=4,
                             rms_norm_eps=1e-6, max_position_embeddings=4096,
                             rope_parameters=rope(hd), layer_types=types, tie_word_embeddings=False,
                             bos_token_id=None, eos_token_id=None, initializer_range=0.02)


class MTP(nn.Module):
    """vLLM's Qwen3.5 MTP head over a target model; the decoder layer and final norm are a
    one-layer Qwen3_5 text model's (its own embedding and lm-head unused)."""

    def __init__(self, target_cfg):
        super().__init__()
        H = target_cfg.hidden_size
        c = target_cfg.to_dict()
        c.update(num_hidden_layers=1, layer_types=["full_attention"], vocab_size=8)
        for k in ("model_type", "transformers_version", "architectures"):
            c.pop(k, None)
        self.inner = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**c)).model
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.norm_e = ZNorm(H)
        self.norm_h = ZNorm(H)

    def forward(self, target, h, next_tokens):
        """h [B, T, H] the target's final hidden rows at p; next_tokens [B, T] x_{p+1};
        returns logits [B, T, V] for x_{p+2}."""
        e = self.norm_e(target.model.embed_tokens(next_tokens))
        x = self.fc(torch.cat([e, self.norm_h(h)], dim=-1))
        pos = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        y = self.inner(inputs_embeds=x, position_ids=pos, use_cache=False).last_hidden_state
        return target.lm_head(y)

    def tensors(self):
        """The head's tensors under the checkpoint's names."""
        out = {"mtp.fc.weight": self.fc.weight,
               "mtp.pre_fc_norm_embedding.weight": self.norm_e.weight,
               "mtp.pre_fc_norm_hidden.weight": self.norm_h.weight,
               "mtp.norm.weight": self.inner.norm.weight}
        for k, v in self.inner.layers[0].state_dict().items():
            out["mtp.layers.0." + k] = v
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def save_with_head(model, head, d):
    model.save_pretrained(d, safe_serialization=True)
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    assert len(files) == 1, files
    sd = load_file(files[0])
    sd.update(head.tensors())
    save_file(sd, files[0], metadata={"format": "pt"})
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg["mtp_num_hidden_layers"] = 1
    json.dump(cfg, open(p, "w"), indent=2)


# ---- 3 first (cheap): the parity fixture ----
def parity_fixture():
    torch.manual_seed(7)
    cfg = text_config(64, 96, 2, 4, 2, 16, 2, 4, 16, 16, ["linear_attention", "full_attention"])
    cfg._attn_implementation = "eager"
    m = Qwen3_5ForCausalLM(cfg).float().eval()
    head = MTP(cfg).float().eval()
    head.inner.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # norms away from 0, as trained ones are
        for mod in (m, head):
            for n, p in mod.named_parameters():
                if p.ndim == 1 and not (n.endswith("A_log") or n.endswith("dt_bias")):
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
    d = os.path.join(args.out, "mtp_parity")
    os.makedirs(d, exist_ok=True)
    m.to(torch.bfloat16)
    head.to(torch.bfloat16)
    save_with_head(m, head, d)
    # the reference from the saved (bf16) weights, in fp32
    m = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    head = head.float()
    ids = torch.randint(0, VOCAB, (1, 20), generator=g)
    nxt = torch.randint(0, VOCAB, (1, 20), generator=g)
    nxt[0, :-1] = ids[0, 1:]  # the next tokens: the prompt's, then one more
    with torch.no_grad():
        h = m.model(input_ids=ids, use_cache=False).last_hidden_state
        lg = head(m, h, nxt)[0].float()
    lg.numpy().astype("<f4").tofile(os.path.join(d, "mtp_logits.bin"))
    json.dump({"transformers": transformers.__version__, "prompt": ids[0].tolist(),
               "next": nxt[0].tolist(), "mtp_logits": "mtp_logits.bin",
               "rows": 20, "vocab": VOCAB}, open(os.path.join(d, "ref.json"), "w"))
    print("parity fixture:", d, flush=True)


parity_fixture()


# ---- 1: training ----
def load_bytes(pattern, limit):
    fs = sorted(glob.glob(pattern, recursive=True))
    random.Random(0).shuffle(fs)
    buf = bytearray()
    for f in fs:
        try:
            buf += open(f, "rb").read() + b"\n"
        except OSError:
            continue
        if len(buf) >= limit:
            break
    return bytes(buf[:limit])


site = os.path.dirname(os.path.dirname(torch.__file__))
train = load_bytes(os.path.join(site, "torch", "**", "*.py"), 64 << 20)
held = load_bytes(os.path.join(site, "transformers", "**", "*.py"), 1 << 20)
print(f"train bytes {len(train)}, held-out bytes {len(held)} (from {site})", flush=True)
data = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()

torch.manual_seed(0)
cfg = text_config(512, 1536, 6, 8, 2, 64, 4, 8, 64, 128,
                  ["linear_attention", "linear_attention", "full_attention"] * 2)
cfg._attn_implementation = "sdpa"
model = Qwen3_5ForCausalLM(cfg).to(dev)
head = MTP(cfg).to(dev)
head.inner.config._attn_implementation = "sdpa"
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1.5e-3, betas=(0.9, 0.95), weight_decay=0.05)
B, L = 32, 512
step, t_train, log = 0, time.time(), []
while time.time() - t_train < args.seconds:
    ix = torch.randint(0, len(data) - L - 2, (B,))
    x = torch.stack([data[i:i + L + 2] for i in ix]).to(dev)
    lr = 1.5e-3 * min(1.0, (step + 1) / 50)
    for gq in opt.param_groups:
        gq["lr"] = lr
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
        out = model.model(input_ids=x[:, :L], use_cache=False)
        h = out.last_hidden_state
        lm = F.cross_entropy(model.lm_head(h).float().reshape(-1, VOCAB), x[:, 1:L + 1].reshape(-1))
        ml = head(model, h, x[:, 1:L + 1])
        mt = F.cross_entropy(ml.float().reshape(-1, VOCAB), x[:, 2:L + 2].reshape(-1))
        loss = lm + mt
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if step % 25 == 0:
        log.append({"step": step, "s": round(time.time() - t_train, 1), "lm_bpb": lm.item() / math.log(2),
                    "mtp_bpb": mt.item() / math.log(2)})
        print(log[-1], flush=True)
    step += 1
print(f"trained {step} steps in {time.time() - t_train:.0f} s", flush=True)

# held-out losses and the head's greedy hit rate (what acceptance is made of)
model.eval()
head.eval()
hd = torch.frombuffer(bytearray(held), dtype=torch.uint8).long()
with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
    ix = torch.arange(0, min(len(hd) - L - 2, 64 * (L + 2)), L + 2)[:16]
    x = torch.stack([hd[i:i + L + 2] for i in ix]).to(dev)
    h = model.model(input_ids=x[:, :L], use_cache=False).last_hidden_state
    lgt = model.lm_head(h).float()
    mlg = head(model, h, x[:, 1:L + 1]).float()
    held_lm = F.cross_entropy(lgt.reshape(-1, VOCAB), x[:, 1:L + 1].reshape(-1)).item() / math.log(2)
    held_mtp = F.cross_entropy(mlg.reshape(-1, VOCAB), x[:, 2:L + 2].reshape(-1)).item() / math.log(2)
    top1 = (lgt.argmax(-1) == x[:, 1:L + 1]).float().mean().item()
    mtop1 = (mlg.argmax(-1) == x[:, 2:L + 2]).float().mean().item()
print(f"held-out: lm {held_lm:.3f} bits/byte (top-1 {top1:.3f}), mtp {held_mtp:.3f} (top-1 {mtop1:.3f})",
      flush=True)
mdir = os.path.join("/tmp", "ds-mtp-model")
os.makedirs(mdir, exist_ok=True)
model.to(torch.bfloat16)
head.to(torch.bfloat16)
save_with_head(model.cpu(), head.cpu(), mdir)
result = {"transformers": transformers.__version__, "torch": torch.__version__,
          "model": {"hidden": 512, "layers": "6 (2:1 linear:full)", "vocab": "bytes (256)",
                    "params": sum(p.numel() for p in model.parameters()),
                    "mtp_params": sum(p.numel() for p in head.parameters())},
          "train": {"steps": step, "seconds": round(time.time() - t_train, 1), "batch": [B, L],
                    "data": "torch/**/*.py of the machine", "log": log},
          "held_out": {"data": "transformers/**/*.py", "lm_bits_per_byte": held_lm,
                       "lm_top1": top1, "mtp_bits_per_byte": held_mtp, "mtp_top1": mtop1}}


# ---- 2: deltaserve on held-out text ----
def serve_run(extra, conc, n_req, max_tokens=128, plen=256, load="text"):
    port = 18000 + random.randint(0, 999)
    cmd = [args.bin, "serve", "--model", mdir, "--device", "cuda", "--skip-tokenizer-init",
           "--port", str(port), "--max-num-seqs", "64", "--max-model-len", "2048"] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/ds-mtp-serve-{port}.log", "w"),
                         start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except Exception:
                if p.poll() is not None:
                    raise RuntimeError("server exited: " + open(f"/tmp/ds-mtp-serve-{port}.log").read()[-800:])
                time.sleep(0.2)
        r = random.Random(conc)
        prompts = []
        for i in range(n_req):
            o = r.randrange(0, len(held) - plen)
            piece = held[o:o + plen]
            # edit: the piece, a blank line, then its first quarter again (the copy goes on)
            prompts.append(list(piece + b"\n\n" + piece[:plen // 4] if load == "edit" else piece))

        def one(pr):
            body = json.dumps({"model": name, "prompt": pr, "max_tokens": max_tokens,
                               "temperature": 0, "ignore_eos": True}).encode()
            q = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
            j = json.loads(urllib.request.urlopen(q, timeout=600).read())
            return j["usage"]["completion_tokens"]

        name = json.loads(urllib.request.urlopen(base + "/v1/models").read())["data"][0]["id"]
        one(prompts[0])  # warm
        m0 = urllib.request.urlopen(base + "/metrics").read().decode()
        t = time.time()
        with ThreadPoolExecutor(conc) as ex:
            toks = sum(ex.map(one, prompts))
        dt = time.time() - t
        m1 = urllib.request.urlopen(base + "/metrics").read().decode()

        def metric(txt, name):
            for line in txt.splitlines():
                if line.startswith("deltaserve:" + name) and not line.startswith("#"):
                    return float(line.split()[-1])
            return 0.0
        dr = metric(m1, "spec_decode_num_drafts_total") - metric(m0, "spec_decode_num_drafts_total")
        ac = metric(m1, "spec_decode_num_accepted_tokens_total") - metric(m0, "spec_decode_num_accepted_tokens_total")
        return {"tok_s": toks / dt, "tokens": toks, "seconds": dt,
                "acceptance_length": (1 + ac / dr) if dr else None, "drafts": dr}
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"{e}; server log: " + open(f"/tmp/ds-mtp-serve-{port}.log").read()[-600:])
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=60)
        except ProcessLookupError:
            pass


if not args.no_serve:
    runs = {}
    specs = {"plain": [],
             "mtp3_always": ["--speculative-config",
                             '{"method":"mtp","num_speculative_tokens":3,"disable_by_batch_size":4096}'],
             "mtp3_measured": ["--speculative-config", '{"method":"mtp","num_speculative_tokens":3}'],
             "ngram3_always": ["--speculative-config",
                               '{"method":"ngram","num_speculative_tokens":3,"disable_by_batch_size":4096}'],
             "ngram3_measured": ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']}
    concs = [int(c) for c in args.conc.split(",")]
    specs = {k: v for k, v in specs.items() if k in args.variants.split(",")}
    loads = args.loads.split(",")
    for load in loads:
        sfx = "" if load == "text" else f"/{load}"
        for conc in concs:
            for name, extra in specs.items():
                key = f"{name}@{conc}{sfx}"
                try:
                    runs[key] = serve_run(extra, conc, max(conc, 4) if conc > 1 else 3,
                                          plen=256 if load == "text" else 512, load=load)
                except Exception as e:  # noqa: BLE001
                    runs[key] = {"error": str(e)[-400:]}
                print(key, runs[key], flush=True)
        for conc in concs:
            base = runs.get(f"plain@{conc}{sfx}", {}).get("tok_s")
            for name in specs:
                r = runs.get(f"{name}@{conc}{sfx}", {})
                if base and r.get("tok_s"):
                    r["ratio_to_plain"] = r["tok_s"] / base
    result["serve"] = runs
json.dump(result, open(os.path.join(args.out, "mtp-train.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in result.items() if k != "train"}, indent=1)[:4000])
print(f"total {time.time() - T0:.0f} s", flush=True)
