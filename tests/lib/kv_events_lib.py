"""kv_events_lib: what a cache-aware router needs from a deltaserve replica's KV-cache events.

The block names (docs/kv-events.md, written independently of src/cache/block_hash.c), a
decoder of vLLM's wire format that checks every batch against vLLM's KVEventBatch schema
(vllm/distributed/kv_events.py, array_like msgspec structs) and keeps the replica's view, the
replay socket's protocol, and a server launcher for the tests. Needs Debian's python3-zmq and
python3-msgpack (run with /usr/bin/python3)."""
import json
import os
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import msgpack
import zmq

BLOCK = 16
FNV_OFFSET, FNV_PRIME, M64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a64(data, h=FNV_OFFSET):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & M64
    return h


def block_hash(parent, tokens, salt=None):
    """parent (u64 LE) | n (u32 LE) | tokens (u32 LE each) | salt length (u32 LE) | salt."""
    s = (salt or "").encode()
    data = struct.pack("<QI", parent, len(tokens)) + struct.pack("<%dI" % len(tokens), *tokens)
    return fnv1a64(data + struct.pack("<I", len(s)) + s)


def block_chain(tokens, salt=None):
    """The names of the full blocks of a prompt; the salt enters through the first one."""
    out, h = [], 0
    for k in range(len(tokens) // BLOCK):
        h = block_hash(h, tokens[k * BLOCK:(k + 1) * BLOCK], salt if k == 0 else None)
        out.append(h)
    return out


def state_hash(tokens, salt=None):
    """The prefix_hash of a DeltaServeStateStored after these tokens."""
    chain = block_chain(tokens, salt)
    tail = tokens[len(chain) * BLOCK:]
    h = chain[-1] if chain else 0
    return block_hash(h, tail, None if chain else salt) if tail else h


class SchemaError(Exception):
    pass


def _need(cond, what):
    if not cond:
        raise SchemaError(what)


def _u64(x):
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= M64


MEDIA = ("GPU", "CPU", "DISK")


class View:
    """One replica's cache as its events describe it, each event checked on the way in."""

    def __init__(self):
        self.blocks = {}  # (hash, medium) -> token ids
        self.states = {}  # (prefix_hash, position, salt, medium) -> True
        self.next_seq = 0
        self.payloads = {}  # seq -> payload bytes
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0,
                       "DeltaServeStateStored": 0, "DeltaServeStateRemoved": 0}
        self.gpu_state_stored = 0
        self.media = set()

    def batch(self, seq, payload):
        """One [topic, seq, payload] message's seq and payload; must be the next in order."""
        _need(seq == self.next_seq, "seq %d, expected %d" % (seq, self.next_seq))
        self.next_seq += 1
        self.payloads[seq] = payload
        b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        # KVEventBatch(array_like): [ts: float, events: list, data_parallel_rank: int | None]
        _need(isinstance(b, list) and len(b) in (2, 3), "batch is not [ts, events, dp_rank]")
        _need(isinstance(b[0], float) and isinstance(b[1], list) and b[1], "batch ts / events")
        _need(len(b) == 2 or b[2] is None or isinstance(b[2], int), "data_parallel_rank")
        ours = [isinstance(e, list) and e and str(e[0]).startswith("DeltaServe") for e in b[1]]
        _need(all(ours) or not any(ours), "a batch mixes vLLM and DeltaServe events")
        for e in b[1]:
            self.event(e)

    def event(self, e):
        _need(isinstance(e, list) and e and isinstance(e[0], str), "event is not a tagged array")
        tag = e[0]
        _need(tag in self.counts, "unknown tag %r" % tag)
        self.counts[tag] += 1
        if tag == "BlockStored":
            # [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
            #  lora_name, extra_keys?]
            _need(len(e) in (8, 9), "BlockStored has %d fields" % len(e))
            hashes, parent, toks, bs, lora_id, medium, lora_name = e[1:8]
            extra = e[8] if len(e) == 9 else None
            _need(isinstance(hashes, list) and hashes and all(map(_u64, hashes)), "block_hashes")
            _need(parent is None or _u64(parent), "parent_block_hash")
            _need(bs == BLOCK and isinstance(toks, list) and len(toks) == BLOCK * len(hashes),
                  "token_ids / block_size")
            _need(lora_id is None and lora_name is None, "lora")
            _need(medium in MEDIA, "medium %r" % medium)
            salt = None
            if extra is not None:
                _need(parent is None and isinstance(extra, list) and len(extra) == len(hashes),
                      "extra_keys")
                _need(isinstance(extra[0], list) and len(extra[0]) == 1, "salt extra key")
                salt = extra[0][0]
            if parent is not None:
                _need((parent, medium) in self.blocks, "parent of a stored block not held")
            h = 0 if parent is None else parent
            for k, bh in enumerate(hashes):
                want = block_hash(h, toks[k * BLOCK:(k + 1) * BLOCK],
                                  salt if (k == 0 and parent is None) else None)
                _need(bh == want, "block hash %x, recomputed %x" % (bh, want))
                _need((bh, medium) not in self.blocks, "block stored twice in %s" % medium)
                self.blocks[(bh, medium)] = toks[k * BLOCK:(k + 1) * BLOCK]
                h = bh
            self.media.add(medium)
        elif tag == "BlockRemoved":  # [tag, block_hashes, medium]
            _need(len(e) == 3 and isinstance(e[1], list) and e[1] and e[2] in MEDIA,
                  "BlockRemoved fields")
            for bh in e[1]:
                _need((bh, e[2]) in self.blocks, "removed a block not held")
                del self.blocks[(bh, e[2])]
        elif tag == "AllBlocksCleared":
            _need(len(e) == 1, "AllBlocksCleared fields")
            self.blocks.clear()
            self.states.clear()
        else:  # [tag, prefix_hash, position, cache_salt, medium]
            _need(len(e) == 5 and _u64(e[1]) and isinstance(e[2], int) and e[2] > 0 and
                  (e[3] is None or isinstance(e[3], str)) and e[4] in MEDIA, "state fields")
            key = (e[1], e[2], e[3], e[4])
            if tag == "DeltaServeStateStored":
                _need(key not in self.states, "state stored twice")
                self.states[key] = True
                self.gpu_state_stored += e[4] == "GPU"
                self.media.add(e[4])
            else:
                _need(key in self.states, "removed a state not held")
                del self.states[key]

    def restorable(self, prompt, salt=None):
        """The deepest checkpoint a prompt would restore (depth <= len - 1), by the events."""
        best = 0
        for (h, pos, s, _m) in self.states:
            if s == salt and pos <= len(prompt) - 1 and pos > best and \
                    state_hash(prompt[:pos], salt) == h:
                best = pos
        return best

    def holds_blocks(self, prompt, n, salt=None):
        """1 when the first n tokens' full blocks are all held in some medium."""
        names = block_chain(prompt[:n], salt)
        return all(any((h, m) in self.blocks for m in MEDIA) for h in names)


class Subscriber:
    """SUB on a replica's events plus a DEALER on its replay socket; gaps are filled by replay."""

    def __init__(self, ctx, pub, replay, topic=b"kv", view=None):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.connect(pub)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.req = ctx.socket(zmq.DEALER)
        self.req.connect(replay)
        self.topic = topic
        self.view = view or View()

    def replay(self, start, upto=None):
        """Replays from start: (seq, payload) list, in order, up to the end marker."""
        self.req.send_multipart([b"", struct.pack(">Q", start)])
        out = []
        while True:
            if not self.req.poll(10000):
                raise SchemaError("no answer from the replay socket")
            empty, seq, payload = self.req.recv_multipart()
            _need(empty == b"" and len(seq) == 8, "replay frame")
            if seq == b"\xff" * 8:
                _need(payload == b"", "end marker payload")
                return out
            q = struct.unpack(">Q", seq)[0]
            if upto is None or q < upto:
                out.append((q, payload))

    def _catch_up(self, upto=None):
        for q, p in self.replay(self.view.next_seq, upto):
            if q >= self.view.next_seq:
                self.view.batch(q, p)

    def pump(self, until, ceiling=30.0):
        """Receives until until(view) holds; after a quiet 0.5 s, asks the replay socket."""
        t0 = time.time()
        quiet = 0
        while not until(self.view):
            if time.time() - t0 > ceiling:
                raise SchemaError("events did not arrive in %.0f s" % ceiling)
            if not self.sub.poll(100):
                quiet += 1
                if quiet % 5 == 0:
                    self._catch_up()
                continue
            self._take()

    def _take(self):
        """One message from the PUB socket into the view (in order, gaps from the replay)."""
        topic, seq, payload = self.sub.recv_multipart()
        _need(topic == self.topic and len(seq) == 8, "message is not [topic, seq, payload]")
        q = struct.unpack(">Q", seq)[0]
        if q < self.view.next_seq:
            return  # had it from the replay socket
        if q > self.view.next_seq:
            self._catch_up(q)
        self.view.batch(q, payload)

    def settle(self, quiet=0.5):
        """Receives until nothing has come for `quiet` seconds, then whatever the replay socket
        still holds past the view."""
        while self.sub.poll(int(quiet * 1000)):
            self._take()
        self._catch_up()

    def close(self):
        self.sub.close(0)
        self.req.close(0)


def sync(srv, sub):
    """Waits until the server is idle, every capture it counted has arrived as an event (each
    commit is one DeltaServeStateStored on the GPU) and the stream has gone quiet (a checkpoint
    restored from the disk also takes a device copy, a GPU DeltaServeStateStored that is not a
    capture), so that the view is the cache."""
    for _ in range(600):
        if srv.metric("num_requests_running") == 0:
            want = srv.metric("prefix_cache_captures_total")
            sub.pump(lambda v: v.gpu_state_stored >= want)
            sub.settle()
            if srv.metric("num_requests_running") == 0 and \
                    srv.metric("prefix_cache_captures_total") == want:
                return
        time.sleep(0.05)
    raise SchemaError("the server never went idle")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """deltaserve serve on loopback with the CPU fixture model and KV-cache events."""

    def __init__(self, build, extra=(), model="tests/fixtures/models/dense_bf16"):
        self.pub, self.rep = free_port(), free_port()
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": "tcp://*:%d" % self.pub, "replay_endpoint": "tcp://*:%d" % self.rep,
               "topic": "kv"}
        args = [os.path.join(build, "deltaserve"), "serve", model, "--skip-tokenizer-init",
                "--device", "cpu", "--threads", "1", "--port", "0", "--kv-events-config",
                json.dumps(cfg)] + list(extra)
        self.p = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  text=True)
        self.log = []
        self.port = None
        t0 = time.time()
        while self.port is None:
            line = self.p.stderr.readline()
            if not line:
                raise RuntimeError("server exited: " + " | ".join(self.log[-5:]))
            self.log.append(line.strip())
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() - t0 > 120:
                raise RuntimeError("server did not start")
        self.model = os.path.basename(model)
        # the rest of stderr is read on, so that the server never blocks on a full pipe
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        for line in self.p.stderr:
            self.log.append(line.rstrip("\n"))

    def sanitizer_report(self):
        """The first line of an ASan / UBSan / LeakSanitizer report in the server's log, or None."""
        for line in self.log:
            if "Sanitizer" in line or "runtime error:" in line:
                return line
        return None

    def endpoints(self):
        return "tcp://127.0.0.1:%d" % self.pub, "tcp://127.0.0.1:%d" % self.rep

    def complete(self, prompt, max_tokens=4, salt=None):
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "return_token_ids": True}
        if salt:
            body["cache_salt"] = salt
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % self.port,
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def metric(self, name):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=30) as r:
            text = r.read().decode()
        total = None
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
            if m and m.group(1).endswith(name):
                total = (total or 0) + float(m.group(3))
        return total

    def stop(self):
        """Stops the server (SIGTERM) and returns its exit status."""
        self.p.terminate()
        try:
            rc = self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.reader.join(10)
        self.p.stderr.close()
        return rc
