/* chat_template — the Qwen chat templates implemented in C (no Jinja engine), byte-exact with
 * transformers' apply_chat_template on the official templates:
 *   CHAT_TEMPLATE_QWEN3   Qwen3 / Qwen3-Next (JSON tool calls inside <tool_call>)
 *   CHAT_TEMPLATE_QWEN35  Qwen3.5 / 3.6 (XML <function=...> tool calls, thinking on by default)
 * The family is chosen from the template text in tokenizer_config.json or the model type. */
#ifndef DS_CHAT_TEMPLATE_H
#define DS_CHAT_TEMPLATE_H
#include <jansson.h>
#include <stddef.h>

typedef enum { CHAT_TEMPLATE_QWEN3, CHAT_TEMPLATE_QWEN35 } chat_template_kind;

/* Picks the family from a Jinja template text (NULL allowed) and a model_type (NULL allowed). */
chat_template_kind chat_template_detect(const char *template_text, const char *model_type);

typedef struct chat_render {
  char *text;          /* the rendered prompt (malloc'd) */
  size_t len;
  size_t *msg_offsets; /* byte offset where each message's turn starts in text [n_msgs] */
  int n_msgs;
} chat_render;

/* Renders an OpenAI chat request (`messages`, optional `tools`, optional
 * `chat_template_kwargs` {enable_thinking, add_generation_prompt}). Returns 0, or -1 with a
 * clear message in err (unknown role, tool message without a preceding call, wrong types). */
int chat_template_render(chat_template_kind kind, const json_t *request, int add_generation_prompt,
                         chat_render *out, char *err, size_t errlen);
void chat_render_free(chat_render *r);

#endif
