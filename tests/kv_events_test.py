"""kv_events_test: a consumer of a live server's KV-cache events.

Runs an agent-like workload (a shared system head, conversations that grow turn by turn, one
tenant with a cache_salt) through `deltaserve serve` with a small cache (device slabs, host
tier, KV pages all short, so checkpoints move to the host tier and are evicted), subscribes to
the events and checks, before every request:
  - every message is [topic, seq, batch], seq contiguous (gaps filled from the replay socket),
    every batch and event as vLLM's schema has them, each block name recomputed from its tokens
    and parent, no block stored twice or removed unheld, no child without its parent;
  - the view the events give equals the cache's own state: the depth the server reports as
    cached (usage.prompt_tokens_details.cached_tokens) is exactly the deepest checkpoint the
    events say is restorable for that prompt, and the blocks below it are all held;
and at the end that the replay socket returns the same batches byte for byte.
Prints PASS / FAIL lines (tests/run.sh)."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
import zmq  # noqa: E402

import kv_events_lib as kl  # noqa: E402

BUILD = os.environ.get("DS_BUILD", "build")
failures = 0


def report(name, ok, why=""):
    global failures
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)
    failures += not ok


def refusals():
    """A key vLLM does not have, another publisher, events without a prefix cache: one line."""
    binary = os.path.join(BUILD, "deltaserve")
    cases = [('{"enable_kv_cache_events": true, "colour": 1}', [], "unknown key 'colour'"),
             ('{"enable_kv_cache_events": true, "publisher": "nats"}', [], "publisher"),
             ('{"enable_kv_cache_events": true}', ["--no-enable-prefix-caching"], "prefix cache")]
    for cfg, extra, want in cases:
        r = subprocess.run([binary, "serve", "tests/fixtures/models/dense_bf16",
                            "--skip-tokenizer-init", "--kv-events-config", cfg] + extra,
                           capture_output=True, text=True, timeout=120)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        if r.returncode != 2 or len(lines) != 1 or want not in lines[0]:
            return "%s: exit %d, %r" % (cfg, r.returncode, lines[:3])
    return ""


def disk_restart():
    """The disk tier: checkpoints spill to files and are announced in DISK; a restarted server
    announces the files it finds (through the replay socket for a late subscriber), and a
    prompt restores exactly what those events promise."""
    d = tempfile.mkdtemp(prefix="ds-kvev-disk-")
    flags = ["--snapshot-slabs", "2", "--disk-cache-dir", d, "--disk-cache-gib", "0.01"]
    convs = [[(11 * c + 5 * i + 1) % 250 for i in range(70)] for c in range(3)]
    srv = None
    try:
        srv = kl.Server(BUILD, flags)
        ctx = zmq.Context()
        sub = kl.Subscriber(ctx, *srv.endpoints())
        for t in convs:
            kl.sync(srv, sub)
            srv.complete(t, max_tokens=3)
        kl.sync(srv, sub)
        spilled = any(k[3] == "DISK" for k in sub.view.states)
        sub.close()
        ctx.term()
        if srv.stop() != 0:
            return "the first server's exit status"
        if not spilled:
            return "no checkpoint reached the disk (DISK events: none)"
        srv = kl.Server(BUILD, flags)
        ctx = zmq.Context()
        sub = kl.Subscriber(ctx, *srv.endpoints())
        files = srv.metric("disk_cache_files")
        sub.pump(lambda v: sum(k[3] == "DISK" for k in v.states) >= files)
        if not files or sum(k[3] == "DISK" for k in sub.view.states) != files:
            return "%s files, %d DISK states announced" % (
                files, sum(k[3] == "DISK" for k in sub.view.states))
        why = ""
        for t in convs:
            prompt = t + [7, 7, 7]
            kl.sync(srv, sub)
            want = sub.view.restorable(prompt)
            got = srv.complete(prompt, max_tokens=2)["usage"]["prompt_tokens_details"]
            if got["cached_tokens"] != want or want == 0:
                why = "restored %d, the DISK events promised %d" % (got["cached_tokens"], want)
                break
        sub.close()
        ctx.term()
        rc = srv.stop()
        return why or ("" if rc == 0 and not srv.sanitizer_report() else "exit status %d" % rc)
    except (kl.SchemaError, OSError, RuntimeError) as e:
        return str(e)
    finally:
        if srv is not None and srv.p.poll() is None:  # a failure above: no server left behind
            srv.p.kill()
            srv.p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    why = refusals()
    report("kv_events_config_refused", not why, why)
    srv = kl.Server(BUILD, ["--snapshot-slabs", "4", "--host-cache-gib", "0.0001",
                            "--kv-cache-tokens", "1024", "--max-num-seqs", "4"])
    ctx = zmq.Context()
    pub, rep = srv.endpoints()
    sub = kl.Subscriber(ctx, pub, rep)
    checked, hits, why = 0, 0, ""
    try:
        system = [(7 * i + 3) % 250 for i in range(40)]
        convs = [{"toks": list(system), "salt": None, "seed": s} for s in range(3)]
        convs.append({"toks": list(system), "salt": "tenant-a", "seed": 0})  # same tokens
        for k in range(2):  # one-off requests: their checkpoints are evicted whole later
            convs.append({"toks": [], "salt": None, "seed": 100 + k, "once": True})
        for turn in range(6):
            for c in convs:
                n_user = 50 if c.get("once") else 18
                user = [(c["seed"] * 31 + turn * 17 + i * 5) % 250 for i in range(n_user)]
                prompt = ([] if c.get("once") else c["toks"]) + user
                kl.sync(srv, sub)
                want = sub.view.restorable(prompt, c["salt"])
                r = srv.complete(prompt, max_tokens=5, salt=c["salt"])
                got = r["usage"]["prompt_tokens_details"]["cached_tokens"]
                if got != want:
                    raise kl.SchemaError("turn %d: the server restored %d tokens, the events "
                                         "promised %d" % (turn, got, want))
                if not sub.view.holds_blocks(prompt, got, c["salt"]):
                    raise kl.SchemaError("restored blocks the events do not hold")
                hits += got > 0
                checked += 1
                out = [t for t in r["choices"][0]["token_ids"] if t != 256]
                c["toks"] = prompt + out
        kl.sync(srv, sub)
    except (kl.SchemaError, OSError, RuntimeError) as e:
        why = str(e)
    v = sub.view
    report("kv_events_schema_and_order", not why or "restored" not in why, why)
    report("kv_events_match_the_cache", not why and checked == 36 and hits >= 12,
           why or "checked %d requests, %d hits" % (checked, hits))
    report("kv_events_tiers_and_evictions",
           "CPU" in v.media and v.counts["BlockRemoved"] > 0 and
           v.counts["DeltaServeStateRemoved"] > 0,
           "media %s, counts %s" % (sorted(v.media), v.counts))
    # the replay socket: everything again, byte for byte, then from the middle
    try:
        all_ = sub.replay(0)
        mid = v.next_seq // 2
        part = sub.replay(mid)
        ok = [q for q, _ in all_] == list(range(v.next_seq)) and \
            all(v.payloads[q] == p for q, p in all_) and [q for q, _ in part] == \
            list(range(mid, v.next_seq))
        report("kv_events_replay", ok, "replayed %d of %d batches" % (len(all_), v.next_seq))
    except kl.SchemaError as e:
        report("kv_events_replay", False, str(e))
    print("kv_events: %d batches, %s" % (v.next_seq, v.counts))
    # the publisher's counters on /metrics: every batch and event the subscriber saw, none lost
    for _ in range(100):  # the publisher thread counts a batch after sending it
        m = {k: srv.metric("kv_events_%s_total" % k)
             for k in ("published", "batches", "dropped", "replays")}
        if m["batches"] >= v.next_seq:
            break
        time.sleep(0.1)
    report("kv_events_metrics", m["batches"] == v.next_seq and m["dropped"] == 0 and
           m["published"] == sum(v.counts.values()) and m["replays"] >= 2,
           "%s; the subscriber saw %d batches, %d events" % (m, v.next_seq,
                                                              sum(v.counts.values())))
    sub.close()
    ctx.term()
    rc = srv.stop()
    bad = srv.sanitizer_report()
    report("kv_events_server_exit", rc == 0 and not bad,
           "exit status %s%s" % (rc, (", " + bad) if bad else ""))


if __name__ == "__main__":
    main()
    why = disk_restart()
    report("kv_events_disk_restart", not why, why)
    sys.exit(1 if failures else 0)
