/* json_schema_util.h — helpers the schema tests (test_json_schema, test_json_schema_kw) share:
 * q() (schemas and texts written with ' for "), the brute-force reference of a schema mask
 * (every token tried on a copy of a fresh mask fed the text so far) and its comparison with
 * the mask, and the random walks' measure of how much is still open. */
#ifndef DS_TEST_JSON_SCHEMA_UTIL_H
#define DS_TEST_JSON_SCHEMA_UTIL_H
#include "json_vocab_util.h"
#include "sampler/json_mask.h"
#include "sampler/json_schema.h"

/* s with every ' turned into " (one of 8 rotating buffers) */
static const char *q(const char *s) {
  static char buf[8][8192];
  static int k;
  char *b = buf[k++ % 8];
  size_t n = strlen(s);
  if (n >= sizeof buf[0]) n = sizeof buf[0] - 1;
  for (size_t i = 0; i < n; i++) b[i] = s[i] == '\'' ? '"' : s[i];
  b[n] = 0;
  return b;
}

/* a fresh schema mask fed the text so far, and the copy a token is tried on */
typedef struct ref_masks {
  json_mask *base, *t;
} ref_masks;

static int try_schema(void *ctx, const char *b, size_t n) {
  ref_masks *r = ctx;
  json_mask_copy(r->t, r->base);
  return json_mask_feed(r->t, b, n) == 0;
}

/* allowed[i] for i < n_logits: a fresh schema mask fed the text so far as bytes, then each
 * token tried on a copy; returns 1 when the text is complete */
static int reference(const tvocab *tv, const json_vocab *v, const json_schema *sc, const char *text,
                     size_t len, int dead, int n_logits, unsigned char *allowed) {
  ref_masks r = {json_mask_new_schema(v, sc), json_mask_new_schema(v, sc)};
  int complete = -1;
  if (r.base && r.t) {
    int ok = json_mask_feed(r.base, text, len) == 0;
    complete = tv_reference(tv, try_schema, &r, ok, !dead && ok && json_mask_complete(r.base), dead,
                            n_logits, allowed);
  }
  json_mask_free(r.base);
  json_mask_free(r.t);
  return complete;
}

/* mask vs reference on every id, and prepare + apply vs apply alone (m is left prepared for
 * n_logits); returns the number of disagreements, the first in why (with the text's last 120
 * bytes) */
static int compare(const tvocab *tv, const json_vocab *v, const json_schema *sc, json_mask *m,
                   const char *text, size_t len, int n_logits, char *why, size_t whylen) {
  unsigned char *want = malloc((size_t)n_logits);
  int complete = want ? reference(tv, v, sc, text, len, json_mask_dead(m), n_logits, want) : 0;
  int bad = tv_compare(tv, m, want, complete, text, len, 120, 1, n_logits, why, whylen);
  free(want);
  return bad;
}

/* containers open in text (outside strings), plus one inside a string: the walks' measure of
 * how far from the end they are */
static int open_count(const char *t, size_t n) {
  int d = 0, in = 0, esc = 0;
  for (size_t i = 0; i < n; i++) {
    char c = t[i];
    if (in) {
      if (esc)
        esc = 0;
      else if (c == '\\')
        esc = 1;
      else if (c == '"')
        in = 0;
    } else if (c == '"') {
      in = 1;
    } else if (c == '{' || c == '[') {
      d++;
    } else if (c == '}' || c == ']') {
      d--;
    }
  }
  return 2 * d + in;
}

#endif
