/* loom bench comm (placeholder until its layer lands). */
#include <stdio.h>

#include "cli/cli.h"

int loom_bench_comm(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "loom bench comm: not built in this version\n");
  return LOOM_EXIT_FAIL;
}
