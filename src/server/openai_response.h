/* openai_response — the JSON the OpenAI API answers with: error bodies, usage, ids, chat and
 * completion objects and their streaming chunks, logprob entries; plus the UTF-8 boundary the
 * streaming path cuts text at.
 * Pure: no globals but an id counter; safe from any thread. Returned json_t are new
 * references and returned char* are malloc'd; both belong to the caller. */
#ifndef DS_OPENAI_RESPONSE_H
#define DS_OPENAI_RESPONSE_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "server/openai_request.h"

/* {"error": {"message","type","param","code"}} as a compact JSON string (never NULL: falls
 * back to a static-sized message on out of memory... caller frees). "code" is e->code (a short
 * string such as "invalid_api_key", "model_not_found") or null, the way OpenAI sends it and
 * the official clients type it (string | null); the HTTP status is the response's status
 * alone. (vLLM puts the integer status there; a client reading code as a string would then
 * see a number.) */
char *openai_response_error_body(const openai_error *e);
json_t *openai_response_error_json(const openai_error *e);

/* {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens"}} */
json_t *openai_response_usage(int prompt_tokens, int completion_tokens, int cached_tokens);

/* Writes a fresh unique id "<prefix><24 hex digits>" into buf. */
void openai_response_new_id(char *buf, size_t n, const char *prefix);

/* A JSON string from bytes that may be invalid UTF-8 (a lone piece of a character):
 * invalid bytes become U+FFFD. */
json_t *openai_response_string(const char *s, size_t len);

/* The skeleton {"id","object","created","model","choices":[]}; the caller appends choices. */
json_t *openai_response_object(const char *id, const char *object, long long created,
                               const char *model);

/* Chat logprob entry {"token","logprob","bytes","top_logprobs":[...]}; token strings given as
 * raw bytes (may be partial UTF-8). top_* may be NULL when n_top == 0. */
json_t *openai_response_chat_logprob(const char *tok, size_t tok_len, float logprob,
                                     const char *const *top_toks, const size_t *top_lens,
                                     const float *top_lps, int n_top);

/* Length of the longest prefix of s[0,len) that ends on a UTF-8 character boundary. */
size_t openai_response_utf8_complete(const char *s, size_t len);

#endif
