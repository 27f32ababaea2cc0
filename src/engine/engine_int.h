/* engine_int — what engine.c (threads, channels, the API) and engine_step.c (the step) share:
 * the engine, the request handles with their output channels, the steps in flight. Not for
 * other modules. */
#ifndef DS_ENGINE_INT_H
#define DS_ENGINE_INT_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "cache/disk_tier.h"
#include "cache/kv_pages.h"
#include "cache/prefix_cache.h"
#include "cache/state_pool.h"
#include "engine/engine.h"
#include "engine/notifier.h"
#include "engine/request.h"
#include "engine/sched.h"
#include "engine/spec_mtp.h"
#include "engine/spec_policy.h"
#include "sampler/sample_rule.h"
#include "sampler/sampler_pool.h"

typedef struct engine_ev {
  int32_t token;
  int has_token;
  float logprob;
  int n_top;
  int finish;
} engine_ev;

struct engine_req {
  request r; /* the engine thread's; r.owner == this handle */
  engine *e;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  engine_ev *ring;  /* [cap] events in order (at most max_tokens tokens + 1 final) */
  int32_t *top_ids; /* [cap * top_logprobs] */
  float *top_lps;
  int cap, n_push, n_pop;
  int done; /* the final event was pushed */
  int refs; /* client + engine */
  atomic_int cancel;
  int prompt_tokens, completion_tokens, cached_tokens;
  int spec_drafts, spec_draft_tokens, spec_accepted; /* request.spec_*, at the final event */
  double t_sched; /* engine_now() at the first step that fed it (0: none yet) */
  char err[160];
  void (*on_logits)(void *, const float *, int);
  void *user;
  json_mask *jm; /* response_format json_object / json_schema (NULL: none); one thread at a time */
  json_schema *schema;      /* response_format json_schema: the schema jm follows (owned) */
  struct engine_req *qnext; /* the incoming queue */
};

/* A greedy or sampled step issued and not yet read (engine_step_flight). */
typedef struct engine_flight {
  request **reqs; /* its rows, in batch order (one of engine.fl_store) */
  int n;
  int sampled; /* by the sample op (qwen35_sample_start), else greedy (qwen35_greedy_start) */
  int ticket;  /* the start's */
  int buf;     /* its ids land in engine.ids_buf[buf] */
} engine_flight;

struct engine {
  qwen35 *m;
  const model_config *cfg;
  engine_opts o;
  int max_model_len, n_vocab;
  kv_pages *kp;
  state_pool *sp;
  prefix_cache *pc; /* NULL when --no-enable-prefix-caching */
  disk_tier *dt;    /* --disk-cache-dir, under pc (NULL: none) */
  sched *s;
  fwd_seq *seqs; /* [max_num_seqs] */
  float *logits; /* [max_num_seqs, n_vocab] (qwen35_host_alloc) */
  int32_t *ids;  /* [max_num_seqs] the greedy steps' tokens */
  /* steps ahead (engine_step.c; engine_opts.steps_ahead): the steps in flight (fl[0] the
   * older); each one's ids land in ids_buf[its buf] (ids_buf[0] == ids) */
  int ahead;
  engine_flight fl[2];
  int n_fl;
  int32_t *ids_buf[2];
  request **fl_store[2]; /* [max_num_seqs] each: the flights' rows */
  int device_greedy;     /* the model's backend has argmax */
  /* steps whose sampled rows are all sampler_device_ok are sampled by the backend's sample op
   * (qwen35_forward_sample; engine_opts.device_sample) */
  int device_sample;
  int32_t *words; /* such a step's words: [max_num_seqs, SAMPLE_RULE_WORDS], then the edits */
  sample_rule_edit *edits;        /* [max_num_seqs * SAMPLE_RULE_EDITS_MAX] the rows' edits */
  int *edit_n;                    /* [max_num_seqs] each sampled row's number of them */
  uint64_t (*rng_save)[4];        /* [max_num_seqs] a sampled flight's rows' RNG before its draws */
  long long steps;                /* forward steps run */
  long long steps_ahead;          /* of them, issued ahead (engine_step_flight) */
  long long steps_device_sampled; /* of them, qwen35_forward_sample */
  /* speculative decoding (engine_opts.spec): the counters engine_stats reports */
  long long spec_drafts, spec_draft_tokens, spec_accepted;
  long long spec_accepted_pos[SPEC_MAX_TOKENS];
  /* SPEC_METHOD_MTP: the drafter (its K/V pages: the target's ids, then mtp_scratch pages per
   * step row i for the draft rows past that sequence's pages, from mtp_scratch0 + i *
   * mtp_scratch), every row's hidden state of a step [max_num_batched_tokens, H], the step's
   * sequences' page tables for the drafter [max_num_seqs, mtp_pt] and their items */
  /* whether the next step drafts: spec_config.disable_by_batch_size's rule, else measured */
  spec_policy pol;
  int spec_on;
  double prefill_tps; /* moving prefill tokens per second of steps mostly prefill (sched's) */
  spec_mtp *mtp;
  int mtp_scratch0, mtp_scratch, mtp_pt;
  float *hidden;
  int32_t *mtp_pages;
  spec_mtp_item *mtp_items;
  sampler_scratch scratch; /* the engine thread's */
  sampler_pool *pool;      /* sampler threads and the step's jobs [max_num_seqs] */
  json_mask **masks;       /* [max_num_seqs] a step's masks to prepare during its forward */
  notifier *nt; /* wakes the clients of a step's token events (NULL: the engine thread does) */
  pthread_t thread;
  pthread_mutex_t mu; /* incoming queue, stop, stats snapshot, check requests */
  pthread_cond_t cv;  /* wakes the engine thread */
  pthread_cond_t check_cv;
  engine_req *in_head, *in_tail;
  int n_in;
  int stop, drain;
  int check_pending, check_rc;
  char check_err[200];
  long long next_id;
  engine_stats st; /* the snapshot readers get (under mu) */
  long long prompt_total, gen_total, prefilled_total, finished, cancelled, failed;
  long long step_tok_bucket[ENGINE_STEP_TOKEN_BUCKETS + 1], step_tok_sum; /* engine_step_tally */
  long long ck_n[3]; /* checkpoint copies timed (engine_time_copy) */
  double ck_ms[3], ck_max[3];
};

/* engine.c: the channels (engine thread). */

/* Pushes one event. A final event (finish != 0) is the last. With nt, the client's wake-up is
 * queued there (a reference held until it runs) instead of done here; returns 1 when it was. */
int engine_push(engine_req *h, const sampler_result *res, int finish, notifier *nt);
/* Ends a request that is already out of the scheduler (with_event: pushes the final event) and
 * drops the engine's reference to its handle. */
void engine_end(engine *e, engine_req *h, int finish, int with_event);

/* engine_step.c (engine thread). */

/* Runs one step, or reads the step in flight. Returns the requests it touched (0: nothing
 * could run now). */
int engine_step_run(engine *e);
/* Completes the steps in flight. */
void engine_step_drain(engine *e);

#endif
