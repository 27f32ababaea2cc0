/* engine — the engine thread, the threads' meeting points, and the public API.
 *
 *   client threads                         engine thread
 *   engine_submit --> incoming queue ----> sched_add
 *                     (e->mu, e->cv)        loop: cancels -> engine_step_run (engine_step.c:
 *                                                 schedule -> forward -> sample -> postprocess)
 *   engine_next  <--- per-request channel <-- token / final events
 *                     (h->mu, h->cv; a ring of max_tokens + 1 events, never grows; a step's
 *                      wake-ups are run by the notifier thread, notifier.h)
 *   engine_cancel --> atomic flag, seen at the next step
 *
 * The engine thread alone touches the scheduler, pages, slots and the requests' token
 * arrays. A handle is owned jointly by the client (until engine_release) and the engine
 * (until the final event); whoever lets go last frees it.
 *
 * Prefix cache (when enabled): created over the same page pool and state pool (the snapshot
 * slabs are the slots past max_num_seqs), its copies wired to qwen35's page and slot
 * operations; the scheduler carries out the lookups, restores and captures (sched.h), the
 * engine reports cached_tokens on the final event and the cache's counters in engine_stats. */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/fault.h"
#include "base/log.h"
#include "cache/kv_events.h"
#include "engine/engine_int.h"
#include "engine/engine_mem.h"

void engine_opts_default(engine_opts *o) {
  memset(o, 0, sizeof *o);
  o->max_num_seqs = 64;
  o->max_num_batched_tokens = 8192;
  o->gpu_memory_utilization = 0.9f;
  o->enable_prefix_caching = 1;
  o->snapshot_interval = 2048;
  o->packed_weights = -1;
  o->sampler_threads = -1;
  o->steps_ahead = -1;
  o->device_sample = -1;
}

static double engine_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- handles and their output channels --------------------------------------------------- */

static void engine_req_unref(engine_req *h) {
  pthread_mutex_lock(&h->mu);
  int left = --h->refs;
  pthread_mutex_unlock(&h->mu);
  if (left > 0) return;
  request_free(&h->r);
  json_mask_free(h->jm);
  json_schema_free(h->schema);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h->ring);
  free(h->top_ids);
  free(h->top_lps);
  free(h);
}

/* Wakes the client of a handle whose wake-up was handed to the notifier, and drops the
 * reference taken for it (notifier thread). */
static void engine_wake(void *item) {
  engine_req *h = item;
  pthread_mutex_lock(&h->mu);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  engine_req_unref(h);
}

int engine_push(engine_req *h, const sampler_result *res, int finish, notifier *nt) {
  pthread_mutex_lock(&h->mu);
  CHECK(!h->done && h->n_push < h->cap);
  engine_ev *ev = &h->ring[h->n_push];
  memset(ev, 0, sizeof *ev);
  if (res) {
    int k = h->r.smp.p.top_logprobs;
    ev->token = res->token;
    ev->has_token = 1;
    ev->logprob = res->logprob;
    ev->n_top = res->n_top < k ? res->n_top : k;
    for (int i = 0; i < ev->n_top; i++) {
      h->top_ids[(size_t)h->n_push * k + i] = res->top_ids[i];
      h->top_lps[(size_t)h->n_push * k + i] = res->top_logprobs[i];
    }
  }
  ev->finish = finish;
  h->n_push++;
  if (finish) {
    h->done = 1;
    h->prompt_tokens = h->r.n_prompt;
    h->completion_tokens = request_n_output(&h->r);
    h->cached_tokens = h->r.cached_tokens < h->r.n_prompt ? h->r.cached_tokens : h->r.n_prompt;
    h->spec_drafts = h->r.spec_drafts;
    h->spec_draft_tokens = h->r.spec_draft_tokens;
    h->spec_accepted = h->r.spec_accepted;
    snprintf(h->err, sizeof h->err, "%s", h->r.err);
  }
  if (nt) {
    h->refs++;
    pthread_mutex_unlock(&h->mu);
    if (notifier_post(nt, h) == 0) return 1;
    engine_wake(h); /* the queue is full: here after all */
    return 0;
  }
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  return 0;
}

void engine_end(engine *e, engine_req *h, int finish, int with_event) {
  h->r.finish = finish;
  if (finish == FINISH_CANCELLED)
    e->cancelled++;
  else if (finish == FINISH_ERROR)
    e->failed++;
  else
    e->finished++;
  if (with_event) engine_push(h, NULL, finish, NULL);
  engine_req_unref(h);
}

/* ---- the engine thread --------------------------------------------------------------------- */

static void engine_cancel_scan(engine *e, int all) {
  request *lists[2] = {sched_first_waiting(e->s), sched_first_running(e->s)};
  for (int l = 0; l < 2; l++) {
    request *next;
    for (request *r = lists[l]; r; r = next) {
      next = r->next;
      engine_req *h = r->owner;
      if (!all && !atomic_load(&h->cancel)) continue;
      if (r->in_flight) continue; /* after its step (no step goes ahead meanwhile) */
      sched_remove(e->s, r);
      engine_end(e, h, FINISH_CANCELLED, 1);
    }
  }
}

static void engine_snapshot(engine *e) {
  engine_stats s;
  memset(&s, 0, sizeof s);
  s.num_running = sched_num_running(e->s);
  s.num_waiting = sched_num_waiting(e->s);
  s.prompt_tokens_total = e->prompt_total;
  s.generation_tokens_total = e->gen_total;
  s.prefilled_tokens_total = e->prefilled_total;
  s.steps = e->steps;
  s.steps_ahead = e->steps_ahead;
  s.steps_device_sampled = e->steps_device_sampled;
  s.spec_k = e->o.spec.method != SPEC_METHOD_NONE ? e->o.spec.k : 0;
  s.spec_num_drafts = e->spec_drafts;
  s.spec_num_draft_tokens = e->spec_draft_tokens;
  s.spec_num_accepted_tokens = e->spec_accepted;
  memcpy(s.spec_accepted_per_pos, e->spec_accepted_pos, sizeof s.spec_accepted_per_pos);
  s.requests_finished = e->finished;
  s.requests_cancelled = e->cancelled;
  s.requests_failed = e->failed;
  s.preemptions = sched_num_preemptions(e->s);
  s.kv_pages_total = kv_pages_total(e->kp);
  s.kv_pages_used = kv_pages_num_used(e->kp);
  s.kv_pages_cached = kv_pages_num_cached(e->kp);
  s.slots_total = state_pool_num_slots(e->sp);
  s.slots_used = s.slots_total - state_pool_num_slots_free(e->sp);
  s.snapshot_slabs_total = state_pool_num_slabs(e->sp);
  s.snapshot_slabs_used = s.snapshot_slabs_total - state_pool_num_slabs_free(e->sp);
  s.max_model_len = e->max_model_len;
  memcpy(s.step_tokens_bucket, e->step_tok_bucket, sizeof s.step_tokens_bucket);
  s.step_tokens_sum = e->step_tok_sum;
  s.ckpt_captures_timed = e->ck_n[0];
  s.ckpt_restores_timed = e->ck_n[1];
  s.ckpt_restore_page_copies = e->ck_n[2];
  s.ckpt_capture_ms_sum = e->ck_ms[0];
  s.ckpt_restore_ms_sum = e->ck_ms[1] + e->ck_ms[2];
  s.ckpt_capture_ms_max = e->ck_max[0];
  s.ckpt_restore_ms_max = e->ck_max[1];
  if (e->pc) {
    prefix_cache_stats p;
    prefix_cache_get_stats(e->pc, &p);
    s.prefix_enabled = 1;
    s.prefix_queries = p.queries;
    s.prefix_query_tokens = p.query_tokens;
    s.prefix_hits = p.hits;
    s.prefix_hit_tokens = p.hit_tokens;
    s.prefix_captures = p.captures;
    s.prefix_capture_failures = p.capture_failures;
    s.prefix_evictions = p.evictions;
    s.prefix_restore_failures = p.restore_failures;
    s.prefix_demotions = p.demotions;
    s.prefix_rejected = p.rejected;
    s.prefix_checkpoints = p.n_checkpoints;
    s.prefix_pending = p.n_pending;
    s.prefix_host_checkpoints = p.n_host;
    s.prefix_device_slabs = p.device_slabs;
    s.prefix_device_slabs_max = p.device_slabs_max;
    s.prefix_device_pages = p.device_pages;
    s.prefix_device_slab_bytes = p.device_slab_bytes;
    s.prefix_device_page_bytes = p.device_page_bytes;
    s.prefix_host_bytes = p.host_bytes;
    s.prefix_host_budget_bytes = p.host_budget_bytes;
    s.disk_checkpoints = p.n_disk;
    s.disk_spills = p.spills;
    s.disk_evictions = p.disk_evictions;
  }
  if (e->dt) {
    disk_tier_stats d;
    disk_tier_get_stats(e->dt, &d);
    s.disk_enabled = 1;
    s.disk_files = disk_tier_count(e->dt);
    s.disk_queued = d.queued;
    s.disk_bytes = disk_tier_bytes(e->dt);
    s.disk_budget_bytes = disk_tier_budget(e->dt);
    s.disk_hits = d.hits;
    s.disk_declined = sched_num_disk_declined(e->s);
    s.disk_read_failures = d.read_failures;
    s.disk_writes = d.writes;
    s.disk_write_failures = d.write_failures;
    s.disk_files_dropped = d.files_dropped;
    s.disk_evictions += d.evictions;
    s.disk_read_bytes = d.read_bytes;
    s.disk_write_bytes = d.write_bytes;
    s.disk_read_s = d.read_s;
    s.disk_write_s = d.write_s;
  }
  pthread_mutex_lock(&e->mu);
  s.num_waiting += e->n_in;
  e->st = s;
  pthread_mutex_unlock(&e->mu);
}

static void engine_run_check(engine *e) {
  char err[200] = "";
  int rc = kv_pages_check(e->kp, err, sizeof err);
  if (rc == 0) rc = state_pool_check(e->sp, err, sizeof err);
  if (rc == 0 && e->pc) rc = prefix_cache_check(e->pc, err, sizeof err);
  engine_snapshot(e); /* so that stats read right after engine_check are current */
  pthread_mutex_lock(&e->mu);
  e->check_rc = rc;
  snprintf(e->check_err, sizeof e->check_err, "%s", err);
  e->check_pending = 0;
  pthread_cond_broadcast(&e->check_cv);
  pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
  engine *e = arg;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->in_head && !e->stop && !e->check_pending && sched_num_running(e->s) == 0 &&
           sched_num_waiting(e->s) == 0)
      pthread_cond_wait(&e->cv, &e->mu);
    engine_req *in = e->in_head;
    e->in_head = e->in_tail = NULL;
    e->n_in = 0;
    int stop = e->stop, drain = e->drain, check = e->check_pending;
    pthread_mutex_unlock(&e->mu);
    for (engine_req *h = in, *next; h; h = next) {
      next = h->qnext;
      e->prompt_total += h->r.n_prompt;
      sched_add(e->s, &h->r);
    }
    engine_cancel_scan(e, stop && !drain);
    if (check) {
      engine_step_drain(e);
      engine_run_check(e);
    }
    int idle = sched_num_running(e->s) == 0 && sched_num_waiting(e->s) == 0;
    if (stop && idle) break;
    int did = idle ? 1 : engine_step_run(e);
    engine_snapshot(e);
    if (!did) { /* nothing could run now (cannot happen without a prefix cache): back off */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_mutex_lock(&e->mu);
      if (!e->in_head && !e->stop) pthread_cond_timedwait(&e->cv, &e->mu, &ts);
      pthread_mutex_unlock(&e->mu);
    }
  }
  engine_snapshot(e);
  return NULL;
}

/* ---- creation ----------------------------------------------------------------------------- */

/* Checkpoint copies (the state pool's and the prefix cache's device ops), timed: they are
 * synchronous (qwen35_slot_copy / qwen35_page_copy end with a backend sync) and run between two
 * steps, when the stream is idle, so the host clock around one is the pause it puts into every
 * running sequence's decode. ck[0]: captures (slot -> slab), ck[1]: restores (slab -> slot),
 * ck[2]: copy-on-write page copies of restores. */
static void engine_time_copy(engine *e, int kind, double t0) {
  double ms = (engine_now() - t0) * 1e3;
  e->ck_n[kind]++;
  e->ck_ms[kind] += ms;
  if (ms > e->ck_max[kind]) e->ck_max[kind] = ms;
}
static int engine_ops_copy(void *ctx, int dst, int src) {
  engine *e = ctx;
  double t0 = engine_now();
  int rc = qwen35_slot_copy(e->m, dst, src);
  if (rc == 0) engine_time_copy(e, dst >= e->o.max_num_seqs ? 0 : 1, t0);
  return rc;
}
static int engine_ops_page_copy(void *ctx, int dst, int src) {
  engine *e = ctx;
  double t0 = engine_now();
  int rc = qwen35_page_copy(e->m, dst, src);
  if (rc == 0) engine_time_copy(e, 2, t0);
  return rc;
}
static int engine_ops_page_read(void *ctx, int page, void *host) {
  return qwen35_page_read(((engine *)ctx)->m, page, host);
}
static int engine_ops_page_write(void *ctx, int page, const void *host) {
  return qwen35_page_write(((engine *)ctx)->m, page, host);
}
static int engine_ops_slot_read(void *ctx, int slot, void *host) {
  return qwen35_slot_read(((engine *)ctx)->m, slot, host);
}
static int engine_ops_slot_write(void *ctx, int slot, const void *host) {
  return qwen35_slot_write(((engine *)ctx)->m, slot, host);
}

#define ENGINE_GIB (1024.0 * 1024.0 * 1024.0)

/* --disk-cache-dir: the disk tier the prefix cache spills to (start-up, before the cache).
 * Returns 0 (also without the flag), or -1 with one line in err. */
static int engine_disk_open(engine *e, char *err, size_t errlen) {
  const char *dir = e->o.disk_cache_dir;
  if (!dir || !dir[0]) {
    if (e->o.disk_cache_gib > 0)
      return errf(err, errlen, "--disk-cache-gib needs --disk-cache-dir");
    return 0;
  }
  if (!e->o.enable_prefix_caching)
    return errf(err, errlen,
                "--disk-cache-dir needs the prefix cache (--no-enable-prefix-caching "
                "turns it off)");
  if (e->o.disk_cache_gib <= 0)
    return errf(err, errlen, "--disk-cache-dir needs --disk-cache-gib F (its byte budget)");
  disk_tier_opts d;
  memset(&d, 0, sizeof d);
  d.dir = dir;
  d.budget = (size_t)(e->o.disk_cache_gib * ENGINE_GIB);
  d.slot_bytes = qwen35_slot_bytes(e->m);
  d.page_bytes = qwen35_page_bytes(e->m);
  uint64_t shape[2] = {d.slot_bytes, d.page_bytes}; /* the backend's state and KV layout */
  d.model_id = disk_tier_hash(shape, sizeof shape, e->o.model_identity);
  d.ops = (host_tier_ops){e, engine_ops_page_read, engine_ops_page_write, engine_ops_slot_read,
                          engine_ops_slot_write};
  return disk_tier_open(&e->dt, &d, err, errlen);
}

/* The prefix cache over the engine's pools (start-up). Returns 0 or -1. */
static int engine_prefix_init(engine *e) {
  prefix_cache_opts po;
  memset(&po, 0, sizeof po);
  po.slab_bytes = qwen35_slot_bytes(e->m);
  po.page_bytes = qwen35_page_bytes(e->m);
  po.device_budget_bytes = (size_t)(e->o.prefix_cache_gib * ENGINE_GIB);
  po.host_budget_bytes = (size_t)(e->o.host_cache_gib * ENGINE_GIB);
  po.disk = e->dt;
  po.events = e->o.kv_events;
  po.ops.ctx = e;
  po.ops.page_copy = engine_ops_page_copy;
  po.ops.page_read = engine_ops_page_read;
  po.ops.page_write = engine_ops_page_write;
  po.ops.slot_read = engine_ops_slot_read;
  po.ops.slot_write = engine_ops_slot_write;
  if (prefix_cache_init(&e->pc, e->kp, e->sp, &po) != 0) return -1;
  sched_set_prefix_cache(e->s, e->pc, e->o.snapshot_interval);
  prefix_cache_stats st;
  prefix_cache_get_stats(e->pc, &st);
  log_info(
      "engine: prefix cache on: %d snapshot slabs on the device (%.2f MiB each), host tier "
      "%.1f MiB, capture interval %d tokens",
      st.device_slabs_max, po.slab_bytes / (1024.0 * 1024.0),
      po.host_budget_bytes / (1024.0 * 1024.0), e->o.snapshot_interval);
  return 0;
}

/* engine_opts.startup_forward: the largest step once, before any request: one long piece on
 * slot 0 and pages from id 0, plus one-token pieces on the next slots (a page each), so that
 * the step has max_num_batched_tokens rows and max_num_seqs pieces -- the shapes the backend's
 * workspaces grow with (prefill attention, the decode attention over every row, logits). */
static int engine_startup_forward(engine *e, int n_pages, char *err, size_t errlen) {
  int n = e->o.max_num_batched_tokens, n_seq = e->o.max_num_seqs;
  if (n > n_pages * KV_PAGES_TOKENS) n = n_pages * KV_PAGES_TOKENS;
  if (n > e->max_model_len) n = e->max_model_len;
  if (n < 1) return 0;
  int singles = n_seq - 1 < n - 1 ? n_seq - 1 : n - 1, n_long = n - singles;
  int np_long = (n_long + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS;
  while (singles > 0 && np_long + singles > n_pages) { /* a small pool: fewer singles */
    singles--;
    n_long++;
    np_long = (n_long + KV_PAGES_TOKENS - 1) / KV_PAGES_TOKENS;
  }
  if (np_long > n_pages) return 0; /* cannot happen: n <= n_pages * page tokens */
  int32_t *toks = calloc((size_t)n, sizeof *toks),
          *pages = malloc(sizeof *pages * (size_t)(np_long + singles));
  fwd_seq *seqs = calloc((size_t)singles + 1, sizeof *seqs);
  if (!toks || !pages || !seqs) {
    free(toks);
    free(pages);
    free(seqs);
    return errf(err, errlen, "out of memory for the start-up forward");
  }
  for (int i = 0; i < np_long + singles; i++) pages[i] = i;
  seqs[0] = (fwd_seq){toks, n_long, 0, pages, np_long, 0, QWEN35_LOGITS_LAST, -1};
  for (int i = 1; i <= singles; i++)
    seqs[i] = (fwd_seq){toks + n_long + i - 1, 1, 0, pages + np_long + i - 1, 1, i,
                        QWEN35_LOGITS_LAST,    -1};
  char ferr[256] = "";
  double t0 = engine_now();
  int rc = qwen35_forward(e->m, seqs, singles + 1, e->logits, ferr, sizeof ferr);
  free(toks);
  free(pages);
  free(seqs);
  if (rc)
    return errf(err, errlen,
                "the start-up forward of %d tokens failed (%s): lower --gpu-memory-utilization "
                "or --max-num-batched-tokens",
                n, ferr);
  log_info("engine: start-up forward of %d tokens in %d pieces: %.2f s", n, singles + 1,
           engine_now() - t0);
  return 0;
}

/* SPEC_METHOD_MTP: the drafter over the checkpoint's MTP head, its pages mirroring the
 * target's n_pages plus scratch pages for draft rows past a sequence's pages (k drafts write
 * rows up to k - 1 positions past its last one), and the step's hidden rows. */
static int engine_mtp_init(engine *e, int n_pages, char *err, size_t errlen) {
  if (!e->o.mtp_weights || e->o.mtp_weights->mtp.n_layers < 1)
    return errf(err, errlen,
                "--speculative-config: method \"mtp\" needs a checkpoint with an MTP head "
                "(mtp_num_hidden_layers and the mtp.* tensors)");
  int per = QWEN35_PAGE_TOKENS;
  e->mtp_scratch0 = n_pages;
  e->mtp_scratch = (SPEC_MAX_TOKENS + per - 1) / per + 1;
  e->mtp_pt = kv_pages_for_tokens(e->max_model_len + SPEC_MAX_TOKENS) + e->mtp_scratch;
  size_t rows = (size_t)e->o.max_num_batched_tokens, n_seq = (size_t)e->o.max_num_seqs;
  e->hidden = malloc(rows * (size_t)e->cfg->hidden_size * sizeof *e->hidden);
  e->mtp_pages = malloc(n_seq * (size_t)e->mtp_pt * sizeof *e->mtp_pages);
  e->mtp_items = malloc(n_seq * sizeof *e->mtp_items);
  if (!e->hidden || !e->mtp_pages || !e->mtp_items)
    return errf(err, errlen, "out of memory for the MTP drafter");
  char merr[200];
  if (spec_mtp_init(&e->mtp, e->m, e->o.mtp_weights, qwen35_backend(e->m),
                    n_pages + (int)n_seq * e->mtp_scratch, merr, sizeof merr))
    return errf(err, errlen, "--speculative-config: method \"mtp\": %s", merr);
  log_info("engine: MTP drafts (%d layer%s), %d per step", e->o.mtp_weights->mtp.n_layers,
           e->o.mtp_weights->mtp.n_layers == 1 ? "" : "s", e->o.spec.k);
  return 0;
}

engine *engine_create(qwen35 *model, const engine_opts *o, char *err, size_t errlen) {
  const model_config *c = qwen35_config(model);
  qwen35_mem_opts mo;
  if (engine_mem_plan(o, c, &mo, err, errlen) != 0) return NULL;
  int spec = o->spec.method != SPEC_METHOD_NONE;
  if (spec && qwen35_can_verify(model) < mo.keep_k)
    return errf(err, errlen,
                "--speculative-config: this backend cannot verify drafts (it keeps no per-row "
                "recurrent states)"),
           NULL;
  engine *e = calloc(1, sizeof *e);
  if (!e) return errf(err, errlen, "out of memory"), NULL;
  e->m = model;
  e->cfg = c;
  e->o = *o;
  if (e->o.max_waiting <= 0) e->o.max_waiting = 4096;
  e->n_vocab = c->vocab_size;
  e->max_model_len = o->max_model_len > 0 ? o->max_model_len : c->max_position_embeddings;
  int n_seq = o->max_num_seqs, n_slabs = mo.n_slots - n_seq;
  state_pool_ops ops = {e, NULL, engine_ops_copy}; /* the forward zeroes state at pos 0 */
  sched_opts so = {n_seq, o->max_num_batched_tokens, -1};
  e->seqs = calloc((size_t)n_seq, sizeof *e->seqs);
  /* a verify piece wants the logits of each of its 1 + k rows */
  size_t lg_rows = (size_t)n_seq * (size_t)(spec ? 1 + o->spec.k : 1);
  e->logits = qwen35_host_alloc(model, lg_rows * (size_t)e->n_vocab * sizeof *e->logits);
  /* pinned on device backends: the step's ids come back by one copy queued behind the step */
  e->ids = qwen35_host_alloc(model, lg_rows * sizeof *e->ids); /* a verify piece: 1 + k ids */
  e->ids_buf[0] = e->ids;
  e->ids_buf[1] = qwen35_host_alloc(model, (size_t)n_seq * sizeof *e->ids);
  e->fl_store[0] = calloc((size_t)n_seq, sizeof *e->fl_store[0]);
  e->fl_store[1] = calloc((size_t)n_seq, sizeof *e->fl_store[1]);
  /* steps ahead and the sample op by default on device backends only, where they save the
   * device's idle time between steps and the logits download; a CPU forward has neither */
  int dev = qwen35_on_device(model);
  /* a step ahead is a plain decode step: none while speculating */
  e->ahead = !spec && qwen35_can_chain(model) && (o->steps_ahead < 0 ? dev : o->steps_ahead);
  e->device_greedy = qwen35_has_argmax(model);
  e->device_sample = qwen35_has_sample(model) && (o->device_sample < 0 ? dev : o->device_sample);
  e->words =
      malloc((size_t)n_seq * (SAMPLE_RULE_WORDS + SAMPLE_RULE_EDITS_MAX * SAMPLE_RULE_EDIT_WORDS) *
             sizeof *e->words);
  e->edits = malloc((size_t)n_seq * SAMPLE_RULE_EDITS_MAX * sizeof *e->edits);
  e->rng_save = malloc((size_t)n_seq * sizeof *e->rng_save);
  e->edit_n = malloc((size_t)n_seq * sizeof *e->edit_n);
  e->masks = calloc((size_t)n_seq, sizeof *e->masks);
  int n_threads = o->sampler_threads < 0 ? sampler_pool_default_threads() : o->sampler_threads;
  if (engine_disk_open(e, err, errlen) != 0) {
    engine_destroy(e, 0);
    return NULL;
  }
  if (!e->seqs || !e->logits || !e->ids || !e->ids_buf[1] || !e->fl_store[0] || !e->fl_store[1] ||
      !e->words || !e->edits || !e->edit_n || !e->rng_save || !e->masks ||
      kv_pages_init(&e->kp, mo.n_pages) || state_pool_init(&e->sp, n_seq, n_slabs, &ops) ||
      sched_init(&e->s, &so, e->kp, e->sp) || sampler_scratch_init(&e->scratch, e->n_vocab) ||
      sampler_pool_init(&e->pool, n_threads, e->n_vocab, n_seq) != 0 ||
      (o->enable_prefix_caching && engine_prefix_init(e) != 0)) {
    engine_destroy(e, 0);
    return errf(err, errlen, "out of memory creating the engine"), NULL;
  }
  if (e->dt) {
    prefix_cache_stats ps;
    prefix_cache_get_stats(e->pc, &ps);
    log_info("engine: disk cache %s: %d checkpoints (%.1f MiB) restorable, budget %.2f GiB",
             o->disk_cache_dir, ps.n_disk, disk_tier_bytes(e->dt) / (1024.0 * 1024.0),
             o->disk_cache_gib);
  }
  if (o->spec.method == SPEC_METHOD_MTP && engine_mtp_init(e, mo.n_pages, err, errlen) != 0) {
    engine_destroy(e, 0);
    return NULL;
  }
  /* the model's lanes: a device plan may have cut them below this plan's */
  sched_set_spec(e->s, spec ? &o->spec : NULL, e->max_model_len, qwen35_keep_lanes(model));
  spec_policy_init(&e->pol);
  e->spec_on = 1;
  if (o->startup_forward && engine_startup_forward(e, mo.n_pages, err, errlen) != 0) {
    engine_destroy(e, 0);
    return NULL;
  }
  /* token wake-ups off the engine thread (notifier.h); NULL (no thread): on it */
  e->nt = notifier_start(engine_wake, n_seq);
  if (!o->enable_prefix_caching) log_info("engine: prefix cache off");
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  pthread_cond_init(&e->check_cv, NULL);
  double mib = 1024.0 * 1024.0;
  size_t pb = qwen35_page_bytes(model), sb = qwen35_slot_bytes(model);
  log_info(
      "engine: memory: weights %.1f MiB, KV pages %d x %.3f MiB = %.1f MiB (%d tokens), "
      "state slots %d x %.2f MiB = %.1f MiB, snapshot slabs %d x %.2f MiB = %.1f MiB",
      qwen35_weight_bytes(model) / mib, mo.n_pages, pb / mib, mo.n_pages * (pb / mib),
      mo.n_pages * KV_PAGES_TOKENS, n_seq, sb / mib, n_seq * (sb / mib), n_slabs, sb / mib,
      n_slabs * (sb / mib));
  int lanes = qwen35_keep_lanes(model);
  if (lanes > 0)
    log_info(
        "engine: memory: keep slots (speculative decoding) %d lanes x %d x %.2f MiB = %.1f "
        "MiB: at most %d sequences verify drafts in one step",
        lanes, mo.keep_k, sb / mib, lanes * mo.keep_k * (sb / mib), lanes);
  log_info(
      "engine: max_num_seqs %d, max_num_batched_tokens %d, max_model_len %d, "
      "sampler threads %d",
      n_seq, o->max_num_batched_tokens, e->max_model_len, sampler_pool_threads(e->pool));
  engine_snapshot(e);
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->check_cv);
    e->thread = 0;
    engine_destroy(e, 0);
    return errf(err, errlen, "cannot start the engine thread"), NULL;
  }
  return e;
}

void engine_destroy(engine *e, int drain) {
  if (!e) return;
  if (e->s && e->thread) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    e->drain = drain;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_cond_destroy(&e->check_cv);
  }
  notifier_stop(e->nt);     /* the last wake-ups the engine thread queued */
  prefix_cache_free(e->pc); /* writes its memory checkpoints to the disk tier */
  disk_tier_close(e->dt);   /* after the queued writes */
  sched_free(e->s);
  state_pool_free(e->sp);
  kv_pages_free(e->kp);
  sampler_scratch_free(&e->scratch);
  sampler_pool_free(e->pool);
  free(e->masks);
  free(e->seqs);
  if (e->logits) qwen35_host_free(e->m, e->logits);
  if (e->ids) qwen35_host_free(e->m, e->ids);
  if (e->ids_buf[1]) qwen35_host_free(e->m, e->ids_buf[1]);
  free(e->words);
  free(e->edits);
  free(e->edit_n);
  free(e->rng_save);
  free(e->fl_store[0]);
  free(e->fl_store[1]);
  spec_mtp_free(e->mtp);
  free(e->hidden);
  free(e->mtp_pages);
  free(e->mtp_items);
  free(e);
}

/* ---- requests ------------------------------------------------------------------------------- */

static engine_req *engine_submit_req(engine *e, const engine_submit_opts *o, engine_status *status,
                                     char *err, size_t errlen);

engine_req *engine_submit(engine *e, const engine_submit_opts *o, engine_status *status, char *err,
                          size_t errlen) {
  engine_req *h = engine_submit_req(e, o, status, err, errlen);
  if (!h) json_schema_free(o->schema); /* taken in every case (engine.h) */
  return h;
}

/* engine_submit's work; the handle it returns owns o->schema, NULL leaves it to the caller. */
static engine_req *engine_submit_req(engine *e, const engine_submit_opts *o, engine_status *status,
                                     char *err, size_t errlen) {
  engine_status dummy;
  if (!status) status = &dummy;
  *status = ENGINE_ERR_INVALID;
  if (!o->prompt || o->n_prompt < 1) return errf(err, errlen, "the prompt is empty"), NULL;
  for (int i = 0; i < o->n_prompt; i++)
    if (o->prompt[i] < 0 || o->prompt[i] >= e->n_vocab)
      return errf(err, errlen, "prompt token %d is out of range [0, %d)", o->prompt[i], e->n_vocab),
             NULL;
  if (sampling_params_validate(&o->sp, err, errlen) != 0) return NULL;
  long long total = (long long)o->n_prompt + o->sp.max_tokens;
  *status = ENGINE_ERR_TOO_LONG;
  if (total > e->max_model_len)
    return errf(err, errlen,
                "prompt (%d tokens) + max_tokens (%d) exceeds the maximum model length %d",
                o->n_prompt, o->sp.max_tokens, e->max_model_len),
           NULL;
  if (kv_pages_for_tokens((int)total - 1) > kv_pages_total(e->kp))
    return errf(err, errlen,
                "prompt (%d tokens) + max_tokens (%d) exceeds the KV cache (%d "
                "tokens)",
                o->n_prompt, o->sp.max_tokens, kv_pages_total(e->kp) * 16),
           NULL;
  *status = ENGINE_ERR_NOMEM;
  if (fault_hit("engine_submit")) return errf(err, errlen, "out of memory"), NULL;
  engine_req *h = calloc(1, sizeof *h);
  if (!h) return errf(err, errlen, "out of memory"), NULL;
  h->cap = o->sp.max_tokens + 1;
  int k = o->sp.logprobs ? o->sp.top_logprobs : 0;
  h->ring = malloc((size_t)h->cap * sizeof *h->ring);
  h->top_ids = malloc((size_t)h->cap * (size_t)(k > 0 ? k : 1) * sizeof *h->top_ids);
  h->top_lps = malloc((size_t)h->cap * (size_t)(k > 0 ? k : 1) * sizeof *h->top_lps);
  if (o->json &&
      !(h->jm = o->schema ? json_mask_new_schema(o->json, o->schema) : json_mask_new(o->json))) {
    free(h->ring);
    free(h->top_ids);
    free(h->top_lps);
    free(h);
    return errf(err, errlen, "out of memory"), NULL;
  }
  pthread_mutex_lock(&e->mu);
  long long id = e->next_id++;
  pthread_mutex_unlock(&e->mu);
  /* split points: every chat boundary and the caller's extra points */
  int nb = o->boundaries ? o->n_boundaries : 0, ns = o->split_points ? o->n_split_points : 0;
  if (nb < 0) nb = 0;
  if (ns < 0) ns = 0;
  int32_t *forced = malloc((size_t)(nb + ns + 1) * sizeof *forced);
  if (forced) {
    if (nb) memcpy(forced, o->boundaries, (size_t)nb * sizeof *forced);
    if (ns) memcpy(forced + nb, o->split_points, (size_t)ns * sizeof *forced);
  }
  int rc = -1;
  if (h->ring && h->top_ids && h->top_lps && forced) {
    rc = request_init(&h->r, id, o->prompt, o->n_prompt, &o->sp, forced, nb + ns,
                      0x5eed0000ULL + (uint64_t)id);
    if (rc == 0 && e->pc &&
        request_init_prefix(
            &h->r, o->cache_salt, o->boundaries, nb,
            prefix_cache_capture_points_max(o->n_prompt, nb, e->o.snapshot_interval)) != 0) {
      request_free(&h->r);
      rc = -1;
    }
  }
  free(forced);
  if (rc != 0) {
    json_mask_free(h->jm);
    free(h->ring);
    free(h->top_ids);
    free(h->top_lps);
    free(h);
    return errf(err, errlen, "out of memory"), NULL;
  }
  if (!o->sp.logprobs) h->r.smp.p.top_logprobs = 0;
  h->r.owner = h;
  h->e = e;
  h->refs = 2;
  h->on_logits = o->on_logits;
  h->user = o->user;
  h->r.replay = o->draft_replay;
  h->r.n_replay = o->draft_replay ? o->n_draft_replay : 0;
  h->r.replay_pm = o->draft_corrupt_pm;
  h->r.replay_follow = o->draft_replay && o->draft_replay_follow;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  pthread_mutex_lock(&e->mu);
  if (e->stop || e->st.num_waiting + e->n_in >= e->o.max_waiting) {
    engine_status st = e->stop ? ENGINE_ERR_SHUTDOWN : ENGINE_ERR_QUEUE_FULL;
    pthread_mutex_unlock(&e->mu);
    h->refs = 1;
    engine_req_unref(h);
    *status = st;
    return errf(err, errlen,
                st == ENGINE_ERR_SHUTDOWN ? "the engine is shutting down"
                                          : "too many requests waiting"),
           NULL;
  }
  h->schema = o->schema; /* from here the handle owns it */
  if (e->in_tail)
    e->in_tail->qnext = h;
  else
    e->in_head = h;
  e->in_tail = h;
  e->n_in++;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  *status = ENGINE_OK;
  return h;
}

int engine_next(engine_req *h, engine_event *ev, int timeout_ms) {
  struct timespec until;
  if (timeout_ms >= 0) {
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&h->mu);
  while (h->n_pop == h->n_push) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&h->cv, &h->mu);
    } else if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT &&
               h->n_pop == h->n_push) {
      pthread_mutex_unlock(&h->mu);
      return 0;
    }
  }
  memset(ev, 0, sizeof *ev);
  int i = h->n_pop++;
  const engine_ev *x = &h->ring[i];
  int k = h->r.smp.p.top_logprobs;
  ev->token = x->token;
  ev->has_token = x->has_token;
  ev->logprob = x->logprob;
  ev->n_top = x->n_top;
  for (int j = 0; j < x->n_top; j++) {
    ev->top_ids[j] = h->top_ids[(size_t)i * k + j];
    ev->top_logprobs[j] = h->top_lps[(size_t)i * k + j];
  }
  ev->finish = x->finish;
  if (x->finish) {
    ev->prompt_tokens = h->prompt_tokens;
    ev->completion_tokens = h->completion_tokens;
    ev->cached_tokens = h->cached_tokens;
    ev->spec_drafts = h->spec_drafts;
    ev->spec_draft_tokens = h->spec_draft_tokens;
    ev->spec_accepted_tokens = h->spec_accepted;
    ev->t_scheduled = h->t_sched;
    snprintf(ev->err, sizeof ev->err, "%s", h->err);
  }
  pthread_mutex_unlock(&h->mu);
  return 1;
}

void engine_cancel(engine_req *h) {
  pthread_mutex_lock(&h->mu);
  int done = h->done;
  pthread_mutex_unlock(&h->mu);
  if (done) return;
  atomic_store(&h->cancel, 1);
  engine *e = h->e;
  pthread_mutex_lock(&e->mu);
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

void engine_release(engine_req *h) {
  if (!h) return;
  engine_cancel(h);
  engine_req_unref(h);
}

void engine_get_stats(engine *e, engine_stats *s) {
  pthread_mutex_lock(&e->mu);
  *s = e->st;
  pthread_mutex_unlock(&e->mu);
  if (e->o.kv_events) { /* live: the publisher thread counts while the engine sleeps */
    kv_events_stats k;
    kv_events_get_stats(e->o.kv_events, &k);
    s->kv_events_enabled = 1;
    s->kv_events_events = k.events;
    s->kv_events_batches = k.batches;
    s->kv_events_dropped = k.dropped;
    s->kv_events_replays = k.replays;
  }
}

int engine_check(engine *e, char *err, size_t errlen) {
  pthread_mutex_lock(&e->mu);
  e->check_pending = 1;
  pthread_cond_broadcast(&e->cv);
  while (e->check_pending) pthread_cond_wait(&e->check_cv, &e->mu);
  int rc = e->check_rc;
  if (rc) errf(err, errlen, "%s", e->check_err);
  pthread_mutex_unlock(&e->mu);
  return rc;
}

const char *finish_reason_name(finish_reason f) {
  switch (f) {
    case FINISH_NONE:
      return "none";
    case FINISH_STOP:
      return "stop";
    case FINISH_LENGTH:
      return "length";
    case FINISH_CANCELLED:
      return "cancelled";
    case FINISH_ERROR:
      return "error";
  }
  return "unknown";
}