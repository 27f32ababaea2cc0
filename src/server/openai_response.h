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

#include "base/strbuf.h"
#include "server/openai_request.h"
#include "server/server_gen.h"
#include "tokenizer/tokenizer.h"

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

/* JSON written as text into a body (a non-streamed response with per-token fields: a tree of
 * them would take many times the bytes sent). Each returns 0, or -1 on out of memory (then
 * b->oom is set, as for any strbuf append). */
/* A JSON string of bytes that may be invalid UTF-8 (as openai_response_string). */
int openai_response_put_string(strbuf *b, const char *s, size_t len);
/* A compact dump of j. */
int openai_response_put_json(strbuf *b, const json_t *j);
/* A compact dump of the object obj without its closing brace: the caller appends
 * ",\"key\":value" fields and the "}". */
int openai_response_put_open(strbuf *b, const json_t *obj);
/* [id, ...] */
int openai_response_put_ids(strbuf *b, const int32_t *ids, int n);
/* Chat logprobs of toks[from, to): {"content":[{"token","logprob","bytes","top_logprobs":
 * [{"token","logprob","bytes"}...]}...]}; a token without text is named "token_id:N". tok may
 * be NULL (every token without text). */
int openai_response_put_chat_logprobs(strbuf *b, const tokenizer *tok, const server_gen_token *toks,
                                      int from, int to);
/* Completion logprobs of toks[from, to): {"tokens","token_logprobs","top_logprobs":[{name:
 * logprob}],"text_offset"} with offsets base_off + text_off (two top tokens of the same name:
 * the second is named by its id). */
int openai_response_put_completion_logprobs(strbuf *b, const tokenizer *tok,
                                            const server_gen_token *toks, int from, int to,
                                            size_t base_off);

#endif
