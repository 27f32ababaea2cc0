/* test_json_mask — response_format json_object: the byte-level recognizer against tables of
 * valid objects (each proper prefix valid and incomplete) and invalid texts (each rejected at
 * the expected byte), the same texts split into pieces, the token mask against a brute-force
 * reference (every token tried by feeding a fresh recognizer the prefix and the token) on a
 * small hand-made vocabulary, random walks over a random vocabulary, and the real Qwen3
 * vocabulary when node_modules has it (checks, and the times of json_mask_apply, of
 * json_mask_prepare and of an apply after it, printed). Wherever the mask is compared with the
 * reference, json_mask_prepare + apply is compared with apply alone too (the same logits). The
 * helpers shared with test_json_schema (test vocabularies, the reference's rules, the real
 * vocabulary) are in json_vocab_util.h. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_vocab_util.h"
#include "sampler/json_mask.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- the recognizer --------------------------------------------------------------------- */

/* complete objects */
static const char *const valid_texts[] = {
    "{}",
    " {}",
    "\n\t\r {\"a\":1}",
    "{\"a\":1}",
    "{\"\":\"\"}",
    "{ \"a\" : [ 1 , -2.5e+10 , 0 , 0.0 , 1E5 , -0e-0 , 3.14 , 10 , -7 ] }",
    "{\"a\":1e5,\"b\":-0,\"c\":10.25E-3,\"d\":0E+0,\"e\":123456789}",
    "{\"k\":\"v\",\"n\":null,\"t\":true,\"f\":false}",
    "{\"esc\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00 \\uAbCd\"}",
    ("{\"uni\":\"\xc3\xa9 \xc3\xbc \xe2\x82\xac \xf0\x9d\x84\x9e \xf4\x8f\xbf\xbf \xed\x9f\xbf "
     "\xee\x80\x80 \xe0\xa0\x80 \xf0\x90\x80\x80 \xc2\x80 \x7f\"}"),
    "{\"\xe6\x97\xa5\xe6\x9c\xac\":\"\xe8\xaa\x9e\"}",
    "{\"a\":{\"b\":{\"c\":[[],{},[{}]]}}}",
    "{\"a\":[1,[2,[3]],{\"b\":[true,false,null]}],\"c\":[\"x\",-1]}",
    "{\"a\":[]}",
    "{\"a\":{}}",
    "{\"a\":0,\"b\":[0],\"c\":{\"d\":0}}",
    "{\"a\" :\n\t[ null ,true ] , \"b\": \"}\" }",
    "                {}",                             /* 16 spaces before */
    "{                }",                             /* 16 inside */
    "{\"a\":1                ,\"b\":2}",              /* 16 after a number */
    "{\"s\":\"                                  \"}", /* spaces in strings are not counted */
};

/* texts with the index of the byte that breaks them (every shorter prefix is valid) */
typedef struct bad_text {
  const char *s;
  int bad;
} bad_text;

static const bad_text invalid_texts[] = {
    {"{\"a\":1,}", 7},   /* trailing comma */
    {"{\"a\":[1,]}", 8}, /* trailing comma in an array */
    {"{,}", 1},
    {"{a:1}", 1},      /* unquoted key */
    {"{1:1}", 1},      /* non-string key */
    {"{\"a\":01}", 6}, /* leading zero */
    {"{\"a\":-01}", 7},
    {"{\"a\":1.}", 7}, /* "1." then '}' */
    {"{\"a\":1.e5}", 7},
    {"{\"a\":.5}", 5},
    {"{\"a\":+1}", 5},
    {"{\"a\":-}", 6},
    {"{\"a\":- 1}", 6},
    {"{\"a\":1e}", 7},
    {"{\"a\":1e+}", 8},
    {"{\"a\":1E-,}", 8},
    {"{\"a\":1 2}", 7},
    {"{\"a\":1 .5}", 7},
    {"{\"a\":1x}", 6},
    {"{\"a\":tru}", 8}, /* a literal cut short */
    {"{\"a\":nul}", 8},
    {"{\"a\":True}", 5},
    {"{\"a\":truex}", 9},
    {"{\"a\":falsee}", 10},
    {"{\"a\" 1}", 5}, /* no colon */
    {"{\"a\"::1}", 5},
    {"{\"a\":}", 5},
    {"{\"a\":1\"b\":2}", 6}, /* no comma */
    {"{\"a\":[1}", 7},       /* mismatched closers */
    {"{\"a\":{]}", 6},
    {"{\"a\":[1]]}", 8},
    {"[1]", 0}, /* top level not an object */
    {"\"a\"", 0},
    {"1", 0},
    {"true", 0},
    {" [", 1},
    {"}", 0},
    {"{} ", 2}, /* anything after the closing brace */
    {"{}\n", 2},
    {"{}x", 2},
    {"{}{}", 2},
    {"{}}", 2},
    {"{\"a\":\"x\x01\"}", 7}, /* control bytes in a string */
    {"{\"a\":\"x\ny\"}", 7},
    {"{\"a\":\"\t\"}", 6},
    {"{\"a\n\":1}", 3},
    {"{\"a\":\"\\q\"}", 7}, /* bad escapes */
    {"{\"a\":\"\\'\"}", 7},
    {"{\"a\":\"\\U0041\"}", 7},
    {"{\"a\":\"\\u12G4\"}", 10},
    {"{\"a\":\"\\u12\"}", 10},
    {"{\"a\":\"\xc0\x80\"}", 6}, /* bad UTF-8: overlong two-byte */
    {"{\"a\":\"\xc1\xbf\"}", 6},
    {"{\"a\":\"\xe0\x80\x80\"}", 7}, /* overlong three-byte */
    {"{\"a\":\"\xe0\x9f\xbf\"}", 7},
    {"{\"a\":\"\xed\xa0\x80\"}", 7}, /* surrogate */
    {"{\"a\":\"\xed\xbf\xbf\"}", 7},
    {"{\"a\":\"\xf0\x80\x80\x80\"}", 7}, /* overlong four-byte */
    {"{\"a\":\"\xf0\x8f\xbf\xbf\"}", 7},
    {"{\"a\":\"\xf4\x90\x80\x80\"}", 7}, /* above U+10FFFF */
    {"{\"a\":\"\xf5\x80\x80\x80\"}", 6},
    {"{\"a\":\"\xff\"}", 6},
    {"{\"a\":\"\x80\"}", 6}, /* lone continuation */
    {"{\"a\":\"\xc3\xa9\xa9\"}", 8},
    {"{\"a\":\"\xc3\"}", 7}, /* sequence cut short */
    {"{\"a\":\"\xe2\x82\"}", 8},
    {"{\"a\":\"\xf0\x9f\x98z\"}", 9},
    {"{\"a\":\"\xe2z\"}", 7},
    {"{\"a\":\xc3\xa9}", 5}, /* non-ASCII outside strings */
    {"\xef\xbb\xbf{}", 0},   /* a byte-order mark */
    {"{\xc2\xa0}", 1},       /* a non-breaking space is not whitespace */
    {"{\f}", 1},             /* nor is form feed */
    {"{\v}", 1},
    {"                 {}", 16}, /* 17 spaces */
    {"{                 }", 17},
    {"{\"a\":1                 }", 22},
    {"{\"a\"                 :1}", 20},
    {"{\"a\":1,\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\"b\":2}", 23},
};

#define N_VALID ((int)(sizeof valid_texts / sizeof *valid_texts))
#define N_INVALID ((int)(sizeof invalid_texts / sizeof *invalid_texts))

/* 64 open containers (the limit): an object, then 63 arrays */
static char deep_ok[4 + 63 * 2 + 2 + 1];
/* 65: one more opening bracket, rejected at byte 5 + 63 */
static char deep_bad[5 + 64 + 1];

static void build_deep(void) {
  char *p = deep_ok;
  memcpy(p, "{\"a\":", 5);
  p += 5;
  for (int i = 0; i < 63; i++) *p++ = '[';
  for (int i = 0; i < 63; i++) *p++ = ']';
  *p++ = '}';
  *p = 0;
  p = deep_bad;
  memcpy(p, "{\"a\":", 5);
  p += 5;
  for (int i = 0; i < 64; i++) *p++ = '[';
  *p = 0;
}

/* feeds s[0..n) to a fresh state: 0 ok, -1 rejected; *complete set when ok */
static int feed_fresh(const char *s, size_t n, int *complete) {
  json_state st;
  json_state_init(&st);
  int r = json_state_feed(&st, s, n);
  if (complete) *complete = r == 0 && json_state_complete(&st);
  return r;
}

/* checks a valid text: it and its every prefix accepted; complete only at the end */
static void check_valid(const char *s) {
  size_t n = strlen(s);
  for (size_t k = 0; k <= n; k++) {
    int complete;
    int r = feed_fresh(s, k, &complete);
    EXPECT_MSG(r == 0, "prefix %zu of valid \"%s\" rejected", k, s);
    EXPECT_MSG(complete == (k == n), "prefix %zu of \"%s\": complete %d", k, s, complete);
  }
  /* byte by byte on one state */
  json_state st;
  json_state_init(&st);
  int ok = 1;
  for (size_t k = 0; k < n && ok; k++) ok = json_state_feed(&st, s + k, 1) == 0;
  EXPECT_MSG(ok && json_state_complete(&st), "\"%s\" byte by byte", s);
}

/* checks an invalid text: prefixes up to bad accepted and incomplete, bad's prefix rejected */
static void check_invalid(const char *s, int bad) {
  size_t n = strlen(s);
  REQUIRE(bad >= 0 && (size_t)bad < n);
  for (size_t k = 0; k <= (size_t)bad; k++) {
    int r = feed_fresh(s, k, NULL);
    EXPECT_MSG(r == 0, "prefix %zu of \"%s\" (bad at %d) rejected", k, s, bad);
  }
  int complete;
  EXPECT_MSG(feed_fresh(s, (size_t)bad + 1, &complete) == -1, "\"%s\" not rejected at byte %d", s,
             bad);
  EXPECT_MSG(feed_fresh(s, n, &complete) == -1, "whole \"%s\" accepted", s);
  /* a rejected state stays rejected */
  json_state st;
  json_state_init(&st);
  if (json_state_feed(&st, s, n) == -1) {
    EXPECT_MSG(json_state_feed(&st, "}", 1) == -1 && !json_state_complete(&st),
               "\"%s\": rejected state came back", s);
  }
}

TEST(recognizer_valid) {
  build_deep();
  for (int i = 0; i < N_VALID; i++) check_valid(valid_texts[i]);
  check_valid(deep_ok);
  /* a few incomplete texts that are valid prefixes */
  static const char *const prefixes[] = {"",
                                         " ",
                                         "{",
                                         "{\"a\"",
                                         "{\"a\":1",
                                         "{\"a\":1.5e",
                                         "{\"a\":\"\\u00",
                                         "{\"a\":\"\xf0\x9f",
                                         "{\"a\":[{"};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    int complete;
    EXPECT_MSG(feed_fresh(prefixes[i], strlen(prefixes[i]), &complete) == 0 && !complete,
               "prefix \"%s\"", prefixes[i]);
  }
  /* a NUL byte in a string is a control byte */
  int c;
  EXPECT(feed_fresh("{\"a\":\"\0\"}", 9, &c) == -1);
  EXPECT(feed_fresh("{\"a\":\"", 6, &c) == 0);
  /* the state is a plain value: a copy goes on independently */
  json_state a, b;
  json_state_init(&a);
  REQUIRE(json_state_feed(&a, "{\"k\":[1", 7) == 0);
  b = a;
  EXPECT(json_state_feed(&b, ",2]}", 4) == 0 && json_state_complete(&b));
  EXPECT(json_state_feed(&a, "]}", 2) == 0 && json_state_complete(&a));
}

TEST(recognizer_invalid) {
  build_deep();
  for (int i = 0; i < N_INVALID; i++) check_invalid(invalid_texts[i].s, invalid_texts[i].bad);
  check_invalid(deep_bad, 5 + 63);
}

/* the verdict when s is fed in the pieces cut at cuts[0..nc) (ascending) */
static int feed_pieces(const char *s, size_t n, const size_t *cuts, int nc, json_state *out) {
  json_state st;
  json_state_init(&st);
  size_t at = 0;
  int r = 0;
  for (int i = 0; i <= nc && r == 0; i++) {
    size_t end = i < nc ? cuts[i] : n;
    r = json_state_feed(&st, s + at, end - at);
    at = end;
  }
  *out = st;
  return r;
}

TEST(recognizer_splits) {
  build_deep();
  const char *texts[N_VALID + N_INVALID + 2];
  int nt = 0;
  for (int i = 0; i < N_VALID; i++) texts[nt++] = valid_texts[i];
  texts[nt++] = deep_ok;
  for (int i = 0; i < N_INVALID; i++) texts[nt++] = invalid_texts[i].s;
  texts[nt++] = deep_bad;
  for (int t = 0; t < nt; t++) {
    const char *s = texts[t];
    size_t n = strlen(s);
    json_state whole;
    json_state_init(&whole);
    int rw = json_state_feed(&whole, s, n);
    int cw = rw == 0 && json_state_complete(&whole);
    /* every two-piece split */
    for (size_t p = 0; p <= n; p++) {
      json_state st;
      int r = feed_pieces(s, n, &p, 1, &st);
      EXPECT_MSG(r == rw, "\"%s\" split at %zu: %d, whole %d", s, p, r, rw);
      if (r == 0 && rw == 0) {
        EXPECT_MSG(json_state_complete(&st) == cw, "\"%s\" split at %zu: complete", s, p);
        EXPECT_MSG(memcmp(&st, &whole, sizeof st) == 0, "\"%s\" split at %zu: state", s, p);
      }
    }
    /* every three-piece split of the shorter texts */
    if (n > 40) continue;
    for (size_t p = 0; p <= n; p++)
      for (size_t q = p; q <= n; q++) {
        size_t cuts[2] = {p, q};
        json_state st;
        int r = feed_pieces(s, n, cuts, 2, &st);
        EXPECT_MSG(r == rw && (r != 0 || json_state_complete(&st) == cw),
                   "\"%s\" split at %zu, %zu", s, p, q);
      }
  }
}

/* ---- the brute-force reference --------------------------------------------------------- */

/* a token tried on a copy of the recognizer (ctx) fed the text so far */
static int try_free(void *ctx, const char *b, size_t n) {
  json_state st = *(const json_state *)ctx;
  return json_state_feed(&st, b, n) == 0;
}

/* allowed[i] for i < n_logits, computed from the text so far (fed fresh) and dead; 1 when
 * the text is a complete object (and not dead) */
static int reference(const tvocab *tv, const char *text, size_t len, int dead, int n_logits,
                     unsigned char *allowed) {
  json_state base;
  json_state_init(&base);
  int ok = json_state_feed(&base, text, len) == 0;
  int complete = !dead && ok && json_state_complete(&base);
  return tv_reference(tv, try_free, &base, ok, complete, dead, n_logits, allowed);
}

/* compares the mask with the reference on every id, and prepare + apply with apply alone (m is
 * left prepared for n_logits); returns the number of disagreements and describes the first in
 * why (with the text's first 80 bytes) */
static int compare(const tvocab *tv, json_mask *m, const char *text, size_t len, int dead,
                   int n_logits, char *why, size_t whylen) {
  unsigned char *want = malloc((size_t)n_logits);
  int complete = want ? reference(tv, text, len, dead, n_logits, want) : 0;
  int bad = tv_compare(tv, m, want, complete, text, len, 80, 0, n_logits, why, whylen);
  free(want);
  return bad;
}

/* ---- a small hand-made vocabulary ------------------------------------------------------- */

enum {
  T_LBRACE,
  T_RBRACE,
  T_QUOTE,
  T_QA_Q,
  T_COLON,
  T_COMMA,
  T_SPACE,
  T_1,
  T_MINUS,
  T_DOT,
  T_E,
  T_TRUE,
  T_LBRACKET,
  T_RBRACKET,
  T_BSLASH,
  T_N,
  T_LBRACE_Q,
  T_Q_RBRACE,
  T_Q_COLON,
  T_EACUTE,
  T_C3,
  T_A9,
  T_FF,
  T_EMPTY,
  T_SPECIAL,
  T_EOS,
  T_0,
  T_NL,
  T_QA_Q_COLON,
  T_SP_Q,
  T_NULL,
  T_FALSE,
  T_AB,
  T_U,
  T_00,
  T_1_5,
  T_RBRACE2,
  T_SPACE2,
  T_UESC,
  T_QABC,
  T_NULLBYTES,
  T_EPLUS,
  T_EOS2,
  N_SMALL
};

static const char *const small_bytes[N_SMALL] = {
    [T_LBRACE] = "{",
    [T_RBRACE] = "}",
    [T_QUOTE] = "\"",
    [T_QA_Q] = "\"a\"",
    [T_COLON] = ":",
    [T_COMMA] = ",",
    [T_SPACE] = " ",
    [T_1] = "1",
    [T_MINUS] = "-",
    [T_DOT] = ".",
    [T_E] = "e",
    [T_TRUE] = "true",
    [T_LBRACKET] = "[",
    [T_RBRACKET] = "]",
    [T_BSLASH] = "\\",
    [T_N] = "n",
    [T_LBRACE_Q] = "{\"",
    [T_Q_RBRACE] = "\"}",
    [T_Q_COLON] = "\":",
    [T_EACUTE] = "\xc3\xa9",
    [T_C3] = "\xc3",
    [T_A9] = "\xa9",
    [T_FF] = "\xff",
    [T_EMPTY] = "",
    [T_SPECIAL] = "<|special|>",
    [T_EOS] = "<|eos|>",
    [T_0] = "0",
    [T_NL] = "\n",
    [T_QA_Q_COLON] = "\"a\":",
    [T_SP_Q] = " \"",
    [T_NULL] = "null",
    [T_FALSE] = "false",
    [T_AB] = "ab",
    [T_U] = "u",
    [T_00] = "00",
    [T_1_5] = "1.5",
    [T_RBRACE2] = "}}",
    [T_SPACE2] = "  ",
    [T_UESC] = "\\u00e9",
    [T_QABC] = "\"abc",
    [T_NULLBYTES] = NULL,
    [T_EPLUS] = "e+",
    [T_EOS2] = "",
};

static const char *small_ptrs[N_SMALL];
static size_t small_lens[N_SMALL];
static unsigned char small_special[N_SMALL];

static tvocab small_tvocab(void) {
  for (int i = 0; i < N_SMALL; i++) {
    small_ptrs[i] = small_bytes[i];
    small_lens[i] = small_bytes[i] ? strlen(small_bytes[i]) : 0;
  }
  small_lens[T_NULLBYTES] = 3; /* NULL bytes with a length: length 0 */
  small_special[T_SPECIAL] = small_special[T_EOS] = 1;
  tvocab tv = {N_SMALL, small_ptrs, small_lens, small_special, {T_EOS, T_EOS2}, 2};
  return tv;
}

/* the sorted ids the mask allows; returns how many */
static int allowed_ids(const json_mask *m, int n_logits, int *ids) {
  float logits[64];
  unsigned char ok[64];
  if (n_logits > 64) return -1;
  return mask_allowed_ids(m, n_logits, logits, ok, ids);
}

/* got (ascending) holds exactly the ids of want (any order, distinct) */
static int same_set(const int *got, int ngot, const int *want, int nwant) {
  if (ngot != nwant) return 0;
  for (int i = 0; i < nwant; i++) {
    int found = 0;
    for (int k = 0; k < ngot; k++) found |= got[k] == want[i];
    if (!found) return 0;
  }
  return 1;
}

/* advances m over the token ids and appends their bytes to text */
static void advance_all(json_mask *m, const tvocab *tv, const int *ids, int n, char *text,
                        size_t *len) {
  for (int i = 0; i < n; i++) {
    json_mask_advance(m, ids[i]);
    if (ids[i] >= 0 && ids[i] < tv->n && tv->bytes[ids[i]]) {
      memcpy(text + *len, tv->bytes[ids[i]], tv->lens[ids[i]]);
      *len += tv->lens[ids[i]];
    }
  }
}

static void *prepare_small(void *m) {
  json_mask_prepare(m, N_SMALL);
  return NULL;
}

TEST(mask_small_vocab) {
  tvocab tv = small_tvocab();
  json_vocab *v = tv_build(&tv);
  REQUIRE(v);
  EXPECT_EQ_INT(json_vocab_size(v), N_SMALL);
  char why[512];
  int got[64];

  /* at the start: whitespace and '{' */
  json_mask *m = json_mask_new(v);
  REQUIRE(m);
  int want_start[] = {T_LBRACE, T_SPACE, T_LBRACE_Q, T_NL, T_SPACE2};
  int ng = allowed_ids(m, N_SMALL, got);
  EXPECT_MSG(same_set(got, ng, want_start, 5), "start: %d allowed", ng);
  if (compare(&tv, m, "", 0, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);

  /* after '{': '}', whitespace, strings (a key may hold any string byte) */
  char text[4096];
  size_t len = 0;
  int p1[] = {T_LBRACE};
  advance_all(m, &tv, p1, 1, text, &len);
  int want_obj[] = {T_RBRACE, T_QUOTE,      T_QA_Q, T_SPACE,  T_Q_RBRACE, T_Q_COLON,
                    T_NL,     T_QA_Q_COLON, T_SP_Q, T_SPACE2, T_QABC};
  ng = allowed_ids(m, N_SMALL, got);
  EXPECT_MSG(same_set(got, ng, want_obj, 11), "after {: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);

  /* in a key: any string byte; a quote must then be followed by ':' */
  int p2[] = {T_QUOTE, T_AB};
  advance_all(m, &tv, p2, 2, text, &len);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  float lg[64];
  unsigned char ok[64];
  mask_allowed(m, N_SMALL, lg, ok);
  EXPECT(ok[T_Q_COLON] && ok[T_QUOTE] && ok[T_EACUTE] && ok[T_C3] && ok[T_BSLASH] && ok[T_RBRACE]);
  EXPECT(!ok[T_Q_RBRACE] && !ok[T_QA_Q] && !ok[T_A9] && !ok[T_FF] && !ok[T_NL] && !ok[T_EOS] &&
         !ok[T_SPECIAL] && !ok[T_EMPTY] && !ok[T_NULLBYTES] && !ok[T_QA_Q_COLON]);

  /* half a UTF-8 sequence: only its continuation */
  int p3[] = {T_C3};
  advance_all(m, &tv, p3, 1, text, &len);
  ng = allowed_ids(m, N_SMALL, got);
  int want_a9[] = {T_A9};
  EXPECT_MSG(same_set(got, ng, want_a9, 1), "after C3: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);

  /* after a backslash: the tokens that start with an escape letter (" \\ n t f u) */
  int p4[] = {T_A9, T_BSLASH};
  advance_all(m, &tv, p4, 2, text, &len);
  ng = allowed_ids(m, N_SMALL, got);
  int want_esc[] = {T_QUOTE,      T_QA_Q, T_TRUE,  T_BSLASH, T_N,    T_Q_RBRACE, T_Q_COLON,
                    T_QA_Q_COLON, T_NULL, T_FALSE, T_U,      T_UESC, T_QABC};
  EXPECT_MSG(same_set(got, ng, want_esc, 13), "after \\: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);

  /* the key closed, a value: numbers */
  int p5[] = {T_N, T_Q_COLON, T_SPACE, T_MINUS};
  advance_all(m, &tv, p5, 4, text, &len);
  ng = allowed_ids(m, N_SMALL, got);
  int want_minus[] = {T_1, T_0, T_1_5}; /* not "00": no leading zeros */
  EXPECT_MSG(same_set(got, ng, want_minus, 3), "after -: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  int p6[] = {T_1_5, T_E};
  advance_all(m, &tv, p6, 2, text, &len);
  ng = allowed_ids(m, N_SMALL, got);
  int want_e[] = {T_MINUS, T_1, T_0, T_00}; /* not "1.5": no fraction in an exponent */
  EXPECT_MSG(same_set(got, ng, want_e, 4), "after 1.5e: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  int p7[] = {T_1};
  advance_all(m, &tv, p7, 1, text, &len);
  mask_allowed(m, N_SMALL, lg, ok);
  EXPECT(ok[T_RBRACE] && ok[T_COMMA] && ok[T_SPACE] && ok[T_1] && ok[T_00] && ok[T_RBRACE2] == 0);
  EXPECT(!ok[T_EOS] && !ok[T_EOS2] && !ok[T_DOT] && !ok[T_E] && !ok[T_QUOTE]);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  EXPECT(!json_mask_complete(m));

  /* complete: only eos; an eos then changes nothing */
  int p8[] = {T_RBRACE};
  advance_all(m, &tv, p8, 1, text, &len);
  EXPECT(json_mask_complete(m));
  ng = allowed_ids(m, N_SMALL, got);
  int want_eos[] = {T_EOS, T_EOS2};
  EXPECT_MSG(same_set(got, ng, want_eos, 2), "complete: %d allowed", ng);
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  text[len] = 0;
  EXPECT_MSG(!strcmp(text, "{\"ab\xc3\xa9\\n\": -1.5e1}"), "text \"%.200s\"", text);
  json_mask_advance(m, T_EOS);
  EXPECT(json_mask_complete(m) && !json_mask_dead(m));
  /* any other token then kills it */
  json_mask_advance(m, T_SPACE);
  EXPECT(!json_mask_complete(m) && json_mask_dead(m));
  ng = allowed_ids(m, N_SMALL, got);
  EXPECT_MSG(same_set(got, ng, want_eos, 2), "dead: %d allowed", ng);
  json_mask_free(m);

  /* dead by a forbidden token, an out-of-range id, a special, an empty token, an early eos */
  const int killers[] = {T_RBRACE, -1,          N_SMALL, 1 << 30, T_SPECIAL,
                         T_EMPTY,  T_NULLBYTES, T_EOS,   T_FF};
  for (size_t k = 0; k < sizeof killers / sizeof *killers; k++) {
    m = json_mask_new(v);
    REQUIRE(m);
    int pre[] = {T_LBRACE_Q};
    len = 0;
    if (killers[k] != T_RBRACE) advance_all(m, &tv, pre, 1, text, &len);
    EXPECT(!json_mask_dead(m));
    json_mask_advance(m, killers[k]);
    EXPECT_MSG(json_mask_dead(m), "token %d did not kill", killers[k]);
    ng = allowed_ids(m, N_SMALL, got);
    EXPECT_MSG(same_set(got, ng, want_eos, 2), "dead after %d: %d allowed", killers[k], ng);
    if (compare(&tv, m, text, len, 1, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
    /* dead stays dead, even over a token that would have been fine */
    json_mask_advance(m, T_QUOTE);
    EXPECT(json_mask_dead(m) && !json_mask_complete(m));
    json_mask_free(m);
  }

  /* logits wider than the vocabulary: the extra ids forbidden; narrower: nothing past n
   * written (ASan checks the buffer) */
  m = json_mask_new(v);
  REQUIRE(m);
  len = 0;
  int pq[] = {T_LBRACE, T_QUOTE};
  advance_all(m, &tv, pq, 2, text, &len);
  if (compare(&tv, m, text, len, 0, N_SMALL + 9, why, sizeof why)) EXPECT_MSG(0, "%.300s", why);
  mask_allowed(m, N_SMALL + 9, lg, ok);
  for (int i = N_SMALL; i < N_SMALL + 9; i++) EXPECT_MSG(!ok[i], "extra id %d allowed", i);
  float *narrow = malloc(10 * sizeof *narrow);
  REQUIRE(narrow);
  for (int i = 0; i < 10; i++) narrow[i] = 1.0f;
  json_mask_apply(m, narrow, 10);
  for (int i = 0; i < 10; i++) /* in a key: all of ids 0..9 but "a" (a key then 'a') */
    EXPECT_MSG(narrow[i] == (i == T_QA_Q ? -INFINITY : 1.0f), "narrow logits: id %d", i);
  free(narrow);
  json_mask_apply(m, lg, 0); /* nothing to do */
  json_mask_prepare(m, 0);
  json_mask_apply(m, lg, 0);
  json_mask_free(m);

  /* a prepared set is dropped by advance, feed and json_mask_copy (into dst): the next apply
   * follows the new state */
  m = json_mask_new(v);
  json_mask *c = json_mask_new(v);
  REQUIRE(m && c);
  json_mask_prepare(m, N_SMALL);
  ng = allowed_ids(m, N_SMALL, got);
  EXPECT_MSG(same_set(got, ng, want_start, 5), "prepared at the start: %d allowed", ng);
  json_mask_advance(m, T_LBRACE);
  ng = allowed_ids(m, N_SMALL, got);
  EXPECT_MSG(same_set(got, ng, want_obj, 11), "prepared, then advanced over {: %d allowed", ng);
  json_mask_prepare(m, N_SMALL);
  EXPECT(json_mask_feed(m, "\"a\":", 4) == 0);
  memcpy(text, "{\"a\":", 5);
  len = 5;
  if (compare(&tv, m, text, len, 0, N_SMALL, why, sizeof why))
    EXPECT_MSG(0, "prepared, then fed: %.300s", why);
  json_mask_prepare(c, N_SMALL); /* c prepared at the start */
  json_mask_copy(c, m);          /* m is prepared after {"a": (compare) */
  json_mask_advance(m, T_1);
  ng = allowed_ids(c, N_SMALL, got);
  int got_m[64];
  json_mask *fresh = json_mask_new(v);
  REQUIRE(fresh);
  EXPECT(json_mask_feed(fresh, "{\"a\":", 5) == 0);
  int nf = allowed_ids(fresh, N_SMALL, got_m);
  EXPECT_MSG(same_set(got, ng, got_m, nf), "copied over a prepared mask: %d allowed, %d", ng, nf);
  if (compare(&tv, c, text, len, 0, N_SMALL, why, sizeof why)) EXPECT_MSG(0, "copied: %.300s", why);
  /* prepared on another thread, applied on this one after the join */
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, prepare_small, fresh) == 0);
  REQUIRE(pthread_join(th, NULL) == 0);
  int nt = allowed_ids(fresh, N_SMALL, got_m);
  EXPECT_MSG(same_set(got, ng, got_m, nt), "prepared on a thread: %d allowed, %d", nt, ng);
  json_mask_free(fresh);
  json_mask_free(c);
  json_mask_free(m);
  json_vocab_free(v);

  /* a vocabulary without what the state needs: nothing allowed, so only eos */
  const char *few[] = {"}", "x", "<eos>"};
  size_t few_lens[] = {1, 1, 5};
  int32_t few_eos[] = {2, 7, -3}; /* out-of-range eos ids are ignored */
  v = json_vocab_new(3, few, few_lens, NULL, few_eos, 3);
  REQUIRE(v);
  m = json_mask_new(v);
  REQUIRE(m);
  ng = allowed_ids(m, 5, got);
  int want_few[] = {2};
  EXPECT_MSG(same_set(got, ng, want_few, 1), "no content token: %d allowed", ng);
  EXPECT_MSG(!prep_compare(m, 3, 5, why, sizeof why), "no content token: %.300s", why);
  json_mask_free(m);
  json_vocab_free(v);

  /* a key closed past byte 65535 of a token: walked, not judged by the precomputed run */
  enum { LONG = 70000 };
  char *longtok = malloc(LONG);
  REQUIRE(longtok);
  memset(longtok, 'a', LONG);
  longtok[LONG - 2] = '"';
  longtok[LONG - 1] = ':';
  const char *lv[] = {"{\"", longtok, "}", "<e>"};
  size_t lv_lens[] = {2, LONG, 1, 3};
  int32_t lv_eos[] = {3};
  for (int variant = 0; variant < 2; variant++) {
    if (variant) longtok[LONG - 1] = ','; /* a key then ',': forbidden */
    v = json_vocab_new(4, lv, lv_lens, NULL, lv_eos, 1);
    REQUIRE(v);
    m = json_mask_new(v);
    REQUIRE(m);
    json_mask_advance(m, 0); /* in a key: '{', '"' (a key "{"), '}' are fine */
    ng = allowed_ids(m, 4, got);
    int want_long[] = {0, 2, 1};
    EXPECT_MSG(same_set(got, ng, want_long, variant ? 2 : 3), "long token %d: %d allowed", variant,
               ng);
    EXPECT_MSG(!prep_compare(m, 4, 4, why, sizeof why), "long token %d: %.300s", variant, why);
    json_mask_advance(m, 1);
    EXPECT(json_mask_dead(m) == variant);
    json_mask_free(m);
    json_vocab_free(v);
  }
  free(longtok);

  /* an empty vocabulary */
  v = json_vocab_new(0, NULL, NULL, NULL, NULL, 0);
  REQUIRE(v);
  m = json_mask_new(v);
  REQUIRE(m);
  ng = allowed_ids(m, 3, got);
  EXPECT_EQ_INT(ng, 0);
  EXPECT_MSG(!prep_compare(m, 0, 3, why, sizeof why), "empty vocabulary: %.300s", why);
  json_mask_advance(m, 0);
  EXPECT(json_mask_dead(m));
  json_mask_free(m);
  json_vocab_free(v);
  json_vocab_free(NULL);
  json_mask_free(NULL);
}

/* ---- random walks over a random vocabulary ---------------------------------------------- */

TEST(mask_random_walks) {
  /* JSON-ish pieces: structure, whitespace, digits, literal letters, escapes, UTF-8 bytes (whole
   * and partial, valid and not), a control byte */
  static const char alphabet[] =
      "{}[]\":,  \n\t0123456789-+.eEtrufalsn\\u/aAbzQ{\"\"}:\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98"
      "\x80\xed\xa0\x01\xff\xc0";
  const int n_alpha = (int)sizeof alphabet - 1;
  tvocab small = small_tvocab();
  enum { N_RANDOM = 300 };
  const int n = N_SMALL + N_RANDOM;
  const char **ptrs = calloc((size_t)n, sizeof *ptrs);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  unsigned char *special = calloc((size_t)n, 1);
  char *pool = malloc((size_t)N_RANDOM * 8);
  REQUIRE(ptrs && lens && special && pool);
  uint64_t x = 20240611;
  for (int i = 0; i < N_SMALL; i++) {
    ptrs[i] = small.bytes[i];
    lens[i] = small.lens[i];
    special[i] = small.special[i];
  }
  for (int i = 0; i < N_RANDOM; i++) {
    char *p = pool + i * 8;
    int l = 1 + (int)(rng_next(&x) % 6);
    for (int k = 0; k < l; k++) p[k] = alphabet[rng_next(&x) % (uint64_t)n_alpha];
    ptrs[N_SMALL + i] = p;
    lens[N_SMALL + i] = (size_t)l;
  }
  tvocab tv = {n, ptrs, lens, special, {T_EOS, T_EOS2}, 2};
  json_vocab *v = tv_build(&tv);
  REQUIRE(v);
  const int n_logits = n + 3;
  float *logits = malloc((size_t)n_logits * sizeof *logits);
  unsigned char *ok = malloc((size_t)n_logits);
  int *cand = malloc((size_t)n_logits * sizeof *cand);
  char *text = malloc(1 << 16);
  REQUIRE(logits && ok && cand && text);
  char why[512];
  int n_complete = 0, n_steps = 0, n_bad = 0;
  for (int walk = 0; walk < 300 && !n_bad; walk++) {
    json_mask *m = json_mask_new(v);
    REQUIRE(m);
    size_t len = 0;
    for (int step = 0; step < 400; step++) {
      if (compare(&tv, m, text, len, 0, n_logits, why, sizeof why)) {
        EXPECT_MSG(0, "walk %d step %d: %.300s", walk, step, why);
        n_bad++;
        break;
      }
      int nc = mask_allowed_ids(m, n_logits, logits, ok, cand);
      REQUIRE(nc > 0);
      if (json_mask_complete(m)) { /* only eos, and the text is one object */
        EXPECT_MSG(nc == 2 && cand[0] == T_EOS && cand[1] == T_EOS2, "complete: %d allowed", nc);
        int complete;
        EXPECT(feed_fresh(text, len, &complete) == 0 && complete);
        n_complete++;
        break;
      }
      /* later in a walk, half the time prefer the tokens that close the most containers */
      int pick = cand[rng_next(&x) % (uint64_t)nc];
      if (step > 80 && rng_next(&x) % 2) {
        json_state base;
        json_state_init(&base);
        REQUIRE(json_state_feed(&base, text, len) == 0);
        int best = 1 << 30, nbest = 0;
        for (int c = 0; c < nc; c++) {
          json_state st = base;
          if (tv_is_eos(&tv, cand[c])) continue;
          REQUIRE(json_state_feed(&st, ptrs[cand[c]], lens[cand[c]]) == 0);
          int d = json_state_complete(&st) ? -1 : st.depth;
          if (d < best) best = d, nbest = 0;
          if (d == best) cand[nbest++] = cand[c];
        }
        if (nbest) pick = cand[rng_next(&x) % (uint64_t)nbest];
      }
      REQUIRE(!tv_is_eos(&tv, pick)); /* never stuck in this vocabulary */
      json_mask_advance(m, pick);
      REQUIRE(!json_mask_dead(m));
      memcpy(text + len, ptrs[pick], lens[pick]);
      len += lens[pick];
      n_steps++;
    }
    json_mask_free(m);
  }
  printf("  random walks: %d steps checked, %d walks reached a complete object\n", n_steps,
         n_complete);
  EXPECT_MSG(n_complete >= 50, "only %d walks completed", n_complete);
  free(logits);
  free(ok);
  free(cand);
  free(text);
  json_vocab_free(v);
  free(ptrs);
  free(lens);
  free(special);
  free(pool);
}

/* ---- the real vocabulary ---------------------------------------------------------------- */

/* a new mask advanced over the tokens of text (as the tokenizer splits it); NULL when one of
 * them was refused */
static json_mask *mask_after(const json_vocab *v, const tokenizer *tok, const char *text) {
  json_mask *m = json_mask_new(v);
  if (!m) return NULL;
  int32_t *ids = NULL;
  char err[128];
  int n = tokenizer_encode(tok, text, strlen(text), &ids, err, sizeof err);
  for (int i = 0; i < n; i++) json_mask_advance(m, ids[i]);
  free(ids);
  if (n < 0 || json_mask_dead(m)) {
    json_mask_free(m);
    return NULL;
  }
  return m;
}

TEST(mask_real_vocab) {
  char err[256];
  const int n_logits = 151936; /* the model's logits width: ids past the tokenizer's decode to
                                * nothing */
  real_vocab rv;
  int loaded = rv_load(&rv, n_logits, 0, err, sizeof err);
  if (loaded == 0) return;
  EXPECT_MSG(loaded == 1, "real vocabulary: %s", err);
  if (loaded != 1) return;
  tokenizer *tok = rv.tok;
  int nt = rv.nt;
  float *logits = rv.logits;
  unsigned char *ok = rv.ok;
  tvocab tv = rv.tv;
  int im_end = tokenizer_token_id(tok, "<|im_end|>");
  int eot = tokenizer_token_id(tok, "<|endoftext|>");
  REQUIRE(im_end >= 0 && eot >= 0);
  tv.eos[tv.n_eos++] = im_end;
  tv.eos[tv.n_eos++] = eot;
  double t0 = now_s();
  json_vocab *v = tv_build(&tv);
  REQUIRE(v);
  printf("  real vocabulary: %d tokens (%d logits), json_vocab_new %.1f ms\n", nt, n_logits,
         (now_s() - t0) * 1e3);

  int id_abc = tokenizer_token_id(tok, "abc"), id_hello = tokenizer_token_id(tok, "hello");
  int id_name = tokenizer_token_id(tok, "name");
  int id_world = tokenizer_token_id(tok, "\xc4\xa0world"); /* " world" (Ġ is the space) */
  int id_rb = tokenizer_token_id(tok, "}"), id_comma = tokenizer_token_id(tok, ",");
  int id_q = tokenizer_token_id(tok, "\""), id_0 = tokenizer_token_id(tok, "0");
  REQUIRE(id_abc >= 0 && id_hello >= 0 && id_name >= 0 && id_world >= 0 && id_rb >= 0 &&
          id_comma >= 0 && id_q >= 0 && id_0 >= 0);
  char why[512];

  /* the states timed, with what each must allow and forbid */
  static const char *const states[] = {
      "",                     /* the start */
      "{",                    /* a key or '}' */
      "{\"",                  /* in a key */
      "{\"name\": \"",        /* in a string value */
      "{\"name\": \"abc def", /* in a string value */
      "{\"a\": ",             /* a value */
      "{\"a\": 1",            /* in a number */
      "{\"a\": [1, ",         /* an array element */
      "{\"a\": \"\\u00",      /* in \u */
      "{\"a\": tr",           /* in a literal */
      "{\"a\": 1}",           /* complete */
  };
  const int n_states = (int)(sizeof states / sizeof *states);
  for (int s = 0; s < n_states; s++) {
    json_mask *m = mask_after(v, tok, states[s]);
    EXPECT_MSG(m, "could not advance over \"%s\"", states[s]);
    if (!m) continue;
    const char *text = states[s];
    if (compare(&tv, m, text, strlen(text), 0, n_logits, why, sizeof why))
      EXPECT_MSG(0, "%.300s", why);
    mask_allowed(m, n_logits, logits, ok);
    int n_ok = 0;
    for (int i = 0; i < n_logits; i++) n_ok += ok[i];
    for (int i = nt; i < n_logits; i++)
      if (ok[i]) {
        EXPECT_MSG(0, "id %d past the tokenizer allowed", i);
        break;
      }
    if (!strcmp(text, "{\"name\": \"") || !strcmp(text, "{\"name\": \"abc def")) {
      EXPECT_MSG(
          ok[id_abc] && ok[id_hello] && ok[id_name] && ok[id_world] && ok[id_q] && ok[id_comma],
          "in a string: a word token forbidden");
      /* '}' is string content here ({"name": "} is a prefix of {"name": "}"}) */
      EXPECT_MSG(ok[id_rb], "in a string: '}' forbidden");
      EXPECT(!ok[im_end] && !ok[eot]);
    }
    if (!strcmp(text, "{\"name\": \"")) {
      /* '}' is content inside a string; after the prefix '{"name": ' (no quote) it is not */
      json_mask *mv = mask_after(v, tok, "{\"name\": ");
      REQUIRE(mv);
      float *l2 = malloc((size_t)n_logits * sizeof *l2);
      unsigned char *ok2 = malloc((size_t)n_logits);
      REQUIRE(l2 && ok2);
      mask_allowed(mv, n_logits, l2, ok2);
      EXPECT_MSG(!ok2[id_rb] && !ok2[id_abc] && !ok2[id_comma] && ok2[id_q] && ok2[id_0],
                 "after {\"name\": ");
      free(l2);
      free(ok2);
      json_mask_free(mv);
    }
    if (!strcmp(text, "{\"a\": 1")) {
      EXPECT_MSG(ok[id_rb] && ok[id_comma] && ok[id_0], "after {\"a\": 1: } , 0 allowed");
      EXPECT_MSG(!ok[id_q] && !ok[id_abc] && !ok[im_end], "after {\"a\": 1: \" abc eos forbidden");
    }
    if (!strcmp(text, "{\"a\": 1}")) {
      EXPECT(json_mask_complete(m));
      EXPECT_MSG(n_ok == 2 && ok[im_end] && ok[eot], "complete: %d allowed", n_ok);
    }
    /* time it: apply alone, prepare, apply after prepare */
    double ms[3];
    apply_times(m, logits, n_logits, ms);
    printf(
        "  json_mask_apply after %-22s %6.3f ms/call (%6d allowed); prepare %6.3f, "
        "prepared apply %6.3f\n",
        s == 0 ? "(nothing)" : states[s], ms[0], n_ok, ms[1], ms[2]);
    json_mask_free(m);
  }
  json_vocab_free(v);
  rv_free(&rv);
}

int main(void) {
  RUN(recognizer_valid);
  RUN(recognizer_invalid);
  RUN(recognizer_splits);
  RUN(mask_small_vocab);
  RUN(mask_random_walks);
  RUN(mask_real_vocab);
  TEST_MAIN_END();
}
