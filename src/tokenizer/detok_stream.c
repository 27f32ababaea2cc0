/* detok_stream — the incremental detokenizer; see detok_stream.h. */
#include "tokenizer/detok_stream.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/utf8.h"

struct detok_stream {
  const tokenizer *t;
  int skip_special;
  uint8_t pend[64];
  size_t npend;
};

detok_stream *detok_stream_new(const tokenizer *t, int skip_special) {
  detok_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->t = t;
  s->skip_special = skip_special;
  return s;
}

/* Converts pend + (b, n) and keeps the unfinished tail when hold. */
static long emit(detok_stream *s, const uint8_t *b, size_t n, int hold, char **out) {
  *out = NULL;
  size_t tot = s->npend + n;
  uint8_t small[256];
  uint8_t *buf = tot <= sizeof small ? small : malloc(tot);
  if (!buf) return -1;
  memcpy(buf, s->pend, s->npend);
  if (n) memcpy(buf + s->npend, b, n);
  char *o = NULL;
  size_t olen = 0, ocap = 0;
  long used = utf8_lossy_append(buf, tot, hold, &o, &olen, &ocap);
  if (used < 0) {
    if (buf != small) free(buf);
    return -1;
  }
  size_t rest = tot - (size_t)used; /* < 4: an unfinished sequence */
  memmove(s->pend, buf + used, rest);
  s->npend = rest;
  if (buf != small) free(buf);
  *out = o;
  return (long)olen;
}

long detok_stream_push(detok_stream *s, int32_t id, char **out) {
  const char *b;
  size_t n;
  *out = NULL;
  if (tokenizer_token_bytes(s->t, id, &b, &n)) return -1;
  if (s->skip_special && tokenizer_is_special(s->t, id)) n = 0;
  return emit(s, (const uint8_t *)b, n, 1, out);
}

long detok_stream_flush(detok_stream *s, char **out) { return emit(s, NULL, 0, 0, out); }

void detok_stream_free(detok_stream *s) { free(s); }
