/* fuzz_openai_request — the OpenAI / vLLM request parser (src/server/openai_request.h) on
 * arbitrary bodies, followed, for chat requests it accepts, by what the server does next:
 * chat_template_render of the built `render` object with both template families.
 *
 * The first input byte picks the entry point (byte % 4), the rest is the body (len bytes, not
 * NUL-terminated: the parser must respect len):
 *   0  openai_request_parse(CHAT)        2  openai_request_parse_tokenize
 *   1  openai_request_parse(COMPLETION)  3  openai_request_parse_detokenize
 * Contract checks: failure fills an error with a 4xx/5xx status, a type and a message, and
 * leaves nothing to free; success gives a request whose fields are in their documented
 * ranges (stop count, top_logprobs, exactly one prompt form, tools borrowed from render). */
#include <jansson.h>

#include "fuzz/fuzz_common.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"

static int fuzz_openai_check_err(const openai_error *e, const char *what) {
  FUZZ_CHECK(e->status >= 400 && e->status <= 599, "%s: error status %d", what, e->status);
  FUZZ_CHECK(e->type != NULL && e->type[0], "%s: error without a type", what);
  FUZZ_CHECK(memchr(e->message, 0, sizeof e->message) && memchr(e->param, 0, sizeof e->param),
             "%s: error strings not terminated", what);
  FUZZ_CHECK_MSG(e->message, what);
  return 0;
}

/* Renders like the server: both families, with the parser's add_generation_prompt. */
static int fuzz_openai_render(const json_t *render, int agp) {
  for (int k = 0; k < 2; k++) {
    chat_render r;
    char err[512];
    err[0] = 0;
    memset(&r, 0, sizeof r);
    int rc = chat_template_render(k ? CHAT_TEMPLATE_QWEN35 : CHAT_TEMPLATE_QWEN3, render, agp, &r,
                                  err, sizeof err);
    if (rc == 0) {
      int ok = r.text && r.text[r.len] == 0;
      chat_render_free(&r);
      FUZZ_CHECK(ok, "rendered prompt is malformed");
    } else {
      FUZZ_CHECK_MSG(err, "chat_template_render");
    }
  }
  return 0;
}

static int fuzz_openai_main(openai_kind kind, const char *body, size_t len) {
  openai_request r;
  openai_error e;
  memset(&r, 0x5a, sizeof r);
  memset(&e, 0, sizeof e);
  if (openai_request_parse(kind, body, len, &r, &e) != 0)
    return fuzz_openai_check_err(&e, "openai_request_parse");
  int bad = 0;
  if (r.kind != kind)
    bad = 1;
  else if (r.n_stop < 0 || r.n_stop > OPENAI_MAX_STOP)
    bad = 2;
  else if (r.top_logprobs < 0 || r.top_logprobs > OPENAI_MAX_LOGPROBS)
    bad = 3;
  else if (r.max_tokens < 0)
    bad = 4;
  for (int i = 0; !bad && i < r.n_stop; i++)
    if (!r.stop[i]) bad = 5;
  if (!bad && kind == OPENAI_KIND_COMPLETION) {
    if ((r.prompt != NULL) == (r.prompt_ids != NULL))
      bad = 6;
    else if (r.prompt_ids && r.n_prompt_ids < 0)
      bad = 7;
    else if (r.prompt && r.prompt[r.prompt_len] != 0)
      bad = 8;
  }
  if (!bad && kind == OPENAI_KIND_CHAT) {
    if (!json_is_object(r.render) || !json_is_array(json_object_get(r.render, "messages")))
      bad = 9;
    else if (r.tools && r.tools != json_object_get(r.render, "tools"))
      bad = 10;
    else if (r.tool_choice == OPENAI_TOOL_CHOICE_NAMED && !r.tool_choice_name)
      bad = 11;
  }
  if (!bad && kind == OPENAI_KIND_CHAT && fuzz_openai_render(r.render, r.add_generation_prompt)) {
    openai_request_free(&r);
    return 1; /* fuzz_why says why */
  }
  openai_request_free(&r);
  FUZZ_CHECK(!bad, "parsed request breaks the header's invariants (check %d)", bad);
  return 0;
}

static int fuzz_openai_request_one(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0] % 4;
  /* an exact-size copy so ASan sees any read past len */
  size_t len = size - 1;
  char *body = malloc(len ? len : 1);
  if (!body) fuzz_die("out of memory");
  if (len) memcpy(body, data + 1, len);
  int rc = 0;
  if (mode <= 1) {
    rc = fuzz_openai_main(mode == 0 ? OPENAI_KIND_CHAT : OPENAI_KIND_COMPLETION, body, len);
  } else if (mode == 2) {
    char *model = NULL, *prompt = NULL;
    size_t plen = 0;
    json_t *render = NULL;
    int agp = -1;
    openai_error e;
    memset(&e, 0, sizeof e);
    if (openai_request_parse_tokenize(body, len, &model, &prompt, &plen, &render, &agp, &e) != 0) {
      rc = fuzz_openai_check_err(&e, "openai_request_parse_tokenize");
    } else {
      int one = (prompt != NULL) != (render != NULL);
      int rbad = one && render ? fuzz_openai_render(render, agp) : 0;
      free(model);
      free(prompt);
      json_decref(render);
      if (!one) free(body);
      FUZZ_CHECK(one, "parse_tokenize set %s of prompt/render", prompt ? "both" : "neither");
      rc = rbad;
    }
  } else {
    char *model = NULL;
    int32_t *ids = NULL;
    int n = -1;
    openai_error e;
    memset(&e, 0, sizeof e);
    if (openai_request_parse_detokenize(body, len, &model, &ids, &n, &e) != 0) {
      rc = fuzz_openai_check_err(&e, "openai_request_parse_detokenize");
    } else {
      free(model);
      free(ids);
      if (n < 0) free(body);
      FUZZ_CHECK(n >= 0, "parse_detokenize gave %d ids", n);
    }
  }
  free(body);
  return rc;
}

#ifndef FUZZ_REGRESSION
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_openai_request_one(data, size);
  return 0;
}
#endif
