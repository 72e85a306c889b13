/* loom bench train: single-process training throughput of the reference
 * workloads on synthetic data of the right shapes (median step). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "loom/loom.h"

typedef struct workload {
  const char *name;
  const char *unit;
  int64_t batch;    /* rows per step */
  int64_t per_row;  /* units (samples or tokens) per row */
  double fwd_flops; /* matmul/conv FLOPs per unit, forward */
} workload;

/* FLOPs are counted as bench/torch/workloads.py does: every GEMM and
 * convolution, 2*M*N*K forward, training = 3x forward. */
static const workload workloads[] = {
    {"fashion-mlp", "samples/s", 128, 1,
     2.0 * (784 * 512 + 512 * 512 + 512 * 10)},
    {"fashion-cnn", "samples/s", 128, 1,
     2.0 * 576 * 32 * 25 + 2.0 * 64 * 64 * 800 + 2.0 * 1024 * 10},
    {"kjv-gpt", "tokens/s", 32, 128,
     4.0 * (2.0 * 128 * 384 + 2.0 * 128 * 128 + 2.0 * 128 * 512 * 2 +
            2.0 * 128 * 128 * 2) +
         2.0 * 128 * 256},
};

/* CPU seconds of the whole process (all its threads): on a shared machine,
 * unlike the wall clock, not inflated while other jobs hold the cores; the
 * PyTorch peer reports the same (time.process_time). */
static double process_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: loom bench train [--model fashion-mlp|fashion-cnn|"
          "kjv-gpt|all] [--threads N]\n"
          "                        [--steps S] [--warmup W] "
          "[--precision f32|bf16|f16] [--json]\n"
          "\n"
          "--threads 0 (default): LOOM_THREADS or all cores; at most %d.\n"
          "S timed steps (>= 1, default 30) after W untimed (default 5).\n"
          "\n"
          "Times full training steps (forward, loss, backward, optimizer)\n"
          "of the reference workloads on synthetic data, f32 (or bf16, or f16\n"
          "with dynamic loss scaling as training does it), one process, and\n"
          "prints the median-step throughput. --json prints\n"
          "one JSON line per workload (bench/train_throughput reads it),\n"
          "with the median step's CPU time of the process (items_per_cpu_s),\n"
          "which other jobs on a shared machine inflate less than the wall\n"
          "clock.\n",
          LOOM_THREADS_MAX);
}

/* The 1, 5 and 15 minute load averages; all 0 when /proc/loadavg is
 * missing or does not start with three numbers. */
static void read_loadavg(double load[3]) {
  char line[256];
  FILE *f = fopen("/proc/loadavg", "r");
  bool ok = f && fgets(line, sizeof line, f);
  if (f)
    fclose(f);
  const char *p = line;
  for (int i = 0; i < 3 && ok; i++) {
    char *end;
    load[i] = strtod(p, &end);
    ok = end != p && (*end == ' ' || *end == '\n' || *end == '\0');
    p = end;
  }
  if (!ok)
    load[0] = load[1] = load[2] = 0;
}

/* A whole number in [lo, 2^20] for option opt, nothing after it; otherwise
 * a message naming the option and -1. */
static int parse_count(const char *opt, const char *s, int lo, int hi,
                       int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    fprintf(stderr,
            "loom bench train: %s wants a count in [%d, %d], not '%s'\n", opt,
            lo, hi, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static loom_status build(const workload *w, loom_dtype precision,
                         loom_model **model, loom_optim **optim) {
  loom_model_opts mo = loom_model_opts_default();
  mo.seed = 1;
  loom_optim_opts oo = loom_optim_opts_default();
  if (strcmp(w->name, "fashion-mlp") == 0) {
    loom_fashion_mlp_opts o = loom_fashion_mlp_opts_default();
    LOOM_TRY(loom_fashion_mlp_new(model, &o, &mo));
  } else if (strcmp(w->name, "fashion-cnn") == 0) {
    loom_fashion_cnn_opts o = loom_fashion_cnn_opts_default();
    LOOM_TRY(loom_fashion_cnn_new(model, &o, &mo));
  } else {
    loom_gpt_opts o = loom_gpt_opts_default();
    LOOM_TRY(loom_gpt_new(model, &o, NULL));
  }
  LOOM_TRY(loom_model_set_precision(*model, precision));
  if (strcmp(w->name, "kjv-gpt") == 0) {
    oo.kind = LOOM_OPTIM_ADAMW;
    oo.weight_decay = 0.01;
  } else {
    oo.kind = LOOM_OPTIM_SGD;
    oo.momentum = 0.9;
  }
  return loom_optim_new(optim, &oo, loom_model_view(*model, 0),
                        loom_model_num_views(*model),
                        loom_model_num_params(*model));
}

static loom_status run_one(const workload *w, loom_dtype precision, int threads,
                           int steps, int warmup, bool json) {
  loom_model *model = NULL;
  loom_optim *optim = NULL;
  loom_xent *xent = NULL;
  loom_tensor x = {0}, y = {0};
  double *times = NULL, *cpu = NULL;
  loom_status s;
  bool text = w->per_row > 1;
  LOOM_TRY_GOTO(s, build(w, precision, &model, &optim), out);
  LOOM_TRY_GOTO(s, loom_xent_new(&xent), out);
  if (text) {
    int64_t d[2] = {w->batch, w->per_row};
    LOOM_TRY_GOTO(s, loom_tensor_new(&x, LOOM_I32, 2, d), out);
    LOOM_TRY_GOTO(s, loom_tensor_new(&y, LOOM_I32, 2, d), out);
  } else {
    int64_t d[4] = {w->batch, 1, 28, 28};
    int64_t dy[1] = {w->batch};
    LOOM_TRY_GOTO(s, loom_tensor_new(&x, LOOM_F32, 4, d), out);
    LOOM_TRY_GOTO(s, loom_tensor_new(&y, LOOM_I32, 1, dy), out);
  }
  loom_rng r = loom_rng_init(7, 0);
  int64_t nx = loom_tensor_numel(&x), ny = loom_tensor_numel(&y);
  int classes = text ? 256 : 10;
  for (int64_t i = 0; i < nx; i++) {
    if (text)
      ((int32_t *)x.data)[i] = (int32_t)loom_rng_below(&r, 256);
    else
      ((float *)x.data)[i] = loom_rng_normal(&r);
  }
  for (int64_t i = 0; i < ny; i++)
    ((int32_t *)y.data)[i] = (int32_t)loom_rng_below(&r, (uint64_t)classes);
  times = loom_calloc((size_t)steps, sizeof *times);
  cpu = loom_calloc((size_t)steps, sizeof *cpu);
  if (!times || !cpu) {
    s = LOOM_ERR_NOMEM;
    goto out;
  }
  float *params = loom_model_params(model);
  float *grads = loom_model_grads(model);
  float lr = text ? 3e-4f : 0.05f;
  /* f16: the loss scaled, the gradients unscaled and checked, as the
   * trainer does (docs/precision.md); a step with inf/NaN is skipped */
  loom_scaler sc = loom_scaler_default();
  const bool scaled = precision == LOOM_F16;
  const int64_t np = loom_model_num_params(model);
  for (int i = -warmup; i < steps; i++) {
    double t0 = loom_time_now(), c0 = process_cpu();
    loom_tensor logits, dlogits;
    loom_xent_stats st;
    loom_model_zero_grad(model);
    LOOM_TRY_GOTO(s, loom_model_forward(model, &x, &logits), out);
    LOOM_TRY_GOTO(
        s, loom_xent_forward(xent, &logits, (const int32_t *)y.data, &st), out);
    LOOM_TRY_GOTO(s, loom_model_output_grad(model, &dlogits), out);
    LOOM_TRY_GOTO(
        s, loom_xent_backward(xent, &dlogits, scaled ? sc.scale : 1.0f), out);
    LOOM_TRY_GOTO(s, loom_model_backward(model, NULL, NULL), out);
    bool skip = scaled && loom_scaler_unscale(&sc, grads, np);
    if (scaled)
      LOOM_TRY_GOTO(s, loom_scaler_update(&sc, skip), out);
    /* bf16/f16: a new copy once a step, written by the optimizer as it
     * goes on the conversion path (as the trainer does) */
    float *rounded = loom_model_rounded_copy(model);
    LOOM_TRY_GOTO(s, loom_optim_set_rounded(optim, precision, rounded), out);
    if (!skip)
      LOOM_TRY_GOTO(s, loom_optim_step(optim, params, grads, lr), out);
    if (!rounded)
      loom_model_params_updated(model);
    if (i >= 0) {
      times[i] = loom_time_now() - t0;
      cpu[i] = process_cpu() - c0;
    }
  }
  qsort(times, (size_t)steps, sizeof *times, cmp_double);
  qsort(cpu, (size_t)steps, sizeof *cpu, cmp_double);
  double med = times[steps / 2];
  double units = (double)(w->batch * w->per_row);
  double tput = units / med;
  double gflops = tput * 3.0 * w->fwd_flops / 1e9;
  double load[3] = {0, 0, 0};
  read_loadavg(load);
  if (json)
    printf(
        "{\"bench\":\"train_throughput\",\"impl\":\"loom\",\"version\":"
        "\"%s\",\"model\":\"%s\",\"procs\":1,\"threads\":%d,\"unit\":"
        "\"%s\",\"throughput\":%.1f,\"step_s\":%.6f,\"items_per_cpu_s\":%.1f,"
        "\"step_cpu_s\":%.6f,\"gflops\":%.2f,"
        "\"gemm\":\"%s\",\"onednn\":\"%d.%d\",\"isa\":\"%s\","
        "\"precision\":\"%s\",\"loadavg_start\":[%.2f,%.2f,%.2f]}\n",
        loom_version(), w->name, threads, w->unit, tput, med,
        units / cpu[steps / 2], cpu[steps / 2], gflops,
        loom_gemm_backend_name(loom_gemm_get_backend()),
        loom_dnnl_version() / 100, loom_dnnl_version() % 100,
        loom_isa_name(loom_cpu_isa()), loom_dtype_name(precision), load[0],
        load[1], load[2]);
  else
    printf("%-12s threads %d: %10.0f %s (median step %.2f ms, %.1f "
           "GFLOP/s, %s kernels, %s)\n",
           w->name, threads, tput, w->unit, med * 1e3, gflops,
           loom_isa_name(loom_cpu_isa()), loom_dtype_name(precision));
  fflush(stdout);
out:
  loom_free(times);
  loom_free(cpu);
  loom_tensor_free(&x);
  loom_tensor_free(&y);
  loom_xent_free(xent);
  loom_optim_free(optim);
  loom_model_free(model);
  return s;
}

int loom_bench_train(int argc, char **argv) {
  const char *model = "all";
  int threads = 0, steps = 30, warmup = 5;
  bool json = false;
  loom_dtype precision = LOOM_F32;
  for (int i = 1; i < argc; i++) {
    bool next = i + 1 < argc;
    if (strcmp(argv[i], "--model") == 0 && next)
      model = argv[++i];
    else if (strcmp(argv[i], "--threads") == 0 && next) {
      if (parse_count(argv[i], argv[i + 1], 0, LOOM_THREADS_MAX, &threads))
        return LOOM_EXIT_USAGE;
      i++;
    } else if (strcmp(argv[i], "--steps") == 0 && next) {
      if (parse_count(argv[i], argv[i + 1], 1, 1 << 20, &steps))
        return LOOM_EXIT_USAGE;
      i++;
    } else if (strcmp(argv[i], "--warmup") == 0 && next) {
      if (parse_count(argv[i], argv[i + 1], 0, 1 << 20, &warmup))
        return LOOM_EXIT_USAGE;
      i++;
    } else if (strcmp(argv[i], "--precision") == 0 && next) {
      i++;
      if (strcmp(argv[i], "f32") == 0)
        precision = LOOM_F32;
      else if (strcmp(argv[i], "bf16") == 0)
        precision = LOOM_BF16;
      else if (strcmp(argv[i], "f16") == 0)
        precision = LOOM_F16;
      else {
        fprintf(stderr,
                "loom bench train: --precision %s: expected f32, bf16 or "
                "f16\n",
                argv[i]);
        return LOOM_EXIT_USAGE;
      }
    } else if (strcmp(argv[i], "--json") == 0)
      json = true;
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return LOOM_EXIT_OK;
    } else {
      fprintf(stderr, "loom bench train: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return LOOM_EXIT_USAGE;
    }
  }
  if (threads > 0)
    loom_set_threads(threads);
  threads = loom_threads();
  bool any = false;
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++) {
    if (strcmp(model, "all") != 0 && strcmp(model, workloads[i].name) != 0)
      continue;
    any = true;
    if (run_one(&workloads[i], precision, threads, steps, warmup, json) !=
        LOOM_OK) {
      fprintf(stderr, "loom bench train: %s: %s\n", workloads[i].name,
              loom_last_error());
      return LOOM_EXIT_FAIL;
    }
  }
  if (!any) {
    fprintf(stderr, "loom bench train: unknown model '%s'\n", model);
    return LOOM_EXIT_USAGE;
  }
  return LOOM_EXIT_OK;
}
