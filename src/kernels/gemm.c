/* GEMM: the thread-count invariant tile driver, the serial GEMM used inside
 * parallel loops, the calls of oneDNN and OpenBLAS, and the double-precision
 * reference. Built once per instruction set; the backend choice, which is
 * process state, lives in gemm_backend.c. */
#include <cblas.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

#ifdef LOOM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

/* OpenBLAS (the pthreads build) keeps its own pool: hold it to n threads,
 * and to 1 whenever OpenMP threads call it, so the two never oversubscribe
 * the cores. Asked each time, not cached: a program may also set it. */
static void ob_set_threads(int n) {
  if (openblas_get_num_threads() != n)
    openblas_set_num_threads(n);
}

/* ------------------------------------------------------------- reference */

void LOOM_ISA(loom_gemm_ref)(bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const float *A, int lda,
                             const float *B, int ldb, float beta, float *C,
                             int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int p = 0; p < K; p++) {
        double a = trans_a ? A[(int64_t)p * lda + i] : A[(int64_t)i * lda + p];
        double b = trans_b ? B[(int64_t)j * ldb + p] : B[(int64_t)p * ldb + j];
        s += a * b;
      }
      float *c = &C[(int64_t)i * ldc + j];
      double old = beta == 0.0f ? 0.0 : (double)beta * (double)*c;
      *c = (float)((double)alpha * s + old);
    }
}

/* ----------------------------------------------------------------- naive */

/* Row i of C: each element summed over K in order by one thread. */
static void naive_row(bool trans_a, bool trans_b, int i, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *c) {
  if (beta == 0.0f)
    memset(c, 0, (size_t)N * sizeof(float));
  else if (beta != 1.0f)
    for (int j = 0; j < N; j++)
      c[j] *= beta;
  if (!trans_b) {
    for (int p = 0; p < K; p++) {
      const float a =
          alpha * (trans_a ? A[(int64_t)p * lda + i] : A[(int64_t)i * lda + p]);
      const float *b = B + (int64_t)p * ldb;
      for (int j = 0; j < N; j++)
        c[j] = fmaf(a, b[j], c[j]);
    }
  } else if (!trans_a) {
    const float *a = A + (int64_t)i * lda;
    for (int j = 0; j < N; j++)
      c[j] = fmaf(alpha, loom_kern_dot(a, B + (int64_t)j * ldb, K), c[j]);
  } else {
    for (int j = 0; j < N; j++) {
      const float *b = B + (int64_t)j * ldb;
      float s = 0.0f;
      for (int p = 0; p < K; p++)
        s = fmaf(A[(int64_t)p * lda + i], b[p], s);
      c[j] = fmaf(alpha, s, c[j]);
    }
  }
}

static void naive_gemm(bool trans_a, bool trans_b, int M, int N, int K,
                       float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc, int nthreads) {
#pragma omp parallel for num_threads(nthreads)                                 \
    schedule(static) if (nthreads > 1)
  for (int i = 0; i < M; i++)
    naive_row(trans_a, trans_b, i, N, K, alpha, A, lda, B, ldb, beta,
              C + (int64_t)i * ldc);
}

/* ------------------------------------------------------- vendor, 1 thread */

/* Runs on the calling thread only: oneDNN does not nest parallelism (it runs
 * serially inside a parallel region; outside one we cap OpenMP to 1), and
 * OpenBLAS was set to 1 thread by the caller. Returns 0 on success. */
static int vendor_gemm_1t(loom_gemm_backend be, bool ta, bool tb, int M, int N,
                          int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float beta, float *C,
                          int ldc) {
  switch (be) {
  case LOOM_GEMM_DNNL:
#ifdef LOOM_HAVE_DNNL
  {
    int save = 0;
    if (!omp_in_parallel() && (save = omp_get_max_threads()) > 1)
      omp_set_num_threads(1);
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                                  alpha, A, lda, B, ldb, beta, C, ldc);
    if (save > 1)
      omp_set_num_threads(save);
    return st == dnnl_success ? 0 : (int)st;
  }
#else
    return -1;
#endif
  case LOOM_GEMM_OPENBLAS:
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
                beta, C, ldc);
    return 0;
  case LOOM_GEMM_NAIVE:
    naive_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1);
    return 0;
  case LOOM_GEMM_BACKEND_COUNT:
    break;
  }
  return -1;
}

void loom_kern_gemm_serial_begin(void) {
  if (loom_gemm_get_backend() == LOOM_GEMM_OPENBLAS)
    ob_set_threads(1);
}

void loom_kern_gemm_serial(bool trans_a, bool trans_b, int M, int N, int K,
                           float alpha, const float *A, int lda, const float *B,
                           int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0)
    return;
  (void)vendor_gemm_1t(loom_gemm_get_backend(), trans_a, trans_b, M, N, K,
                       alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C = alpha op(A) op(B) + beta C over the grid (loom_kern_gemm_tiled),
 * each tile by the library on one thread. */
typedef struct tile_ctx {
  loom_gemm_backend be;
  bool ta, tb;
  float alpha;
  const float *A, *B;
  int lda, ldb;
} tile_ctx;

static int tile_f32(void *ctx, int i0, int j0, int k0, int mm, int nn, int kk,
                    float beta, float *c, int ldc) {
  const tile_ctx *x = ctx;
  const float *a = x->ta ? x->A + (int64_t)k0 * x->lda + i0
                         : x->A + (int64_t)i0 * x->lda + k0;
  const float *b = x->tb ? x->B + (int64_t)j0 * x->ldb + k0
                         : x->B + (int64_t)k0 * x->ldb + j0;
  return vendor_gemm_1t(x->be, x->ta, x->tb, mm, nn, kk, x->alpha, a, x->lda, b,
                        x->ldb, beta, c, ldc);
}

static loom_status tiled_gemm(loom_gemm_backend be, bool ta, bool tb, int M,
                              int N, int K, float alpha, const float *A,
                              int lda, const float *B, int ldb, float beta,
                              const float *bias, float *C, int ldc) {
  if (be == LOOM_GEMM_OPENBLAS)
    ob_set_threads(1);
  tile_ctx x = {be, ta, tb, alpha, A, B, lda, ldb};
  int rc;
  LOOM_TRY(
      loom_kern_gemm_tiled(M, N, K, beta, C, ldc, bias, tile_f32, &x, &rc));
  if (rc != 0)
    return loom_error(LOOM_ERR_INTERNAL, "gemm %dx%dx%d: %s failed (%d)", M, N,
                      K, loom_gemm_backend_name(be), rc);
  return LOOM_OK;
}

/* ------------------------------------------------------------ dispatch */

static void scale_c(int M, int N, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++) {
    float *c = C + (int64_t)i * ldc;
    if (beta == 0.0f)
      memset(c, 0, (size_t)N * sizeof(float));
    else
      for (int j = 0; j < N; j++)
        c[j] *= beta;
  }
}

/* C's rows set to bias (N floats), over the threads when it pays. */
static void fill_rows(int M, int N, const float *bias, float *C, int ldc) {
  const int nt = loom_kern_nthreads((int64_t)M * N, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int i = 0; i < M; i++)
    memcpy(C + (int64_t)i * ldc, bias, (size_t)N * sizeof(float));
}

/* loom_gemm, with bias (N floats, or NULL) standing for C's prior values
 * in every row (beta 1: C = op(A) op(B) + bias). */
static loom_status gemm_impl(bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const float *A, int lda,
                             const float *B, int ldb, float beta,
                             const float *bias, float *C, int ldc) {
  LOOM_TRY(
      loom_kern_gemm_dims("gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc));
  if (M == 0 || N == 0)
    return LOOM_OK;
  if (!C || (K > 0 && alpha != 0.0f && (!A || !B)))
    return loom_error(LOOM_ERR_INVALID_ARG, "gemm %dx%dx%d: NULL matrix", M, N,
                      K);
  const loom_gemm_backend be = loom_gemm_get_backend();
  const bool tiled = K > 0 && alpha != 0.0f && be != LOOM_GEMM_NAIVE &&
                     loom_gemm_get_deterministic();
  if (tiled) /* the grid sets each tile to the bias as it makes it */
    return tiled_gemm(be, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                      beta, bias, C, ldc);
  if (bias)
    fill_rows(M, N, bias, C, ldc);
  if (K == 0 || alpha == 0.0f) {
    if (beta != 1.0f)
      scale_c(M, N, beta, C, ldc);
    return LOOM_OK;
  }
  if (be == LOOM_GEMM_NAIVE) {
    int nt = loom_kern_nthreads((int64_t)M * N * K, 1 << 16);
    naive_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
               nt > M ? M : nt);
    return LOOM_OK;
  }
  const int nt = loom_threads(); /* also sets OpenMP's count for oneDNN */
  if (be == LOOM_GEMM_OPENBLAS) {
    ob_set_threads(nt);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, C, ldc);
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_DNNL
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N,
                                K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    return loom_error(LOOM_ERR_INTERNAL, "dnnl_sgemm %dx%dx%d failed (%d)", M,
                      N, K, (int)st);
  return LOOM_OK;
#else
  return loom_error(LOOM_ERR_UNSUPPORTED, "gemm: built without oneDNN");
#endif
}

loom_status LOOM_ISA(loom_gemm)(bool trans_a, bool trans_b, int M, int N, int K,
                                float alpha, const float *A, int lda,
                                const float *B, int ldb, float beta, float *C,
                                int ldc) {
  return gemm_impl(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, NULL,
                   C, ldc);
}

loom_status LOOM_ISA(loom_kern_gemm_bias)(bool trans_a, bool trans_b, int M,
                                          int N, int K, const float *A, int lda,
                                          const float *B, int ldb,
                                          const float *bias, float *C,
                                          int ldc) {
  return gemm_impl(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb,
                   bias ? 1.0f : 0.0f, bias, C, ldc);
}
