/* test_cuda_parity — the forward pass on the CUDA backend against the reference fixtures
 * (tests/fixtures/models/<name>/: ref.json prompts, greedy continuations, fp32 logits made by
 * transformers), plus a timing table when DS_BENCH_MODEL names a model folder.
 *
 * bf16 activations through every layer keep logits within a few 1e-2 relative of the fp32
 * reference (tolerance LOGIT_TOL per row); greedy tokens must equal the reference for the
 * first GREEDY_MUST steps of each prompt (later steps may flip on near-ties of a random
 * tiny model; how many matched is printed). GPU machine only (scripts/device/check.sh). */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <time.h>

#include "backend/cuda/backend_cuda.h"
#include "model/qwen35.h"
#include "test.h"

#define FIXTURES "tests/fixtures/models"
#define LOGIT_TOL 3e-2
#define GREEDY_MUST 4

typedef struct {
  model_config cfg;
  model_weights w;
  backend *be;
  qwen35 *m;
} fx_model;

static int fx_open(fx_model *f, const char *dir, int n_pages, int n_slots, char *err,
                   size_t errlen) {
  memset(f, 0, sizeof *f);
  if (model_load(dir, &f->cfg, &f->w, err, errlen)) return -1;
  f->be = backend_cuda_create(0, err, errlen);
  if (!f->be) return -1;
  qwen35_mem_opts o = {.n_pages = n_pages, .n_slots = n_slots};
  return qwen35_init(&f->m, &f->cfg, &f->w, f->be, &o, err, errlen);
}

static void fx_close(fx_model *f) {
  if (f->m) qwen35_free(f->m);
  if (f->be) f->be->destroy(f->be);
  weights_free(&f->w);
}

static float *read_f32(const char *path, size_t n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  float *x = malloc(n * sizeof *x);
  size_t got = x ? fread(x, sizeof *x, n, fp) : 0;
  fclose(fp);
  if (got != n) {
    free(x);
    return NULL;
  }
  return x;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static int n_fixtures;
static double g_worst;
static int g_greedy_ok, g_greedy_total;

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
  int max_len = 0;
  for (size_t i = 0; i < np; i++) {
    int l = (int)json_array_size(json_array_get(prompts, i));
    if (l > max_len) max_len = l;
  }
  int n_pages = (max_len + 24 + 15) / 16 + 1;
  fx_model f;
  int rc = fx_open(&f, dir, n_pages, 1, err, sizeof err);
  EXPECT_MSG(rc == 0, "%s: %s", name, err);
  if (rc) {
    printf("  %-12s cannot open: %s\n", name, err);
    fx_close(&f);
    json_decref(ref);
    return;
  }
  n_fixtures++;
  int V = f.cfg.vocab_size;
  int32_t pages[n_pages];
  for (int i = 0; i < n_pages; i++) pages[i] = n_pages - 1 - i;
  double worst = 0;
  int gok = 0, gtot = 0;
  for (size_t pi = 0; pi < np; pi++) {
    json_t *pj = json_array_get(prompts, pi);
    int n = (int)json_array_size(pj);
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pj, i));
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_array_get(lfiles, pi)));
    float *want = read_f32(path, (size_t)n * V);
    EXPECT_MSG(want != NULL, "%s: cannot read %s", name, path);
    float *got = malloc(sizeof *got * (size_t)n * V);
    EXPECT(qwen35_slot_zero(f.m, 0) == 0);
    fwd_seq s = {ids, n, 0, pages, n_pages, 0, QWEN35_LOGITS_ALL};
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
        if (!(rel <= worst)) worst = rel;
        EXPECT_MSG(rel <= LOGIT_TOL, "%s prompt %zu row %d: relative error %.3g", name, pi, r, rel);
      }
    }
    json_t *gj = json_array_get(greedy, pi);
    int ng = (int)json_array_size(gj), tok = argmax(got + (size_t)(n - 1) * V, V);
    int has_pad = 0; /* the generator masked id 0 of a prompt as padding: skip those */
    for (int i = 0; i < n; i++) has_pad |= ids[i] == 0;
    if (has_pad) ng = 0;
    int matched = 0;
    for (int k = 0; k < ng && rc == 0; k++) {
      int want_tok = (int)json_integer_value(json_array_get(gj, k));
      if (tok != want_tok) break;
      matched++;
      if (k + 1 == ng) break;
      int32_t t1 = tok;
      fwd_seq d = {&t1, 1, n + k, pages, n_pages, 0, QWEN35_LOGITS_LAST};
      rc = qwen35_forward(f.m, &d, 1, got, err, sizeof err);
      EXPECT_MSG(rc == 0, "%s: decode: %s", name, err);
      tok = argmax(got, V);
    }
    if (ng) {
      EXPECT_MSG(matched >= (ng < GREEDY_MUST ? ng : GREEDY_MUST),
                 "%s prompt %zu: greedy matched only %d tokens", name, pi, matched);
      gok += matched;
      gtot += ng;
    }
    free(ids);
    free(want);
    free(got);
  }
  printf("  %-12s worst logits rel err %.3e, greedy %d/%d tokens match\n", name, worst, gok, gtot);
  if (worst > g_worst) g_worst = worst;
  g_greedy_ok += gok;
  g_greedy_total += gtot;
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
  printf("PARITY worst_rel_err=%.4e greedy_match=%d/%d fixtures=%d\n", g_worst, g_greedy_ok,
         g_greedy_total, n_fixtures);
}

/* ---- timing (only with DS_BENCH_MODEL) ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(const char *dir) {
  char err[512] = "";
  fx_model f;
  int plen = 2048, nseq_max = 64, ctx = plen + 64;
  int per = (ctx + 15) / 16;
  double t0 = now_s();
  int rc = fx_open(&f, dir, per * nseq_max, nseq_max, err, sizeof err);
  if (rc) {
    printf("BENCH skipped: %s\n", err);
    fx_close(&f);
    return;
  }
  printf("BENCH load+upload %.1f s\n", now_s() - t0);
  int V = f.cfg.vocab_size;
  int32_t *toks = malloc(sizeof *toks * plen);
  for (int i = 0; i < plen; i++) toks[i] = (i * 7919 + 13) % V;
  int32_t *pages = malloc(sizeof *pages * per * nseq_max);
  for (int i = 0; i < per * nseq_max; i++) pages[i] = i;
  float *logits = malloc(sizeof(float) * (size_t)V * nseq_max);
  /* prefill: one sequence of plen tokens */
  for (int rep = 0; rep < 2; rep++) {
    qwen35_slot_zero(f.m, 0);
    fwd_seq s = {toks, plen, 0, pages, per, 0, QWEN35_LOGITS_LAST};
    double a = now_s();
    rc |= qwen35_forward(f.m, &s, 1, logits, err, sizeof err);
    double b = now_s();
    if (rep) printf("BENCH prefill %d tokens: %.1f ms, %.0f tok/s\n", plen, (b - a) * 1e3, plen / (b - a));
  }
  /* decode: batch sizes 1 and 32, context plen */
  int bs_list[2] = {1, 32};
  for (int bi = 0; bi < 2 && !rc; bi++) {
    int bs = bs_list[bi];
    fwd_seq seqs[64];
    for (int s = 0; s < bs; s++) {
      qwen35_slot_copy(f.m, s, 0);
      seqs[s] = (fwd_seq){toks + s, 1, plen, pages + (s ? s * per : 0), per, s, QWEN35_LOGITS_LAST};
    }
    int steps = 20;
    double a = 0;
    for (int k = 0; k < steps + 3 && !rc; k++) {
      if (k == 3) a = now_s();
      for (int s = 0; s < bs; s++) seqs[s].pos = plen + (k % 32);
      rc |= qwen35_forward(f.m, seqs, bs, logits, err, sizeof err);
    }
    double dt = (now_s() - a) / steps;
    printf("BENCH decode batch %d ctx %d: %.2f ms/step, %.0f tok/s\n", bs, plen, dt * 1e3, bs / dt);
  }
  if (rc) printf("BENCH failed: %s\n", err);
  free(toks);
  free(pages);
  free(logits);
  fx_close(&f);
}

int main(void) {
  if (!backend_cuda_available()) {
    printf("FAIL cuda_available: no CUDA device\n");
    return 1;
  }
  RUN(reference_fixtures);
  const char *bm = getenv("DS_BENCH_MODEL");
  if (bm && *bm) bench(bm);
  TEST_MAIN_END();
}
