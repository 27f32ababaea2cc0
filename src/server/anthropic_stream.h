/* anthropic_stream — the server-sent events of a streamed Anthropic message.
 *
 * It rides on openai_stream (the same incremental chat_parse the chat route streams with),
 * turning its deltas into content blocks:
 *
 *   message_start (usage: the prompt's tokens), ping
 *   reasoning bytes --> content_block_start thinking, thinking_delta ...
 *   content bytes   --> content_block_start text,     text_delta ...
 *   a tool call     --> content_block_start tool_use {id, name, input:{}}, input_json_delta
 *   (a block is stopped, content_block_stop, when another starts or the message ends)
 *   message_delta {stop_reason, stop_sequence} + usage, message_stop
 *
 * Each event is "event: <type>\ndata: <json>\n\n". The blocks concatenate to
 * anthropic_response_message of the whole text (the text of one kind is one block unless tool
 * calls come between its pieces). Owner of everything inside: the anthropic_stream. */
#ifndef DS_ANTHROPIC_STREAM_H
#define DS_ANTHROPIC_STREAM_H
#include <jansson.h>
#include <stddef.h>

#include "base/strbuf.h"
#include "server/openai_request.h"
#include "server/server_gen.h"

typedef struct anthropic_stream anthropic_stream;

/* id and model are copied; tools is borrowed for the stream's life (chat_parse's tools).
 * Returns NULL on out of memory. */
anthropic_stream *anthropic_stream_new(const char *id, const char *model, int thinking_open,
                                       const json_t *tools);
void anthropic_stream_free(anthropic_stream *s);

/* Appends to out the events for g's text[0, visible) (a text that only grows), message_start
 * first; once g is done, the closing events. Returns 0, or -1 on out of memory. */
int anthropic_stream_events(anthropic_stream *s, const server_gen *g, size_t visible, strbuf *out);

/* Appends "event: error" with anthropic_response_error_json(e). Returns 0, or -1 on out of
 * memory. */
int anthropic_stream_error(strbuf *out, const openai_error *e);

#endif
