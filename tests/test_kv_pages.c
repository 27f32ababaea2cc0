/* kv_pages: exact page ids, refcounts, all-or-nothing allocation, the cached state used by the
 * prefix cache, page tables, and the integrity check. */
#include "cache/kv_pages.h"

#include "base/fault.h"
#include "test.h"

static int ok(const kv_pages *kp) {
  char err[200];
  int rc = kv_pages_check(kp, err, sizeof err);
  if (rc) printf("check: %s\n", err);
  return rc == 0;
}

TEST(alloc_ids_fifo) {
  kv_pages *kp;
  REQUIRE(kv_pages_init(&kp, 8) == 0);
  EXPECT_EQ_INT(kv_pages_total(kp), 8);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 8);
  int32_t a[3], b[2];
  REQUIRE(kv_pages_alloc(kp, 3, a) == 0);
  EXPECT(a[0] == 0 && a[1] == 1 && a[2] == 2);
  REQUIRE(kv_pages_alloc(kp, 2, b) == 0);
  EXPECT(b[0] == 3 && b[1] == 4);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 3);
  EXPECT_EQ_INT(kv_pages_num_used(kp), 5);
  EXPECT_EQ_INT(kv_pages_refcount(kp, 1), 1);
  /* freed pages go to the tail: 5,6,7 come first, then 1 */
  kv_pages_unref(kp, 1);
  EXPECT_EQ_INT(kv_pages_refcount(kp, 1), 0);
  int32_t c[4];
  REQUIRE(kv_pages_alloc(kp, 4, c) == 0);
  EXPECT(c[0] == 5 && c[1] == 6 && c[2] == 7 && c[3] == 1);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 0);
  EXPECT(ok(kp));
  kv_pages_free(kp);
}

TEST(all_or_nothing) {
  kv_pages *kp;
  REQUIRE(kv_pages_init(&kp, 4) == 0);
  int32_t a[5] = {-7, -7, -7, -7, -7};
  EXPECT(!kv_pages_can_alloc(kp, 5));
  EXPECT(kv_pages_alloc(kp, 5, a) == -1);
  EXPECT_EQ_INT(a[0], -7);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 4);
  EXPECT(kv_pages_can_alloc(kp, 4));
  /* an injected fault changes nothing */
  fault_arm(1, "kv_pages_alloc", 0);
  EXPECT(kv_pages_alloc(kp, 2, a) == -1);
  fault_disarm();
  EXPECT_EQ_INT(kv_pages_num_free(kp), 4);
  EXPECT(kv_pages_alloc(kp, 4, a) == 0);
  EXPECT(a[0] == 0 && a[3] == 3);
  EXPECT(ok(kp));
  for (int i = 0; i < 4; i++) kv_pages_unref(kp, a[i]);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 4);
  EXPECT(ok(kp));
  kv_pages_free(kp);
}

TEST(shared_and_cached) {
  kv_pages *kp;
  REQUIRE(kv_pages_init(&kp, 4) == 0);
  int32_t a[2];
  REQUIRE(kv_pages_alloc(kp, 2, a) == 0);
  /* the prefix cache takes page 0; a second sequence maps it too */
  kv_pages_cache_ref(kp, a[0]);
  kv_pages_ref(kp, a[0]);
  EXPECT_EQ_INT(kv_pages_refcount(kp, 0), 2);
  EXPECT_EQ_INT(kv_pages_cache_refcount(kp, 0), 1);
  EXPECT_EQ_INT(kv_pages_num_cache_held(kp), 1);
  kv_pages_cache_ref(kp, a[0]); /* a second reference holds no second page */
  EXPECT_EQ_INT(kv_pages_num_cache_held(kp), 1);
  kv_pages_cache_unref(kp, a[0]);
  EXPECT_EQ_INT(kv_pages_num_cache_held(kp), 1);
  EXPECT_EQ_INT(kv_pages_num_used(kp), 2);
  EXPECT_EQ_INT(kv_pages_num_cached(kp), 0);
  kv_pages_unref(kp, a[0]);
  kv_pages_unref(kp, a[0]);
  kv_pages_unref(kp, a[1]);
  /* page 0 is now held by the cache only: cached, not free */
  EXPECT_EQ_INT(kv_pages_num_cached(kp), 1);
  EXPECT_EQ_INT(kv_pages_num_used(kp), 0);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 3);
  EXPECT(ok(kp));
  /* a hit maps it back into a sequence: in use again */
  kv_pages_ref(kp, 0);
  EXPECT_EQ_INT(kv_pages_num_cached(kp), 0);
  EXPECT_EQ_INT(kv_pages_num_used(kp), 1);
  kv_pages_unref(kp, 0);
  EXPECT(ok(kp));
  /* eviction: the cache drops it and it is free (at the tail) */
  kv_pages_cache_unref(kp, 0);
  EXPECT_EQ_INT(kv_pages_num_cache_held(kp), 0);
  EXPECT_EQ_INT(kv_pages_num_cached(kp), 0);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 4);
  int32_t b[4];
  REQUIRE(kv_pages_alloc(kp, 4, b) == 0);
  EXPECT(b[0] == 2 && b[1] == 3 && b[2] == 1 && b[3] == 0);
  EXPECT(ok(kp));
  kv_pages_free(kp);
}

TEST(tables) {
  kv_pages *kp;
  REQUIRE(kv_pages_init(&kp, 6) == 0);
  kv_pages_table t, u;
  REQUIRE(kv_pages_table_init(&t, 4) == 0);
  REQUIRE(kv_pages_table_init(&u, 4) == 0);
  EXPECT_EQ_INT(kv_pages_for_tokens(0), 0);
  EXPECT_EQ_INT(kv_pages_for_tokens(16), 1);
  EXPECT_EQ_INT(kv_pages_for_tokens(17), 2);
  EXPECT_EQ_INT(kv_pages_table_need(&t, 33), 3);
  REQUIRE(kv_pages_table_grow(kp, &t, 33) == 0);
  EXPECT(t.n == 3 && t.ids[0] == 0 && t.ids[2] == 2);
  EXPECT(kv_pages_table_grow(kp, &t, 48) == 0); /* already covered */
  EXPECT_EQ_INT(t.n, 3);
  REQUIRE(kv_pages_table_grow(kp, &u, 20) == 0);
  EXPECT(u.n == 2 && u.ids[0] == 3 && u.ids[1] == 4);
  /* 2 more pages for u but only 1 free: nothing changes */
  EXPECT(kv_pages_table_grow(kp, &u, 64) == -1);
  EXPECT_EQ_INT(u.n, 2);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 1);
  /* beyond the table's capacity */
  EXPECT(kv_pages_table_grow(kp, &t, 65) == -1);
  kv_pages_table_release(kp, &t);
  EXPECT_EQ_INT(t.n, 0);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 4);
  EXPECT(ok(kp));
  /* release order is last page first: queue is 5, 2, 1, 0 */
  REQUIRE(kv_pages_table_grow(kp, &u, 64) == 0);
  EXPECT(u.ids[2] == 5 && u.ids[3] == 2);
  kv_pages_table_release(kp, &u);
  kv_pages_table_free(&t);
  kv_pages_table_free(&u);
  EXPECT_EQ_INT(kv_pages_num_free(kp), 6);
  EXPECT(ok(kp));
  kv_pages_free(kp);
}

int main(void) {
  RUN(alloc_ids_fifo);
  RUN(all_or_nothing);
  RUN(shared_and_cached);
  RUN(tables);
  TEST_MAIN_END();
}
