/* loom bench gemm (placeholder until its layer lands). */
#include <stdio.h>

#include "cli/cli.h"

int loom_bench_gemm(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "loom bench gemm: not built in this version\n");
  return LOOM_EXIT_FAIL;
}
