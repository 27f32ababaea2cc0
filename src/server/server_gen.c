#include "server/server_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/stop_match.h"

double server_gen_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int server_gen_start(server_gen *g, const server_gen_opts *o, engine_status *status, char *err,
                     size_t errlen) {
  memset(g, 0, sizeof *g);
  g->o = *o;
  strbuf_init(&g->text);
  if (o->tok) {
    g->ds = detok_stream_new(o->tok, o->skip_special);
    if (o->n_stop > 0) g->stops = stop_match_new(o->stop, o->n_stop);
    if (!g->ds || (o->n_stop > 0 && !g->stops)) {
      if (g->ds) detok_stream_free(g->ds);
      stop_match_free(g->stops);
      g->ds = NULL;
      g->stops = NULL;
      json_schema_free(o->schema);
      *status = ENGINE_ERR_INVALID;
      snprintf(err, errlen, "out of memory");
      return -1;
    }
  }
  engine_submit_opts so;
  memset(&so, 0, sizeof so);
  so.prompt = o->prompt;
  so.n_prompt = o->n_prompt;
  so.sp = *o->sp;
  so.cache_salt = o->cache_salt;
  so.boundaries = o->boundaries;
  so.n_boundaries = o->n_boundaries;
  so.json = o->json;
  so.schema = o->schema; /* engine_submit takes it */
  g->t_submit = server_gen_now();
  *status = ENGINE_OK;
  g->req = engine_submit(o->eng, &so, status, err, errlen);
  if (!g->req) {
    if (*status == ENGINE_OK) *status = ENGINE_ERR_INVALID;
    if (g->ds) detok_stream_free(g->ds);
    stop_match_free(g->stops);
    g->ds = NULL;
    g->stops = NULL;
    return -1;
  }
  g->prompt_tokens = o->n_prompt;
  return 0;
}

static int is_end_token(const server_gen *g, int32_t id) {
  for (int i = 0; i < g->o.n_eos; i++)
    if (g->o.eos_ids[i] == id) return 1;
  for (int i = 0; i < g->o.sp->n_stop_ids; i++)
    if (g->o.sp->stop_ids[i] == id) return 1;
  return 0;
}

static int push_id(server_gen *g, const engine_event *ev) {
  if (g->n_ids == g->cap_ids) {
    int cap = g->cap_ids ? g->cap_ids * 2 : 64;
    int32_t *ids = realloc(g->ids, sizeof *ids * (size_t)cap);
    if (!ids) return -1;
    g->ids = ids;
    if (g->o.sp->logprobs) {
      server_gen_token *t = realloc(g->toks, sizeof *t * (size_t)cap);
      if (!t) return -1;
      g->toks = t;
    }
    g->cap_ids = cap;
  }
  g->ids[g->n_ids] = ev->token;
  if (g->o.sp->logprobs) {
    server_gen_token *t = &g->toks[g->n_ids];
    t->id = ev->token;
    t->logprob = ev->logprob;
    t->n_top = ev->n_top < 0                         ? 0
               : ev->n_top > ENGINE_MAX_TOP_LOGPROBS ? ENGINE_MAX_TOP_LOGPROBS
                                                     : ev->n_top;
    if (t->n_top > g->o.sp->top_logprobs) t->n_top = g->o.sp->top_logprobs;
    memcpy(t->top_ids, ev->top_ids, sizeof t->top_ids[0] * (size_t)t->n_top);
    memcpy(t->top_lps, ev->top_logprobs, sizeof t->top_lps[0] * (size_t)t->n_top);
    t->text_off = g->text.len;
  }
  g->n_ids++;
  return 0;
}

/* Feeds the new text to the stop-string matcher; on a match cuts the text and cancels. */
static void check_stop_strings(server_gen *g) {
  if (!g->stops || g->stop_string_hit || g->text.len == g->scanned) return;
  size_t ml = 0;
  long p = stop_match_feed(g->stops, g->text.data + g->scanned, g->text.len - g->scanned,
                           g->scanned, &ml);
  g->scanned = g->text.len;
  if (p < 0) return;
  for (int i = 0; i < g->o.n_stop && !g->stop_hit; i++)
    if (strlen(g->o.stop[i]) == ml && !memcmp(g->text.data + p, g->o.stop[i], ml))
      g->stop_hit = g->o.stop[i];
  size_t cut = (size_t)p + (g->o.include_stop_str ? ml : 0);
  g->text.len = cut;
  g->text.data[cut] = 0;
  g->stop_string_hit = 1;
  g->draining = 1;
  g->finish = FINISH_STOP;
  engine_cancel(g->req);
}

/* vLLM's request phases: queued until the first step that fed it (the engine's stamp, same
 * clock), prefill until the first token, decode until the last */
static void finish_metrics(server_gen *g, double now, double t_sched) {
  if (!g->o.met) return;
  metrics_request r = {.finish = server_gen_finish_name(g),
                       .e2e = now - g->t_submit,
                       .queue = -1,
                       .prefill = -1,
                       .decode = -1,
                       .inference = -1,
                       .prompt_tokens = g->prompt_tokens,
                       .generation_tokens = g->completion_tokens,
                       .max_tokens = g->o.sp->max_tokens};
  if (t_sched > 0) {
    r.queue = t_sched - g->t_submit;
    double last = g->n_ids > 0 ? g->t_last : now;
    r.inference = last - t_sched;
    if (g->n_ids > 0) {
      r.prefill = g->t_first - t_sched;
      r.decode = g->t_last - g->t_first;
    }
  }
  metrics_request_done(g->o.met, &r);
}

static void append_text(server_gen *g, const char *s, long n) {
  if (n > 0) strbuf_append(&g->text, s, (size_t)n);
}

int server_gen_step(server_gen *g, int timeout_ms) {
  if (g->done) return 0;
  engine_event ev;
  if (!engine_next(g->req, &ev, timeout_ms)) return 0;
  double now = server_gen_now();
  g->n_events++;
  if (ev.has_token && !g->draining) {
    if (g->o.met) {
      if (g->n_ids == 0)
        metrics_observe(g->o.met, METRICS_TTFT, now - g->t_submit);
      else {
        metrics_observe(g->o.met, METRICS_ITL, now - g->t_last);
        metrics_observe(g->o.met, METRICS_TPOT, now - g->t_last);
      }
    }
    if (g->n_ids == 0) g->t_first = now;
    g->t_last = now;
    if (push_id(g, &ev)) goto oom;
    int hide = ev.finish == FINISH_STOP && !g->o.sp->ignore_eos && is_end_token(g, ev.token);
    if (g->ds && !hide) {
      char *piece = NULL;
      long n = detok_stream_push(g->ds, ev.token, &piece);
      append_text(g, piece, n);
      free(piece);
      if (n < 0) {
        /* an id the tokenizer cannot decode: shown as nothing */
      }
    }
    if (ev.finish != FINISH_NONE && g->ds) {
      char *rest = NULL;
      long n = detok_stream_flush(g->ds, &rest);
      append_text(g, rest, n);
      free(rest);
    }
    if (g->text.oom) goto oom;
    check_stop_strings(g);
  } else if (ev.finish != FINISH_NONE && g->ds && !g->draining) {
    char *rest = NULL;
    long n = detok_stream_flush(g->ds, &rest);
    append_text(g, rest, n);
    free(rest);
    check_stop_strings(g);
  }
  if (ev.finish != FINISH_NONE) {
    g->done = 1;
    if (!g->stop_string_hit) g->finish = ev.finish;
    if (ev.finish == FINISH_ERROR)
      snprintf(g->err, sizeof g->err, "%s", ev.err[0] ? ev.err : "internal error");
    if (ev.prompt_tokens > 0) g->prompt_tokens = ev.prompt_tokens;
    g->cached_tokens = ev.cached_tokens;
    g->spec_drafts = ev.spec_drafts;
    g->spec_draft_tokens = ev.spec_draft_tokens;
    g->spec_accepted = ev.spec_accepted_tokens;
    g->completion_tokens =
        g->stop_string_hit || ev.completion_tokens <= 0 ? g->n_ids : ev.completion_tokens;
    finish_metrics(g, now, ev.t_scheduled);
  }
  return 1;
oom:
  engine_cancel(g->req);
  g->draining = 1;
  g->stop_string_hit = 1; /* keep the error below over the cancelled finish */
  g->finish = FINISH_ERROR;
  snprintf(g->err, sizeof g->err, "out of memory");
  return -1;
}

size_t server_gen_visible(const server_gen *g) {
  if (g->done || g->stop_string_hit) return g->text.len;
  return g->text.len - (g->stops ? stop_match_holdback(g->stops) : 0);
}

const char *server_gen_finish_name(const server_gen *g) {
  switch (g->finish) {
    case FINISH_STOP:
      return "stop";
    case FINISH_LENGTH:
      return "length";
    case FINISH_CANCELLED:
      return "abort";
    case FINISH_ERROR:
      return "error";
    default:
      return "abort";
  }
}

void server_gen_cancel(server_gen *g) {
  if (g->req) engine_cancel(g->req);
}

void server_gen_free(server_gen *g) {
  if (g->req) {
    if (!g->done) {
      engine_cancel(g->req);
      if (g->o.met) metrics_request_finished(g->o.met, "abort");
    }
    engine_release(g->req);
  }
  if (g->ds) detok_stream_free(g->ds);
  stop_match_free(g->stops);
  strbuf_free(&g->text);
  free(g->ids);
  free(g->toks);
  memset(g, 0, sizeof *g);
}
