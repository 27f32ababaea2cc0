/* chat_parse — splits generated assistant text into reasoning, content and tool calls.
 *
 *   [<think>] reasoning </think> \n\n content [ <tool_call> BODY </tool_call> ]* trailing
 *   \___________ reasoning ____/      \________ content + tool_calls __________________/
 *
 * Step 1 (reasoning): when the prompt left a <think> block open, or the text opens one,
 * everything before the first "</think>" (a leading "<think>" removed, newlines trimmed as the
 * templates trim them) is reasoning. An open block that never closes (the model ran out of
 * tokens while thinking) makes all of the text reasoning. Any other text is content, a stray
 * "</think>" included.
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

/* ---------------------------------------------------------------- the incremental parser
 *
 * One pass over the text, byte by byte; what it decides it never takes back, so the parts it
 * emits as bytes arrive concatenate to what it emits for the whole text at once (chat_parse is
 * this parser fed the whole text). Each mode holds back only what the next bytes can still
 * change:
 *
 *   START     leading whitespace and a partial "<think>": the text may still open a block
 *   REASON    newlines (trimmed before "</think>" and at the end) and a partial "</think>"
 *   LEAD      the newlines after "</think>" (dropped)
 *   CONTENT   whitespace (dropped before a parsed call) and a partial "<tool_call>"
 *   CALL      the whole block up to "</tool_call>", then parsed: a call, or content verbatim
 *
 * A "</think>" counts only in REASON: a text that neither opens "<think>" nor follows a prompt
 * that left one open is content throughout, since its start was already sent as content. */

typedef enum { CPS_START, CPS_REASON, CPS_LEAD, CPS_CONTENT, CPS_CALL } cps_mode;

static const char TAG_OPEN_THINK[] = "<think>", TAG_CLOSE_THINK[] = "</think>",
                  TAG_OPEN_CALL[] = "<tool_call>", TAG_CLOSE_CALL[] = "</tool_call>";

struct chat_parse_stream {
  int thinking_open;
  const json_t *tools; /* borrowed */
  chat_parse_id_fn id_fn;
  void *id_ctx;
  cps_mode mode;
  strbuf hold;      /* START: the bytes so far; CONTENT: whitespace held */
  size_t hold_ws;   /* START: leading whitespace bytes in hold */
  size_t tag;       /* bytes matched of the mode's tag */
  size_t nl;        /* REASON: newlines held */
  int started;      /* REASON: a byte was emitted (leading newlines are dropped until then) */
  int seg_text;     /* CONTENT: the segment since the last call block has non-whitespace */
  int n_calls;      /* calls parsed */
  strbuf body;      /* CALL: the block's bytes so far */
  strbuf ws_before; /* CALL: the whitespace held before "<tool_call>" */
  int ended;        /* a NUL byte was fed: the text ends there (as a C string would) */
  int finished;
};

static int cps_step(chat_parse_stream *p, char c, chat_parse_out *o);

static void emit_nl(strbuf *b, size_t n) {
  static const char nls[] = "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n";
  while (n > 0) {
    size_t k = n < sizeof nls - 1 ? n : sizeof nls - 1;
    strbuf_append(b, nls, k);
    n -= k;
  }
}

/* Hands the held bytes of START to the mode the text turned out to be in. */
static int cps_leave_start(chat_parse_stream *p, chat_parse_out *o) {
  strbuf held = p->hold;
  strbuf_init(&p->hold);
  p->mode = p->thinking_open ? CPS_REASON : CPS_CONTENT;
  int rc = 0;
  for (size_t i = 0; i < held.len && !rc; i++) rc = cps_step(p, held.data[i], o);
  if (held.oom) rc = -1;
  strbuf_free(&held);
  return rc;
}

/* The call block in body is complete (closed: its "</tool_call>" was seen, and cut off). */
static int cps_end_block(chat_parse_stream *p, int closed, chat_parse_out *o) {
  if (!o->calls && !(o->calls = json_array())) return -1;
  int rc =
      parse_call(p->body.data ? p->body.data : "", (p->body.data ? p->body.data : "") + p->body.len,
                 p->tools, p->id_fn, p->id_ctx, o->calls);
  if (rc == CALL_OOM) return -1;
  if (rc == CALL_OK) {
    p->n_calls++;
  } else { /* malformed: kept verbatim, with the whitespace before it */
    strbuf_append(&o->content, p->ws_before.data, p->ws_before.len);
    strbuf_puts(&o->content, TAG_OPEN_CALL);
    strbuf_append(&o->content, p->body.data, p->body.len);
    if (closed) strbuf_puts(&o->content, TAG_CLOSE_CALL);
  }
  p->ws_before.len = p->body.len = 0;
  p->seg_text = 0;
  p->tag = 0;
  p->mode = CPS_CONTENT;
  return p->body.oom || p->ws_before.oom ? -1 : 0;
}

static int cps_step(chat_parse_stream *p, char c, chat_parse_out *o) {
  switch (p->mode) {
    case CPS_START: {
      if (strbuf_append(&p->hold, &c, 1)) return -1;
      if (p->hold_ws + 1 == p->hold.len && is_ws(c)) {
        p->hold_ws++;
        return 0;
      }
      size_t rest = p->hold.len - p->hold_ws;
      if (memcmp(p->hold.data + p->hold_ws, TAG_OPEN_THINK, rest)) return cps_leave_start(p, o);
      if (rest == sizeof TAG_OPEN_THINK - 1) { /* opened: reasoning follows the tag */
        p->hold.len = 0;
        p->mode = CPS_REASON;
      }
      return 0;
    }
    case CPS_REASON:
      if (p->tag > 0) {
        if (c == TAG_CLOSE_THINK[p->tag]) {
          if (++p->tag == sizeof TAG_CLOSE_THINK - 1) { /* newlines before it are trimmed */
            p->tag = p->nl = 0;
            p->mode = CPS_LEAD;
          }
          return 0;
        }
        emit_nl(&o->reasoning, p->nl);
        strbuf_append(&o->reasoning, TAG_CLOSE_THINK, p->tag);
        p->nl = p->tag = 0;
        p->started = 1;
      }
      if (c == '<') {
        p->tag = 1;
      } else if (c == '\n') {
        if (p->started) p->nl++;
      } else {
        emit_nl(&o->reasoning, p->nl);
        p->nl = 0;
        strbuf_append(&o->reasoning, &c, 1);
        p->started = 1;
      }
      return o->reasoning.oom ? -1 : 0;
    case CPS_LEAD:
      if (c == '\n') return 0;
      p->mode = CPS_CONTENT;
      return cps_step(p, c, o);
    case CPS_CONTENT:
      if (p->tag > 0) {
        if (c == TAG_OPEN_CALL[p->tag]) {
          if (++p->tag == sizeof TAG_OPEN_CALL - 1) {
            strbuf t = p->ws_before;
            p->ws_before = p->hold;
            p->hold = t;
            p->hold.len = p->body.len = 0;
            p->tag = 0;
            p->mode = CPS_CALL;
          }
          return 0;
        }
        strbuf_append(&o->content, p->hold.data, p->hold.len);
        strbuf_append(&o->content, TAG_OPEN_CALL, p->tag);
        p->hold.len = p->tag = 0;
        p->seg_text = 1;
      }
      if (c == '<') {
        p->tag = 1;
      } else if (is_ws(c)) {
        strbuf_append(&p->hold, &c, 1);
      } else {
        strbuf_append(&o->content, p->hold.data, p->hold.len);
        strbuf_append(&o->content, &c, 1);
        p->hold.len = 0;
        p->seg_text = 1;
      }
      return o->content.oom || p->hold.oom ? -1 : 0;
    case CPS_CALL:
      if (strbuf_append(&p->body, &c, 1)) return -1;
      if (p->tag > 0 && c == TAG_CLOSE_CALL[p->tag]) {
        if (++p->tag == sizeof TAG_CLOSE_CALL - 1) {
          p->body.len -= sizeof TAG_CLOSE_CALL - 1;
          return cps_end_block(p, 1, o);
        }
        return 0;
      }
      p->tag = c == '<';
      return 0;
  }
  return 0;
}

chat_parse_stream *chat_parse_stream_new(int thinking_open, const json_t *tools_json,
                                         chat_parse_id_fn id_fn, void *id_ctx) {
  chat_parse_stream *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->thinking_open = thinking_open;
  p->tools = tools_json;
  p->id_fn = id_fn ? id_fn : chat_parse_random_id;
  p->id_ctx = id_ctx;
  p->mode = CPS_START;
  return p;
}

void chat_parse_stream_free(chat_parse_stream *p) {
  if (!p) return;
  strbuf_free(&p->hold);
  strbuf_free(&p->body);
  strbuf_free(&p->ws_before);
  free(p);
}

int chat_parse_stream_feed(chat_parse_stream *p, const char *text, size_t len, chat_parse_out *o) {
  if (p->finished || p->ended) return 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == 0) {
      p->ended = 1;
      break;
    }
    if (cps_step(p, text[i], o)) return -1;
  }
  return 0;
}

int chat_parse_stream_finish(chat_parse_stream *p, chat_parse_out *o) {
  if (p->finished) return 0;
  p->finished = 1;
  if (p->mode == CPS_START && cps_leave_start(p, o)) return -1;
  switch (p->mode) {
    case CPS_REASON: /* a block that never closed: a partial tag is text, newlines trimmed */
      if (p->tag > 0) {
        emit_nl(&o->reasoning, p->nl);
        strbuf_append(&o->reasoning, TAG_CLOSE_THINK, p->tag);
      }
      break;
    case CPS_CONTENT:
      if (p->tag > 0) {
        strbuf_append(&o->content, p->hold.data, p->hold.len);
        strbuf_append(&o->content, TAG_OPEN_CALL, p->tag);
        p->hold.len = 0;
        p->seg_text = 1;
      }
      /* whitespace after the last call is dropped when nothing else follows it */
      if (!(p->n_calls > 0 && !p->seg_text)) strbuf_append(&o->content, p->hold.data, p->hold.len);
      break;
    case CPS_CALL: /* a last block without "</tool_call>": counts when its body parses */
      if (cps_end_block(p, 0, o)) return -1;
      break;
    default:
      break;
  }
  return o->reasoning.oom || o->content.oom ? -1 : 0;
}

void chat_parse_out_init(chat_parse_out *o) {
  strbuf_init(&o->reasoning);
  strbuf_init(&o->content);
  o->calls = NULL;
}

void chat_parse_out_free(chat_parse_out *o) {
  strbuf_free(&o->reasoning);
  strbuf_free(&o->content);
  json_decref(o->calls);
  o->calls = NULL;
}

/* ---------------------------------------------------------------- entry points */

int chat_parse_ex(const char *text, int thinking_open, const json_t *tools_json,
                  chat_parse_id_fn id_fn, void *id_ctx, chat_parsed *out) {
  memset(out, 0, sizeof *out);
  chat_parse_out o;
  chat_parse_out_init(&o);
  chat_parse_stream *p = chat_parse_stream_new(thinking_open, tools_json, id_fn, id_ctx);
  int rc =
      !p || chat_parse_stream_feed(p, text, strlen(text), &o) || chat_parse_stream_finish(p, &o)
          ? -1
          : 0;
  chat_parse_stream_free(p);
  if (!rc && o.reasoning.len > 0 && !(out->reasoning_content = strbuf_take(&o.reasoning))) rc = -1;
  if (!rc && (strbuf_append(&o.content, "", 0) || !(out->content = strbuf_take(&o.content))))
    rc = -1;
  if (!rc && json_array_size(o.calls) > 0) {
    out->tool_calls = o.calls;
    o.calls = NULL;
  }
  chat_parse_out_free(&o);
  if (rc) chat_parsed_free(out);
  return rc;
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
