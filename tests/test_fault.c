/* fault: n-th hit, site filter, sticky, fire counts, the DS_FAULT spec parser, the fire hook. */
#include "base/fault.h"

#include "test.h"

static char hook_site[64];
static long hook_hit, hook_fire, hook_calls;
static void hook(const char *site, long hit, long fire) {
  snprintf(hook_site, sizeof hook_site, "%s", site);
  hook_hit = hit;
  hook_fire = fire;
  hook_calls++;
}

TEST(nth_hit_and_site) {
  fault_arm(3, "a", 0);
  int fired_at = 0;
  for (int i = 1; i <= 10; i++) {
    EXPECT_EQ_INT(fault_hit("b"), 0); /* other sites are not counted */
    if (fault_hit("a")) {
      EXPECT_EQ_INT(fired_at, 0);
      fired_at = i;
    }
  }
  EXPECT_EQ_INT(fired_at, 3);
  EXPECT_EQ_INT(fault_count(), 10);
  EXPECT_EQ_INT(fault_fire_count(), 1);
  EXPECT(fault_fired());
  fault_disarm();
  EXPECT_EQ_INT(fault_hit("a"), 0);
}

TEST(sticky_any_site) {
  fault_arm(2, NULL, 1);
  EXPECT_EQ_INT(fault_hit("x"), 0);
  EXPECT_EQ_INT(fault_hit("y"), 1);
  EXPECT_EQ_INT(fault_hit("z"), 1);
  EXPECT_EQ_INT(fault_fire_count(), 2);
  fault_disarm();
}

TEST(spec_parser) {
  char err[200];
  EXPECT_EQ_INT(fault_arm_spec("kv_pages_alloc:2", err, sizeof err), 0);
  EXPECT_EQ_INT(fault_hit("kv_pages_alloc"), 0);
  EXPECT_EQ_INT(fault_hit("other"), 0);
  EXPECT_EQ_INT(fault_hit("kv_pages_alloc"), 1);
  EXPECT_EQ_INT(fault_hit("kv_pages_alloc"), 0);
  EXPECT_EQ_INT(fault_arm_spec("s:1:sticky", err, sizeof err), 0);
  EXPECT_EQ_INT(fault_hit("s"), 1);
  EXPECT_EQ_INT(fault_hit("s"), 1);
  EXPECT_EQ_INT(fault_arm_spec("*:2:once", err, sizeof err), 0);
  EXPECT_EQ_INT(fault_hit("p"), 0);
  EXPECT_EQ_INT(fault_hit("q"), 1);
  EXPECT_EQ_INT(fault_hit("q"), 0);
  const char *bad[] = {"",    "site", ":3",        "s:",   "s:0", "s:-1",
                       "s:x", "s:3x", "s:3:maybe", "s:3:", NULL};
  for (int i = 0; bad[i]; i++) {
    fault_arm(1, "keep", 0);
    err[0] = 0;
    EXPECT_MSG(fault_arm_spec(bad[i], err, sizeof err) == -1, "spec '%s' accepted", bad[i]);
    EXPECT_MSG(err[0] != 0, "spec '%s': no reason", bad[i]);
    EXPECT_MSG(fault_hit("keep") == 1, "spec '%s' changed the armed fault", bad[i]);
  }
  EXPECT_EQ_INT(fault_arm_spec(NULL, err, sizeof err), -1);
  fault_disarm();
}

TEST(hook_on_each_fire) {
  fault_set_hook(hook);
  fault_arm(2, "h", 1);
  fault_hit("h");
  EXPECT_EQ_INT(hook_calls, 0);
  fault_hit("h");
  fault_hit("h");
  EXPECT_EQ_INT(hook_calls, 2);
  EXPECT_STR(hook_site, "h");
  EXPECT_EQ_INT(hook_hit, 3);
  EXPECT_EQ_INT(hook_fire, 2);
  fault_set_hook(NULL);
  fault_hit("h");
  EXPECT_EQ_INT(hook_calls, 2);
  fault_disarm();
}

int main(void) {
  RUN(nth_hit_and_site);
  RUN(sticky_any_site);
  RUN(spec_parser);
  RUN(hook_on_each_fire);
  TEST_MAIN_END();
}
