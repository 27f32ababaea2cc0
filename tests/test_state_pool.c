/* state_pool: slot and slab ids, counts, copies routed through the ops, faults, check. */
#include "cache/state_pool.h"

#include "base/fault.h"
#include "test.h"

static int log_dst[16], log_src[16], n_log, n_zero, zero_fail;

static int fake_zero(void *ctx, int slot) {
  (void)ctx;
  (void)slot;
  if (zero_fail) return -1;
  n_zero++;
  return 0;
}
static int fake_copy(void *ctx, int dst, int src) {
  (void)ctx;
  log_dst[n_log] = dst;
  log_src[n_log++] = src;
  return 0;
}

static int ok(const state_pool *sp) {
  char err[200];
  int rc = state_pool_check(sp, err, sizeof err);
  if (rc) printf("check: %s\n", err);
  return rc == 0;
}

TEST(slots_and_slabs) {
  state_pool_ops ops = {NULL, fake_zero, fake_copy};
  state_pool *sp;
  n_log = n_zero = 0;
  REQUIRE(state_pool_init(&sp, 3, 2, &ops) == 0);
  EXPECT_EQ_INT(state_pool_num_slots(sp), 3);
  EXPECT_EQ_INT(state_pool_num_slabs(sp), 2);
  int a, b, c, d;
  REQUIRE(state_pool_slot_alloc(sp, &a) == 0);
  REQUIRE(state_pool_slot_alloc(sp, &b) == 0);
  REQUIRE(state_pool_slot_alloc(sp, &c) == 0);
  EXPECT(a == 0 && b == 1 && c == 2);
  EXPECT_EQ_INT(n_zero, 3);
  EXPECT(state_pool_slot_alloc(sp, &d) == -1);
  state_pool_slot_free(sp, b);
  REQUIRE(state_pool_slot_alloc(sp, &d) == 0);
  EXPECT_EQ_INT(d, 1);
  int s1, s2, s3;
  REQUIRE(state_pool_slab_alloc(sp, &s1) == 0);
  REQUIRE(state_pool_slab_alloc(sp, &s2) == 0);
  EXPECT(s1 == 3 && s2 == 4);
  EXPECT(state_pool_slab_alloc(sp, &s3) == -1);
  EXPECT_EQ_INT(state_pool_num_slabs_free(sp), 0);
  EXPECT(ok(sp));
  REQUIRE(state_pool_save(sp, 2, s2) == 0);
  REQUIRE(state_pool_restore(sp, s2, 0) == 0);
  EXPECT_EQ_INT(n_log, 2);
  EXPECT(log_dst[0] == 4 && log_src[0] == 2);
  EXPECT(log_dst[1] == 0 && log_src[1] == 4);
  state_pool_slab_free(sp, s1);
  state_pool_slab_free(sp, s2);
  state_pool_slot_free(sp, a);
  state_pool_slot_free(sp, c);
  state_pool_slot_free(sp, d);
  EXPECT_EQ_INT(state_pool_num_slots_free(sp), 3);
  EXPECT_EQ_INT(state_pool_num_slabs_free(sp), 2);
  EXPECT(ok(sp));
  state_pool_free(sp);
}

TEST(faults) {
  state_pool_ops ops = {NULL, fake_zero, fake_copy};
  state_pool *sp;
  REQUIRE(state_pool_init(&sp, 2, 1, &ops) == 0);
  int a, s;
  fault_arm(1, "state_pool_slot_alloc", 0);
  EXPECT(state_pool_slot_alloc(sp, &a) == -1);
  fault_disarm();
  EXPECT_EQ_INT(state_pool_num_slots_free(sp), 2);
  zero_fail = 1;
  EXPECT(state_pool_slot_alloc(sp, &a) == -1);
  zero_fail = 0;
  EXPECT_EQ_INT(state_pool_num_slots_free(sp), 2);
  fault_arm(1, "state_pool_slab_alloc", 0);
  EXPECT(state_pool_slab_alloc(sp, &s) == -1);
  fault_disarm();
  EXPECT_EQ_INT(state_pool_num_slabs_free(sp), 1);
  REQUIRE(state_pool_slot_alloc(sp, &a) == 0);
  REQUIRE(state_pool_slab_alloc(sp, &s) == 0);
  fault_arm(1, "state_pool_copy", 0);
  EXPECT(state_pool_save(sp, a, s) == -1);
  fault_disarm();
  state_pool_slab_free(sp, s);
  state_pool_slot_free(sp, a);
  EXPECT(ok(sp));
  state_pool_free(sp);
}

int main(void) {
  RUN(slots_and_slabs);
  RUN(faults);
  TEST_MAIN_END();
}
