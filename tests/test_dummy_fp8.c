/* test_dummy_fp8 — --load-format dummy of a model that ends up FP8 (--quantization fp8, or a
 * config with an fp8 quantization_config): the product weights are made F8_E4M3 with their
 * F32 weight_scale_inv directly (model/gen_random.h fp8_block_n), never as a BF16 copy. The
 * reference is the BF16 dummy quantized at load: gen_random's BF16 tensors of the same seed
 * written to a folder and loaded with --quantization fp8 (weights_quantize). For a dense
 * config (matrices of several chunks and jobs, edge blocks), a per-expert MoE one and a
 * Qwen3-Next one with its MTP head:
 *   - the same tensors, dtypes, shapes, blocks, scale shapes and bytes, the FP8 ones stored
 *     under their checkpoint names with `<name>_scale_inv`, exactly the products;
 *   - bit-identical logits, all finite;
 *   - the start-up weights line counts the F8_E4M3 bytes and their scales, and nothing is left
 *     to quantize at load.
 * And the quantizer's branch-free e4m3 encoder (fp8_quantize_rows) against dtype_f32_to_e4m3
 * around every rounding boundary. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#include "model/fp8.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* long paths in FAIL messages are cut */
#endif

static char root[256];
static char err[1024];

/* H 512, I 2200: gate / up [2200, 512] span two chunks (two jobs of 128-row blocks), down
 * [512, 2200] one job whose chunk boundary falls inside a row; 2200 leaves edge blocks */
#define DENSE_CFG                                                                                 \
  "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":64,\"hidden_size\":512,\"intermediate_size\":" \
  "2200,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,"             \
  "\"head_dim\":16,\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,"                      \
  "\"linear_key_head_dim\":16,\"linear_value_head_dim\":16,\"linear_conv_kernel_dim\":4,"         \
  "\"layer_types\":[\"linear_attention\",\"full_attention\"],\"tie_word_embeddings\":false"

#define MOE_CFG                                                                                  \
  "{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":120,\"hidden_size\":32,"                  \
  "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16," \
  "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,"           \
  "\"linear_value_head_dim\":8,\"layer_types\":[\"linear_attention\",\"full_attention\"],"       \
  "\"num_experts\":3,\"num_experts_per_tok\":2,\"moe_intermediate_size\":12,"                    \
  "\"shared_expert_intermediate_size\":20"

/* layer 1 dense (mlp_only_layers), and one MTP layer (MoE, as layer 0) */
#define NEXT_CFG                                                                                   \
  "{\"model_type\":\"qwen3_next\",\"vocab_size\":100,\"hidden_size\":32,\"intermediate_size\":"    \
  "24,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8," \
  "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,"             \
  "\"linear_value_head_dim\":8,\"layer_types\":[\"linear_attention\",\"full_attention\"],"         \
  "\"num_experts\":2,\"num_experts_per_tok\":1,\"moe_intermediate_size\":16,"                      \
  "\"shared_expert_intermediate_size\":16,\"mlp_only_layers\":[1],\"num_nextn_predict_layers\":1"

#define FP8_QCFG(bn, bk)                                                                       \
  ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":" \
  "\"dynamic\",\"weight_block_size\":[" #bn "," #bk "]}"

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* root/name/config.json = cfg + extra + "}" (the dummy folder), and root/name_ref: gen_random's
 * BF16 per-expert tensors of seed 5 with the same config (the BF16 dummy as a checkpoint). */
static int make_pair(const char *name, const char *cfg, const char *extra, char *dummy, char *ref) {
  char cmd[1200], path[700], text[4096];
  snprintf(dummy, 512, "%s/%s", root, name);
  snprintf(ref, 512, "%s/%s_ref", root, name);
  snprintf(cmd, sizeof cmd, "mkdir -p %s", dummy);
  if (system(cmd)) return -1;
  snprintf(text, sizeof text, "%s%s}", cfg, extra);
  snprintf(path, sizeof path, "%s/config.json", dummy);
  write_text(path, text);
  gen_random_opts o = {.seed = 5,
                       .dt = DTYPE_BF16,
                       .experts = GEN_RANDOM_EXPERTS_PER_EXPERT,
                       .threads = 2,
                       .quiet = 1};
  return gen_random_write(path, ref, &o, err, sizeof err);
}

/* ---- every tensor of a model_weights, named as in the checkpoint -------------------------- */

typedef struct named {
  char name[160];
  const tensor *t;
} named;

typedef struct tlist {
  named *v;
  int n, cap;
} tlist;

static void tl_add(tlist *l, const tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tl_add(tlist *l, const tensor *t, const char *fmt, ...) {
  if (!t->data) return;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 256;
    l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  named *e = &l->v[l->n++];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->name, sizeof e->name, fmt, ap);
  va_end(ap);
  e->t = t;
}

static void tl_layer(tlist *l, const model_config *c, const layer_weights *L, const char *p,
                     int i) {
  const struct {
    const tensor *t;
    const char *s;
  } f[] = {{&L->input_norm, "input_layernorm.weight"},
           {&L->post_norm, "post_attention_layernorm.weight"},
           {&L->q_proj, "self_attn.q_proj.weight"},
           {&L->k_proj, "self_attn.k_proj.weight"},
           {&L->v_proj, "self_attn.v_proj.weight"},
           {&L->o_proj, "self_attn.o_proj.weight"},
           {&L->q_norm, "self_attn.q_norm.weight"},
           {&L->k_norm, "self_attn.k_norm.weight"},
           {&L->in_proj_qkv, "linear_attn.in_proj_qkv.weight"},
           {&L->in_proj_z, "linear_attn.in_proj_z.weight"},
           {&L->in_proj_b, "linear_attn.in_proj_b.weight"},
           {&L->in_proj_a, "linear_attn.in_proj_a.weight"},
           {&L->conv1d, "linear_attn.conv1d.weight"},
           {&L->dt_bias, "linear_attn.dt_bias"},
           {&L->A_log, "linear_attn.A_log"},
           {&L->lin_norm, "linear_attn.norm.weight"},
           {&L->out_proj, "linear_attn.out_proj.weight"},
           {&L->gate_proj, "mlp.gate_proj.weight"},
           {&L->up_proj, "mlp.up_proj.weight"},
           {&L->down_proj, "mlp.down_proj.weight"},
           {&L->router, "mlp.gate.weight"},
           {&L->shared_gate, "mlp.shared_expert.gate_proj.weight"},
           {&L->shared_up, "mlp.shared_expert.up_proj.weight"},
           {&L->shared_down, "mlp.shared_expert.down_proj.weight"},
           {&L->shared_expert_gate, "mlp.shared_expert_gate.weight"}};
  for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
    tl_add(l, f[k].t, "%slayers.%d.%s", p, i, f[k].s);
  if (L->experts)
    for (int e = 0; e < c->n_experts; e++) {
      tl_add(l, &L->experts[e].gate, "%slayers.%d.mlp.experts.%d.gate_proj.weight", p, i, e);
      tl_add(l, &L->experts[e].up, "%slayers.%d.mlp.experts.%d.up_proj.weight", p, i, e);
      tl_add(l, &L->experts[e].down, "%slayers.%d.mlp.experts.%d.down_proj.weight", p, i, e);
    }
}

static tlist tl_model(const model_config *c, const model_weights *w) {
  tlist l = {0};
  tl_add(&l, &w->embed, "model.embed_tokens.weight");
  tl_add(&l, &w->final_norm, "model.norm.weight");
  if (!c->tie_word_embeddings) tl_add(&l, &w->lm_head, "lm_head.weight");
  for (int i = 0; i < c->n_layers; i++) tl_layer(&l, c, &w->layers[i], "model.", i);
  const mtp_weights *m = &w->mtp;
  tl_add(&l, &m->fc, "mtp.fc.weight");
  tl_add(&l, &m->pre_fc_norm_embedding, "mtp.pre_fc_norm_embedding.weight");
  tl_add(&l, &m->pre_fc_norm_hidden, "mtp.pre_fc_norm_hidden.weight");
  tl_add(&l, &m->norm, "mtp.norm.weight");
  for (int i = 0; i < m->n_layers; i++) tl_layer(&l, c, &m->layers[i], "mtp.", i);
  return l;
}

static size_t scale_bytes(const tensor *t) {
  return (size_t)(fp8_scale_rows(t->shape[0], t->block_n) * t->scale_cols) * 4;
}

/* 1 for a decoder layer's product weight (weights.c weights_products; not the MTP head's) */
static int is_product(const char *name) {
  static const char *const p[] = {"q_proj.",      "k_proj.",    "v_proj.",   "o_proj.",
                                  "in_proj_qkv.", "in_proj_z.", "out_proj.", "mlp.gate_proj.",
                                  "up_proj.",     "down_proj.", "experts.",  "shared_expert."};
  if (strncmp(name, "model.layers.", 13)) return 0;
  for (size_t k = 0; k < sizeof p / sizeof p[0]; k++)
    if (strstr(name, p[k])) return 1;
  return 0;
}

/* The dummy wd against the reference wr, tensor by tensor; the FP8 ones in `bn` x `bk` blocks.
 * Returns the number of FP8 tensors. */
static int compare(const model_config *c, const model_weights *wd, const model_weights *wr, int bn,
                   int bk, const char *what) {
  tlist a = tl_model(c, wd), b = tl_model(c, wr);
  int n8 = 0;
  EXPECT_MSG(a.n == b.n && a.n > 0, "%s: %d tensors, the reference %d", what, a.n, b.n);
  for (int i = 0; i < a.n && i < b.n; i++) {
    const tensor *x = a.v[i].t, *y = b.v[i].t;
    const char *name = a.v[i].name;
    int same = x->dt == y->dt && x->ndim == y->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
    EXPECT_MSG(same, "%s: %s is %s, the reference %s (or shapes differ)", what, name,
               dtype_name(x->dt), dtype_name(y->dt));
    if (!same) continue;
    char sn[200];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    uint64_t nb = 0, ns = 0;
    const void *raw = weights_raw(wd, name, &nb), *sraw = weights_raw(wd, sn, &ns);
    EXPECT_MSG(raw == x->data, "%s: %s is not the stored tensor of that name", what, name);
    EXPECT_MSG((x->dt == DTYPE_F8_E4M3) == is_product(name), "%s: %s is %s", what, name,
               dtype_name(x->dt));
    if (x->dt == DTYPE_F8_E4M3) {
      n8++;
      EXPECT_MSG(x->block_n == bn && x->block_k == bk && y->block_n == bn && y->block_k == bk &&
                     x->scale_cols == y->scale_cols && x->row0 == 0 && y->row0 == 0,
                 "%s: %s blocks %d x %d, the reference %d x %d", what, name, x->block_n, x->block_k,
                 y->block_n, y->block_k);
      EXPECT_MSG(nb == (uint64_t)tensor_numel(x) && sraw == x->scale && ns == scale_bytes(x),
                 "%s: %s stored with %llu bytes, %s with %llu (expected %lld, %zu)", what, name,
                 (unsigned long long)nb, sn, (unsigned long long)ns, (long long)tensor_numel(x),
                 scale_bytes(x));
      EXPECT_MSG(!memcmp(x->data, y->data, (size_t)tensor_numel(x)) &&
                     !memcmp(x->scale, y->scale, scale_bytes(x)),
                 "%s: %s differs from the BF16 dummy quantized at load", what, name);
    } else {
      EXPECT_MSG(!sraw, "%s: %s (%s) has a scale tensor", what, name, dtype_name(x->dt));
      EXPECT_MSG(!memcmp(x->data, y->data, (size_t)tensor_numel(x) * dtype_size(x->dt)),
                 "%s: %s differs from the reference", what, name);
    }
  }
  free(a.v);
  free(b.v);
  return n8;
}

/* ---- the CPU forward ---------------------------------------------------------------------- */

/* Logits [n, V] of prompt ids (i*7 + 3) % V through the CPU backend; NULL with err. */
static float *forward(const char *dir, const weights_opts *o, int n, int *V) {
  model_config c;
  model_weights w;
  if (model_load_with(dir, o, &c, &w, err, sizeof err)) return NULL;
  backend *be = backend_cpu_create(1);
  qwen35 *m = NULL;
  qwen35_mem_opts mo = {.n_pages = 4, .n_slots = 1};
  float *out = NULL;
  if (be && qwen35_init(&m, &c, &w, be, &mo, err, sizeof err) == 0) {
    *V = c.vocab_size;
    int32_t ids[64], pages[4] = {0, 1, 2, 3};
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7 + 3) % c.vocab_size);
    out = malloc(sizeof *out * (size_t)n * (size_t)c.vocab_size);
    fwd_seq s = {ids, n, 0, pages, 4, 0, QWEN35_LOGITS_ALL, -1};
    if (qwen35_slot_zero(m, 0) || qwen35_forward(m, &s, 1, out, err, sizeof err)) {
      free(out);
      out = NULL;
    }
  }
  qwen35_free(m);
  if (be) be->destroy(be);
  weights_free(&w);
  return out;
}

/* The dummy folder's logits are finite and equal the reference's, bit for bit. */
static void expect_same_logits(const char *dummy, const weights_opts *od, const char *ref,
                               const weights_opts *orf, const char *what) {
  int Va = 0, Vb = 0, n = 6;
  float *x = forward(dummy, od, n, &Va);
  EXPECT_MSG(x != NULL, "%s: dummy forward: %s", what, err);
  float *y = forward(ref, orf, n, &Vb);
  EXPECT_MSG(y != NULL, "%s: reference forward: %s", what, err);
  if (x && y && Va == Vb) {
    int finite = 1;
    double worst = 0;
    for (int i = 0; i < n * Va; i++) {
      finite &= isfinite(x[i]) != 0;
      worst = fmax(worst, fabs((double)x[i] - y[i]));
    }
    EXPECT_MSG(finite, "%s: dummy FP8 logits not finite", what);
    EXPECT_MSG(!memcmp(x, y, sizeof *x * (size_t)(n * Va)),
               "%s: logits differ from the reference (max |diff| %.3g)", what, worst);
  }
  free(x);
  free(y);
}

/* One case: dummy with od against the reference folder with orf; bn x bk blocks; n_fp8 FP8
 * tensors. */
static void check_case(const char *name, const char *cfg, const char *extra, weights_opts od,
                       weights_opts orf, int bn, int bk, int n_fp8) {
  char dummy[512], ref[512];
  REQUIRE(make_pair(name, cfg, extra, dummy, ref) == 0);
  od.dummy = 1;
  od.seed = 5;
  model_config c, c2;
  model_weights wd, wr;
  REQUIRE(model_load_with(dummy, &od, &c, &wd, err, sizeof err) == 0);
  int rc = model_load_with(ref, &orf, &c2, &wr, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s reference: %s", name, err);
  if (rc == 0) {
    int n8 = compare(&c, &wd, &wr, bn, bk, name);
    EXPECT_MSG(n8 == n_fp8, "%s: %d FP8 tensors, expected %d", name, n8, n_fp8);
    weights_free(&wr);
  }
  weights_free(&wd);
  expect_same_logits(dummy, &od, ref, &orf, name);
}

/* ---- tests -------------------------------------------------------------------------------- */

TEST(dense) {
  const weights_opts q = {.quantize_fp8 = 1};
  /* 2 layers: DeltaNet in_proj_qkv, in_proj_z, out_proj, attention q, k, v, o, 2 x 3 FFN */
  check_case("dense", DENSE_CFG, "", q, q, 128, 128, 13);
  /* an fp8 config: its blocks, with or without the flag */
  check_case("dense_cfg", DENSE_CFG, FP8_QCFG(64, 32), (weights_opts){0}, q, 64, 32, 13);
}

TEST(moe_per_expert) {
  const weights_opts q = {.quantize_fp8 = 1};
  /* DeltaNet 3 + attention 4, and per MoE layer 3 experts x 3 + the shared expert's 3 */
  check_case("moe", MOE_CFG, "", q, q, 128, 128, 3 + 4 + 2 * 12);
  check_case("moe_cfg", MOE_CFG, FP8_QCFG(8, 16), q, q, 8, 16, 3 + 4 + 2 * 12);
}

TEST(qwen3_next_with_mtp) {
  const weights_opts q = {.quantize_fp8 = 1, .mtp = 1};
  /* layer 0: DeltaNet 3, 2 experts x 3, shared 3; layer 1: attention 4, dense FFN 3 */
  check_case("next", NEXT_CFG, "", q, q, 128, 128, 3 + 6 + 3 + 4 + 3);
  /* the MTP head stays BF16, as weights_quantize leaves it */
  char dummy[512];
  snprintf(dummy, sizeof dummy, "%s/next", root);
  weights_opts o = q;
  o.dummy = 1;
  model_config c;
  model_weights w;
  REQUIRE(model_load_with(dummy, &o, &c, &w, err, sizeof err) == 0);
  EXPECT(w.mtp.n_layers == 1 && w.mtp.fc.dt == DTYPE_BF16 &&
         w.mtp.layers[0].q_proj.dt == DTYPE_BF16 && w.mtp.layers[0].experts[1].up.dt == DTYPE_BF16);
  EXPECT(w.layers[0].in_proj_a.dt == DTYPE_BF16 && w.layers[0].conv1d.dt == DTYPE_BF16 &&
         w.layers[0].router.dt == DTYPE_BF16 && w.layers[0].shared_expert_gate.dt == DTYPE_BF16 &&
         w.embed.dt == DTYPE_BF16 && w.lm_head.dt == DTYPE_BF16);
  weights_free(&w);
}

/* The start-up line of a dummy FP8 load names the F8_E4M3 bytes and their scales; no weight is
 * left for quantization at load. */
TEST(log_counts_fp8_bytes) {
  char dummy[512], ref[512], logp[600];
  REQUIRE(make_pair("dense_log", DENSE_CFG, "", dummy, ref) == 0);
  snprintf(logp, sizeof logp, "%s/stderr.txt", root);
  weights_opts o = {.dummy = 1, .seed = 5, .quantize_fp8 = 1};
  model_config c;
  model_weights w;
  fflush(stderr);
  int saved = dup(2);
  FILE *f = fopen(logp, "w");
  REQUIRE(saved >= 0 && f != NULL);
  dup2(fileno(f), 2);
  log_set_level(LOG_LEVEL_INFO);
  int rc = model_load_with(dummy, &o, &c, &w, err, sizeof err);
  log_set_level(LOG_LEVEL_WARN);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(f);
  REQUIRE(rc == 0);
  double b8 = 0, bs = 0, b16 = 0;
  tlist l = tl_model(&c, &w);
  for (int i = 0; i < l.n; i++) {
    const tensor *t = l.v[i].t;
    if (t->dt == DTYPE_F8_E4M3) {
      b8 += (double)tensor_numel(t);
      bs += (double)scale_bytes(t);
    } else if (t->dt == DTYPE_BF16) {
      b16 += 2.0 * (double)tensor_numel(t);
    }
  }
  free(l.v);
  weights_free(&w);
  char want[256], text[4096] = "";
  snprintf(want, sizeof want,
           "weights: F8_E4M3 %.2f MiB (+ F32 block scales %.2f MiB), BF16 %.2f MiB", b8 / 1048576.0,
           bs / 1048576.0, b16 / 1048576.0);
  f = fopen(logp, "r");
  REQUIRE(f != NULL);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  EXPECT_MSG(b8 > 6e6 && strstr(text, want), "log lacks '%s': %s", want, text);
  EXPECT_MSG(!strstr(text, "quantized to F8_E4M3"), "something was quantized at load: %s", text);
}

/* fp8_quantize_rows' encoder equals dtype_f32_to_e4m3 of the clamped value: a block whose
 * largest magnitude is 448 has scale 1, so each code is that of the value itself. Every value
 * of each upper 16 bits pattern with the lower bits at the rounding boundaries (ties at bit 19
 * for normals, at the subnormal steps), both signs, NaN and infinities. */
TEST(encoder_matches_codec) {
  enum { N = 4096 };
  static float x[N];
  static uint8_t q[N];
  static const uint32_t lo[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  int n = 0, bad = 0, blocks = 0;
  for (uint32_t hi = 0; hi < 0x10000; hi++)
    for (size_t k = 0; k < sizeof lo / sizeof lo[0]; k++) {
      uint32_t u = hi << 16 | lo[k];
      float v;
      memcpy(&v, &u, 4);
      if (!(fabsf(v) <= 448.0f) && !isnan(v)) v = 0.0f; /* keeps the scale 1 */
      if (n == 0) x[n++] = 448.0f;
      x[n++] = v;
      if (n < N && !(hi == 0xffff && k + 1 == sizeof lo / sizeof lo[0])) continue;
      float s;
      fp8_quantize_rows(x, 1, n, N, q, &s);
      EXPECT_MSG(s == 1.0f, "scale %g", s);
      for (int i = 0; i < n && bad < 3; i++) {
        float c = x[i] < -448.0f ? -448.0f : x[i] > 448.0f ? 448.0f : x[i];
        if (q[i] != dtype_f32_to_e4m3(c)) {
          bad++;
          EXPECT_MSG(0, "%a: code 0x%02x, expected 0x%02x", x[i], q[i], dtype_f32_to_e4m3(c));
        }
      }
      n = 0;
      blocks++;
    }
  EXPECT(blocks > 90);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/ds_test_dummy_fp8_%d", (int)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
  if (system(cmd)) return 1;
  log_set_level(LOG_LEVEL_WARN);
  RUN(encoder_matches_codec);
  RUN(dense);
  RUN(moe_per_expert);
  RUN(qwen3_next_with_mtp);
  RUN(log_counts_fp8_bytes);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (!test_failed_total && system(cmd)) return 1;
  TEST_MAIN_END();
}
