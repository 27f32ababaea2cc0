/* spec_policy: with synthetic step times, the arm of the higher measured rate wins per count of
 * sequences (drafts at 1 sequence where verifying costs about one step, plain at 64 where a
 * verify step costs its rows), both arms are tried before either is trusted, the losing arm is
 * tried again every SPEC_POLICY_EXPLORE steps, and a changed acceptance turns the choice. */
#include "engine/spec_policy.h"
#include "test.h"

/* A synthetic engine: a step of n sequences costs base + per_row * rows seconds; with drafts
 * each sequence carries k drafts of which `acc` are accepted. Runs `steps` steps deciding by
 * p; returns the steps that drafted. */
static int run(spec_policy *p, int n, int k, double acc, double base, double per_row, int steps) {
  int on = 0;
  for (int s = 0; s < steps; s++) {
    int d = spec_policy_decide(p, n);
    int rows = n * (d ? 1 + k : 1);
    double tokens = n * (d ? 1 + acc : 1);
    spec_policy_observe(p, n, d, (int)(tokens + 0.5), base + per_row * rows);
    on += d;
  }
  return on;
}

TEST(one_sequence_drafts) {
  spec_policy p;
  spec_policy_init(&p);
  /* weight-bound: a 4-row step costs 1.1 of a 1-row one; acceptance length 3 */
  int on = run(&p, 1, 3, 2.0, 1.0, 0.01, 200);
  EXPECT_MSG(on >= 200 - 3 - 200 / SPEC_POLICY_EXPLORE - 1, "drafted %d of 200", on);
  EXPECT(spec_policy_decide(&p, 1) == 1 || p.since[0] == 0);
}

TEST(many_sequences_plain) {
  spec_policy p;
  spec_policy_init(&p);
  /* compute-bound at 64: rows cost, 4x the rows for 1.5x the tokens */
  int on = run(&p, 64, 3, 0.5, 1.0, 0.1, 200);
  EXPECT_MSG(on <= SPEC_POLICY_WARM + 200 / SPEC_POLICY_EXPLORE + 1, "drafted %d of 200", on);
  EXPECT(on >= SPEC_POLICY_WARM); /* tried before it was judged */
  /* the other count of sequences is its own bucket: 1 still drafts */
  EXPECT(run(&p, 1, 3, 2.0, 1.0, 0.01, 20) >= 15);
}

TEST(acceptance_change_turns_it) {
  spec_policy p;
  spec_policy_init(&p);
  /* 8 sequences: with acceptance length 1.2 drafts lose, with 4 (every draft) they win */
  int on1 = run(&p, 8, 3, 0.2, 1.0, 0.05, 300);
  int on2 = run(&p, 8, 3, 3.0, 1.0, 0.05, 300);
  EXPECT_MSG(on1 < 30 && on2 >= 300 - SPEC_POLICY_EXPLORE - 2, "drafted %d then %d of 300", on1,
             on2);
}

TEST(losing_arm_retried) {
  spec_policy p;
  spec_policy_init(&p);
  run(&p, 64, 3, 0.5, 1.0, 0.1, 20);
  int tried = 0;
  for (int s = 0; s < SPEC_POLICY_EXPLORE; s++) tried += spec_policy_decide(&p, 64);
  EXPECT_MSG(tried == 1, "the losing arm tried %d times in %d steps", tried, SPEC_POLICY_EXPLORE);
}

int main(void) {
  RUN(one_sequence_drafts);
  RUN(many_sequences_plain);
  RUN(acceptance_change_turns_it);
  RUN(losing_arm_retried);
  TEST_MAIN_END();
}
