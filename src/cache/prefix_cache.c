/* prefix_cache — the radix tree, the checkpoint records, eviction, statistics and the
 * integrity check. See prefix_cache.h for the picture; transactions are in checkpoint.c. */
#include "cache/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "cache/pc_events.h"
#include "cache/prefix_cache_int.h"

const char *prefix_cache_strerror(int rc) {
  switch (rc) {
    case PREFIX_CACHE_OK:
      return "ok";
    case PREFIX_CACHE_ENOMEM:
      return "out of memory";
    case PREFIX_CACHE_ENOSPACE:
      return "no cache space left";
    case PREFIX_CACHE_EXISTS:
      return "checkpoint exists";
    case PREFIX_CACHE_INFLIGHT:
      return "capture in flight";
    case PREFIX_CACHE_EINVAL:
      return "invalid argument";
    case PREFIX_CACHE_ESTALE:
      return "stale or unknown id";
    case PREFIX_CACHE_EPAYLOAD:
      return "invalid checkpoint payload";
    case PREFIX_CACHE_ECOPY:
      return "checkpoint copy failed";
    default:
      return "unknown prefix-cache error";
  }
}

/* ---------------------------------------------------------------- nodes and the tree */

static pc_node *pc_node_new(const int32_t *label, int n_label, int depth) {
  if (fault_hit("prefix_cache_node")) return NULL;
  pc_node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  if (n_label > 0) {
    n->label = fault_hit("prefix_cache_label") ? NULL : malloc((size_t)n_label * sizeof(int32_t));
    if (!n->label) {
      free(n);
      return NULL;
    }
    memcpy(n->label, label, (size_t)n_label * sizeof(int32_t));
  }
  n->n_label = n_label;
  n->depth = depth;
  n->ckpt = n->pending = -1;
  return n;
}

static void pc_node_free_one(pc_node *n) {
  free(n->label);
  free(n->kids);
  free(n->salt);
  free(n);
}

static void pc_node_free_tree(pc_node *n) {
  for (int i = 0; i < n->n_kids; i++) pc_node_free_tree(n->kids[i]);
  pc_node_free_one(n);
}

/* Index of the child whose label starts with tok, or -(insertion point) - 1. */
static int pc_kid_search(const pc_node *n, int32_t tok) {
  int lo = 0, hi = n->n_kids;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    int32_t t = n->kids[mid]->label[0];
    if (t == tok) return mid;
    if (t < tok)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -lo - 1;
}

static int pc_kid_add(pc_node *n, pc_node *kid) {
  int at = pc_kid_search(n, kid->label[0]);
  CHECK(at < 0);
  at = -at - 1;
  if (n->n_kids == n->cap_kids) {
    if (fault_hit("prefix_cache_kids")) return -1;
    int cap = n->cap_kids ? n->cap_kids * 2 : 2;
    pc_node **k = realloc(n->kids, (size_t)cap * sizeof *k);
    if (!k) return -1;
    n->kids = k;
    n->cap_kids = cap;
  }
  memmove(n->kids + at + 1, n->kids + at, (size_t)(n->n_kids - at) * sizeof *n->kids);
  n->kids[at] = kid;
  n->n_kids++;
  kid->parent = n;
  return 0;
}

static void pc_kid_remove(pc_node *n, pc_node *kid) {
  int at = pc_kid_search(n, kid->label[0]);
  CHECK(at >= 0 && n->kids[at] == kid);
  memmove(n->kids + at, n->kids + at + 1, (size_t)(n->n_kids - at - 1) * sizeof *n->kids);
  n->n_kids--;
}

static int pc_salt_eq(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static pc_node *pc_root_find(const prefix_cache *pc, const char *salt) {
  for (int i = 0; i < pc->n_roots; i++)
    if (pc_salt_eq(pc->roots[i]->salt, salt)) return pc->roots[i];
  return NULL;
}

static pc_node *pc_root_get(prefix_cache *pc, const char *salt) {
  pc_node *r = pc_root_find(pc, salt);
  if (r) return r;
  if (pc->n_roots == pc->cap_roots) {
    if (fault_hit("prefix_cache_salt")) return NULL;
    int cap = pc->cap_roots * 2;
    pc_node **k = realloc(pc->roots, (size_t)cap * sizeof *k);
    if (!k) return NULL;
    pc->roots = k;
    pc->cap_roots = cap;
  }
  r = pc_node_new(NULL, 0, 0);
  if (!r) return NULL;
  size_t len = strlen(salt);
  r->salt = fault_hit("prefix_cache_salt") ? NULL : malloc(len + 1);
  if (!r->salt) {
    pc_node_free_one(r);
    return NULL;
  }
  memcpy(r->salt, salt, len + 1);
  pc->roots[pc->n_roots++] = r;
  return r;
}

static int pc_common(const int32_t *a, int na, const int32_t *b, int nb) {
  int n = na < nb ? na : nb, i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

pc_node *pc_tree_find(prefix_cache *pc, const char *salt, const int32_t *tokens, int depth) {
  pc_node *n = pc_root_find(pc, salt);
  int pos = 0;
  while (n && pos < depth) {
    int at = pc_kid_search(n, tokens[pos]);
    if (at < 0) return NULL;
    pc_node *k = n->kids[at];
    if (k->n_label > depth - pos) return NULL;
    if (pc_common(k->label, k->n_label, tokens + pos, k->n_label) != k->n_label) return NULL;
    pos += k->n_label;
    n = k;
  }
  return n;
}

/* Splits kid's edge after m tokens: parent -> mid (label[0, m)) -> kid (label[m, n)). */
static pc_node *pc_split(pc_node *kid, int m) {
  pc_node *par = kid->parent;
  pc_node *mid = pc_node_new(kid->label, m, par->depth + m);
  if (!mid) return NULL;
  if (fault_hit("prefix_cache_kids") || !(mid->kids = malloc(2 * sizeof *mid->kids))) {
    pc_node_free_one(mid);
    return NULL;
  }
  mid->cap_kids = 2;
  int at = pc_kid_search(par, kid->label[0]);
  CHECK(at >= 0);
  par->kids[at] = mid; /* same first token: the order holds */
  mid->parent = par;
  memmove(kid->label, kid->label + m, (size_t)(kid->n_label - m) * sizeof(int32_t));
  kid->n_label -= m;
  mid->kids[0] = kid;
  mid->n_kids = 1;
  kid->parent = mid;
  return mid;
}

pc_node *pc_tree_insert(prefix_cache *pc, const char *salt, const int32_t *tokens, int depth) {
  pc_node *n = pc_root_get(pc, salt ? salt : "");
  if (!n) return NULL;
  int pos = 0;
  while (pos < depth) {
    int at = pc_kid_search(n, tokens[pos]);
    if (at < 0) {
      pc_node *leaf = pc_node_new(tokens + pos, depth - pos, depth);
      if (!leaf) break;
      if (pc_kid_add(n, leaf) != 0) {
        pc_node_free_one(leaf);
        break;
      }
      return leaf;
    }
    pc_node *k = n->kids[at];
    int lim = depth - pos;
    int m = pc_common(k->label, k->n_label, tokens + pos, lim < k->n_label ? lim : k->n_label);
    if (m == k->n_label) {
      n = k;
      pos += m;
      continue;
    }
    pc_node *mid = pc_split(k, m);
    if (!mid) break;
    n = mid;
    pos += m;
  }
  if (pos == depth) return n;
  pc_node_prune(pc, n); /* an empty salt root or a split left behind */
  return NULL;
}

void pc_node_prune(prefix_cache *pc, pc_node *n) {
  while (n && n->ckpt < 0 && n->pending < 0) {
    pc_node *par = n->parent;
    if (!par) { /* a root: salted roots go when empty */
      if (n->n_kids == 0 && n != pc->roots[0]) {
        int i = 0;
        while (pc->roots[i] != n) i++;
        pc->roots[i] = pc->roots[--pc->n_roots];
        pc_node_free_one(n);
      }
      return;
    }
    if (n->n_kids == 0) {
      pc_kid_remove(par, n);
      pc_node_free_one(n);
      n = par;
      continue;
    }
    if (n->n_kids == 1) { /* merge into the only child when memory allows */
      pc_node *k = n->kids[0];
      int32_t *lab = fault_hit("prefix_cache_label")
                         ? NULL
                         : malloc((size_t)(n->n_label + k->n_label) * sizeof(int32_t));
      if (!lab) return;
      memcpy(lab, n->label, (size_t)n->n_label * sizeof(int32_t));
      memcpy(lab + n->n_label, k->label, (size_t)k->n_label * sizeof(int32_t));
      free(k->label);
      k->label = lab;
      k->n_label += n->n_label;
      int at = pc_kid_search(par, n->label[0]);
      CHECK(at >= 0 && par->kids[at] == n);
      par->kids[at] = k;
      k->parent = par;
      n->n_kids = 0;
      pc_node_free_one(n);
    }
    return;
  }
}

/* ---------------------------------------------------------------- records */

uint64_t pc_rec_id(const prefix_cache *pc, int i) {
  return ((uint64_t)pc->recs[i].gen << 32) | (uint64_t)(uint32_t)(i + 1);
}

int pc_rec_find(const prefix_cache *pc, uint64_t id, unsigned mask) {
  uint32_t lo = (uint32_t)id;
  if (lo == 0 || lo > (uint32_t)pc->n_recs) return -1;
  int i = (int)lo - 1;
  const pc_rec *r = &pc->recs[i];
  if (r->gen != (uint32_t)(id >> 32) || !(mask & (1u << r->state))) return -1;
  return i;
}

int pc_rec_new(prefix_cache *pc) {
  int i;
  if (pc->free_head >= 0) {
    i = pc->free_head;
    pc->free_head = pc->recs[i].next_free;
  } else {
    if (pc->n_recs == pc->cap_recs) {
      if (fault_hit("prefix_cache_rec")) return -1;
      int cap = pc->cap_recs ? pc->cap_recs * 2 : 16;
      pc_rec *r = realloc(pc->recs, (size_t)cap * sizeof *r);
      if (!r) return -1;
      pc->recs = r;
      pc->cap_recs = cap;
    }
    i = pc->n_recs++;
    memset(&pc->recs[i], 0, sizeof pc->recs[i]);
    pc->recs[i].gen = 1;
  }
  pc_rec *r = &pc->recs[i];
  uint32_t gen = r->gen;
  memset(r, 0, sizeof *r);
  r->gen = gen;
  r->state = PC_REC_FREE;
  r->slab = r->host_slab = r->host_kv = r->disk = -1;
  r->next_free = -1;
  return i;
}

void pc_put_slab(prefix_cache *pc, int slab) {
  state_pool_slab_free(pc->sp, slab);
  pc->n_dev_slabs--;
}

static void pc_rec_unref_pages(prefix_cache *pc, pc_rec *r) {
  if (!r->kv_dev) return;
  for (int k = r->n_pages - 1; k >= 0; k--) kv_pages_cache_unref(pc->kp, r->pages[k]);
  r->kv_dev = 0;
}

void pc_rec_release(prefix_cache *pc, int i) {
  pc_rec *r = &pc->recs[i];
  CHECK(r->state != PC_REC_FREE && r->pins == 0);
  if (r->state == PC_REC_COMMITTED) pc_events_leave(pc, i);
  if (r->slab >= 0) pc_put_slab(pc, r->slab);
  if (r->host_slab >= 0) host_tier_drop(pc->ht, r->host_slab);
  if (r->host_kv >= 0) host_tier_drop(pc->ht, r->host_kv);
  if (r->disk >= 0) disk_tier_drop(pc->dt, r->disk);
  pc_rec_unref_pages(pc, r);
  free(r->pages);
  pc_node *n = r->node;
  if (n) {
    if (n->ckpt == i) n->ckpt = -1;
    if (n->pending == i) n->pending = -1;
  }
  uint32_t gen = r->gen + 1;
  memset(r, 0, sizeof *r);
  r->gen = gen ? gen : 1;
  r->state = PC_REC_FREE;
  r->slab = r->host_slab = r->host_kv = r->disk = -1;
  r->next_free = pc->free_head;
  pc->free_head = i;
  if (n) pc_node_prune(pc, n);
}

void pc_rec_drop(prefix_cache *pc, int i) {
  pc_rec *r = &pc->recs[i];
  CHECK(r->state == PC_REC_COMMITTED || r->state == PC_REC_ZOMBIE);
  if (r->pins == 0) {
    pc_rec_release(pc, i);
    return;
  }
  if (r->state == PC_REC_ZOMBIE) return;
  pc_events_leave(pc, i);
  pc_node *n = r->node;
  n->ckpt = -1;
  r->node = NULL;
  r->state = PC_REC_ZOMBIE;
  pc_node_prune(pc, n);
}

/* ---------------------------------------------------------------- the disk tier */

int pc_rec_disk_only(const pc_rec *r) {
  return r->disk >= 0 && r->slab < 0 && r->host_slab < 0 && !r->kv_dev && r->host_kv < 0;
}

/* The salt of a bound record's path; its tokens [0, depth) into tokens. */
static const char *pc_rec_key(const pc_rec *r, int32_t *tokens) {
  const pc_node *n = r->node;
  for (; n->parent; n = n->parent)
    memcpy(tokens + n->depth - n->n_label, n->label, (size_t)n->n_label * sizeof *tokens);
  return n->salt;
}

/* Drops least recently used disk checkpoints (never pinned ones, never `keep`) until bytes fit
 * the disk budget. Returns 0 or -1. */
static int pc_disk_make_room(prefix_cache *pc, size_t bytes, int keep) {
  if (bytes > disk_tier_budget(pc->dt)) return -1;
  while (disk_tier_budget(pc->dt) - disk_tier_bytes(pc->dt) < bytes) {
    int v = -1;
    for (int i = 0; i < pc->n_recs; i++) {
      const pc_rec *r = &pc->recs[i];
      if (i != keep && r->disk >= 0 && r->state == PC_REC_COMMITTED && r->pins == 0 &&
          (v < 0 || disk_tier_tick(pc->dt, r->disk) < disk_tier_tick(pc->dt, pc->recs[v].disk)))
        v = i;
    }
    if (v < 0) return -1;
    pc->st.evictions++;
    pc->st.disk_evictions++;
    if (pc_rec_disk_only(&pc->recs[v])) {
      pc_rec_release(pc, v);
    } else {
      disk_tier_drop(pc->dt, pc->recs[v].disk);
      pc->recs[v].disk = -1;
    }
  }
  return 0;
}

/* Writes committed record i whole to the disk tier (the slab and pages from the device through
 * the ops, or from the host tier) and returns its memory parts: it becomes a disk checkpoint.
 * Returns 0, or -1 with nothing changed (no disk tier, no room, a read failed). */
static int pc_spill(prefix_cache *pc, int i) {
  pc_rec *r = &pc->recs[i];
  if (!pc->dt || r->state != PC_REC_COMMITTED || r->pins > 0) return -1;
  if (r->disk < 0) {
    if (!r->kv_dev && r->host_kv < 0) return -1;
    int32_t *tok = malloc((size_t)r->depth * sizeof *tok);
    if (!tok) return -1;
    const char *salt = pc_rec_key(r, tok);
    void *slab, *pages;
    int e, rc = -1;
    if (pc_disk_make_room(pc, disk_tier_file_size(pc->dt, strlen(salt), r->depth, 1, r->n_pages),
                          i) == 0 &&
        disk_tier_put_begin(pc->dt, salt, tok, r->depth, 1, r->n_pages, &e, &slab, &pages) == 0) {
      const prefix_cache_ops *op = &pc->o.ops;
      rc = 0;
      if (r->slab >= 0)
        rc = op->slot_read ? op->slot_read(op->ctx, r->slab, slab) : 0;
      else
        memcpy(slab, host_tier_entry_data(pc->ht, r->host_slab), pc->o.slab_bytes);
      unsigned char *pg = pages;
      if (r->kv_dev) {
        for (int k = 0; k < r->n_pages && rc == 0; k++)
          if (op->page_read && op->page_read(op->ctx, r->pages[k], pg + k * pc->o.page_bytes))
            rc = -1;
      } else {
        memcpy(pg, host_tier_entry_data(pc->ht, r->host_kv), r->n_pages * pc->o.page_bytes);
      }
      if (rc == 0) {
        disk_tier_put_commit(pc->dt, e);
        r->disk = e;
      } else {
        disk_tier_put_abort(pc->dt, e);
      }
    }
    free(tok);
    if (rc != 0) return -1;
  }
  int km = pc_events_kv_medium(r), sm = pc_events_state_medium(r);
  if (r->slab >= 0) pc_put_slab(pc, r->slab);
  if (r->host_slab >= 0) host_tier_drop(pc->ht, r->host_slab);
  if (r->host_kv >= 0) host_tier_drop(pc->ht, r->host_kv);
  r->slab = r->host_slab = r->host_kv = -1;
  pc_rec_unref_pages(pc, r);
  if (km >= 0) pc_events_kv(pc, i, (kv_events_medium)km, -1); /* DISK: the tier's listener */
  if (sm >= 0) pc_events_state(pc, i, (kv_events_medium)sm, -1);
  pc->st.spills++;
  return 0;
}

/* Record i leaves memory: to the disk tier when there is one and it fits, else dropped. */
static void pc_spill_or_release(prefix_cache *pc, int i) {
  if (pc_spill(pc, i) == 0) return;
  pc_rec_release(pc, i);
  pc->st.evictions++;
}

/* The disk tier's entries as disk checkpoints, in its LRU order (prefix_cache_init). An entry
 * whose shape is not a checkpoint of this cache, or whose node is taken, is dropped. Returns 0
 * or -1 (out of memory). */
static int pc_disk_index(prefix_cache *pc) {
  int n = disk_tier_handles(pc->dt);
  uint64_t last = 0;
  for (;;) { /* the live entries by ascending tick */
    int e = -1;
    for (int k = 0; k < n; k++)
      if (disk_tier_live(pc->dt, k) && disk_tier_tick(pc->dt, k) > last &&
          (e < 0 || disk_tier_tick(pc->dt, k) < disk_tier_tick(pc->dt, e)))
        e = k;
    if (e < 0) return 0;
    last = disk_tier_tick(pc->dt, e);
    int depth = disk_tier_entry_depth(pc->dt, e);
    const int32_t *tok = disk_tier_entry_tokens(pc->dt, e);
    const char *salt = disk_tier_entry_salt(pc->dt, e);
    pc_node *nd = pc_tree_find(pc, salt, tok, depth);
    if (!disk_tier_entry_has_slot(pc->dt, e) ||
        disk_tier_entry_pages(pc->dt, e) != kv_pages_for_tokens(depth) || (nd && nd->ckpt >= 0)) {
      disk_tier_drop(pc->dt, e);
      continue;
    }
    int i = pc_rec_new(pc);
    if (i < 0) return -1;
    pc_rec *r = &pc->recs[i];
    r->n_pages = kv_pages_for_tokens(depth);
    r->pages = malloc((size_t)r->n_pages * sizeof *r->pages);
    nd = r->pages ? pc_tree_insert(pc, salt, tok, depth) : NULL;
    if (!nd) {
      free(r->pages);
      r->pages = NULL;
      r->next_free = pc->free_head;
      pc->free_head = i;
      return -1;
    }
    r = &pc->recs[i];
    r->state = PC_REC_COMMITTED;
    r->cls = PC_CLASS_NORMAL;
    r->node = nd;
    r->depth = depth;
    r->disk = e;
    r->tick = ++pc->tick;
    nd->ckpt = i;
  }
}

void pc_disk_promote(prefix_cache *pc, int i, const int32_t *pages, int slot) {
  pc_rec *r = &pc->recs[i];
  if (!pc_rec_disk_only(r) || pc->n_dev_slabs >= pc->max_slabs ||
      state_pool_num_slabs_free(pc->sp) == 0)
    return;
  int slab;
  if (state_pool_slab_alloc(pc->sp, &slab) != 0) return;
  pc->n_dev_slabs++;
  if (state_pool_save(pc->sp, slot, slab) != 0) {
    pc_put_slab(pc, slab);
    return;
  }
  r->slab = slab;
  memcpy(r->pages, pages, (size_t)r->n_pages * sizeof *r->pages);
  for (int k = 0; k < r->n_pages; k++) kv_pages_cache_ref(pc->kp, r->pages[k]);
  r->kv_dev = 1;
  pc_events_kv(pc, i, KV_EVENTS_MEDIUM_GPU, +1);
  pc_events_state(pc, i, KV_EVENTS_MEDIUM_GPU, +1);
}

int prefix_cache_disk_ready(prefix_cache *pc, uint64_t ckpt) {
  int i = pc_rec_find(pc, ckpt, 1u << PC_REC_COMMITTED);
  if (i < 0 || !pc->dt || !pc_rec_disk_only(&pc->recs[i])) return 1;
  return disk_tier_prefetch(pc->dt, pc->recs[i].disk);
}

void prefix_cache_disk_cost(prefix_cache *pc, uint64_t ckpt, double *bytes, double *rate) {
  *bytes = *rate = 0;
  int i = pc_rec_find(pc, ckpt, 1u << PC_REC_COMMITTED);
  if (i < 0 || !pc->dt || !pc_rec_disk_only(&pc->recs[i])) return;
  const pc_rec *r = &pc->recs[i];
  *bytes = (double)disk_tier_file_size(pc->dt, 0, r->depth, 1, r->n_pages);
  disk_tier_stats st;
  disk_tier_get_stats(pc->dt, &st);
  *rate = st.read_s > 0 ? st.read_bytes / st.read_s : 0;
}

/* prefix_cache_free: the committed checkpoints still in memory go to the disk tier, least
 * recently used first (so the most recent ones survive its budget); then the records forget
 * their disk entries, so that releasing them keeps the files. */
static void pc_disk_persist(prefix_cache *pc) {
  uint64_t last = 0;
  int written = 0;
  for (;;) {
    int v = -1;
    for (int i = 0; i < pc->n_recs; i++) {
      const pc_rec *r = &pc->recs[i];
      if (r->state == PC_REC_COMMITTED && r->disk < 0 && r->tick > last &&
          (v < 0 || r->tick < pc->recs[v].tick))
        v = i;
    }
    if (v < 0) break;
    last = pc->recs[v].tick;
    const pc_rec *r = &pc->recs[v]; /* the queue's memory bound: wait here rather than drop */
    disk_tier_wait_room(pc->dt, disk_tier_file_size(pc->dt, 0, r->depth, 1, r->n_pages));
    written += pc_spill(pc, v) == 0;
  }
  for (int i = 0; i < pc->n_recs; i++) pc->recs[i].disk = -1;
  if (written) log_info("prefix cache: %d checkpoints written to the disk cache", written);
}

/* ---------------------------------------------------------------- init / free */

int prefix_cache_init(prefix_cache **out, kv_pages *kp, state_pool *sp,
                      const prefix_cache_opts *o) {
  *out = NULL;
  prefix_cache *pc = calloc(1, sizeof *pc);
  if (!pc) return -1;
  pc->kp = kp;
  pc->sp = sp;
  pc->o = *o;
  pc->free_head = -1;
  int slabs = state_pool_num_slabs(sp);
  if (o->device_budget_bytes > 0 && o->slab_bytes > 0) {
    size_t fit = o->device_budget_bytes / o->slab_bytes;
    if (fit < (size_t)slabs) slabs = (int)fit;
  }
  pc->max_slabs = slabs;
  pc->cap_roots = 4;
  pc->roots = calloc((size_t)pc->cap_roots, sizeof *pc->roots);
  pc_node *root = pc_node_new(NULL, 0, 0);
  if (!pc->roots || !root || !(root->salt = calloc(1, 1))) {
    if (root) pc_node_free_one(root);
    free(pc->roots);
    free(pc);
    return -1;
  }
  pc->roots[pc->n_roots++] = root;
  if (o->host_budget_bytes > 0) {
    host_tier_ops hops = {o->ops.ctx, o->ops.page_read, o->ops.page_write, o->ops.slot_read,
                          o->ops.slot_write};
    if (host_tier_init(&pc->ht, o->host_budget_bytes, o->slab_bytes, o->page_bytes, &hops)) {
      pc_node_free_one(root);
      free(pc->roots);
      free(pc);
      return -1;
    }
  }
  pc->dt = o->disk;
  if (pc->dt && pc_disk_index(pc) != 0) {
    for (int i = 0; i < pc->n_recs; i++) pc->recs[i].disk = -1; /* the files stay */
    pc->dt = NULL;
    prefix_cache_free(pc);
    return -1;
  }
  if (o->events && pc_events_init(&pc->events, o->events) != 0) {
    prefix_cache_free(pc);
    return -1;
  }
  if (pc->dt && pc->events) /* DISK-medium events; replays the files found at open */
    disk_tier_set_listener(pc->dt, pc_events_disk, pc);
  *out = pc;
  return 0;
}

void prefix_cache_free(prefix_cache *pc) {
  if (!pc) return;
  pc_events_free(pc->events); /* a stopping server reports no removals */
  pc->events = NULL;
  if (pc->dt) {
    disk_tier_set_listener(pc->dt, NULL, NULL); /* it outlives the cache */
    pc_disk_persist(pc);
  }
  for (int i = 0; i < pc->n_recs; i++) {
    pc_rec *r = &pc->recs[i];
    CHECK(r->pins == 0); /* a restore still in flight */
    if (r->state != PC_REC_FREE) pc_rec_release(pc, i);
  }
  for (int i = 0; i < pc->n_roots; i++) pc_node_free_tree(pc->roots[i]);
  free(pc->roots);
  free(pc->recs);
  host_tier_free(pc->ht);
  free(pc);
}

void prefix_cache_clear(prefix_cache *pc) {
  pc_events_clear_begin(pc);
  for (int i = 0; i < pc->n_recs; i++) {
    pc_rec *r = &pc->recs[i];
    if (r->state == PC_REC_COMMITTED && r->pins == 0) {
      pc_rec_release(pc, i);
      pc->st.evictions++;
    }
  }
  pc_events_clear_end(pc);
}

/* ---------------------------------------------------------------- lookup */

void prefix_cache_lookup(prefix_cache *pc, const char *salt, const int32_t *prompt, int n_prompt,
                         prefix_cache_match *m) {
  pc->st.queries++;
  pc->st.query_tokens += n_prompt;
  prefix_cache_peek(pc, salt, prompt, n_prompt, m);
}

void prefix_cache_peek(prefix_cache *pc, const char *salt, const int32_t *prompt, int n_prompt,
                       prefix_cache_match *m) {
  memset(m, 0, sizeof *m);
  pc_node *n = pc_root_find(pc, salt);
  if (!n || n_prompt <= 0) return;
  int limit = n_prompt - 1, pos = 0;
  pc_node *best = NULL, *pend = NULL;
  for (;;) {
    if (n->depth <= limit) {
      if (n->ckpt >= 0) best = n;
      if (n->pending >= 0) pend = n;
    }
    if (pos == n_prompt) break;
    int at = pc_kid_search(n, prompt[pos]);
    if (at < 0) break;
    pc_node *k = n->kids[at];
    int mm = pc_common(k->label, k->n_label, prompt + pos, n_prompt - pos);
    pos += mm;
    if (mm < k->n_label) break;
    n = k;
  }
  m->match_len = pos;
  if (best) {
    const pc_rec *r = &pc->recs[best->ckpt];
    m->ckpt = pc_rec_id(pc, best->ckpt);
    m->depth = best->depth;
    m->on_host = r->slab < 0 || !r->kv_dev;
  }
  if (pend && pend->depth > m->depth) {
    m->inflight = pc_rec_id(pc, pend->pending);
    m->inflight_depth = pend->depth;
  }
}

/* ---------------------------------------------------------------- capture points */

static int pc_interval(int interval) {
  if (interval <= 0) interval = PREFIX_CACHE_DEFAULT_INTERVAL;
  return (interval + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS * KV_PAGES_TOKENS;
}

int prefix_cache_capture_points_max(int n_prompt, int n_boundaries, int interval) {
  (void)n_boundaries;
  return 4 + (n_prompt > 0 ? n_prompt / pc_interval(interval) : 0);
}

static int pc_point_add(prefix_cache_point *out, int n, int cap, int depth, int flags, int restored,
                        int n_prompt) {
  if (depth <= restored || depth > n_prompt - 1 || depth < 1) return n;
  int i = 0;
  while (i < n && out[i].depth < depth) i++;
  if (i < n && out[i].depth == depth) {
    out[i].flags |= flags;
    return n;
  }
  if (n == cap) {
    if (i == n) return n; /* the deepest points are dropped first */
    n--;
  }
  memmove(out + i + 1, out + i, (size_t)(n - i) * sizeof *out);
  out[i].depth = depth;
  out[i].flags = flags;
  return n + 1;
}

int prefix_cache_capture_points(int n_prompt, const int32_t *boundaries, int n_boundaries,
                                int interval, int divergence, int restored, prefix_cache_point *out,
                                int cap) {
  int n = 0;
  if (cap <= 0 || n_prompt < 2) return 0;
  if (n_boundaries >= 2) {
    n = pc_point_add(out, n, cap, boundaries[1],
                     PREFIX_CACHE_POINT_HEAD | PREFIX_CACHE_POINT_PROTECT, restored, n_prompt);
    n = pc_point_add(out, n, cap, boundaries[n_boundaries - 1], PREFIX_CACHE_POINT_LAST_TURN,
                     restored, n_prompt);
  }
  if (divergence > 0 && divergence < n_prompt)
    n = pc_point_add(out, n, cap, divergence, PREFIX_CACHE_POINT_DIVERGE, restored, n_prompt);
  n = pc_point_add(out, n, cap, n_prompt - 1, PREFIX_CACHE_POINT_END, restored, n_prompt);
  int iv = pc_interval(interval);
  for (int d = iv; d < n_prompt; d += iv)
    n = pc_point_add(out, n, cap, d, PREFIX_CACHE_POINT_INTERVAL, restored, n_prompt);
  return n;
}

/* ---------------------------------------------------------------- eviction */

/* 1 when a is a better victim than b: the lower class first, then (when by_leaf) leaves
 * first, then least recently used. */
static int pc_victim_before(const prefix_cache *pc, int a, int b, int by_leaf) {
  if (b < 0) return 1;
  const pc_rec *ra = &pc->recs[a], *rb = &pc->recs[b];
  if (ra->cls != rb->cls) return ra->cls < rb->cls;
  if (by_leaf) {
    int la = ra->node->n_kids == 0, lb = rb->node->n_kids == 0;
    if (la != lb) return la > lb;
  }
  return ra->tick < rb->tick;
}

static int pc_evictable(const pc_rec *r) { return r->state == PC_REC_COMMITTED && r->pins == 0; }

/* Drops least recently used host checkpoints (never `keep`) until bytes fit the host budget.
 * Returns 0 or -1. */
static int pc_host_make_room(prefix_cache *pc, size_t bytes, int keep) {
  if (!pc->ht || bytes > host_tier_budget(pc->ht)) return -1;
  while (host_tier_budget(pc->ht) - host_tier_bytes(pc->ht) < bytes) {
    int v = -1;
    for (int i = 0; i < pc->n_recs; i++) {
      const pc_rec *r = &pc->recs[i];
      if (i != keep && pc_evictable(r) && (r->host_slab >= 0 || r->host_kv >= 0) &&
          pc_victim_before(pc, i, v, 0))
        v = i;
    }
    if (v < 0) return -1;
    pc_spill_or_release(pc, v);
  }
  return 0;
}

/* The slab of record i leaves the device: to the host tier, or the record is dropped. */
static void pc_demote_slab(prefix_cache *pc, int i) {
  pc_rec *r = &pc->recs[i];
  int e;
  if (pc->ht && pc_host_make_room(pc, host_tier_entry_size(pc->ht, 1, 0), i) == 0 &&
      host_tier_put(pc->ht, r->slab, NULL, 0, &e) == 0) {
    pc_put_slab(pc, r->slab);
    r->slab = -1;
    r->host_slab = e;
    pc_events_state(pc, i, KV_EVENTS_MEDIUM_CPU, +1);
    pc_events_state(pc, i, KV_EVENTS_MEDIUM_GPU, -1);
    pc->st.demotions++;
    return;
  }
  pc_spill_or_release(pc, i);
}

/* The pages of record i leave the device: to the host tier, or the record is dropped. */
static void pc_demote_kv(prefix_cache *pc, int i) {
  pc_rec *r = &pc->recs[i];
  int e;
  if (pc->ht && pc_host_make_room(pc, host_tier_entry_size(pc->ht, 0, r->n_pages), i) == 0 &&
      host_tier_put(pc->ht, -1, r->pages, r->n_pages, &e) == 0) {
    pc_rec_unref_pages(pc, r);
    r->host_kv = e;
    pc_events_kv(pc, i, KV_EVENTS_MEDIUM_CPU, +1);
    pc_events_kv(pc, i, KV_EVENTS_MEDIUM_GPU, -1);
    pc->st.demotions++;
    return;
  }
  pc_spill_or_release(pc, i);
}

/* Frees up to n device slabs of records of class <= max_cls (see prefix_cache_evict_slabs). */
static int pc_evict_slabs_upto(prefix_cache *pc, int n, int max_cls) {
  int freed = 0;
  while (freed < n) {
    int v = -1;
    for (int i = 0; i < pc->n_recs; i++)
      if (pc_evictable(&pc->recs[i]) && pc->recs[i].slab >= 0 && pc->recs[i].cls <= max_cls &&
          pc_victim_before(pc, i, v, 0))
        v = i;
    if (v < 0) break;
    pc_demote_slab(pc, v);
    freed++;
  }
  return freed;
}

/* Pages that would return to the free queue if record r let go of them. */
static int pc_page_gain(const prefix_cache *pc, const pc_rec *r) {
  int g = 0;
  for (int k = 0; k < r->n_pages; k++)
    if (kv_pages_cache_refcount(pc->kp, r->pages[k]) == 1 &&
        kv_pages_refcount(pc->kp, r->pages[k]) == 0)
      g++;
  return g;
}

/* Pages of record r that no sequence uses (they would be freed once no record held them). */
static int pc_page_potential(const prefix_cache *pc, const pc_rec *r) {
  int g = 0;
  for (int k = 0; k < r->n_pages; k++) g += kv_pages_refcount(pc->kp, r->pages[k]) == 0;
  return g;
}

int prefix_cache_evict_for_pages(prefix_cache *pc, int n) {
  int before = kv_pages_num_free(pc->kp);
  while (kv_pages_num_free(pc->kp) - before < n) {
    /* a record whose release frees pages now; else (its pages are shared with other
     * checkpoints on the same path) one whose release brings others closer to it */
    int v = -1, w = -1;
    for (int i = 0; i < pc->n_recs; i++) {
      const pc_rec *r = &pc->recs[i];
      if (!pc_evictable(r) || !r->kv_dev) continue;
      if (pc_page_gain(pc, r) > 0) {
        if (pc_victim_before(pc, i, v, 1)) v = i;
      } else if (pc_page_potential(pc, r) > 0 && pc_victim_before(pc, i, w, 1)) {
        w = i;
      }
    }
    if (v < 0) v = w;
    if (v < 0) break;
    pc_demote_kv(pc, v);
  }
  return kv_pages_num_free(pc->kp) - before;
}

int prefix_cache_evict_slabs(prefix_cache *pc, int n) {
  return pc_evict_slabs_upto(pc, n, PC_CLASS_PROTECT);
}

int pc_take_slab(prefix_cache *pc, int cls, int *slab) {
  int max_cls = cls == PC_CLASS_LOW ? PC_CLASS_LOW : PC_CLASS_PROTECT;
  while (pc->n_dev_slabs >= pc->max_slabs || state_pool_num_slabs_free(pc->sp) == 0)
    if (pc->max_slabs == 0 || pc_evict_slabs_upto(pc, 1, max_cls) == 0)
      return PREFIX_CACHE_ENOSPACE;
  if (state_pool_slab_alloc(pc->sp, slab) != 0) return PREFIX_CACHE_ENOMEM;
  pc->n_dev_slabs++;
  return 0;
}

/* ---------------------------------------------------------------- stats */

void prefix_cache_get_stats(const prefix_cache *pc, prefix_cache_stats *s) {
  *s = pc->st;
  s->n_checkpoints = s->n_pending = s->n_host = s->n_disk = 0;
  for (int i = 0; i < pc->n_recs; i++) {
    const pc_rec *r = &pc->recs[i];
    if (r->state == PC_REC_COMMITTED) s->n_checkpoints++;
    if (r->state == PC_REC_RESERVED || r->state == PC_REC_CAPTURED) s->n_pending++;
    if (r->state != PC_REC_FREE && (r->host_slab >= 0 || r->host_kv >= 0)) s->n_host++;
    if (r->state == PC_REC_COMMITTED && pc_rec_disk_only(r)) s->n_disk++;
  }
  s->device_slabs = pc->n_dev_slabs;
  s->device_slabs_max = pc->max_slabs;
  s->device_pages = kv_pages_num_cache_held(pc->kp); /* counted as held: stats are per step */
  s->device_slab_bytes = (size_t)pc->n_dev_slabs * pc->o.slab_bytes;
  s->device_page_bytes = (size_t)s->device_pages * pc->o.page_bytes;
  s->host_bytes = pc->ht ? host_tier_bytes(pc->ht) : 0;
  s->host_budget_bytes = pc->ht ? host_tier_budget(pc->ht) : 0;
}

/* ---------------------------------------------------------------- check */

typedef struct pc_check_ctx {
  const prefix_cache *pc;
  char *err;
  size_t errlen;
  int n_bound; /* records reached from nodes */
} pc_check_ctx;

static int pc_check_rec_binding(pc_check_ctx *c, const pc_node *n, int i, int pending) {
  const prefix_cache *pc = c->pc;
  if (i < 0) return 0;
  if (i >= pc->n_recs) return errf(c->err, c->errlen, "prefix_cache: node names record %d", i);
  const pc_rec *r = &pc->recs[i];
  int ok_state = pending ? (r->state == PC_REC_RESERVED || r->state == PC_REC_CAPTURED)
                         : r->state == PC_REC_COMMITTED;
  if (!ok_state || r->node != n || r->depth != n->depth)
    return errf(c->err, c->errlen,
                "prefix_cache: record %d (state %d, depth %d) badly bound to a node of depth %d", i,
                r->state, r->depth, n->depth);
  c->n_bound++;
  return 0;
}

static int pc_check_node(pc_check_ctx *c, const pc_node *n) {
  if (n->parent) {
    if (n->n_label < 1 || n->depth != n->parent->depth + n->n_label)
      return errf(c->err, c->errlen, "prefix_cache: node at depth %d has label %d", n->depth,
                  n->n_label);
    if (n->ckpt < 0 && n->pending < 0 && n->n_kids == 0)
      return errf(c->err, c->errlen, "prefix_cache: dead leaf at depth %d", n->depth);
  }
  if (pc_check_rec_binding(c, n, n->ckpt, 0) || pc_check_rec_binding(c, n, n->pending, 1))
    return -1;
  for (int i = 0; i < n->n_kids; i++) {
    const pc_node *k = n->kids[i];
    if (k->parent != n)
      return errf(c->err, c->errlen, "prefix_cache: bad parent under depth %d", n->depth);
    if (i > 0 && n->kids[i - 1]->label[0] >= k->label[0])
      return errf(c->err, c->errlen, "prefix_cache: children unsorted at depth %d", n->depth);
    if (pc_check_node(c, k)) return -1;
  }
  return 0;
}

int prefix_cache_check(const prefix_cache *pc, char *err, size_t errlen) {
  pc_check_ctx c = {pc, err, errlen, 0};
  if (pc->n_roots < 1 || pc->roots[0]->salt[0] != 0)
    return errf(err, errlen, "prefix_cache: the shared root is missing");
  for (int i = 0; i < pc->n_roots; i++) {
    const pc_node *r = pc->roots[i];
    if (r->parent || r->depth != 0 || r->ckpt >= 0 || r->pending >= 0)
      return errf(err, errlen, "prefix_cache: root %d is malformed", i);
    if (i > 0 && r->n_kids == 0)
      return errf(err, errlen, "prefix_cache: empty salted root \"%s\"", r->salt);
    for (int j = 0; j < i; j++)
      if (strcmp(pc->roots[j]->salt, r->salt) == 0)
        return errf(err, errlen, "prefix_cache: salt \"%s\" twice", r->salt);
    if (pc_check_node(&c, r)) return -1;
  }
  int total = kv_pages_total(pc->kp);
  int *cnt = calloc((size_t)(total > 0 ? total : 1), sizeof *cnt);
  if (!cnt) return errf(err, errlen, "prefix_cache: out of memory in check");
  int live = 0, slabs = 0, host = 0, disk = 0, rc = 0;
  int n_seq = state_pool_num_slots(pc->sp), n_slabs = state_pool_num_slabs(pc->sp);
  for (int i = 0; i < pc->n_recs && rc == 0; i++) {
    const pc_rec *r = &pc->recs[i];
    if (r->state == PC_REC_FREE) continue;
    if (r->state != PC_REC_ZOMBIE)
      live++;
    else if (r->pins <= 0 || r->node)
      rc = errf(err, errlen, "prefix_cache: zombie record %d unpinned or bound", i);
    if (r->n_pages != kv_pages_for_tokens(r->depth) || r->depth < 1 || !r->pages)
      rc = errf(err, errlen, "prefix_cache: record %d depth %d holds %d pages", i, r->depth,
                r->n_pages);
    if (r->state == PC_REC_RESERVED && (r->kv_dev || r->host_kv >= 0 || r->host_slab >= 0))
      rc = errf(err, errlen, "prefix_cache: reserved record %d holds a payload", i);
    if (r->state != PC_REC_RESERVED && !r->kv_dev && r->host_kv < 0 && r->disk < 0)
      rc = errf(err, errlen, "prefix_cache: record %d has no KV anywhere", i);
    if ((r->slab >= 0) == (r->host_slab >= 0) && !pc_rec_disk_only(r))
      rc = errf(err, errlen, "prefix_cache: record %d state must be on exactly one tier", i);
    if (r->kv_dev && r->host_kv >= 0)
      rc = errf(err, errlen, "prefix_cache: record %d KV on both tiers", i);
    if (r->disk >= 0) {
      disk++;
      if (!pc->dt || disk_tier_entry_depth(pc->dt, r->disk) != r->depth ||
          disk_tier_entry_pages(pc->dt, r->disk) != r->n_pages)
        rc = errf(err, errlen, "prefix_cache: record %d disk entry is wrong", i);
    }
    if (r->slab >= 0) {
      slabs++;
      if (r->slab < n_seq || r->slab >= n_seq + n_slabs)
        rc = errf(err, errlen, "prefix_cache: record %d slab %d out of range", i, r->slab);
      for (int j = 0; j < i; j++)
        if (pc->recs[j].state != PC_REC_FREE && pc->recs[j].slab == r->slab)
          rc = errf(err, errlen, "prefix_cache: slab %d owned twice", r->slab);
    }
    if (r->host_slab >= 0) {
      host++;
      if (!pc->ht || !host_tier_entry_has_slot(pc->ht, r->host_slab))
        rc = errf(err, errlen, "prefix_cache: record %d host slab entry is not live", i);
    }
    if (r->host_kv >= 0) {
      host++;
      if (!pc->ht || host_tier_entry_pages(pc->ht, r->host_kv) != r->n_pages)
        rc = errf(err, errlen, "prefix_cache: record %d host page entry is wrong", i);
    }
    if (r->kv_dev)
      for (int k = 0; k < r->n_pages; k++) {
        if (r->pages[k] < 0 || r->pages[k] >= total) {
          rc = errf(err, errlen, "prefix_cache: record %d page %d out of range", i, r->pages[k]);
          break;
        }
        cnt[r->pages[k]]++;
      }
  }
  for (int p = 0; p < total && rc == 0; p++)
    if (cnt[p] != kv_pages_cache_refcount(pc->kp, p))
      rc = errf(err, errlen, "prefix_cache: page %d has cache_refcount %d, records hold %d", p,
                kv_pages_cache_refcount(pc->kp, p), cnt[p]);
  free(cnt);
  if (rc) return rc;
  if (live != c.n_bound)
    return errf(err, errlen, "prefix_cache: %d live records, %d bound to nodes", live, c.n_bound);
  if (slabs != pc->n_dev_slabs || slabs != n_slabs - state_pool_num_slabs_free(pc->sp))
    return errf(err, errlen, "prefix_cache: %d slabs held, recorded %d, pool uses %d", slabs,
                pc->n_dev_slabs, n_slabs - state_pool_num_slabs_free(pc->sp));
  if (slabs > pc->max_slabs)
    return errf(err, errlen, "prefix_cache: %d slabs over the budget of %d", slabs, pc->max_slabs);
  if (pc->ht) {
    if (host != host_tier_count(pc->ht))
      return errf(err, errlen, "prefix_cache: %d host entries held, tier has %d", host,
                  host_tier_count(pc->ht));
    if (host_tier_check(pc->ht, err, errlen)) return -1;
  } else if (host) {
    return errf(err, errlen, "prefix_cache: host entries without a host tier");
  }
  if (pc_events_check(pc, err, errlen)) return -1;
  if (pc->dt) {
    if (disk != disk_tier_count(pc->dt))
      return errf(err, errlen, "prefix_cache: %d disk entries held, tier has %d", disk,
                  disk_tier_count(pc->dt));
    if (disk_tier_check(pc->dt, err, errlen)) return -1;
  }
  return 0;
}
