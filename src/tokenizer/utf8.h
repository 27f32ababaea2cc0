/* utf8 — the UTF-8 rules the tokenizer shares: one step of validation, and the
 * lossy conversion that replaces each maximal invalid subpart with U+FFFD (the
 * rule HF's decoders follow through Rust's String::from_utf8_lossy). */
#ifndef DS_UTF8_H
#define DS_UTF8_H
#include <stddef.h>
#include <stdint.h>

enum { UTF8_STEP_VALID = 0, UTF8_STEP_INVALID = 1, UTF8_STEP_INCOMPLETE = 2 };

/* Classifies the sequence that starts at p[0] (n >= 1 bytes available). Sets
 * *len to its length: a whole valid sequence (VALID, *cp set when cp != NULL),
 * the maximal invalid subpart to replace by one U+FFFD (INVALID), or all n
 * bytes when they are a proper prefix of a valid sequence that the input cuts
 * short (INCOMPLETE). */
int utf8_step(const uint8_t *p, size_t n, size_t *len, uint32_t *cp);

/* Returns the offset of the first invalid byte of s[0..n), or n when it is all
 * valid. */
size_t utf8_valid_prefix(const uint8_t *s, size_t n);

/* Appends the lossy conversion of s[0..n) to the buffer *buf (length *blen,
 * capacity *bcap, grown with realloc). When hold_incomplete, a
 * valid-but-unfinished sequence at the end is not converted: the number of
 * bytes consumed is returned (the rest must be kept for later). Returns -1 on
 * out of memory. */
long utf8_lossy_append(const uint8_t *s, size_t n, int hold_incomplete, char **buf, size_t *blen,
                       size_t *bcap);

#endif
