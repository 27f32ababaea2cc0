/* kv_pages — the pool of KV-cache pages shared by every full-attention layer.
 *
 * A page holds KV_PAGES_TOKENS (16) consecutive token positions of one sequence; page id p
 * names the same rows in every full-attention layer (the device memory is qwen35's). This
 * module only counts: which ids are free, who references them. It never decides anything;
 * the scheduler and the prefix cache do.
 *
 * Two kinds of reference per page:
 *   ref        held by running sequences (through their page tables)
 *   cache_ref  held by the prefix cache (a checkpoint that maps the page)
 *
 *        alloc                      unref to 0, cache_ref > 0
 *  FREE -------> IN USE (ref > 0) -----------------------------> CACHED (ref 0, cache_ref > 0)
 *   ^   <-------    |   ^                                              |   |
 *   |  unref to 0,  |   +---------------- ref (prefix hit) -----------+   |
 *   |  no cache_ref |                                                      |
 *   +------------------------------ cache_unref to 0 ---------------------+
 *
 * Free pages sit in a FIFO queue (freed pages go to the tail, allocation takes the head), so
 * page ids are deterministic and tests can name them. Allocation is all-or-nothing.
 * Invariant (kv_pages_check): free + cached + in use = total, and the queue holds exactly the
 * pages with no reference of either kind.
 *
 * A page table (kv_pages_table) is one sequence's list of page ids, position order; its
 * storage is allocated once when the request is accepted, so growing it never allocates. */
#ifndef DS_KV_PAGES_H
#define DS_KV_PAGES_H
#include <stddef.h>
#include <stdint.h>

#include "base/kv_page.h"

#define KV_PAGES_TOKENS KV_PAGE_TOKENS /* positions per page (base/kv_page.h) */

typedef struct kv_pages kv_pages;

/* Creates a pool of n_pages free pages (ids 0..n_pages-1). Returns 0, or -1 on out of
 * memory (start-up only). */
int kv_pages_init(kv_pages **out, int n_pages);
void kv_pages_free(kv_pages *kp);

int kv_pages_total(const kv_pages *kp);
int kv_pages_num_free(const kv_pages *kp);
int kv_pages_num_cached(const kv_pages *kp);     /* referenced only by the prefix cache */
int kv_pages_num_used(const kv_pages *kp);       /* referenced by at least one sequence */
int kv_pages_num_cache_held(const kv_pages *kp); /* referenced by the prefix cache (any others) */

/* Pages needed to hold n_tokens positions. */
static inline int kv_pages_for_tokens(int n_tokens) {
  return (n_tokens + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS;
}

/* 1 when n pages can be allocated now. */
int kv_pages_can_alloc(const kv_pages *kp, int n);
/* Allocates n pages (refcount 1 each) into ids[0..n), all or nothing. Returns 0, or -1 when
 * fewer than n are free or the fault site "kv_pages_alloc" fires (nothing changes then). */
int kv_pages_alloc(kv_pages *kp, int n, int32_t *ids);
/* Sequence references: ref adds one (a page mapped from the prefix cache into another
 * sequence), unref drops one; the page returns to the free queue when no reference of
 * either kind is left. */
void kv_pages_ref(kv_pages *kp, int32_t id);
void kv_pages_unref(kv_pages *kp, int32_t id);
/* Prefix-cache references (the hooks the prefix cache uses): a page referenced only by the
 * cache counts as cached; dropping the last reference frees it. */
void kv_pages_cache_ref(kv_pages *kp, int32_t id);
void kv_pages_cache_unref(kv_pages *kp, int32_t id);
int kv_pages_refcount(const kv_pages *kp, int32_t id);
int kv_pages_cache_refcount(const kv_pages *kp, int32_t id);

/* Verifies every invariant; returns 0, or -1 with one line in err. */
int kv_pages_check(const kv_pages *kp, char *err, size_t errlen);

/* One sequence's page table: ids[0..n) cover positions [0, n*KV_PAGES_TOKENS). Owned by the
 * request. */
typedef struct kv_pages_table {
  int32_t *ids; /* [cap] */
  int n, cap;
} kv_pages_table;

/* Allocates room for cap page ids (request-time: fault site "kv_pages_table_init").
 * Returns 0 or -1 on out of memory. */
int kv_pages_table_init(kv_pages_table *t, int cap);
void kv_pages_table_free(kv_pages_table *t);
/* Pages missing for the table to cover n_tokens positions (0 when it already does). */
int kv_pages_table_need(const kv_pages_table *t, int n_tokens);
/* Grows the table to cover n_tokens positions, all or nothing. Returns 0, or -1 (pool short,
 * fault, or beyond the table's capacity). */
int kv_pages_table_grow(kv_pages *kp, kv_pages_table *t, int n_tokens);
/* Drops the table's reference on each of its pages (last page first) and empties it. */
void kv_pages_table_release(kv_pages *kp, kv_pages_table *t);

#endif
