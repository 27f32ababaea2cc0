/* prefix_cache_int — the private structures of the prefix cache, shared by prefix_cache.c
 * (tree, records, eviction, checks) and checkpoint.c (transactions, restores). Nothing outside
 * src/cache/ includes this file.
 *
 *   node  a point of the radix tree: the edge label from its parent (token run), its depth,
 *         children sorted by their label's first token, and at most two records:
 *         ckpt (the committed checkpoint) and pending (an in-flight capture into it).
 *   rec   a checkpoint record (id = gen << 32 | index + 1): its payload on the device
 *         (slab, page refs) and/or in the host tier (one entry for the slab image, one for the
 *         page images), pins (restores in flight) and LRU tick. A record detached from its
 *         node while pinned (replaced, or dropped after a failed restore) is a ZOMBIE: it keeps
 *         its payload until the last unpin. */
#ifndef DS_PREFIX_CACHE_INT_H
#define DS_PREFIX_CACHE_INT_H
#include <stdint.h>

#include "cache/disk_tier.h"
#include "cache/host_tier.h"
#include "cache/prefix_cache.h"

typedef struct pc_node pc_node;
struct pc_node {
  pc_node *parent; /* NULL for a root */
  char *salt;      /* roots only: the namespace ("" shared) */
  int32_t *label;  /* [n_label] tokens of the edge from the parent; n_label >= 1 below a root */
  int n_label;
  int depth;      /* parent depth + n_label */
  pc_node **kids; /* [cap_kids], n_kids used, sorted by kids[i]->label[0] */
  int n_kids, cap_kids;
  int ckpt;    /* committed record index, -1 */
  int pending; /* in-flight capture record index, -1 */
};

/* Eviction classes (prefix_cache.h, "Eviction"). */
enum { PC_CLASS_LOW = 0, PC_CLASS_NORMAL = 1, PC_CLASS_PROTECT = 2 };

enum { PC_REC_FREE = 0, PC_REC_RESERVED, PC_REC_CAPTURED, PC_REC_COMMITTED, PC_REC_ZOMBIE };

typedef struct pc_rec {
  uint32_t gen;
  int state;     /* PC_REC_* */
  int cls;       /* PC_CLASS_*: eviction class, lowest evicted first */
  pc_node *node; /* NULL when FREE or ZOMBIE */
  int depth;
  int slab;       /* device snapshot slab, -1 */
  int host_slab;  /* host-tier entry with the slab image, -1 */
  int32_t *pages; /* [n_pages] page ids of positions [0, depth) when kv_dev (owned array) */
  int n_pages;    /* kv_pages_for_tokens(depth) */
  int kv_dev;     /* 1: pages[] each hold one kv_pages_cache_ref */
  int host_kv;    /* host-tier entry with the n_pages page images, -1 */
  int disk;       /* disk-tier entry with the whole checkpoint (then nothing in memory), -1 */
  int pins;       /* restores in flight */
  uint64_t tick;  /* last use (commit or validated restore) */
  int next_free;
} pc_rec;

struct prefix_cache {
  kv_pages *kp;
  state_pool *sp;
  host_tier *ht; /* NULL: no host tier */
  disk_tier *dt; /* NULL: no disk tier (borrowed: prefix_cache_opts.disk) */
  prefix_cache_opts o;
  int max_slabs;   /* device slab budget */
  int n_dev_slabs; /* slabs held by records (tickets included) */
  pc_node **roots; /* [cap_roots]; roots[0] is the shared namespace "" */
  int n_roots, cap_roots;
  pc_rec *recs; /* [cap_recs] */
  int n_recs, cap_recs, free_head;
  uint64_t tick;
  prefix_cache_stats st; /* counters (the gauges are computed by get_stats) */
  /* the KV-cache events' table (pc_events.h), NULL: off */
  struct pc_events *events;
};

/* Record ids. */
uint64_t pc_rec_id(const prefix_cache *pc, int i);
/* The record an id names if its state is in mask (1 << PC_REC_*), else -1. */
int pc_rec_find(const prefix_cache *pc, uint64_t id, unsigned mask);
/* A fresh RESERVED-less record (state FREE -> caller sets it up). Fault site
 * "prefix_cache_rec". Returns the index or -1. */
int pc_rec_new(prefix_cache *pc);
/* Returns everything a record holds (slab, page refs, host entries), detaches it from its
 * node (pruning the node), moves its generation and frees it. */
void pc_rec_release(prefix_cache *pc, int i);
/* 1 when the record's payload lives only in the disk tier. */
int pc_rec_disk_only(const pc_rec *r);
/* After a restore of disk checkpoint i into (pages[0, n_pages), slot), before the sequence
 * computes anything: the checkpoint takes a device copy again (a free slab gets the slot, the
 * pages a cache reference) when a slab is free without evicting, so that the next hits are
 * device hits; its file stays. Nothing changes when none is free or the copy fails. */
void pc_disk_promote(prefix_cache *pc, int i, const int32_t *pages, int slot);
/* Drops a committed record now, or turns it into a zombie when pinned. */
void pc_rec_drop(prefix_cache *pc, int i);

/* The node at exactly `depth` on tokens' path in salt's namespace, or NULL. */
pc_node *pc_tree_find(prefix_cache *pc, const char *salt, const int32_t *tokens, int depth);
/* The node at exactly `depth`, created (splitting an edge) when missing. Returns NULL on
 * out of memory (the tree stays valid; call pc_node_prune on nothing). */
pc_node *pc_tree_insert(prefix_cache *pc, const char *salt, const int32_t *tokens, int depth);
/* Removes a node with no record and no child (then its parents), and merges a record-less
 * node with one child into it. */
void pc_node_prune(prefix_cache *pc, pc_node *n);

/* A device slab within the budget for a checkpoint of class cls, evicting as needed: the
 * lowest class first, least recently used within a class; a PC_CLASS_LOW checkpoint only ever
 * evicts PC_CLASS_LOW ones. Returns 0 with *slab, PREFIX_CACHE_ENOSPACE or ENOMEM. */
int pc_take_slab(prefix_cache *pc, int cls, int *slab);
void pc_put_slab(prefix_cache *pc, int slab);

#endif
