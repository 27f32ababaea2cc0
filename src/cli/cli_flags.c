/* cli_flags — see cli_flags.h. */
#include "cli/cli_flags.h"

#include <errno.h>
#include <stddef.h>
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
  enum { NUM_INT, NUM_FLOAT, NUM_DOUBLE };
  static const struct {
    const char *name;
    size_t off;
    int type;
    double lo, hi;
  } nums[] = {
      {"--max-num-seqs", offsetof(engine_opts, max_num_seqs), NUM_INT, 1, 0},
      {"--max-num-batched-tokens", offsetof(engine_opts, max_num_batched_tokens), NUM_INT, 1, 0},
      {"--max-model-len", offsetof(engine_opts, max_model_len), NUM_INT, 1, 0},
      {"--kv-cache-tokens", offsetof(engine_opts, kv_cache_tokens), NUM_INT, 16, 0},
      {"--gpu-memory-utilization", offsetof(engine_opts, gpu_memory_utilization), NUM_FLOAT, 0.01,
       1.0},
      {"--max-waiting", offsetof(engine_opts, max_waiting), NUM_INT, 1, 0},
      {"--snapshot-interval", offsetof(engine_opts, snapshot_interval), NUM_INT, 1, 0},
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
  if (nums[k].type == NUM_INT) {
    rc = cli_flags_int(v, name, (int)nums[k].lo, nums[k].hi > 0 ? (int)nums[k].hi : 1000000000,
                       (int *)dst, err, errlen);
  } else {
    rc = cli_flags_double(v, name, nums[k].lo, nums[k].hi, &d, err, errlen);
    if (rc == 0 && nums[k].type == NUM_FLOAT) *(float *)dst = (float)d;
    if (rc == 0 && nums[k].type == NUM_DOUBLE) *(double *)dst = d;
  }
  return rc < 0 ? -1 : 1;
}
