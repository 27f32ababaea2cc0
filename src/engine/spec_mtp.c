#include "engine/spec_mtp.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct spec_mtp {
  qwen35_mtp *m;
  int H;
  /* per draft round: the pieces, their ids and y rows, the y rows fed, the items' indices */
  fwd_seq *q;
  int32_t *ids;
  float *y, *h;
  int *who;
  int cap;
};

int spec_mtp_init(spec_mtp **out, qwen35 *target, const model_weights *w, backend *be, int n_pages,
                  char *err, size_t errlen) {
  *out = NULL;
  spec_mtp *sm = calloc(1, sizeof *sm);
  if (!sm) return errf(err, errlen, "out of memory");
  if (qwen35_mtp_init(&sm->m, target, w, be, n_pages, err, errlen)) {
    free(sm);
    return -1;
  }
  sm->H = qwen35_config(target)->hidden_size;
  *out = sm;
  return 0;
}

void spec_mtp_free(spec_mtp *sm) {
  if (!sm) return;
  qwen35_mtp_free(sm->m);
  free(sm->q);
  free(sm->ids);
  free(sm->y);
  free(sm->h);
  free(sm->who);
  free(sm);
}

static int spec_mtp_room(spec_mtp *sm, int n, char *err, size_t errlen) {
  if (n <= sm->cap) return 0;
  fwd_seq *q = realloc(sm->q, (size_t)n * sizeof *q);
  if (q) sm->q = q;
  int32_t *ids = realloc(sm->ids, (size_t)n * sizeof *ids);
  if (ids) sm->ids = ids;
  float *y = realloc(sm->y, (size_t)n * sm->H * sizeof *y);
  if (y) sm->y = y;
  float *h = realloc(sm->h, (size_t)n * sm->H * sizeof *h);
  if (h) sm->h = h;
  int *who = realloc(sm->who, (size_t)n * sizeof *who);
  if (who) sm->who = who;
  if (!q || !ids || !y || !h || !who) return errf(err, errlen, "out of memory");
  sm->cap = n;
  return 0;
}

int spec_mtp_steps(spec_mtp *sm, spec_mtp_item *it, int n, char *err, size_t errlen) {
  if (n < 1) return 0;
  if (spec_mtp_room(sm, n, err, errlen)) return -1;
  size_t H = (size_t)sm->H;
  /* round 0: every item's fed rows in one step (their hidden rows made contiguous) */
  size_t rows = 0;
  for (int i = 0; i < n; i++) {
    if (it[i].n < 1) return errf(err, errlen, "MTP: nothing to feed");
    rows += (size_t)it[i].n;
  }
  float *h0 = n == 1 ? NULL : malloc(rows * H * sizeof *h0);
  if (n > 1 && !h0) return errf(err, errlen, "out of memory");
  size_t r = 0;
  for (int i = 0; i < n; i++) {
    sm->q[i] = (fwd_seq){.tokens = it[i].next,
                         .n_tokens = it[i].n,
                         .pos = it[i].pos,
                         .pages = it[i].pages,
                         .n_pages = it[i].n_pages};
    if (h0) memcpy(h0 + r * H, it[i].hidden, (size_t)it[i].n * H * sizeof *h0);
    r += (size_t)it[i].n;
  }
  int rc =
      qwen35_mtp_draft(sm->m, sm->q, n, 0, h0 ? h0 : it[0].hidden, sm->ids, sm->y, err, errlen);
  free(h0);
  if (rc) return -1;
  int live = 0;
  for (int i = 0; i < n; i++) {
    if (it[i].k < 1) continue;
    it[i].drafts[0] = sm->ids[i];
    if (it[i].k < 2) continue;
    memcpy(sm->h + (size_t)live * H, sm->y + (size_t)i * H, H * sizeof *sm->h);
    sm->who[live++] = i;
  }
  /* round j: draft j + 1 from (y_j, draft j) one position on, for the items still drafting
   * (vLLM's spec_step_idx j) */
  for (int j = 1; live > 0; j++) {
    for (int a = 0; a < live; a++) {
      spec_mtp_item *x = &it[sm->who[a]];
      sm->q[a] = (fwd_seq){.tokens = &x->drafts[j - 1],
                           .n_tokens = 1,
                           .pos = x->pos + x->n + j - 1,
                           .pages = x->pages,
                           .n_pages = x->n_pages};
    }
    if (qwen35_mtp_draft(sm->m, sm->q, live, j, sm->h, sm->ids, sm->y, err, errlen)) return -1;
    int next = 0;
    for (int a = 0; a < live; a++) {
      spec_mtp_item *x = &it[sm->who[a]];
      x->drafts[j] = sm->ids[a];
      if (x->k <= j + 1) continue;
      memcpy(sm->h + (size_t)next * H, sm->y + (size_t)a * H, H * sizeof *sm->h);
      sm->who[next++] = sm->who[a];
    }
    live = next;
  }
  return 0;
}

int spec_mtp_step(spec_mtp *sm, const int32_t *pages, int n_pages, int pos, int n,
                  const int32_t *next, const float *hidden, int k, int32_t *drafts, char *err,
                  size_t errlen) {
  spec_mtp_item it = {pages, n_pages, pos, n, next, hidden, k, drafts};
  return spec_mtp_steps(sm, &it, 1, err, errlen);
}
