#include "cache/state_pool.h"

#include <stdlib.h>

#include "base/fault.h"
#include "base/log.h"

struct state_pool {
  int n_seq, n_slabs;
  state_pool_ops ops;
  unsigned char *used; /* [n_seq + n_slabs] */
  int *slot_free;      /* [n_seq] stack of free slot ids, top at the end */
  int n_slot_free;
  int *slab_free; /* [n_slabs] stack of free slab ids */
  int n_slab_free;
};

int state_pool_init(state_pool **out, int n_seq, int n_slabs, const state_pool_ops *ops) {
  *out = NULL;
  if (n_seq < 0 || n_slabs < 0) return -1;
  state_pool *sp = calloc(1, sizeof *sp);
  if (!sp) return -1;
  sp->n_seq = n_seq;
  sp->n_slabs = n_slabs;
  if (ops) sp->ops = *ops;
  sp->used = calloc((size_t)(n_seq + n_slabs) + 1, 1);
  sp->slot_free = calloc((size_t)n_seq + 1, sizeof(int));
  sp->slab_free = calloc((size_t)n_slabs + 1, sizeof(int));
  if (!sp->used || !sp->slot_free || !sp->slab_free) {
    state_pool_free(sp);
    return -1;
  }
  for (int i = 0; i < n_seq; i++) sp->slot_free[i] = n_seq - 1 - i;
  sp->n_slot_free = n_seq;
  for (int i = 0; i < n_slabs; i++) sp->slab_free[i] = n_seq + n_slabs - 1 - i;
  sp->n_slab_free = n_slabs;
  *out = sp;
  return 0;
}

void state_pool_free(state_pool *sp) {
  if (!sp) return;
  free(sp->used);
  free(sp->slot_free);
  free(sp->slab_free);
  free(sp);
}

int state_pool_num_slots(const state_pool *sp) { return sp->n_seq; }
int state_pool_num_slots_free(const state_pool *sp) { return sp->n_slot_free; }
int state_pool_num_slabs(const state_pool *sp) { return sp->n_slabs; }
int state_pool_num_slabs_free(const state_pool *sp) { return sp->n_slab_free; }

int state_pool_slot_alloc(state_pool *sp, int *slot) {
  if (sp->n_slot_free == 0) return -1;
  if (fault_hit("state_pool_slot_alloc")) return -1;
  int s = sp->slot_free[sp->n_slot_free - 1];
  if (sp->ops.zero && sp->ops.zero(sp->ops.ctx, s) != 0) return -1;
  sp->n_slot_free--;
  CHECK(!sp->used[s]);
  sp->used[s] = 1;
  *slot = s;
  return 0;
}

void state_pool_slot_free(state_pool *sp, int slot) {
  CHECK(slot >= 0 && slot < sp->n_seq && sp->used[slot]);
  sp->used[slot] = 0;
  sp->slot_free[sp->n_slot_free++] = slot;
}

int state_pool_slot_used(const state_pool *sp, int slot) {
  return slot >= 0 && slot < sp->n_seq && sp->used[slot];
}

int state_pool_slab_alloc(state_pool *sp, int *slab) {
  if (sp->n_slab_free == 0) return -1;
  if (fault_hit("state_pool_slab_alloc")) return -1;
  int s = sp->slab_free[--sp->n_slab_free];
  CHECK(!sp->used[s]);
  sp->used[s] = 1;
  *slab = s;
  return 0;
}

void state_pool_slab_free(state_pool *sp, int slab) {
  CHECK(slab >= sp->n_seq && slab < sp->n_seq + sp->n_slabs && sp->used[slab]);
  sp->used[slab] = 0;
  sp->slab_free[sp->n_slab_free++] = slab;
}

static int state_pool_copy(state_pool *sp, int dst, int src) {
  if (fault_hit("state_pool_copy")) return -1;
  return sp->ops.copy ? sp->ops.copy(sp->ops.ctx, dst, src) : 0;
}

int state_pool_save(state_pool *sp, int slot, int slab) {
  CHECK(slot >= 0 && slot < sp->n_seq && sp->used[slot]);
  CHECK(slab >= sp->n_seq && slab < sp->n_seq + sp->n_slabs && sp->used[slab]);
  return state_pool_copy(sp, slab, slot);
}

int state_pool_restore(state_pool *sp, int slab, int slot) {
  CHECK(slot >= 0 && slot < sp->n_seq && sp->used[slot]);
  CHECK(slab >= sp->n_seq && slab < sp->n_seq + sp->n_slabs && sp->used[slab]);
  return state_pool_copy(sp, slot, slab);
}

int state_pool_check(const state_pool *sp, char *err, size_t errlen) {
  int used_slots = 0, used_slabs = 0;
  for (int i = 0; i < sp->n_seq; i++) used_slots += sp->used[i];
  for (int i = 0; i < sp->n_slabs; i++) used_slabs += sp->used[sp->n_seq + i];
  if (used_slots + sp->n_slot_free != sp->n_seq)
    return errf(err, errlen, "state_pool: %d slots used + %d free != %d", used_slots,
                sp->n_slot_free, sp->n_seq);
  if (used_slabs + sp->n_slab_free != sp->n_slabs)
    return errf(err, errlen, "state_pool: %d slabs used + %d free != %d", used_slabs,
                sp->n_slab_free, sp->n_slabs);
  for (int i = 0; i < sp->n_slot_free; i++) {
    int s = sp->slot_free[i];
    if (s < 0 || s >= sp->n_seq || sp->used[s])
      return errf(err, errlen, "state_pool: slot %d is both free and used", s);
  }
  for (int i = 0; i < sp->n_slab_free; i++) {
    int s = sp->slab_free[i];
    if (s < sp->n_seq || s >= sp->n_seq + sp->n_slabs || sp->used[s])
      return errf(err, errlen, "state_pool: slab %d is both free and used", s);
  }
  return 0;
}
