/* spec_config — `--speculative-config JSON`, vLLM's speculative decoding settings, checked.
 *
 *   {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
 *    "prompt_lookup_max": b}
 *   {"method": "mtp", "num_speculative_tokens": k}
 *   either with "disable_by_batch_size": n
 *
 * n-gram (prompt lookup) and the checkpoint's MTP head (engine_create refuses "mtp" when the
 * checkpoint has none); draft models are refused with one line, and so is every key this server
 * does not implement (an accepted key is never ignored: the lookup keys with "mtp" too). As in
 * vLLM, prompt_lookup_min / _max default to 5 when both are missing, and one given stands for
 * the other. */
#ifndef DS_SPEC_CONFIG_H
#define DS_SPEC_CONFIG_H
#include <stddef.h>

#define SPEC_MAX_TOKENS 16 /* num_speculative_tokens at most */

typedef enum { SPEC_METHOD_NONE = 0, SPEC_METHOD_NGRAM = 1, SPEC_METHOD_MTP = 2 } spec_method;

typedef struct spec_config {
  spec_method method; /* SPEC_METHOD_NONE: no speculation (the default) */
  int k;              /* num_speculative_tokens: drafted tokens per step, 1..SPEC_MAX_TOKENS */
  int lookup_min;     /* prompt_lookup_min: the shortest n-gram matched, >= 1 (ngram) */
  int lookup_max;     /* prompt_lookup_max: the longest, >= lookup_min (ngram) */
  /* disable_by_batch_size: drafts only in steps of at most this many decode sequences (vLLM's
   * rule); 0, the default: whether a step drafts is decided by measurement (spec_policy) */
  int disable_by_batch_size;
} spec_config;

/* Parses the flag's JSON object into *out (SPEC_METHOD_NONE for "{}" or "null", as vLLM).
 * Returns 0, or -1 with one line in err (not JSON, an unknown key, a value out of range, a
 * method not implemented). */
int spec_config_parse(const char *json, spec_config *out, char *err, size_t errlen);

#endif
