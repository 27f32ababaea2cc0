/* engine on the CPU backend over the tiny fixture model: batch invariance of tokens AND logits
 * (alone vs. with up to 15 others, several chunk budgets, after preemption), rejection vs.
 * waiting, fault injection at every allocation site, cancellation from another thread, and
 * the page/slot integrity check after each scenario.
 *
 * The invariance tests run with the prefix cache off (they test the scheduler's split rule:
 * with the cache on, a prompt's split points also depend on what the cache holds, see
 * sched.h), and again with it on over prompts whose first tokens all differ, so that no
 * prompt shares a path with another: then every split point is a function of the request
 * alone and re-runs (which restore from their own checkpoints) must stay bit-identical,
 * preemption included. tests/test_prefix_engine.c tests the cache itself. */
#include "engine/engine.h"

#include <pthread.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "base/fault.h"
#include "base/log.h"
#include "model/weights.h"
#include "test.h"

#define MODEL_DIR "tests/fixtures/models/dense_bf16"
#define NREQ 16
#define MAXTOK 6

#include "engine_rig.h"

static int CACHE; /* te_up: prefix cache on */
/* te_up: rig_opts.ahead, device_sample and threads (0: the engine's defaults) */
static int AHEAD, DEV_SAMPLE, THREADS;

/* the rig (engine_rig.h) with this file's settings: with the cache on, pages evicted under
 * pressure go to the host tier; the default snapshot slab count (max(16, 2 x max_num_seqs)) */
static int te_up(rig *g, int budget, int kv_tokens, int seqs) {
  rig_opts ro = {0};
  ro.cache = CACHE;
  ro.budget = budget;
  ro.kv_tokens = kv_tokens;
  ro.seqs = seqs;
  ro.host_gib = CACHE ? 0.01 : 0;
  ro.ahead = AHEAD;
  ro.device_sample = DEV_SAMPLE;
  ro.threads = THREADS;
  return rig_up(g, &ro);
}

typedef struct out {
  int32_t tok[MAXTOK];
  int n;
  float *lg; /* [MAXTOK, vocab] logits rows seen by the sampler */
  int n_lg;
  int finish;
} out;

static void out_logits(void *user, const float *l, int n) {
  out *o = user;
  if (o->n_lg < MAXTOK) memcpy(o->lg + (size_t)o->n_lg * n, l, (size_t)n * sizeof *l);
  o->n_lg++;
}

static int32_t P[NREQ][300];
static const int LEN[NREQ] = {1, 5, 63, 64, 65, 100, 130, 17, 200, 33, 7, 129, 90, 3, 150, 70};

static void prompts_init(void) {
  uint32_t x = 12345;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < LEN[i]; j++) {
      x = x * 1103515245u + 12345u;
      P[i][j] = (int32_t)((x >> 8) % 256);
    }
}

static void sp_greedy(sampling_params *sp) {
  sampling_params_default(sp);
  sp->temperature = 0;
  sp->max_tokens = MAXTOK;
  sp->ignore_eos = 1;
}

/* run_set's response_format: each request under a JSON mask over this vocabulary (NULL: none),
 * following this schema when set (compiled once per request: the engine takes it) */
static const json_vocab *RUN_JSON;
static const char *RUN_SCHEMA;
/* run_set without the logits callback (its rows may then be sampled by the backend's op), and
 * the requests of parity RUN_PENALISED (-1: none) with a repetition penalty (rows the op cannot
 * take: their steps are sampled on the host) */
static int RUN_NO_LOGITS, RUN_PENALISED = -1;

/* runs requests idx[0..n) concurrently; returns the number that finished without error */
static int run_set(rig *g, const int *idx, int n, out *res, const sampling_params *spo) {
  engine_req *h[NREQ];
  int ok = 0;
  for (int k = 0; k < n; k++) {
    int i = idx[k];
    res[i].n = res[i].n_lg = 0;
    res[i].finish = FINISH_NONE;
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = P[i];
    so.n_prompt = LEN[i];
    if (spo)
      so.sp = *spo;
    else
      sp_greedy(&so.sp);
    if (RUN_PENALISED >= 0 && i % 2 == RUN_PENALISED) so.sp.repetition_penalty = 1.1f;
    so.on_logits = RUN_NO_LOGITS ? NULL : out_logits;
    so.user = &res[i];
    so.json = RUN_JSON;
    if (RUN_SCHEMA) {
      json_t *js = json_loads(RUN_SCHEMA, 0, NULL);
      so.schema = js ? json_schema_compile(js, NULL, 0) : NULL;
      json_decref(js);
      CHECK(so.schema != NULL);
    }
    engine_status st;
    char err[200];
    h[k] = engine_submit(g->e, &so, &st, err, sizeof err);
    if (!h[k]) res[i].finish = -1;
  }
  for (int k = 0; k < n; k++) {
    if (!h[k]) continue;
    out *o = &res[idx[k]];
    o->finish = rig_collect(h[k], o->tok, MAXTOK, &o->n);
    if (o->finish == FINISH_LENGTH || o->finish == FINISH_STOP) ok++;
    engine_release(h[k]);
  }
  return ok;
}

static out REF[NREQ], GOT[NREQ];

static void outs_alloc(out *o) {
  for (int i = 0; i < NREQ; i++) o[i].lg = malloc((size_t)MAXTOK * V * sizeof(float));
}

static int same(const out *a, const out *b) {
  return a->n == b->n && a->n_lg == b->n_lg && a->finish == b->finish &&
         memcmp(a->tok, b->tok, (size_t)a->n * sizeof(int32_t)) == 0 &&
         memcmp(a->lg, b->lg, (size_t)a->n_lg * V * sizeof(float)) == 0;
}

static void invariance(int budget, int kv_tokens, int expect_preempt) {
  rig g;
  REQUIRE(te_up(&g, budget, 0, 16) == 0);
  for (int i = 0; i < NREQ; i++) {
    int idx = i;
    EXPECT(run_set(&g, &idx, 1, REF, NULL) == 1);
    EXPECT_EQ_INT(REF[i].n, MAXTOK);
  }
  EXPECT(rig_down(&g));
  REQUIRE(te_up(&g, budget, kv_tokens, 16) == 0);
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  EXPECT_EQ_INT(run_set(&g, all, NREQ, GOT, NULL), NREQ);
  for (int i = 0; i < NREQ; i++)
    EXPECT_MSG(same(&REF[i], &GOT[i]), "budget %d: request %d (len %d) differs batched", budget, i,
               LEN[i]);
  /* a few smaller mixes, in another order */
  int mix[5] = {8, 0, 4, 13, 11};
  EXPECT_EQ_INT(run_set(&g, mix, 5, GOT, NULL), 5);
  for (int k = 0; k < 5; k++)
    EXPECT_MSG(same(&REF[mix[k]], &GOT[mix[k]]), "budget %d: mix request %d differs", budget,
               mix[k]);
  engine_stats s;
  engine_get_stats(g.e, &s);
  if (expect_preempt) EXPECT_MSG(s.preemptions > 0, "no preemption happened");
  if (CACHE) /* the mix re-runs restore from their own checkpoints */
    EXPECT_MSG(s.prefix_hits >= 4 && s.prefix_restore_failures == 0, "prefix hits %lld",
               s.prefix_hits);
  EXPECT(rig_down(&g));
}

/* the prefix cache on, over prompts with distinct first tokens (restored afterwards) */
static void invariance_cache(int budget, int kv_tokens, int expect_preempt) {
  int32_t first[NREQ];
  for (int i = 0; i < NREQ; i++) {
    first[i] = P[i][0];
    P[i][0] = 10 + i;
  }
  CACHE = 1;
  invariance(budget, kv_tokens, expect_preempt);
  CACHE = 0;
  for (int i = 0; i < NREQ; i++) P[i][0] = first[i];
}

TEST(invariance_budget_8192) { invariance(8192, 0, 0); }
TEST(invariance_budget_64) { invariance(64, 0, 0); }
TEST(invariance_budget_100) { invariance(100, 0, 0); }
TEST(invariance_budget_37) { invariance(37, 0, 0); }
TEST(invariance_budget_1) { invariance(1, 0, 0); }
TEST(invariance_preempted) { invariance(8192, 16 * 14, 1); }
TEST(invariance_preempted_budget_37) { invariance(37, 16 * 14, 1); }
TEST(invariance_cache_budget_8192) { invariance_cache(8192, 0, 0); }
TEST(invariance_cache_budget_37) { invariance_cache(37, 0, 0); }
TEST(invariance_cache_preempted) { invariance_cache(8192, 16 * 14, 1); }
TEST(invariance_cache_preempted_budget_37) { invariance_cache(37, 16 * 14, 1); }

/* engine_mem_split_plan over fake numbers (MiB): 80 GiB device, 16 GiB weights, 1 MiB pages,
 * 64 MiB slots, 2 GiB scratch, utilisation 0.9, 8 sequences:
 *   B = 0.9 x 81920 - 16384 - 8 x 64 - 2048 = 54784 MiB (free 79 GiB does not bind);
 *   slabs 25% = 13696 MiB = 214 slabs, capped at max(16, 4 x 8) = 32 (2048 MiB);
 *   KV = 54784 - 2048 = 52736 pages. */
/* engine_opts.startup_forward: the largest step once before any request (page ids from 0,
 * slot 0) leaves no trace: every request's tokens and logits are bit-identical to an engine
 * without it, alone and batched, and the pools check clean. */
TEST(startup_forward_leaves_no_trace) {
  rig g;
  REQUIRE(te_up(&g, 300, 0, 16) == 0); /* the same budget: the same split points */
  for (int i = 0; i < NREQ; i++) {
    int idx = i;
    EXPECT(run_set(&g, &idx, 1, REF, NULL) == 1);
  }
  EXPECT(rig_down(&g));
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_batched_tokens = 300; /* the forward covers every prompt's pages and slot 0 */
  o.max_num_seqs = 16;
  o.enable_prefix_caching = CACHE; /* as te_up: off */
  o.startup_forward = 1;
  qwen35_mem_opts mo;
  char err[200];
  REQUIRE(engine_mem_plan(&o, &C, &mo, err, sizeof err) == 0);
  REQUIRE(qwen35_init(&g.m, &C, &W, BE, &mo, err, sizeof err) == 0);
  g.e = engine_create(g.m, &o, err, sizeof err);
  EXPECT_MSG(g.e != NULL, "%s", err);
  if (!g.e) {
    qwen35_free(g.m);
    return;
  }
  int first = 0; /* alone first: it takes slot 0 and page 0 onwards, which the forward dirtied */
  EXPECT(run_set(&g, &first, 1, GOT, NULL) == 1);
  EXPECT_MSG(same(&REF[0], &GOT[0]), "request 0 differs after the start-up forward");
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  EXPECT_EQ_INT(run_set(&g, all, NREQ, GOT, NULL), NREQ);
  for (int i = 0; i < NREQ; i++)
    EXPECT_MSG(same(&REF[i], &GOT[i]), "request %d (len %d) differs after the start-up forward", i,
               LEN[i]);
  EXPECT(rig_down(&g));
}

/* Steps ahead (engine_step.c engine_step_flight): plain-greedy requests give the same tokens
 * and finishes with steps ahead on as off (engine_rig.h rig_ahead_case), with the prefix cache
 * off and on (with the cache, a finished generation checkpoints at the depth its state covers).
 * On this backend read_start completes at once, so a chained step's tokens are the ids of the
 * step just issued. */
static void ahead_case(int cache) {
  const int32_t *prompts[NREQ];
  for (int i = 0; i < NREQ; i++) prompts[i] = P[i];
  rig_opts ro = {0};
  ro.cache = cache;
  ro.budget = 8192;
  ro.seqs = 16;
  ro.host_gib = cache ? 0.01 : 0; /* as te_up */
  rig_ahead_case(&ro, prompts, LEN, NREQ, 2);
}
TEST(ahead_same_tokens) { ahead_case(0); }
TEST(ahead_same_tokens_cache) { ahead_case(1); }

/* Sampled steps ahead (engine_step.c engine_step_flight_sampled): the sample op's tokens with steps
 * issued ahead, and without, are the host sampler's (engine_rig.h rig_device_sample_case). */
TEST(device_sample_ahead_same_tokens) {
  const int32_t *prompts[NREQ];
  for (int i = 0; i < NREQ; i++) prompts[i] = P[i];
  rig_opts ro = {0};
  ro.budget = 8192;
  ro.seqs = 16;
  rig_device_sample_case(&ro, prompts, LEN, NREQ);
}

TEST(mem_plan_from_device_memory) {
  const size_t M = (size_t)1 << 20;
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_seqs = 8;
  engine_mem_facts f = {81920 * M, 80896 * M, 16384 * M, 1 * M, 64 * M, 2048 * M, 0};
  engine_mem_split sp;
  char err[300];
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.budget_bytes / M, 54784);
  EXPECT_EQ_INT(sp.n_slabs, 32);
  EXPECT_EQ_INT(sp.n_pages, 52736);
  EXPECT_EQ_INT(sp.kv_bytes / M + sp.slab_bytes / M, 54784);
  /* --prefix-cache-gib 4: 4096 / 64 = 64 slabs, not capped; KV 54784 - 4096 */
  o.prefix_cache_gib = 4;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_slabs, 64);
  EXPECT_EQ_INT(sp.n_pages, 50688);
  o.prefix_cache_gib = 0;
  /* --snapshot-slabs 10 */
  o.n_snapshot_slabs = 10;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_slabs, 10);
  EXPECT_EQ_INT(sp.n_pages, 54784 - 640);
  o.n_snapshot_slabs = 0;
  /* speculative decoding, k = 3: 3 x 8 more state slots (the verify steps' per-position states),
   * B = 54784 - 24 x 64 = 53248; slabs capped at 32; KV 53248 - 2048 */
  o.spec.method = SPEC_METHOD_NGRAM;
  o.spec.k = 3;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.keep_lanes, 8);
  EXPECT_EQ_INT(sp.budget_bytes / M, 53248);
  EXPECT_EQ_INT(sp.n_slabs, 32);
  EXPECT_EQ_INT(sp.n_pages, 51200);
  /* disable_by_batch_size 2: no step of more than 2 sequences drafts, so 2 lanes: 54784 - 384 */
  o.spec.disable_by_batch_size = 2;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.keep_lanes, 2);
  EXPECT_EQ_INT(sp.budget_bytes / M, 54400);
  o.spec.disable_by_batch_size = 0;
  /* little free memory: 1536 MiB after the sequences' slots; a lane is 3 x 64 = 192 MiB, and
   * the lanes take at most half: 4 of the 8, B = 1536 - 768 */
  f.free_bytes = 20480 * M;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.keep_lanes, 4);
  EXPECT_EQ_INT(sp.budget_bytes / M, 768);
  /* 300 MiB left: not one lane in half of it, refused with the reason */
  f.free_bytes = (19244) * M;
  EXPECT(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) != 0);
  EXPECT_MSG(strstr(err, "speculative decoding") != NULL, "%s", err);
  f.free_bytes = 80896 * M;
  o.spec.method = SPEC_METHOD_NONE;
  o.spec.k = 0;
  /* little free memory binds: B = 20480 - 18944 = 1536; slabs 384 MiB = 6; KV 1152 */
  f.free_bytes = 20480 * M;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.budget_bytes / M, 1536);
  EXPECT_EQ_INT(sp.n_slabs, 6);
  EXPECT_EQ_INT(sp.n_pages, 1152);
  /* --kv-cache-tokens 24000 (1500 pages): 36 MiB left, no slab fits */
  o.kv_cache_tokens = 24000;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_pages, 1500);
  EXPECT_EQ_INT(sp.n_slabs, 0);
  /* --kv-cache-tokens 16000 (1000 pages) on the big budget: the default 16 slabs */
  f.free_bytes = 80896 * M;
  o.kv_cache_tokens = 16000;
  REQUIRE(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_pages, 1000);
  EXPECT_EQ_INT(sp.n_slabs, 16);
  o.kv_cache_tokens = 0;
  /* not enough memory: one clear error */
  f.free_bytes = 18 * 1024 * M;
  EXPECT(engine_mem_split_plan(&o, &f, &sp, err, sizeof err) == -1);
  EXPECT(strstr(err, "not enough device memory") != NULL);
  /* no device figure (the CPU backend): today's sizes, the default slab count */
  REQUIRE(engine_mem_split_plan(&o, NULL, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_pages, 32768 / 16);
  EXPECT_EQ_INT(sp.n_slabs, 16);
  o.max_num_seqs = 64;
  REQUIRE(engine_mem_split_plan(&o, NULL, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_slabs, 128);
  o.enable_prefix_caching = 0;
  REQUIRE(engine_mem_split_plan(&o, NULL, &sp, err, sizeof err) == 0);
  EXPECT_EQ_INT(sp.n_slabs, 0);
  /* the CPU backend has no figure: engine_mem_plan_device falls back to engine_mem_plan */
  engine_opts_default(&o);
  qwen35_mem_opts mo;
  REQUIRE(engine_mem_plan_device(&o, &C, &W, &BE, 1, &mo, err, sizeof err) == 0);
  EXPECT_EQ_INT(mo.n_pages, 2048);
  EXPECT_EQ_INT(mo.n_slots, 64 + 128);
}

/* --packed-weights: the rule, and the copies' bytes a checkpoint would take (1.5 a value and 4 a
 * row for the dense layers' product weights whose width is a multiple of 512, at most 24,576;
 * MoE layers' FFN and every other tensor left out). */
TEST(packed_weights_plan) {
  EXPECT_EQ_INT(engine_mem_packed_choice(-1, 7.4e9, 5.4e9, 0, 141e9), 1); /* 4B on an H200 */
  EXPECT_EQ_INT(engine_mem_packed_choice(-1, 54e9, 40e9, 0, 141e9), 0);   /* 27B: over half */
  EXPECT_EQ_INT(engine_mem_packed_choice(1, 54e9, 40e9, 0, 141e9), 1);    /* asked */
  EXPECT_EQ_INT(engine_mem_packed_choice(0, 7.4e9, 5.4e9, 0, 141e9), 0);
  EXPECT_EQ_INT(engine_mem_packed_choice(-1, 7.4e9, 5.4e9, 0, 0), 0); /* no device figure */
  EXPECT_EQ_INT(engine_mem_packed_choice(1, 7.4e9, 0, 0, 141e9), 0);  /* nothing to pack */
  /* FP8 27B (28 GB, bf16 copies 45 GB): as the bf16 27B's 51 GB, under half: kept */
  EXPECT_EQ_INT(engine_mem_packed_choice(-1, 28e9, 45e9, 45e9, 141e9), 1);
  /* FP8 80B (80 GB, copies 160 GB): its bf16 size is over half: none */
  EXPECT_EQ_INT(engine_mem_packed_choice(-1, 80e9, 160e9, 160e9, 141e9), 0);
  model_config pc;
  memset(&pc, 0, sizeof pc);
  pc.n_layers = 2;
  pc.layer_is_moe[1] = 1;
  layer_weights lw[2];
  memset(lw, 0, sizeof lw);
  static const char d[1] = {0};
  const struct {
    int layer;
    tensor *t;
    int64_t rows, cols;
  } ts[] = {{0, &lw[0].in_proj_qkv, 8192, 2560}, {0, &lw[0].in_proj_b, 32, 2560},
            {0, &lw[0].out_proj, 2560, 4096},    {0, &lw[0].gate_proj, 9216, 2560},
            {0, &lw[0].down_proj, 2560, 9216},   {0, &lw[0].conv1d, 8192, 4},
            {0, &lw[0].q_norm, 1, 1024},         {1, &lw[1].q_proj, 100, 1000},
            {1, &lw[1].o_proj, 64, 25600},       {1, &lw[1].k_proj, 64, 512},
            {1, &lw[1].shared_gate, 512, 512}};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
    ts[i].t->data = d;
    ts[i].t->ndim = ts[i].rows == 1 ? 1 : 2;
    ts[i].t->shape[0] = ts[i].rows;
    ts[i].t->shape[1] = ts[i].cols;
  }
  lw[0].q_norm.shape[0] = 1024; /* 1-D */
  model_weights pw;
  memset(&pw, 0, sizeof pw);
  pw.layers = lw;
  double want = 0;
  const int64_t in[][2] = {{8192, 2560}, {32, 2560},   {2560, 4096},
                           {9216, 2560}, {2560, 9216}, {64, 512}};
  for (size_t i = 0; i < sizeof in / sizeof *in; i++)
    want += 1.5 * (double)in[i][0] * (double)in[i][1] + 4.0 * (double)in[i][0];
  double fp8 = -1, got = qwen35_packed_bytes(&pc, &pw, &fp8);
  EXPECT_MSG(got == want, "packed bytes %.0f, want %.0f", got, want);
  EXPECT_MSG(fp8 == 0, "fp8 copies %.0f of a bf16 model", fp8);
}

TEST(seeded_sampling_batched) {
  rig g;
  REQUIRE(te_up(&g, 8192, 0, 16) == 0);
  sampling_params sp;
  sp_greedy(&sp);
  sp.temperature = 0.9f;
  sp.top_p = 0.9f;
  sp.top_k = 50;
  sp.repetition_penalty = 1.1f;
  sp.seed = 77;
  sp.has_seed = 1;
  for (int i = 0; i < 4; i++) {
    int idx = i;
    run_set(&g, &idx, 1, REF, &sp);
  }
  int all[4] = {0, 1, 2, 3};
  EXPECT_EQ_INT(run_set(&g, all, 4, GOT, &sp), 4);
  for (int i = 0; i < 4; i++) EXPECT_MSG(same(&REF[i], &GOT[i]), "seeded request %d differs", i);
  EXPECT(rig_down(&g));
}

/* The same seeded non-greedy requests, all 16 in one batch, give the same tokens and logits
 * whether the rows are sampled inline (--sampler-threads 0) or on 4 sampler threads; and
 * the same as each request alone. Two parameter sets: top-p / min-p, and top-k with
 * penalties and logprobs. */
static out ALONE[NREQ];

TEST(sampler_threads_same_tokens) {
  outs_alloc(ALONE);
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  for (int set = 0; set < 2; set++) {
    sampling_params sp;
    sp_greedy(&sp);
    sp.temperature = set ? 0.8f : 1.0f;
    sp.top_p = set ? 0.9f : 0.95f;
    sp.min_p = set ? 0.0f : 0.01f;
    sp.top_k = set ? 40 : 0;
    sp.repetition_penalty = set ? 1.2f : 1.0f;
    sp.frequency_penalty = set ? 0.3f : 0.0f;
    sp.logprobs = set;
    sp.top_logprobs = set ? 5 : 0;
    sp.seed = 1000 + (uint64_t)set;
    sp.has_seed = 1;
    rig g;
    THREADS = 1; /* none */
    REQUIRE(te_up(&g, 8192, 0, 16) == 0);
    EXPECT_EQ_INT(run_set(&g, all, NREQ, REF, &sp), NREQ);
    for (int i = 0; i < NREQ; i++) {
      int idx = i;
      EXPECT(run_set(&g, &idx, 1, ALONE, &sp) == 1);
    }
    EXPECT(rig_down(&g));
    THREADS = 1 + 4;
    REQUIRE(te_up(&g, 8192, 0, 16) == 0);
    EXPECT_EQ_INT(run_set(&g, all, NREQ, GOT, &sp), NREQ);
    EXPECT(rig_down(&g));
    int distinct = 0;
    for (int i = 0; i < NREQ; i++) {
      EXPECT_EQ_INT(GOT[i].n, MAXTOK);
      EXPECT_MSG(same(&REF[i], &GOT[i]), "set %d: request %d differs with 4 sampler threads", set,
                 i);
      EXPECT_MSG(same(&REF[i], &ALONE[i]), "set %d: request %d differs alone", set, i);
      for (int k = 1; k < GOT[i].n; k++) distinct |= GOT[i].tok[k] != GOT[i].tok[0];
    }
    EXPECT_MSG(distinct, "set %d: every request repeats one token", set);
  }
  THREADS = 0;
  for (int i = 0; i < NREQ; i++) free(ALONE[i].lg);
}

/* Sampled steps picked by the backend's sample op (engine_opts.device_sample 1; on the CPU
 * backend, the op's radix descent) give the host sampler's tokens (0): 16 seeded requests at
 * once and each alone, three parameter sets (top-k + top-p, top-p + min-p, temperature alone),
 * a set where every other request has a repetition penalty (its steps go to the host while
 * such a request runs), and a set with frequency and presence penalties, logit_bias and
 * min_tokens before a stop token (the rows' edits). The op path is taken (steps counted)
 * exactly when it may be. */
TEST(device_sample_same_tokens) {
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  RUN_NO_LOGITS = 1;
  for (int set = 0; set < 5; set++) {
    sampling_params sp;
    sp_greedy(&sp);
    sp.temperature = set == 0 ? 0.8f : set == 1 ? 1.0f : 0.7f;
    sp.top_k = set == 0 ? 40 : 0;
    sp.top_p = set == 0 ? 0.9f : set == 1 ? 0.95f : 1.0f;
    sp.min_p = set == 1 ? 0.02f : 0.0f;
    sp.seed = 500 + (uint64_t)set;
    sp.has_seed = 1;
    if (set == 4) {
      sp.frequency_penalty = 0.7f;
      sp.presence_penalty = -0.4f;
      sp.n_bias = 2;
      sp.bias_ids[0] = 7;
      sp.bias[0] = 3.5f;
      sp.bias_ids[1] = 200;
      sp.bias[1] = -2.0f;
      sp.stop_ids[0] = 9;
      sp.n_stop_ids = 1;
      sp.min_tokens = MAXTOK / 2;
    }
    RUN_PENALISED = set == 3 ? 1 : -1;
    long long dev_steps[2] = {0, 0};
    for (int dev = 0; dev < 2; dev++) {
      DEV_SAMPLE = dev ? 1 : -1;
      rig g;
      REQUIRE(te_up(&g, 8192, 0, 16) == 0);
      out *o = dev ? GOT : REF;
      EXPECT_EQ_INT(run_set(&g, all, NREQ, o, &sp), NREQ);
      if (dev)
        for (int i = 0; i < NREQ; i++) {
          int idx = i;
          EXPECT(run_set(&g, &idx, 1, ALONE, &sp) == 1);
        }
      engine_stats st;
      engine_get_stats(g.e, &st);
      dev_steps[dev] = st.steps_device_sampled;
      EXPECT(rig_down(&g));
    }
    EXPECT_MSG(dev_steps[0] == 0, "set %d: %lld steps sampled by the op with it off", set,
               dev_steps[0]);
    EXPECT_MSG(dev_steps[1] >= (set == 3 ? NREQ / 2 : NREQ * (MAXTOK - 1)),
               "set %d: only %lld steps sampled by the op", set, dev_steps[1]);
    int distinct = 0;
    for (int i = 0; i < NREQ; i++) {
      if (set != 4)
        EXPECT_EQ_INT(GOT[i].n, MAXTOK);
      else
        EXPECT(GOT[i].n >= MAXTOK / 2);
      EXPECT_MSG(same(&REF[i], &GOT[i]), "set %d: request %d differs with the op", set, i);
      EXPECT_MSG(same(&REF[i], &ALONE[i]), "set %d: request %d differs alone", set, i);
      for (int k = 1; k < GOT[i].n; k++) distinct |= GOT[i].tok[k] != GOT[i].tok[0];
    }
    EXPECT_MSG(distinct, "set %d: every request repeats one token", set);
  }
  RUN_NO_LOGITS = 0;
  RUN_PENALISED = -1;
  DEV_SAMPLE = 0;
}

/* response_format masks: 16 seeded requests (temperature 1) under the JSON-object mask, and
 * under a schema, over a small synthetic vocabulary (id i -> one of 24 JSON-ish byte strings;
 * the model's eos an end token) give the same tokens whether the sampler threads prepare the
 * masks while the forward runs (4 sampler threads) or each is computed as its row is sampled
 * (none: the engine thread samples); and every output is a prefix of a JSON object (of one the
 * schema accepts). */
TEST(json_mask_overlap_same_tokens) {
  static const char *piece[24] = {"{",   "}",   "\"", "\"a\"", ":",  ",",      " ",     "1",
                                  "-",   ".",   "e",  "true",  "[",  "]",      "null",  "{\"",
                                  "\"}", "\":", "x",  "0",     "\n", "\"b\":", "false", "7}"};
  const char *bytes[512];
  size_t lens[512];
  REQUIRE(V <= 512);
  for (size_t i = 0; i < V; i++) {
    bytes[i] = piece[i % 24];
    lens[i] = strlen(bytes[i]);
  }
  int32_t eos = C.eos_token_ids[0];
  json_vocab *jv = json_vocab_new((int)V, bytes, lens, NULL, &eos, 1);
  REQUIRE(jv != NULL);
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  sampling_params sp;
  sp_greedy(&sp);
  sp.temperature = 1.0f;
  sp.ignore_eos = 0;
  sp.seed = 4242;
  sp.has_seed = 1;
  RUN_JSON = jv;
  for (int mode = 0; mode < 2; mode++) {
    RUN_SCHEMA = mode ? "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\","
                        "\"items\":{\"type\":\"integer\"}},\"b\":{\"enum\":[true,null]}},"
                        "\"required\":[\"b\"],\"additionalProperties\":false}"
                      : NULL;
    json_t *sj = RUN_SCHEMA ? json_loads(RUN_SCHEMA, 0, NULL) : NULL;
    json_schema *sc = sj ? json_schema_compile(sj, NULL, 0) : NULL;
    json_decref(sj);
    REQUIRE(!RUN_SCHEMA || sc);
    for (int ov = 0; ov < 2; ov++) {
      rig g;
      THREADS = ov ? 1 + 4 : 1;
      REQUIRE(te_up(&g, 8192, 0, 16) == 0);
      EXPECT_EQ_INT(run_set(&g, all, NREQ, ov ? GOT : REF, &sp), NREQ);
      EXPECT(rig_down(&g));
    }
    int open = 0;
    for (int i = 0; i < NREQ; i++) {
      EXPECT_MSG(
          REF[i].n == GOT[i].n && !memcmp(REF[i].tok, GOT[i].tok, sizeof(int32_t) * GOT[i].n),
          "mode %d: request %d's tokens differ with the masks prepared during the forward", mode,
          i);
      json_mask *m = sc ? json_mask_new_schema(jv, sc) : json_mask_new(jv);
      REQUIRE(m != NULL);
      for (int k = 0; k < GOT[i].n && GOT[i].tok[k] != eos; k++) {
        json_mask_advance(m, GOT[i].tok[k]);
        open |= GOT[i].tok[k] % 24 == 0 || GOT[i].tok[k] % 24 == 15;
      }
      EXPECT_MSG(!json_mask_dead(m), "mode %d: request %d's output left the grammar", mode, i);
      json_mask_free(m);
    }
    EXPECT_MSG(open, "mode %d: no output opened an object", mode);
    json_schema_free(sc);
  }
  RUN_JSON = NULL;
  RUN_SCHEMA = NULL;
  json_vocab_free(jv);
  THREADS = 0;
}

TEST(reject_vs_wait) {
  rig g;
  REQUIRE(te_up(&g, 8192, 16 * 14, 4) == 0);
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  sp_greedy(&so.sp);
  static int32_t big[5000];
  so.prompt = big;
  so.n_prompt = 4095; /* + 6 > max_position_embeddings 4096 */
  engine_status st;
  char err[200];
  EXPECT(engine_submit(g.e, &so, &st, err, sizeof err) == NULL && st == ENGINE_ERR_TOO_LONG);
  so.n_prompt = 300; /* fits the model length, not the 224-token pool */
  EXPECT(engine_submit(g.e, &so, &st, err, sizeof err) == NULL && st == ENGINE_ERR_TOO_LONG);
  so.n_prompt = 0;
  EXPECT(engine_submit(g.e, &so, &st, err, sizeof err) == NULL && st == ENGINE_ERR_INVALID);
  big[0] = 100000;
  so.n_prompt = 3;
  EXPECT(engine_submit(g.e, &so, &st, err, sizeof err) == NULL && st == ENGINE_ERR_INVALID);
  big[0] = 0;
  /* six requests of 200 tokens: only one fits the pool at a time, the others wait */
  for (int i = 0; i < NREQ; i++) {
    REF[i].n = 0;
  }
  int idx[6] = {8, 8, 8, 8, 8, 8};
  EXPECT_EQ_INT(run_set(&g, idx, 6, GOT, NULL), 6);
  EXPECT(rig_down(&g));
}

typedef struct canceller {
  engine_req *h;
  int go;
} canceller;

static void *cancel_thread(void *arg) {
  canceller *c = arg;
  engine_cancel(c->h);
  return NULL;
}

/* A long plain-greedy request cancelled from another thread while it decodes, a second one
 * finishing normally, a third released unread. ahead: with steps ahead on, so the cancelled
 * request is in a step issued ahead when the cancel lands (its removal waits for that step), and
 * an engine_check while it decodes drains the steps in flight first. */
static void cancel_case(int ahead) {
  AHEAD = ahead ? 1 : 0;
  rig g;
  int up = te_up(&g, 8192, 0, 4);
  AHEAD = 0;
  REQUIRE(up == 0);
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  sp_greedy(&so.sp);
  so.sp.max_tokens = 3000;
  so.prompt = P[5];
  so.n_prompt = LEN[5];
  engine_status st;
  char err[200];
  engine_req *h = engine_submit(g.e, &so, &st, err, sizeof err);
  REQUIRE(h);
  /* a second request that must finish normally */
  int idx = 2;
  engine_event ev;
  int n = 0;
  while (n < 3 && engine_next(h, &ev, 60000)) n++;
  EXPECT_EQ_INT(n, 3);
  if (ahead) {
    EXPECT_MSG(engine_check(g.e, err, sizeof err) == 0, "check while decoding: %s", err);
    while (n < 6 && engine_next(h, &ev, 60000)) n++; /* decoding goes on after the check */
    EXPECT_EQ_INT(n, 6);
  }
  canceller c = {h, 1};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, cancel_thread, &c) == 0);
  pthread_join(t, NULL);
  int fin = 0, guard = 0;
  while (!fin && guard++ < 5000 && engine_next(h, &ev, 60000)) fin = ev.finish;
  EXPECT_EQ_INT(fin, FINISH_CANCELLED);
  EXPECT(ev.completion_tokens < 3000);
  engine_release(h);
  EXPECT_EQ_INT(run_set(&g, &idx, 1, GOT, NULL), 1);
  engine_stats s;
  engine_get_stats(g.e, &s);
  EXPECT(s.requests_cancelled == 1);
  EXPECT_MSG(ahead ? s.steps_ahead > 0 : s.steps_ahead == 0, "%lld steps ahead", s.steps_ahead);
  /* release without reading: cancels and frees */
  h = engine_submit(g.e, &so, &st, err, sizeof err);
  REQUIRE(h);
  engine_release(h);
  EXPECT(rig_down(&g));
}
TEST(cancel_from_another_thread) { cancel_case(0); }
TEST(cancel_from_another_thread_ahead) { cancel_case(1); }

/* After a run under fault n: each request of idx[0, n_idx) finished by length with its REF
 * tokens, or failed (refused at submission too when refused_ok); every pool checks clean with
 * no page or slot held. Returns 1 when every request finished by length. */
static int fault_run_checks(rig *g, const int *idx, int n_idx, long n, int refused_ok) {
  int all_len = 1;
  for (int k = 0; k < n_idx; k++) {
    out *o = &GOT[idx[k]];
    all_len &= o->finish == FINISH_LENGTH;
    if (o->finish == FINISH_LENGTH)
      EXPECT_MSG(same(&REF[idx[k]], o), "fault %ld: request %d differs", n, idx[k]);
    else
      EXPECT_MSG((refused_ok && o->finish == -1) || o->finish == FINISH_ERROR,
                 "fault %ld: finish %d", n, o->finish);
  }
  char err[200];
  EXPECT_MSG(engine_check(g->e, err, sizeof err) == 0, "fault %ld: %s", n, err);
  engine_stats s;
  engine_get_stats(g->e, &s);
  EXPECT_MSG(s.kv_pages_used == 0 && s.slots_used == 0, "fault %ld: pages %d slots %d", n,
             s.kv_pages_used, s.slots_used);
  return all_len;
}

TEST(fault_every_site) {
  /* reference outputs for requests 1, 4, 6, 9 alone, with enough room */
  int idx[4] = {1, 4, 6, 9};
  rig g;
  REQUIRE(te_up(&g, 64, 16 * 14, 4) == 0);
  for (int k = 0; k < 4; k++) run_set(&g, &idx[k], 1, REF, NULL);
  int n_faults = 0;
  for (long n = 1; n < 200; n++) {
    fault_arm(n, NULL, 0);
    run_set(&g, idx, 4, GOT, NULL);
    int fired = fault_fired();
    fault_disarm();
    fault_run_checks(&g, idx, 4, n, 1);
    if (!fired) break;
    n_faults++;
  }
  EXPECT_MSG(n_faults >= 5, "only %d fault sites were hit", n_faults);
  EXPECT(rig_down(&g));
}

/* A step that fails to start (fault site "step_start", each hit in turn) with sampled steps
 * ahead (steps ahead and the sample op on): a step issued in turn fails its requests; a step
 * that fails to go ahead loses nothing — its rows' draws are put back, so the requests still
 * finish with the tokens they get with no fault. Every pool checks clean after each run. */
TEST(fault_step_start_sampled_ahead) {
  AHEAD = 1;
  DEV_SAMPLE = 1;
  RUN_NO_LOGITS = 1;
  sampling_params sp;
  sp_greedy(&sp);
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.seed = 31;
  sp.has_seed = 1;
  int idx[4] = {2, 5, 7, 11};
  rig g;
  REQUIRE(te_up(&g, 8192, 0, 4) == 0);
  for (int k = 0; k < 4; k++) EXPECT(run_set(&g, &idx[k], 1, REF, &sp) == 1);
  int n_faults = 0, n_lossless = 0;
  for (long n = 1; n < 200; n++) {
    fault_arm(n, "step_start", 0);
    run_set(&g, idx, 4, GOT, &sp);
    int fired = fault_fired();
    fault_disarm();
    int all_len = fault_run_checks(&g, idx, 4, n, 0);
    if (!fired) break;
    n_faults++;
    n_lossless += all_len;
  }
  printf("  step_start faults: %d, of them %d steps ahead that failed to start with nothing lost\n",
         n_faults, n_lossless);
  EXPECT_MSG(n_faults >= 2, "only %d step starts were hit", n_faults);
  EXPECT_MSG(n_lossless >= 1, "no step ahead failed to start");
  EXPECT(rig_down(&g));
  RUN_NO_LOGITS = 0;
  AHEAD = 0;
  DEV_SAMPLE = 0;
}

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
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
  prompts_init();
  outs_alloc(REF);
  outs_alloc(GOT);
  RUN(startup_forward_leaves_no_trace);
  RUN(ahead_same_tokens);
  RUN(ahead_same_tokens_cache);
  RUN(device_sample_ahead_same_tokens);
  RUN(fault_step_start_sampled_ahead);
  RUN(mem_plan_from_device_memory);
  RUN(packed_weights_plan);
  RUN(invariance_budget_8192);
  RUN(invariance_budget_64);
  RUN(invariance_budget_100);
  RUN(invariance_budget_37);
  RUN(invariance_budget_1);
  RUN(invariance_preempted);
  RUN(invariance_preempted_budget_37);
  RUN(invariance_cache_budget_8192);
  RUN(invariance_cache_budget_37);
  RUN(invariance_cache_preempted);
  RUN(invariance_cache_preempted_budget_37);
  RUN(seeded_sampling_batched);
  RUN(sampler_threads_same_tokens);
  RUN(device_sample_same_tokens);
  RUN(json_mask_overlap_same_tokens);
  RUN(reject_vs_wait);
  RUN(cancel_from_another_thread);
  RUN(cancel_from_another_thread_ahead);
  RUN(fault_every_site);
  for (int i = 0; i < NREQ; i++) {
    free(REF[i].lg);
    free(GOT[i].lg);
  }
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
