#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_init(strbuf *b) { memset(b, 0, sizeof *b); }

void strbuf_free(strbuf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static int strbuf_reserve(strbuf *b, size_t extra) {
  if (b->oom) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) {
    if (cap > ((size_t)-1) / 2) {
      b->oom = 1;
      return -1;
    }
    cap *= 2;
  }
  char *d = realloc(b->data, cap);
  if (!d) {
    b->oom = 1;
    return -1;
  }
  b->data = d;
  b->cap = cap;
  return 0;
}

int strbuf_append(strbuf *b, const void *p, size_t n) {
  if (strbuf_reserve(b, n)) return -1;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

int strbuf_puts(strbuf *b, const char *s) { return strbuf_append(b, s, strlen(s)); }

int strbuf_printf(strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return -1;
  if ((size_t)n < sizeof small) return strbuf_append(b, small, (size_t)n);
  if (strbuf_reserve(b, (size_t)n)) return -1;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

void strbuf_consume(strbuf *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = 0;
}

char *strbuf_take(strbuf *b) {
  if (b->oom) {
    strbuf_free(b);
    return NULL;
  }
  if (!b->data && strbuf_reserve(b, 0)) return NULL;
  char *d = b->data;
  memset(b, 0, sizeof *b);
  return d;
}
