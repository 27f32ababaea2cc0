/* test_kv_fp8 (CUDA) — attention over FP8 K/V pages (--kv-cache-dtype fp8, backend.h "Paged
 * K/V") on the CUDA backend against the CPU reference backend with the same option (GPU machine
 * only; built by `make CUDA=1 cuda-tests`, run by scripts/device/check.sh).
 *
 * Both backends get the same inputs: q, k, v rounded to bf16 first (the CUDA activations), and
 * the same page image (random e4m3 bytes and scales: the layout is the same on both). Checked
 * per case:
 *   - the pages after the op, byte for byte: the step's rows quantized by the same rule (amax /
 *     448, round to nearest even) give the same bytes and scales on both backends;
 *   - the output, ||cuda - cpu|| / ||cpu|| <= KV8_OUT_TOL: both read the same K/V values; the
 *     CUDA backend's bf16 output rounding (2^-9), its sum orders and, for pieces of 32+ rows (the
 *     fused kernel, or the GEMM path), the dequantized K/V rounded to bf16 and bf16
 *     probabilities are the differences: the bf16 pages' test_cuda_ops tolerance (8e-3) with a
 *     margin.
 * Shapes: the split path (hd 64, 128, 256; 1, 4, 6 and 8 q heads per kv head), the one-block
 * fallback (hd 40); steps: prefill pieces (the fused kernel, and the GEMM path with the fused
 * kernel off), short pieces resuming over cached pages, decode rows, a decode step alone. Then
 * a fixture model decodes on FP8 pages through the decode-step recorder (graphs) and its
 * logits are compared with the CPU's. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "model/qwen35.h"
#include "ref_io.h"
#include "test.h"

#define KV8_OUT_TOL 1e-2
/* a fixture's logits rows, CUDA against CPU, both on FP8 pages: the tiny random fixtures move
 * by up to 5e-1 under bf16 activations alone (test_cuda_parity); a wrong page read gives ~1 */
#define KV8_MODEL_TOL 6e-1

static backend *CPU, *GPU;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float urand(void) { /* [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

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

static float *act_get(backend *be, backend_buf b, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (be->kind_size(be, BACKEND_KIND_ACT) == 4) {
    be->read(be, b, 0, h, n * 4);
  } else {
    uint16_t *t = malloc((n ? n : 1) * 2);
    be->read(be, b, 0, t, n * 2);
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

#define PIECES_MAX 8
#define MAXP 24 /* pages per piece */
typedef struct {
  int n;
  int len[PIECES_MAX], pos[PIECES_MAX];
} pieces;

/* prefill from 0 (37 rows: the GEMM path), a piece resuming at 50 over cached pages (20 rows),
 * two decode rows */
static const pieces MIXED = {4, {37, 20, 1, 1}, {0, 50, 300, 0}};
/* a GEMM-path piece over cached context, one decode row */
static const pieces LONG = {2, {100, 1}, {7, 200}};
/* a decode step: a fresh row, one ending a page, a long one */
static const pieces DECODE = {3, {1, 1, 1}, {0, 31, 300}};

static void set_batch(const pieces *p) {
  static int32_t tokens[512], pos[512], seq[512], st[PIECES_MAX], slot[PIECES_MAX],
      pt[PIECES_MAX * MAXP];
  int T = 0;
  for (int s = 0; s < p->n; s++) {
    st[s] = T;
    slot[s] = s;
    for (int r = 0; r < p->len[s]; r++, T++) {
      tokens[T] = 0;
      pos[T] = p->pos[s] + r;
      seq[T] = s;
    }
    for (int j = 0; j < MAXP; j++) pt[s * MAXP + j] = s * MAXP + (MAXP - 1 - j); /* reversed */
  }
  backend_batch b = {.n_tokens = T,
                     .n_seqs = p->n,
                     .tokens = tokens,
                     .pos = pos,
                     .seq = seq,
                     .seq_start = st,
                     .seq_len = p->len,
                     .seq_pos = p->pos,
                     .seq_slot = slot,
                     .page_table = pt,
                     .max_pages = MAXP};
  EXPECT(CPU->set_batch(CPU, &b) == 0);
  EXPECT(GPU->set_batch(GPU, &b) == 0);
}

static void attention_case(int nh, int nkv, int hd, const pieces *p, const char *what) {
  set_batch(p);
  int T = 0;
  for (int s = 0; s < p->n; s++) T += p->len[s];
  size_t pb = backend_kv_page_bytes(CPU, nkv, hd), npages = (size_t)p->n * MAXP;
  EXPECT_EQ_INT(backend_kv_page_bytes(GPU, nkv, hd), pb);
  EXPECT_EQ_INT(pb, (size_t)BACKEND_PAGE_TOKENS * nkv * (hd + 4));
  /* the page image: e4m3 bytes (no NaN codes), positive scales */
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * nkv;
  uint8_t *img[2];
  for (int k = 0; k < 2; k++) {
    img[k] = malloc(npages * pb);
    for (size_t pg = 0; pg < npages; pg++) {
      uint8_t *b = img[k] + pg * pb;
      for (size_t i = 0; i < rows * hd; i++) {
        uint8_t x = (uint8_t)(urand() * 128.f + 128.f);
        b[i] = (x & 0x7f) == 0x7f ? 0x3f : x;
      }
      float *sc = (float *)(b + rows * hd);
      for (size_t i = 0; i < rows; i++) sc[i] = 0.002f + 0.002f * (urand() + 1.f);
    }
  }
  backend_buf cp[2], gp[2];
  for (int k = 0; k < 2; k++) {
    cp[k] = CPU->alloc(CPU, BACKEND_KIND_KV, npages * pb);
    gp[k] = GPU->alloc(GPU, BACKEND_KIND_KV, npages * pb);
    CPU->write(CPU, cp[k], 0, img[k], npages * pb);
    GPU->write(GPU, gp[k], 0, img[k], npages * pb);
  }
  size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
  for (size_t i = 0; i < nq; i++) q[i] = b2f(f2b(urand()));
  for (size_t i = 0; i < nk; i++) {
    k[i] = b2f(f2b(urand() * 2.f));
    v[i] = b2f(f2b(urand() * 0.05f));
  }
  backend_buf cq = act(CPU, q, nq), ck = act(CPU, k, nk), cv = act(CPU, v, nk),
              co = act(CPU, q, nq);
  backend_buf gq = act(GPU, q, nq), gk = act(GPU, k, nk), gv = act(GPU, v, nk),
              go = act(GPU, q, nq);
  float scale = 1.f / sqrtf((float)hd);
  CPU->attention(CPU, cp[0], cp[1], cq, ck, cv, nh, nkv, hd, scale, co);
  GPU->attention(GPU, gp[0], gp[1], gq, gk, gv, nh, nkv, hd, scale, go);
  char err[256] = "";
  EXPECT_MSG(GPU->sync(GPU, err, sizeof err) == 0, "%s: cuda: %s", what, err);
  float *oc = act_get(CPU, co, nq), *og = act_get(GPU, go, nq);
  double e = relerr(og, oc, nq);
  size_t bad = 0;
  uint8_t *pc = malloc(npages * pb), *pg = malloc(npages * pb);
  for (int kk = 0; kk < 2; kk++) {
    CPU->read(CPU, cp[kk], 0, pc, npages * pb);
    GPU->read(GPU, gp[kk], 0, pg, npages * pb);
    for (size_t i = 0; i < npages * pb; i++) bad += pc[i] != pg[i];
  }
  printf(
      "  %-34s nh %2d nkv %d hd %3d T %3d: out rel err %.3e (tol %.0e), page bytes differing "
      "%zu\n",
      what, nh, nkv, hd, T, e, KV8_OUT_TOL, bad);
  EXPECT_MSG(e <= KV8_OUT_TOL, "%s nh %d nkv %d hd %d: rel err %.3e", what, nh, nkv, hd, e);
  EXPECT_MSG(bad == 0, "%s nh %d nkv %d hd %d: %zu page bytes differ", what, nh, nkv, hd, bad);
  backend_buf cb[] = {cp[0], cp[1], cq, ck, cv, co}, gb[] = {gp[0], gp[1], gq, gk, gv, go};
  for (int i = 0; i < 6; i++) {
    CPU->free(CPU, cb[i]);
    GPU->free(GPU, gb[i]);
  }
  free(img[0]), free(img[1]), free(q), free(k), free(v), free(oc), free(og), free(pc), free(pg);
}

TEST(sizes) {
  EXPECT_EQ_INT(GPU->kind_size(GPU, BACKEND_KIND_KV), 1);
  EXPECT_EQ_INT(GPU->kind_size(GPU, BACKEND_KIND_ACT), 2);
  EXPECT_EQ_INT(backend_kv_page_bytes(GPU, 4, 256), 16 * 4 * 260);
}

static const int SHAPES[][3] = {{8, 2, 128}, {16, 2, 256}, {24, 4, 256}, {6, 1, 64},
                                {4, 4, 64},  {3, 1, 40},   {32, 4, 128}};

TEST(attention) {
  for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) {
    attention_case(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], &MIXED, "mixed (flash, split)");
    attention_case(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], &LONG, "long (flash over cache)");
    attention_case(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], &DECODE, "decode");
  }
}

/* the long pieces through the GEMM path (k_kv_gather8): a backend with the fused kernel off */
TEST(attention_gemm_path) {
  char err[256] = "";
  backend_options o = {.kv_dtype = BACKEND_KV_FP8_E4M3};
  backend_cuda_test t = {.no_attn_flash = 1};
  backend *g2 = backend_cuda_create_test(0, &o, &t, err, sizeof err);
  REQUIRE(g2 != NULL);
  backend *save = GPU;
  GPU = g2;
  for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) {
    attention_case(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], &MIXED, "mixed (gemm, split)");
    attention_case(SHAPES[i][0], SHAPES[i][1], SHAPES[i][2], &LONG, "long (gemm over cache)");
  }
  GPU = save;
  g2->destroy(g2);
}

/* A fixture model on FP8 pages: a prompt, then decode steps (the recorder's graphs), on both
 * backends; every row's logits compared. dense_bf16 (hd 40: the one-block kernel, the GEMM
 * path) and fp8_dense64 (hd 64: the split kernel, the fused prefill kernel; FP8 weights, which
 * both backends read as the file stores them). */
static void model_decode_case(const char *dir) {
  char err[512] = "";
  model_config cfg;
  model_weights w;
  REQUIRE(model_load(dir, &cfg, &w, err, sizeof err) == 0);
  qwen35 *mc = NULL, *mg = NULL;
  qwen35_mem_opts o = {.n_pages = 8, .n_slots = 2};
  int rc = qwen35_init(&mc, &cfg, &w, CPU, &o, err, sizeof err);
  if (!rc) rc = qwen35_init(&mg, &cfg, &w, GPU, &o, err, sizeof err);
  EXPECT_MSG(rc == 0, "init: %s", err);
  if (!rc) {
    int V = cfg.vocab_size, n = 40;
    int32_t ids[40], pages[8] = {7, 3, 5, 1, 0, 2, 4, 6};
    for (int i = 0; i < n; i++) ids[i] = (i * 53 + 7) % V;
    float *lc = malloc(sizeof *lc * (size_t)n * V), *lg = malloc(sizeof *lg * (size_t)n * V);
    EXPECT(qwen35_slot_zero(mc, 0) == 0 && qwen35_slot_zero(mg, 0) == 0);
    fwd_seq s = {ids, n, 0, pages, 8, 0, QWEN35_LOGITS_ALL, -1};
    EXPECT(qwen35_forward(mc, &s, 1, lc, err, sizeof err) == 0);
    EXPECT(qwen35_forward(mg, &s, 1, lg, err, sizeof err) == 0);
    double worst = 0;
    for (int r = 0; r < n; r++) {
      double e = relerr(lg + (size_t)r * V, lc + (size_t)r * V, (size_t)V);
      if (e > worst) worst = e;
    }
    int tok = argmax(lc + (size_t)(n - 1) * V, V);
    for (int st = 0; st < 24; st++) { /* both follow the CPU's tokens */
      int32_t t1 = tok;
      fwd_seq d = {&t1, 1, n + st, pages, 8, 0, QWEN35_LOGITS_LAST, -1};
      EXPECT(qwen35_forward(mc, &d, 1, lc, err, sizeof err) == 0);
      EXPECT(qwen35_forward(mg, &d, 1, lg, err, sizeof err) == 0);
      double e = relerr(lg, lc, (size_t)V);
      if (e > worst) worst = e;
      tok = argmax(lc, V);
    }
    printf(
        "  %s on FP8 pages, 40-token prompt + 24 decode steps: worst row rel err %.3e (tol "
        "%.0e)\n",
        dir, worst, KV8_MODEL_TOL);
    EXPECT_MSG(worst <= KV8_MODEL_TOL, "%s: worst row rel err %.3e", dir, worst);
    free(lc);
    free(lg);
  }
  qwen35_free(mc);
  qwen35_free(mg);
  weights_free(&w);
}

TEST(model_decode) {
  model_decode_case("tests/fixtures/models/dense_bf16");
  model_decode_case("tests/fixtures/models/fp8_dense64");
}

int main(void) {
  if (!backend_cuda_available()) {
    printf("SKIP no CUDA device\n");
    return 0;
  }
  char err[256] = "";
  backend_options o = {.n_threads = 0, .kv_dtype = BACKEND_KV_FP8_E4M3};
  CPU = backend_cpu_create_opt(&o);
  GPU = backend_cuda_create(0, &o, err, sizeof err);
  if (!CPU || !GPU) {
    printf("FAIL setup: %s\n", err);
    return 1;
  }
  RUN(sizes);
  RUN(attention);
  RUN(attention_gemm_path);
  RUN(model_decode);
  GPU->destroy(GPU);
  CPU->destroy(CPU);
  TEST_MAIN_END();
}
