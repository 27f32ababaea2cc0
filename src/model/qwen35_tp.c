/* qwen35_tp — see qwen35_tp.h: the table there is the whole of the sharding; this file carries it
 * out (the checks, the rank's config, the rank's slices of each tensor) and runs the ranks. */
#include "model/qwen35_tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* The KV heads rank r holds: split when there are at least as many as ranks, else the one its q
 * heads read (replicated over the N / nkv ranks of its group). */
static void kv_heads(const model_config *c, int n, int r, int *first, int *count) {
  int nkv = c->n_kv_heads;
  if (nkv >= n) {
    *count = nkv / n;
    *first = r * *count;
  } else {
    *count = 1;
    *first = r / (n / nkv);
  }
}

int qwen35_tp_check(const model_config *c, int n, char *err, size_t errlen) {
  if (n < 1) return errf(err, errlen, "--tensor-parallel-size %d: at least 1", n);
  if (n == 1) return 0;
  int full = config_n_full_layers(c) > 0, lin = config_n_linear_layers(c) > 0, dense = 0, moe = 0;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->layer_is_moe[i])
      moe = 1;
    else
      dense = 1;
  }
  const char *what = NULL;
  int size = 0;
  if (full && c->n_heads % n) {
    what = "the attention heads";
    size = c->n_heads;
  } else if (full && c->n_kv_heads % n && (c->n_kv_heads < 1 || n % c->n_kv_heads)) {
    return errf(err, errlen,
                "--tensor-parallel-size %d: the KV heads (%d) are neither a multiple of it nor "
                "a divisor of it (they are split, or replicated when fewer than the ranks)",
                n, c->n_kv_heads);
  } else if (lin && c->lin_n_k_heads % n) {
    what = "the DeltaNet key heads";
    size = c->lin_n_k_heads;
  } else if (lin && c->lin_n_v_heads % n) {
    what = "the DeltaNet value heads";
    size = c->lin_n_v_heads;
  } else if (dense && c->intermediate_size % n) {
    what = "the intermediate size";
    size = c->intermediate_size;
  } else if (moe && c->moe_intermediate_size % n) {
    what = "the experts' intermediate size";
    size = c->moe_intermediate_size;
  } else if (moe && c->shared_expert_intermediate_size % n) {
    what = "the shared expert's intermediate size";
    size = c->shared_expert_intermediate_size;
  }
  if (what)
    return errf(err, errlen, "--tensor-parallel-size %d does not divide %s (%d)", n, what, size);
  return 0;
}

void qwen35_tp_config(const model_config *c, int n, int r, model_config *out) {
  *out = *c;
  if (n <= 1) return;
  out->n_heads = c->n_heads / n;
  if (c->n_kv_heads >= 1) {
    int first;
    kv_heads(c, n, r, &first, &out->n_kv_heads);
  }
  out->lin_n_k_heads = c->lin_n_k_heads / n;
  out->lin_n_v_heads = c->lin_n_v_heads / n;
  out->conv_dim =
      2 * out->lin_n_k_heads * c->lin_k_head_dim + out->lin_n_v_heads * c->lin_v_head_dim;
  out->intermediate_size = c->intermediate_size / n;
  out->moe_intermediate_size = c->moe_intermediate_size / n;
  out->shared_expert_intermediate_size = c->shared_expert_intermediate_size / n;
  out->mtp_layers = 0;
}

void qwen35_tp_vocab(const model_config *c, int n, int r, int *first, int *count, int *width) {
  int V = c->vocab_size;
  *width = (V + n - 1) / n;
  *first = r * *width;
  *count = V - *first < *width ? V - *first : *width;
  if (*count < 0) *count = 0;
}

/* ---- slicing ---- */

static void *own(qwen35_tp_shard *s, size_t bytes) {
  if (s->n_owned == s->cap_owned) {
    int cap = s->cap_owned ? 2 * s->cap_owned : 64;
    void **o = realloc(s->owned, (size_t)cap * sizeof *o);
    if (!o) return NULL;
    s->owned = o;
    s->cap_owned = cap;
  }
  void *p = calloc(1, bytes ? bytes : 1);
  if (p) s->owned[s->n_owned++] = p;
  return p;
}

/* 1 when the rows of the FP8 matrix t in the nr ranges rr and the columns from c0 keep t's
 * blocks whole: every range starts on a block row of t and at a block row of
 * the slice, and c0 on a block column, so each block of the slice is part of one block of t. */
static int fp8_whole_blocks(const tensor *t, int nr, const int64_t *rr, int64_t c0) {
  int bn = t->block_n, bk = t->block_k;
  if (t->ndim != 2 || bn < 1 || bk < 1 || c0 % bk) return 0;
  int64_t o = 0;
  for (int k = 0; k < nr; k++) {
    if ((t->row0 + rr[2 * k]) % bn || o % bn) return 0;
    o += rr[2 * k + 1] - rr[2 * k];
  }
  return 1;
}

/* The scales of an FP8 slice with whole blocks (fp8_whole_blocks): sc [ceil(rows / bn), scols],
 * each block's scale as t has it. */
static void fp8_slice_scales(const tensor *t, int nr, const int64_t *rr, int64_t c0, int64_t scols,
                             float *sc) {
  int bn = t->block_n, bk = t->block_k;
  int64_t o = 0, b = 0;
  for (int k = 0; k < nr; k++) {
    for (; b * bn < o + (rr[2 * k + 1] - rr[2 * k]); b++) {
      int64_t src_b = (t->row0 + rr[2 * k] + (b * bn - o)) / bn;
      memcpy(sc + b * scols,
             (const char *)t->scale + (size_t)(src_b * t->scale_cols + c0 / bk) * sizeof(float),
             (size_t)scols * sizeof(float));
    }
    o += rr[2 * k + 1] - rr[2 * k];
  }
}

/* out = the rows of t in the nr ranges rr[2k] .. rr[2k+1] (in order), columns [c0, c1) (c1 < 0:
 * all), of t as a matrix [shape[0], numel / shape[0]] (a 1-D tensor: its elements are rows). A
 * view when that is one contiguous range of whole rows of a non-FP8 tensor, else a copy. An FP8
 * slice stays FP8 (its bytes and its blocks' scales) when keep8 and it keeps t's blocks whole,
 * so that a backend's FP8 products take it as they take t; otherwise it becomes F32, each value
 * as tensor_get_f32 gives it. An absent tensor stays absent. */
static int take(qwen35_tp_shard *s, const tensor *t, int nr, const int64_t *rr, int64_t c0,
                int64_t c1, int keep8, tensor *out) {
  *out = *t;
  if (!t->data) return 0;
  int64_t R = t->shape[0], C = tensor_numel(t) / (R > 0 ? R : 1), rows = 0;
  if (c1 < 0) {
    c0 = 0;
    c1 = C;
  }
  for (int k = 0; k < nr; k++) {
    CHECK(rr[2 * k] >= 0 && rr[2 * k] <= rr[2 * k + 1] && rr[2 * k + 1] <= R);
    rows += rr[2 * k + 1] - rr[2 * k];
  }
  CHECK(c0 >= 0 && c0 <= c1 && c1 <= C);
  int fp8 = t->dt == DTYPE_F8_E4M3;
  keep8 = keep8 && fp8 && fp8_whole_blocks(t, nr, rr, c0);
  size_t ts = dtype_size(t->dt);
  if (!fp8 && nr == 1 && c0 == 0 && c1 == C) {
    out->data = (const char *)t->data + (size_t)(rr[0] * C) * ts;
    out->shape[0] = rows;
    return 0;
  }
  if (keep8) fp8 = 0; /* its bytes are copied as they are */
  dtype dt = fp8 ? DTYPE_F32 : t->dt;
  size_t es = dtype_size(dt);
  int64_t w = c1 - c0;
  char *d = own(s, (size_t)(rows * w) * es);
  if (!d) return -1;
  int64_t o = 0;
  for (int k = 0; k < nr; k++)
    for (int64_t row = rr[2 * k]; row < rr[2 * k + 1]; row++, o++) {
      char *dst = d + (size_t)(o * w) * es;
      if (fp8) {
        for (int64_t j = 0; j < w; j++) {
          float f = tensor_get_f32(t, row * C + c0 + j);
          memcpy(dst + (size_t)j * 4, &f, 4);
        }
      } else {
        memcpy(dst, (const char *)t->data + (size_t)(row * C + c0) * ts, (size_t)w * ts);
      }
    }
  memset(out, 0, sizeof *out);
  out->data = d;
  out->dt = dt;
  out->ndim = t->ndim == 1 ? 1 : 2;
  out->shape[0] = rows;
  out->shape[1] = t->ndim == 1 ? 0 : w;
  if (keep8) {
    int64_t sr = (rows + t->block_n - 1) / t->block_n, scols = (w + t->block_k - 1) / t->block_k;
    float *sc = own(s, (size_t)(sr * scols) * sizeof *sc);
    if (!sc) return -1;
    fp8_slice_scales(t, nr, rr, c0, scols, sc);
    out->scale = sc;
    out->scale_cols = scols;
    out->block_n = t->block_n;
    out->block_k = t->block_k;
  }
  return 0;
}

/* Rows [a, b) (a column-parallel product's output rows, or a per-head vector's heads). */
static int take_rows(qwen35_tp_shard *s, const tensor *t, int64_t a, int64_t b, tensor *out) {
  int64_t rr[2] = {a, b};
  return take(s, t, 1, rr, 0, -1, 1, out);
}

/* Columns [a, b) of every row (a row-parallel product's input columns). */
static int take_cols(qwen35_tp_shard *s, const tensor *t, int64_t a, int64_t b, tensor *out) {
  int64_t rr[2] = {0, t->data ? t->shape[0] : 0};
  return take(s, t, 1, rr, a, b, 1, out);
}

/* Vocab rows [first, first + count) of t, then zero rows up to `rows` (a view when that is the
 * rows themselves of a non-FP8 tensor; FP8 becomes F32, as an upload of a vocabulary matrix
 * dequantizes it anyway). */
static int take_vocab(qwen35_tp_shard *s, const tensor *t, int64_t first, int64_t count,
                      int64_t rows, tensor *out) {
  if (count == 0) first = 0; /* a last rank past the end: zeros only */
  int64_t rr[2] = {first, first + count};
  if (take(s, t, 1, rr, 0, -1, 0, out)) return -1;
  if (count == rows) return 0;
  int64_t C = t->shape[1];
  size_t es = dtype_size(out->dt), have = (size_t)(count * C) * es;
  char *d = own(s, (size_t)(rows * C) * es); /* zeroed */
  if (!d) return -1;
  if (have) memcpy(d, out->data, have);
  out->data = d;
  out->shape[0] = rows;
  return 0;
}

static int shard_layer(qwen35_tp_shard *s, const model_config *c, const layer_weights *L, int n,
                       int r, layer_weights *D) {
  *D = *L; /* the replicated ones: norms, q_norm, k_norm, lin_norm, router, shared_expert_gate */
  D->experts = NULL;
  int rc = 0;
  if (L->q_proj.data) { /* full attention */
    int64_t hd = c->head_dim, nh = c->n_heads / n, q0 = (int64_t)r * nh;
    int k0, nk;
    kv_heads(c, n, r, &k0, &nk);
    rc |= take_rows(s, &L->q_proj, q0 * 2 * hd, (q0 + nh) * 2 * hd, &D->q_proj);
    rc |= take_rows(s, &L->k_proj, k0 * hd, (k0 + nk) * hd, &D->k_proj);
    rc |= take_rows(s, &L->v_proj, k0 * hd, (k0 + nk) * hd, &D->v_proj);
    rc |= take_cols(s, &L->o_proj, q0 * hd, (q0 + nh) * hd, &D->o_proj);
  }
  if (L->in_proj_qkv.data) { /* DeltaNet: whole key heads and value heads */
    int64_t dk = c->lin_k_head_dim, dv = c->lin_v_head_dim, nk = c->lin_n_k_heads,
            nv = c->lin_n_v_heads, rk = nk / n, rv = nv / n, k0 = r * rk, v0 = r * rv;
    int64_t qkv[6] = {k0 * dk,
                      (k0 + rk) * dk,
                      (nk + k0) * dk,
                      (nk + k0 + rk) * dk,
                      2 * nk * dk + v0 * dv,
                      2 * nk * dk + (v0 + rv) * dv};
    rc |= take(s, &L->in_proj_qkv, 3, qkv, 0, -1, 1, &D->in_proj_qkv);
    rc |= take(s, &L->conv1d, 3, qkv, 0, -1, 1, &D->conv1d);
    rc |= take_rows(s, &L->in_proj_z, v0 * dv, (v0 + rv) * dv, &D->in_proj_z);
    rc |= take_rows(s, &L->in_proj_b, v0, v0 + rv, &D->in_proj_b);
    rc |= take_rows(s, &L->in_proj_a, v0, v0 + rv, &D->in_proj_a);
    rc |= take_rows(s, &L->dt_bias, v0, v0 + rv, &D->dt_bias);
    rc |= take_rows(s, &L->A_log, v0, v0 + rv, &D->A_log);
    rc |= take_cols(s, &L->out_proj, v0 * dv, (v0 + rv) * dv, &D->out_proj);
  }
  /* dense FFN */
  int64_t I = c->intermediate_size / n, i0 = r * I;
  rc |= take_rows(s, &L->gate_proj, i0, i0 + I, &D->gate_proj);
  rc |= take_rows(s, &L->up_proj, i0, i0 + I, &D->up_proj);
  rc |= take_cols(s, &L->down_proj, i0, i0 + I, &D->down_proj);
  if (L->experts) { /* MoE: a slice of every expert's intermediate width */
    int64_t mi = c->moe_intermediate_size / n, m0 = r * mi;
    D->experts = own(s, (size_t)c->n_experts * sizeof *D->experts);
    if (!D->experts) return -1;
    for (int e = 0; e < c->n_experts; e++) {
      rc |= take_rows(s, &L->experts[e].gate, m0, m0 + mi, &D->experts[e].gate);
      rc |= take_rows(s, &L->experts[e].up, m0, m0 + mi, &D->experts[e].up);
      rc |= take_cols(s, &L->experts[e].down, m0, m0 + mi, &D->experts[e].down);
    }
    int64_t si = c->shared_expert_intermediate_size / n, s0 = r * si;
    rc |= take_rows(s, &L->shared_gate, s0, s0 + si, &D->shared_gate);
    rc |= take_rows(s, &L->shared_up, s0, s0 + si, &D->shared_up);
    rc |= take_cols(s, &L->shared_down, s0, s0 + si, &D->shared_down);
  }
  return rc ? -1 : 0;
}

int qwen35_tp_shard_init(qwen35_tp_shard *s, const model_config *c, const model_weights *w, int n,
                         int r, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  model_weights *o = &s->w;
  o->final_norm = w->final_norm;
  int first, count, width;
  qwen35_tp_vocab(c, n, r, &first, &count, &width);
  int rc = take_vocab(s, &w->embed, first, count, width + 1, &o->embed);
  if (c->tie_word_embeddings || w->lm_head.data == w->embed.data || !w->lm_head.data)
    o->lm_head = o->embed;
  else
    rc |= take_vocab(s, &w->lm_head, first, count, width, &o->lm_head);
  o->layers = own(s, (size_t)c->n_layers * sizeof *o->layers);
  if (!o->layers) rc = -1;
  for (int i = 0; i < c->n_layers && !rc; i++)
    rc = shard_layer(s, c, &w->layers[i], n, r, &o->layers[i]);
  if (rc) {
    qwen35_tp_shard_free(s);
    return errf(err, errlen, "out of memory for the weights of tensor-parallel rank %d", r);
  }
  return 0;
}

void qwen35_tp_shard_free(qwen35_tp_shard *s) {
  for (int k = 0; k < s->n_owned; k++) free(s->owned[k]);
  free(s->owned);
  memset(s, 0, sizeof *s);
}

/* ---- the ranks' threads ---- */

typedef struct rank_arg {
  qwen35_tp_runner *r;
  int rank;
} rank_arg;

struct qwen35_tp_runner {
  int n, started; /* ranks; threads running (ranks 1 .. started) */
  pthread_t *th;  /* [n] (th[0] unused: rank 0 is the caller's) */
  rank_arg *args; /* [n] */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  unsigned gen; /* steps issued */
  int pending;  /* threads still in the current step */
  int stop;     /* the threads return */
  void (*fn)(void *arg, int rank);
  void *arg;
};

static void *rank_thread(void *v) {
  rank_arg *a = v;
  qwen35_tp_runner *r = a->r;
  unsigned seen = 0;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->gen == seen) pthread_cond_wait(&r->go, &r->mu);
    if (r->stop) break;
    seen = r->gen;
    void (*fn)(void *, int) = r->fn;
    void *arg = r->arg;
    pthread_mutex_unlock(&r->mu);
    fn(arg, a->rank);
    pthread_mutex_lock(&r->mu);
    if (--r->pending == 0) pthread_cond_signal(&r->done);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

void qwen35_tp_runner_free(qwen35_tp_runner *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->go);
  pthread_mutex_unlock(&r->mu);
  for (int k = 1; k <= r->started; k++) pthread_join(r->th[k], NULL);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->go);
  pthread_cond_destroy(&r->done);
  free(r->th);
  free(r->args);
  free(r);
}

int qwen35_tp_runner_init(qwen35_tp_runner **out, int n, char *err, size_t errlen) {
  *out = NULL;
  qwen35_tp_runner *r = calloc(1, sizeof *r);
  if (!r) return errf(err, errlen, "out of memory");
  r->n = n;
  r->th = calloc((size_t)n, sizeof *r->th);
  r->args = calloc((size_t)n, sizeof *r->args);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->go, NULL);
  pthread_cond_init(&r->done, NULL);
  if (!r->th || !r->args) {
    qwen35_tp_runner_free(r);
    return errf(err, errlen, "out of memory");
  }
  for (int k = 1; k < n; k++) {
    r->args[k] = (rank_arg){r, k};
    if (pthread_create(&r->th[k], NULL, rank_thread, &r->args[k])) {
      qwen35_tp_runner_free(r);
      return errf(err, errlen, "cannot start the thread of tensor-parallel rank %d", k);
    }
    r->started = k;
  }
  *out = r;
  return 0;
}

void qwen35_tp_run(qwen35_tp_runner *r, void (*fn)(void *arg, int rank), void *arg) {
  pthread_mutex_lock(&r->mu);
  r->fn = fn;
  r->arg = arg;
  r->pending = r->n - 1;
  r->gen++;
  pthread_cond_broadcast(&r->go);
  pthread_mutex_unlock(&r->mu);
  fn(arg, 0);
  pthread_mutex_lock(&r->mu);
  while (r->pending > 0) pthread_cond_wait(&r->done, &r->mu);
  pthread_mutex_unlock(&r->mu);
}
