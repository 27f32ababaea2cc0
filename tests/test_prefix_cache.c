/* prefix_cache: the radix tree (insert, lookup, divergence, salts), the lookup rules
 * (deepest <= len - 1, exact prompts never masking, in-flight captures reported), capture
 * points, eviction order (LRU, protected heads last, slab before pages, leaves first, host
 * tier demotion and restore), budgets and statistics. Every test ends with the integrity
 * checks of kv_pages, state_pool and prefix_cache, and a leak check. */
#include "prefix_cache_fake.h"
#include "test.h"

#define LOOK(f, salt, toks, n, m) prefix_cache_lookup((f)->pc, salt, toks, n, m)

TEST(insert_lookup_divergence) {
  fx f;
  REQUIRE(fx_init(&f, 64, 4, 4, 0, 0) == 0);
  int32_t a[64], b[64], c[64];
  fk_tokens(a, 64, 0, 64);
  fk_tokens(b, 64, 1, 20);
  fk_tokens(c, 64, 2, 20);
  prefix_cache_match m;
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.ckpt == 0 && m.depth == 0 && m.match_len == 0);

  uint64_t ida = fx_capture(&f, NULL, a, 32, 0);
  REQUIRE(ida != 0);
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.ckpt == ida);
  EXPECT_EQ_INT(m.depth, 32);
  EXPECT_EQ_INT(m.match_len, 32);
  EXPECT_EQ_INT(m.on_host, 0);
  EXPECT(m.inflight == 0);
  LOOK(&f, NULL, b, 64, &m);
  EXPECT(m.ckpt == 0);
  EXPECT_EQ_INT(m.match_len, 20); /* b leaves a's path after 20 tokens */
  LOOK(&f, NULL, a, 32, &m);      /* the exact prompt: 32 > 31 */
  EXPECT(m.ckpt == 0);
  EXPECT_EQ_INT(m.match_len, 32);
  LOOK(&f, NULL, a, 33, &m);
  EXPECT(m.ckpt == ida && m.depth == 32);

  uint64_t idb = fx_capture(&f, NULL, b, 40, 0); /* splits the edge at 20 */
  REQUIRE(idb != 0);
  EXPECT(fx_ok(&f));
  LOOK(&f, NULL, b, 64, &m);
  EXPECT(m.ckpt == idb && m.depth == 40 && m.match_len == 40);
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.ckpt == ida && m.depth == 32);
  LOOK(&f, NULL, b, 30, &m);
  EXPECT(m.ckpt == 0 && m.match_len == 30);
  LOOK(&f, NULL, c, 64, &m);
  EXPECT(m.ckpt == 0 && m.match_len == 20);

  uint64_t id20 = fx_capture(&f, NULL, c, 20, 0); /* a checkpoint at the divergence point */
  REQUIRE(id20 != 0);
  LOOK(&f, NULL, c, 64, &m);
  EXPECT(m.ckpt == id20 && m.depth == 20 && m.match_len == 20);
  LOOK(&f, NULL, b, 64, &m);
  EXPECT(m.ckpt == idb && m.depth == 40);
  LOOK(&f, NULL, b, 25, &m);
  EXPECT(m.ckpt == id20 && m.depth == 20);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.queries, 12);
  EXPECT_EQ_INT(st.hits, 0); /* lookups never count hits */
  EXPECT_EQ_INT(st.n_checkpoints, 3);
  EXPECT_EQ_INT(st.captures, 3);
  EXPECT(fx_free(&f));
}

TEST(salt_isolation) {
  fx f;
  REQUIRE(fx_init(&f, 64, 4, 4, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t ids = fx_capture(&f, "tenant-a", a, 32, 0);
  REQUIRE(ids != 0);
  prefix_cache_match m;
  const char *others[] = {NULL, "", "tenant-b", "tenant-A", "tenant-a ", "tenant-"};
  for (int i = 0; i < 6; i++) {
    LOOK(&f, others[i], a, 64, &m);
    EXPECT_MSG(m.ckpt == 0 && m.match_len == 0, "salt %d sees another salt's entry", i);
  }
  LOOK(&f, "tenant-a", a, 64, &m);
  EXPECT(m.ckpt == ids && m.depth == 32);
  /* the same tokens in the shared namespace are a different checkpoint */
  uint64_t idsh = fx_capture(&f, NULL, a, 32, 0);
  REQUIRE(idsh != 0);
  EXPECT(idsh != ids);
  LOOK(&f, "", a, 64, &m);
  EXPECT(m.ckpt == idsh);
  LOOK(&f, "tenant-a", a, 64, &m);
  EXPECT(m.ckpt == ids);
  uint64_t t;
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, "tenant-b", a, 64, 32, 0, &t), 0);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
  EXPECT(fx_ok(&f)); /* tenant-b's empty root is gone */
  prefix_cache_clear(f.pc);
  EXPECT(!checkpoint_is_live(f.pc, ids) && !checkpoint_is_live(f.pc, idsh));
  EXPECT_EQ_INT(kv_pages_num_free(f.kp), 64);
  EXPECT(fx_free(&f));
}

TEST(deepest_and_exact_prompt) {
  fx f;
  REQUIRE(fx_init(&f, 64, 4, 4, 0, 0) == 0);
  int32_t p[11];
  fk_tokens(p, 11, 0, 11);
  uint64_t i8 = fx_capture(&f, NULL, p, 8, 0), i10 = fx_capture(&f, NULL, p, 10, 0);
  REQUIRE(i8 && i10);
  prefix_cache_match m;
  LOOK(&f, NULL, p, 10, &m); /* the entry of the exact prompt does not mask 8 */
  EXPECT(m.ckpt == i8 && m.depth == 8);
  EXPECT_EQ_INT(m.match_len, 10);
  LOOK(&f, NULL, p, 11, &m);
  EXPECT(m.ckpt == i10 && m.depth == 10);
  LOOK(&f, NULL, p, 9, &m);
  EXPECT(m.ckpt == i8);
  LOOK(&f, NULL, p, 8, &m);
  EXPECT(m.ckpt == 0 && m.depth == 0);
  LOOK(&f, NULL, p, 1, &m);
  EXPECT(m.ckpt == 0);
  LOOK(&f, NULL, p, 0, &m);
  EXPECT(m.ckpt == 0 && m.match_len == 0);
  EXPECT(fx_free(&f));
}

TEST(inflight_reported) {
  fx f;
  REQUIRE(fx_init(&f, 64, 4, 4, 0, 0) == 0);
  int32_t a[64];
  fk_tokens(a, 64, 0, 64);
  uint64_t ida = fx_capture(&f, NULL, a, 32, 0);
  REQUIRE(ida);
  uint64_t t48, t, t32;
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 48, 0, &t48) == 0);
  prefix_cache_match m;
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.ckpt == ida && m.depth == 32); /* a placeholder is not a hit */
  EXPECT(m.inflight == t48 && m.inflight_depth == 48);
  EXPECT_EQ_INT(m.match_len, 48);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, a, 64, 48, 0, &t), PREFIX_CACHE_INFLIGHT);
  EXPECT(t == t48); /* coalesce: wait for that one */
  LOOK(&f, NULL, a, 48, &m);
  EXPECT(m.ckpt == ida && m.inflight == 0);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, a, 64, 32, 0, &t), PREFIX_CACHE_EXISTS);
  EXPECT(t == 0);
  REQUIRE(checkpoint_reserve(f.pc, NULL, a, 64, 32, CHECKPOINT_REPLACE, &t32) == 0);
  LOOK(&f, NULL, a, 40, &m);
  EXPECT(m.ckpt == ida && m.inflight == 0); /* the pending replacement is not deeper */
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.inflight == t48);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, a, 64, 0, 0, &t), PREFIX_CACHE_EINVAL);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, a, 64, 65, 0, &t), PREFIX_CACHE_EINVAL);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.n_pending, 2);
  EXPECT_EQ_INT(st.device_slabs, 3);
  EXPECT(fx_ok(&f));
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t48), 0);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t32), 0);
  LOOK(&f, NULL, a, 64, &m);
  EXPECT(m.ckpt == ida && m.inflight == 0 && m.match_len == 32);
  EXPECT(fx_free(&f));
}

TEST(capture_points) {
  prefix_cache_point pt[16];
  int32_t b[] = {0, 812, 1400, 3000};
  int n = prefix_cache_capture_points(5000, b, 4, 2048, 1391, 0, pt, 16);
  int want_d[] = {812, 1391, 2048, 3000, 4096, 4999};
  int want_f[] = {PREFIX_CACHE_POINT_HEAD | PREFIX_CACHE_POINT_PROTECT,
                  PREFIX_CACHE_POINT_DIVERGE,
                  PREFIX_CACHE_POINT_INTERVAL,
                  PREFIX_CACHE_POINT_LAST_TURN,
                  PREFIX_CACHE_POINT_INTERVAL,
                  PREFIX_CACHE_POINT_END};
  REQUIRE(n == 6);
  for (int i = 0; i < 6; i++) {
    EXPECT_EQ_INT(pt[i].depth, want_d[i]);
    EXPECT_EQ_INT(pt[i].flags, want_f[i]);
  }
  EXPECT(prefix_cache_capture_points_max(5000, 4, 2048) >= 6);
  n = prefix_cache_capture_points(5000, b, 4, 2048, 1391, 1400, pt, 16); /* restored 1400 */
  REQUIRE(n == 4);
  EXPECT(pt[0].depth == 2048 && pt[1].depth == 3000 && pt[2].depth == 4096 && pt[3].depth == 4999);
  n = prefix_cache_capture_points(5000, b, 4, 2048, 1391, 0, pt, 2); /* cap: shallowest kept */
  REQUIRE(n == 2);
  EXPECT(pt[0].depth == 812 && pt[1].depth == 1391);
  n = prefix_cache_capture_points(300, NULL, 0, 100, 0, 0, pt, 16); /* interval -> 112 */
  REQUIRE(n == 3);
  EXPECT(pt[0].depth == 112 && pt[1].depth == 224 && pt[2].depth == 299);
  n = prefix_cache_capture_points(4097, NULL, 0, 0, 0, 0, pt, 16); /* default 2048 */
  REQUIRE(n == 2);
  EXPECT(pt[0].depth == 2048 && pt[1].depth == 4096);
  EXPECT_EQ_INT(pt[1].flags, PREFIX_CACHE_POINT_INTERVAL | PREFIX_CACHE_POINT_END);
  int32_t one[] = {0};
  n = prefix_cache_capture_points(50, one, 1, 2048, 50, 0, pt, 16); /* divergence = n: none */
  REQUIRE(n == 1);
  EXPECT(pt[0].depth == 49 && pt[0].flags == PREFIX_CACHE_POINT_END);
  EXPECT_EQ_INT(prefix_cache_capture_points(1, one, 1, 2048, 0, 0, pt, 16), 0);
  EXPECT_EQ_INT(prefix_cache_capture_points(50, one, 1, 2048, 0, 49, pt, 16), 0);
}

/* Restores ckpt into a throw-away sequence (promoting it to MRU). */
static int fx_restore_once(fx *f, uint64_t ckpt, const int32_t *toks, int n_prompt) {
  fseq s;
  if (fseq_init(f, &s, n_prompt + 16)) return -1;
  checkpoint_plan plan;
  int rc = checkpoint_restore(f->pc, ckpt, n_prompt, &s.t, s.slot, &plan);
  if (rc == 0 && !fseq_matches(f, &s, toks, plan.depth)) rc = -99;
  fseq_free(f, &s);
  return rc;
}

TEST(eviction_lru_slabs) {
  fx f;
  REQUIRE(fx_init(&f, 64, 2, 3, 0, 0) == 0);
  int32_t p[4][48];
  uint64_t id[3];
  for (int k = 0; k < 4; k++) fk_tokens(p[k], 48, k + 1, 0);
  for (int k = 0; k < 3; k++) REQUIRE((id[k] = fx_capture(&f, NULL, p[k], 32, 0)) != 0);
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 6);
  EXPECT_EQ_INT(fx_restore_once(&f, id[0], p[0], 48), 0); /* id0 becomes MRU */
  uint64_t t;
  REQUIRE(checkpoint_reserve(f.pc, NULL, p[3], 48, 32, 0, &t) == 0);
  EXPECT(checkpoint_is_live(f.pc, id[0]));
  EXPECT(!checkpoint_is_live(f.pc, id[1])); /* the least recently used */
  EXPECT(checkpoint_is_live(f.pc, id[2]));
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 4); /* no host tier: its pages went too */
  EXPECT_EQ_INT(prefix_cache_evict_slabs(f.pc, 1), 1);
  EXPECT(!checkpoint_is_live(f.pc, id[2]) && checkpoint_is_live(f.pc, id[0]));
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.evictions, 2);
  EXPECT_EQ_INT(st.hits, 1);
  EXPECT_EQ_INT(st.hit_tokens, 32);
  EXPECT_EQ_INT(st.device_slabs, 2);
  EXPECT(fx_ok(&f));
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
  EXPECT(fx_free(&f));
}

TEST(protected_heads_last) {
  fx f;
  REQUIRE(fx_init(&f, 64, 2, 3, 0, 0) == 0);
  int32_t p[7][48];
  for (int k = 0; k < 7; k++) fk_tokens(p[k], 48, k + 1, 0);
  uint64_t i0 = fx_capture(&f, NULL, p[0], 32, CHECKPOINT_PROTECT);
  uint64_t i1 = fx_capture(&f, NULL, p[1], 32, 0), i2 = fx_capture(&f, NULL, p[2], 32, 0);
  REQUIRE(i0 && i1 && i2);
  uint64_t t[4];
  REQUIRE(checkpoint_reserve(f.pc, NULL, p[3], 48, 32, 0, &t[0]) == 0);
  EXPECT(checkpoint_is_live(f.pc, i0) && !checkpoint_is_live(f.pc, i1));
  REQUIRE(checkpoint_reserve(f.pc, NULL, p[4], 48, 32, 0, &t[1]) == 0);
  EXPECT(checkpoint_is_live(f.pc, i0) && !checkpoint_is_live(f.pc, i2));
  REQUIRE(checkpoint_reserve(f.pc, NULL, p[5], 48, 32, 0, &t[2]) == 0);
  EXPECT(!checkpoint_is_live(f.pc, i0)); /* the head goes only when nothing else can */
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, p[6], 48, 32, 0, &t[3]), PREFIX_CACHE_ENOSPACE);
  EXPECT(fx_ok(&f));
  for (int k = 0; k < 3; k++) EXPECT_EQ_INT(checkpoint_abort(f.pc, t[k]), 0);
  EXPECT(fx_free(&f));
}

/* The classes of prefix_cache.h's example, 4 slabs: NORMAL a, b; LOW x, y (x older). A LOW
 * reserve evicts x (not a, the least recently used overall); a NORMAL reserve evicts y (the
 * last LOW one), then a (LRU of NORMAL); with every slab NORMAL a LOW reserve fails and
 * evicts nothing; a LOW checkpoint restored once becomes NORMAL; a NORMAL reserve at the
 * depth of a LOW checkpoint raises it (EXISTS). */
TEST(low_class_evicted_first_and_only_by_itself) {
  fx f;
  REQUIRE(fx_init(&f, 128, 2, 4, 0, 0) == 0);
  int32_t p[10][48];
  for (int k = 0; k < 10; k++) fk_tokens(p[k], 48, k + 1, 0);
  uint64_t a = fx_capture(&f, NULL, p[0], 32, 0), b = fx_capture(&f, NULL, p[1], 32, 0);
  uint64_t x = fx_capture(&f, NULL, p[2], 32, CHECKPOINT_LOW);
  uint64_t y = fx_capture(&f, NULL, p[3], 32, CHECKPOINT_LOW);
  REQUIRE(a && b && x && y);
  uint64_t z = fx_capture(&f, NULL, p[4], 32, CHECKPOINT_LOW); /* evicts x, not a */
  REQUIRE(z);
  EXPECT(!checkpoint_is_live(f.pc, x));
  EXPECT(checkpoint_is_live(f.pc, a) && checkpoint_is_live(f.pc, b) && checkpoint_is_live(f.pc, y));
  uint64_t c = fx_capture(&f, NULL, p[5], 32, 0); /* evicts y (the older LOW one) */
  REQUIRE(c);
  EXPECT(!checkpoint_is_live(f.pc, y) && checkpoint_is_live(f.pc, z) &&
         checkpoint_is_live(f.pc, a));
  uint64_t d = fx_capture(&f, NULL, p[6], 32, 0); /* evicts z, the last LOW one */
  REQUIRE(d);
  EXPECT(!checkpoint_is_live(f.pc, z) && checkpoint_is_live(f.pc, a));
  /* a, b, c, d all NORMAL: a LOW reserve fails and evicts nothing */
  uint64_t t;
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, p[7], 48, 32, CHECKPOINT_LOW, &t),
                PREFIX_CACHE_ENOSPACE);
  EXPECT(checkpoint_is_live(f.pc, a) && checkpoint_is_live(f.pc, b) &&
         checkpoint_is_live(f.pc, c) && checkpoint_is_live(f.pc, d));
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.evictions, 3);
  EXPECT_EQ_INT(st.n_checkpoints, 4);
  uint64_t e = fx_capture(&f, NULL, p[7], 32, 0); /* NORMAL: evicts a, the NORMAL LRU */
  REQUIRE(e);
  EXPECT(!checkpoint_is_live(f.pc, a) && checkpoint_is_live(f.pc, b));
  EXPECT(fx_ok(&f));
  EXPECT(fx_free(&f));

  /* promotion: a restored LOW checkpoint, and one a NORMAL reserve finds at its depth */
  REQUIRE(fx_init(&f, 128, 2, 2, 0, 0) == 0);
  uint64_t l1 = fx_capture(&f, NULL, p[0], 32, CHECKPOINT_LOW);
  uint64_t l2 = fx_capture(&f, NULL, p[1], 32, CHECKPOINT_LOW);
  REQUIRE(l1 && l2);
  EXPECT_EQ_INT(fx_restore_once(&f, l1, p[0], 48), 0);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, p[1], 48, 32, 0, &t), PREFIX_CACHE_EXISTS);
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, p[2], 48, 32, CHECKPOINT_LOW, &t),
                PREFIX_CACHE_ENOSPACE); /* both are NORMAL now */
  EXPECT(checkpoint_is_live(f.pc, l1) && checkpoint_is_live(f.pc, l2));
  EXPECT(fx_ok(&f));
  EXPECT(fx_free(&f));
}

TEST(slab_demoted_to_host_first) {
  fx f;
  REQUIRE(fx_init(&f, 64, 2, 2, 0, 1 << 20) == 0);
  int32_t p[3][48];
  for (int k = 0; k < 3; k++) fk_tokens(p[k], 48, k + 1, 0);
  uint64_t i0 = fx_capture(&f, NULL, p[0], 40, 0), i1 = fx_capture(&f, NULL, p[1], 40, 0);
  REQUIRE(i0 && i1);
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 6);
  uint64_t t;
  REQUIRE(checkpoint_reserve(f.pc, NULL, p[2], 48, 40, 0, &t) == 0);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.demotions, 1);
  EXPECT_EQ_INT(st.evictions, 0);
  EXPECT_EQ_INT(st.host_bytes, FK_SLOT_BYTES);
  EXPECT_EQ_INT(st.n_host, 1);
  EXPECT_EQ_INT(f.dev.n_slot_read, 1);
  EXPECT(checkpoint_is_live(f.pc, i0));
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 6); /* its pages stay on the device */
  prefix_cache_match m;
  LOOK(&f, NULL, p[0], 48, &m);
  EXPECT(m.ckpt == i0 && m.depth == 40 && m.on_host == 1);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
  /* restore: shared pages 0..1, the partial page copied, the state written from the host */
  fseq s;
  REQUIRE(fseq_init(&f, &s, 64) == 0);
  checkpoint_plan plan;
  int copies = f.dev.n_page_copy;
  REQUIRE(checkpoint_restore(f.pc, i0, 48, &s.t, s.slot, &plan) == 0);
  EXPECT(plan.host_slab == 1 && plan.slab == -1 && plan.host_pages == 0);
  EXPECT(plan.n_shared == 2 && plan.n_pages == 3 && plan.cow_src >= 0 && plan.cow_dst >= 0);
  EXPECT_EQ_INT(f.dev.n_slot_write, 1);
  EXPECT_EQ_INT(f.dev.n_page_copy, copies + 1);
  EXPECT(fseq_matches(&f, &s, p[0], 40));
  s.n = plan.depth;
  REQUIRE(fseq_prefill(&f, &s, p[0], 48) == 0);
  EXPECT(fseq_matches(&f, &s, p[0], 48));
  fseq_free(&f, &s);
  EXPECT(fx_free(&f));
}

TEST(pages_of_leaves_first) {
  fx f;
  REQUIRE(fx_init(&f, 16, 2, 4, 0, 0) == 0);
  int32_t r[48], q[80];
  fk_tokens(r, 48, 1, 0);
  fk_tokens(q, 80, 2, 0);
  uint64_t ir = fx_capture(&f, NULL, r, 32, 0); /* pages 0,1; oldest */
  REQUIRE(ir);
  fseq s; /* one sequence captures P at 32 and Q at 64 on the same path */
  REQUIRE(fseq_init(&f, &s, 80) == 0);
  uint64_t tp, tq, ip, iq;
  REQUIRE(checkpoint_reserve(f.pc, NULL, q, 80, 32, 0, &tp) == 0);
  REQUIRE(checkpoint_reserve(f.pc, NULL, q, 80, 64, 0, &tq) == 0);
  REQUIRE(fseq_prefill(&f, &s, q, 32) == 0);
  checkpoint_payload pl = fseq_payload(&s);
  REQUIRE(checkpoint_capture(f.pc, tp, &pl) == 0);
  REQUIRE(checkpoint_commit(f.pc, tp, &ip) == 0);
  REQUIRE(fseq_prefill(&f, &s, q, 64) == 0);
  /* while the sequence runs, nothing the cache holds can be freed but R's pages */
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 0), 0);
  pl = fseq_payload(&s);
  REQUIRE(checkpoint_capture(f.pc, tq, &pl) == 0);
  REQUIRE(checkpoint_commit(f.pc, tq, &iq) == 0);
  EXPECT(s.t.ids[0] == 2 && s.t.ids[3] == 5);
  fseq_free(&f, &s);
  EXPECT_EQ_INT(kv_pages_num_cached(f.kp), 6);
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 2), 2); /* P and Q */
  /* leaves first (R, then Q: LRU among leaves), P only once it is a leaf */
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 2);
  EXPECT(!checkpoint_is_live(f.pc, ir) && checkpoint_is_live(f.pc, iq));
  EXPECT_EQ_INT(kv_pages_refcount(f.kp, 0) + kv_pages_cache_refcount(f.kp, 0), 0);
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 2);
  EXPECT(!checkpoint_is_live(f.pc, iq) && checkpoint_is_live(f.pc, ip));
  EXPECT_EQ_INT(kv_pages_cache_refcount(f.kp, 2), 1);
  EXPECT(fx_ok(&f));
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 3), 2);
  EXPECT(!checkpoint_is_live(f.pc, ip));
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 0);
  EXPECT_EQ_INT(kv_pages_num_free(f.kp), 16);
  EXPECT(fx_free(&f));
}

TEST(protected_pages_last) {
  fx f;
  REQUIRE(fx_init(&f, 16, 2, 4, 0, 0) == 0);
  int32_t a[48], b[48];
  fk_tokens(a, 48, 1, 0);
  fk_tokens(b, 48, 2, 0);
  uint64_t ia = fx_capture(&f, NULL, a, 32, CHECKPOINT_PROTECT),
           ib = fx_capture(&f, NULL, b, 32, 0);
  REQUIRE(ia && ib);
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 2);
  EXPECT(checkpoint_is_live(f.pc, ia) && !checkpoint_is_live(f.pc, ib));
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 2);
  EXPECT(!checkpoint_is_live(f.pc, ia));
  EXPECT(fx_free(&f));
}

TEST(pinned_and_inflight_never_evicted) {
  fx f;
  REQUIRE(fx_init(&f, 32, 2, 2, 0, 0) == 0);
  int32_t a[48], b[48];
  fk_tokens(a, 48, 1, 0);
  fk_tokens(b, 48, 2, 0);
  uint64_t ia = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(ia);
  fseq s;
  REQUIRE(fseq_init(&f, &s, 48) == 0);
  checkpoint_plan plan;
  REQUIRE(checkpoint_restore_begin(f.pc, ia, 48, &s.t, s.slot, &plan) == 0);
  EXPECT_EQ_INT(prefix_cache_evict_slabs(f.pc, 1), 0); /* pinned by the restore */
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 8), 0);
  uint64_t t;
  REQUIRE(checkpoint_reserve(f.pc, NULL, b, 48, 32, 0, &t) == 0); /* the free slab */
  uint64_t t2;
  EXPECT_EQ_INT(checkpoint_reserve(f.pc, NULL, b, 48, 40, 0, &t2), PREFIX_CACHE_ENOSPACE);
  REQUIRE(checkpoint_restore_run(f.pc, &plan) == 0);
  checkpoint_restore_end(f.pc, &plan, 1);
  EXPECT(fseq_matches(&f, &s, a, 40));
  fseq_free(&f, &s);
  EXPECT_EQ_INT(prefix_cache_evict_slabs(f.pc, 2), 1); /* the ticket stays */
  EXPECT(!checkpoint_is_live(f.pc, ia));
  EXPECT_EQ_INT(checkpoint_ticket_depth(f.pc, t), 32);
  EXPECT_EQ_INT(checkpoint_abort(f.pc, t), 0);
  EXPECT(fx_free(&f));
}

TEST(host_pages_demotion_and_restore) {
  fx f;
  REQUIRE(fx_init(&f, 12, 2, 4, 0, 1 << 20) == 0);
  int32_t a[48];
  fk_tokens(a, 48, 1, 0);
  uint64_t ia = fx_capture(&f, NULL, a, 40, 0);
  REQUIRE(ia);
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 3), 3);
  EXPECT(checkpoint_is_live(f.pc, ia));
  EXPECT_EQ_INT(f.dev.n_page_read, 3);
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.demotions, 1);
  EXPECT_EQ_INT(st.host_bytes, 3 * FK_PAGE_BYTES);
  EXPECT_EQ_INT(st.device_pages, 0);
  EXPECT_EQ_INT(st.device_slabs, 1);
  prefix_cache_match m;
  LOOK(&f, NULL, a, 48, &m);
  EXPECT(m.ckpt == ia && m.on_host == 1);
  for (int round = 0; round < 2; round++) {
    fseq s;
    REQUIRE(fseq_init(&f, &s, 48) == 0);
    /* scribble the fresh pages so only the host copy can make them right */
    for (int p = 0; p < 12; p++) f.dev.page[p][0] = 0xdead;
    checkpoint_plan plan;
    int w = f.dev.n_page_write;
    REQUIRE(checkpoint_restore(f.pc, ia, 48, &s.t, s.slot, &plan) == 0);
    EXPECT(plan.host_pages == 1 && plan.n_shared == 0 && plan.cow_dst == -1);
    EXPECT_EQ_INT(plan.host_slab, round);
    EXPECT_EQ_INT(f.dev.n_page_write, w + 3);
    EXPECT(fseq_matches(&f, &s, a, 40));
    s.n = plan.depth;
    REQUIRE(fseq_prefill(&f, &s, a, 48) == 0);
    EXPECT(fseq_matches(&f, &s, a, 48));
    fseq_free(&f, &s);
    if (round == 0) EXPECT_EQ_INT(prefix_cache_evict_slabs(f.pc, 1), 1); /* both on host */
  }
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.hits, 2);
  EXPECT_EQ_INT(st.device_slabs, 0);
  EXPECT_EQ_INT(st.host_bytes, 3 * FK_PAGE_BYTES + FK_SLOT_BYTES);
  EXPECT(fx_free(&f));
}

TEST(host_budget_lru) {
  fx f;
  REQUIRE(fx_init(&f, 64, 2, 1, 0, 2 * FK_SLOT_BYTES) == 0);
  int32_t p[4][48];
  uint64_t id[4];
  for (int k = 0; k < 4; k++) fk_tokens(p[k], 48, k + 1, 0);
  for (int k = 0; k < 4; k++) {
    REQUIRE((id[k] = fx_capture(&f, NULL, p[k], 32, 0)) != 0);
    EXPECT(fx_ok(&f));
  }
  /* one device slab: 0, 1, 2 went to the host in turn; 0 (LRU) left when 2 came */
  EXPECT(!checkpoint_is_live(f.pc, id[0]));
  EXPECT(checkpoint_is_live(f.pc, id[1]) && checkpoint_is_live(f.pc, id[2]) &&
         checkpoint_is_live(f.pc, id[3]));
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT_EQ_INT(st.host_bytes, 2 * FK_SLOT_BYTES);
  EXPECT_EQ_INT(st.demotions, 3);
  EXPECT_EQ_INT(st.evictions, 1);
  /* pages do not fit the host budget: page pressure drops the checkpoint instead */
  EXPECT_EQ_INT(prefix_cache_evict_for_pages(f.pc, 1), 2);
  EXPECT(!checkpoint_is_live(f.pc, id[1])); /* the LRU leaf */
  EXPECT_EQ_INT(fx_restore_once(&f, id[2], p[2], 40), 0);
  EXPECT(fx_free(&f));
}

TEST(budgets_never_exceeded) {
  fx f;
  size_t host = 3 * FK_SLOT_BYTES + 5 * FK_PAGE_BYTES;
  REQUIRE(fx_init(&f, 40, 2, 4, 2, host) == 0);
  uint32_t rng = 12345;
  int32_t toks[96];
  uint64_t ids[64];
  int n_ids = 0;
  for (int it = 0; it < 200; it++) {
    rng = rng * 1103515245u + 12345u;
    int k = (int)(rng >> 16) % 6, depth = 8 + (int)((rng >> 8) % 60);
    fk_tokens(toks, 96, k, (int)(rng >> 20) % 40);
    int op = (int)(rng >> 4) % 4;
    if (op < 2) {
      uint64_t id =
          fx_capture(&f, k % 2 ? "s" : NULL, toks, depth, k == 0 ? CHECKPOINT_PROTECT : 0);
      if (id && n_ids < 64) ids[n_ids++] = id;
    } else if (op == 2 && n_ids > 0) {
      uint64_t id = ids[(rng >> 3) % (unsigned)n_ids];
      fseq s;
      if (fseq_init(&f, &s, 96) == 0) {
        checkpoint_plan plan;
        checkpoint_restore(f.pc, id, 96, &s.t, s.slot, &plan);
        fseq_free(&f, &s);
      }
    } else {
      prefix_cache_evict_for_pages(f.pc, 1 + (int)(rng % 5));
    }
    prefix_cache_stats st;
    prefix_cache_get_stats(f.pc, &st);
    REQUIRE(st.device_slabs <= 2 && st.device_slabs_max == 2);
    REQUIRE(st.host_bytes <= host);
    REQUIRE(fx_ok(&f));
  }
  prefix_cache_stats st;
  prefix_cache_get_stats(f.pc, &st);
  EXPECT(st.captures > 0 && st.demotions > 0 && st.evictions > 0 && st.hits > 0);
  EXPECT(fx_free(&f));
}

int main(void) {
  RUN(insert_lookup_divergence);
  RUN(salt_isolation);
  RUN(deepest_and_exact_prompt);
  RUN(inflight_reported);
  RUN(capture_points);
  RUN(eviction_lru_slabs);
  RUN(protected_heads_last);
  RUN(low_class_evicted_first_and_only_by_itself);
  RUN(slab_demoted_to_host_first);
  RUN(pages_of_leaves_first);
  RUN(protected_pages_last);
  RUN(pinned_and_inflight_never_evicted);
  RUN(host_pages_demotion_and_restore);
  RUN(host_budget_lru);
  RUN(budgets_never_exceeded);
  TEST_MAIN_END();
}
