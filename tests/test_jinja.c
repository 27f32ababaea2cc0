/* test_jinja — the Jinja engine against Python's jinja2 (the environment transformers' chat
 * templates render in), byte for byte:
 *   units      tests/fixtures/jinja/units.json: one construct per case (statements,
 *              expressions, filters, tests, methods, whitespace control, errors)
 *   templates  tests/fixtures/jinja/templates/ (real chat templates, .jinja) x the contexts of
 *              tests/fixtures/jinja/rendered.json (conversations with tools, tool calls,
 *              reasoning, generation prompt on and off)
 * Both reference files come from scripts/fixtures/jinja_refs.py. An expected error must be an
 * error here too: raise_exception's message exactly, otherwise the same error kind.
 * Also: compile once / render many, limits (output, steps, depth, memory), and garbage
 * templates failing cleanly. */
#include <jansson.h>

#include "test.h"
#include "tokenizer/jinja.h"

#define FIX "tests/fixtures/jinja/"

static char *test_jinja_read(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)n + 1);
  size_t k = fread(s, 1, (size_t)n, f);
  s[k] = 0;
  fclose(f);
  return s;
}

/* The error kind as this engine names it: "syntax error" for jinja2's TemplateSyntaxError
 * (and Python's SyntaxError for a loop control outside a loop), otherwise the Python exception name
 * before the first ':'. */
static int test_jinja_same_kind(const char *py, const char *c) {
  if (!strncmp(py, "TemplateSyntaxError", 19) || !strncmp(py, "SyntaxError", 11))
    return !strncmp(c, "syntax error", 12);
  const char *colon = strchr(py, ':');
  size_t n = colon ? (size_t)(colon - py) : strlen(py);
  return !strncmp(py, c, n) && c[n] == ':';
}

/* Checks one rendering against its reference {text} | {error, raised}; returns 1 when equal. */
static int test_jinja_check(const char *name, const char *tmpl, const json_t *ctx,
                            const json_t *ref, char *why, size_t whylen) {
  char *out = NULL, err[600];
  int rc = jinja_render(tmpl, ctx, &out, err, sizeof err);
  const char *want = json_string_value(json_object_get(ref, "text"));
  const char *want_err = json_string_value(json_object_get(ref, "error"));
  int ok;
  if (want) {
    ok = rc == 0 && !strcmp(out, want);
    if (!ok && rc != 0) snprintf(why, whylen, "%.150s: error %.200s", name, err);
    if (!ok && rc == 0) {
      size_t i = 0;
      while (out[i] && out[i] == want[i]) i++;
      snprintf(why, whylen, "%.150s: differs at byte %zu: got \"%.60s\" want \"%.60s\"", name, i,
               out + i, want + i);
    }
  } else {
    int raised = json_is_true(json_object_get(ref, "raised"));
    ok = rc != 0 && want_err &&
         (raised ? (!strcmp(err, want_err) || !want_err[0]) /* an empty message is ours */
                 : test_jinja_same_kind(want_err, err));
    if (!ok)
      snprintf(why, whylen, "%.100s: want error \"%.100s\", got %s \"%.80s\"", name,
               want_err ? want_err : "?", rc ? "error" : "text", rc ? err : out);
  }
  free(out);
  return ok;
}

TEST(units) {
  json_error_t je;
  json_t *units = json_load_file(FIX "units.json", 0, &je);
  REQUIRE(units && json_array_size(units) > 50);
  size_t i, bad = 0;
  json_t *u;
  json_array_foreach(units, i, u) {
    char why[400];
    const char *name = json_string_value(json_object_get(u, "name"));
    if (!test_jinja_check(name, json_string_value(json_object_get(u, "template")),
                          json_object_get(u, "context"), u, why, sizeof why)) {
      if (bad++ < 12) printf("  unit %s\n", why);
    }
  }
  EXPECT_MSG(bad == 0, "%zu of %zu unit cases differ from jinja2", bad, json_array_size(units));
  json_decref(units);
}

TEST(templates) {
  json_error_t je;
  json_t *ref = json_load_file(FIX "rendered.json", 0, &je);
  REQUIRE(ref);
  json_t *ctxs = json_object_get(ref, "contexts"), *results = json_object_get(ref, "results");
  REQUIRE(json_object_size(ctxs) >= 8 && json_object_size(results) >= 12);
  const char *tname;
  json_t *per;
  size_t total = 0, bad = 0;
  json_object_foreach(results, tname, per) {
    char path[256];
    snprintf(path, sizeof path, FIX "templates/%s", tname);
    char *src = test_jinja_read(path);
    EXPECT_MSG(src != NULL, "cannot read %s", path);
    if (!src) continue;
    const char *cname;
    json_t *r;
    size_t tbad = 0;
    json_object_foreach(per, cname, r) {
      char why[400], label[300];
      snprintf(label, sizeof label, "%s x %s", tname, cname);
      total++;
      if (!test_jinja_check(label, src, json_object_get(ctxs, cname), r, why, sizeof why)) {
        if (tbad++ < 2) printf("  %s\n", why);
        bad++;
      }
    }
    free(src);
  }
  printf("  %zu of %zu template x conversation renderings match jinja2\n", total - bad, total);
  EXPECT_MSG(bad == 0, "%zu of %zu renderings differ", bad, total);
  json_decref(ref);
}

TEST(compile_once_render_many) {
  char err[256];
  jinja_template *t =
      jinja_parse("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ n + 1 }}",
                  err, sizeof err);
  REQUIRE(t);
  for (int i = 0; i < 3; i++) {
    json_t *ctx =
        json_pack("{s:[{s:s,s:s}],s:i}", "messages", "role", "user", "content", "hi", "n", i);
    char *out;
    size_t len;
    EXPECT(jinja_template_render(t, ctx, NULL, &out, &len, err, sizeof err) == 0);
    char want[64];
    snprintf(want, sizeof want, "<user>hi%d", i + 1);
    EXPECT_STR(out, want);
    EXPECT_EQ_INT(len, strlen(want));
    free(out);
    json_decref(ctx);
  }
  jinja_template_free(t);
}

TEST(syntax_error_names_line) {
  char err[256];
  jinja_template *t = jinja_parse("a\nb\n{% if x %}\n{{ 1 + }}\n{% endif %}", err, sizeof err);
  EXPECT(t == NULL);
  EXPECT_MSG(strstr(err, "syntax error") && strstr(err, "line 4"), "err = %s", err);
}

TEST(limits) {
  jinja_limits lim = jinja_limits_default();
  char err[256], *out;
  const char *loop =
      "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
  jinja_template *t = jinja_parse(loop, err, sizeof err);
  REQUIRE(t);
  lim.max_output = 1000;
  EXPECT(jinja_template_render(t, NULL, &lim, &out, NULL, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "LimitError") != NULL, "err = %s", err);
  lim = jinja_limits_default();
  lim.max_steps = 5000;
  EXPECT(jinja_template_render(t, NULL, &lim, &out, NULL, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "LimitError") != NULL, "err = %s", err);
  jinja_template_free(t);
  /* unbounded macro recursion */
  EXPECT(jinja_render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &out, err,
                      sizeof err) == -1);
  EXPECT_MSG(strstr(err, "RecursionError") != NULL, "err = %s", err);
  /* memory: a string doubled in a loop */
  lim = jinja_limits_default();
  lim.max_memory = 1 << 20;
  t = jinja_parse(
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}",
      err, sizeof err);
  REQUIRE(t);
  EXPECT(jinja_template_render(t, NULL, &lim, &out, NULL, err, sizeof err) == -1);
  EXPECT_MSG(strstr(err, "LimitError") != NULL, "err = %s", err);
  jinja_template_free(t);
  /* deep nesting in the source */
  char deep[4096];
  size_t k = 0;
  k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
  for (int i = 0; i < 1000; i++) deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 1000; i++) deep[k++] = ')';
  snprintf(deep + k, sizeof deep - k, " }}");
  EXPECT(jinja_render(deep, NULL, &out, err, sizeof err) == -1);
}

TEST(garbage_fails_cleanly) {
  const char *bad[] = {"{{",
                       "{%",
                       "{% for %}",
                       "{{ [1, 2 }}",
                       "{{ (1 }}",
                       "{{ 'abc }}",
                       "{% set %}",
                       "{% macro %}",
                       "{{ a.b. }}",
                       "{% if 1 %}",
                       "{{ 1 | }}",
                       "{% endfor %}",
                       "{{ }}",
                       "{{ 1 2 }}",
                       "{% raw %}abc",
                       "{{ x is }}",
                       "{{ {1: } }}",
                       "{{ '\\x4' }}",
                       "{% call %}{% endcall %}"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char err[256], *out = (char *)1;
    int rc = jinja_render(bad[i], NULL, &out, err, sizeof err);
    if (rc == 0) {
      EXPECT_MSG(0, "template \"%s\" rendered \"%s\"", bad[i], out);
      free(out);
      continue;
    }
    EXPECT_MSG(out == NULL && err[0], "template \"%s\": no message or *out set", bad[i]);
  }
}

/* Strings from templates may hold invalid UTF-8 (JSON strings cannot): counting, indexing,
 * slicing and iterating must agree on where characters start. */
TEST(invalid_utf8_consistent) {
  char err[256], *out;
  const char *t =
      "{% set s = '\x93\x93"
      "a\xc3\xa9\xff' %}{{ s|length }} {{ s|list|length }} "
      "{{ s[::-1]|length }} {{ s[::-1]|list|length }} {{ s|map('upper')|list|length }} "
      "{{ s[-1]|length }}";
  REQUIRE(jinja_render(t, NULL, &out, err, sizeof err) == 0);
  EXPECT_STR(out, "4 4 3 3 4 1"); /* reversed, the stray bytes follow the 'a' */
  free(out);
}

int main(void) {
  RUN(units);
  RUN(templates);
  RUN(compile_once_render_many);
  RUN(syntax_error_names_line);
  RUN(limits);
  RUN(garbage_fails_cleanly);
  RUN(invalid_utf8_consistent);
  TEST_MAIN_END();
}
