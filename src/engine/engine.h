/* engine — the continuous-batching engine: one engine thread runs
 *     sched_schedule -> batch build -> qwen35_forward -> sampler -> sched_postprocess
 * over the paged KV cache, the state slots and the prefix cache. Other threads (HTTP handlers,
 * the offline `run` command) talk to it only through engine_submit / engine_next /
 * engine_cancel: a request queue in, one output channel per request out.
 *
 * Contract for callers:
 *   - engine_submit copies everything it needs from opts; it returns a request handle, or
 *     NULL with err and *status (ENGINE_ERR_*) when the request can never run (too long,
 *     invalid ids, queue full) — a request that cannot run *now* waits instead.
 *   - engine_next blocks until the next event of that request (a token, or the end).
 *     After an event with finish != FINISH_NONE there are no more events.
 *   - engine_cancel may be called from any thread at any time; it takes effect at the next
 *     step, frees everything, and ends the stream with FINISH_CANCELLED (unless already ended).
 *   - engine_release frees the handle; call it exactly once per successful submit, after the
 *     final event or after cancel (it cancels if still running).
 *
 * Files: engine.c (the threads, the channels, this API), engine_step.c (one step: the batch,
 * the forward, the tokens, steps ahead), engine_mem.c (the memory plan, engine_mem.h),
 * engine_int.h (what those share); the sampler threads are sampler/sampler_pool.c. */
#ifndef DS_ENGINE_H
#define DS_ENGINE_H
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "engine/spec_config.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "sampler/json_mask.h"
#include "sampler/json_schema.h"
#include "sampler/sampler.h"

typedef struct engine engine;
typedef struct engine_req engine_req;

typedef struct engine_opts {
  int max_num_seqs;             /* --max-num-seqs (64) */
  int max_num_batched_tokens;   /* --max-num-batched-tokens (8192) */
  int max_model_len;            /* --max-model-len (0: the model's max_position_embeddings) */
  int kv_cache_tokens;          /* --kv-cache-tokens (0: derived from memory utilisation) */
  float gpu_memory_utilization; /* --gpu-memory-utilization (0.9) */
  int max_waiting;              /* queue limit before ENGINE_ERR_QUEUE_FULL (0: 4096) */
  /* --kv-events-config: the publisher the prefix cache reports to (borrowed, outlives the
   * engine; NULL: no events) */
  struct kv_events *kv_events;
  /* prefix cache */
  int enable_prefix_caching;  /* --enable-prefix-caching / --no-enable-prefix-caching (1) */
  int snapshot_interval;      /* --snapshot-interval (2048) */
  int n_snapshot_slabs;       /* --snapshot-slabs (0: derived from the budget) */
  double prefix_cache_gib;    /* --prefix-cache-gib */
  double host_cache_gib;      /* --host-cache-gib (0: no host tier) */
  const char *disk_cache_dir; /* --disk-cache-dir (NULL: no disk tier; docs/disk-cache.md) */
  double disk_cache_gib;      /* --disk-cache-gib: the directory's byte budget (needed with it) */
  uint64_t model_identity;    /* disk_tier_identity of the model and backend: a file written
                                 under another identity is never restored */
  /* --packed-weights auto|on|off (-1 auto, the default): keep the backend's lossless packed copy of
   * the dense layers' product weights for decode steps (backend weight_pack; the CUDA backend's
   * 12-bit rows, ~0.75 of their bf16 bytes, the same results). auto: on when the backend has
   * one and the weights with the copies take at most half the device's memory. */
  int packed_weights;
  /* One forward of the largest step (max_num_batched_tokens tokens in max_num_seqs pieces,
   * page ids from 0, state slots from 0) in engine_create, before any request, so that the
   * backend's workspaces reach their largest size at start-up (device memory then stays flat
   * under load) and a plan that does not fit fails at start with one line. Leaves nothing
   * behind that a request could see: sequences write their K/V before reading it, and a slot
   * is zeroed or overwritten at admission. `serve` turns it on for device backends
   * (--no-warmup: off). */
  int startup_forward;
  int sampler_threads; /* --sampler-threads (-1: min(8, online CPUs - 1); 0: engine thread) */
  int log_steps;       /* --log-steps: one log line per step (engine_step.c) */
  /* Test-only (no flag): the step paths the engine picks by backend, forced so that the CPU
   * suite runs the ones a device backend takes. -1 (the default): on device backends only;
   * 0: off; 1: on wherever the backend can (qwen35_can_chain, qwen35_has_sample). */
  int steps_ahead;   /* decode steps issued before the step in flight is read */
  int device_sample; /* sampled rows picked by the backend's sample op */
  /* --speculative-config: n-gram or MTP drafts verified in the batch (engine_step.c
   * "Speculative decoding"); method SPEC_METHOD_NONE: off. Needs a backend with set_keep and a
   * model made with engine_mem_plan's keep slots (k per sequence slot). Turns steps ahead off. */
  spec_config spec;
  /* SPEC_METHOD_MTP: the model's weights loaded with weights_opts.mtp, read by engine_create
   * only (the MTP head is uploaded); a checkpoint without an MTP head is refused. */
  const model_weights *mtp_weights;
} engine_opts;

/* The defaults each field's comment names. */
void engine_opts_default(engine_opts *o);

typedef enum {
  FINISH_NONE = 0,
  FINISH_STOP,      /* eos / stop token */
  FINISH_LENGTH,    /* max_tokens or max_model_len */
  FINISH_CANCELLED, /* engine_cancel */
  FINISH_ERROR,     /* an internal failure of this request; err says what */
} finish_reason;
const char *finish_reason_name(finish_reason f);

typedef enum {
  ENGINE_OK = 0,
  ENGINE_ERR_INVALID,    /* bad ids, empty prompt, bad sampling params -> 400 */
  ENGINE_ERR_TOO_LONG,   /* prompt + max_tokens can never fit -> 400 */
  ENGINE_ERR_QUEUE_FULL, /* -> 429/503 */
  ENGINE_ERR_SHUTDOWN,   /* engine stopping -> 503 */
  ENGINE_ERR_NOMEM,      /* out of request-time memory -> 503 */
} engine_status;

typedef struct engine_submit_opts {
  const int32_t *prompt; /* [n_prompt] token ids */
  int n_prompt;
  sampling_params sp;     /* see sampler.h; max_tokens, stop ids, ignore_eos, logprobs, seed... */
  const char *cache_salt; /* prefix-cache namespace, NULL or "" for the shared one */
  const int32_t *boundaries; /* chat-message start positions (prefix-cache capture points);
                                every boundary is also a prefill split point */
  int n_boundaries;
  /* Optional extra prefill split points (positions in (0, n_prompt)). Splits decide the
   * exact floating-point result of a prefill; tests use them to compute a request "cold"
   * (prefix cache off) with the split points a restored run had. */
  const int32_t *split_points;
  int n_split_points;
  /* Optional: response_format json_object. Each of this request's tokens is sampled under the
   * JSON-object mask over this vocabulary (json_mask.h: only tokens that keep the output a
   * prefix of one JSON object, eos once it is complete). Must outlive the request. NULL: none. */
  const json_vocab *json;
  /* Optional, with json: response_format json_schema — the mask follows this compiled schema
   * (json_mask_new_schema). engine_submit takes it in every case: the engine frees it with the
   * request, or at once when the submit fails. NULL: json_object (any one JSON object). */
  json_schema *schema;
  /* Optional test/inspection hook, called on the engine thread with the raw logits row
   * [n_vocab] (before penalties) each time a token of this request is sampled. */
  void (*on_logits)(void *user, const float *logits, int n_vocab);
  void *user;
  /* Test and benchmark only (no API field; `deltaserve bench --spec-replay`): with speculation
   * on, the drafts come from here instead of the configured drafter (spec_replay.h) —
   * draft_replay[i] for output position i (the target's own continuation, from an earlier
   * run), each draft replaced by another token with probability draft_corrupt_pm / 1000 (a
   * hash of the request id and position): a drafter of controlled acceptance. Must outlive the
   * request. NULL: the configured drafter. */
  const int32_t *draft_replay;
  int n_draft_replay;
  int draft_corrupt_pm;
  /* 1: the request also takes draft_replay's token at every position it has one (the bench:
   * the acceptance then follows draft_corrupt_pm alone, spec_replay.h); 0: it samples its own */
  int draft_replay_follow;
} engine_submit_opts;

#define ENGINE_MAX_TOP_LOGPROBS 20

typedef struct engine_event {
  int32_t token; /* the sampled token (valid when has_token) */
  int has_token;
  float logprob; /* log-softmax of the sampled token (when sp.logprobs) */
  int n_top;     /* top_logprobs entries */
  int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
  float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
  finish_reason finish; /* FINISH_NONE while generating */
  int prompt_tokens;    /* set on the final event */
  int cached_tokens;    /* prompt tokens restored from the prefix cache (final event) */
  int completion_tokens;
  /* final event: the request's speculative decoding (all 0 when it verified no drafts): its
   * verify steps, the drafts they fed, the drafts accepted; its acceptance length (vLLM's) is
   * 1 + spec_accepted_tokens / spec_drafts */
  int spec_drafts, spec_draft_tokens, spec_accepted_tokens;
  char err[160];      /* FINISH_ERROR: what went wrong */
  double t_scheduled; /* final event: the monotonic time (CLOCK_MONOTONIC seconds) of the first
                         step that fed the request; 0 when none did */
} engine_event;

/* Creates the engine over a loaded model and starts its thread. Returns NULL with err. */
engine *engine_create(qwen35 *model, const engine_opts *o, char *err, size_t errlen);
/* Stops accepting, cancels or finishes in-flight requests (drain=1 waits for them to finish),
 * joins the thread and frees everything. */
void engine_destroy(engine *e, int drain);

engine_req *engine_submit(engine *e, const engine_submit_opts *o, engine_status *status, char *err,
                          size_t errlen);
/* Blocks for the next event; timeout_ms < 0 waits forever. Returns 1 with an event, 0 on
 * timeout. */
int engine_next(engine_req *r, engine_event *ev, int timeout_ms);
void engine_cancel(engine_req *r);
void engine_release(engine_req *r);

/* The bounds of engine_stats.step_tokens_bucket: vLLM's iteration_tokens_total buckets, so that
 * /metrics can report that histogram under its name. */
#define ENGINE_STEP_TOKEN_BUCKETS 13
extern const int engine_step_token_le[ENGINE_STEP_TOKEN_BUCKETS];

/* Metrics snapshot for /metrics and the start-up log (read without stopping the engine). */
typedef struct engine_stats {
  int num_running, num_waiting;
  long long prompt_tokens_total, generation_tokens_total, prefilled_tokens_total;
  long long requests_finished, requests_cancelled, requests_failed, preemptions;
  long long steps;                /* forward steps run (--log-steps logs each) */
  long long steps_ahead;          /* of them, issued before the step before was read */
  long long steps_device_sampled; /* of them, sampled rows picked by the backend's sample op */
  int kv_pages_total, kv_pages_used, kv_pages_cached;
  int slots_total, slots_used;
  int snapshot_slabs_total, snapshot_slabs_used;
  long long prefix_queries, prefix_hits, prefix_hit_tokens, prefix_captures,
      prefix_capture_failures, prefix_evictions, prefix_restore_failures;
  int max_model_len;
  /* prefix cache, continued (all 0 when it is off) */
  int prefix_enabled;
  long long prefix_query_tokens; /* prompt tokens of the lookups */
  long long prefix_demotions, prefix_rejected;
  int prefix_checkpoints, prefix_pending, prefix_host_checkpoints;
  int prefix_device_slabs, prefix_device_slabs_max, prefix_device_pages;
  size_t prefix_device_slab_bytes, prefix_device_page_bytes, prefix_host_bytes,
      prefix_host_budget_bytes;
  /* the disk tier (all 0 without --disk-cache-dir): disk_tier_stats, and the prefix cache's
   * checkpoints that live only on disk and its moves from memory to disk */
  int disk_enabled, disk_files, disk_queued, disk_checkpoints;
  size_t disk_bytes, disk_budget_bytes;
  long long disk_hits, disk_read_failures, disk_writes, disk_write_failures, disk_files_dropped,
      disk_evictions, disk_spills;
  long long disk_declined; /* restores left unread: reading was measured slower than prefill */
  double disk_read_bytes, disk_write_bytes, disk_read_s, disk_write_s;
  /* the KV-events publisher (all 0 without --kv-events-config): kv_events_stats */
  int kv_events_enabled;
  long long kv_events_events, kv_events_batches, kv_events_dropped, kv_events_replays;
  /* checkpoint copies on the device, timed on the engine thread (each is synchronous and runs
   * between two steps: its time is the pause it puts into the running sequences): captures
   * (slot -> slab), restores (slab -> slot; the sum also holds their copy-on-write page copies) */
  long long ckpt_captures_timed, ckpt_restores_timed, ckpt_restore_page_copies;
  /* speculative decoding (vLLM's spec_decode counters; all 0 when off): steps that verified
   * drafts for a request, the tokens drafted, those accepted, and accepted by position (the
   * i-th draft of a step, i < spec_k) */
  int spec_k;
  long long spec_num_drafts, spec_num_draft_tokens, spec_num_accepted_tokens;
  long long spec_accepted_per_pos[SPEC_MAX_TOKENS];
  double ckpt_capture_ms_sum, ckpt_restore_ms_sum, ckpt_capture_ms_max, ckpt_restore_ms_max;
  /* steps by the tokens they fed: step_tokens_bucket[i] counts those of at most
   * engine_step_token_le[i] tokens (and more than the bound before), the last any more */
  long long step_tokens_bucket[ENGINE_STEP_TOKEN_BUCKETS + 1], step_tokens_sum;
} engine_stats;
void engine_get_stats(engine *e, engine_stats *s);

/* Runs kv_pages_check, state_pool_check and (when on) prefix_cache_check on the engine
 * thread (between steps) and returns 0, or -1 with the first failure in err. For tests and
 * debugging. */
int engine_check(engine *e, char *err, size_t errlen);

#endif
