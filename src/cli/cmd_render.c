/* deltaserve render --tokenizer DIR [--chat-template FILE] — an OpenAI chat request JSON on
 * stdin, the rendered prompt on stdout, exactly (no newline added), as `serve` renders it.
 *
 * The template is found as serve finds it (chat_jinja.h): --chat-template, DIR's
 * chat_template.jinja, tokenizer_config.json's chat_template, else the built-in one of
 * config.json's model_type. The request gives `messages`, optional `tools`,
 * `chat_template_kwargs`, `chat_template`, `add_generation_prompt` (default true),
 * `continue_final_message`. Errors: one line on stderr, exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "tokenizer/chat_jinja.h"
#include "tokenizer/chat_template.h"

static void render_usage(FILE *f) {
  fprintf(f,
          "usage: deltaserve render --tokenizer DIR [--chat-template FILE] < request.json\n"
          "  prints the prompt the chat template of DIR makes of an OpenAI chat request\n"
          "  (messages, tools, chat_template_kwargs: enable_thinking, "
          "add_generation_prompt)\n");
}

/* Reads all of f into a malloc'd buffer (NUL-terminated). NULL on failure. */
static char *render_read_all(FILE *f, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (;;) {
    if (n + 1 >= cap) {
      char *q = realloc(buf, cap *= 2);
      if (!q) {
        free(buf);
        return NULL;
      }
      buf = q;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

static char *render_model_type(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *cfg = json_load_file(path, 0, NULL);
  if (!cfg) return NULL;
  const char *mt = json_string_value(json_object_get(cfg, "model_type"));
  char *out = mt ? strdup(mt) : NULL;
  json_decref(cfg);
  return out;
}

int cmd_render(int argc, char **argv) {
  const char *dir = NULL, *tpl = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      render_usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
      dir = argv[++i];
    } else if (!strncmp(argv[i], "--tokenizer=", 12)) {
      dir = argv[i] + 12;
    } else if (!strcmp(argv[i], "--chat-template") && i + 1 < argc) {
      tpl = argv[++i];
    } else {
      fprintf(stderr, "deltaserve render: unknown argument '%s'\n", argv[i]);
      render_usage(stderr);
      return 2;
    }
  }
  if (!dir) {
    render_usage(stderr);
    return 2;
  }
  char *model_type = render_model_type(dir);
  chat_template_kind kind = chat_template_detect(NULL, model_type);
  chat_jinja *cj = NULL;
  char err[512];
  if (chat_jinja_load(&cj, dir, tpl, kind, err, sizeof err)) {
    free(model_type);
    fprintf(stderr, "deltaserve render: %s\n", err);
    return 1;
  }
  if (!model_type && !strncmp(chat_jinja_origin(cj), "built-in", 8)) {
    chat_jinja_free(cj);
    fprintf(stderr,
            "deltaserve render: %s has no chat template (tokenizer_config.json) and no "
            "config.json model_type\n",
            dir);
    return 1;
  }
  free(model_type);

  size_t len = 0;
  char *in = render_read_all(stdin, &len);
  if (!in) {
    chat_jinja_free(cj);
    fprintf(stderr, "deltaserve render: cannot read stdin\n");
    return 1;
  }
  json_error_t e;
  json_t *req = json_loadb(in, len, 0, &e);
  free(in);
  if (!req) {
    chat_jinja_free(cj);
    fprintf(stderr, "deltaserve render: the request is not valid JSON: %s (line %d)\n", e.text,
            e.line);
    return 1;
  }
  chat_render r;
  int rc = chat_jinja_render(cj, kind, req, 1, &r, err, sizeof err);
  json_decref(req);
  chat_jinja_free(cj);
  if (rc) {
    fprintf(stderr, "deltaserve render: %s\n", err);
    return 1;
  }
  int ok = fwrite(r.text, 1, r.len, stdout) == r.len && fflush(stdout) == 0;
  chat_render_free(&r);
  if (!ok) {
    fprintf(stderr, "deltaserve render: cannot write stdout\n");
    return 1;
  }
  return 0;
}
