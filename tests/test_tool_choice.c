/* test_tool_choice — tool_choice "required" / a named tool / at most one call, enforced by the
 * tool-call grammar (tool_grammar.h) through json_mask: random mask-driven generations over a
 * small vocabulary (every byte, the call's literals as whole tokens, eos) must all parse, with
 * chat_parse, as calls of the allowed tools whose arguments satisfy the tools' schemas; eos is
 * forbidden before a complete call; a think block is free text closed by </think>. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/json_mask.h"
#include "sampler/json_schema.h"
#include "sampler/tool_grammar.h"
#include "test.h"
#include "tokenizer/chat_parse.h"

/* ---- the vocabulary: bytes 0x09..0x7e, literals, eos ------------------------------------ */

static const char *const json_words[] = {
    "<tool_call>", "</tool_call>", "\n",     "{\"name\": \"", "\", \"arguments\": ", "}\n",
    "</think>",    "get_weather",  "search", "\"city\": \"",  "\"days\": ",          "\"q\": \""};
/* the XML form's literals (Qwen3.5 / 3.6), as whole tokens */
static const char *const xml_words[] = {"<tool_call>",  "</tool_call>",
                                        "\n",           "<function=",
                                        "</function>",  "<parameter=",
                                        "</parameter>", ">\n",
                                        "</think>",     "get_weather",
                                        "search",       "city",
                                        "days",         "q",
                                        "exact",        "tags",
                                        "true",         "\n</parameter>\n"};
#define NW_MAX 18
static const char *const *words = json_words;
static int NW = sizeof json_words / sizeof json_words[0];
#define NV \
  (NW_MAX + 0x7f + 1) /* words (unused slots empty), bytes 0..0x7e (below 0x09: empty), eos */
#define EOS_ID (NV - 1)

static json_vocab *vocab(void) {
  const char *bytes[NV];
  size_t lens[NV];
  static char one[0x7f];
  for (int i = 0; i < NW_MAX; i++) {
    bytes[i] = i < NW ? words[i] : "";
    lens[i] = i < NW ? strlen(words[i]) : 0;
  }
  for (int c = 0; c < 0x7f; c++) {
    one[c] = (char)c;
    bytes[NW_MAX + c] = &one[c];
    lens[NW_MAX + c] = c >= 0x09 ? 1 : 0;
  }
  bytes[EOS_ID] = "";
  lens[EOS_ID] = 0;
  int32_t eos = EOS_ID;
  return json_vocab_new(NV, bytes, lens, NULL, &eos, 1);
}

static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":6},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},\"required\":[\"city\"],"
    "\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":8}},"
    "\"required\":[\"q\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]";

/* the XML form's tools: a string with a length bound, an integer, a boolean, an array, an enum
 * of strings narrowed from a type list */
static const char tools_xml[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":6},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},"
    "\"unit\":{\"type\":[\"string\",\"null\"],\"enum\":[\"c\",\"f\",null]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{"
    "\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":8},"
    "\"exact\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"maxItems\":2,"
    "\"items\":{\"type\":\"integer\"}}},"
    "\"required\":[\"q\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]";

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}

/* One generation: tokens drawn uniformly among the allowed (eos, when allowed, half of the
 * time; literal words a third of the time, so that strings end). Returns the text (malloc'd),
 * or NULL when it runs past the step limit. */
static char *generate(const json_vocab *v, const json_schema *g, int *eos_at_start) {
  json_mask *m = json_mask_new_schema(v, g);
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  float logits[NV];
  int ids[NV];
  for (int step = 0; step < 20000; step++) {
    for (int i = 0; i < NV; i++) logits[i] = 0;
    json_mask_apply(m, logits, NV);
    if (step == 0) *eos_at_start = logits[EOS_ID] == 0;
    int n = 0, nw = 0;
    for (int i = 0; i < NV; i++)
      if (logits[i] == 0 && i != EOS_ID) ids[n++] = i;
    for (int i = 0; i < n && ids[i] < NW_MAX; i++) nw++;
    int pick;
    if (logits[EOS_ID] == 0 && (n == 0 || rnd() % 2))
      pick = EOS_ID;
    else if (n == 0)
      break;
    else if (nw && rnd() % 3 == 0)
      pick = ids[rnd() % nw];
    else
      pick = ids[rnd() % n];
    if (pick == EOS_ID) {
      json_mask_advance(m, pick);
      int ok = json_mask_complete(m) && !json_mask_dead(m);
      json_mask_free(m);
      text[len] = 0;
      if (!ok) {
        free(text);
        return NULL;
      }
      return text;
    }
    const char *b = pick < NW_MAX ? words[pick] : (const char[]){(char)(pick - NW_MAX), 0};
    size_t bl = pick < NW_MAX ? strlen(words[pick]) : 1;
    if (len + bl + 1 > cap) break;
    memcpy(text + len, b, bl);
    len += bl;
    json_mask_advance(m, pick);
    if (json_mask_dead(m)) break;
  }
  json_mask_free(m);
  free(text);
  return NULL;
}

/* code points of UTF-8 text */
static size_t cps(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
  return n;
}

/* The arguments of a call valid under our tools' schemas (tools_json's, or tools_xml's). */
static int args_ok(const char *name, const char *args) {
  json_t *a = json_loads(args, 0, NULL);
  int ok = json_is_object(a);
  if (ok && !strcmp(name, "get_weather")) {
    const json_t *c = json_object_get(a, "city"), *d = json_object_get(a, "days"),
                 *u = json_object_get(a, "unit");
    ok = json_is_string(c) && cps(json_string_value(c)) <= 6 &&
         (size_t)json_object_size(a) == 1u + (d != NULL) + (u != NULL);
    ok = ok &&
         (!d || (json_is_integer(d) && json_integer_value(d) >= 1 && json_integer_value(d) <= 7));
    ok = ok && (!u || (json_is_string(u) &&
                       (!strcmp(json_string_value(u), "c") || !strcmp(json_string_value(u), "f"))));
  } else if (ok && !strcmp(name, "search")) {
    const json_t *e = json_object_get(a, "exact"), *t = json_object_get(a, "tags");
    ok = json_is_string(json_object_get(a, "q")) &&
         json_object_size(a) == 1u + (e != NULL) + (t != NULL) && (!e || json_is_boolean(e)) &&
         (!t || (json_is_array(t) && json_array_size(t) <= 2));
    for (size_t i = 0; ok && t && i < json_array_size(t); i++)
      ok = json_is_integer(json_array_get(t, i));
  } else if (ok) {
    ok = !strcmp(name, "ping");
  }
  json_decref(a);
  return ok;
}

/* n generations under (name, max_calls, think), in the JSON or (xml) the XML form: each parses
 * as 1..max calls of allowed tools with valid arguments, and eos is never allowed first. */
static void run_form(const char *name, int max_calls, int think, int n, int xml) {
  json_error_t je;
  json_t *tools = json_loads(xml ? tools_xml : tools_json, 0, &je);
  words = xml ? xml_words : json_words;
  NW = xml ? (int)(sizeof xml_words / sizeof xml_words[0])
           : (int)(sizeof json_words / sizeof json_words[0]);
  json_vocab *v = vocab();
  char err[300];
  json_schema *g = tool_grammar_compile(tools, name, max_calls, err, sizeof err);
  EXPECT_MSG(g != NULL, "compile: %s", err);
  if (!g) return;
  if (xml) EXPECT_MSG(tool_grammar_xml(g, tools, name, err, sizeof err) == 0, "xml: %s", err);
  tool_grammar_think(g, think);
  int max_seen = 0, params_seen = 0;
  for (int r = 0; r < n && !test_cur_failed; r++) {
    int eos0 = 1;
    char *text = generate(v, g, &eos0);
    EXPECT_MSG(text != NULL, "run %d did not end with a complete call", r);
    EXPECT_MSG(!eos0, "eos allowed before any call");
    if (!text) break;
    chat_parsed p;
    EXPECT(chat_parse(text, think, tools, &p) == 0);
    size_t nc = p.tool_calls ? json_array_size(p.tool_calls) : 0;
    EXPECT_MSG(nc >= 1 && (!max_calls || nc <= (size_t)max_calls), "%zu calls in [%s]", nc, text);
    EXPECT_MSG(!p.content || !p.content[0], "content [%s] in [%s]", p.content, text);
    if ((int)nc > max_seen) max_seen = (int)nc;
    for (size_t i = 0; i < nc; i++) {
      const json_t *fn = json_object_get(json_array_get(p.tool_calls, i), "function");
      const char *nm = json_string_value(json_object_get(fn, "name"));
      const char *args = json_string_value(json_object_get(fn, "arguments"));
      EXPECT_MSG(nm && (!name || !strcmp(nm, name)), "tool %s in [%s]", nm, text);
      EXPECT_MSG(nm && args && args_ok(nm, args), "arguments %s of %s in [%s]", args, nm, text);
      if (args && strcmp(args, "{}")) params_seen++;
    }
    chat_parsed_free(&p);
    free(text);
  }
  if (!max_calls) EXPECT_MSG(max_seen > 1, "never more than %d call", max_seen);
  EXPECT_MSG(name && !strcmp(name, "ping") ? 1 : params_seen > 0, "never a call with arguments");
  json_schema_free(g);
  json_vocab_free(v);
  json_decref(tools);
}

static void run_case(const char *name, int max_calls, int think, int n) {
  run_form(name, max_calls, think, n, 0);
}

TEST(required_any_tool) { run_case(NULL, 0, 0, 300); }
TEST(named_tool) { run_case("search", 0, 0, 200); }
TEST(at_most_one_call) { run_case(NULL, 1, 0, 200); }
TEST(think_then_calls) { run_case("get_weather", 0, 1, 200); }

TEST(xml_required_any_tool) { run_form(NULL, 0, 0, 300, 1); }
TEST(xml_named_tool) { run_form("search", 0, 0, 200, 1); }
TEST(xml_at_most_one_call) { run_form(NULL, 1, 0, 200, 1); }
TEST(xml_think_then_calls) { run_form("get_weather", 0, 1, 200, 1); }

/* exact bytes of the XML form: the template's own rendering of a call is taken; what the parser
 * would cut or mistype is refused */
TEST(xml_feed_exact) {
  json_t *tools = json_loads(tools_xml, 0, NULL);
  words = json_words;
  json_vocab *v = vocab();
  char err[300];
  json_schema *g = tool_grammar_compile(tools, NULL, 0, err, sizeof err);
  EXPECT(tool_grammar_xml(g, tools, NULL, err, sizeof err) == 0);
  static const char *const ok[] = {
      "<tool_call>\n<function=ping>\n</function>\n</tool_call>",
      ("\n<tool_call>\n<function=get_weather>\n<parameter=city>\nA \"b\"\n\n</parameter>\n"
       "<parameter=days>\n7\n</parameter>\n<parameter=unit>\nf\n</parameter>\n</function>\n"
       "</tool_call>"),
      ("<tool_call>\n<function=search>\n<parameter=q>\nx<y\n</parameter>\n<parameter=exact>\n"
       "false\n</parameter>\n<parameter=tags>\n[1, 2]\n</parameter>\n</function>\n</tool_call>")};
  static const char *const bad[] = {
      "<tool_call>\n<function=get_weather>\n</function>", /* city is required */
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, France\n",
      "<tool_call>\n<function=get_weather>\n<parameter=days>\n1\n</parameter>\n<parameter=city>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nx</parameter>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=days>\n8",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=unit>\nk",
      "<tool_call>\n<function=search>\n<parameter=q>\nx</tool_call>",
      "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n<parameter=exact>\nTrue",
      "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n<parameter=tags>\n[1,\n<",
      "<tool_call>\n<function=search>\n<parameter=nope>"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    json_mask *m = json_mask_new_schema(v, g);
    EXPECT_MSG(json_mask_feed(m, ok[i], strlen(ok[i])) == 0 && json_mask_complete(m), "ok %zu", i);
    chat_parsed p;
    EXPECT(chat_parse(ok[i], 0, tools, &p) == 0);
    EXPECT_MSG(p.tool_calls && json_array_size(p.tool_calls) == 1, "parsed %zu", i);
    const json_t *fn = json_object_get(json_array_get(p.tool_calls, 0), "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    EXPECT_MSG(nm && args && args_ok(nm, args), "ok %zu: %s %s", i, nm, args);
    if (i == 1) EXPECT_MSG(args && strstr(args, "\"A \\\"b\\\"\\n\""), "args %s", args);
    chat_parsed_free(&p);
    json_mask_free(m);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_mask *m = json_mask_new_schema(v, g);
    int rc = json_mask_feed(m, bad[i], strlen(bad[i]));
    EXPECT_MSG(rc == -1 || (i == 1 && !json_mask_complete(m)), "bad %zu taken", i);
    json_mask_free(m);
  }
  json_schema_free(g);
  json_vocab_free(v);
  json_decref(tools);
}

TEST(xml_compile_errors) {
  char err[300];
  static const char *const cases[][2] = {
      {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
       "\"object\",\"properties\":{\"a>b\":{\"type\":\"string\"}}}}}]",
       "a>b"},
      {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
       "\"object\",\"anyOf\":[{\"required\":[]}]}}}]",
       "anyOf"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *tools = json_loads(cases[i][0], 0, NULL);
    json_schema *g = tool_grammar_compile(tools, NULL, 0, err, sizeof err);
    err[0] = 0;
    EXPECT(g == NULL || tool_grammar_xml(g, tools, NULL, err, sizeof err) == -1);
    EXPECT_MSG(g == NULL || strstr(err, cases[i][1]), "err: %s", err);
    json_schema_free(g);
    json_decref(tools);
  }
}

/* tool_choice auto with parallel_tool_calls false: any token (eos too) until the first call
 * block closes outside the think block, then only eos */
static int n_allowed(const json_mask *m, int *eos_ok) {
  float logits[NV];
  for (int i = 0; i < NV; i++) logits[i] = 0;
  json_mask_apply(m, logits, NV);
  int n = 0;
  for (int i = 0; i < NV; i++) n += logits[i] == 0;
  *eos_ok = logits[EOS_ID] == 0;
  return n;
}

TEST(single_call_auto) {
  words = json_words;
  NW = (int)(sizeof json_words / sizeof json_words[0]);
  json_vocab *v = vocab();
  for (int think = 0; think <= 1; think++) {
    json_schema *g = tool_grammar_single();
    REQUIRE(g != NULL);
    tool_grammar_think(g, think);
    json_mask *m = json_mask_new_schema(v, g);
    int eos = 0, all = n_allowed(m, &eos);
    EXPECT_MSG(eos && all > NW + 0x7f - 0x09, "%d allowed at the start", all);
    const char *pre =
        think ? "hm <tool_call>x</tool_call> </think>\n\nLet me look. " : "Let me look. ";
    const char *call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call";
    EXPECT(json_mask_feed(m, pre, strlen(pre)) == 0);
    EXPECT(json_mask_feed(m, call, strlen(call)) == 0);
    EXPECT_MSG(n_allowed(m, &eos) == all && eos, "think %d: still free before the last '>'", think);
    json_mask_advance(m, NW_MAX + '>');
    EXPECT(!json_mask_dead(m) && json_mask_complete(m));
    EXPECT_MSG(n_allowed(m, &eos) == 1 && eos, "think %d: only eos after the call", think);
    EXPECT(json_mask_feed(m, "\n", 1) == -1);
    json_mask_free(m);
    json_schema_free(g);
  }
  json_vocab_free(v);
}

TEST(compile_errors) {
  json_t *tools = json_loads(tools_json, 0, NULL);
  char err[300];
  EXPECT(tool_grammar_compile(tools, "nope", 0, err, sizeof err) == NULL);
  EXPECT(tool_grammar_compile(NULL, NULL, 0, err, sizeof err) == NULL);
  json_t *bad = json_loads(
      "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
      "{\"type\":\"object\",\"not\":{}}}}]",
      0, NULL);
  EXPECT(tool_grammar_compile(bad, NULL, 0, err, sizeof err) == NULL);
  EXPECT_MSG(strstr(err, "'f'") && strstr(err, "not"), "err: %s", err);
  json_decref(bad);
  json_decref(tools);
}

/* exact bytes: the literal is forced, a wrong name or a missing suffix is refused */
TEST(feed_exact) {
  json_t *tools = json_loads(tools_json, 0, NULL);
  json_vocab *v = vocab();
  char err[300];
  json_schema *g = tool_grammar_compile(tools, NULL, 0, err, sizeof err);
  json_mask *m = json_mask_new_schema(v, g);
  const char *ok = "\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
  EXPECT(json_mask_feed(m, ok, strlen(ok)) == 0);
  EXPECT(json_mask_complete(m));
  json_mask_free(m);
  m = json_mask_new_schema(v, g);
  const char *bad = "<tool_call>\n{\"name\": \"pong\"";
  EXPECT(json_mask_feed(m, bad, strlen(bad)) == -1);
  json_mask_free(m);
  m = json_mask_new_schema(v, g);
  EXPECT(json_mask_feed(m, "hello", 5) == -1);
  json_mask_free(m);
  json_schema_free(g);
  json_vocab_free(v);
  json_decref(tools);
}

int main(void) {
  RUN(compile_errors);
  RUN(feed_exact);
  RUN(required_any_tool);
  RUN(named_tool);
  RUN(at_most_one_call);
  RUN(think_then_calls);
  RUN(single_call_auto);
  RUN(xml_feed_exact);
  RUN(xml_compile_errors);
  RUN(xml_required_any_tool);
  RUN(xml_named_tool);
  RUN(xml_at_most_one_call);
  RUN(xml_think_then_calls);
  TEST_MAIN_END();
}
