#include "server/anthropic_request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...) openai_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__)
#define OOM() openai_error_set(err, 500, "api_error", NULL, "out of memory")

static int is_type(const json_t *block, const char *type) {
  const json_t *t = json_object_get(block, "type");
  return json_is_string(t) && !strcmp(json_string_value(t), type);
}

/* ---- top-level fields ---- */

/* The fields each endpoint knows; anything else is refused as Anthropic refuses it. */
static int check_fields(anthropic_request_kind kind, const json_t *o, openai_error *err) {
  static const char *const messages_fields[] = {
      "model",         "max_tokens",     "messages",
      "system",        "tools",          "tool_choice",
      "thinking",      "temperature",    "top_p",
      "top_k",         "stream",         "metadata",
      "service_tier",  "stop_sequences", "context_management",
      "output_config", "output_format",  NULL};
  static const char *const count_fields[] = {
      "model",    "messages",           "system",        "tools",         "tool_choice",
      "thinking", "context_management", "output_config", "output_format", NULL};
  /* served elsewhere by Anthropic, and changing what is generated */
  static const char *const refused[] = {"mcp_servers", "container", NULL};
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    for (int i = 0; refused[i]; i++)
      if (!strcmp(key, refused[i]) && !json_is_null(v))
        return BAD(key, "%s: not supported by this server", key);
    const char *const *known = kind == ANTHROPIC_REQUEST_MESSAGES ? messages_fields : count_fields;
    int ok = 0;
    for (int i = 0; known[i] && !ok; i++) ok = !strcmp(key, known[i]);
    if (!ok && !json_is_null(v)) return BAD(key, "%s: Extra inputs are not permitted", key);
  }
  return 0;
}

/* ---- content ---- */

/* Appends the text of a string or an array of text blocks to *acc (a JSON string, created on
 * first need). */
static int append_text(json_t **acc, const char *s, size_t n, openai_error *err) {
  if (!*acc) {
    *acc = json_stringn(s, n);
    return *acc ? 0 : OOM();
  }
  size_t have = json_string_length(*acc);
  char *b = malloc(have + n + 1);
  if (!b) return OOM();
  memcpy(b, json_string_value(*acc), have);
  memcpy(b + have, s, n);
  int rc = json_string_setn_nocheck(*acc, b, have + n);
  free(b);
  return rc ? OOM() : 0;
}

/* Text of a system prompt / tool_result content: a string or an array of text blocks. */
static json_t *text_of(const json_t *c, const char *param, openai_error *err) {
  if (json_is_string(c)) return json_incref((json_t *)c);
  if (!json_is_array(c)) {
    BAD(param, "%s: must be a string or an array of text blocks", param);
    return NULL;
  }
  json_t *acc = NULL;
  size_t i;
  const json_t *b;
  json_array_foreach(c, i, b) {
    const json_t *t = json_object_get(b, "text");
    if (!is_type(b, "text") || !json_is_string(t)) {
      json_decref(acc);
      BAD(param, "%s.%zu: only text blocks are supported here", param, i);
      return NULL;
    }
    if (append_text(&acc, json_string_value(t), json_string_length(t), err)) {
      json_decref(acc);
      return NULL;
    }
  }
  if (!acc && !(acc = json_string(""))) OOM();
  return acc;
}

static int push(json_t *msgs, json_t *m, openai_error *err) {
  if (!m || json_array_append_new(msgs, m)) return OOM();
  return 0;
}

/* A user message's blocks: text runs become user messages, each tool_result a tool message,
 * in their order. */
static int user_blocks(json_t *msgs, const json_t *content, const char *param, openai_error *err) {
  json_t *text = NULL;
  size_t i;
  const json_t *b;
  json_array_foreach(content, i, b) {
    if (is_type(b, "text")) {
      const json_t *t = json_object_get(b, "text");
      if (!json_is_string(t)) {
        BAD(param, "%s.%zu.text: must be a string", param, i);
        goto fail;
      }
      if (append_text(&text, json_string_value(t), json_string_length(t), err)) goto fail;
    } else if (is_type(b, "tool_result")) {
      if (text && push(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text), err)) {
        text = NULL;
        goto fail;
      }
      text = NULL;
      const json_t *id = json_object_get(b, "tool_use_id");
      if (!json_is_string(id)) return BAD(param, "%s.%zu.tool_use_id: must be a string", param, i);
      const json_t *c = json_object_get(b, "content");
      json_t *ct = !c || json_is_null(c) ? json_string("") : text_of(c, param, err);
      if (!ct) return c && !json_is_null(c) ? -1 : OOM();
      /* the templates have no error flag: the result says it was one */
      if (json_is_true(json_object_get(b, "is_error"))) {
        json_t *e = json_string("Error: ");
        if (!e || append_text(&e, json_string_value(ct), json_string_length(ct), err)) {
          json_decref(e);
          json_decref(ct);
          return OOM();
        }
        json_decref(ct);
        ct = e;
      }
      if (push(msgs,
               json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", ct),
               err))
        return -1;
    } else {
      const json_t *t = json_object_get(b, "type");
      json_decref(text);
      return BAD(param,
                 "%s.%zu: block type '%s' is not supported in user messages (text and "
                 "tool_result are)",
                 param, i, json_is_string(t) ? json_string_value(t) : "?");
    }
  }
  if (text && push(msgs, json_pack("{s:s, s:o}", "role", "user", "content", text), err)) return -1;
  return 0;
fail:
  json_decref(text);
  return -1;
}

/* An assistant message's blocks: thinking -> reasoning_content, text -> content, tool_use ->
 * tool_calls. */
static int assistant_blocks(json_t *msgs, const json_t *content, const char *param,
                            openai_error *err) {
  json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
  json_t *calls = json_array(), *reasoning = NULL;
  if (!m || !calls) goto oom;
  size_t i;
  const json_t *b;
  json_array_foreach(content, i, b) {
    if (is_type(b, "text") || is_type(b, "thinking")) {
      int think = is_type(b, "thinking");
      const json_t *t = json_object_get(b, think ? "thinking" : "text");
      if (!json_is_string(t)) {
        BAD(param, "%s.%zu.%s: must be a string", param, i, think ? "thinking" : "text");
        goto fail;
      }
      if (think) {
        if (append_text(&reasoning, json_string_value(t), json_string_length(t), err)) goto fail;
      } else {
        json_t *c = json_incref(json_object_get(m, "content"));
        int rc = append_text(&c, json_string_value(t), json_string_length(t), err);
        json_decref(c);
        if (rc) goto fail;
      }
    } else if (is_type(b, "tool_use")) {
      const json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
                   *input = json_object_get(b, "input");
      if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input)) {
        BAD(param, "%s.%zu: tool_use needs a string 'id', a string 'name' and an object 'input'",
            param, i);
        goto fail;
      }
      json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                               "name", name, "arguments", input);
      if (!call || json_array_append_new(calls, call)) goto oom;
    } else {
      const json_t *t = json_object_get(b, "type");
      BAD(param,
          "%s.%zu: block type '%s' is not supported in assistant messages (text, thinking and "
          "tool_use are)",
          param, i, json_is_string(t) ? json_string_value(t) : "?");
      goto fail;
    }
  }
  if (reasoning && json_object_set_new(m, "reasoning_content", reasoning)) {
    reasoning = NULL;
    goto oom;
  }
  reasoning = NULL;
  if (json_array_size(calls) > 0 && json_object_set(m, "tool_calls", calls)) goto oom;
  json_decref(calls);
  return push(msgs, m, err);
oom:
  OOM();
fail:
  json_decref(m);
  json_decref(calls);
  json_decref(reasoning);
  return -1;
}

static json_t *messages_of(const json_t *o, openai_error *err) {
  const json_t *in = json_object_get(o, "messages");
  if (!json_is_array(in)) {
    BAD("messages", in ? "messages: must be an array" : "messages: Field required");
    return NULL;
  }
  json_t *msgs = json_array();
  if (!msgs) {
    OOM();
    return NULL;
  }
  const json_t *sys = json_object_get(o, "system");
  if (sys && !json_is_null(sys)) {
    json_t *t = text_of(sys, "system", err);
    if (!t) goto fail;
    if (json_string_length(t) == 0)
      json_decref(t);
    else if (push(msgs, json_pack("{s:s, s:o}", "role", "system", "content", t), err))
      goto fail;
  }
  size_t i;
  const json_t *m;
  char param[48];
  json_array_foreach(in, i, m) {
    snprintf(param, sizeof param, "messages.%zu.content", i);
    const json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
    const char *r = json_string_value(role);
    if (!r || (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system"))) {
      BAD("messages", "messages.%zu.role: must be 'user' or 'assistant'", i);
      goto fail;
    }
    if (json_is_string(c)) {
      /* a system message inside the conversation (as Claude Code may send) goes to the
       * template as one: rendered where the template allows it, refused by it elsewhere */
      if (push(msgs, json_pack("{s:s, s:O}", "role", r, "content", c), err)) goto fail;
    } else if (!json_is_array(c)) {
      BAD(param, "%s: must be a string or an array of content blocks", param);
      goto fail;
    } else if (!strcmp(r, "assistant")) {
      if (assistant_blocks(msgs, c, param, err)) goto fail;
    } else if (!strcmp(r, "user")) {
      if (user_blocks(msgs, c, param, err)) goto fail;
    } else {
      json_t *t = text_of(c, param, err);
      if (!t || push(msgs, json_pack("{s:s, s:o}", "role", r, "content", t), err)) goto fail;
    }
  }
  return msgs;
fail:
  json_decref(msgs);
  return NULL;
}

/* ---- tools ---- */

static json_t *tools_of(const json_t *tools, openai_error *err) {
  if (!json_is_array(tools)) {
    BAD("tools", "tools: must be an array");
    return NULL;
  }
  json_t *out = json_array();
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *type = json_object_get(t, "type"), *name = json_object_get(t, "name"),
                 *desc = json_object_get(t, "description"),
                 *schema = json_object_get(t, "input_schema");
    if (type && !json_is_null(type) && !is_type(t, "custom")) {
      BAD("tools",
          "tools.%zu: tool type '%s' is not supported (only client tools with an "
          "input_schema)",
          i, json_is_string(type) ? json_string_value(type) : "?");
      goto fail;
    }
    if (!json_is_string(name) || !json_is_object(schema)) {
      BAD("tools", "tools.%zu: needs a string 'name' and an object 'input_schema'", i);
      goto fail;
    }
    json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
    if (fn && json_is_string(desc)) json_object_set(fn, "description", (json_t *)desc);
    json_t *tool = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
    if (!out || !tool || json_array_append_new(out, tool)) {
      OOM();
      goto fail;
    }
  }
  return out;
fail:
  json_decref(out);
  return NULL;
}

static int tool_choice_of(const json_t *tc, json_t *req, openai_error *err) {
  if (!tc || json_is_null(tc)) return 0;
  const json_t *type = json_object_get(tc, "type");
  const char *t = json_string_value(type);
  if (!json_is_object(tc) || !t)
    return BAD("tool_choice", "tool_choice: must be an object with a 'type'");
  if (strcmp(t, "auto") && strcmp(t, "none") && strcmp(t, "any") && strcmp(t, "tool"))
    return BAD("tool_choice", "tool_choice.type: must be 'auto', 'any', 'tool' or 'none'");
  const json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
  if (dp && !json_is_null(dp) && !json_is_boolean(dp))
    return BAD("tool_choice", "tool_choice.disable_parallel_tool_use: must be a boolean");
  /* any / tool: forced by the chat request's tool-call grammar (tool_grammar.h); at most one
   * call with disable_parallel_tool_use (auto included: tool_grammar_single) */
  if (json_is_true(dp) && json_object_set_new(req, "parallel_tool_calls", json_false()))
    return OOM();
  json_t *c;
  if (!strcmp(t, "tool")) {
    const json_t *nm = json_object_get(tc, "name");
    if (!json_is_string(nm)) return BAD("tool_choice", "tool_choice.name: must be a string");
    c = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm);
  } else {
    c = json_string(!strcmp(t, "any") ? "required" : t);
  }
  return !c || json_object_set_new(req, "tool_choice", c) ? OOM() : 0;
}

/* thinking -> chat_template_kwargs.enable_thinking; without it reasoning is off, as Anthropic
 * models do not think unless asked. budget_tokens is checked, not enforced: Anthropic's own
 * models may go past it too. */
static int thinking_of(const json_t *th, int format, json_t *req, openai_error *err) {
  int on = 0;
  if (th && !json_is_null(th)) {
    const char *t = json_string_value(json_object_get(th, "type"));
    if (!json_is_object(th) || !t)
      return BAD("thinking", "thinking: must be an object with a 'type'");
    if (!strcmp(t, "enabled")) {
      const json_t *b = json_object_get(th, "budget_tokens");
      if (!json_is_integer(b) || json_integer_value(b) < 1)
        return BAD("thinking", "thinking.budget_tokens: must be a positive integer");
      on = 1;
    } else if (!strcmp(t, "adaptive")) {
      on = 1;
    } else if (strcmp(t, "disabled")) {
      return BAD("thinking", "thinking.type: must be 'enabled', 'adaptive' or 'disabled'");
    }
  }
  /* an output format is the answer, never reasoning (the JSON mask admits no think tags):
   * adaptive thinking then thinks not at all; thinking that was asked for is refused */
  if (on && format) {
    if (!strcmp(json_string_value(json_object_get(th, "type")), "enabled"))
      return BAD("thinking",
                 "thinking: 'enabled' with an output format is not supported (the "
                 "format constrains the whole output); use 'adaptive' or 'disabled'");
    on = 0;
  }
  json_t *kw = json_pack("{s:b}", "enable_thinking", on);
  return !kw || json_object_set_new(req, "chat_template_kwargs", kw) ? OOM() : 0;
}

/* ---- output_config, output_format, context_management ---- */

/* output_config {effort, format} and the older output_format: a json_schema format becomes
 * response_format json_schema (enforced by the JSON-schema mask); effort is accepted at its
 * default, "high" (the model has no effort setting). *format: a format was given. */
static int output_of(const json_t *o, json_t *req, int *format, openai_error *err) {
  *format = 0;
  const json_t *oc = json_object_get(o, "output_config"),
               *fmt = json_object_get(o, "output_format");
  if (oc && !json_is_null(oc)) {
    if (!json_is_object(oc)) return BAD("output_config", "output_config: must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)oc, key, v) {
      if (json_is_null(v)) continue;
      if (!strcmp(key, "effort")) {
        if (!json_is_string(v) || strcmp(json_string_value(v), "high"))
          return BAD("output_config",
                     "output_config.effort: only 'high' (the default) is supported: this model "
                     "has no effort setting");
      } else if (!strcmp(key, "format")) {
        if (fmt && !json_is_null(fmt))
          return BAD("output_format", "output_format: give output_config.format alone");
        fmt = v;
      } else {
        return BAD("output_config", "output_config.%s: Extra inputs are not permitted", key);
      }
    }
  }
  if (!fmt || json_is_null(fmt)) return 0;
  const json_t *schema = json_object_get(fmt, "schema");
  if (!is_type(fmt, "json_schema") || !json_is_object(schema))
    return BAD("output_config",
               "output_config.format: must be {\"type\": \"json_schema\", \"schema\": {...}}");
  *format = 1;
  json_t *rf = json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name",
                         "output", "schema", schema);
  return !rf || json_object_set_new(req, "response_format", rf) ? OOM() : 0;
}

/* context_management edits: only clearing no thinking (keep "all", as Claude Code sends it)
 * leaves the prompt as it is; any other edit would remove context, and is refused. */
static int context_management_of(const json_t *cm, openai_error *err) {
  if (!cm || json_is_null(cm)) return 0;
  const json_t *edits = json_object_get(cm, "edits");
  if (!json_is_object(cm) || (edits && !json_is_array(edits)))
    return BAD("context_management", "context_management: must be an object with an 'edits' array");
  size_t i;
  const json_t *e;
  json_array_foreach(edits, i, e) {
    const json_t *keep = json_object_get(e, "keep");
    int keep_all =
        (json_is_string(keep) && !strcmp(json_string_value(keep), "all")) || is_type(keep, "all");
    if (!is_type(e, "clear_thinking_20251015") || !keep_all)
      return BAD("context_management",
                 "context_management.edits.%zu: not supported (only clear_thinking_20251015 "
                 "with keep 'all', which clears nothing)",
                 i);
  }
  return 0;
}

/* ---- sampling and the rest ---- */

static int copy_number(const json_t *o, json_t *req, const char *key, double lo, double hi,
                       openai_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
    return BAD(key, "%s: must be a number between %g and %g", key, lo, hi);
  return json_object_set(req, key, (json_t *)v) ? OOM() : 0;
}

static int sampling_of(const json_t *o, json_t *req, openai_error *err) {
  const json_t *mt = json_object_get(o, "max_tokens");
  if (!mt || json_is_null(mt)) return BAD("max_tokens", "max_tokens: Field required");
  if (!json_is_integer(mt) || json_integer_value(mt) < 1)
    return BAD("max_tokens", "max_tokens: must be an integer of at least 1");
  if (json_object_set(req, "max_tokens", (json_t *)mt)) return OOM();
  if (copy_number(o, req, "temperature", 0.0, 1.0, err) ||
      copy_number(o, req, "top_p", 0.0, 1.0, err))
    return -1;
  const json_t *tk = json_object_get(o, "top_k");
  if (tk && !json_is_null(tk)) {
    if (!json_is_integer(tk) || json_integer_value(tk) < 0)
      return BAD("top_k", "top_k: must be a non-negative integer");
    if (json_object_set(req, "top_k", (json_t *)tk)) return OOM();
  }
  const json_t *ss = json_object_get(o, "stop_sequences");
  if (ss && !json_is_null(ss)) {
    size_t i;
    const json_t *s;
    if (!json_is_array(ss)) return BAD("stop_sequences", "stop_sequences: must be an array");
    json_array_foreach(ss, i, s) {
      if (!json_is_string(s) || json_string_length(s) == 0)
        return BAD("stop_sequences", "stop_sequences.%zu: must be a non-empty string", i);
    }
    if (json_array_size(ss) > OPENAI_MAX_STOP)
      return BAD("stop_sequences", "stop_sequences: at most %d are supported", OPENAI_MAX_STOP);
    if (json_object_set(req, "stop", (json_t *)ss)) return OOM();
  }
  const json_t *st = json_object_get(o, "stream");
  if (st && !json_is_null(st)) {
    if (!json_is_boolean(st)) return BAD("stream", "stream: must be a boolean");
    if (json_object_set(req, "stream", (json_t *)st)) return OOM();
  }
  const json_t *md = json_object_get(o, "metadata");
  if (md && !json_is_null(md)) {
    const json_t *u = json_object_get(md, "user_id");
    if (!json_is_object(md) || (u && !json_is_null(u) && !json_is_string(u)))
      return BAD("metadata", "metadata: must be an object with an optional string 'user_id'");
  }
  return 0;
}

json_t *anthropic_request_translate(anthropic_request_kind kind, const json_t *o,
                                    openai_error *err) {
  if (check_fields(kind, o, err)) return NULL;
  const json_t *model = json_object_get(o, "model");
  if (!json_is_string(model)) {
    BAD("model", model ? "model: must be a string" : "model: Field required");
    return NULL;
  }
  json_t *req = json_pack("{s:O}", "model", model);
  json_t *msgs = req ? messages_of(o, err) : NULL;
  if (!req || !msgs || json_object_set_new(req, "messages", msgs)) {
    if (!req || msgs) OOM();
    goto fail;
  }
  const json_t *tools = json_object_get(o, "tools");
  if (tools && !json_is_null(tools) && json_array_size(tools) > 0) {
    json_t *t = tools_of(tools, err);
    if (!t || json_object_set_new(req, "tools", t)) goto fail;
  }
  int format = 0;
  if (tool_choice_of(json_object_get(o, "tool_choice"), req, err) ||
      output_of(o, req, &format, err) ||
      context_management_of(json_object_get(o, "context_management"), err) ||
      thinking_of(json_object_get(o, "thinking"), format, req, err))
    goto fail;
  if (kind == ANTHROPIC_REQUEST_MESSAGES && sampling_of(o, req, err)) goto fail;
  return req;
fail:
  json_decref(req);
  return NULL;
}

char *anthropic_request_to_chat(anthropic_request_kind kind, const char *body, size_t len,
                                openai_error *err) {
  json_t *o = openai_request_load(body, len, err);
  if (!o) return NULL;
  json_t *req = anthropic_request_translate(kind, o, err);
  json_decref(o);
  if (!req) return NULL;
  char *text = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  if (!text) OOM();
  return text;
}

int anthropic_request_parse(anthropic_request_kind kind, const char *body, size_t len,
                            openai_request *out, openai_error *err) {
  memset(out, 0, sizeof *out);
  char *text = anthropic_request_to_chat(kind, body, len, err);
  if (!text) return -1;
  int rc = openai_request_parse(OPENAI_KIND_CHAT, text, strlen(text), out, err);
  free(text);
  return rc;
}
