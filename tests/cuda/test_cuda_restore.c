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
 * Cases: a cut on a page boundary and one with a partial final page (copy-on-write of the
 * last page), a forced cut in the middle of a chat message (an END checkpoint at 99), a
 * restore into fresh pages while another request holds the pages the source had (the page
 * table is not the source's), a restore from the host tier (a device budget of 1.5 slabs and
 * a 12-page KV pool push the checkpoint out to the host), and the next chat turn hitting the
 * end-of-generation checkpoint. Each prints
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

#include "engine_rig.h"

/* Compares a restored run with its cold reference: tokens (and, on the CPU, logits) equal.
 * Prints the RESTORE line; returns 1 when the case passes. */
static int compare(const char *name, const req *a, const req *ref) {
  int tok_eq = a->finish == ref->finish && a->n_tok == ref->n_tok &&
               memcmp(a->tok, ref->tok, (size_t)a->n_tok * sizeof(int32_t)) == 0;
  size_t differ = 0;
  int nl = a->n_lg < ref->n_lg ? a->n_lg : ref->n_lg;
  if (nl > MAXTOK) nl = MAXTOK;
  for (size_t i = 0; i < (size_t)nl * V; i++) differ += memcmp(&a->lg[i], &ref->lg[i], sizeof(float)) != 0;
  if (a->n_lg != ref->n_lg) differ += V;
  int pass = tok_eq && a->finish == FINISH_LENGTH && (!STRICT || differ == 0);
  printf("RESTORE case=%s cached=%d tokens_equal=%d logits_differ=%zu pass=%d\n", name, a->cached, tok_eq, differ,
         pass);
  if (!tok_eq) {
    printf("  restored:");
    for (int i = 0; i < a->n_tok; i++) printf(" %d", a->tok[i]);
    printf("\n  cold:    ");
    for (int i = 0; i < ref->n_tok; i++) printf(" %d", ref->tok[i]);
    printf("\n");
  }
  return pass;
}

static req A, B, F, R1, R2;
static int32_t S[MAXP], PA[MAXP], PB[MAXP], PF[MAXP], PT[MAXP];

/* ---- cases ----------------------------------------------------------------------------- */

/* A = S + a, then B = S + b restored at |S| (a chat boundary): B equals cold B with the split
 * points {|S| (boundary), n_B - 1 (END)}. */
static void shared_head(const char *name, int ns) {
  toks(S, ns, 7);
  int na = ns + 30, nb = ns + 25;
  prompt_make(PA, S, ns, na, 11, 3);
  prompt_make(PB, S, ns, nb, 12, 4);
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, na, bnd, 2, NULL, 0);
  req_run(&g, &A);
  EXPECT_EQ_INT(A.finish, FINISH_LENGTH);
  EXPECT_EQ_INT(A.cached, 0);
  req_set(&B, PB, nb, bnd, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, ns);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {nb - 1};
  REQUIRE(cold(&R1, &B, sp, 1) == 0);
  EXPECT_MSG(compare(name, &B, &R1), "restored at %d differs from cold", ns);
}

TEST(restore_cut_on_page_boundary) { shared_head("page_boundary", 80); }
TEST(restore_partial_final_page) { shared_head("partial_final_page", 90); /* 5 pages + 10 rows */ }

/* A = X (100 tokens, one message); B = X + 30 more tokens of the same message restores A's
 * END checkpoint at 99 (mid-page, mid-message). B's split points: 99 (restored), 100
 * (DIVERGE: B leaves the tree where A's generated path went on), 129 (END). */
TEST(restore_mid_message) {
  toks(PA, 100, 21);
  int32_t bnd[1] = {0};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, 100, bnd, 1, NULL, 0);
  req_run(&g, &A);
  REQUIRE(A.finish == FINISH_LENGTH);
  memcpy(PB, PA, 100 * sizeof *PB);
  toks(PB + 100, 30, 22);
  PB[100] = (A.tok[0] + 1) % 256; /* leaves A's generated path at once */
  req_set(&B, PB, 130, bnd, 1, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, 99);
  EXPECT(rig_down(&g));
  int32_t sp[3] = {99, 100, 129};
  REQUIRE(cold(&R1, &B, sp, 3) == 0);
  EXPECT_MSG(compare("mid_message", &B, &R1), "mid-message restore differs from cold");
}

/* B restores while F decodes and holds pages, so B's fresh pages (its copy-on-write page and
 * its suffix) are other ids than A's were: F takes the head of the free queue right after A
 * retired. F (first token unshared) splits at its END only. */
TEST(restore_into_fresh_pages) {
  int ns = 90;
  toks(S, ns, 31);
  prompt_make(PA, S, ns, 120, 32, 5);
  prompt_make(PB, S, ns, 110, 33, 6);
  toks(PF, 100, 34);
  PF[0] = 255 - S[0] % 200; /* shares no path */
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, 120, bnd, 2, NULL, 0);
  req_run(&g, &A);
  req_set(&F, PF, 100, NULL, 0, NULL, 0);
  F.max_tokens = 40;
  req_submit(&g, &F);
  REQUIRE(req_first(&F));
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_MSG(s.kv_pages_used >= 7, "F holds %d pages", s.kv_pages_used);
  req_set(&B, PB, 110, bnd, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, ns);
  req_wait(&F);
  EXPECT_EQ_INT(F.finish, FINISH_LENGTH);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {109};
  REQUIRE(cold(&R1, &B, sp, 1) == 0);
  EXPECT_MSG(compare("fresh_pages", &B, &R1), "B restored while F decodes differs from cold");
  int32_t spf[1] = {99};
  REQUIRE(cold(&R2, &F, spf, 1) == 0);
  EXPECT_MSG(compare("fresh_pages_other", &F, &R2), "F differs from cold");
}

/* One device slab and 12 KV pages: A's checkpoint at |S| leaves the device for the host tier
 * (its slab when A's next capture needs the slab, its pages when F needs the pool); B
 * restores it from the host into fresh pages and its slot. */
TEST(restore_from_host_tier) {
  int ns = 80;
  toks(S, ns, 41);
  prompt_make(PA, S, ns, 110, 42, 7);
  prompt_make(PB, S, ns, 105, 43, 8);
  toks(PF, 150, 44);
  PF[0] = 200;
  if (S[0] == 200) PF[0] = 201;
  int32_t bnd[2] = {0, ns};
  rig g;
  rig_opts ro = {.cache = 1, .kv_tokens = 16 * 12, .seqs = 2, .slabs = 4};
  { /* a device budget of 1.5 slabs; a host budget for a few slabs and their pages */
    rig t;
    rig_opts r0 = {0};
    REQUIRE(rig_up(&t, &r0) == 0);
    double gib = 1024.0 * 1024.0 * 1024.0;
    ro.dev_gib = 1.5 * (double)qwen35_slot_bytes(t.m) / gib;
    ro.host_gib = (4.0 * (double)qwen35_slot_bytes(t.m) + 64.0 * (double)qwen35_page_bytes(t.m)) / gib;
    printf("  slot %.2f MB, page %.3f MB, host budget %.1f MB\n", qwen35_slot_bytes(t.m) / 1048576.0,
           qwen35_page_bytes(t.m) / 1048576.0, ro.host_gib * 1024.0);
    rig_down(&t);
  }
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, 110, bnd, 2, NULL, 0);
  req_run(&g, &A);
  req_set(&F, PF, 150, NULL, 0, NULL, 0);
  req_run(&g, &F);
  EXPECT_EQ_INT(F.finish, FINISH_LENGTH);
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_device_slabs_max, 1);
  EXPECT_MSG(s.prefix_demotions >= 2 && s.prefix_host_checkpoints >= 1, "demotions %lld, host checkpoints %d",
             s.prefix_demotions, s.prefix_host_checkpoints);
  req_set(&B, PB, 105, bnd, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, ns);
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_restore_failures, 0);
  EXPECT(s.prefix_host_bytes > 0 && s.prefix_host_bytes <= s.prefix_host_budget_bytes);
  EXPECT(rig_down(&g));
  int32_t sp[1] = {104};
  REQUIRE(cold(&R1, &B, sp, 1) == 0);
  EXPECT_MSG(compare("host_tier", &B, &R1), "restore from the host tier differs from cold");
}

/* Turn 1: X (60 tokens) generates MAXTOK tokens; its end-of-generation checkpoint sits at
 * depth 60 + MAXTOK - 1 (the last generated token was never fed). Turn 2 = X + those tokens +
 * a new message restores that depth. Cold turn 2 splits like turn 1 below it (END 59, then one
 * token per step), at the restored depth, at its boundary and its END. */
TEST(restore_next_turn) {
  toks(PA, 60, 51);
  int32_t b1[1] = {0};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, 60, b1, 1, NULL, 0);
  req_run(&g, &A);
  REQUIRE(A.finish == FINISH_LENGTH && A.n_tok == MAXTOK);
  memcpy(PT, PA, 60 * sizeof *PT);
  memcpy(PT + 60, A.tok, MAXTOK * sizeof *PT);
  int n2 = 60 + MAXTOK + 20;
  toks(PT + 60 + MAXTOK, 20, 52);
  int32_t b2[2] = {0, 60 + MAXTOK};
  req_set(&B, PT, n2, b2, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, 60 + MAXTOK - 1);
  EXPECT(rig_down(&g));
  int32_t sp[MAXTOK + 2];
  int k = 0;
  sp[k++] = 59;
  for (int p = 60; p <= 60 + MAXTOK - 1; p++) sp[k++] = p; /* 1-token steps, then the restored depth */
  sp[k++] = n2 - 1;
  REQUIRE(cold(&R1, &B, sp, k) == 0);
  EXPECT_MSG(compare("next_turn", &B, &R1), "turn 2 differs from cold");
}

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
  const char *d = getenv("DS_REAL_DEVICE");
  if (d && *d) DEV = d;
  const char *bi = getenv("DS_BATCH_INVARIANT");
  STRICT = !strcmp(DEV, "cpu") || (bi && *bi && strcmp(bi, "0") != 0);
  const char *dir = getenv("DS_REAL_MODEL");
  if (!dir || !*dir) dir = "tests/fixtures/models/dense_bf16";
  printf("device %s%s, model %s\n", DEV, STRICT ? " (bit-exact checks)" : "", dir);
  if (model_load(dir, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_create(DEV, 0, err, sizeof err);
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
