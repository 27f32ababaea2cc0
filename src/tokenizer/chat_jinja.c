/* chat_jinja — see chat_jinja.h. Loading (template sources, special tokens, the special-token
 * texts where a prompt may be cut), then rendering (context, continue_final_message, message
 * offsets, thinking_open). */
#include "tokenizer/chat_jinja.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_read.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "tokenizer/jinja.h"

typedef struct chat_jinja_named {
  char *name;
  jinja_template *t;
} chat_jinja_named;

struct chat_jinja {
  const jinja_template *tmpl; /* the template: main, or a named one; NULL: the built-in C one */
  jinja_template *main;       /* the single template (owned), or NULL */
  chat_jinja_named *named;
  int n_named;
  int tool_use;     /* index of the named "tool_use" template, or -1 */
  json_t *specials; /* {bos_token: "<s>", ...} from tokenizer_config.json (owned) */
  char **markers;   /* texts of the special tokens: where a rendered prompt may be cut */
  int n_markers;
  chat_template_kind builtin;
  int fast; /* the C template that renders main byte for byte (chat_template_official), or -1 */
  char origin[600];
};

/* ---------------------------------------------------------------- loading */

/* A literal --chat-template value, with the escapes a shell leaves in it decoded (vLLM decodes
 * it with Python's unicode_escape; the common ones here). */
static char *chat_jinja_literal(const char *s) {
  char *out = malloc(strlen(s) + 1), *o = out;
  if (!out) return NULL;
  for (; *s; s++) {
    if (*s == '\\' && s[1]) {
      const char *m = strchr("n\nt\tr\r\\\\\"\"''", s[1]);
      if (m && (m - "n\nt\tr\r\\\\\"\"''") % 2 == 0) {
        *o++ = m[1];
        s++;
        continue;
      }
    }
    *o++ = *s;
  }
  *o = 0;
  return out;
}

static int chat_jinja_compile(const char *src, const char *origin, jinja_template **t, char *err,
                              size_t errlen) {
  char e[400];
  *t = jinja_parse(src, e, sizeof e);
  if (!*t) return errf(err, errlen, "%s: %s", origin, e);
  return 0;
}

/* A special token's text: a string, or an AddedToken {"content": ...}. */
static const char *chat_jinja_token_text(const json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_string_value(v);
}

static int chat_jinja_config(chat_jinja *cj, const json_t *cfg, const char *path, char *err,
                             size_t errlen) {
  cj->specials = json_object();
  if (!cj->specials) return errf(err, errlen, "out of memory");
  static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                      "sep_token", "cls_token", "mask_token"};
  for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
    const char *s = chat_jinja_token_text(json_object_get(cfg, names[k]));
    if (s && *s) json_object_set_new(cj->specials, names[k], json_string(s));
  }
  const json_t *extra = json_object_get(cfg, "additional_special_tokens");
  if (json_is_array(extra) && json_array_size(extra)) {
    json_t *a = json_array();
    size_t i;
    const json_t *x;
    json_array_foreach(extra, i, x) {
      const char *s = chat_jinja_token_text(x);
      if (s) json_array_append_new(a, json_string(s));
    }
    json_object_set_new(cj->specials, "additional_special_tokens", a);
  }
  const json_t *added = json_object_get(cfg, "added_tokens_decoder");
  if (json_is_object(added)) {
    cj->markers = calloc(json_object_size(added) + 1, sizeof *cj->markers);
    if (!cj->markers) return errf(err, errlen, "out of memory");
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)added, k, x) {
      const char *s = chat_jinja_token_text(x);
      if (s && *s && json_is_true(json_object_get(x, "special")))
        if (!(cj->markers[cj->n_markers++] = strdup(s))) return errf(err, errlen, "out of memory");
    }
  }
  const json_t *ct = json_object_get(cfg, "chat_template");
  if (cj->tmpl || !ct || json_is_null(ct)) return 0;
  snprintf(cj->origin, sizeof cj->origin, "%.500s", path);
  if (json_is_string(ct)) {
    if (chat_jinja_compile(json_string_value(ct), path, &cj->main, err, errlen)) return -1;
    cj->tmpl = cj->main;
    cj->fast = chat_template_official(json_string_value(ct));
    return 0;
  }
  if (!json_is_array(ct))
    return errf(err, errlen, "%s: chat_template must be a string or a list", path);
  cj->named = calloc(json_array_size(ct) + 1, sizeof *cj->named);
  if (!cj->named) return errf(err, errlen, "out of memory");
  size_t i;
  const json_t *x;
  int def = -1;
  json_array_foreach(ct, i, x) {
    const char *name = json_string_value(json_object_get(x, "name"));
    const char *src = json_string_value(json_object_get(x, "template"));
    if (!name || !src)
      return errf(err, errlen, "%s: chat_template[%zu] needs a string name and template", path, i);
    char where[700];
    snprintf(where, sizeof where, "%.500s (chat_template '%.100s')", path, name);
    chat_jinja_named *n = &cj->named[cj->n_named];
    if (!(n->name = strdup(name))) return errf(err, errlen, "out of memory");
    cj->n_named++;
    if (chat_jinja_compile(src, where, &n->t, err, errlen)) return -1;
    if (!strcmp(name, "default")) def = cj->n_named - 1;
    if (!strcmp(name, "tool_use")) cj->tool_use = cj->n_named - 1;
  }
  /* the default renders; without one, the first (transformers would refuse every request) */
  if (cj->n_named) cj->tmpl = cj->named[def >= 0 ? def : 0].t;
  return 0;
}

int chat_jinja_load(chat_jinja **out, const char *model_dir, const char *template_arg,
                    chat_template_kind builtin, char *err, size_t errlen) {
  *out = NULL;
  chat_jinja *cj = calloc(1, sizeof *cj);
  if (!cj) return errf(err, errlen, "out of memory");
  cj->builtin = builtin;
  cj->tool_use = -1;
  cj->fast = -1;
  char path[4096];
  int rc = 0;
  if (template_arg) {
    char *src = file_read(template_arg, NULL);
    int e = errno;
    snprintf(cj->origin, sizeof cj->origin, "%.500s", template_arg);
    if (!src && !strpbrk(template_arg, "{}\n")) {
      rc = errf(err, errlen, "--chat-template %s: cannot read it (%s)", template_arg, strerror(e));
    } else {
      if (!src) {
        src = chat_jinja_literal(template_arg);
        snprintf(cj->origin, sizeof cj->origin, "--chat-template (the text given)");
      }
      rc = src ? chat_jinja_compile(src, cj->origin, &cj->main, err, errlen)
               : errf(err, errlen, "out of memory");
      cj->tmpl = cj->main;
      cj->fast = src ? chat_template_official(src) : -1;
      free(src);
    }
  } else if (model_dir) {
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    char *src = file_read(path, NULL);
    if (src) {
      snprintf(cj->origin, sizeof cj->origin, "%.500s", path);
      rc = chat_jinja_compile(src, path, &cj->main, err, errlen);
      cj->tmpl = cj->main;
      cj->fast = src ? chat_template_official(src) : -1;
      free(src);
    }
  }
  if (!rc && model_dir) {
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (cfg) rc = chat_jinja_config(cj, cfg, path, err, errlen);
    json_decref(cfg);
  }
  if (!rc && !cj->specials && !(cj->specials = json_object()))
    rc = errf(err, errlen, "out of memory");
  if (rc) {
    chat_jinja_free(cj);
    return -1;
  }
  if (!cj->tmpl)
    snprintf(cj->origin, sizeof cj->origin, "built-in %s",
             builtin == CHAT_TEMPLATE_QWEN3    ? "Qwen3"
             : builtin == CHAT_TEMPLATE_QWEN36 ? "Qwen3.6"
                                               : "Qwen3.5");
  *out = cj;
  return 0;
}

void chat_jinja_free(chat_jinja *cj) {
  if (!cj) return;
  jinja_template_free(cj->main);
  for (int i = 0; i < cj->n_named; i++) {
    free(cj->named[i].name);
    jinja_template_free(cj->named[i].t);
  }
  free(cj->named);
  for (int i = 0; i < cj->n_markers; i++) free(cj->markers[i]);
  free(cj->markers);
  json_decref(cj->specials);
  free(cj);
}

const char *chat_jinja_origin(const chat_jinja *cj) { return cj ? cj->origin : "built-in"; }

/* ---------------------------------------------------------------- rendering */

/* The messages as vLLM hands them to the template (its string content format): content null
 * as "", text parts joined (as openai_request joins them); tool-call arguments that are a JSON
 * string parsed, null or "" as {}. Returns a new array, or NULL with err. */
static json_t *chat_jinja_messages(const json_t *msgs, char *err, size_t errlen) {
  json_t *out = json_deep_copy(msgs);
  if (!out) {
    errf(err, errlen, "out of memory");
    return NULL;
  }
  size_t i, j;
  json_t *m, *tc;
  json_array_foreach(out, i, m) {
    json_t *c = json_object_get(m, "content");
    if (!c || json_is_null(c)) json_object_set_new(m, "content", json_string(""));
    if (json_is_array(c)) {
      strbuf b = {0};
      size_t k;
      json_t *part;
      json_array_foreach(c, k, part) {
        const json_t *tx = json_object_get(part, "text");
        strbuf_append(&b, json_string_value(tx) ? json_string_value(tx) : "",
                      json_string_length(tx));
      }
      json_object_set_new(m, "content", json_stringn(b.data ? b.data : "", b.len));
      strbuf_free(&b);
    }
    json_t *calls = json_object_get(m, "tool_calls");
    if (!json_is_array(calls) || !json_is_string(json_object_get(m, "role")) ||
        strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
      continue;
    json_array_foreach(calls, j, tc) {
      json_t *fn = json_object_get(tc, "function");
      if (!json_is_object(fn)) continue;
      json_t *a = json_object_get(fn, "arguments");
      json_t *parsed = NULL;
      if (!a || json_is_null(a) || (json_is_string(a) && !json_string_length(a)) ||
          json_is_false(a))
        parsed = json_object();
      else if (json_is_string(a) &&
               !(parsed = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL))) {
        errf(err, errlen, "messages[%zu].tool_calls[%zu].function.arguments is not valid JSON", i,
             j);
        json_decref(out);
        return NULL;
      }
      if (parsed) json_object_set_new(fn, "arguments", parsed);
    }
  }
  return out;
}

/* Cuts text after the final message's content, as transformers does for
 * continue_final_message. Returns 0, or -1 with err. */
static int chat_jinja_continue(const json_t *msgs, char *text, size_t *len, char *err,
                               size_t errlen) {
  const json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  const char *c = json_string_value(json_object_get(last, "content"));
  if (!c)
    return errf(err, errlen,
                "continue_final_message is set but the final message has no text to continue");
  static const char ws[] = " \t\n\r\f\v";
  const char *ls = c + strspn(c, ws); /* content.lstrip() */
  size_t ln = strlen(ls), sn = ln;
  while (sn && strchr(ws, ls[sn - 1])) sn--; /* content.strip() is ls[0..sn) */
  size_t loc = *len + 1;
  for (size_t p = *len + 1 > sn ? *len + 1 - sn : 0; p-- > 0;)
    if (!memcmp(text + p, ls, sn)) {
      loc = p;
      break;
    }
  if (loc > *len)
    return errf(err, errlen,
                "continue_final_message is set but the final message does not appear in the chat "
                "after applying the chat template");
  size_t cut = loc + (loc + ln <= *len && !memcmp(text + loc, ls, ln) ? ln : sn);
  text[cut] = 0;
  *len = cut;
  return 0;
}

/* The last position in [lo, hi] where a special token starts in text, or (size_t)-1. */
static size_t chat_jinja_snap(const chat_jinja *cj, const char *text, size_t len, size_t lo,
                              size_t hi) {
  for (size_t p = hi + 1; p-- > lo;)
    for (int k = 0; k < cj->n_markers; k++) {
      size_t n = strlen(cj->markers[k]);
      if (cj->markers[k][0] == text[p] && p + n <= len && !memcmp(text + p, cj->markers[k], n))
        return p;
    }
  return (size_t)-1;
}

/* The messages of a probe render: how 0, messages[0..i); how 1, all of them with one byte
 * appended to message i's content (the first difference from the full render then lies in
 * message i's turn). Returns a new array, or NULL on out of memory. */
static json_t *chat_jinja_probe(const json_t *msgs, int i, int how) {
  int n = how ? (int)json_array_size(msgs) : i;
  json_t *a = json_array();
  for (int k = 0; a && k < n; k++) {
    json_t *m = json_array_get(msgs, (size_t)k);
    const json_t *c = json_object_get(m, "content");
    if (!how || k != i || !json_is_string(c)) {
      json_array_append(a, m);
      continue;
    }
    size_t len = json_string_length(c);
    char *s = malloc(len + 1);
    json_t *mc = json_copy(m);
    if (s && mc) {
      memcpy(s, json_string_value(c), len);
      s[len] = '\x01';
      json_object_set_new(mc, "content", json_stringn(s, len + 1));
    }
    free(s);
    json_array_append_new(a, mc);
  }
  return a;
}

/* msg_offsets (see chat_jinja.h): where a render of the messages before i (with
 * add_generation_prompt false) stops agreeing with the full render, when a special token starts
 * there; else (a template that renders the last assistant turn otherwise than a past one, or
 * that cannot render the prefix) the last special token before the first difference of a
 * render with message i's content changed. */
static int chat_jinja_offsets(const chat_jinja *cj, const jinja_template *t, const json_t *ctx,
                              const jinja_limits *lim, chat_render *out, char *err, size_t errlen) {
  const json_t *msgs = json_object_get(ctx, "messages");
  int n = (int)json_array_size(msgs);
  out->n_msgs = n;
  out->msg_offsets = calloc((size_t)n + 1, sizeof *out->msg_offsets);
  json_t *pctx = json_copy((json_t *)ctx);
  if (!out->msg_offsets || !pctx) {
    json_decref(pctx);
    return errf(err, errlen, "out of memory");
  }
  int from = n - CHAT_JINJA_MAX_BOUNDARIES > 1 ? n - CHAT_JINJA_MAX_BOUNDARIES : 1;
  for (int i = 1; i < n; i++) {
    size_t prev = out->msg_offsets[i - 1], p = (size_t)-1;
    out->msg_offsets[i] = prev;
    if (i < from || !cj || !cj->n_markers) continue;
    for (int how = 0; how < 2 && p == (size_t)-1; how++) {
      json_t *probe = chat_jinja_probe(msgs, i, how);
      if (!probe || json_object_set_new(pctx, "messages", probe)) continue;
      json_object_set(pctx, "add_generation_prompt",
                      how ? json_object_get(ctx, "add_generation_prompt") : json_false());
      char *ptext = NULL, e[8];
      size_t plen = 0;
      if (jinja_template_render(t, pctx, lim, &ptext, &plen, e, sizeof e)) continue;
      size_t l = 0;
      while (l < plen && l < out->len && ptext[l] == out->text[l]) l++;
      free(ptext);
      /* the prefix must stop right at a special token of the full text; a probe with a changed
       * message differs at the byte after that message's content (at its <|im_end|>, say),
       * whose turn starts at the special token before */
      if (l < out->len && l > prev + (size_t)how)
        p = how ? chat_jinja_snap(cj, out->text, out->len, prev + 1, l - 1)
                : chat_jinja_snap(cj, out->text, out->len, l, l);
    }
    if (p != (size_t)-1) out->msg_offsets[i] = p;
  }
  json_decref(pctx);
  return 0;
}

int chat_jinja_render(const chat_jinja *cj, chat_template_kind fallback, const json_t *request,
                      int add_generation_prompt, chat_render *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const json_t *kw = json_object_get(request, "chat_template_kwargs");
  if (!json_is_object(kw)) kw = NULL;
  const json_t *ag = json_object_get(request, "add_generation_prompt");
  if (json_is_boolean(ag)) add_generation_prompt = json_is_true(ag);
  ag = json_object_get(kw, "add_generation_prompt");
  if (json_is_boolean(ag)) add_generation_prompt = json_is_true(ag);
  int cont = json_is_true(json_object_get(request, "continue_final_message"));
  if (cont) add_generation_prompt = 0;
  const json_t *tools = json_object_get(request, "tools");
  if (!json_is_array(tools)) tools = NULL;

  /* the template: the request's (a name, else its text), tool_use, the model's, built-in */
  const jinja_template *t = cj ? cj->tmpl : NULL;
  jinja_template *own = NULL;
  const char *asked = json_string_value(json_object_get(request, "chat_template"));
  if (asked) {
    t = NULL;
    for (int i = 0; cj && i < cj->n_named && !t; i++)
      if (!strcmp(cj->named[i].name, asked)) t = cj->named[i].t;
    if (!t && chat_jinja_compile(asked, "chat_template", &own, err, errlen)) return -1;
    if (!t) t = own;
  } else if (cj && cj->tool_use >= 0 && tools) {
    t = cj->named[cj->tool_use].t;
  }
  const json_t *msgs = json_object_get(request, "messages");
  if (t && t == cj->main && cj->fast >= 0) { /* the official template: its C transcription */
    json_t *m = json_is_array(msgs) && json_array_size(msgs)
                    ? chat_jinja_messages(msgs, err, errlen)
                    : NULL;
    json_t *r = m ? json_copy((json_t *)request) : NULL;
    int rc = r && !json_object_set(r, "messages", m)
                 ? chat_template_render((chat_template_kind)cj->fast, r, add_generation_prompt, out,
                                        err, errlen)
                 : -1;
    json_decref(r);
    json_decref(m);
    if (!rc && cont && chat_jinja_continue(msgs, out->text, &out->len, err, errlen)) {
      chat_render_free(out);
      return -1;
    }
    if (!rc) {
      if (cont) out->thinking_open = 0;
      return 0;
    }
    /* refused (the C checks are stricter than some templates): the template decides */
    memset(out, 0, sizeof *out);
  }
  if (!t) {
    if (chat_template_render(cj ? cj->builtin : fallback, request, add_generation_prompt, out, err,
                             errlen))
      return -1;
    if (cont && chat_jinja_continue(msgs, out->text, &out->len, err, errlen)) {
      chat_render_free(out);
      return -1;
    }
    if (cont) out->thinking_open = 0;
    return 0;
  }

  int rc = -1;
  json_t *ctx = cj && cj->specials ? json_copy(cj->specials) : json_object();
  json_t *m = json_is_array(msgs) && json_array_size(msgs)
                  ? chat_jinja_messages(msgs, err, errlen)
                  : (errf(err, errlen, "messages must be a non-empty array"), NULL);
  if (!ctx || !m) {
    if (!ctx) errf(err, errlen, "out of memory");
    json_decref(m);
    goto done;
  }
  if (kw) json_object_update(ctx, (json_t *)kw);
  if (json_object_set_new(ctx, "messages", m) ||
      json_object_set_new(ctx, "tools", tools ? json_incref((json_t *)tools) : json_null()) ||
      json_object_set_new(ctx, "documents", json_null()) ||
      json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt))) {
    errf(err, errlen, "out of memory");
    goto done;
  }
  jinja_limits lim = jinja_limits_default();
  if (jinja_template_render(t, ctx, &lim, &out->text, &out->len, err, errlen)) goto done;
  if (cont && chat_jinja_continue(m, out->text, &out->len, err, errlen)) goto done;
  if (chat_jinja_offsets(cj, t, ctx, &lim, out, err, errlen)) goto done;
  const char *open = NULL;
  for (const char *p = out->text; (p = strstr(p, "<think>")); p++) open = p;
  out->thinking_open = open && !strstr(open, "</think>");
  rc = 0;
done:
  json_decref(ctx);
  jinja_template_free(own);
  if (rc) chat_render_free(out);
  return rc;
}
