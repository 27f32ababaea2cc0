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


def tokenizer():
    texts = {
        "empty": "",
        "hello": "Hello, world! How are you doing today?",
        "code": "def f(x):\n    return x ** 2  # square\n\tprint(f(3))\r\n",
        "numbers": "In 2024 there were 1,234,567.89 apples and 42 pears; 3.14159e-10.",
        "cjk": "\u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\ud55c\uad6d\uc5b4",
        "emoji": "\U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 ok",
        "special": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "tool": "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|endoftext|>",
        "spaces": "a  b   c    d\n\n\n   \t\t x   ",
        "accents": "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947",
        "nfd": "cafe\u0301 A\u030a",
        "contractions": "I'm you're he's we'll they'd it's DON'T",
    }
    for k, v in texts.items():
        put("tokenizer", "text_" + k, 0, v)
    put("tokenizer", "text_invalid", 0, b"abc\xff\xfe \xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80")
    put("tokenizer", "text_nul", 0, b"a\x00b")
    # ids: 3 bytes each, little-endian
    def ids(lst):
        return b"".join(struct.pack("<I", i)[:3] for i in lst)
    put("tokenizer", "ids_ascii", 1, ids([9707, 11, 1879, 0, 1, 2, 151643, 151644, 151645]))
    put("tokenizer", "ids_bytes", 1, ids([157, 158, 159, 160, 161, 170, 171, 200, 220, 250]))
    put("tokenizer", "ids_oob", 1, ids([5, 151680, 7]))


def chat():
    convs = json.load(open(os.path.join(ROOT, "tests", "fixtures", "chat", "conversations.json")))
    for i, c in enumerate(convs):
        req = json.dumps(c["request"], ensure_ascii=False)
        # render: bit 1 = Qwen3.5 family, bit 2 = add_generation_prompt; alternate families
        put("chat", "render_%02d_%s" % (i, c["name"][:40]), 4 | (2 if i % 2 else 0), req)
    put("chat", "render_not_object", 0, "[1, 2.5, \"x\", null, true, {\"a\": {}}]")
    texts = {
        "plain": "The answer is 42.",
        "think": "<think>\nLet me think about it.\n</think>\n\nThe answer is 42.",
        "think_open_only": "reasoning without the opening tag\n</think>\n\nok",
        "json_call": "I will call it.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
        "json_two_calls": "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"parameters\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
        "xml_call": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
        "xml_unclosed": "<think>\nhm\n</think>\n<tool_call>\n<function=search>\n<parameter=q>\nx < y\n</parameter>\n</function>",
        "broken": "<tool_call>\n{\"name\": \n</tool_call> tail <thi",
        "utf8_cut": "caf\u00e9 \u4f60\u597d <tool_",
    }
    for i, (k, v) in enumerate(texts.items()):
        b = 1 | (2 if i % 3 == 1 else 0) | (4 if i % 2 else 0)
        put("chat", "parse_" + k, b, v)
    put("chat", "parse_cut_bytes", 1 | 4, b"abc \xe4\xbd")


def openai_request():
    convs = json.load(open(os.path.join(ROOT, "tests", "fixtures", "chat", "conversations.json")))
    for i, c in enumerate(convs[:12]):
        req = dict(c["request"])
        req["model"] = "m"
        put("openai_request", "chat_%02d" % i, 0, json.dumps(req, ensure_ascii=False))
    m = [{"role": "developer", "content": "be brief"},
         {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    put("openai_request", "chat_sampling", 0, json.dumps({
        "model": "m", "messages": m, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
        "presence_penalty": 0.5, "frequency_penalty": 0.1, "repetition_penalty": 1.1, "seed": 7,
        "max_completion_tokens": 32, "stop": ["\n\n", "END"], "stop_token_ids": [151645],
        "logprobs": True, "top_logprobs": 5, "stream": True, "stream_options": {"include_usage": True},
        "n": 1, "ignore_eos": False, "skip_special_tokens": False, "include_stop_str_in_output": True,
        "cache_salt": "abc", "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False, "add_generation_prompt": True}}))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    put("openai_request", "chat_tools_named", 0, json.dumps({
        "model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    put("openai_request", "chat_tool_round", 0, json.dumps({
        "model": "m", "tools": tools, "tool_choice": "auto", "messages": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}))
    put("openai_request", "chat_stop_string", 0, json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                              "stop": "x", "tool_choice": "none", "tools": tools}))
    put("openai_request", "comp_text", 1, json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 16,
                                                       "echo": True, "logprobs": 2, "temperature": 0, "stop": ["."]}))
    put("openai_request", "comp_ids", 1, json.dumps({"prompt": [1, 2, 3, 151643], "return_token_ids": True,
                                                      "max_tokens": 4, "stream": True}))
    put("openai_request", "comp_nested", 1, json.dumps({"prompt": [[7, 8]], "seed": 123456789012}))
    put("openai_request", "comp_list_text", 1, json.dumps({"prompt": ["only one"], "top_k": -1}))
    put("openai_request", "tok_prompt", 2, json.dumps({"model": "m", "prompt": "hello world", "add_special_tokens": True}))
    put("openai_request", "tok_messages", 2, json.dumps({"messages": m, "add_generation_prompt": False, "tools": tools,
                                                          "chat_template_kwargs": {"enable_thinking": True}}))
    put("openai_request", "detok", 3, json.dumps({"model": "m", "tokens": [9707, 11, 1879]}))
    put("openai_request", "detok_empty", 3, json.dumps({"tokens": []}))
    put("openai_request", "invalid_json", 0, "{\"messages\": [")


def jinja():
    # mode 1: the real chat templates over fuzz_jinja's fixed chat context
    tdir = os.path.join(ROOT, "tests", "fixtures", "jinja", "templates")
    for fn in sorted(os.listdir(tdir)):
        put("jinja", "tmpl_" + fn[:-len(".jinja")][:40], 1, open(os.path.join(tdir, fn), "rb").read())
    # mode 0: one construct each, with a JSON context after the NUL
    units = json.load(open(os.path.join(ROOT, "tests", "fixtures", "jinja", "units.json")))
    for u in units[::6]:
        put("jinja", "unit_" + u["name"][:40], 0,
            u["template"].encode("utf-8") + b"\0" + json.dumps(u["context"]).encode("utf-8"))


TARGETS = {"loader": loader, "tokenizer": tokenizer, "chat": chat, "openai_request": openai_request,
           "jinja": jinja}

if __name__ == "__main__":
    for t in sys.argv[1:] or TARGETS:
        TARGETS[t]()
