#include "server/openai_stream.h"

#include <stdlib.h>
#include <string.h>

#include "server/openai_response.h"
#include "tokenizer/chat_parse.h"

void openai_stream_init(openai_stream *s, int thinking_open, const json_t *tools) {
  memset(s, 0, sizeof *s);
  s->parser = chat_parse_stream_new(thinking_open, tools, NULL, NULL);
  chat_parse_out_init(&s->out);
}

void openai_stream_free(openai_stream *s) {
  chat_parse_stream_free(s->parser);
  chat_parse_out_free(&s->out);
  memset(s, 0, sizeof *s);
}

/* The whitespace chat_parse skips before "<think>" and drops around tool calls. */
static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int openai_stream_prompt_thinking_open(const char *rendered, size_t len) {
  while (len > 0 && is_space(rendered[len - 1])) len--;
  return len >= 7 && !memcmp(rendered + len - 7, "<think>", 7);
}

/* Moves the sendable bytes of `pending` (all when final, else up to the last whole UTF-8
 * character) into delta[key]. */
static int take_text(json_t *delta, const char *key, strbuf *pending, int final) {
  size_t n = final ? pending->len : openai_response_utf8_complete(pending->data, pending->len);
  if (n == 0) return 0;
  json_t *v = openai_response_string(pending->data, n);
  if (!v || json_object_set_new(delta, key, v)) return -1;
  strbuf_consume(pending, n);
  return 0;
}

/* {"tool_calls":[entry]} */
static int push_call_delta(json_t *deltas, json_t *entry) {
  json_t *d = entry ? json_pack("{s:[o]}", "tool_calls", entry) : NULL;
  if (!d) return -1;
  return json_array_append_new(deltas, d);
}

static int push_tool_calls(json_t *deltas, const json_t *calls, int first_index) {
  size_t i;
  const json_t *tc;
  json_array_foreach(calls, i, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *id = json_string_value(json_object_get(tc, "id"));
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_int_t index = (json_int_t)first_index + (json_int_t)i;
    json_t *head =
        json_pack("{s:I, s:s, s:s, s:{s:s, s:s}}", "index", index, "id", id ? id : "", "type",
                  "function", "function", "name", name ? name : "", "arguments", "");
    if (push_call_delta(deltas, head)) return -1;
    if (args && args[0]) {
      json_t *body = json_pack("{s:I, s:{s:s}}", "index", index, "function", "arguments", args);
      if (push_call_delta(deltas, body)) return -1;
    }
  }
  return 0;
}

int openai_stream_deltas(openai_stream *s, const char *text, size_t len, int final,
                         json_t **deltas) {
  *deltas = NULL;
  if (!s->parser) return -1;
  if (s->finished) return 0;
  if (len > s->fed) {
    if (chat_parse_stream_feed(s->parser, text + s->fed, len - s->fed, &s->out)) return -1;
    s->fed = len;
  }
  if (final) {
    if (chat_parse_stream_finish(s->parser, &s->out)) return -1;
    s->finished = 1;
  }
  json_t *out = json_array(), *d = json_object();
  if (!out || !d) goto oom;
  if (take_text(d, "reasoning_content", &s->out.reasoning, final) ||
      take_text(d, "content", &s->out.content, final))
    goto oom;
  if (json_object_size(d) > 0) {
    if (json_array_append_new(out, d)) {
      d = NULL;
      goto oom;
    }
  } else {
    json_decref(d);
  }
  d = NULL;
  size_t nc = json_array_size(s->out.calls);
  if (nc > 0) {
    if (push_tool_calls(out, s->out.calls, s->n_tool_calls)) goto oom;
    s->n_tool_calls += (int)nc;
    json_array_clear(s->out.calls);
  }
  if (json_array_size(out) == 0) {
    json_decref(out);
    return 0;
  }
  *deltas = out;
  return 0;
oom:
  json_decref(d);
  json_decref(out);
  return -1;
}
