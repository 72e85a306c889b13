/* loom run (placeholder until its layer lands). */
#include <stdio.h>

#include "cli/cli.h"

int loom_cmd_run(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "loom run: not built in this version\n");
  return LOOM_EXIT_FAIL;
}
