/* openai_stream — the reasoning / content / tool-call deltas of a streamed chat completion.
 *
 * The non-streamed answer is chat_parse(full text); chat_parse is the incremental parser
 * chat_parse_stream fed the whole text at once. A stream feeds that same parser each new
 * piece of the text and sends what it emits:
 *
 *   text pieces --> chat_parse_stream --> reasoning bytes --+--> {"reasoning_content": ..}
 *                   (holds back partial                     |    {"content": ..}
 *                    tags, whitespace,    content bytes ----+    (a UTF-8 character cut at
 *                    open call blocks)                           the end waits for the rest)
 *                                     --> tool calls ----------> {"tool_calls":[head]}, then
 *                                                                {"tool_calls":[arguments]}
 *
 * So the streamed reasoning, content and tool calls always concatenate to the non-streamed
 * fields, whatever the text and wherever it is cut. Each step costs the new bytes, not the
 * text so far.
 *
 * Owner of everything inside: the openai_stream. */
#ifndef DS_OPENAI_STREAM_H
#define DS_OPENAI_STREAM_H
#include <jansson.h>
#include <stddef.h>

#include "tokenizer/chat_parse.h"

typedef struct openai_stream {
  chat_parse_stream *parser; /* owned; NULL when out of memory at init */
  chat_parse_out out;        /* emitted by the parser, not yet sent */
  size_t fed;                /* bytes of the text given to the parser */
  int finished;              /* the final call was made */
  int n_tool_calls;          /* tool calls sent */
} openai_stream;

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools);
void openai_stream_free(openai_stream *s);

/* Computes what to send for text[0, len), a text that only grows from call to call (the
 * bytes before the previous len are not read again). final: the generation is over (the whole
 * text). On success *deltas is NULL (nothing new) or a new JSON array of OpenAI delta objects
 * to send in order, one chunk each: first (when there is new text) one with
 * "reasoning_content" and / or "content", then two per tool call finished since the last call:
 *   {"tool_calls":[{"index":i,"id":..,"type":"function","function":{"name":..,"arguments":""}}]}
 *   {"tool_calls":[{"index":i,"function":{"arguments":"{...}"}}]}   (left out when "")
 * Returns 0, or -1 on out of memory. */
int openai_stream_deltas(openai_stream *s, const char *text, size_t len, int final,
                         json_t **deltas);

/* True when `rendered` (a prompt) ends inside an open <think> block. */
int openai_stream_prompt_thinking_open(const char *rendered, size_t len);

#endif
