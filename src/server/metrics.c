#include "server/metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

#define METRICS_MAX_BUCKETS 24

static const struct {
  const char *name, *help;
  int n;
  double le[METRICS_MAX_BUCKETS];
} hist_def[METRICS_N_HIST] = {
    [METRICS_TTFT] = {"time_to_first_token_seconds",
                      "Histogram of time to first token in seconds.",
                      20,
                      {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                       0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0}},
    [METRICS_ITL] = {"inter_token_latency_seconds",
                     "Histogram of inter-token latency in seconds.",
                     19,
                     {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                      1.0, 2.5, 5.0, 10.0, 20.0, 80.0}},
    [METRICS_E2E] = {"e2e_request_latency_seconds",
                     "Histogram of end-to-end request latency in seconds.",
                     20,
                     {0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,   5.0,
                      10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0}},
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

struct metrics {
  pthread_mutex_t mu;
  char *model_name; /* label value, escaped */
  hist h[METRICS_N_HIST];
  unsigned long long finished[N_REASONS];
  unsigned long long rejected[N_REJECTED + 1]; /* last: any other status */
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

metrics *metrics_new(const char *model_name) {
  metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->model_name = escape_label(model_name ? model_name : "");
  if (!m->model_name) {
    free(m);
    return NULL;
  }
  pthread_mutex_init(&m->mu, NULL);
  return m;
}

void metrics_free(metrics *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m->model_name);
  free(m);
}

void metrics_observe(metrics *m, metrics_hist which, double seconds) {
  if (!m || which < 0 || which >= METRICS_N_HIST) return;
  if (!(seconds >= 0)) seconds = 0;
  int b = 0;
  while (b < hist_def[which].n && seconds > hist_def[which].le[b]) b++;
  pthread_mutex_lock(&m->mu);
  m->h[which].bucket[b]++;
  m->h[which].count++;
  m->h[which].sum += seconds;
  pthread_mutex_unlock(&m->mu);
}

void metrics_request_finished(metrics *m, const char *reason) {
  if (!m) return;
  int i = 0;
  while (i < N_REASONS - 1 && strcmp(reason, finish_reasons[i])) i++;
  pthread_mutex_lock(&m->mu);
  m->finished[i]++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_request_rejected(metrics *m, int status) {
  if (!m) return;
  int i = 0;
  while (i < N_REJECTED && rejected_statuses[i] != status) i++;
  pthread_mutex_lock(&m->mu);
  m->rejected[i]++;
  pthread_mutex_unlock(&m->mu);
}

static void head(strbuf *b, const char *name, const char *type, const char *help) {
  strbuf_printf(b, "# HELP deltaserve:%s %s\n# TYPE deltaserve:%s %s\n", name, help, name, type);
}

static void gauge(strbuf *b, const metrics *m, const char *name, const char *help, double v) {
  head(b, name, "gauge", help);
  strbuf_printf(b, "deltaserve:%s{model_name=\"%s\"} %.17g\n", name, m->model_name, v);
}

static void counter(strbuf *b, const metrics *m, const char *name, const char *help, long long v) {
  head(b, name, "counter", help);
  strbuf_printf(b, "deltaserve:%s{model_name=\"%s\"} %lld\n", name, m->model_name, v);
}

/* A summary without quantiles: _sum and _count. */
static void summary(strbuf *b, const metrics *m, const char *name, const char *help, double sum,
                    long long count) {
  head(b, name, "summary", help);
  strbuf_printf(b, "deltaserve:%s_sum{model_name=\"%s\"} %.9g\n", name, m->model_name, sum);
  strbuf_printf(b, "deltaserve:%s_count{model_name=\"%s\"} %lld\n", name, m->model_name, count);
}

char *metrics_render(metrics *m, const engine_stats *s) {
  metrics c; /* a consistent copy */
  pthread_mutex_lock(&m->mu);
  memcpy(c.h, m->h, sizeof c.h);
  memcpy(c.finished, m->finished, sizeof c.finished);
  memcpy(c.rejected, m->rejected, sizeof c.rejected);
  pthread_mutex_unlock(&m->mu);
  c.model_name = m->model_name;

  strbuf b;
  strbuf_init(&b);
  if (s) {
    gauge(&b, &c, "num_requests_running", "Number of requests in model execution batches.",
          s->num_running);
    gauge(&b, &c, "num_requests_waiting", "Number of requests waiting to be processed.",
          s->num_waiting);
    counter(&b, &c, "prompt_tokens_total", "Number of prompt tokens processed.",
            s->prompt_tokens_total);
    counter(&b, &c, "generation_tokens_total", "Number of generation tokens processed.",
            s->generation_tokens_total);
    counter(&b, &c, "prompt_tokens_computed_total",
            "Number of prompt tokens actually computed (not restored from the prefix cache).",
            s->prefilled_tokens_total);
    counter(&b, &c, "num_preemptions_total", "Number of preemptions by recompute.", s->preemptions);
    counter(&b, &c, "engine_requests_finished_total", "Requests the engine finished.",
            s->requests_finished);
    counter(&b, &c, "engine_requests_cancelled_total", "Requests the engine cancelled.",
            s->requests_cancelled);
    counter(&b, &c, "engine_requests_failed_total", "Requests the engine failed.",
            s->requests_failed);
    gauge(&b, &c, "kv_pages_total", "KV cache pages in the pool.", s->kv_pages_total);
    gauge(&b, &c, "kv_pages_used", "KV cache pages in use by running requests.", s->kv_pages_used);
    gauge(&b, &c, "kv_pages_cached", "KV cache pages held only by the prefix cache.",
          s->kv_pages_cached);
    gauge(&b, &c, "kv_cache_usage_perc", "KV cache usage (1 means 100 percent).",
          s->kv_pages_total > 0 ? (double)s->kv_pages_used / s->kv_pages_total : 0.0);
    gauge(&b, &c, "state_slots_total", "Recurrent-state slots for running sequences.",
          s->slots_total);
    gauge(&b, &c, "state_slots_used", "Recurrent-state slots in use.", s->slots_used);
    gauge(&b, &c, "state_slot_usage_perc", "State slot usage (1 means 100 percent).",
          s->slots_total > 0 ? (double)s->slots_used / s->slots_total : 0.0);
    gauge(&b, &c, "snapshot_slabs_total", "Prefix-cache snapshot slabs.", s->snapshot_slabs_total);
    gauge(&b, &c, "snapshot_slabs_used", "Prefix-cache snapshot slabs holding a checkpoint.",
          s->snapshot_slabs_used);
    counter(&b, &c, "prefix_cache_queries_total", "Prefix-cache lookups.", s->prefix_queries);
    counter(&b, &c, "prefix_cache_hits_total", "Prefix-cache lookups that restored a checkpoint.",
            s->prefix_hits);
    counter(&b, &c, "prefix_cache_hit_tokens_total",
            "Prompt tokens restored from the prefix cache.", s->prefix_hit_tokens);
    counter(&b, &c, "prefix_cache_captures_total", "Checkpoints captured.", s->prefix_captures);
    counter(&b, &c, "prefix_cache_capture_failures_total", "Checkpoint captures that failed.",
            s->prefix_capture_failures);
    counter(&b, &c, "prefix_cache_evictions_total", "Checkpoints evicted.", s->prefix_evictions);
    counter(&b, &c, "prefix_cache_restore_failures_total", "Checkpoint restores that failed.",
            s->prefix_restore_failures);
    summary(&b, &c, "checkpoint_capture_seconds",
            "Device time of checkpoint captures (slot to slab copies), a pause between two steps.",
            s->ckpt_capture_ms_sum * 1e-3, s->ckpt_captures_timed);
    summary(&b, &c, "checkpoint_restore_seconds",
            "Device time of checkpoint restores (slab to slot, with the copy-on-write page), a "
            "pause between two steps.",
            s->ckpt_restore_ms_sum * 1e-3, s->ckpt_restores_timed);
    gauge(&b, &c, "max_model_len", "Longest sequence (prompt + generation) served.",
          s->max_model_len);
  }
  for (int k = 0; k < METRICS_N_HIST; k++) {
    head(&b, hist_def[k].name, "histogram", hist_def[k].help);
    unsigned long long cum = 0;
    for (int i = 0; i <= hist_def[k].n; i++) {
      cum += c.h[k].bucket[i];
      if (i < hist_def[k].n)
        strbuf_printf(&b, "deltaserve:%s_bucket{le=\"%g\",model_name=\"%s\"} %llu\n",
                      hist_def[k].name, hist_def[k].le[i], c.model_name, cum);
      else
        strbuf_printf(&b, "deltaserve:%s_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n",
                      hist_def[k].name, c.model_name, cum);
    }
    strbuf_printf(&b, "deltaserve:%s_sum{model_name=\"%s\"} %.9g\n", hist_def[k].name, c.model_name,
                  c.h[k].sum);
    strbuf_printf(&b, "deltaserve:%s_count{model_name=\"%s\"} %llu\n", hist_def[k].name,
                  c.model_name, c.h[k].count);
  }
  head(&b, "request_success_total", "counter", "Finished requests by finish reason.");
  for (int i = 0; i < N_REASONS; i++)
    strbuf_printf(
        &b, "deltaserve:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %llu\n",
        finish_reasons[i], c.model_name, c.finished[i]);
  head(&b, "request_rejected_total", "counter",
       "Requests answered with an error status before generation.");
  for (int i = 0; i <= N_REJECTED; i++) {
    if (i < N_REJECTED)
      strbuf_printf(&b, "deltaserve:request_rejected_total{status=\"%d\",model_name=\"%s\"} %llu\n",
                    rejected_statuses[i], c.model_name, c.rejected[i]);
    else
      strbuf_printf(&b,
                    "deltaserve:request_rejected_total{status=\"other\",model_name=\"%s\"} %llu\n",
                    c.model_name, c.rejected[i]);
  }
  return strbuf_take(&b);
}
