/* chat_jinja — chat prompts rendered by the model's own Jinja chat template, as transformers'
 * apply_chat_template renders them when vLLM's chat endpoint calls it.
 *
 * Where the template comes from (the first that exists; compiled once, at start-up):
 *   1. `--chat-template FILE` (vLLM's flag; a value that is no readable file but holds one of
 *      "{}\n" is the template text itself, with \n \t \\ escapes decoded, as vLLM does);
 *   2. MODEL/chat_template.jinja;
 *   3. MODEL/tokenizer_config.json "chat_template": a string, or a list of {name, template}
 *      ("default" is the template; "tool_use" replaces it for requests with tools, as
 *      transformers' get_chat_template picks it; any name can be chosen per request);
 *   4. none: the built-in C template of the model type (chat_template.h).
 * A request's own `chat_template` (a name of 3., else template text) is compiled per request
 * under the engine's limits.
 *
 * Fast path: a template whose text is an official Qwen template byte for byte
 * (chat_template_official) is rendered by its C transcription (chat_template.h) after the same
 * message preprocessing: the same bytes and offsets (tests/test_chat_jinja.c), about a hundred
 * times faster (0.3 ms against 30 ms with offsets for a 400 KB conversation). Where the C
 * checks refuse a request the Jinja template decides (it may render it, or raise its own
 * message).
 *
 * The context, as transformers builds it: the special tokens of tokenizer_config.json
 * (bos_token, eos_token, unk_token, pad_token, ...), then chat_template_kwargs spread out, then
 * messages (tool-call arguments given as JSON strings parsed into objects, null or "" into {},
 * as vLLM does before rendering), tools (the request's, or None), documents (None) and
 * add_generation_prompt. continue_final_message renders without the generation prompt and cuts
 * the text after the last message's content (transformers' rule: at the last occurrence of the
 * stripped content, keeping its trailing spaces when the template kept them).
 *
 * Message offsets (for the prefix cache's checkpoints, which encode_turns cuts the prompt at):
 * message i's turn starts where a render of messages[0..i) with add_generation_prompt false
 * stops agreeing with the full render (their longest common prefix), when a special token of
 * tokenizer_config.json's added_tokens_decoder starts there. A template that renders the last
 * assistant turn otherwise than a past one (Qwen3.5 drops past reasoning), or cannot render the
 * prefix (it needs a user message), gets a second probe: the full conversation with a byte
 * appended to message i's content; the turn starts at the last special token before the first
 * difference. Cutting only at special tokens keeps the pieces' tokens those of the whole. Only
 * the last CHAT_JINJA_MAX_BOUNDARIES messages get a boundary (each costs one or two renders);
 * earlier ones, and ones no probe places, share the previous offset. */
#ifndef DS_CHAT_JINJA_H
#define DS_CHAT_JINJA_H
#include <jansson.h>
#include <stddef.h>

#include "tokenizer/chat_template.h"

#define CHAT_JINJA_MAX_BOUNDARIES 8

typedef struct chat_jinja chat_jinja;

/* Finds the chat template of model_dir (template_arg: --chat-template's value, or NULL) and
 * compiles it, with the named ones. builtin is the C template used when none is found.
 * Returns 0 with *out (chat_jinja_free), or -1 with one line in err naming the file and, for a
 * template that does not compile, the line ("FILE: syntax error: ... (line N)"). */
int chat_jinja_load(chat_jinja **out, const char *model_dir, const char *template_arg,
                    chat_template_kind builtin, char *err, size_t errlen);
void chat_jinja_free(chat_jinja *cj);

/* Where the template came from, for the start-up log: a path, or "built-in Qwen3" etc. */
const char *chat_jinja_origin(const chat_jinja *cj);

/* Renders an OpenAI chat request as normalised by openai_request (`messages`, `tools`,
 * `chat_template_kwargs`, `chat_template`, `continue_final_message`). cj NULL renders with the
 * built-in `fallback`. Returns 0 with *out owning its buffers (chat_render_free), or -1 with
 * *out empty and one line in err: the template's raise_exception message as is, or the error
 * (a client's: the server answers 400). */
int chat_jinja_render(const chat_jinja *cj, chat_template_kind fallback, const json_t *request,
                      int add_generation_prompt, chat_render *out, char *err, size_t errlen);

#endif
