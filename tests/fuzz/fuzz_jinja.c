/* fuzz_jinja — the Jinja engine on untrusted templates and contexts.
 *
 * The first input byte b picks the context, the rest is the payload: the template text up to
 * its first NUL, then (b & 1 == 0) a JSON object given as the context (ignored when it does not
 * parse), or (b & 1 == 1) a fixed chat context (messages with tool calls and reasoning, tools
 * with JSON schemas). Rendering runs under small limits (1 MiB of output, 64 MiB of memory,
 * 200 000 steps) so that every input finishes quickly.
 * Contract: jinja_parse returns a template or NULL with a message; rendering returns 0 with a
 * NUL-terminated text of the stated length, the same bytes on a second render of the same
 * compiled template (templates that read the clock excepted), or -1 with *out NULL and a
 * message (one line in strict mode). */
#include <jansson.h>

#include "fuzz/fuzz_common.h"
#include "tokenizer/jinja.h"

static json_t *fuzz_jinja_chat;

static void fuzz_jinja_init(void) {
  const char *ctx =
      "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
      "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
      "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"need tool\","
      "\"tool_calls\":[{\"id\":\"call00001\",\"type\":\"function\",\"function\":{\"name\":"
      "\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3,\"x\":[1.5,null,true]}}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"call00001\",\"content\":\"sunny\"},"
      "{\"role\":\"assistant\",\"content\":\"<think>\\nok\\n</think>\\n\\nSunny.\"},"
      "{\"role\":\"user\",\"content\":\"Thanks \\u00e9\\u2713\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
      "\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
      "\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}],"
      "\"add_generation_prompt\":true,\"enable_thinking\":false,\"bos_token\":\"<s>\","
      "\"eos_token\":\"</s>\"}";
  json_error_t je;
  fuzz_jinja_chat = json_loads(ctx, 0, &je);
  if (!fuzz_jinja_chat) fuzz_die("chat context: %s", je.text);
}

static int fuzz_jinja_one(const uint8_t *data, size_t size) {
  if (!fuzz_jinja_chat) fuzz_jinja_init();
  if (size < 1) return 0;
  int b = data[0];
  const char *p = (const char *)data + 1;
  size_t n = size - 1, tn = 0;
  while (tn < n && p[tn]) tn++;
  char *src = malloc(tn + 1);
  if (!src) fuzz_die("out of memory");
  memcpy(src, p, tn);
  src[tn] = 0;
  json_t *ctx = NULL;
  if (b & 1) {
    ctx = json_incref(fuzz_jinja_chat);
  } else if (tn + 1 < n) {
    json_error_t je;
    ctx = json_loadb(p + tn + 1, n - tn - 1, JSON_REJECT_DUPLICATES, &je);
  }
  char err[512];
  err[0] = 0;
  jinja_template *t = jinja_parse(src, err, sizeof err);
  if (!t) {
    json_decref(ctx);
    free(src);
    FUZZ_CHECK_MSG(err, "jinja_parse");
    return 0;
  }
  jinja_limits lim = jinja_limits_default();
  lim.max_output = 1 << 20;
  lim.max_memory = 64u << 20;
  lim.max_steps = 200000;
  char *out = (char *)1, *out2 = NULL;
  size_t len = 0, len2 = 0;
  err[0] = 0;
  int rc = jinja_template_render(t, ctx, &lim, &out, &len, err, sizeof err);
  int why = 0;
  if (rc == 0) {
    if (!out || out[len] != 0 || strlen(out) > len)
      why = 1;
    else if (!strstr(src, "strftime")) {
      char err2[512];
      int rc2 = jinja_template_render(t, ctx, &lim, &out2, &len2, err2, sizeof err2);
      if (rc2 != 0 || len2 != len || memcmp(out, out2, len) != 0) why = 2;
    }
  } else if (rc != -1) {
    why = 3;
  } else if (out != NULL) {
    why = 4;
  }
  if (rc == 0) free(out);
  free(out2);
  jinja_template_free(t);
  json_decref(ctx);
  free(src);
  FUZZ_CHECK(why != 1, "rendered text is not NUL-terminated at its length");
  FUZZ_CHECK(why != 2, "two renders of the same template differ");
  FUZZ_CHECK(why != 3, "jinja_template_render returned %d", rc);
  FUZZ_CHECK(why != 4, "a failed render left *out set");
  if (rc != 0) FUZZ_CHECK_MSG(err, "jinja_template_render");
  return 0;
}

#ifndef FUZZ_REGRESSION
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_jinja_one(data, size);
  return 0;
}
#endif
