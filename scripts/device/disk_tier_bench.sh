#!/usr/bin/env bash
# disk_tier_bench.sh — the disk tier's numbers (docs/disk-cache.md): the time to first token of a
# long-prefix prompt cold, warm from memory, restored from --disk-cache-dir after a clean restart
# (SIGTERM writes the checkpoints; the files are then dropped from the page cache, as after a
# reboot), and cold after a restart on an empty directory; the checkpoint files' write and read
# bandwidth against the disk's own limit (dd with O_DIRECT on the same filesystem).
#
#   On the GPU machine, after scripts/device/check.sh built build-cuda (one call, ~4 minutes):
#       bash scripts/device/disk_tier_bench.sh
#       bash scripts/device/disk_tier_bench.sh --shapes 4b,27b
#   Here, on the CPU (the tiny bench shape, a short prefix; under a minute):
#       bash scripts/device/disk_tier_bench.sh --cpu
# Flags: --shapes LIST (4b, 27b or a config.json path; default 4b; CPU: tiny), --prefix N
# (prompt tokens; 12500, CPU 2500), --dir DIR (the disk cache's parent folder, on the local
# disk; /tmp/ds-disk-bench), --bin PATH (build-cuda/deltaserve, CPU build/deltaserve),
# --budget-s S (230: a shape that would not fit what is left is skipped), --dd-gib G (1).
# Models are --load-format dummy: random weights of the shape, made at start from a fixed seed
# (the same at every start, so the restart's model identity matches); token-id prompts
# (--skip-tokenizer-init). Every wait is on an event (/health, the process's exit, /metrics)
# under a ceiling. Writes $OUT/disk-tier-<date>-<commit>.json and .md and the servers' log
# lines ($OUT/disk-tier-logs.txt).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
MODE=cuda
ARGS=()
for a in "$@"; do
  if [ "$a" = --cpu ]; then MODE=cpu; else ARGS+=("$a"); fi
done
if [ $MODE = cuda ]; then
  OUT=${OUT:-/tmp/ds-disk-bench-out}
  mkdir -p "$OUT"
  # the Debian libraries check.sh unpacked (libzmq's own dependencies are not on its runpath)
  export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # no binary yet (check.sh not run in this tree): build it as bench.sh does; --bin skips this
  if [[ " $* " != *" --bin"* ]] && [ ! -x build-cuda/deltaserve ]; then
    . scripts/device/deb_prefix.sh
    ds_deb_prefix
    make CUDA=1 -j"$(nproc)" build-cuda/deltaserve >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  fi
else
  OUT=${OUT:-/tmp/ds-disk-bench-cpu}
fi
mkdir -p "$OUT"
COMMIT=${DS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
[[ "$COMMIT" =~ ^[0-9a-f]{7,40}$ ]] || COMMIT=unknown
export OUT MODE COMMIT
exec python3 - "${ARGS[@]}" <<'PY'
import argparse, json, os, re, shutil, signal, socket, subprocess, sys, time, urllib.request

MODE, OUT, COMMIT = os.environ["MODE"], os.environ["OUT"], os.environ["COMMIT"]
ap = argparse.ArgumentParser(prog="disk_tier_bench.sh")
ap.add_argument("--shapes", default="tiny" if MODE == "cpu" else "4b")
ap.add_argument("--prefix", type=int, default=2500 if MODE == "cpu" else 12500)
ap.add_argument("--dir", default="/tmp/ds-disk-bench")
ap.add_argument("--bin", default="build/deltaserve" if MODE == "cpu" else "build-cuda/deltaserve")
ap.add_argument("--budget-s", type=float, default=230)
ap.add_argument("--dd-gib", type=float, default=1)
a = ap.parse_args()
T0 = time.monotonic()
left = lambda: a.budget_s - (time.monotonic() - T0)
SHAPES = {"4b": "scripts/device/qwen35-4b-shape.json", "27b": "scripts/device/qwen35-27b-shape.json",
          "tiny": "scripts/bench/tiny-config.json"}
LOGS = []  # (title, text) for disk-tier-logs.txt

def say(*x):
    print(f"[{time.monotonic() - T0:6.1f} s]", *x, flush=True)

def mb_s(b, s):
    return round(b / s / 1e6, 1) if b and s and s > 0 else None

# ---- the disk's own limit: dd with O_DIRECT, on the filesystem of the cache directory ----------
def dd_limit():
    os.makedirs(a.dir, exist_ok=True)
    f = os.path.join(a.dir, "dd-test.bin")
    count = max(1, int(a.dd_gib * 1024 / 16))
    res = {"bytes": count * 16 << 20, "file": f}
    for what, cmd in (("write", ["dd", "if=/dev/zero", f"of={f}", "bs=16M", f"count={count}", "oflag=direct", "conv=fsync"]),
                      ("read", ["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"])):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            m = re.search(r"(\d+) bytes.*copied, ([\d.,]+) s", p.stderr)
            if p.returncode == 0 and m:
                s = float(m.group(2).replace(",", "."))
                res[what + "_s"] = s
                res[what + "_MB_s"] = mb_s(int(m.group(1)), s)
            else:
                res[what + "_error"] = p.stderr.strip()[-200:]
        except subprocess.TimeoutExpired:
            res[what + "_error"] = "timed out (120 s)"
    try:
        os.unlink(f)
    except OSError:
        pass
    res["filesystem"] = subprocess.run(["df", "-hT", a.dir], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    return res

# ---- one server -------------------------------------------------------------------------------
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

def http(port, path, body=None, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()

def metrics(port):
    _, t = http(port, "/metrics", timeout=30)
    m = {}
    for line in t.splitlines():
        if line.startswith("deltaserve:disk_cache") or line.startswith("deltaserve:prefix_cache"):
            k, _, v = line.rpartition(" ")
            try:
                m[k.split("{")[0].replace("deltaserve:", "")] = float(v)
            except ValueError:
                pass
    return m

HARD = a.budget_s + 120  # past it a start is given up, so that the report is still written

def start_ceiling():
    return max(30.0, min(300.0, HARD - (time.monotonic() - T0)))

class Server:
    def __init__(self, model, cache_dir, gib, tag):
        self.port, self.tag = free_port(), tag
        self.log_path = os.path.join(WORK, f"serve-{tag}.log")
        flags = ["serve", "--model", model, "--port", str(self.port), "--load-format", "dummy",
                 "--skip-tokenizer-init", "--served-model-name", "m", "--max-num-seqs", "4",
                 "--max-model-len", str(max(4096, a.prefix + 64)),
                 "--disk-cache-dir", cache_dir, "--disk-cache-gib", f"{gib:g}", "--disable-log-stats"]
        flags += ["--device", "cpu", "--threads", "1"] if MODE == "cpu" else ["--device", "cuda"]
        self.log = open(self.log_path, "w")
        self.t_start = time.monotonic()
        self.p = subprocess.Popen([a.bin] + flags, stdin=subprocess.DEVNULL, stdout=self.log,
                                  stderr=subprocess.STDOUT)
        self.ready_s = None

    def text(self):
        return open(self.log_path, errors="replace").read()

    def wait_healthy(self, ceiling):
        while time.monotonic() - self.t_start < ceiling:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.tag}: server exited with {self.p.returncode}: {self.text()[-600:]}")
            try:
                if http(self.port, "/health", timeout=5)[0] == 200:
                    self.ready_s = round(time.monotonic() - self.t_start, 2)
                    return
            except OSError:
                pass
            time.sleep(0.05)  # a poll interval, not a correctness wait
        raise RuntimeError(f"{self.tag}: /health not ready in {ceiling} s: {self.text()[-600:]}")

    def stop(self, ceiling=240):
        """SIGTERM (a clean stop: the checkpoints in memory are written); the exit code and the
        time from the signal to the process's exit."""
        t = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=ceiling)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = f"killed after {ceiling} s"
            self.p.wait()
        s = round(time.monotonic() - t, 3)
        self.log.close()
        LOGS.append((self.tag, "\n".join(l for l in self.text().splitlines()
                                          if re.search(r"disk cache|prefix cache|request id|error|warn|model |weights|listening", l, re.I))))
        return rc, s

def complete(srv, prompt):
    """One token (the request's time is its TTFT, client side); the server's ttft_ms from its
    request log line; cached tokens from usage."""
    n_logged = srv.text().count("request id=")
    t = time.monotonic()
    st, body = http(srv.port, "/v1/completions",
                    {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
                     "return_token_ids": True, "logprobs": 1})
    ms = (time.monotonic() - t) * 1e3
    j = json.loads(body)
    ch = j["choices"][0]
    out = {"client_ms": round(ms, 1), "status": st,
           "cached_tokens": (j.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0),
           "prompt_tokens": j.get("usage", {}).get("prompt_tokens"), "token_ids": ch.get("token_ids"),
           "logprobs": (ch.get("logprobs") or {}).get("token_logprobs")}
    # the request line is logged at the end of the request: wait for it (event), ceiling 10 s
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = re.findall(r"request id=.*", srv.text())
        if len(lines) > n_logged:
            m = re.search(r"ttft_ms=([\d.]+)", lines[-1])
            out["server_ttft_ms"] = float(m.group(1)) if m else None
            break
        time.sleep(0.05)
    return out

def ckpt_files(d):
    fs = []
    for n in os.listdir(d) if os.path.isdir(d) else []:
        if n.endswith(".ckpt"):
            st = os.stat(os.path.join(d, n))
            fs.append((st.st_mtime_ns, st.st_size, n))
    return sorted(fs)

def drop_page_cache(d):
    """Drops the files from the page cache (POSIX_FADV_DONTNEED, no root needed): the restart
    then reads them from the disk, as after a reboot."""
    n = 0
    for _, _, name in ckpt_files(d):
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n

def resident_bytes(d):
    """fincore's count of the files' bytes in the page cache (None without fincore)."""
    names = [os.path.join(d, f[2]) for f in ckpt_files(d)]
    if not names or not shutil.which("fincore"):
        return None
    p = subprocess.run(["fincore", "-b", "-n", "-o", "RES"] + names, capture_output=True, text=True)
    return sum(int(x) for x in p.stdout.split() if x.isdigit()) if p.returncode == 0 else None

# ---- one shape ----------------------------------------------------------------------------------
def run_shape(name):
    cfg_path = SHAPES.get(name, name)
    cfg = json.load(open(cfg_path))
    model = os.path.join(WORK, f"model-{os.path.basename(cfg_path).replace('.json', '')}")
    os.makedirs(model, exist_ok=True)
    shutil.copy(cfg_path, os.path.join(model, "config.json"))
    vocab = cfg["vocab_size"]
    span = min(vocab - 200, 50000)
    prompt = [100 + (i * 7919) % span for i in range(a.prefix)]
    d1, d2 = os.path.join(a.dir, f"{name}-cache"), os.path.join(a.dir, f"{name}-empty")
    for d in (d1, d2):
        shutil.rmtree(d, ignore_errors=True)
    free_gib = shutil.disk_usage(a.dir).free / 2**30
    gib = max(1.0, min(32.0, free_gib * 0.5))
    r = {"shape": cfg_path, "prefix_tokens": a.prefix, "disk_cache_gib": round(gib, 2), "phases": {}}
    ph = r["phases"]

    say(f"{name}: server A (empty {d1})")
    s = Server(model, d1, gib, f"{name}-A")
    try:
        s.wait_healthy(start_ceiling())
        ph["A_start_s"] = s.ready_s
        ph["cold"] = complete(s, prompt)
        ph["warm_memory"] = complete(s, prompt)
        ph["A_metrics_before_stop"] = metrics(s.port)
    finally:
        rc, stop_s = s.stop()
    files = ckpt_files(d1)
    tot = sum(f[1] for f in files)
    w = {"exit_code": rc, "sigterm_to_exit_s": stop_s, "files": len(files), "bytes": tot,
         "file_bytes": [f[1] for f in files],
         "tmp_left": sum(n.endswith(".tmp") for n in os.listdir(d1)) if os.path.isdir(d1) else None}
    # The server has no write counter that outlives it: the shutdown's writes are measured from
    # the files. The writer stamps each file's mtime after its data is written (before fsync),
    # strictly increasing: files 2..n over the span of the stamps is the writer's steady rate
    # (payload hash + write + fsync + rename); all bytes over SIGTERM -> exit bounds it below.
    if len(files) >= 2:
        span_s = (files[-1][0] - files[0][0]) / 1e9
        w["steady_MB_s_from_mtimes"] = mb_s(tot - files[0][1], span_s)
        w["mtime_span_s"] = round(span_s, 3)
    w["MB_s_sigterm_to_exit"] = mb_s(tot, stop_s)
    r["shutdown_write"] = w
    # spills while A ran (a checkpoint evicted from memory), if any: the server's own counters
    am = ph["A_metrics_before_stop"]
    wb, ws = am.get("disk_cache_write_bytes_total", 0), am.get("disk_cache_write_seconds_sum", 0)
    r["runtime_spill_write"] = {"files": am.get("disk_cache_writes_total", 0), "bytes": wb, "seconds": ws,
                                "MB_s": mb_s(wb, ws)}
    say(f"{name}: A stopped rc={rc} in {stop_s} s; {len(files)} files, {tot / 1e6:.1f} MB")
    r["page_cache_dropped_files"] = drop_page_cache(d1)
    r["page_cache_resident_bytes_after_drop"] = resident_bytes(d1)

    say(f"{name}: server B (restart on {d1})")
    s = Server(model, d1, gib, f"{name}-B")
    try:
        s.wait_healthy(start_ceiling())
        ph["B_start_s"] = s.ready_s
        m = re.search(r"disk cache .*?: (\d+) checkpoints \(([\d.]+) MiB\) restorable", s.text())
        ph["B_restorable_at_start"] = int(m.group(1)) if m else None
        ph["B_metrics_at_start"] = metrics(s.port)
        ph["disk_restore"] = complete(s, prompt)
        mm = metrics(s.port)
        ph["B_metrics_after"] = mm
        ph["after_disk_restore_again"] = complete(s, prompt)
    finally:
        rc_b, stop_b = s.stop()
    ph["B_stop"] = {"exit_code": rc_b, "sigterm_to_exit_s": stop_b}
    rb, rs = mm.get("disk_cache_read_bytes_total", 0), mm.get("disk_cache_read_seconds_sum", 0)
    r["restore_read"] = {"bytes": rb, "seconds": rs, "MB_s": mb_s(rb, rs),
                         "source": "/metrics disk_cache_read_bytes_total over disk_cache_read_seconds_sum "
                                   "(the reader thread's read + payload hash)"}
    say(f"{name}: B stopped rc={rc_b}; disk restore {ph['disk_restore']}")

    say(f"{name}: server C (restart on an empty {d2})")
    s = Server(model, d2, gib, f"{name}-C")
    try:
        s.wait_healthy(start_ceiling())
        ph["C_start_s"] = s.ready_s
        ph["cold_after_restart"] = complete(s, prompt)
    finally:
        rc_c, stop_c = s.stop()
    ph["C_stop"] = {"exit_code": rc_c, "sigterm_to_exit_s": stop_c}
    for d in (d1, d2):
        shutil.rmtree(d, ignore_errors=True)

    ok = []
    dr, cold = ph["disk_restore"], ph["cold"]
    checks = {
        "clean_exits": rc == 0 and rc_b == 0 and rc_c == 0,
        "files_written_at_shutdown": len(files) > 0 and w["tmp_left"] == 0,
        "files_restorable_after_restart (model identity matched)": (ph["B_restorable_at_start"] or 0) > 0
            and ph["B_metrics_at_start"].get("disk_cache_errors_total", 1) == 0,
        "cold_has_no_cached_tokens": cold["cached_tokens"] == 0 and ph["cold_after_restart"]["cached_tokens"] == 0,
        "warm_memory_hit": ph["warm_memory"]["cached_tokens"] > 0,
        "disk_hit_in_metrics": mm.get("disk_cache_hits_total", 0) >= 1,
        "disk_hit_in_usage": dr["cached_tokens"] > 0,
        # the same checkpoint and the same one-token step: bit-identical to the memory hit
        "disk_restore_same_token_and_logprob_as_memory_hit": dr["token_ids"] is not None
            and (dr["token_ids"], dr["logprobs"]) == (ph["warm_memory"]["token_ids"], ph["warm_memory"]["logprobs"]),
    }
    # the cold run computed the last token inside its prefill, not as a one-token step: on a GPU
    # a near tie of random weights may flip it, so this one is reported, not checked
    r["cold_token_same_as_disk_restore"] = dr["token_ids"] == cold["token_ids"]
    r["checks"] = checks
    return r

WORK = os.path.join(a.dir, "work")
os.makedirs(WORK, exist_ok=True)
res = {"commit": COMMIT, "mode": MODE, "bin": a.bin, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
       "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip() if shutil.which("nvidia-smi") else None}
say("dd: the disk's limit with O_DIRECT")
res["disk_limit_dd"] = dd_limit()
say(f"dd: {res['disk_limit_dd']}")
res["shapes"] = {}
# a shape's three starts, requests and stops; the 4B one takes about 90 s on an H200
need = {"4b": 100, "27b": 100, "tiny": 20}
for name in a.shapes.split(","):
    if left() < need.get(name, 100):
        res["shapes"][name] = {"skipped": f"{left():.0f} s of the budget left"}
        say(f"{name}: skipped ({left():.0f} s left)")
        continue
    try:
        res["shapes"][name] = run_shape(name)
    except Exception as e:  # the report is still written
        res["shapes"][name] = {"error": str(e)[-800:]}
        say(f"{name}: error: {e}")
res["total_s"] = round(time.monotonic() - T0, 1)

stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
base = os.path.join(OUT, f"disk-tier-{stamp}-{COMMIT[:12]}")
json.dump(res, open(base + ".json", "w"), indent=2)
dd = res["disk_limit_dd"]
md = [f"# Disk tier ({MODE}, commit {COMMIT[:12]}, {res['gpu'] or 'no GPU'}, {res['date']})", "",
      f"dd O_DIRECT on `{a.dir}`: write {dd.get('write_MB_s')} MB/s, read {dd.get('read_MB_s')} MB/s "
      f"({dd['bytes'] / 2**30:g} GiB)", ""]
all_ok = True
for name, r in res["shapes"].items():
    if "phases" not in r:
        md += [f"## {name}: {r}", ""]
        all_ok = False
        continue
    ph, w, rd = r["phases"], r["shutdown_write"], r["restore_read"]
    row = lambda k, label: (f"| {label} | {ph[k]['client_ms']} | {ph[k].get('server_ttft_ms')} | "
                            f"{ph[k]['cached_tokens']} |")
    ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
    md += [f"## {name}: {r['prefix_tokens']}-token prompt", "",
           "| TTFT | client ms | server ttft_ms | cached tokens |", "|---|---|---|---|",
           row("cold", "cold (first sight)"), row("warm_memory", "warm, from memory"),
           row("disk_restore", "after restart, from disk (page cache dropped)"),
           row("after_disk_restore_again", "again after the disk restore"),
           row("cold_after_restart", "after restart, empty disk dir"), "",
           f"Shutdown writes: {w['files']} files, {w['bytes'] / 1e6:.1f} MB, SIGTERM to exit {w['sigterm_to_exit_s']} s "
           f"({w['MB_s_sigterm_to_exit']} MB/s); writer's steady rate from the files' mtimes "
           f"{w.get('steady_MB_s_from_mtimes')} MB/s (ratio to dd write "
           f"{ratio(w.get('steady_MB_s_from_mtimes'), dd.get('write_MB_s'))}). No server counter outlives "
           f"the shutdown, so these come from file sizes and times.",
           f"TTFT after a restart: from disk {ph['disk_restore']['client_ms']} ms against cold "
           f"{ph['cold_after_restart']['client_ms']} ms ({ratio(ph['cold_after_restart']['client_ms'], ph['disk_restore']['client_ms'])}x); "
           f"the cold run's token {'matches' if r['cold_token_same_as_disk_restore'] else 'differs from'} the restored one's.", "",
           f"Restore read (from /metrics, reader thread read + hash): {rd['bytes'] / 1e6:.1f} MB in "
           f"{rd['seconds']:.3f} s = {rd['MB_s']} MB/s (ratio to dd read {ratio(rd['MB_s'], dd.get('read_MB_s'))}).",
           (f"Spills while A ran (server counters): {r['runtime_spill_write']['files']:g} files, "
            f"{r['runtime_spill_write']['bytes'] / 1e6:.1f} MB, {r['runtime_spill_write']['MB_s']} MB/s."
            if r["runtime_spill_write"]["files"] else "No spills while A ran (all checkpoints fit in memory)."),
           f"Starts (to /health): A {ph['A_start_s']} s, B {ph['B_start_s']} s, C {ph['C_start_s']} s; "
           f"B found {ph['B_restorable_at_start']} restorable checkpoints; the files' bytes in the page cache "
           f"before B started: {r['page_cache_resident_bytes_after_drop']} (fincore).", "",
           "Checks: " + ", ".join(f"{k}: {'ok' if v else 'FAIL'}" for k, v in r["checks"].items()), ""]
    all_ok &= all(r["checks"].values())
md.append(f"Total {res['total_s']} s.")
open(base + ".md", "w").write("\n".join(md) + "\n")
with open(os.path.join(OUT, "disk-tier-logs.txt"), "w") as f:
    for t, x in LOGS:
        f.write(f"==== {t}\n{x}\n")
shutil.rmtree(WORK, ignore_errors=True)
print("\n".join(md))
print(f"json: {base}.json")
sys.exit(0 if all_ok else 1)
PY
