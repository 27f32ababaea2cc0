/* cli_vllm — see cli_vllm.h. One table: a flag, the values deltaserve accepts, why it has no
 * effect here, and why other values (or the flag itself) are refused. */
#include "cli/cli_vllm.h"

#include <string.h>

#include "base/log.h"

typedef struct {
  const char *name;
  const char *alias;  /* vLLM's short form ("-tp"), or NULL */
  const char *values; /* NULL: a switch; "": any value; else the accepted ones, '|' between */
  const char *ok;     /* accepted: why it changes nothing; NULL: the flag is refused */
  const char *no;     /* refused (the flag, or a value not in values): why, what to do */
} cli_vllm_entry;

static const cli_vllm_entry cli_vllm_flags[] = {
    {"--trust-remote-code", NULL, NULL, "no code from the model folder is run", NULL},
    {"--dtype", NULL, "auto|bfloat16", "the weights are used as the checkpoint stores them",
     "another dtype would change the results"},
    {"--pipeline-parallel-size", "-pp", "1", "one pipeline stage",
     "pipeline parallelism is not implemented: split a model over GPUs with "
     "--tensor-parallel-size"},
    {"--data-parallel-size", "-dp", "1", "one replica",
     "data parallelism is not implemented: run a server per GPU behind a load balancer"},
    {"--enable-auto-tool-choice", NULL, NULL,
     "tool calls are always parsed and tool_choice auto is always available", NULL},
    {"--tool-call-parser", NULL, "hermes|qwen3_coder|qwen3_xml",
     "Qwen's <tool_call> blocks are parsed in both forms (hermes JSON, qwen3_coder XML)",
     "deltaserve parses Qwen's <tool_call> forms only"},
    {"--reasoning-parser", NULL, "qwen3|deepseek_r1",
     "<think> ... </think> is returned as reasoning_content",
     "deltaserve parses Qwen's <think> blocks only"},
    {"--trust-request-chat-template", NULL, NULL,
     "a request's chat_template is always accepted: it renders in the sandboxed Jinja engine "
     "under its limits",
     NULL},
    {"--uvicorn-log-level", NULL, "", "there is no uvicorn", NULL},
    {"--disable-uvicorn-access-log", NULL, NULL, "there is no uvicorn", NULL},
    {"--disable-frontend-multiprocessing", NULL, NULL, "deltaserve is one process", NULL},
    {"--distributed-executor-backend", NULL, "", "deltaserve is one process", NULL},
    {"--enforce-eager", NULL, NULL, "CUDA graphs change no result", NULL},
    {"--enable-chunked-prefill", NULL, NULL,
     "prompts are always prefilled in pieces of at most --max-num-batched-tokens", NULL},
    {"--no-enable-chunked-prefill", NULL, NULL,
     "prompts are always prefilled in pieces of at most --max-num-batched-tokens", NULL},
    {"--swap-space", NULL, "", "no swap space (--host-cache-gib: a host tier of the prefix cache)",
     NULL},
    {"--block-size", NULL, "", "KV pages are 16 tokens", NULL},
    {"--max-log-len", NULL, "", "prompts are not logged", NULL},
    {"--download-dir", NULL, "", "MODEL is a local folder", NULL},
    {"--mamba-ssm-cache-dtype", NULL, "auto|float32", "the recurrent state is float32",
     "another state dtype would change the results"},
    {"--task", NULL, "auto|generate", "deltaserve generates text",
     "deltaserve generates text only"},
    {"--runner", NULL, "auto|generate", "deltaserve generates text",
     "deltaserve generates text only"},
    {"--language-model-only", NULL, NULL, "text only: no vision encoder is loaded", NULL},
    {"--limit-mm-per-prompt", NULL, "", "text only: no vision encoder is loaded", NULL},
    {"--mm-encoder-tp-mode", NULL, "", "text only: no vision encoder is loaded", NULL},
    {"--mm-processor-cache-type", NULL, "", "text only: no vision encoder is loaded", NULL},
    {"--enable-expert-parallel", NULL, NULL,
     "one rank holds every expert (refused with --tensor-parallel-size > 1)", NULL},
    {"--kv-cache-memory-bytes", NULL, NULL, NULL,
     "give the KV cache as --kv-cache-tokens N or --gpu-memory-utilization F"},
    {"--seed", NULL, NULL, NULL,
     "no server-wide seed: give a request a 'seed' field for reproducible sampling"},
    {"--tokenizer", NULL, NULL, NULL, "the tokenizer is read from the model folder"},
    {"--enable-lora", NULL, NULL, NULL, "LoRA adapters are not supported"},
    {"--lora-modules", NULL, NULL, NULL, "LoRA adapters are not supported"},
    {"--hf-overrides", NULL, NULL, NULL, "edit the model folder's config.json instead"},
    {"--rope-scaling", NULL, NULL, NULL, "edit the model folder's config.json instead"},
    {"--override-generation-config", NULL, NULL, NULL,
     "use --generation-config DIR with a generation_config.json instead"},
    {"--revision", NULL, NULL, NULL, "MODEL is a local folder"},
    {"--ssl-keyfile", NULL, NULL, NULL, "no TLS: put a TLS proxy in front"},
    {"--ssl-certfile", NULL, NULL, NULL, "no TLS: put a TLS proxy in front"},
};

/* value is one of the '|'-separated list */
static int cli_vllm_in(const char *list, const char *value) {
  size_t n = strlen(value);
  for (const char *p = list; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, value, n)) return 1;
    p += len + (bar != NULL);
  }
  return 0;
}

void cli_vllm_usage(FILE *f) {
  for (size_t k = 0; k < sizeof cli_vllm_flags / sizeof *cli_vllm_flags; k++) {
    const cli_vllm_entry *e = &cli_vllm_flags[k];
    char what[96];
    snprintf(what, sizeof what, "%s%s%s%s%s", e->alias ? e->alias : "", e->alias ? ", " : "",
             e->name, e->ok && e->values ? " " : "",
             !e->ok || !e->values ? ""
             : e->values[0]       ? e->values
                                  : "X");
    fprintf(f, "  %-30s %s: %s\n", what,
            !e->ok                      ? "refused"
            : e->values && e->values[0] ? "accepted, others refused"
                                        : "accepted",
            e->ok ? e->ok : e->no);
  }
}

int cli_vllm_kv_cache_dtype(const char *v, backend_kv_dtype *out, char *err, size_t errlen) {
  if (!strcmp(v, "auto") || !strcmp(v, "bfloat16")) {
    *out = BACKEND_KV_AUTO;
    return 0;
  }
  if (!strcmp(v, "fp8") || !strcmp(v, "fp8_e4m3")) {
    *out = BACKEND_KV_FP8_E4M3;
    return 0;
  }
  if (!strcmp(v, "fp8_e5m2"))
    return errf(err, errlen,
                "--kv-cache-dtype fp8_e5m2: not supported: the FP8 KV cache is e4m3 with a scale "
                "per token and head (--kv-cache-dtype fp8)");
  return errf(err, errlen,
              "--kv-cache-dtype %s: not supported (accepted: auto, bfloat16, fp8, fp8_e4m3)", v);
}

int cli_vllm_flag(int argc, char **argv, int *i, char *err, size_t errlen) {
  const char *a = argv[*i];
  const cli_vllm_entry *e = NULL;
  for (size_t k = 0; k < sizeof cli_vllm_flags / sizeof *cli_vllm_flags && !e; k++)
    if (!strcmp(a, cli_vllm_flags[k].name) ||
        (cli_vllm_flags[k].alias && !strcmp(a, cli_vllm_flags[k].alias)))
      e = &cli_vllm_flags[k];
  if (!e) return 0;
  if (!e->ok) return errf(err, errlen, "%s: not supported: %s", a, e->no);
  if (!e->values) {
    log_info("%s: accepted, no effect: %s", a, e->ok);
    return 1;
  }
  if (*i + 1 >= argc) return errf(err, errlen, "%s needs a value", a);
  const char *v = argv[++*i];
  if (e->values[0] && !cli_vllm_in(e->values, v))
    return errf(err, errlen, "%s %s: not supported: %s (accepted: %s)", a, v, e->no, e->values);
  log_info("%s %s: accepted, no effect: %s", a, v, e->ok);
  return 1;
}

int cli_vllm_check_tp(int argc, char **argv, int tp, char *err, size_t errlen) {
  for (int i = 1; i < argc && tp > 1; i++)
    if (!strcmp(argv[i], "--enable-expert-parallel"))
      return errf(err, errlen,
                  "--enable-expert-parallel: not supported with --tensor-parallel-size %d: the "
                  "ranks split every expert by its rows (expert parallelism is not implemented)",
                  tp);
  return 0;
}
