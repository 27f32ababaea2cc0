/* json_num — a number's bounds and multipleOf, enforced byte by byte (json_schema's minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum, multipleOf).
 *
 * The mask works on scaled integers: the text's value times 10^k (k = 0: integers only; k = 6:
 * numbers with at most 6 fraction digits), written without an exponent. After each byte the
 * set of values the text can still become is a few intervals (a prefix "12" of an integer can
 * become 12, 120..129, 1200..1299, ...; a prefix "0.25" can become 0.25..0.259999), so whether
 * one of them meets lo..hi and holds a multiple of mult is a little arithmetic: the mask takes
 * a byte only when the answer is yes, and the number is never written into a dead end. */
#ifndef DS_JSON_NUM_H
#define DS_JSON_NUM_H
#include <stdint.h>

typedef struct json_num {
  int64_t lo, hi;         /* scaled, inclusive (exclusive bounds already moved inward) */
  uint8_t has_lo, has_hi; /* 0: no such bound */
  uint8_t k;              /* fraction digits: 0 (integers) or 6 */
  uint8_t int_digits;     /* integer digits at most (19 or 9) */
  uint32_t mult;          /* k == 0: the value is a multiple of it; 0: any */
  double dlo, dhi, dmult; /* the schema's own values, for validating enum values */
  uint8_t dlo_ex, dhi_ex, dhas_lo, dhas_hi;
} json_num;

/* Where a number's text stands: json_num_st zeroed is before its first byte. */
typedef struct json_num_st {
  uint64_t v;  /* the magnitude so far, scaled */
  uint8_t ph;  /* phase: json_num.c's NP_* */
  uint8_t nd;  /* integer digits */
  uint8_t nf;  /* fraction digits */
  uint8_t neg; /* after '-' */
} json_num_st;

/* One byte of the number (its first byte included; never the byte after it). Returns 0 when
 * the text can still become a number within q, -1 otherwise (st is then unspecified). */
int json_num_step(const json_num *q, json_num_st *st, unsigned c);
/* 1 when the text read is a complete number within q */
int json_num_final(const json_num *q, const json_num_st *st);
/* 1 when some number is within q */
int json_num_any(const json_num *q);
/* 1 when the JSON number x (an integer when is_int) is within the schema's own values */
int json_num_valid(const json_num *q, double x, int is_int, long long ix);

#endif
