/* chat_template — the Qwen chat templates implemented in C (no Jinja engine), byte-exact with
 * transformers' apply_chat_template on the official templates:
 *   CHAT_TEMPLATE_QWEN3   Qwen3 / Qwen3-Next (JSON tool calls inside <tool_call>)
 *   CHAT_TEMPLATE_QWEN35  Qwen3.5 / 3.6 (XML <function=...> tool calls, thinking on by default)
 *   CHAT_TEMPLATE_QWEN36  Qwen3.6's variant of the Qwen3.5 template (preserve_thinking)
 * Reference renderings: tests/fixtures/chat/ (scripts/fixtures/make_chat_vectors.py).
 * chat_jinja uses them as the fast path of these official templates (chat_template_official)
 * and as the built-in template of a model folder that has none (chat_template_detect). */
#ifndef DS_CHAT_TEMPLATE_H
#define DS_CHAT_TEMPLATE_H
#include <jansson.h>
#include <stddef.h>

typedef enum {
  CHAT_TEMPLATE_QWEN3,
  CHAT_TEMPLATE_QWEN35,
  CHAT_TEMPLATE_QWEN36, /* Qwen3.5's template plus chat_template_kwargs.preserve_thinking (keep
                           every assistant turn's reasoning) and JSON-printed non-string
                           parameter values (true, 1.5, null instead of True, 1.5, None) */
} chat_template_kind;

/* Picks the family from a Jinja template text (NULL allowed) and a model_type (NULL allowed).
 * A template with "<function=" is Qwen3.5, or Qwen3.6 when it also names preserve_thinking;
 * any other template is Qwen3. Without a template: model_type qwen3_5* (Qwen3.5 and 3.6 models
 * share it) gives Qwen3.5, another model_type Qwen3, none Qwen3.5. */
chat_template_kind chat_template_detect(const char *template_text, const char *model_type);

/* The family whose official template is exactly text (FNV-1a 64 and length of the bytes of
 * tests/fixtures/chat/'s templates and of Qwen3's tokenizer_config.json), or -1: chat_jinja
 * renders such a template with the C one (same bytes, measured a hundred times faster). */
int chat_template_official(const char *text);

typedef struct chat_render {
  char *text; /* the rendered prompt (malloc'd) */
  size_t len;
  size_t *msg_offsets; /* byte offset where each message's turn starts in text [n_msgs]:
                          always at an "<|im_start|>"; a leading system message is at 0 (also
                          when tools share its turn); consecutive tool messages share the
                          offset of their grouped "<|im_start|>user" turn */
  int n_msgs;
  int thinking_open; /* the prompt ends inside an open <think> block (Qwen3.5 generation
                        prompt with thinking on): pass to chat_parse as thinking_open */
} chat_render;

/* Renders an OpenAI chat request (`messages`, optional `tools`, optional
 * `chat_template_kwargs` {enable_thinking, add_generation_prompt}). Returns 0, or -1 with a
 * clear message in err (unknown role, tool message without a preceding call, wrong types).
 * add_generation_prompt is the default; a boolean `add_generation_prompt` at the top of the
 * request, then one in chat_template_kwargs, override it. Message content may be a string,
 * null, or an array of {"type":"text","text"} parts (joined). Role "developer" is taken as
 * "system". For Qwen3.5, tool-call arguments given as a JSON string are parsed (must be an
 * object); Qwen3 prints them verbatim. Qwen3.5 also fails, as its template does, when a system
 * message is not first or no user message is a real query. On success *out owns its buffers
 * (chat_render_free); on failure *out is empty. */
int chat_template_render(chat_template_kind kind, const json_t *request, int add_generation_prompt,
                         chat_render *out, char *err, size_t errlen);
void chat_render_free(chat_render *r);

/* Python's json.dumps(v, ensure_ascii=False) bytes, as transformers' Jinja `tojson` prints
 * them: insertion key order, ", " / ": " separators, floats by Python repr. Returns a malloc'd
 * string, or NULL on out of memory. */
char *chat_template_tojson(const json_t *v);

#endif
