/* qwen35 — the forward pass over a batch of sequences, written once against the backend op
 * table. See qwen35.h for the memory it owns (KV page pools, recurrent-state slots) and the
 * numerics contract, qwen35-model.md §1–§3 for the math.
 *
 *   x = embed(tokens)                                        [T, H]
 *   for each layer:
 *     xn = Norm_in(x)              (the previous layer's FFN output added into x first)
 *     mix = Attention(xn) | DeltaNet(xn)
 *     xn = Norm_post(x += mix)
 *     ffn = SwiGLU(xn) | MoE(xn)
 *   x += ffn;  logits = lm_head(Norm_final(x))  for the rows asked for
 *
 * Device memory, all through the backend:
 *   per full-attention layer  k_pool, v_pool   KV  [n_pages, 16, nkv, hd]
 *   per DeltaNet layer        conv             F32 [n_slots, conv_dim, K-1]
 *                             ssm              F32 [n_slots, nv, dk, dv]
 *   scratch activations sized for `cap` rows (grown when a step is larger). */
#include "model/qwen35.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "model/fp8.h"
#include "model/qwen35_tp.h"
#include "sampler/sample_rule.h"

_Static_assert(QWEN35_SAMPLE_ROW_WORDS ==
                   SAMPLE_RULE_WORDS + SAMPLE_RULE_EDIT_WORDS * SAMPLE_RULE_EDITS_MAX,
               "a sampled row's words");

typedef struct q_layer {
  backend_weight input_norm, post_norm;
  /* attention */
  backend_weight q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  backend_buf k_pool, v_pool;
  /* DeltaNet */
  backend_weight in_qkv, in_z, in_b, in_a, conv1d, dt_bias, A_log, lin_norm, out_proj;
  backend_buf conv, ssm;
  /* FFN */
  backend_weight gate, up, down;
  backend_moe moe;
  backend_weight *experts; /* [3*E]: gate[E], up[E], down[E] */
} q_layer;

struct qwen35 {
  const model_config *c;
  backend *be;
  int n_pages, n_slots;
  int keep_k, keep_lanes;                    /* keep slots after the n_slots (qwen35_mem_opts) */
  int n_keep;                                /* keep_k * keep_lanes */
  backend_weight embed, final_norm, lm_head; /* lm_head == embed when tied */
  q_layer *L;
  size_t weight_bytes;
  /* scratch, [cap, width] */
  int cap, logits_cap;
  backend_buf x, xn, mix, qg, q, gate, k, v, att, qkv, conv_out, z, bb, aa, beta, g, o, fg, fu;
  backend_buf logits;  /* F32 [logits_cap, V] */
  backend_buf ids;     /* I32 [logits_cap]: the greedy or sampled step's token ids (when be->argmax
                          or be->sample) */
  backend_buf sparams; /* I32 [logits_cap * QWEN35_SAMPLE_ROW_WORDS]: a sampled step's words */
  /* qwen35_sample_start's host copies of the words (host_alloc memory, used in turn: a step's
   * copy is read by the device after the call returned, while the next step's is written) */
  int32_t *sstage[2];
  size_t sstage_cap; /* words, each */
  int sstage_k;      /* the one the next call writes */
  /* the last issued step's shape (step_key): a step of the same shape issues the same ops */
  int key[8], key_set;
  unsigned bufs_gen;   /* bumped when scratch or logits buffers are reallocated */
  int n_packed;        /* weights with a packed copy (qwen35_mem_opts.packed) */
  size_t packed_bytes; /* ... the copies' bytes (in weight_bytes too) */
  size_t packed_over;  /* ... and the weights' own bytes */
  int n_fp8;           /* FP8 weights, dequantized at upload */
  int n_fp8_kept;      /* FP8 weights the backend keeps as FP8 (weight_upload_fp8) */
  /* tensor parallelism (qwen35_tp.h): every rank is a model of its own over its shard (c is the
   * shard's config); rank 0's is the one callers hold, and it issues every step and state
   * operation on the others too */
  int tp_rank, tp_size;       /* 0 and 1 without tensor parallelism */
  qwen35 **ranks;             /* rank 0: [tp_size] the ranks' models (ranks[0] == m) */
  model_config *tp_cfg;       /* rank 0: [tp_size] the ranks' configs, owned */
  const model_config *full_c; /* rank 0: the whole model's config (qwen35_config) */
  qwen35_tp_runner *runner;   /* rank 0: the other ranks' threads */
  /* the rank's vocabulary (qwen35_tp_vocab; the whole of it without tensor parallelism) */
  int vocab_first, vocab_count, vocab_width;
  int lm_rows;         /* the lm-head's rows (vocab_width, + 1 when it is the embedding) */
  backend_buf lm_part; /* F32 [logits_cap, lm_rows]: this rank's logit columns */
  backend_buf lm_all;  /* F32 [tp_size, logits_cap, lm_rows]: every rank's, gathered */
};

/* The other ranks of a tensor-parallel model (none otherwise). */
#define FOR_PEERS(m, r) for (int r = 1; (m)->ranks && r < (m)->tp_size; r++)

/* The calling thread's next backend calls reach m's device (backend.h bind): a function that
 * calls a peer's backend binds the peer (peer) and binds rank 0 again before it returns. */
static void bind(const qwen35 *m) {
  if (m->be->bind) m->be->bind(m->be);
}

static qwen35 *peer(qwen35 *m, int r) {
  bind(m->ranks[r]);
  return m->ranks[r];
}

/* ---- init ---- */

/* upload_as's `exact` for a dense layer's product weight (given to matmul only): an FP8 one
 * stays FP8 where the backend has weight_upload_fp8 */
#define UPLOAD_PRODUCT 2

/* 1 when the FP8 tensor t, a product's matrix cols wide, can stay FP8 on be (weight_upload_fp8;
 * its scales copied out of the stored matrix's: the view's rows start on a block row). */
static int fp8_keepable(const backend *be, const tensor *t, int64_t cols) {
  int bn = t->block_n, bk = t->block_k;
  return t->data && t->dt == DTYPE_F8_E4M3 && be->weight_upload_fp8 && t->ndim == 2 &&
         t->shape[1] == cols && bn >= 1 && bk >= 1 && t->row0 % bn == 0 &&
         t->scale_cols >= fp8_scale_cols(cols, bk);
}

/* 1 when layer L's routed experts stay FP8 on be: every one of the 3E matrices keepable, all
 * with one block shape (the backend's MoE op takes the experts of a layer in one format);
 * else all are dequantized. */
static int experts_fp8(const backend *be, const model_config *c, const layer_weights *L) {
  int E = c->n_experts;
  int64_t H = c->hidden_size, I = c->moe_intermediate_size;
  if (!L->experts || E < 1) return 0;
  const tensor *t0 = &L->experts[0].gate;
  for (int e = 0; e < E; e++) {
    const tensor *ts[3] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
    for (int k = 0; k < 3; k++)
      if (!fp8_keepable(be, ts[k], k < 2 ? H : I) || ts[k]->block_n != t0->block_n ||
          ts[k]->block_k != t0->block_k)
        return 0;
  }
  return 1;
}

/* 1 when layer L's shared expert stays FP8 on be: its routed experts do, and its three
 * matrices are keepable with one block shape. */
static int shared_fp8(const backend *be, const model_config *c, const layer_weights *L) {
  int64_t H = c->hidden_size, Is = c->shared_expert_intermediate_size;
  const tensor *g = &L->shared_gate, *u = &L->shared_up, *d = &L->shared_down;
  return Is > 0 && experts_fp8(be, c, L) && fp8_keepable(be, g, H) && fp8_keepable(be, u, H) &&
         fp8_keepable(be, d, Is) && u->block_n == g->block_n && u->block_k == g->block_k &&
         d->block_n == g->block_n && d->block_k == g->block_k;
}

/* An FP8 product weight through weight_upload_fp8 (fp8_keepable). 1 when taken (*out set, NULL
 * when out of device memory), 0 when the weight must be dequantized, -1 when out of host memory. */
static int upload_fp8(qwen35 *m, const tensor *t, int64_t rows, int64_t cols, backend_weight *out) {
  int bn = t->block_n, bk = t->block_k;
  if (!fp8_keepable(m->be, t, cols)) return 0;
  int64_t sr = fp8_scale_rows(rows, bn), sc = fp8_scale_cols(cols, bk);
  float *s = malloc((size_t)(sr * sc) * sizeof *s);
  if (!s) return -1;
  for (int64_t r = 0; r < sr; r++)
    memcpy(s + r * sc, (const char *)t->scale + (size_t)((t->row0 / bn + r) * t->scale_cols) * 4,
           (size_t)sc * 4);
  *out = m->be->weight_upload_fp8(m->be, t->data, s, rows, cols, bn, bk);
  free(s);
  m->n_fp8_kept++;
  return 1;
}

static int upload_as(qwen35 *m, const tensor *t, int64_t rows, int64_t cols, const char *what,
                     int layer, int exact, backend_weight *out, char *err, size_t errlen) {
  if (!t->data) return errf(err, errlen, "layer %d: missing tensor %s", layer, what);
  if (tensor_numel(t) != rows * cols)
    return errf(err, errlen, "layer %d: tensor %s has %lld values, expected %lld", layer, what,
                (long long)tensor_numel(t), (long long)(rows * cols));
  int kept =
      t->dt == DTYPE_F8_E4M3 && exact == UPLOAD_PRODUCT ? upload_fp8(m, t, rows, cols, out) : 0;
  if (kept < 0) return errf(err, errlen, "out of memory uploading %s", what);
  if (kept) {
    if (!*out) return errf(err, errlen, "out of device memory uploading %s", what);
    m->weight_bytes += m->be->weight_bytes(m->be, *out);
    return 0;
  }
  /* any other FP8 weight (model/fp8.h) gets the exact fp32 dequantization, converted as the
   * backend converts any weight (the CPU backend keeps it) */
  const void *data = t->data;
  dtype dt = t->dt;
  float *deq = NULL;
  if (dt == DTYPE_F8_E4M3) {
    deq = malloc((size_t)(rows * cols) * sizeof *deq);
    if (!deq) return errf(err, errlen, "out of memory dequantizing %s", what);
    fp8_dequantize(t, 0, t->shape[0], deq);
    data = deq;
    dt = DTYPE_F32;
    m->n_fp8++;
  }
  *out = exact == 1 && m->be->weight_upload_exact
             ? m->be->weight_upload_exact(m->be, data, dt, rows, cols)
             : m->be->weight_upload(m->be, data, dt, rows, cols);
  free(deq);
  if (!*out) return errf(err, errlen, "out of device memory uploading %s", what);
  m->weight_bytes += m->be->weight_bytes(m->be, *out);
  return 0;
}

static int upload(qwen35 *m, const tensor *t, int64_t rows, int64_t cols, const char *what,
                  int layer, backend_weight *out, char *err, size_t errlen) {
  return upload_as(m, t, rows, cols, what, layer, 0, out, err, errlen);
}

static int upload_product(qwen35 *m, const tensor *t, int64_t rows, int64_t cols, const char *what,
                          int layer, backend_weight *out, char *err, size_t errlen) {
  return upload_as(m, t, rows, cols, what, layer, UPLOAD_PRODUCT, out, err, errlen);
}

static int alloc_buf(qwen35 *m, backend_buf *b, backend_kind kind, size_t n, char *err,
                     size_t errlen) {
  *b = m->be->alloc(m->be, kind, n);
  if (!*b) return errf(err, errlen, "out of device memory (%zu elements)", n);
  return 0;
}

static void free_scratch(qwen35 *m) {
  backend *be = m->be;
  backend_buf *bufs[] = {&m->x,    &m->xn,  &m->mix, &m->qg,       &m->q, &m->gate, &m->k,
                         &m->v,    &m->att, &m->qkv, &m->conv_out, &m->z, &m->bb,   &m->aa,
                         &m->beta, &m->g,   &m->o,   &m->fg,       &m->fu};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    be->free(be, *bufs[i]);
    *bufs[i] = NULL;
  }
  m->cap = 0;
}

static int ensure_scratch(qwen35 *m, int T, char *err, size_t errlen) {
  if (T <= m->cap) return 0;
  free_scratch(m);
  const model_config *c = m->c;
  size_t n = (size_t)T;
  size_t H = (size_t)c->hidden_size, nhd = (size_t)c->n_heads * c->head_dim;
  size_t kvd = (size_t)c->n_kv_heads * c->head_dim,
         vd = (size_t)c->lin_n_v_heads * c->lin_v_head_dim;
  size_t I = (size_t)c->intermediate_size;
  if (I < 1) I = 1;
  int rc = 0;
  rc |= alloc_buf(m, &m->x, BACKEND_KIND_ACT, n * H, err, errlen);
  rc |= alloc_buf(m, &m->xn, BACKEND_KIND_ACT, n * H, err, errlen);
  rc |= alloc_buf(m, &m->mix, BACKEND_KIND_ACT, n * H, err, errlen);
  rc |= alloc_buf(m, &m->qg, BACKEND_KIND_ACT, n * 2 * nhd, err, errlen);
  rc |= alloc_buf(m, &m->q, BACKEND_KIND_ACT, n * nhd, err, errlen);
  rc |= alloc_buf(m, &m->gate, BACKEND_KIND_ACT, n * nhd, err, errlen);
  rc |= alloc_buf(m, &m->k, BACKEND_KIND_ACT, n * kvd, err, errlen);
  rc |= alloc_buf(m, &m->v, BACKEND_KIND_ACT, n * kvd, err, errlen);
  rc |= alloc_buf(m, &m->att, BACKEND_KIND_ACT, n * nhd, err, errlen);
  rc |= alloc_buf(m, &m->qkv, BACKEND_KIND_ACT, n * (size_t)c->conv_dim, err, errlen);
  rc |= alloc_buf(m, &m->conv_out, BACKEND_KIND_ACT, n * (size_t)c->conv_dim, err, errlen);
  rc |= alloc_buf(m, &m->z, BACKEND_KIND_ACT, n * vd, err, errlen);
  rc |= alloc_buf(m, &m->bb, BACKEND_KIND_ACT, n * (size_t)c->lin_n_v_heads, err, errlen);
  rc |= alloc_buf(m, &m->aa, BACKEND_KIND_ACT, n * (size_t)c->lin_n_v_heads, err, errlen);
  rc |= alloc_buf(m, &m->beta, BACKEND_KIND_F32, n * (size_t)c->lin_n_v_heads, err, errlen);
  rc |= alloc_buf(m, &m->g, BACKEND_KIND_F32, n * (size_t)c->lin_n_v_heads, err, errlen);
  rc |= alloc_buf(m, &m->o, BACKEND_KIND_ACT, n * vd, err, errlen);
  rc |= alloc_buf(m, &m->fg, BACKEND_KIND_ACT, n * I, err, errlen);
  rc |= alloc_buf(m, &m->fu, BACKEND_KIND_ACT, n * I, err, errlen);
  if (rc) {
    free_scratch(m);
    return -1;
  }
  m->cap = T;
  m->bufs_gen++;
  return 0;
}

static void free_logits(qwen35 *m) {
  backend_buf *bs[] = {&m->logits, &m->ids, &m->sparams, &m->lm_part, &m->lm_all};
  for (size_t k = 0; k < sizeof bs / sizeof *bs; k++) {
    m->be->free(m->be, *bs[k]);
    *bs[k] = NULL;
  }
  m->logits_cap = 0;
}

static int ensure_logits(qwen35 *m, int n, char *err, size_t errlen) {
  if (n <= m->logits_cap) return 0;
  free_logits(m);
  backend *be = m->be;
  /* a rank > 0 makes no logits of its own: it gathers its columns to the others */
  int rc = alloc_buf(m, &m->logits, BACKEND_KIND_F32,
                     (size_t)(m->tp_rank > 0 ? 1 : n) * m->c->vocab_size, err, errlen);
  if (!rc && (be->argmax || be->sample))
    rc = alloc_buf(m, &m->ids, BACKEND_KIND_I32, (size_t)n, err, errlen);
  if (!rc && be->sample)
    rc = alloc_buf(m, &m->sparams, BACKEND_KIND_I32, (size_t)n * QWEN35_SAMPLE_ROW_WORDS, err,
                   errlen);
  if (!rc && m->tp_size > 1) {
    size_t part = (size_t)n * m->lm_rows;
    rc = alloc_buf(m, &m->lm_part, BACKEND_KIND_F32, part, err, errlen);
    if (!rc) rc = alloc_buf(m, &m->lm_all, BACKEND_KIND_F32, part * m->tp_size, err, errlen);
  }
  if (rc) {
    free_logits(m);
    return -1;
  }
  m->logits_cap = n;
  m->bufs_gen++;
  return 0;
}

static size_t conv_elems(const model_config *c) {
  return (size_t)c->conv_dim * (size_t)(c->conv_kernel - 1);
}
static size_t ssm_elems(const model_config *c) {
  return (size_t)c->lin_n_v_heads * c->lin_k_head_dim * c->lin_v_head_dim;
}

static int init_layer(qwen35 *m, int i, const layer_weights *lw, char *err, size_t errlen) {
  const model_config *c = m->c;
  q_layer *L = &m->L[i];
  int64_t H = c->hidden_size;
  if (upload(m, &lw->input_norm, 1, H, "input_layernorm", i, &L->input_norm, err, errlen) ||
      upload(m, &lw->post_norm, 1, H, "post_attention_layernorm", i, &L->post_norm, err, errlen))
    return -1;
  if (c->layer_types[i] == LAYER_KIND_FULL) {
    int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    if (upload_product(m, &lw->q_proj, nh * 2 * hd, H, "q_proj", i, &L->q_proj, err, errlen) ||
        upload_product(m, &lw->k_proj, nkv * hd, H, "k_proj", i, &L->k_proj, err, errlen) ||
        upload_product(m, &lw->v_proj, nkv * hd, H, "v_proj", i, &L->v_proj, err, errlen) ||
        upload_product(m, &lw->o_proj, H, nh * hd, "o_proj", i, &L->o_proj, err, errlen) ||
        upload(m, &lw->q_norm, 1, hd, "q_norm", i, &L->q_norm, err, errlen) ||
        upload(m, &lw->k_norm, 1, hd, "k_norm", i, &L->k_norm, err, errlen))
      return -1;
    size_t n = (size_t)m->n_pages * backend_kv_page_bytes(m->be, c->n_kv_heads, c->head_dim) /
               m->be->kind_size(m->be, BACKEND_KIND_KV);
    if (alloc_buf(m, &L->k_pool, BACKEND_KIND_KV, n, err, errlen) ||
        alloc_buf(m, &L->v_pool, BACKEND_KIND_KV, n, err, errlen))
      return -1;
  } else {
    int64_t nk = c->lin_n_k_heads, nv = c->lin_n_v_heads, dk = c->lin_k_head_dim,
            dv = c->lin_v_head_dim, cd = c->conv_dim;
    if (upload_product(m, &lw->in_proj_qkv, cd, H, "in_proj_qkv", i, &L->in_qkv, err, errlen) ||
        upload_product(m, &lw->in_proj_z, nv * dv, H, "in_proj_z", i, &L->in_z, err, errlen) ||
        upload_product(m, &lw->in_proj_b, nv, H, "in_proj_b", i, &L->in_b, err, errlen) ||
        upload_product(m, &lw->in_proj_a, nv, H, "in_proj_a", i, &L->in_a, err, errlen) ||
        upload(m, &lw->conv1d, cd, c->conv_kernel, "conv1d", i, &L->conv1d, err, errlen) ||
        upload(m, &lw->dt_bias, 1, nv, "dt_bias", i, &L->dt_bias, err, errlen) ||
        upload(m, &lw->A_log, 1, nv, "A_log", i, &L->A_log, err, errlen) ||
        upload(m, &lw->lin_norm, 1, dv, "linear_attn.norm", i, &L->lin_norm, err, errlen) ||
        upload_product(m, &lw->out_proj, H, nv * dv, "out_proj", i, &L->out_proj, err, errlen))
      return -1;
    (void)nk;
    (void)dk;
    size_t ns = (size_t)m->n_slots + (size_t)m->n_keep;
    if (alloc_buf(m, &L->conv, BACKEND_KIND_F32, ns * conv_elems(c), err, errlen) ||
        alloc_buf(m, &L->ssm, BACKEND_KIND_F32, ns * ssm_elems(c), err, errlen))
      return -1;
    m->be->zero(m->be, L->conv, 0, ns * conv_elems(c) * 4);
    m->be->zero(m->be, L->ssm, 0, ns * ssm_elems(c) * 4);
  }
  if (c->layer_is_moe[i]) {
    int E = c->n_experts, I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
    L->experts = calloc((size_t)3 * E, sizeof *L->experts);
    if (!L->experts) return errf(err, errlen, "out of memory");
    if (upload_as(m, &lw->router, E, H, "mlp.gate", i, 1, &L->moe.router, err, errlen)) return -1;
    /* FP8 experts stay FP8 where the backend keeps FP8 products (all of the layer's or none) */
    int ex = experts_fp8(m->be, c, lw) ? UPLOAD_PRODUCT : 0,
        sx = shared_fp8(m->be, c, lw) ? UPLOAD_PRODUCT : 0;
    for (int e = 0; e < E; e++)
      if (upload_as(m, &lw->experts[e].gate, I, H, "expert gate_proj", i, ex, &L->experts[e], err,
                    errlen) ||
          upload_as(m, &lw->experts[e].up, I, H, "expert up_proj", i, ex, &L->experts[E + e], err,
                    errlen) ||
          upload_as(m, &lw->experts[e].down, H, I, "expert down_proj", i, ex,
                    &L->experts[2 * E + e], err, errlen))
        return -1;
    L->moe.n_experts = E;
    L->moe.top_k = c->n_experts_per_tok;
    L->moe.norm_topk_prob = c->norm_topk_prob;
    L->moe.inter = I;
    L->moe.shared_inter = Is;
    L->moe.gate = L->experts;
    L->moe.up = L->experts + E;
    L->moe.down = L->experts + 2 * E;
    if (Is > 0 && (upload_as(m, &lw->shared_gate, Is, H, "shared_expert.gate_proj", i, sx,
                             &L->moe.shared_gate, err, errlen) ||
                   upload_as(m, &lw->shared_up, Is, H, "shared_expert.up_proj", i, sx,
                             &L->moe.shared_up, err, errlen) ||
                   upload_as(m, &lw->shared_down, H, Is, "shared_expert.down_proj", i, sx,
                             &L->moe.shared_down, err, errlen) ||
                   upload(m, &lw->shared_expert_gate, 1, H, "shared_expert_gate", i,
                          &L->moe.shared_expert_gate, err, errlen)))
      return -1;
  } else {
    int64_t I = c->intermediate_size;
    if (upload_product(m, &lw->gate_proj, I, H, "mlp.gate_proj", i, &L->gate, err, errlen) ||
        upload_product(m, &lw->up_proj, I, H, "mlp.up_proj", i, &L->up, err, errlen) ||
        upload_product(m, &lw->down_proj, H, I, "mlp.down_proj", i, &L->down, err, errlen))
      return -1;
  }
  return 0;
}

/* The dense layers' product weights, as layer_products lists them. */
#define QWEN35_PRODUCTS 9
static int layer_products(const q_layer *L, backend_weight *ws) {
  backend_weight all[QWEN35_PRODUCTS] = {L->q_proj, L->k_proj, L->v_proj, L->o_proj,  L->in_qkv,
                                         L->in_z,   L->in_b,   L->in_a,   L->out_proj};
  int n = 0;
  for (int k = 0; k < QWEN35_PRODUCTS; k++)
    if (all[k]) ws[n++] = all[k];
  return n;
}

/* Packed copies (backend weight_pack) of every product weight of the dense layers (of an FP8
 * one: its bf16 copy); out of device memory stops there (the rest stay as they are: the same
 * results, slower steps). */
static void pack_layers(qwen35 *m) {
  backend *be = m->be;
  if (!be->weight_pack) return;
  for (int i = 0; i < m->c->n_layers; i++) {
    const q_layer *L = &m->L[i];
    backend_weight ws[QWEN35_PRODUCTS + 3];
    int n = layer_products(L, ws);
    if (!m->c->layer_is_moe[i]) {
      ws[n++] = L->gate;
      ws[n++] = L->up;
      ws[n++] = L->down;
    }
    for (int k = 0; k < n; k++) {
      size_t own = be->weight_bytes(be, ws[k]);
      long long b = be->weight_pack(be, ws[k]);
      if (b < 0) {
        log_warn(
            "qwen35: out of device memory for the packed weight copies after %d of them: "
            "the rest stay unpacked",
            m->n_packed);
        return;
      }
      if (b > 0) {
        m->n_packed++;
        m->packed_bytes += (size_t)b;
        m->packed_over += own;
        m->weight_bytes += (size_t)b;
      }
    }
  }
  if (m->n_packed)
    log_info("qwen35: packed copies of %d product weights for decode steps, %.0f MiB", m->n_packed,
             (double)m->packed_bytes / 1048576.0);
}

/* The second copy weight_pack makes: the 12-bit packed copy of a bf16 weight, the bf16 copy of
 * an FP8 one (backend.h weight_pack). */
static double packed_tensor_bytes(const tensor *t) {
  if (!t->data || t->ndim != 2) return 0;
  int64_t rows = t->shape[0], cols = t->shape[1];
  if (t->dt == DTYPE_F8_E4M3) return 2.0 * (double)rows * (double)cols;
  if (cols % 512 || cols / 1024 > 24) return 0;
  return 1.5 * (double)rows * (double)cols + 4.0 * (double)rows;
}

double qwen35_packed_bytes(const model_config *c, const model_weights *w, double *fp8) {
  double b = 0;
  *fp8 = 0;
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *L = &w->layers[i];
    const tensor *ts[] = {&L->q_proj,      &L->k_proj,    &L->v_proj,    &L->o_proj,
                          &L->in_proj_qkv, &L->in_proj_z, &L->in_proj_b, &L->in_proj_a,
                          &L->out_proj,    &L->gate_proj, &L->up_proj,   &L->down_proj};
    size_t n = sizeof ts / sizeof *ts - (c->layer_is_moe[i] ? 3 : 0);
    for (size_t k = 0; k < n; k++) {
      double t = packed_tensor_bytes(ts[k]);
      b += t;
      if (ts[k]->dt == DTYPE_F8_E4M3) *fp8 += t;
    }
  }
  return b;
}

void qwen35_packed(const qwen35 *m, int *n, size_t *bytes, size_t *replaced) {
  *n = m->n_packed;
  *bytes = m->packed_bytes;
  *replaced = m->packed_over;
}

/* Device bytes of one checkpoint tensor once uploaded (exact: as weight_upload_exact). */
static double plan_tensor(backend *be, const tensor *t, int exact) {
  if (!t->data) return 0;
  int64_t rows = t->ndim > 1 ? t->shape[0] : 1;
  int64_t cols = rows > 0 ? tensor_numel(t) / rows : 0;
  if (be->weight_size) return (double)be->weight_size(be, rows, cols, exact);
  return (double)tensor_numel(t) * (double)be->kind_size(be, BACKEND_KIND_ACT);
}

/* The same for a dense layer's product weight (upload_product): an FP8 one the backend keeps as
 * FP8 takes its e4m3 bytes and scales. */
static double plan_product(backend *be, const tensor *t) {
  if (t->data && t->dt == DTYPE_F8_E4M3 && be->weight_upload_fp8 && t->ndim == 2 &&
      t->block_n > 0 && t->block_k > 0 && t->row0 % t->block_n == 0)
    return (double)tensor_numel(t) + 4.0 * (double)fp8_scale_rows(t->shape[0], t->block_n) *
                                         (double)fp8_scale_cols(t->shape[1], t->block_k);
  return plan_tensor(be, t, 0);
}

void qwen35_plan(const model_config *c, const model_weights *w, backend *be, qwen35_plan_bytes *b) {
  qwen35_plan_ranks(c, w, be, 1, b);
}

void qwen35_plan_ranks(const model_config *c, const model_weights *w, backend *be, int n,
                       qwen35_plan_bytes *b) {
  /* a split weight's share of a rank (qwen35_tp.h); KV heads fewer than the ranks: one each */
  double sp = 1.0 / n, kv = c->n_kv_heads >= n || c->n_kv_heads < 1 ? sp : 1.0 / c->n_kv_heads;
  double vocab = 1.0;
  if (n > 1) {
    int first, count, width;
    qwen35_tp_vocab(c, n, 0, &first, &count, &width);
    vocab = (double)(width + 1) / c->vocab_size;
  }
  double wb = vocab * plan_tensor(be, &w->embed, 0) + plan_tensor(be, &w->final_norm, 0);
  if (!c->tie_word_embeddings && w->lm_head.data && w->lm_head.data != w->embed.data)
    wb += vocab * plan_tensor(be, &w->lm_head, 0);
  for (int i = 0; i < c->n_layers; i++) {
    const layer_weights *L = &w->layers[i];
    const tensor *ts[] = {&L->input_norm, &L->post_norm, &L->q_norm,
                          &L->k_norm,     &L->lin_norm,  &L->shared_expert_gate};
    const tensor *ss[] = {&L->conv1d, &L->dt_bias, &L->A_log};
    const tensor *ps[] = {&L->q_proj,    &L->o_proj,    &L->in_proj_qkv, &L->in_proj_z,
                          &L->in_proj_b, &L->in_proj_a, &L->out_proj,    &L->gate_proj,
                          &L->up_proj,   &L->down_proj};
    for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) wb += plan_tensor(be, ts[k], 0);
    for (size_t k = 0; k < sizeof ss / sizeof *ss; k++) wb += sp * plan_tensor(be, ss[k], 0);
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) wb += sp * plan_product(be, ps[k]);
    wb += kv * (plan_product(be, &L->k_proj) + plan_product(be, &L->v_proj));
    wb += plan_tensor(be, &L->router, 1);
    /* the experts and the shared expert as init_layer uploads them (FP8 bytes where kept) */
    int moe = c->layer_is_moe[i], ex = moe && experts_fp8(be, c, L),
        sx = moe && shared_fp8(be, c, L);
    const tensor *sh[] = {&L->shared_gate, &L->shared_up, &L->shared_down};
    for (int k = 0; k < 3; k++)
      wb += sp * (sx ? plan_product(be, sh[k]) : plan_tensor(be, sh[k], 0));
    if (L->experts && moe)
      for (int e = 0; e < c->n_experts; e++) {
        const tensor *xs[] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
        for (int k = 0; k < 3; k++)
          wb += sp * (ex ? plan_product(be, xs[k]) : plan_tensor(be, xs[k], 0));
      }
  }
  /* the MTP head when loaded (MTP speculation; qwen35_mtp uploads every tensor as F32 and gives
   * its layers K/V pools of as many pages), whole on rank 0, with vocabulary copies of its own
   * when the ranks split the vocabulary */
  const mtp_weights *mt = &w->mtp;
  int n_mtp = mt->n_layers > 0 ? mt->n_layers : 0;
  if (n_mtp && n > 1) {
    wb += plan_tensor(be, &w->embed, 0);
    if (!c->tie_word_embeddings && w->lm_head.data && w->lm_head.data != w->embed.data)
      wb += plan_tensor(be, &w->lm_head, 0);
  }
  if (n_mtp) {
    wb += plan_tensor(be, &mt->fc, 0) + plan_tensor(be, &mt->pre_fc_norm_embedding, 0) +
          plan_tensor(be, &mt->pre_fc_norm_hidden, 0) + plan_tensor(be, &mt->norm, 0);
    for (int i = 0; i < n_mtp; i++) {
      const layer_weights *L = &mt->layers[i];
      const tensor *ts[] = {
          &L->input_norm,  &L->post_norm, &L->q_norm,      &L->k_norm,
          &L->q_proj,      &L->k_proj,    &L->v_proj,      &L->o_proj,
          &L->gate_proj,   &L->up_proj,   &L->down_proj,   &L->router,
          &L->shared_gate, &L->shared_up, &L->shared_down, &L->shared_expert_gate};
      for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) wb += plan_tensor(be, ts[k], 0);
      for (int e = 0; L->experts && e < c->n_experts; e++)
        wb += plan_tensor(be, &L->experts[e].gate, 0) + plan_tensor(be, &L->experts[e].up, 0) +
              plan_tensor(be, &L->experts[e].down, 0);
    }
  }
  b->weights = (size_t)wb;
  size_t act = be->kind_size(be, BACKEND_KIND_ACT);
  size_t mtp_page = (size_t)n_mtp * 2 * backend_kv_page_bytes(be, c->n_kv_heads, c->head_dim);
  model_config rc; /* rank 0's heads and widths: the pools and the scratch below are its */
  qwen35_tp_config(c, n, 0, &rc);
  const model_config *full = c;
  c = &rc;
  b->page =
      (size_t)config_n_full_layers(c) * 2 * backend_kv_page_bytes(be, c->n_kv_heads, c->head_dim) +
      mtp_page;
  b->slot = (size_t)config_n_linear_layers(c) * (conv_elems(c) + ssm_elems(c)) * 4;
  /* the scratch buffers of ensure_scratch, the FFN's at the wider of the dense and the routed
   * experts' widths */
  size_t H = (size_t)c->hidden_size, nhd = (size_t)c->n_heads * c->head_dim;
  size_t nkv = (size_t)c->n_kv_heads * c->head_dim;
  size_t vd = (size_t)c->lin_n_v_heads * c->lin_v_head_dim, nv = (size_t)c->lin_n_v_heads;
  size_t moe = (size_t)c->moe_intermediate_size * (size_t)c->n_experts_per_tok;
  size_t I = (size_t)c->intermediate_size > moe ? (size_t)c->intermediate_size : moe;
  b->token = (3 * H + 5 * nhd + 2 * nkv + 2 * (size_t)c->conv_dim + 2 * vd + 2 * nv + 2 * I) * act +
             2 * nv * 4;
  /* the MTP head's scratch rows (qwen35_mtp: it is fed every row of a step) */
  if (n_mtp) {
    size_t fnhd = (size_t)full->n_heads * full->head_dim,
           fnkv = (size_t)full->n_kv_heads * full->head_dim;
    size_t fmoe = (size_t)full->moe_intermediate_size * (size_t)full->n_experts_per_tok;
    size_t fI = (size_t)full->intermediate_size > fmoe ? (size_t)full->intermediate_size : fmoe;
    b->token += (7 * H + 5 * fnhd + 2 * fnkv + 2 * fI) * act + H * 4;
  }
}

/* qwen35_init of rank `rank` of n (w its shard, whose embedding and lm-head are its vocab rows,
 * qwen35_tp_vocab); n == 1: the whole model. */
static int init_rank(qwen35 **out, const model_config *c, const model_weights *w, backend *be,
                     const qwen35_mem_opts *o, int rank, int n, char *err, size_t errlen) {
  *out = NULL;
  if (c->n_layers < 1 || c->n_layers > CONFIG_MAX_LAYERS || c->hidden_size < 1)
    return errf(err, errlen, "unsupported config: %d layers, hidden size %d", c->n_layers,
                c->hidden_size);
  if (config_n_full_layers(c) > 0 && (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads ||
                                      c->rot_dim > c->head_dim || c->rot_dim % 2))
    return errf(err, errlen, "unsupported attention config (heads %d/%d, rot %d, head_dim %d)",
                c->n_heads, c->n_kv_heads, c->rot_dim, c->head_dim);
  if (config_n_linear_layers(c) > 0 &&
      (c->lin_n_k_heads < 1 || c->lin_n_v_heads % c->lin_n_k_heads || c->conv_kernel < 1 ||
       c->conv_dim !=
           2 * c->lin_n_k_heads * c->lin_k_head_dim + c->lin_n_v_heads * c->lin_v_head_dim))
    return errf(err, errlen, "unsupported linear-attention config (heads %d/%d)", c->lin_n_k_heads,
                c->lin_n_v_heads);
  if (o->n_pages < 1 || o->n_slots < 1)
    return errf(err, errlen, "need at least one KV page and one state slot");
  qwen35 *m = calloc(1, sizeof *m);
  if (!m) return errf(err, errlen, "out of memory");
  m->c = c;
  m->be = be;
  m->tp_rank = rank;
  m->tp_size = n;
  if (n > 1) {
    qwen35_tp_vocab(c, n, rank, &m->vocab_first, &m->vocab_count, &m->vocab_width);
  } else {
    m->vocab_count = m->vocab_width = c->vocab_size;
  }
  m->n_pages = o->n_pages;
  m->n_slots = o->n_slots;
  /* a backend without set_keep runs no verify piece: no keep slots taken there */
  if (o->keep_k > 0 && o->keep_lanes > 0 && be->set_keep) {
    m->keep_k = o->keep_k;
    m->keep_lanes = o->keep_lanes;
    m->n_keep = o->keep_k * o->keep_lanes;
  }
  m->L = calloc((size_t)c->n_layers, sizeof *m->L);
  if (!m->L) {
    free(m);
    return errf(err, errlen, "out of memory");
  }
  /* a rank's embedding has a zero row past its vocab rows: other ranks' tokens look it up */
  int64_t V = m->vocab_width, H = c->hidden_size;
  if (upload(m, &w->embed, V + (n > 1), H, "embed_tokens", -1, &m->embed, err, errlen) ||
      upload(m, &w->final_norm, 1, H, "norm", -1, &m->final_norm, err, errlen))
    goto fail;
  m->lm_rows = (int)V;
  if (c->tie_word_embeddings || w->lm_head.data == w->embed.data || !w->lm_head.data) {
    m->lm_head = m->embed;
    m->lm_rows = (int)V + (n > 1);
  } else if (upload(m, &w->lm_head, V, H, "lm_head", -1, &m->lm_head, err, errlen)) {
    goto fail;
  }
  for (int i = 0; i < c->n_layers; i++)
    if (init_layer(m, i, &w->layers[i], err, errlen)) goto fail;
  if (m->n_fp8_kept)
    log_info("qwen35: %d fp8 weights (the products and the MoE experts) stay fp8 on the %s backend",
             m->n_fp8_kept, be->name);
  if (m->n_fp8)
    log_info("qwen35: %d fp8 weights are dequantized to %s on the %s backend (%s)", m->n_fp8,
             !strcmp(be->name, "cpu") ? "fp32 (exactly)" : "bf16", be->name,
             be->weight_upload_fp8 ? "lm-head and the other weights its fp8 products do not take"
                                   : "no fp8 products there");
  if (o->packed) pack_layers(m);
  /* tensor-parallel greedy steps gather the logits and take argmax: no fused op, no screen */
  if (n == 1 && be->logits_argmax_prepare &&
      be->logits_argmax_prepare(be, m->lm_head, (int)H, (int)V, err, errlen))
    goto fail;
  if (ensure_scratch(m, 64, err, errlen) || ensure_logits(m, 1, err, errlen)) goto fail;
  *out = m;
  return 0;
fail:
  qwen35_free(m);
  return -1;
}

int qwen35_init(qwen35 **out, const model_config *c, const model_weights *w, backend *be,
                const qwen35_mem_opts *o, char *err, size_t errlen) {
  return init_rank(out, c, w, be, o, 0, 1, err, errlen);
}

int qwen35_init_ranks(qwen35 **out, const model_config *c, const model_weights *w,
                      backend *const *ranks, int n, const qwen35_mem_opts *o, char *err,
                      size_t errlen) {
  if (n <= 1) return qwen35_init(out, c, w, ranks[0], o, err, errlen);
  *out = NULL;
  if (qwen35_tp_check(c, n, err, errlen)) return -1;
  for (int r = 0; r < n; r++)
    if (!ranks[r]->all_reduce_sum || !ranks[r]->all_gather)
      return errf(err, errlen, "backend %s has no communicator between ranks", ranks[r]->name);
  model_config *cfg = calloc((size_t)n, sizeof *cfg);
  qwen35 **rm = calloc((size_t)n, sizeof *rm);
  if (!cfg || !rm) {
    free(cfg);
    free(rm);
    return errf(err, errlen, "out of memory");
  }
  int r = 0;
  for (; r < n; r++) {
    qwen35_tp_shard sh;
    qwen35_tp_config(c, n, r, &cfg[r]);
    if (qwen35_tp_shard_init(&sh, c, w, n, r, err, errlen)) break;
    if (ranks[r]->bind) ranks[r]->bind(ranks[r]);
    int rc = init_rank(&rm[r], &cfg[r], &sh.w, ranks[r], o, r, n, err, errlen);
    qwen35_tp_shard_free(&sh); /* the upload copied what it needs */
    if (rc) break;
  }
  if (ranks[0]->bind) ranks[0]->bind(ranks[0]);
  qwen35_tp_runner *runner = NULL;
  if (r < n || qwen35_tp_runner_init(&runner, n, err, errlen)) {
    for (int k = 0; k < n; k++) qwen35_free(rm[k]); /* NULL past the one that failed */
    free(rm);
    free(cfg);
    return -1;
  }
  rm[0]->runner = runner;
  rm[0]->ranks = rm;
  rm[0]->tp_cfg = cfg;
  rm[0]->full_c = c;
  log_info(
      "qwen35: tensor parallel over %d ranks (%d attention heads, %d DeltaNet value heads a "
      "rank)",
      n, cfg[0].n_heads, cfg[0].lin_n_v_heads);
  *out = rm[0];
  return 0;
}

void qwen35_free(qwen35 *m) {
  if (!m) return;
  qwen35_tp_runner_free(m->runner);
  FOR_PEERS(m, r) qwen35_free(peer(m, r));
  if (m->ranks) bind(m);
  free(m->ranks);
  model_config *tp_cfg = m->tp_cfg; /* m->c may be in it: freed last */
  backend *be = m->be;
  if (m->L) {
    for (int i = 0; i < m->c->n_layers; i++) {
      q_layer *L = &m->L[i];
      backend_weight ws[] = {L->input_norm,
                             L->post_norm,
                             L->q_proj,
                             L->k_proj,
                             L->v_proj,
                             L->o_proj,
                             L->q_norm,
                             L->k_norm,
                             L->in_qkv,
                             L->in_z,
                             L->in_b,
                             L->in_a,
                             L->conv1d,
                             L->dt_bias,
                             L->A_log,
                             L->lin_norm,
                             L->out_proj,
                             L->gate,
                             L->up,
                             L->down,
                             L->moe.router,
                             L->moe.shared_gate,
                             L->moe.shared_up,
                             L->moe.shared_down,
                             L->moe.shared_expert_gate};
      for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) be->weight_free(be, ws[k]);
      if (L->experts)
        for (int e = 0; e < 3 * m->c->n_experts; e++) be->weight_free(be, L->experts[e]);
      free(L->experts);
      be->free(be, L->k_pool);
      be->free(be, L->v_pool);
      be->free(be, L->conv);
      be->free(be, L->ssm);
    }
    free(m->L);
  }
  if (m->lm_head != m->embed) be->weight_free(be, m->lm_head);
  be->weight_free(be, m->embed);
  be->weight_free(be, m->final_norm);
  free_scratch(m);
  free_logits(m);
  for (int k = 0; k < 2; k++)
    if (m->sstage[k]) qwen35_host_free(m, m->sstage[k]);
  free(m);
  free(tp_cfg);
}

const model_config *qwen35_config(const qwen35 *m) { return m->full_c ? m->full_c : m->c; }

/* ---- forward ---- */

/* After a row-parallel product (o_proj, out_proj, down_proj, the MoE block) each rank's mix holds
 * a partial sum over its heads or its slice of the intermediate width: the sum over the ranks. */
static void tp_reduce(qwen35 *m, int T) {
  if (m->tp_size > 1) m->be->all_reduce_sum(m->be, m->mix, (size_t)T * m->c->hidden_size);
}

static void attn_block(qwen35 *m, q_layer *L, int T) {
  const model_config *c = m->c;
  backend *be = m->be;
  int H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
  be->matmul(be, m->xn, L->q_proj, T, H, nh * 2 * hd, m->qg);
  be->matmul(be, m->xn, L->k_proj, T, H, nkv * hd, m->k);
  be->matmul(be, m->xn, L->v_proj, T, H, nkv * hd, m->v);
  be->qk_norm_rope(be, m->qg, m->k, L->q_norm, L->k_norm, nh, nkv, hd, c->rot_dim, c->rope_theta,
                   c->rms_norm_eps, m->q, m->gate);
  be->attention(be, L->k_pool, L->v_pool, m->q, m->k, m->v, nh, nkv, hd,
                (float)(1.0 / sqrt((double)hd)), m->att);
  be->sigmoid_mul(be, m->att, m->gate, (size_t)T * nh * hd);
  be->matmul(be, m->att, L->o_proj, T, nh * hd, H, m->mix);
  tp_reduce(m, T);
}

static void gdn_block(qwen35 *m, q_layer *L, int T, int any_prefill, int any_decode) {
  const model_config *c = m->c;
  backend *be = m->be;
  int H = c->hidden_size, nk = c->lin_n_k_heads, nv = c->lin_n_v_heads, dk = c->lin_k_head_dim,
      dv = c->lin_v_head_dim;
  be->matmul(be, m->xn, L->in_qkv, T, H, c->conv_dim, m->qkv);
  be->matmul(be, m->xn, L->in_z, T, H, nv * dv, m->z);
  be->matmul(be, m->xn, L->in_b, T, H, nv, m->bb);
  be->matmul(be, m->xn, L->in_a, T, H, nv, m->aa);
  be->conv1d(be, L->conv, m->qkv, L->conv1d, c->conv_dim, c->conv_kernel, m->conv_out);
  be->gdn_gates(be, m->conv_out, m->bb, m->aa, L->A_log, L->dt_bias, nk, nv, dk, dv, m->beta, m->g);
  if (any_prefill) be->gdn_prefill(be, L->ssm, m->conv_out, m->beta, m->g, nk, nv, dk, dv, m->o);
  if (any_decode) be->gdn_decode(be, L->ssm, m->conv_out, m->beta, m->g, nk, nv, dk, dv, m->o);
  be->gated_rmsnorm(be, m->o, m->z, L->lin_norm, T, nv, dv, c->rms_norm_eps, m->o);
  be->matmul(be, m->o, L->out_proj, T, nv * dv, H, m->mix);
  tp_reduce(m, T);
}

static void ffn_block(qwen35 *m, q_layer *L, int i, int T) {
  const model_config *c = m->c;
  backend *be = m->be;
  int H = c->hidden_size;
  if (c->layer_is_moe[i]) {
    be->moe(be, m->xn, &L->moe, T, H, m->mix);
  } else {
    int I = c->intermediate_size;
    be->matmul(be, m->xn, L->gate, T, H, I, m->fg);
    be->matmul(be, m->xn, L->up, T, H, I, m->fu);
    be->swiglu(be, m->fg, m->fu, (size_t)T * I, m->fg);
    be->matmul(be, m->fg, L->down, T, I, H, m->mix);
  }
  tp_reduce(m, T);
}

/* Issues one step up to the logits (into m->logits, *n_out_rows rows); with mode FWD_GREEDY up
 * to the greedy ids (into m->ids; m->logits then perhaps scratch), with FWD_SAMPLE up to the
 * sampled ids of the rows' words in m->sparams (into m->ids; m->logits then scratch); nothing
 * waited for. */
/* chained: every piece's token is the previous greedy or sampled step's id of the same row
 * (m->ids). */
enum { FWD_LOGITS = 0, FWD_GREEDY = 1, FWD_SAMPLE = 2 };

/* The rows' tokens as rank m's embedding holds them: its own vocab rows from 0, any other token
 * the zero row past them (the all-reduce after the embedding adds the owner's row to zeros). */
static void tp_tokens(const qwen35 *m, const int32_t *tok, int T, int32_t *out) {
  for (int t = 0; t < T; t++) {
    int32_t id = tok[t] - m->vocab_first;
    out[t] = id >= 0 && id < m->vocab_count ? id : m->vocab_width;
  }
}

/* One step's shape, for the ranks' threads. */
typedef struct rank_step {
  qwen35 *m; /* rank 0 */
  int T, n_out, mode, any_prefill, any_decode;
} rank_step;
static void forward_ops(qwen35 *m, int T, int n_out, int mode, int any_prefill, int any_decode);
static void rank_ops(void *v, int r);

static int forward_issue(qwen35 *m, const fwd_seq *seqs, int n_seqs, int mode, int chained,
                         int *n_out_rows, char *err, size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  if (n_seqs < 1) return errf(err, errlen, "empty batch");
  int T = 0, n_out = 0, max_pages = 1, any_prefill = 0, any_decode = 0, any_verify = 0;
  for (int s = 0; s < n_seqs; s++) {
    const fwd_seq *q = &seqs[s];
    if (q->n_tokens < 1 || q->pos < 0)
      return errf(err, errlen, "sequence %d: bad piece (%d tokens at %d)", s, q->n_tokens, q->pos);
    if (q->slot < 0 || q->slot >= m->n_slots)
      return errf(err, errlen, "sequence %d: bad state slot %d", s, q->slot);
    if (q->logits == QWEN35_LOGITS_VERIFY) {
      if (!qwen35_can_verify(m))
        return errf(err, errlen, "backend %s cannot run verify pieces", be->name);
      if (q->keep < 0 || q->keep >= m->keep_lanes || q->n_tokens - 1 > m->keep_k)
        return errf(err, errlen, "sequence %d: a verify piece of %d rows in keep lane %d", s,
                    q->n_tokens, q->keep);
      any_verify = 1;
    }
    int need = (q->pos + q->n_tokens + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS;
    if (config_n_full_layers(c) > 0) {
      if (q->n_pages < need || !q->pages)
        return errf(err, errlen, "sequence %d: page table covers %d pages, need %d", s, q->n_pages,
                    need);
      for (int p = 0; p < need; p++)
        if (q->pages[p] < 0 || q->pages[p] >= m->n_pages)
          return errf(err, errlen, "sequence %d: bad page id %d", s, q->pages[p]);
    }
    if (chained && q->n_tokens != 1)
      return errf(err, errlen, "sequence %d: a chained step's pieces are one row", s);
    for (int t = 0; t < q->n_tokens && !chained; t++)
      if (q->tokens[t] < 0 || q->tokens[t] >= c->vocab_size)
        return errf(err, errlen, "sequence %d: token id %d out of range", s, q->tokens[t]);
    if (need > max_pages) max_pages = need;
    T += q->n_tokens;
    n_out += q->logits >= QWEN35_LOGITS_ALL ? q->n_tokens : q->logits == QWEN35_LOGITS_LAST;
    if (q->n_tokens > 1 && q->logits != QWEN35_LOGITS_VERIFY)
      any_prefill = 1;
    else
      any_decode = 1;
  }
  /* batch metadata */
  size_t S = (size_t)n_seqs;
  int32_t *arr =
      malloc((3 * (size_t)T + 6 * S + S * (size_t)max_pages + (size_t)n_out + 1) * sizeof *arr);
  if (!arr) return errf(err, errlen, "out of memory");
  backend_batch b = {0};
  int32_t *tok = arr, *pos = tok + T, *seq = pos + T, *st = seq + T, *ln = st + S, *sp = ln + S,
          *sl = sp + S, *pt = sl + S, *orow = pt + S * (size_t)max_pages, *kp = orow + n_out;
  int row = 0, oi = 0;
  for (int s = 0; s < n_seqs; s++) {
    const fwd_seq *q = &seqs[s];
    st[s] = row;
    ln[s] = q->n_tokens;
    sp[s] = q->pos;
    sl[s] = q->slot;
    kp[s] = q->logits == QWEN35_LOGITS_VERIFY ? qwen35_keep_slot(m, q->keep, 0) : -1;
    for (int p = 0; p < max_pages; p++)
      pt[(size_t)s * max_pages + p] = (q->pages && p < q->n_pages) ? q->pages[p] : -1;
    for (int t = 0; t < q->n_tokens; t++, row++) {
      tok[row] = chained ? 0 : q->tokens[t];
      pos[row] = q->pos + t;
      seq[row] = s;
      if (q->logits >= QWEN35_LOGITS_ALL ||
          (q->logits == QWEN35_LOGITS_LAST && t == q->n_tokens - 1))
        orow[oi++] = row;
    }
  }
  b.n_tokens = T;
  b.n_seqs = n_seqs;
  b.tokens = tok;
  b.pos = pos;
  b.seq = seq;
  b.seq_start = st;
  b.seq_len = ln;
  b.seq_pos = sp;
  b.seq_slot = sl;
  b.page_table = pt;
  b.max_pages = max_pages;
  b.n_out = n_out;
  b.out_rows = orow;
  if (chained) {
    if (!m->ids || T > m->logits_cap) {
      free(arr);
      return errf(err, errlen, "a chained step needs a step of as many rows before it");
    }
    b.tokens_dev = m->ids;
  }
  int rc = 0;
  if (!m->ranks) {
    rc = be->set_batch(be, &b);
    if (rc == 0 && any_verify) rc = be->set_keep(be, kp);
  } else {
    /* every rank the same batch but for the tokens, which each rank's embedding looks up as
     * its own rows (tp_tokens); a chained step's tokens are read from rank 0's ids first */
    int32_t *rtok = malloc((size_t)T * sizeof *rtok);
    if (!rtok) rc = -1;
    if (rc == 0 && chained) rc = be->read(be, m->ids, 0, tok, (size_t)T * sizeof *tok);
    b.tokens_dev = NULL;
    b.tokens = rtok;
    for (int r = 0; r < m->tp_size && rc == 0; r++) {
      qwen35 *rm = peer(m, r);
      backend *pb = rm->be;
      tp_tokens(rm, tok, T, rtok);
      rc = pb->set_batch(pb, &b);
      if (rc == 0 && any_verify) rc = pb->set_keep(pb, kp);
    }
    bind(m);
    free(rtok);
  }
  free(arr);
  if (rc) return errf(err, errlen, "backend %s: cannot set batch", be->name);
  if (ensure_scratch(m, T, err, errlen) || ensure_logits(m, n_out > 0 ? n_out : 1, err, errlen))
    return -1;
  int prc = 0;
  FOR_PEERS(m, r) {
    if (!prc)
      prc = ensure_scratch(peer(m, r), T, err, errlen) ||
            ensure_logits(m->ranks[r], n_out > 0 ? n_out : 1, err, errlen);
  }
  if (m->ranks) bind(m);
  if (prc) return -1;
  *n_out_rows = n_out;
  /* Everything the ops below are issued with, beyond the weights: a step with the key of the
   * step before issues the same ops with the same arguments (the rows' tokens, positions and
   * pages reach the ops only through set_batch), so the backend may run that step's ops again
   * instead of taking them one by one (step_repeat). */
  int key[8] = {T, n_seqs, n_out, mode, any_prefill, any_decode, (int)m->bufs_gen, any_verify};
  int same = m->key_set && !memcmp(key, m->key, sizeof key);
  memcpy(m->key, key, sizeof key);
  m->key_set = 1;
  if (same && !m->ranks && be->step_repeat && be->step_repeat(be)) return 0;
  if (!m->ranks) {
    forward_ops(m, T, n_out, mode, any_prefill, any_decode);
    return 0;
  }
  rank_step step = {m, T, n_out, mode, any_prefill, any_decode};
  qwen35_tp_run(m->runner, rank_ops, &step);
  return 0;
}

/* Tensor parallelism: every rank's logit columns of the n_out rows into rank 0's logits [n_out,
 * V] (each rank gathers them all; rank 0 puts them in place). */
static void tp_logits(qwen35 *m, int n_out) {
  const model_config *c = m->c;
  backend *be = m->be;
  size_t W = (size_t)m->lm_rows, part = (size_t)n_out * W;
  be->logits(be, m->x, m->final_norm, c->rms_norm_eps, m->lm_head, c->hidden_size, (int)W,
             m->lm_part);
  be->all_gather(be, m->lm_part, part, m->lm_all);
  if (m->tp_rank > 0) return;
  for (int r = 0; r < m->tp_size; r++) {
    const qwen35 *rm = m->ranks[r];
    size_t n = (size_t)rm->vocab_count * sizeof(float);
    for (int i = 0; i < n_out && n; i++)
      be->copy(be, m->logits, ((size_t)i * c->vocab_size + rm->vocab_first) * sizeof(float),
               m->lm_all, ((size_t)r * part + (size_t)i * W) * sizeof(float), n);
  }
}

/* The ops of one step on rank m (forward_issue set the batch and the scratch): the layers, then
 * the logits (every rank its vocab columns, tp_logits) and, on rank 0, the greedy or sampled
 * ids. */
static void forward_ops(qwen35 *m, int T, int n_out, int mode, int any_prefill, int any_decode) {
  const model_config *c = m->c;
  backend *be = m->be;
  int H = c->hidden_size;
  float eps = c->rms_norm_eps;
  be->embed(be, m->embed, H, m->x);
  if (m->tp_size > 1) be->all_reduce_sum(be, m->x, (size_t)T * H);
  for (int i = 0; i < c->n_layers; i++) {
    q_layer *L = &m->L[i];
    be->rmsnorm(be, m->x, i > 0 ? m->mix : NULL, L->input_norm, T, H, eps, m->xn);
    if (c->layer_types[i] == LAYER_KIND_FULL)
      attn_block(m, L, T);
    else
      gdn_block(m, L, T, any_prefill, any_decode);
    be->rmsnorm(be, m->x, m->mix, L->post_norm, T, H, eps, m->xn);
    ffn_block(m, L, i, T);
  }
  be->add(be, m->x, m->mix, (size_t)T * H);
  if (n_out <= 0) return;
  if (m->tp_size > 1) tp_logits(m, n_out);
  if (m->tp_rank > 0) return;
  int greedy = mode == FWD_GREEDY, fused = greedy && be->logits_argmax && m->tp_size == 1;
  if (fused)
    be->logits_argmax(be, m->x, m->final_norm, eps, m->lm_head, H, c->vocab_size, m->logits,
                      m->ids);
  else if (m->tp_size == 1)
    be->logits(be, m->x, m->final_norm, eps, m->lm_head, H, c->vocab_size, m->logits);
  if (greedy && !fused) be->argmax(be, m->logits, n_out, c->vocab_size, m->ids, NULL);
  if (mode == FWD_SAMPLE) be->sample(be, m->logits, n_out, c->vocab_size, m->sparams, m->ids);
}

static void rank_ops(void *v, int r) {
  const rank_step *st = v;
  qwen35 *m = st->m->ranks[r];
  bind(m); /* the rank's own thread (rank 0: the caller's, bound to it already) */
  forward_ops(m, st->T, st->n_out, st->mode, st->any_prefill, st->any_decode);
  if (m->be->step_end) m->be->step_end(m->be); /* on this thread: the ranks meet there */
}

int qwen35_forward(qwen35 *m, const fwd_seq *seqs, int n_seqs, float *logits, char *err,
                   size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, FWD_LOGITS, 0, &n_out, err, errlen)) return -1;
  int rrc = n_out > 0 && logits
                ? be->read(be, m->logits, 0, logits, (size_t)n_out * c->vocab_size * sizeof(float))
                : 0;
  if (be->sync(be, err, errlen)) return -1;
  if (rrc) return errf(err, errlen, "backend %s: reading logits failed", be->name);
  return 0;
}

/* After a step issued up to its logits or ids: every row's final-normed hidden state into
 * hidden [T, H] f32 (the read queued; 0, or -1 when out of memory or the read failed). */
static int hidden_read(qwen35 *m, int T, float *hidden) {
  const model_config *c = m->c;
  backend *be = m->be;
  int H = c->hidden_size;
  /* the final norm of every row into xn (free after the layers): what the MTP head reads */
  be->rmsnorm(be, m->x, NULL, m->final_norm, T, H, c->rms_norm_eps, m->xn);
  size_t n = (size_t)T * H, as = be->kind_size(be, BACKEND_KIND_ACT);
  uint16_t *h16 = as == 4 ? NULL : malloc(n * 2);
  if (as != 4 && !h16) return -1;
  int rrc = be->read(be, m->xn, 0, h16 ? (void *)h16 : (void *)hidden, n * as);
  for (size_t i = 0; h16 && !rrc && i < n; i++) hidden[i] = dtype_bf16_to_f32(h16[i]);
  free(h16);
  return rrc;
}

static int rows_of(const fwd_seq *seqs, int n_seqs) {
  int T = 0;
  for (int s = 0; s < n_seqs; s++) T += seqs[s].n_tokens;
  return T;
}

int qwen35_forward_hidden(qwen35 *m, const fwd_seq *seqs, int n_seqs, float *logits, float *hidden,
                          char *err, size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, FWD_LOGITS, 0, &n_out, err, errlen)) return -1;
  int rrc = n_out > 0 && logits
                ? be->read(be, m->logits, 0, logits, (size_t)n_out * c->vocab_size * sizeof(float))
                : 0;
  if (!rrc) rrc = hidden_read(m, rows_of(seqs, n_seqs), hidden);
  if (be->sync(be, err, errlen)) return -1;
  if (rrc) return errf(err, errlen, "backend %s: reading logits failed", be->name);
  return 0;
}

int qwen35_forward_greedy_hidden(qwen35 *m, const fwd_seq *seqs, int n_seqs, int32_t *ids,
                                 float *hidden, char *err, size_t errlen) {
  backend *be = m->be;
  if (!be->argmax) return errf(err, errlen, "backend %s has no argmax op", be->name);
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, FWD_GREEDY, 0, &n_out, err, errlen)) return -1;
  int rrc = n_out > 0 ? be->read(be, m->ids, 0, ids, (size_t)n_out * sizeof *ids) : 0;
  if (!rrc) rrc = hidden_read(m, rows_of(seqs, n_seqs), hidden);
  if (be->sync(be, err, errlen)) return -1;
  if (rrc) return errf(err, errlen, "backend %s: reading token ids failed", be->name);
  return 0;
}

int qwen35_vocab_weights(const qwen35 *m, backend_weight *embed, backend_weight *lm_head) {
  if (m->tp_size > 1) return -1;
  *embed = m->embed;
  *lm_head = m->lm_head;
  return 0;
}

int qwen35_has_argmax(const qwen35 *m) { return m->be->argmax != NULL; }

int qwen35_on_device(const qwen35 *m) { return m->be->mem_info != NULL; }

int qwen35_forward_greedy(qwen35 *m, const fwd_seq *seqs, int n_seqs, int32_t *ids, char *err,
                          size_t errlen) {
  backend *be = m->be;
  if (!be->argmax) return errf(err, errlen, "backend %s has no argmax op", be->name);
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, FWD_GREEDY, 0, &n_out, err, errlen)) return -1;
  /* the read first: its copy is queued behind the step and waited for once (a sync before
   * it would wait for the step, then the copy's own round trip) */
  int rrc = n_out > 0 ? be->read(be, m->ids, 0, ids, (size_t)n_out * sizeof *ids) : 0;
  if (be->sync(be, err, errlen)) return -1;
  if (rrc) return errf(err, errlen, "backend %s: reading token ids failed", be->name);
  return 0;
}

int qwen35_has_sample(const qwen35 *m) { return m->be->sample != NULL; }

/* A sampled step's rows (those with logits), or -1 with err when the backend has no sample op
 * or n_words do not fit them. */
static int sample_rows(const qwen35 *m, const fwd_seq *seqs, int n_seqs, int n_words, char *err,
                       size_t errlen) {
  if (!m->be->sample) return errf(err, errlen, "backend %s has no sample op", m->be->name);
  int n = 0;
  for (int s = 0; s < n_seqs; s++)
    n += seqs[s].logits >= QWEN35_LOGITS_ALL ? seqs[s].n_tokens
                                             : seqs[s].logits == QWEN35_LOGITS_LAST;
  if (n_words < n * SAMPLE_RULE_WORDS || n_words > n * QWEN35_SAMPLE_ROW_WORDS)
    return errf(err, errlen, "%d sampling words for %d rows", n_words, n);
  return n;
}

int qwen35_forward_sample(qwen35 *m, const fwd_seq *seqs, int n_seqs, const int32_t *words,
                          int n_words, int32_t *ids, char *err, size_t errlen) {
  backend *be = m->be;
  int n = sample_rows(m, seqs, n_seqs, n_words, err, errlen);
  if (n < 0) return -1;
  /* the rows' words first: a write waits for what was issued before it, so not after the step */
  if (n > 0 && ensure_logits(m, n, err, errlen)) return -1;
  if (n > 0 && be->write(be, m->sparams, 0, words, (size_t)n_words * sizeof *words))
    return errf(err, errlen, "backend %s: writing sampling rows failed", be->name);
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, FWD_SAMPLE, 0, &n_out, err, errlen)) return -1;
  int rrc = n_out > 0 ? be->read(be, m->ids, 0, ids, (size_t)n_out * sizeof *ids) : 0;
  if (be->sync(be, err, errlen)) return -1;
  if (rrc) return errf(err, errlen, "backend %s: reading token ids failed", be->name);
  return 0;
}

int qwen35_can_chain(const qwen35 *m) {
  return m->be->argmax && m->be->read_start && m->be->read_wait;
}

/* Issues a greedy or sampled step and queues the read of its ids (ticket). */
static int step_start(qwen35 *m, const fwd_seq *seqs, int n_seqs, int mode, int chained,
                      int32_t *ids, int *ticket, char *err, size_t errlen) {
  backend *be = m->be;
  if (!qwen35_can_chain(m))
    return errf(err, errlen, "backend %s cannot start a step without waiting", be->name);
  if (fault_hit("step_start")) return errf(err, errlen, "step_start: injected fault");
  int n_out = 0;
  if (forward_issue(m, seqs, n_seqs, mode, chained, &n_out, err, errlen)) return -1;
  *ticket = be->read_start(be, m->ids, 0, ids, (size_t)(n_out > 0 ? n_out : 0) * sizeof *ids);
  if (*ticket < 0) {
    if (be->sync(be, err, errlen) == 0)
      errf(err, errlen, "backend %s: reading token ids failed", be->name);
    return -1;
  }
  return 0;
}

int qwen35_greedy_start(qwen35 *m, const fwd_seq *seqs, int n_seqs, int chained, int32_t *ids,
                        int *ticket, char *err, size_t errlen) {
  return step_start(m, seqs, n_seqs, FWD_GREEDY, chained, ids, ticket, err, errlen);
}

int qwen35_sample_start(qwen35 *m, const fwd_seq *seqs, int n_seqs, int chained,
                        const int32_t *words, int n_words, int32_t *ids, int *ticket, char *err,
                        size_t errlen) {
  backend *be = m->be;
  int n = sample_rows(m, seqs, n_seqs, n_words, err, errlen);
  if (n < 0) return -1;
  if (n > 0 && !chained && ensure_logits(m, n, err, errlen)) return -1;
  if (n > 0 && be->write_start) {
    /* queued behind the step in flight (which reads the words before them), from a host copy
     * that stays put until this step's ids are read: the one before it was read already */
    if ((size_t)n_words > m->sstage_cap) {
      if (be->sync(be, err, errlen)) return -1; /* no copy still reads the old ones */
      for (int k = 0; k < 2; k++) {
        if (m->sstage[k]) qwen35_host_free(m, m->sstage[k]);
        m->sstage[k] = NULL;
      }
      m->sstage_cap = 0;
      size_t cap = (size_t)n_words * 2;
      for (int k = 0; k < 2; k++)
        if (!(m->sstage[k] = qwen35_host_alloc(m, cap * sizeof(int32_t))))
          return errf(err, errlen, "out of host memory for sampling words");
      m->sstage_cap = cap;
    }
    int32_t *st = m->sstage[m->sstage_k];
    m->sstage_k ^= 1;
    memcpy(st, words, (size_t)n_words * sizeof *words);
    if (be->write_start(be, m->sparams, 0, st, (size_t)n_words * sizeof *words))
      return errf(err, errlen, "backend %s: writing sampling rows failed", be->name);
  } else if (n > 0 && be->write(be, m->sparams, 0, words, (size_t)n_words * sizeof *words)) {
    return errf(err, errlen, "backend %s: writing sampling rows failed", be->name);
  }
  return step_start(m, seqs, n_seqs, FWD_SAMPLE, chained, ids, ticket, err, errlen);
}

int qwen35_greedy_finish(qwen35 *m, int ticket, char *err, size_t errlen) {
  return m->be->read_wait(m->be, ticket, err, errlen);
}

void *qwen35_host_alloc(qwen35 *m, size_t bytes) {
  backend *be = m->be;
  return be->host_alloc && be->host_free ? be->host_alloc(be, bytes) : malloc(bytes ? bytes : 1);
}

void qwen35_host_free(qwen35 *m, void *p) {
  backend *be = m->be;
  if (be->host_alloc && be->host_free)
    be->host_free(be, p);
  else
    free(p);
}

/* ---- slots and pages ---- */

int qwen35_slot_zero(qwen35 *m, int slot) {
  CHECK(slot >= 0 && slot < m->n_slots);
  if (m->ranks) {
    int rc = 0;
    FOR_PEERS(m, r) {
      if (!rc) rc = qwen35_slot_zero(peer(m, r), slot);
    }
    bind(m);
    if (rc) return -1;
  }
  const model_config *c = m->c;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->layer_types[i] != LAYER_KIND_LINEAR) continue;
    m->be->zero(m->be, m->L[i].conv, (size_t)slot * conv_elems(c) * 4, conv_elems(c) * 4);
    m->be->zero(m->be, m->L[i].ssm, (size_t)slot * ssm_elems(c) * 4, ssm_elems(c) * 4);
  }
  return m->be->sync(m->be, NULL, 0);
}

backend *qwen35_backend(const qwen35 *m) { return m->be; }
int qwen35_can_verify(const qwen35 *m) { return m->be->set_keep ? m->keep_k : 0; }

int qwen35_keep_lanes(const qwen35 *m) { return m->keep_lanes; }

int qwen35_keep_slot(const qwen35 *m, int lane, int r) {
  CHECK(lane >= 0 && lane < m->keep_lanes && r >= 0 && r < m->keep_k);
  return m->n_slots + lane * m->keep_k + r;
}

int qwen35_slot_copy(qwen35 *m, int dst, int src) {
  int ns = m->n_slots + m->n_keep;
  CHECK(dst >= 0 && dst < ns && src >= 0 && src < ns);
  if (dst == src) return 0;
  if (m->ranks) {
    int rc = 0;
    FOR_PEERS(m, r) {
      if (!rc) rc = qwen35_slot_copy(peer(m, r), dst, src);
    }
    bind(m);
    if (rc) return -1;
  }
  const model_config *c = m->c;
  size_t cb = conv_elems(c) * 4, sb = ssm_elems(c) * 4;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->layer_types[i] != LAYER_KIND_LINEAR) continue;
    m->be->copy(m->be, m->L[i].conv, (size_t)dst * cb, m->L[i].conv, (size_t)src * cb, cb);
    m->be->copy(m->be, m->L[i].ssm, (size_t)dst * sb, m->L[i].ssm, (size_t)src * sb, sb);
  }
  return m->be->sync(m->be, NULL, 0);
}

static size_t page_layer_bytes(const qwen35 *m) {
  return backend_kv_page_bytes(m->be, m->c->n_kv_heads, m->c->head_dim);
}

int qwen35_page_copy(qwen35 *m, int dst, int src) {
  CHECK(dst >= 0 && dst < m->n_pages && src >= 0 && src < m->n_pages);
  if (dst == src) return 0;
  if (m->ranks) {
    int rc = 0;
    FOR_PEERS(m, r) {
      if (!rc) rc = qwen35_page_copy(peer(m, r), dst, src);
    }
    bind(m);
    if (rc) return -1;
  }
  size_t pb = page_layer_bytes(m);
  for (int i = 0; i < m->c->n_layers; i++) {
    if (m->c->layer_types[i] != LAYER_KIND_FULL) continue;
    m->be->copy(m->be, m->L[i].k_pool, (size_t)dst * pb, m->L[i].k_pool, (size_t)src * pb, pb);
    m->be->copy(m->be, m->L[i].v_pool, (size_t)dst * pb, m->L[i].v_pool, (size_t)src * pb, pb);
  }
  return m->be->sync(m->be, NULL, 0);
}

/* Host layout of a slot: for each DeltaNet layer in order, conv state then SSM state.
 * Host layout of a page: for each full-attention layer in order, K rows then V rows. */
static int slot_io(qwen35 *m, int slot, void *host, int writing) {
  CHECK(slot >= 0 && slot < m->n_slots);
  const model_config *c = m->c;
  size_t cb = conv_elems(c) * 4, sb = ssm_elems(c) * 4;
  char *h = host;
  for (int i = 0; i < c->n_layers; i++) {
    if (c->layer_types[i] != LAYER_KIND_LINEAR) continue;
    backend_buf bufs[2] = {m->L[i].conv, m->L[i].ssm};
    size_t sz[2] = {cb, sb};
    for (int k = 0; k < 2; k++) {
      int rc = writing ? m->be->write(m->be, bufs[k], (size_t)slot * sz[k], h, sz[k])
                       : m->be->read(m->be, bufs[k], (size_t)slot * sz[k], h, sz[k]);
      if (rc) return -1;
      h += sz[k];
    }
  }
  return 0;
}

static int page_io(qwen35 *m, int page, void *host, int writing) {
  CHECK(page >= 0 && page < m->n_pages);
  size_t pb = page_layer_bytes(m);
  char *h = host;
  for (int i = 0; i < m->c->n_layers; i++) {
    if (m->c->layer_types[i] != LAYER_KIND_FULL) continue;
    backend_buf bufs[2] = {m->L[i].k_pool, m->L[i].v_pool};
    for (int k = 0; k < 2; k++) {
      int rc = writing ? m->be->write(m->be, bufs[k], (size_t)page * pb, h, pb)
                       : m->be->read(m->be, bufs[k], (size_t)page * pb, h, pb);
      if (rc) return -1;
      h += pb;
    }
  }
  return 0;
}

static size_t rank_slot_bytes(const qwen35 *m) {
  return (size_t)config_n_linear_layers(m->c) * (conv_elems(m->c) + ssm_elems(m->c)) * 4;
}

static size_t rank_page_bytes(const qwen35 *m) {
  return (size_t)config_n_full_layers(m->c) * 2 * page_layer_bytes(m);
}

typedef int (*rank_io_fn)(qwen35 *m, int idx, void *host, int writing);
typedef size_t (*rank_bytes_fn)(const qwen35 *m);

/* A tensor-parallel model's host layout of a slot or page: rank 0's bytes, then rank 1's, ... */
static int io_all(qwen35 *m, rank_io_fn io, rank_bytes_fn bytes, int idx, char *host, int writing) {
  if (io(m, idx, host, writing)) return -1;
  host += bytes(m);
  int rc = 0;
  FOR_PEERS(m, r) {
    if (!rc) rc = io(peer(m, r), idx, host, writing);
    host += bytes(m->ranks[r]);
  }
  if (m->ranks) bind(m);
  return rc ? -1 : 0;
}

static int slot_io_all(qwen35 *m, int slot, char *host, int writing) {
  return io_all(m, slot_io, rank_slot_bytes, slot, host, writing);
}

static int page_io_all(qwen35 *m, int page, char *host, int writing) {
  return io_all(m, page_io, rank_page_bytes, page, host, writing);
}

int qwen35_slot_read(qwen35 *m, int slot, void *host) { return slot_io_all(m, slot, host, 0); }
int qwen35_slot_write(qwen35 *m, int slot, const void *host) {
  return slot_io_all(m, slot, (void *)host, 1);
}
int qwen35_page_read(qwen35 *m, int page, void *host) { return page_io_all(m, page, host, 0); }
int qwen35_page_write(qwen35 *m, int page, const void *host) {
  return page_io_all(m, page, (void *)host, 1);
}

size_t qwen35_slot_bytes(const qwen35 *m) {
  size_t b = rank_slot_bytes(m);
  FOR_PEERS(m, r) b += rank_slot_bytes(m->ranks[r]);
  return b;
}

size_t qwen35_page_bytes(const qwen35 *m) {
  size_t b = rank_page_bytes(m);
  FOR_PEERS(m, r) b += rank_page_bytes(m->ranks[r]);
  return b;
}

size_t qwen35_weight_bytes(const qwen35 *m) {
  size_t b = m->weight_bytes;
  FOR_PEERS(m, r) b += m->ranks[r]->weight_bytes;
  return b;
}

void qwen35_vocab_bytes(const qwen35 *m, size_t *embed, size_t *lm_head) {
  *lm_head = m->be->weight_bytes(m->be, m->lm_head);
  *embed = m->lm_head == m->embed ? 0 : m->be->weight_bytes(m->be, m->embed);
  FOR_PEERS(m, r) {
    size_t e, l;
    qwen35_vocab_bytes(m->ranks[r], &e, &l);
    *embed += e;
    *lm_head += l;
  }
}
