/* checkpoint: capture transactions (reserve / capture / commit / abort, move and cancel of the
 * request's handle), stale generations, foreign and malformed events refused without side
 * effects, failed replacements keeping the incumbent, validation of every payload field
 * before any write, restore plans (shared pages, copy-on-write, slab) with parity against a
 * cold computation, hits counted only after a validated restore, and fault injection at every
 * site. Each test ends with the integrity checks and a leak check. */
#include "prefix_cache_fake.h"
#include "test.h"

/* Pools, device and cache counters that no refused event may change. */
typedef struct snap {
  int free_pages, cached_pages, free_slabs, copies, ckpts, pending;
  long long captures, hits;
  int cache_refs;
} snap;

static snap take(const fx *f) {
  snap s;
  memset(&s, 0, sizeof s); /* padding too: snapshots are compared with memcmp */
  s.free_pages = kv_pages_num_free(f->kp);
  s.cached_pages = kv_pages_num_cached(f->kp);
  s.free_slabs = state_pool_num_slabs_free(f->sp);
  s.copies = f->dev.n_slot_copy + f->dev.n_page_copy + f->dev.n_page_write + f->dev.n_slot_write;
  prefix_cache_stats st;
  prefix_cache_get_stats(f->pc, &st);
  s.ckpts = st.n_checkpoints;
  s.pending = st.n_pending;
  s.captures = st.captures;
  s.hits = st.hits;
  s.cache_refs = 0;
  for (int p = 0; p < kv_pages_total(f->kp); p++) s.cache_refs += kv_pages_cache_refcount(f->kp, p);
  return s;
}
static int same(snap a, snap b) { return memcmp(&a, &b, sizeof a) == 0; }

TEST(txn_reserve_capture_commit) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  uint64_t t, id;
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 40, 0, &t) == 0);
  EXPECT(t != 0);
  EXPECT_EQ_INT(checkpoint_ticket_depth(f.pc, t), 40);
  EXPECT_EQ_INT(checkpoint_ticket_slab(f.pc, t), 2); /* slabs are ids 2, 3: lowest first */
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 1);
  EXPECT_EQ_INT(checkpoint_commit(f.pc, t, &id), PREFIX_CACHE_EINVAL); /* nothing captured */
  REQUIRE(fseq_prefill(&f, &s, a, 40) == 0);
  checkpoint_payload p = fseq_payload(&s);
  p.slab = checkpoint_ticket_slab(f.pc, t);
  REQUIRE(checkpoint_capture(f.pc, t, &p) == 0);
  EXPECT_EQ_INT(checkpoint_capture(f.pc, t, &p), PREFIX_CACHE_EINVAL); /* twice */
  EXPECT_EQ_INT(f.dev.n_slot_copy, 1);
  EXPECT(f.dev.last_slot_dst == 2 && f.dev.last_slot_src == s.slot);
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 0), 1);
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 2), 1);
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 3), 0);
  prefix_cache_match m;
  prefix_cache_lookup(f.pc, NULL, a, 64, &m);
  EXPECT(m.ckpt == 0 && m.inflight == t); /* captured but not committed: not a hit */
  REQUIRE(checkpoint_commit(f.pc, t, &id) == 0);
  EXPECT(id != 0 && id != t);
  prefix_cache_lookup(f.pc, NULL, a, 64, &m);
  EXPECT(m.ckpt == id && m.depth == 40 && m.inflight == 0);
  EXPECT_EQ_INT(checkpoint_commit(f.pc, t, &id), PREFIX_CACHE_ESTALE); /* double commit */
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), PREFIX_CACHE_ESTALE);       /* abort after commit */
  EXPECT(checkpoint_is_live(f.pc, id));
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.captures, 1);
  EXPECT_EQ_INT(st.rejected, 4);
  EXPECT_EQ_INT(st.capture_failures, 0);
  fseq_free(&f, &s);
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 3);
  EXPECT(fx_free(&f));
}

TEST(txn_abort_returns_everything) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  REQUIRE(fseq_prefill(&f, &s, a, 40) == 0);
  uint64_t t, id;
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 40, 0, &t) == 0);
  checkpoint_payload p = fseq_payload(&s);
  REQUIRE(checkpoint_capture(f.pc, t, &p) == 0);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), PREFIX_CACHE_ESTALE);
  EXPECT_EQ_INT(checkpoint_commit(f.pc, t, &id), PREFIX_CACHE_ESTALE); /* commit after abort */
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 2);
  for (int k = 0; k < 3; k++) EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, k), 0);
  prefix_cache_match m;
  prefix_cache_lookup(f.pc, NULL, a, 64, &m);
  EXPECT(m.ckpt == 0 && m.inflight == 0 && m.match_len == 0); /* placeholder gone */
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.capture_failures, 1);
  EXPECT_EQ_INT(st.rejected, 2);
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(txn_move_and_cancel) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 3, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  checkpoint_txn x = {0}, y = {0}, z = {0};
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 16, 0, &x.ticket) == 0);
  x.depth = 16;
  uint64_t tx = x.ticket;
  checkpoint_txn_move(f.pc, &y, &x); /* move: x empty, y owns it */
  EXPECT(x.ticket == 0 && x.depth == 0 && y.ticket == tx && y.depth == 16);
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 2);
  checkpoint_txn_cancel(f.pc, &x); /* destroying the moved-from handle cancels nothing */
  EXPECT_EQ_INT(checkpoint_ticket_depth(f.pc, tx), 16);
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 32, 0, &z.ticket) == 0);
  uint64_t tz = z.ticket;
  checkpoint_txn_move(f.pc, &y, &z); /* move-assign aborts the overwritten one, once */
  EXPECT_EQ_INT(checkpoint_ticket_depth(f.pc, tx), -1);
  EXPECT(y.ticket == tz && z.ticket == 0);
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 2);
  checkpoint_txn_cancel(f.pc, &y);
  checkpoint_txn_cancel(f.pc, &y); /* idempotent */
  EXPECT(y.ticket == 0);
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 3);
  checkpoint_txn_move(f.pc, &y, &y);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.rejected, 0);
  EXPECT_EQ_INT(st.n_pending, 0);
  EXPECT(fx_free(&f));
}

TEST(foreign_events_rejected) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  REQUIRE(fseq_prefill(&f, &s, a, 40) == 0);
  uint64_t t, id;
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 40, 0, &t) == 0);
  checkpoint_payload p = fseq_payload(&s);
  snap before = take(&f);
  uint64_t foreign[] = {0, ((uint64_t)99 << 32) | 64, t + ((uint64_t)1 << 32), t + 1, ~0ull};
  for (int k = 0; k < 5; k++) {
    EXPECT_EQ_INT(checkpoint_capture(f.pc, foreign[k], &p), PREFIX_CACHE_ESTALE);
    EXPECT_EQ_INT(checkpoint_commit(f.pc, foreign[k], &id), PREFIX_CACHE_ESTALE);
    EXPECT_EQ_INT(checkpoint_abort(f.pc, foreign[k]), PREFIX_CACHE_ESTALE);
    checkpoint_plan plan;
    EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, foreign[k], 64, &s.t, s.slot, &plan),
                  PREFIX_CACHE_ESTALE);
  }
  EXPECT(same(before, take(&f)));
  EXPECT_EQ_INT(checkpoint_ticket_depth(f.pc, t), 40); /* the real ticket is untouched */
  REQUIRE(checkpoint_capture(f.pc, t, &p) == 0);
  REQUIRE(checkpoint_commit(f.pc, t, &id) == 0);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.rejected, 15);
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(payload_validated_before_any_write) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  REQUIRE(fseq_prefill(&f, &s, a, 40) == 0);
  uint64_t t;
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 40, 0, &t) == 0);
  int32_t bad_range[3] = {0, 1, 32}, unheld[3] = {0, 1, 9}, dup[3] = {0, 1, 1};
  snap before = take(&f);
  for (int k = 0; k < 9; k++) {
    checkpoint_payload p = fseq_payload(&s);
    switch (k) {
      case 0:
        p.depth = 39;
        break;
      case 1:
        p.depth = 41;
        break;
      case 2:
        p.slab = 3;
        break; /* another slab (the ticket's is 2) */
      case 3:
        p.slot = 2;
        break; /* a slab id, not a sequence slot */
      case 4:
        p.slot = -1;
        break;
      case 5:
        p.pages = bad_range;
        break;
      case 6:
        p.pages = unheld;
        break; /* page 9 is free */
      case 7:
        p.pages = dup;
        break;
      case 8:
        p.n_pages = 2;
        break;
    }
    EXPECT_MSG(checkpoint_capture(f.pc, t, &p) == PREFIX_CACHE_EPAYLOAD, "field %d", k);
    EXPECT_MSG(same(before, take(&f)), "field %d wrote something", k);
  }
  EXPECT_EQ_INT(checkpoint_capture(f.pc, t, NULL), PREFIX_CACHE_EPAYLOAD);
  checkpoint_payload p = fseq_payload(&s);
  EXPECT_EQ_INT(checkpoint_capture(f.pc, t, &p), 0);
  uint64_t id;
  EXPECT_EQ_INT(checkpoint_commit(f.pc, t, &id), 0);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.rejected, 10);
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(failed_replacement_keeps_incumbent) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 3, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t inc = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(inc);
  for (int how = 0; how < 3; how++) {
    fseq s;
    REQUIRE(fseq_init(&f, &s, 64) == 0);
    REQUIRE(fseq_prefill(&f, &s, a, 40) == 0);
    uint64_t t;
    REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 40, CHECKPOINT_REPLACE, &t) == 0);
    checkpoint_payload p = fseq_payload(&s);
    if (how == 0) { /* bad topology */
      p.n_pages = 1;
      EXPECT_EQ_INT(checkpoint_capture(f.pc, t, &p), PREFIX_CACHE_EPAYLOAD);
    } else if (how == 1) { /* the slab copy fails */
      fault_arm(1, "state_pool_copy", 0);
      EXPECT_EQ_INT(checkpoint_capture(f.pc, t, &p), PREFIX_CACHE_ECOPY);
      fault_disarm();
    } else { /* captured, then the step is found bad: abort */
      EXPECT_EQ_INT(checkpoint_capture(f.pc, t, &p), 0);
    }
    EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
    EXPECT(checkpoint_is_live(f.pc, inc));
    prefix_cache_match m;
    prefix_cache_lookup(f.pc, NULL, a, 64, &m);
    EXPECT(m.ckpt == inc && m.depth == 40);
    fseq_free(&f, &s);
    EXPECT(fx_ok(&f));
  }
  fseq s; /* the incumbent still restores bit for bit */
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  REQUIRE(checkpoint_restore(f.pc, inc, 64, &s.t, s.slot, &plan) == 0);
  EXPECT(fseq_matches(&f, &s, a, 40));
  fseq_free(&f, &s);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.capture_failures, 2);
  EXPECT(fx_free(&f));
}

TEST(stale_generation) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64], b[64];
  fk_tokens(a, 64, 0, 64);
  fk_tokens(b, 64, 1, 0);
  uint64_t id1 = fx_capture(&f, NULL, a, 40, 0);
  uint64_t id2 = fx_capture(&f, NULL, a, 40, CHECKPOINT_REPLACE);
  REQUIRE(id1 && id2 && id1 != id2);
  EXPECT(!checkpoint_is_live(f.pc, id1) && checkpoint_is_live(f.pc, id2));
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id1, 64, &s.t, s.slot, &plan), PREFIX_CACHE_ESTALE);
  EXPECT_EQ_INT(s.t.n, 0);
  prefix_cache_clear(f.pc);
  /* a new payload of the same length in a reused record never answers to the old ids */
  uint64_t id3 = fx_capture(&f, NULL, b, 40, 0);
  REQUIRE(id3);
  EXPECT((uint32_t)id3 == (uint32_t)id1 || (uint32_t)id3 == (uint32_t)id2); /* record reused */
  EXPECT(id3 != id1 && id3 != id2);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id1, 64, &s.t, s.slot, &plan), PREFIX_CACHE_ESTALE);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id2, 64, &s.t, s.slot, &plan), PREFIX_CACHE_ESTALE);
  REQUIRE(checkpoint_restore(f.pc, id3, 64, &s.t, s.slot, &plan) == 0);
  EXPECT(fseq_matches(&f, &s, b, 40));
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(restore_plan_cow_and_parity) {
  fx f;
  REQUIRE(fx_init(&f, 32, 3, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t i40 = fx_capture(&f, NULL, a, 40, 0); /* pages 0,1,2 (2 partial) */
  uint64_t i32 = fx_capture(&f, NULL, a, 32, 0); /* pages 3,4 from another sequence */
  REQUIRE(i40 && i32);
  fseq s, cold;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  REQUIRE(checkpoint_restore_begin(f.pc, i40, 64, &s.t, s.slot, &plan) == 0);
  EXPECT_EQ_INT(plan.depth, 40);
  EXPECT_EQ_INT(plan.n_pages, 3);
  EXPECT_EQ_INT(plan.n_shared, 2);
  EXPECT(s.t.n == 3 && s.t.ids[0] == 0 && s.t.ids[1] == 1);
  EXPECT_EQ_INT(plan.cow_src, 2);
  EXPECT_EQ_INT(plan.cow_dst, s.t.ids[2]);
  EXPECT(plan.cow_dst != 2); /* a fresh page: never the source */
  EXPECT(plan.slab >= 3 && plan.host_slab == 0 && plan.host_pages == 0);
  EXPECT_EQ_INT(kv_pages_refcount(f.kp, 0), 1); /* mapped read-only into the sequence */
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 0), 1);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.hits, 0); /* not before the restore is validated */
  int pc0 = f.dev.n_page_copy, sc0 = f.dev.n_slot_copy;
  REQUIRE(checkpoint_restore_run(f.pc, &plan) == 0);
  EXPECT_EQ_INT(f.dev.n_page_copy, pc0 + 1);
  EXPECT(f.dev.last_page_dst == plan.cow_dst && f.dev.last_page_src == 2);
  EXPECT_EQ_INT(f.dev.n_slot_copy, sc0 + 1);
  EXPECT(f.dev.last_slot_dst == s.slot && f.dev.last_slot_src == plan.slab);
  checkpoint_restore_end(f.pc, &plan, 1);
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.hits, 1);
  EXPECT_EQ_INT(st.hit_tokens, 40);
  s.n = 40;
  REQUIRE(fseq_prefill(&f, &s, a, 64) == 0);
  EXPECT(fseq_matches(&f, &s, a, 64));
  REQUIRE(fseq_init(&f, &cold, 64) == 0); /* the same prompt computed cold */
  REQUIRE(fseq_prefill(&f, &cold, a, 64) == 0);
  EXPECT(f.dev.slot[cold.slot] == f.dev.slot[s.slot]);
  EXPECT(f.dev.page[cold.t.ids[3]][15] == f.dev.page[s.t.ids[3]][15]);
  /* the source partial page was not touched by the restored sequence's own rows 40.. */
  EXPECT(f.dev.page[2][7] == f.dev.page[s.t.ids[2]][7]);
  EXPECT(f.dev.page[2][8] != f.dev.page[s.t.ids[2]][8]);
  fseq_free(&f, &cold);
  fseq_free(&f, &s);
  /* page-aligned: no copy-on-write */
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  pc0 = f.dev.n_page_copy;
  REQUIRE(checkpoint_restore(f.pc, i32, 33, &s.t, s.slot, &plan) == 0);
  EXPECT(plan.n_shared == 2 && plan.cow_dst == -1 && plan.cow_src == -1);
  EXPECT(s.t.ids[0] == 3 && s.t.ids[1] == 4);
  EXPECT_EQ_INT(f.dev.n_page_copy, pc0);
  EXPECT(fseq_matches(&f, &s, a, 32));
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(restore_arguments_checked) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t id = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(id);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  snap before = take(&f);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id, 40, &s.t, s.slot, &plan), PREFIX_CACHE_EINVAL);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id, 64, &s.t, 2, &plan), PREFIX_CACHE_EINVAL);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id, 64, NULL, s.slot, &plan), PREFIX_CACHE_EINVAL);
  kv_pages_table small;
  REQUIRE(kv_pages_table_init(&small, 2) == 0);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id, 64, &small, s.slot, &plan), PREFIX_CACHE_EINVAL);
  kv_pages_table_free(&small);
  REQUIRE(fseq_prefill(&f, &s, a, 8) == 0); /* a table that is not empty */
  before = take(&f);
  EXPECT_EQ_INT(checkpoint_restore_begin(f.pc, id, 64, &s.t, s.slot, &plan), PREFIX_CACHE_EINVAL);
  EXPECT(same(before, take(&f)));
  EXPECT(checkpoint_is_live(f.pc, id));
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(failed_restore_drops_entry) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t id = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(id);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  fault_arm(1, "checkpoint_page_copy", 0);
  EXPECT_EQ_INT(checkpoint_restore(f.pc, id, 64, &s.t, s.slot, &plan), PREFIX_CACHE_ECOPY);
  fault_disarm();
  EXPECT_EQ_INT(s.t.n, 0);
  EXPECT(!checkpoint_is_live(f.pc, id));
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.hits, 0);
  EXPECT_EQ_INT(st.restore_failures, 1);
  EXPECT_EQ_INT(kv_pages_num_free(f.kp), 32);
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(replace_while_restoring) {
  fx f;
  REQUIRE(fx_init(&f, 32, 3, 2, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t old = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(old);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  REQUIRE(checkpoint_restore_begin(f.pc, old, 64, &s.t, s.slot, &plan) == 0);
  uint64_t nw = fx_capture(&f, NULL, a, 40, CHECKPOINT_REPLACE);
  REQUIRE(nw);
  EXPECT(!checkpoint_is_live(f.pc, old)); /* replaced: no new restore can start from it */
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 0); /* but its slab lives until the end */
  EXPECT(fx_ok(&f));
  REQUIRE(checkpoint_restore_run(f.pc, &plan) == 0);
  checkpoint_restore_end(f.pc, &plan, 1);
  EXPECT_EQ_INT(state_pool_num_slabs_free(f.sp), 1);
  EXPECT(fseq_matches(&f, &s, a, 40));
  fseq_free(&f, &s);
  prefix_cache_match m;
  prefix_cache_lookup(f.pc, NULL, a, 64, &m);
  EXPECT(m.ckpt == nw);
  EXPECT(fx_free(&f));
}

TEST(many_in_flight) {
  fx f;
  REQUIRE(fx_init(&f, 64, 3, 4, 0, 0) == 0);
  int32_t p[3][64];
  fseq s[3];
  uint64_t t[3], id[3];
  for (int k = 0; k < 3; k++) {
    fk_tokens(p[k], 64, k, 16);
    REQUIRE(fseq_init(&f, &s[k], 64) == 0);
    REQUIRE(checkpoint_reserve(f.pc, NULL, p[k], 64, 24 + 8 * k, 0, &t[k]) == 0);
  }
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.n_pending, 3);
  for (int k = 2; k >= 0; k--) { /* commits in any order */
    REQUIRE(fseq_prefill(&f, &s[k], p[k], 24 + 8 * k) == 0);
    checkpoint_payload pl = fseq_payload(&s[k]);
    REQUIRE(checkpoint_capture(f.pc, t[k], &pl) == 0);
    EXPECT(fx_ok(&f));
  }
  REQUIRE(checkpoint_commit(f.pc, t[1], &id[1]) == 0);
  REQUIRE(checkpoint_commit(f.pc, t[0], &id[0]) == 0);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t[2]), 0);
  for (int k = 0; k < 3; k++) fseq_free(&f, &s[k]);
  prefix_cache_match m;
  prefix_cache_lookup(f.pc, NULL, p[1], 64, &m);
  EXPECT(m.ckpt == id[1] && m.depth == 32);
  prefix_cache_lookup(f.pc, NULL, p[2], 64, &m);
  EXPECT(m.ckpt == 0 && m.match_len == 16);
  EXPECT(fx_free(&f));
}

/* A run through every operation that can fail; it must end cleanly whatever fails. */
static void scenario(fx *f) {
  int32_t a[96], b[96];
  fk_tokens(a, 96, 0, 96);
  fk_tokens(b, 96, 1, 24);
  fseq s;
  if (fseq_init(f, &s, 96) == 0) {
    uint64_t t1 = 0, t2 = 0, id;
    checkpoint_reserve(f->pc, "x", a, 96, 40, CHECKPOINT_PROTECT, &t1);
    checkpoint_reserve(f->pc, "x", a, 96, 72, 0, &t2);
    if (fseq_prefill(f, &s, a, 40) == 0) {
      checkpoint_payload p = fseq_payload(&s);
      if (t1 && (checkpoint_capture(f->pc, t1, &p) != 0 || checkpoint_commit(f->pc, t1, &id) != 0))
        checkpoint_abort(f->pc, t1);
      if (fseq_prefill(f, &s, a, 72) == 0) {
        p = fseq_payload(&s);
        if (t2 && checkpoint_capture(f->pc, t2, &p) == 0) checkpoint_commit(f->pc, t2, &id);
      }
    }
    if (t2 && checkpoint_ticket_depth(f->pc, t2) > 0) checkpoint_abort(f->pc, t2);
    fseq_free(f, &s);
  }
  fx_capture(f, "x", b, 50, 0);
  fx_capture(f, NULL, b, 30, 0);
  fx_capture(f, NULL, a, 30, 0);
  prefix_cache_evict_slabs(f->pc, 1); /* to the host */
  prefix_cache_evict_for_pages(f->pc, 3);
  for (int k = 0; k < 2; k++) {
    const int32_t *toks = k ? b : a;
    prefix_cache_match m;
    prefix_cache_lookup(f->pc, "x", toks, 96, &m);
    if (m.ckpt && fseq_init(f, &s, 96) == 0) {
      checkpoint_plan plan;
      if (checkpoint_restore(f->pc, m.ckpt, 96, &s.t, s.slot, &plan) == 0 &&
          !fseq_matches(f, &s, toks, plan.depth))
        printf("restore parity broken under faults\n"), test_cur_failed = 1;
      fseq_free(f, &s);
    }
  }
  uint64_t r = 0;
  checkpoint_reserve(f->pc, NULL, b, 96, 30, CHECKPOINT_REPLACE, &r);
  if (r) checkpoint_abort(f->pc, r);
}

TEST(fault_injection_every_site) {
  long n;
  int fired_sites = 0;
  for (n = 1; n < 10000; n++) {
    fx f;
    REQUIRE(fx_init(&f, 24, 2, 3, 0, 4 * FK_SLOT_BYTES + 6 * FK_PAGE_BYTES) == 0);
    fault_arm(n, NULL, 0);
    scenario(&f);
    int fired = fault_fired();
    fault_disarm();
    EXPECT_MSG(fx_ok(&f), "fault %ld left a broken state", n);
    EXPECT_MSG(fx_free(&f), "fault %ld leaked", n);
    if (test_cur_failed) return;
    if (!fired) break;
    fired_sites++;
  }
  EXPECT(n < 10000);
  printf("fault walk: %d fault points, each failed cleanly\n", fired_sites);
  EXPECT_MSG(fired_sites > 30, "only %d fault points", fired_sites);
  /* each named site separately, sticky: every later hit fails too */
  const char *sites[] = {"prefix_cache_node",    "prefix_cache_label",    "prefix_cache_kids",
                         "prefix_cache_salt",    "prefix_cache_rec",      "checkpoint_pages",
                         "checkpoint_page_copy", "state_pool_slab_alloc", "state_pool_copy",
                         "kv_pages_alloc",       "host_tier_alloc",       "host_tier_read",
                         "host_tier_write"};
  for (int i = 0; i < (int)(sizeof sites / sizeof *sites); i++) {
    for (long k = 1; k < 200; k++) {
      fx f;
      REQUIRE(fx_init(&f, 24, 2, 3, 0, 4 * FK_SLOT_BYTES + 6 * FK_PAGE_BYTES) == 0);
      fault_arm(k, sites[i], 1);
      scenario(&f);
      int fired = fault_fired();
      fault_disarm();
      EXPECT_MSG(fx_ok(&f) && fx_free(&f), "site %s from hit %ld", sites[i], k);
      if (test_cur_failed) return;
      if (k == 1) EXPECT_MSG(fired, "site %s never reached", sites[i]);
      if (!fired) break;
    }
  }
}

int main(void) {
  RUN(txn_reserve_capture_commit);
  RUN(txn_abort_returns_everything);
  RUN(txn_move_and_cancel);
  RUN(foreign_events_rejected);
  RUN(payload_validated_before_any_write);
  RUN(failed_replacement_keeps_incumbent);
  RUN(stale_generation);
  RUN(restore_plan_cow_and_parity);
  RUN(restore_arguments_checked);
  RUN(failed_restore_drops_entry);
  RUN(replace_while_restoring);
  RUN(many_in_flight);
  RUN(fault_injection_every_site);
  TEST_MAIN_END();
}
