#include "server/srvbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srvbuf_init(srvbuf *b) { memset(b, 0, sizeof *b); }

void srvbuf_free(srvbuf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static int srvbuf_reserve(srvbuf *b, size_t extra) {
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

int srvbuf_append(srvbuf *b, const void *p, size_t n) {
  if (srvbuf_reserve(b, n)) return -1;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

int srvbuf_puts(srvbuf *b, const char *s) { return srvbuf_append(b, s, strlen(s)); }

int srvbuf_printf(srvbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return -1;
  if ((size_t)n < sizeof small) return srvbuf_append(b, small, (size_t)n);
  if (srvbuf_reserve(b, (size_t)n)) return -1;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

void srvbuf_consume(srvbuf *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = 0;
}

char *srvbuf_take(srvbuf *b) {
  if (b->oom) {
    srvbuf_free(b);
    return NULL;
  }
  if (!b->data && srvbuf_reserve(b, 0)) return NULL;
  char *d = b->data;
  memset(b, 0, sizeof *b);
  return d;
}
