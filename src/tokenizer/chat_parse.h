/* chat_parse — splits a generated assistant text into reasoning, content and tool calls, for
 * both Qwen families: Qwen3 / Qwen3-Next JSON calls
 *   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 * and Qwen3.5 / 3.6 XML calls
 *   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * Reasoning is the text before </think> (a leading <think> removed) when the prompt left a
 * think block open or the text opens one. One incremental parser (chat_parse_stream) does
 * the work: chat_parse is it fed the whole text, and a stream fed piece by piece emits parts
 * that concatenate to exactly that. */
#ifndef DS_CHAT_PARSE_H
#define DS_CHAT_PARSE_H
#include <jansson.h>
#include <stddef.h>

#include "base/strbuf.h"

typedef struct chat_parsed {
  char *reasoning_content; /* NULL when none (malloc'd) */
  char *content;           /* may be "" (malloc'd) */
  json_t *tool_calls;      /* NULL or an OpenAI tool_calls array
                              [{"id","type":"function","function":{"name","arguments": string}}] */
} chat_parsed;

/* Parses `text`. thinking_open: the prompt ended inside an open <think> block (generation
 * prompt of a thinking template), so text up to </think> is reasoning. tools_json: the
 * request's `tools` (to type XML parameter values: numbers/bools/objects per the schema; NULL
 * = everything a string unless it parses as JSON). Malformed calls are left in content.
 * Returns 0, or -1 on out of memory. */
int chat_parse(const char *text, int thinking_open, const json_t *tools_json, chat_parsed *out);
void chat_parsed_free(chat_parsed *p);

/* Details of chat_parse:
 * - reasoning: with thinking_open, or a text that starts (after whitespace) with <think>, the
 *   text before the first </think> is reasoning, newlines trimmed at both ends (NULL when
 *   empty); a block that never closes makes all of the text reasoning and content "".
 *   Content is what follows </think>, leading newlines removed. Any other text is content
 *   throughout, a "</think>" in it included (a stream has sent its start as content by then).
 * - tool calls: JSON bodies need a non-empty string "name" and an object (or string)
 *   "arguments" ("parameters" accepted); XML bodies need <function=NAME> ... </function> with
 *   <parameter=ARG>\nVALUE\n</parameter> entries (one newline trimmed at each end of VALUE).
 *   XML values are typed from tools_json (function.parameters.properties[ARG].type): "string"
 *   keeps the text; integer/number/boolean/object/array/null take the value parsed as JSON
 *   (also True/False/None) and fall back to the text. "arguments" is returned as
 *   chat_template_tojson text (a JSON-string arguments is returned as given).
 * - content keeps everything else; whitespace around parsed calls is dropped. A last block
 *   without </tool_call> counts when its body parses. */

/* Writes a tool call id into buf (NUL-terminated, at most buflen bytes). */
typedef void (*chat_parse_id_fn)(void *ctx, char *buf, size_t buflen);

/* The default id generator: "call_" + 24 random hex digits (getrandom). Thread-safe. */
void chat_parse_random_id(void *ctx, char *buf, size_t buflen);

/* chat_parse with an injectable id generator (NULL = chat_parse_random_id); tests pass a
 * deterministic one. Same results and failures as chat_parse. */
int chat_parse_ex(const char *text, int thinking_open, const json_t *tools_json,
                  chat_parse_id_fn id_fn, void *id_ctx, chat_parsed *out);

/* The incremental parser. Feed the generated text in pieces of any size; each call appends
 * what became certain to *out: reasoning bytes, content bytes, and finished tool calls (to
 * out->calls, created on first need). After chat_parse_stream_finish, out's reasoning and
 * content concatenate (over all calls) to chat_parse's reasoning_content and content of the
 * whole text, and out->calls holds its tool_calls (ids from id_fn, NULL = random), whatever
 * the pieces. Bytes from a NUL on are ignored (chat_parse reads a C string). The parser holds
 * back only what later bytes can change: a partial tag, whitespace that a call would drop,
 * newlines that "</think>" would trim, an unfinished call block. Work is linear in the text.
 * tools_json is borrowed for the parser's life. _feed and _finish return 0, or -1 on out of
 * memory (out then holds what was emitted before). Owner: the caller of _new. */
typedef struct chat_parse_stream chat_parse_stream;
typedef struct chat_parse_out {
  strbuf reasoning; /* reasoning bytes emitted (owner: the caller) */
  strbuf content;   /* content bytes emitted */
  json_t *calls;    /* NULL or the tool calls emitted, in the OpenAI shape of chat_parsed */
} chat_parse_out;

void chat_parse_out_init(chat_parse_out *o);
void chat_parse_out_free(chat_parse_out *o);
/* Returns NULL on out of memory. */
chat_parse_stream *chat_parse_stream_new(int thinking_open, const json_t *tools_json,
                                         chat_parse_id_fn id_fn, void *id_ctx);
void chat_parse_stream_free(chat_parse_stream *p);
int chat_parse_stream_feed(chat_parse_stream *p, const char *text, size_t len, chat_parse_out *out);
/* The text is over: emits what was held back. Further feeds and finishes do nothing. */
int chat_parse_stream_finish(chat_parse_stream *p, chat_parse_out *out);

/* How many leading bytes of the partial generated text `text[0..len)` come before any of the
 * markers "<tool_call>", "</think>", "<think>" — complete, or a prefix of one cut by the end
 * of the text — and never inside a UTF-8 sequence cut by the end of the text (len when
 * there is none). A check of text that is to hold no marker (the fuzzer uses it). */
size_t chat_parse_safe_prefix(const char *text, size_t len);

#endif
