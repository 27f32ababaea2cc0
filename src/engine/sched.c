#include "engine/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/engine.h"

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
  request **reqs, **failed; /* [max_num_seqs] batch arrays */
};

/* ---- lists -------------------------------------------------------------------------------- */

static void sched_list_remove(sched_list *l, request *r) {
  if (r->prev) r->prev->next = r->next; else l->head = r->next;
  if (r->next) r->next->prev = r->prev; else l->tail = r->prev;
  r->prev = r->next = NULL;
  l->n--;
}

static void sched_list_insert_before(sched_list *l, request *at, request *r) {
  r->next = at;
  r->prev = at ? at->prev : l->tail;
  if (r->prev) r->prev->next = r; else l->head = r;
  if (at) at->prev = r; else l->tail = r;
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
    while (e < r->n_prompt) {
      int e2 = sched_segment_end(r, e, u);
      if (e2 - e < 2 || e2 - c > budget) break;
      e = e2;
    }
  }
  return e - c;
}

/* ---- actions ----------------------------------------------------------------------------- */

static void sched_release(sched *s, request *r) {
  kv_pages_table_release(s->kp, &r->pages);
  if (r->slot >= 0) state_pool_slot_free(s->sp, r->slot);
  r->slot = -1;
  r->n_computed = 0;
  r->sched_tokens = 0;
  r->sched_sample = 0;
}

void sched_add(sched *s, request *r) {
  r->state = REQ_STATE_WAITING;
  sched_list_insert_before(&s->waiting, NULL, r);
}

void sched_remove(sched *s, request *r) {
  if (r->state == REQ_STATE_WAITING) sched_list_remove(&s->waiting, r);
  else if (r->state == REQ_STATE_RUNNING) sched_list_remove(&s->running, r);
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
  r->sched_sample = r->n_computed + n == r->n_tokens;
  b->reqs[b->n++] = r;
  b->n_tokens += n;
}

void sched_schedule(sched *s, sched_batch *b) {
  b->reqs = s->reqs;
  b->failed = s->failed;
  b->n = b->n_tokens = b->n_failed = b->n_preempted = 0;
  int budget = s->o.max_num_batched_tokens;
  for (request *r = s->running.head; r; r = r->next) r->sched_tokens = r->sched_sample = 0;

  /* 1 and 2: running requests, decode rows first, then prefill pieces */
  for (int pass = 0; pass < 2; pass++) {
    request *next;
    for (request *r = s->running.head; r && budget > 0; r = next) {
      next = r->next;
      int decode = r->n_computed >= r->n_prompt;
      if (decode != (pass == 0) || r->sched_tokens) continue;
      int n = sched_piece(r, s->unit, budget);
      if (n == 0) continue;
      int rc = sched_reserve(s, b, r, r->n_computed + n);
      next = r->next; /* preemption may have unlinked the old successor */
      if (rc < 0 || (rc == 0 && r->state != REQ_STATE_RUNNING)) {
        if (rc == 0) break; /* r preempted itself: nothing younger is left to run */
        continue;
      }
      sched_take(b, r, n);
      budget -= n;
    }
  }

  /* 3: admission, FCFS */
  while (!b->n_preempted && s->waiting.head && budget > 0 &&
         s->running.n < s->o.max_num_seqs && b->n_failed < s->o.max_num_seqs) {
    request *r = s->waiting.head;
    int n = sched_piece(r, s->unit, budget);
    if (n == 0) break;
    int need = kv_pages_table_need(&r->pages, n);
    int keep = s->running.n > 0 ? s->watermark : 0;
    if (kv_pages_num_free(s->kp) - need < keep) break;
    if (state_pool_num_slots_free(s->sp) == 0) break;
    sched_list_remove(&s->waiting, r);
    r->state = REQ_STATE_RUNNING;
    sched_list_insert_sorted(&s->running, r);
    if (state_pool_slot_alloc(s->sp, &r->slot) != 0) {
      r->slot = -1;
      sched_fail(s, b, r, "could not allocate a state slot");
      continue;
    }
    if (kv_pages_table_grow(s->kp, &r->pages, n) != 0) {
      sched_fail(s, b, r, "could not allocate KV-cache pages");
      continue;
    }
    sched_take(b, r, n);
    budget -= n;
  }
}

void sched_postprocess(sched *s, sched_batch *b) {
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    r->n_computed += r->sched_tokens;
    r->sched_tokens = r->sched_sample = 0;
    if (r->finish != FINISH_NONE) sched_remove(s, r);
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
