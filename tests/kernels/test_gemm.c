/* GEMM tests: every backend x transpose combination x odd shapes x
 * alpha/beta against the double reference; beta = 0 ignores C; thread-count
 * invariance; argument checks; backend names and LOOM_GEMM. */
#include <stdlib.h>

#include "kt.h"

/* The backends this build has (dnnl only when built with oneDNN). */
static loom_gemm_backend backends[LOOM_GEMM_BACKEND_COUNT];
static int NBACKENDS;

static void find_backends(void) {
  for (int b = 0; b < LOOM_GEMM_BACKEND_COUNT; b++) {
    loom_status st = loom_gemm_set_backend((loom_gemm_backend)b);
    if (st == LOOM_OK)
      backends[NBACKENDS++] = (loom_gemm_backend)b;
    else /* only oneDNN may be missing, and then it says so */
      TT_CHECK(b == LOOM_GEMM_DNNL && st == LOOM_ERR_UNSUPPORTED);
  }
}

TT_TEST(gemm_backends_present) {
  find_backends();
  TT_CHECK(NBACKENDS >= 2);
}

/* C = alpha op(A) op(B) + beta C with padded leading dimensions; compared
 * with loom_gemm_ref. Returns 1 when close. */
static int check_one(bool ta, bool tb, int M, int N, int K, float alpha,
                     float beta, int pad, uint64_t seed) {
  const int ar = ta ? K : M, ac = ta ? M : K;
  const int br = tb ? N : K, bc = tb ? K : N;
  const int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
  float *A = kt_rand((size_t)ar * lda, seed, -1, 1);
  float *B = kt_rand((size_t)br * ldb, seed + 1, -1, 1);
  float *C = kt_rand((size_t)M * ldc, seed + 2, -1, 1);
  float *R = kt_copy(C, (size_t)M * ldc);
  int ok = 0;
  if (!A || !B || !C || !R)
    goto done;
  TT_CHECK_OK(loom_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  loom_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
  /* f32 sums of K products of magnitude <= 1: error grows like K eps. */
  const double atol = 1e-5 + 4e-7 * K * (fabs(alpha) + 0.1);
  ok = TT_CHECK_CLOSE(C, R, (size_t)M * ldc, atol, 1e-5);
  if (!ok)
    fprintf(stderr,
            "    backend %s det %d %c%c M=%d N=%d K=%d alpha=%g "
            "beta=%g pad=%d\n",
            loom_gemm_backend_name(loom_gemm_get_backend()),
            loom_gemm_get_deterministic(), ta ? 'T' : 'N', tb ? 'T' : 'N', M, N,
            K, alpha, beta, pad);
done:
  loom_free(A);
  loom_free(B);
  loom_free(C);
  loom_free(R);
  return ok;
}

static const int shapes[][3] = {
    {1, 1, 1},      {1, 7, 3},      {5, 1, 9},      {3, 4, 1},
    {17, 33, 65},   {64, 64, 64},   {127, 129, 31}, {130, 67, 300},
    {9, 300, 17},   {40, 24, 5000}, /* small C, long K: the K-split grid */
    {200, 3, 2500},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

TT_TEST(gemm_matches_reference) {
  const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}};
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    for (int det = 0; det < 2; det++) {
      if (backends[bi] == LOOM_GEMM_NAIVE && det == 0)
        continue; /* naive has one path */
      loom_gemm_set_deterministic(det);
      for (int s = 0; s < NSHAPES; s++)
        for (int t = 0; t < 4; t++) {
          const int k = (s + t) % 3; /* vary alpha/beta without a 3x cost */
          const int pad = (s + t) % 2 ? 3 : 0;
          check_one(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
                    ab[k][0], ab[k][1], pad, 100 + s * 4 + t);
        }
    }
  }
  loom_gemm_set_deterministic(true);
}

/* Every alpha/beta on every transpose for one odd shape per backend. */
TT_TEST(gemm_alpha_beta) {
  const float ab[][2] = {{1, 0}, {1, 1}, {2, 0.5f}, {-0.75f, -1}, {0.3f, 0}};
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    for (int t = 0; t < 4; t++)
      for (int k = 0; k < 5; k++)
        check_one(t & 1, t & 2, 23, 19, 45, ab[k][0], ab[k][1], 1, 7 + k);
  }
}

/* BLAS semantics: beta = 0 means C is not read, even if it holds NaN. */
TT_TEST(gemm_beta0_ignores_c) {
  const int M = 37, N = 21, K = 13;
  float *A = kt_rand((size_t)M * K, 1, -1, 1),
        *B = kt_rand((size_t)K * N, 2, -1, 1);
  float *C = kt_zeros((size_t)M * N), *R = kt_zeros((size_t)M * N);
  TT_REQUIRE(A && B && C && R);
  loom_gemm_ref(false, false, M, N, K, 1, A, K, B, N, 0, R, N);
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    for (int i = 0; i < M * N; i++)
      C[i] = NAN;
    TT_CHECK_OK(loom_gemm(false, false, M, N, K, 1, A, K, B, N, 0, C, N));
    TT_CHECK_CLOSE(C, R, (size_t)M * N, 1e-5, 1e-5);
  }
  loom_free(A);
  loom_free(B);
  loom_free(C);
  loom_free(R);
}

TT_TEST(gemm_degenerate_sizes) {
  float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 1, 1, 1, 1, 1};
  float C[4] = {1, 2, 3, 4};
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    /* K = 0: C = beta C */
    float c[4] = {1, 2, 3, 4};
    TT_CHECK_OK(loom_gemm(false, false, 2, 2, 0, 1, A, 1, B, 2, 0.5f, c, 2));
    TT_CHECK(c[0] == 0.5f && c[3] == 2.0f);
    /* alpha = 0, beta = 0: zeros, A and B not read */
    TT_CHECK_OK(loom_gemm(false, false, 2, 2, 3, 0, NULL, 3, NULL, 2, 0, c, 2));
    TT_CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0);
    /* M = 0 or N = 0: nothing */
    TT_CHECK_OK(loom_gemm(false, false, 0, 2, 3, 1, A, 3, B, 2, 0, C, 2));
    TT_CHECK_OK(loom_gemm(false, false, 2, 0, 3, 1, A, 3, B, 1, 0, C, 1));
    TT_CHECK(C[0] == 1 && C[3] == 4);
  }
}

TT_TEST(gemm_rejects_bad_arguments) {
  float A[4] = {0}, B[4] = {0}, C[4] = {0};
  TT_CHECK_EQ(loom_gemm(false, false, -1, 2, 2, 1, A, 2, B, 2, 0, C, 2),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK_EQ(loom_gemm(false, false, 2, 2, 2, 1, A, 1, B, 2, 0, C, 2),
              LOOM_ERR_INVALID_ARG); /* lda < K */
  TT_CHECK_EQ(loom_gemm(true, false, 2, 2, 2, 1, A, 2, B, 2, 0, C, 1),
              LOOM_ERR_INVALID_ARG); /* ldc < N */
  TT_CHECK_EQ(loom_gemm(false, true, 2, 3, 2, 1, A, 2, B, 1, 0, C, 3),
              LOOM_ERR_INVALID_ARG); /* ldb < K for B^T */
  TT_CHECK_EQ(loom_gemm(false, false, 2, 2, 2, 1, NULL, 2, B, 2, 0, C, 2),
              LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "NULL") != NULL);
  TT_CHECK_EQ(loom_gemm_set_backend(LOOM_GEMM_BACKEND_COUNT),
              LOOM_ERR_INVALID_ARG);
}

TT_TEST(gemm_backend_names) {
  for (int b = 0; b < LOOM_GEMM_BACKEND_COUNT; b++) {
    loom_gemm_backend out;
    TT_CHECK_OK(loom_gemm_backend_parse(
        loom_gemm_backend_name((loom_gemm_backend)b), &out));
    TT_CHECK_EQ(out, b);
  }
  loom_gemm_backend out;
  TT_CHECK_EQ(loom_gemm_backend_parse("mkl", &out), LOOM_ERR_INVALID_ARG);
  TT_CHECK(strstr(loom_last_error(), "mkl") != NULL);
  TT_CHECK_STR(loom_gemm_backend_name(LOOM_GEMM_BACKEND_COUNT), "unknown");
}

/* Shapes where dnnl_sgemm and OpenBLAS, left to thread themselves, give
 * different bits at 1 and 2 threads (measured: they split K or switch
 * kernels with the thread count). The deterministic grid must not. */
TT_TEST(gemm_thread_count_invariance) {
  static const int sh[][5] = {
      /* M, N, K, ta, tb */
      {128, 512, 784, 0, 1}, {128, 128, 1024, 0, 1}, {384, 128, 4096, 1, 0},
      {64, 200, 3000, 1, 0}, {40, 24, 5000, 0, 0},   {333, 77, 129, 1, 1},
  };
  loom_gemm_set_deterministic(true);
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
      const int M = sh[s][0], N = sh[s][1], K = sh[s][2];
      const bool ta = sh[s][3], tb = sh[s][4];
      if (backends[bi] == LOOM_GEMM_NAIVE && (int64_t)M * N * K > 60000000)
        continue;
      const int lda = ta ? M : K, ldb = tb ? K : N;
      float *A = kt_rand((size_t)M * K, 11 + s, -1, 1);
      float *B = kt_rand((size_t)K * N, 12 + s, -1, 1);
      float *C1 = kt_rand((size_t)M * N, 13, -1, 1);
      float *C2 = kt_copy(C1, (size_t)M * N), *C3 = kt_copy(C1, (size_t)M * N);
      TT_REQUIRE(A && B && C1 && C2 && C3);
      loom_set_threads(1);
      TT_CHECK_OK(loom_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0.5f, C1, N));
      loom_set_threads(2);
      TT_CHECK_OK(loom_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0.5f, C2, N));
      loom_set_threads(3);
      TT_CHECK_OK(loom_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0.5f, C3, N));
      KT_CHECK_SAME_BITS(C1, C2, (size_t)M * N);
      KT_CHECK_SAME_BITS(C1, C3, (size_t)M * N);
      loom_free(A);
      loom_free(B);
      loom_free(C1);
      loom_free(C2);
      loom_free(C3);
    }
  }
  loom_set_threads(0);
}

/* The linear layer's forward sets each tile of out to the bias as the
 * grid makes it: the bits of the bias copied into every row first and the
 * product added with beta 1 (and of beta 0 without a bias), on every
 * backend, either path, thread counts 1-3, shapes whose grid cuts K. */
TT_TEST(gemm_linear_bias_bits) {
  static const int sh[][3] = {/* N rows, C in, OC out */
                              {128, 784, 512}, {40, 5000, 24}, {7, 3, 5},
                              {300, 129, 67},  {1, 2500, 200}, {256, 64, 9}};
  for (int bi = 0; bi < NBACKENDS; bi++) {
    TT_REQUIRE_OK(loom_gemm_set_backend(backends[bi]));
    for (int det = 0; det < 2; det++) {
      if (backends[bi] == LOOM_GEMM_NAIVE && det == 0)
        continue;
      loom_gemm_set_deterministic(det);
      for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        const int N = sh[s][0], C = sh[s][1], OC = sh[s][2];
        const size_t no = (size_t)N * OC;
        float *x = kt_rand((size_t)N * C, 31 + s, -1, 1);
        float *w = kt_rand((size_t)OC * C, 32 + s, -1, 1);
        float *b = kt_rand((size_t)OC, 33 + s, -1, 1);
        float *want = kt_rand(no, 34, -1, 1), *nob = kt_copy(want, no);
        float *got = kt_rand(no, 35, -9, 9), *got0 = kt_copy(got, no);
        TT_REQUIRE(x && w && b && want && nob && got && got0);
        for (int t = 1; t <= 3; t++) {
          /* (dnnl_sgemm and OpenBLAS threading themselves, det 0, give
           * other bits at another thread count: the same count here) */
          loom_set_threads(t);
          for (int n = 0; n < N; n++)
            memcpy(want + (size_t)n * OC, b, (size_t)OC * sizeof(float));
          TT_CHECK_OK(loom_gemm(false, true, N, OC, C, 1.0f, x, C, w, C, 1.0f,
                                want, OC));
          TT_CHECK_OK(loom_gemm(false, true, N, OC, C, 1.0f, x, C, w, C, 0.0f,
                                nob, OC));
          TT_CHECK_OK(loom_linear_forward(got, x, w, b, N, C, OC));
          TT_CHECK_OK(loom_linear_forward(got0, x, w, NULL, N, C, OC));
          if (!kt_same_bits(got, want, no) || !kt_same_bits(got0, nob, no))
            fprintf(stderr, "    backend %s det %d threads %d %dx%dx%d\n",
                    loom_gemm_backend_name(backends[bi]), det, t, N, C, OC);
          KT_CHECK_SAME_BITS(got, want, no);
          KT_CHECK_SAME_BITS(got0, nob, no);
        }
        loom_set_threads(0);
        loom_free(x);
        loom_free(w);
        loom_free(b);
        loom_free(want);
        loom_free(nob);
        loom_free(got);
        loom_free(got0);
      }
    }
  }
  loom_gemm_set_deterministic(true);
}

/* The env var decides the backend on first use. */
TT_TEST(gemm_env_backend) {
  TT_CHECK_EQ(loom_gemm_get_backend(), LOOM_GEMM_NAIVE);
}

int main(void) {
  setenv("LOOM_GEMM", "naive", 1);
  TT_RUN(gemm_env_backend);
  TT_RUN(gemm_backends_present);
  TT_RUN(gemm_backend_names);
  TT_RUN(gemm_rejects_bad_arguments);
  TT_RUN(gemm_degenerate_sizes);
  TT_RUN(gemm_beta0_ignores_c);
  TT_RUN(gemm_alpha_beta);
  TT_RUN(gemm_matches_reference);
  TT_RUN(gemm_thread_count_invariance);
  TT_RUN(gemm_linear_bias_bits);
  return tt_finish();
}
