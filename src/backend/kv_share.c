/* kv_share — the shared-prefix plan of a step's decode rows (see kv_share.h). */
#include "backend/kv_share.h"

#include <stdlib.h>
#include <string.h>

static int kv_share_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Positions piece m shares with piece l: their common run of page ids from the start, in
 * positions, capped by both rows' positions (what each has computed before its own token). */
static int32_t kv_share_common(const backend_batch *b, int32_t l, int32_t m) {
  int32_t pl = b->seq_pos[l], pm = b->seq_pos[m], cap = pl < pm ? pl : pm;
  const int32_t *a = b->page_table + (size_t)l * b->max_pages,
                *c = b->page_table + (size_t)m * b->max_pages;
  int32_t np = (cap + BACKEND_PAGE_TOKENS - 1) / BACKEND_PAGE_TOKENS, k = 0;
  if (np > b->max_pages) np = b->max_pages;
  while (k < np && a[k] == c[k]) k++;
  int64_t len = (int64_t)k * BACKEND_PAGE_TOKENS;
  return len < cap ? (int32_t)len : cap;
}

typedef struct kv_share_pick {
  int64_t saved;             /* (members - 1) * len */
  int32_t first, count, len; /* the bucket: keys [first, first + count) */
} kv_share_pick;

int kv_share_plan(const backend_batch *b, int min_len, int max_groups, kv_share_group *groups,
                  int32_t *members, int32_t *row_len, int64_t *scratch) {
  for (int t = 0; t < b->n_tokens; t++) row_len[t] = 0;
  if (max_groups > KV_SHARE_MAX_GROUPS) max_groups = KV_SHARE_MAX_GROUPS;
  if (max_groups <= 0 || !b->page_table || b->max_pages < 1) return 0;
  if (min_len < 1) min_len = 1;
  int64_t *key = scratch, *cl = scratch + b->n_seqs;
  int n = 0;
  for (int s = 0; s < b->n_seqs; s++)
    if (b->seq_len[s] == 1 && b->seq_pos[s] >= min_len &&
        b->page_table[(size_t)s * b->max_pages] >= 0)
      key[n++] = (int64_t)b->page_table[(size_t)s * b->max_pages] << 32 | (uint32_t)s;
  if (n < 2) return 0;
  qsort(key, (size_t)n, sizeof *key, kv_share_cmp); /* by first page, then piece */
  kv_share_pick pick[KV_SHARE_MAX_GROUPS];
  int np = 0;
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && key[j] >> 32 == key[i] >> 32) j++;
    if (j - i >= 2) {
      int32_t l = (int32_t)(uint32_t)key[i];
      for (int k = i; k < j; k++) /* descending common length: negated keys sort ascending */
        cl[k - i] = -(int64_t)kv_share_common(b, l, (int32_t)(uint32_t)key[k]);
      qsort(cl, (size_t)(j - i), sizeof *cl, kv_share_cmp);
      kv_share_pick best = {0, i, 0, 0};
      for (int k = 1; k < j - i; k++) { /* the k + 1 longest together share cl[k] */
        int64_t len = -cl[k], saved = (int64_t)k * len;
        if (len >= min_len && saved > best.saved)
          best = (kv_share_pick){saved, i, j - i, (int32_t)len};
      }
      if (best.saved > 0) { /* keep the max_groups that save the most, in bucket order */
        int at = np;
        if (np == max_groups) {
          at = 0;
          for (int k = 1; k < np; k++)
            if (pick[k].saved < pick[at].saved) at = k;
          if (pick[at].saved >= best.saved)
            at = -1;
          else {
            memmove(&pick[at], &pick[at + 1], sizeof *pick * (size_t)(np - 1 - at));
            at = --np;
          }
        }
        if (at >= 0) pick[np++] = best;
      }
    }
    i = j;
  }
  /* groups in the order of their first row (pieces are in row order) */
  for (int a = 1; a < np; a++)
    for (int c = a; c > 0 && (uint32_t)key[pick[c].first] < (uint32_t)key[pick[c - 1].first]; c--) {
      kv_share_pick t = pick[c];
      pick[c] = pick[c - 1];
      pick[c - 1] = t;
    }
  int nm = 0;
  for (int g = 0; g < np; g++) {
    int32_t l = (int32_t)(uint32_t)key[pick[g].first];
    groups[g] = (kv_share_group){l, nm, 0, pick[g].len};
    /* the bucket's pieces are in ascending order, so its rows are too */
    for (int k = pick[g].first; k < pick[g].first + pick[g].count; k++) {
      int32_t s = (int32_t)(uint32_t)key[k];
      if (kv_share_common(b, l, s) < pick[g].len) continue;
      int32_t t = b->seq_start[s];
      members[nm++] = t;
      row_len[t] = pick[g].len;
      groups[g].n_members++;
    }
  }
  return np;
}
