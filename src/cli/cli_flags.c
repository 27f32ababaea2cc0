/* cli_flags — see cli_flags.h. */
#include "cli/cli_flags.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

const char cli_flags_engine_help[] =
    "  --max-num-seqs N            concurrent sequences (64)\n"
    "  --max-num-batched-tokens N  tokens per step (8192)\n"
    "  --max-model-len N           longest prompt + output (model's max_position_embeddings)\n"
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
    "  --log-steps                 log one line per engine step: each request's token range\n"
    "                              (+ cold admission, <-N restored from the prefix cache,\n"
    "                              ! sampled)\n";

int cli_flags_int(const char *v, const char *flag, int lo, int *out, char *err, size_t errlen) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > 1000000000)
    return errf(err, errlen, "%s: expected an integer >= %d, got '%s'", flag, lo, v);
  *out = (int)x;
  return 0;
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
  if (!strcmp(name, "--enable-prefix-caching") || !strcmp(name, "--no-enable-prefix-caching") ||
      !strcmp(name, "--log-steps")) {
    if (eq) return errf(err, errlen, "%s takes no value", name);
    if (name[2] == 'l')
      o->log_steps = 1;
    else
      o->enable_prefix_caching = name[2] != 'n';
    return 1;
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
  static const char *const known[] = {
      "--max-num-seqs",      "--max-num-batched-tokens", "--max-model-len",
      "--kv-cache-tokens",   "--gpu-memory-utilization", "--max-waiting",
      "--snapshot-interval", "--snapshot-slabs",         "--prefix-cache-gib",
      "--host-cache-gib",    "--sampler-threads"};
  int k = -1;
  for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
    if (!strcmp(name, known[j])) k = j;
  if (k < 0) return 0;
  const char *v;
  if (eq) {
    v = eq + 1;
  } else {
    if (*i + 1 >= argc) return errf(err, errlen, "%s needs a value", name);
    v = argv[++*i];
  }
  double d;
  int rc = 0;
  switch (k) {
    case 0:
      rc = cli_flags_int(v, name, 1, &o->max_num_seqs, err, errlen);
      break;
    case 1:
      rc = cli_flags_int(v, name, 1, &o->max_num_batched_tokens, err, errlen);
      break;
    case 2:
      rc = cli_flags_int(v, name, 1, &o->max_model_len, err, errlen);
      break;
    case 3:
      rc = cli_flags_int(v, name, 16, &o->kv_cache_tokens, err, errlen);
      break;
    case 4:
      rc = cli_flags_double(v, name, 0.01, 1.0, &d, err, errlen);
      o->gpu_memory_utilization = (float)d;
      break;
    case 5:
      rc = cli_flags_int(v, name, 1, &o->max_waiting, err, errlen);
      break;
    case 6:
      rc = cli_flags_int(v, name, 1, &o->snapshot_interval, err, errlen);
      break;
    case 7:
      rc = cli_flags_int(v, name, 0, &o->n_snapshot_slabs, err, errlen);
      break;
    case 8:
      rc = cli_flags_double(v, name, 0, 1e6, &o->prefix_cache_gib, err, errlen);
      break;
    case 9:
      rc = cli_flags_double(v, name, 0, 1e6, &o->host_cache_gib, err, errlen);
      break;
    case 10:
      rc = cli_flags_int(v, name, 0, &o->sampler_threads, err, errlen);
      if (rc == 0 && o->sampler_threads > 64)
        rc = errf(err, errlen, "%s: at most 64, got '%s'", name, v);
      break;
  }
  return rc < 0 ? -1 : 1;
}
