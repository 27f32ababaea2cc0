/* weights — maps a Hugging Face model folder onto model_weights (see weights.h).
 *
 *   dir/model.safetensors                      one file
 *   dir/model.safetensors.index.json           {"weight_map": {name: shard file}}
 *       dir/model-00001-of-0000N.safetensors   shards, each mmapped once
 *
 * Every shard's tensors go into one name index (sorted, binary-searched). Names are looked up
 * under the text prefix of the checkpoint ("model.language_model." for the VLM files,
 * "model." otherwise), the MTP head under "mtp." when asked; the vision tower is never read.
 * Views point into the mappings; the only copies are the regrouped Qwen3-Next projections,
 * owned by the store. */
#include "model/weights.h"

#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "model/fp8.h"
#include "model/gen_random.h"
#include "model/safetensors.h"

int64_t tensor_numel(const tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

float tensor_get_f32(const tensor *t, int64_t i) {
  const char *p = (const char *)t->data + (size_t)i * dtype_size(t->dt);
  switch (t->dt) {
    case DTYPE_F32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    case DTYPE_F16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return dtype_f16_to_f32(h);
    }
    case DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return dtype_bf16_to_f32(h);
    }
    case DTYPE_F8_E4M3: {
      int64_t cols = t->shape[t->ndim - 1], r = i / cols, k = i % cols;
      float s;
      memcpy(&s,
             (const char *)t->scale +
                 (size_t)((t->row0 + r) / t->block_n * t->scale_cols + k / t->block_k) * 4,
             4);
      return dtype_e4m3_to_f32(*(const uint8_t *)p) * s;
    }
  }
  return 0.0f;
}

/* ---- the store ---------------------------------------------------------------------------- */

typedef struct weights_entry {
  const char *name; /* borrowed from the st_file */
  const st_tensor *t;
  int file;
} weights_entry;

struct weights_store {
  st_file **files; /* [n_files] owner of the mappings */
  int n_files;
  weights_entry *idx; /* [n_idx] sorted by name */
  size_t n_idx;
  json_t *weight_map; /* the index's weight_map, or NULL (single file) */
  char index_path[1024];
  void **owned; /* regrouped copies and expert arrays */
  int n_owned, cap_owned;
};

static void weights_store_free(struct weights_store *s) {
  if (!s) return;
  for (int i = 0; i < s->n_files; i++) st_close(s->files[i]);
  free(s->files);
  free(s->idx);
  json_decref(s->weight_map);
  for (int i = 0; i < s->n_owned; i++) free(s->owned[i]);
  free(s->owned);
  free(s);
}

/* Allocates n bytes owned by the store, or NULL. */
static void *weights_own(struct weights_store *s, size_t n) {
  if (s->n_owned == s->cap_owned) {
    int nc = s->cap_owned ? 2 * s->cap_owned : 64;
    void **no = realloc(s->owned, (size_t)nc * sizeof *no);
    if (!no) return NULL;
    s->owned = no;
    s->cap_owned = nc;
  }
  void *p = calloc(1, n ? n : 1);
  if (p) s->owned[s->n_owned++] = p;
  return p;
}

static int weights_cmp_entry(const void *a, const void *b) {
  return strcmp(((const weights_entry *)a)->name, ((const weights_entry *)b)->name);
}

static int weights_add_file(struct weights_store *s, const char *path, char *err, size_t errlen) {
  st_file *f;
  if (st_open(path, &f, err, errlen) != 0) return -1;
  st_file **nf = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *nf);
  if (!nf) {
    st_close(f);
    return errf(err, errlen, "%s: out of memory", path);
  }
  s->files = nf;
  s->files[s->n_files++] = f;
  return 0;
}

static int weights_build_index(struct weights_store *s, char *err, size_t errlen) {
  size_t n = 0;
  for (int i = 0; i < s->n_files; i++) n += (size_t)st_n_tensors(s->files[i]);
  s->idx = calloc(n ? n : 1, sizeof *s->idx);
  if (!s->idx) return errf(err, errlen, "out of memory indexing tensors");
  for (int i = 0; i < s->n_files; i++)
    for (int k = 0; k < st_n_tensors(s->files[i]); k++) {
      const st_tensor *t = st_tensor_at(s->files[i], k);
      s->idx[s->n_idx++] = (weights_entry){t->name, t, i};
    }
  qsort(s->idx, s->n_idx, sizeof *s->idx, weights_cmp_entry);
  for (size_t i = 1; i < s->n_idx; i++)
    if (!strcmp(s->idx[i].name, s->idx[i - 1].name))
      return errf(err, errlen, "tensor %s appears in both %s and %s", s->idx[i].name,
                  st_path(s->files[s->idx[i - 1].file]), st_path(s->files[s->idx[i].file]));
  return 0;
}

static const weights_entry *weights_find(const struct weights_store *s, const char *name) {
  weights_entry key = {.name = name};
  return bsearch(&key, s->idx, s->n_idx, sizeof *s->idx, weights_cmp_entry);
}

static int weights_open_dir(struct weights_store *s, const char *dir, char *err, size_t errlen) {
  char path[1200];
  struct stat sb;
  snprintf(s->index_path, sizeof s->index_path, "%s/model.safetensors.index.json", dir);
  if (stat(s->index_path, &sb) == 0) {
    json_error_t je;
    json_t *root = json_load_file(s->index_path, 0, &je);
    if (!root)
      return errf(err, errlen, "%s: invalid JSON at line %d: %s", s->index_path, je.line, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
      json_decref(root);
      return errf(err, errlen, "%s: missing \"weight_map\" object", s->index_path);
    }
    s->weight_map = json_incref(wm);
    json_decref(root);
    /* open each distinct shard once, in order of first mention */
    const char **shards = calloc(json_object_size(wm) + 1, sizeof *shards);
    if (!shards) return errf(err, errlen, "%s: out of memory", s->index_path);
    int n_shards = 0, rc = 0;
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
      const char *sh = json_string_value(v);
      if (!sh || !*sh || strchr(sh, '/')) {
        rc = errf(err, errlen, "%s: weight_map entry for %s is not a file name in the folder",
                  s->index_path, name);
        break;
      }
      int seen = 0;
      for (int i = 0; i < n_shards && !seen; i++) seen = !strcmp(shards[i], sh);
      if (!seen) shards[n_shards++] = sh;
    }
    for (int i = 0; i < n_shards && rc == 0; i++) {
      snprintf(path, sizeof path, "%s/%s", dir, shards[i]);
      rc = weights_add_file(s, path, err, errlen);
    }
    free(shards);
    if (rc) return -1;
    if (n_shards == 0) return errf(err, errlen, "%s: weight_map is empty", s->index_path);
  } else {
    s->index_path[0] = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &sb) != 0)
      return errf(err, errlen,
                  "%s: no model.safetensors or model.safetensors.index.json in the folder", dir);
    if (weights_add_file(s, path, err, errlen)) return -1;
  }
  return weights_build_index(s, err, errlen);
}

/* ---- lookups ---------------------------------------------------------------------------- */

typedef struct weights_ctx {
  struct weights_store *s;
  const model_config *c;
  const char *dir;
  const char *prefix;    /* "model." or "model.language_model." */
  json_t *not_converted; /* quantization_config.modules_to_not_convert, or NULL */
  int fp8_bn, fp8_bk;    /* the blocks of F8_E4M3 tensors: the config's, or the dummy's */
  double bytes[DTYPE_F8_E4M3 + 1], scale_bytes; /* of the tensors read, by stored dtype */
  char *err;
  size_t errlen;
} weights_ctx;

static void weights_fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* Where a missing tensor should have been, for the error line. */
static int weights_missing(weights_ctx *x, const char *name) {
  struct weights_store *s = x->s;
  if (!s->weight_map)
    return errf(x->err, x->errlen, "%s: missing tensor %s", st_path(s->files[0]), name);
  const char *sh = json_string_value(json_object_get(s->weight_map, name));
  if (sh)
    return errf(x->err, x->errlen,
                "%s/%s: missing tensor %s (listed in model.safetensors.index.json)", x->dir, sh,
                name);
  return errf(x->err, x->errlen, "%s: missing tensor %s", s->index_path, name);
}

/* The scale tensor of weight `name` (X.weight -> X.weight_scale_inv; a fused expert tensor
 * X -> X_scale_inv or X_scales_inv, as transformers names them), or NULL; its name in sn. */
static const weights_entry *weights_scale_entry(weights_ctx *x, const char *name, char *sn,
                                                size_t n) {
  size_t len = strlen(name);
  if (len > 7 && !strcmp(name + len - 7, ".weight")) {
    snprintf(sn, n, "%s_scale_inv", name);
    return weights_find(x->s, sn);
  }
  char alt[600];
  snprintf(alt, sizeof alt, "%s_scales_inv", name);
  const weights_entry *e = weights_find(x->s, alt);
  snprintf(sn, n, "%s_scale_inv", name);
  if (e) return e;
  return weights_find(x->s, sn);
}

/* 1 when quantization_config.modules_to_not_convert lists module `mod` (the tensor name less
 * ".weight"): an entry equal to it, a dot-bounded prefix or suffix of it ("lm_head",
 * "mlp.gate"), or a glob over it ("model.layers.*.mlp.gate"); the entry in *which. */
static int weights_not_converted(const weights_ctx *x, const char *mod, const char **which) {
  if (!x->not_converted) return 0;
  size_t ml = strlen(mod);
  for (size_t i = 0; i < json_array_size(x->not_converted); i++) {
    const char *e = json_string_value(json_array_get(x->not_converted, i));
    if (!e || !*e) continue;
    size_t el = strlen(e);
    int hit = !strcmp(mod, e) || (ml > el && !strncmp(mod, e, el) && mod[el] == '.') ||
              (ml > el && !strcmp(mod + ml - el, e) && mod[ml - el - 1] == '.') ||
              (strchr(e, '*') && fnmatch(e, mod, 0) == 0);
    if (hit) {
      *which = e;
      return 1;
    }
  }
  return 0;
}

/* For an F8_E4M3 tensor: finds and checks its scales and fills out's fp8 fields. For any
 * other dtype: refuses a stray scale tensor. Returns 0, or -1 with err. */
static int weights_fp8_attach(weights_ctx *x, const char *name, const char *file,
                              const st_tensor *t, tensor *out) {
  char sn[600], mod[600];
  const weights_entry *se = weights_scale_entry(x, name, sn, sizeof sn);
  if (t->dt != DTYPE_F8_E4M3) {
    if (se)
      return errf(x->err, x->errlen,
                  "%s: tensor %s is stored %s but has a scale tensor %s (FP8 weights are stored "
                  "F8_E4M3)",
                  file, name, t->dtype_str, se->name);
    return 0;
  }
  if (x->fp8_bn <= 0)
    return errf(x->err, x->errlen,
                "%s: tensor %s is stored F8_E4M3 but config.json has no fp8 quantization_config "
                "(weight_block_size)",
                file, name);
  if (!se)
    return errf(x->err, x->errlen, "%s: tensor %s is stored F8_E4M3 without its scales %s", file,
                name, sn);
  if (!se->t->is_float || se->t->dt != DTYPE_F32)
    return errf(x->err, x->errlen, "%s: scale tensor %s has dtype %s; expected F32",
                st_path(x->s->files[se->file]), se->name, se->t->dtype_str);
  const int bn = x->fp8_bn, bk = x->fp8_bk, nd = t->ndim;
  const int64_t lead = nd == 3 ? t->shape[0] : 1, sr = fp8_scale_rows(t->shape[nd - 2], bn),
                sc = fp8_scale_cols(t->shape[nd - 1], bk);
  int64_t n = 1;
  for (int i = 0; i < se->t->ndim; i++) n *= se->t->shape[i];
  if (n != lead * sr * sc) {
    char a[128];
    weights_fmt_shape(a, sizeof a, se->t->ndim, se->t->shape);
    return errf(x->err, x->errlen,
                "%s: scale tensor %s has shape %s; weight_block_size [%d, %d] over %s [%lld, %lld] "
                "needs %lld x %lld scales",
                st_path(x->s->files[se->file]), se->name, a, bn, bk, name,
                (long long)t->shape[nd - 2], (long long)t->shape[nd - 1], (long long)(lead * sr),
                (long long)sc);
  }
  snprintf(mod, sizeof mod, "%s", name);
  size_t ml = strlen(mod);
  if (ml > 7 && !strcmp(mod + ml - 7, ".weight")) mod[ml - 7] = 0;
  const char *which = NULL;
  if (weights_not_converted(x, mod, &which))
    return errf(x->err, x->errlen,
                "%s: tensor %s is stored F8_E4M3 but quantization_config.modules_to_not_convert "
                "lists \"%s\"",
                file, name, which);
  out->scale = se->t->data;
  out->scale_cols = sc;
  out->block_n = bn;
  out->block_k = bk;
  x->scale_bytes += (double)se->t->nbytes;
  return 0;
}

/* Looks `name` up: 1 and a view in *out when found with a float dtype and the expected shape,
 * 0 when absent and `optional`, -1 with err otherwise. The shape may carry extra 1-sized
 * middle dimensions in the file (conv1d [C, 1, K] for an expected [C, K]). */
static int weights_get(weights_ctx *x, const char *name, int optional, int ndim,
                       const int64_t *shape, tensor *out) {
  const weights_entry *e = weights_find(x->s, name);
  if (!e) {
    if (optional) return 0;
    return weights_missing(x, name);
  }
  const st_tensor *t = e->t;
  const char *file = st_path(x->s->files[e->file]);
  if (!t->is_float)
    return errf(x->err, x->errlen,
                "%s: tensor %s has dtype %s; expected BF16, F16, F32 or F8_E4M3 (block-wise FP8)",
                file, name, t->dtype_str);
  if (t->dt == DTYPE_F8_E4M3 && (ndim < 2 || t->ndim != ndim))
    return errf(x->err, x->errlen,
                "%s: tensor %s is stored F8_E4M3; FP8 is read for weight matrices only", file,
                name);
  /* compare shapes ignoring size-1 dimensions that the expected shape lacks */
  int64_t got[ST_MAX_DIMS];
  int gn = 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != 1 || t->ndim == ndim) got[gn++] = t->shape[i];
  int ok = gn == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = got[i] == shape[i];
  if (!ok) {
    char a[128], b[128];
    weights_fmt_shape(a, sizeof a, t->ndim, t->shape);
    weights_fmt_shape(b, sizeof b, ndim, shape);
    return errf(x->err, x->errlen, "%s: tensor %s has shape %s, expected %s", file, name, a, b);
  }
  memset(out, 0, sizeof *out);
  out->data = t->data;
  out->dt = t->dt;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
  if (weights_fp8_attach(x, name, file, t, out)) return -1;
  x->bytes[t->dt] += (double)t->nbytes;
  return 1;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* Required tensor `<prefix><suffix>` with the given shape. Returns 0 or -1. */
static int weights_req(weights_ctx *x, tensor *out, const char *suffix, int ndim,
                       const int64_t *shape) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", x->prefix, suffix);
  return weights_get(x, name, 0, ndim, shape, out) == 1 ? 0 : -1;
}
/* Optional: 1 found, 0 absent, -1 error. */
static int weights_opt(weights_ctx *x, tensor *out, const char *suffix, int ndim,
                       const int64_t *shape) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", x->prefix, suffix);
  return weights_get(x, name, 1, ndim, shape, out);
}
#define REQ(out, sfx, ...) weights_req(x, out, sfx, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__))
#define OPT(out, sfx, ...) weights_opt(x, out, sfx, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__))

/* Replaces the F8_E4M3 view *t [rows, cols] by an owned F32 copy, dequantized exactly (for
 * regrouping rows that cut through scale blocks). Returns 0, or -1 with err. */
static int weights_dequant_owned(weights_ctx *x, tensor *t) {
  if (t->dt != DTYPE_F8_E4M3) return 0;
  int64_t rows = t->shape[0], cols = t->shape[1];
  float *f = weights_own(x->s, (size_t)(rows * cols) * 4);
  if (!f) return errf(x->err, x->errlen, "out of memory dequantizing an fp8 tensor");
  fp8_dequantize(t, 0, rows, f);
  *t = (tensor){.data = f, .dt = DTYPE_F32, .ndim = 2, .shape = {rows, cols}};
  return 0;
}

/* Qwen3-Next: in_proj_qkvz [nk*(2dk + 2r*dv), H] and in_proj_ba [nk*2r, H], grouped per key
 * head g as [q_g | k_g | v_g (r*dv) | z_g (r*dv)] and [b_g (r) | a_g (r)], into owned
 * qkv [q all | k all | v all], z, b, a with value head g*r + j. */
static int weights_regroup_next(weights_ctx *x, const model_config *c, const tensor *qkvz,
                                const tensor *ba, layer_weights *L) {
  const int64_t H = c->hidden_size, nk = c->lin_n_k_heads, nv = c->lin_n_v_heads,
                dk = c->lin_k_head_dim, dv = c->lin_v_head_dim, r = nv / nk;
  size_t row1 = (size_t)H * dtype_size(qkvz->dt), row2 = (size_t)H * dtype_size(ba->dt);
  char *qkv = weights_own(x->s, (size_t)c->conv_dim * row1),
       *z = weights_own(x->s, (size_t)(nv * dv) * row1);
  char *b = weights_own(x->s, (size_t)nv * row2), *a = weights_own(x->s, (size_t)nv * row2);
  if (!qkv || !z || !b || !a)
    return errf(x->err, x->errlen, "out of memory regrouping in_proj_qkvz");
  const char *src = qkvz->data, *sba = ba->data;
  const int64_t grp = 2 * dk + 2 * r * dv;
  for (int64_t g = 0; g < nk; g++) {
    const char *base = src + (size_t)(g * grp) * row1;
    memcpy(qkv + (size_t)(g * dk) * row1, base, (size_t)dk * row1);
    memcpy(qkv + (size_t)(nk * dk + g * dk) * row1, base + (size_t)dk * row1, (size_t)dk * row1);
    memcpy(qkv + (size_t)(2 * nk * dk + g * r * dv) * row1, base + (size_t)(2 * dk) * row1,
           (size_t)(r * dv) * row1);
    memcpy(z + (size_t)(g * r * dv) * row1, base + (size_t)(2 * dk + r * dv) * row1,
           (size_t)(r * dv) * row1);
    const char *bb = sba + (size_t)(g * 2 * r) * row2;
    memcpy(b + (size_t)(g * r) * row2, bb, (size_t)r * row2);
    memcpy(a + (size_t)(g * r) * row2, bb + (size_t)r * row2, (size_t)r * row2);
  }
  L->in_proj_qkv = (tensor){.data = qkv, .dt = qkvz->dt, .ndim = 2, .shape = {c->conv_dim, H}};
  L->in_proj_z = (tensor){.data = z, .dt = qkvz->dt, .ndim = 2, .shape = {nv * dv, H}};
  L->in_proj_b = (tensor){.data = b, .dt = ba->dt, .ndim = 2, .shape = {nv, H}};
  L->in_proj_a = (tensor){.data = a, .dt = ba->dt, .ndim = 2, .shape = {nv, H}};
  return 0;
}

static int weights_linear_attn(weights_ctx *x, const model_config *c, int li, layer_weights *L) {
  const int64_t H = c->hidden_size, nk = c->lin_n_k_heads, nv = c->lin_n_v_heads,
                dk = c->lin_k_head_dim, dv = c->lin_v_head_dim, K = c->conv_kernel, C = c->conv_dim;
  char n[256];
#define P(s) (snprintf(n, sizeof n, "layers.%d.linear_attn.%s", li, s), n)
  int have = OPT(&L->in_proj_qkv, P("in_proj_qkv.weight"), C, H);
  if (have < 0) return -1;
  if (have) {
    if (REQ(&L->in_proj_z, P("in_proj_z.weight"), nv * dv, H) ||
        REQ(&L->in_proj_b, P("in_proj_b.weight"), nv, H) ||
        REQ(&L->in_proj_a, P("in_proj_a.weight"), nv, H))
      return -1;
  } else {
    tensor qkvz, ba;
    int hq = OPT(&qkvz, P("in_proj_qkvz.weight"), 2 * nk * dk + 2 * nv * dv, H);
    if (hq < 0) return -1;
    if (hq == 0) /* neither layout: name the one this architecture's checkpoints use */
      return c->arch == MODEL_ARCH_QWEN3_NEXT
                 ? REQ(&qkvz, P("in_proj_qkvz.weight"), 2 * nk * dk + 2 * nv * dv, H)
                 : REQ(&L->in_proj_qkv, P("in_proj_qkv.weight"), C, H);
    if (REQ(&ba, P("in_proj_ba.weight"), 2 * nv, H)) return -1;
    /* FP8 rows are regrouped as fp32 (the groups need not follow the scale blocks) */
    if (weights_dequant_owned(x, &qkvz) || weights_dequant_owned(x, &ba) ||
        weights_regroup_next(x, c, &qkvz, &ba, L))
      return -1;
  }
  if (REQ(&L->conv1d, P("conv1d.weight"), C, K) || REQ(&L->dt_bias, P("dt_bias"), nv) ||
      REQ(&L->A_log, P("A_log"), nv) || REQ(&L->lin_norm, P("norm.weight"), dv) ||
      REQ(&L->out_proj, P("out_proj.weight"), H, nv * dv))
    return -1;
#undef P
  return 0;
}

static int weights_attn(weights_ctx *x, const model_config *c, int li, layer_weights *L) {
  const int64_t H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
  char n[256];
#define P(s) (snprintf(n, sizeof n, "layers.%d.self_attn.%s", li, s), n)
  if (REQ(&L->q_proj, P("q_proj.weight"), nh * 2 * hd, H) ||
      REQ(&L->k_proj, P("k_proj.weight"), nkv * hd, H) ||
      REQ(&L->v_proj, P("v_proj.weight"), nkv * hd, H) ||
      REQ(&L->o_proj, P("o_proj.weight"), H, nh * hd) || REQ(&L->q_norm, P("q_norm.weight"), hd) ||
      REQ(&L->k_norm, P("k_norm.weight"), hd))
    return -1;
#undef P
  return 0;
}

/* A view of rows [row0, row0 + rows) of slab e of a 3-D tensor t [E, R, H] (an FP8 view
 * keeps slab e's scales and row0 in its block grid). */
static tensor weights_slab(const tensor *t, int64_t e, int64_t row0, int64_t rows) {
  size_t es = dtype_size(t->dt);
  const char *p =
      (const char *)t->data + ((size_t)(e * t->shape[1] + row0) * (size_t)t->shape[2]) * es;
  tensor v = {.data = p, .dt = t->dt, .ndim = 2, .shape = {rows, t->shape[2]}};
  if (t->dt == DTYPE_F8_E4M3) {
    int64_t sr = fp8_scale_rows(t->shape[1], t->block_n);
    v.scale = (const char *)t->scale + (size_t)(e * sr * t->scale_cols) * 4;
    v.scale_cols = t->scale_cols;
    v.block_n = t->block_n;
    v.block_k = t->block_k;
    v.row0 = row0;
  }
  return v;
}

static int weights_moe(weights_ctx *x, const model_config *c, int li, layer_weights *L) {
  const int64_t H = c->hidden_size, E = c->n_experts, I = c->moe_intermediate_size,
                Is = c->shared_expert_intermediate_size;
  char n[256];
#define P(s) (snprintf(n, sizeof n, "layers.%d.mlp.%s", li, s), n)
  if (REQ(&L->router, P("gate.weight"), E, H)) return -1;
  L->experts = weights_own(x->s, (size_t)E * sizeof *L->experts);
  if (!L->experts) return errf(x->err, x->errlen, "out of memory for %lld experts", (long long)E);
  tensor gu, dn;
  int fused = OPT(&gu, P("experts.gate_up_proj"), E, 2 * I, H);
  if (fused < 0) return -1;
  if (fused) {
    if (REQ(&dn, P("experts.down_proj"), E, H, I)) return -1;
    for (int64_t e = 0; e < E; e++) {
      L->experts[e].gate = weights_slab(&gu, e, 0, I);
      L->experts[e].up = weights_slab(&gu, e, I, I);
      L->experts[e].down = weights_slab(&dn, e, 0, H);
    }
  } else {
    char s[128];
    for (int64_t e = 0; e < E; e++) {
      expert_weights *w = &L->experts[e];
      snprintf(s, sizeof s, "experts.%lld.gate_proj.weight", (long long)e);
      if (e == 0) { /* neither layout at all: name the fused tensor transformers 5 saves */
        int h0 = OPT(&w->gate, P(s), I, H);
        if (h0 < 0) return -1;
        if (h0 == 0) return REQ(&gu, P("experts.gate_up_proj"), E, 2 * I, H);
      } else if (REQ(&w->gate, P(s), I, H)) {
        return -1;
      }
      snprintf(s, sizeof s, "experts.%lld.up_proj.weight", (long long)e);
      if (REQ(&w->up, P(s), I, H)) return -1;
      snprintf(s, sizeof s, "experts.%lld.down_proj.weight", (long long)e);
      if (REQ(&w->down, P(s), H, I)) return -1;
    }
  }
  if (Is > 0) {
    if (REQ(&L->shared_gate, P("shared_expert.gate_proj.weight"), Is, H) ||
        REQ(&L->shared_up, P("shared_expert.up_proj.weight"), Is, H) ||
        REQ(&L->shared_down, P("shared_expert.down_proj.weight"), H, Is) ||
        REQ(&L->shared_expert_gate, P("shared_expert_gate.weight"), 1, H))
      return -1;
  }
#undef P
  return 0;
}

static int weights_layer(weights_ctx *x, const model_config *c, int li, layer_weights *L) {
  const int64_t H = c->hidden_size, I = c->intermediate_size;
  char n[256];
#define P(s) (snprintf(n, sizeof n, "layers.%d.%s", li, s), n)
  if (REQ(&L->input_norm, P("input_layernorm.weight"), H) ||
      REQ(&L->post_norm, P("post_attention_layernorm.weight"), H))
    return -1;
  if (c->layer_types[li] == LAYER_KIND_FULL ? weights_attn(x, c, li, L)
                                            : weights_linear_attn(x, c, li, L))
    return -1;
  if (c->layer_is_moe[li]) return weights_moe(x, c, li, L);
  if (REQ(&L->gate_proj, P("mlp.gate_proj.weight"), I, H) ||
      REQ(&L->up_proj, P("mlp.up_proj.weight"), I, H) ||
      REQ(&L->down_proj, P("mlp.down_proj.weight"), H, I))
    return -1;
#undef P
  return 0;
}

/* The MTP head under "mtp." (the checkpoints keep it outside the text prefix): absent when the
 * config has no mtp layers or the files lack mtp.fc.weight (a checkpoint saved without it).
 * Its decoder layers are full attention; their FFN is MoE when the model's layer 0's is, as
 * vLLM builds them (layer index 0 from the name). Returns 0 or -1. */
static int weights_mtp(weights_ctx *x, const model_config *c, mtp_weights *m) {
  const int64_t H = c->hidden_size, I = c->intermediate_size;
  if (c->mtp_layers <= 0 || !weights_find(x->s, "mtp.fc.weight")) return 0;
  const char *saved = x->prefix;
  x->prefix = "mtp.";
  int rc = -1;
  m->layers = calloc((size_t)c->mtp_layers, sizeof *m->layers);
  if (!m->layers) {
    errf(x->err, x->errlen, "out of memory for the MTP layers");
    goto done;
  }
  m->n_layers = c->mtp_layers;
  if (REQ(&m->fc, "fc.weight", H, 2 * H) ||
      REQ(&m->pre_fc_norm_embedding, "pre_fc_norm_embedding.weight", H) ||
      REQ(&m->pre_fc_norm_hidden, "pre_fc_norm_hidden.weight", H) ||
      REQ(&m->norm, "norm.weight", H))
    goto done;
  for (int li = 0; li < m->n_layers; li++) {
    layer_weights *L = &m->layers[li];
    char n[256];
#define P(s) (snprintf(n, sizeof n, "layers.%d.%s", li, s), n)
    if (REQ(&L->input_norm, P("input_layernorm.weight"), H) ||
        REQ(&L->post_norm, P("post_attention_layernorm.weight"), H) || weights_attn(x, c, li, L))
      goto done;
    if (c->layer_is_moe[0] ? weights_moe(x, c, li, L)
                           : (REQ(&L->gate_proj, P("mlp.gate_proj.weight"), I, H) ||
                              REQ(&L->up_proj, P("mlp.up_proj.weight"), I, H) ||
                              REQ(&L->down_proj, P("mlp.down_proj.weight"), H, I)))
      goto done;
#undef P
  }
  rc = 0;
done:
  x->prefix = saved;
  return rc;
}

/* quantization_config.modules_to_not_convert of dir/config.json (top level or under
 * text_config): a new reference, or NULL. */
static json_t *weights_read_not_converted(const char *dir) {
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) return NULL;
  json_t *q = json_object_get(root, "quantization_config");
  if (!json_is_object(q))
    q = json_object_get(json_object_get(root, "text_config"), "quantization_config");
  json_t *l = json_is_object(q) ? json_object_get(q, "modules_to_not_convert") : NULL;
  json_t *r = json_is_array(l) ? json_incref(l) : NULL;
  json_decref(root);
  return r;
}

/* --load-format dummy: gen_random's tensors for c, written into an anonymous memory file
 * (no weight file on disk) and mapped like a checkpoint. With fp8 blocks (bn > 0) the product
 * weights are written F8_E4M3 with their scales, as an FP8 checkpoint holds them, so that the
 * memory file is never the BF16 model's size; their bytes are those weights_quantize would
 * make of the BF16 ones. */
static int weights_open_dummy(struct weights_store *s, const model_config *c, const weights_opts *o,
                              int bn, int bk, char *err, size_t errlen) {
  int fd = memfd_create("deltaserve-dummy-weights", MFD_CLOEXEC);
  if (fd < 0) return errf(err, errlen, "--load-format dummy: memfd_create: %s", strerror(errno));
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  gen_random_opts go = {.seed = o->seed,
                        .dt = DTYPE_BF16,
                        .experts = GEN_RANDOM_EXPERTS_PER_EXPERT,
                        .quiet = 1,
                        .fp8_block_n = bn,
                        .fp8_block_k = bk};
  int rc = gen_random_write_weights(c, path, &go, err, errlen);
  if (rc == 0) rc = weights_add_file(s, path, err, errlen);
  close(fd); /* the mapping keeps the memory file */
  if (rc) return -1;
  return weights_build_index(s, err, errlen);
}

/* b bytes as "1.234 GiB" or "5.67 MiB" into buf. */
static const char *weights_fmt_bytes(char *buf, size_t n, double b) {
  if (b >= 1073741824.0)
    snprintf(buf, n, "%.3f GiB", b / 1073741824.0);
  else
    snprintf(buf, n, "%.2f MiB", b / 1048576.0);
  return buf;
}

/* ---- quantization at load (--quantization fp8) -------------------------------------------- */

typedef struct weights_qjob {
  tensor **ts;  /* [n] views to quantize, replaced in place */
  uint8_t **qs; /* [n] owned outputs */
  float **ss;
  int n, bn, bk;
  atomic_int next, failed;
} weights_qjob;

static void *weights_qworker(void *arg) {
  weights_qjob *j = arg;
  for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;)
    if (fp8_quantize(j->ts[i], j->bn, j->bk, j->qs[i], j->ss[i])) atomic_store(&j->failed, 1);
  return NULL;
}

/* Appends every product weight of w (the matrices an FP8 checkpoint stores as FP8: not the
 * embeddings, lm_head, norms, conv1d, in_proj_a / in_proj_b, the router, shared_expert_gate)
 * that is not FP8 yet to ts (NULL: counts only). Returns the count. */
static int weights_products(const model_config *c, model_weights *w, tensor **ts) {
  int n = 0;
  for (int i = 0; i < c->n_layers; i++) {
    layer_weights *L = &w->layers[i];
    tensor *all[] = {&L->q_proj,      &L->k_proj,    &L->v_proj,     &L->o_proj,  &L->in_proj_qkv,
                     &L->in_proj_z,   &L->out_proj,  &L->gate_proj,  &L->up_proj, &L->down_proj,
                     &L->shared_gate, &L->shared_up, &L->shared_down};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
      if (all[k]->data && all[k]->dt != DTYPE_F8_E4M3 && all[k]->ndim == 2) {
        if (ts) ts[n] = all[k];
        n++;
      }
    if (L->experts && c->layer_is_moe[i])
      for (int e = 0; e < c->n_experts; e++) {
        tensor *ex[] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
        for (int k = 0; k < 3; k++)
          if (ex[k]->data && ex[k]->dt != DTYPE_F8_E4M3) {
            if (ts) ts[n] = ex[k];
            n++;
          }
      }
  }
  return n;
}

/* Quantizes the product weights that are not FP8 into owned bn x bk-block e4m3 views, on one
 * thread per online CPU. Returns 0, or -1 with err (out of memory). */
static int weights_quantize(weights_ctx *x, const model_config *c, model_weights *w, int bn,
                            int bk) {
  int n = weights_products(c, w, NULL), rc = -1;
  if (n == 0) return 0; /* an FP8 checkpoint, or a dummy model written FP8 */
  weights_qjob j = {.n = n, .bn = bn, .bk = bk};
  j.ts = calloc((size_t)n + 1, sizeof *j.ts);
  j.qs = calloc((size_t)n + 1, sizeof *j.qs);
  j.ss = calloc((size_t)n + 1, sizeof *j.ss);
  double before = 0, after = 0;
  if (!j.ts || !j.qs || !j.ss) goto oom;
  weights_products(c, w, j.ts);
  for (int i = 0; i < n; i++) {
    const tensor *t = j.ts[i];
    int64_t rows = t->shape[0], cols = t->shape[1];
    size_t ns = (size_t)(fp8_scale_rows(rows, bn) * fp8_scale_cols(cols, bk));
    j.qs[i] = weights_own(x->s, (size_t)(rows * cols));
    j.ss[i] = weights_own(x->s, ns * 4);
    if (!j.qs[i] || !j.ss[i]) goto oom;
    before += (double)(rows * cols) * (double)dtype_size(t->dt);
    after += (double)(rows * cols) + 4.0 * (double)ns;
  }
  atomic_init(&j.next, 0);
  atomic_init(&j.failed, 0);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu, started = 0;
  if (nt > n) nt = n;
  pthread_t th[64];
  for (int i = 0; i < nt; i++)
    if (pthread_create(&th[started], NULL, weights_qworker, &j) == 0) started++;
  weights_qworker(&j);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (atomic_load(&j.failed)) goto oom;
  for (int i = 0; i < n; i++)
    *j.ts[i] = fp8_view(j.qs[i], j.ss[i], j.ts[i]->shape[0], j.ts[i]->shape[1], bn, bk);
  char a[32], b[32];
  log_info(
      "weights: %d product weights quantized to F8_E4M3 in %d x %d blocks at load: %s -> %s "
      "with scales",
      n, bn, bk, weights_fmt_bytes(a, sizeof a, before), weights_fmt_bytes(b, sizeof b, after));
  rc = 0;
  goto done;
oom:
  errf(x->err, x->errlen, "out of memory quantizing weights to fp8");
done:
  free(j.ts);
  free(j.qs);
  free(j.ss);
  return rc;
}

/* Start-up line: the bytes of the tensors read, by their stored dtype. */
static void weights_log_bytes(const weights_ctx *x, const weights_opts *o) {
  char line[512];
  size_t k = 0;
  static const dtype order[] = {DTYPE_F8_E4M3, DTYPE_BF16, DTYPE_F16, DTYPE_F32};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    double b = x->bytes[order[i]];
    if (b <= 0 || k >= sizeof line) continue;
    char a[32];
    k += (size_t)snprintf(line + k, sizeof line - k, "%s%s %s", k ? ", " : "",
                          st_dtype_str(order[i]), weights_fmt_bytes(a, sizeof a, b));
    if (order[i] == DTYPE_F8_E4M3 && k < sizeof line)
      k += (size_t)snprintf(line + k, sizeof line - k, " (+ F32 block scales %s)",
                            weights_fmt_bytes(a, sizeof a, x->scale_bytes));
  }
  log_info("weights: %s%s", k ? line : "none",
           o->dummy ? " (--load-format dummy: random values, no weight files)" : "");
}

int weights_load_with(const char *dir, const model_config *c, const weights_opts *o,
                      model_weights *w, char *err, size_t errlen) {
  static const weights_opts none;
  if (!o) o = &none;
  memset(w, 0, sizeof *w);
  weights_ctx xc = {.c = c,
                    .dir = dir,
                    .prefix = "model.",
                    .fp8_bn = c->fp8_block_n,
                    .fp8_bk = c->fp8_block_k,
                    .err = err,
                    .errlen = errlen},
              *x = &xc;
  struct weights_store *s = calloc(1, sizeof *s);
  if (!s) return errf(err, errlen, "%s: out of memory", dir);
  w->store = s;
  xc.s = s;
  /* the blocks of quantization at load: an fp8 config's (what its checkpoint would hold),
   * else 128 x 128 for --quantization fp8 */
  const int qbn = c->fp8_block_n > 0 ? c->fp8_block_n : 128,
            qbk = c->fp8_block_n > 0 ? c->fp8_block_k : 128;
  /* a dummy model of an FP8 config is FP8 as the checkpoint would be */
  const int want_fp8 = o->quantize_fp8 || (o->dummy && c->fp8_block_n > 0);
  if (o->dummy && want_fp8) {
    xc.fp8_bn = qbn;
    xc.fp8_bk = qbk;
  }
  if (o->dummy ? weights_open_dummy(s, c, o, want_fp8 ? qbn : 0, qbk, err, errlen)
               : weights_open_dir(s, dir, err, errlen))
    goto fail;
  if (!o->dummy) xc.not_converted = weights_read_not_converted(dir);
  if (weights_find(s, "model.language_model.embed_tokens.weight"))
    xc.prefix = "model.language_model.";
  const int64_t V = c->vocab_size, H = c->hidden_size;
  if (REQ(&w->embed, "embed_tokens.weight", V, H) || REQ(&w->final_norm, "norm.weight", H))
    goto fail;
  if (c->tie_word_embeddings) {
    w->lm_head = w->embed;
  } else if (weights_get(x, "lm_head.weight", 0, 2, SHAPE(V, H), &w->lm_head) != 1) {
    goto fail;
  }
  w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
  if (!w->layers) {
    errf(err, errlen, "%s: out of memory", dir);
    goto fail;
  }
  for (int i = 0; i < c->n_layers; i++)
    if (weights_layer(x, c, i, &w->layers[i])) goto fail;
  if (o->mtp && weights_mtp(x, c, &w->mtp)) goto fail;
  weights_log_bytes(x, o);
  if (want_fp8 && weights_quantize(x, c, w, qbn, qbk)) goto fail;
  json_decref(xc.not_converted);
  return 0;
fail:
  json_decref(xc.not_converted);
  weights_free(w);
  return -1;
}

int weights_load(const char *dir, const model_config *c, model_weights *w, char *err,
                 size_t errlen) {
  return weights_load_with(dir, c, NULL, w, err, errlen);
}

void weights_free(model_weights *w) {
  if (!w) return;
  weights_store_free(w->store);
  free(w->layers);
  free(w->mtp.layers);
  memset(w, 0, sizeof *w);
}

const void *weights_raw(const model_weights *w, const char *name, uint64_t *nbytes) {
  if (!w->store) return NULL;
  const weights_entry *e = weights_find(w->store, name);
  if (!e) return NULL;
  if (nbytes) *nbytes = e->t->nbytes;
  return e->t->data;
}

int model_check_path(const char *path, char *err, size_t errlen) {
  struct stat sb;
  if (stat(path, &sb) != 0 || S_ISDIR(sb.st_mode)) return 0; /* config.json's error names it */
  char magic[4] = {0};
  FILE *f = fopen(path, "rb");
  if (f) {
    if (fread(magic, 1, 4, f) != 4) magic[0] = 0;
    fclose(f);
  }
  size_t n = strlen(path);
  if ((n > 5 && !strcasecmp(path + n - 5, ".gguf")) || !memcmp(magic, "GGUF", 4))
    return errf(err, errlen,
                "%s: a GGUF file is not supported: deltaserve loads a Hugging Face model folder "
                "(config.json + safetensors)",
                path);
  return errf(err, errlen, "%s: not a folder (a model is a folder with config.json + safetensors)",
              path);
}

int model_load_with(const char *dir, const weights_opts *o, model_config *c, model_weights *w,
                    char *err, size_t errlen) {
  char path[1200];
  memset(w, 0, sizeof *w);
  if (model_check_path(dir, err, errlen)) return -1;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (config_load(path, c, err, errlen)) return -1;
  return weights_load_with(dir, c, o, w, err, errlen);
}

int model_load(const char *dir, model_config *c, model_weights *w, char *err, size_t errlen) {
  return model_load_with(dir, NULL, c, w, err, errlen);
}
