/* openai_stream — the reasoning / content / tool-call deltas of a streamed chat completion.
 *
 * The non-streamed answer is chat_parse(full text). To make the stream say exactly the same
 * thing, each step parses the text seen so far (minus what could still change: a partial
 * "</think>" or "<tool_call>" at the end, trailing whitespace, everything from the first
 * "<tool_call>" after the reasoning on) and sends only what extends what was already sent:
 *
 *   text so far         "<think>abc</thi"       -> reasoning "abc"      (tag held back)
 *                       "<think>abc</think>\n\nHi"  -> content "Hi"  (whatever chat_parse says)
 *   final               chat_parse(text) -> the rest of reasoning and content, then all tool
 *                       calls in one delta (index, id, type, function {name, arguments}).
 *
 * Owner of everything inside: the openai_stream. */
#ifndef DS_OPENAI_STREAM_H
#define DS_OPENAI_STREAM_H
#include <jansson.h>
#include <stddef.h>

#include "server/srvbuf.h"

typedef struct openai_stream {
  int thinking_open;     /* the prompt ended inside <think> */
  const json_t *tools;   /* the request's tools (borrowed), NULL when none */
  srvbuf sent_reasoning; /* everything sent so far */
  srvbuf sent_content;
  int n_tool_calls;      /* tool calls in the final parse */
} openai_stream;

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools);
void openai_stream_free(openai_stream *s);

/* Computes what to send for text[0, len). final: the generation is over (the whole text).
 * On success *delta is NULL (nothing new) or a new OpenAI delta object with any of
 * "reasoning_content", "content", "tool_calls". Returns 0, or -1 on out of memory. */
int openai_stream_delta(openai_stream *s, const char *text, size_t len, int final, json_t **delta);

/* True when `rendered` (a prompt) ends inside an open <think> block. */
int openai_stream_prompt_thinking_open(const char *rendered, size_t len);

#endif
