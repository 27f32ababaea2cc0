/* cli_flags — see cli_flags.h. */
#include "cli/cli_flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "base/log.h"

const char cli_flags_engine_help[] =
    "  --max-num-seqs N            concurrent sequences (64)\n"
    "  --max-num-batched-tokens N  tokens per step (8192)\n"
    "  --max-model-len N           longest prompt + output (auto or -1: the model's\n"
    "                              max_position_embeddings, the default)\n"
    "  --kv-cache-tokens N         KV cache size in tokens (0: derived)\n"
    "  --gpu-memory-utilization F  share of device memory to use (0.9)\n"
    "  --max-waiting N             queued requests before 429 (4096)\n"
    "  --enable-prefix-caching / --no-enable-prefix-caching   (on)\n"
    "  --snapshot-interval N       prefix-cache checkpoint every N prompt tokens (2048)\n"
    "  --snapshot-slabs N          recurrent-state snapshot slabs (0: derived)\n"
    "  --prefix-cache-gib F        device budget of the prefix cache\n"
    "  --host-cache-gib F          host-memory tier of the prefix cache (0: off)\n"
    "  --packed-weights auto|on|off  lossless 12-bit copies of the layers' product weights\n"
    "                              for decode steps (CUDA; same results, ~0.75 of their\n"
    "                              bytes extra; auto, the default: when weights + copies\n"
    "                              <= half the GPU)\n"
    "  --sampler-threads N         threads that sample a step's rows beside the engine\n"
    "                              thread (0: the engine thread alone; default min(8,\n"
    "                              CPUs - 1)); the tokens do not depend on it\n"
    "  --speculative-config JSON   speculative decoding, vLLM's keys:\n"
    "                              {\"method\": \"ngram\", \"num_speculative_tokens\": k,\n"
    "                              \"prompt_lookup_min\": a, \"prompt_lookup_max\": b}, or\n"
    "                              {\"method\": \"mtp\", \"num_speculative_tokens\": k};\n"
    "                              + \"disable_by_batch_size\": n (else drafts per step\n"
    "                              where measured faster)\n"
    "  --log-steps                 log one line per engine step: each request's token range\n"
    "                              (+ cold admission, <-N restored from the prefix cache,\n"
    "                              ! sampled, ~K a verify piece of K drafts)\n"
    "  Token and byte counts (N above, --max-request-bytes) take vLLM's suffixes: k m g t\n"
    "  = 10^3 10^6 10^9 10^12 (25.6k = 25600), K M G T = 2^10 2^20 2^30 2^40 (32K = 32768).\n";

/* "--name=value" with a name of letters, digits, '-' and '_': where its '=' is, else NULL. */
static const char *cli_flags_eq(const char *a) {
  if (strncmp(a, "--", 2) != 0 || a[2] == '=') return NULL;
  for (const char *p = a + 2; *p; p++) {
    if (*p == '=') return p;
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_') return NULL;
  }
  return NULL;
}

char **cli_flags_split(int *argc, char **argv) {
  size_t n = (size_t)*argc, out = 0, bytes = 0;
  for (size_t i = 0; i < n; i++) bytes += strlen(argv[i]) + 1;
  /* at most twice the entries, and the strings copied once ('=' becomes the first's end) */
  char **av = malloc((2 * n + 1) * sizeof *av + bytes);
  if (!av) return NULL;
  char *text = (char *)(av + 2 * n + 1);
  int rest = 0; /* after "--": kept as they are */
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(argv[i]);
    memcpy(text, argv[i], len + 1);
    const char *eq = i > 0 && !rest ? cli_flags_eq(argv[i]) : NULL;
    rest |= i > 0 && !strcmp(argv[i], "--");
    av[out++] = text;
    if (eq) {
      text[eq - argv[i]] = 0;
      av[out++] = text + (eq - argv[i]) + 1;
    }
    text += len + 1;
  }
  av[out] = NULL;
  *argc = (int)out;
  return av;
}

/* [+-]digits with single '_' between digits (Python's int()); 0 and *out, or -1. */
static int cli_flags_plain(const char *s, const char *end, long long *out) {
  int neg = *s == '-';
  if (*s == '+' || *s == '-') s++;
  if (s == end || !isdigit((unsigned char)*s)) return -1;
  long long x = 0;
  for (; s < end; s++) {
    if (*s == '_' && s + 1 < end && isdigit((unsigned char)s[-1]) && isdigit((unsigned char)s[1]))
      continue;
    if (!isdigit((unsigned char)*s) || x > (LLONG_MAX - 9) / 10) return -1;
    x = x * 10 + (*s - '0');
  }
  *out = neg ? -x : x;
  return 0;
}

int cli_flags_size(const char *v, const char *flag, long long lo, long long hi, long long *out,
                   char *err, size_t errlen) {
  const char *s = v, *end = v + strlen(v);
  while (s < end && isspace((unsigned char)*s)) s++;
  while (end > s && isspace((unsigned char)end[-1])) end--;
  long long x = 0;
  int ok = 0;
  const char *suffix = end > s ? strchr("kmgtKMGT", end[-1]) : NULL;
  if (suffix && *suffix) {
    /* digits [. digits] then the suffix, as vLLM's (\d+(?:\.\d+)?)([kKmMgGtT]) */
    const char *p = s, *dot = NULL;
    while (p < end - 1 && (isdigit((unsigned char)*p) || (*p == '.' && !dot && p > s))) {
      if (*p == '.') dot = p;
      p++;
    }
    int form = p == end - 1 && p > s && (!dot || dot < p - 1);
    int k = (int)(suffix - "kmgtKMGT");
    if (form && k < 4) { /* decimal: int(float(number) * 10^(3(k+1))) */
      static const double mult[] = {1e3, 1e6, 1e9, 1e12};
      double d = strtod(s, NULL) * mult[k];
      ok = d < 9.2e18;
      x = ok ? (long long)d : 0;
    } else if (form && dot) {
      return errf(err, errlen,
                  "%s: '%s': decimals are not allowed with binary suffixes like %c (did you mean "
                  "%.*s%c, x 10^%d?)",
                  flag, v, end[-1], (int)(end - 1 - s), s, "kmgt"[k - 4], 3 * (k - 3));
    } else if (form) { /* binary: int(number) * 2^(10(k-3)) */
      ok = !cli_flags_plain(s, end - 1, &x) && x <= (LLONG_MAX >> (10 * (k - 3)));
      x = ok ? x << (10 * (k - 3)) : 0;
    }
  } else {
    ok = !cli_flags_plain(s, end, &x);
  }
  if (!ok || x < lo || x > hi)
    return errf(err, errlen,
                "%s: expected a count in [%lld, %lld] (32768, 32k = 32000, 32K = 32768), got '%s'",
                flag, lo, hi, v);
  *out = x;
  return 0;
}

int cli_flags_int(const char *v, const char *flag, int lo, int hi, int *out, char *err,
                  size_t errlen) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return errf(err, errlen, "%s: expected an integer in [%d, %d], got '%s'", flag, lo, hi, v);
  *out = (int)x;
  return 0;
}

int cli_flags_tp(int *tp, int argc, char **argv, int *i, char *err, size_t errlen) {
  const char *a = argv[*i], *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  const char *flag = "--tensor-parallel-size";
  if (!(len == strlen(flag) && !strncmp(a, flag, len)) && !(len == 3 && !strncmp(a, "-tp", 3)))
    return 0;
  const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
  if (!v) return errf(err, errlen, "%s needs a value", flag);
  return cli_flags_int(v, flag, 1, CLI_FLAGS_TP_MAX, tp, err, errlen) ? -1 : 1;
}

int cli_flags_double(const char *v, const char *flag, double lo, double hi, double *out, char *err,
                     size_t errlen) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi))
    return errf(err, errlen, "%s: expected a number in [%g, %g], got '%s'", flag, lo, hi, v);
  *out = x;
  return 0;
}

int cli_flags_engine(engine_opts *o, int argc, char **argv, int *i, char *err, size_t errlen) {
  const char *a = argv[*i];
  if (strncmp(a, "--", 2) != 0) return 0;
  char name[64];
  const char *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  if (len >= sizeof name) return 0;
  memcpy(name, a, len);
  name[len] = 0;
  const struct {
    const char *name;
    int *field, value;
  } switches[] = {{"--enable-prefix-caching", &o->enable_prefix_caching, 1},
                  {"--no-enable-prefix-caching", &o->enable_prefix_caching, 0},
                  {"--log-steps", &o->log_steps, 1}};
  for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++) {
    if (strcmp(name, switches[k].name)) continue;
    if (eq) return errf(err, errlen, "%s takes no value", name);
    *switches[k].field = switches[k].value;
    return 1;
  }
  if (!strcmp(name, "--speculative-config")) {
    const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v) return errf(err, errlen, "%s needs a JSON object", name);
    return spec_config_parse(v, &o->spec, err, errlen) == 0 ? 1 : -1;
  }
  if (!strcmp(name, "--packed-weights")) {
    const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v) return errf(err, errlen, "%s needs a value (auto, on or off)", name);
    if (!strcmp(v, "auto"))
      o->packed_weights = -1;
    else if (!strcmp(v, "on"))
      o->packed_weights = 1;
    else if (!strcmp(v, "off"))
      o->packed_weights = 0;
    else
      return errf(err, errlen, "%s: expected auto, on or off, got '%s'", name, v);
    return 1;
  }
  /* the flags with a number: where it goes, its type, its range (an integer's hi 0: 1e9) */
  enum { NUM_INT, NUM_SIZE, NUM_FLOAT, NUM_DOUBLE }; /* NUM_SIZE: an int as cli_flags_size */
  static const struct {
    const char *name;
    size_t off;
    int type;
    double lo, hi;
  } nums[] = {
      {"--max-num-seqs", offsetof(engine_opts, max_num_seqs), NUM_INT, 1, 0},
      {"--max-num-batched-tokens", offsetof(engine_opts, max_num_batched_tokens), NUM_SIZE, 1, 0},
      {"--max-model-len", offsetof(engine_opts, max_model_len), NUM_SIZE, 1, 0},
      {"--kv-cache-tokens", offsetof(engine_opts, kv_cache_tokens), NUM_SIZE, 16, 0},
      {"--gpu-memory-utilization", offsetof(engine_opts, gpu_memory_utilization), NUM_FLOAT, 0.01,
       1.0},
      {"--max-waiting", offsetof(engine_opts, max_waiting), NUM_INT, 1, 0},
      {"--snapshot-interval", offsetof(engine_opts, snapshot_interval), NUM_SIZE, 1, 0},
      {"--snapshot-slabs", offsetof(engine_opts, n_snapshot_slabs), NUM_INT, 0, 0},
      {"--prefix-cache-gib", offsetof(engine_opts, prefix_cache_gib), NUM_DOUBLE, 0, 1e6},
      {"--host-cache-gib", offsetof(engine_opts, host_cache_gib), NUM_DOUBLE, 0, 1e6},
      {"--sampler-threads", offsetof(engine_opts, sampler_threads), NUM_INT, 0, 64},
  };
  int k = -1;
  for (int j = 0; j < (int)(sizeof nums / sizeof *nums); j++)
    if (!strcmp(name, nums[j].name)) k = j;
  if (k < 0) return 0;
  const char *v;
  if (eq) {
    v = eq + 1;
  } else {
    if (*i + 1 >= argc) return errf(err, errlen, "%s needs a value", name);
    v = argv[++*i];
  }
  char *dst = (char *)o + nums[k].off;
  double d;
  int rc;
  long long n;
  if (!strcmp(name, "--max-model-len") && (!strcmp(v, "-1") || !strcasecmp(v, "auto"))) {
    o->max_model_len = 0; /* vLLM's human_readable_int_or_auto: derived from the model */
    rc = 0;
  } else if (nums[k].type == NUM_SIZE) {
    rc = cli_flags_size(v, name, (long long)nums[k].lo, 1000000000, &n, err, errlen);
    if (rc == 0) *(int *)dst = (int)n;
  } else if (nums[k].type == NUM_INT) {
    rc = cli_flags_int(v, name, (int)nums[k].lo, nums[k].hi > 0 ? (int)nums[k].hi : 1000000000,
                       (int *)dst, err, errlen);
  } else {
    rc = cli_flags_double(v, name, nums[k].lo, nums[k].hi, &d, err, errlen);
    if (rc == 0 && nums[k].type == NUM_FLOAT) *(float *)dst = (float)d;
    if (rc == 0 && nums[k].type == NUM_DOUBLE) *(double *)dst = d;
  }
  return rc < 0 ? -1 : 1;
}

int cli_flags_json_list(const char *v, const char *flag, char ***out, int *n, char *err,
                        size_t errlen) {
  *out = NULL;
  *n = 0;
  json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
  size_t k = json_is_array(j) ? json_array_size(j) : 0;
  for (size_t i = 0; i < k; i++)
    if (!json_is_string(json_array_get(j, i))) k = 0;
  if (!json_is_array(j) || (k == 0 && json_array_size(j) > 0)) {
    json_decref(j);
    snprintf(err, errlen, "%s: expected a JSON list of strings such as '[\"*\"]', got '%s'", flag,
             v);
    return -1;
  }
  char **l = calloc(k + 1, sizeof *l);
  for (size_t i = 0; l && i < k; i++)
    if (!(l[i] = strdup(json_string_value(json_array_get(j, i))))) {
      cli_flags_list_free(l, (int)i);
      l = NULL;
    }
  json_decref(j);
  if (!l) {
    snprintf(err, errlen, "%s: out of memory", flag);
    return -1;
  }
  *out = l;
  *n = (int)k;
  return 0;
}

void cli_flags_list_free(char **list, int n) {
  if (!list) return;
  for (int i = 0; i < n; i++) free(list[i]);
  free(list);
}
