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

void tool_grammar_think(json_schema *s, int think) {
  if (s && s->ntools > 0) s->tthink = think != 0;
}
