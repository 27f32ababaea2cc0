#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"

static int request_cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int request_init(request *r, int64_t id, const int32_t *prompt, int n_prompt,
                 const sampling_params *sp, const int32_t *forced, int n_forced,
                 uint64_t fallback_seed) {
  memset(r, 0, sizeof *r);
  r->id = id;
  r->slot = -1;
  r->n_prompt = n_prompt;
  r->n_tokens = n_prompt;
  r->cap = n_prompt + sp->max_tokens;
  if (fault_hit("request_init")) return -1;
  r->tokens = malloc((size_t)r->cap * sizeof *r->tokens);
  r->forced = malloc((size_t)(n_forced > 0 ? n_forced : 1) * sizeof *r->forced);
  /* the last sampled token is never fed: cache positions < cap - 1 */
  if (!r->tokens || !r->forced ||
      kv_pages_table_init(&r->pages, kv_pages_for_tokens(r->cap - 1)) != 0) {
    free(r->tokens);
    free(r->forced);
    memset(r, 0, sizeof *r);
    return -1;
  }
  memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
  for (int i = 0; i < n_forced; i++)
    if (forced[i] > 0 && forced[i] < n_prompt) r->forced[r->n_forced++] = forced[i];
  qsort(r->forced, (size_t)r->n_forced, sizeof *r->forced, request_cmp_i32);
  int k = 0;
  for (int i = 0; i < r->n_forced; i++)
    if (k == 0 || r->forced[k - 1] != r->forced[i]) r->forced[k++] = r->forced[i];
  r->n_forced = k;
  sampler_init(&r->smp, sp, fallback_seed);
  r->state = REQ_STATE_WAITING;
  return 0;
}

void request_free(request *r) {
  CHECK(r->slot < 0);
  kv_pages_table_free(&r->pages);
  free(r->tokens);
  free(r->forced);
  r->tokens = NULL;
  r->forced = NULL;
}
