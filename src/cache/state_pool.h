/* state_pool — the recurrent-state slots of running sequences and the snapshot slabs of the
 * prefix cache, as integer ids into qwen35's slot memory.
 *
 *   slot ids  [0, n_seq)               one per running sequence (sized from --max-num-seqs)
 *             [n_seq, n_seq + n_slabs) snapshot slabs: same shape, hold a checkpointed
 *                                      recurrent state for the prefix cache
 *
 *   sequence slot ----save (copy)----> slab
 *                 <---restore (copy)--
 *
 * The pool only counts and carries out copies through the ops it was given (in the engine:
 * qwen35_slot_zero / qwen35_slot_copy); the scheduler and the prefix cache decide. Free ids
 * are handed out lowest first from a stack, so ids are deterministic. Invariant
 * (state_pool_check): free + used = total for both kinds, and no id is both free and used. */
#ifndef DS_STATE_POOL_H
#define DS_STATE_POOL_H
#include <stddef.h>

typedef struct state_pool state_pool;

/* The device operations the pool runs; either may be NULL (tests). Each returns 0 or -1. */
typedef struct state_pool_ops {
  void *ctx;
  int (*zero)(void *ctx, int slot);
  int (*copy)(void *ctx, int dst, int src);
} state_pool_ops;

/* Creates a pool of n_seq sequence slots and n_slabs snapshot slabs. ops is copied (may be
 * NULL). Returns 0, or -1 on out of memory (start-up only). */
int state_pool_init(state_pool **out, int n_seq, int n_slabs, const state_pool_ops *ops);
void state_pool_free(state_pool *sp);

int state_pool_num_slots(const state_pool *sp);
int state_pool_num_slots_free(const state_pool *sp);
int state_pool_num_slabs(const state_pool *sp);
int state_pool_num_slabs_free(const state_pool *sp);

/* Takes a free sequence slot and zeroes it (the state before position 0). Returns 0 with
 * *slot, or -1 when none is free, the fault site "state_pool_slot_alloc" fires, or the zeroing
 * fails (nothing changes then). */
int state_pool_slot_alloc(state_pool *sp, int *slot);
void state_pool_slot_free(state_pool *sp, int slot);
/* 1 when slot is a sequence slot id in range that is allocated now (0 otherwise, never
 * fails: callers validate ids from outside with it before any copy). */
int state_pool_slot_used(const state_pool *sp, int slot);
/* Takes a free snapshot slab (fault site "state_pool_slab_alloc"); contents undefined until
 * saved into. Returns 0 with *slab or -1. One owner: the prefix-cache node that holds it. */
int state_pool_slab_alloc(state_pool *sp, int *slab);
void state_pool_slab_free(state_pool *sp, int slab);
/* Copies a sequence slot into a slab (save) or a slab into a sequence slot (restore).
 * Returns 0, or -1 when the copy fails (fault site "state_pool_copy"). */
int state_pool_save(state_pool *sp, int slot, int slab);
int state_pool_restore(state_pool *sp, int slab, int slot);

/* Verifies the invariants; returns 0, or -1 with one line in err. */
int state_pool_check(const state_pool *sp, char *err, size_t errlen);

#endif
