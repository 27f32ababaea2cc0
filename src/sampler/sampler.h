/* sampler — turns one row of logits into a token, per request: greedy, temperature, top-k,
 * top-p, min-p, repetition / presence / frequency penalties, logit biases, and a seeded
 * per-request RNG (the same seed gives the same tokens, alone or batched). */
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H
#include <stddef.h>
#include <stdint.h>

#include "sampler/sample_rule.h"

#define SAMPLER_MAX_STOP_IDS 64
#define SAMPLER_MAX_BIAS 300 /* logit_bias entries per request */

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
  int max_tokens; /* >= 1 */
  int min_tokens; /* 0..max_tokens: no end token (the model's eos unless ignore_eos, and
                     stop_ids) is sampled while the output is shorter (engine_step_ban_ends) */
  int ignore_eos;
  int32_t stop_ids[SAMPLER_MAX_STOP_IDS]; /* extra stop token ids (besides the model's eos) */
  int n_stop_ids;
  int logprobs;     /* 0: off; else report the sampled token's logprob and top_logprobs */
  int top_logprobs; /* 0..20 */
  /* logit_bias: bias[i] (in [-100, 100]) added to token bias_ids[i]'s logit after the
   * penalties, before temperature and truncation; the ids distinct */
  int32_t bias_ids[SAMPLER_MAX_BIAS];
  float bias[SAMPLER_MAX_BIAS];
  int n_bias;
} sampling_params;

/* Sampling fields a request set itself (openai_request.sp_set): defaults from elsewhere
 * (generation_config_apply) fill only the others. */
enum {
  SAMPLING_SET_TEMPERATURE = 1,
  SAMPLING_SET_TOP_P = 2,
  SAMPLING_SET_TOP_K = 4,
  SAMPLING_SET_MIN_P = 8,
  SAMPLING_SET_REPETITION_PENALTY = 16,
  SAMPLING_SET_MAX_TOKENS = 32,
};

void sampling_params_default(sampling_params *p);
/* Returns 0, or -1 with err when a value is out of range (NaN, top_p > 1, ...). */
int sampling_params_validate(const sampling_params *p, char *err, size_t errlen);

/* ---- per-request sampler state --------------------------------------------------------- */

#define SAMPLER_MAX_TOP_LOGPROBS 20

/* One request's sampler: its parameters and its own RNG (xoshiro256**, seeded from
 * p.seed when has_seed, else from the fallback seed the engine gives). One uniform draw per
 * sampled token (none when greedy), so the tokens depend only on the seed and the logits. */
typedef struct sampler {
  sampling_params p;
  uint64_t rng[4];
} sampler;

/* Scratch the caller preallocates once (sampling never allocates): [n_vocab] each unless
 * said. One scratch serves one call at a time: threads sampling rows in parallel each use
 * their own (the results do not depend on which scratch a call used). */
typedef struct sampler_scratch {
  int n_vocab;
  float *probs;    /* [n_vocab] */
  int32_t *idx;    /* [n_vocab] candidate ids */
  int32_t *idx2;   /* [n_vocab] the radix sort's other buffer */
  uint32_t *key;   /* [n_vocab] sort keys (the bits of probs, which are >= 0) */
  uint32_t *key2;  /* [n_vocab] */
  uint32_t *hist;  /* [SAMPLER_HIST] radix histograms */
  int32_t *counts; /* [n_vocab] occurrences in the output; all zero between calls */
  uint8_t *mark;   /* [n_vocab] seen in prompt or output; all zero between calls */
  int32_t *slot;   /* [n_vocab] a token's edit (sampler_device_edits); all -1 between calls */
} sampler_scratch;

/* Buckets of sampler_select_desc's histogram: the top 16 bits of a probability in [0, 1] are at
 * most 0x3f80 (1.0f), so 2^14 buckets hold every one. */
#define SAMPLER_HIST 16384

typedef struct sampler_result {
  int32_t token;
  float logprob; /* log-softmax of the penalised, pre-temperature logits (when p.logprobs) */
  int n_top;
  int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];
  float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
} sampler_result;

void sampler_init(sampler *s, const sampling_params *p, uint64_t fallback_seed);
/* Returns 0, or -1 on out of memory (start-up). */
int sampler_scratch_init(sampler_scratch *w, int n_vocab);
void sampler_scratch_free(sampler_scratch *w);

/* Penalties with vLLM semantics, in place on logits[n_vocab]: repetition_penalty over every
 * token seen in the prompt or the output (positive logits divided, negative multiplied);
 * frequency_penalty * count and presence_penalty over the output tokens only; then the
 * logit_bias entries added (ids outside the vocabulary skipped). */
void sampler_apply_penalties(const sampling_params *p, float *logits, int n_vocab,
                             const int32_t *prompt, int n_prompt, const int32_t *output,
                             int n_output, sampler_scratch *w);

/* The greedy choice: tok = 0; for i in 1..n-1: if x[i] > x[tok]: tok = i. The first maximum
 * (ties to the lowest id); NaN never wins; a NaN at 0 gives 0. Backends' argmax ops
 * (backend.h) follow exactly this rule. */
int32_t sampler_argmax(const float *x, int n);

/* 1 when sampler_sample's token for p is sampler_argmax of the raw logits and nothing else of
 * the result is filled (greedy, no penalties, no logit_bias, no logprobs, no min_tokens): a
 * device argmax may stand in. */
int sampler_is_plain_greedy(const sampling_params *p);

/* Samples one token from logits[n_vocab] (modified in place: penalties): penalties ->
 * greedy argmax (temperature < 1e-5; ties to the lowest id), or sample_rule.h's rule
 * (temperature -> min_p -> top_k -> top_p -> one draw of 53 bits from the RNG) -> logprobs.
 * Fills res and returns the token. Never allocates. Thread-safe across calls with distinct s,
 * logits and w. top-k selects (histogram, then a sort of the few at the cut) and top-p sorts
 * in O(n) (radix); the candidates' order (probability descending, ties to the lowest id) is
 * the rule's. */
int32_t sampler_sample(sampler *s, float *logits, int n_vocab, const int32_t *prompt, int n_prompt,
                       const int32_t *output, int n_output, sampler_scratch *w,
                       sampler_result *res);

/* 1 when a backend's sample op can pick sampler_sample's token: no repetition_penalty (it
 * reaches into the prompt) and no logprobs; frequency / presence penalties, logit_bias and the
 * engine's min_tokens ban travel as the row's edits (sampler_device_edits). */
int sampler_device_ok(const sampling_params *p);
/* 1 when sampler_device_ok and sampler_device_edits gives the row no edits whatever its output
 * (no frequency / presence penalty, no logit_bias; the ban list is the caller's): its words
 * for a step do not depend on the tokens before it. */
int sampler_device_edit_free(const sampling_params *p);

/* The row's edits for a sample op (sample_rule.h): one per distinct token that a penalty, a
 * logit_bias entry or the ban list ban[n_ban] (set to -inf, as the engine does before
 * sampler_sample) touches, in ed[0..) — what sampler_apply_penalties and the ban do to the
 * logits, bit for bit. Returns their number, or -1 when more than cap would be needed. */
int sampler_device_edits(const sampling_params *p, const int32_t *output, int n_output,
                         const int32_t *ban, int n_ban, int n_vocab, sample_rule_edit *ed, int cap,
                         sampler_scratch *w);

/* The row's words for a backend sample op (sample_rule_pack: temperature, top_k, top_p, min_p,
 * the draw's 53 bits, its edits' place), advancing the RNG exactly as sampler_sample would (one
 * draw unless greedy). */
void sampler_device_row(sampler *s, int edit_off, int n_edits, int32_t words[8]);

#endif
