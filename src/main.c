/* deltaserve — an inference server for the hybrid Gated-DeltaNet models (Qwen3.5/3.6,
 * Qwen3-Next). main() only dispatches to the subcommands in src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} commands[] = {
    {"serve", cmd_serve, "serve the OpenAI-compatible API (default: the bundled demo model)"},
    {"run", cmd_run, "offline generation: --prompt-ids or --prompts-file"},
    {"tokenize", cmd_tokenize, "text on stdin -> token ids"},
    {"detokenize", cmd_detokenize, "token ids on stdin -> text"},
    {"render", cmd_render, "OpenAI chat request JSON on stdin -> rendered prompt"},
    {"bench", cmd_bench, "benchmark prefill, decode, prefix cache and roofline -> JSON"},
    {"gen-random", cmd_gen_random, "write a random-weight model folder for a config.json"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: deltaserve <command> [flags]   (deltaserve <command> --help)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "deltaserve: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
