/* sampler — turns one row of logits into a token, per request: greedy, temperature, top-k,
 * top-p, min-p, repetition / presence / frequency penalties, and a seeded per-request RNG
 * (the same seed gives the same tokens, alone or batched). */
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H
#include <stddef.h>
#include <stdint.h>

#define SAMPLER_MAX_STOP_IDS 64

typedef struct sampling_params {
  float temperature;        /* 0: greedy (default 1.0 as in OpenAI; callers set it) */
  float top_p;              /* (0, 1], 1 = off */
  int top_k;                /* <= 0: off */
  float min_p;              /* [0, 1], 0 = off */
  float repetition_penalty; /* 1 = off */
  float presence_penalty;   /* 0 = off */
  float frequency_penalty;  /* 0 = off */
  uint64_t seed;
  int has_seed;
  int max_tokens;   /* >= 1 */
  int ignore_eos;
  int32_t stop_ids[SAMPLER_MAX_STOP_IDS]; /* extra stop token ids (besides the model's eos) */
  int n_stop_ids;
  int logprobs;     /* 0: off; else report the sampled token's logprob and top_logprobs */
  int top_logprobs; /* 0..20 */
} sampling_params;

void sampling_params_default(sampling_params *p);
/* Returns 0, or -1 with err when a value is out of range (NaN, top_p > 1, ...). */
int sampling_params_validate(const sampling_params *p, char *err, size_t errlen);

#endif
