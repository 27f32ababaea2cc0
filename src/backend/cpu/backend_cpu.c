/* backend_cpu — the reference implementation of the op table (backend/backend.h).
 *
 * Every buffer is plain host memory of 4-byte elements (f32, or i32 for KIND_I32); every
 * weight is an fp32 copy [rows, cols] made at upload (bf16 and f16 convert exactly). Each op
 * splits its work across the pool only over independent outputs (rows, heads, output columns,
 * channels); every reduction is one loop of fixed order inside one thread, so an output's bits
 * never depend on the batch composition or the thread count. */
#include "backend/cpu/backend_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/comm.h"
#include "backend/cpu/cpu_gdn.h"
#include "backend/cpu/cpu_pool.h"
#include "base/log.h"
#include "sampler/sample_rule.h"

typedef struct cpu_weight {
  float *d; /* [rows, cols] */
  int64_t rows, cols;
} cpu_weight;

typedef struct cpu_ctx {
  cpu_pool *pool;
  /* the step's batch (owned copies) */
  backend_batch b;
  int32_t *arr;   /* one allocation holding every array of b */
  size_t arr_cap; /* int32 elements */
  int32_t *keep;  /* [keep_cap] the step's set_keep (has_keep: given since its set_batch) */
  size_t keep_cap;
  int has_keep;
  int kv_fp8;      /* K/V pages in e4m3 with scales (backend.h "Paged K/V") */
  float e4m3[256]; /* every e4m3 code decoded (kv_fp8) */
  comm *comm;      /* tensor parallelism: the ranks' communicator (a reference), or NULL */
  int rank;        /* ... and this backend's rank in it */
} cpu_ctx;

static cpu_ctx *ctx_of(backend *be) { return be->ctx; }
#define W(w) ((cpu_weight *)(w))
#define F(buf) ((float *)(buf))

/* ---- helpers ---- */

typedef float v8f __attribute__((vector_size(32)));

/* Dot product in one fixed order: 8 running lanes over blocks of 8, a fixed tree over the
 * lanes, then the tail in sequence. */
static inline float dotf(const float *a, const float *b, int n) {
  v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f x, y;
    memcpy(&x, a + i, sizeof x);
    memcpy(&y, b + i, sizeof y);
    acc += x * y;
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Four dot products of x with rows w0..w3, each bit-identical to dotf(x, wi, n) (same lane
 * arithmetic, same final tree): the rows share the loads of x. */
static inline void dot4(const float *x, const float *const w[4], int n, float out[4]) {
  v8f a0 = {0, 0, 0, 0, 0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f xv, y0, y1, y2, y3;
    memcpy(&xv, x + i, sizeof xv);
    memcpy(&y0, w[0] + i, sizeof y0);
    memcpy(&y1, w[1] + i, sizeof y1);
    memcpy(&y2, w[2] + i, sizeof y2);
    memcpy(&y3, w[3] + i, sizeof y3);
    a0 += xv * y0;
    a1 += xv * y1;
    a2 += xv * y2;
    a3 += xv * y3;
  }
  v8f acc[4] = {a0, a1, a2, a3};
  for (int r = 0; r < 4; r++) {
    v8f a = acc[r];
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int k = i; k < n; k++) s += x[k] * w[r][k];
    out[r] = s;
  }
}

static inline float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.f + expf(-x)); }

/* ---- memory ---- */

static size_t cpu_kind_size(backend *be, backend_kind kind) {
  return kind == BACKEND_KIND_KV && ctx_of(be)->kv_fp8 ? 1 : 4;
}

static size_t cpu_kv_page_bytes(backend *be, int nkv, int hd) {
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * (size_t)nkv;
  return ctx_of(be)->kv_fp8 ? rows * ((size_t)hd + 4) : rows * (size_t)hd * 4;
}

static backend_buf cpu_alloc(backend *be, backend_kind kind, size_t n) {
  size_t bytes = (n * cpu_kind_size(be, kind) + 63) & ~(size_t)63;
  if (bytes == 0) bytes = 64;
  return aligned_alloc(64, bytes);
}

static void cpu_free(backend *be, backend_buf buf) {
  (void)be;
  free(buf);
}

static int cpu_write(backend *be, backend_buf dst, size_t off, const void *src, size_t n) {
  (void)be;
  memcpy((char *)dst + off, src, n);
  return 0;
}

static int cpu_read(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  (void)be;
  memcpy(dst, (const char *)src + off, n);
  return 0;
}

/* Ops run as issued: the copy is done at once. */
static int cpu_read_start(backend *be, backend_buf src, size_t off, void *dst, size_t n) {
  return cpu_read(be, src, off, dst, n);
}
static int cpu_read_wait(backend *be, int ticket, char *err, size_t errlen) {
  (void)be;
  (void)err;
  (void)errlen;
  return ticket == 0 ? 0 : -1;
}

static void cpu_copy(backend *be, backend_buf dst, size_t doff, backend_buf src, size_t soff,
                     size_t n) {
  (void)be;
  memcpy((char *)dst + doff, (const char *)src + soff, n);
}

static void cpu_zero(backend *be, backend_buf buf, size_t off, size_t n) {
  (void)be;
  memset((char *)buf + off, 0, n);
}

static backend_weight cpu_weight_upload(backend *be, const void *data, dtype dt, int64_t rows,
                                        int64_t cols) {
  (void)be;
  cpu_weight *w = malloc(sizeof *w);
  if (!w) return NULL;
  size_t n = (size_t)(rows * cols);
  w->d = aligned_alloc(64, ((n ? n : 1) * 4 + 63) & ~(size_t)63);
  if (!w->d) {
    free(w);
    return NULL;
  }
  w->rows = rows;
  w->cols = cols;
  if (dt == DTYPE_F32) {
    memcpy(w->d, data, n * 4);
  } else {
    const uint16_t *h = data;
    for (size_t i = 0; i < n; i++)
      w->d[i] = dt == DTYPE_BF16 ? dtype_bf16_to_f32(h[i]) : dtype_f16_to_f32(h[i]);
  }
  return w;
}

static void cpu_weight_free(backend *be, backend_weight w) {
  (void)be;
  if (!w) return;
  free(W(w)->d);
  free(w);
}

static size_t cpu_weight_bytes(backend *be, backend_weight w) {
  (void)be;
  return (size_t)(W(w)->rows * W(w)->cols) * 4;
}

static int cpu_set_batch(backend *be, const backend_batch *b) {
  cpu_ctx *c = ctx_of(be);
  size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs;
  size_t need = 3 * T + 5 * S + S * (size_t)b->max_pages + (size_t)b->n_out;
  if (need > c->arr_cap) {
    int32_t *a = realloc(c->arr, (need ? need : 1) * sizeof *a);
    if (!a) return -1;
    c->arr = a;
    c->arr_cap = need;
  }
  int32_t *p = c->arr;
  c->b = *b;
#define TAKE(field, n)                                             \
  do {                                                             \
    if ((n) > 0 && b->field) memcpy(p, b->field, (n) * sizeof *p); \
    c->b.field = p;                                                \
    p += (n);                                                      \
  } while (0)
  TAKE(tokens, T);
  if (b->tokens_dev) memcpy((int32_t *)c->b.tokens, b->tokens_dev, T * sizeof *p);
  TAKE(pos, T);
  TAKE(seq, T);
  TAKE(seq_start, S);
  TAKE(seq_len, S);
  TAKE(seq_pos, S);
  TAKE(seq_slot, S);
  TAKE(page_table, S * (size_t)b->max_pages);
  TAKE(out_rows, (size_t)b->n_out);
#undef TAKE
  (void)p;
  c->has_keep = 0;
  return 0;
}

static int cpu_set_keep(backend *be, const int32_t *seq_keep) {
  cpu_ctx *c = ctx_of(be);
  size_t S = (size_t)c->b.n_seqs;
  if (S > c->keep_cap) {
    int32_t *k = realloc(c->keep, S * sizeof *k);
    if (!k) return -1;
    c->keep = k;
    c->keep_cap = S;
  }
  if (S) memcpy(c->keep, seq_keep, S * sizeof *c->keep);
  c->has_keep = 1;
  return 0;
}

/* The verify piece s's first keep slot (backend.h "Verify pieces"), -1 for a plain piece. */
static inline int cpu_keep(const cpu_ctx *c, int s) { return c->has_keep ? c->keep[s] : -1; }

static int cpu_sync(backend *be, char *err, size_t errlen) {
  (void)be;
  (void)err;
  (void)errlen;
  return 0;
}

/* ---- embed ---- */

typedef struct {
  cpu_ctx *c;
  const cpu_weight *E;
  int H;
  float *out;
} embed_job;

static void embed_run(void *v, int64_t b, int64_t e) {
  embed_job *j = v;
  for (int64_t t = b; t < e; t++) {
    int32_t id = j->c->b.tokens[t];
    CHECK(id >= 0 && id < j->E->rows);
    memcpy(j->out + t * j->H, j->E->d + (int64_t)id * j->E->cols, (size_t)j->H * 4);
  }
}

static void cpu_embed(backend *be, backend_weight E, int H, backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  embed_job j = {c, W(E), H, F(out)};
  cpu_pool_run(c->pool, c->b.n_tokens, 16, embed_run, &j);
}

/* ---- rmsnorm / add ---- */

static void rms_row(const float *x, const float *w, int n, float eps, float *y) {
  float ss = dotf(x, x, n);
  float r = 1.f / sqrtf(ss / (float)n + eps);
  for (int i = 0; i < n; i++) y[i] = (x[i] * r) * (1.f + w[i]);
}

typedef struct {
  float *x, *add, *y;
  const float *w;
  int n;
  float eps;
} rms_job;

static void rms_run(void *v, int64_t b, int64_t e) {
  rms_job *j = v;
  for (int64_t t = b; t < e; t++) {
    float *x = j->x + t * j->n;
    if (j->add) {
      const float *a = j->add + t * j->n;
      for (int i = 0; i < j->n; i++) x[i] += a[i];
    }
    rms_row(x, j->w, j->n, j->eps, j->y + t * j->n);
  }
}

static void cpu_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                        float eps, backend_buf y) {
  rms_job j = {F(x), F(add), F(y), W(w)->d, n, eps};
  cpu_pool_run(ctx_of(be)->pool, T, 4, rms_run, &j);
}

typedef struct {
  float *x;
  const float *y;
  int op; /* 0 add, 1 sigmoid_mul, 2 swiglu */
  float *out;
} ew_job;

static void ew_run(void *v, int64_t b, int64_t e) {
  ew_job *j = v;
  if (j->op == 0)
    for (int64_t i = b; i < e; i++) j->x[i] += j->y[i];
  else if (j->op == 1)
    for (int64_t i = b; i < e; i++) j->x[i] *= sigmoidf_(j->y[i]);
  else
    for (int64_t i = b; i < e; i++) j->out[i] = siluf_(j->x[i]) * j->y[i];
}

static void cpu_add(backend *be, backend_buf x, backend_buf y, size_t n) {
  ew_job j = {F(x), F(y), 0, NULL};
  cpu_pool_run(ctx_of(be)->pool, (int64_t)n, 4096, ew_run, &j);
}

static void cpu_sigmoid_mul(backend *be, backend_buf x, backend_buf gate, size_t n) {
  ew_job j = {F(x), F(gate), 1, NULL};
  cpu_pool_run(ctx_of(be)->pool, (int64_t)n, 4096, ew_run, &j);
}

static void cpu_swiglu(backend *be, backend_buf gate, backend_buf up, size_t n, backend_buf out) {
  ew_job j = {F(gate), F(up), 2, F(out)};
  cpu_pool_run(ctx_of(be)->pool, (int64_t)n, 4096, ew_run, &j);
}

/* ---- matmul ---- */

typedef struct {
  const float *x;
  const float *w;
  int T, K, N;
  float *y;
} mm_job;

static void mm_run(void *v, int64_t b, int64_t e) {
  mm_job *j = v;
  int64_t n = b;
  for (; n + 4 <= e; n += 4) {
    const float *w[4] = {j->w + n * j->K, j->w + (n + 1) * j->K, j->w + (n + 2) * j->K,
                         j->w + (n + 3) * j->K};
    for (int t = 0; t < j->T; t++) {
      float o[4];
      dot4(j->x + (int64_t)t * j->K, w, j->K, o);
      for (int r = 0; r < 4; r++) j->y[(int64_t)t * j->N + n + r] = o[r];
    }
  }
  for (; n < e; n++) {
    const float *wr = j->w + n * j->K;
    for (int t = 0; t < j->T; t++)
      j->y[(int64_t)t * j->N + n] = dotf(j->x + (int64_t)t * j->K, wr, j->K);
  }
}

static void cpu_matmul(backend *be, backend_buf x, backend_weight w, int T, int K, int N,
                       backend_buf y) {
  CHECK(W(w)->cols == K && W(w)->rows == N);
  mm_job j = {F(x), W(w)->d, T, K, N, F(y)};
  cpu_pool_run(ctx_of(be)->pool, N, 8, mm_run, &j);
}

/* ---- attention ---- */

typedef struct {
  cpu_ctx *c;
  float *qg, *k, *q_out, *gate_out;
  const float *qn, *kn;
  int nh, nkv, hd, rot;
  double theta;
  float eps;
} qkr_job;

static void rope(float *x, int rot, int pos, double theta) {
  int half = rot / 2;
  for (int i = 0; i < half; i++) {
    float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)rot));
    float a = (float)pos * inv;
    float cs = cosf(a), sn = sinf(a);
    float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * cs - x1 * sn;
    x[i + half] = x1 * cs + x0 * sn;
  }
}

static void qkr_run(void *v, int64_t b, int64_t e) {
  qkr_job *j = v;
  int hd = j->hd;
  for (int64_t t = b; t < e; t++) {
    int pos = j->c->b.pos[t];
    for (int h = 0; h < j->nh; h++) {
      const float *src = j->qg + (t * j->nh + h) * 2 * hd;
      float *qo = j->q_out + (t * j->nh + h) * hd;
      rms_row(src, j->qn, hd, j->eps, qo);
      rope(qo, j->rot, pos, j->theta);
      memcpy(j->gate_out + (t * j->nh + h) * hd, src + hd, (size_t)hd * 4);
    }
    for (int h = 0; h < j->nkv; h++) {
      float *kr = j->k + (t * j->nkv + h) * hd;
      float tmp[hd];
      rms_row(kr, j->kn, hd, j->eps, tmp);
      memcpy(kr, tmp, (size_t)hd * 4);
      rope(kr, j->rot, pos, j->theta);
    }
  }
}

static void cpu_qk_norm_rope(backend *be, backend_buf qg, backend_buf k, backend_weight q_norm,
                             backend_weight k_norm, int nh, int nkv, int hd, int rot, double theta,
                             float eps, backend_buf q_out, backend_buf gate_out) {
  cpu_ctx *c = ctx_of(be);
  qkr_job j = {c,  F(qg), F(k), F(q_out), F(gate_out), W(q_norm)->d, W(k_norm)->d,
               nh, nkv,   hd,   rot,      theta,       eps};
  cpu_pool_run(c->pool, c->b.n_tokens, 1, qkr_run, &j);
}

typedef struct {
  cpu_ctx *c;
  float *kp, *vp;
  const float *q, *k, *v;
  int nh, nkv, hd;
  float scale;
  float *out;
} att_job;

static inline size_t kv_row(const backend_batch *b, int s, int p, int nkv, int hd) {
  int page = b->page_table[(size_t)s * b->max_pages + p / BACKEND_PAGE_TOKENS];
  return ((size_t)page * BACKEND_PAGE_TOKENS + (size_t)(p % BACKEND_PAGE_TOKENS)) * nkv * hd;
}

/* FP8 pages: row p of sequence s, head h: its hd e4m3 bytes and (*scale) its scale, in a page
 * of [P, nkv, hd] bytes then [P, nkv] f32 scales */
static inline uint8_t *kv8_row(void *pool, const backend_batch *b, int s, int p, int nkv, int hd,
                               int h, float **scale) {
  int page = b->page_table[(size_t)s * b->max_pages + p / BACKEND_PAGE_TOKENS];
  size_t rows = (size_t)BACKEND_PAGE_TOKENS * nkv, r = (size_t)(p % BACKEND_PAGE_TOKENS) * nkv + h;
  uint8_t *pg = (uint8_t *)pool + (size_t)page * rows * ((size_t)hd + 4);
  *scale = (float *)(pg + rows * hd) + r;
  return pg + r * hd;
}

/* One row of n values to e4m3 with its scale (backend.h "Paged K/V"); returns the scale. */
static float kv8_quantize(const float *x, int n, uint8_t *q) {
  float amax = 0.f;
  for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
  if (!(amax > 0.f)) {
    memset(q, 0, (size_t)n);
    return 0.f;
  }
  float inv = BACKEND_KV_FP8_MAX / amax;
  for (int i = 0; i < n; i++) {
    float y = x[i] * inv;
    q[i] = dtype_f32_to_e4m3(y > BACKEND_KV_FP8_MAX    ? BACKEND_KV_FP8_MAX
                             : y < -BACKEND_KV_FP8_MAX ? -BACKEND_KV_FP8_MAX
                                                       : y);
  }
  return amax / BACKEND_KV_FP8_MAX;
}

static void att_write_run(void *v, int64_t b, int64_t e) {
  att_job *j = v;
  const backend_batch *bb = &j->c->b;
  size_t w = (size_t)j->nkv * j->hd;
  if (j->c->kv_fp8) {
    for (int64_t t = b; t < e; t++)
      for (int h = 0; h < j->nkv; h++) {
        float *ks, *vs;
        uint8_t *kq = kv8_row(j->kp, bb, bb->seq[t], bb->pos[t], j->nkv, j->hd, h, &ks);
        uint8_t *vq = kv8_row(j->vp, bb, bb->seq[t], bb->pos[t], j->nkv, j->hd, h, &vs);
        *ks = kv8_quantize(j->k + t * w + (size_t)h * j->hd, j->hd, kq);
        *vs = kv8_quantize(j->v + t * w + (size_t)h * j->hd, j->hd, vq);
      }
    return;
  }
  for (int64_t t = b; t < e; t++) {
    size_t off = kv_row(bb, bb->seq[t], bb->pos[t], j->nkv, j->hd);
    memcpy(j->kp + off, j->k + t * w, w * 4);
    memcpy(j->vp + off, j->v + t * w, w * 4);
  }
}

static void att_run(void *v, int64_t b, int64_t e) {
  att_job *j = v;
  const backend_batch *bb = &j->c->b;
  int hd = j->hd, grp = j->nh / j->nkv;
  float acc[hd], kd[hd], vd[hd];
  for (int64_t task = b; task < e; task++) {
    int64_t t = task / j->nh;
    int h = (int)(task % j->nh), kvh = h / grp;
    int s = bb->seq[t], p = bb->pos[t];
    const float *q = j->q + (t * j->nh + h) * hd;
    float m = -INFINITY, l = 0.f;
    for (int i = 0; i < hd; i++) acc[i] = 0.f;
    for (int pj = 0; pj <= p; pj++) {
      const float *kr, *vr;
      if (j->c->kv_fp8) { /* the rows dequantized: e4m3 value times the row's scale */
        float *ks, *vs;
        const uint8_t *kq = kv8_row(j->kp, bb, s, pj, j->nkv, hd, kvh, &ks);
        const uint8_t *vq = kv8_row(j->vp, bb, s, pj, j->nkv, hd, kvh, &vs);
        for (int i = 0; i < hd; i++) {
          kd[i] = j->c->e4m3[kq[i]] * *ks;
          vd[i] = j->c->e4m3[vq[i]] * *vs;
        }
        kr = kd;
        vr = vd;
      } else {
        size_t off = kv_row(bb, s, pj, j->nkv, hd) + (size_t)kvh * hd;
        kr = j->kp + off;
        vr = j->vp + off;
      }
      float sc = dotf(q, kr, hd) * j->scale;
      if (sc > m) {
        float cr = expf(m - sc);
        l *= cr;
        for (int i = 0; i < hd; i++) acc[i] *= cr;
        m = sc;
      }
      float ev = expf(sc - m);
      l += ev;
      for (int i = 0; i < hd; i++) acc[i] += ev * vr[i];
    }
    float *o = j->out + (t * j->nh + h) * hd;
    float inv = 1.f / l;
    for (int i = 0; i < hd; i++) o[i] = acc[i] * inv;
  }
}

static void cpu_attention(backend *be, backend_buf k_pool, backend_buf v_pool, backend_buf q,
                          backend_buf k, backend_buf v, int nh, int nkv, int hd, float scale,
                          backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  att_job j = {c, F(k_pool), F(v_pool), F(q), F(k), F(v), nh, nkv, hd, scale, F(out)};
  cpu_pool_run(c->pool, c->b.n_tokens, 64, att_write_run, &j);
  cpu_pool_run(c->pool, (int64_t)c->b.n_tokens * nh, 1, att_run, &j);
}

/* ---- MoE ---- */

typedef struct {
  const backend_moe *m;
  const float *x;
  int T, H, I, Is, kk;
  int32_t *ids; /* [T, k] */
  float *wts;   /* [T, k] */
  float *sg;    /* [T] shared gate scalar */
  float *hid;   /* [T, k*I + Is] */
  float *out;
} moe_job;

static void moe_route_run(void *v, int64_t b, int64_t e) {
  moe_job *j = v;
  const backend_moe *m = j->m;
  int E = m->n_experts;
  float p[E];
  for (int64_t t = b; t < e; t++) {
    const float *x = j->x + t * j->H;
    const cpu_weight *R = W(m->router);
    float mx = -INFINITY;
    for (int ei = 0; ei < E; ei++) {
      p[ei] = dotf(x, R->d + (int64_t)ei * j->H, j->H);
      if (p[ei] > mx) mx = p[ei];
    }
    float sum = 0.f;
    for (int ei = 0; ei < E; ei++) {
      p[ei] = expf(p[ei] - mx);
      sum += p[ei];
    }
    for (int ei = 0; ei < E; ei++) p[ei] /= sum;
    int32_t *ids = j->ids + t * j->kk;
    float *w = j->wts + t * j->kk;
    for (int r = 0; r < j->kk; r++) {
      int best = -1;
      for (int ei = 0; ei < E; ei++) {
        int taken = 0;
        for (int q = 0; q < r; q++) taken |= ids[q] == ei;
        if (!taken && (best < 0 || p[ei] > p[best])) best = ei;
      }
      ids[r] = best;
      w[r] = p[best];
    }
    if (m->norm_topk_prob) {
      float s = 0.f;
      for (int r = 0; r < j->kk; r++) s += w[r];
      for (int r = 0; r < j->kk; r++) w[r] /= s;
    }
    if (j->Is > 0) j->sg[t] = sigmoidf_(dotf(x, W(m->shared_expert_gate)->d, j->H));
  }
}

static void moe_hidden_run(void *v, int64_t b, int64_t e) {
  moe_job *j = v;
  const backend_moe *m = j->m;
  int64_t width = (int64_t)j->kk * j->I + j->Is;
  for (int64_t task = b; task < e; task++) {
    int64_t t = task / width, i = task % width;
    const float *x = j->x + t * j->H;
    const float *gw, *uw;
    if (i < (int64_t)j->kk * j->I) {
      int r = (int)(i / j->I), ii = (int)(i % j->I);
      int ei = j->ids[t * j->kk + r];
      gw = W(m->gate[ei])->d + (int64_t)ii * j->H;
      uw = W(m->up[ei])->d + (int64_t)ii * j->H;
    } else {
      int ii = (int)(i - (int64_t)j->kk * j->I);
      gw = W(m->shared_gate)->d + (int64_t)ii * j->H;
      uw = W(m->shared_up)->d + (int64_t)ii * j->H;
    }
    j->hid[task] = siluf_(dotf(x, gw, j->H)) * dotf(x, uw, j->H);
  }
}

static void moe_out_run(void *v, int64_t b, int64_t e) {
  moe_job *j = v;
  const backend_moe *m = j->m;
  int64_t width = (int64_t)j->kk * j->I + j->Is;
  for (int64_t task = b; task < e; task++) {
    int64_t t = task / j->H;
    int hh = (int)(task % j->H);
    const float *hid = j->hid + t * width;
    float acc = 0.f;
    for (int r = 0; r < j->kk; r++) {
      int ei = j->ids[t * j->kk + r];
      acc += j->wts[t * j->kk + r] *
             dotf(W(m->down[ei])->d + (int64_t)hh * j->I, hid + r * j->I, j->I);
    }
    if (j->Is > 0)
      acc += j->sg[t] *
             dotf(W(m->shared_down)->d + (int64_t)hh * j->Is, hid + (int64_t)j->kk * j->I, j->Is);
    j->out[task] = acc;
  }
}

static void cpu_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H,
                    backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  int kk = m->top_k, I = m->inter, Is = m->shared_inter;
  if (!m->shared_gate || !m->shared_up || !m->shared_down || !m->shared_expert_gate) Is = 0;
  int64_t width = (int64_t)kk * I + Is;
  int32_t *ids = malloc((size_t)T * kk * sizeof *ids);
  float *wts = malloc((size_t)T * kk * sizeof *wts);
  float *sg = malloc((size_t)T * sizeof *sg);
  float *hid = malloc((size_t)(T * width) * sizeof *hid);
  CHECK(ids && wts && sg && hid);
  moe_job j = {m, F(x), T, H, I, Is, kk, ids, wts, sg, hid, F(out)};
  cpu_pool_run(c->pool, T, 1, moe_route_run, &j);
  cpu_pool_run(c->pool, T * width, 8, moe_hidden_run, &j);
  cpu_pool_run(c->pool, (int64_t)T * H, 8, moe_out_run, &j);
  free(ids);
  free(wts);
  free(sg);
  free(hid);
}

/* ---- DeltaNet ---- */

typedef struct {
  cpu_ctx *c;
  float *state;
  const float *x;
  const float *w;
  int C, K;
  float *out;
} conv_job;

static void conv_run(void *v, int64_t b, int64_t e) {
  conv_job *j = v;
  const backend_batch *bb = &j->c->b;
  int K = j->K, C = j->C;
  float hist[K];
  for (int64_t ch = b; ch < e; ch++) {
    const float *w = j->w + ch * K;
    for (int s = 0; s < bb->n_seqs; s++) {
      float *st = j->state + ((size_t)bb->seq_slot[s] * C + (size_t)ch) * (K - 1);
      int keep = cpu_keep(j->c, s);
      if (bb->seq_pos[s] == 0)
        for (int i = 0; i < K - 1; i++) hist[i] = 0.f;
      else
        memcpy(hist, st, (size_t)(K - 1) * 4);
      for (int r = 0; r < bb->seq_len[s]; r++) {
        int64_t t = bb->seq_start[s] + r;
        float xv = j->x[t * C + ch];
        float acc = 0.f;
        for (int i = 0; i < K - 1; i++) acc += w[i] * hist[i];
        acc += w[K - 1] * xv;
        j->out[t * C + ch] = siluf_(acc);
        for (int i = 0; i + 1 < K - 1; i++) hist[i] = hist[i + 1];
        if (K > 1) hist[K - 2] = xv;
        if (keep >= 0 && r + 1 < bb->seq_len[s]) /* a verify piece's window after row r */
          memcpy(j->state + ((size_t)(keep + r) * C + (size_t)ch) * (K - 1), hist,
                 (size_t)(K - 1) * 4);
      }
      memcpy(st, hist, (size_t)(K - 1) * 4);
    }
  }
}

static void cpu_conv1d(backend *be, backend_buf conv_state, backend_buf x, backend_weight w, int C,
                       int K, backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  CHECK(W(w)->rows * W(w)->cols == (int64_t)C * K);
  conv_job j = {c, F(conv_state), F(x), W(w)->d, C, K, F(out)};
  cpu_pool_run(c->pool, C, 16, conv_run, &j);
}

typedef struct {
  float *qkv;
  const float *b, *a, *A_log, *dt_bias;
  int nk, nv, dk, dv;
  float *beta, *g;
} gates_job;

static void l2n(float *x, int n, float scale) {
  float inv = 1.f / sqrtf(dotf(x, x, n) + 1e-6f);
  for (int i = 0; i < n; i++) x[i] *= inv;
  if (scale != 1.f)
    for (int i = 0; i < n; i++) x[i] *= scale;
}

static void gates_run(void *v, int64_t b, int64_t e) {
  gates_job *j = v;
  int64_t cd = 2 * (int64_t)j->nk * j->dk + (int64_t)j->nv * j->dv;
  float qs = 1.f / sqrtf((float)j->dk);
  for (int64_t t = b; t < e; t++) {
    float *row = j->qkv + t * cd;
    for (int h = 0; h < j->nk; h++) l2n(row + (int64_t)h * j->dk, j->dk, qs);
    for (int h = 0; h < j->nk; h++) l2n(row + (int64_t)(j->nk + h) * j->dk, j->dk, 1.f);
    for (int h = 0; h < j->nv; h++) {
      j->beta[t * j->nv + h] = sigmoidf_(j->b[t * j->nv + h]);
      float xx = j->a[t * j->nv + h] + j->dt_bias[h];
      float sp = xx > 20.f ? xx : log1pf(expf(xx));
      j->g[t * j->nv + h] = -expf(j->A_log[h]) * sp;
    }
  }
}

static void cpu_gdn_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a,
                          backend_weight A_log, backend_weight dt_bias, int nk, int nv, int dk,
                          int dv, backend_buf beta, backend_buf g) {
  cpu_ctx *c = ctx_of(be);
  gates_job j = {F(qkv), F(b), F(a), W(A_log)->d, W(dt_bias)->d, nk, nv, dk, dv, F(beta), F(g)};
  cpu_pool_run(c->pool, c->b.n_tokens, 4, gates_run, &j);
}

typedef struct {
  cpu_ctx *c;
  float *ssm;
  const float *qkv, *beta, *g;
  int nk, nv, dk, dv;
  float *out;
  const int32_t *pieces; /* [n_pieces] piece indices */
  int failed;
} gdn_job;

static void gdn_task(gdn_job *j, int64_t task, int chunked) {
  const backend_batch *bb = &j->c->b;
  int s = j->pieces[task / j->nv], h = (int)(task % j->nv);
  int kh = h / (j->nv / j->nk);
  size_t cd = 2 * (size_t)j->nk * j->dk + (size_t)j->nv * j->dv;
  size_t ow = (size_t)j->nv * j->dv;
  int64_t t0 = bb->seq_start[s];
  float *S = j->ssm + ((size_t)bb->seq_slot[s] * j->nv + h) * (size_t)j->dk * j->dv;
  if (bb->seq_pos[s] == 0) memset(S, 0, (size_t)j->dk * j->dv * 4);
  const float *q = j->qkv + t0 * cd + (size_t)kh * j->dk;
  const float *k = j->qkv + t0 * cd + (size_t)(j->nk + kh) * j->dk;
  const float *v = j->qkv + t0 * cd + 2 * (size_t)j->nk * j->dk + (size_t)h * j->dv;
  float *o = j->out + t0 * ow + (size_t)h * j->dv;
  if (chunked) {
    if (cpu_gdn_chunked(bb->seq_len[s], bb->seq_pos[s], q, k, cd, v, cd, j->beta + t0 * j->nv + h,
                        j->g + t0 * j->nv + h, (size_t)j->nv, j->dk, j->dv, S, o, ow) != 0)
      j->failed = 1;
  } else { /* one row, or a verify piece row by row (its states after each row but the last
              kept in slots seq_keep[s] + r) */
    int keep = cpu_keep(j->c, s);
    size_t sb = (size_t)j->dk * j->dv;
    for (int r = 0; r < bb->seq_len[s]; r++) {
      cpu_gdn_step(q + r * cd, k + r * cd, v + r * cd, j->beta[(t0 + r) * j->nv + h],
                   j->g[(t0 + r) * j->nv + h], j->dk, j->dv, S, o + r * ow);
      if (keep >= 0 && r + 1 < bb->seq_len[s])
        memcpy(j->ssm + ((size_t)(keep + r) * j->nv + h) * sb, S, sb * 4);
    }
  }
}

static void gdn_chunk_run(void *v, int64_t b, int64_t e) {
  for (int64_t t = b; t < e; t++) gdn_task(v, t, 1);
}
static void gdn_step_run(void *v, int64_t b, int64_t e) {
  for (int64_t t = b; t < e; t++) gdn_task(v, t, 0);
}

static void gdn_common(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                       backend_buf g, int nk, int nv, int dk, int dv, backend_buf out,
                       int chunked) {
  cpu_ctx *c = ctx_of(be);
  int32_t pieces[c->b.n_seqs > 0 ? c->b.n_seqs : 1];
  int np = 0;
  for (int s = 0; s < c->b.n_seqs; s++)
    if ((c->b.seq_len[s] > 1 && cpu_keep(c, s) < 0) == chunked) pieces[np++] = s;
  if (!np) return;
  gdn_job j = {c, F(ssm), F(qkv), F(beta), F(g), nk, nv, dk, dv, F(out), pieces, 0};
  cpu_pool_run(c->pool, (int64_t)np * nv, 1, chunked ? gdn_chunk_run : gdn_step_run, &j);
  CHECK(!j.failed); /* scratch allocation of a few hundred KiB */
}

static void cpu_gdn_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                            backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  gdn_common(be, ssm, qkv, beta, g, nk, nv, dk, dv, out, 1);
}

static void cpu_gdn_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                           backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  gdn_common(be, ssm, qkv, beta, g, nk, nv, dk, dv, out, 0);
}

typedef struct {
  const float *o, *z, *w;
  int nv, dv;
  float eps;
  float *out;
} gnorm_job;

static void gnorm_run(void *v, int64_t b, int64_t e) {
  gnorm_job *j = v;
  for (int64_t task = b; task < e; task++) {
    const float *o = j->o + task * j->dv;
    const float *z = j->z + task * j->dv;
    float *y = j->out + task * j->dv;
    float r = 1.f / sqrtf(dotf(o, o, j->dv) / (float)j->dv + j->eps);
    for (int i = 0; i < j->dv; i++) y[i] = (j->w[i] * (o[i] * r)) * siluf_(z[i]);
  }
}

static void cpu_gated_rmsnorm(backend *be, backend_buf o, backend_buf z, backend_weight w, int T,
                              int nv, int dv, float eps, backend_buf out) {
  gnorm_job j = {F(o), F(z), W(w)->d, nv, dv, eps, F(out)};
  cpu_pool_run(ctx_of(be)->pool, (int64_t)T * nv, 4, gnorm_run, &j);
}

/* ---- logits ---- */

typedef struct {
  cpu_ctx *c;
  const float *x, *norm;
  float eps;
  const float *w;
  int H, V;
  float *xn, *out;
} lg_job;

static void lg_norm_run(void *v, int64_t b, int64_t e) {
  lg_job *j = v;
  for (int64_t i = b; i < e; i++)
    rms_row(j->x + (int64_t)j->c->b.out_rows[i] * j->H, j->norm, j->H, j->eps, j->xn + i * j->H);
}

static void lg_run(void *v, int64_t b, int64_t e) {
  lg_job *j = v;
  int n = j->c->b.n_out;
  for (int64_t r = b; r < e; r++) {
    const float *wr = j->w + r * j->H;
    for (int i = 0; i < n; i++)
      j->out[(int64_t)i * j->V + r] = dotf(j->xn + (int64_t)i * j->H, wr, j->H);
  }
}

static void cpu_logits(backend *be, backend_buf x, backend_weight norm, float eps, backend_weight w,
                       int H, int V, backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  if (c->b.n_out <= 0) return;
  float *xn = malloc((size_t)c->b.n_out * H * sizeof *xn);
  CHECK(xn);
  lg_job j = {c, F(x), W(norm)->d, eps, W(w)->d, H, V, xn, F(out)};
  cpu_pool_run(c->pool, c->b.n_out, 1, lg_norm_run, &j);
  cpu_pool_run(c->pool, V, 16, lg_run, &j);
  free(xn);
}

/* ---- argmax (optional op) ---- */

typedef struct {
  const float *x;
  int V;
  int32_t *ids;
  float *maxv;
} am_job;

/* The scan of sampler_argmax (sampler.h), kept here so the backend does not depend on the
 * sampler: m is always x[tok], so the result is that of  if (x[i] > x[tok]) tok = i. */
static int32_t am_row(const float *x, int V, float *maxv) {
  int32_t tok = 0;
  float m = x[0];
  for (int i = 1; i < V; i++)
    if (x[i] > m) {
      m = x[i];
      tok = i;
    }
  *maxv = m;
  return tok;
}

static void am_run(void *v, int64_t b, int64_t e) {
  am_job *j = v;
  for (int64_t r = b; r < e; r++) {
    float m;
    j->ids[r] = am_row(j->x + r * j->V, j->V, &m);
    if (j->maxv) j->maxv[r] = m;
  }
}

static void cpu_argmax(backend *be, backend_buf x, int n, int V, backend_buf ids,
                       backend_buf maxv) {
  if (n <= 0 || V <= 0) return;
  am_job j = {F(x), V, (int32_t *)ids, maxv ? F(maxv) : NULL};
  cpu_pool_run(ctx_of(be)->pool, n, 1, am_run, &j);
}

/* ---- sample (optional op) ---- */

/* sample_rule.h's rule by the CUDA kernel's method (cuda_sample.cu), so that its steps run on
 * every CPU test: the keys written over the row, then each cut found by a radix descent over
 * the rebased keys' five six-bit digits (a count or a mass per digit, the digit where the
 * running sum reaches the target) and, among equal keys, a scan in id order; the draw a scan
 * in id order. */
typedef struct {
  const int32_t *params;
  float *x;
  int n, V;
  int32_t *ids;
} smp_job;

/* cut (ka, ia): the candidates up to it in the rule's order; ka == 0: every candidate */
static int smp_kept(uint32_t k, int32_t i, uint32_t ka, int32_t ia) {
  return k != 0 && (ka == 0 || sample_rule_before(k, i, ka, ia) || (k == ka && i == ia));
}

static uint64_t smp_measure(uint32_t k, int mass) {
  if (!mass) return 1;
  float q;
  memcpy(&q, &k, sizeof q);
  return (uint64_t)sample_rule_mul(q, SAMPLE_RULE_MASS_SCALE);
}

/* The first kept candidate in the rule's order at which the running count (mass == 0) or mass
 * reaches target (>= 1, <= the kept sum): its key in *kc, its id returned. The descent is the
 * kernel's: a candidate's key rebased, (key - 87 << 23) << 1 < 41 << 24 (q in [2^-40, 1] has
 * exponent 87..127), in five digits of six bits. */
static int32_t smp_find(const uint32_t *key, int V, int mass, uint64_t target, uint32_t ka,
                        int32_t ia, uint32_t *kc) {
  uint32_t prefix = 0;
  for (int pass = 0; pass < 5; pass++) {
    int shift = 24 - 6 * pass;
    uint64_t hist[64] = {0};
    for (int i = 0; i < V; i++) {
      uint32_t k = key[i], r = (k - (87u << 23)) << 1;
      if (!smp_kept(k, i, ka, ia) || (pass > 0 && (r >> (shift + 6)) != prefix)) continue;
      hist[(r >> shift) & 63] += smp_measure(k, mass);
    }
    int d = 63;
    for (; d > 0 && hist[d] < target; d--) target -= hist[d];
    prefix = prefix << 6 | (uint32_t)d;
  }
  *kc = (prefix >> 1) + (87u << 23);
  uint64_t acc = 0;
  for (int i = 0; i < V; i++)
    if (key[i] == *kc && smp_kept(key[i], i, ka, ia) && (acc += smp_measure(*kc, mass)) >= target)
      return i;
  return -1;
}

static int32_t smp_row(float *x, int V, const sample_rule_row *p) {
  float top;
  int32_t first = am_row(x, V, &top); /* the argmax rule's answer */
  if (p->temperature < SAMPLE_RULE_GREEDY_T) return first;
  float inv_t = 1.0f / p->temperature, m = -INFINITY;
  for (int i = 0; i < V; i++)
    if (x[i] > m) m = x[i];
  uint32_t *key = (uint32_t *)x; /* written over the row */
  int n = 0;
  for (int i = 0; i < V; i++) {
    key[i] = sample_rule_key(sample_rule_prob(x[i], m, inv_t), p->min_p);
    n += key[i] != 0;
  }
  if (n == 0) return first;
  uint32_t ka = 0;
  int32_t ia = -1;
  if (p->top_k > 0 && p->top_k < n) ia = smp_find(key, V, 0, (uint64_t)p->top_k, 0, -1, &ka);
  if (p->top_p < 1.0f) {
    uint64_t total = 0;
    for (int i = 0; i < V; i++)
      if (smp_kept(key[i], i, ka, ia)) total += smp_measure(key[i], 1);
    uint32_t kb;
    ia = smp_find(key, V, 1, sample_rule_top_p_target(p->top_p, total), ka, ia, &kb);
    ka = kb;
  }
  uint64_t total = 0, acc = 0;
  for (int i = 0; i < V; i++)
    if (smp_kept(key[i], i, ka, ia)) total += smp_measure(key[i], 1);
  uint64_t r = sample_rule_draw_target(p->u53, total);
  for (int i = 0; i < V; i++)
    if (smp_kept(key[i], i, ka, ia) && (acc += smp_measure(key[i], 1)) > r) return i;
  return -1;
}

static void smp_run(void *v, int64_t b, int64_t e) {
  smp_job *j = v;
  for (int64_t r = b; r < e; r++) {
    sample_rule_row p;
    sample_rule_unpack(j->params + r * SAMPLE_RULE_WORDS, &p);
    float *x = j->x + r * j->V;
    const int32_t *ew =
        j->params + (size_t)j->n * SAMPLE_RULE_WORDS + (size_t)p.edit_off * SAMPLE_RULE_EDIT_WORDS;
    for (int k = 0; k < p.n_edits; k++) {
      sample_rule_edit e;
      sample_rule_edit_unpack(ew + (size_t)k * SAMPLE_RULE_EDIT_WORDS, &e);
      if (e.id >= 0 && e.id < j->V) x[e.id] = sample_rule_edit_apply(x[e.id], &e);
    }
    j->ids[r] = smp_row(x, j->V, &p);
  }
}

static void cpu_sample(backend *be, backend_buf x, int n, int V, backend_buf params,
                       backend_buf ids) {
  if (n <= 0 || V <= 0) return;
  smp_job j = {(const int32_t *)params, F(x), n, V, (int32_t *)ids};
  cpu_pool_run(ctx_of(be)->pool, n, 1, smp_run, &j);
}

/* ---- tensor parallelism ---- */

static void cpu_all_reduce_sum(backend *be, backend_buf x, size_t n) {
  cpu_ctx *c = ctx_of(be);
  comm_all_reduce_sum(c->comm, c->rank, F(x), n);
}

static void cpu_all_gather(backend *be, backend_buf x, size_t n, backend_buf out) {
  cpu_ctx *c = ctx_of(be);
  comm_all_gather(c->comm, c->rank, F(x), n, F(out));
}

/* ---- lifetime ---- */

static void cpu_destroy(backend *be) {
  if (!be) return;
  cpu_ctx *c = ctx_of(be);
  if (c) {
    comm_unref(c->comm);
    cpu_pool_free(c->pool);
    free(c->arr);
    free(c->keep);
    free(c);
  }
  free(be);
}

backend *backend_cpu_create(int n_threads) {
  backend_options o = {.n_threads = n_threads};
  return backend_cpu_create_opt(&o);
}

backend *backend_cpu_create_opt(const backend_options *opt) {
  int n_threads = opt->n_threads;
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  backend *be = calloc(1, sizeof *be);
  cpu_ctx *c = calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    return NULL;
  }
  c->pool = cpu_pool_create(n_threads);
  if (!c->pool) {
    free(be);
    free(c);
    return NULL;
  }
  be->name = "cpu";
  be->ctx = c;
  c->kv_fp8 = opt->kv_dtype == BACKEND_KV_FP8_E4M3;
  for (int i = 0; i < 256; i++) c->e4m3[i] = dtype_e4m3_to_f32((uint8_t)i);
  be->destroy = cpu_destroy;
  be->kind_size = cpu_kind_size;
  be->kv_page_bytes = cpu_kv_page_bytes;
  be->alloc = cpu_alloc;
  be->free = cpu_free;
  be->write = cpu_write;
  be->read = cpu_read;
  be->read_start = cpu_read_start;
  be->read_wait = cpu_read_wait;
  be->write_start = cpu_write; /* ops run as issued */
  be->copy = cpu_copy;
  be->zero = cpu_zero;
  be->weight_upload = cpu_weight_upload;
  be->weight_free = cpu_weight_free;
  be->weight_bytes = cpu_weight_bytes;
  be->set_batch = cpu_set_batch;
  be->sync = cpu_sync;
  be->embed = cpu_embed;
  be->rmsnorm = cpu_rmsnorm;
  be->add = cpu_add;
  be->matmul = cpu_matmul;
  be->qk_norm_rope = cpu_qk_norm_rope;
  be->attention = cpu_attention;
  be->sigmoid_mul = cpu_sigmoid_mul;
  be->swiglu = cpu_swiglu;
  be->moe = cpu_moe;
  be->conv1d = cpu_conv1d;
  be->gdn_gates = cpu_gdn_gates;
  be->gdn_prefill = cpu_gdn_prefill;
  be->gdn_decode = cpu_gdn_decode;
  be->gated_rmsnorm = cpu_gated_rmsnorm;
  be->logits = cpu_logits;
  be->argmax = cpu_argmax;
  be->sample = cpu_sample;
  be->set_keep = cpu_set_keep;
  return be;
}

backend *backend_cpu_create_rank(const backend_options *opt, comm *cm, int rank) {
  CHECK(rank >= 0 && rank < comm_size(cm));
  backend *be = backend_cpu_create_opt(opt);
  if (!be) return NULL;
  cpu_ctx *c = ctx_of(be);
  c->comm = comm_ref(cm);
  c->rank = rank;
  be->all_reduce_sum = cpu_all_reduce_sum;
  be->all_gather = cpu_all_gather;
  return be;
}
