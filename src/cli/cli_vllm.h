/* cli_vllm — the flags of `vllm serve` that mean nothing in deltaserve, so that a vLLM launch
 * line starts it: accepted with one log line where they change no result, refused with one
 * line where deltaserve cannot do what they ask. The vLLM flags that map (--max-model-len,
 * --port...) are deltaserve's own flags and are not here. */
#ifndef DS_CLI_VLLM_H
#define DS_CLI_VLLM_H
#include <stddef.h>
#include <stdio.h>

#include "backend/backend.h"

/* Prints one help line per flag below to f, for `serve --help`. */
void cli_vllm_usage(FILE *f);

/* If argv[*i] is one of those flags: when deltaserve accepts it (and its value, argv[*i + 1]
 * for a flag with one), logs one line "FLAG [VALUE]: accepted, no effect: WHY", advances *i
 * past its value and returns 1; when it refuses it, returns -1 with one line in err saying why
 * and what to do. Returns 0 when argv[*i] is none of them (nothing changes). */
int cli_vllm_flag(int argc, char **argv, int *i, char *err, size_t errlen);

/* The flags above that --tensor-parallel-size tp makes mean something: returns -1 with one line
 * in err when argv has --enable-expert-parallel and tp > 1 (the experts are split by rows, not
 * by expert), else 0. */
int cli_vllm_check_tp(int argc, char **argv, int tp, char *err, size_t errlen);

/* --kv-cache-dtype V, vLLM's values: auto and bfloat16 (the backend's own K/V type), fp8 and
 * fp8_e4m3 (e4m3 pages with scales, backend.h "Paged K/V"). Returns 0 with *out set, or -1
 * with one line in err (fp8_e5m2 and anything else). */
int cli_vllm_kv_cache_dtype(const char *v, backend_kv_dtype *out, char *err, size_t errlen);

#endif
