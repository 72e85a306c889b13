/* loom bench: dispatches to the benchmarks of each layer. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
  const char *name;
  loom_cli_fn fn;
  const char *help;
} benches[] = {
    {"gemm", loom_bench_gemm, "GEMM GFLOP/s: loom vs raw oneDNN and OpenBLAS"},
    {"comm", loom_bench_comm, "collective bandwidth: loom vs plain MPI"},
    {"train", loom_bench_train, "training throughput of the reference models"},
    {"kernels", loom_bench_kernels,
     "loom's own vector kernels, for the instruction-set copy in use"},
};

int loom_cmd_bench(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: loom bench <what> [options]\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
      fprintf(f, "  %-7s %s\n", benches[i].name, benches[i].help);
    fprintf(f, "\n'loom bench <what> --help' lists its options.\n");
    return argc < 2 ? LOOM_EXIT_USAGE : LOOM_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
    if (strcmp(argv[1], benches[i].name) == 0)
      return benches[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "loom bench: unknown benchmark '%s'\n", argv[1]);
  return LOOM_EXIT_USAGE;
}
