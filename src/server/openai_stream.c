#include "server/openai_stream.h"

#include <stdlib.h>
#include <string.h>

#include "server/openai_response.h"
#include "tokenizer/chat_parse.h"

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools) {
  memset(s, 0, sizeof *s);
  s->thinking_open = thinking_open;
  s->tools = tools;
  strbuf_init(&s->sent_reasoning);
  strbuf_init(&s->sent_content);
}

void openai_stream_free(openai_stream *s) {
  strbuf_free(&s->sent_reasoning);
  strbuf_free(&s->sent_content);
}

/* The whitespace chat_parse skips before "<think>" and drops around tool calls. */
static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int openai_stream_prompt_thinking_open(const char *rendered, size_t len) {
  while (len > 0 && is_space(rendered[len - 1])) len--;
  return len >= 7 && !memcmp(rendered + len - 7, "<think>", 7);
}

static const char *find_mem(const char *h, size_t hl, const char *n) {
  size_t nl = strlen(n);
  if (nl == 0 || nl > hl) return NULL;
  for (size_t i = 0; i + nl <= hl; i++)
    if (h[i] == n[0] && !memcmp(h + i, n, nl)) return h + i;
  return NULL;
}

/* The parts of a partial text that chat_parse of any longer text will still begin with. */
typedef struct stable_parts {
  const char *r; /* reasoning so far (NULL: none yet) */
  size_t rl;
  const char *c; /* content so far (NULL: none yet) */
  size_t cl;
} stable_parts;

static void stable_of(const openai_stream *s, const char *text, size_t len, stable_parts *out) {
  memset(out, 0, sizeof *out);
  size_t p = 0;
  while (p < len && is_space(text[p])) p++;
  size_t rest = len - p;
  if (rest < 7 && !memcmp(text + p, "<think>", rest)) return; /* may still open a think block */
  int opened = rest >= 7 && !memcmp(text + p, "<think>", 7);
  size_t c0 = 0;
  if (opened || s->thinking_open) {
    size_t r0 = opened ? p + 7 : 0;
    const char *close = find_mem(text + r0, len - r0, "</think>");
    size_t rend = close ? (size_t)(close - text)
                        : len - openai_response_tag_holdback(text + r0, len - r0, "</think>");
    size_t a = r0;
    while (a < rend && text[a] == '\n') a++; /* chat_parse strips leading newlines */
    size_t b = close ? rend : a + openai_response_utf8_complete(text + a, rend - a);
    while (b > a && text[b - 1] == '\n') b--; /* trailing ones: stripped before </think> */
    out->r = text + a;
    out->rl = b - a;
    if (!close) return;
    c0 = rend + 8;
    while (c0 < len && text[c0] == '\n') c0++;
  }
  size_t n = chat_parse_safe_prefix(text + c0, len - c0);
  while (n > 0 && is_space(text[c0 + n - 1])) n--;
  out->c = text + c0;
  out->cl = n;
}

/* Adds to `delta` under `key` the part of `now` beyond `sent`, when `now` extends it. */
static int extend(json_t *delta, const char *key, strbuf *sent, const char *now, size_t now_len) {
  if (now_len <= sent->len) return 0;
  if (sent->len && memcmp(now, sent->data, sent->len)) return 0; /* diverged: send nothing more */
  json_t *v = openai_response_string(now + sent->len, now_len - sent->len);
  if (!v || json_object_set_new(delta, key, v)) return -1;
  return strbuf_append(sent, now + sent->len, now_len - sent->len);
}

/* {"tool_calls":[entry]} */
static int push_call_delta(json_t *deltas, json_t *entry) {
  json_t *d = entry ? json_pack("{s:[o]}", "tool_calls", entry) : NULL;
  if (!d) return -1;
  return json_array_append_new(deltas, d);
}

static int push_tool_calls(json_t *deltas, const json_t *calls) {
  size_t i;
  const json_t *tc;
  json_array_foreach(calls, i, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *id = json_string_value(json_object_get(tc, "id"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *head =
        json_pack("{s:I, s:s, s:s, s:{s:s, s:s}}", "index", (json_int_t)i, "id", id ? id : "",
                  "type", "function", "function", "name", name ? name : "", "arguments", "");
    if (push_call_delta(deltas, head)) return -1;
    if (args && args[0]) {
      json_t *body =
          json_pack("{s:I, s:{s:s}}", "index", (json_int_t)i, "function", "arguments", args);
      if (push_call_delta(deltas, body)) return -1;
    }
  }
  return 0;
}

int openai_stream_deltas(openai_stream *s, const char *text, size_t len, int final,
                         json_t **deltas) {
  *deltas = NULL;
  if (!text) text = "", len = 0;
  json_t *out = json_array(), *d = json_object();
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (!out || !d) goto oom;
  if (final) {
    char *whole = malloc(len + 1);
    if (!whole) goto oom;
    memcpy(whole, text, len);
    whole[len] = 0;
    int rc = chat_parse(whole, s->thinking_open, s->tools, &p);
    free(whole);
    if (rc) goto oom;
    if (p.reasoning_content && extend(d, "reasoning_content", &s->sent_reasoning,
                                      p.reasoning_content, strlen(p.reasoning_content)))
      goto oom;
    if (p.content && extend(d, "content", &s->sent_content, p.content, strlen(p.content))) goto oom;
  } else {
    stable_parts sp;
    stable_of(s, text, len, &sp);
    if (sp.r && extend(d, "reasoning_content", &s->sent_reasoning, sp.r, sp.rl)) goto oom;
    if (sp.c && extend(d, "content", &s->sent_content, sp.c, sp.cl)) goto oom;
  }
  if (json_object_size(d) > 0) {
    if (json_array_append_new(out, d)) {
      d = NULL;
      goto oom;
    }
  } else {
    json_decref(d);
  }
  d = NULL;
  if (final && p.tool_calls && json_array_size(p.tool_calls) > 0) {
    if (push_tool_calls(out, p.tool_calls)) goto oom;
    s->n_tool_calls = (int)json_array_size(p.tool_calls);
  }
  chat_parsed_free(&p);
  if (json_array_size(out) == 0) {
    json_decref(out);
    return 0;
  }
  *deltas = out;
  return 0;
oom:
  chat_parsed_free(&p);
  json_decref(d);
  json_decref(out);
  return -1;
}
