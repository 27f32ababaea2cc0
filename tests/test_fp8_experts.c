/* test_fp8_experts — the model's FP8 expert upload (model/qwen35.c experts_fp8 / shared_fp8,
 * docs/fp8.md "MoE experts") on a backend that keeps FP8 products: the CPU reference backend
 * with a weight_upload_fp8 of this test's, which records each call, reports the FP8 bytes (e4m3
 * plus 4 a block scale, as the CUDA backend's weight_bytes does) and keeps the weight as the
 * exact fp32 dequantization of the bytes and scales it was handed. Per FP8 MoE fixture
 * (per-expert and fused experts, Qwen3-Next):
 *   - every routed expert's and shared expert's matrix went through weight_upload_fp8, with its
 *     stored e4m3 bytes;
 *   - the memory plan (qwen35_plan) counts exactly the bytes the uploads took
 *     (qwen35_weight_bytes), fewer than without FP8 uploads;
 *   - the prompt's logits are bit-identical to the plain CPU backend's (which dequantizes every
 *     FP8 weight itself): the scales upload_fp8 copies out of each expert's view (fused experts:
 *     the up half starts I rows into the stored matrix) are the ones the view's dequantization
 *     reads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/backend_cpu.h"
#include "model/config.h"
#include "model/fp8.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "test.h"

#define FIXTURES "tests/fixtures/models"
#define MAXW 8192

static backend *INNER; /* the CPU backend the wrapper forwards to */
static const void *up_q[MAXW];
static backend_weight up_w[MAXW];
static size_t up_bytes[MAXW];
static int n_up;

static backend_weight keep_fp8(backend *be, const uint8_t *q, const float *s, int64_t rows,
                               int64_t cols, int bn, int bk) {
  (void)be;
  float *f = malloc((size_t)(rows * cols) * sizeof *f);
  if (!f) return NULL;
  tensor t = fp8_view(q, s, rows, cols, bn, bk);
  fp8_dequantize(&t, 0, rows, f);
  backend_weight w = INNER->weight_upload(INNER, f, DTYPE_F32, rows, cols);
  free(f);
  if (w && n_up < MAXW) {
    up_q[n_up] = q;
    up_w[n_up] = w;
    up_bytes[n_up] =
        (size_t)(rows * cols) + 4 * (size_t)(fp8_scale_rows(rows, bn) * fp8_scale_cols(cols, bk));
    n_up++;
  }
  return w;
}

static size_t kept_bytes(backend *be, backend_weight w) {
  (void)be;
  for (int i = 0; i < n_up; i++)
    if (up_w[i] == w) return up_bytes[i];
  return INNER->weight_bytes(INNER, w);
}

static int uploaded(const void *q) {
  for (int i = 0; i < n_up; i++)
    if (up_q[i] == q) return 1;
  return 0;
}

/* logits [n, V] of a prompt of n tokens on a fresh model of (c, w) over be */
static float *prompt_logits(const model_config *c, const model_weights *w, backend *be, int n,
                            size_t *weight_bytes, char *err, size_t errlen) {
  qwen35 *m = NULL;
  qwen35_mem_opts o = {.n_pages = 2, .n_slots = 1};
  if (qwen35_init(&m, c, w, be, &o, err, errlen)) return NULL;
  *weight_bytes = qwen35_weight_bytes(m);
  int32_t ids[16], pages[2] = {0, 1};
  for (int i = 0; i < n; i++) ids[i] = (int32_t)((7 * i + 3) % c->vocab_size);
  float *l = malloc(sizeof *l * (size_t)n * (size_t)c->vocab_size);
  fwd_seq s = {ids, n, 0, pages, 2, 0, QWEN35_LOGITS_ALL, -1};
  if (!l || qwen35_slot_zero(m, 0) || qwen35_forward(m, &s, 1, l, err, errlen)) {
    free(l);
    l = NULL;
  }
  qwen35_free(m);
  return l;
}

static void experts_case(const char *name) {
  char dir[512], err[512] = "";
  snprintf(dir, sizeof dir, FIXTURES "/%s", name);
  model_config c;
  model_weights w;
  int rc = model_load(dir, &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s: %s", name, err);
  if (rc) return;
  backend_options bo = {.n_threads = 2};
  INNER = backend_cpu_create_opt(&bo);
  backend wrap = *INNER;
  wrap.weight_upload_fp8 = keep_fp8;
  wrap.weight_bytes = kept_bytes;
  n_up = 0;
  qwen35_plan_bytes pw, pp;
  qwen35_plan(&c, &w, &wrap, &pw);
  qwen35_plan(&c, &w, INNER, &pp);
  int n = 8;
  size_t bw = 0, bp = 0;
  float *lw = prompt_logits(&c, &w, &wrap, n, &bw, err, sizeof err);
  EXPECT_MSG(lw, "%s (fp8 uploads): %s", name, err);
  float *lp = prompt_logits(&c, &w, INNER, n, &bp, err, sizeof err);
  EXPECT_MSG(lp, "%s (plain): %s", name, err);
  int moe_layers = 0, missing = 0, experts = 0;
  for (int i = 0; i < c.n_layers; i++) {
    if (!c.layer_is_moe[i]) continue;
    moe_layers++;
    const layer_weights *L = &w.layers[i];
    for (int e = 0; e < c.n_experts; e++) {
      const tensor *ts[3] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
      for (int k = 0; k < 3; k++, experts++) missing += !uploaded(ts[k]->data);
    }
    if (c.shared_expert_intermediate_size > 0) {
      const tensor *ts[3] = {&L->shared_gate, &L->shared_up, &L->shared_down};
      for (int k = 0; k < 3; k++, experts++) missing += !uploaded(ts[k]->data);
    }
  }
  int same = lw && lp && !memcmp(lw, lp, sizeof *lw * (size_t)n * (size_t)c.vocab_size);
  printf(
      "  %-16s %d MoE layers: %d of %d expert matrices through weight_upload_fp8 (%d uploads "
      "in all); plan %zu = uploaded %zu bytes (plain %zu); logits %s the plain backend's\n",
      name, moe_layers, experts - missing, experts, n_up, pw.weights, bw, pp.weights,
      same ? "bit-identical to" : "DIFFER from");
  EXPECT_MSG(moe_layers > 0 && experts > 0, "%s: no MoE layer", name);
  EXPECT_MSG(missing == 0, "%s: %d expert matrices were dequantized at upload", name, missing);
  EXPECT_MSG(pw.weights == bw, "%s: plan %zu bytes, uploads took %zu", name, pw.weights, bw);
  EXPECT_MSG(pw.weights < pp.weights, "%s: plan with fp8 uploads %zu >= plain %zu", name,
             pw.weights, pp.weights);
  EXPECT_MSG(same, "%s: logits differ from the plain backend's", name);
  free(lw);
  free(lp);
  INNER->destroy(INNER);
  weights_free(&w);
}

TEST(moe_per_expert) { experts_case("fp8_moe32"); }
TEST(moe_fused) { experts_case("fp8_moe32_fused"); }
TEST(next) { experts_case("fp8_next32"); }

int main(void) {
  RUN(moe_per_expert);
  RUN(moe_fused);
  RUN(next);
  TEST_MAIN_END();
}
