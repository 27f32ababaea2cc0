/* deltaserve gen-random --config CONFIG.json --out DIR [--seed N] [--dtype bf16|f16|f32]
 *                       [--threads N]
 * Writes DIR/config.json (a copy) and DIR/model.safetensors with random weights at the
 * config's shapes (see model/gen_random.h). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/gen_random.h"

static void gen_random_usage(FILE *f) {
  fprintf(f,
          "usage: deltaserve gen-random --config CONFIG.json --out DIR [--seed N] [--dtype "
          "bf16|f16|f32] "
          "[--threads N]\n"
          "  writes DIR/config.json and DIR/model.safetensors with random weights.\n"
          "  --dtype defaults to the config's \"dtype\" / \"torch_dtype\", else bf16.\n");
}

/* The dtype a config.json asks for (top level or text_config), else bf16. */
static dtype gen_random_config_dtype(const char *path) {
  dtype dt = DTYPE_BF16;
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) return dt;
  const char *keys[] = {"dtype", "torch_dtype"};
  json_t *objs[] = {root, json_object_get(root, "text_config")};
  for (int o = 0; o < 2; o++)
    for (int k = 0; k < 2; k++) {
      const char *s = json_string_value(json_object_get(objs[o], keys[k]));
      if (s && gen_random_parse_dtype(s, &dt) == 0) goto done;
    }
done:
  json_decref(root);
  return dt;
}

int cmd_gen_random(int argc, char **argv) {
  const char *config = NULL, *out = NULL, *dts = NULL;
  gen_random_opts o = {.seed = 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      gen_random_usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "deltaserve gen-random: %s needs a value\n", a);
      gen_random_usage(stderr);
      return 2;
    }
    const char *v = argv[++i];
    char *end;
    if (!strcmp(a, "--config")) {
      config = v;
    } else if (!strcmp(a, "--out")) {
      out = v;
    } else if (!strcmp(a, "--dtype")) {
      dts = v;
    } else if (!strcmp(a, "--seed")) {
      errno = 0;
      o.seed = strtoull(v, &end, 0);
      if (errno || *end || !*v) {
        fprintf(stderr, "deltaserve gen-random: bad --seed '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--threads")) {
      long t = strtol(v, &end, 10);
      if (*end || t < 1 || t > 64) {
        fprintf(stderr, "deltaserve gen-random: bad --threads '%s' (1..64)\n", v);
        return 2;
      }
      o.threads = (int)t;
    } else {
      fprintf(stderr, "deltaserve gen-random: unknown flag '%s'\n", a);
      gen_random_usage(stderr);
      return 2;
    }
  }
  if (!config || !out) {
    fprintf(stderr, "deltaserve gen-random: --config and --out are required\n");
    gen_random_usage(stderr);
    return 2;
  }
  if (dts) {
    if (gen_random_parse_dtype(dts, &o.dt)) {
      fprintf(stderr, "deltaserve gen-random: bad --dtype '%s' (bf16, f16 or f32)\n", dts);
      return 2;
    }
  } else {
    o.dt = gen_random_config_dtype(config);
  }
  char err[1024];
  if (gen_random_write(config, out, &o, err, sizeof err)) {
    fprintf(stderr, "deltaserve gen-random: %s\n", err);
    return 1;
  }
  return 0;
}
