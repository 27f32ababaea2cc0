/* cpu_pool — see cpu_pool.h. One job at a time: the caller publishes (fn, arg, ranges) under
 * the mutex and bumps a generation counter; each worker i runs range i and counts down
 * `pending`; the caller runs range 0 and waits for pending == 0. */
#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdlib.h>

struct cpu_pool {
  int n_threads;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t start_cv, done_cv;
  uint64_t gen;
  int stop;
  int pending;
  /* the current job */
  cpu_pool_fn fn;
  void *arg;
  int64_t n;
  int n_ranges;
};

typedef struct {
  cpu_pool *p;
  int idx;
} worker_arg;

static void range_of(int64_t n, int n_ranges, int i, int64_t *b, int64_t *e) {
  *b = n * i / n_ranges;
  *e = n * (i + 1) / n_ranges;
}

static void *worker_main(void *v) {
  worker_arg *wa = v;
  cpu_pool *p = wa->p;
  int idx = wa->idx;
  free(wa);
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->gen == seen) pthread_cond_wait(&p->start_cv, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->gen;
    cpu_pool_fn fn = p->fn;
    void *arg = p->arg;
    int64_t n = p->n;
    int nr = p->n_ranges;
    pthread_mutex_unlock(&p->mu);
    if (idx < nr) {
      int64_t b, e;
      range_of(n, nr, idx, &b, &e);
      if (b < e) fn(arg, b, e);
    }
    pthread_mutex_lock(&p->mu);
    if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
  }
}

cpu_pool *cpu_pool_create(int n_threads) {
  if (n_threads < 1) n_threads = 1;
  cpu_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n_threads = n_threads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->start_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  if (n_threads > 1) {
    p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
    if (!p->threads) goto fail;
    for (int i = 1; i < n_threads; i++) {
      worker_arg *wa = malloc(sizeof *wa);
      if (!wa) {
        p->n_threads = i;
        goto fail;
      }
      wa->p = p;
      wa->idx = i;
      if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
        free(wa);
        p->n_threads = i;
        goto fail;
      }
    }
  }
  return p;
fail:
  cpu_pool_free(p);
  return NULL;
}

void cpu_pool_free(cpu_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->start_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
  free(p->threads);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->start_cv);
  pthread_cond_destroy(&p->done_cv);
  free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->n_threads; }

void cpu_pool_run(cpu_pool *p, int64_t n, int64_t min_per_thread, cpu_pool_fn fn, void *arg) {
  if (n <= 0) return;
  if (min_per_thread < 1) min_per_thread = 1;
  int64_t nr64 = n / min_per_thread;
  int nr = nr64 < p->n_threads ? (int)nr64 : p->n_threads;
  if (nr <= 1) {
    fn(arg, 0, n);
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  p->n_ranges = nr;
  p->pending = p->n_threads - 1;
  p->gen++;
  pthread_cond_broadcast(&p->start_cv);
  pthread_mutex_unlock(&p->mu);
  int64_t b, e;
  range_of(n, nr, 0, &b, &e);
  if (b < e) fn(arg, b, e);
  pthread_mutex_lock(&p->mu);
  while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}
