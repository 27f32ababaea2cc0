/* Unit tests of the OpenAI request parser and the response helpers (no server, no model). */
#include <jansson.h>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/openai_stream.h"
#include "base/strbuf.h"
#include "test.h"
#include "tokenizer/chat_parse.h"

static int parse(openai_kind k, const char *body, openai_request *r, openai_error *e) {
  return openai_request_parse(k, body, strlen(body), r, e);
}

/* Expects a 400 whose param is `param` (NULL: don't care). */
static int rejects(openai_kind k, const char *body, int status, const char *param) {
  openai_request r;
  openai_error e;
  memset(&e, 0, sizeof e);
  if (parse(k, body, &r, &e) == 0) {
    openai_request_free(&r);
    return 0;
  }
  if (e.status != status) return 0;
  if (param && strcmp(e.param, param)) return 0;
  return e.message[0] != 0;
}

TEST(chat_defaults) {
  openai_request r;
  openai_error e;
  REQUIRE(parse(OPENAI_KIND_CHAT,
                "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r,
                &e) == 0);
  EXPECT_STR(r.model, "m");
  EXPECT_EQ_INT(r.n, 1);
  EXPECT_EQ_INT(r.stream, 0);
  EXPECT_EQ_INT(r.max_tokens, 0);
  EXPECT(r.sp.temperature == 1.0f);
  EXPECT(r.sp.top_p == 1.0f);
  EXPECT_EQ_INT(r.sp.top_k, 0);
  EXPECT(r.sp.repetition_penalty == 1.0f);
  EXPECT_EQ_INT(r.skip_special_tokens, 1);
  EXPECT_EQ_INT(r.add_generation_prompt, 1);
  EXPECT_EQ_INT(r.tool_choice, OPENAI_TOOL_CHOICE_AUTO);
  EXPECT(r.tools == NULL);
  const json_t *m = json_array_get(json_object_get(r.render, "messages"), 0);
  EXPECT_STR(json_string_value(json_object_get(m, "content")), "hi");
  openai_request_free(&r);
}

TEST(chat_all_fields) {
  const char *body =
      "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
      "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"q\"}],"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":7,"
      "\"max_tokens\":99,\"temperature\":0,\"top_p\":0.5,\"top_k\":3,\"min_p\":0.1,"
      "\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"seed\":42,"
      "\"stop\":[\"END\",\"\"],\"stop_token_ids\":[5,6],\"ignore_eos\":true,\"n\":3,\"min_tokens\":"
      "2,"
      "\"logprobs\":true,\"top_logprobs\":3,\"cache_salt\":\"t1\","
      "\"chat_template_kwargs\":{\"enable_thinking\":false},"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{}}}],"
      "\"tool_choice\":\"auto\"}"; /* a forced one is refused with n > 1 (test_tool_choice) */
  openai_request r;
  openai_error e;
  REQUIRE(parse(OPENAI_KIND_CHAT, body, &r, &e) == 0);
  EXPECT_EQ_INT(r.stream, 1);
  EXPECT_EQ_INT(r.n, 3);
  EXPECT_EQ_INT(r.sp.min_tokens, 2);
  EXPECT_EQ_INT(r.include_usage, 1);
  EXPECT_EQ_INT(r.max_tokens, 7);
  EXPECT(r.sp.temperature == 0.0f);
  EXPECT(r.sp.top_p == 0.5f);
  EXPECT_EQ_INT(r.sp.top_k, 3);
  EXPECT(fabsf(r.sp.min_p - 0.1f) < 1e-6f);
  EXPECT(r.sp.presence_penalty == 0.5f);
  EXPECT(r.sp.frequency_penalty == -0.5f);
  EXPECT(fabsf(r.sp.repetition_penalty - 1.1f) < 1e-6f);
  EXPECT_EQ_INT(r.sp.has_seed, 1);
  EXPECT_EQ_INT(r.sp.seed, 42);
  EXPECT_EQ_INT(r.n_stop, 1); /* empty strings dropped */
  EXPECT_STR(r.stop[0], "END");
  EXPECT_EQ_INT(r.sp.n_stop_ids, 2);
  EXPECT_EQ_INT(r.sp.stop_ids[1], 6);
  EXPECT_EQ_INT(r.sp.ignore_eos, 1);
  EXPECT_EQ_INT(r.sp.logprobs, 1);
  EXPECT_EQ_INT(r.sp.top_logprobs, 3);
  EXPECT_STR(r.cache_salt, "t1");
  EXPECT_EQ_INT(r.tool_choice, OPENAI_TOOL_CHOICE_AUTO);
  EXPECT(r.tools != NULL && json_array_size(r.tools) == 1);
  const json_t *m0 = json_array_get(json_object_get(r.render, "messages"), 0);
  EXPECT_STR(json_string_value(json_object_get(m0, "role")), "system");
  EXPECT_STR(json_string_value(json_object_get(m0, "content")), "ab");
  EXPECT(json_is_false(
      json_object_get(json_object_get(r.render, "chat_template_kwargs"), "enable_thinking")));
  openai_request_free(&r);
}

TEST(tool_choice_none_drops_tools) {
  openai_request r;
  openai_error e;
  REQUIRE(parse(OPENAI_KIND_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
                &r, &e) == 0);
  EXPECT_EQ_INT(r.tool_choice, OPENAI_TOOL_CHOICE_NONE);
  EXPECT(r.tools == NULL);
  EXPECT(json_object_get(r.render, "tools") == NULL);
  openai_request_free(&r);
  REQUIRE(
      parse(OPENAI_KIND_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
            &r, &e) == 0);
  EXPECT_EQ_INT(r.tool_choice, OPENAI_TOOL_CHOICE_REQUIRED);
  EXPECT(json_object_get(r.render, "tools") != NULL);
  openai_request_free(&r);
}

TEST(chat_errors) {
  const openai_kind C = OPENAI_KIND_CHAT;
  EXPECT(rejects(C, "{not json", 400, NULL));
  EXPECT(rejects(C, "[1,2]", 400, NULL));
  EXPECT(rejects(C, "{}", 400, "messages"));
  EXPECT(rejects(C, "{\"messages\":[]}", 400, "messages"));
  EXPECT(rejects(C, "{\"messages\":\"hi\"}", 400, "messages"));
  EXPECT(rejects(C, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
                 "messages[0].role"));
  EXPECT(rejects(C, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"));
  EXPECT(rejects(C, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content"));
  EXPECT(
      rejects(C, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content"));
  EXPECT(rejects(C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
                 400, "messages[0].content"));
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
  EXPECT(rejects(C, "{" M ",\"model\":5}", 400, "model"));
  EXPECT(rejects(C, "{" M ",\"temperature\":-1}", 400, "temperature"));
  EXPECT(rejects(C, "{" M ",\"temperature\":\"hot\"}", 400, "temperature"));
  EXPECT(rejects(C, "{" M ",\"top_p\":1.5}", 400, "top_p"));
  EXPECT(rejects(C, "{" M ",\"top_p\":0}", 400, "top_p"));
  EXPECT(rejects(C, "{" M ",\"top_k\":2.5}", 400, "top_k"));
  EXPECT(rejects(C, "{" M ",\"min_p\":2}", 400, "min_p"));
  EXPECT(rejects(C, "{" M ",\"presence_penalty\":3}", 400, "presence_penalty"));
  EXPECT(rejects(C, "{" M ",\"repetition_penalty\":0}", 400, "repetition_penalty"));
  /* positive as a double, 0 as the float the sampler gets: refused here, naming the field */
  EXPECT(rejects(C, "{" M ",\"repetition_penalty\":1e-300}", 400, "repetition_penalty"));
  EXPECT(rejects(C, "{" M ",\"top_p\":1e-300}", 400, "top_p"));
  EXPECT(rejects(C, "{" M ",\"max_tokens\":0}", 400, "max_tokens"));
  EXPECT(rejects(C, "{" M ",\"max_tokens\":-5}", 400, "max_tokens"));
  EXPECT(rejects(C, "{" M ",\"max_completion_tokens\":0}", 400, "max_completion_tokens"));
  EXPECT(rejects(C, "{" M ",\"max_tokens\":\"10\"}", 400, "max_tokens"));
  EXPECT(rejects(C, "{" M ",\"n\":0}", 400, "n"));
  EXPECT(rejects(C, "{" M ",\"n\":65}", 400, "n"));
  EXPECT(rejects(C, "{" M ",\"n\":1.5}", 400, "n"));
  EXPECT(rejects(C, "{" M ",\"best_of\":3}", 400, "best_of"));
  /* fields that would change the output are refused by name, never ignored */
  EXPECT(rejects(C, "{" M ",\"min_tokens\":-1}", 400, "min_tokens"));
  EXPECT(rejects(C, "{" M ",\"min_tokens\":2,\"response_format\":{\"type\":\"json_object\"}}", 400,
                 "min_tokens"));
  EXPECT(rejects(C, "{" M ",\"prompt_logprobs\":1}", 400, "prompt_logprobs"));
  EXPECT(rejects(C, "{" M ",\"guided_json\":{}}", 400, "guided_json"));
  EXPECT(rejects(C, "{" M ",\"guided_choice\":[\"a\"]}", 400, "guided_choice"));
  EXPECT(rejects(C, "{" M ",\"use_beam_search\":true}", 400, "use_beam_search"));
  EXPECT(rejects(C, "{" M ",\"bad_words\":[\"x\"]}", 400, "bad_words"));
  EXPECT(rejects(C, "{" M ",\"functions\":[{\"name\":\"f\"}]}", 400, "functions"));
  EXPECT(rejects(C, "{" M ",\"function_call\":\"auto\"}", 400, "function_call"));
  EXPECT(rejects(C, "{" M ",\"modalities\":[\"text\",\"audio\"]}", 400, "modalities"));
  EXPECT(rejects(C, "{" M ",\"audio\":{\"voice\":\"x\"}}", 400, "audio"));
  {
    /* ...but their no-op values, and fields that change nothing generated, are accepted */
    const char *ok[] = {"{" M
                        ",\"min_tokens\":0,\"use_beam_search\":false,\"bad_words\":[],"
                        "\"prompt_logprobs\":null,\"functions\":[],\"function_call\":\"none\","
                        "\"modalities\":[\"text\"]}",
                        "{" M
                        ",\"user\":\"u\",\"metadata\":{\"a\":\"b\"},\"store\":false,"
                        "\"service_tier\":\"auto\",\"parallel_tool_calls\":true}"};
    for (int i = 0; i < 2; i++) {
      openai_request r;
      openai_error e;
      int rc = parse(C, ok[i], &r, &e);
      EXPECT_MSG(rc == 0, "accepted body %d refused: %s", i, e.message);
      if (rc == 0) openai_request_free(&r);
    }
  }
  EXPECT(rejects(C, "{" M ",\"stream\":\"yes\"}", 400, "stream"));
  EXPECT(rejects(C, "{" M ",\"stop\":5}", 400, "stop"));
  EXPECT(rejects(C, "{" M ",\"stop\":[\"a\",1]}", 400, "stop"));
  EXPECT(rejects(C, "{" M ",\"stop_token_ids\":[-1]}", 400, "stop_token_ids"));
  EXPECT(rejects(C, "{" M ",\"top_logprobs\":3}", 400, "top_logprobs"));
  EXPECT(rejects(C, "{" M ",\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs"));
  EXPECT(rejects(C, "{" M ",\"seed\":1.5}", 400, "seed"));
  EXPECT(rejects(C, "{" M ",\"cache_salt\":\"\"}", 400, "cache_salt"));
  EXPECT(rejects(C, "{" M ",\"tools\":{}}", 400, "tools"));
  EXPECT(rejects(C, "{" M ",\"tools\":[{\"type\":\"function\"}]}", 400, "tools[0]"));
  EXPECT(rejects(C, "{" M ",\"tool_choice\":\"maybe\"}", 400, "tool_choice"));
  EXPECT(rejects(C, "{" M ",\"tool_choice\":\"required\"}", 400, "tool_choice"));
  EXPECT(rejects(C,
                 "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
                 400, "tool_choice"));
  EXPECT(rejects(C, "{" M ",\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}", 400,
                 "chat_template_kwargs"));
  EXPECT(rejects(C, "{" M ",\"a\":1,\"a\":2}", 400, NULL)); /* duplicate keys */
  EXPECT(rejects(C, "{" M ",\"response_format\":{\"type\":\"grammar\"}}", 400, "response_format"));
  EXPECT(rejects(C, "{" M ",\"response_format\":{\"type\":7}}", 400, "response_format"));
  EXPECT(rejects(C, "{" M ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}",
                 400, "response_format"));
  EXPECT(rejects(C, "{" M ",\"response_format\":\"text\"}", 400, "response_format"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":[1]}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"07\":5}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"-1\":5}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"x\":5}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"\":5}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"99999999999\":5}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"7\":101}}", 400, "logit_bias"));
  EXPECT(rejects(C, "{" M ",\"logit_bias\":{\"7\":\"5\"}}", 400, "logit_bias"));
#undef M
}

/* response_format's default (text) is accepted, json_object sets the JSON-object constraint;
 * logit_bias maps token ids to biases. */
TEST(chat_format_and_bias) {
  openai_request r;
  openai_error e;
  const char *plain[2] = {
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{}}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
      "\"response_format\":null,\"logit_bias\":null}"};
  for (int i = 0; i < 2; i++) {
    REQUIRE(parse(OPENAI_KIND_CHAT, plain[i], &r, &e) == 0);
    EXPECT_EQ_INT(r.sp.n_bias, 0);
    EXPECT_EQ_INT(r.json_object, 0);
    openai_request_free(&r);
  }
  const char *json[2] = {("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                          "\"response_format\":{\"type\":\"json_object\"}}"),
                         ("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}")};
  for (int i = 0; i < 2; i++) {
    REQUIRE(parse(i ? OPENAI_KIND_COMPLETION : OPENAI_KIND_CHAT, json[i], &r, &e) == 0);
    EXPECT_EQ_INT(r.json_object, 1);
    if (i == 0) { /* chat: rendered with thinking off (the mask admits no think tags) */
      const json_t *kw = json_object_get(r.render, "chat_template_kwargs");
      EXPECT(json_is_false(json_object_get(kw, "enable_thinking")));
    }
    openai_request_free(&r);
  }
  /* json_schema: compiled at parse time; what the compiler refuses is a 400 naming the field */
  REQUIRE(parse(OPENAI_KIND_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":"
                "{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}}",
                &r, &e) == 0);
  EXPECT(r.json_object == 1 && r.schema != NULL);
  openai_request_free(&r);
  EXPECT(r.schema == NULL);
  /* a compiled schema is one request's state: several choices under one are refused */
  EXPECT(rejects(OPENAI_KIND_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2,"
                 "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                 "{\"type\":\"object\"}}}}",
                 400, "n"));
  const char *bad_schema[] = {
      ("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}"),
      ("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
       "{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
       "\"format\":\"hostname\"}}}}}}"),
      ("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
       "{\"schema\":{\"type\":\"string\"}}}}")};
  for (int i = 0; i < 3; i++) {
    EXPECT(parse(OPENAI_KIND_COMPLETION, bad_schema[i], &r, &e) != 0);
    EXPECT_EQ_INT(e.status, 400);
    EXPECT_STR(e.param, "response_format");
    if (i == 1) EXPECT(strstr(e.message, "format") != NULL);
  }
  /* ...unless the client chose */
  REQUIRE(parse(OPENAI_KIND_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"response_format\":{\"type\":\"json_object\"},"
                "\"chat_template_kwargs\":{\"enable_thinking\":true,\"k\":1}}",
                &r, &e) == 0);
  const json_t *kw = json_object_get(r.render, "chat_template_kwargs");
  EXPECT(json_is_true(json_object_get(kw, "enable_thinking")));
  EXPECT(json_integer_value(json_object_get(kw, "k")) == 1);
  openai_request_free(&r);
  REQUIRE(parse(OPENAI_KIND_COMPLETION,
                "{\"prompt\":\"x\",\"logit_bias\":{\"0\":-100,\"151643\":2.5,\"7\":100}}", &r,
                &e) == 0);
  REQUIRE(r.sp.n_bias == 3);
  int seen = 0;
  for (int i = 0; i < 3; i++) {
    if (r.sp.bias_ids[i] == 0 && r.sp.bias[i] == -100.0f) seen |= 1;
    if (r.sp.bias_ids[i] == 151643 && r.sp.bias[i] == 2.5f) seen |= 2;
    if (r.sp.bias_ids[i] == 7 && r.sp.bias[i] == 100.0f) seen |= 4;
  }
  EXPECT_EQ_INT(seen, 7);
  openai_request_free(&r);
}

TEST(completion_prompts) {
  openai_request r;
  openai_error e;
  REQUIRE(parse(OPENAI_KIND_COMPLETION, "{\"prompt\":\"hello\",\"echo\":true,\"logprobs\":2}", &r,
                &e) == 0);
  EXPECT_STR(r.prompt, "hello");
  EXPECT_EQ_INT(r.prompt_len, 5);
  EXPECT_EQ_INT(r.echo, 1);
  EXPECT_EQ_INT(r.sp.logprobs, 1);
  EXPECT_EQ_INT(r.sp.top_logprobs, 2);
  openai_request_free(&r);
  REQUIRE(parse(OPENAI_KIND_COMPLETION,
                "{\"prompt\":[1,2,3],\"return_token_ids\":true,\"max_tokens\":4}", &r, &e) == 0);
  EXPECT(r.prompt == NULL);
  EXPECT_EQ_INT(r.n_prompt_ids, 3);
  EXPECT_EQ_INT(r.prompt_ids[2], 3);
  EXPECT_EQ_INT(r.return_token_ids, 1);
  EXPECT_EQ_INT(r.max_tokens, 4);
  openai_request_free(&r);
  REQUIRE(parse(OPENAI_KIND_COMPLETION, "{\"prompt\":[[7,8]]}", &r, &e) == 0);
  EXPECT_EQ_INT(r.n_prompt_ids, 2);
  openai_request_free(&r);
  REQUIRE(parse(OPENAI_KIND_COMPLETION, "{\"prompt\":[\"one\"]}", &r, &e) == 0);
  EXPECT_STR(r.prompt, "one");
  openai_request_free(&r);
  /* max_completion_tokens belongs to chat only: ignored here */
  REQUIRE(parse(OPENAI_KIND_COMPLETION, "{\"prompt\":\"x\",\"max_completion_tokens\":0}", &r, &e) ==
          0);
  openai_request_free(&r);
}

TEST(completion_errors) {
  const openai_kind P = OPENAI_KIND_COMPLETION;
  EXPECT(rejects(P, "{}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":\"\"}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[1,-2]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[1,\"a\"]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[1,2.5]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[\"a\",\"\"]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[\"a\",[1,-2]]}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":[\"a\",5]}", 400, "prompt"));
  EXPECT(
      rejects(P, "{\"prompt\":\"x\",\"truncate_prompt_tokens\":0}", 400, "truncate_prompt_tokens"));
  EXPECT(rejects(P, "{\"prompt\":\"x\",\"truncate_prompt_tokens\":-2}", 400,
                 "truncate_prompt_tokens"));
  EXPECT(rejects(P, "{\"prompt\":5}", 400, "prompt"));
  EXPECT(rejects(P, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs"));
  EXPECT(rejects(P, "{\"prompt\":\"x\",\"logprobs\":30}", 400, "logprobs"));
  EXPECT(rejects(P, "{\"prompt\":\"x\",\"echo\":1}", 400, "echo"));
  EXPECT(rejects(P, "{\"prompt\":\"x\",\"best_of\":2}", 400, "best_of"));
}

TEST(tokenize_bodies) {
  char *model, *prompt;
  size_t plen;
  json_t *render;
  int agp;
  openai_error e;
  const char *b1 = "{\"model\":\"m\",\"prompt\":\"abc\"}";
  REQUIRE(openai_request_parse_tokenize(b1, strlen(b1), &model, &prompt, &plen, &render, &agp,
                                        &e) == 0);
  EXPECT_STR(model, "m");
  EXPECT_STR(prompt, "abc");
  EXPECT(render == NULL);
  free(model);
  free(prompt);
  const char *b2 =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"add_generation_prompt\":false}";
  REQUIRE(openai_request_parse_tokenize(b2, strlen(b2), &model, &prompt, &plen, &render, &agp,
                                        &e) == 0);
  EXPECT(prompt == NULL && render != NULL && model == NULL);
  EXPECT_EQ_INT(agp, 0);
  json_decref(render);
  const char *b3 = "{\"prompt\":3}";
  EXPECT(openai_request_parse_tokenize(b3, strlen(b3), &model, &prompt, &plen, &render, &agp, &e) ==
         -1);
  EXPECT_EQ_INT(e.status, 400);

  int32_t *ids;
  int n;
  const char *d1 = "{\"tokens\":[1,2,300]}";
  REQUIRE(openai_request_parse_detokenize(d1, strlen(d1), &model, &ids, &n, &e) == 0);
  EXPECT_EQ_INT(n, 3);
  EXPECT_EQ_INT(ids[2], 300);
  free(ids);
  const char *d2 = "{\"tokens\":[1,\"x\"]}";
  EXPECT(openai_request_parse_detokenize(d2, strlen(d2), &model, &ids, &n, &e) == -1);
  EXPECT_STR(e.param, "tokens");
}

TEST(error_body_shape) {
  openai_error e;
  openai_error_set(&e, 404, "not_found_error", "model", "The model `x` does not exist.");
  char *s = openai_response_error_body(&e);
  json_t *j = json_loads(s, 0, NULL);
  REQUIRE(j != NULL);
  json_t *in = json_object_get(j, "error");
  EXPECT_STR(json_string_value(json_object_get(in, "message")), "The model `x` does not exist.");
  EXPECT_STR(json_string_value(json_object_get(in, "type")), "not_found_error");
  EXPECT_STR(json_string_value(json_object_get(in, "param")), "model");
  /* code: a string or null as OpenAI sends it (the openai clients type it string | null) */
  EXPECT(json_is_null(json_object_get(in, "code")));
  json_decref(j);
  free(s);
  e.code = "model_not_found";
  s = openai_response_error_body(&e);
  j = json_loads(s, 0, NULL);
  REQUIRE(j != NULL);
  EXPECT_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
             "model_not_found");
  json_decref(j);
  free(s);
}

TEST(usage_shape) {
  json_t *u = openai_response_usage(10, 3, 8);
  EXPECT_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), 13);
  EXPECT_EQ_INT(json_integer_value(
                    json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")),
                8);
  json_decref(u);
}

TEST(utf8_helpers) {
  EXPECT_EQ_INT(openai_response_utf8_complete("ab", 2), 2);
  EXPECT_EQ_INT(openai_response_utf8_complete("a\xe4\xb8", 3), 1);
  EXPECT_EQ_INT(openai_response_utf8_complete("a\xe4\xb8\xad", 4), 4);
  EXPECT_EQ_INT(openai_response_utf8_complete("\xf0\x9f\x98", 3), 0);
  json_t *s = openai_response_string("a\xe4\xb8", 3);
  REQUIRE(s != NULL);
  EXPECT_STR(json_string_value(s), "a\xef\xbf\xbd\xef\xbf\xbd");
  json_decref(s);
  json_t *lp = openai_response_chat_logprob("\xe4", 1, -0.5f, NULL, NULL, NULL, 0);
  EXPECT_EQ_INT(json_integer_value(json_array_get(json_object_get(lp, "bytes"), 0)), 0xe4);
  json_decref(lp);
  char id1[64], id2[64];
  openai_response_new_id(id1, sizeof id1, "chatcmpl-");
  openai_response_new_id(id2, sizeof id2, "chatcmpl-");
  EXPECT(strncmp(id1, "chatcmpl-", 9) == 0 && strcmp(id1, id2) != 0);
}

/* Feeds `text` to openai_stream cut at cuts[0..n_cuts) (increasing, inside the text; equal
 * cuts are steps with nothing new) and
 * checks that the concatenated deltas say exactly what chat_parse says about the whole text:
 * reasoning, content, and tool calls streamed the OpenAI way (per call: a first delta with
 * index, id, type, function.name and arguments "", then argument pieces). */
static int stream_cuts_match_parse(const char *text, int thinking_open, const json_t *tools,
                                   const size_t *cuts, int n_cuts, char *why, size_t whylen) {
  openai_stream st;
  openai_stream_init(&st, thinking_open, tools);
  strbuf r, c;
  strbuf_init(&r);
  strbuf_init(&c);
  json_t *calls = json_array(); /* assembled: [{"id","name","arguments"}] */
  size_t len = strlen(text);
  int ok = 1;
  for (int k = 0; ok && k <= n_cuts; k++) {
    int final = k == n_cuts;
    json_t *ds = NULL;
    if (openai_stream_deltas(&st, text, final ? len : cuts[k], final, &ds)) {
      snprintf(why, whylen, "openai_stream_deltas failed");
      ok = 0;
      break;
    }
    size_t i;
    json_t *d;
    json_array_foreach(ds, i, d) {
      const json_t *x = json_object_get(d, "reasoning_content");
      if (x) strbuf_puts(&r, json_string_value(x));
      x = json_object_get(d, "content");
      if (x) strbuf_puts(&c, json_string_value(x));
      x = json_object_get(d, "tool_calls");
      if (x && json_array_size(x) != 1)
        ok = 0, snprintf(why, whylen, "one tool call per delta expected");
      const json_t *tc = json_array_get(x, 0);
      if (!tc) continue;
      size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
      const json_t *fn = json_object_get(tc, "function");
      const char *args = json_string_value(json_object_get(fn, "arguments"));
      if (!json_is_integer(json_object_get(tc, "index")) || !args) {
        ok = 0, snprintf(why, whylen, "tool call delta without index or arguments");
        continue;
      }
      if (idx == json_array_size(calls)) { /* the first delta of a call */
        const char *id = json_string_value(json_object_get(tc, "id"));
        const char *type = json_string_value(json_object_get(tc, "type"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!id || !id[0] || !type || strcmp(type, "function") || !name || args[0])
          ok = 0,
          snprintf(why, whylen, "first delta of call %zu lacks id/type/name or has arguments", idx);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:s}", "id", id ? id : "", "name",
                                               name ? name : "", "arguments", ""));
      } else if (idx + 1 == json_array_size(calls)) { /* argument pieces */
        if (json_object_get(tc, "id") || json_object_get(fn, "name"))
          ok = 0, snprintf(why, whylen, "an argument delta of call %zu repeats id or name", idx);
        json_t *a = json_array_get(calls, idx);
        char *joined = NULL;
        if (asprintf(&joined, "%s%s", json_string_value(json_object_get(a, "arguments")), args) < 0)
          joined = NULL;
        json_object_set_new(a, "arguments", json_string(joined ? joined : ""));
        free(joined);
      } else {
        ok = 0, snprintf(why, whylen, "tool call index %zu out of order", idx);
      }
    }
    json_decref(ds);
  }
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (ok && chat_parse(text, thinking_open, tools, &p) == 0) {
    const char *er = p.reasoning_content ? p.reasoning_content : "";
    const char *ec = p.content ? p.content : "";
    if (strcmp(r.data ? r.data : "", er))
      ok = 0, snprintf(why, whylen, "reasoning \"%s\" != \"%s\"", r.data ? r.data : "", er);
    else if (strcmp(c.data ? c.data : "", ec))
      ok = 0, snprintf(why, whylen, "content \"%s\" != \"%s\"", c.data ? c.data : "", ec);
    size_t ne = p.tool_calls ? json_array_size(p.tool_calls) : 0;
    size_t ng = json_array_size(calls);
    if (ok && ne != ng)
      ok = 0, snprintf(why, whylen, "%zu tool calls streamed, %zu parsed", ng, ne);
    for (size_t i = 0; ok && i < ne; i++) {
      const json_t *a = json_object_get(json_array_get(p.tool_calls, i), "function");
      const json_t *b = json_array_get(calls, i);
      if (!json_equal(json_object_get(a, "name"), json_object_get(b, "name")) ||
          !json_equal(json_object_get(a, "arguments"), json_object_get(b, "arguments")))
        ok = 0, snprintf(why, whylen, "tool call %zu differs", i);
    }
    chat_parsed_free(&p);
  }
  json_decref(calls);
  strbuf_free(&r);
  strbuf_free(&c);
  openai_stream_free(&st);
  return ok;
}

/* Pieces of `step` bytes. */
static int stream_matches_parse(const char *text, int thinking_open, const json_t *tools,
                                size_t step, char *why, size_t whylen) {
  size_t cuts[4096];
  int n = 0;
  for (size_t at = step; at < strlen(text) && n < 4096; at += step) cuts[n++] = at;
  return stream_cuts_match_parse(text, thinking_open, tools, cuts, n, why, whylen);
}

TEST(stream_split_matches_parse) {
  static const struct {
    const char *text;
    int open;
  } cases[] = {
      {"I think so.\n</think>\n\nThe answer is 4.", 1},
      {"<think>\nhmm, let me see\n</think>\n\nHello world", 0},
      {"Plain answer with no reasoning at all.", 0},
      {"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       0},
      {"need "
       "weather\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</"
       "parameter>\n"
       "</function>\n</tool_call>",
       1},
      {"<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
       "\"b\", "
       "\"arguments\": {\"x\": 1}}\n</tool_call>",
       0},
      {"text with < and </thin but no tag", 0},
      /* the model opens its own <think> (Qwen3): newlines and whitespace around it */
      {"\n<think>\nabc</think>x", 0},
      {"\n<think>\nabc</think>x", 1},
      {"<think>\n\nOkay, the user\nasks.\n\n</think>\n\nHello", 0},
      {"<think>\n\nOkay, the user\nasks.\n\n</think>\n\nHello", 1},
      {"  <think>\nr \n</think>\n\n c ", 0},
      {"<think>\n</think>\n\nHi", 0},
      {"<think>\nnever closed\n\n", 0},
      {"<think>\nweather?\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": "
       "{\"city\": \"Paris\"}}\n</tool_call>\nDone.",
       0},
      {"<thinking is not a tag", 0},
      {"\xe4\xbd\xa0\xe5\xa5\xbd <think> later", 0},
  };
  json_t *tools = json_loads(
      "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]",
      0, NULL);
  REQUIRE(tools != NULL);
  char why[300];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (size_t step = 1; step <= 7; step++)
      EXPECT_MSG(stream_matches_parse(cases[i].text, cases[i].open, tools, step, why, sizeof why),
                 "case %zu step %zu: %s", i, step, why);
  /* random cuts (tokens are 1..6 bytes), a fixed LCG so a failure repeats */
  unsigned x = 12345;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int trial = 0; trial < 300; trial++) {
      size_t cuts[512], len = strlen(cases[i].text), at = 0;
      int n = 0;
      for (;;) {
        x = x * 1103515245u + 12345u;
        at += 1 + (x >> 16) % 6;
        if (at >= len || n == 512) break;
        cuts[n++] = at;
      }
      if (!stream_cuts_match_parse(cases[i].text, cases[i].open, tools, cuts, n, why, sizeof why)) {
        EXPECT_MSG(0, "case %zu random trial %d: %s", i, trial, why);
        break;
      }
    }
  json_decref(tools);
}

/* The property: for random outputs (text, multi-byte characters, whitespace, <think> and
 * </think> anywhere, complete and cut tags, tool-call blocks with valid and invalid JSON or
 * XML bodies, closed or not) cut at random byte boundaries, with and without an open think
 * block from the prompt, the streamed deltas concatenate to the non-streamed result. */
TEST(stream_random_outputs_match_parse) {
  static const char *pieces[] = {
      "Hello",
      " world",
      "\n",
      "\n\n",
      " ",
      "\t",
      "\xc3\xa9",
      "\xe4\xbd\xa0\xe5\xa5\xbd",
      "\xf0\x9f\x98\x80",
      "<think>",
      "</think>",
      "<think",
      "</thi",
      "<",
      "</",
      "<tool_call>",
      "</tool_call>",
      "<tool_c",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n</tool_call>",
      "<tool_call>{\"name\": \"g\"}</tool_call>",
      "<tool_call>\n{\"name\": \"broken\", \"arguments\": {</tool_call>",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
      "<tool_call>not json at all</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
      "</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>",
      "<tool_call>\n{\"name\": \"open\", \"arguments\": {}}",
      "{\"name\": \"x\", \"arguments\": {}}",
  };
  const int np = (int)(sizeof pieces / sizeof pieces[0]);
  json_t *tools = json_loads(
      "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]",
      0, NULL);
  REQUIRE(tools != NULL);
  unsigned long long x = 0x2545f4914f6cdd1dULL;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
  char text[2048], why[300];
  int bad = 0;
  for (int it = 0; it < 6000 && !bad; it++) {
    size_t len = 0;
    int k = (int)(NEXT() % 16);
    for (int j = 0; j < k; j++) {
      const char *pc = pieces[NEXT() % (unsigned long long)np];
      size_t pl = strlen(pc);
      if (len + pl >= sizeof text) break;
      memcpy(text + len, pc, pl);
      len += pl;
    }
    text[len] = 0;
    int open = (int)(NEXT() & 1);
    const json_t *t = (NEXT() & 1) ? tools : NULL;
    for (int trial = 0; trial < 4 && !bad; trial++) {
      size_t cuts[2048], at = 0;
      int n = 0;
      for (;;) { /* pieces of 0..7 bytes: any byte boundary, empty steps too */
        at += NEXT() % (trial == 0 ? 2 : 8);
        if (at >= len) break;
        cuts[n++] = at;
      }
      if (!stream_cuts_match_parse(text, open, t, cuts, n, why, sizeof why)) {
        EXPECT_MSG(0, "open=%d text \"%.150s\": %.200s", open, text, why);
        bad = 1;
      }
    }
  }
#undef NEXT
  json_decref(tools);
}

TEST(stream_thinking_open_detect) {
  EXPECT(openai_stream_prompt_thinking_open("<|im_start|>assistant\n<think>\n", 30));
  const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT(!openai_stream_prompt_thinking_open(closed, strlen(closed)));
  EXPECT(!openai_stream_prompt_thinking_open("x", 1));
}

TEST(completion_prompt_list) {
  openai_request r;
  openai_error e;
  const char *body =
      "{\"prompt\":[\"ab\",[5,6],\"c\"],\"n\":2,\"truncate_prompt_tokens\":7,"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true,"
      "\"continuous_usage_stats\":true}}";
  REQUIRE(parse(OPENAI_KIND_COMPLETION, body, &r, &e) == 0);
  EXPECT_STR(r.prompt, "ab");
  EXPECT_EQ_INT(r.n_more_prompts, 2);
  EXPECT_EQ_INT(r.more_prompts[0].n_ids, 2);
  EXPECT_EQ_INT(r.more_prompts[0].ids[1], 6);
  EXPECT_STR(r.more_prompts[1].text, "c");
  EXPECT_EQ_INT(r.truncate_prompt_tokens, 7);
  EXPECT_EQ_INT(r.continuous_usage, 1);
  openai_request_free(&r);
  /* a bare id array is one prompt; a batch of one is that prompt */
  REQUIRE(parse(OPENAI_KIND_COMPLETION, "{\"prompt\":[[1,2]]}", &r, &e) == 0);
  EXPECT_EQ_INT(r.n_prompt_ids, 2);
  EXPECT_EQ_INT(r.n_more_prompts, 0);
  openai_request_free(&r);
  /* prompts x n over the choice limit */
  strbuf b;
  strbuf_init(&b);
  strbuf_puts(&b, "{\"n\":2,\"prompt\":[");
  for (int i = 0; i < OPENAI_MAX_CHOICES / 2 + 1; i++) strbuf_puts(&b, i ? ",\"x\"" : "\"x\"");
  strbuf_puts(&b, "]}");
  EXPECT(rejects(OPENAI_KIND_COMPLETION, b.data, 400, "n"));
  strbuf_free(&b);
}

int main(void) {
  RUN(chat_defaults);
  RUN(chat_all_fields);
  RUN(tool_choice_none_drops_tools);
  RUN(chat_errors);
  RUN(chat_format_and_bias);
  RUN(completion_prompts);
  RUN(completion_errors);
  RUN(completion_prompt_list);
  RUN(tokenize_bodies);
  RUN(error_body_shape);
  RUN(usage_shape);
  RUN(utf8_helpers);
  RUN(stream_split_matches_parse);
  RUN(stream_random_outputs_match_parse);
  RUN(stream_thinking_open_detect);
  TEST_MAIN_END();
}
