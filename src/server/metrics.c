#include "server/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/kv_page.h"
#include "base/strbuf.h"

#define METRICS_MAX_BUCKETS 32

/* vLLM's buckets (vllm/v1/metrics/loggers.py), so that its dashboards' quantiles read the same */
#define TTFT_LE                                                                                 \
  {                                                                                             \
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, \
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0                                                  \
  }
#define ITL_LE                                                                                     \
  {                                                                                                \
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, \
        40.0, 80.0                                                                                 \
  }
#define REQUEST_LE                                                                           \
  {                                                                                          \
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, \
        240.0, 480.0, 960.0, 1920.0, 7680.0                                                  \
  }
#define PREFILL_TOKEN_LE \
  { 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0 }

typedef struct hist_def {
  const char *name, *help;
  int n; /* fixed bounds; 0: 1-2-5 up to max_model_len (set at metrics_new) */
  double le[METRICS_MAX_BUCKETS];
} hist_def;

static const hist_def hist_defs[METRICS_N_HIST] = {
    [METRICS_TTFT] = {"time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      22, TTFT_LE},
    [METRICS_ITL] = {"inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                     19, ITL_LE},
    [METRICS_TPOT] = {"time_per_output_token_seconds",
                      "Histogram of time per output token in seconds.", 19, ITL_LE},
    [METRICS_E2E] = {"e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     21, REQUEST_LE},
    [METRICS_QUEUE] = {"request_queue_time_seconds",
                       "Histogram of time spent in WAITING phase for request.", 21, REQUEST_LE},
    [METRICS_PREFILL] = {"request_prefill_time_seconds",
                         "Histogram of time spent in PREFILL phase for request.", 21, REQUEST_LE},
    [METRICS_DECODE] = {"request_decode_time_seconds",
                        "Histogram of time spent in DECODE phase for request.", 21, REQUEST_LE},
    [METRICS_INFERENCE] = {"request_inference_time_seconds",
                           "Histogram of time spent in RUNNING phase for request.", 21, REQUEST_LE},
    [METRICS_REQ_TPOT] = {"request_time_per_output_token_seconds",
                          "Histogram of time_per_output_token_seconds per request.", 19, ITL_LE},
    [METRICS_PREFILL_PER_TOKEN] = {"time_per_prefill_token_request_seconds",
                                   "Time spent per token during prefill phase in seconds", 10,
                                   PREFILL_TOKEN_LE},
    [METRICS_PROMPT_TOKENS] = {"request_prompt_tokens",
                               "Number of prefill tokens processed.",
                               0,
                               {0}},
    [METRICS_GEN_TOKENS] = {"request_generation_tokens",
                            "Number of generation tokens processed.",
                            0,
                            {0}},
    [METRICS_MAX_TOKENS] = {"request_params_max_tokens",
                            "Histogram of the max_tokens request parameter.",
                            0,
                            {0}},
    [METRICS_PARAMS_N] = {"request_params_n",
                          "Histogram of the n request parameter.",
                          5,
                          {1, 2, 5, 10, 20}},
    [METRICS_MAX_GEN_TOKENS] = {"request_max_num_generation_tokens",
                                "Histogram of maximum number of requested generation tokens.",
                                0,
                                {0}},
};

static const char *finish_reasons[] = {"stop", "length", "abort", "error"};
#define N_REASONS (int)(sizeof finish_reasons / sizeof finish_reasons[0])
static const int rejected_statuses[] = {400, 401, 404, 405, 413, 429, 500, 503};
#define N_REJECTED (int)(sizeof rejected_statuses / sizeof rejected_statuses[0])

typedef struct hist {
  unsigned long long bucket[METRICS_MAX_BUCKETS + 1]; /* last: +Inf */
  unsigned long long count;
  double sum;
} hist;

typedef struct counts {
  hist h[METRICS_N_HIST];
  unsigned long long finished[N_REASONS];
  unsigned long long rejected[N_REJECTED + 1]; /* last: any other status */
} counts;

struct metrics {
  pthread_mutex_t mu;
  char *prefix;     /* "deltaserve" or "vllm" */
  char *model_name; /* label value, escaped */
  char *labels;     /* `model_name="..."`, or `engine="0",model_name="..."` under vllm */
  metrics_opts o;
  int n_tok;                          /* the 1-2-5 token bounds */
  double tok_le[METRICS_MAX_BUCKETS]; /* vLLM's build_1_2_5_buckets(max_model_len) */
  counts c;
};

static char *escape_label(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(2 * n + 1);
  if (!o) return NULL;
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\\' || s[i] == '"')
      o[j++] = '\\', o[j++] = s[i];
    else if (s[i] == '\n')
      o[j++] = '\\', o[j++] = 'n';
    else
      o[j++] = s[i];
  }
  o[j] = 0;
  return o;
}

static char *dup_str(const char *s) {
  char *d = malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

metrics *metrics_new(const metrics_opts *o) {
  metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->o = *o;
  m->prefix = dup_str(o->prefix && o->prefix[0] ? o->prefix : "deltaserve");
  m->model_name = escape_label(o->model_name ? o->model_name : "");
  int vllm = m->prefix && !strcmp(m->prefix, "vllm");
  size_t ln = (m->model_name ? strlen(m->model_name) : 0) + 40;
  m->labels = malloc(ln);
  if (!m->prefix || !m->model_name || !m->labels) {
    free(m->prefix);
    free(m->model_name);
    free(m->labels);
    free(m);
    return NULL;
  }
  m->o.prefix = m->prefix;
  m->o.model_name = NULL;
  snprintf(m->labels, ln, "%smodel_name=\"%s\"", vllm ? "engine=\"0\"," : "", m->model_name);
  pthread_mutex_init(&m->mu, NULL);
  metrics_set_max_model_len(m, o->max_model_len);
  return m;
}

void metrics_set_max_model_len(metrics *m, int max_model_len) {
  static const int mant[] = {1, 2, 5};
  pthread_mutex_lock(&m->mu);
  m->o.max_model_len = max_model_len;
  m->n_tok = 0;
  for (double p = 1; m->n_tok < METRICS_MAX_BUCKETS; p *= 10) {
    int k = 0;
    for (; k < 3 && m->n_tok < METRICS_MAX_BUCKETS; k++) {
      if (mant[k] * p > max_model_len) break;
      m->tok_le[m->n_tok++] = mant[k] * p;
    }
    if (k < 3) break;
  }
  pthread_mutex_unlock(&m->mu);
}

void metrics_free(metrics *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m->prefix);
  free(m->model_name);
  free(m->labels);
  free(m);
}

/* under mu */
static void observe_locked(metrics *m, int k, double v) {
  if (!(v >= 0)) v = 0;
  int n = hist_defs[k].n ? hist_defs[k].n : m->n_tok, b = 0;
  const double *le = hist_defs[k].n ? hist_defs[k].le : m->tok_le;
  while (b < n && v > le[b]) b++;
  m->c.h[k].bucket[b]++;
  m->c.h[k].count++;
  m->c.h[k].sum += v;
}

void metrics_observe(metrics *m, metrics_hist k, double v) {
  if (!m || k < 0 || k >= METRICS_N_HIST) return;
  pthread_mutex_lock(&m->mu);
  observe_locked(m, k, v);
  pthread_mutex_unlock(&m->mu);
}

static int reason_index(const char *reason) {
  int i = 0;
  while (i < N_REASONS - 1 && strcmp(reason, finish_reasons[i])) i++;
  return i;
}

void metrics_request_done(metrics *m, const metrics_request *r) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->c.finished[reason_index(r->finish)]++;
  if (r->e2e >= 0) observe_locked(m, METRICS_E2E, r->e2e);
  if (r->queue >= 0) observe_locked(m, METRICS_QUEUE, r->queue);
  if (r->prefill >= 0) {
    observe_locked(m, METRICS_PREFILL, r->prefill);
    if (r->prompt_tokens > 0)
      observe_locked(m, METRICS_PREFILL_PER_TOKEN, r->prefill / r->prompt_tokens);
  }
  if (r->decode >= 0) {
    observe_locked(m, METRICS_DECODE, r->decode);
    if (r->generation_tokens > 1)
      observe_locked(m, METRICS_REQ_TPOT, r->decode / (r->generation_tokens - 1));
  }
  if (r->inference >= 0) observe_locked(m, METRICS_INFERENCE, r->inference);
  observe_locked(m, METRICS_PROMPT_TOKENS, r->prompt_tokens);
  observe_locked(m, METRICS_GEN_TOKENS, r->generation_tokens);
  if (r->max_tokens > 0) observe_locked(m, METRICS_MAX_TOKENS, r->max_tokens);
  pthread_mutex_unlock(&m->mu);
}

void metrics_request_finished(metrics *m, const char *reason) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->c.finished[reason_index(reason)]++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_request_rejected(metrics *m, int status) {
  if (!m) return;
  int i = 0;
  while (i < N_REJECTED && rejected_statuses[i] != status) i++;
  pthread_mutex_lock(&m->mu);
  m->c.rejected[i]++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_format_le(char *buf, size_t n, double v) {
  if (isinf(v)) {
    snprintf(buf, n, "+Inf");
    return;
  }
  /* the shortest form that reads back as v (Python's repr): positional from 1e-4 to 1e16,
   * with ".0" on an integral one */
  double a = fabs(v);
  if (a == 0 || (a >= 1e-4 && a < 1e16)) {
    int d = 0;
    for (; d <= 17; d++) {
      snprintf(buf, n, "%.*f", d, v);
      if (strtod(buf, NULL) == v) break;
    }
    if (d == 0) {
      size_t l = strlen(buf);
      if (l + 3 <= n) memcpy(buf + l, ".0", 3);
    }
    return;
  }
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, n, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
}

typedef struct out {
  strbuf *b;
  const metrics *m;
} out;

static void head(out *o, const char *name, const char *type, const char *help) {
  strbuf_printf(o->b, "# HELP %s:%s %s\n# TYPE %s:%s %s\n", o->m->prefix, name, help, o->m->prefix,
                name, type);
}

static void gauge(out *o, const char *name, const char *help, double v) {
  head(o, name, "gauge", help);
  strbuf_printf(o->b, "%s:%s{%s} %.17g\n", o->m->prefix, name, o->m->labels, v);
}

/* `name` without _total, as vLLM declares it: text format 0.0.4 names the family and its sample
 * `name_total` (as prometheus_client writes it) */
static void counter(out *o, const char *name, const char *help, long long v) {
  char t[96];
  snprintf(t, sizeof t, "%s_total", name);
  head(o, t, "counter", help);
  strbuf_printf(o->b, "%s:%s{%s} %lld\n", o->m->prefix, t, o->m->labels, v);
}

/* A summary without quantiles: _sum and _count. */
static void summary(out *o, const char *name, const char *help, double sum, long long count) {
  head(o, name, "summary", help);
  strbuf_printf(o->b, "%s:%s_sum{%s} %.9g\n", o->m->prefix, name, o->m->labels, sum);
  strbuf_printf(o->b, "%s:%s_count{%s} %lld\n", o->m->prefix, name, o->m->labels, count);
}

static void histogram(out *o, const char *name, const char *help, int n, const double *le,
                      const unsigned long long *bucket, unsigned long long count, double sum) {
  const metrics *m = o->m;
  int vllm = !strcmp(m->prefix, "vllm");
  head(o, name, "histogram", help);
  unsigned long long cum = 0;
  char l[40];
  for (int i = 0; i <= n; i++) {
    cum += bucket[i];
    metrics_format_le(l, sizeof l, i < n ? le[i] : INFINITY);
    strbuf_printf(o->b, "%s:%s_bucket{%sle=\"%s\",model_name=\"%s\"} %llu\n", m->prefix, name,
                  vllm ? "engine=\"0\"," : "", l, m->model_name, cum);
  }
  strbuf_printf(o->b, "%s:%s_sum{%s} %.9g\n", m->prefix, name, m->labels, sum);
  strbuf_printf(o->b, "%s:%s_count{%s} %llu\n", m->prefix, name, m->labels, count);
}

static void engine_series(out *o, const engine_stats *s) {
  const metrics *m = o->m;
  int vllm = !strcmp(m->prefix, "vllm");
  /* vLLM's series */
  gauge(o, "num_requests_running", "Number of requests in model execution batches.",
        s->num_running);
  gauge(o, "num_requests_waiting", "Number of requests waiting to be processed.", s->num_waiting);
  gauge(o, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
        s->kv_pages_total > 0 ? (double)s->kv_pages_used / s->kv_pages_total : 0.0);
  counter(o, "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
          s->prefix_query_tokens);
  counter(o, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
          s->prefix_hit_tokens);
  counter(o, "num_preemptions", "Cumulative number of preemption from the engine.", s->preemptions);
  counter(o, "prompt_tokens", "Number of prefill tokens processed.", s->prompt_tokens_total);
  counter(o, "generation_tokens", "Number of generation tokens processed.",
          s->generation_tokens_total);
  if (s->spec_k > 0) { /* vLLM's spec_decode counters, there with --speculative-config only */
    counter(o, "spec_decode_num_drafts", "Number of spec decoding drafts.", s->spec_num_drafts);
    counter(o, "spec_decode_num_draft_tokens", "Number of draft tokens.", s->spec_num_draft_tokens);
    counter(o, "spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            s->spec_num_accepted_tokens);
    head(o, "spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Accepted tokens per draft position.");
    for (int i = 0; i < s->spec_k && i < SPEC_MAX_TOKENS; i++)
      strbuf_printf(o->b,
                    "%s:spec_decode_num_accepted_tokens_per_pos_total{%s%sposition=\"%d\"} %lld\n",
                    m->prefix, m->labels, m->labels[0] ? "," : "", i, s->spec_accepted_per_pos[i]);
  }
  unsigned long long ib[ENGINE_STEP_TOKEN_BUCKETS + 1], icount = 0;
  double ile[ENGINE_STEP_TOKEN_BUCKETS];
  for (int i = 0; i <= ENGINE_STEP_TOKEN_BUCKETS; i++) {
    ib[i] = s->step_tokens_bucket[i] > 0 ? (unsigned long long)s->step_tokens_bucket[i] : 0;
    icount += ib[i];
    if (i < ENGINE_STEP_TOKEN_BUCKETS) ile[i] = engine_step_token_le[i];
  }
  histogram(o, "iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            ENGINE_STEP_TOKEN_BUCKETS, ile, ib, icount, (double)s->step_tokens_sum);
  /* vLLM's info gauge: its labels are the cache configuration (CacheConfig.metrics_info) */
  char gmu[40];
  metrics_format_le(gmu, sizeof gmu, m->o.gpu_memory_utilization);
  head(o, "cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  strbuf_printf(o->b,
                "%s:cache_config_info{block_size=\"%d\",cache_dtype=\"%s\","
                "enable_prefix_caching=\"%s\",%sgpu_memory_utilization=\"%s\","
                "num_gpu_blocks=\"%d\"} 1.0\n",
                m->prefix, KV_PAGE_TOKENS, m->o.cache_dtype ? m->o.cache_dtype : "auto",
                s->prefix_enabled ? "True" : "False", vllm ? "engine=\"0\"," : "", gmu,
                s->kv_pages_total);
  /* deltaserve's own */
  counter(o, "prompt_tokens_computed",
          "Number of prompt tokens actually computed (not restored from the prefix cache).",
          s->prefilled_tokens_total);
  counter(o, "engine_requests_finished", "Requests the engine finished.", s->requests_finished);
  counter(o, "engine_requests_cancelled", "Requests the engine cancelled.", s->requests_cancelled);
  counter(o, "engine_requests_failed", "Requests the engine failed.", s->requests_failed);
  gauge(o, "kv_pages_capacity", "KV cache pages in the pool.", s->kv_pages_total);
  gauge(o, "kv_pages_used", "KV cache pages in use by running requests.", s->kv_pages_used);
  gauge(o, "kv_pages_cached", "KV cache pages held only by the prefix cache.", s->kv_pages_cached);
  gauge(o, "state_slots_capacity", "Recurrent-state slots for running sequences.", s->slots_total);
  gauge(o, "state_slots_used", "Recurrent-state slots in use.", s->slots_used);
  gauge(o, "state_slot_usage_perc", "State slot usage (1 means 100 percent).",
        s->slots_total > 0 ? (double)s->slots_used / s->slots_total : 0.0);
  gauge(o, "snapshot_slabs_capacity", "Prefix-cache snapshot slabs.", s->snapshot_slabs_total);
  gauge(o, "snapshot_slabs_used", "Prefix-cache snapshot slabs holding a checkpoint.",
        s->snapshot_slabs_used);
  counter(o, "prefix_cache_lookups", "Prefix-cache lookups (one per admission).",
          s->prefix_queries);
  counter(o, "prefix_cache_restores", "Prefix-cache lookups that restored a checkpoint.",
          s->prefix_hits);
  counter(o, "prefix_cache_hit_tokens", "Prompt tokens restored from the prefix cache.",
          s->prefix_hit_tokens);
  counter(o, "prefix_cache_captures", "Checkpoints captured.", s->prefix_captures);
  counter(o, "prefix_cache_capture_failures", "Checkpoint captures that failed.",
          s->prefix_capture_failures);
  counter(o, "prefix_cache_evictions", "Checkpoints evicted.", s->prefix_evictions);
  counter(o, "prefix_cache_restore_failures", "Checkpoint restores that failed.",
          s->prefix_restore_failures);
  summary(o, "checkpoint_capture_seconds",
          "Device time of checkpoint captures (slot to slab copies), a pause between two steps.",
          s->ckpt_capture_ms_sum * 1e-3, s->ckpt_captures_timed);
  summary(o, "checkpoint_restore_seconds",
          "Device time of checkpoint restores (slab to slot, with the copy-on-write page), a "
          "pause between two steps.",
          s->ckpt_restore_ms_sum * 1e-3, s->ckpt_restores_timed);
  if (s->kv_events_enabled) { /* --kv-events-config (docs/kv-events.md) */
    counter(o, "kv_events_published", "KV-cache events queued for the publisher.",
            s->kv_events_events);
    counter(o, "kv_events_batches", "KV-cache event batches published.", s->kv_events_batches);
    counter(o, "kv_events_dropped",
            "KV-cache events dropped (queue overflow or out of memory; replaced by "
            "AllBlocksCleared).",
            s->kv_events_dropped);
    counter(o, "kv_events_replays", "Replay requests served.", s->kv_events_replays);
  }
  if (s->disk_enabled) { /* --disk-cache-dir (docs/disk-cache.md) */
    gauge(o, "disk_cache_bytes", "Bytes of checkpoint files in the disk cache (written or queued).",
          (double)s->disk_bytes);
    gauge(o, "disk_cache_capacity_bytes", "Byte budget of the disk cache (--disk-cache-gib).",
          (double)s->disk_budget_bytes);
    gauge(o, "disk_cache_files", "Checkpoint files in the disk cache.", s->disk_files);
    gauge(o, "disk_cache_write_queue", "Checkpoint files waiting for the writer thread.",
          s->disk_queued);
    counter(o, "disk_cache_hits", "Checkpoints restored from the disk cache.", s->disk_hits);
    counter(o, "disk_cache_declined",
            "Disk checkpoints not read: reading was measured slower than prefilling them.",
            s->disk_declined);
    counter(o, "disk_cache_writes", "Checkpoint files written.", s->disk_writes);
    counter(o, "disk_cache_spills", "Checkpoints moved from memory to the disk cache.",
            s->disk_spills);
    counter(o, "disk_cache_evictions", "Checkpoint files deleted for room (LRU).",
            s->disk_evictions);
    counter(o, "disk_cache_errors",
            "Checkpoint files refused: corrupt, truncated, another model or format, or a failed "
            "write or read (never restored).",
            s->disk_read_failures + s->disk_write_failures + s->disk_files_dropped);
    summary(o, "disk_cache_write_seconds", "Writer-thread time per checkpoint file (with fsync).",
            s->disk_write_s, s->disk_writes);
    summary(o, "disk_cache_read_seconds",
            "Time to read and check a checkpoint file on a restore (engine thread).",
            s->disk_read_s, s->disk_hits);
    counter(o, "disk_cache_write_bytes", "Bytes of checkpoint files written.",
            (long long)s->disk_write_bytes);
    counter(o, "disk_cache_read_bytes", "Bytes of checkpoint files read by restores.",
            (long long)s->disk_read_bytes);
  }
  gauge(o, "max_model_len", "Longest sequence (prompt + generation) served.", s->max_model_len);
}

char *metrics_render(metrics *m, const engine_stats *s) {
  counts c; /* a consistent copy */
  double tok_le[METRICS_MAX_BUCKETS];
  pthread_mutex_lock(&m->mu);
  c = m->c;
  int n_tok = m->n_tok;
  memcpy(tok_le, m->tok_le, sizeof tok_le);
  pthread_mutex_unlock(&m->mu);

  strbuf b;
  strbuf_init(&b);
  out o = {&b, m};
  if (s) engine_series(&o, s);
  for (int k = 0; k < METRICS_N_HIST; k++)
    histogram(&o, hist_defs[k].name, hist_defs[k].help, hist_defs[k].n ? hist_defs[k].n : n_tok,
              hist_defs[k].n ? hist_defs[k].le : tok_le, c.h[k].bucket, c.h[k].count, c.h[k].sum);
  head(&o, "request_success_total", "counter", "Count of successfully processed requests.");
  for (int i = 0; i < N_REASONS; i++)
    strbuf_printf(&b, "%s:request_success_total{%sfinished_reason=\"%s\",model_name=\"%s\"} %llu\n",
                  m->prefix, !strcmp(m->prefix, "vllm") ? "engine=\"0\"," : "", finish_reasons[i],
                  m->model_name, c.finished[i]);
  head(&o, "request_rejected_total", "counter",
       "Requests answered with an error status before generation.");
  for (int i = 0; i <= N_REJECTED; i++) {
    char st[16];
    if (i < N_REJECTED)
      snprintf(st, sizeof st, "%d", rejected_statuses[i]);
    else
      snprintf(st, sizeof st, "other");
    strbuf_printf(&b, "%s:request_rejected_total{%s,status=\"%s\"} %llu\n", m->prefix, m->labels,
                  st, c.rejected[i]);
  }
  return strbuf_take(&b);
}
