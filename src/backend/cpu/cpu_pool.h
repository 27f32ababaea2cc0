/* cpu_pool — a fixed pool of worker threads running one parallel loop at a time.
 *
 * cpu_pool_run(p, n, fn, arg) splits [0, n) into at most n_threads contiguous ranges and calls
 * fn(arg, begin, end) once per range, the calling thread taking the first. It returns after
 * every range has finished. Items must be independent: the split depends on n and the thread
 * count, so callers partition only over outputs whose value does not depend on the split. */
#ifndef DS_CPU_POOL_H
#define DS_CPU_POOL_H
#include <stdint.h>

typedef struct cpu_pool cpu_pool;
typedef void (*cpu_pool_fn)(void *arg, int64_t begin, int64_t end);

/* Returns NULL when memory or threads are unavailable. n_threads >= 1. */
cpu_pool *cpu_pool_create(int n_threads);
void cpu_pool_free(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* Runs fn over [0, n). `min_per_thread` items at least per range (small loops stay on the
 * caller's thread). */
void cpu_pool_run(cpu_pool *p, int64_t n, int64_t min_per_thread, cpu_pool_fn fn, void *arg);

#endif
