/* cli_load — see cli_load.h. */
#include "cli/cli_load.h"

#include <string.h>

#include "base/log.h"

const char cli_load_help[] =
    "  --quantization fp8          quantize the product weights at load to FP8 (e4m3, 128 x 128\n"
    "                              blocks, as the released FP8 checkpoints); an FP8 checkpoint\n"
    "                              needs no flag\n"
    "  --load-format F             auto or safetensors (the default), or dummy: random weights\n"
    "                              of the config's shapes, no weight files read (benchmarks)\n";

int cli_load_flag(weights_opts *o, int argc, char **argv, int *i, char *err, size_t errlen) {
  const char *a = argv[*i];
  static const char *names[] = {"--quantization", "-q", "--load-format"};
  size_t k = 0, n = sizeof names / sizeof names[0];
  const char *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  while (k < n && !(strlen(names[k]) == len && !strncmp(a, names[k], len))) k++;
  if (k == n) return 0;
  const char *flag = names[k];
  const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
  if (!v) return errf(err, errlen, "%s needs a value", flag);
  if (k < 2) {
    if (!strcmp(v, "fp8")) {
      o->quantize_fp8 = 1;
    } else if (!strcmp(v, "none") || !strcmp(v, "None")) {
      o->quantize_fp8 = 0;
    } else {
      return errf(err, errlen,
                  "%s %s is not supported: deltaserve quantizes at load to fp8 only (FP8 "
                  "checkpoints load as they are)",
                  flag, v);
    }
  } else if (!strcmp(v, "auto") || !strcmp(v, "safetensors")) {
    o->dummy = 0;
  } else if (!strcmp(v, "dummy")) {
    o->dummy = 1;
  } else {
    return errf(err, errlen,
                "%s %s is not supported: deltaserve reads safetensors (auto, safetensors) or "
                "makes random weights (dummy)",
                flag, v);
  }
  return 1;
}
