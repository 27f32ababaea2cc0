/* comm — see comm.h. A collective is: every rank posts its buffer's address, a barrier, each
 * rank does its share reading the others' buffers, a barrier (after which the buffers are the
 * ranks' own again). In all_reduce_sum rank r owns elements [r*n/N, (r+1)*n/N): it alone reads
 * and writes them on every rank, so no scratch is needed and no element is read after it is
 * written. */
#include "backend/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct comm {
  int n;
  atomic_int refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiting;       /* ranks inside the current barrier */
  unsigned gen;      /* barriers completed */
  const float **src; /* [n] the buffers posted for the collective in progress */
  float **dst;       /* [n] */
};

comm *comm_create(int n_ranks) {
  if (n_ranks < 1) return NULL;
  comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->src = calloc((size_t)n_ranks, sizeof *c->src);
  c->dst = calloc((size_t)n_ranks, sizeof *c->dst);
  if (!c->src || !c->dst) {
    free(c->src);
    free(c->dst);
    free(c);
    return NULL;
  }
  c->n = n_ranks;
  atomic_init(&c->refs, 1);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

comm *comm_ref(comm *c) {
  atomic_fetch_add(&c->refs, 1);
  return c;
}

void comm_unref(comm *c) {
  if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->src);
  free(c->dst);
  free(c);
}

int comm_size(const comm *c) { return c->n; }

void comm_barrier(comm *c) {
  if (c->n == 1) return;
  pthread_mutex_lock(&c->mu);
  unsigned gen = c->gen;
  if (++c->waiting == c->n) {
    c->waiting = 0;
    c->gen++;
    pthread_cond_broadcast(&c->cv);
  } else {
    while (gen == c->gen) pthread_cond_wait(&c->cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
}

/* Posts this rank's buffers for the collective in progress (read by others after a barrier). */
static void post(comm *c, int rank, const float *src, float *dst) {
  CHECK(rank >= 0 && rank < c->n);
  pthread_mutex_lock(&c->mu);
  c->src[rank] = src;
  c->dst[rank] = dst;
  pthread_mutex_unlock(&c->mu);
}

void comm_all_reduce_sum(comm *c, int rank, float *x, size_t n) {
  if (c->n == 1) return;
  post(c, rank, x, x);
  comm_barrier(c);
  size_t b = n * (size_t)rank / (size_t)c->n, e = n * (size_t)(rank + 1) / (size_t)c->n;
  float *const *d = c->dst;
  for (size_t i = b; i < e; i++) {
    float s = d[0][i];
    for (int r = 1; r < c->n; r++) s += d[r][i];
    for (int r = 0; r < c->n; r++) d[r][i] = s;
  }
  comm_barrier(c);
}

void comm_all_gather(comm *c, int rank, const float *src, size_t n, float *dst) {
  post(c, rank, src, dst);
  comm_barrier(c);
  for (int r = 0; r < c->n; r++) memcpy(dst + (size_t)r * n, c->src[r], n * sizeof *dst);
  comm_barrier(c);
}
