/* test_parity — the forward pass against Hugging Face transformers (fp32) on the reference
 * fixtures in tests/fixtures/models/<name>/ (config.json, weights, ref.json with prompts,
 * greedy continuations and logits files), plus bit-exact batch invariance and split-prefill
 * invariance of the CPU backend. */
/* Messages may truncate long names: that is fine in a test report. */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>

#include "backend/cpu/backend_cpu.h"
#include "model/qwen35.h"
#include "ref_io.h"
#include "test.h"

#define FIXTURES "tests/fixtures/models"
#define N_GREEDY 24

typedef struct {
  model_config cfg;
  model_weights w;
  backend *be;
  qwen35 *m;
  int n_pages;
} fx_model;

static int fx_open(fx_model *f, const char *dir, int threads, int n_pages, int n_slots, char *err,
                   size_t errlen) {
  memset(f, 0, sizeof *f);
  if (model_load(dir, &f->cfg, &f->w, err, errlen)) return -1;
  f->be = backend_cpu_create(threads);
  if (!f->be) return -1;
  qwen35_mem_opts o = {.n_pages = n_pages, .n_slots = n_slots};
  f->n_pages = n_pages;
  return qwen35_init(&f->m, &f->cfg, &f->w, f->be, &o, err, errlen);
}

static void fx_close(fx_model *f) {
  qwen35_free(f->m);
  if (f->be) f->be->destroy(f->be);
  weights_free(&f->w);
}

static int n_fixtures;

/* One fixture folder: logits of every prompt row within 1e-4 relative error, and the 24 greedy
 * tokens identical. */
static void check_fixture(const char *name) {
  char dir[512], path[700], err[512] = "";
  snprintf(dir, sizeof dir, FIXTURES "/%s", name);
  snprintf(path, sizeof path, "%s/ref.json", dir);
  json_error_t je;
  json_t *ref = json_load_file(path, 0, &je);
  EXPECT_MSG(ref != NULL, "%s: %s", path, je.text);
  if (!ref) return;
  json_t *prompts = json_object_get(ref, "prompts"), *greedy = json_object_get(ref, "greedy"),
         *lfiles = json_object_get(ref, "logits");
  size_t np = json_array_size(prompts);
  EXPECT_MSG(np > 0 && json_array_size(greedy) == np && json_array_size(lfiles) == np,
             "%s: malformed ref.json", name);
  int max_len = 0;
  for (size_t i = 0; i < np; i++) {
    int l = (int)json_array_size(json_array_get(prompts, i));
    if (l > max_len) max_len = l;
  }
  int n_pages = (max_len + N_GREEDY + 15) / 16 + 1;
  fx_model f;
  int rc = fx_open(&f, dir, 2, n_pages, 1, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s: %s", name, err);
  if (rc) {
    fx_close(&f);
    json_decref(ref);
    return;
  }
  n_fixtures++;
  int V = f.cfg.vocab_size;
  int32_t pages[n_pages];
  for (int i = 0; i < n_pages; i++) pages[i] = i;
  double worst = 0;
  for (size_t pi = 0; pi < np; pi++) {
    json_t *pj = json_array_get(prompts, pi);
    int n = (int)json_array_size(pj);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pj, i));
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_array_get(lfiles, pi)));
    float *want = read_f32(path, (size_t)n * V);
    EXPECT_MSG(want != NULL, "%s: cannot read %s as [%d, %d] float32", name, path, n, V);
    float *got = malloc(sizeof *got * (size_t)n * V);
    EXPECT(qwen35_slot_zero(f.m, 0) == 0);
    fwd_seq s = {ids, n, 0, pages, n_pages, 0, QWEN35_LOGITS_ALL, -1};
    rc = qwen35_forward(f.m, &s, 1, got, err, sizeof err);
    EXPECT_MSG(rc == 0, "%s: forward: %s", name, err);
    if (want && rc == 0) {
      for (int r = 0; r < n; r++) {
        double d = 0, nr = 0;
        for (int j = 0; j < V; j++) {
          double e = (double)got[(size_t)r * V + j] - want[(size_t)r * V + j];
          d += e * e;
          nr += (double)want[(size_t)r * V + j] * want[(size_t)r * V + j];
        }
        double rel = sqrt(d) / sqrt(nr);
        if (rel > worst) worst = rel;
        EXPECT_MSG(rel <= 1e-4, "%s prompt %zu row %d: relative error %.3g", name, pi, r, rel);
      }
    }
    /* greedy: first token from the prefill's last row, then 1-token decode steps */
    json_t *gj = json_array_get(greedy, pi);
    int ng = (int)json_array_size(gj), tok = argmax(got + (size_t)(n - 1) * V, V);
    for (int k = 0; k < ng && rc == 0; k++) {
      int want_tok = (int)json_integer_value(json_array_get(gj, k));
      EXPECT_MSG(tok == want_tok, "%s prompt %zu: greedy token %d is %d, expected %d", name, pi, k,
                 tok, want_tok);
      if (tok != want_tok) {
        printf("  %s prompt %zu: greedy token %d is %d, expected %d\n", name, pi, k, tok, want_tok);
        break;
      }
      if (k + 1 == ng) break;
      int32_t t1 = tok;
      fwd_seq d = {&t1, 1, n + k, pages, n_pages, 0, QWEN35_LOGITS_LAST, -1};
      rc = qwen35_forward(f.m, &d, 1, got, err, sizeof err);
      EXPECT_MSG(rc == 0, "%s: decode: %s", name, err);
      tok = argmax(got, V);
    }
    free(ids);
    free(want);
    free(got);
  }
  printf("  %s: worst row relative error %.3g\n", name, worst);
  fx_close(&f);
  json_decref(ref);
}

TEST(reference_fixtures) {
  DIR *d = opendir(FIXTURES);
  REQUIRE(d != NULL);
  char names[32][256];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 32) {
    if (e->d_name[0] == '.') continue;
    snprintf(names[n++], 256, "%s", e->d_name);
  }
  closedir(d);
  for (int i = 0; i < n; i++) check_fixture(names[i]);
  EXPECT_MSG(n_fixtures >= 1, "no fixture model found under " FIXTURES);
}

/* ---- bit-exact invariance ---- */

/* Three sequences, three steps of pieces (mixed prefill pieces, pieces resuming mid-prompt,
 * 1-token rows), each sequence with its own slot and pages. */
#define N_SEQ 3
#define N_STEP 3
static const int piece_len[N_STEP][N_SEQ] = {{64, 5, 1}, {36, 1, 39}, {1, 1, 1}};

static void run_schedule(fx_model *f, const int32_t *toks, int together, float *logits_out[N_SEQ],
                         char *err, size_t errlen, int *rc) {
  int V = f->cfg.vocab_size, per = f->n_pages / N_SEQ;
  int32_t pages[N_SEQ][64];
  for (int s = 0; s < N_SEQ; s++) {
    for (int p = 0; p < per; p++) pages[s][p] = s * per + (per - 1 - p); /* scattered order */
    if (qwen35_slot_zero(f->m, s)) *rc = -1;
  }
  int pos[N_SEQ] = {0};
  size_t outoff[N_SEQ] = {0};
  for (int st = 0; st < N_STEP && !*rc; st++) {
    fwd_seq seqs[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
      seqs[s] = (fwd_seq){toks + s * 200 + pos[s], piece_len[st][s],  pos[s], pages[s], per,
                          (N_SEQ - 1 - s),         QWEN35_LOGITS_ALL, -1};
    }
    if (together) {
      int total = 0;
      for (int s = 0; s < N_SEQ; s++) total += piece_len[st][s];
      float *buf = malloc(sizeof *buf * (size_t)total * V);
      *rc = qwen35_forward(f->m, seqs, N_SEQ, buf, err, errlen);
      size_t o = 0;
      for (int s = 0; s < N_SEQ; s++) {
        memcpy(logits_out[s] + outoff[s], buf + o, sizeof *buf * (size_t)piece_len[st][s] * V);
        o += (size_t)piece_len[st][s] * V;
      }
      free(buf);
    } else {
      for (int s = 0; s < N_SEQ && !*rc; s++)
        *rc = qwen35_forward(f->m, &seqs[s], 1, logits_out[s] + outoff[s], err, errlen);
    }
    for (int s = 0; s < N_SEQ; s++) {
      outoff[s] += (size_t)piece_len[st][s] * V;
      pos[s] += piece_len[st][s];
    }
  }
}

static const char *pick_fixture(void) {
  static const char *prefer[] = {"moe_f32", "next_bf16", "dense_bf16", "tied_f16", "vlm_bf16"};
  static char path[512];
  for (size_t i = 0; i < sizeof prefer / sizeof prefer[0]; i++) {
    snprintf(path, sizeof path, FIXTURES "/%s/config.json", prefer[i]);
    FILE *fp = fopen(path, "r");
    if (fp) {
      fclose(fp);
      snprintf(path, sizeof path, FIXTURES "/%s", prefer[i]);
      return path;
    }
  }
  return NULL;
}

static void invariance_on(const char *dir) {
  char err[512] = "";
  fx_model a, b;
  int ra = fx_open(&a, dir, 1, 3 * 8, N_SEQ, err, sizeof err);
  EXPECT_MSG(ra == 0, "%s: %s", dir, err);
  int rb = fx_open(&b, dir, 2, 3 * 8, N_SEQ, err, sizeof err);
  EXPECT_MSG(rb == 0, "%s: %s", dir, err);
  if (ra == 0 && rb == 0) {
    int V = a.cfg.vocab_size;
    int32_t toks[N_SEQ * 200];
    uint32_t x = 12345;
    for (int i = 0; i < N_SEQ * 200; i++) {
      x = x * 1664525u + 1013904223u;
      toks[i] = (int32_t)((x >> 8) % (uint32_t)V);
    }
    float *la[N_SEQ], *lb[N_SEQ];
    size_t rows[N_SEQ] = {0};
    for (int s = 0; s < N_SEQ; s++) {
      for (int st = 0; st < N_STEP; st++) rows[s] += (size_t)piece_len[st][s];
      la[s] = calloc(rows[s] * V, sizeof(float));
      lb[s] = calloc(rows[s] * V, sizeof(float));
    }
    int rc = 0;
    run_schedule(&a, toks, 0, la, err, sizeof err, &rc); /* alone, 1 thread */
    EXPECT_MSG(rc == 0, "alone: %s", err);
    run_schedule(&b, toks, 1, lb, err, sizeof err, &rc); /* together, 2 threads */
    EXPECT_MSG(rc == 0, "together: %s", err);
    for (int s = 0; s < N_SEQ; s++) {
      EXPECT_MSG(memcmp(la[s], lb[s], rows[s] * V * sizeof(float)) == 0,
                 "%s: sequence %d logits differ alone vs batched", dir, s);
      free(la[s]);
      free(lb[s]);
    }
  }
  fx_close(&a);
  fx_close(&b);
}

TEST(batch_invariance) {
  const char *dir = pick_fixture();
  REQUIRE(dir != NULL);
  invariance_on(dir);
}

/* A 150-token prefill in one piece vs split at 64 and 128: identical logits and state. */
TEST(split_prefill_bit_identical) {
  const char *dir = pick_fixture();
  REQUIRE(dir != NULL);
  char err[512] = "";
  fx_model f;
  int rc = fx_open(&f, dir, 2, 24, 2, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s", err);
  if (rc == 0) {
    int V = f.cfg.vocab_size, n = 150;
    int32_t toks[150], p0[12], p1[12];
    for (int i = 0; i < n; i++) toks[i] = (i * 37 + 11) % V;
    for (int i = 0; i < 12; i++) p0[i] = i, p1[i] = 12 + i;
    float *a = malloc(sizeof(float) * n * V), *b = malloc(sizeof(float) * n * V);
    qwen35_slot_zero(f.m, 0);
    qwen35_slot_zero(f.m, 1);
    fwd_seq s = {toks, n, 0, p0, 12, 0, QWEN35_LOGITS_ALL, -1};
    rc |= qwen35_forward(f.m, &s, 1, a, err, sizeof err);
    const int cut[3] = {0, 64, 128};
    for (int i = 0; i < 3; i++) {
      int end = i < 2 ? cut[i + 1] : n;
      fwd_seq q = {toks + cut[i], end - cut[i], cut[i], p1, 12, 1, QWEN35_LOGITS_ALL, -1};
      rc |= qwen35_forward(f.m, &q, 1, b + (size_t)cut[i] * V, err, sizeof err);
    }
    EXPECT_MSG(rc == 0, "%s", err);
    EXPECT(memcmp(a, b, sizeof(float) * n * V) == 0);
    size_t sb = qwen35_slot_bytes(f.m);
    char *s0 = malloc(sb), *s1 = malloc(sb);
    EXPECT(qwen35_slot_read(f.m, 0, s0) == 0 && qwen35_slot_read(f.m, 1, s1) == 0);
    EXPECT(memcmp(s0, s1, sb) == 0);
    free(s0), free(s1), free(a), free(b);
  }
  fx_close(&f);
}

/* The forward's step_repeat protocol (backend.h) over a CPU backend whose step_repeat only
 * counts (and, when told, accepts): the model asks exactly when a step has the shape of the
 * step before it (rows, pieces, outputs, greedy or not, prefill or decode), never after a
 * change of any of them, and issues none of the step's ops when the backend accepts. */
static backend *SR_REAL;
static int sr_asks, sr_accept, sr_embeds;
static int sr_step_repeat(backend *be) {
  (void)be;
  sr_asks++;
  return sr_accept;
}
static void sr_embed(backend *be, backend_weight E, int H, backend_buf out) {
  sr_embeds++;
  SR_REAL->embed(be, E, H, out);
}

TEST(step_repeat_asked_on_same_shape) {
  const char *dir = pick_fixture();
  REQUIRE(dir != NULL);
  char err[512] = "";
  model_config cfg;
  model_weights w;
  REQUIRE(model_load(dir, &cfg, &w, err, sizeof err) == 0);
  SR_REAL = backend_cpu_create(2);
  REQUIRE(SR_REAL != NULL);
  backend wr = *SR_REAL;
  wr.step_repeat = sr_step_repeat;
  wr.embed = sr_embed;
  qwen35 *m = NULL;
  qwen35_mem_opts o = {.n_pages = 8, .n_slots = 2}; /* 4 pages (64 positions) a piece */
  int rc = qwen35_init(&m, &cfg, &w, &wr, &o, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s", err);
  EXPECT_MSG(rc != 0 || qwen35_has_argmax(m), "the CPU backend has no argmax op");
  if (rc == 0 && qwen35_has_argmax(m)) {
    int V = cfg.vocab_size;
    int32_t toks[8] = {3, 5, 7, 11, 13, 17, 19, 23}, p0[4] = {0, 1, 2, 3}, p1[4] = {4, 5, 6, 7};
    int32_t ids[2];
    float *lg = malloc(sizeof(float) * 2 * V);
    qwen35_slot_zero(m, 0);
    qwen35_slot_zero(m, 1);
    /* step: pieces (1 or 2), the first piece's tokens, greedy; then asks / ops issued after it */
    struct {
      int n, len, greedy, accept, asks, embeds;
    } st[] = {
        {1, 5, 0, 0, 0, 1},                     /* prefill: the first step */
        {1, 1, 0, 0, 0, 2},                     /* decode after prefill: another shape */
        {1, 1, 0, 0, 1, 3},                     /* the same shape: asked, declined, issued */
        {1, 1, 0, 1, 2, 3},                     /* asked, accepted: nothing issued */
        {1, 1, 1, 0, 2, 4},                     /* greedy: another step */
        {1, 1, 1, 0, 3, 5}, {2, 1, 1, 1, 3, 6}, /* two pieces */
        {2, 1, 1, 1, 4, 6}, {2, 1, 0, 1, 4, 7}, /* logits again */
    };
    int pos0 = 0;
    for (size_t k = 0; k < sizeof st / sizeof st[0] && rc == 0; k++) {
      sr_accept = st[k].accept;
      fwd_seq q[2] = {{toks, st[k].len, pos0, p0, 4, 0, QWEN35_LOGITS_LAST, -1},
                      {toks + 1, 1, 3, p1, 4, 1, QWEN35_LOGITS_LAST, -1}};
      rc = st[k].greedy ? qwen35_forward_greedy(m, q, st[k].n, ids, err, sizeof err)
                        : qwen35_forward(m, q, st[k].n, lg, err, sizeof err);
      EXPECT_MSG(rc == 0, "step %zu: %s", k, err);
      EXPECT_MSG(sr_asks == st[k].asks && sr_embeds == st[k].embeds,
                 "step %zu: asked %d times (want %d), issued %d steps (want %d)", k, sr_asks,
                 st[k].asks, sr_embeds, st[k].embeds);
      pos0 += st[k].len;
    }
    free(lg);
    qwen35_free(m);
  }
  SR_REAL->destroy(SR_REAL);
  weights_free(&w);
}

int main(void) {
  RUN(reference_fixtures);
  RUN(step_repeat_asked_on_same_shape);
  RUN(batch_invariance);
  RUN(split_prefill_bit_identical);
  TEST_MAIN_END();
}
