/* test_weights — safetensors reading, the canonical name mapping of every checkpoint layout
 * (dense, tied, VLM prefix + shards, MoE fused and per expert, Qwen3-Next fused projections),
 * gen-random round trips, the reference fixtures made with transformers, and every kind of bad
 * input (each must fail with one line naming the file and the tensor, never crash). */
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/gen_random.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* long error lines in FAIL messages are cut \
                                                      */
#endif

static char root[256];
static char err[1024];

static void sh(const char *cmd) {
  if (system(cmd) != 0) fprintf(stderr, "command failed: %s\n", cmd);
}

static const char *dirof(const char *name) {
  static char p[8][512];
  static int k;
  k = (k + 1) % 8;
  snprintf(p[k], sizeof p[k], "%s/%s", root, name);
  return p[k];
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* A small model folder: config text + gen-random with options. Returns 0 on success. */
static int make_model(const char *name, const char *config_text, gen_random_opts o) {
  char cfg[600];
  snprintf(cfg, sizeof cfg, "%s/%s.config.json", root, name);
  write_text(cfg, config_text);
  o.quiet = 1;
  if (!o.threads) o.threads = 2;
  return gen_random_write(cfg, dirof(name), &o, err, sizeof err);
}

#define DENSE_CFG                                                                                 \
  "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":300,\"hidden_size\":48,\"intermediate_size\":" \
  "80,"                                                                                           \
  "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"  \
  "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,"            \
  "\"linear_value_head_dim\":12,\"linear_conv_kernel_dim\":4,\"tie_word_embeddings\":%s}"

static char dense_cfg_untied[1024], dense_cfg_tied[1024];

/* Values of tensor t equal those of the named tensor of a file. */
static int same_as_file(const tensor *t, const char *file, const char *name) {
  st_file *f;
  if (st_open(file, &f, err, sizeof err)) return 0;
  const st_tensor *s = st_find(f, name);
  int ok = s && s->is_float && s->dt == t->dt &&
           s->nbytes == (uint64_t)tensor_numel(t) * dtype_size(t->dt) &&
           memcmp(s->data, t->data, s->nbytes) == 0;
  st_close(f);
  return ok;
}

/* ---- element conversion ---- */

TEST(tensor_get_f32_all_dtypes) {
  uint16_t h[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x3555};
  tensor t = {.data = h, .dt = DTYPE_F16, .ndim = 1, .shape = {5}};
  EXPECT(tensor_get_f32(&t, 0) == 1.0f);
  EXPECT(tensor_get_f32(&t, 1) == -2.0f);
  EXPECT(tensor_get_f32(&t, 2) == ldexpf(1.0f, -24));
  EXPECT(tensor_get_f32(&t, 3) == 65504.0f);
  EXPECT(fabsf(tensor_get_f32(&t, 4) - 0.33325195f) < 1e-7f);
  uint16_t b[2] = {0x3f80, 0xbfc0};
  tensor tb = {.data = b, .dt = DTYPE_BF16, .ndim = 1, .shape = {2}};
  EXPECT(tensor_get_f32(&tb, 0) == 1.0f);
  EXPECT(tensor_get_f32(&tb, 1) == -1.5f);
  float f[2] = {3.25f, -0.5f};
  tensor tf = {.data = f, .dt = DTYPE_F32, .ndim = 2, .shape = {1, 2}};
  EXPECT(tensor_get_f32(&tf, 1) == -0.5f);
  EXPECT_EQ_INT(tensor_numel(&tf), 2);
  EXPECT_EQ_INT(dtype_size(DTYPE_BF16), 2);
  EXPECT_STR(dtype_name(DTYPE_F16), "f16");
}

/* The writers' conversions: every stored value survives float and back, ties go to even,
 * NaN stays NaN (rounding must not carry it into infinity), overflow gives infinity. */
TEST(dtype_from_f32_rounding) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = dtype_bf16_to_f32((uint16_t)h);
    if (f == f) EXPECT_EQ_INT(dtype_f32_to_bf16(f), h);
    float g = dtype_f16_to_f32((uint16_t)h);
    if (g == g) EXPECT_EQ_INT(dtype_f32_to_f16(g), h);
  }
  EXPECT_EQ_INT(dtype_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);     /* tie: even */
  EXPECT_EQ_INT(dtype_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)), 0x3f82); /* tie: even */
  EXPECT_EQ_INT(dtype_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);     /* tie: even */
  EXPECT_EQ_INT(dtype_f32_to_f16(65520.0f), 0x7c00);                     /* overflow */
  EXPECT_EQ_INT(dtype_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);            /* tie to zero */
  float nan;
  uint32_t nb = 0x7fffffffu;
  memcpy(&nan, &nb, 4);
  EXPECT((dtype_f32_to_bf16(nan) & 0x7fff) > 0x7f80);
  EXPECT((dtype_f32_to_f16(nan) & 0x7fff) > 0x7c00);
}

/* ---- safetensors writer/reader ---- */

TEST(safetensors_round_trip) {
  char path[512];
  snprintf(path, sizeof path, "%s/rt.safetensors", root);
  st_writer *w;
  REQUIRE(st_writer_open(&w, path, err, sizeof err) == 0);
  float a[6] = {1, 2, 3, 4, 5, 6};
  uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
  EXPECT_EQ_INT(st_writer_add(w, "zeta", DTYPE_F32, 2, (int64_t[]){2, 3}), 0);
  EXPECT_EQ_INT(st_writer_add(w, "alpha \"q\"", DTYPE_BF16, 1, (int64_t[]){3}), 1);
  REQUIRE(st_writer_begin(w, err, sizeof err) == 0);
  EXPECT(st_writer_put(w, 1, b, err, sizeof err) == 0);
  EXPECT(st_writer_put(w, 0, a, err, sizeof err) == 0);
  REQUIRE(st_writer_close(w, err, sizeof err) == 0);
  st_file *f;
  REQUIRE(st_open(path, &f, err, sizeof err) == 0);
  EXPECT_EQ_INT(st_n_tensors(f), 2);
  const st_tensor *z = st_find(f, "zeta"), *q = st_find(f, "alpha \"q\"");
  REQUIRE(z && q);
  EXPECT_EQ_INT(z->dt, DTYPE_F32);
  EXPECT_EQ_INT(z->ndim, 2);
  EXPECT_EQ_INT(z->shape[1], 3);
  EXPECT(memcmp(z->data, a, sizeof a) == 0);
  EXPECT(memcmp(q->data, b, sizeof b) == 0);
  EXPECT_STR(q->dtype_str, "BF16");
  EXPECT(st_find(f, "nope") == NULL);
  st_close(f);
}

/* ---- round trips ---- */

TEST(dense_round_trip) {
  int rc = make_model("dense", dense_cfg_untied, (gen_random_opts){.seed = 7, .dt = DTYPE_BF16});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  model_config c;
  model_weights w;
  rc = model_load(dirof("dense"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  char file[512];
  snprintf(file, sizeof file, "%s/model.safetensors", dirof("dense"));
  EXPECT(same_as_file(&w.embed, file, "model.embed_tokens.weight"));
  EXPECT(same_as_file(&w.lm_head, file, "lm_head.weight"));
  EXPECT(w.lm_head.data != w.embed.data);
  EXPECT(same_as_file(&w.final_norm, file, "model.norm.weight"));
  EXPECT(same_as_file(&w.layers[0].in_proj_qkv, file,
                      "model.layers.0.linear_attn.in_proj_qkv.weight"));
  EXPECT(same_as_file(&w.layers[3].q_proj, file, "model.layers.3.self_attn.q_proj.weight"));
  EXPECT(same_as_file(&w.layers[2].down_proj, file, "model.layers.2.mlp.down_proj.weight"));
  EXPECT_EQ_INT(w.layers[3].q_proj.shape[0], 4 * 2 * 16);
  EXPECT(w.layers[3].in_proj_qkv.data == NULL);
  EXPECT(w.layers[0].q_proj.data == NULL);
  const tensor *conv = &w.layers[1].conv1d;
  EXPECT_EQ_INT(conv->ndim, 2);
  EXPECT_EQ_INT(conv->shape[0], c.conv_dim);
  EXPECT_EQ_INT(conv->shape[1], 4);
  EXPECT_EQ_INT(w.layers[0].A_log.dt, DTYPE_F32);
  EXPECT_EQ_INT(w.layers[0].lin_norm.dt, DTYPE_F32);
  EXPECT_EQ_INT(w.layers[0].dt_bias.dt, DTYPE_BF16);
  /* value ranges of the initialisers */
  for (int i = 0; i < 4; i++) {
    float a = tensor_get_f32(&w.layers[0].A_log, i), d = tensor_get_f32(&w.layers[0].dt_bias, i);
    EXPECT_MSG(a >= -1e-6f && a <= logf(16.0f) + 1e-5f, "A_log %f", a);
    EXPECT_MSG(d > 0.85f && d < 1.15f, "dt_bias %f", d);
  }
  for (int i = 0; i < 12; i++) {
    float n = tensor_get_f32(&w.layers[0].lin_norm, i);
    EXPECT_MSG(n > 0.85f && n < 1.15f, "lin_norm %f", n);
  }
  double s = 0, s2 = 0;
  int64_t n = tensor_numel(&w.embed);
  for (int64_t i = 0; i < n; i++) {
    double v = tensor_get_f32(&w.embed, i);
    s += v;
    s2 += v * v;
  }
  double sd = sqrt(s2 / (double)n - (s / (double)n) * (s / (double)n));
  EXPECT_MSG(fabs(sd - 0.02) < 0.002, "embed std %f", sd);
  weights_free(&w);
  weights_free(&w); /* idempotent on a freed struct */
}

TEST(tied_f16_round_trip) {
  int rc = make_model("tied", dense_cfg_tied, (gen_random_opts){.seed = 8, .dt = DTYPE_F16});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  model_config c;
  model_weights w;
  rc = model_load(dirof("tied"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  EXPECT(w.lm_head.data == w.embed.data);
  EXPECT_EQ_INT(w.lm_head.shape[0], 300);
  EXPECT_EQ_INT(w.embed.dt, DTYPE_F16);
  weights_free(&w);
}

TEST(gen_random_deterministic) {
  /* vocab large enough that the embedding spans several chunks */
  const char *cfg =
      "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":40000,\"hidden_size\":64,\"intermediate_"
      "size\":32,"
      "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,"
      "\"linear_num_key_heads\":1,\"linear_num_value_heads\":1,\"linear_key_head_dim\":8,"
      "\"linear_value_head_dim\":8,\"tie_word_embeddings\":true}";
  EXPECT_MSG(
      make_model("det1", cfg, (gen_random_opts){.seed = 5, .dt = DTYPE_BF16, .threads = 1}) == 0,
      "%s", err);
  EXPECT_MSG(
      make_model("det3", cfg, (gen_random_opts){.seed = 5, .dt = DTYPE_BF16, .threads = 3}) == 0,
      "%s", err);
  EXPECT_MSG(
      make_model("det9", cfg, (gen_random_opts){.seed = 9, .dt = DTYPE_BF16, .threads = 3}) == 0,
      "%s", err);
  char cmd[1600];
  snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", dirof("det1"),
           dirof("det3"));
  EXPECT_MSG(system(cmd) == 0, "same seed, different thread counts, different bytes");
  snprintf(cmd, sizeof cmd, "cmp -s %s/model.safetensors %s/model.safetensors", dirof("det1"),
           dirof("det9"));
  EXPECT_MSG(system(cmd) != 0, "different seeds, same bytes");
  snprintf(cmd, sizeof cmd, "cmp -s %s/det1.config.json %s/config.json", root, dirof("det1"));
  EXPECT_MSG(system(cmd) == 0, "config.json is not a copy");
}

#define MOE_CFG                                                                                  \
  "{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":200,\"hidden_size\":32,"                  \
  "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16," \
  "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,"           \
  "\"linear_value_head_dim\":8,\"layer_types\":[\"linear_attention\",\"full_attention\"],"       \
  "\"num_experts\":3,\"num_experts_per_tok\":2,\"moe_intermediate_size\":12,"                    \
  "\"shared_expert_intermediate_size\":20}"

TEST(moe_fused_round_trip) {
  int rc = make_model("moe_fused", MOE_CFG, (gen_random_opts){.seed = 3, .dt = DTYPE_F32});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  model_config c;
  model_weights w;
  rc = model_load(dirof("moe_fused"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  char file[512];
  snprintf(file, sizeof file, "%s/model.safetensors", dirof("moe_fused"));
  st_file *f;
  REQUIRE(st_open(file, &f, err, sizeof err) == 0);
  const int H = 32, I = 12, E = 3;
  for (int l = 0; l < 2; l++) {
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    const st_tensor *gu = st_find(f, n);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
    const st_tensor *dn = st_find(f, n);
    REQUIRE(gu && dn && w.layers[l].experts);
    const float *G = gu->data, *D = dn->data;
    for (int e = 0; e < E; e++) {
      const expert_weights *x = &w.layers[l].experts[e];
      EXPECT_EQ_INT(x->gate.shape[0], I);
      EXPECT_EQ_INT(x->gate.shape[1], H);
      EXPECT_EQ_INT(x->down.shape[0], H);
      EXPECT_EQ_INT(x->down.shape[1], I);
      for (int r = 0; r < I; r++)
        for (int k = 0; k < H; k++) {
          EXPECT(tensor_get_f32(&x->gate, r * H + k) == G[((size_t)e * 2 * I + r) * H + k]);
          EXPECT(tensor_get_f32(&x->up, r * H + k) == G[((size_t)e * 2 * I + I + r) * H + k]);
        }
      for (int r = 0; r < H; r++)
        for (int k = 0; k < I; k++)
          EXPECT(tensor_get_f32(&x->down, r * I + k) == D[((size_t)e * H + r) * I + k]);
    }
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    EXPECT(same_as_file(&w.layers[l].router, file, n));
    snprintf(n, sizeof n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
    EXPECT(same_as_file(&w.layers[l].shared_expert_gate, file, n));
    EXPECT_EQ_INT(w.layers[l].shared_down.shape[1], 20);
    EXPECT(w.layers[l].gate_proj.data == NULL);
  }
  st_close(f);
  weights_free(&w);
}

TEST(moe_per_expert_round_trip) {
  int rc = make_model(
      "moe_pe", MOE_CFG,
      (gen_random_opts){.seed = 3, .dt = DTYPE_BF16, .experts = GEN_RANDOM_EXPERTS_PER_EXPERT});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  model_config c;
  model_weights w;
  rc = model_load(dirof("moe_pe"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  char file[512], n[128];
  snprintf(file, sizeof file, "%s/model.safetensors", dirof("moe_pe"));
  for (int l = 0; l < 2; l++)
    for (int e = 0; e < 3; e++) {
      snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
      EXPECT(same_as_file(&w.layers[l].experts[e].gate, file, n));
      snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
      EXPECT(same_as_file(&w.layers[l].experts[e].up, file, n));
      snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
      EXPECT(same_as_file(&w.layers[l].experts[e].down, file, n));
    }
  weights_free(&w);
}

/* Checks that L's in_proj_qkv/z/b/a are the regrouping of the fused qkvz/ba rows, by the
 * transformers view: qkvz as [nk, 2dk + 2r dv] split (dk, dk, r dv, r dv); ba as [nk, 2r]
 * split (r, r); value head h = g*r + j. */
static int check_next_regroup(const layer_weights *L, const st_tensor *qkvz, const st_tensor *ba,
                              int H, int nk, int nv, int dk, int dv) {
  int r = nv / nk, bad = 0;
  size_t es = dtype_size(qkvz->dt);
  const char *Q = qkvz->data, *B = ba->data;
  const char *qkv = L->in_proj_qkv.data, *z = L->in_proj_z.data, *b = L->in_proj_b.data,
             *a = L->in_proj_a.data;
  size_t row = (size_t)H * es;
  int per = 2 * dk + 2 * r * dv;
  for (int g = 0; g < nk; g++) {
    for (int i = 0; i < dk; i++) {
      bad |= memcmp(qkv + (size_t)(g * dk + i) * row, Q + (size_t)(g * per + i) * row, row) != 0;
      bad |= memcmp(qkv + (size_t)(nk * dk + g * dk + i) * row,
                    Q + (size_t)(g * per + dk + i) * row, row) != 0;
    }
    for (int j = 0; j < r; j++) {
      int h = g * r + j;
      for (int i = 0; i < dv; i++) {
        bad |= memcmp(qkv + (size_t)(2 * nk * dk + h * dv + i) * row,
                      Q + (size_t)(g * per + 2 * dk + j * dv + i) * row, row) != 0;
        bad |= memcmp(z + (size_t)(h * dv + i) * row,
                      Q + (size_t)(g * per + 2 * dk + r * dv + j * dv + i) * row, row) != 0;
      }
      bad |= memcmp(b + (size_t)h * row, B + (size_t)(g * 2 * r + j) * row, row) != 0;
      bad |= memcmp(a + (size_t)h * row, B + (size_t)(g * 2 * r + r + j) * row, row) != 0;
    }
  }
  return !bad;
}

TEST(next_fused_regroup) {
  const char *cfg =
      "{\"model_type\":\"qwen3_next\",\"vocab_size\":100,\"hidden_size\":16,\"intermediate_size\":"
      "24,"
      "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,"
      "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,\"linear_key_head_dim\":4,"
      "\"linear_value_head_dim\":3,\"layer_types\":[\"linear_attention\",\"full_attention\"],"
      "\"num_experts\":2,\"num_experts_per_tok\":1,\"moe_intermediate_size\":8,"
      "\"shared_expert_intermediate_size\":8,\"mlp_only_layers\":[1]}";
  int rc = make_model(
      "next", cfg,
      (gen_random_opts){
          .seed = 4, .dt = DTYPE_F32, .next_fused = 1, .experts = GEN_RANDOM_EXPERTS_PER_EXPERT});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  model_config c;
  model_weights w;
  rc = model_load(dirof("next"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  char file[512];
  snprintf(file, sizeof file, "%s/model.safetensors", dirof("next"));
  st_file *f;
  REQUIRE(st_open(file, &f, err, sizeof err) == 0);
  const st_tensor *qkvz = st_find(f, "model.layers.0.linear_attn.in_proj_qkvz.weight");
  const st_tensor *ba = st_find(f, "model.layers.0.linear_attn.in_proj_ba.weight");
  REQUIRE(qkvz && ba);
  const layer_weights *L = &w.layers[0];
  EXPECT_EQ_INT(L->in_proj_qkv.shape[0], 2 * 2 * 4 + 6 * 3);
  EXPECT_EQ_INT(L->in_proj_z.shape[0], 18);
  EXPECT_EQ_INT(L->in_proj_b.shape[0], 6);
  EXPECT(check_next_regroup(L, qkvz, ba, 16, 2, 6, 4, 3));
  /* spot check one value by hand: value head 4 = key group 1, j = 1; its row 2 of v */
  const float *Q = qkvz->data, *V = L->in_proj_qkv.data;
  int per = 2 * 4 + 2 * 3 * 3;
  EXPECT(V[(size_t)(2 * 2 * 4 + 4 * 3 + 2) * 16 + 5] ==
         Q[(size_t)(1 * per + 8 + 1 * 3 + 2) * 16 + 5]);
  EXPECT(w.layers[1].gate_proj.data != NULL); /* mlp_only_layers */
  EXPECT(w.layers[0].experts != NULL);
  st_close(f);
  weights_free(&w);
}

/* Rewrites src_dir/model.safetensors into dst_dir with tensor `skip` left out, or with
 * tensor `reshape` given `shape` (same byte count). Copies config.json. */
static int rewrite(const char *src_dir, const char *dst_dir, const char *skip, const char *reshape,
                   int ndim, const int64_t *shape) {
  char p[1200], cmd[2600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/config.json %s/", dst_dir, dst_dir,
           src_dir, dst_dir);
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
  st_file *f;
  if (st_open(p, &f, err, sizeof err)) return -1;
  snprintf(p, sizeof p, "%s/model.safetensors", dst_dir);
  st_writer *w;
  if (st_writer_open(&w, p, err, sizeof err)) return -1;
  int *map = calloc((size_t)st_n_tensors(f), sizeof *map);
  for (int i = 0; i < st_n_tensors(f); i++) {
    const st_tensor *t = st_tensor_at(f, i);
    map[i] = -1;
    if (skip && !strcmp(t->name, skip)) continue;
    if (reshape && !strcmp(t->name, reshape))
      map[i] = st_writer_add(w, t->name, t->dt, ndim, shape);
    else
      map[i] = st_writer_add(w, t->name, t->dt, t->ndim, t->shape);
  }
  int rc = st_writer_begin(w, err, sizeof err);
  for (int i = 0; i < st_n_tensors(f) && rc == 0; i++)
    if (map[i] >= 0) rc = st_writer_put(w, map[i], st_tensor_at(f, i)->data, err, sizeof err);
  free(map);
  st_close(f);
  st_writer_close(w, err, sizeof err);
  return rc;
}

/* Splits src_dir's model.safetensors into two shards + index in dst_dir. */
static int shard(const char *src_dir, const char *dst_dir) {
  char p[1200], cmd[2600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/config.json %s/", dst_dir, dst_dir,
           src_dir, dst_dir);
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", src_dir);
  st_file *f;
  if (st_open(p, &f, err, sizeof err)) return -1;
  st_writer *w[2];
  for (int s = 0; s < 2; s++) {
    snprintf(p, sizeof p, "%s/model-%05d-of-00002.safetensors", dst_dir, s + 1);
    if (st_writer_open(&w[s], p, err, sizeof err)) return -1;
  }
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dst_dir);
  FILE *ix = fopen(p, "w");
  fprintf(ix, "{\"metadata\":{},\"weight_map\":{");
  int n = st_n_tensors(f), *map = calloc((size_t)n, sizeof *map);
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_tensor_at(f, i);
    map[i] = st_writer_add(w[i % 2], t->name, t->dt, t->ndim, t->shape);
    fprintf(ix, "%s\"%s\":\"model-%05d-of-00002.safetensors\"", i ? "," : "", t->name, i % 2 + 1);
  }
  fprintf(ix, "}}");
  fclose(ix);
  int rc = st_writer_begin(w[0], err, sizeof err) || st_writer_begin(w[1], err, sizeof err);
  for (int i = 0; i < n && rc == 0; i++)
    rc = st_writer_put(w[i % 2], map[i], st_tensor_at(f, i)->data, err, sizeof err);
  free(map);
  st_close(f);
  st_writer_close(w[0], NULL, 0);
  st_writer_close(w[1], NULL, 0);
  return rc;
}

TEST(vlm_prefix_sharded) {
  const char *cfg =
      "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":false,\"text_config\":{\"vocab_size\":"
      "120,"
      "\"hidden_size\":32,\"intermediate_size\":40,\"num_hidden_layers\":4,\"num_attention_heads\":"
      "2,"
      "\"num_key_value_heads\":1,\"head_dim\":16,\"linear_num_key_heads\":1,\"linear_num_value_"
      "heads\":2,"
      "\"linear_key_head_dim\":8,\"linear_value_head_dim\":8}}";
  int rc =
      make_model("vlm1", cfg, (gen_random_opts){.seed = 11, .dt = DTYPE_BF16, .vlm_prefix = 1});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  REQUIRE(shard(dirof("vlm1"), dirof("vlm2")) == 0);
  model_config c;
  model_weights w1, w2;
  rc = model_load(dirof("vlm1"), &c, &w1, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  rc = model_load(dirof("vlm2"), &c, &w2, err, sizeof err);
  EXPECT_MSG(rc == 0, "load sharded: %s", err);
  if (rc == 0) {
    EXPECT(memcmp(w1.embed.data, w2.embed.data, (size_t)tensor_numel(&w1.embed) * 2) == 0);
    EXPECT(memcmp(w1.layers[3].o_proj.data, w2.layers[3].o_proj.data,
                  (size_t)tensor_numel(&w1.layers[3].o_proj) * 2) == 0);
    EXPECT(memcmp(w1.lm_head.data, w2.lm_head.data, (size_t)tensor_numel(&w1.lm_head) * 2) == 0);
    weights_free(&w2);
  }
  weights_free(&w1);
}

/* ---- bad input ---- */

/* Loading dir must fail with one line that contains each of the given substrings. */
static void expect_load_error(const char *dir, const char *s1, const char *s2) {
  model_config c;
  model_weights w;
  memset(&w, 0x5a, sizeof w);
  err[0] = 0;
  int rc = model_load(dir, &c, &w, err, sizeof err);
  EXPECT_MSG(rc == -1, "%s loaded", dir);
  EXPECT_MSG(err[0] && !strchr(err, '\n'), "error '%s' is not one line", err);
  EXPECT_MSG(!s1 || strstr(err, s1), "error '%s' lacks '%s'", err, s1);
  EXPECT_MSG(!s2 || strstr(err, s2), "error '%s' lacks '%s'", err, s2);
  EXPECT_MSG(w.store == NULL && w.layers == NULL, "failed load left memory");
}

/* Replaces the first occurrence of `from` in file `path` by `to` (same length). */
static int patch_file(const char *path, const char *from, const char *to) {
  FILE *f = fopen(path, "r+b");
  if (!f) return -1;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  char *p = memmem(buf, n, from, strlen(from));
  if (!p) {
    fclose(f);
    return -1;
  }
  fseek(f, p - buf, SEEK_SET);
  fwrite(to, 1, strlen(to), f);
  fclose(f);
  return 0;
}

TEST(bad_inputs) {
  int rc = make_model("good", dense_cfg_untied, (gen_random_opts){.seed = 1, .dt = DTYPE_BF16});
  EXPECT_MSG(rc == 0, "gen: %s", err);
  if (rc) return;
  char good[512];
  snprintf(good, sizeof good, "%s", dirof("good"));
  char cmd[2600], p[1200];
  model_config c;
  model_weights w;

  /* no folder / no weights */
  expect_load_error(dirof("absent"), "absent/config.json", NULL);
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/config.json %s/", dirof("nofile"),
           dirof("nofile"), good, dirof("nofile"));
  sh(cmd);
  expect_load_error(dirof("nofile"), "nofile", "model.safetensors");

  /* truncated: the last tensors run past the end */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && truncate -s -1000 %s/model.safetensors",
           dirof("trunc"), good, dirof("trunc"), dirof("trunc"));
  sh(cmd);
  expect_load_error(dirof("trunc"), "trunc/model.safetensors", "lm_head.weight");
  /* shorter than the length prefix, and a header longer than the file */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && truncate -s 5 %s/model.safetensors",
           dirof("tiny"), good, dirof("tiny"), dirof("tiny"));
  sh(cmd);
  expect_load_error(dirof("tiny"), "tiny/model.safetensors", "truncated");
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && truncate -s 100 %s/model.safetensors",
           dirof("hdr"), good, dirof("hdr"), dirof("hdr"));
  sh(cmd);
  expect_load_error(dirof("hdr"), "hdr/model.safetensors", "header");
  /* empty */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && : > %s/model.safetensors", dirof("empty"),
           good, dirof("empty"), dirof("empty"));
  sh(cmd);
  expect_load_error(dirof("empty"), "empty/model.safetensors", NULL);

  /* invalid header JSON */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("json"), good, dirof("json"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", dirof("json"));
  EXPECT(patch_file(p, "\"__metadata__\"", "\"__metadata__'") == 0);
  expect_load_error(dirof("json"), "json/model.safetensors", "invalid header JSON");

  /* unknown and non-float dtypes on a needed tensor */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("i32"), good, dirof("i32"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", dirof("i32"));
  EXPECT(patch_file(p, "A_log\":{\"dtype\":\"F32\"", "A_log\":{\"dtype\":\"I32\"") == 0);
  expect_load_error(dirof("i32"), "i32/model.safetensors",
                    "model.layers.0.linear_attn.A_log has dtype I32");
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("q99"), good, dirof("q99"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", dirof("q99"));
  EXPECT(patch_file(p, "A_log\":{\"dtype\":\"F32\"", "A_log\":{\"dtype\":\"Q99\"") == 0);
  expect_load_error(dirof("q99"), "q99/model.safetensors", "dtype Q99");
  /* a byte count that disagrees with dtype and shape */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("f16"), good, dirof("f16"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors", dirof("f16"));
  EXPECT(patch_file(p, "A_log\":{\"dtype\":\"F32\"", "A_log\":{\"dtype\":\"F16\"") == 0);
  expect_load_error(dirof("f16"), "f16/model.safetensors", "A_log");

  /* missing tensor */
  REQUIRE(rewrite(good, dirof("miss"), "model.layers.2.mlp.up_proj.weight", NULL, 0, NULL) == 0);
  expect_load_error(dirof("miss"), "miss/model.safetensors",
                    "missing tensor model.layers.2.mlp.up_proj.weight");
  REQUIRE(rewrite(good, dirof("nohead"), "lm_head.weight", NULL, 0, NULL) == 0);
  expect_load_error(dirof("nohead"), "nohead/model.safetensors", "lm_head.weight");

  /* wrong shape (same byte count) */
  REQUIRE(rewrite(good, dirof("shape"), NULL, "model.layers.3.self_attn.o_proj.weight", 2,
                  (int64_t[]){64, 48}) == 0);
  expect_load_error(dirof("shape"), "shape/model.safetensors",
                    "model.layers.3.self_attn.o_proj.weight has shape [64, 48]");

  /* config problems name config.json */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("arch"), good, dirof("arch"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/config.json", dirof("arch"));
  write_text(p, "{\"model_type\":\"llama\",\"hidden_size\":48}");
  expect_load_error(dirof("arch"), "arch/config.json", "llama");
  /* config and weights that disagree: weights for hidden 48, config says 40 */
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("mismatch"), good, dirof("mismatch"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/config.json", dirof("mismatch"));
  char txt[1024];
  snprintf(txt, sizeof txt, DENSE_CFG, "false");
  char *h = strstr(txt, "\"hidden_size\":48");
  if (h) memcpy(h, "\"hidden_size\":40", 16);
  write_text(p, txt);
  expect_load_error(dirof("mismatch"), "mismatch/model.safetensors",
                    "model.embed_tokens.weight has shape [300, 48]");

  /* shards: a missing shard file, an index naming a shard that lacks the tensor, bad index */
  REQUIRE(shard(good, dirof("sh")) == 0);
  rc = model_load(dirof("sh"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "sharded load: %s", err);
  if (rc == 0) weights_free(&w);
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && rm %s/model-00002-of-00002.safetensors",
           dirof("sh_miss"), dirof("sh"), dirof("sh_miss"), dirof("sh_miss"));
  sh(cmd);
  expect_load_error(dirof("sh_miss"), "sh_miss/model-00002-of-00002.safetensors", NULL);
  snprintf(cmd, sizeof cmd,
           "rm -rf %s && cp -r %s %s && cp %s/model-00001-of-00002.safetensors "
           "%s/model-00002-of-00002.safetensors",
           dirof("sh_lack"), dirof("sh"), dirof("sh_lack"), dirof("sh_lack"), dirof("sh_lack"));
  sh(cmd);
  /* shard 2 is now a duplicate of shard 1: duplicated names are an error too */
  expect_load_error(dirof("sh_lack"), "appears in both", NULL);
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", dirof("sh_json"), dirof("sh"),
           dirof("sh_json"));
  sh(cmd);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dirof("sh_json"));
  write_text(p, "{\"weight_map\": [");
  expect_load_error(dirof("sh_json"), "sh_json/model.safetensors.index.json", "invalid JSON");
  write_text(p, "{\"weight_map\": {\"x\": \"../../etc/passwd\"}}");
  expect_load_error(dirof("sh_json"), "sh_json/model.safetensors.index.json", NULL);
  /* an index that lists a tensor in a shard that lacks it */
  REQUIRE(rewrite(good, dirof("sh_one"), "model.norm.weight", NULL, 0, NULL) == 0);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dirof("sh_one"));
  write_text(p,
             "{\"weight_map\": {\"model.norm.weight\": \"model.safetensors\", "
             "\"model.embed_tokens.weight\": \"model.safetensors\"}}");
  expect_load_error(dirof("sh_one"), "sh_one/model.safetensors: missing tensor model.norm.weight",
                    "index");
}

TEST(cli_gen_random_exit_codes) {
  const char *bin = getenv("DS_BUILD") ? getenv("DS_BUILD") : "build";
  char cmd[2600], cfg[600];
  snprintf(cmd, sizeof cmd, "test -x %s/deltaserve", bin);
  if (system(cmd) != 0) {
    printf("note: %s/deltaserve not built; CLI checks skipped\n", bin);
    return;
  }
  snprintf(cfg, sizeof cfg, "%s/cli.config.json", root);
  write_text(cfg, dense_cfg_tied);
  snprintf(cmd, sizeof cmd,
           "%s/deltaserve gen-random --config %s --out %s --seed 3 --dtype f32 >/dev/null", bin,
           cfg, dirof("cli"));
  EXPECT(system(cmd) == 0);
  model_config c;
  model_weights w;
  int rc = model_load(dirof("cli"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s", err);
  if (rc == 0) {
    EXPECT_EQ_INT(w.embed.dt, DTYPE_F32);
    weights_free(&w);
  }
  snprintf(cmd, sizeof cmd, "%s/deltaserve gen-random --config %s/nope.json --out %s 2>/dev/null",
           bin, root, dirof("cli2"));
  EXPECT_EQ_INT(WEXITSTATUS(system(cmd)), 1);
  snprintf(cmd, sizeof cmd, "%s/deltaserve gen-random --config %s 2>/dev/null", bin, cfg);
  EXPECT_EQ_INT(WEXITSTATUS(system(cmd)), 2);
  snprintf(cmd, sizeof cmd, "%s/deltaserve gen-random --config %s --out %s --dtype f8 2>/dev/null",
           bin, cfg, dirof("cli3"));
  EXPECT_EQ_INT(WEXITSTATUS(system(cmd)), 2);
}

/* ---- reference fixtures (transformers 5.17 save_pretrained) ---- */

#define MAXP 4096
static const void *loaded[MAXP];
static int n_loaded;
static void note(const tensor *t) {
  if (t->data && n_loaded < MAXP) loaded[n_loaded++] = t->data;
  if (t->scale && n_loaded < MAXP) loaded[n_loaded++] = t->scale; /* FP8 block scales */
}
static int was_loaded(const void *p) {
  for (int i = 0; i < n_loaded; i++)
    if (loaded[i] == p) return 1;
  return 0;
}

/* Loads fixture `name` and checks every tensor listed in its tensors.txt: each text tensor
 * is a view the loader returned (or, for the Qwen3-Next fused projections, regrouped
 * correctly); only vision/MTP tensors and a tied lm_head go unused. */
static void check_fixture(const char *name) {
  char dir[512], p[1200];
  snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
  model_config c;
  model_weights w;
  int rc = model_load(dir, &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s: %s", name, err);
  if (rc) return;
  n_loaded = 0;
  note(&w.embed);
  note(&w.final_norm);
  note(&w.lm_head);
  for (int i = 0; i < c.n_layers; i++) {
    const layer_weights *L = &w.layers[i];
    const tensor *all[] = {
        &L->input_norm, &L->post_norm,   &L->q_proj,    &L->k_proj,      &L->v_proj,
        &L->o_proj,     &L->q_norm,      &L->k_norm,    &L->in_proj_qkv, &L->in_proj_z,
        &L->in_proj_b,  &L->in_proj_a,   &L->conv1d,    &L->dt_bias,     &L->A_log,
        &L->lin_norm,   &L->out_proj,    &L->gate_proj, &L->up_proj,     &L->down_proj,
        &L->router,     &L->shared_gate, &L->shared_up, &L->shared_down, &L->shared_expert_gate};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) note(all[k]);
    if (L->experts)
      for (int e = 0; e < c.n_experts; e++) {
        note(&L->experts[e].gate);
        note(&L->experts[e].up);
        note(&L->experts[e].down);
      }
  }
  snprintf(p, sizeof p, "%s/tensors.txt", dir);
  FILE *f = fopen(p, "r");
  EXPECT_MSG(f != NULL, "%s has no tensors.txt", name);
  if (!f) {
    weights_free(&w);
    return;
  }
  char line[1024], file[256], tname[512], dts[32];
  int lines = 0, used = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%255s %511s %31s", file, tname, dts) != 3) continue;
    lines++;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    st_file *sf;
    if (st_open(p, &sf, err, sizeof err)) {
      EXPECT_MSG(0, "%s", err);
      break;
    }
    const st_tensor *t = st_find(sf, tname);
    EXPECT_MSG(t && !strcmp(t->dtype_str, dts), "%s: %s not in %s as %s", name, tname, file, dts);
    int skip = !strncmp(tname, "model.visual.", 13) || !strncmp(tname, "mtp.", 4) ||
               (c.tie_word_embeddings && !strcmp(tname, "lm_head.weight"));
    if (t && !skip) {
      if ((strstr(tname, "in_proj_qkvz") || strstr(tname, "in_proj_ba")) &&
          (strstr(tname, "_scale_inv") || t->dt == DTYPE_F8_E4M3)) {
        used++; /* FP8 fused projections are regrouped dequantized: test_fp8 checks them */
      } else if (strstr(tname, "in_proj_qkvz")) {
        int li = atoi(tname + strlen("model.layers."));
        char bn[512];
        snprintf(bn, sizeof bn, "%.*sin_proj_ba.weight",
                 (int)(strstr(tname, "in_proj_qkvz") - tname), tname);
        const st_tensor *ba = st_find(sf, bn);
        EXPECT_MSG(ba && check_next_regroup(&w.layers[li], t, ba, c.hidden_size, c.lin_n_k_heads,
                                            c.lin_n_v_heads, c.lin_k_head_dim, c.lin_v_head_dim),
                   "%s: layer %d regroup", name, li);
        used++;
      } else if (strstr(tname, "in_proj_ba")) {
        used++;
      } else {
        uint64_t nb = 0;
        const void *raw = weights_raw(&w, tname, &nb);
        EXPECT_MSG(raw && nb == t->nbytes && memcmp(raw, t->data, nb) == 0,
                   "%s: %s differs from the file", name, tname);
        EXPECT_MSG(raw && was_loaded(raw), "%s: tensor %s is not used by the loader", name, tname);
        used += raw && was_loaded(raw);
      }
    }
    st_close(sf);
  }
  fclose(f);
  EXPECT_MSG(lines > 0 && used > 0, "%s: tensors.txt empty", name);
  weights_free(&w);
}

TEST(reference_fixtures) {
  DIR *d = opendir("tests/fixtures/models");
  if (!d) {
    printf("note: tests/fixtures/models is absent; reference fixture checks skipped\n");
    return;
  }
  struct dirent *e;
  int n = 0;
  const char *kinds[] = {"dense", "tied", "vlm", "moe", "next"};
  int seen[5] = {0};
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char cfg[600];
    struct stat sb;
    snprintf(cfg, sizeof cfg, "tests/fixtures/models/%s/config.json", e->d_name);
    if (stat(cfg, &sb) != 0) continue;
    check_fixture(e->d_name);
    for (int k = 0; k < 5; k++) seen[k] |= !strncmp(e->d_name, kinds[k], strlen(kinds[k]));
    n++;
  }
  closedir(d);
  for (int k = 0; k < 5; k++)
    EXPECT_MSG(seen[k], "no %s fixture under tests/fixtures/models", kinds[k]);
  EXPECT(n >= 5);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/ds_test_weights_%d", (int)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
  sh(cmd);
  snprintf(dense_cfg_untied, sizeof dense_cfg_untied, DENSE_CFG, "false");
  snprintf(dense_cfg_tied, sizeof dense_cfg_tied, DENSE_CFG, "true");
  RUN(tensor_get_f32_all_dtypes);
  RUN(dtype_from_f32_rounding);
  RUN(safetensors_round_trip);
  RUN(dense_round_trip);
  RUN(tied_f16_round_trip);
  RUN(gen_random_deterministic);
  RUN(moe_fused_round_trip);
  RUN(moe_per_expert_round_trip);
  RUN(next_fused_regroup);
  RUN(vlm_prefix_sharded);
  RUN(bad_inputs);
  RUN(cli_gen_random_exit_codes);
  RUN(reference_fixtures);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (!test_failed_total) sh(cmd);
  TEST_MAIN_END();
}
