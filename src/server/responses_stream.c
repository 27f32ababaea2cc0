#include "server/responses_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void responses_stream_init(responses_stream *s, const json_t *echo, const char *id,
                           long long created, const char *model, int parallel, int thinking_open,
                           const json_t *tools, int encrypted) {
  memset(s, 0, sizeof *s);
  openai_stream_init(&s->chat, thinking_open, tools);
  s->echo = echo;
  s->model = model;
  snprintf(s->id, sizeof s->id, "%s", id);
  s->created = created;
  s->parallel = parallel;
  s->encrypted = encrypted;
  s->output = json_array();
  s->open = -1;
  strbuf_init(&s->text);
  strbuf_init(&s->reasoning_all);
}

void responses_stream_free(responses_stream *s) {
  openai_stream_free(&s->chat);
  json_decref(s->output);
  strbuf_free(&s->text);
  strbuf_free(&s->reasoning_all);
  memset(s, 0, sizeof *s);
  s->open = -1;
}

/* One event: ev gets "type" and "sequence_number" and is taken. */
static int emit(responses_stream *s, strbuf *out, const char *type, json_t *ev) {
  if (!ev) return -1;
  json_object_set_new(ev, "type", json_string(type));
  json_object_set_new(ev, "sequence_number", json_integer(s->seq++));
  char *j = json_dumps(ev, JSON_COMPACT);
  json_decref(ev);
  if (!j) return -1;
  strbuf_printf(out, "event: %s\ndata: %s\n\n", type, j);
  free(j);
  return out->oom ? -1 : 0;
}

static json_t *item_event(int index, const json_t *item) {
  return json_pack("{s:i, s:O}", "output_index", index, "item", item);
}

static json_t *part_of(int message, const char *text, size_t len) {
  json_t *t = json_stringn(text ? text : "", len);
  return message ? json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", t, "annotations")
                 : json_pack("{s:s, s:o}", "type", "reasoning_text", "text", t);
}

static json_t *in_item(int index, const json_t *item) {
  return json_pack("{s:O, s:i, s:i}", "item_id", json_object_get(item, "id"), "output_index", index,
                   "content_index", 0);
}

static int open_item(responses_stream *s, int message, strbuf *out) {
  char id[64];
  responses_response_item_id(id, sizeof id, message ? "msg" : "rs");
  json_t *item = message ? responses_response_message_item(id, "", 0, "in_progress")
                         : responses_response_reasoning_item(id, "", 0, s->encrypted);
  if (!item) return -1;
  json_array_clear(json_object_get(item, "content")); /* its part comes as an event */
  int index = (int)json_array_size(s->output);
  if (json_array_append_new(s->output, item)) return -1;
  s->open = index;
  s->open_message = message;
  if (message) s->have_message = 1;
  s->text.len = 0;
  if (emit(s, out, "response.output_item.added", item_event(index, item))) return -1;
  json_t *ev = in_item(index, item);
  if (ev) json_object_set_new(ev, "part", part_of(message, "", 0));
  return emit(s, out, "response.content_part.added", ev);
}

static int close_item(responses_stream *s, strbuf *out) {
  if (s->open < 0) return 0;
  int index = s->open, message = s->open_message;
  s->open = -1;
  json_t *item = json_array_get(s->output, (size_t)index);
  const char *text = s->text.data ? s->text.data : "";
  json_t *ev = in_item(index, item);
  if (ev) json_object_set_new(ev, "text", json_stringn(text, s->text.len));
  if (ev && message) json_object_set_new(ev, "logprobs", json_array());
  if (emit(s, out, message ? "response.output_text.done" : "response.reasoning_text.done", ev))
    return -1;
  ev = in_item(index, item);
  if (ev) json_object_set_new(ev, "part", part_of(message, text, s->text.len));
  if (emit(s, out, "response.content_part.done", ev)) return -1;
  json_t *done =
      message ? responses_response_message_item(json_string_value(json_object_get(item, "id")),
                                                text, s->text.len, "completed")
              : responses_response_reasoning_item(json_string_value(json_object_get(item, "id")),
                                                  text, s->text.len, s->encrypted);
  if (!done || json_array_set_new(s->output, (size_t)index, done)) return -1;
  return emit(s, out, "response.output_item.done", item_event(index, done));
}

static int text_delta(responses_stream *s, int message, const json_t *v, strbuf *out) {
  if (!json_is_string(v) || json_string_length(v) == 0) return 0;
  if (s->open >= 0 && s->open_message != message && close_item(s, out)) return -1;
  if (s->open < 0 && open_item(s, message, out)) return -1;
  const char *d = json_string_value(v);
  size_t n = json_string_length(v);
  strbuf_append(&s->text, d, n);
  if (!message) strbuf_append(&s->reasoning_all, d, n);
  json_t *ev = in_item(s->open, json_array_get(s->output, (size_t)s->open));
  if (ev) json_object_set(ev, "delta", (json_t *)v);
  if (ev && message) json_object_set_new(ev, "logprobs", json_array());
  return emit(s, out, message ? "response.output_text.delta" : "response.reasoning_text.delta", ev);
}

/* A finished tool call: its head delta and its arguments delta (NULL when ""). */
static int call_events(responses_stream *s, const json_t *head, const json_t *args, strbuf *out) {
  if (close_item(s, out)) return -1;
  if (!s->parallel && s->n_calls >= 1) return 0;
  char id[64];
  responses_response_item_id(id, sizeof id, "fc");
  json_t *item = responses_response_call_item(id, head, "in_progress");
  if (!item) return -1;
  int index = (int)json_array_size(s->output);
  if (json_array_append_new(s->output, item)) return -1;
  s->n_calls++;
  if (emit(s, out, "response.output_item.added", item_event(index, item))) return -1;
  const char *a =
      args ? json_string_value(json_object_get(json_object_get(args, "function"), "arguments"))
           : NULL;
  if (!a) a = "";
  if (a[0] && emit(s, out, "response.function_call_arguments.delta",
                   json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", index, "delta", a)))
    return -1;
  if (emit(s, out, "response.function_call_arguments.done",
           json_pack("{s:s, s:i, s:O, s:s}", "item_id", id, "output_index", index, "name",
                     json_object_get(item, "name"), "arguments", a)))
    return -1;
  json_t *done = json_copy(item);
  if (!done) return -1;
  json_object_set_new(done, "arguments", json_string(a));
  json_object_set_new(done, "status", json_string("completed"));
  if (json_array_set_new(s->output, (size_t)index, done)) return -1;
  return emit(s, out, "response.output_item.done", item_event(index, done));
}

int responses_stream_start(responses_stream *s, strbuf *out) {
  json_t *r =
      responses_response_object(s->echo, s->id, s->created, s->model, "in_progress", NULL, NULL);
  if (emit(s, out, "response.created", json_pack("{s:O}", "response", r))) {
    json_decref(r);
    return -1;
  }
  int rc = emit(s, out, "response.in_progress", json_pack("{s:O}", "response", r));
  json_decref(r);
  return rc;
}

int responses_stream_step(responses_stream *s, const char *text, size_t len, int final,
                          strbuf *out) {
  if (s->ended) return 0;
  json_t *deltas = NULL;
  if (openai_stream_deltas(&s->chat, text, len, final, &deltas)) return -1;
  size_t i, n = deltas ? json_array_size(deltas) : 0;
  int rc = 0;
  for (i = 0; i < n && !rc; i++) {
    const json_t *d = json_array_get(deltas, i);
    const json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
    if (tc && json_object_get(tc, "id")) {
      /* a head; its arguments, when not "", are the next delta */
      const json_t *nx = i + 1 < n ? json_array_get(deltas, i + 1) : NULL;
      const json_t *ntc = json_array_get(json_object_get(nx, "tool_calls"), 0);
      const json_t *args = ntc && !json_object_get(ntc, "id") ? ntc : NULL;
      if (args) i++;
      rc = call_events(s, tc, args, out);
      continue;
    }
    rc = text_delta(s, 0, json_object_get(d, "reasoning_content"), out) ||
         text_delta(s, 1, json_object_get(d, "content"), out);
  }
  json_decref(deltas);
  if (!rc && final) {
    rc = close_item(s, out);
    /* as the non-streamed output: a message when there is nothing else to say */
    if (!rc && !s->have_message && s->n_calls == 0) rc = open_item(s, 1, out) || close_item(s, out);
  }
  return rc ? -1 : 0;
}

int responses_stream_finish(responses_stream *s, const char *finish, const responses_usage *u,
                            strbuf *out) {
  if (s->ended) return 0;
  s->ended = 1;
  const char *status = responses_response_status(finish);
  json_t *r = responses_response_object(s->echo, s->id, s->created, s->model, status,
                                        json_incref(s->output), u);
  return emit(s, out, !strcmp(status, "completed") ? "response.completed" : "response.incomplete",
              r ? json_pack("{s:o}", "response", r) : NULL);
}

int responses_stream_error(responses_stream *s, const openai_error *e, strbuf *out) {
  if (s->ended) return 0;
  s->ended = 1;
  return emit(s, out, "error",
              json_pack("{s:s?, s:s, s:s?}", "code", e->code ? e->code : e->type, "message",
                        e->message, "param", e->param[0] ? e->param : NULL));
}
