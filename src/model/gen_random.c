/* gen_random — random-weight model folders; see gen_random.h. */
#include "model/gen_random.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "model/fp8.h"
#include "model/safetensors.h"

typedef enum {
  GEN_KIND_MAT,   /* uniform, std 0.02 */
  GEN_KIND_PROD,  /* as GEN_KIND_MAT; a product weight (F8_E4M3 when gen_random_opts asks) */
  GEN_KIND_SCALE, /* the weight_scale_inv of the F8_E4M3 tensor seed id `of`, written with it */
  GEN_KIND_NORM0, /* U(-0.1, 0.1) */
  GEN_KIND_NORM1, /* 1 + U(-0.1, 0.1) */
  GEN_KIND_ALOG,  /* log(U(1, 16)) */
  GEN_KIND_DT,    /* 1 + U(-0.1, 0.1) */
  GEN_KIND_CONV,  /* uniform, std 0.2 */
} gen_kind;

typedef struct gen_spec {
  char name[192];
  dtype dt;
  int ndim;
  int64_t shape[4];
  gen_kind kind;
  int64_t numel;
  int seed_id;          /* its values' stream: its index in the plan as written without FP8 */
  int of;               /* GEN_KIND_SCALE: its weight's seed_id */
  int scale_idx;        /* F8_E4M3: the index of its scale tensor in the file */
  int64_t rows_per_job; /* F8_E4M3: whole row blocks, each job starting on a chunk */
  int64_t n_jobs;
} gen_spec;

typedef struct gen_list {
  gen_spec *v;
  int n, cap;
} gen_list;

static int gen_add(gen_list *l, gen_kind kind, dtype dt, int ndim, const int64_t *shape,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int gen_add(gen_list *l, gen_kind kind, dtype dt, int ndim, const int64_t *shape,
                   const char *fmt, ...) {
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 256;
    gen_spec *nv = realloc(l->v, (size_t)nc * sizeof *nv);
    if (!nv) return -1;
    l->v = nv;
    l->cap = nc;
  }
  gen_spec *s = &l->v[l->n++];
  memset(s, 0, sizeof *s);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->name, sizeof s->name, fmt, ap);
  va_end(ap);
  s->dt = dt;
  s->kind = kind;
  s->ndim = ndim;
  s->numel = 1;
  for (int i = 0; i < ndim; i++) {
    s->shape[i] = shape[i];
    s->numel *= shape[i];
  }
  return 0;
}

#define S(...) \
  (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), ((const int64_t[]){__VA_ARGS__})

/* The tensors of decoder layer i under prefix p (full attention or DeltaNet; MoE or dense FFN).
 * Returns 0, or nonzero when out of memory. */
static int gen_layer(const model_config *c, const gen_random_opts *o, gen_list *l, const char *p,
                     int i, int full, int moe) {
  const int64_t H = c->hidden_size, I = c->intermediate_size, nh = c->n_heads, nkv = c->n_kv_heads,
                hd = c->head_dim, nk = c->lin_n_k_heads, nv = c->lin_n_v_heads,
                dk = c->lin_k_head_dim, dv = c->lin_v_head_dim, K = c->conv_kernel, C = c->conv_dim,
                E = c->n_experts, mI = c->moe_intermediate_size,
                sI = c->shared_expert_intermediate_size;
  dtype dt = o->dt;
  /* the decoder's products, as weights.c's weights_products quantizes them (not the MTP
   * head's) */
  const gen_kind PK = strcmp(p, "mtp.") ? GEN_KIND_PROD : GEN_KIND_MAT;
  int rc = 0;
  rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "%slayers.%d.input_layernorm.weight", p, i);
  rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "%slayers.%d.post_attention_layernorm.weight", p, i);
  if (full) {
    rc |= gen_add(l, PK, dt, S(nh * 2 * hd, H), "%slayers.%d.self_attn.q_proj.weight", p, i);
    rc |= gen_add(l, PK, dt, S(nkv * hd, H), "%slayers.%d.self_attn.k_proj.weight", p, i);
    rc |= gen_add(l, PK, dt, S(nkv * hd, H), "%slayers.%d.self_attn.v_proj.weight", p, i);
    rc |= gen_add(l, PK, dt, S(H, nh * hd), "%slayers.%d.self_attn.o_proj.weight", p, i);
    rc |= gen_add(l, GEN_KIND_NORM0, dt, S(hd), "%slayers.%d.self_attn.q_norm.weight", p, i);
    rc |= gen_add(l, GEN_KIND_NORM0, dt, S(hd), "%slayers.%d.self_attn.k_norm.weight", p, i);
  } else {
    if (o->next_fused) {
      rc |= gen_add(l, GEN_KIND_MAT, dt, S(2 * nk * dk + 2 * nv * dv, H),
                    "%slayers.%d.linear_attn.in_proj_qkvz.weight", p, i);
      rc |= gen_add(l, GEN_KIND_MAT, dt, S(2 * nv, H), "%slayers.%d.linear_attn.in_proj_ba.weight",
                    p, i);
    } else {
      rc |= gen_add(l, PK, dt, S(C, H), "%slayers.%d.linear_attn.in_proj_qkv.weight", p, i);
      rc |= gen_add(l, PK, dt, S(nv * dv, H), "%slayers.%d.linear_attn.in_proj_z.weight", p, i);
      rc |=
          gen_add(l, GEN_KIND_MAT, dt, S(nv, H), "%slayers.%d.linear_attn.in_proj_b.weight", p, i);
      rc |=
          gen_add(l, GEN_KIND_MAT, dt, S(nv, H), "%slayers.%d.linear_attn.in_proj_a.weight", p, i);
    }
    rc |= gen_add(l, GEN_KIND_CONV, dt, S(C, 1, K), "%slayers.%d.linear_attn.conv1d.weight", p, i);
    rc |= gen_add(l, GEN_KIND_DT, dt, S(nv), "%slayers.%d.linear_attn.dt_bias", p, i);
    rc |= gen_add(l, GEN_KIND_ALOG, DTYPE_F32, S(nv), "%slayers.%d.linear_attn.A_log", p, i);
    rc |= gen_add(l, GEN_KIND_NORM1, DTYPE_F32, S(dv), "%slayers.%d.linear_attn.norm.weight", p, i);
    rc |= gen_add(l, PK, dt, S(H, nv * dv), "%slayers.%d.linear_attn.out_proj.weight", p, i);
  }
  if (moe) {
    rc |= gen_add(l, GEN_KIND_MAT, dt, S(E, H), "%slayers.%d.mlp.gate.weight", p, i);
    if (o->experts == GEN_RANDOM_EXPERTS_FUSED) {
      rc |= gen_add(l, GEN_KIND_MAT, dt, S(E, 2 * mI, H), "%slayers.%d.mlp.experts.gate_up_proj", p,
                    i);
      rc |= gen_add(l, GEN_KIND_MAT, dt, S(E, H, mI), "%slayers.%d.mlp.experts.down_proj", p, i);
    } else {
      for (int64_t e = 0; e < E; e++) {
        rc |= gen_add(l, PK, dt, S(mI, H), "%slayers.%d.mlp.experts.%lld.gate_proj.weight", p, i,
                      (long long)e);
        rc |= gen_add(l, PK, dt, S(mI, H), "%slayers.%d.mlp.experts.%lld.up_proj.weight", p, i,
                      (long long)e);
        rc |= gen_add(l, PK, dt, S(H, mI), "%slayers.%d.mlp.experts.%lld.down_proj.weight", p, i,
                      (long long)e);
      }
    }
    if (sI > 0) {
      rc |= gen_add(l, PK, dt, S(sI, H), "%slayers.%d.mlp.shared_expert.gate_proj.weight", p, i);
      rc |= gen_add(l, PK, dt, S(sI, H), "%slayers.%d.mlp.shared_expert.up_proj.weight", p, i);
      rc |= gen_add(l, PK, dt, S(H, sI), "%slayers.%d.mlp.shared_expert.down_proj.weight", p, i);
      rc |=
          gen_add(l, GEN_KIND_MAT, dt, S(1, H), "%slayers.%d.mlp.shared_expert_gate.weight", p, i);
    }
  } else {
    rc |= gen_add(l, PK, dt, S(I, H), "%slayers.%d.mlp.gate_proj.weight", p, i);
    rc |= gen_add(l, PK, dt, S(I, H), "%slayers.%d.mlp.up_proj.weight", p, i);
    rc |= gen_add(l, PK, dt, S(H, I), "%slayers.%d.mlp.down_proj.weight", p, i);
  }
  return rc;
}

/* The tensor list of config c in canonical order. Returns 0, or -1 when out of memory. */
static int gen_plan(const model_config *c, const gen_random_opts *o, gen_list *l) {
  const int64_t V = c->vocab_size, H = c->hidden_size;
  const char *p = o->vlm_prefix ? "model.language_model." : "model.";
  dtype dt = o->dt;
  int rc = gen_add(l, GEN_KIND_MAT, dt, S(V, H), "%sembed_tokens.weight", p);
  for (int i = 0; i < c->n_layers && rc == 0; i++)
    rc |= gen_layer(c, o, l, p, i, c->layer_types[i] == LAYER_KIND_FULL, c->layer_is_moe[i]);
  if (rc == 0) rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "%snorm.weight", p);
  if (rc == 0 && !c->tie_word_embeddings)
    rc |= gen_add(l, GEN_KIND_MAT, dt, S(V, H), "lm_head.weight");
  /* the MTP head last (earlier tensors keep their values), under "mtp." as the checkpoints
   * store it; its layers are full attention with layer 0's FFN kind (weights.h mtp_weights) */
  if (rc == 0 && c->mtp_layers > 0) {
    rc |= gen_add(l, GEN_KIND_MAT, dt, S(H, 2 * H), "mtp.fc.weight");
    rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "mtp.pre_fc_norm_embedding.weight");
    rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "mtp.pre_fc_norm_hidden.weight");
    for (int i = 0; i < c->mtp_layers && rc == 0; i++)
      rc |= gen_layer(c, o, l, "mtp.", i, 1, c->layer_is_moe[0]);
    if (rc == 0) rc |= gen_add(l, GEN_KIND_NORM0, dt, S(H), "mtp.norm.weight");
  }
  return rc ? -1 : 0;
}

/* ---- random numbers: splitmix64 seeding a xoshiro256** stream per chunk ------------------ */

static uint64_t gen_splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

typedef struct gen_rng {
  uint64_t s[4];
} gen_rng;

static inline uint64_t gen_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t gen_next(gen_rng *r) {
  uint64_t *s = r->s, out = gen_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = gen_rotl(s[3], 45);
  return out;
}

static void gen_seed(gen_rng *r, uint64_t seed, uint64_t tensor, uint64_t chunk) {
  uint64_t x = seed ^ (tensor * 0xd1b54a32d192ed03ULL) ^ (chunk * 0xabc98388fb8fac03ULL);
  for (int i = 0; i < 4; i++) r->s[i] = gen_splitmix(&x);
}

/* Uniform in [-1, 1). */
static inline float gen_sym(gen_rng *r) {
  return (float)(gen_next(r) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

static inline float gen_value(gen_rng *r, gen_kind k) {
  switch (k) {
    case GEN_KIND_MAT:
    case GEN_KIND_PROD:
      return 0.02f * 1.7320508f * gen_sym(r);
    case GEN_KIND_NORM0:
      return 0.1f * gen_sym(r);
    case GEN_KIND_NORM1:
    case GEN_KIND_DT:
      return 1.0f + 0.1f * gen_sym(r);
    case GEN_KIND_ALOG:
      return logf(1.0f + 7.5f * (gen_sym(r) + 1.0f));
    case GEN_KIND_CONV:
      return 0.2f * 1.7320508f * gen_sym(r);
    case GEN_KIND_SCALE:
      break;
  }
  return 0.0f;
}

/* dtype_bf16_to_f32(dtype_f32_to_bf16(v)) for a finite v, inlined (round to nearest even) */
static inline float gen_bf16_round(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&v, &u, 4);
  return v;
}

/* ---- workers ---------------------------------------------------------------------------- */

typedef struct gen_job {
  const gen_list *l;
  const int64_t *first_job; /* [n + 1] prefix sums of the tensors' job counts */
  int64_t n_jobs;
  uint64_t seed;
  dtype dt;   /* the values' dtype (an F8_E4M3 tensor quantizes values rounded to it) */
  int bn, bk; /* F8_E4M3 blocks */
  st_writer *w;
  atomic_llong next;
  atomic_int failed;
  pthread_mutex_t err_mu;
  char err[512];
} gen_job;

static void gen_fail(gen_job *j, const char *msg) {
  pthread_mutex_lock(&j->err_mu);
  if (!atomic_exchange(&j->failed, 1)) snprintf(j->err, sizeof j->err, "%s", msg);
  pthread_mutex_unlock(&j->err_mu);
}

/* Chunk `chunk` of tensor idx (not F8_E4M3) into buf (GEN_RANDOM_CHUNK * 4 bytes) and the
 * file. Returns 0, or -1 with err. */
static int gen_chunk(gen_job *j, int idx, int64_t chunk, void *buf, char *err, size_t errlen) {
  const gen_spec *s = &j->l->v[idx];
  int64_t e0 = chunk * GEN_RANDOM_CHUNK;
  int64_t n = s->numel - e0 < GEN_RANDOM_CHUNK ? s->numel - e0 : GEN_RANDOM_CHUNK;
  gen_rng r;
  gen_seed(&r, j->seed, (uint64_t)s->seed_id, (uint64_t)chunk);
  if (s->dt == DTYPE_F32) {
    float *f = buf;
    for (int64_t i = 0; i < n; i++) f[i] = gen_value(&r, s->kind);
  } else if (s->dt == DTYPE_BF16) {
    uint16_t *h = buf;
    if (s->kind == GEN_KIND_MAT || s->kind == GEN_KIND_PROD)
      for (int64_t i = 0; i < n; i++) h[i] = dtype_f32_to_bf16(0.02f * 1.7320508f * gen_sym(&r));
    else
      for (int64_t i = 0; i < n; i++) h[i] = dtype_f32_to_bf16(gen_value(&r, s->kind));
  } else {
    uint16_t *h = buf;
    for (int64_t i = 0; i < n; i++) h[i] = dtype_f32_to_f16(gen_value(&r, s->kind));
  }
  size_t es = dtype_size(s->dt);
  return st_writer_pwrite(j->w, idx, (uint64_t)e0 * es, buf, (size_t)n * es, err, errlen);
}

/* Job `job` of the F8_E4M3 tensor idx [rows, cols]: its row blocks, each made of the values
 * the `dt` tensor would hold there (the same streams) and quantized by fp8_quantize_rows, into
 * the file with their scales. f [bn * cols], q [bn * cols] and sv [ceil(cols / bk)] are the
 * caller's. Returns 0, or -1 with err. */
static int gen_fp8_job(gen_job *j, int idx, int64_t job, float *f, uint8_t *q, float *sv, char *err,
                       size_t errlen) {
  const gen_spec *s = &j->l->v[idx];
  const int64_t rows = s->shape[0], cols = s->shape[1], sc = fp8_scale_cols(cols, j->bk);
  const int64_t r0 = job * s->rows_per_job,
                r1 = r0 + s->rows_per_job < rows ? r0 + s->rows_per_job : rows;
  const float amp = 0.02f * 1.7320508f;
  gen_rng r;
  for (int64_t rb = r0; rb < r1; rb += j->bn) {
    const int64_t nr = rb + j->bn < r1 ? j->bn : r1 - rb, e0 = rb * cols, n = nr * cols;
    for (int64_t i = 0; i < n;) { /* the job starts on a chunk: every stream from its start */
      const int64_t e = e0 + i, in_chunk = e % GEN_RANDOM_CHUNK;
      if (in_chunk == 0)
        gen_seed(&r, j->seed, (uint64_t)s->seed_id, (uint64_t)(e / GEN_RANDOM_CHUNK));
      int64_t seg = GEN_RANDOM_CHUNK - in_chunk < n - i ? GEN_RANDOM_CHUNK - in_chunk : n - i;
      float *o = f + i;
      if (j->dt == DTYPE_BF16)
        for (int64_t k = 0; k < seg; k++) o[k] = gen_bf16_round(amp * gen_sym(&r));
      else if (j->dt == DTYPE_F16)
        for (int64_t k = 0; k < seg; k++)
          o[k] = dtype_f16_to_f32(dtype_f32_to_f16(amp * gen_sym(&r)));
      else
        for (int64_t k = 0; k < seg; k++) o[k] = amp * gen_sym(&r);
      i += seg;
    }
    fp8_quantize_rows(f, nr, cols, j->bk, q, sv);
    if (st_writer_pwrite(j->w, idx, (uint64_t)e0, q, (size_t)n, err, errlen) ||
        st_writer_pwrite(j->w, s->scale_idx, (uint64_t)(rb / j->bn * sc) * 4, sv, (size_t)sc * 4,
                         err, errlen))
      return -1;
  }
  return 0;
}

static void *gen_worker(void *arg) {
  gen_job *j = arg;
  void *buf = malloc((size_t)GEN_RANDOM_CHUNK * 4);
  float *f = NULL, *sv = NULL;
  uint8_t *q = NULL;
  int64_t fcols = 0; /* the columns f, q and sv are sized for */
  if (!buf) {
    gen_fail(j, "out of memory in gen-random");
    return NULL;
  }
  for (;;) {
    if (atomic_load(&j->failed)) break;
    int64_t job = atomic_fetch_add(&j->next, 1);
    if (job >= j->n_jobs) break;
    int lo = 0, hi = j->l->n - 1; /* tensor t with first_job[t] <= job < first_job[t+1] */
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (j->first_job[mid] <= job)
        lo = mid;
      else
        hi = mid - 1;
    }
    const gen_spec *s = &j->l->v[lo];
    job -= j->first_job[lo];
    char err[512];
    int rc;
    if (s->dt == DTYPE_F8_E4M3) {
      if (s->shape[1] > fcols) {
        free(f);
        free(q);
        free(sv);
        fcols = s->shape[1];
        f = malloc((size_t)(j->bn * fcols) * sizeof *f);
        q = malloc((size_t)(j->bn * fcols));
        sv = malloc((size_t)fp8_scale_cols(fcols, j->bk) * sizeof *sv);
        if (!f || !q || !sv) {
          gen_fail(j, "out of memory in gen-random");
          break;
        }
      }
      rc = gen_fp8_job(j, lo, job, f, q, sv, err, sizeof err);
    } else {
      rc = gen_chunk(j, lo, job, buf, err, sizeof err);
    }
    if (rc) gen_fail(j, err);
  }
  free(buf);
  free(f);
  free(q);
  free(sv);
  return NULL;
}

/* ---- folder ----------------------------------------------------------------------------- */

static int gen_mkdirs(const char *dir, char *err, size_t errlen) {
  char p[1024];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return errf(err, errlen, "%s: path too long", dir);
  for (char *q = p + 1;; q++) {
    if (*q == '/' || *q == 0) {
      char was = *q;
      *q = 0;
      if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return errf(err, errlen, "%s: cannot create: %s", p, strerror(errno));
      *q = was;
      if (!was) break;
    }
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return errf(err, errlen, "%s: not a folder", dir);
  return 0;
}

static int gen_copy_file(const char *src, const char *dst, char *err, size_t errlen) {
  FILE *in = fopen(src, "rb");
  if (!in) return errf(err, errlen, "%s: cannot open: %s", src, strerror(errno));
  FILE *out = fopen(dst, "wb");
  if (!out) {
    fclose(in);
    return errf(err, errlen, "%s: cannot create: %s", dst, strerror(errno));
  }
  char buf[65536];
  size_t k;
  int ok = 1;
  while ((k = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, k, out) != k) ok = 0;
  if (ferror(in)) ok = 0;
  fclose(in);
  if (fclose(out) != 0) ok = 0;
  if (!ok) return errf(err, errlen, "%s: write failed", dst);
  return 0;
}

int gen_random_parse_dtype(const char *s, dtype *out) {
  if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
    *out = DTYPE_BF16;
  else if (!strcmp(s, "f16") || !strcmp(s, "float16") || !strcmp(s, "fp16"))
    *out = DTYPE_F16;
  else if (!strcmp(s, "f32") || !strcmp(s, "float32") || !strcmp(s, "fp32"))
    *out = DTYPE_F32;
  else
    return -1;
  return 0;
}

/* The smallest whole number of bn-row blocks of a [rows, cols] tensor that spans whole chunks
 * (so that each job starts a chunk's stream), or all the rows when that is more. */
static int64_t gen_rows_per_job(int64_t rows, int64_t cols, int bn) {
  int64_t a = GEN_RANDOM_CHUNK, b = bn * cols;
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  int64_t rpj = bn * (GEN_RANDOM_CHUNK / a);
  return rpj < rows ? rpj : rows;
}

/* The tensors of l in file order into *out: 4-byte tensors first, then 2-byte, then 1-byte
 * (stable), so that every tensor stays aligned to its element size; with fp8 blocks (bn > 0)
 * the product weights become F8_E4M3 with their scales. Each keeps the stream (seed_id) it
 * has without FP8. Returns 0, or -1 when out of memory. */
static int gen_layout(const gen_list *l, int bn, int bk, gen_list *out) {
  int n0 = l->n, n = n0;
  gen_spec *v = malloc((size_t)(2 * n0 + 1) * sizeof *v), *fin = NULL;
  int *at = malloc((size_t)(n0 + 1) * sizeof *at);
  if (!v || !at) goto oom;
  int k = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n0; i++)
      if ((dtype_size(l->v[i].dt) == 4) == (pass == 0)) {
        v[k] = l->v[i];
        v[k].seed_id = k;
        k++;
      }
  for (int i = 0; i < n0 && bn > 0; i++) {
    if (v[i].kind != GEN_KIND_PROD) continue;
    v[i].dt = DTYPE_F8_E4M3;
    gen_spec *sc = &v[n++];
    memset(sc, 0, sizeof *sc);
    snprintf(sc->name, sizeof sc->name, "%s_scale_inv", v[i].name);
    sc->dt = DTYPE_F32;
    sc->kind = GEN_KIND_SCALE;
    sc->ndim = 2;
    sc->shape[0] = fp8_scale_rows(v[i].shape[0], bn);
    sc->shape[1] = fp8_scale_cols(v[i].shape[1], bk);
    sc->numel = sc->shape[0] * sc->shape[1];
    sc->of = v[i].seed_id;
  }
  fin = malloc((size_t)(n + 1) * sizeof *fin);
  if (!fin) goto oom;
  k = 0;
  for (size_t es = 4; es >= 1; es /= 2)
    for (int i = 0; i < n; i++)
      if (dtype_size(v[i].dt) == es) fin[k++] = v[i];
  for (int i = 0; i < n; i++)
    if (fin[i].kind != GEN_KIND_SCALE) at[fin[i].seed_id] = i;
  for (int i = 0; i < n; i++) {
    gen_spec *s = &fin[i];
    if (s->kind == GEN_KIND_SCALE) {
      fin[at[s->of]].scale_idx = i;
      s->n_jobs = 0; /* written with its weight */
    } else if (s->dt == DTYPE_F8_E4M3) {
      s->rows_per_job = gen_rows_per_job(s->shape[0], s->shape[1], bn);
      s->n_jobs = s->rows_per_job ? (s->shape[0] + s->rows_per_job - 1) / s->rows_per_job : 0;
    } else {
      s->n_jobs = (s->numel + GEN_RANDOM_CHUNK - 1) / GEN_RANDOM_CHUNK;
    }
  }
  free(v);
  free(at);
  *out = (gen_list){.v = fin, .n = n, .cap = n};
  return 0;
oom:
  free(v);
  free(at);
  free(fin);
  return -1;
}

int gen_random_write_weights(const model_config *c, const char *path, const gen_random_opts *o,
                             char *err, size_t errlen) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  gen_list plan = {0}, l = {0};
  int64_t *first = NULL;
  st_writer *w = NULL;
  int rc = -1;
  const int bn = o->fp8_block_n > 0 ? o->fp8_block_n : 0, bk = o->fp8_block_k;
  if (bn > 0 && bk <= 0) {
    errf(err, errlen, "gen-random: fp8 block size %d x %d", bn, bk);
    goto done;
  }
  if (gen_plan(c, o, &plan) || gen_layout(&plan, bn, bk, &l)) {
    errf(err, errlen, "out of memory planning tensors");
    goto done;
  }
  if (st_writer_open(&w, path, err, errlen)) goto done;
  first = malloc((size_t)(l.n + 1) * sizeof *first);
  if (!first) {
    errf(err, errlen, "out of memory");
    goto done;
  }
  first[0] = 0;
  int64_t params = 0;
  for (int i = 0; i < l.n; i++) {
    if (st_writer_add(w, l.v[i].name, l.v[i].dt, l.v[i].ndim, l.v[i].shape) != i) {
      errf(err, errlen, "out of memory");
      goto done;
    }
    first[i + 1] = first[i] + l.v[i].n_jobs;
    if (l.v[i].kind != GEN_KIND_SCALE) params += l.v[i].numel;
  }
  if (st_writer_begin(w, err, errlen)) goto done;
  gen_job j = {.l = &l,
               .first_job = first,
               .n_jobs = first[l.n],
               .seed = o->seed,
               .dt = o->dt,
               .bn = bn,
               .bk = bk,
               .w = w};
  atomic_init(&j.next, 0);
  atomic_init(&j.failed, 0);
  pthread_mutex_init(&j.err_mu, NULL);
  int nt = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (nt < 1) nt = 1;
  if (nt > 64) nt = 64;
  if (nt > j.n_jobs) nt = (int)(j.n_jobs > 0 ? j.n_jobs : 1);
  pthread_t th[64];
  int started = 0;
  for (int i = 0; i < nt; i++)
    if (pthread_create(&th[started], NULL, gen_worker, &j) == 0) started++;
  if (started == 0) gen_worker(&j);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&j.err_mu);
  if (atomic_load(&j.failed)) {
    errf(err, errlen, "%s", j.err);
    goto done;
  }
  rc = st_writer_close(w, err, errlen);
  w = NULL;
  if (rc == 0 && !o->quiet) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    char fp8[64] = "";
    if (bn > 0) snprintf(fp8, sizeof fp8, "; products F8_E4M3 in %d x %d blocks", bn, bk);
    printf("gen-random: wrote %s (%d tensors, %.3f B params, %s%s) in %.1f s\n", path, l.n,
           (double)params / 1e9, dtype_name(o->dt), fp8, secs);
  }
done:
  if (w) st_writer_close(w, NULL, 0);
  free(first);
  free(plan.v);
  free(l.v);
  return rc;
}

int gen_random_write(const char *config_path, const char *out_dir, const gen_random_opts *o,
                     char *err, size_t errlen) {
  model_config *c = malloc(sizeof *c);
  if (!c) return errf(err, errlen, "out of memory");
  if (config_load(config_path, c, err, errlen)) {
    free(c);
    return -1;
  }
  char path[1200];
  int rc = -1;
  if (gen_mkdirs(out_dir, err, errlen)) goto done;
  snprintf(path, sizeof path, "%s/config.json", out_dir);
  if (gen_copy_file(config_path, path, err, errlen)) goto done;
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  rc = gen_random_write_weights(c, path, o, err, errlen);
done:
  free(c);
  return rc;
}
