/* stop_match — finds a request's stop strings in generated text as it grows, in time linear in
 * the text: an Aho-Corasick automaton over the stop strings, fed each new piece once.
 *
 *   stops "END", "EX"            trie + fail links (-->)
 *
 *     root -E-> E -N-> EN -D-> END*       state after each byte = the longest suffix of the
 *               \                         text that is a prefix of some stop string; its depth
 *                -X-> EX*                 is what a stream must hold back
 *
 * Each byte takes one goto edge plus fail links that the depth pays for (amortized O(1)),
 * then walks the chain of stop strings that end there (at most n_stops). Nothing is ever
 * rescanned, so a long stop string costs its length once, not once per token.
 *
 * Owner of everything inside: whoever called stop_match_new. Not thread-safe (one generation). */
#ifndef DS_STOP_MATCH_H
#define DS_STOP_MATCH_H
#include <stddef.h>

typedef struct stop_match stop_match;

/* Builds the automaton of stops[0, n_stops) (NUL-terminated; empty ones never match; the
 * strings are copied). Returns NULL on out of memory. */
stop_match *stop_match_new(char *const *stops, int n_stops);
void stop_match_free(stop_match *m);

/* Feeds the next n bytes of the text; `base` is how many bytes were fed before (the offset of
 * bytes[0] in the text). Among the stop-string occurrences that end inside these bytes, returns
 * the one that starts first (ties: the stop listed first) as its offset in the text with its
 * length in *match_len; -1 when none ends here. This is the first match a scan of the whole
 * text would find, given that no earlier call returned one. */
long stop_match_feed(stop_match *m, const char *bytes, size_t n, size_t base, size_t *match_len);

/* The number of trailing bytes of the text fed so far that are a proper prefix of some stop
 * string (a stream must not send these yet). Meaningful while no match was returned. */
size_t stop_match_holdback(const stop_match *m);

/* Automaton steps taken so far (edges, fail links and matches looked at): the work bound
 * that tests hold to a constant times the bytes fed. */
unsigned long long stop_match_steps(const stop_match *m);

#endif
