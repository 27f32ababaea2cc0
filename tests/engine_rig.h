/* engine_rig.h — the engine test rig shared by tests/test_engine.c and tests/test_prefix_engine.c
 * (CPU, tiny fixture) and tests/cuda/test_cuda_restore.c (any device, real-shape model): an
 * engine over the
 * includer's model (globals C, W, BE, V below, set by its main), greedy requests with
 * boundaries / forced split points / a salt, and the "cold" reference run (prefix cache off,
 * given split points). The includer defines MAXTOK (logits rows kept per request) first.
 * Waits use a generous ceiling (RIG_WAIT_MS), never a timing assertion. Its functions are
 * static inline: an includer may use only some of them. */
#ifndef DS_TEST_ENGINE_RIG_H
#define DS_TEST_ENGINE_RIG_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "model/weights.h"

#ifndef MAXTOK
#error "define MAXTOK before including engine_rig.h"
#endif
#define RIG_WAIT_MS 600000

static model_config C;
static model_weights W;
static backend *BE;
static size_t V;

/* ---- rig ------------------------------------------------------------------------------- */

typedef struct rig_opts {
  int cache;
  int kv_tokens; /* 0: default */
  int seqs;
  int slabs;       /* --snapshot-slabs (0: default) */
  double dev_gib;  /* --prefix-cache-gib */
  double host_gib; /* --host-cache-gib */
  int budget;      /* --max-num-batched-tokens (0: 8192) */
  int interval;    /* --snapshot-interval (0: default) */
  /* engine_opts.steps_ahead / device_sample: -1 off, 0 the engine's default, 1 on */
  int ahead, device_sample;
  int threads; /* --sampler-threads + 1 (0: the default; 1: none, the engine thread samples) */
} rig_opts;

/* --log-steps for every rig engine (an includer's main may set it, for debugging) */
static int RIG_LOG_STEPS;

typedef struct rig {
  qwen35 *m;
  engine *e;
} rig;

static inline int rig_up(rig *g, const rig_opts *ro) {
  engine_opts o;
  engine_opts_default(&o);
  o.max_num_batched_tokens = ro->budget ? ro->budget : 8192;
  if (ro->interval) o.snapshot_interval = ro->interval;
  o.kv_cache_tokens = ro->kv_tokens;
  o.max_num_seqs = ro->seqs ? ro->seqs : 8;
  o.enable_prefix_caching = ro->cache;
  o.n_snapshot_slabs = ro->slabs;
  o.prefix_cache_gib = ro->dev_gib;
  o.host_cache_gib = ro->host_gib;
  o.steps_ahead = ro->ahead ? ro->ahead > 0 : -1;
  o.device_sample = ro->device_sample ? ro->device_sample > 0 : -1;
  o.sampler_threads = ro->threads - 1;
  o.log_steps = RIG_LOG_STEPS;
  qwen35_mem_opts mo;
  char err[200];
  g->e = NULL;
  g->m = NULL;
  if (engine_mem_plan(&o, &C, &mo, err, sizeof err) ||
      qwen35_init(&g->m, &C, &W, BE, &mo, err, sizeof err)) {
    printf("rig: %s\n", err);
    return -1;
  }
  g->e = engine_create(g->m, &o, err, sizeof err);
  if (!g->e) printf("rig: %s\n", err);
  return g->e ? 0 : -1;
}

/* integrity: every check passes and nothing is held but cached pages and checkpoints */
static inline int rig_ok(rig *g, char *why, size_t n) {
  char err[200];
  if (engine_check(g->e, err, sizeof err) != 0) return snprintf(why, n, "check: %s", err), 0;
  engine_stats s;
  engine_get_stats(g->e, &s);
  if (s.kv_pages_used || s.slots_used || s.num_running || s.num_waiting || s.prefix_pending)
    return snprintf(why, n, "leak: pages %d slots %d running %d waiting %d tickets %d",
                    s.kv_pages_used, s.slots_used, s.num_running, s.num_waiting, s.prefix_pending),
           0;
  return 1;
}

static inline int rig_down(rig *g) {
  char why[300] = "";
  int ok = g->e ? rig_ok(g, why, sizeof why) : 0;
  if (!ok) printf("%s\n", why);
  if (g->e) engine_destroy(g->e, 1);
  if (g->m) qwen35_free(g->m);
  return ok;
}

/* ---- requests -------------------------------------------------------------------------- */

typedef struct req {
  const int32_t *prompt;
  int n;
  const int32_t *bounds;
  int nb;
  const int32_t *splits;
  int ns;
  const char *salt;
  int max_tokens;
  /* results */
  engine_req *h;
  int32_t tok[64];
  int n_tok;
  float *lg; /* [MAXTOK, V] */
  int n_lg;
  int finish, cached, prompt_tokens;
} req;

static inline void on_logits(void *user, const float *l, int n) {
  req *q = user;
  if (q->n_lg < MAXTOK) memcpy(q->lg + (size_t)q->n_lg * n, l, (size_t)n * sizeof *l);
  q->n_lg++;
}

static inline void req_set(req *q, const int32_t *p, int n, const int32_t *b, int nb,
                           const int32_t *sp, int ns) {
  float *lg = q->lg;
  memset(q, 0, sizeof *q);
  q->lg = lg ? lg : malloc((size_t)MAXTOK * V * sizeof(float));
  q->prompt = p;
  q->n = n;
  q->bounds = b;
  q->nb = nb;
  q->splits = sp;
  q->ns = ns;
  q->max_tokens = MAXTOK;
}

static inline void req_submit(rig *g, req *q) {
  q->n_tok = q->n_lg = 0;
  q->finish = FINISH_NONE;
  q->cached = -1;
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  so.prompt = q->prompt;
  so.n_prompt = q->n;
  sampling_params_default(&so.sp);
  so.sp.temperature = 0;
  so.sp.max_tokens = q->max_tokens;
  so.sp.ignore_eos = 1;
  so.cache_salt = q->salt;
  so.boundaries = q->bounds;
  so.n_boundaries = q->nb;
  so.split_points = q->splits;
  so.n_split_points = q->ns;
  so.on_logits = on_logits;
  so.user = q;
  engine_status st;
  char err[200];
  q->h = engine_submit(g->e, &so, &st, err, sizeof err);
  if (!q->h) {
    printf("  submit: %s\n", err);
    q->finish = -1;
  }
}

/* waits for the first token (the request then holds pages and decodes) */
static inline int req_first(req *q) {
  engine_event ev;
  if (!q->h || !engine_next(q->h, &ev, RIG_WAIT_MS)) return 0;
  if (ev.has_token && q->n_tok < 64) q->tok[q->n_tok++] = ev.token;
  if (ev.finish) {
    q->finish = ev.finish;
    q->cached = ev.cached_tokens;
    engine_release(q->h);
    q->h = NULL;
  }
  return 1;
}

static inline void req_wait(req *q) {
  if (!q->h) return;
  engine_event ev;
  for (;;) {
    if (!engine_next(q->h, &ev, RIG_WAIT_MS)) {
      q->finish = -2;
      break;
    }
    if (ev.has_token && q->n_tok < 64) q->tok[q->n_tok++] = ev.token;
    if (ev.finish) {
      q->finish = ev.finish;
      q->cached = ev.cached_tokens;
      q->prompt_tokens = ev.prompt_tokens;
      break;
    }
  }
  engine_release(q->h);
  q->h = NULL;
}

static inline void req_run(rig *g, req *q) {
  req_submit(g, q);
  req_wait(q);
}

/* the cold reference of q: prefix cache off, q's bounds, the given split points */
static inline int cold(req *ref, const req *q, const int32_t *splits, int ns) {
  rig g;
  rig_opts ro = {0};
  if (rig_up(&g, &ro) != 0) {
    rig_down(&g);
    return -1;
  }
  req_set(ref, q->prompt, q->n, q->bounds, q->nb, splits, ns);
  ref->max_tokens = q->max_tokens;
  req_run(&g, ref);
  return rig_down(&g) && ref->finish == FINISH_LENGTH ? 0 : -1;
}

static inline void toks(int32_t *p, int n, uint32_t seed) {
  uint32_t x = seed;
  for (int i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    p[i] = (int32_t)((x >> 8) % 256);
  }
}

/* Reads h's events up to its final one (tokens into tok[0, cap), *n of them): its finish, or -2
 * when no event came within RIG_WAIT_MS. */
static inline int rig_collect(engine_req *h, int32_t *tok, int cap, int *n) {
  engine_event ev;
  for (;;) {
    if (!engine_next(h, &ev, RIG_WAIT_MS)) return -2;
    if (ev.has_token && *n < cap) tok[(*n)++] = ev.token;
    if (ev.finish) return ev.finish;
  }
}

/* ---- steps ahead (engine_step.c engine_step_flight) ------------------------------------- */

#define RIG_AHEAD_MAXREQ 16
typedef struct rig_out {
  int32_t tok[MAXTOK];
  int n, finish;
} rig_out;

/* Runs prompts[idx[k]] (lens[idx[k]] tokens) for k < n at once as plain-greedy requests (no
 * logits callback: the device-greedy path, steps ahead where on) with sp; their tokens and
 * finishes into res[idx[k]]. Returns how many ended by stop or length. */
static inline int rig_run_plain(rig *g, const int32_t *const *prompts, const int *lens,
                                const int *idx, int n, rig_out *res, const sampling_params *sp) {
  engine_req *h[RIG_AHEAD_MAXREQ];
  int ok = 0;
  for (int k = 0; k < n; k++) {
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = prompts[idx[k]];
    so.n_prompt = lens[idx[k]];
    so.sp = *sp;
    engine_status st;
    char err[200];
    h[k] = engine_submit(g->e, &so, &st, err, sizeof err);
    res[idx[k]].n = 0;
    res[idx[k]].finish = h[k] ? FINISH_NONE : -1;
  }
  for (int k = 0; k < n; k++) {
    if (!h[k]) continue;
    rig_out *o = &res[idx[k]];
    o->finish = rig_collect(h[k], o->tok, MAXTOK, &o->n);
    ok += o->finish == FINISH_LENGTH || o->finish == FINISH_STOP;
    engine_release(h[k]);
  }
  return ok;
}

/* Steps ahead against steps in turn: nreq (<= RIG_AHEAD_MAXREQ) plain-greedy requests of MAXTOK
 * tokens, alone, all at once, and all at once with request 0's `stop_at`-th output token as a
 * stop token (it ends some of them mid-output: their finish then takes effect after the step
 * issued ahead, which fed the stop token once more), on engines made by rig_up(ro) with steps
 * ahead off and on: the same tokens and finishes, steps went ahead (none with 0), some
 * request stopped mid-output, and every pool checks clean with nothing held (rig_down). */
static inline void rig_ahead_case(const rig_opts *ro, const int32_t *const *prompts,
                                  const int *lens, int nreq, int stop_at) {
  static rig_out ref[3][RIG_AHEAD_MAXREQ], got[3][RIG_AHEAD_MAXREQ];
  int all[RIG_AHEAD_MAXREQ];
  for (int i = 0; i < nreq; i++) all[i] = i;
  sampling_params sp, stop;
  sampling_params_default(&sp);
  sp.temperature = 0;
  sp.max_tokens = MAXTOK;
  sp.ignore_eos = 1;
  long long ahead_steps = 0;
  for (int on = 0; on < 2; on++) {
    rig_opts rao = *ro;
    rao.ahead = on ? 1 : -1;
    rig_out(*res)[RIG_AHEAD_MAXREQ] = on ? got : ref;
    rig g;
    REQUIRE(rig_up(&g, &rao) == 0);
    for (int i = 0; i < nreq; i++)
      EXPECT(rig_run_plain(&g, prompts, lens, &i, 1, res[0], &sp) == 1);
    EXPECT_EQ_INT(rig_run_plain(&g, prompts, lens, all, nreq, res[1], &sp), nreq);
    stop = sp;
    stop.stop_ids[0] = ref[0][0].tok[stop_at];
    stop.n_stop_ids = 1;
    EXPECT_EQ_INT(rig_run_plain(&g, prompts, lens, all, nreq, res[2], &stop), nreq);
    engine_stats st;
    engine_get_stats(g.e, &st);
    if (on)
      ahead_steps = st.steps_ahead;
    else
      EXPECT_MSG(st.steps_ahead == 0, "steps ahead off: %lld steps ahead", st.steps_ahead);
    EXPECT(rig_down(&g));
  }
  int stopped = 0, differ = 0;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < nreq; i++) {
      const rig_out *a = &got[k][i], *b = &ref[k][i];
      int eq = a->n == b->n && a->finish == b->finish &&
               !memcmp(a->tok, b->tok, (size_t)b->n * sizeof(int32_t));
      differ += !eq;
      EXPECT_MSG(eq, "cache %d set %d request %d: %d tokens (finish %d) ahead, %d (finish %d) not",
                 ro->cache, k, i, a->n, a->finish, b->n, b->finish);
      if (k == 2) stopped += b->finish == FINISH_STOP && b->n < MAXTOK;
    }
  printf(
      "  steps ahead, cache %s: %lld steps issued ahead, %d requests stopped mid-output, %d "
      "of %d outputs differ\n",
      ro->cache ? "on" : "off", ahead_steps, stopped, differ, 3 * nreq);
  EXPECT_MSG(ahead_steps > 0, "no step went ahead");
  EXPECT_MSG(stopped > 0, "no request stopped mid-output");
}

/* Sampled steps picked by the backend's sample op against the host sampler: nreq seeded
 * requests of MAXTOK tokens, alone and all at once, under four parameter sets (top-k + top-p;
 * min-p + top-p with min_tokens 3; top-p with penalties, logit_bias and min_tokens before a stop
 * token; set 0's with request 0's third token as a stop token), on engines made by rig_up(ro)
 * with the op off (the host), on with steps ahead off, and on with steps ahead on (steps issued
 * ahead where the rows' words carry no edits: sets 0, 1 past min_tokens, 3): the same tokens
 * and finishes; the op ran (and not when off); steps went ahead (only with steps ahead on,
 * never in set 2); some request stopped mid-output; the tokens are not all
 * one. */
static inline void rig_device_sample_case(const rig_opts *ro, const int32_t *const *prompts,
                                          const int *lens, int nreq) {
  static rig_out res[3][2][RIG_AHEAD_MAXREQ]; /* [run][alone, batched][request] */
  static int32_t stop_tok;
  int all[RIG_AHEAD_MAXREQ];
  for (int i = 0; i < nreq; i++) all[i] = i;
  int differ = 0, distinct = 0, stopped = 0;
  long long dev_steps = 0, ahead_steps = 0;
  for (int set = 0; set < 4; set++) {
    sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = set == 1 ? 1.0f : 0.8f;
    sp.top_k = set == 0 || set == 3 ? 40 : 0;
    sp.top_p = set == 0 || set == 3 ? 0.9f : 0.95f;
    sp.min_p = set == 1 ? 0.02f : 0.0f;
    sp.seed = 4242 + (uint64_t)(set == 3 ? 0 : set);
    sp.has_seed = 1;
    sp.max_tokens = MAXTOK;
    sp.ignore_eos = 1;
    if (set == 1) sp.min_tokens = 3; /* the rows go ahead once past it */
    if (set == 2) { /* the rows' edits: penalties, logit_bias, min_tokens before a stop token */
      sp.frequency_penalty = 0.6f;
      sp.presence_penalty = 0.3f;
      sp.n_bias = 2;
      sp.bias_ids[0] = 5;
      sp.bias[0] = 4.0f;
      sp.bias_ids[1] = 11;
      sp.bias[1] = -3.0f;
      sp.stop_ids[0] = 12;
      sp.n_stop_ids = 1;
      sp.min_tokens = MAXTOK / 2;
    }
    if (set == 3) { /* set 0's outputs, each cut at its first stop_tok */
      sp.stop_ids[0] = stop_tok;
      sp.n_stop_ids = 1;
    }
    for (int run = 0; run < 3; run++) {
      rig_opts rdo = *ro;
      rdo.device_sample = run ? 1 : -1;
      rdo.ahead = run == 2 ? 1 : -1;
      rig g;
      REQUIRE(rig_up(&g, &rdo) == 0);
      for (int i = 0; i < nreq; i++)
        EXPECT(rig_run_plain(&g, prompts, lens, &i, 1, res[run][0], &sp) == 1);
      EXPECT_EQ_INT(rig_run_plain(&g, prompts, lens, all, nreq, res[run][1], &sp), nreq);
      engine_stats st;
      engine_get_stats(g.e, &st);
      if (run)
        dev_steps += st.steps_device_sampled;
      else
        EXPECT_MSG(st.steps_device_sampled == 0, "op off: %lld steps", st.steps_device_sampled);
      if (run == 2 && set != 2) EXPECT_MSG(st.steps_ahead > 0, "set %d: no step went ahead", set);
      if (run < 2 || set == 2)
        EXPECT_MSG(st.steps_ahead == 0, "set %d run %d: %lld steps ahead", set, run,
                   st.steps_ahead);
      if (run == 2) ahead_steps += st.steps_ahead;
      EXPECT(rig_down(&g));
    }
    if (set == 0) stop_tok = res[0][0][0].n > 2 ? res[0][0][0].tok[2] : 0;
    for (int run = 1; run < 3; run++)
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < nreq; i++) {
          const rig_out *a = &res[run][k][i], *b = &res[0][k][i];
          int eq = a->n == b->n && a->finish == b->finish &&
                   !memcmp(a->tok, b->tok, (size_t)b->n * sizeof(int32_t));
          differ += !eq;
          if (!eq) {
            int t = 0;
            while (t < a->n && t < b->n && a->tok[t] == b->tok[t]) t++;
            printf(
                "  set %d %s %s request %d: first difference at token %d of %d / %d: op %d, "
                "host %d\n",
                set, run == 2 ? "ahead" : "in turn", k ? "batched" : "alone", i, t, a->n, b->n,
                t < a->n ? a->tok[t] : -1, t < b->n ? b->tok[t] : -1);
          }
          EXPECT_MSG(eq, "set %d %s %s request %d: the op's tokens differ from the host's", set,
                     run == 2 ? "ahead" : "in turn", k ? "batched" : "alone", i);
          for (int t = 1; t < b->n; t++) distinct |= b->tok[t] != b->tok[0];
          if (set == 3 && run == 1) stopped += b->finish == FINISH_STOP && b->n < MAXTOK;
        }
  }
  printf(
      "  sampled steps by the op: %lld (%lld issued ahead), %d requests stopped mid-output, "
      "%d of %d outputs differ from the host sampler's\n",
      dev_steps, ahead_steps, stopped, differ, 16 * nreq);
  EXPECT_MSG(dev_steps >= 4 * nreq * (MAXTOK - 1), "only %lld steps by the op", dev_steps);
  EXPECT_MSG(stopped > 0, "no request stopped mid-output");
  EXPECT_MSG(distinct, "every output repeats one token");
}

/* prompt = shared[0, ns) + suffix of n - ns tokens (seeded), first suffix token forced */
static inline void prompt_make(int32_t *p, const int32_t *shared, int ns, int n, uint32_t seed,
                               int32_t first) {
  memcpy(p, shared, (size_t)ns * sizeof *p);
  toks(p + ns, n - ns, seed);
  p[ns] = first;
}

#endif
