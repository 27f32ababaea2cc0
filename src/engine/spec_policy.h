/* spec_policy — whether a step speculates, decided by measurement: for each count of decode
 * sequences (in buckets: 1, 2, 3, 4, then a factor of sqrt 2 apart) two arms, plain steps and
 * steps with drafts, each with the moving average of its tokens per second as observed on the
 * engine's own steps (a step's tokens: one per sequence, plus the drafts accepted; its time: the
 * wall time of the step, drafting included). The arm with the higher rate is taken; an arm with
 * fewer than SPEC_POLICY_WARM observations is tried first (drafts first), and every
 * SPEC_POLICY_EXPLORE steps of a bucket the other arm is tried once (that step's rate replacing
 * its stale one), so a changed acceptance or load is seen within that many steps. Speculation pays
 * at one sequence (the weights are read once for 1 + k rows) and may stop paying at many, where a
 * step's cost grows with its rows; acceptance decides where. */
#ifndef DS_SPEC_POLICY_H
#define DS_SPEC_POLICY_H

#define SPEC_POLICY_BUCKETS 24 /* sequence counts up to 2^10 */
#define SPEC_POLICY_WARM 3     /* observations before an arm's rate is trusted */
#define SPEC_POLICY_EXPLORE 64 /* steps of a bucket between tries of the losing arm */

typedef struct spec_policy_arm {
  double rate; /* tokens per second, moving average */
  int n;       /* observations */
} spec_policy_arm;

typedef struct spec_policy {
  spec_policy_arm arm[SPEC_POLICY_BUCKETS][2]; /* [bucket][0 plain, 1 drafts] */
  int since[SPEC_POLICY_BUCKETS];              /* steps since the losing arm was tried */
  int trying[SPEC_POLICY_BUCKETS];             /* the losing arm was just chosen: its next
                                                * observation replaces its stale rate */
  long long off_steps;                         /* decisions for a plain step */
} spec_policy;

void spec_policy_init(spec_policy *p);
/* 1 when the next step of n decode sequences should carry drafts, else 0. */
int spec_policy_decide(spec_policy *p, int n);
/* A step of n decode sequences (and nothing else) ran with drafts (drafts 1) or without, took
 * `seconds` and gave `tokens` (n plus the drafts accepted). */
void spec_policy_observe(spec_policy *p, int n, int drafts, int tokens, double seconds);

#endif
