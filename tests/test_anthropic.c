/* Unit tests of the Anthropic Messages translation (anthropic_request), the message object
 * (anthropic_response) and the event stream (anthropic_stream), on canned generations: no
 * server, no model. The stream is accumulated as the official SDK accumulates it and compared
 * with the non-streamed message of the same text. */
#include <jansson.h>

#include "base/strbuf.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/anthropic_stream.h"
#include "test.h"

static json_t *translate(anthropic_request_kind k, const char *body, openai_error *e) {
  json_t *o = json_loads(body, 0, NULL);
  if (!o) return NULL;
  json_t *r = anthropic_request_translate(k, o, e);
  json_decref(o);
  return r;
}

#define EXPECT_JSON(a, want) EXPECT_MSG(json_same(a, want), "JSON differs (printed above)")

static int json_same(const json_t *a, const char *want) {
  json_t *w = json_loads(want, 0, NULL);
  int eq = w && json_equal((json_t *)a, w);
  if (!eq) {
    char *s = json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS);
    printf("  got:  %s\n  want: %s\n", s ? s : "(null)", want);
    free(s);
  }
  json_decref(w);
  return eq;
}

/* Expects a 400 whose message contains `what`. */
static int refused(anthropic_request_kind k, const char *body, const char *what) {
  openai_error e;
  memset(&e, 0, sizeof e);
  openai_request r;
  if (anthropic_request_parse(k, body, strlen(body), &r, &e) == 0) {
    openai_request_free(&r);
    return 0;
  }
  if (e.status != 400 || !strstr(e.message, what)) {
    printf("  status %d: %s\n", e.status, e.message);
    return 0;
  }
  return 1;
}

TEST(translate_conversation) {
  openai_error e;
  json_t *r = translate(
      ANTHROPIC_REQUEST_MESSAGES,
      "{\"model\":\"m\",\"max_tokens\":64,\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\","
      "\"cache_control\":{\"type\":\"ephemeral\"}}],"
      "\"messages\":["
      "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Use the "
      "tool.\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Checking.\"},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"weather\",\"input\":{\"city\":"
      "\"Paris\"}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
      "\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":"
      "\"Thanks\"}]}],"
      "\"tools\":[{\"name\":\"weather\",\"description\":\"Weather of a city\",\"input_schema\":"
      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
      "\"tool_choice\":{\"type\":\"auto\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":"
      "1024},\"stop_sequences\":[\"END\"],\"temperature\":0.5,\"top_k\":5,\"top_p\":0.9,"
      "\"metadata\":{\"user_id\":\"u\"},\"stream\":true}",
      &e);
  REQUIRE(r);
  EXPECT_JSON(
      r,
      "{\"model\":\"m\",\"messages\":["
      "{\"role\":\"system\",\"content\":\"Be brief.\"},"
      "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
      "{\"role\":\"assistant\",\"content\":\"Checking.\",\"reasoning_content\":\"Use the tool.\","
      "\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"weather\",\"arguments\":{\"city\":\"Paris\"}}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"sunny\"},"
      "{\"role\":\"user\",\"content\":\"Thanks\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":"
      "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}},\"description\":"
      "\"Weather of a city\"}}],"
      "\"tool_choice\":\"auto\",\"chat_template_kwargs\":{\"enable_thinking\":true},"
      "\"max_tokens\":64,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":5,\"stop\":[\"END\"],"
      "\"stream\":true}");
  json_decref(r);
}

TEST(translate_small_cases) {
  openai_error e;
  /* no thinking: reasoning off; an error result says so; a mid-conversation system message
   * goes to the template as one */
  json_t *r = translate(ANTHROPIC_REQUEST_MESSAGES,
                        "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                        "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":"
                        "\"boom\",\"is_error\":true}]},{\"role\":\"system\",\"content\":\"s\"}]}",
                        &e);
  REQUIRE(r);
  EXPECT_JSON(r,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"t\","
              "\"content\":\"Error: boom\"},{\"role\":\"system\",\"content\":\"s\"}],"
              "\"chat_template_kwargs\":{\"enable_thinking\":false},\"max_tokens\":1}");
  json_decref(r);
  /* count_tokens: no max_tokens; thinking disabled */
  r = translate(ANTHROPIC_REQUEST_COUNT_TOKENS,
                "{\"model\":\"m\",\"system\":\"sys\",\"thinking\":{\"type\":\"disabled\"},"
                "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                &e);
  REQUIRE(r);
  EXPECT_JSON(r,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
              "{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":"
              "{\"enable_thinking\":false}}");
  json_decref(r);
}

/* What Claude Code sends beside the basics: accepted where it leaves the output as it is */
TEST(claude_code_fields) {
  openai_error e;
  json_t *r = translate(
      ANTHROPIC_REQUEST_MESSAGES,
      "{\"model\":\"m\",\"max_tokens\":8,\"thinking\":{\"type\":\"adaptive\"},"
      "\"context_management\":{\"edits\":[{\"type\":\"clear_thinking_20251015\",\"keep\":"
      "\"all\"}]},\"output_config\":{\"effort\":\"high\"},\"messages\":[{\"role\":\"user\","
      "\"content\":\"a\"},{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"s\"}]}]}",
      &e);
  REQUIRE(r);
  EXPECT_JSON(r,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
              "{\"role\":\"system\",\"content\":\"s\"}],\"chat_template_kwargs\":"
              "{\"enable_thinking\":true},\"max_tokens\":8}");
  json_decref(r);
  /* a JSON-schema output format: response_format json_schema, adaptive thinking off */
  r = translate(ANTHROPIC_REQUEST_MESSAGES,
                "{\"model\":\"m\",\"max_tokens\":8,\"thinking\":{\"type\":\"adaptive\"},"
                "\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":"
                "\"object\"}}},\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
                &e);
  REQUIRE(r);
  EXPECT_JSON(r,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
              "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
              "\"output\",\"schema\":{\"type\":\"object\"}}},\"chat_template_kwargs\":"
              "{\"enable_thinking\":false},\"max_tokens\":8}");
  json_decref(r);
  const anthropic_request_kind M = ANTHROPIC_REQUEST_MESSAGES;
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
  EXPECT(refused(
      M, "{\"model\":\"m\",\"max_tokens\":1,\"output_config\":{\"effort\":\"low\"}," MSG "}",
      "only 'high'"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"context_management\":{\"edits\":[{\"type\":"
                 "\"clear_tool_uses_20250919\"}]}," MSG "}",
                 "context_management.edits.0"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"thinking\":{\"type\":\"enabled\","
                 "\"budget_tokens\":100},\"output_format\":{\"type\":\"json_schema\",\"schema\":"
                 "{}}," MSG "}",
                 "with an output format"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"output_config\":{\"format\":{\"type\":"
                 "\"text\"}}," MSG "}",
                 "output_config.format"));
#undef MSG
}

TEST(parse_fills_openai_request) {
  openai_request r;
  openai_error e;
  const char *b =
      "{\"model\":\"m\",\"max_tokens\":7,\"stop_sequences\":[\"a\",\"bc\"],\"temperature\":0,"
      "\"stream\":true,\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
      "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
  REQUIRE(anthropic_request_parse(ANTHROPIC_REQUEST_MESSAGES, b, strlen(b), &r, &e) == 0);
  EXPECT_EQ_INT(r.kind, OPENAI_KIND_CHAT);
  EXPECT_EQ_INT(r.max_tokens, 7);
  EXPECT_EQ_INT(r.n_stop, 2);
  EXPECT_STR(r.stop[1], "bc");
  EXPECT_EQ_INT(r.stream, 1);
  EXPECT(r.sp.temperature == 0.0f);
  EXPECT(r.tools && json_array_size(r.tools) == 1);
  openai_request_free(&r);
  /* tool_choice none: the tools are not rendered, as on the chat route */
  b = "{\"model\":\"m\",\"max_tokens\":7,\"tool_choice\":{\"type\":\"none\"},\"tools\":[{\"name\":"
      "\"f\",\"input_schema\":{}}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
  REQUIRE(anthropic_request_parse(ANTHROPIC_REQUEST_MESSAGES, b, strlen(b), &r, &e) == 0);
  EXPECT(r.tools == NULL);
  openai_request_free(&r);
}

TEST(refusals) {
  const anthropic_request_kind M = ANTHROPIC_REQUEST_MESSAGES;
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
  EXPECT(refused(M, "{\"model\":\"m\"," MSG "}", "max_tokens: Field required"));
  EXPECT(refused(M, "{\"max_tokens\":1," MSG "}", "model: Field required"));
  EXPECT(refused(M, "{\"model\":\"m\",\"max_tokens\":1}", "messages: Field required"));
  EXPECT(refused(M, "{\"model\":\"m\",\"max_tokens\":1,\"foo\":1," MSG "}",
                 "foo: Extra inputs are not permitted"));
  /* any / tool: forced by the tool-call grammar (test_tool_choice); a tool needs its name */
  {
    const char *any =
        "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"tool\","
        "\"name\":\"f\",\"disable_parallel_tool_use\":true},\"tools\":[{\"name\":"
        "\"f\",\"input_schema\":{}}]," MSG "}";
    openai_request r;
    openai_error e;
    memset(&e, 0, sizeof e);
    EXPECT_MSG(anthropic_request_parse(M, any, strlen(any), &r, &e) == 0, "%s", e.message);
    if (!e.status) {
      EXPECT(r.tool_forced && r.tool_choice == OPENAI_TOOL_CHOICE_NAMED);
      openai_request_free(&r);
    }
  }
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"tool\"},"
                 "\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]," MSG "}",
                 "tool_choice.name"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"auto\","
                 "\"disable_parallel_tool_use\":1}," MSG "}",
                 "disable_parallel_tool_use"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"type\":\"web_search_20250305\","
                 "\"name\":\"web_search\"}]," MSG "}",
                 "web_search_20250305"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":"
                 "[{\"type\":\"image\",\"source\":{}}]}]}",
                 "block type 'image'"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"assistant\","
                 "\"content\":[{\"type\":\"redacted_thinking\",\"data\":\"x\"}]}]}",
                 "redacted_thinking"));
  EXPECT(
      refused(M, "{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1.5," MSG "}", "temperature"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"thinking\":{\"type\":\"enabled\"}," MSG "}",
                 "budget_tokens"));
  EXPECT(
      refused(M, "{\"model\":\"m\",\"max_tokens\":1,\"mcp_servers\":[]," MSG "}", "mcp_servers"));
  EXPECT(refused(M,
                 "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":"
                 "\"x\"}]}",
                 "role"));
  EXPECT(refused(ANTHROPIC_REQUEST_COUNT_TOKENS, "{\"model\":\"m\",\"max_tokens\":1," MSG "}",
                 "max_tokens: Extra inputs"));
#undef MSG
}

TEST(error_shape) {
  openai_error e;
  openai_error_set(&e, 401, "authentication_error", NULL, "invalid API key");
  char *b = anthropic_response_error_body(&e);
  json_t *j = json_loads(b, 0, NULL);
  EXPECT_JSON(j,
              "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
              "\"message\":\"invalid API key\"}}");
  json_decref(j);
  free(b);
  EXPECT_STR(anthropic_response_error_type(400), "invalid_request_error");
  EXPECT_STR(anthropic_response_error_type(404), "not_found_error");
  EXPECT_STR(anthropic_response_error_type(503), "overloaded_error");
  EXPECT_STR(anthropic_response_error_type(500), "api_error");
  EXPECT_STR(anthropic_response_error_type(429), "rate_limit_error");
}

/* ---- canned generations ---- */

static void canned(server_gen *g, const char *text, finish_reason f) {
  memset(g, 0, sizeof *g);
  strbuf_init(&g->text);
  strbuf_puts(&g->text, text);
  g->done = 1;
  g->finish = f;
  g->prompt_tokens = 30;
  g->cached_tokens = 12;
  g->completion_tokens = 9;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]";

/* Qwen3's JSON tool calls after reasoning and text */
static const char *TOOL_TEXT =
    "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": "
    "\"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
    "\"weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";

TEST(message_tool_use) {
  server_gen g;
  canned(&g, TOOL_TEXT, FINISH_STOP);
  json_t *tools = json_loads(TOOLS, 0, NULL);
  json_t *m = anthropic_response_message("msg_1", "tiny", &g, 0, tools);
  REQUIRE(m);
  json_t *content = json_object_get(m, "content");
  REQUIRE(json_array_size(content) == 4);
  const char *id = json_string_value(json_object_get(json_array_get(content, 2), "id"));
  EXPECT(id && !strncmp(id, "toolu_", 6) && strlen(id) > 10);
  json_object_set_new(json_array_get(content, 2), "id", json_string("X"));
  json_object_set_new(json_array_get(content, 3), "id", json_string("Y"));
  EXPECT_JSON(
      m,
      "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"tiny\","
      "\"content\":[{\"type\":\"thinking\",\"thinking\":\"The user wants weather.\","
      "\"signature\":\"\"},{\"type\":\"text\",\"text\":\"Let me check.\"},"
      "{\"type\":\"tool_use\",\"id\":\"X\",\"name\":\"weather\",\"input\":{\"city\":\"Paris\"}},"
      "{\"type\":\"tool_use\",\"id\":\"Y\",\"name\":\"weather\",\"input\":{\"city\":\"Rome\"}}],"
      "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":18,"
      "\"output_tokens\":9,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":12}}");
  json_decref(m);
  json_decref(tools);
  strbuf_free(&g.text);
}

TEST(message_stop_reasons) {
  server_gen g;
  canned(&g, "hello", FINISH_LENGTH);
  json_t *m = anthropic_response_message("msg_1", "tiny", &g, 0, NULL);
  EXPECT_STR(json_string_value(json_object_get(m, "stop_reason")), "max_tokens");
  json_decref(m);
  g.finish = FINISH_STOP;
  m = anthropic_response_message("msg_1", "tiny", &g, 0, NULL);
  EXPECT_STR(json_string_value(json_object_get(m, "stop_reason")), "end_turn");
  EXPECT(json_is_null(json_object_get(m, "stop_sequence")));
  json_decref(m);
  g.stop_string_hit = 1;
  g.stop_hit = "END";
  m = anthropic_response_message("msg_1", "tiny", &g, 0, NULL);
  EXPECT_STR(json_string_value(json_object_get(m, "stop_reason")), "stop_sequence");
  EXPECT_STR(json_string_value(json_object_get(m, "stop_sequence")), "END");
  json_decref(m);
  /* an empty answer has no blocks; an open think block is all thinking */
  strbuf_free(&g.text);
  canned(&g, "", FINISH_STOP);
  m = anthropic_response_message("msg_1", "tiny", &g, 0, NULL);
  EXPECT(json_array_size(json_object_get(m, "content")) == 0);
  json_decref(m);
  strbuf_free(&g.text);
  canned(&g, "still thinking", FINISH_LENGTH);
  m = anthropic_response_message("msg_1", "tiny", &g, 1, NULL);
  EXPECT_JSON(json_object_get(m, "content"),
              "[{\"type\":\"thinking\",\"thinking\":\"still thinking\",\"signature\":\"\"}]");
  json_decref(m);
  strbuf_free(&g.text);
}

/* ---- the stream, accumulated as the SDK does ---- */

/* Reads the events of sse into a message (NULL when their order or shape is wrong). */
static json_t *accumulate(const char *sse, int *n_pings) {
  json_t *msg = NULL;
  strbuf partial;
  strbuf_init(&partial);
  int stage = 0, open = -1; /* 0 before message_start, 1 in it, 2 after message_delta, 3 stopped */
  const char *p = sse;
  *n_pings = 0;
  while (*p) {
    char type[64];
    if (sscanf(p, "event: %63[^\n]\n", type) != 1) goto bad;
    const char *data = strstr(p, "\ndata: ");
    const char *end = data ? strstr(data, "\n\n") : NULL;
    if (!end) goto bad;
    json_t *ev = json_loadb(data + 7, (size_t)(end - data - 7), 0, NULL);
    p = end + 2;
    if (!ev || strcmp(json_string_value(json_object_get(ev, "type")), type)) goto bad_ev;
    int idx = (int)json_integer_value(json_object_get(ev, "index"));
    json_t *content = msg ? json_object_get(msg, "content") : NULL;
    if (!strcmp(type, "message_start")) {
      if (stage != 0) goto bad_ev;
      msg = json_deep_copy(json_object_get(ev, "message"));
      stage = 1;
    } else if (!strcmp(type, "ping")) {
      (*n_pings)++;
    } else if (!strcmp(type, "content_block_start")) {
      if (stage != 1 || open != -1 || idx != (int)json_array_size(content)) goto bad_ev;
      json_array_append(content, json_object_get(ev, "content_block"));
      open = idx;
      partial.len = 0;
    } else if (!strcmp(type, "content_block_delta")) {
      if (idx != open) goto bad_ev;
      json_t *b = json_array_get(content, (size_t)idx), *d = json_object_get(ev, "delta");
      const char *dt = json_string_value(json_object_get(d, "type"));
      const char *key = !strcmp(dt, "text_delta") ? "text" : "thinking";
      if (!strcmp(dt, "input_json_delta")) {
        strbuf_puts(&partial, json_string_value(json_object_get(d, "partial_json")));
        json_decref(ev);
        continue;
      }
      strbuf s;
      strbuf_init(&s);
      strbuf_puts(&s, json_string_value(json_object_get(b, key)));
      strbuf_puts(&s, json_string_value(json_object_get(d, key)));
      json_object_set_new(b, key, json_stringn(s.data, s.len));
      strbuf_free(&s);
    } else if (!strcmp(type, "content_block_stop")) {
      if (idx != open) goto bad_ev;
      json_t *b = json_array_get(content, (size_t)idx);
      if (partial.len)
        json_object_set_new(b, "input", json_loadb(partial.data, partial.len, 0, NULL));
      open = -1;
    } else if (!strcmp(type, "message_delta")) {
      if (stage != 1 || open != -1) goto bad_ev;
      json_object_update(msg, json_object_get(ev, "delta"));
      json_object_update(json_object_get(msg, "usage"), json_object_get(ev, "usage"));
      stage = 2;
    } else if (!strcmp(type, "message_stop")) {
      if (stage != 2) goto bad_ev;
      stage = 3;
    } else {
      goto bad_ev;
    }
    json_decref(ev);
    continue;
  bad_ev:
    json_decref(ev);
    goto bad;
  }
  strbuf_free(&partial);
  if (stage != 3) {
    json_decref(msg);
    return NULL;
  }
  return msg;
bad:
  strbuf_free(&partial);
  json_decref(msg);
  return NULL;
}

/* Tool ids are random per parse: named by position. */
static void name_tool_ids(json_t *m) {
  size_t i;
  json_t *b;
  json_array_foreach(json_object_get(m, "content"), i, b) {
    if (json_object_get(b, "id")) json_object_set_new(b, "id", json_integer((json_int_t)i));
  }
}

/* Streams text in pieces of `step` bytes (the generation done with the last one) and checks
 * the accumulated message against the non-streamed one. */
static int stream_matches(const char *text, int thinking_open, const json_t *tools, size_t step,
                          finish_reason f) {
  server_gen g;
  canned(&g, text, f);
  json_t *want = anthropic_response_message("msg_s", "tiny", &g, thinking_open, tools);
  anthropic_stream *s = anthropic_stream_new("msg_s", "tiny", thinking_open, tools);
  strbuf out;
  strbuf_init(&out);
  size_t len = strlen(text);
  int ok = s && want;
  for (size_t at = 0; ok;) {
    at = at + step < len ? at + step : len;
    g.done = at == len;
    if (anthropic_stream_events(s, &g, at, &out)) ok = 0;
    if (g.done) break;
  }
  int pings = 0;
  json_t *got = ok ? accumulate(out.data ? out.data : "", &pings) : NULL;
  ok = got && pings == 1;
  if (ok) {
    name_tool_ids(got);
    name_tool_ids(want);
    ok = json_equal(got, want);
    if (!ok) {
      char *a = json_dumps(got, JSON_COMPACT), *b = json_dumps(want, JSON_COMPACT);
      printf("  step %zu\n  stream: %s\n  body:   %s\n", step, a, b);
      free(a);
      free(b);
    }
  } else {
    printf("  step %zu: bad event stream:\n%s\n", step, out.data ? out.data : "");
  }
  json_decref(got);
  json_decref(want);
  anthropic_stream_free(s);
  strbuf_free(&out);
  strbuf_free(&g.text);
  return ok;
}

TEST(stream_accumulates_to_message) {
  json_t *tools = json_loads(TOOLS, 0, NULL);
  static const size_t steps[] = {1, 2, 3, 5, 7, 16, 1000};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    EXPECT(stream_matches(TOOL_TEXT, 0, tools, steps[i], FINISH_STOP));
    EXPECT(stream_matches("I think\n</think>\n\nHéllo wörld ✓", 1, NULL, steps[i], FINISH_STOP));
    EXPECT(stream_matches("plain text only", 0, NULL, steps[i], FINISH_LENGTH));
    EXPECT(stream_matches("", 0, NULL, steps[i], FINISH_STOP));
  }
  json_decref(tools);
}

TEST(stream_error_event) {
  strbuf out;
  strbuf_init(&out);
  openai_error e;
  openai_error_set(&e, 503, "server_error", NULL, "the server is shutting down");
  EXPECT(anthropic_stream_error(&out, &e) == 0);
  static const char want[] =
      "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"";
  EXPECT(out.data && !strncmp(out.data, want, sizeof want - 1));
  strbuf_free(&out);
}

int main(void) {
  RUN(translate_conversation);
  RUN(translate_small_cases);
  RUN(claude_code_fields);
  RUN(parse_fills_openai_request);
  RUN(refusals);
  RUN(error_shape);
  RUN(message_tool_use);
  RUN(message_stop_reasons);
  RUN(stream_accumulates_to_message);
  RUN(stream_error_event);
  TEST_MAIN_END();
}
