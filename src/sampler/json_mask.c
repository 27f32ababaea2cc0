/* json_mask — the JSON-object recognizer and the per-token mask built on it (json_mask.h has the
 * language and the contracts).
 *
 * The recognizer is a byte-at-a-time state machine (js_step) over a 16-byte json_state: a lexical
 * mode, one byte of detail, the whitespace run, and the stack of open containers as a 64-bit set
 * (depth <= 64), so trying a token from a state is a copy of 16 bytes and a walk over its bytes.
 *
 * json_mask_apply avoids that walk for almost every token:
 *  - outside strings, a token is first judged by the byte after its leading whitespace (its
 *    "key", precomputed): apply computes once per call which key bytes the current state accepts
 *    directly and which it accepts after whitespace, and only tokens whose key passes are walked;
 *  - in the plain in-string state (no escape or UTF-8 sequence pending) each token's run through
 *    a string is precomputed: it stays in the string (allowed), breaks it (forbidden), or closes
 *    it at byte k, and then only its bytes after k are walked, from the state after the quote;
 *  - inside an escape or a UTF-8 sequence, tokens are judged first by their first byte;
 *  - after the object is complete, or once the recognizer is dead, only eos ids are kept.
 * Nothing is shared mutable: a vocabulary is read-only after json_vocab_new. */
#include "sampler/json_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the recognizer --------------------------------------------------------------------- */

enum {
  JS_START,     /* before the top-level object: whitespace or '{' */
  JS_OBJ_FIRST, /* after '{': whitespace, '"' (a key) or '}' */
  JS_OBJ_KEY,   /* after ',' in an object: whitespace or '"' */
  JS_COLON,     /* after a key: whitespace or ':' */
  JS_ARR_FIRST, /* after '[': whitespace, a value or ']' */
  JS_VALUE,     /* after ':', or ',' in an array: whitespace or a value */
  JS_AFTER,     /* after a value in a container: whitespace, ',' or the innermost closer */
  JS_DONE,      /* the top-level object is closed: nothing may follow */
  JS_STR,       /* in a string, no escape or UTF-8 sequence pending */
  JS_STR_ESC,   /* after '\' */
  JS_STR_HEX,   /* in \uXXXX, aux hex digits left */
  JS_STR_UTF8,  /* aux continuation bytes 80..BF left */
  JS_STR_E0,    /* after E0: A0..BF, then one more */
  JS_STR_ED,    /* after ED: 80..9F, then one more */
  JS_STR_F0,    /* after F0: 90..BF, then two more */
  JS_STR_F4,    /* after F4: 80..8F, then two more */
  JS_NUM_MINUS, /* after '-': a digit */
  JS_NUM_ZERO,  /* a leading 0 (complete) */
  JS_NUM_INT,   /* [1-9][0-9]* (complete) */
  JS_NUM_DOT,   /* after '.': a digit */
  JS_NUM_FRAC,  /* fraction digits (complete) */
  JS_NUM_E,     /* after e/E: a sign or a digit */
  JS_NUM_ESIGN, /* after the exponent's sign: a digit */
  JS_NUM_EXP,   /* exponent digits (complete) */
  JS_LIT,       /* in true / false / null: aux indexes js_lits, the next byte expected */
  JS_DEAD,      /* rejected: every byte is rejected */
};

/* The tails of the three literals after their first byte, each ended by a NUL: 't' starts at 0,
 * 'f' at 4, 'n' at 9. */
static const char js_lits[] = "rue\0alse\0ull";

static inline int js_is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static inline int js_is_hex(unsigned c) {
  return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* One byte inside a string (mode one of JS_STR..JS_STR_F4). Returns 0 when the string goes on
 * (*mode, *aux updated), 1 for the closing quote (*mode, *aux unchanged), -1 when c breaks it. */
static inline int js_str_step(uint8_t *mode, uint8_t *aux, unsigned c) {
  switch (*mode) {
  case JS_STR:
    if (c == '"') return 1;
    if (c == '\\') {
      *mode = JS_STR_ESC;
      return 0;
    }
    if (c < 0x20) return -1;
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) {
      *mode = JS_STR_UTF8;
      *aux = 1;
    } else if (c == 0xE0) {
      *mode = JS_STR_E0;
    } else if (c == 0xED) {
      *mode = JS_STR_ED;
    } else if (c >= 0xE1 && c <= 0xEF) {
      *mode = JS_STR_UTF8;
      *aux = 2;
    } else if (c == 0xF0) {
      *mode = JS_STR_F0;
    } else if (c >= 0xF1 && c <= 0xF3) {
      *mode = JS_STR_UTF8;
      *aux = 3;
    } else if (c == 0xF4) {
      *mode = JS_STR_F4;
    } else {
      return -1; /* a stray continuation byte, C0, C1, F5..FF */
    }
    return 0;
  case JS_STR_ESC:
    switch (c) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
      *mode = JS_STR;
      return 0;
    case 'u':
      *mode = JS_STR_HEX;
      *aux = 4;
      return 0;
    default: return -1;
    }
  case JS_STR_HEX:
    if (!js_is_hex(c)) return -1;
    if (--*aux == 0) *mode = JS_STR;
    return 0;
  case JS_STR_UTF8:
    if (c < 0x80 || c > 0xBF) return -1;
    if (--*aux == 0) *mode = JS_STR;
    return 0;
  case JS_STR_E0:
    if (c < 0xA0 || c > 0xBF) return -1;
    *mode = JS_STR_UTF8;
    *aux = 1;
    return 0;
  case JS_STR_ED:
    if (c < 0x80 || c > 0x9F) return -1;
    *mode = JS_STR_UTF8;
    *aux = 1;
    return 0;
  case JS_STR_F0:
    if (c < 0x90 || c > 0xBF) return -1;
    *mode = JS_STR_UTF8;
    *aux = 2;
    return 0;
  case JS_STR_F4:
    if (c < 0x80 || c > 0x8F) return -1;
    *mode = JS_STR_UTF8;
    *aux = 2;
    return 0;
  default: return -1;
  }
}

static inline int js_is_str_mode(unsigned mode) { return mode >= JS_STR && mode <= JS_STR_F4; }

/* Opens a container (obj: an object, else an array). */
static inline int js_push(json_state *s, int obj) {
  if (s->depth >= JSON_MASK_MAX_DEPTH) return -1;
  if (obj) s->stack |= (uint64_t)1 << s->depth;
  s->depth++;
  s->mode = obj ? JS_OBJ_FIRST : JS_ARR_FIRST;
  return 0;
}

/* Closes the innermost container (the caller checked its kind). */
static inline int js_pop(json_state *s) {
  s->depth--;
  s->stack &= ~((uint64_t)1 << s->depth);
  s->mode = s->depth ? JS_AFTER : JS_DONE;
  return 0;
}

static inline int js_top_is_obj(const json_state *s) {
  return s->depth > 0 && ((s->stack >> (s->depth - 1)) & 1);
}

/* The first byte of a value (c not whitespace). */
static inline int js_value_start(json_state *s, unsigned c) {
  switch (c) {
  case '{': return js_push(s, 1);
  case '[': return js_push(s, 0);
  case '"':
    s->mode = JS_STR;
    s->key = 0;
    return 0;
  case '-': s->mode = JS_NUM_MINUS; return 0;
  case '0': s->mode = JS_NUM_ZERO; return 0;
  case 't': s->mode = JS_LIT; s->aux = 0; return 0;
  case 'f': s->mode = JS_LIT; s->aux = 4; return 0;
  case 'n': s->mode = JS_LIT; s->aux = 9; return 0;
  default:
    if (c >= '1' && c <= '9') {
      s->mode = JS_NUM_INT;
      return 0;
    }
    return -1;
  }
}

/* One byte. Returns 0 when the text is still a prefix of one JSON object, -1 otherwise (s is
 * then partly updated). */
static inline int js_step(json_state *s, unsigned c) {
  if (js_is_str_mode(s->mode)) {
    int r = js_str_step(&s->mode, &s->aux, c);
    if (r <= 0) return r;
    s->mode = s->key ? JS_COLON : JS_AFTER; /* the closing quote */
    s->key = 0;
    return 0;
  }
  if (js_is_ws(c)) {
    switch (s->mode) {
    case JS_START: case JS_OBJ_FIRST: case JS_OBJ_KEY: case JS_COLON: case JS_ARR_FIRST:
    case JS_VALUE: case JS_AFTER:
      if (s->ws >= JSON_MASK_MAX_WS) return -1;
      s->ws++;
      return 0;
    case JS_NUM_ZERO: case JS_NUM_INT: case JS_NUM_FRAC: case JS_NUM_EXP:
      s->mode = JS_AFTER; /* whitespace ends a complete number */
      s->ws = 1;
      return 0;
    default: return -1;
    }
  }
  s->ws = 0;
  switch (s->mode) {
  case JS_START: return c == '{' ? js_push(s, 1) : -1;
  case JS_OBJ_FIRST:
    if (c == '}') return js_pop(s);
    /* fall through */
  case JS_OBJ_KEY:
    if (c != '"') return -1;
    s->mode = JS_STR;
    s->key = 1;
    return 0;
  case JS_COLON:
    if (c != ':') return -1;
    s->mode = JS_VALUE;
    return 0;
  case JS_ARR_FIRST:
    if (c == ']') return js_pop(s);
    return js_value_start(s, c);
  case JS_VALUE: return js_value_start(s, c);
  case JS_AFTER:
  after:
    if (c == ',') {
      s->mode = js_top_is_obj(s) ? JS_OBJ_KEY : JS_VALUE;
      return 0;
    }
    if (c == (js_top_is_obj(s) ? '}' : ']')) return js_pop(s);
    return -1;
  case JS_NUM_MINUS:
    if (c == '0') s->mode = JS_NUM_ZERO;
    else if (c >= '1' && c <= '9') s->mode = JS_NUM_INT;
    else return -1;
    return 0;
  case JS_NUM_ZERO:
    if (c >= '0' && c <= '9') return -1; /* no leading zeros */
    /* fall through */
  case JS_NUM_INT:
    if (c >= '0' && c <= '9') return 0;
    if (c == '.') {
      s->mode = JS_NUM_DOT;
      return 0;
    }
    /* fall through */
  case JS_NUM_FRAC:
    if (c >= '0' && c <= '9') return 0; /* only JS_NUM_FRAC gets here with a digit */
    if (c == 'e' || c == 'E') {
      s->mode = JS_NUM_E;
      return 0;
    }
    s->mode = JS_AFTER; /* the number ended: c is read after it */
    goto after;
  case JS_NUM_DOT:
    if (c < '0' || c > '9') return -1;
    s->mode = JS_NUM_FRAC;
    return 0;
  case JS_NUM_E:
    if (c == '+' || c == '-') {
      s->mode = JS_NUM_ESIGN;
      return 0;
    }
    /* fall through */
  case JS_NUM_ESIGN:
    if (c < '0' || c > '9') return -1;
    s->mode = JS_NUM_EXP;
    return 0;
  case JS_NUM_EXP:
    if (c >= '0' && c <= '9') return 0;
    s->mode = JS_AFTER;
    goto after;
  case JS_LIT:
    if (c != (unsigned char)js_lits[s->aux]) return -1;
    if (js_lits[++s->aux] == 0) s->mode = JS_AFTER;
    return 0;
  default: return -1; /* JS_DONE, JS_DEAD */
  }
}

static inline int js_feed(json_state *s, const unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (js_step(s, b[i])) return -1;
  return 0;
}

void json_state_init(json_state *s) {
  memset(s, 0, sizeof *s);
  s->mode = JS_START;
}

int json_state_feed(json_state *s, const char *b, size_t n) {
  if (n && js_feed(s, (const unsigned char *)b, n)) {
    s->mode = JS_DEAD;
    return -1;
  }
  return s->mode == JS_DEAD ? -1 : 0;
}

int json_state_complete(const json_state *s) { return s->mode == JS_DONE; }

/* ---- the vocabulary --------------------------------------------------------------------- */

enum { TOK_NEVER = 1, TOK_EOS = 2 };    /* jv_tok.flags: never content (special, empty, eos) */
enum { STR_STAY, STR_BREAK, STR_QUOTE, STR_WALK }; /* jv_tok.str: its run through a string */

/* What apply reads for every token: 8 bytes (the bytes themselves are read only for the tokens
 * the filters let through). */
typedef struct jv_tok {
  uint16_t key;    /* the first byte after the leading whitespace; 256: whitespace only */
  uint16_t quote;  /* STR_QUOTE: the offset of the quote that closes the string */
  uint8_t flags;   /* TOK_* */
  uint8_t lead_ws; /* leading whitespace bytes, saturating at 255 */
  uint8_t str;     /* STR_*: from the plain in-string state, the token stays in the string,
                    * breaks it, or closes it at quote (then the rest needs a walk); STR_WALK:
                    * it closes it past offset 65535, walk it all */
  uint8_t first;   /* its first byte */
} jv_tok;

struct json_vocab {
  int n;
  jv_tok *tok;           /* [n] */
  size_t *off;           /* [n] into bytes */
  size_t *len;           /* [n] */
  unsigned char *bytes;  /* every token's bytes, back to back */
  int32_t *eos;          /* [n_eos], in range, distinct */
  int n_eos;
};

void json_vocab_free(json_vocab *v) {
  if (!v) return;
  free(v->tok);
  free(v->off);
  free(v->len);
  free(v->bytes);
  free(v->eos);
  free(v);
}

int json_vocab_size(const json_vocab *v) { return v->n; }

/* Fills t's precomputed fields from its bytes b[n] (n > 0). */
static void jv_classify(jv_tok *t, const unsigned char *b, size_t n) {
  size_t w = 0;
  while (w < n && js_is_ws(b[w])) w++;
  t->lead_ws = (uint8_t)(w > 255 ? 255 : w);
  t->key = (uint16_t)(w < n ? b[w] : 256);
  t->first = b[0];
  uint8_t mode = JS_STR, aux = 0;
  t->str = STR_STAY;
  for (size_t i = 0; i < n; i++) {
    int r = js_str_step(&mode, &aux, b[i]);
    if (r == 0) continue;
    if (r < 0) {
      t->str = STR_BREAK;
    } else if (i > UINT16_MAX) { /* never in practice */
      t->str = STR_WALK;
    } else {
      t->str = STR_QUOTE;
      t->quote = (uint16_t)i;
    }
    break;
  }
}

json_vocab *json_vocab_new(int n_vocab, const char *const *bytes, const size_t *lens,
                           const unsigned char *special, const int32_t *eos, int n_eos) {
  if (n_vocab < 0) return NULL;
  json_vocab *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->n = n_vocab;
  size_t nv = (size_t)n_vocab, total = 0;
  for (size_t i = 0; i < nv; i++)
    if (bytes && bytes[i] && lens) total += lens[i];
  v->tok = calloc(nv ? nv : 1, sizeof *v->tok);
  v->off = calloc(nv ? nv : 1, sizeof *v->off);
  v->len = calloc(nv ? nv : 1, sizeof *v->len);
  v->bytes = malloc(total ? total : 1);
  v->eos = malloc((n_eos > 0 ? (size_t)n_eos : 1) * sizeof *v->eos);
  if (!v->tok || !v->off || !v->len || !v->bytes || !v->eos) {
    json_vocab_free(v);
    return NULL;
  }
  size_t at = 0;
  for (size_t i = 0; i < nv; i++) {
    size_t n = bytes && bytes[i] && lens ? lens[i] : 0;
    jv_tok *t = &v->tok[i];
    v->off[i] = at;
    v->len[i] = n;
    if (n) memcpy(v->bytes + at, bytes[i], n);
    if (n == 0 || (special && special[i])) {
      t->flags = TOK_NEVER;
      t->key = 256;
      t->str = STR_BREAK;
    } else {
      jv_classify(t, v->bytes + at, n);
    }
    at += n;
  }
  for (int k = 0; k < n_eos; k++) {
    int32_t e = eos[k];
    if (e < 0 || e >= n_vocab || (v->tok[e].flags & TOK_EOS)) continue;
    v->tok[e].flags = TOK_NEVER | TOK_EOS;
    v->eos[v->n_eos++] = e;
  }
  return v;
}

/* ---- the mask --------------------------------------------------------------------------- */

struct json_mask {
  const json_vocab *v;
  json_state s;
  int dead; /* a forbidden token was advanced over */
};

json_mask *json_mask_new(const json_vocab *v) {
  json_mask *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->v = v;
  json_state_init(&m->s);
  return m;
}

void json_mask_free(json_mask *m) { free(m); }

int json_mask_complete(const json_mask *m) { return !m->dead && m->s.mode == JS_DONE; }
int json_mask_dead(const json_mask *m) { return m->dead; }

/* 1 when token i's bytes from offset skip on, read from state *from, keep the text a prefix. */
static inline int jm_walk(const json_vocab *v, const json_state *from, int i, size_t skip) {
  json_state t = *from;
  return js_feed(&t, v->bytes + v->off[i] + skip, v->len[i] - skip) == 0;
}

/* The object is complete, or the recognizer dead: every non-eos token is forbidden. */
static void jm_only_eos(const json_vocab *v, float *logits, int n) {
  for (int i = 0; i < n; i++)
    if (!(v->tok[i].flags & TOK_EOS)) logits[i] = -INFINITY;
}

/* The plain in-string state: the precomputed runs decide, quotes are walked from after them. */
static int jm_in_string(const json_vocab *v, const json_state *s, float *logits, int n) {
  json_state sq = *s;
  js_step(&sq, '"'); /* the state after the closing quote (a quote always closes here) */
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    int ok;
    if (t->flags) {
      if (t->flags & TOK_EOS) continue;
      ok = 0;
    } else if (t->str == STR_STAY) {
      ok = 1;
    } else if (t->str == STR_BREAK) {
      ok = 0;
    } else if (t->str == STR_QUOTE) {
      ok = jm_walk(v, &sq, i, (size_t)t->quote + 1);
    } else {
      ok = jm_walk(v, s, i, 0);
    }
    if (ok) n_ok++;
    else logits[i] = -INFINITY;
  }
  return n_ok;
}

/* In an escape, \u or a UTF-8 sequence: the first byte filters, the rest is walked. */
static int jm_in_string_seq(const json_vocab *v, const json_state *s, float *logits, int n) {
  uint8_t ok0[256];
  for (unsigned c = 0; c < 256; c++) {
    json_state t = *s;
    ok0[c] = js_step(&t, c) == 0;
  }
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    if (t->flags & TOK_EOS) continue;
    if (!t->flags && ok0[t->first] && jm_walk(v, s, i, 0)) n_ok++;
    else logits[i] = -INFINITY;
  }
  return n_ok;
}

/* Outside strings: the byte after the leading whitespace filters, the rest is walked. ok[0][c]:
 * the state takes c directly; ok[1][c]: it takes c after whitespace (whitespace keeps the mode
 * it leads to, so one space stands for any run; the run's length is left to the walk);
 * ok[1][256]: it takes whitespace at all (for whitespace-only tokens). */
static int jm_outside(const json_vocab *v, const json_state *s, float *logits, int n) {
  uint8_t ok[2][257];
  json_state s1 = *s;
  int ws_ok = js_step(&s1, ' ') == 0;
  for (unsigned c = 0; c < 256; c++) {
    json_state t = *s;
    ok[0][c] = js_step(&t, c) == 0;
    t = s1;
    ok[1][c] = ws_ok && js_step(&t, c) == 0;
  }
  ok[0][256] = 0;
  ok[1][256] = (uint8_t)ws_ok;
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    if (t->flags & TOK_EOS) continue;
    if (!t->flags && t->lead_ws <= JSON_MASK_MAX_WS && ok[t->lead_ws != 0][t->key] &&
        jm_walk(v, s, i, 0))
      n_ok++;
    else
      logits[i] = -INFINITY;
  }
  return n_ok;
}

void json_mask_apply(const json_mask *m, float *logits, int n_vocab) {
  const json_vocab *v = m->v;
  if (n_vocab <= 0) return;
  int n = n_vocab < v->n ? n_vocab : v->n;
  for (int i = n; i < n_vocab; i++) logits[i] = -INFINITY;
  const json_state *s = &m->s;
  int n_ok = 0;
  if (m->dead || s->mode == JS_DONE || s->mode == JS_DEAD)
    jm_only_eos(v, logits, n);
  else if (s->mode == JS_STR)
    n_ok = jm_in_string(v, s, logits, n);
  else if (js_is_str_mode(s->mode))
    n_ok = jm_in_string_seq(v, s, logits, n);
  else
    n_ok = jm_outside(v, s, logits, n);
  /* eos: kept when the object is complete, or when nothing else is left */
  if (n_ok == 0 || json_mask_complete(m)) return;
  for (int k = 0; k < v->n_eos; k++)
    if (v->eos[k] < n) logits[v->eos[k]] = -INFINITY;
}

void json_mask_advance(json_mask *m, int32_t token) {
  const json_vocab *v = m->v;
  if (m->dead) return;
  if (token < 0 || token >= v->n) {
    m->dead = 1;
    return;
  }
  const jv_tok *t = &v->tok[token];
  if (t->flags & TOK_EOS) {
    if (m->s.mode != JS_DONE) m->dead = 1;
    return;
  }
  json_state s = m->s;
  if (t->flags || js_feed(&s, v->bytes + v->off[token], v->len[token]))
    m->dead = 1;
  else
    m->s = s;
}
