#!/usr/bin/env python3
"""Writes the committed seed corpora tests/fuzz/corpus/<target>/ (small files, first byte =
the target's mode, see each tests/fuzz/fuzz_<target>.c). Re-run after changing a target's
input format: python3 tests/fuzz/make_seeds.py"""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")


def put(target, name, mode, payload):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes([mode]) + payload)


def st_parts(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def loader():
    for m in sorted(os.listdir(MODELS)):
        cfg = os.path.join(MODELS, m, "config.json")
        if os.path.exists(cfg):
            put("loader", "config_" + m, 0, open(cfg, "rb").read())
    # a minimal flat config (every optional key left to its default)
    put("loader", "config_min", 0, json.dumps({
        "model_type": "qwen3_5_text", "vocab_size": 257, "hidden_size": 72, "num_hidden_layers": 2,
        "intermediate_size": 136, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 40,
        "layer_types": ["linear_attention", "full_attention"]}))
    header, data = st_parts(os.path.join(MODELS, "dense_bf16", "model.safetensors"))
    # mode 1: a small complete file of three small tensors (st_open succeeds; weights_load
    # then reports a missing tensor)
    small = {"__metadata__": {"format": "pt"}}
    blob = b""
    for name in sorted(k for k in header if k != "__metadata__")[:80]:
        e = header[name]
        b0, b1 = e["data_offsets"]
        if b1 - b0 > 200 or len(small) > 3:
            continue
        small[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [len(blob), len(blob) + b1 - b0]}
        blob += data[b0:b1]
    h = json.dumps(small, separators=(",", ":")).encode()
    put("loader", "st_small", 1, struct.pack("<Q", len(h)) + h + blob)
    put("loader", "st_empty", 1, struct.pack("<Q", 2) + b"{}")
    # mode 2: the full dense_bf16 header (the harness adds a zero data section)
    put("loader", "sthdr_dense_bf16", 2, json.dumps(header, separators=(",", ":")))
    th, _ = st_parts(os.path.join(MODELS, "tied_f16", "model.safetensors"))
    put("loader", "sthdr_tied_f16", 2, json.dumps(th, separators=(",", ":")))
    # mode 3: shard index over the dense_bf16 weights
    names = sorted(k for k in header if k != "__metadata__")
    put("loader", "index_one_shard", 3, json.dumps(
        {"metadata": {"total_size": len(data)},
         "weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}))
    put("loader", "index_two_names", 3, json.dumps(
        {"weight_map": {k: ("model.safetensors" if i % 2 else "model-00001-of-00001.safetensors")
                        for i, k in enumerate(names)}}))


TARGETS = {"loader": loader}

if __name__ == "__main__":
    for t in sys.argv[1:] or TARGETS:
        TARGETS[t]()
