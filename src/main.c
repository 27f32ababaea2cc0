/* deltaserve — an inference server for the hybrid Gated-DeltaNet models (Qwen3.5/3.6,
 * Qwen3-Next). main() only dispatches to the subcommands in src/cli/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/version.h"
#include "cli/cli.h"
#include "cli/cli_flags.h"

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
  fprintf(f,
          "usage: deltaserve <command> [flags]   (deltaserve <command> --help; deltaserve "
          "--version)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-v")) {
    printf("deltaserve %s\n", version_string());
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name)) continue;
    /* every command reads "--flag value"; "--flag=value" arrives so too */
    char **av = cli_flags_split(&argc, argv);
    if (!av) {
      fprintf(stderr, "deltaserve: out of memory\n");
      return 1;
    }
    int rc = commands[i].fn(argc - 1, av + 1);
    free(av);
    return rc;
  }
  fprintf(stderr, "deltaserve: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
