#include "model/qwen35_mtp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"

typedef struct mtp_layer {
  backend_weight input_norm, post_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  backend_weight gate, up, down;
  backend_moe moe;
  backend_weight *experts; /* [3*E] gate, up, down; NULL for a dense FFN */
  backend_buf k_pool, v_pool;
} mtp_layer;

struct qwen35_mtp {
  const model_config *c;
  backend *be;
  int n_pages, n_layers, moe;
  backend_weight embed, lm_head; /* target's, or its own copies (own_vocab) */
  int own_vocab;
  backend_weight fc_e, fc_h, norm_e, norm_h, norm;
  mtp_layer *L;
  int cap, cap_out; /* scratch rows; rows of logits (and ids) */
  backend_buf e, en, hb, hn, x, xn, mix, qg, q, gate, k, v, att, fg, fu, logits, ids;
};

/* Uploads columns [col0, col0 + cols) of the 2-D (or 1-D: rows 1) tensor t as F32 (exact for
 * every stored dtype, FP8 through its scales), so one path serves any checkpoint. NULL on OOM. */
static backend_weight mtp_upload(backend *be, const tensor *t, int64_t col0, int64_t cols) {
  int64_t rows = t->ndim >= 2 ? t->shape[0] : 1;
  int64_t width = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->shape[0];
  if (cols < 0) cols = width;
  float *f = malloc((size_t)(rows * cols) * sizeof *f);
  if (!f) return NULL;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) f[r * cols + j] = tensor_get_f32(t, r * width + col0 + j);
  backend_weight w = be->weight_upload(be, f, DTYPE_F32, rows, cols);
  free(f);
  return w;
}

static void mtp_free_scratch(qwen35_mtp *m) {
  backend_buf *b[] = {&m->e,    &m->en, &m->hb, &m->hn,  &m->x,  &m->xn, &m->mix,    &m->qg, &m->q,
                      &m->gate, &m->k,  &m->v,  &m->att, &m->fg, &m->fu, &m->logits, &m->ids};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) {
    if (*b[i]) m->be->free(m->be, *b[i]);
    *b[i] = NULL;
  }
  m->cap = m->cap_out = 0;
}

/* Scratch for T rows of which n_out have logits (grown, never shrunk). */
static int mtp_scratch(qwen35_mtp *m, int T, int n_out, char *err, size_t errlen) {
  if (T <= m->cap && n_out <= m->cap_out) return 0;
  if (T < m->cap) T = m->cap;
  if (n_out < m->cap_out) n_out = m->cap_out;
  mtp_free_scratch(m);
  const model_config *c = m->c;
  size_t t = (size_t)T, H = (size_t)c->hidden_size, nh = (size_t)c->n_heads,
         nkv = (size_t)c->n_kv_heads, hd = (size_t)c->head_dim;
  size_t I = (size_t)(c->intermediate_size > 0 ? c->intermediate_size : 1);
  struct {
    backend_buf *b;
    backend_kind k;
    size_t n;
  } a[] = {{&m->e, BACKEND_KIND_ACT, t * H},
           {&m->en, BACKEND_KIND_ACT, t * H},
           {&m->hb, BACKEND_KIND_ACT, t * H},
           {&m->hn, BACKEND_KIND_ACT, t * H},
           {&m->x, BACKEND_KIND_ACT, t * H},
           {&m->xn, BACKEND_KIND_ACT, t * H},
           {&m->mix, BACKEND_KIND_ACT, t * H},
           {&m->qg, BACKEND_KIND_ACT, t * nh * 2 * hd},
           {&m->q, BACKEND_KIND_ACT, t * nh * hd},
           {&m->gate, BACKEND_KIND_ACT, t * nh * hd},
           {&m->k, BACKEND_KIND_ACT, t * nkv * hd},
           {&m->v, BACKEND_KIND_ACT, t * nkv * hd},
           {&m->att, BACKEND_KIND_ACT, t * nh * hd},
           {&m->fg, BACKEND_KIND_ACT, t * I},
           {&m->fu, BACKEND_KIND_ACT, t * I},
           {&m->logits, BACKEND_KIND_F32, (size_t)n_out * (size_t)c->vocab_size},
           {&m->ids, BACKEND_KIND_I32, (size_t)n_out}};
  for (size_t i = 0; i < sizeof a / sizeof *a; i++) {
    *a[i].b = m->be->alloc(m->be, a[i].k, a[i].n);
    if (!*a[i].b) {
      mtp_free_scratch(m);
      return errf(err, errlen, "MTP: out of device memory for %d rows", T);
    }
  }
  m->cap = T;
  m->cap_out = n_out;
  return 0;
}

static int mtp_layer_init(qwen35_mtp *m, const layer_weights *lw, mtp_layer *L, char *err,
                          size_t errlen) {
  backend *be = m->be;
  const model_config *c = m->c;
  backend_weight *ws[] = {&L->input_norm, &L->post_norm, &L->q_proj, &L->k_proj,
                          &L->v_proj,     &L->o_proj,    &L->q_norm, &L->k_norm};
  const tensor *ts[] = {&lw->input_norm, &lw->post_norm, &lw->q_proj, &lw->k_proj,
                        &lw->v_proj,     &lw->o_proj,    &lw->q_norm, &lw->k_norm};
  for (int i = 0; i < 8; i++)
    if (!(*ws[i] = mtp_upload(be, ts[i], 0, -1)))
      return errf(err, errlen, "MTP: out of device memory for the layer weights");
  if (m->moe) {
    int E = c->n_experts;
    L->experts = calloc((size_t)3 * E, sizeof *L->experts);
    if (!L->experts) return errf(err, errlen, "MTP: out of memory");
    for (int e = 0; e < E; e++)
      if (!(L->experts[e] = mtp_upload(be, &lw->experts[e].gate, 0, -1)) ||
          !(L->experts[E + e] = mtp_upload(be, &lw->experts[e].up, 0, -1)) ||
          !(L->experts[2 * E + e] = mtp_upload(be, &lw->experts[e].down, 0, -1)))
        return errf(err, errlen, "MTP: out of device memory for the experts");
    L->moe.n_experts = E;
    L->moe.top_k = c->n_experts_per_tok;
    L->moe.norm_topk_prob = c->norm_topk_prob;
    L->moe.inter = c->moe_intermediate_size;
    L->moe.shared_inter = c->shared_expert_intermediate_size;
    L->moe.gate = L->experts;
    L->moe.up = L->experts + E;
    L->moe.down = L->experts + 2 * E;
    L->moe.router = be->weight_upload_exact ? NULL : mtp_upload(be, &lw->router, 0, -1);
    if (be->weight_upload_exact) {
      /* routing is a discrete choice: the router at full precision, as the target's */
      const tensor *t = &lw->router;
      float *f = malloc((size_t)tensor_numel(t) * sizeof *f);
      if (!f) return errf(err, errlen, "MTP: out of memory");
      for (int64_t i = 0; i < tensor_numel(t); i++) f[i] = tensor_get_f32(t, i);
      L->moe.router = be->weight_upload_exact(be, f, DTYPE_F32, t->shape[0], t->shape[1]);
      free(f);
    }
    if (!L->moe.router) return errf(err, errlen, "MTP: out of device memory for the router");
    if (L->moe.shared_inter > 0 &&
        (!(L->moe.shared_gate = mtp_upload(be, &lw->shared_gate, 0, -1)) ||
         !(L->moe.shared_up = mtp_upload(be, &lw->shared_up, 0, -1)) ||
         !(L->moe.shared_down = mtp_upload(be, &lw->shared_down, 0, -1)) ||
         !(L->moe.shared_expert_gate = mtp_upload(be, &lw->shared_expert_gate, 0, -1))))
      return errf(err, errlen, "MTP: out of device memory for the shared expert");
  } else if (!(L->gate = mtp_upload(be, &lw->gate_proj, 0, -1)) ||
             !(L->up = mtp_upload(be, &lw->up_proj, 0, -1)) ||
             !(L->down = mtp_upload(be, &lw->down_proj, 0, -1))) {
    return errf(err, errlen, "MTP: out of device memory for the MLP");
  }
  size_t page = backend_kv_page_bytes(be, c->n_kv_heads, c->head_dim);
  size_t elems = (size_t)m->n_pages * page / be->kind_size(be, BACKEND_KIND_KV);
  L->k_pool = be->alloc(be, BACKEND_KIND_KV, elems);
  L->v_pool = be->alloc(be, BACKEND_KIND_KV, elems);
  if (!L->k_pool || !L->v_pool) return errf(err, errlen, "MTP: out of device memory for K/V");
  return 0;
}

int qwen35_mtp_init(qwen35_mtp **out, qwen35 *target, const model_weights *w, backend *be,
                    int n_pages, char *err, size_t errlen) {
  *out = NULL;
  const model_config *c = qwen35_config(target);
  if (w->mtp.n_layers < 1)
    return errf(err, errlen, "the checkpoint has no MTP head (mtp.* tensors)");
  if (n_pages < 1) return errf(err, errlen, "MTP: needs K/V pages");
  qwen35_mtp *m = calloc(1, sizeof *m);
  if (!m) return errf(err, errlen, "out of memory");
  m->c = c;
  m->be = be;
  m->n_pages = n_pages;
  m->n_layers = w->mtp.n_layers;
  m->moe = c->layer_is_moe[0];
  int64_t H = c->hidden_size;
  if (qwen35_vocab_weights(target, &m->embed, &m->lm_head)) {
    /* a tensor-parallel target's ranks each hold a slice of the vocabulary: the head, which runs
     * on rank 0's backend alone, takes whole copies of its own */
    m->own_vocab = 1;
    m->embed = mtp_upload(be, &w->embed, 0, -1);
    m->lm_head = w->lm_head.data && w->lm_head.data != w->embed.data && !c->tie_word_embeddings
                     ? mtp_upload(be, &w->lm_head, 0, -1)
                     : m->embed;
    if (!m->embed || !m->lm_head) {
      qwen35_mtp_free(m);
      return errf(err, errlen, "MTP: out of device memory for the embedding and the lm-head");
    }
  }
  m->L = calloc((size_t)m->n_layers, sizeof *m->L);
  if (!m->L) {
    free(m);
    return errf(err, errlen, "out of memory");
  }
  if (!(m->fc_e = mtp_upload(be, &w->mtp.fc, 0, H)) ||
      !(m->fc_h = mtp_upload(be, &w->mtp.fc, H, H)) ||
      !(m->norm_e = mtp_upload(be, &w->mtp.pre_fc_norm_embedding, 0, -1)) ||
      !(m->norm_h = mtp_upload(be, &w->mtp.pre_fc_norm_hidden, 0, -1)) ||
      !(m->norm = mtp_upload(be, &w->mtp.norm, 0, -1))) {
    qwen35_mtp_free(m);
    return errf(err, errlen, "MTP: out of device memory for fc and the norms");
  }
  for (int i = 0; i < m->n_layers; i++)
    if (mtp_layer_init(m, &w->mtp.layers[i], &m->L[i], err, errlen)) {
      qwen35_mtp_free(m);
      return -1;
    }
  *out = m;
  return 0;
}

void qwen35_mtp_free(qwen35_mtp *m) {
  if (!m) return;
  backend *be = m->be;
  mtp_free_scratch(m);
  for (int i = 0; m->L && i < m->n_layers; i++) {
    mtp_layer *L = &m->L[i];
    backend_weight ws[] = {L->input_norm,
                           L->post_norm,
                           L->q_proj,
                           L->k_proj,
                           L->v_proj,
                           L->o_proj,
                           L->q_norm,
                           L->k_norm,
                           L->gate,
                           L->up,
                           L->down,
                           L->moe.router,
                           L->moe.shared_gate,
                           L->moe.shared_up,
                           L->moe.shared_down,
                           L->moe.shared_expert_gate};
    for (size_t j = 0; j < sizeof ws / sizeof *ws; j++) be->weight_free(be, ws[j]);
    if (L->experts)
      for (int e = 0; e < 3 * m->c->n_experts; e++) be->weight_free(be, L->experts[e]);
    free(L->experts);
    if (L->k_pool) be->free(be, L->k_pool);
    if (L->v_pool) be->free(be, L->v_pool);
  }
  free(m->L);
  backend_weight ws[] = {m->fc_e, m->fc_h, m->norm_e, m->norm_h, m->norm};
  for (size_t j = 0; j < sizeof ws / sizeof *ws; j++) be->weight_free(be, ws[j]);
  if (m->own_vocab) {
    if (m->lm_head != m->embed) be->weight_free(be, m->lm_head);
    be->weight_free(be, m->embed);
  }
  free(m);
}

/* Issues one MTP step up to its logits (m->logits): every row's when last_only is 0, else each
 * piece's last row's (in piece order). *T_out: the step's rows. */
static int mtp_issue(qwen35_mtp *m, const fwd_seq *seqs, int n_seqs, int step, const float *hidden,
                     int last_only, int *T_out, char *err, size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  if (n_seqs < 1) return errf(err, errlen, "MTP: empty batch");
  int T = 0, max_pages = 1;
  for (int s = 0; s < n_seqs; s++) {
    const fwd_seq *q = &seqs[s];
    int need = (q->pos + q->n_tokens + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS;
    if (q->n_tokens < 1 || q->pos < 0 || !q->pages || q->n_pages < need)
      return errf(err, errlen, "MTP: sequence %d: bad piece or page table", s);
    for (int p = 0; p < need; p++)
      if (q->pages[p] < 0 || q->pages[p] >= m->n_pages)
        return errf(err, errlen, "MTP: sequence %d: bad page id %d", s, q->pages[p]);
    for (int t = 0; t < q->n_tokens; t++)
      if (q->tokens[t] < 0 || q->tokens[t] >= c->vocab_size)
        return errf(err, errlen, "MTP: sequence %d: token id %d out of range", s, q->tokens[t]);
    if (need > max_pages) max_pages = need;
    T += q->n_tokens;
  }
  size_t S = (size_t)n_seqs;
  int n_out = last_only ? n_seqs : T;
  int32_t *arr = malloc((4 * (size_t)T + 5 * S + S * (size_t)max_pages) * sizeof *arr);
  if (!arr) return errf(err, errlen, "out of memory");
  int32_t *tok = arr, *pos = tok + T, *seq = pos + T, *orow = seq + T, *st = orow + T, *ln = st + S,
          *sp = ln + S, *sl = sp + S, *pt = sl + S;
  int row = 0;
  for (int s = 0; s < n_seqs; s++) {
    const fwd_seq *q = &seqs[s];
    st[s] = row;
    ln[s] = q->n_tokens;
    sp[s] = q->pos;
    sl[s] = 0; /* no recurrent state in the MTP layer */
    for (int p = 0; p < max_pages; p++)
      pt[(size_t)s * max_pages + p] = p < q->n_pages ? q->pages[p] : -1;
    for (int t = 0; t < q->n_tokens; t++, row++) {
      tok[row] = q->tokens[t];
      pos[row] = q->pos + t;
      seq[row] = s;
      if (!last_only || t == q->n_tokens - 1) orow[last_only ? s : row] = row;
    }
  }
  backend_batch b = {.n_tokens = T,
                     .n_seqs = n_seqs,
                     .tokens = tok,
                     .pos = pos,
                     .seq = seq,
                     .seq_start = st,
                     .seq_len = ln,
                     .seq_pos = sp,
                     .seq_slot = sl,
                     .page_table = pt,
                     .max_pages = max_pages,
                     .n_out = n_out,
                     .out_rows = orow};
  int rc = be->set_batch(be, &b);
  free(arr);
  if (rc) return errf(err, errlen, "backend %s: cannot set batch", be->name);
  if (mtp_scratch(m, T, n_out, err, errlen)) return -1;
  int H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
  float eps = c->rms_norm_eps;
  size_t as = be->kind_size(be, BACKEND_KIND_ACT), nh_elems = (size_t)T * H;
  if (as == 4) {
    rc = be->write(be, m->hb, 0, hidden, nh_elems * 4);
  } else {
    uint16_t *h16 = malloc(nh_elems * 2);
    if (!h16) return errf(err, errlen, "out of memory");
    for (size_t i = 0; i < nh_elems; i++) h16[i] = dtype_f32_to_bf16(hidden[i]);
    rc = be->write(be, m->hb, 0, h16, nh_elems * 2);
    free(h16);
  }
  if (rc) return errf(err, errlen, "backend %s: cannot write the hidden states", be->name);
  mtp_layer *L = &m->L[step % m->n_layers];
  be->embed(be, m->embed, H, m->e);
  be->rmsnorm(be, m->e, NULL, m->norm_e, T, H, eps, m->en);
  be->rmsnorm(be, m->hb, NULL, m->norm_h, T, H, eps, m->hn);
  be->matmul(be, m->en, m->fc_e, T, H, H, m->x);
  be->matmul(be, m->hn, m->fc_h, T, H, H, m->mix);
  be->add(be, m->x, m->mix, nh_elems);
  /* the decoder layer (vLLM's with residual None: the residual is fc's output) */
  be->rmsnorm(be, m->x, NULL, L->input_norm, T, H, eps, m->xn);
  be->matmul(be, m->xn, L->q_proj, T, H, nh * 2 * hd, m->qg);
  be->matmul(be, m->xn, L->k_proj, T, H, nkv * hd, m->k);
  be->matmul(be, m->xn, L->v_proj, T, H, nkv * hd, m->v);
  be->qk_norm_rope(be, m->qg, m->k, L->q_norm, L->k_norm, nh, nkv, hd, c->rot_dim, c->rope_theta,
                   eps, m->q, m->gate);
  be->attention(be, L->k_pool, L->v_pool, m->q, m->k, m->v, nh, nkv, hd,
                (float)(1.0 / sqrt((double)hd)), m->att);
  be->sigmoid_mul(be, m->att, m->gate, (size_t)T * nh * hd);
  be->matmul(be, m->att, L->o_proj, T, nh * hd, H, m->mix);
  be->rmsnorm(be, m->x, m->mix, L->post_norm, T, H, eps, m->xn);
  if (m->moe) {
    be->moe(be, m->xn, &L->moe, T, H, m->mix);
  } else {
    int I = c->intermediate_size;
    be->matmul(be, m->xn, L->gate, T, H, I, m->fg);
    be->matmul(be, m->xn, L->up, T, H, I, m->fu);
    be->swiglu(be, m->fg, m->fu, (size_t)T * I, m->fg);
    be->matmul(be, m->fg, L->down, T, I, H, m->mix);
  }
  /* x += mix; y = Norm(x) (the draft's hidden state); logits = lm_head . Norm(x) */
  be->rmsnorm(be, m->x, m->mix, m->norm, T, H, eps, m->hn);
  be->logits(be, m->x, m->norm, eps, m->lm_head, H, c->vocab_size, m->logits);
  *T_out = T;
  return 0;
}

/* hn's rows [r0, r0 + n) into hidden_out [n, H] f32 (0, or -1 with err). */
static int mtp_read_hidden(qwen35_mtp *m, size_t r0, size_t n, float *hidden_out, char *err,
                           size_t errlen) {
  backend *be = m->be;
  size_t H = (size_t)m->c->hidden_size, as = be->kind_size(be, BACKEND_KIND_ACT), ne = n * H;
  int rc;
  if (as == 4) {
    rc = be->read(be, m->hn, r0 * H * 4, hidden_out, ne * 4);
  } else {
    uint16_t *h16 = malloc(ne * 2);
    if (!h16) return errf(err, errlen, "out of memory");
    rc = be->read(be, m->hn, r0 * H * 2, h16, ne * 2);
    for (size_t i = 0; !rc && i < ne; i++) hidden_out[i] = dtype_bf16_to_f32(h16[i]);
    free(h16);
  }
  if (rc) return errf(err, errlen, "backend %s: reading the MTP hidden states failed", be->name);
  return 0;
}

int qwen35_mtp_forward(qwen35_mtp *m, const fwd_seq *seqs, int n_seqs, int step,
                       const float *hidden, float *logits, float *hidden_out, char *err,
                       size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  int T = 0;
  if (mtp_issue(m, seqs, n_seqs, step, hidden, 0, &T, err, errlen)) return -1;
  if (be->read(be, m->logits, 0, logits, (size_t)T * c->vocab_size * 4))
    return errf(err, errlen, "backend %s: reading the MTP logits failed", be->name);
  if (hidden_out && mtp_read_hidden(m, 0, (size_t)T, hidden_out, err, errlen)) return -1;
  return 0;
}

/* the sampler's greedy rule: the first maximum */
static int32_t mtp_argmax(const float *x, int V) {
  int32_t t = 0;
  for (int j = 1; j < V; j++)
    if (x[j] > x[t]) t = j;
  return t;
}

int qwen35_mtp_draft(qwen35_mtp *m, const fwd_seq *seqs, int n_seqs, int step, const float *hidden,
                     int32_t *ids, float *hidden_out, char *err, size_t errlen) {
  const model_config *c = m->c;
  backend *be = m->be;
  int T = 0, V = c->vocab_size;
  if (mtp_issue(m, seqs, n_seqs, step, hidden, 1, &T, err, errlen)) return -1;
  if (be->argmax) { /* the device's first maximum, the same rule: only the ids cross */
    be->argmax(be, m->logits, n_seqs, V, m->ids, NULL);
    if (be->read(be, m->ids, 0, ids, (size_t)n_seqs * sizeof *ids))
      return errf(err, errlen, "backend %s: reading the MTP drafts failed", be->name);
  } else {
    float *lg = malloc((size_t)n_seqs * V * sizeof *lg);
    if (!lg) return errf(err, errlen, "out of memory");
    int rc = be->read(be, m->logits, 0, lg, (size_t)n_seqs * V * sizeof *lg);
    for (int s = 0; !rc && s < n_seqs; s++) ids[s] = mtp_argmax(lg + (size_t)s * V, V);
    free(lg);
    if (rc) return errf(err, errlen, "backend %s: reading the MTP logits failed", be->name);
  }
  if (hidden_out) {
    if (T == n_seqs) return mtp_read_hidden(m, 0, (size_t)T, hidden_out, err, errlen);
    size_t H = (size_t)c->hidden_size;
    for (int s = 0, r = 0; s < n_seqs; r += seqs[s++].n_tokens)
      if (mtp_read_hidden(m, (size_t)(r + seqs[s].n_tokens - 1), 1, hidden_out + (size_t)s * H, err,
                          errlen))
        return -1;
  }
  return 0;
}
