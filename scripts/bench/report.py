#!/usr/bin/env python3
"""report — turns `deltaserve bench` JSON (+ serve_load.mjs runs) into one merged JSON, a
Markdown report and PNG plots, and prints a short table last.

  python3 scripts/bench/report.py --bench BENCH.json [--serve LOAD.json ...] --out-prefix P
      writes P.json (the bench JSON with "serving": {label: run}), P.md,
      P-throughput.png (decode tok/s vs concurrency, ours and llama.cpp; serving output tok/s
      vs clients) and P-ttft.png (TTFT distribution of each serving run).

Plots need matplotlib (the GPU machine has it); without it, or with --no-plots, the PNGs are
skipped with a note and everything else is written. Standard library only otherwise.
"""
import argparse
import json
import math
import os
import sys

DECODE = [1, 8, 32, 64, 128]
PREFILL = [512, 4096, 16384]
HEADLINE = (
    [(f"decode_tok_s_{n}", "tok/s", f"decode, {n} seq, 512 in + 128 out") for n in DECODE]
    + [(f"prefill_tok_s_{n}", "tok/s", f"prefill, {n}-token prompt") for n in PREFILL]
    + [
        ("shared_prefix_8x12k_all_first_token_s", "s", "8 requests sharing an uncached 12.5k prefix: last first token"),
        ("warm_prefix_ttft_ms", "ms", "50-token suffix after the cached 12.5k prefix: TTFT"),
        ("capture_pause_ms", "ms", "checkpoint capture pause while 32 sequences decode"),
        ("restore_pause_ms", "ms", "checkpoint restore pause (+ copy-on-write page) while 32 sequences decode"),
        ("checkpoint_bytes", "B", "bytes one checkpoint owns (recurrent state)"),
    ]
)


def fmt(x, digits=4):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer()):
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.1f}"
    return f"{x:.{digits}g}"


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def merge(bench, serves):
    d = dict(bench)
    if serves:
        d["serving"] = {s.get("label", f"run{i}"): s for i, s in enumerate(serves)}
    return d


def markdown(d):
    m, peers, ratios = d.get("metrics", {}), d.get("peers", {}).get("metrics", {}), d.get("ratios", {})
    info = d.get("info", {})
    L = [f"# deltaserve bench {d.get('commit', '?')[:12]}", ""]
    L.append(f"- commit `{d.get('commit')}`, device **{d.get('gpu')}**, {d.get('date')}")
    L.append(f"- model `{info.get('model')}` ({info.get('model_type')}), backend {info.get('backend')}"
             + (", **--quick sizes (smoke test, not comparable)**" if info.get("quick") else ""))
    L.append(f"- peers: {d.get('peers', {}).get('source', '-')}")
    L.append("")
    L.append("## Headline")
    L.append("")
    rows = []
    for k, unit, what in HEADLINE:
        rows.append([f"`{k}`", what, fmt(m.get(k)), unit, fmt(peers.get(k)), fmt(ratios.get(k), 3)])
    L.append(md_table(["metric", "what", "deltaserve", "unit", "llama.cpp", "ours / llama.cpp"], rows))
    L.append("")
    L.append("Ratios above 1 are better for tok/s, below 1 for seconds. "
             f"Checkpoint pauses: {info.get('capture_source', '-')}.")
    L.append("")
    runs = info.get("decode_runs_tok_s")
    if runs:
        L.append("Decode figures are the median of repeated runs (tok/s of each run):")
        L.append("")
        L.append(md_table(["decode seqs", "runs"],
                          [[n, " / ".join(fmt(v) for v in runs.get(str(n), []))] for n in DECODE
                           if str(n) in runs]))
        L.append("")
    L.append("## Roofline (H200 ceilings: 4.24 TB/s copy, 780 TFLOP/s bf16 GEMM)")
    L.append("")
    rows = []
    for n in DECODE:
        rows.append([n, fmt(m.get(f"decode_bytes_per_step_{n}")), fmt(m.get(f"decode_ceiling_tok_s_{n}")),
                     fmt(m.get(f"decode_tok_s_{n}")), fmt(m.get(f"decode_roofline_frac_{n}"), 3),
                     fmt(m.get(f"decode_moved_bytes_per_step_{n}")),
                     fmt(m.get(f"decode_moved_ceiling_tok_s_{n}")),
                     fmt(m.get(f"decode_moved_roofline_frac_{n}"), 3)])
    L.append(md_table(["decode seqs", "bytes / step", "ceiling tok/s", "measured tok/s", "fraction",
                       "bytes moved / step", "its ceiling tok/s", "its fraction"], rows))
    L.append("")
    rows = []
    for n in PREFILL:
        rows.append([n, fmt(m.get(f"prefill_flops_per_token_{n}")), fmt(m.get(f"prefill_ceiling_tok_s_{n}")),
                     fmt(m.get(f"prefill_tok_s_{n}")), fmt(m.get(f"prefill_roofline_frac_{n}"), 3)])
    L.append(md_table(["prefill tokens", "FLOPs / token", "ceiling tok/s", "measured tok/s", "fraction"], rows))
    L.append("")
    if info.get("roofline_note"):
        L.append(f"Counting: {info['roofline_note']}.")
        L.append("")
    cb, cg = m.get("ceiling_copy_bytes_per_s"), m.get("ceiling_gemm_flops_per_s")
    if cb or cg:
        parts = []
        if cb:
            parts.append(f"copy {fmt(cb / 1e12, 3)} TB/s ({fmt(m.get('ceiling_copy_of_roofline_bw'), 3)} of 4.24)")
        if cg:
            parts.append(f"GEMM {fmt(cg / 1e12, 1)} TFLOP/s ({fmt(m.get('ceiling_gemm_of_roofline_flops'), 3)} of 780)")
        L.append("Ceilings measured in this run: " + ", ".join(parts) +
                 (f" — {info['ceilings_note']}." if info.get("ceilings_note") else "."))
        L.append("")
    ps = info.get("prefix_stats")
    if ps:
        L.append("## Prefix cache (engine stats during the prefix tests)")
        L.append("")
        keys = [k for k in ps.get("shared_wave", {}).keys()]
        rows = [[f"`{k}`", ps.get("shared_wave", {}).get(k, "-"), ps.get("warm", {}).get(k, "-")] for k in keys]
        L.append(md_table(["counter", "shared wave", "warm requests"], rows))
        L.append("")
        L.append(f"Shared wave: {fmt(m.get('shared_prefix_prefilled_tokens'))} prompt tokens computed, "
                 f"{fmt(m.get('shared_prefix_cached_tokens'))} restored; warm request: "
                 f"{fmt(m.get('warm_prefix_prefilled_tokens'))} computed, {fmt(m.get('warm_prefix_cached_tokens'))} restored.")
        L.append("")
    serving = d.get("serving") or {}
    if serving:
        L.append("## Serving (scripts/bench/serve_load.mjs, streaming /v1/completions)")
        L.append("")
        w = next(iter(serving.values())).get("workload", {})
        L.append(f"Workload: {w.get('prefix_tokens')}-token shared prefix, {w.get('suffix_min')}–{w.get('suffix_max')}-token "
                 f"unique suffix, {w.get('max_tokens')} output tokens (ignore_eos, greedy), "
                 f"{w.get('requests_per_client')} requests per client, levels capped at {w.get('level_time_s')} s.")
        L.append("")
        rows = []
        for label, run in serving.items():
            for lv in run.get("levels", []):
                rows.append([label, lv["clients"], lv["requests"], lv["errors"], fmt(lv.get("ttft_ms_p50")),
                             fmt(lv.get("ttft_ms_p99")), fmt(lv.get("itl_ms_p50")), fmt(lv.get("itl_ms_p99")),
                             fmt(lv.get("output_tok_s")), fmt(lv.get("cache_hit_rate_usage"), 3),
                             fmt(lv.get("cache_hit_rate_metrics"), 3)])
        L.append(md_table(["run", "clients", "requests", "errors", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
                           "ITL p99 ms", "output tok/s", "hit rate (usage)", "hit rate (/metrics)"], rows))
        L.append("")
    return "\n".join(L) + "\n"


def plots(d, prefix):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 — any import failure means no plots
        return [], f"no plots: matplotlib unavailable ({e.__class__.__name__})"
    m, peers = d.get("metrics", {}), d.get("peers", {}).get("metrics", {})
    serving = d.get("serving") or {}
    written = []
    fig, axes = plt.subplots(1, 2 if serving else 1, figsize=(12 if serving else 6, 4.5), squeeze=False)
    ax = axes[0][0]
    xs = [n for n in DECODE if isinstance(m.get(f"decode_tok_s_{n}"), (int, float))]
    ax.plot(xs, [m[f"decode_tok_s_{n}"] for n in xs], "o-", label="deltaserve")
    px = [n for n in DECODE if f"decode_tok_s_{n}" in peers]
    ax.plot(px, [peers[f"decode_tok_s_{n}"] for n in px], "s--", label="llama.cpp (anchors)")
    cx = [n for n in DECODE if isinstance(m.get(f"decode_ceiling_tok_s_{n}"), (int, float))]
    ax.plot(cx, [m[f"decode_ceiling_tok_s_{n}"] for n in cx], ":", color="gray", label="bandwidth ceiling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent sequences (512 in + 128 out)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Offline decode throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if serving:
        ax = axes[0][1]
        for label, run in serving.items():
            lv = run.get("levels", [])
            ax.plot([x["clients"] for x in lv], [x.get("output_tok_s") or 0 for x in lv], "o-", label=label)
        ax.set_xlabel("clients")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Serving, shared-prefix workload")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    p = f"{prefix}-throughput.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    if serving:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, run in serving.items():
            for lv in run.get("levels", []):
                v = sorted(lv.get("ttft_ms") or [])
                if not v:
                    continue
                ax.step(v, [(i + 1) / len(v) for i in range(len(v))], where="post",
                        label=f"{label}, {lv['clients']} clients")
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("Time to first token (CDF)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = f"{prefix}-ttft.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written, None


def short_table(d):
    m, ratios = d.get("metrics", {}), d.get("ratios", {})
    lines = [f"=== deltaserve bench {d.get('commit', '?')[:12]} on {d.get('gpu')} ===",
             f"{'metric':<40} {'value':>12} {'vs llama.cpp':>13}"]
    for k, unit, _ in HEADLINE:
        lines.append(f"{k:<40} {fmt(m.get(k)):>12} {fmt(ratios.get(k), 3):>13}")
    for label, run in (d.get("serving") or {}).items():
        for lv in run.get("levels", []):
            lines.append(f"serve {label:<9} {lv['clients']:>3} clients: TTFT p50 {fmt(lv.get('ttft_ms_p50'))} ms, "
                         f"ITL p50 {fmt(lv.get('itl_ms_p50'))} ms, {fmt(lv.get('output_tok_s'))} tok/s, "
                         f"hit {fmt(lv.get('cache_hit_rate_usage'), 3)}, errors {lv['errors']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--serve", action="append", default=[])
    ap.add_argument("--out-prefix", required=True)
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    with open(a.bench) as f:
        bench = json.load(f)
    serves = []
    for p in a.serve:
        try:
            with open(p) as f:
                serves.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"report: skipping {p}: {e}", file=sys.stderr)
    d = merge(bench, serves)
    os.makedirs(os.path.dirname(os.path.abspath(a.out_prefix)), exist_ok=True)
    with open(a.out_prefix + ".json", "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")
    written, note = ([], "no plots: --no-plots") if a.no_plots else plots(d, a.out_prefix)
    md = markdown(d)
    if written:
        md += "\n" + "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in written) + "\n"
    elif note:
        md += f"\n({note})\n"
    with open(a.out_prefix + ".md", "w") as f:
        f.write(md)
    for p in [a.out_prefix + ".json", a.out_prefix + ".md"] + written:
        print(f"report: wrote {p}", file=sys.stderr)
    if note:
        print(f"report: {note}", file=sys.stderr)
    print(short_table(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
