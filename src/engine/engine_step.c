/* engine_step — one step of the engine thread: schedule, build the batch, run the forward,
 * pick the tokens, post them, postprocess.
 *
 * Three ways to pick a step's tokens, chosen per step:
 *   - greedy: every sampled row is plain greedy (no penalties, logprobs, logits callback or
 *     JSON mask) and the backend has argmax: the device picks the tokens and only the ids come
 *     back (qwen35_forward_greedy); the same tokens as sampling the downloaded rows.
 *   - the sample op: every sampled row is sampler_device_ok (no repetition_penalty, logprobs,
 *     JSON mask or callback; frequency / presence penalties, logit_bias and the min_tokens ban
 *     travel as the row's edits); the engine draws each row's random bits as its sampler would
 *     and the backend's sample op picks the tokens by sample_rule.h (qwen35_forward_sample):
 *     the host sampler's tokens, n ids downloaded. On device backends (engine_opts.device_sample).
 *   - host sampling: the rows are downloaded into page-locked memory (qwen35_host_alloc) and
 *     sampled by the sampler pool (sampler_pool.h) and the engine thread. The logits callbacks
 *     run on the engine thread first, in row order; the tokens are pushed in row order. A row
 *     under a JSON mask is masked by the thread that samples it, after the sampler threads
 *     prepared the mask (json_mask_prepare) while the forward ran; its recognizer is advanced
 *     by the engine thread when the token is pushed.
 * Decode steps of the first two kinds may go ahead (below). Nothing allocates inside a step:
 * the fwd_seq array, the logits rows and the job array are sized at creation. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "engine/engine_int.h"
#include "sampler/sample_rule.h"

/* min_tokens: while the request's output is shorter, its end tokens (what engine_step_is_stop
 * would end it on: stop_ids, and the model's eos unless ignore_eos) get no probability. Not
 * under a JSON mask, which may leave nothing but an end token (the server refuses the pair). */
#define ENGINE_MAX_BANS (SAMPLER_MAX_STOP_IDS + CONFIG_MAX_EOS)

/* The tokens min_tokens bans from request r's next row (out[], at most ENGINE_MAX_BANS; ids
 * outside the vocabulary are the caller's to skip). */
static int engine_step_ban_ids(const engine *e, const request *r, int has_jm, int32_t *out) {
  const sampling_params *sp = &r->smp.p;
  int n = 0;
  if (has_jm || request_n_output(r) >= sp->min_tokens) return 0;
  for (int i = 0; i < sp->n_stop_ids; i++) out[n++] = sp->stop_ids[i];
  if (!sp->ignore_eos)
    for (int i = 0; i < e->cfg->n_eos && i < CONFIG_MAX_EOS; i++)
      out[n++] = e->cfg->eos_token_ids[i];
  return n;
}

/* Sets request r's banned end tokens in its logits row lg to -inf (host sampling). */
static void engine_step_ban_ends(const engine *e, const request *r, int has_jm, float *lg) {
  int32_t ban[ENGINE_MAX_BANS];
  int n = engine_step_ban_ids(e, r, has_jm, ban);
  for (int i = 0; i < n; i++)
    if (ban[i] >= 0 && ban[i] < e->n_vocab) lg[ban[i]] = -INFINITY;
}

static int engine_step_is_stop(engine *e, const request *r, int32_t t) {
  const sampling_params *p = &r->smp.p;
  for (int i = 0; i < p->n_stop_ids; i++)
    if (p->stop_ids[i] == t) return 1;
  if (!p->ignore_eos)
    for (int i = 0; i < e->cfg->n_eos; i++)
      if (e->cfg->eos_token_ids[i] == t) return 1;
  return 0;
}

/* --log-steps: "step N (T tokens): r<id>[from,to)" per scheduled request; an
 * admission is marked "+" (cold) or "<-D" (restored D tokens), a sampling row "!", a verify
 * piece with K drafts "~K". */
const int engine_step_token_le[ENGINE_STEP_TOKEN_BUCKETS] = {1,   8,    16,   32,   64,   128,  256,
                                                             512, 1024, 2048, 4096, 8192, 16384};

static double engine_step_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One step of n_tokens over reqs[n] counted (dir 1) or taken back (dir -1) in the step-token
 * histogram; a request's first step stamps its t_sched (the end of its wait in the queue). */
static void engine_step_tally(engine *e, request **reqs, int n, int n_tokens, int dir) {
  int b = 0;
  while (b < ENGINE_STEP_TOKEN_BUCKETS && n_tokens > engine_step_token_le[b]) b++;
  e->step_tok_bucket[b] += dir;
  e->step_tok_sum += dir * n_tokens;
  double now = 0;
  for (int i = 0; i < n; i++) {
    engine_req *h = reqs[i]->owner;
    if (h->t_sched == 0) {
      if (now == 0) now = engine_step_now();
      h->t_sched = now;
    }
  }
}

static void engine_step_trace(engine *e, const sched_batch *b) {
  char line[1024];
  int n = snprintf(line, sizeof line, "step %lld (%d tokens):", e->steps, b->n_tokens);
  for (int i = 0; i < b->n && n < (int)sizeof line - 64; i++) {
    const request *r = b->reqs[i];
    int fresh = r->n_computed == r->cached_tokens && r->n_computed < r->n_prompt;
    n += snprintf(line + n, sizeof line - (size_t)n, " r%lld[%d,%d)", (long long)r->id,
                  r->n_computed, r->n_computed + r->sched_tokens);
    if (fresh && r->cached_tokens)
      n += snprintf(line + n, sizeof line - (size_t)n, "<-%d", r->cached_tokens);
    else if (fresh)
      n += snprintf(line + n, sizeof line - (size_t)n, "+");
    if (r->sched_sample) n += snprintf(line + n, sizeof line - (size_t)n, "!");
    if (r->sched_draft) n += snprintf(line + n, sizeof line - (size_t)n, "~%d", r->sched_draft);
  }
  log_info("engine: %s", line);
}

/* ---- steps ahead ------------------------------------------------------------------------
 * A plain-greedy decode step is issued with qwen35_greedy_start and read with
 * qwen35_greedy_finish, and so is a decode step whose rows the sample op picks with words that
 * do not depend on the tokens before them (engine_step_flight_sampled: no penalties, logit_bias
 * or min_tokens ban; each row's draw is taken when its step is issued, in the row's order of
 * steps, as the host would take it), issued with qwen35_sample_start. In between, the next step
 * of the same requests may be issued "chained" (its tokens taken on the device from the step's
 * ids), so that the host's work between two steps (reading, posting, scheduling, launching) is
 * off the device's critical path. A step goes ahead only when it is the step the scheduler
 * would make next anyway: every running request is a row of the step in flight, nobody waits,
 * no row can reach its length limit with the token in flight, no row is cancelled or ends after
 * the step in flight, the engine is not asked to stop or check, and every row gets the pages
 * for one position more. A row that the token in flight ends (a stop token) has then been fed
 * that token once more: its finish is sent with the token and takes effect after the step ahead
 * (finish_next), whose output for it is dropped, so its state and the end-of-generation
 * checkpoint cover the whole output. On by default on device backends that can chain
 * (engine_opts.steps_ahead). */

static int engine_step_ahead_ok(engine *e, const engine_flight *f) {
  if (!e->ahead || f->n != sched_num_running(e->s) || sched_num_waiting(e->s) != 0) return 0;
  pthread_mutex_lock(&e->mu);
  int busy = e->in_head || e->stop || e->check_pending;
  pthread_mutex_unlock(&e->mu);
  if (busy) return 0;
  for (int i = 0; i < f->n; i++) {
    request *r = f->reqs[i];
    engine_req *h = r->owner;
    if (r->finish_next || atomic_load(&h->cancel) ||
        request_n_output(r) + 1 >= r->smp.p.max_tokens || r->n_tokens + 1 >= e->max_model_len)
      return 0;
  }
  return 1;
}

/* 1 when the row's sample-op words never carry edits from now on (engine_step_device_words): the
 * sampler's edit-free parameters, past its min_tokens ban. */
static int engine_step_flight_sampled(const engine *e, const request *r) {
  engine_req *h = r->owner;
  return e->device_sample && !h->on_logits && !h->jm && sampler_device_edit_free(&r->smp.p) &&
         request_n_output(r) >= r->smp.p.min_tokens;
}

/* Issues the rows of reqs[0, n) as a greedy or sampled step into fl[e->n_fl] (chained: their
 * tokens are the ids of the step in flight, fl[0]). 0, or -1 with err. */
static int engine_step_flight_start(engine *e, request **reqs, int n, int chained, int sampled,
                                    char *err, size_t errlen) {
  engine_flight *f = &e->fl[e->n_fl];
  int slot = e->n_fl == 0 ? 0 : e->fl[0].reqs == e->fl_store[0];
  int buf = e->n_fl == 0 ? 0 : 1 - e->fl[0].buf;
  for (int i = 0; i < n; i++) {
    request *r = reqs[i];
    fwd_seq *q = &e->seqs[i];
    q->tokens = chained ? NULL : r->tokens + r->n_computed;
    q->n_tokens = 1;
    q->pos = r->n_computed + chained; /* the step in flight holds n_computed */
    q->pages = r->pages.ids;
    q->n_pages = r->pages.n;
    q->slot = r->slot;
    q->logits = QWEN35_LOGITS_LAST;
  }
  int ticket;
  if (sampled) { /* each row's draw now: its steps are issued in its order */
    for (int i = 0; i < n; i++) {
      memcpy(e->rng_save[i], reqs[i]->smp.rng, sizeof e->rng_save[i]);
      sampler_device_row(&reqs[i]->smp, 0, 0, e->words + (size_t)i * SAMPLE_RULE_WORDS);
    }
    if (qwen35_sample_start(e->m, e->seqs, n, chained, e->words, n * SAMPLE_RULE_WORDS,
                            e->ids_buf[buf], &ticket, err, errlen)) {
      for (int i = 0; i < n; i++) /* the step did not happen: nor did its draws */
        memcpy(reqs[i]->smp.rng, e->rng_save[i], sizeof e->rng_save[i]);
      return -1;
    }
    e->steps_device_sampled++;
  } else if (qwen35_greedy_start(e->m, e->seqs, n, chained, e->ids_buf[buf], &ticket, err,
                                 errlen)) {
    return -1;
  }
  if (reqs != e->fl_store[slot]) memcpy(e->fl_store[slot], reqs, (size_t)n * sizeof *reqs);
  f->reqs = e->fl_store[slot];
  f->n = n;
  f->sampled = sampled;
  f->ticket = ticket;
  f->buf = buf;
  for (int i = 0; i < n; i++) reqs[i]->in_flight = 1;
  e->n_fl++;
  e->steps++;
  engine_step_tally(e, reqs, n, n, 1);
  return 0;
}

/* Reads the oldest step in flight (issuing the next one ahead first when it may), posts its
 * tokens and postprocesses it. Returns its row count. */
static int engine_step_flight(engine *e) {
  engine_flight *f = &e->fl[0];
  char err[160];
  int ahead = 0;
  if (engine_step_ahead_ok(e, f) && sched_extend(e->s, f->reqs, f->n) == 0) {
    if (engine_step_flight_start(e, f->reqs, f->n, 1, f->sampled, err, sizeof err) == 0) {
      ahead = 1;
      e->steps_ahead++;
    } else {
      log_error("engine: a step ahead failed to start: %s", err);
    }
  }
  int n = f->n;
  if (qwen35_greedy_finish(e->m, f->ticket, err, sizeof err) != 0) {
    log_error("engine: forward step failed: %s", err);
    char why[160];
    snprintf(why, sizeof why, "forward step failed: %.130s", err);
    if (ahead) qwen35_greedy_finish(e->m, e->fl[1].ticket, err, sizeof err); /* same rows */
    sched_batch fb = {0};
    fb.reqs = f->reqs;
    fb.n = n;
    for (int i = 0; i < n; i++) f->reqs[i]->in_flight = 0;
    sched_fail_batch(e->s, &fb, why);
    for (int i = 0; i < n; i++) { /* a row with finish_next has sent its finish already */
      int fin = f->reqs[i]->finish_next;
      engine_end(e, f->reqs[i]->owner, fin ? fin : FINISH_ERROR, !fin);
    }
    e->n_fl = 0;
    return n;
  }
  const int32_t *ids = e->ids_buf[f->buf];
  int posted = 0;
  for (int i = 0; i < n; i++) {
    request *r = f->reqs[i];
    engine_req *h = r->owner;
    if (r->finish_next) { /* ended by the step before; this step fed its last token */
      r->finish = r->finish_next;
      r->finish_next = 0;
      continue;
    }
    sampler_result res;
    memset(&res, 0, sizeof res);
    int32_t t = res.token = ids[i];
    r->tokens[r->n_tokens++] = t;
    e->gen_total++;
    int fin = FINISH_NONE;
    if (engine_step_is_stop(e, r, t))
      fin = FINISH_STOP;
    else if (request_n_output(r) >= r->smp.p.max_tokens || r->n_tokens >= e->max_model_len)
      fin = FINISH_LENGTH;
    if (fin != FINISH_NONE && ahead)
      r->finish_next = fin;
    else
      r->finish = fin;
    posted += engine_push(h, &res, fin, e->nt);
  }
  if (posted) notifier_kick(e->nt);
  sched_batch pb = {0};
  pb.reqs = f->reqs;
  pb.n = n;
  sched_postprocess(e->s, &pb);
  for (int i = 0; i < n; i++) {
    request *r = f->reqs[i];
    if (!ahead) r->in_flight = 0;
    if (r->state == REQ_STATE_FINISHED) {
      r->in_flight = 0;
      engine_end(e, r->owner, r->finish, 0);
    }
  }
  if (ahead) {
    e->fl[0] = e->fl[1];
    sched_batch nb;
    sched_again(e->s, &nb, e->fl[0].reqs, e->fl[0].n);
    if (e->o.log_steps) engine_step_trace(e, &nb); /* the step ahead, logged once it is the step */
  }
  e->n_fl = ahead;
  return n;
}

/* Completes the steps in flight (none goes ahead while the engine is asked to check). */
void engine_step_drain(engine *e) {
  while (e->n_fl) engine_step_flight(e);
}

/* A forward step that failed (err): its requests end with an error. Returns its row count. */
static int engine_step_fail(engine *e, sched_batch *b, const char *err) {
  log_error("engine: forward step failed: %s", err);
  char why[160];
  snprintf(why, sizeof why, "forward step failed: %.130s", err);
  sched_fail_batch(e->s, b, why);
  for (int i = 0; i < b->n; i++) engine_end(e, b->reqs[i]->owner, FINISH_ERROR, 1);
  return b->n;
}

/* A device-sampled step's words (qwen35_forward_sample): every sampled row's parameters, then
 * their edits (frequency / presence penalties, logit_bias, the min_tokens ban). Returns the
 * number of words, or 0 when a row has more edits than SAMPLE_RULE_EDITS_MAX (then no RNG has
 * moved: the step samples on the host). */
static int engine_step_device_words(engine *e, const sched_batch *b, int n_rows) {
  int32_t ban[ENGINE_MAX_BANS];
  int n_ed = 0, row = 0;
  for (int i = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    if (!r->sched_sample) continue;
    int nb = engine_step_ban_ids(e, r, 0, ban);
    int k = sampler_device_edits(&r->smp.p, r->tokens + r->n_prompt, request_n_output(r), ban, nb,
                                 e->n_vocab, e->edits + n_ed, SAMPLE_RULE_EDITS_MAX, &e->scratch);
    if (k < 0) return 0;
    e->edit_n[row++] = k;
    n_ed += k;
  }
  int32_t *ew = e->words + (size_t)n_rows * SAMPLE_RULE_WORDS;
  for (int k = 0; k < n_ed; k++)
    sample_rule_edit_pack(&e->edits[k], ew + (size_t)k * SAMPLE_RULE_EDIT_WORDS);
  row = 0;
  for (int i = 0, off = 0; i < b->n; i++) {
    request *r = b->reqs[i];
    if (!r->sched_sample) continue;
    sampler_device_row(&r->smp, off, e->edit_n[row], e->words + (size_t)row * SAMPLE_RULE_WORDS);
    off += e->edit_n[row++];
  }
  return n_rows * SAMPLE_RULE_WORDS + n_ed * SAMPLE_RULE_EDIT_WORDS;
}

/* A following replay request (spec_replay.h) takes its recorded token wherever it has one, so it
 * follows the recorded run: on CUDA a verify row rounds unlike a plain row, and one flipped
 * near-tie would otherwise make every later draft miss. The rows are computed and sampled all
 * the same. */
static int32_t engine_step_replayed(const request *r, int32_t t) {
  int pos = request_n_output(r);
  return r->replay_follow && pos < r->n_replay ? r->replay[pos] : t;
}

/* ---- speculative decoding ----------------------------------------------------------------
 * A request at its sampling point may carry n-gram drafts d1..dk (sched.c, spec_ngram.c): its
 * piece is then a verify piece of 1 + k rows, fed [t, d1, .., dk] (t its last token) in the same
 * step as everyone else's rows, each row computed exactly as a one-token decode row (backend.h
 * "Verify pieces") with its logits read back. The rows are taken in order, each exactly as a
 * plain decode step would take its one row (logits callback, min_tokens ban, JSON mask, the
 * request's sampler with its penalties over the output so far, one RNG draw unless greedy):
 *
 *   row j:  token x_j = the request's sampler on row j's logits
 *           emit x_j;  x_j == d(j+1) (and no finish) ? go on to row j+1 : stop
 *
 * Greedy: the longest prefix of drafts equal to the target's argmax, plus the target's own next
 * token. Sampled: this is speculative sampling with a one-hot draft distribution q = [d]:
 * accepting d with probability p(d) and otherwise drawing from p without d, renormalised, is
 * drawing x ~ p and accepting when x == d — so every emitted token has exactly the plain
 * distribution, and since each emitted token takes one draw of the request's RNG as plain
 * decoding would, a seeded request gives the very same tokens with and without speculation.
 * A JSON mask (json_object, schema, tool calls) masks each row as it is taken: a draft the mask
 * forbids is never sampled, so it is rejected there.
 *
 * State: the rows kept are those whose input was accepted (row 0 always); when a draft was
 * rejected the recurrent state and conv window after the last kept row come from its keep
 * slot (one slot copy, nothing computed again); sched_postprocess then advances n_computed by
 * the kept rows only (so the prefix cache captures accepted positions only) and gives back
 * the pages past them. Returns 1 when a client wake-up was queued on the notifier. */
static int engine_step_verify(engine *e, request *r, float *lg0, const int32_t *ids0) {
  engine_req *h = r->owner;
  int D = r->sched_draft, kept = 0, acc = 0, posted = 0;
  for (int j = 0; j <= D; j++) {
    int32_t draft = j < D ? r->tokens[r->n_tokens] : -1; /* written past the tokens */
    sampler_result res;
    int32_t t;
    if (ids0) { /* plain greedy: the device's argmax is what sampler_sample gives */
      memset(&res, 0, sizeof res);
      t = res.token = ids0[j];
    } else {
      float *lg = lg0 + (size_t)j * e->n_vocab;
      if (h->on_logits) h->on_logits(h->user, lg, e->n_vocab);
      engine_step_ban_ends(e, r, h->jm != NULL, lg);
      if (h->jm) json_mask_apply(h->jm, lg, e->n_vocab);
      t = sampler_sample(&r->smp, lg, e->n_vocab, r->tokens, r->n_prompt, r->tokens + r->n_prompt,
                         request_n_output(r), &e->scratch, &res);
    }
    t = res.token = engine_step_replayed(r, t);
    r->tokens[r->n_tokens++] = t;
    if (h->jm) json_mask_advance(h->jm, t);
    e->gen_total++;
    kept++;
    if (engine_step_is_stop(e, r, t))
      r->finish = FINISH_STOP;
    else if (request_n_output(r) >= r->smp.p.max_tokens || r->n_tokens >= e->max_model_len)
      r->finish = FINISH_LENGTH;
    if (!r->smp.p.logprobs) res.n_top = 0;
    posted += engine_push(h, &res, r->finish, e->nt);
    if (t != draft) break;
    e->spec_accepted_pos[j]++;
    acc++;
    if (r->finish) break;
  }
  e->spec_drafts++;
  e->spec_draft_tokens += D;
  e->spec_accepted += acc;
  r->spec_drafts++;
  r->spec_draft_tokens += D;
  r->spec_accepted += acc;
  r->sched_tokens = kept; /* rows whose input stands */
  if (kept <= D &&
      qwen35_slot_copy(e->m, r->slot, qwen35_keep_slot(e->m, r->sched_lane, kept - 1))) {
    log_error("engine: request %lld: restoring the state of its accepted drafts failed",
              (long long)r->id);
    snprintf(r->err, sizeof r->err, "restoring the state after a verify step failed");
    if (!r->finish) posted += engine_push(h, NULL, FINISH_ERROR, e->nt);
    r->finish = FINISH_ERROR; /* never captured: its state is not the accepted one */
  }
  return posted;
}

/* MTP drafts (SPEC_METHOD_MTP, spec_mtp.h), after a step's tokens are taken and before
 * sched_postprocess: each unfinished request's rows that stand (its prefill piece, decode row,
 * or the kept rows of its verify piece: sched_tokens from its first position, e->seqs[i].pos)
 * are fed to the drafter with their hidden rows and each row's next token (all known now: the
 * last is the token just taken), and a request now at its decode point gets up to k drafts for
 * its next step (request.mtp_draft; sched_draft takes them). All requests draft together
 * (spec_mtp_steps: one MTP step per draft round). The drafter's page table is the request's,
 * then scratch pages of the request's row in the step: its own pages still cover every row the
 * step wrote, and draft rows past them land in scratch pages no other sequence uses. Rows at
 * prefix-cache hits are never fed (the target did not compute them): the drafter's attention
 * then reads stale rows there, which can only lower acceptance: every draft is verified. A
 * failure of the drafter leaves the step's requests without drafts. */
static void engine_step_mtp(engine *e, const sched_batch *b) {
  size_t H = (size_t)e->cfg->hidden_size;
  CHECK(b->n_tokens <= e->o.max_num_batched_tokens);
  int n = 0;
  request *who[b->n > 0 ? b->n : 1];
  for (int i = 0, off = 0; i < b->n; off += e->seqs[i++].n_tokens) {
    request *r = b->reqs[i];
    r->n_mtp_draft = 0;
    if (r->finish) continue;
    int pos = e->seqs[i].pos, nf = r->sched_tokens;
    int at = pos + nf + 1 == r->n_tokens; /* at the decode point after this step */
    int k = 0;
    if (at && e->spec_on) {
      k = e->o.spec.k;
      int left = r->smp.p.max_tokens - request_n_output(r) - 1;
      if (k > left) k = left;
      if (k > e->max_model_len - r->n_tokens) k = e->max_model_len - r->n_tokens;
      if (k < 0) k = 0;
    }
    int32_t *pt = e->mtp_pages + (size_t)i * e->mtp_pt;
    int np = r->pages.n, need = kv_pages_for_tokens(pos + nf + (k > 0 ? k - 1 : 0));
    memcpy(pt, r->pages.ids, (size_t)np * sizeof *pt);
    for (int s = 0; np < need; s++) {
      CHECK(s < e->mtp_scratch && np < e->mtp_pt);
      pt[np++] = e->mtp_scratch0 + i * e->mtp_scratch + s;
    }
    e->mtp_items[n] = (spec_mtp_item){
        pt, np, pos, nf, r->tokens + pos + 1, e->hidden + (size_t)off * H, k, r->mtp_draft};
    who[n++] = r;
  }
  char err[160];
  if (n > 0 && spec_mtp_steps(e->mtp, e->mtp_items, n, err, sizeof err)) {
    log_error("engine: MTP drafts of %d requests failed: %s", n, err);
    return;
  }
  for (int a = 0; a < n; a++) {
    who[a]->n_mtp_draft = e->mtp_items[a].k;
    who[a]->mtp_at = who[a]->n_tokens;
  }
}

/* Speculative decoding, each step: whether the next step drafts (sched and the MTP drafter
 * follow it). With disable_by_batch_size, vLLM's rule on the requests running; else
 * spec_policy's choice for the requests of this step still going, from what it has seen. */
static void engine_step_spec_next(engine *e, const sched_batch *b) {
  int n = 0;
  for (int i = 0; i < b->n; i++) n += !b->reqs[i]->finish;
  int lim = e->o.spec.disable_by_batch_size;
  int on = lim > 0 ? sched_num_running(e->s) <= lim : n < 1 || spec_policy_decide(&e->pol, n);
  if (on != e->spec_on) sched_set_spec_on(e->s, on);
  e->spec_on = on;
}

int engine_step_run(engine *e) {
  if (e->n_fl) return engine_step_flight(e);
  sched_batch b;
  sched_schedule(e->s, &b);
  for (int i = 0; i < b.n_failed; i++) engine_end(e, b.failed[i]->owner, FINISH_ERROR, 1);
  if (b.n == 0) return b.n_failed;

  int n_rows = 0, n_verify = 0, decode_only = 1;
  double t0 = engine_step_now();
  long long gen0 = e->gen_total, pre0 = e->prefilled_total;
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    fwd_seq *q = &e->seqs[i];
    q->tokens = r->tokens + r->n_computed;
    q->n_tokens = r->sched_tokens;
    q->pos = r->n_computed;
    q->pages = r->pages.ids;
    q->n_pages = r->pages.n;
    q->slot = r->slot;
    q->logits = r->sched_sample ? QWEN35_LOGITS_LAST : QWEN35_LOGITS_NONE;
    if (r->sched_draft) q->logits = QWEN35_LOGITS_VERIFY;
    q->keep = r->sched_lane;
    n_rows += r->sched_sample + r->sched_draft;
    n_verify += r->sched_draft > 0;
    decode_only &= r->sched_sample && q->n_tokens == 1 + r->sched_draft;
    if (r->n_computed < r->n_prompt) e->prefilled_total += r->sched_tokens;
  }
  e->steps++;
  engine_step_tally(e, b.reqs, b.n, b.n_tokens, 1);
  if (e->o.log_steps) engine_step_trace(e, &b);
  /* plain greedy everywhere: the device picks the tokens, a verify piece's rows' too (and the
   * MTP drafter reads every row's hidden state besides) */
  int greedy = e->device_greedy && n_rows > 0;
  for (int i = 0; i < b.n && greedy; i++) {
    request *r = b.reqs[i];
    engine_req *h = r->owner;
    if (r->sched_sample && (h->on_logits || h->jm || !sampler_is_plain_greedy(&r->smp.p)))
      greedy = 0;
  }
  if (e->ahead && n_rows > 0 && b.n_tokens == b.n) {
    /* every row a decode row, plain greedy or sampled by the op without edits */
    int all_decode = 1, sampled = !greedy;
    for (int i = 0; i < b.n && all_decode; i++) {
      request *r = b.reqs[i];
      all_decode = r->sched_tokens == 1 && r->sched_sample && r->n_computed >= r->n_prompt &&
                   (greedy || engine_step_flight_sampled(e, r));
    }
    if (all_decode) {
      e->steps--; /* counted by engine_step_flight_start */
      engine_step_tally(e, b.reqs, b.n, b.n_tokens, -1);
      char ferr[160];
      if (engine_step_flight_start(e, b.reqs, b.n, 0, sampled, ferr, sizeof ferr) != 0)
        return engine_step_fail(e, &b, ferr);
      return engine_step_flight(e);
    }
  }
  /* the backend's sample op when it picks every sampled row exactly as the host would */
  int dev_sample = !greedy && e->device_sample && n_rows > 0 && !n_verify && !e->mtp;
  for (int i = 0; i < b.n && dev_sample; i++) {
    request *r = b.reqs[i];
    engine_req *h = r->owner;
    if (r->sched_sample && (h->on_logits || h->jm || !sampler_device_ok(&r->smp.p))) dev_sample = 0;
  }
  int n_words = 0;
  if (dev_sample) /* the rows' edits (no RNG touched yet: a row with too many sends the step to
                     the host), then the draws in row order, as sampler_sample would */
    n_words = engine_step_device_words(e, &b, n_rows);
  dev_sample = n_words > 0;
  e->steps_device_sampled += dev_sample;
  /* the rows' JSON masks are prepared by the sampler threads while the forward runs */
  int n_masks = 0;
  for (int i = 0; i < b.n && !greedy; i++) {
    request *r = b.reqs[i];
    engine_req *h = r->owner;
    if (r->sched_sample && h->jm) e->masks[n_masks++] = h->jm;
  }
  sampler_pool_prep_start(e->pool, e->masks, n_masks);
  char err[160];
  int frc =
      greedy && e->mtp
          ? qwen35_forward_greedy_hidden(e->m, e->seqs, b.n, e->ids, e->hidden, err, sizeof err)
      : greedy ? qwen35_forward_greedy(e->m, e->seqs, b.n, e->ids, err, sizeof err)
      : dev_sample
          ? qwen35_forward_sample(e->m, e->seqs, b.n, e->words, n_words, e->ids, err, sizeof err)
      : e->mtp ? qwen35_forward_hidden(e->m, e->seqs, b.n, e->logits, e->hidden, err, sizeof err)
               : qwen35_forward(e->m, e->seqs, b.n, e->logits, err, sizeof err);
  sampler_pool_prep_finish(e->pool);
  if (frc != 0) return engine_step_fail(e, &b, err);

  int row = 0, n_jobs = 0;
  sampler_pool_job *jobs = sampler_pool_jobs(e->pool);
  if (!greedy && !dev_sample) { /* logits callbacks in row order, then every row sampled */
    for (int i = 0; i < b.n; i++) {
      request *r = b.reqs[i];
      if (!r->sched_sample) continue;
      if (r->sched_draft) { /* verified row by row below */
        row += 1 + r->sched_draft;
        continue;
      }
      engine_req *h = r->owner;
      sampler_pool_job *jb = &jobs[n_jobs++];
      jb->smp = &r->smp;
      jb->prompt = r->tokens;
      jb->n_prompt = r->n_prompt;
      jb->output = r->tokens + r->n_prompt;
      jb->n_output = request_n_output(r);
      jb->jm = h->jm;
      jb->lg = e->logits + (size_t)row++ * e->n_vocab;
      if (h->on_logits) h->on_logits(h->user, jb->lg, e->n_vocab);
      engine_step_ban_ends(e, r, h->jm != NULL, jb->lg);
    }
    sampler_pool_sample(e->pool, n_jobs, &e->scratch);
  }
  row = 0;
  int posted = 0, job = 0;
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    if (!r->sched_sample) continue;
    engine_req *h = r->owner;
    if (r->sched_draft) {
      posted += engine_step_verify(e, r, e->logits + (size_t)row * e->n_vocab,
                                   greedy ? e->ids + row : NULL);
      row += 1 + r->sched_draft;
      continue;
    }
    sampler_result res;
    int32_t t;
    if (greedy || dev_sample) { /* what sampler_sample gives: the token, nothing else */
      memset(&res, 0, sizeof res);
      t = res.token = e->ids[row++];
    } else {
      sampler_pool_job *jb = &jobs[job++];
      CHECK(jb->smp == &r->smp);
      row++;
      res = jb->res;
      t = jb->t;
    }
    t = res.token = engine_step_replayed(r, t);
    r->tokens[r->n_tokens++] = t;
    if (h->jm) json_mask_advance(h->jm, t);
    e->gen_total++;
    if (engine_step_is_stop(e, r, t))
      r->finish = FINISH_STOP;
    else if (request_n_output(r) >= r->smp.p.max_tokens || r->n_tokens >= e->max_model_len)
      r->finish = FINISH_LENGTH;
    if (!r->smp.p.logprobs) res.n_top = 0;
    posted += engine_push(h, &res, r->finish, e->nt);
  }
  if (posted) notifier_kick(e->nt);
  if (e->o.spec.method != SPEC_METHOD_NONE) engine_step_spec_next(e, &b);
  if (e->mtp) engine_step_mtp(e, &b);
  /* a step of decode rows alone, drafts and drafting included: what spec_policy compares */
  if (e->o.spec.method != SPEC_METHOD_NONE && decode_only)
    spec_policy_observe(&e->pol, b.n, n_verify > 0, (int)(e->gen_total - gen0),
                        engine_step_now() - t0);
  /* the prefill rate the scheduler weighs a disk restore against (steps of >= 256 prompt
   * tokens, where the prefill is most of the step's time) */
  long long pre = e->prefilled_total - pre0;
  if (pre >= 256) {
    double r = (double)pre / (engine_step_now() - t0);
    e->prefill_tps = e->prefill_tps > 0 ? e->prefill_tps + 0.3 * (r - e->prefill_tps) : r;
    sched_set_prefill_rate(e->s, e->prefill_tps);
  }
  sched_postprocess(e->s, &b);
  for (int i = 0; i < b.n; i++) {
    request *r = b.reqs[i];
    if (r->state == REQ_STATE_FINISHED) engine_end(e, r->owner, r->finish, 0);
  }
  return b.n;
}
