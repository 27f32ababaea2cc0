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
 * a complete call; max_calls bounds the calls (parallel_tool_calls false: 1).
 *
 * The XML form (Qwen3.5 / 3.6 and Qwen3-Coder templates; tool_grammar_xml switches to it):
 *
 *   call  = "<tool_call>\n<function=" NAME ">" param* "\n</function>\n</tool_call>"
 *   param = "\n<parameter=" PNAME ">\n" VALUE "\n</parameter>"
 *
 * as the template writes a call. The params, read as the JSON object they stand for ({PNAME:
 * VALUE, ...}), follow ARGS's schema: PNAMEs are the tool's `properties` in their order, each at
 * most once, the required ones all there. A string parameter's VALUE is raw text (what
 * chat_parse keeps as the string: checked as the JSON string it becomes, so enum / pattern /
 * length hold); any other parameter's VALUE is JSON text of its type (chat_parse types it by the
 * schema's first non-null type, so a type list is narrowed to that one). No VALUE contains
 * "</parameter>" or "</tool_call>" (where the parser would cut it). */
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

/* tool_choice auto with parallel_tool_calls false: any text, but the output ends (only eos may
 * follow) at the end of its first "<tool_call>" ... "</tool_call>" block outside the think
 * block (tool_grammar_think), in either call form; the block itself is not checked (auto: a
 * malformed one stays content). Owned by the caller (json_schema_free); NULL on out of memory. */
json_schema *tool_grammar_single(void);

/* Switches s (made by tool_grammar_compile from the same tools and name) to the XML call form
 * (tool_grammar_single's: nothing to switch). 0, or -1 with one line in err: a tool or parameter
 * name the form cannot carry ('>', '<', newline, empty), parameters not listed under a top-level
 * `properties` (allOf / anyOf / oneOf / $ref at the top), a narrowed schema that does not compile,
 * out of memory. Set before any mask is made over s. */
int tool_grammar_xml(json_schema *s, const json_t *tools, const char *name, char *err,
                     size_t errlen);

/* think != 0: the output starts inside an open think block (the rendered prompt ended in one).
 * Set before any mask is made over s. */
void tool_grammar_think(json_schema *s, int think);

#endif
