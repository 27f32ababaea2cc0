#include "server/openai_stream.h"

#include <stdlib.h>
#include <string.h>

#include "server/openai_response.h"
#include "tokenizer/chat_parse.h"

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools) {
  memset(s, 0, sizeof *s);
  s->thinking_open = thinking_open;
  s->tools = tools;
  srvbuf_init(&s->sent_reasoning);
  srvbuf_init(&s->sent_content);
}

void openai_stream_free(openai_stream *s) {
  srvbuf_free(&s->sent_reasoning);
  srvbuf_free(&s->sent_content);
}

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

/* Appends to `delta` under `key` the part of `now` beyond `sent`, when `now` extends it. */
static int extend(json_t *delta, const char *key, srvbuf *sent, const char *now, size_t now_len) {
  if (now_len <= sent->len) return 0;
  if (sent->len && memcmp(now, sent->data, sent->len)) return 0; /* diverged: send nothing more */
  json_t *v = openai_response_string(now + sent->len, now_len - sent->len);
  if (!v || json_object_set_new(delta, key, v)) return -1;
  return srvbuf_append(sent, now + sent->len, now_len - sent->len);
}

static size_t trim_right(const char *s, size_t n) {
  while (n > 0 && is_space(s[n - 1])) n--;
  return n;
}

int openai_stream_delta(openai_stream *s, const char *text, size_t len, int final, json_t **delta) {
  *delta = NULL;
  json_t *d = json_object();
  if (!d) return -1;
  char *r = NULL, *c = NULL;
  size_t rl = 0, cl = 0;
  json_t *calls = NULL;
  chat_parsed p;
  memset(&p, 0, sizeof p);
  int parsed = 0;

  if (final) {
    if (chat_parse(text ? text : "", s->thinking_open, s->tools, &p)) goto oom;
    parsed = 1;
    r = p.reasoning_content;
    c = p.content;
    rl = r ? strlen(r) : 0;
    cl = c ? strlen(c) : 0;
    calls = p.tool_calls;
  } else {
    size_t n = len;
    /* hold back what could still become a tag */
    size_t h1 = openai_response_tag_holdback(text, n, "</think>");
    size_t h2 = openai_response_tag_holdback(text, n, "<tool_call>");
    size_t h3 = n < 7 ? openai_response_tag_holdback(text, n, "<think>") : 0;
    size_t h = h1 > h2 ? h1 : h2;
    if (h3 > h) h = h3;
    n -= h;
    size_t ws = 0;
    while (ws < n && is_space(text[ws])) ws++;
    int in_think = s->thinking_open || (n - ws >= 7 && !memcmp(text + ws, "<think>", 7));
    const char *end_think = find_mem(text, n, "</think>");
    if (!in_think && end_think) in_think = 1;
    if (end_think || !in_think) {
      /* content from here on: stop before the first tool call (sent whole at the end) */
      size_t after = end_think ? (size_t)(end_think - text) + 8 : 0;
      const char *call = find_mem(text + after, n - after, "<tool_call>");
      if (call) n = (size_t)(call - text);
    }
    char *prefix = malloc(n + 1);
    if (!prefix) goto oom;
    memcpy(prefix, text, n);
    prefix[n] = 0;
    int rc = chat_parse(prefix, s->thinking_open, NULL, &p);
    free(prefix);
    if (rc) goto oom;
    parsed = 1;
    r = p.reasoning_content;
    c = p.content;
    /* trailing whitespace may still be trimmed away (before a tag) or kept: wait */
    rl = r ? trim_right(r, strlen(r)) : 0;
    cl = c ? trim_right(c, strlen(c)) : 0;
    if (p.tool_calls) cl = 0; /* a call parsed already: wait for the final parse */
    if (in_think && !end_think) cl = 0;
  }
  if (r && extend(d, "reasoning_content", &s->sent_reasoning, r, rl)) goto oom;
  if (c && extend(d, "content", &s->sent_content, c, cl)) goto oom;
  if (calls && json_array_size(calls) > 0) {
    json_t *arr = json_array();
    if (!arr) goto oom;
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
      json_t *e = json_deep_copy(tc);
      if (!e) {
        json_decref(arr);
        goto oom;
      }
      json_object_set_new(e, "index", json_integer((json_int_t)i));
      json_array_append_new(arr, e);
    }
    json_object_set_new(d, "tool_calls", arr);
    s->n_tool_calls = (int)json_array_size(calls);
  }
  if (parsed) chat_parsed_free(&p);
  if (json_object_size(d) == 0) {
    json_decref(d);
    return 0;
  }
  *delta = d;
  return 0;
oom:
  if (parsed) chat_parsed_free(&p);
  json_decref(d);
  return -1;
}
