/* tool_grammar — forced tool calls as a json_schema (the header has the grammar). */
#define DS_JSON_SCHEMA_INTERNAL
#include "sampler/tool_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tg_head[] = "<tool_call>\n{\"name\": ";
static const char tg_mid[] = ", \"arguments\": ";
static const char tg_tail[] = "}\n</tool_call>";

static json_schema *tg_fail(json_schema *s, char *err, size_t errlen, const char *why) {
  snprintf(err, errlen, "%s", why);
  json_schema_free(s);
  return NULL;
}

/* The prefix literal of the tool called name: head, the name's JSON encoding, mid. */
static char *tg_prefix(const char *name, size_t *len) {
  json_t *js = json_string(name);
  char *enc = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  json_decref(js);
  if (!enc) return NULL;
  size_t n = strlen(tg_head) + strlen(enc) + strlen(tg_mid);
  char *p = malloc(n + 1);
  if (p) snprintf(p, n + 1, "%s%s%s", tg_head, enc, tg_mid);
  free(enc);
  *len = n;
  return p;
}

json_schema *tool_grammar_compile(const json_t *tools, const char *name, int max_calls, char *err,
                                  size_t errlen) {
  size_t n = json_is_array(tools) ? json_array_size(tools) : 0;
  if (n == 0) return tg_fail(NULL, err, errlen, "no tools to call");
  json_schema *s = calloc(1, sizeof *s);
  if (!s) return tg_fail(NULL, err, errlen, "out of memory");
  s->tpre = calloc(n, sizeof *s->tpre);
  s->tprelen = calloc(n, sizeof *s->tprelen);
  s->targs = calloc(n, sizeof *s->targs);
  s->tsuf = strdup(tg_tail);
  if (!s->tpre || !s->tprelen || !s->targs || !s->tsuf)
    return tg_fail(s, err, errlen, "out of memory");
  s->tmax = max_calls > 0 ? max_calls : 0;
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    if (!nm) return tg_fail(s, err, errlen, "a tool without a function name");
    if (name && strcmp(nm, name)) continue;
    const json_t *params = json_object_get(fn, "parameters");
    json_t *any = NULL;
    if (!params || json_is_null(params) || (json_is_object(params) && !json_object_size(params)))
      params = any = json_pack("{s:s}", "type", "object");
    char why[256];
    int k = s->ntools;
    s->tpre[k] = tg_prefix(nm, &s->tprelen[k]);
    s->targs[k] = params ? json_schema_compile(params, why, sizeof why) : NULL;
    json_decref(any);
    s->ntools++;
    if (!s->tpre[k] || !params) return tg_fail(s, err, errlen, "out of memory");
    if (!s->targs[k]) {
      char msg[400];
      snprintf(msg, sizeof msg, "tool '%s' parameters: %s", nm, why);
      return tg_fail(s, err, errlen, msg);
    }
  }
  if (s->ntools == 0) return tg_fail(s, err, errlen, "the named tool is not in tools");
  return s;
}

json_schema *tool_grammar_single(void) {
  json_schema *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->ntools = 1; /* a tool-call grammar, which json_mask_new_schema follows as such */
  s->tfree = 1;
  s->tmax = 1;
  return s;
}

void tool_grammar_think(json_schema *s, int think) {
  if (s && s->ntools > 0) s->tthink = think != 0;
}

/* ---- the XML form ----------------------------------------------------------------------- */

static const char tx_head[] = "<tool_call>\n<function=";
static const char tx_tail[] = "\n</tool_call>";

/* A name the XML tags can carry: not empty, no '>', '<' or newline. */
static int tx_name_ok(const char *n) { return n[0] && !strpbrk(n, "<>\n"); }

/* The type chat_parse types a parameter by: type, or a list's first non-"null" entry; NULL. */
static const char *tx_type(const json_t *prop) {
  const json_t *ty = json_object_get(prop, "type");
  if (json_is_string(ty)) return json_string_value(ty);
  size_t i;
  const json_t *e;
  json_array_foreach(ty, i, e) if (json_is_string(e) && strcmp(json_string_value(e),
                                                               "null")) return json_string_value(e);
  return NULL;
}

/* Tool nm's parameters in the XML form into s's slot k: the names and value forms, and targs[k]
 * compiled again from a copy whose type lists are narrowed to their first non-null type. */
static int tx_tool(json_schema *s, int k, const char *nm, const json_t *params, char *err,
                   size_t errlen) {
  if (!tx_name_ok(nm)) {
    snprintf(err, errlen, "tool '%s': its name cannot be written in an XML <function=...> tag", nm);
    return -1;
  }
  static const char *const tops[] = {"allOf", "anyOf", "oneOf", "$ref"};
  for (size_t i = 0; params && i < sizeof tops / sizeof tops[0]; i++)
    if (json_object_get(params, tops[i])) {
      snprintf(err, errlen,
               "tool '%s' parameters: the XML call form needs them listed under a top-level "
               "'properties' ('%s' at the top is not supported)",
               nm, tops[i]);
      return -1;
    }
  json_t *copy = params ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
  if (!copy) goto oom;
  json_t *props = json_object_get(copy, "properties");
  size_t np = json_is_object(props) ? json_object_size(props) : 0;
  s->tnp[k] = 0;
  s->tparams[k] = np ? calloc(np, sizeof *s->tparams[k]) : NULL;
  if (np && !s->tparams[k]) goto oom_copy;
  const char *pn;
  json_t *prop;
  json_object_foreach(props, pn, prop) {
    if (!tx_name_ok(pn)) {
      snprintf(err, errlen,
               "tool '%s': parameter '%s' cannot be written in an XML <parameter=...> tag", nm, pn);
      json_decref(copy);
      return -1;
    }
    const char *ty = tx_type(prop);
    if (ty && json_is_array(json_object_get(prop, "type")) &&
        json_object_set_new(prop, "type", json_string(ty)))
      goto oom_copy;
    ty = tx_type(prop);
    ss_xparam *x = &s->tparams[k][s->tnp[k]++];
    x->raw = ty && !strcmp(ty, "string");
    x->len = strlen(pn) + 2;
    x->lit = malloc(x->len + 1);
    json_t *js = json_string(pn);
    char *enc = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(js);
    x->key = enc ? malloc(strlen(enc) + 2) : NULL;
    if (x->key) snprintf(x->key, strlen(enc) + 2, "%s:", enc);
    free(enc);
    if (!x->lit || !x->key) goto oom_copy;
    snprintf(x->lit, x->len + 1, "%s>\n", pn);
  }
  char why[256];
  json_schema *a = json_schema_compile(copy, why, sizeof why);
  json_decref(copy);
  if (!a) {
    snprintf(err, errlen, "tool '%s' parameters: %s", nm, why);
    return -1;
  }
  json_schema_free(s->targs[k]);
  s->targs[k] = a;
  size_t n = strlen(tx_head) + strlen(nm) + 1;
  char *p = malloc(n + 1);
  if (!p) goto oom;
  snprintf(p, n + 1, "%s%s>", tx_head, nm);
  free(s->tpre[k]);
  s->tpre[k] = p;
  s->tprelen[k] = n;
  return 0;
oom_copy:
  json_decref(copy);
oom:
  snprintf(err, errlen, "out of memory");
  return -1;
}

int tool_grammar_xml(json_schema *s, const json_t *tools, const char *name, char *err,
                     size_t errlen) {
  if (!s || s->ntools <= 0) {
    snprintf(err, errlen, "not a tool-call grammar");
    return -1;
  }
  if (s->txml || s->tfree) return 0;
  s->tnp = calloc((size_t)s->ntools, sizeof *s->tnp);
  s->tparams = calloc((size_t)s->ntools, sizeof *s->tparams);
  char *suf = strdup(tx_tail);
  if (!s->tnp || !s->tparams || !suf) {
    free(suf);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  free(s->tsuf);
  s->tsuf = suf;
  int k = 0;
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    if (!nm || (name && strcmp(nm, name))) continue;
    if (k >= s->ntools) break;
    const json_t *params = json_object_get(fn, "parameters");
    if (json_is_null(params) || (json_is_object(params) && !json_object_size(params)))
      params = NULL;
    if (tx_tool(s, k++, nm, params, err, errlen)) return -1;
  }
  s->txml = 1;
  return 0;
}
