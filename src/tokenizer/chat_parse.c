/* chat_parse — splits generated assistant text into reasoning, content and tool calls.
 *
 *   [<think>] reasoning </think> \n\n content [ <tool_call> BODY </tool_call> ]* trailing
 *   \___________ reasoning ____/      \________ content + tool_calls __________________/
 *
 * Step 1 (reasoning): when the prompt left a <think> block open, or the text holds a
 * "</think>", everything before the first "</think>" (a leading "<think>" removed, newlines
 * trimmed as the templates trim them) is reasoning. An open block that never closes (the
 * model ran out of tokens while thinking) makes all of the text reasoning.
 *
 * Step 2 (tool calls): each <tool_call>...</tool_call> block of the rest is parsed as
 *   JSON:  {"name": NAME, "arguments": {...}}                      (Qwen3 / Qwen3-Next)
 *   XML:   <function=NAME> <parameter=ARG>\nVALUE\n</parameter>... </function>  (Qwen3.5)
 * A block that does not parse stays in content verbatim, tags included. A last block with no
 * closing tag (generation stopped) is accepted when its body parses. Whitespace around parsed
 * calls is dropped from content.
 *
 * XML values are typed with the request's tools schema (function.parameters.properties[ARG]
 * .type): "string" keeps the text; number/integer/boolean/object/array/null parse it as JSON
 * (booleans also as True/False) and fall back to the text when it does not fit. Without a
 * schema for the parameter, a value that parses as JSON is taken as JSON, else as text.
 * Arguments are returned as Python-json.dumps text (chat_template_tojson), so that rendering
 * the call back through the Qwen3 template reproduces it. */
#include "tokenizer/chat_parse.h"
#include "tokenizer/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/strbuf.h"
#include "tokenizer/chat_template.h"

/* ---------------------------------------------------------------- small helpers */

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const char *find(const char *s, const char *end, const char *needle) {
  return memmem(s, (size_t)(end - s), needle, strlen(needle));
}

static int starts(const char *s, const char *end, const char *pre) {
  size_t n = strlen(pre);
  return (size_t)(end - s) >= n && !memcmp(s, pre, n);
}

static char *dup_range(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

/* ---------------------------------------------------------------- call ids */

void chat_parse_random_id(void *ctx, char *buf, size_t buflen) {
  (void)ctx;
  unsigned char r[12];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    static _Atomic unsigned long long counter;
    unsigned long long x = (unsigned long long)time(NULL) ^ (++counter * 0x9e3779b97f4a7c15ULL);
    for (size_t i = 0; i < sizeof r; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      r[i] = (unsigned char)x;
    }
  }
  char hex[25];
  for (size_t i = 0; i < sizeof r; i++) snprintf(hex + 2 * i, 3, "%02x", r[i]);
  snprintf(buf, buflen, "call_%s", hex);
}

/* ---------------------------------------------------------------- schema lookup */

/* The JSON-schema type name of parameter `arg` of function `fn` in tools, or NULL. A list of
 * types gives its first non-"null" entry. */
static const char *schema_type(const json_t *tools, const char *fn, const char *arg) {
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *f = json_object_get(t, "function");
    if (!f) f = t;
    const char *name = json_string_value(json_object_get(f, "name"));
    if (!name || strcmp(name, fn)) continue;
    const json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
    const json_t *ty = json_object_get(json_object_get(props, arg), "type");
    if (json_is_string(ty)) return json_string_value(ty);
    if (json_is_array(ty)) {
      size_t k;
      json_t *e;
      json_array_foreach(ty, k,
                         e) if (json_is_string(e) &&
                                strcmp(json_string_value(e), "null")) return json_string_value(e);
    }
    return NULL;
  }
  return NULL;
}

/* One XML parameter value, typed by the schema type (NULL = none). New reference or NULL. */
static json_t *typed_value(const char *v, size_t n, const char *type) {
  char *s = dup_range(v, n);
  if (!s) return NULL;
  json_t *out = NULL;
  if (type && !strcmp(type, "string")) {
    out = json_stringn(s, n);
    free(s);
    return out;
  }
  json_t *j = json_loads(s, JSON_DECODE_ANY, NULL);
  if (!type) {
    out = j;
  } else if (!strcmp(type, "integer") || !strcmp(type, "number")) {
    if (json_is_number(j)) out = j;
  } else if (!strcmp(type, "boolean")) {
    if (json_is_boolean(j))
      out = j;
    else if (!strcmp(s, "True"))
      out = json_true();
    else if (!strcmp(s, "False"))
      out = json_false();
  } else if (!strcmp(type, "object")) {
    if (json_is_object(j)) out = j;
  } else if (!strcmp(type, "array")) {
    if (json_is_array(j)) out = j;
  } else if (!strcmp(type, "null")) {
    if (json_is_null(j))
      out = j;
    else if (!strcmp(s, "None"))
      out = json_null();
  } else {
    out = j;
  }
  if (out != j) json_decref(j);
  if (!out) out = json_stringn(s, n);
  free(s);
  return out;
}

/* ---------------------------------------------------------------- call bodies */

enum { CALL_OK = 0, CALL_BAD = 1, CALL_OOM = -1 };

/* Qwen3.5 XML body [s, end) (already trimmed). Sets *name (malloc'd) and *args (new ref). */
static int parse_xml(const char *s, const char *end, const json_t *tools, char **name,
                     json_t **args) {
  if (!starts(s, end, "<function=")) return CALL_BAD;
  s += 10;
  const char *gt = memchr(s, '>', (size_t)(end - s));
  if (!gt || gt == s) return CALL_BAD;
  for (const char *q = s; q < gt; q++)
    if (*q == '\n' || *q == '<') return CALL_BAD;
  char *fn = dup_range(s, (size_t)(gt - s));
  json_t *obj = json_object();
  if (!fn || !obj) goto oom;
  s = gt + 1;
  for (;;) {
    while (s < end && is_ws(*s)) s++;
    if (starts(s, end, "</function>")) {
      s += 11;
      while (s < end && is_ws(*s)) s++;
      if (s != end) goto bad;
      *name = fn;
      *args = obj;
      return CALL_OK;
    }
    if (!starts(s, end, "<parameter=")) goto bad;
    s += 11;
    const char *pgt = memchr(s, '>', (size_t)(end - s));
    if (!pgt || pgt == s) goto bad;
    const char *vstart = pgt + 1;
    const char *close = find(vstart, end, "</parameter>");
    if (!close) goto bad;
    const char *vend = close;
    if (vstart < vend && *vstart == '\n') vstart++;
    if (vend > vstart && vend[-1] == '\n') vend--;
    char *pname = dup_range(s, (size_t)(pgt - s));
    if (!pname) goto oom;
    json_t *val = typed_value(vstart, (size_t)(vend - vstart), schema_type(tools, fn, pname));
    int rc = val ? json_object_set_new(obj, pname, val) : -1;
    free(pname);
    if (rc) goto oom;
    s = close + 12;
  }
bad:
  free(fn);
  json_decref(obj);
  return CALL_BAD;
oom:
  free(fn);
  json_decref(obj);
  return CALL_OOM;
}

/* Qwen3 JSON body. Sets *name and *args (new ref; an object, or a string given as such). */
static int parse_json_call(const char *s, const char *end, char **name, json_t **args) {
  json_t *j = json_loadb(s, (size_t)(end - s), 0, NULL);
  if (!json_is_object(j)) {
    json_decref(j);
    return CALL_BAD;
  }
  const json_t *n = json_object_get(j, "name");
  json_t *a = json_object_get(j, "arguments");
  if (!a) a = json_object_get(j, "parameters");
  if (!json_is_string(n) || json_string_length(n) == 0 ||
      (a && !json_is_object(a) && !json_is_string(a))) {
    json_decref(j);
    return CALL_BAD;
  }
  *name = strdup(json_string_value(n));
  *args = a ? json_incref(a) : json_object();
  json_decref(j);
  if (!*name || !*args) {
    free(*name);
    json_decref(*args);
    return CALL_OOM;
  }
  return CALL_OK;
}

/* Parses one body into an OpenAI tool call appended to calls. */
static int parse_call(const char *s, const char *end, const json_t *tools, chat_parse_id_fn id_fn,
                      void *id_ctx, json_t *calls) {
  while (s < end && is_ws(*s)) s++;
  while (end > s && is_ws(end[-1])) end--;
  char *name = NULL;
  json_t *args = NULL;
  int rc;
  if (starts(s, end, "<function="))
    rc = parse_xml(s, end, tools, &name, &args);
  else if (starts(s, end, "{"))
    rc = parse_json_call(s, end, &name, &args);
  else
    rc = CALL_BAD;
  if (rc != CALL_OK) return rc;
  char *astr = json_is_string(args) ? strdup(json_string_value(args)) : chat_template_tojson(args);
  if (astr && (utf8_valid_prefix((const uint8_t *)name, strlen(name)) != strlen(name) ||
               utf8_valid_prefix((const uint8_t *)astr, strlen(astr)) != strlen(astr))) {
    free(astr); /* not valid UTF-8: not a call a client could read; left in content */
    free(name);
    json_decref(args);
    return CALL_BAD;
  }
  char id[64];
  id_fn(id_ctx, id, sizeof id);
  json_t *call = astr ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
                                  "function", "name", name, "arguments", astr)
                      : NULL;
  free(astr);
  free(name);
  json_decref(args);
  if (!call || json_array_append_new(calls, call)) return CALL_OOM;
  return CALL_OK;
}

/* ---------------------------------------------------------------- entry points */

int chat_parse_ex(const char *text, int thinking_open, const json_t *tools_json,
                  chat_parse_id_fn id_fn, void *id_ctx, chat_parsed *out) {
  memset(out, 0, sizeof *out);
  if (!id_fn) id_fn = chat_parse_random_id;
  const char *s = text, *end = text + strlen(text);

  /* step 1: reasoning */
  const char *p = s;
  while (p < end && is_ws(*p)) p++;
  int opened = starts(p, end, "<think>");
  const char *r = opened ? p + 7 : s;
  const char *close = find(r, end, "</think>");
  if (thinking_open || opened || close) {
    const char *a = r, *b = close ? close : end;
    while (a < b && *a == '\n') a++;
    while (b > a && b[-1] == '\n') b--;
    if (b > a) {
      out->reasoning_content = dup_range(a, (size_t)(b - a));
      if (!out->reasoning_content) goto oom;
    }
    s = close ? close + 8 : end;
    while (s < end && *s == '\n') s++;
  }

  /* step 2: tool calls */
  strbuf content = {0};
  json_t *calls = json_array();
  if (!calls) goto oom;
  const char *pos = s;
  for (;;) {
    const char *open = find(pos, end, "<tool_call>");
    if (!open) {
      const char *q = pos;
      if (json_array_size(calls)) {
        while (q < end && is_ws(*q)) q++;
      }
      if (q < end) strbuf_append(&content, pos, (size_t)(end - pos));
      break;
    }
    const char *body = open + 11;
    const char *cl = find(body, end, "</tool_call>");
    const char *bend = cl ? cl : end;
    const char *after = cl ? cl + 12 : end;
    size_t before = json_array_size(calls);
    int rc = parse_call(body, bend, tools_json, id_fn, id_ctx, calls);
    if (rc == CALL_OOM) {
      free(content.data);
      json_decref(calls);
      goto oom;
    }
    const char *seg_end = open;
    if (rc == CALL_OK) {
      while (seg_end > pos && is_ws(seg_end[-1])) seg_end--;
      const char *q = pos;
      if (before) /* whitespace between two calls */
        while (q < seg_end && is_ws(*q)) q++;
      if (q < seg_end) strbuf_append(&content, pos, (size_t)(seg_end - pos));
    } else {
      strbuf_append(&content, pos, (size_t)(after - pos)); /* malformed: kept verbatim */
    }
    pos = after;
  }
  if (!content.data) strbuf_append(&content, "", 0);
  if (content.oom) {
    free(content.data);
    json_decref(calls);
    goto oom;
  }
  out->content = content.data;
  if (json_array_size(calls))
    out->tool_calls = calls;
  else
    json_decref(calls);
  return 0;
oom:
  chat_parsed_free(out);
  return -1;
}

int chat_parse(const char *text, int thinking_open, const json_t *tools_json, chat_parsed *out) {
  return chat_parse_ex(text, thinking_open, tools_json, NULL, NULL, out);
}

void chat_parsed_free(chat_parsed *p) {
  if (!p) return;
  free(p->reasoning_content);
  free(p->content);
  json_decref(p->tool_calls);
  memset(p, 0, sizeof *p);
}

static const char *const markers[] = {"<tool_call>", "</think>", "<think>"};

size_t chat_parse_safe_prefix(const char *text, size_t len) {
  size_t cut = len;
  for (size_t i = 0; i < len; i++) {
    if (text[i] != '<') continue;
    for (size_t k = 0; k < sizeof markers / sizeof markers[0]; k++) {
      size_t m = strlen(markers[k]), avail = len - i;
      if (!memcmp(text + i, markers[k], avail < m ? avail : m)) {
        cut = i;
        goto utf8;
      }
    }
  }
utf8:
  /* never end inside a UTF-8 sequence cut by the end of the text */
  if (cut == len) {
    size_t back = 0;
    while (back < 3 && back < cut && ((unsigned char)text[cut - 1 - back] & 0xc0) == 0x80) back++;
    if (back < cut) {
      unsigned char lead = (unsigned char)text[cut - 1 - back];
      size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
      if (need > back + 1) cut -= back + 1;
    }
  }
  return cut;
}
