/* spec_ngram — n-gram (prompt lookup) drafts: the tokens that followed an earlier occurrence of
 * the sequence's own last tokens, vLLM's NgramProposer rule.
 *
 *   tokens  [ ... a b c x y z ... a b c ]        suffix "a b c" (n in [min, max])
 *                 ^^^^^ match  ^^^^^ drafts      -> x y z (at most k, fewer at the end)
 *
 * The longest suffix of length n in [lookup_min, lookup_max] that occurs earlier wins; among
 * equally long ones the earliest occurrence. Works for any model: agent and code-edit traffic
 * repeats itself. Pure function of the tokens: a request's drafts never depend on the batch. */
#ifndef DS_SPEC_NGRAM_H
#define DS_SPEC_NGRAM_H
#include <stdint.h>

/* Drafts for the sequence tokens[0, n) into out[0, k): returns how many (0 when no n-gram of
 * length lookup_min..lookup_max matches). Never allocates; O(n x lookup_max). */
int spec_ngram_propose(const int32_t *tokens, int n, int lookup_min, int lookup_max, int k,
                       int32_t *out);

#endif
