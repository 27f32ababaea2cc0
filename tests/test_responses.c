/* Unit tests of the Responses API: the translation of a request into the chat request it
 * means (responses_request), the output items of a canned generation with reasoning and tool
 * calls (responses_response), and the streamed events of the same text fed in pieces
 * (responses_stream), whose final response must carry the non-streamed items. */
#include <jansson.h>

#include "base/strbuf.h"
#include "server/openai_request.h"
#include "server/responses_request.h"
#include "server/responses_response.h"
#include "server/responses_stream.h"
#include "test.h"
#include "tokenizer/chat_parse.h"

/* EXPECT_STR for long texts (the message shows their start) */
#define EXPECT_TEXT(a, b) EXPECT_MSG(strcmp((a), (b)) == 0, "got %.200s", (a))

static int parse(const char *body, responses_request *r, openai_error *e) {
  return responses_request_parse(body, strlen(body), r, e);
}

/* The chat body of a Responses body, as compact JSON with sorted keys (caller frees). */
static char *chat_of(const char *body) {
  responses_request r;
  openai_error e;
  if (parse(body, &r, &e)) {
    fprintf(stderr, "unexpected error: %s\n", e.message);
    return NULL;
  }
  char *s = json_dumps(r.chat, JSON_COMPACT | JSON_SORT_KEYS);
  responses_request_free(&r);
  return s;
}

/* Expects a 400 naming param whose message holds word. */
static int refuses(const char *body, const char *param, const char *word) {
  responses_request r;
  openai_error e;
  memset(&e, 0, sizeof e);
  if (parse(body, &r, &e) == 0) {
    responses_request_free(&r);
    return 0;
  }
  return e.status == 400 && !strcmp(e.param, param) && strstr(e.message, word) != NULL;
}

TEST(string_input_and_instructions) {
  char *c = chat_of(
      "{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be brief\","
      "\"max_output_tokens\":5,\"temperature\":0.5,\"top_p\":0.9}");
  REQUIRE(c != NULL);
  EXPECT_TEXT(c,
              "{\"max_completion_tokens\":5,\"messages\":[{\"content\":\"be brief\",\"role\":"
              "\"system\"},{\"content\":\"hi\",\"role\":\"user\"}],\"model\":\"m\",\"temperature\":"
              "0.5,\"top_p\":0.90000000000000002}");
  free(c);
}

TEST(items_translate) {
  char *c = chat_of(
      "{\"input\":[{\"role\":\"developer\",\"content\":\"dev\"},"
      "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
      "\"a\"},"
      "{\"type\":\"input_text\",\"text\":\"b\"}]},"
      "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":"
      "\"S\"}]},"
      "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}"
      "\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"r1\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\","
      "\"text\":\"r2\"}]},"
      "{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"R\"}]},"
      "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
      "\"text\":"
      "\"done\"}]}],"
      "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":"
      "{\"type\":\"object\"},\"strict\":true}],\"tool_choice\":\"auto\","
      "\"reasoning\":{\"effort\":\"minimal\"},"
      "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":"
      "\"object\"},\"strict\":true}},\"store\":false,\"stream\":true,\"metadata\":{\"a\":\"b\"}}");
  REQUIRE(c != NULL);
  EXPECT_TEXT(
      c,
      "{\"chat_template_kwargs\":{\"enable_thinking\":false},\"messages\":["
      "{\"content\":\"dev\",\"role\":\"system\"},{\"content\":\"ab\",\"role\":\"user\"},"
      "{\"content\":\"\",\"reasoning_content\":\"S\",\"role\":\"assistant\",\"tool_calls\":["
      "{\"function\":{\"arguments\":\"{}\",\"name\":\"f\"},\"id\":\"c1\",\"type\":\"function\"},"
      "{\"function\":{\"arguments\":\"{\\\"x\\\":1}\",\"name\":\"g\"},\"id\":\"c2\",\"type\":"
      "\"function\"}]},"
      "{\"content\":\"r1\",\"role\":\"tool\",\"tool_call_id\":\"c1\"},"
      "{\"content\":\"r2\",\"role\":\"tool\",\"tool_call_id\":\"c2\"},"
      "{\"content\":\"done\",\"reasoning_content\":\"R\",\"role\":\"assistant\"}],"
      "\"response_format\":{\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"},"
      "\"strict\":true},\"type\":\"json_schema\"},\"stream\":true,\"tool_choice\":\"auto\","
      "\"tools\":[{\"function\":{\"description\":\"d\",\"name\":\"f\",\"parameters\":{\"type\":"
      "\"object\"},\"strict\":true},\"type\":\"function\"}]}");
  free(c);
  /* effort on -> thinking on; json_object */
  c = chat_of(
      "{\"input\":\"x\",\"reasoning\":{\"effort\":\"high\"},\"text\":{\"format\":{\"type\":"
      "\"json_object\"}}}");
  REQUIRE(c != NULL);
  EXPECT(strstr(c, "\"enable_thinking\":true") != NULL);
  EXPECT(strstr(c, "\"response_format\":{\"type\":\"json_object\"}") != NULL);
  free(c);
}

/* The translated body is a valid chat request: the chat parser takes it. */
TEST(translation_parses_as_chat) {
  responses_request r;
  openai_error e;
  REQUIRE(
      parse("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"function_call\","
            "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
            "\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}],\"tools\":[{\"type\":"
            "\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],"
            "\"max_output_tokens\":7,\"parallel_tool_calls\":false}",
            &r, &e) == 0);
  EXPECT_EQ_INT(r.parallel_tool_calls, 0);
  char *s = json_dumps(r.chat, JSON_COMPACT);
  openai_request q;
  EXPECT(openai_request_parse(OPENAI_KIND_CHAT, s, strlen(s), &q, &e) == 0);
  if (!test_cur_failed) {
    EXPECT_EQ_INT(q.max_tokens, 7);
    EXPECT(q.tools != NULL);
    openai_request_free(&q);
  }
  free(s);
  /* the echo fields */
  EXPECT(json_is_false(json_object_get(r.echo, "parallel_tool_calls")));
  EXPECT_STR(json_string_value(json_object_get(r.echo, "tool_choice")), "auto");
  EXPECT_EQ_INT(json_integer_value(json_object_get(r.echo, "max_output_tokens")), 7);
  EXPECT_STR(json_string_value(
                 json_object_get(json_array_get(json_object_get(r.echo, "tools"), 0), "name")),
             "f");
  responses_request_free(&r);
}

TEST(refusals) {
  EXPECT(refuses("{\"input\":\"x\",\"store\":true}", "store", "stateless"));
  EXPECT(refuses("{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id",
                 "stateless"));
  EXPECT(refuses("{\"input\":\"x\",\"conversation\":\"c\"}", "conversation", "stateless"));
  EXPECT(refuses("{\"input\":\"x\",\"background\":true}", "background", "stateless"));
  EXPECT(
      refuses("{\"input\":[{\"type\":\"item_reference\",\"id\":\"m\"}]}", "input[0]", "stateless"));
  /* required / named: translated for the chat request's tool-call grammar (test_tool_choice) */
  char *c = chat_of(
      "{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
      "\"parallel_tool_calls\":false,\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}");
  EXPECT_MSG(c && strstr(c, "\"parallel_tool_calls\":false") &&
                 strstr(c, "\"tool_choice\":{\"function\":{\"name\":\"f\"},\"type\":\"function\"}"),
             "%s", c ? c : "(null)");
  free(c);
  c = chat_of(
      "{\"input\":\"x\",\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\","
      "\"name\":\"f\"}]}");
  EXPECT_MSG(c && strstr(c, "\"tool_choice\":\"required\""), "%s", c ? c : "(null)");
  free(c);
  EXPECT(
      refuses("{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\"},"
              "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
              "tool_choice", "must be"));
  EXPECT(refuses("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]",
                 "only function tools"));
  EXPECT(refuses("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
                 "input[0].content", "input_image"));
  EXPECT(refuses("{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0]", "role"));
  EXPECT(refuses("{\"input\":[]}", "input", "non-empty"));
  EXPECT(refuses("{}", "input", "input"));
  EXPECT(refuses("{\"input\":\"x\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort",
                 "effort"));
  EXPECT(
      refuses("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format", "xml"));
  EXPECT(refuses("{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation", "disabled"));
  EXPECT(refuses("{\"input\":\"x\",\"frobnicate\":1}", "frobnicate", "Unknown parameter"));
  EXPECT(refuses("{\"input\":\"x\",\"top_logprobs\":2}", "top_logprobs", "not supported"));
  EXPECT(refuses("{\"input\":\"x\",\"max_tool_calls\":1}", "max_tool_calls", "not supported"));
  EXPECT(refuses("{\"input\":\"x\",\"stream_options\":1}", "stream_options", "object"));
  EXPECT(refuses("[1]", "", "object"));
  EXPECT(refuses("{\"input\":", "", "JSON"));
  /* no-op values of the stateful fields pass */
  responses_request r;
  openai_error e;
  EXPECT(parse("{\"input\":\"x\",\"store\":false,\"previous_response_id\":null,\"background\":"
               "false,\"truncation\":\"disabled\",\"include\":[\"reasoning.encrypted_content\"],"
               "\"prompt_cache_key\":\"k\",\"client_metadata\":{\"a\":\"b\"},"
               "\"max_tool_calls\":null,\"service_tier\":\"auto\",\"safety_identifier\":\"u\"}",
               &r, &e) == 0);
  if (!test_cur_failed) responses_request_free(&r);
}

/* include reasoning.encrypted_content: reasoning items carry their text, which a later input
 * reads back; other include values and a verbosity other than medium are refused */
TEST(include_and_verbosity) {
  EXPECT(refuses("{\"input\":\"x\",\"include\":[\"message.output_text.logprobs\"]}", "include",
                 "not supported"));
  EXPECT(
      refuses("{\"input\":\"x\",\"include\":\"reasoning.encrypted_content\"}", "include", "array"));
  EXPECT(refuses("{\"input\":\"x\",\"text\":{\"verbosity\":\"low\"}}", "text.verbosity",
                 "not supported"));
  EXPECT(
      refuses("{\"input\":\"x\",\"text\":{\"verbosity\":\"loud\"}}", "text.verbosity", "must be"));
  responses_request r;
  openai_error e;
  EXPECT(parse("{\"input\":\"x\",\"text\":{\"verbosity\":\"medium\"},\"include\":["
               "\"reasoning.encrypted_content\"]}",
               &r, &e) == 0);
  EXPECT(r.encrypted_reasoning == 1);
  if (!test_cur_failed) responses_request_free(&r);
  EXPECT(parse("{\"input\":\"x\"}", &r, &e) == 0);
  EXPECT(r.encrypted_reasoning == 0);
  responses_request_free(&r);
  json_t *out = responses_response_output("why so", "ok", NULL, 1, 1);
  const json_t *it = json_array_get(out, 0);
  EXPECT_STR(json_string_value(json_object_get(it, "encrypted_content")), "why so");
  json_decref(out);
  out = responses_response_output("why so", "ok", NULL, 1, 0);
  EXPECT(json_object_get(json_array_get(out, 0), "encrypted_content") == NULL);
  json_decref(out);
  /* the item sent back with only encrypted_content (as Codex does) becomes the reasoning */
  char *c = chat_of(
      "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"reasoning\","
      "\"summary\":[],\"encrypted_content\":\"why so\"},{\"type\":\"message\",\"role\":"
      "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\"}]}]}");
  EXPECT_MSG(c && strstr(c, "\"reasoning_content\":\"why so\""), "%s", c ? c : "(null)");
  free(c);
}

/* a namespace tool's functions become chat tools "NS.NAME"; a call of one splits back into
 * namespace and name, and an input function_call with a namespace joins them again */
TEST(namespace_tools) {
  char *c = chat_of(
      "{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"crm\",\"description\":"
      "\"d\",\"tools\":[{\"type\":\"function\",\"name\":\"find\",\"parameters\":{\"type\":"
      "\"object\"}}]},{\"type\":\"function\",\"name\":\"f\"}]}");
  EXPECT_MSG(c && strstr(c,
                         "\"tools\":[{\"function\":{\"name\":\"crm.find\",\"parameters\":{"
                         "\"type\":\"object\"}},\"type\":\"function\"},{\"function\":{\"name\":"
                         "\"f\"},\"type\":\"function\"}]"),
             "%s", c ? c : "(null)");
  free(c);
  c = chat_of(
      "{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c1\",\"namespace\":\"crm\","
      "\"name\":\"find\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
      "\"c1\",\"output\":\"ok\"}]}");
  EXPECT_MSG(c && strstr(c, "\"name\":\"crm.find\""), "%s", c ? c : "(null)");
  free(c);
  json_t *call = json_pack("{s:s, s:{s:s, s:s}}", "id", "c2", "function", "name", "crm.find",
                           "arguments", "{}");
  json_t *it = responses_response_call_item("fc_1", call, "completed");
  EXPECT_STR(json_string_value(json_object_get(it, "namespace")), "crm");
  EXPECT_STR(json_string_value(json_object_get(it, "name")), "find");
  json_decref(it);
  json_decref(call);
  EXPECT(refuses("{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"a.b\"}]}",
                 "tools[0]", "'.'"));
  EXPECT(
      refuses("{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\","
              "\"tools\":[{\"type\":\"custom\",\"name\":\"g\"}]}]}",
              "tools[0].tools[0]", "custom"));
}

TEST(error_param) {
  openai_error e;
  openai_error_set(&e, 400, NULL, "messages[2].content", "x");
  responses_request_error_param(&e);
  EXPECT_STR(e.param, "input");
  openai_error_set(&e, 400, NULL, "max_completion_tokens", "x");
  responses_request_error_param(&e);
  EXPECT_STR(e.param, "max_output_tokens");
  openai_error_set(&e, 400, NULL, "response_format", "x");
  responses_request_error_param(&e);
  EXPECT_STR(e.param, "text.format");
  openai_error_set(&e, 400, NULL, "temperature", "x");
  responses_request_error_param(&e);
  EXPECT_STR(e.param, "temperature");
}

static const char *GEN =
    "<think>\nplan it\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"f\", "
    "\"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
    "\"arguments\": {}}\n</tool_call>";

/* Items without their ids (which differ between two builds of the same answer). */
static char *items_without_ids(const json_t *items) {
  json_t *c = json_deep_copy(items);
  size_t i;
  json_t *it;
  json_array_foreach(c, i, it) {
    json_object_del(it, "id");
    json_object_del(it, "call_id");
  }
  char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(c);
  return s;
}

static json_t *canned_output(int parallel) {
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (chat_parse(GEN, 0, NULL, &p)) return NULL;
  json_t *out =
      responses_response_output(p.reasoning_content, p.content, p.tool_calls, parallel, 0);
  chat_parsed_free(&p);
  return out;
}

TEST(output_items_of_a_generation) {
  json_t *out = canned_output(1);
  REQUIRE(out != NULL);
  REQUIRE(json_array_size(out) == 4);
  json_t *rs = json_array_get(out, 0), *msg = json_array_get(out, 1), *fc = json_array_get(out, 2);
  EXPECT_STR(json_string_value(json_object_get(rs, "type")), "reasoning");
  EXPECT(!strncmp(json_string_value(json_object_get(rs, "id")), "rs_", 3));
  EXPECT_STR(
      json_string_value(json_object_get(json_array_get(json_object_get(rs, "content"), 0), "text")),
      "plan it");
  EXPECT_STR(json_string_value(json_object_get(msg, "type")), "message");
  EXPECT_STR(json_string_value(json_object_get(msg, "role")), "assistant");
  EXPECT_STR(json_string_value(
                 json_object_get(json_array_get(json_object_get(msg, "content"), 0), "text")),
             "Calling.");
  EXPECT_STR(json_string_value(json_object_get(fc, "type")), "function_call");
  EXPECT_STR(json_string_value(json_object_get(fc, "name")), "f");
  EXPECT_STR(json_string_value(json_object_get(fc, "arguments")), "{\"a\": 1}");
  EXPECT_STR(json_string_value(json_object_get(fc, "status")), "completed");
  EXPECT(!strncmp(json_string_value(json_object_get(fc, "call_id")), "call_", 5));
  EXPECT(!strncmp(json_string_value(json_object_get(fc, "id")), "fc_", 3));
  json_decref(out);
  /* parallel_tool_calls false: the first call only */
  out = canned_output(0);
  REQUIRE(out != NULL);
  EXPECT_EQ_INT(json_array_size(out), 3);
  json_decref(out);
  /* a plain answer: one message; nothing generated: an empty message */
  out = responses_response_output(NULL, "", NULL, 1, 0);
  REQUIRE(out != NULL);
  EXPECT_EQ_INT(json_array_size(out), 1);
  json_decref(out);
}

TEST(response_object) {
  json_t *echo = json_pack("{s:n, s:[], s:s}", "instructions", "tools", "tool_choice", "auto");
  responses_usage u = {10, 4, 6, 2};
  json_t *o = responses_response_object(echo, "resp_1", 5, "m", "incomplete", NULL, &u);
  REQUIRE(o != NULL);
  char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
  EXPECT_TEXT(s,
              "{\"background\":false,\"created_at\":5,\"error\":null,\"id\":\"resp_1\","
              "\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"instructions\":null,"
              "\"model\":\"m\",\"object\":\"response\",\"output\":[],\"previous_response_id\":null,"
              "\"status\":\"incomplete\",\"tool_choice\":\"auto\",\"tools\":[],\"usage\":{"
              "\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":4},"
              "\"output_tokens\":6,\"output_tokens_details\":{\"reasoning_tokens\":2},"
              "\"total_tokens\":16}}");
  free(s);
  json_decref(o);
  json_decref(echo);
  EXPECT_STR(responses_response_status("stop"), "completed");
  EXPECT_STR(responses_response_status("length"), "incomplete");
}

/* Parses SSE text into its events (each {"event": type, "data": object}). */
static json_t *sse_events(const char *s) {
  json_t *evs = json_array();
  while (s && *s) {
    const char *e = strstr(s, "\n\n");
    if (!e) break;
    char ev[80] = "";
    const char *d = strstr(s, "\ndata: ");
    if (!strncmp(s, "event: ", 7) && d && d < e) {
      size_t n = (size_t)(strchr(s, '\n') - s - 7);
      memcpy(ev, s + 7, n < sizeof ev - 1 ? n : sizeof ev - 1);
      json_t *data = json_loadb(d + 7, (size_t)(e - d - 7), 0, NULL);
      json_array_append_new(evs, json_pack("{s:s, s:o}", "event", ev, "data", data));
    }
    s = e + 2;
  }
  return evs;
}

/* Streams GEN cut every `step` bytes; returns the events. */
static json_t *stream_events(size_t step, int parallel) {
  json_t *echo = json_object();
  responses_stream st;
  responses_stream_init(&st, echo, "resp_x", 1, "m", parallel, 0, NULL, 0);
  strbuf out;
  strbuf_init(&out);
  int rc = responses_stream_start(&st, &out);
  size_t len = strlen(GEN);
  for (size_t at = 0; !rc && at < len;) {
    at = at + step < len ? at + step : len;
    rc = responses_stream_step(&st, GEN, at, 0, &out);
  }
  responses_usage u = {3, 0, 9, 2};
  if (!rc) rc = responses_stream_step(&st, GEN, len, 1, &out);
  if (!rc) rc = responses_stream_finish(&st, "stop", &u, &out);
  strbuf_puts(&out, "");
  json_t *evs = rc ? NULL : sse_events(out.data);
  strbuf_free(&out);
  responses_stream_free(&st);
  json_decref(echo);
  return evs;
}

TEST(stream_events_match_output) {
  json_t *ref = canned_output(1);
  REQUIRE(ref != NULL);
  char *want = items_without_ids(ref);
  json_decref(ref);
  static const size_t steps[] = {1, 2, 3, 7, 1000};
  for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
    json_t *evs = stream_events(steps[k], 1);
    REQUIRE(evs != NULL);
    size_t n = json_array_size(evs), i;
    REQUIRE(n > 4);
    json_t *ev;
    strbuf types;
    strbuf_init(&types);
    json_array_foreach(evs, i, ev) {
      const json_t *data = json_object_get(ev, "data");
      const char *t = json_string_value(json_object_get(ev, "event"));
      EXPECT_STR(json_string_value(json_object_get(data, "type")), t);
      EXPECT_EQ_INT(json_integer_value(json_object_get(data, "sequence_number")), (long long)i);
      /* the deltas collapse: one name per run */
      const char *prev =
          i ? json_string_value(json_object_get(json_array_get(evs, i - 1), "event")) : "";
      if (strcmp(prev, t) || !strstr(t, "delta")) strbuf_printf(&types, "%s ", t + 9);
    }
    EXPECT_TEXT(types.data,
                "created in_progress "
                "output_item.added content_part.added reasoning_text.delta reasoning_text.done "
                "content_part.done output_item.done "
                "output_item.added content_part.added output_text.delta output_text.done "
                "content_part.done output_item.done "
                "output_item.added function_call_arguments.delta function_call_arguments.done "
                "output_item.done "
                "output_item.added function_call_arguments.delta function_call_arguments.done "
                "output_item.done completed ");
    strbuf_free(&types);
    const json_t *last = json_object_get(json_array_get(evs, n - 1), "data");
    const json_t *resp = json_object_get(last, "response");
    EXPECT_STR(json_string_value(json_object_get(resp, "status")), "completed");
    char *got = items_without_ids(json_object_get(resp, "output"));
    EXPECT_TEXT(got, want);
    free(got);
    EXPECT_EQ_INT(
        json_integer_value(json_object_get(json_object_get(resp, "usage"), "total_tokens")), 12);
    json_decref(evs);
  }
  free(want);
  /* parallel_tool_calls false: one call */
  json_t *evs = stream_events(5, 0);
  REQUIRE(evs != NULL);
  const json_t *resp = json_object_get(
      json_object_get(json_array_get(evs, json_array_size(evs) - 1), "data"), "response");
  EXPECT_EQ_INT(json_array_size(json_object_get(resp, "output")), 3);
  json_decref(evs);
}

TEST(stream_empty_and_error) {
  json_t *echo = json_object();
  responses_stream st;
  responses_stream_init(&st, echo, "resp_y", 1, "m", 1, 0, NULL, 0);
  strbuf out;
  strbuf_init(&out);
  EXPECT(responses_stream_start(&st, &out) == 0);
  EXPECT(responses_stream_step(&st, "", 0, 1, &out) == 0);
  responses_usage u = {3, 0, 0, 0};
  EXPECT(responses_stream_finish(&st, "length", &u, &out) == 0);
  strbuf_puts(&out, "");
  json_t *evs = sse_events(out.data);
  /* nothing generated: an empty message, as the non-streamed answer has */
  EXPECT_EQ_INT(json_array_size(evs), 8);
  const json_t *resp = json_object_get(
      json_object_get(json_array_get(evs, json_array_size(evs) - 1), "data"), "response");
  EXPECT_STR(json_string_value(json_object_get(resp, "status")), "incomplete");
  EXPECT_EQ_INT(json_array_size(json_object_get(resp, "output")), 1);
  json_decref(evs);
  responses_stream_free(&st);
  strbuf_free(&out);
  /* an error event ends the stream */
  responses_stream_init(&st, echo, "resp_z", 1, "m", 1, 0, NULL, 0);
  strbuf_init(&out);
  openai_error e;
  openai_error_set(&e, 500, "server_error", NULL, "generation failed: boom");
  EXPECT(responses_stream_error(&st, &e, &out) == 0);
  EXPECT(responses_stream_finish(&st, "stop", &u, &out) == 0); /* nothing after the error */
  EXPECT_TEXT(out.data,
              "event: error\ndata: {\"code\":\"server_error\",\"message\":\"generation "
              "failed: boom\",\"param\":null,\"type\":\"error\",\"sequence_number\":0}\n\n");
  responses_stream_free(&st);
  strbuf_free(&out);
  json_decref(echo);
}

/* Every prefix of a rich body, and the body with each byte replaced by a few others, parse or
 * fail cleanly (a 400 with a message): never a crash, a leak or a success with no chat. */
TEST(mutations_fail_cleanly) {
  static const char body[] =
      "{\"model\":\"m\",\"instructions\":\"i\",\"input\":[{\"role\":\"user\",\"content\":[{"
      "\"type\":\"input_text\",\"text\":\"a\"}]},{\"type\":\"reasoning\",\"summary\":[]},"
      "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}],\"tools\":[{"
      "\"type\":\"function\",\"name\":\"f\",\"parameters\":{}}],\"text\":{\"format\":{\"type\":"
      "\"json_schema\",\"schema\":{}}},\"reasoning\":{\"effort\":\"low\"},\"store\":false}";
  static const char subst[] = "\"{}[]:,0an\\";
  size_t n = strlen(body);
  char buf[sizeof body];
  int ok = 0, bad = 0;
  for (size_t i = 0; i <= n; i++) {
    for (size_t k = 0; k <= sizeof subst - 1; k++) {
      memcpy(buf, body, n + 1);
      size_t len = n;
      if (k == sizeof subst - 1)
        len = i; /* a prefix */
      else if (i < n)
        buf[i] = subst[k];
      else
        continue;
      responses_request r;
      openai_error e;
      memset(&e, 0, sizeof e);
      if (responses_request_parse(buf, len, &r, &e) == 0) {
        EXPECT(r.chat != NULL && r.echo != NULL);
        responses_request_free(&r);
        ok++;
      } else {
        EXPECT_MSG(e.status == 400 && e.message[0], "status %d at %zu", e.status, i);
        bad++;
      }
    }
  }
  EXPECT(ok > 0 && bad > 0);
}

int main(void) {
  RUN(string_input_and_instructions);
  RUN(items_translate);
  RUN(translation_parses_as_chat);
  RUN(refusals);
  RUN(include_and_verbosity);
  RUN(namespace_tools);
  RUN(error_param);
  RUN(output_items_of_a_generation);
  RUN(response_object);
  RUN(stream_events_match_output);
  RUN(stream_empty_and_error);
  RUN(mutations_fail_cleanly);
  TEST_MAIN_END();
}
