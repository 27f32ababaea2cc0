#include "server/openai_request.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/tool_grammar.h"

int openai_error_set(openai_error *e, int status, const char *type, const char *param,
                     const char *fmt, ...) {
  if (!e) return -1;
  e->status = status;
  e->type = type ? type : "invalid_request_error";
  e->code = NULL;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

#define BAD(param, ...) openai_error_set(err, 400, "invalid_request_error", param, __VA_ARGS__)

/* ---- field readers: absent or null leaves *out untouched and returns 0 ---- */

static int get_bool(const json_t *o, const char *key, int *out, openai_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return BAD(key, "'%s' must be a boolean", key);
  *out = json_is_true(v);
  return 0;
}

static int get_num(const json_t *o, const char *key, double lo, double hi, double *out,
                   openai_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return BAD(key, "'%s' must be a number", key);
  double d = json_number_value(v);
  if (!isfinite(d) || d < lo || d > hi)
    return BAD(key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
  *out = d;
  return 0;
}

/* Integers: JSON integers, or reals with an integral value (2.0). */
static int get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                   int *present, openai_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  long long x;
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
             fabs(json_real_value(v)) < 9e18) {
    x = (long long)json_real_value(v);
  } else {
    return BAD(key, "'%s' must be an integer", key);
  }
  if (x < lo || x > hi)
    return BAD(key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
  *out = x;
  if (present) *present = 1;
  return 0;
}

/* Fields that other servers (OpenAI, vLLM) accept and that would change what is generated:
 * refused with a 400 naming the field, never silently ignored, when set to anything but their
 * no-op value (null, and the value given here). Fields that change nothing generated (user,
 * metadata, store, service_tier, ...) are ignored. */
static int refuse_unsupported(const json_t *o, openai_error *err) {
  static const struct {
    const char *key, *what;
    int noop; /* 0: only null; 1: also 0 / false / an empty array; 2: also "none" */
  } fields[] = {
      {"prompt_logprobs", "completions' echo with logprobs gives the prompt's tokens", 0},
      {"guided_json", "use response_format json_schema", 0},
      {"guided_regex", "structured output here is response_format json_object / json_schema", 0},
      {"guided_choice", "use response_format json_schema with an enum", 0},
      {"guided_grammar", "structured output here is response_format json_object / json_schema", 0},
      {"structured_outputs", "use response_format json_schema", 0},
      {"use_beam_search", "sampling only", 1},
      {"bad_words", "use logit_bias", 1},
      {"allowed_token_ids", "use logit_bias", 1},
      {"functions", "use tools", 1},
      {"function_call", "use tool_choice", 2},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const json_t *v = json_object_get(o, fields[i].key);
    if (!v || json_is_null(v)) continue;
    if (fields[i].noop == 1 &&
        (json_is_false(v) || (json_is_integer(v) && json_integer_value(v) == 0) ||
         (json_is_array(v) && json_array_size(v) == 0)))
      continue;
    if (fields[i].noop == 2 && json_is_string(v) && !strcmp(json_string_value(v), "none")) continue;
    return BAD(fields[i].key, "'%s' is not supported (%s)", fields[i].key, fields[i].what);
  }
  const json_t *m = json_object_get(o, "modalities");
  if (m && !json_is_null(m)) {
    size_t i;
    const json_t *x;
    if (!json_is_array(m)) return BAD("modalities", "'modalities' must be an array");
    json_array_foreach(m, i, x) {
      if (!json_is_string(x) || strcmp(json_string_value(x), "text"))
        return BAD("modalities", "only the \"text\" modality is supported");
    }
  }
  const json_t *audio = json_object_get(o, "audio");
  if (audio && !json_is_null(audio)) return BAD("audio", "'audio' output is not supported");
  return 0;
}

static int get_str(const json_t *o, const char *key, char **out, openai_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v)) return BAD(key, "'%s' must be a string", key);
  *out = strdup(json_string_value(v));
  if (!*out) return openai_error_set(err, 500, "server_error", NULL, "out of memory");
  return 0;
}

static int token_id_of(const json_t *v, int32_t *id) {
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  if (x < 0 || x > INT32_MAX) return -1;
  *id = (int32_t)x;
  return 0;
}

/* A token id written as an object key: canonical decimal only ("7", not "07", "+7" or "7.0"),
 * so distinct keys are distinct ids. */
static int token_id_of_key(const char *key, int32_t *id) {
  size_t n = strlen(key);
  if (n == 0 || n > 10 || (n > 1 && key[0] == '0')) return -1;
  long long x = 0;
  for (size_t i = 0; i < n; i++) {
    if (key[i] < '0' || key[i] > '9') return -1;
    x = x * 10 + (key[i] - '0');
  }
  if (x > INT32_MAX) return -1;
  *id = (int32_t)x;
  return 0;
}

/* ---- sampling: shared by chat and completions ---- */

/* 1 when the body gives `key` a value (null is no value) */
static int given(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return v && !json_is_null(v);
}

static int parse_sampling(const json_t *o, openai_request *r, openai_error *err) {
  sampling_params *sp = &r->sp;
  memset(sp, 0, sizeof *sp);
  sp->temperature = 1.0f;
  sp->top_p = 1.0f;
  sp->top_k = 0;
  sp->min_p = 0.0f;
  sp->repetition_penalty = 1.0f;
  double d;
  long long x;
  int present = 0;

  d = 1.0;
  if (get_num(o, "temperature", 0.0, 1e6, &d, err)) return -1;
  sp->temperature = (float)d;
  d = 1.0;
  if (get_num(o, "top_p", 0.0, 1.0, &d, err)) return -1;
  /* checked as the sampler will see it: 1e-300 passes as a double but is 0 as a float */
  if (d <= 0.0 || (float)d <= 0.0f) return BAD("top_p", "'top_p' must be in (0, 1], got %g", d);
  sp->top_p = (float)d;
  x = 0;
  if (get_int(o, "top_k", -1, 1 << 30, &x, NULL, err)) return -1;
  sp->top_k = x < 0 ? 0 : (int)x;
  d = 0.0;
  if (get_num(o, "min_p", 0.0, 1.0, &d, err)) return -1;
  sp->min_p = (float)d;
  d = 0.0;
  if (get_num(o, "presence_penalty", -2.0, 2.0, &d, err)) return -1;
  sp->presence_penalty = (float)d;
  d = 0.0;
  if (get_num(o, "frequency_penalty", -2.0, 2.0, &d, err)) return -1;
  sp->frequency_penalty = (float)d;
  d = 1.0;
  if (get_num(o, "repetition_penalty", 0.0, 1e6, &d, err)) return -1;
  if (d <= 0.0 || (float)d <= 0.0f)
    return BAD("repetition_penalty", "'repetition_penalty' must be > 0 (at least %g), got %g",
               (double)FLT_TRUE_MIN, d);
  sp->repetition_penalty = (float)d;
  static const struct {
    const char *key;
    unsigned bit;
  } set_bits[] = {{"temperature", SAMPLING_SET_TEMPERATURE},
                  {"top_p", SAMPLING_SET_TOP_P},
                  {"top_k", SAMPLING_SET_TOP_K},
                  {"min_p", SAMPLING_SET_MIN_P},
                  {"repetition_penalty", SAMPLING_SET_REPETITION_PENALTY}};
  r->sp_set = 0;
  for (size_t i = 0; i < sizeof set_bits / sizeof set_bits[0]; i++)
    if (given(o, set_bits[i].key)) r->sp_set |= set_bits[i].bit;

  const json_t *seed = json_object_get(o, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return BAD("seed", "'seed' must be an integer");
    sp->seed = (uint64_t)json_integer_value(seed);
    sp->has_seed = 1;
  }

  /* max_completion_tokens (chat, newer) wins over max_tokens */
  long long mt = 0;
  present = 0;
  if (get_int(o, "max_tokens", -(1LL << 40), 1LL << 40, &mt, &present, err)) return -1;
  if (r->kind == OPENAI_KIND_CHAT &&
      get_int(o, "max_completion_tokens", -(1LL << 40), 1LL << 40, &mt, &present, err))
    return -1;
  if (present) {
    const char *name = json_object_get(o, "max_completion_tokens") &&
                               !json_is_null(json_object_get(o, "max_completion_tokens"))
                           ? "max_completion_tokens"
                           : "max_tokens";
    if (mt < 1) return BAD(name, "'%s' must be at least 1, got %lld", name, mt);
    if (mt > (1 << 30)) mt = 1 << 30;
    r->max_tokens = (int)mt;
    r->sp_set |= SAMPLING_SET_MAX_TOKENS;
  }

  if (get_bool(o, "ignore_eos", &sp->ignore_eos, err)) return -1;
  /* min_tokens (vLLM): no end token before that many tokens (checked against max_tokens by
   * sampling_params_validate once the server knows it) */
  x = 0;
  if (get_int(o, "min_tokens", 0, 1 << 30, &x, NULL, err)) return -1;
  sp->min_tokens = (int)x;

  /* stop strings */
  const json_t *stop = json_object_get(o, "stop");
  if (stop && !json_is_null(stop)) {
    if (json_is_string(stop)) {
      if (json_string_length(stop) > 0) {
        r->stop[0] = strdup(json_string_value(stop));
        if (!r->stop[0]) return openai_error_set(err, 500, "server_error", NULL, "out of memory");
        r->n_stop = 1;
      }
    } else if (json_is_array(stop)) {
      if (json_array_size(stop) > OPENAI_MAX_STOP)
        return BAD("stop", "'stop' may hold at most %d strings", OPENAI_MAX_STOP);
      size_t i;
      const json_t *s;
      json_array_foreach(stop, i, s) {
        if (!json_is_string(s))
          return BAD("stop", "'stop' must be a string or an array of strings");
        if (json_string_length(s) == 0) continue;
        r->stop[r->n_stop] = strdup(json_string_value(s));
        if (!r->stop[r->n_stop])
          return openai_error_set(err, 500, "server_error", NULL, "out of memory");
        r->n_stop++;
      }
    } else {
      return BAD("stop", "'stop' must be a string or an array of strings");
    }
  }
  const json_t *stop_ids = json_object_get(o, "stop_token_ids");
  if (stop_ids && !json_is_null(stop_ids)) {
    if (!json_is_array(stop_ids))
      return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    if (json_array_size(stop_ids) > SAMPLER_MAX_STOP_IDS)
      return BAD("stop_token_ids", "'stop_token_ids' may hold at most %d ids",
                 SAMPLER_MAX_STOP_IDS);
    size_t i;
    const json_t *s;
    json_array_foreach(stop_ids, i, s) {
      if (token_id_of(s, &sp->stop_ids[sp->n_stop_ids]))
        return BAD("stop_token_ids", "'stop_token_ids' must be an array of non-negative integers");
      sp->n_stop_ids++;
    }
  }

  if (refuse_unsupported(o, err)) return -1;
  /* n: choices sampled from the one prompt (each its own engine request; the prefix cache
   * computes the prompt once) */
  x = 1;
  if (get_int(o, "n", 1, OPENAI_MAX_N, &x, NULL, err)) return -1;
  r->n = (int)x;
  const json_t *best_of = json_object_get(o, "best_of");
  if (best_of && !json_is_null(best_of) &&
      !(json_is_integer(best_of) && json_integer_value(best_of) == 1))
    return BAD("best_of", "only best_of = 1 is supported");
  /* response_format: "text" (the default); "json_object": the output constrained to one JSON
   * object (json_mask.h); "json_schema": to one object valid under json_schema.schema (the
   * subset json_schema.h compiles; anything else in the schema is refused by name, never
   * ignored). */
  const json_t *rf = json_object_get(o, "response_format");
  if (rf && !json_is_null(rf)) {
    const json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(t))
      return BAD("response_format", "'response_format' must be an object with a string 'type'");
    const char *ty = json_string_value(t);
    if (!strcmp(ty, "json_object")) {
      r->json_object = 1;
    } else if (!strcmp(ty, "json_schema")) {
      const json_t *js = json_object_get(rf, "json_schema");
      const json_t *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
      if (!json_is_object(sc))
        return BAD("response_format",
                   "response_format json_schema needs 'json_schema': {\"schema\": {...}}");
      char why[200] = "";
      r->schema = json_schema_compile(sc, why, sizeof why);
      if (!r->schema)
        return strcmp(why, "out of memory")
                   ? BAD("response_format", "response_format json_schema: %s", why)
                   : openai_error_set(err, 500, "server_error", NULL, "out of memory");
      r->json_object = 1;
      if (r->n > 1) /* the compiled schema is one request's state */
        return BAD("n", "n > 1 with response_format json_schema is not supported");
    } else if (strcmp(ty, "text")) {
      return BAD("response_format",
                 "response_format type '%s' is not supported: 'text', 'json_object' or "
                 "'json_schema'",
                 ty);
    }
  }
  if (r->json_object && sp->min_tokens > 0) /* the mask may leave nothing but an end token */
    return BAD("min_tokens",
               "min_tokens with a json_object / json_schema response format is not supported");
  json_t *lb = json_object_get(o, "logit_bias");
  if (lb && !json_is_null(lb)) {
    if (!json_is_object(lb))
      return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    if (json_object_size(lb) > SAMPLER_MAX_BIAS)
      return BAD("logit_bias", "'logit_bias' may hold at most %d entries", SAMPLER_MAX_BIAS);
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
      if (token_id_of_key(key, &sp->bias_ids[sp->n_bias]))
        return BAD("logit_bias", "'logit_bias' keys must be token ids, got \"%.40s\"", key);
      double b = json_is_number(v) ? json_number_value(v) : NAN;
      if (!(b >= -100 && b <= 100))
        return BAD("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      sp->bias[sp->n_bias++] = (float)b;
    }
  }

  if (get_bool(o, "skip_special_tokens", &r->skip_special_tokens, err)) return -1;
  if (get_bool(o, "include_stop_str_in_output", &r->include_stop_str_in_output, err)) return -1;
  if (get_bool(o, "return_token_ids", &r->return_token_ids, err)) return -1;

  const json_t *salt = json_object_get(o, "cache_salt");
  if (salt && !json_is_null(salt)) {
    if (!json_is_string(salt) || json_string_length(salt) == 0)
      return BAD("cache_salt", "'cache_salt' must be a non-empty string");
    if (get_str(o, "cache_salt", &r->cache_salt, err)) return -1;
  }

  if (get_bool(o, "stream", &r->stream, err)) return -1;
  const json_t *so = json_object_get(o, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object");
    if (get_bool(so, "include_usage", &r->include_usage, err)) return -1;
    if (get_bool(so, "continuous_usage_stats", &r->continuous_usage, err)) return -1;
  }
  long long tpt = 0;
  const json_t *tv = json_object_get(o, "truncate_prompt_tokens");
  if (tv && !json_is_null(tv)) {
    if (get_int(o, "truncate_prompt_tokens", -1, INT32_MAX, &tpt, NULL, err)) return -1;
    if (tpt == 0)
      return BAD("truncate_prompt_tokens",
                 "'truncate_prompt_tokens' must be -1 (the model's length) or at least 1");
    r->truncate_prompt_tokens = (int)tpt;
  }
  return 0;
}

/* ---- chat ---- */

/* Content as a string: a string, null, or an array of {"type":"text","text":...} parts. */
static json_t *content_to_string(const json_t *c, const char *param, openai_error *err) {
  if (!c || json_is_null(c)) return json_null();
  if (json_is_string(c)) return json_incref((json_t *)c);
  if (!json_is_array(c)) {
    BAD(param, "'%s' must be a string or an array of text parts", param);
    return NULL;
  }
  size_t total = 0, i;
  const json_t *part;
  json_array_foreach(c, i, part) {
    const json_t *type = json_object_get(part, "type");
    const json_t *text = json_object_get(part, "text");
    if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
        !json_is_string(text)) {
      BAD(param,
          "'%s' parts must be {\"type\": \"text\", \"text\": string} (only text is supported)",
          param);
      return NULL;
    }
    total += json_string_length(text);
  }
  char *s = malloc(total + 1);
  if (!s) {
    openai_error_set(err, 500, "server_error", NULL, "out of memory");
    return NULL;
  }
  size_t off = 0;
  json_array_foreach(c, i, part) {
    const json_t *text = json_object_get(part, "text");
    memcpy(s + off, json_string_value(text), json_string_length(text));
    off += json_string_length(text);
  }
  json_t *out = json_stringn_nocheck(s, total);
  free(s);
  if (!out) openai_error_set(err, 500, "server_error", NULL, "out of memory");
  return out;
}

static json_t *normalise_messages(const json_t *msgs, openai_error *err) {
  if (!msgs) {
    BAD("messages", "'messages' is required");
    return NULL;
  }
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    BAD("messages", "'messages' must be a non-empty array");
    return NULL;
  }
  json_t *out = json_array();
  if (!out) goto oom;
  size_t i;
  const json_t *m;
  char param[64];
  json_array_foreach(msgs, i, m) {
    if (!json_is_object(m)) {
      snprintf(param, sizeof param, "messages[%zu]", i);
      BAD(param, "'%s' must be an object", param);
      goto fail;
    }
    const json_t *role = json_object_get(m, "role");
    snprintf(param, sizeof param, "messages[%zu].role", i);
    if (!json_is_string(role)) {
      BAD(param, "'%s' must be a string", param);
      goto fail;
    }
    const char *rs = json_string_value(role);
    if (strcmp(rs, "system") && strcmp(rs, "developer") && strcmp(rs, "user") &&
        strcmp(rs, "assistant") && strcmp(rs, "tool")) {
      BAD(param, "unknown role '%s' in %s (expected system, developer, user, assistant or tool)",
          rs, param);
      goto fail;
    }
    json_t *nm = json_deep_copy(m);
    if (!nm) goto oom;
    if (!strcmp(rs, "developer")) json_object_set_new(nm, "role", json_string("system"));
    snprintf(param, sizeof param, "messages[%zu].content", i);
    json_t *content = content_to_string(json_object_get(m, "content"), param, err);
    if (!content) {
      json_decref(nm);
      goto fail;
    }
    if (json_is_null(content) && strcmp(rs, "assistant")) {
      json_decref(content);
      json_decref(nm);
      BAD(param, "'%s' is required for role '%s'", param, rs);
      goto fail;
    }
    json_object_set_new(nm, "content", content);
    const json_t *tc = json_object_get(m, "tool_calls");
    if (tc && !json_is_null(tc) && !json_is_array(tc)) {
      json_decref(nm);
      snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
      BAD(param, "'%s' must be an array", param);
      goto fail;
    }
    if (json_array_append_new(out, nm)) goto oom;
  }
  return out;
oom:
  openai_error_set(err, 500, "server_error", NULL, "out of memory");
fail:
  json_decref(out);
  return NULL;
}

static int check_tools(const json_t *tools, openai_error *err) {
  if (!json_is_array(tools)) return BAD("tools", "'tools' must be an array");
  size_t i;
  const json_t *t;
  char param[64];
  json_array_foreach(tools, i, t) {
    snprintf(param, sizeof param, "tools[%zu]", i);
    const json_t *type = json_object_get(t, "type");
    const json_t *fn = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(type) ||
        strcmp(json_string_value(type), "function") || !json_is_object(fn) ||
        !json_is_string(json_object_get(fn, "name")))
      return BAD(param, "'%s' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                 param);
    const json_t *params = json_object_get(fn, "parameters");
    if (params && !json_is_null(params) && !json_is_object(params))
      return BAD(param, "'%s.function.parameters' must be an object", param);
  }
  return 0;
}

static int tools_have(const json_t *tools, const char *name) {
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *n = json_object_get(json_object_get(t, "function"), "name");
    if (json_is_string(n) && !strcmp(json_string_value(n), name)) return 1;
  }
  return 0;
}

static int parse_tool_choice(const json_t *o, const json_t *tools, openai_request *r,
                             openai_error *err) {
  const json_t *tc = json_object_get(o, "tool_choice");
  r->tool_choice = OPENAI_TOOL_CHOICE_AUTO;
  if (!tc || json_is_null(tc)) return 0;
  if (json_is_string(tc)) {
    const char *s = json_string_value(tc);
    if (!strcmp(s, "auto"))
      r->tool_choice = OPENAI_TOOL_CHOICE_AUTO;
    else if (!strcmp(s, "none"))
      r->tool_choice = OPENAI_TOOL_CHOICE_NONE;
    else if (!strcmp(s, "required"))
      r->tool_choice = OPENAI_TOOL_CHOICE_REQUIRED;
    else
      return BAD("tool_choice", "'tool_choice' must be auto, none, required or a named function");
  } else if (json_is_object(tc)) {
    const json_t *name = json_object_get(json_object_get(tc, "function"), "name");
    if (!json_is_string(name))
      return BAD(
          "tool_choice",
          "'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    r->tool_choice = OPENAI_TOOL_CHOICE_NAMED;
    r->tool_choice_name = strdup(json_string_value(name));
    if (!r->tool_choice_name)
      return openai_error_set(err, 500, "server_error", NULL, "out of memory");
  } else {
    return BAD("tool_choice", "'tool_choice' must be a string or an object");
  }
  if ((r->tool_choice == OPENAI_TOOL_CHOICE_REQUIRED ||
       r->tool_choice == OPENAI_TOOL_CHOICE_NAMED) &&
      (!tools || json_array_size(tools) == 0))
    return BAD("tool_choice", "'tool_choice' %s needs 'tools'",
               r->tool_choice == OPENAI_TOOL_CHOICE_NAMED ? "naming a function" : "\"required\"");
  if (r->tool_choice == OPENAI_TOOL_CHOICE_NAMED && !tools_have(tools, r->tool_choice_name))
    return BAD("tool_choice", "'tool_choice' names '%s', which is not in 'tools'",
               r->tool_choice_name);
  return 0;
}

/* Builds r->render from messages, tools and chat_template_kwargs. */
static int build_render(const json_t *o, openai_request *r, int with_tool_choice,
                        openai_error *err) {
  json_t *msgs = normalise_messages(json_object_get(o, "messages"), err);
  if (!msgs) return -1;
  r->render = json_object();
  if (!r->render || json_object_set_new(r->render, "messages", msgs))
    return openai_error_set(err, 500, "server_error", NULL, "out of memory");
  const json_t *tools = json_object_get(o, "tools");
  if (tools && json_is_null(tools)) tools = NULL;
  if (tools && check_tools(tools, err)) return -1;
  if (with_tool_choice && parse_tool_choice(o, tools, r, err)) return -1;
  if (tools && json_array_size(tools) > 0 && r->tool_choice != OPENAI_TOOL_CHOICE_NONE) {
    json_object_set(r->render, "tools", (json_t *)tools);
    r->tools = json_object_get(r->render, "tools");
  }
  const json_t *kw = json_object_get(o, "chat_template_kwargs");
  if (kw && !json_is_null(kw)) {
    if (!json_is_object(kw))
      return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    const json_t *et = json_object_get(kw, "enable_thinking");
    if (et && !json_is_null(et) && !json_is_boolean(et))
      return BAD("chat_template_kwargs",
                 "'chat_template_kwargs.enable_thinking' must be a boolean");
    json_object_set(r->render, "chat_template_kwargs", (json_t *)kw);
  }
  r->add_generation_prompt = 1;
  if (get_bool(o, "add_generation_prompt", &r->add_generation_prompt, err)) return -1;
  /* vLLM's: a template (or a template's name) for this request; continue the last message */
  const json_t *ct = json_object_get(o, "chat_template");
  if (ct && !json_is_null(ct)) {
    if (!json_is_string(ct)) return BAD("chat_template", "'chat_template' must be a string");
    json_object_set(r->render, "chat_template", (json_t *)ct);
  }
  const json_t *cf = json_object_get(o, "continue_final_message");
  if (cf && !json_is_null(cf)) {
    if (!json_is_boolean(cf))
      return BAD("continue_final_message", "'continue_final_message' must be a boolean");
    if (json_is_true(cf) && json_is_true(json_object_get(o, "add_generation_prompt")))
      return BAD("continue_final_message",
                 "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    json_object_set(r->render, "continue_final_message", (json_t *)cf);
  }
  return 0;
}

/* tool_choice "required" / a named function: the output is forced, through the same JSON mask
 * as response_format, to one or more tool calls (at most one with parallel_tool_calls false)
 * whose arguments match the tools' parameters (tool_grammar.h). The server sets the grammar's
 * think block once the prompt is rendered, and refuses templates whose calls are not JSON. */
static int force_tool_calls(const json_t *o, openai_request *r, openai_error *err) {
  if (r->tool_choice != OPENAI_TOOL_CHOICE_REQUIRED && r->tool_choice != OPENAI_TOOL_CHOICE_NAMED)
    return 0;
  if (r->json_object)
    return BAD("tool_choice", "tool_choice %s with a response_format is not supported",
               r->tool_choice == OPENAI_TOOL_CHOICE_NAMED ? "naming a function" : "\"required\"");
  if (r->n > 1)
    return BAD("n", "n > 1 with tool_choice %s is not supported",
               r->tool_choice == OPENAI_TOOL_CHOICE_NAMED ? "naming a function" : "\"required\"");
  if (r->sp.min_tokens > 0) /* the mask may leave nothing but an end token */
    return BAD("min_tokens", "min_tokens with a forced tool_choice is not supported");
  const json_t *ptc = json_object_get(o, "parallel_tool_calls");
  if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
    return BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  char why[300] = "";
  r->schema = tool_grammar_compile(r->tools, r->tool_choice_name, json_is_false(ptc) ? 1 : 0, why,
                                   sizeof why);
  if (!r->schema)
    return strcmp(why, "out of memory")
               ? BAD("tools", "tool_choice %s: %s",
                     r->tool_choice == OPENAI_TOOL_CHOICE_NAMED ? "naming a function"
                                                                : "\"required\"",
                     why)
               : openai_error_set(err, 500, "server_error", NULL, "out of memory");
  r->json_object = 1;
  r->tool_forced = 1;
  return 0;
}

/* tool_choice auto with parallel_tool_calls false: at most one call, the output ending after
 * the first call block (tool_grammar_single, through the same mask). With a response_format the
 * output is one JSON object, never a call, so there is nothing to bound. */
static int single_tool_call(const json_t *o, openai_request *r, openai_error *err) {
  const json_t *ptc = json_object_get(o, "parallel_tool_calls");
  if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
    return BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  if (r->tool_choice != OPENAI_TOOL_CHOICE_AUTO || !r->tools || !json_is_false(ptc) ||
      r->json_object)
    return 0;
  if (r->n > 1) return BAD("n", "n > 1 with parallel_tool_calls false is not supported");
  if (r->sp.min_tokens > 0) /* after the call the mask leaves nothing but an end token */
    return BAD("min_tokens", "min_tokens with parallel_tool_calls false is not supported");
  if (!(r->schema = tool_grammar_single()))
    return openai_error_set(err, 500, "server_error", NULL, "out of memory");
  r->json_object = 1;
  r->tool_forced = 1;
  return 0;
}

static int parse_chat(const json_t *o, openai_request *r, openai_error *err) {
  if (build_render(o, r, 1, err)) return -1;
  /* json_object: the mask admits no </think> (nor <think>), so unless the client chose, the
   * prompt is rendered with thinking off: the object is the answer, not reasoning */
  if (r->json_object) {
    const json_t *kw = json_object_get(r->render, "chat_template_kwargs");
    const json_t *et = kw ? json_object_get(kw, "enable_thinking") : NULL;
    if (!et || json_is_null(et)) {
      json_t *nk = kw ? json_copy((json_t *)kw) : json_object();
      if (!nk || json_object_set_new(nk, "enable_thinking", json_false())) {
        json_decref(nk);
        return openai_error_set(err, 500, "server_error", NULL, "out of memory");
      }
      if (json_object_set_new(r->render, "chat_template_kwargs", nk)) /* takes nk either way */
        return openai_error_set(err, 500, "server_error", NULL, "out of memory");
    }
  }
  if (force_tool_calls(o, r, err) || single_tool_call(o, r, err)) return -1;
  /* chat logprobs: a boolean, plus top_logprobs */
  const json_t *lp = json_object_get(o, "logprobs");
  if (lp && !json_is_null(lp)) {
    if (!json_is_boolean(lp)) return BAD("logprobs", "'logprobs' must be a boolean");
    r->logprobs = json_is_true(lp);
  }
  long long tl = 0;
  int present = 0;
  if (get_int(o, "top_logprobs", 0, OPENAI_MAX_LOGPROBS, &tl, &present, err)) return -1;
  if (present && tl > 0 && !r->logprobs)
    return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r->top_logprobs = (int)tl;
  return 0;
}

/* ---- completions ---- */

/* One prompt: a non-empty string, or a non-empty array of token ids (k: its place in a list,
 * -1 alone). */
static int parse_one_prompt(const json_t *p, int k, openai_prompt *out, openai_error *err) {
  char where[32] = "";
  if (k >= 0) snprintf(where, sizeof where, " (prompt %d)", k);
  if (json_is_string(p)) {
    if (json_string_length(p) == 0) return BAD("prompt", "'prompt' must not be empty%s", where);
    out->len = json_string_length(p);
    out->text = malloc(out->len + 1);
    if (!out->text) return openai_error_set(err, 500, "server_error", NULL, "out of memory");
    memcpy(out->text, json_string_value(p), out->len + 1);
    return 0;
  }
  if (!json_is_array(p))
    return BAD("prompt", "'prompt' must be a string, an array of token ids, or a list of either%s",
               where);
  size_t n = json_array_size(p);
  if (n == 0) return BAD("prompt", "'prompt' must not be empty%s", where);
  out->ids = malloc(n * sizeof *out->ids);
  if (!out->ids) return openai_error_set(err, 500, "server_error", NULL, "out of memory");
  size_t i;
  const json_t *v;
  json_array_foreach(p, i, v) {
    if (token_id_of(v, &out->ids[i]))
      return BAD("prompt", "'prompt' token ids must be non-negative integers (element %zu%s)", i,
                 where);
  }
  out->n_ids = (int)n;
  return 0;
}

static int parse_completion(const json_t *o, openai_request *r, openai_error *err) {
  const json_t *p = json_object_get(o, "prompt");
  if (!p || json_is_null(p)) return BAD("prompt", "'prompt' is required");
  /* a list of prompts: strings or token-id arrays (a bare array of integers is one prompt) */
  size_t np = 1;
  int list = json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
  if (list) {
    np = json_array_size(p);
    if (np > OPENAI_MAX_PROMPTS)
      return BAD("prompt", "at most %d prompts per request, got %zu", OPENAI_MAX_PROMPTS, np);
    if (np * (size_t)(r->n > 0 ? r->n : 1) > OPENAI_MAX_CHOICES)
      return BAD("n", "prompts x n is %zu x %d; at most %d choices per request", np, r->n,
                 OPENAI_MAX_CHOICES);
  }
  openai_prompt first;
  memset(&first, 0, sizeof first);
  int rc = parse_one_prompt(list ? json_array_get(p, 0) : p, np > 1 ? 0 : -1, &first, err);
  r->prompt = first.text;
  r->prompt_len = first.len;
  r->prompt_ids = first.ids;
  r->n_prompt_ids = first.n_ids;
  if (rc) return -1;
  if (np > 1 && r->schema) /* one compiled schema serves one generation */
    return BAD("prompt", "a list of prompts with response_format json_schema is not supported");
  if (np > 1) {
    r->more_prompts = calloc(np - 1, sizeof *r->more_prompts);
    if (!r->more_prompts) return openai_error_set(err, 500, "server_error", NULL, "out of memory");
    for (size_t k = 1; k < np; k++) {
      r->n_more_prompts = (int)k;
      if (parse_one_prompt(json_array_get(p, k), (int)k, &r->more_prompts[k - 1], err)) return -1;
    }
  }
  if (get_bool(o, "echo", &r->echo, err)) return -1;
  long long lp = 0;
  int present = 0;
  if (get_int(o, "logprobs", 0, OPENAI_MAX_LOGPROBS, &lp, &present, err)) return -1;
  if (present) {
    r->logprobs = 1;
    r->top_logprobs = (int)lp;
  }
  const json_t *suffix = json_object_get(o, "suffix");
  if (suffix && !json_is_null(suffix)) return BAD("suffix", "'suffix' is not supported");
  return 0;
}

/* The JSON values a body would become, counted before jansson builds any: each '[', '{', ','
 * and ':' outside strings (about one per value, object keys included). A jansson value takes
 * ~50 bytes however few it is written in ("1," is two), so a body is refused here, in one
 * pass that allocates nothing, when its tree would be many times its size. */
static size_t count_values(const char *body, size_t len, size_t limit) {
  size_t n = 0;
  int in_str = 0;
  for (size_t i = 0; i < len && n <= limit; i++) {
    char c = body[i];
    if (in_str) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '[' || c == '{' || c == ',' || c == ':') {
      n++;
    }
  }
  return n;
}

/* The values a body of len bytes may hold: a tree of ~40 bytes a value stays within about ten
 * times the body (a token-id prompt writes an id in 5 to 7 bytes), and within ~40 MiB. */
static size_t max_values(size_t len) {
  size_t n = 16384 + len / 4;
  return n < OPENAI_MAX_JSON_VALUES ? n : OPENAI_MAX_JSON_VALUES;
}

static json_t *load_object(const char *body, size_t len, openai_error *err) {
  size_t limit = max_values(len);
  if (count_values(body, len, limit) > limit) {
    openai_error_set(err, 400, "invalid_request_error", NULL,
                     "the request body holds more than %zu JSON values (at most 16384 + one per 4 "
                     "bytes of body, and %d)",
                     limit, OPENAI_MAX_JSON_VALUES);
    return NULL;
  }
  json_error_t je;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    openai_error_set(err, 400, "invalid_request_error", NULL,
                     "invalid JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    openai_error_set(err, 400, "invalid_request_error", NULL,
                     "the request body must be a JSON object");
    return NULL;
  }
  return root;
}

json_t *openai_request_load(const char *body, size_t len, openai_error *err) {
  return load_object(body, len, err);
}

int openai_request_parse(openai_kind kind, const char *body, size_t len, openai_request *r,
                         openai_error *err) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->skip_special_tokens = 1;
  r->add_generation_prompt = 1;
  json_t *root = load_object(body, len, err);
  if (!root) return -1;
  int rc = 0;
  const json_t *model = json_object_get(root, "model");
  if (model && !json_is_null(model) && !json_is_string(model)) {
    rc = BAD("model", "'model' must be a string");
    goto done;
  }
  if (get_str(root, "model", &r->model, err) || parse_sampling(root, r, err)) {
    rc = -1;
    goto done;
  }
  rc = kind == OPENAI_KIND_CHAT ? parse_chat(root, r, err) : parse_completion(root, r, err);
  if (rc == 0) {
    r->sp.logprobs = r->logprobs;
    r->sp.top_logprobs = r->top_logprobs;
    if (r->max_tokens > 0) rc = openai_request_check_logprobs(r, r->max_tokens, err);
  }
done:
  json_decref(root);
  if (rc) openai_request_free(r);
  return rc;
}

int openai_request_check_logprobs(const openai_request *r, long long max_tokens, openai_error *e) {
  if (!r->logprobs) return 0;
  long long n = (long long)(r->n > 0 ? r->n : 1) * (1 + r->n_more_prompts),
            top = r->top_logprobs > 0 ? r->top_logprobs : 1;
  if (n * max_tokens * top <= OPENAI_MAX_LOGPROB_ENTRIES) return 0;
  return openai_error_set(
      e, 400, "invalid_request_error", r->kind == OPENAI_KIND_CHAT ? "top_logprobs" : "logprobs",
      "n x max_tokens x top_logprobs is %lld x %lld x %lld = %lld logprob entries; at most %d "
      "are allowed per request (lower n, max_tokens or top_logprobs; max_tokens defaults to the "
      "rest of the context)",
      n, max_tokens, top, n * max_tokens * top, OPENAI_MAX_LOGPROB_ENTRIES);
}

void openai_request_body_free(strbuf *body) {
  size_t cap = body->cap;
  strbuf_free(body);
  if (cap >= OPENAI_TRIM_BYTES) malloc_trim(0);
}

void openai_request_free(openai_request *r) {
  json_schema_free(r->schema);
  free(r->model);
  for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
  free(r->cache_salt);
  free(r->prompt);
  free(r->prompt_ids);
  for (int i = 0; i < r->n_more_prompts; i++) {
    free(r->more_prompts[i].text);
    free(r->more_prompts[i].ids);
  }
  free(r->more_prompts);
  json_decref(r->render);
  free(r->tool_choice_name);
  memset(r, 0, sizeof *r);
}

int openai_request_parse_tokenize(const char *body, size_t len, char **model, char **prompt,
                                  size_t *prompt_len, json_t **render, int *add_generation_prompt,
                                  openai_error *err) {
  *model = NULL;
  *prompt = NULL;
  *render = NULL;
  *prompt_len = 0;
  *add_generation_prompt = 1;
  json_t *root = load_object(body, len, err);
  if (!root) return -1;
  openai_request r;
  memset(&r, 0, sizeof r);
  int rc = 0;
  if (get_str(root, "model", model, err)) {
    rc = -1;
  } else if (json_object_get(root, "messages")) {
    rc = build_render(root, &r, 0, err);
    if (rc == 0) {
      *render = r.render;
      r.render = NULL;
      *add_generation_prompt = r.add_generation_prompt;
    }
    json_decref(r.render);
  } else {
    const json_t *p = json_object_get(root, "prompt");
    if (!json_is_string(p)) {
      rc = BAD("prompt", "'prompt' (a string) or 'messages' is required");
    } else {
      *prompt_len = json_string_length(p);
      *prompt = malloc(*prompt_len + 1);
      if (!*prompt)
        rc = openai_error_set(err, 500, "server_error", NULL, "out of memory");
      else
        memcpy(*prompt, json_string_value(p), *prompt_len + 1);
    }
  }
  json_decref(root);
  if (rc) {
    free(*model);
    *model = NULL;
  }
  return rc;
}

int openai_request_parse_detokenize(const char *body, size_t len, char **model, int32_t **ids,
                                    int *n_ids, openai_error *err) {
  *model = NULL;
  *ids = NULL;
  *n_ids = 0;
  json_t *root = load_object(body, len, err);
  if (!root) return -1;
  int rc = 0;
  const json_t *t = json_object_get(root, "tokens");
  if (get_str(root, "model", model, err)) {
    rc = -1;
  } else if (!json_is_array(t)) {
    rc = BAD("tokens", "'tokens' (an array of token ids) is required");
  } else {
    size_t n = json_array_size(t);
    *ids = malloc((n ? n : 1) * sizeof **ids);
    if (!*ids) {
      rc = openai_error_set(err, 500, "server_error", NULL, "out of memory");
    } else {
      size_t i;
      const json_t *v;
      json_array_foreach(t, i, v) {
        if (token_id_of(v, &(*ids)[i])) {
          rc = BAD("tokens", "'tokens' must hold non-negative integers (element %zu)", i);
          break;
        }
      }
      *n_ids = (int)n;
    }
  }
  json_decref(root);
  if (rc) {
    free(*model);
    free(*ids);
    *model = NULL;
    *ids = NULL;
    *n_ids = 0;
  }
  return rc;
}
