/* cli_load — the weight-loading flags that `serve`, `run` and `bench` share, under vLLM's
 * names: --quantization fp8 (quantize a bf16 checkpoint at load) and --load-format
 * auto|safetensors|dummy (dummy: random weights of the config's shapes, no weight files). */
#ifndef DS_CLI_LOAD_H
#define DS_CLI_LOAD_H
#include <stddef.h>

#include "model/weights.h"

/* The flags' help lines, for a command's usage text. */
extern const char cli_load_help[];

/* If argv[*i] is one of the flags ("--flag=value" also accepted): stores it in o, leaves *i on
 * its value and returns 1; returns 0 when it is not one (nothing changes), and -1 with one line
 * in err when the value is missing or names what deltaserve does not do (another quantization
 * method, another load format). */
int cli_load_flag(weights_opts *o, int argc, char **argv, int *i, char *err, size_t errlen);

#endif
