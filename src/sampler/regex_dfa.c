/* regex_dfa — the pattern subset of regex_dfa.h compiled to a DFA over bytes.
 *
 * Parsing gives a small tree (rx_node: byte sets, concatenation, alternation, repetition); the
 * tree is turned into a Thompson NFA whose edges are byte sets (each distinct set stored once),
 * repetitions {m,n} expanded into copies; the DFA is built by the subset construction over byte
 * classes (the bytes no set tells apart), so a transition table has a column per class, not per
 * byte. Products (regex_dfa_restrict: with a code point counter; regex_dfa_intersect: with a
 * second DFA) walk the reachable pairs breadth first and then keep the states from which an
 * accepting one is reachable (a backward search), so the mask never enters a dead end. */
#include "sampler/regex_dfa.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_REPEAT 1000   /* m, n of {m,n} */
#define RX_MAX_NFA (1 << 16) /* NFA nodes */
#define RX_MAX_WORK 40000000 /* NFA nodes visited building a DFA (a request's compile time) */
#define RX_MAX_LEN 4096      /* pattern bytes */
#define RX_MAX_NEST 64       /* nested groups */

/* ---- errors --------------------------------------------------------------------------- */

static int rx_fail(char *err, size_t errlen, const char *fmt, ...) {
  if (errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* ---- byte sets ------------------------------------------------------------------------ */

typedef struct bset {
  uint64_t w[4];
} bset;

static inline void bs_add(bset *s, unsigned lo, unsigned hi) {
  for (unsigned c = lo; c <= hi; c++) s->w[c >> 6] |= (uint64_t)1 << (c & 63);
}
static inline int bs_has(const bset *s, unsigned c) { return (s->w[c >> 6] >> (c & 63)) & 1; }

/* ---- the tree ------------------------------------------------------------------------- */

/* RX_SET: one byte of set, or (u) one non-ASCII code point: u 1 any BMP one, 2 a BMP one but
 * U+2028 U+2029, 3 any one */
enum { RX_SET, RX_CAT, RX_ALT, RX_REP, RX_EMPTY };

typedef struct rx_node {
  int kind;
  int a, b;     /* RX_CAT, RX_ALT: children; RX_REP: a */
  int min, max; /* RX_REP; max -1: none */
  int u;        /* RX_SET */
  bset set;     /* RX_SET */
} rx_node;

typedef struct rx_parser {
  const unsigned char *p;
  size_t n, i;
  rx_node *nd;
  int nn, cap;
  int nest;
  char *err;
  size_t errlen;
  int failed;
} rx_parser;

static int px_fail(rx_parser *x, const char *fmt, ...) {
  if (x->failed) return -1;
  x->failed = 1;
  if (x->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, x->errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int px_node(rx_parser *x, int kind) {
  if (x->nn >= x->cap) {
    int nc = x->cap ? 2 * x->cap : 64;
    rx_node *q = realloc(x->nd, (size_t)nc * sizeof *q);
    if (!q) return px_fail(x, "out of memory");
    x->nd = q;
    x->cap = nc;
  }
  memset(&x->nd[x->nn], 0, sizeof x->nd[x->nn]);
  x->nd[x->nn].kind = kind;
  return x->nn++;
}

static int px_set(rx_parser *x, const bset *s, int u) {
  int k = px_node(x, RX_SET);
  if (k < 0) return -1;
  x->nd[k].set = *s;
  x->nd[k].u = u;
  return k;
}

static int px_byte(rx_parser *x, unsigned c) {
  bset s = {{0}};
  bs_add(&s, c, c);
  return px_set(x, &s, 0);
}

static int px_bin(rx_parser *x, int kind, int a, int b) {
  if (a < 0 || b < 0) return -1;
  int k = px_node(x, kind);
  if (k < 0) return -1;
  x->nd[k].a = a;
  x->nd[k].b = b;
  return k;
}

/* code point cp as a concatenation of its UTF-8 bytes */
static int px_cp(rx_parser *x, unsigned cp) {
  unsigned char b[4];
  int n;
  if (cp < 0x80) {
    b[0] = (unsigned char)cp;
    n = 1;
  } else if (cp < 0x800) {
    b[0] = (unsigned char)(0xC0 | cp >> 6);
    b[1] = (unsigned char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    b[0] = (unsigned char)(0xE0 | cp >> 12);
    b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    b[2] = (unsigned char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    b[0] = (unsigned char)(0xF0 | cp >> 18);
    b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (unsigned char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  int r = px_byte(x, b[0]);
  for (int i = 1; i < n; i++) r = px_bin(x, RX_CAT, r, px_byte(x, b[i]));
  return r;
}

static inline int px_peek(const rx_parser *x) { return x->i < x->n ? x->p[x->i] : -1; }

static int px_hex(rx_parser *x, int digits, unsigned *out) {
  unsigned v = 0;
  for (int k = 0; k < digits; k++) {
    int c = px_peek(x);
    if (c < 0) return -1;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    v = v * 16 + (unsigned)d;
    x->i++;
  }
  *out = v;
  return 0;
}

/* the class escapes \d \w \s (negated: the ASCII bytes outside them) */
static int class_escape(int c, bset *s) {
  bset t = {{0}};
  switch (c | 0x20) {
    case 'd':
      bs_add(&t, '0', '9');
      break;
    case 'w':
      bs_add(&t, '0', '9');
      bs_add(&t, 'A', 'Z');
      bs_add(&t, 'a', 'z');
      bs_add(&t, '_', '_');
      break;
    case 's':
      bs_add(&t, ' ', ' ');
      bs_add(&t, '\t', '\r'); /* \t \n \v \f \r */
      break;
    default:
      return 0;
  }
  if (c >= 'A' && c <= 'Z') {
    t.w[0] = ~t.w[0];
    t.w[1] = ~t.w[1];
    t.w[2] = t.w[3] = 0;
  }
  for (int k = 0; k < 4; k++) s->w[k] |= t.w[k];
  return 1;
}

/* After '\' (outside or inside a class): a single character's code point in *cp (returns 1),
 * or a refusal (-1). Class escapes are the callers'. */
static int px_escape_char(rx_parser *x, int c, unsigned *cp, int in_class) {
  switch (c) {
    case 'n':
      *cp = '\n';
      return 1;
    case 'r':
      *cp = '\r';
      return 1;
    case 't':
      *cp = '\t';
      return 1;
    case 'f':
      *cp = '\f';
      return 1;
    case 'v':
      *cp = '\v';
      return 1;
    case '0':
      if (px_peek(x) >= '0' && px_peek(x) <= '9')
        return px_fail(x, "octal escapes are not supported");
      *cp = 0;
      return 1;
    case 'x':
      if (px_hex(x, 2, cp)) return px_fail(x, "'\\x' must be followed by two hex digits");
      return 1;
    case 'u':
      if (px_peek(x) == '{') return px_fail(x, "'\\u{...}' escapes are not supported");
      if (px_hex(x, 4, cp)) return px_fail(x, "'\\u' must be followed by four hex digits");
      if (*cp >= 0xD800 && *cp <= 0xDFFF)
        return px_fail(x, "surrogate escapes '\\u%04X' are not supported", *cp);
      return 1;
    case 'b':
      if (in_class) {
        *cp = '\b';
        return 1;
      }
      return px_fail(x, "word boundaries '\\b' are not supported");
    case 'B':
      return px_fail(x, "word boundaries '\\B' are not supported");
    case 'p':
    case 'P':
      return px_fail(x, "Unicode property classes '\\%c' are not supported", c);
    case 'k':
      return px_fail(x, "backreferences '\\k' are not supported");
    case 'c':
      return px_fail(x, "control escapes '\\c' are not supported");
    default:
      break;
  }
  if (c >= '1' && c <= '9') return px_fail(x, "backreferences '\\%c' are not supported", c);
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
    return px_fail(x, "the escape '\\%c' is not supported", c);
  if (c >= 0x80) return px_fail(x, "an escaped non-ASCII character is not supported");
  *cp = (unsigned)c;
  return 1;
}

/* a class [...]; x->i after '[' */
static int px_class(rx_parser *x) {
  bset s = {{0}};
  int neg = 0, has_esc_class = 0;
  if (px_peek(x) == '^') {
    neg = 1;
    x->i++;
  }
  if (px_peek(x) == ']') return px_fail(x, "an empty class '[]' or '[^]' is not supported");
  for (;;) {
    int c = px_peek(x);
    if (c < 0) return px_fail(x, "'[' without its ']'");
    x->i++;
    if (c == ']') break;
    unsigned lo;
    if (c == '\\') {
      int e = px_peek(x);
      if (e < 0) return px_fail(x, "the pattern ends with '\\'");
      x->i++;
      if (class_escape(e, &s)) {
        has_esc_class = 1;
        if (px_peek(x) == '-' && x->i + 1 < x->n && x->p[x->i + 1] != ']')
          return px_fail(x, "a range from a class escape '\\%c-' is not supported", e);
        continue;
      }
      if (px_escape_char(x, e, &lo, 1) < 0) return -1;
    } else if (c == '[' && (px_peek(x) == ':' || px_peek(x) == '=' || px_peek(x) == '.')) {
      return px_fail(x, "POSIX classes '[:' are not supported");
    } else {
      lo = (unsigned)c;
    }
    if (lo >= 0x80) return px_fail(x, "non-ASCII characters inside '[ ]' are not supported");
    unsigned hi = lo;
    if (px_peek(x) == '-' && x->i + 1 < x->n && x->p[x->i + 1] != ']') {
      x->i++;
      int d = px_peek(x);
      x->i++;
      if (d == '\\') {
        int e = px_peek(x);
        if (e < 0) return px_fail(x, "the pattern ends with '\\'");
        x->i++;
        bset dummy = {{0}};
        if (class_escape(e, &dummy))
          return px_fail(x, "a range to a class escape '-\\%c' is not supported", e);
        if (px_escape_char(x, e, &hi, 1) < 0) return -1;
      } else {
        hi = (unsigned)d;
      }
      if (hi >= 0x80) return px_fail(x, "non-ASCII characters inside '[ ]' are not supported");
      if (hi < lo) return px_fail(x, "the class range '%c-%c' is out of order", lo, hi);
    }
    bs_add(&s, lo, hi);
  }
  int u = 0;
  if (neg) {
    s.w[0] = ~s.w[0];
    s.w[1] = ~s.w[1];
    s.w[2] = s.w[3] = 0;
    u = has_esc_class ? 0 : 1;
  }
  return px_set(x, &s, u);
}

/* "{m}", "{m,}", "{m,n}" at x->i: 1 with *mn, *mx set (x->i after it), 0 when it is not one
 * (x->i unchanged: '{' is then a literal, as ECMA's web grammar and Python read it) */
static int px_braces(rx_parser *x, int *mn, int *mx) {
  size_t i = x->i + 1;
  long a = -1, b = -1;
  int comma = 0;
  for (; i < x->n && x->p[i] >= '0' && x->p[i] <= '9'; i++)
    a = (a < 0 ? 0 : a) * 10 + (x->p[i] - '0'), a = a > 100000 ? 100000 : a;
  if (a < 0) return 0;
  if (i < x->n && x->p[i] == ',') {
    comma = 1;
    for (i++; i < x->n && x->p[i] >= '0' && x->p[i] <= '9'; i++)
      b = (b < 0 ? 0 : b) * 10 + (x->p[i] - '0'), b = b > 100000 ? 100000 : b;
  }
  if (i >= x->n || x->p[i] != '}') return 0;
  x->i = i + 1;
  *mn = (int)a;
  *mx = comma ? (int)b : (int)a;
  return 1;
}

static int px_alt(rx_parser *x);

static int px_atom(rx_parser *x) {
  int c = px_peek(x);
  x->i++;
  switch (c) {
    case '(': {
      if (px_peek(x) == '?') {
        const unsigned char *p = x->p + x->i;
        size_t left = x->n - x->i;
        if (left >= 2 && p[1] == ':') {
          x->i += 2;
        } else if (left >= 2 && (p[1] == '=' || p[1] == '!')) {
          return px_fail(x, "lookahead '(?%c' is not supported", p[1]);
        } else if (left >= 3 && p[1] == '<' && (p[2] == '=' || p[2] == '!')) {
          return px_fail(x, "lookbehind '(?<%c' is not supported", p[2]);
        } else if (left >= 2 && p[1] == '<') {
          size_t k = 2;
          while (k < left && p[k] != '>') k++;
          if (k >= left) return px_fail(x, "a group name without its '>'");
          x->i += k + 1;
        } else {
          return px_fail(x, "the group '(?%c' is not supported", left >= 2 ? p[1] : '?');
        }
      }
      if (++x->nest > RX_MAX_NEST)
        return px_fail(x, "groups are nested more than %d deep", RX_MAX_NEST);
      int r = px_alt(x);
      x->nest--;
      if (r < 0) return -1;
      if (px_peek(x) != ')') return px_fail(x, "'(' without its ')'");
      x->i++;
      return r;
    }
    case '[':
      return px_class(x);
    case '.': {
      bset s = {{0}};
      bs_add(&s, 0, 0x7F);
      s.w[0] &= ~(((uint64_t)1 << '\n') | ((uint64_t)1 << '\r'));
      return px_set(x, &s, 2);
    }
    case '\\': {
      int e = px_peek(x);
      if (e < 0) return px_fail(x, "the pattern ends with '\\'");
      x->i++;
      bset s = {{0}};
      if (class_escape(e, &s)) return px_set(x, &s, 0);
      unsigned cp;
      if (px_escape_char(x, e, &cp, 0) < 0) return -1;
      return px_cp(x, cp);
    }
    case '*':
    case '+':
    case '?':
      return px_fail(x, "'%c' has nothing to repeat", c);
    case '^':
    case '$':
      return px_fail(x, "'%c' is only supported as the pattern's %s byte", c,
                     c == '^' ? "first" : "last");
    case '{': {
      int mn, mx;
      x->i--;
      if (px_braces(x, &mn, &mx)) return px_fail(x, "'{' has nothing to repeat");
      x->i++;
      return px_byte(x, '{');
    }
    default:
      break;
  }
  if (c < 0x80) return px_byte(x, (unsigned)c);
  /* a UTF-8 character (the pattern came from a JSON string: well formed) */
  int r = px_byte(x, (unsigned)c);
  while (x->i < x->n && (x->p[x->i] & 0xC0) == 0x80)
    r = px_bin(x, RX_CAT, r, px_byte(x, x->p[x->i++]));
  return r;
}

static int px_cat(rx_parser *x) {
  int r = -2; /* none yet */
  for (;;) {
    int c = px_peek(x);
    if (c < 0 || c == '|' || c == ')') break;
    int a = px_atom(x);
    if (a < 0) return -1;
    for (int nq = 0;; nq++) {
      int q = px_peek(x), mn, mx;
      if (q == '*' || q == '+' || q == '?') {
        x->i++;
        mn = q == '+';
        mx = q == '?' ? 1 : -1;
      } else if (q == '{' && px_braces(x, &mn, &mx)) {
        if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT)
          return px_fail(x, "repetition counts above %d are not supported", RX_MAX_REPEAT);
        if (mx >= 0 && mx < mn) return px_fail(x, "the repetition {%d,%d} is out of order", mn, mx);
      } else {
        break;
      }
      if (nq) return px_fail(x, "a quantifier after a quantifier is not supported");
      int nx = px_peek(x);
      if (nx == '?') return px_fail(x, "lazy quantifiers ('%c?') are not supported", q);
      if (nx == '+') return px_fail(x, "possessive quantifiers ('%c+') are not supported", q);
      int k = px_node(x, RX_REP);
      if (k < 0) return -1;
      x->nd[k].a = a;
      x->nd[k].min = mn;
      x->nd[k].max = mx;
      a = k;
    }
    r = r == -2 ? a : px_bin(x, RX_CAT, r, a);
    if (r < 0) return -1;
  }
  return r == -2 ? px_node(x, RX_EMPTY) : r;
}

static int px_alt(rx_parser *x) {
  int r = px_cat(x);
  while (r >= 0 && px_peek(x) == '|') {
    x->i++;
    r = px_bin(x, RX_ALT, r, px_cat(x));
  }
  return r;
}

/* ---- the NFA -------------------------------------------------------------------------- */

/* a node: on a byte of sets[set] go to o1 (set >= 0), or epsilon edges to o1 and o2 (-1: none) */
typedef struct nfa {
  int n, cap;
  int32_t *set, *o1, *o2;
  bset *sets;
  int nsets, capsets;
  int failed;
} nfa;

typedef struct frag {
  int s, e; /* start; end (an epsilon node without edges yet) */
} frag;

static int nfa_node(nfa *a, int set) {
  if (a->failed) return -1;
  if (a->n >= RX_MAX_NFA) {
    a->failed = 2;
    return -1;
  }
  if (a->n >= a->cap) {
    int nc = a->cap ? 2 * a->cap : 256;
    int32_t *s = realloc(a->set, (size_t)nc * sizeof *s);
    if (s) a->set = s;
    int32_t *p = realloc(a->o1, (size_t)nc * sizeof *p);
    if (p) a->o1 = p;
    int32_t *q = realloc(a->o2, (size_t)nc * sizeof *q);
    if (q) a->o2 = q;
    if (!s || !p || !q) {
      a->failed = 1;
      return -1;
    }
    a->cap = nc;
  }
  a->set[a->n] = set;
  a->o1[a->n] = a->o2[a->n] = -1;
  return a->n++;
}

static int nfa_setid(nfa *a, const bset *s) {
  for (int i = 0; i < a->nsets; i++)
    if (!memcmp(&a->sets[i], s, sizeof *s)) return i;
  if (a->nsets >= a->capsets) {
    int nc = a->capsets ? 2 * a->capsets : 32;
    bset *q = realloc(a->sets, (size_t)nc * sizeof *q);
    if (!q) {
      a->failed = 1;
      return -1;
    }
    a->sets = q;
    a->capsets = nc;
  }
  a->sets[a->nsets] = *s;
  return a->nsets++;
}

static frag fr_bad(void) { return (frag){-1, -1}; }

/* one byte of the set */
static frag fr_set(nfa *a, const bset *s) {
  int id = nfa_setid(a, s);
  int st = id < 0 ? -1 : nfa_node(a, id), e = nfa_node(a, -1);
  if (st < 0 || e < 0) return fr_bad();
  a->o1[st] = e;
  return (frag){st, e};
}

static frag fr_range(nfa *a, unsigned lo, unsigned hi) {
  bset s = {{0}};
  bs_add(&s, lo, hi);
  return fr_set(a, &s);
}

static frag fr_cat(nfa *a, frag x, frag y) {
  if (x.s < 0 || y.s < 0) return fr_bad();
  a->o1[x.e] = y.s;
  return (frag){x.s, y.e};
}

static frag fr_alt(nfa *a, frag x, frag y) {
  if (x.s < 0 || y.s < 0) return fr_bad();
  int s = nfa_node(a, -1), e = nfa_node(a, -1);
  if (s < 0 || e < 0) return fr_bad();
  a->o1[s] = x.s;
  a->o2[s] = y.s;
  a->o1[x.e] = e;
  a->o1[y.e] = e;
  return (frag){s, e};
}

static frag fr_empty(nfa *a) {
  int e = nfa_node(a, -1);
  return (frag){e, e};
}

/* a byte sequence of ranges lo[k]..hi[k] */
static frag fr_seq(nfa *a, const uint8_t (*r)[2], int n) {
  frag f = fr_range(a, r[0][0], r[0][1]);
  for (int k = 1; k < n; k++) f = fr_cat(a, f, fr_range(a, r[k][0], r[k][1]));
  return f;
}

/* one non-ASCII code point (u as rx_node's) */
static frag fr_nonascii(nfa *a, int u) {
  static const uint8_t s2[][2] = {{0xC2, 0xDF}, {0x80, 0xBF}};
  static const uint8_t s3a[][2] = {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s3b[][2] = {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s3b1[][2] = {{0xE1, 0xE1}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s3b3[][2] = {{0xE3, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t e2a[][2] = {{0xE2, 0xE2}, {0x81, 0xBF}, {0x80, 0xBF}};
  static const uint8_t e2b[][2] = {{0xE2, 0xE2}, {0x80, 0x80}, {0x80, 0xA7}};
  static const uint8_t e2c[][2] = {{0xE2, 0xE2}, {0x80, 0x80}, {0xAA, 0xBF}};
  static const uint8_t s3c[][2] = {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}};
  static const uint8_t s3d[][2] = {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s4a[][2] = {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s4b[][2] = {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}};
  static const uint8_t s4c[][2] = {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}};
  frag f = fr_alt(a, fr_seq(a, s2, 2), fr_seq(a, s3a, 3));
  if (u == 2) {
    f = fr_alt(a, f, fr_seq(a, s3b1, 3));
    f = fr_alt(a, f, fr_seq(a, s3b3, 3));
    f = fr_alt(a, f, fr_seq(a, e2a, 3));
    f = fr_alt(a, f, fr_seq(a, e2b, 3));
    f = fr_alt(a, f, fr_seq(a, e2c, 3));
  } else {
    f = fr_alt(a, f, fr_seq(a, s3b, 3));
  }
  f = fr_alt(a, f, fr_seq(a, s3c, 3));
  f = fr_alt(a, f, fr_seq(a, s3d, 3));
  if (u == 3) {
    f = fr_alt(a, f, fr_seq(a, s4a, 4));
    f = fr_alt(a, f, fr_seq(a, s4b, 4));
    f = fr_alt(a, f, fr_seq(a, s4c, 4));
  }
  return f;
}

static frag fr_star(nfa *a, frag x) {
  if (x.s < 0) return fr_bad();
  int s = nfa_node(a, -1), e = nfa_node(a, -1);
  if (s < 0 || e < 0) return fr_bad();
  a->o1[s] = x.s;
  a->o2[s] = e;
  a->o1[x.e] = s;
  return (frag){s, e};
}

static frag fr_opt(nfa *a, frag x) {
  if (x.s < 0) return fr_bad();
  int s = nfa_node(a, -1);
  if (s < 0) return fr_bad();
  a->o1[s] = x.s;
  a->o2[s] = x.e;
  return (frag){s, x.e};
}

static frag fr_tree(nfa *a, const rx_node *nd, int k, int depth) {
  if (a->failed || depth > 4 * RX_MAX_LEN) return fr_bad();
  const rx_node *t = &nd[k];
  switch (t->kind) {
    case RX_SET: {
      int any = 0;
      for (int w = 0; w < 4; w++) any |= t->set.w[w] != 0;
      if (!t->u) return fr_set(a, &t->set);
      frag na = fr_nonascii(a, t->u);
      return any ? fr_alt(a, fr_set(a, &t->set), na) : na;
    }
    case RX_CAT: {
      frag x = fr_tree(a, nd, t->a, depth + 1);
      return fr_cat(a, x, fr_tree(a, nd, t->b, depth + 1));
    }
    case RX_ALT: {
      frag x = fr_tree(a, nd, t->a, depth + 1);
      return fr_alt(a, x, fr_tree(a, nd, t->b, depth + 1));
    }
    case RX_REP: {
      frag f = fr_empty(a);
      for (int i = 0; i < t->min && f.s >= 0; i++)
        f = fr_cat(a, f, fr_tree(a, nd, t->a, depth + 1));
      if (t->max < 0) return fr_cat(a, f, fr_star(a, fr_tree(a, nd, t->a, depth + 1)));
      /* the optional copies nested: (x(x(x)?)?)? */
      frag tail = fr_empty(a);
      for (int i = t->min; i < t->max && tail.s >= 0; i++)
        tail = fr_opt(a, fr_cat(a, fr_tree(a, nd, t->a, depth + 1), tail));
      return fr_cat(a, f, tail);
    }
    default:
      return fr_empty(a);
  }
}

/* ---- DFAs ----------------------------------------------------------------------------- */

void regex_dfa_free(regex_dfa *d) {
  if (!d) return;
  free(d->next);
  free(d->acc);
  free(d->dist);
  d->next = NULL;
  d->acc = NULL;
  d->dist = NULL;
  d->n = 0;
}

int regex_dfa_match(const regex_dfa *d, const unsigned char *b, size_t n) {
  if (!d->n) return 0;
  int32_t q = 0;
  for (size_t i = 0; i < n && q >= 0; i++) q = d->next[(size_t)q * (size_t)d->nc + d->cls[b[i]]];
  return q >= 0 && d->acc[q];
}

/* a growing DFA: states keyed by an int32 vector (hash table over the keys' pool) */
typedef struct dbuild {
  int n, cap, nc;
  int32_t *next;
  uint8_t *acc;
  int32_t *koff, *klen; /* [n] each state's key in pool */
  int32_t *pool;
  size_t npool, cappool;
  int32_t *ht; /* open addressing: state ids, -1 empty */
  size_t htcap;
  int max;
  int over; /* 1: too many states; 2: out of memory */
} dbuild;

static uint64_t key_hash(const int32_t *k, int n) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 1099511628211ULL;
  return h ^ (h >> 29);
}

static int db_rehash(dbuild *b) {
  size_t nc = b->htcap ? 2 * b->htcap : 1024;
  int32_t *t = malloc(nc * sizeof *t);
  if (!t) return -1;
  for (size_t i = 0; i < nc; i++) t[i] = -1;
  for (int s = 0; s < b->n; s++) {
    size_t j = key_hash(b->pool + b->koff[s], b->klen[s]) & (nc - 1);
    while (t[j] >= 0) j = (j + 1) & (nc - 1);
    t[j] = s;
  }
  free(b->ht);
  b->ht = t;
  b->htcap = nc;
  return 0;
}

/* the state of key k[n], added when new (*isnew); -1 when full or out of memory */
static int db_get(dbuild *b, const int32_t *k, int n, int *isnew) {
  *isnew = 0;
  if (b->over) return -1;
  if (2 * ((size_t)b->n + 1) > b->htcap && db_rehash(b)) {
    b->over = 2;
    return -1;
  }
  size_t j = key_hash(k, n) & (b->htcap - 1);
  for (; b->ht[j] >= 0; j = (j + 1) & (b->htcap - 1)) {
    int s = b->ht[j];
    if (b->klen[s] == n && !memcmp(b->pool + b->koff[s], k, (size_t)n * sizeof *k)) return s;
  }
  if (b->n >= b->max) {
    b->over = 1;
    return -1;
  }
  if (b->n >= b->cap) {
    int nc = b->cap ? 2 * b->cap : 64;
    int32_t *nx = realloc(b->next, (size_t)nc * (size_t)b->nc * sizeof *nx);
    if (nx) b->next = nx;
    uint8_t *ac = realloc(b->acc, (size_t)nc);
    if (ac) b->acc = ac;
    int32_t *ko = realloc(b->koff, (size_t)nc * sizeof *ko);
    if (ko) b->koff = ko;
    int32_t *kl = realloc(b->klen, (size_t)nc * sizeof *kl);
    if (kl) b->klen = kl;
    if (!nx || !ac || !ko || !kl) {
      b->over = 2;
      return -1;
    }
    b->cap = nc;
  }
  if (b->npool + (size_t)n > b->cappool) {
    size_t nc = b->cappool ? 2 * b->cappool : 1024;
    while (nc < b->npool + (size_t)n) nc *= 2;
    int32_t *p = realloc(b->pool, nc * sizeof *p);
    if (!p) {
      b->over = 2;
      return -1;
    }
    b->pool = p;
    b->cappool = nc;
  }
  int s = b->n++;
  b->koff[s] = (int32_t)b->npool;
  b->klen[s] = n;
  memcpy(b->pool + b->npool, k, (size_t)n * sizeof *k);
  b->npool += (size_t)n;
  for (int c = 0; c < b->nc; c++) b->next[(size_t)s * (size_t)b->nc + (size_t)c] = -1;
  b->acc[s] = 0;
  b->ht[j] = s;
  *isnew = 1;
  return s;
}

/* out takes b's tables (the keys stay b's) */
static void db_take(dbuild *b, regex_dfa *out) {
  out->n = b->n;
  out->nc = b->nc;
  out->next = b->next;
  out->acc = b->acc;
  b->next = NULL;
  b->acc = NULL;
}

static void db_free(dbuild *b) {
  free(b->next);
  free(b->acc);
  free(b->koff);
  free(b->klen);
  free(b->pool);
  free(b->ht);
}

static int db_error(const dbuild *b, int max_states, char *err, size_t errlen) {
  if (b->over == 1)
    return rx_fail(err, errlen, "the pattern needs more than %d automaton states", max_states);
  return rx_fail(err, errlen, "out of memory");
}

/* byte classes: the bytes sig[] tells apart; returns the number of classes */
static int classes_of(const uint32_t *sig, int nsig, uint8_t cls[256]) {
  /* sig[c * nsig + k]: the byte's k-th signature word */
  int nc = 0;
  int rep[256];
  for (int c = 0; c < 256; c++) {
    int k = 0;
    for (; k < nc; k++)
      if (!memcmp(sig + (size_t)c * (size_t)nsig, sig + (size_t)rep[k] * (size_t)nsig,
                  (size_t)nsig * sizeof *sig))
        break;
    if (k == nc) rep[nc++] = c;
    cls[c] = (uint8_t)k;
  }
  return nc;
}

static int i32_cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* the epsilon closure of the NFA nodes in *st (count *n, room for a->n), sorted, keeping only
 * set nodes and the accepting node acc */
static int closure(const nfa *a, int32_t *st, int n, int32_t *stack, uint32_t *mark, uint32_t gen,
                   int accn) {
  int sp = 0, m = 0;
  for (int i = 0; i < n; i++) stack[sp++] = st[i];
  while (sp) {
    int v = stack[--sp];
    if (mark[v] == gen) continue;
    mark[v] = gen;
    if (a->set[v] >= 0 || v == accn) st[m++] = v;
    if (a->set[v] < 0) {
      if (a->o2[v] >= 0) stack[sp++] = a->o2[v];
      if (a->o1[v] >= 0) stack[sp++] = a->o1[v];
    }
  }
  qsort(st, (size_t)m, sizeof *st, i32_cmp);
  return m;
}

static int nfa_to_dfa(const nfa *a, int start, int accn, int max_states, regex_dfa *out, char *err,
                      size_t errlen) {
  memset(out, 0, sizeof *out);
  int ns = a->nsets;
  int nw = (ns + 31) / 32;
  uint32_t *sig = calloc((size_t)256 * (size_t)(nw ? nw : 1), sizeof *sig);
  int32_t *st = malloc((size_t)a->n * sizeof *st),
          *stack = malloc((size_t)(2 * a->n + 8) * sizeof *stack);
  uint32_t *mark = calloc((size_t)a->n, sizeof *mark);
  dbuild b;
  memset(&b, 0, sizeof b);
  int rc = 0;
  if (!sig || !st || !stack || !mark) {
    rc = rx_fail(err, errlen, "out of memory");
    goto done;
  }
  for (int c = 0; c < 256; c++)
    for (int k = 0; k < ns; k++)
      if (bs_has(&a->sets[k], (unsigned)c))
        sig[(size_t)c * (size_t)nw + (size_t)(k / 32)] |= 1u << (k % 32);
  b.nc = classes_of(sig, nw ? nw : 1, out->cls);
  int rep[256];
  for (int c = 255; c >= 0; c--) rep[out->cls[c]] = c;
  b.max = max_states;
  uint32_t gen = 1;
  st[0] = start;
  int n0 = closure(a, st, 1, stack, mark, gen++, accn), isnew;
  if (db_get(&b, st, n0, &isnew) < 0) goto over;
  size_t work = 0;
  for (int s = 0; s < b.n; s++) {
    int32_t ko = b.koff[s], kl = b.klen[s];
    work += (size_t)kl * (size_t)(b.nc + 1);
    if (work > RX_MAX_WORK) {
      rc = rx_fail(err, errlen,
                   "the pattern is too complex (its automaton takes too long to build)");
      goto done;
    }
    for (int i = 0; i < kl; i++)
      if (b.pool[ko + i] == accn) b.acc[s] = 1;
    for (int c = 0; c < b.nc; c++) {
      int m = 0;
      for (int i = 0; i < kl; i++) {
        int v = b.pool[b.koff[s] + i];
        if (a->set[v] >= 0 && bs_has(&a->sets[a->set[v]], (unsigned)rep[c])) st[m++] = a->o1[v];
      }
      if (!m) continue;
      m = closure(a, st, m, stack, mark, gen++, accn);
      work += (size_t)m;
      int t = db_get(&b, st, m, &isnew);
      if (t < 0) goto over;
      b.next[(size_t)s * (size_t)b.nc + (size_t)c] = t;
    }
  }
  db_take(&b, out);
  goto done;
over:
  rc = db_error(&b, max_states, err, errlen);
done:
  db_free(&b);
  free(sig);
  free(st);
  free(stack);
  free(mark);
  return rc;
}

/* ---- products and trimming ------------------------------------------------------------ */

/* d's edges backwards: src[cnt[t] .. cnt[t + 1]) are the states with an edge to t, ec[...] its
 * class. Returns 0 (the three arrays the caller's to free), -1 on out of memory. */
static int dfa_reverse(const regex_dfa *d, int32_t **cnt_out, int32_t **src_out, uint8_t **ec_out) {
  int n = d->n, nc = d->nc;
  int32_t *cnt = calloc((size_t)n + 1, sizeof *cnt), *src = NULL, *fill = NULL;
  uint8_t *ec = NULL;
  if (!cnt) return -1;
  size_t ne = 0;
  for (int s = 0; s < n; s++)
    for (int c = 0; c < nc; c++) {
      int32_t t = d->next[(size_t)s * (size_t)nc + (size_t)c];
      if (t >= 0) cnt[t + 1]++, ne++;
    }
  for (int s = 0; s < n; s++) cnt[s + 1] += cnt[s];
  src = malloc((ne ? ne : 1) * sizeof *src);
  ec = malloc(ne ? ne : 1);
  fill = malloc((size_t)(n ? n : 1) * sizeof *fill);
  if (!src || !ec || !fill) {
    free(cnt);
    free(src);
    free(ec);
    free(fill);
    return -1;
  }
  memcpy(fill, cnt, (size_t)n * sizeof *fill);
  for (int s = 0; s < n; s++)
    for (int c = 0; c < nc; c++) {
      int32_t t = d->next[(size_t)s * (size_t)nc + (size_t)c];
      if (t >= 0) src[fill[t]] = s, ec[fill[t]++] = (uint8_t)c;
    }
  free(fill);
  *cnt_out = cnt;
  *src_out = src;
  *ec_out = ec;
  return 0;
}

/* Keeps the states of d from which an accepting one is reachable, renumbered in order (the
 * start stays 0 when it is kept; none kept: n 0). */
static int dfa_trim(regex_dfa *d) {
  int n = d->n, nc = d->nc;
  if (!n) return 0;
  int32_t *cnt = NULL, *src = NULL;
  uint8_t *ec = NULL;
  int32_t *qu = malloc((size_t)n * sizeof *qu), *map = malloc((size_t)n * sizeof *map);
  uint8_t *live = calloc((size_t)n, 1);
  int rc = -1;
  if (!qu || !map || !live || dfa_reverse(d, &cnt, &src, &ec)) goto done;
  int h = 0, tl = 0;
  for (int s = 0; s < n; s++)
    if (d->acc[s]) live[s] = 1, qu[tl++] = s;
  while (h < tl) {
    int t = qu[h++];
    for (int32_t e = cnt[t]; e < cnt[t + 1]; e++)
      if (!live[src[e]]) live[src[e]] = 1, qu[tl++] = src[e];
  }
  int m = 0;
  for (int s = 0; s < n; s++) map[s] = live[s] && live[0] ? m++ : -1;
  for (int s = 0; s < n; s++) {
    if (map[s] < 0) continue;
    for (int c = 0; c < nc; c++) {
      int32_t t = d->next[(size_t)s * (size_t)nc + (size_t)c];
      d->next[(size_t)map[s] * (size_t)nc + (size_t)c] = t >= 0 ? map[t] : -1;
    }
    d->acc[map[s]] = d->acc[s];
  }
  d->n = m;
  rc = 0;
done:
  free(cnt);
  free(src);
  free(ec);
  free(qu);
  free(map);
  free(live);
  return rc;
}

/* The product of a with b (NULL: none) and a code point counter k (0..kmax, kept under
 * cmax + 1 when max is finite, saturated at min otherwise), over the bytes with ok[c]. */
static int dfa_product(const regex_dfa *a, const regex_dfa *b, int uni, const uint8_t *ok,
                       uint32_t min, uint32_t max, int max_states, regex_dfa *out, char *err,
                       size_t errlen) {
  memset(out, 0, sizeof *out);
  if (uni ? !a->n && !b->n : !a->n || (b && !b->n)) return 0;
  uint32_t sig[256 * 3];
  for (int c = 0; c < 256; c++) {
    sig[c * 3] = a->cls[c];
    sig[c * 3 + 1] = b ? b->cls[c] : 0;
    sig[c * 3 + 2] = (uint32_t)((ok ? !ok[c] : 0) | (((c & 0xC0) == 0x80) << 1));
  }
  dbuild db;
  memset(&db, 0, sizeof db);
  db.nc = classes_of(sig, 3, out->cls);
  db.max = max_states;
  int rep[256];
  for (int c = 255; c >= 0; c--) rep[out->cls[c]] = c;
  uint32_t kcap = max != UINT32_MAX ? max : min;
  /* uni: a state of one side may be -1 (that side is out), not both */
  int32_t key[3] = {a->n ? 0 : -1, b && !b->n ? -1 : 0, 0}, isnew;
  if (db_get(&db, key, 3, &isnew) < 0) goto over;
  for (int s = 0; s < db.n; s++) {
    int32_t qa = db.pool[db.koff[s]], qb = db.pool[db.koff[s] + 1];
    uint32_t k = (uint32_t)db.pool[db.koff[s] + 2];
    int aa = qa >= 0 && a->acc[qa], ba = !b || (qb >= 0 && b->acc[qb]);
    db.acc[s] = (uint8_t)((uni ? aa || ba : aa && ba) && k >= min);
    for (int c = 0; c < db.nc; c++) {
      int r = rep[c];
      if (ok && !ok[r]) continue;
      int32_t ta = qa >= 0 ? a->next[(size_t)qa * (size_t)a->nc + a->cls[r]] : -1;
      int32_t tb = !b ? 0 : qb >= 0 ? b->next[(size_t)qb * (size_t)b->nc + b->cls[r]] : -1;
      if (uni ? ta < 0 && tb < 0 : ta < 0 || tb < 0) continue;
      uint32_t nk = k + ((r & 0xC0) != 0x80);
      if (nk > kcap) {
        if (max != UINT32_MAX) continue;
        nk = kcap;
      }
      key[0] = ta;
      key[1] = tb;
      key[2] = (int32_t)nk;
      int t = db_get(&db, key, 3, &isnew);
      if (t < 0) goto over;
      db.next[(size_t)s * (size_t)db.nc + (size_t)c] = t;
    }
  }
  db_take(&db, out);
  db_free(&db);
  if (dfa_trim(out)) {
    regex_dfa_free(out);
    return rx_fail(err, errlen, "out of memory");
  }
  return 0;
over : {
  int rc = db_error(&db, max_states, err, errlen);
  db_free(&db);
  return rc;
}
}

/* d->dist by a backward search from the accepting states: a byte 0x80..0xBF costs nothing, any
 * other one code point (a 0-1 search: free edges to the front of a deque, costly ones to the
 * back) */
static int dfa_dist(regex_dfa *d) {
  int n = d->n;
  int32_t *cnt = NULL, *src = NULL, *dq = NULL;
  uint8_t *ec = NULL;
  d->dist = malloc((size_t)(n ? n : 1) * sizeof *d->dist);
  if (!d->dist || dfa_reverse(d, &cnt, &src, &ec)) goto done;
  uint8_t cost[256];
  for (int c = 0; c < 256; c++) cost[d->cls[c]] = (uint8_t)((c & 0xC0) != 0x80);
  /* a state enters the deque once per improvement: edges + states times at most */
  size_t ne = (size_t)cnt[n], cap = 2 * (ne + (size_t)n) + 2;
  dq = malloc(cap * sizeof *dq);
  if (!dq) goto done;
  size_t h = cap / 2, tl = cap / 2;
  for (int s = 0; s < n; s++) {
    d->dist[s] = d->acc[s] ? 0 : UINT32_MAX;
    if (d->acc[s]) dq[tl++] = s;
  }
  while (h < tl) {
    int t = dq[h++];
    for (int32_t e = cnt[t]; e < cnt[t + 1]; e++) {
      uint32_t w = cost[ec[e]], nd = d->dist[t] + w;
      int s = src[e];
      if (nd >= d->dist[s]) continue;
      d->dist[s] = nd;
      if (w == 0)
        dq[--h] = s;
      else
        dq[tl++] = s;
    }
  }
  free(cnt);
  free(src);
  free(ec);
  free(dq);
  return 0;
done:
  free(cnt);
  free(src);
  free(ec);
  free(dq);
  return -1;
}

int regex_dfa_restrict(const regex_dfa *in, const uint8_t ok[256], uint32_t min, uint32_t max,
                       int max_states, regex_dfa *out, char *err, size_t errlen) {
  if (max_states < 1) max_states = 1;
  if (dfa_product(in, NULL, 0, ok, min, max, max_states, out, err, errlen)) return -1;
  if (dfa_dist(out)) {
    regex_dfa_free(out);
    return rx_fail(err, errlen, "out of memory");
  }
  return 0;
}

int regex_dfa_intersect(const regex_dfa *a, const regex_dfa *b, int max_states, regex_dfa *out,
                        char *err, size_t errlen) {
  if (max_states < 1) max_states = 1;
  return dfa_product(a, b, 0, NULL, 0, UINT32_MAX, max_states, out, err, errlen);
}

int regex_dfa_union(const regex_dfa *a, const regex_dfa *b, int max_states, regex_dfa *out,
                    char *err, size_t errlen) {
  if (max_states < 1) max_states = 1;
  return dfa_product(a, b, 1, NULL, 0, UINT32_MAX, max_states, out, err, errlen);
}

/* ---- compile -------------------------------------------------------------------------- */

int regex_dfa_compile(const char *pat, size_t len, int max_states, regex_dfa *out, char *err,
                      size_t errlen) {
  memset(out, 0, sizeof *out);
  if (errlen) err[0] = 0;
  if (len > RX_MAX_LEN)
    return rx_fail(err, errlen, "patterns longer than %d bytes are not supported", RX_MAX_LEN);
  const unsigned char *p = (const unsigned char *)pat;
  int a0 = len > 0 && p[0] == '^', a1 = 0;
  if (len > (size_t)a0 && p[len - 1] == '$') {
    size_t bs = 0;
    while (bs < len - 1 && p[len - 2 - bs] == '\\') bs++;
    a1 = bs % 2 == 0;
  }
  rx_parser x;
  memset(&x, 0, sizeof x);
  x.p = p + a0;
  x.n = len - (size_t)a0 - (size_t)a1;
  x.err = err;
  x.errlen = errlen;
  int root = px_alt(&x);
  if (root >= 0 && x.i < x.n) root = px_fail(&x, "unmatched ')'");
  if (root >= 0 && (a0 || a1)) {
    /* a '|' at the top level beside an anchor: ^a|b means (^a)|b, not ^(a|b) */
    int depth = 0, esc = 0, cls = 0;
    for (size_t i = 0; i < x.n; i++) {
      unsigned c = x.p[i];
      if (esc) {
        esc = 0;
      } else if (c == '\\') {
        esc = 1;
      } else if (cls) {
        cls = c != ']';
      } else if (c == '[') {
        cls = 1;
      } else if (c == '(') {
        depth++;
      } else if (c == ')') {
        depth--;
      } else if (c == '|' && depth == 0) {
        root = px_fail(&x, "'^' or '$' beside a top-level '|' is not supported (write ^(a|b)$)");
        break;
      }
    }
  }
  if (root < 0) {
    free(x.nd);
    return -1;
  }
  nfa a;
  memset(&a, 0, sizeof a);
  frag f = fr_tree(&a, x.nd, root, 0);
  bset ascii = {{0}};
  bs_add(&ascii, 0, 0x7F);
  if (!a0) {
    frag any = fr_star(&a, fr_alt(&a, fr_set(&a, &ascii), fr_nonascii(&a, 3)));
    f = fr_cat(&a, any, f);
  }
  if (!a1) {
    frag any = fr_star(&a, fr_alt(&a, fr_set(&a, &ascii), fr_nonascii(&a, 3)));
    f = fr_cat(&a, f, any);
  }
  free(x.nd);
  int rc;
  if (a.failed || f.s < 0)
    rc = a.failed == 2
             ? rx_fail(err, errlen, "the pattern needs more than %d automaton nodes", RX_MAX_NFA)
             : rx_fail(err, errlen, "out of memory");
  else
    rc = nfa_to_dfa(&a, f.s, f.e, max_states, out, err, errlen);
  free(a.set);
  free(a.o1);
  free(a.o2);
  free(a.sets);
  if (!rc && dfa_trim(out)) {
    regex_dfa_free(out);
    rc = rx_fail(err, errlen, "out of memory");
  }
  return rc;
}
