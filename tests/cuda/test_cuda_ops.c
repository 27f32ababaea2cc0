/* test_cuda_ops — every CUDA backend op against the CPU reference backend on random inputs
 * (GPU machine only; built by `make CUDA=1 cuda-tests`, run by scripts/device/check.sh).
 *
 * Both backends get the same inputs (values rounded to bf16 first, so the only differences
 * are the CUDA backend's bf16 activations and its sum orders). Outputs are poisoned (NaN)
 * before each run; each check is ||cuda - cpu|| / ||cpu|| within a tolerance stated per op
 * (bf16 keeps 8 mantissa bits: one rounding is <= 2^-9 relative, a few chained ops stay
 * well under 1e-2). Sizes are odd, pieces are ragged, prefill pieces resume mid-chunk from
 * non-zero states, and prefill pieces and decode rows share one step. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "model/fp8.h"
#include "sampler/sampler.h"
#include "ref_io.h"
#include "sample_cases.h"
#include "test.h"

static backend *CPU, *GPU;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float urand(void) { /* [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

static float bfr(float x) { return b2f(f2b(x)); }

static float *rand_vec(size_t n, float scale) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = bfr(urand() * scale);
  return v;
}

/* Writes host floats into a buffer of `kind` (converted to the backend's element type). */
static void put(backend *be, backend_buf buf, backend_kind kind, const float *h, size_t n) {
  size_t es = be->kind_size(be, kind);
  if (es == 4) {
    be->write(be, buf, 0, h, n * 4);
    return;
  }
  uint16_t *t = malloc((n ? n : 1) * 2);
  for (size_t i = 0; i < n; i++) t[i] = f2b(h[i]);
  be->write(be, buf, 0, t, n * 2);
  free(t);
}

static backend_buf mk(backend *be, backend_kind kind, const float *h, size_t n) {
  backend_buf b = be->alloc(be, kind, n ? n : 1);
  if (h) put(be, b, kind, h, n);
  return b;
}

static void poison(backend *be, backend_buf buf, backend_kind kind, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  put(be, buf, kind, p, n);
  free(p);
}

static float *get(backend *be, backend_buf buf, backend_kind kind, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  size_t es = be->kind_size(be, kind);
  if (es == 4) {
    be->read(be, buf, 0, h, n * 4);
  } else {
    uint16_t *t = malloc((n ? n : 1) * 2);
    be->read(be, buf, 0, t, n * 2);
    for (size_t i = 0; i < n; i++) h[i] = b2f(t[i]);
    free(t);
  }
  return h;
}

static double relerr(const float *a, const float *ref, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double x = (double)a[i] - (double)ref[i];
    d += x * x;
    r += (double)ref[i] * ref[i];
  }
  if (!(r > 0)) return d == 0 ? 0 : INFINITY;
  return sqrt(d / r);
}

static int n_checks;
/* Compares buffer `bc` (cpu) and `bg` (cuda) of n elements. */
#define CMP(bc, bg, kind, n, tol, what)                                          \
  do {                                                                           \
    float *rc_ = get(CPU, bc, kind, n), *rg_ = get(GPU, bg, kind, n);            \
    double e_ = relerr(rg_, rc_, n);                                             \
    n_checks++;                                                                  \
    printf("  %-28s rel err %.3e (tol %.0e)\n", what, e_, (double)(tol));        \
    EXPECT_MSG(e_ <= (tol), "%s: rel err %.3e > %.0e", what, e_, (double)(tol)); \
    free(rc_);                                                                   \
    free(rg_);                                                                   \
  } while (0)

/* a pair of buffers with the same contents on both backends */
typedef struct {
  backend_buf c, g;
  backend_kind kind;
  size_t n;
} pair;

static pair pr(backend_kind kind, const float *h, size_t n) {
  pair p = {mk(CPU, kind, h, n), mk(GPU, kind, h, n), kind, n};
  return p;
}
static pair pr_out(backend_kind kind, size_t n) {
  pair p = {mk(CPU, kind, NULL, n), mk(GPU, kind, NULL, n), kind, n};
  poison(CPU, p.c, kind, n);
  poison(GPU, p.g, kind, n);
  return p;
}
static void pr_free(pair p) {
  CPU->free(CPU, p.c);
  GPU->free(GPU, p.g);
}
typedef struct {
  backend_weight c, g;
} wpair;
static wpair wup(const float *h, int64_t rows, int64_t cols) {
  wpair w = {CPU->weight_upload(CPU, h, DTYPE_F32, rows, cols),
             GPU->weight_upload(GPU, h, DTYPE_F32, rows, cols)};
  return w;
}
/* an MoE router: uploaded as exact (the GPU keeps an fp32 copy for routing) */
static wpair wup_exact(const float *h, int64_t rows, int64_t cols) {
  wpair w = {CPU->weight_upload(CPU, h, DTYPE_F32, rows, cols),
             GPU->weight_upload_exact(GPU, h, DTYPE_F32, rows, cols)};
  return w;
}
static void wfree(wpair w) {
  CPU->weight_free(CPU, w.c);
  GPU->weight_free(GPU, w.g);
}

/* ---- batch ---- */

#define PIECES_MAX 40
typedef struct {
  int n;
  int len[PIECES_MAX], pos[PIECES_MAX], slot[PIECES_MAX];
} pieces;

static int T_of(const pieces *p) {
  int T = 0;
  for (int i = 0; i < p->n; i++) T += p->len[i];
  return T;
}

/* Sets the same batch on both backends; piece s gets pages s*MAXP + perm. Returns max_pages. */
#define MAXP 32
static int32_t g_pt[PIECES_MAX * MAXP];
static backend *g_also; /* a third backend set_batch also sets (NULL: none) */
static void set_batch(const pieces *p, int n_out, const int32_t *out_rows) {
  static int32_t tokens[4096], pos[4096], seq[4096], st[PIECES_MAX];
  int T = 0;
  for (int s = 0; s < p->n; s++) {
    st[s] = T;
    for (int r = 0; r < p->len[s]; r++, T++) {
      tokens[T] = (int32_t)((unsigned)(T * 7919 + s) % 37u);
      pos[T] = p->pos[s] + r;
      seq[T] = s;
    }
  }
  for (int s = 0; s < p->n; s++)
    for (int j = 0; j < MAXP; j++) g_pt[s * MAXP + j] = s * MAXP + (MAXP - 1 - j); /* reversed */
  backend_batch b = {T,      p->n,    tokens, pos,  seq,   st,       p->len,
                     p->pos, p->slot, g_pt,   MAXP, n_out, out_rows, NULL};
  EXPECT(CPU->set_batch(CPU, &b) == 0);
  EXPECT(GPU->set_batch(GPU, &b) == 0);
  if (g_also) EXPECT(g_also->set_batch(g_also, &b) == 0);
}

static void gpu_ok(void) {
  char err[256] = "";
  int rc = GPU->sync(GPU, err, sizeof err);
  EXPECT_MSG(rc == 0, "cuda sync failed: %s", err);
}

/* A second CUDA backend with the paths of t forced (backend_cuda_test; designated initialisers:
 * the rest zero, the product's choice); NULL (reported) when it cannot be created. */
#define gpu_with(...) gpu_with_t((backend_cuda_test){__VA_ARGS__})
static backend *gpu_with_t(backend_cuda_test t) {
  char err[256] = "";
  backend *be = backend_cuda_create_test(0, &(backend_options){0}, &t, err, sizeof err);
  EXPECT_MSG(be != NULL, "create with forced paths: %s", err);
  return be;
}

/* Runs fn with GPU swapped for a second backend with the paths of t forced. */
static void with_gpu(backend_cuda_test t, void (*fn)(void)) {
  backend *g2 = gpu_with_t(t);
  if (!g2) return;
  backend *save = GPU;
  GPU = g2;
  fn();
  gpu_ok();
  GPU = save;
  g2->destroy(g2);
}

/* ---- tests ---- */

TEST(memory) {
  size_t n = 1000;
  float *h = rand_vec(n, 1.f);
  backend_buf a = mk(GPU, BACKEND_KIND_F32, h, n), b = mk(GPU, BACKEND_KIND_F32, NULL, n);
  poison(GPU, b, BACKEND_KIND_F32, n);
  GPU->copy(GPU, b, 40, a, 80, 400); /* b[10..110) = a[20..120) */
  GPU->zero(GPU, b, 800, 400);       /* b[200..300) = 0 */
  float *r = get(GPU, b, BACKEND_KIND_F32, n);
  int bad = 0;
  for (int i = 10; i < 110; i++) bad += r[i] != h[i + 10];
  for (int i = 200; i < 300; i++) bad += r[i] != 0.f;
  bad += !isnan(r[0]) + !isnan(r[150]);
  EXPECT_MSG(bad == 0, "%d wrong elements after copy/zero", bad);
  EXPECT_EQ_INT(GPU->kind_size(GPU, BACKEND_KIND_ACT), 2);
  EXPECT_EQ_INT(GPU->kind_size(GPU, BACKEND_KIND_KV), 2);
  EXPECT_EQ_INT(GPU->kind_size(GPU, BACKEND_KIND_F32), 4);
  GPU->free(GPU, a);
  GPU->free(GPU, b);
  free(r);
  free(h);
  gpu_ok();
}

TEST(embed) {
  pieces p = {2, {5, 3}, {0, 9}, {0, 1}};
  set_batch(&p, 0, NULL);
  int V = 37, H = 203, T = T_of(&p);
  float *E = rand_vec((size_t)V * H, 1.f);
  wpair w = wup(E, V, H);
  pair out = pr_out(BACKEND_KIND_ACT, (size_t)T * H);
  CPU->embed(CPU, w.c, H, out.c);
  GPU->embed(GPU, w.g, H, out.g);
  CMP(out.c, out.g, BACKEND_KIND_ACT, out.n, 1e-6, "embed");
  gpu_ok();
  pr_free(out);
  wfree(w);
  free(E);
}

/* n = 1003: the one-element kernel; 4096, 2560 (320 threads) and 8192 (1024): the 16-byte one */
TEST(rmsnorm) {
  int T = 7;
  int ns[4] = {1003, 4096, 2560, 8192};
  for (int k = 0; k < 4; k++) {
    int n = ns[k];
    float *x = rand_vec((size_t)T * n, 2.f), *a = rand_vec((size_t)T * n, 1.f),
          *w = rand_vec(n, 0.5f);
    wpair wp = wup(w, 1, n);
    pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * n), pa = pr(BACKEND_KIND_ACT, a, (size_t)T * n);
    pair y = pr_out(BACKEND_KIND_ACT, (size_t)T * n);
    CPU->rmsnorm(CPU, px.c, pa.c, wp.c, T, n, 1e-6f, y.c);
    GPU->rmsnorm(GPU, px.g, pa.g, wp.g, T, n, 1e-6f, y.g);
    CMP(px.c, px.g, BACKEND_KIND_ACT, px.n, 4e-3, "rmsnorm residual x+add");
    CMP(y.c, y.g, BACKEND_KIND_ACT, y.n, 8e-3, "rmsnorm y (with add)");
    pair y2 = pr_out(BACKEND_KIND_ACT, (size_t)T * n);
    CPU->rmsnorm(CPU, px.c, NULL, wp.c, T, n, 1e-6f, y2.c);
    GPU->rmsnorm(GPU, px.g, NULL, wp.g, T, n, 1e-6f, y2.g);
    CMP(y2.c, y2.g, BACKEND_KIND_ACT, y2.n, 8e-3, "rmsnorm y (no add)");
    gpu_ok();
    pr_free(px);
    pr_free(pa);
    pr_free(y);
    pr_free(y2);
    wfree(wp);
    free(x);
    free(a);
    free(w);
  }
}

/* n = 10007: the scalar kernel; n = 10000: 8 elements per thread (16-byte aligned buffers) */
static void elementwise_case(size_t n) {
  float *x = rand_vec(n, 3.f), *y = rand_vec(n, 3.f);
  pair a = pr(BACKEND_KIND_ACT, x, n), b = pr(BACKEND_KIND_ACT, y, n);
  CPU->add(CPU, a.c, b.c, n);
  GPU->add(GPU, a.g, b.g, n);
  CMP(a.c, a.g, BACKEND_KIND_ACT, n, 4e-3, "add");
  put(CPU, a.c, a.kind, x, n);
  put(GPU, a.g, a.kind, x, n);
  CPU->sigmoid_mul(CPU, a.c, b.c, n);
  GPU->sigmoid_mul(GPU, a.g, b.g, n);
  CMP(a.c, a.g, BACKEND_KIND_ACT, n, 4e-3, "sigmoid_mul");
  put(CPU, a.c, a.kind, x, n);
  put(GPU, a.g, a.kind, x, n);
  pair o = pr_out(BACKEND_KIND_ACT, n);
  CPU->swiglu(CPU, a.c, b.c, n, o.c);
  GPU->swiglu(GPU, a.g, b.g, n, o.g);
  CMP(o.c, o.g, BACKEND_KIND_ACT, n, 4e-3, "swiglu");
  CPU->swiglu(CPU, a.c, b.c, n, a.c); /* aliasing out = gate */
  GPU->swiglu(GPU, a.g, b.g, n, a.g);
  CMP(a.c, a.g, BACKEND_KIND_ACT, n, 4e-3, "swiglu in place");
  gpu_ok();
  pr_free(a);
  pr_free(b);
  pr_free(o);
  free(x);
  free(y);
}

TEST(elementwise) {
  elementwise_case(10007);
  elementwise_case(10000);
}

/* T <= 4 with K % 8 == 0 takes the GEMV path (ragged last lane pass at K = 264); 5 .. 16
 * rows with K % 128 == 0 the skinny GEMM (cuda_sgemm.cu: one K slice at N = 32768, several
 * with partial sums at N = 2560, N not a multiple of 16, one and two 8-row column blocks);
 * products of <= 64 columns above that, up to 128 rows, the narrow kernel (40, 100 and 125
 * rows, the last with a 5-row tail); the rest cuBLAS (K = 100; 64 .. 129 rows). */
static void matmul_cases(void) {
  int Ts[15] = {1, 5, 67, 8, 3, 16, 128, 13, 11, 129, 6, 64, 40, 100, 125};
  int Ks[15] = {264,  100,  1024, 2560, 9216, 9216, 9216, 256,
                2560, 1024, 128,  4096, 2560, 1024, 2560};
  int Ns[15] = {333, 64, 515, 300, 77, 2560, 2560, 48, 32768, 515, 7, 2560, 32, 64, 33};
  for (int c = 0; c < 15; c++) {
    int T = Ts[c], K = Ks[c], N = Ns[c];
    float *x = rand_vec((size_t)T * K, 1.f), *W = rand_vec((size_t)N * K, 0.1f);
    wpair w = wup(W, N, K);
    pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * K), y = pr_out(BACKEND_KIND_ACT, (size_t)T * N);
    CPU->matmul(CPU, px.c, w.c, T, K, N, y.c);
    GPU->matmul(GPU, px.g, w.g, T, K, N, y.g);
    char what[64];
    snprintf(what, sizeof what, "matmul T=%d K=%d N=%d", T, K, N);
    CMP(y.c, y.g, BACKEND_KIND_ACT, y.n, 6e-3, what);
    gpu_ok();
    pr_free(px);
    pr_free(y);
    wfree(w);
    free(x);
    free(W);
  }
}

TEST(matmul) { matmul_cases(); }

/* A decode step of T one-row pieces (sequence i at position 3 + i, page i) on GPU and CPU. */
static void decode_rows_batch(int T) {
  static int32_t tok[128], pos[128], seq[128], st[128], len[128], pt[128];
  for (int i = 0; i < T; i++) {
    tok[i] = (int32_t)((unsigned)(i * 7919) % 37u);
    pos[i] = 3 + i;
    seq[i] = st[i] = pt[i] = i;
    len[i] = 1;
  }
  backend_batch b = {T, T, tok, pos, seq, st, len, pos, seq, pt, 1, 0, NULL, NULL};
  EXPECT(CPU->set_batch(CPU, &b) == 0);
  EXPECT(GPU->set_batch(GPU, &b) == 0);
}

/* ---- FP8 weights (weight_upload_fp8, cuda_fp8.cu) ----
 * Random weights quantized by model/fp8.c in bn x bk blocks: the GPU gets the e4m3 bytes and
 * scales, the CPU their exact fp32 dequantization (what it computes from an FP8 checkpoint). */
typedef struct {
  wpair w;
  int N, K;
} fp8w;

static fp8w fp8_up(int N, int K, int bn, int bk, float scale) {
  float *W = rand_vec((size_t)N * K, scale), *deq = malloc((size_t)N * K * sizeof *deq);
  int64_t ns = fp8_scale_rows(N, bn) * fp8_scale_cols(K, bk);
  uint8_t *q = malloc((size_t)N * K);
  float *s = malloc((size_t)ns * sizeof *s);
  tensor src = {.data = W, .dt = DTYPE_F32, .ndim = 2, .shape = {N, K}};
  EXPECT(fp8_quantize(&src, bn, bk, q, s) == 0);
  tensor v = fp8_view(q, s, N, K, bn, bk);
  fp8_dequantize(&v, 0, N, deq);
  fp8w r = {{CPU->weight_upload(CPU, deq, DTYPE_F32, N, K),
             GPU->weight_upload_fp8(GPU, q, s, N, K, bn, bk)},
            N,
            K};
  EXPECT(r.w.g != NULL);
  n_checks++;
  EXPECT_MSG(GPU->weight_bytes(GPU, r.w.g) == (size_t)N * K + (size_t)ns * 4,
             "fp8 weight [%d, %d]: %zu device bytes", N, K, GPU->weight_bytes(GPU, r.w.g));
  free(W), free(deq), free(q), free(s);
  return r;
}

/* One FP8 product per row count: T <= 4 the FP8 GEMV (16-byte path where K and bk are multiples
 * of 16, else the scalar loop), more rows the dequantized bf16 paths (skinny GEMM, cuBLAS; the
 * dequantization's scalar loop at K = 100); edge blocks in N and K; 128 x 128 and 64 x 64 blocks.
 */
static void fp8_matmul_cases(void) {
  struct {
    int K, N, bn, bk;
  } sh[8] = {{256, 384, 128, 128}, {2560, 300, 128, 128}, {1088, 130, 128, 128}, {1040, 96, 64, 64},
             {200, 130, 64, 64},   {512, 32, 128, 128},   {1024, 257, 64, 128},  {100, 70, 64, 64}};
  int Ts[9] = {1, 2, 3, 4, 5, 6, 9, 33, 17};
  for (int c = 0; c < 8; c++) {
    int K = sh[c].K, N = sh[c].N;
    fp8w w = fp8_up(N, K, sh[c].bn, sh[c].bk, 0.1f);
    for (int i = 0; i < 9; i++) {
      int T = Ts[i];
      float *x = rand_vec((size_t)T * K, 1.f);
      pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * K), y = pr_out(BACKEND_KIND_ACT, (size_t)T * N);
      CPU->matmul(CPU, px.c, w.w.c, T, K, N, y.c);
      GPU->matmul(GPU, px.g, w.w.g, T, K, N, y.g);
      char what[64];
      snprintf(what, sizeof what, "fp8 matmul %dx%d T=%d K=%d N=%d", sh[c].bn, sh[c].bk, T, K, N);
      CMP(y.c, y.g, BACKEND_KIND_ACT, y.n, 6e-3, what);
      gpu_ok();
      pr_free(px);
      pr_free(y);
      free(x);
    }
    wfree(w.w);
  }
}

TEST(fp8_matmul) { fp8_matmul_cases(); }

/* An FP8 dense block recorded in decode steps of T rows, three times (direct, captured,
 * replayed): q and k of one x (k_gemv_multi), gate, up, swiglu (k_gemv_glu), down. Each output
 * within tolerance of the CPU, the replays bit-identical to the first step, and the recorder's
 * fusions applied at the GEMV path's rows (FP8 rows), none above (the tensor-core kernel). */
static void fp8_decode_case(int T) {
  const int H = 512, I = 1024;
  fp8w wq = fp8_up(640, H, 128, 128, 0.05f), wk = fp8_up(128, H, 128, 128, 0.05f),
       wg = fp8_up(I, H, 128, 128, 0.05f), wu = fp8_up(I, H, 128, 128, 0.05f),
       wd = fp8_up(H, I, 128, 128, 0.05f);
  float *x = rand_vec((size_t)T * H, 1.f);
  pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * H);
  pair yq = pr_out(BACKEND_KIND_ACT, (size_t)T * 640),
       yk = pr_out(BACKEND_KIND_ACT, (size_t)T * 128);
  pair g = pr_out(BACKEND_KIND_ACT, (size_t)T * I), u = pr_out(BACKEND_KIND_ACT, (size_t)T * I);
  pair yd = pr_out(BACKEND_KIND_ACT, (size_t)T * H);
  pair *outs[3] = {&yq, &yk, &yd};
  uint16_t *first[3] = {NULL, NULL, NULL};
  long st0[6], st1[6];
  backend_cuda_graph_stats(GPU, st0);
  for (int step = 0; step < 3; step++) {
    decode_rows_batch(T);
    backend *bes[2] = {GPU, CPU};
    for (int b = 0; b < (step == 0 ? 2 : 1); b++) {
      backend *be = bes[b];
      int gp = be == GPU;
      be->matmul(be, gp ? px.g : px.c, gp ? wq.w.g : wq.w.c, T, H, 640, gp ? yq.g : yq.c);
      be->matmul(be, gp ? px.g : px.c, gp ? wk.w.g : wk.w.c, T, H, 128, gp ? yk.g : yk.c);
      be->matmul(be, gp ? px.g : px.c, gp ? wg.w.g : wg.w.c, T, H, I, gp ? g.g : g.c);
      be->matmul(be, gp ? px.g : px.c, gp ? wu.w.g : wu.w.c, T, H, I, gp ? u.g : u.c);
      be->swiglu(be, gp ? g.g : g.c, gp ? u.g : u.c, (size_t)T * I, gp ? g.g : g.c);
      be->matmul(be, gp ? g.g : g.c, gp ? wd.w.g : wd.w.c, T, I, H, gp ? yd.g : yd.c);
    }
    for (int j = 0; j < 3; j++) {
      size_t n = outs[j]->n;
      uint16_t *r = malloc(n * 2);
      EXPECT(GPU->read(GPU, outs[j]->g, 0, r, n * 2) == 0);
      if (step == 0) {
        char what[64];
        snprintf(what, sizeof what, "fp8 decode T=%d output %d", T, j);
        CMP(outs[j]->c, outs[j]->g, BACKEND_KIND_ACT, n, j == 2 ? 1e-2 : 6e-3, what);
        first[j] = r;
      } else {
        EXPECT_MSG(memcmp(first[j], r, n * 2) == 0, "fp8 decode T=%d output %d: step %d differs", T,
                   j, step);
        free(r);
      }
    }
  }
  backend_cuda_graph_stats(GPU, st1);
  n_checks++;
  /* at 1-4 rows the FP8 rows fuse as bf16 ones do (q and k: one launch; gate, up and swiglu:
   * one), two launches saved a step; above, the tensor-core kernel runs each product alone */
  long fused = st1[3] - st0[3];
  if (T <= 4)
    EXPECT_MSG(fused >= 6, "fp8 decode T=%d: %ld launches fused (expected >= 6)", T, fused);
  else
    EXPECT_MSG(fused == 0, "fp8 decode T=%d: %ld launches fused (expected none)", T, fused);
  gpu_ok();
  for (int j = 0; j < 3; j++) free(first[j]);
  pr_free(px), pr_free(yq), pr_free(yk), pr_free(g), pr_free(u), pr_free(yd);
  wfree(wq.w), wfree(wk.w), wfree(wg.w), wfree(wu.w), wfree(wd.w);
  free(x);
}

TEST(fp8_decode_graph) {
  int Ts[4] = {1, 2, 4, 6};
  for (int i = 0; i < 4; i++) fp8_decode_case(Ts[i]);
}

/* m products of one x[T, K] into N[j] columns each, recorded in a decode step of T rows, three
 * times (direct, captured, replayed): each output within bf16 tolerance of the CPU, the replays
 * bit-identical to the first step, and at least min_fused launches saved by the recorder's
 * rewrite. */
static void fused_products_case(int T, int K, int m, const int *Ns, long min_fused,
                                const char *label) {
  float *x = rand_vec((size_t)T * K, 1.f), *W[3];
  wpair w[3];
  pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * K), y[3];
  uint16_t *first[3] = {NULL, NULL, NULL};
  for (int j = 0; j < m; j++) {
    W[j] = rand_vec((size_t)Ns[j] * K, 0.1f);
    w[j] = wup(W[j], Ns[j], K);
    y[j] = pr_out(BACKEND_KIND_ACT, (size_t)T * Ns[j]);
  }
  long st0[6], st1[6];
  backend_cuda_graph_stats(GPU, st0);
  for (int step = 0; step < 3; step++) { /* direct, captured, replayed */
    decode_rows_batch(T);
    for (int j = 0; j < m; j++) {
      if (step == 0) CPU->matmul(CPU, px.c, w[j].c, T, K, Ns[j], y[j].c);
      GPU->matmul(GPU, px.g, w[j].g, T, K, Ns[j], y[j].g);
    }
    for (int j = 0; j < m; j++) {
      size_t n = (size_t)T * Ns[j];
      uint16_t *r = malloc(n * 2);
      EXPECT(GPU->read(GPU, y[j].g, 0, r, n * 2) == 0);
      if (step == 0) {
        char what[64];
        snprintf(what, sizeof what, "%s T=%d N=%d", label, T, Ns[j]);
        CMP(y[j].c, y[j].g, BACKEND_KIND_ACT, n, 6e-3, what);
        first[j] = r;
      } else {
        EXPECT_MSG(memcmp(first[j], r, n * 2) == 0, "%s T=%d product %d: step %d differs", label, T,
                   j, step);
        free(r);
      }
    }
  }
  backend_cuda_graph_stats(GPU, st1);
  n_checks++;
  EXPECT_MSG(st1[3] - st0[3] >= min_fused, "%s T=%d: %ld launches fused, expected >= %ld", label, T,
             st1[3] - st0[3], min_fused);
  gpu_ok();
  for (int j = 0; j < m; j++) {
    free(first[j]);
    pr_free(y[j]);
    wfree(w[j]);
    free(W[j]);
  }
  pr_free(px);
  free(x);
}

/* Products of one x in a decode step of 5 .. 16 rows are fused into one skinny-GEMM launch;
 * two launches saved by each run of the list (the direct step and the capture). */
TEST(sgemm_fused) {
  int Ts[3] = {6, 12, 16}, Ns[3] = {512, 256, 32};
  for (int c = 0; c < 3; c++) fused_products_case(Ts[c], 1024, 3, Ns, 4, "fused sgemm");
}

/* Two narrow products of one x in a decode step of 40 rows (the DeltaNet b and a shape): one
 * narrow launch. */
TEST(narrow_fused) {
  int Ns[2] = {32, 32};
  fused_products_case(40, 2560, 2, Ns, 2, "fused narrow");
}

/* --batch-invariant: a row's bits are the same whatever the row count (1 .. 67, across
 * the GEMV/tile boundaries 8 and 64), on the vector path (K % 8 == 0) and the scalar one; the
 * same bits as the default backend's GEMV (<= 4 rows); within bf16 tolerance of the CPU. */
TEST(batch_invariant_gemm) {
  char err[256];
  char bierr[256] = "";
  backend *BI =
      backend_cuda_create(0, &(backend_options){.batch_invariant = 1}, bierr, sizeof bierr);
  EXPECT_MSG(BI != NULL, "create --batch-invariant: %s", bierr);
  if (!BI) return;
  int Ks[3] = {2560, 100, 264}, Ns[3] = {515, 77, 1001}, TALL = 67;
  int Ts[7] = {1, 3, 8, 9, 40, 64, 65};
  for (int c = 0; c < 3; c++) {
    int K = Ks[c], N = Ns[c];
    float *x = rand_vec((size_t)TALL * K, 1.f), *W = rand_vec((size_t)N * K, 0.1f);
    backend_weight wb = BI->weight_upload(BI, W, DTYPE_F32, N, K);
    wpair w = wup(W, N, K);
    backend_buf xb = mk(BI, BACKEND_KIND_ACT, x, (size_t)TALL * K);
    backend_buf yall = mk(BI, BACKEND_KIND_ACT, NULL, (size_t)TALL * N);
    backend_buf yt = mk(BI, BACKEND_KIND_ACT, NULL, (size_t)TALL * N);
    BI->matmul(BI, xb, wb, TALL, K, N, yall);
    uint16_t *ra = malloc((size_t)TALL * N * 2), *rt = malloc((size_t)TALL * N * 2);
    BI->read(BI, yall, 0, ra, (size_t)TALL * N * 2);
    for (int i = 0; i < 7; i++) {
      int T = Ts[i];
      poison(BI, yt, BACKEND_KIND_ACT, (size_t)TALL * N);
      BI->matmul(BI, xb, wb, T, K, N, yt);
      BI->read(BI, yt, 0, rt, (size_t)T * N * 2);
      size_t diff = 0;
      for (size_t j = 0; j < (size_t)T * N; j++) diff += ra[j] != rt[j];
      n_checks++;
      EXPECT_MSG(diff == 0,
                 "batch-invariant K=%d N=%d: %zu of %d rows' values differ at T=%d vs %d", K, N,
                 diff, T, T, TALL);
      if (T <= 4) { /* the default backend's GEMV (T <= 4) gives the same bits */
        pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * K),
             y = pr_out(BACKEND_KIND_ACT, (size_t)T * N);
        GPU->matmul(GPU, px.g, w.g, T, K, N, y.g);
        uint16_t *rg = malloc((size_t)T * N * 2);
        GPU->read(GPU, y.g, 0, rg, (size_t)T * N * 2);
        size_t d2 = 0;
        for (size_t j = 0; j < (size_t)T * N; j++) d2 += ra[j] != rg[j];
        /* the default GEMV path needs K % 8 == 0 (else cuBLAS, other bits) */
        if (K % 8 == 0)
          EXPECT_MSG(d2 == 0, "batch-invariant vs default GEMV K=%d N=%d T=%d: %zu values differ",
                     K, N, T, d2);
        free(rg);
        pr_free(px);
        pr_free(y);
      }
    }
    /* against the CPU */
    pair px = pr(BACKEND_KIND_ACT, x, (size_t)TALL * K),
         y = pr_out(BACKEND_KIND_ACT, (size_t)TALL * N);
    CPU->matmul(CPU, px.c, w.c, TALL, K, N, y.c);
    float *rc = get(CPU, y.c, BACKEND_KIND_ACT, y.n), *rb = get(BI, yall, BACKEND_KIND_ACT, y.n);
    double e = relerr(rb, rc, y.n);
    n_checks++;
    printf("  batch-invariant K=%-5d N=%-5d rel err %.3e (tol 6e-3)\n", K, N, e);
    EXPECT_MSG(e <= 6e-3, "batch-invariant K=%d N=%d: rel err %.3e", K, N, e);
    const char *fe = BI->sync(BI, err, sizeof err) ? err : NULL;
    EXPECT_MSG(fe == NULL, "batch-invariant backend: %s", fe ? fe : "");
    free(rc);
    free(rb);
    free(ra);
    free(rt);
    pr_free(px);
    pr_free(y);
    BI->free(BI, xb);
    BI->free(BI, yall);
    BI->free(BI, yt);
    BI->weight_free(BI, wb);
    wfree(w);
    free(x);
    free(W);
  }
  BI->destroy(BI);
}

/* One backend, (theta, rot) changing between calls: the rotary table is rebuilt each time. */
static void qk_norm_rope_case(int rot, double theta) {
  pieces p = {3, {4, 1, 2}, {0, 1000, 70000}, {0, 1, 2}};
  set_batch(&p, 0, NULL);
  int T = T_of(&p), nh = 4, nkv = 2, hd = 256;
  float *qg = rand_vec((size_t)T * nh * 2 * hd, 2.f), *k = rand_vec((size_t)T * nkv * hd, 2.f);
  float *qn = rand_vec(hd, 0.3f), *kn = rand_vec(hd, 0.3f);
  wpair wq = wup(qn, 1, hd), wk = wup(kn, 1, hd);
  pair pq = pr(BACKEND_KIND_ACT, qg, (size_t)T * nh * 2 * hd),
       pk = pr(BACKEND_KIND_ACT, k, (size_t)T * nkv * hd);
  pair qo = pr_out(BACKEND_KIND_ACT, (size_t)T * nh * hd),
       go = pr_out(BACKEND_KIND_ACT, (size_t)T * nh * hd);
  CPU->qk_norm_rope(CPU, pq.c, pk.c, wq.c, wk.c, nh, nkv, hd, rot, theta, 1e-6f, qo.c, go.c);
  GPU->qk_norm_rope(GPU, pq.g, pk.g, wq.g, wk.g, nh, nkv, hd, rot, theta, 1e-6f, qo.g, go.g);
  char what[64];
  snprintf(what, sizeof what, "qk_norm_rope q rot=%d theta=%g", rot, theta);
  CMP(qo.c, qo.g, BACKEND_KIND_ACT, qo.n, 8e-3, what);
  CMP(go.c, go.g, BACKEND_KIND_ACT, go.n, 1e-6, "qk_norm_rope gate");
  CMP(pk.c, pk.g, BACKEND_KIND_ACT, pk.n, 8e-3, "qk_norm_rope k");
  gpu_ok();
  pr_free(pq);
  pr_free(pk);
  pr_free(qo);
  pr_free(go);
  wfree(wq);
  wfree(wk);
  free(qg);
  free(k);
  free(qn);
  free(kn);
}

TEST(qk_norm_rope) {
  qk_norm_rope_case(64, 1e7);
  qk_norm_rope_case(32, 1e4);
  qk_norm_rope_case(64, 1e7);
}

/* prefill from 0 (37 rows: the GEMM path), prefill resuming at 50 over cached pages (20
 * rows: the split path), two decode rows */
static const pieces ATT_MIXED = {4, {37, 20, 1, 1}, {0, 50, 300, 0}, {0, 1, 2, 3}};
/* two GEMM-path pieces over cached context, one decode row */
static const pieces ATT_LONG = {3, {33, 100, 1}, {64, 7, 200}, {0, 1, 2}};
/* a decode step (every piece one row: the split kernel writes the rows' k and v into the pages
 * itself, ranges of ATT_SPLIT_SMALL positions): a fresh row, one ending a page, one long */
static const pieces ATT_DECODE = {3, {1, 1, 1}, {0, 31, 300}, {0, 1, 2}};

static void attention_case_p(int nh, int nkv, int hd, pieces p) {
  set_batch(&p, 0, NULL);
  int T = T_of(&p);
  size_t pool = (size_t)4 * MAXP * BACKEND_PAGE_TOKENS * nkv * hd;
  float *kp = rand_vec(pool, 1.f), *vp = rand_vec(pool, 1.f);
  float *q = rand_vec((size_t)T * nh * hd, 1.f), *k = rand_vec((size_t)T * nkv * hd, 1.f),
        *v = rand_vec((size_t)T * nkv * hd, 1.f);
  pair pkp = pr(BACKEND_KIND_KV, kp, pool), pvp = pr(BACKEND_KIND_KV, vp, pool);
  pair pq = pr(BACKEND_KIND_ACT, q, (size_t)T * nh * hd),
       pk = pr(BACKEND_KIND_ACT, k, (size_t)T * nkv * hd),
       pv = pr(BACKEND_KIND_ACT, v, (size_t)T * nkv * hd);
  pair o = pr_out(BACKEND_KIND_ACT, (size_t)T * nh * hd);
  float scale = 1.f / sqrtf((float)hd) * 2.f; /* sharper than usual */
  CPU->attention(CPU, pkp.c, pvp.c, pq.c, pk.c, pv.c, nh, nkv, hd, scale, o.c);
  GPU->attention(GPU, pkp.g, pvp.g, pq.g, pk.g, pv.g, nh, nkv, hd, scale, o.g);
  char what[64];
  snprintf(what, sizeof what, "attention nh=%d nkv=%d hd=%d T=%d", nh, nkv, hd, T);
  CMP(o.c, o.g, BACKEND_KIND_ACT, o.n, 8e-3, what);
  CMP(pkp.c, pkp.g, BACKEND_KIND_KV, pool, 1e-6, "attention k pages");
  CMP(pvp.c, pvp.g, BACKEND_KIND_KV, pool, 1e-6, "attention v pages");
  gpu_ok();
  pr_free(pkp);
  pr_free(pvp);
  pr_free(pq);
  pr_free(pk);
  pr_free(pv);
  pr_free(o);
  free(kp);
  free(vp);
  free(q);
  free(k);
  free(v);
}

static void attention_case(int nh, int nkv, int hd) {
  attention_case_p(nh, nkv, hd, ATT_MIXED);
  attention_case_p(nh, nkv, hd, ATT_LONG);
  attention_case_p(nh, nkv, hd, ATT_DECODE);
}

/* Decode rows whose sequences hold the same first pages (the prefix cache shares a restored
 * prefix's pages by reference): the CUDA backend reads those positions once per group on
 * tensor cores (cuda_flash.cu k_flash_shared) and each row's own after them (kv_share.h).
 * Pieces 0-5 share 56 pages (896 positions: two shared ranges), 6-8 share 20 with each other
 * (320 positions, capped by piece 8's 321), 9 shares 3 pages with 0 (too few to join), 10-11
 * share nothing; 12 is a prefill piece over the first group's pages in the mixed variant. Every
 * output against the CPU; against a backend with the path off (no_attn_shared) the outputs must
 * differ somewhere (the other path's sums, so the shared kernel did run) and agree within the same
 * tolerance; the step once more gives the same bits (a replayed graph in a decode step). */
#define SHP 64 /* page-table columns here: 1,024 positions */
static void attention_shared_case(int nh, int nkv, int hd, int mixed) {
  pieces p = {mixed ? 13 : 12,
              {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 40},
              {900, 950, 1000, 897, 1010, 930, 350, 640, 321, 820, 333, 900, 900},
              {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  static int32_t tokens[256], pos[256], seq[256], st[16], pt[16 * SHP];
  int T = 0;
  for (int s = 0; s < p.n; s++) {
    st[s] = T;
    for (int r = 0; r < p.len[s]; r++, T++) {
      tokens[T] = 0;
      pos[T] = p.pos[s] + r;
      seq[T] = s;
    }
    for (int j = 0; j < SHP; j++) pt[s * SHP + j] = s * SHP + (SHP - 1 - j);
  }
  for (int s = 1; s <= 5; s++)
    for (int j = 0; j < 56; j++) pt[s * SHP + j] = pt[j];
  for (int s = 7; s <= 8; s++)
    for (int j = 0; j < 20; j++) pt[s * SHP + j] = pt[6 * SHP + j];
  for (int j = 0; j < 3; j++) pt[9 * SHP + j] = pt[j];
  if (mixed)
    for (int j = 0; j < 56; j++) pt[12 * SHP + j] = pt[j];
  backend_batch b = {T, p.n, tokens, pos, seq, st, p.len, p.pos, p.slot, pt, SHP, 0, NULL, NULL};
  backend *off = gpu_with(.no_attn_shared = 1);
  if (!off) return;
  EXPECT(CPU->set_batch(CPU, &b) == 0);
  EXPECT(GPU->set_batch(GPU, &b) == 0);
  EXPECT(off->set_batch(off, &b) == 0);
  size_t pool = (size_t)16 * SHP * BACKEND_PAGE_TOKENS * nkv * hd;
  float *kp = rand_vec(pool, 1.f), *vp = rand_vec(pool, 1.f);
  float *q = rand_vec((size_t)T * nh * hd, 1.f), *k = rand_vec((size_t)T * nkv * hd, 1.f),
        *v = rand_vec((size_t)T * nkv * hd, 1.f);
  pair pkp = pr(BACKEND_KIND_KV, kp, pool), pvp = pr(BACKEND_KIND_KV, vp, pool);
  pair pq = pr(BACKEND_KIND_ACT, q, (size_t)T * nh * hd),
       pk = pr(BACKEND_KIND_ACT, k, (size_t)T * nkv * hd),
       pv = pr(BACKEND_KIND_ACT, v, (size_t)T * nkv * hd);
  pair o = pr_out(BACKEND_KIND_ACT, (size_t)T * nh * hd);
  backend_buf okp = mk(off, BACKEND_KIND_KV, kp, pool), ovp = mk(off, BACKEND_KIND_KV, vp, pool),
              oq = mk(off, BACKEND_KIND_ACT, q, (size_t)T * nh * hd),
              ok_ = mk(off, BACKEND_KIND_ACT, k, (size_t)T * nkv * hd),
              ov = mk(off, BACKEND_KIND_ACT, v, (size_t)T * nkv * hd),
              oo = mk(off, BACKEND_KIND_ACT, NULL, (size_t)T * nh * hd);
  float scale = 1.f / sqrtf((float)hd) * 2.f;
  CPU->attention(CPU, pkp.c, pvp.c, pq.c, pk.c, pv.c, nh, nkv, hd, scale, o.c);
  GPU->attention(GPU, pkp.g, pvp.g, pq.g, pk.g, pv.g, nh, nkv, hd, scale, o.g);
  off->attention(off, okp, ovp, oq, ok_, ov, nh, nkv, hd, scale, oo);
  char what[96];
  snprintf(what, sizeof what, "attention shared nh=%d nkv=%d hd=%d%s", nh, nkv, hd,
           mixed ? " mixed" : "");
  CMP(o.c, o.g, BACKEND_KIND_ACT, o.n, 8e-3, what);
  CMP(pkp.c, pkp.g, BACKEND_KIND_KV, pool, 1e-6, "attention shared k pages");
  CMP(pvp.c, pvp.g, BACKEND_KIND_KV, pool, 1e-6, "attention shared v pages");
  size_t n = o.n;
  float *a = get(GPU, o.g, BACKEND_KIND_ACT, n), *z = get(off, oo, BACKEND_KIND_ACT, n),
        *rc = get(CPU, o.c, BACKEND_KIND_ACT, n);
  size_t dif = 0;
  for (size_t i = 0; i < n; i++) dif += a[i] != z[i];
  double e = relerr(z, rc, n);
  n_checks += 2;
  printf("  %-28s %zu of %zu values differ from the path off (its rel err %.3e)\n", what, dif, n,
         e);
  EXPECT_MSG(dif > 0, "%s: no value differs from no_attn_shared: the shared kernel did not run",
             what);
  EXPECT_MSG(e <= 8e-3, "%s: the path off: rel err %.3e", what, e);
  /* the same step again (a decode step: the recorded graph replayed) */
  EXPECT(GPU->set_batch(GPU, &b) == 0);
  pair o2 = pr_out(BACKEND_KIND_ACT, (size_t)T * nh * hd);
  GPU->attention(GPU, pkp.g, pvp.g, pq.g, pk.g, pv.g, nh, nkv, hd, scale, o2.g);
  float *a2 = get(GPU, o2.g, BACKEND_KIND_ACT, n);
  size_t rep = 0;
  for (size_t i = 0; i < n; i++) rep += memcmp(&a[i], &a2[i], sizeof *a) != 0;
  n_checks++;
  EXPECT_MSG(rep == 0, "%s: %zu values differ when the step runs again", what, rep);
  gpu_ok();
  char err[256] = "";
  EXPECT_MSG(off->sync(off, err, sizeof err) == 0, "path off: %s", err);
  free(a);
  free(a2);
  free(z);
  free(rc);
  pr_free(o2);
  pr_free(pkp);
  pr_free(pvp);
  pr_free(pq);
  pr_free(pk);
  pr_free(pv);
  pr_free(o);
  off->destroy(off);
  free(kp);
  free(vp);
  free(q);
  free(k);
  free(v);
}

TEST(attention_shared) {
  attention_shared_case(8, 2, 256, 0);  /* the 4B shape: G = 4 */
  attention_shared_case(16, 2, 128, 0); /* G = 8 */
  attention_shared_case(16, 2, 256, 0); /* G = 8 at hd 256 (the MoE shapes): split in two blocks */
  attention_shared_case(24, 4, 256, 0); /* G = 6 (the 27B shape): 10 members a block, 60 rows */
  attention_shared_case(8, 2, 256, 1);  /* a prefill piece in the step (not a graph) */
  attention_shared_case(4, 4, 128, 0);  /* G = 1 */
  attention_shared_case(6, 3, 64, 0);   /* G = 2 */
}

/* Long pieces go to the fused flash kernel by default (TEST(attention); hd 80 falls back to
 * the GEMM path). Here: the GEMM path instead (no_attn_flash), then in blocks of 5 query rows
 * (attn_gemm_rows). */
TEST(attention_gemm_blocks) {
  for (int k = 0; k < 2; k++) {
    backend *g2 = gpu_with(.no_attn_flash = 1, .attn_gemm_rows = k ? 5 : 0);
    if (!g2) return;
    backend *save = GPU;
    GPU = g2;
    printf("  the GEMM path%s\n", k ? ", blocks of 5 query rows" : "");
    attention_case_p(8, 2, 256, ATT_LONG);
    attention_case_p(16, 2, 256, ATT_MIXED);
    attention_case_p(6, 3, 64, ATT_LONG);
    attention_case_p(4, 1, 128, ATT_LONG);
    attention_case_p(4, 4, 80, ATT_MIXED);
    GPU = save;
    g2->destroy(g2);
  }
}

TEST(attention) {
  attention_case(8, 2, 256);
  attention_case(16, 2, 256); /* G = 8 at hd 256: the MoE shape's attention */
  attention_case(6, 3, 64);
  attention_case(4, 4, 80);
  attention_case(8, 1, 128);  /* split path with 4 values per lane, G = 8 */
  attention_case(2, 1, 32);   /* split path with 1 value per lane: 8 lanes copy a position */
  attention_case(24, 4, 256); /* G = 6 (the 27B shape): two blocks of 3 heads */
  attention_case(32, 2, 128); /* G = 16: two blocks of 8 */
  attention_case(5, 1, 64);   /* G = 5: a block per head */
}

/* C odd: the one-channel prefill kernel; C even: two channels per thread, whose fast path
 * takes runs of 16 rows inside one piece (fresh, from the state, from earlier rows) and whose
 * per-row path takes runs that straddle pieces or end the step. */
static void conv1d_case(int C, const pieces *p) {
  set_batch(p, 0, NULL);
  int T = T_of(p), K = 4;
  float *x = rand_vec((size_t)T * C, 1.f), *w = rand_vec((size_t)C * K, 0.5f),
        *st = rand_vec((size_t)4 * C * (K - 1), 1.f);
  wpair wp = wup(w, C, K);
  pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * C),
       ps = pr(BACKEND_KIND_F32, st, (size_t)4 * C * (K - 1));
  pair o = pr_out(BACKEND_KIND_ACT, (size_t)T * C);
  CPU->conv1d(CPU, ps.c, px.c, wp.c, C, K, o.c);
  GPU->conv1d(GPU, ps.g, px.g, wp.g, C, K, o.g);
  char what[64];
  snprintf(what, sizeof what, "conv1d out C=%d T=%d", C, T);
  CMP(o.c, o.g, BACKEND_KIND_ACT, o.n, 6e-3, what);
  snprintf(what, sizeof what, "conv1d state C=%d T=%d", C, T);
  CMP(ps.c, ps.g, BACKEND_KIND_F32, ps.n, 1e-6, what);
  /* a decode-only step (the one-launch kernel): one row per piece, one of them fresh */
  pieces d = {3, {1, 1, 1}, {57, 0, 301}, {3, 0, 2}};
  set_batch(&d, 0, NULL);
  CPU->conv1d(CPU, ps.c, px.c, wp.c, C, K, o.c);
  GPU->conv1d(GPU, ps.g, px.g, wp.g, C, K, o.g);
  snprintf(what, sizeof what, "conv1d decode out C=%d", C);
  CMP(o.c, o.g, BACKEND_KIND_ACT, (size_t)3 * C, 6e-3, what);
  snprintf(what, sizeof what, "conv1d decode state C=%d", C);
  CMP(ps.c, ps.g, BACKEND_KIND_F32, ps.n, 1e-6, what);
  gpu_ok();
  pr_free(px);
  pr_free(ps);
  pr_free(o);
  wfree(wp);
  free(x);
  free(w);
  free(st);
}

TEST(conv1d) {
  pieces p = {4, {37, 20, 1, 1}, {0, 50, 300, 0}, {3, 0, 2, 1}};
  pieces q = {4, {16, 37, 1, 1}, {0, 50, 300, 0}, {3, 0, 2, 1}};
  conv1d_case(301, &p);
  conv1d_case(256, &p);
  conv1d_case(256, &q);
  conv1d_case(258, &q);
}

TEST(gdn_gates) {
  pieces p = {2, {9, 1}, {0, 5}, {0, 1}};
  set_batch(&p, 0, NULL);
  int T = T_of(&p), nk = 2, nv = 6, dk = 128, dv = 96;
  size_t cd = 2 * (size_t)nk * dk + (size_t)nv * dv;
  float *qkv = rand_vec((size_t)T * cd, 1.f), *b = rand_vec((size_t)T * nv, 4.f),
        *a = rand_vec((size_t)T * nv, 4.f), *al = rand_vec(nv, 1.f), *db = rand_vec(nv, 1.f);
  a[0] = 30.f; /* the softplus linear branch */
  wpair wal = wup(al, 1, nv), wdb = wup(db, 1, nv);
  pair pq = pr(BACKEND_KIND_ACT, qkv, (size_t)T * cd), pb = pr(BACKEND_KIND_ACT, b, (size_t)T * nv),
       pa = pr(BACKEND_KIND_ACT, a, (size_t)T * nv);
  pair beta = pr_out(BACKEND_KIND_F32, (size_t)T * nv),
       g = pr_out(BACKEND_KIND_F32, (size_t)T * nv);
  CPU->gdn_gates(CPU, pq.c, pb.c, pa.c, wal.c, wdb.c, nk, nv, dk, dv, beta.c, g.c);
  GPU->gdn_gates(GPU, pq.g, pb.g, pa.g, wal.g, wdb.g, nk, nv, dk, dv, beta.g, g.g);
  CMP(pq.c, pq.g, BACKEND_KIND_ACT, pq.n, 6e-3, "gdn_gates qkv (l2 norm)");
  CMP(beta.c, beta.g, BACKEND_KIND_F32, beta.n, 1e-5, "gdn_gates beta");
  CMP(g.c, g.g, BACKEND_KIND_F32, g.n, 1e-5, "gdn_gates g");
  gpu_ok();
  pr_free(pq);
  pr_free(pb);
  pr_free(pa);
  pr_free(beta);
  pr_free(g);
  wfree(wal);
  wfree(wdb);
  free(qkv);
  free(b);
  free(a);
  free(al);
  free(db);
}

/* Normalised q/k (as gdn_gates leaves them), v, beta in (0,1), g < 0. */
static void gdn_case(int nk, int nv, int dk, int dv) {
  /* fresh prefill of 5 chunks (slot holds garbage; the scan's two buffer sets each used more
   * than once), resume mid-chunk at 30 from a non-zero state, chunk-aligned resume at 128, two
   * decode rows (one fresh) */
  pieces p = {5, {300, 70, 64, 1, 1}, {0, 30, 128, 77, 0}, {4, 1, 0, 3, 2}};
  set_batch(&p, 0, NULL);
  int T = T_of(&p), nslots = 5;
  size_t cd = 2 * (size_t)nk * dk + (size_t)nv * dv;
  float *qkv = rand_vec((size_t)T * cd, 1.f);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < 2 * nk; h++) {
      float *x = qkv + (size_t)t * cd + (size_t)h * dk, ss = 0.f;
      for (int i = 0; i < dk; i++) ss += x[i] * x[i];
      float sc = 1.f / sqrtf(ss) * (h < nk ? 1.f / sqrtf((float)dk) : 1.f);
      for (int i = 0; i < dk; i++) x[i] = bfr(x[i] * sc);
    }
  float *beta = malloc((size_t)T * nv * 4), *g = malloc((size_t)T * nv * 4);
  for (int i = 0; i < T * nv; i++) {
    beta[i] = 0.5f + 0.49f * urand();
    g[i] = -0.3f * (1.f + urand()) - 0.001f;
  }
  size_t ns = (size_t)nslots * nv * dk * dv;
  float *S = rand_vec(ns, 0.3f);
  pair pq = pr(BACKEND_KIND_ACT, qkv, (size_t)T * cd),
       pb = pr(BACKEND_KIND_F32, beta, (size_t)T * nv),
       pg = pr(BACKEND_KIND_F32, g, (size_t)T * nv), ps = pr(BACKEND_KIND_F32, S, ns);
  pair o = pr_out(BACKEND_KIND_ACT, (size_t)T * nv * dv);
  CPU->gdn_prefill(CPU, ps.c, pq.c, pb.c, pg.c, nk, nv, dk, dv, o.c);
  GPU->gdn_prefill(GPU, ps.g, pq.g, pb.g, pg.g, nk, nv, dk, dv, o.g);
  CPU->gdn_decode(CPU, ps.c, pq.c, pb.c, pg.c, nk, nv, dk, dv, o.c);
  GPU->gdn_decode(GPU, ps.g, pq.g, pb.g, pg.g, nk, nv, dk, dv, o.g);
  char what[80];
  snprintf(what, sizeof what, "gdn out nk=%d nv=%d dk=%d dv=%d", nk, nv, dk, dv);
  CMP(o.c, o.g, BACKEND_KIND_ACT, o.n, 1e-2, what);
  snprintf(what, sizeof what, "gdn state nk=%d nv=%d dk=%d dv=%d", nk, nv, dk, dv);
  CMP(ps.c, ps.g, BACKEND_KIND_F32, ns, 5e-3, what);
  /* a second step: decode rows continuing every sequence from the updated states */
  pieces p2 = {5, {1, 1, 1, 1, 1}, {300, 100, 192, 78, 1}, {4, 1, 0, 3, 2}};
  set_batch(&p2, 0, NULL);
  CPU->gdn_decode(CPU, ps.c, pq.c, pb.c, pg.c, nk, nv, dk, dv, o.c);
  GPU->gdn_decode(GPU, ps.g, pq.g, pb.g, pg.g, nk, nv, dk, dv, o.g);
  CMP(o.c, o.g, BACKEND_KIND_ACT, (size_t)5 * nv * dv, 1e-2, "gdn decode step 2 out");
  CMP(ps.c, ps.g, BACKEND_KIND_F32, ns, 5e-3, "gdn decode step 2 state");
  gpu_ok();
  pr_free(pq);
  pr_free(pb);
  pr_free(pg);
  pr_free(ps);
  pr_free(o);
  free(qkv);
  free(beta);
  free(g);
  free(S);
}

TEST(gdn) {
  gdn_case(2, 4, 128, 128); /* real head sizes: the three-phase chunk-parallel path */
  gdn_case(1, 3, 32, 48);   /* dk != 128: the one-block-per-(piece, head) kernel */
  gdn_case(2, 2, 128, 256); /* the chunk-parallel path at dv 256 */
  gdn_case(2, 6, 128, 128); /* three value heads per key head (the 27B shape's 48 / 16) */
}

/* ---- the DeltaNet decode chain (conv1d, gdn_gates, gdn_decode, gated_rmsnorm) ----
 * On the default backend a decode step's four ops become one k_gdn_chain launch (steps of up
 * to 32 rows) or conv1d + gates in one launch and the other two alone (more rows); on one
 * that launches ops as issued (no_graphs) they run as four kernels. Three steps (direct, captured,
 * replayed) of T rows (one fresh at position 0, slots permuted) from random states: every
 * output of the two — conv state, conv output, beta, g, DeltaNet state, normed output — must
 * be bit-identical after each step, within tolerance of the CPU, and the launches really
 * fused. */
enum { CH_CST, CH_X, CH_CO, CH_B, CH_A, CH_BETA, CH_G, CH_SSM, CH_Z, CH_O, CH_NB };
enum { CHW_CONV, CHW_AL, CHW_DT, CHW_NORM, CH_NW };
typedef struct {
  backend *be;
  backend_buf b[CH_NB];
  backend_weight w[CH_NW];
} chain_set;

static const backend_kind ch_kind[CH_NB] = {
    BACKEND_KIND_F32, BACKEND_KIND_ACT, BACKEND_KIND_ACT, BACKEND_KIND_ACT, BACKEND_KIND_ACT,
    BACKEND_KIND_F32, BACKEND_KIND_F32, BACKEND_KIND_F32, BACKEND_KIND_ACT, BACKEND_KIND_ACT};

static void chain_init(chain_set *cs, backend *be, float *const *h, const size_t *n,
                       float *const *wh, const int64_t (*ws)[2]) {
  cs->be = be;
  for (int i = 0; i < CH_NB; i++) {
    cs->b[i] = mk(be, ch_kind[i], h[i], n[i]);
    if (!h[i]) poison(be, cs->b[i], ch_kind[i], n[i]);
  }
  for (int i = 0; i < CH_NW; i++)
    cs->w[i] = be->weight_upload(be, wh[i], DTYPE_F32, ws[i][0], ws[i][1]);
}

static void chain_free(chain_set *cs) {
  for (int i = 0; i < CH_NB; i++) cs->be->free(cs->be, cs->b[i]);
  for (int i = 0; i < CH_NW; i++) cs->be->weight_free(cs->be, cs->w[i]);
}

static void chain_run(chain_set *cs, int T, int C, int nk, int nv, int dk, int dv) {
  backend *be = cs->be;
  backend_buf *b = cs->b;
  be->conv1d(be, b[CH_CST], b[CH_X], cs->w[CHW_CONV], C, 4, b[CH_CO]);
  be->gdn_gates(be, b[CH_CO], b[CH_B], b[CH_A], cs->w[CHW_AL], cs->w[CHW_DT], nk, nv, dk, dv,
                b[CH_BETA], b[CH_G]);
  be->gdn_decode(be, b[CH_SSM], b[CH_CO], b[CH_BETA], b[CH_G], nk, nv, dk, dv, b[CH_O]);
  be->gated_rmsnorm(be, b[CH_O], b[CH_Z], cs->w[CHW_NORM], T, nv, dv, 1e-6f, b[CH_O]);
}

static void gdn_chain_case(backend *plain, int nk, int nv, int dk, int T) {
  int dv = 128, C = 2 * nk * dk + nv * dv, nslots = T;
  static const char *name[CH_NB] = {"conv state", "x", "conv out", "b", "a",
                                    "beta",       "g", "state",    "z", "out"};
  size_t n[CH_NB] = {
      (size_t)nslots * C * 3, (size_t)T * C,      (size_t)T * C,  (size_t)T * nv,
      (size_t)T * nv,         (size_t)T * nv,     (size_t)T * nv, (size_t)nslots * nv * dk * dv,
      (size_t)T * nv * dv,    (size_t)T * nv * dv};
  float sc[CH_NB] = {1.f, 1.f, 0.f, 4.f, 4.f, 0.f, 0.f, 0.3f, 2.f, 0.f};
  float *h[CH_NB];
  for (int i = 0; i < CH_NB; i++) h[i] = sc[i] > 0.f ? rand_vec(n[i], sc[i]) : NULL;
  h[CH_A][0] = 30.f; /* the softplus linear branch */
  int64_t ws[CH_NW][2] = {{C, 4}, {1, nv}, {1, nv}, {1, dv}};
  float *wh[CH_NW] = {rand_vec((size_t)C * 4, 0.5f), rand_vec(nv, 1.f), rand_vec(nv, 1.f),
                      rand_vec(dv, 1.f)};
  chain_set cs[3]; /* CPU, GPU (chain), plain (four kernels) */
  chain_init(&cs[0], CPU, h, n, wh, ws);
  chain_init(&cs[1], GPU, h, n, wh, ws);
  chain_init(&cs[2], plain, h, n, wh, ws);
  long g0[6], g1[6], p0[6], p1[6];
  backend_cuda_graph_stats(GPU, g0);
  backend_cuda_graph_stats(plain, p0);
  g_also = plain;
  int same = 1;
  for (int step = 0; step < 3; step++) { /* direct, captured, replayed */
    pieces p = {T, {0}, {0}, {0}};
    for (int r = 0; r < T; r++) {
      p.len[r] = 1;
      p.pos[r] = r == 1 ? step : (r * 29 + 7) % 151 + 1 + step;
      p.slot[r] = (r * 7 + 4) % T; /* a permutation for T = 5 and 40 */
    }
    set_batch(&p, 0, NULL);
    for (int k = 0; k < 3; k++) chain_run(&cs[k], T, C, nk, nv, dk, dv);
    for (int i = 0; i < CH_NB; i++) {
      if (i == CH_X || i == CH_B || i == CH_A || i == CH_Z) continue;
      size_t bytes = n[i] * (ch_kind[i] == BACKEND_KIND_F32 ? 4 : 2);
      uint8_t *x = malloc(bytes), *y = malloc(bytes);
      EXPECT(GPU->read(GPU, cs[1].b[i], 0, x, bytes) == 0);
      EXPECT(plain->read(plain, cs[2].b[i], 0, y, bytes) == 0);
      int eq = memcmp(x, y, bytes) == 0;
      EXPECT_MSG(eq, "gdn chain nk=%d nv=%d dk=%d T=%d step %d: %s differs from the four kernels",
                 nk, nv, dk, T, step, name[i]);
      same &= eq;
      free(x);
      free(y);
    }
    if (step != 1) {
      char what[96];
      double tol[CH_NB] = {1e-6, 0, 6e-3, 0, 0, 1e-5, 1e-5, 5e-3, 0, 1e-2};
      for (int i = 0; i < CH_NB; i++) {
        if (tol[i] == 0) continue;
        snprintf(what, sizeof what, "chain %d/%d/%d T=%d step %d %s", nk, nv, dk, T, step, name[i]);
        CMP(cs[0].b[i], cs[1].b[i], ch_kind[i], n[i], tol[i], what);
      }
    }
  }
  g_also = NULL;
  backend_cuda_graph_stats(GPU, g1);
  backend_cuda_graph_stats(plain, p1);
  n_checks++;
  printf(
      "  gdn chain nk=%d nv=%d dk=%d T=%d: bit-identical to the four kernels: %s; fused %ld "
      "(plain %ld), replays %ld\n",
      nk, nv, dk, T, same ? "yes" : "NO", g1[3] - g0[3], p1[3] - p0[3], g1[1] - g0[1]);
  /* the list runs twice (direct, capture), 3 launches saved each time by the chain, 1 by
   * conv1d + gates */
  long want = T <= 32 ? 6 : 2;
  EXPECT_MSG(g1[3] - g0[3] == want && p1[3] - p0[3] == 0 && g1[1] - g0[1] >= 1,
             "gdn chain nk=%d nv=%d dk=%d T=%d: fused %ld (want %ld; plain %ld), replays %ld", nk,
             nv, dk, T, g1[3] - g0[3], want, p1[3] - p0[3], g1[1] - g0[1]);
  gpu_ok();
  for (int k = 0; k < 3; k++) chain_free(&cs[k]);
  for (int i = 0; i < CH_NB; i++) free(h[i]);
  for (int i = 0; i < CH_NW; i++) free(wh[i]);
}

TEST(gdn_chain) {
  backend *plain = gpu_with(.no_graphs = 1);
  REQUIRE(plain != NULL);
  gdn_chain_case(plain, 2, 4, 128, 5); /* two value heads per key head (the 4B shape's) */
  gdn_chain_case(plain, 2, 6, 128, 5); /* three (the 27B shape's) */
  gdn_chain_case(plain, 2, 6, 128, 1);
  gdn_chain_case(plain, 2, 6, 128, 40);
  gdn_chain_case(plain, 3, 3, 128, 5); /* one */
  gdn_chain_case(plain, 2, 4, 64, 5);
  gdn_chain_case(plain, 1, 1, 64, 5);
  /* 1 and 2 rows: the decode benchmark's one-sequence steps */
  gdn_chain_case(plain, 2, 4, 128, 1);
  gdn_chain_case(plain, 3, 3, 128, 2);
  gdn_chain_case(plain, 2, 4, 64, 2);
  gdn_chain_case(plain, 1, 2, 64, 1);
  /* 40 rows: conv1d + gates in one launch */
  gdn_chain_case(plain, 2, 4, 128, 40);
  gdn_chain_case(plain, 3, 3, 64, 40);
  gdn_chain_case(plain, 1, 2, 96, 40); /* dk 96: three channels per lane, v in 96-wide units */
  char err[256] = "";
  EXPECT_MSG(plain->sync(plain, err, sizeof err) == 0, "plain backend: %s", err);
  plain->destroy(plain);
}

/* dv = 128 and 256: the vector kernels (8- and 16-byte lanes); 80: the one-element kernel */
static void gated_rmsnorm_case(int dv) {
  int T = 5, nv = 3;
  size_t n = (size_t)T * nv * dv;
  float *o = rand_vec(n, 1.f), *z = rand_vec(n, 2.f), *w = rand_vec(dv, 1.f);
  wpair wp = wup(w, 1, dv);
  pair po = pr(BACKEND_KIND_ACT, o, n), pz = pr(BACKEND_KIND_ACT, z, n),
       out = pr_out(BACKEND_KIND_ACT, n);
  CPU->gated_rmsnorm(CPU, po.c, pz.c, wp.c, T, nv, dv, 1e-6f, out.c);
  GPU->gated_rmsnorm(GPU, po.g, pz.g, wp.g, T, nv, dv, 1e-6f, out.g);
  char what[64];
  snprintf(what, sizeof what, "gated_rmsnorm dv=%d", dv);
  CMP(out.c, out.g, BACKEND_KIND_ACT, n, 8e-3, what);
  CPU->gated_rmsnorm(CPU, po.c, pz.c, wp.c, T, nv, dv, 1e-6f, po.c);
  GPU->gated_rmsnorm(GPU, po.g, pz.g, wp.g, T, nv, dv, 1e-6f, po.g);
  snprintf(what, sizeof what, "gated_rmsnorm in place dv=%d", dv);
  CMP(po.c, po.g, BACKEND_KIND_ACT, n, 8e-3, what);
  gpu_ok();
  pr_free(po);
  pr_free(pz);
  pr_free(out);
  wfree(wp);
  free(o);
  free(z);
  free(w);
}

TEST(gated_rmsnorm) {
  gated_rmsnorm_case(128);
  gated_rmsnorm_case(256);
  gated_rmsnorm_case(80);
}

/* Expert weights are windows into one shared random pool (each expert's at its own odd offset,
 * so every expert differs) to keep host memory small at real shapes. */
/* moe_case with router rows in equal pairs (experts 2i and 2i + 1): every logit tied, so with
 * an odd k the last slot must take the lower expert of a pair, as the CPU backend does */
static int moe_tied_pairs;

static void moe_case(int T, int H, int E, int k, int I, int Is, int norm) {
  int shared = Is > 0;
  size_t mat = (size_t)I * H, shift = 97;
  float *pool = rand_vec(mat + (size_t)(3 * E) * shift, 0.1f);
  float *x = rand_vec((size_t)T * H, 1.f), *R = rand_vec((size_t)E * H, 0.2f);
  if (moe_tied_pairs)
    for (int e = 1; e < E; e += 2)
      memcpy(R + (size_t)e * H, R + (size_t)(e - 1) * H, sizeof(float) * H);
  wpair wr = wup_exact(R, E, H);
  backend_weight *gc = malloc((size_t)6 * E * sizeof *gc);
  backend_weight *uc = gc + E, *dc = gc + 2 * E, *gg = gc + 3 * E, *ug = gc + 4 * E,
                 *dg = gc + 5 * E;
  for (int e = 0; e < E; e++) {
    wpair p1 = wup(pool + (size_t)(3 * e) * shift, I, H),
          p2 = wup(pool + (size_t)(3 * e + 1) * shift, I, H),
          p3 = wup(pool + (size_t)(3 * e + 2) * shift, H, I);
    gc[e] = p1.c, gg[e] = p1.g, uc[e] = p2.c, ug[e] = p2.g, dc[e] = p3.c, dg[e] = p3.g;
  }
  wpair sgw = {0}, suw = {0}, sdw = {0}, segw = {0};
  float *s1 = NULL, *s2 = NULL, *s3 = NULL, *s4 = NULL;
  if (shared) {
    s1 = rand_vec((size_t)Is * H, 0.1f), s2 = rand_vec((size_t)Is * H, 0.1f);
    s3 = rand_vec((size_t)H * Is, 0.1f), s4 = rand_vec(H, 0.1f);
    sgw = wup(s1, Is, H), suw = wup(s2, Is, H), sdw = wup(s3, H, Is), segw = wup(s4, 1, H);
  }
  backend_moe mc = {E, k, norm, I, Is, wr.c, gc, uc, dc, sgw.c, suw.c, sdw.c, segw.c};
  backend_moe mg = {E, k, norm, I, Is, wr.g, gg, ug, dg, sgw.g, suw.g, sdw.g, segw.g};
  pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * H), out = pr_out(BACKEND_KIND_ACT, (size_t)T * H);
  CPU->moe(CPU, px.c, &mc, T, H, out.c);
  GPU->moe(GPU, px.g, &mg, T, H, out.g);
  char what[96];
  snprintf(what, sizeof what, "moe T=%d H=%d E=%d k=%d I=%d Is=%d norm=%d", T, H, E, k, I, Is,
           norm);
  CMP(out.c, out.g, BACKEND_KIND_ACT, out.n, 1e-2, what);
  /* per row too: one wrongly routed or wrongly weighted row hides in the whole-tensor error */
  float *rc = get(CPU, out.c, BACKEND_KIND_ACT, out.n),
        *rg = get(GPU, out.g, BACKEND_KIND_ACT, out.n);
  double worst = 0;
  int worst_t = -1;
  for (int t = 0; t < T; t++) {
    double e_ = relerr(rg + (size_t)t * H, rc + (size_t)t * H, (size_t)H);
    if (!(e_ <= worst)) worst = e_, worst_t = t;
  }
  printf("  %-28s worst row %d rel err %.3e (tol 2e-2)\n", "", worst_t, worst);
  EXPECT_MSG(worst <= 2e-2, "%s: row %d rel err %.3e > 2e-2", what, worst_t, worst);
  free(rc);
  free(rg);
  gpu_ok();
  pr_free(px);
  pr_free(out);
  wfree(wr);
  for (int e = 0; e < E; e++) {
    CPU->weight_free(CPU, gc[e]), GPU->weight_free(GPU, gg[e]);
    CPU->weight_free(CPU, uc[e]), GPU->weight_free(GPU, ug[e]);
    CPU->weight_free(CPU, dc[e]), GPU->weight_free(GPU, dg[e]);
  }
  free(gc);
  if (shared) {
    wfree(sgw), wfree(suw), wfree(sdw), wfree(segw);
    free(s1), free(s2), free(s3), free(s4);
  }
  free(pool);
  free(x);
  free(R);
}

TEST(moe) {
  moe_case(9, 256, 16, 4, 48, 64, 1);
  moe_case(9, 256, 16, 4, 48, 0, 0);
  /* the Qwen3.5-MoE 35B-A3B shape with 64 experts: ragged T (not a multiple of the 8 rows per
   * routing block), one decode-like row, with and without the shared expert / renormalisation */
  moe_case(13, 2048, 64, 8, 512, 512, 1);
  moe_case(1, 2048, 64, 8, 512, 512, 1);
  moe_case(5, 2048, 64, 8, 512, 0, 0);
  /* routing with 16 and 32 logits per lane (Qwen3-Next's 512 experts; 1,000) */
  moe_case(3, 256, 512, 10, 64, 64, 1);
  moe_case(2, 256, 1000, 8, 32, 0, 0);
}

/* The grouped path (the default; asked for explicitly here): steps of >= 64 rows take the
 * rows grouped by expert, through per-expert cuBLAS GEMMs (two chunks of 2048 rows at T = 2100,
 * widths that are no multiple of 256) or the device-grouped kernels (T <= 512, H and I
 * multiples of 256: T = 300 and 97 here; `dev` counts those), and so do steps of 8 .. 63 rows
 * where the device-grouped kernels take them; smaller steps keep the per-row kernels. */
static void moe_dev_case(int T, int H, int E, int k, int I, int Is, int norm, int dev) {
  long r0 = backend_cuda_moe_dev_runs(GPU);
  moe_case(T, H, E, k, I, Is, norm);
  long n = backend_cuda_moe_dev_runs(GPU) - r0;
  n_checks++;
  EXPECT_MSG(n == dev, "moe T=%d H=%d I=%d: %ld device-grouped runs, expected %d", T, H, I, n, dev);
}
static void moe_grouped_cases(void) {
  moe_dev_case(100, 256, 16, 4, 48, 64, 1, 0);
  moe_dev_case(2100, 256, 16, 4, 48, 64, 1, 0);
  moe_dev_case(300, 2048, 64, 8, 512, 512, 1, 1); /* ~37 rows per expert: chunks of 8 */
  moe_dev_case(97, 2048, 64, 8, 512, 0, 0, 1);
  moe_dev_case(9, 256, 16, 4, 48, 64, 1, 0);   /* I = 48: the per-row kernels */
  moe_dev_case(5, 2048, 64, 8, 512, 0, 0, 0);  /* below moe_dev_min: the per-row kernels */
  moe_dev_case(13, 2048, 64, 8, 512, 0, 0, 1); /* 8 .. 63 rows: device-grouped */
}
TEST(moe_grouped) { moe_grouped_cases(); }

/* moe_cublas: the per-expert cuBLAS GEMMs at decode sizes too */
static void moe_cublas_cases(void) {
  moe_dev_case(300, 2048, 64, 8, 512, 512, 1, 0);
  moe_dev_case(97, 2048, 64, 8, 512, 0, 0, 0);
}
TEST(moe_grouped_cublas) { with_gpu((backend_cuda_test){.moe_cublas = 1}, moe_cublas_cases); }

/* moe_dev_all: the device-grouped kernels for every step of <= 512 rows: one row, experts
 * with no rows, ragged counts, the 256-expert shape of Qwen3.5-35B-A3B at 128 rows */
static void moe_dev_small_cases(void) {
  moe_dev_case(1, 2048, 64, 8, 512, 512, 1, 1);
  moe_dev_case(13, 2048, 64, 8, 512, 0, 0, 1);
  moe_dev_case(128, 2048, 256, 8, 512, 512, 1, 1);
  moe_dev_case(9, 256, 16, 4, 256, 64, 1, 1);
}
TEST(moe_grouped_dev) { with_gpu((backend_cuda_test){.moe_dev_all = 1}, moe_dev_small_cases); }

/* no_moe_grouped: the per-row kernels for steps of >= 64 rows too */
static void moe_per_row_cases(void) {
  moe_case(100, 256, 16, 4, 48, 64, 1);
  moe_case(300, 2048, 64, 8, 512, 512, 1);
}
TEST(moe_per_row) { with_gpu((backend_cuda_test){.no_moe_grouped = 1}, moe_per_row_cases); }

/* The router kernel (the routing in each row's last router block) against the CPU: one and
 * five rows (per-row kernels), 13 (device-grouped), 100 (cuBLAS-grouped), 16 / 64 / 512 / 1,000
 * experts (8 / 8 / 16 / 32 logits per lane), H 256, 2,048 and 2,560; then three cases of tied
 * router logits (moe_tied_pairs). */
static void moe_router_cases(void) {
  moe_case(1, 2048, 64, 8, 512, 512, 1);
  moe_case(5, 2048, 64, 8, 512, 0, 0);
  moe_case(13, 2048, 64, 8, 512, 0, 0);
  moe_case(100, 256, 16, 4, 48, 64, 1);
  moe_case(3, 256, 512, 10, 64, 64, 1);
  moe_case(2, 256, 1000, 8, 32, 0, 0);
  moe_case(2, 2560, 16, 4, 64, 64, 1);
  moe_tied_pairs = 1;
  moe_case(3, 256, 64, 7, 48, 64, 1);
  moe_case(2, 256, 512, 5, 32, 0, 0);
  moe_case(1, 256, 1000, 3, 32, 0, 1);
  moe_tied_pairs = 0;
}
TEST(moe_router) { moe_router_cases(); }

TEST(logits) {
  pieces p = {3, {3, 1, 2}, {0, 7, 4}, {0, 1, 2}};
  int32_t rows[3] = {5, 0, 3};
  set_batch(&p, 3, rows);
  int T = T_of(&p), H = 256, V = 1001;
  float *x = rand_vec((size_t)T * H, 1.f), *nw = rand_vec(H, 0.3f),
        *W = rand_vec((size_t)V * H, 0.1f);
  wpair wn = wup(nw, 1, H), ww = wup(W, V, H);
  pair px = pr(BACKEND_KIND_ACT, x, (size_t)T * H), out = pr_out(BACKEND_KIND_F32, (size_t)3 * V);
  CPU->logits(CPU, px.c, wn.c, 1e-6f, ww.c, H, V, out.c);
  GPU->logits(GPU, px.g, wn.g, 1e-6f, ww.g, H, V, out.g);
  CMP(out.c, out.g, BACKEND_KIND_F32, out.n, 8e-3, "logits (3 of 6 rows)");
  gpu_ok();
  pr_free(px);
  pr_free(out);
  wfree(wn);
  wfree(ww);
  free(x);
  free(nw);
  free(W);
}

/* The optional argmax op: exactly the sampler's greedy choice (and the CPU op's), on rows of
 * the real vocabulary width, with ties, NaN, -0/+0, -inf rows, and an odd width (scalar path);
 * the host pinned-memory ops round-trip a read. */
static void argmax_case(int n, int V) {
  float *x = malloc(sizeof(float) * (size_t)n * V);
  for (size_t i = 0; i < (size_t)n * V; i++) x[i] = bfr(urand() * 4);
  if (n >= 6) {
    for (int i = 0; i < V; i++) x[(size_t)1 * V + i] = (float)((i * 7) % 5); /* many ties */
    x[(size_t)2 * V + 0] = NAN;                                              /* NaN first: 0 */
    x[(size_t)2 * V + 9] = NAN;
    x[(size_t)3 * V + 5] = NAN;    /* NaN inside */
    x[(size_t)3 * V + V - 1] = 50; /* max last */
    for (int i = 0; i < V; i++) x[(size_t)4 * V + i] = i % 3 ? 0.0f : -0.0f;
    for (int i = 0; i < V; i++) x[(size_t)5 * V + i] = -INFINITY;
  }
  backend_buf xg = GPU->alloc(GPU, BACKEND_KIND_F32, (size_t)n * V);
  backend_buf ig = GPU->alloc(GPU, BACKEND_KIND_I32, n), mg = GPU->alloc(GPU, BACKEND_KIND_F32, n);
  backend_buf xc = CPU->alloc(CPU, BACKEND_KIND_F32, (size_t)n * V);
  backend_buf ic = CPU->alloc(CPU, BACKEND_KIND_I32, n);
  REQUIRE(xg && ig && mg && xc && ic);
  GPU->write(GPU, xg, 0, x, sizeof(float) * (size_t)n * V);
  CPU->write(CPU, xc, 0, x, sizeof(float) * (size_t)n * V);
  GPU->argmax(GPU, xg, n, V, ig, mg);
  CPU->argmax(CPU, xc, n, V, ic, NULL);
  int32_t *idg = GPU->host_alloc(GPU, sizeof(int32_t) * n), *idc = malloc(sizeof(int32_t) * n);
  float *mv = malloc(sizeof(float) * n);
  REQUIRE(idg && idc && mv);
  EXPECT(GPU->read(GPU, ig, 0, idg, sizeof(int32_t) * n) == 0);
  EXPECT(GPU->read(GPU, mg, 0, mv, sizeof(float) * n) == 0);
  CPU->read(CPU, ic, 0, idc, sizeof(int32_t) * n);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int32_t want = sampler_argmax(x + (size_t)r * V, V);
    if (idg[r] != want || idc[r] != want ||
        memcmp(&mv[r], &x[(size_t)r * V + want], sizeof(float)) != 0) {
      if (!bad)
        printf("  argmax row %d of %d x %d: cuda %d, cpu %d, sampler %d\n", r, n, V, idg[r], idc[r],
               want);
      bad++;
    }
  }
  n_checks++;
  printf("  %-28s %d of %d rows differ\n", "argmax", bad, n);
  EXPECT_MSG(bad == 0, "argmax: %d rows differ from the sampler", bad);
  gpu_ok();
  GPU->host_free(GPU, idg);
  free(idc), free(mv), free(x);
  GPU->free(GPU, xg), GPU->free(GPU, ig), GPU->free(GPU, mg);
  CPU->free(CPU, xc), CPU->free(CPU, ic);
}

TEST(argmax) {
  REQUIRE(GPU->argmax && GPU->host_alloc && GPU->host_free);
  argmax_case(9, 151936);   /* rows split over 7 blocks each */
  argmax_case(130, 151936); /* one block per row */
  argmax_case(7, 1001);
  argmax_case(1, 3);
  argmax_case(1, 151936); /* 64 blocks */
  argmax_case(6, 4000);   /* 10 blocks, the tie / NaN / zero / -inf rows */
  argmax_case(6, 4000);   /* again: the counters were reset */
  argmax_case(2, 8);      /* 32 blocks, most of them past the row's end */
}

/* ---- sampled ids (sample; cuda_sample.cu): the host sampler's, bit for bit ---- */
TEST(sample) {
  REQUIRE(GPU->sample != NULL);
  int checked = 0, bad = 0;
  sample_cases_run(GPU, 37, 64, 0, &checked, &bad);
  sample_cases_run(GPU, 4000, 140, 0, &checked, &bad);
  sample_cases_run(GPU, 151936, 130, 0, &checked, &bad);
  sample_cases_run(GPU, 248320, 8, 1, &checked, &bad);
  n_checks++;
  printf("  sample: %d of %d ids differ from the host sampler's\n", bad, checked);
  EXPECT_MSG(bad == 0, "%d of %d ids differ from the host sampler's", bad, checked);
  EXPECT(checked > 5000);
  char err[256] = "";
  EXPECT_MSG(GPU->sync(GPU, err, sizeof err) == 0, "device failed: %s", err);
}

/* What the op costs (printed, not checked: timings are not the test's business): rows of the
 * 4B vocabulary, each call on fresh logits (a device copy, timed alone and subtracted). */
static double sample_now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

TEST(sample_timing) {
  REQUIRE(GPU->sample != NULL);
  const int V = 151936, NR = 64, REPS = 20;
  float *l = malloc((size_t)NR * V * sizeof *l);
  int32_t *words = malloc((size_t)NR * SAMPLE_RULE_WORDS * sizeof *words);
  REQUIRE(l && words);
  for (int r = 0; r < NR; r++) sc_fill(l + (size_t)r * V, V, 0);
  backend_buf src = GPU->alloc(GPU, BACKEND_KIND_F32, (size_t)NR * V);
  backend_buf x = GPU->alloc(GPU, BACKEND_KIND_F32, (size_t)NR * V);
  backend_buf bp = GPU->alloc(GPU, BACKEND_KIND_I32, (size_t)NR * SAMPLE_RULE_WORDS);
  backend_buf bi = GPU->alloc(GPU, BACKEND_KIND_I32, NR);
  REQUIRE(src && x && bp && bi);
  GPU->write(GPU, src, 0, l, (size_t)NR * V * sizeof *l);
  static const struct {
    const char *name;
    float t, p;
    int k;
  } cf[] = {{"greedy", 0, 1, 0},
            {"T 1", 1, 1, 0},
            {"T 0.7 top_p 0.95", 0.7f, 0.95f, 0},
            {"T 0.7 top_p 0.95 top_k 20", 0.7f, 0.95f, 20}};
  for (int rows = 1; rows <= NR; rows *= 64) {
    double t0 = sample_now_us();
    for (int i = 0; i < REPS; i++) GPU->copy(GPU, x, 0, src, 0, (size_t)rows * V * 4);
    GPU->sync(GPU, NULL, 0);
    double copy_us = (sample_now_us() - t0) / REPS;
    for (int c = 0; c < 4; c++) {
      for (int r = 0; r < rows; r++) {
        sample_rule_row q = {cf[c].t, cf[c].p, 0.0f, cf[c].k, 12345ull * (uint64_t)(r + 1), 0, 0};
        sample_rule_pack(&q, words + (size_t)r * SAMPLE_RULE_WORDS);
      }
      GPU->write(GPU, bp, 0, words, (size_t)rows * SAMPLE_RULE_WORDS * sizeof *words);
      t0 = sample_now_us();
      for (int i = 0; i < REPS; i++) {
        GPU->copy(GPU, x, 0, src, 0, (size_t)rows * V * 4);
        GPU->sample(GPU, x, rows, V, bp, bi);
      }
      GPU->sync(GPU, NULL, 0);
      double us = (sample_now_us() - t0) / REPS - copy_us;
      printf("  sample timing: %d row(s) of %d, %s: %.1f us per call\n", rows, V, cf[c].name, us);
    }
  }
  n_checks++;
  char err[256] = "";
  EXPECT_MSG(GPU->sync(GPU, err, sizeof err) == 0, "device failed: %s", err);
  GPU->free(GPU, src);
  GPU->free(GPU, x);
  GPU->free(GPU, bp);
  GPU->free(GPU, bi);
  free(l);
  free(words);
}

/* ---- the greedy ids without the whole lm-head (logits_argmax; cuda_greedy.cu) ----
 * For one output row the op screens the vocabulary with an int8 copy of W and computes only
 * the rows that can win: its id must be exactly the first maximum of the same backend's
 * logits, whatever the rows. Checked on random rows at the 4B vocabulary, duplicated winning
 * rows (a tie: the lower id), a pair of rows whose int8 copies order them the other way than
 * their bf16 values, a zero hidden row (every logit 0), a hidden row with a NaN, a W with an
 * infinity (the screen declines), two to four rows out (zero and NaN rows beside others),
 * and five rows out and a width the screen does not take (the logits + argmax path). Each case
 * runs a few times: recorded, captured, then replayed. */
static long greedy_screened(void) { return backend_cuda_greedy_screened(GPU, NULL, NULL); }

/* ids from logits_argmax and from logits + the host's scan, n rows out, compared */
static int greedy_trial(backend_weight nw, backend_weight W, int H, int V, const float *x, int n,
                        int32_t *got) {
  pieces p = {n, {1, 1, 1, 1, 1}, {3, 9, 20, 7, 11}, {0, 1, 2, 3, 4}};
  int32_t rows[5] = {0, 1, 2, 3, 4};
  backend_buf xb = mk(GPU, BACKEND_KIND_ACT, x, (size_t)n * H);
  backend_buf lg = GPU->alloc(GPU, BACKEND_KIND_F32, (size_t)n * V);
  backend_buf ib = GPU->alloc(GPU, BACKEND_KIND_I32, (size_t)n);
  set_batch(&p, n, rows);
  GPU->logits(GPU, xb, nw, 1e-6f, W, H, V, lg);
  float *l = get(GPU, lg, BACKEND_KIND_F32, (size_t)n * V);
  set_batch(&p, n, rows);
  poison(GPU, lg, BACKEND_KIND_F32, (size_t)n * V);
  GPU->logits_argmax(GPU, xb, nw, 1e-6f, W, H, V, lg, ib);
  int32_t ids[5] = {-1, -1, -1, -1, -1};
  EXPECT(GPU->read(GPU, ib, 0, ids, sizeof(int32_t) * (size_t)n) == 0);
  gpu_ok();
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int32_t want = sampler_argmax(l + (size_t)r * V, V);
    if (ids[r] != want) {
      printf("  logits_argmax row %d (H %d, V %d): %d, argmax of the logits %d (%.9g vs %.9g)\n", r,
             H, V, ids[r], want, ids[r] >= 0 && ids[r] < V ? l[(size_t)r * V + ids[r]] : NAN,
             l[(size_t)r * V + want]);
      bad++;
    }
    if (got) got[r] = ids[r];
  }
  free(l);
  GPU->free(GPU, xb), GPU->free(GPU, lg), GPU->free(GPU, ib);
  return bad;
}

static uint16_t *bf_rand(size_t n, float scale) {
  uint16_t *w = malloc(n * 2);
  for (size_t i = 0; i < n; i++) w[i] = f2b(urand() * scale);
  return w;
}

/* A case: W [V, H] (bf16 values), trials hidden rows; the screen is expected to run (screen)
 * or not. Returns the rows that differ. */
static int greedy_case(const uint16_t *Wb, int H, int V, int trials, int n, int screen,
                       const float *nwv, const char *what) {
  backend_weight W = GPU->weight_upload(GPU, Wb, DTYPE_BF16, V, H);
  float *zero = calloc((size_t)H, sizeof(float));
  backend_weight nw = GPU->weight_upload(GPU, nwv ? nwv : zero, DTYPE_F32, 1, H);
  EXPECT(W && nw);
  if (!W || !nw) return 1;
  char err[256] = "";
  EXPECT_MSG(GPU->logits_argmax_prepare(GPU, W, H, V, err, sizeof err) == 0, "prepare: %s", err);
  long s0 = greedy_screened();
  int bad = 0;
  for (int t = 0; t < trials; t++) {
    float *x = rand_vec((size_t)n * H, 1.f);
    bad += greedy_trial(nw, W, H, V, x, n, NULL);
    free(x);
  }
  long ran = greedy_screened() - s0;
  long long rows = 0;
  backend_cuda_greedy_screened(GPU, NULL, &rows);
  printf("  %-44s %d of %d trials differ, %ld screened, %lld rows computed in all\n", what, bad,
         trials, ran, rows);
  EXPECT_MSG(bad == 0, "%s: %d ids differ from argmax of the logits", what, bad);
  if (screen)
    EXPECT_MSG(ran >= 1, "%s: the screen never ran", what);
  else
    EXPECT_MSG(ran == 0, "%s: the screen ran %ld times", what, ran);
  /* the bytes the benchmark's roofline counts for a screened step: the int8 rows, a float4
   * per row, the bounds written and read, the int16 copies; none for a step it does not take */
  double sb = backend_cuda_greedy_step_bytes(GPU, n),
         want = (double)V * H + 16.0 * V + 8.0 * n * V + 2.0 * n * H;
  EXPECT_MSG(screen ? sb == want : sb == 0, "%s: step bytes %.0f (screen %d, want %.0f)", what, sb,
             screen, want);
  EXPECT(backend_cuda_greedy_step_bytes(GPU, 5) == 0);
  GPU->weight_free(GPU, W);
  GPU->weight_free(GPU, nw);
  free(zero);
  return bad;
}

/* bf16 values b (as float) with the screen's int8 rounding q(b) = rint(b / (1 / 127)) */
static int greedy_q(float b) { return (int)rintf(b / (1.f / 127.f)); }

TEST(logits_argmax) {
  REQUIRE(GPU->logits_argmax && GPU->logits_argmax_prepare);
  int H = 2560, V = 151936;
  uint16_t *W = bf_rand((size_t)V * H, 0.05f);
  float *nwv = rand_vec(H, 0.3f);
  greedy_case(W, H, V, 6, 1, 1, nwv, "random rows, 4B shape");
  greedy_case(W, H, V, 3, 2, 1, nwv, "two rows out");
  greedy_case(W, H, V, 3, 3, 1, nwv, "three rows out");
  greedy_case(W, H, V, 3, 4, 1, nwv, "four rows out");
  greedy_case(W, H, V, 2, 5, 0, nwv, "five rows out (logits + argmax)");

  /* the rows that win on one hidden row, copied to a lower and a higher id: a tie */
  backend_weight Wg = GPU->weight_upload(GPU, W, DTYPE_BF16, V, H);
  backend_weight ng = GPU->weight_upload(GPU, nwv, DTYPE_F32, 1, H);
  float *x = rand_vec(H, 1.f);
  int32_t first = -1;
  char err[256] = "";
  EXPECT(GPU->logits_argmax_prepare(GPU, Wg, H, V, err, sizeof err) == 0);
  EXPECT(greedy_trial(ng, Wg, H, V, x, 1, &first) == 0);
  GPU->weight_free(GPU, Wg);
  REQUIRE(first > 0 && first < V);
  int lo = first / 2, hi = first + (V - first) / 2;
  memcpy(W + (size_t)lo * H, W + (size_t)first * H, (size_t)H * 2);
  memcpy(W + (size_t)hi * H, W + (size_t)first * H, (size_t)H * 2);
  Wg = GPU->weight_upload(GPU, W, DTYPE_BF16, V, H);
  EXPECT(GPU->logits_argmax_prepare(GPU, Wg, H, V, err, sizeof err) == 0);
  int32_t tie = -1;
  long s0 = greedy_screened();
  for (int k = 0; k < 3; k++) EXPECT(greedy_trial(ng, Wg, H, V, x, 1, &tie) == 0);
  printf("  %-44s winner %d, copies at %d and %d: %d\n", "tie (duplicated rows)", first, lo, hi,
         tie);
  EXPECT_MSG(tie == lo, "tie: %d, want the lower copy %d", tie, lo);
  { /* the same hidden row as the third of three, beside a zero row and a NaN row */
    float *x3 = calloc((size_t)3 * H, sizeof(float));
    memcpy(x3 + (size_t)2 * H, x, sizeof(float) * H);
    x3[(size_t)1 * H + 5] = NAN;
    int32_t id3[3] = {-1, -1, -1};
    for (int k = 0; k < 2; k++) EXPECT(greedy_trial(ng, Wg, H, V, x3, 3, id3) == 0);
    printf("  %-44s %d, %d, %d\n", "three rows: zero, NaN, the tie", id3[0], id3[1], id3[2]);
    EXPECT(id3[0] == 0 && id3[1] == 0 && id3[2] == lo);
    free(x3);
  }
  EXPECT(greedy_screened() - s0 >= 1); /* the later ones may be graph replays */

  /* zero hidden row: every logit 0, id 0; a NaN in the hidden row: every logit NaN, id 0 */
  float *z = calloc((size_t)H, sizeof(float));
  int32_t zid = -1, nid = -1;
  for (int k = 0; k < 2; k++) EXPECT(greedy_trial(ng, Wg, H, V, z, 1, &zid) == 0);
  z[17] = NAN;
  for (int k = 0; k < 2; k++) EXPECT(greedy_trial(ng, Wg, H, V, z, 1, &nid) == 0);
  printf("  %-44s %d, %d\n", "zero / NaN hidden row", zid, nid);
  EXPECT(zid == 0 && nid == 0);
  GPU->weight_free(GPU, Wg);
  GPU->weight_free(GPU, ng);
  free(z);
  free(x);

  /* two rows whose int8 copies order them the other way: both [1, .., v, .., u, ..], the rest
   * of W small; row A has (v1, u1), row B (> A) has (v2, u2): v2 one bf16 step below v1 but a
   * whole int8 step lower, u2 one bf16 step above u1 in the same int8 step, so B's bf16 logit
   * is larger and A's int8 one. The hidden row is all ones (norm weight 0). */
  {
    int Vs = 40000;
    uint16_t *Ws = bf_rand((size_t)Vs * H, 0.005f);
    float v1 = 0, v2 = 0, u1 = 0, u2 = 0;
    for (uint16_t b = f2b(0.0625f); b < f2b(0.125f); b++)
      if (greedy_q(b2f((uint16_t)(b + 1))) == greedy_q(b2f(b)) + 1) {
        v2 = b2f(b), v1 = b2f((uint16_t)(b + 1));
        break;
      }
    for (uint16_t b = f2b(0.5f); b < f2b(0.9f); b++)
      if (greedy_q(b2f((uint16_t)(b + 1))) == greedy_q(b2f(b))) {
        u1 = b2f(b), u2 = b2f((uint16_t)(b + 1));
        break;
      }
    REQUIRE(v1 > 0 && u1 > 0 && (u2 - u1) > (v1 - v2));
    int A = 1234, B = 30321;
    for (int r = 0; r < 2; r++) {
      uint16_t *row = Ws + (size_t)(r ? B : A) * H;
      for (int j = 0; j < H; j++) row[j] = f2b(0.f);
      row[0] = f2b(1.f);
      row[100] = f2b(r ? v2 : v1);
      row[2000] = f2b(r ? u2 : u1);
    }
    backend_weight Wq = GPU->weight_upload(GPU, Ws, DTYPE_BF16, Vs, H);
    float *ones = malloc(sizeof(float) * (size_t)H), *nz = calloc((size_t)H, sizeof(float));
    for (int j = 0; j < H; j++) ones[j] = 1.f;
    backend_weight n0 = GPU->weight_upload(GPU, nz, DTYPE_F32, 1, H);
    EXPECT(GPU->logits_argmax_prepare(GPU, Wq, H, Vs, err, sizeof err) == 0);
    int32_t id = -1;
    s0 = greedy_screened();
    for (int k = 0; k < 3; k++) EXPECT(greedy_trial(n0, Wq, H, Vs, ones, 1, &id) == 0);
    printf("  %-44s rows %d / %d (v %.6g / %.6g, u %.6g / %.6g): %d\n",
           "int8 order against bf16 order", A, B, v1, v2, u1, u2, id);
    EXPECT_MSG(id == B, "the int8-reversed pair: %d, want %d", id, B);
    EXPECT(greedy_screened() - s0 >= 1);
    GPU->weight_free(GPU, Wq);
    GPU->weight_free(GPU, n0);
    free(ones), free(nz), free(Ws);
  }

  /* an infinity in W: no bound holds, the screen declines (the ids still right) */
  W[(size_t)5 * H + 3] = f2b(INFINITY);
  greedy_case(W, H, 50000, 2, 1, 0, nwv, "an infinity in W (declined)");
  free(W);
  /* other widths: 1,024 screened, 1,000 not */
  W = bf_rand((size_t)30000 * 1024, 0.05f);
  greedy_case(W, 1024, 30000, 4, 1, 1, NULL, "H 1024");
  greedy_case(W, 1024, 30000, 2, 4, 1, NULL, "H 1024, four rows out");
  free(W);
  W = bf_rand((size_t)3001 * 1000, 0.05f);
  greedy_case(W, 1000, 3001, 2, 1, 0, NULL, "H 1000 (not screened)");
  free(W);
  free(nwv);
}

/* ---- decode steps: recorded, fused and replayed as graphs vs launched as issued ----
 * A one-layer-of-each-kind model step (attention, DeltaNet, FFN, logits, argmax) run for ten
 * decode steps (2 rows, then 1, then 2 again: two graph shapes and a cache hit) on the default
 * CUDA backend and on one created with no_graphs. Every logit, id, state and KV byte
 * must be identical, and the first backend must really have captured, replayed and fused. */
enum {
  DH = 256,
  DV = 300,
  DNH = 4,
  DNKV = 2,
  DHD = 64,
  DROT = 32,
  DNK = 1,
  DNVH = 2,
  DDK = 128,
  DDV = 128,
  DCD = 2 * DNK * DDK + DNVH * DDV,
  DI = 384,
  DPAGES = 8,
  DMAXP = 4
};
enum {
  W_E,
  W_N1,
  W_N2,
  W_N3,
  W_NF,
  W_Q,
  W_K,
  W_V,
  W_O,
  W_QN,
  W_KN,
  W_QKV,
  W_Z,
  W_B,
  W_A,
  W_CONV,
  W_DT,
  W_AL,
  W_LN,
  W_OUT,
  W_G,
  W_U,
  W_D,
  W_COUNT
};
enum {
  B_X,
  B_XN,
  B_QG,
  B_Q,
  B_GO,
  B_K,
  B_V,
  B_ATT,
  B_MIX,
  B_QKV,
  B_CO,
  B_Z,
  B_BB,
  B_AA,
  B_BETA,
  B_G,
  B_O,
  B_FG,
  B_FU,
  B_LOG,
  B_IDS,
  B_KP,
  B_VP,
  B_CONV,
  B_SSM,
  B_COUNT
};
typedef struct {
  backend *be;
  backend_weight w[W_COUNT];
  backend_buf b[B_COUNT];
  /* repeat: a step of the previous step's row count asks the backend to run that step's ops
   * again (step_repeat) instead of issuing them, as the model's forward does; last_n: that
   * count (0: none yet) */
  int repeat, last_n;
} dmodel;

static const int64_t dw_shape[W_COUNT][2] = {
    {DV, DH},         {1, DH},          {1, DH},        {1, DH},  {1, DH},   {DNH * 2 * DHD, DH},
    {DNKV * DHD, DH}, {DNKV * DHD, DH}, {DH, DNH *DHD}, {1, DHD}, {1, DHD},  {DCD, DH},
    {DNVH * DDV, DH}, {DNVH, DH},       {DNVH, DH},     {DCD, 4}, {1, DNVH}, {1, DNVH},
    {1, DDV},         {DH, DNVH *DDV},  {DI, DH},       {DI, DH}, {DH, DI}};

static void dmodel_init(dmodel *m, backend *be, float **wh, float **init) {
  m->be = be;
  for (int i = 0; i < W_COUNT; i++)
    m->w[i] = be->weight_upload(be, wh[i], DTYPE_F32, dw_shape[i][0], dw_shape[i][1]);
  size_t T = 2;
  struct {
    backend_kind k;
    size_t n;
  } sz[B_COUNT] = {{BACKEND_KIND_ACT, T * DH},
                   {BACKEND_KIND_ACT, T * DH},
                   {BACKEND_KIND_ACT, T * DNH * 2 * DHD},
                   {BACKEND_KIND_ACT, T * DNH * DHD},
                   {BACKEND_KIND_ACT, T * DNH * DHD},
                   {BACKEND_KIND_ACT, T * DNKV * DHD},
                   {BACKEND_KIND_ACT, T * DNKV * DHD},
                   {BACKEND_KIND_ACT, T * DNH * DHD},
                   {BACKEND_KIND_ACT, T * DH},
                   {BACKEND_KIND_ACT, T * DCD},
                   {BACKEND_KIND_ACT, T * DCD},
                   {BACKEND_KIND_ACT, T * DNVH * DDV},
                   {BACKEND_KIND_ACT, T * DNVH},
                   {BACKEND_KIND_ACT, T * DNVH},
                   {BACKEND_KIND_F32, T * DNVH},
                   {BACKEND_KIND_F32, T * DNVH},
                   {BACKEND_KIND_ACT, T * DNVH * DDV},
                   {BACKEND_KIND_ACT, T * DI},
                   {BACKEND_KIND_ACT, T * DI},
                   {BACKEND_KIND_F32, T * DV},
                   {BACKEND_KIND_I32, T},
                   {BACKEND_KIND_KV, (size_t)DPAGES * 16 * DNKV * DHD},
                   {BACKEND_KIND_KV, (size_t)DPAGES * 16 * DNKV * DHD},
                   {BACKEND_KIND_F32, (size_t)2 * DCD * 3},
                   {BACKEND_KIND_F32, (size_t)2 * DNVH * DDK * DDV}};
  for (int i = 0; i < B_COUNT; i++) {
    m->b[i] = be->alloc(be, sz[i].k, sz[i].n);
    if (i >= B_KP) put(be, m->b[i], sz[i].k, init[i - B_KP], sz[i].n);
  }
}

static void dmodel_free(dmodel *m) {
  for (int i = 0; i < W_COUNT; i++) m->be->weight_free(m->be, m->w[i]);
  for (int i = 0; i < B_COUNT; i++) m->be->free(m->be, m->b[i]);
}

static void dmodel_ops(dmodel *m, int T, float eps);

/* One decode step of rows (seq s at position pos[s]) for s < n; logits and ids read back. */
static void dmodel_step(dmodel *m, int n, const int32_t *pos, float *logits, int32_t *ids) {
  backend *be = m->be;
  backend_buf *b = m->b;
  static int32_t pt[2 * DMAXP] = {0, 1, 2, 3, 4, 5, 6, 7};
  int32_t tok[2] = {(int32_t)((pos[0] * 37 + 5) % DV), (int32_t)((pos[1] * 11 + 3) % DV)};
  int32_t seq[2] = {0, 1}, st[2] = {0, 1}, len[2] = {1, 1}, slot[2] = {0, 1}, orow[2] = {0, 1};
  backend_batch bb = {n, n, tok, pos, seq, st, len, pos, slot, pt, DMAXP, n, orow, NULL};
  EXPECT(be->set_batch(be, &bb) == 0);
  int T = n;
  float eps = 1e-6f;
  int again = m->repeat && n == m->last_n && be->step_repeat && be->step_repeat(be);
  m->last_n = n;
  if (!again) dmodel_ops(m, T, eps);
  EXPECT(be->read(be, b[B_LOG], 0, logits, sizeof(float) * (size_t)T * DV) == 0);
  EXPECT(be->read(be, b[B_IDS], 0, ids, sizeof(int32_t) * (size_t)T) == 0);
}

/* The ops of one step of T rows (dmodel_step). */
static void dmodel_ops(dmodel *m, int T, float eps) {
  backend *be = m->be;
  backend_weight *w = m->w;
  backend_buf *b = m->b;
  be->embed(be, w[W_E], DH, b[B_X]);
  be->rmsnorm(be, b[B_X], NULL, w[W_N1], T, DH, eps, b[B_XN]);
  be->matmul(be, b[B_XN], w[W_Q], T, DH, DNH * 2 * DHD, b[B_QG]);
  be->matmul(be, b[B_XN], w[W_K], T, DH, DNKV * DHD, b[B_K]);
  be->matmul(be, b[B_XN], w[W_V], T, DH, DNKV * DHD, b[B_V]);
  be->qk_norm_rope(be, b[B_QG], b[B_K], w[W_QN], w[W_KN], DNH, DNKV, DHD, DROT, 1e7, eps, b[B_Q],
                   b[B_GO]);
  be->attention(be, b[B_KP], b[B_VP], b[B_Q], b[B_K], b[B_V], DNH, DNKV, DHD, 0.125f, b[B_ATT]);
  be->sigmoid_mul(be, b[B_ATT], b[B_GO], (size_t)T * DNH * DHD);
  be->matmul(be, b[B_ATT], w[W_O], T, DNH * DHD, DH, b[B_MIX]);
  be->rmsnorm(be, b[B_X], b[B_MIX], w[W_N2], T, DH, eps, b[B_XN]);
  be->matmul(be, b[B_XN], w[W_QKV], T, DH, DCD, b[B_QKV]);
  be->matmul(be, b[B_XN], w[W_Z], T, DH, DNVH * DDV, b[B_Z]);
  be->matmul(be, b[B_XN], w[W_B], T, DH, DNVH, b[B_BB]);
  be->matmul(be, b[B_XN], w[W_A], T, DH, DNVH, b[B_AA]);
  be->conv1d(be, b[B_CONV], b[B_QKV], w[W_CONV], DCD, 4, b[B_CO]);
  be->gdn_gates(be, b[B_CO], b[B_BB], b[B_AA], w[W_AL], w[W_DT], DNK, DNVH, DDK, DDV, b[B_BETA],
                b[B_G]);
  be->gdn_decode(be, b[B_SSM], b[B_CO], b[B_BETA], b[B_G], DNK, DNVH, DDK, DDV, b[B_O]);
  be->gated_rmsnorm(be, b[B_O], b[B_Z], w[W_LN], T, DNVH, DDV, eps, b[B_O]);
  be->matmul(be, b[B_O], w[W_OUT], T, DNVH * DDV, DH, b[B_MIX]);
  be->rmsnorm(be, b[B_X], b[B_MIX], w[W_N3], T, DH, eps, b[B_XN]);
  be->matmul(be, b[B_XN], w[W_G], T, DH, DI, b[B_FG]);
  be->matmul(be, b[B_XN], w[W_U], T, DH, DI, b[B_FU]);
  be->swiglu(be, b[B_FG], b[B_FU], (size_t)T * DI, b[B_FG]);
  be->matmul(be, b[B_FG], w[W_D], T, DI, DH, b[B_MIX]);
  be->add(be, b[B_X], b[B_MIX], (size_t)T * DH);
  be->logits(be, b[B_X], w[W_NF], eps, w[W_E], DH, DV, b[B_LOG]);
  be->argmax(be, b[B_LOG], T, DV, b[B_IDS], NULL);
}

/* Random weights and initial pools (K, V, conv state, DeltaNet state) for dmodel_init. */
static void dmodel_data(float **wh, float **init) {
  for (int i = 0; i < W_COUNT; i++) {
    size_t n = (size_t)(dw_shape[i][0] * dw_shape[i][1]);
    int norm = dw_shape[i][0] == 1;
    wh[i] = rand_vec(n, norm ? 0.3f : i == W_CONV ? 0.5f : 0.08f);
  }
  for (int i = 0; i < DNVH; i++) wh[W_AL][i] = bfr(-1.f + 0.3f * i); /* A_log: decays < 1 */
  size_t kvn = (size_t)DPAGES * 16 * DNKV * DHD;
  init[0] = rand_vec(kvn, 1.f);
  init[1] = rand_vec(kvn, 1.f);
  init[2] = rand_vec((size_t)2 * DCD * 3, 1.f);
  init[3] = rand_vec((size_t)2 * DNVH * DDK * DDV, 0.1f);
}

/* How many of the four pools (K, V, conv state, DeltaNet state) differ in any byte. */
static int dmodel_pools_differ(backend *ba, const dmodel *a, backend *bb, const dmodel *b) {
  size_t kvn = (size_t)DPAGES * 16 * DNKV * DHD;
  size_t sz[4] = {kvn * 2, kvn * 2, (size_t)2 * DCD * 3 * 4, (size_t)2 * DNVH * DDK * DDV * 4};
  int n = 0;
  for (int i = 0; i < 4; i++) {
    uint8_t *x = malloc(sz[i]), *y = malloc(sz[i]);
    ba->read(ba, a->b[B_KP + i], 0, x, sz[i]);
    bb->read(bb, b->b[B_KP + i], 0, y, sz[i]);
    n += memcmp(x, y, sz[i]) != 0;
    free(x);
    free(y);
  }
  return n;
}

/* One model's weights and pools on two backends (the step under test on a, the reference on p). */
typedef struct {
  float *wh[W_COUNT], *init[4];
  dmodel a, p;
} dpair;

static void dpair_init(dpair *d, backend *a, backend *p) {
  dmodel_data(d->wh, d->init);
  dmodel_init(&d->a, a, d->wh, d->init);
  dmodel_init(&d->p, p, d->wh, d->init);
}

static void dpair_free(dpair *d) {
  dmodel_free(&d->a);
  dmodel_free(&d->p);
  for (int i = 0; i < W_COUNT; i++) free(d->wh[i]);
  for (int i = 0; i < 4; i++) free(d->init[i]);
}

/* The ten decode steps of the decode_graph tests (rows 2 2 2 2 2 1 1 1 2 2; row 1 starts fresh
 * at position 0) on both models of d: how many logits (bytes) and ids differ. */
static void dpair_steps(dpair *d, int *ndiff, int *idiff) {
  float la[2 * DV], lp[2 * DV];
  int32_t ia[2], ip[2];
  *ndiff = *idiff = 0;
  for (int k = 0; k < 10; k++) {
    int n = k >= 5 && k < 8 ? 1 : 2;
    int32_t pos[2] = {20 + k, k};
    dmodel_step(&d->a, n, pos, la, ia);
    dmodel_step(&d->p, n, pos, lp, ip);
    for (int i = 0; i < n * DV; i++) *ndiff += memcmp(&la[i], &lp[i], 4) != 0;
    for (int i = 0; i < n; i++) *idiff += ia[i] != ip[i];
  }
}

TEST(decode_graph) {
  /* the norm fold changes bits by design (decode_graph_norm_fold); every other rewrite may not */
  backend *plain = gpu_with(.no_graphs = 1), *gb = gpu_with(.no_norm_fold = 1);
  REQUIRE(plain != NULL && gb != NULL);
  dpair d;
  dpair_init(&d, gb, plain);
  dmodel *a = &d.a, *p = &d.p;
  long st0[6];
  backend_cuda_graph_stats(gb, st0);
  int ndiff, idiff;
  dpair_steps(&d, &ndiff, &idiff);
  int sdiff = dmodel_pools_differ(gb, a, plain, p);
  long st[6];
  backend_cuda_graph_stats(gb, st);
  long cap = st[0] - st0[0], rep = st[1] - st0[1], dir = st[2] - st0[2], fus = st[3] - st0[3],
       pdl = st[4] - st0[4];
  n_checks++;
  printf(
      "  decode steps graph vs direct: %d logits, %d ids, %d state/KV buffers differ; "
      "captures %ld, replays %ld, direct %ld, fused launches %ld, programmatic edges %ld\n",
      ndiff, idiff, sdiff, cap, rep, dir, fus, pdl);
  EXPECT_MSG(ndiff == 0 && idiff == 0 && sdiff == 0, "graph/fused decode steps differ from direct");
  EXPECT_MSG(cap >= 2 && rep >= 4, "graphs not used: %ld captures, %ld replays", cap, rep);
  /* 11 launches saved per step that runs the list (q/k/v 2, qkv/z/b/a 3, gate/up/swiglu 2,
   * the DeltaNet chain 3, the attention output gate 1; replays reuse the fused graph) */
  EXPECT_MSG(fus >= 11 * (cap + dir), "fused %ld launches, expected >= %ld", fus, 11 * (cap + dir));
  /* every kernel of a captured step but the first is launched programmatically (the step is
   * ~20 launches after fusion) */
  EXPECT_MSG(pdl >= 15 * cap, "%ld programmatic edges in %ld captures", pdl, cap);
  EXPECT_MSG(backend_cuda_norm_folds(gb) == 0, "no_norm_fold: %ld norms folded",
             backend_cuda_norm_folds(gb));
  char err[256] = "";
  EXPECT_MSG(gb->sync(gb, err, sizeof err) == 0, "fold-off backend failed: %s", err);
  dpair_free(&d);
  plain->destroy(plain);
  gb->destroy(gb);
}

/* The same ten steps (row counts 2 2 2 2 2 1 1 1 2 2) with the caller asking step_repeat
 * whenever a step has the previous step's row count, as the model's forward does: every logit,
 * id and pool byte equal to the ops launched as issued, and exactly the steps after a captured
 * or replayed graph of their shape repeated without recording (steps 2-4, 7 and 9: 5; six
 * replays with them, as without); with no_repeat the backend declines every time and the
 * results are the same. */
TEST(decode_graph_repeat) {
  backend *plain = gpu_with(.no_graphs = 1), *gb = gpu_with(.no_norm_fold = 1);
  backend *off = gpu_with(.no_norm_fold = 1, .no_repeat = 1);
  REQUIRE(plain != NULL && gb != NULL && off != NULL);
  backend *bs[2] = {gb, off};
  for (int v = 0; v < 2; v++) {
    dpair d;
    dpair_init(&d, bs[v], plain);
    dmodel *a = &d.a, *p = &d.p;
    a->repeat = 1;
    long st0[6], st[6];
    backend_cuda_graph_stats(bs[v], st0);
    int ndiff, idiff;
    dpair_steps(&d, &ndiff, &idiff);
    int sdiff = dmodel_pools_differ(bs[v], a, plain, p);
    backend_cuda_graph_stats(bs[v], st);
    long reps = st[5] - st0[5], replays = st[1] - st0[1];
    n_checks++;
    printf(
        "  decode steps with step_repeat %s vs direct: %d logits, %d ids, %d state/KV buffers "
        "differ; %ld repeated, %ld replays\n",
        v ? "declined (no_repeat)" : "on", ndiff, idiff, sdiff, reps, replays);
    EXPECT_MSG(ndiff == 0 && idiff == 0 && sdiff == 0, "repeated decode steps differ from direct");
    EXPECT_MSG(reps == (v ? 0 : 5), "%ld steps repeated, expected %d", reps, v ? 0 : 5);
    EXPECT_MSG(replays == 6, "%ld replays, expected 6 (repeats included)", replays);
    char err[256] = "";
    EXPECT_MSG(bs[v]->sync(bs[v], err, sizeof err) == 0, "repeat backend failed: %s", err);
    dpair_free(&d);
  }
  plain->destroy(plain);
  gb->destroy(gb);
  off->destroy(off);
}

/* The same ten steps with the norms after a product taken off the products' critical path
 * (the default): both such norms of the step (after the o product, after the DeltaNet out
 * product; the first one follows the embedding) fold in every step that runs the list, and the
 * logits stay within bf16 rounding of the ops as issued (the factor is applied to the sums
 * instead of before xn's rounding): max difference <= 2e-2 of the largest logit; ids equal
 * wherever the issued ops' top two logits are further apart than four times that difference. */
TEST(decode_graph_norm_fold) {
  backend *plain = gpu_with(.no_graphs = 1);
  REQUIRE(plain != NULL);
  dpair d;
  dpair_init(&d, GPU, plain);
  dmodel *a = &d.a, *p = &d.p;
  long st0[6], st[6], f0 = backend_cuda_norm_folds(GPU);
  backend_cuda_graph_stats(GPU, st0);
  float la[2 * DV], lp[2 * DV];
  int32_t ia[2], ip[2];
  double maxd = 0, maxl = 0;
  int idiff = 0, steps = 10;
  float margin[20];
  int32_t ida[20], idp[20], nid = 0;
  for (int k = 0; k < steps; k++) {
    int n = k >= 5 && k < 8 ? 1 : 2;
    int32_t pos[2] = {20 + k, k};
    dmodel_step(a, n, pos, la, ia);
    dmodel_step(p, n, pos, lp, ip);
    for (int r = 0; r < n; r++) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < DV; i++) {
        float d = fabsf(la[r * DV + i] - lp[r * DV + i]), v = lp[r * DV + i];
        if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
        if (fabsf(v) > maxl) maxl = fabsf(v);
        if (v > b1)
          b2 = b1, b1 = v;
        else if (v > b2)
          b2 = v;
      }
      margin[nid] = b1 - b2, ida[nid] = ia[r], idp[nid] = ip[r], nid++;
    }
  }
  for (int i = 0; i < nid; i++) idiff += margin[i] > 4 * maxd && ida[i] != idp[i];
  backend_cuda_graph_stats(GPU, st);
  long runs = (st[0] - st0[0]) + (st[2] - st0[2]), folds = backend_cuda_norm_folds(GPU) - f0;
  n_checks++;
  printf(
      "  decode steps, norms folded vs direct: logits max diff %.3g of max %.3g, %d clear ids "
      "differ; %ld norms folded in %ld listed steps\n",
      maxd, maxl, idiff, folds, runs);
  EXPECT_MSG(maxl > 0 && maxd <= 2e-2 * maxl, "folded norms: logits differ by %.3g (max %.3g)",
             maxd, maxl);
  EXPECT_MSG(idiff == 0, "folded norms: %d ids differ", idiff);
  EXPECT_MSG(runs >= 2 && folds == 2 * runs, "%ld norms folded in %ld listed steps", folds, runs);
  gpu_ok();
  dpair_free(&d);
  plain->destroy(plain);
}

/* ---- MoE decode steps recorded into graphs ----
 * One MoE layer (embed, norm, MoE with a shared expert, residual add, logits, argmax) for
 * twelve decode steps of 1, 12 and 2 rows (the per-row kernels, the device-grouped ones at 12)
 * on the default backend against one with no_graphs: every logit and id identical, and the
 * default backend must have captured and replayed those steps. */
enum { MH = 256, MV = 300, ME = 16, MK = 4, MI = 256, MT = 12 };
typedef struct {
  backend *be;
  backend_weight
      w[4 * ME + 8]; /* gate, up, down per expert; router, shared x3, seg, emb, 2 norms */
  backend_moe moe;   /* read by recorded steps: lives as long as the model */
  backend_buf x, xn, mix, lg, ids;
} mmodel;

static void mmodel_init(mmodel *m, backend *be, float *const *wh) {
  memset(m, 0, sizeof *m);
  m->be = be;
  for (int e = 0; e < 3 * ME; e++) {
    int down = e >= 2 * ME;
    m->w[e] = be->weight_upload(be, wh[e], DTYPE_F32, down ? MH : MI, down ? MI : MH);
  }
  backend_weight *w = m->w + 3 * ME;
  w[0] = be->weight_upload_exact(be, wh[3 * ME], DTYPE_F32, ME, MH);
  w[1] = be->weight_upload(be, wh[3 * ME + 1], DTYPE_F32, MI, MH);
  w[2] = be->weight_upload(be, wh[3 * ME + 2], DTYPE_F32, MI, MH);
  w[3] = be->weight_upload(be, wh[3 * ME + 3], DTYPE_F32, MH, MI);
  w[4] = be->weight_upload(be, wh[3 * ME + 4], DTYPE_F32, 1, MH);
  w[5] = be->weight_upload(be, wh[3 * ME + 5], DTYPE_F32, MV, MH);
  w[6] = be->weight_upload(be, wh[3 * ME + 6], DTYPE_F32, 1, MH);
  w[7] = be->weight_upload(be, wh[3 * ME + 7], DTYPE_F32, 1, MH);
  backend_moe mo = {ME,   MK,   1,    MI,  MI, w[0], m->w, m->w + ME, m->w + 2 * ME,
                    w[1], w[2], w[3], w[4]};
  m->moe = mo;
  m->x = be->alloc(be, BACKEND_KIND_ACT, (size_t)MT * MH);
  m->xn = be->alloc(be, BACKEND_KIND_ACT, (size_t)MT * MH);
  m->mix = be->alloc(be, BACKEND_KIND_ACT, (size_t)MT * MH);
  m->lg = be->alloc(be, BACKEND_KIND_F32, (size_t)MT * MV);
  m->ids = be->alloc(be, BACKEND_KIND_I32, MT);
}

static void mmodel_free(mmodel *m) {
  for (int i = 0; i < 3 * ME + 8; i++) m->be->weight_free(m->be, m->w[i]);
  backend_buf b[5] = {m->x, m->xn, m->mix, m->lg, m->ids};
  for (int i = 0; i < 5; i++) m->be->free(m->be, b[i]);
}

static void mmodel_step(mmodel *m, int n, int k, float *logits, int32_t *ids) {
  backend *be = m->be;
  int32_t tok[MT], pos[MT], seq[MT], len[MT], slot[MT], pt[MT], orow[MT];
  for (int i = 0; i < n; i++)
    tok[i] = (i * 37 + k * 11 + 5) % MV, pos[i] = 3 + k, seq[i] = i, len[i] = 1, slot[i] = i,
    pt[i] = i, orow[i] = i;
  backend_batch bb = {n, n, tok, pos, seq, seq, len, pos, slot, pt, 1, n, orow, NULL};
  EXPECT(be->set_batch(be, &bb) == 0);
  backend_weight *w = m->w + 3 * ME;
  be->embed(be, w[5], MH, m->x);
  be->rmsnorm(be, m->x, NULL, w[6], n, MH, 1e-6f, m->xn);
  be->moe(be, m->xn, &m->moe, n, MH, m->mix);
  be->add(be, m->x, m->mix, (size_t)n * MH);
  be->logits(be, m->x, w[7], 1e-6f, w[5], MH, MV, m->lg);
  be->argmax(be, m->lg, n, MV, m->ids, NULL);
  EXPECT(be->read(be, m->lg, 0, logits, sizeof(float) * (size_t)n * MV) == 0);
  EXPECT(be->read(be, m->ids, 0, ids, sizeof(int32_t) * (size_t)n) == 0);
}

TEST(decode_graph_moe) {
  backend *plain = gpu_with(.no_graphs = 1);
  REQUIRE(plain != NULL);
  float *wh[3 * ME + 8];
  for (int e = 0; e < 3 * ME; e++) wh[e] = rand_vec((size_t)MI * MH, 0.08f);
  wh[3 * ME] = rand_vec((size_t)ME * MH, 0.2f);
  for (int i = 1; i <= 3; i++) wh[3 * ME + i] = rand_vec((size_t)MI * MH, 0.08f);
  wh[3 * ME + 4] = rand_vec(MH, 0.1f);
  wh[3 * ME + 5] = rand_vec((size_t)MV * MH, 0.5f);
  wh[3 * ME + 6] = rand_vec(MH, 0.3f);
  wh[3 * ME + 7] = rand_vec(MH, 0.3f);
  {
    backend *be = GPU;
    mmodel a, p;
    mmodel_init(&a, be, wh);
    mmodel_init(&p, plain, wh);
    long st0[6], st[6];
    backend_cuda_graph_stats(be, st0);
    long dev0 = backend_cuda_moe_dev_runs(be);
    static float la[MT * MV], lp[MT * MV];
    int32_t ia[MT], ip[MT];
    int ndiff = 0, idiff = 0;
    for (int k = 0; k < 12; k++) {
      int n = k < 4 ? 1 : k < 8 ? 12 : 2;
      mmodel_step(&a, n, k, la, ia);
      mmodel_step(&p, n, k, lp, ip);
      for (int i = 0; i < n * MV; i++) ndiff += memcmp(&la[i], &lp[i], 4) != 0;
      for (int i = 0; i < n; i++) idiff += ia[i] != ip[i];
    }
    backend_cuda_graph_stats(be, st);
    long cap = st[0] - st0[0], rep = st[1] - st0[1], dev = backend_cuda_moe_dev_runs(be) - dev0;
    n_checks++;
    printf(
        "  MoE decode steps recorded vs direct: %d logits, %d ids differ; captures %ld, replays "
        "%ld, device-grouped runs %ld\n",
        ndiff, idiff, cap, rep, dev);
    EXPECT_MSG(ndiff == 0 && idiff == 0, "MoE decode steps differ from direct: %d logits, %d ids",
               ndiff, idiff);
    EXPECT_MSG(cap >= 3 && rep >= 6, "MoE steps not in graphs: %ld captures, %ld replays", cap,
               rep);
    EXPECT_MSG(dev >= 2, "12-row steps: %ld device-grouped runs outside replays", dev);
    mmodel_free(&a);
    mmodel_free(&p);
  }
  gpu_ok();
  for (int i = 0; i < 3 * ME + 8; i++) free(wh[i]);
  plain->destroy(plain);
}

/* [product -> mix, rmsnorm(x += mix) -> xn, q/k/v products of xn, then fg += xn]: xn is read
 * after its products, so the norm may not fold (xn would hold the unscaled values). Three steps
 * (direct, captured, replayed): no fold, every output bit equal to the ops as issued. */
static void dmodel_xn_step(dmodel *m, uint16_t *out) {
  backend *be = m->be;
  backend_weight *w = m->w;
  backend_buf *b = m->b;
  static int32_t pt[2 * DMAXP] = {0, 1, 2, 3, 4, 5, 6, 7};
  int32_t tok[1] = {7}, pos[1] = {3}, seq[1] = {0}, st[1] = {0}, len[1] = {1}, slot[1] = {0},
          orow[1] = {0};
  be->zero(be, b[B_FG], 0, (size_t)DI * 2);
  backend_batch bb = {1, 1, tok, pos, seq, st, len, pos, slot, pt, DMAXP, 1, orow, NULL};
  EXPECT(be->set_batch(be, &bb) == 0);
  be->embed(be, w[W_E], DH, b[B_X]);
  be->embed(be, w[W_E], DH, b[B_ATT]); /* DNH * DHD == DH */
  be->matmul(be, b[B_ATT], w[W_O], 1, DNH * DHD, DH, b[B_MIX]);
  be->rmsnorm(be, b[B_X], b[B_MIX], w[W_N1], 1, DH, 1e-6f, b[B_XN]);
  be->matmul(be, b[B_XN], w[W_Q], 1, DH, DNH * 2 * DHD, b[B_QG]);
  be->matmul(be, b[B_XN], w[W_K], 1, DH, DNKV * DHD, b[B_K]);
  be->matmul(be, b[B_XN], w[W_V], 1, DH, DNKV * DHD, b[B_V]);
  be->add(be, b[B_FG], b[B_XN], DH);
  EXPECT(be->read(be, b[B_FG], 0, out, (size_t)DH * 2) == 0);
  EXPECT(be->read(be, b[B_QG], 0, out + DH, (size_t)DNH * 2 * DHD * 2) == 0);
}

/* ---- the packed weight copies (cuda_packed.cuh) ----
 * Random bf16 weights with escapes planted (tiny values, exact zeros, a row holding an
 * infinity: its every turn escapes), uploaded twice, one of them packed (weight_pack). */
static uint16_t *packed_weights(int N, int K, float scale) {
  uint16_t *w = malloc(sizeof(uint16_t) * (size_t)N * K);
  for (size_t i = 0; i < (size_t)N * K; i++) {
    float v = urand() * scale;
    if (i % 7919 == 11) v = 1e-9f * (v < 0 ? -1.f : 1.f); /* far below the row's window */
    if (i % 10007 == 5) v = 0.f;
    w[i] = f2b(v);
  }
  if (N > 3) w[(size_t)3 * K + K / 2] = f2b(INFINITY);
  return w;
}

/* The products of every GEMV launch kind from packed copies, against the same weights unpacked
 * on the same backend: plain products of 1-4 rows at K = 512 .. 9,216 (full and half turns),
 * then a recorded decode step of 1 and 2 rows (products of one x fused, a norm folded into the
 * product before it and the products after it, gate/up/swiglu) run direct, captured and
 * replayed. Every output byte must be the same; the packed copy's size is 1.5 bytes a value
 * and 4 a row, and a width that is not a multiple of 512 gets none. */
static void packed_products_cases(void) {
  REQUIRE(GPU->weight_pack != NULL);
  int Ks[5] = {512, 1536, 2560, 4096, 9216}, Ns[5] = {7, 300, 2560, 33, 2560};
  for (int c = 0; c < 5; c++) {
    int K = Ks[c], N = Ns[c];
    uint16_t *W = packed_weights(N, K, 0.05f);
    backend_weight wn = GPU->weight_upload(GPU, W, DTYPE_BF16, N, K),
                   wp = GPU->weight_upload(GPU, W, DTYPE_BF16, N, K);
    long long pb = GPU->weight_pack(GPU, wp);
    n_checks++;
    EXPECT_MSG(pb == (long long)N * K * 3 / 2 + 4LL * N, "K=%d N=%d: packed %lld bytes", K, N, pb);
    EXPECT(GPU->weight_bytes(GPU, wp) == GPU->weight_bytes(GPU, wn) + (size_t)pb);
    for (int T = 1; T <= 5; T++) {
      float *x = rand_vec((size_t)T * K, 1.f);
      backend_buf bx = mk(GPU, BACKEND_KIND_ACT, x, (size_t)T * K);
      backend_buf yn = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * N),
                  yp = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * N);
      poison(GPU, yn, BACKEND_KIND_ACT, (size_t)T * N);
      poison(GPU, yp, BACKEND_KIND_ACT, (size_t)T * N);
      GPU->matmul(GPU, bx, wn, T, K, N, yn);
      GPU->matmul(GPU, bx, wp, T, K, N, yp);
      uint16_t *a = malloc((size_t)T * N * 2), *b = malloc((size_t)T * N * 2);
      EXPECT(GPU->read(GPU, yn, 0, a, (size_t)T * N * 2) == 0);
      EXPECT(GPU->read(GPU, yp, 0, b, (size_t)T * N * 2) == 0);
      int diff = 0;
      for (size_t i = 0; i < (size_t)T * N; i++) diff += a[i] != b[i];
      n_checks++;
      EXPECT_MSG(diff == 0, "packed matmul T=%d K=%d N=%d: %d of %d outputs differ", T, K, N, diff,
                 T * N);
      free(a), free(b), free(x);
      GPU->free(GPU, bx), GPU->free(GPU, yn), GPU->free(GPU, yp);
    }
    printf("  %-44s K=%d N=%d: %lld bytes, T 1-5 equal\n", "packed matmul", K, N, pb);
    GPU->weight_free(GPU, wn);
    GPU->weight_free(GPU, wp);
    free(W);
  }
  {
    uint16_t *W = packed_weights(64, 1000, 0.05f);
    backend_weight w = GPU->weight_upload(GPU, W, DTYPE_BF16, 64, 1000);
    n_checks++;
    EXPECT_MSG(GPU->weight_pack(GPU, w) == 0, "K=1000 has no packed layout");
    GPU->weight_free(GPU, w);
    free(W);
  }

  /* a recorded decode step: xn = norm(x); a = xn.Wq, b = xn.Wk (fused); mix = a.Wo; xn =
   * norm(x += mix) (folded); g = xn.Wg, u = xn.Wu, h = swiglu (fused); mix = h.Wd; x += mix */
  enum { H = 1024, NQ = 1536, NK = 512, I = 2048, NW = 6 };
  const int64_t shp[NW][2] = {{1, H}, {NQ, H}, {NK, H}, {H, NQ}, {I, H}, {I, H}};
  backend_weight wd_n = NULL, wd_p = NULL;
  backend_weight ws[2][NW];
  uint16_t *Wd = packed_weights(H, I, 0.03f);
  float *hw[NW];
  for (int k = 0; k < NW; k++) hw[k] = rand_vec((size_t)(shp[k][0] * shp[k][1]), k ? 0.05f : 0.3f);
  for (int v = 0; v < 2; v++) {
    for (int k = 0; k < NW; k++) {
      ws[v][k] = GPU->weight_upload(GPU, hw[k], DTYPE_F32, shp[k][0], shp[k][1]);
      if (v && k) EXPECT(GPU->weight_pack(GPU, ws[v][k]) > 0);
    }
  }
  wd_n = GPU->weight_upload(GPU, Wd, DTYPE_BF16, H, I);
  wd_p = GPU->weight_upload(GPU, Wd, DTYPE_BF16, H, I);
  EXPECT(GPU->weight_pack(GPU, wd_p) > 0);
  for (int T = 1; T <= 2; T++) {
    float *x0 = rand_vec((size_t)T * H, 1.f);
    uint16_t *out[2][3];
    long st0[6], st1[6], f0 = backend_cuda_norm_folds(GPU);
    backend_cuda_graph_stats(GPU, st0);
    for (int v = 0; v < 2; v++) {
      backend_buf x = mk(GPU, BACKEND_KIND_ACT, x0, (size_t)T * H),
                  xn = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * H),
                  a = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * NQ),
                  bk = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * NK),
                  mix = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * H),
                  g = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * I),
                  u = mk(GPU, BACKEND_KIND_ACT, NULL, (size_t)T * I);
      backend_weight *w = ws[v], wd = v ? wd_p : wd_n;
      for (int step = 0; step < 3; step++) { /* direct, captured, replayed */
        put(GPU, x, BACKEND_KIND_ACT, x0, (size_t)T * H);
        decode_rows_batch(T);
        GPU->rmsnorm(GPU, x, NULL, w[0], T, H, 1e-6f, xn);
        GPU->matmul(GPU, xn, w[1], T, H, NQ, a);
        GPU->matmul(GPU, xn, w[2], T, H, NK, bk);
        GPU->matmul(GPU, a, w[3], T, NQ, H, mix);
        GPU->rmsnorm(GPU, x, mix, w[0], T, H, 1e-6f, xn);
        GPU->matmul(GPU, xn, w[4], T, H, I, g);
        GPU->matmul(GPU, xn, w[5], T, H, I, u);
        GPU->swiglu(GPU, g, u, (size_t)T * I, g);
        GPU->matmul(GPU, g, wd, T, I, H, mix);
        GPU->add(GPU, x, mix, (size_t)T * H);
        backend_buf rb[3] = {x, bk, g};
        size_t rn[3] = {(size_t)T * H, (size_t)T * NK, (size_t)T * I};
        for (int r = 0; r < 3; r++) {
          uint16_t *h = malloc(rn[r] * 2);
          EXPECT(GPU->read(GPU, rb[r], 0, h, rn[r] * 2) == 0);
          if (step == 0) {
            out[v][r] = h;
          } else {
            EXPECT_MSG(memcmp(out[v][r], h, rn[r] * 2) == 0,
                       "packed %d T=%d step %d buffer %d "
                       "differs from the step's first run",
                       v, T, step, r);
            free(h);
          }
        }
      }
      GPU->free(GPU, x), GPU->free(GPU, xn), GPU->free(GPU, a), GPU->free(GPU, bk);
      GPU->free(GPU, mix), GPU->free(GPU, g), GPU->free(GPU, u);
    }
    backend_cuda_graph_stats(GPU, st1);
    long folds = backend_cuda_norm_folds(GPU) - f0, fused = st1[3] - st0[3];
    size_t rn[3] = {(size_t)T * H, (size_t)T * NK, (size_t)T * I};
    int diff = 0;
    for (int r = 0; r < 3; r++) {
      for (size_t i = 0; i < rn[r]; i++) diff += out[0][r][i] != out[1][r][i];
      free(out[0][r]), free(out[1][r]);
    }
    n_checks++;
    printf("  %-44s T=%d: %d values differ; %ld norms folded, %ld launches fused\n",
           "packed decode step (fused, folded, replayed)", T, diff, folds, fused);
    EXPECT_MSG(diff == 0, "packed decode step T=%d: %d values differ", T, diff);
    /* the list ran at least once per weight set: the fold (one norm) and the fusions (q/k: 1
     * launch saved, gate/up/swiglu: 2) with packed copies too */
    EXPECT_MSG(folds >= 2 && fused >= 6, "T=%d: %ld folds, %ld fused launches", T, folds, fused);
    free(x0);
  }
  for (int v = 0; v < 2; v++)
    for (int k = 0; k < NW; k++) GPU->weight_free(GPU, ws[v][k]);
  GPU->weight_free(GPU, wd_n);
  GPU->weight_free(GPU, wd_p);
  for (int k = 0; k < NW; k++) free(hw[k]);
  free(Wd);
  gpu_ok();
}

/* at the default (one-row products read the copies) and with every row count that can (PK_MAXT) */
TEST(packed_products) {
  packed_products_cases();
  with_gpu((backend_cuda_test){.packed_rows = 4}, packed_products_cases);
}

TEST(norm_fold_refused) {
  _Static_assert(DNH * DHD == DH, "dmodel_xn_step embeds into the attention output");
  backend *plain = gpu_with(.no_graphs = 1);
  REQUIRE(plain != NULL);
  dpair d;
  dpair_init(&d, GPU, plain);
  dmodel *a = &d.a, *p = &d.p;
  long f0 = backend_cuda_norm_folds(GPU), st0[6], st[6];
  backend_cuda_graph_stats(GPU, st0);
  uint16_t oa[DH + DNH * 2 * DHD], op[DH + DNH * 2 * DHD];
  int diff = 0;
  for (int k = 0; k < 3; k++) {
    dmodel_xn_step(a, oa);
    dmodel_xn_step(p, op);
    diff += memcmp(oa, op, sizeof oa) != 0;
  }
  backend_cuda_graph_stats(GPU, st);
  long folds = backend_cuda_norm_folds(GPU) - f0, listed = (st[0] - st0[0]) + (st[2] - st0[2]);
  n_checks++;
  printf("  xn read after its products: %ld norms folded in %ld listed steps, %d steps differ\n",
         folds, listed, diff);
  EXPECT_MSG(listed >= 2 && folds == 0, "%ld norms folded in %ld listed steps", folds, listed);
  EXPECT_MSG(diff == 0, "%d steps differ from the ops as issued", diff);
  gpu_ok();
  dpair_free(&d);
  plain->destroy(plain);
}

int main(void) {
  if (!backend_cuda_available()) {
    printf("FAIL cuda_available: no CUDA device\n");
    return 1;
  }
  char err[256];
  GPU = backend_cuda_create(0, &(backend_options){0}, err, sizeof err);
  CPU = backend_cpu_create(0);
  if (!GPU || !CPU) {
    printf("FAIL create: %s\n", GPU ? "cpu backend" : err);
    return 1;
  }
  RUN(memory);
  RUN(embed);
  RUN(rmsnorm);
  RUN(elementwise);
  RUN(matmul);
  RUN(sgemm_fused);
  RUN(narrow_fused);
  RUN(batch_invariant_gemm);
  RUN(fp8_matmul);
  RUN(fp8_decode_graph);
  RUN(qk_norm_rope);
  RUN(attention);
  RUN(attention_gemm_blocks);
  RUN(attention_shared);
  RUN(conv1d);
  RUN(gdn_gates);
  RUN(gdn);
  RUN(gated_rmsnorm);
  RUN(gdn_chain);
  RUN(moe);
  RUN(moe_grouped);
  RUN(moe_grouped_cublas);
  RUN(moe_grouped_dev);
  RUN(moe_per_row);
  RUN(moe_router);
  RUN(logits);
  RUN(argmax);
  RUN(logits_argmax);
  RUN(sample);
  RUN(sample_timing);
  RUN(decode_graph);
  RUN(decode_graph_repeat);
  RUN(decode_graph_norm_fold);
  RUN(decode_graph_moe);
  RUN(norm_fold_refused);
  RUN(packed_products);
  printf("op checks: %d\n", n_checks);
  GPU->destroy(GPU);
  CPU->destroy(CPU);
  TEST_MAIN_END();
}
