#include "cache/pc_events.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/kv_page.h"
#include "base/log.h"
#include "cache/block_hash.h"

/* ---------------------------------------------------------------- the count table */

/* Open addressing with linear probing and backward-shift deletion; a slot is used when its
 * count is > 0. */
typedef struct pc_events_slot {
  uint64_t h;
  int medium;
  int count;
} pc_events_slot;

typedef struct pc_events_table {
  pc_events_slot *s; /* [cap], cap a power of two */
  size_t cap, n;
} pc_events_table;

struct pc_events {
  kv_events *ev;
  pc_events_table t;
  int muted;         /* inside a clear */
  int32_t *tokens;   /* [cap_tokens] scratch: a record's path */
  uint64_t *hashes;  /* [cap_hashes] scratch: its block names */
  uint64_t *changed; /* [cap_hashes] scratch: names whose count crossed 0 */
  int cap_tokens, cap_hashes;
};

static size_t pc_events_slot_of(const pc_events_table *t, uint64_t h, int medium) {
  uint64_t x = h ^ ((uint64_t)medium * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (size_t)x & (t->cap - 1);
}

static int pc_events_table_grow(pc_events_table *t) {
  size_t cap = t->cap ? t->cap * 2 : 1024;
  pc_events_slot *s = calloc(cap, sizeof *s);
  if (!s) return -1;
  pc_events_table nt = {s, cap, 0};
  for (size_t i = 0; i < t->cap; i++) {
    if (t->s[i].count <= 0) continue;
    size_t at = pc_events_slot_of(&nt, t->s[i].h, t->s[i].medium);
    while (nt.s[at].count > 0) at = (at + 1) & (cap - 1);
    nt.s[at] = t->s[i];
    nt.n++;
  }
  free(t->s);
  *t = nt;
  return 0;
}

/* Adds delta to (h, medium)'s count. Returns the new count, or -1 on out of memory. */
static int pc_events_table_add(pc_events_table *t, uint64_t h, int medium, int delta) {
  if ((t->n + 1) * 4 > t->cap * 3 && pc_events_table_grow(t)) return -1;
  size_t mask = t->cap - 1, at = pc_events_slot_of(t, h, medium);
  while (t->s[at].count > 0 && (t->s[at].h != h || t->s[at].medium != medium)) at = (at + 1) & mask;
  pc_events_slot *e = &t->s[at];
  if (e->count == 0) {
    CHECK(delta > 0); /* a block leaves a medium it never entered */
    *e = (pc_events_slot){h, medium, 0};
    t->n++;
  }
  e->count += delta;
  CHECK(e->count >= 0);
  int c = e->count;
  if (c == 0) { /* backward-shift deletion keeps every probe run unbroken */
    t->n--;
    size_t hole = at, j = at;
    for (;;) {
      j = (j + 1) & mask;
      if (t->s[j].count <= 0) break;
      size_t home = pc_events_slot_of(t, t->s[j].h, t->s[j].medium);
      if (((j - home) & mask) >= ((j - hole) & mask)) {
        t->s[hole] = t->s[j];
        hole = j;
      }
    }
    t->s[hole].count = 0;
  }
  return c;
}

static int pc_events_table_get(const pc_events_table *t, uint64_t h, int medium) {
  if (!t->cap) return 0;
  size_t mask = t->cap - 1, at = pc_events_slot_of(t, h, medium);
  while (t->s[at].count > 0) {
    if (t->s[at].h == h && t->s[at].medium == medium) return t->s[at].count;
    at = (at + 1) & mask;
  }
  return 0;
}

/* ---------------------------------------------------------------- init / free */

int pc_events_init(pc_events **out, kv_events *ev) {
  *out = NULL;
  pc_events *pe = calloc(1, sizeof *pe);
  if (!pe || pc_events_table_grow(&pe->t)) {
    free(pe);
    return -1;
  }
  pe->ev = ev;
  *out = pe;
  return 0;
}

void pc_events_free(pc_events *pe) {
  if (!pe) return;
  free(pe->t.s);
  free(pe->tokens);
  free(pe->hashes);
  free(pe->changed);
  free(pe);
}

int pc_events_kv_medium(const pc_rec *r) {
  if (r->kv_dev) return KV_EVENTS_MEDIUM_GPU;
  if (r->host_kv >= 0) return KV_EVENTS_MEDIUM_CPU;
  return -1;
}

int pc_events_state_medium(const pc_rec *r) {
  if (r->slab >= 0) return KV_EVENTS_MEDIUM_GPU;
  if (r->host_slab >= 0) return KV_EVENTS_MEDIUM_CPU;
  return -1;
}

/* ---------------------------------------------------------------- a record's names */

/* Room for a path of depth tokens and its names. Returns 0 or -1 (out of memory). */
static int pc_events_room(pc_events *pe, int depth) {
  int nb = depth / KV_PAGE_TOKENS;
  if (depth > pe->cap_tokens) {
    int32_t *t = realloc(pe->tokens, (size_t)depth * sizeof *t);
    if (!t) return -1;
    pe->tokens = t;
    pe->cap_tokens = depth;
  }
  if (nb + 1 > pe->cap_hashes) {
    uint64_t *h = realloc(pe->hashes, (size_t)(nb + 1) * sizeof *h);
    if (h) pe->hashes = h;
    uint64_t *c = h ? realloc(pe->changed, (size_t)(nb + 1) * sizeof *c) : NULL;
    if (!c) return -1;
    pe->changed = c;
    pe->cap_hashes = nb + 1;
  }
  return 0;
}

/* The path of record r into pe->tokens. Returns its salt, NULL on out of memory. */
static const char *pc_events_path(pc_events *pe, const pc_rec *r) {
  const pc_node *n = r->node;
  CHECK(n != NULL);
  if (pc_events_room(pe, n->depth)) return NULL;
  for (; n->parent; n = n->parent)
    memcpy(pe->tokens + n->depth - n->n_label, n->label, (size_t)n->n_label * sizeof(int32_t));
  return n->salt;
}

/* Out of memory while naming: the consumers' view can no longer be kept exact, so they are
 * told to forget this replica's blocks (an under-estimate is safe for a router). */
static void pc_events_lost(pc_events *pe) {
  log_warn("kv events: out of memory naming blocks; AllBlocksCleared sent");
  if (!pe->muted) kv_events_all_cleared(pe->ev);
}

/* The full blocks of tokens[0, depth) (pe->tokens or the caller's) gain or lose a holder in
 * medium m; count crossings are reported. */
static void pc_events_blocks(pc_events *pe, const int32_t *tokens, int depth, const char *salt,
                             kv_events_medium m, int delta) {
  if (pc_events_room(pe, depth)) {
    pc_events_lost(pe);
    return;
  }
  int nb = block_hash_chain(tokens, depth, salt, pe->hashes);
  if (delta > 0) {
    for (int k = 0; k < nb; k++) { /* changed[k]: 1 when block k is new to the medium */
      int c = pc_events_table_add(&pe->t, pe->hashes[k], (int)m, 1);
      if (c < 0) {
        pc_events_lost(pe);
        return;
      }
      pe->changed[k] = c == 1;
    }
    for (int a = 0; a < nb;) { /* each run of new blocks: one BlockStored */
      if (!pe->changed[a]) {
        a++;
        continue;
      }
      int b = a + 1;
      while (b < nb && pe->changed[b]) b++;
      if (!pe->muted)
        kv_events_block_stored(pe->ev, pe->hashes + a, b - a, a ? pe->hashes[a - 1] : 0, a > 0,
                               tokens + (size_t)a * KV_PAGE_TOKENS, salt, m);
      a = b;
    }
  } else {
    int n_gone = 0;
    for (int k = nb - 1; k >= 0; k--) /* deepest first: a router never holds a child alone */
      if (pc_events_table_add(&pe->t, pe->hashes[k], (int)m, -1) == 0)
        pe->changed[n_gone++] = pe->hashes[k];
    if (!pe->muted) kv_events_block_removed(pe->ev, pe->changed, n_gone, m);
  }
}

/* The state after tokens[0, depth) enters (+1) or leaves (-1) medium m. */
static void pc_events_state_of(pc_events *pe, const int32_t *tokens, int depth, const char *salt,
                               kv_events_medium m, int delta) {
  if (pe->muted) return;
  if (pc_events_room(pe, depth)) {
    pc_events_lost(pe);
    return;
  }
  int nb = block_hash_chain(tokens, depth, salt, pe->hashes);
  int tail = depth - nb * KV_PAGE_TOKENS;
  uint64_t h = nb ? pe->hashes[nb - 1] : 0;
  if (tail > 0) h = block_hash(h, tokens + (size_t)nb * KV_PAGE_TOKENS, tail, nb ? NULL : salt);
  if (delta > 0)
    kv_events_state_stored(pe->ev, h, depth, salt, m);
  else
    kv_events_state_removed(pe->ev, h, depth, salt, m);
}

void pc_events_kv(prefix_cache *pc, int i, kv_events_medium m, int delta) {
  pc_events *pe = pc->events;
  if (!pe) return;
  const char *salt = pc_events_path(pe, &pc->recs[i]);
  if (!salt) {
    pc_events_lost(pe);
    return;
  }
  pc_events_blocks(pe, pe->tokens, pc->recs[i].node->depth, salt, m, delta);
}

void pc_events_state(prefix_cache *pc, int i, kv_events_medium m, int delta) {
  pc_events *pe = pc->events;
  if (!pe || pe->muted) return;
  const char *salt = pc_events_path(pe, &pc->recs[i]);
  if (!salt) {
    pc_events_lost(pe);
    return;
  }
  pc_events_state_of(pe, pe->tokens, pc->recs[i].node->depth, salt, m, delta);
}

void pc_events_disk(void *ctx, int stored, const char *salt, const int32_t *tokens, int depth) {
  prefix_cache *pc = ctx;
  pc_events *pe = pc->events;
  if (!pe || depth <= 0) return;
  pc_events_blocks(pe, tokens, depth, salt, KV_EVENTS_MEDIUM_DISK, stored ? 1 : -1);
  pc_events_state_of(pe, tokens, depth, salt, KV_EVENTS_MEDIUM_DISK, stored ? 1 : -1);
}

void pc_events_enter(prefix_cache *pc, int i) {
  if (!pc->events) return;
  const pc_rec *r = &pc->recs[i];
  int km = pc_events_kv_medium(r), sm = pc_events_state_medium(r);
  if (km >= 0) pc_events_kv(pc, i, (kv_events_medium)km, +1);
  if (sm >= 0) pc_events_state(pc, i, (kv_events_medium)sm, +1);
}

void pc_events_leave(prefix_cache *pc, int i) {
  if (!pc->events) return;
  const pc_rec *r = &pc->recs[i];
  int km = pc_events_kv_medium(r), sm = pc_events_state_medium(r);
  if (sm >= 0) pc_events_state(pc, i, (kv_events_medium)sm, -1);
  if (km >= 0) pc_events_kv(pc, i, (kv_events_medium)km, -1);
}

void pc_events_clear_begin(prefix_cache *pc) {
  if (pc->events) pc->events->muted = 1;
}

void pc_events_clear_end(prefix_cache *pc) {
  pc_events *pe = pc->events;
  if (!pe) return;
  pe->muted = 0;
  memset(pe->t.s, 0, pe->t.cap * sizeof *pe->t.s);
  pe->t.n = 0;
  kv_events_all_cleared(pe->ev);
  for (int i = 0; i < pc->n_recs; i++)
    if (pc->recs[i].state == PC_REC_COMMITTED) pc_events_enter(pc, i);
  for (int e = 0; pc->dt && e < disk_tier_handles(pc->dt); e++) /* the files that stayed */
    if (disk_tier_live(pc->dt, e))
      pc_events_disk(pc, 1, disk_tier_entry_salt(pc->dt, e), disk_tier_entry_tokens(pc->dt, e),
                     disk_tier_entry_depth(pc->dt, e));
}

/* ---------------------------------------------------------------- check */

size_t pc_events_held(const prefix_cache *pc) { return pc->events ? pc->events->t.n : 0; }

int pc_events_holders(const prefix_cache *pc, uint64_t h, int medium) {
  return pc->events ? pc_events_table_get(&pc->events->t, h, medium) : 0;
}

int pc_events_check(const prefix_cache *pc, char *err, size_t errlen) {
  pc_events *pe = pc->events;
  if (!pe) return 0;
  pc_events_table want = {0};
  int rc = pc_events_table_grow(&want) ? errf(err, errlen, "kv events check: out of memory") : 0;
  for (int i = 0; !rc && i < pc->n_recs; i++) {
    const pc_rec *r = &pc->recs[i];
    int km = pc_events_kv_medium(r);
    if (r->state != PC_REC_COMMITTED || km < 0) continue;
    const char *salt = pc_events_path(pe, r);
    int nb = salt ? block_hash_chain(pe->tokens, r->node->depth, salt, pe->hashes) : -1;
    if (nb < 0) rc = errf(err, errlen, "kv events check: out of memory");
    for (int k = 0; !rc && k < nb; k++)
      if (pc_events_table_add(&want, pe->hashes[k], km, 1) < 0)
        rc = errf(err, errlen, "kv events check: out of memory");
  }
  size_t mem = 0; /* GPU and CPU pairs: DISK ones follow the disk tier's own entries */
  for (size_t k = 0; k < pe->t.cap; k++)
    mem += pe->t.s[k].count > 0 && pe->t.s[k].medium != KV_EVENTS_MEDIUM_DISK;
  if (!rc && want.n != mem)
    rc = errf(err, errlen, "kv events: %zu (block, medium) pairs announced, %zu held", mem, want.n);
  for (size_t k = 0; !rc && k < want.cap; k++) {
    const pc_events_slot *s = &want.s[k];
    if (s->count > 0 && pc_events_table_get(&pe->t, s->h, s->medium) != s->count)
      rc = errf(err, errlen, "kv events: block %016llx in %s: %d holders announced, %d hold it",
                (unsigned long long)s->h, kv_events_medium_name((kv_events_medium)s->medium),
                pc_events_table_get(&pe->t, s->h, s->medium), s->count);
  }
  free(want.s);
  return rc;
}
