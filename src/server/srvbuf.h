/* srvbuf — a growable byte buffer for building HTTP bodies and SSE chunks.
 * Out of memory is sticky: after a failed append `oom` is set and later appends do nothing,
 * so builders append freely and check once at the end. Owner: whoever called srvbuf_init. */
#ifndef DS_SRVBUF_H
#define DS_SRVBUF_H
#include <stddef.h>

typedef struct srvbuf {
  char *data; /* NUL-terminated when data != NULL */
  size_t len, cap;
  int oom;
} srvbuf;

void srvbuf_init(srvbuf *b);
void srvbuf_free(srvbuf *b);
/* Appends n bytes. Returns 0, or -1 (and sets oom) when memory runs out. */
int srvbuf_append(srvbuf *b, const void *p, size_t n);
int srvbuf_puts(srvbuf *b, const char *s);
int srvbuf_printf(srvbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Removes the first n bytes (n <= len). */
void srvbuf_consume(srvbuf *b, size_t n);
/* Hands the data to the caller (malloc'd, NUL-terminated, never NULL unless oom) and resets. */
char *srvbuf_take(srvbuf *b);

#endif
