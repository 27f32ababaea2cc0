/* generation_config — the sampling defaults of a model folder's generation_config.json, read as
 * vLLM reads them (its --generation-config auto): temperature, top_p, top_k, min_p,
 * repetition_penalty, and max_new_tokens as the default max_tokens, for the requests that
 * leave those fields out. Other keys (do_sample, eos_token_id, ...) are no defaults here, and
 * top_k 50 (transformers' own default, which vLLM drops as not set) is not one either. */
#ifndef DS_GENERATION_CONFIG_H
#define DS_GENERATION_CONFIG_H
#include <stddef.h>

#include "sampler/sampler.h"

typedef struct generation_config {
  unsigned has; /* SAMPLING_SET_* bits of the fields the file sets */
  float temperature, top_p, min_p, repetition_penalty;
  int top_k;
  int max_new_tokens;
} generation_config;

/* Reads DIR/generation_config.json into *gc. No such file: 0 with gc->has == 0. A file that is
 * not a JSON object, or a field of the wrong type or out of the sampler's range: -1 with err
 * (null fields count as absent). */
int generation_config_load(const char *dir, generation_config *gc, char *err, size_t errlen);

/* Sets each field of *sp that the file has and `set` (SAMPLING_SET_* bits) does not. */
void generation_config_apply(const generation_config *gc, unsigned set, sampling_params *sp);

/* A request's max_tokens when it gives none: avail (what the context leaves), or the file's
 * max_new_tokens when smaller. */
int generation_config_max_tokens(const generation_config *gc, int avail);

/* "temperature=0.6 top_p=0.95 top_k=20" (the fields it has; "" for none) into buf. */
void generation_config_describe(const generation_config *gc, char *buf, size_t n);

#endif
