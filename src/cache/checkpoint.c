/* checkpoint — capture transactions and restores (see checkpoint.h for the protocol). */
#include "cache/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "cache/pc_events.h"
#include "cache/prefix_cache_int.h"

#define PC_MASK(s) (1u << (s))
#define PC_PENDING (PC_MASK(PC_REC_RESERVED) | PC_MASK(PC_REC_CAPTURED))

/* ---------------------------------------------------------------- capture transactions */

int checkpoint_reserve(prefix_cache *pc, const char *salt, const int32_t *tokens, int n_tokens,
                       int depth, int flags, uint64_t *ticket) {
  *ticket = 0;
  if (!tokens || depth < 1 || depth > n_tokens) return PREFIX_CACHE_EINVAL;
  pc_node *n = pc_tree_find(pc, salt, tokens, depth);
  if (n && n->pending >= 0) {
    *ticket = pc_rec_id(pc, n->pending);
    return PREFIX_CACHE_INFLIGHT;
  }
  int cls = (flags & CHECKPOINT_PROTECT) ? PC_CLASS_PROTECT
            : (flags & CHECKPOINT_LOW)   ? PC_CLASS_LOW
                                         : PC_CLASS_NORMAL;
  if (n && n->ckpt >= 0 && !(flags & CHECKPOINT_REPLACE)) {
    if (pc->recs[n->ckpt].cls < cls) pc->recs[n->ckpt].cls = cls;
    return PREFIX_CACHE_EXISTS;
  }
  if (pc->max_slabs == 0) return PREFIX_CACHE_ENOSPACE;

  int i = pc_rec_new(pc);
  if (i < 0) return PREFIX_CACHE_ENOMEM;
  int np = kv_pages_for_tokens(depth);
  int32_t *pages = fault_hit("checkpoint_pages") ? NULL : malloc((size_t)np * sizeof *pages);
  int slab = -1, rc = PREFIX_CACHE_ENOMEM;
  if (pages) rc = pc_take_slab(pc, cls, &slab); /* may evict: before the node exists */
  if (rc == 0) {
    n = pc_tree_insert(pc, salt, tokens, depth);
    if (!n) rc = PREFIX_CACHE_ENOMEM;
  }
  if (rc != 0) {
    if (slab >= 0) pc_put_slab(pc, slab);
    free(pages);
    pc_rec *r = &pc->recs[i]; /* back to the free list; the id was never handed out */
    r->next_free = pc->free_head;
    pc->free_head = i;
    return rc;
  }
  pc_rec *r = &pc->recs[i];
  r->state = PC_REC_RESERVED;
  r->cls = cls;
  r->node = n;
  r->depth = depth;
  r->slab = slab;
  r->pages = pages;
  r->n_pages = np;
  n->pending = i;
  *ticket = pc_rec_id(pc, i);
  return 0;
}

int checkpoint_capture(prefix_cache *pc, uint64_t ticket, const checkpoint_payload *p) {
  int i = pc_rec_find(pc, ticket, PC_PENDING);
  if (i < 0) {
    pc->st.rejected++;
    return PREFIX_CACHE_ESTALE;
  }
  pc_rec *r = &pc->recs[i];
  if (r->state != PC_REC_RESERVED) { /* captured twice */
    pc->st.rejected++;
    return PREFIX_CACHE_EINVAL;
  }
  /* validate every field before any write */
  int total = kv_pages_total(pc->kp);
  int bad = !p || p->depth != r->depth || !state_pool_slot_used(pc->sp, p->slot) ||
            (p->slab != -1 && p->slab != r->slab) || !p->pages || p->n_pages < r->n_pages;
  for (int k = 0; !bad && k < r->n_pages; k++)
    bad = p->pages[k] < 0 || p->pages[k] >= total || kv_pages_refcount(pc->kp, p->pages[k]) <= 0;
  for (int k = 0; !bad && k < r->n_pages; k++) /* a page table never repeats a page */
    for (int j = 0; !bad && j < k; j++) bad = p->pages[j] == p->pages[k];
  if (bad) {
    pc->st.rejected++;
    return PREFIX_CACHE_EPAYLOAD;
  }
  if (state_pool_save(pc->sp, p->slot, r->slab) != 0) {
    pc->st.capture_failures++;
    return PREFIX_CACHE_ECOPY;
  }
  memcpy(r->pages, p->pages, (size_t)r->n_pages * sizeof *r->pages);
  for (int k = 0; k < r->n_pages; k++) kv_pages_cache_ref(pc->kp, r->pages[k]);
  r->kv_dev = 1;
  r->state = PC_REC_CAPTURED;
  return 0;
}

int checkpoint_commit(prefix_cache *pc, uint64_t ticket, uint64_t *ckpt) {
  int i = pc_rec_find(pc, ticket, PC_PENDING);
  if (i < 0) {
    pc->st.rejected++;
    return PREFIX_CACHE_ESTALE;
  }
  pc_rec *r = &pc->recs[i];
  if (r->state != PC_REC_CAPTURED) {
    pc->st.rejected++;
    return PREFIX_CACHE_EINVAL;
  }
  /* announced before the incumbent leaves, so that the blocks they share are not re-sent */
  pc_events_enter(pc, i);
  pc_node *n = r->node;
  int old = n->ckpt;
  n->pending = -1;
  n->ckpt = i;    /* the node never goes empty: no prune while swapping */
  if (old >= 0) { /* the incumbent leaves only now; a pinned one lives on as a zombie */
    pc_rec *o = &pc->recs[old];
    if (o->pins == 0) {
      pc_rec_release(pc, old); /* the node holds the new record: it is not pruned */
    } else {
      pc_events_leave(pc, old);
      o->node = NULL;
      o->state = PC_REC_ZOMBIE;
    }
  }
  r->state = PC_REC_COMMITTED;
  r->gen = r->gen + 1 ? r->gen + 1 : 1; /* the ticket id is dead from now on */
  r->tick = ++pc->tick;
  pc->st.captures++;
  if (ckpt) *ckpt = pc_rec_id(pc, i);
  return 0;
}

int checkpoint_abort(prefix_cache *pc, uint64_t ticket) {
  int i = pc_rec_find(pc, ticket, PC_PENDING);
  if (i < 0) {
    pc->st.rejected++;
    return PREFIX_CACHE_ESTALE;
  }
  if (pc->recs[i].state == PC_REC_CAPTURED) pc->st.capture_failures++;
  pc_rec_release(pc, i);
  return 0;
}

int checkpoint_ticket_depth(const prefix_cache *pc, uint64_t ticket) {
  int i = pc_rec_find(pc, ticket, PC_PENDING);
  return i < 0 ? -1 : pc->recs[i].depth;
}

int checkpoint_ticket_slab(const prefix_cache *pc, uint64_t ticket) {
  int i = pc_rec_find(pc, ticket, PC_PENDING);
  return i < 0 ? -1 : pc->recs[i].slab;
}

int checkpoint_is_live(const prefix_cache *pc, uint64_t ckpt) {
  return pc_rec_find(pc, ckpt, PC_MASK(PC_REC_COMMITTED)) >= 0;
}

void checkpoint_txn_move(prefix_cache *pc, checkpoint_txn *dst, checkpoint_txn *src) {
  if (dst == src) return;
  checkpoint_txn_cancel(pc, dst);
  *dst = *src;
  src->ticket = 0;
  src->depth = 0;
}

void checkpoint_txn_cancel(prefix_cache *pc, checkpoint_txn *t) {
  if (t->ticket) checkpoint_abort(pc, t->ticket);
  t->ticket = 0;
  t->depth = 0;
}

/* ---------------------------------------------------------------- restores */

/* 1 when record r's payload is complete and consistent with the pools. */
static int checkpoint_payload_ok(const prefix_cache *pc, const pc_rec *r) {
  int n_seq = state_pool_num_slots(pc->sp), n_slabs = state_pool_num_slabs(pc->sp);
  if (r->n_pages != kv_pages_for_tokens(r->depth) || !r->pages) return 0;
  if (pc_rec_disk_only(r))
    return pc->dt && disk_tier_entry_has_slot(pc->dt, r->disk) &&
           disk_tier_entry_pages(pc->dt, r->disk) == r->n_pages;
  if (r->slab >= 0) {
    if (r->slab < n_seq || r->slab >= n_seq + n_slabs) return 0;
  } else if (!pc->ht || !host_tier_entry_has_slot(pc->ht, r->host_slab)) {
    return 0;
  }
  if (r->kv_dev) {
    int total = kv_pages_total(pc->kp);
    for (int k = 0; k < r->n_pages; k++)
      if (r->pages[k] < 0 || r->pages[k] >= total ||
          kv_pages_cache_refcount(pc->kp, r->pages[k]) <= 0)
        return 0;
  } else if (!pc->ht || host_tier_entry_pages(pc->ht, r->host_kv) != r->n_pages) {
    return 0;
  }
  return 1;
}

int checkpoint_restore_begin(prefix_cache *pc, uint64_t ckpt, int n_prompt, kv_pages_table *t,
                             int slot, checkpoint_plan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->cow_src = plan->cow_dst = plan->slab = -1;
  int i = pc_rec_find(pc, ckpt, PC_MASK(PC_REC_COMMITTED));
  if (i < 0) return PREFIX_CACHE_ESTALE;
  pc_rec *r = &pc->recs[i];
  if (!t || r->depth > n_prompt - 1 || t->n != 0 || t->cap < r->n_pages ||
      !state_pool_slot_used(pc->sp, slot))
    return PREFIX_CACHE_EINVAL;
  if (!checkpoint_payload_ok(pc, r)) {
    pc->st.restore_failures++;
    pc_rec_drop(pc, i);
    return PREFIX_CACHE_EPAYLOAD;
  }
  r->pins++; /* from here on it cannot be evicted */
  int n_shared = r->kv_dev ? r->depth / KV_PAGES_TOKENS : 0;
  int fresh = r->n_pages - n_shared;
  if (!kv_pages_can_alloc(pc->kp, fresh))
    prefix_cache_evict_for_pages(pc, fresh - kv_pages_num_free(pc->kp));
  if (kv_pages_alloc(pc->kp, fresh, t->ids + n_shared) != 0) {
    r->pins--;
    return PREFIX_CACHE_ENOSPACE;
  }
  for (int k = 0; k < n_shared; k++) {
    kv_pages_ref(pc->kp, r->pages[k]);
    t->ids[k] = r->pages[k];
  }
  t->n = r->n_pages;
  plan->ckpt = ckpt;
  plan->depth = r->depth;
  plan->table = t;
  plan->slot = slot;
  plan->n_pages = r->n_pages;
  plan->n_shared = n_shared;
  if (r->kv_dev && fresh > 0) {
    plan->cow_src = r->pages[n_shared];
    plan->cow_dst = t->ids[n_shared];
  }
  plan->host_pages = !r->kv_dev;
  plan->slab = r->slab;
  plan->host_slab = r->slab < 0;
  plan->disk = pc_rec_disk_only(r);
  return 0;
}

/* The record a plan names (committed or zombie: pinned records keep their generation). */
static int checkpoint_plan_rec(const prefix_cache *pc, const checkpoint_plan *plan) {
  int i = pc_rec_find(pc, plan->ckpt, PC_MASK(PC_REC_COMMITTED) | PC_MASK(PC_REC_ZOMBIE));
  CHECK(i >= 0 && pc->recs[i].pins > 0);
  return i;
}

int checkpoint_restore_run(prefix_cache *pc, checkpoint_plan *plan) {
  const pc_rec *r = &pc->recs[checkpoint_plan_rec(pc, plan)];
  if (plan->disk) { /* checked against its hashes before anything reaches the device */
    if (disk_tier_read(pc->dt, r->disk, plan->slot, plan->table->ids, plan->n_pages) != 0)
      return PREFIX_CACHE_ECOPY;
    plan->ran = 1;
    return 0;
  }
  if (plan->cow_dst >= 0) {
    if (fault_hit("checkpoint_page_copy")) return PREFIX_CACHE_ECOPY;
    if (pc->o.ops.page_copy && pc->o.ops.page_copy(pc->o.ops.ctx, plan->cow_dst, plan->cow_src))
      return PREFIX_CACHE_ECOPY;
  }
  if (plan->host_pages &&
      host_tier_write_pages(pc->ht, r->host_kv, plan->table->ids, plan->n_pages) != 0)
    return PREFIX_CACHE_ECOPY;
  if (plan->host_slab) {
    if (host_tier_write_slot(pc->ht, r->host_slab, plan->slot) != 0) return PREFIX_CACHE_ECOPY;
  } else if (state_pool_restore(pc->sp, plan->slab, plan->slot) != 0) {
    return PREFIX_CACHE_ECOPY;
  }
  plan->ran = 1;
  return 0;
}

void checkpoint_restore_end(prefix_cache *pc, checkpoint_plan *plan, int ok) {
  int i = checkpoint_plan_rec(pc, plan);
  pc_rec *r = &pc->recs[i];
  if (ok && plan->disk && r->state == PC_REC_COMMITTED) /* still pinned: not evicted meanwhile */
    pc_disk_promote(pc, i, plan->table->ids, plan->slot);
  r->pins--;
  if (ok) {
    pc->st.hits++;
    pc->st.hit_tokens += plan->depth;
    if (r->state == PC_REC_COMMITTED) {
      r->tick = ++pc->tick;
      if (r->cls < PC_CLASS_NORMAL) r->cls = PC_CLASS_NORMAL; /* it proved useful */
    }
    if (r->host_slab >= 0) host_tier_touch(pc->ht, r->host_slab);
    if (r->host_kv >= 0) host_tier_touch(pc->ht, r->host_kv);
    if (r->disk >= 0) disk_tier_touch(pc->dt, r->disk);
    if (r->state == PC_REC_ZOMBIE && r->pins == 0) pc_rec_release(pc, i);
    return;
  }
  kv_pages_table_release(pc->kp, plan->table);
  pc->st.restore_failures++;
  pc_rec_drop(pc, i); /* its payload cannot be trusted */
}

int checkpoint_restore(prefix_cache *pc, uint64_t ckpt, int n_prompt, kv_pages_table *t, int slot,
                       checkpoint_plan *plan) {
  int rc = checkpoint_restore_begin(pc, ckpt, n_prompt, t, slot, plan);
  if (rc != 0) return rc;
  rc = checkpoint_restore_run(pc, plan);
  checkpoint_restore_end(pc, plan, rc == 0);
  return rc;
}
