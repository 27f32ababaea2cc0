/* stats_log — see stats_log.h. */
#include "server/stats_log.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "base/log.h"

struct stats_log {
  engine *eng;
  double interval_s;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled by stats_log_free */
  int stop;
};

static double stats_log_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits until `until` (monotonic seconds) or stop; returns stop. */
static int stats_log_wait(stats_log *l, double until) {
  struct timespec ts;
  ts.tv_sec = (time_t)until;
  ts.tv_nsec = (long)((until - floor(until)) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  pthread_mutex_lock(&l->mu);
  while (!l->stop && stats_log_now() < until) pthread_cond_timedwait(&l->cv, &l->mu, &ts);
  int stop = l->stop;
  pthread_mutex_unlock(&l->mu);
  return stop;
}

static void *stats_log_main(void *arg) {
  stats_log *l = arg;
  engine_stats prev;
  engine_get_stats(l->eng, &prev);
  double t_prev = stats_log_now();
  int was_active = 0;
  while (!stats_log_wait(l, t_prev + l->interval_s)) {
    engine_stats s;
    engine_get_stats(l->eng, &s);
    double t = stats_log_now(), dt = t - t_prev > 1e-9 ? t - t_prev : 1e-9;
    long long prompt = s.prefilled_tokens_total - prev.prefilled_tokens_total;
    long long gen = s.generation_tokens_total - prev.generation_tokens_total;
    int active = prompt > 0 || gen > 0 || s.num_running > 0 || s.num_waiting > 0;
    if (active || was_active) {
      double kv = s.kv_pages_total > 0 ? 100.0 * s.kv_pages_used / s.kv_pages_total : 0.0;
      double hit = s.prompt_tokens_total > 0
                       ? 100.0 * (double)s.prefix_hit_tokens / (double)s.prompt_tokens_total
                       : 0.0;
      log_info(
          "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
          "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit "
          "rate: %.1f%%",
          (double)prompt / dt, (double)gen / dt, s.num_running, s.num_waiting, kv,
          hit > 100.0 ? 100.0 : hit);
    }
    was_active = active;
    prev = s;
    t_prev = t;
  }
  return NULL;
}

stats_log *stats_log_new(engine *eng, double interval_s) {
  stats_log *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->eng = eng;
  l->interval_s = interval_s;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&l->th, NULL, stats_log_main, l)) {
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
    return NULL;
  }
  return l;
}

void stats_log_free(stats_log *l) {
  if (!l) return;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->th, NULL);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}
