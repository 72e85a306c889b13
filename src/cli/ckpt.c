/* loom ckpt (placeholder until its layer lands). */
#include <stdio.h>

#include "cli/cli.h"

int loom_cmd_ckpt(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "loom ckpt: not built in this version\n");
  return LOOM_EXIT_FAIL;
}
