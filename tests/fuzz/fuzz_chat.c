/* fuzz_chat — the chat template renderer and the generated-text parser.
 *
 * The first input byte b picks the mode, the rest is the payload:
 *   b & 1 == 0  render: the payload is parsed by jansson (as the server does:
 *               JSON_REJECT_DUPLICATES); a JSON value goes to chat_template_render with
 *               kind = QWEN35 when b & 2 else QWEN3, add_generation_prompt = b & 4.
 *               Success: text present, NUL-terminated at len, message offsets
 *               non-decreasing and inside the text, the same bytes on a second render.
 *               Failure: a message, *out empty. chat_template_tojson(value) parses back to
 *               an equal value.
 *   b & 1 == 1  parse: the payload (up to its first NUL) goes to chat_parse_ex with
 *               thinking_open = b & 2 and, when b & 4, a fixed `tools` list (typed XML
 *               parameters); ids come from a counter so two parses must agree exactly.
 *               Success: content present; tool_calls NULL or an array of
 *               {"id","type":"function","function":{"name" (non-empty),"arguments"}}.
 *               chat_parse_safe_prefix at several cut points returns n <= cut, stopping
 *               only at a '<' or before an unfinished UTF-8 sequence at the cut. */
#include <jansson.h>

#include "fuzz/fuzz_common.h"
#include "tokenizer/chat_parse.h"
#include "tokenizer/chat_template.h"

static json_t *fuzz_chat_tools;

static void fuzz_chat_init(void) {
  const char *tools =
      "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
      "\"parameters\":{\"type\":\"object\",\"properties\":{"
      "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"scale\":{\"type\":"
      "\"number\"},"
      "\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":"
      "\"array\"},"
      "\"nothing\":{\"type\":\"null\"}},\"required\":[\"city\"]}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":"
      "\"object\","
      "\"properties\":{\"q\":{\"type\":\"string\"},\"n\":{\"type\":[\"integer\",\"null\"]}}}}}]";
  json_error_t je;
  fuzz_chat_tools = json_loads(tools, 0, &je);
  if (!fuzz_chat_tools) fuzz_die("tools: %s", je.text);
}

static void fuzz_chat_id(void *ctx, char *buf, size_t buflen) {
  int *k = ctx;
  snprintf(buf, buflen, "call_%d", (*k)++);
}

static int fuzz_chat_render(int b, const uint8_t *p, size_t n) {
  json_error_t je;
  json_t *v = json_loadb((const char *)p, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
  if (!v) return 0;
  /* tojson must print a value that parses back equal */
  char *tj = chat_template_tojson(v);
  if (tj) {
    json_t *back = json_loads(tj, JSON_DECODE_ANY, &je);
    int eq = back && json_equal(back, v);
    json_decref(back);
    if (!eq) {
      json_decref(v);
      free(tj);
      FUZZ_CHECK(0, "chat_template_tojson printed text that does not parse back equal (%s)",
                 je.text);
    }
    free(tj);
  }
  chat_template_kind kind = (b & 2) ? CHAT_TEMPLATE_QWEN35 : CHAT_TEMPLATE_QWEN3;
  int agp = (b & 4) != 0;
  chat_render r, r2;
  char err[512];
  err[0] = 0;
  memset(&r, 0x5a, sizeof r);
  int rc = chat_template_render(kind, v, agp, &r, err, sizeof err);
  if (rc != 0) {
    json_decref(v);
    FUZZ_CHECK(rc == -1, "chat_template_render returned %d", rc);
    FUZZ_CHECK_MSG(err, "chat_template_render");
    FUZZ_CHECK(r.text == NULL && r.msg_offsets == NULL, "failed render left buffers in *out");
    return 0;
  }
  int bad = 0;
  if (!r.text || r.text[r.len] != 0 || r.n_msgs < 0) bad = 1;
  for (int i = 0; !bad && i < r.n_msgs; i++)
    if (r.msg_offsets[i] > r.len || (i > 0 && r.msg_offsets[i] < r.msg_offsets[i - 1])) bad = 2;
  err[0] = 0;
  memset(&r2, 0, sizeof r2);
  int rc2 = chat_template_render(kind, v, agp, &r2, err, sizeof err);
  int same = rc2 == 0 && r2.len == r.len && r2.n_msgs == r.n_msgs &&
             memcmp(r2.text, r.text, r.len) == 0 && r2.thinking_open == r.thinking_open &&
             (r.n_msgs == 0 ||
              memcmp(r2.msg_offsets, r.msg_offsets, sizeof *r.msg_offsets * (size_t)r.n_msgs) == 0);
  if (rc2 == 0) chat_render_free(&r2);
  chat_render_free(&r);
  json_decref(v);
  FUZZ_CHECK(bad == 0, "rendered prompt is malformed (%s)",
             bad == 1 ? "text/len" : "message offsets");
  FUZZ_CHECK(same, "two renders of the same request differ");
  return 0;
}

static int fuzz_chat_check_calls(const json_t *tc) {
  if (!tc) return 0;
  FUZZ_CHECK(json_is_array(tc), "tool_calls is not an array");
  size_t i;
  json_t *c;
  json_array_foreach(tc, i, c) {
    json_t *fn = json_object_get(c, "function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    FUZZ_CHECK(json_is_string(json_object_get(c, "id")), "tool_calls[%zu] has no id", i);
    FUZZ_CHECK(json_is_string(json_object_get(c, "type")) &&
                   !strcmp(json_string_value(json_object_get(c, "type")), "function"),
               "tool_calls[%zu].type is not \"function\"", i);
    FUZZ_CHECK(name && *name, "tool_calls[%zu] has no function name", i);
    FUZZ_CHECK(json_is_string(json_object_get(fn, "arguments")),
               "tool_calls[%zu].arguments is not a string", i);
  }
  return 0;
}

static int fuzz_chat_parse(int b, const uint8_t *p, size_t n) {
  char *text = malloc(n + 1);
  if (!text) fuzz_die("out of memory");
  memcpy(text, p, n);
  text[n] = 0;
  size_t len = strlen(text);
  int thinking_open = (b & 2) != 0;
  const json_t *tools = (b & 4) ? fuzz_chat_tools : NULL;
  chat_parsed a, c;
  int ka = 0, kc = 0;
  memset(&a, 0, sizeof a);
  memset(&c, 0, sizeof c);
  int ra = chat_parse_ex(text, thinking_open, tools, fuzz_chat_id, &ka, &a);
  int rc = chat_parse_ex(text, thinking_open, tools, fuzz_chat_id, &kc, &c);
  int why = 0;
#ifdef FUZZ_STRICT
  int must_parse = 1;
#else
  int must_parse = fuzz_utf8_valid((const uint8_t *)text, len); /* what the server passes */
#endif
  if ((ra != 0 || rc != 0) && !must_parse) {
    if (ra == 0) chat_parsed_free(&a);
    if (rc == 0) chat_parsed_free(&c);
    free(text);
    return 0;
  }
  if (ra != 0 || rc != 0)
    why = 1;
  else if (!a.content)
    why = 2;
  else if (strcmp(a.content, c.content ? c.content : "") != 0 ||
           (a.reasoning_content == NULL) != (c.reasoning_content == NULL) ||
           (a.reasoning_content && strcmp(a.reasoning_content, c.reasoning_content) != 0) ||
           (a.tool_calls == NULL) != (c.tool_calls == NULL) ||
           (a.tool_calls && !json_equal(a.tool_calls, c.tool_calls)))
    why = 3;
  int calls_bad = why ? 0 : fuzz_chat_check_calls(a.tool_calls);
  if (ra == 0) chat_parsed_free(&a);
  if (rc == 0) chat_parsed_free(&c);
  if (why || calls_bad) free(text);
  FUZZ_CHECK(why != 1, "chat_parse_ex failed (%d, %d) on a %zu-byte text", ra, rc, len);
  FUZZ_CHECK(why != 2, "chat_parse left content NULL");
  FUZZ_CHECK(why != 3, "two parses of the same text differ");
  if (calls_bad) return 1;
  /* streaming safe prefix */
  size_t cuts[6] = {
      len, len / 2, len / 3, len ? len - 1 : 0, len > 1 ? len - 2 : 0, len > 2 ? len - 3 : 0};
  for (int k = 0; k < 6; k++) {
    size_t L = cuts[k];
    size_t s = chat_parse_safe_prefix(text, L);
    int ok = s <= L;
    if (ok && s < L) {
      uint8_t c0 = (uint8_t)text[s];
      size_t need = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC0 ? 2 : 1;
      ok = c0 == '<' || (c0 >= 0xC0 && L - s < need);
    }
    if (!ok) {
      free(text);
      FUZZ_CHECK(
          0,
          "chat_parse_safe_prefix(text, %zu) = %zu stops at neither '<' nor a cut UTF-8 sequence",
          L, s);
    }
  }
  free(text);
  return 0;
}

static int fuzz_chat_one(const uint8_t *data, size_t size) {
  if (!fuzz_chat_tools) fuzz_chat_init();
  if (size < 1) return 0;
  int b = data[0];
  if (b & 1) return fuzz_chat_parse(b, data + 1, size - 1);
  return fuzz_chat_render(b, data + 1, size - 1);
}

#ifndef FUZZ_REGRESSION
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_chat_one(data, size);
  return 0;
}
#endif
