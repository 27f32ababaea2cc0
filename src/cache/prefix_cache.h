/* prefix_cache — checkpoints of computed prefixes, keyed by exact token ids.
 *
 * A radix tree over token ids, one root per cache_salt (the shared namespace is salt "" or
 * NULL; a salted request can never reach another salt's nodes). Edges carry token runs and
 * are compared token by token: no hash can ever hand one prompt's cache to another.
 *
 *   root("")                                   root("tenant-a")
 *     |  [sys, tools ...]    (d=812, protected)   |  [...]
 *     +-- A* ---- [user turn 1 ...] -- B* (d=1400)
 *          \----- [user turn 1' ...] - C  (d=1391, capture in flight)
 *
 *   *  committed checkpoint         C  placeholder of an in-flight capture (not a hit)
 *
 * A checkpoint at depth d is everything a sequence needs to continue after d tokens:
 *   KV      references (kv_pages_cache_ref) on the pages covering positions [0, d), shared
 *           zero-copy with the sequence that computed them; a restore maps the full pages
 *           read-only and copies the partial last page (copy-on-write), or, when the pages
 *           were demoted, writes fresh pages from the host tier;
 *   state   one snapshot slab (state_pool) holding the recurrent state after exactly d
 *           tokens, or its bytes in the host tier.
 * Each checkpoint is a record named by a 64-bit id = generation << 32 | (index + 1); the
 * record's generation moves on every commit and free, so a stale id never names a newer
 * payload. Id 0 is "none".
 *
 * Life of a checkpoint (the transactions live in checkpoint.h):
 *
 *   reserve ----> RESERVED --capture--> CAPTURED --commit--> COMMITTED --evict/replace--> free
 *   (slab +          |                    |                  (incumbent replaced only now)
 *   placeholder)     +------ abort -------+---> free (slab and refs returned)
 *
 * Eviction (mechanism here, called by the scheduler or by reserve/restore on pressure): over
 * committed, unpinned checkpoints, by class first, then least recently used. Three classes:
 *
 *   LOW      speculative: the end-of-generation checkpoint of every finished request (only a
 *            next turn that repeats the output hits it) and interval checkpoints
 *            (CHECKPOINT_LOW);
 *   NORMAL   the points a known reuse needs: len-1 (exact repeats), the last chat turn, the
 *            divergence point of shared prefixes, demand captures (the default);
 *   PROTECT  system+tools heads (CHECKPOINT_PROTECT).
 *
 * A victim is taken from the lowest class present (LRU within it), and a LOW reserve only ever
 * evicts LOW checkpoints: with every slab held by NORMAL or PROTECT ones it fails (the capture
 * is skipped), so a stream of finished requests can never push out the len-1 and chat-head
 * checkpoints that repeats and shared heads restore. A LOW checkpoint is raised to NORMAL when
 * a restore from it succeeds, or when a reserve of a higher class finds it at its depth.
 * Example, 4 slabs: NORMAL a, b; LOW x, y (x older). A LOW reserve evicts x; a NORMAL reserve
 * evicts x, then y, then a (the LRU of the NORMAL class); with a, b, c, d all NORMAL a LOW
 * reserve fails and nothing is evicted.
 * On slab pressure the victim's slab leaves (its bytes move to the host tier when it is
 * enabled, else the checkpoint is dropped); on page pressure the pages of leaf checkpoints
 * go first within a class (again to the host tier when it fits). Budgets: device slabs
 * (count, from bytes) and host bytes, never exceeded. prefix_cache_check verifies the tree,
 * the page references, slab ownership and the budgets.
 * With a disk tier (disk_tier.h) a checkpoint that would be dropped from memory (the host
 * tier's LRU victim, or a device victim the host tier cannot take) is written whole to a file
 * instead and stays in the tree as a disk checkpoint; a restore from it reads the file into
 * fresh pages and the slot. At init the disk tier's files become disk checkpoints (a warm
 * restart), and prefix_cache_free writes the checkpoints still in memory before it frees.
 *
 * Owner: the engine thread; no locks. The cache borrows kv_pages and state_pool and is the
 * only user of kv_pages_cache_ref and of snapshot slabs. */
#ifndef DS_PREFIX_CACHE_H
#define DS_PREFIX_CACHE_H
#include <stddef.h>
#include <stdint.h>

#include "cache/kv_events.h"
#include "cache/kv_pages.h"
#include "cache/state_pool.h"

typedef struct prefix_cache prefix_cache;

/* Device operations beyond the state_pool's own (slab <-> slot copies go through
 * state_pool_save / state_pool_restore). Any may be NULL in tests (the copy then does
 * nothing and succeeds). Each returns 0 or -1. In the engine: qwen35_page_copy,
 * qwen35_page_read/write, qwen35_slot_read/write (slab ids are slot ids). */
typedef struct prefix_cache_ops {
  void *ctx;
  int (*page_copy)(void *ctx, int dst, int src);
  int (*page_read)(void *ctx, int page, void *host);
  int (*page_write)(void *ctx, int page, const void *host);
  int (*slot_read)(void *ctx, int slot, void *host);
  int (*slot_write)(void *ctx, int slot, const void *host);
} prefix_cache_ops;

typedef struct prefix_cache_opts {
  size_t slab_bytes;          /* qwen35_slot_bytes: one snapshot slab */
  size_t page_bytes;          /* qwen35_page_bytes: one KV page, every attention layer */
  size_t device_budget_bytes; /* --prefix-cache-gib: slabs held <= this / slab_bytes
                                 (0: every slab of the pool) */
  size_t host_budget_bytes;   /* --host-cache-gib (0: no host tier) */
  kv_events *events;          /* --kv-events-config: where blocks and checkpoints are reported
                                 (borrowed, outlives the cache; NULL: not reported) */
  struct disk_tier *disk;     /* --disk-cache-dir: borrowed, must outlive the cache (NULL: none) */
  prefix_cache_ops ops;
} prefix_cache_opts;

/* Status codes of the prefix cache and checkpoint calls. */
enum {
  PREFIX_CACHE_OK = 0,
  PREFIX_CACHE_ENOMEM = -1,   /* a request-time allocation failed (or a fault fired) */
  PREFIX_CACHE_ENOSPACE = -2, /* no slab / page / budget left, nothing evictable */
  PREFIX_CACHE_EXISTS = -3,   /* a committed checkpoint already sits at that depth */
  PREFIX_CACHE_INFLIGHT = -4, /* a capture of that depth on that path is already in flight */
  PREFIX_CACHE_EINVAL = -5,   /* bad arguments (depth out of range...) */
  PREFIX_CACHE_ESTALE = -6,   /* unknown id, or its generation moved on */
  PREFIX_CACHE_EPAYLOAD = -7, /* a payload field failed validation; nothing was written */
  PREFIX_CACHE_ECOPY = -8,    /* a device or host copy failed */
};
const char *prefix_cache_strerror(int rc);

/* Creates the cache over the pools (borrowed; they must outlive it). o is copied. The
 * device slab budget is min(state_pool slabs, device_budget_bytes / slab_bytes). With a disk
 * tier, each of its entries becomes a disk checkpoint (an entry of another shape is dropped).
 * Returns 0, or -1 on out of memory (start-up only). */
int prefix_cache_init(prefix_cache **out, kv_pages *kp, state_pool *sp, const prefix_cache_opts *o);
/* Aborts every in-flight ticket, drops every checkpoint (page refs, slabs and host copies
 * are returned) and frees the cache. With a disk tier the committed checkpoints still in
 * memory are written to it first (least recently used first, within its budget; the ops must
 * still work) and its files stay. Restores still pinned are a caller bug (CHECK). */
void prefix_cache_free(prefix_cache *pc);
/* Drops every committed checkpoint that is not pinned (tickets stay; disk checkpoints' files
 * are deleted). */
void prefix_cache_clear(prefix_cache *pc);

/* The outcome of a lookup. */
typedef struct prefix_cache_match {
  uint64_t ckpt;     /* the deepest restorable checkpoint, 0 when none */
  int depth;         /* its depth: tokens a restore provides (0 when none) */
  int on_host;       /* 1 when some of it lives in the host tier (the restore writes it) */
  uint64_t inflight; /* the deepest in-flight capture on the prompt's path, deeper than
                        depth and <= n_prompt - 1: wait for it rather than recompute (0: none) */
  int inflight_depth;
  int match_len; /* prompt tokens on an existing path of the tree: the divergence depth */
} prefix_cache_match;

/* Finds the deepest committed checkpoint at depth <= n_prompt - 1 whose path equals the
 * prompt, in the salt's namespace (NULL or "": shared). A checkpoint at depth n_prompt never
 * masks a shorter one. Counts one query; no hit is counted and nothing is promoted until a
 * restore from it is validated (checkpoint_restore_end). Never fails. */
void prefix_cache_lookup(prefix_cache *pc, const char *salt, const int32_t *prompt, int n_prompt,
                         prefix_cache_match *m);
/* prefix_cache_lookup without counting a query (the scheduler's look-ahead over requests it
 * cannot admit this step). */
void prefix_cache_peek(prefix_cache *pc, const char *salt, const int32_t *prompt, int n_prompt,
                       prefix_cache_match *m);

/* 1 when a restore from ckpt will not read the disk on the caller's thread (it is not a disk
 * checkpoint, or its file was read ahead); else 0: the disk tier's reader is reading it (or
 * waits for a turn). The scheduler asks before it admits a request onto a disk checkpoint and
 * leaves the request waiting on 0, so that no step waits for the disk. Never fails. */
int prefix_cache_disk_ready(prefix_cache *pc, uint64_t ckpt);
/* A restore's disk cost, for the scheduler's choice between reading and recomputing: *bytes the
 * file of ckpt when it lives only on disk (else 0), *rate the disk tier's measured read rate in
 * bytes per second, reader thread's read and hash (0 before its first read). */
void prefix_cache_disk_cost(prefix_cache *pc, uint64_t ckpt, double *bytes, double *rate);

/* Capture points (a pure function: the policy is the scheduler's). */
enum {
  PREFIX_CACHE_POINT_PROTECT = 1,
  PREFIX_CACHE_POINT_HEAD = 2,
  PREFIX_CACHE_POINT_LAST_TURN = 4,
  PREFIX_CACHE_POINT_INTERVAL = 8,
  PREFIX_CACHE_POINT_END = 16,
  PREFIX_CACHE_POINT_DIVERGE = 32
};
typedef struct prefix_cache_point {
  int depth;
  int flags; /* PREFIX_CACHE_POINT_*: why; PROTECT marks a system+tools head */
} prefix_cache_point;
/* Tokens between INTERVAL captures when the caller gives none: a long prompt keeps a restore
 * point every 2,048 tokens without a capture per chunk. */
#define PREFIX_CACHE_DEFAULT_INTERVAL 2048
/* Upper bound of the points prefix_cache_capture_points can return. */
int prefix_cache_capture_points_max(int n_prompt, int n_boundaries, int interval);
/* Computes the capture depths of a prompt, ascending and unique, each in
 * (restored, n_prompt - 1]:
 *   boundaries[1]             end of the system+tools head (start of the 2nd message):
 *                             HEAD | PROTECT
 *   boundaries[n-1] (n >= 2)  start of the last turn: LAST_TURN
 *   k * interval              every interval tokens (interval rounded up to a page;
 *                             <= 0: PREFIX_CACHE_DEFAULT_INTERVAL): INTERVAL
 *   n_prompt - 1              so an exact repeat recomputes one token: END
 *   divergence                where the prompt leaves the tree (match_len of the lookup) when
 *                             0 < divergence < n_prompt: DIVERGE
 * boundaries are chat-message start positions (ascending). Writes at most cap points; returns
 * how many were written. */
int prefix_cache_capture_points(int n_prompt, const int32_t *boundaries, int n_boundaries,
                                int interval, int divergence, int restored, prefix_cache_point *out,
                                int cap);

/* Eviction on page pressure: the scheduler calls it when kv_pages_alloc would fail. Releases
 * pages held only by the cache, leaf checkpoints first (LRU; protected heads last; pinned and
 * in-flight ones never), moving them to the host tier when it fits. Returns the number of
 * pages that went back to the free queue (may exceed n; 0 when nothing could be freed). */
int prefix_cache_evict_for_pages(prefix_cache *pc, int n);
/* Frees n device slabs (slab pressure): the lowest class first, LRU within a class, to the
 * host tier when it fits. Returns the number of slabs freed. Reserve calls it by itself. */
int prefix_cache_evict_slabs(prefix_cache *pc, int n);

typedef struct prefix_cache_stats {
  long long queries, hits, hit_tokens;
  long long query_tokens; /* prompt tokens of the lookups (vLLM counts its queries so) */
  long long captures, capture_failures; /* commits; aborts of captured or failed captures */
  long long evictions;                  /* checkpoints dropped (any tier, any reason but replace) */
  long long demotions;                  /* slabs or page sets moved to the host tier */
  long long restore_failures;
  long long rejected;                   /* malformed or foreign events refused */
  int n_checkpoints, n_pending, n_host; /* committed, in flight, with a host part */
  int n_disk;                           /* committed checkpoints that live only on disk */
  long long spills;                     /* checkpoints moved from memory to the disk tier */
  long long disk_evictions;             /* disk checkpoints dropped for room (LRU) */
  int device_slabs, device_slabs_max;
  int device_pages; /* distinct pages the cache references */
  size_t device_slab_bytes, device_page_bytes, host_bytes, host_budget_bytes;
} prefix_cache_stats;
void prefix_cache_get_stats(const prefix_cache *pc, prefix_cache_stats *s);

/* Verifies every invariant: the tree (depths, sorted children, no dead leaves, salts), each
 * record's node binding, every page's cache_refcount equal to the number of records holding
 * it, slab ownership (distinct, in range, equal to the pool's used slabs), host entries, and
 * the budgets. Returns 0, or -1 with one line in err. */
int prefix_cache_check(const prefix_cache *pc, char *err, size_t errlen);

#endif
