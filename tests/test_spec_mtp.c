/* test_spec_mtp — the MTP head (mtp.* tensors): gen-random writes them in the checkpoint layout,
 * weights.c loads them, and qwen35_mtp's forward on the CPU backend equals a plain fp32
 * reference of vLLM's definition (model/qwen35_mtp.h) computed here from the weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "engine/spec_mtp.h"
#include "base/log.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/qwen35_mtp.h"
#include "model/weights.h"
#include "test.h"

static char root[256], err[512];
static const weights_opts MTP = {.mtp = 1};

#define CFG                                                                              \
  "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":300,\"hidden_size\":48,"              \
  "\"intermediate_size\":80,\"num_hidden_layers\":4,\"num_attention_heads\":4,"          \
  "\"num_key_value_heads\":2,\"head_dim\":16,\"linear_num_key_heads\":2,"                \
  "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":12," \
  "\"linear_conv_kernel_dim\":4,\"partial_rotary_factor\":0.5,\"tie_word_embeddings\":false%s}"

static int make_model(const char *name, const char *extra, char *dir, size_t n) {
  char cfg[400], text[1024];
  snprintf(cfg, sizeof cfg, "%s/%s.config.json", root, name);
  snprintf(dir, n, "%s/%s", root, name);
  snprintf(text, sizeof text, CFG, extra);
  FILE *f = fopen(cfg, "w");
  if (!f) return -1;
  fputs(text, f);
  fclose(f);
  gen_random_opts o = {.seed = 7, .dt = DTYPE_BF16, .threads = 2, .quiet = 1};
  return gen_random_write(cfg, dir, &o, err, sizeof err);
}

/* ---- the fp32 reference ---- */

static float at(const tensor *t, int64_t i) { return tensor_get_f32(t, i); }

/* zero-centred RMSNorm of x[n] with weight w into y */
static void ref_norm(const float *x, const tensor *w, int64_t w0, int n, float eps, float *y) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / n + eps));
  for (int i = 0; i < n; i++) y[i] = x[i] * r * (1.0f + at(w, w0 + i));
}

/* y[N] = W[N, K] (columns [c0, c0 + K) of a matrix of width ld) . x[K] */
static void ref_mv(const tensor *W, int64_t ld, int64_t c0, const float *x, int K, int N,
                   float *y) {
  for (int j = 0; j < N; j++) {
    double s = 0;
    for (int k = 0; k < K; k++) s += (double)at(W, j * ld + c0 + k) * x[k];
    y[j] = (float)s;
  }
}

static void ref_rope(float *x, int rot, double theta, int p) {
  int half = rot / 2;
  for (int i = 0; i < half; i++) {
    double a = p * pow(theta, -2.0 * i / rot);
    float c = (float)cos(a), s = (float)sin(a), x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

/* The MTP rows 0..n-1 of one sequence at positions 0..n-1 (tokens t[r], hidden h[r]): logits
 * [n, V] and y [n, H], by vLLM's definition. */
static void ref_mtp(const model_config *c, const model_weights *w, const int32_t *t, const float *h,
                    int n, float *logits, float *y) {
  const mtp_weights *m = &w->mtp;
  const layer_weights *L = &m->layers[0];
  int H = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim,
      I = c->intermediate_size, V = c->vocab_size;
  float eps = c->rms_norm_eps;
  float *x = calloc((size_t)n * H, 4), *K = calloc((size_t)n * nkv * hd, 4),
        *Vv = calloc((size_t)n * nkv * hd, 4), *Q = calloc((size_t)n * nh * hd, 4),
        *G = calloc((size_t)n * nh * hd, 4), *tmp = calloc((size_t)2 * H + 4 * I + nh * 2 * hd, 4);
  float *a = tmp, *b = a + H, *qg = b + H, *f1 = qg + nh * 2 * hd, *f2 = f1 + I;
  for (int r = 0; r < n; r++) {
    float e[256], en[256], hn[256], xn[256];
    for (int i = 0; i < H; i++) e[i] = at(&w->embed, (int64_t)t[r] * H + i);
    ref_norm(e, &m->pre_fc_norm_embedding, 0, H, eps, en);
    ref_norm(h + (size_t)r * H, &m->pre_fc_norm_hidden, 0, H, eps, hn);
    ref_mv(&m->fc, 2 * H, 0, en, H, H, a); /* embedding half first */
    ref_mv(&m->fc, 2 * H, H, hn, H, H, b);
    for (int i = 0; i < H; i++) x[r * H + i] = a[i] + b[i];
    ref_norm(x + r * H, &L->input_norm, 0, H, eps, xn);
    ref_mv(&L->q_proj, H, 0, xn, H, nh * 2 * hd, qg);
    ref_mv(&L->k_proj, H, 0, xn, H, nkv * hd, K + r * nkv * hd);
    ref_mv(&L->v_proj, H, 0, xn, H, nkv * hd, Vv + r * nkv * hd);
    for (int hh = 0; hh < nh; hh++) {
      ref_norm(qg + hh * 2 * hd, &L->q_norm, 0, hd, eps, Q + (r * nh + hh) * hd);
      ref_rope(Q + (r * nh + hh) * hd, c->rot_dim, c->rope_theta, r);
      memcpy(G + (r * nh + hh) * hd, qg + hh * 2 * hd + hd, (size_t)hd * 4);
    }
    for (int hh = 0; hh < nkv; hh++) {
      float kk[256];
      ref_norm(K + (r * nkv + hh) * hd, &L->k_norm, 0, hd, eps, kk);
      ref_rope(kk, c->rot_dim, c->rope_theta, r);
      memcpy(K + (r * nkv + hh) * hd, kk, (size_t)hd * 4);
    }
  }
  for (int r = 0; r < n; r++) {
    float att[512], o[256], xn[256], mid[256];
    for (int hh = 0; hh < nh; hh++) {
      int kh = hh / (nh / nkv);
      double s[64], mx = -1e30, z = 0;
      for (int j = 0; j <= r; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++)
          d += (double)Q[(r * nh + hh) * hd + i] * K[(j * nkv + kh) * hd + i];
        s[j] = d / sqrt((double)hd);
        if (s[j] > mx) mx = s[j];
      }
      for (int j = 0; j <= r; j++) z += s[j] = exp(s[j] - mx);
      for (int i = 0; i < hd; i++) {
        double v = 0;
        for (int j = 0; j <= r; j++) v += s[j] / z * Vv[(j * nkv + kh) * hd + i];
        float g = G[(r * nh + hh) * hd + i];
        att[hh * hd + i] = (float)v / (1.0f + expf(-g));
      }
    }
    ref_mv(&L->o_proj, nh * hd, 0, att, nh * hd, H, o);
    for (int i = 0; i < H; i++) mid[i] = x[r * H + i] + o[i];
    ref_norm(mid, &L->post_norm, 0, H, eps, xn);
    ref_mv(&L->gate_proj, H, 0, xn, H, I, f1);
    ref_mv(&L->up_proj, H, 0, xn, H, I, f2);
    for (int i = 0; i < I; i++) f1[i] = f1[i] / (1.0f + expf(-f1[i])) * f2[i];
    ref_mv(&L->down_proj, I, 0, f1, I, H, o);
    for (int i = 0; i < H; i++) mid[i] += o[i];
    ref_norm(mid, &m->norm, 0, H, eps, y + (size_t)r * H);
    ref_mv(&w->lm_head, H, 0, y + (size_t)r * H, H, V, logits + (size_t)r * V);
  }
  free(x), free(K), free(Vv), free(Q), free(G), free(tmp);
}

static double max_rel(const float *a, const float *b, size_t n) {
  double amax = 0, d = 0;
  for (size_t i = 0; i < n; i++) {
    if (fabs(b[i]) > amax) amax = fabs(b[i]);
    if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
  }
  return d / (amax > 0 ? amax : 1);
}

/* ---- tests ---- */

TEST(gen_random_and_load) {
  char dir[400];
  model_config c;
  model_weights w;
  REQUIRE(make_model("plain", "", dir, sizeof dir) == 0);
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  EXPECT(c.mtp_layers == 0 && w.mtp.n_layers == 0 && !w.mtp.fc.data);
  weights_free(&w);
  REQUIRE(make_model("mtp", ",\"mtp_num_hidden_layers\":1", dir, sizeof dir) == 0);
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  EXPECT(c.mtp_layers == 1 && w.mtp.n_layers == 1);
  EXPECT(w.mtp.fc.shape[0] == 48 && w.mtp.fc.shape[1] == 96);
  EXPECT(weights_raw(&w, "mtp.pre_fc_norm_embedding.weight", NULL) &&
         weights_raw(&w, "mtp.pre_fc_norm_hidden.weight", NULL) &&
         weights_raw(&w, "mtp.layers.0.self_attn.q_proj.weight", NULL) &&
         weights_raw(&w, "mtp.layers.0.mlp.down_proj.weight", NULL) &&
         weights_raw(&w, "mtp.norm.weight", NULL));
  EXPECT(w.mtp.layers[0].q_proj.shape[0] == 4 * 2 * 16 && w.mtp.layers[0].gate_proj.data);
  /* the target's tensors keep their values (the MTP tensors come last in the file) */
  model_config c0;
  model_weights w0;
  snprintf(dir, sizeof dir, "%s/plain", root);
  REQUIRE(model_load(dir, &c0, &w0, err, sizeof err) == 0);
  EXPECT(!memcmp(w0.embed.data, w.embed.data, 300 * 48 * 2));
  EXPECT(!memcmp(w0.layers[3].q_proj.data, w.layers[3].q_proj.data, 128 * 48 * 2));
  weights_free(&w0);
  /* without weights_opts.mtp the head is not read */
  snprintf(dir, sizeof dir, "%s/mtp", root);
  REQUIRE(model_load(dir, &c0, &w0, err, sizeof err) == 0);
  EXPECT(c0.mtp_layers == 1 && w0.mtp.n_layers == 0 && !w0.mtp.layers);
  weights_free(&w0);
  weights_free(&w);
}

TEST(forward_matches_reference) {
  char dir[400];
  model_config c;
  model_weights w;
  snprintf(dir, sizeof dir, "%s/mtp", root);
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  backend *be = backend_cpu_create(2);
  REQUIRE(be);
  qwen35 *t = NULL;
  qwen35_mtp *m = NULL;
  qwen35_mem_opts mo = {.n_pages = 4, .n_slots = 2};
  REQUIRE(qwen35_init(&t, &c, &w, be, &mo, err, sizeof err) == 0);
  REQUIRE(qwen35_mtp_init(&m, t, &w, be, 4, err, sizeof err) == 0);
  enum { N = 20, H = 48, V = 300 };
  int32_t tok[N];
  float *h = malloc(sizeof(float) * N * H), *lg = malloc(sizeof(float) * N * V),
        *y = malloc(sizeof(float) * N * H), *rl = malloc(sizeof(float) * N * V),
        *ry = malloc(sizeof(float) * N * H);
  uint32_t s = 12345;
  for (int i = 0; i < N; i++) tok[i] = (int32_t)((s = s * 1103515245u + 12345u) >> 8) % V;
  for (int i = 0; i < N * H; i++)
    h[i] = (float)(((s = s * 1103515245u + 12345u) >> 8) % 2001) / 1000.0f - 1.0f;
  ref_mtp(&c, &w, tok, h, N, rl, ry);
  /* rows 0..16 as one piece (crosses a page), then 17, 18, 19 one at a time: the MTP's own K/V
   * pages carry the earlier rows */
  int32_t pages[2] = {3, 1};
  fwd_seq q = {.tokens = tok, .n_tokens = 17, .pos = 0, .pages = pages, .n_pages = 2};
  REQUIRE(qwen35_mtp_forward(m, &q, 1, 0, h, lg, y, err, sizeof err) == 0);
  for (int r = 17; r < N; r++) {
    fwd_seq d = {.tokens = tok + r, .n_tokens = 1, .pos = r, .pages = pages, .n_pages = 2};
    REQUIRE(qwen35_mtp_forward(m, &d, 1, 0, h + r * H, lg + r * V, y + r * H, err, sizeof err) ==
            0);
  }
  double el = max_rel(lg, rl, (size_t)N * V), ey = max_rel(y, ry, (size_t)N * H);
  printf("  mtp forward vs fp32 reference: logits %.2e, hidden %.2e (relative to max)\n", el, ey);
  EXPECT(el < 1e-4 && ey < 1e-4);
  /* it is really the MTP: another hidden state changes the logits */
  float *lg2 = malloc(sizeof(float) * V);
  h[19 * H] += 1.0f;
  fwd_seq d = {.tokens = tok + 19, .n_tokens = 1, .pos = 19, .pages = pages, .n_pages = 2};
  REQUIRE(qwen35_mtp_forward(m, &d, 1, 0, h + 19 * H, lg2, NULL, err, sizeof err) == 0);
  EXPECT(max_rel(lg2, lg + 19 * V, V) > 1e-3);
  free(lg2), free(h), free(lg), free(y), free(rl), free(ry);
  qwen35_mtp_free(m);
  qwen35_free(t);
  be->destroy(be);
  weights_free(&w);
}

static int32_t argmax_row(const float *x, int V) {
  int32_t t = 0;
  for (int j = 1; j < V; j++)
    if (x[j] > x[t]) t = j;
  return t;
}

/* The PyTorch definition (scripts/device/mtp_train.py, transformers' Qwen3.5 decoder layer and
 * vLLM's MTP wiring) on its fixture tests/fixtures/mtp_parity: the target's hidden rows
 * of a 20-token prompt (qwen35_forward_hidden) fed with the next tokens give the MTP logits
 * PyTorch computed in fp32 from the same bf16 weights; the drafting path (qwen35_mtp_draft) picks
 * each piece's last row's argmax. */
TEST(forward_matches_pytorch) {
  const char *dir = "tests/fixtures/mtp_parity";
  model_config c;
  model_weights w;
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  char path[300];
  snprintf(path, sizeof path, "%s/ref.json", dir);
  FILE *f = fopen(path, "r");
  REQUIRE(f);
  char js[8192];
  size_t nr = fread(js, 1, sizeof js - 1, f);
  fclose(f);
  js[nr] = 0;
  enum { N = 20 };
  int32_t prompt[N], next[N];
  const char *pp = strstr(js, "\"prompt\": ["), *pn = strstr(js, "\"next\": [");
  REQUIRE(pp && pn);
  pp = strchr(pp, '[') + 1;
  pn = strchr(pn, '[') + 1;
  for (int i = 0; i < N; i++) {
    prompt[i] = (int32_t)strtol(pp, (char **)&pp, 10);
    next[i] = (int32_t)strtol(pn, (char **)&pn, 10);
    pp += strspn(pp, ", ");
    pn += strspn(pn, ", ");
  }
  size_t V = (size_t)c.vocab_size, H = (size_t)c.hidden_size;
  float *ref = malloc(sizeof(float) * N * V), *lg = malloc(sizeof(float) * N * V),
        *tl = malloc(sizeof(float) * N * V), *h = malloc(sizeof(float) * N * H);
  snprintf(path, sizeof path, "%s/mtp_logits.bin", dir);
  f = fopen(path, "rb");
  REQUIRE(f);
  EXPECT(fread(ref, sizeof(float), N * V, f) == N * V);
  fclose(f);
  backend *be = backend_cpu_create(2);
  qwen35 *t = NULL;
  qwen35_mtp *m = NULL;
  qwen35_mem_opts mo = {.n_pages = 4, .n_slots = 2};
  REQUIRE(qwen35_init(&t, &c, &w, be, &mo, err, sizeof err) == 0);
  REQUIRE(qwen35_mtp_init(&m, t, &w, be, 4, err, sizeof err) == 0);
  int32_t pt[2] = {0, 1}, mp[2] = {2, 3};
  fwd_seq q = {prompt, N, 0, pt, 2, 0, QWEN35_LOGITS_ALL, -1};
  REQUIRE(qwen35_forward_hidden(t, &q, 1, tl, h, err, sizeof err) == 0);
  fwd_seq d = {.tokens = next, .n_tokens = N, .pos = 0, .pages = mp, .n_pages = 2};
  REQUIRE(qwen35_mtp_forward(m, &d, 1, 0, h, lg, NULL, err, sizeof err) == 0);
  double e = max_rel(lg, ref, (size_t)N * V);
  printf("  mtp forward vs PyTorch (fixture): logits %.2e (relative to max)\n", e);
  EXPECT_MSG(e < 1e-4, "MTP logits differ from PyTorch's: %.3e", e);
  /* the drafting path: rows 0..9 and 10..19 as two pieces, each piece's last row's argmax */
  int32_t ids[2];
  fwd_seq two[2] = {{.tokens = next, .n_tokens = 10, .pos = 0, .pages = mp, .n_pages = 2},
                    {.tokens = next + 10, .n_tokens = 10, .pos = 10, .pages = mp, .n_pages = 2}};
  REQUIRE(qwen35_mtp_draft(m, &two[1], 1, 0, h + 10 * H, &ids[1], NULL, err, sizeof err) == 0);
  REQUIRE(qwen35_mtp_draft(m, &two[0], 1, 0, h, &ids[0], NULL, err, sizeof err) == 0);
  EXPECT_MSG(
      ids[0] == argmax_row(ref + 9 * V, (int)V) && ids[1] == argmax_row(ref + 19 * V, (int)V),
      "drafts %d %d, PyTorch argmax %d %d", ids[0], ids[1], argmax_row(ref + 9 * V, (int)V),
      argmax_row(ref + 19 * V, (int)V));
  free(ref), free(lg), free(tl), free(h);
  qwen35_mtp_free(m);
  qwen35_free(t);
  be->destroy(be);
  weights_free(&w);
}

/* Greedy decoding with MTP drafts verified as verify pieces (keep slots, the kept state copied
 * back) gives the plain greedy tokens; the drafter is really used (drafts > 0). Besides, the
 * target's hidden rows (qwen35_forward_hidden) are what its logits come from: lm_head . h. */
TEST(greedy_lossless_with_mtp_drafts) {
  enum { K = 3, NP = 12, GEN = 40, H = 48, V = 300, PAGES = 8 };
  char dir[400];
  model_config c;
  model_weights w;
  snprintf(dir, sizeof dir, "%s/mtp", root);
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  backend *be = backend_cpu_create(2);
  REQUIRE(be);
  qwen35 *t = NULL;
  spec_mtp *sm = NULL;
  qwen35_mem_opts mo = {.n_pages = 2 * PAGES, .n_slots = 2, .keep_k = K, .keep_lanes = 2};
  REQUIRE(qwen35_init(&t, &c, &w, be, &mo, err, sizeof err) == 0);
  REQUIRE(spec_mtp_init(&sm, t, &w, be, 2 * PAGES, err, sizeof err) == 0);
  int32_t prompt[NP], ref[GEN + 1], got[GEN + K + 2], pa[PAGES], pb[PAGES];
  for (int i = 0; i < PAGES; i++) pa[i] = i, pb[i] = PAGES + i;
  for (int i = 0; i < NP; i++) prompt[i] = (i * 37 + 11) % V;
  float *lg = malloc(sizeof(float) * (K + 1) * V), *hid = malloc(sizeof(float) * NP * H);
  /* plain greedy on slot 0 */
  fwd_seq p0 = {prompt, NP, 0, pa, PAGES, 0, QWEN35_LOGITS_LAST, -1};
  REQUIRE(qwen35_forward(t, &p0, 1, lg, err, sizeof err) == 0);
  ref[0] = argmax_row(lg, V);
  for (int i = 0; i < GEN; i++) {
    fwd_seq d = {&ref[i], 1, NP + i, pa, PAGES, 0, QWEN35_LOGITS_LAST, -1};
    REQUIRE(qwen35_forward(t, &d, 1, lg, err, sizeof err) == 0);
    ref[i + 1] = argmax_row(lg, V);
  }
  /* speculative on slot 1 */
  fwd_seq p1 = {prompt, NP, 0, pb, PAGES, 1, QWEN35_LOGITS_LAST, -1};
  REQUIRE(qwen35_forward_hidden(t, &p1, 1, lg, hid, err, sizeof err) == 0);
  got[0] = argmax_row(lg, V);
  /* the hidden rows are what the logits come from */
  double dmax = 0;
  for (int j = 0; j < V; j++) {
    double sacc = 0;
    for (int i = 0; i < H; i++)
      sacc += (double)tensor_get_f32(&w.lm_head, (int64_t)j * H + i) * hid[(NP - 1) * H + i];
    if (fabs(sacc - lg[j]) > dmax) dmax = fabs(sacc - lg[j]);
  }
  EXPECT_MSG(dmax < 1e-4, "lm_head . hidden differs from the logits by %g", dmax);
  int32_t next[NP], drafts[K];
  for (int i = 0; i < NP - 1; i++) next[i] = prompt[i + 1];
  next[NP - 1] = got[0];
  REQUIRE(spec_mtp_step(sm, pb, PAGES, 0, NP, next, hid, K, drafts, err, sizeof err) == 0);
  int n_got = 1, cur = NP, n_drafts = 0, n_draft_tokens = 0, n_acc = 0;
  float *vh = malloc(sizeof(float) * (K + 1) * H);
  /* every accepted position's target hidden row, for the check of the MTP state below */
  float *allh = malloc(sizeof(float) * (NP + GEN + K + 2) * H);
  memcpy(allh, hid, sizeof(float) * NP * H);
  while (n_got <= GEN) {
    int32_t piece[K + 1] = {got[n_got - 1]};
    memcpy(piece + 1, drafts, sizeof drafts);
    fwd_seq v = {piece, K + 1, cur, pb, PAGES, 1, QWEN35_LOGITS_VERIFY, 1};
    REQUIRE(qwen35_forward_hidden(t, &v, 1, lg, vh, err, sizeof err) == 0);
    int a = 0;
    while (a < K && argmax_row(lg + (size_t)a * V, V) == drafts[a]) a++;
    for (int j = 0; j < a; j++) got[n_got++] = drafts[j];
    got[n_got++] = argmax_row(lg + (size_t)a * V, V);
    if (a < K) REQUIRE(qwen35_slot_copy(t, 1, qwen35_keep_slot(t, 1, a)) == 0);
    n_drafts++;
    n_draft_tokens += K;
    n_acc += a;
    REQUIRE(spec_mtp_step(sm, pb, PAGES, cur, a + 1, got + n_got - 1 - a, vh, K, drafts, err,
                          sizeof err) == 0);
    memcpy(allh + (size_t)cur * H, vh, sizeof(float) * (a + 1) * H);
    cur += a + 1;
  }
  EXPECT_MSG(!memcmp(got, ref, sizeof ref), "MTP-speculative greedy tokens differ from plain");
  EXPECT(n_drafts > 0 && n_draft_tokens > 0);
  printf(
      "  MTP drafts on the random fixture: %d verify steps, %d drafted, %d accepted "
      "(acceptance length %.2f)\n",
      n_drafts, n_draft_tokens, n_acc, 1.0 + (double)n_acc / n_drafts);
  /* the MTP state is exactly that of the accepted sequence: feeding all of it at once into
   * other pages gives the same drafts bit for bit (rows written for rejected drafts were
   * written again before any row read them) */
  int32_t *seq = malloc(sizeof(int32_t) * (size_t)(cur + 1)), d2[K];
  memcpy(seq, prompt, sizeof prompt);
  memcpy(seq + NP, got, sizeof(int32_t) * (size_t)(cur + 1 - NP));
  REQUIRE(spec_mtp_step(sm, pa, PAGES, 0, cur, seq + 1, allh, K, d2, err, sizeof err) == 0);
  EXPECT_MSG(!memcmp(d2, drafts, sizeof d2), "the MTP state after speculation differs");
  free(seq), free(allh);
  free(lg), free(hid), free(vh);
  spec_mtp_free(sm);
  qwen35_free(t);
  be->destroy(be);
  weights_free(&w);
}

TEST(init_refuses_without_head) {
  char dir[400];
  model_config c;
  model_weights w;
  snprintf(dir, sizeof dir, "%s/plain", root);
  REQUIRE(model_load_with(dir, &MTP, &c, &w, err, sizeof err) == 0);
  backend *be = backend_cpu_create(1);
  REQUIRE(be);
  qwen35 *t = NULL;
  qwen35_mtp *m = NULL;
  qwen35_mem_opts mo = {.n_pages = 2, .n_slots = 1};
  REQUIRE(qwen35_init(&t, &c, &w, be, &mo, err, sizeof err) == 0);
  EXPECT(qwen35_mtp_init(&m, t, &w, be, 4, err, sizeof err) == -1 && !m && strstr(err, "MTP"));
  qwen35_free(t);
  be->destroy(be);
  weights_free(&w);
}

int main(void) {
  log_set_level(LOG_LEVEL_WARN);
  snprintf(root, sizeof root, "/tmp/ds_test_spec_mtp_XXXXXX");
  if (!mkdtemp(root)) {
    printf("FAIL mkdtemp\n");
    return 1;
  }
  RUN(gen_random_and_load);
  RUN(forward_matches_reference);
  RUN(forward_matches_pytorch);
  RUN(greedy_lossless_with_mtp_drafts);
  RUN(init_refuses_without_head);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd)) printf("note: could not remove %s\n", root);
  TEST_MAIN_END();
}
