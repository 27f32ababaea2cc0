/* deltaserve render --tokenizer DIR — an OpenAI chat request JSON on stdin, the rendered
 * prompt on stdout, exactly (no newline added).
 *
 * The template family comes from DIR's chat template text (chat_template.jinja, else the
 * "chat_template" of tokenizer_config.json), else from config.json's model_type. The request
 * gives `messages`, optional `tools`, optional `chat_template_kwargs` {enable_thinking,
 * add_generation_prompt (default true)}. Errors: one line on stderr, exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "tokenizer/chat_template.h"

static void render_usage(FILE *f) {
  fprintf(f,
          "usage: deltaserve render --tokenizer DIR < request.json\n"
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

/* The chat template text of DIR (malloc'd) or NULL when it has none; *bad set when a file
 * exists but cannot be read or parsed. */
static char *render_template_text(const char *dir, int *bad) {
  char path[4096];
  snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
  FILE *f = fopen(path, "rb");
  if (f) {
    size_t n;
    char *t = render_read_all(f, &n);
    fclose(f);
    if (!t) *bad = 1;
    return t;
  }
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  f = fopen(path, "rb");
  if (!f) return NULL;
  fclose(f);
  json_error_t e;
  json_t *cfg = json_load_file(path, 0, &e);
  if (!cfg) {
    fprintf(stderr, "deltaserve render: %s: %s (line %d)\n", path, e.text, e.line);
    *bad = 1;
    return NULL;
  }
  const json_t *ct = json_object_get(cfg, "chat_template");
  const char *text = json_string_value(ct);
  if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
    size_t i;
    json_t *it;
    json_array_foreach(ct, i, it) {
      const char *name = json_string_value(json_object_get(it, "name"));
      if (name && !strcmp(name, "default"))
        text = json_string_value(json_object_get(it, "template"));
    }
  }
  char *out = text ? strdup(text) : NULL;
  json_decref(cfg);
  return out;
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
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      render_usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
      dir = argv[++i];
    } else if (!strncmp(argv[i], "--tokenizer=", 12)) {
      dir = argv[i] + 12;
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
  int bad = 0;
  char *tmpl = render_template_text(dir, &bad);
  if (bad) {
    free(tmpl);
    fprintf(stderr, "deltaserve render: cannot read the chat template of %s\n", dir);
    return 1;
  }
  char *model_type = render_model_type(dir);
  if (!tmpl && !model_type) {
    fprintf(stderr,
            "deltaserve render: %s has no chat template (tokenizer_config.json) and no "
            "config.json model_type\n",
            dir);
    return 1;
  }
  chat_template_kind kind = chat_template_detect(tmpl, model_type);
  free(tmpl);
  free(model_type);

  size_t len = 0;
  char *in = render_read_all(stdin, &len);
  if (!in) {
    fprintf(stderr, "deltaserve render: cannot read stdin\n");
    return 1;
  }
  json_error_t e;
  json_t *req = json_loadb(in, len, 0, &e);
  free(in);
  if (!req) {
    fprintf(stderr, "deltaserve render: the request is not valid JSON: %s (line %d)\n", e.text,
            e.line);
    return 1;
  }
  chat_render r;
  char err[512];
  int rc = chat_template_render(kind, req, 1, &r, err, sizeof err);
  json_decref(req);
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
