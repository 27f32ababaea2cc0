/* speculative decoding (n-gram drafts verified in the batch) on the CPU backend over the fixture
 * models (dense, MoE, Qwen3-Next): the drafters (n-gram, replay) and the flag's JSON; a verify
 * piece's rows and its kept states against plain one-token steps, bit for bit (the rollback);
 * greedy tokens AND logits with speculation equal to those without, 8 requests at once, with small
 * budgets, under preemption and across a prefix-cache restore of the end-of-generation checkpoint;
 * seeded sampling giving the same tokens; the sampled distribution (two-sample chi-square);
 * cancellation; the metric counts; and a backend without set_keep refused. Then MTP drafts
 * (method mtp) over a gen-random checkpoint with an MTP head: greedy tokens and logits equal to
 * the plain run's at 1 and 8 requests, under preemption and across a prefix-cache hit, with the
 * random head (nothing accepted) and with a head made to predict (some or all accepted); and
 * mtp refused on a checkpoint without a head. */
#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "engine/spec_config.h"
#include "engine/spec_ngram.h"
#include "engine/spec_replay.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "sampler/json_mask.h"
#include "test.h"

#define NQ 8    /* requests of a set */
#define MAXT 24 /* tokens generated per request */
#define WAIT_MS 600000

static model_config C;
static model_weights W;
static backend *BE;
static size_t V;
static const char *MODEL;

/* ---- the drafter and the flag ---------------------------------------------------------- */

/* The replay drafter: the recorded tokens from the position, clipped at their end; pm 0 none
 * corrupted, pm 1000 every one (moved by one id); pm 300 about that share over many positions
 * (a fixed hash: the same drafts on every call). */
TEST(replay_propose) {
  int32_t rec[64], out[16], again[16];
  for (int i = 0; i < 64; i++) rec[i] = (i * 37) % 50; /* 0 included: corrupted to 1 */
  int n = spec_replay_propose(rec, 64, 7, 10, 0, 5, out);
  EXPECT(n == 5 && !memcmp(out, rec + 10, 5 * sizeof *out));
  n = spec_replay_propose(rec, 64, 7, 61, 0, 5, out);
  EXPECT(n == 3 && !memcmp(out, rec + 61, 3 * sizeof *out));
  EXPECT(spec_replay_propose(rec, 64, 7, 64, 0, 5, out) == 0);
  n = spec_replay_propose(rec, 64, 7, 0, 1000, 16, out);
  int moved = 0;
  for (int i = 0; i < n; i++) moved += out[i] != rec[i] && abs(out[i] - rec[i]) == 1;
  EXPECT(n == 16 && moved == 16);
  int bad = 0, total = 0;
  for (int64_t id = 1; id <= 200; id++)
    for (int pos = 0; pos + 16 <= 64; pos += 16) {
      n = spec_replay_propose(rec, 64, id, pos, 300, 16, out);
      spec_replay_propose(rec, 64, id, pos, 300, 16, again);
      EXPECT(n == 16 && !memcmp(out, again, sizeof out));
      for (int i = 0; i < n; i++) bad += out[i] != rec[pos + i];
      total += n;
    }
  EXPECT_MSG(bad > 0.27 * total && bad < 0.33 * total, "%d of %d corrupted at pm 300", bad, total);
}

TEST(ngram_propose) {
  int32_t out[8];
  const int32_t a[] = {1, 2, 3, 4, 2, 3}; /* vLLM's example: [4, 2, 3] */
  int n = spec_ngram_propose(a, 6, 2, 3, 4, out);
  EXPECT(n == 3 && out[0] == 4 && out[1] == 2 && out[2] == 3);
  EXPECT(spec_ngram_propose(a, 6, 3, 3, 4, out) == 0); /* [4, 2, 3] never occurred before */
  /* the longest match wins over a shorter, later one; ties: the earliest */
  const int32_t b[] = {7, 8, 9, 5, 6, 9, 1, 8, 9, 2, 7, 8, 9};
  n = spec_ngram_propose(b, 13, 1, 3, 2, out);
  EXPECT_MSG(n == 2 && out[0] == 5 && out[1] == 6, "n %d out %d %d", n, out[0], out[1]);
  const int32_t c[] = {4, 1, 4, 2, 4};
  n = spec_ngram_propose(c, 5, 1, 2, 3, out);
  EXPECT_MSG(n == 3 && out[0] == 1 && out[1] == 4 && out[2] == 2, "n %d", n);
  EXPECT(spec_ngram_propose(c, 5, 1, 2, 1, out) == 1 && out[0] == 1); /* k caps */
  const int32_t d[] = {1, 2, 3};
  EXPECT(spec_ngram_propose(d, 3, 1, 3, 4, out) == 0);
  EXPECT(spec_ngram_propose(d, 1, 1, 3, 4, out) == 0);
}

TEST(config_parse) {
  spec_config s;
  char err[200];
  EXPECT(spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 4}", &s, err,
                           sizeof err) == 0 &&
         s.method == SPEC_METHOD_NGRAM && s.k == 4 && s.lookup_min == 5 && s.lookup_max == 5);
  EXPECT(spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3,"
                           "\"prompt_lookup_max\":4}",
                           &s, err, sizeof err) == 0 &&
         s.lookup_min == 4 && s.lookup_max == 4);
  EXPECT(spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":3,"
                           "\"prompt_lookup_min\":2,\"prompt_lookup_max\":4}",
                           &s, err, sizeof err) == 0 &&
         s.lookup_min == 2 && s.lookup_max == 4 && s.k == 3);
  EXPECT(spec_config_parse("{}", &s, err, sizeof err) == 0 && s.method == SPEC_METHOD_NONE);
  EXPECT(spec_config_parse("{\"method\":\"mtp\",\"num_speculative_tokens\":2,"
                           "\"disable_by_batch_size\":8}",
                           &s, err, sizeof err) == 0 &&
         s.disable_by_batch_size == 8);
  EXPECT(spec_config_parse("{\"method\":\"ngram\",\"num_speculative_tokens\":2}", &s, err,
                           sizeof err) == 0 &&
         s.disable_by_batch_size == 0);
  EXPECT(spec_config_parse("{\"method\":\"mtp\",\"num_speculative_tokens\":2}", &s, err,
                           sizeof err) == 0 &&
         s.method == SPEC_METHOD_MTP && s.k == 2);
  const char *bad[] = {"{\"method\":\"ngram\"}",
                       "{\"method\":\"mtp\"}",
                       "{\"method\":\"mtp\",\"num_speculative_tokens\":2,\"prompt_lookup_min\":2}",
                       "{\"method\":\"eagle\",\"num_speculative_tokens\":2}",
                       "{\"method\":\"ngram\",\"num_speculative_tokens\":0}",
                       "{\"method\":\"ngram\",\"num_speculative_tokens\":2,\"model\":\"x\"}",
                       ("{\"method\":\"ngram\",\"num_speculative_tokens\":2,"
                        "\"prompt_lookup_min\":4,\"prompt_lookup_max\":2}"),
                       "{\"method\":\"ngram\",\"num_speculative_tokens\":2.5}",
                       "{\"method\":\"ngram\",\"num_speculative_tokens\":2,"
                       "\"disable_by_batch_size\":0}",
                       "[1]",
                       "{"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = 0;
    EXPECT_MSG(spec_config_parse(bad[i], &s, err, sizeof err) == -1 && err[0] &&
                   !strchr(err, '\n') && s.method == SPEC_METHOD_NONE,
               "accepted %s", bad[i]);
  }
}

/* ---- the rollback, at the model ---------------------------------------------------------- */

/* A verify piece [a, b, x] against plain one-token steps a, b: rows 0 and 1 give the plain
 * steps' logits bit for bit; keeping 2 rows (keep slot of row 1 copied into the slot) leaves
 * the slot's bytes equal to the plain run's, and the next step (c) gives the plain logits. */
TEST(verify_piece_rollback) {
  qwen35 *m = NULL;
  char err[200];
  qwen35_mem_opts mo = {.n_pages = 8, .n_slots = 2, .keep_k = 3, .keep_lanes = 2};
  REQUIRE(qwen35_init(&m, &C, &W, BE, &mo, err, sizeof err) == 0);
  EXPECT(qwen35_can_verify(m) == 3);
  int32_t prompt[21], pa[4] = {0, 1, 2, 3}, pb[4] = {4, 5, 6, 7};
  for (int i = 0; i < 21; i++) prompt[i] = (i * 37 + 11) % (int)V;
  int n = 21;
  float *lg = malloc(sizeof *lg * V * 4), *lp = malloc(sizeof *lp * V * 4);
  fwd_seq p0 = {prompt, n, 0, pa, 4, 0, QWEN35_LOGITS_NONE, -1};
  fwd_seq p1 = {prompt, n, 0, pb, 4, 1, QWEN35_LOGITS_NONE, -1};
  EXPECT(qwen35_forward(m, &p0, 1, NULL, err, sizeof err) == 0);
  EXPECT(qwen35_forward(m, &p1, 1, NULL, err, sizeof err) == 0);
  int32_t t[4] = {(int32_t)(5 % V), (int32_t)(9 % V), (int32_t)(200 % V), (int32_t)(77 % V)};
  /* plain: a, b, then c (= t[3]) one token a step */
  for (int k = 0; k < 2; k++) {
    fwd_seq d = {&t[k], 1, n + k, pa, 4, 0, QWEN35_LOGITS_LAST, -1};
    EXPECT(qwen35_forward(m, &d, 1, lp + (size_t)k * V, err, sizeof err) == 0);
  }
  /* verify: [a, b, x] in one piece, together with a plain row of the other slot's next step
   * being no part of it (a step of two pieces) */
  fwd_seq v = {t, 3, n, pb, 4, 1, QWEN35_LOGITS_VERIFY, 1};
  EXPECT(qwen35_forward(m, &v, 1, lg, err, sizeof err) == 0);
  EXPECT_MSG(!memcmp(lg, lp, sizeof *lg * V * 2), "verify rows differ from the plain steps");
  EXPECT(qwen35_slot_copy(m, 1, qwen35_keep_slot(m, 1, 1)) == 0);
  size_t sb = qwen35_slot_bytes(m);
  char *s0 = malloc(sb), *s1 = malloc(sb);
  EXPECT(qwen35_slot_read(m, 0, s0) == 0 && qwen35_slot_read(m, 1, s1) == 0);
  EXPECT_MSG(!memcmp(s0, s1, sb), "the kept state is not the plain state");
  fwd_seq c0 = {&t[3], 1, n + 2, pa, 4, 0, QWEN35_LOGITS_LAST, -1};
  fwd_seq c1 = {&t[3], 1, n + 2, pb, 4, 1, QWEN35_LOGITS_LAST, -1};
  EXPECT(qwen35_forward(m, &c0, 1, lp, err, sizeof err) == 0);
  EXPECT(qwen35_forward(m, &c1, 1, lg, err, sizeof err) == 0);
  EXPECT_MSG(!memcmp(lg, lp, sizeof *lg * V), "the step after the rollback differs");
  /* a verify piece beyond the keep slots is refused */
  int32_t t5[5] = {1, 2, 3, 4, 5};
  fwd_seq big = {t5, 5, n + 3, pb, 4, 1, QWEN35_LOGITS_VERIFY, 1};
  EXPECT(qwen35_forward(m, &big, 1, lg, err, sizeof err) == -1);
  free(s0);
  free(s1);
  free(lg);
  free(lp);
  qwen35_free(m);
}

/* ---- the engine -------------------------------------------------------------------------- */

typedef struct sq {
  int32_t prompt[160];
  int n;
  sampling_params sp;
  int32_t tok[MAXT + 8];
  int n_tok;
  float *lg; /* [MAXT, V] the logits rows of its tokens (greedy sets) */
  int n_lg;
  int finish, cached;
  engine_req *h;
  const int32_t *replay; /* the replay drafter (engine_submit_opts.draft_replay) */
  int n_replay, pm, follow;
  const json_vocab *json; /* response_format json_object (NULL: none) */
} sq;

static void sq_logits(void *user, const float *l, int n) {
  sq *q = user;
  if (q->lg && q->n_lg < MAXT) memcpy(q->lg + (size_t)q->n_lg * n, l, (size_t)n * sizeof *l);
  q->n_lg++;
}

typedef struct up_opts {
  int k;   /* num_speculative_tokens (0: off) */
  int mtp; /* the MTP drafter (the model's head) instead of n-gram */
  int cache, budget, kv_tokens, seqs;
  int measured; /* whether steps draft decided by spec_policy (else every step may draft) */
  int lanes;    /* the model's keep lanes, as a device plan may cut them (0: the CPU plan's) */
} up_opts;

typedef struct rigs {
  qwen35 *m;
  engine *e;
} rigs;

static int up(rigs *g, const up_opts *u) {
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_batched_tokens = u->budget ? u->budget : 8192;
  o.kv_cache_tokens = u->kv_tokens;
  o.max_num_seqs = u->seqs ? u->seqs : NQ;
  o.enable_prefix_caching = u->cache;
  o.sampler_threads = 0;
  if (u->k) {
    o.spec.method = SPEC_METHOD_NGRAM;
    o.spec.k = u->k;
    o.spec.lookup_min = 1;
    o.spec.lookup_max = 3;
  }
  if (u->k && u->mtp) {
    o.spec.method = SPEC_METHOD_MTP;
    o.spec.lookup_min = o.spec.lookup_max = 0;
    o.mtp_weights = &W;
  }
  if (u->k && !u->measured) o.spec.disable_by_batch_size = 1 << 20;
  qwen35_mem_opts mo;
  char err[200];
  g->m = NULL;
  g->e = NULL;
  if (engine_mem_plan(&o, &C, &mo, err, sizeof err)) {
    printf("  up: %s\n", err);
    return -1;
  }
  if (u->lanes) mo.keep_lanes = u->lanes;
  if (qwen35_init(&g->m, &C, &W, BE, &mo, err, sizeof err)) {
    printf("  up: %s\n", err);
    return -1;
  }
  g->e = engine_create(g->m, &o, err, sizeof err);
  if (!g->e) printf("  up: %s\n", err);
  return g->e ? 0 : -1;
}

/* integrity, nothing held but the cache's; the metric counts consistent. Destroys g. */
static int down(rigs *g, engine_stats *out) {
  char err[200];
  int ok = 1;
  engine_stats s;
  memset(&s, 0, sizeof s);
  if (g->e) {
    if (engine_check(g->e, err, sizeof err) != 0) {
      printf("  check: %s\n", err);
      ok = 0;
    }
    engine_get_stats(g->e, &s);
    if (s.kv_pages_used || s.slots_used || s.num_running || s.num_waiting) {
      printf("  leak: pages %d slots %d\n", s.kv_pages_used, s.slots_used);
      ok = 0;
    }
    long long sum = 0;
    for (int i = 0; i < SPEC_MAX_TOKENS; i++) {
      sum += s.spec_accepted_per_pos[i];
      /* a draft is accepted only after every draft before it */
      if (i > 0 && s.spec_accepted_per_pos[i] > s.spec_accepted_per_pos[i - 1]) ok = 0;
      if (i >= s.spec_k && s.spec_accepted_per_pos[i]) ok = 0;
    }
    if (sum != s.spec_num_accepted_tokens || s.spec_num_accepted_tokens > s.spec_num_draft_tokens ||
        s.spec_num_draft_tokens > (long long)s.spec_k * s.spec_num_drafts) {
      printf("  metrics: drafts %lld tokens %lld accepted %lld (per position %lld)\n",
             s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens, sum);
      ok = 0;
    }
    engine_destroy(g->e, 1);
  }
  if (g->m) qwen35_free(g->m);
  if (out) *out = s;
  return ok && g->e;
}

static void sq_submit(engine *e, sq *q) {
  q->n_tok = q->n_lg = 0;
  q->finish = 0;
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  so.prompt = q->prompt;
  so.n_prompt = q->n;
  so.sp = q->sp;
  so.on_logits = q->lg ? sq_logits : NULL;
  so.user = q;
  so.draft_replay = q->replay;
  so.n_draft_replay = q->n_replay;
  so.draft_corrupt_pm = q->pm;
  so.draft_replay_follow = q->follow;
  so.json = q->json;
  engine_status st;
  char err[200];
  q->h = engine_submit(e, &so, &st, err, sizeof err);
  if (!q->h) {
    printf("  submit: %s\n", err);
    q->finish = -1;
  }
}

static void sq_wait(sq *q) {
  if (!q->h) return;
  engine_event ev;
  for (;;) {
    if (!engine_next(q->h, &ev, WAIT_MS)) {
      q->finish = -2;
      break;
    }
    if (ev.has_token && q->n_tok < MAXT + 8) q->tok[q->n_tok++] = ev.token;
    if (ev.finish) {
      q->finish = ev.finish;
      q->cached = ev.cached_tokens;
      break;
    }
  }
  engine_release(q->h);
  q->h = NULL;
}

/* qs[0, n) at once on a fresh engine; the stats after. Returns 1 when all ran to an end. */
static int run_set(const up_opts *u, sq *qs, int n, engine_stats *st) {
  rigs g;
  if (up(&g, u) != 0) {
    down(&g, st);
    return 0;
  }
  for (int i = 0; i < n; i++) sq_submit(g.e, &qs[i]);
  int ok = 1;
  for (int i = 0; i < n; i++) {
    sq_wait(&qs[i]);
    ok &= qs[i].finish == FINISH_LENGTH || qs[i].finish == FINISH_STOP;
  }
  return down(&g, st) && ok;
}

/* Repetitive prompts (a period-p pattern with a twist per request), greedy, ignore_eos. */
static void prompts(sq *qs, int n, int len, int with_logits) {
  for (int i = 0; i < n; i++) {
    sq *q = &qs[i];
    float *lg = q->lg;
    memset(q, 0, sizeof *q);
    q->lg = with_logits ? (lg ? lg : malloc(sizeof(float) * MAXT * V)) : (free(lg), NULL);
    int p = 3 + i % 5;
    q->n = len + i;
    for (int j = 0; j < q->n; j++)
      q->prompt[j] = (int32_t)((j % p) * 29 + 7 * i + (j / 40)) % (int)V;
    sampling_params_default(&q->sp);
    q->sp.temperature = 0;
    q->sp.max_tokens = MAXT;
    q->sp.ignore_eos = 1;
  }
}

static void sq_free(sq *qs, int n) {
  for (int i = 0; i < n; i++) {
    free(qs[i].lg);
    qs[i].lg = NULL;
  }
}

/* tokens (and logits rows when both have them) of a equal b's */
static int same(const sq *a, const sq *b, int n, const char *what) {
  for (int i = 0; i < n; i++) {
    if (a[i].n_tok != b[i].n_tok || memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * a[i].n_tok)) {
      printf("  %s: request %d: tokens differ (%d vs %d)\n", what, i, a[i].n_tok, b[i].n_tok);
      return 0;
    }
    if (a[i].lg && b[i].lg) {
      int nl = a[i].n_lg < MAXT ? a[i].n_lg : MAXT;
      if (a[i].n_lg != b[i].n_lg || memcmp(a[i].lg, b[i].lg, sizeof(float) * V * (size_t)nl)) {
        printf("  %s: request %d: logits differ\n", what, i);
        return 0;
      }
    }
  }
  return 1;
}

static void report(const char *what, const engine_stats *s) {
  double al =
      s->spec_num_drafts ? 1.0 + (double)s->spec_num_accepted_tokens / s->spec_num_drafts : 0;
  printf(
      "  %s %s: %lld steps, %lld drafts, %lld draft tokens, %lld accepted (%.0f%%), "
      "acceptance length %.2f, generated %lld\n",
      MODEL, what, s->steps, s->spec_num_drafts, s->spec_num_draft_tokens,
      s->spec_num_accepted_tokens,
      s->spec_num_draft_tokens ? 100.0 * s->spec_num_accepted_tokens / s->spec_num_draft_tokens
                               : 0.0,
      al, s->generation_tokens_total);
}

static sq REF[NQ], GOT[NQ];

/* GOT's drafts: REF's tokens, corrupted with probability pm / 1000 */
static void replay_ref(int n, int pm) {
  for (int i = 0; i < n; i++) {
    GOT[i].replay = REF[i].tok;
    GOT[i].n_replay = REF[i].n_tok;
    GOT[i].pm = pm;
  }
}

/* greedy, 8 at once, prefill pieces sharing steps with verify pieces (budget 64), and with a
 * budget of 5 that cuts drafts; drafts replayed from the plain run (all right, 30% wrong) and
 * from the n-gram drafter */
TEST(greedy_same_tokens_and_logits) {
  int budgets[] = {64, 5}, pms[] = {0, 300, -1};
  for (int bi = 0; bi < 2; bi++) {
    prompts(REF, NQ, 40, 1);
    engine_stats s0, s1;
    up_opts off = {.budget = budgets[bi]}, on = {.k = 4, .budget = budgets[bi]};
    EXPECT(run_set(&off, REF, NQ, &s0));
    EXPECT(s0.spec_num_drafts == 0);
    for (int pi = 0; pi < 3; pi++) {
      prompts(GOT, NQ, 40, 1);
      if (pms[pi] >= 0) replay_ref(NQ, pms[pi]);
      EXPECT(run_set(&on, GOT, NQ, &s1));
      EXPECT(same(REF, GOT, NQ, "greedy"));
      EXPECT_MSG(s1.spec_num_drafts > 0, "budget %d: no drafts", budgets[bi]);
      if (pms[pi] >= 0) EXPECT(s1.spec_num_accepted_tokens > 0);
      if (pms[pi] == 0) EXPECT(s1.steps < s0.steps);
      char what[160];
      snprintf(what, sizeof what, "greedy x%d budget %d, %s %d (plain: %lld steps)", NQ,
               budgets[bi], pms[pi] >= 0 ? "replay corrupt per mille" : "n-gram", pms[pi],
               s0.steps);
      report(what, &s1);
    }
  }
}

/* A model with fewer keep lanes than sequences (the device plan cuts them to what memory
 * holds): at most that many sequences verify drafts in a step, the others decode plainly, and
 * the tokens are the plain ones. */
TEST(fewer_lanes_same_tokens) {
  prompts(REF, NQ, 40, 0);
  engine_stats s0, s1;
  up_opts off = {0}, on = {.k = 3, .lanes = 2};
  EXPECT(run_set(&off, REF, NQ, &s0));
  prompts(GOT, NQ, 40, 0);
  replay_ref(NQ, 0);
  EXPECT(run_set(&on, GOT, NQ, &s1));
  EXPECT(same(REF, GOT, NQ, "greedy, 2 lanes"));
  EXPECT(s1.spec_num_drafts > 0 && s1.spec_num_accepted_tokens > 0);
  EXPECT(s1.steps < s0.steps);
  report("greedy, 2 keep lanes", &s1);
  sq_free(REF, NQ);
  sq_free(GOT, NQ);
}

/* The bench's following replay (draft_replay_follow): a request given a recorded run that is
 * not its own greedy continuation takes the recorded tokens, every uncorrupted draft accepted;
 * without follow the same drafts change no token (the plain run's). */
TEST(replay_follow) {
  prompts(REF, NQ, 40, 1);
  up_opts off = {.budget = 64}, on = {.k = 3, .budget = 64};
  EXPECT(run_set(&off, REF, NQ, NULL));
  static int32_t rec[NQ][MAXT + 8];
  for (int i = 0; i < NQ; i++)
    for (int j = 0; j < REF[i].n_tok; j++) /* another run: every third token moved by one id */
      rec[i][j] = j % 3 == 1 ? (REF[i].tok[j] + 1) % (int32_t)V : REF[i].tok[j];
  for (int f = 0; f < 2; f++) {
    prompts(GOT, NQ, 40, 1);
    for (int i = 0; i < NQ; i++) {
      GOT[i].replay = rec[i];
      GOT[i].n_replay = REF[i].n_tok;
      GOT[i].follow = f;
    }
    engine_stats s;
    EXPECT(run_set(&on, GOT, NQ, &s));
    int follows = 1;
    for (int i = 0; i < NQ; i++) {
      EXPECT(GOT[i].n_tok == REF[i].n_tok);
      for (int j = 0; j < GOT[i].n_tok && j < REF[i].n_tok; j++)
        follows &= GOT[i].tok[j] == rec[i][j];
    }
    if (f) {
      EXPECT_MSG(follows, "the following run left the recorded tokens");
      EXPECT_MSG(s.spec_num_accepted_tokens == s.spec_num_draft_tokens,
                 "following: %lld of %lld drafts accepted", s.spec_num_accepted_tokens,
                 s.spec_num_draft_tokens);
    } else {
      EXPECT(same(REF, GOT, NQ, "replay without follow"));
      EXPECT_MSG(s.spec_num_accepted_tokens < s.spec_num_draft_tokens,
                 "not following: %lld of %lld drafts accepted", s.spec_num_accepted_tokens,
                 s.spec_num_draft_tokens);
    }
  }
}

/* the measured choice per step (spec_policy: drafts tried, then plain steps, then the faster)
 * changes which steps draft, never a token */
TEST(measured_policy_same_tokens) {
  prompts(REF, NQ, 40, 1);
  engine_stats s0, s1;
  up_opts off = {0}, on = {.k = 3, .measured = 1};
  EXPECT(run_set(&off, REF, NQ, &s0));
  for (int pm = 0; pm <= 1000; pm += 1000) {
    prompts(GOT, NQ, 40, 1);
    replay_ref(NQ, pm);
    EXPECT(run_set(&on, GOT, NQ, &s1));
    EXPECT(same(REF, GOT, NQ, "measured policy"));
    EXPECT_MSG(s1.spec_num_drafts > 0, "corrupt per mille %d: drafts never tried", pm);
    char what[160];
    snprintf(what, sizeof what, "measured policy, replay corrupt per mille %d", pm);
    report(what, &s1);
  }
}

/* one request alone: tokens per decode step */
TEST(greedy_alone) {
  int pms[] = {0, 200, 500, -1};
  prompts(REF, 1, 60, 1);
  engine_stats s0, s1;
  up_opts off = {0}, on = {.k = 4};
  EXPECT(run_set(&off, REF, 1, &s0));
  for (int pi = 0; pi < 4; pi++) {
    prompts(GOT, 1, 60, 1);
    if (pms[pi] >= 0) replay_ref(1, pms[pi]);
    EXPECT(run_set(&on, GOT, 1, &s1));
    EXPECT(same(REF, GOT, 1, "alone"));
    char what[160];
    snprintf(what, sizeof what, "alone, %s %d: decode steps %lld plain, %lld (%.2f tokens a step)",
             pms[pi] >= 0 ? "replay corrupt per mille" : "n-gram", pms[pi], s0.steps - 1,
             s1.steps - 1, (double)(MAXT - 1) / (double)(s1.steps - 1));
    report(what, &s1);
  }
}

/* a KV pool too small for all: preemption (recompute) of speculating requests */
TEST(preempted_same_tokens) {
  prompts(REF, NQ, 40, 1);
  prompts(GOT, NQ, 40, 1);
  engine_stats s0, s1;
  up_opts off = {.budget = 8192}, on = {.k = 4, .budget = 8192, .kv_tokens = 16 * 12};
  EXPECT(run_set(&off, REF, NQ, &s0));
  replay_ref(NQ, 300);
  EXPECT(run_set(&on, GOT, NQ, &s1));
  EXPECT(same(REF, GOT, NQ, "preempted"));
  EXPECT_MSG(s1.preemptions > 0, "no preemption");
  EXPECT(s1.spec_num_accepted_tokens > 0);
}

/* prefix cache: turn 2 (turn 1's prompt + output + 5 tokens) restores turn 1's end-of-
 * generation checkpoint, which speculation must have left at the accepted position */
static int32_t T1[NQ / 2][MAXT + 8];
static int n_t1[NQ / 2];

TEST(prefix_cache_restore) {
  sq *sets[2] = {REF, GOT};
  engine_stats st[2];
  for (int k = 0; k < 2; k++) {
    sq *qs = sets[k];
    prompts(qs, NQ / 2, 40, 1);
    for (int i = 0; k && i < NQ / 2; i++) { /* drafts: REF's turn 1, 30% wrong */
      qs[i].replay = T1[i];
      qs[i].n_replay = n_t1[i];
      qs[i].pm = 300;
    }
    rigs g;
    up_opts u = {.k = k ? 4 : 0, .cache = 1, .budget = 64};
    REQUIRE(up(&g, &u) == 0);
    for (int i = 0; i < NQ / 2; i++) sq_submit(g.e, &qs[i]);
    for (int i = 0; i < NQ / 2; i++) sq_wait(&qs[i]);
    for (int i = 0; !k && i < NQ / 2; i++) { /* REF's turn 1 kept for GOT's drafts */
      memcpy(T1[i], qs[i].tok, sizeof T1[i]);
      n_t1[i] = qs[i].n_tok;
    }
    if (k) replay_ref(NQ / 2, 300);    /* turn 2: REF's turn 2 */
    for (int i = 0; i < NQ / 2; i++) { /* turn 2 */
      sq *q = &qs[i];
      for (int j = 0; j < q->n_tok; j++) q->prompt[q->n + j] = q->tok[j];
      q->n += q->n_tok;
      for (int j = 0; j < 5; j++) q->prompt[q->n++] = (int32_t)((j * 13 + i) % (int)V);
    }
    for (int i = 0; i < NQ / 2; i++) sq_submit(g.e, &qs[i]);
    for (int i = 0; i < NQ / 2; i++) {
      sq_wait(&qs[i]);
      EXPECT_MSG(qs[i].cached > 0, "turn 2 of request %d restored nothing", i);
    }
    EXPECT(down(&g, &st[k]));
  }
  EXPECT(same(REF, GOT, NQ / 2, "restored"));
  EXPECT(st[1].spec_num_accepted_tokens > 0);
}

/* seeded sampling (temperature, top-p, a frequency penalty): the same tokens with and without
 * speculation, because each emitted token takes one draw as plain decoding does */
TEST(seeded_sampling_same_tokens) {
  prompts(REF, NQ, 40, 0);
  prompts(GOT, NQ, 40, 0);
  for (int i = 0; i < NQ; i++) {
    sq *qs[2] = {&REF[i], &GOT[i]};
    for (int k = 0; k < 2; k++) {
      qs[k]->sp.temperature = 0.4f;
      qs[k]->sp.top_p = 0.95f;
      qs[k]->sp.frequency_penalty = i % 2 ? 0.3f : 0.f;
      qs[k]->sp.seed = 1000 + (uint64_t)i;
      qs[k]->sp.has_seed = 1;
    }
  }
  engine_stats s0, s1;
  up_opts off = {.budget = 64}, on = {.k = 4, .budget = 64};
  EXPECT(run_set(&off, REF, NQ, &s0));
  replay_ref(NQ, 300);
  EXPECT(run_set(&on, GOT, NQ, &s1));
  EXPECT(same(REF, GOT, NQ, "seeded"));
  EXPECT(s1.spec_num_accepted_tokens > 0);
  EXPECT(s1.spec_num_drafts > 0);
  report("seeded sampling", &s1);
}

/* The sampled distribution: the third token of a request over many seeds, with speculation
 * (seeds s) and without (other seeds), compared by a two-sample chi-square over the tokens seen
 * at least 10 times in all (the rest one bin); a generous bound (p ~ 1e-6). */
TEST(sampled_distribution) {
  enum { NS = 240 };
  static sq qs[NS];
  int hist[2][512];
  memset(hist, 0, sizeof hist);
  long long drafts = 0;
  /* drafts: the greedy continuation (the likeliest tokens: many accepted, some not) */
  static sq gq;
  memset(&gq, 0, sizeof gq);
  gq.n = 30;
  for (int j = 0; j < gq.n; j++) gq.prompt[j] = (int32_t)((j % 3) * 41 + 5) % (int)V;
  sampling_params_default(&gq.sp);
  gq.sp.temperature = 0;
  gq.sp.max_tokens = 4;
  gq.sp.ignore_eos = 1;
  up_opts gu = {0};
  EXPECT(run_set(&gu, &gq, 1, NULL));
  long long acc = 0;
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < NS; i++) {
      sq *q = &qs[i];
      memset(q, 0, sizeof *q);
      q->n = 30;
      for (int j = 0; j < q->n; j++) q->prompt[j] = (int32_t)((j % 3) * 41 + 5) % (int)V;
      sampling_params_default(&q->sp);
      q->sp.temperature = 0.25f;
      q->replay = gq.tok;
      q->n_replay = gq.n_tok;
      q->sp.max_tokens = 4;
      q->sp.ignore_eos = 1;
      q->sp.seed = (uint64_t)(k * 100000 + i + 1);
      q->sp.has_seed = 1;
    }
    engine_stats s;
    up_opts u = {.k = k ? 3 : 0, .seqs = 16, .budget = 512};
    rigs g;
    REQUIRE(up(&g, &u) == 0);
    for (int i = 0; i < NS; i += 16) {
      for (int j = i; j < i + 16; j++) sq_submit(g.e, &qs[j]);
      for (int j = i; j < i + 16; j++) sq_wait(&qs[j]);
    }
    EXPECT(down(&g, &s));
    drafts = s.spec_num_drafts;
    acc = s.spec_num_accepted_tokens;
    for (int i = 0; i < NS; i++)
      if (qs[i].n_tok >= 3) hist[k][qs[i].tok[2] % 512]++;
  }
  EXPECT_MSG(drafts > 0 && acc > 0, "%lld drafts, %lld accepted", drafts, acc);
  double chi = 0;
  int df = -1, o0 = 0, o1 = 0;
  for (int t = 0; t < 512; t++) {
    int a = hist[0][t], b = hist[1][t];
    if (a + b < 10) {
      o0 += a;
      o1 += b;
      continue;
    }
    chi += (double)(a - b) * (a - b) / (a + b);
    df++;
  }
  if (o0 + o1 > 0) {
    chi += (double)(o0 - o1) * (o0 - o1) / (o0 + o1);
    df++;
  }
  double bound = df + 7.0 * sqrt(2.0 * (df > 1 ? df : 1)) + 10;
  printf(
      "  %s sampled third token: chi-square %.1f, %d degrees of freedom (bound %.1f); "
      "%lld drafts, %lld accepted\n",
      MODEL, chi, df, bound, drafts, acc);
  EXPECT_MSG(df >= 1 && chi < bound, "chi-square %.1f over %d dof", chi, df);
}

/* cancellation of speculating requests mid-way: nothing held afterwards, the others finish */
TEST(cancel_speculating) {
  prompts(GOT, NQ, 40, 0);
  for (int i = 0; i < NQ; i++) GOT[i].sp.max_tokens = 200;
  rigs g;
  up_opts u = {.k = 4, .budget = 64};
  REQUIRE(up(&g, &u) == 0);
  for (int i = 0; i < NQ; i++) sq_submit(g.e, &GOT[i]);
  for (int i = 0; i < NQ; i += 2) {
    engine_event ev;
    for (int k = 0; k < 6 && engine_next(GOT[i].h, &ev, WAIT_MS) && !ev.finish; k++) {
    }
    engine_cancel(GOT[i].h);
  }
  int fin[2] = {0, 0};
  for (int i = 0; i < NQ; i++) {
    sq_wait(&GOT[i]);
    fin[i % 2] += GOT[i].finish == (i % 2 ? FINISH_LENGTH : FINISH_CANCELLED);
  }
  EXPECT_MSG(fin[0] == NQ / 2 && fin[1] == NQ / 2, "cancelled %d, finished %d", fin[0], fin[1]);
  engine_stats s;
  EXPECT(down(&g, &s));
  EXPECT(s.spec_num_drafts > 0);
}

/* JSON-constrained requests (json_object over a toy vocabulary of JSON pieces; sampled and
 * greedy, eos allowed): drafts the mask forbids are rejected by the row's masked sampling, and
 * the tokens are those of plain decoding */
TEST(json_mask_same_tokens) {
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
  prompts(REF, NQ, 40, 1);
  prompts(GOT, NQ, 40, 1);
  for (int i = 0; i < NQ; i++) {
    sq *qs[2] = {&REF[i], &GOT[i]};
    for (int k = 0; k < 2; k++) {
      qs[k]->json = jv;
      qs[k]->sp.ignore_eos = 0;
      qs[k]->sp.temperature = i % 2 ? 1.0f : 0.f;
      qs[k]->sp.seed = 77 + (uint64_t)i;
      qs[k]->sp.has_seed = 1;
    }
  }
  engine_stats s0, s1;
  up_opts off = {.budget = 64}, on = {.k = 4, .budget = 64};
  EXPECT(run_set(&off, REF, NQ, &s0));
  replay_ref(NQ, 300);
  EXPECT(run_set(&on, GOT, NQ, &s1));
  EXPECT(same(REF, GOT, NQ, "json"));
  EXPECT(s1.spec_num_accepted_tokens > 0);
  report("json_object", &s1);
  for (int i = 0; i < NQ; i++) REF[i].json = GOT[i].json = NULL;
  json_vocab_free(jv);
}

/* ---- MTP drafts (the model's head, a checkpoint written by gen-random) ------------------- */

static float SCALE = -1; /* the head made predictable with this scale (-1: random) */

/* greedy, one request and 8 at once (budget 64: prefill pieces next to verify pieces; budget 5:
 * drafts cut), MTP drafts: tokens and logits equal to the plain run's, the drafter used */
TEST(mtp_greedy_same_tokens) {
  int budgets[] = {64, 5}, ns[] = {1, NQ};
  for (int ni = 0; ni < 2; ni++)
    for (int bi = 0; bi < 2; bi++) {
      int n = ns[ni];
      prompts(REF, n, 40, 1);
      prompts(GOT, n, 40, 1);
      engine_stats s0, s1;
      up_opts off = {.budget = budgets[bi]}, on = {.k = 3, .mtp = 1, .budget = budgets[bi]};
      EXPECT(run_set(&off, REF, n, &s0));
      EXPECT(run_set(&on, GOT, n, &s1));
      EXPECT(same(REF, GOT, n, "mtp greedy"));
      EXPECT_MSG(s1.spec_num_drafts > 0 && s1.spec_num_draft_tokens > 0,
                 "x%d budget %d: no MTP drafts", n, budgets[bi]);
      char what[160];
      snprintf(what, sizeof what, "MTP greedy x%d budget %d (plain: %lld steps)", n, budgets[bi],
               s0.steps);
      report(what, &s1);
    }
}

/* a KV pool too small for all: speculating requests preempted and recomputed */
TEST(mtp_preempted_same_tokens) {
  prompts(REF, NQ, 40, 1);
  prompts(GOT, NQ, 40, 1);
  engine_stats s0, s1;
  up_opts off = {.budget = 8192}, on = {.k = 3, .mtp = 1, .budget = 8192, .kv_tokens = 16 * 12};
  EXPECT(run_set(&off, REF, NQ, &s0));
  EXPECT(run_set(&on, GOT, NQ, &s1));
  EXPECT(same(REF, GOT, NQ, "mtp preempted"));
  EXPECT_MSG(s1.preemptions > 0, "no preemption");
  EXPECT(s1.spec_num_drafts > 0);
  if (SCALE >= 0) EXPECT(s1.spec_num_accepted_tokens > 0);
  report("MTP preempted", &s1);
}

/* prefix cache: turn 2 restores turn 1's checkpoint; its cached positions' MTP rows are not fed
 * again (lower acceptance at most), the tokens stay the plain run's */
TEST(mtp_prefix_cache_restore) {
  sq *sets[2] = {REF, GOT};
  engine_stats st[2];
  for (int k = 0; k < 2; k++) {
    sq *qs = sets[k];
    prompts(qs, NQ / 2, 40, 1);
    rigs g;
    up_opts u = {.k = k ? 3 : 0, .mtp = k, .cache = 1, .budget = 64};
    REQUIRE(up(&g, &u) == 0);
    for (int i = 0; i < NQ / 2; i++) sq_submit(g.e, &qs[i]);
    for (int i = 0; i < NQ / 2; i++) sq_wait(&qs[i]);
    for (int i = 0; i < NQ / 2; i++) { /* turn 2 */
      sq *q = &qs[i];
      for (int j = 0; j < q->n_tok; j++) q->prompt[q->n + j] = q->tok[j];
      q->n += q->n_tok;
      for (int j = 0; j < 5; j++) q->prompt[q->n++] = (int32_t)((j * 13 + i) % (int)V);
    }
    for (int i = 0; i < NQ / 2; i++) sq_submit(g.e, &qs[i]);
    for (int i = 0; i < NQ / 2; i++) {
      sq_wait(&qs[i]);
      EXPECT_MSG(qs[i].cached > 0, "turn 2 of request %d restored nothing", i);
    }
    EXPECT(down(&g, &st[k]));
  }
  EXPECT(same(REF, GOT, NQ / 2, "mtp restored"));
  EXPECT(st[1].spec_num_drafts > 0);
  if (SCALE >= 0) EXPECT(st[1].spec_num_accepted_tokens > 0);
  report("MTP prefix cache, turn 2", &st[1]);
}

/* A head that predicts well, so that drafts are accepted (random weights accept none): every
 * target layer's output projections (o_proj, out_proj, down_proj) scaled by s, so that the
 * next token is mostly a function of the current one (s = 0: only of it), and the MTP head
 * made to compute that function on its input token: fc = [I | 0] (the embedding half), its
 * layer's o_proj and down_proj 0, and the final norms plain (weights 0), so that its y is the
 * target's final hidden state for that token. The new data lives in KEEP until the end. */
static void *KEEP[64];
static int n_keep;

/* t's data replaced: element i becomes f(i, old value) (mode 0: old * s; 1: identity [H, 2H]
 * left half; 2: s) */
static int retensor(tensor *t, int mode, float s) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  size_t es = t->dt == DTYPE_BF16 ? 2 : t->dt == DTYPE_F32 ? 4 : 0;
  if (!es || n_keep >= (int)(sizeof KEEP / sizeof *KEEP)) return -1;
  void *buf = malloc((size_t)n * es);
  if (!buf) return -1;
  for (int64_t i = 0; i < n; i++) {
    float v = mode == 0   ? tensor_get_f32(t, i) * s
              : mode == 1 ? (float)(i / t->shape[1] == i % t->shape[1])
                          : s;
    if (es == 2)
      ((uint16_t *)buf)[i] = dtype_f32_to_bf16(v);
    else
      ((float *)buf)[i] = v;
  }
  KEEP[n_keep++] = buf;
  t->data = buf;
  return 0;
}

static int predictable(float s) {
  int rc = 0;
  for (int i = 0; i < C.n_layers; i++) {
    layer_weights *L = &W.layers[i];
    rc |= retensor(L->o_proj.data ? &L->o_proj : &L->out_proj, 0, s);
    rc |= retensor(&L->down_proj, 0, s);
  }
  mtp_weights *m = &W.mtp;
  rc |= retensor(&m->fc, 1, 0) | retensor(&m->layers[0].o_proj, 2, 0) |
        retensor(&m->layers[0].down_proj, 2, 0) | retensor(&m->pre_fc_norm_embedding, 2, 0) |
        retensor(&m->norm, 2, 0) | retensor(&W.final_norm, 2, 0);
  return rc;
}

/* with the predictable head (SCALE): greedy tokens and logits equal to the plain run's, one
 * request and 8, drafts accepted (scale 0: most of them; 0.5: some rejected, the state rolled
 * back) */

TEST(mtp_accepted_same_tokens) {
  int ns[] = {1, NQ};
  for (int ni = 0; ni < 2; ni++) {
    int n = ns[ni];
    prompts(REF, n, 40, 1);
    prompts(GOT, n, 40, 1);
    engine_stats s0, s1;
    up_opts off = {.budget = 64}, on = {.k = 3, .mtp = 1, .budget = 64};
    EXPECT(run_set(&off, REF, n, &s0));
    EXPECT(run_set(&on, GOT, n, &s1));
    EXPECT(same(REF, GOT, n, "mtp accepted"));
    EXPECT_MSG(s1.spec_num_accepted_tokens > 0, "scale %.1f x%d: nothing accepted", SCALE, n);
    if (SCALE == 0.f)
      EXPECT_MSG(2 * s1.spec_num_accepted_tokens > s1.spec_num_draft_tokens,
                 "scale 0 x%d: %lld of %lld accepted", n, s1.spec_num_accepted_tokens,
                 s1.spec_num_draft_tokens);
    char what[160];
    snprintf(what, sizeof what, "MTP predictable head, layer scale %.1f, x%d (plain: %lld steps)",
             SCALE, n, s0.steps);
    report(what, &s1);
  }
}

/* method mtp on a checkpoint without an MTP head: refused with one line */
TEST(mtp_refused_without_head) {
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_seqs = 2;
  o.kv_cache_tokens = 256;
  o.spec.method = SPEC_METHOD_MTP;
  o.spec.k = 2;
  o.mtp_weights = &W;
  qwen35_mem_opts mo;
  char err[200] = "";
  qwen35 *m = NULL;
  REQUIRE(engine_mem_plan(&o, &C, &mo, err, sizeof err) == 0);
  REQUIRE(qwen35_init(&m, &C, &W, BE, &mo, err, sizeof err) == 0);
  engine *e = engine_create(m, &o, err, sizeof err);
  EXPECT_MSG(!e && strstr(err, "MTP head") && !strchr(err, '\n'), "err: %s", err);
  if (e) engine_destroy(e, 0);
  o.mtp_weights = NULL;
  e = engine_create(m, &o, err, sizeof err);
  EXPECT(!e && strstr(err, "MTP head"));
  if (e) engine_destroy(e, 0);
  qwen35_free(m);
}

/* a backend without set_keep (as the CUDA backend): --speculative-config refused */
TEST(refused_without_set_keep) {
  backend fake = *BE;
  fake.set_keep = NULL;
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_seqs = 2;
  o.kv_cache_tokens = 256;
  o.spec.method = SPEC_METHOD_NGRAM;
  o.spec.k = 2;
  o.spec.lookup_min = o.spec.lookup_max = 2;
  qwen35_mem_opts mo;
  char err[200] = "";
  qwen35 *m = NULL;
  REQUIRE(engine_mem_plan(&o, &C, &mo, err, sizeof err) == 0);
  REQUIRE(qwen35_init(&m, &C, &W, &fake, &mo, err, sizeof err) == 0);
  engine *e = engine_create(m, &o, err, sizeof err);
  EXPECT(!e && strstr(err, "speculative"));
  if (e) engine_destroy(e, 0);
  qwen35_free(m);
}

int main(void) {
  log_set_level(LOG_LEVEL_WARN);
  RUN(ngram_propose);
  RUN(replay_propose);
  RUN(config_parse);
  const char *models[] = {"tests/fixtures/models/dense_bf16", "tests/fixtures/models/moe_f32",
                          "tests/fixtures/models/next_bf16"};
  BE = backend_cpu_create(2);
  if (!BE) {
    printf("FAIL backend\n");
    return 1;
  }
  for (int mi = 0; mi < 3; mi++) {
    char err[256];
    MODEL = strrchr(models[mi], '/') + 1;
    if (model_load(models[mi], &C, &W, err, sizeof err) != 0) {
      printf("FAIL load %s: %s\n", models[mi], err);
      return 1;
    }
    V = (size_t)C.vocab_size;
    printf("model %s\n", MODEL);
    RUN(verify_piece_rollback);
    RUN(greedy_same_tokens_and_logits);
    RUN(fewer_lanes_same_tokens);
    RUN(replay_follow);
    RUN(greedy_alone);
    RUN(measured_policy_same_tokens);
    RUN(preempted_same_tokens);
    RUN(prefix_cache_restore);
    RUN(seeded_sampling_same_tokens);
    if (mi == 0) {
      RUN(sampled_distribution);
      RUN(cancel_speculating);
      RUN(json_mask_same_tokens);
      RUN(refused_without_set_keep);
      RUN(mtp_refused_without_head);
    }
    sq_free(REF, NQ);
    sq_free(GOT, NQ);
    weights_free(&W);
  }
  { /* a Qwen3.5 checkpoint with an MTP head, written by gen-random */
    char dir[128], cfg[160], err[256];
    snprintf(dir, sizeof dir, "/tmp/ds_test_spec_XXXXXX");
    if (!mkdtemp(dir)) {
      printf("FAIL mkdtemp\n");
      return 1;
    }
    snprintf(cfg, sizeof cfg, "%s/config.json.in", dir);
    FILE *f = fopen(cfg, "w");
    if (!f) {
      printf("FAIL %s\n", cfg);
      return 1;
    }
    fputs(
        "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":300,\"hidden_size\":48,"
        "\"intermediate_size\":80,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"head_dim\":16,\"linear_num_key_heads\":2,"
        "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":12,"
        "\"linear_conv_kernel_dim\":4,\"partial_rotary_factor\":0.5,"
        "\"tie_word_embeddings\":false,\"mtp_num_hidden_layers\":1}",
        f);
    fclose(f);
    char mdir[160];
    snprintf(mdir, sizeof mdir, "%s/m", dir);
    gen_random_opts go = {.seed = 11, .dt = DTYPE_BF16, .threads = 2, .quiet = 1};
    weights_opts wo = {.mtp = 1};
    if (gen_random_write(cfg, mdir, &go, err, sizeof err) ||
        model_load_with(mdir, &wo, &C, &W, err, sizeof err)) {
      printf("FAIL the MTP checkpoint: %s\n", err);
      return 1;
    }
    V = (size_t)C.vocab_size;
    MODEL = "mtp_bf16";
    printf("model %s\n", MODEL);
    RUN(mtp_greedy_same_tokens);
    RUN(mtp_preempted_same_tokens);
    RUN(mtp_prefix_cache_restore);
    /* the head made predictable (W's data changed in place: scale 0 after 0.5) */
    for (int si = 0; si < 2; si++) {
      SCALE = si ? 0.f : 0.5f;
      if (predictable(SCALE) != 0) {
        printf("FAIL the predictable head\n");
        return 1;
      }
      RUN(mtp_accepted_same_tokens);
      if (!si) {
        RUN(mtp_preempted_same_tokens);
        RUN(mtp_prefix_cache_restore);
      }
    }
    sq_free(REF, NQ);
    sq_free(GOT, NQ);
    weights_free(&W);
    for (int i = 0; i < n_keep; i++) free(KEEP[i]);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("  could not remove %s\n", dir);
  }
  BE->destroy(BE);
  TEST_MAIN_END();
}
