#include <stdio.h>

#include "cli/cli.h"

int cmd_run_batch(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "deltaserve: run --prompts-file is being built\n");
  return 1;
}
