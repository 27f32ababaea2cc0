/* test_chat_parse — reasoning / content / tool-call splitting for both Qwen formats, typed XML
 * parameters, malformed calls, ids, the streaming safe prefix, and a render -> parse round
 * trip through the Qwen3.5 template. */
#include <ctype.h>
#include <jansson.h>

#include "test.h"
#include "tokenizer/chat_parse.h"
#include "tokenizer/chat_template.h"

static void seq_id(void *ctx, char *buf, size_t buflen) {
  int *n = ctx;
  snprintf(buf, buflen, "call_%d", (*n)++);
}

static int parse(const char *text, int thinking_open, const json_t *tools, chat_parsed *p) {
  static int counter;
  counter = 0;
  return chat_parse_ex(text, thinking_open, tools, seq_id, &counter, p);
}

static const char *call_name(const chat_parsed *p, size_t i) {
  return json_string_value(
      json_object_get(json_object_get(json_array_get(p->tool_calls, i), "function"), "name"));
}
static const char *call_args(const chat_parsed *p, size_t i) {
  return json_string_value(
      json_object_get(json_object_get(json_array_get(p->tool_calls, i), "function"), "arguments"));
}
static const char *call_id(const chat_parsed *p, size_t i) {
  return json_string_value(json_object_get(json_array_get(p->tool_calls, i), "id"));
}

static json_t *weather_tools(void) {
  return json_loads(
      "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": "
      "{\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"ratio\": {\"type\": "
      "\"number\"}, \"metric\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, "
      "\"tags\": {\"type\": [\"array\", \"null\"]}}}}}]",
      0, NULL);
}

TEST(plain_content) {
  chat_parsed p;
  REQUIRE(parse("Hello there.", 0, NULL, &p) == 0);
  EXPECT(p.reasoning_content == NULL);
  EXPECT_STR(p.content, "Hello there.");
  EXPECT(p.tool_calls == NULL);
  chat_parsed_free(&p);
  REQUIRE(parse("", 1, NULL, &p) == 0);
  EXPECT(p.reasoning_content == NULL);
  EXPECT_STR(p.content, "");
  chat_parsed_free(&p);
}

TEST(reasoning_split) {
  chat_parsed p;
  REQUIRE(parse("Let me think.\nYes.\n</think>\n\nThe answer is 4.", 1, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "Let me think.\nYes.");
  EXPECT_STR(p.content, "The answer is 4.");
  chat_parsed_free(&p);
  /* the block never closed: everything is reasoning */
  REQUIRE(parse("still thinking about", 1, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "still thinking about");
  EXPECT_STR(p.content, "");
  chat_parsed_free(&p);
  /* Qwen3: the model opens the block itself */
  REQUIRE(parse("<think>\nr1\n</think>\n\nc1", 0, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "r1");
  EXPECT_STR(p.content, "c1");
  chat_parsed_free(&p);
  /* empty think block (enable_thinking=false echo) */
  REQUIRE(parse("<think>\n\n</think>\n\nHello", 0, NULL, &p) == 0);
  EXPECT(p.reasoning_content == NULL);
  EXPECT_STR(p.content, "Hello");
  chat_parsed_free(&p);
  /* only the first </think> ends reasoning */
  REQUIRE(parse("a</think>b</think>c", 1, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "a");
  EXPECT_STR(p.content, "b</think>c");
  chat_parsed_free(&p);
  /* a stray </think> in a text that opened no block is content: a stream has sent the text
   * before it as content by the time it comes */
  REQUIRE(parse("answer</think>more", 0, NULL, &p) == 0);
  EXPECT(p.reasoning_content == NULL);
  EXPECT_STR(p.content, "answer</think>more");
  chat_parsed_free(&p);
}

TEST(qwen3_json_calls) {
  chat_parsed p;
  REQUIRE(parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                "{\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
                0, NULL, &p) == 0);
  EXPECT_STR(p.content, "Let me check.");
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 1);
  EXPECT_STR(call_name(&p, 0), "get_weather");
  EXPECT_STR(call_args(&p, 0), "{\"city\": \"Paris\", \"days\": 3}");
  EXPECT_STR(call_id(&p, 0), "call_0");
  EXPECT_STR(json_string_value(json_object_get(json_array_get(p.tool_calls, 0), "type")),
             "function");
  chat_parsed_free(&p);

  REQUIRE(parse("<think>\nneed two\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
                "{}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
                "\"{\\\"x\\\":1}\"}\n</tool_call>",
                0, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "need two");
  EXPECT_STR(p.content, "");
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 2);
  EXPECT_STR(call_name(&p, 0), "a");
  EXPECT_STR(call_args(&p, 0), "{}");
  EXPECT_STR(call_name(&p, 1), "b");
  EXPECT_STR(call_args(&p, 1), "{\"x\":1}");
  EXPECT_STR(call_id(&p, 1), "call_1");
  chat_parsed_free(&p);
}

TEST(qwen35_xml_typed_by_schema) {
  json_t *tools = weather_tools();
  REQUIRE(tools);
  const char *text =
      "I will look it up.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew "
      "York\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=metric>\nTrue\n"
      "</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]"
      "\n</parameter>\n<parameter=extra>\n42\n</parameter>\n<parameter=note>\nline one\nline "
      "two\n</parameter>\n</function>\n</tool_call>";
  chat_parsed p;
  REQUIRE(parse(text, 0, tools, &p) == 0);
  EXPECT_STR(p.content, "I will look it up.");
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 1);
  EXPECT_STR(call_name(&p, 0), "get_weather");
  EXPECT_STR(call_args(&p, 0),
             "{\"city\": \"New York\", \"zip\": \"10001\", \"days\": 3, \"ratio\": 0.5, "
             "\"metric\": true, \"opts\": {\"a\": [1, 2]}, \"tags\": [\"x\"], \"extra\": 42, "
             "\"note\": \"line one\\nline two\"}");
  chat_parsed_free(&p);
  /* a value that does not fit its type stays text */
  REQUIRE(parse("<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
                "</function>\n</tool_call>",
                0, tools, &p) == 0);
  EXPECT_STR(call_args(&p, 0), "{\"days\": \"three\"}");
  chat_parsed_free(&p);
  /* without tools: JSON when it parses, else text */
  REQUIRE(parse("<tool_call>\n<function=f>\n<parameter=zip>\n10001\n</parameter>\n"
                "<parameter=s>\nhello\n</parameter>\n</function>\n</tool_call>",
                0, NULL, &p) == 0);
  EXPECT_STR(call_args(&p, 0), "{\"zip\": 10001, \"s\": \"hello\"}");
  chat_parsed_free(&p);
  json_decref(tools);
}

TEST(qwen35_multiple_calls_with_reasoning) {
  chat_parsed p;
  REQUIRE(parse("two calls needed\n</think>\n\n<tool_call>\n<function=a>\n<parameter=x>\n1\n"
                "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n"
                "</function>\n</tool_call>",
                1, NULL, &p) == 0);
  EXPECT_STR(p.reasoning_content, "two calls needed");
  EXPECT_STR(p.content, "");
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 2);
  EXPECT_STR(call_name(&p, 0), "a");
  EXPECT_STR(call_args(&p, 0), "{\"x\": 1}");
  EXPECT_STR(call_name(&p, 1), "b");
  EXPECT_STR(call_args(&p, 1), "{}");
  chat_parsed_free(&p);
}

TEST(malformed_calls_stay_in_content) {
  chat_parsed p;
  const char *bad = "Try: <tool_call>\n{not json}\n</tool_call> done";
  REQUIRE(parse(bad, 0, NULL, &p) == 0);
  EXPECT_STR(p.content, bad);
  EXPECT(p.tool_calls == NULL);
  chat_parsed_free(&p);
  const char *bad2 = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>";
  REQUIRE(parse(bad2, 0, NULL, &p) == 0); /* no </function> */
  EXPECT_STR(p.content, bad2);
  EXPECT(p.tool_calls == NULL);
  chat_parsed_free(&p);
  const char *bad3 = "<tool_call>\n{\"arguments\": {}}\n</tool_call>"; /* no name */
  REQUIRE(parse(bad3, 0, NULL, &p) == 0);
  EXPECT_STR(p.content, bad3);
  EXPECT(p.tool_calls == NULL);
  chat_parsed_free(&p);
  /* one good, one bad: the good one is a call, the bad one stays */
  REQUIRE(parse("<tool_call>\n{\"name\": \"ok\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                "<tool_call>\n<function=broken\n</tool_call>",
                0, NULL, &p) == 0);
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 1);
  EXPECT_STR(call_name(&p, 0), "ok");
  EXPECT_STR(p.content, "\n<tool_call>\n<function=broken\n</tool_call>");
  chat_parsed_free(&p);
  /* generation stopped before </tool_call>: accepted when the body parses */
  REQUIRE(parse("<tool_call>\n{\"name\": \"late\", \"arguments\": {}}\n", 0, NULL, &p) == 0);
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 1);
  EXPECT_STR(call_name(&p, 0), "late");
  EXPECT_STR(p.content, "");
  chat_parsed_free(&p);
  REQUIRE(parse("<tool_call>\n{\"name\": \"cut\", \"argu", 0, NULL, &p) == 0);
  EXPECT(p.tool_calls == NULL);
  EXPECT_STR(p.content, "<tool_call>\n{\"name\": \"cut\", \"argu");
  chat_parsed_free(&p);
}

TEST(random_ids) {
  chat_parsed p;
  REQUIRE(chat_parse("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>"
                     "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
                     0, NULL, &p) == 0);
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 2);
  const char *a = call_id(&p, 0), *b = call_id(&p, 1);
  EXPECT(strlen(a) == 29 && !strncmp(a, "call_", 5));
  for (int i = 5; i < 29; i++) EXPECT(isxdigit((unsigned char)a[i]));
  EXPECT(strcmp(a, b) != 0);
  chat_parsed_free(&p);
}

TEST(safe_prefix) {
#define SP(s) chat_parse_safe_prefix(s, strlen(s))
  EXPECT_EQ_INT(SP("Hello"), 5);
  EXPECT_EQ_INT(SP("Hello <tool"), 6);
  EXPECT_EQ_INT(SP("Hello <tool_call>{\"na"), 6);
  EXPECT_EQ_INT(SP("Hello <"), 6);
  EXPECT_EQ_INT(SP("a < b"), 5);
  EXPECT_EQ_INT(SP("x <b>bold</b> y"), 15);
  EXPECT_EQ_INT(SP("x</thi"), 1);
  EXPECT_EQ_INT(SP("x</think>y"), 1);
  EXPECT_EQ_INT(SP("<think>"), 0);
  EXPECT_EQ_INT(SP("<tool_cal"), 0);
  EXPECT_EQ_INT(SP("<tool_calx"), 10);
  EXPECT_EQ_INT(SP("ab\xc3"), 2);
  EXPECT_EQ_INT(SP("ab\xe2\x82"), 2);
  EXPECT_EQ_INT(SP("ab\xe2\x82\xac"), 5);
  EXPECT_EQ_INT(SP("ab\xf0\x9f\x98"), 2);
  EXPECT_EQ_INT(SP(""), 0);
#undef SP
}

/* An assistant turn rendered by the Qwen3.5 template parses back to the same message. */
TEST(render_parse_round_trip) {
  json_t *tools = weather_tools();
  json_t *req = json_pack(
      "{s:[{s:s,s:s},{s:s,s:s,s:s,s:[{s:s,s:s,s:{s:s,s:s}}]}],s:O,s:{s:b}}", "messages", "role",
      "user", "content", "weather?", "role", "assistant", "content", "Checking.",
      "reasoning_content", "The user wants weather.", "tool_calls", "id", "x", "type", "function",
      "function", "name", "get_weather", "arguments",
      "{\"city\": \"Rome\", \"days\": 2, \"metric\": false, \"opts\": {\"k\": [1, \"v\"]}}",
      "tools", tools, "chat_template_kwargs", "add_generation_prompt", 0);
  REQUIRE(tools && req);
  chat_render r;
  char err[200];
  REQUIRE(chat_template_render(CHAT_TEMPLATE_QWEN35, req, 1, &r, err, sizeof err) == 0);
  const char *turn = r.text + r.msg_offsets[1] + strlen("<|im_start|>assistant\n");
  char *gen = strndup(turn, strlen(turn) - strlen("<|im_end|>\n"));
  chat_parsed p;
  REQUIRE(parse(gen, 0, tools, &p) == 0);
  EXPECT_STR(p.reasoning_content, "The user wants weather.");
  EXPECT_STR(p.content, "Checking.");
  REQUIRE(p.tool_calls && json_array_size(p.tool_calls) == 1);
  EXPECT_STR(call_name(&p, 0), "get_weather");
  EXPECT_STR(call_args(&p, 0),
             "{\"city\": \"Rome\", \"days\": 2, \"metric\": false, \"opts\": {\"k\": [1, "
             "\"v\"]}}");
  chat_parsed_free(&p);
  free(gen);
  chat_render_free(&r);
  json_decref(req);
  json_decref(tools);
}

/* Random texts built from marker pieces: chat_parse never fails or crashes, content is always
 * set, each call has a name and arguments that parse as a JSON object; the safe prefix of
 * every prefix of a text grows monotonically and never holds a complete marker. */
TEST(random_texts) {
  static const char *pieces[] = {"<tool_call>",
                                 "</tool_call>",
                                 "<function=f>",
                                 "<function=",
                                 "<parameter=x>",
                                 "</parameter>",
                                 "</function>",
                                 "{",
                                 "}",
                                 "\"name\": \"g\"",
                                 ", \"arguments\": {\"a\": 1}",
                                 ":",
                                 "\n",
                                 " ",
                                 "a",
                                 "<think>",
                                 "</think>",
                                 "<",
                                 "</",
                                 "\xc3\xa9",
                                 "\xe2\x82\xac",
                                 "12",
                                 "true",
                                 "{\"name\": \"h\", \"arguments\": {}}"};
  const int np = (int)(sizeof pieces / sizeof pieces[0]);
  unsigned long long x = 0x243f6a8885a308d3ULL;
  char text[1024];
  json_t *tools = weather_tools();
  for (int it = 0; it < 3000; it++) {
    size_t len = 0;
    int k = (int)(x % 24);
    for (int j = 0; j < k; j++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const char *pc = pieces[x % (unsigned long long)np];
      size_t pl = strlen(pc);
      if (len + pl >= sizeof text) break;
      memcpy(text + len, pc, pl);
      len += pl;
    }
    text[len] = 0;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    chat_parsed p;
    REQUIRE(parse(text, (int)(x & 1), (x & 2) ? tools : NULL, &p) == 0);
    REQUIRE(p.content != NULL);
    for (size_t c = 0; c < json_array_size(p.tool_calls); c++) {
      EXPECT(call_name(&p, c) && *call_name(&p, c));
      json_t *a = json_loads(call_args(&p, c), 0, NULL);
      EXPECT_MSG(json_is_object(a), "args '%.80s' from '%.200s'", call_args(&p, c), text);
      json_decref(a);
    }
    chat_parsed_free(&p);
    size_t prev = 0;
    for (size_t l = 0; l <= len; l++) {
      size_t n = chat_parse_safe_prefix(text, l);
      EXPECT_MSG(n >= prev && n <= l, "safe prefix %zu after %zu at %zu of '%.200s'", n, prev, l,
                 text);
      char *cut = strndup(text, n);
      EXPECT(!strstr(cut, "<tool_call>") && !strstr(cut, "</think>") && !strstr(cut, "<think>"));
      free(cut);
      prev = n;
    }
  }
  json_decref(tools);
}

int main(void) {
  RUN(plain_content);
  RUN(reasoning_split);
  RUN(qwen3_json_calls);
  RUN(qwen35_xml_typed_by_schema);
  RUN(qwen35_multiple_calls_with_reasoning);
  RUN(malformed_calls_stay_in_content);
  RUN(random_ids);
  RUN(safe_prefix);
  RUN(render_parse_round_trip);
  RUN(random_texts);
  TEST_MAIN_END();
}
