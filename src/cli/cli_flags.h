/* cli_flags — the flags `serve`, `run` and `bench` share: the engine's (vLLM names) and the
 * number parsers behind them. */
#ifndef DS_CLI_FLAGS_H
#define DS_CLI_FLAGS_H
#include <stddef.h>

#include "engine/engine.h"

/* The engine flags' help lines, for a command's usage text. */
extern const char cli_flags_engine_help[];

/* If argv[*i] is an engine flag (see cli_flags_engine_help; "--flag=value" also accepted)
 * stores it in o, advances *i past its value and returns 1; returns 0 when argv[*i] is not an
 * engine flag (nothing changes), and -1 with one line in err when the value is missing or out
 * of range. */
int cli_flags_engine(engine_opts *o, int argc, char **argv, int *i, char *err, size_t errlen);

/* v as an integer in [lo, hi] into *out; returns 0, or -1 with err naming flag. */
int cli_flags_int(const char *v, const char *flag, int lo, int hi, int *out, char *err,
                  size_t errlen);
/* v as a number in [lo, hi] into *out; returns 0, or -1 with err naming flag. */
int cli_flags_double(const char *v, const char *flag, double lo, double hi, double *out, char *err,
                     size_t errlen);

#endif
