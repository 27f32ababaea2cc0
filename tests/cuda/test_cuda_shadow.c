/* test_cuda_shadow — the forward pass run on a "shadow" backend that issues every op on both
 * the CPU reference backend and the CUDA backend, compares each op's outputs on the model's
 * real data, then gives both the CPU result (rounded to bf16 for bf16 kinds) so that every op
 * is judged on identical inputs. Reports, per op, the worst ||cuda - cpu|| / ||cpu|| over all
 * calls, and fails when one exceeds SHADOW_TOL (bf16 outputs round at 2^-9 relative; bf16 weight
 * copies of f32 checkpoints add about as much). GPU machine only (scripts/device/check.sh). */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "model/qwen35.h"
#include "ref_io.h"
#include "test.h"

#define FIXTURES "tests/fixtures/models"
#define SHADOW_TOL 2e-2

/* DS_SHADOW_DIR: a folder of model folders instead of the fixtures (scripts/device/
 * check_real.sh points it at the real-shape reference models) */
static const char *shadow_dir = FIXTURES;

static backend *C, *G;

typedef struct sbuf {
  backend_buf c, g;
  backend_kind kind;
  size_t n;
} sbuf;
typedef struct swt {
  backend_weight c, g;
} swt;
#define SB(b) ((sbuf *)(b))
#define SW(w) ((swt *)(w))
#define WC(w) ((w) ? SW(w)->c : NULL)
#define WG(w) ((w) ? SW(w)->g : NULL)

static backend_batch hb; /* host copy of the last batch */
static int32_t hb_arr[1 << 16];

/* ---- stats ---- */
typedef struct {
  const char *op;
  double worst;
  long calls;
} stat;
static stat stats[64];
static int nstats;
static long op_index;
static char first_bad[256];

static void note(const char *op, double e) {
  int i;
  for (i = 0; i < nstats && strcmp(stats[i].op, op); i++) {
  }
  if (i == nstats) stats[nstats++] = (stat){op, 0, 0};
  stats[i].calls++;
  if (!(e <= stats[i].worst)) stats[i].worst = e;
  if (!(e <= SHADOW_TOL) && !first_bad[0])
    snprintf(first_bad, sizeof first_bad, "op #%ld %s: rel err %.3e", op_index, op, e);
}

/* Compares elements [off, off+n) of a shadow buffer, then copies the CPU values to the GPU. */
static void cmp(const char *op, backend_buf b, size_t off, size_t n) {
  if (!n) return;
  sbuf *s = SB(b);
  size_t es = G->kind_size(G, s->kind);
  float *rc = malloc(n * 4), *rg = malloc(n * 4);
  C->read(C, s->c, off * 4, rc, n * 4);
  if (es == 4) {
    G->read(G, s->g, off * 4, rg, n * 4);
  } else {
    uint16_t *t = malloc(n * 2);
    G->read(G, s->g, off * 2, t, n * 2);
    for (size_t i = 0; i < n; i++) rg[i] = b2f(t[i]);
    for (size_t i = 0; i < n; i++) t[i] = f2b(rc[i]);
    G->write(G, s->g, off * 2, t, n * 2);
    /* both sides continue from the same bf16 values */
    float *r2 = malloc(n * 4);
    for (size_t i = 0; i < n; i++) r2[i] = b2f(t[i]);
    C->write(C, s->c, off * 4, r2, n * 4);
    free(r2);
    free(t);
  }
  if (es == 4) G->write(G, s->g, off * 4, rc, n * 4);
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) {
    double x = (double)rg[i] - rc[i];
    d += x * x;
    r += (double)rc[i] * rc[i];
  }
  note(op, r > 0 ? sqrt(d / r) : (d > 0 ? INFINITY : 0));
  free(rc);
  free(rg);
}

/* Per-row view of the MoE op (a routing flip on a near-tied router score moves single rows
 * far; a kernel defect moves every row): rows whose rel err exceeds SHADOW_TOL. */
static long moe_rows, moe_rows_bad;
static double moe_row_median_sum;
static void moe_rows_note(backend_buf b, int T, int H) {
  if (T <= 0 || H <= 0) return;
  sbuf *s = SB(b);
  size_t n = (size_t)T * H;
  float *rc = malloc(n * 4), *rg = malloc(n * 4);
  double *e = calloc((size_t)T, sizeof(double));
  uint16_t *t = malloc(n * 2);
  C->read(C, s->c, 0, rc, n * 4);
  G->read(G, s->g, 0, t, n * 2);
  for (size_t i = 0; i < n; i++) rg[i] = b2f(t[i]);
  for (int r = 0; r < T; r++) {
    double d = 0, q = 0;
    for (int j = 0; j < H; j++) {
      double x = (double)rg[(size_t)r * H + j] - rc[(size_t)r * H + j];
      d += x * x;
      q += (double)rc[(size_t)r * H + j] * rc[(size_t)r * H + j];
    }
    e[r] = q > 0 ? sqrt(d / q) : 0;
    moe_rows++;
    moe_rows_bad += !(e[r] <= SHADOW_TOL);
  }
  /* median of this call's rows (insertion sort: T is small) */
  for (int i = 1; i < T; i++)
    for (int j = i; j > 0 && e[j - 1] > e[j]; j--) {
      double x = e[j];
      e[j] = e[j - 1];
      e[j - 1] = x;
    }
  moe_row_median_sum += e[T / 2];
  free(rc);
  free(rg);
  free(e);
  free(t);
}

/* ---- the shadow table ---- */

static void s_destroy(backend *be) { free(be); }
static size_t s_kind_size(backend *be, backend_kind k) {
  (void)be;
  (void)k;
  return 4; /* the model sees CPU layout; slot/page byte offsets use this */
}
static backend_buf s_alloc(backend *be, backend_kind kind, size_t n) {
  (void)be;
  sbuf *s = calloc(1, sizeof *s);
  s->c = C->alloc(C, kind, n);
  s->g = G->alloc(G, kind, n);
  s->kind = kind;
  s->n = n;
  C->zero(C, s->c, 0, n * 4);
  G->zero(G, s->g, 0, n * G->kind_size(G, kind));
  return s;
}
static void s_free(backend *be, backend_buf b) {
  (void)be;
  if (!b) return;
  C->free(C, SB(b)->c);
  G->free(G, SB(b)->g);
  free(b);
}
/* host copies in CPU layout (4-byte elements); the GPU copy is converted */
static int s_write(backend *be, backend_buf b, size_t off, const void *src, size_t n) {
  (void)be;
  sbuf *s = SB(b);
  int rc = C->write(C, s->c, off, src, n);
  if (G->kind_size(G, s->kind) == 4) return rc | G->write(G, s->g, off, src, n);
  size_t k = n / 4;
  uint16_t *t = malloc(k * 2 + 2);
  for (size_t i = 0; i < k; i++) t[i] = f2b(((const float *)src)[i]);
  rc |= G->write(G, s->g, off / 2, t, k * 2);
  free(t);
  return rc;
}
static int s_read(backend *be, backend_buf b, size_t off, void *dst, size_t n) {
  (void)be;
  return C->read(C, SB(b)->c, off, dst, n);
}
static void s_copy(backend *be, backend_buf d, size_t doff, backend_buf s, size_t soff, size_t n) {
  (void)be;
  C->copy(C, SB(d)->c, doff, SB(s)->c, soff, n);
  size_t es = G->kind_size(G, SB(d)->kind);
  G->copy(G, SB(d)->g, doff / 4 * es, SB(s)->g, soff / 4 * es, n / 4 * es);
}
static void s_zero(backend *be, backend_buf b, size_t off, size_t n) {
  (void)be;
  C->zero(C, SB(b)->c, off, n);
  size_t es = G->kind_size(G, SB(b)->kind);
  G->zero(G, SB(b)->g, off / 4 * es, n / 4 * es);
}
static backend_weight s_wup(backend *be, const void *d, dtype dt, int64_t r, int64_t c) {
  (void)be;
  swt *w = malloc(sizeof *w);
  w->c = C->weight_upload(C, d, dt, r, c);
  w->g = G->weight_upload(G, d, dt, r, c);
  return w;
}
static backend_weight s_wup_exact(backend *be, const void *d, dtype dt, int64_t r, int64_t c) {
  (void)be;
  swt *w = malloc(sizeof *w);
  w->c = C->weight_upload(C, d, dt, r, c);
  w->g = G->weight_upload_exact(G, d, dt, r, c);
  return w;
}
static void s_wfree(backend *be, backend_weight w) {
  (void)be;
  if (!w) return;
  C->weight_free(C, SW(w)->c);
  G->weight_free(G, SW(w)->g);
  free(w);
}
static size_t s_wbytes(backend *be, backend_weight w) {
  return C->weight_bytes(C, SW(w)->c) + 0 * (size_t)be;
}
static int s_set_batch(backend *be, const backend_batch *b) {
  (void)be;
  size_t T = (size_t)b->n_tokens, S = (size_t)b->n_seqs;
  int32_t *p = hb_arr;
  hb = *b;
#define TK(f, n) memcpy(p, b->f, (n)*4), hb.f = p, p += (n)
  TK(tokens, T);
  TK(pos, T);
  TK(seq, T);
  TK(seq_start, S);
  TK(seq_len, S);
  TK(seq_pos, S);
  TK(seq_slot, S);
  TK(page_table, S * (size_t)b->max_pages);
  if (b->n_out) TK(out_rows, (size_t)b->n_out);
#undef TK
  return C->set_batch(C, b) | G->set_batch(G, b);
}
static int s_sync(backend *be, char *err, size_t errlen) {
  (void)be;
  return C->sync(C, err, errlen) | G->sync(G, err, errlen);
}

#define BC(x) ((x) ? SB(x)->c : NULL)
#define BG(x) ((x) ? SB(x)->g : NULL)

static void s_embed(backend *be, backend_weight E, int H, backend_buf out) {
  (void)be;
  op_index++;
  C->embed(C, WC(E), H, BC(out));
  G->embed(G, WG(E), H, BG(out));
  cmp("embed", out, 0, (size_t)hb.n_tokens * H);
}
static void s_rmsnorm(backend *be, backend_buf x, backend_buf add, backend_weight w, int T, int n,
                      float eps, backend_buf y) {
  (void)be;
  op_index++;
  C->rmsnorm(C, BC(x), BC(add), WC(w), T, n, eps, BC(y));
  G->rmsnorm(G, BG(x), BG(add), WG(w), T, n, eps, BG(y));
  if (add) cmp("rmsnorm(residual)", x, 0, (size_t)T * n);
  cmp("rmsnorm", y, 0, (size_t)T * n);
}
static void s_add(backend *be, backend_buf x, backend_buf y, size_t n) {
  (void)be;
  op_index++;
  C->add(C, BC(x), BC(y), n);
  G->add(G, BG(x), BG(y), n);
  cmp("add", x, 0, n);
}
static void s_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                     backend_buf y) {
  (void)be;
  op_index++;
  C->matmul(C, BC(x), WC(W), T, K, N, BC(y));
  G->matmul(G, BG(x), WG(W), T, K, N, BG(y));
  cmp("matmul", y, 0, (size_t)T * N);
}
static void s_qkr(backend *be, backend_buf qg, backend_buf k, backend_weight qn, backend_weight kn,
                  int nh, int nkv, int hd, int rot, double theta, float eps, backend_buf qo,
                  backend_buf go) {
  (void)be;
  op_index++;
  C->qk_norm_rope(C, BC(qg), BC(k), WC(qn), WC(kn), nh, nkv, hd, rot, theta, eps, BC(qo), BC(go));
  G->qk_norm_rope(G, BG(qg), BG(k), WG(qn), WG(kn), nh, nkv, hd, rot, theta, eps, BG(qo), BG(go));
  size_t T = (size_t)hb.n_tokens;
  cmp("qk_norm_rope(q)", qo, 0, T * nh * hd);
  cmp("qk_norm_rope(gate)", go, 0, T * nh * hd);
  cmp("qk_norm_rope(k)", k, 0, T * nkv * hd);
}
static void s_attention(backend *be, backend_buf kp, backend_buf vp, backend_buf q, backend_buf k,
                        backend_buf v, int nh, int nkv, int hd, float scale, backend_buf out) {
  (void)be;
  op_index++;
  C->attention(C, BC(kp), BC(vp), BC(q), BC(k), BC(v), nh, nkv, hd, scale, BC(out));
  G->attention(G, BG(kp), BG(vp), BG(q), BG(k), BG(v), nh, nkv, hd, scale, BG(out));
  cmp("attention", out, 0, (size_t)hb.n_tokens * nh * hd);
  cmp("attention(k pool)", kp, 0, SB(kp)->n);
  cmp("attention(v pool)", vp, 0, SB(vp)->n);
}
static void s_sigmoid_mul(backend *be, backend_buf x, backend_buf g, size_t n) {
  (void)be;
  op_index++;
  C->sigmoid_mul(C, BC(x), BC(g), n);
  G->sigmoid_mul(G, BG(x), BG(g), n);
  cmp("sigmoid_mul", x, 0, n);
}
static void s_swiglu(backend *be, backend_buf g, backend_buf u, size_t n, backend_buf out) {
  (void)be;
  op_index++;
  C->swiglu(C, BC(g), BC(u), n, BC(out));
  G->swiglu(G, BG(g), BG(u), n, BG(out));
  cmp("swiglu", out, 0, n);
}
static void s_moe(backend *be, backend_buf x, const backend_moe *m, int T, int H, backend_buf out) {
  (void)be;
  op_index++;
  int E = m->n_experts;
  backend_weight *cw = malloc(sizeof *cw * 6 * (size_t)E);
  for (int e = 0; e < E; e++) {
    cw[e] = WC(m->gate[e]), cw[E + e] = WC(m->up[e]), cw[2 * E + e] = WC(m->down[e]);
    cw[3 * E + e] = WG(m->gate[e]), cw[4 * E + e] = WG(m->up[e]), cw[5 * E + e] = WG(m->down[e]);
  }
  backend_moe mc = *m, mg = *m;
  mc.router = WC(m->router), mg.router = WG(m->router);
  mc.gate = cw, mc.up = cw + E, mc.down = cw + 2 * E;
  mg.gate = cw + 3 * E, mg.up = cw + 4 * E, mg.down = cw + 5 * E;
  mc.shared_gate = WC(m->shared_gate), mg.shared_gate = WG(m->shared_gate);
  mc.shared_up = WC(m->shared_up), mg.shared_up = WG(m->shared_up);
  mc.shared_down = WC(m->shared_down), mg.shared_down = WG(m->shared_down);
  mc.shared_expert_gate = WC(m->shared_expert_gate),
  mg.shared_expert_gate = WG(m->shared_expert_gate);
  C->moe(C, BC(x), &mc, T, H, BC(out));
  G->moe(G, BG(x), &mg, T, H, BG(out));
  G->sync(G, NULL, 0);
  moe_rows_note(out, T, H);
  cmp("moe", out, 0, (size_t)T * H);
  free(cw);
}
static void s_conv1d(backend *be, backend_buf st, backend_buf x, backend_weight w, int Cc, int K,
                     backend_buf out) {
  (void)be;
  op_index++;
  C->conv1d(C, BC(st), BC(x), WC(w), Cc, K, BC(out));
  G->conv1d(G, BG(st), BG(x), WG(w), Cc, K, BG(out));
  cmp("conv1d", out, 0, (size_t)hb.n_tokens * Cc);
  cmp("conv1d(state)", st, 0, SB(st)->n);
}
static void s_gates(backend *be, backend_buf qkv, backend_buf b, backend_buf a, backend_weight al,
                    backend_weight db, int nk, int nv, int dk, int dv, backend_buf beta,
                    backend_buf g) {
  (void)be;
  op_index++;
  C->gdn_gates(C, BC(qkv), BC(b), BC(a), WC(al), WC(db), nk, nv, dk, dv, BC(beta), BC(g));
  G->gdn_gates(G, BG(qkv), BG(b), BG(a), WG(al), WG(db), nk, nv, dk, dv, BG(beta), BG(g));
  size_t T = (size_t)hb.n_tokens;
  cmp("gdn_gates(qkv)", qkv, 0, T * (2 * (size_t)nk * dk + (size_t)nv * dv));
  cmp("gdn_gates(beta)", beta, 0, T * nv);
  cmp("gdn_gates(g)", g, 0, T * nv);
}
static void gdn_cmp(const char *op, const char *op_s, backend_buf ssm, backend_buf out, int nv,
                    int dk, int dv, int prefill) {
  for (int s = 0; s < hb.n_seqs; s++) {
    if ((hb.seq_len[s] > 1) != prefill) continue;
    cmp(op, out, (size_t)hb.seq_start[s] * nv * dv, (size_t)hb.seq_len[s] * nv * dv);
    size_t sz = (size_t)nv * dk * dv;
    cmp(op_s, ssm, (size_t)hb.seq_slot[s] * sz, sz);
  }
}
static void s_prefill(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta,
                      backend_buf g, int nk, int nv, int dk, int dv, backend_buf out) {
  (void)be;
  op_index++;
  C->gdn_prefill(C, BC(ssm), BC(qkv), BC(beta), BC(g), nk, nv, dk, dv, BC(out));
  G->gdn_prefill(G, BG(ssm), BG(qkv), BG(beta), BG(g), nk, nv, dk, dv, BG(out));
  gdn_cmp("gdn_prefill", "gdn_prefill(state)", ssm, out, nv, dk, dv, 1);
}
static void s_decode(backend *be, backend_buf ssm, backend_buf qkv, backend_buf beta, backend_buf g,
                     int nk, int nv, int dk, int dv, backend_buf out) {
  (void)be;
  op_index++;
  C->gdn_decode(C, BC(ssm), BC(qkv), BC(beta), BC(g), nk, nv, dk, dv, BC(out));
  G->gdn_decode(G, BG(ssm), BG(qkv), BG(beta), BG(g), nk, nv, dk, dv, BG(out));
  gdn_cmp("gdn_decode", "gdn_decode(state)", ssm, out, nv, dk, dv, 0);
}
static void s_gnorm(backend *be, backend_buf o, backend_buf z, backend_weight w, int T, int nv,
                    int dv, float eps, backend_buf out) {
  (void)be;
  op_index++;
  C->gated_rmsnorm(C, BC(o), BC(z), WC(w), T, nv, dv, eps, BC(out));
  G->gated_rmsnorm(G, BG(o), BG(z), WG(w), T, nv, dv, eps, BG(out));
  cmp("gated_rmsnorm", out, 0, (size_t)T * nv * dv);
}
static void s_logits(backend *be, backend_buf x, backend_weight nw, float eps, backend_weight W,
                     int H, int V, backend_buf out) {
  (void)be;
  op_index++;
  C->logits(C, BC(x), WC(nw), eps, WC(W), H, V, BC(out));
  G->logits(G, BG(x), WG(nw), eps, WG(W), H, V, BG(out));
  cmp("logits", out, 0, (size_t)hb.n_out * V);
}

static backend *shadow_create(void) {
  backend *be = calloc(1, sizeof *be);
  be->name = "shadow";
  be->destroy = s_destroy;
  be->kind_size = s_kind_size;
  be->alloc = s_alloc;
  be->free = s_free;
  be->write = s_write;
  be->read = s_read;
  be->copy = s_copy;
  be->zero = s_zero;
  be->weight_upload = s_wup;
  be->weight_upload_exact = s_wup_exact;
  be->weight_free = s_wfree;
  be->weight_bytes = s_wbytes;
  be->set_batch = s_set_batch;
  be->sync = s_sync;
  be->embed = s_embed;
  be->rmsnorm = s_rmsnorm;
  be->add = s_add;
  be->matmul = s_matmul;
  be->qk_norm_rope = s_qkr;
  be->attention = s_attention;
  be->sigmoid_mul = s_sigmoid_mul;
  be->swiglu = s_swiglu;
  be->moe = s_moe;
  be->conv1d = s_conv1d;
  be->gdn_gates = s_gates;
  be->gdn_prefill = s_prefill;
  be->gdn_decode = s_decode;
  be->gated_rmsnorm = s_gnorm;
  be->logits = s_logits;
  return be;
}

/* One fixture: two sequences (a 131-token-like prompt split 70 + rest, and a short one), a
 * mixed step, then decode steps, all through the shadow backend. */
static void shadow_fixture(const char *name) {
  char dir[512], err[512] = "";
  snprintf(dir, sizeof dir, "%s/%s", shadow_dir, name);
  model_config cfg;
  model_weights w;
  if (model_load(dir, &cfg, &w, err, sizeof err)) {
    EXPECT_MSG(0, "%s: %s", name, err);
    return;
  }
  nstats = 0;
  op_index = 0;
  moe_rows = moe_rows_bad = 0;
  moe_row_median_sum = 0;
  long moe_calls0 = 0;
  first_bad[0] = 0;
  backend *be = shadow_create();
  qwen35 *m = NULL;
  qwen35_mem_opts o = {.n_pages = 24, .n_slots = 2};
  int rc = qwen35_init(&m, &cfg, &w, be, &o, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s: init: %s", name, err);
  if (rc == 0) {
    int V = cfg.vocab_size;
    int32_t toks[200], p0[12], p1[12];
    for (int i = 0; i < 200; i++) toks[i] = (i * 37 + 11) % V;
    for (int i = 0; i < 12; i++) p0[i] = 11 - i, p1[i] = 12 + i;
    float *lg = malloc(sizeof(float) * 200 * V);
    rc |= qwen35_slot_zero(m, 0) | qwen35_slot_zero(m, 1);
    fwd_seq a = {toks, 70, 0, p0, 12, 0, QWEN35_LOGITS_LAST, -1};
    rc |= qwen35_forward(m, &a, 1, lg, err, sizeof err);
    fwd_seq two[2] = {{toks + 70, 61, 70, p0, 12, 0, QWEN35_LOGITS_ALL, -1},
                      {toks + 100, 5, 0, p1, 12, 1, QWEN35_LOGITS_ALL, -1}};
    rc |= qwen35_forward(m, two, 2, lg, err, sizeof err);
    for (int k = 0; k < 3 && !rc; k++) {
      fwd_seq d[2] = {{toks + 150 + k, 1, 131 + k, p0, 12, 0, QWEN35_LOGITS_LAST, -1},
                      {toks + 160 + k, 1, 5 + k, p1, 12, 1, QWEN35_LOGITS_LAST, -1}};
      rc |= qwen35_forward(m, d, 2, lg, err, sizeof err);
    }
    EXPECT_MSG(rc == 0, "%s: forward: %s", name, err);
    free(lg);
    qwen35_free(m);
  }
  printf("  %s:\n", name);
  for (int i = 0; i < nstats; i++)
    printf("    %-22s calls %5ld  worst rel err %.3e%s\n", stats[i].op, stats[i].calls,
           stats[i].worst, stats[i].worst > SHADOW_TOL ? "  <-- over" : "");
  for (int i = 0; i < nstats; i++)
    if (!strcmp(stats[i].op, "moe")) moe_calls0 = stats[i].calls;
  if (moe_rows)
    printf("    moe rows over %.0e: %ld of %ld; mean of per-call median row err %.3e\n", SHADOW_TOL,
           moe_rows_bad, moe_rows, moe_calls0 ? moe_row_median_sum / moe_calls0 : 0.0);
  EXPECT_MSG(!first_bad[0], "%s: %s", name, first_bad);
  be->destroy(be);
  weights_free(&w);
}

TEST(shadow_ops_on_fixtures) {
  DIR *d = opendir(shadow_dir);
  REQUIRE(d != NULL);
  struct dirent *e;
  char names[32][256];
  int n = 0;
  const char *only = getenv("DS_SHADOW_MODELS"); /* space-separated names: only those */
  while ((e = readdir(d)) && n < 32) {
    if (e->d_name[0] == '.') continue;
    if (only && *only) {
      char pad[300], hay[1100];
      snprintf(pad, sizeof pad, " %s ", e->d_name);
      snprintf(hay, sizeof hay, " %s ", only);
      if (!strstr(hay, pad)) continue;
    }
    snprintf(names[n++], 256, "%s", e->d_name);
  }
  closedir(d);
  for (int i = 0; i < n; i++) shadow_fixture(names[i]);
}

int main(void) {
  if (!backend_cuda_available()) {
    printf("FAIL cuda_available: no CUDA device\n");
    return 1;
  }
  char err[256];
  G = backend_cuda_create(0, &(backend_options){0}, err, sizeof err);
  C = backend_cpu_create(0);
  if (!G || !C) {
    printf("FAIL create: %s\n", G ? "cpu" : err);
    return 1;
  }
  if (getenv("DS_SHADOW_DIR") && *getenv("DS_SHADOW_DIR")) shadow_dir = getenv("DS_SHADOW_DIR");
  RUN(shadow_ops_on_fixtures);
  G->destroy(G);
  C->destroy(C);
  TEST_MAIN_END();
}
