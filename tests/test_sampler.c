/* sampler: greedy, penalties (vLLM semantics), logprobs, top-k / top-p / min-p, seeded RNG,
 * parameter validation. Expected values are computed here independently. */
#include "sampler/sample_rule.h"
#include "sampler/sampler.h"

#include "test.h"

static sampler_scratch W;

static int32_t draw(sampler *s, const float *in, int n, sampler_result *res) {
  float l[16];
  memcpy(l, in, (size_t)n * sizeof(float));
  return sampler_sample(s, l, n, NULL, 0, NULL, 0, &W, res);
}

TEST(greedy) {
  sampling_params p;
  sampling_params_default(&p);
  p.temperature = 0;
  sampler s;
  sampler_init(&s, &p, 1);
  sampler_result r;
  float l[5] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ_INT(draw(&s, l, 5, &r), 1); /* tie between 1 and 3: lowest id */
  float l2[3] = {-5, -4, -6};
  EXPECT_EQ_INT(draw(&s, l2, 3, &r), 1);
}

/* The original scan, written out here: tok = 0; if (x[i] > x[tok]) tok = i. */
static int32_t scan_argmax(const float *x, int n) {
  int32_t tok = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[tok]) tok = i;
  return tok;
}

TEST(argmax_rule) {
  float nan = NAN;
  /* ties to the lowest id, -0 ties with +0, NaN never wins, NaN at 0 stays 0, all -inf */
  float a[6] = {1, 3, 3, -2, 3, 0};
  EXPECT_EQ_INT(sampler_argmax(a, 6), 1);
  float b[4] = {-1, -0.0f, 0.0f, -3};
  EXPECT_EQ_INT(sampler_argmax(b, 4), 1);
  float c[4] = {1, nan, 5, nan};
  EXPECT_EQ_INT(sampler_argmax(c, 4), 2);
  float d[3] = {nan, 7, 9};
  EXPECT_EQ_INT(sampler_argmax(d, 3), 0);
  float e[3] = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ_INT(sampler_argmax(e, 3), 0);
  EXPECT_EQ_INT(sampler_argmax(a, 1), 0);
  /* random rows with many ties (values from a small set), against the scan */
  uint64_t x = 12345;
  float r[997];
  int ok = 1;
  for (int rep = 0; rep < 200; rep++) {
    for (int i = 0; i < 997; i++) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      int k = (int)(x >> 59); /* 0..31 */
      r[i] = k == 31 ? nan : k == 30 ? -0.0f : (float)(k % 12) - 4;
    }
    if (rep % 3 == 0) r[0] = nan;
    ok &= sampler_argmax(r, 997) == scan_argmax(r, 997);
  }
  EXPECT(ok);
  /* plain greedy: exactly greedy without penalties or logprobs */
  sampling_params p;
  sampling_params_default(&p);
  EXPECT(!sampler_is_plain_greedy(&p));
  p.temperature = 0;
  EXPECT(sampler_is_plain_greedy(&p));
  p.repetition_penalty = 1.1f;
  EXPECT(!sampler_is_plain_greedy(&p));
  p.repetition_penalty = 1;
  p.presence_penalty = 0.5f;
  EXPECT(!sampler_is_plain_greedy(&p));
  p.presence_penalty = 0;
  p.frequency_penalty = -0.5f;
  EXPECT(!sampler_is_plain_greedy(&p));
  p.frequency_penalty = 0;
  p.logprobs = 1;
  EXPECT(!sampler_is_plain_greedy(&p));
  p.logprobs = 0;
  p.bias_ids[0] = 3;
  p.bias[0] = 1;
  p.n_bias = 1;
  EXPECT(!sampler_is_plain_greedy(&p));
  p.n_bias = 0;
  EXPECT(sampler_is_plain_greedy(&p));
  p.min_tokens = 2; /* the engine masks the end tokens on the host */
  EXPECT(!sampler_is_plain_greedy(&p));
}

TEST(min_tokens_range) {
  sampling_params p;
  sampling_params_default(&p);
  char err[128];
  p.max_tokens = 8;
  p.min_tokens = 8;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == 0);
  p.min_tokens = 9;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0 && !strncmp(err, "min_tokens", 10));
  p.min_tokens = -1;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0);
}

TEST(logit_bias) {
  sampling_params p;
  sampling_params_default(&p);
  /* added after the penalties; ids outside the vocabulary skipped */
  p.repetition_penalty = 2.0f;
  p.bias_ids[0] = 2;
  p.bias[0] = -5;
  p.bias_ids[1] = 0;
  p.bias[1] = 0.5f;
  p.bias_ids[2] = 9;
  p.bias[2] = 100;
  p.n_bias = 3;
  float l[4] = {2, -1, 3, 0.5f};
  int32_t prompt[1] = {0};
  sampler_apply_penalties(&p, l, 4, prompt, 1, NULL, 0, &W);
  EXPECT(l[0] == 1.5f && l[1] == -1.0f && l[2] == -2.0f && l[3] == 0.5f);
  /* greedy: a bias of 100 makes a token win, -100 bans the top one */
  sampling_params_default(&p);
  p.temperature = 0;
  p.bias_ids[0] = 1;
  p.bias[0] = 100;
  p.n_bias = 1;
  sampler s;
  sampler_init(&s, &p, 1);
  sampler_result r;
  float a[3] = {3, 1, 2};
  EXPECT_EQ_INT(sampler_sample(&s, a, 3, NULL, 0, NULL, 0, &W, &r), 1);
  p.bias_ids[0] = 0;
  p.bias[0] = -100;
  sampler_init(&s, &p, 1);
  float b[3] = {3, 1, 2};
  EXPECT_EQ_INT(sampler_sample(&s, b, 3, NULL, 0, NULL, 0, &W, &r), 2);
  /* sampling at temperature 1 never picks a token biased by -100 against a near-tie */
  sampling_params_default(&p);
  p.seed = 5;
  p.has_seed = 1;
  p.bias_ids[0] = 0;
  p.bias[0] = -100;
  p.n_bias = 1;
  sampler_init(&s, &p, 1);
  int picked0 = 0;
  for (int i = 0; i < 200; i++) {
    float c[3] = {1.0f, 0.9f, 0.8f};
    picked0 += sampler_sample(&s, c, 3, NULL, 0, NULL, 0, &W, &r) == 0;
  }
  EXPECT_EQ_INT(picked0, 0);
  /* validation */
  char err[128];
  sampling_params_default(&p);
  p.n_bias = 1;
  p.bias_ids[0] = 1;
  p.bias[0] = 100;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == 0);
  p.bias[0] = 100.5f;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0);
  p.bias[0] = NAN;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0);
  p.bias[0] = 1;
  p.bias_ids[0] = -1;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0);
  p.bias_ids[0] = 1;
  p.n_bias = SAMPLER_MAX_BIAS + 1;
  EXPECT(sampling_params_validate(&p, err, sizeof err) != 0);
}

TEST(penalties) {
  sampling_params p;
  sampling_params_default(&p);
  p.repetition_penalty = 2.0f;
  float l[4] = {2, -1, 3, 0.5f};
  int32_t prompt[2] = {0, 0}, out[2] = {1, 1};
  sampler_apply_penalties(&p, l, 4, prompt, 2, out, 2, &W);
  EXPECT(l[0] == 1.0f && l[1] == -2.0f && l[2] == 3.0f && l[3] == 0.5f);
  sampling_params_default(&p);
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  float m[4] = {2, -1, 3, 0.5f};
  int32_t out2[3] = {1, 3, 1};
  sampler_apply_penalties(&p, m, 4, prompt, 2, out2, 3, &W); /* prompt does not count */
  EXPECT(m[0] == 2.0f && m[1] == -1.0f - 1.25f && m[2] == 3.0f && m[3] == 0.5f - 0.75f);
  for (int i = 0; i < 4; i++) EXPECT(W.counts[i] == 0 && W.mark[i] == 0); /* scratch restored */
  /* greedy follows the penalised logits */
  sampling_params_default(&p);
  p.temperature = 0;
  p.repetition_penalty = 10.0f;
  sampler s;
  sampler_init(&s, &p, 1);
  float l3[3] = {3, 1, 2};
  int32_t pr[1] = {0};
  sampler_result r;
  EXPECT_EQ_INT(sampler_sample(&s, l3, 3, pr, 1, NULL, 0, &W, &r), 2);
}

TEST(logprobs) {
  sampling_params p;
  sampling_params_default(&p);
  p.temperature = 0;
  p.logprobs = 1;
  p.top_logprobs = 3;
  sampler s;
  sampler_init(&s, &p, 1);
  float l[5] = {0.5f, 1.5f, -2.0f, 1.0f, 0.0f};
  double z = 0;
  for (int i = 0; i < 5; i++) z += exp((double)l[i]);
  sampler_result r;
  EXPECT_EQ_INT(draw(&s, l, 5, &r), 1);
  EXPECT(fabs(r.logprob - (1.5 - log(z))) < 1e-6);
  REQUIRE(r.n_top == 3);
  EXPECT(r.top_ids[0] == 1 && r.top_ids[1] == 3 && r.top_ids[2] == 0);
  EXPECT(fabs(r.top_logprobs[2] - (0.5 - log(z))) < 1e-6);
  /* logprobs are pre-temperature */
  p.temperature = 0.5f;
  sampler_init(&s, &p, 7);
  int32_t t = draw(&s, l, 5, &r);
  EXPECT(fabs(r.logprob - (l[t] - log(z))) < 1e-6);
}

static void freqs(sampling_params *p, const float *l, int n, int draws, double *f) {
  sampler s;
  sampler_init(&s, p, 42);
  sampler_result r;
  for (int i = 0; i < n; i++) f[i] = 0;
  for (int i = 0; i < draws; i++) f[draw(&s, l, n, &r)] += 1.0 / draws;
}

TEST(distributions) {
  float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
  sampling_params p;
  sampling_params_default(&p);
  double f[3];
  freqs(&p, l, 3, 20000, f);
  EXPECT_MSG(fabs(f[0] - 0.5) < 0.02 && fabs(f[1] - 0.3) < 0.02 && fabs(f[2] - 0.2) < 0.02,
             "plain %f %f %f", f[0], f[1], f[2]);
  p.top_p = 0.6f; /* keeps {0, 1}: 0.5 < 0.6 <= 0.8 */
  freqs(&p, l, 3, 20000, f);
  EXPECT_MSG(f[2] == 0 && fabs(f[0] - 0.625) < 0.02, "top_p %f %f %f", f[0], f[1], f[2]);
  sampling_params_default(&p);
  p.min_p = 0.5f; /* threshold 0.25: keeps {0, 1} */
  freqs(&p, l, 3, 20000, f);
  EXPECT_MSG(f[2] == 0 && fabs(f[0] - 0.625) < 0.02, "min_p %f %f %f", f[0], f[1], f[2]);
  sampling_params_default(&p);
  p.top_k = 1;
  freqs(&p, l, 3, 1000, f);
  EXPECT(f[1] == 0 && f[2] == 0);
  sampling_params_default(&p);
  p.temperature = 0.25f; /* p^4: 0.0625, 0.0081, 0.0016 */
  freqs(&p, l, 3, 20000, f);
  double z = 0.0625 + 0.0081 + 0.0016;
  EXPECT_MSG(fabs(f[0] - 0.0625 / z) < 0.02, "temperature %f", f[0]);
}

TEST(seeded) {
  sampling_params p;
  sampling_params_default(&p);
  p.seed = 1234;
  p.has_seed = 1;
  float l[8] = {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
  sampler a, b, c;
  sampler_init(&a, &p, 1);
  sampler_init(&b, &p, 999); /* the fallback does not matter with a seed */
  p.seed = 1235;
  sampler_init(&c, &p, 1);
  sampler_result r;
  int same = 1, differ = 0;
  for (int i = 0; i < 64; i++) {
    int32_t x = draw(&a, l, 8, &r), y = draw(&b, l, 8, &r), z = draw(&c, l, 8, &r);
    same &= x == y;
    differ |= x != z;
  }
  EXPECT(same);
  EXPECT(differ);
}

TEST(validate) {
  sampling_params p;
  char err[128];
  sampling_params_default(&p);
  EXPECT(sampling_params_validate(&p, err, sizeof err) == 0);
  p.top_p = 1.5f;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == -1);
  sampling_params_default(&p);
  p.temperature = NAN;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == -1);
  sampling_params_default(&p);
  p.max_tokens = 0;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == -1);
  sampling_params_default(&p);
  p.top_logprobs = 21;
  EXPECT(sampling_params_validate(&p, err, sizeof err) == -1);
}

/* ---- the rule of sample_rule.h written out plainly, the reference for the fast path ------
 * qsort of the candidates by probability descending (ties to the lowest id), the masses summed
 * in that order, the kept set sorted by id for the draw, and the same RNG (xoshiro256**, which
 * the reference steps itself on a copy of the sampler's state). */
static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t ref_bits53(uint64_t *r) {
  uint64_t out = ref_rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
  r[2] ^= r[0];
  r[3] ^= r[1];
  r[1] ^= r[2];
  r[0] ^= r[3];
  r[2] ^= t;
  r[3] = ref_rotl(r[3], 45);
  return out >> 11;
}
static int ref_cmp_desc(const void *a, const void *b, void *ctx) {
  const float *pr = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (pr[x] > pr[y]) return -1;
  if (pr[x] < pr[y]) return 1;
  return x < y ? -1 : x > y;
}
static int ref_cmp_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}
static int32_t ref_sample(const sampling_params *p, uint64_t *rng, float *logits, int n_vocab,
                          float *probs, int32_t *idx) {
  if (p->temperature < 1e-5f) return sampler_argmax(logits, n_vocab);
  uint64_t u53 = ref_bits53(rng);
  float inv_t = 1.0f / p->temperature;
  float m = -INFINITY;
  for (int i = 0; i < n_vocab; i++)
    if (logits[i] > m) m = logits[i];
  int n = 0;
  for (int i = 0; i < n_vocab; i++) {
    probs[i] = sample_rule_prob(logits[i], m, inv_t);
    if (sample_rule_mass(probs[i], p->min_p) > 0) idx[n++] = i;
  }
  if (n == 0) return sampler_argmax(logits, n_vocab);
  qsort_r(idx, (size_t)n, sizeof *idx, ref_cmp_desc, probs);
  if (p->top_k > 0 && p->top_k < n) n = p->top_k;
  if (p->top_p < 1.0f) {
    uint64_t total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += sample_rule_mass(probs[idx[i]], p->min_p);
    uint64_t target = sample_rule_top_p_target(p->top_p, total);
    int keep = 0;
    while (keep < n) {
      cum += sample_rule_mass(probs[idx[keep++]], p->min_p);
      if (cum >= target) break;
    }
    n = keep;
  }
  qsort(idx, (size_t)n, sizeof *idx, ref_cmp_id);
  uint64_t total = 0, cum = 0;
  for (int i = 0; i < n; i++) total += sample_rule_mass(probs[idx[i]], p->min_p);
  uint64_t r = sample_rule_draw_target(u53, total);
  for (int i = 0; i < n; i++) {
    cum += sample_rule_mass(probs[idx[i]], p->min_p);
    if (cum > r) return idx[i];
  }
  return -1;
}

static uint64_t lcg_state;
static double lcg01(void) {
  lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* kinds of rows: wide normal-ish, peaked, quantised (many exact ties), with -inf / NaN */
static void fill_logits(float *l, int n, int kind) {
  for (int i = 0; i < n; i++) {
    double u = lcg01(), v = lcg01();
    double g = sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
    switch (kind) {
      case 0:
        l[i] = (float)(3 * g);
        break;
      case 1:
        l[i] = (float)(g + (lcg01() < 0.001 ? 12 : 0));
        break;
      case 2:
        l[i] = (float)floor(4 * g) * 0.5f;
        break;
      case 3:
        l[i] = (float)(20 * g);
        break;
      default:
        l[i] = lcg01() < 0.01 ? -INFINITY : (float)(2 * g);
        if (i == 7) l[i] = NAN;
        break;
    }
  }
}

/* n_draws draws per parameter set; big: temperature 1 only (the reference's qsort of a whole
 * vocabulary is slow) */
static void compare_paths(int n, int n_seeds, int n_draws, int big, int *n_checked, int *n_bad) {
  sampler_scratch w;
  REQUIRE(sampler_scratch_init(&w, n) == 0);
  float *base = malloc((size_t)n * sizeof *base), *a = malloc((size_t)n * sizeof *a);
  float *rprobs = malloc((size_t)n * sizeof *rprobs);
  int32_t *ridx = malloc((size_t)n * sizeof *ridx);
  REQUIRE(base && a && rprobs && ridx);
  const float temps[] = {0.3f, 1.0f, 2.5f};
  const int top_ks[] = {0, 1, 2, 5, 50, 1000, n - 1, n + 5};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  const float min_ps[] = {0.0f, 0.05f};
  for (int seed = 0; seed < n_seeds; seed++) {
    fill_logits(base, n, seed % 5);
    for (int ti = big; ti < (big ? 2 : 3); ti++)
      for (int ki = 0; ki < 8; ki++)
        for (int pi = 0; pi < 4; pi++)
          for (int mi = 0; mi < 2; mi++) {
            sampling_params p;
            sampling_params_default(&p);
            p.temperature = temps[ti];
            p.top_k = top_ks[ki];
            p.top_p = top_ps[pi];
            p.min_p = min_ps[mi];
            p.seed = (uint64_t)seed * 7919 + (uint64_t)(ti * 64 + ki * 8 + pi * 2 + mi);
            p.has_seed = 1;
            sampler s;
            sampler_init(&s, &p, 0);
            uint64_t rng[4];
            memcpy(rng, s.rng, sizeof rng);
            for (int d = 0; d < n_draws; d++) { /* a few draws each: the RNG streams stay in step */
              sampler_result r;
              memcpy(a, base, (size_t)n * sizeof *a);
              int32_t got = sampler_sample(&s, a, n, NULL, 0, NULL, 0, &w, &r);
              memcpy(a, base, (size_t)n * sizeof *a);
              int32_t want = ref_sample(&p, rng, a, n, rprobs, ridx);
              (*n_checked)++;
              if (got != want || memcmp(rng, s.rng, sizeof rng) != 0) {
                if (*n_bad < 5)
                  fprintf(stderr, "  n %d seed %d T %g k %d p %g min_p %g: %d vs ref %d\n", n, seed,
                          p.temperature, p.top_k, p.top_p, p.min_p, got, want);
                (*n_bad)++;
              }
            }
          }
  }
  free(base);
  free(a);
  free(rprobs);
  free(ridx);
  sampler_scratch_free(&w);
}

TEST(same_as_reference) {
  int checked = 0, bad = 0;
  compare_paths(3, 10, 3, 0, &checked, &bad);
  compare_paths(37, 20, 3, 0, &checked, &bad);
  compare_paths(4000, 20, 3, 0, &checked, &bad);
  compare_paths(151936, 2, 1, 1, &checked, &bad);
  EXPECT_MSG(bad == 0, "%d of %d draws differ from the reference path", bad, checked);
  EXPECT(checked > 10000);
}

int main(void) {
  if (sampler_scratch_init(&W, 16) != 0) return 1;
  RUN(greedy);
  RUN(argmax_rule);
  RUN(penalties);
  RUN(logit_bias);
  RUN(min_tokens_range);
  RUN(logprobs);
  RUN(distributions);
  RUN(seeded);
  RUN(validate);
  RUN(same_as_reference);
  sampler_scratch_free(&W);
  TEST_MAIN_END();
}
