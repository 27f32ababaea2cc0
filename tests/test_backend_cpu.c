/* test_backend_cpu — each op of the CPU backend against a naive double-precision reference
 * written here, plus bit-exactness across thread counts and batch compositions. */
#include <stdint.h>

#include "backend/cpu/backend_cpu.h"
#include "sample_cases.h"
#include "sampler/sampler.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.f;
}
static float *rnd(size_t n, float scale) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = scale * frand();
  return x;
}
static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sig(x); }

static backend *be;

static backend_buf up(const float *x, size_t n) {
  backend_buf b = be->alloc(be, BACKEND_KIND_F32, n);
  be->write(be, b, 0, x, n * 4);
  return b;
}
static backend_buf mk(size_t n) { return be->alloc(be, BACKEND_KIND_ACT, n); }
static float *down(backend_buf b, size_t n) {
  float *x = malloc(n * 4);
  be->read(be, b, 0, x, n * 4);
  return x;
}
static backend_weight wt(const float *x, int64_t r, int64_t c) {
  return be->weight_upload(be, x, DTYPE_F32, r, c);
}

/* max |a-b| / max(max|b|, 1e-3) */
static double err(const float *a, const double *b, size_t n) {
  double m = 0, s = 1e-3;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > m) m = d;
    if (fabs(b[i]) > s) s = fabs(b[i]);
  }
  return m / s;
}

/* A batch of pieces: lens[s] tokens of piece s starting at poss[s], slot s, identity-ish pages
 * (piece s owns pages s*P .. s*P+P-1, stored reversed). */
#define MAXT 256
static int32_t b_tok[MAXT], b_pos[MAXT], b_seq[MAXT], b_st[8], b_len[8], b_sp[8], b_slot[8],
    b_pt[8 * 16];
static backend_batch make_batch(int ns, const int *lens, const int *poss, int P) {
  int t = 0;
  for (int s = 0; s < ns; s++) {
    b_st[s] = t;
    b_len[s] = lens[s];
    b_sp[s] = poss[s];
    b_slot[s] = s;
    for (int p = 0; p < P; p++) b_pt[s * P + p] = s * P + (P - 1 - p);
    for (int i = 0; i < lens[s]; i++, t++) {
      b_tok[t] = (t * 7 + 3) % 50;
      b_pos[t] = poss[s] + i;
      b_seq[t] = s;
    }
  }
  backend_batch b = {t, ns, b_tok, b_pos, b_seq, b_st, b_len, b_sp, b_slot, b_pt, P, 0, NULL, NULL};
  return b;
}

TEST(weight_conversion_exact) {
  uint16_t bf[4] = {0x3f80, 0xc040, 0x0001, 0x7f7f};         /* 1, -3, tiny subnormal, large */
  uint16_t hf[5] = {0x3c00, 0xc200, 0x0001, 0x7bff, 0x03ff}; /* 1, -3, 2^-24, 65504, subnormal */
  backend_weight a = be->weight_upload(be, bf, DTYPE_BF16, 1, 4);
  backend_weight b = be->weight_upload(be, hf, DTYPE_F16, 1, 5);
  /* read through embed of token 0 */
  backend_batch bt = make_batch(1, (int[]){1}, (int[]){0}, 1);
  bt.tokens = (int32_t[]){0};
  be->set_batch(be, &bt);
  backend_buf o = mk(8);
  be->embed(be, a, 4, o);
  float *x = down(o, 4);
  uint32_t u[4];
  memcpy(u, x, 16);
  EXPECT(u[0] == 0x3f800000u && u[1] == 0xc0400000u && u[2] == 0x00010000u && u[3] == 0x7f7f0000u);
  be->embed(be, b, 5, o);
  float *y = down(o, 5);
  EXPECT(y[0] == 1.f && y[1] == -3.f && y[2] == ldexpf(1.f, -24) && y[3] == 65504.f &&
         y[4] == 1023.f * ldexpf(1.f, -24));
  free(x), free(y);
  be->free(be, o);
  be->weight_free(be, a), be->weight_free(be, b);
}

TEST(matmul_rmsnorm_elementwise) {
  int T = 5, K = 37, N = 19;
  float *x = rnd((size_t)T * K, 1), *w = rnd((size_t)N * K, 1), *r = rnd((size_t)T * K, 1),
        *nw = rnd(K, 0.1f), *g = rnd((size_t)T * K, 2);
  backend_weight W = wt(w, N, K), NW = wt(nw, 1, K);
  backend_buf bx = up(x, (size_t)T * K), by = mk((size_t)T * N), br = up(r, (size_t)T * K),
              bn = mk((size_t)T * K), bg = up(g, (size_t)T * K);
  be->matmul(be, bx, W, T, K, N, by);
  float *y = down(by, (size_t)T * N);
  double ref[T * N];
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)x[t * K + k] * w[n * K + k];
      ref[t * N + n] = s;
    }
  EXPECT_MSG(err(y, ref, (size_t)T * N) < 1e-5, "matmul err %g", err(y, ref, (size_t)T * N));
  /* rmsnorm with residual add: x += r, n = norm(x)(1+w) */
  be->rmsnorm(be, bx, br, NW, T, K, 1e-6f, bn);
  float *xs = down(bx, (size_t)T * K), *nn = down(bn, (size_t)T * K);
  double rx[T * K], rn[T * K];
  for (int t = 0; t < T; t++) {
    double ss = 0;
    for (int k = 0; k < K; k++) {
      rx[t * K + k] = (double)x[t * K + k] + r[t * K + k];
      ss += rx[t * K + k] * rx[t * K + k];
    }
    for (int k = 0; k < K; k++) rn[t * K + k] = rx[t * K + k] / sqrt(ss / K + 1e-6) * (1 + nw[k]);
  }
  EXPECT(err(xs, rx, (size_t)T * K) < 1e-6);
  EXPECT_MSG(err(nn, rn, (size_t)T * K) < 1e-5, "rmsnorm err %g", err(nn, rn, (size_t)T * K));
  /* sigmoid_mul, swiglu, add */
  be->sigmoid_mul(be, bn, bg, (size_t)T * K);
  float *sm = down(bn, (size_t)T * K);
  double rs[T * K];
  for (int i = 0; i < T * K; i++) rs[i] = (double)nn[i] * sig(g[i]);
  EXPECT(err(sm, rs, (size_t)T * K) < 1e-6);
  be->swiglu(be, bg, br, (size_t)T * K, bn);
  float *sw = down(bn, (size_t)T * K);
  for (int i = 0; i < T * K; i++) rs[i] = silu(g[i]) * r[i];
  EXPECT(err(sw, rs, (size_t)T * K) < 1e-6);
  be->add(be, bg, br, (size_t)T * K);
  float *ad = down(bg, (size_t)T * K);
  for (int i = 0; i < T * K; i++) rs[i] = (double)g[i] + r[i];
  EXPECT(err(ad, rs, (size_t)T * K) < 1e-7);
  free(x), free(w), free(r), free(nw), free(g), free(y), free(xs), free(nn), free(sm), free(sw),
      free(ad);
  be->free(be, bx), be->free(be, by), be->free(be, br), be->free(be, bn), be->free(be, bg);
  be->weight_free(be, W), be->weight_free(be, NW);
}

/* qk_norm_rope + paged attention over two sequences (one resuming at position 20 over pages
 * written by an earlier step, one starting at 0), GQA 4 q heads / 2 kv heads. */
TEST(attention_paged_gqa) {
  int nh = 4, nkv = 2, hd = 12, rot = 4, P = 4;
  double theta = 10000.0;
  int lens1[2] = {20, 3}, pos1[2] = {0, 0};
  int lens2[2] = {5, 1}, pos2[2] = {20, 3};
  size_t pool = (size_t)2 * P * 16 * nkv * hd;
  backend_buf kp = be->alloc(be, BACKEND_KIND_KV, pool), vp = be->alloc(be, BACKEND_KIND_KV, pool);
  float *qn = rnd(hd, 0.2f), *kn = rnd(hd, 0.2f);
  backend_weight QN = wt(qn, 1, hd), KN = wt(kn, 1, hd);
  /* full history per sequence (post-norm/rope K and V), for the reference */
  static float Kh[2][32][2][12], Vh[2][32][2][12];
  float *outs = NULL, *qs = NULL, *gates = NULL;
  int T = 0;
  for (int step = 0; step < 2; step++) {
    const int *lens = step ? lens2 : lens1, *poss = step ? pos2 : pos1;
    backend_batch b = make_batch(2, lens, poss, P);
    REQUIRE(be->set_batch(be, &b) == 0);
    T = b.n_tokens;
    float *qg = rnd((size_t)T * nh * 2 * hd, 1), *k = rnd((size_t)T * nkv * hd, 1),
          *v = rnd((size_t)T * nkv * hd, 1);
    backend_buf bqg = up(qg, (size_t)T * nh * 2 * hd), bk = up(k, (size_t)T * nkv * hd),
                bv = up(v, (size_t)T * nkv * hd), bq = mk((size_t)T * nh * hd),
                bgate = mk((size_t)T * nh * hd), bo = mk((size_t)T * nh * hd);
    be->qk_norm_rope(be, bqg, bk, QN, KN, nh, nkv, hd, rot, theta, 1e-6f, bq, bgate);
    be->attention(be, kp, vp, bq, bk, bv, nh, nkv, hd, 1.f / sqrtf((float)hd), bo);
    free(outs), free(qs), free(gates);
    outs = down(bo, (size_t)T * nh * hd);
    qs = down(bq, (size_t)T * nh * hd);
    gates = down(bgate, (size_t)T * nh * hd);
    float *ks = down(bk, (size_t)T * nkv * hd);
    /* reference: norm + rope in double, then attention */
    double worst_qk = 0, worst_o = 0;
    int gate_ok = 1;
    for (int t = 0; t < T; t++) {
      int s = b.seq[t], p = b.pos[t];
      for (int h = 0; h < nh + nkv; h++) {
        const float *src =
            h < nh ? qg + ((size_t)t * nh + h) * 2 * hd : k + ((size_t)t * nkv + h - nh) * hd;
        const float *w = h < nh ? qn : kn;
        double ss = 0, y[12];
        for (int i = 0; i < hd; i++) ss += (double)src[i] * src[i];
        for (int i = 0; i < hd; i++) y[i] = src[i] / sqrt(ss / hd + 1e-6) * (1 + w[i]);
        for (int i = 0; i < rot / 2; i++) {
          double a = p * pow(theta, -2.0 * i / rot), x0 = y[i], x1 = y[i + rot / 2];
          y[i] = x0 * cos(a) - x1 * sin(a);
          y[i + rot / 2] = x1 * cos(a) + x0 * sin(a);
        }
        const float *got =
            h < nh ? qs + ((size_t)t * nh + h) * hd : ks + ((size_t)t * nkv + h - nh) * hd;
        double e = err(got, y, hd);
        if (e > worst_qk) worst_qk = e;
        if (h >= nh)
          for (int i = 0; i < hd; i++)
            Kh[s][p][h - nh][i] = ks[((size_t)t * nkv + h - nh) * hd + i],
                         Vh[s][p][h - nh][i] = v[((size_t)t * nkv + h - nh) * hd + i];
        if (h < nh) gate_ok &= memcmp(gates + ((size_t)t * nh + h) * hd, src + hd, hd * 4) == 0;
      }
    }
    for (int t = 0; t < T; t++) {
      int s = b.seq[t], p = b.pos[t];
      for (int h = 0; h < nh; h++) {
        const float *q = qs + ((size_t)t * nh + h) * hd;
        int kvh = h / (nh / nkv);
        double sc[32], mx = -1e300, sum = 0, o[12] = {0};
        for (int j = 0; j <= p; j++) {
          double d = 0;
          for (int i = 0; i < hd; i++) d += (double)q[i] * Kh[s][j][kvh][i];
          sc[j] = d / sqrt((double)hd);
          if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j <= p; j++) sum += exp(sc[j] - mx);
        for (int j = 0; j <= p; j++)
          for (int i = 0; i < hd; i++) o[i] += exp(sc[j] - mx) / sum * Vh[s][j][kvh][i];
        double e = err(outs + ((size_t)t * nh + h) * hd, o, hd);
        if (e > worst_o) worst_o = e;
      }
    }
    EXPECT_MSG(worst_qk < 1e-5, "step %d: q/k norm+rope err %g", step, worst_qk);
    EXPECT_MSG(worst_o < 1e-5, "step %d: attention err %g", step, worst_o);
    EXPECT(gate_ok);
    free(qg), free(k), free(v), free(ks);
    be->free(be, bqg), be->free(be, bk), be->free(be, bv), be->free(be, bq), be->free(be, bgate),
        be->free(be, bo);
  }
  free(outs), free(qs), free(gates), free(qn), free(kn);
  be->free(be, kp), be->free(be, vp);
  be->weight_free(be, QN), be->weight_free(be, KN);
}

TEST(moe_ffn) {
  int T = 3, H = 16, E = 5, k = 2, I = 8, Is = 6;
  float *x = rnd((size_t)T * H, 1), *R = rnd((size_t)E * H, 1), *sgw = rnd(H, 0.5f);
  float *gw[5], *uw[5], *dw[5], *sg = rnd((size_t)Is * H, 0.5f), *su = rnd((size_t)Is * H, 0.5f),
                                *sd = rnd((size_t)H * Is, 0.5f);
  backend_weight G[5], U[5], D[5];
  for (int e = 0; e < E; e++) {
    gw[e] = rnd((size_t)I * H, 0.5f), uw[e] = rnd((size_t)I * H, 0.5f),
    dw[e] = rnd((size_t)H * I, 0.5f);
    G[e] = wt(gw[e], I, H), U[e] = wt(uw[e], I, H), D[e] = wt(dw[e], H, I);
  }
  backend_moe m = {E,
                   k,
                   1,
                   I,
                   Is,
                   wt(R, E, H),
                   G,
                   U,
                   D,
                   wt(sg, Is, H),
                   wt(su, Is, H),
                   wt(sd, H, Is),
                   wt(sgw, 1, H)};
  backend_buf bx = up(x, (size_t)T * H), bo = mk((size_t)T * H);
  be->moe(be, bx, &m, T, H, bo);
  float *o = down(bo, (size_t)T * H);
  double ref[3 * 16];
  for (int t = 0; t < T; t++) {
    const float *xt = x + t * H;
    double p[5], mx = -1e300, sum = 0;
    for (int e = 0; e < E; e++) {
      p[e] = 0;
      for (int i = 0; i < H; i++) p[e] += (double)R[e * H + i] * xt[i];
      if (p[e] > mx) mx = p[e];
    }
    for (int e = 0; e < E; e++) sum += (p[e] = exp(p[e] - mx));
    for (int e = 0; e < E; e++) p[e] /= sum;
    int used[5] = {0}, top[2];
    double wsum = 0;
    for (int r = 0; r < k; r++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
      used[best] = 1, top[r] = best, wsum += p[best];
    }
    for (int hh = 0; hh < H; hh++) ref[t * H + hh] = 0;
    for (int r = 0; r < k; r++) {
      int e = top[r];
      for (int hh = 0; hh < H; hh++) {
        double acc = 0;
        for (int i = 0; i < I; i++) {
          double a = 0, b = 0;
          for (int j = 0; j < H; j++)
            a += (double)gw[e][i * H + j] * xt[j], b += (double)uw[e][i * H + j] * xt[j];
          acc += dw[e][hh * I + i] * silu(a) * b;
        }
        ref[t * H + hh] += p[e] / wsum * acc;
      }
    }
    double gs = 0;
    for (int j = 0; j < H; j++) gs += (double)sgw[j] * xt[j];
    for (int hh = 0; hh < H; hh++) {
      double acc = 0;
      for (int i = 0; i < Is; i++) {
        double a = 0, b = 0;
        for (int j = 0; j < H; j++)
          a += (double)sg[i * H + j] * xt[j], b += (double)su[i * H + j] * xt[j];
        acc += sd[hh * Is + i] * silu(a) * b;
      }
      ref[t * H + hh] += sig(gs) * acc;
    }
  }
  EXPECT_MSG(err(o, ref, (size_t)T * H) < 1e-5, "moe err %g", err(o, ref, (size_t)T * H));
  for (int e = 0; e < E; e++) {
    free(gw[e]), free(uw[e]), free(dw[e]);
    be->weight_free(be, G[e]), be->weight_free(be, U[e]), be->weight_free(be, D[e]);
  }
  be->weight_free(be, m.router), be->weight_free(be, m.shared_gate),
      be->weight_free(be, m.shared_up), be->weight_free(be, m.shared_down),
      be->weight_free(be, m.shared_expert_gate);
  free(x), free(R), free(sgw), free(sg), free(su), free(sd), free(o);
  be->free(be, bx), be->free(be, bo);
}

/* conv1d with state over pieces (a piece at 0 with garbage in its slot, a resuming piece, a
 * 1-token step), then gdn_gates and gated_rmsnorm. */
TEST(deltanet_conv_gates_norm) {
  int C = 10, K = 4, nk = 1, nv = 2, dk = 2, dv = 3; /* C = 2*1*2 + 2*3 */
  int lens[3] = {6, 4, 1}, poss[3] = {0, 9, 30};
  backend_batch b = make_batch(3, lens, poss, 1);
  REQUIRE(be->set_batch(be, &b) == 0);
  int T = b.n_tokens;
  float *x = rnd((size_t)T * C, 1), *w = rnd((size_t)C * K, 0.5f),
        *st = rnd((size_t)3 * C * (K - 1), 1);
  backend_weight Wc = wt(w, C, K);
  backend_buf bx = up(x, (size_t)T * C), bs = up(st, (size_t)3 * C * (K - 1)),
              bo = mk((size_t)T * C);
  be->conv1d(be, bs, bx, Wc, C, K, bo);
  float *o = down(bo, (size_t)T * C), *st2 = down(bs, (size_t)3 * C * (K - 1));
  double ref[11 * 10], rst[3 * 10 * 3];
  for (int s = 0; s < 3; s++)
    for (int c = 0; c < C; c++) {
      double hist[64];
      int n = 0;
      for (int j = 0; j < K - 1; j++) hist[n++] = poss[s] == 0 ? 0 : st[(s * C + c) * (K - 1) + j];
      for (int r = 0; r < lens[s]; r++) hist[n++] = x[(b.seq_start[s] + r) * C + c];
      for (int r = 0; r < lens[s]; r++) {
        double a = 0;
        for (int j = 0; j < K; j++) a += w[c * K + j] * hist[r + j];
        ref[(b.seq_start[s] + r) * C + c] = silu(a);
      }
      for (int j = 0; j < K - 1; j++) rst[(s * C + c) * (K - 1) + j] = hist[n - (K - 1) + j];
    }
  EXPECT_MSG(err(o, ref, (size_t)T * C) < 1e-6, "conv err %g", err(o, ref, (size_t)T * C));
  EXPECT(err(st2, rst, (size_t)3 * C * (K - 1)) == 0);
  /* gates */
  float *bb = rnd((size_t)T * nv, 3), *aa = rnd((size_t)T * nv, 12), *Al = rnd(nv, 1),
        *dt = rnd(nv, 1);
  aa[0] = 25.f; /* softplus linear branch */
  backend_weight WA = wt(Al, 1, nv), WD = wt(dt, 1, nv);
  backend_buf bbb = up(bb, (size_t)T * nv), baa = up(aa, (size_t)T * nv),
              bbeta = be->alloc(be, BACKEND_KIND_F32, (size_t)T * nv),
              bg = be->alloc(be, BACKEND_KIND_F32, (size_t)T * nv);
  be->gdn_gates(be, bo, bbb, baa, WA, WD, nk, nv, dk, dv, bbeta, bg);
  float *qkv = down(bo, (size_t)T * C), *beta = down(bbeta, (size_t)T * nv),
        *g = down(bg, (size_t)T * nv);
  double rq[11 * 10], rb[22], rg[22];
  for (int t = 0; t < T; t++) {
    for (int c = 0; c < C; c++) rq[t * C + c] = o[t * C + c];
    for (int h = 0; h < 2 * nk; h++) {
      double ss = 0;
      for (int i = 0; i < dk; i++) ss += (double)o[t * C + h * dk + i] * o[t * C + h * dk + i];
      for (int i = 0; i < dk; i++)
        rq[t * C + h * dk + i] =
            o[t * C + h * dk + i] / sqrt(ss + 1e-6) * (h < nk ? 1 / sqrt((double)dk) : 1);
    }
    for (int h = 0; h < nv; h++) {
      double a = (double)aa[t * nv + h] + dt[h];
      rb[t * nv + h] = sig(bb[t * nv + h]);
      rg[t * nv + h] = -exp(Al[h]) * (a > 20 ? a : log1p(exp(a)));
    }
  }
  EXPECT_MSG(err(qkv, rq, (size_t)T * C) < 1e-6, "l2norm err %g", err(qkv, rq, (size_t)T * C));
  EXPECT(err(beta, rb, (size_t)T * nv) < 1e-6);
  EXPECT_MSG(err(g, rg, (size_t)T * nv) < 1e-6, "g err %g", err(g, rg, (size_t)T * nv));
  /* gated rmsnorm */
  float *ov = rnd((size_t)T * nv * dv, 1), *z = rnd((size_t)T * nv * dv, 2), *nw = rnd(dv, 1);
  backend_weight WN = wt(nw, 1, dv);
  backend_buf bov = up(ov, (size_t)T * nv * dv), bz = up(z, (size_t)T * nv * dv);
  be->gated_rmsnorm(be, bov, bz, WN, T, nv, dv, 1e-6f, bov);
  float *gn = down(bov, (size_t)T * nv * dv);
  double rgn[11 * 6];
  for (int i = 0; i < T * nv; i++) {
    double ss = 0;
    for (int j = 0; j < dv; j++) ss += (double)ov[i * dv + j] * ov[i * dv + j];
    for (int j = 0; j < dv; j++)
      rgn[i * dv + j] = nw[j] * ov[i * dv + j] / sqrt(ss / dv + 1e-6) * silu(z[i * dv + j]);
  }
  EXPECT_MSG(err(gn, rgn, (size_t)T * nv * dv) < 1e-6, "gated norm err %g",
             err(gn, rgn, (size_t)T * nv * dv));
  free(x), free(w), free(st), free(o), free(st2), free(bb), free(aa), free(Al), free(dt), free(qkv),
      free(beta), free(g), free(ov), free(z), free(nw), free(gn);
  be->free(be, bx), be->free(be, bs), be->free(be, bo), be->free(be, bbb), be->free(be, baa),
      be->free(be, bbeta), be->free(be, bg), be->free(be, bov), be->free(be, bz);
  be->weight_free(be, Wc), be->weight_free(be, WA), be->weight_free(be, WD),
      be->weight_free(be, WN);
}

TEST(logits_rows_and_memory_ops) {
  int T = 4, H = 9, V = 13;
  backend_batch b = make_batch(1, (int[]){4}, (int[]){0}, 1);
  int32_t rows[2] = {3, 1};
  b.n_out = 2;
  b.out_rows = rows;
  REQUIRE(be->set_batch(be, &b) == 0);
  float *x = rnd((size_t)T * H, 1), *nw = rnd(H, 0.1f), *W = rnd((size_t)V * H, 1);
  backend_weight NW = wt(nw, 1, H), WW = wt(W, V, H);
  backend_buf bx = up(x, (size_t)T * H), bo = be->alloc(be, BACKEND_KIND_F32, (size_t)2 * V);
  be->logits(be, bx, NW, 1e-6f, WW, H, V, bo);
  float *o = down(bo, (size_t)2 * V);
  double ref[2 * 13];
  for (int i = 0; i < 2; i++) {
    const float *xr = x + rows[i] * H;
    double ss = 0, xn[9];
    for (int j = 0; j < H; j++) ss += (double)xr[j] * xr[j];
    for (int j = 0; j < H; j++) xn[j] = xr[j] / sqrt(ss / H + 1e-6) * (1 + nw[j]);
    for (int v = 0; v < V; v++) {
      ref[i * V + v] = 0;
      for (int j = 0; j < H; j++) ref[i * V + v] += xn[j] * W[v * H + j];
    }
  }
  EXPECT_MSG(err(o, ref, (size_t)2 * V) < 1e-5, "logits err %g", err(o, ref, (size_t)2 * V));
  /* copy / zero / read / write, byte offsets */
  float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
  backend_buf a = up(src, 8), c = be->alloc(be, BACKEND_KIND_F32, 8);
  be->zero(be, c, 0, 32);
  be->copy(be, c, 8, a, 16, 12);
  be->read(be, c, 0, got, 32);
  EXPECT(got[0] == 0 && got[1] == 0 && got[2] == 5 && got[3] == 6 && got[4] == 7 && got[5] == 0);
  EXPECT(be->sync(be, NULL, 0) == 0);
  free(x), free(nw), free(W), free(o);
  be->free(be, bx), be->free(be, bo), be->free(be, a), be->free(be, c);
  be->weight_free(be, NW), be->weight_free(be, WW);
}

/* The optional argmax op: the sampler's greedy choice on every row (ties, NaN, -0), on one
 * and on two threads, with and without the max values. */
TEST(argmax_matches_sampler) {
  REQUIRE(be->argmax);
  int n = 7, V = 1003;
  float *x = malloc(sizeof(float) * n * V);
  for (int i = 0; i < n * V; i++) {
    float f = frand();
    x[i] = (float)(int)(f * 6); /* few distinct values: many ties */
  }
  x[1 * V + 17] = NAN; /* a NaN inside a row */
  x[2 * V + 0] = NAN;  /* a NaN first: the scan stays at 0 */
  for (int i = 0; i < V; i++) x[3 * V + i] = i % 2 ? 0.0f : -0.0f; /* -0 and +0 tie */
  x[4 * V + V - 1] = 100;                                          /* the last entry */
  for (int i = 0; i < V; i++) x[5 * V + i] = -INFINITY;
  backend *b1 = backend_cpu_create(1);
  REQUIRE(b1);
  backend *bs[2] = {be, b1};
  for (int k = 0; k < 2; k++) {
    backend *b = bs[k];
    backend_buf bx = b->alloc(b, BACKEND_KIND_F32, (size_t)n * V);
    backend_buf bi = b->alloc(b, BACKEND_KIND_I32, n), bm = b->alloc(b, BACKEND_KIND_F32, n);
    b->write(b, bx, 0, x, sizeof(float) * n * V);
    b->argmax(b, bx, n, V, bi, bm);
    int32_t ids[7];
    float mv[7];
    b->read(b, bi, 0, ids, sizeof ids);
    b->read(b, bm, 0, mv, sizeof mv);
    for (int r = 0; r < n; r++) {
      int32_t want = sampler_argmax(x + (size_t)r * V, V);
      EXPECT_MSG(ids[r] == want, "threads %d row %d: id %d, sampler %d", k ? 1 : 2, r, ids[r],
                 want);
      EXPECT(memcmp(&mv[r], &x[(size_t)r * V + want], sizeof(float)) == 0);
    }
    EXPECT_EQ_INT(ids[2], 0);
    EXPECT_EQ_INT(ids[4], V - 1);
    EXPECT_EQ_INT(ids[5], 0);
    b->argmax(b, bx, n, V, bi, NULL); /* without max values */
    int32_t ids2[7];
    b->read(b, bi, 0, ids2, sizeof ids2);
    EXPECT(memcmp(ids, ids2, sizeof ids) == 0);
    b->free(b, bx), b->free(b, bi), b->free(b, bm);
  }
  EXPECT(be->host_alloc == NULL && be->host_free == NULL); /* plain malloc is the fastest here */
  b1->destroy(b1);
  free(x);
}

/* The same rows computed with 1 and 2 threads, alone and inside a bigger batch: same bits. */
TEST(thread_and_batch_invariance) {
  backend *b1 = backend_cpu_create(1), *b2 = backend_cpu_create(2);
  REQUIRE(b1 && b2);
  int K = 100, N = 77, T = 9;
  float *x = rnd((size_t)T * K, 1), *w = rnd((size_t)N * K, 1);
  float *y1 = malloc(sizeof(float) * N), *y2 = malloc(sizeof(float) * T * N);
  backend_weight W1 = b1->weight_upload(b1, w, DTYPE_F32, N, K),
                 W2 = b2->weight_upload(b2, w, DTYPE_F32, N, K);
  backend_buf x1 = b1->alloc(b1, BACKEND_KIND_ACT, K), o1 = b1->alloc(b1, BACKEND_KIND_ACT, N);
  backend_buf x2 = b2->alloc(b2, BACKEND_KIND_ACT, (size_t)T * K),
              o2 = b2->alloc(b2, BACKEND_KIND_ACT, (size_t)T * N);
  b2->write(b2, x2, 0, x, sizeof(float) * T * K);
  b2->matmul(b2, x2, W2, T, K, N, o2);
  b2->read(b2, o2, 0, y2, sizeof(float) * T * N);
  int ok = 1;
  for (int t = 0; t < T; t++) {
    b1->write(b1, x1, 0, x + t * K, sizeof(float) * K);
    b1->matmul(b1, x1, W1, 1, K, N, o1);
    b1->read(b1, o1, 0, y1, sizeof(float) * N);
    ok &= memcmp(y1, y2 + t * N, sizeof(float) * N) == 0;
  }
  EXPECT(ok);
  b1->free(b1, x1), b1->free(b1, o1), b2->free(b2, x2), b2->free(b2, o2);
  b1->weight_free(b1, W1), b2->weight_free(b2, W2);
  b1->destroy(b1), b2->destroy(b2);
  free(x), free(w), free(y1), free(y2);
}

/* The sample op (sample_rule.h by radix descent) gives the host sampler's ids. */
TEST(sample_matches_sampler) {
  int checked = 0, bad = 0;
  sample_cases_run(be, 37, 64, 0, &checked, &bad);
  sample_cases_run(be, 4000, 64, 0, &checked, &bad);
  sample_cases_run(be, 151936, 16, 1, &checked, &bad);
  EXPECT_MSG(bad == 0, "%d of %d ids differ from the sampler's", bad, checked);
  EXPECT(checked > 2000);
}

int main(void) {
  be = backend_cpu_create(2);
  if (!be) return 1;
  RUN(weight_conversion_exact);
  RUN(matmul_rmsnorm_elementwise);
  RUN(attention_paged_gqa);
  RUN(moe_ffn);
  RUN(deltanet_conv_gates_norm);
  RUN(logits_rows_and_memory_ops);
  RUN(thread_and_batch_invariance);
  RUN(argmax_matches_sampler);
  RUN(sample_matches_sampler);
  be->destroy(be);
  TEST_MAIN_END();
}
