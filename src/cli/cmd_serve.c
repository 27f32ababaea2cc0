/* cmd_serve — `deltaserve serve`: the OpenAI-compatible HTTP server.
 *
 * Start-up order: flags -> listener up (/health 503) -> model, tokenizer, backend, pools,
 * engine -> start-up report (model, memory split, limits, URL) -> /health 200 -> wait for
 * SIGTERM / SIGINT -> stop accepting, let in-flight requests finish for --shutdown-grace
 * seconds, cancel the rest -> free everything -> exit 0.
 *
 * Test-only knob: DS_FAULT="SITE:N[:sticky]" in the environment arms src/base/fault.h once the
 * model is loaded and just before /health turns 200, so that hit counts start at serving (the
 * N-th request-time fault_hit of SITE fails; "*" is any site). Each fire is logged to stderr as
 * "deltaserve: fault fired at SITE (hit K, fire F)" (the first 16 fires, then powers of two) and
 * the totals as "deltaserve: faults fired: F of H hits" on the way out (H: hits of the site).
 * Not a user flag; see tests/faults.test.mjs. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend_create.h"
#include "base/fault.h"
#include "base/log.h"
#include "cache/kv_events.h"
#include "cli/cli.h"
#include "cli/cli_flags.h"
#include "cli/cli_load.h"
#include "cli/cli_vllm.h"
#include "cache/disk_tier.h"
#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "model/config.h"
#include "model/generation_config.h"
#include "model/qwen35.h"
#include "model/weights.h"
#include "server/server.h"
#include "tokenizer/chat_jinja.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#define SERVE_DEMO_MODEL "build/demo-model"

static void serve_usage(FILE *f) {
  fprintf(
      f,
      "usage: deltaserve serve [MODEL] [flags]   (flags as --flag value or --flag=value)\n"
      "\n"
      "server:\n"
      "  MODEL, --model DIR          model folder (default: the demo model at " SERVE_DEMO_MODEL
      ")\n"
      "  --host ADDR                 IPv4 or IPv6 address to listen on (127.0.0.1; :: or\n"
      "                              0.0.0.0 for all)\n"
      "  --port N                    port (8000; 0 picks a free one)\n"
      "  --served-model-name NAME... the model names clients may send; the first is the one\n"
      "                              responses report (default: the folder name)\n"
      "  --api-key KEY               require 'Authorization: Bearer KEY' on /v1/* (default:\n"
      "                              $DELTASERVE_API_KEY, else $VLLM_API_KEY, if set)\n"
      "  --metrics-require-api-key   with --api-key, /metrics needs the key too (default: open)\n"
      "  --allowed-origins JSON      CORS: origins allowed, a JSON list as vLLM takes it\n"
      "                              ('[\"https://app.example\"]'; default '[\"*\"]')\n"
      "  --allowed-methods JSON      CORS: methods allowed ('[\"*\"]')\n"
      "  --allowed-headers JSON      CORS: request headers allowed ('[\"*\"]')\n"
      "  --allow-credentials         CORS: Access-Control-Allow-Credentials (the origin is\n"
      "                              echoed instead of '*')\n"
      "  --metrics-prefix NAME       /metrics names' prefix (deltaserve); vllm: vLLM's names,\n"
      "                              labels and buckets for the series vLLM has (docs/api.md)\n"
      "  --device cpu|cuda|auto      backend (auto)\n"
      "  --threads N                 CPU backend threads (0: all cores)\n"
      "  --tensor-parallel-size N    (-tp N) the model split over N ranks, Megatron-style\n"
      "                              (CPU backend: N ranks of --threads / N threads each;\n"
      "                              docs/tensor-parallel.md)\n"
      "  --kv-events-config JSON     publish KV-cache events as vLLM does (ZeroMQ):\n"
      "                              '{\"enable_kv_cache_events\": true}' (docs/kv-events.md)\n"
      "  --disk-cache-dir DIR        prefix-cache checkpoints leaving memory go to files in DIR\n"
      "                              and are restored from there, also after a restart\n"
      "                              (one server per DIR; docs/disk-cache.md)\n"
      "  --disk-cache-gib F          DIR's byte budget, least recently used files go first\n"
      "  --kv-cache-dtype auto|fp8   fp8 (or fp8_e4m3): K/V pages in e4m3 with a scale per\n"
      "                              token and head, twice the tokens (docs/fp8.md; auto)\n"
      "  --skip-tokenizer-init       no tokenizer: /v1/completions with token-id prompts only\n"
      "  --batch-invariant           a request's tokens do not depend on what shares its\n"
      "                              steps (CUDA: slower GEMMs; the CPU always is)\n"
      "  --max-request-bytes N       largest request body accepted (33554432)\n"
      "  --shutdown-grace S          seconds in-flight requests may finish after SIGTERM (5)\n"
      "  --chat-template FILE        the Jinja chat template (default: the model folder's\n"
      "                              chat_template.jinja, else tokenizer_config.json's, else\n"
      "                              the built-in one of the model type)\n"
      "  --generation-config auto|vllm|DIR\n"
      "                              defaults for the sampling fields a request leaves out\n"
      "                              (temperature, top_p, top_k, min_p, repetition_penalty,\n"
      "                              max_new_tokens as max_tokens) from generation_config.json\n"
      "                              in the model folder (auto) or in DIR; vllm: none (auto)\n"
      "  --log-level LEVEL           debug, info (default), warning (or warn), error,\n"
      "                              critical (as error): the lowest level logged\n"
      "  --disable-log-requests      no line per finished request (id, route, status,\n"
      "                              prompt / cached / generated tokens, TTFT, duration,\n"
      "                              finish reason)\n"
      "  --disable-log-stats         no periodic line (throughput, running / waiting,\n"
      "                              KV cache usage, prefix cache hit rate)\n"
      "  --log-stats-interval S      seconds between the periodic lines, logged while the\n"
      "                              engine has work (10)\n"
      "  --no-warmup                 skip the start-up forward of the largest step (device\n"
      "                              backends run it so that a plan that does not fit fails\n"
      "                              at start and device memory stays flat under load)\n"
      "%s"
      "\n"
      "engine and cache:\n"
      "%s"
      "\n"
      "vLLM's flags without an effect here (accepted with a log line) or refused:\n",
      cli_load_help, cli_flags_engine_help);
  cli_vllm_usage(f);
}

static int serve_parse_long(const char *flag, const char *v, long long lo, long long hi,
                            long long *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "deltaserve serve: %s: expected an integer in [%lld, %lld], got '%s'\n", flag,
            lo, hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

static int serve_is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* a and b name the same file (the same text when either does not resolve) */
static int serve_same_path(const char *a, const char *b) {
  char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
  int same = ra && rb ? !strcmp(ra, rb) : !strcmp(a, b);
  free(ra);
  free(rb);
  return same;
}

static const char *serve_basename(const char *p) {
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/') n--;
  static char buf[256];
  size_t i = n;
  while (i > 0 && p[i - 1] != '/') i--;
  snprintf(buf, sizeof buf, "%.*s", (int)(n - i), p + i);
  return buf[0] ? buf : p;
}

/* Logs a fault fire (DS_FAULT): the first 16, then every power of two, so a sticky fault on a
 * hot site cannot flood the log. */
static void serve_fault_hook(const char *site, long hit, long fire) {
  if (fire <= 16 || (fire & (fire - 1)) == 0)
    fprintf(stderr, "deltaserve: fault fired at %s (hit %ld, fire %ld)\n", site, hit, fire);
}

static double serve_mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* response_format json_object's / json_schema's vocabulary: each of the model's n_vocab ids as the
 * bytes the tokenizer decodes it to (ids past the tokenizer's none), its added tokens (never inside
 * the JSON: special ones and control tags such as <think> or <tool_call>), and the model's end
 * tokens (the ones the engine stops on; the tokenizer's eos when the config names none). NULL when
 * there is no tokenizer, no end token, or no memory: both are then refused. */
static json_vocab *serve_json_vocab(const tokenizer *tok, int n_vocab, const model_config *cfg) {
  if (!tok || n_vocab <= 0) return NULL;
  int32_t eos[CONFIG_MAX_EOS + 1];
  int n_eos = 0;
  for (int i = 0; i < cfg->n_eos; i++) eos[n_eos++] = cfg->eos_token_ids[i];
  if (n_eos == 0 && tokenizer_eos_token(tok)) {
    int id = tokenizer_token_id(tok, tokenizer_eos_token(tok));
    if (id >= 0) eos[n_eos++] = id;
  }
  if (n_eos == 0) return NULL;
  const char **bytes = calloc((size_t)n_vocab, sizeof *bytes);
  size_t *lens = calloc((size_t)n_vocab, sizeof *lens);
  unsigned char *special = calloc((size_t)n_vocab, 1);
  json_vocab *v = NULL;
  if (bytes && lens && special) {
    int nt = tokenizer_vocab_size(tok);
    for (int i = 0; i < n_vocab && i < nt; i++) {
      if (tokenizer_token_bytes(tok, i, &bytes[i], &lens[i])) bytes[i] = NULL, lens[i] = 0;
      special[i] =
          (unsigned char)(tokenizer_is_added(tok, i) != 0); /* <think>, <tool_call>... too */
    }
    v = json_vocab_new(n_vocab, bytes, lens, special, eos, n_eos);
  }
  free(bytes);
  free(lens);
  free(special);
  return v;
}

int cmd_serve(int argc, char **argv) {
  const char *model_arg = NULL; /* MODEL, positional */
  const char *model_dir = NULL, *host = "127.0.0.1", *name = NULL, *api_key = NULL,
             *device = "auto", *gen_cfg = "auto", *chat_tpl = NULL, *metrics_prefix = "deltaserve";
  long long port = 8000, threads = 0, max_req = 32LL << 20;
  int batch_invariant = 0, no_warmup = 0;
  int tp = 1;                                  /* --tensor-parallel-size */
  backend_kv_dtype kv_dtype = BACKEND_KV_AUTO; /* --kv-cache-dtype */
  const char *kv_dtype_name = "auto";          /* ... as given (/metrics cache_config_info) */
  double grace = 5.0;
  int skip_tok = 0;
  int metrics_key = 0; /* --metrics-require-api-key */
  /* --kv-events-config and its publisher (NULL: no KV-cache events) */
  const char *kv_events_json = NULL;
  kv_events *kvev = NULL;
  /* --served-model-name's second and later values; CORS lists (--allowed-*) */
  const char *aliases[16];
  int n_aliases = 0, cors_cred = 0;
  const char *cors_raw[3] = {NULL, NULL, NULL}; /* read just before the server starts */
  char **cors[3] = {NULL, NULL, NULL};
  int n_cors[3] = {0, 0, 0};
  static const char *const cors_flags[3] = {"--allowed-origins", "--allowed-methods",
                                            "--allowed-headers"};
  int no_log_requests = 0, no_log_stats = 0;
  double stats_interval = 10.0; /* --log-stats-interval */
  engine_opts eo;
  engine_opts_default(&eo);
  weights_opts wo = {0}; /* --quantization, --load-format */
  char err[512];

  for (int i = 1; i < argc; i++) {
    err[0] = 0;
    int rc = cli_flags_engine(&eo, argc, argv, &i, err, sizeof err);
    if (rc < 0) {
      fprintf(stderr, "deltaserve serve: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    if ((rc = cli_load_flag(&wo, argc, argv, &i, err, sizeof err)) < 0 ||
        (rc == 0 && (rc = cli_flags_tp(&tp, argc, argv, &i, err, sizeof err)) < 0)) {
      fprintf(stderr, "deltaserve serve: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      serve_usage(stdout);
      return 0;
    }
    if (a[0] != '-') { /* MODEL, as `vllm serve MODEL` */
      if (model_arg) {
        fprintf(stderr, "deltaserve serve: unexpected argument '%s' (the model is '%s')\n", a,
                model_arg);
        return 2;
      }
      model_arg = a;
      continue;
    }
    const struct {
      const char *name;
      int *on;
    } switches[] = {
        {"--skip-tokenizer-init", &skip_tok},         {"--batch-invariant", &batch_invariant},
        {"--disable-log-requests", &no_log_requests}, {"--disable-log-stats", &no_log_stats},
        {"--allow-credentials", &cors_cred},          {"--no-warmup", &no_warmup}};
    int sw = 0;
    for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++)
      if (!strcmp(a, switches[k].name)) *switches[k].on = sw = 1;
    if (sw) continue;
    if (!strcmp(a, "--metrics-require-api-key")) {
      metrics_key = 1;
      continue;
    }
    static const char *with_value[] = {"--model",
                                       "--host",
                                       "--kv-events-config",
                                       "--port",
                                       "--served-model-name",
                                       "--api-key",
                                       "--device",
                                       "--threads",
                                       "--max-request-bytes",
                                       "--shutdown-grace",
                                       "--generation-config",
                                       "--chat-template",
                                       "--log-level",
                                       "--log-stats-interval",
                                       "--metrics-prefix",
                                       "--allowed-origins",
                                       "--allowed-methods",
                                       "--allowed-headers",
                                       "--kv-cache-dtype",
                                       "--disk-cache-dir",
                                       "--disk-cache-gib"};
    int known = 0;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
      known |= !strcmp(a, with_value[k]);
    if (!known) {
      int vrc = cli_vllm_flag(argc, argv, &i, err, sizeof err);
      if (vrc > 0) continue;
      if (vrc < 0)
        fprintf(stderr, "deltaserve serve: %s\n", err);
      else
        fprintf(stderr, "deltaserve serve: unknown flag '%s' (see deltaserve serve --help)\n", a);
      return 2;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "deltaserve serve: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--model"))
      model_dir = v;
    else if (!strcmp(a, "--host"))
      host = v;
    else if (!strcmp(a, "--kv-events-config"))
      kv_events_json = v;
    else if (!strcmp(a, "--served-model-name")) {
      name = v; /* several values, as vLLM's nargs="+": the first is reported */
      n_aliases = 0;
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        if (n_aliases == (int)(sizeof aliases / sizeof *aliases)) {
          fprintf(stderr, "deltaserve serve: --served-model-name: at most %d names\n",
                  (int)(sizeof aliases / sizeof *aliases) + 1);
          return 2;
        }
        aliases[n_aliases++] = argv[++i];
      }
    } else if (!strncmp(a, "--allowed-", 10)) {
      cors_raw[!strcmp(a, cors_flags[0]) ? 0 : !strcmp(a, cors_flags[1]) ? 1 : 2] = v;
    } else if (!strcmp(a, "--api-key"))
      api_key = v;
    else if (!strcmp(a, "--device"))
      device = v;
    else if (!strcmp(a, "--generation-config"))
      gen_cfg = v;
    else if (!strcmp(a, "--chat-template"))
      chat_tpl = v;
    else if (!strcmp(a, "--metrics-prefix")) {
      /* a Prometheus name part: the names stay valid */
      int ok = (v[0] >= 'a' && v[0] <= 'z') || (v[0] >= 'A' && v[0] <= 'Z') || v[0] == '_';
      for (const char *c = v; *c && ok; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
             *c == '_';
      if (!ok || strlen(v) > 40) {
        fprintf(stderr,
                "deltaserve serve: --metrics-prefix: expected a name of letters, digits and '_' "
                "(at most 40, not starting with a digit), got '%s'\n",
                v);
        return 2;
      }
      metrics_prefix = v;
    } else if (!strcmp(a, "--log-level")) {
      log_level lv;
      if (log_level_parse(v, &lv)) {
        fprintf(stderr,
                "deltaserve serve: --log-level: expected debug, info, warning, error or critical, "
                "got '%s'\n",
                v);
        return 2;
      }
      log_set_level(lv);
    } else if (!strcmp(a, "--log-stats-interval")) {
      if (cli_flags_double(v, a, 0.01, 86400, &stats_interval, err, sizeof err)) {
        fprintf(stderr, "deltaserve serve: %s\n", err);
        return 2;
      }
    } else if (!strcmp(a, "--disk-cache-dir")) {
      eo.disk_cache_dir = v;
    } else if (!strcmp(a, "--disk-cache-gib")) {
      if (cli_flags_double(v, a, 1e-6, 1e6, &eo.disk_cache_gib, err, sizeof err)) {
        fprintf(stderr, "deltaserve serve: %s\n", err);
        return 2;
      }
    } else if (!strcmp(a, "--kv-cache-dtype")) {
      if (cli_vllm_kv_cache_dtype(v, &kv_dtype, err, sizeof err)) {
        fprintf(stderr, "deltaserve serve: %s\n", err);
        return 2;
      }
      kv_dtype_name = v;
    } else if (!strcmp(a, "--port")) {
      if (serve_parse_long(a, v, 0, 65535, &port)) return 2;
    } else if (!strcmp(a, "--threads")) {
      if (serve_parse_long(a, v, 0, 1024, &threads)) return 2;
    } else if (!strcmp(a, "--max-request-bytes")) {
      if (cli_flags_size(v, a, 1024, 1LL << 40, &max_req, err, sizeof err)) {
        fprintf(stderr, "deltaserve serve: %s\n", err);
        return 2;
      }
    } else if (!strcmp(a, "--shutdown-grace")) {
      char *end;
      grace = strtod(v, &end);
      if (*end || end == v || !(grace >= 0 && grace <= 3600)) {
        fprintf(stderr,
                "deltaserve serve: --shutdown-grace: expected seconds in [0, 3600], got '%s'\n", v);
        return 2;
      }
    }
  }
  if (cli_vllm_check_tp(argc, argv, tp, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    return 2;
  }
  if (model_arg && model_dir && !serve_same_path(model_arg, model_dir)) {
    fprintf(stderr, "deltaserve serve: two models given: '%s' and --model '%s'\n", model_arg,
            model_dir);
    return 2;
  }
  kv_events_config kv_cfg = {0}; /* --kv-events-config, checked before anything loads */
  if (kv_events_json && (kv_events_config_parse(kv_events_json, &kv_cfg, err, sizeof err) != 0 ||
                         (kv_cfg.enable && kv_cfg.publisher_zmq && !eo.enable_prefix_caching &&
                          errf(err, sizeof err,
                               "--kv-events-config: the events come from the prefix cache, which "
                               "--no-enable-prefix-caching turns off")))) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    return 2;
  }
  /* --disk-cache-dir / -gib, checked before anything loads (the directory and its lock are
   * taken when the engine starts) */
  const char *disk_err = !eo.disk_cache_dir && eo.disk_cache_gib > 0
                             ? "--disk-cache-gib needs --disk-cache-dir"
                         : eo.disk_cache_dir && eo.disk_cache_gib <= 0
                             ? "--disk-cache-dir needs --disk-cache-gib F (its byte budget)"
                         : eo.disk_cache_dir && !eo.enable_prefix_caching
                             ? "--disk-cache-dir needs the prefix cache, which "
                               "--no-enable-prefix-caching turns off"
                             : NULL;
  if (disk_err) {
    fprintf(stderr, "deltaserve serve: %s\n", disk_err);
    return 2;
  }
  if (model_arg) model_dir = model_arg;
  if (!api_key) { /* vLLM's VLLM_API_KEY, and deltaserve's own name first */
    static const char *const key_vars[] = {"DELTASERVE_API_KEY", "VLLM_API_KEY"};
    for (size_t k = 0; k < sizeof key_vars / sizeof *key_vars && !api_key; k++) {
      const char *v = getenv(key_vars[k]);
      if (v && v[0]) {
        api_key = v;
        log_info("API key from $%s", key_vars[k]);
      }
    }
  }
  if (!model_dir) {
    model_dir = SERVE_DEMO_MODEL;
    if (!serve_is_dir(model_dir)) {
      fprintf(stderr,
              "deltaserve serve: no model given and the demo model %s is missing: run `make run` "
              "(or bash scripts/demo.sh) to create it, or name a model folder (serve DIR)\n",
              model_dir);
      return 1;
    }
  } else if (model_check_path(model_dir, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    return 1;
  } else if (!serve_is_dir(model_dir)) {
    /* "org/name", as vLLM takes a Hugging Face id: say how to fetch it */
    const char *slash = strchr(model_dir, '/');
    int hub_id = model_dir[0] != '/' && model_dir[0] != '.' && slash && slash > model_dir &&
                 slash[1] && !strchr(slash + 1, '/');
    fprintf(stderr,
            "deltaserve serve: model %s: no such folder (a local folder of config.json, "
            "*.safetensors and tokenizer files%s%s%s)\n",
            model_dir, hub_id ? "; fetch it with `huggingface-cli download " : "",
            hub_id ? model_dir : "", hub_id ? " --local-dir DIR` and serve DIR" : "");
    return 1;
  }
  if (!name) name = serve_basename(model_dir);
  /* the sampling defaults (vLLM's --generation-config): read before anything starts, so a
   * broken file is a start-up error */
  generation_config gen;
  memset(&gen, 0, sizeof gen);
  const char *gen_dir = !strcmp(gen_cfg, "auto")   ? model_dir
                        : !strcmp(gen_cfg, "vllm") ? NULL
                                                   : gen_cfg;
  if (gen_dir && !serve_is_dir(gen_dir)) {
    fprintf(stderr, "deltaserve serve: --generation-config %s: not auto, vllm or a folder\n",
            gen_cfg);
    return 2;
  }
  if (gen_dir && generation_config_load(gen_dir, &gen, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: --generation-config: %s\n", err);
    return 1;
  }
  if (eo.spec.method == SPEC_METHOD_MTP) { /* refused before anything loads: no MTP head */
    char cpath[4096];
    model_config mc;
    snprintf(cpath, sizeof cpath, "%s/config.json", model_dir);
    if (config_load(cpath, &mc, err, sizeof err) == 0 && mc.mtp_layers < 1) {
      fprintf(stderr,
              "deltaserve serve: --speculative-config: method \"mtp\" needs a checkpoint with an "
              "MTP head (mtp_num_hidden_layers); %s has none\n",
              model_dir);
      return 2;
    }
  }

  /* Signals are taken by sigwait in this thread only: block them before any thread starts. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  for (int k = 0; k < 3; k++)
    if (cors_raw[k] &&
        cli_flags_json_list(cors_raw[k], cors_flags[k], &cors[k], &n_cors[k], err, sizeof err)) {
      fprintf(stderr, "deltaserve serve: %s\n", err);
      for (int j = 0; j < k; j++) cli_flags_list_free(cors[j], n_cors[j]);
      return 2;
    }
  server_opts so = {.host = host,
                    .port = (int)port,
                    .served_model_name = name,
                    .model_path = model_dir,
                    .api_key = api_key,
                    .max_request_bytes = (size_t)max_req,
                    .metrics_require_api_key = metrics_key,
                    .disable_log_requests = no_log_requests,
                    .log_stats_interval_s = no_log_stats ? 0.0 : stats_interval,
                    .metrics_prefix = metrics_prefix,
                    .model_aliases = aliases,
                    .n_model_aliases = n_aliases,
                    .cors_origins = (const char *const *)cors[0],
                    .n_cors_origins = n_cors[0],
                    .cors_methods = (const char *const *)cors[1],
                    .n_cors_methods = n_cors[1],
                    .cors_headers = (const char *const *)cors[2],
                    .n_cors_headers = n_cors[2],
                    .cors_credentials = cors_cred,
                    .gpu_memory_utilization = eo.gpu_memory_utilization,
                    .kv_cache_dtype = kv_dtype_name};
  server *srv = NULL;
  if (server_start(&srv, &so, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    for (int k = 0; k < 3; k++) cli_flags_list_free(cors[k], n_cors[k]);
    return 1;
  }
  /* the URL's host: an IPv6 address in brackets */
  char url_host[80];
  snprintf(url_host, sizeof url_host, strchr(host, ':') && host[0] != '[' ? "[%s]" : "%s", host);
  fprintf(stderr, "deltaserve: loading %s (port %d bound: /health answers 503 until ready)\n",
          model_dir, server_port(srv));
  fflush(stderr);

  int status = 1;
  model_config cfg;
  model_weights w;
  int have_w = 0;
  tokenizer *tok = NULL;
  backend *be = NULL; /* rank 0 of ranks (the one that holds the logits) */
  backend *ranks[CLI_FLAGS_TP_MAX];
  int n_ranks = 0;
  qwen35 *m = NULL;
  engine *e = NULL;
  json_vocab *jv = NULL;
  chat_jinja *chat = NULL;
  qwen35_mem_opts mo;
  int32_t eos[CONFIG_MAX_EOS + 1];
  int n_eos = 0;
  const char *fault_spec = NULL;

  wo.mtp = eo.spec.method == SPEC_METHOD_MTP; /* the MTP head, read by engine_create */
  eo.mtp_weights = &w;
  if (model_load_with(model_dir, &wo, &cfg, &w, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    goto done;
  }
  have_w = 1;
  chat_template_kind builtin = chat_template_detect(NULL, cfg.model_type);
  if (chat_jinja_load(&chat, model_dir, chat_tpl, builtin, err, sizeof err)) {
    fprintf(stderr, "deltaserve serve: chat template: %s\n", err);
    goto done;
  }
  fprintf(stderr, "deltaserve: chat template: %s\n", chat_jinja_origin(chat));
  if (!skip_tok) {
    char terr[512] = "";
    tok = tokenizer_load(model_dir, terr, sizeof terr);
    if (!tok)
      fprintf(stderr,
              "deltaserve: no tokenizer (%s): serving /v1/completions with token-id prompts only\n",
              terr);
  }
  backend_options bo = {.device = device,
                        .n_threads = (int)threads,
                        .batch_invariant = batch_invariant,
                        .kv_dtype = kv_dtype,
                        .tensor_parallel_size = tp};
  if ((n_ranks = backend_create_ranks(&bo, ranks, CLI_FLAGS_TP_MAX, err, sizeof err)) > 0)
    be = ranks[0];
  else
    n_ranks = 0;
  if (!be) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    goto done;
  }
  /* device backends: the largest step once at start-up (engine_opts.startup_forward) */
  eo.startup_forward = !no_warmup && be->mem_info != NULL;
  if (eo.disk_cache_dir) { /* what a checkpoint file must have been written under */
    char id[160];
    char tps[32] = ""; /* a rank's slot and page bytes are its shard's */
    if (n_ranks > 1) snprintf(tps, sizeof tps, " tp=%d", n_ranks);
    snprintf(id, sizeof id, "backend=%s%s kv=%d fp8=%d dummy=%d seed=%llu", be->name, tps,
             (int)kv_dtype, wo.quantize_fp8, wo.dummy, (unsigned long long)wo.seed);
    eo.model_identity = disk_tier_identity(model_dir, id);
  }
  /* the publisher starts before the engine and stops after it */
  if (kv_events_json && kv_cfg.enable && kv_cfg.publisher_zmq) {
    if (kv_events_init(&kvev, &kv_cfg, err, sizeof err) != 0) {
      fprintf(stderr, "deltaserve serve: %s\n", err);
      goto done;
    }
    fprintf(stderr, "deltaserve: KV-cache events on %s\n", kv_cfg.endpoint);
    eo.kv_events = kvev;
  }
  if (engine_mem_plan_device(&eo, &cfg, &w, ranks, n_ranks, &mo, err, sizeof err) ||
      qwen35_init_ranks(&m, &cfg, &w, ranks, n_ranks, &mo, err, sizeof err) ||
      !(e = engine_create(m, &eo, err, sizeof err))) {
    fprintf(stderr, "deltaserve serve: %s\n", err);
    goto done;
  }
  for (int i = 0; i < cfg.n_eos; i++) eos[n_eos++] = cfg.eos_token_ids[i];
  if (tok && tokenizer_eos_token(tok)) {
    int id = tokenizer_token_id(tok, tokenizer_eos_token(tok));
    if (id >= 0) eos[n_eos++] = id;
  }

  engine_stats st;
  engine_get_stats(e, &st);
  size_t slot_b = qwen35_slot_bytes(m), page_b = qwen35_page_bytes(m);
  fprintf(stderr, "deltaserve: model %s (%s, %d layers, hidden %d, vocab %d) as '%s'%s\n",
          model_dir, cfg.model_type, cfg.n_layers, cfg.hidden_size, cfg.vocab_size, name,
          tok ? "" : ", no tokenizer");
  fprintf(stderr,
          "deltaserve: memory: weights %.1f MiB, KV pages %d x %.2f MiB = %.1f MiB (%d tokens), "
          "state slots %d x "
          "%.2f MiB = %.1f MiB, snapshot slabs %d x %.2f MiB = %.1f MiB\n",
          serve_mib((double)qwen35_weight_bytes(m)), st.kv_pages_total, serve_mib((double)page_b),
          serve_mib((double)page_b * st.kv_pages_total), st.kv_pages_total * QWEN35_PAGE_TOKENS,
          st.slots_total, serve_mib((double)slot_b), serve_mib((double)slot_b * st.slots_total),
          st.snapshot_slabs_total, serve_mib((double)slot_b),
          serve_mib((double)slot_b * st.snapshot_slabs_total));
  fprintf(stderr,
          "deltaserve: limits: max_model_len %d, max_num_seqs %d (concurrency is capped by %d "
          "state slots), "
          "max_num_batched_tokens %d, prefix caching %s\n",
          st.max_model_len, eo.max_num_seqs, st.slots_total, eo.max_num_batched_tokens,
          eo.enable_prefix_caching ? "on" : "off");

  jv = serve_json_vocab(tok, cfg.vocab_size, &cfg);
  if (tok && !jv)
    fprintf(stderr,
            "deltaserve: response_format json_object / json_schema unavailable (no end token "
            "or no memory)\n");
  server_model sm = {.eng = e,
                     .tok = tok,
                     .chat = chat,
                     .tmpl = builtin,
                     .vocab_size = cfg.vocab_size,
                     .max_model_len = st.max_model_len,
                     .eos_ids = eos,
                     .n_eos = n_eos,
                     .json = jv,
                     .gen = gen.has ? &gen : NULL};
  if (gen.has) {
    char d[256];
    generation_config_describe(&gen, d, sizeof d);
    fprintf(stderr,
            "deltaserve: sampling defaults from %s/generation_config.json for requests that leave "
            "them out: "
            "%s (--generation-config vllm: none)\n",
            gen_dir, d);
  }
  fault_spec = getenv("DS_FAULT");
  if (fault_spec && fault_spec[0]) {
    if (fault_arm_spec(fault_spec, err, sizeof err)) {
      fprintf(stderr, "deltaserve serve: DS_FAULT: %s\n", err);
      goto done;
    }
    fault_set_hook(serve_fault_hook);
    fprintf(stderr, "deltaserve: DS_FAULT armed: %s (test-only fault injection)\n", fault_spec);
  }
  server_set_model(srv, &sm);
  /* printed once requests are served, so that a supervisor reading it can send them */
  fprintf(stderr, "deltaserve: listening on http://%s:%d (ready: /v1, model '%s')\n", url_host,
          server_port(srv), name);
  fflush(stderr);
  status = 0;

done:;
  int sig = 0;
  if (status == 0) {
    sigwait(&sigs, &sig);
    fprintf(stderr, "deltaserve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  }
  server_shutdown(srv, status == 0 ? grace : 0.0);
  if (e) engine_destroy(e, 0);
  kv_events_free(kvev); /* after the engine: its last reports go out */
  server_free(srv);
  for (int k = 0; k < 3; k++) cli_flags_list_free(cors[k], n_cors[k]);
  json_vocab_free(jv);
  chat_jinja_free(chat);
  if (m) qwen35_free(m);
  for (int r = 0; r < n_ranks; r++) ranks[r]->destroy(ranks[r]);
  if (tok) tokenizer_free(tok);
  if (have_w) weights_free(&w);
  if (fault_spec && fault_spec[0] && status == 0) {
    fault_disarm();
    fprintf(stderr, "deltaserve: faults fired: %ld of %ld hits\n", fault_fire_count(),
            fault_count());
  }
  if (status == 0) fprintf(stderr, "deltaserve: stopped\n");
  return status;
}
