/* checkpoint — capture transactions and restores of prefix-cache checkpoints.
 *
 * Capture, as a transaction (any number in flight, each with its own slab):
 *
 *   admission                       step that reached d succeeded        later / at once
 *   checkpoint_reserve(d) --------> checkpoint_capture(payload) -------> checkpoint_commit
 *     slab + placeholder node         validate every field, then           publish; the
 *     ticket (id, generation)         save slot -> slab, cache_ref pages   incumbent leaves now
 *          |                                  |
 *          +---------- checkpoint_abort (failure, cancellation, retire) --+--> slab and refs
 *                                                                               returned
 * Tickets are ids with a generation: an unknown ticket, a double commit, a commit after an
 * abort, a capture with a wrong depth/slab/page are refused without any side effect (counted
 * as rejected). A failed or aborted replacement leaves the incumbent checkpoint untouched.
 *
 * Restore (the scheduler carries it out; the cache keeps the books):
 *
 *   checkpoint_restore_begin   validate the id and payload, pin, map the full pages into
 *                              the sequence's (empty) page table with kv_pages_ref, take a
 *                              fresh page for a partial last page (copy-on-write) or fresh
 *                              pages for pages in the host tier; fills a plan
 *   checkpoint_restore_run     the copies of the plan through the ops: page copy (COW), host
 *                              page writes, slab -> slot (state_pool_restore) or host slot write;
 *                              a disk checkpoint: its file read, checked, written to pages + slot
 *   checkpoint_restore_end     ok: count the hit, promote to MRU; failed: release the table's
 *                              pages, drop the checkpoint, count a restore failure; unpin
 *
 * checkpoint_txn is the handle a request keeps: move-only by convention (checkpoint_txn_move
 * aborts what it overwrites), cancelled at retirement (checkpoint_txn_cancel, idempotent). */
#ifndef DS_CHECKPOINT_H
#define DS_CHECKPOINT_H
#include <stdint.h>

#include "cache/kv_pages.h"
#include "cache/prefix_cache.h"

enum {
  CHECKPOINT_PROTECT = 1, /* a system+tools head: evicted last */
  CHECKPOINT_REPLACE = 2, /* capture even if a checkpoint exists at that depth */
  CHECKPOINT_LOW = 4      /* speculative (end of generation, interval): evicted first,
                             and evicts only its own class (prefix_cache.h) */
};

/* Reserves a capture of depth `depth` of tokens[0, depth) in the salt's namespace: a slab
 * (evicting by class then LRU when the pool or the device budget is full, see prefix_cache.h)
 * and a placeholder node. A committed checkpoint already at that depth whose class is below
 * the one asked for is raised to it (and PREFIX_CACHE_EXISTS returned).
 * 1 <= depth <= n_tokens. Returns 0 with *ticket, or PREFIX_CACHE_EXISTS (a committed
 * checkpoint is there and no CHECKPOINT_REPLACE), PREFIX_CACHE_INFLIGHT (*ticket is then the
 * in-flight one: wait for it), PREFIX_CACHE_ENOSPACE, PREFIX_CACHE_ENOMEM, PREFIX_CACHE_EINVAL;
 * on failure nothing changes (but evictions already done). */
int checkpoint_reserve(prefix_cache *pc, const char *salt, const int32_t *tokens, int n_tokens,
                       int depth, int flags, uint64_t *ticket);

/* What the step produced for a ticket: the sequence's state slot after exactly depth tokens
 * and its page table. Every field is validated before anything is written. */
typedef struct checkpoint_payload {
  int depth;            /* tokens computed; must equal the ticket's depth */
  int slot;             /* the sequence's state slot (a sequence slot, not a slab) */
  int slab;             /* the ticket's slab (checkpoint_ticket_slab), or -1 for "the ticket's" */
  const int32_t *pages; /* the sequence's page table */
  int n_pages;          /* >= kv_pages_for_tokens(depth); each page referenced by the sequence */
} checkpoint_payload;

/* Captures into a reserved ticket: validates (ticket live and RESERVED, depth, slot (an
 * allocated sequence slot: state_pool_slot_used) and slab
 * ids, page ids in range and held by a sequence), then copies the slot into the slab
 * (state_pool_save) and takes a cache reference on each page of [0, depth). Returns 0, or
 * PREFIX_CACHE_ESTALE / EPAYLOAD (refused: nothing changed, the ticket stays reserved) or
 * PREFIX_CACHE_ECOPY (the slab copy failed: the ticket stays reserved; abort it). */
int checkpoint_capture(prefix_cache *pc, uint64_t ticket, const checkpoint_payload *p);
/* Publishes a CAPTURED ticket: the incumbent at that node (if any) is dropped now, the new
 * checkpoint becomes MRU and visible to lookups. Returns 0 with *ckpt (the checkpoint id; the
 * ticket id is dead from now on), or PREFIX_CACHE_ESTALE (unknown, aborted or already
 * committed ticket) / PREFIX_CACHE_EINVAL (not captured yet); refusals change nothing, *ckpt
 * included. */
int checkpoint_commit(prefix_cache *pc, uint64_t ticket, uint64_t *ckpt);
/* Aborts a ticket (RESERVED or CAPTURED): the slab and page refs go back, the placeholder
 * node goes if empty, the incumbent is untouched. Returns 0, or PREFIX_CACHE_ESTALE for an
 * unknown, committed or already aborted ticket (nothing changes). */
int checkpoint_abort(prefix_cache *pc, uint64_t ticket);
/* The ticket's depth and slab, or -1 when the ticket is not live. */
int checkpoint_ticket_depth(const prefix_cache *pc, uint64_t ticket);
int checkpoint_ticket_slab(const prefix_cache *pc, uint64_t ticket);
/* 1 when id names a committed checkpoint now. */
int checkpoint_is_live(const prefix_cache *pc, uint64_t ckpt);

/* A request's handle on one capture transaction. {0} is empty. */
typedef struct checkpoint_txn {
  uint64_t ticket;
  int depth;
} checkpoint_txn;
/* Moves src into dst (src becomes empty); a live ticket in dst is aborted first. */
void checkpoint_txn_move(prefix_cache *pc, checkpoint_txn *dst, checkpoint_txn *src);
/* Aborts the ticket if any and empties t. Idempotent. */
void checkpoint_txn_cancel(prefix_cache *pc, checkpoint_txn *t);

/* A restore, as planned by checkpoint_restore_begin. */
typedef struct checkpoint_plan {
  uint64_t ckpt;         /* the checkpoint restored from */
  int depth;             /* tokens restored: the sequence prefills from here */
  kv_pages_table *table; /* the sequence's page table, filled with n_pages entries */
  int slot;              /* the sequence's state slot */
  int n_pages;           /* kv_pages_for_tokens(depth) */
  int n_shared;          /* table ids [0, n_shared) are the checkpoint's pages, read-only */
  int cow_src, cow_dst;  /* copy page cow_src into cow_dst (= table->ids[n_shared]), or -1 */
  int host_pages;        /* 1: ids [0, n_pages) are fresh, written from the host tier */
  int slab;              /* copy this slab into slot, or -1: write the slot from the host */
  int host_slab;         /* 1: the state comes from the host tier */
  int disk;              /* 1: pages and state are read from the disk tier's file */
  int ran;               /* copies done (checkpoint_restore_run returned 0) */
} checkpoint_plan;

/* Plans a restore of ckpt into a sequence with an empty page table t (capacity >= the
 * checkpoint's pages) and an allocated state slot, for a prompt of n_prompt tokens (the
 * checkpoint must be shallower). Validates everything first, then pins the checkpoint, takes
 * fresh pages (evicting other checkpoints' pages if the pool is short) and maps the shared
 * ones. Returns 0 with *plan, or PREFIX_CACHE_ESTALE / EINVAL / EPAYLOAD / ENOSPACE (nothing
 * changed: admit cold; a checkpoint that failed validation is dropped and counted as a
 * restore failure). */
int checkpoint_restore_begin(prefix_cache *pc, uint64_t ckpt, int n_prompt, kv_pages_table *t,
                             int slot, checkpoint_plan *plan);
/* Runs the plan's copies (fault sites "checkpoint_page_copy", "state_pool_copy",
 * "host_tier_write"). Returns 0 or PREFIX_CACHE_ECOPY; either way call restore_end. */
int checkpoint_restore_run(prefix_cache *pc, checkpoint_plan *plan);
/* Ends a restore. ok = 1 (the copies ran): counts a hit and plan->depth hit tokens, promotes
 * the checkpoint to MRU. ok = 0: releases every page of the table (it is empty again),
 * drops the checkpoint, counts a restore failure; the slot's content is undefined (free it
 * and allocate again). Unpins in both cases. */
void checkpoint_restore_end(prefix_cache *pc, checkpoint_plan *plan, int ok);
/* begin + run + end. Returns 0 (restored plan->depth tokens) or the failing status (the
 * table is empty then). */
int checkpoint_restore(prefix_cache *pc, uint64_t ckpt, int n_prompt, kv_pages_table *t, int slot,
                       checkpoint_plan *plan);

#endif
