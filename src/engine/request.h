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
 * Owner: the engine (created at submit, freed when both the engine and the client handle let
 * go). Pages and slot are borrowed ids from kv_pages / state_pool, held while running. */
#ifndef DS_REQUEST_H
#define DS_REQUEST_H
#include <stdint.h>

#include "cache/kv_pages.h"
#include "sampler/sampler.h"

typedef enum { REQ_STATE_WAITING, REQ_STATE_RUNNING, REQ_STATE_FINISHED } req_state;

typedef struct request {
  int64_t id; /* arrival order: FCFS, and the youngest (largest) is preempted first */
  req_state state;
  int32_t *tokens; /* [cap] prompt then generated */
  int n_prompt, n_tokens, cap;
  int n_computed; /* positions held in the cache */
  int32_t *forced; /* [n_forced] extra split points, ascending, in (0, n_prompt) */
  int n_forced;
  kv_pages_table pages;
  int slot; /* state slot, -1 when none */
  int n_preemptions;
  sampler smp;
  int finish; /* finish_reason (engine.h); 0 while generating */
  char err[160];
  /* this step's schedule (sched_schedule) */
  int sched_tokens; /* tokens fed this step, 0 when not scheduled */
  int sched_sample; /* 1 when the piece ends at n_tokens: sample a token after it */
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
/* Frees r's storage; its pages and slot must have been released. */
void request_free(request *r);

/* Generated tokens so far. */
static inline int request_n_output(const request *r) { return r->n_tokens - r->n_prompt; }

#endif
