/* test_deltanet — the chunked gated delta rule (cpu_gdn_chunked) against the token recurrence
 * (cpu_gdn_step) on random inputs, and the chunk-alignment contract: splitting a sequence at
 * multiples of 64 is bit-identical to one piece. Also through the backend op table
 * (gdn_prefill / gdn_decode over a batch). */
#include <stdint.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/cpu_gdn.h"
#include "test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.f;
}

typedef struct {
  int n, dk, dv;
  float *q, *k, *v, *beta, *g;
} seq_in;

static void l2(float *x, int n, float scale) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
  float inv = (float)(1.0 / sqrt(s + 1e-6));
  for (int i = 0; i < n; i++) x[i] *= inv * scale;
}

static seq_in make_seq(int n, int dk, int dv) {
  seq_in s = {n,
              dk,
              dv,
              malloc(sizeof(float) * n * dk),
              malloc(sizeof(float) * n * dk),
              malloc(sizeof(float) * n * dv),
              malloc(sizeof(float) * n),
              malloc(sizeof(float) * n)};
  for (int t = 0; t < n; t++) {
    for (int i = 0; i < dk; i++) s.q[t * dk + i] = frand(), s.k[t * dk + i] = frand();
    l2(s.q + t * dk, dk, 1.f / sqrtf((float)dk));
    l2(s.k + t * dk, dk, 1.f);
    for (int i = 0; i < dv; i++) s.v[t * dv + i] = frand();
    s.beta[t] = 0.5f + 0.5f * frand() * 0.9f;
    s.g[t] = -0.3f * (frand() + 1.f); /* in (-0.6, 0] */
  }
  return s;
}

static void free_seq(seq_in *s) { free(s->q), free(s->k), free(s->v), free(s->beta), free(s->g); }

/* Recurrent reference over tokens [t0, t0+n), in double-checked fp32 (cpu_gdn_step). */
static void run_steps(const seq_in *s, int t0, int n, float *S, float *out) {
  for (int t = t0; t < t0 + n; t++)
    cpu_gdn_step(s->q + t * s->dk, s->k + t * s->dk, s->v + t * s->dv, s->beta[t], s->g[t], s->dk,
                 s->dv, S, out + t * s->dv);
}

static void run_chunked(const seq_in *s, int t0, int n, int pos0, float *S, float *out) {
  int rc = cpu_gdn_chunked(n, pos0, s->q + t0 * s->dk, s->k + t0 * s->dk, (size_t)s->dk,
                           s->v + t0 * s->dv, (size_t)s->dv, s->beta + t0, s->g + t0, 1, s->dk,
                           s->dv, S, out + t0 * s->dv, (size_t)s->dv);
  if (rc) abort();
}

static double rel_err(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)b[i] * b[i];
  }
  return sqrt(d) / (sqrt(r) + 1e-30);
}

/* chunked == recurrent for several lengths, from a zero and from a non-zero state, and for
 * pieces starting mid-chunk. */
TEST(chunked_matches_recurrence) {
  const int lens[] = {1, 5, 63, 64, 65, 130, 200};
  const int starts[] = {0, 64, 7, 100}; /* absolute position of the piece */
  int dk = 32, dv = 48;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++) {
      int n = lens[li], p0 = starts[si];
      seq_in s = make_seq(n, dk, dv);
      float *S0 = malloc(sizeof(float) * dk * dv), *S1 = malloc(sizeof(float) * dk * dv);
      for (int i = 0; i < dk * dv; i++) S0[i] = p0 ? 0.3f * frand() : 0.f;
      memcpy(S1, S0, sizeof(float) * dk * dv);
      float *o0 = calloc((size_t)n * dv, sizeof(float)),
            *o1 = calloc((size_t)n * dv, sizeof(float));
      run_steps(&s, 0, n, S0, o0);
      run_chunked(&s, 0, n, p0, S1, o1);
      double eo = rel_err(o1, o0, (size_t)n * dv), es = rel_err(S1, S0, (size_t)dk * dv);
      EXPECT_MSG(eo <= 1e-5 && es <= 1e-5, "n=%d pos=%d: out rel err %.3g, state %.3g", n, p0, eo,
                 es);
      free(S0), free(S1), free(o0), free(o1);
      free_seq(&s);
    }
  }
}

/* A 200-token sequence as one piece, vs split at 64 and 128, vs split 64|1|63|72 where the
 * 1-token piece is not at a chunk boundary (only the aligned splits must be bit-identical). */
TEST(split_at_64_is_bit_identical) {
  int n = 200, dk = 32, dv = 32;
  seq_in s = make_seq(n, dk, dv);
  size_t sb = sizeof(float) * dk * dv;
  float *Sa = calloc(1, sb), *Sb = calloc(1, sb);
  float *oa = calloc((size_t)n * dv, 4), *ob = calloc((size_t)n * dv, 4);
  run_chunked(&s, 0, n, 0, Sa, oa);
  run_chunked(&s, 0, 64, 0, Sb, ob);
  run_chunked(&s, 64, 64, 64, Sb, ob);
  run_chunked(&s, 128, 72, 128, Sb, ob);
  EXPECT(memcmp(oa, ob, (size_t)n * dv * 4) == 0);
  EXPECT(memcmp(Sa, Sb, sb) == 0);
  /* a prefix computed alone gives the same rows as inside the longer piece */
  float *Sc = calloc(1, sb), *oc = calloc((size_t)n * dv, 4);
  run_chunked(&s, 0, 100, 0, Sc, oc);
  EXPECT(memcmp(oa, oc, (size_t)100 * dv * 4) == 0);
  free(Sa), free(Sb), free(Sc), free(oa), free(ob), free(oc);
  free_seq(&s);
}

/* Through the op table: two sequences in one batch (a 70-token prefill resuming at 64, a
 * 1-token decode) against cpu_gdn_* on each alone. */
TEST(backend_ops_batch) {
  backend *be = backend_cpu_create(2);
  REQUIRE(be);
  int nk = 2, nv = 4, dk = 16, dv = 16, cd = 2 * nk * dk + nv * dv, n_slots = 3;
  int lens[2] = {70, 1}, poss[2] = {64, 9}, slots[2] = {2, 0};
  int T = 71;
  float *qkv = malloc(sizeof(float) * T * cd), *beta = malloc(sizeof(float) * T * nv),
        *g = malloc(sizeof(float) * T * nv);
  for (int t = 0; t < T; t++) {
    for (int h = 0; h < 2 * nk; h++) {
      for (int i = 0; i < dk; i++) qkv[t * cd + h * dk + i] = frand();
      l2(qkv + t * cd + h * dk, dk, h < nk ? 1.f / sqrtf((float)dk) : 1.f);
    }
    for (int i = 0; i < nv * dv; i++) qkv[t * cd + 2 * nk * dk + i] = frand();
    for (int h = 0; h < nv; h++)
      beta[t * nv + h] = 0.5f + 0.4f * frand(), g[t * nv + h] = -0.2f * (1.f + frand());
  }
  size_t ssz = (size_t)n_slots * nv * dk * dv;
  float *S = malloc(sizeof(float) * ssz);
  for (size_t i = 0; i < ssz; i++) S[i] = 0.2f * frand();
  backend_buf bq = be->alloc(be, BACKEND_KIND_ACT, (size_t)T * cd),
              bbeta = be->alloc(be, BACKEND_KIND_F32, (size_t)T * nv),
              bg = be->alloc(be, BACKEND_KIND_F32, (size_t)T * nv),
              bs = be->alloc(be, BACKEND_KIND_F32, ssz),
              bo = be->alloc(be, BACKEND_KIND_ACT, (size_t)T * nv * dv);
  be->write(be, bq, 0, qkv, sizeof(float) * T * cd);
  be->write(be, bbeta, 0, beta, sizeof(float) * T * nv);
  be->write(be, bg, 0, g, sizeof(float) * T * nv);
  be->write(be, bs, 0, S, sizeof(float) * ssz);
  int32_t pos[71], seq[71], tok[71] = {0}, st[2] = {0, 70}, pt[2] = {0, 0};
  for (int t = 0; t < T; t++) seq[t] = t < 70 ? 0 : 1, pos[t] = t < 70 ? 64 + t : 9;
  backend_batch b = {T, 2, tok, pos, seq, st, lens, poss, slots, pt, 1, 0, NULL, NULL};
  REQUIRE(be->set_batch(be, &b) == 0);
  be->gdn_prefill(be, bs, bq, bbeta, bg, nk, nv, dk, dv, bo);
  be->gdn_decode(be, bs, bq, bbeta, bg, nk, nv, dk, dv, bo);
  float *out = malloc(sizeof(float) * T * nv * dv), *S2 = malloc(sizeof(float) * ssz);
  be->read(be, bo, 0, out, sizeof(float) * T * nv * dv);
  be->read(be, bs, 0, S2, sizeof(float) * ssz);
  /* reference per (sequence, head) */
  float ref[71 * 4 * 16], Sr[16 * 16];
  int ok = 1;
  for (int s = 0; s < 2; s++)
    for (int h = 0; h < nv; h++) {
      int kh = h / (nv / nk), t0 = st[s];
      memcpy(Sr, S + ((size_t)slots[s] * nv + h) * dk * dv, sizeof Sr);
      const float *q = qkv + t0 * cd + kh * dk, *k = qkv + t0 * cd + (nk + kh) * dk,
                  *v = qkv + t0 * cd + 2 * nk * dk + h * dv;
      if (lens[s] > 1)
        cpu_gdn_chunked(lens[s], poss[s], q, k, cd, v, cd, beta + t0 * nv + h, g + t0 * nv + h, nv,
                        dk, dv, Sr, ref + t0 * nv * dv + h * dv, (size_t)nv * dv);
      else
        cpu_gdn_step(q, k, v, beta[t0 * nv + h], g[t0 * nv + h], dk, dv, Sr,
                     ref + t0 * nv * dv + h * dv);
      for (int r = 0; r < lens[s]; r++)
        ok &= memcmp(ref + (t0 + r) * nv * dv + h * dv, out + (t0 + r) * nv * dv + h * dv,
                     dv * 4) == 0;
      ok &= memcmp(Sr, S2 + ((size_t)slots[s] * nv + h) * dk * dv, sizeof Sr) == 0;
    }
  EXPECT(ok);
  /* slot 1 untouched */
  EXPECT(memcmp(S + (size_t)nv * dk * dv, S2 + (size_t)nv * dk * dv,
                sizeof(float) * nv * dk * dv) == 0);
  be->free(be, bq), be->free(be, bbeta), be->free(be, bg), be->free(be, bs), be->free(be, bo);
  free(qkv), free(beta), free(g), free(S), free(S2), free(out);
  be->destroy(be);
}

int main(void) {
  RUN(chunked_matches_recurrence);
  RUN(split_at_64_is_bit_identical);
  RUN(backend_ops_batch);
  TEST_MAIN_END();
}
