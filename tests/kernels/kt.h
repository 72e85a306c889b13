/* kt: helpers shared by the kernels tests: random buffers, bitwise
 * comparison, runs at several thread counts, central finite differences. */
#ifndef LOOM_TESTS_KT_H
#define LOOM_TESTS_KT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "loom/core.h"
#include "loom/kernels.h"
#include "tt.h"

/* A buffer of n floats uniform in [lo, hi) from a fixed seed. */
__attribute__((unused)) static float *kt_rand(size_t n, uint64_t seed, float lo,
                                              float hi) {
  float *x = loom_malloc((n ? n : 1) * sizeof(float));
  if (!x)
    return NULL;
  loom_rng r = loom_rng_init(seed, 7);
  loom_rng_fill_uniform(&r, x, n, lo, hi);
  return x;
}

__attribute__((unused)) static float *kt_copy(const float *x, size_t n) {
  float *y = loom_malloc((n ? n : 1) * sizeof(float));
  if (y && n)
    memcpy(y, x, n * sizeof(float));
  return y;
}

__attribute__((unused)) static float *kt_zeros(size_t n) {
  return loom_calloc(n ? n : 1, sizeof(float));
}

/* Bitwise equality (so -0 != +0 and NaN payloads count). */
__attribute__((unused)) static int kt_same_bits(const float *a, const float *b,
                                                size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

#define KT_CHECK_SAME_BITS(a, b, n)                                            \
  do {                                                                         \
    if (!kt_same_bits((a), (b), (n))) {                                        \
      size_t kt_i_ = 0;                                                        \
      while (kt_i_ < (size_t)(n) &&                                            \
             memcmp(&(a)[kt_i_], &(b)[kt_i_], sizeof(float)) == 0)             \
        kt_i_++;                                                               \
      tt_fail_prefix(__FILE__, __LINE__);                                      \
      fprintf(stderr,                                                          \
              "%s and %s differ in bits, first at [%zu]: %.9g vs %.9g\n", #a,  \
              #b, kt_i_, (double)(a)[kt_i_], (double)(b)[kt_i_]);              \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

/* Loss for finite differences: sum(out * g) accumulated in double, so the
 * rounding of the sum does not drown the difference being measured. */
__attribute__((unused)) static double kt_dot_d(const float *out, const float *g,
                                               size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += (double)out[i] * (double)g[i];
  return s;
}

typedef double (*kt_loss_fn)(void *ctx);

/* Central differences of f with respect to x[idx] for `count` indices
 * spread over [0, n) (all of them when count >= n); writes fd[k] for the
 * k-th checked index and the index into idx[k]. Returns how many. */
__attribute__((unused)) static int kt_fd(kt_loss_fn f, void *ctx, float *x,
                                         int64_t n, float h, int count,
                                         int64_t *idx, double *fd) {
  int m = 0;
  loom_rng r = loom_rng_init(99, (uint64_t)n);
  for (int64_t k = 0; k < n && m < count; k++) {
    int64_t i = count >= n ? k : (int64_t)loom_rng_below(&r, (uint64_t)n);
    const float save = x[i];
    const float xp = save + h, xm = save - h;
    x[i] = xp;
    const double lp = f(ctx);
    x[i] = xm;
    const double lm = f(ctx);
    x[i] = save;
    idx[m] = i;
    fd[m] = (lp - lm) / ((double)xp - (double)xm);
    m++;
  }
  return m;
}

/* Checks analytic gradient `grad` against finite differences of f at the
 * sampled entries of x: |g - fd| <= atol + rtol |fd|. */
#define KT_CHECK_FD(f, ctx, x, n, grad, h, count, atol, rtol)                  \
  do {                                                                         \
    int64_t kt_idx_[256];                                                      \
    double kt_fd_[256];                                                        \
    int kt_m_ = kt_fd((f), (ctx), (x), (n), (h),                               \
                      (count) > 256 ? 256 : (count), kt_idx_, kt_fd_);         \
    int kt_bad_ = 0;                                                           \
    double kt_worst_ = 0;                                                      \
    for (int kt_k_ = 0; kt_k_ < kt_m_; kt_k_++) {                              \
      double kt_g_ = (grad)[kt_idx_[kt_k_]];                                   \
      double kt_d_ = fabs(kt_g_ - kt_fd_[kt_k_]);                              \
      if (kt_d_ > kt_worst_)                                                   \
        kt_worst_ = kt_d_;                                                     \
      if (!(kt_d_ <= (atol) + (rtol)*fabs(kt_fd_[kt_k_]))) {                   \
        if (!kt_bad_) {                                                        \
          tt_fail_prefix(__FILE__, __LINE__);                                  \
          fprintf(stderr, "%s vs finite differences of %s:\n", #grad, #x);     \
        }                                                                      \
        if (kt_bad_ < 5)                                                       \
          fprintf(stderr, "    [%lld] analytic %.7g fd %.7g\n",                \
                  (long long)kt_idx_[kt_k_], kt_g_, kt_fd_[kt_k_]);            \
        kt_bad_++;                                                             \
      }                                                                        \
    }                                                                          \
    if (kt_bad_) {                                                             \
      fprintf(stderr, "    %d of %d differ, max abs diff %.3g\n", kt_bad_,     \
              kt_m_, kt_worst_);                                               \
      tt_fail_done();                                                          \
    }                                                                          \
  } while (0)

#endif /* LOOM_TESTS_KT_H */
