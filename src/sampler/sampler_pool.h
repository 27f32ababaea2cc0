/* sampler_pool — the threads that sample a step's logits rows in parallel.
 *
 *   engine thread                          pool threads (n, made at init)
 *   jobs[0..n) filled ----> sampler_pool_sample ----> take rows from one atomic counter
 *   (takes rows too)        returns when all are done  (json_mask_apply, sampler_sample)
 *
 *   sampler_pool_prep_start(masks) ----> json_mask_prepare each, while the caller waits for
 *   ... the forward ...                  the device; sampler_pool_prep_finish takes what is
 *   sampler_pool_prep_finish                left and returns when every mask is prepared
 *
 * Each row's work touches only its own sampler (parameters, RNG), its mask and the scratch of
 * the thread that takes it, and sampler_sample's result does not depend on the scratch, so the
 * tokens are the same for any thread count. Everything is sized at init: a step hands out
 * jobs without allocating. One caller thread drives a pool. */
#ifndef DS_SAMPLER_POOL_H
#define DS_SAMPLER_POOL_H
#include <stdint.h>

#include "sampler/json_mask.h"
#include "sampler/sampler.h"

typedef struct sampler_pool sampler_pool;

/* One sampled row of a step. The caller fills the inputs; sampler_pool_sample the outputs. */
typedef struct sampler_pool_job {
  sampler *smp;          /* the row's sampler (parameters, RNG) */
  const int32_t *prompt; /* [n_prompt] */
  int n_prompt;
  const int32_t *output; /* [n_output] the tokens generated so far */
  int n_output;
  json_mask *jm;      /* applied to lg before sampling (NULL: none) */
  float *lg;          /* [n_vocab] the row's logits, edited in place */
  int32_t t;          /* out: the token */
  sampler_result res; /* out: what sampler_sample gave */
} sampler_pool_job;

/* The default thread count: min(8, online CPUs - 1), the engine thread being the other one. */
int sampler_pool_default_threads(void);

/* A pool of n threads (0: the caller samples every row itself) for up to max_rows rows of
 * n_vocab logits. Returns 0, or -1 (out of memory, a thread that cannot start) with *out NULL. */
int sampler_pool_init(sampler_pool **out, int n, int n_vocab, int max_rows);
/* Stops and joins the threads, frees everything. NULL is a no-op. */
void sampler_pool_free(sampler_pool *p);
int sampler_pool_threads(const sampler_pool *p);

/* The job array [max_rows], for the caller to fill before sampler_pool_sample. */
sampler_pool_job *sampler_pool_jobs(sampler_pool *p);

/* Samples jobs[0..n_jobs) on the pool and the calling thread (scratch w); returns when every
 * row is done. Inline when the pool has no threads or there is one row. */
void sampler_pool_sample(sampler_pool *p, int n_jobs, sampler_scratch *w);

/* Mask preparation while the caller waits for something else: prep_start hands masks[0..n)
 * (n <= max_rows) to the threads and returns at once; prep_finish takes what is left on the
 * calling thread and returns when every mask is prepared. Without threads both do nothing
 * (json_mask_apply then computes each mask as it samples). Between the two calls nothing else
 * may touch the masks. */
void sampler_pool_prep_start(sampler_pool *p, json_mask *const *masks, int n);
void sampler_pool_prep_finish(sampler_pool *p);

#endif
