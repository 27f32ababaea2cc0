/* cmd_run — `deltaserve run`: offline greedy generation on the CPU backend.
 *
 *   deltaserve run --model DIR --prompt-ids "1,2,3" --max-tokens N [--logits-out FILE]
 *                  [--threads N]
 *
 * Prefills the prompt in one piece, then runs 1-token decode steps, and prints the N generated
 * ids space-separated on one line. --logits-out writes little-endian float32 logits for every
 * prompt position, [n_prompt, vocab_size] row-major. With --prompts-file the engine runs
 * instead (cmd_run_batch). Errors: one line on stderr, exit 1. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/backend_create.h"
#include "cli/cli.h"
#include "cli/cli_flags.h"
#include "cli/cli_load.h"
#include "model/qwen35.h"

static int parse_ids(const char *s, int32_t **out, int *n) {
  int cap = 16, k = 0;
  int32_t *v = malloc(sizeof *v * (size_t)cap);
  if (!v) return -1;
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (end == p || errno || x < 0 || x > INT32_MAX) {
      free(v);
      return -1;
    }
    if (k == cap) {
      cap *= 2;
      int32_t *nv = realloc(v, sizeof *v * (size_t)cap);
      if (!nv) {
        free(v);
        return -1;
      }
      v = nv;
    }
    v[k++] = (int32_t)x;
    p = end;
    while (*p == ' ') p++;
    if (*p && *p != ',') {
      free(v);
      return -1;
    }
  }
  *out = v;
  *n = k;
  return 0;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

int cmd_run(int argc, char **argv) {
  const char *model = NULL, *ids = NULL, *logits_out = NULL, *device = "cpu";
  long max_tokens = -1, threads = 0;
  int tp = 1;            /* --tensor-parallel-size */
  weights_opts wo = {0}; /* --quantization, --load-format */
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--prompts-file")) return cmd_run_batch(argc, argv);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf(
          "usage: deltaserve run --model DIR --prompt-ids \"1,2,3\" --max-tokens N "
          "[--logits-out FILE] [--threads N] [--device cpu|cuda|auto]\n"
          "       [--quantization fp8] [--load-format auto|safetensors|dummy]\n"
          "       [--tensor-parallel-size N]  (-tp N: N ranks, docs/tensor-parallel.md)\n"
          "       (--device defaults to cpu, the fp32 reference)\n"
          "       deltaserve run --prompts-file FILE ...  (the engine, see run_batch)\n");
      return 0;
    }
    char lerr[256];
    int lf = cli_load_flag(&wo, argc, argv, &i, lerr, sizeof lerr);
    if (lf < 0) {
      fprintf(stderr, "deltaserve run: %s\n", lerr);
      return 1;
    }
    if (lf) continue;
    if ((lf = cli_flags_tp(&tp, argc, argv, &i, lerr, sizeof lerr)) < 0) {
      fprintf(stderr, "deltaserve run: %s\n", lerr);
      return 1;
    }
    if (lf) continue;
    if (i + 1 >= argc) {
      fprintf(stderr, "deltaserve run: %s needs a value\n", a);
      return 1;
    }
    const char *val = argv[++i];
    char *end;
    if (!strcmp(a, "--model")) {
      model = val;
    } else if (!strcmp(a, "--prompt-ids")) {
      ids = val;
    } else if (!strcmp(a, "--logits-out")) {
      logits_out = val;
    } else if (!strcmp(a, "--max-tokens")) {
      long long n;
      char err[256];
      if (cli_flags_size(val, a, 0, 1000000, &n, err, sizeof err)) {
        fprintf(stderr, "deltaserve run: %s\n", err);
        return 1;
      }
      max_tokens = (long)n;
    } else if (!strcmp(a, "--device")) {
      device = val;
    } else if (!strcmp(a, "--threads")) {
      threads = strtol(val, &end, 10);
      if (*end || threads < 0 || threads > 1024) {
        fprintf(stderr, "deltaserve run: bad --threads '%s'\n", val);
        return 1;
      }
    } else {
      fprintf(stderr, "deltaserve run: unknown flag '%s'\n", a);
      return 1;
    }
  }
  if (!model || !ids || max_tokens < 0) {
    fprintf(stderr, "deltaserve run: need --model DIR --prompt-ids IDS --max-tokens N\n");
    return 1;
  }
  int32_t *prompt = NULL;
  int n_prompt = 0;
  if (parse_ids(ids, &prompt, &n_prompt) || n_prompt == 0) {
    fprintf(stderr, "deltaserve run: bad --prompt-ids '%s' (comma-separated ids)\n", ids);
    free(prompt);
    return 1;
  }

  int rc = 1;
  char err[512] = "";
  model_config cfg;
  model_weights w;
  memset(&w, 0, sizeof w);
  backend *ranks[CLI_FLAGS_TP_MAX];
  int n_ranks = 0;
  qwen35 *m = NULL;
  float *logits = NULL;
  int32_t *pages = NULL, *out = NULL;
  FILE *lf = NULL;
  if (model_load_with(model, &wo, &cfg, &w, err, sizeof err)) {
    fprintf(stderr, "deltaserve run: %s\n", err);
    free(prompt);
    return 1;
  }
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] >= cfg.vocab_size) {
      fprintf(stderr, "deltaserve run: prompt id %d is outside the vocabulary (%d)\n", prompt[i],
              cfg.vocab_size);
      goto done;
    }
  backend_options bo = {.device = device, .n_threads = (int)threads, .tensor_parallel_size = tp};
  n_ranks = backend_create_ranks(&bo, ranks, CLI_FLAGS_TP_MAX, err, sizeof err);
  if (n_ranks < 0) {
    n_ranks = 0;
    fprintf(stderr, "deltaserve run: %s\n", err);
    goto done;
  }
  int total = n_prompt + (int)max_tokens;
  int n_pages = (total + QWEN35_PAGE_TOKENS - 1) / QWEN35_PAGE_TOKENS + 1;
  qwen35_mem_opts mo = {.n_pages = n_pages, .n_slots = 1};
  if (qwen35_init_ranks(&m, &cfg, &w, ranks, n_ranks, &mo, err, sizeof err)) {
    fprintf(stderr, "deltaserve run: %s\n", err);
    goto done;
  }
  pages = malloc(sizeof *pages * (size_t)n_pages);
  out = malloc(sizeof *out * (size_t)(max_tokens + 1));
  size_t V = (size_t)cfg.vocab_size;
  logits = malloc(sizeof *logits * V * (size_t)(logits_out ? n_prompt : 1));
  if (!pages || !out || !logits) {
    fprintf(stderr, "deltaserve run: out of memory\n");
    goto done;
  }
  for (int i = 0; i < n_pages; i++) pages[i] = i;
  if (qwen35_slot_zero(m, 0)) {
    fprintf(stderr, "deltaserve run: backend failure\n");
    goto done;
  }
  fwd_seq s = {.tokens = prompt,
               .n_tokens = n_prompt,
               .pos = 0,
               .pages = pages,
               .n_pages = n_pages,
               .slot = 0,
               .logits = logits_out ? QWEN35_LOGITS_ALL : QWEN35_LOGITS_LAST,
               -1};
  if (qwen35_forward(m, &s, 1, logits, err, sizeof err)) {
    fprintf(stderr, "deltaserve run: %s\n", err);
    goto done;
  }
  if (logits_out) {
    lf = fopen(logits_out, "wb");
    if (!lf || fwrite(logits, sizeof(float), V * (size_t)n_prompt, lf) != V * (size_t)n_prompt ||
        fclose(lf) != 0) {
      lf = NULL;
      fprintf(stderr, "deltaserve run: cannot write %s: %s\n", logits_out, strerror(errno));
      goto done;
    }
    lf = NULL;
  }
  int n_out = 0;
  if (max_tokens > 0) {
    int tok = argmax(logits + (logits_out ? V * (size_t)(n_prompt - 1) : 0), (int)V);
    out[n_out++] = tok;
    while (n_out < max_tokens) {
      fwd_seq d = {.tokens = &out[n_out - 1],
                   .n_tokens = 1,
                   .pos = n_prompt + n_out - 1,
                   .pages = pages,
                   .n_pages = n_pages,
                   .slot = 0,
                   .logits = QWEN35_LOGITS_LAST,
                   -1};
      if (qwen35_forward(m, &d, 1, logits, err, sizeof err)) {
        fprintf(stderr, "deltaserve run: %s\n", err);
        goto done;
      }
      out[n_out++] = argmax(logits, (int)V);
    }
  }
  for (int i = 0; i < n_out; i++) printf(i ? " %d" : "%d", out[i]);
  printf("\n");
  fflush(stdout);
  rc = 0;
done:
  if (lf) fclose(lf);
  free(logits);
  free(pages);
  free(out);
  qwen35_free(m);
  for (int r = 0; r < n_ranks; r++) ranks[r]->destroy(ranks[r]);
  weights_free(&w);
  free(prompt);
  return rc;
}
