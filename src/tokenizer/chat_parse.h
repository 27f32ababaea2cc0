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

#endif
