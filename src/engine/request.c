#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"

static int request_cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Sorts forced[0, n_forced) and drops duplicates. */
static void request_sort_forced(request *r) {
  qsort(r->forced, (size_t)r->n_forced, sizeof *r->forced, request_cmp_i32);
  int k = 0;
  for (int i = 0; i < r->n_forced; i++)
    if (k == 0 || r->forced[k - 1] != r->forced[i]) r->forced[k++] = r->forced[i];
  r->n_forced = k;
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
  r->cap_forced = n_forced > 0 ? n_forced : 1;
  r->forced = malloc((size_t)r->cap_forced * sizeof *r->forced);
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
  request_sort_forced(r);
  r->n_forced_base = r->n_forced;
  sampler_init(&r->smp, sp, fallback_seed);
  r->state = REQ_STATE_WAITING;
  return 0;
}

int request_init_prefix(request *r, const char *salt, const int32_t *bounds, int n_bounds,
                        int n_points) {
  if (n_points < 0) n_points = 0;
  if (n_bounds < 0 || !bounds) n_bounds = 0;
  if (fault_hit("request_init_prefix")) return -1;
  if (salt && salt[0]) {
    r->salt = strdup(salt);
    if (!r->salt) return -1;
  }
  r->bounds = malloc((size_t)(n_bounds > 0 ? n_bounds : 1) * sizeof *r->bounds);
  int room = n_points + 1 + REQUEST_DEMAND_POINTS;
  r->txn = calloc((size_t)room, sizeof *r->txn);
  r->pts = calloc((size_t)room, sizeof *r->pts);
  int32_t *f = realloc(r->forced, (size_t)(r->cap_forced + room) * sizeof *f);
  if (f) {
    r->forced = f;
    r->cap_forced += room;
  }
  if (!r->bounds || !r->txn || !r->pts || !f) return -1;
  if (n_bounds) memcpy(r->bounds, bounds, (size_t)n_bounds * sizeof *bounds);
  r->n_bounds = n_bounds;
  r->cap_txn = room;
  return 0;
}

void request_set_points(request *r, const prefix_cache_point *pts, int n, int extra) {
  r->n_forced = r->n_forced_base;
  if (extra > 0 && extra < r->n_prompt && r->n_forced < r->cap_forced)
    r->forced[r->n_forced++] = extra;
  for (int i = 0; i < n && r->n_forced < r->cap_forced; i++)
    if (pts[i].depth > 0 && pts[i].depth < r->n_prompt) r->forced[r->n_forced++] = pts[i].depth;
  request_sort_forced(r);
}

int request_add_point(request *r, int d) {
  if (d <= 0 || d >= r->n_prompt) return -1;
  if (request_is_forced(r, d)) return 0;
  if (r->n_forced >= r->cap_forced) return -1;
  int i = r->n_forced;
  while (i > 0 && r->forced[i - 1] > d) {
    r->forced[i] = r->forced[i - 1];
    i--;
  }
  r->forced[i] = d;
  r->n_forced++;
  return 0;
}

int request_is_forced(const request *r, int d) {
  int lo = 0, hi = r->n_forced;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (r->forced[mid] < d)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < r->n_forced && r->forced[lo] == d;
}

void request_free(request *r) {
  CHECK(r->slot < 0);
  CHECK(r->n_txn == 0);
  kv_pages_table_free(&r->pages);
  free(r->tokens);
  free(r->forced);
  free(r->salt);
  free(r->bounds);
  free(r->txn);
  free(r->pts);
  r->pts = NULL;
  r->tokens = NULL;
  r->forced = NULL;
  r->salt = NULL;
  r->bounds = NULL;
  r->txn = NULL;
}
