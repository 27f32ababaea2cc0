/* openai_stream — the reasoning / content / tool-call deltas of a streamed chat completion.
 *
 * The non-streamed answer is chat_parse(full text). To make the stream say exactly the same
 * thing, each step computes from the text seen so far the parts that can no longer change and
 * sends only what extends what was already sent:
 *
 *   start       leading whitespace, then a "<think>" opened by the model (Qwen3) or not; while
 *               the text could still become "<think>" nothing is decided (nothing is sent)
 *   reasoning   (the model's <think>, or the prompt left one open) the text up to "</think>",
 *               leading newlines stripped as chat_parse strips them; trailing newlines and a
 *               partial "</think>" held back until what follows shows whether they stay
 *   content     after "</think>" and its newlines (or the whole text when there is no
 *               reasoning) up to chat_parse_safe_prefix — the first "<tool_call>" / "<think>"
 *               / "</think>", complete or cut — trailing whitespace held back (chat_parse drops
 *               whitespace before a tool call)
 *   final       chat_parse(text) -> the rest of reasoning and content in one delta, then each
 *               tool call the way OpenAI streams them: a delta with index, id, type and
 *               function {name, arguments ""}, then a delta with index and the arguments.
 *
 * So streamed reasoning + content always concatenate to the non-streamed fields, with one
 * exception no stream can avoid: a text that neither opens "<think>" nor follows a prompt that
 * left it open, and later holds a bare "</think>" — chat_parse then calls the text before it
 * reasoning, after it has been streamed as content.
 *
 * Owner of everything inside: the openai_stream. */
#ifndef DS_OPENAI_STREAM_H
#define DS_OPENAI_STREAM_H
#include <jansson.h>
#include <stddef.h>

#include "base/strbuf.h"

typedef struct openai_stream {
  int thinking_open;     /* the prompt ended inside <think> */
  const json_t *tools;   /* the request's tools (borrowed), NULL when none */
  strbuf sent_reasoning; /* everything sent so far */
  strbuf sent_content;
  int n_tool_calls; /* tool calls in the final parse */
} openai_stream;

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools);
void openai_stream_free(openai_stream *s);

/* Computes what to send for text[0, len). final: the generation is over (the whole text).
 * On success *deltas is NULL (nothing new) or a new JSON array of OpenAI delta objects to send
 * in order, one chunk each: first (when there is new text) one with "reasoning_content" and /
 * or "content", then, on the final call, two per tool call:
 *   {"tool_calls":[{"index":i,"id":..,"type":"function","function":{"name":..,"arguments":""}}]}
 *   {"tool_calls":[{"index":i,"function":{"arguments":"{...}"}}]}   (left out when "")
 * Returns 0, or -1 on out of memory. */
int openai_stream_deltas(openai_stream *s, const char *text, size_t len, int final,
                         json_t **deltas);

/* True when `rendered` (a prompt) ends inside an open <think> block. */
int openai_stream_prompt_thinking_open(const char *rendered, size_t len);

#endif
