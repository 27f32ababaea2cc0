#include "engine/spec_policy.h"

#include <math.h>
#include <string.h>

#define SPEC_POLICY_EWMA 0.2 /* weight of a new observation */

void spec_policy_init(spec_policy *p) { memset(p, 0, sizeof *p); }

static int spec_policy_bucket(int n) {
  if (n <= 4) return n < 1 ? 0 : n - 1;
  int b = 4 + (int)floor(2.0 * log2((double)n / 4.0) + 1e-9);
  return b < SPEC_POLICY_BUCKETS ? b : SPEC_POLICY_BUCKETS - 1;
}

int spec_policy_decide(spec_policy *p, int n) {
  int b = spec_policy_bucket(n);
  spec_policy_arm *a = p->arm[b];
  int d;
  if (a[1].n < SPEC_POLICY_WARM)
    d = 1;
  else if (a[0].n < SPEC_POLICY_WARM)
    d = 0;
  else {
    d = a[1].rate >= a[0].rate;
    if (++p->since[b] >= SPEC_POLICY_EXPLORE) { /* the losing arm once */
      p->since[b] = 0;
      p->trying[b] = 1;
      d = !d;
    }
  }
  p->off_steps += !d;
  return d;
}

void spec_policy_observe(spec_policy *p, int n, int drafts, int tokens, double seconds) {
  if (n < 1 || tokens < 1 || !(seconds > 0)) return;
  int b = spec_policy_bucket(n);
  spec_policy_arm *a = &p->arm[b][drafts ? 1 : 0];
  double r = tokens / seconds;
  a->rate = a->n && !p->trying[b] ? a->rate + SPEC_POLICY_EWMA * (r - a->rate) : r;
  p->trying[b] = 0;
  a->n++;
}
