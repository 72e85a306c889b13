/* loom bench gemm: GFLOP/s of loom_gemm per backend against raw dnnl_sgemm
 * and raw cblas_sgemm, at 1024^3 and at the GEMM shapes of the reference
 * workloads (MLP and CNN at batch 128, GPT at B*T = 4096) and of gpt85
 * (bench/model_parallel.sh's 85M GPT: d_model 768, B*T = 512, one head's
 * attention at context 256). */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/core.h"
#include "loom/kernels.h"

#ifdef LOOM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

typedef struct gemm_shape {
  const char *name;
  char ta, tb; /* 'N' or 'T' */
  int M, N, K;
} gemm_shape;

/* Forward C = A @ W^T is NT; input gradient dA = dC @ W is NN; weight
 * gradient dW = dC^T @ A is TN. The CNN rows are the per-chunk GEMMs the
 * im2col convolution runs (conv1: one 24x24 image per chunk; conv2: four
 * 8x8 images, 256 columns). */
static const gemm_shape shapes[] = {
    {"square 1024^3", 'N', 'N', 1024, 1024, 1024},
    {"mlp fc1 fwd", 'N', 'T', 128, 512, 784},
    {"mlp fc2 fwd", 'N', 'T', 128, 512, 512},
    {"mlp fc3 fwd", 'N', 'T', 128, 10, 512},
    {"mlp fc2 dinp", 'N', 'N', 128, 512, 512},
    {"mlp fc3 dinp", 'N', 'N', 128, 512, 10},
    {"mlp fc1 dweight", 'T', 'N', 512, 784, 128},
    {"mlp fc2 dweight", 'T', 'N', 512, 512, 128},
    {"mlp fc3 dweight", 'T', 'N', 10, 512, 128},
    {"cnn conv1 fwd", 'N', 'N', 32, 576, 25},
    {"cnn conv1 dweight", 'N', 'T', 32, 25, 576},
    {"cnn conv2 fwd", 'N', 'N', 64, 256, 800},
    {"cnn conv2 dweight", 'N', 'T', 64, 800, 256},
    {"cnn conv2 dcol", 'T', 'N', 800, 256, 64},
    {"cnn fc fwd", 'N', 'T', 128, 10, 1024},
    {"cnn fc dweight", 'T', 'N', 10, 1024, 128},
    {"gpt qkv fwd", 'N', 'T', 4096, 384, 128},
    {"gpt attproj fwd", 'N', 'T', 4096, 128, 128},
    {"gpt fc fwd", 'N', 'T', 4096, 512, 128},
    {"gpt fcproj fwd", 'N', 'T', 4096, 128, 512},
    {"gpt lmhead fwd", 'N', 'T', 4096, 256, 128},
    {"gpt qkv dinp", 'N', 'N', 4096, 128, 384},
    {"gpt fc dinp", 'N', 'N', 4096, 128, 512},
    {"gpt fcproj dinp", 'N', 'N', 4096, 512, 128},
    {"gpt lmhead dinp", 'N', 'N', 4096, 128, 256},
    {"gpt qkv dweight", 'T', 'N', 384, 128, 4096},
    {"gpt attproj dweight", 'T', 'N', 128, 128, 4096},
    {"gpt fc dweight", 'T', 'N', 512, 128, 4096},
    {"gpt fcproj dweight", 'T', 'N', 128, 512, 4096},
    {"gpt lmhead dweight", 'T', 'N', 256, 128, 4096},
    {"gpt85 qkv fwd", 'N', 'T', 512, 2304, 768},
    {"gpt85 attproj fwd", 'N', 'T', 512, 768, 768},
    {"gpt85 fc fwd", 'N', 'T', 512, 3072, 768},
    {"gpt85 fcproj fwd", 'N', 'T', 512, 768, 3072},
    {"gpt85 qkv dinp", 'N', 'N', 512, 768, 2304},
    {"gpt85 fc dinp", 'N', 'N', 512, 768, 3072},
    {"gpt85 fcproj dinp", 'N', 'N', 512, 3072, 768},
    {"gpt85 qkv dweight", 'T', 'N', 2304, 768, 512},
    {"gpt85 fc dweight", 'T', 'N', 3072, 768, 512},
    {"gpt85 fcproj dweight", 'T', 'N', 768, 3072, 512},
    {"gpt85 att scores", 'N', 'T', 256, 256, 64},
    {"gpt85 att values", 'N', 'N', 256, 64, 256},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* A column of the table: loom_gemm with a backend, or a raw library. */
typedef enum { COL_LOOM, COL_RAW_DNNL, COL_RAW_OPENBLAS } col_kind;
typedef struct column {
  col_kind kind;
  loom_gemm_backend backend;
  const char *title;
} column;

typedef struct bench_args {
  int threads, iters;
  double budget; /* seconds per measurement at most */
  const char *backend;
} bench_args;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: loom bench gemm [--threads N] [--backend all|dnnl|openblas|"
      "naive] [--iters K]\n\n"
      "GFLOP/s of loom_gemm (per backend) against raw dnnl_sgemm and raw\n"
      "cblas_sgemm, at 1024^3 and at the GEMM shapes of the reference\n"
      "workloads. Each cell is the best of 3 runs of up to K calls.\n\n"
      "  --threads N   threads for loom, oneDNN and OpenBLAS (default: "
      "LOOM_THREADS or all cores; at most %d)\n"
      "  --backend B   columns to measure (default all)\n"
      "  --iters K     calls per run (default 10; a run stops after 0.3 s)\n"
      "\nLOOM_GEMM_DETERMINISTIC=0 measures loom_gemm with the libraries'\n"
      "own threading instead of loom's thread-count invariant grid.\n",
      LOOM_THREADS_MAX);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    if (strcmp(o, "--threads") != 0 && strcmp(o, "--iters") != 0 &&
        strcmp(o, "--backend") != 0) {
      fprintf(stderr, "loom bench gemm: unknown option %s (try --help)\n", o);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "loom bench gemm: %s needs a value\n", o);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(o, "--threads") == 0) {
      if (parse_int(v, 1, LOOM_THREADS_MAX, &a->threads) != 0) {
        fprintf(stderr,
                "loom bench gemm: --threads wants a count in [1, %d], not "
                "'%s'\n",
                LOOM_THREADS_MAX, v);
        return -1;
      }
    } else if (strcmp(o, "--iters") == 0) {
      if (parse_int(v, 1, 1 << 20, &a->iters) != 0) {
        fprintf(stderr,
                "loom bench gemm: --iters wants a count >= 1, not "
                "'%s'\n",
                v);
        return -1;
      }
    } else if (strcmp(o, "--backend") == 0) {
      loom_gemm_backend b;
      if (strcmp(v, "all") != 0 && loom_gemm_backend_parse(v, &b) != LOOM_OK) {
        fprintf(stderr,
                "loom bench gemm: --backend wants all, dnnl, openblas "
                "or naive, not '%s'\n",
                v);
        return -1;
      }
      a->backend = v;
    }
  }
  return 0;
}

/* One call of the column's GEMM; 0 on success. */
static int call(const column *c, const gemm_shape *s, const float *A,
                const float *B, float *C) {
  const int lda = s->ta == 'N' ? s->K : s->M, ldb = s->tb == 'N' ? s->N : s->K;
  switch (c->kind) {
  case COL_LOOM:
    return loom_gemm(s->ta == 'T', s->tb == 'T', s->M, s->N, s->K, 1.0f, A, lda,
                     B, ldb, 0.0f, C, s->N) == LOOM_OK
               ? 0
               : -1;
  case COL_RAW_DNNL:
#ifdef LOOM_HAVE_DNNL
    return dnnl_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb,
                      0.0f, C, s->N) == dnnl_success
               ? 0
               : -1;
#else
    return -1;
#endif
  case COL_RAW_OPENBLAS:
    cblas_sgemm(CblasRowMajor, s->ta == 'T' ? CblasTrans : CblasNoTrans,
                s->tb == 'T' ? CblasTrans : CblasNoTrans, s->M, s->N, s->K,
                1.0f, A, lda, B, ldb, 0.0f, C, s->N);
    return 0;
  }
  return -1;
}

/* GFLOP/s: best of 3 runs of up to `iters` calls (a run stops early once it
 * has taken `budget` seconds), after one warm-up call. */
static double measure(const column *c, const gemm_shape *s, const float *A,
                      const float *B, float *C, const bench_args *a) {
  if (c->kind == COL_LOOM && loom_gemm_set_backend(c->backend) != LOOM_OK)
    return -1;
  /* Raw OpenBLAS gets the thread count itself; loom sets its own each call. */
  if (c->kind == COL_RAW_OPENBLAS)
    openblas_set_num_threads(a->threads);
  if (call(c, s, A, B, C) != 0)
    return -1;
  const double flops = 2.0 * s->M * s->N * (double)s->K;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    int n = 0;
    const double t0 = loom_time_now();
    double dt = 0;
    while (n < a->iters && dt < a->budget) {
      if (call(c, s, A, B, C) != 0)
        return -1;
      n++;
      dt = loom_time_now() - t0;
    }
    const double rate = flops * n / dt / 1e9;
    if (rate > best)
      best = rate;
  }
  return best;
}

/* The libraries measured, as loaded (not as compiled against): a table
 * from another version is another comparison. */
static void print_libraries(void) {
  printf("# libraries:");
#ifdef LOOM_HAVE_DNNL
  const dnnl_version_t *v = dnnl_version();
  if (v)
    printf(" oneDNN %d.%d.%d (git %.8s);", v->major, v->minor, v->patch,
           v->hash ? v->hash : "unknown");
#else
  printf(" oneDNN not built in;");
#endif
  /* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64" */
  const char *cfg = openblas_get_config();
  printf(" %s\n", cfg ? cfg : "OpenBLAS (no config string)");
}

int loom_bench_gemm(int argc, char **argv) {
  bench_args a = {loom_threads(), 10, 0.3, "all"};
  int rc = parse_args(argc, argv, &a);
  if (rc != 0)
    return rc > 0 ? LOOM_EXIT_OK : LOOM_EXIT_USAGE;
  loom_set_threads(a.threads);

  column cols[5];
  int ncols = 0;
  const bool all = strcmp(a.backend, "all") == 0;
#ifdef LOOM_HAVE_DNNL
  if (all || strcmp(a.backend, "dnnl") == 0) {
    cols[ncols++] = (column){COL_LOOM, LOOM_GEMM_DNNL, "loom:dnnl"};
    cols[ncols++] = (column){COL_RAW_DNNL, LOOM_GEMM_DNNL, "dnnl_sgemm"};
  }
#else
  if (strcmp(a.backend, "dnnl") == 0) {
    fprintf(stderr, "loom bench gemm: this loom was built without oneDNN\n");
    return LOOM_EXIT_USAGE;
  }
#endif
  if (all || strcmp(a.backend, "openblas") == 0) {
    cols[ncols++] = (column){COL_LOOM, LOOM_GEMM_OPENBLAS, "loom:openblas"};
    cols[ncols++] =
        (column){COL_RAW_OPENBLAS, LOOM_GEMM_OPENBLAS, "cblas_sgemm"};
  }
  if (all || strcmp(a.backend, "naive") == 0)
    cols[ncols++] = (column){COL_LOOM, LOOM_GEMM_NAIVE, "loom:naive"};

  size_t most = 0;
  for (int s = 0; s < NSHAPES; s++) {
    size_t m = (size_t)shapes[s].M * shapes[s].K;
    if ((size_t)shapes[s].K * shapes[s].N > m)
      m = (size_t)shapes[s].K * shapes[s].N;
    if ((size_t)shapes[s].M * shapes[s].N > m)
      m = (size_t)shapes[s].M * shapes[s].N;
    most = m > most ? m : most;
  }
  float *A = loom_malloc(most * sizeof(float));
  float *B = loom_malloc(most * sizeof(float));
  float *C = loom_calloc(most, sizeof(float));
  if (!A || !B || !C) {
    fprintf(stderr, "loom bench gemm: %s\n", loom_last_error());
    loom_free(A);
    loom_free(B);
    loom_free(C);
    return LOOM_EXIT_FAIL;
  }
  loom_rng r = loom_rng_init(1, 1);
  loom_rng_fill_uniform(&r, A, most, -1, 1);
  loom_rng_fill_uniform(&r, B, most, -1, 1);

  const loom_cpu_features *f = loom_cpu_get_features();
  printf("# loom bench gemm: %d thread%s, GFLOP/s, best of 3 runs of up to %d "
         "calls\n",
         a.threads, a.threads == 1 ? "" : "s", a.iters);
  print_libraries();
  printf("# loom_gemm grid: %s; cpu: avx2 %d, avx512f %d, amx_bf16 %d; loom's "
         "kernels: %s\n",
         loom_gemm_get_deterministic() ? "thread-count invariant"
                                       : "off (libraries thread themselves)",
         f->avx2, f->avx512f, f->amx_bf16, loom_isa_name(loom_cpu_isa()));
  printf("%-20s %2s %5s %5s %5s", "workload", "op", "M", "N", "K");
  for (int c = 0; c < ncols; c++)
    printf(" %13s", cols[c].title);
  printf("\n");
  const loom_gemm_backend saved = loom_gemm_get_backend();
  int failed = 0;
  for (int s = 0; s < NSHAPES; s++) {
    const gemm_shape *sh = &shapes[s];
    printf("%-20s %c%c %5d %5d %5d", sh->name, sh->ta, sh->tb, sh->M, sh->N,
           sh->K);
    fflush(stdout);
    for (int c = 0; c < ncols; c++) {
      const double g = measure(&cols[c], sh, A, B, C, &a);
      if (g < 0) {
        printf(" %13s", "error");
        failed = 1;
      } else {
        printf(" %13.1f", g);
      }
      fflush(stdout);
    }
    printf("\n");
  }
  (void)loom_gemm_set_backend(saved);
  loom_free(A);
  loom_free(B);
  loom_free(C);
  if (failed)
    fprintf(stderr, "loom bench gemm: some GEMMs failed: %s\n",
            loom_last_error());
  return failed ? LOOM_EXIT_FAIL : LOOM_EXIT_OK;
}
