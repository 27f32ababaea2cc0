/* test_tp — tensor parallelism on the CPU backend (model/qwen35_tp.h, backend/comm.h): TP = 2
 * and 4 against TP = 1 on dense and MoE models (the FP8 fixtures, whose shapes split over 2, and
 * two models written by gen_random whose shapes split over 4, one with fewer KV heads than ranks),
 * through the model (batched prefill and decode, the greedy op, a slot's host round trip) and
 * through the engine (concurrent requests with prefix-cache hits); each rank's vocabulary rows
 * of the embedding and the lm-head, and their bytes over the ranks; the communicator's
 * collectives; and the refusals (a shape N does not divide, a backend without a communicator).
 *
 * What must match. Column-parallel products, attention, DeltaNet and the norms compute each of a
 * rank's outputs exactly as TP = 1 does; a row-parallel product (o_proj, out_proj, down_proj,
 * the MoE block) is split over its input columns, so each output is the rank-ordered sum of N
 * partial dot products instead of one dot product: the fp32 rounding differs from the first such
 * sum on. So the greedy tokens must be equal, and the logits close: within TOL of the largest
 * logit's magnitude (TOL = 1e-4, the transformers-parity tolerance; measured differences are
 * printed). Bits are equal only up to the first row-parallel sum: test comm_* checks the sums'
 * order itself. */
#include <stdatomic.h>
#include <unistd.h>

#include "backend/backend_create.h"
#include "backend/comm.h"
#include "cli/cli_flags.h"
#include "cli/cli_vllm.h"
#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/qwen35_tp.h"
#include "test.h"

#define TOL 1e-4
#define NPROMPT 3
#define NGEN 8
#define MAXLEN 96

static char TMP[256];

/* ---- models ---- */

static const char *DENSE_CFG =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", "
    "\"vocab_size\": 257, \"hidden_size\": 64, \"intermediate_size\": 128, "
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"head_dim\": 32, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8, "
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 8, \"linear_conv_kernel_dim\": 4, "
    "\"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\", "
    "\"full_attention\"], \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": "
    "10000000.0, \"partial_rotary_factor\": 0.25}, \"rms_norm_eps\": 1e-06, "
    "\"max_position_embeddings\": 4096, \"tie_word_embeddings\": false, \"eos_token_id\": [256], "
    "\"dtype\": \"bfloat16\", \"mtp_num_hidden_layers\": 1}";

static const char *MOE_CFG =
    "{\"architectures\": [\"Qwen3_5MoeForCausalLM\"], \"model_type\": \"qwen3_5_moe_text\", "
    "\"vocab_size\": 257, \"hidden_size\": 64, \"intermediate_size\": 96, "
    "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, "
    "\"head_dim\": 32, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 4, "
    "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4, "
    "\"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"], "
    "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
    "\"shared_expert_intermediate_size\": 16, \"rope_parameters\": {\"rope_type\": \"default\", "
    "\"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25}, \"rms_norm_eps\": 1e-06, "
    "\"max_position_embeddings\": 4096, \"tie_word_embeddings\": true, \"eos_token_id\": [256], "
    "\"dtype\": \"bfloat16\"}";

/* Writes a gen_random model of config text cfg into TMP/name (next_fused: Qwen3-Next's fused
 * in_proj_qkvz / in_proj_ba in the file); returns its folder. */
static const char *gen_model(const char *name, const char *cfg, int next_fused, char *dir,
                             size_t n) {
  char cpath[400];
  snprintf(dir, n, "%s/%s", TMP, name);
  snprintf(cpath, sizeof cpath, "%s/%s.json", TMP, name);
  FILE *f = fopen(cpath, "w");
  if (!f) return NULL;
  fputs(cfg, f);
  fclose(f);
  gen_random_opts o = {
      .seed = 7, .dt = DTYPE_BF16, .threads = 1, .quiet = 1, .next_fused = next_fused};
  char err[300];
  if (gen_random_write(cpath, dir, &o, err, sizeof err)) {
    printf("  gen_random: %s\n", err);
    return NULL;
  }
  return dir;
}

typedef struct tp_model {
  model_config c;
  model_weights w;
  backend *be[8];
  int n;
  qwen35 *m;
} tp_model;

static void tp_close(tp_model *t) {
  qwen35_free(t->m);
  for (int r = 0; r < t->n; r++) t->be[r]->destroy(t->be[r]);
  weights_free(&t->w);
  memset(t, 0, sizeof *t);
}

/* The ranks (one thread each) and the model over them; mo NULL: pages and slots for the model
 * tests. Returns 0, or -1 with err. */
static int tp_open(tp_model *t, const char *dir, int n, const qwen35_mem_opts *mo, char *err,
                   size_t errlen) {
  memset(t, 0, sizeof *t);
  weights_opts wo = {.mtp = 1}; /* the MTP head where the config has one (on rank 0 only) */
  if (model_load_with(dir, &wo, &t->c, &t->w, err, errlen)) return -1;
  backend_options bo = {.device = "cpu", .n_threads = n, .tensor_parallel_size = n};
  t->n = backend_create_ranks(&bo, t->be, 8, err, errlen);
  if (t->n < 0) {
    t->n = 0;
    return -1;
  }
  qwen35_mem_opts d = {.n_pages = NPROMPT * ((MAXLEN + NGEN) / 16 + 2), .n_slots = NPROMPT + 1};
  return qwen35_init_ranks(&t->m, &t->c, &t->w, t->be, t->n, mo ? mo : &d, err, errlen);
}

/* ---- the model: batched prefill, batched decode ---- */

typedef struct run_out {
  int32_t tok[NPROMPT][NGEN + 1]; /* the last from the greedy op */
  float *lg;                      /* [NPROMPT * (NGEN + 1), V]: each step's rows */
  int V;
} run_out;

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static void prompt_of(int p, int32_t *tok, int *len) {
  *len = 40 + 23 * p; /* pieces of different lengths, one past a 64-token chunk */
  uint32_t x = 1234u + 77u * (uint32_t)p;
  for (int i = 0; i < *len; i++) {
    x = x * 1103515245u + 12345u;
    tok[i] = (int32_t)((x >> 8) % 256);
  }
}

/* Every prompt in one step, then decode steps of every sequence, greedy from the logits (rows
 * of NGEN steps kept, tokens 0 .. NGEN-1 taken from them); after the first decode step sequence
 * 0's state makes a host round trip (slot_read, a zeroed slot, slot_write); token NGEN comes
 * from qwen35_forward_greedy (rank 0's greedy op). Returns 0, or -1 with a message printed. */
static int run_model(tp_model *t, run_out *o) {
  int V = t->c.vocab_size, ppp = (MAXLEN + NGEN) / 16 + 2;
  o->V = V;
  int32_t prompts[NPROMPT][MAXLEN], pages[NPROMPT][16], cur[NPROMPT];
  int len[NPROMPT];
  fwd_seq s[NPROMPT];
  char err[300] = "";
  float *lg = o->lg;
  for (int p = 0; p < NPROMPT; p++) {
    prompt_of(p, prompts[p], &len[p]);
    for (int k = 0; k < ppp; k++) pages[p][k] = p * ppp + k;
    s[p] = (fwd_seq){prompts[p], len[p], 0, pages[p], ppp, p, QWEN35_LOGITS_LAST, -1};
  }
  int rc = qwen35_forward(t->m, s, NPROMPT, lg, err, sizeof err);
  for (int step = 0; rc == 0 && step < NGEN - 1; step++) {
    const float *sl = lg + (size_t)step * NPROMPT * V;
    for (int p = 0; p < NPROMPT; p++) {
      o->tok[p][step] = cur[p] = argmax(sl + (size_t)p * V, V);
      s[p].tokens = &cur[p];
      s[p].pos = len[p] + step;
      s[p].n_tokens = 1;
    }
    if (step == 1) { /* the host tier's path: every rank's part of the slot, in rank order */
      size_t sb = qwen35_slot_bytes(t->m);
      char *h = malloc(sb);
      rc = qwen35_slot_read(t->m, 0, h) || qwen35_slot_zero(t->m, 0) ||
           qwen35_slot_write(t->m, 0, h);
      free(h);
    }
    if (rc == 0)
      rc = qwen35_forward(t->m, s, NPROMPT, lg + (size_t)(step + 1) * NPROMPT * V, err, sizeof err);
  }
  if (rc == 0) {
    const float *sl = lg + (size_t)(NGEN - 1) * NPROMPT * V;
    for (int p = 0; p < NPROMPT; p++) {
      o->tok[p][NGEN - 1] = cur[p] = argmax(sl + (size_t)p * V, V);
      s[p].pos = len[p] + NGEN - 1;
    }
    int32_t ids[NPROMPT];
    rc = qwen35_forward_greedy(t->m, s, NPROMPT, ids, err, sizeof err);
    for (int p = 0; rc == 0 && p < NPROMPT; p++) o->tok[p][NGEN] = ids[p];
  }
  if (rc) printf("  forward: %s\n", err);
  return rc ? -1 : 0;
}

/* TP = n against TP = 1 on the model in dir: equal tokens, logits within TOL. */
static void check_model(const char *dir, int n) {
  tp_model a, b;
  char err[300] = "";
  int rc = tp_open(&a, dir, 1, NULL, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s TP=1: %s", dir, err);
  if (rc == 0) rc = tp_open(&b, dir, n, NULL, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s TP=%d: %s", dir, n, err);
  if (rc) {
    tp_close(&a);
    tp_close(&b);
    return;
  }
  int V = a.c.vocab_size;
  size_t rows = (size_t)NPROMPT * NGEN;
  run_out ra = {.lg = calloc(rows * V, sizeof(float))},
          rb = {.lg = calloc(rows * V, sizeof(float))};
  EXPECT(run_model(&a, &ra) == 0);
  EXPECT(run_model(&b, &rb) == 0);
  double worst = 0, top = 0;
  for (size_t i = 0; i < rows * V; i++) {
    double d = fabs((double)ra.lg[i] - rb.lg[i]);
    if (d > worst) worst = d;
    if (fabs(ra.lg[i]) > top) top = fabs(ra.lg[i]);
  }
  for (int p = 0; p < NPROMPT; p++)
    for (int k = 0; k <= NGEN; k++)
      EXPECT_MSG(ra.tok[p][k] == rb.tok[p][k], "%s TP=%d: prompt %d token %d: %d, TP=1 %d", dir, n,
                 p, k, rb.tok[p][k], ra.tok[p][k]);
  EXPECT_MSG(worst <= TOL * top, "%s TP=%d: logits differ by %.3g (largest |logit| %.3g)", dir, n,
             worst, top);
  printf("  %s TP=%d: %d x %d tokens equal, logits max |diff| %.3g of max |logit| %.3g (%.2g)\n",
         dir, n, NPROMPT, NGEN + 1, worst, top, top > 0 ? worst / top : 0);
  /* the embedding and the lm-head split by vocabulary: over the ranks, each matrix once, plus
   * each rank's zero rows (the embedding's one past its rows; the last rank's padding to
   * ceil(V / N) rows, fewer than N, in each matrix) */
  size_t ea, la, eb, lb;
  qwen35_vocab_bytes(a.m, &ea, &la);
  qwen35_vocab_bytes(b.m, &eb, &lb);
  size_t row = la / (size_t)V;
  EXPECT_MSG(eb + lb <= ea + la + (size_t)(3 * n) * row,
             "%s TP=%d: vocabulary matrices %zu bytes over the ranks, TP=1 %zu", dir, n, eb + lb,
             ea + la);
  free(ra.lg);
  free(rb.lg);
  tp_close(&a);
  tp_close(&b);
}

static char DENSE[300], MOE[300], NEXT[300];

TEST(dense_fp8_tp2) { check_model("tests/fixtures/models/fp8_dense128", 2); }
TEST(moe_fp8_tp2) { check_model("tests/fixtures/models/fp8_moe32", 2); }
TEST(moe_fp8_fused_tp2) { check_model("tests/fixtures/models/fp8_moe32_fused", 2); }
TEST(next_fp8_tp2) { check_model("tests/fixtures/models/fp8_next32", 2); }
TEST(dense_tp2) { check_model(DENSE, 2); }
TEST(dense_tp4) { check_model(DENSE, 4); } /* 2 KV heads over 4 ranks: replicated */
TEST(moe_tp2) { check_model(MOE, 2); }
TEST(moe_tp4) { check_model(MOE, 4); }
TEST(next_tp2) { check_model(NEXT, 2); } /* the regrouped value heads split by key head */

/* Each rank's vocabulary rows: ceil(V / N) wide, the real rows as the file has them, zeros past
 * them, the embedding one row longer; a tied lm-head is the embedding. */
static void check_vocab(const char *dir, int n) {
  model_config c;
  model_weights w;
  char err[300] = "";
  weights_opts wo = {0};
  REQUIRE(model_load_with(dir, &wo, &c, &w, err, sizeof err) == 0);
  int tied = w.lm_head.data == w.embed.data, H = c.hidden_size, covered = 0;
  size_t es = dtype_size(w.embed.dt);
  for (int r = 0; r < n; r++) {
    int first, count, width;
    qwen35_tp_vocab(&c, n, r, &first, &count, &width);
    EXPECT(width == (c.vocab_size + n - 1) / n && first == r * width);
    EXPECT(count >= 0 && count <= width && (r < n - 1 ? count == width : 1));
    covered += count;
    qwen35_tp_shard sh;
    REQUIRE(qwen35_tp_shard_init(&sh, &c, &w, n, r, err, sizeof err) == 0);
    EXPECT(sh.w.embed.shape[0] == width + 1 && sh.w.embed.dt == w.embed.dt);
    EXPECT(tied ? sh.w.lm_head.data == sh.w.embed.data : sh.w.lm_head.shape[0] == width);
    const tensor *ts[2] = {&sh.w.embed, &sh.w.lm_head}, *fs[2] = {&w.embed, &w.lm_head};
    for (int k = 0; k < (tied ? 1 : 2); k++) {
      size_t rb = (size_t)H * es;
      const char *d = ts[k]->data, *full = fs[k]->data;
      int bad = 0;
      for (int i = 0; i < (int)ts[k]->shape[0]; i++)
        for (size_t j = 0; j < rb; j++)
          bad += d[i * rb + j] != (i < count ? full[(size_t)(first + i) * rb + j] : 0);
      EXPECT_MSG(bad == 0, "%s TP=%d rank %d %s: %d bytes differ", dir, n, r,
                 k ? "lm-head" : "embedding", bad);
    }
    qwen35_tp_shard_free(&sh);
  }
  EXPECT(covered == c.vocab_size);
  c.vocab_size = 5; /* more ranks than a rank's share: the last ones hold none */
  int first, count, width;
  qwen35_tp_vocab(&c, 4, 3, &first, &count, &width);
  EXPECT(width == 2 && first == 6 && count == 0);
  weights_free(&w);
}

/* Shard tensor d against rows rr[0..1] (and rr[2..5] when nr is 3), columns from c0, of t: the
 * same value for every element (each as tensor_get_f32 reads it, FP8 times its block's scale).
 * Returns 1 when d is FP8. */
static int check_slice(const char *what, const tensor *d, const tensor *t, int nr,
                       const int64_t *rr, int64_t c0) {
  int64_t C = t->shape[1], w = d->shape[1], o = 0, bad = 0;
  for (int k = 0; k < nr; k++)
    for (int64_t row = rr[2 * k]; row < rr[2 * k + 1]; row++, o++)
      for (int64_t j = 0; j < w; j++)
        bad += tensor_get_f32(d, o * w + j) != tensor_get_f32(t, row * C + c0 + j);
  EXPECT_MSG(o == d->shape[0] && bad == 0, "%s: %lld rows of %lld, %lld values differ", what,
             (long long)o, (long long)d->shape[0], (long long)bad);
  return d->dt == DTYPE_F8_E4M3;
}

/* FP8 slices that keep the checkpoint's blocks whole stay FP8 (bytes and scales), the others
 * become F32; either way every value is the checkpoint's. */
static void check_fp8_shard(const char *dir) {
  model_config c;
  model_weights w;
  char err[300] = "";
  weights_opts wo = {0};
  REQUIRE(model_load_with(dir, &wo, &c, &w, err, sizeof err) == 0);
  int n = 2, kept = 0, deq = 0;
  for (int r = 0; r < n; r++) {
    qwen35_tp_shard sh;
    REQUIRE(qwen35_tp_shard_init(&sh, &c, &w, n, r, err, sizeof err) == 0);
    for (int i = 0; i < c.n_layers; i++) {
      const layer_weights *L = &w.layers[i], *D = &sh.w.layers[i];
      int64_t hd = c.head_dim, nh = c.n_heads / n;
      if (L->q_proj.data) {
        int64_t q[2] = {r * nh * 2 * hd, (r + 1) * nh * 2 * hd}, o0 = r * nh * hd;
        kept += check_slice("q_proj", &D->q_proj, &L->q_proj, 1, q, 0);
        int64_t o[2] = {0, L->o_proj.shape[0]};
        kept += check_slice("o_proj", &D->o_proj, &L->o_proj, 1, o, o0);
      }
      if (L->in_proj_qkv.data) {
        int64_t dk = c.lin_k_head_dim, dv = c.lin_v_head_dim, nk = c.lin_n_k_heads,
                nv = c.lin_n_v_heads, rk = nk / n, rv = nv / n;
        int64_t qkv[6] = {r * rk * dk,
                          (r + 1) * rk * dk,
                          (nk + r * rk) * dk,
                          (nk + (r + 1) * rk) * dk,
                          2 * nk * dk + r * rv * dv,
                          2 * nk * dk + (r + 1) * rv * dv};
        kept += check_slice("in_proj_qkv", &D->in_proj_qkv, &L->in_proj_qkv, 3, qkv, 0);
        int64_t o[2] = {0, L->out_proj.shape[0]};
        kept += check_slice("out_proj", &D->out_proj, &L->out_proj, 1, o, r * rv * dv);
      }
      if (L->experts) {
        int64_t mi = c.moe_intermediate_size / n, g[2] = {r * mi, (r + 1) * mi};
        int64_t dn[2] = {0, c.hidden_size};
        for (int e = 0; e < c.n_experts; e++) {
          kept += check_slice("expert gate", &D->experts[e].gate, &L->experts[e].gate, 1, g, 0);
          kept += check_slice("expert up", &D->experts[e].up, &L->experts[e].up, 1, g, 0);
          kept +=
              check_slice("expert down", &D->experts[e].down, &L->experts[e].down, 1, dn, r * mi);
        }
        int64_t si = c.shared_expert_intermediate_size / n, sg[2] = {r * si, (r + 1) * si};
        deq += !check_slice("shared gate", &D->shared_gate, &L->shared_gate, 1, sg, 0);
      }
    }
    qwen35_tp_shard_free(&sh);
  }
  /* fp8_moe32*: 32 x 32 blocks; a rank's 32 expert rows keep them, its 16 shared-expert rows
   * do not */
  EXPECT_MSG(kept > 0 && deq > 0, "%s: %d FP8 slices kept, %d shared gates dequantized", dir, kept,
             deq);
  printf("  %s TP=2: %d FP8 slices kept FP8, %d dequantized, every value the checkpoint's\n", dir,
         kept, deq);
  weights_free(&w);
}

TEST(fp8_shard) {
  check_fp8_shard("tests/fixtures/models/fp8_moe32");
  check_fp8_shard("tests/fixtures/models/fp8_moe32_fused"); /* experts' views with a row0 */
}

TEST(vocab_split) {
  check_vocab(DENSE, 2); /* 257 tokens: the last rank holds one fewer */
  check_vocab(DENSE, 4);
  check_vocab(MOE, 4); /* tied */
}

/* ---- the memory plan ---- */

/* qwen35_plan_ranks against what the ranks' models take: the pools of rank 0's heads (a KV
 * page: its KV heads' share, besides the MTP head's whole pages; a slot: 1/N), and N x its
 * weights, without the MTP head, at least all ranks' and within the replicated and padded rows
 * of it. */
static void check_plan(const char *dir, int n) {
  tp_model one, t;
  char err[300] = "";
  REQUIRE(tp_open(&one, dir, 1, NULL, err, sizeof err) == 0);
  REQUIRE(tp_open(&t, dir, n, NULL, err, sizeof err) == 0);
  qwen35_plan_bytes p1, pn;
  qwen35_plan_ranks(&one.c, &one.w, one.be[0], 1, &p1);
  qwen35_plan_ranks(&t.c, &t.w, t.be[0], n, &pn);
  int nkv = t.c.n_kv_heads, share = nkv >= n ? n : nkv;
  size_t mtp = p1.page - qwen35_page_bytes(one.m); /* the MTP head's pages, whole on rank 0 */
  EXPECT_MSG((pn.page - mtp) * share == qwen35_page_bytes(one.m) &&
                 (pn.page - mtp) * n == qwen35_page_bytes(t.m),
             "%s TP=%d: page %zu, TP=1 %zu, ranks %zu", dir, n, pn.page, p1.page,
             qwen35_page_bytes(t.m));
  EXPECT_MSG(pn.slot * n == p1.slot && pn.slot * n == qwen35_slot_bytes(t.m),
             "%s TP=%d: slot %zu, TP=1 %zu, ranks %zu", dir, n, pn.slot, p1.slot,
             qwen35_slot_bytes(t.m));
  EXPECT(pn.token < p1.token);
  model_weights nw = t.w; /* the same weights without the MTP head */
  memset(&nw.mtp, 0, sizeof nw.mtp);
  qwen35_plan_ranks(&t.c, &nw, t.be[0], n, &pn);
  size_t all = qwen35_weight_bytes(t.m);
  EXPECT_MSG(pn.weights * n >= all && pn.weights * n <= all + all / 10,
             "%s TP=%d: %d x %zu planned weight bytes, %zu on the ranks", dir, n, n, pn.weights,
             all);
  printf("  %s TP=%d: planned a rank %zu weight bytes (ranks %zu), page %zu, slot %zu\n", dir, n,
         pn.weights, all, pn.page, pn.slot);
  tp_close(&one);
  tp_close(&t);
}

TEST(memory_plan) {
  check_plan(DENSE, 2);
  check_plan(DENSE, 4); /* 2 KV heads over 4 ranks: one each */
  check_plan(MOE, 4);
  check_plan("tests/fixtures/models/fp8_moe32", 2);
  /* the ranks' plans: the fewest pages of any rank, and the fewest slabs and keep lanes */
  engine_mem_split a = {.n_pages = 100, .n_slabs = 10, .keep_lanes = 8},
                   b = {.n_pages = 80, .n_slabs = 12, .keep_lanes = 6},
                   c = {.n_pages = 90, .n_slabs = 5, .keep_lanes = 3}, out;
  engine_mem_split *sp[3] = {&a, &b, &c};
  EXPECT(engine_mem_plan_ranks(sp, 3, &out) == 1 && out.n_pages == 80 && out.n_slabs == 5 &&
         out.keep_lanes == 3);
  EXPECT(engine_mem_plan_ranks(sp, 1, &out) == 0 && out.n_pages == 100 && out.n_slabs == 10 &&
         out.keep_lanes == 8);
}

/* ---- refusals ---- */

TEST(refuse_undivided_shape) {
  tp_model t;
  char err[300] = "";
  /* dense_bf16 has 3 attention heads */
  EXPECT(tp_open(&t, "tests/fixtures/models/dense_bf16", 2, NULL, err, sizeof err) == -1);
  EXPECT_STR(err, "--tensor-parallel-size 2 does not divide the attention heads (3)");
  tp_close(&t);
  model_config c;
  char path[400];
  snprintf(path, sizeof path, "%s/config.json", MOE);
  REQUIRE(config_load(path, &c, err, sizeof err) == 0);
  EXPECT(qwen35_tp_check(&c, 4, err, sizeof err) == 0);
  EXPECT(qwen35_tp_check(&c, 8, err, sizeof err) == -1);
  EXPECT_STR(err, "--tensor-parallel-size 8 does not divide the attention heads (4)");
  c.moe_intermediate_size = 30;
  EXPECT(qwen35_tp_check(&c, 4, err, sizeof err) == -1);
  EXPECT_STR(err, "--tensor-parallel-size 4 does not divide the experts' intermediate size (30)");
  c.moe_intermediate_size = 32;
  c.shared_expert_intermediate_size = 6;
  EXPECT(qwen35_tp_check(&c, 4, err, sizeof err) == -1);
  EXPECT_STR(err,
             "--tensor-parallel-size 4 does not divide the shared expert's intermediate size (6)");
  c.shared_expert_intermediate_size = 16;
  c.n_kv_heads = 3;
  c.n_heads = 12;
  EXPECT(qwen35_tp_check(&c, 2, err, sizeof err) == -1);
  EXPECT(strstr(err, "the KV heads (3)") != NULL);
  c.n_kv_heads = 1;
  c.lin_n_v_heads = 6;
  EXPECT(qwen35_tp_check(&c, 4, err, sizeof err) == -1);
  EXPECT_STR(err, "--tensor-parallel-size 4 does not divide the DeltaNet value heads (6)");
}

TEST(refuse_cuda) {
  backend *be[8];
  char err[300] = "";
  backend_options bo = {.device = "cuda", .tensor_parallel_size = 2};
  EXPECT(backend_create_ranks(&bo, be, 8, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "--tensor-parallel-size > 1 needs NCCL builds") != NULL, "%s", err);
  bo.device = "cpu";
  bo.tensor_parallel_size = 9;
  EXPECT(backend_create_ranks(&bo, be, 8, err, sizeof err) == -1);
  bo.tensor_parallel_size = 2;
  EXPECT(backend_create(&bo, err, sizeof err) == NULL); /* one rank only */
}

/* --tensor-parallel-size N, -tp N, --tensor-parallel-size=N; no longer one of the vLLM flags
 * accepted without effect */
TEST(tp_flag) {
  char *argv[] = {
      "serve",     "-tp", "2",  "--tensor-parallel-size=4", "--tensor-parallel-size", "0",
      "--threads", "2",   "-tp"};
  int argc = 9, tp = 1, i = 1;
  char err[200] = "";
  EXPECT(cli_flags_tp(&tp, argc, argv, &i, err, sizeof err) == 1 && tp == 2 && i == 2);
  i = 3;
  EXPECT(cli_flags_tp(&tp, argc, argv, &i, err, sizeof err) == 1 && tp == 4 && i == 3);
  i = 4;
  EXPECT(cli_flags_tp(&tp, argc, argv, &i, err, sizeof err) == -1 && tp == 4);
  EXPECT_STR(err, "--tensor-parallel-size: expected an integer in [1, 64], got '0'");
  i = 6;
  EXPECT(cli_flags_tp(&tp, argc, argv, &i, err, sizeof err) == 0 && i == 6);
  i = 8;
  EXPECT(cli_flags_tp(&tp, argc, argv, &i, err, sizeof err) == -1);
  i = 1;
  EXPECT(cli_vllm_flag(argc, argv, &i, err, sizeof err) == 0);
}

/* ---- the communicator ---- */

typedef struct {
  comm *c;
  float *x[4];
  float *g[4];
  size_t n;
} comm_case;

static void comm_rank(void *v, int r) {
  comm_case *k = v;
  comm_all_reduce_sum(k->c, r, k->x[r], k->n);
  comm_all_gather(k->c, r, k->x[r], 3, k->g[r]);
  comm_barrier(k->c);
}

TEST(comm_collectives) {
  enum { N = 4, LEN = 1001 };
  comm_case k = {comm_create(N), {0}, {0}, LEN};
  qwen35_tp_runner *run = NULL;
  char err[200];
  REQUIRE(k.c && qwen35_tp_runner_init(&run, N, err, sizeof err) == 0);
  float in[N][LEN];
  uint32_t x = 99;
  for (int r = 0; r < N; r++)
    for (int i = 0; i < LEN; i++) {
      x = x * 1103515245u + 12345u;
      in[r][i] = ((float)(x >> 8) / 16777216.f - 0.5f) * (i % 7 ? 1.f : 1e6f);
    }
  for (int rep = 0; rep < 3; rep++) {
    for (int r = 0; r < N; r++) {
      k.x[r] = malloc(LEN * sizeof(float));
      k.g[r] = malloc(N * 3 * sizeof(float));
      memcpy(k.x[r], in[r], sizeof in[r]);
    }
    qwen35_tp_run(run, comm_rank, &k);
    int bad = 0;
    for (int i = 0; i < LEN; i++) {
      float s = ((in[0][i] + in[1][i]) + in[2][i]) + in[3][i]; /* rank order, bit for bit */
      for (int r = 0; r < N; r++) bad += memcmp(&k.x[r][i], &s, sizeof s) != 0;
    }
    EXPECT_EQ_INT(bad, 0);
    for (int r = 0; r < N; r++)
      for (int q = 0; q < N; q++) EXPECT(!memcmp(k.g[r] + q * 3, k.x[q], 3 * sizeof(float)));
    for (int r = 0; r < N; r++) {
      free(k.x[r]);
      free(k.g[r]);
    }
  }
  qwen35_tp_runner_free(run);
  comm_unref(k.c);
}

/* ---- through the engine ---- */

#define EREQ 4
#define ETOK 8

/* One request of 100 tokens (a chat head of 64), then EREQ at once sharing its first 80
 * (prefix-cache hits at 64) with different tails; the greedy tokens of all, and the cached token
 * counts. mtp: MTP speculation, 2 drafts a step from the checkpoint's head (run whole on rank 0).
 * replay (NULL: no n-gram speculation): speculative decoding, 3 drafts a step replayed from these
 * tokens with 30 % of them corrupted (accepted and rejected drafts: verify pieces, keep slots and
 * their copies on every rank); *acc, *drafted: the engine's counts. */
static int engine_run(const char *dir, int n, int mtp, int32_t replay[EREQ + 1][ETOK],
                      int32_t tok[EREQ + 1][ETOK], int cached[EREQ + 1], long long *acc,
                      long long *drafted) {
  tp_model t;
  char err[300] = "";
  engine_opts o;
  engine_opts_default(&o);
  if (replay) o.spec = (spec_config){SPEC_METHOD_NGRAM, 3, 1, 3, 1 << 20};
  if (mtp) o.spec = (spec_config){SPEC_METHOD_MTP, 2, 0, 0, 1 << 20};
  o.max_num_seqs = 4; /* fewer than the requests: one waits */
  o.enable_prefix_caching = 1;
  o.snapshot_interval = 32;
  o.kv_cache_tokens = 2048;
  model_config c;
  char path[400];
  snprintf(path, sizeof path, "%s/config.json", dir);
  qwen35_mem_opts mo;
  if (config_load(path, &c, err, sizeof err) || engine_mem_plan(&o, &c, &mo, err, sizeof err) ||
      tp_open(&t, dir, n, &mo, err, sizeof err)) {
    printf("  %s\n", err);
    tp_close(&t);
    return -1;
  }
  o.mtp_weights = &t.w;
  engine *e = engine_create(t.m, &o, err, sizeof err);
  if (!e) {
    printf("  engine: %s\n", err);
    tp_close(&t);
    return -1;
  }
  int32_t prompt[EREQ + 1][100];
  for (int q = 0; q <= EREQ; q++) {
    uint32_t x = 4321u;
    for (int i = 0; i < 100; i++) {
      x = x * 1103515245u + 12345u;
      prompt[q][i] = (int32_t)((x >> 8) % 256);
      if (i >= 80) prompt[q][i] = (prompt[q][i] + 31 * q) % 256;
    }
  }
  engine_req *h[EREQ + 1] = {0};
  int rc = 0;
  for (int q = 0; q <= EREQ && rc == 0; q++) {
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = prompt[q];
    so.n_prompt = q == 0 ? 100 : 90 + q;
    sampling_params_default(&so.sp);
    so.sp.temperature = 0;
    so.sp.max_tokens = ETOK;
    so.sp.ignore_eos = 1;
    if (replay) {
      so.draft_replay = replay[q];
      so.n_draft_replay = ETOK;
      so.draft_corrupt_pm = 300;
    }
    static const int32_t bounds[2] = {0, 64}; /* a chat head: a checkpoint at 64 */
    so.boundaries = bounds;
    so.n_boundaries = 2;
    engine_status st;
    h[q] = engine_submit(e, &so, &st, err, sizeof err);
    if (!h[q]) {
      printf("  submit: %s\n", err);
      rc = -1;
    }
    if (q > 0 && q < EREQ) continue; /* the first alone, then the others at once */
    for (int j = q == 0 ? 0 : 1; j <= q && rc == 0; j++) {
      int nt = 0;
      engine_event ev;
      for (;;) {
        if (!engine_next(h[j], &ev, 600000)) {
          rc = -1;
          break;
        }
        if (ev.has_token && nt < ETOK) tok[j][nt++] = ev.token;
        if (ev.finish) {
          cached[j] = ev.cached_tokens;
          if (nt != ETOK) rc = -1;
          break;
        }
      }
      engine_release(h[j]);
      h[j] = NULL;
    }
  }
  for (int q = 0; q <= EREQ; q++)
    if (h[q]) engine_release(h[q]);
  if (rc == 0 && engine_check(e, err, sizeof err)) {
    printf("  check: %s\n", err);
    rc = -1;
  }
  engine_stats st;
  engine_get_stats(e, &st);
  *acc = st.spec_num_accepted_tokens;
  *drafted = st.spec_num_draft_tokens;
  engine_destroy(e, 1);
  tp_close(&t);
  return rc;
}

/* TP = n through the engine gives TP = 1's tokens and cache hits, plain and speculative. */
static void check_engine(const char *dir, int n) {
  int32_t a[EREQ + 1][ETOK], b[EREQ + 1][ETOK], sp[EREQ + 1][ETOK];
  int ca[EREQ + 1] = {0}, cb[EREQ + 1] = {0}, cs[EREQ + 1] = {0};
  long long acc = 0, drafted = 0;
  REQUIRE(engine_run(dir, 1, 0, NULL, a, ca, &acc, &drafted) == 0);
  REQUIRE(engine_run(dir, n, 0, NULL, b, cb, &acc, &drafted) == 0);
  REQUIRE(engine_run(dir, n, 0, a, sp, cs, &acc, &drafted) == 0);
  for (int q = 0; q <= EREQ; q++) {
    EXPECT_MSG(!memcmp(a[q], b[q], sizeof a[q]), "%s TP=%d request %d: tokens differ", dir, n, q);
    EXPECT_MSG(!memcmp(a[q], sp[q], sizeof a[q]), "%s TP=%d speculative request %d differs", dir, n,
               q);
    EXPECT_EQ_INT(cb[q], ca[q]);
  }
  for (int q = 1; q <= EREQ; q++) EXPECT_MSG(cb[q] >= 64, "request %d: %d cached", q, cb[q]);
  EXPECT_MSG(acc > 0 && acc < drafted, "speculation: %lld of %lld drafts accepted", acc, drafted);
  printf(
      "  %s TP=%d: engine tokens equal, plain and speculative (%lld of %lld drafts "
      "accepted)\n",
      dir, n, acc, drafted);
}

/* MTP drafts over the ranks: the head on rank 0, fed the hidden rows; the tokens are TP=1's. */
TEST(engine_mtp_tp2) {
  int32_t a[EREQ + 1][ETOK], b[EREQ + 1][ETOK];
  int ca[EREQ + 1] = {0}, cb[EREQ + 1] = {0};
  long long acc = 0, drafted = 0;
  REQUIRE(engine_run(DENSE, 1, 0, NULL, a, ca, &acc, &drafted) == 0);
  REQUIRE(engine_run(DENSE, 2, 1, NULL, b, cb, &acc, &drafted) == 0);
  for (int q = 0; q <= EREQ; q++)
    EXPECT_MSG(!memcmp(a[q], b[q], sizeof a[q]), "MTP TP=2 request %d: tokens differ", q);
  EXPECT_MSG(drafted > 0, "no MTP drafts");
  printf("  MTP TP=2: engine tokens equal (%lld of %lld drafts accepted)\n", acc, drafted);
}

TEST(engine_dense_tp2) { check_engine(DENSE, 2); }
TEST(engine_moe_tp4) { check_engine(MOE, 4); }

int main(void) {
  snprintf(TMP, sizeof TMP, "/tmp/ds_test_tp_XXXXXX");
  if (!mkdtemp(TMP)) return 1;
  /* Qwen3-Next: the next_bf16 fixture's config with 4 attention heads instead of 3 */
  char next_cfg[4096] = "";
  FILE *f = fopen("tests/fixtures/models/next_bf16/config.json", "r");
  size_t got = f ? fread(next_cfg, 1, sizeof next_cfg - 1, f) : 0;
  if (f) fclose(f);
  next_cfg[got] = 0;
  char *h = strstr(next_cfg, "\"num_attention_heads\": 3");
  if (!h) return 1;
  h[strlen("\"num_attention_heads\": ")] = '4';
  if (!gen_model("dense", DENSE_CFG, 0, DENSE, sizeof DENSE) ||
      !gen_model("moe", MOE_CFG, 0, MOE, sizeof MOE) ||
      !gen_model("next", next_cfg, 1, NEXT, sizeof NEXT))
    return 1;
  RUN(tp_flag);
  RUN(comm_collectives);
  RUN(refuse_undivided_shape);
  RUN(refuse_cuda);
  RUN(vocab_split);
  RUN(fp8_shard);
  RUN(memory_plan);
  RUN(dense_fp8_tp2);
  RUN(moe_fp8_tp2);
  RUN(moe_fp8_fused_tp2);
  RUN(next_fp8_tp2);
  RUN(dense_tp2);
  RUN(dense_tp4);
  RUN(moe_tp2);
  RUN(moe_tp4);
  RUN(next_tp2);
  RUN(engine_dense_tp2);
  RUN(engine_moe_tp4);
  RUN(engine_mtp_tp2);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
  if (system(cmd)) printf("  could not remove %s\n", TMP);
  TEST_MAIN_END();
}
