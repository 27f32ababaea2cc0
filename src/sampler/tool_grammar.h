/* tool_grammar — tool_choice "required" / a named tool: the grammar of the model's own tool-call
 * text, compiled to a json_schema that json_mask_new_schema follows like response_format's, so
 * that the engine's one JSON mask path enforces it.
 *
 * The text (the Qwen3 / Qwen3-Next JSON call format that chat_parse reads):
 *
 *   [think text "</think>"]  ws  call  ( ws call )*         then only eos
 *   call = "<tool_call>\n{\"name\": \"" NAME "\", \"arguments\": " ARGS "}\n</tool_call>"
 *
 * NAME is one of the allowed tools' names (its JSON string encoding), and the prefix literal it
 * completes picks ARGS's schema: the tool's `parameters` (an object schema, json_schema.h's
 * subset; absent or {}: any object). The think block is there when the prompt left one open
 * (tool_grammar_think): free text that must close it before the calls. eos is allowed only after
 * a complete call; max_calls bounds the calls (parallel_tool_calls false: 1). */
#ifndef DS_TOOL_GRAMMAR_H
#define DS_TOOL_GRAMMAR_H
#include <jansson.h>
#include <stddef.h>

#include "sampler/json_schema.h"

/* tools: the OpenAI chat tools array ([{"type": "function", "function": {"name", "parameters"}}]);
 * name: the one tool allowed (NULL: any of them); max_calls: 0 for any number, else at most that
 * many. Returns a schema owned by the caller (json_schema_free), or NULL with one line in err (a
 * tool's parameters outside the subset, no tools, a name not in tools, out of memory). */
json_schema *tool_grammar_compile(const json_t *tools, const char *name, int max_calls, char *err,
                                  size_t errlen);

/* think != 0: the output starts inside an open think block (the rendered prompt ended in one).
 * Set before any mask is made over s. */
void tool_grammar_think(json_schema *s, int think);

#endif
