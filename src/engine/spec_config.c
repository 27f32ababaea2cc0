#include "engine/spec_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

/* An integer member in [lo, hi] (absent: *out untouched, returns 0). */
static int spec_int(json_t *o, const char *key, int lo, int hi, int *out, int *given, char *err,
                    size_t errlen) {
  json_t *v = json_object_get(o, key);
  *given = v != NULL;
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return errf(err, errlen, "--speculative-config: %s must be an integer in [%d, %d]", key, lo,
                hi);
  *out = (int)json_integer_value(v);
  return 0;
}

int spec_config_parse(const char *json, spec_config *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  json_error_t je;
  json_t *o = json_loads(json, JSON_DECODE_ANY, &je);
  if (!o) return errf(err, errlen, "--speculative-config: not JSON (%s)", je.text);
  if (json_is_null(o)) {
    json_decref(o);
    return 0;
  }
  int rc = -1;
  if (!json_is_object(o)) {
    errf(err, errlen, "--speculative-config: expected a JSON object");
    goto done;
  }
  if (json_object_size(o) == 0) {
    rc = 0;
    goto done;
  }
  static const char *const known[] = {"method", "num_speculative_tokens", "prompt_lookup_min",
                                      "prompt_lookup_max", "disable_by_batch_size"};
  const char *key;
  json_t *val;
  json_object_foreach(o, key, val) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) ok |= !strcmp(key, known[i]);
    if (!ok) {
      errf(err, errlen,
           "--speculative-config: key \"%s\" is not supported (method, "
           "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, disable_by_batch_size)",
           key);
      goto done;
    }
  }
  json_t *m = json_object_get(o, "method");
  if (!m || !json_is_string(m)) {
    errf(err, errlen, "--speculative-config: \"method\" is required (\"ngram\" or \"mtp\")");
    goto done;
  }
  const char *ms = json_string_value(m);
  int mtp = !strcmp(ms, "mtp");
  if (!mtp && strcmp(ms, "ngram") && strcmp(ms, "[ngram]")) {
    errf(err, errlen, "--speculative-config: method \"%s\" is not supported (\"ngram\" or \"mtp\")",
         ms);
    goto done;
  }
  int gk, gmin, gmax, gd;
  out->k = 0;
  out->lookup_min = out->lookup_max = out->disable_by_batch_size = 0;
  if (spec_int(o, "num_speculative_tokens", 1, SPEC_MAX_TOKENS, &out->k, &gk, err, errlen) ||
      spec_int(o, "disable_by_batch_size", 1, 1 << 20, &out->disable_by_batch_size, &gd, err,
               errlen) ||
      spec_int(o, "prompt_lookup_min", 1, 1 << 20, &out->lookup_min, &gmin, err, errlen) ||
      spec_int(o, "prompt_lookup_max", 1, 1 << 20, &out->lookup_max, &gmax, err, errlen))
    goto done;
  if (!gk) {
    errf(err, errlen, "--speculative-config: num_speculative_tokens is required for \"%s\"",
         mtp ? "mtp" : "ngram");
    goto done;
  }
  if (mtp) {
    if (gmin || gmax) {
      errf(err, errlen,
           "--speculative-config: prompt_lookup_min / prompt_lookup_max are for \"ngram\", not "
           "\"mtp\"");
      goto done;
    }
    out->method = SPEC_METHOD_MTP;
    rc = 0;
    goto done;
  }
  if (!gmin && !gmax) out->lookup_min = out->lookup_max = 5;
  if (!gmin && gmax) out->lookup_min = out->lookup_max;
  if (gmin && !gmax) out->lookup_max = out->lookup_min;
  if (out->lookup_min > out->lookup_max) {
    errf(err, errlen, "--speculative-config: prompt_lookup_min (%d) > prompt_lookup_max (%d)",
         out->lookup_min, out->lookup_max);
    goto done;
  }
  out->method = SPEC_METHOD_NGRAM;
  rc = 0;
done:
  if (rc) memset(out, 0, sizeof *out);
  json_decref(o);
  return rc;
}
