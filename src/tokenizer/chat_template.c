/* chat_template — the Qwen chat templates, written out in C.
 *
 * Each family's official Jinja template is transcribed statement by statement into one render
 * function below (render_qwen3; render_qwen35, which also serves Qwen3.6 whose template
 * differs in two lines: preserve_thinking, and tojson for non-string parameter values).
 * Byte-exactness depends on a few Python behaviours the templates lean on, implemented here once:
 *
 *   tojson        transformers binds Jinja's tojson to json.dumps(x, ensure_ascii=False):
 *                 keys in insertion order, ", " and ": " separators, non-ASCII kept raw,
 *                 control characters as \u00xx, floats as Python's repr.
 *   |string       Python str(): True/False/None, floats by repr.
 *   |trim         Python str.strip(): Unicode whitespace, not just ASCII.
 *   split/strip   str.split('</think>')[-1] is the text after the LAST marker, [0] the text
 *                 before the FIRST; strip('\n') only removes newlines.
 *
 * Before rendering, each message is checked and normalised into a msg_view (role, content as
 * one string, optional reasoning, tool calls), the same preprocessing an OpenAI-compatible
 * server applies and scripts/fixtures/make_chat_vectors.py mirrors:
 *   - content null/missing is "", an array of {"type":"text","text"} parts is joined;
 *   - role "developer" is taken as "system";
 *   - for Qwen3.5, tool-call arguments given as a JSON string are parsed into an object
 *     (the Qwen3 template prints a string verbatim, an object with tojson).
 *
 * Offsets: every message records where its turn starts (the "<|im_start|>" of the turn that
 * holds it). A system message at index 0 starts at 0; consecutive tool messages share their
 * grouped "<|im_start|>user" turn. */
#include "tokenizer/chat_template.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/strbuf.h"

/* ---------------------------------------------------------------- string builder */

/* (strbuf from base/strbuf.h) */

/* ---------------------------------------------------------------- Python-compatible JSON */

/* Python repr(float): the shortest digits that round-trip; fixed notation when the decimal
 * exponent is in (-4, 16], else d.ddde+XX (at least two exponent digits). */
static void py_float_repr(double x, char *out, size_t outlen) {
  if (isnan(x)) {
    snprintf(out, outlen, "NaN");
    return;
  }
  if (isinf(x)) {
    snprintf(out, outlen, x < 0 ? "-Infinity" : "Infinity");
    return;
  }
  char buf[40];
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    if (strtod(buf, NULL) == x) break;
  }
  /* buf = [-]d[.ddd]e[+-]XX */
  const char *s = buf;
  int neg = 0;
  if (*s == '-') {
    neg = 1;
    s++;
  }
  char digits[24];
  int nd = 0;
  for (; *s && *s != 'e'; s++)
    if (*s != '.') digits[nd++] = *s;
  int e10 = atoi(s + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  digits[nd] = 0;
  int decpt = e10 + 1;
  if (digits[0] == '0') decpt = 1; /* zero */
  char res[64];
  int n = 0;
  if (neg) res[n++] = '-';
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      res[n++] = '0';
      res[n++] = '.';
      for (int i = 0; i < -decpt; i++) res[n++] = '0';
      for (int i = 0; i < nd; i++) res[n++] = digits[i];
    } else if (decpt < nd) {
      for (int i = 0; i < decpt; i++) res[n++] = digits[i];
      res[n++] = '.';
      for (int i = decpt; i < nd; i++) res[n++] = digits[i];
    } else {
      for (int i = 0; i < nd; i++) res[n++] = digits[i];
      for (int i = nd; i < decpt; i++) res[n++] = '0';
      res[n++] = '.';
      res[n++] = '0';
    }
    res[n] = 0;
  } else {
    res[n++] = digits[0];
    if (nd > 1) {
      res[n++] = '.';
      for (int i = 1; i < nd; i++) res[n++] = digits[i];
    }
    int e = decpt - 1;
    n += snprintf(res + n, sizeof res - (size_t)n, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  }
  snprintf(out, outlen, "%s", res);
}

static void py_json_string(strbuf *b, const char *s, size_t n) {
  strbuf_append(b, "\"", 1);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    const char *esc = NULL;
    char u[8];
    if (c == '"')
      esc = "\\\"";
    else if (c == '\\')
      esc = "\\\\";
    else if (c == '\n')
      esc = "\\n";
    else if (c == '\r')
      esc = "\\r";
    else if (c == '\t')
      esc = "\\t";
    else if (c == '\b')
      esc = "\\b";
    else if (c == '\f')
      esc = "\\f";
    else if (c < 0x20) {
      snprintf(u, sizeof u, "\\u%04x", c);
      esc = u;
    }
    if (esc) {
      strbuf_append(b, s + i - run, run);
      run = 0;
      strbuf_puts(b, esc);
    } else {
      run++;
    }
  }
  strbuf_append(b, s + n - run, run);
  strbuf_append(b, "\"", 1);
}

static void py_json(strbuf *b, const json_t *v) {
  char num[64];
  switch (json_typeof(v)) {
    case JSON_OBJECT: {
      const char *k;
      json_t *x;
      int first = 1;
      strbuf_append(b, "{", 1);
      json_object_foreach((json_t *)v, k, x) {
        if (!first) strbuf_append(b, ", ", 2);
        first = 0;
        py_json_string(b, k, strlen(k));
        strbuf_append(b, ": ", 2);
        py_json(b, x);
      }
      strbuf_append(b, "}", 1);
      break;
    }
    case JSON_ARRAY: {
      strbuf_append(b, "[", 1);
      for (size_t i = 0; i < json_array_size(v); i++) {
        if (i) strbuf_append(b, ", ", 2);
        py_json(b, json_array_get(v, i));
      }
      strbuf_append(b, "]", 1);
      break;
    }
    case JSON_STRING:
      py_json_string(b, json_string_value(v), json_string_length(v));
      break;
    case JSON_INTEGER:
      snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
      strbuf_puts(b, num);
      break;
    case JSON_REAL:
      py_float_repr(json_real_value(v), num, sizeof num);
      strbuf_puts(b, num);
      break;
    case JSON_TRUE:
      strbuf_puts(b, "true");
      break;
    case JSON_FALSE:
      strbuf_puts(b, "false");
      break;
    case JSON_NULL:
      strbuf_puts(b, "null");
      break;
  }
}

char *chat_template_tojson(const json_t *v) {
  strbuf b = {0};
  py_json(&b, v);
  if (b.oom) {
    free(b.data);
    return NULL;
  }
  if (!b.data) return strdup("");
  return b.data;
}

/* Python str(v) as Jinja's |string gives it for a JSON scalar (strings as they are; numbers
 * as py_json writes them). */
static void py_str(strbuf *b, const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_STRING:
      strbuf_append(b, json_string_value(v), json_string_length(v));
      break;
    case JSON_TRUE:
      strbuf_puts(b, "True");
      break;
    case JSON_FALSE:
      strbuf_puts(b, "False");
      break;
    case JSON_NULL:
      strbuf_puts(b, "None");
      break;
    default:
      py_json(b, v);
      break;
  }
}

/* ---------------------------------------------------------------- Python string helpers */

typedef struct span {
  const char *p;
  size_t n;
} span;

static span span_of(const char *s) { return (span){s, strlen(s)}; }

static int span_starts(span s, const char *pre) {
  size_t n = strlen(pre);
  return s.n >= n && !memcmp(s.p, pre, n);
}
static int span_ends(span s, const char *suf) {
  size_t n = strlen(suf);
  return s.n >= n && !memcmp(s.p + s.n - n, suf, n);
}
static const char *span_find(span s, const char *needle) {
  return memmem(s.p, s.n, needle, strlen(needle));
}
static const char *span_rfind(span s, const char *needle) {
  size_t n = strlen(needle);
  if (s.n < n) return NULL;
  for (size_t i = s.n - n + 1; i-- > 0;)
    if (!memcmp(s.p + i, needle, n)) return s.p + i;
  return NULL;
}
static span lstrip_nl(span s) {
  while (s.n && s.p[0] == '\n') s.p++, s.n--;
  return s;
}
static span rstrip_nl(span s) {
  while (s.n && s.p[s.n - 1] == '\n') s.n--;
  return s;
}

/* Python str.isspace() for one code point. */
static int py_isspace(unsigned cp) {
  if ((cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20)) return 1;
  if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a)) return 1;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Decodes the UTF-8 sequence at s[0..n) (first one); returns its length, 0 when invalid. */
static size_t utf8_at(const unsigned char *s, size_t n, unsigned *cp) {
  if (!n) return 0;
  if (s[0] < 0x80) {
    *cp = s[0];
    return 1;
  }
  size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
  if (!len || len > n) return 0;
  unsigned v = s[0] & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3f);
  }
  *cp = v;
  return len;
}

/* Python str.strip() (Jinja's |trim). */
static span py_trim(span s) {
  for (;;) {
    unsigned cp;
    size_t k = utf8_at((const unsigned char *)s.p, s.n, &cp);
    if (!k || !py_isspace(cp)) break;
    s.p += k;
    s.n -= k;
  }
  for (;;) {
    size_t st = s.n;
    while (st > 0 && ((unsigned char)s.p[st - 1] & 0xc0) == 0x80 && s.n - st < 3) st--;
    if (st == 0) break;
    st--;
    unsigned cp;
    size_t k = utf8_at((const unsigned char *)s.p + st, s.n - st, &cp);
    if (k != s.n - st || !py_isspace(cp)) break;
    s.n = st;
  }
  return s;
}

/* ---------------------------------------------------------------- detection */

chat_template_kind chat_template_detect(const char *template_text, const char *model_type) {
  if (template_text && *template_text) {
    if (strstr(template_text, "<function=") || strstr(template_text, "<parameter="))
      return strstr(template_text, "preserve_thinking") ? CHAT_TEMPLATE_QWEN36
                                                        : CHAT_TEMPLATE_QWEN35;
    return CHAT_TEMPLATE_QWEN3;
  }
  if (model_type && (!strncmp(model_type, "qwen3_5", 7) || !strncmp(model_type, "qwen3.5", 7) ||
                     !strncmp(model_type, "qwen3_6", 7) || !strncmp(model_type, "qwen35", 6)))
    return CHAT_TEMPLATE_QWEN35;
  if (model_type && *model_type) return CHAT_TEMPLATE_QWEN3;
  return CHAT_TEMPLATE_QWEN35;
}

int chat_template_official(const char *text) {
  static const struct {
    unsigned long long fnv;
    size_t len;
    chat_template_kind kind;
  } official[] = {{0x2bfdb7aa9754484eULL, 4116, CHAT_TEMPLATE_QWEN3},
                  {0xf07c510f47fbaca0ULL, 7756, CHAT_TEMPLATE_QWEN35},
                  {0x8ae3a8bc6e68f114ULL, 7764, CHAT_TEMPLATE_QWEN36}};
  unsigned long long h = 0xcbf29ce484222325ULL;
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)text; *p; p++, n++)
    h = (h ^ *p) * 0x100000001b3ULL;
  for (size_t k = 0; k < sizeof official / sizeof *official; k++)
    if (official[k].fnv == h && official[k].len == n) return (int)official[k].kind;
  return -1;
}

/* ---------------------------------------------------------------- checked messages */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL };
static const char *const role_names[] = {"system", "user", "assistant", "tool"};

typedef struct call_view {
  const char *name;
  const json_t *args; /* object, or string (Qwen3 prints it verbatim); borrowed or owned */
  json_t *args_owned; /* parsed from a string (Qwen3.5), freed with the view */
} call_view;

typedef struct msg_view {
  int role;
  char *content; /* normalised content (owned) */
  size_t content_len;
  const char *reasoning; /* NULL when missing or null */
  call_view *calls;
  int n_calls;
} msg_view;

static void views_free(msg_view *v, int n) {
  if (!v) return;
  for (int i = 0; i < n; i++) {
    free(v[i].content);
    for (int j = 0; j < v[i].n_calls; j++) json_decref(v[i].calls[j].args_owned);
    free(v[i].calls);
  }
  free(v);
}

/* Content as one string: a string, null/missing (""), or an array of text parts. */
static int content_join(const json_t *c, int idx, char **out, size_t *len, char *err,
                        size_t errlen) {
  strbuf b = {0};
  if (!c || json_is_null(c)) {
  } else if (json_is_string(c)) {
    strbuf_append(&b, json_string_value(c), json_string_length(c));
  } else if (json_is_array(c)) {
    for (size_t i = 0; i < json_array_size(c); i++) {
      const json_t *part = json_array_get(c, i);
      const json_t *ty = json_object_get(part, "type");
      const json_t *tx = json_object_get(part, "text");
      if (!json_is_object(part) || !json_is_string(tx) ||
          (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "text")))) {
        free(b.data);
        return errf(err, errlen,
                    "messages[%d].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts "
                    "are supported",
                    idx, i);
      }
      strbuf_append(&b, json_string_value(tx), json_string_length(tx));
    }
  } else {
    return errf(err, errlen, "messages[%d].content must be a string or an array of text parts",
                idx);
  }
  if (!b.data) strbuf_append(&b, "", 0);
  if (b.oom) {
    free(b.data);
    return errf(err, errlen, "out of memory");
  }
  *out = b.data;
  *len = b.len;
  return 0;
}

static int check_request(chat_template_kind kind, const json_t *request, msg_view **out_views,
                         int *out_n, char *err, size_t errlen) {
  if (!json_is_object(request)) return errf(err, errlen, "the chat request must be an object");
  const json_t *msgs = json_object_get(request, "messages");
  if (!json_is_array(msgs) || json_array_size(msgs) == 0)
    return errf(err, errlen, "messages must be a non-empty array");
  const json_t *tools = json_object_get(request, "tools");
  if (tools && !json_is_null(tools)) {
    if (!json_is_array(tools)) return errf(err, errlen, "tools must be an array");
    for (size_t i = 0; i < json_array_size(tools); i++)
      if (!json_is_object(json_array_get(tools, i)))
        return errf(err, errlen, "tools[%zu] must be an object", i);
  }
  const json_t *kw = json_object_get(request, "chat_template_kwargs");
  if (kw && !json_is_null(kw)) {
    if (!json_is_object(kw)) return errf(err, errlen, "chat_template_kwargs must be an object");
    const json_t *et = json_object_get(kw, "enable_thinking");
    if (et && !json_is_boolean(et) && !json_is_null(et))
      return errf(err, errlen, "chat_template_kwargs.enable_thinking must be a boolean");
    const json_t *ag = json_object_get(kw, "add_generation_prompt");
    if (ag && !json_is_boolean(ag) && !json_is_null(ag))
      return errf(err, errlen, "chat_template_kwargs.add_generation_prompt must be a boolean");
  }
  const json_t *ag = json_object_get(request, "add_generation_prompt");
  if (ag && !json_is_boolean(ag) && !json_is_null(ag))
    return errf(err, errlen, "add_generation_prompt must be a boolean");

  int n = (int)json_array_size(msgs);
  msg_view *v = calloc((size_t)n, sizeof *v);
  if (!v) return errf(err, errlen, "out of memory");
  for (int i = 0; i < n; i++) {
    const json_t *m = json_array_get(msgs, (size_t)i);
    if (!json_is_object(m)) goto fail_fmt_obj;
    const json_t *role = json_object_get(m, "role");
    if (!json_is_string(role)) {
      errf(err, errlen, "messages[%d].role must be a string", i);
      goto fail;
    }
    const char *r = json_string_value(role);
    v[i].role = -1;
    for (int k = 0; k < 4; k++)
      if (!strcmp(r, role_names[k])) v[i].role = k;
    if (!strcmp(r, "developer")) v[i].role = ROLE_SYSTEM;
    if (v[i].role < 0) {
      errf(err, errlen, "messages[%d]: unknown role '%.40s'", i, r);
      goto fail;
    }
    if (content_join(json_object_get(m, "content"), i, &v[i].content, &v[i].content_len, err,
                     errlen))
      goto fail;
    const json_t *rc = json_object_get(m, "reasoning_content");
    if (rc && !json_is_null(rc)) {
      if (!json_is_string(rc)) {
        errf(err, errlen, "messages[%d].reasoning_content must be a string", i);
        goto fail;
      }
      if (v[i].role == ROLE_ASSISTANT) v[i].reasoning = json_string_value(rc);
    }
    const json_t *tcs = json_object_get(m, "tool_calls");
    if (tcs && !json_is_null(tcs) && v[i].role == ROLE_ASSISTANT) {
      if (!json_is_array(tcs)) {
        errf(err, errlen, "messages[%d].tool_calls must be an array", i);
        goto fail;
      }
      size_t nc = json_array_size(tcs);
      v[i].calls = calloc(nc ? nc : 1, sizeof *v[i].calls);
      if (!v[i].calls) {
        errf(err, errlen, "out of memory");
        goto fail;
      }
      for (size_t j = 0; j < nc; j++) {
        const json_t *tc = json_array_get(tcs, j);
        const json_t *fn = json_is_object(tc) ? json_object_get(tc, "function") : NULL;
        if (!fn) fn = tc;
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_object(fn) || !json_is_string(name)) {
          errf(err, errlen, "messages[%d].tool_calls[%zu].function.name must be a string", i, j);
          goto fail;
        }
        call_view *c = &v[i].calls[v[i].n_calls++];
        c->name = json_string_value(name);
        const json_t *args = json_object_get(fn, "arguments");
        if (!args || json_is_null(args)) {
          c->args = c->args_owned = json_object();
          if (!c->args_owned) {
            errf(err, errlen, "out of memory");
            goto fail;
          }
        } else if (json_is_object(args)) {
          c->args = args;
        } else if (json_is_string(args)) {
          if (kind == CHAT_TEMPLATE_QWEN3) {
            c->args = args;
          } else {
            c->args_owned = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
            if (!json_is_object(c->args_owned)) {
              errf(err, errlen,
                   "messages[%d].tool_calls[%zu].function.arguments is not a JSON object", i, j);
              goto fail;
            }
            c->args = c->args_owned;
          }
        } else {
          errf(err, errlen,
               "messages[%d].tool_calls[%zu].function.arguments must be an object or a JSON "
               "string",
               i, j);
          goto fail;
        }
      }
    }
    if (v[i].role == ROLE_TOOL) {
      int k = i - 1;
      while (k >= 0 && v[k].role == ROLE_TOOL) k--;
      if (k < 0 || v[k].role != ROLE_ASSISTANT || v[k].n_calls == 0) {
        errf(err, errlen, "messages[%d]: a tool message must follow an assistant tool call", i);
        goto fail;
      }
    }
    if (kind != CHAT_TEMPLATE_QWEN3 && v[i].role == ROLE_SYSTEM && i != 0) {
      errf(err, errlen, "messages[%d]: a system message must be the first message", i);
      goto fail;
    }
  }
  *out_views = v;
  *out_n = n;
  return 0;
fail_fmt_obj:
  errf(err, errlen, "messages must be an array of objects");
fail:
  views_free(v, n);
  return -1;
}

/* The start of an assistant turn: the header, with a <think> block of reasoning when `think`,
 * then the content (the templates' two forms). */
static void put_assistant(strbuf *b, int think, span reasoning, span content) {
  strbuf_puts(b, "<|im_start|>assistant\n");
  if (think) {
    strbuf_puts(b, "<think>\n");
    strbuf_append(b, reasoning.p, reasoning.n);
    strbuf_puts(b, "\n</think>\n\n");
  }
  strbuf_append(b, content.p, content.n);
}

/* An assistant message's reasoning and content, as both templates split them: the message's
 * reasoning field when it has one (content = the whole text); else, when the text holds a
 * </think>, reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 * and content = text.split('</think>')[-1].lstrip('\n'); else no reasoning. */
static void split_think(const msg_view *mi, span c, span *reasoning, span *content) {
  *content = c;
  *reasoning = (span){"", 0};
  if (mi->reasoning) {
    *reasoning = span_of(mi->reasoning);
  } else if (span_find(c, "</think>")) {
    span head = {c.p, (size_t)(span_find(c, "</think>") - c.p)};
    head = rstrip_nl(head);
    const char *open = span_rfind(head, "<think>");
    if (open) head = (span){open + 7, (size_t)(head.p + head.n - (open + 7))};
    *reasoning = lstrip_nl(head);
    const char *last = span_rfind(c, "</think>") + 8;
    *content = lstrip_nl((span){last, (size_t)(c.p + c.n - last)});
  }
}

/* Tool message i (content c), as both templates render it: consecutive tool messages share
 * one user turn, each in <tool_response> tags; offs[i] is the turn's start (*group_start,
 * set by the first of the run). */
static void render_tool_response(const msg_view *m, int n, int i, span c, strbuf *b,
                                 size_t *group_start, size_t *offs) {
  if (i == 0 || m[i - 1].role != ROLE_TOOL) {
    *group_start = b->len;
    strbuf_puts(b, "<|im_start|>user");
  }
  offs[i] = *group_start;
  strbuf_puts(b, "\n<tool_response>\n");
  strbuf_append(b, c.p, c.n);
  strbuf_puts(b, "\n</tool_response>");
  if (i == n - 1 || m[i + 1].role != ROLE_TOOL) strbuf_puts(b, "<|im_end|>\n");
}

/* ---------------------------------------------------------------- Qwen3 / Qwen3-Next */

static void render_qwen3(const msg_view *m, int n, const json_t *tools, int add_gen,
                         int thinking_false, strbuf *b, size_t *offs) {
  int has_tools = json_array_size(tools) > 0;
  span c0 = {m[0].content, m[0].content_len};
  /* {%- if tools %} ... {%- else %} system turn {%- endif %} */
  if (has_tools) {
    strbuf_puts(b, "<|im_start|>system\n");
    if (m[0].role == ROLE_SYSTEM) {
      strbuf_append(b, c0.p, c0.n);
      strbuf_puts(b, "\n\n");
    }
    strbuf_puts(b,
                "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                "<tools>");
    for (size_t i = 0; i < json_array_size(tools); i++) {
      strbuf_puts(b, "\n");
      py_json(b, json_array_get(tools, i));
    }
    strbuf_puts(b,
                "\n</tools>\n\nFor each function call, return a json object with function name "
                "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                "</tool_call><|im_end|>\n");
  } else if (m[0].role == ROLE_SYSTEM) {
    strbuf_puts(b, "<|im_start|>system\n");
    strbuf_append(b, c0.p, c0.n);
    strbuf_puts(b, "<|im_end|>\n");
  }
  if (m[0].role == ROLE_SYSTEM) offs[0] = 0;

  /* last_query_index: the last user message that is not a wrapped tool response */
  int last_query = n - 1;
  for (int i = n - 1; i >= 0; i--) {
    span c = {m[i].content, m[i].content_len};
    if (m[i].role == ROLE_USER &&
        !(span_starts(c, "<tool_response>") && span_ends(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }

  size_t group_start = 0;
  for (int i = 0; i < n; i++) {
    span c = {m[i].content, m[i].content_len};
    if (m[i].role == ROLE_USER || (m[i].role == ROLE_SYSTEM && i != 0)) {
      offs[i] = b->len;
      strbuf_puts(b, "<|im_start|>");
      strbuf_puts(b, role_names[m[i].role]);
      strbuf_puts(b, "\n");
      strbuf_append(b, c.p, c.n);
      strbuf_puts(b, "<|im_end|>\n");
    } else if (m[i].role == ROLE_ASSISTANT) {
      offs[i] = b->len;
      span content, reasoning;
      split_think(&m[i], c, &reasoning, &content);
      if (i > last_query && (i == n - 1 || reasoning.n))
        put_assistant(b, 1, rstrip_nl(lstrip_nl(reasoning)), lstrip_nl(content));
      else
        put_assistant(b, 0, reasoning, content);
      for (int j = 0; j < m[i].n_calls; j++) {
        if ((j == 0 && content.n) || j > 0) strbuf_puts(b, "\n");
        strbuf_puts(b, "<tool_call>\n{\"name\": \"");
        strbuf_puts(b, m[i].calls[j].name);
        strbuf_puts(b, "\", \"arguments\": ");
        const json_t *a = m[i].calls[j].args;
        if (json_is_string(a))
          strbuf_append(b, json_string_value(a), json_string_length(a));
        else
          py_json(b, a);
        strbuf_puts(b, "}\n</tool_call>");
      }
      strbuf_puts(b, "<|im_end|>\n");
    } else if (m[i].role == ROLE_TOOL) {
      render_tool_response(m, n, i, c, b, &group_start, offs);
    }
  }
  if (add_gen) {
    strbuf_puts(b, "<|im_start|>assistant\n");
    if (thinking_false) strbuf_puts(b, "<think>\n\n</think>\n\n");
  }
}

/* ---------------------------------------------------------------- Qwen3.5 / 3.6 */

static const char qwen35_tools_footer[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

/* qwen36: honour preserve_thinking, print non-string parameter values with tojson. */
static int render_qwen35(const msg_view *m, int n, const json_t *tools, int add_gen,
                         int thinking_false, int qwen36, int preserve_thinking, strbuf *b,
                         size_t *offs, char *err, size_t errlen) {
  span sys = py_trim((span){m[0].content, m[0].content_len});
  if (json_array_size(tools) > 0) {
    strbuf_puts(b,
                "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n"
                "<tools>");
    for (size_t i = 0; i < json_array_size(tools); i++) {
      strbuf_puts(b, "\n");
      py_json(b, json_array_get(tools, i));
    }
    strbuf_puts(b, qwen35_tools_footer);
    if (m[0].role == ROLE_SYSTEM && sys.n) {
      strbuf_puts(b, "\n\n");
      strbuf_append(b, sys.p, sys.n);
    }
    strbuf_puts(b, "<|im_end|>\n");
  } else if (m[0].role == ROLE_SYSTEM) {
    strbuf_puts(b, "<|im_start|>system\n");
    strbuf_append(b, sys.p, sys.n);
    strbuf_puts(b, "<|im_end|>\n");
  }
  if (m[0].role == ROLE_SYSTEM) offs[0] = 0;

  int last_query = -1;
  for (int i = n - 1; i >= 0; i--) {
    span c = py_trim((span){m[i].content, m[i].content_len});
    if (m[i].role == ROLE_USER &&
        !(span_starts(c, "<tool_response>") && span_ends(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  if (last_query < 0)
    return errf(err, errlen, "no user query found in messages (Qwen3.5 needs one)");

  size_t group_start = 0;
  for (int i = 0; i < n; i++) {
    span c = py_trim((span){m[i].content, m[i].content_len});
    if (m[i].role == ROLE_SYSTEM) continue; /* only at index 0 (checked) */
    if (m[i].role == ROLE_USER) {
      offs[i] = b->len;
      strbuf_puts(b, "<|im_start|>user\n");
      strbuf_append(b, c.p, c.n);
      strbuf_puts(b, "<|im_end|>\n");
    } else if (m[i].role == ROLE_ASSISTANT) {
      offs[i] = b->len;
      span content, reasoning;
      split_think(&m[i], c, &reasoning, &content);
      reasoning = py_trim(reasoning);
      put_assistant(b, (qwen36 && preserve_thinking) || i > last_query, reasoning, content);
      for (int j = 0; j < m[i].n_calls; j++) {
        const call_view *cv = &m[i].calls[j];
        if (j == 0)
          strbuf_puts(
              b, py_trim(content).n ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        else
          strbuf_puts(b, "\n<tool_call>\n<function=");
        strbuf_puts(b, cv->name);
        strbuf_puts(b, ">\n");
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)cv->args, k, val) {
          strbuf_puts(b, "<parameter=");
          strbuf_puts(b, k);
          strbuf_puts(b, ">\n");
          if (qwen36) {
            if (json_is_string(val))
              py_str(b, val);
            else
              py_json(b, val);
          } else if (json_is_object(val) || json_is_array(val)) {
            py_json(b, val);
          } else {
            py_str(b, val);
          }
          strbuf_puts(b, "\n</parameter>\n");
        }
        strbuf_puts(b, "</function>\n</tool_call>");
      }
      strbuf_puts(b, "<|im_end|>\n");
    } else { /* tool: a preceding assistant call is guaranteed, so i > 0 */
      render_tool_response(m, n, i, c, b, &group_start, offs);
    }
  }
  if (add_gen) {
    strbuf_puts(b, "<|im_start|>assistant\n");
    strbuf_puts(b, thinking_false ? "<think>\n\n</think>\n\n" : "<think>\n");
  }
  return 0;
}

/* ---------------------------------------------------------------- entry points */

int chat_template_render(chat_template_kind kind, const json_t *request, int add_generation_prompt,
                         chat_render *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  msg_view *v = NULL;
  int n = 0;
  if (check_request(kind, request, &v, &n, err, errlen)) return -1;
  const json_t *tools = json_object_get(request, "tools");
  if (!json_is_array(tools)) tools = NULL;
  const json_t *kw = json_object_get(request, "chat_template_kwargs");
  const json_t *ag = json_object_get(request, "add_generation_prompt");
  if (json_is_boolean(ag)) add_generation_prompt = json_is_true(ag);
  ag = json_object_get(kw, "add_generation_prompt");
  if (json_is_boolean(ag)) add_generation_prompt = json_is_true(ag);
  int thinking_false = json_is_false(json_object_get(kw, "enable_thinking"));
  int preserve_thinking = json_is_true(json_object_get(kw, "preserve_thinking"));

  size_t *offs = calloc((size_t)n, sizeof *offs);
  if (!offs) {
    views_free(v, n);
    return errf(err, errlen, "out of memory");
  }
  strbuf b = {0};
  int rc = 0;
  if (kind == CHAT_TEMPLATE_QWEN3)
    render_qwen3(v, n, tools, add_generation_prompt, thinking_false, &b, offs);
  else
    rc = render_qwen35(v, n, tools, add_generation_prompt, thinking_false,
                       kind == CHAT_TEMPLATE_QWEN36, preserve_thinking, &b, offs, err, errlen);
  views_free(v, n);
  if (!rc && b.oom) rc = errf(err, errlen, "out of memory");
  if (!rc && !b.data) strbuf_append(&b, "", 0);
  if (!rc && b.oom) rc = errf(err, errlen, "out of memory");
  if (rc) {
    free(b.data);
    free(offs);
    return -1;
  }
  out->text = b.data;
  out->len = b.len;
  out->msg_offsets = offs;
  out->n_msgs = n;
  out->thinking_open = kind != CHAT_TEMPLATE_QWEN3 && add_generation_prompt && !thinking_false;
  return 0;
}

void chat_render_free(chat_render *r) {
  if (!r) return;
  free(r->text);
  free(r->msg_offsets);
  memset(r, 0, sizeof *r);
}
