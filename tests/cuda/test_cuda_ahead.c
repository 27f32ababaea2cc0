/* test_cuda_ahead — steps ahead (engine.c engine_flight_step) on the GPU: plain-greedy requests
 * through the engine give the same tokens and finishes with DS_ENGINE_AHEAD=1 as with 0, where
 * the step ahead really overlaps the step before it (its tokens are copied on the device from
 * the ids of a step still running): sixteen requests of different prompt lengths alone and all
 * at once, and again with a stop token that ends some of them mid-output; with the prefix
 * cache off and on. Steps must have gone ahead, and every pool must check clean with nothing
 * left held (rig_down).
 *
 * Environment: DS_REAL_MODEL (default: the tiny fixture tests/fixtures/models/dense_bf16). */
#include "backend/backend_create.h"
#include "base/log.h"
#include "engine/engine.h"
#include "model/weights.h"
#include "test.h"

#define MAXTOK 24
#define NREQ 16

#include "engine_rig.h"

typedef struct out {
  int32_t tok[MAXTOK];
  int n, finish;
} out;

static int32_t P[NREQ][300];
static const int LEN[NREQ] = {1, 5, 63, 64, 65, 100, 130, 17, 200, 33, 7, 129, 90, 3, 150, 70};

/* Runs requests idx[0, n) at once (plain greedy: no logits callback); the number that ended
 * by stop or length. */
static int run_set(rig *g, const int *idx, int n, out *res, const sampling_params *sp) {
  engine_req *h[NREQ];
  int ok = 0;
  for (int k = 0; k < n; k++) {
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = P[idx[k]];
    so.n_prompt = LEN[idx[k]];
    so.sp = *sp;
    engine_status st;
    char err[200];
    h[k] = engine_submit(g->e, &so, &st, err, sizeof err);
    res[idx[k]].n = 0;
    res[idx[k]].finish = h[k] ? FINISH_NONE : -1;
  }
  for (int k = 0; k < n; k++) {
    if (!h[k]) continue;
    out *o = &res[idx[k]];
    engine_event ev;
    for (;;) {
      if (!engine_next(h[k], &ev, RIG_WAIT_MS)) {
        o->finish = -2;
        break;
      }
      if (ev.has_token && o->n < MAXTOK) o->tok[o->n++] = ev.token;
      if (ev.finish) {
        o->finish = ev.finish;
        break;
      }
    }
    ok += o->finish == FINISH_LENGTH || o->finish == FINISH_STOP;
    engine_release(h[k]);
  }
  return ok;
}

static out REF[3][NREQ], GOT[3][NREQ];

static void ahead_case(int cache) {
  int all[NREQ];
  for (int i = 0; i < NREQ; i++) all[i] = i;
  sampling_params sp, stop;
  sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = MAXTOK;
  sp.ignore_eos = 1;
  long long ahead_steps = 0;
  for (int on = 0; on < 2; on++) {
    setenv("DS_ENGINE_AHEAD", on ? "1" : "0", 1);
    out(*res)[NREQ] = on ? GOT : REF;
    rig g;
    rig_opts ro = {0};
    ro.cache = cache;
    ro.seqs = NREQ;
    REQUIRE(rig_up(&g, &ro) == 0);
    for (int i = 0; i < NREQ; i++) {
      int idx = i;
      EXPECT(run_set(&g, &idx, 1, res[0], &sp) == 1);
    }
    EXPECT_EQ_INT(run_set(&g, all, NREQ, res[1], &sp), NREQ);
    stop = sp; /* request 0's fifth token as a stop token: ends it (and maybe others) early */
    stop.stop_ids[0] = REF[0][0].tok[4];
    stop.n_stop_ids = 1;
    EXPECT_EQ_INT(run_set(&g, all, NREQ, res[2], &stop), NREQ);
    engine_stats st;
    engine_get_stats(g.e, &st);
    if (on) ahead_steps = st.steps_ahead;
    EXPECT(rig_down(&g));
  }
  unsetenv("DS_ENGINE_AHEAD");
  int stopped = 0, differ = 0;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < NREQ; i++) {
      const out *a = &GOT[k][i], *b = &REF[k][i];
      int eq = a->n == b->n && a->finish == b->finish &&
               !memcmp(a->tok, b->tok, (size_t)b->n * sizeof(int32_t));
      differ += !eq;
      EXPECT_MSG(eq, "cache %d set %d request %d: %d tokens (finish %d) ahead, %d (finish %d) not",
                 cache, k, i, a->n, a->finish, b->n, b->finish);
      if (k == 2) stopped += b->finish == FINISH_STOP && b->n < MAXTOK;
    }
  printf("  steps ahead, cache %s: %lld steps issued ahead, %d requests stopped mid-output, %d "
         "of 48 outputs differ\n",
         cache ? "on" : "off", ahead_steps, stopped, differ);
  EXPECT_MSG(ahead_steps > 0, "no step went ahead");
  EXPECT_MSG(stopped > 0, "no request stopped mid-output");
}

TEST(ahead_same_tokens) { ahead_case(0); }
TEST(ahead_same_tokens_cache) { ahead_case(1); }

int main(void) {
  char err[256];
  log_set_level(LOG_LEVEL_WARN);
  uint32_t x = 12345;
  for (int i = 0; i < NREQ; i++)
    for (int j = 0; j < LEN[i]; j++) {
      x = x * 1103515245u + 12345u;
      P[i][j] = (int32_t)((x >> 8) % 256);
    }
  const char *dir = getenv("DS_REAL_MODEL");
  if (!dir || !*dir) dir = "tests/fixtures/models/dense_bf16";
  if (model_load(dir, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load: %s\n", err);
    return 1;
  }
  BE = backend_create("cuda", 0, err, sizeof err);
  if (!BE) {
    printf("FAIL backend: %s\n", err);
    return 1;
  }
  V = (size_t)C.vocab_size;
  RUN(ahead_same_tokens);
  RUN(ahead_same_tokens_cache);
  BE->destroy(BE);
  weights_free(&W);
  TEST_MAIN_END();
}
