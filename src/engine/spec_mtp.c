#include "engine/spec_mtp.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct spec_mtp {
  qwen35_mtp *m;
  int H, V;
  float *logits, *y; /* [cap, V], [cap, H] */
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
  sm->V = qwen35_config(target)->vocab_size;
  *out = sm;
  return 0;
}

void spec_mtp_free(spec_mtp *sm) {
  if (!sm) return;
  qwen35_mtp_free(sm->m);
  free(sm->logits);
  free(sm->y);
  free(sm);
}

/* the sampler's greedy rule: the first maximum */
static int32_t spec_mtp_argmax(const float *x, int V) {
  int32_t t = 0;
  for (int j = 1; j < V; j++)
    if (x[j] > x[t]) t = j;
  return t;
}

int spec_mtp_step(spec_mtp *sm, const int32_t *pages, int n_pages, int pos, int n,
                  const int32_t *next, const float *hidden, int k, int32_t *drafts, char *err,
                  size_t errlen) {
  if (n < 1) return errf(err, errlen, "MTP: nothing to feed");
  if (n > sm->cap) {
    float *l = realloc(sm->logits, (size_t)n * sm->V * sizeof *l);
    if (l) sm->logits = l;
    float *y = realloc(sm->y, (size_t)n * sm->H * sizeof *y);
    if (y) sm->y = y;
    if (!l || !y) return errf(err, errlen, "out of memory");
    sm->cap = n;
  }
  fwd_seq q = {.tokens = next, .n_tokens = n, .pos = pos, .pages = pages, .n_pages = n_pages};
  if (qwen35_mtp_forward(sm->m, &q, 1, 0, hidden, sm->logits, sm->y, err, errlen)) return -1;
  const float *lg = sm->logits + (size_t)(n - 1) * sm->V;
  float *h = sm->y + (size_t)(n - 1) * sm->H;
  for (int j = 0; j < k; j++) {
    drafts[j] = spec_mtp_argmax(lg, sm->V);
    if (j + 1 == k) break;
    /* the next draft: (y_j, draft j) one position on; vLLM's spec_step_idx j + 1 */
    fwd_seq d = {.tokens = &drafts[j],
                 .n_tokens = 1,
                 .pos = pos + n + j,
                 .pages = pages,
                 .n_pages = n_pages};
    if (qwen35_mtp_forward(sm->m, &d, 1, j + 1, h, sm->logits, sm->y, err, errlen)) return -1;
    lg = sm->logits;
    h = sm->y;
  }
  return 0;
}
