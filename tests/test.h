/* tests/test.h — the smallest test harness that can fail.
 *
 * Each test binary defines tests with TEST(name) { ... } and runs them from main() with
 * RUN(name). EXPECT records a failure and continues; REQUIRE stops the current test.
 * Every test prints one line, "PASS name" or "FAIL name: why"; tests/run.sh counts them.
 * TEST_MAIN_END returns non-zero if anything failed. DS_TEST_ONLY=a,b runs only those tests. */
#ifndef DS_TEST_H
#define DS_TEST_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failed_total, test_cur_failed;
static char test_why[512];

/* DS_TEST_ONLY=a,b,c runs only the tests of those names (for sanitizer runs of a few kernels) */
static int test_selected(const char *name) {
  const char *only = getenv("DS_TEST_ONLY");
  if (!only || !*only) return 1;
  size_t n = strlen(name);
  for (const char *p = only; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && !strncmp(p, name, n)) return 1;
    p += len + (e ? 1 : 0);
  }
  return 0;
}

#define TEST(name) static void test_##name(void)
#define RUN(name)                               \
  do {                                          \
    if (!test_selected(#name)) break;           \
    test_cur_failed = 0;                        \
    test_why[0] = 0;                            \
    test_##name();                              \
    if (test_cur_failed) {                      \
      test_failed_total++;                      \
      printf("FAIL %s: %s\n", #name, test_why); \
    } else {                                    \
      printf("PASS %s\n", #name);               \
    }                                           \
    fflush(stdout);                             \
  } while (0)

#define EXPECT_MSG(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      if (!test_cur_failed) {                                                        \
        int _n = snprintf(test_why, sizeof test_why, "%s:%d: ", __FILE__, __LINE__); \
        snprintf(test_why + _n, sizeof test_why - (size_t)_n, __VA_ARGS__);          \
      }                                                                              \
      test_cur_failed = 1;                                                           \
    }                                                                                \
  } while (0)
#define EXPECT(cond) EXPECT_MSG(cond, "expected %s", #cond)
#define REQUIRE(cond)            \
  do {                           \
    EXPECT(cond);                \
    if (test_cur_failed) return; \
  } while (0)
#define EXPECT_EQ_INT(a, b)                                                                     \
  EXPECT_MSG((long long)(a) == (long long)(b), "%s == %lld, expected %lld", #a, (long long)(a), \
             (long long)(b))
#define EXPECT_STR(a, b) \
  EXPECT_MSG(strcmp((a), (b)) == 0, "%s == \"%s\", expected \"%s\"", #a, (a), (b))
#define TEST_MAIN_END() return test_failed_total ? 1 : 0

#endif
