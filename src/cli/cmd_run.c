#include <stdio.h>

#include "cli/cli.h"

int cmd_run(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "deltaserve: this command is being built\n");
  return 1;
}
