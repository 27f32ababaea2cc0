/* weights — maps a Hugging Face model folder onto model_weights (see weights.h).
 *
 *   dir/model.safetensors                      one file
 *   dir/model.safetensors.index.json           {"weight_map": {name: shard file}}
 *       dir/model-00001-of-0000N.safetensors   shards, each mmapped once
 *
 * Every shard's tensors go into one name index (sorted, binary-searched). Names are looked up
 * under the text prefix of the checkpoint ("model.language_model." for the VLM files,
 * "model." otherwise); everything else in the files (vision tower, MTP head) is never read.
 * Views point into the mappings; the only copies are the regrouped Qwen3-Next projections,
 * owned by the store. */
#include "model/weights.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
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
  const char *dir;
  const char *prefix; /* "model." or "model.language_model." */
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
    return errf(x->err, x->errlen, "%s: tensor %s has dtype %s; expected BF16, F16 or F32", file,
                name, t->dtype_str);
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
    if (weights_regroup_next(x, c, &qkvz, &ba, L)) return -1;
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

/* A view of rows [row0, row0 + rows) of slab e of a 3-D tensor t [E, R, H]. */
static tensor weights_slab(const tensor *t, int64_t e, int64_t row0, int64_t rows) {
  size_t es = dtype_size(t->dt);
  const char *p =
      (const char *)t->data + ((size_t)(e * t->shape[1] + row0) * (size_t)t->shape[2]) * es;
  return (tensor){.data = p, .dt = t->dt, .ndim = 2, .shape = {rows, t->shape[2]}};
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

int weights_load(const char *dir, const model_config *c, model_weights *w, char *err,
                 size_t errlen) {
  memset(w, 0, sizeof *w);
  struct weights_store *s = calloc(1, sizeof *s);
  if (!s) return errf(err, errlen, "%s: out of memory", dir);
  w->store = s;
  if (weights_open_dir(s, dir, err, errlen)) goto fail;
  weights_ctx xc = {.s = s, .dir = dir, .prefix = "model.", .err = err, .errlen = errlen}, *x = &xc;
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
  return 0;
fail:
  weights_free(w);
  return -1;
}

void weights_free(model_weights *w) {
  if (!w) return;
  weights_store_free(w->store);
  free(w->layers);
  memset(w, 0, sizeof *w);
}

const void *weights_raw(const model_weights *w, const char *name, uint64_t *nbytes) {
  if (!w->store) return NULL;
  const weights_entry *e = weights_find(w->store, name);
  if (!e) return NULL;
  if (nbytes) *nbytes = e->t->nbytes;
  return e->t->data;
}

int model_load(const char *dir, model_config *c, model_weights *w, char *err, size_t errlen) {
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  memset(w, 0, sizeof *w);
  if (config_load(path, c, err, errlen)) return -1;
  return weights_load(dir, c, w, err, errlen);
}
