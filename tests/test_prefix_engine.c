/* The prefix cache wired into the engine, on the CPU backend over the tiny fixture model:
 * restore parity (bit-identical logits and tokens), shared-prefix coalescing, cached_tokens,
 * salts, the host tier, the continuation of a finished generation, and fault injection at
 * every site, with kv_pages_check, state_pool_check and prefix_cache_check after each test.
 *
 * What "cold" means here. A prefill's floating-point result depends on where it is split
 * (the chunked DeltaNet recurrence restarts at every piece boundary). A restored request R
 * continues from a checkpoint at depth d written by an earlier run W, so R's result equals
 * the result of R computed from scratch with the split points
 *     W's split points below d  +  d  +  R's own split points above d
 * (R's own: its chat boundaries, its capture points -- END = n - 1, the interval points, and
 * DIVERGE, where R's prompt leaves the paths the tree held at R's admission). "Cold" is R
 * submitted to an engine with the prefix cache OFF, with exactly those split points given
 * through engine_submit_opts.split_points (each test spells them out), and its logits and
 * tokens must match the restored run bit for bit. Positions W computed one token per step
 * (its generated tokens) are 1-token split points of the cold run. */
#include "engine/engine.h"

#include <stdatomic.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "base/fault.h"
#include "base/log.h"
#include "model/weights.h"
#include "test.h"

#define MODEL_DIR "tests/fixtures/models/dense_bf16"
#define MAXTOK 6
#define MAXP 400

#include "engine_rig.h"

static int req_same(const req *a, const req *b) {
  return a->finish == b->finish && a->n_tok == b->n_tok && a->n_lg == b->n_lg &&
         memcmp(a->tok, b->tok, (size_t)a->n_tok * sizeof(int32_t)) == 0 &&
         memcmp(a->lg, b->lg, (size_t)(a->n_lg < MAXTOK ? a->n_lg : MAXTOK) * V * sizeof(float)) ==
             0;
}

static req A, B, Cq, F, Q8[8], QREF[8];
static int32_t S[MAXP], PA[MAXP];

/* ---- parity ---------------------------------------------------------------------------- */

/* The restore-parity cases (tests/restore_cases.h): here restored == cold to the bit. */
static int restore_same(const char *name, const req *a, const req *cold_run) {
  (void)name;
  return req_same(a, cold_run);
}
#include "restore_cases.h"

TEST(parity_cut_on_page_boundary) { restore_case_shared_head("page_boundary", 80); }
TEST(parity_cut_mid_page) {
  restore_case_shared_head("partial_final_page", 90); /* copy-on-write */
}
TEST(parity_cut_mid_message) { restore_case_mid_message("mid_message"); }
TEST(parity_fresh_pages_while_decoding) {
  restore_case_fresh_pages("fresh_pages", "fresh_pages_other");
}
TEST(parity_restore_from_host_tier) { restore_case_host_tier("host_tier"); }
TEST(parity_next_turn_hits_end_of_generation) { restore_case_next_turn("next_turn"); }

/* ---- coalescing ------------------------------------------------------------------------ */

/* 8 requests S (200) + 20-token suffixes, submitted at once: the prefix is computed once
 * (one request computes 220 tokens, seven restore |S| and compute 20 each: 360 tokens)
 * against 8 x 220 = 1760 without the cache; outputs identical to the cache-off run given the
 * same split points (boundary 200, END 219; DIVERGE is 0 or 200, restores are at 200). */
static long long prefilled_8(int cache, req *q, int32_t p[8][MAXP], const int32_t *bnd) {
  rig g;
  rig_opts ro = {.cache = cache, .seqs = 8};
  if (rig_up(&g, &ro) != 0) return -1;
  static const int32_t end[1] = {219}; /* the cache-off run gets the END split explicitly */
  for (int i = 0; i < 8; i++) {
    req_set(&q[i], p[i], 220, bnd, 2, cache ? NULL : end, cache ? 0 : 1);
    req_submit(&g, &q[i]);
  }
  for (int i = 0; i < 8; i++) req_wait(&q[i]);
  engine_stats s;
  engine_get_stats(g.e, &s);
  if (!rig_down(&g)) return -1;
  return s.prefilled_tokens_total;
}

static int32_t P8[8][MAXP];

TEST(coalesce_shared_prefix_8) {
  toks(S, 200, 61);
  for (int i = 0; i < 8; i++) prompt_make(P8[i], S, 200, 220, 70 + i, 100 + i);
  int32_t bnd[2] = {0, 200};
  long long off = prefilled_8(0, QREF, P8, bnd);
  long long on = prefilled_8(1, Q8, P8, bnd);
  printf("  8-way shared prefix: prefilled tokens %lld with the cache, %lld without\n", on, off);
  EXPECT_EQ_INT(off, 8 * 220);
  EXPECT_EQ_INT(on, 220 + 7 * 20);
  int hits = 0;
  for (int i = 0; i < 8; i++) {
    EXPECT_MSG(req_same(&Q8[i], &QREF[i]), "request %d differs from the cache-off run", i);
    EXPECT_MSG(Q8[i].cached == 0 || Q8[i].cached == 200, "cached %d", Q8[i].cached);
    hits += Q8[i].cached == 200;
  }
  EXPECT_EQ_INT(hits, 7);
}

/* ---- the shared-prefix wave ------------------------------------------------------------ */

/* 8 requests = one uncached 1,250-token prefix + distinct 50-token suffixes, queued together
 * (budget 512, interval 256: the bench's 8 x 12,475 + 50 wave scaled down by 10). A 1-token
 * "gate" request holds the engine thread in its logits callback until all eight are queued,
 * so they reach the scheduler in one step. Expected (tests/test_sched.c computes the same
 * schedule): gate 1 step; r0 alone [0,512) [512,1024) [1024,1250), where the seven others
 * asked it for a checkpoint; then r0 and the seven restored at 1,250 prefill [1250,1299)
 * together; then everyone's [1299,1300) samples the first token; then 5 decode steps.
 * Outputs equal cold runs with the split points {1250 (divergence), 1299 (END)} (r0's piece
 * ends at 512 and 1024 are multiples of 64: no bit changes there). */
#define WAVE_P 1250
#define WAVE_L 1300
static int32_t PW[8][WAVE_L], PG[1];
static req QW[8], QWREF[8], GATE;
static atomic_int gate_open, gate_in;

static void gate_logits(void *user, const float *l, int n) {
  (void)user;
  (void)l;
  (void)n;
  atomic_store(&gate_in, 1);
  for (int i = 0; i < 60000 && !atomic_load(&gate_open); i++) usleep(1000);
}

TEST(shared_prefix_wave_8) {
  toks(PW[0], WAVE_P, 91);
  for (int i = 0; i < 8; i++) prompt_make(PW[i], PW[0], WAVE_P, WAVE_L, 92 + i, 100 + i);
  PG[0] = 255;
  rig g;
  rig_opts ro = {.cache = 1, .seqs = 9, .budget = 512, .interval = 256};
  REQUIRE(rig_up(&g, &ro) == 0);
  atomic_store(&gate_open, 0);
  atomic_store(&gate_in, 0);
  memset(&GATE, 0, sizeof GATE);
  GATE.prompt = PG;
  GATE.n = 1;
  GATE.max_tokens = 1;
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  so.prompt = PG;
  so.n_prompt = 1;
  sampling_params_default(&so.sp);
  so.sp.temperature = 0;
  so.sp.max_tokens = 1;
  so.sp.ignore_eos = 1;
  so.on_logits = gate_logits;
  engine_status st;
  char err[200];
  GATE.h = engine_submit(g.e, &so, &st, err, sizeof err);
  REQUIRE(GATE.h);
  for (int i = 0; i < 60000 && !atomic_load(&gate_in); i++) usleep(1000);
  for (int i = 0; i < 8; i++) {
    req_set(&QW[i], PW[i], WAVE_L, NULL, 0, NULL, 0);
    req_submit(&g, &QW[i]);
  }
  atomic_store(&gate_open, 1);
  req_wait(&GATE);
  for (int i = 0; i < 8; i++) req_wait(&QW[i]);
  /* engine_check runs on the engine thread after the last step, so the stats read next are
   * that step's (the last events reach us before the thread publishes its snapshot) */
  char cerr[200];
  EXPECT(engine_check(g.e, cerr, sizeof cerr) == 0);
  engine_stats s;
  engine_get_stats(g.e, &s);
  printf("  wave: %lld steps, %lld tokens prefilled, %lld hits\n", s.steps,
         s.prefilled_tokens_total, s.prefix_hits);
  EXPECT_EQ_INT(s.steps, 1 + 5 + 5);
  EXPECT_EQ_INT(s.prefilled_tokens_total, 1 + WAVE_L + 7 * (WAVE_L - WAVE_P));
  EXPECT_EQ_INT(s.prefix_hits, 7);
  EXPECT_EQ_INT(QW[0].cached, 0);
  for (int i = 1; i < 8; i++) EXPECT_MSG(QW[i].cached == WAVE_P, "r%d cached %d", i, QW[i].cached);
  EXPECT(rig_down(&g));
  /* cold: cache off, the same split points, all eight together (batch invariance) */
  static const int32_t sp[2] = {WAVE_P, WAVE_L - 1};
  rig_opts off = {0};
  REQUIRE(rig_up(&g, &off) == 0);
  for (int i = 0; i < 8; i++) {
    req_set(&QWREF[i], PW[i], WAVE_L, NULL, 0, sp, 2);
    req_submit(&g, &QWREF[i]);
  }
  for (int i = 0; i < 8; i++) req_wait(&QWREF[i]);
  EXPECT(rig_down(&g));
  for (int i = 0; i < 8; i++)
    EXPECT_MSG(req_same(&QW[i], &QWREF[i]), "wave request %d differs from cold", i);
}

/* ---- cached_tokens and salts ----------------------------------------------------------- */

TEST(salt_isolation_and_cached_tokens) {
  toks(PA, 70, 81);
  int32_t bnd[1] = {0};
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  req_set(&A, PA, 70, bnd, 1, NULL, 0);
  A.salt = "tenant-a";
  req_run(&g, &A);
  EXPECT_EQ_INT(A.cached, 0);
  EXPECT_EQ_INT(A.prompt_tokens, 70);
  req_set(&B, PA, 70, bnd, 1, NULL, 0);
  B.salt = "tenant-b";
  req_run(&g, &B);
  EXPECT_EQ_INT(B.cached, 0);
  req_set(&Cq, PA, 70, bnd, 1, NULL, 0); /* the shared namespace */
  req_run(&g, &Cq);
  EXPECT_EQ_INT(Cq.cached, 0);
  req_set(&F, PA, 70, bnd, 1, NULL, 0);
  F.salt = "tenant-a";
  req_run(&g, &F);
  EXPECT_EQ_INT(F.cached, 69); /* its own END checkpoint, one token recomputed */
  EXPECT_MSG(req_same(&A, &F) && req_same(&A, &B) && req_same(&A, &Cq),
             "same prompt, same splits: outputs differ");
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_hits, 1);
  EXPECT(rig_down(&g));
}

/* ---- faults ---------------------------------------------------------------------------- */

/* The fault scenario: S (90 tokens, mid-page) shared by A, B, C (bounds {0, 90}, suffix first
 * tokens distinct), with the host tier and one device slab: A; then B and C together; then A
 * again. Every split point is a function of the request alone (DIVERGE is 0, 90 or past the
 * prompt, END is n - 1), so every request that finishes must equal its cold reference. */
static req FR[3];
static const int FN[3] = {110, 115, 105};
static int32_t FP[3][MAXP];
static double FDEV;

static int fault_scenario(rig_opts *ro, long n, const char *site, int must_succeed, char *why,
                          size_t wn) {
  rig g;
  if (rig_up(&g, ro) != 0) return snprintf(why, wn, "rig"), 0;
  int32_t bnd[2] = {0, 90};
  req q[4];
  memset(q, 0, sizeof q);
  int order[4] = {0, 1, 2, 0};
  for (int k = 0; k < 4; k++) req_set(&q[k], FP[order[k]], FN[order[k]], bnd, 2, NULL, 0);
  if (n > 0) fault_arm(n, site, 0);
  req_run(&g, &q[0]);
  req_submit(&g, &q[1]);
  req_submit(&g, &q[2]);
  req_wait(&q[1]);
  req_wait(&q[2]);
  req_run(&g, &q[3]);
  int fired = fault_fired();
  fault_disarm();
  int ok = 1;
  for (int k = 0; k < 4 && ok; k++) {
    const req *ref = &FR[order[k]];
    if (q[k].finish == FINISH_LENGTH) {
      if (!req_same(&q[k], ref)) ok = 0, snprintf(why, wn, "request %d differs", k);
    } else if (must_succeed || (q[k].finish != -1 && q[k].finish != FINISH_ERROR)) {
      ok = 0, snprintf(why, wn, "request %d finish %d", k, q[k].finish);
    }
  }
  if (ok && !rig_ok(&g, why, wn)) ok = 0;
  rig_down(&g);
  for (int k = 0; k < 4; k++) free(q[k].lg);
  if (!ok) return -1;
  return fired;
}

static void fault_setup(rig_opts *ro) {
  memset(ro, 0, sizeof *ro);
  ro->cache = 1;
  ro->kv_tokens = 16 * 24;
  ro->seqs = 2;
  ro->slabs = 4;
  ro->dev_gib = FDEV;
  ro->host_gib = 0.01;
}

static void fault_refs(void) {
  toks(S, 90, 91);
  for (int i = 0; i < 3; i++) prompt_make(FP[i], S, 90, FN[i], 92 + i, 20 + i);
  int32_t bnd[2] = {0, 90};
  for (int i = 0; i < 3; i++) {
    req q;
    memset(&q, 0, sizeof q);
    req_set(&q, FP[i], FN[i], bnd, 2, NULL, 0);
    int32_t sp[1] = {FN[i] - 1};
    cold(&FR[i], &q, sp, 1);
    free(q.lg);
  }
  rig t;
  rig_opts r0 = {0};
  if (rig_up(&t, &r0) == 0) {
    FDEV = 1.5 * (double)qwen35_slot_bytes(t.m) / (1024.0 * 1024.0 * 1024.0);
    rig_down(&t);
  }
}

/* no fault: the scenario restores (device and host) and matches the cold references */
TEST(fault_scenario_clean) {
  rig_opts ro;
  fault_setup(&ro);
  char why[300] = "";
  EXPECT_MSG(fault_scenario(&ro, 0, NULL, 1, why, sizeof why) == 0, "%s", why);
}

/* every site of the prefix cache, each hit in turn: captures and restores fail, requests
 * never do (a failed restore admits cold; a failed capture keeps the incumbent) */
TEST(fault_every_cache_site) {
  static const char *const sites[] = {
      "state_pool_copy",  "state_pool_slab_alloc", "checkpoint_pages",
      "prefix_cache_rec", "checkpoint_page_copy",  "host_tier_alloc",
      "host_tier_read",   "host_tier_write",       "request_init_prefix"};
  rig_opts ro;
  fault_setup(&ro);
  int total = 0;
  for (int k = 0; k < (int)(sizeof sites / sizeof *sites); k++) {
    int hits = 0;
    for (long n = 1; n < 200; n++) {
      char why[300] = "";
      int must = strcmp(sites[k], "request_init_prefix") != 0;
      int rc = fault_scenario(&ro, n, sites[k], must, why, sizeof why);
      EXPECT_MSG(rc >= 0, "site %s, hit %ld: %s", sites[k], n, why);
      if (rc <= 0) break;
      hits++;
    }
    EXPECT_MSG(hits > 0, "site %s never hit", sites[k]);
    total += hits;
  }
  printf("  cache sites: %d faults injected\n", total);
}

/* every fault_hit of the run in turn, whatever the site: each request finishes with its cold
 * output or fails cleanly; pools and cache consistent, nothing leaked */
TEST(fault_walk_all_sites) {
  rig_opts ro;
  fault_setup(&ro);
  int n_faults = 0;
  for (long n = 1; n < 2000; n++) {
    char why[300] = "";
    int rc = fault_scenario(&ro, n, NULL, 0, why, sizeof why);
    EXPECT_MSG(rc >= 0, "fault %ld: %s", n, why);
    if (rc <= 0) break;
    n_faults++;
  }
  printf("  all sites: %d faults injected\n", n_faults);
  EXPECT_MSG(n_faults >= 20, "only %d faults", n_faults);
}

/* a restore that fails (its copy-on-write copy) admits cold with the same output, drops the
 * checkpoint, and the next request finds B's own capture at the same depth */
TEST(restore_failure_admits_cold) {
  rig g;
  rig_opts ro = {.cache = 1};
  REQUIRE(rig_up(&g, &ro) == 0);
  int32_t bnd[2] = {0, 90};
  req_set(&A, FP[0], FN[0], bnd, 2, NULL, 0);
  req_run(&g, &A);
  fault_arm(1, "checkpoint_page_copy", 0);
  req_set(&B, FP[1], FN[1], bnd, 2, NULL, 0);
  req_run(&g, &B);
  EXPECT(fault_fired());
  fault_disarm();
  EXPECT_EQ_INT(B.cached, 0);
  EXPECT_MSG(req_same(&B, &FR[1]), "B after a failed restore differs");
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT_EQ_INT(s.prefix_restore_failures, 1);
  req_set(&Cq, FP[2], FN[2], bnd, 2, NULL, 0);
  req_run(&g, &Cq);
  EXPECT_EQ_INT(Cq.cached, 90);
  EXPECT_MSG(req_same(&Cq, &FR[2]), "C differs");
  char why[300];
  EXPECT_MSG(rig_ok(&g, why, sizeof why), "%s", why);
  EXPECT(rig_down(&g));
}

int main(void) {
  char err[256];
  RIG_LOG_STEPS = getenv("DS_TEST_LOG_STEPS") != NULL; /* the engine's step lines, to debug */
  log_set_level(RIG_LOG_STEPS ? LOG_LEVEL_INFO : LOG_LEVEL_WARN);
  if (model_load(MODEL_DIR, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_cpu_create(2);
  if (!BE) {
    printf("FAIL backend\n");
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(parity_cut_on_page_boundary);
  RUN(parity_cut_mid_page);
  RUN(parity_cut_mid_message);
  RUN(parity_fresh_pages_while_decoding);
  RUN(parity_restore_from_host_tier);
  RUN(parity_next_turn_hits_end_of_generation);
  RUN(coalesce_shared_prefix_8);
  RUN(shared_prefix_wave_8);
  RUN(salt_isolation_and_cached_tokens);
  fault_refs();
  RUN(fault_scenario_clean);
  RUN(restore_failure_admits_cold);
  RUN(fault_every_cache_site);
  RUN(fault_walk_all_sites);
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
