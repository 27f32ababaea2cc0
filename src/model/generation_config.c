/* generation_config — see generation_config.h. */
#include "model/generation_config.h"

#include "base/log.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A number field in [lo, hi] (lo_open: lo itself excluded). 1: set, 0: absent or null, -1:
 * wrong type or out of range (err). */
static int gc_num(const json_t *o, const char *key, double lo, int lo_open, double hi, double *out,
                  const char *path, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return errf(err, errlen, "%s: '%s' must be a number", path, key);
  double d = json_number_value(v);
  if (!isfinite(d) || d < lo || (lo_open && d <= lo) || d > hi)
    return errf(err, errlen, "%s: '%s' is %g, outside %s%g, %g]", path, key, d, lo_open ? "(" : "[",
                lo, hi);
  *out = d;
  return 1;
}

/* An integer field in [lo, hi]; as gc_num. */
static int gc_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                  const char *path, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v)) return errf(err, errlen, "%s: '%s' must be an integer", path, key);
  long long x = json_integer_value(v);
  if (x < lo || x > hi)
    return errf(err, errlen, "%s: '%s' is %lld, outside [%lld, %lld]", path, key, x, lo, hi);
  *out = x;
  return 1;
}

int generation_config_load(const char *dir, generation_config *gc, char *err, size_t errlen) {
  memset(gc, 0, sizeof *gc);
  char path[4096];
  if (snprintf(path, sizeof path, "%s/generation_config.json", dir) >= (int)sizeof path)
    return errf(err, errlen, "%s: path too long", dir);
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* no file: no defaults */
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  if (!o) return errf(err, errlen, "%s: line %d: %s", path, je.line, je.text);
  int rc = -1;
  if (!json_is_object(o)) {
    errf(err, errlen, "%s: not a JSON object", path);
    goto out;
  }
  double d;
  long long x;
  int r;
  if ((r = gc_num(o, "temperature", 0.0, 0, 1e6, &d, path, err, errlen)) < 0) goto out;
  if (r) gc->temperature = (float)d, gc->has |= SAMPLING_SET_TEMPERATURE;
  if ((r = gc_num(o, "top_p", 0.0, 1, 1.0, &d, path, err, errlen)) < 0) goto out;
  if (r) gc->top_p = (float)d, gc->has |= SAMPLING_SET_TOP_P;
  if ((r = gc_int(o, "top_k", -1, INT_MAX, &x, path, err, errlen)) < 0) goto out;
  if (r && x != 50) gc->top_k = x < 0 ? 0 : (int)x, gc->has |= SAMPLING_SET_TOP_K;
  if ((r = gc_num(o, "min_p", 0.0, 0, 1.0, &d, path, err, errlen)) < 0) goto out;
  if (r) gc->min_p = (float)d, gc->has |= SAMPLING_SET_MIN_P;
  if ((r = gc_num(o, "repetition_penalty", 0.0, 1, 1e6, &d, path, err, errlen)) < 0) goto out;
  if (r) gc->repetition_penalty = (float)d, gc->has |= SAMPLING_SET_REPETITION_PENALTY;
  if ((r = gc_int(o, "max_new_tokens", 1, INT_MAX, &x, path, err, errlen)) < 0) goto out;
  if (r) gc->max_new_tokens = (int)x, gc->has |= SAMPLING_SET_MAX_TOKENS;
  /* the float forms must still be in range (1e-46 passes as a double but is 0 as a float) */
  if ((gc->has & SAMPLING_SET_TOP_P) && !(gc->top_p > 0.f)) {
    errf(err, errlen, "%s: 'top_p' is 0 as a float", path);
    goto out;
  }
  if ((gc->has & SAMPLING_SET_REPETITION_PENALTY) && !(gc->repetition_penalty > 0.f)) {
    errf(err, errlen, "%s: 'repetition_penalty' is 0 as a float", path);
    goto out;
  }
  rc = 0;
out:
  if (rc) memset(gc, 0, sizeof *gc);
  json_decref(o);
  return rc;
}

void generation_config_apply(const generation_config *gc, unsigned set, sampling_params *sp) {
  unsigned use = gc->has & ~set;
  if (use & SAMPLING_SET_TEMPERATURE) sp->temperature = gc->temperature;
  if (use & SAMPLING_SET_TOP_P) sp->top_p = gc->top_p;
  if (use & SAMPLING_SET_TOP_K) sp->top_k = gc->top_k;
  if (use & SAMPLING_SET_MIN_P) sp->min_p = gc->min_p;
  if (use & SAMPLING_SET_REPETITION_PENALTY) sp->repetition_penalty = gc->repetition_penalty;
}

int generation_config_max_tokens(const generation_config *gc, int avail) {
  if ((gc->has & SAMPLING_SET_MAX_TOKENS) && gc->max_new_tokens < avail) return gc->max_new_tokens;
  return avail;
}

/* Appends to buf (n bytes, *o used), truncating. */
static void gc_put(char *buf, size_t n, size_t *o, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void gc_put(char *buf, size_t n, size_t *o, const char *fmt, ...) {
  if (*o + 1 >= n) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + *o, n - *o, fmt, ap);
  va_end(ap);
  if (k > 0) *o += (size_t)k < n - *o ? (size_t)k : n - 1 - *o;
}

void generation_config_describe(const generation_config *gc, char *buf, size_t n) {
  if (!n) return;
  buf[0] = 0;
  size_t o = 0;
  if (gc->has & SAMPLING_SET_TEMPERATURE)
    gc_put(buf, n, &o, "%stemperature=%g", o ? " " : "", (double)gc->temperature);
  if (gc->has & SAMPLING_SET_TOP_P)
    gc_put(buf, n, &o, "%stop_p=%g", o ? " " : "", (double)gc->top_p);
  if (gc->has & SAMPLING_SET_TOP_K) gc_put(buf, n, &o, "%stop_k=%d", o ? " " : "", gc->top_k);
  if (gc->has & SAMPLING_SET_MIN_P)
    gc_put(buf, n, &o, "%smin_p=%g", o ? " " : "", (double)gc->min_p);
  if (gc->has & SAMPLING_SET_REPETITION_PENALTY)
    gc_put(buf, n, &o, "%srepetition_penalty=%g", o ? " " : "", (double)gc->repetition_penalty);
  if (gc->has & SAMPLING_SET_MAX_TOKENS)
    gc_put(buf, n, &o, "%smax_tokens=%d", o ? " " : "", gc->max_new_tokens);
}
