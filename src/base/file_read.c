/* file_read — see file_read.h. */
#include "base/file_read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

char *file_read(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long sz = ftell(f);
    if (sz >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)sz + 1))) {
      if (fread(buf, 1, (size_t)sz, f) == (size_t)sz) {
        buf[sz] = 0;
        if (len) *len = (size_t)sz;
      } else {
        free(buf);
        buf = NULL;
        errno = EIO;
      }
    }
  }
  fclose(f);
  return buf;
}
