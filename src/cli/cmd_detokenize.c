/* deltaserve detokenize --tokenizer DIR: ids on stdin (whitespace or comma
 * separated) -> the decoded text on stdout, exactly (no newline added).
 * --skip-special drops special tokens. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

int cmd_detokenize(int argc, char **argv) {
  const char *dir = NULL;
  int skip = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--skip-special"))
      skip = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: deltaserve detokenize --tokenizer DIR [--skip-special] < "
          "ids\n"
          "  prints the text of the ids on stdin (whitespace or comma "
          "separated)\n");
      return 0;
    } else {
      fprintf(stderr, "deltaserve detokenize: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!dir) {
    fprintf(stderr, "usage: deltaserve detokenize --tokenizer DIR < ids\n");
    return 2;
  }
  size_t n = 0, cap = 1024;
  int32_t *ids = malloc(cap * sizeof *ids);
  char word[64];
  size_t wl = 0;
  int c, rc = 0;
  if (!ids) {
    fprintf(stderr, "deltaserve detokenize: out of memory\n");
    return 1;
  }
  for (;;) {
    c = getchar();
    if (c == EOF || isspace(c) || c == ',') {
      if (wl) {
        word[wl] = 0;
        char *end;
        errno = 0;
        long v = strtol(word, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX) {
          fprintf(stderr, "deltaserve detokenize: '%s' is not a token id\n", word);
          free(ids);
          return 1;
        }
        if (n == cap) {
          int32_t *ni = realloc(ids, (cap *= 2) * sizeof *ids);
          if (!ni) {
            fprintf(stderr, "deltaserve detokenize: out of memory\n");
            free(ids);
            return 1;
          }
          ids = ni;
        }
        ids[n++] = (int32_t)v;
        wl = 0;
      }
      if (c == EOF) break;
    } else if (wl + 1 < sizeof word) {
      word[wl++] = (char)c;
    } else {
      fprintf(stderr, "deltaserve detokenize: a token id is too long\n");
      free(ids);
      return 1;
    }
  }
  char err[512];
  tokenizer *t = tokenizer_load(dir, err, sizeof err);
  if (!t) {
    fprintf(stderr, "deltaserve detokenize: %s\n", err);
    free(ids);
    return 1;
  }
  char *out = NULL;
  long len = tokenizer_decode(t, ids, (int)n, skip, &out);
  if (len < 0) {
    fprintf(stderr,
            "deltaserve detokenize: a token id is out of range (vocabulary has "
            "%d ids)\n",
            tokenizer_vocab_size(t));
    rc = 1;
  } else {
    fwrite(out, 1, (size_t)len, stdout);
  }
  free(out);
  free(ids);
  tokenizer_free(t);
  return rc;
}
