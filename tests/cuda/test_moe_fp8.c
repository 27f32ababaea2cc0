/* test_moe_fp8 (CUDA) — the MoE op with FP8 experts (weight_upload_fp8: e4m3 bytes and a scale
 * per bn x bk block, kept FP8 on the device; docs/fp8.md "MoE experts") against the same op on
 * the experts dequantized (GPU on their bf16 copies, and the CPU reference on the exact fp32
 * values). GPU machine only; built by `make CUDA=1 cuda-tests`.
 *
 * Per layer shape, random e4m3 bytes (every sign, exponents 2^-4 .. 2^3 and some subnormals and
 * zeros) and random block scales for the experts (and an FP8 or a bf16 shared expert); a step of
 * T rows for T = 1, 3, 7 (the per-row kernels), 8, 33 (the device-grouped kernels where H and I
 * are multiples of 256, else the per-row kernels) and 600 (the per-expert cuBLAS GEMMs on
 * experts dequantized into scratch). Checked per case, ||a - b|| / ||b|| over the whole output
 * <= MOE8_TOL and over every row <= MOE8_ROW_TOL:
 *   - FP8 op against the op on the bf16-dequantized experts: the only difference is the bf16
 *     rounding of each dequantized weight (relative 2^-9 at most, ~1.1e-3 rms): ~1e-3 on every
 *     gate/up sum, ~2e-3 through silu * up and the down sum, and each output's own bf16 rounding
 *     (~1.1e-3 rms on either side): ~3e-3 expected. The bounds are the bf16 MoE test's
 *     (test_cuda_ops moe: 1e-2, 2e-2 a row); a block read with a wrong scale, a wrong row or a
 *     wrong expert moves a row by 0.1 or more;
 *   - FP8 op against the CPU backend (fp32 math on the exact fp32 dequantization): no weight
 *     rounding at all, only the bf16 activations (and, at 600 rows, the bf16 hidden rows of the
 *     cuBLAS path): the same bounds.
 * Then --batch-invariant: a backend with batch_invariant set gives every row of a 33- and a
 * 600-row step the bits it gives that row alone (and matches the CPU as above). Each case prints
 * one line; the program ends with its pass / fail count. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "model/fp8.h"
#include "ref_io.h"
#include "test.h"

#define MOE8_TOL 1e-2
#define MOE8_ROW_TOL 2e-2
#define MOE8_MAXT 600

static backend *CPU, *GPU, *GBI; /* GBI: batch_invariant */
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint32_t rnext(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 32);
}
static float urand(void) { return (float)(rnext() * (1.0 / 4294967296.0)) * 2.f - 1.f; }

/* ACT buffers: f32 on the CPU, bf16 on CUDA */
static backend_buf act(backend *be, const float *h, size_t n) {
  backend_buf b = be->alloc(be, BACKEND_KIND_ACT, n ? n : 1);
  if (be->kind_size(be, BACKEND_KIND_ACT) == 4) {
    be->write(be, b, 0, h, n * 4);
  } else {
    uint16_t *t = malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) t[i] = f2b(h[i]);
    be->write(be, b, 0, t, n * 2);
    free(t);
  }
  return b;
}

/* the buffer's n values as floats; raw (CUDA): its bf16 bits too */
static float *act_get(backend *be, backend_buf b, size_t n, uint16_t *raw) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (be->kind_size(be, BACKEND_KIND_ACT) == 4) {
    be->read(be, b, 0, h, n * 4);
  } else {
    uint16_t *t = raw ? raw : malloc((n ? n : 1) * 2);
    be->read(be, b, 0, t, n * 2);
    for (size_t i = 0; i < n; i++) h[i] = b2f(t[i]);
    if (!raw) free(t);
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

/* whole-output and worst-row relative error of a against ref, T rows of H */
static double rowerr(const float *a, const float *ref, int T, int H, double *worst, int *worst_t) {
  *worst = 0;
  *worst_t = -1;
  for (int t = 0; t < T; t++) {
    double e = relerr(a + (size_t)t * H, ref + (size_t)t * H, (size_t)H);
    if (!(e <= *worst)) *worst = e, *worst_t = t;
  }
  return relerr(a, ref, (size_t)T * H);
}

/* One FP8 matrix: e4m3 bytes, block scales, and its exact fp32 dequantization (model/fp8.h). */
typedef struct {
  uint8_t *q;
  float *s, *deq;
  int rows, cols, bn, bk;
} f8mat;

static f8mat f8_make(int rows, int cols, int bn, int bk) {
  f8mat m = {0};
  m.rows = rows, m.cols = cols, m.bn = bn, m.bk = bk;
  size_t n = (size_t)rows * cols,
         ns = (size_t)(fp8_scale_rows(rows, bn) * fp8_scale_cols(cols, bk));
  m.q = malloc(n);
  m.s = malloc(ns * sizeof *m.s);
  m.deq = malloc(n * sizeof *m.deq);
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rnext();
    /* exponent field 0 (zero and subnormals) one time in 16, else 3 .. 10; never 0x7f / 0xff */
    uint32_t e = (r & 15u) == 0 ? 0 : 3 + ((r >> 4) & 7u), man = (r >> 8) & 7u, sg = (r >> 11) & 1u;
    m.q[i] = (uint8_t)((sg << 7) | (e << 3) | man);
  }
  for (size_t i = 0; i < ns; i++) m.s[i] = 0.008f + 0.004f * urand();
  tensor t = fp8_view(m.q, m.s, rows, cols, bn, bk);
  fp8_dequantize(&t, 0, rows, m.deq);
  return m;
}

static void f8_free(f8mat *m) {
  free(m->q);
  free(m->s);
  free(m->deq);
}

/* The weights as one backend holds them: FP8 (weight_upload_fp8) or from the fp32 values. */
static backend_weight up_mat(backend *be, const f8mat *m, int fp8) {
  if (fp8) return be->weight_upload_fp8(be, m->q, m->s, m->rows, m->cols, m->bn, m->bk);
  return be->weight_upload(be, m->deq, DTYPE_F32, m->rows, m->cols);
}

typedef struct {
  const char *name;
  int H, I, E, k, Is, bn, bk, norm;
  int sh8; /* the shared expert FP8 (else bf16, from its dequantized values) */
} moe_shape;

/* One layer on one backend. */
typedef struct {
  backend *be;
  backend_weight *w; /* [3E] */
  backend_weight sg, su, sd, seg, router;
  backend_moe m;
} layer;

static void layer_up(layer *L, backend *be, const moe_shape *s, const f8mat *ex, const f8mat *sh,
                     const float *R, const float *seg, int fp8) {
  L->be = be;
  int E = s->E;
  L->w = calloc((size_t)3 * E, sizeof *L->w);
  for (int i = 0; i < 3 * E; i++) L->w[i] = up_mat(be, &ex[i], fp8);
  L->router = be->weight_upload_exact ? be->weight_upload_exact(be, R, DTYPE_F32, E, s->H)
                                      : be->weight_upload(be, R, DTYPE_F32, E, s->H);
  L->sg = L->su = L->sd = L->seg = NULL;
  if (s->Is > 0) {
    int f = fp8 && s->sh8;
    L->sg = up_mat(be, &sh[0], f);
    L->su = up_mat(be, &sh[1], f);
    L->sd = up_mat(be, &sh[2], f);
    L->seg = be->weight_upload(be, seg, DTYPE_F32, 1, s->H);
  }
  backend_moe m = {E,        s->k,         s->norm, s->I,  s->Is, L->router, L->w,
                   L->w + E, L->w + 2 * E, L->sg,   L->su, L->sd, L->seg};
  L->m = m;
}

static void layer_free(layer *L, int E) {
  backend *be = L->be;
  for (int i = 0; i < 3 * E; i++) be->weight_free(be, L->w[i]);
  free(L->w);
  be->weight_free(be, L->router);
  be->weight_free(be, L->sg);
  be->weight_free(be, L->su);
  be->weight_free(be, L->sd);
  be->weight_free(be, L->seg);
}

/* out of the op on rows [r0, r0 + T) of x (host, MOE8_MAXT x H); raw: the bf16 bits (CUDA) */
static float *run_moe(layer *L, const float *x, int r0, int T, int H, uint16_t *raw) {
  backend *be = L->be;
  backend_buf xb = act(be, x + (size_t)r0 * H, (size_t)T * H);
  backend_buf ob = be->alloc(be, BACKEND_KIND_ACT, (size_t)T * H);
  be->moe(be, xb, &L->m, T, H, ob);
  float *o = act_get(be, ob, (size_t)T * H, raw);
  char err[256] = "";
  if (be->sync(be, err, sizeof err)) {
    EXPECT_MSG(0, "%s backend failed: %s", be->name, err);
    for (size_t i = 0; i < (size_t)T * H; i++) o[i] = NAN;
  }
  be->free(be, xb);
  be->free(be, ob);
  return o;
}

static const int ROWS[] = {1, 3, 7, 8, 33, MOE8_MAXT};

static void shape_case(const moe_shape *s) {
  int H = s->H, I = s->I, E = s->E, Is = s->Is;
  f8mat *ex = calloc((size_t)3 * E, sizeof *ex), sh[3];
  memset(sh, 0, sizeof sh);
  for (int e = 0; e < E; e++) {
    ex[e] = f8_make(I, H, s->bn, s->bk);
    ex[E + e] = f8_make(I, H, s->bn, s->bk);
    ex[2 * E + e] = f8_make(H, I, s->bn, s->bk);
  }
  if (Is > 0) {
    sh[0] = f8_make(Is, H, s->bn, s->bk);
    sh[1] = f8_make(Is, H, s->bn, s->bk);
    sh[2] = f8_make(H, Is, s->bn, s->bk);
  }
  float *R = malloc((size_t)E * H * sizeof *R), *seg = malloc((size_t)H * sizeof *seg);
  float *x = malloc((size_t)MOE8_MAXT * H * sizeof *x);
  for (size_t i = 0; i < (size_t)E * H; i++) R[i] = 0.2f * urand();
  for (int i = 0; i < H; i++) seg[i] = 0.1f * urand();
  /* bf16 values, so that the CPU reference sees the CUDA activations' own values */
  for (size_t i = 0; i < (size_t)MOE8_MAXT * H; i++) x[i] = b2f(f2b(urand()));
  layer l8, lb, lc, li;
  layer_up(&l8, GPU, s, ex, sh, R, seg, 1);
  layer_up(&lb, GPU, s, ex, sh, R, seg, 0);
  layer_up(&lc, CPU, s, ex, sh, R, seg, 0);
  layer_up(&li, GBI, s, ex, sh, R, seg, 1);
  int ok_up = 1;
  for (int i = 0; i < 3 * E; i++) ok_up &= l8.w[i] && lb.w[i] && lc.w[i] && li.w[i];
  EXPECT_MSG(ok_up, "%s: an expert upload failed", s->name);
  for (size_t c = 0; ok_up && c < sizeof ROWS / sizeof *ROWS; c++) {
    int T = ROWS[c];
    long d0 = backend_cuda_moe_dev_runs(GPU);
    float *o8 = run_moe(&l8, x, 0, T, H, NULL);
    long dev = backend_cuda_moe_dev_runs(GPU) - d0;
    float *ob = run_moe(&lb, x, 0, T, H, NULL), *oc = run_moe(&lc, x, 0, T, H, NULL);
    double wb, wc, wbc;
    int tb, tc, tbc;
    double eb = rowerr(o8, ob, T, H, &wb, &tb), ec = rowerr(o8, oc, T, H, &wc, &tc),
           ebc = rowerr(ob, oc, T, H, &wbc, &tbc);
    int pass = eb <= MOE8_TOL && wb <= MOE8_ROW_TOL && ec <= MOE8_TOL && wc <= MOE8_ROW_TOL;
    const char *path = dev ? "device-grouped" : T >= 64 ? "cuBLAS grouped" : "per-row";
    printf(
        "  %-5s %s T=%-3d %-14s fp8~bf16op %.2e (worst row %d: %.2e)  fp8~cpu %.2e (worst row "
        "%d: %.2e)  [bf16op~cpu %.2e]  %s\n",
        pass ? "ok" : "FAIL", s->name, T, path, eb, tb, wb, ec, tc, wc, ebc,
        pass ? "" : "(tolerance 1e-2, 2e-2 a row)");
    EXPECT_MSG(eb <= MOE8_TOL && wb <= MOE8_ROW_TOL,
               "%s T=%d: fp8 op vs bf16-dequantized op %.3e (row %d %.3e)", s->name, T, eb, tb, wb);
    EXPECT_MSG(ec <= MOE8_TOL && wc <= MOE8_ROW_TOL, "%s T=%d: fp8 op vs cpu %.3e (row %d %.3e)",
               s->name, T, ec, tc, wc);
    /* --batch-invariant: a row's bits are the bits it gets alone */
    if (T == 33 || T == MOE8_MAXT) {
      uint16_t *all = malloc((size_t)T * H * 2), one[8192];
      float *oi = run_moe(&li, x, 0, T, H, all);
      double ei, wi;
      int ti;
      ei = rowerr(oi, oc, T, H, &wi, &ti);
      int rows[3] = {0, T / 2, T - 1}, same = 1;
      for (int r = 0; r < 3 && H <= 8192; r++) {
        float *o1 = run_moe(&li, x, rows[r], 1, H, one);
        same &= !memcmp(one, all + (size_t)rows[r] * H, (size_t)H * 2);
        free(o1);
      }
      int bpass = same && ei <= MOE8_TOL && wi <= MOE8_ROW_TOL;
      printf(
          "  %-5s %s T=%-3d batch-invariant: rows 0, %d, %d bit-identical alone: %s; fp8~cpu "
          "%.2e (worst row %.2e)\n",
          bpass ? "ok" : "FAIL", s->name, T, T / 2, T - 1, same ? "yes" : "NO", ei, wi);
      EXPECT_MSG(same, "%s T=%d: --batch-invariant rows differ from the rows alone", s->name, T);
      EXPECT_MSG(ei <= MOE8_TOL && wi <= MOE8_ROW_TOL,
                 "%s T=%d: batch-invariant fp8 op vs cpu %.3e (row %.3e)", s->name, T, ei, wi);
      free(oi);
      free(all);
    }
    free(o8);
    free(ob);
    free(oc);
  }
  layer_free(&l8, E);
  layer_free(&lb, E);
  layer_free(&lc, E);
  layer_free(&li, E);
  for (int i = 0; i < 3 * E; i++) f8_free(&ex[i]);
  if (Is > 0)
    for (int i = 0; i < 3; i++) f8_free(&sh[i]);
  free(ex);
  free(R);
  free(seg);
  free(x);
}

/* 128 x 128 blocks, H and I multiples of 256 (the device-grouped kernels at 8 and 33 rows; I =
 * 768: the per-row down rows in two rounds), an FP8 shared expert */
TEST(moe_fp8_block128) {
  moe_shape s = {"b128", 512, 768, 16, 4, 256, 128, 128, 1, 1};
  shape_case(&s);
}

/* 64 x 64 blocks with edge blocks: I = 200 (no multiple of 64 or 16: the down rows by value-
 * strided lanes, the per-row kernels at 8 and 33 rows), a bf16 shared expert of width 136 */
TEST(moe_fp8_block64_edge) {
  moe_shape s = {"b64e", 256, 200, 8, 2, 136, 64, 64, 0, 0};
  shape_case(&s);
}

/* the same edge shape with an FP8 shared expert (width 136: its down rows value-strided) */
TEST(moe_fp8_block64_edge_shared8) {
  moe_shape s = {"b64s", 256, 200, 8, 3, 136, 64, 64, 1, 1};
  shape_case(&s);
}

/* Qwen3-Next's expert shape (H 2048, I 512, Is 512, top-10 of fewer experts) */
TEST(moe_fp8_next_shape) {
  moe_shape s = {"next", 2048, 512, 32, 10, 512, 128, 128, 1, 1};
  shape_case(&s);
}

int main(void) {
  if (!backend_cuda_available()) {
    printf("SKIP no CUDA device\n");
    return 0;
  }
  char err[256] = "";
  backend_options o = {.n_threads = 0}, bi = {.n_threads = 0, .batch_invariant = 1};
  CPU = backend_cpu_create_opt(&o);
  GPU = backend_cuda_create(0, &o, err, sizeof err);
  GBI = GPU ? backend_cuda_create(0, &bi, err, sizeof err) : NULL;
  if (!CPU || !GPU || !GBI) {
    printf("FAIL setup: %s\n", err);
    return 1;
  }
  static const char *names[] = {"moe_fp8_block128", "moe_fp8_block64_edge",
                                "moe_fp8_block64_edge_shared8", "moe_fp8_next_shape"};
  int n = 0;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) n += test_selected(names[i]);
  RUN(moe_fp8_block128);
  RUN(moe_fp8_block64_edge);
  RUN(moe_fp8_block64_edge_shared8);
  RUN(moe_fp8_next_shape);
  printf("test_moe_fp8: %d passed, %d failed\n", n - test_failed_total, test_failed_total);
  GBI->destroy(GBI);
  GPU->destroy(GPU);
  CPU->destroy(CPU);
  TEST_MAIN_END();
}
