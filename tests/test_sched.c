/* sched: split points, admission order and exact page ids, the page watermark, preemption of
 * the youngest and its bit-faithful resume schedule, waiting vs failing, and counts back to
 * baseline. The model is simulated: a "sampled" token is a function of the position. */
#include "engine/sched.h"

#include "base/fault.h"
#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "test.h"

typedef struct world {
  kv_pages *kp;
  state_pool *sp;
  sched *s;
  request r[8];
  int n;
} world;

static int world_init(world *w, int pages, int seqs, int budget) {
  memset(w, 0, sizeof *w);
  sched_opts o = {seqs, budget, -1};
  if (kv_pages_init(&w->kp, pages) || state_pool_init(&w->sp, seqs, 0, NULL)) return -1;
  return sched_init(&w->s, &o, w->kp, w->sp);
}

static request *world_add(world *w, int n_prompt, int max_tokens) {
  int32_t p[512];
  for (int i = 0; i < n_prompt; i++) p[i] = 7 + i;
  sampling_params sp;
  sampling_params_default(&sp);
  sp.max_tokens = max_tokens;
  request *r = &w->r[w->n];
  if (request_init(r, w->n, p, n_prompt, &sp, NULL, 0, 1) != 0) return NULL;
  w->n++;
  sched_add(w->s, r);
  return r;
}

static int world_ok(world *w) {
  char err[200];
  if (kv_pages_check(w->kp, err, sizeof err) || state_pool_check(w->sp, err, sizeof err)) {
    printf("check: %s\n", err);
    return 0;
  }
  return 1;
}

/* one step; the "model" samples a function of the last fed token and the position */
static void world_step(world *w, sched_batch *b) {
  sched_schedule(w->s, b);
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    if (!r->sched_sample) continue;
    int32_t last = r->tokens[r->n_computed + r->sched_tokens - 1];
    r->tokens[r->n_tokens] = 1000 + (last * 31 + r->n_tokens) % 5000;
    r->n_tokens++;
    if (request_n_output(r) == r->cap - r->n_prompt) r->finish = FINISH_LENGTH;
  }
  sched_postprocess(w->s, b);
}

static void world_free(world *w) {
  for (int i = 0; i < w->n; i++) {
    if (w->r[i].state != REQ_STATE_FINISHED) sched_remove(w->s, &w->r[i]);
    request_free(&w->r[i]);
  }
  sched_free(w->s);
  state_pool_free(w->sp);
  kv_pages_free(w->kp);
}

TEST(units_and_splits) {
  EXPECT_EQ_INT(sched_unit(8192), 64);
  EXPECT_EQ_INT(sched_unit(64), 64);
  EXPECT_EQ_INT(sched_unit(100), 64);
  EXPECT_EQ_INT(sched_unit(63), 32);
  EXPECT_EQ_INT(sched_unit(5), 4);
  EXPECT_EQ_INT(sched_unit(1), 1);
  int32_t p[200] = {0};
  int32_t forced[3] = {100, 100, 500}; /* duplicates and out-of-range ones are dropped */
  sampling_params sp;
  sampling_params_default(&sp);
  request r;
  REQUIRE(request_init(&r, 0, p, 130, &sp, forced, 3, 1) == 0);
  EXPECT_EQ_INT(r.n_forced, 1);
  EXPECT_EQ_INT(sched_segment_end(&r, 0, 64), 64);
  EXPECT_EQ_INT(sched_segment_end(&r, 64, 64), 100);
  EXPECT_EQ_INT(sched_segment_end(&r, 100, 64), 128);
  EXPECT_EQ_INT(sched_segment_end(&r, 128, 64), 130);
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 100); /* whole segments merge, up to a forced point */
  EXPECT_EQ_INT(sched_piece(&r, 64, 99), 64);
  EXPECT_EQ_INT(sched_piece(&r, 64, 63), 0); /* the next segment does not fit: wait */
  r.n_computed = 64;
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 36); /* never across the forced point */
  EXPECT_EQ_INT(sched_piece(&r, 64, 40), 36);
  r.n_computed = 100;
  EXPECT_EQ_INT(sched_piece(&r, 64, 29), 28);
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 30); /* across a multiple of 64 */
  r.n_computed = 0;
  EXPECT_EQ_INT(sched_piece(&r, 32, 63), 32); /* u < 64: one unit at most */
  r.n_computed = 96;
  EXPECT_EQ_INT(sched_piece(&r, 32, 63), 4); /* up to the forced point */
  r.n_computed = 130;
  EXPECT_EQ_INT(sched_piece(&r, 64, 1), 1); /* decode */
  request_free(&r);
  /* a 1-token last segment is never merged */
  REQUIRE(request_init(&r, 0, p, 129, &sp, NULL, 0, 1) == 0);
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 128);
  r.n_computed = 128;
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 1);
  request_free(&r);
  REQUIRE(request_init(&r, 0, p, 65, &sp, NULL, 0, 1) == 0);
  EXPECT_EQ_INT(sched_piece(&r, 64, 8192), 64);
  request_free(&r);
  REQUIRE(request_init(&r, 0, p, 7, &sp, NULL, 0, 1) == 0);
  EXPECT_EQ_INT(sched_piece(&r, 4, 5), 4);
  r.n_computed = 4;
  EXPECT_EQ_INT(sched_piece(&r, 4, 5), 3);
  request_free(&r);
}

TEST(admission_order_and_pages) {
  world w;
  REQUIRE(world_init(&w, 16, 2, 64) == 0);
  request *a = world_add(&w, 40, 4), *b = world_add(&w, 40, 4), *c = world_add(&w, 20, 4);
  REQUIRE(a && b && c);
  sched_batch bt;
  world_step(&w, &bt);
  /* a takes 40 tokens; b's whole 40-token segment does not fit in the 24 left: it waits */
  EXPECT_EQ_INT(bt.n, 1);
  EXPECT(bt.reqs[0] == a && bt.n_tokens == 40);
  EXPECT(a->pages.n == 3 && a->pages.ids[0] == 0 && a->pages.ids[2] == 2 && a->slot == 0);
  EXPECT_EQ_INT(a->n_computed, 40);
  EXPECT_EQ_INT(a->n_tokens, 41);
  EXPECT_EQ_INT(sched_num_waiting(w.s), 2);
  world_step(&w, &bt);
  /* a decodes first, then b is admitted; c waits for a slot (max_num_seqs 2) */
  EXPECT_EQ_INT(bt.n, 2);
  EXPECT(bt.reqs[0] == a && bt.reqs[1] == b && bt.n_tokens == 41);
  EXPECT(b->pages.n == 3 && b->pages.ids[0] == 3 && b->slot == 1);
  EXPECT_EQ_INT(sched_num_running(w.s), 2);
  EXPECT_EQ_INT(sched_num_waiting(w.s), 1);
  EXPECT(c->state == REQ_STATE_WAITING);
  world_step(&w, &bt); /* a: 3rd token */
  world_step(&w, &bt); /* a: 4th token: finishes, frees pages 2,1,0 and slot 0 */
  EXPECT_EQ_INT(a->finish, FINISH_LENGTH);
  EXPECT(a->state == REQ_STATE_FINISHED && a->slot == -1 && a->pages.n == 0);
  EXPECT_EQ_INT(kv_pages_num_used(w.kp), 3);
  world_step(&w, &bt);
  /* c admitted into the freed slot; its pages come after the never-used ones */
  EXPECT(c->state == REQ_STATE_RUNNING && c->slot == 0);
  EXPECT(c->pages.n == 2 && c->pages.ids[0] == 6 && c->pages.ids[1] == 7);
  for (int i = 0; i < 10; i++) world_step(&w, &bt);
  EXPECT(b->finish == FINISH_LENGTH && c->finish == FINISH_LENGTH);
  EXPECT_EQ_INT(c->n_tokens, 24);
  EXPECT_EQ_INT(kv_pages_num_free(w.kp), 16);
  EXPECT_EQ_INT(state_pool_num_slots_free(w.sp), 2);
  EXPECT(world_ok(&w));
  world_free(&w);
}

TEST(waits_for_pages_and_watermark) {
  world w;
  REQUIRE(world_init(&w, 4, 4, 256) == 0);
  request *a = world_add(&w, 40, 2), *b = world_add(&w, 20, 2), *c = world_add(&w, 8, 2);
  REQUIRE(a && b && c);
  sched_batch bt;
  world_step(&w, &bt);
  /* a: 3 pages; b needs 2 but 1 is free: b waits, and c behind it waits too (FCFS) */
  EXPECT(bt.n == 1 && bt.reqs[0] == a);
  EXPECT(b->state == REQ_STATE_WAITING && c->state == REQ_STATE_WAITING);
  world_step(&w, &bt); /* a finishes */
  EXPECT_EQ_INT(a->finish, FINISH_LENGTH);
  world_step(&w, &bt);
  EXPECT(bt.n == 2 && bt.reqs[0] == b && bt.reqs[1] == c);
  for (int i = 0; i < 4; i++) world_step(&w, &bt);
  EXPECT(world_ok(&w) && kv_pages_num_free(w.kp) == 4);
  world_free(&w);
  /* watermark: with something running, admission keeps `watermark` pages back */
  sched_opts o = {4, 256, 2};
  REQUIRE(kv_pages_init(&w.kp, 6) == 0 && state_pool_init(&w.sp, 4, 0, NULL) == 0);
  REQUIRE(sched_init(&w.s, &o, w.kp, w.sp) == 0);
  w.n = 0;
  a = world_add(&w, 40, 8);
  b = world_add(&w, 17, 8);
  world_step(&w, &bt);
  EXPECT(a->state == REQ_STATE_RUNNING && b->state == REQ_STATE_WAITING); /* 3 - 2 < 2 */
  EXPECT(world_ok(&w));
  world_free(&w);
}

TEST(preempt_youngest_and_resume) {
  world w;
  REQUIRE(world_init(&w, 6, 4, 64) == 0);
  request *a = world_add(&w, 32, 40), *b = world_add(&w, 32, 40);
  REQUIRE(a && b);
  sched_batch bt;
  world_step(&w, &bt);
  EXPECT(bt.n == 2 && a->pages.n == 2 && b->pages.n == 2);
  EXPECT(b->pages.ids[0] == 2 && b->pages.ids[1] == 3);
  world_step(&w, &bt); /* pos 32 for both: pages 4 (a) and 5 (b) */
  EXPECT(a->pages.ids[2] == 4 && b->pages.ids[2] == 5);
  for (int i = 0; i < 15; i++) world_step(&w, &bt); /* pos 33..47 */
  EXPECT_EQ_INT(a->n_computed, 48);
  EXPECT_EQ_INT(sched_num_preemptions(w.s), 0);
  world_step(&w, &bt);
  /* a needs a 4th page, none free: b (the youngest) is preempted, a gets b's last page */
  EXPECT_EQ_INT(sched_num_preemptions(w.s), 1);
  EXPECT(b->state == REQ_STATE_WAITING && b->n_computed == 0 && b->slot == -1);
  EXPECT(bt.n == 1 && bt.reqs[0] == a && a->pages.ids[3] == 5);
  EXPECT_EQ_INT(b->n_tokens, 49); /* 17 generated tokens are kept */
  EXPECT(world_ok(&w));
  /* b resumes: prompt again as one 32-token piece without sampling, then its 16 fed-back
   * tokens one per step without sampling, then decoding continues */
  world_step(&w, &bt);
  EXPECT(bt.n == 2 && bt.reqs[1] == b && b->sched_tokens == 0 && b->n_computed == 32);
  int guard = 0;
  while ((a->state != REQ_STATE_FINISHED || b->state != REQ_STATE_FINISHED) && guard++ < 1000)
    world_step(&w, &bt);
  EXPECT(a->finish == FINISH_LENGTH && b->finish == FINISH_LENGTH);
  EXPECT(sched_num_preemptions(w.s) >= 1);
  /* the same two requests with room to spare: identical tokens */
  world ref;
  REQUIRE(world_init(&ref, 64, 4, 64) == 0);
  request *ra = world_add(&ref, 32, 40), *rb = world_add(&ref, 32, 40);
  guard = 0;
  while ((ra->state != REQ_STATE_FINISHED || rb->state != REQ_STATE_FINISHED) && guard++ < 1000)
    world_step(&ref, &bt);
  EXPECT_EQ_INT(sched_num_preemptions(ref.s), 0);
  EXPECT(ra->n_tokens == 72 && a->n_tokens == 72 && b->n_tokens == 72);
  EXPECT(memcmp(ra->tokens, a->tokens, 72 * sizeof(int32_t)) == 0);
  EXPECT(memcmp(rb->tokens, b->tokens, 72 * sizeof(int32_t)) == 0);
  world_free(&ref);
  EXPECT_EQ_INT(kv_pages_num_free(w.kp), 6);
  EXPECT(world_ok(&w));
  world_free(&w);
}

TEST(fault_fails_one_request) {
  world w;
  REQUIRE(world_init(&w, 8, 2, 64) == 0);
  request *a = world_add(&w, 10, 3), *b = world_add(&w, 10, 3);
  sched_batch bt;
  fault_arm(1, "state_pool_slot_alloc", 0);
  sched_schedule(w.s, &bt);
  fault_disarm();
  EXPECT(bt.n_failed == 1 && bt.failed[0] == a && a->finish == FINISH_ERROR);
  EXPECT(bt.n == 1 && bt.reqs[0] == b && b->slot == 0);
  sched_postprocess(w.s, &bt);
  EXPECT_EQ_INT(state_pool_num_slots_free(w.sp), 1);
  EXPECT(world_ok(&w));
  world_free(&w);
  REQUIRE(world_init(&w, 8, 2, 64) == 0);
  a = world_add(&w, 15, 6);
  b = world_add(&w, 10, 6);
  world_step(&w, &bt);
  fault_arm(1, "kv_pages_alloc", 0);
  world_step(&w, &bt); /* a feeds position 15 -> 16 positions: no new page; b at 10 */
  world_step(&w, &bt); /* a needs page 2 for position 16: fault -> a fails */
  fault_disarm();
  EXPECT(bt.n_failed == 1 && bt.failed[0] == a && a->finish == FINISH_ERROR);
  EXPECT(a->pages.n == 0 && a->slot == -1);
  for (int i = 0; i < 10; i++) world_step(&w, &bt);
  EXPECT_EQ_INT(b->finish, FINISH_LENGTH);
  EXPECT_EQ_INT(kv_pages_num_free(w.kp), 8);
  EXPECT_EQ_INT(state_pool_num_slots_free(w.sp), 2);
  EXPECT(world_ok(&w));
  world_free(&w);
}

/* ---- the shared-prefix wave (prefix cache on, simulated model) ---------------------------
 * n requests = one shared prefix of `prefix` tokens + distinct `suffix`-token tails, all
 * queued before the first step (8 x 1,250 + 50 with a 512-token budget and a 256-token
 * interval: the bench's 8 x 12,475 + 50 scaled down by 10). wave_run returns the steps until
 * every request sampled its first token and the tokens prefilled meanwhile; trace = 1 prints
 * each step (who computes which positions, from which depth each admission restored). */

#define WAVE_MAX 8
#define WAVE_LEN 13000

typedef struct wave {
  kv_pages *kp;
  state_pool *sp;
  prefix_cache *pc;
  sched *s;
  request r[WAVE_MAX];
  int n;
} wave;

typedef struct wave_result {
  int steps;              /* steps until every request sampled its first token */
  long long prefilled;    /* prompt tokens computed (restored ones excluded) */
  int restored[WAVE_MAX]; /* depth each request restored from at admission */
  int admitted_step[WAVE_MAX];
  int max_admitted_per_step;
} wave_result;

static int wave_run(int n, int prefix, int suffix, int budget, int interval, int slabs, int trace,
                    wave_result *res) {
  wave w;
  memset(&w, 0, sizeof w);
  memset(res, 0, sizeof *res);
  sched_opts o = {n, budget, -1};
  prefix_cache_opts po;
  memset(&po, 0, sizeof po);
  po.slab_bytes = 1;
  po.page_bytes = 1;
  if (kv_pages_init(&w.kp, 2048) || state_pool_init(&w.sp, n, slabs, NULL) ||
      prefix_cache_init(&w.pc, w.kp, w.sp, &po) || sched_init(&w.s, &o, w.kp, w.sp))
    return -1;
  sched_set_prefix_cache(w.s, w.pc, interval);
  static int32_t p[WAVE_LEN];
  for (int i = 0; i < prefix; i++) p[i] = 3 + (i * 7) % 200;
  for (int k = 0; k < n; k++) {
    for (int i = prefix; i < prefix + suffix; i++) p[i] = 300 + k * 100 + (i % 50);
    sampling_params sp;
    sampling_params_default(&sp);
    sp.max_tokens = 4;
    request *r = &w.r[k];
    if (request_init(r, k, p, prefix + suffix, &sp, NULL, 0, 1) ||
        request_init_prefix(r, NULL, NULL, 0,
                            prefix_cache_capture_points_max(prefix + suffix, 0, interval)))
      return -1;
    sched_add(w.s, r);
    w.n++;
    res->admitted_step[k] = -1;
  }
  int first = 0;
  sched_batch b;
  while (first < n && res->steps < 200) {
    int was_waiting[WAVE_MAX];
    for (int k = 0; k < n; k++) was_waiting[k] = w.r[k].state == REQ_STATE_WAITING;
    sched_schedule(w.s, &b);
    res->steps++;
    int admitted = 0;
    if (trace) printf("  step %2d (%4d tokens):", res->steps, b.n_tokens);
    for (int i = 0; i < b.n; i++) {
      request *r = b.reqs[i];
      int k = (int)r->id;
      if (r->n_computed < r->n_prompt) res->prefilled += r->sched_tokens;
      if (was_waiting[k]) {
        admitted++;
        res->admitted_step[k] = res->steps;
        res->restored[k] = r->cached_tokens;
      }
      if (trace)
        printf(" r%d[%d,%d)%s", k, r->n_computed, r->n_computed + r->sched_tokens,
               was_waiting[k] ? (r->cached_tokens ? "*" : "+") : "");
      if (trace && was_waiting[k] && r->cached_tokens) printf("<-%d", r->cached_tokens);
      if (r->sched_sample) {
        r->tokens[r->n_tokens++] = 1000 + k;
        if (request_n_output(r) == 1) first++;
        if (request_n_output(r) == r->cap - r->n_prompt) r->finish = FINISH_LENGTH;
      }
    }
    if (trace) printf("\n");
    if (admitted > res->max_admitted_per_step) res->max_admitted_per_step = admitted;
    sched_postprocess(w.s, &b);
  }
  if (trace) {
    prefix_cache_stats st;
    prefix_cache_get_stats(w.pc, &st);
    printf("  %d steps, %lld tokens prefilled, %lld captures, %lld evictions\n", res->steps,
           res->prefilled, st.captures, st.evictions);
  }
  char err[200];
  int ok = kv_pages_check(w.kp, err, sizeof err) == 0 &&
           state_pool_check(w.sp, err, sizeof err) == 0 &&
           prefix_cache_check(w.pc, err, sizeof err) == 0;
  if (!ok) printf("check: %s\n", err);
  for (int k = 0; k < w.n; k++) {
    if (w.r[k].state != REQ_STATE_FINISHED) sched_remove(w.s, &w.r[k]);
    request_free(&w.r[k]);
  }
  sched_free(w.s);
  prefix_cache_free(w.pc);
  state_pool_free(w.sp);
  kv_pages_free(w.kp);
  return ok ? 0 : -1;
}

/* The ideal, computed by hand: the first request computes the prefix alone in budget-sized
 * pieces (interval checkpoints do not cut them), up to the divergence point 1,250 that the
 * seven others asked it for (demand capture) while it ran; the step after, all seven restore
 * 1,250 and prefill [1250, 1299) together with the first one's [1250, 1299); the step after,
 * everyone's 1-token END piece [1299, 1300) samples the first token.
 *   steps 1-3: r0 [0,512) [512,1024) [1024,1250);  step 4: 8 x 49;  step 5: 8 x 1
 * Prefilled: 1,300 + 7 x 50 = 1,650 (before: 8 steps, 1,876 tokens: r0 cut at every 256-token
 * interval point, r1 restored the interval checkpoint 1,024 and recomputed to 1,250). */
TEST(shared_prefix_wave) {
  wave_result res;
  REQUIRE(wave_run(8, 1250, 50, 512, 256, 16, 1, &res) == 0);
  EXPECT_EQ_INT(res.steps, 5);
  EXPECT_EQ_INT(res.prefilled, 1300 + 7 * 50);
  EXPECT_EQ_INT(res.restored[0], 0);
  EXPECT_EQ_INT(res.admitted_step[0], 1);
  for (int k = 1; k < 8; k++) {
    EXPECT_MSG(res.restored[k] == 1250, "r%d restored %d", k, res.restored[k]);
    EXPECT_MSG(res.admitted_step[k] == 4, "r%d admitted at step %d", k, res.admitted_step[k]);
  }
  EXPECT_EQ_INT(res.max_admitted_per_step, 7);
  /* the bench's own sizes (8 x 12,475 + 50, budget 8192, interval 2048): [0,8192),
   * [8192,12475), 8 x 49, 8 x 1 (before: 9 steps, 14,184 tokens) */
  REQUIRE(wave_run(8, 12475, 50, 8192, 2048, 16, 0, &res) == 0);
  EXPECT_EQ_INT(res.steps, 4);
  EXPECT_EQ_INT(res.prefilled, 12525 + 7 * 50);
  for (int k = 1; k < 8; k++) EXPECT_EQ_INT(res.restored[k], 12475);
}

/* Speculative decoding's keep lanes bound the verify pieces of a step: 5 decode rows that all
 * have drafts (a replay drafter), 2 lanes: each step verifies at most 2, in lanes 0 and 1, and
 * the other rows decode plainly; with 8 lanes all 5 verify. Every draft is rejected (the
 * simulated model keeps row 0 only). */
static void lanes_run(int lanes, int *most, int *most_plain, int *bad) {
  world w;
  *most = *most_plain = *bad = 0;
  REQUIRE(world_init(&w, 256, 8, 512) == 0);
  spec_config sc = {SPEC_METHOD_NGRAM, 2, 1, 1, 0};
  sched_set_spec(w.s, &sc, 4096, lanes);
  static const int32_t replay[64] = {0};
  for (int i = 0; i < 5; i++) {
    request *r = world_add(&w, 4, 24);
    REQUIRE(r != NULL);
    r->replay = replay;
    r->n_replay = 64;
  }
  for (int step = 0; step < 40; step++) {
    sched_batch b;
    sched_schedule(w.s, &b);
    if (b.n == 0) break;
    int drafted = 0, plain = 0, used[8] = {0};
    for (int i = 0; i < b.n; i++) {
      request *r = b.reqs[i];
      if (r->sched_draft) {
        drafted++;
        if (r->sched_lane < 0 || r->sched_lane >= lanes || used[r->sched_lane]++) (*bad)++;
        r->sched_tokens = 1; /* the drafts rejected */
      } else if (r->sched_sample && r->sched_tokens == 1) {
        plain++;
      }
      if (!r->sched_sample) continue;
      r->tokens[r->n_tokens++] = 1000 + step;
      if (request_n_output(r) >= 20) r->finish = FINISH_LENGTH;
    }
    if (drafted > *most) *most = drafted;
    if (drafted == lanes && plain > *most_plain) *most_plain = plain;
    sched_postprocess(w.s, &b);
    EXPECT(world_ok(&w));
  }
  world_free(&w);
}

TEST(spec_lanes_bound_drafts) {
  int most, most_plain, bad;
  lanes_run(2, &most, &most_plain, &bad);
  EXPECT_EQ_INT(most, 2);
  EXPECT_EQ_INT(most_plain, 3); /* the other three rows ran beside them */
  EXPECT_EQ_INT(bad, 0);
  lanes_run(8, &most, &most_plain, &bad);
  EXPECT_EQ_INT(most, 5);
  EXPECT_EQ_INT(bad, 0);
}

/* The disk-restore rule with the H200's figures (bench/results/disk-tier-*): a 4B-shape 12.5k-token
 * checkpoint of 463 MB read at 1,077 MB/s (0.43 s) against a prefill at 42k tokens/s (0.30 s) is
 * computed; the same file against a 27B prefill at 7k tokens/s (1.8 s) is read; unmeasured rates
 * never decline. */
TEST(disk_read_or_recompute) {
  EXPECT(sched_read_slower(463e6, 1077e6, 12499, 42000) == 1);
  EXPECT(sched_read_slower(463e6, 1077e6, 12499, 7000) == 0);
  EXPECT(sched_read_slower(463e6, 0, 12499, 42000) == 0);
  EXPECT(sched_read_slower(463e6, 1077e6, 12499, 0) == 0);
  EXPECT(sched_read_slower(0, 1077e6, 12499, 42000) == 0); /* not a disk checkpoint */
}

int main(void) {
  RUN(units_and_splits);
  RUN(disk_read_or_recompute);
  RUN(admission_order_and_pages);
  RUN(waits_for_pages_and_watermark);
  RUN(preempt_youngest_and_resume);
  RUN(fault_fails_one_request);
  RUN(shared_prefix_wave);
  RUN(spec_lanes_bound_drafts);
  TEST_MAIN_END();
}
