/* anthropic_request — turns an Anthropic Messages body (POST /v1/messages, and
 * /v1/messages/count_tokens) into the openai_request the chat route serves, so that batching,
 * the prefix cache, stop strings and sampling behave exactly as for /v1/chat/completions.
 *
 *   Anthropic                              OpenAI chat (then openai_request_parse)
 *   system: str | [text]               ->  {"role":"system"} first
 *   user [text.., tool_result..]       ->  {"role":"tool","tool_call_id"} per result (in order),
 *                                          {"role":"user"} for the text around them
 *   assistant [thinking, text, tool_use]-> {"role":"assistant","reasoning_content","content",
 *                                           "tool_calls":[{id, function:{name, arguments}}]}
 *   tools [{name, description, input_schema}] -> [{"type":"function","function":{..parameters}}]
 *   tool_choice {auto | none}          ->  "auto" | "none"   (any / tool: refused, see below)
 *   thinking {enabled | adaptive | disabled}, absent -> chat_template_kwargs.enable_thinking
 *   stop_sequences, temperature, top_p, top_k, max_tokens, stream -> the same-named fields
 *   output_config.format / output_format json_schema -> response_format json_schema (the
 *                                          JSON-schema mask; adaptive thinking then off)
 *
 * Refused with a 400 naming the field: any field that would change the output and is not
 * served (tool_choice any / tool until tool calls can be forced by constrained decoding,
 * disable_parallel_tool_use, server tools, image / document blocks, redacted thinking, MCP
 * servers, containers, an effort other than the default "high", context_management edits that
 * would clear context), and, as Anthropic does, any unknown top-level field ("Extra inputs are
 * not permitted"). Accepted without effect: metadata, service_tier, cache_control on blocks
 * (the prefix cache needs no marks), output_config.effort "high", context_management's
 * clear_thinking with keep "all" (both as Claude Code sends them), the anthropic-version and
 * anthropic-beta headers.
 * Pure: no globals, no I/O; safe from any thread. */
#ifndef DS_ANTHROPIC_REQUEST_H
#define DS_ANTHROPIC_REQUEST_H
#include <jansson.h>
#include <stddef.h>

#include "server/openai_request.h"

typedef enum {
  ANTHROPIC_REQUEST_MESSAGES,     /* POST /v1/messages: max_tokens required */
  ANTHROPIC_REQUEST_COUNT_TOKENS, /* POST /v1/messages/count_tokens: the prompt only */
} anthropic_request_kind;

/* Translates a body of `len` bytes into the OpenAI chat body it means (a new reference), or
 * returns NULL with a 400 (or a 500 on out of memory) in *err. Exposed for tests. */
json_t *anthropic_request_translate(anthropic_request_kind kind, const json_t *body,
                                    openai_error *err);

/* The translation as the text of an OpenAI chat body (malloc'd; the caller frees it), or NULL
 * with *err. The server serves it as it serves /v1/chat/completions. */
char *anthropic_request_to_chat(anthropic_request_kind kind, const char *body, size_t len,
                                openai_error *err);

/* Parses and checks a body: on success returns 0 with *out filled as openai_request_parse
 * fills it for a chat request (free with openai_request_free); on failure -1 with *err and
 * nothing to free. */
int anthropic_request_parse(anthropic_request_kind kind, const char *body, size_t len,
                            openai_request *out, openai_error *err);

#endif
