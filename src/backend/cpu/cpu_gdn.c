/* cpu_gdn — see cpu_gdn.h.
 *
 * Chunked form, per chunk of L <= 64 rows with state S entering it (all fp32):
 *
 *   G_i   = g_0 + ... + g_i                              (inclusive cumsum inside the chunk)
 *   A_ij  = beta_i (k_i . k_j) exp(G_i - G_j)            j < i
 *   U_i   = beta_i v_i            - sum_{j<i} A_ij U_j   (forward substitution: U = (I+A)^-1 bV)
 *   W_i   = beta_i exp(G_i) k_i   - sum_{j<i} A_ij W_j
 *   V'_i  = U_i - W_i S
 *   O_i   = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) V'_j
 *   S    <- exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T
 *
 * which equals the token recurrence in exact arithmetic. Chunk ends sit at absolute positions
 * that are multiples of 64, so a piece that starts at such a multiple sees exactly the chunks
 * it would see inside a longer piece. */
#include "backend/cpu/cpu_gdn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float gdn_dot(const float *a, const float *b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

void cpu_gdn_step(const float *q, const float *k, const float *v, float beta, float g, int dk,
                  int dv, float *S, float *o) {
  float eg = expf(g);
  float kv[dv];
  for (int c = 0; c < dv; c++) kv[c] = 0.f;
  for (int a = 0; a < dk; a++) {
    float *row = S + (size_t)a * dv;
    for (int c = 0; c < dv; c++) {
      row[c] *= eg;
      kv[c] += row[c] * k[a];
    }
  }
  for (int c = 0; c < dv; c++) kv[c] = beta * (v[c] - kv[c]); /* delta */
  for (int c = 0; c < dv; c++) o[c] = 0.f;
  for (int a = 0; a < dk; a++) {
    float *row = S + (size_t)a * dv;
    for (int c = 0; c < dv; c++) {
      row[c] += k[a] * kv[c];
      o[c] += row[c] * q[a];
    }
  }
}

int cpu_gdn_chunked(int n, int pos0, const float *q, const float *k, size_t qk_stride,
                    const float *v, size_t v_stride, const float *beta, const float *g,
                    size_t bg_stride, int dk, int dv, float *S, float *out, size_t out_stride) {
  const int C = CPU_GDN_CHUNK;
  size_t nf = (size_t)C + (size_t)C * C + (size_t)C * dv * 2 + (size_t)C * dk;
  float *scratch = malloc(nf * sizeof(float));
  if (!scratch) return -1;
  float *G = scratch;              /* [C] */
  float *A = G + C;                /* [C, C] */
  float *U = A + (size_t)C * C;    /* [C, dv]  U, then V' in place */
  float *W = U + (size_t)C * dv;   /* [C, dk] */
  float *acc = W + (size_t)C * dk; /* [C, dv] unused rows beyond 1: per-row output scratch */

  int t0 = 0;
  while (t0 < n) {
    int p = pos0 + t0;
    int L = C - p % C;
    if (L > n - t0) L = n - t0;
    /* cumulative gates */
    float run = 0.f;
    for (int i = 0; i < L; i++) {
      run += g[(size_t)(t0 + i) * bg_stride];
      G[i] = run;
    }
    /* A (strictly lower) */
    for (int i = 0; i < L; i++) {
      const float *ki = k + (size_t)(t0 + i) * qk_stride;
      float bi = beta[(size_t)(t0 + i) * bg_stride];
      for (int j = 0; j < i; j++) {
        const float *kj = k + (size_t)(t0 + j) * qk_stride;
        A[(size_t)i * C + j] = bi * gdn_dot(ki, kj, dk) * expf(G[i] - G[j]);
      }
    }
    /* U and W by forward substitution */
    for (int i = 0; i < L; i++) {
      float bi = beta[(size_t)(t0 + i) * bg_stride];
      const float *vi = v + (size_t)(t0 + i) * v_stride;
      const float *ki = k + (size_t)(t0 + i) * qk_stride;
      float *Ui = U + (size_t)i * dv;
      float *Wi = W + (size_t)i * dk;
      float egi = expf(G[i]);
      for (int c = 0; c < dv; c++) Ui[c] = bi * vi[c];
      for (int a = 0; a < dk; a++) Wi[a] = bi * egi * ki[a];
      for (int j = 0; j < i; j++) {
        float aij = A[(size_t)i * C + j];
        const float *Uj = U + (size_t)j * dv;
        const float *Wj = W + (size_t)j * dk;
        for (int c = 0; c < dv; c++) Ui[c] -= aij * Uj[c];
        for (int a = 0; a < dk; a++) Wi[a] -= aij * Wj[a];
      }
    }
    /* V' = U - W S  (in place in U) */
    for (int i = 0; i < L; i++) {
      float *Ui = U + (size_t)i * dv;
      const float *Wi = W + (size_t)i * dk;
      for (int a = 0; a < dk; a++) {
        const float *Sa = S + (size_t)a * dv;
        float w = Wi[a];
        for (int c = 0; c < dv; c++) Ui[c] -= w * Sa[c];
      }
    }
    /* outputs */
    for (int i = 0; i < L; i++) {
      const float *qi = q + (size_t)(t0 + i) * qk_stride;
      float *oi = out + (size_t)(t0 + i) * out_stride;
      float *ac = acc;
      for (int c = 0; c < dv; c++) ac[c] = 0.f;
      for (int a = 0; a < dk; a++) {
        const float *Sa = S + (size_t)a * dv;
        float qa = qi[a];
        for (int c = 0; c < dv; c++) ac[c] += qa * Sa[c];
      }
      float egi = expf(G[i]);
      for (int c = 0; c < dv; c++) ac[c] *= egi;
      for (int j = 0; j <= i; j++) {
        const float *kj = k + (size_t)(t0 + j) * qk_stride;
        float pij = gdn_dot(qi, kj, dk) * expf(G[i] - G[j]);
        const float *Vj = U + (size_t)j * dv;
        for (int c = 0; c < dv; c++) ac[c] += pij * Vj[c];
      }
      memcpy(oi, ac, (size_t)dv * sizeof(float));
    }
    /* state */
    float gl = G[L - 1];
    float egl = expf(gl);
    for (int a = 0; a < dk; a++) {
      float *Sa = S + (size_t)a * dv;
      for (int c = 0; c < dv; c++) Sa[c] *= egl;
    }
    for (int j = 0; j < L; j++) {
      const float *kj = k + (size_t)(t0 + j) * qk_stride;
      const float *Vj = U + (size_t)j * dv;
      float d = expf(gl - G[j]);
      for (int a = 0; a < dk; a++) {
        float ka = kj[a] * d;
        float *Sa = S + (size_t)a * dv;
        for (int c = 0; c < dv; c++) Sa[c] += ka * Vj[c];
      }
    }
    t0 += L;
  }
  free(scratch);
  return 0;
}
