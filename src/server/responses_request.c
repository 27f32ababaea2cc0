#include "server/responses_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...) openai_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__)
#define OOM() openai_error_set(err, 500, "server_error", NULL, "out of memory")

static int nullish(const json_t *v) { return !v || json_is_null(v); }

/* The text of a message's content: a string, or parts whose texts are joined. */
static json_t *content_text(const json_t *c, const char *param, openai_error *err) {
  if (json_is_string(c)) return json_incref((json_t *)c);
  if (!json_is_array(c)) {
    BAD(param, "'%s' must be a string or an array of content parts", param);
    return NULL;
  }
  json_t *out = json_string("");
  size_t i;
  const json_t *p;
  json_array_foreach(c, i, p) {
    const char *type = json_string_value(json_object_get(p, "type"));
    const json_t *text = json_object_get(p, "text");
    if (!type || !json_is_string(text) ||
        (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
         strcmp(type, "summary_text") && strcmp(type, "reasoning_text"))) {
      json_decref(out);
      BAD(param,
          "'%s[%zu]' must be a text part {\"type\": \"input_text\" or \"output_text\", \"text\": "
          "...}; %s parts are not supported",
          param, i, type ? type : "untyped");
      return NULL;
    }
    size_t a = json_string_length(out), b = json_string_length(text);
    char *s = malloc(a + b + 1);
    if (!s) {
      json_decref(out);
      OOM();
      return NULL;
    }
    memcpy(s, json_string_value(out), a);
    memcpy(s + a, json_string_value(text), b);
    s[a + b] = 0;
    json_decref(out);
    out = json_stringn_nocheck(s, a + b);
    free(s);
  }
  if (!out) OOM();
  return out;
}

/* The text of item field `key` (content, output), named "<param>.<key>" in errors. */
static json_t *item_text(const json_t *it, const char *key, const char *param, openai_error *err) {
  char p[80];
  snprintf(p, sizeof p, "%s.%s", param, key);
  return content_text(json_object_get(it, key), p, err);
}

/* The assistant message function calls and reasoning attach to: the last message when it is
 * an assistant's that may still take them, else a new one. */
static json_t *assistant_for(json_t *msgs, int fresh, openai_error *err) {
  size_t n = json_array_size(msgs);
  json_t *last = n ? json_array_get(msgs, n - 1) : NULL;
  if (!fresh && last && !strcmp(json_string_value(json_object_get(last, "role")), "assistant"))
    return last;
  json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
  if (!m || json_array_append_new(msgs, m)) {
    OOM();
    return NULL;
  }
  return m;
}

/* Translates the input items into chat messages (appended to msgs). */
static int input_items(const json_t *input, json_t *msgs, openai_error *err) {
  char param[64];
  json_t *pending_reasoning = NULL; /* owned until attached */
  size_t i;
  const json_t *it;
  int rc = -1;
  json_array_foreach(input, i, it) {
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!json_is_object(it)) {
      BAD(param, "'%s' must be an object", param);
      goto out;
    }
    const char *type = json_string_value(json_object_get(it, "type"));
    const json_t *role = json_object_get(it, "role");
    if (!type && json_is_string(role)) type = "message";
    if (!type) {
      BAD(param, "'%s' needs a 'type' (message, function_call, function_call_output, reasoning)",
          param);
      goto out;
    }
    if (!strcmp(type, "message")) {
      const char *r = json_string_value(role);
      if (!r || (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") &&
                 strcmp(r, "developer"))) {
        BAD(param, "'%s.role' must be user, assistant, system or developer", param);
        goto out;
      }
      json_t *text = item_text(it, "content", param, err);
      if (!text) goto out;
      json_t *m = NULL;
      if (!strcmp(r, "assistant") && pending_reasoning) {
        m = assistant_for(msgs, 1, err);
        if (!m) {
          json_decref(text);
          goto out;
        }
        json_object_set_new(m, "content", text);
        json_object_set_new(m, "reasoning_content", pending_reasoning);
        pending_reasoning = NULL;
        continue;
      }
      m = json_pack("{s:s, s:o}", "role", !strcmp(r, "developer") ? "system" : r, "content", text);
      if (!m || json_array_append_new(msgs, m)) {
        OOM();
        goto out;
      }
    } else if (!strcmp(type, "reasoning")) {
      const json_t *c = json_object_get(it, "content");
      if (nullish(c) || (json_is_array(c) && json_array_size(c) == 0))
        c = json_object_get(it, "summary");
      const json_t *enc = json_object_get(it, "encrypted_content"); /* ours: the text itself */
      if ((nullish(c) || (json_is_array(c) && json_array_size(c) == 0)) && json_is_string(enc))
        c = enc;
      char cp[80];
      snprintf(cp, sizeof cp, "%s.content", param);
      json_t *text = nullish(c) ? json_string("") : content_text(c, cp, err);
      if (!text) goto out;
      json_decref(pending_reasoning);
      pending_reasoning = text;
    } else if (!strcmp(type, "function_call")) {
      const json_t *call_id = json_object_get(it, "call_id"), *name = json_object_get(it, "name"),
                   *args = json_object_get(it, "arguments");
      if (!json_is_string(call_id) || !json_is_string(name) || !json_is_string(args)) {
        BAD(param, "'%s' (function_call) needs string 'call_id', 'name' and 'arguments'", param);
        goto out;
      }
      json_t *m = assistant_for(msgs, pending_reasoning != NULL, err);
      if (!m) goto out;
      if (pending_reasoning) {
        json_object_set_new(m, "reasoning_content", pending_reasoning);
        pending_reasoning = NULL;
      }
      json_t *calls = json_object_get(m, "tool_calls");
      if (!calls) {
        calls = json_array();
        if (!calls || json_object_set_new(m, "tool_calls", calls)) {
          OOM();
          goto out;
        }
      }
      /* a namespace's function: its chat name "NS.NAME" (chat_tool) */
      const json_t *ns = json_object_get(it, "namespace");
      json_t *full = NULL;
      if (json_is_string(ns) && json_string_length(ns)) {
        size_t n = json_string_length(ns) + json_string_length(name) + 2;
        char *b = malloc(n);
        if (b) snprintf(b, n, "%s.%s", json_string_value(ns), json_string_value(name));
        full = b ? json_string(b) : NULL;
        free(b);
        if (!full) {
          OOM();
          goto out;
        }
      }
      json_t *tc = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                             "function", "name", full ? full : name, "arguments", args);
      json_decref(full);
      if (!tc || json_array_append_new(calls, tc)) {
        OOM();
        goto out;
      }
    } else if (!strcmp(type, "function_call_output")) {
      const json_t *call_id = json_object_get(it, "call_id");
      if (!json_is_string(call_id)) {
        BAD(param, "'%s' (function_call_output) needs a string 'call_id'", param);
        goto out;
      }
      json_t *text = item_text(it, "output", param, err);
      if (!text) goto out;
      json_t *m =
          json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id, "content", text);
      if (!m || json_array_append_new(msgs, m)) {
        OOM();
        goto out;
      }
    } else if (!strcmp(type, "item_reference")) {
      BAD(param,
          "this server is stateless: it keeps no items, so '%s' (item_reference) cannot be "
          "resolved; send the item itself",
          param);
      goto out;
    } else {
      BAD(param,
          "'%s' has type '%s', which is not supported (message, function_call, "
          "function_call_output, reasoning)",
          param, type);
      goto out;
    }
  }
  rc = 0;
out:
  json_decref(pending_reasoning);
  return rc;
}

/* {"type": type, type: {the non-null fields keys[0..n) of from}}: the chat API nests what the
 * Responses API keeps flat. NULL on out of memory. */
static json_t *nested(const char *type, const json_t *from, const char *const *keys, size_t n) {
  json_t *in = json_object();
  for (size_t k = 0; in && k < n; k++) {
    const json_t *v = json_object_get(from, keys[k]);
    if (!nullish(v)) json_object_set(in, keys[k], (json_t *)v);
  }
  return in ? json_pack("{s:s, s:o}", "type", type, type, in) : NULL;
}

/* Function tool t (param: its place, for errors) appended to out in the chat shape; within a
 * namespace tool ns, its chat name is "NS.NAME" (function names carry no '.', as OpenAI's
 * pattern has it, so the name of a call splits back: responses_response_call_item). */
static int chat_tool(json_t *out, const json_t *t, const char *ns, const char *param,
                     openai_error *err) {
  const char *type = json_string_value(json_object_get(t, "type"));
  if (!type || strcmp(type, "function"))
    return BAD(param,
               "'%s' has type '%s': only function tools ({\"type\": \"function\", \"name\", "
               "\"parameters\"}), alone or in a namespace tool, are supported",
               param, type ? type : "(none)");
  const char *nm = json_string_value(json_object_get(t, "name"));
  if (!nm || !nm[0]) return BAD(param, "'%s.name' must be a non-empty string", param);
  if (strchr(nm, '.'))
    return BAD(param, "'%s.name' must not contain '.' (it joins a namespace to its functions)",
               param);
  static const char *const keys[] = {"name", "description", "parameters", "strict"};
  json_t *ct = nested("function", t, keys, sizeof keys / sizeof keys[0]);
  if (ct && ns) {
    size_t n = strlen(ns) + strlen(nm) + 2;
    char *full = malloc(n);
    if (full) snprintf(full, n, "%s.%s", ns, nm);
    if (!full || json_object_set_new(json_object_get(ct, "function"), "name", json_string(full))) {
      free(full);
      json_decref(ct);
      return OOM();
    }
    free(full);
  }
  return !ct || json_array_append_new(out, ct) ? OOM() : 0;
}

/* tools in the Responses shape -> the chat shape (a namespace tool's functions flattened) */
static json_t *chat_tools(const json_t *tools, openai_error *err) {
  if (!json_is_array(tools)) {
    BAD("tools", "'tools' must be an array");
    return NULL;
  }
  json_t *out = json_array();
  if (!out) {
    OOM();
    return NULL;
  }
  size_t i;
  const json_t *t;
  char param[64];
  json_array_foreach(tools, i, t) {
    snprintf(param, sizeof param, "tools[%zu]", i);
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || strcmp(type, "namespace")) {
      if (chat_tool(out, t, NULL, param, err)) goto fail;
      continue;
    }
    const char *ns = json_string_value(json_object_get(t, "name"));
    const json_t *inner = json_object_get(t, "tools");
    if (!ns || !ns[0] || strchr(ns, '.')) {
      BAD(param, "'%s.name' must be a non-empty string without '.'", param);
      goto fail;
    }
    if (!json_is_array(inner)) {
      BAD(param, "'%s.tools' must be an array of function tools", param);
      goto fail;
    }
    size_t j;
    const json_t *f;
    json_array_foreach(inner, j, f) {
      char p2[96];
      snprintf(p2, sizeof p2, "%s.tools[%zu]", param, j);
      if (chat_tool(out, f, ns, p2, err)) goto fail;
    }
  }
  return out;
fail:
  json_decref(out);
  return NULL;
}

/* text.format -> response_format (NULL for plain text) */
static int chat_format(const json_t *text, json_t *chat, openai_error *err) {
  if (nullish(text)) return 0;
  if (!json_is_object(text)) return BAD("text", "'text' must be an object");
  /* verbosity: the model has no such control; medium (OpenAI's default) asks for nothing */
  const json_t *vb = json_object_get(text, "verbosity");
  const char *v = json_string_value(vb);
  if (!nullish(vb) && (!v || (strcmp(v, "low") && strcmp(v, "medium") && strcmp(v, "high"))))
    return BAD("text.verbosity", "'text.verbosity' must be low, medium or high");
  if (v && strcmp(v, "medium"))
    return BAD("text.verbosity",
               "'text.verbosity' %s is not supported: the model's verbosity cannot be set "
               "(medium, the default, is accepted)",
               v);
  const json_t *f = json_object_get(text, "format");
  if (nullish(f)) return 0;
  const char *type = json_string_value(json_object_get(f, "type"));
  if (!json_is_object(f) || !type)
    return BAD("text.format", "'text.format' must be an object with a string 'type'");
  if (!strcmp(type, "text")) return 0;
  if (!strcmp(type, "json_object"))
    return json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"))
               ? OOM()
               : 0;
  if (!strcmp(type, "json_schema")) {
    const json_t *schema = json_object_get(f, "schema");
    if (!json_is_object(schema))
      return BAD("text.format", "'text.format' json_schema needs 'schema': {...}");
    static const char *const keys[] = {"name", "schema", "strict", "description"};
    json_t *rf = nested("json_schema", f, keys, sizeof keys / sizeof keys[0]);
    return !rf || json_object_set_new(chat, "response_format", rf) ? OOM() : 0;
  }
  return BAD("text.format",
             "'text.format' type '%s' is not supported: 'text', 'json_object' or 'json_schema'",
             type);
}

/* include: "reasoning.encrypted_content" (the reasoning text round-trips through the client);
 * the other values name outputs this server never makes or cannot add, and are refused. */
static int parse_include(const json_t *o, responses_request *r, openai_error *err) {
  const json_t *inc = json_object_get(o, "include");
  if (nullish(inc)) return 0;
  if (!json_is_array(inc)) return BAD("include", "'include' must be an array of strings");
  size_t i;
  const json_t *v;
  json_array_foreach(inc, i, v) {
    const char *s = json_string_value(v);
    if (!s) return BAD("include", "'include[%zu]' must be a string", i);
    if (strcmp(s, "reasoning.encrypted_content"))
      return BAD("include", "include '%s' is not supported: only 'reasoning.encrypted_content' is",
                 s);
    r->encrypted_reasoning = 1;
  }
  return 0;
}

/* Top-level fields: those translated below; those that change nothing generated (cache and
 * routing hints, identifiers, metadata), accepted; those that would, refused unless absent or
 * their no-op value; any other, refused as OpenAI refuses an unknown parameter. */
static int check_fields(const json_t *o, openai_error *err) {
  static const char *const served[] = {
      "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
      "include", "max_output_tokens", "temperature", "top_p", "user", "seed", "top_k", "stop",
      "reasoning", "metadata", "store", "previous_response_id", "background", "conversation",
      "truncation", "stream",
      /* refused unless null (refuse_stateful) */
      "prompt", "top_logprobs", "max_tool_calls",
      /* no effect on what is generated */
      "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier",
      "client_metadata", "stream_options"};
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    size_t i = 0;
    while (i < sizeof served / sizeof served[0] && strcmp(k, served[i])) i++;
    if (i < sizeof served / sizeof served[0]) continue;
    return BAD(k, "Unknown parameter: '%s'.", k);
  }
  const json_t *so = json_object_get(o, "stream_options");
  if (!nullish(so) && !json_is_object(so))
    return BAD("stream_options", "'stream_options' must be an object");
  return 0;
}

/* The fields of a state the server does not keep: refused unless absent or no-op. */
static int refuse_stateful(const json_t *o, openai_error *err) {
  const json_t *store = json_object_get(o, "store");
  if (!nullish(store) && !json_is_boolean(store)) return BAD("store", "'store' must be a boolean");
  if (json_is_true(store))
    return BAD("store",
               "this server is stateless: it cannot store responses; send \"store\": false (or "
               "leave it out) and pass the conversation as input items");
  const json_t *prev = json_object_get(o, "previous_response_id");
  if (!nullish(prev))
    return BAD("previous_response_id",
               "this server is stateless: it keeps no earlier responses, so "
               "previous_response_id cannot be resolved; send the whole conversation as input "
               "items");
  const json_t *conv = json_object_get(o, "conversation");
  if (!nullish(conv))
    return BAD("conversation",
               "this server is stateless: it keeps no conversations; send the whole "
               "conversation as input items");
  if (json_is_true(json_object_get(o, "background")))
    return BAD("background", "this server is stateless: background responses are not supported");
  const json_t *tr = json_object_get(o, "truncation");
  if (!nullish(tr) && (!json_is_string(tr) || strcmp(json_string_value(tr), "disabled")))
    return BAD("truncation", "'truncation' must be \"disabled\": inputs are never truncated here");
  const char *refused[] = {"prompt", "top_logprobs", "max_tool_calls"};
  for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++)
    if (!nullish(json_object_get(o, refused[k])))
      return BAD(refused[k], "'%s' is not supported by this server", refused[k]);
  return 0;
}

static int parse_tool_choice(const json_t *o, json_t *chat, json_t *echo, openai_error *err) {
  const json_t *tc = json_object_get(o, "tool_choice");
  if (nullish(tc)) return json_object_set_new(echo, "tool_choice", json_string("auto")) ? OOM() : 0;
  const char *s = json_string_value(tc);
  /* required / a named function: forced by the chat request's tool-call grammar */
  if (s && (!strcmp(s, "auto") || !strcmp(s, "none") || !strcmp(s, "required"))) {
    json_object_set(chat, "tool_choice", (json_t *)tc);
    return json_object_set(echo, "tool_choice", (json_t *)tc) ? OOM() : 0;
  }
  if (json_is_object(tc)) {
    const json_t *nm = json_object_get(tc, "name");
    const char *ty = json_string_value(json_object_get(tc, "type"));
    if (!ty || strcmp(ty, "function") || !json_is_string(nm))
      return BAD("tool_choice",
                 "'tool_choice' object must be {\"type\": \"function\", \"name\": ...}");
    json_t *c = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm);
    if (!c || json_object_set_new(chat, "tool_choice", c)) return OOM();
    return json_object_set(echo, "tool_choice", (json_t *)tc) ? OOM() : 0;
  }
  return BAD("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or an object");
}

/* reasoning.effort -> chat_template_kwargs.enable_thinking */
static int parse_reasoning(const json_t *o, json_t *chat, json_t *echo, openai_error *err) {
  const json_t *r = json_object_get(o, "reasoning");
  json_t *effort = json_null(), *summary = json_null();
  if (!nullish(r)) {
    if (!json_is_object(r)) return BAD("reasoning", "'reasoning' must be an object");
    const json_t *e = json_object_get(r, "effort");
    if (!nullish(e)) {
      const char *es = json_string_value(e);
      int on;
      if (es && (!strcmp(es, "none") || !strcmp(es, "minimal")))
        on = 0;
      else if (es && (!strcmp(es, "low") || !strcmp(es, "medium") || !strcmp(es, "high") ||
                      !strcmp(es, "xhigh")))
        on = 1;
      else
        return BAD("reasoning.effort",
                   "'reasoning.effort' must be none, minimal, low, medium or high");
      if (json_object_set_new(chat, "chat_template_kwargs",
                              json_pack("{s:b}", "enable_thinking", on)))
        return OOM();
      effort = json_incref((json_t *)e);
    }
    const json_t *sm = json_object_get(r, "summary");
    if (!nullish(sm)) summary = json_incref((json_t *)sm);
  }
  return json_object_set_new(echo, "reasoning",
                             json_pack("{s:o, s:o}", "effort", effort, "summary", summary))
             ? OOM()
             : 0;
}

static int translate(const json_t *o, responses_request *r, openai_error *err) {
  json_t *chat = r->chat, *echo = r->echo;
  if (check_fields(o, err) || refuse_stateful(o, err)) return -1;
  const json_t *model = json_object_get(o, "model");
  if (!nullish(model)) {
    if (!json_is_string(model)) return BAD("model", "'model' must be a string");
    json_object_set(chat, "model", (json_t *)model);
  }
  json_t *msgs = json_array();
  if (!msgs || json_object_set_new(chat, "messages", msgs)) return OOM();
  const json_t *ins = json_object_get(o, "instructions");
  if (!nullish(ins)) {
    if (!json_is_string(ins)) return BAD("instructions", "'instructions' must be a string");
    if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins)))
      return OOM();
  }
  json_object_set_new(echo, "instructions",
                      nullish(ins) ? json_null() : json_incref((json_t *)ins));
  const json_t *input = json_object_get(o, "input");
  if (json_is_string(input)) {
    if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input)))
      return OOM();
  } else if (json_is_array(input) && json_array_size(input) > 0) {
    if (input_items(input, msgs, err)) return -1;
  } else {
    return BAD("input", "'input' must be a string or a non-empty array of items");
  }

  const json_t *tools = json_object_get(o, "tools");
  if (!nullish(tools)) {
    json_t *ct = chat_tools(tools, err);
    if (!ct) return -1;
    if (json_array_size(ct) > 0)
      json_object_set_new(chat, "tools", ct);
    else
      json_decref(ct);
    json_object_set(echo, "tools", (json_t *)tools);
  } else {
    json_object_set_new(echo, "tools", json_array());
  }
  if (parse_tool_choice(o, chat, echo, err)) return -1;
  const json_t *ptc = json_object_get(o, "parallel_tool_calls");
  r->parallel_tool_calls = 1;
  if (!nullish(ptc)) {
    if (!json_is_boolean(ptc))
      return BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r->parallel_tool_calls = json_is_true(ptc);
  }
  json_object_set_new(echo, "parallel_tool_calls", json_boolean(r->parallel_tool_calls));
  if (!r->parallel_tool_calls && json_object_set_new(chat, "parallel_tool_calls", json_false()))
    return OOM();

  if (parse_include(o, r, err)) return -1;
  const json_t *text = json_object_get(o, "text");
  if (chat_format(text, chat, err)) return -1;
  const json_t *fmt = json_is_object(text) ? json_object_get(text, "format") : NULL;
  json_object_set_new(echo, "text",
                      nullish(fmt) ? json_pack("{s:{s:s}}", "format", "type", "text")
                                   : json_pack("{s:O}", "format", fmt));

  const json_t *mot = json_object_get(o, "max_output_tokens");
  if (!nullish(mot)) json_object_set(chat, "max_completion_tokens", (json_t *)mot);
  json_object_set_new(echo, "max_output_tokens",
                      nullish(mot) ? json_null() : json_incref((json_t *)mot));
  const char *copied[] = {"temperature", "top_p", "user", "seed", "top_k", "stop"};
  for (size_t k = 0; k < sizeof copied / sizeof copied[0]; k++) {
    const json_t *v = json_object_get(o, copied[k]);
    if (!nullish(v)) json_object_set(chat, copied[k], (json_t *)v);
  }
  const char *echoed[] = {"temperature", "top_p", "user"};
  for (size_t k = 0; k < sizeof echoed / sizeof echoed[0]; k++) {
    const json_t *v = json_object_get(o, echoed[k]);
    json_object_set_new(echo, echoed[k], nullish(v) ? json_null() : json_incref((json_t *)v));
  }
  if (parse_reasoning(o, chat, echo, err)) return -1;

  const json_t *md = json_object_get(o, "metadata");
  if (!nullish(md) && !json_is_object(md)) return BAD("metadata", "'metadata' must be an object");
  json_object_set_new(echo, "metadata", nullish(md) ? json_object() : json_incref((json_t *)md));
  json_object_set_new(echo, "store", json_false());
  json_object_set_new(echo, "truncation", json_string("disabled"));

  const json_t *st = json_object_get(o, "stream");
  if (!nullish(st)) {
    if (!json_is_boolean(st)) return BAD("stream", "'stream' must be a boolean");
    r->stream = json_is_true(st);
  }
  if (r->stream) json_object_set_new(chat, "stream", json_true());
  return 0;
}

int responses_request_parse(const char *body, size_t len, responses_request *r, openai_error *err) {
  memset(r, 0, sizeof *r);
  json_error_t je;
  json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!o) return BAD(NULL, "invalid JSON body: %s (line %d)", je.text, je.line);
  int rc = 0;
  if (!json_is_object(o)) {
    rc = BAD(NULL, "the request body must be a JSON object");
  } else {
    r->chat = json_object();
    r->echo = json_object();
    rc = !r->chat || !r->echo ? OOM() : translate(o, r, err);
  }
  json_decref(o);
  if (rc) responses_request_free(r);
  return rc;
}

void responses_request_free(responses_request *r) {
  json_decref(r->chat);
  json_decref(r->echo);
  memset(r, 0, sizeof *r);
}

void responses_request_error_param(openai_error *e) {
  static const struct {
    const char *from, *to;
  } map[] = {{"messages", "input"},
             {"max_completion_tokens", "max_output_tokens"},
             {"max_tokens", "max_output_tokens"},
             {"response_format", "text.format"},
             {"chat_template_kwargs", "reasoning"}};
  for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
    size_t n = strlen(map[k].from);
    if (!strncmp(e->param, map[k].from, n) && (e->param[n] == 0 || e->param[n] == '[')) {
      snprintf(e->param, sizeof e->param, "%s", map[k].to);
      return;
    }
  }
}
