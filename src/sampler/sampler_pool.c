/* sampler_pool — see sampler_pool.h. Workers sleep on `go` until `gen` moves; each then takes
 * rows (or masks) from `next` until none are left and reports on `done`. */
#include "sampler/sampler_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct sampler_pool_worker {
  sampler_pool *pool;
  sampler_scratch scratch;
  pthread_t thread;
  int started;
} sampler_pool_worker;

struct sampler_pool {
  int n; /* threads (0: inline) */
  sampler_pool_worker *w;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  int inited;
  unsigned long gen;
  int stop;
  int n_active; /* workers not yet done with the current round */
  int max_rows, n_vocab;
  sampler_pool_job *jobs; /* [max_rows] */
  int n_jobs;
  atomic_int next;
  int prep_mode;    /* the current round prepares masks (set with gen, under mu) */
  json_mask **prep; /* [max_rows] */
  int n_prep;
};

int sampler_pool_default_threads(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN) - 1;
  return c < 0 ? 0 : c > 8 ? 8 : (int)c;
}

static void sampler_pool_run(sampler_pool *p, sampler_scratch *w) {
  for (;;) {
    int j = atomic_fetch_add(&p->next, 1);
    if (j >= p->n_jobs) return;
    sampler_pool_job *jb = &p->jobs[j];
    if (jb->jm) json_mask_apply(jb->jm, jb->lg, p->n_vocab);
    jb->t = sampler_sample(jb->smp, jb->lg, p->n_vocab, jb->prompt, jb->n_prompt, jb->output,
                           jb->n_output, w, &jb->res);
  }
}

static void sampler_pool_run_prep(sampler_pool *p) {
  for (;;) {
    int j = atomic_fetch_add(&p->next, 1);
    if (j >= p->n_prep) return;
    json_mask_prepare(p->prep[j], p->n_vocab);
  }
}

static void *sampler_pool_main(void *arg) {
  sampler_pool_worker *wk = arg;
  sampler_pool *p = wk->pool;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->gen;
    int prep = p->prep_mode;
    pthread_mutex_unlock(&p->mu);
    if (prep)
      sampler_pool_run_prep(p);
    else
      sampler_pool_run(p, &wk->scratch);
    pthread_mutex_lock(&p->mu);
    if (--p->n_active == 0) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
}

void sampler_pool_free(sampler_pool *p) {
  if (!p) return;
  if (p->inited) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
  }
  for (int i = 0; p->w && i < p->n; i++) {
    if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
    sampler_scratch_free(&p->w[i].scratch);
  }
  if (p->inited) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
  }
  free(p->w);
  free(p->jobs);
  free(p->prep);
  free(p);
}

int sampler_pool_init(sampler_pool **out, int n, int n_vocab, int max_rows) {
  *out = NULL;
  sampler_pool *p = calloc(1, sizeof *p);
  if (!p) return -1;
  p->n_vocab = n_vocab;
  p->max_rows = max_rows;
  p->jobs = calloc((size_t)max_rows, sizeof *p->jobs);
  p->prep = calloc((size_t)max_rows, sizeof *p->prep);
  if (!p->jobs || !p->prep) goto fail;
  if (n > 0) {
    p->w = calloc((size_t)n, sizeof *p->w);
    if (!p->w) goto fail;
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->inited = 1;
    for (int i = 0; i < n; i++) {
      p->w[i].pool = p;
      if (sampler_scratch_init(&p->w[i].scratch, n_vocab) != 0) goto fail;
      if (pthread_create(&p->w[i].thread, NULL, sampler_pool_main, &p->w[i]) != 0) goto fail;
      p->w[i].started = 1;
    }
  }
  *out = p;
  return 0;
fail:
  sampler_pool_free(p);
  return -1;
}

int sampler_pool_threads(const sampler_pool *p) { return p->n; }

sampler_pool_job *sampler_pool_jobs(sampler_pool *p) { return p->jobs; }

/* Wakes the workers for one round of sampling (prep 0) or mask preparation (prep 1). */
static void sampler_pool_go(sampler_pool *p, int prep) {
  pthread_mutex_lock(&p->mu);
  p->prep_mode = prep;
  p->gen++;
  p->n_active = p->n;
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
}

/* Returns when every worker is done with the current round. */
static void sampler_pool_wait(sampler_pool *p) {
  pthread_mutex_lock(&p->mu);
  while (p->n_active > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void sampler_pool_sample(sampler_pool *p, int n_jobs, sampler_scratch *w) {
  p->n_jobs = n_jobs;
  atomic_store(&p->next, 0);
  if (p->n == 0 || n_jobs < 2) {
    sampler_pool_run(p, w);
    return;
  }
  sampler_pool_go(p, 0);
  sampler_pool_run(p, w);
  sampler_pool_wait(p);
}

void sampler_pool_prep_start(sampler_pool *p, json_mask *const *masks, int n) {
  p->n_prep = 0;
  if (p->n == 0 || n <= 0) return;
  if (n > p->max_rows) n = p->max_rows;
  memcpy(p->prep, masks, (size_t)n * sizeof *masks);
  p->n_prep = n;
  atomic_store(&p->next, 0);
  sampler_pool_go(p, 1);
}

void sampler_pool_prep_finish(sampler_pool *p) {
  if (p->n_prep == 0) return;
  sampler_pool_run_prep(p);
  sampler_pool_wait(p);
  p->n_prep = 0;
}
