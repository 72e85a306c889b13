/* Micro-benchmark of the optim layer's element loops (not a test):
 *   optim_bench [elements=16777216] [iterations=20]
 * prints, for 1 thread and loom_threads() threads, the time per step and
 * the memory bandwidth it implies for SGD momentum, AdamW, sumsq, scale. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/optim.h"

static double run(const char *what, loom_optim *o, float *p, const float *g,
                  int64_t n, int iters, double bytes_per_elem) {
  double best = 1e30, sink = 0;
  for (int it = 0; it < iters; it++) {
    double t0 = loom_time_now();
    if (o)
      loom_optim_step(o, p, g, 1e-4f);
    else if (strcmp(what, "sumsq") == 0)
      sink += loom_grad_sumsq(g, n);
    else
      loom_grad_scale(p, n, 0.999f);
    double dt = loom_time_now() - t0;
    best = dt < best ? dt : best;
  }
  printf("%-14s threads %2d  %8.3f ms  %7.2f GB/s  %6.3f ns/elem%s\n", what,
         loom_threads(), best * 1e3, bytes_per_elem * (double)n / best / 1e9,
         best * 1e9 / (double)n, sink < 0 ? "!" : "");
  return best;
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : 16777216;
  int iters = argc > 2 ? atoi(argv[2]) : 20;
  if (n < 1 || iters < 1) {
    fprintf(stderr, "usage: optim_bench [elements] [iterations]\n");
    return 2;
  }
  float *p = loom_malloc(sizeof(float) * (size_t)n);
  float *g = loom_malloc(sizeof(float) * (size_t)n);
  if (!p || !g) {
    fprintf(stderr, "optim_bench: %s\n", loom_last_error());
    return 1;
  }
  loom_rng r = loom_rng_init(1, 0);
  loom_rng_fill_normal(&r, p, (size_t)n, 0.0f, 1.0f);
  loom_rng_fill_normal(&r, g, (size_t)n, 0.0f, 0.01f);
  int all = loom_threads();
  int counts[2] = {1, all};
  for (int c = 0; c < (all > 1 ? 2 : 1); c++) {
    loom_set_threads(counts[c]);
    loom_optim_opts so = loom_optim_opts_default();
    so.momentum = 0.9;
    loom_optim_opts ao = loom_optim_opts_default();
    ao.kind = LOOM_OPTIM_ADAMW;
    ao.weight_decay = 0.01;
    loom_optim *sgd = NULL, *adam = NULL;
    if (loom_optim_new(&sgd, &so, NULL, 0, n) != LOOM_OK ||
        loom_optim_new(&adam, &ao, NULL, 0, n) != LOOM_OK) {
      fprintf(stderr, "optim_bench: %s\n", loom_last_error());
      return 1;
    }
    /* bytes moved per element: reads + writes of p, g and the state */
    run("sgd-momentum", sgd, p, g, n, iters, 4.0 * 5);
    run("adamw", adam, p, g, n, iters, 4.0 * 7);
    run("sumsq", NULL, p, g, n, iters, 4.0);
    run("scale", NULL, p, g, n, iters, 4.0 * 2);
    loom_optim_free(sgd);
    loom_optim_free(adam);
  }
  loom_free(p);
  loom_free(g);
  return 0;
}
