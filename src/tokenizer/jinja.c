/* jinja — lexer, parser and renderer of the Jinja subset chat templates use (see jinja.h).
 *
 *   source ──jinja_lex──> tokens ──jp_*──> jnode tree (template arena)
 *                                                        │
 *   json_t context ──jinja_from_json──> jv values ──jinja_exec──> text (render arena)
 *
 * Memory: every AST node and every token lives in the template's arena; every value built while
 * rendering lives in the render's arena, dropped whole at the end, so values are shared freely
 * (lists and dicts are immutable, as in jinja2's immutable sandbox). Errors unwind with longjmp
 * to jinja_parse / jinja_template_render, which own the arenas: nothing else needs freeing.
 *
 * Python semantics kept where templates can see them: str() and repr() of values, float repr
 * (shortest round trip), code-point string indexing, jinja2's Undefined, per-iteration scopes
 * of for loops, whitespace control (trim_blocks, lstrip_blocks, `-` and `+` markers).
 * Not supported (no chat template we know uses them): recursive loops, include / import /
 * extends / block, and the do and i18n extensions; they are syntax errors here. */
#include "tokenizer/jinja.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ============================================================================================
 * Arena and errors
 * ========================================================================================== */

typedef struct jinja_blk {
  struct jinja_blk *next;
  size_t used, cap;
  max_align_t data[];
} jinja_blk;

typedef struct jinja_arena {
  jinja_blk *head;
  size_t total, limit;
} jinja_arena;

/* The unwinding context shared by the parser and the renderer. */
typedef struct jinja_ctx {
  jinja_arena ar;
  jmp_buf jb;
  char msg[512];
} jinja_ctx;

static _Noreturn void jinja_fail(jinja_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->msg, sizeof c->msg, fmt, ap);
  va_end(ap);
  for (char *p = c->msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  longjmp(c->jb, 1);
}

static void *jinja_alloc(jinja_ctx *c, size_t n) {
  jinja_arena *a = &c->ar;
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    if (a->total + cap > a->limit) jinja_fail(c, "LimitError: memory limit reached");
    jinja_blk *b = malloc(sizeof *b + cap);
    if (!b) jinja_fail(c, "MemoryError: out of memory");
    b->used = 0;
    b->cap = cap;
    a->total += cap;
    if (a->head && n > 65536) { /* a big block goes behind the current one */
      b->next = a->head->next;
      a->head->next = b;
      b->used = n;
      return b->data;
    }
    b->next = a->head;
    a->head = b;
  }
  void *p = (char *)a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

static void jinja_arena_free(jinja_arena *a) {
  for (jinja_blk *b = a->head, *n; b; b = n) {
    n = b->next;
    free(b);
  }
  a->head = NULL;
  a->total = 0;
}

static char *jinja_strndup(jinja_ctx *c, const char *s, size_t n) {
  char *p = jinja_alloc(c, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

/* A growable byte buffer in the arena; max bounds it (the output limit). */
typedef struct jinja_sb {
  char *p;
  size_t n, cap, max;
} jinja_sb;

static void jinja_sb_put(jinja_ctx *c, jinja_sb *b, const char *s, size_t n) {
  if (n == 0) return;
  if (b->n + n > b->max) jinja_fail(c, "LimitError: output limit reached");
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = jinja_alloc(c, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void jinja_sb_puts(jinja_ctx *c, jinja_sb *b, const char *s) {
  jinja_sb_put(c, b, s, strlen(s));
}

static void jinja_sb_printf(jinja_ctx *c, jinja_sb *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) jinja_sb_put(c, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ============================================================================================
 * Values
 * ========================================================================================== */

typedef enum {
  JV_UNDEF,
  JV_NONE,
  JV_BOOL,
  JV_INT,
  JV_FLOAT,
  JV_STR,
  JV_LIST,
  JV_DICT,
  JV_NS,
  JV_MACRO,
  JV_FUNC,
  JV_METH,
  JV_LOOP,
} jv_type;

typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
struct jnode;
struct jscope;
struct jloop;

struct jv {
  uint8_t t;
  uint8_t flag; /* STR: Markup; LIST: JL_*; UNDEF: 1 = unsafe attribute (SecurityError) */
  union {
    int64_t i;
    double f;
    struct {
      const char *p; /* UNDEF: the message an access of it raises (NULL = generic) */
      size_t n;
    } s;
    jlist *l;
    jdict *d;
    struct jmacro *m;
    struct jmeth *me;
    struct jloop *lp;
  } u;
};

struct jlist {
  jv *v;
  size_t n, cap;
};

struct jdict {
  jv *k, *v;
  size_t n, cap;
};

typedef struct jmacro {
  const struct jnode *node;
  struct jscope *closure;
} jmacro;

typedef struct jmeth {
  jv self;
  const char *name;
} jmeth;

typedef struct jloop {
  jlist *items;
  size_t i;
} jloop;

/* What a JV_LIST stands for in Python: the filters map, select, reject, selectattr, rejectattr,
 * unique and reverse return generators, which iterate but have no len(), no JSON form, no
 * items by index, and are always true. */
enum { JL_LIST, JL_TUPLE, JL_GEN };

enum { JF_RANGE, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_DICT };

static const jv jv_undef_v = {JV_UNDEF, 0, {0}};
static const jv jv_none_v = {JV_NONE, 0, {0}};

static jv jv_bool(int b) {
  jv v = {JV_BOOL, 0, {0}};
  v.u.i = b != 0;
  return v;
}
static jv jv_int(int64_t i) {
  jv v = {JV_INT, 0, {0}};
  v.u.i = i;
  return v;
}
static jv jv_float(double f) {
  jv v = {JV_FLOAT, 0, {0}};
  v.u.f = f;
  return v;
}
static jv jv_strn(const char *p, size_t n) {
  jv v = {JV_STR, 0, {0}};
  v.u.s.p = p;
  v.u.s.n = n;
  return v;
}
static jv jv_undef_msg(const char *msg) {
  jv v = jv_undef_v;
  v.u.s.p = msg;
  return v;
}

static jv jv_list_new(jinja_ctx *c, size_t cap, int tuple) {
  jv v = {JV_LIST, (uint8_t)tuple, {0}};
  v.u.l = jinja_alloc(c, sizeof(jlist));
  v.u.l->n = 0;
  v.u.l->cap = cap;
  v.u.l->v = cap ? jinja_alloc(c, cap * sizeof(jv)) : NULL;
  return v;
}

static void jv_list_push(jinja_ctx *c, jlist *l, jv x) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    jv *p = jinja_alloc(c, cap * sizeof(jv));
    if (l->n) memcpy(p, l->v, l->n * sizeof(jv));
    l->v = p;
    l->cap = cap;
  }
  l->v[l->n++] = x;
}

static jv jv_dict_new(jinja_ctx *c, size_t cap, int ns) {
  jv v = {(uint8_t)(ns ? JV_NS : JV_DICT), 0, {0}};
  v.u.d = jinja_alloc(c, sizeof(jdict));
  v.u.d->n = 0;
  v.u.d->cap = cap;
  v.u.d->k = cap ? jinja_alloc(c, cap * sizeof(jv)) : NULL;
  v.u.d->v = cap ? jinja_alloc(c, cap * sizeof(jv)) : NULL;
  return v;
}

static int jv_eq(jv a, jv b);
static int jv_eq_d(jv a, jv b, int depth);

static jv *jv_dict_find(jdict *d, jv k) {
  for (size_t i = 0; i < d->n; i++)
    if (jv_eq(d->k[i], k)) return &d->v[i];
  return NULL;
}

static jv *jv_dict_finds(jdict *d, const char *k, size_t n) {
  for (size_t i = 0; i < d->n; i++)
    if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n)) return &d->v[i];
  return NULL;
}

static void jv_dict_set(jinja_ctx *c, jdict *d, jv k, jv v) {
  jv *p = jv_dict_find(d, k);
  if (p) {
    *p = v;
    return;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 8;
    jv *nk = jinja_alloc(c, cap * sizeof(jv)), *nv = jinja_alloc(c, cap * sizeof(jv));
    if (d->n) {
      memcpy(nk, d->k, d->n * sizeof(jv));
      memcpy(nv, d->v, d->n * sizeof(jv));
    }
    d->k = nk;
    d->v = nv;
    d->cap = cap;
  }
  d->k[d->n] = k;
  d->v[d->n++] = v;
}

static int jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double jv_num(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)v.u.i; }

static int jv_eq_d(jv a, jv b, int depth) {
  if (depth > 1000) return 0;
  if (jv_is_num(a) && jv_is_num(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i == b.u.i;
    return jv_num(a) == jv_num(b);
  }
  if (a.t != b.t) return 0;
  switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
      return 1;
    case JV_STR:
      return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
      if (a.flag != b.flag || a.u.l->n != b.u.l->n) return 0;
      for (size_t i = 0; i < a.u.l->n; i++)
        if (!jv_eq_d(a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
      return 1;
    case JV_DICT:
      if (a.u.d->n != b.u.d->n) return 0;
      for (size_t i = 0; i < a.u.d->n; i++) {
        jv *o = jv_dict_find(b.u.d, a.u.d->k[i]);
        if (!o || !jv_eq_d(a.u.d->v[i], *o, depth + 1)) return 0;
      }
      return 1;
    case JV_NS:
      return a.u.d == b.u.d;
    case JV_MACRO:
      return a.u.m == b.u.m;
    case JV_METH:
      return a.u.me == b.u.me;
    case JV_LOOP:
      return a.u.lp == b.u.lp;
    default:
      return a.u.i == b.u.i;
  }
}

static int jv_eq(jv a, jv b) { return jv_eq_d(a, b, 0); }

static int jv_truthy(jv v) {
  switch (v.t) {
    case JV_UNDEF:
    case JV_NONE:
      return 0;
    case JV_BOOL:
    case JV_INT:
      return v.u.i != 0;
    case JV_FLOAT:
      return v.u.f != 0;
    case JV_STR:
      return v.u.s.n > 0;
    case JV_LIST:
      return v.flag == JL_GEN || v.u.l->n > 0;
    case JV_DICT:
      return v.u.d->n > 0;
    default:
      return 1;
  }
}

static const char *jv_type_name(jv v) {
  switch (v.t) {
    case JV_UNDEF:
      return "Undefined";
    case JV_NONE:
      return "NoneType";
    case JV_BOOL:
      return "bool";
    case JV_INT:
      return "int";
    case JV_FLOAT:
      return "float";
    case JV_STR:
      return v.flag ? "Markup" : "str";
    case JV_LIST:
      return v.flag == JL_TUPLE ? "tuple" : v.flag == JL_GEN ? "generator" : "list";
    case JV_DICT:
      return "dict";
    case JV_NS:
      return "Namespace";
    case JV_MACRO:
      return "Macro";
    case JV_LOOP:
      return "LoopContext";
    default:
      return "builtin_function_or_method";
  }
}

/* ---- UTF-8 helpers: Python indexes strings by code point ----
 * A character starts at byte 0 and at every byte that is not a continuation byte (10xxxxxx), so
 * that counting, indexing and iterating agree on invalid UTF-8 too. */

static size_t jinja_u8_len(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += i == 0 || ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

/* byte offset of code point index cp (cp <= length) */
static size_t jinja_u8_off(const char *s, size_t n, size_t cp) {
  size_t i = 0;
  while (i < n && cp > 0) {
    i++;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    cp--;
  }
  return i;
}

static size_t jinja_u8_next(const char *s, size_t n, size_t i, int32_t *cp) {
  utf8proc_int32_t c;
  utf8proc_ssize_t k =
      utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
  if (k <= 0) {
    *cp = (unsigned char)s[i];
    return i + 1;
  }
  *cp = c;
  return i + (size_t)k;
}

static void jinja_sb_cp(jinja_ctx *c, jinja_sb *b, int32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
  jinja_sb_put(c, b, (const char *)buf, (size_t)k);
}

/* ---- str() and repr() as Python prints them ---- */

static void jinja_float_repr(double d, char *out, size_t outlen, int json) {
  if (isnan(d)) {
    snprintf(out, outlen, "%s", json ? "NaN" : "nan");
    return;
  }
  if (isinf(d)) {
    snprintf(out, outlen, "%s",
             d < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
    return;
  }
  char tmp[40];
  int prec;
  for (prec = 1; prec < 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
    if (strtod(tmp, NULL) == d) break;
  }
  snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
  char digits[40];
  int nd = 0, neg = 0;
  const char *p = tmp;
  if (*p == '-') {
    neg = 1;
    p++;
  }
  for (; *p && *p != 'e'; p++)
    if (isdigit((unsigned char)*p)) digits[nd++] = *p;
  int e = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  digits[nd] = 0;
  char *o = out;
  size_t left = outlen;
#define JINJA_EMIT(...)                                           \
  do {                                                            \
    int _k = snprintf(o, left, __VA_ARGS__);                      \
    if (_k > 0 && (size_t)_k < left) o += _k, left -= (size_t)_k; \
  } while (0)
  if (neg) JINJA_EMIT("-");
  if (e < -4 || e >= 16) {
    JINJA_EMIT("%c", digits[0]);
    if (nd > 1) JINJA_EMIT(".%s", digits + 1);
    JINJA_EMIT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  } else if (e >= 0) {
    for (int i = 0; i <= e; i++) JINJA_EMIT("%c", i < nd ? digits[i] : '0');
    JINJA_EMIT(".");
    if (nd > e + 1)
      JINJA_EMIT("%s", digits + e + 1);
    else
      JINJA_EMIT("0");
  } else {
    JINJA_EMIT("0.");
    for (int i = 0; i < -e - 1; i++) JINJA_EMIT("0");
    JINJA_EMIT("%s", digits);
  }
#undef JINJA_EMIT
}

static int jinja_py_printable(int32_t cp) {
  if (cp == ' ') return 1;
  if (cp < 0x20 || cp == 0x7f) return 0;
  if (cp < 0x7f) return 1;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return 0;
    default:
      return 1;
  }
}

static void jinja_repr_str(jinja_ctx *c, jinja_sb *b, const char *s, size_t n) {
  int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  jinja_sb_put(c, b, &q, 1);
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t j = jinja_u8_next(s, n, i, &cp);
    if (cp == q || cp == '\\') {
      char e[2] = {'\\', (char)cp};
      jinja_sb_put(c, b, e, 2);
    } else if (cp == '\n') {
      jinja_sb_puts(c, b, "\\n");
    } else if (cp == '\r') {
      jinja_sb_puts(c, b, "\\r");
    } else if (cp == '\t') {
      jinja_sb_puts(c, b, "\\t");
    } else if (!jinja_py_printable(cp)) {
      if (cp < 0x100)
        jinja_sb_printf(c, b, "\\x%02x", cp);
      else if (cp < 0x10000)
        jinja_sb_printf(c, b, "\\u%04x", cp);
      else
        jinja_sb_printf(c, b, "\\U%08x", cp);
    } else {
      jinja_sb_put(c, b, s + i, j - i);
    }
    i = j;
  }
  jinja_sb_put(c, b, &q, 1);
}

static void jinja_str_into(jinja_ctx *c, jinja_sb *b, jv v, int depth);

static void jinja_repr_into(jinja_ctx *c, jinja_sb *b, jv v, int depth) {
  if (v.t == JV_STR) {
    if (v.flag) jinja_sb_puts(c, b, "Markup(");
    jinja_repr_str(c, b, v.u.s.p, v.u.s.n);
    if (v.flag) jinja_sb_puts(c, b, ")");
  } else if (v.t == JV_UNDEF) {
    jinja_sb_puts(c, b, "Undefined");
  } else {
    jinja_str_into(c, b, v, depth);
  }
}

/* None, bool, int and float as Python's str() (json = 0) or json.dumps (json = 1) prints
 * them; returns 0, printing nothing, for the other types */
static int jinja_scalar_into(jinja_ctx *c, jinja_sb *b, jv v, int json) {
  char tmp[64];
  switch (v.t) {
    case JV_NONE:
      jinja_sb_puts(c, b, json ? "null" : "None");
      return 1;
    case JV_BOOL:
      jinja_sb_puts(c, b, v.u.i ? (json ? "true" : "True") : (json ? "false" : "False"));
      return 1;
    case JV_INT:
      jinja_sb_printf(c, b, "%lld", (long long)v.u.i);
      return 1;
    case JV_FLOAT:
      jinja_float_repr(v.u.f, tmp, sizeof tmp, json);
      jinja_sb_puts(c, b, tmp);
      return 1;
    default:
      return 0;
  }
}

static void jinja_str_into(jinja_ctx *c, jinja_sb *b, jv v, int depth) {
  if (depth > 500) jinja_fail(c, "RecursionError: maximum recursion depth exceeded in repr");
  if (jinja_scalar_into(c, b, v, 0)) return;
  switch (v.t) {
    case JV_UNDEF:
      return;
    case JV_STR:
      jinja_sb_put(c, b, v.u.s.p, v.u.s.n);
      return;
    case JV_LIST:
      if (v.flag == JL_GEN) {
        jinja_sb_puts(c, b, "<generator object>");
        return;
      }
      jinja_sb_puts(c, b, v.flag ? "(" : "[");
      for (size_t i = 0; i < v.u.l->n; i++) {
        if (i) jinja_sb_puts(c, b, ", ");
        jinja_repr_into(c, b, v.u.l->v[i], depth + 1);
      }
      if (v.flag && v.u.l->n == 1) jinja_sb_puts(c, b, ",");
      jinja_sb_puts(c, b, v.flag ? ")" : "]");
      return;
    case JV_NS:
      jinja_sb_puts(c, b, "<Namespace ");
      /* fall through */
    case JV_DICT:
      jinja_sb_puts(c, b, "{");
      for (size_t i = 0; i < v.u.d->n; i++) {
        if (i) jinja_sb_puts(c, b, ", ");
        jinja_repr_into(c, b, v.u.d->k[i], depth + 1);
        jinja_sb_puts(c, b, ": ");
        jinja_repr_into(c, b, v.u.d->v[i], depth + 1);
      }
      jinja_sb_puts(c, b, v.t == JV_NS ? "}>" : "}");
      return;
    case JV_MACRO:
      jinja_sb_puts(c, b, "<Macro>");
      return;
    case JV_LOOP:
      jinja_sb_puts(c, b, "<LoopContext>");
      return;
    default:
      jinja_sb_puts(c, b, "<built-in method>");
      return;
  }
}

static jv jinja_to_str(jinja_ctx *c, jv v) {
  if (v.t == JV_STR) return v;
  jinja_sb b = {0};
  b.max = SIZE_MAX;
  jinja_str_into(c, &b, v, 0);
  return jv_strn(b.p ? b.p : "", b.n);
}

/* ---- json.dumps(x, ensure_ascii=False, indent, separators, sort_keys) ---- */

typedef struct jinja_json_opts {
  const char *indent; /* NULL = no newlines */
  const char *item_sep, *key_sep;
  int sort_keys;
} jinja_json_opts;

static void jinja_json_str(jinja_ctx *c, jinja_sb *b, const char *s, size_t n) {
  jinja_sb_put(c, b, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    const char *esc = NULL;
    char u[8];
    if (ch == '"')
      esc = "\\\"";
    else if (ch == '\\')
      esc = "\\\\";
    else if (ch == '\n')
      esc = "\\n";
    else if (ch == '\r')
      esc = "\\r";
    else if (ch == '\t')
      esc = "\\t";
    else if (ch == '\b')
      esc = "\\b";
    else if (ch == '\f')
      esc = "\\f";
    else if (ch < 0x20) {
      snprintf(u, sizeof u, "\\u%04x", ch);
      esc = u;
    }
    if (esc) {
      jinja_sb_put(c, b, s + run, i - run);
      jinja_sb_puts(c, b, esc);
      run = i + 1;
    }
  }
  jinja_sb_put(c, b, s + run, n - run);
  jinja_sb_put(c, b, "\"", 1);
}

static int jv_lt(jinja_ctx *c, jv a, jv b);

static void jinja_json_into(jinja_ctx *c, jinja_sb *b, jv v, const jinja_json_opts *o, int depth) {
  if (depth > 200) jinja_fail(c, "RecursionError: maximum recursion depth exceeded in tojson");
  if (jinja_scalar_into(c, b, v, 1)) return;
  switch (v.t) {
    case JV_STR:
      jinja_json_str(c, b, v.u.s.p, v.u.s.n);
      return;
    case JV_LIST:
    case JV_DICT: {
      int is_list = v.t == JV_LIST;
      if (is_list && v.flag == JL_GEN)
        jinja_fail(c, "TypeError: Object of type generator is not JSON serializable");
      size_t n = is_list ? v.u.l->n : v.u.d->n;
      if (n == 0) {
        jinja_sb_puts(c, b, is_list ? "[]" : "{}");
        return;
      }
      size_t *ord = jinja_alloc(c, n * sizeof(size_t));
      for (size_t i = 0; i < n; i++) ord[i] = i;
      if (!is_list && o->sort_keys) /* insertion sort: stable, as Python's sorted */
        for (size_t i = 1; i < n; i++)
          for (size_t j = i; j > 0 && jv_lt(c, v.u.d->k[ord[j]], v.u.d->k[ord[j - 1]]); j--) {
            size_t t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
          }
      jinja_sb_puts(c, b, is_list ? "[" : "{");
      for (size_t k = 0; k < n; k++) {
        size_t i = ord[k];
        if (k) jinja_sb_puts(c, b, o->item_sep);
        if (o->indent) {
          jinja_sb_puts(c, b, "\n");
          for (int d = 0; d <= depth; d++) jinja_sb_puts(c, b, o->indent);
        }
        if (is_list) {
          jinja_json_into(c, b, v.u.l->v[i], o, depth + 1);
        } else {
          jv key = v.u.d->k[i];
          if (key.t == JV_STR)
            jinja_json_str(c, b, key.u.s.p, key.u.s.n);
          else if (key.t == JV_INT || key.t == JV_FLOAT || key.t == JV_BOOL || key.t == JV_NONE) {
            jinja_sb_puts(c, b, "\"");
            jinja_json_into(c, b, key, o, depth + 1);
            jinja_sb_puts(c, b, "\"");
          } else
            jinja_fail(c, "TypeError: keys must be str, int, float, bool or None, not %s",
                       jv_type_name(key));
          jinja_sb_puts(c, b, o->key_sep);
          jinja_json_into(c, b, v.u.d->v[i], o, depth + 1);
        }
      }
      if (o->indent) {
        jinja_sb_puts(c, b, "\n");
        for (int d = 0; d < depth; d++) jinja_sb_puts(c, b, o->indent);
      }
      jinja_sb_puts(c, b, is_list ? "]" : "}");
      return;
    }
    default:
      jinja_fail(c, "TypeError: Object of type %s is not JSON serializable", jv_type_name(v));
  }
}

/* ---- from jansson ---- */

static jv jinja_from_json(jinja_ctx *c, const json_t *j, int depth) {
  if (depth > 1000) jinja_fail(c, "LimitError: context nested too deeply");
  switch (json_typeof(j)) {
    case JSON_OBJECT: {
      jv d = jv_dict_new(c, json_object_size(j), 0);
      const char *k;
      json_t *x;
      json_object_foreach((json_t *)j, k, x) {
        d.u.d->k[d.u.d->n] = jv_strn(k, strlen(k));
        d.u.d->v[d.u.d->n++] = jinja_from_json(c, x, depth + 1);
      }
      return d;
    }
    case JSON_ARRAY: {
      jv l = jv_list_new(c, json_array_size(j), 0);
      size_t i;
      json_t *x;
      json_array_foreach(j, i, x) l.u.l->v[l.u.l->n++] = jinja_from_json(c, x, depth + 1);
      return l;
    }
    case JSON_STRING:
      return jv_strn(json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
      return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL:
      return jv_float(json_real_value(j));
    case JSON_TRUE:
      return jv_bool(1);
    case JSON_FALSE:
      return jv_bool(0);
    default:
      return jv_none_v;
  }
}

/* ============================================================================================
 * Lexer
 * ========================================================================================== */

typedef enum {
  JT_TEXT,
  JT_VBEGIN,
  JT_VEND,
  JT_BBEGIN,
  JT_BEND,
  JT_NAME,
  JT_STR,
  JT_INT,
  JT_FLOAT,
  JT_OP,
  JT_EOF,
} jinja_tok_type;

typedef struct jinja_tok {
  int type, line;
  const char *s; /* TEXT, NAME, STR (decoded), OP */
  size_t n;
  int64_t i;
  double f;
} jinja_tok;

typedef struct jinja_lexer {
  jinja_ctx *c;
  const char *src;
  size_t n, pos;
  int line;
  jinja_tok *toks;
  size_t ntoks, cap;
} jinja_lexer;

static void jinja_lex_push(jinja_lexer *L, int type, const char *s, size_t n) {
  if (L->ntoks == L->cap) {
    size_t cap = L->cap ? L->cap * 2 : 256;
    jinja_tok *t = jinja_alloc(L->c, cap * sizeof *t);
    if (L->ntoks) memcpy(t, L->toks, L->ntoks * sizeof *t);
    L->toks = t;
    L->cap = cap;
  }
  jinja_tok *t = &L->toks[L->ntoks++];
  memset(t, 0, sizeof *t);
  t->type = type;
  t->line = L->line;
  t->s = s;
  t->n = n;
}

static int jinja_lines(const char *s, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += s[i] == '\n';
  return k;
}

static int jinja_is_ws(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Emits the text before a tag with jinja2's whitespace control applied: '-' strips all
 * trailing whitespace; otherwise (lstrip_blocks) a block or comment tag preceded on its line by
 * whitespace only takes that whitespace away. */
static void jinja_lex_text(jinja_lexer *L, const char *s, size_t n, char sign, int lstrip,
                           int line_starting) {
  size_t keep = n;
  if (sign == '-') {
    while (keep > 0 && jinja_is_ws(s[keep - 1])) keep--;
  } else if (sign != '+' && lstrip) {
    size_t lpos = n;
    while (lpos > 0 && s[lpos - 1] != '\n') lpos--;
    if (lpos > 0 || line_starting) {
      int all_ws = lpos < n;
      for (size_t i = lpos; i < n; i++)
        if (!jinja_is_ws(s[i])) all_ws = 0;
      if (all_ws) keep = lpos;
    }
  }
  if (keep) jinja_lex_push(L, JT_TEXT, s, keep);
  L->line += jinja_lines(s, n);
}

/* Decodes a string literal body the way Python's unicode-escape codec does. */
static const char *jinja_lex_unescape(jinja_lexer *L, const char *s, size_t n, size_t *outn) {
  jinja_sb b = {0};
  b.max = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\' || i + 1 >= n) {
      jinja_sb_put(L->c, &b, s + i, 1);
      continue;
    }
    char e = s[++i];
    int32_t cp = -1;
    int hex = 0;
    switch (e) {
      case 'n':
        cp = '\n';
        break;
      case 't':
        cp = '\t';
        break;
      case 'r':
        cp = '\r';
        break;
      case 'a':
        cp = 7;
        break;
      case 'b':
        cp = 8;
        break;
      case 'f':
        cp = 12;
        break;
      case 'v':
        cp = 11;
        break;
      case '\\':
        cp = '\\';
        break;
      case '\'':
        cp = '\'';
        break;
      case '"':
        cp = '"';
        break;
      case '\n':
        continue;
      case 'x':
        hex = 2;
        break;
      case 'u':
        hex = 4;
        break;
      case 'U':
        hex = 8;
        break;
      default:
        if (e >= '0' && e <= '7') {
          cp = 0;
          int k = 0;
          while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + (s[i++] - '0'), k++;
          i--;
        }
    }
    if (hex) {
      cp = 0;
      for (int k = 0; k < hex; k++) {
        if (i + 1 >= n || !isxdigit((unsigned char)s[i + 1]))
          jinja_fail(L->c, "syntax error: truncated \\%c escape in a string (line %d)", e, L->line);
        char h = s[++i];
        cp = cp * 16 +
             (isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
      }
      if (cp > 0x10FFFF)
        jinja_fail(L->c, "syntax error: illegal Unicode character (line %d)", L->line);
    }
    if (cp >= 0)
      jinja_sb_cp(L->c, &b, cp);
    else {
      char two[2] = {'\\', e};
      jinja_sb_put(L->c, &b, two, 2);
    }
  }
  *outn = b.n;
  return b.p ? b.p : "";
}

/* Tokens inside {{ }} or {% %}; returns when the closing marker is consumed. */
static int jinja_lex_tag(jinja_lexer *L, int block) {
  const char *s = L->src;
  int depth = 0;
  for (;;) {
    while (L->pos < L->n && jinja_is_ws(s[L->pos])) {
      if (s[L->pos] == '\n') L->line++;
      L->pos++;
    }
    if (L->pos >= L->n)
      jinja_fail(L->c, "syntax error: unexpected end of template inside a tag (line %d)", L->line);
    const char *p = s + L->pos;
    size_t left = L->n - L->pos;
    char e0 = block ? '%' : '}';
    if (depth == 0) {
      if (left >= 3 && p[0] == '-' && p[1] == e0 && p[2] == '}') {
        jinja_lex_push(L, block ? JT_BEND : JT_VEND, NULL, 0);
        L->pos += 3;
        while (L->pos < L->n && jinja_is_ws(s[L->pos])) {
          if (s[L->pos] == '\n') L->line++;
          L->pos++;
        }
        return L->pos > 0 && s[L->pos - 1] == '\n';
      }
      if (block && left >= 3 && p[0] == '+' && p[1] == '%' && p[2] == '}') {
        jinja_lex_push(L, JT_BEND, NULL, 0);
        L->pos += 3;
        return 0;
      }
      if (left >= 2 && p[0] == e0 && p[1] == '}') {
        jinja_lex_push(L, block ? JT_BEND : JT_VEND, NULL, 0);
        L->pos += 2;
        if (block && L->pos < L->n && s[L->pos] == '\n') {
          L->pos++;
          L->line++;
          return 1;
        }
        return 0;
      }
    }
    unsigned char ch = (unsigned char)*p;
    if (isalpha(ch) || ch == '_') {
      size_t k = 1;
      while (k < left && (isalnum((unsigned char)p[k]) || p[k] == '_')) k++;
      jinja_lex_push(L, JT_NAME, p, k);
      L->pos += k;
    } else if (isdigit(ch)) {
      size_t k = 0;
      int is_float = 0;
      while (k < left && (isdigit((unsigned char)p[k]) ||
                          (p[k] == '_' && k + 1 < left && isdigit((unsigned char)p[k + 1]))))
        k++;
      if (k + 1 < left && p[k] == '.' && isdigit((unsigned char)p[k + 1])) {
        is_float = 1;
        k++;
        while (k < left && (isdigit((unsigned char)p[k]) || p[k] == '_')) k++;
      }
      if (k < left && (p[k] == 'e' || p[k] == 'E')) {
        size_t m = k + 1;
        if (m < left && (p[m] == '+' || p[m] == '-')) m++;
        if (m < left && isdigit((unsigned char)p[m])) {
          is_float = 1;
          k = m;
          while (k < left && isdigit((unsigned char)p[k])) k++;
        }
      }
      if (!is_float && p[0] == '0') { /* an integer is 0 or starts 1-9: "05" lexes as 0, 5 */
        k = 1;
        while (k + 1 < left && ((p[k] == '0') || (p[k] == '_' && p[k + 1] == '0')))
          k += p[k] == '_' ? 2 : 1;
        if (k < left && p[k] == '0') k++;
      }
      char num[64];
      size_t nn = 0;
      for (size_t i = 0; i < k && nn < sizeof num - 1; i++)
        if (p[i] != '_') num[nn++] = p[i];
      num[nn] = 0;
      jinja_lex_push(L, is_float ? JT_FLOAT : JT_INT, p, k);
      if (is_float)
        L->toks[L->ntoks - 1].f = strtod(num, NULL);
      else {
        char *end;
        errno = 0;
        long long v = strtoll(num, &end, 10);
        if (errno) jinja_fail(L->c, "syntax error: integer literal too large (line %d)", L->line);
        L->toks[L->ntoks - 1].i = v;
      }
      L->pos += k;
    } else if (ch == '\'' || ch == '"') {
      size_t k = 1;
      while (k < left && p[k] != (char)ch) k += p[k] == '\\' ? 2 : 1;
      if (k >= left) jinja_fail(L->c, "syntax error: unexpected char %c (line %d)", ch, L->line);
      size_t dn;
      const char *d = jinja_lex_unescape(L, p + 1, k - 1, &dn);
      jinja_lex_push(L, JT_STR, d, dn);
      L->line += jinja_lines(p, k);
      L->pos += k + 1;
    } else {
      static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
      size_t k = 0;
      for (size_t i = 0; i < sizeof ops2 / sizeof *ops2; i++)
        if (left >= 2 && p[0] == ops2[i][0] && p[1] == ops2[i][1]) k = 2;
      if (!k) {
        if (!strchr("+-/*%~[](){}<>=.:|,", ch) || ch == 0)
          jinja_fail(L->c, "syntax error: unexpected char '%c' (line %d)", ch, L->line);
        k = 1;
        if (ch == '(' || ch == '[' || ch == '{') depth++;
        if (ch == ')' || ch == ']' || ch == '}') {
          if (depth == 0) jinja_fail(L->c, "syntax error: unexpected '%c' (line %d)", ch, L->line);
          depth--;
        }
      }
      jinja_lex_push(L, JT_OP, p, k);
      L->pos += k;
    }
  }
}

static int jinja_match_word(const char *p, size_t left, const char *w, size_t *k) {
  size_t i = 0;
  while (i < left && jinja_is_ws(p[i])) i++;
  size_t wn = strlen(w);
  if (left - i < wn || memcmp(p + i, w, wn)) return 0;
  i += wn;
  if (i < left && (isalnum((unsigned char)p[i]) || p[i] == '_')) return 0;
  while (i < left && jinja_is_ws(p[i])) i++;
  *k = i;
  return 1;
}

static void jinja_lex(jinja_lexer *L) {
  const char *s = L->src;
  int line_starting = 1;
  while (L->pos < L->n) {
    size_t start = L->pos, q = start;
    while (q + 1 < L->n &&
           !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')))
      q++;
    if (q + 1 >= L->n) { /* trailing data */
      jinja_lex_text(L, s + start, L->n - start, 0, 0, 0);
      L->pos = L->n;
      break;
    }
    char kind = s[q + 1];
    char sign = (q + 2 < L->n && (s[q + 2] == '-' || s[q + 2] == '+')) ? s[q + 2] : 0;
    size_t after = q + 2 + (sign ? 1 : 0);
    /* {% raw %} */
    size_t k;
    if (kind == '%' && jinja_match_word(s + after, L->n - after, "raw", &k)) {
      size_t e = after + k;
      int closed = 0;
      if (e + 2 < L->n + 1 && e + 2 <= L->n && s[e] == '-' && e + 2 < L->n && s[e + 1] == '%' &&
          s[e + 2] == '}') {
        e += 3;
        while (e < L->n && jinja_is_ws(s[e])) e++;
        closed = 1;
      } else if (e + 1 < L->n && s[e] == '%' && s[e + 1] == '}') {
        e += 2;
        closed = 1;
      }
      if (closed) {
        jinja_lex_text(L, s + start, q - start, sign, 1, line_starting);
        if (e >= L->n) break; /* "{% raw %}" closing the source: jinja2 drops it */
        L->line += jinja_lines(s + q, e - q);
        /* find {% endraw %} */
        size_t r = e;
        for (;;) {
          while (r + 1 < L->n && !(s[r] == '{' && s[r + 1] == '%')) r++;
          if (r + 1 >= L->n)
            jinja_fail(L->c, "syntax error: Missing end of raw directive (line %d)", L->line);
          char rs = (r + 2 < L->n && (s[r + 2] == '-' || s[r + 2] == '+')) ? s[r + 2] : 0;
          size_t a2 = r + 2 + (rs ? 1 : 0), k2;
          if (jinja_match_word(s + a2, L->n - a2, "endraw", &k2)) {
            size_t x = a2 + k2, end = 0;
            int ls = 0;
            if (x + 2 < L->n && s[x] == '-' && s[x + 1] == '%' && s[x + 2] == '}') {
              end = x + 3;
              while (end < L->n && jinja_is_ws(s[end])) end++;
            } else if (x + 2 < L->n && s[x] == '+' && s[x + 1] == '%' && s[x + 2] == '}') {
              end = x + 3;
            } else if (x + 1 < L->n && s[x] == '%' && s[x + 1] == '}') {
              end = x + 2;
              if (end < L->n && s[end] == '\n') end++;
            }
            if (end) {
              jinja_lex_text(L, s + e, r - e, rs, 1, 0);
              L->line += jinja_lines(s + r, end - r);
              ls = end > 0 && s[end - 1] == '\n';
              L->pos = end;
              line_starting = ls;
              break;
            }
          }
          r++;
        }
        continue;
      }
    }
    jinja_lex_text(L, s + start, q - start, sign, kind != '{', line_starting);
    L->pos = after;
    if (kind == '#') {
      if (after >= L->n) break; /* "{#" closing the source: jinja2 drops it */
      size_t r = after;
      while (r + 1 < L->n && !(s[r] == '#' && s[r + 1] == '}')) r++;
      if (r + 1 >= L->n)
        jinja_fail(L->c, "syntax error: Missing end of comment tag (line %d)", L->line);
      size_t end = r + 2;
      if (r > after && s[r - 1] == '-') {
        while (end < L->n && jinja_is_ws(s[end])) end++;
      } else if (!(r > after && s[r - 1] == '+')) {
        if (end < L->n && s[end] == '\n') end++;
      }
      L->line += jinja_lines(s + after, end - after);
      L->pos = end;
      line_starting = s[end - 1] == '\n';
      continue;
    }
    jinja_lex_push(L, kind == '{' ? JT_VBEGIN : JT_BBEGIN, NULL, 0);
    line_starting = jinja_lex_tag(L, kind == '%');
  }
  jinja_lex_push(L, JT_EOF, NULL, 0);
}

/* ============================================================================================
 * Parser
 * ========================================================================================== */

typedef enum {
  N_TEXT,
  N_OUT,
  N_IF,
  N_FOR,
  N_SET,
  N_SETBLOCK,
  N_MACRO,
  N_BREAK,
  N_CONTINUE,
  N_FILTERBLOCK,
  N_BLOCK, /* a body rendered as is ({% generation %}) */
  N_WITH,  /* names bound for a body ({% with a = 1 %}) */
  N_CALLBLOCK,
  E_LIT,
  E_NAME,
  E_ATTR,
  E_ITEM,
  E_SLICE,
  E_CALL,
  E_FILTER,
  E_TEST,
  E_BIN,
  E_NEG,
  E_POS,
  E_NOT,
  E_AND,
  E_OR,
  E_COND,
  E_LIST,
  E_TUPLE,
  E_DICT,
  E_CMP,
  E_INPUT, /* the body text of a filter block or block set */
} jnode_kind;

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT };
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct jnode {
  int kind, line, op;
  const char *name; /* NAME, ATTR, FILTER, TEST, MACRO; SET: the namespace of `ns.attr` */
  size_t name_n;
  jv lit;
  struct jnode *a, *b, *c;
  struct jnode **args; /* call/filter/test arguments, list items, dict keys */
  int nargs;
  const char **kwn;   /* keyword names; MACRO: parameter names */
  struct jnode **kwv; /* keyword values, dict values; MACRO: defaults (NULL = none) */
  int nkw;
  struct jnode **body, **els;
  int nbody, nels;
  const char **names; /* FOR / SET targets */
  int nnames;
  int *ops; /* CMP */
} jnode;

struct jinja_template {
  jinja_ctx c; /* its arena owns the tokens and the tree */
  jnode **body;
  int nbody;
};

typedef struct jinja_parser {
  jinja_ctx *c;
  jinja_tok *t;
  size_t pos;
  int depth;
  int loops; /* for loops open around the statement being parsed (0 again in a macro) */
} jinja_parser;

static jinja_tok *jp_cur(jinja_parser *P) { return &P->t[P->pos]; }
static jinja_tok *jp_next(jinja_parser *P) {
  jinja_tok *t = &P->t[P->pos];
  if (t->type != JT_EOF) P->pos++;
  return t;
}
static int jp_is_op(jinja_parser *P, const char *op) {
  jinja_tok *t = jp_cur(P);
  return t->type == JT_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int jp_is_name(jinja_parser *P, const char *name) {
  jinja_tok *t = jp_cur(P);
  return t->type == JT_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}
static int jp_is_name_at(jinja_parser *P, size_t at, const char *name) {
  jinja_tok *t = &P->t[at];
  return t->type == JT_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}

static const char *jp_tok_desc(jinja_tok *t) {
  switch (t->type) {
    case JT_EOF:
      return "end of template";
    case JT_BEND:
      return "end of statement block";
    case JT_VEND:
      return "end of print statement";
    case JT_NAME:
      return "name";
    case JT_STR:
      return "string";
    default:
      return "token";
  }
}

static _Noreturn void jp_fail(jinja_parser *P, const char *fmt, ...) {
  char m[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  jinja_fail(P->c, "syntax error: %s (line %d)", m, jp_cur(P)->line);
}

static void jp_expect_op(jinja_parser *P, const char *op) {
  if (!jp_is_op(P, op)) jp_fail(P, "expected '%s', got %s", op, jp_tok_desc(jp_cur(P)));
  jp_next(P);
}

static const char *jp_expect_name(jinja_parser *P) {
  jinja_tok *t = jp_cur(P);
  if (t->type != JT_NAME) jp_fail(P, "expected a name, got %s", jp_tok_desc(t));
  jp_next(P);
  return jinja_strndup(P->c, t->s, t->n);
}

static void jp_expect_bend(jinja_parser *P) {
  if (jp_cur(P)->type != JT_BEND)
    jp_fail(P, "expected end of statement block, got %s", jp_tok_desc(jp_cur(P)));
  jp_next(P);
}

static jnode *jp_node(jinja_parser *P, int kind) {
  jnode *n = jinja_alloc(P->c, sizeof *n);
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->line = jp_cur(P)->line;
  return n;
}

/* A growable array of node pointers in the arena. */
typedef struct jp_vec {
  jnode **v;
  int n, cap;
} jp_vec;

static void jp_vec_push(jinja_parser *P, jp_vec *x, jnode *n) {
  if (x->n == x->cap) {
    int cap = x->cap ? x->cap * 2 : 4;
    jnode **v = jinja_alloc(P->c, (size_t)cap * sizeof *v);
    if (x->n) memcpy(v, x->v, (size_t)x->n * sizeof *v);
    x->v = v;
    x->cap = cap;
  }
  x->v[x->n++] = n;
}

static jnode *jp_expr(jinja_parser *P, int with_cond);
static jnode *jp_or(jinja_parser *P);
static jnode *jp_unary(jinja_parser *P, int with_filter);
static jnode *jp_primary(jinja_parser *P);
static jnode *jp_postfix(jinja_parser *P, jnode *n);

static void jp_enter(jinja_parser *P) {
  if (++P->depth > 200) jp_fail(P, "template nested too deeply");
}

/* tuple of expressions without parentheses ("a, b"); a single one is returned as is */
static jnode *jp_tuple(jinja_parser *P, int with_cond) {
  jnode *first = jp_expr(P, with_cond);
  if (!jp_is_op(P, ",")) return first;
  jnode *t = jp_node(P, E_TUPLE);
  jp_vec v = {0};
  jp_vec_push(P, &v, first);
  while (jp_is_op(P, ",")) {
    jp_next(P);
    int k = jp_cur(P)->type;
    if (k == JT_VEND || k == JT_BEND || jp_is_op(P, ")") || jp_is_name(P, "if") || jp_is_op(P, "="))
      break;
    jp_vec_push(P, &v, jp_expr(P, with_cond));
  }
  t->args = v.v;
  t->nargs = v.n;
  return t;
}

/* call arguments after '(' up to ')' */
static void jp_call_args(jinja_parser *P, jnode *n) {
  jp_vec a = {0}, kv = {0};
  const char **kn = NULL;
  int kcap = 0;
  jp_expect_op(P, "(");
  while (!jp_is_op(P, ")")) {
    if (a.n || kv.n) jp_expect_op(P, ",");
    if (jp_is_op(P, ")")) break;
    if (jp_cur(P)->type == JT_NAME && P->t[P->pos + 1].type == JT_OP && P->t[P->pos + 1].n == 1 &&
        P->t[P->pos + 1].s[0] == '=') {
      const char *name = jp_expect_name(P);
      jp_next(P);
      if (kv.n == kcap) {
        kcap = kcap ? kcap * 2 : 4;
        const char **nk = jinja_alloc(P->c, (size_t)kcap * sizeof *nk);
        if (kv.n) memcpy(nk, kn, (size_t)kv.n * sizeof *nk);
        kn = nk;
      }
      kn[kv.n] = name;
      jp_vec_push(P, &kv, jp_expr(P, 1));
    } else {
      if (kv.n) jp_fail(P, "positional argument follows keyword argument");
      jp_vec_push(P, &a, jp_expr(P, 1));
    }
  }
  jp_next(P);
  n->args = a.v;
  n->nargs = a.n;
  n->kwn = kn;
  n->kwv = kv.v;
  n->nkw = kv.n;
}

static jnode *jp_filter(jinja_parser *P, jnode *input) {
  jnode *f = jp_node(P, E_FILTER);
  f->name = jp_expect_name(P);
  while (jp_is_op(P, ".")) { /* a dotted name names no filter of ours: it fails when run */
    jp_next(P);
    const char *part = jp_expect_name(P);
    size_t n = strlen(f->name) + strlen(part) + 2;
    char *full = jinja_alloc(P->c, n);
    snprintf(full, n, "%s.%s", f->name, part);
    f->name = full;
  }
  f->a = input;
  if (jp_is_op(P, "(")) jp_call_args(P, f);
  return f;
}

static jnode *jp_filter_expr(jinja_parser *P, jnode *n) {
  for (;;) {
    if (jp_is_op(P, "|")) {
      jp_next(P);
      n = jp_filter(P, n);
    } else if (jp_is_name(P, "is")) {
      jp_next(P);
      jnode *t = jp_node(P, E_TEST);
      if (jp_is_name(P, "not")) {
        jp_next(P);
        t->op = 1;
      }
      t->name = jp_expect_name(P);
      t->a = n;
      jinja_tok *c = jp_cur(P);
      if (jp_is_op(P, "(")) {
        jp_call_args(P, t);
      } else if ((c->type == JT_NAME || c->type == JT_STR || c->type == JT_INT ||
                  c->type == JT_FLOAT || jp_is_op(P, "[") || jp_is_op(P, "{")) &&
                 !jp_is_name(P, "else") && !jp_is_name(P, "or") && !jp_is_name(P, "and")) {
        if (jp_is_name(P, "is")) jp_fail(P, "You cannot chain multiple tests with is");
        jnode *arg = jp_postfix(P, jp_primary(P));
        t->args = jinja_alloc(P->c, sizeof(jnode *));
        t->args[0] = arg;
        t->nargs = 1;
      }
      n = t;
    } else if (jp_is_op(P, "(")) {
      jnode *call = jp_node(P, E_CALL);
      call->a = n;
      jp_call_args(P, call);
      n = call;
    } else {
      return n;
    }
  }
}

static jnode *jp_subscript(jinja_parser *P, jnode *obj) {
  jnode *parts[3] = {NULL, NULL, NULL};
  int k = 0, is_slice = 0;
  for (;;) {
    if (jp_is_op(P, ":")) {
      is_slice = 1;
      jp_next(P);
      if (++k > 2) jp_fail(P, "bad slice");
      continue;
    }
    if (jp_is_op(P, "]")) break;
    if (parts[k]) jp_fail(P, "expected ']'");
    parts[k] = jp_expr(P, 1);
  }
  jp_next(P);
  jnode *n = jp_node(P, is_slice ? E_SLICE : E_ITEM);
  n->a = obj;
  n->b = parts[0];
  if (is_slice) {
    n->c = parts[1];
    n->args = jinja_alloc(P->c, sizeof(jnode *));
    n->args[0] = parts[2];
    n->nargs = 1;
  } else if (!parts[0]) {
    jp_fail(P, "expected an expression in []");
  }
  return n;
}

static jnode *jp_postfix(jinja_parser *P, jnode *n) {
  for (;;) {
    if (jp_is_op(P, ".")) {
      jp_next(P);
      jinja_tok *t = jp_cur(P);
      if (t->type == JT_NAME) {
        jnode *a = jp_node(P, E_ATTR);
        a->a = n;
        a->name = jp_expect_name(P);
        a->name_n = strlen(a->name);
        n = a;
      } else if (t->type == JT_INT) {
        jnode *a = jp_node(P, E_ITEM);
        a->a = n;
        a->b = jp_node(P, E_LIT);
        a->b->lit = jv_int(t->i);
        jp_next(P);
        n = a;
      } else {
        jp_fail(P, "expected name or number");
      }
    } else if (jp_is_op(P, "[")) {
      jp_next(P);
      n = jp_subscript(P, n);
    } else if (jp_is_op(P, "(")) {
      jnode *call = jp_node(P, E_CALL);
      call->a = n;
      jp_call_args(P, call);
      n = call;
    } else {
      return n;
    }
  }
}

static jnode *jp_primary(jinja_parser *P) {
  jp_enter(P);
  jinja_tok *t = jp_cur(P);
  jnode *n;
  if (t->type == JT_NAME) {
    jp_next(P);
    n = jp_node(P, E_LIT);
#define JP_IS(w) (t->n == strlen(w) && !memcmp(t->s, w, t->n))
    if (JP_IS("true") || JP_IS("True"))
      n->lit = jv_bool(1);
    else if (JP_IS("false") || JP_IS("False"))
      n->lit = jv_bool(0);
    else if (JP_IS("none") || JP_IS("None"))
      n->lit = jv_none_v;
    else {
      n->kind = E_NAME;
      n->name = jinja_strndup(P->c, t->s, t->n);
      n->name_n = t->n;
    }
#undef JP_IS
  } else if (t->type == JT_STR) {
    jinja_sb b = {0};
    b.max = SIZE_MAX;
    while (jp_cur(P)->type == JT_STR) {
      jinja_sb_put(P->c, &b, jp_cur(P)->s, jp_cur(P)->n);
      jp_next(P);
    }
    n = jp_node(P, E_LIT);
    n->lit = jv_strn(b.p ? b.p : "", b.n);
  } else if (t->type == JT_INT || t->type == JT_FLOAT) {
    jp_next(P);
    n = jp_node(P, E_LIT);
    n->lit = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
  } else if (jp_is_op(P, "(")) {
    jp_next(P);
    if (jp_is_op(P, ")")) {
      jp_next(P);
      n = jp_node(P, E_TUPLE);
    } else {
      jnode *first = jp_expr(P, 1);
      if (jp_is_op(P, ",")) {
        n = jp_node(P, E_TUPLE);
        jp_vec v = {0};
        jp_vec_push(P, &v, first);
        while (jp_is_op(P, ",")) {
          jp_next(P);
          if (jp_is_op(P, ")")) break;
          jp_vec_push(P, &v, jp_expr(P, 1));
        }
        n->args = v.v;
        n->nargs = v.n;
      } else {
        n = first;
      }
      jp_expect_op(P, ")");
    }
  } else if (jp_is_op(P, "[")) {
    jp_next(P);
    n = jp_node(P, E_LIST);
    jp_vec v = {0};
    while (!jp_is_op(P, "]")) {
      if (v.n) jp_expect_op(P, ",");
      if (jp_is_op(P, "]")) break;
      jp_vec_push(P, &v, jp_expr(P, 1));
    }
    jp_next(P);
    n->args = v.v;
    n->nargs = v.n;
  } else if (jp_is_op(P, "{")) {
    jp_next(P);
    n = jp_node(P, E_DICT);
    jp_vec k = {0}, v = {0};
    while (!jp_is_op(P, "}")) {
      if (k.n) jp_expect_op(P, ",");
      if (jp_is_op(P, "}")) break;
      jp_vec_push(P, &k, jp_expr(P, 1));
      jp_expect_op(P, ":");
      jp_vec_push(P, &v, jp_expr(P, 1));
    }
    jp_next(P);
    n->args = k.v;
    n->nargs = k.n;
    n->kwv = v.v;
    n->nkw = v.n;
  } else {
    jp_fail(P, "unexpected %s", jp_tok_desc(t));
  }
  P->depth--;
  return n;
}

static jnode *jp_unary(jinja_parser *P, int with_filter) {
  jp_enter(P);
  jnode *n;
  if (jp_is_op(P, "-") || jp_is_op(P, "+")) {
    n = jp_node(P, jp_is_op(P, "-") ? E_NEG : E_POS);
    jp_next(P);
    n->a = jp_unary(P, 0);
  } else {
    n = jp_primary(P);
  }
  n = jp_postfix(P, n);
  if (with_filter) n = jp_filter_expr(P, n);
  P->depth--;
  return n;
}

static jnode *jp_bin(jinja_parser *P, int op, jnode *a, jnode *b) {
  jnode *n = jp_node(P, E_BIN);
  n->op = op;
  n->a = a;
  n->b = b;
  return n;
}

static jnode *jp_pow(jinja_parser *P) {
  jnode *n = jp_unary(P, 1);
  while (jp_is_op(P, "**")) {
    jp_next(P);
    n = jp_bin(P, OP_POW, n, jp_unary(P, 1));
  }
  return n;
}

static jnode *jp_math2(jinja_parser *P) {
  jnode *n = jp_pow(P);
  for (;;) {
    int op = jp_is_op(P, "*")    ? OP_MUL
             : jp_is_op(P, "/")  ? OP_DIV
             : jp_is_op(P, "//") ? OP_FLOORDIV
             : jp_is_op(P, "%")  ? OP_MOD
                                 : 0;
    if (!op) return n;
    jp_next(P);
    n = jp_bin(P, op, n, jp_pow(P));
  }
}

static jnode *jp_concat(jinja_parser *P) {
  jnode *n = jp_math2(P);
  while (jp_is_op(P, "~")) {
    jp_next(P);
    n = jp_bin(P, OP_CONCAT, n, jp_math2(P));
  }
  return n;
}

static jnode *jp_math1(jinja_parser *P) {
  jnode *n = jp_concat(P);
  for (;;) {
    int op = jp_is_op(P, "+") ? OP_ADD : jp_is_op(P, "-") ? OP_SUB : 0;
    if (!op) return n;
    jp_next(P);
    n = jp_bin(P, op, n, jp_concat(P));
  }
}

static jnode *jp_compare(jinja_parser *P) {
  jnode *first = jp_math1(P);
  jp_vec v = {0};
  int *ops = NULL, cap = 0;
  for (;;) {
    int op = jp_is_op(P, "==")     ? CMP_EQ
             : jp_is_op(P, "!=")   ? CMP_NE
             : jp_is_op(P, "<")    ? CMP_LT
             : jp_is_op(P, "<=")   ? CMP_LE
             : jp_is_op(P, ">")    ? CMP_GT
             : jp_is_op(P, ">=")   ? CMP_GE
             : jp_is_name(P, "in") ? CMP_IN
                                   : 0;
    if (!op && jp_is_name(P, "not") && jp_is_name_at(P, P->pos + 1, "in")) {
      op = CMP_NOTIN;
      jp_next(P);
    }
    if (!op) break;
    jp_next(P);
    if (v.n == cap) {
      cap = cap ? cap * 2 : 4;
      int *no = jinja_alloc(P->c, (size_t)cap * sizeof *no);
      if (v.n) memcpy(no, ops, (size_t)v.n * sizeof *no);
      ops = no;
    }
    ops[v.n] = op;
    jp_vec_push(P, &v, jp_math1(P));
  }
  if (!v.n) return first;
  jnode *n = jp_node(P, E_CMP);
  n->a = first;
  n->args = v.v;
  n->nargs = v.n;
  n->ops = ops;
  return n;
}

static jnode *jp_not(jinja_parser *P) {
  if (jp_is_name(P, "not")) {
    jp_enter(P);
    jnode *n = jp_node(P, E_NOT);
    jp_next(P);
    n->a = jp_not(P);
    P->depth--;
    return n;
  }
  return jp_compare(P);
}

static jnode *jp_and(jinja_parser *P) {
  jnode *n = jp_not(P);
  while (jp_is_name(P, "and")) {
    jp_next(P);
    jnode *x = jp_node(P, E_AND);
    x->a = n;
    x->b = jp_not(P);
    n = x;
  }
  return n;
}

static jnode *jp_or(jinja_parser *P) {
  jnode *n = jp_and(P);
  while (jp_is_name(P, "or")) {
    jp_next(P);
    jnode *x = jp_node(P, E_OR);
    x->a = n;
    x->b = jp_and(P);
    n = x;
  }
  return n;
}

static jnode *jp_expr(jinja_parser *P, int with_cond) {
  jp_enter(P);
  jnode *n = jp_or(P);
  if (with_cond) {
    while (jp_is_name(P, "if")) {
      jp_next(P);
      jnode *x = jp_node(P, E_COND);
      x->a = n;
      x->b = jp_or(P);
      if (jp_is_name(P, "else")) {
        jp_next(P);
        x->c = jp_expr(P, 1);
      }
      n = x;
    }
  }
  P->depth--;
  return n;
}

/* assignment targets: a name, or names separated by commas (optionally in parentheses) */
static void jp_targets(jinja_parser *P, jnode *n) {
  const char *names[64];
  int k = 0, paren = 0;
  if (jp_is_op(P, "(")) {
    jp_next(P);
    paren = 1;
  }
  for (;;) {
    if (k == 64) jp_fail(P, "too many targets");
    names[k++] = jp_expect_name(P);
    if (!jp_is_op(P, ",")) break;
    jp_next(P);
    if (paren && jp_is_op(P, ")")) break;
    if (!paren && jp_cur(P)->type != JT_NAME) break;
  }
  if (paren) jp_expect_op(P, ")");
  n->names = jinja_alloc(P->c, (size_t)k * sizeof *n->names);
  memcpy(n->names, names, (size_t)k * sizeof *names);
  n->nnames = k;
  if (k > 1 || paren) n->op = 1; /* unpack */
}

static void jp_body(jinja_parser *P, const char *const *ends, jp_vec *out);

/* Whether the subtree reads the variable `name` (macros take extra arguments only when their
 * body reads varargs / kwargs). */
static int jp_uses_name(const jnode *n, const char *name) {
  if (!n) return 0;
  if (n->kind == E_NAME && !strcmp(n->name, name)) return 1;
  if (jp_uses_name(n->a, name) || jp_uses_name(n->b, name) || jp_uses_name(n->c, name)) return 1;
  for (int i = 0; i < n->nargs; i++)
    if (jp_uses_name(n->args[i], name)) return 1;
  for (int i = 0; i < n->nkw; i++)
    if (n->kwv && jp_uses_name(n->kwv[i], name)) return 1;
  for (int i = 0; i < n->nbody; i++)
    if (jp_uses_name(n->body[i], name)) return 1;
  for (int i = 0; i < n->nels; i++)
    if (jp_uses_name(n->els[i], name)) return 1;
  return 0;
}

/* The body of a block statement through its end tag (consumed with its %}); {% endmacro %}
 * may repeat the macro's name. */
static void jp_block(jinja_parser *P, jnode *n, const char *end) {
  const char *const ends[] = {end, NULL};
  jp_vec b = {0};
  jp_body(P, ends, &b);
  n->body = b.v;
  n->nbody = b.n;
  jp_next(P);
  if (n->kind == N_MACRO && jp_cur(P)->type == JT_NAME) jp_next(P);
  jp_expect_bend(P);
  if (n->kind == N_MACRO || n->kind == N_CALLBLOCK)
    for (int i = 0; i < n->nbody; i++)
      n->op |= (jp_uses_name(n->body[i], "varargs") ? 1 : 0) |
               (jp_uses_name(n->body[i], "kwargs") ? 2 : 0);
}

static const char *jp_end_tag(jinja_parser *P) {
  return jinja_strndup(P->c, jp_cur(P)->s, jp_cur(P)->n);
}

static jnode *jp_statement(jinja_parser *P) {
  jinja_tok *t = jp_cur(P);
  if (t->type != JT_NAME) jp_fail(P, "tag name expected");
  int line = t->line;
  jnode *n;
  jp_enter(P);
  if (jp_is_name(P, "if")) {
    jp_next(P);
    n = jp_node(P, N_IF);
    n->a = jp_expr(P, 0);
    jp_expect_bend(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jp_vec b = {0};
    jp_body(P, ends, &b);
    n->body = b.v;
    n->nbody = b.n;
    if (jp_is_name(P, "elif")) {
      jnode *e = jp_statement(P); /* parses "elif ..." as an if, through endif */
      n->els = jinja_alloc(P->c, sizeof(jnode *));
      n->els[0] = e;
      n->nels = 1;
      P->depth--;
      n->line = line;
      return n;
    }
    if (jp_is_name(P, "else")) {
      jp_next(P);
      jp_expect_bend(P);
      static const char *const ends2[] = {"endif", NULL};
      jp_vec e = {0};
      jp_body(P, ends2, &e);
      n->els = e.v;
      n->nels = e.n;
    }
    jp_next(P); /* endif */
    jp_expect_bend(P);
  } else if (jp_is_name(P, "elif")) {
    /* the tail of an if chain: same shape as an if, shares the endif */
    P->t[P->pos].s = "if";
    P->t[P->pos].n = 2;
    n = jp_statement(P);
  } else if (jp_is_name(P, "for")) {
    jp_next(P);
    n = jp_node(P, N_FOR);
    jp_targets(P, n);
    if (!jp_is_name(P, "in")) jp_fail(P, "expected 'in'");
    jp_next(P);
    n->a = jp_tuple(P, 0);
    if (jp_is_name(P, "if")) {
      jp_next(P);
      n->b = jp_expr(P, 1);
    }
    if (jp_is_name(P, "recursive")) jp_fail(P, "recursive loops are not supported");
    jp_expect_bend(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    jp_vec b = {0};
    P->loops++;
    jp_body(P, ends, &b);
    P->loops--;
    n->body = b.v;
    n->nbody = b.n;
    if (jp_is_name(P, "else")) {
      jp_next(P);
      jp_expect_bend(P);
      static const char *const ends2[] = {"endfor", NULL};
      jp_vec e = {0};
      jp_body(P, ends2, &e);
      n->els = e.v;
      n->nels = e.n;
    }
    jp_next(P);
    jp_expect_bend(P);
  } else if (jp_is_name(P, "set")) {
    jp_next(P);
    n = jp_node(P, N_SET);
    if (jp_cur(P)->type == JT_NAME && P->t[P->pos + 1].type == JT_OP && P->t[P->pos + 1].n == 1 &&
        P->t[P->pos + 1].s[0] == '.') {
      n->name = jp_expect_name(P);
      jp_next(P);
      n->names = jinja_alloc(P->c, sizeof(char *));
      n->names[0] = jp_expect_name(P);
      n->nnames = 1;
    } else {
      jp_targets(P, n);
    }
    if (jp_is_op(P, "=")) {
      jp_next(P);
      n->a = jp_tuple(P, 1);
      jp_expect_bend(P);
    } else {
      if (n->name || n->nnames != 1) jp_fail(P, "expected '='");
      n->kind = N_SETBLOCK;
      jnode *f = NULL;
      while (jp_is_op(P, "|")) {
        jp_next(P);
        f = jp_filter(P, f ? f : jp_node(P, E_INPUT));
      }
      n->a = f;
      jp_expect_bend(P);
      jp_block(P, n, "endset");
    }
  } else if (jp_is_name(P, "macro")) {
    jp_next(P);
    n = jp_node(P, N_MACRO);
    n->name = jp_expect_name(P);
    jp_expect_op(P, "(");
    const char *pn[64];
    jnode *pd[64];
    int k = 0;
    while (!jp_is_op(P, ")")) {
      if (k) jp_expect_op(P, ",");
      if (jp_is_op(P, ")")) break;
      if (k == 64) jp_fail(P, "too many macro parameters");
      pn[k] = jp_expect_name(P);
      pd[k] = NULL;
      if (jp_is_op(P, "=")) {
        jp_next(P);
        pd[k] = jp_expr(P, 1);
      }
      k++;
    }
    jp_next(P);
    jp_expect_bend(P);
    n->kwn = jinja_alloc(P->c, (size_t)(k ? k : 1) * sizeof(char *));
    n->kwv = jinja_alloc(P->c, (size_t)(k ? k : 1) * sizeof(jnode *));
    memcpy(n->kwn, pn, (size_t)k * sizeof(char *));
    memcpy(n->kwv, pd, (size_t)k * sizeof(jnode *));
    n->nkw = k;
    int loops = P->loops;
    P->loops = 0; /* a macro body is a function of its own: loop controls stop at it */
    jp_block(P, n, "endmacro");
    P->loops = loops;
  } else if (jp_is_name(P, "call")) {
    jp_next(P);
    n = jp_node(P, N_CALLBLOCK);
    if (jp_is_op(P, "(")) { /* caller parameters */
      jp_next(P);
      const char *pn[64];
      int k = 0;
      while (!jp_is_op(P, ")")) {
        if (k) jp_expect_op(P, ",");
        if (k == 64) jp_fail(P, "too many caller parameters");
        pn[k++] = jp_expect_name(P);
      }
      jp_next(P);
      n->names = jinja_alloc(P->c, (size_t)(k ? k : 1) * sizeof(char *));
      memcpy(n->names, pn, (size_t)k * sizeof(char *));
      n->nnames = k;
    }
    n->a = jp_expr(P, 1);
    if (n->a->kind != E_CALL) jp_fail(P, "expected call");
    jp_expect_bend(P);
    int loops = P->loops;
    P->loops = 0; /* a macro body is a function of its own: loop controls stop at it */
    jp_block(P, n, "endcall");
    P->loops = loops;
  } else if (jp_is_name(P, "break") || jp_is_name(P, "continue")) {
    if (!P->loops) jp_fail(P, "'%.*s' not properly in loop", (int)t->n, t->s);
    n = jp_node(P, jp_is_name(P, "break") ? N_BREAK : N_CONTINUE);
    jp_next(P);
    jp_expect_bend(P);
  } else if (jp_is_name(P, "filter")) {
    jp_next(P);
    n = jp_node(P, N_FILTERBLOCK);
    jnode *f = jp_filter(P, jp_node(P, E_INPUT));
    while (jp_is_op(P, "|")) {
      jp_next(P);
      f = jp_filter(P, f);
    }
    n->a = f;
    jp_expect_bend(P);
    jp_block(P, n, "endfilter");
  } else if (jp_is_name(P, "with")) {
    jp_next(P);
    n = jp_node(P, N_WITH);
    jp_vec vals = {0};
    const char *names[64];
    int k = 0;
    while (jp_cur(P)->type != JT_BEND) {
      if (k) jp_expect_op(P, ",");
      if (k == 64) jp_fail(P, "too many with targets");
      names[k++] = jp_expect_name(P);
      jp_expect_op(P, "=");
      jp_vec_push(P, &vals, jp_expr(P, 1));
    }
    jp_next(P);
    n->names = jinja_alloc(P->c, (size_t)(k ? k : 1) * sizeof(char *));
    memcpy(n->names, names, (size_t)k * sizeof(char *));
    n->nnames = k;
    n->args = vals.v;
    n->nargs = vals.n;
    jp_block(P, n, "endwith");
  } else if (jp_is_name(P, "generation")) {
    jp_next(P);
    n = jp_node(P, N_BLOCK);
    jp_expect_bend(P);
    jp_block(P, n, "endgeneration");
  } else {
    jp_fail(P, "Encountered unknown tag '%.*s'", (int)t->n, t->s);
  }
  n->line = line;
  P->depth--;
  return n;
}

/* Statements up to one of ends (NULL-terminated; NULL ends = the whole template). Stops with the
 * end tag's name as the current token. */
static void jp_body(jinja_parser *P, const char *const *ends, jp_vec *out) {
  for (;;) {
    jinja_tok *t = jp_cur(P);
    if (t->type == JT_EOF) {
      if (ends)
        jp_fail(P, "Unexpected end of template. Jinja was looking for the tag '%s'", ends[0]);
      return;
    }
    if (t->type == JT_TEXT) {
      jnode *n = jp_node(P, N_TEXT);
      n->lit = jv_strn(t->s, t->n);
      jp_next(P);
      jp_vec_push(P, out, n);
    } else if (t->type == JT_VBEGIN) {
      jp_next(P);
      jnode *n = jp_node(P, N_OUT);
      n->a = jp_tuple(P, 1);
      if (jp_cur(P)->type != JT_VEND)
        jp_fail(P, "expected end of print statement, got %s", jp_tok_desc(jp_cur(P)));
      jp_next(P);
      jp_vec_push(P, out, n);
    } else if (t->type == JT_BBEGIN) {
      jp_next(P);
      if (ends)
        for (int i = 0; ends[i]; i++)
          if (jp_is_name(P, ends[i])) return;
      static const char *const stray[] = {"endif",         "endfor", "endset",    "endmacro",
                                          "else",          "elif",   "endfilter", "endcall",
                                          "endgeneration", "endraw", "endwith",   NULL};
      for (int i = 0; stray[i]; i++)
        if (jp_is_name(P, stray[i])) jp_fail(P, "Encountered unknown tag '%s'", jp_end_tag(P));
      jp_vec_push(P, out, jp_statement(P));
    } else {
      jp_fail(P, "unexpected %s", jp_tok_desc(t));
    }
  }
}

jinja_limits jinja_limits_default(void) {
  jinja_limits l = {64u << 20, 512u << 20, 10000000, 200};
  return l;
}

jinja_template *jinja_parse(const char *src, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  jinja_template *volatile t = calloc(1, sizeof *t);
  if (!t) {
    if (err && errlen) snprintf(err, errlen, "MemoryError: out of memory");
    return NULL;
  }
  t->c.ar.limit = SIZE_MAX / 2;
  if (setjmp(t->c.jb)) {
    if (err && errlen) snprintf(err, errlen, "%s", t->c.msg);
    jinja_arena_free(&t->c.ar);
    free(t);
    return NULL;
  }
  /* newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False) */
  size_t n = strlen(src);
  char *s = jinja_alloc(&t->c, n + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (src[i] == '\r') {
      s[k++] = '\n';
      if (i + 1 < n && src[i + 1] == '\n') i++;
    } else {
      s[k++] = src[i];
    }
  }
  if (k && s[k - 1] == '\n') k--;
  s[k] = 0;
  jinja_lexer L = {&t->c, s, k, 0, 1, NULL, 0, 0};
  jinja_lex(&L);
  jinja_parser P = {&t->c, L.toks, 0, 0, 0};
  jp_vec body = {0};
  jp_body(&P, NULL, &body);
  t->body = body.v;
  t->nbody = body.n;
  return t;
}

void jinja_template_free(jinja_template *t) {
  if (!t) return;
  jinja_arena_free(&t->c.ar);
  free(t);
}

/* ============================================================================================
 * Renderer: scopes, attribute access, operators
 * ========================================================================================== */

typedef struct jscope {
  struct jscope *parent;
  const char **k;
  jv *v;
  int n, cap;
} jscope;

typedef struct jinja_rs {
  jinja_ctx c;
  jinja_limits lim;
  long steps;
  int depth;
  int line;
  int raised; /* the error is raise_exception's message, printed as is */
  jscope *root;
  jv input; /* E_INPUT */
} jinja_rs;

#define RS_FAIL(rs, ...) jinja_fail(&(rs)->c, __VA_ARGS__)

static jscope *jinja_scope_new(jinja_rs *rs, jscope *parent) {
  jscope *s = jinja_alloc(&rs->c, sizeof *s);
  memset(s, 0, sizeof *s);
  s->parent = parent;
  return s;
}

static void jinja_scope_set(jinja_rs *rs, jscope *s, const char *k, jv v) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->k[i], k)) {
      s->v[i] = v;
      return;
    }
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 8;
    const char **nk = jinja_alloc(&rs->c, (size_t)cap * sizeof *nk);
    jv *nv = jinja_alloc(&rs->c, (size_t)cap * sizeof *nv);
    if (s->n) {
      memcpy(nk, s->k, (size_t)s->n * sizeof *nk);
      memcpy(nv, s->v, (size_t)s->n * sizeof *nv);
    }
    s->k = nk;
    s->v = nv;
    s->cap = cap;
  }
  s->k[s->n] = k;
  s->v[s->n++] = v;
}

static jv jinja_func(int id) {
  jv v = {JV_FUNC, 0, {0}};
  v.u.i = id;
  return v;
}

static jv jinja_lookup(jinja_rs *rs, jscope *s, const char *k) {
  for (; s; s = s->parent)
    for (int i = s->n - 1; i >= 0; i--)
      if (!strcmp(s->k[i], k)) return s->v[i];
  if (!strcmp(k, "range")) return jinja_func(JF_RANGE);
  if (!strcmp(k, "namespace")) return jinja_func(JF_NAMESPACE);
  if (!strcmp(k, "raise_exception")) return jinja_func(JF_RAISE);
  if (!strcmp(k, "strftime_now")) return jinja_func(JF_STRFTIME);
  if (!strcmp(k, "dict")) return jinja_func(JF_DICT);
  size_t n = strlen(k) + 32;
  char *m = jinja_alloc(&rs->c, n);
  snprintf(m, n, "'%s' is undefined", k);
  return jv_undef_msg(m);
}

static _Noreturn void jinja_undef_fail(jinja_rs *rs, jv u) {
  if (u.flag) RS_FAIL(rs, "SecurityError: %s", u.u.s.p ? u.u.s.p : "unsafe access");
  RS_FAIL(rs, "UndefinedError: %s", u.u.s.p ? u.u.s.p : "undefined value");
}

static char *jinja_fmt(jinja_rs *rs, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  return jinja_strndup(&rs->c, tmp, strlen(tmp));
}

static jv jinja_meth(jinja_rs *rs, jv self, const char *name) {
  jmeth *m = jinja_alloc(&rs->c, sizeof *m);
  m->self = self;
  m->name = name;
  jv v = {JV_METH, 0, {0}};
  v.u.me = m;
  return v;
}

static int jinja_in_list(const char *name, const char *const *list) {
  for (int i = 0; list[i]; i++)
    if (!strcmp(name, list[i])) return 1;
  return 0;
}

static const char *const jinja_str_methods[] = {
    "startswith",  "endswith",     "strip",        "lstrip",     "rstrip",
    "split",       "rsplit",       "upper",        "lower",      "replace",
    "find",        "rfind",        "count",        "title",      "capitalize",
    "format",      "join",         "isdigit",      "isalpha",    "isalnum",
    "isspace",     "islower",      "isupper",      "splitlines", "index",
    "rindex",      "removeprefix", "removesuffix", "casefold",   "swapcase",
    "zfill",       "center",       "ljust",        "rjust",      "partition",
    "rpartition",  "isnumeric",    "isdecimal",    "istitle",    "isidentifier",
    "isprintable", "isascii",      "expandtabs",   "encode",     NULL};
static const char *const jinja_dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const jinja_dict_unsafe[] = {"pop",    "popitem", "setdefault",
                                                "update", "clear",   NULL};
static const char *const jinja_list_methods[] = {"index", "count", "copy", NULL};
static const char *const jinja_list_unsafe[] = {"append",  "extend", "insert", "pop", "remove",
                                                "reverse", "sort",   "clear",  NULL};

static const char *jinja_obj_name(jv v) {
  switch (v.t) {
    case JV_NONE:
      return "None";
    case JV_STR:
      return v.flag ? "markupsafe.Markup object" : "str object";
    case JV_LIST:
      return v.flag == JL_TUPLE ? "tuple object"
             : v.flag == JL_GEN ? "generator object"
                                : "list object";
    case JV_DICT:
      return "dict object";
    case JV_NS:
      return "jinja2.utils.Namespace object";
    case JV_INT:
      return "int object";
    case JV_FLOAT:
      return "float object";
    case JV_BOOL:
      return "bool object";
    case JV_MACRO:
      return "jinja2.runtime.Macro object";
    case JV_LOOP:
      return "jinja2.runtime.LoopContext object";
    default:
      return "builtin_function_or_method object";
  }
}

static jv jinja_no_attr(jinja_rs *rs, jv obj, const char *name) {
  return jv_undef_msg(jinja_fmt(rs, "'%s' has no attribute '%s'", jinja_obj_name(obj), name));
}

static jv jinja_unsafe(jinja_rs *rs, jv obj, const char *name) {
  jv u = jv_undef_msg(
      jinja_fmt(rs, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj)));
  u.flag = 1;
  return u;
}

static jv jinja_loop_attr(jinja_rs *rs, jv obj, const char *name) {
  jloop *lp = obj.u.lp;
  size_t i = lp->i, n = lp->items->n;
  if (!strcmp(name, "index")) return jv_int((int64_t)i + 1);
  if (!strcmp(name, "index0")) return jv_int((int64_t)i);
  if (!strcmp(name, "revindex")) return jv_int((int64_t)(n - i));
  if (!strcmp(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
  if (!strcmp(name, "first")) return jv_bool(i == 0);
  if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
  if (!strcmp(name, "length")) return jv_int((int64_t)n);
  if (!strcmp(name, "depth")) return jv_int(1);
  if (!strcmp(name, "depth0")) return jv_int(0);
  if (!strcmp(name, "previtem"))
    return i > 0 ? lp->items->v[i - 1] : jv_undef_msg("there is no previous item");
  if (!strcmp(name, "nextitem"))
    return i + 1 < n ? lp->items->v[i + 1] : jv_undef_msg("there is no next item");
  if (!strcmp(name, "cycle")) return jinja_meth(rs, obj, "cycle");
  return jinja_no_attr(rs, obj, name);
}

static jv jinja_getattr(jinja_rs *rs, jv obj, const char *name) {
  size_t n = strlen(name);
  switch (obj.t) {
    case JV_UNDEF:
      jinja_undef_fail(rs, obj);
    case JV_DICT:
      if (jinja_in_list(name, jinja_dict_methods)) return jinja_meth(rs, obj, name);
      if (jinja_in_list(name, jinja_dict_unsafe)) return jinja_unsafe(rs, obj, name);
      {
        jv *v = jv_dict_finds(obj.u.d, name, n);
        if (v) return *v;
      }
      return jinja_no_attr(rs, obj, name);
    case JV_NS: {
      jv *v = jv_dict_finds(obj.u.d, name, n);
      if (v) return *v;
      return jinja_no_attr(rs, obj, name);
    }
    case JV_STR:
      if (name[0] != '_' && jinja_in_list(name, jinja_str_methods))
        return jinja_meth(rs, obj, name);
      return jinja_no_attr(rs, obj, name);
    case JV_LIST:
      if (obj.flag == JL_GEN) return jinja_no_attr(rs, obj, name);
      if (jinja_in_list(name, jinja_list_methods)) return jinja_meth(rs, obj, name);
      if (!obj.flag && jinja_in_list(name, jinja_list_unsafe)) return jinja_unsafe(rs, obj, name);
      return jinja_no_attr(rs, obj, name);
    case JV_LOOP:
      return jinja_loop_attr(rs, obj, name);
    default:
      return jinja_no_attr(rs, obj, name);
  }
}

/* Python's index normalization; returns 0 when out of range */
static int jinja_index(int64_t i, size_t n, size_t *out) {
  if (i < 0) i += (int64_t)n;
  if (i < 0 || (uint64_t)i >= n) return 0;
  *out = (size_t)i;
  return 1;
}

static jv jinja_str_char(jinja_rs *rs, jv s, size_t cp) {
  size_t a = jinja_u8_off(s.u.s.p, s.u.s.n, cp);
  size_t b = jinja_u8_off(s.u.s.p + a, s.u.s.n - a, 1) + a;
  (void)rs;
  return jv_strn(s.u.s.p + a, b - a);
}

static jv jinja_getitem(jinja_rs *rs, jv obj, jv key) {
  switch (obj.t) {
    case JV_UNDEF:
      jinja_undef_fail(rs, obj);
    case JV_DICT:
    case JV_NS: {
      jv *v = jv_dict_find(obj.u.d, key);
      if (v) return *v;
      break;
    }
    case JV_LIST:
      if (obj.flag == JL_GEN) break;
      if (key.t == JV_INT || key.t == JV_BOOL) {
        size_t i;
        if (jinja_index(key.u.i, obj.u.l->n, &i)) return obj.u.l->v[i];
        return jv_undef_msg(
            jinja_fmt(rs, "'%s' has no element %lld", jinja_obj_name(obj), (long long)key.u.i));
      }
      break;
    case JV_STR:
      if (key.t == JV_INT || key.t == JV_BOOL) {
        size_t i;
        if (jinja_index(key.u.i, jinja_u8_len(obj.u.s.p, obj.u.s.n), &i))
          return jinja_str_char(rs, obj, i);
        return jv_undef_msg(
            jinja_fmt(rs, "'%s' has no element %lld", jinja_obj_name(obj), (long long)key.u.i));
      }
      break;
    default:
      break;
  }
  if (key.t == JV_STR) {
    if (obj.t == JV_DICT && memchr(key.u.s.p, 0, key.u.s.n) == NULL) {
      const char *k = jinja_strndup(&rs->c, key.u.s.p, key.u.s.n);
      if (jinja_in_list(k, jinja_dict_methods)) return jinja_meth(rs, obj, k);
      return jinja_no_attr(rs, obj, k);
    }
    if (obj.t != JV_DICT && obj.t != JV_NS && memchr(key.u.s.p, 0, key.u.s.n) == NULL)
      return jinja_getattr(rs, obj, jinja_strndup(&rs->c, key.u.s.p, key.u.s.n));
  }
  jinja_sb b = {0};
  b.max = 4096;
  jinja_repr_into(&rs->c, &b, key, 0);
  return jv_undef_msg(jinja_fmt(rs, "'%s' has no element %s", jinja_obj_name(obj), b.p ? b.p : ""));
}

/* Python slice bounds over n items: fills start, step and the count */
static size_t jinja_slice_bounds(jinja_rs *rs, jv a, jv b, jv c, size_t n, int64_t *start,
                                 int64_t *step) {
  int64_t st = 1, lo, hi, N = (int64_t)n;
  jv parts[3] = {a, b, c};
  for (int i = 0; i < 3; i++)
    if (parts[i].t != JV_NONE && parts[i].t != JV_INT && parts[i].t != JV_BOOL)
      RS_FAIL(rs, "TypeError: slice indices must be integers or None");
  if (c.t != JV_NONE) st = c.u.i;
  if (st == 0) RS_FAIL(rs, "ValueError: slice step cannot be zero");
  if (st > 0) {
    lo = a.t == JV_NONE ? 0 : a.u.i;
    hi = b.t == JV_NONE ? N : b.u.i;
    if (lo < 0) lo = lo + N < 0 ? 0 : lo + N;
    if (lo > N) lo = N;
    if (hi < 0) hi = hi + N < 0 ? 0 : hi + N;
    if (hi > N) hi = N;
    *start = lo;
    *step = st;
    return hi > lo ? (size_t)((hi - lo + st - 1) / st) : 0;
  }
  lo = a.t == JV_NONE ? N - 1 : a.u.i;
  hi = b.t == JV_NONE ? -1 : b.u.i;
  if (a.t != JV_NONE) {
    if (lo < 0) lo = lo + N < 0 ? -1 : lo + N;
    if (lo >= N) lo = N - 1;
  }
  if (b.t != JV_NONE) {
    if (hi < 0) hi = hi + N < 0 ? -1 : hi + N;
    if (hi >= N) hi = N - 1;
  }
  *start = lo;
  *step = st;
  return lo > hi ? (size_t)((lo - hi - st - 1) / -st) : 0;
}

static jv jinja_slice(jinja_rs *rs, jv obj, jv a, jv b, jv c) {
  int64_t start, step;
  if (obj.t == JV_LIST && obj.flag == JL_GEN) return jinja_no_attr(rs, obj, "__getitem__");
  if (obj.t == JV_LIST) {
    size_t k = jinja_slice_bounds(rs, a, b, c, obj.u.l->n, &start, &step);
    jv r = jv_list_new(&rs->c, k, obj.flag);
    for (size_t i = 0; i < k; i++) r.u.l->v[i] = obj.u.l->v[start + (int64_t)i * step];
    r.u.l->n = k;
    return r;
  }
  if (obj.t == JV_STR) {
    const char *s = obj.u.s.p;
    size_t n = obj.u.s.n, cpn = jinja_u8_len(s, n);
    size_t k = jinja_slice_bounds(rs, a, b, c, cpn, &start, &step);
    if (cpn == n) { /* ASCII */
      if (step == 1) return jv_strn(s + start, k);
      char *o = jinja_alloc(&rs->c, k + 1);
      for (size_t i = 0; i < k; i++) o[i] = s[start + (int64_t)i * step];
      o[k] = 0;
      return jv_strn(o, k);
    }
    size_t *offs = jinja_alloc(&rs->c, (cpn + 1) * sizeof *offs);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
      if (i == 0 || ((unsigned char)s[i] & 0xC0) != 0x80) offs[j++] = i;
    offs[cpn] = n;
    jinja_sb sb = {0};
    sb.max = SIZE_MAX;
    for (size_t i = 0; i < k; i++) {
      size_t cp = (size_t)(start + (int64_t)i * step);
      jinja_sb_put(&rs->c, &sb, s + offs[cp], offs[cp + 1] - offs[cp]);
    }
    return jv_strn(sb.p ? sb.p : "", sb.n);
  }
  if (obj.t == JV_UNDEF) jinja_undef_fail(rs, obj);
  return jv_undef_msg(jinja_fmt(rs, "'%s' is not subscriptable", jv_type_name(obj)));
}

/* Items of an iterable as Python iterates them (dict: keys; str: characters). */
static jlist *jinja_iter(jinja_rs *rs, jv v) {
  switch (v.t) {
    case JV_UNDEF: {
      jv l = jv_list_new(&rs->c, 0, 0);
      if (v.flag) jinja_undef_fail(rs, v);
      return l.u.l;
    }
    case JV_LIST:
      return v.u.l;
    case JV_DICT: {
      jv l = jv_list_new(&rs->c, v.u.d->n, 0);
      for (size_t i = 0; i < v.u.d->n; i++) l.u.l->v[i] = v.u.d->k[i];
      l.u.l->n = v.u.d->n;
      return l.u.l;
    }
    case JV_STR: {
      size_t n = jinja_u8_len(v.u.s.p, v.u.s.n);
      jv l = jv_list_new(&rs->c, n, 0);
      size_t i = 0;
      while (i < v.u.s.n) {
        size_t j = i + 1;
        while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80) j++;
        l.u.l->v[l.u.l->n++] = jv_strn(v.u.s.p + i, j - i);
        i = j;
      }
      return l.u.l;
    }
    default:
      RS_FAIL(rs, "TypeError: '%s' object is not iterable", jv_type_name(v));
  }
}

static int64_t jinja_len(jinja_rs *rs, jv v) {
  switch (v.t) {
    case JV_UNDEF:
      return 0;
    case JV_STR:
      return (int64_t)jinja_u8_len(v.u.s.p, v.u.s.n);
    case JV_LIST:
      if (v.flag == JL_GEN) RS_FAIL(rs, "TypeError: object of type 'generator' has no len()");
      return (int64_t)v.u.l->n;
    case JV_DICT:
      return (int64_t)v.u.d->n;
    default:
      RS_FAIL(rs, "TypeError: object of type '%s' has no len()", jv_type_name(v));
  }
}

static jv jinja_str_cat(jinja_rs *rs, jv a, jv b) {
  size_t n = a.u.s.n + b.u.s.n;
  if (n > rs->lim.max_output) RS_FAIL(rs, "LimitError: string too long");
  char *p = jinja_alloc(&rs->c, n + 1);
  memcpy(p, a.u.s.p, a.u.s.n);
  memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
  p[n] = 0;
  jv r = jv_strn(p, n);
  r.flag = a.flag;
  return r;
}

/* a < b with Python's rules; TypeError between unordered types */
static int jv_lt(jinja_ctx *c, jv a, jv b) {
  if (jv_is_num(a) && jv_is_num(b)) {
    if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.u.i < b.u.i;
    return jv_num(a) < jv_num(b);
  }
  if (a.t == JV_STR && b.t == JV_STR) {
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int r = memcmp(a.u.s.p, b.u.s.p, n);
    return r < 0 || (r == 0 && a.u.s.n < b.u.s.n);
  }
  if (a.t == JV_LIST && b.t == JV_LIST && a.flag == b.flag) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
      return jv_lt(c, a.u.l->v[i], b.u.l->v[i]);
    }
    return a.u.l->n < b.u.l->n;
  }
  jinja_fail(c, "TypeError: '<' not supported between instances of '%s' and '%s'", jv_type_name(a),
             jv_type_name(b));
}

static jv jinja_percent_format(jinja_rs *rs, jv fmt, const jv *args, int nargs);

static jv jinja_arith(jinja_rs *rs, int op, jv a, jv b) {
  if (op == OP_CONCAT) {
    if ((a.t == JV_UNDEF && a.flag) || (b.t == JV_UNDEF && b.flag))
      jinja_undef_fail(rs, a.t == JV_UNDEF && a.flag ? a : b);
    return jinja_str_cat(rs, jinja_to_str(&rs->c, a), jinja_to_str(&rs->c, b));
  }
  if (a.t == JV_UNDEF) jinja_undef_fail(rs, a);
  if (b.t == JV_UNDEF) jinja_undef_fail(rs, b);
  static const char *sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
  if (jv_is_num(a) && jv_is_num(b)) {
    int fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    if (!fl) {
      int64_t x = a.u.i, y = b.u.i, r;
      switch (op) {
        case OP_ADD:
          if (__builtin_add_overflow(x, y, &r)) break;
          return jv_int(r);
        case OP_SUB:
          if (__builtin_sub_overflow(x, y, &r)) break;
          return jv_int(r);
        case OP_MUL:
          if (__builtin_mul_overflow(x, y, &r)) break;
          return jv_int(r);
        case OP_DIV:
          if (y == 0) RS_FAIL(rs, "ZeroDivisionError: division by zero");
          return jv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
          if (y == 0) RS_FAIL(rs, "ZeroDivisionError: integer division or modulo by zero");
          if (x == INT64_MIN && y == -1) break;
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
          }
          return jv_int(op == OP_MOD ? m : q);
        }
        case OP_POW: {
          if (y < 0) return jv_float(pow((double)x, (double)y));
          int64_t acc = 1, base = x;
          int ovf = 0;
          for (int64_t e = y; e > 0 && !ovf; e >>= 1) {
            if (e & 1) ovf |= __builtin_mul_overflow(acc, base, &acc);
            if (e > 1) ovf |= __builtin_mul_overflow(base, base, &base);
          }
          if (ovf) break;
          return jv_int(acc);
        }
      }
      RS_FAIL(rs, "OverflowError: integer result out of range");
    }
    double x = jv_num(a), y = jv_num(b);
    switch (op) {
      case OP_ADD:
        return jv_float(x + y);
      case OP_SUB:
        return jv_float(x - y);
      case OP_MUL:
        return jv_float(x * y);
      case OP_DIV:
        if (y == 0) RS_FAIL(rs, "ZeroDivisionError: float division by zero");
        return jv_float(x / y);
      case OP_FLOORDIV:
      case OP_MOD: {
        if (y == 0) RS_FAIL(rs, "ZeroDivisionError: float modulo");
        double m = fmod(x, y), d = (x - m) / y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          m += y;
          d -= 1.0;
        }
        if (op == OP_MOD) return jv_float(m);
        double fd = floor(d);
        if (d - fd > 0.5) fd += 1.0;
        return jv_float(fd);
      }
      default:
        return jv_float(pow(x, y));
    }
  }
  if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) return jinja_str_cat(rs, a, b);
  if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.flag == b.flag) {
    jv r = jv_list_new(&rs->c, a.u.l->n + b.u.l->n, a.flag);
    memcpy(r.u.l->v, a.u.l->v, a.u.l->n * sizeof(jv));
    memcpy(r.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
    r.u.l->n = a.u.l->n + b.u.l->n;
    return r;
  }
  if (op == OP_MUL && ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))) {
    int64_t k = b.u.i < 0 ? 0 : b.u.i;
    if (a.t == JV_STR) {
      if (k && a.u.s.n > rs->lim.max_output / (uint64_t)k)
        RS_FAIL(rs, "LimitError: string too long");
      jinja_sb sb = {0};
      sb.max = SIZE_MAX;
      for (int64_t i = 0; i < k; i++) jinja_sb_put(&rs->c, &sb, a.u.s.p, a.u.s.n);
      return jv_strn(sb.p ? sb.p : "", sb.n);
    }
    if (k && a.u.l->n > (size_t)(rs->lim.max_steps / k)) RS_FAIL(rs, "LimitError: list too long");
    jv r = jv_list_new(&rs->c, a.u.l->n * (size_t)k, a.flag);
    for (int64_t i = 0; i < k; i++)
      for (size_t j = 0; j < a.u.l->n; j++) r.u.l->v[r.u.l->n++] = a.u.l->v[j];
    return r;
  }
  if (op == OP_MUL && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
    return jinja_arith(rs, op, b, a);
  if (op == OP_MOD && a.t == JV_STR) {
    if (b.t == JV_LIST && b.flag == JL_TUPLE)
      return jinja_percent_format(rs, a, b.u.l->v, (int)b.u.l->n);
    return jinja_percent_format(rs, a, &b, 1);
  }
  if (op == OP_ADD && a.t == JV_STR)
    RS_FAIL(rs, "TypeError: can only concatenate str (not \"%s\") to str", jv_type_name(b));
  if (op == OP_ADD && a.t == JV_LIST)
    RS_FAIL(rs, "TypeError: can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
            jv_type_name(b), jv_type_name(a));
  RS_FAIL(rs, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", sym[op],
          jv_type_name(a), jv_type_name(b));
}

static int jinja_contains(jinja_rs *rs, jv hay, jv needle) {
  switch (hay.t) {
    case JV_STR:
      if (needle.t != JV_STR)
        RS_FAIL(rs, "TypeError: 'in <string>' requires string as left operand, not %s",
                jv_type_name(needle));
      if (needle.u.s.n == 0) return 1;
      return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    case JV_LIST:
      for (size_t i = 0; i < hay.u.l->n; i++)
        if (jv_eq(hay.u.l->v[i], needle)) return 1;
      return 0;
    case JV_DICT:
      return jv_dict_find(hay.u.d, needle) != NULL;
    case JV_UNDEF:
      if (hay.flag) jinja_undef_fail(rs, hay);
      return 0;
    default:
      RS_FAIL(rs, "TypeError: argument of type '%s' is not iterable", jv_type_name(hay));
  }
}

static int jinja_compare(jinja_rs *rs, int op, jv a, jv b) {
  if (op >= CMP_LT && op <= CMP_GE) { /* Undefined refuses ordering */
    if (a.t == JV_UNDEF) jinja_undef_fail(rs, a);
    if (b.t == JV_UNDEF) jinja_undef_fail(rs, b);
  }
  switch (op) {
    case CMP_EQ:
      return jv_eq(a, b);
    case CMP_NE:
      return !jv_eq(a, b);
    case CMP_LT:
      return jv_lt(&rs->c, a, b);
    case CMP_GT:
      return jv_lt(&rs->c, b, a);
    case CMP_LE:
      return jv_eq(a, b) || jv_lt(&rs->c, a, b);
    case CMP_GE:
      return jv_eq(a, b) || jv_lt(&rs->c, b, a);
    case CMP_IN:
      return jinja_contains(rs, b, a);
    default:
      return !jinja_contains(rs, b, a);
  }
}

/* ============================================================================================
 * Arguments, string helpers
 * ========================================================================================== */

typedef struct jargs {
  jv *pos;
  int npos;
  const char **kwn;
  jv *kwv;
  int nkw;
} jargs;

static int jargs_get(const jargs *a, int i, const char *name, jv *out) {
  if (i >= 0 && i < a->npos) {
    *out = a->pos[i];
    return 1;
  }
  for (int k = 0; k < a->nkw; k++)
    if (name && !strcmp(a->kwn[k], name)) {
      *out = a->kwv[k];
      return 1;
    }
  return 0;
}

static jv jarg(const jargs *a, int i, const char *name, jv dflt) {
  jv v;
  return jargs_get(a, i, name, &v) ? v : dflt;
}

static jv jinja_need_str(jinja_rs *rs, jv v, const char *what) {
  if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
  if (v.t != JV_STR) RS_FAIL(rs, "TypeError: %s must be str, not %s", what, jv_type_name(v));
  return v;
}

static int64_t jinja_need_int(jinja_rs *rs, jv v, const char *what) {
  if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
  if (v.t != JV_INT && v.t != JV_BOOL)
    RS_FAIL(rs, "TypeError: %s must be an integer, not %s", what, jv_type_name(v));
  return v.u.i;
}

static int jinja_py_space(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* strip: which = 1 left, 2 right, 3 both; chars NULL = whitespace */
static jv jinja_strip(jv s, const jv *chars, int which) {
  const char *p = s.u.s.p;
  size_t a = 0, b = s.u.s.n;
#define JINJA_IN_SET(cp)                                                             \
  (chars ? (memmem(chars->u.s.p, chars->u.s.n, p + i, j - i) != NULL && (j - i) > 0) \
         : jinja_py_space(cp))
  if (which & 1)
    while (a < b) {
      int32_t cp;
      size_t i = a, j = jinja_u8_next(p, b, a, &cp);
      if (!JINJA_IN_SET(cp)) break;
      a = j;
    }
  if (which & 2)
    while (b > a) {
      size_t i = b - 1;
      while (i > a && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
      int32_t cp;
      size_t j = jinja_u8_next(p, b, i, &cp);
      if (!JINJA_IN_SET(cp)) break;
      b = i;
    }
#undef JINJA_IN_SET
  jv r = jv_strn(p + a, b - a);
  return r;
}

/* case mapping by code point: mode 0 lower, 1 upper, 2 title (Python str.title),
 * 3 capitalize, 4 jinja's title filter, 5 swapcase */
static jv jinja_case(jinja_rs *rs, jv s, int mode) {
  jinja_sb b = {0};
  b.max = SIZE_MAX;
  int prev_cased = 0, first = 1, word_start = 0;
  for (size_t i = 0; i < s.u.s.n;) {
    int32_t cp;
    size_t j = jinja_u8_next(s.u.s.p, s.u.s.n, i, &cp);
    int32_t o = cp;
    int cased = utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp ||
                utf8proc_category(cp) == UTF8PROC_CATEGORY_LL ||
                utf8proc_category(cp) == UTF8PROC_CATEGORY_LU ||
                utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
    switch (mode) {
      case 0:
        o = utf8proc_tolower(cp);
        break;
      case 1:
        o = utf8proc_toupper(cp);
        break;
      case 2:
        o = prev_cased ? utf8proc_tolower(cp) : utf8proc_toupper(cp);
        break;
      case 3:
        o = first ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        break;
      case 4: { /* words start after runs of - whitespace ( { [ < */
        int sep =
            cp == '-' || jinja_py_space(cp) || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        o = sep ? cp : (first || word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
        word_start = sep;
        break;
      }
      default:
        o = utf8proc_tolower(cp) != cp ? utf8proc_tolower(cp) : utf8proc_toupper(cp);
    }
    jinja_sb_cp(&rs->c, &b, o);
    prev_cased = cased;
    first = 0;
    i = j;
  }
  jv r = jv_strn(b.p ? b.p : "", b.n);
  return r;
}

static jv jinja_replace(jinja_rs *rs, jv s, jv old, jv new_, int64_t count) {
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  const char *p = s.u.s.p;
  size_t n = s.u.s.n, i = 0;
  int64_t done = 0;
  if (old.u.s.n == 0) {
    while (i <= n && (count < 0 || done < count)) {
      jinja_sb_put(&rs->c, &b, new_.u.s.p, new_.u.s.n);
      done++;
      if (i == n) {
        i = n + 1;
        break;
      }
      size_t j = i + 1;
      while (j < n && ((unsigned char)p[j] & 0xC0) == 0x80) j++;
      jinja_sb_put(&rs->c, &b, p + i, j - i);
      i = j;
    }
    if (i <= n) jinja_sb_put(&rs->c, &b, p + i, n - i);
    return jv_strn(b.p ? b.p : "", b.n);
  }
  while (i <= n) {
    const char *f = (count < 0 || done < count) ? memmem(p + i, n - i, old.u.s.p, old.u.s.n) : NULL;
    if (!f) {
      jinja_sb_put(&rs->c, &b, p + i, n - i);
      break;
    }
    jinja_sb_put(&rs->c, &b, p + i, (size_t)(f - (p + i)));
    jinja_sb_put(&rs->c, &b, new_.u.s.p, new_.u.s.n);
    i = (size_t)(f - p) + old.u.s.n;
    done++;
  }
  return jv_strn(b.p ? b.p : "", b.n);
}

static jv jinja_split(jinja_rs *rs, jv s, jv sep, int64_t maxsplit, int right) {
  jv out = jv_list_new(&rs->c, 0, 0);
  const char *p = s.u.s.p;
  size_t n = s.u.s.n;
  if (sep.t == JV_NONE || sep.t == JV_UNDEF) {
    /* runs of whitespace; leading/trailing ignored */
    if (!right) {
      size_t i = 0;
      int64_t k = 0;
      for (;;) {
        while (i < n) {
          int32_t cp;
          size_t j = jinja_u8_next(p, n, i, &cp);
          if (!jinja_py_space(cp)) break;
          i = j;
        }
        if (i >= n) break;
        if (maxsplit >= 0 && k >= maxsplit) {
          size_t e = n;
          jv t = jv_strn(p + i, e - i);
          jv_list_push(&rs->c, out.u.l, t);
          break;
        }
        size_t st = i;
        while (i < n) {
          int32_t cp;
          size_t j = jinja_u8_next(p, n, i, &cp);
          if (jinja_py_space(cp)) break;
          i = j;
        }
        jv_list_push(&rs->c, out.u.l, jv_strn(p + st, i - st));
        k++;
      }
      return out;
    }
    jv parts = jinja_split(rs, s, jv_none_v, -1, 0);
    if (maxsplit < 0 || (int64_t)parts.u.l->n <= maxsplit + 1) return parts;
    /* rsplit with a limit: the head keeps its inner whitespace */
    size_t keep = parts.u.l->n - (size_t)maxsplit;
    jv last_head = parts.u.l->v[keep - 1];
    const char *hend = last_head.u.s.p + last_head.u.s.n;
    jv head = jv_strn(p, (size_t)(hend - p));
    jv_list_push(&rs->c, out.u.l, head);
    for (size_t i = keep; i < parts.u.l->n; i++) jv_list_push(&rs->c, out.u.l, parts.u.l->v[i]);
    return out;
  }
  if (sep.t != JV_STR) RS_FAIL(rs, "TypeError: must be str or None, not %s", jv_type_name(sep));
  if (sep.u.s.n == 0) RS_FAIL(rs, "ValueError: empty separator");
  const char *q = sep.u.s.p;
  size_t qn = sep.u.s.n;
  if (!right) {
    size_t i = 0;
    int64_t k = 0;
    for (;;) {
      const char *f = (maxsplit < 0 || k < maxsplit) ? memmem(p + i, n - i, q, qn) : NULL;
      if (!f) {
        jv_list_push(&rs->c, out.u.l, jv_strn(p + i, n - i));
        return out;
      }
      jv_list_push(&rs->c, out.u.l, jv_strn(p + i, (size_t)(f - p) - i));
      i = (size_t)(f - p) + qn;
      k++;
    }
  }
  /* rsplit: collect from the right, then reverse */
  jv rev = jv_list_new(&rs->c, 0, 0);
  size_t end = n;
  int64_t k = 0;
  for (;;) {
    const char *f = NULL;
    if ((maxsplit < 0 || k < maxsplit) && end >= qn)
      for (size_t i = end - qn + 1; i-- > 0;)
        if (!memcmp(p + i, q, qn)) {
          f = p + i;
          break;
        }
    if (!f) {
      jv_list_push(&rs->c, rev.u.l, jv_strn(p, end));
      break;
    }
    size_t at = (size_t)(f - p);
    jv_list_push(&rs->c, rev.u.l, jv_strn(p + at + qn, end - at - qn));
    end = at;
    k++;
  }
  for (size_t i = rev.u.l->n; i-- > 0;) jv_list_push(&rs->c, out.u.l, rev.u.l->v[i]);
  return out;
}

static jv jinja_splitlines(jinja_rs *rs, jv s, int keepends) {
  jv out = jv_list_new(&rs->c, 0, 0);
  const char *p = s.u.s.p;
  size_t n = s.u.s.n, st = 0, i = 0;
  while (i < n) {
    int32_t cp;
    size_t j = jinja_u8_next(p, n, i, &cp);
    int br = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
             cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (br) {
      size_t e = j;
      if (cp == '\r' && j < n && p[j] == '\n') e = j + 1;
      jv_list_push(&rs->c, out.u.l, jv_strn(p + st, (keepends ? e : i) - st));
      st = i = e;
    } else {
      i = j;
    }
  }
  if (st < n) jv_list_push(&rs->c, out.u.l, jv_strn(p + st, n - st));
  return out;
}

static int jinja_starts(jv s, jv pre, int end) {
  if (pre.u.s.n > s.u.s.n) return 0;
  return !memcmp(s.u.s.p + (end ? s.u.s.n - pre.u.s.n : 0), pre.u.s.p, pre.u.s.n);
}

static jv jinja_join(jinja_rs *rs, jv sep, jlist *items) {
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  for (size_t i = 0; i < items->n; i++) {
    if (i) jinja_sb_put(&rs->c, &b, sep.u.s.p, sep.u.s.n);
    jinja_str_into(&rs->c, &b, items->v[i], 0);
  }
  return jv_strn(b.p ? b.p : "", b.n);
}

static jv jinja_format(jinja_rs *rs, jv fmt, const jargs *a) {
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  const char *p = fmt.u.s.p;
  size_t n = fmt.u.s.n;
  int auto_i = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
      jinja_sb_put(&rs->c, &b, "{", 1);
      i++;
    } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
      jinja_sb_put(&rs->c, &b, "}", 1);
      i++;
    } else if (p[i] == '{') {
      size_t e = i + 1;
      while (e < n && p[e] != '}') e++;
      if (e >= n) RS_FAIL(rs, "ValueError: Single '{' encountered in format string");
      const char *f = p + i + 1;
      size_t fn = e - i - 1;
      jv v;
      if (fn == 0) {
        if (!jargs_get(a, auto_i++, NULL, &v)) RS_FAIL(rs, "IndexError: format index out of range");
      } else if (isdigit((unsigned char)f[0])) {
        if (!jargs_get(a, atoi(f), NULL, &v)) RS_FAIL(rs, "IndexError: format index out of range");
      } else {
        const char *name = jinja_strndup(&rs->c, f, fn);
        if (!jargs_get(a, -1, name, &v)) RS_FAIL(rs, "KeyError: '%s'", name);
      }
      jinja_str_into(&rs->c, &b, v, 0);
      i = e;
    } else {
      jinja_sb_put(&rs->c, &b, p + i, 1);
    }
  }
  return jv_strn(b.p ? b.p : "", b.n);
}

/* Python's printf-style `fmt % args` (the `format` filter and the % operator on strings):
 * conversions s r d i f F e E g G x X o c and %%, with flags - 0 + space, width, precision. */
static jv jinja_percent_format(jinja_rs *rs, jv fmt, const jv *args, int nargs) {
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  int k = 0;
  const char *p = fmt.u.s.p;
  size_t n = fmt.u.s.n;
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '%') {
      jinja_sb_put(&rs->c, &b, p + i, 1);
      continue;
    }
    char spec[64], flags[8];
    int nf = 0, width = -1, prec = -1;
    i++;
    while (i < n && strchr("-0+ #", p[i]) && nf < 6) flags[nf++] = p[i++];
    flags[nf] = 0;
    if (i < n && isdigit((unsigned char)p[i])) {
      width = 0;
      while (i < n && isdigit((unsigned char)p[i]) && width < 10000)
        width = width * 10 + p[i++] - '0';
    }
    if (i < n && p[i] == '.') {
      prec = 0;
      i++;
      while (i < n && isdigit((unsigned char)p[i]) && prec < 10000) prec = prec * 10 + p[i++] - '0';
    }
    if (i >= n) RS_FAIL(rs, "ValueError: incomplete format");
    char t = p[i];
    if (t == '%') {
      jinja_sb_put(&rs->c, &b, "%", 1);
      continue;
    }
    if (k >= nargs) RS_FAIL(rs, "TypeError: not enough arguments for format string");
    jv v = args[k++];
    if (width > 4096 || prec > 4096) RS_FAIL(rs, "LimitError: format width too large");
    if (t == 's' || t == 'r' || t == 'c') {
      jinja_sb one = {0};
      one.max = rs->lim.max_output;
      if (t == 's')
        jinja_str_into(&rs->c, &one, v, 0);
      else if (t == 'r')
        jinja_repr_into(&rs->c, &one, v, 0);
      else if (v.t == JV_INT && v.u.i >= 0 && v.u.i <= 0x10FFFF)
        jinja_sb_cp(&rs->c, &one, (int32_t)v.u.i);
      else if (v.t == JV_STR && jinja_u8_len(v.u.s.p, v.u.s.n) == 1)
        jinja_sb_put(&rs->c, &one, v.u.s.p, v.u.s.n);
      else
        RS_FAIL(rs, "TypeError: %%c requires an int or a unicode character");
      size_t len = one.n;
      if (prec >= 0) len = jinja_u8_off(one.p ? one.p : "", one.n, (size_t)prec);
      int64_t pad = width - (int64_t)jinja_u8_len(one.p ? one.p : "", len);
      int left = strchr(flags, '-') != NULL;
      for (int64_t q = 0; !left && q < pad; q++) jinja_sb_put(&rs->c, &b, " ", 1);
      jinja_sb_put(&rs->c, &b, one.p ? one.p : "", len);
      for (int64_t q = 0; left && q < pad; q++) jinja_sb_put(&rs->c, &b, " ", 1);
      continue;
    }
    if (!jv_is_num(v))
      RS_FAIL(rs, "TypeError: %%%c format: a real number is required, not %s", t, jv_type_name(v));
    char w[16] = "", pr[16] = "";
    if (width >= 0) snprintf(w, sizeof w, "%d", width);
    if (prec >= 0) snprintf(pr, sizeof pr, ".%d", prec);
    char out[8300];
    if (strchr("diouxX", t)) {
      if (v.t == JV_FLOAT && !isfinite(v.u.f)) RS_FAIL(rs, "OverflowError: cannot convert float");
      long long x = v.t == JV_FLOAT ? (long long)v.u.f : (long long)v.u.i;
      snprintf(spec, sizeof spec, "%%%s%s%sll%c", flags, w, pr, t == 'i' || t == 'u' ? 'd' : t);
      snprintf(out, sizeof out, spec, x);
    } else if (strchr("fFeEgG", t)) {
      snprintf(spec, sizeof spec, "%%%s%s%s%c", flags, w, pr, t);
      snprintf(out, sizeof out, spec, jv_num(v));
    } else {
      RS_FAIL(rs, "ValueError: unsupported format character '%c'", t);
    }
    jinja_sb_puts(&rs->c, &b, out);
  }
  if (k < nargs) RS_FAIL(rs, "TypeError: not all arguments converted during string formatting");
  return jv_strn(b.p ? b.p : "", b.n);
}

static jv jinja_html_escape(jinja_rs *rs, jv v) {
  if (v.t == JV_STR && v.flag) return v;
  jv s = jinja_to_str(&rs->c, v);
  jinja_sb b = {0};
  b.max = SIZE_MAX;
  for (size_t i = 0; i < s.u.s.n; i++) {
    char ch = s.u.s.p[i];
    const char *e = ch == '&'    ? "&amp;"
                    : ch == '<'  ? "&lt;"
                    : ch == '>'  ? "&gt;"
                    : ch == '"'  ? "&#34;"
                    : ch == '\'' ? "&#39;"
                                 : NULL;
    if (e)
      jinja_sb_puts(&rs->c, &b, e);
    else
      jinja_sb_put(&rs->c, &b, &ch, 1);
  }
  jv r = jv_strn(b.p ? b.p : "", b.n);
  r.flag = 1;
  return r;
}

/* stable merge sort of idx by keys (ascending; jv_lt may raise) */
static void jinja_msort(jinja_rs *rs, size_t *idx, size_t n, const jv *keys, size_t *tmp) {
  if (n < 2) return;
  size_t h = n / 2;
  jinja_msort(rs, idx, h, keys, tmp);
  jinja_msort(rs, idx + h, n - h, keys, tmp);
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = jv_lt(&rs->c, keys[idx[j]], keys[idx[i]]) ? idx[j++] : idx[i++];
  while (i < h) tmp[k++] = idx[i++];
  while (j < n) tmp[k++] = idx[j++];
  memcpy(idx, tmp, n * sizeof *idx);
}

static jv jinja_sort_key(jinja_rs *rs, jv v, int case_sensitive) {
  if (!case_sensitive && v.t == JV_STR) return jinja_case(rs, v, 0);
  return v;
}

/* attribute="a.b" lookups of map/sort/selectattr: dotted path, integers as indexes */
static jv jinja_attr_path(jinja_rs *rs, jv v, jv path) {
  if (path.t == JV_INT) return jinja_getitem(rs, v, path);
  jv s = jinja_to_str(&rs->c, path);
  const char *p = s.u.s.p;
  size_t n = s.u.s.n, i = 0;
  while (i <= n) {
    size_t e = i;
    while (e < n && p[e] != '.') e++;
    jv key = jv_strn(jinja_strndup(&rs->c, p + i, e - i), e - i);
    int isnum = e > i;
    for (size_t k = i; k < e; k++) isnum &= isdigit((unsigned char)p[k]) != 0;
    if (isnum) key = jv_int(atoll(key.u.s.p));
    v = jinja_getitem(rs, v, key);
    i = e + 1;
  }
  return v;
}

/* ============================================================================================
 * Tests and filters
 * ========================================================================================== */

static jv jinja_call(jinja_rs *rs, jv f, const jargs *a, jv caller);
static jv jinja_filter(jinja_rs *rs, const char *name, jv v, const jargs *a);

static jv jinja_str_method(jinja_rs *rs, jv s, const char *m, const jargs *a);

static int jinja_test(jinja_rs *rs, const char *name, jv v, const jargs *a) {
  static const char *const one_arg[] = {
      "divisibleby", "eq", "equalto",     "==", "ne", "!=", "lt", "lessthan", "<", "le",
      "<=",          "gt", "greaterthan", ">",  "ge", ">=", "in", "sameas",   NULL};
  int want = jinja_in_list(name, one_arg);
  if (a->npos + a->nkw != want)
    RS_FAIL(rs, "TypeError: test_%s() takes %d positional argument%s but %d were given", name,
            want + 1, want ? "s" : "", a->npos + a->nkw + 1);
  jv x = jarg(a, 0, NULL, jv_undef_v);
  if (!strcmp(name, "defined")) return v.t != JV_UNDEF;
  if (!strcmp(name, "undefined")) return v.t == JV_UNDEF;
  if (!strcmp(name, "none")) return v.t == JV_NONE;
  if (!strcmp(name, "boolean")) return v.t == JV_BOOL;
  if (!strcmp(name, "true")) return v.t == JV_BOOL && v.u.i;
  if (!strcmp(name, "false")) return v.t == JV_BOOL && !v.u.i;
  if (!strcmp(name, "integer")) return v.t == JV_INT;
  if (!strcmp(name, "float")) return v.t == JV_FLOAT;
  if (!strcmp(name, "number")) return jv_is_num(v);
  if (!strcmp(name, "string")) return v.t == JV_STR;
  if (!strcmp(name, "mapping")) return v.t == JV_DICT;
  if (!strcmp(name, "iterable"))
    return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
  if (!strcmp(name, "sequence"))
    return v.t == JV_STR || (v.t == JV_LIST && v.flag != JL_GEN) || v.t == JV_DICT ||
           v.t == JV_UNDEF;
  if (!strcmp(name, "callable")) return v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METH;
  if (!strcmp(name, "escaped")) return v.t == JV_STR && v.flag;
  if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
    if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
    jv d = !strcmp(name, "divisibleby") ? x : jv_int(2);
    if (!jv_is_num(v) || !jv_is_num(d))
      RS_FAIL(rs, "TypeError: unsupported operand type(s) for %%: '%s' and '%s'", jv_type_name(v),
              jv_type_name(d));
    jv m = jinja_arith(rs, OP_MOD, v, d);
    return !strcmp(name, "odd") ? jv_eq(m, jv_int(1)) : jv_eq(m, jv_int(0));
  }
  if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_eq(v, x);
  if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_eq(v, x);
  if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
    return jinja_compare(rs, CMP_LT, v, x);
  if (!strcmp(name, "le") || !strcmp(name, "<=")) return jinja_compare(rs, CMP_LE, v, x);
  if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
    return jinja_compare(rs, CMP_GT, v, x);
  if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jinja_compare(rs, CMP_GE, v, x);
  if (!strcmp(name, "in")) return jinja_contains(rs, x, v);
  if (!strcmp(name, "sameas")) {
    if (v.t != x.t) return 0;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return 1;
    if (v.t == JV_BOOL || v.t == JV_INT) return v.u.i == x.u.i;
    return jv_eq(v, x) && v.u.l == x.u.l;
  }
  if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
    jargs none = {0};
    jv s = jinja_to_str(&rs->c, v);
    return jv_truthy(jinja_str_method(rs, s, name[0] == 'l' ? "islower" : "isupper", &none));
  }
  RS_FAIL(rs, "TemplateAssertionError: No test named '%s'.", name);
}

/* select/reject/selectattr/rejectattr: keep items whose test (or truthiness) is want */
static jv jinja_select(jinja_rs *rs, jv seq, const jargs *a, int attr, int want) {
  jlist *items = jinja_iter(rs, seq);
  jv out = jv_list_new(&rs->c, 0, 0);
  int k = attr ? 1 : 0;
  jv attr_name = attr ? jarg(a, 0, NULL, jv_undef_v) : jv_undef_v;
  jv test = jv_undef_v;
  jargs rest = {0};
  if (a->npos > k) {
    test = a->pos[k];
    rest.pos = a->pos + k + 1;
    rest.npos = a->npos - k - 1;
  }
  rest.kwn = a->kwn;
  rest.kwv = a->kwv;
  rest.nkw = a->nkw;
  const char *tname = test.t == JV_STR ? jinja_strndup(&rs->c, test.u.s.p, test.u.s.n) : NULL;
  for (size_t i = 0; i < items->n; i++) {
    if (++rs->steps > rs->lim.max_steps) RS_FAIL(rs, "LimitError: too many steps");
    jv x = attr ? jinja_attr_path(rs, items->v[i], attr_name) : items->v[i];
    int r = tname ? jinja_test(rs, tname, x, &rest) : jv_truthy(x);
    if (r == want) jv_list_push(&rs->c, out.u.l, items->v[i]);
  }
  out.flag = JL_GEN;
  return out;
}

static jv jinja_sorted(jinja_rs *rs, jlist *items, int reverse, int case_sensitive, jv attr,
                       int by_value_of_pair) {
  size_t n = items->n;
  jv *keys = jinja_alloc(&rs->c, (n ? n : 1) * sizeof *keys);
  size_t *idx = jinja_alloc(&rs->c, (n ? n : 1) * sizeof *idx);
  size_t *tmp = jinja_alloc(&rs->c, (n ? n : 1) * sizeof *tmp);
  for (size_t i = 0; i < n; i++) {
    jv k = items->v[i];
    if (by_value_of_pair >= 0)
      k = k.u.l->v[by_value_of_pair];
    else if (attr.t != JV_UNDEF && attr.t != JV_NONE)
      k = jinja_attr_path(rs, k, attr);
    keys[i] = jinja_sort_key(rs, k, case_sensitive);
    idx[i] = i;
  }
  if (reverse) { /* Python sorts reverse=True stably too: reverse, sort, reverse */
    for (size_t i = 0; i < n / 2; i++) {
      size_t t = idx[i];
      idx[i] = idx[n - 1 - i];
      idx[n - 1 - i] = t;
    }
  }
  jinja_msort(rs, idx, n, keys, tmp);
  jv out = jv_list_new(&rs->c, n, 0);
  for (size_t i = 0; i < n; i++) out.u.l->v[i] = items->v[idx[reverse ? n - 1 - i : i]];
  out.u.l->n = n;
  return out;
}

static jv jinja_tojson(jinja_rs *rs, jv v, const jargs *a) {
  jinja_json_opts o = {NULL, ", ", ": ", 0};
  jv ind = jarg(a, 1, "indent", jv_none_v);
  jv seps = jarg(a, 2, "separators", jv_none_v);
  jv sk = jarg(a, 3, "sort_keys", jv_bool(0));
  jv ea = jarg(a, 0, "ensure_ascii", jv_bool(0));
  if (jv_truthy(ea)) RS_FAIL(rs, "NotImplementedError: tojson(ensure_ascii=True) is not supported");
  if (ind.t == JV_INT || ind.t == JV_BOOL) {
    int64_t k = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i;
    char *sp = jinja_alloc(&rs->c, (size_t)k + 1);
    memset(sp, ' ', (size_t)k);
    sp[k] = 0;
    o.indent = sp;
    o.item_sep = ",";
  } else if (ind.t == JV_STR) {
    o.indent = jinja_strndup(&rs->c, ind.u.s.p, ind.u.s.n);
    o.item_sep = ",";
  } else if (ind.t != JV_NONE) {
    RS_FAIL(rs, "TypeError: indent must be an int, a str or None");
  }
  if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR &&
      seps.u.l->v[1].t == JV_STR) {
    o.item_sep = jinja_strndup(&rs->c, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
    o.key_sep = jinja_strndup(&rs->c, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
  } else if (seps.t != JV_NONE) {
    RS_FAIL(rs, "TypeError: separators must be a pair of strings");
  }
  o.sort_keys = jv_truthy(sk);
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  jinja_json_into(&rs->c, &b, v, &o, 0);
  return jv_strn(b.p ? b.p : "", b.n);
}

static jv jinja_indent(jinja_rs *rs, jv s, const jargs *a) {
  jv w = jarg(a, 0, "width", jv_int(4));
  int first = jv_truthy(jarg(a, 1, "first", jv_bool(0)));
  int blank = jv_truthy(jarg(a, 2, "blank", jv_bool(0)));
  jv ind;
  if (w.t == JV_STR)
    ind = w;
  else {
    int64_t k = jinja_need_int(rs, w, "width");
    if (k < 0) k = 0;
    if (k > 4096) RS_FAIL(rs, "LimitError: indent too wide");
    char *sp = jinja_alloc(&rs->c, (size_t)k + 1);
    memset(sp, ' ', (size_t)k);
    ind = jv_strn(sp, (size_t)k);
  }
  jv withnl = jinja_str_cat(rs, s, jv_strn("\n", 1));
  jlist *lines = jinja_splitlines(rs, withnl, 0).u.l;
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  if (first) jinja_sb_put(&rs->c, &b, ind.u.s.p, ind.u.s.n);
  for (size_t i = 0; i < lines->n; i++) {
    jv ln = lines->v[i];
    if (i) {
      jinja_sb_put(&rs->c, &b, "\n", 1);
      if (blank || ln.u.s.n) jinja_sb_put(&rs->c, &b, ind.u.s.p, ind.u.s.n);
    }
    jinja_sb_put(&rs->c, &b, ln.u.s.p, ln.u.s.n);
  }
  return jv_strn(b.p ? b.p : "", b.n);
}

/* dict.items(): a list of (key, value) tuples */
static jv jinja_dict_items(jinja_rs *rs, jv v) {
  jv out = jv_list_new(&rs->c, v.u.d->n, 0);
  for (size_t i = 0; i < v.u.d->n; i++) {
    jv t = jv_list_new(&rs->c, 2, JL_TUPLE);
    t.u.l->v[0] = v.u.d->k[i];
    t.u.l->v[1] = v.u.d->v[i];
    t.u.l->n = 2;
    out.u.l->v[i] = t;
  }
  out.u.l->n = v.u.d->n;
  return out;
}

/* The parameters of each filter after its value, in order ("*" = any arguments): a call with
 * more positional arguments or another keyword is a TypeError, as in Python. */
static const char *const jinja_filter_params[][5] = {
    {"default", "default_value", "boolean"},
    {"d", "default_value", "boolean"},
    {"tojson", "ensure_ascii", "indent", "separators", "sort_keys"},
    {"join", "d", "attribute"},
    {"sort", "reverse", "case_sensitive", "attribute"},
    {"dictsort", "case_sensitive", "by", "reverse"},
    {"unique", "case_sensitive", "attribute"},
    {"int", "default", "base"},
    {"float", "default"},
    {"round", "precision", "method"},
    {"sum", "attribute", "start"},
    {"min", "case_sensitive", "attribute"},
    {"max", "case_sensitive", "attribute"},
    {"attr", "name"},
    {"batch", "linecount", "fill_with"},
    {"trim", "chars"},
    {"replace", "old", "new", "count"},
    {"indent", "width", "first", "blank"},
    {"center", "width"},
    {"map", "*"},
    {"select", "*"},
    {"reject", "*"},
    {"selectattr", "*"},
    {"rejectattr", "*"},
    {"format", "*"},
};

static void jinja_filter_check_args(jinja_rs *rs, const char *name, const jargs *a) {
  const char *const *params = NULL;
  for (size_t i = 0; i < sizeof jinja_filter_params / sizeof *jinja_filter_params; i++)
    if (!strcmp(jinja_filter_params[i][0], name)) params = jinja_filter_params[i] + 1;
  int np = 0;
  if (params) {
    if (params[0] && !strcmp(params[0], "*")) return;
    while (np < 4 && params[np]) np++;
  }
  if (a->npos > np)
    RS_FAIL(rs, "TypeError: filter %s takes %d argument%s but %d were given", name, np,
            np == 1 ? "" : "s", a->npos);
  for (int k = 0; k < a->nkw; k++) {
    int ok = 0;
    for (int i = 0; i < np; i++) ok |= !strcmp(params[i], a->kwn[k]);
    if (!ok)
      RS_FAIL(rs, "TypeError: filter %s got an unexpected keyword argument '%s'", name, a->kwn[k]);
  }
}

static jv jinja_filter(jinja_rs *rs, const char *name, jv v, const jargs *a) {
#define IS(x) (!strcmp(name, x))
  jinja_filter_check_args(rs, name, a);
  if (IS("default") || IS("d")) {
    jv dflt = jarg(a, 0, "default_value", jv_strn("", 0));
    int boolean = jv_truthy(jarg(a, 1, "boolean", jv_bool(0)));
    if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) return dflt;
    return v;
  }
  if (IS("tojson")) return jinja_tojson(rs, v, a);
  if (IS("length") || IS("count")) return jv_int(jinja_len(rs, v));
  if (IS("string")) {
    if (v.t == JV_STR) return v;
    return jinja_to_str(&rs->c, v);
  }
  if (IS("safe")) {
    jv s = jinja_to_str(&rs->c, v);
    s.flag = 1;
    return s;
  }
  if (IS("escape") || IS("e") || IS("forceescape")) return jinja_html_escape(rs, v);
  if (IS("items")) {
    jv out = jv_list_new(&rs->c, 0, 0);
    if (v.t != JV_UNDEF) {
      if (v.t != JV_DICT) RS_FAIL(rs, "TypeError: Can only get item pairs from a mapping.");
      out = jinja_dict_items(rs, v);
    }
    out.flag = JL_GEN;
    return out;
  }
  if (IS("list")) {
    jlist *l = jinja_iter(rs, v);
    jv out = jv_list_new(&rs->c, l->n, 0);
    if (l->n) memcpy(out.u.l->v, l->v, l->n * sizeof(jv));
    out.u.l->n = l->n;
    return out;
  }
  if (IS("first") || IS("last")) {
    if (IS("last") && (v.t == JV_DICT || (v.t == JV_LIST && v.flag == JL_GEN)))
      RS_FAIL(rs, "TypeError: '%s' object is not reversible", jv_type_name(v));
    jlist *l = jinja_iter(rs, v);
    if (!l->n)
      return jv_undef_msg(IS("first") ? "No first item, sequence was empty."
                                      : "No last item, sequence was empty.");
    return IS("first") ? l->v[0] : l->v[l->n - 1];
  }
  if (IS("join")) {
    jv sep = jarg(a, 0, "d", jv_strn("", 0));
    jv attr = jarg(a, 1, "attribute", jv_none_v);
    jlist *l = jinja_iter(rs, v);
    if (attr.t != JV_NONE) {
      jv m = jv_list_new(&rs->c, l->n, 0);
      for (size_t i = 0; i < l->n; i++) m.u.l->v[i] = jinja_attr_path(rs, l->v[i], attr);
      m.u.l->n = l->n;
      l = m.u.l;
    }
    return jinja_join(rs, jinja_to_str(&rs->c, sep), l);
  }
  if (IS("map")) {
    jlist *l = jinja_iter(rs, v);
    jv out = jv_list_new(&rs->c, l->n, 0);
    jv attr;
    if (jargs_get(a, -1, "attribute", &attr)) {
      jv dflt;
      int has_d = jargs_get(a, -1, "default", &dflt);
      for (size_t i = 0; i < l->n; i++) {
        jv x = jinja_attr_path(rs, l->v[i], attr);
        out.u.l->v[out.u.l->n++] = (x.t == JV_UNDEF && has_d) ? dflt : x;
      }
      out.flag = JL_GEN;
      return out;
    }
    if (a->npos < 1 || a->pos[0].t != JV_STR)
      RS_FAIL(rs, "FilterArgumentError: map requires a filter argument");
    const char *fname = jinja_strndup(&rs->c, a->pos[0].u.s.p, a->pos[0].u.s.n);
    jargs rest = {a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw};
    for (size_t i = 0; i < l->n; i++) {
      if (++rs->steps > rs->lim.max_steps) RS_FAIL(rs, "LimitError: too many steps");
      out.u.l->v[out.u.l->n++] = jinja_filter(rs, fname, l->v[i], &rest);
    }
    out.flag = JL_GEN;
    return out;
  }
  if (IS("select")) return jinja_select(rs, v, a, 0, 1);
  if (IS("reject")) return jinja_select(rs, v, a, 0, 0);
  if (IS("selectattr")) return jinja_select(rs, v, a, 1, 1);
  if (IS("rejectattr")) return jinja_select(rs, v, a, 1, 0);
  if (IS("sort")) {
    int rev = jv_truthy(jarg(a, 0, "reverse", jv_bool(0)));
    int cs = jv_truthy(jarg(a, 1, "case_sensitive", jv_bool(0)));
    return jinja_sorted(rs, jinja_iter(rs, v), rev, cs, jarg(a, 2, "attribute", jv_none_v), -1);
  }
  if (IS("dictsort")) {
    if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
    if (v.t != JV_DICT) RS_FAIL(rs, "TypeError: dictsort expects a mapping");
    int cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(0)));
    jv by = jarg(a, 1, "by", jv_strn("key", 3));
    int rev = jv_truthy(jarg(a, 2, "reverse", jv_bool(0)));
    int pos = by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5) ? 1 : 0;
    return jinja_sorted(rs, jinja_dict_items(rs, v).u.l, rev, cs, jv_none_v, pos);
  }
  if (IS("unique")) {
    int cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(0)));
    jv attr = jarg(a, 1, "attribute", jv_none_v);
    jlist *l = jinja_iter(rs, v);
    jv out = jv_list_new(&rs->c, 0, 0), seen = jv_list_new(&rs->c, 0, 0);
    for (size_t i = 0; i < l->n; i++) {
      jv k = attr.t != JV_NONE ? jinja_attr_path(rs, l->v[i], attr) : l->v[i];
      k = jinja_sort_key(rs, k, cs);
      if (jinja_contains(rs, seen, k)) continue;
      jv_list_push(&rs->c, seen.u.l, k);
      jv_list_push(&rs->c, out.u.l, l->v[i]);
    }
    out.flag = JL_GEN;
    return out;
  }
  if (IS("reverse")) {
    if (v.t == JV_STR) return jinja_slice(rs, v, jv_none_v, jv_none_v, jv_int(-1));
    jlist *l = jinja_iter(rs, v);
    jv out = jv_list_new(&rs->c, l->n, 0);
    for (size_t i = 0; i < l->n; i++) out.u.l->v[i] = l->v[l->n - 1 - i];
    out.u.l->n = l->n;
    out.flag = JL_GEN;
    return out;
  }
  if (IS("int")) {
    jv dflt = jarg(a, 0, "default", jv_int(0));
    if (v.t == JV_INT) return v;
    if (v.t == JV_BOOL) return jv_int(v.u.i);
    if (v.t == JV_FLOAT)
      return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? jv_int((int64_t)v.u.f) : dflt;
    if (v.t == JV_STR) {
      jv t = jinja_strip(v, NULL, 3);
      char *s = jinja_strndup(&rs->c, t.u.s.p, t.u.s.n), *end;
      errno = 0;
      long long x = strtoll(s, &end, 10);
      if (*s && !*end && !errno) return jv_int(x);
      double d = strtod(s, &end);
      if (*s && !*end && isfinite(d) && fabs(d) < 9.2e18) return jv_int((int64_t)d);
    }
    return dflt;
  }
  if (IS("float")) {
    jv dflt = jarg(a, 0, "default", jv_float(0));
    if (v.t == JV_FLOAT) return v;
    if (v.t == JV_INT || v.t == JV_BOOL) return jv_float((double)v.u.i);
    if (v.t == JV_STR) {
      jv t = jinja_strip(v, NULL, 3);
      char *s = jinja_strndup(&rs->c, t.u.s.p, t.u.s.n), *end;
      double d = strtod(s, &end);
      if (*s && !*end) return jv_float(d);
    }
    return dflt;
  }
  if (IS("abs")) {
    if (v.t == JV_INT || v.t == JV_BOOL) {
      if (v.u.i == INT64_MIN) RS_FAIL(rs, "OverflowError: integer result out of range");
      return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
    if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
    RS_FAIL(rs, "TypeError: bad operand type for abs(): '%s'", jv_type_name(v));
  }
  if (IS("round")) {
    int64_t prec = jinja_need_int(rs, jarg(a, 0, "precision", jv_int(0)), "precision");
    jv m = jarg(a, 1, "method", jv_strn("common", 6));
    if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
    if (!jv_is_num(v))
      RS_FAIL(rs, "TypeError: type %s doesn't define __round__ method", jv_type_name(v));
    double x = jv_num(v), sc = pow(10.0, (double)prec), r;
    if (m.t == JV_STR && m.u.s.n == 4 && !memcmp(m.u.s.p, "ceil", 4))
      r = ceil(x * sc) / sc;
    else if (m.t == JV_STR && m.u.s.n == 5 && !memcmp(m.u.s.p, "floor", 5))
      r = floor(x * sc) / sc;
    else if (m.t == JV_STR && m.u.s.n == 6 && !memcmp(m.u.s.p, "common", 6))
      r = prec == 0 ? nearbyint(x) : nearbyint(x * sc) / sc;
    else
      RS_FAIL(rs, "FilterArgumentError: method must be common, ceil or floor");
    return jv_float(r);
  }
  if (IS("sum")) {
    jv attr = jarg(a, 0, "attribute", jv_none_v);
    jv acc = jarg(a, 1, "start", jv_int(0));
    jlist *l = jinja_iter(rs, v);
    for (size_t i = 0; i < l->n; i++)
      acc = jinja_arith(rs, OP_ADD, acc,
                        attr.t != JV_NONE ? jinja_attr_path(rs, l->v[i], attr) : l->v[i]);
    return acc;
  }
  if (IS("min") || IS("max")) {
    jlist *l = jinja_iter(rs, v);
    int cs = jv_truthy(jarg(a, 0, "case_sensitive", jv_bool(0)));
    jv attr = jarg(a, 1, "attribute", jv_none_v);
    if (!l->n) return jv_undef_msg("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < l->n; i++) {
      jv ki = l->v[i], kb = l->v[best];
      if (attr.t != JV_NONE) ki = jinja_attr_path(rs, ki, attr), kb = jinja_attr_path(rs, kb, attr);
      ki = jinja_sort_key(rs, ki, cs);
      kb = jinja_sort_key(rs, kb, cs);
      if (IS("min") ? jv_lt(&rs->c, ki, kb) : jv_lt(&rs->c, kb, ki)) best = i;
    }
    return l->v[best];
  }
  if (IS("attr")) {
    jv n = jinja_need_str(rs, jarg(a, 0, "name", jv_undef_v), "attribute name");
    const char *an = jinja_strndup(&rs->c, n.u.s.p, n.u.s.n);
    if (v.t == JV_DICT && !jinja_in_list(an, jinja_dict_methods)) return jinja_no_attr(rs, v, an);
    return jinja_getattr(rs, v, an);
  }
  if (IS("batch")) {
    int64_t k = jinja_need_int(rs, jarg(a, 0, "linecount", jv_undef_v), "linecount");
    if (k <= 0) RS_FAIL(rs, "ValueError: linecount must be positive");
    jlist *l = jinja_iter(rs, v);
    jv out = jv_list_new(&rs->c, 0, 0), cur = jv_list_new(&rs->c, 0, 0);
    for (size_t i = 0; i < l->n; i++) {
      jv_list_push(&rs->c, cur.u.l, l->v[i]);
      if ((int64_t)cur.u.l->n == k) {
        jv_list_push(&rs->c, out.u.l, cur);
        cur = jv_list_new(&rs->c, 0, 0);
      }
    }
    if (cur.u.l->n) jv_list_push(&rs->c, out.u.l, cur);
    return out;
  }
  /* string filters: the value is converted with str() first */
  if (v.t == JV_UNDEF && v.flag) jinja_undef_fail(rs, v);
  if (IS("format")) {
    if (a->nkw) RS_FAIL(rs, "NotImplementedError: format with keyword arguments is not supported");
    return jinja_percent_format(rs, jinja_to_str(&rs->c, v), a->pos, a->npos);
  }
  jv s = jinja_to_str(&rs->c, v);
  if (IS("trim")) {
    jv ch = jarg(a, 0, "chars", jv_none_v);
    if (ch.t == JV_STR) return jinja_strip(s, &ch, 3);
    return jinja_strip(s, NULL, 3);
  }
  if (IS("lower")) return jinja_case(rs, s, 0);
  if (IS("upper")) return jinja_case(rs, s, 1);
  if (IS("title")) return jinja_case(rs, s, 4);
  if (IS("capitalize")) return jinja_case(rs, s, 3);
  if (IS("replace")) {
    jv o = jinja_to_str(&rs->c, jarg(a, 0, "old", jv_undef_v));
    jv n = jinja_to_str(&rs->c, jarg(a, 1, "new", jv_undef_v));
    jv c = jarg(a, 2, "count", jv_none_v);
    return jinja_replace(rs, s, o, n, c.t == JV_NONE ? -1 : jinja_need_int(rs, c, "count"));
  }
  if (IS("indent")) return jinja_indent(rs, s, a);
  if (IS("wordcount")) {
    int64_t k = 0;
    int in = 0;
    for (size_t i = 0; i < s.u.s.n;) {
      int32_t cp;
      size_t j = jinja_u8_next(s.u.s.p, s.u.s.n, i, &cp);
      int w = cp == '_' || (cp < 128 ? isalnum(cp) != 0
                                     : (utf8proc_category(cp) >= UTF8PROC_CATEGORY_LU &&
                                        utf8proc_category(cp) <= UTF8PROC_CATEGORY_NO &&
                                        utf8proc_category(cp) != UTF8PROC_CATEGORY_MN &&
                                        utf8proc_category(cp) != UTF8PROC_CATEGORY_MC &&
                                        utf8proc_category(cp) != UTF8PROC_CATEGORY_ME));
      if (w && !in) k++;
      in = w;
      i = j;
    }
    return jv_int(k);
  }
  if (IS("center")) {
    int64_t w = jinja_need_int(rs, jarg(a, 0, "width", jv_int(80)), "width");
    int64_t len = (int64_t)jinja_u8_len(s.u.s.p, s.u.s.n);
    if (w > 4096) RS_FAIL(rs, "LimitError: width too large");
    if (w <= len) return s;
    int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
    jinja_sb b = {0};
    b.max = SIZE_MAX;
    for (int64_t i = 0; i < left; i++) jinja_sb_put(&rs->c, &b, " ", 1);
    jinja_sb_put(&rs->c, &b, s.u.s.p, s.u.s.n);
    for (int64_t i = left; i < pad; i++) jinja_sb_put(&rs->c, &b, " ", 1);
    return jv_strn(b.p, b.n);
  }
  RS_FAIL(rs, "TemplateAssertionError: No filter named '%s'.", name);
#undef IS
}

/* ============================================================================================
 * Calls: builtins, methods, macros
 * ========================================================================================== */

static jv jinja_str_method(jinja_rs *rs, jv s, const char *m, const jargs *a) {
#define IS(x) (!strcmp(m, x))
  jv x0 = jarg(a, 0, NULL, jv_none_v);
  if (IS("startswith") || IS("endswith")) {
    int end = IS("endswith");
    if (x0.t == JV_LIST && x0.flag) {
      for (size_t i = 0; i < x0.u.l->n; i++)
        if (jinja_starts(s, jinja_need_str(rs, x0.u.l->v[i], "prefix"), end)) return jv_bool(1);
      return jv_bool(0);
    }
    jinja_need_str(rs, x0, end ? "endswith first arg" : "startswith first arg");
    return jv_bool(jinja_starts(s, x0, end));
  }
  if (IS("strip") || IS("lstrip") || IS("rstrip")) {
    int which = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
    if (x0.t == JV_NONE) return jinja_strip(s, NULL, which);
    jinja_need_str(rs, x0, "strip arg");
    return jinja_strip(s, &x0, which);
  }
  if (IS("split") || IS("rsplit")) {
    jv sep = jarg(a, 0, "sep", jv_none_v);
    jv ms = jarg(a, 1, "maxsplit", jv_int(-1));
    return jinja_split(rs, s, sep, jinja_need_int(rs, ms, "maxsplit"), m[0] == 'r');
  }
  if (IS("splitlines"))
    return jinja_splitlines(rs, s, jv_truthy(jarg(a, 0, "keepends", jv_bool(0))));
  if (IS("upper")) return jinja_case(rs, s, 1);
  if (IS("lower") || IS("casefold")) return jinja_case(rs, s, 0);
  if (IS("title")) return jinja_case(rs, s, 2);
  if (IS("capitalize")) return jinja_case(rs, s, 3);
  if (IS("swapcase")) return jinja_case(rs, s, 5);
  if (IS("replace")) {
    jv c = jarg(a, 2, "count", jv_int(-1));
    return jinja_replace(rs, s, jinja_need_str(rs, x0, "replace arg 1"),
                         jinja_need_str(rs, jarg(a, 1, NULL, jv_none_v), "replace arg 2"),
                         jinja_need_int(rs, c, "count"));
  }
  if (IS("find") || IS("rfind") || IS("index") || IS("rindex") || IS("count")) {
    jinja_need_str(rs, x0, "substring");
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (IS("count")) {
      if (x0.u.s.n == 0) return jv_int((int64_t)jinja_u8_len(p, n) + 1);
      int64_t k = 0;
      for (const char *f = p; (f = memmem(f, n - (size_t)(f - p), x0.u.s.p, x0.u.s.n));
           f += x0.u.s.n)
        k++;
      return jv_int(k);
    }
    const char *f = NULL;
    if (m[0] != 'r')
      f = memmem(p, n, x0.u.s.p, x0.u.s.n);
    else if (x0.u.s.n <= n)
      for (size_t i = n - x0.u.s.n + 1; i-- > 0;)
        if (!memcmp(p + i, x0.u.s.p, x0.u.s.n)) {
          f = p + i;
          break;
        }
    if (!f) {
      if (strstr(m, "index")) RS_FAIL(rs, "ValueError: substring not found");
      return jv_int(-1);
    }
    return jv_int((int64_t)jinja_u8_len(p, (size_t)(f - p)));
  }
  if (IS("removeprefix") || IS("removesuffix")) {
    int end = m[6] == 's';
    jinja_need_str(rs, x0, "affix");
    if (!jinja_starts(s, x0, end)) return s;
    return jv_strn(s.u.s.p + (end ? 0 : x0.u.s.n), s.u.s.n - x0.u.s.n);
  }
  if (IS("join")) return jinja_join(rs, s, jinja_iter(rs, x0));
  if (IS("format")) return jinja_format(rs, s, a);
  if (IS("isdigit") || IS("isalpha") || IS("isalnum") || IS("isspace") || IS("isnumeric") ||
      IS("isdecimal") || IS("isascii")) {
    if (!s.u.s.n) return jv_bool(IS("isascii"));
    for (size_t i = 0; i < s.u.s.n;) {
      int32_t cp;
      i = jinja_u8_next(s.u.s.p, s.u.s.n, i, &cp);
      int cat = utf8proc_category(cp);
      int dig = cat == UTF8PROC_CATEGORY_ND;
      int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
      int ok = IS("isspace")   ? jinja_py_space(cp)
               : IS("isalpha") ? alpha
               : IS("isalnum")
                   ? alpha || dig || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO
               : IS("isascii")   ? cp < 128
               : IS("isnumeric") ? dig || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO
                                 : dig;
      if (!ok) return jv_bool(0);
    }
    return jv_bool(1);
  }
  if (IS("islower") || IS("isupper")) {
    jv lo = jinja_case(rs, s, IS("islower") ? 0 : 1),
       other = jinja_case(rs, s, IS("islower") ? 1 : 0);
    int same = lo.u.s.n == s.u.s.n && !memcmp(lo.u.s.p, s.u.s.p, s.u.s.n);
    int cased = !(other.u.s.n == s.u.s.n && !memcmp(other.u.s.p, s.u.s.p, s.u.s.n)) || !same;
    return jv_bool(same && cased);
  }
  if (IS("zfill") || IS("ljust") || IS("rjust") || IS("center")) {
    int64_t w = jinja_need_int(rs, x0, "width");
    int64_t len = (int64_t)jinja_u8_len(s.u.s.p, s.u.s.n);
    if (w > 1 << 20) RS_FAIL(rs, "LimitError: width too large");
    if (w <= len) return s;
    jv fill = IS("zfill") ? jv_strn("0", 1) : jarg(a, 1, NULL, jv_strn(" ", 1));
    jinja_need_str(rs, fill, "fill character");
    int64_t pad = w - len, left = IS("ljust") ? 0 : IS("center") ? pad / 2 + (pad & w & 1) : pad;
    jinja_sb b = {0};
    b.max = SIZE_MAX;
    size_t st = 0;
    if (IS("zfill") && s.u.s.n && (s.u.s.p[0] == '-' || s.u.s.p[0] == '+')) {
      jinja_sb_put(&rs->c, &b, s.u.s.p, 1);
      st = 1;
    }
    for (int64_t i = 0; i < left; i++) jinja_sb_put(&rs->c, &b, fill.u.s.p, fill.u.s.n);
    jinja_sb_put(&rs->c, &b, s.u.s.p + st, s.u.s.n - st);
    for (int64_t i = left; i < pad; i++) jinja_sb_put(&rs->c, &b, fill.u.s.p, fill.u.s.n);
    return jv_strn(b.p, b.n);
  }
  if (IS("partition") || IS("rpartition")) {
    jinja_need_str(rs, x0, "separator");
    jv parts = jinja_split(rs, s, x0, 1, m[0] == 'r');
    jv t = jv_list_new(&rs->c, 3, 1);
    if (parts.u.l->n == 2) {
      t.u.l->v[0] = parts.u.l->v[0];
      t.u.l->v[1] = x0;
      t.u.l->v[2] = parts.u.l->v[1];
    } else if (m[0] == 'r') {
      t.u.l->v[0] = jv_strn("", 0);
      t.u.l->v[1] = jv_strn("", 0);
      t.u.l->v[2] = s;
    } else {
      t.u.l->v[0] = s;
      t.u.l->v[1] = jv_strn("", 0);
      t.u.l->v[2] = jv_strn("", 0);
    }
    t.u.l->n = 3;
    return t;
  }
  RS_FAIL(rs, "NotImplementedError: str.%s is not supported", m);
#undef IS
}

static jv jinja_method(jinja_rs *rs, jmeth *me, const jargs *a) {
  jv self = me->self;
  const char *m = me->name;
  if (self.t == JV_STR) return jinja_str_method(rs, self, m, a);
  if (self.t == JV_DICT) {
    if (!strcmp(m, "items")) return jinja_dict_items(rs, self);
    if (!strcmp(m, "copy")) return self;
    if (!strcmp(m, "keys") || !strcmp(m, "values")) {
      jv out = jv_list_new(&rs->c, self.u.d->n, 0);
      memcpy(out.u.l->v, m[0] == 'k' ? self.u.d->k : self.u.d->v, self.u.d->n * sizeof(jv));
      out.u.l->n = self.u.d->n;
      return out;
    }
    /* get */
    jv *v = jv_dict_find(self.u.d, jarg(a, 0, NULL, jv_none_v));
    return v ? *v : jarg(a, 1, NULL, jv_none_v);
  }
  if (self.t == JV_LIST) {
    if (!strcmp(m, "copy")) return self;
    jv x = jarg(a, 0, NULL, jv_undef_v);
    int64_t k = 0;
    for (size_t i = 0; i < self.u.l->n; i++)
      if (jv_eq(self.u.l->v[i], x)) {
        if (m[0] == 'i') return jv_int((int64_t)i);
        k++;
      }
    if (m[0] == 'i') RS_FAIL(rs, "ValueError: value is not in list");
    return jv_int(k);
  }
  if (self.t == JV_LOOP) { /* cycle */
    if (!a->npos) RS_FAIL(rs, "TypeError: no items for cycling given");
    return a->pos[self.u.lp->i % (size_t)a->npos];
  }
  RS_FAIL(rs, "TypeError: object is not callable");
}

static void jinja_exec(jinja_rs *rs, jscope *sc, jnode **body, int n, jinja_sb *out, int *flow);
static jv jinja_eval(jinja_rs *rs, jscope *sc, const jnode *n);

static jv jinja_macro_call(jinja_rs *rs, jmacro *mc, const jargs *a, jv caller) {
  const jnode *nd = mc->node;
  int is_caller = nd->kind == N_CALLBLOCK;
  int np = is_caller ? nd->nnames : nd->nkw;
  const char **pn = is_caller ? nd->names : nd->kwn;
  jscope *sc = jinja_scope_new(rs, mc->closure);
  int used_kw = 0;
  for (int i = 0; i < np; i++) {
    jv v;
    if (i < a->npos)
      v = a->pos[i];
    else if (jargs_get(a, -1, pn[i], &v))
      used_kw++;
    else if (!is_caller && nd->kwv[i]) {
      jinja_scope_set(rs, sc, pn[i], jv_undef_v); /* earlier parameters are visible */
      v = jinja_eval(rs, sc, nd->kwv[i]);
    } else
      v = jv_undef_msg(jinja_fmt(rs, "parameter '%s' was not provided", pn[i]));
    jinja_scope_set(rs, sc, pn[i], v);
  }
  /* extra arguments only when the body reads varargs / kwargs (parser: op bits 1, 2) */
  const char *mname = is_caller ? "caller" : nd->name;
  if (a->npos > np && !(nd->op & 1))
    RS_FAIL(rs, "TypeError: macro '%s' takes not more than %d argument(s)", mname, np);
  jv varargs = jv_list_new(&rs->c, 0, 1);
  for (int i = np; i < a->npos; i++) jv_list_push(&rs->c, varargs.u.l, a->pos[i]);
  jv kwargs = jv_dict_new(&rs->c, 0, 0);
  for (int k = 0; k < a->nkw; k++) {
    int known = 0;
    for (int i = 0; i < np; i++) known |= !strcmp(pn[i], a->kwn[k]);
    if (!known && !strcmp(a->kwn[k], "caller") && !is_caller) continue;
    if (!known && !(nd->op & 2))
      RS_FAIL(rs, "TypeError: macro '%s' takes no keyword argument '%s'", mname, a->kwn[k]);
    if (!known) jv_dict_set(&rs->c, kwargs.u.d, jv_strn(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
  }
  (void)used_kw;
  jinja_scope_set(rs, sc, "varargs", varargs);
  jinja_scope_set(rs, sc, "kwargs", kwargs);
  if (caller.t != JV_UNDEF) jinja_scope_set(rs, sc, "caller", caller);
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  int flow = 0;
  jinja_exec(rs, sc, nd->body, nd->nbody, &b, &flow);
  jv r = jv_strn(b.p ? b.p : "", b.n);
  r.flag = 1;
  return r;
}

static jv jinja_call(jinja_rs *rs, jv f, const jargs *a, jv caller) {
  if (++rs->steps > rs->lim.max_steps) RS_FAIL(rs, "LimitError: too many steps");
  switch (f.t) {
    case JV_UNDEF:
      jinja_undef_fail(rs, f);
    case JV_MACRO: {
      if (++rs->depth > rs->lim.max_depth)
        RS_FAIL(rs, "RecursionError: maximum recursion depth exceeded");
      jv r = jinja_macro_call(rs, f.u.m, a, caller);
      rs->depth--;
      return r;
    }
    case JV_METH:
      return jinja_method(rs, f.u.me, a);
    case JV_FUNC:
      break;
    default:
      RS_FAIL(rs, "TypeError: '%s' object is not callable", jv_type_name(f));
  }
  switch ((int)f.u.i) {
    case JF_RAISE: {
      jv m = jinja_to_str(&rs->c, jarg(a, 0, NULL, jv_strn("", 0)));
      if (m.u.s.n == 0) RS_FAIL(rs, "TemplateError: raise_exception with an empty message");
      rs->raised = 1;
      RS_FAIL(rs, "%.*s", (int)(m.u.s.n > 500 ? 500 : m.u.s.n), m.u.s.p);
    }
    case JF_STRFTIME: {
      jv fmt = jinja_need_str(rs, jarg(a, 0, NULL, jv_undef_v), "format");
      time_t now = time(NULL);
      struct tm tm;
      localtime_r(&now, &tm);
      char buf[256];
      const char *f0 = jinja_strndup(&rs->c, fmt.u.s.p, fmt.u.s.n);
      size_t k = strftime(buf, sizeof buf, f0, &tm);
      return jv_strn(jinja_strndup(&rs->c, buf, k), k);
    }
    case JF_RANGE: {
      int64_t st = 0, en, step = 1;
      if (a->npos == 1)
        en = jinja_need_int(rs, a->pos[0], "range argument");
      else if (a->npos == 2 || a->npos == 3) {
        st = jinja_need_int(rs, a->pos[0], "range argument");
        en = jinja_need_int(rs, a->pos[1], "range argument");
        if (a->npos == 3) step = jinja_need_int(rs, a->pos[2], "range argument");
      } else
        RS_FAIL(rs, "TypeError: range expected 1 to 3 arguments");
      if (step == 0) RS_FAIL(rs, "ValueError: range() arg 3 must not be zero");
      double cnt = step > 0 ? ceil(((double)en - (double)st) / (double)step)
                            : ceil(((double)st - (double)en) / (double)-step);
      if (cnt < 0) cnt = 0;
      if (cnt > 100000)
        RS_FAIL(rs,
                "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
                "(100000).");
      jv l = jv_list_new(&rs->c, (size_t)cnt, 0);
      for (int64_t i = 0; i < (int64_t)cnt; i++) l.u.l->v[l.u.l->n++] = jv_int(st + i * step);
      return l;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
      jv d = jv_dict_new(&rs->c, 0, f.u.i == JF_NAMESPACE);
      for (int i = 0; i < a->npos; i++) {
        if (a->pos[i].t != JV_DICT) RS_FAIL(rs, "TypeError: expected a mapping argument");
        for (size_t k = 0; k < a->pos[i].u.d->n; k++)
          jv_dict_set(&rs->c, d.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
      }
      for (int k = 0; k < a->nkw; k++)
        jv_dict_set(&rs->c, d.u.d, jv_strn(a->kwn[k], strlen(a->kwn[k])), a->kwv[k]);
      return d;
    }
  }
  RS_FAIL(rs, "TypeError: not callable");
}

/* ============================================================================================
 * Evaluation and execution
 * ========================================================================================== */

static void jinja_eval_args(jinja_rs *rs, jscope *sc, const jnode *n, jargs *a, int extra_front,
                            jv front) {
  a->npos = n->nargs + extra_front;
  a->pos = jinja_alloc(&rs->c, (size_t)(a->npos ? a->npos : 1) * sizeof(jv));
  if (extra_front) a->pos[0] = front;
  for (int i = 0; i < n->nargs; i++) a->pos[i + extra_front] = jinja_eval(rs, sc, n->args[i]);
  a->nkw = n->nkw;
  a->kwn = n->kwn;
  a->kwv = jinja_alloc(&rs->c, (size_t)(n->nkw ? n->nkw : 1) * sizeof(jv));
  for (int i = 0; i < n->nkw; i++) a->kwv[i] = jinja_eval(rs, sc, n->kwv[i]);
}

static jv jinja_eval_inner(jinja_rs *rs, jscope *sc, const jnode *n) {
  switch (n->kind) {
    case E_LIT:
      return n->lit;
    case E_INPUT:
      return rs->input;
    case E_NAME:
      return jinja_lookup(rs, sc, n->name);
    case E_ATTR:
      return jinja_getattr(rs, jinja_eval(rs, sc, n->a), n->name);
    case E_ITEM: {
      jv o = jinja_eval(rs, sc, n->a);
      return jinja_getitem(rs, o, jinja_eval(rs, sc, n->b));
    }
    case E_SLICE: {
      jv o = jinja_eval(rs, sc, n->a);
      jv a = n->b ? jinja_eval(rs, sc, n->b) : jv_none_v;
      jv b = n->c ? jinja_eval(rs, sc, n->c) : jv_none_v;
      jv c = n->args[0] ? jinja_eval(rs, sc, n->args[0]) : jv_none_v;
      return jinja_slice(rs, o, a, b, c);
    }
    case E_CALL: {
      jv f = jinja_eval(rs, sc, n->a);
      jargs a;
      jinja_eval_args(rs, sc, n, &a, 0, jv_undef_v);
      return jinja_call(rs, f, &a, jv_undef_v);
    }
    case E_FILTER: {
      jv v = jinja_eval(rs, sc, n->a);
      jargs a;
      jinja_eval_args(rs, sc, n, &a, 0, jv_undef_v);
      return jinja_filter(rs, n->name, v, &a);
    }
    case E_TEST: {
      jv v = jinja_eval(rs, sc, n->a);
      jargs a;
      jinja_eval_args(rs, sc, n, &a, 0, jv_undef_v);
      int r = jinja_test(rs, n->name, v, &a);
      return jv_bool(n->op ? !r : r);
    }
    case E_BIN: {
      jv a = jinja_eval(rs, sc, n->a);
      return jinja_arith(rs, n->op, a, jinja_eval(rs, sc, n->b));
    }
    case E_NEG:
    case E_POS: {
      jv v = jinja_eval(rs, sc, n->a);
      if (v.t == JV_UNDEF) jinja_undef_fail(rs, v);
      if (v.t == JV_FLOAT) return jv_float(n->kind == E_NEG ? -v.u.f : v.u.f);
      if (v.t == JV_INT || v.t == JV_BOOL) {
        if (n->kind == E_POS) return jv_int(v.u.i);
        if (v.u.i == INT64_MIN) RS_FAIL(rs, "OverflowError: integer result out of range");
        return jv_int(-v.u.i);
      }
      RS_FAIL(rs, "TypeError: bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+',
              jv_type_name(v));
    }
    case E_NOT:
      return jv_bool(!jv_truthy(jinja_eval(rs, sc, n->a)));
    case E_AND: {
      jv a = jinja_eval(rs, sc, n->a);
      return jv_truthy(a) ? jinja_eval(rs, sc, n->b) : a;
    }
    case E_OR: {
      jv a = jinja_eval(rs, sc, n->a);
      return jv_truthy(a) ? a : jinja_eval(rs, sc, n->b);
    }
    case E_COND:
      if (jv_truthy(jinja_eval(rs, sc, n->b))) return jinja_eval(rs, sc, n->a);
      return n->c ? jinja_eval(rs, sc, n->c)
                  : jv_undef_msg(
                        "the inline if-expression evaluated to false and no else section was "
                        "defined.");
    case E_LIST:
    case E_TUPLE: {
      jv l = jv_list_new(&rs->c, (size_t)n->nargs, n->kind == E_TUPLE);
      for (int i = 0; i < n->nargs; i++) l.u.l->v[l.u.l->n++] = jinja_eval(rs, sc, n->args[i]);
      return l;
    }
    case E_DICT: {
      jv d = jv_dict_new(&rs->c, (size_t)n->nargs, 0);
      for (int i = 0; i < n->nargs; i++) {
        jv k = jinja_eval(rs, sc, n->args[i]);
        if (k.t == JV_LIST && !k.flag) RS_FAIL(rs, "TypeError: unhashable type: 'list'");
        if (k.t == JV_DICT || k.t == JV_NS) RS_FAIL(rs, "TypeError: unhashable type: 'dict'");
        jv_dict_set(&rs->c, d.u.d, k, jinja_eval(rs, sc, n->kwv[i]));
      }
      return d;
    }
    case E_CMP: {
      jv left = jinja_eval(rs, sc, n->a);
      for (int i = 0; i < n->nargs; i++) {
        jv right = jinja_eval(rs, sc, n->args[i]);
        if (!jinja_compare(rs, n->ops[i], left, right)) return jv_bool(0);
        left = right;
      }
      return jv_bool(1);
    }
    default:
      RS_FAIL(rs, "RuntimeError: bad expression node");
  }
}

static jv jinja_eval(jinja_rs *rs, jscope *sc, const jnode *n) {
  if (++rs->depth > rs->lim.max_depth * 4)
    RS_FAIL(rs, "RecursionError: maximum recursion depth exceeded");
  int saved = rs->line;
  rs->line = n->line;
  jv v = jinja_eval_inner(rs, sc, n);
  rs->line = saved;
  rs->depth--;
  return v;
}

/* binds names (unpacking when the target is a tuple) */
static void jinja_assign(jinja_rs *rs, jscope *sc, const jnode *n, jv v) {
  if (!n->op) {
    jinja_scope_set(rs, sc, n->names[0], v);
    return;
  }
  jlist *l = jinja_iter(rs, v);
  if ((int)l->n != n->nnames)
    RS_FAIL(rs, "ValueError: %s values to unpack (expected %d, got %zu)",
            (int)l->n > n->nnames ? "too many" : "not enough", n->nnames, l->n);
  for (int i = 0; i < n->nnames; i++) jinja_scope_set(rs, sc, n->names[i], l->v[i]);
}

static void jinja_out_value(jinja_rs *rs, jinja_sb *out, jv v) {
  if (v.t == JV_UNDEF && v.flag) jinja_undef_fail(rs, v);
  jinja_str_into(&rs->c, out, v, 0);
}

static void jinja_exec_for(jinja_rs *rs, jscope *sc, const jnode *n, jinja_sb *out) {
  jv it = jinja_eval(rs, sc, n->a);
  jlist *items = jinja_iter(rs, it);
  if (n->b) { /* `for x in xs if cond`: loop variables count the kept items */
    jv kept = jv_list_new(&rs->c, 0, 0);
    for (size_t i = 0; i < items->n; i++) {
      if (++rs->steps > rs->lim.max_steps) RS_FAIL(rs, "LimitError: too many loop iterations");
      jscope *fs = jinja_scope_new(rs, sc);
      jinja_assign(rs, fs, n, items->v[i]);
      if (jv_truthy(jinja_eval(rs, fs, n->b))) jv_list_push(&rs->c, kept.u.l, items->v[i]);
    }
    items = kept.u.l;
  }
  if (!items->n) {
    int flow = 0;
    if (n->nels) jinja_exec(rs, jinja_scope_new(rs, sc), n->els, n->nels, out, &flow);
    return;
  }
  jloop *lp = jinja_alloc(&rs->c, sizeof *lp);
  lp->items = items;
  jv loopv = {JV_LOOP, 0, {0}};
  loopv.u.lp = lp;
  for (size_t i = 0; i < items->n; i++) {
    if (++rs->steps > rs->lim.max_steps) RS_FAIL(rs, "LimitError: too many loop iterations");
    lp->i = i;
    jscope *is = jinja_scope_new(rs, sc);
    jinja_scope_set(rs, is, "loop", loopv);
    jinja_assign(rs, is, n, items->v[i]);
    int flow = 0;
    jinja_exec(rs, is, n->body, n->nbody, out, &flow);
    if (flow == 1) break;
  }
}

static jv jinja_render_body(jinja_rs *rs, jscope *sc, jnode **body, int nbody) {
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  int flow = 0;
  jinja_exec(rs, sc, body, nbody, &b, &flow);
  return jv_strn(b.p ? b.p : "", b.n);
}

/* flow: set to 1 by break, 2 by continue; execution of the body stops there */
static void jinja_exec(jinja_rs *rs, jscope *sc, jnode **body, int nb, jinja_sb *out, int *flow) {
  if (++rs->depth > rs->lim.max_depth * 4)
    RS_FAIL(rs, "RecursionError: maximum recursion depth exceeded");
  for (int k = 0; k < nb && !*flow; k++) {
    const jnode *n = body[k];
    rs->line = n->line;
    switch (n->kind) {
      case N_TEXT:
        jinja_sb_put(&rs->c, out, n->lit.u.s.p, n->lit.u.s.n);
        break;
      case N_OUT:
        jinja_out_value(rs, out, jinja_eval(rs, sc, n->a));
        break;
      case N_IF:
        if (jv_truthy(jinja_eval(rs, sc, n->a)))
          jinja_exec(rs, sc, n->body, n->nbody, out, flow);
        else
          jinja_exec(rs, sc, n->els, n->nels, out, flow);
        break;
      case N_FOR:
        jinja_exec_for(rs, sc, n, out);
        break;
      case N_SET:
        if (n->name) {
          jv ns = jinja_lookup(rs, sc, n->name);
          if (ns.t != JV_NS)
            RS_FAIL(rs, "TemplateRuntimeError: cannot assign attribute on non-namespace object");
          jv v = jinja_eval(rs, sc, n->a);
          jv_dict_set(&rs->c, ns.u.d, jv_strn(n->names[0], strlen(n->names[0])), v);
        } else {
          jinja_assign(rs, sc, n, jinja_eval(rs, sc, n->a));
        }
        break;
      case N_SETBLOCK: {
        jv v = jinja_render_body(rs, jinja_scope_new(rs, sc), n->body, n->nbody);
        if (n->a) {
          jv saved = rs->input;
          rs->input = v;
          v = jinja_eval(rs, sc, n->a);
          rs->input = saved;
        }
        jinja_scope_set(rs, sc, n->names[0], v);
        break;
      }
      case N_MACRO: {
        jmacro *m = jinja_alloc(&rs->c, sizeof *m);
        m->node = n;
        m->closure = sc;
        jv v = {JV_MACRO, 0, {0}};
        v.u.m = m;
        jinja_scope_set(rs, sc, n->name, v);
        break;
      }
      case N_CALLBLOCK: {
        jmacro *m = jinja_alloc(&rs->c, sizeof *m);
        m->node = n;
        m->closure = sc;
        jv caller = {JV_MACRO, 0, {0}};
        caller.u.m = m;
        jv f = jinja_eval(rs, sc, n->a->a);
        jargs a;
        jinja_eval_args(rs, sc, n->a, &a, 0, jv_undef_v);
        jinja_out_value(rs, out, jinja_call(rs, f, &a, caller));
        break;
      }
      case N_BREAK:
        *flow = 1;
        break;
      case N_CONTINUE:
        *flow = 2;
        break;
      case N_FILTERBLOCK: {
        jv v = jinja_render_body(rs, sc, n->body, n->nbody);
        jv saved = rs->input;
        rs->input = v;
        v = jinja_eval(rs, sc, n->a);
        rs->input = saved;
        jinja_out_value(rs, out, v);
        break;
      }
      case N_BLOCK:
        jinja_exec(rs, sc, n->body, n->nbody, out, flow);
        break;
      case N_WITH: { /* values from the outer scope, names in a scope of the body's own */
        jscope *ws = jinja_scope_new(rs, sc);
        for (int i = 0; i < n->nnames; i++)
          jinja_scope_set(rs, ws, n->names[i], jinja_eval(rs, sc, n->args[i]));
        jinja_exec(rs, ws, n->body, n->nbody, out, flow);
        break;
      }
      default:
        RS_FAIL(rs, "RuntimeError: bad statement node");
    }
  }
  rs->depth--;
}

int jinja_template_render(const jinja_template *t, const json_t *ctx, const jinja_limits *lim,
                          char **out, size_t *out_len, char *err, size_t errlen) {
  *out = NULL;
  if (out_len) *out_len = 0;
  if (err && errlen) err[0] = 0;
  jinja_rs *volatile rs = calloc(1, sizeof *rs);
  if (!rs) {
    if (err && errlen) snprintf(err, errlen, "MemoryError: out of memory");
    return -1;
  }
  rs->lim = lim ? *lim : jinja_limits_default();
  rs->c.ar.limit = rs->lim.max_memory;
  if (setjmp(rs->c.jb)) {
    if (err && errlen) {
      if (rs->raised)
        snprintf(err, errlen, "%s", rs->c.msg);
      else
        snprintf(err, errlen, "%s (line %d)", rs->c.msg, rs->line);
    }
    jinja_arena_free(&rs->c.ar);
    free(rs);
    return -1;
  }
  rs->root = jinja_scope_new(rs, NULL);
  if (ctx && json_is_object(ctx)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)ctx, k, v)
        jinja_scope_set(rs, rs->root, k, jinja_from_json(&rs->c, v, 0));
  } else if (ctx && !json_is_null(ctx)) {
    RS_FAIL(rs, "TypeError: the context must be a JSON object");
  }
  jinja_sb b = {0};
  b.max = rs->lim.max_output;
  int flow = 0;
  jinja_exec(rs, rs->root, t->body, t->nbody, &b, &flow);
  char *res = malloc(b.n + 1);
  if (!res) RS_FAIL(rs, "MemoryError: out of memory");
  if (b.n) memcpy(res, b.p, b.n);
  res[b.n] = 0;
  *out = res;
  if (out_len) *out_len = b.n;
  jinja_arena_free(&rs->c.ar);
  free(rs);
  return 0;
}

int jinja_render(const char *src, const json_t *ctx, char **out, char *err, size_t errlen) {
  *out = NULL;
  jinja_template *t = jinja_parse(src, err, errlen);
  if (!t) return -1;
  int rc = jinja_template_render(t, ctx, NULL, out, NULL, err, errlen);
  jinja_template_free(t);
  return rc;
}
