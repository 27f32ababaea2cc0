/* anthropic_response — the JSON the Anthropic Messages API answers with: error bodies, the
 * message object of a finished generation (thinking, text and tool_use blocks, stop_reason,
 * usage), and the pieces the stream (anthropic_stream) shares with it, so that a streamed
 * message accumulates to the non-streamed one.
 *
 * The generated text is split by chat_parse as for /v1/chat/completions: reasoning -> one
 * thinking block (signature ""), content -> one text block (left out when empty), each tool
 * call -> a tool_use block whose id is the call's id with "toolu_" for "call_".
 * Pure: no globals; safe from any thread. Returned json_t are new references and returned
 * char* are malloc'd; both belong to the caller. */
#ifndef DS_ANTHROPIC_RESPONSE_H
#define DS_ANTHROPIC_RESPONSE_H
#include <jansson.h>

#include "server/openai_request.h"
#include "server/server_gen.h"

/* The Anthropic error type of an HTTP status: invalid_request_error (400 and other 4xx),
 * authentication_error (401), permission_error (403), not_found_error (404),
 * request_too_large (413), rate_limit_error (429), overloaded_error (503, 529), api_error
 * (other 5xx). */
const char *anthropic_response_error_type(int status);
/* {"type":"error","error":{"type","message"}}; the body form never returns NULL (a static
 * out-of-memory body, malloc'd, stands in; NULL only when even that fails). */
json_t *anthropic_response_error_json(const openai_error *e);
char *anthropic_response_error_body(const openai_error *e);

/* stop_reason of a done generation: "max_tokens" (length), "stop_sequence" (a stop string
 * matched), "tool_use" (the text holds tool calls), else "end_turn". */
const char *anthropic_response_stop_reason(const server_gen *g, int has_tool_calls);
/* The matched stop string, or null. */
json_t *anthropic_response_stop_sequence(const server_gen *g);
/* {"input_tokens","output_tokens","cache_creation_input_tokens":0,"cache_read_input_tokens"}:
 * input_tokens counts the prompt tokens not read from the prefix cache, as Anthropic's
 * input_tokens leaves out cache reads. */
json_t *anthropic_response_usage(const server_gen *g);

/* {"type":"tool_use","id":"toolu_..","name","input"} from an OpenAI tool call (chat_parse's
 * shape); input is the parsed arguments, {} when they are not a JSON object. */
json_t *anthropic_response_tool_use(const json_t *call);

/* The whole message of a done generation: {"id","type":"message","role":"assistant","model",
 * "content":[...],"stop_reason","stop_sequence","usage"}. thinking_open and tools as for
 * chat_parse. Returns NULL on out of memory. */
json_t *anthropic_response_message(const char *id, const char *model, const server_gen *g,
                                   int thinking_open, const json_t *tools);

#endif
