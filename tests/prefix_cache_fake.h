/* prefix_cache_fake.h — a fake device for the prefix-cache tests (no model).
 *
 * Page p holds 16 rows; row r of a sequence's position q is the running hash of its tokens
 * [0, q] (so a row depends on the whole prefix, as real K/V does). A state slot holds the
 * running hash after the tokens computed so far. The fake ops copy rows and states and count
 * every call, so tests can check what a restore did and compare a restored sequence with one
 * computed cold. */
#ifndef DS_PREFIX_CACHE_FAKE_H
#define DS_PREFIX_CACHE_FAKE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "cache/checkpoint.h"
#include "cache/kv_pages.h"
#include "cache/prefix_cache.h"
#include "cache/state_pool.h"

#define FK_SEED 0x9e3779b97f4a7c15ull
#define FK_PAGE_BYTES (KV_PAGES_TOKENS * sizeof(uint64_t))
#define FK_SLOT_BYTES sizeof(uint64_t)

typedef struct fake_dev {
  int n_pages, n_slots;
  uint64_t (*page)[KV_PAGES_TOKENS]; /* [n_pages][16] rows */
  uint64_t *slot;                    /* [n_slots] state */
  int n_zero, n_slot_copy, n_page_copy, n_page_read, n_page_write, n_slot_read, n_slot_write;
  int last_page_dst, last_page_src, last_slot_dst, last_slot_src;
} fake_dev;

static inline uint64_t fk_step(uint64_t h, int32_t tok) {
  h ^= (uint64_t)(uint32_t)tok + 0x100;
  h *= 1099511628211ull;
  return h ^ (h >> 29);
}
static inline uint64_t fk_hash(const int32_t *tok, int n) {
  uint64_t h = FK_SEED;
  for (int i = 0; i < n; i++) h = fk_step(h, tok[i]);
  return h;
}

static inline int fk_zero(void *c, int s) {
  fake_dev *d = c;
  d->n_zero++;
  d->slot[s] = FK_SEED;
  return 0;
}
static inline int fk_slot_copy(void *c, int dst, int src) {
  fake_dev *d = c;
  d->n_slot_copy++;
  d->last_slot_dst = dst;
  d->last_slot_src = src;
  d->slot[dst] = d->slot[src];
  return 0;
}
static inline int fk_page_copy(void *c, int dst, int src) {
  fake_dev *d = c;
  d->n_page_copy++;
  d->last_page_dst = dst;
  d->last_page_src = src;
  memcpy(d->page[dst], d->page[src], FK_PAGE_BYTES);
  return 0;
}
static inline int fk_page_read(void *c, int p, void *host) {
  fake_dev *d = c;
  d->n_page_read++;
  memcpy(host, d->page[p], FK_PAGE_BYTES);
  return 0;
}
static inline int fk_page_write(void *c, int p, const void *host) {
  fake_dev *d = c;
  d->n_page_write++;
  memcpy(d->page[p], host, FK_PAGE_BYTES);
  return 0;
}
static inline int fk_slot_read(void *c, int s, void *host) {
  fake_dev *d = c;
  d->n_slot_read++;
  memcpy(host, &d->slot[s], FK_SLOT_BYTES);
  return 0;
}
static inline int fk_slot_write(void *c, int s, const void *host) {
  fake_dev *d = c;
  d->n_slot_write++;
  memcpy(&d->slot[s], host, FK_SLOT_BYTES);
  return 0;
}

typedef struct fx {
  fake_dev dev;
  kv_pages *kp;
  state_pool *sp;
  prefix_cache *pc;
  int n_seq, n_slabs;
} fx;

/* device_slabs: device budget in slabs (0: all); host_slabs_bytes: host budget in bytes. */
static inline int fx_init(fx *f, int n_pages, int n_seq, int n_slabs, int device_slabs,
                          size_t host_bytes) {
  memset(f, 0, sizeof *f);
  f->n_seq = n_seq;
  f->n_slabs = n_slabs;
  f->dev.n_pages = n_pages;
  f->dev.n_slots = n_seq + n_slabs;
  f->dev.page = calloc((size_t)n_pages + 1, sizeof *f->dev.page);
  f->dev.slot = calloc((size_t)(n_seq + n_slabs) + 1, sizeof *f->dev.slot);
  state_pool_ops sops = {&f->dev, fk_zero, fk_slot_copy};
  if (kv_pages_init(&f->kp, n_pages) || state_pool_init(&f->sp, n_seq, n_slabs, &sops)) return -1;
  prefix_cache_opts o = {0};
  o.slab_bytes = FK_SLOT_BYTES;
  o.page_bytes = FK_PAGE_BYTES;
  o.device_budget_bytes = (size_t)device_slabs * FK_SLOT_BYTES;
  o.host_budget_bytes = host_bytes;
  o.ops = (prefix_cache_ops){&f->dev,       fk_page_copy, fk_page_read,
                             fk_page_write, fk_slot_read, fk_slot_write};
  return prefix_cache_init(&f->pc, f->kp, f->sp, &o);
}

/* Every integrity check; prints the first failure. */
static inline int fx_ok(const fx *f) {
  char err[256];
  if (kv_pages_check(f->kp, err, sizeof err) || state_pool_check(f->sp, err, sizeof err) ||
      prefix_cache_check(f->pc, err, sizeof err)) {
    printf("check: %s\n", err);
    return 0;
  }
  return 1;
}

/* Frees the cache and verifies nothing leaked: every page free, every slab free. */
static inline int fx_free(fx *f) {
  int ok = fx_ok(f);
  prefix_cache_free(f->pc);
  if (kv_pages_num_free(f->kp) != kv_pages_total(f->kp) ||
      state_pool_num_slabs_free(f->sp) != state_pool_num_slabs(f->sp) ||
      state_pool_num_slots_free(f->sp) != state_pool_num_slots(f->sp)) {
    printf("leak: pages free %d/%d, slabs free %d/%d, slots free %d/%d\n", kv_pages_num_free(f->kp),
           kv_pages_total(f->kp), state_pool_num_slabs_free(f->sp), state_pool_num_slabs(f->sp),
           state_pool_num_slots_free(f->sp), state_pool_num_slots(f->sp));
    ok = 0;
  }
  kv_pages_free(f->kp);
  state_pool_free(f->sp);
  free(f->dev.page);
  free(f->dev.slot);
  return ok;
}

/* A running sequence of the fake model. */
typedef struct fseq {
  kv_pages_table t;
  int slot;
  int n; /* positions computed */
} fseq;

static inline int fseq_init(fx *f, fseq *s, int cap_tokens) {
  s->n = 0;
  s->slot = -1;
  if (kv_pages_table_init(&s->t, kv_pages_for_tokens(cap_tokens))) return -1;
  if (state_pool_slot_alloc(f->sp, &s->slot)) {
    kv_pages_table_free(&s->t);
    s->slot = -1;
    return -1;
  }
  return 0;
}

/* Computes positions [s->n, upto) of tokens. Returns 0 or -1 (pages short). */
static inline int fseq_prefill(fx *f, fseq *s, const int32_t *tokens, int upto) {
  if (kv_pages_table_grow(f->kp, &s->t, upto)) return -1;
  uint64_t h = f->dev.slot[s->slot];
  for (int q = s->n; q < upto; q++) {
    h = fk_step(h, tokens[q]);
    f->dev.page[s->t.ids[q / KV_PAGES_TOKENS]][q % KV_PAGES_TOKENS] = h;
  }
  f->dev.slot[s->slot] = h;
  s->n = upto;
  return 0;
}

static inline void fseq_free(fx *f, fseq *s) {
  kv_pages_table_release(f->kp, &s->t);
  kv_pages_table_free(&s->t);
  if (s->slot >= 0) state_pool_slot_free(f->sp, s->slot);
  s->slot = -1;
}

/* 1 when the sequence's rows [0, n) and state match a cold computation of tokens. */
static inline int fseq_matches(const fx *f, const fseq *s, const int32_t *tokens, int n) {
  uint64_t h = FK_SEED;
  for (int q = 0; q < n; q++) {
    h = fk_step(h, tokens[q]);
    if (f->dev.page[s->t.ids[q / KV_PAGES_TOKENS]][q % KV_PAGES_TOKENS] != h) {
      printf("row %d differs\n", q);
      return 0;
    }
  }
  if (f->dev.slot[s->slot] != h) {
    printf("state differs\n");
    return 0;
  }
  return 1;
}

static inline checkpoint_payload fseq_payload(const fseq *s) {
  checkpoint_payload p = {s->n, s->slot, -1, s->t.ids, s->t.n};
  return p;
}

/* Computes tokens[0, depth) in a fresh sequence and commits a checkpoint there. Returns the
 * checkpoint id, 0 on any failure (everything released). */
static inline uint64_t fx_capture(fx *f, const char *salt, const int32_t *tokens, int depth,
                                  int flags) {
  fseq s;
  if (fseq_init(f, &s, depth + 16)) return 0;
  uint64_t ticket = 0, id = 0;
  if (checkpoint_reserve(f->pc, salt, tokens, depth, depth, flags, &ticket) == 0) {
    checkpoint_payload p;
    if (fseq_prefill(f, &s, tokens, depth) == 0 && (p = fseq_payload(&s), 1) &&
        checkpoint_capture(f->pc, ticket, &p) == 0 && checkpoint_commit(f->pc, ticket, &id) == 0)
      ticket = 0;
    if (ticket) checkpoint_abort(f->pc, ticket);
  }
  fseq_free(f, &s);
  return id;
}

/* Token runs: prompt k of length n, sharing the first `shared` tokens with prompt 0. */
static inline void fk_tokens(int32_t *out, int n, int k, int shared) {
  for (int i = 0; i < n; i++) out[i] = i < shared ? 1000 + i : 50000 + k * 7919 + i;
}

#endif
