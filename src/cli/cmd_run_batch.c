/* cmd_run_batch — `deltaserve run --model DIR --prompts-file F [engine flags] [--threads N]`:
 * reads JSON lines {"prompt_ids": [...], "max_tokens": N, "temperature", "top_p", "top_k",
 * "min_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty",
 * "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs", "cache_salt" (a prefix-cache
 * namespace), "boundaries" (chat-message start positions: prefix-cache capture points)}
 * (defaults as in vLLM:
 * temperature 1, max_tokens 16), runs them all concurrently through the engine on the --device
 * backend (cpu, the default, cuda or auto), and prints one JSON line per input, in input order:
 *   {"token_ids": [...], "finish_reason": "stop"|"length"|"error", "prompt_tokens": n,
 *    "completion_tokens": n, "cached_tokens": n[, "logprobs": [...]][, "error": "..."]}
 * (cached_tokens: prompt tokens restored from the prefix cache). The requests are submitted
 * in input order, so a later line can hit what an earlier one cached. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_create.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/cli_flags.h"
#include "cli/cli_load.h"
#include "engine/engine.h"
#include "engine/engine_mem.h"
#include "model/weights.h"

typedef struct run_item {
  int32_t *prompt;
  int n_prompt;
  sampling_params sp;
  char *salt;      /* cache_salt, NULL: shared */
  int32_t *bounds; /* boundaries */
  int n_bounds;
  engine_req *h;
  char err[200];
} run_item;

static int run_batch_num(json_t *o, const char *key, double *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return -1;
  *out = json_number_value(v);
  return 1;
}

/* Parses one input line into it. Returns 0 or -1 with it->err. */
static int run_batch_parse(const char *line, run_item *it) {
  json_error_t je;
  json_t *o = json_loads(line, 0, &je);
  if (!o || !json_is_object(o)) {
    json_decref(o);
    return errf(it->err, sizeof it->err, "invalid JSON: %s", je.text);
  }
  int rc = -1;
  sampling_params *sp = &it->sp;
  sampling_params_default(sp);
  json_t *ids = json_object_get(o, "prompt_ids");
  if (!json_is_array(ids) || json_array_size(ids) == 0) {
    errf(it->err, sizeof it->err, "prompt_ids must be a non-empty array of token ids");
    goto out;
  }
  it->n_prompt = (int)json_array_size(ids);
  it->prompt = malloc((size_t)it->n_prompt * sizeof *it->prompt);
  if (!it->prompt) {
    errf(it->err, sizeof it->err, "out of memory");
    goto out;
  }
  for (int i = 0; i < it->n_prompt; i++) {
    json_t *v = json_array_get(ids, (size_t)i);
    if (!json_is_integer(v)) {
      errf(it->err, sizeof it->err, "prompt_ids[%d] is not an integer", i);
      goto out;
    }
    it->prompt[i] = (int32_t)json_integer_value(v);
  }
  struct {
    const char *key;
    int kind; /* 0 float, 1 int */
    void *dst;
  } fields[] = {{"temperature", 0, &sp->temperature},
                {"top_p", 0, &sp->top_p},
                {"min_p", 0, &sp->min_p},
                {"repetition_penalty", 0, &sp->repetition_penalty},
                {"presence_penalty", 0, &sp->presence_penalty},
                {"frequency_penalty", 0, &sp->frequency_penalty},
                {"top_k", 1, &sp->top_k},
                {"max_tokens", 1, &sp->max_tokens},
                {"top_logprobs", 1, &sp->top_logprobs}};
  for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
    double d;
    int g = run_batch_num(o, fields[f].key, &d);
    if (g < 0) {
      errf(it->err, sizeof it->err, "%s must be a number", fields[f].key);
      goto out;
    }
    if (g == 0) continue;
    if (fields[f].kind == 0)
      *(float *)fields[f].dst = (float)d;
    else
      *(int *)fields[f].dst = d < -1e9 ? -1000000000 : d > 1e9 ? 1000000000 : (int)d;
  }
  json_t *seed = json_object_get(o, "seed");
  if (json_is_integer(seed)) {
    sp->seed = (uint64_t)json_integer_value(seed);
    sp->has_seed = 1;
  }
  json_t *ie = json_object_get(o, "ignore_eos");
  if (ie && json_is_true(ie)) sp->ignore_eos = 1;
  json_t *lp = json_object_get(o, "logprobs");
  if (lp && (json_is_true(lp) || (json_is_integer(lp) && json_integer_value(lp) > 0))) {
    sp->logprobs = 1;
    if (json_is_integer(lp) && !json_object_get(o, "top_logprobs"))
      sp->top_logprobs = (int)json_integer_value(lp) > 20 ? 20 : (int)json_integer_value(lp);
  }
  json_t *stops = json_object_get(o, "stop_token_ids");
  if (json_is_array(stops)) {
    size_t n = json_array_size(stops);
    if (n > SAMPLER_MAX_STOP_IDS) {
      errf(it->err, sizeof it->err, "at most %d stop_token_ids", SAMPLER_MAX_STOP_IDS);
      goto out;
    }
    for (size_t i = 0; i < n; i++)
      sp->stop_ids[sp->n_stop_ids++] = (int32_t)json_integer_value(json_array_get(stops, i));
  }
  json_t *salt = json_object_get(o, "cache_salt");
  if (salt && !json_is_null(salt)) {
    if (!json_is_string(salt) || !(it->salt = strdup(json_string_value(salt)))) {
      errf(it->err, sizeof it->err, "cache_salt must be a string");
      goto out;
    }
  }
  json_t *bnd = json_object_get(o, "boundaries");
  if (json_is_array(bnd) && json_array_size(bnd) > 0) {
    it->n_bounds = (int)json_array_size(bnd);
    it->bounds = malloc((size_t)it->n_bounds * sizeof *it->bounds);
    if (!it->bounds) {
      errf(it->err, sizeof it->err, "out of memory");
      goto out;
    }
    for (int i = 0; i < it->n_bounds; i++) {
      json_t *v = json_array_get(bnd, (size_t)i);
      if (!json_is_integer(v) || json_integer_value(v) < 0 ||
          json_integer_value(v) > it->n_prompt ||
          (i && json_integer_value(v) < it->bounds[i - 1])) {
        errf(it->err, sizeof it->err, "boundaries must be ascending positions in the prompt");
        goto out;
      }
      it->bounds[i] = (int32_t)json_integer_value(v);
    }
  }
  rc = 0;
out:
  json_decref(o);
  return rc;
}

static void run_batch_print(run_item *it) {
  json_t *o = json_object();
  json_t *ids = json_array(), *lps = it->sp.logprobs ? json_array() : NULL;
  const char *finish = "error";
  int prompt_tokens = it->n_prompt, completion = 0, cached = 0;
  if (it->h) {
    engine_event ev;
    for (;;) {
      engine_next(it->h, &ev, -1);
      if (ev.has_token) {
        json_array_append_new(ids, json_integer(ev.token));
        if (lps) {
          json_t *e = json_object();
          json_object_set_new(e, "logprob", json_real(ev.logprob));
          json_t *top = json_array();
          for (int i = 0; i < ev.n_top; i++) {
            json_t *t = json_object();
            json_object_set_new(t, "token_id", json_integer(ev.top_ids[i]));
            json_object_set_new(t, "logprob", json_real(ev.top_logprobs[i]));
            json_array_append_new(top, t);
          }
          json_object_set_new(e, "top_logprobs", top);
          json_array_append_new(lps, e);
        }
      }
      if (ev.finish) break;
    }
    finish = finish_reason_name(ev.finish);
    completion = ev.completion_tokens;
    cached = ev.cached_tokens;
    if (ev.finish == FINISH_ERROR) snprintf(it->err, sizeof it->err, "%s", ev.err);
    engine_release(it->h);
    it->h = NULL;
  }
  json_object_set_new(o, "token_ids", ids);
  json_object_set_new(o, "finish_reason", json_string(finish));
  json_object_set_new(o, "prompt_tokens", json_integer(prompt_tokens));
  json_object_set_new(o, "completion_tokens", json_integer(completion));
  json_object_set_new(o, "cached_tokens", json_integer(cached));
  if (lps) json_object_set_new(o, "logprobs", lps);
  if (it->err[0]) json_object_set_new(o, "error", json_string(it->err));
  char *s = json_dumps(o, JSON_COMPACT);
  if (s) printf("%s\n", s);
  free(s);
  json_decref(o);
}

static int run_batch_usage(void) {
  fprintf(stderr,
          "usage: deltaserve run --model DIR --prompts-file F [--max-num-seqs N] "
          "[--max-num-batched-tokens T] [--threads N] [--device cpu|cuda|auto] "
          "[--tensor-parallel-size N] [other engine "
          "flags]\n"
          "%s"
          "engine flags (as serve):\n%s",
          cli_load_help, cli_flags_engine_help);
  return 2;
}

int cmd_run_batch(int argc, char **argv) {
  const char *model_dir = NULL, *prompts = NULL;
  int threads = 0, tp = 1;    /* --threads, --tensor-parallel-size */
  const char *device = "cpu"; /* --device */
  engine_opts eo;
  engine_opts_default(&eo);
  weights_opts wo = {0}; /* --quantization, --load-format */
  /* the prefix cache is on by default, as in serve (--no-enable-prefix-caching turns it off) */
  char err[256];
  for (int i = 1; i < argc; i++) {
    int rc = cli_flags_engine(&eo, argc, argv, &i, err, sizeof err);
    if (rc < 0) {
      fprintf(stderr, "deltaserve: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    if ((rc = cli_load_flag(&wo, argc, argv, &i, err, sizeof err)) < 0 ||
        (rc == 0 && (rc = cli_flags_tp(&tp, argc, argv, &i, err, sizeof err)) < 0)) {
      fprintf(stderr, "deltaserve: %s\n", err);
      return 2;
    }
    if (rc > 0) continue;
    if (!strcmp(argv[i], "--model") && i + 1 < argc)
      model_dir = argv[++i];
    else if (!strcmp(argv[i], "--prompts-file") && i + 1 < argc)
      prompts = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc)
      device = argv[++i];
    else {
      fprintf(stderr, "deltaserve: run: unknown argument '%s'\n", argv[i]);
      return run_batch_usage();
    }
  }
  if (!model_dir || !prompts) return run_batch_usage();

  FILE *f = strcmp(prompts, "-") ? fopen(prompts, "r") : stdin;
  if (!f) {
    fprintf(stderr, "deltaserve: cannot open %s\n", prompts);
    return 1;
  }
  run_item *items = NULL;
  int n = 0, cap = 0;
  char *line = NULL;
  size_t lcap = 0;
  ssize_t len;
  while ((len = getline(&line, &lcap, f)) >= 0) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
      line[--len] = 0;
    if (len == 0) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      run_item *g = realloc(items, (size_t)cap * sizeof *items);
      if (!g) {
        fprintf(stderr, "deltaserve: out of memory\n");
        return 1;
      }
      items = g;
    }
    memset(&items[n], 0, sizeof items[n]);
    run_batch_parse(line, &items[n]);
    n++;
  }
  free(line);
  if (f != stdin) fclose(f);

  model_config cfg;
  model_weights w;
  wo.mtp = eo.spec.method == SPEC_METHOD_MTP; /* the MTP head, read by engine_create */
  eo.mtp_weights = &w;
  if (model_load_with(model_dir, &wo, &cfg, &w, err, sizeof err) != 0) {
    fprintf(stderr, "deltaserve: %s\n", err);
    return 1;
  }
  backend *ranks[CLI_FLAGS_TP_MAX];
  backend_options bo = {.device = device, .n_threads = threads, .tensor_parallel_size = tp};
  int n_ranks = backend_create_ranks(&bo, ranks, CLI_FLAGS_TP_MAX, err, sizeof err);
  qwen35_mem_opts mo;
  qwen35 *m = NULL;
  engine *e = NULL;
  int status = 1;
  if (n_ranks < 1) {
    n_ranks = 0;
    fprintf(stderr, "deltaserve: %s\n", err);
    goto done;
  }
  if (engine_mem_plan_device(&eo, &cfg, &w, ranks, n_ranks, &mo, err, sizeof err) != 0 ||
      qwen35_init_ranks(&m, &cfg, &w, ranks, n_ranks, &mo, err, sizeof err) != 0 ||
      !(e = engine_create(m, &eo, err, sizeof err))) {
    fprintf(stderr, "deltaserve: %s\n", err);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (items[i].err[0]) continue;
    engine_submit_opts so;
    memset(&so, 0, sizeof so);
    so.prompt = items[i].prompt;
    so.n_prompt = items[i].n_prompt;
    so.sp = items[i].sp;
    so.cache_salt = items[i].salt;
    so.boundaries = items[i].bounds;
    so.n_boundaries = items[i].n_bounds;
    engine_status st;
    items[i].h = engine_submit(e, &so, &st, items[i].err, sizeof items[i].err);
  }
  for (int i = 0; i < n; i++) {
    run_batch_print(&items[i]);
    fflush(stdout);
  }
  status = 0;
done:
  if (e) engine_destroy(e, 1);
  if (m) qwen35_free(m);
  for (int r = 0; r < n_ranks; r++) ranks[r]->destroy(ranks[r]);
  weights_free(&w);
  for (int i = 0; i < n; i++) {
    free(items[i].prompt);
    free(items[i].salt);
    free(items[i].bounds);
  }
  free(items);
  return status;
}
