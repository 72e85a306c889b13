/* loom's side of bench/ddp_scaling: the reference workloads (synthetic
 * batches) trained data-parallel on the ranks it is started on, one JSON
 * line on rank 0 with the throughput, the phases of a step and the share of
 * reduction time hidden behind backward. One rank trains without DDP (the
 * baseline) unless --ddp.
 *
 *   ddp_bench --model fashion-mlp|fashion-cnn|kjv-gpt [--steps S]
 *             [--warmup W] [--batch B] [--bucket-mb X] [--first-bucket-mb Y]
 *             [--min-buckets K] [--compress bf16|f16] [--deterministic V]
 *             [--nosync] [--ddp] [--precision f32|bf16]
 *
 * --precision bf16 trains as train.precision: bf16 does (the model's bf16
 * matmuls, f32 master weights, gradients and reductions).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/comm.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/parallel.h"

typedef struct args {
  const char *model;
  int steps, warmup, batch;
  double bucket_mb, first_bucket_mb;
  int min_buckets;
  loom_dtype compress;
  loom_dtype precision;
  int deterministic; /* V, 0 = off */
  int nosync, ddp;
} args;

/* Phases of one step on this rank, in seconds. */
typedef struct phases {
  double step, forward, backward, wait, optim, reduce;
  double cpu; /* CPU time of this thread in the step */
} phases;

/* CPU seconds of the calling thread: unlike the wall clock, not inflated
 * while other jobs on a shared machine hold the core. */
static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double i = q * (n - 1);
  int lo = (int)i;
  int hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (i - lo);
}

static void die(const char *what, loom_status s) {
  fprintf(stderr, "ddp_bench: %s: %s: %s\n", what, loom_status_str(s),
          loom_last_error());
  exit(1);
}
#define CHECK(what, expr)                                                      \
  do {                                                                         \
    loom_status s_ = (expr);                                                   \
    if (s_ != LOOM_OK)                                                         \
      die(what, s_);                                                           \
  } while (0)

static void parse(int argc, char **argv, args *a) {
  *a = (args){.model = "fashion-mlp",
              .steps = 0,
              .warmup = -1,
              .batch = 0,
              .bucket_mb = 25,
              .first_bucket_mb = 1,
              .min_buckets = 8,
              .compress = LOOM_F32,
              .precision = LOOM_F32};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(k, "--nosync") == 0) {
      a->nosync = 1;
      continue;
    }
    if (strcmp(k, "--ddp") == 0) {
      a->ddp = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "ddp_bench: %s needs a value\n", k);
      exit(2);
    }
    i++;
    if (strcmp(k, "--model") == 0)
      a->model = v;
    else if (strcmp(k, "--steps") == 0)
      a->steps = atoi(v);
    else if (strcmp(k, "--warmup") == 0)
      a->warmup = atoi(v);
    else if (strcmp(k, "--batch") == 0)
      a->batch = atoi(v);
    else if (strcmp(k, "--bucket-mb") == 0)
      a->bucket_mb = atof(v);
    else if (strcmp(k, "--first-bucket-mb") == 0)
      a->first_bucket_mb = atof(v);
    else if (strcmp(k, "--min-buckets") == 0)
      a->min_buckets = atoi(v);
    else if (strcmp(k, "--deterministic") == 0)
      a->deterministic = atoi(v);
    else if (strcmp(k, "--compress") == 0) {
      if (loom_dtype_parse(v, &a->compress) != LOOM_OK) {
        fprintf(stderr, "ddp_bench: --compress %s\n", v);
        exit(2);
      }
    } else if (strcmp(k, "--precision") == 0) {
      if (loom_dtype_parse(v, &a->precision) != LOOM_OK ||
          (a->precision != LOOM_F32 && a->precision != LOOM_BF16)) {
        fprintf(stderr, "ddp_bench: --precision %s: expected f32 or bf16\n", v);
        exit(2);
      }
    } else {
      fprintf(stderr, "ddp_bench: unknown option %s\n", k);
      exit(2);
    }
  }
}

int main(int argc, char **argv) {
  args a;
  parse(argc, argv, &a);
  bool gpt = strcmp(a.model, "kjv-gpt") == 0;
  bool cnn = strcmp(a.model, "fashion-cnn") == 0;
  if (!gpt && !cnn && strcmp(a.model, "fashion-mlp") != 0) {
    fprintf(stderr, "ddp_bench: unknown model %s\n", a.model);
    return 2;
  }
  if (a.steps <= 0)
    a.steps = gpt ? 15 : cnn ? 30 : 100;
  if (a.warmup < 0)
    a.warmup = gpt ? 3 : cnn ? 5 : 10;
  if (a.batch <= 0)
    a.batch = gpt ? 32 : 128;

  loom_group *world = NULL;
  CHECK("world group", loom_group_world(NULL, &world));
  int rank = loom_group_rank(world), P = loom_group_size(world);
  loom_log_set_rank(rank);
  bool use_ddp = P > 1 || a.ddp || a.deterministic > 0;

  loom_model *m = NULL;
  loom_optim_opts oo = loom_optim_opts_default();
  float lr;
  if (gpt) {
    CHECK("model", loom_gpt_new(&m, NULL, NULL));
    oo.kind = LOOM_OPTIM_ADAMW;
    oo.weight_decay = 0.01;
    oo.decay_all = true; /* as the PyTorch peer: AdamW(model.parameters()) */
    lr = 3e-4f;
  } else {
    if (cnn)
      CHECK("model", loom_fashion_cnn_new(&m, NULL, NULL));
    else
      CHECK("model", loom_fashion_mlp_new(&m, NULL, NULL));
    oo.kind = LOOM_OPTIM_SGD;
    oo.momentum = 0.9;
    lr = 0.05f;
  }
  CHECK("precision", loom_model_set_precision(m, a.precision));
  int nv = loom_model_num_views(m);
  loom_param *views = loom_calloc((size_t)nv, sizeof *views);
  for (int i = 0; i < nv; i++)
    views[i] = *loom_model_view(m, i);
  loom_optim *opt = NULL;
  CHECK("optim",
        loom_optim_new(&opt, &oo, views, nv, loom_model_num_params(m)));
  loom_free(views);
  loom_xent *xent = NULL;
  CHECK("xent", loom_xent_new(&xent));

  /* Four synthetic batches per rank, cycled (as the PyTorch peer). */
  enum { NB = 4 };
  int64_t B = a.batch, T = 128, feat = cnn ? 784 : 784;
  loom_tensor x[NB];
  int32_t *y[NB];
  for (int i = 0; i < NB; i++) {
    loom_rng g = loom_rng_init(1234, (uint64_t)(rank * NB + i));
    if (gpt) {
      int64_t d[2] = {B, T};
      CHECK("batch", loom_tensor_new(&x[i], LOOM_I32, 2, d));
      y[i] = loom_malloc((size_t)(B * T) * sizeof(int32_t));
      int32_t *xi = x[i].data;
      for (int64_t j = 0; j < B * T; j++) {
        xi[j] = (int32_t)loom_rng_below(&g, 256);
        y[i][j] = (int32_t)loom_rng_below(&g, 256);
      }
    } else {
      int64_t d4[4] = {B, 1, 28, 28}, d2[2] = {B, feat};
      CHECK("batch", cnn ? loom_tensor_new(&x[i], LOOM_F32, 4, d4)
                         : loom_tensor_new(&x[i], LOOM_F32, 2, d2));
      loom_rng_fill_normal(&g, x[i].data, (size_t)(B * feat), 0, 1);
      y[i] = loom_malloc((size_t)B * sizeof(int32_t));
      for (int64_t j = 0; j < B; j++)
        y[i][j] = (int32_t)loom_rng_below(&g, 10);
    }
  }

  loom_ddp *d = NULL;
  int S = 1;
  int64_t shard_rows = B;
  if (use_ddp) {
    loom_ddp_opts o = loom_ddp_opts_default();
    o.bucket_mb = a.bucket_mb;
    o.first_bucket_mb = a.first_bucket_mb;
    o.min_buckets = a.min_buckets;
    o.compress = a.compress;
    if (a.deterministic > 0) {
      o.deterministic = true;
      o.virtual_shards = a.deterministic;
    }
    CHECK("ddp", loom_ddp_new(&d, m, world, &o));
    if (a.deterministic > 0) {
      loom_ddp_shards(d, NULL, &S);
      shard_rows = B / S;
      if (shard_rows * S != B) {
        fprintf(stderr,
                "ddp_bench: batch %lld is not a multiple of %d "
                "shards per rank\n",
                (long long)B, S);
        return 2;
      }
    }
  }
  int64_t items = (gpt ? B * T : B) * P;
  int total = a.warmup + a.steps * (a.nosync ? 2 : 1);
  phases *ph = calloc((size_t)total, sizeof *ph);
  loom_req r = LOOM_REQ_INIT;
  double load0[3] = {0};
  FILE *lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &load0[0], &load0[1], &load0[2]) != 3)
      load0[0] = 0;
    fclose(lf);
  }

  for (int it = 0; it < total; it++) {
    if (it == a.warmup) {
      CHECK("barrier", loom_barrier(world, &r));
      CHECK("barrier", loom_wait(&r));
      if (d)
        loom_ddp_reset_stats(d);
    }
    /* --nosync: timed steps alternate with and without reduction, so that
     * both see the same phases of a shared machine. */
    bool sync = !(a.nosync && it >= a.warmup && (it - a.warmup) % 2 == 1);
    const loom_tensor *bx = &x[it % NB];
    const int32_t *by = y[it % NB];
    phases *p = &ph[it];
    double t0 = loom_time_now(), c0 = thread_cpu();
    if (d) {
      CHECK("zero_grad", loom_ddp_zero_grad(d));
      loom_ddp_set_sync(d, sync);
    } else {
      loom_model_zero_grad(m);
    }
    for (int j = 0; j < S; j++) {
      loom_tensor xs = *bx, logits, dl;
      const int32_t *ys = by;
      if (S > 1) {
        CHECK("slice", loom_tensor_slice0(bx, j * shard_rows, shard_rows, &xs));
        ys = by + j * shard_rows * (gpt ? T : 1);
        CHECK("shard", loom_ddp_shard_begin(d, j));
      }
      double f0 = loom_time_now();
      loom_xent_stats st;
      CHECK("forward", loom_model_forward(m, &xs, &logits));
      CHECK("loss", loom_xent_forward(xent, &logits, ys, &st));
      double f1 = loom_time_now();
      CHECK("output grad", loom_model_output_grad(m, &dl));
      CHECK("loss backward", loom_xent_backward(xent, &dl, 1.0f));
      CHECK("backward", loom_model_backward(m, NULL, NULL));
      p->forward += f1 - f0;
      p->backward += loom_time_now() - f1;
    }
    double o0 = loom_time_now();
    if (d && sync) {
      loom_ddp_stats before, after;
      loom_ddp_get_stats(d, &before);
      CHECK("ddp step", loom_ddp_step(d, opt, lr));
      loom_ddp_get_stats(d, &after);
      p->wait = after.last_wait_s;
      p->reduce = after.last_reduce_s;
    } else {
      if (d)
        loom_ddp_set_sync(d, true);
      CHECK("optim", loom_optim_step(opt, loom_model_params(m),
                                     loom_model_grads(m), lr));
    }
    loom_model_params_updated(m); /* bf16: a new copy, once a step */
    double t1 = loom_time_now();
    p->optim = t1 - o0 - p->wait;
    p->step = t1 - t0;
    p->cpu = thread_cpu() - c0;
  }

  /* A step ends for the job when its slowest rank ends it. */
  double *steps = malloc(sizeof(double) * (size_t)total);
  double *smax = malloc(sizeof(double) * (size_t)total);
  for (int i = 0; i < total; i++)
    steps[i] = ph[i].step;
  if (P > 1) {
    CHECK("max", loom_allreduce(steps, smax, (size_t)total, LOOM_F64, LOOM_MAX,
                                world, &r));
    CHECK("max", loom_wait(&r));
  } else {
    memcpy(smax, steps, sizeof(double) * (size_t)total);
  }
  /* The share hidden, seen from the rank that reached each step's
   * reductions last: the other one's reduction time also holds its wait for
   * the late rank, which is load imbalance, not communication. */
  double crit_reduce = 0, crit_wait = 0;
  if (d && P > 1) {
    double *mine = malloc(sizeof(double) * 2 * (size_t)total);
    double *all = malloc(sizeof(double) * 2 * (size_t)total * (size_t)P);
    for (int i = 0; i < total; i++) {
      mine[2 * i] = ph[i].reduce;
      mine[2 * i + 1] = ph[i].wait;
    }
    CHECK("gather",
          loom_allgather(mine, all, 2 * (size_t)total, LOOM_F64, world, &r));
    CHECK("gather", loom_wait(&r));
    for (int i = a.warmup; i < total; i++) {
      int best = -1;
      for (int q = 0; q < P; q++) {
        const double *v = all + ((size_t)q * (size_t)total + (size_t)i) * 2;
        if (v[0] > 0 &&
            (best < 0 || v[0] < all[((size_t)best * (size_t)total + i) * 2]))
          best = q;
      }
      if (best >= 0) {
        crit_reduce += all[((size_t)best * (size_t)total + i) * 2];
        crit_wait += all[((size_t)best * (size_t)total + i) * 2 + 1];
      }
    }
    free(mine);
    free(all);
  }
  loom_ddp_stats ds = {0};
  if (d)
    loom_ddp_get_stats(d, &ds);
  if (rank == 0) {
    /* The timed steps with reduction, and those without (--nosync). */
    double *sy = malloc(sizeof(double) * (size_t)a.steps);
    double *ny = malloc(sizeof(double) * (size_t)a.steps);
    double *cy = malloc(sizeof(double) * (size_t)a.steps);
    int ns = 0, nn = 0;
    phases mean = {0};
    for (int i = a.warmup; i < total; i++) {
      bool synced = !(a.nosync && (i - a.warmup) % 2 == 1);
      if (!synced) {
        ny[nn++] = smax[i];
        continue;
      }
      cy[ns] = ph[i].cpu;
      sy[ns++] = smax[i];
      mean.forward += ph[i].forward / a.steps;
      mean.backward += ph[i].backward / a.steps;
      mean.wait += ph[i].wait / a.steps;
      mean.optim += ph[i].optim / a.steps;
      mean.step += ph[i].step / a.steps;
    }
    double med = quantile(sy, ns, 0.5);
    double p10 = quantile(sy, ns, 0.1);
    double p90 = quantile(sy, ns, 0.9);
    /* rank 0's compute thread only */
    double cpu_med = quantile(cy, ns, 0.5);
    double load1[3] = {0};
    lf = fopen("/proc/loadavg", "r");
    if (lf) {
      if (fscanf(lf, "%lf %lf %lf", &load1[0], &load1[1], &load1[2]) != 3)
        load1[0] = 0;
      fclose(lf);
    }
    printf("{\"bench\": \"ddp_scaling\", \"impl\": \"loom\", \"version\": "
           "\"%s\", \"model\": \"%s\", \"procs\": %d, \"threads\": %d, "
           "\"ddp\": %s, \"backend\": \"%s\", \"shm\": %s, \"bucket_mb\": %g, "
           "\"first_bucket_mb\": %g, \"buckets\": %lld, \"compress\": \"%s\", "
           "\"precision\": \"%s\", "
           "\"deterministic\": %d, \"batch\": %lld, \"items_per_step\": %lld, "
           "\"unit\": \"%s\", \"throughput\": %.1f, \"step_median_s\": %.6f, "
           "\"step_p10_s\": %.6f, \"step_p90_s\": %.6f, \"steps\": %d, "
           "\"warmup\": %d, \"forward_s\": %.6f, \"backward_s\": %.6f, "
           "\"comm_wait_s\": %.6f, \"optim_s\": %.6f, \"reduce_s\": %.6f, "
           "\"hidden_share\": %.4f, \"hidden_share_rank0\": %.4f, "
           "\"reduce_critical_s\": %.6f, \"wire_bytes\": %lld",
           loom_version(), a.model, P, loom_threads(),
           use_ddp ? "true" : "false", loom_group_backend(world),
           loom_group_shm(world) ? "true" : "false", a.bucket_mb,
           a.first_bucket_mb, (long long)ds.buckets,
           loom_dtype_name(a.compress), loom_dtype_name(a.precision),
           a.deterministic, (long long)B, (long long)items,
           gpt ? "tokens/s" : "samples/s", (double)items / med, med, p10, p90,
           a.steps, a.warmup, mean.forward, mean.backward, mean.wait,
           mean.optim, ds.steps ? ds.reduce_s / (double)ds.steps : 0.0,
           crit_reduce > 0 ? 1.0 - fmin(1.0, crit_wait / crit_reduce)
                           : (d ? loom_ddp_hidden_share(&ds) : 1.0),
           d ? loom_ddp_hidden_share(&ds) : 1.0,
           ds.steps ? crit_reduce / (double)ds.steps : 0.0,
           (long long)ds.wire_bytes);
    if (a.nosync && nn > 0) {
      double mn = quantile(ny, nn, 0.5);
      printf(", \"throughput_nosync\": %.1f", (double)items / mn);
    }
    printf(", \"step_cpu_median_s\": %.6f", cpu_med);
    free(cy);
    free(sy);
    free(ny);
    printf(", \"loadavg_start\": [%.2f, %.2f, %.2f], \"loadavg_end\": [%.2f, "
           "%.2f, %.2f]}\n",
           load0[0], load0[1], load0[2], load1[0], load1[1], load1[2]);
    fflush(stdout);
  }
  loom_ddp_free(d);
  for (int i = 0; i < NB; i++) {
    loom_tensor_free(&x[i]);
    loom_free(y[i]);
  }
  free(ph);
  free(steps);
  free(smax);
  loom_xent_free(xent);
  loom_optim_free(opt);
  loom_model_free(m);
  loom_group_free(world);
  return 0;
}
