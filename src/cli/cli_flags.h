/* cli_flags — the flags `serve`, `run` and `bench` share: the engine's (vLLM names) and the
 * number parsers behind them. */
#ifndef DS_CLI_FLAGS_H
#define DS_CLI_FLAGS_H
#include <stddef.h>

#include "engine/engine.h"

/* argv with every "--flag=value" split in two, "--flag" and "value", so that each command's
 * parser reads flags one way (vLLM's argparse takes both). Other arguments are kept as they
 * are, also everything after a bare "--". Returns a NULL-terminated copy of *argc' entries
 * (the new count in *argc), pointers and strings in one allocation that the caller frees with
 * free(); NULL when out of memory. */
char **cli_flags_split(int *argc, char **argv);

/* The engine flags' help lines, for a command's usage text. */
extern const char cli_flags_engine_help[];

/* If argv[*i] is an engine flag (see cli_flags_engine_help; "--flag=value" also accepted)
 * stores it in o, advances *i past its value and returns 1; returns 0 when argv[*i] is not an
 * engine flag (nothing changes), and -1 with one line in err when the value is missing or out
 * of range. */
int cli_flags_engine(engine_opts *o, int argc, char **argv, int *i, char *err, size_t errlen);

/* vLLM's --tensor-parallel-size N (also -tp N, "--flag=value"), 1 <= N <= CLI_FLAGS_TP_MAX:
 * if argv[*i] is it, stores N in *tp (backend_options.tensor_parallel_size), leaves *i on its
 * value and returns 1; returns 0 when it is not (nothing changes), -1 with one line in err when
 * the value is missing or out of range. */
#define CLI_FLAGS_TP_MAX 64
int cli_flags_tp(int *tp, int argc, char **argv, int *i, char *err, size_t errlen);

/* v as an integer in [lo, hi] into *out; returns 0, or -1 with err naming flag. */
int cli_flags_int(const char *v, const char *flag, int lo, int hi, int *out, char *err,
                  size_t errlen);
/* v as a count (tokens, bytes) in [lo, hi] into *out, read as vLLM's human_readable_int reads
 * it: an integer ("32768", "+5", "1_000"), or digits with an optional fraction and one suffix,
 * decimal k m g t (x 10^3, 10^6, 10^9, 10^12; "25.6k" = 25600, a fraction of one truncated)
 * or binary K M G T (x 2^10, 2^20, 2^30, 2^40; whole numbers only: "1.5K" is refused).
 * Whitespace around it is ignored. Returns 0, or -1 with err naming flag. */
int cli_flags_size(const char *v, const char *flag, long long lo, long long hi, long long *out,
                   char *err, size_t errlen);
/* v as a number in [lo, hi] into *out; returns 0, or -1 with err naming flag. */
int cli_flags_double(const char *v, const char *flag, double lo, double hi, double *out, char *err,
                     size_t errlen);
/* v as a JSON list of strings, as vLLM reads --allowed-origins and its kin ('["*"]'), into a
 * malloc'd array of malloc'd strings (*out, *n; free with cli_flags_list_free). Returns 0, or
 * -1 with err naming flag. */
int cli_flags_json_list(const char *v, const char *flag, char ***out, int *n, char *err,
                        size_t errlen);
void cli_flags_list_free(char **list, int n);

#endif
