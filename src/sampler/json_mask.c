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
 *
 * A schema-guided mask (json_mask_new_schema) runs a second machine (ss_step, "the schema
 * recognizer" below) over the compiled schema's node table (json_schema.h): the same lexical
 * rules (numbers, literals, escapes, UTF-8 and whitespace are lexed by small helpers both
 * machines call, "the shared lexing" below), plus per-node rules (which key may come next, item
 * counts, string lengths in code points, enum literals through a byte trie, the branch a union's
 * first byte picks). Its apply uses the same filters (the byte after leading whitespace; the first
 * two bytes inside literals and escapes; precomputed in-string runs with code point counts), and
 * tries the tokens that pass on a copy of the lexical state and of the few frames they change
 * (ss_try). Nothing is shared mutable: a vocabulary is read-only after json_vocab_new. */
#include "sampler/json_mask.h"

#define DS_JSON_SCHEMA_INTERNAL
#include "sampler/json_schema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the shared lexing ------------------------------------------------------------------ */

/* What both recognizers lex the same way: numbers, the literals true / false / null, a string's
 * one-character escapes, UTF-8 sequences, and whitespace outside strings. Each machine keeps a
 * number's or a UTF-8 sequence's sub-state as its own modes, in the order of the sub-states
 * here (mode = its first such mode + sub-state), and a literal's in aux. */

static inline int js_is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static inline int js_is_hex(unsigned c) {
  return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* a number's sub-states */
enum {
  NUM_MINUS, /* after '-': a digit */
  NUM_ZERO,  /* a leading 0 (complete) */
  NUM_INT,   /* [1-9][0-9]* (complete) */
  NUM_DOT,   /* after '.': a digit */
  NUM_FRAC,  /* fraction digits (complete) */
  NUM_E,     /* after e/E: a sign or a digit */
  NUM_ESIGN, /* after the exponent's sign: a digit */
  NUM_EXP,   /* exponent digits (complete) */
};

/* The sub-state of a number whose first byte is c, -1 when c cannot start one. */
static inline int num_start(unsigned c) {
  if (c == '-') return NUM_MINUS;
  if (c == '0') return NUM_ZERO;
  if (c >= '1' && c <= '9') return NUM_INT;
  return -1;
}

/* One byte c (not whitespace) after a number in sub-state *k; int_only: an integer (no '.', no
 * exponent). Returns 0 when the number goes on (*k updated), 1 when it ended before c (it is
 * complete: c is read after it), -1 when c breaks it. */
static inline int num_step(uint8_t *k, unsigned c, int int_only) {
  switch (*k) {
    case NUM_MINUS:
      if (c == '0')
        *k = NUM_ZERO;
      else if (c >= '1' && c <= '9')
        *k = NUM_INT;
      else
        return -1;
      return 0;
    case NUM_ZERO:
      if (c >= '0' && c <= '9') return -1; /* no leading zeros */
      /* fall through */
    case NUM_INT:
      if (c >= '0' && c <= '9') return 0;
      if (c == '.') {
        if (int_only) return -1;
        *k = NUM_DOT;
        return 0;
      }
      /* fall through */
    case NUM_FRAC:
      if (c >= '0' && c <= '9') return 0; /* only NUM_FRAC gets here with a digit */
      if (c == 'e' || c == 'E') {
        if (int_only) return -1;
        *k = NUM_E;
        return 0;
      }
      return 1;
    case NUM_DOT:
      if (c < '0' || c > '9') return -1;
      *k = NUM_FRAC;
      return 0;
    case NUM_E:
      if (c == '+' || c == '-') {
        *k = NUM_ESIGN;
        return 0;
      }
      /* fall through */
    case NUM_ESIGN:
      if (c < '0' || c > '9') return -1;
      *k = NUM_EXP;
      return 0;
    default: /* NUM_EXP */
      if (c >= '0' && c <= '9') return 0;
      return 1;
  }
}

/* Whitespace outside strings, in mode `mode` of a machine whose modes up to `after` lie between
 * values and whose number modes start at `num0`: 0 when it takes one more byte of a whitespace
 * run (JSON_MASK_MAX_WS at most; *ws counts it), 1 when it ends a complete number (*ws = 1: the
 * caller completes the value), -1 when it is refused. */
static inline int ws_step(unsigned mode, unsigned after, unsigned num0, uint8_t *ws) {
  if (mode <= after) {
    if (*ws >= JSON_MASK_MAX_WS) return -1;
    ++*ws;
    return 0;
  }
  unsigned k = mode - num0; /* huge below num0 */
  if (k != NUM_ZERO && k != NUM_INT && k != NUM_FRAC && k != NUM_EXP) return -1;
  *ws = 1;
  return 1;
}

/* The tails of the three literals after their first byte, each ended by a NUL: 't' starts at
 * LIT_TRUE, 'f' at LIT_FALSE, 'n' at LIT_NULL. A literal's sub-state indexes js_lits: the next
 * byte expected. */
static const char js_lits[] = "rue\0alse\0ull";
enum { LIT_TRUE = 0, LIT_FALSE = 4, LIT_NULL = 9 };

/* The sub-state of a literal whose first byte is c, -1 when c cannot start one. */
static inline int lit_start(unsigned c) {
  switch (c) {
    case 't':
      return LIT_TRUE;
    case 'f':
      return LIT_FALSE;
    case 'n':
      return LIT_NULL;
    default:
      return -1;
  }
}

/* One byte c of a literal in sub-state *i: 0 when it goes on, 1 when c completes it, -1 when c
 * breaks it. */
static inline int lit_step(uint8_t *i, unsigned c) {
  if (c != (unsigned char)js_lits[*i]) return -1;
  return js_lits[++*i] == 0;
}

/* the byte after '\' of a one-character escape (\" \\ \/ \b \f \n \r \t) */
static inline int esc_simple(unsigned c) {
  switch (c) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't':
      return 1;
    default:
      return 0;
  }
}

/* a UTF-8 sequence's sub-states after its lead byte */
enum {
  U8_CONT, /* aux continuation bytes 80..BF left */
  U8_E0,   /* after E0: A0..BF, then one more */
  U8_ED,   /* after ED: 80..9F, then one more */
  U8_F0,   /* after F0: 90..BF, then two more */
  U8_F4,   /* after F4: 80..8F, then two more */
};

/* The sub-state after lead byte c (c >= 0x80; U8_CONT sets *aux), -1 when c cannot lead a
 * sequence (a stray continuation byte, C0, C1, F5..FF). */
static inline int u8_lead(unsigned c, uint8_t *aux) {
  if (c >= 0xC2 && c <= 0xDF) {
    *aux = 1;
    return U8_CONT;
  }
  if (c == 0xE0) return U8_E0;
  if (c == 0xED) return U8_ED;
  if (c >= 0xE1 && c <= 0xEF) {
    *aux = 2;
    return U8_CONT;
  }
  if (c == 0xF0) return U8_F0;
  if (c >= 0xF1 && c <= 0xF3) {
    *aux = 3;
    return U8_CONT;
  }
  if (c == 0xF4) return U8_F4;
  return -1;
}

/* One byte c of a UTF-8 sequence in sub-state *k: 0 when it goes on (*k, *aux updated), 1 when
 * c completes it, -1 when c breaks it. */
static inline int u8_step(uint8_t *k, uint8_t *aux, unsigned c) {
  unsigned lo = 0x80, hi = 0xBF, left = 2; /* the byte's range, continuation bytes after it */
  switch (*k) {
    case U8_CONT:
      if (c < 0x80 || c > 0xBF) return -1;
      return --*aux == 0;
    case U8_E0:
      lo = 0xA0;
      left = 1;
      break;
    case U8_ED:
      hi = 0x9F;
      left = 1;
      break;
    case U8_F0:
      lo = 0x90;
      break;
    default:
      hi = 0x8F;
      break; /* U8_F4 */
  }
  if (c < lo || c > hi) return -1;
  *k = U8_CONT;
  *aux = (uint8_t)left;
  return 0;
}

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
  JS_STR_UTF8,  /* in a UTF-8 sequence: JS_STR_UTF8 + its U8_* sub-state (aux: U8_CONT's) */
  JS_STR_E0,
  JS_STR_ED,
  JS_STR_F0,
  JS_STR_F4,
  JS_NUM_MINUS, /* in a number: JS_NUM_MINUS + its NUM_* sub-state */
  JS_NUM_ZERO,
  JS_NUM_INT,
  JS_NUM_DOT,
  JS_NUM_FRAC,
  JS_NUM_E,
  JS_NUM_ESIGN,
  JS_NUM_EXP,
  JS_LIT,  /* in true / false / null: aux its sub-state (indexes js_lits) */
  JS_DEAD, /* rejected: every byte is rejected */
};

_Static_assert(JS_STR_F4 - JS_STR_UTF8 == U8_F4 && JS_NUM_EXP - JS_NUM_MINUS == NUM_EXP &&
                   JS_AFTER < JS_DONE && JS_AFTER < JS_STR && JS_AFTER < JS_NUM_MINUS &&
                   JS_AFTER < JS_LIT && JS_AFTER < JS_DEAD,
               "JS_* modes in the order of the shared sub-states, those between values first");

/* One byte inside a string (mode one of JS_STR..JS_STR_F4). Returns 0 when the string goes on
 * (*mode, *aux updated), 1 for the closing quote (*mode, *aux unchanged), -1 when c breaks it. */
static inline int js_str_step(uint8_t *mode, uint8_t *aux, unsigned c) {
  switch (*mode) {
    case JS_STR: {
      if (c == '"') return 1;
      if (c == '\\') {
        *mode = JS_STR_ESC;
        return 0;
      }
      if (c < 0x20) return -1;
      if (c < 0x80) return 0;
      int k = u8_lead(c, aux);
      if (k < 0) return -1;
      *mode = (uint8_t)(JS_STR_UTF8 + k);
      return 0;
    }
    case JS_STR_ESC:
      if (esc_simple(c)) {
        *mode = JS_STR;
        return 0;
      }
      if (c != 'u') return -1;
      *mode = JS_STR_HEX;
      *aux = 4;
      return 0;
    case JS_STR_HEX:
      if (!js_is_hex(c)) return -1;
      if (--*aux == 0) *mode = JS_STR;
      return 0;
    case JS_STR_UTF8:
    case JS_STR_E0:
    case JS_STR_ED:
    case JS_STR_F0:
    case JS_STR_F4: {
      uint8_t k = (uint8_t)(*mode - JS_STR_UTF8);
      int r = u8_step(&k, aux, c);
      if (r < 0) return -1;
      *mode = r ? JS_STR : (uint8_t)(JS_STR_UTF8 + k);
      return 0;
    }
    default:
      return -1;
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
    case '{':
      return js_push(s, 1);
    case '[':
      return js_push(s, 0);
    case '"':
      s->mode = JS_STR;
      s->key = 0;
      return 0;
    default: {
      int k = num_start(c);
      if (k >= 0) {
        s->mode = (uint8_t)(JS_NUM_MINUS + k);
        return 0;
      }
      k = lit_start(c);
      if (k < 0) return -1;
      s->mode = JS_LIT;
      s->aux = (uint8_t)k;
      return 0;
    }
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
    int r = ws_step(s->mode, JS_AFTER, JS_NUM_MINUS, &s->ws);
    if (r > 0) s->mode = JS_AFTER; /* whitespace ends a complete number */
    return r < 0 ? -1 : 0;
  }
  s->ws = 0;
  uint8_t k;
  switch (s->mode) {
    case JS_START:
      return c == '{' ? js_push(s, 1) : -1;
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
    case JS_VALUE:
      return js_value_start(s, c);
    case JS_AFTER:
    after:
      if (c == ',') {
        s->mode = js_top_is_obj(s) ? JS_OBJ_KEY : JS_VALUE;
        return 0;
      }
      if (c == (js_top_is_obj(s) ? '}' : ']')) return js_pop(s);
      return -1;
    /* in a number: the sub-state set as a constant on each path, so that num_step's own switch
     * folds into this one (one dispatch a byte, as this path is hot) */
    case JS_NUM_MINUS:
      k = NUM_MINUS;
      goto num;
    case JS_NUM_ZERO:
      k = NUM_ZERO;
      goto num;
    case JS_NUM_INT:
      k = NUM_INT;
      goto num;
    case JS_NUM_DOT:
      k = NUM_DOT;
      goto num;
    case JS_NUM_FRAC:
      k = NUM_FRAC;
      goto num;
    case JS_NUM_E:
      k = NUM_E;
      goto num;
    case JS_NUM_ESIGN:
      k = NUM_ESIGN;
      goto num;
    case JS_NUM_EXP:
      k = NUM_EXP;
    num : {
      int r = num_step(&k, c, 0);
      if (r < 0) return -1;
      if (r == 0) {
        s->mode = (uint8_t)(JS_NUM_MINUS + k);
        return 0;
      }
      s->mode = JS_AFTER; /* the number ended: c is read after it */
      goto after;
    }
    case JS_LIT: {
      int r = lit_step(&s->aux, c);
      if (r > 0) s->mode = JS_AFTER;
      return r < 0 ? -1 : 0;
    }
    default:
      return -1; /* JS_DONE, JS_DEAD */
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

/* ---- the schema recognizer -------------------------------------------------------------- */

/* The schema-guided language is read by a second machine: a lexical state (ss_lex) and a stack
 * of open containers, each a frame (its node, and a count: an object's next property index, an
 * array's items so far). A token is tried on an ss_try: the lexical state, how many of a
 * read-only base stack's frames are still open, and the frames above them it pushed or changed
 * (a base frame is copied up before it changes), so a try costs the bytes it reads. */

enum {
  SM_START,     /* before the root: whitespace or its first byte */
  SM_OBJ_FIRST, /* after '{': whitespace, '"' (a key) or '}' */
  SM_OBJ_KEY,   /* after ',' in an object: whitespace or '"' */
  SM_COLON,     /* after a key: whitespace or ':' */
  SM_ARR_FIRST, /* after '[': whitespace, an item or ']' */
  SM_VALUE,     /* a value of node `node`: whitespace or its first byte */
  SM_AFTER,     /* after a value in a container: whitespace, ',' or the closer */
  SM_DONE,      /* the root is complete: nothing may follow */
  SM_KEY,       /* in a schema object's key: x is the key trie's node */
  SM_ENUM,      /* in an enum / const literal: x is its trie's node */
  SM_NUM_MINUS, /* in a number: SM_NUM_MINUS + its NUM_* sub-state; aux 1: an integer (no '.', no
                 * exponent) */
  SM_NUM_ZERO,
  SM_NUM_INT,
  SM_NUM_DOT,
  SM_NUM_FRAC,
  SM_NUM_E,
  SM_NUM_ESIGN,
  SM_NUM_EXP,
  SM_LIT,       /* in true / false / null: aux its sub-state (indexes js_lits) */
  SM_STR,       /* in a string (node `node`, x code points so far; key: a free object's key) */
  SM_STR_ESC,   /* after '\' */
  SM_STR_HEX1,  /* after \u */
  SM_STR_HEXD,  /* after \uD: 0-7 a plain escape, 8-B a high surrogate, C-F refused */
  SM_STR_HEX,   /* aux hex digits left */
  SM_STR_HEXHI, /* aux hex digits left of a high surrogate: then \uDC00..\uDFFF must follow */
  SM_STR_LO_BS, /* the low surrogate's '\' */
  SM_STR_LO_U,  /* its 'u' */
  SM_STR_LO_D,  /* its 'D' */
  SM_STR_LO_CF, /* its C-F */
  SM_STR_UTF8,  /* in a UTF-8 sequence: SM_STR_UTF8 + its U8_* sub-state (aux: U8_CONT's) */
  SM_STR_E0,
  SM_STR_ED,
  SM_STR_F0,
  SM_STR_F4,
};

_Static_assert(SM_STR_F4 - SM_STR_UTF8 == U8_F4 && SM_NUM_EXP - SM_NUM_MINUS == NUM_EXP &&
                   SM_AFTER < SM_DONE && SM_AFTER < SM_KEY && SM_AFTER < SM_ENUM &&
                   SM_AFTER < SM_NUM_MINUS && SM_AFTER < SM_LIT && SM_AFTER < SM_STR,
               "SM_* modes in the order of the shared sub-states, those between values first");

typedef struct ss_lex {
  uint8_t mode; /* SM_* */
  uint8_t aux;
  uint8_t ws;     /* whitespace bytes in a row outside strings */
  uint8_t key;    /* SM_STR: 1 a free object's key, 2 a key of an object with additional
                   * properties */
  int32_t node;   /* SM_VALUE, SM_COLON: the value's node; SM_STR: the string's; in a number: its
                   * node */
  uint32_t x;     /* SM_STR: code points so far; SM_KEY, SM_ENUM: the trie node */
  int32_t q;      /* SM_STR: the pattern automaton's state; key 2: the key trie's node (-1: the
                   * key is none of the properties') */
  uint8_t fl;     /* key 2: an escape was read (the key must be a property's) */
  json_num_st ns; /* in a number with bounds */
} ss_lex;

typedef struct ss_frame {
  int32_t node; /* SN_OBJECT, SN_FREEOBJ, SN_ARRAY */
  uint32_t n;   /* SN_OBJECT: the properties written or skipped (the next key's lowest index);
                 * SN_ARRAY: items started */
} ss_frame;

typedef struct ss_try {
  ss_lex l;
  int base; /* frames of the base stack still open */
  int nloc; /* frames above them, in loc */
  ss_frame loc[JSON_MASK_MAX_DEPTH];
} ss_try;

/* One byte inside a string. Returns 0 when the string goes on, 1 for the closing quote (l
 * unchanged), -1 when c breaks it or starts code point max + 1. */
static inline int ss_str_step(ss_lex *l, unsigned c, uint32_t max) {
  switch (l->mode) {
    case SM_STR:
      if (c == '"') return 1;
      if (c == '\\') {
        l->mode = SM_STR_ESC;
      } else if (c < 0x20) {
        return -1;
      } else if (c >= 0x80) {
        int k = u8_lead(c, &l->aux);
        if (k < 0) return -1;
        l->mode = (uint8_t)(SM_STR_UTF8 + k);
      }
      if (l->x >= max) return -1;
      l->x++;
      return 0;
    case SM_STR_ESC:
      if (esc_simple(c)) {
        l->mode = SM_STR;
        return 0;
      }
      if (c != 'u') return -1;
      l->mode = SM_STR_HEX1;
      return 0;
    case SM_STR_HEX1:
      if (!js_is_hex(c)) return -1;
      if ((c | 0x20) == 'd') {
        l->mode = SM_STR_HEXD;
      } else {
        l->mode = SM_STR_HEX;
        l->aux = 3;
      }
      return 0;
    case SM_STR_HEXD:
      if (c >= '0' && c <= '7') {
        l->mode = SM_STR_HEX;
      } else if (c == '8' || c == '9' || (c | 0x20) == 'a' || (c | 0x20) == 'b') {
        l->mode = SM_STR_HEXHI;
      } else {
        return -1; /* a low surrogate without its high one, or not hex */
      }
      l->aux = 2;
      return 0;
    case SM_STR_HEX:
    case SM_STR_HEXHI:
      if (!js_is_hex(c)) return -1;
      if (--l->aux == 0) l->mode = l->mode == SM_STR_HEX ? SM_STR : SM_STR_LO_BS;
      return 0;
    case SM_STR_LO_BS:
      if (c != '\\') return -1;
      l->mode = SM_STR_LO_U;
      return 0;
    case SM_STR_LO_U:
      if (c != 'u') return -1;
      l->mode = SM_STR_LO_D;
      return 0;
    case SM_STR_LO_D:
      if ((c | 0x20) != 'd') return -1;
      l->mode = SM_STR_LO_CF;
      return 0;
    case SM_STR_LO_CF:
      if ((c | 0x20) < 'c' || (c | 0x20) > 'f') return -1;
      l->mode = SM_STR_HEX;
      l->aux = 2;
      return 0;
    case SM_STR_UTF8:
    case SM_STR_E0:
    case SM_STR_ED:
    case SM_STR_F0:
    case SM_STR_F4: {
      uint8_t k = (uint8_t)(l->mode - SM_STR_UTF8);
      int r = u8_step(&k, &l->aux, c);
      if (r < 0) return -1;
      l->mode = r ? SM_STR : (uint8_t)(SM_STR_UTF8 + k);
      return 0;
    }
    default:
      return -1;
  }
}

static inline int ss_depth(const ss_try *t) { return t->base + t->nloc; }

static inline const ss_frame *ss_top(const ss_frame *bs, const ss_try *t) {
  return t->nloc ? &t->loc[t->nloc - 1] : &bs[t->base - 1];
}

/* the innermost frame, to change (a base frame is copied up first) */
static inline ss_frame *ss_top_w(const ss_frame *bs, ss_try *t) {
  if (!t->nloc) {
    t->loc[0] = bs[--t->base];
    t->nloc = 1;
  }
  return &t->loc[t->nloc - 1];
}

static inline void ss_pop(ss_try *t) {
  if (t->nloc)
    t->nloc--;
  else
    t->base--;
}

/* a value is complete */
static inline void ss_done(ss_try *t) { t->l.mode = ss_depth(t) ? SM_AFTER : SM_DONE; }

/* trie node x's child by byte c, -1 when none */
static inline int32_t ss_child(const json_schema *sc, int32_t x, unsigned c) {
  const ss_tnode *t = &sc->tn[x];
  const uint8_t *ec = sc->ec + t->e0;
  int ne = t->ne;
  if (ne <= 8) {
    for (int i = 0; i < ne; i++)
      if (ec[i] == c) return sc->ech[t->e0 + i];
    return -1;
  }
  int lo = 0, hi = ne;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (ec[mid] < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ne && ec[lo] == c ? sc->ech[t->e0 + lo] : -1;
}

/* any bit lo..hi (inclusive) of b */
static inline int ss_bits_any(const uint64_t *b, uint32_t lo, uint32_t hi) {
  for (uint32_t w = lo / 64; w <= hi / 64; w++) {
    uint64_t mask = ~(uint64_t)0;
    if (w == lo / 64) mask &= ~(uint64_t)0 << (lo % 64);
    if (w == hi / 64) mask &= ~(uint64_t)0 >> (63 - hi % 64);
    if (b[w] & mask) return 1;
  }
  return 0;
}

/* Object o (open at depth d) can still take a key from property `from` on: one of properties
 * from .. the first required one at or after from whose value fits under the depth limit (and,
 * x >= 0, whose key's encoding runs through key-trie node x). */
static int ss_keys_ok(const json_schema *sc, const ss_node *o, uint32_t from, int d, int32_t x) {
  uint32_t np = (uint32_t)o->np;
  if (from >= np) return 0;
  uint32_t r = sc->freq[o->req + from];
  if (r >= np) r = np - 1;
  const uint64_t *b = x >= 0 ? sc->bits + sc->tn[x].bits : NULL;
  if (d + o->mdmax <= JSON_MASK_MAX_DEPTH) return b ? ss_bits_any(b, from, r) : 1;
  for (uint32_t j = from; j <= r; j++)
    if ((!b || ((b[j / 64] >> (j % 64)) & 1)) &&
        d + sc->nodes[sc->props[o->sub + j].node].md <= JSON_MASK_MAX_DEPTH)
      return 1;
  return 0;
}

/* Object o (open at depth d) can take an additional property now. */
static inline int ss_ap_ok(const json_schema *sc, const ss_node *o, int d) {
  return o->kind == SN_OBJECT && o->ap >= 0 && d + sc->nodes[o->ap].md <= JSON_MASK_MAX_DEPTH;
}

/* the node of array a's item i (its prefix items first) */
static inline int32_t ss_item(const json_schema *sc, const ss_node *a, uint32_t i) {
  return i < (uint32_t)a->np ? sc->pitems[a->req + (int32_t)i] : a->sub;
}

/* a number that ends here (its mode a complete one) is within its node's bounds */
static inline int ss_num_end_ok(const json_schema *sc, const ss_lex *l) {
  if (l->mode < SM_NUM_MINUS || l->mode > SM_NUM_EXP) return 1;
  int32_t nb = sc->nodes[l->node].sub;
  return nb < 0 || json_num_final(&sc->nums[nb], &l->ns);
}

/* The byte after '\' of a one-character escape, as the string carries it. */
static inline int esc_byte(unsigned c) {
  switch (c) {
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return (int)c; /* " \ / */
  }
}

/* A string under a pattern / format: byte c, read in string mode m0 (ss_str_step's result r:
 * 0 it goes on, 1 the closing quote), steps the automaton over the string's own bytes. The
 * automaton reads each raw byte, and the byte a one-character escape stands for; a \u escape
 * is refused, so that the bytes read are exactly the string's UTF-8 (and every code point the
 * automaton allows can be written raw or with a one-character escape: regex_dfa_restrict
 * removed the other control bytes). Returns 0, or -1 when c is refused. */
static inline int ss_dfa_step(const regex_dfa *d, ss_lex *l, uint8_t m0, unsigned c, int r,
                              uint32_t max) {
  if (r) return d->acc[l->q] ? 0 : -1;
  int dc;
  if (m0 == SM_STR)
    dc = c == '\\' ? -1 : (int)c;
  else if (m0 == SM_STR_ESC)
    dc = c == 'u' ? -2 : esc_byte(c);
  else if (m0 >= SM_STR_UTF8)
    dc = (int)c;
  else
    dc = -2;
  const int32_t *row = d->next + (size_t)l->q * (size_t)d->nc;
  if (dc == -1) { /* '\\': some escape must be able to follow */
    static const char esc[] = "\"\\/\b\f\n\r\t";
    for (int i = 0; i < 8; i++) {
      int32_t n = row[d->cls[(unsigned char)esc[i]]];
      if (n >= 0 && d->dist[n] <= max - l->x) return 0;
    }
    return -1;
  }
  if (dc < 0) return -1;
  int32_t n = row[d->cls[dc]];
  if (n < 0 || d->dist[n] > max - l->x) return -1; /* l->x <= max: ss_str_step saw to it */
  l->q = n;
  return 0;
}

/* property j of object o (open at depth d, properties from `from` on still free) may be
 * written now */
static inline int ss_prop_ok(const json_schema *sc, const ss_node *o, uint32_t from, int d,
                             uint32_t j) {
  uint32_t np = (uint32_t)o->np;
  if (j < from || j >= np) return 0;
  uint32_t r = sc->freq[o->req + from];
  if (j > r) return 0;
  return d + sc->nodes[sc->props[o->sub + j].node].md <= JSON_MASK_MAX_DEPTH;
}

/* A key of an object with additional properties (mode SM_STR, key 2): byte c read in string
 * mode m0 (ss_str_step's result r). The key trie is followed alongside: a key that ends as a
 * property's name is that property (when its turn allows it), any other is an additional
 * property. Such keys carry no escapes unless they are a property's (so that no two spellings
 * of one name can meet: an escape is only read while the trie still leads to a property that
 * may come now). Returns 0, or -1 when c is refused. */
static int ss_akey_step(const json_schema *sc, const ss_frame *bs, ss_try *t, uint8_t m0,
                        unsigned c, int r) {
  ss_lex *l = &t->l;
  const ss_frame *f = ss_top(bs, t);
  const ss_node *o = &sc->nodes[f->node];
  int d = ss_depth(t);
  if (r) {
    int32_t ch = l->q >= 0 ? ss_child(sc, l->q, '"') : -1;
    int32_t j = ch >= 0 ? sc->tn[ch].term : -1;
    l->key = 0;
    l->mode = SM_COLON;
    if (j >= 0) {
      if (!ss_prop_ok(sc, o, f->n, d, (uint32_t)j)) return -1;
      ss_top_w(bs, t)->n = (uint32_t)j + 1;
      l->node = sc->props[o->sub + j].node;
      return 0;
    }
    if (l->fl) return -1;
    l->node = o->ap;
    return 0;
  }
  if (m0 == SM_STR && c == '\\') l->fl = 1;
  l->q = l->q >= 0 ? ss_child(sc, l->q, c) : -1;
  if (l->fl && (l->q < 0 || !ss_keys_ok(sc, o, f->n, d, l->q))) return -1;
  return 0;
}

/* the first byte c (not whitespace) of a value of node */
static inline int ss_value(const json_schema *sc, ss_try *t, int32_t node, unsigned c) {
  const ss_node *nd = &sc->nodes[node];
  if (nd->kind == SN_UNION) {
    node = sc->first[nd->sub + c];
    if (node < 0) return -1;
    nd = &sc->nodes[node];
  }
  if (ss_depth(t) + nd->md > JSON_MASK_MAX_DEPTH) return -1;
  ss_lex *l = &t->l;
  switch (nd->kind) {
    case SN_OBJECT:
    case SN_FREEOBJ:
    case SN_ARRAY:
      if (c != (nd->kind == SN_ARRAY ? '[' : '{')) return -1;
      t->loc[t->nloc++] = (ss_frame){node, 0};
      l->mode = nd->kind == SN_ARRAY ? SM_ARR_FIRST : SM_OBJ_FIRST;
      return 0;
    case SN_STRING:
      if (c != '"') return -1;
      l->mode = SM_STR;
      l->node = node;
      l->x = 0;
      l->key = 0;
      l->q = 0;
      return 0;
    case SN_NUMBER:
    case SN_INTEGER: {
      int k = num_start(c);
      if (k < 0) return -1;
      l->mode = (uint8_t)(SM_NUM_MINUS + k);
      l->aux = nd->kind == SN_INTEGER;
      l->node = node;
      if (nd->sub >= 0) {
        memset(&l->ns, 0, sizeof l->ns);
        if (json_num_step(&sc->nums[nd->sub], &l->ns, c)) return -1;
      }
      return 0;
    }
    case SN_BOOL:
    case SN_NULL: {
      int k = lit_start(c);
      if (k < 0 || (k == LIT_NULL) != (nd->kind == SN_NULL)) return -1;
      l->mode = SM_LIT;
      l->aux = (uint8_t)k;
      return 0;
    }
    case SN_ENUM: {
      int32_t ch = ss_child(sc, nd->sub, c);
      if (ch < 0) return -1;
      l->mode = SM_ENUM;
      l->x = (uint32_t)ch;
      if (sc->tn[ch].ne == 0) ss_done(t);
      return 0;
    }
    default:
      return -1;
  }
}

/* One byte. Returns 0 when the text is still a prefix of a valid one, -1 otherwise (t is then
 * partly updated). bs: the base stack, read only. */
static inline int ss_step(const json_schema *sc, const ss_frame *bs, ss_try *t, unsigned c) {
  ss_lex *l = &t->l;
  if (l->mode >= SM_STR) {
    const ss_node *nd = &sc->nodes[l->node];
    uint8_t m0 = l->mode;
    int r = ss_str_step(l, c, nd->b);
    if (r < 0) return -1;
    if (l->key == 2) return ss_akey_step(sc, bs, t, m0, c, r);
    if (nd->sub >= 0 && ss_dfa_step(&sc->dfa[nd->sub], l, m0, c, r, nd->b)) return -1;
    if (r == 0) return 0;
    if (l->x < nd->a) return -1; /* the closing quote, too early */
    if (l->key) {
      l->key = 0;
      l->mode = SM_COLON;
      l->node = SN_ANY;
    } else {
      ss_done(t);
    }
    return 0;
  }
  if (l->mode == SM_KEY) {
    int32_t ch = ss_child(sc, (int32_t)l->x, c);
    if (ch < 0) return -1;
    const ss_frame *f = ss_top(bs, t);
    const ss_node *o = &sc->nodes[f->node];
    if (!ss_keys_ok(sc, o, f->n, ss_depth(t), ch)) return -1;
    l->x = (uint32_t)ch;
    int32_t j = sc->tn[ch].term;
    if (j >= 0) {
      ss_top_w(bs, t)->n = (uint32_t)j + 1;
      l->mode = SM_COLON;
      l->node = sc->props[o->sub + j].node;
    }
    return 0;
  }
  if (l->mode == SM_ENUM) {
    int32_t ch = ss_child(sc, (int32_t)l->x, c);
    if (ch >= 0) {
      l->x = (uint32_t)ch;
      if (sc->tn[ch].ne == 0) ss_done(t);
      return 0;
    }
    if (sc->tn[l->x].term < 0) return -1;
    ss_done(t); /* a complete number literal, ended by c: c is read after it */
  }
  if (js_is_ws(c)) {
    int r = ws_step(l->mode, SM_AFTER, SM_NUM_MINUS, &l->ws);
    if (r > 0) { /* whitespace ends a complete number */
      if (!ss_num_end_ok(sc, l)) return -1;
      ss_done(t);
    }
    return r < 0 ? -1 : 0;
  }
  l->ws = 0;
  switch (l->mode) {
    case SM_START:
      return ss_value(sc, t, sc->root, c);
    case SM_VALUE:
      return ss_value(sc, t, l->node, c);
    case SM_OBJ_FIRST:
    case SM_OBJ_KEY: {
      const ss_frame *f = ss_top(bs, t);
      const ss_node *o = &sc->nodes[f->node];
      if (c == '}' && l->mode == SM_OBJ_FIRST) {
        if (o->kind == SN_OBJECT && sc->freq[o->req] < (uint32_t)o->np) return -1;
        ss_pop(t);
        ss_done(t);
        return 0;
      }
      if (c != '"') return -1;
      if (o->kind == SN_FREEOBJ) {
        l->mode = SM_STR;
        l->key = 1;
        l->node = SN_ANY_STR;
        l->x = 0;
        return 0;
      }
      int32_t ch = ss_child(sc, o->trie, '"');
      if (ss_ap_ok(sc, o, ss_depth(t))) {
        l->mode = SM_STR;
        l->key = 2;
        l->node = SN_ANY_STR;
        l->x = 0;
        l->q = ch;
        l->fl = 0;
        return 0;
      }
      if (ch < 0 || !ss_keys_ok(sc, o, f->n, ss_depth(t), ch)) return -1;
      l->mode = SM_KEY;
      l->x = (uint32_t)ch;
      return 0;
    }
    case SM_COLON:
      if (c != ':') return -1;
      l->mode = SM_VALUE; /* l->node: the value's, set with the key */
      return 0;
    case SM_ARR_FIRST: {
      const ss_node *a = &sc->nodes[ss_top(bs, t)->node];
      if (c == ']') {
        if (a->a > 0) return -1;
        ss_pop(t);
        ss_done(t);
        return 0;
      }
      if (a->b == 0) return -1;
      ss_top_w(bs, t)->n = 1;
      return ss_value(sc, t, ss_item(sc, a, 0), c);
    }
    case SM_AFTER:
    after : {
      const ss_frame *f = ss_top(bs, t);
      const ss_node *o = &sc->nodes[f->node];
      if (o->kind == SN_ARRAY) {
        if (c == ',') {
          int32_t it = f->n < o->b ? ss_item(sc, o, f->n) : -1;
          if (it < 0 || ss_depth(t) + sc->nodes[it].md > JSON_MASK_MAX_DEPTH) return -1;
          ss_top_w(bs, t)->n++;
          l->mode = SM_VALUE;
          l->node = it;
          return 0;
        }
        if (c != ']' || f->n < o->a) return -1;
      } else {
        if (c == ',') {
          if (o->kind == SN_OBJECT && !ss_keys_ok(sc, o, f->n, ss_depth(t), -1) &&
              !ss_ap_ok(sc, o, ss_depth(t)))
            return -1;
          l->mode = SM_OBJ_KEY;
          return 0;
        }
        if (c != '}' || (o->kind == SN_OBJECT && sc->freq[o->req + f->n] < (uint32_t)o->np))
          return -1;
      }
      ss_pop(t);
      ss_done(t);
      return 0;
    }
    case SM_NUM_MINUS:
    case SM_NUM_ZERO:
    case SM_NUM_INT:
    case SM_NUM_DOT:
    case SM_NUM_FRAC:
    case SM_NUM_E:
    case SM_NUM_ESIGN:
    case SM_NUM_EXP: {
      uint8_t k = (uint8_t)(l->mode - SM_NUM_MINUS);
      int r = num_step(&k, c, l->aux);
      if (r < 0) return -1;
      int32_t nb = sc->nodes[l->node].sub;
      if (r == 0) {
        l->mode = (uint8_t)(SM_NUM_MINUS + k);
        if (nb >= 0 && json_num_step(&sc->nums[nb], &l->ns, c)) return -1;
        return 0;
      }
      if (!ss_num_end_ok(sc, l)) return -1;
      ss_done(t); /* the number ended: c is read after it (nothing may follow the root) */
      if (l->mode != SM_AFTER) return -1;
      goto after;
    }
    case SM_LIT: {
      int r = lit_step(&l->aux, c);
      if (r > 0) ss_done(t);
      return r < 0 ? -1 : 0;
    }
    default:
      return -1; /* SM_DONE */
  }
}

static inline int ss_feed(const json_schema *sc, const ss_frame *bs, ss_try *t,
                          const unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ss_step(sc, bs, t, b[i])) return -1;
  return 0;
}

/* A token's run through a schema-guided string from the plain in-string state (the schema
 * lexer's: surrogate escapes paired), for json_mask_new_schema's masks. */
enum { SV_STAY, SV_BREAK, SV_QUOTE, SV_WALK, SV_NEVER, SV_EOS };
typedef struct sv_tok {
  uint16_t q;   /* SV_QUOTE: the offset of the closing quote */
  uint16_t ncp; /* code points before it (SV_STAY: in the whole token) */
  uint8_t cls;  /* SV_*: SV_WALK when q or ncp would not fit */
  uint8_t bs;   /* a '\\' before the closing quote (SV_STAY: in the whole token) */
} sv_tok;

/* Fills s from a token's bytes b[n] (n > 0): its run from the plain in-string state. */
static void sv_classify(sv_tok *s, const unsigned char *b, size_t n) {
  ss_lex l;
  memset(&l, 0, sizeof l);
  l.mode = SM_STR;
  s->cls = SV_STAY;
  s->bs = 0;
  for (size_t i = 0; i < n; i++) {
    int r = ss_str_step(&l, b[i], UINT32_MAX);
    s->bs |= b[i] == '\\' && r == 0;
    if (r == 0) continue;
    if (r < 0) {
      s->cls = SV_BREAK;
      return;
    }
    s->cls = i > UINT16_MAX ? SV_WALK : SV_QUOTE;
    s->q = (uint16_t)(i > UINT16_MAX ? 0 : i);
    break;
  }
  if (l.x >= UINT16_MAX)
    s->cls = SV_WALK;
  else
    s->ncp = (uint16_t)l.x;
}

/* ---- the vocabulary --------------------------------------------------------------------- */

enum { TOK_NEVER = 1, TOK_EOS = 2 }; /* jv_tok.flags: never content (special, empty, eos) */
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
  jv_tok *tok;          /* [n] */
  sv_tok *sv;           /* [n] */
  uint16_t *second;     /* [n] the second byte; 256: none (one byte) */
  size_t *off;          /* [n] into bytes */
  size_t *len;          /* [n] */
  unsigned char *bytes; /* every token's bytes, back to back */
  int32_t *eos;         /* [n_eos], in range, distinct */
  int n_eos;
};

void json_vocab_free(json_vocab *v) {
  if (!v) return;
  free(v->tok);
  free(v->sv);
  free(v->second);
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
  v->sv = calloc(nv ? nv : 1, sizeof *v->sv);
  v->second = calloc(nv ? nv : 1, sizeof *v->second);
  v->off = calloc(nv ? nv : 1, sizeof *v->off);
  v->len = calloc(nv ? nv : 1, sizeof *v->len);
  v->bytes = malloc(total ? total : 1);
  v->eos = malloc((n_eos > 0 ? (size_t)n_eos : 1) * sizeof *v->eos);
  if (!v->tok || !v->sv || !v->second || !v->off || !v->len || !v->bytes || !v->eos) {
    json_vocab_free(v);
    return NULL;
  }
  size_t at = 0;
  for (size_t i = 0; i < nv; i++) {
    size_t n = bytes && bytes[i] && lens ? lens[i] : 0;
    jv_tok *t = &v->tok[i];
    v->off[i] = at;
    v->len[i] = n;
    v->second[i] = (uint16_t)(n >= 2 ? (unsigned char)bytes[i][1] : 256);
    if (n) memcpy(v->bytes + at, bytes[i], n);
    if (n == 0 || (special && special[i])) {
      t->flags = TOK_NEVER;
      t->key = 256;
      t->str = STR_BREAK;
      v->sv[i].cls = SV_NEVER;
    } else {
      jv_classify(t, v->bytes + at, n);
      sv_classify(&v->sv[i], v->bytes + at, n);
    }
    at += n;
  }
  for (int k = 0; k < n_eos; k++) {
    int32_t e = eos[k];
    if (e < 0 || e >= n_vocab || (v->tok[e].flags & TOK_EOS)) continue;
    v->tok[e].flags = TOK_NEVER | TOK_EOS;
    v->sv[e].cls = SV_EOS;
    v->eos[v->n_eos++] = e;
  }
  return v;
}

/* ---- the mask --------------------------------------------------------------------------- */

/* Where a tool-call grammar's text stands (json_schema.h's ntools > 0). */
enum {
  TG_THINK, /* in the think block: any text until "</think>" (pos: its bytes matched) */
  TG_GAP,   /* before a call (calls > 0: after one): whitespace, or a call's first byte */
  TG_PRE,   /* in call k's prefix literal (pos bytes matched; k the lowest tool it may be) */
  TG_ARGS,  /* in call k's arguments object (the schema state sl / stack, under sc; pos: bytes
             * of "<tool_call>" / "</tool_call>" matched, which may not appear there) */
  TG_SUF,   /* in the suffix literal (pos bytes matched) */
  /* the XML form (json_schema.h's txml): the arguments object is fed the JSON its parameter
   * blocks stand for, under sc */
  TX_TAG,  /* "\n<parameter=" or "\n</function>" (pos bytes matched; sub: 1 the first, 2 the
            * second, 0 not known yet) */
  TX_NAME, /* in parameter j's name and ">\n" (pos bytes matched; j the lowest it may be) */
  TF_TEXT, /* tfree: outside a call block (pos: bytes of "<tool_call>" matched) */
  TF_CALL, /* tfree: in the call block (pos: bytes of "</tool_call>" matched) */
  TF_DONE, /* tfree: the call block ended: only eos */
  TX_VAL,  /* in a value (sub: 1 raw text); nl: a newline held, and then pos bytes of
            * "</parameter>" (the value ends there); bp / bc: bytes of "</parameter>" /
            * "</tool_call>" the value itself ends with */
};

typedef struct tg_st {
  uint8_t ph;  /* TG_* */
  uint8_t ws;  /* TG_GAP: whitespace bytes in a row */
  uint8_t sub; /* TX_TAG, TX_VAL */
  uint8_t nl, bp, bc;
  int32_t pos, k, calls, j;
} tg_st;

struct json_mask {
  const json_vocab *v;
  json_state s;
  int dead;              /* a forbidden token was advanced over */
  const json_schema *tg; /* a tool-call grammar (its state tgs; sc its current call's), or NULL */
  tg_st tgs;
  const json_schema *sc; /* NULL: the free json_object mask (s); else the schema's (sl, stack) */
  ss_lex sl;
  int depth;
  ss_frame stack[JSON_MASK_MAX_DEPTH];
  int prep;        /* the n_vocab the allowed set in bits was prepared for; 0: none */
  int cap;         /* the ids bits has room for (its vocabulary's size when allocated) */
  uint64_t bits[]; /* [(cap + 63) / 64] json_mask_prepare's set: bit i set, id i allowed */
};

json_mask *json_mask_new(const json_vocab *v) {
  size_t words = ((size_t)v->n + 63) / 64;
  json_mask *m = calloc(1, sizeof *m + words * sizeof m->bits[0]);
  if (!m) return NULL;
  m->v = v;
  m->cap = v->n;
  json_state_init(&m->s);
  return m;
}

json_mask *json_mask_new_schema(const json_vocab *v, const json_schema *s) {
  if (!s) return NULL;
  json_mask *m = json_mask_new(v);
  if (!m) return NULL;
  m->sc = s;
  m->sl.mode = SM_START;
  if (s->ntools > 0) {
    m->tg = s;
    m->tgs.ph = s->tthink ? TG_THINK : s->tfree ? TF_TEXT : TG_GAP;
  }
  return m;
}

void json_mask_free(json_mask *m) { free(m); }

int json_mask_complete(const json_mask *m) {
  if (m->tg && m->tg->tfree) return !m->dead; /* eos may end the text anywhere */
  if (m->tg) return !m->dead && m->tgs.ph == TG_GAP && m->tgs.calls > 0;
  return !m->dead && (m->sc ? m->sl.mode == SM_DONE : m->s.mode == JS_DONE);
}
int json_mask_dead(const json_mask *m) { return m->dead; }

/* The recognizer's state is copied; dst's prepared set is dropped (not copied: copies are made
 * per token tried, and the set is 19 KB on a real vocabulary), and dst keeps its own bitset. */
void json_mask_copy(json_mask *dst, const json_mask *src) {
  int cap = dst->cap;
  *dst = *src; /* the flexible array member bits is not part of the assignment */
  dst->cap = cap;
  dst->prep = 0;
}

/* ---- where the verdicts go ------------------------------------------------------------- */

/* The computations below (the sm_* and jm_* kernels, one per kind of state) give every id below
 * n a verdict, ok (1: allowed, its logit left as it was), and send it to an out: either logits
 * (an id not ok gets -INFINITY: json_mask_apply without a prepared set) or, to_bits, the mask's
 * bitset (bit i = ok, built in acc and stored a word at a time: json_mask_prepare). They are
 * inlined into both callers (jm_compute's), where to_bits is a constant, so that each caller
 * gets its own loops with nothing to decide per token. */
#define JM_INLINE static inline __attribute__((always_inline))

typedef struct jm_out {
  int to_bits;    /* a constant where the kernels are inlined */
  float *logits;  /* !to_bits */
  uint64_t *bits; /* to_bits: [(n + 63) / 64] */
  uint64_t acc;   /* to_bits: the verdicts of the current word so far */
} jm_out;

/* id i's verdict (ids in ascending order, each once; then out_end). blend (a constant): write
 * the logit without a branch (verdicts that are not predictable). */
JM_INLINE void out_put(jm_out *o, int i, int ok, int blend) {
  if (!o->to_bits) {
    if (!blend) {
      if (!ok) o->logits[i] = -INFINITY;
      return;
    }
    uint32_t bits, keep = -(uint32_t)(ok != 0); /* logits[i], or -INFINITY's bits */
    memcpy(&bits, &o->logits[i], sizeof bits);
    bits = (bits & keep) | (UINT32_C(0xFF800000) & ~keep);
    memcpy(&o->logits[i], &bits, sizeof bits);
    return;
  }
  o->acc |= (uint64_t)(ok != 0) << (i & 63);
  if ((i & 63) == 63) {
    o->bits[i >> 6] = o->acc;
    o->acc = 0;
  }
}

/* after the verdicts of ids 0..n-1: stores the last partial word */
JM_INLINE void out_end(jm_out *o, int n) {
  if (o->to_bits && (n & 63)) o->bits[n >> 6] = o->acc;
}

/* forbids id i after out_end */
JM_INLINE void out_forbid(jm_out *o, int i) {
  if (o->to_bits)
    o->bits[i >> 6] &= ~((uint64_t)1 << (i & 63));
  else
    o->logits[i] = -INFINITY;
}

/* ---- the schema mask -------------------------------------------------------------------- */

static inline void sm_begin(ss_try *t, const json_mask *m) {
  t->l = m->sl;
  t->base = m->depth;
  t->nloc = 0;
}

/* *t = *from, copying only the frames in use */
static inline void ss_copy(ss_try *t, const ss_try *from) {
  t->l = from->l;
  t->base = from->base;
  t->nloc = from->nloc;
  if (from->nloc) memcpy(t->loc, from->loc, (size_t)from->nloc * sizeof *t->loc);
}

/* 1 when bytes b[n], read from *from, keep the text a prefix */
static inline int sm_walk(const json_mask *m, const ss_try *from, const unsigned char *b,
                          size_t n) {
  ss_try t;
  ss_copy(&t, from);
  return ss_feed(m->sc, m->stack, &t, b, n) == 0;
}

/* 1 when byte c, read from *from, keeps the text a prefix */
static inline int sm_try(const json_mask *m, const ss_try *from, unsigned c) {
  ss_try t;
  ss_copy(&t, from);
  return ss_step(m->sc, m->stack, &t, c) == 0;
}

/* the mask's state becomes *t's (its frames written over the base stack) */
static void sm_commit(json_mask *m, const ss_try *t) {
  if (t->nloc) memcpy(m->stack + t->base, t->loc, (size_t)t->nloc * sizeof *t->loc);
  m->depth = t->base + t->nloc;
  m->sl = t->l;
}

/* feeds b[n] to the mask's state: 0, or -1 (the state unchanged) */
static int sm_feed(json_mask *m, const unsigned char *b, size_t n) {
  ss_try t;
  sm_begin(&t, m);
  if (ss_feed(m->sc, m->stack, &t, b, n)) return -1;
  sm_commit(m, &t);
  return 0;
}

/* The plain in-string state: the precomputed runs and code point counts decide, quotes are
 * walked from after them. */
JM_INLINE int sm_in_string(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  const ss_node *nd = &m->sc->nodes[m->sl.node];
  uint32_t cnt = m->sl.x;
  uint32_t room = nd->b - cnt;                   /* code points the string may still take */
  uint32_t need = nd->a > cnt ? nd->a - cnt : 0; /* and must still take */
  ss_try t0, sq;
  sm_begin(&t0, m);
  ss_copy(&sq, &t0);
  sq.l.x = cnt > nd->a ? cnt : nd->a;
  int sq_ok = ss_step(m->sc, m->stack, &sq, '"') == 0; /* the state after the closing quote */
  const sv_tok *sv = v->sv;
  int bounded = room < UINT16_MAX; /* some tokens may not fit */
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    unsigned cls = sv[i].cls;
    if (cls == SV_EOS) {
      out_put(o, i, 1, 0);
      continue;
    }
    /* the common case (a token that stays in the string) without branches: under a maxLength,
     * which tokens fit is not predictable */
    int ok = (cls == SV_STAY) & (sv[i].ncp <= room);
    if (cls == SV_QUOTE)
      ok = sq_ok && sv[i].ncp <= room && sv[i].ncp >= need &&
           sm_walk(m, &sq, v->bytes + v->off[i] + sv[i].q + 1, v->len[i] - sv[i].q - 1);
    else if (cls == SV_WALK)
      ok = sm_walk(m, &t0, v->bytes + v->off[i], v->len[i]);
    n_ok += ok;
    if (!bounded)
      out_put(o, i, ok, 0); /* rarely forbidden: predictable */
    else
      out_put(o, i, ok, 1);
  }
  return n_ok;
}

/* The plain in-string state of a string under a pattern, or of a key that may be additional:
 * the precomputed runs decide what they can. A token without a backslash that stays in the
 * string runs through the automaton (pattern: its bytes; key: once past the key trie, nothing
 * to check), one that closes it does the same up to the quote and walks the rest from after
 * it; other tokens (escapes, a key's bytes that may still spell a property's name) are walked
 * whole. */
JM_INLINE int sm_in_special_string(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  const json_schema *sc = m->sc;
  const ss_lex *l = &m->sl;
  const int key = l->key == 2;
  const regex_dfa *d = key ? NULL : &sc->dfa[sc->nodes[l->node].sub];
  const int32_t *row0 = d ? d->next + (size_t)l->q * (size_t)d->nc : NULL;
  ss_try t0, sq;
  sm_begin(&t0, m);
  /* walk0[c]: tokens starting with c are walked (escapes, quotes, a key's next trie byte) */
  uint8_t walk0[256];
  memset(walk0, 0, sizeof walk0);
  if (key && l->q >= 0) {
    const ss_tnode *tn = &sc->tn[l->q];
    for (int e = 0; e < tn->ne; e++) walk0[sc->ec[tn->e0 + e]] = 1;
  }
  walk0['\\'] = walk0['"'] = 1;
  if (key && l->fl) memset(walk0, 1, sizeof walk0); /* an escape read: a property's name */
  int sq_ok = 0;
  if (key) { /* the state after the closing quote of a key that is none of the properties' */
    ss_copy(&sq, &t0);
    sq.l.q = -1;
    sq_ok = l->fl == 0 && ss_step(sc, m->stack, &sq, '"') == 0;
  }
  const sv_tok *sv = v->sv;
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    unsigned cls = sv[i].cls;
    if (cls == SV_EOS) {
      out_put(o, i, 1, 0);
      continue;
    }
    unsigned f = v->tok[i].first; /* the bytes are read only past the filters */
    int ok;
    if (cls == SV_NEVER || cls == SV_BREAK || (d && !walk0[f] && row0[d->cls[f]] < 0)) {
      ok = 0;
    } else if (cls == SV_WALK || sv[i].bs || walk0[f]) {
      ok = sm_walk(m, &t0, v->bytes + v->off[i], v->len[i]);
    } else {
      const unsigned char *b = v->bytes + v->off[i];
      size_t end = cls == SV_QUOTE ? sv[i].q : v->len[i];
      ok = 1;
      if (d) {
        int32_t q = row0[d->cls[f]];
        for (size_t k = 1; k < end && ok; k++) {
          q = d->next[(size_t)q * (size_t)d->nc + d->cls[b[k]]];
          ok = q >= 0;
        }
        /* within maxLength: a token's code points, then the fewest the automaton still needs */
        uint32_t room = sc->nodes[l->node].b - l->x;
        ok = ok && sv[i].ncp <= room && d->dist[q] <= room - sv[i].ncp;
        if (ok && cls == SV_QUOTE) {
          ss_copy(&sq, &t0);
          sq.l.q = q;
          sq.l.x = UINT32_MAX / 2; /* the automaton counted the code points */
          sq.l.mode = SM_STR;
          ok = ss_step(sc, m->stack, &sq, '"') == 0 &&
               sm_walk(m, &sq, b + end + 1, v->len[i] - end - 1);
        }
      } else if (cls == SV_QUOTE) {
        ok = sq_ok && sm_walk(m, &sq, b + end + 1, v->len[i] - end - 1);
      }
    }
    n_ok += ok;
    out_put(o, i, ok, 1);
  }
  return n_ok;
}

/* Inside a string's escape or UTF-8 sequence, or a literal (a key, an enum value) that may take
 * whitespace: the first byte filters, then (when few first bytes pass) the second, and the rest
 * is walked. */
JM_INLINE int sm_first_byte(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  ss_try t0;
  sm_begin(&t0, m);
  uint8_t ok0[256];
  int n0 = 0;
  for (unsigned c = 0; c < 256; c++) {
    ok0[c] = (uint8_t)sm_try(m, &t0, c);
    n0 += ok0[c];
  }
  /* ok1[c]: the second bytes (and 256: none) the state takes after first byte c; only for the
   * first bytes that pass, and only when they are few (each costs 256 steps) */
  uint64_t ok1[256][5];
  int two = n0 <= 24;
  if (two) {
    for (unsigned c = 0; c < 256; c++) {
      memset(ok1[c], 0, sizeof ok1[c]);
      if (!ok0[c]) continue;
      ss_try t1;
      ss_copy(&t1, &t0);
      ss_step(m->sc, m->stack, &t1, c);
      for (unsigned c2 = 0; c2 < 256; c2++)
        if (sm_try(m, &t1, c2)) ok1[c][c2 / 64] |= (uint64_t)1 << (c2 % 64);
      ok1[c][4] = 1;
    }
  }
  const uint16_t *second = v->second;
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    unsigned f = t->first, s2 = second[i];
    /* computed without branches: the tokens that pass are few and scattered */
    int pass = two ? (int)((ok1[f][s2 / 64] >> (s2 % 64)) & 1) : ok0[f];
    pass &= t->flags == 0;
    int ok = pass && sm_walk(m, &t0, v->bytes + v->off[i], v->len[i]);
    n_ok += ok;
    out_put(o, i, ok || (t->flags & TOK_EOS), 0);
  }
  return n_ok;
}

/* Elsewhere: the byte after the leading whitespace filters (as jm_outside), the rest is walked.
 * Valid where whitespace is either refused or leads to a mode that keeps taking it. */
JM_INLINE int sm_outside(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  uint8_t ok[2][257];
  ss_try t0, s1;
  sm_begin(&t0, m);
  ss_copy(&s1, &t0);
  int ws_ok = ss_step(m->sc, m->stack, &s1, ' ') == 0;
  for (unsigned c = 0; c < 256; c++) {
    ok[0][c] = (uint8_t)sm_try(m, &t0, c);
    ok[1][c] = (uint8_t)(ws_ok && sm_try(m, &s1, c));
  }
  ok[0][256] = 0;
  ok[1][256] = (uint8_t)ws_ok;
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    int pass = !t->flags && t->lead_ws <= JSON_MASK_MAX_WS && ok[t->lead_ws != 0][t->key] &&
               sm_walk(m, &t0, v->bytes + v->off[i], v->len[i]);
    n_ok += pass;
    out_put(o, i, pass || (t->flags & TOK_EOS), 0);
  }
  return n_ok;
}

/* trie node x has a whitespace edge */
static int sm_trie_ws(const json_schema *sc, uint32_t x) {
  return ss_child(sc, (int32_t)x, ' ') >= 0 || ss_child(sc, (int32_t)x, '\t') >= 0 ||
         ss_child(sc, (int32_t)x, '\n') >= 0 || ss_child(sc, (int32_t)x, '\r') >= 0;
}

JM_INLINE int sm_compute(const json_mask *m, jm_out *o, int n) {
  uint8_t mode = m->sl.mode;
  /* strings under a pattern and keys that may be additional: each token walked */
  if (mode == SM_STR)
    return m->sl.key != 2 && m->sc->nodes[m->sl.node].sub < 0 ? sm_in_string(m, o, n)
                                                              : sm_in_special_string(m, o, n);
  if (mode >= SM_STR || ((mode == SM_KEY || mode == SM_ENUM) && sm_trie_ws(m->sc, m->sl.x)))
    return sm_first_byte(m, o, n);
  return sm_outside(m, o, n);
}

/* 1 when token i's bytes from offset skip on, read from state *from, keep the text a prefix. */
static inline int jm_walk(const json_vocab *v, const json_state *from, int i, size_t skip) {
  json_state t = *from;
  return js_feed(&t, v->bytes + v->off[i] + skip, v->len[i] - skip) == 0;
}

/* The object is complete, or the recognizer dead: every non-eos token is forbidden. */
JM_INLINE void jm_only_eos(const json_vocab *v, jm_out *o, int n) {
  if (!o->to_bits) {
    for (int i = 0; i < n; i++)
      if (!(v->tok[i].flags & TOK_EOS)) o->logits[i] = -INFINITY;
    return;
  }
  memset(o->bits, 0, ((size_t)n + 63) / 64 * sizeof *o->bits);
  for (int k = 0; k < v->n_eos; k++)
    if (v->eos[k] < n) o->bits[v->eos[k] >> 6] |= (uint64_t)1 << (v->eos[k] & 63);
  if (n & 63) o->acc = o->bits[n >> 6]; /* out_end stores the last word from acc */
}

/* The plain in-string state: the precomputed runs decide, quotes are walked from after them. */
JM_INLINE int jm_in_string(const json_vocab *v, const json_state *s, jm_out *o, int n) {
  json_state sq = *s;
  js_step(&sq, '"'); /* the state after the closing quote (a quote always closes here) */
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    int ok;
    if (t->flags) {
      out_put(o, i, t->flags & TOK_EOS, 0);
      continue;
    } else if (t->str == STR_STAY) {
      ok = 1;
    } else if (t->str == STR_BREAK) {
      ok = 0;
    } else if (t->str == STR_QUOTE) {
      ok = jm_walk(v, &sq, i, (size_t)t->quote + 1);
    } else {
      ok = jm_walk(v, s, i, 0);
    }
    n_ok += ok;
    out_put(o, i, ok, 0);
  }
  return n_ok;
}

/* In an escape, \u or a UTF-8 sequence: the first byte filters, the rest is walked. */
JM_INLINE int jm_in_string_seq(const json_vocab *v, const json_state *s, jm_out *o, int n) {
  uint8_t ok0[256];
  for (unsigned c = 0; c < 256; c++) {
    json_state t = *s;
    ok0[c] = js_step(&t, c) == 0;
  }
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    int ok = !t->flags && ok0[t->first] && jm_walk(v, s, i, 0);
    n_ok += ok;
    out_put(o, i, ok || (t->flags & TOK_EOS), 0);
  }
  return n_ok;
}

/* Outside strings: the byte after the leading whitespace filters, the rest is walked. ok[0][c]:
 * the state takes c directly; ok[1][c]: it takes c after whitespace (whitespace keeps the mode
 * it leads to, so one space stands for any run; the run's length is left to the walk);
 * ok[1][256]: it takes whitespace at all (for whitespace-only tokens). */
JM_INLINE int jm_outside(const json_vocab *v, const json_state *s, jm_out *o, int n) {
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
    int pass = !t->flags && t->lead_ws <= JSON_MASK_MAX_WS && ok[t->lead_ws != 0][t->key] &&
               jm_walk(v, s, i, 0);
    n_ok += pass;
    out_put(o, i, pass || (t->flags & TOK_EOS), 0);
  }
  return n_ok;
}

/* ---- the tool-call grammar ------------------------------------------------------------- */

/* The lowest tool whose prefix literal agrees with tool k's on its first pos bytes and has byte
 * c at pos (every tool when pos is 0), or -1. */
static int tg_match(const json_schema *g, int k, int32_t pos, unsigned c) {
  for (int j = 0; j < g->ntools; j++)
    if ((size_t)pos < g->tprelen[j] && (unsigned char)g->tpre[j][pos] == c &&
        (pos == 0 || !memcmp(g->tpre[j], g->tpre[k], (size_t)pos)))
      return j;
  return -1;
}

static const char tx_param[] = "\n<parameter=", tx_fend[] = "\n</function>",
                  tx_pend[] = "</parameter>", tx_cend[] = "</tool_call>";

/* n bytes fed to a copy of *t: 0 when it takes them */
static int tx_try(const json_schema *sc, const ss_frame *bs, const ss_try *t, const char *b,
                  size_t n) {
  ss_try c;
  ss_copy(&c, t);
  return ss_feed(sc, bs, &c, (const unsigned char *)b, n);
}

/* Parameter x's key fed to *t: ',' after an earlier value, the key, '"' before raw text. */
static int tx_key(const json_schema *sc, const ss_frame *bs, ss_try *t, const ss_xparam *x) {
  if (t->l.mode == SM_AFTER && ss_step(sc, bs, t, ',')) return -1;
  if (ss_feed(sc, bs, t, (const unsigned char *)x->key, strlen(x->key))) return -1;
  return x->raw ? ss_step(sc, bs, t, '"') : 0;
}

static int tx_key_ok(const json_schema *sc, const ss_frame *bs, const ss_try *t,
                     const ss_xparam *x) {
  ss_try c;
  ss_copy(&c, t);
  return tx_key(sc, bs, &c, x) == 0;
}

/* The lowest parameter of tool k whose tag agrees with parameter j's on its first pos bytes,
 * has byte c at pos, and whose key *t may take now (any parameter when pos is 0), or -1. */
static int tx_match(const json_schema *g, int k, int j, int32_t pos, unsigned c,
                    const json_schema *sc, const ss_frame *bs, const ss_try *t) {
  const ss_xparam *xs = g->tparams[k];
  for (int i = 0; i < g->tnp[k]; i++)
    if ((size_t)pos < xs[i].len && (unsigned char)xs[i].lit[pos] == c &&
        (pos == 0 || !memcmp(xs[i].lit, xs[j].lit, (size_t)pos)) && tx_key_ok(sc, bs, t, &xs[i]))
      return i;
  return -1;
}

/* The value ends: raw text's closing quote, a number or literal ended by a space; then it must
 * be a whole value of the arguments object. */
static int tx_end(const json_schema *sc, const ss_frame *bs, ss_try *t, int raw) {
  if (raw && ss_step(sc, bs, t, '"')) return -1;
  if (t->l.mode != SM_AFTER && ss_step(sc, bs, t, ' ')) return -1;
  return t->l.mode == SM_AFTER && ss_depth(t) == 1 ? 0 : -1;
}

static int tx_end_ok(const json_schema *sc, const ss_frame *bs, const ss_try *t, int raw) {
  ss_try c;
  ss_copy(&c, t);
  return tx_end(sc, bs, &c, raw) == 0;
}

/* One byte c of a value: raw text is fed as the JSON string content it stands for (escaped as
 * the canonical encoding escapes); JSON text as it is. "</parameter>" and "</tool_call>" never
 * end up in a value. */
static int tx_val_byte(const json_schema *sc, const ss_frame *bs, ss_try *t, tg_st *s, unsigned c) {
  s->bp = c == (unsigned char)tx_pend[s->bp] ? s->bp + 1 : c == '<';
  s->bc = c == (unsigned char)tx_cend[s->bc] ? s->bc + 1 : c == '<';
  if (s->bp == sizeof tx_pend - 1 || s->bc == sizeof tx_cend - 1) return -1;
  if (!s->sub) /* JSON text: it stays inside the value (no ',' or '}' of the object's own) */
    return ss_step(sc, bs, t, c) || ss_depth(t) == 0 ||
                   (ss_depth(t) == 1 &&
                    (t->l.mode == SM_OBJ_KEY || t->l.mode == SM_KEY || t->l.mode == SM_COLON ||
                     (t->l.mode == SM_STR && t->l.key)))
               ? -1
               : 0;
  char e[8];
  size_t n = 2;
  e[0] = '\\';
  switch (c) {
    case 0:
      return -1; /* the parser's text ends at a NUL */
    case '"':
      e[1] = '"';
      break;
    case '\\':
      e[1] = '\\';
      break;
    case '\b':
      e[1] = 'b';
      break;
    case '\f':
      e[1] = 'f';
      break;
    case '\n':
      e[1] = 'n';
      break;
    case '\r':
      e[1] = 'r';
      break;
    case '\t':
      e[1] = 't';
      break;
    default:
      if (c >= 0x20) return ss_step(sc, bs, t, c);
      n = (size_t)snprintf(e, sizeof e, "\\u%04X", c);
  }
  return ss_feed(sc, bs, t, (const unsigned char *)e, n);
}

/* The held newline and the bytes of "</parameter>" after it, fed to the value after all. */
static int tx_flush(const json_schema *sc, const ss_frame *bs, ss_try *t, tg_st *s) {
  int32_t n = s->pos;
  s->nl = 0;
  s->pos = 0;
  if (tx_val_byte(sc, bs, t, s, '\n')) return -1;
  for (int32_t i = 0; i < n; i++)
    if (tx_val_byte(sc, bs, t, s, (unsigned char)tx_pend[i])) return -1;
  return 0;
}

/* 1 when the held bytes (s's) may still go either way: end the value, or be fed to it. */
static int tx_hold_ok(const json_schema *sc, const ss_frame *bs, const ss_try *t, const tg_st *s) {
  if (tx_end_ok(sc, bs, t, s->sub)) return 1;
  ss_try c;
  ss_copy(&c, t);
  tg_st x = *s;
  return tx_flush(sc, bs, &c, &x) == 0;
}

/* One byte of the XML form's arguments (phases TX_*). */
static int tx_step(const json_schema *g, tg_st *s, const json_schema **sc, const ss_frame *bs,
                   ss_try *t, unsigned c, int special) {
  switch (s->ph) {
    case TX_TAG:
      if (s->pos == 2) {
        s->sub = c == 'p' ? 1 : c == '/' ? 2 : 0;
        if (!s->sub) return -1;
        if (s->sub == 2 && tx_try(*sc, bs, t, "}", 1)) return -1;
        if (s->sub == 1) {
          int any = 0;
          for (int i = 0; i < g->tnp[s->k] && !any; i++)
            any = tx_key_ok(*sc, bs, t, &g->tparams[s->k][i]);
          if (!any) return -1;
        }
      }
      {
        const char *lit = s->sub == 2 ? tx_fend : tx_param;
        if (c != (unsigned char)lit[s->pos]) return -1;
        if (lit[++s->pos]) return 0;
      }
      if (s->sub == 2) {
        if (ss_step(*sc, bs, t, '}') || t->l.mode != SM_DONE) return -1;
        s->ph = TG_SUF;
      } else {
        s->ph = TX_NAME;
        s->j = 0;
      }
      s->pos = 0;
      return 0;
    case TX_NAME: {
      int j = tx_match(g, s->k, s->j, s->pos, c, *sc, bs, t);
      if (j < 0) return -1;
      s->j = j;
      const ss_xparam *x = &g->tparams[s->k][j];
      if ((size_t)++s->pos < x->len) return 0;
      if (tx_key(*sc, bs, t, x)) return -1;
      s->ph = TX_VAL;
      s->sub = (uint8_t)x->raw;
      s->nl = s->bp = s->bc = 0;
      s->pos = 0;
      return 0;
    }
    default: /* TX_VAL */
      if (special) return -1;
      if (s->nl) {
        if (c == (unsigned char)tx_pend[s->pos]) {
          if (++s->pos == (int32_t)sizeof tx_pend - 1) {
            if (tx_end(*sc, bs, t, s->sub)) return -1;
            s->ph = TX_TAG;
            s->pos = 0;
            s->sub = 0;
            s->nl = 0;
            return 0;
          }
          return tx_hold_ok(*sc, bs, t, s) ? 0 : -1;
        }
        if (tx_flush(*sc, bs, t, s)) return -1;
      }
      if (c == '\n') {
        s->nl = 1;
        s->pos = 0;
        return tx_hold_ok(*sc, bs, t, s) ? 0 : -1;
      }
      return tx_val_byte(*sc, bs, t, s, c);
  }
}

/* One byte c of the grammar g from *s (the arguments' schema state in *sc, *t over the base
 * stack bs). special: c belongs to a special token, which may only spell literals. 0, or -1
 * when c breaks the text. */
static int tg_step(const json_schema *g, tg_st *s, const json_schema **sc, const ss_frame *bs,
                   ss_try *t, unsigned c, int special) {
  static const char close[] = "</think>";
  static const char close_call[] = "</tool_call>"; /* + 1: "/tool_call>" after a '<' */
  switch (s->ph) {
    case TG_THINK:
      if (c == (unsigned char)close[s->pos]) {
        if (++s->pos == (int32_t)sizeof close - 1) {
          s->ph = TG_GAP;
          s->pos = 0;
          s->ws = 0;
        }
        return 0;
      }
      if (special) return -1;
      s->pos = c == '<';
      return 0;
    case TG_GAP:
      if (g->tmax && s->calls >= g->tmax) return -1;
      if (js_is_ws(c)) {
        if (special || ++s->ws > JSON_MASK_MAX_WS) return -1;
        return 0;
      }
      s->ph = TG_PRE;
      s->pos = 0;
      /* fall through */
    case TG_PRE: {
      int k = tg_match(g, s->k, s->pos, c);
      if (k < 0) return -1;
      s->k = k;
      if ((size_t)++s->pos == g->tprelen[k]) {
        s->ph = g->txml ? TX_TAG : TG_ARGS;
        s->pos = 0;
        s->ws = 0;
        s->sub = 0;
        *sc = g->targs[k];
        memset(&t->l, 0, sizeof t->l);
        t->l.mode = SM_START;
        t->base = 0;
        t->nloc = 0;
        if (g->txml) return ss_step(*sc, bs, t, '{'); /* the object the parameters stand for */
      }
      return 0;
    }
    case TX_TAG:
    case TX_NAME:
    case TX_VAL:
      return tx_step(g, s, sc, bs, t, c, special);
    case TG_ARGS:
      /* never "<tool_call>" or "</tool_call>" inside the arguments: the parser would split
       * the call there (ws: the slash was read) */
      if (s->pos == 1 && !s->ws && c == '/') {
        s->ws = 1;
        s->pos = 2;
      } else if (s->pos > 0 && c == (unsigned char)(s->ws ? close_call : close_call + 1)[s->pos]) {
        if (!(s->ws ? close_call : close_call + 1)[++s->pos]) return -1;
      } else {
        s->pos = c == '<';
        s->ws = 0;
      }
      if (special || ss_step(*sc, bs, t, c)) return -1;
      if (t->l.mode == SM_DONE) {
        s->ph = TG_SUF;
        s->pos = 0;
      }
      return 0;
    default: /* TG_SUF */
      if (c != (unsigned char)g->tsuf[s->pos]) return -1;
      if (!g->tsuf[++s->pos]) {
        s->ph = TG_GAP;
        s->pos = 0;
        s->ws = 0;
        s->calls++;
      }
      return 0;
  }
}

/* One byte of tool_grammar_single's text: never refused, only followed (the think block, then
 * the first call block). */
static void tf_step(tg_st *s, unsigned c) {
  static const char close[] = "</think>", open_call[] = "<tool_call>",
                    close_call[] = "</tool_call>";
  const char *lit = s->ph == TG_THINK ? close : s->ph == TF_TEXT ? open_call : close_call;
  if (s->ph == TF_DONE) return;
  if (c != (unsigned char)lit[s->pos]) {
    s->pos = c == '<';
    return;
  }
  if (lit[++s->pos]) return;
  s->ph = s->ph == TG_THINK ? TF_TEXT : s->ph == TF_TEXT ? TF_CALL : TF_DONE;
  s->pos = 0;
}

/* Bytes b[n] from m's state: 0 and the new state in *s, *sc, *t, or -1. */
static int tg_walk(const json_mask *m, tg_st *s, const json_schema **sc, ss_try *t,
                   const unsigned char *b, size_t n, int special) {
  *s = m->tgs;
  *sc = m->sc;
  sm_begin(t, m);
  for (size_t i = 0; i < n; i++)
    if (tg_step(m->tg, s, sc, m->stack, t, b[i], special)) return -1;
  return 0;
}

/* Feeds b[n] to m's state: 0, or -1 (the state unchanged). */
static int tg_feed(json_mask *m, const unsigned char *b, size_t n, int special) {
  if (m->tg->tfree) {
    if (m->tgs.ph == TF_DONE) return -1;
    for (size_t i = 0; i < n; i++) tf_step(&m->tgs, b[i]);
    return 0;
  }
  tg_st s;
  const json_schema *sc;
  ss_try t;
  if (tg_walk(m, &s, &sc, &t, b, n, special)) return -1;
  m->tgs = s;
  m->sc = sc;
  sm_commit(m, &t);
  return 0;
}

/* Every token walked through the grammar (no precomputed filter: the literals and the short
 * think / arguments texts of a forced call make this a rare, bounded cost). */
static int tg_compute(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  int n_ok = 0;
  for (int i = 0; i < n; i++) {
    const jv_tok *t = &v->tok[i];
    int ok;
    if (t->flags & TOK_EOS)
      ok = 1;
    else if (v->len[i] == 0)
      ok = 0;
    else {
      tg_st s;
      const json_schema *sc;
      ss_try tt;
      ok = tg_walk(m, &s, &sc, &tt, v->bytes + v->off[i], v->len[i], t->flags != 0) == 0;
      n_ok += ok;
    }
    out_put(o, i, ok, 0);
  }
  return n_ok;
}

/* The verdicts on ids 0..n-1 (n at most the vocabulary's size) in m's state, to o. */
JM_INLINE void jm_compute(const json_mask *m, jm_out *o, int n) {
  const json_vocab *v = m->v;
  const json_state *s = &m->s;
  int n_ok = 0;
  if (m->tg && m->tg->tfree) {
    if (m->dead || m->tgs.ph == TF_DONE) {
      jm_only_eos(v, o, n);
    } else { /* any token */
      if (o->to_bits) memset(o->bits, 0xff, ((size_t)n + 63) / 64 * sizeof *o->bits);
      if (o->to_bits && (n & 63)) o->acc = o->bits[n >> 6];
      n_ok = n;
    }
  } else if (m->tg) {
    if (m->dead)
      jm_only_eos(v, o, n);
    else
      n_ok = tg_compute(m, o, n);
  } else if (m->sc) {
    if (m->dead || m->sl.mode == SM_DONE)
      jm_only_eos(v, o, n);
    else
      n_ok = sm_compute(m, o, n);
  } else if (m->dead || s->mode == JS_DONE || s->mode == JS_DEAD)
    jm_only_eos(v, o, n);
  else if (s->mode == JS_STR)
    n_ok = jm_in_string(v, s, o, n);
  else if (js_is_str_mode(s->mode))
    n_ok = jm_in_string_seq(v, s, o, n);
  else
    n_ok = jm_outside(v, s, o, n);
  out_end(o, n);
  /* eos (allowed so far): kept when the object is complete, or when nothing else is left */
  if (n_ok == 0 || json_mask_complete(m)) return;
  for (int k = 0; k < v->n_eos; k++)
    if (v->eos[k] < n) out_forbid(o, v->eos[k]);
}

void json_mask_prepare(json_mask *m, int n_vocab) {
  m->prep = 0;
  /* a bitset too small (json_mask_copy from a mask over a larger vocabulary): apply computes */
  if (n_vocab <= 0 || m->v->n > m->cap) return;
  int n = n_vocab < m->v->n ? n_vocab : m->v->n;
  jm_out o = {1, NULL, m->bits, 0};
  jm_compute(m, &o, n);
  m->prep = n_vocab;
}

/* logits[0..n): -INFINITY where bits has a clear bit, 64 ids at a time */
static void jm_apply_bits(const uint64_t *bits, float *logits, int n) {
  int nw = n / 64;
  for (int w = 0; w < nw; w++) {
    uint64_t b = bits[w];
    float *l = logits + (size_t)w * 64;
    if (b == ~(uint64_t)0) continue;
    if (b == 0) {
      for (int j = 0; j < 64; j++) l[j] = -INFINITY;
      continue;
    }
    for (uint64_t f = ~b; f; f &= f - 1) l[__builtin_ctzll(f)] = -INFINITY;
  }
  for (int i = nw * 64; i < n; i++)
    if (!((bits[nw] >> (i & 63)) & 1)) logits[i] = -INFINITY;
}

void json_mask_apply(const json_mask *m, float *logits, int n_vocab) {
  if (n_vocab <= 0) return;
  int n = n_vocab < m->v->n ? n_vocab : m->v->n;
  for (int i = n; i < n_vocab; i++) logits[i] = -INFINITY;
  if (m->prep == n_vocab) {
    jm_apply_bits(m->bits, logits, n);
    return;
  }
  jm_out o = {0, logits, NULL, 0};
  jm_compute(m, &o, n);
}

void json_mask_advance(json_mask *m, int32_t token) {
  const json_vocab *v = m->v;
  m->prep = 0;
  if (m->dead) return;
  if (token < 0 || token >= v->n) {
    m->dead = 1;
    return;
  }
  const jv_tok *t = &v->tok[token];
  if (t->flags & TOK_EOS) {
    if (!json_mask_complete(m)) m->dead = 1;
    return;
  }
  if (m->tg && m->tg->tfree) { /* any token but after the call */
    if (tg_feed(m, v->bytes + v->off[token], v->len[token], 1)) m->dead = 1;
    return;
  }
  if (m->tg) {
    if (v->len[token] == 0 || tg_feed(m, v->bytes + v->off[token], v->len[token], t->flags != 0))
      m->dead = 1;
    return;
  }
  if (m->sc) {
    if (t->flags || sm_feed(m, v->bytes + v->off[token], v->len[token])) m->dead = 1;
    return;
  }
  json_state s = m->s;
  if (t->flags || js_feed(&s, v->bytes + v->off[token], v->len[token]))
    m->dead = 1;
  else
    m->s = s;
}

int json_mask_feed(json_mask *m, const char *b, size_t n) {
  m->prep = 0;
  if (m->dead) return -1;
  if (!n) return 0;
  const unsigned char *u = (const unsigned char *)b;
  if (m->tg) {
    if (tg_feed(m, u, n, 0)) m->dead = 1;
  } else if (m->sc) {
    if (sm_feed(m, u, n)) m->dead = 1;
  } else {
    json_state s = m->s;
    if (js_feed(&s, u, n))
      m->dead = 1;
    else
      m->s = s;
  }
  return m->dead ? -1 : 0;
}
