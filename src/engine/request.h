/* request — the one noun that crosses the engine: a sequence being generated.
 *
 *   tokens  [ prompt ........................ | generated ......... ]
 *            0                          n_prompt               n_tokens   cap
 *   cache   [ computed (in KV pages + state slot) ...... ]
 *            0                                     n_computed
 *
 * A step feeds tokens[n_computed .. n_computed + sched_tokens) and, when the piece reaches
 * n_tokens, samples the next token. After preemption (recompute) n_computed drops to 0 while
 * the generated tokens stay: the prompt is prefilled again with the same split points, the
 * generated tokens are fed back one per step without sampling, and generation continues where
 * it stopped, bit for bit.
 *
 * Split points. forced[] holds the request's own split points (chat boundaries, points given
 * by the caller) and, when the prefix cache is on, its capture points and the depth it was
 * restored from (sched.c sets them at the first admission and freezes them once the request
 * has computed anything: a re-admission after preemption splits exactly as before). A forced
 * point always ends a prefill piece, so a capture can happen there.
 *
 * Prefix cache (sched.c): the salt and chat boundaries, the capture tickets reserved at
 * admission (checkpoint_txn, cancelled on every way out), the in-flight capture the request
 * waits for before admission (shared-prefix coalescing), and the tokens restored.
 *
 * Owner: the engine (created at submit, freed when both the engine and the client handle let
 * go). Pages and slot are borrowed ids from kv_pages / state_pool, held while running. */
#ifndef DS_REQUEST_H
#define DS_REQUEST_H
#include <stdint.h>

#include "cache/checkpoint.h"
#include "cache/kv_pages.h"
#include "engine/spec_config.h"
#include "sampler/sampler.h"

typedef enum { REQ_STATE_WAITING, REQ_STATE_RUNNING, REQ_STATE_FINISHED } req_state;

typedef struct request {
  int64_t id; /* arrival order: FCFS, and the youngest (largest) is preempted first */
  req_state state;
  int32_t *tokens; /* [cap] prompt then generated */
  int n_prompt, n_tokens, cap;
  int n_computed;  /* positions held in the cache */
  int32_t *forced; /* [cap_forced] split points, ascending, in (0, n_prompt) */
  int n_forced, cap_forced;
  int n_forced_base; /* forced[0, n_forced_base) as given at request_init, before any point of
                        the prefix cache was merged in (request_set_points) */
  int points_fixed;  /* 1 once the request computed with its split points: they stay */
  kv_pages_table pages;
  int slot; /* state slot, -1 when none */
  int n_preemptions;
  sampler smp;
  int finish; /* finish_reason (engine.h); 0 while generating */
  /* steps ahead (engine.c): the finish already sent with the token of the step in flight, taking
   * effect after the step issued ahead of it (which fed that token); in_flight: a step in
   * flight uses this request's slot and pages (not removed meanwhile) */
  int finish_next, in_flight;
  char err[160];
  /* this step's schedule (sched_schedule) */
  int sched_tokens; /* tokens fed this step, 0 when not scheduled */
  int sched_sample; /* 1 when the piece ends at n_tokens: sample a token after it */
  /* speculative decoding: drafts verified this step (a verify piece of 1 + sched_draft rows),
   * written past the tokens at tokens[n_tokens, n_tokens + sched_draft) (room: the scheduler
   * drafts at most max_tokens - output - 1); 0 when the piece is plain */
  int sched_draft;
  int sched_lane; /* a verify piece's keep lane (fwd_seq.keep), distinct within the step */
  /* MTP drafts (SPEC_METHOD_MTP): made after the step that brought the request to n_tokens ==
   * mtp_at at its decode point; sched_draft takes them only there */
  int32_t mtp_draft[SPEC_MAX_TOKENS];
  int n_mtp_draft, mtp_at;
  /* engine_submit_opts.draft_replay (test and benchmark drafter; NULL: n-gram) */
  const int32_t *replay;
  int n_replay, replay_pm, replay_follow;
  /* speculative decoding, this request's share of engine_stats' spec_* counters: its verify
   * steps, the drafts they fed, the drafts accepted (engine_event's, on the final event) */
  int spec_drafts, spec_draft_tokens, spec_accepted;
  /* prefix cache (request_init_prefix; unused when the cache is off) */
  char *salt;      /* cache_salt, NULL: the shared namespace */
  int32_t *bounds; /* [n_bounds] chat-message start positions */
  int n_bounds;
  prefix_cache_point *pts; /* [cap_txn] scratch: the capture points of an admission */
  checkpoint_txn *txn;     /* [cap_txn] capture tickets, ascending depth */
  int n_txn, cap_txn;
  uint64_t wait_ticket;        /* in-flight capture waited for before admission (0: none) */
  int cached_tokens;           /* tokens restored from the prefix cache at the last admission */
  struct request *prev, *next; /* the waiting or running list */
  void *owner;                 /* the engine's per-request handle */
} request;

/* Initialises r: copies the prompt and forced split points (kept only those in
 * (0, n_prompt), sorted, unique), allocates room for prompt + max_tokens tokens and the page
 * table for that many positions. Request-time allocation: fault site "request_init".
 * Returns 0, or -1 on out of memory (nothing left allocated). */
int request_init(request *r, int64_t id, const int32_t *prompt, int n_prompt,
                 const sampling_params *sp, const int32_t *forced, int n_forced,
                 uint64_t fallback_seed);
/* Spare split points and capture tickets per request for demand captures. */
#define REQUEST_DEMAND_POINTS 4

/* Prepares r for the prefix cache: copies salt (NULL or "" : shared) and the chat boundaries,
 * and makes room for n_points more split points and as many capture tickets (plus
 * REQUEST_DEMAND_POINTS of each). Request-time
 * allocation: fault site "request_init_prefix". Returns 0, or -1 on out of memory (r stays
 * valid without a prefix part; request_free frees whatever was allocated). */
int request_init_prefix(request *r, const char *salt, const int32_t *bounds, int n_bounds,
                        int n_points);
/* Sets the split points to the base points (request_init's) merged with the depths of
 * pts[0, n) and `extra` (when > 0), keeping those in (0, n_prompt), sorted and unique. Room:
 * request_init_prefix's n_points + 1 (points beyond it are dropped). Never allocates. */
void request_set_points(request *r, const prefix_cache_point *pts, int n, int extra);
/* Adds d to r's split points while r runs (a capture another request asked for, see sched.h
 * "demand captures"): d must be in (0, n_prompt) and not yet computed past. Never allocates:
 * request_init_prefix keeps REQUEST_DEMAND_POINTS spare places (split points and tickets).
 * Returns 0 (added, or already a split point), or -1 when there is no room. */
int request_add_point(request *r, int d);
/* 1 when d is one of r's forced split points. */
int request_is_forced(const request *r, int d);

/* Frees r's storage; its pages and slot must have been released. */
void request_free(request *r);

/* Generated tokens so far. */
static inline int request_n_output(const request *r) { return r->n_tokens - r->n_prompt; }

#endif
