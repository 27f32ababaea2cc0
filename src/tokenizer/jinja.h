/* jinja — a Jinja template engine for chat templates, rendering byte for byte what transformers'
 * apply_chat_template renders with Python's jinja2 (ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, the loopcontrols extension, transformers' `tojson` filter =
 * json.dumps(x, ensure_ascii=False, indent, separators, sort_keys), and the globals
 * raise_exception(msg) and strftime_now(fmt)).
 *
 *   template text --lex--> tokens --parse--> AST (jinja_template, immutable, shareable)
 *   AST + JSON context --render--> text     (one arena per render, freed at its end)
 *
 * Values come in as JSON (jansson): the context object's keys are the template's variables
 * (messages, tools, add_generation_prompt, bos_token, chat_template_kwargs spread out, ...).
 * Lists and dicts are immutable, as in the immutable sandbox (list.append is a security error);
 * only namespace() objects take attribute assignment. Undefined behaves as jinja2's default
 * Undefined: it prints as "", is false and empty, and any attribute of it is an error.
 *
 * Untrusted templates and inputs: recursion depth, output size, memory and loop/call steps are
 * bounded (jinja_limits); going past a bound is an error, never a crash. */
#ifndef DS_JINJA_H
#define DS_JINJA_H
#include <jansson.h>
#include <stddef.h>

typedef struct jinja_template jinja_template;

typedef struct jinja_limits {
  size_t max_output; /* bytes of rendered text */
  size_t max_memory; /* bytes of values built while rendering */
  long max_steps;    /* loop iterations + macro and function calls */
  int max_depth;     /* nesting of expressions, statements and macro calls */
} jinja_limits;

/* The defaults: 64 MiB of output, 512 MiB of memory, 10 million steps, depth 200. */
jinja_limits jinja_limits_default(void);

/* Compiles a template. Returns NULL with one line in err ("syntax error: ... (line N)") when
 * the text is not a template jinja2 would accept (as far as this engine knows the language).
 * The result owns all it points to (jinja_template_free) and is read-only while rendering, so
 * several threads may render one template at once. */
jinja_template *jinja_parse(const char *src, char *err, size_t errlen);
void jinja_template_free(jinja_template *t);

/* Renders t with the variables of ctx (a JSON object; NULL = none) under lim (NULL = the
 * defaults). Returns 0 with *out a malloc'd NUL-terminated string (caller frees; *out_len, if
 * not NULL, its length), or -1 with *out NULL and one line in err: raise_exception's message
 * as is, otherwise "<ErrorKind>: message (line N)" (UndefinedError, TypeError,
 * SecurityError, LimitError, ...). */
int jinja_template_render(const jinja_template *t, const json_t *ctx, const jinja_limits *lim,
                          char **out, size_t *out_len, char *err, size_t errlen);

/* jinja_parse + jinja_template_render with the default limits + jinja_template_free. */
int jinja_render(const char *src, const json_t *ctx, char **out, char *err, size_t errlen);

#endif
