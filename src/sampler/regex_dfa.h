/* regex_dfa — a regular-expression subset (JSON Schema's `pattern`, ECMA 262 syntax) compiled to
 * a deterministic automaton over the bytes of a string's UTF-8 encoding, for json_schema's
 * pattern and format keywords.
 *
 *   pattern --parse--> tree --Thompson--> NFA over byte ranges --subsets--> DFA
 *           --regex_dfa_restrict (bytes, code point counts)--> DFA whose every state is live
 *
 * Semantics are those of a search, as JSON Schema wants (Python's re.search, ECMA's test): a
 * pattern matches a string when it matches a substring, unless it starts with ^ (then the
 * match starts at the start) or ends with $ (it ends at the end). The automaton accepts exactly
 * the strings that contain a match, in a form every common validator agrees on:
 *  - literals (UTF-8 for non-ASCII ones), escapes \. \\ \/ \n \r \t \f \v \0 \xHH \uHHHH, \d \w
 *    \s (ASCII: [0-9], [A-Za-z0-9_], [ \t\n\r\f\v]), classes [a-z0-9_] and [^...] (ASCII
 *    members), '.', groups ( ) and (?: ), alternation |, the quantifiers * + ? {m} {m,} {m,n}
 *    (m, n <= 1000), ^ as the pattern's first byte and $ as its last (not beside a top-level |);
 *  - where ECMA and Python differ, only what both accept is matched: \D \W \S and [^...] holding
 *    one of them match ASCII only (Python's \d is Unicode), '.' matches neither \n \r U+2028
 *    U+2029 (ECMA), and '.' and [^...] match BMP code points only (ECMA without the u flag
 *    counts an astral character as two);
 *  - refused, with a message naming the construct: backreferences (\1, \k<name>), lookaround
 *    ((?= (?! (?<= (?<!), lazy and possessive quantifiers (*? +? ?? {m,n}? and *+), Unicode
 *    property classes (\p \P), word boundaries (\b \B), \c, ^ or $ elsewhere than at the ends,
 *    non-ASCII characters inside [ ], invalid syntax, and automata past the size limit. */
#ifndef DS_REGEX_DFA_H
#define DS_REGEX_DFA_H
#include <stddef.h>
#include <stdint.h>

/* A DFA: state 0 is the start; next[q * nc + cls[c]] is the state after byte c, -1 for none. */
typedef struct regex_dfa {
  int n;  /* states */
  int nc; /* byte classes */
  uint8_t cls[256];
  int32_t *next;  /* [n * nc], owned */
  uint8_t *acc;   /* [n], owned: 1 when the string read so far is accepted */
  uint32_t *dist; /* [n], owned, regex_dfa_restrict's (else NULL): the fewest code points from
                   * the state to an accepted string */
} regex_dfa;

/* Compiles pattern pat[len] (UTF-8) with search semantics into *out (at most max_states
 * states). Returns 0, or -1 with one line in err naming what is not supported or is invalid
 * (e.g. "lookaround '(?=' is not supported") or "out of memory"; *out is then empty. */
int regex_dfa_compile(const char *pat, size_t len, int max_states, regex_dfa *out, char *err,
                      size_t errlen);

/* *out = the part of *in that reads only bytes with ok[c] set, and whose strings are min..max
 * code points long (a code point: a byte that is not 0x80..0xBF; max UINT32_MAX: no maximum),
 * with every state live (some accepted string goes through it), its dist filled, and at most
 * max_states states. The minimum takes a counter in the states (up to min); a maximum too
 * (up to max), so a large one is better left to dist: a prefix of c code points in state q can
 * still end within max iff c + dist[q] <= max. A DFA without any string has n == 0. Returns 0,
 * or -1 with err (too many states, out of memory). in is unchanged. */
int regex_dfa_restrict(const regex_dfa *in, const uint8_t ok[256], uint32_t min, uint32_t max,
                       int max_states, regex_dfa *out, char *err, size_t errlen);

/* *out = the strings both a and b accept (live states only), at most max_states states.
 * Returns 0, or -1 with err. */
int regex_dfa_intersect(const regex_dfa *a, const regex_dfa *b, int max_states, regex_dfa *out,
                        char *err, size_t errlen);

/* *out = the strings a or b accepts (live states only), at most max_states states. Returns 0,
 * or -1 with err. */
int regex_dfa_union(const regex_dfa *a, const regex_dfa *b, int max_states, regex_dfa *out,
                    char *err, size_t errlen);

/* 1 when d accepts the bytes b[n] */
int regex_dfa_match(const regex_dfa *d, const unsigned char *b, size_t n);

void regex_dfa_free(regex_dfa *d); /* frees the tables; NULL or an empty DFA is fine */

#endif
