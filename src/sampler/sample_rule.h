/* sample_rule — the arithmetic of one sampled token, shared by every implementation of it (the
 * host sampler, the CPU backend's sample op, the CUDA kernel), so that the same logits, the same
 * parameters and the same random draw give the same token on every path: a request sampled on
 * the device and the same request sampled on the host (batched with a row the device cannot
 * sample) get the same tokens for a seed.
 *
 * The rule for a row x[V] with temperature T, top_k, top_p, min_p and 53 random bits u53,
 * after the row's edits (sample_rule_edit_apply: penalties, logit_bias, a ban):
 *   1. T < 1e-5: the greedy argmax rule (sampler_argmax: the first maximum, NaN never wins).
 *   2. m = the largest x that is not NaN (-inf when none); inv_t = 1 / T.
 *   3. q_i = sample_rule_expf((x_i - m) inv_t), every operation rounded once (no contraction);
 *      mass w_i = trunc(q_i 2^40) when q_i >= min_p, else 0. The candidates are the w_i > 0
 *      (q_i >= 2^-40: what a token 28 e-folds under the top can no longer reach).
 *   4. No candidates (m is +inf, or no x is finite): the argmax rule.
 *   5. The candidates' order: q descending, then id ascending. top_k (0 < k < n): the first k.
 *      top_p < 1: of those, the shortest prefix whose mass reaches sample_rule_top_p_target.
 *   6. W = the kept masses' sum (exact, uint64); r = sample_rule_draw_target(u53, W); the token
 *      is the first kept candidate in ascending id order whose running mass sum exceeds r.
 * All sums are of integers, so any order of summing gives the same bits; the few floating
 * operations are correctly rounded single operations (or fmaf), the same on the CPU and the GPU.
 * Header only; the functions compile for the host and, under nvcc, for the device. */
#ifndef DS_SAMPLE_RULE_H
#define DS_SAMPLE_RULE_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SAMPLE_RULE_FN static inline __host__ __device__
#else
#define SAMPLE_RULE_FN static inline
#ifdef __clang__ /* gcc does not contract in ISO C modes (-std=c11) and has no such pragma */
#pragma STDC FP_CONTRACT OFF
#endif
#endif

#define SAMPLE_RULE_GREEDY_T 1e-5f              /* temperatures below: the argmax rule */
#define SAMPLE_RULE_MASS_SCALE 1099511627776.0f /* 2^40 */
/* A device sample op's parameters: SAMPLE_RULE_WORDS int32 per row (sample_rule_pack), then the
 * rows' edits, SAMPLE_RULE_EDIT_WORDS each (sample_rule_edit_pack), row i's n_edits of them from
 * edit edit_off on. */
#define SAMPLE_RULE_WORDS 8
#define SAMPLE_RULE_EDIT_WORDS 4
#define SAMPLE_RULE_EDITS_MAX 4096 /* edits a row may have (more: the row samples on the host) */
/* An edit of one logit before the rule (the host sampler's penalties and logit_bias, the
 * engine's min_tokens ban, in that order): x - sub, then x + add, then -inf. */
#define SAMPLE_RULE_EDIT_PEN 1u
#define SAMPLE_RULE_EDIT_BIAS 2u
#define SAMPLE_RULE_EDIT_BAN 4u

/* single rounded operations on both sides (nvcc would otherwise fuse a * b + c) */
SAMPLE_RULE_FN float sample_rule_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SAMPLE_RULE_FN float sample_rule_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SAMPLE_RULE_FN float sample_rule_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SAMPLE_RULE_FN double sample_rule_dmul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/* e^x for x <= 0 (a larger x counts as 0): 0 for x <= -28 and for NaN. x = n ln2 + r with n =
 * rint(x log2 e), r by two fmaf steps; e^r by a degree-7 Horner polynomial in fmaf; the result
 * times 2^n by its exponent bits. Within a few ulp of e^x; what matters is that it is one fixed
 * sequence of correctly rounded operations. */
SAMPLE_RULE_FN float sample_rule_expf(float x) {
  if (!(x > -28.0f)) return 0.0f;
  if (x > 0.0f) x = 0.0f;
  float n = rintf(sample_rule_mul(x, 1.44269502162933349609375f));
  float r = fmaf(n, -0.693145751953125f, x);
  r = fmaf(n, -1.428606765330187045037746429443359375e-06f, r);
  float p = 1.98412701138295233249664306640625e-04f;
  p = fmaf(p, r, 1.38888892251998186111450195312500e-03f);
  p = fmaf(p, r, 8.33333376795053482055664062500000e-03f);
  p = fmaf(p, r, 4.16666679084300994873046875000000e-02f);
  p = fmaf(p, r, 1.66666671633720397949218750000000e-01f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  int e = (int)n + 127; /* n in [-41, 0] */
  uint32_t bits = (uint32_t)e << 23;
  float s;
  memcpy(&s, &bits, sizeof s);
  return sample_rule_mul(p, s);
}

/* q of step 3 */
SAMPLE_RULE_FN float sample_rule_prob(float x, float m, float inv_t) {
  return sample_rule_expf(sample_rule_mul(sample_rule_sub(x, m), inv_t));
}

/* w of step 3 (q <= 1, so w <= 2^40) */
SAMPLE_RULE_FN uint64_t sample_rule_mass(float q, float min_p) {
  if (!(q >= min_p)) return 0;
  return (uint64_t)sample_rule_mul(q, SAMPLE_RULE_MASS_SCALE);
}

/* The bits that order candidates (a larger q, larger bits: q >= 0), 0 for a non-candidate. */
SAMPLE_RULE_FN uint32_t sample_rule_key(float q, float min_p) {
  if (sample_rule_mass(q, min_p) == 0) return 0;
  uint32_t k;
  memcpy(&k, &q, sizeof k);
  return k;
}

/* top_p's mass to reach among the kept candidates of total mass total (>= 1) */
SAMPLE_RULE_FN uint64_t sample_rule_top_p_target(float top_p, uint64_t total) {
  double t = ceil(sample_rule_dmul((double)top_p, (double)total));
  uint64_t g = t >= (double)total ? total : (uint64_t)t;
  return g < 1 ? 1 : g;
}

/* the draw's r in [0, total) from 53 random bits: floor(u total), u = u53 2^-53 */
SAMPLE_RULE_FN uint64_t sample_rule_draw_target(uint64_t u53, uint64_t total) {
  double u = (double)u53 * 0x1.0p-53;
  double t = floor(sample_rule_dmul(u, (double)total));
  uint64_t r = t >= (double)total ? total - 1 : (uint64_t)t;
  return r >= total ? total - 1 : r;
}

/* Candidate a = (key ka, id ia) comes before b in the candidates' order. */
SAMPLE_RULE_FN int sample_rule_before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

/* A row's parameters as the device op reads them (SAMPLE_RULE_WORDS int32). */
typedef struct sample_rule_row {
  float temperature, top_p, min_p;
  int32_t top_k;
  uint64_t u53;
  int32_t edit_off, n_edits;
} sample_rule_row;

SAMPLE_RULE_FN void sample_rule_pack(const sample_rule_row *r, int32_t *w) {
  memcpy(&w[0], &r->temperature, 4);
  w[1] = r->top_k;
  memcpy(&w[2], &r->top_p, 4);
  memcpy(&w[3], &r->min_p, 4);
  w[4] = (int32_t)(uint32_t)(r->u53 & 0xffffffffu);
  w[5] = (int32_t)(uint32_t)(r->u53 >> 32);
  w[6] = r->edit_off;
  w[7] = r->n_edits;
}

SAMPLE_RULE_FN void sample_rule_unpack(const int32_t *w, sample_rule_row *r) {
  memcpy(&r->temperature, &w[0], 4);
  r->top_k = w[1];
  memcpy(&r->top_p, &w[2], 4);
  memcpy(&r->min_p, &w[3], 4);
  r->u53 = (uint64_t)(uint32_t)w[4] | (uint64_t)(uint32_t)w[5] << 32;
  r->edit_off = w[6];
  r->n_edits = w[7];
}

/* One edit: the token, what applies (SAMPLE_RULE_EDIT_*), what is subtracted and added. */
typedef struct sample_rule_edit {
  int32_t id;
  uint32_t flags;
  float sub, add;
} sample_rule_edit;

SAMPLE_RULE_FN void sample_rule_edit_pack(const sample_rule_edit *e, int32_t *w) {
  w[0] = e->id;
  w[1] = (int32_t)e->flags;
  memcpy(&w[2], &e->sub, 4);
  memcpy(&w[3], &e->add, 4);
}

SAMPLE_RULE_FN void sample_rule_edit_unpack(const int32_t *w, sample_rule_edit *e) {
  e->id = w[0];
  e->flags = (uint32_t)w[1];
  memcpy(&e->sub, &w[2], 4);
  memcpy(&e->add, &w[3], 4);
}

/* What a frequency and presence penalty subtract from a token seen count times in the output. */
SAMPLE_RULE_FN float sample_rule_penalty(float frequency, float presence, int32_t count) {
  return sample_rule_add(sample_rule_mul(frequency, (float)count), presence);
}

/* The edited logit: the sampler's x -= frequency * count + presence, then x += bias; a ban
 * (which the engine applies first, as -inf, and no later step changes) last. */
SAMPLE_RULE_FN float sample_rule_edit_apply(float x, const sample_rule_edit *e) {
  if (e->flags & SAMPLE_RULE_EDIT_PEN) x = sample_rule_sub(x, e->sub);
  if (e->flags & SAMPLE_RULE_EDIT_BIAS) x = sample_rule_add(x, e->add);
  if (e->flags & SAMPLE_RULE_EDIT_BAN) x = -INFINITY;
  return x;
}

#endif
