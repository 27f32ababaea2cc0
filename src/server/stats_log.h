/* stats_log — the periodic engine line vLLM users watch, logged at info level every interval
 * while the engine has work (one more line once it has gone idle, showing the zeros; none
 * after that until work comes again):
 *
 *   Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 96.0 tokens/s,
 *   Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 4.2%, Prefix cache hit rate: 37.5%
 *
 * (one line). Throughputs are the interval's prefilled prompt tokens and generated tokens per
 * second; KV usage is pages held by running requests over all pages; the hit rate is prompt
 * tokens restored from the prefix cache over prompt tokens admitted, since start. */
#ifndef DS_STATS_LOG_H
#define DS_STATS_LOG_H
#include "engine/engine.h"

typedef struct stats_log stats_log;

/* Starts the thread that reads engine_get_stats(eng) every interval_s seconds (eng borrowed:
 * it must outlive stats_log_free). Returns NULL when out of memory or no thread starts. */
stats_log *stats_log_new(engine *eng, double interval_s);
/* Stops and joins the thread (at once, not at the interval's end). l may be NULL. */
void stats_log_free(stats_log *l);

#endif
