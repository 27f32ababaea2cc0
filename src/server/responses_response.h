/* responses_response — the objects of the OpenAI Responses API: the response object, its output
 * items (reasoning, message, function_call) and usage. A generation's text is split by
 * chat_parse (as for chat completions) into reasoning, content and tool calls; they become, in
 * this order,
 *
 *   output: [ {"type":"reasoning", "content":[{"type":"reasoning_text","text"}], "summary":[]}
 *             {"type":"message", "role":"assistant",
 *              "content":[{"type":"output_text","text","annotations":[]}]}
 *             {"type":"function_call", "call_id", "name", "arguments"} ... ]
 *
 * (the reasoning item only when there is reasoning; the message when there is content or
 * nothing else). A stream builds the same items as they come (responses_stream).
 * Pure: no globals but openai_response_new_id's counter; safe from any thread. Returned
 * json_t are new references that belong to the caller. */
#ifndef DS_RESPONSES_RESPONSE_H
#define DS_RESPONSES_RESPONSE_H
#include <jansson.h>
#include <stddef.h>

typedef struct responses_usage {
  int input_tokens, cached_tokens, output_tokens, reasoning_tokens;
} responses_usage;

/* The response object: {"id","object":"response","created_at","status","error":null,
 * "incomplete_details","model","output", "usage"} plus the request's echo fields
 * (responses_request.echo). status: "in_progress", "completed" or "incomplete" (then
 * incomplete_details says {"reason":"max_output_tokens"}). output is taken (NULL: []); u NULL:
 * "usage": null. Returns NULL on out of memory. */
json_t *responses_response_object(const json_t *echo, const char *id, long long created,
                                  const char *model, const char *status, json_t *output,
                                  const responses_usage *u);

/* "completed" for a generation that finished with "stop", "incomplete" for "length". */
const char *responses_response_status(const char *finish);

/* Output items; text is len bytes that may end in a partial UTF-8 character (it becomes
 * U+FFFD). status: "in_progress" or "completed". */
/* encrypted: the reasoning item also carries its text as encrypted_content (include
 * "reasoning.encrypted_content"; the input reads it back). */
json_t *responses_response_reasoning_item(const char *id, const char *text, size_t len,
                                          int encrypted);
json_t *responses_response_message_item(const char *id, const char *text, size_t len,
                                        const char *status);
/* A function_call item from a chat tool call {"id","function":{"name","arguments"}}. */
json_t *responses_response_call_item(const char *id, const json_t *chat_call, const char *status);

/* Writes a fresh item id "<prefix>_<hex>" ("rs", "msg", "fc") into buf. */
void responses_response_item_id(char *buf, size_t n, const char *prefix);

/* The output items of a finished generation from chat_parse's parts (reasoning NULL when none;
 * calls NULL or chat tool calls). parallel 0: only the first call; encrypted: as for
 * responses_response_reasoning_item. NULL on out of memory. */
json_t *responses_response_output(const char *reasoning, const char *content, const json_t *calls,
                                  int parallel, int encrypted);

#endif
