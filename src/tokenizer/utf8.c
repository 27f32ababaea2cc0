#include "tokenizer/utf8.h"

#include <stdlib.h>
#include <string.h>

int utf8_step(const uint8_t *p, size_t n, size_t *len, uint32_t *cp) {
  uint8_t b = p[0];
  if (b < 0x80) {
    *len = 1;
    if (cp) *cp = b;
    return UTF8_STEP_VALID;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF; /* range allowed for the second byte */
  uint32_t c;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
    c = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    c = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    c = b & 0x07;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return UTF8_STEP_INVALID;
  }
  for (size_t i = 1; i < need; i++) {
    if (i >= n) {
      *len = n;
      return UTF8_STEP_INCOMPLETE;
    }
    uint8_t x = p[i];
    uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (x < l || x > h) {
      *len = i;
      return UTF8_STEP_INVALID;
    }
    c = (c << 6) | (x & 0x3F);
  }
  *len = need;
  if (cp) *cp = c;
  return UTF8_STEP_VALID;
}

size_t utf8_valid_prefix(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    size_t len;
    if (utf8_step(s + i, n - i, &len, NULL) != UTF8_STEP_VALID) return i;
    i += len;
  }
  return n;
}

static int grow(char **buf, size_t *bcap, size_t need) {
  if (need <= *bcap) return 0;
  size_t cap = *bcap ? *bcap : 64;
  while (cap < need) cap *= 2;
  char *nb = realloc(*buf, cap);
  if (!nb) return -1;
  *buf = nb;
  *bcap = cap;
  return 0;
}

long utf8_lossy_append(const uint8_t *s, size_t n, int hold_incomplete, char **buf, size_t *blen,
                       size_t *bcap) {
  /* worst case: every byte becomes 3 bytes of U+FFFD; +1 for a terminating NUL
   */
  if (grow(buf, bcap, *blen + 3 * n + 1)) return -1;
  char *o = *buf + *blen;
  size_t i = 0;
  while (i < n) {
    size_t run = i;
    while (run < n && s[run] < 0x80) run++;
    if (run > i) {
      memcpy(o, s + i, run - i);
      o += run - i;
      i = run;
      if (i >= n) break;
    }
    size_t len;
    int k = utf8_step(s + i, n - i, &len, NULL);
    if (k == UTF8_STEP_VALID) {
      memcpy(o, s + i, len);
      o += len;
    } else if (k == UTF8_STEP_INCOMPLETE && hold_incomplete) {
      break;
    } else {
      memcpy(o, "\xEF\xBF\xBD", 3);
      o += 3;
    }
    i += len;
  }
  *blen = (size_t)(o - *buf);
  (*buf)[*blen] = 0;
  return (long)i;
}
