/* responses_request — turns the body of an OpenAI Responses request (POST /v1/responses) into
 * the body of the chat-completions request that means the same, so that one parser
 * (openai_request_parse) and one generation path serve both APIs: batching, the prefix cache,
 * sampling and structured output cannot differ between them.
 *
 *   Responses                              chat completions
 *   instructions                    -->    a first {"role":"system"} message
 *   input: "text"                   -->    [{"role":"user","content":"text"}]
 *   input items:
 *     message {role, content parts} -->    {"role", "content": the parts' texts joined}
 *     reasoning {content | summary} -->    "reasoning_content" of the next assistant message
 *     function_call {call_id,...}   -->    "tool_calls" of an assistant message
 *     function_call_output          -->    {"role":"tool","tool_call_id","content"}
 *   tools [{type,name,parameters}]  -->    [{"type":"function","function":{name,parameters}}]
 *   tool_choice auto | none         -->    tool_choice
 *   text.format                     -->    response_format
 *   max_output_tokens               -->    max_completion_tokens
 *   reasoning.effort                -->    chat_template_kwargs.enable_thinking
 *                                          ("none" / "minimal": off; low..high: on)
 *
 * The server keeps no responses, so what needs stored state is refused with a 400:
 * store: true, previous_response_id, background, conversation, item_reference items. Until
 * tool calls are constrained in decoding, tool_choice "required" and a named function are
 * refused too (rather than accepted and not honoured).
 *
 * Pure: no globals, no I/O; safe from any thread. */
#ifndef DS_RESPONSES_REQUEST_H
#define DS_RESPONSES_REQUEST_H
#include <jansson.h>
#include <stddef.h>

#include "server/openai_request.h"

typedef struct responses_request {
  json_t *chat; /* the chat-completions body (owned) */
  json_t *echo; /* the request fields a response object repeats: instructions, tools (in the
                   Responses shape), tool_choice, parallel_tool_calls, temperature, top_p,
                   max_output_tokens, text, reasoning, metadata, user, store, truncation (owned) */
  int stream;
  int parallel_tool_calls; /* default 1; 0: only the first function call is returned */
  int encrypted_reasoning; /* include "reasoning.encrypted_content": reasoning items carry their
                            * text as encrypted_content (opaque to the client, which sends it
                            * back in a later input: the server keeps no state) */
} responses_request;

/* Parses and translates a request body of `len` bytes. Returns 0 with *out filled (free with
 * responses_request_free), or -1 with *err (out is then empty). */
int responses_request_parse(const char *body, size_t len, responses_request *out,
                            openai_error *err);
void responses_request_free(responses_request *r);

/* Renames the param of an error that openai_request_parse gave for the translated body to the
 * Responses field it came from ("messages[..]" -> "input", "max_completion_tokens" ->
 * "max_output_tokens", "response_format" -> "text.format", ...). */
void responses_request_error_param(openai_error *e);

#endif
