/* stop_match against a naive reference (every position, every stop string, rescanned from the
 * last match-free end, as the server once did) over random texts, stop sets and chunkings; and
 * its work bound: automaton steps at most a small constant times the bytes fed, also for long
 * stop strings that almost match everywhere (where the rescan was quadratic). */
#include "test.h"

#include <stdint.h>

#include "server/stop_match.h"

/* The smallest p >= from at which some stop occurs in text[0, len) (ties: the first listed). */
static long naive_find(const char *text, size_t len, size_t from, char *const *stops, int n,
                       size_t *ml) {
  long best = -1;
  *ml = 0;
  for (size_t p = from; p < len && best < 0; p++)
    for (int i = 0; i < n; i++) {
      size_t sl = strlen(stops[i]);
      if (sl && p + sl <= len && !memcmp(text + p, stops[i], sl)) {
        best = (long)p;
        *ml = sl;
        break;
      }
    }
  return best;
}

/* The longest proper prefix of some stop that ends text[0, len). */
static size_t naive_holdback(const char *text, size_t len, char *const *stops, int n) {
  size_t best = 0;
  for (int i = 0; i < n; i++) {
    size_t sl = strlen(stops[i]);
    for (size_t k = sl ? sl - 1 : 0; k > best; k--)
      if (k <= len && !memcmp(text + len - k, stops[i], k)) {
        best = k;
        break;
      }
  }
  return best;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static unsigned rnd(unsigned n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (unsigned)(rng % n);
}

TEST(examples) {
  char *stops[] = {"END", "ab", "xyz"};
  size_t ml = 0;
  stop_match *m = stop_match_new(stops, 3);
  REQUIRE(m != NULL);
  EXPECT_EQ_INT(stop_match_feed(m, "hello E", 7, 0, &ml), -1);
  EXPECT_EQ_INT(stop_match_holdback(m), 1);
  EXPECT_EQ_INT(stop_match_feed(m, "N", 1, 7, &ml), -1);
  EXPECT_EQ_INT(stop_match_holdback(m), 2);
  EXPECT_EQ_INT(stop_match_feed(m, "Dab", 3, 8, &ml), 6);
  EXPECT_EQ_INT(ml, 3);
  stop_match_free(m);
  /* earliest start wins even when a later-listed stop string ends first */
  char *s2[] = {"bcdef", "cd"};
  m = stop_match_new(s2, 2);
  REQUIRE(m != NULL);
  EXPECT_EQ_INT(stop_match_feed(m, "abcdefg", 7, 0, &ml), 1);
  EXPECT_EQ_INT(ml, 5);
  stop_match_free(m);
  /* same start: the stop listed first */
  char *s3[] = {"abc", "ab"};
  m = stop_match_new(s3, 2);
  REQUIRE(m != NULL);
  EXPECT_EQ_INT(stop_match_feed(m, "xabc", 4, 0, &ml), 1);
  EXPECT_EQ_INT(ml, 3);
  stop_match_free(m);
  char *s4[] = {"", "q"};
  m = stop_match_new(s4, 2);
  REQUIRE(m != NULL);
  EXPECT_EQ_INT(stop_match_feed(m, "abc", 3, 0, &ml), -1);
  EXPECT_EQ_INT(stop_match_feed(m, "zq", 2, 3, &ml), 4);
  EXPECT_EQ_INT(ml, 1);
  stop_match_free(m);
}

/* Random texts over a small alphabet (so stops overlap and nest), random chunk sizes: every
 * feed's answer and every holdback agree with the naive scan of the whole text so far. */
TEST(matches_naive_reference) {
  char text[512], stopbuf[6][12];
  char *stops[6];
  int cases = 0, matched = 0;
  for (int iter = 0; iter < 20000; iter++) {
    int alpha = 2 + (int)rnd(3);
    int n = 1 + (int)rnd(6);
    for (int i = 0; i < n; i++) {
      int l = (int)rnd(9); /* 0: an empty stop string, which never matches */
      for (int k = 0; k < l; k++) stopbuf[i][k] = (char)('a' + rnd((unsigned)alpha));
      stopbuf[i][l] = 0;
      stops[i] = stopbuf[i];
    }
    size_t len = 1 + rnd(sizeof text);
    for (size_t k = 0; k < len; k++) text[k] = (char)('a' + rnd((unsigned)alpha));
    stop_match *m = stop_match_new(stops, n);
    REQUIRE(m != NULL);
    size_t fed = 0;
    while (fed < len) {
      size_t step = 1 + rnd(rnd(2) ? 4 : 40);
      if (step > len - fed) step = len - fed;
      size_t ml = 0, rml = 0;
      long p = stop_match_feed(m, text + fed, step, fed, &ml);
      /* everything ending at or before fed was checked already: no match can start earlier
       * than fed - (longest stop) + 1; the naive scan covers from 0 */
      long r = naive_find(text, fed + step, 0, stops, n, &rml);
      fed += step;
      cases++;
      EXPECT_MSG(p == r && (p < 0 || ml == rml), "iter %d: got %ld/%zu, want %ld/%zu", iter, p, ml,
                 r, rml);
      if (test_cur_failed) {
        stop_match_free(m);
        return;
      }
      if (p >= 0) {
        matched++;
        break;
      }
      EXPECT_EQ_INT(stop_match_holdback(m), naive_holdback(text, fed, stops, n));
    }
    stop_match_free(m);
  }
  EXPECT(matched > 1000 && cases > 20000);
}

/* A long text fed a few bytes at a time (as tokens arrive) with two long stop strings that
 * almost match at every position: the steps stay under 4 per byte. A rescan of the last
 * stop-length bytes per piece (the old way) takes about (stop length / piece) times more. */
TEST(work_is_linear) {
  size_t stop_len = 2000, len = 400000;
  char *a = malloc(stop_len + 1), *b = malloc(stop_len + 1), *text = malloc(len);
  REQUIRE(a && b && text);
  memset(a, 'x', stop_len);
  a[stop_len - 1] = 'y';
  a[stop_len] = 0;
  memset(b, 'x', stop_len);
  b[stop_len / 2] = 'z';
  b[stop_len] = 0;
  for (size_t i = 0; i < len; i++) text[i] = (i % 997 == 996) ? 'w' : 'x';
  char *stops[] = {a, b};
  stop_match *m = stop_match_new(stops, 2);
  REQUIRE(m != NULL);
  size_t fed = 0, ml;
  long p = -1;
  while (fed < len && p < 0) {
    size_t step = 3 + (fed % 5);
    if (step > len - fed) step = len - fed;
    p = stop_match_feed(m, text + fed, step, fed, &ml);
    fed += step;
  }
  EXPECT_EQ_INT(p, -1);
  unsigned long long steps = stop_match_steps(m);
  EXPECT_MSG(steps <= 4ULL * len, "%llu steps for %zu bytes", steps, len);
  stop_match_free(m);
  free(a);
  free(b);
  free(text);
}

int main(void) {
  RUN(examples);
  RUN(matches_naive_reference);
  RUN(work_is_linear);
  TEST_MAIN_END();
}
