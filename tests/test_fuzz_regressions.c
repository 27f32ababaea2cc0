/* test_fuzz_regressions — replays, without libFuzzer, every input the fuzzers of tests/fuzz/
 * care about through the same entry points (the target files are included here with
 * FUZZ_REGRESSION, which turns their contract checks into FAIL lines and switches on the
 * strict checks):
 *   - seeds_<target>: every committed seed of tests/fuzz/corpus/<target>/;
 *   - regression_<file>: every tests/fuzz/regressions/<target>-<n>.bin, the inputs with which
 *     a fuzzer found a bug (they fail until the owner fixes it, then guard the fix);
 *   - a few exact expectations for those bugs that a plain (non-sanitizer) build cannot see
 *     through the entry point alone (undefined behaviour that happens to give a number).
 * Each replay runs in a forked child, so a crash (or an ASan/UBSan report in
 * `make test-asan`) becomes the FAIL line of that input and the others still run. */
#define FUZZ_REGRESSION 1
#include "fuzz/fuzz_chat.c"
#include "fuzz/fuzz_jinja.c"
#include "fuzz/fuzz_loader.c"
#include "fuzz/fuzz_openai_request.c"
#include "fuzz/fuzz_tokenizer.c"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include "test.h"

typedef int (*fuzz_entry_fn)(const uint8_t *data, size_t size);

static const struct {
  const char *name;
  fuzz_entry_fn fn;
} targets[] = {
    // clang-format off
    {"loader", fuzz_loader_one},
    {"tokenizer", fuzz_tokenizer_one},
    {"chat", fuzz_chat_one},
    {"openai_request", fuzz_openai_request_one},
    {"jinja", fuzz_jinja_one},
    // clang-format on
};
#define N_TARGETS (int)(sizeof targets / sizeof targets[0])

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted regular-file names of dir (malloc'd); *n = count (0 when dir is missing). */
static char **list_dir(const char *dir, int *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char **v = NULL;
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nv = realloc(v, sizeof *v * (size_t)cap);
      if (!nv) break;
      v = nv;
    }
    v[(*n)++] = strdup(e->d_name);
  }
  closedir(d);
  if (*n) qsort(v, (size_t)*n, sizeof *v, cmp_str);
  return v;
}

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* Runs fn on each file of paths[0..n) in one forked child. Returns 0 when all passed, else
 * fills why (which file, and the contract message or the signal). */
static int replay_forked(fuzz_entry_fn fn, char **paths, int n, char *why, size_t whylen) {
  int fd[2];
  if (pipe(fd)) {
    snprintf(why, whylen, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, whylen, "fork: %s", strerror(errno));
    close(fd[0]);
    close(fd[1]);
    return -1;
  }
  if (pid == 0) {
    close(fd[0]);
    fuzz_tmp_root[0] = 0; /* the child makes (and removes) its own temp folder */
    for (int i = 0; i < n; i++) {
      /* tell the parent which input runs, in case it crashes */
      char line[PATH_MAX + 8];
      int k = snprintf(line, sizeof line, "@%s\n", paths[i]);
      if (write(fd[1], line, (size_t)k) < 0) _exit(3);
      size_t len = 0;
      char *data = fuzz_read_file(paths[i], &len);
      if (!data) {
        k = snprintf(line, sizeof line, "!cannot read %s\n", paths[i]);
        if (write(fd[1], line, (size_t)k) < 0) _exit(3);
        exit(1);
      }
      int r = fn((const uint8_t *)data, len);
      free(data);
      if (r) {
        char msg[700];
        k = snprintf(msg, sizeof msg, "!%s\n", fuzz_why);
        if (write(fd[1], msg, (size_t)k) < 0) _exit(3);
        exit(1);
      }
    }
    exit(0); /* exit, not _exit: LeakSanitizer checks the child at exit */
  }
  close(fd[1]);
  char buf[8192];
  size_t got = 0;
  ssize_t k;
  while ((k = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) {
    got += (size_t)k;
    if (got > sizeof buf / 2) { /* keep the tail */
      memmove(buf, buf + got - sizeof buf / 4, sizeof buf / 4);
      got = sizeof buf / 4;
    }
  }
  buf[got] = 0;
  close(fd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  /* the last "@file" line names the input; a "!msg" line says why */
  char *last = NULL, *msg = NULL;
  for (char *p = strtok(buf, "\n"); p; p = strtok(NULL, "\n")) {
    if (p[0] == '@')
      last = p + 1;
    else if (p[0] == '!')
      msg = p + 1;
  }
  if (msg)
    snprintf(why, whylen, "%s: %s", last ? last : "?", msg);
  else if (WIFSIGNALED(st))
    snprintf(why, whylen, "%s: crashed with signal %d (%s)", last ? last : "?", WTERMSIG(st),
             strsignal(WTERMSIG(st)));
  else
    snprintf(why, whylen, "%s: exited with status %d (sanitizer report above)", last ? last : "?",
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 1;
}

static void replay_seeds(int t) {
  char dir[PATH_MAX], why[1024];
  char rel[128];
  snprintf(rel, sizeof rel, "tests/fuzz/corpus/%s", targets[t].name);
  fuzz_path(dir, sizeof dir, rel);
  int n = 0;
  char **names = list_dir(dir, &n);
  char **paths = calloc((size_t)(n ? n : 1), sizeof *paths);
  for (int i = 0; i < n; i++) {
    paths[i] = malloc(strlen(dir) + strlen(names[i]) + 2);
    sprintf(paths[i], "%s/%s", dir, names[i]);
  }
  test_cur_failed = 0;
  test_why[0] = 0;
  if (n == 0) {
    EXPECT_MSG(0, "no seeds in %.300s", dir);
  } else if (replay_forked(targets[t].fn, paths, n, why, sizeof why)) {
    EXPECT_MSG(0, "%.400s", why);
  }
  if (test_cur_failed) {
    test_failed_total++;
    printf("FAIL seeds_%s: %s\n", targets[t].name, test_why);
  } else {
    printf("PASS seeds_%s (%d inputs)\n", targets[t].name, n);
  }
  fflush(stdout);
  free_list(paths, n);
  free_list(names, n);
}

static void replay_regressions(void) {
  char dir[PATH_MAX], why[1024];
  fuzz_path(dir, sizeof dir, "tests/fuzz/regressions");
  int n = 0;
  char **names = list_dir(dir, &n);
  for (int i = 0; i < n; i++) {
    const char *dash = strrchr(names[i], '-');
    int t = -1;
    for (int k = 0; dash && k < N_TARGETS; k++)
      if (strlen(targets[k].name) == (size_t)(dash - names[i]) &&
          !strncmp(names[i], targets[k].name, (size_t)(dash - names[i])))
        t = k;
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    char *one[1] = {path};
    test_cur_failed = 0;
    test_why[0] = 0;
    if (t < 0)
      EXPECT_MSG(0, "%.200s does not name a target (<target>-<n>.bin)", names[i]);
    else if (replay_forked(targets[t].fn, one, 1, why, sizeof why))
      EXPECT_MSG(0, "%.400s", why);
    if (test_cur_failed) {
      test_failed_total++;
      printf("FAIL regression_%s: %s\n", names[i], test_why);
    } else {
      printf("PASS regression_%s\n", names[i]);
    }
    fflush(stdout);
  }
  free_list(names, n);
}

/* Writes the fixture config with one key replaced into a temp folder; returns config_load. */
static int load_config_with(const char *key, const char *value_json, char *err, size_t errlen) {
  char src[PATH_MAX], path[PATH_MAX + 32];
  fuzz_path(src, sizeof src, "tests/fixtures/models/dense_bf16/config.json");
  json_error_t je;
  json_t *c = json_load_file(src, 0, &je);
  json_t *v = json_loads(value_json, JSON_DECODE_ANY, &je);
  if (!c || !v) {
    json_decref(c);
    json_decref(v);
    snprintf(err, errlen, "fixture: %s", je.text);
    return 99;
  }
  json_object_set_new(c, key, v);
  snprintf(path, sizeof path, "%s/cfg-%s.json", fuzz_tmp_dir(), key);
  json_dump_file(c, path, 0);
  json_decref(c);
  model_config cfg;
  return config_load(path, &cfg, err, errlen);
}

/* loader-2.bin: an integer key given as a real far outside int (1e300) is cast to int before
 * the range check (undefined behaviour); it must be refused. */
TEST(config_rejects_huge_real_int) {
  char err[512] = "";
  EXPECT_EQ_INT(load_config_with("hidden_size", "1e300", err, sizeof err), -1);
  EXPECT_EQ_INT(load_config_with("vocab_size", "-3e10", err, sizeof err), -1);
}

/* loader-3.bin: conv_dim = 2*nk*dk + nv*dv overflows int for large head sizes; such a
 * config must be refused (bad sizes), not wrap. */
TEST(config_rejects_conv_dim_overflow) {
  char err[512] = "";
  EXPECT_EQ_INT(load_config_with("linear_key_head_dim", "1073741824", err, sizeof err), -1);
  EXPECT_EQ_INT(load_config_with("linear_value_head_dim", "2147483647", err, sizeof err), -1);
}

int main(void) {
  /* children make their temp folders inside ours, so one rm at the end removes what a
   * crashed child left */
  setenv("DS_FUZZ_TMP", fuzz_tmp_dir(), 1);
  for (int t = 0; t < N_TARGETS; t++) replay_seeds(t);
  replay_regressions();
  RUN(config_rejects_huge_real_int);
  RUN(config_rejects_conv_dim_overflow);
  fuzz_tmp_cleanup();
  TEST_MAIN_END();
}
