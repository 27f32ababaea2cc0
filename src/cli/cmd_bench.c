/* cmd_bench — `deltaserve bench`: the headline numbers of the real engine on one model, as
 * one JSON file next to the llama.cpp figures of shared/design/anchors.md.
 *
 *   deltaserve bench --model DIR [--device cpu|cuda|auto] [--threads N] --out FILE.json
 *                    [--quick] [--seed N] [--only decode|prefill] [--decode-repeats N]
 *                    [--commit SHA] [--speculative-config JSON [--spec-replay P]]
 *                    [engine flags]
 *
 * Everything runs through engine_create / engine_submit / engine_next over a model whose pools
 * are sized by engine_mem_plan, in these phases over one backend:
 *
 *   A  prefix caching off (the protocol of llama-bench / llama-batched-bench, which cache
 *      nothing): offline prefill of 512, 4096 and 16384 random tokens (one request,
 *      max_tokens 1, submit -> first token, median of a few runs after a warm-up), then decode
 *      with 1, 8, 32, 64, 128 concurrent sequences of 512 random prompt tokens and 128 greedy
 *      tokens (ignore_eos), each level after a 16-token run of the same shape (one-time work
 *      per step shape out of the window): tokens generated after the last sequence's first
 *      token, over the time from then to the last token. That window holds decode steps
 *      only: every prompt is prefilled (the staggered prefill of up to
 *      max_num_batched_tokens per step, decode rows of the earlier sequences riding along)
 *      before the last first token, and the window's batch only shrinks at the end as the
 *      earliest sequences finish. `--decode-repeats N` measures each level N times after its
 *      warm-up and reports the median (every run in info.decode_runs_tok_s; single runs
 *      spread by a few per cent). `--only decode` runs just this part (with its
 *      warm-up) and skips prefill, C and B; `--only prefill` runs the prefill part only.
 *      With --speculative-config every decode level runs first on an engine without
 *      speculation over the same model (the plain pass: its prompts and tokens kept, per run),
 *      then as configured on those prompts: decode_plain_tok_s_N beside decode_tok_s_N, their
 *      ratio, vLLM's mean acceptance length (1 + accepted drafts per verify step) and the draft
 *      acceptance rate from the engine's spec_decode counters over the measured runs, and a
 *      check that the speculative tokens are the plain ones (verification is lossless).
 *      --spec-replay P: the drafts are each sequence's plain-pass tokens, each replaced by
 *      another with probability P (spec_replay.h) — the speed at a chosen acceptance.
 *   C  with the engine stopped, one checkpoint's copies timed directly on the same model:
 *      capture = slot -> slab (qwen35_slot_copy), restore = slab -> slot plus the copy-on-write
 *      copy of the partial last KV page; each followed by a backend sync
 *      (capture_pause_idle_ms, restore_pause_idle_ms).
 *   B  prefix caching on (a fresh model with that plan): 8 simultaneous requests sharing an
 *      uncached 12,475-token prefix plus distinct 50-token suffixes (seconds until the last
 *      first token), then the same prefix with a new 50-token suffix (TTFT), with the engine's
 *      prefix-cache counters of each part.
 *   D  prefix caching on: 32 sequences decode in the background while fresh 1,000-token prompts
 *      run twice each (capture, then restore); capture_pause_ms / restore_pause_ms are the mean
 *      times of those checkpoint copies from the engine's own timing (bench_pause).
 *
 * Roofline: bytes per decode step (weights + KV read + 2x recurrent state per sequence) over
 * 4.24 TB/s and FLOPs per prefill token over 780 TFLOP/s (the H200 ceilings measured on the
 * GPU machine), each with the achieved fraction. --quick scales every size down for CPU smoke
 * tests; the JSON's "sizes" says what ran. Errors: one line on stderr, exit 1 (the JSON is
 * still written, with null for what could not be measured). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef DS_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#endif

#include "backend/backend_create.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/cli_flags.h"
#include "cli/cli_load.h"
#include "cli/cli_vllm.h"
#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "model/config.h"
#include "model/qwen35.h"
#include "model/weights.h"

#define BENCH_BW_BYTES_S 4.24e12 /* measured device-to-device copy, H200 */
#define BENCH_FLOPS_S 780e12     /* measured bf16 GEMM, H200 */
#define BENCH_EVENT_TIMEOUT_MS (20 * 60 * 1000)
#define BENCH_N_PREFILL 3
#define BENCH_N_DECODE 5

static const int bench_prefill_names[BENCH_N_PREFILL] = {512, 4096, 16384};
static const int bench_decode_names[BENCH_N_DECODE] = {1, 8, 32, 64, 128};
#define BENCH_MAX_REPEATS 20 /* --decode-repeats at most */
#define BENCH_MAX_CONC 1024  /* --decode-conc at most */

/* llama.cpp on the same H200 and shape (anchors.md, 2026-11-29). */
static const struct {
  const char *key;
  double value;
} bench_peers[] = {
    {"prefill_tok_s_512", 21759},
    {"decode_tok_s_1", 248},
    {"decode_tok_s_8", 1240},
    {"decode_tok_s_32", 2738},
    {"decode_tok_s_64", 3385},
    {"decode_tok_s_128", 3788},
    {"shared_prefix_8x12k_all_first_token_s", 5.5},
    {"warm_prefix_ttft_ms", 88},
};

typedef struct bench_sizes {
  int prefill_len[BENCH_N_PREFILL];
  int prefill_repeats;
  int decode_conc[BENCH_N_DECODE];
  int decode_prompt, decode_gen;
  int prefix_len, suffix_len, prefix_n, warm_repeats;
  int ckpt_repeats;
  int pause_bg, pause_gen, pause_len, pause_pairs; /* D: the pauses while pause_bg decode */
} bench_sizes;

static const bench_sizes bench_full = {
    {512, 4096, 16384}, 3, {1, 8, 32, 64, 128}, 512, 128, 12475, 50, 8, 3, 20, 32, 4096, 1000, 8};
static const bench_sizes bench_quick = {
    {64, 128, 256}, 2, {1, 8, 32, 64, 128}, 32, 8, 300, 10, 8, 2, 5, 32, 1024, 48, 3};

/* One decode run of a speculative bench: its prompts and the tokens the plain pass generated
 * for them. The speculative pass feeds the same prompts, checks its tokens against these
 * (verification is lossless) and, with --spec-replay, drafts from them (spec_replay.h). */
typedef struct bench_rec {
  int n, G;
  int32_t **prompts; /* [n][prompt length] (bench_prompts) */
  int32_t **toks;    /* [n][G] */
  int mismatched;    /* sequences of the speculative pass whose tokens differ */
} bench_rec;

typedef enum {
  BENCH_RUN_PLAIN,  /* fresh random prompts, nothing kept */
  BENCH_RUN_RECORD, /* fresh random prompts, kept with the tokens in a bench_rec */
  BENCH_RUN_REPLAY, /* a bench_rec's prompts; tokens checked against it, drafts from it with
                       --spec-replay */
} bench_run_mode;

typedef struct bench {
  const char *model_dir, *device;
  const char *commit; /* --commit (NULL: the checkout's HEAD) */
  int threads, quick, batch_invariant;
  backend_kv_dtype kv_dtype; /* --kv-cache-dtype */
  const char *only;          /* NULL: everything; "decode" or "prefill": those figures only */
  int only_conc;          /* > 0: of the decode runs only the one at this concurrency (profiling) */
  int decode_repeats;     /* measured decode runs per level (the median is reported) */
  int decode_prompt;      /* > 0: the decode runs' prompt length instead of the size's */
  int decode_shared;      /* > 0: the decode runs' prompts share their first this many tokens
                             (prefix caching on: the shared pages are one copy) */
  int32_t *shared_prefix; /* [decode_shared] */
  float temperature, top_p; /* every request's sampling (default greedy: 0, 1, 0) */
  int top_k;
  float frequency_penalty, presence_penalty;
  bench_sizes sz;
  engine_opts user; /* engine flags from the command line */
  /* speculative decoding (--speculative-config): each decode level runs on an engine without
   * speculation first (the plain pass, recorded in recs), then as configured on the same prompts */
  int spec;
  int replay_pm;   /* --spec-replay P as parts per 1000; -1: the method's drafts */
  bench_rec *recs; /* [n_recs]: per decode level, its warm-up then its repeats */
  int n_recs;
  const bench_rec *cur_replay; /* bench_submit: the drafts of the batch it submits (NULL: none) */
  weights_opts load;           /* --quantization, --load-format */
  int user_kv_tokens, user_max_seqs;
  model_config cfg;
  model_weights w;
  int have_w;
  backend *be;                      /* ranks[0], the one that holds the logits */
  backend *ranks[CLI_FLAGS_TP_MAX]; /* --tensor-parallel-size ranks */
  int tp, n_ranks;
  qwen35 *m;
  engine *e;
  uint64_t rng;
  json_t *metrics, *info;
  char err[512];
} bench;

/* One request of a batch and what its consumer thread saw. */
typedef struct bench_req {
  engine_req *h;
  int max_tokens;
  double *ts;   /* [max_tokens] arrival time of each token */
  int32_t *ids; /* [max_tokens] the tokens */
  int n_tok;
  int finish, cached_tokens;
  char err[200];
  pthread_t th;
  int started;
} bench_req;

static double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t bench_rand(bench *b) { /* splitmix64 */
  uint64_t z = (b->rng += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static void bench_fill(bench *b, int32_t *t, int n) {
  for (int i = 0; i < n; i++) t[i] = (int32_t)(bench_rand(b) % (uint64_t)b->cfg.vocab_size);
}

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Stores a number, or null when it is not finite (a failed measurement). */
static void bench_set(json_t *o, const char *key, double v) {
  json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

static void *bench_consume(void *arg) {
  bench_req *r = arg;
  engine_event ev;
  int cancelled = 0;
  for (;;) {
    if (!engine_next(r->h, &ev, cancelled ? -1 : BENCH_EVENT_TIMEOUT_MS)) {
      snprintf(r->err, sizeof r->err, "no event for %d s: cancelled",
               BENCH_EVENT_TIMEOUT_MS / 1000);
      engine_cancel(r->h);
      cancelled = 1;
      continue;
    }
    double t = bench_now();
    if (ev.has_token && r->n_tok < r->max_tokens) {
      r->ts[r->n_tok] = t;
      r->ids[r->n_tok] = ev.token;
      __atomic_store_n(&r->n_tok, r->n_tok + 1, __ATOMIC_RELEASE); /* bench_pause polls it */
    }
    if (ev.finish != FINISH_NONE) {
      r->finish = ev.finish;
      r->cached_tokens = ev.cached_tokens;
      if (ev.finish == FINISH_ERROR && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", ev.err);
      break;
    }
  }
  return NULL;
}

/* Submits n requests at once (prompts[i] of lens[i] tokens, greedy, ignore_eos, max_tokens,
 * one chat boundary at `boundary` when > 0), each drained by its own consumer thread. *t0 is
 * the time just before the first submit. Returns 0, or -1 with b->err (the requests submitted
 * so far still run: bench_join them). reqs[i].ts must be freed by the caller (bench_reqs_free). */
static int bench_submit(bench *b, int n, int32_t **prompts, const int *lens, int max_tokens,
                        int boundary, bench_req *reqs, double *t0) {
  memset(reqs, 0, sizeof *reqs * (size_t)n);
  int rc = 0;
  for (int i = 0; i < n; i++) {
    reqs[i].max_tokens = max_tokens;
    reqs[i].ts = malloc(sizeof *reqs[i].ts * (size_t)max_tokens);
    reqs[i].ids = malloc(sizeof *reqs[i].ids * (size_t)max_tokens);
    if (!reqs[i].ts || !reqs[i].ids) return errf(b->err, sizeof b->err, "out of memory");
  }
  int32_t bnd = boundary;
  *t0 = bench_now();
  for (int i = 0; i < n; i++) {
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = prompts[i];
    so.n_prompt = lens[i];
    sampling_params_default(&so.sp);
    so.sp.temperature = b->temperature;
    so.sp.top_p = b->top_p;
    so.sp.top_k = b->top_k;
    so.sp.frequency_penalty = b->frequency_penalty;
    so.sp.presence_penalty = b->presence_penalty;
    so.sp.seed = 1000 + (uint64_t)i;
    so.sp.has_seed = 1;
    so.sp.max_tokens = max_tokens;
    so.sp.ignore_eos = 1;
    if (boundary > 0) {
      so.boundaries = &bnd;
      so.n_boundaries = 1;
    }
    if (b->cur_replay) { /* the plain pass's tokens of this sequence, as drafts */
      so.draft_replay = b->cur_replay->toks[i];
      so.n_draft_replay = b->cur_replay->G;
      so.draft_corrupt_pm = b->replay_pm;
      so.draft_replay_follow = 1;
    }
    engine_status st;
    char err[200] = "";
    reqs[i].h = engine_submit(b->e, &so, &st, err, sizeof err);
    if (!reqs[i].h) {
      errf(b->err, sizeof b->err, "submit of a %d-token request failed: %s", lens[i], err);
      rc = -1;
      break;
    }
  }
  for (int i = 0; i < n && reqs[i].h; i++) {
    if (pthread_create(&reqs[i].th, NULL, bench_consume, &reqs[i]) != 0) {
      engine_cancel(reqs[i].h);
      bench_consume(&reqs[i]);
      snprintf(reqs[i].err, sizeof reqs[i].err, "cannot start a thread");
      continue;
    }
    reqs[i].started = 1;
  }
  return rc;
}

/* Waits for the submitted requests to end and releases them; with `full`, checks that each
 * produced exactly max_tokens tokens (rc: the caller's status so far, kept when non-zero). */
static int bench_join(bench *b, int n, bench_req *reqs, int full, int rc) {
  for (int i = 0; i < n && reqs[i].h; i++) {
    if (reqs[i].started) pthread_join(reqs[i].th, NULL);
    engine_release(reqs[i].h);
    reqs[i].h = NULL;
    if (rc == 0 && full && (reqs[i].err[0] || reqs[i].n_tok != reqs[i].max_tokens)) {
      errf(b->err, sizeof b->err, "request %d of %d: %s (%d of %d tokens, finish %s)", i + 1, n,
           reqs[i].err[0] ? reqs[i].err : "ended early", reqs[i].n_tok, reqs[i].max_tokens,
           finish_reason_name((finish_reason)reqs[i].finish));
      rc = -1;
    }
  }
  return rc;
}

/* bench_submit, then bench_join checking every request's token count. */
static int bench_batch(bench *b, int n, int32_t **prompts, const int *lens, int max_tokens,
                       int boundary, bench_req *reqs, double *t0) {
  int rc = bench_submit(b, n, prompts, lens, max_tokens, boundary, reqs, t0);
  return bench_join(b, n, reqs, 1, rc);
}

static void bench_reqs_free(bench_req *reqs, int n) {
  for (int i = 0; i < n; i++) {
    free(reqs[i].ts);
    free(reqs[i].ids);
  }
}

/* n random prompts of len tokens each (prefix_len > 0: the first prefix_len tokens are
 * `prefix`). Returns NULL on out of memory. */
static int32_t **bench_prompts(bench *b, int n, int len, const int32_t *prefix, int prefix_len) {
  int32_t **p = calloc((size_t)n, sizeof *p);
  if (!p) return NULL;
  for (int i = 0; i < n; i++) {
    p[i] = malloc(sizeof **p * (size_t)len);
    if (!p[i]) {
      for (int j = 0; j < i; j++) free(p[j]);
      free(p);
      return NULL;
    }
    if (prefix_len > 0) memcpy(p[i], prefix, sizeof *prefix * (size_t)prefix_len);
    bench_fill(b, p[i] + prefix_len, len - prefix_len);
  }
  return p;
}

static void bench_prompts_free(int32_t **p, int n) {
  if (!p) return;
  for (int i = 0; i < n; i++) free(p[i]);
  free(p);
}

/* One request of len random tokens, max_tokens 1: seconds from submit to the first token. */
static int bench_ttft(bench *b, int len, double *s) {
  int32_t **p = bench_prompts(b, 1, len, NULL, 0);
  if (!p) return errf(b->err, sizeof b->err, "out of memory");
  bench_req r;
  double t0;
  int rc = bench_batch(b, 1, p, &len, 1, 0, &r, &t0);
  if (rc == 0) *s = r.ts[0] - t0;
  bench_reqs_free(&r, 1);
  bench_prompts_free(p, 1);
  return rc;
}

static int bench_prefill(bench *b, int len, double *tok_s, double *median_s) {
  double warm;
  if (bench_ttft(b, len, &warm)) return -1;
  double v[16];
  int n = b->sz.prefill_repeats < 16 ? b->sz.prefill_repeats : 16;
  for (int i = 0; i < n; i++)
    if (bench_ttft(b, len, &v[i])) return -1;
  *median_s = bench_median(v, n);
  *tok_s = len / *median_s;
  return 0;
}

static void bench_recs_free(bench *b) {
  for (int i = 0; i < b->n_recs; i++) {
    bench_rec *c = &b->recs[i];
    bench_prompts_free(c->prompts, c->n);
    for (int j = 0; c->toks && j < c->n; j++) free(c->toks[j]);
    free(c->toks);
  }
  free(b->recs);
  b->recs = NULL;
  b->n_recs = 0;
}

/* n sequences of P tokens generating G tokens each: tokens generated after the last
 * sequence's first token over the time from then to the last token. The prompts are random
 * (mode BENCH_RUN_PLAIN; BENCH_RUN_RECORD: kept in *rec with the tokens) or rec's
 * (BENCH_RUN_REPLAY: n and G must be rec's; rec->mismatched counts the sequences whose tokens
 * differ from rec's; with --spec-replay the drafts are rec's tokens). */
static int bench_decode(bench *b, int n, int P, int G, double *tok_s, double *phase_s,
                        bench_run_mode mode, bench_rec *rec) {
  int S = b->decode_shared < P ? b->decode_shared : P;
  if (S > 0 && !b->shared_prefix) { /* one prefix for every run: cached after the first */
    if (!(b->shared_prefix = malloc(sizeof *b->shared_prefix * (size_t)S)))
      return errf(b->err, sizeof b->err, "out of memory");
    bench_fill(b, b->shared_prefix, S);
  }
  if (mode == BENCH_RUN_REPLAY) CHECK(rec->n == n && rec->G == G && rec->prompts);
  int32_t **p =
      mode == BENCH_RUN_REPLAY ? rec->prompts : bench_prompts(b, n, P, b->shared_prefix, S);
  int *lens = calloc((size_t)n, sizeof *lens);
  bench_req *r = malloc(sizeof *r * (size_t)n);
  int32_t **kept = mode == BENCH_RUN_RECORD ? calloc((size_t)n, sizeof *kept) : NULL;
  if (!p || !lens || !r || (mode == BENCH_RUN_RECORD && !kept)) {
    if (mode != BENCH_RUN_REPLAY) bench_prompts_free(p, n);
    free(lens);
    free(r);
    free(kept);
    return errf(b->err, sizeof b->err, "out of memory");
  }
  for (int i = 0; i < n; i++) lens[i] = P;
  double t0;
  b->cur_replay = mode == BENCH_RUN_REPLAY && b->replay_pm >= 0 ? rec : NULL;
  int rc = bench_batch(b, n, p, lens, G, 0, r, &t0);
  b->cur_replay = NULL;
  if (rc == 0 && mode == BENCH_RUN_REPLAY) {
    rec->mismatched = 0;
    for (int i = 0; i < n; i++)
      rec->mismatched += memcmp(r[i].ids, rec->toks[i], sizeof *r[i].ids * (size_t)G) != 0;
  }
  if (rc == 0 && mode == BENCH_RUN_RECORD) {
    *rec = (bench_rec){n, G, p, kept, 0};
    for (int i = 0; i < n; i++) { /* the ids buffers change hands */
      kept[i] = r[i].ids;
      r[i].ids = NULL;
    }
    p = NULL;
  }
  if (rc == 0) {
    double start = 0, end = 0;
    for (int i = 0; i < n; i++) {
      if (r[i].ts[0] > start) start = r[i].ts[0];
      if (r[i].ts[G - 1] > end) end = r[i].ts[G - 1];
    }
    long long toks = 0;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < G; k++) toks += r[i].ts[k] > start;
    *phase_s = end - start;
    *tok_s = *phase_s > 0 ? (double)toks / *phase_s : NAN;
  }
  if (rc != 0) free(kept);
  bench_reqs_free(r, n);
  if (mode != BENCH_RUN_REPLAY) bench_prompts_free(p, n);
  free(lens);
  free(r);
  return rc;
}

static json_t *bench_stats_json(const engine_stats *a, const engine_stats *z) {
  json_t *o = json_object();
  json_object_set_new(o, "prefix_queries", json_integer(z->prefix_queries - a->prefix_queries));
  json_object_set_new(o, "prefix_hits", json_integer(z->prefix_hits - a->prefix_hits));
  json_object_set_new(o, "prefix_hit_tokens",
                      json_integer(z->prefix_hit_tokens - a->prefix_hit_tokens));
  json_object_set_new(o, "prefix_captures", json_integer(z->prefix_captures - a->prefix_captures));
  json_object_set_new(o, "prefix_capture_failures",
                      json_integer(z->prefix_capture_failures - a->prefix_capture_failures));
  json_object_set_new(o, "prefix_restore_failures",
                      json_integer(z->prefix_restore_failures - a->prefix_restore_failures));
  json_object_set_new(o, "prefix_evictions",
                      json_integer(z->prefix_evictions - a->prefix_evictions));
  json_object_set_new(o, "prompt_tokens",
                      json_integer(z->prompt_tokens_total - a->prompt_tokens_total));
  json_object_set_new(o, "prefilled_tokens",
                      json_integer(z->prefilled_tokens_total - a->prefilled_tokens_total));
  json_object_set_new(o, "snapshot_slabs_total", json_integer(z->snapshot_slabs_total));
  json_object_set_new(o, "snapshot_slabs_used", json_integer(z->snapshot_slabs_used));
  json_object_set_new(o, "kv_pages_cached", json_integer(z->kv_pages_cached));
  return o;
}

/* Stats that include everything finished so far (engine_check runs between steps). */
static void bench_stats(bench *b, engine_stats *s) {
  char err[200];
  if (engine_check(b->e, err, sizeof err)) log_warn("bench: engine check: %s", err);
  engine_get_stats(b->e, s);
}

/* The shared-prefix wave and the warm-prefix TTFT (phase B). */
static int bench_prefix(bench *b) {
  const bench_sizes *z = &b->sz;
  int S = z->prefix_len, X = z->suffix_len, n = z->prefix_n, L = S + X;
  int32_t *prefix = malloc(sizeof *prefix * (size_t)S);
  int32_t **wave = NULL, **warm = NULL, **wu = NULL;
  int *lens = calloc((size_t)(n > z->warm_repeats ? n : z->warm_repeats), sizeof *lens);
  bench_req *r = malloc(sizeof *r * (size_t)n);
  int rc = -1;
  if (!prefix || !lens || !r) {
    errf(b->err, sizeof b->err, "out of memory");
    goto out;
  }
  /* warm-up on an unrelated prefix: kernels, graphs and allocations out of the numbers */
  bench_fill(b, prefix, S);
  wu = bench_prompts(b, 1, L, prefix, S);
  double t0;
  lens[0] = L;
  if (!wu || bench_batch(b, 1, wu, lens, 1, S, r, &t0)) {
    if (!wu) errf(b->err, sizeof b->err, "out of memory");
    bench_reqs_free(r, 1);
    goto out;
  }
  bench_reqs_free(r, 1);

  bench_fill(b, prefix, S); /* a prefix nothing has seen */
  wave = bench_prompts(b, n, L, prefix, S);
  warm = bench_prompts(b, z->warm_repeats, L, prefix, S);
  if (!wave || !warm) {
    errf(b->err, sizeof b->err, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) lens[i] = L;
  engine_stats s0, s1, s2;
  bench_stats(b, &s0);
  if (bench_batch(b, n, wave, lens, 1, S, r, &t0)) {
    bench_reqs_free(r, n);
    goto out;
  }
  double last = 0, first = INFINITY;
  long long cached = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].ts[0] > last) last = r[i].ts[0];
    if (r[i].ts[0] < first) first = r[i].ts[0];
    cached += r[i].cached_tokens;
  }
  bench_reqs_free(r, n);
  bench_stats(b, &s1);
  bench_set(b->metrics, "shared_prefix_8x12k_all_first_token_s", last - t0);
  bench_set(b->metrics, "shared_prefix_first_ttft_s", first - t0);
  bench_set(b->metrics, "shared_prefix_prefilled_tokens",
            (double)(s1.prefilled_tokens_total - s0.prefilled_tokens_total));
  bench_set(b->metrics, "shared_prefix_cached_tokens", (double)cached);

  double v[16];
  int nw = z->warm_repeats < 16 ? z->warm_repeats : 16;
  long long warm_cached = 0;
  for (int i = 0; i < nw; i++) {
    lens[0] = L;
    if (bench_batch(b, 1, &warm[i], lens, 1, S, r, &t0)) {
      bench_reqs_free(r, 1);
      goto out;
    }
    v[i] = r[0].ts[0] - t0;
    warm_cached += r[0].cached_tokens;
    bench_reqs_free(r, 1);
  }
  bench_stats(b, &s2);
  bench_set(b->metrics, "warm_prefix_ttft_ms", 1e3 * bench_median(v, nw));
  bench_set(b->metrics, "warm_prefix_cached_tokens", (double)warm_cached / nw);
  bench_set(b->metrics, "warm_prefix_prefilled_tokens",
            (double)(s2.prefilled_tokens_total - s1.prefilled_tokens_total) / nw);
  json_t *ps = json_object();
  json_object_set_new(ps, "shared_wave", bench_stats_json(&s0, &s1));
  json_object_set_new(ps, "warm", bench_stats_json(&s1, &s2));
  json_object_set_new(ps, "note",
                      json_string("engine_get_stats deltas; no hits means the engine did not "
                                  "reuse the prefix (every token recomputed)"));
  json_object_set_new(b->info, "prefix_stats", ps);
  rc = 0;
out:
  bench_prompts_free(wu, 1);
  bench_prompts_free(wave, n);
  bench_prompts_free(warm, z->warm_repeats);
  free(prefix);
  free(lens);
  free(r);
  return rc;
}

/* Phase C: one checkpoint's copies, timed with the engine stopped (slots hold real state from
 * phase A). Capture = slot -> slab; restore = slab -> slot + the partial last page. */
static int bench_checkpoint(bench *b, int n_slots, int n_pages) {
  if (n_slots < 2 || n_pages < 2)
    return errf(b->err, sizeof b->err, "too few slots to time copies");
  int half = n_slots / 2, phalf = n_pages / 2, reps = b->sz.ckpt_repeats;
  double cap[64], res[64];
  if (reps > 64) reps = 64;
  for (int i = -3; i < reps; i++) { /* three warm-ups */
    int src = (i + 3) % half, dst = half + (i + 3) % half;
    int ps = (i + 3) % phalf, pd = phalf + (i + 3) % phalf;
    double t0 = bench_now();
    int rc = qwen35_slot_copy(b->m, dst, src);
    if (rc == 0) rc = b->be->sync(b->be, b->err, sizeof b->err);
    double t1 = bench_now();
    if (rc == 0) rc = qwen35_slot_copy(b->m, src, dst);
    if (rc == 0) rc = qwen35_page_copy(b->m, ps, pd);
    if (rc == 0) rc = b->be->sync(b->be, b->err, sizeof b->err);
    double t2 = bench_now();
    if (rc) return b->err[0] ? -1 : errf(b->err, sizeof b->err, "slot or page copy failed");
    if (i >= 0) {
      cap[i] = t1 - t0;
      res[i] = t2 - t1;
    }
  }
  bench_set(b->metrics, "capture_pause_idle_ms", 1e3 * bench_median(cap, reps));
  bench_set(b->metrics, "restore_pause_idle_ms", 1e3 * bench_median(res, reps));
  bench_set(b->metrics, "checkpoint_bytes", (double)qwen35_slot_bytes(b->m));
  json_object_set_new(b->info, "capture_idle_source",
                      json_string("direct: qwen35_slot_copy (+ qwen35_page_copy of one page for "
                                  "restore) then a backend sync, engine stopped"));
  return 0;
}

/* D: the checkpoint pauses while pause_bg sequences decode. pause_bg requests (decode_prompt
 * random tokens, pause_gen tokens, greedy) run in the background; once every one has its first
 * token, pause_pairs times a fresh prompt of pause_len tokens runs twice with max_tokens 1: the
 * first run captures checkpoints of it, the second restores one (cached_tokens > 0 is checked).
 * Then the background requests are cancelled; every one must still have been decoding. The
 * engine times each checkpoint copy (engine_stats.ckpt_*: the copies are synchronous and run
 * between two steps, so their time is the pause every decoding sequence sees); the figures are
 * the means over the window. */
static int bench_pause(bench *b) {
  const bench_sizes *z = &b->sz;
  int n = z->pause_bg, P = z->decode_prompt, G = z->pause_gen, L = z->pause_len;
  int32_t **bg = bench_prompts(b, n, P, NULL, 0),
          **pp = bench_prompts(b, z->pause_pairs, L, NULL, 0);
  int *lens = calloc((size_t)n, sizeof *lens);
  bench_req *r = calloc((size_t)n, sizeof *r);
  if (!bg || !pp || !lens || !r) {
    bench_prompts_free(bg, n);
    bench_prompts_free(pp, z->pause_pairs);
    free(lens);
    free(r);
    return errf(b->err, sizeof b->err, "out of memory");
  }
  for (int i = 0; i < n; i++) lens[i] = P;
  double t0;
  int rc = bench_submit(b, n, bg, lens, G, 0, r, &t0);
  /* every background request decoding (generous ceiling: a stuck engine fails, a slow one not) */
  for (int i = 0; rc == 0 && i < n; i++)
    while (__atomic_load_n(&r[i].n_tok, __ATOMIC_ACQUIRE) < 1 && !r[i].finish) {
      if (bench_now() - t0 > 600) {
        rc = errf(b->err, sizeof b->err, "background request %d has no first token after 600 s", i);
        break;
      }
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
    }
  engine_stats a, e;
  bench_stats(b, &a);
  int tok0 = 0, restored = 0;
  for (int i = 0; i < n; i++) tok0 += __atomic_load_n(&r[i].n_tok, __ATOMIC_ACQUIRE);
  for (int k = 0; rc == 0 && k < z->pause_pairs; k++) {
    for (int run = 0; rc == 0 && run < 2; run++) {
      bench_req q;
      double tq;
      rc = bench_batch(b, 1, &pp[k], &L, 1, 0, &q, &tq);
      if (rc == 0 && run == 1) restored += q.cached_tokens > 0;
      bench_reqs_free(&q, 1);
    }
  }
  /* through engine_check: the snapshot is published at the end of a step, after the step's
   * finish events, so a plain read could miss the last run's restore */
  bench_stats(b, &e);
  int tok1 = 0, done_early = 0;
  for (int i = 0; i < n; i++) {
    tok1 += __atomic_load_n(&r[i].n_tok, __ATOMIC_ACQUIRE);
    done_early += __atomic_load_n(&r[i].n_tok, __ATOMIC_ACQUIRE) >= G;
  }
  for (int i = 0; i < n && r[i].h; i++) engine_cancel(r[i].h);
  rc = bench_join(b, n, r, 0, rc);
  long long nc = e.ckpt_captures_timed - a.ckpt_captures_timed;
  long long nr = e.ckpt_restores_timed - a.ckpt_restores_timed;
  if (rc == 0 && done_early)
    rc = errf(b->err, sizeof b->err, "%d background requests finished inside the window",
              done_early);
  if (rc == 0 && (nc < 1 || nr < 1 || restored < z->pause_pairs))
    rc = errf(b->err, sizeof b->err, "%lld captures, %lld restores, %d of %d second runs restored",
              nc, nr, restored, z->pause_pairs);
  if (rc == 0) {
    bench_set(b->metrics, "capture_pause_ms", (e.ckpt_capture_ms_sum - a.ckpt_capture_ms_sum) / nc);
    bench_set(b->metrics, "restore_pause_ms", (e.ckpt_restore_ms_sum - a.ckpt_restore_ms_sum) / nr);
    json_object_set_new(
        b->info, "pause_phase",
        json_pack("{s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:i, s:f, s:f, s:s}", "decoding", n,
                  "decode_prompt", P, "prompt_len", L, "pairs", z->pause_pairs, "captures",
                  (json_int_t)nc, "restores", (json_int_t)nr, "restore_page_copies",
                  (json_int_t)(e.ckpt_restore_page_copies - a.ckpt_restore_page_copies),
                  "decode_tokens_in_window", tok1 - tok0, "capture_max_ms", e.ckpt_capture_ms_max,
                  "restore_max_ms", e.ckpt_restore_ms_max, "source",
                  "engine_stats.ckpt_*: host time around each synchronous checkpoint copy, "
                  "between two steps, while the background sequences decode"));
  }
  bench_reqs_free(r, n);
  bench_prompts_free(bg, n);
  bench_prompts_free(pp, z->pause_pairs);
  free(lens);
  free(r);
  return rc;
}

/* Parameters of the matmuls one token goes through (MoE: the active experts), with or without
 * the vocabulary matrix (embedding / lm_head, counted once when tied). */
static double bench_params(const model_config *c, int with_vocab) {
  double H = c->hidden_size, p = 0;
  for (int l = 0; l < c->n_layers; l++) {
    if (c->layer_types[l] == LAYER_KIND_FULL) {
      p += H * (2.0 * c->n_heads * c->head_dim) + 2.0 * H * c->n_kv_heads * c->head_dim +
           (double)c->n_heads * c->head_dim * H;
    } else {
      double vdim = (double)c->lin_n_v_heads * c->lin_v_head_dim;
      p += H * c->conv_dim + H * vdim + 2.0 * H * c->lin_n_v_heads + vdim * H +
           (double)c->conv_dim * c->conv_kernel;
    }
    if (c->layer_is_moe[l] && c->n_experts > 0)
      p += H * c->n_experts + 3.0 * H * c->moe_intermediate_size * c->n_experts_per_tok +
           3.0 * H * c->shared_expert_intermediate_size +
           (c->shared_expert_intermediate_size ? H : 0);
    else
      p += 3.0 * H * c->intermediate_size;
  }
  if (with_vocab) p += (double)c->vocab_size * H * (c->tie_word_embeddings ? 1 : 2);
  return p;
}

/* FLOPs per prompt token of an L-token prefill with logits for the last row only: the matmuls
 * (no lm_head), causal attention at the mean position, the DeltaNet state products. */
static double bench_prefill_flops(const model_config *c, int L) {
  int nf = config_n_full_layers(c), nl = config_n_linear_layers(c);
  double attn = 4.0 * c->n_heads * c->head_dim * ((L + 1) / 2.0) * nf;
  double gdn = 6.0 * c->lin_n_v_heads * c->lin_k_head_dim * c->lin_v_head_dim * nl;
  return 2.0 * bench_params(c, 0) + attn + gdn;
}

/* Bytes one decode step must move for n sequences at context ctx: every weight once (as
 * uploaded: the packed copies left out), the KV of every sequence, each sequence's recurrent
 * state read and written. */
static double bench_decode_bytes(bench *b, int n, double ctx) {
  const model_config *c = &b->cfg;
  double kv_tok = 2.0 * config_n_full_layers(c) *
                  (double)backend_kv_page_bytes(b->be, c->n_kv_heads, c->head_dim) /
                  BACKEND_PAGE_TOKENS;
  int np;
  size_t pb, po;
  qwen35_packed(b->m, &np, &pb, &po);
  return (double)qwen35_weight_bytes(b->m) - (double)pb + n * ctx * kv_tok +
         2.0 * n * (double)qwen35_slot_bytes(b->m);
}

/* What a greedy decode step of n sequences actually reads: bench_decode_bytes without the
 * embedding matrix (its n rows only), with the lm-head as the step reads it — the CUDA
 * backend's int8 screen at <= 4 rows (backend_cuda_greedy_step_bytes), else the matrix — and
 * the packed copies in place of their weights where the step's products stream them
 * (backend_cuda_packed_rows). */
static double bench_decode_moved(bench *b, int n, double ctx) {
  const model_config *c = &b->cfg;
  size_t emb, lmh;
  qwen35_vocab_bytes(b->m, &emb, &lmh);
  double row = (double)lmh / c->vocab_size, head = (double)lmh, packed = 0;
#ifdef DS_CUDA
  if (!strcmp(b->be->name, "cuda")) {
    double sb = backend_cuda_greedy_step_bytes(b->be, n);
    if (sb > 0) head = sb;
    int np;
    size_t pb, po;
    qwen35_packed(b->m, &np, &pb, &po);
    if (np > 0 && backend_cuda_packed_rows(b->be, n)) packed = (double)pb - (double)po;
  }
#endif
  return bench_decode_bytes(b, n, ctx) - (double)emb - (double)lmh + head + n * row + packed;
}

/* <prefix>_<what>_<nm> = amount, <prefix>_ceiling_tok_s_<nm> = ceil, and the measured rate's
 * fraction of it, <prefix>_roofline_frac_<nm>. */
static void bench_roof_set(json_t *m, const char *prefix, const char *what, int nm, double amount,
                           double ceil, double meas) {
  char k[96];
  snprintf(k, sizeof k, "%s_%s_%d", prefix, what, nm);
  bench_set(m, k, amount);
  snprintf(k, sizeof k, "%s_ceiling_tok_s_%d", prefix, nm);
  bench_set(m, k, ceil);
  snprintf(k, sizeof k, "%s_roofline_frac_%d", prefix, nm);
  bench_set(m, k, meas / ceil);
}

/* metrics[<prefix>_tok_s_<nm>], NAN when missing */
static double bench_measured(json_t *m, const char *prefix, int nm) {
  char k[96];
  snprintf(k, sizeof k, "%s_tok_s_%d", prefix, nm);
  json_t *got = json_object_get(m, k);
  return got && json_is_number(got) ? json_number_value(got) : NAN;
}

static void bench_roofline(bench *b) {
  json_t *m = b->metrics;
  const bench_sizes *z = &b->sz;
  bench_set(m, "roofline_bw_bytes_per_s", BENCH_BW_BYTES_S);
  bench_set(m, "roofline_flops_per_s", BENCH_FLOPS_S);
  double ctx = z->decode_prompt + z->decode_gen / 2.0;
  for (int i = 0; i < BENCH_N_DECODE; i++) {
    int n = z->decode_conc[i], nm = bench_decode_names[i];
    double meas = bench_measured(m, "decode", nm);
    double bytes = bench_decode_bytes(b, n, ctx), moved = bench_decode_moved(b, n, ctx);
    bench_roof_set(m, "decode", "bytes_per_step", nm, bytes, n / (bytes / BENCH_BW_BYTES_S), meas);
    bench_roof_set(m, "decode_moved", "bytes_per_step", nm, moved, n / (moved / BENCH_BW_BYTES_S),
                   meas);
  }
  for (int i = 0; i < BENCH_N_PREFILL; i++) {
    int L = z->prefill_len[i], nm = bench_prefill_names[i];
    double f = bench_prefill_flops(&b->cfg, L);
    bench_roof_set(m, "prefill", "flops_per_token", nm, f, BENCH_FLOPS_S / f,
                   bench_measured(m, "prefill", nm));
  }
  json_object_set_new(b->info, "params_total", json_real(bench_params(&b->cfg, 1)));
  json_object_set_new(b->info, "params_no_vocab", json_real(bench_params(&b->cfg, 0)));
  json_object_set_new(b->info, "weight_bytes", json_integer((json_int_t)qwen35_weight_bytes(b->m)));
  {
    int np;
    size_t pb, po;
    qwen35_packed(b->m, &np, &pb, &po);
    json_object_set_new(b->info, "packed_weights", json_integer(np));
    json_object_set_new(b->info, "packed_bytes", json_integer((json_int_t)pb));
    json_object_set_new(b->info, "packed_replaced_bytes", json_integer((json_int_t)po));
  }
  size_t emb, lmh;
  qwen35_vocab_bytes(b->m, &emb, &lmh);
  json_object_set_new(b->info, "embed_bytes", json_integer((json_int_t)emb));
  json_object_set_new(b->info, "lm_head_bytes", json_integer((json_int_t)lmh));
  json_object_set_new(b->info, "vocab_row_bytes", json_real((double)lmh / b->cfg.vocab_size));
  json_object_set_new(b->info, "slot_bytes", json_integer((json_int_t)qwen35_slot_bytes(b->m)));
  json_object_set_new(b->info, "page_bytes", json_integer((json_int_t)qwen35_page_bytes(b->m)));
  json_object_set_new(b->info, "kv_cache_dtype",
                      json_string(b->kv_dtype == BACKEND_KV_FP8_E4M3 ? "fp8_e4m3" : "auto"));
  json_object_set_new(
      b->info, "roofline_note",
      json_string("decode: weights + n*ctx*KV/token + 2*n*slot bytes per step, "
                  "ctx = prompt + gen/2, over 4.24 TB/s (decode_moved_*: the "
                  "same without the embedding matrix, its n rows only, and with "
                  "the lm-head as the greedy step reads it: the int8 screen's "
                  "bytes where it runs, and the packed weight copies in place "
                  "of their bf16 rows where the step streams them); prefill: 2*params "
                  "(no lm_head: logits of the last row only) + causal attention "
                  "at the mean position + 6*nv*dk*dv per DeltaNet layer, over "
                  "780 TFLOP/s"));
}

/* The two ceilings measured in this run on the bench's device, before the model takes its
 * memory (full CUDA runs; the roofline's fractions keep the fixed figures, these say how far
 * this machine is from them): ceiling_copy_bytes_per_s, ceiling_gemm_flops_per_s and each one's
 * share of the fixed figure. */
static void bench_ceilings(bench *b) {
#ifdef DS_CUDA
  if (b->only || strcmp(b->be->name, "cuda")) return;
  double bw = 0, fl = 0;
  char err[256] = "";
  if (backend_cuda_ceilings(b->be, &bw, &fl, err, sizeof err))
    fprintf(stderr, "deltaserve bench: %s\n", err);
  if (bw > 0) {
    bench_set(b->metrics, "ceiling_copy_bytes_per_s", bw);
    bench_set(b->metrics, "ceiling_copy_of_roofline_bw", bw / BENCH_BW_BYTES_S);
  }
  if (fl > 0) {
    bench_set(b->metrics, "ceiling_gemm_flops_per_s", fl);
    bench_set(b->metrics, "ceiling_gemm_of_roofline_flops", fl / BENCH_FLOPS_S);
  }
  json_object_set_new(b->info, "ceilings_note",
                      json_string("measured in this run before the model loads: a 1 GiB "
                                  "device-to-device copy (2 x bytes / s) and a bf16 8192^3 "
                                  "cuBLAS GEMM (fp32 accumulation), best of three batches; the "
                                  "roofline fractions divide by the fixed 4.24 TB/s and 780 "
                                  "TFLOP/s"));
  fprintf(stderr, "bench: ceilings measured: copy %.3f TB/s, GEMM %.1f TFLOP/s\n", bw / 1e12,
          fl / 1e12);
#else
  (void)b;
#endif
}

/* Starts an engine for o (speculation off with `plain`) on the model as it is. */
static int bench_engine(bench *b, const engine_opts *o, int plain) {
  engine_opts eo = *o;
  if (plain) eo.spec.method = SPEC_METHOD_NONE;
  b->e = engine_create(b->m, &eo, b->err, sizeof b->err);
  return b->e ? 0 : -1;
}

/* (Re)initialises the model for opts and starts the engine (speculation off with `plain`: the
 * model is still made for o's, so that an engine with it can follow on the same model). */
static int bench_start(bench *b, engine_opts *o, qwen35_mem_opts *mo, int plain) {
  if (engine_mem_plan_device(o, &b->cfg, &b->w, b->ranks, b->n_ranks, mo, b->err, sizeof b->err))
    return -1;
  if (qwen35_init_ranks(&b->m, &b->cfg, &b->w, b->ranks, b->n_ranks, mo, b->err, sizeof b->err))
    return -1;
  o->mtp_weights = &b->w;
  return bench_engine(b, o, plain);
}

static void bench_stop_engine(bench *b) {
  if (b->e) engine_destroy(b->e, 1);
  b->e = NULL;
}

static void bench_stop(bench *b) {
  bench_stop_engine(b);
  qwen35_free(b->m);
  b->m = NULL;
}

/* One decode level of conc sequences: a short warm-up at this concurrency (the step shapes'
 * one-time work — graph capture, the CUDA backend's GEMM algorithm timing — out of the window,
 * as a server does it once), then --decode-repeats measured runs into runs[], their median in
 * *tok_s, the last run's window in *phase_s; warm (when not NULL): the engine's stats after
 * the warm-up. rec[0, 1 + repeats): the level's warm-up and runs in the plain pass (mode
 * BENCH_RUN_RECORD: filled; BENCH_RUN_REPLAY: fed again; BENCH_RUN_PLAIN: NULL). */
static int bench_decode_level(bench *b, int conc, bench_run_mode mode, bench_rec *rec, double *runs,
                              double *tok_s, double *phase_s, engine_stats *warm) {
  const bench_sizes *z = &b->sz;
  double sorted[BENCH_MAX_REPEATS], t;
  int R = b->decode_repeats;
  if (bench_decode(b, conc, z->decode_prompt, z->decode_gen < 16 ? z->decode_gen : 16, &t, phase_s,
                   mode, rec ? &rec[0] : NULL))
    return -1;
  if (warm) bench_stats(b, warm);
  for (int r = 0; r < R; r++) {
    if (bench_decode(b, conc, z->decode_prompt, z->decode_gen, &runs[r], phase_s, mode,
                     rec ? &rec[1 + r] : NULL))
      return -1;
    sorted[r] = runs[r];
  }
  *tok_s = bench_median(sorted, R);
  return 0;
}

/* The level's speculative figures (name: its decode_tok_s_<name>): the plain pass's rate, the
 * ratio, and from the engine's spec_decode counters over the measured runs (a..z) vLLM's mean
 * acceptance length (1 + accepted drafts per verify step) and the draft acceptance rate; the
 * counters and the token check in info.spec.levels. */
static void bench_spec_level(bench *b, int name, int conc, double plain, double spec,
                             const engine_stats *a, const engine_stats *z, const bench_rec *rec) {
  long long nd = z->spec_num_drafts - a->spec_num_drafts;
  long long nt = z->spec_num_draft_tokens - a->spec_num_draft_tokens;
  long long na = z->spec_num_accepted_tokens - a->spec_num_accepted_tokens;
  double al = nd > 0 ? 1.0 + (double)na / (double)nd : NAN;
  double ar = nt > 0 ? (double)na / (double)nt : NAN;
  char k[96];
  snprintf(k, sizeof k, "decode_plain_tok_s_%d", name);
  bench_set(b->metrics, k, plain);
  snprintf(k, sizeof k, "decode_spec_speedup_%d", name);
  bench_set(b->metrics, k, spec / plain);
  snprintf(k, sizeof k, "decode_acceptance_length_%d", name);
  bench_set(b->metrics, k, al);
  snprintf(k, sizeof k, "decode_draft_acceptance_rate_%d", name);
  bench_set(b->metrics, k, ar);
  int mism = 0;
  for (int r = 1; r <= b->decode_repeats; r++) mism += rec[r].mismatched;
  json_t *sp = json_object_get(b->info, "spec");
  json_t *lv = json_object_get(sp, "levels");
  json_t *pos = json_array();
  for (int i = 0; i < b->user.spec.k && i < SPEC_MAX_TOKENS; i++)
    json_array_append_new(pos,
                          json_integer(z->spec_accepted_per_pos[i] - a->spec_accepted_per_pos[i]));
  snprintf(k, sizeof k, "%d", name);
  json_object_set_new(
      lv, k,
      json_pack("{s:I, s:I, s:I, s:o, s:i, s:i}", "num_drafts", (json_int_t)nd, "num_draft_tokens",
                (json_int_t)nt, "num_accepted_tokens", (json_int_t)na, "accepted_per_pos", pos,
                "sequences", conc * b->decode_repeats, "mismatched_sequences", mism));
  fprintf(stderr,
          "bench: decode %d sequences: plain %.1f tok/s, speculative %.1f tok/s (%.3fx), "
          "acceptance length %.3f, draft acceptance rate %.3f\n",
          conc, plain, spec, spec / plain, al, ar);
  if (mism)
    fprintf(stderr,
            "bench: decode %d sequences: %d of %d sequences' speculative tokens differ from the "
            "plain pass's\n",
            conc, mism, conc * b->decode_repeats);
}

static int bench_phase_a(bench *b) {
  const bench_sizes *z = &b->sz;
  engine_opts o = b->user;
  o.enable_prefix_caching = b->decode_shared > 0;
  /* the decode levels this run times: the sizes, or --decode-conc's one (any N: a level of
   * its own when N is not one of the sizes) */
  int lv_conc[BENCH_N_DECODE], lv_name[BENCH_N_DECODE], n_lv = 0;
  for (int i = 0; i < BENCH_N_DECODE; i++)
    if (!b->only_conc || z->decode_conc[i] == b->only_conc) {
      lv_conc[n_lv] = z->decode_conc[i];
      lv_name[n_lv++] = bench_decode_names[i];
    }
  if (b->only_conc && !n_lv) {
    lv_conc[0] = lv_name[0] = b->only_conc;
    n_lv = 1;
  }
  /* the most sequences a timed level runs (the memory plan's state slots follow it) */
  int maxc = 0;
  for (int i = 0; i < n_lv; i++) maxc = lv_conc[i] > maxc ? lv_conc[i] : maxc;
  if (!b->user_max_seqs) o.max_num_seqs = maxc;
  if (!b->user_kv_tokens) {
    long need = (long)maxc * (z->decode_prompt + z->decode_gen);
    long pf = z->prefill_len[BENCH_N_PREFILL - 1] + 64;
    o.kv_cache_tokens = (int)((need > pf ? need : pf) + 2048);
  }
  qwen35_mem_opts mo;
  int do_prefill = !b->only || !strcmp(b->only, "prefill");
  int do_decode = !b->only || !strcmp(b->only, "decode");
  int R = b->decode_repeats;
  double plain_tok_s[BENCH_N_DECODE];
  char k[64];
  double s, tok_s;
  if (b->spec && do_decode) {
    /* the plain pass: every level on an engine without speculation, its prompts and tokens
     * kept; then the configured engine on the same model */
    b->n_recs = n_lv * (1 + R);
    if (!(b->recs = calloc((size_t)b->n_recs, sizeof *b->recs))) {
      b->n_recs = 0;
      return errf(b->err, sizeof b->err, "out of memory");
    }
    if (bench_start(b, &o, &mo, 1)) return -1;
    if (bench_decode(b, 1, z->decode_prompt, z->decode_gen < 4 ? z->decode_gen : 4, &tok_s, &s,
                     BENCH_RUN_PLAIN, NULL))
      return -1;
    for (int i = 0; i < n_lv; i++) {
      double runs[BENCH_MAX_REPEATS];
      if (bench_decode_level(b, lv_conc[i], BENCH_RUN_RECORD, &b->recs[i * (1 + R)], runs,
                             &plain_tok_s[i], &s, NULL))
        return -1;
      fprintf(stderr, "bench: decode %d sequences, plain pass: %.1f tok/s\n", lv_conc[i],
              plain_tok_s[i]);
    }
    bench_stop_engine(b);
    if (bench_engine(b, &o, 0)) return -1;
  } else if (bench_start(b, &o, &mo, 0)) {
    return -1;
  }
  if (b->spec) {
    json_t *sp =
        json_pack("{s:s, s:i, s:i, s:o, s:o, s:s}", "method",
                  o.spec.method == SPEC_METHOD_MTP ? "mtp" : "ngram", "num_speculative_tokens",
                  o.spec.k, "disable_by_batch_size", o.spec.disable_by_batch_size, "replay_p",
                  b->replay_pm >= 0 ? json_real(b->replay_pm / 1000.0) : json_null(), "levels",
                  json_object(), "note",
                  "each decode level runs on an engine without speculation first (the "
                  "plain pass: decode_plain_tok_s_N), then as configured on the same "
                  "prompts (decode_tok_s_N); acceptance_length = 1 + accepted / "
                  "num_drafts over the measured runs (vLLM's mean acceptance length); "
                  "mismatched_sequences: speculative tokens unlike the plain pass's (with "
                  "replay_p each position takes the plain pass's token, so 0 by design)");
    json_object_set_new(b->info, "spec", sp);
  }
  json_object_set_new(
      b->info, "phase_a_engine",
      json_pack("{s:i, s:i, s:i, s:b}", "max_num_seqs", o.max_num_seqs, "max_num_batched_tokens",
                o.max_num_batched_tokens, "kv_cache_tokens", o.kv_cache_tokens, "prefix_caching",
                o.enable_prefix_caching));
  if (b->decode_shared > 0)
    json_object_set_new(b->info, "decode_shared_prefix", json_integer(b->decode_shared));
  engine_stats st0, st1;
  bench_stats(b, &st0);
  /* warm-up: kernels, graphs, handles */
  if (bench_decode(b, 1, z->decode_prompt, z->decode_gen < 4 ? z->decode_gen : 4, &tok_s, &s,
                   BENCH_RUN_PLAIN, NULL))
    return -1;
  for (int i = 0; i < BENCH_N_PREFILL && do_prefill; i++) {
    double med;
    if (bench_prefill(b, z->prefill_len[i], &tok_s, &med)) return -1;
    snprintf(k, sizeof k, "prefill_tok_s_%d", bench_prefill_names[i]);
    bench_set(b->metrics, k, tok_s);
    fprintf(stderr, "bench: prefill %d tokens: %.1f tok/s (%.4f s)\n", z->prefill_len[i], tok_s,
            med);
  }
  for (int i = 0; i < n_lv && do_decode; i++) {
    double runs[BENCH_MAX_REPEATS];
    bench_rec *rec = b->recs ? &b->recs[i * (1 + R)] : NULL;
    engine_stats sa, sz; /* the speculative counters of the measured runs: after the warm-up */
    if (bench_decode_level(b, lv_conc[i], rec ? BENCH_RUN_REPLAY : BENCH_RUN_PLAIN, rec, runs,
                           &tok_s, &s, &sa))
      return -1;
    bench_stats(b, &sz);
    snprintf(k, sizeof k, "decode_tok_s_%d", lv_name[i]);
    bench_set(b->metrics, k, tok_s);
    if (R > 1) {
      json_t *all = json_object_get(b->info, "decode_runs_tok_s");
      if (!all) {
        all = json_object();
        json_object_set_new(b->info, "decode_runs_tok_s", all);
      }
      json_t *arr = json_array();
      for (int r = 0; r < R; r++)
        json_array_append_new(arr, isfinite(runs[r]) ? json_real(runs[r]) : json_null());
      snprintf(k, sizeof k, "%d", lv_name[i]);
      json_object_set_new(all, k, arr);
    }
    fprintf(stderr, "bench: decode %d sequences: %.1f tok/s (", lv_conc[i], tok_s);
    if (R > 1) {
      fprintf(stderr, "median of %d runs:", R);
      for (int r = 0; r < R; r++) fprintf(stderr, "%s %.1f", r ? " /" : "", runs[r]);
      fprintf(stderr, "; last ");
    }
    fprintf(stderr, "phase %.3f s)\n", s);
    if (rec) bench_spec_level(b, lv_name[i], lv_conc[i], plain_tok_s[i], tok_s, &sa, &sz, rec);
  }
  if (b->decode_shared > 0) { /* whether the decode runs' prefixes were restored, not recomputed */
    bench_stats(b, &st1);
    json_object_set_new(b->info, "decode_prefix_stats", bench_stats_json(&st0, &st1));
  }
  bench_stop_engine(b);
  if (!b->only && bench_checkpoint(b, mo.n_slots, mo.n_pages)) return -1;
  bench_roofline(b);
  bench_stop(b);
  return 0;
}

static int bench_phase_b(bench *b) {
  const bench_sizes *z = &b->sz;
  engine_opts o = b->user;
  o.enable_prefix_caching = 1;
  if (!b->user_max_seqs) o.max_num_seqs = z->prefix_n < 16 ? 16 : z->prefix_n;
  if (!b->user_kv_tokens)
    o.kv_cache_tokens = (z->prefix_n + 2) * (z->prefix_len + z->suffix_len + 16) + 2048;
  qwen35_mem_opts mo;
  if (bench_start(b, &o, &mo, 0)) return -1;
  json_object_set_new(b->info, "phase_b_engine",
                      json_pack("{s:i, s:i, s:i, s:b, s:i}", "max_num_seqs", o.max_num_seqs,
                                "max_num_batched_tokens", o.max_num_batched_tokens,
                                "kv_cache_tokens", o.kv_cache_tokens, "prefix_caching", 1,
                                "snapshot_slabs", mo.n_slots - o.max_num_seqs));
  int rc = bench_prefix(b);
  if (rc == 0) {
    json_t *v = json_object_get(b->metrics, "shared_prefix_8x12k_all_first_token_s");
    json_t *w = json_object_get(b->metrics, "warm_prefix_ttft_ms");
    fprintf(stderr, "bench: shared prefix wave %.3f s, warm prefix TTFT %.2f ms\n",
            json_number_value(v), json_number_value(w));
  }
  bench_stop(b);
  return rc;
}

static int bench_phase_d(bench *b) {
  const bench_sizes *z = &b->sz;
  engine_opts o = b->user;
  o.enable_prefix_caching = 1;
  if (!b->user_max_seqs) o.max_num_seqs = z->pause_bg + 2;
  if (!b->user_kv_tokens)
    o.kv_cache_tokens = z->pause_bg * (z->decode_prompt + z->pause_gen + 16) +
                        2 * z->pause_pairs * (z->pause_len + 16) + 2048;
  qwen35_mem_opts mo;
  if (bench_start(b, &o, &mo, 0)) return -1;
  int rc = bench_pause(b);
  if (rc == 0)
    fprintf(
        stderr,
        "bench: checkpoint pauses while %d sequences decode: capture %.4f ms, restore %.4f ms\n",
        z->pause_bg, json_number_value(json_object_get(b->metrics, "capture_pause_ms")),
        json_number_value(json_object_get(b->metrics, "restore_pause_ms")));
  bench_stop(b);
  return rc;
}

/* The commit the results are recorded under: --commit, else the checkout's HEAD, else
 * "unknown". */
static void bench_commit(const char *given, char *out, size_t n) {
  if (given && *given) {
    snprintf(out, n, "%s", given);
    return;
  }
  snprintf(out, n, "unknown");
  FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
  if (!p) return;
  char buf[128];
  if (fgets(buf, sizeof buf, p)) {
    buf[strcspn(buf, "\r\n")] = 0;
    if (strlen(buf) == 40) snprintf(out, n, "%s", buf);
  }
  pclose(p);
}

static void bench_gpu_name(bench *b, char *out, size_t n) {
  snprintf(out, n, "%s", b->be && !strcmp(b->be->name, "cpu") ? "cpu" : b->be ? b->be->name : "?");
#ifdef DS_CUDA
  if (b->be && !strcmp(b->be->name, "cuda")) {
    struct cudaDeviceProp p;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess)
      snprintf(out, n, "%s", p.name);
  }
#endif
}

static json_t *bench_sizes_json(const bench_sizes *z) {
  json_t *pf = json_array(), *dc = json_array();
  for (int i = 0; i < BENCH_N_PREFILL; i++)
    json_array_append_new(pf, json_integer(z->prefill_len[i]));
  for (int i = 0; i < BENCH_N_DECODE; i++)
    json_array_append_new(dc, json_integer(z->decode_conc[i]));
  return json_pack("{s:o, s:i, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                   "prefill_len", pf, "prefill_repeats", z->prefill_repeats, "decode_conc", dc,
                   "decode_prompt", z->decode_prompt, "decode_gen", z->decode_gen, "prefix_len",
                   z->prefix_len, "suffix_len", z->suffix_len, "prefix_n", z->prefix_n,
                   "warm_repeats", z->warm_repeats, "ckpt_repeats", z->ckpt_repeats, "pause_bg",
                   z->pause_bg, "pause_gen", z->pause_gen, "pause_len", z->pause_len, "pause_pairs",
                   z->pause_pairs);
}

static const char *bench_metric_keys[] = {
    "decode_tok_s_1",      "decode_tok_s_8",      "decode_tok_s_32",
    "decode_tok_s_64",     "decode_tok_s_128",    "prefill_tok_s_512",
    "prefill_tok_s_4096",  "prefill_tok_s_16384", "shared_prefix_8x12k_all_first_token_s",
    "warm_prefix_ttft_ms", "capture_pause_ms",    "restore_pause_ms",
    "checkpoint_bytes"};

/* Writes the JSON (final: also checks that every headline metric is there, prints the table on
 * stdout). Returns 0, or 1 when a headline metric is missing or the file cannot be written. */
static int bench_write(bench *b, const char *out, int final, int quiet_missing, double t_start) {
  char commit[128], gpu[256], date[64];
  bench_commit(b->commit, commit, sizeof commit);
  bench_gpu_name(b, gpu, sizeof gpu);
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  int bad = 0;

  json_t *peers = json_object(), *pm = json_object(), *ratios = json_object();
  for (size_t i = 0; i < sizeof bench_peers / sizeof bench_peers[0]; i++) {
    json_object_set_new(pm, bench_peers[i].key, json_real(bench_peers[i].value));
    json_t *ours = json_object_get(b->metrics, bench_peers[i].key);
    bench_set(ratios, bench_peers[i].key,
              ours && json_is_number(ours) ? json_number_value(ours) / bench_peers[i].value : NAN);
  }
  json_object_set_new(peers, "name", json_string("llama.cpp"));
  json_object_set_new(peers, "source",
                      json_string("shared/design/anchors.md: llama.cpp (Aug 2026 build, CUDA, "
                                  "flash attention) on one H200, same shape in bf16, 2026-11-29; "
                                  "decode = llama-batched-bench 512 in + 128 out, prefill = "
                                  "llama-bench pp512, prefix = llama-server 8 slots"));
  json_object_set_new(peers, "metrics", pm);
  json_object_set_new(ratios, "note",
                      json_string("ours / llama.cpp: above 1 is better for tok/s, below 1 is "
                                  "better for seconds and milliseconds"));

  json_object_set_new(b->info, "model", json_string(b->model_dir));
  json_object_set_new(b->info, "model_type", json_string(b->cfg.model_type));
  json_object_set_new(b->info, "backend", json_string(b->be ? b->be->name : "?"));
  json_object_set_new(b->info, "tensor_parallel_size", json_integer(b->n_ranks));
  json_object_set_new(b->info, "threads", json_integer(b->threads));
  json_object_set_new(b->info, "quick", json_boolean(b->quick));
  json_object_set_new(b->info, "complete", json_boolean(final));
  json_object_set_new(b->info, "sizes", bench_sizes_json(&b->sz));
  json_t *smp = json_object();
  json_object_set_new(smp, "temperature", json_real(b->temperature));
  json_object_set_new(smp, "top_p", json_real(b->top_p));
  json_object_set_new(smp, "top_k", json_integer(b->top_k));
  json_object_set_new(smp, "frequency_penalty", json_real(b->frequency_penalty));
  json_object_set_new(smp, "presence_penalty", json_real(b->presence_penalty));
  json_object_set_new(b->info, "sampling", smp);
  json_object_set_new(b->info, "wall_s", json_real(bench_now() - t_start));

  json_t *root = json_object();
  json_object_set_new(root, "commit", json_string(commit));
  json_object_set_new(root, "gpu", json_string(gpu));
  json_object_set_new(root, "date", json_string(date));
  json_object_set(root, "metrics", b->metrics);
  json_object_set_new(root, "peers", peers);
  json_object_set_new(root, "ratios", ratios);
  json_object_set(root, "info", b->info);
  for (size_t i = 0; final && i < sizeof bench_metric_keys / sizeof *bench_metric_keys; i++) {
    json_t *v = json_object_get(b->metrics, bench_metric_keys[i]);
    if (!v || !json_is_number(v)) {
      if (!quiet_missing)
        fprintf(stderr, "deltaserve bench: %s was not measured\n", bench_metric_keys[i]);
      bench_set(b->metrics, bench_metric_keys[i], NAN);
      bad = 1;
    }
  }
  /* written whole to a temporary name, then renamed: a kill never leaves half a file */
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  if (json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(8)) != 0 ||
      rename(tmp, out) != 0) {
    fprintf(stderr, "deltaserve bench: cannot write %s: %s\n", out, strerror(errno));
    bad = 1;
  }
  if (final) {
    printf("%-40s %14s %12s %8s\n", "metric", "deltaserve", "llama.cpp", "ratio");
    for (size_t i = 0; i < sizeof bench_metric_keys / sizeof *bench_metric_keys; i++) {
      const char *k = bench_metric_keys[i];
      json_t *v = json_object_get(b->metrics, k), *r = json_object_get(ratios, k);
      double peer = NAN;
      for (size_t j = 0; j < sizeof bench_peers / sizeof bench_peers[0]; j++)
        if (!strcmp(bench_peers[j].key, k)) peer = bench_peers[j].value;
      char ps[32] = "-", rs[32] = "-";
      if (isfinite(peer)) snprintf(ps, sizeof ps, "%.6g", peer);
      if (json_is_number(r)) snprintf(rs, sizeof rs, "%.3g", json_number_value(r));
      printf("%-40s %14.6g %12s %8s\n", k, json_is_number(v) ? json_number_value(v) : NAN, ps, rs);
    }
    /* a speculative run's figures per decode size that ran (no peer figures) */
    static const char *spec_keys[] = {"decode_plain_tok_s", "decode_spec_speedup",
                                      "decode_acceptance_length", "decode_draft_acceptance_rate"};
    for (int i = 0; b->spec && i <= BENCH_N_DECODE; i++) {
      int nm = i < BENCH_N_DECODE ? bench_decode_names[i] : b->only_conc;
      for (int j = 0; i == BENCH_N_DECODE && j < BENCH_N_DECODE; j++)
        if (nm == bench_decode_names[j]) nm = 0; /* --decode-conc of a size: printed above */
      for (size_t j = 0; nm > 0 && j < sizeof spec_keys / sizeof *spec_keys; j++) {
        char k[96];
        snprintf(k, sizeof k, "%s_%d", spec_keys[j], nm);
        json_t *v = json_object_get(b->metrics, k);
        if (v)
          printf("%-40s %14.6g %12s %8s\n", k, json_is_number(v) ? json_number_value(v) : NAN, "-",
                 "-");
      }
    }
    fflush(stdout);
  }
  json_decref(root);
  return bad;
}

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: deltaserve bench --model DIR --out FILE.json [--device cpu|cuda|auto] "
          "[--threads N] [--tensor-parallel-size N] [--quick] [--seed N] [engine flags]\n"
          "  offline prefill (512/4096/16384 tokens), decode (1/8/32/64/128 sequences of 512 in +\n"
          "  128 out), shared-prefix wave and warm-prefix TTFT, checkpoint copy pauses, roofline\n"
          "  fractions, and the llama.cpp figures of the same H200, as JSON.\n"
          "  --quick: small sizes for CPU smoke tests.\n"
          "  --commit SHA: the commit recorded in the JSON (default: git rev-parse HEAD, for a\n"
          "    tree that travelled without its .git).\n"
          "  --batch-invariant: GEMMs whose rows do not depend on the batch (as serve).\n"
          "  --kv-cache-dtype auto|fp8: the K/V pages' type (as serve).\n"
          "  --only decode|prefill: those runs only (no prefix or checkpoint parts).\n"
          "  --decode-conc N: with --only decode, the run of N sequences only (one of the\n"
          "    decode sizes or any other N up to %d, reported as decode_tok_s_N; for profiling\n"
          "    one batch size).\n"
          "  --decode-repeats N: measure each decode size N times (1..%d) and report the\n"
          "    median (every run in info.decode_runs_tok_s).\n"
          "  --decode-prompt N: the decode runs' prompts are N tokens (default 512).\n"
          "  --decode-shared S: with --only decode, every decode run's prompts share their first\n"
          "    S tokens (one prefix for every run; prefix caching on, so the prefix is computed\n"
          "    once and its KV pages are one copy): decode over a shared system prompt.\n"
          "  --temperature T, --top-p P, --top-k K, --frequency-penalty F, --presence-penalty F:\n"
          "    every request sampled so (seeded; the default is greedy); the figures then\n"
          "    include the sampling.\n"
          "  --speculative-config JSON (an engine flag): each decode size runs without\n"
          "    speculation first (decode_plain_tok_s_N), then speculating on the same prompts\n"
          "    (decode_tok_s_N), with decode_spec_speedup_N, decode_acceptance_length_N (1 +\n"
          "    accepted drafts per verify step, vLLM's) and decode_draft_acceptance_rate_N;\n"
          "    info.spec.levels checks the speculative tokens against the plain ones. Without\n"
          "    \"disable_by_batch_size\" the engine's measured policy decides which steps draft.\n"
          "  --spec-replay P: with --speculative-config, the drafts are each sequence's own\n"
          "    continuation from the plain pass, each draft token replaced by another with\n"
          "    probability P (0..1, in steps of 0.001; reproducible): speed against a controlled\n"
          "    acceptance. num_speculative_tokens is the config's; the method's drafts are not\n"
          "    used (with \"mtp\" its head still runs after each step, its time counted).\n"
          "%s"
          "engine flags (as serve):\n%s",
          BENCH_MAX_CONC, BENCH_MAX_REPEATS, cli_load_help, cli_flags_engine_help);
}

int cmd_bench(int argc, char **argv) {
  bench b;
  memset(&b, 0, sizeof b);
  b.device = "auto";
  b.decode_repeats = 1;
  b.top_p = 1.0f;
  b.rng = 0x5EEDBE9C4ULL;
  b.replay_pm = -1;
  engine_opts_default(&b.user);
  const char *out = NULL;
  for (int i = 1; i < argc; i++) {
    char err[256] = "";
    int rc = cli_flags_engine(&b.user, argc, argv, &i, err, sizeof err);
    if (rc < 0) {
      fprintf(stderr, "deltaserve bench: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    if ((rc = cli_load_flag(&b.load, argc, argv, &i, err, sizeof err)) < 0 ||
        (rc == 0 && (rc = cli_flags_tp(&b.tp, argc, argv, &i, err, sizeof err)) < 0)) {
      fprintf(stderr, "deltaserve bench: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--quick")) {
      b.quick = 1;
      continue;
    }
    if (!strcmp(a, "--batch-invariant")) {
      b.batch_invariant = 1;
      continue;
    }
    if (!strcmp(a, "--only") && i + 1 < argc &&
        (!strcmp(argv[i + 1], "decode") || !strcmp(argv[i + 1], "prefill"))) {
      b.only = argv[++i];
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "deltaserve bench: %s needs a value (or is unknown)\n", a);
      bench_usage(stderr);
      return 2;
    }
    const char *v = argv[++i];
    char *end;
    if (!strcmp(a, "--kv-cache-dtype")) {
      if (cli_vllm_kv_cache_dtype(v, &b.kv_dtype, err, sizeof err)) {
        fprintf(stderr, "deltaserve bench: %s\n", err);
        return 2;
      }
    } else if (!strcmp(a, "--decode-repeats")) {
      long c = strtol(v, &end, 10);
      if (*end || end == v || c < 1 || c > BENCH_MAX_REPEATS) {
        fprintf(stderr, "deltaserve bench: bad --decode-repeats '%s' (1..%d)\n", v,
                BENCH_MAX_REPEATS);
        return 2;
      }
      b.decode_repeats = (int)c;
    } else if (!strcmp(a, "--decode-conc")) {
      long c = strtol(v, &end, 10);
      if (*end || end == v || c < 1 || c > 1 << 20) {
        fprintf(stderr, "deltaserve bench: bad --decode-conc '%s'\n", v);
        return 2;
      }
      b.only_conc = (int)c;
    } else if (!strcmp(a, "--decode-prompt") || !strcmp(a, "--decode-shared")) {
      long long c;
      if (cli_flags_size(v, a, 1, 1 << 20, &c, err, sizeof err)) {
        fprintf(stderr, "deltaserve bench: %s\n", err);
        return 2;
      }
      if (a[9] == 'p')
        b.decode_prompt = (int)c;
      else
        b.decode_shared = (int)c;
    } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p")) {
      float f = strtof(v, &end);
      int t = a[2] == 't' && a[3] == 'e';
      if (*end || end == v || !(f >= 0.0f) || (t ? f > 100.0f : f == 0.0f || f > 1.0f)) {
        fprintf(stderr, "deltaserve bench: bad %s '%s'\n", a, v);
        return 2;
      }
      if (t)
        b.temperature = f;
      else
        b.top_p = f;
    } else if (!strcmp(a, "--frequency-penalty") || !strcmp(a, "--presence-penalty")) {
      float f = strtof(v, &end);
      if (*end || end == v || !(f >= -2.0f && f <= 2.0f)) {
        fprintf(stderr, "deltaserve bench: bad %s '%s' (-2..2)\n", a, v);
        return 2;
      }
      if (a[2] == 'f')
        b.frequency_penalty = f;
      else
        b.presence_penalty = f;
    } else if (!strcmp(a, "--spec-replay")) {
      double f = strtod(v, &end);
      if (*end || end == v || !(f >= 0.0 && f <= 1.0)) {
        fprintf(stderr, "deltaserve bench: bad --spec-replay '%s' (a probability, 0..1)\n", v);
        return 2;
      }
      b.replay_pm = (int)lround(f * 1000.0);
    } else if (!strcmp(a, "--top-k")) {
      long k = strtol(v, &end, 10);
      if (*end || end == v || k < 0 || k > 1 << 24) {
        fprintf(stderr, "deltaserve bench: bad --top-k '%s'\n", v);
        return 2;
      }
      b.top_k = (int)k;
    } else if (!strcmp(a, "--model"))
      b.model_dir = v;
    else if (!strcmp(a, "--out"))
      out = v;
    else if (!strcmp(a, "--device"))
      b.device = v;
    else if (!strcmp(a, "--commit"))
      b.commit = v;
    else if (!strcmp(a, "--threads")) {
      long t = strtol(v, &end, 10);
      if (*end || end == v || t < 0 || t > 1024) {
        fprintf(stderr, "deltaserve bench: bad --threads '%s'\n", v);
        return 2;
      }
      b.threads = (int)t;
    } else if (!strcmp(a, "--seed")) {
      errno = 0;
      unsigned long long s = strtoull(v, &end, 0);
      if (errno || *end || end == v) {
        fprintf(stderr, "deltaserve bench: bad --seed '%s'\n", v);
        return 2;
      }
      b.rng = s;
    } else {
      fprintf(stderr, "deltaserve bench: unknown flag '%s'\n", a);
      bench_usage(stderr);
      return 2;
    }
  }
  if (!b.model_dir || !out) {
    bench_usage(stderr);
    return 2;
  }
  b.sz = b.quick ? bench_quick : bench_full;
  if (b.decode_prompt) b.sz.decode_prompt = b.decode_prompt;
  if (b.decode_shared &&
      (!b.only || strcmp(b.only, "decode") || b.decode_shared >= b.sz.decode_prompt)) {
    fprintf(stderr,
            "deltaserve bench: --decode-shared S needs --only decode and S below the "
            "decode prompt length (%d)\n",
            b.sz.decode_prompt);
    return 2;
  }
  if (b.only_conc && (!b.only || strcmp(b.only, "decode") || b.only_conc > BENCH_MAX_CONC)) {
    fprintf(stderr, "deltaserve bench: --decode-conc N needs --only decode and 1 <= N <= %d\n",
            BENCH_MAX_CONC);
    return 2;
  }
  b.spec = b.user.spec.method != SPEC_METHOD_NONE;
  if (b.replay_pm >= 0 && (!b.spec || (b.only && strcmp(b.only, "decode")))) {
    fprintf(stderr,
            "deltaserve bench: --spec-replay P needs --speculative-config (its "
            "num_speculative_tokens) and the decode runs (not --only prefill)\n");
    return 2;
  }
  engine_opts def;
  engine_opts_default(&def);
  b.user_kv_tokens = b.user.kv_cache_tokens != def.kv_cache_tokens;
  b.user_max_seqs = b.user.max_num_seqs != def.max_num_seqs;

  b.load.mtp = b.user.spec.method == SPEC_METHOD_MTP; /* the MTP head, read by engine_create */
  if (model_load_with(b.model_dir, &b.load, &b.cfg, &b.w, b.err, sizeof b.err)) {
    fprintf(stderr, "deltaserve bench: %s\n", b.err);
    return 1;
  }
  b.have_w = 1;
  b.metrics = json_object();
  b.info = json_object();
  int status = 1;
  backend_options bo = {.device = b.device,
                        .n_threads = b.threads,
                        .batch_invariant = b.batch_invariant,
                        .kv_dtype = b.kv_dtype,
                        .tensor_parallel_size = b.tp};
  if ((b.n_ranks = backend_create_ranks(&bo, b.ranks, CLI_FLAGS_TP_MAX, b.err, sizeof b.err)) > 0)
    b.be = b.ranks[0];
  else
    b.n_ranks = 0;
  if (!b.be) {
    fprintf(stderr, "deltaserve bench: %s\n", b.err);
    goto done;
  }
  double t_start = bench_now();
  bench_ceilings(&b);
  int failed = bench_phase_a(&b);
  if (failed) {
    fprintf(stderr, "deltaserve bench: %s\n", b.err);
    bench_stop(&b);
  }
  int wrote = bench_write(&b, out, 0, 0, t_start); /* phase A's figures survive a kill in B */
  (void)wrote;
  if (b.only) {
    bench_write(&b, out, 1, 1, t_start); /* the other figures are null */
    int decode = !strcmp(b.only, "decode");
    int n = decode ? BENCH_N_DECODE : BENCH_N_PREFILL;
    for (int i = 0; i < n; i++) { /* only the asked figures are owed */
      char k[64];
      if (decode && b.only_conc && i > 0) break;
      if (decode && b.only_conc)
        snprintf(k, sizeof k, "decode_tok_s_%d", b.only_conc);
      else if (decode)
        snprintf(k, sizeof k, "decode_tok_s_%d", bench_decode_names[i]);
      else
        snprintf(k, sizeof k, "prefill_tok_s_%d", bench_prefill_names[i]);
      json_t *v = json_object_get(b.metrics, k);
      if (!v || !json_is_number(v)) failed = 1;
    }
    status = failed ? 1 : 0;
    goto done;
  }
  if (bench_phase_b(&b)) {
    fprintf(stderr, "deltaserve bench: prefix phase: %s\n", b.err);
    bench_stop(&b);
    failed = 1;
  }
  bench_write(&b, out, 0, 0, t_start); /* B's figures survive a kill in D */
  if (bench_phase_d(&b)) {
    fprintf(stderr, "deltaserve bench: pause phase: %s\n", b.err);
    bench_stop(&b);
    failed = 1;
  }
  wrote = bench_write(&b, out, 1, failed, t_start);
  status = failed || wrote ? 1 : 0;
done:
  bench_recs_free(&b);
  free(b.shared_prefix);
  json_decref(b.metrics);
  json_decref(b.info);
  for (int r = 0; r < b.n_ranks; r++) b.ranks[r]->destroy(b.ranks[r]);
  if (b.have_w) weights_free(&b.w);
  return status;
}
