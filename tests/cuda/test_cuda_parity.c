/* test_cuda_parity — the forward pass on the CUDA backend against the reference fixtures
 * (tests/fixtures/models/<name>/: ref.json prompts, greedy continuations, fp32 logits made by
 * transformers), plus a timing table when DS_BENCH_MODEL names a model folder.
 *
 * What "within bf16 tolerance" means is measured, not guessed: the same fixture also runs on
 * the CPU reference backend wrapped so that every ACT/KV buffer is rounded to bf16 after each
 * op (bf16 storage, fp32 math: what the CUDA backend does). On these tiny random models bf16
 * storage alone moves logits by 8e-2..5e-1 relative (they amplify perturbations). The CUDA
 * backend passes when, per fixture, its worst row error is <= 1.5 x the emulation's + 1e-2, and,
 * over all fixtures, its greedy continuations match the reference for at least 80% as many
 * tokens as the emulation's (each prompt's continuation is followed until its first mismatch;
 * one near-tie flip ends it, so single prompts are too noisy to judge). GPU machine only
 * (scripts/device/check.sh). */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <time.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "model/qwen35.h"
#include "ref_io.h"
#include "test.h"

#define FIXTURES "tests/fixtures/models"

typedef struct {
  model_config cfg;
  model_weights w;
  backend *be;
  qwen35 *m;
} fx_model;

/* ---- the CPU backend with bf16 storage of ACT/KV buffers ---- */

static backend *EC; /* the wrapped CPU backend */
typedef struct {
  float *p;
  size_t n;
} emu_buf;
static emu_buf *emu_bufs;
static int emu_n, emu_cap;

static void emu_round(void) {
  for (int i = 0; i < emu_n; i++)
    for (size_t j = 0; j < emu_bufs[i].n; j++) {
      uint32_t u;
      memcpy(&u, &emu_bufs[i].p[j], 4);
      if ((u & 0x7fffffffu) <= 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1);
      u &= 0xffff0000u;
      memcpy(&emu_bufs[i].p[j], &u, 4);
    }
}
static backend_buf emu_alloc(backend *be, backend_kind k, size_t n) {
  (void)be;
  backend_buf b = EC->alloc(EC, k, n);
  if (b && (k == BACKEND_KIND_ACT || k == BACKEND_KIND_KV)) {
    memset(b, 0, n * 4);
    if (emu_n == emu_cap) {
      emu_cap = emu_cap ? 2 * emu_cap : 64;
      emu_bufs = realloc(emu_bufs, sizeof *emu_bufs * (size_t)emu_cap);
    }
    emu_bufs[emu_n++] = (emu_buf){b, n};
  }
  return b;
}
static void emu_free(backend *be, backend_buf b) {
  (void)be;
  for (int i = 0; i < emu_n; i++)
    if (emu_bufs[i].p == b) {
      emu_bufs[i] = emu_bufs[--emu_n];
      break;
    }
  EC->free(EC, b);
}
static void emu_destroy(backend *be) {
  EC->destroy(EC);
  EC = NULL;
  free(be);
}
#define EMU(name, sig, args)   \
  static void emu_##name sig { \
    (void)be;                  \
    EC->name args;             \
    emu_round();               \
  }
EMU(embed, (backend * be, backend_weight E, int H, backend_buf o), (EC, E, H, o))
EMU(rmsnorm,
    (backend * be, backend_buf x, backend_buf a, backend_weight w, int T, int n, float eps,
     backend_buf y),
    (EC, x, a, w, T, n, eps, y))
EMU(add, (backend * be, backend_buf x, backend_buf y, size_t n), (EC, x, y, n))
EMU(matmul, (backend * be, backend_buf x, backend_weight W, int T, int K, int N, backend_buf y),
    (EC, x, W, T, K, N, y))
EMU(qk_norm_rope,
    (backend * be, backend_buf qg, backend_buf k, backend_weight a, backend_weight b, int nh,
     int nkv, int hd, int rot, double th, float eps, backend_buf q, backend_buf g),
    (EC, qg, k, a, b, nh, nkv, hd, rot, th, eps, q, g))
EMU(attention,
    (backend * be, backend_buf kp, backend_buf vp, backend_buf q, backend_buf k, backend_buf v,
     int nh, int nkv, int hd, float s, backend_buf o),
    (EC, kp, vp, q, k, v, nh, nkv, hd, s, o))
EMU(sigmoid_mul, (backend * be, backend_buf x, backend_buf g, size_t n), (EC, x, g, n))
EMU(swiglu, (backend * be, backend_buf g, backend_buf u, size_t n, backend_buf o), (EC, g, u, n, o))
EMU(moe, (backend * be, backend_buf x, const backend_moe *m, int T, int H, backend_buf o),
    (EC, x, m, T, H, o))
EMU(conv1d,
    (backend * be, backend_buf s, backend_buf x, backend_weight w, int Cc, int K, backend_buf o),
    (EC, s, x, w, Cc, K, o))
EMU(gdn_gates,
    (backend * be, backend_buf q, backend_buf b, backend_buf a, backend_weight al,
     backend_weight db, int nk, int nv, int dk, int dv, backend_buf bt, backend_buf g),
    (EC, q, b, a, al, db, nk, nv, dk, dv, bt, g))
EMU(gdn_prefill,
    (backend * be, backend_buf s, backend_buf q, backend_buf b, backend_buf g, int nk, int nv,
     int dk, int dv, backend_buf o),
    (EC, s, q, b, g, nk, nv, dk, dv, o))
EMU(gdn_decode,
    (backend * be, backend_buf s, backend_buf q, backend_buf b, backend_buf g, int nk, int nv,
     int dk, int dv, backend_buf o),
    (EC, s, q, b, g, nk, nv, dk, dv, o))
EMU(gated_rmsnorm,
    (backend * be, backend_buf o, backend_buf z, backend_weight w, int T, int nv, int dv, float eps,
     backend_buf out),
    (EC, o, z, w, T, nv, dv, eps, out))
EMU(logits,
    (backend * be, backend_buf x, backend_weight n, float eps, backend_weight W, int H, int V,
     backend_buf o),
    (EC, x, n, eps, W, H, V, o))

static backend *emu_create(void) {
  EC = backend_cpu_create(0);
  backend *be = malloc(sizeof *be);
  if (!EC || !be) return NULL;
  *be = *EC;
  be->name = "cpu-bf16-emulated";
  be->destroy = emu_destroy;
  be->alloc = emu_alloc;
  be->free = emu_free;
#define SET(n) be->n = emu_##n
  SET(embed);
  SET(rmsnorm);
  SET(add);
  SET(matmul);
  SET(qk_norm_rope);
  SET(attention);
  SET(sigmoid_mul);
  SET(swiglu);
  SET(moe);
  SET(conv1d);
  SET(gdn_gates);
  SET(gdn_prefill);
  SET(gdn_decode);
  SET(gated_rmsnorm);
  SET(logits);
#undef SET
  return be;
}

/* ---- per-op profile of the CUDA backend (bench only) ----
 * A wrapper over the CUDA backend's table: while prof_on, each op is bracketed by sync calls
 * and host clocks (so each time includes one launch + sync round trip, measured alone as
 * "(sync overhead)"); times are summed per op name (matmuls per N x K). */
static backend *PC; /* the wrapped CUDA backend */
static int prof_on;
#define PROF_MAX 64
static struct {
  char name[48];
  double s;
  int n;
} prof[PROF_MAX];
static int prof_n;
static double prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void prof_acc(const char *name, double dt) {
  int i;
  for (i = 0; i < prof_n; i++)
    if (!strcmp(prof[i].name, name)) break;
  if (i == prof_n) {
    if (prof_n == PROF_MAX) return;
    snprintf(prof[prof_n++].name, 48, "%s", name);
  }
  prof[i].s += dt;
  prof[i].n++;
}
static void prof_reset(void) {
  prof_n = 0;
  memset(prof, 0, sizeof prof);
}
static void prof_print(const char *title, int steps) {
  double tot = 0;
  for (int i = 0; i < prof_n; i++) tot += prof[i].s;
  printf("PROFILE %s (per step, %d steps; each op bracketed by syncs)\n", title, steps);
  for (int i = 0; i < prof_n; i++)
    printf("PROFILE   %-28s %5d calls %9.3f ms %5.1f%%\n", prof[i].name, prof[i].n / steps,
           prof[i].s * 1e3 / steps, 100.0 * prof[i].s / tot);
  printf("PROFILE   %-28s %15.3f ms\n", "total", tot * 1e3 / steps);
}
#define PROF_T(name_expr, call)            \
  do {                                     \
    if (!prof_on) {                        \
      call;                                \
      break;                               \
    }                                      \
    PC->sync(PC, NULL, 0);                 \
    double t0_ = prof_now();               \
    call;                                  \
    PC->sync(PC, NULL, 0);                 \
    prof_acc(name_expr, prof_now() - t0_); \
  } while (0)
#define PROF(name, sig, args)     \
  static void prof_##name sig {   \
    (void)be;                     \
    PROF_T(#name, PC->name args); \
  }
PROF(embed, (backend * be, backend_buf E, int H, backend_buf o), (PC, E, H, o))
PROF(rmsnorm,
     (backend * be, backend_buf x, backend_buf a, backend_weight w, int T, int n, float eps,
      backend_buf y),
     (PC, x, a, w, T, n, eps, y))
PROF(add, (backend * be, backend_buf x, backend_buf y, size_t n), (PC, x, y, n))
PROF(qk_norm_rope,
     (backend * be, backend_buf qg, backend_buf k, backend_weight a, backend_weight b, int nh,
      int nkv, int hd, int rot, double th, float eps, backend_buf q, backend_buf g),
     (PC, qg, k, a, b, nh, nkv, hd, rot, th, eps, q, g))
PROF(attention,
     (backend * be, backend_buf kp, backend_buf vp, backend_buf q, backend_buf k, backend_buf v,
      int nh, int nkv, int hd, float s, backend_buf o),
     (PC, kp, vp, q, k, v, nh, nkv, hd, s, o))
PROF(sigmoid_mul, (backend * be, backend_buf x, backend_buf g, size_t n), (PC, x, g, n))
PROF(swiglu, (backend * be, backend_buf g, backend_buf u, size_t n, backend_buf o),
     (PC, g, u, n, o))
PROF(moe, (backend * be, backend_buf x, const backend_moe *m, int T, int H, backend_buf o),
     (PC, x, m, T, H, o))
PROF(conv1d,
     (backend * be, backend_buf s, backend_buf x, backend_weight w, int Cc, int K, backend_buf o),
     (PC, s, x, w, Cc, K, o))
PROF(gdn_gates,
     (backend * be, backend_buf q, backend_buf b, backend_buf a, backend_weight al,
      backend_weight db, int nk, int nv, int dk, int dv, backend_buf bt, backend_buf g),
     (PC, q, b, a, al, db, nk, nv, dk, dv, bt, g))
PROF(gdn_prefill,
     (backend * be, backend_buf s, backend_buf q, backend_buf b, backend_buf g, int nk, int nv,
      int dk, int dv, backend_buf o),
     (PC, s, q, b, g, nk, nv, dk, dv, o))
PROF(gdn_decode,
     (backend * be, backend_buf s, backend_buf q, backend_buf b, backend_buf g, int nk, int nv,
      int dk, int dv, backend_buf o),
     (PC, s, q, b, g, nk, nv, dk, dv, o))
PROF(gated_rmsnorm,
     (backend * be, backend_buf o, backend_buf z, backend_weight w, int T, int nv, int dv,
      float eps, backend_buf out),
     (PC, o, z, w, T, nv, dv, eps, out))
PROF(logits,
     (backend * be, backend_buf x, backend_weight n, float eps, backend_weight W, int H, int V,
      backend_buf o),
     (PC, x, n, eps, W, H, V, o))
static void prof_matmul(backend *be, backend_buf x, backend_weight W, int T, int K, int N,
                        backend_buf y) {
  (void)be;
  char nm[48];
  snprintf(nm, sizeof nm, "matmul N=%d K=%d", N, K);
  PROF_T(nm, PC->matmul(PC, x, W, T, K, N, y));
}
static void prof_destroy(backend *be) {
  PC->destroy(PC);
  PC = NULL;
  free(be);
}
static backend *prof_create(char *err, size_t errlen) {
  PC = backend_cuda_create(0, &(backend_options){0}, err, errlen);
  backend *be = malloc(sizeof *be);
  if (!PC || !be) return NULL;
  *be = *PC;
  be->destroy = prof_destroy;
#define SET(n) be->n = prof_##n
  SET(embed);
  SET(rmsnorm);
  SET(add);
  SET(matmul);
  SET(qk_norm_rope);
  SET(attention);
  SET(sigmoid_mul);
  SET(swiglu);
  SET(moe);
  SET(conv1d);
  SET(gdn_gates);
  SET(gdn_prefill);
  SET(gdn_decode);
  SET(gated_rmsnorm);
  SET(logits);
#undef SET
  return be;
}
/* the round trip of one empty sync pair, to read the table against */
static void prof_sync_overhead(void) {
  double t0 = prof_now();
  for (int i = 0; i < 100; i++) PC->sync(PC, NULL, 0);
  printf("PROFILE   (one sync round trip: %.1f us)\n", (prof_now() - t0) * 1e4);
}

static int fx_open(fx_model *f, const char *dir, int n_pages, int n_slots, char *err, size_t errlen,
                   int emulate) {
  memset(f, 0, sizeof *f);
  if (model_load(dir, &f->cfg, &f->w, err, errlen)) return -1;
  f->be = emulate == 2 ? prof_create(err, errlen)
          : emulate    ? emu_create()
                       : backend_cuda_create(0, &(backend_options){0}, err, errlen);
  if (!f->be) return -1;
  qwen35_mem_opts o = {.n_pages = n_pages, .n_slots = n_slots};
  return qwen35_init(&f->m, &f->cfg, &f->w, f->be, &o, err, errlen);
}

static void fx_close(fx_model *f) {
  if (f->m) qwen35_free(f->m);
  if (f->be) f->be->destroy(f->be);
  weights_free(&f->w);
}

static int n_fixtures;
static double g_worst;
static int g_greedy_ok, g_greedy_total, g_emu_greedy;

typedef struct {
  double worst;
  int gok, gtot;
} fx_result;

/* Runs every prompt of a fixture (prefill, then greedy decode steps) on the CUDA backend or the
 * bf16-emulated CPU backend. Returns 0, or -1 when the model could not be opened or run. */
static int run_fixture(const char *name, int emulate, fx_result *res) {
  char dir[512], path[700], err[512] = "";
  snprintf(dir, sizeof dir, FIXTURES "/%s", name);
  snprintf(path, sizeof path, "%s/ref.json", dir);
  json_error_t je;
  json_t *ref = json_load_file(path, 0, &je);
  EXPECT_MSG(ref != NULL, "%s: %s", path, je.text);
  if (!ref) return -1;
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
  int rc = fx_open(&f, dir, n_pages, 1, err, sizeof err, emulate);
  EXPECT_MSG(rc == 0, "%s: %s", name, err);
  if (rc) {
    printf("  %-12s cannot open: %s\n", name, err);
    fx_close(&f);
    json_decref(ref);
    return -1;
  }
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
        if (!(rel <= worst)) worst = rel;
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
      fwd_seq d = {&t1, 1, n + k, pages, n_pages, 0, QWEN35_LOGITS_LAST, -1};
      rc = qwen35_forward(f.m, &d, 1, got, err, sizeof err);
      EXPECT_MSG(rc == 0, "%s: decode: %s", name, err);
      tok = argmax(got, V);
    }
    gok += matched;
    gtot += ng;
    free(ids);
    free(want);
    free(got);
  }
  fx_close(&f);
  json_decref(ref);
  res->worst = worst;
  res->gok = gok;
  res->gtot = gtot;
  return rc ? -1 : 0;
}

static void check_fixture(const char *name) {
  fx_result cu, em;
  if (run_fixture(name, 0, &cu)) return;
  if (run_fixture(name, 1, &em)) return;
  n_fixtures++;
  printf("  %-12s worst logits rel err %.3e (bf16-emulated CPU %.3e), greedy %d/%d (emulated %d)\n",
         name, cu.worst, em.worst, cu.gok, cu.gtot, em.gok);
  EXPECT_MSG(cu.worst <= 1.5 * em.worst + 1e-2, "%s: logits rel err %.3e vs bf16-emulated %.3e",
             name, cu.worst, em.worst);
  if (cu.worst > g_worst) g_worst = cu.worst;
  g_greedy_ok += cu.gok;
  g_greedy_total += cu.gtot;
  g_emu_greedy += em.gok;
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
  EXPECT_MSG(g_greedy_ok >= 0.8 * g_emu_greedy, "greedy matched %d tokens, bf16-emulated CPU %d",
             g_greedy_ok, g_emu_greedy);
  printf("PARITY worst_rel_err=%.4e greedy_match=%d/%d greedy_match_bf16_emulated=%d fixtures=%d\n",
         g_worst, g_greedy_ok, g_greedy_total, g_emu_greedy, n_fixtures);
}

/* Batch invariance (backend.h, Numerics): a sequence's logits alone vs in one step with
 * another sequence (a prefill piece and a decode row) must be bit-identical. */
TEST(batch_invariance) {
  char err[512] = "";
  fx_model f;
  int rc = fx_open(&f, FIXTURES "/dense_bf16", 24, 3, err, sizeof err, 0);
  EXPECT_MSG(rc == 0, "%s", err);
  if (rc == 0) {
    int V = f.cfg.vocab_size;
    int32_t toks[100], p0[8], p1[8], p2[8];
    for (int i = 0; i < 100; i++) toks[i] = (i * 37 + 11) % V;
    for (int i = 0; i < 8; i++) p0[i] = i, p1[i] = 8 + i, p2[i] = 16 + i;
    float *a = malloc(sizeof(float) * 80 * V), *b = malloc(sizeof(float) * 90 * V);
    rc |= qwen35_slot_zero(f.m, 0) | qwen35_slot_zero(f.m, 1) | qwen35_slot_zero(f.m, 2);
    fwd_seq alone = {toks, 70, 0, p0, 8, 0, QWEN35_LOGITS_ALL, -1};
    rc |= qwen35_forward(f.m, &alone, 1, a, err, sizeof err);
    fwd_seq pre = {toks + 80, 3, 0, p2, 8, 2, QWEN35_LOGITS_NONE, -1};
    rc |= qwen35_forward(f.m, &pre, 1, b, err, sizeof err);
    fwd_seq two[2] = {{toks + 83, 1, 3, p2, 8, 2, QWEN35_LOGITS_ALL, -1},
                      {toks, 70, 0, p1, 8, 1, QWEN35_LOGITS_ALL, -1}};
    rc |= qwen35_forward(f.m, two, 2, b, err, sizeof err);
    EXPECT_MSG(rc == 0, "%s", err);
    size_t ndiff = 0;
    for (size_t i = 0; i < (size_t)70 * V; i++) ndiff += memcmp(&a[i], &b[(size_t)V + i], 4) != 0;
    printf("  batch invariance: %zu of %zu logits differ (alone vs with a decode row)\n", ndiff,
           (size_t)70 * V);
    EXPECT_MSG(ndiff == 0, "%zu logits differ alone vs batched", ndiff);
    free(a);
    free(b);
  }
  fx_close(&f);
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
  int rc = fx_open(&f, dir, per * nseq_max, nseq_max, err, sizeof err, 2);
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
    fwd_seq s = {toks, plen, 0, pages, per, 0, QWEN35_LOGITS_LAST, -1};
    double a = now_s();
    rc |= qwen35_forward(f.m, &s, 1, logits, err, sizeof err);
    double b = now_s();
    if (rep)
      printf("BENCH prefill %d tokens: %.1f ms, %.0f tok/s\n", plen, (b - a) * 1e3, plen / (b - a));
  }
  if (getenv("DS_PROFILE")) {
    prof_sync_overhead();
    qwen35_slot_zero(f.m, 0);
    fwd_seq s = {toks, plen, 0, pages, per, 0, QWEN35_LOGITS_LAST, -1};
    prof_reset();
    prof_on = 1;
    rc |= qwen35_forward(f.m, &s, 1, logits, err, sizeof err);
    prof_on = 0;
    prof_print("prefill 2048", 1);
  }
  /* decode: batch sizes 1 and 32, context plen */
  int bs_list[2] = {1, 32};
  for (int bi = 0; bi < 2 && !rc; bi++) {
    int bs = bs_list[bi];
    fwd_seq seqs[64];
    for (int s = 0; s < bs; s++) {
      qwen35_slot_copy(f.m, s, 0);
      seqs[s] =
          (fwd_seq){toks + s, 1, plen, pages + (s ? s * per : 0), per, s, QWEN35_LOGITS_LAST, -1};
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
    if (getenv("DS_PROFILE") && !rc) {
      prof_reset();
      prof_on = 1;
      for (int k = 0; k < 3 && !rc; k++)
        rc |= qwen35_forward(f.m, seqs, bs, logits, err, sizeof err);
      prof_on = 0;
      char title[64];
      snprintf(title, sizeof title, "decode batch %d ctx %d", bs, plen);
      prof_print(title, 3);
    }
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
  RUN(batch_invariance);
  const char *bm = getenv("DS_BENCH_MODEL");
  if (bm && *bm) bench(bm);
  TEST_MAIN_END();
}
