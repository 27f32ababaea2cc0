/* deltaserve tokenize --tokenizer DIR: UTF-8 text on stdin -> ids,
 * space-separated, one line.
 * --bench N: encode the input N times and print the single-thread throughput
 * instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static char *read_all(FILE *f, size_t *n) {
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        return NULL;
      }
      buf = nb;
    }
    size_t r = fread(buf + len, 1, cap - len, f);
    len += r;
    if (r == 0) break;
  }
  *n = len;
  return buf;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cmd_tokenize(int argc, char **argv) {
  const char *dir = NULL;
  int bench = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--bench") && i + 1 < argc)
      bench = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: deltaserve tokenize --tokenizer DIR [--bench N] < text\n"
          "  prints the token ids of stdin, space-separated, on one line\n");
      return 0;
    } else {
      fprintf(stderr, "deltaserve tokenize: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!dir) {
    fprintf(stderr, "usage: deltaserve tokenize --tokenizer DIR < text\n");
    return 2;
  }
  char err[512];
  double t0 = now_s();
  tokenizer *t = tokenizer_load(dir, err, sizeof err);
  if (!t) {
    fprintf(stderr, "deltaserve tokenize: %s\n", err);
    return 1;
  }
  double t_load = now_s() - t0;
  size_t n = 0;
  char *text = read_all(stdin, &n);
  if (!text) {
    fprintf(stderr, "deltaserve tokenize: cannot read stdin\n");
    tokenizer_free(t);
    return 1;
  }
  int32_t *ids = NULL;
  int rc = 0;
  if (bench > 0) {
    long ntok = 0;
    double t1 = now_s();
    for (int r = 0; r < bench && ntok >= 0; r++) {
      int k = tokenizer_encode(t, text, n, &ids, err, sizeof err);
      free(ids);
      ids = NULL;
      ntok = k;
    }
    double dt = now_s() - t1;
    if (ntok < 0) {
      fprintf(stderr, "deltaserve tokenize: %s\n", err);
      rc = 1;
    } else {
      printf(
          "load %.3f s; %zu bytes -> %ld tokens; %d runs in %.3f s: %.2f "
          "MB/s\n",
          t_load, n, ntok, bench, dt, (double)n * bench / dt / 1e6);
    }
  } else {
    int k = tokenizer_encode(t, text, n, &ids, err, sizeof err);
    if (k < 0) {
      fprintf(stderr, "deltaserve tokenize: %s\n", err);
      rc = 1;
    } else {
      for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
      printf("\n");
    }
    free(ids);
  }
  free(text);
  tokenizer_free(t);
  return rc;
}
