/* test_fp8 — block-wise FP8 (e4m3) weights: the e4m3 codec over all 256 codes, checkpoints
 * written here in the released format (F8_E4M3 + F32 weight_scale_inv; block sizes 128, 64 and
 * ones that do not divide the dimensions, squeezed scales, shards, the VLM prefix, fused and
 * per-expert experts, Qwen3-Next's fused projections), exact dequantization (the CPU forward of
 * an FP8 checkpoint equals, bit for bit, the forward of its fp32 dequantization), quantization
 * at load (--quantization fp8), --load-format dummy, and every refusal (one line naming the
 * format). With tests/fixtures/models/fp8_dense128 (scripts/fixtures/make_fp8_models.py):
 * quantization at load against the bytes transformers wrote. The fixtures' logits are checked
 * by test_parity, which runs every fixture folder. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#include "cli/cli_load.h"
#include "model/fp8.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* long paths in FAIL messages are cut */
#endif

static char root[256];
static char err[1024];

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

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return buf;
}

static int make_model(const char *name, const char *config_text, gen_random_opts o) {
  char cfg[600];
  snprintf(cfg, sizeof cfg, "%s/%s.config.json", root, name);
  write_text(cfg, config_text);
  o.quiet = 1;
  o.threads = 2;
  return gen_random_write(cfg, dirof(name), &o, err, sizeof err);
}

/* ---- an independent e4m3 reference and quantizer -------------------------------------- */

static float ref_e4m3(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  float v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
  return (b & 0x80) ? -v : v;
}

/* w [R, C] floats -> q [R, C] and s [ceil(R/bn), ceil(C/bk)] by transformers' rule */
static void ref_quant(const float *w, int64_t R, int64_t C, int bn, int bk, uint8_t *q, float *s) {
  int64_t sc = (C + bk - 1) / bk;
  for (int64_t bi = 0; bi * bn < R; bi++)
    for (int64_t bj = 0; bj * bk < C; bj++) {
      float amax = 0;
      for (int64_t r = bi * bn; r < R && r < (bi + 1) * bn; r++)
        for (int64_t c = bj * bk; c < C && c < (bj + 1) * bk; c++)
          amax = fabsf(w[r * C + c]) > amax ? fabsf(w[r * C + c]) : amax;
      float f = amax > 0 ? 1.0f / (448.0f / amax) : 1.0f;
      for (int64_t r = bi * bn; r < R && r < (bi + 1) * bn; r++)
        for (int64_t c = bj * bk; c < C && c < (bj + 1) * bk; c++) {
          float v = w[r * C + c] / f;
          v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
          q[r * C + c] = dtype_f32_to_e4m3(v);
        }
      s[bi * sc + bj] = f;
    }
}

static float st_get(const st_tensor *t, int64_t i) {
  tensor v = {.data = t->data, .dt = t->dt, .ndim = 1, .shape = {(int64_t)(t->nbytes)}};
  return tensor_get_f32(&v, i);
}

/* ---- writing FP8 checkpoints -------------------------------------------------------- */

/* A product weight an FP8 checkpoint stores as FP8 (the released checkpoints' choice): a
 * "...proj..." module's weight but in_proj_a / in_proj_b / in_proj_ba, or fused experts. */
static int is_product(const char *name) {
  size_t n = strlen(name);
  if (strstr(name, "in_proj_a.") || strstr(name, "in_proj_b.") || strstr(name, "in_proj_ba."))
    return 0;
  if (strstr(name, "mlp.experts.gate_up_proj") || strstr(name, "mlp.experts.down_proj")) return 1;
  if (n < 8 || strcmp(name + n - 7, ".weight")) return 0;
  const char *mod = name + n - 7;
  while (mod > name && mod[-1] != '.') mod--; /* the module's own name */
  return !strncmp(mod, "in_proj", 7) || strstr(mod, "_proj.") != NULL;
}

enum {
  RW_SQUEEZE = 1,      /* scales stored 1-D */
  RW_SHARDS = 2,       /* two files + model.safetensors.index.json */
  RW_DROP_SCALE = 4,   /* the first FP8 tensor without its scales */
  RW_SCALE_BF16 = 8,   /* the first scale tensor stored BF16 */
  RW_SCALE_SHORT = 16, /* the first scale tensor one element short */
  RW_STRAY_SCALE = 32, /* lm_head (BF16) gets a weight_scale_inv */
  RW_FP8_ROUTER = 64,  /* the MoE routers quantized too */
  RW_E5M2 = 128,       /* the first FP8 tensor declared F8_E5M2 */
  RW_DEQUANT = 256,    /* write the fp32 dequantization instead (no scales, no quant config) */
};

typedef struct rw_tensor {
  char name[256];
  dtype dt;
  int ndim;
  int64_t shape[4];
  void *data;
  size_t nbytes;
  int e5m2;
} rw_tensor;

static int rw_add(rw_tensor *v, int *n, const char *name, dtype dt, int ndim, const int64_t *shape,
                  void *data, size_t nbytes) {
  rw_tensor *t = &v[(*n)++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dt = dt;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->data = data;
  t->nbytes = nbytes;
  return 0;
}

/* st_writer can only name the dtypes of the enum: an F8_E5M2 tensor is written as F8_E4M3
 * and its header spelling patched afterwards (same length). */
static int patch_dtype(const char *path, const char *name) {
  FILE *f = fopen(path, "r+b");
  if (!f) return -1;
  uint64_t hl;
  if (fread(&hl, 8, 1, f) != 1 || hl > (1 << 20)) {
    fclose(f);
    return -1;
  }
  char *h = malloc(hl + 1);
  if (fread(h, 1, hl, f) != hl) {
    fclose(f);
    free(h);
    return -1;
  }
  h[hl] = 0;
  char *p = strstr(h, name);
  char *d = p ? strstr(p, "F8_E4M3") : NULL;
  if (d) {
    memcpy(d, "F8_E5M2", 7);
    fseek(f, 8, SEEK_SET);
    fwrite(h, 1, hl, f);
  }
  fclose(f);
  free(h);
  return d ? 0 : -1;
}

/* src (a gen-random folder) -> dst: product weights quantized in bn x bk blocks (or, with
 * RW_DEQUANT, the fp32 values those would dequantize to), config + quantization_config whose
 * object members are `qextra` (NULL: the normal ones). Returns 0. */
static int fp8_rewrite(const char *src, const char *dst, int bn, int bk, int flags,
                       const char *qextra) {
  char path[700], cmd[1400];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dst, dst);
  if (system(cmd)) return -1;
  snprintf(path, sizeof path, "%s/model.safetensors", src);
  st_file *f;
  if (st_open(path, &f, err, sizeof err)) return -1;
  int n = st_n_tensors(f), nw = 0, first_fp8 = 1, first_scale = 1;
  rw_tensor *v = calloc((size_t)(2 * n + 2), sizeof *v);
  void **owned = calloc((size_t)(2 * n + 2), sizeof *owned);
  int no = 0;
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_tensor_at(f, i);
    int q = is_product(t->name) || ((flags & RW_FP8_ROUTER) && strstr(t->name, "mlp.gate.weight"));
    if (!q) {
      rw_add(v, &nw, t->name, t->dt, t->ndim, t->shape, (void *)t->data, t->nbytes);
      if ((flags & RW_STRAY_SCALE) && !strcmp(t->name, "lm_head.weight")) {
        float *s = owned[no++] = calloc(1, 4);
        rw_add(v, &nw, "lm_head.weight_scale_inv", DTYPE_F32, 1, (int64_t[]){1}, s, 4);
      }
      continue;
    }
    /* [E, R, C] or [R, C]: quantized per matrix */
    int64_t E = t->ndim == 3 ? t->shape[0] : 1, R = t->shape[t->ndim - 2],
            C = t->shape[t->ndim - 1];
    int64_t sr = (R + bn - 1) / bn, sc = (C + bk - 1) / bk;
    float *w = malloc(sizeof *w * (size_t)(R * C));
    uint8_t *qq = owned[no++] = malloc((size_t)(E * R * C));
    float *ss = owned[no++] = malloc(sizeof *ss * (size_t)(E * sr * sc));
    float *dq = owned[no++] = malloc(sizeof *dq * (size_t)(E * R * C));
    for (int64_t e = 0; e < E; e++) {
      for (int64_t k = 0; k < R * C; k++) w[k] = st_get(t, e * R * C + k);
      ref_quant(w, R, C, bn, bk, qq + e * R * C, ss + e * sr * sc);
      for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++)
          dq[e * R * C + r * C + c] =
              ref_e4m3(qq[e * R * C + r * C + c]) * ss[e * sr * sc + (r / bn) * sc + c / bk];
    }
    free(w);
    if (flags & RW_DEQUANT) {
      rw_add(v, &nw, t->name, DTYPE_F32, t->ndim, t->shape, dq, (size_t)(E * R * C) * 4);
      continue;
    }
    rw_add(v, &nw, t->name, DTYPE_F8_E4M3, t->ndim, t->shape, qq, (size_t)(E * R * C));
    if ((flags & RW_E5M2) && first_fp8) v[nw - 1].e5m2 = 1;
    if ((flags & RW_DROP_SCALE) && first_fp8) {
      first_fp8 = 0;
      continue;
    }
    first_fp8 = 0;
    char sn[300];
    size_t ln = strlen(t->name);
    if (ln > 7 && !strcmp(t->name + ln - 7, ".weight"))
      snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
    else
      snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
    int64_t sshape[3] = {E, sr, sc};
    int64_t flat = E * sr * sc;
    size_t sbytes = (size_t)flat * 4;
    if ((flags & RW_SCALE_SHORT) && first_scale) {
      flat -= 1;
      sbytes -= 4;
      rw_add(v, &nw, sn, DTYPE_F32, 1, &flat, ss, sbytes);
    } else if ((flags & RW_SCALE_BF16) && first_scale) {
      uint16_t *h = owned[no++] = malloc((size_t)flat * 2);
      for (int64_t k = 0; k < flat; k++) h[k] = dtype_f32_to_bf16(ss[k]);
      rw_add(v, &nw, sn, DTYPE_BF16, t->ndim, t->ndim == 3 ? sshape : sshape + 1, h,
             (size_t)flat * 2);
    } else if (flags & RW_SQUEEZE) {
      rw_add(v, &nw, sn, DTYPE_F32, 1, &flat, ss, sbytes);
    } else {
      rw_add(v, &nw, sn, DTYPE_F32, t->ndim, t->ndim == 3 ? sshape : sshape + 1, ss, sbytes);
    }
    first_scale = 0;
  }
  /* write: one file, or two shards split by index parity */
  int nfiles = (flags & RW_SHARDS) ? 2 : 1, rc = 0;
  char idx[1 << 15];
  size_t ik = (size_t)snprintf(idx, sizeof idx, "{\"weight_map\":{");
  for (int fi = 0; fi < nfiles && rc == 0; fi++) {
    char fname[64];
    snprintf(fname, sizeof fname,
             nfiles == 1 ? "model.safetensors" : "model-0000%d-of-00002.safetensors", fi + 1);
    snprintf(path, sizeof path, "%s/%s", dst, fname);
    st_writer *w;
    if (st_writer_open(&w, path, err, sizeof err)) {
      rc = -1;
      break;
    }
    int ids[1024], m = 0;
    for (int i = fi; i < nw; i += nfiles) {
      ids[m++] = st_writer_add(w, v[i].name, v[i].dt, v[i].ndim, v[i].shape);
      if (nfiles > 1)
        ik += (size_t)snprintf(idx + ik, sizeof idx - ik, "%s\"%s\":\"%s\"", ik > 15 ? "," : "",
                               v[i].name, fname);
    }
    rc |= st_writer_begin(w, err, sizeof err);
    m = 0;
    for (int i = fi; i < nw && rc == 0; i += nfiles)
      rc |= st_writer_put(w, ids[m++], v[i].data, err, sizeof err);
    rc |= st_writer_close(w, err, sizeof err);
    for (int i = fi; i < nw && rc == 0; i += nfiles)
      if (v[i].e5m2) rc |= patch_dtype(path, v[i].name);
  }
  if (nfiles > 1) {
    snprintf(idx + ik, sizeof idx - ik, "}}");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dst);
    write_text(path, idx);
  }
  /* config: the source's, with the quantization_config */
  snprintf(path, sizeof path, "%s/config.json", src);
  char *cfg = read_text(path);
  char out[1 << 16];
  size_t len = strlen(cfg);
  while (len && cfg[len - 1] != '}') len--;
  if (flags & RW_DEQUANT) {
    snprintf(out, sizeof out, "%s", cfg);
  } else {
    char q[2048];
    if (qextra)
      snprintf(q, sizeof q, "%s", qextra);
    else
      snprintf(q, sizeof q,
               "\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
               "\"weight_block_size\":[%d,%d],\"modules_to_not_convert\":[\"lm_head\","
               "\"model.layers.0.linear_attn.in_proj_a\",\"mlp.gate\"]",
               bn, bk);
    snprintf(out, sizeof out, "%.*s,\"quantization_config\":{%s}}", (int)(len - 1), cfg, q);
  }
  snprintf(path, sizeof path, "%s/config.json", dst);
  write_text(path, out);
  for (int i = 0; i < no; i++) free(owned[i]);
  free(owned);
  free(v);
  st_close(f);
  return rc;
}

/* ---- the CPU forward of a folder -------------------------------------------------------- */

/* Logits [n, V] of prompt 1..n (ids i*7 % V) through the CPU backend; NULL with err. */
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

/* FP8 folder a and its fp32 dequantization b give bit-identical logits. */
static void expect_same_forward(const char *a, const weights_opts *oa, const char *b,
                                const weights_opts *ob) {
  int Va = 0, Vb = 0, n = 9;
  float *x = forward(a, oa, n, &Va);
  EXPECT_MSG(x != NULL, "forward %s: %s", a, err);
  float *y = forward(b, ob, n, &Vb);
  EXPECT_MSG(y != NULL, "forward %s: %s", b, err);
  if (x && y) {
    EXPECT_EQ_INT(Va, Vb);
    int same = memcmp(x, y, sizeof *x * (size_t)n * (size_t)Va) == 0;
    double worst = 0;
    for (int i = 0; i < n * Va; i++) worst = fmax(worst, fabs((double)x[i] - y[i]));
    EXPECT_MSG(same, "%s and %s: logits differ (max |diff| %.3g)", a, b, worst);
  }
  free(x);
  free(y);
}

/* Every FP8 view of w equals the file's e4m3 values times their block's scale (checked against
 * the dequantized folder's F32 tensors, element by element, through both tensor_get_f32 and
 * fp8_dequantize); returns the number of FP8 views. */
static int check_views(const model_weights *w, const model_config *c, const char *deq_dir) {
  char path[700];
  snprintf(path, sizeof path, "%s/model.safetensors", deq_dir);
  st_file *f;
  if (st_open(path, &f, err, sizeof err)) return -1;
  const char *pre =
      st_find(f, "model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  int n = 0;
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *L = &w->layers[i];
    struct {
      const tensor *t;
      const char *name;
    } ts[] = {{&L->q_proj, "self_attn.q_proj"},
              {&L->o_proj, "self_attn.o_proj"},
              {&L->in_proj_qkv, "linear_attn.in_proj_qkv"},
              {&L->out_proj, "linear_attn.out_proj"},
              {&L->down_proj, "mlp.down_proj"},
              {&L->shared_up, "mlp.shared_expert.up_proj"}};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
      const tensor *t = ts[k].t;
      if (!t->data || t->dt != DTYPE_F8_E4M3) continue;
      char name[300];
      snprintf(name, sizeof name, "%slayers.%d.%s.weight", pre, i, ts[k].name);
      const st_tensor *r = st_find(f, name);
      EXPECT_MSG(r && r->dt == DTYPE_F32, "%s missing from %s", name, deq_dir);
      if (!r) continue;
      int64_t rows = t->shape[0], cols = t->shape[1];
      float *d = malloc(sizeof *d * (size_t)(rows * cols));
      fp8_dequantize(t, 0, rows, d);
      int bad = 0;
      for (int64_t e = 0; e < rows * cols && !bad; e++) {
        float want = st_get(r, e);
        bad = memcmp(&d[e], &want, 4) != 0 || tensor_get_f32(t, e) != want;
        EXPECT_MSG(!bad, "%s element %lld: %g / %g, expected %g", name, (long long)e, d[e],
                   tensor_get_f32(t, e), want);
      }
      free(d);
      n++;
    }
    /* experts: views of a fused or per-expert FP8 tensor, against the dequantized file */
    if (L->experts && c->layer_is_moe[i])
      for (int e = 0; e < c->n_experts; e++) {
        const tensor *g = &L->experts[e].gate, *u = &L->experts[e].up;
        if (g->dt != DTYPE_F8_E4M3) continue;
        char name[300];
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", pre, i);
        const st_tensor *r = st_find(f, name);
        int64_t I = g->shape[0], H = g->shape[1];
        for (int64_t k = 0; k < I * H; k++) {
          float wg, wu;
          if (r) { /* fused [E, 2I, H] */
            wg = st_get(r, (e * 2 * I) * H + k);
            wu = st_get(r, (e * 2 * I + I) * H + k);
          } else {
            char gn[300], un[300];
            snprintf(gn, sizeof gn, "%slayers.%d.mlp.experts.%d.gate_proj.weight", pre, i, e);
            snprintf(un, sizeof un, "%slayers.%d.mlp.experts.%d.up_proj.weight", pre, i, e);
            const st_tensor *rg = st_find(f, gn), *ru = st_find(f, un);
            if (!rg || !ru) {
              EXPECT_MSG(0, "%s missing", gn);
              break;
            }
            wg = st_get(rg, k);
            wu = st_get(ru, k);
          }
          if (tensor_get_f32(g, k) != wg || tensor_get_f32(u, k) != wu) {
            EXPECT_MSG(0, "layer %d expert %d element %lld: %g %g, expected %g %g", i, e,
                       (long long)k, tensor_get_f32(g, k), tensor_get_f32(u, k), wg, wu);
            break;
          }
        }
        n++;
      }
  }
  st_close(f);
  return n;
}

/* ---- configs ---------------------------------------------------------------------------- */

/* dims that no block of 64 divides: the ceiling's edge blocks everywhere */
#define DENSE_CFG                                                                                 \
  "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":150,\"hidden_size\":80,\"intermediate_size\":" \
  "100,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,"              \
  "\"head_dim\":24,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"                      \
  "\"linear_key_head_dim\":8,\"linear_value_head_dim\":12,\"linear_conv_kernel_dim\":4,"          \
  "\"layer_types\":[\"linear_attention\",\"full_attention\"],\"tie_word_embeddings\":false}"

/* moe_intermediate_size 12: with 8-row blocks a fused expert's up rows start mid-block */
#define MOE_CFG                                                                                  \
  "{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":120,\"hidden_size\":32,"                  \
  "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16," \
  "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,"           \
  "\"linear_value_head_dim\":8,\"layer_types\":[\"linear_attention\",\"full_attention\"],"       \
  "\"num_experts\":3,\"num_experts_per_tok\":2,\"moe_intermediate_size\":12,"                    \
  "\"shared_expert_intermediate_size\":20}"

#define NEXT_CFG                                                                                   \
  "{\"model_type\":\"qwen3_next\",\"vocab_size\":100,\"hidden_size\":32,\"intermediate_size\":"    \
  "24,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8," \
  "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,"             \
  "\"linear_value_head_dim\":8,\"layer_types\":[\"linear_attention\",\"full_attention\"],"         \
  "\"num_experts\":2,\"num_experts_per_tok\":1,\"moe_intermediate_size\":16,"                      \
  "\"shared_expert_intermediate_size\":16,\"mlp_only_layers\":[1]}"

/* ---- tests ------------------------------------------------------------------------------ */

TEST(e4m3_codec) {
  int bad = 0;
  for (int b = 0; b < 256; b++) {
    float got = dtype_e4m3_to_f32((uint8_t)b), want = ref_e4m3((uint8_t)b);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_MSG(isnan(got), "code 0x%02x decodes to %g, expected NaN", b, got);
      EXPECT_MSG(dtype_f32_to_e4m3(got) == (0x7f | (b & 0x80)) || dtype_f32_to_e4m3(got) == 0x7f,
                 "NaN encodes to 0x%02x", dtype_f32_to_e4m3(got));
      continue;
    }
    if (memcmp(&got, &want, 4) != 0 && !bad++)
      EXPECT_MSG(0, "code 0x%02x decodes to %a, expected %a", b, got, want);
    EXPECT_MSG(dtype_f32_to_e4m3(got) == b, "code 0x%02x does not round-trip (0x%02x)", b,
               dtype_f32_to_e4m3(got));
  }
  EXPECT(dtype_e4m3_to_f32(0x7e) == 448.0f && dtype_e4m3_to_f32(0x01) == ldexpf(1, -9));
  /* ties between neighbours go to the even code; just above a tie, up */
  for (int b = 0; b < 0x7e; b++) {
    float lo = dtype_e4m3_to_f32((uint8_t)b), hi = dtype_e4m3_to_f32((uint8_t)(b + 1));
    float mid = (lo + hi) / 2; /* exact: few bits */
    int even = (b & 1) ? b + 1 : b;
    EXPECT_MSG(dtype_f32_to_e4m3(mid) == even, "tie %g between 0x%02x and 0x%02x -> 0x%02x", mid, b,
               b + 1, dtype_f32_to_e4m3(mid));
    EXPECT_MSG(dtype_f32_to_e4m3(nextafterf(mid, 1000)) == b + 1, "above the tie %g", mid);
    EXPECT_MSG(dtype_f32_to_e4m3(nextafterf(mid, 0)) == b, "below the tie %g", mid);
    EXPECT_MSG(dtype_f32_to_e4m3(-mid) == (even | 0x80), "negative tie %g", -mid);
  }
  EXPECT_EQ_INT(dtype_f32_to_e4m3(464.0f), 0x7e); /* the tie above 448 goes to the even 448 */
  EXPECT_EQ_INT(dtype_f32_to_e4m3(464.5f), 0x7f); /* past it: no infinity, NaN */
  EXPECT_EQ_INT(dtype_f32_to_e4m3(-1e9f), 0xff);
  EXPECT_EQ_INT(dtype_f32_to_e4m3(INFINITY), 0x7f);
  EXPECT_EQ_INT(dtype_f32_to_e4m3(ldexpf(1, -10)), 0x00); /* half the smallest subnormal */
  EXPECT_EQ_INT(dtype_f32_to_e4m3(ldexpf(3, -11)), 0x01);
  EXPECT_EQ_INT(dtype_f32_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ_INT(dtype_f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ_INT(dtype_size(DTYPE_F8_E4M3), 1);
  EXPECT_STR(dtype_name(DTYPE_F8_E4M3), "f8_e4m3");
}

TEST(quantize_matches_reference_rule) {
  /* fp8_quantize against the test's own quantizer, edge blocks and an all-zero block */
  enum { R = 70, C = 45 };
  static float w[R * C];
  for (int i = 0; i < R * C; i++) w[i] = (float)sin(i * 0.37) * (float)(1 + i % 13) * 0.01f;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) w[r * C + c] = 0;
  static uint8_t q1[R * C], q2[R * C];
  static float s1[5 * 3], s2[5 * 3];
  tensor t = {.data = w, .dt = DTYPE_F32, .ndim = 2, .shape = {R, C}};
  EXPECT(fp8_quantize(&t, 16, 16, q1, s1) == 0);
  ref_quant(w, R, C, 16, 16, q2, s2);
  EXPECT(memcmp(q1, q2, sizeof q1) == 0);
  EXPECT(memcmp(s1, s2, sizeof(float) * 5 * 3) == 0);
  EXPECT(s1[0] == 1.0f && q1[0] == 0);
  EXPECT_EQ_INT(fp8_scale_rows(R, 16), 5);
  EXPECT_EQ_INT(fp8_scale_cols(C, 16), 3);
  /* the view dequantizes to value x scale, and each block's largest value to its amax */
  tensor v = fp8_view(q1, s1, R, C, 16, 16);
  static float d[R * C];
  fp8_dequantize(&v, 0, R, d);
  float amax = 0, dmax = 0;
  for (int r = 16; r < 32; r++)
    for (int c = 16; c < 32; c++) {
      amax = fmaxf(amax, fabsf(w[r * C + c]));
      dmax = fmaxf(dmax, fabsf(d[r * C + c]));
    }
  EXPECT_MSG(fabsf(dmax - amax) <= amax * 1e-6f, "block amax %g dequantizes to %g", amax, dmax);
  for (int i = 0; i < R * C; i++)
    EXPECT_MSG(fabsf(d[i] - w[i]) <= fabsf(w[i]) * 0.0625f + 1e-6f, "element %d: %g vs %g", i, d[i],
               w[i]);
}

/* dense, blocks [64, 64] over dims no block divides, and [128, 128] + squeezed scales */
TEST(dense_edge_blocks) {
  REQUIRE(make_model("dense", DENSE_CFG, (gen_random_opts){.seed = 3, .dt = DTYPE_BF16}) == 0);
  const int blocks[][2] = {{64, 64}, {128, 128}, {16, 32}};
  for (int k = 0; k < 3; k++) {
    int bn = blocks[k][0], bk = blocks[k][1], fl = k == 1 ? RW_SQUEEZE : 0;
    REQUIRE(fp8_rewrite(dirof("dense"), dirof("dense_fp8"), bn, bk, fl, NULL) == 0);
    REQUIRE(fp8_rewrite(dirof("dense"), dirof("dense_deq"), bn, bk, RW_DEQUANT, NULL) == 0);
    model_config c;
    model_weights w;
    int rc = model_load(dirof("dense_fp8"), &c, &w, err, sizeof err);
    EXPECT_MSG(rc == 0, "load [%d, %d]: %s", bn, bk, err);
    if (rc) return;
    EXPECT_EQ_INT(c.fp8_block_n, bn);
    EXPECT_EQ_INT(c.fp8_block_k, bk);
    EXPECT(w.layers[0].in_proj_qkv.dt == DTYPE_F8_E4M3 && w.layers[1].q_proj.dt == DTYPE_F8_E4M3);
    EXPECT(w.layers[0].in_proj_a.dt == DTYPE_BF16 && w.lm_head.dt == DTYPE_BF16 &&
           w.embed.dt == DTYPE_BF16 && w.layers[0].input_norm.dt == DTYPE_BF16);
    int nv = check_views(&w, &c, dirof("dense_deq"));
    EXPECT_MSG(nv >= 4, "%d FP8 views checked", nv);
    weights_free(&w);
    expect_same_forward(dirof("dense_fp8"), NULL, dirof("dense_deq"), NULL);
  }
}

/* the VLM prefix, two shards, 1-D scales */
TEST(vlm_sharded_squeezed) {
  REQUIRE(make_model("vlm", DENSE_CFG,
                     (gen_random_opts){.seed = 4, .dt = DTYPE_BF16, .vlm_prefix = 1}) == 0);
  REQUIRE(fp8_rewrite(dirof("vlm"), dirof("vlm_fp8"), 32, 32, RW_SHARDS | RW_SQUEEZE, NULL) == 0);
  REQUIRE(fp8_rewrite(dirof("vlm"), dirof("vlm_deq"), 32, 32, RW_DEQUANT, NULL) == 0);
  model_config c;
  model_weights w;
  int rc = model_load(dirof("vlm_fp8"), &c, &w, err, sizeof err);
  EXPECT_MSG(rc == 0, "load: %s", err);
  if (rc) return;
  EXPECT(check_views(&w, &c, dirof("vlm_deq")) >= 4);
  weights_free(&w);
  expect_same_forward(dirof("vlm_fp8"), NULL, dirof("vlm_deq"), NULL);
}

/* MoE: fused experts [E, 2I, H] with blocks that cut a gate/up boundary, per-expert experts */
TEST(moe_fused_and_per_expert) {
  REQUIRE(make_model("moe_f", MOE_CFG, (gen_random_opts){.seed = 5, .dt = DTYPE_BF16}) == 0);
  REQUIRE(make_model("moe_p", MOE_CFG,
                     (gen_random_opts){
                         .seed = 6, .dt = DTYPE_F32, .experts = GEN_RANDOM_EXPERTS_PER_EXPERT}) ==
          0);
  const char *src[] = {"moe_f", "moe_p"};
  for (int k = 0; k < 2; k++) {
    REQUIRE(fp8_rewrite(dirof(src[k]), dirof("moe_fp8"), 8, 16, 0, NULL) == 0);
    REQUIRE(fp8_rewrite(dirof(src[k]), dirof("moe_deq"), 8, 16, RW_DEQUANT, NULL) == 0);
    model_config c;
    model_weights w;
    int rc = model_load(dirof("moe_fp8"), &c, &w, err, sizeof err);
    EXPECT_MSG(rc == 0, "%s: load: %s", src[k], err);
    if (rc) return;
    EXPECT(w.layers[0].experts[1].up.dt == DTYPE_F8_E4M3 && w.layers[0].router.dt != DTYPE_F8_E4M3);
    if (k == 0) EXPECT_EQ_INT(w.layers[0].experts[1].up.row0, 12);
    int nv = check_views(&w, &c, dirof("moe_deq"));
    EXPECT_MSG(nv >= 6, "%s: %d FP8 views checked", src[k], nv);
    weights_free(&w);
    expect_same_forward(dirof("moe_fp8"), NULL, dirof("moe_deq"), NULL);
  }
}

/* Qwen3-Next: FP8 in_proj_qkvz (and in_proj_ba when the file has it FP8) regrouped */
TEST(next_fused_projections) {
  REQUIRE(make_model("next", NEXT_CFG,
                     (gen_random_opts){.seed = 7,
                                       .dt = DTYPE_BF16,
                                       .next_fused = 1,
                                       .experts = GEN_RANDOM_EXPERTS_PER_EXPERT}) == 0);
  REQUIRE(fp8_rewrite(dirof("next"), dirof("next_fp8"), 16, 16, 0, NULL) == 0);
  REQUIRE(fp8_rewrite(dirof("next"), dirof("next_deq"), 16, 16, RW_DEQUANT, NULL) == 0);
  expect_same_forward(dirof("next_fp8"), NULL, dirof("next_deq"), NULL);
}

/* --quantization fp8: 128 x 128 blocks of the same rule, the same result as the file */
TEST(quantization_at_load) {
  REQUIRE(make_model("q_dense", DENSE_CFG, (gen_random_opts){.seed = 8, .dt = DTYPE_BF16}) == 0);
  REQUIRE(fp8_rewrite(dirof("q_dense"), dirof("q_fp8"), 128, 128, 0, NULL) == 0);
  weights_opts o = {.quantize_fp8 = 1};
  model_config c, c2;
  model_weights w, w2;
  REQUIRE(model_load_with(dirof("q_dense"), &o, &c, &w, err, sizeof err) == 0);
  REQUIRE(model_load(dirof("q_fp8"), &c2, &w2, err, sizeof err) == 0);
  int n = 0;
  for (int i = 0; i < c.n_layers; i++) {
    const layer_weights *a = &w.layers[i], *b = &w2.layers[i];
    const tensor *ta[] = {&a->q_proj,    &a->k_proj,   &a->v_proj,    &a->o_proj,  &a->in_proj_qkv,
                          &a->in_proj_z, &a->out_proj, &a->gate_proj, &a->up_proj, &a->down_proj};
    const tensor *tb[] = {&b->q_proj,    &b->k_proj,   &b->v_proj,    &b->o_proj,  &b->in_proj_qkv,
                          &b->in_proj_z, &b->out_proj, &b->gate_proj, &b->up_proj, &b->down_proj};
    for (size_t k = 0; k < sizeof ta / sizeof ta[0]; k++) {
      if (!ta[k]->data) continue;
      EXPECT(ta[k]->dt == DTYPE_F8_E4M3 && ta[k]->block_n == 128 && ta[k]->block_k == 128);
      int64_t ne = tensor_numel(ta[k]),
              ns = fp8_scale_rows(ta[k]->shape[0], 128) * fp8_scale_cols(ta[k]->shape[1], 128);
      EXPECT_MSG(!memcmp(ta[k]->data, tb[k]->data, (size_t)ne) &&
                     !memcmp(ta[k]->scale, tb[k]->scale, (size_t)ns * 4),
                 "layer %d weight %zu: quantized at load differs from the file", i, k);
      n++;
    }
    EXPECT(!a->in_proj_a.data || (a->in_proj_a.dt == DTYPE_BF16 && a->in_proj_b.dt == DTYPE_BF16));
  }
  EXPECT(w.embed.dt == DTYPE_BF16 && w.lm_head.dt == DTYPE_BF16 && w.final_norm.dt == DTYPE_BF16);
  EXPECT_EQ_INT(n, 13); /* 6 in the DeltaNet layer, 7 in the attention layer */
  weights_free(&w);
  weights_free(&w2);
  expect_same_forward(dirof("q_dense"), &o, dirof("q_fp8"), NULL);
  /* MoE: experts and shared experts quantized, routers and shared_expert_gate not */
  REQUIRE(make_model("q_moe", MOE_CFG, (gen_random_opts){.seed = 9, .dt = DTYPE_F32}) == 0);
  REQUIRE(model_load_with(dirof("q_moe"), &o, &c, &w, err, sizeof err) == 0);
  const layer_weights *L = &w.layers[1];
  EXPECT(L->experts[2].down.dt == DTYPE_F8_E4M3 && L->shared_down.dt == DTYPE_F8_E4M3);
  EXPECT(L->router.dt == DTYPE_F32 && L->shared_expert_gate.dt == DTYPE_F32);
  weights_free(&w);
}

TEST(dummy_load_format) {
  /* a folder with config.json only */
  char path[700];
  snprintf(path, sizeof path, "mkdir -p %s", dirof("dummy"));
  REQUIRE(system(path) == 0);
  snprintf(path, sizeof path, "%s/config.json", dirof("dummy"));
  write_text(path, MOE_CFG);
  model_config c;
  model_weights w, w2;
  EXPECT(model_load(dirof("dummy"), &c, &w, err, sizeof err) == -1); /* no weights */
  weights_opts o = {.dummy = 1};
  REQUIRE(model_load_with(dirof("dummy"), &o, &c, &w, err, sizeof err) == 0);
  REQUIRE(model_load_with(dirof("dummy"), &o, &c, &w2, err, sizeof err) == 0);
  EXPECT(w.layers[1].experts[2].down.data && w.layers[0].in_proj_qkv.dt == DTYPE_BF16);
  EXPECT_MSG(!memcmp(w.layers[1].q_proj.data, w2.layers[1].q_proj.data,
                     (size_t)tensor_numel(&w.layers[1].q_proj) * 2),
             "dummy weights differ between two loads of one seed");
  weights_free(&w);
  weights_free(&w2);
  int V;
  float *x = forward(dirof("dummy"), &o, 5, &V);
  EXPECT_MSG(x != NULL, "dummy forward: %s", err);
  free(x);
  /* with --quantization fp8 */
  o.quantize_fp8 = 1;
  REQUIRE(model_load_with(dirof("dummy"), &o, &c, &w, err, sizeof err) == 0);
  EXPECT(w.layers[1].experts[2].down.dt == DTYPE_F8_E4M3 &&
         w.layers[1].experts[2].down.block_n == 128);
  weights_free(&w);
  x = forward(dirof("dummy"), &o, 5, &V);
  EXPECT_MSG(x != NULL, "dummy fp8 forward: %s", err);
  free(x);
  /* an fp8 config: dummy weights quantized in its blocks */
  char cfg[4096];
  snprintf(cfg, sizeof cfg,
           "%.*s,\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\","
           "\"activation_scheme\":\"dynamic\",\"weight_block_size\":[64,32]}}",
           (int)strlen(MOE_CFG) - 1, MOE_CFG);
  write_text(path, cfg);
  o.quantize_fp8 = 0;
  REQUIRE(model_load_with(dirof("dummy"), &o, &c, &w, err, sizeof err) == 0);
  EXPECT(w.layers[0].in_proj_qkv.dt == DTYPE_F8_E4M3 && w.layers[0].in_proj_qkv.block_n == 64 &&
         w.layers[0].in_proj_qkv.block_k == 32);
  weights_free(&w);
}

/* Loading dir must fail with one line that contains s (and s2 when not NULL). */
static void expect_refused(const char *dir, const char *s, const char *s2) {
  model_config c;
  model_weights w;
  err[0] = 0;
  int rc = model_load(dir, &c, &w, err, sizeof err);
  EXPECT_MSG(rc == -1, "%s loaded (expected an error with '%s')", dir, s);
  EXPECT_MSG(err[0] && !strchr(err, '\n'), "error '%s' is not one line", err);
  EXPECT_MSG(strstr(err, s), "error '%s' lacks '%s'", err, s);
  EXPECT_MSG(!s2 || strstr(err, s2), "error '%s' lacks '%s'", err, s2);
  if (rc == 0) weights_free(&w);
}

TEST(refusals) {
  REQUIRE(make_model("bad", DENSE_CFG, (gen_random_opts){.seed = 10, .dt = DTYPE_BF16}) == 0);
  REQUIRE(make_model("bad_moe", MOE_CFG, (gen_random_opts){.seed = 10, .dt = DTYPE_BF16}) == 0);
  const char *bad = dirof("bad"), *out = dirof("bad_fp8");
  const struct {
    const char *q, *s1, *s2;
  } cfgs[] = {
      {"\"quant_method\":\"awq\",\"bits\":4", "AWQ", "quant_method \"awq\""},
      {"\"quant_method\":\"gptq\",\"bits\":4", "GPTQ", NULL},
      {"\"quant_method\":\"compressed-tensors\"", "compressed-tensors", NULL},
      {"\"quant_method\":\"bitsandbytes\",\"load_in_4bit\":true", "bitsandbytes", NULL},
      {"\"quant_method\":\"fp4_magic\"", "unknown quant_method \"fp4_magic\"", NULL},
      {"\"bits\":8", "no \"quant_method\"", NULL},
      {"\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]", "fmt e5m2",
       NULL},
      {"\"quant_method\":\"fp8\",\"activation_scheme\":\"static\",\"weight_block_size\":[128,"
       "128]",
       "activation_scheme static", NULL},
      {"\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\"", "weight_block_size",
       "per-tensor"},
      {"\"quant_method\":\"fp8\",\"weight_block_size\":[0,128]", "weight_block_size", NULL},
      /* an FP8 tensor that modules_to_not_convert lists */
      {"\"quant_method\":\"fp8\",\"weight_block_size\":[64,64],\"modules_to_not_convert\":["
       "\"model.layers.*.mlp.down_proj\"]",
       "modules_to_not_convert", "mlp.down_proj"},
      {"\"quant_method\":\"fp8\",\"weight_block_size\":[64,64],\"modules_to_not_convert\":["
       "\"model.layers.1.self_attn\"]",
       "modules_to_not_convert", "self_attn"},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
    REQUIRE(fp8_rewrite(bad, out, 64, 64, 0, cfgs[k].q) == 0);
    expect_refused(out, cfgs[k].s1, cfgs[k].s2);
  }
  /* not listed by a name that only shares a prefix: mlp.gate is not mlp.gate_proj */
  REQUIRE(fp8_rewrite(bad, out, 64, 64, 0,
                      "\"quant_method\":\"fp8\",\"weight_block_size\":[64,64],"
                      "\"modules_to_not_convert\":[\"mlp.gate\",\"lm_head\",\"in_proj_a\"]") == 0);
  model_config c;
  model_weights w;
  EXPECT_MSG(model_load(out, &c, &w, err, sizeof err) == 0, "%s", err);
  weights_free(&w);
  /* compressed-tensors' older key */
  char path[700], text[1 << 15];
  snprintf(path, sizeof path, "%s/config.json", bad);
  snprintf(text, sizeof text, "%s", read_text(path));
  char cfg[1 << 15];
  snprintf(cfg, sizeof cfg, "%.*s,\"compression_config\":{\"format\":\"int-quantized\"}}",
           (int)(strrchr(text, '}') - text), text);
  write_text(path, cfg);
  expect_refused(bad, "compressed-tensors", NULL);
  write_text(path, text);
  /* file-level faults */
  const struct {
    int flags;
    const char *s1, *s2;
  } files[] = {
      {RW_DROP_SCALE, "without its scales", "weight_scale_inv"},
      {RW_SCALE_SHORT, "needs", "scale tensor"},
      {RW_SCALE_BF16, "expected F32", "BF16"},
      {RW_STRAY_SCALE, "lm_head.weight is stored BF16 but has a scale tensor", NULL},
      {RW_E5M2, "F8_E5M2", NULL},
  };
  for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
    REQUIRE(fp8_rewrite(bad, out, 64, 64, files[k].flags, NULL) == 0);
    expect_refused(out, files[k].s1, files[k].s2);
  }
  /* an FP8 router is read (a product weight like the others) */
  REQUIRE(fp8_rewrite(dirof("bad_moe"), out, 8, 8, RW_FP8_ROUTER,
                      "\"quant_method\":\"fp8\",\"weight_block_size\":[8,8]") == 0);
  EXPECT_MSG(model_load(out, &c, &w, err, sizeof err) == 0, "fp8 router: %s", err);
  if (!err[0] || w.store) {
    EXPECT(w.layers[0].router.dt == DTYPE_F8_E4M3);
    weights_free(&w);
  }
  /* FP8 tensors without an fp8 quantization_config */
  REQUIRE(fp8_rewrite(bad, out, 64, 64, 0,
                      "\"quant_method\":\"fp8\",\"weight_block_size\":[64,64]") == 0);
  snprintf(path, sizeof path, "%s/config.json", out);
  snprintf(text, sizeof text, "%s", read_text(path));
  char *q = strstr(text, ",\"quantization_config\"");
  REQUIRE(q != NULL);
  strcpy(q, "}");
  write_text(path, text);
  expect_refused(out, "no fp8 quantization_config", "F8_E4M3");
  /* a GGUF file passed as the model, and another file */
  snprintf(path, sizeof path, "%s/model.Q4_K_M.gguf", root);
  write_text(path, "GGUF\x03");
  expect_refused(path, "GGUF", "not supported");
  snprintf(path, sizeof path, "%s/weights.bin", root);
  write_text(path, "GGUFxx");
  expect_refused(path, "GGUF", NULL);
  write_text(path, "PK\x03\x04");
  expect_refused(path, "not a folder", NULL);
  /* the flags */
  weights_opts o = {0};
  char *av[] = {"x",
                "--quantization",
                "awq",
                "--load-format",
                "pt",
                "--quantization=fp8",
                "--load-format=dummy",
                "-q",
                NULL};
  int i = 1;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == -1 && strstr(err, "awq"));
  i = 3;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == -1 && strstr(err, "pt"));
  i = 5;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == 1 && o.quantize_fp8 == 1 && i == 5);
  i = 6;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == 1 && o.dummy == 1);
  i = 7;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == -1 && strstr(err, "needs a value"));
  i = 0;
  EXPECT(cli_load_flag(&o, 8, av, &i, err, sizeof err) == 0);
}

/* transformers' quantization of the fixture's bf16 model against ours. transformers 5.17's
 * quantize-on-load rounds each weight to e4m3 unscaled before its block quantization, so the
 * fixture holds quantize(e4m3(w)): fp8_quantize of those pre-rounded values must give its
 * bytes (a scale may differ by one ulp, transformers computing it on the GPU; such a block is
 * only counted), and --quantization fp8 (quantize(w), no pre-rounding) must be closer to w. */
TEST(fixture_quantization_matches_transformers) {
  const char *fx = "tests/fixtures/models/fp8_dense128",
             *src = "tests/fixtures/models/fp8_dense128/bf16";
  struct stat sb;
  if (stat(src, &sb) != 0) {
    printf("note: %s is absent (scripts/fixtures/make_fp8_models.py); skipped\n", src);
    return;
  }
  weights_opts o = {.quantize_fp8 = 1};
  model_config c, c2, c3;
  model_weights w, w2, w3;
  REQUIRE(model_load_with(src, &o, &c, &w, err, sizeof err) == 0);
  REQUIRE(model_load(fx, &c2, &w2, err, sizeof err) == 0);
  REQUIRE(model_load(src, &c3, &w3, err, sizeof err) == 0);
  EXPECT_EQ_INT(c2.fp8_block_n, 128);
  long blocks = 0, same_blocks = 0, ulp_blocks = 0;
  double err_ours = 0, err_theirs = 0, norm = 0;
  for (int i = 0; i < c.n_layers; i++) {
    const layer_weights *a = &w.layers[i], *b = &w2.layers[i], *r = &w3.layers[i];
    const tensor *ta[] = {&a->q_proj,   &a->k_proj,  &a->in_proj_qkv, &a->in_proj_z,
                          &a->out_proj, &a->up_proj, &a->down_proj};
    const tensor *tb[] = {&b->q_proj,   &b->k_proj,  &b->in_proj_qkv, &b->in_proj_z,
                          &b->out_proj, &b->up_proj, &b->down_proj};
    const tensor *tr[] = {&r->q_proj,   &r->k_proj,  &r->in_proj_qkv, &r->in_proj_z,
                          &r->out_proj, &r->up_proj, &r->down_proj};
    for (size_t k = 0; k < sizeof ta / sizeof ta[0]; k++) {
      if (!ta[k]->data) continue;
      REQUIRE(tb[k]->dt == DTYPE_F8_E4M3 && ta[k]->dt == DTYPE_F8_E4M3);
      int64_t R = tr[k]->shape[0], C = tr[k]->shape[1], sc = fp8_scale_cols(C, 128);
      float *x = malloc(sizeof *x * (size_t)(R * C)), *s = malloc(sizeof *s * (size_t)(R * C));
      uint8_t *q = malloc((size_t)(R * C));
      for (int64_t e = 0; e < R * C; e++) {
        float v = tensor_get_f32(tr[k], e);
        x[e] = dtype_e4m3_to_f32(dtype_f32_to_e4m3(v));
        double da = (double)tensor_get_f32(ta[k], e) - v, db = (double)tensor_get_f32(tb[k], e) - v;
        err_ours += da * da;
        err_theirs += db * db;
        norm += (double)v * v;
      }
      tensor tx = {.data = x, .dt = DTYPE_F32, .ndim = 2, .shape = {R, C}};
      REQUIRE(fp8_quantize(&tx, 128, 128, q, s) == 0);
      for (int64_t bi = 0; bi * 128 < R; bi++)
        for (int64_t bj = 0; bj < sc; bj++) {
          float fs;
          memcpy(&fs, (const char *)tb[k]->scale + (size_t)(bi * sc + bj) * 4, 4);
          float ms = s[bi * sc + bj];
          int eq = ms == fs;
          for (int64_t rr = bi * 128; eq && rr < R && rr < bi * 128 + 128; rr++)
            for (int64_t cc = bj * 128; eq && cc < C && cc < bj * 128 + 128; cc++)
              eq = q[rr * C + cc] == ((const uint8_t *)tb[k]->data)[rr * C + cc];
          blocks++;
          same_blocks += eq;
          ulp_blocks += !eq && ms != fs && (nextafterf(ms, 1) == fs || nextafterf(ms, 0) == fs);
          EXPECT_MSG(eq || (ms != fs && (nextafterf(ms, 1) == fs || nextafterf(ms, 0) == fs)),
                     "layer %d weight %zu block (%lld, %lld): differs from transformers' bytes", i,
                     k, (long long)bi, (long long)bj);
        }
      free(x);
      free(s);
      free(q);
    }
  }
  printf(
      "  fp8_dense128: %ld of %ld blocks byte-identical to transformers' (%ld with its scale one "
      "ulp away); weight error: --quantization fp8 %.4f, transformers %.4f (relative RMS)\n",
      same_blocks, blocks, ulp_blocks, sqrt(err_ours / norm), sqrt(err_theirs / norm));
  EXPECT_MSG(same_blocks * 10 >= blocks * 9, "only %ld of %ld blocks identical", same_blocks,
             blocks);
  EXPECT(err_ours < err_theirs);
  weights_free(&w);
  weights_free(&w2);
  weights_free(&w3);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/ds_test_fp8_%d", (int)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
  if (system(cmd)) return 1;
  log_set_level(LOG_LEVEL_WARN);
  RUN(e4m3_codec);
  RUN(quantize_matches_reference_rule);
  RUN(dense_edge_blocks);
  RUN(vlm_sharded_squeezed);
  RUN(moe_fused_and_per_expert);
  RUN(next_fused_projections);
  RUN(quantization_at_load);
  RUN(dummy_load_format);
  RUN(refusals);
  RUN(fixture_quantization_matches_transformers);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (!test_failed_total && system(cmd)) return 1;
  TEST_MAIN_END();
}
