/* metrics — what /metrics reports, in the Prometheus text format (version 0.0.4).
 *
 * Names: `<prefix>:<name>` with the prefix `deltaserve` by default, or `vllm`
 * (--metrics-prefix): the series vLLM has carry its names, units, label names and histogram
 * buckets (vllm/v1/metrics/loggers.py), so that a vLLM dashboard or autoscaler reads them as
 * they are; with the `vllm` prefix every series also carries vLLM's `engine="0"` label. The
 * series only deltaserve has keep their names under either prefix.
 *
 * Sources: the engine's counters and gauges (engine_get_stats: running / waiting requests,
 * token counters, KV pages, state slots, snapshot slabs, the prefix cache, the step-token
 * histogram) and what only the server sees, kept here: the latency histograms
 *   time_to_first_token_seconds     submit -> first token event
 *   inter_token_latency_seconds     between consecutive token events of one request (also
 *   time_per_output_token_seconds   under vLLM's older name, as vLLM still reports both)
 *   e2e_request_latency_seconds     submit -> final event
 *   request_queue_time_seconds      submit -> the first step that fed it
 *   request_prefill_time_seconds    that step -> first token
 *   request_decode_time_seconds     first token -> last token
 *   request_inference_time_seconds  that step -> last token
 * the per-request token histograms, and finished-request counters by finish reason.
 * Observations take one mutex (a few additions); rendering copies under it. */
#ifndef DS_METRICS_H
#define DS_METRICS_H
#include "engine/engine.h"

typedef struct metrics metrics;

typedef enum {
  METRICS_TTFT,
  METRICS_ITL,
  METRICS_TPOT, /* time_per_output_token_seconds: the same intervals as METRICS_ITL */
  METRICS_E2E,
  METRICS_QUEUE,
  METRICS_PREFILL,
  METRICS_DECODE,
  METRICS_INFERENCE,
  METRICS_REQ_TPOT,          /* request_time_per_output_token_seconds: decode / (tokens - 1) */
  METRICS_PREFILL_PER_TOKEN, /* time_per_prefill_token_request_seconds: prefill / prompt */
  METRICS_PROMPT_TOKENS,     /* request_prompt_tokens */
  METRICS_GEN_TOKENS,        /* request_generation_tokens */
  METRICS_MAX_TOKENS,        /* request_params_max_tokens */
  METRICS_PARAMS_N,          /* request_params_n */
  METRICS_MAX_GEN_TOKENS,    /* request_max_num_generation_tokens: a prompt's n choices' most */
  METRICS_N_HIST,
} metrics_hist;

typedef struct metrics_opts {
  const char *prefix;            /* the names' prefix (NULL: "deltaserve") */
  const char *model_name;        /* the model_name label */
  int max_model_len;             /* the token histograms' 1-2-5 buckets stop at it (vLLM's); 0: not
                                    known yet (metrics_set_max_model_len) */
  double gpu_memory_utilization; /* a label of cache_config_info */
  const char *cache_dtype;       /* cache_config_info's: --kv-cache-dtype as given (NULL: auto) */
} metrics_opts;

/* One finished generation. Times in seconds; a negative one is not known and left out. */
typedef struct metrics_request {
  const char *finish; /* "stop", "length", "abort" or "error" */
  double e2e, queue, prefill, decode, inference;
  int prompt_tokens, generation_tokens;
  int max_tokens; /* the request's max_tokens (0: left out) */
} metrics_request;

/* Returns NULL on out of memory. */
metrics *metrics_new(const metrics_opts *o);
void metrics_free(metrics *m);

/* Sets the token histograms' bounds once the model is loaded, before any request reaches it. */
void metrics_set_max_model_len(metrics *m, int max_model_len);

/* `v` is seconds, or tokens for the token histograms. */
void metrics_observe(metrics *m, metrics_hist h, double v);
/* One finished generation: its finish reason counted, its times and token counts observed. */
void metrics_request_done(metrics *m, const metrics_request *r);
/* One request ended without a final event (cancelled before it): reason counted only. */
void metrics_request_finished(metrics *m, const char *reason);
/* One request refused before it reached the engine (HTTP status >= 400). */
void metrics_request_rejected(metrics *m, int status);

/* The whole exposition (malloc'd, caller frees; NULL on out of memory). `s` may be NULL
 * while the model is still loading (the engine series are then left out). */
char *metrics_render(metrics *m, const engine_stats *s);

/* A bound as Python's prometheus_client writes it in `le` (repr of a float: "0.25", "1.0",
 * "+Inf"), into buf (at least 32 bytes). */
void metrics_format_le(char *buf, size_t n, double v);

#endif
