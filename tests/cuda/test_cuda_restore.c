/* test_cuda_restore — restore parity through the engine with the prefix cache on a real-shape
 * model on the GPU (scripts/device/check_real.sh), the same scenarios as
 * tests/test_prefix_engine.c runs on the tiny fixture on the CPU: a request restored from a
 * checkpoint must give the same greedy tokens as the same request computed "cold" (prefix
 * cache off, the same prefill split points given through engine_submit_opts.split_points;
 * test_prefix_engine.c explains how each case's split points follow).
 *
 * Environment:
 *   DS_REAL_DEVICE  "cuda" (default) or "cpu": on the CPU the logits of every sampled row must
 *                   also be bit-identical to the cold run's; on the GPU tokens must be equal and
 *                   the count of logits that differ is reported (a restore can run in other
 *                   batch compositions than its cold run, and the CUDA backend's GEMV for steps
 *                   of <= 8 rows and cuBLAS above may differ in the last bits)
 *   DS_BATCH_INVARIANT=1  the GPU's batch-invariant GEMMs: logits must be bit-identical there
 *                   too (check_real.sh runs it so: then "restored == cold" is exact)
 *   DS_REAL_MODEL   the model folder (default: the tiny fixture tests/fixtures/models/dense_bf16)
 *
 * Cases: tests/restore_cases.h (shared with test_prefix_engine.c). Each prints
 *   RESTORE case=NAME cached=N tokens_equal=0|1 logits_differ=K pass=0|1 */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <unistd.h>

#include "backend/backend_create.h"
#include "base/log.h"
#include "engine/engine.h"
#include "model/weights.h"
#include "test.h"

#define MAXTOK 8
#define MAXP 400

static const char *DEV = "cuda";
static int STRICT;
static int BI; /* the backend built batch-invariant */

#include "engine_rig.h"

/* Compares a restored run with its cold reference: tokens (and, on the CPU, logits) equal.
 * Prints the RESTORE line; returns 1 when the case passes. */
static int restore_same(const char *name, const req *a, const req *ref) {
  int tok_eq = a->finish == ref->finish && a->n_tok == ref->n_tok &&
               memcmp(a->tok, ref->tok, (size_t)a->n_tok * sizeof(int32_t)) == 0;
  size_t differ = 0;
  int nl = a->n_lg < ref->n_lg ? a->n_lg : ref->n_lg;
  if (nl > MAXTOK) nl = MAXTOK;
  for (size_t i = 0; i < (size_t)nl * V; i++)
    differ += memcmp(&a->lg[i], &ref->lg[i], sizeof(float)) != 0;
  if (a->n_lg != ref->n_lg) differ += V;
  int pass = tok_eq && a->finish == FINISH_LENGTH && (!STRICT || differ == 0);
  printf("RESTORE case=%s cached=%d tokens_equal=%d logits_differ=%zu pass=%d\n", name, a->cached,
         tok_eq, differ, pass);
  if (!tok_eq) {
    printf("  restored:");
    for (int i = 0; i < a->n_tok; i++) printf(" %d", a->tok[i]);
    printf("\n  cold:    ");
    for (int i = 0; i < ref->n_tok; i++) printf(" %d", ref->tok[i]);
    printf("\n");
  }
  return pass;
}

#include "restore_cases.h"

TEST(restore_cut_on_page_boundary) { restore_case_shared_head("page_boundary", 80); }
TEST(restore_partial_final_page) { restore_case_shared_head("partial_final_page", 90); }
TEST(restore_mid_message) { restore_case_mid_message("mid_message"); }
TEST(restore_into_fresh_pages) { restore_case_fresh_pages("fresh_pages", "fresh_pages_other"); }
TEST(restore_from_host_tier) { restore_case_host_tier("host_tier"); }
TEST(restore_next_turn) { restore_case_next_turn("next_turn"); }

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
  const char *d = getenv("DS_REAL_DEVICE");
  if (d && *d) DEV = d;
  const char *bi = getenv("DS_BATCH_INVARIANT");
  BI = bi && *bi && strcmp(bi, "0") != 0;
  STRICT = !strcmp(DEV, "cpu") || BI;
  const char *dir = getenv("DS_REAL_MODEL");
  if (!dir || !*dir) dir = "tests/fixtures/models/dense_bf16";
  printf("device %s%s, model %s\n", DEV, STRICT ? " (bit-exact checks)" : "", dir);
  if (model_load(dir, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_create(&(backend_options){.device = DEV, .batch_invariant = BI}, err, sizeof err);
  if (!BE) {
    printf("FAIL backend: %s\n", err);
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(restore_cut_on_page_boundary);
  RUN(restore_partial_final_page);
  RUN(restore_mid_message);
  RUN(restore_into_fresh_pages);
  RUN(restore_from_host_tier);
  RUN(restore_next_turn);
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
