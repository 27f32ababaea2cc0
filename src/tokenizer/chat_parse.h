/* chat_parse — splits a generated assistant text into reasoning, content and tool calls, for
 * both Qwen families: Qwen3 / Qwen3-Next JSON calls
 *   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 * and Qwen3.5 / 3.6 XML calls
 *   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>
 * Reasoning is the text before </think> (a leading <think> removed) when the prompt opened a
 * think block or the text has one. */
#ifndef DS_CHAT_PARSE_H
#define DS_CHAT_PARSE_H
#include <jansson.h>
#include <stddef.h>

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
 * - reasoning: with thinking_open, or a text that starts (after whitespace) with <think> or
 *   holds a </think>, the text before the first </think> is reasoning, newlines trimmed at
 *   both ends (NULL when empty); a block that never closes makes all of the text reasoning
 *   and content "". Content is what follows </think>, leading newlines removed.
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

/* Streaming: how many leading bytes of the partial generated text `text[0..len)` are safe to
 * emit now as plain text (content, or reasoning while inside a think block). The answer is the
 * offset of the first '<' that starts one of the markers "<tool_call>", "</think>", "<think>"
 * — either complete, or a prefix of one cut by the end of the text — or len when there is
 * none; it never ends inside a UTF-8 sequence cut by the end of the text. The server emits
 * text[0..n) (it never needs to take it back), then waits for more tokens; when a complete
 * marker sits at n it switches state (reasoning ends, or a tool call starts and is buffered
 * until </tool_call> and parsed with chat_parse). Markers are ASCII, so a cut is always at a
 * character boundary. */
size_t chat_parse_safe_prefix(const char *text, size_t len);

#endif
