#include "server/anthropic_response.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai_response.h"
#include "tokenizer/chat_parse.h"

const char *anthropic_response_error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json_t *anthropic_response_error_json(const openai_error *e) {
  json_t *msg = openai_response_string(e->message, strlen(e->message));
  return msg ? json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type",
                         anthropic_response_error_type(e->status), "message", msg)
             : NULL;
}

char *anthropic_response_error_body(const openai_error *e) {
  json_t *o = anthropic_response_error_json(e);
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!s)
    s = strdup(
        "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"out of memory\"}}");
  return s;
}

const char *anthropic_response_stop_reason(const server_gen *g, int has_tool_calls) {
  if (g->finish == FINISH_LENGTH) return "max_tokens";
  if (g->stop_string_hit) return "stop_sequence";
  return has_tool_calls ? "tool_use" : "end_turn";
}

json_t *anthropic_response_stop_sequence(const server_gen *g) {
  return g->stop_string_hit && g->stop_hit ? json_string(g->stop_hit) : json_null();
}

json_t *anthropic_response_usage(const server_gen *g) {
  int cached = g->cached_tokens < g->prompt_tokens ? g->cached_tokens : g->prompt_tokens;
  return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", g->prompt_tokens - cached,
                   "output_tokens", g->completion_tokens, "cache_creation_input_tokens", 0,
                   "cache_read_input_tokens", cached);
}

json_t *anthropic_response_tool_use(const json_t *call) {
  const json_t *fn = json_object_get(call, "function");
  const char *id = json_string_value(json_object_get(call, "id"));
  const char *name = json_string_value(json_object_get(fn, "name"));
  const char *args = json_string_value(json_object_get(fn, "arguments"));
  char tid[96];
  snprintf(tid, sizeof tid, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : id ? id : "");
  json_t *input = args ? json_loads(args, 0, NULL) : NULL;
  if (!json_is_object(input)) {
    json_decref(input);
    input = json_object();
  }
  return input ? json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", tid, "name",
                           name ? name : "", "input", input)
               : NULL;
}

json_t *anthropic_response_message(const char *id, const char *model, const server_gen *g,
                                   int thinking_open, const json_t *tools) {
  chat_parsed p;
  memset(&p, 0, sizeof p);
  if (chat_parse(g->text.data ? g->text.data : "", thinking_open, tools, &p)) return NULL;
  json_t *content = json_array();
  if (content && p.reasoning_content)
    json_array_append_new(
        content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                           openai_response_string(p.reasoning_content, strlen(p.reasoning_content)),
                           "signature", ""));
  if (content && p.content && p.content[0])
    json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                             openai_response_string(p.content, strlen(p.content))));
  size_t n_calls = p.tool_calls ? json_array_size(p.tool_calls) : 0;
  for (size_t i = 0; content && i < n_calls; i++)
    json_array_append_new(content, anthropic_response_tool_use(json_array_get(p.tool_calls, i)));
  chat_parsed_free(&p);
  if (!content) return NULL;
  return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", id, "type", "message", "role",
                   "assistant", "model", model, "content", content, "stop_reason",
                   anthropic_response_stop_reason(g, n_calls > 0), "stop_sequence",
                   anthropic_response_stop_sequence(g), "usage", anthropic_response_usage(g));
}
