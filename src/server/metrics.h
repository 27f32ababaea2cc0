/* metrics — what /metrics reports, in the Prometheus text format (version 0.0.4), with
 * vLLM-style names under the prefix `deltaserve:`.
 *
 * Two sources: the engine's own counters and gauges (engine_get_stats: running / waiting
 * requests, token counters, KV pages, state slots, snapshot slabs, every prefix-cache
 * statistic), and the latencies only the server sees, kept here as fixed-bucket histograms:
 *   time_to_first_token_seconds   submit -> first token event
 *   inter_token_latency_seconds   between consecutive token events of one request
 *   e2e_request_latency_seconds   submit -> final event
 * plus finished-request counters by finish reason. Observations take one mutex (a few
 * additions); rendering copies under it. */
#ifndef DS_METRICS_H
#define DS_METRICS_H
#include "engine/engine.h"

typedef struct metrics metrics;

typedef enum {
  METRICS_TTFT,
  METRICS_ITL,
  METRICS_E2E,
  METRICS_N_HIST,
} metrics_hist;

/* Returns NULL on out of memory. */
metrics *metrics_new(const char *model_name);
void metrics_free(metrics *m);

void metrics_observe(metrics *m, metrics_hist h, double seconds);
/* One finished request: reason is "stop", "length", "abort" or "error". */
void metrics_request_finished(metrics *m, const char *reason);
/* One request refused before it reached the engine (HTTP status >= 400). */
void metrics_request_rejected(metrics *m, int status);

/* The whole exposition (malloc'd, caller frees; NULL on out of memory). `s` may be NULL
 * while the model is still loading (the engine gauges are then left out). */
char *metrics_render(metrics *m, const engine_stats *s);

#endif
