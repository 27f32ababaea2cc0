#include "cache/host_tier.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"

typedef struct host_entry {
  unsigned char *data; /* [slot_bytes if has_slot][n_pages * page_bytes]; NULL when free */
  size_t bytes;
  int has_slot, n_pages;
  uint64_t tick; /* last use */
  int next_free;
} host_entry;

struct host_tier {
  size_t budget, used, slot_bytes, page_bytes;
  host_tier_ops ops;
  host_entry *e; /* [cap] */
  int n, cap, free_head, live;
  uint64_t tick;
};

int host_tier_init(host_tier **out, size_t budget, size_t slot_bytes, size_t page_bytes,
                   const host_tier_ops *ops) {
  *out = NULL;
  host_tier *ht = calloc(1, sizeof *ht);
  if (!ht) return -1;
  ht->budget = budget;
  ht->slot_bytes = slot_bytes;
  ht->page_bytes = page_bytes;
  if (ops) ht->ops = *ops;
  ht->free_head = -1;
  *out = ht;
  return 0;
}

void host_tier_free(host_tier *ht) {
  if (!ht) return;
  for (int i = 0; i < ht->n; i++) free(ht->e[i].data);
  free(ht->e);
  free(ht);
}

size_t host_tier_budget(const host_tier *ht) { return ht->budget; }
size_t host_tier_bytes(const host_tier *ht) { return ht->used; }
int host_tier_count(const host_tier *ht) { return ht->live; }

size_t host_tier_entry_size(const host_tier *ht, int has_slot, int n_pages) {
  return (has_slot ? ht->slot_bytes : 0) + (size_t)n_pages * ht->page_bytes;
}

int host_tier_live(const host_tier *ht, int entry) {
  return entry >= 0 && entry < ht->n && ht->e[entry].data != NULL;
}
int host_tier_entry_pages(const host_tier *ht, int entry) {
  return host_tier_live(ht, entry) ? ht->e[entry].n_pages : -1;
}
const void *host_tier_entry_data(const host_tier *ht, int entry) {
  return host_tier_live(ht, entry) ? ht->e[entry].data : NULL;
}
int host_tier_entry_has_slot(const host_tier *ht, int entry) {
  return host_tier_live(ht, entry) ? ht->e[entry].has_slot : 0;
}

/* A free handle (growing the table: fault site "host_tier_alloc"), or -1. */
static int host_tier_take_handle(host_tier *ht) {
  if (ht->free_head >= 0) {
    int i = ht->free_head;
    ht->free_head = ht->e[i].next_free;
    return i;
  }
  if (ht->n == ht->cap) {
    if (fault_hit("host_tier_alloc")) return -1;
    int cap = ht->cap ? ht->cap * 2 : 16;
    host_entry *e = realloc(ht->e, (size_t)cap * sizeof *e);
    if (!e) return -1;
    ht->e = e;
    ht->cap = cap;
  }
  memset(&ht->e[ht->n], 0, sizeof ht->e[0]);
  return ht->n++;
}

static void host_tier_put_handle(host_tier *ht, int i) {
  ht->e[i].data = NULL;
  ht->e[i].next_free = ht->free_head;
  ht->free_head = i;
}

int host_tier_put(host_tier *ht, int slot, const int32_t *pages, int n_pages, int *entry) {
  int has_slot = slot >= 0;
  if (n_pages < 0 || (!has_slot && n_pages == 0)) return -1;
  size_t bytes = host_tier_entry_size(ht, has_slot, n_pages);
  if (bytes > ht->budget - ht->used) return -1;
  int i = host_tier_take_handle(ht);
  if (i < 0) return -1;
  unsigned char *d = NULL;
  if (!fault_hit("host_tier_alloc")) d = malloc(bytes ? bytes : 1);
  if (!d) {
    host_tier_put_handle(ht, i);
    return -1;
  }
  int rc = 0;
  unsigned char *p = d;
  if (has_slot) {
    if (fault_hit("host_tier_read") ||
        (ht->ops.slot_read && ht->ops.slot_read(ht->ops.ctx, slot, p)))
      rc = -1;
    p += ht->slot_bytes;
  }
  for (int k = 0; k < n_pages && rc == 0; k++, p += ht->page_bytes)
    if (fault_hit("host_tier_read") ||
        (ht->ops.page_read && ht->ops.page_read(ht->ops.ctx, pages[k], p)))
      rc = -1;
  if (rc) {
    free(d);
    host_tier_put_handle(ht, i);
    return -1;
  }
  host_entry *e = &ht->e[i];
  e->data = d;
  e->bytes = bytes;
  e->has_slot = has_slot;
  e->n_pages = n_pages;
  e->tick = ++ht->tick;
  ht->used += bytes;
  ht->live++;
  *entry = i;
  return 0;
}

int host_tier_write_slot(host_tier *ht, int entry, int slot) {
  CHECK(host_tier_live(ht, entry) && ht->e[entry].has_slot);
  if (fault_hit("host_tier_write")) return -1;
  if (ht->ops.slot_write && ht->ops.slot_write(ht->ops.ctx, slot, ht->e[entry].data)) return -1;
  return 0;
}

int host_tier_write_pages(host_tier *ht, int entry, const int32_t *pages, int n_pages) {
  CHECK(host_tier_live(ht, entry) && ht->e[entry].n_pages == n_pages);
  if (fault_hit("host_tier_write")) return -1;
  host_entry *e = &ht->e[entry];
  const unsigned char *p = e->data + (e->has_slot ? ht->slot_bytes : 0);
  for (int k = 0; k < n_pages; k++, p += ht->page_bytes)
    if (ht->ops.page_write && ht->ops.page_write(ht->ops.ctx, pages[k], p)) return -1;
  return 0;
}

void host_tier_drop(host_tier *ht, int entry) {
  CHECK(host_tier_live(ht, entry));
  host_entry *e = &ht->e[entry];
  free(e->data);
  ht->used -= e->bytes;
  ht->live--;
  host_tier_put_handle(ht, entry);
}

void host_tier_touch(host_tier *ht, int entry) {
  CHECK(host_tier_live(ht, entry));
  ht->e[entry].tick = ++ht->tick;
}

int host_tier_oldest(const host_tier *ht) {
  int best = -1;
  for (int i = 0; i < ht->n; i++)
    if (ht->e[i].data && (best < 0 || ht->e[i].tick < ht->e[best].tick)) best = i;
  return best;
}

int host_tier_check(const host_tier *ht, char *err, size_t errlen) {
  size_t used = 0;
  int live = 0, n_free = 0;
  for (int i = 0; i < ht->n; i++) {
    const host_entry *e = &ht->e[i];
    if (!e->data) continue;
    live++;
    if (e->bytes != host_tier_entry_size(ht, e->has_slot, e->n_pages))
      return errf(err, errlen, "host_tier: entry %d holds %zu bytes, expected %zu", i, e->bytes,
                  host_tier_entry_size(ht, e->has_slot, e->n_pages));
    used += e->bytes;
  }
  for (int i = ht->free_head; i >= 0; i = ht->e[i].next_free) {
    if (i >= ht->n || ht->e[i].data || ++n_free > ht->n)
      return errf(err, errlen, "host_tier: broken free list at %d", i);
  }
  if (live != ht->live || used != ht->used)
    return errf(err, errlen, "host_tier: counted %d entries %zu bytes, recorded %d %zu", live, used,
                ht->live, ht->used);
  if (live + n_free != ht->n)
    return errf(err, errlen, "host_tier: %d live + %d free != %d handles", live, n_free, ht->n);
  if (ht->used > ht->budget)
    return errf(err, errlen, "host_tier: %zu bytes over the budget of %zu", ht->used, ht->budget);
  return 0;
}
