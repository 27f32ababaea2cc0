#include "server/responses_response.h"

#include <stdio.h>
#include <string.h>

#include "server/openai_response.h"

json_t *responses_response_object(const json_t *echo, const char *id, long long created,
                                  const char *model, const char *status, json_t *output,
                                  const responses_usage *u) {
  json_t *o = json_object();
  if (!o) {
    json_decref(output);
    return NULL;
  }
  json_object_set_new(o, "id", json_string(id));
  json_object_set_new(o, "object", json_string("response"));
  json_object_set_new(o, "created_at", json_integer(created));
  json_object_set_new(o, "status", json_string(status));
  json_object_set_new(o, "error", json_null());
  json_object_set_new(o, "incomplete_details",
                      !strcmp(status, "incomplete")
                          ? json_pack("{s:s}", "reason", "max_output_tokens")
                          : json_null());
  json_object_set_new(o, "model", json_string(model));
  json_object_set_new(o, "output", output ? output : json_array());
  json_object_set_new(o, "previous_response_id", json_null());
  json_object_set_new(o, "background", json_false());
  if (echo) json_object_update_missing(o, (json_t *)echo);
  if (u)
    json_object_set_new(
        o, "usage",
        json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->input_tokens,
                  "input_tokens_details", "cached_tokens", u->cached_tokens, "output_tokens",
                  u->output_tokens, "output_tokens_details", "reasoning_tokens",
                  u->reasoning_tokens, "total_tokens", u->input_tokens + u->output_tokens));
  else
    json_object_set_new(o, "usage", json_null());
  return o;
}

const char *responses_response_status(const char *finish) {
  return finish && !strcmp(finish, "length") ? "incomplete" : "completed";
}

void responses_response_item_id(char *buf, size_t n, const char *prefix) {
  char p[16];
  snprintf(p, sizeof p, "%s_", prefix);
  openai_response_new_id(buf, n, p);
}

json_t *responses_response_reasoning_item(const char *id, const char *text, size_t len,
                                          int encrypted) {
  json_t *it =
      json_pack("{s:s, s:s, s:[], s:[{s:s, s:o}]}", "id", id, "type", "reasoning", "summary",
                "content", "type", "reasoning_text", "text", openai_response_string(text, len));
  if (it && encrypted &&
      json_object_set_new(it, "encrypted_content", openai_response_string(text, len))) {
    json_decref(it);
    return NULL;
  }
  return it;
}

json_t *responses_response_message_item(const char *id, const char *text, size_t len,
                                        const char *status) {
  return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:o, s:[]}]}", "id", id, "type", "message",
                   "role", "assistant", "status", status, "content", "type", "output_text", "text",
                   openai_response_string(text, len), "annotations");
}

json_t *responses_response_call_item(const char *id, const json_t *chat_call, const char *status) {
  const json_t *fn = json_object_get(chat_call, "function");
  const char *call_id = json_string_value(json_object_get(chat_call, "id"));
  const char *name = json_string_value(json_object_get(fn, "name"));
  const char *args = json_string_value(json_object_get(fn, "arguments"));
  if (!name) name = "";
  /* "NS.NAME": a function of namespace tool NS (responses_request's chat_tool) */
  const char *dot = strchr(name, '.');
  json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call",
                         "call_id", call_id ? call_id : id, "name", dot ? dot + 1 : name,
                         "arguments", args ? args : "", "status", status);
  if (it && dot && json_object_set_new(it, "namespace", json_stringn(name, (size_t)(dot - name)))) {
    json_decref(it);
    return NULL;
  }
  return it;
}

json_t *responses_response_output(const char *reasoning, const char *content, const json_t *calls,
                                  int parallel, int encrypted) {
  json_t *out = json_array();
  char id[64];
  size_t n_calls = calls ? json_array_size(calls) : 0;
  if (!parallel && n_calls > 1) n_calls = 1;
  if (out && reasoning) {
    responses_response_item_id(id, sizeof id, "rs");
    if (json_array_append_new(
            out, responses_response_reasoning_item(id, reasoning, strlen(reasoning), encrypted)))
      goto oom;
  }
  if (out && ((content && content[0]) || n_calls == 0)) {
    responses_response_item_id(id, sizeof id, "msg");
    const char *c = content ? content : "";
    if (json_array_append_new(out, responses_response_message_item(id, c, strlen(c), "completed")))
      goto oom;
  }
  for (size_t i = 0; out && i < n_calls; i++) {
    responses_response_item_id(id, sizeof id, "fc");
    if (json_array_append_new(
            out, responses_response_call_item(id, json_array_get(calls, i), "completed")))
      goto oom;
  }
  return out;
oom:
  json_decref(out);
  return NULL;
}
