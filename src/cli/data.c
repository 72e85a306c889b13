/* loom data (placeholder until its layer lands). */
#include <stdio.h>

#include "cli/cli.h"

int loom_cmd_data(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "loom data: not built in this version\n");
  return LOOM_EXIT_FAIL;
}
