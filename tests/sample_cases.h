/* sample_cases.h — a backend's sample op against the host sampler (sampler_sample) on the same
 * logits and seeds: every id must be equal. Shared by the CPU backend's test and the CUDA op
 * tests. Rows: wide, peaked, quantised (many exact ties), very wide, with -inf and NaN, all
 * equal, all -inf, one +inf, all NaN; parameters: greedy and four temperatures, top_k from 1 to
 * past the vocabulary, top_p from 0.01 to 1, min_p 0 and 0.05; a third of them with edits
 * (penalties over an output, logit_bias, banned ids: sc_edits_case). */
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
      case 0:
        l[i] = (float)(3 * g);
        break;
      case 1:
        l[i] = (float)(g + (sc_u01() < 0.001 ? 12 : 0));
        break;
      case 2:
        l[i] = (float)floor(4 * g) * 0.5f;
        break;
      case 3:
        l[i] = (float)(20 * g);
        break;
      case 4:
        l[i] = sc_u01() < 0.01 || i == 2 ? -INFINITY : i == 7 ? NAN : (float)(2 * g);
        break;
      case 5:
        l[i] = 0.25f;
        break;
      case 6:
        l[i] = -INFINITY;
        break;
      case 7:
        l[i] = i == n / 2 ? INFINITY : (float)g;
        break;
      default:
        l[i] = NAN;
        break;
    }
  }
}

/* the n rows' edits packed after their words; the words in all */
static int sc_pack(int32_t *words, int n, const sample_rule_edit *ed, const int *ned) {
  int k = 0;
  for (int r = 0; r < n; r++) k += ned[r];
  for (int i = 0; i < k; i++)
    sample_rule_edit_pack(
        &ed[i], words + (size_t)n * SAMPLE_RULE_WORDS + (size_t)i * SAMPLE_RULE_EDIT_WORDS);
  return n * SAMPLE_RULE_WORDS + k * SAMPLE_RULE_EDIT_WORDS;
}

/* one op call over the n rows gathered, each id compared */
static void sc_flush(backend *be, int V, int n, const float *rows, const int32_t *words,
                     int n_words, const int32_t *want, int32_t *got, backend_buf bx, backend_buf bp,
                     backend_buf bi, int kind, int *checked, int *bad) {
  be->write(be, bx, 0, rows, (size_t)n * V * sizeof *rows);
  be->write(be, bp, 0, words, (size_t)n_words * sizeof *words);
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

#define SC_EDITS 64 /* edits a case row has at most */

/* Every third parameter set also has edits: an output of up to 40 earlier tokens (repeats
 * among them) under frequency and presence penalties, logit_bias entries (some on those tokens)
 * and banned ids (some on both), as the host sees them: bans set to -inf, then sampler_sample
 * with the output. */
static int sc_edits_case(int set, int V, sampling_params *p, int32_t *out, int *n_out, int32_t *ban,
                         int *n_ban) {
  *n_out = *n_ban = 0;
  if (set % 3 != 1) return 0;
  p->frequency_penalty = (float)(sc_u01() * 4 - 2);
  p->presence_penalty = set % 2 ? (float)(sc_u01() * 4 - 2) : 0.0f;
  *n_out = (int)(sc_u01() * 40);
  for (int i = 0; i < *n_out; i++) out[i] = (int32_t)(sc_u01() * (V < 50 ? V : 50));
  p->n_bias = 0;
  for (int i = 0; i < 5 && i < V; i++) {
    int32_t id = i < 2 && *n_out ? out[i] : (int32_t)(sc_u01() * V);
    int dup = 0;
    for (int k = 0; k < p->n_bias; k++) dup |= p->bias_ids[k] == id;
    if (dup) continue;
    p->bias_ids[p->n_bias] = id;
    p->bias[p->n_bias++] = (float)(sc_u01() * 20 - 10);
  }
  *n_ban = 3;
  ban[0] = (int32_t)(sc_u01() * V);
  ban[1] = p->bias_ids[0];
  ban[2] = *n_out ? out[0] : 0;
  return 1;
}

/* Runs the cases at vocabulary size V (rows per op call: up to max_rows); big: fewer sets. */
static void sample_cases_run(backend *be, int V, int max_rows, int big, int *checked, int *bad) {
  static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 2.5f};
  const int top_ks[] = {0, 1, 2, 20, 1000, V - 1, V + 5};
  static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  static const float min_ps[] = {0.0f, 0.05f};
  int n_sets = 5 * 7 * 4 * 2;
  float *base = malloc((size_t)V * sizeof *base),
        *rows = malloc((size_t)max_rows * V * sizeof *rows);
  float *h = malloc((size_t)V * sizeof *h);
  size_t cap_words = (size_t)max_rows * (SAMPLE_RULE_WORDS + SC_EDITS * SAMPLE_RULE_EDIT_WORDS);
  int32_t *words = malloc(cap_words * sizeof *words);
  sample_rule_edit *ed = malloc((size_t)max_rows * SC_EDITS * sizeof *ed);
  int *ned = malloc((size_t)max_rows * sizeof *ned);
  int32_t *want = malloc((size_t)max_rows * sizeof *want),
          *got = malloc((size_t)max_rows * sizeof *got);
  backend_buf bx = be->alloc(be, BACKEND_KIND_F32, (size_t)max_rows * V);
  backend_buf bp = be->alloc(be, BACKEND_KIND_I32, cap_words);
  backend_buf bi = be->alloc(be, BACKEND_KIND_I32, (size_t)max_rows);
  sampler_scratch w;
  if (!base || !rows || !h || !words || !ed || !ned || !want || !got || !bx || !bp || !bi ||
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
      int32_t out[40], ban[3];
      int n_out, n_ban;
      sc_edits_case(set, V, &p, out, &n_out, ban, &n_ban);
      sampler sh, sd;
      sampler_init(&sh, &p, 0);
      sampler_init(&sd, &p, 0);
      sampler_result res;
      memcpy(h, base, (size_t)V * sizeof *h);
      for (int k = 0; k < n_ban; k++) h[ban[k]] = -INFINITY;
      want[n] = sampler_sample(&sh, h, V, NULL, 0, out, n_out, &w, &res);
      int off = 0;
      for (int r = 0; r < n; r++) off += ned[r];
      ned[n] = sampler_device_edits(&p, out, n_out, ban, n_ban, V, ed + off, SC_EDITS, &w);
      if (ned[n] < 0) {
        (*bad)++;
        fprintf(stderr, "  sample cases: more than %d edits\n", SC_EDITS);
        ned[n] = 0;
      }
      sampler_device_row(&sd, off, ned[n], words + (size_t)n * SAMPLE_RULE_WORDS);
      if (memcmp(sh.rng, sd.rng, sizeof sh.rng) != 0) {
        (*bad)++;
        fprintf(stderr, "  sample cases: the device row's draw left the RNG elsewhere\n");
      }
      memcpy(rows + (size_t)n * V, base, (size_t)V * sizeof *rows);
      n++;
      if (n == max_rows) {
        sc_flush(be, V, n, rows, words, sc_pack(words, n, ed, ned), want, got, bx, bp, bi, kind,
                 checked, bad);
        n = 0;
      }
    }
    if (n)
      sc_flush(be, V, n, rows, words, sc_pack(words, n, ed, ned), want, got, bx, bp, bi, kind,
               checked, bad);
  }
  be->free(be, bx);
  be->free(be, bp);
  be->free(be, bi);
  sampler_scratch_free(&w);
  free(base);
  free(rows);
  free(h);
  free(words);
  free(ed);
  free(ned);
  free(want);
  free(got);
}

#endif
