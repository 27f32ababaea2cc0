#include "server/anthropic_stream.h"

#include <stdlib.h>
#include <string.h>

#include "server/anthropic_response.h"
#include "server/openai_stream.h"

typedef enum {
  ANTHROPIC_STREAM_BLOCK_NONE,
  ANTHROPIC_STREAM_BLOCK_THINKING,
  ANTHROPIC_STREAM_BLOCK_TEXT,
  ANTHROPIC_STREAM_BLOCK_TOOL,
} anthropic_stream_block;

struct anthropic_stream {
  openai_stream st; /* the parser and its deltas */
  char *id, *model;
  int started;                 /* message_start sent */
  int done;                    /* message_stop sent */
  anthropic_stream_block open; /* the block now open */
  int index;                   /* the open block's index (the next one's when none is open) */
  int n_calls;                 /* tool_use blocks sent */
};

anthropic_stream *anthropic_stream_new(const char *id, const char *model, int thinking_open,
                                       const json_t *tools) {
  anthropic_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  openai_stream_init(&s->st, thinking_open, tools);
  s->id = strdup(id);
  s->model = strdup(model);
  if (!s->st.parser || !s->id || !s->model) {
    anthropic_stream_free(s);
    return NULL;
  }
  return s;
}

void anthropic_stream_free(anthropic_stream *s) {
  if (!s) return;
  openai_stream_free(&s->st);
  free(s->id);
  free(s->model);
  free(s);
}

/* "event: <type>\ndata: <j>\n\n"; takes j. */
static int put_event(strbuf *out, json_t *j) {
  char *d = j ? json_dumps(j, JSON_COMPACT) : NULL;
  const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
  int rc = -1;
  if (d && type) {
    strbuf_printf(out, "event: %s\ndata: ", type);
    strbuf_puts(out, d);
    strbuf_puts(out, "\n\n");
    rc = out->oom ? -1 : 0;
  }
  free(d);
  json_decref(j);
  return rc;
}

int anthropic_stream_error(strbuf *out, const openai_error *e) {
  return put_event(out, anthropic_response_error_json(e));
}

static int stop_block(anthropic_stream *s, strbuf *out) {
  if (s->open == ANTHROPIC_STREAM_BLOCK_NONE) return 0;
  s->open = ANTHROPIC_STREAM_BLOCK_NONE;
  return put_event(out, json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->index++));
}

/* Starts block (a new reference, taken) of kind k, stopping the open one. */
static int start_block(anthropic_stream *s, anthropic_stream_block k, json_t *block, strbuf *out) {
  if (stop_block(s, out)) {
    json_decref(block);
    return -1;
  }
  s->open = k;
  return put_event(out, block ? json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                          s->index, "content_block", block)
                              : NULL);
}

static int put_delta(anthropic_stream *s, json_t *delta, strbuf *out) {
  return put_event(out, delta ? json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
                                          s->index, "delta", delta)
                              : NULL);
}

/* Text of kind k (thinking or text): into the open block of that kind, or a new one. */
static int put_text(anthropic_stream *s, anthropic_stream_block k, const json_t *text,
                    strbuf *out) {
  int think = k == ANTHROPIC_STREAM_BLOCK_THINKING;
  if (s->open != k && start_block(s, k,
                                  think ? json_pack("{s:s, s:s, s:s}", "type", "thinking",
                                                    "thinking", "", "signature", "")
                                        : json_pack("{s:s, s:s}", "type", "text", "text", ""),
                                  out))
    return -1;
  return put_delta(s,
                   json_pack("{s:s, s:O}", "type", think ? "thinking_delta" : "text_delta",
                             think ? "thinking" : "text", text),
                   out);
}

/* A tool call's head (id, name) or its arguments, as openai_stream sends them. */
static int put_call(anthropic_stream *s, const json_t *entry, strbuf *out) {
  if (json_object_get(entry, "id")) {
    json_t *tu = anthropic_response_tool_use(entry);
    if (tu) json_object_set_new(tu, "input", json_object());
    s->n_calls++;
    return start_block(s, ANTHROPIC_STREAM_BLOCK_TOOL, tu, out);
  }
  /* the input as the message shows it (arguments that are no object become {}) */
  json_t *tu = anthropic_response_tool_use(entry);
  char *js = tu ? json_dumps(json_object_get(tu, "input"), JSON_COMPACT) : NULL;
  json_decref(tu);
  if (!js) return -1;
  int rc =
      put_delta(s, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json", js), out);
  free(js);
  return rc;
}

static int put_start(anthropic_stream *s, const server_gen *g, strbuf *out) {
  s->started = 1;
  json_t *msg =
      json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i, s:i, s:i}}", "id", s->id, "type",
                "message", "role", "assistant", "model", s->model, "content", "stop_reason",
                "stop_sequence", "usage", "input_tokens", g->prompt_tokens, "output_tokens", 0,
                "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0);
  if (put_event(out, msg ? json_pack("{s:s, s:o}", "type", "message_start", "message", msg) : NULL))
    return -1;
  return put_event(out, json_pack("{s:s}", "type", "ping"));
}

static int put_end(anthropic_stream *s, const server_gen *g, strbuf *out) {
  s->done = 1;
  if (stop_block(s, out)) return -1;
  json_t *delta =
      json_pack("{s:s, s:o}", "stop_reason", anthropic_response_stop_reason(g, s->n_calls > 0),
                "stop_sequence", anthropic_response_stop_sequence(g));
  if (put_event(out, delta ? json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", delta,
                                       "usage", anthropic_response_usage(g))
                           : NULL))
    return -1;
  return put_event(out, json_pack("{s:s}", "type", "message_stop"));
}

int anthropic_stream_events(anthropic_stream *s, const server_gen *g, size_t visible, strbuf *out) {
  if (s->done) return 0;
  if (!s->started && put_start(s, g, out)) return -1;
  json_t *deltas = NULL;
  if (openai_stream_deltas(&s->st, g->text.data ? g->text.data : "", visible, g->done, &deltas))
    return -1;
  size_t i;
  const json_t *d;
  int rc = 0;
  json_array_foreach(deltas, i, d) {
    const json_t *r = json_object_get(d, "reasoning_content"), *c = json_object_get(d, "content"),
                 *calls = json_object_get(d, "tool_calls");
    if (r && put_text(s, ANTHROPIC_STREAM_BLOCK_THINKING, r, out)) rc = -1;
    if (c && put_text(s, ANTHROPIC_STREAM_BLOCK_TEXT, c, out)) rc = -1;
    for (size_t k = 0; k < json_array_size(calls); k++)
      if (put_call(s, json_array_get(calls, k), out)) rc = -1;
    if (rc) break;
  }
  json_decref(deltas);
  if (rc == 0 && g->done) rc = put_end(s, g, out);
  return rc;
}
