/* Gradient clipping by global L2 norm with a sum of squares whose value does
 * not depend on the thread count, and the inf/NaN check. */
#include "loom/optim.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "internal.h"

/* Chunks summed per parallel round: the partial sums fit on the stack. */
#define ROUND_CHUNKS 512

/* Sum of squares of x(n), n <= LOOM_GRAD_CHUNK, in 16 lanes (element i in
 * lane i % 16) combined as a fixed tree: the same bits on every machine and
 * with AVX, SSE2 or neither, since a float squared is exact in double and only
 * the lane additions round, in the same order either way. */
static double chunk_sumsq(const float *restrict x, int64_t n) {
  double acc[16] = {0};
  int64_t i = 0;
#if defined(__AVX__)
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8));
    __m256d x3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(x0, x0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(x1, x1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(x2, x2));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(x3, x3));
  }
  _mm256_storeu_pd(acc, a0);
  _mm256_storeu_pd(acc + 4, a1);
  _mm256_storeu_pd(acc + 8, a2);
  _mm256_storeu_pd(acc + 12, a3);
#elif defined(__SSE2__)
  __m128d a[8];
  for (int l = 0; l < 8; l++)
    a[l] = _mm_setzero_pd();
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 8; l++) {
      __m128d v = _mm_cvtps_pd(_mm_castsi128_ps(
          _mm_loadl_epi64((const __m128i *)(const void *)(x + i + 2 * l))));
      a[l] = _mm_add_pd(a[l], _mm_mul_pd(v, v));
    }
  for (int l = 0; l < 8; l++)
    _mm_storeu_pd(acc + 2 * l, a[l]);
#endif
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) {
      double v = (double)x[i + l];
      acc[l] += v * v;
    }
  for (int l = 0; i < n; i++, l++) {
    double v = (double)x[i];
    acc[l] += v * v;
  }
  for (int w = 8; w >= 1; w /= 2) /* pairwise: (0+8), (1+9), ... */
    for (int l = 0; l < w; l++)
      acc[l] += acc[l + w];
  return acc[0];
}

double LOOM_ISA(loom_grad_sumsq)(const float *g, int64_t n) {
  if (!g || n <= 0)
    return 0.0;
  int64_t nchunks = (n + LOOM_GRAD_CHUNK - 1) / LOOM_GRAD_CHUNK;
  double total = 0.0;
  double part[ROUND_CHUNKS];
  for (int64_t c0 = 0; c0 < nchunks; c0 += ROUND_CHUNKS) {
    int nc = (int)(nchunks - c0 < ROUND_CHUNKS ? nchunks - c0 : ROUND_CHUNKS);
    int64_t first = c0 * LOOM_GRAD_CHUNK;
    int nt = loom_optim_threads_for((int64_t)nc * LOOM_GRAD_CHUNK < n - first
                                        ? (int64_t)nc * LOOM_GRAD_CHUNK
                                        : n - first);
    /* Each chunk's sum has its own slot, so threads may take chunks in any
     * order: dynamic shares survive a busy core. */
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 8)
    for (int c = 0; c < nc; c++) {
      int64_t a = first + (int64_t)c * LOOM_GRAD_CHUNK;
      int64_t len = n - a < LOOM_GRAD_CHUNK ? n - a : LOOM_GRAD_CHUNK;
      part[c] = chunk_sumsq(g + a, len);
    }
    for (int c = 0; c < nc; c++) /* in index order, whatever the threads */
      total += part[c];
  }
  return total;
}

void LOOM_ISA(loom_grad_scale)(float *g, int64_t n, float s) {
  if (!g || n <= 0)
    return;
  int nt = loom_optim_threads_for(n);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int64_t lo, hi;
    loom_optim_part(0, n, omp_get_thread_num(), omp_get_num_threads(), &lo,
                    &hi);
    float *restrict x = g;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++)
      x[i] = x[i] * s;
  }
}

static bool isnonfinite_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) == 0x7f800000u;
}

bool LOOM_ISA(loom_grad_has_nonfinite)(const float *g, int64_t n) {
  if (!g || n <= 0)
    return false;
  int bad = 0;
  int nt = loom_optim_threads_for(n);
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : bad)
  {
    int64_t lo, hi;
    loom_optim_part(0, n, omp_get_thread_num(), omp_get_num_threads(), &lo,
                    &hi);
    int b = 0;
#pragma omp simd reduction(| : b)
    for (int64_t i = lo; i < hi; i++)
      b |= isnonfinite_bits(g[i]);
    bad |= b;
  }
  return bad != 0;
}

loom_status LOOM_ISA(loom_grad_clip_sumsq)(float *g, int64_t n, double sumsq,
                                           float max_norm, double *norm) {
  if (!(max_norm > 0.0f) || isinf(max_norm))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "clip: max_norm must be finite and > 0 (got %g)",
                      (double)max_norm);
  if (n < 0 || (n > 0 && !g))
    return loom_error(LOOM_ERR_INVALID_ARG, "clip: %lld gradients at %p",
                      (long long)n, (void *)g);
  double total = sqrt(sumsq);
  if (norm)
    *norm = total;
  if (!isfinite(total))
    return LOOM_OK;
  /* PyTorch's clip_grad_norm_: coef = max_norm / (norm + 1e-6), capped at 1. */
  double coef = (double)max_norm / (total + 1e-6);
  if (coef < 1.0)
    loom_grad_scale(g, n, (float)coef);
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_grad_clip)(float *g, int64_t n, float max_norm,
                                     double *norm) {
  if (n < 0 || (n > 0 && !g))
    return loom_error(LOOM_ERR_INVALID_ARG, "clip: %lld gradients at %p",
                      (long long)n, (void *)g);
  return loom_grad_clip_sumsq(g, n, loom_grad_sumsq(g, n), max_norm, norm);
}
