/* host_tier: round trips of slab and page images through the ops, the byte budget, handles,
 * LRU order, faults at every site (nothing kept), and the check. */
#include "cache/host_tier.h"

#include <stdint.h>

#include "base/fault.h"
#include "test.h"

#define PB 32 /* page bytes */
#define SB 24 /* slot bytes */

static unsigned char dev_page[8][PB], dev_slot[4][SB];
static int n_read, n_write;

static int rd_page(void *c, int p, void *h) {
  (void)c;
  n_read++;
  memcpy(h, dev_page[p], PB);
  return 0;
}
static int wr_page(void *c, int p, const void *h) {
  (void)c;
  n_write++;
  memcpy(dev_page[p], h, PB);
  return 0;
}
static int rd_slot(void *c, int s, void *h) {
  (void)c;
  n_read++;
  memcpy(h, dev_slot[s], SB);
  return 0;
}
static int wr_slot(void *c, int s, const void *h) {
  (void)c;
  n_write++;
  memcpy(dev_slot[s], h, SB);
  return 0;
}
static const host_tier_ops ops = {NULL, rd_page, wr_page, rd_slot, wr_slot};

static void fill(void) {
  for (int p = 0; p < 8; p++) memset(dev_page[p], 0x10 + p, PB);
  for (int s = 0; s < 4; s++) memset(dev_slot[s], 0xa0 + s, SB);
  n_read = n_write = 0;
}

static int ok(const host_tier *ht) {
  char err[200];
  if (host_tier_check(ht, err, sizeof err)) {
    printf("check: %s\n", err);
    return 0;
  }
  return 1;
}

TEST(round_trip) {
  fill();
  host_tier *ht;
  REQUIRE(host_tier_init(&ht, 1000, SB, PB, &ops) == 0);
  int32_t pages[3] = {5, 1, 6};
  int e;
  REQUIRE(host_tier_put(ht, 2, pages, 3, &e) == 0);
  EXPECT_EQ_INT(host_tier_bytes(ht), SB + 3 * PB);
  EXPECT_EQ_INT(host_tier_count(ht), 1);
  EXPECT_EQ_INT(n_read, 4);
  EXPECT_EQ_INT(host_tier_entry_pages(ht, e), 3);
  EXPECT_EQ_INT(host_tier_entry_has_slot(ht, e), 1);
  memset(dev_page, 0, sizeof dev_page);
  memset(dev_slot, 0, sizeof dev_slot);
  int32_t dst[3] = {0, 7, 3};
  REQUIRE(host_tier_write_pages(ht, e, dst, 3) == 0);
  REQUIRE(host_tier_write_slot(ht, e, 1) == 0);
  EXPECT(dev_page[0][0] == 0x15 && dev_page[7][PB - 1] == 0x11 && dev_page[3][9] == 0x16);
  EXPECT(dev_slot[1][0] == 0xa2 && dev_slot[1][SB - 1] == 0xa2);
  EXPECT(dev_page[1][0] == 0 && dev_slot[2][0] == 0);
  int e2;
  REQUIRE(host_tier_put(ht, -1, pages, 2, &e2) == 0); /* pages only */
  EXPECT_EQ_INT(host_tier_entry_has_slot(ht, e2), 0);
  EXPECT_EQ_INT(host_tier_bytes(ht), SB + 5 * PB);
  EXPECT(host_tier_put(ht, -1, NULL, 0, &e2) == -1); /* empty */
  EXPECT(ok(ht));
  host_tier_drop(ht, e);
  EXPECT_EQ_INT(host_tier_bytes(ht), 2 * PB);
  EXPECT_EQ_INT(host_tier_live(ht, e), 0);
  EXPECT(ok(ht));
  host_tier_free(ht);
}

TEST(budget_and_lru) {
  fill();
  host_tier *ht;
  REQUIRE(host_tier_init(&ht, 2 * SB + PB, SB, PB, &ops) == 0);
  int a, b, c, d;
  int32_t pg = 0;
  REQUIRE(host_tier_put(ht, 0, NULL, 0, &a) == 0);
  REQUIRE(host_tier_put(ht, 1, NULL, 0, &b) == 0);
  REQUIRE(host_tier_put(ht, -1, &pg, 1, &c) == 0);
  EXPECT_EQ_INT(host_tier_bytes(ht), 2 * SB + PB); /* exactly full */
  int reads = n_read;
  EXPECT(host_tier_put(ht, 2, NULL, 0, &d) == -1); /* refused before any read */
  EXPECT_EQ_INT(n_read, reads);
  EXPECT_EQ_INT(host_tier_oldest(ht), a);
  host_tier_touch(ht, a);
  EXPECT_EQ_INT(host_tier_oldest(ht), b);
  host_tier_drop(ht, b);
  EXPECT_EQ_INT(host_tier_oldest(ht), c);
  REQUIRE(host_tier_put(ht, 2, NULL, 0, &d) == 0);
  EXPECT_EQ_INT(d, b); /* the handle is reused */
  EXPECT_EQ_INT(host_tier_oldest(ht), c);
  EXPECT(ok(ht));
  host_tier_drop(ht, a);
  host_tier_drop(ht, c);
  host_tier_drop(ht, d);
  EXPECT_EQ_INT(host_tier_oldest(ht), -1);
  EXPECT_EQ_INT(host_tier_bytes(ht), 0);
  EXPECT(ok(ht));
  host_tier_free(ht);
}

TEST(faults_keep_nothing) {
  fill();
  host_tier *ht;
  REQUIRE(host_tier_init(&ht, 4096, SB, PB, &ops) == 0);
  int32_t pages[4] = {0, 1, 2, 3};
  int fired = 0;
  long n;
  for (n = 1; n < 100; n++) {
    int e = -1;
    fault_arm(n, NULL, 0);
    int rc = host_tier_put(ht, 1, pages, 4, &e);
    int f = fault_fired();
    fault_disarm();
    if (!f) {
      EXPECT(rc == 0);
      host_tier_drop(ht, e);
      break;
    }
    fired++;
    EXPECT_MSG(rc == -1, "fault %ld", n);
    EXPECT_EQ_INT(host_tier_bytes(ht), 0);
    EXPECT_EQ_INT(host_tier_count(ht), 0);
    EXPECT(ok(ht));
  }
  /* table growth (n=1), data allocation (n=2; the table grew then), then hit 3 onward are
   * reads after the allocation and the slot read: pages 0..3 */
  EXPECT_EQ_INT(fired, 6);
  int e = -1, r0 = n_read;
  fault_arm(1, "host_tier_read", 0); /* the slot read, by name */
  EXPECT(host_tier_put(ht, 1, pages, 4, &e) == -1);
  fault_disarm();
  EXPECT_EQ_INT(n_read, r0);
  EXPECT_EQ_INT(host_tier_count(ht), 0);
  REQUIRE(host_tier_put(ht, 1, pages, 4, &e) == 0);
  fault_arm(1, "host_tier_write", 0);
  EXPECT(host_tier_write_pages(ht, e, pages, 4) == -1);
  fault_arm(1, "host_tier_write", 0);
  EXPECT(host_tier_write_slot(ht, e, 1) == -1);
  fault_disarm();
  EXPECT(host_tier_write_slot(ht, e, 1) == 0);
  EXPECT_EQ_INT(host_tier_count(ht), 1);
  EXPECT(ok(ht));
  host_tier_free(ht); /* frees live entries */
}

int main(void) {
  RUN(round_trip);
  RUN(budget_and_lru);
  RUN(faults_keep_nothing);
  TEST_MAIN_END();
}
