/* kv_share: which decode rows read the same KV pages, and how many positions they share. */
#include "backend/kv_share.h"

#include "test.h"

#define MP 64 /* page-table columns */

/* A batch of pieces: lengths, positions; page tables filled by the test. */
typedef struct {
  int n, T;
  int32_t len[32], pos[32], start[32], slot[32];
  int32_t tokens[256], rpos[256], seq[256];
  int32_t pt[32 * MP];
  backend_batch b;
} tb;

static void tb_init(tb *x, int n, const int *len, const int *pos) {
  x->n = n;
  x->T = 0;
  for (int s = 0; s < n; s++) {
    x->len[s] = len[s];
    x->pos[s] = pos[s];
    x->start[s] = x->T;
    x->slot[s] = s;
    for (int r = 0; r < len[s]; r++, x->T++) {
      x->tokens[x->T] = 0;
      x->rpos[x->T] = pos[s] + r;
      x->seq[x->T] = s;
    }
    for (int j = 0; j < MP; j++) x->pt[s * MP + j] = 1000 * (s + 1) + j; /* private pages */
  }
  x->b = (backend_batch){x->T,   n,       x->tokens, x->rpos, x->seq, x->start, x->len,
                         x->pos, x->slot, x->pt,     MP,      0,      NULL,     NULL};
}

/* pieces a and b hold the same first k pages (a's) */
static void tb_share(tb *x, int a, int b, int k) {
  for (int j = 0; j < k; j++) x->pt[b * MP + j] = x->pt[a * MP + j];
}

typedef struct {
  kv_share_group g[KV_SHARE_MAX_GROUPS];
  int32_t members[256], row_len[256];
  int64_t scratch[64];
  int n;
} plan;

static void run(tb *x, int min_len, int max_groups, plan *p) {
  p->n = kv_share_plan(&x->b, min_len, max_groups, p->g, p->members, p->row_len, p->scratch);
}

TEST(no_sharing) {
  tb x;
  int len[3] = {1, 1, 1}, pos[3] = {500, 600, 700};
  tb_init(&x, 3, len, pos);
  plan p;
  run(&x, 16, 4, &p);
  EXPECT_EQ_INT(p.n, 0);
  for (int t = 0; t < x.T; t++) EXPECT_EQ_INT(p.row_len[t], 0);
}

/* rows 0, 1, 2 share 40 pages; row 3 only 10 with row 0; row 4 none: the group is 0, 1, 2
 * over 640 positions ((3 - 1) x 640 saved beats (4 - 1) x 160) */
TEST(group_and_length) {
  tb x;
  int len[5] = {1, 1, 1, 1, 1}, pos[5] = {700, 800, 900, 750, 720};
  tb_init(&x, 5, len, pos);
  tb_share(&x, 0, 1, 40);
  tb_share(&x, 0, 2, 40);
  tb_share(&x, 0, 3, 10);
  plan p;
  run(&x, 16, 4, &p);
  REQUIRE(p.n == 1);
  EXPECT_EQ_INT(p.g[0].leader, 0);
  EXPECT_EQ_INT(p.g[0].len, 640);
  EXPECT_EQ_INT(p.g[0].n_members, 3);
  EXPECT_EQ_INT(p.g[0].member_off, 0);
  EXPECT(p.members[0] == 0 && p.members[1] == 1 && p.members[2] == 2);
  EXPECT(p.row_len[0] == 640 && p.row_len[1] == 640 && p.row_len[2] == 640);
  EXPECT(p.row_len[3] == 0 && p.row_len[4] == 0);
  /* with row 3 sharing 30 pages: 4 x 480 -> 3 x 480 = 1440 beats 2 x 640 = 1280 */
  tb_share(&x, 0, 3, 30);
  run(&x, 16, 4, &p);
  REQUIRE(p.n == 1);
  EXPECT_EQ_INT(p.g[0].len, 480);
  EXPECT_EQ_INT(p.g[0].n_members, 4);
  EXPECT_EQ_INT(p.row_len[3], 480);
}

/* the shared length never reaches a row's own position, and stays under min_len -> none */
TEST(capped_by_position_and_min_len) {
  tb x;
  int len[2] = {1, 1}, pos[2] = {900, 300};
  tb_init(&x, 2, len, pos);
  tb_share(&x, 0, 1, 60);
  plan p;
  run(&x, 16, 4, &p);
  REQUIRE(p.n == 1);
  EXPECT_EQ_INT(p.g[0].len, 300); /* positions 0 .. 299: row 1's own token is at 300 */
  run(&x, 301, 4, &p);
  EXPECT_EQ_INT(p.n, 0);
  /* a row whose position is under min_len is not a candidate at all */
  x.pos[1] = 200;
  x.rpos[1] = 200;
  run(&x, 256, 4, &p);
  EXPECT_EQ_INT(p.n, 0);
}

/* prefill pieces never join; rows are found through seq_start */
TEST(prefill_pieces_ignored) {
  tb x;
  int len[4] = {5, 1, 3, 1}, pos[4] = {600, 640, 700, 660};
  tb_init(&x, 4, len, pos);
  tb_share(&x, 0, 1, 40);
  tb_share(&x, 0, 2, 40);
  tb_share(&x, 0, 3, 40);
  plan p;
  run(&x, 16, 4, &p);
  REQUIRE(p.n == 1);
  EXPECT_EQ_INT(p.g[0].leader, 1);
  EXPECT_EQ_INT(p.g[0].n_members, 2);
  EXPECT(p.members[0] == x.start[1] && p.members[1] == x.start[3]);
  EXPECT_EQ_INT(p.g[0].len, 640);
  EXPECT_EQ_INT(p.row_len[x.start[1]], 640);
  EXPECT_EQ_INT(p.row_len[0], 0);
  EXPECT_EQ_INT(p.row_len[x.start[2]], 0);
}

/* three groups, room for two: the two that save the most, in row order */
TEST(max_groups_keeps_largest) {
  tb x;
  int len[7] = {1, 1, 1, 1, 1, 1, 1}, pos[7] = {800, 800, 800, 800, 800, 800, 800};
  tb_init(&x, 7, len, pos);
  tb_share(&x, 0, 1, 10); /* group A: 0, 1 over 160: saves 160 */
  tb_share(&x, 2, 3, 30); /* group B: 2, 3, 4 over 480: saves 960 */
  tb_share(&x, 2, 4, 30);
  tb_share(&x, 5, 6, 40); /* group C: 5, 6 over 640: saves 640 */
  plan p;
  run(&x, 16, 2, &p);
  REQUIRE(p.n == 2);
  EXPECT_EQ_INT(p.g[0].leader, 2);
  EXPECT_EQ_INT(p.g[0].len, 480);
  EXPECT_EQ_INT(p.g[0].n_members, 3);
  EXPECT_EQ_INT(p.g[1].leader, 5);
  EXPECT_EQ_INT(p.g[1].len, 640);
  EXPECT_EQ_INT(p.g[1].member_off, 3);
  EXPECT(p.row_len[0] == 0 && p.row_len[1] == 0);
  run(&x, 16, 4, &p);
  REQUIRE(p.n == 3);
  EXPECT(p.g[0].leader == 0 && p.g[1].leader == 2 && p.g[2].leader == 5);
  EXPECT_EQ_INT(p.row_len[1], 160);
}

int main(void) {
  RUN(no_sharing);
  RUN(group_and_length);
  RUN(capped_by_position_and_min_len);
  RUN(prefill_pieces_ignored);
  RUN(max_groups_keeps_largest);
  TEST_MAIN_END();
}
