#include "engine/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cache/checkpoint.h"
#include "engine/engine.h"
#include "engine/spec_ngram.h"
#include "engine/spec_replay.h"

typedef struct sched_list {
  request *head, *tail;
  int n;
} sched_list;

struct sched {
  sched_opts o;
  int unit;
  int watermark;
  kv_pages *kp;
  state_pool *sp;
  sched_list waiting; /* FCFS; preempted requests go back to the front */
  sched_list running; /* sorted by id: the tail is the youngest */
  long long n_preemptions;
  request **reqs, **failed;     /* [max_num_seqs] batch arrays */
  prefix_cache *pc;             /* NULL: no prefix cache */
  int interval;                 /* --snapshot-interval */
  long long n_waits, n_demands; /* admissions deferred for an in-flight capture; demands */
  spec_config spec;             /* speculative decoding (method NONE: off) */
  int spec_on;                  /* drafts in the next step (sched_set_spec_on) */
  int spec_lanes;               /* the most verify pieces a step holds (sched_set_spec) */
  double prefill_tps;           /* measured prefill tokens per second (sched_set_prefill_rate) */
  long long disk_declined;      /* disk restores declined as slower than recomputing */
  int max_model_len;
};

/* ---- lists -------------------------------------------------------------------------------- */

static void sched_list_remove(sched_list *l, request *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    l->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    l->tail = r->prev;
  r->prev = r->next = NULL;
  l->n--;
}

static void sched_list_insert_before(sched_list *l, request *at, request *r) {
  r->next = at;
  r->prev = at ? at->prev : l->tail;
  if (r->prev)
    r->prev->next = r;
  else
    l->head = r;
  if (at)
    at->prev = r;
  else
    l->tail = r;
  l->n++;
}

static void sched_list_insert_sorted(sched_list *l, request *r) {
  request *at = l->tail;
  while (at && at->id > r->id) at = at->prev;
  sched_list_insert_before(l, at ? at->next : l->head, r);
}

/* ---- set-up ------------------------------------------------------------------------------ */

int sched_unit(int budget) {
  if (budget >= QWEN35_CHUNK) return QWEN35_CHUNK;
  int u = 1;
  while (u * 2 <= budget) u *= 2;
  return u;
}

int sched_init(sched **out, const sched_opts *o, kv_pages *kp, state_pool *sp) {
  *out = NULL;
  sched *s = calloc(1, sizeof *s);
  if (!s) return -1;
  s->o = *o;
  s->kp = kp;
  s->sp = sp;
  s->unit = sched_unit(o->max_num_batched_tokens);
  s->watermark = o->watermark_pages >= 0 ? o->watermark_pages : kv_pages_total(kp) / 100;
  s->reqs = calloc((size_t)o->max_num_seqs + 1, sizeof *s->reqs);
  s->failed = calloc((size_t)o->max_num_seqs + 1, sizeof *s->failed);
  if (!s->reqs || !s->failed) {
    sched_free(s);
    return -1;
  }
  *out = s;
  return 0;
}

void sched_free(sched *s) {
  if (!s) return;
  free(s->reqs);
  free(s->failed);
  free(s);
}

void sched_set_prefix_cache(sched *s, prefix_cache *pc, int snapshot_interval) {
  s->pc = pc;
  s->interval = snapshot_interval;
}

void sched_set_spec(sched *s, const spec_config *spec, int max_model_len, int lanes) {
  memset(&s->spec, 0, sizeof s->spec);
  if (spec) s->spec = *spec;
  s->max_model_len = max_model_len;
  s->spec_lanes = lanes;
  s->spec_on = 1;
}

void sched_set_spec_on(sched *s, int on) { s->spec_on = on; }

void sched_set_prefill_rate(sched *s, double tokens_per_s) { s->prefill_tps = tokens_per_s; }
long long sched_num_disk_declined(const sched *s) { return s->disk_declined; }

int sched_read_slower(double bytes, double read_rate, int depth, double prefill_tps) {
  return bytes > 0 && read_rate > 0 && prefill_tps > 0 && bytes / read_rate > depth / prefill_tps;
}

/* 1 when restoring m's checkpoint reads a disk file more slowly than the prefill recomputes its
 * positions, both as measured. */
static int sched_disk_slower(sched *s, const prefix_cache_match *m) {
  double bytes, rate;
  prefix_cache_disk_cost(s->pc, m->ckpt, &bytes, &rate);
  return sched_read_slower(bytes, rate, m->depth, s->prefill_tps);
}

int sched_num_running(const sched *s) { return s->running.n; }
int sched_num_waiting(const sched *s) { return s->waiting.n; }
long long sched_num_preemptions(const sched *s) { return s->n_preemptions; }
request *sched_first_waiting(sched *s) { return s->waiting.head; }
request *sched_first_running(sched *s) { return s->running.head; }

/* ---- split rule -------------------------------------------------------------------------- */

int sched_segment_end(const request *r, int c, int u) {
  int e = (c / u + 1) * u;
  if (e > r->n_prompt) e = r->n_prompt;
  for (int i = 0; i < r->n_forced; i++)
    if (r->forced[i] > c) {
      if (r->forced[i] < e) e = r->forced[i];
      break;
    }
  return e;
}

int sched_piece(const request *r, int u, int budget) {
  int c = r->n_computed;
  if (c >= r->n_prompt) return budget >= 1 ? 1 : 0;
  int e = sched_segment_end(r, c, u);
  if (e - c > budget) return 0;
  if (u == QWEN35_CHUNK && e - c > 1) {
    while (e < r->n_prompt && !request_is_forced(r, e)) {
      int e2 = sched_segment_end(r, e, u);
      if (e2 - e < 2 || e2 - c > budget) break;
      e = e2;
    }
  }
  return e - c;
}

/* ---- actions ----------------------------------------------------------------------------- */

static void sched_release(sched *s, request *r) {
  for (int i = 0; i < r->n_txn; i++) checkpoint_txn_cancel(s->pc, &r->txn[i]);
  r->n_txn = 0;
  r->wait_ticket = 0;
  kv_pages_table_release(s->kp, &r->pages);
  if (r->slot >= 0) state_pool_slot_free(s->sp, r->slot);
  r->slot = -1;
  r->n_computed = 0;
  r->sched_tokens = 0;
  r->sched_sample = 0;
  r->sched_draft = 0;
}

void sched_add(sched *s, request *r) {
  r->state = REQ_STATE_WAITING;
  sched_list_insert_before(&s->waiting, NULL, r);
}

void sched_remove(sched *s, request *r) {
  if (r->state == REQ_STATE_WAITING)
    sched_list_remove(&s->waiting, r);
  else if (r->state == REQ_STATE_RUNNING)
    sched_list_remove(&s->running, r);
  sched_release(s, r);
  r->state = REQ_STATE_FINISHED;
}

static void sched_fail(sched *s, sched_batch *b, request *r, const char *why) {
  sched_remove(s, r);
  r->finish = FINISH_ERROR;
  snprintf(r->err, sizeof r->err, "%s", why);
  b->failed[b->n_failed++] = r;
}

static void sched_preempt(sched *s, request *r) {
  sched_list_remove(&s->running, r);
  sched_release(s, r);
  r->state = REQ_STATE_WAITING;
  r->n_preemptions++;
  s->n_preemptions++;
  sched_list_insert_before(&s->waiting, s->waiting.head, r);
}

/* The youngest running request not scheduled this step (sched_tokens == 0). */
static request *sched_victim(sched *s) {
  for (request *v = s->running.tail; v; v = v->prev)
    if (v->sched_tokens == 0) return v;
  return NULL;
}

/* Makes room for r to hold `upto` positions, preempting the youngest unscheduled running
 * requests. Returns 1 when r got its pages, 0 when r itself was preempted, -1 when it
 * failed (fault; r removed into b->failed). */
static int sched_reserve(sched *s, sched_batch *b, request *r, int upto) {
  int need = kv_pages_table_need(&r->pages, upto);
  while (!kv_pages_can_alloc(s->kp, need)) {
    /* pages held only by the prefix cache go before any running request */
    if (s->pc && prefix_cache_evict_for_pages(s->pc, need - kv_pages_num_free(s->kp)) > 0) continue;
    request *v = sched_victim(s);
    CHECK(v); /* r itself is unscheduled */
    sched_preempt(s, v);
    b->n_preempted++;
    if (v == r) return 0;
  }
  if (kv_pages_table_grow(s->kp, &r->pages, upto) != 0) {
    sched_fail(s, b, r, "could not allocate KV-cache pages");
    return -1;
  }
  return 1;
}

static void sched_take(sched_batch *b, request *r, int n) {
  r->sched_tokens = n;
  r->sched_sample = r->n_computed + n - r->sched_draft == r->n_tokens;
  b->reqs[b->n++] = r;
  b->n_tokens += n;
}

/* Drafts for decode row r at its sampling point, written past its tokens (at most `room`):
 * sets r->sched_draft and returns it. */
static int sched_draft(sched *s, request *r, int room) {
  r->sched_draft = 0;
  if (s->spec.method == SPEC_METHOD_NONE || !s->spec_on || r->n_computed + 1 != r->n_tokens)
    return 0;
  int k = s->spec.k;
  int left = r->smp.p.max_tokens - request_n_output(r) - 1; /* the last token needs no draft */
  if (k > left) k = left;
  if (k > s->max_model_len - r->n_tokens) k = s->max_model_len - r->n_tokens;
  if (k > room) k = room;
  if (k <= 0) return 0;
  int d = 0;
  if (r->replay) { /* engine_submit_opts.draft_replay: the benchmark drafter */
    d = spec_replay_propose(r->replay, r->n_replay, r->id, request_n_output(r), r->replay_pm, k,
                            r->tokens + r->n_tokens);
  } else if (s->spec.method == SPEC_METHOD_MTP) { /* made after the step that led here */
    d = r->mtp_at == r->n_tokens ? r->n_mtp_draft : 0;
    if (d > k) d = k;
    memcpy(r->tokens + r->n_tokens, r->mtp_draft, (size_t)(d > 0 ? d : 0) * sizeof *r->tokens);
  } else {
    d = spec_ngram_propose(r->tokens, r->n_tokens, s->spec.lookup_min, s->spec.lookup_max, k,
                           r->tokens + r->n_tokens);
  }
  /* drafts never preempt anyone nor evict the prefix cache: only free pages */
  if (d > 0 && kv_pages_table_need(&r->pages, r->n_computed + 1 + d) > kv_pages_num_free(s->kp))
    d = 0;
  r->sched_draft = d;
  return d;
}

/* After a verify piece: the pages past the position the next step feeds go back (their rows
 * held rejected drafts' K/V). */
static void sched_trim(sched *s, request *r) {
  int keep = kv_pages_for_tokens(r->n_computed + 1);
  while (r->pages.n > keep) kv_pages_unref(s->kp, r->pages.ids[--r->pages.n]);
}

/* ---- admission and the prefix cache ----------------------------------------------------- */

enum { SCHED_ADMIT_OK, SCHED_ADMIT_SKIP, SCHED_ADMIT_BLOCK, SCHED_ADMIT_FAILED };

/* 1 when `need` more pages can be taken leaving `keep` free, after evicting pages held only by
 * the prefix cache if short. */
static int sched_pages_ok(sched *s, int need, int keep) {
  int short_by = need + keep - kv_pages_num_free(s->kp);
  if (short_by > 0 && s->pc) prefix_cache_evict_for_pages(s->pc, short_by);
  return kv_pages_num_free(s->kp) - need >= keep;
}

/* The checkpoint r may restore from. A first admission takes the deepest one on its prompt;
 * a re-admission (split points frozen) only one at a depth that already was a split point of
 * r, so the recomputation splits exactly as the first computation did, and never waits. */
static void sched_lookup(sched *s, request *r, prefix_cache_match *m) {
  int lim = r->n_prompt;
  for (;;) {
    prefix_cache_lookup(s->pc, r->salt, r->tokens, lim, m);
    if (!r->points_fixed) return;
    m->inflight = 0;
    m->inflight_depth = 0;
    if (!m->ckpt || m->depth % s->unit == 0 || request_is_forced(r, m->depth)) return;
    lim = m->depth; /* the next shallower one */
  }
}

static int sched_capture(sched *s, request *r, uint64_t ticket) {
  checkpoint_payload p = {r->n_computed, r->slot, -1, r->pages.ids, r->pages.n};
  uint64_t id;
  if (checkpoint_capture(s->pc, ticket, &p) != 0) return -1;
  return checkpoint_commit(s->pc, ticket, &id) == 0 ? 0 : -1;
}

/* A capture ticket for each capture point deeper than the restored depth (and a split point
 * of r). A point where a checkpoint exists, one in flight elsewhere, or no room: no ticket. */
static void sched_reserve_tickets(sched *s, request *r, int np, int restored) {
  r->n_txn = 0;
  for (int i = 0; i < np && r->n_txn < r->cap_txn; i++) {
    int d = r->pts[i].depth;
    if (d <= restored || !request_is_forced(r, d)) continue;
    int fl = (r->pts[i].flags & PREFIX_CACHE_POINT_PROTECT) ? CHECKPOINT_PROTECT : 0;
    uint64_t t;
    if (checkpoint_reserve(s->pc, r->salt, r->tokens, r->n_tokens, d, fl, &t) != 0) continue;
    r->txn[r->n_txn].ticket = t;
    r->txn[r->n_txn].depth = d;
    r->n_txn++;
  }
}

static int sched_salt_eq(const char *a, const char *b) {
  return strcmp(a ? a : "", b ? b : "") == 0;
}

/* Inserts ticket t at depth d into r's tickets (ascending depth); room was checked. */
static void sched_txn_insert(request *r, uint64_t t, int d) {
  int i = r->n_txn;
  while (i > 0 && r->txn[i - 1].depth > d) {
    r->txn[i] = r->txn[i - 1];
    i--;
  }
  r->txn[i].ticket = t;
  r->txn[i].depth = d;
  r->n_txn++;
}

/* Demand capture (see sched.h): the running request R that shares the longest prefix with
 * waiting request r and has not computed (nor planned this step) that far is asked for a
 * checkpoint where r leaves its path, D = min(common prefix, n_prompt - 1 of both). Only when
 * D is at least one chunk deeper than both what r can restore now (d0) and the capture
 * already in flight on r's path (infl). Returns the ticket r should wait for, or 0. */
static uint64_t sched_demand(sched *s, request *r, int d0, int infl) {
  request *best = NULL;
  int bd = 0;
  for (request *R = s->running.head; R; R = R->next) {
    int planned = R->n_computed + R->sched_tokens;
    if (planned >= R->n_prompt - 1 || R->n_txn >= R->cap_txn || R->n_forced >= R->cap_forced ||
        R->tokens[0] != r->tokens[0] || !sched_salt_eq(R->salt, r->salt))
      continue;
    int lim = r->n_prompt - 1 < R->n_prompt - 1 ? r->n_prompt - 1 : R->n_prompt - 1, d = 0;
    while (d < lim && R->tokens[d] == r->tokens[d]) d++;
    if (d > R->n_computed && d >= planned && d > bd) {
      bd = d;
      best = R;
    }
  }
  if (!best || bd < d0 + QWEN35_CHUNK || bd <= infl) return 0;
  uint64_t t;
  int rc = checkpoint_reserve(s->pc, best->salt, best->tokens, best->n_tokens, bd, 0, &t);
  if (rc == PREFIX_CACHE_INFLIGHT) return t;
  if (rc != 0) return 0;
  if (request_add_point(best, bd) != 0) { /* cannot happen: room and depth were checked */
    checkpoint_abort(s->pc, t);
    return 0;
  }
  sched_txn_insert(best, t, bd);
  s->n_demands++;
  return t;
}

/* First admission of r, with m its lookup: when a capture deeper than what r can restore is
 * in flight on r's path, or one can be demanded from a running request, r waits for it
 * (wait_ticket set, returns 1). */
static int sched_wait_for(sched *s, request *r, const prefix_cache_match *m) {
  int d0 = m->ckpt ? m->depth : 0;
  uint64_t t = sched_demand(s, r, d0, m->inflight ? m->inflight_depth : 0);
  if (!t && m->inflight && m->inflight_depth > d0) t = m->inflight;
  if (!t) return 0;
  r->wait_ticket = t;
  s->n_waits++;
  return 1;
}

/* Look-ahead over a waiting request that cannot be admitted this step (budget, slots or an
 * earlier request blocked): a first admission that should wait for a capture starts waiting
 * now, so that the request computing the shared prefix is asked for the divergence point
 * before it plans past it. */
static void sched_look_ahead(sched *s, request *r) {
  if (r->points_fixed) return;
  if (r->wait_ticket) {
    if (checkpoint_ticket_depth(s->pc, r->wait_ticket) >= 0) return;
    r->wait_ticket = 0;
  }
  prefix_cache_match m;
  prefix_cache_peek(s->pc, r->salt, r->tokens, r->n_prompt, &m);
  sched_wait_for(s, r, &m);
}

/* Gives back what an admission attempt took (r stays waiting). */
static void sched_admit_undo(sched *s, request *r) {
  kv_pages_table_release(s->kp, &r->pages);
  if (r->slot >= 0) state_pool_slot_free(s->sp, r->slot);
  r->slot = -1;
  r->n_computed = 0;
  r->cached_tokens = 0;
}

/* Tries to admit waiting request r with at most `budget` tokens (see sched.h). On OK r is
 * running and scheduled for *n tokens. */
static int sched_admit(sched *s, sched_batch *b, request *r, int budget, int *n_out) {
  if (state_pool_num_slots_free(s->sp) == 0) return SCHED_ADMIT_BLOCK;
  int keep = s->running.n > 0 ? s->watermark : 0;
  prefix_cache_match m;
  memset(&m, 0, sizeof m);
  int np = 0;
  if (s->pc) {
    if (r->wait_ticket) {
      if (checkpoint_ticket_depth(s->pc, r->wait_ticket) >= 0) return SCHED_ADMIT_SKIP;
      r->wait_ticket = 0; /* committed or aborted: look again */
    }
    sched_lookup(s, r, &m);
    if (!r->points_fixed && sched_wait_for(s, r, &m)) return SCHED_ADMIT_SKIP;
    /* a disk checkpoint where reading it is slower than computing: computed, as a miss */
    if (m.ckpt && sched_disk_slower(s, &m)) {
      memset(&m, 0, sizeof m);
      s->disk_declined++;
    }
    /* a disk checkpoint's file is read by the disk tier's reader first: no step waits for it */
    if (m.ckpt && !prefix_cache_disk_ready(s->pc, m.ckpt)) return SCHED_ADMIT_SKIP;
    /* every capture point, restored or not, is a split point: a cold run of the same request
     * (or a failed restore) splits exactly like the restored one; interval points are not
     * (they are captured where pieces happen to end, sched_capture_interval) */
    np = prefix_cache_capture_points(r->n_prompt, r->bounds, r->n_bounds, s->interval, m.match_len,
                                     0, r->pts, r->cap_txn);
    int k = 0;
    for (int i = 0; i < np; i++)
      if (r->pts[i].flags != PREFIX_CACHE_POINT_INTERVAL) r->pts[k++] = r->pts[i];
    np = k;
    if (!r->points_fixed) request_set_points(r, r->pts, np, m.ckpt ? m.depth : 0);
  }
  int d = m.ckpt ? m.depth : 0;
  r->n_computed = d;
  int n = sched_piece(r, s->unit, budget);
  r->n_computed = 0;
  if (n == 0) return SCHED_ADMIT_BLOCK;
  int shared = m.ckpt && !m.on_host ? d / KV_PAGES_TOKENS : 0;
  if (!sched_pages_ok(s, kv_pages_for_tokens(d + n) - shared, keep)) return SCHED_ADMIT_BLOCK;

  if (state_pool_slot_alloc(s->sp, &r->slot) != 0) {
    r->slot = -1;
    sched_fail(s, b, r, "could not allocate a state slot");
    return SCHED_ADMIT_FAILED;
  }
  int restored = 0;
  if (m.ckpt) {
    checkpoint_plan plan;
    if (checkpoint_restore(s->pc, m.ckpt, r->n_tokens, &r->pages, r->slot, &plan) == 0) {
      restored = plan.depth;
    } else { /* the table is empty again, the slot undefined: take a fresh one, admit cold */
      state_pool_slot_free(s->sp, r->slot);
      if (state_pool_slot_alloc(s->sp, &r->slot) != 0) {
        r->slot = -1;
        sched_fail(s, b, r, "could not allocate a state slot");
        return SCHED_ADMIT_FAILED;
      }
    }
  }
  r->n_computed = restored;
  if (restored != d) {
    n = sched_piece(r, s->unit, budget);
    if (n == 0) {
      sched_admit_undo(s, r);
      return SCHED_ADMIT_BLOCK;
    }
  }
  if (!sched_pages_ok(s, kv_pages_table_need(&r->pages, restored + n), keep)) {
    sched_admit_undo(s, r);
    return SCHED_ADMIT_BLOCK;
  }
  if (kv_pages_table_grow(s->kp, &r->pages, restored + n) != 0) {
    sched_fail(s, b, r, "could not allocate KV-cache pages");
    return SCHED_ADMIT_FAILED;
  }
  r->cached_tokens = restored;
  if (s->pc) sched_reserve_tickets(s, r, np, restored);
  r->points_fixed = 1;
  sched_list_remove(&s->waiting, r);
  r->state = REQ_STATE_RUNNING;
  sched_list_insert_sorted(&s->running, r);
  sched_take(b, r, n);
  *n_out = n;
  return SCHED_ADMIT_OK;
}

/* After a step: captures the tickets r just reached (a failed capture is aborted; the
 * incumbent stays) and cancels any it went past. */
static void sched_capture_due(sched *s, request *r) {
  int k = 0;
  for (int i = 0; i < r->n_txn; i++) {
    checkpoint_txn t = r->txn[i];
    if (t.depth > r->n_computed) {
      r->txn[k++] = t;
      continue;
    }
    if (t.depth == r->n_computed && sched_capture(s, r, t.ticket) == 0) continue;
    checkpoint_txn_cancel(s->pc, &t);
  }
  r->n_txn = k;
}

/* A finished generation: a checkpoint at the depth computed (prompt + output but the last
 * token), so that the next turn of the conversation restores it. */
static void sched_capture_end(sched *s, request *r) {
  if (r->slot < 0 || r->n_computed < 1) return;
  uint64_t t;
  if (checkpoint_reserve(s->pc, r->salt, r->tokens, r->n_tokens, r->n_computed, CHECKPOINT_LOW,
                         &t) != 0)
    return;
  if (sched_capture(s, r, t) != 0) checkpoint_abort(s->pc, t);
}

/* Interval checkpoints: after a prefill piece that ended at a multiple of the split unit
 * (a split there changes no bit) and reached or crossed a multiple of the interval, a
 * checkpoint of the low class at the piece's end. `before` is n_computed before the step. */
static void sched_capture_interval(sched *s, request *r, int before) {
  int iv = s->interval > 0 ? s->interval : PREFIX_CACHE_DEFAULT_INTERVAL;
  int d = r->n_computed;
  if (r->slot < 0 || d >= r->n_prompt || d % s->unit != 0 || d / iv == before / iv) return;
  uint64_t t;
  if (checkpoint_reserve(s->pc, r->salt, r->tokens, r->n_tokens, d, CHECKPOINT_LOW, &t) != 0)
    return;
  if (sched_capture(s, r, t) != 0) checkpoint_abort(s->pc, t);
}

void sched_schedule(sched *s, sched_batch *b) {
  b->reqs = s->reqs;
  b->failed = s->failed;
  b->n = b->n_tokens = b->n_failed = b->n_preempted = 0;
  int budget = s->o.max_num_batched_tokens;
  for (request *r = s->running.head; r; r = r->next)
    r->sched_tokens = r->sched_sample = r->sched_draft = 0;

  /* 1 and 2: running requests, decode rows first, then prefill pieces; drafts take only the
   * budget the decode rows after them leave (a draft never displaces a plain row) */
  int n_dec = 0, lanes = 0;
  for (request *r = s->running.head; r; r = r->next) n_dec += r->n_computed >= r->n_prompt;
  for (int pass = 0; pass < 2; pass++) {
    request *next;
    for (request *r = s->running.head; r && budget > 0; r = next) {
      next = r->next;
      int decode = r->n_computed >= r->n_prompt;
      if (decode != (pass == 0) || r->sched_tokens) continue;
      int n = sched_piece(r, s->unit, budget);
      if (n == 0) continue;
      if (decode) n += sched_draft(s, r, lanes < s->spec_lanes ? budget - n_dec : 0);
      n_dec -= decode;
      int rc = sched_reserve(s, b, r, r->n_computed + n);
      next = r->next; /* preemption may have unlinked the old successor */
      if (rc < 0 || (rc == 0 && r->state != REQ_STATE_RUNNING)) {
        r->sched_draft = 0;
        if (rc == 0) break; /* r preempted itself: nothing younger is left to run */
        continue;
      }
      sched_take(b, r, n);
      r->sched_lane = r->sched_draft ? lanes++ : -1;
      budget -= n;
    }
  }

  /* 3: admission, FCFS (a request waiting for an in-flight capture lets others pass); once
   * admission stops, a look-ahead over the next max_num_seqs waiting requests */
  request *next;
  int admit = 1, ahead = 0;
  for (request *r = s->waiting.head; r; r = next) {
    next = r->next;
    if (admit && (b->n_preempted || budget <= 0 || s->running.n >= s->o.max_num_seqs ||
                  b->n_failed >= s->o.max_num_seqs))
      admit = 0;
    if (!admit) {
      if (!s->pc || ahead++ >= s->o.max_num_seqs) break;
      sched_look_ahead(s, r);
      continue;
    }
    int n = 0, rc = sched_admit(s, b, r, budget, &n);
    if (rc == SCHED_ADMIT_BLOCK) admit = 0;
    if (rc == SCHED_ADMIT_OK) budget -= n;
  }
}

void sched_postprocess(sched *s, sched_batch *b) {
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    int before = r->n_computed;
    r->n_computed += r->sched_tokens;
    if (r->sched_draft) sched_trim(s, r);
    r->sched_tokens = r->sched_sample = r->sched_draft = 0;
    if (s->pc) {
      sched_capture_due(s, r);
      if (before < r->n_prompt) sched_capture_interval(s, r, before);
      if (r->finish == FINISH_STOP || r->finish == FINISH_LENGTH) sched_capture_end(s, r);
    }
    if (r->finish != FINISH_NONE) sched_remove(s, r);
  }
}

int sched_extend(sched *s, request **reqs, int n) {
  for (int i = 0; i < n; i++) {
    request *r = reqs[i];
    int upto = r->n_computed + 2, need = kv_pages_table_need(&r->pages, upto);
    if (need > 0 && !sched_pages_ok(s, need, 0)) return -1;
    if (need > 0 && kv_pages_table_grow(s->kp, &r->pages, upto) != 0) return -1;
  }
  return 0;
}

void sched_again(sched *s, sched_batch *b, request **reqs, int n) {
  b->reqs = s->reqs;
  b->failed = s->failed;
  b->n = b->n_tokens = b->n_failed = b->n_preempted = 0;
  for (int i = 0; i < n; i++) {
    CHECK(reqs[i]->state == REQ_STATE_RUNNING && reqs[i]->n_computed + 1 == reqs[i]->n_tokens);
    sched_take(b, reqs[i], 1);
  }
}

void sched_fail_batch(sched *s, sched_batch *b, const char *why) {
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    sched_remove(s, r);
    r->finish = FINISH_ERROR;
    snprintf(r->err, sizeof r->err, "%s", why);
  }
}
