/* test_cuda_spec — verify pieces (backend.h "Verify pieces", set_keep) on the CUDA backend, at
 * the model: prompts prefilled in three slots; plain one-token steps a, b, c in slot 0; then one
 * step holding a verify piece [a, b, x] in slot 1 beside a plain row a in slot 2. The verify
 * rows' logits must be the plain steps' (within the bf16 activations' error: the piece's rows
 * run the prefill attention and products of more rows), slot 2's row too; after keeping two rows
 * (keep slot of row 1 copied into slot 1) the slot's state must be the plain state after a, b
 * (and, the check's power, the unkept state after x must not), and the next step c the plain
 * logits. Models: the fixtures (the generic recurrent step, dk not 64/128/256) and gen-random
 * models with dk = dv = 128 (the register-resident step), dense and MoE, with and without
 * --batch-invariant. Then the recorder: verify steps one after another (two kept rows, then
 * three, in turn) are captured and replayed as graphs, and their logits and states are bit for
 * bit those of the same steps launched as issued (no norm fold: the fold changes bits).
 *
 * Prints one line per case `SPEC model=M bi=B case=C err=E tol=T pass=0|1`. */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <math.h>
#include <unistd.h>

#include "backend/backend_create.h"
#include "backend/cuda/backend_cuda.h"
#include "base/log.h"
#include "model/gen_random.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "test.h"

static model_config C;
static model_weights W;
static backend *BE;
static size_t V;
static const char *NAME;
static int BI;

#define TOL 3e-2 /* max |got - want| / max |want| */

/* max |a - b| / max |b| over n floats */
static double rel(const float *a, const float *b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d)) d = e; /* NaN wins */
    if (fabs(b[i]) > m) m = fabs(b[i]);
  }
  return m > 0 ? d / m : d;
}

static int line(const char *cs, double e, int want_close) {
  int pass = want_close ? e <= TOL : e > 2 * TOL;
  printf("SPEC model=%s bi=%d case=%s err=%.3e tol=%s%.0e pass=%d\n", NAME, BI, cs, e,
         want_close ? "<=" : ">", want_close ? TOL : 2 * TOL, pass);
  return pass;
}

TEST(verify_rollback) {
  qwen35 *m = NULL;
  char err[200];
  qwen35_mem_opts mo = {.n_pages = 12, .n_slots = 3, .keep_k = 3, .keep_lanes = 3};
  EXPECT_MSG(qwen35_init(&m, &C, &W, BE, &mo, err, sizeof err) == 0, "%s", err);
  if (test_cur_failed) return;
  EXPECT(qwen35_can_verify(m) == 3);
  enum { N = 37 };
  int32_t prompt[N], pg[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
  for (int i = 0; i < N; i++) prompt[i] = (i * 37 + 11) % (int)V;
  float *lp = malloc(sizeof *lp * V * 3), *lg = malloc(sizeof *lg * V * 4);
  for (int s = 0; s < 3; s++) {
    fwd_seq p = {prompt, N, 0, pg[s], 4, s, QWEN35_LOGITS_NONE, -1};
    EXPECT(qwen35_forward(m, &p, 1, NULL, err, sizeof err) == 0);
  }
  int32_t t[4] = {(int32_t)(5 % V), (int32_t)(9 % V), (int32_t)(200 % V), (int32_t)(77 % V)};
  size_t sb = qwen35_slot_bytes(m);
  float *sab = malloc(sb), *s1 = malloc(sb);
  /* plain: a, b (the state after them kept), c */
  for (int k = 0; k < 2; k++) {
    fwd_seq d = {&t[k], 1, N + k, pg[0], 4, 0, QWEN35_LOGITS_LAST, -1};
    EXPECT(qwen35_forward(m, &d, 1, lp + (size_t)k * V, err, sizeof err) == 0);
  }
  EXPECT(qwen35_slot_read(m, 0, sab) == 0);
  fwd_seq dc = {&t[3], 1, N + 2, pg[0], 4, 0, QWEN35_LOGITS_LAST, -1};
  EXPECT(qwen35_forward(m, &dc, 1, lp + 2 * V, err, sizeof err) == 0);
  /* one step: slot 1 verifies [a, b, x], slot 2 runs a */
  fwd_seq st[2] = {{t, 3, N, pg[1], 4, 1, QWEN35_LOGITS_VERIFY, 1},
                   {&t[0], 1, N, pg[2], 4, 2, QWEN35_LOGITS_LAST, -1}};
  EXPECT_MSG(qwen35_forward(m, st, 2, lg, err, sizeof err) == 0, "%s", err);
  int ok = line("verify_row0", rel(lg, lp, V), 1);
  ok &= line("verify_row1", rel(lg + V, lp + V, V), 1);
  ok &= line("plain_row_beside", rel(lg + 3 * V, lp, V), 1);
  EXPECT(qwen35_slot_read(m, 1, s1) == 0);
  ok &= line("unkept_state_differs", rel(s1, sab, sb / 4), 0);
  EXPECT(qwen35_slot_copy(m, 1, qwen35_keep_slot(m, 1, 1)) == 0);
  EXPECT(qwen35_slot_read(m, 1, s1) == 0);
  ok &= line("kept_state", rel(s1, sab, sb / 4), 1);
  fwd_seq c1 = {&t[3], 1, N + 2, pg[1], 4, 1, QWEN35_LOGITS_LAST, -1};
  EXPECT(qwen35_forward(m, &c1, 1, lg, err, sizeof err) == 0);
  ok &= line("step_after_rollback", rel(lg, lp + 2 * V, V), 1);
  EXPECT_MSG(ok, "a verify case is off (SPEC lines above)");
  free(sab);
  free(s1);
  free(lg);
  free(lp);
  qwen35_free(m);
}

/* NS verify steps of [x0, x1, x2] in slot 0 after the prompt, keeping 2 rows (rollback) and 3 in
 * turn, on a backend be; lg [NS * 3 * V] the rows' logits, st the slot's final bytes. */
#define NS 8
static int verify_run(backend *be, float *lg, void *st) {
  qwen35 *m = NULL;
  char err[200];
  qwen35_mem_opts mo = {.n_pages = 4, .n_slots = 1, .keep_k = 3, .keep_lanes = 1};
  if (qwen35_init(&m, &C, &W, be, &mo, err, sizeof err)) {
    printf("qwen35_init: %s\n", err);
    return -1;
  }
  int32_t prompt[29], pg[4] = {0, 1, 2, 3};
  for (int i = 0; i < 29; i++) prompt[i] = (i * 31 + 7) % (int)V;
  fwd_seq p = {prompt, 29, 0, pg, 4, 0, QWEN35_LOGITS_NONE, -1};
  int rc = qwen35_forward(m, &p, 1, NULL, err, sizeof err), pos = 29;
  for (int i = 0; i < NS && !rc; i++) {
    int32_t x[3] = {(int32_t)((i * 3 + 1) * 17 % V), (int32_t)((i * 3 + 2) * 17 % V),
                    (int32_t)((i * 3 + 3) * 17 % V)};
    int kept = i % 2 ? 3 : 2;
    fwd_seq v = {x, 3, pos, pg, 4, 0, QWEN35_LOGITS_VERIFY, 0};
    rc = qwen35_forward(m, &v, 1, lg + (size_t)i * 3 * V, err, sizeof err);
    if (!rc && kept < 3) rc = qwen35_slot_copy(m, 0, qwen35_keep_slot(m, 0, kept - 1));
    pos += kept;
  }
  if (!rc) rc = qwen35_slot_read(m, 0, st);
  if (rc) printf("verify_run: %s\n", err);
  qwen35_free(m);
  return rc;
}

TEST(verify_graphs_replayed) {
  char err[200];
  backend_options bo = {.batch_invariant = 1};
  backend_cuda_test ref_t = {.no_graphs = 1, .no_norm_fold = 1},
                    rec_t = {.no_norm_fold = 1, .no_repeat = 1};
  backend *ref = backend_cuda_create_test(0, &bo, &ref_t, err, sizeof err);
  backend *rec = ref ? backend_cuda_create_test(0, &bo, &rec_t, err, sizeof err) : NULL;
  EXPECT_MSG(ref && rec, "%s", err);
  size_t n = (size_t)NS * 3 * V, sb = 0;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  char *sa = NULL, *sbuf = NULL;
  if (ref && rec) {
    qwen35 *m = NULL;
    qwen35_mem_opts mo = {.n_pages = 4, .n_slots = 1, .keep_k = 3, .keep_lanes = 1};
    if (!qwen35_init(&m, &C, &W, ref, &mo, err, sizeof err)) {
      sb = qwen35_slot_bytes(m);
      qwen35_free(m);
    }
    sa = malloc(sb ? sb : 1);
    sbuf = malloc(sb ? sb : 1);
    EXPECT(sb > 0 && verify_run(ref, a, sa) == 0 && verify_run(rec, b, sbuf) == 0);
    long gs[6];
    backend_cuda_graph_stats(rec, gs);
    printf("SPEC model=%s graphs captured=%ld replays=%ld\n", NAME, gs[0], gs[1]);
    EXPECT_MSG(gs[0] >= 1 && gs[1] >= 2,
               "verify steps were not replayed (%ld captured, %ld "
               "replays)",
               gs[0], gs[1]);
    EXPECT_MSG(!memcmp(a, b, n * sizeof *a),
               "replayed verify steps' logits differ from the launches as issued");
    EXPECT_MSG(!memcmp(sa, sbuf, sb),
               "replayed verify steps' state differs from the launches as issued");
  }
  free(a);
  free(b);
  free(sa);
  free(sbuf);
  if (ref) ref->destroy(ref);
  if (rec) rec->destroy(rec);
}

static int run_model(const char *dir, const char *name) {
  char err[256];
  NAME = name;
  if (model_load(dir, &C, &W, err, sizeof err) != 0) {
    printf("FAIL load %s: %s\n", dir, err);
    return -1;
  }
  V = (size_t)C.vocab_size;
  for (BI = 0; BI < 2; BI++) {
    BE = backend_create(&(backend_options){.device = "cuda", .batch_invariant = BI}, err,
                        sizeof err);
    if (!BE) {
      printf("FAIL backend: %s\n", err);
      return -1;
    }
    RUN(verify_rollback);
    BE->destroy(BE);
  }
  RUN(verify_graphs_replayed);
  weights_free(&W);
  return 0;
}

/* a gen-random checkpoint of config json into dir/m; returns the model folder or NULL */
static const char *gen(char *dir, size_t n, const char *json) {
  char cfg[256], err[256];
  snprintf(dir, n, "/tmp/ds_cuda_spec_XXXXXX");
  if (!mkdtemp(dir)) return NULL;
  snprintf(cfg, sizeof cfg, "%s/config.json.in", dir);
  FILE *f = fopen(cfg, "w");
  if (!f) return NULL;
  fputs(json, f);
  fclose(f);
  size_t l = strlen(dir);
  snprintf(dir + l, n - l, "/m");
  gen_random_opts go = {.seed = 5, .dt = DTYPE_BF16, .threads = 4, .quiet = 1};
  if (gen_random_write(cfg, dir, &go, err, sizeof err)) {
    printf("FAIL gen-random: %s\n", err);
    return NULL;
  }
  return dir;
}

int main(void) {
  log_set_level(LOG_LEVEL_WARN);
  const char *fx[] = {"tests/fixtures/models/dense_bf16", "tests/fixtures/models/moe_f32",
                      "tests/fixtures/models/next_bf16"};
  for (int i = 0; i < 3; i++)
    if (run_model(fx[i], strrchr(fx[i], '/') + 1)) return 1;
  static const char *const shapes[] = {
      "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":512,\"hidden_size\":256,"
      "\"intermediate_size\":512,\"num_hidden_layers\":4,\"num_attention_heads\":4,"
      "\"num_key_value_heads\":2,\"head_dim\":64,\"linear_num_key_heads\":2,"
      "\"linear_num_value_heads\":4,\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,"
      "\"linear_conv_kernel_dim\":4,\"partial_rotary_factor\":0.25,"
      "\"tie_word_embeddings\":false}",
      "{\"model_type\":\"qwen3_5_moe_text\",\"vocab_size\":512,\"hidden_size\":256,"
      "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
      "\"head_dim\":64,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,"
      "\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,\"linear_conv_kernel_dim\":4,"
      "\"partial_rotary_factor\":0.25,\"num_experts\":8,\"num_experts_per_tok\":2,"
      "\"moe_intermediate_size\":128,\"shared_expert_intermediate_size\":128,"
      "\"tie_word_embeddings\":false}"};
  const char *names[] = {"gen_dense_dk128", "gen_moe_dk128"};
  for (int i = 0; i < 2; i++) {
    char dir[256];
    const char *d = gen(dir, sizeof dir, shapes[i]);
    if (!d || run_model(d, names[i])) return 1;
  }
  TEST_MAIN_END();
}
