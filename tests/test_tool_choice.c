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

static const char *const words[] = {
    "<tool_call>", "</tool_call>", "\n",     "{\"name\": \"", "\", \"arguments\": ", "}\n",
    "</think>",    "get_weather",  "search", "\"city\": \"",  "\"days\": ",          "\"q\": \""};
enum { NW = sizeof words / sizeof words[0] };
#define NV (NW + 0x7f + 1) /* words, bytes 0..0x7e (below 0x09: empty), eos */
#define EOS_ID (NV - 1)

static json_vocab *vocab(void) {
  const char *bytes[NV];
  size_t lens[NV];
  static char one[0x7f];
  for (int i = 0; i < NW; i++) {
    bytes[i] = words[i];
    lens[i] = strlen(words[i]);
  }
  for (int c = 0; c < 0x7f; c++) {
    one[c] = (char)c;
    bytes[NW + c] = &one[c];
    lens[NW + c] = c >= 0x09 ? 1 : 0;
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
    for (int i = 0; i < n && ids[i] < NW; i++) nw++;
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
    const char *b = pick < NW ? words[pick] : (const char[]){(char)(pick - NW), 0};
    size_t bl = pick < NW ? strlen(words[pick]) : 1;
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

/* The arguments of a call valid under our tools' schemas. */
static int args_ok(const char *name, const char *args) {
  json_t *a = json_loads(args, 0, NULL);
  int ok = json_is_object(a);
  if (ok && !strcmp(name, "get_weather")) {
    const json_t *c = json_object_get(a, "city"), *d = json_object_get(a, "days");
    ok = json_is_string(c) && (size_t)json_object_size(a) == 1u + (d != NULL);
    ok = ok &&
         (!d || (json_is_integer(d) && json_integer_value(d) >= 1 && json_integer_value(d) <= 7));
  } else if (ok && !strcmp(name, "search")) {
    ok = json_is_string(json_object_get(a, "q")) && json_object_size(a) == 1;
  } else if (ok) {
    ok = !strcmp(name, "ping");
  }
  json_decref(a);
  return ok;
}

/* n generations under (name, max_calls, think): each parses as 1..max calls of allowed tools
 * with valid arguments, and eos is never allowed first. */
static void run_case(const char *name, int max_calls, int think, int n) {
  json_error_t je;
  json_t *tools = json_loads(tools_json, 0, &je);
  json_vocab *v = vocab();
  char err[300];
  json_schema *g = tool_grammar_compile(tools, name, max_calls, err, sizeof err);
  EXPECT_MSG(g != NULL, "compile: %s", err);
  if (!g) return;
  tool_grammar_think(g, think);
  int max_seen = 0;
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
    }
    chat_parsed_free(&p);
    free(text);
  }
  if (!max_calls) EXPECT_MSG(max_seen > 1, "never more than %d call", max_seen);
  json_schema_free(g);
  json_vocab_free(v);
  json_decref(tools);
}

TEST(required_any_tool) { run_case(NULL, 0, 0, 300); }
TEST(named_tool) { run_case("search", 0, 0, 200); }
TEST(at_most_one_call) { run_case(NULL, 1, 0, 200); }
TEST(think_then_calls) { run_case("get_weather", 0, 1, 200); }

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
  TEST_MAIN_END();
}
