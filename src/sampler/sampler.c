/* sampler — one row of logits to one token, per request. See sampler.h for the order of
 * operations; everything here runs over the caller's preallocated scratch and touches nothing
 * shared, so the engine's sampler threads run it on different rows at once. */
#include "sampler/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "sampler/sample_rule.h"

void sampling_params_default(sampling_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->top_k = 0;
  p->min_p = 0.0f;
  p->repetition_penalty = 1.0f;
  p->max_tokens = 16;
}

int sampling_params_validate(const sampling_params *p, char *err, size_t errlen) {
  if (!isfinite(p->temperature) || p->temperature < 0)
    return errf(err, errlen, "temperature must be a number >= 0");
  if (!isfinite(p->top_p) || p->top_p <= 0 || p->top_p > 1)
    return errf(err, errlen, "top_p must be in (0, 1]");
  if (!isfinite(p->min_p) || p->min_p < 0 || p->min_p > 1)
    return errf(err, errlen, "min_p must be in [0, 1]");
  if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0)
    return errf(err, errlen, "repetition_penalty must be > 0");
  if (!isfinite(p->presence_penalty) || p->presence_penalty < -2 || p->presence_penalty > 2)
    return errf(err, errlen, "presence_penalty must be in [-2, 2]");
  if (!isfinite(p->frequency_penalty) || p->frequency_penalty < -2 || p->frequency_penalty > 2)
    return errf(err, errlen, "frequency_penalty must be in [-2, 2]");
  if (p->max_tokens < 1) return errf(err, errlen, "max_tokens must be >= 1");
  if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
    return errf(err, errlen, "min_tokens must be in [0, max_tokens = %d]", p->max_tokens);
  if (p->n_stop_ids < 0 || p->n_stop_ids > SAMPLER_MAX_STOP_IDS)
    return errf(err, errlen, "at most %d stop token ids", SAMPLER_MAX_STOP_IDS);
  if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
    return errf(err, errlen, "top_logprobs must be in [0, %d]", SAMPLER_MAX_TOP_LOGPROBS);
  if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS)
    return errf(err, errlen, "at most %d logit_bias entries", SAMPLER_MAX_BIAS);
  for (int i = 0; i < p->n_bias; i++) {
    if (p->bias_ids[i] < 0) return errf(err, errlen, "logit_bias token ids must be >= 0");
    if (!isfinite(p->bias[i]) || p->bias[i] < -100 || p->bias[i] > 100)
      return errf(err, errlen, "logit_bias values must be in [-100, 100]");
  }
  return 0;
}

/* ---- RNG: splitmix64 seeding, xoshiro256** ------------------------------------------- */

static uint64_t sampler_splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t sampler_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t sampler_next(sampler *s) {
  uint64_t *r = s->rng;
  uint64_t out = sampler_rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
  r[2] ^= r[0];
  r[3] ^= r[1];
  r[1] ^= r[2];
  r[0] ^= r[3];
  r[2] ^= t;
  r[3] = sampler_rotl(r[3], 45);
  return out;
}

void sampler_init(sampler *s, const sampling_params *p, uint64_t fallback_seed) {
  s->p = *p;
  uint64_t x = p->has_seed ? p->seed : fallback_seed;
  for (int i = 0; i < 4; i++) s->rng[i] = sampler_splitmix(&x);
}

int sampler_scratch_init(sampler_scratch *w, int n_vocab) {
  memset(w, 0, sizeof *w);
  size_t n = n_vocab > 0 ? (size_t)n_vocab : 1;
  w->probs = malloc(n * sizeof *w->probs);
  w->idx = malloc(n * sizeof *w->idx);
  w->idx2 = malloc(n * sizeof *w->idx2);
  w->key = malloc(n * sizeof *w->key);
  w->key2 = malloc(n * sizeof *w->key2);
  w->hist = malloc(SAMPLER_HIST * sizeof *w->hist);
  w->counts = calloc(n, sizeof *w->counts);
  w->mark = calloc(n, 1);
  w->slot = malloc(n * sizeof *w->slot);
  if (w->slot)
    for (size_t i = 0; i < n; i++) w->slot[i] = -1;
  if (!w->probs || !w->idx || !w->idx2 || !w->key || !w->key2 || !w->hist || !w->counts ||
      !w->mark || !w->slot) {
    sampler_scratch_free(w);
    return -1;
  }
  w->n_vocab = n_vocab;
  return 0;
}

void sampler_scratch_free(sampler_scratch *w) {
  free(w->probs);
  free(w->idx);
  free(w->idx2);
  free(w->key);
  free(w->key2);
  free(w->hist);
  free(w->counts);
  free(w->mark);
  free(w->slot);
  memset(w, 0, sizeof *w);
}

/* ---- penalties -------------------------------------------------------------------------- */

static void sampler_rep_one(float *logits, int32_t t, float rp, sampler_scratch *w) {
  if (w->mark[t]) return;
  w->mark[t] = 1;
  logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp;
}

void sampler_apply_penalties(const sampling_params *p, float *logits, int n_vocab,
                             const int32_t *prompt, int n_prompt, const int32_t *output,
                             int n_output, sampler_scratch *w) {
  CHECK(w->n_vocab >= n_vocab);
  if (p->repetition_penalty != 1.0f) {
    float rp = p->repetition_penalty;
    for (int i = 0; i < n_prompt; i++)
      if (prompt[i] >= 0 && prompt[i] < n_vocab) sampler_rep_one(logits, prompt[i], rp, w);
    for (int i = 0; i < n_output; i++)
      if (output[i] >= 0 && output[i] < n_vocab) sampler_rep_one(logits, output[i], rp, w);
    for (int i = 0; i < n_prompt; i++)
      if (prompt[i] >= 0 && prompt[i] < n_vocab) w->mark[prompt[i]] = 0;
    for (int i = 0; i < n_output; i++)
      if (output[i] >= 0 && output[i] < n_vocab) w->mark[output[i]] = 0;
  }
  if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
    for (int i = 0; i < n_output; i++)
      if (output[i] >= 0 && output[i] < n_vocab) w->counts[output[i]]++;
    for (int i = 0; i < n_output; i++) {
      int32_t t = output[i];
      if (t < 0 || t >= n_vocab || w->counts[t] == 0) continue;
      logits[t] = sample_rule_sub(
          logits[t], sample_rule_penalty(p->frequency_penalty, p->presence_penalty, w->counts[t]));
      w->counts[t] = 0; /* applied once per distinct token; also restores the scratch */
    }
  }
  for (int i = 0; i < p->n_bias; i++)
    if (p->bias_ids[i] >= 0 && p->bias_ids[i] < n_vocab)
      logits[p->bias_ids[i]] = sample_rule_add(logits[p->bias_ids[i]], p->bias[i]);
}

/* ---- sampling --------------------------------------------------------------------------- */

/* The candidates' order for top-k / top-p: probability descending, ties to the lowest id —
 * one total order, so any correct sort gives the same sequence. The probabilities are finite
 * and > 0, so their bits compare as unsigned integers in the same order as the floats; an
 * LSD radix sort on the complemented bits (11 + 11 + 10 bits, stable) of ids given in
 * ascending order yields exactly that order in O(n). */
static uint32_t sampler_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Sorts w->idx[0..n) (ascending ids on entry) into the candidates' order. */
static void sampler_sort_desc(sampler_scratch *w, int n) {
  uint32_t *k0 = w->key, *k1 = w->key2, *h = w->hist;
  int32_t *i0 = w->idx, *i1 = w->idx2;
  memset(h, 0, 3 * 2048 * sizeof *h);
  for (int i = 0; i < n; i++) {
    uint32_t k = ~sampler_bits(w->probs[i0[i]]);
    k0[i] = k;
    h[k & 2047]++;
    h[2048 + ((k >> 11) & 2047)]++;
    h[4096 + (k >> 22)]++;
  }
  for (int pass = 0; pass < 3; pass++) {
    int shift = 11 * pass;
    uint32_t mask = pass == 2 ? 1023 : 2047, *hp = h + 2048 * pass;
    if (hp[(k0[0] >> shift) & mask] == (uint32_t)n) continue; /* one digit: order kept */
    uint32_t sum = 0;
    for (uint32_t d = 0; d <= mask; d++) {
      uint32_t c = hp[d];
      hp[d] = sum;
      sum += c;
    }
    for (int i = 0; i < n; i++) {
      uint32_t pos = hp[(k0[i] >> shift) & mask]++;
      k1[pos] = k0[i];
      i1[pos] = i0[i];
    }
    uint32_t *tk = k0;
    k0 = k1;
    k1 = tk;
    int32_t *ti = i0;
    i0 = i1;
    i1 = ti;
  }
  if (i0 != w->idx) memcpy(w->idx, i0, (size_t)n * sizeof *i0);
}

/* Puts the first k of the candidates' order in w->idx[0..k) (0 < k < n; w->idx[0..n)
 * ascending ids on entry): a histogram of the top 16 bits finds the bucket that holds the
 * k-th; only the candidates at or above it (at least k, usually few more) are sorted. */
static void sampler_select_desc(sampler_scratch *w, int n, int k) {
  uint32_t *h = w->hist;
  memset(h, 0, SAMPLER_HIST * sizeof *h);
  for (int i = 0; i < n; i++) h[sampler_bits(w->probs[w->idx[i]]) >> 16]++;
  uint32_t cut = SAMPLER_HIST - 1, cum = 0;
  for (;; cut--) {
    cum += h[cut];
    if (cum >= (uint32_t)k || cut == 0) break;
  }
  int m = 0;
  for (int i = 0; i < n; i++)
    if ((sampler_bits(w->probs[w->idx[i]]) >> 16) >= cut) w->idx[m++] = w->idx[i];
  sampler_sort_desc(w, m);
}

static void sampler_logprobs(const sampling_params *p, const float *logits, int n_vocab,
                             sampler_result *res) {
  float m = -INFINITY;
  for (int i = 0; i < n_vocab; i++)
    if (logits[i] > m) m = logits[i];
  double sum = 0;
  for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - m);
  double lse = m + log(sum);
  res->logprob = (float)((double)logits[res->token] - lse);
  int k = p->top_logprobs;
  if (k > n_vocab) k = n_vocab;
  res->n_top = 0;
  for (int i = 0; i < n_vocab; i++) { /* insertion into a sorted list of at most k */
    float v = logits[i];
    int n = res->n_top;
    if (n == k && (k == 0 || v <= logits[res->top_ids[n - 1]])) continue;
    int j = n < k ? n : k - 1;
    while (j > 0 && logits[res->top_ids[j - 1]] < v) {
      res->top_ids[j] = res->top_ids[j - 1];
      j--;
    }
    res->top_ids[j] = i;
    if (n < k) res->n_top++;
  }
  for (int i = 0; i < res->n_top; i++)
    res->top_logprobs[i] = (float)((double)logits[res->top_ids[i]] - lse);
}

int32_t sampler_argmax(const float *x, int n) {
  /* m is always x[tok], held in a register: the comparison is the scan's, and no load of
   * x[tok] depends on the previous iteration, so the loop carries no chain through memory */
  int32_t tok = 0;
  if (n <= 0) return 0;
  float m = x[0];
  for (int i = 1; i < n; i++)
    if (x[i] > m) {
      m = x[i];
      tok = i;
    }
  return tok;
}

int sampler_is_plain_greedy(const sampling_params *p) {
  return p->temperature < 1e-5f && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
         p->frequency_penalty == 0.0f && !p->logprobs && p->n_bias == 0 && p->min_tokens == 0;
}

int sampler_device_ok(const sampling_params *p) {
  return p->repetition_penalty == 1.0f && !p->logprobs;
}

int sampler_device_edit_free(const sampling_params *p) {
  return sampler_device_ok(p) && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f &&
         p->n_bias == 0;
}

/* The edit of token t (a new one when it has none yet); NULL when cap are in use. */
static sample_rule_edit *sampler_edit_of(sample_rule_edit *ed, int *n, int cap, int32_t t,
                                         sampler_scratch *w) {
  if (w->slot[t] >= 0) return &ed[w->slot[t]];
  if (*n >= cap) return NULL;
  w->slot[t] = *n;
  ed[*n] = (sample_rule_edit){t, 0, 0.0f, 0.0f};
  return &ed[(*n)++];
}

int sampler_device_edits(const sampling_params *p, const int32_t *output, int n_output,
                         const int32_t *ban, int n_ban, int n_vocab, sample_rule_edit *ed, int cap,
                         sampler_scratch *w) {
  CHECK(w->n_vocab >= n_vocab);
  int n = 0, full = 0;
  if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
    for (int i = 0; i < n_output; i++)
      if (output[i] >= 0 && output[i] < n_vocab) w->counts[output[i]]++;
    for (int i = 0; i < n_output; i++) {
      int32_t t = output[i];
      if (t < 0 || t >= n_vocab || w->counts[t] == 0) continue;
      sample_rule_edit *e = full ? NULL : sampler_edit_of(ed, &n, cap, t, w);
      if (e) {
        e->flags |= SAMPLE_RULE_EDIT_PEN;
        e->sub = sample_rule_penalty(p->frequency_penalty, p->presence_penalty, w->counts[t]);
      }
      full |= !e;
      w->counts[t] = 0;
    }
  }
  for (int i = 0; i < p->n_bias && !full; i++) {
    int32_t t = p->bias_ids[i];
    if (t < 0 || t >= n_vocab) continue;
    sample_rule_edit *e = sampler_edit_of(ed, &n, cap, t, w);
    if (e) {
      e->flags |= SAMPLE_RULE_EDIT_BIAS;
      e->add = p->bias[i];
    }
    full |= !e;
  }
  for (int i = 0; i < n_ban && !full; i++) {
    int32_t t = ban[i];
    if (t < 0 || t >= n_vocab) continue;
    sample_rule_edit *e = sampler_edit_of(ed, &n, cap, t, w);
    if (e) e->flags |= SAMPLE_RULE_EDIT_BAN;
    full |= !e;
  }
  for (int i = 0; i < n; i++) w->slot[ed[i].id] = -1;
  return full ? -1 : n;
}

void sampler_device_row(sampler *s, int edit_off, int n_edits, int32_t words[SAMPLE_RULE_WORDS]) {
  const sampling_params *p = &s->p;
  sample_rule_row r;
  r.temperature = p->temperature;
  r.top_k = p->top_k;
  r.top_p = p->top_p;
  r.min_p = p->min_p;
  r.u53 = p->temperature < SAMPLE_RULE_GREEDY_T ? 0 : sampler_next(s) >> 11;
  r.edit_off = edit_off;
  r.n_edits = n_edits;
  sample_rule_pack(&r, words);
}

static int sampler_cmp_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* sample_rule.h's steps 2-6 over logits (temperature >= SAMPLE_RULE_GREEDY_T). */
static int32_t sampler_pick(const sampling_params *p, const float *logits, int n_vocab,
                            uint64_t u53, sampler_scratch *w) {
  float inv_t = 1.0f / p->temperature;
  float m = -INFINITY;
  for (int i = 0; i < n_vocab; i++)
    if (logits[i] > m) m = logits[i];
  int n = 0;
  for (int i = 0; i < n_vocab; i++) {
    float q = sample_rule_prob(logits[i], m, inv_t);
    w->probs[i] = q;
    if (sample_rule_mass(q, p->min_p) > 0) w->idx[n++] = i;
  }
  if (n == 0) return sampler_argmax(logits, n_vocab);
  int sorted = 0;
  if (p->top_k > 0 && p->top_k < n) {
    sampler_select_desc(w, n, p->top_k);
    sorted = 1;
    n = p->top_k;
  }
  if (p->top_p < 1.0f) {
    if (!sorted) sampler_sort_desc(w, n);
    sorted = 1;
    uint64_t total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += sample_rule_mass(w->probs[w->idx[i]], p->min_p);
    uint64_t target = sample_rule_top_p_target(p->top_p, total);
    int keep = 0;
    while (keep < n) {
      cum += sample_rule_mass(w->probs[w->idx[keep++]], p->min_p);
      if (cum >= target) break;
    }
    n = keep;
  }
  /* the draw, in ascending id order over what is kept */
  uint64_t total = 0, cum = 0;
  for (int i = 0; i < n; i++) total += sample_rule_mass(w->probs[w->idx[i]], p->min_p);
  uint64_t r = sample_rule_draw_target(u53, total);
  if (sorted && n <= 1024) {
    qsort(w->idx, (size_t)n, sizeof *w->idx, sampler_cmp_id);
    sorted = 0;
  }
  int32_t tok = -1;
  if (!sorted) {
    for (int i = 0; i < n && tok < 0; i++) {
      cum += sample_rule_mass(w->probs[w->idx[i]], p->min_p);
      if (cum > r) tok = w->idx[i];
    }
  } else { /* many kept: marked, then the vocabulary in order */
    for (int i = 0; i < n; i++) w->mark[w->idx[i]] = 1;
    for (int i = 0; i < n_vocab && tok < 0; i++)
      if (w->mark[i]) {
        cum += sample_rule_mass(w->probs[i], p->min_p);
        if (cum > r) tok = i;
      }
    for (int i = 0; i < n; i++) w->mark[w->idx[i]] = 0;
  }
  CHECK(tok >= 0);
  return tok;
}

int32_t sampler_sample(sampler *s, float *logits, int n_vocab, const int32_t *prompt, int n_prompt,
                       const int32_t *output, int n_output, sampler_scratch *w,
                       sampler_result *res) {
  const sampling_params *p = &s->p;
  memset(res, 0, sizeof *res);
  sampler_apply_penalties(p, logits, n_vocab, prompt, n_prompt, output, n_output, w);
  int32_t tok;
  if (p->temperature < SAMPLE_RULE_GREEDY_T)
    tok = sampler_argmax(logits, n_vocab);
  else /* logprobs are of the pre-temperature logits, which the pick does not touch */
    tok = sampler_pick(p, logits, n_vocab, sampler_next(s) >> 11, w);
  res->token = tok;
  if (p->logprobs) sampler_logprobs(p, logits, n_vocab, res);
  return tok;
}
