#include "engine/spec_ngram.h"

int spec_ngram_propose(const int32_t *tokens, int n, int lookup_min, int lookup_max, int k,
                       int32_t *out) {
  if (n < lookup_min || k <= 0 || lookup_min < 1) return 0;
  int best = 0, best_end = 0;
  /* a match ending at e (exclusive, e < n: the suffix itself is not a match): its length is the
   * longest l <= lookup_max with tokens[e - l, e) == tokens[n - l, n); the first e of the
   * longest l wins (strictly longer replaces) */
  for (int e = 1; e < n; e++) {
    int l = 0;
    while (l < lookup_max && l < e && tokens[e - 1 - l] == tokens[n - 1 - l]) l++;
    if (l > best) {
      best = l;
      best_end = e;
      if (best == lookup_max) break; /* nothing longer can come, and earlier wins ties */
    }
  }
  if (best < lookup_min) return 0;
  int m = n - best_end < k ? n - best_end : k;
  for (int i = 0; i < m; i++) out[i] = tokens[best_end + i];
  return m;
}
