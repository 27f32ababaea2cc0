/* fuzz_common — what the libFuzzer targets in tests/fuzz/ share with their regression replay.
 *
 * Each target file tests/fuzz/fuzz_<target>.c defines one entry point
 *     static int fuzz_<target>_one(const uint8_t *data, size_t size);
 * that runs one input through the module under test and checks the module's contract with
 * FUZZ_CHECK. Built as a fuzzer (scripts/fuzz.sh), the file also defines
 * LLVMFuzzerTestOneInput, and a broken contract aborts so libFuzzer saves the input.
 * Built with FUZZ_REGRESSION defined (tests/test_fuzz_regressions.c includes the target
 * files), a broken contract records a message in fuzz_why and the entry returns 1, so the
 * replay reports a FAIL line instead of dying; memory errors still crash the replay, which
 * tests/run.sh counts as a failure.
 *
 * Fixture paths are relative to the repository root (both the fuzzers and tests/run.sh run
 * there); DS_REPO_ROOT overrides it. */
#ifndef DS_FUZZ_COMMON_H
#define DS_FUZZ_COMMON_H
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((unused)) static char fuzz_why[512];

#ifdef FUZZ_REGRESSION
#define FUZZ_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      int _n = snprintf(fuzz_why, sizeof fuzz_why, "%s:%d: ", __FILE__, __LINE__); \
      snprintf(fuzz_why + _n, sizeof fuzz_why - (size_t)_n, __VA_ARGS__);          \
      return 1;                                                                    \
    }                                                                              \
  } while (0)
#else
#define FUZZ_CHECK(cond, ...)                                              \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FUZZ_CHECK failed at %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fputc('\n', stderr);                                                 \
      abort();                                                             \
    }                                                                      \
  } while (0)
#endif

/* Strict mode (FUZZ_STRICT) adds contract checks whose known violations are not memory or UB
 * bugs: error messages must be one line (file-controlled text is echoed into err), and
 * chat_parse must succeed on invalid UTF-8 too (the server only ever passes valid text).
 * It is on in the regression replay and with FUZZ_STRICT=1 scripts/fuzz.sh, off in the CI
 * fuzz runs so that such a finding does not stop every run at its first input: those
 * findings live in tests/fuzz/regressions/. */
#if defined(FUZZ_REGRESSION) && !defined(FUZZ_STRICT)
#define FUZZ_STRICT 1
#endif
#ifdef FUZZ_STRICT
#define FUZZ_CHECK_MSG(err, what)                                                              \
  FUZZ_CHECK((err)[0] && !strchr((err), '\n'), "%s failed without a one-line message: \"%s\"", \
             what, err)
#else
#define FUZZ_CHECK_MSG(err, what) FUZZ_CHECK((err)[0], "%s failed without a message", what)
#endif

/* Exits the process on a failure of the harness itself (missing fixture): not a finding. */
__attribute__((unused)) static void fuzz_die(const char *fmt, ...)
    __attribute__((noreturn, unused, format(printf, 1, 2)));
__attribute__((unused)) static void fuzz_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz harness: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* repo-relative path -> buf */
__attribute__((unused)) static const char *fuzz_path(char *buf, size_t n, const char *rel) {
  const char *root = getenv("DS_REPO_ROOT");
  snprintf(buf, n, "%s/%s", root && *root ? root : ".", rel);
  return buf;
}

/* Writes exactly size bytes to path (truncating). Returns 0 or -1. */
__attribute__((unused)) static int fuzz_write_file(const char *path, const void *data,
                                                   size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  const char *p = data;
  while (size > 0) {
    ssize_t k = write(fd, p, size);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      close(fd);
      return -1;
    }
    p += k;
    size -= (size_t)k;
  }
  return close(fd);
}

/* Reads a whole file (malloc'd, NUL-terminated); NULL when unreadable. */
__attribute__((unused)) static char *fuzz_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap + 1);
  size_t k;
  while (b && (k = fread(b + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      char *nb = realloc(b, cap * 2 + 1);
      if (!nb) {
        free(b);
        b = NULL;
        break;
      }
      b = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (!b) return NULL;
  b[n] = 0;
  if (len) *len = n;
  return b;
}

/* A fresh private folder (under $DS_FUZZ_TMP, else /dev/shm when there is one: the loader
 * target writes a file per input); removed with its files at exit by fuzz_tmp_cleanup. A
 * crashing fuzzer skips atexit, so scripts/fuzz.sh points DS_FUZZ_TMP into its own work
 * folder and removes that. */
static char fuzz_tmp_root[PATH_MAX];
__attribute__((unused)) static void fuzz_tmp_cleanup(void) {
  if (!fuzz_tmp_root[0]) return;
  char cmd[PATH_MAX + 32];
  /* only ever our own mkdtemp folder */
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_tmp_root);
  if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fuzz_tmp_root);
  fuzz_tmp_root[0] = 0;
}
__attribute__((unused)) static const char *fuzz_tmp_dir(void) {
  if (fuzz_tmp_root[0]) return fuzz_tmp_root;
  struct stat sb;
  const char *base = getenv("DS_FUZZ_TMP");
  if (!base || !*base)
    base = (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0)
               ? "/dev/shm"
               : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  snprintf(fuzz_tmp_root, sizeof fuzz_tmp_root, "%s/ds-fuzz-XXXXXX", base);
  if (!mkdtemp(fuzz_tmp_root)) fuzz_die("mkdtemp %s: %s", fuzz_tmp_root, strerror(errno));
  atexit(fuzz_tmp_cleanup);
  return fuzz_tmp_root;
}

/* Strict UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
__attribute__((unused)) static int fuzz_utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0)
      k = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      k = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      k = 3, cp = c & 0x07, min = 0x10000;
    else
      return 0;
    if (i + k >= n) return 0; /* sequence cut by the end */
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += k + 1;
  }
  return 1;
}

#endif
