/* sample_cases.h — a backend's sample op against the host sampler (sampler_sample) on the same
 * logits and seeds: every id must be equal. Shared by the CPU backend's test and the CUDA op
 * tests. Rows: wide, peaked, quantised (many exact ties), very wide, with -inf and NaN, all
 * equal, all -inf, one +inf, all NaN; parameters: greedy and four temperatures, top_k from 1 to
 * past the vocabulary, top_p from 0.01 to 1, min_p 0 and 0.05. */
#ifndef DS_TEST_SAMPLE_CASES_H
#define DS_TEST_SAMPLE_CASES_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "sampler/sample_rule.h"
#include "sampler/sampler.h"

static uint64_t sc_state = 0x853c49e6748fea9bULL;
static double sc_u01(void) {
  sc_state = sc_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(sc_state >> 11) * 0x1.0p-53;
}

#define SC_KINDS 9
static void sc_fill(float *l, int n, int kind) {
  for (int i = 0; i < n; i++) {
    double g = sqrt(-2 * log(sc_u01() + 1e-300)) * cos(6.283185307179586 * sc_u01());
    switch (kind) {
    case 0: l[i] = (float)(3 * g); break;
    case 1: l[i] = (float)(g + (sc_u01() < 0.001 ? 12 : 0)); break;
    case 2: l[i] = (float)floor(4 * g) * 0.5f; break;
    case 3: l[i] = (float)(20 * g); break;
    case 4: l[i] = sc_u01() < 0.01 || i == 2 ? -INFINITY : i == 7 ? NAN : (float)(2 * g); break;
    case 5: l[i] = 0.25f; break;
    case 6: l[i] = -INFINITY; break;
    case 7: l[i] = i == n / 2 ? INFINITY : (float)g; break;
    default: l[i] = NAN; break;
    }
  }
}

/* one op call over the n rows gathered, each id compared */
static void sc_flush(backend *be, int V, int n, const float *rows, const int32_t *words,
                     const int32_t *want, int32_t *got, backend_buf bx, backend_buf bp,
                     backend_buf bi, int kind, int *checked, int *bad) {
  be->write(be, bx, 0, rows, (size_t)n * V * sizeof *rows);
  be->write(be, bp, 0, words, (size_t)n * SAMPLE_RULE_WORDS * sizeof *words);
  be->sample(be, bx, n, V, bp, bi);
  be->read(be, bi, 0, got, (size_t)n * sizeof *got);
  be->sync(be, NULL, 0);
  for (int r = 0; r < n; r++) {
    (*checked)++;
    if (got[r] != want[r]) {
      sample_rule_row q;
      sample_rule_unpack(words + (size_t)r * SAMPLE_RULE_WORDS, &q);
      if (*bad < 8)
        fprintf(stderr, "  V %d kind %d row %d T %g k %d p %g min_p %g: op %d, sampler %d\n", V,
                kind, r, q.temperature, q.top_k, q.top_p, q.min_p, got[r], want[r]);
      (*bad)++;
    }
  }
}

/* Runs the cases at vocabulary size V (rows per op call: up to max_rows); big: fewer sets. */
static void sample_cases_run(backend *be, int V, int max_rows, int big, int *checked, int *bad) {
  static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 2.5f};
  const int top_ks[] = {0, 1, 2, 20, 1000, V - 1, V + 5};
  static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  static const float min_ps[] = {0.0f, 0.05f};
  int n_sets = 5 * 7 * 4 * 2;
  float *base = malloc((size_t)V * sizeof *base), *rows = malloc((size_t)max_rows * V * sizeof *rows);
  float *h = malloc((size_t)V * sizeof *h);
  int32_t *words = malloc((size_t)max_rows * SAMPLE_RULE_WORDS * sizeof *words);
  int32_t *want = malloc((size_t)max_rows * sizeof *want), *got = malloc((size_t)max_rows * sizeof *got);
  backend_buf bx = be->alloc(be, BACKEND_KIND_F32, (size_t)max_rows * V);
  backend_buf bp = be->alloc(be, BACKEND_KIND_I32, (size_t)max_rows * SAMPLE_RULE_WORDS);
  backend_buf bi = be->alloc(be, BACKEND_KIND_I32, (size_t)max_rows);
  sampler_scratch w;
  if (!base || !rows || !h || !words || !want || !got || !bx || !bp || !bi ||
      sampler_scratch_init(&w, V)) {
    (*bad)++;
    fprintf(stderr, "  sample cases: out of memory\n");
    return;
  }
  for (int kind = 0; kind < SC_KINDS; kind++) {
    sc_fill(base, V, kind);
    int n = 0;
    for (int set = 0; set < n_sets; set++) {
      int ti = set % 5, ki = set / 5 % 7, pi = set / 35 % 4, mi = set / 140;
      if (big && set % 7 != kind % 7) continue;
      sampling_params p;
      sampling_params_default(&p);
      p.temperature = temps[ti];
      p.top_k = top_ks[ki];
      p.top_p = top_ps[pi];
      p.min_p = min_ps[mi];
      p.seed = (uint64_t)kind * 100003 + (uint64_t)set * 7 + (uint64_t)V;
      p.has_seed = 1;
      sampler sh, sd;
      sampler_init(&sh, &p, 0);
      sampler_init(&sd, &p, 0);
      sampler_result res;
      memcpy(h, base, (size_t)V * sizeof *h);
      want[n] = sampler_sample(&sh, h, V, NULL, 0, NULL, 0, &w, &res);
      sampler_device_row(&sd, words + (size_t)n * SAMPLE_RULE_WORDS);
      if (memcmp(sh.rng, sd.rng, sizeof sh.rng) != 0) {
        (*bad)++;
        fprintf(stderr, "  sample cases: the device row's draw left the RNG elsewhere\n");
      }
      memcpy(rows + (size_t)n * V, base, (size_t)V * sizeof *rows);
      n++;
      if (n == max_rows) {
        sc_flush(be, V, n, rows, words, want, got, bx, bp, bi, kind, checked, bad);
        n = 0;
      }
    }
    if (n) sc_flush(be, V, n, rows, words, want, got, bx, bp, bi, kind, checked, bad);
  }
  be->free(be, bx);
  be->free(be, bp);
  be->free(be, bi);
  sampler_scratch_free(&w);
  free(base);
  free(rows);
  free(h);
  free(words);
  free(want);
  free(got);
}

#endif
