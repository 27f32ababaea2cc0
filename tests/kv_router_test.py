"""kv_router_test: a cache-aware router over CPU replicas, steered by their KV-cache events.

Three `deltaserve serve` replicas of the CPU fixture model on loopback, an agent-like load
(agents with their own system + tools head, each turn appending the model's output and a tool
result), sent one request at a time in an interleaved order, twice on fresh replicas:
  round-robin   request i to replica i mod 3;
  cache-aware   each request to the replica whose events say it can restore the deepest
                prefix (DeltaServeStateStored: a hybrid model restores only at checkpoints),
                ties to the replica with the fewest requests so far.
The hit rate is what the replicas report (usage.prompt_tokens_details.cached_tokens over the
prompt tokens). The cache-aware router must beat round-robin. Prints PASS / FAIL lines."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
import zmq  # noqa: E402

import kv_events_lib as kl  # noqa: E402

BUILD = os.environ.get("DS_BUILD", "build")
N_REPLICAS, N_AGENTS, N_TURNS = 3, 5, 6


def workload():
    """(agent, turn) in the order an agent fleet sends them: every agent's turn t, then t+1."""
    return [(a, t) for t in range(N_TURNS) for a in range(N_AGENTS)]


def run(policy):
    servers = [kl.Server(BUILD, ["--max-num-seqs", "4"]) for _ in range(N_REPLICAS)]
    ctx = zmq.Context()
    subs = [kl.Subscriber(ctx, *s.endpoints()) for s in servers]
    hist = {a: [(a * 13 + i * 7) % 250 for i in range(48)] for a in range(N_AGENTS)}
    load = [0] * N_REPLICAS
    cached = prompt_tokens = 0
    try:
        for i, (a, t) in enumerate(workload()):
            tool = [(a * 41 + t * 23 + k * 3) % 250 for k in range(20)]
            prompt = hist[a] + tool
            if policy == "round-robin":
                r = i % N_REPLICAS
            else:
                for s, sub in zip(servers, subs):
                    kl.sync(s, sub)
                depth = [sub.view.restorable(prompt) for sub in subs]
                r = max(range(N_REPLICAS), key=lambda k: (depth[k], -load[k], -k))
            load[r] += 1
            out = servers[r].complete(prompt, max_tokens=6)
            cached += out["usage"]["prompt_tokens_details"]["cached_tokens"]
            prompt_tokens += out["usage"]["prompt_tokens"]
            hist[a] = prompt + [x for x in out["choices"][0]["token_ids"] if x != 256]
    finally:
        for sub in subs:
            sub.close()
        ctx.term()
        for s in servers:
            rc = s.stop()
            bad = s.sanitizer_report()
            if rc != 0 or bad:
                raise RuntimeError("a replica exited with %s%s" % (rc, (", " + bad) if bad else ""))
    return cached, prompt_tokens, load


def main():
    try:
        rr = run("round-robin")
        ca = run("cache-aware")
    except (RuntimeError, OSError, kl.SchemaError) as e:
        print("FAIL kv_router_hit_rate: %s" % str(e).split("\n")[0], flush=True)
        return False
    rate = lambda x: x[0] / x[1]  # noqa: E731
    print("kv_router: round-robin hit rate %.3f (%d of %d prompt tokens), cache-aware %.3f "
          "(%d of %d), requests per replica %s vs %s" %
          (rate(rr), rr[0], rr[1], rate(ca), ca[0], ca[1], rr[2], ca[2]))
    ok = rate(ca) > rate(rr) and min(ca[2]) > 0
    print(("PASS kv_router_hit_rate" if ok else
           "FAIL kv_router_hit_rate: cache-aware %.3f, round-robin %.3f, load %s" %
           (rate(ca), rate(rr), ca[2])), flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
