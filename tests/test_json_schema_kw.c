/* test_json_schema_kw — the JSON Schema keywords zod and Pydantic write beyond the core subset:
 * additionalProperties as a schema, allOf (and $ref / anyOf beside other keywords), minimum /
 * maximum / exclusive* on integers and numbers, multipleOf, prefixItems (and items as an
 * array), format, pattern (regex_dfa). For each: random walks over a small vocabulary, the mask
 * compared at every step with a brute-force reference (each token tried on a copy), and every
 * completed output parsed by jansson and checked by a reference written here, independent of
 * the mask (PCRE2 for patterns, inet_pton for addresses, a calendar for dates, double
 * comparisons for bounds); tables of texts the recognizer must reject; and the refusals, each
 * with its message. Schemas and texts are written with ' for " (q() swaps them back). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_util.h"
#include "json_vocab_util.h"
#include "sampler/json_mask.h"
#include "sampler/json_schema.h"
#include "sampler/regex_dfa.h"
#include "test.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static json_schema *compile_q(const char *text, char *err, size_t errlen) {
  json_error_t e;
  json_t *j = json_loads(q(text), JSON_DECODE_ANY, &e);
  if (!j) {
    snprintf(err, errlen, "test schema does not parse: %s", e.text);
    return NULL;
  }
  json_schema *s = json_schema_compile(j, err, errlen);
  json_decref(j);
  return s;
}

/* ---- the references --------------------------------------------------------------------- */

static int pcre_search(const char *pat, const char *s, size_t n) {
  int ec;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
  if (!re) return -1;
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  int r = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return r >= 0;
}

static int digits(const char *s, int n) {
  for (int i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

static int num2(const char *s) { return (s[0] - '0') * 10 + s[1] - '0'; }

static int is_date(const char *s, size_t n) {
  if (n != 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' ||
      !digits(s + 8, 2))
    return 0;
  int y = num2(s) * 100 + num2(s + 2), m = num2(s + 5), d = num2(s + 8);
  static const int dm[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (y < 1 || m < 1 || m > 12 || d < 1) return 0;
  return d <= dm[m - 1] + (m == 2 && leap);
}

static int is_time(const char *s, size_t n) {
  if (n < 9 || !digits(s, 2) || s[2] != ':' || !digits(s + 3, 2) || s[5] != ':' ||
      !digits(s + 6, 2) || num2(s) > 23 || num2(s + 3) > 59 || num2(s + 6) > 59)
    return 0;
  size_t i = 8;
  if (s[i] == '.') {
    size_t j = ++i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == j) return 0;
  }
  if (i + 1 == n && s[i] == 'Z') return 1;
  return i + 6 == n && (s[i] == '+' || s[i] == '-') && digits(s + i + 1, 2) && s[i + 3] == ':' &&
         digits(s + i + 4, 2) && num2(s + i + 1) <= 23 && num2(s + i + 4) <= 59;
}

static int is_uuid(const char *s, size_t n) {
  if (n != 36) return 0;
  for (size_t i = 0; i < n; i++) {
    int dash = i == 8 || i == 13 || i == 18 || i == 23;
    int hex = (s[i] >= '0' && s[i] <= '9') || ((s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'f');
    if (dash ? s[i] != '-' : !hex) return 0;
  }
  return 1;
}

static int is_ip(int af, const char *s, size_t n) {
  char b[64];
  unsigned char out[16];
  if (n >= sizeof b) return 0;
  memcpy(b, s, n);
  b[n] = 0;
  return inet_pton(af, b, out) == 1;
}

/* the reference's verdict on one completed output (root: the parsed object) */
typedef int (*check_fn)(const json_t *root);

static const char *sget(const json_t *o, const char *k, size_t *n) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_string(v)) return NULL;
  *n = json_string_length(v);
  return json_string_value(v);
}

static size_t cps(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

static int chk_ap(const json_t *r) {
  const char *k;
  json_t *v;
  if (!json_is_integer(json_object_get(r, "id"))) return 0;
  json_object_foreach((json_t *)r, k, v) {
    if (!strcmp(k, "id")) continue;
    if (!strcmp(k, "tag")) {
      if (!json_is_boolean(v)) return 0;
      continue;
    }
    if (!json_is_string(v) || cps(json_string_value(v), json_string_length(v)) > 3) return 0;
  }
  return 1;
}

static int chk_record(const json_t *r) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)r, k, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 99) return 0;
  }
  return 1;
}

static int chk_allof(const json_t *r) {
  const json_t *a = json_object_get(r, "a"), *b = json_object_get(r, "b"),
               *c = json_object_get(r, "c");
  if (!json_is_integer(a) || json_integer_value(a) < 3 || json_integer_value(a) > 5) return 0;
  if (!json_is_string(b)) return 0;
  if (c && !json_is_null(c) && !json_is_boolean(c)) return 0;
  return json_object_size(r) == 2u + (c != NULL);
}

static int chk_ints(const json_t *r) {
  const json_t *n = json_object_get(r, "n"), *m = json_object_get(r, "m"),
               *k = json_object_get(r, "k");
  if (!json_is_integer(n) || !json_is_integer(m) || !json_is_integer(k)) return 0;
  long long a = json_integer_value(n), b = json_integer_value(m), c = json_integer_value(k);
  return a >= -5 && a < 120 && b > 7 && b <= 9 && c % 7 == 0 && c >= -50 && c <= 100;
}

static int chk_nums(const json_t *r) {
  const json_t *x = json_object_get(r, "x"), *y = json_object_get(r, "y");
  if (!json_is_number(x) || !json_is_number(y)) return 0;
  double a = json_number_value(x), b = json_number_value(y);
  return a >= 0.5 && a < 2.25 && b > -1 && b <= 1e-3;
}

static int chk_tuple(const json_t *r) {
  const json_t *t = json_object_get(r, "t"), *u = json_object_get(r, "u");
  size_t n = json_array_size(t);
  if (!json_is_array(t) || n < 1 || n > 2 || !json_is_integer(json_array_get(t, 0))) return 0;
  if (n == 2 && !json_is_string(json_array_get(t, 1))) return 0;
  if (u) {
    if (!json_is_array(u) || json_array_size(u) < 2 || !json_is_null(json_array_get(u, 0)))
      return 0;
    for (size_t i = 1; i < json_array_size(u); i++)
      if (!json_is_boolean(json_array_get(u, i))) return 0;
  }
  return 1;
}

static int chk_formats(const json_t *r) {
  size_t n;
  const char *s;
  if (!(s = sget(r, "d", &n)) || !is_date(s, n)) return 0;
  if (!(s = sget(r, "t", &n)) || !is_time(s, n)) return 0;
  if (!(s = sget(r, "dt", &n)) || n < 11 || !is_date(s, 10) || s[10] != 'T' ||
      !is_time(s + 11, n - 11))
    return 0;
  if (!(s = sget(r, "u", &n)) || !is_uuid(s, n)) return 0;
  return 1;
}

static int chk_net(const json_t *r) {
  size_t n;
  const char *s;
  if (!(s = sget(r, "v4", &n)) || !is_ip(AF_INET, s, n)) return 0;
  if (!(s = sget(r, "v6", &n)) || !is_ip(AF_INET6, s, n)) return 0;
  if (!(s = sget(r, "e", &n)) || !pcre_search("^[^@\\s]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$", s, n))
    return 0;
  if (!(s = sget(r, "w", &n)) || !pcre_search("^[A-Za-z][A-Za-z0-9+.-]*:[^\\s]*$", s, n)) return 0;
  return 1;
}

static int chk_unions(const json_t *r) {
  const json_t *ip = json_object_get(r, "ip");
  size_t n;
  const char *s;
  if (!json_is_null(ip)) {
    if (!(s = sget(r, "ip", &n)) || !(is_ip(AF_INET, s, n) || is_ip(AF_INET6, s, n))) return 0;
  }
  if (!(s = sget(r, "when", &n))) return 0;
  return is_date(s, n) || cps(s, n) <= 2 || !strcmp(s, "now") || !strcmp(s, "a\\b");
}

static const char *const pats[] = {"^[a-c]{2,3}-\\d+$", "x(y|z)+", "^(ab|cd)*\\.?$",
                                   "^[^a-z]{1,4}$", "q$"};

static int chk_pats(const json_t *r) {
  static const char *const keys[] = {"p0", "p1", "p2", "p3", "p4"};
  for (int i = 0; i < 5; i++) {
    size_t n;
    const char *s = sget(r, keys[i], &n);
    if (!s || pcre_search(pats[i], s, n) != 1) return 0;
  }
  size_t n;
  const char *s = sget(r, "p4", &n);
  return s && cps(s, n) <= 3; /* maxLength 3 */
}

/* ---- the schemas ------------------------------------------------------------------------ */

typedef struct kw_case {
  const char *name;
  const char *schema;
  check_fn check;
  const char *pieces; /* tokens of the walks' vocabulary, separated by spaces */
} kw_case;

static const kw_case cases[] = {
    {"additionalProperties",
     "{'type':'object','properties':{'id':{'type':'integer'},'tag':{'type':'boolean'}},"
     "'required':['id'],'additionalProperties':{'type':'string','maxLength':3}}",
     chk_ap, "'id': 'tag': 'i 'id 'idx 'ta \\' \\u0069 \\n true false"},
    {"record",
     "{'type':'object','additionalProperties':{'type':'integer','minimum':0,"
     "'maximum':99}}",
     chk_record, "'a': 'b': 'k 'x 12 9 100"},
    {"allOf",
     "{'allOf':[{'type':'object','properties':{'a':{'type':'integer','minimum':1}},"
     "'required':['a']},{'$ref':'#/$defs/B'}],"
     "'$defs':{'B':{'type':'object','properties':{'a':{'maximum':5,'minimum':3},"
     "'b':{'type':'string'},'c':{'anyOf':[{'type':'null'},{'type':'boolean'}]}},"
     "'required':['b'],'additionalProperties':false}}}",
     chk_allof, "'a': 'b': 'c': 'b null 4 3 5 'x"},
    {"integers",
     "{'type':'object','properties':{'n':{'type':'integer','minimum':-5,"
     "'exclusiveMaximum':120},'m':{'type':'integer','exclusiveMinimum':7,'maximum':9},"
     "'k':{'type':'integer','multipleOf':7,'minimum':-50,'maximum':100}},"
     "'required':['n','m','k']}",
     chk_ints, "'n': 'm': 'k': 11 -4 119 12 00 -0 1e 1. 7 49 -49"},
    {"numbers",
     "{'type':'object','properties':{'x':{'type':'number','minimum':0.5,"
     "'exclusiveMaximum':2.25},'y':{'type':'number','exclusiveMinimum':-1,'maximum':0.001}},"
     "'required':['x','y']}",
     chk_nums, "'x': 'y': 0. 2.2 2.25 0.5 -0.9 0.000 1e3 .5 -1"},
    {"prefixItems",
     "{'type':'object','properties':{'t':{'type':'array','prefixItems':[{'type':'integer','maximum'"
     ":999},"
     "{'type':'string'}],'items':false,'minItems':1},'u':{'type':'array',"
     "'items':[{'type':'null'}],'additionalItems':{'type':'boolean'},'minItems':2}},"
     "'required':['t']}",
     chk_tuple, "'t': 'u': [1 [null true] false 'a' ,"},
    {"formats",
     "{'type':'object','properties':{'d':{'type':'string','format':'date'},"
     "'t':{'type':'string','format':'time'},'dt':{'type':'string','format':'date-time'},"
     "'u':{'type':'string','format':'uuid'}},'required':['d','t','dt','u']}",
     chk_formats,
     "'d': 't': 'dt': 'u': 2024- 02-29 1999 -12-31 T12:00:00Z +05:30 .5 Z 00: 59 23: "
     "ab12 -cd34- ef56"},
    {"network",
     "{'type':'object','properties':{'v4':{'type':'string','format':'ipv4'},"
     "'v6':{'type':'string','format':'ipv6'},'e':{'type':'string','format':'email'},"
     "'w':{'type':'string','format':'uri','maxLength':40}},'required':['v4','v6','e','w']}",
     chk_net,
     "'v4': 'v6': 'e': 'w': 192.168 .0.1 255 :: fe80 ::1 a@b .com user@ https:// "
     "example.org/x ?q=1 #f %20"},
    {"string unions",
     "{'type':'object','properties':{'ip':{'anyOf':[{'type':'string','format':'ipv4'},"
     "{'type':'string','format':'ipv6'},{'type':'null'}]},'when':{'oneOf':[{'type':'string',"
     "'format':'date'},{'type':'string','maxLength':2},{'enum':['now','a\\\\b']}]}},"
     "'required':['ip','when']}",
     chk_unions, "'ip': 'when': null 1.2. ::1 2024-01- 'now' 'no a\\\\b"},
    {"pattern",
     "{'type':'object','properties':{'p0':{'type':'string','pattern':'^[a-c]{2,3}-\\\\d+$'},"
     "'p1':{'type':'string','pattern':'x(y|z)+'},'p2':{'type':'string','pattern':"
     "'^(ab|cd)*\\\\.?$'},'p3':{'type':'string','pattern':'^[^a-z]{1,4}$'},"
     "'p4':{'type':'string','pattern':'q$','maxLength':3}},'required':['p0','p1','p2','p3','p4']}",
     chk_pats, "'p0': 'p1': 'p2': 'p3': 'p4': ab- abc- 12 xy z ab cd . A \\' \\\\ \\n \\u0041"},
};

/* ---- random walks ----------------------------------------------------------------------- */

enum { W_EOS, W_FIRST };

/* the vocabulary: eos, every printable ASCII byte, a few UTF-8 characters, the case's pieces
 * (q()'d), and random pairs of bytes */
static int vocab_build(tvocab *tv, char *pool, size_t cap_pool, const char *pieces, uint64_t *x) {
  static const char alpha[] = "{}[]\":, \n0123456789-+.eEtrufalsnTZ:@/?#%abcdefxyzqAF\\";
  static const char *const utf8[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
  int cap = 1200, n = 0;
  tv->bytes = calloc((size_t)cap, sizeof *tv->bytes);
  tv->lens = calloc((size_t)cap, sizeof *tv->lens);
  tv->special = calloc((size_t)cap, 1);
  if (!tv->bytes || !tv->lens || !tv->special) return -1;
  char *p = pool;
#define ADD(b, l)                                         \
  do {                                                    \
    if (n < cap && (size_t)(p - pool) + 32 <= cap_pool) { \
      memcpy(p, (b), (size_t)(l));                        \
      tv->bytes[n] = p;                                   \
      tv->lens[n] = (size_t)(l);                          \
      p += 32;                                            \
      n++;                                                \
    }                                                     \
  } while (0)
  ADD("<|eos|>", 7);
  tv->special[W_EOS] = 1;
  for (int c = 0x20; c < 0x7f; c++) {
    char b = (char)c;
    ADD(&b, 1);
  }
  ADD("\n", 1);
  for (int i = 0; i < 3; i++) ADD(utf8[i], strlen(utf8[i]));
  const char *pc = q(pieces);
  while (*pc) {
    const char *e = strchr(pc, ' ');
    size_t l = e ? (size_t)(e - pc) : strlen(pc);
    if (l && l < 32) ADD(pc, l);
    pc += l + (e != NULL);
  }
  for (int i = 0; i < 150; i++) {
    char b[2] = {alpha[rng_next(x) % (sizeof alpha - 1)], alpha[rng_next(x) % (sizeof alpha - 1)]};
    ADD(b, 2);
  }
#undef ADD
  tv->n = n;
  tv->eos[0] = W_EOS;
  tv->n_eos = 1;
  return 0;
}

static void walks(const kw_case *kc, int n_walks, uint64_t seed, int *n_complete_out) {
  char err[256];
  json_schema *sc = compile_q(kc->schema, err, sizeof err);
  EXPECT_MSG(sc, "%s: %s", kc->name, err);
  *n_complete_out = 0;
  if (!sc) return;
  uint64_t x = seed;
  tvocab tv;
  memset(&tv, 0, sizeof tv);
  size_t cap_pool = 1200 * 32;
  char *pool = malloc(cap_pool);
  REQUIRE(pool && vocab_build(&tv, pool, cap_pool, kc->pieces, &x) == 0);
  json_vocab *v = tv_build(&tv);
  REQUIRE(v);
  const int n_logits = tv.n + 1;
  float *logits = malloc((size_t)n_logits * sizeof *logits);
  unsigned char *ok = malloc((size_t)n_logits);
  int *cand = malloc((size_t)n_logits * sizeof *cand);
  char *text = malloc(1 << 16);
  REQUIRE(logits && ok && cand && text);
  char why[512];
  int n_complete = 0, n_bad = 0;
  for (int walk = 0; walk < n_walks && !n_bad; walk++) {
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    size_t len = 0;
    for (int step = 0; step < 500; step++) {
      if (walk < 12 && compare(&tv, v, sc, m, text, len, n_logits, why, sizeof why)) {
        EXPECT_MSG(0, "%s: walk %d step %d: %.400s", kc->name, walk, step, why);
        n_bad++;
        break;
      }
      int nc = mask_allowed_ids(m, n_logits, logits, ok, cand);
      REQUIRE(nc > 0);
      if (json_mask_complete(m)) {
        json_error_t e;
        json_t *j = json_loadb(text, len, 0, &e);
        EXPECT_MSG(j, "%s: jansson refused \"%.*s\": %s", kc->name, (int)len, text, e.text);
        EXPECT_MSG(!j || kc->check(j), "%s: \"%.*s\" is invalid", kc->name, (int)len, text);
        if (j && !kc->check(j)) n_bad++;
        json_decref(j);
        n_complete++;
        break;
      }
      int pick = cand[rng_next(&x) % (uint64_t)nc];
      /* after a while, most of the time a token that closes the most */
      if (step > 30 + 30 * (walk % 3) && rng_next(&x) % 4) {
        int best = 1 << 30, nbest = 0;
        for (int c = 0; c < nc; c++) {
          int id = cand[c];
          if (tv_is_eos(&tv, id)) continue;
          memcpy(text + len, tv.bytes[id], tv.lens[id]);
          int d = open_count(text, len + tv.lens[id]);
          if (d < best) best = d, nbest = 0;
          if (d == best) cand[nbest++] = id;
        }
        if (nbest) pick = cand[rng_next(&x) % (uint64_t)nbest];
      }
      EXPECT_MSG(!tv_is_eos(&tv, pick), "%s: walk %d: only eos after \"%.*s\"", kc->name, walk,
                 (int)len, text);
      if (tv_is_eos(&tv, pick)) {
        n_bad++;
        break;
      }
      json_mask_advance(m, pick);
      REQUIRE(!json_mask_dead(m));
      memcpy(text + len, tv.bytes[pick], tv.lens[pick]);
      len += tv.lens[pick];
    }
    json_mask_free(m);
  }
  printf("  %-20s %d walks, %d complete\n", kc->name, n_walks, n_complete);
  *n_complete_out = n_complete;
  free(logits);
  free(ok);
  free(cand);
  free(text);
  json_vocab_free(v);
  free(tv.bytes);
  free(tv.lens);
  free(tv.special);
  free(pool);
  json_schema_free(sc);
}

TEST(walks_validate) {
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int done = 0;
    walks(&cases[i], 120, 99991 + i, &done);
    EXPECT_MSG(done >= 60, "%s: only %d walks completed", cases[i].name, done);
  }
}

/* ---- texts the recognizer takes or refuses ---------------------------------------------- */

typedef struct text_case {
  int schema; /* index in cases */
  const char *text;
  int ok; /* 1: a complete valid text; 0: refused somewhere */
} text_case;

static const text_case texts[] = {
    {0, "{'id':1,'x':'abc','tag':true}", 1},
    {0, "{'x':'ab','id':-3}", 1},
    {0, "{'id':1,'tag':'abc'}", 0}, /* a property, not an additional one */
    {0, "{'id':1,'x':'abcd'}", 0},  /* maxLength */
    {0, "{'id':1,'x':1}", 0},
    {0, "{'id':1,'i\\u0064':'a'}", 0}, /* an escaped spelling of a property's name */
    {0, "{'id':1,'id':2}", 0},
    {1, "{'a':0,'b':99}", 1},
    {1, "{'a':100}", 0},
    {1, "{'a':-1}", 0},
    {2, "{'a':4,'b':'x','c':null}", 1},
    {2, "{'a':6,'b':'x'}", 0},
    {2, "{'a':2,'b':'x'}", 0},
    {2, "{'a':4}", 0},
    {2, "{'a':4,'b':'x','d':1}", 0},
    {2, "{'a':4,'b':'x','c':1}", 0},
    {2, "{'b':'x','c':true,'a':3}", 0}, /* properties in the schema's order */
    {3, "{'n':-5,'m':8,'k':-49}", 1},
    {3, "{'n':119,'m':9,'k':98}", 1},
    {3, "{'n':120,'m':8,'k':0}", 0},
    {3, "{'n':-6,'m':8,'k':0}", 0},
    {3, "{'n':0,'m':7,'k':0}", 0},
    {3, "{'n':0,'m':8,'k':50}", 0},
    {3, "{'n':0,'m':8,'k':105}", 0},
    {3, "{'n':1.0,'m':8,'k':0}", 0},
    {3, "{'n':1e1,'m':8,'k':0}", 0},
    {4, "{'x':0.5,'y':0.001}", 1},
    {4, "{'x':2.249999,'y':-0.999999}", 1},
    {4, "{'x':2.25,'y':0}", 0},
    {4, "{'x':0.4999,'y':0}", 0},
    {4, "{'x':1,'y':-1}", 0},
    {4, "{'x':1,'y':0.0011}", 0},
    {4, "{'x':1,'y':0.0010001}", 0}, /* 7 fraction digits */
    {4, "{'x':1e0,'y':0}", 0},
    {5, "{'t':[1,'a']}", 1},
    {5, "{'t':[1],'u':[null,true,false]}", 1},
    {5, "{'t':[1,'a',2]}", 0},
    {5, "{'t':['a']}", 0},
    {5, "{'t':[]}", 0},
    {5, "{'t':[1],'u':[null]}", 0},
    {5, "{'t':[1],'u':[null,1]}", 0},
    {6,
     "{'d':'2024-02-29','t':'23:59:59.5+05:30','dt':'1999-12-31T00:00:00Z',"
     "'u':'123e4567-e89b-12d3-a456-426614174000'}",
     1},
    {6, "{'d':'2023-02-29'", 0},
    {6, "{'d':'1900-02-29'", 0},
    {6, "{'d':'2000-02-29','t':'24:00:00Z'", 0},
    {6, "{'d':'2000-04-31'", 0},
    {6, "{'d':'0000-01-01'", 0},
    {6, "{'d':'2000-01-01','t':'12:00:00'}", 0},
    {6, "{'d':'2000-01-01','t':'12:00:00Z','dt':'2000-01-01 12:00:00Z'", 0},
    {7, "{'v4':'255.0.10.1','v6':'::1','e':'a.b@c-d.example.org','w':'https://x.org/a?b#c'}", 1},
    {7, "{'v4':'256.0.0.1'", 0},
    {7, "{'v4':'01.0.0.1'", 0},
    {7, "{'v4':'1.2.3'}", 0},
    {7, "{'v4':'1.2.3.4','v6':'1:2:3:4:5:6:7:8:9'", 0},
    {7, "{'v4':'1.2.3.4','v6':'1::2::3'", 0},
    {7, "{'v4':'1.2.3.4','v6':'fe80::1','e':'a@b'}", 0},
    {7, "{'v4':'1.2.3.4','v6':'fe80::1','e':'a..b@c.de'", 0},
    {7, "{'v4':'1.2.3.4','v6':'fe80::1','e':'a@b.cd','w':'1http:'", 0},
    {7, "{'v4':'1.2.3.4','v6':'fe80::1','e':'a@b.cd','w':'h://a b'", 0},
    {7, "{'v4':'1.2.3.4','v6':'fe80::1','e':'a@b.cd','w':'h:%zz'", 0},
    {8, "{'ip':'10.0.0.1','when':'2024-02-29'}", 1},
    {8, "{'ip':'::ffff','when':'ab'}", 1},
    {8, "{'ip':null,'when':'now'}", 1},
    {8, "{'ip':null,'when':'a\\\\b'}", 1},
    {8, "{'ip':null,'when':'abc'}", 0},
    {8, "{'ip':null,'when':'2023-02-29'}", 0},
    {8, "{'ip':'1.2.3','when':'a'}", 0},
    {8, "{'ip':1,'when':'a'}", 0},
    {9, "{'p0':'ab-1','p1':'..xyz..','p2':'abcd.','p3':'A\\'\\\\','p4':'q'}", 1},
    {9, "{'p0':'abcd-1'", 0},
    {9, "{'p0':'ab-'}", 0},
    {9, "{'p0':'ab-1','p1':'xa'}", 0},
    {9, "{'p0':'ab-1','p1':'xy','p2':'abc'", 0},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'a'", 0},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'\\u0041'", 0}, /* no \u in patterned strings */
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'ABCDE'", 0},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'A','p4':'abq'}", 1},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'A','p4':'abcq'", 0},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'A','p4':'aq'}", 1},
    {9, "{'p0':'ab-1','p1':'xy','p2':'','p3':'A','p4':'qa'}", 0},
};

TEST(texts) {
  char err[256];
  json_schema *sc[sizeof cases / sizeof *cases];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    sc[i] = compile_q(cases[i].schema, err, sizeof err);
    EXPECT_MSG(sc[i], "%s: %s", cases[i].name, err);
    if (!sc[i]) return;
  }
  const char *b[] = {"{", "<eos>"};
  size_t l[] = {1, 5};
  unsigned char sp[] = {0, 1};
  int32_t eos[] = {1};
  json_vocab *v = json_vocab_new(2, b, l, sp, eos, 1);
  REQUIRE(v);
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    const text_case *t = &texts[i];
    json_mask *m = json_mask_new_schema(v, sc[t->schema]);
    REQUIRE(m);
    const char *s = q(t->text);
    int r = json_mask_feed(m, s, strlen(s));
    int ok = r == 0 && json_mask_complete(m);
    EXPECT_MSG(ok == t->ok, "%s: \"%s\": %s", cases[t->schema].name, s,
               t->ok ? "refused" : "taken");
    /* the valid ones also pass the reference */
    if (t->ok) {
      json_t *j = json_loads(s, 0, NULL);
      EXPECT_MSG(j && cases[t->schema].check(j), "reference refuses \"%s\"", s);
      json_decref(j);
    }
    json_mask_free(m);
  }
  json_vocab_free(v);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) json_schema_free(sc[i]);
}

/* ---- the pattern compiler against PCRE2 -------------------------------------------------- */

TEST(regex_vs_pcre) {
  static const char *const pats_[] = {"^\\d{3}-\\d{4}$",
                                      "ab+c",
                                      "^(a|b)*$",
                                      "^[^a-z]+$",
                                      "^.{2}$",
                                      "x{2,3}",
                                      "^a?b?c?$",
                                      "(foo|bar)baz",
                                      "^[\\w.-]+$",
                                      "^\\s*\\S+$",
                                      "^$",
                                      "a|b|c",
                                      "^[a-c\\-x]+$",
                                      "{",
                                      "a{,2}",
                                      "^(?:xy){2}$",
                                      "\\.",
                                      "^[0-9]{1,3}(,[0-9]{3})*$"};
  static const char *const strs[] = {
      "",       "a",     "ab",  "abc",   "123-4567", "abbbc", "xx",       "xxx", "x",   "foobaz",
      "barbaz", "a.b-c", "  z", " ",     "A",        "ABC",   "\xc3\xa9", "ac",  "-x",  "{",
      "a{,2}",  "xyxy",  "xy",  "1,234", "1,23",     "a\nb",  "\t",       "b",   "cab", "12"};
  for (size_t i = 0; i < sizeof pats_ / sizeof *pats_; i++) {
    regex_dfa d;
    char err[200];
    int rc = regex_dfa_compile(pats_[i], strlen(pats_[i]), 10000, &d, err, sizeof err);
    EXPECT_MSG(rc == 0, "%s: %s", pats_[i], err);
    if (rc) continue;
    for (size_t k = 0; k < sizeof strs / sizeof *strs; k++) {
      /* the automaton matches a subset (\S \D \W and '.' keep to what every validator
       * agrees on): the same on ASCII strings, never more on others */
      int a = regex_dfa_match(&d, (const unsigned char *)strs[k], strlen(strs[k]));
      int b = pcre_search(pats_[i], strs[k], strlen(strs[k]));
      int ascii = 1;
      for (const char *c = strs[k]; *c; c++) ascii &= (unsigned char)*c < 0x80;
      EXPECT_MSG(ascii ? a == b : a <= b, "/%s/ on \"%s\": dfa %d, pcre2 %d", pats_[i], strs[k], a,
                 b);
    }
    regex_dfa_free(&d);
  }
}

/* ---- refusals ---------------------------------------------------------------------------- */

TEST(refusals) {
  static const char *const bad[][2] = {
      {"{'type':'string','pattern':'(a)\\\\1'}", "backreferences '\\1' are not supported"},
      {"{'type':'string','pattern':'a(?=b)'}", "lookahead '(?=' is not supported"},
      {"{'type':'string','pattern':'(?<!a)b'}", "lookbehind '(?<!' is not supported"},
      {"{'type':'string','pattern':'a+?'}", "lazy quantifiers ('+?') are not supported"},
      {"{'type':'string','pattern':'\\\\p{L}'}",
       "Unicode property classes '\\p' are not supported"},
      {"{'type':'string','pattern':'\\\\bword'}", "word boundaries '\\b' are not supported"},
      {"{'type':'string','pattern':'a^b'}", "'^' is only supported as the pattern's first byte"},
      {"{'type':'string','pattern':'^a|b$'}", "'^' or '$' beside a top-level '|'"},
      {"{'type':'string','pattern':'[\\u00e9]'}", "non-ASCII characters inside '[ ]'"},
      {"{'type':'string','pattern':'(a'}", "'(' without its ')'"},
      {"{'type':'string','pattern':'a)'}", "unmatched ')'"},
      {"{'type':'string','pattern':'*a'}", "'*' has nothing to repeat"},
      {"{'type':'string','pattern':'a{1001}'}", "repetition counts above 1000"},
      {"{'type':'string','pattern':'^\\\\u0001$'}", "no string satisfies 'pattern'"},
      {"{'type':'string','pattern':'^abc$','maxLength':2}", "no string satisfies"},
      {"{'type':'string','format':'hostname'}", "'format' \"hostname\" is not supported"},
      {"{'type':'number','multipleOf':0.01}", "'multipleOf' 0.01 is not supported"},
      {"{'type':'integer','minimum':5,'maximum':4}", "no integer satisfies"},
      {"{'type':'integer','exclusiveMinimum':4,'exclusiveMaximum':5}", "no integer satisfies"},
      {"{'type':'integer','minimum':1,'maximum':6,'multipleOf':7}", "no integer satisfies"},
      {"{'type':'number','maximum':1e12}", "bounds beyond +-999999999"},
      {"{'type':'integer','minimum':1e300}", "bounds beyond +-2^53"},
      {"{'type':'integer','minimum':'1'}", "'minimum' must be a number"},
      {"{'allOf':[{'type':'string','pattern':'a'},{'pattern':'b'}]}",
       "'pattern' in two 'allOf' schemas is not supported"},
      {"{'allOf':[{'type':'string'},{'type':'integer'}]}", "types have nothing in common"},
      {"{'allOf':[{'enum':[1,2]},{'enum':[3]}]}", "no 'enum' value is in every 'allOf' schema"},
      {"{'type':'array','items':false}", "'items': false without 'prefixItems'"},
      {"{'type':'array','prefixItems':[{}],'items':false,'minItems':2}",
       "'minItems' is greater than the tuple's length"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char schema[512], err[512] = "";
    snprintf(schema, sizeof schema, "{'type':'object','properties':{'x':%s}}", bad[i][0]);
    json_schema *s = compile_q(schema, err, sizeof err);
    EXPECT_MSG(!s && strstr(err, bad[i][1]) && strstr(err, "(at #/properties/x"),
               "%s: \"%s\", expected \"%s\"", bad[i][0], err, bad[i][1]);
    json_schema_free(s);
  }
  char err[512] = "";
  json_schema *s = compile_q(
      "{'type':'object','properties':{'x':{'$ref':'#/$defs/a'}},"
      "'$defs':{'a':{'allOf':[{'$ref':'#/$defs/a'}]}}}",
      err, sizeof err);
  EXPECT_MSG(!s && strstr(err, "'allOf' merges more than 256 schemas (or refers to itself)"), "%s",
             err);
  json_schema_free(s);
}

/* ---- Python's verdicts ------------------------------------------------------------------ */

/* tests/fixtures/json_schema/formats.json (scripts/fixtures/json_format_refs.py: jsonschema's
 * format checker, pydantic's AnyUrl, re.search): the mask takes no string they refuse, and the
 * pattern automaton agrees with re.search on ASCII strings not ending in a newline (on others
 * it may match less: \S \D \W and '.' keep to what every validator agrees on, and $ is the
 * end of the string, as in ECMA). */
TEST(python_verdicts) {
  json_error_t e;
  json_t *fx = json_load_file("tests/fixtures/json_schema/formats.json", 0, &e);
  REQUIRE(fx);
  const char *b[] = {"{", "<eos>"};
  size_t l[] = {1, 5};
  unsigned char sp[] = {0, 1};
  int32_t eos[] = {1};
  json_vocab *v = json_vocab_new(2, b, l, sp, eos, 1);
  REQUIRE(v);
  const json_t *forms = json_object_get(fx, "formats");
  int taken = 0, valid = 0;
  char sch[256], err[256];
  json_schema *sc = NULL;
  const char *cur = "";
  for (size_t i = 0; i < json_array_size(forms); i++) {
    const json_t *r = json_array_get(forms, i);
    const char *fmt = json_string_value(json_array_get(r, 0));
    json_t *str = json_array_get(r, 1);
    int ok = json_is_true(json_array_get(r, 2));
    if (strcmp(fmt, cur)) {
      json_schema_free(sc);
      snprintf(sch, sizeof sch,
               "{'type':'object','properties':{'x':{'type':'string','format':'%s'}}}", fmt);
      sc = compile_q(sch, err, sizeof err);
      REQUIRE(sc);
      cur = fmt;
    }
    char *enc = json_dumps(str, JSON_ENCODE_ANY);
    char text[512];
    snprintf(text, sizeof text, "{\"x\":%s}", enc);
    free(enc);
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    int t = json_mask_feed(m, text, strlen(text)) == 0 && json_mask_complete(m);
    EXPECT_MSG(!t || ok, "format %s: the mask takes %s, which Python refuses", fmt, text);
    taken += t;
    valid += ok;
    json_mask_free(m);
  }
  json_schema_free(sc);
  printf("  formats: %d of %d strings Python takes are taken by the mask, none it refuses\n", taken,
         valid);
  const json_t *pats = json_object_get(fx, "patterns");
  int n_same = 0;
  for (size_t i = 0; i < json_array_size(pats); i++) {
    const json_t *r = json_array_get(pats, i);
    const char *pat = json_string_value(json_array_get(r, 0));
    const json_t *str = json_array_get(r, 1);
    const char *s = json_string_value(str);
    size_t n = json_string_length(str);
    int want = json_is_true(json_array_get(r, 2));
    regex_dfa d;
    REQUIRE(regex_dfa_compile(pat, strlen(pat), 100000, &d, err, sizeof err) == 0);
    int got = regex_dfa_match(&d, (const unsigned char *)s, n);
    regex_dfa_free(&d);
    /* Python's $ also matches before a final newline; ECMA's and the automaton's do not */
    int ascii = !n || s[n - 1] != '\n';
    for (size_t k = 0; k < n; k++) ascii &= (unsigned char)s[k] < 0x80;
    EXPECT_MSG(ascii ? got == want : got <= want, "/%s/ on \"%s\": automaton %d, re.search %d", pat,
               s, got, want);
    n_same += got == want;
  }
  printf("  patterns: %d of %zu verdicts the same as re.search's\n", n_same, json_array_size(pats));
  json_vocab_free(v);
  json_decref(fx);
}

/* ---- schemas as Pydantic and zod write them --------------------------------------------- */

TEST(pydantic_zod_schemas) {
  static const char *const ok[] = {
      /* Pydantic v2: HttpUrl, EmailStr, conint, confloat, constr, datetime, UUID, Dict, Tuple,
       * Optional, a nested model by $ref with a description (v1: allOf around the $ref) */
      "{'type':'object','properties':{'url':{'type':'string','format':'uri','minLength':1,"
      "'maxLength':2083},'email':{'type':'string','format':'email'},'age':{'type':'integer',"
      "'exclusiveMinimum':0,'maximum':150},'score':{'type':'number','minimum':0.0,"
      "'maximum':1.0},'code':{'type':'string','pattern':'^[A-Z]{3}$','maxLength':3},"
      "'at':{'type':'string','format':'date-time'},'id':{'type':'string','format':'uuid'},"
      "'counts':{'type':'object','additionalProperties':{'type':'integer'}},'pair':{'type':"
      "'array','prefixItems':[{'type':'integer'},{'type':'string'}],'minItems':2,"
      "'maxItems':2},'note':{'anyOf':[{'type':'string'},{'type':'null'}],'default':null},"
      "'owner':{'allOf':[{'$ref':'#/$defs/User'}],'description':'who'},'boss':{'$ref':"
      "'#/$defs/User','description':'v2 style'}},'required':['url','email','age'],"
      "'$defs':{'User':{'type':'object','properties':{'name':{'type':'string'}},"
      "'required':['name']}}}",
      /* zod (zod-to-json-schema): record, intersection, strict object, int, email, regex */
      "{'type':'object','properties':{'tags':{'type':'object','additionalProperties':"
      "{'type':'number','exclusiveMinimum':0}},'both':{'allOf':[{'type':'object','properties':"
      "{'a':{'type':'string'}},'required':['a']},{'type':'object','properties':{'b':{'type':"
      "'integer','minimum':-9007199254740991,'maximum':9007199254740991}},'required':['b']}]},"
      "'n':{'type':'integer','multipleOf':5},'mail':{'type':'string','format':'email'},"
      "'slug':{'type':'string','pattern':'^[a-z0-9]+(?:-[a-z0-9]+)*$'}},'required':['tags','both'],"
      "'additionalProperties':false,'$schema':'http://json-schema.org/draft-07/schema#'}",
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    char err[512] = "";
    json_schema *s = compile_q(ok[i], err, sizeof err);
    EXPECT_MSG(s, "schema %zu: %s", i, err);
    json_schema_free(s);
  }
  /* a union of strings (formats, patterns, lengths, string enums) is one automaton */
  char err[512] = "";
  json_schema *s = compile_q(
      "{'type':'object','properties':{'ip':{'type':'string','anyOf':[{'format':'ipv4'},"
      "{'format':'ipv6'}]}}}",
      err, sizeof err);
  EXPECT_MSG(s, "%s", err);
  json_schema_free(s);
}

/* ---- the real vocabulary ---------------------------------------------------------------- */

/* In the states the new keywords add (the mask against the brute-force reference on every id,
 * and the times of apply, prepare and a prepared apply, printed): patterned strings and keys
 * that may be additional walk every token that passes the first-byte filters. */
TEST(mask_real_vocab) {
  char err[256];
  const int n_logits = 151936;
  real_vocab rv;
  int loaded = rv_load(&rv, n_logits, 1, err, sizeof err);
  if (loaded == 0) return;
  EXPECT_MSG(loaded == 1, "real vocabulary: %s", err);
  if (loaded != 1) return;
  int im_end = tokenizer_token_id(rv.tok, "<|im_end|>");
  REQUIRE(im_end >= 0);
  rv.tv.eos[rv.tv.n_eos++] = im_end;
  json_vocab *v = tv_build(&rv.tv);
  REQUIRE(v);
  static const struct {
    int schema; /* in cases */
    const char *text, *label;
  } states[] = {
      {0, "{\"id\": 1, \"", "a key that may be additional"},
      {0, "{\"id\": 1, \"note", "in a key that may be additional"},
      {0, "{\"id\": 1, \"note\": \"a", "in an additional value"},
      {3, "{\"n\": ", "a bounded integer"},
      {3, "{\"n\": 1", "in a bounded integer"},
      {4, "{\"x\": 0.", "in a bounded number"},
      {6, "{\"d\": \"", "a date"},
      {6, "{\"d\": \"2024-0", "in a date"},
      {7, "{\"v4\": \"1.2.3.4\", \"v6\": \"::1\", \"e\": \"ada", "in an email"},
      {9, "{\"p0\": \"ab-1\", \"p1\": \"", "an unanchored pattern"},
      {9, "{\"p0\": \"ab-1\", \"p1\": \"some text x", "in an unanchored pattern"},
  };
  for (size_t i = 0; i < sizeof states / sizeof *states; i++) {
    json_schema *sc = compile_q(cases[states[i].schema].schema, err, sizeof err);
    EXPECT_MSG(sc, "%s", err);
    if (!sc) continue;
    json_mask *m = json_mask_new_schema(v, sc);
    REQUIRE(m);
    const char *t = states[i].text;
    EXPECT_MSG(json_mask_feed(m, t, strlen(t)) == 0, "%s refused", t);
    char why[512];
    EXPECT_MSG(!compare(&rv.tv, v, sc, m, t, strlen(t), n_logits, why, sizeof why), "%s: %.300s",
               states[i].label, why);
    double ms[3];
    apply_times(m, rv.logits, n_logits, ms);
    int n = 0;
    memset(rv.logits, 0, (size_t)n_logits * sizeof *rv.logits);
    json_mask_apply(m, rv.logits, n_logits);
    for (int k = 0; k < n_logits; k++) n += !isinf(rv.logits[k]);
    printf(
        "  json_mask_apply (schema) %-34s %6.3f ms/call (%6d allowed); prepare %6.3f, "
        "prepared apply %6.3f\n",
        states[i].label, ms[0], n, ms[1], ms[2]);
    json_mask_free(m);
    json_schema_free(sc);
  }
  json_vocab_free(v);
  rv_free(&rv);
}

int main(void) {
  RUN(refusals);
  RUN(regex_vs_pcre);
  RUN(texts);
  RUN(pydantic_zod_schemas);
  RUN(python_verdicts);
  RUN(walks_validate);
  RUN(mask_real_vocab);
  TEST_MAIN_END();
}
