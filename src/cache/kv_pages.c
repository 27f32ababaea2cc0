#include "cache/kv_pages.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/fault.h"
#include "base/log.h"

struct kv_pages {
  int n_pages;
  int32_t *ref;       /* [n_pages] sequence references */
  int32_t *cache_ref; /* [n_pages] prefix-cache references */
  int32_t *queue;     /* [n_pages] ring of free page ids, head first */
  int q_head, q_len;
  int n_cached, n_used;
  int n_cache_held; /* pages with a prefix-cache reference, whatever else holds them */
};

int kv_pages_init(kv_pages **out, int n_pages) {
  *out = NULL;
  if (n_pages < 0) return -1;
  kv_pages *kp = calloc(1, sizeof *kp);
  if (!kp) return -1;
  size_t n = n_pages > 0 ? (size_t)n_pages : 1;
  kp->ref = calloc(n, sizeof *kp->ref);
  kp->cache_ref = calloc(n, sizeof *kp->cache_ref);
  kp->queue = calloc(n, sizeof *kp->queue);
  if (!kp->ref || !kp->cache_ref || !kp->queue) {
    kv_pages_free(kp);
    return -1;
  }
  kp->n_pages = n_pages;
  for (int i = 0; i < n_pages; i++) kp->queue[i] = i;
  kp->q_len = n_pages;
  *out = kp;
  return 0;
}

void kv_pages_free(kv_pages *kp) {
  if (!kp) return;
  free(kp->ref);
  free(kp->cache_ref);
  free(kp->queue);
  free(kp);
}

int kv_pages_total(const kv_pages *kp) { return kp->n_pages; }
int kv_pages_num_free(const kv_pages *kp) { return kp->q_len; }
int kv_pages_num_cached(const kv_pages *kp) { return kp->n_cached; }
int kv_pages_num_used(const kv_pages *kp) { return kp->n_used; }
int kv_pages_num_cache_held(const kv_pages *kp) { return kp->n_cache_held; }

int kv_pages_can_alloc(const kv_pages *kp, int n) { return n >= 0 && n <= kp->q_len; }

static void kv_pages_push_free(kv_pages *kp, int32_t id) {
  CHECK(kp->q_len < kp->n_pages);
  kp->queue[(kp->q_head + kp->q_len) % kp->n_pages] = id;
  kp->q_len++;
}

int kv_pages_alloc(kv_pages *kp, int n, int32_t *ids) {
  if (n < 0 || n > kp->q_len) return -1;
  if (n == 0) return 0;
  if (fault_hit("kv_pages_alloc")) return -1;
  for (int i = 0; i < n; i++) {
    int32_t id = kp->queue[kp->q_head];
    kp->q_head = (kp->q_head + 1) % kp->n_pages;
    kp->q_len--;
    CHECK(kp->ref[id] == 0 && kp->cache_ref[id] == 0);
    kp->ref[id] = 1;
    ids[i] = id;
  }
  kp->n_used += n;
  return 0;
}

void kv_pages_ref(kv_pages *kp, int32_t id) {
  CHECK(id >= 0 && id < kp->n_pages);
  CHECK(kp->ref[id] > 0 || kp->cache_ref[id] > 0); /* a free page is allocated, not ref'd */
  if (kp->ref[id] == 0) {
    kp->n_cached--;
    kp->n_used++;
  }
  kp->ref[id]++;
}

void kv_pages_unref(kv_pages *kp, int32_t id) {
  CHECK(id >= 0 && id < kp->n_pages);
  CHECK(kp->ref[id] > 0);
  if (--kp->ref[id] > 0) return;
  kp->n_used--;
  if (kp->cache_ref[id] > 0)
    kp->n_cached++;
  else
    kv_pages_push_free(kp, id);
}

void kv_pages_cache_ref(kv_pages *kp, int32_t id) {
  CHECK(id >= 0 && id < kp->n_pages);
  CHECK(kp->ref[id] > 0 || kp->cache_ref[id] > 0);
  kp->n_cache_held += kp->cache_ref[id]++ == 0;
}

void kv_pages_cache_unref(kv_pages *kp, int32_t id) {
  CHECK(id >= 0 && id < kp->n_pages);
  CHECK(kp->cache_ref[id] > 0);
  kp->n_cache_held -= kp->cache_ref[id] == 1;
  if (--kp->cache_ref[id] > 0 || kp->ref[id] > 0) return;
  kp->n_cached--;
  kv_pages_push_free(kp, id);
}

int kv_pages_refcount(const kv_pages *kp, int32_t id) { return kp->ref[id]; }
int kv_pages_cache_refcount(const kv_pages *kp, int32_t id) { return kp->cache_ref[id]; }

int kv_pages_check(const kv_pages *kp, char *err, size_t errlen) {
  int n_free = 0, n_cached = 0, n_used = 0, n_held = 0;
  for (int i = 0; i < kp->n_pages; i++) {
    n_held += kp->cache_ref[i] > 0;
    if (kp->ref[i] < 0 || kp->cache_ref[i] < 0)
      return errf(err, errlen, "kv_pages: page %d has a negative refcount", i);
    if (kp->ref[i] > 0)
      n_used++;
    else if (kp->cache_ref[i] > 0)
      n_cached++;
    else
      n_free++;
  }
  if (n_free != kp->q_len)
    return errf(err, errlen, "kv_pages: %d unreferenced pages but %d in the free queue", n_free,
                kp->q_len);
  if (n_cached != kp->n_cached || n_used != kp->n_used)
    return errf(err, errlen, "kv_pages: counted cached %d used %d, recorded %d %d", n_cached,
                n_used, kp->n_cached, kp->n_used);
  if (n_held != kp->n_cache_held)
    return errf(err, errlen, "kv_pages: %d pages held by the prefix cache, recorded %d", n_held,
                kp->n_cache_held);
  if (n_free + n_cached + n_used != kp->n_pages)
    return errf(err, errlen, "kv_pages: free %d + cached %d + used %d != total %d", n_free,
                n_cached, n_used, kp->n_pages);
  char *seen = calloc(kp->n_pages > 0 ? (size_t)kp->n_pages : 1, 1);
  if (!seen) return errf(err, errlen, "kv_pages: out of memory in check");
  int bad = -1;
  for (int i = 0; i < kp->q_len && bad < 0; i++) {
    int32_t id = kp->queue[(kp->q_head + i) % kp->n_pages];
    if (id < 0 || id >= kp->n_pages || seen[id] || kp->ref[id] || kp->cache_ref[id])
      bad = id;
    else
      seen[id] = 1;
  }
  free(seen);
  if (bad >= 0) return errf(err, errlen, "kv_pages: page %d is wrongly in the free queue", bad);
  return 0;
}

int kv_pages_table_init(kv_pages_table *t, int cap) {
  t->ids = NULL;
  t->n = 0;
  t->cap = 0;
  if (cap < 0 || fault_hit("kv_pages_table_init")) return -1;
  t->ids = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *t->ids);
  if (!t->ids) return -1;
  t->cap = cap;
  return 0;
}

void kv_pages_table_free(kv_pages_table *t) {
  CHECK(t->n == 0); /* released first */
  free(t->ids);
  t->ids = NULL;
  t->cap = 0;
}

int kv_pages_table_need(const kv_pages_table *t, int n_tokens) {
  int need = kv_pages_for_tokens(n_tokens) - t->n;
  return need > 0 ? need : 0;
}

int kv_pages_table_grow(kv_pages *kp, kv_pages_table *t, int n_tokens) {
  int need = kv_pages_table_need(t, n_tokens);
  if (need == 0) return 0;
  if (t->n + need > t->cap) return -1;
  if (kv_pages_alloc(kp, need, t->ids + t->n) != 0) return -1;
  t->n += need;
  return 0;
}

void kv_pages_table_release(kv_pages *kp, kv_pages_table *t) {
  for (int i = t->n - 1; i >= 0; i--) kv_pages_unref(kp, t->ids[i]);
  t->n = 0;
}
