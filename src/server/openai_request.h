/* openai_request — turns the JSON body of an OpenAI / vLLM request into a checked C struct.
 *
 * Everything that can be checked without the model is checked here, with an OpenAI error
 * (HTTP status, type, param, one-line message): invalid JSON, wrong types, missing fields,
 * unknown roles, out-of-range sampling values, n != 1, malformed tools / tool_choice.
 * What needs the model (served name, vocabulary range, context length) is the server's.
 *
 * For chat requests the parser builds `render`, the object chat_template_render expects:
 *   { "messages": [...normalised: content parts joined into strings, developer -> system],
 *     "tools": [...]            (left out when tool_choice is "none"),
 *     "chat_template_kwargs": {...} }
 * Pure: no globals, no I/O; safe from any thread. */
#ifndef DS_OPENAI_REQUEST_H
#define DS_OPENAI_REQUEST_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "sampler/json_schema.h"
#include "sampler/sampler.h"

typedef enum { OPENAI_KIND_CHAT, OPENAI_KIND_COMPLETION } openai_kind;

typedef enum {
  OPENAI_TOOL_CHOICE_AUTO,
  OPENAI_TOOL_CHOICE_NONE,
  OPENAI_TOOL_CHOICE_REQUIRED,
  OPENAI_TOOL_CHOICE_NAMED,
} openai_tool_choice;

/* An error that reaches the client as {"error": {"message","type","param","code"}}. */
typedef struct openai_error {
  int status;       /* HTTP status */
  const char *type; /* "invalid_request_error", "not_found_error", ... (static string) */
  const char *code; /* NULL or a static short code */
  char param[64];   /* "" when none */
  char message[400];
} openai_error;

/* Fills e and returns -1 (so that `return openai_error_set(...)` reads as a failure). */
int openai_error_set(openai_error *e, int status, const char *type, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define OPENAI_MAX_STOP 16
#define OPENAI_MAX_LOGPROBS 20
#define OPENAI_MAX_N 64 /* choices per request */
/* completions' prompts per request, and their choices (prompts x n) at most */
#define OPENAI_MAX_PROMPTS 256
#define OPENAI_MAX_CHOICES 256
/* n x max_tokens x top_logprobs (top_logprobs 0 counting 1) with logprobs on: the logprob
 * entries one response may carry (about 70 bytes of JSON each). */
#define OPENAI_MAX_LOGPROB_ENTRIES (1 << 20)
/* JSON values (arrays, objects, keys, scalars) in one request body, at most: its jansson tree
 * stays under ~40 MiB (a token-id prompt of a 262,144-token context is a quarter of it); a
 * smaller body may hold 16384 + one per 4 bytes (openai_request_parse's 400 says so). */
#define OPENAI_MAX_JSON_VALUES (1 << 20)
/* Bodies of at least this many bytes hand their memory back to the system once freed. */
#define OPENAI_TRIM_BYTES (1 << 20)

/* One prompt of a completions request: text, or token ids. */
typedef struct openai_prompt {
  char *text; /* malloc'd UTF-8, or NULL */
  size_t len;
  int32_t *ids; /* malloc'd, or NULL */
  int n_ids;
} openai_prompt;

typedef struct openai_request {
  openai_kind kind;
  char *model; /* NULL when absent */
  int stream;
  int include_usage;    /* stream_options.include_usage */
  int continuous_usage; /* stream_options.continuous_usage_stats (vLLM's): with include_usage,
                           every chunk carries its choice's usage so far */
  /* truncate_prompt_tokens (vLLM's): 0 none; k > 0 keep the prompt's last k tokens; -1 keep
   * the last max_model_len (the server resolves it) */
  int truncate_prompt_tokens;
  int n;              /* choices (1..OPENAI_MAX_N; with a seed, choice i samples with seed + i) */
  sampling_params sp; /* every field set; sp.max_tokens == 0 until the server fills it */
  unsigned sp_set;    /* SAMPLING_SET_* bits of the fields the client gave (not null) */
  int max_tokens;     /* the client's max_tokens / max_completion_tokens, 0 when absent */
  char *stop[OPENAI_MAX_STOP]; /* stop strings (malloc'd) */
  int n_stop;
  int logprobs;     /* chat: logprobs == true; completions: logprobs != null */
  int top_logprobs; /* 0..20 */
  int echo;         /* completions */
  int return_token_ids;
  int skip_special_tokens;        /* default 1 */
  int include_stop_str_in_output; /* default 0 */
  char *cache_salt;               /* NULL when absent */
  int json_object; /* response_format json_object or json_schema: one JSON object (json_mask.h) */
  json_schema *schema; /* response_format json_schema: compiled (owned; NULL for json_object);
                        * with tool_forced, the tool-call grammar (tool_grammar.h) */
  int tool_forced;     /* tool_choice required / named, or auto with parallel_tool_calls false
                        * (tool_grammar_single): json_object set, schema the grammar */

  /* completions: exactly one of prompt / prompt_ids */
  char *prompt; /* malloc'd UTF-8 text */
  size_t prompt_len;
  int32_t *prompt_ids; /* malloc'd */
  int n_prompt_ids;
  /* a list of prompts: the second and later (the first is prompt / prompt_ids above); choice
   * p * n + j is prompt p's j-th, as OpenAI indexes them */
  openai_prompt *more_prompts;
  int n_more_prompts;

  /* chat */
  json_t *render;      /* owned reference; see above */
  const json_t *tools; /* borrowed from render (NULL: none or tool_choice "none") */
  openai_tool_choice tool_choice;
  char *tool_choice_name;    /* OPENAI_TOOL_CHOICE_NAMED */
  int add_generation_prompt; /* default 1 */
} openai_request;

/* Parses and checks a request body of `len` bytes. Returns 0 with *out filled (free with
 * openai_request_free), or -1 with *err (out is then empty: nothing to free). */
int openai_request_parse(openai_kind kind, const char *body, size_t len, openai_request *out,
                         openai_error *err);
void openai_request_free(openai_request *r);

/* A request body as a JSON object, under the same guards as openai_request_parse (a bound on
 * its JSON values, duplicate keys refused). Returns a new reference, or NULL with a 400 in
 * *err. Other APIs' parsers (anthropic_request) read their bodies through it. */
json_t *openai_request_load(const char *body, size_t len, openai_error *err);

/* The /tokenize body (vLLM's shape): either {"prompt": str, "add_special_tokens"} or
 * {"messages": [...], "tools", "add_generation_prompt", "chat_template_kwargs"}.
 * On success exactly one of *prompt (malloc'd) or *render (owned reference) is set. */
int openai_request_parse_tokenize(const char *body, size_t len, char **model, char **prompt,
                                  size_t *prompt_len, json_t **render, int *add_generation_prompt,
                                  openai_error *err);
/* The /detokenize body: {"tokens": [ids]}. *ids is malloc'd (may be empty). */
int openai_request_parse_detokenize(const char *body, size_t len, char **model, int32_t **ids,
                                    int *n_ids, openai_error *err);

/* Checks the logprob entries r asks for with max_tokens completion tokens per choice against
 * OPENAI_MAX_LOGPROB_ENTRIES. Returns 0, or -1 with a 400 in e that states the cap.
 * openai_request_parse checks an explicit max_tokens; the server checks the one it fills in. */
int openai_request_check_logprobs(const openai_request *r, long long max_tokens, openai_error *e);

/* Frees a request body (strbuf_free); after a large one (OPENAI_TRIM_BYTES) also hands the
 * allocator's free memory back to the system (malloc_trim): a body and its parsed tree are
 * freed in the connection thread's arena, which would otherwise keep their pages. */
void openai_request_body_free(strbuf *body);

#endif
