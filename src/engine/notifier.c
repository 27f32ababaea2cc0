/* notifier — see notifier.h. One mutex guards the queue; the thread swaps it for an empty one
 * and fires the items outside the lock. */
#include "engine/notifier.h"

#include <pthread.h>
#include <stdlib.h>

struct notifier {
  void (*fire)(void *);
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void **q, **work; /* queued items; the batch the thread is firing (cap each) */
  int n, cap;
  int kicked, stop;
};

static void *notifier_main(void *arg) {
  notifier *n = arg;
  pthread_mutex_lock(&n->mu);
  for (;;) {
    while (!(n->kicked && n->n > 0) && !n->stop) pthread_cond_wait(&n->cv, &n->mu);
    if (n->n == 0 && n->stop) break;
    void **batch = n->q;
    int cnt = n->n;
    n->q = n->work;
    n->n = 0;
    n->kicked = 0;
    pthread_mutex_unlock(&n->mu);
    for (int i = 0; i < cnt; i++) n->fire(batch[i]);
    pthread_mutex_lock(&n->mu);
    n->work = batch;
  }
  pthread_mutex_unlock(&n->mu);
  return NULL;
}

notifier *notifier_start(void (*fire)(void *item), int cap) {
  notifier *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->fire = fire;
  n->cap = cap > 0 ? cap : 1;
  n->q = malloc((size_t)n->cap * sizeof *n->q);
  n->work = malloc((size_t)n->cap * sizeof *n->work);
  pthread_mutex_init(&n->mu, NULL);
  pthread_cond_init(&n->cv, NULL);
  if (!n->q || !n->work || pthread_create(&n->thread, NULL, notifier_main, n) != 0) {
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n->q);
    free(n->work);
    free(n);
    return NULL;
  }
  return n;
}

int notifier_post(notifier *n, void *item) {
  pthread_mutex_lock(&n->mu);
  int ok = n->n < n->cap;
  if (ok) n->q[n->n++] = item;
  pthread_mutex_unlock(&n->mu);
  return ok ? 0 : -1;
}

void notifier_kick(notifier *n) {
  pthread_mutex_lock(&n->mu);
  n->kicked = 1;
  pthread_cond_signal(&n->cv);
  pthread_mutex_unlock(&n->mu);
}

void notifier_stop(notifier *n) {
  if (!n) return;
  pthread_mutex_lock(&n->mu);
  n->stop = 1;
  n->kicked = 1;
  pthread_cond_signal(&n->cv);
  pthread_mutex_unlock(&n->mu);
  pthread_join(n->thread, NULL);
  pthread_mutex_destroy(&n->mu);
  pthread_cond_destroy(&n->cv);
  free(n->q);
  free(n->work);
  free(n);
}
