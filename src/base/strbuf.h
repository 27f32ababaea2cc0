/* strbuf — a growable byte buffer (HTTP bodies, SSE chunks, rendered chat prompts).
 * Out of memory is sticky: after a failed append `oom` is set and later appends do nothing,
 * so builders append freely and check once at the end. Owner: whoever called strbuf_init. */
#ifndef DS_STRBUF_H
#define DS_STRBUF_H
#include <stddef.h>

typedef struct strbuf {
  char *data; /* NUL-terminated when data != NULL */
  size_t len, cap;
  int oom;
} strbuf;

void strbuf_init(strbuf *b);
void strbuf_free(strbuf *b);
/* Appends n bytes. Returns 0, or -1 (and sets oom) when memory runs out. */
int strbuf_append(strbuf *b, const void *p, size_t n);
int strbuf_puts(strbuf *b, const char *s);
int strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Removes the first n bytes (n <= len). */
void strbuf_consume(strbuf *b, size_t n);
/* Hands the data to the caller (malloc'd, NUL-terminated, never NULL unless oom) and resets. */
char *strbuf_take(strbuf *b);

#endif
