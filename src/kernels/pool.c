/* 2-D max pooling (window K, stride S, no padding) and its backward. One
 * thread owns a (n, c) plane, so overlapping windows (S < K) still add
 * into the input gradient in a fixed order. */
#include <omp.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/internal.h"
#include "loom/kernels.h"

#if defined(__AVX2__)
/* Even and odd elements of the 16 floats at p, each in order. */
static inline void deinterleave(const float *p, __m256 *even, __m256 *odd) {
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  /* per 128-bit lane [a0 a2 b0 b2 | a4 a6 b4 b6]; the permute orders it */
  *even = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
      _MM_SHUFFLE(3, 1, 2, 0)));
  *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))),
      _MM_SHUFFLE(3, 1, 2, 0)));
}

/* Where v > m (ordered: never for NaN, as the scalar `>`): m = v and
 * best = idx. */
static inline void take_if_greater(__m256 v, __m256i idx, __m256 *m,
                                   __m256i *best) {
  const __m256 c = _mm256_cmp_ps(v, *m, _CMP_GT_OQ);
  *m = _mm256_blendv_ps(*m, v, c);
  *best = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(*best),
                                               _mm256_castsi256_ps(idx), c));
}

/* Outputs [0, 8k) of row oh of a 2x2 stride-2 plane, 8 at a time, in the
 * scalar loop's order of comparisons; returns the first column not done. */
static int pool2_row_avx2(float *o, int32_t *am, const float *r0,
                          const float *r1, int oh, int W, int OW) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i lane = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  int ow = 0;
  for (; ow + 8 <= OW; ow += 8) {
    const int i = 2 * ow;
    __m256 e0, o0, e1, o1;
    deinterleave(r0 + i, &e0, &o0);
    deinterleave(r1 + i, &e1, &o1);
    const __m256i top = _mm256_add_epi32(_mm256_set1_epi32(2 * oh * W + i),
                                         lane);
    const __m256i bot = _mm256_add_epi32(
        _mm256_set1_epi32((2 * oh + 1) * W + i), lane);
    __m256 m = e0;
    __m256i best = top;
    take_if_greater(o0, _mm256_add_epi32(top, one), &m, &best);
    take_if_greater(e1, bot, &m, &best);
    take_if_greater(o1, _mm256_add_epi32(bot, one), &m, &best);
    _mm256_storeu_ps(o + ow, m);
    _mm256_storeu_si256((__m256i *)(void *)(am + ow), best);
  }
  return ow;
}
#endif

void loom_maxpool2d_forward(float *out, int32_t *argmax, const float *inp,
                            int N, int C, int H, int W, int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const int64_t planes = (int64_t)N * C;
  const int nt = loom_kern_nthreads(planes * H * W, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *x = inp + pl * H * W;
    float *o = out + pl * OH * OW;
    int32_t *am = argmax + pl * OH * OW;
    if (K == 2 && S == 2) { /* the common case, unrolled and branch-free */
      for (int oh = 0; oh < OH; oh++) {
        const float *r0 = x + (int64_t)(2 * oh) * W, *r1 = r0 + W;
        int ow0 = 0;
#if defined(__AVX2__)
        ow0 = pool2_row_avx2(o + oh * OW, am + oh * OW, r0, r1, oh, W, OW);
#endif
        for (int ow = ow0; ow < OW; ow++) {
          const int i = 2 * ow;
          float m = r0[i];
          int best = 2 * oh * W + i;
          best = r0[i + 1] > m ? best + 1 : best;
          m = r0[i + 1] > m ? r0[i + 1] : m;
          best = r1[i] > m ? (2 * oh + 1) * W + i : best;
          m = r1[i] > m ? r1[i] : m;
          best = r1[i + 1] > m ? (2 * oh + 1) * W + i + 1 : best;
          m = r1[i + 1] > m ? r1[i + 1] : m;
          o[oh * OW + ow] = m;
          am[oh * OW + ow] = best;
        }
      }
      continue;
    }
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        const int h0 = oh * S, w0 = ow * S;
        int best = h0 * W + w0;
        float m = x[best];
        for (int kh = 0; kh < K; kh++) {
          const float *row = x + (int64_t)(h0 + kh) * W + w0;
          for (int kw = 0; kw < K; kw++) {
            /* strict: the first maximum wins ties; selects, not branches
             * (a maximum's position is a coin toss for the predictor) */
            const float v = row[kw];
            best = v > m ? (h0 + kh) * W + w0 + kw : best;
            m = v > m ? v : m;
          }
        }
        o[oh * OW + ow] = m;
        am[oh * OW + ow] = best;
      }
  }
}

void loom_maxpool2d_backward(float *dinp, const float *dout,
                             const int32_t *argmax, int N, int C, int H, int W,
                             int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const int64_t planes = (int64_t)N * C;
  const int nt = loom_kern_nthreads(planes * H * W, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = dinp + pl * H * W;
    const float *d = dout + pl * OH * OW;
    const int32_t *am = argmax + pl * OH * OW;
    for (int i = 0; i < OH * OW; i++)
      dx[am[i]] += d[i];
  }
}

/* A plane is cleared and filled while it sits in L1, so dinp goes to
 * memory once instead of being cleared, read back and written again. */
void loom_maxpool2d_backward_to(float *dinp, const float *dout,
                                const int32_t *argmax, int N, int C, int H,
                                int W, int K, int S) {
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const int64_t planes = (int64_t)N * C;
  const int nt = loom_kern_nthreads(planes * H * W, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = dinp + pl * H * W;
    const float *d = dout + pl * OH * OW;
    const int32_t *am = argmax + pl * OH * OW;
    memset(dx, 0, (size_t)H * W * sizeof(float));
    for (int i = 0; i < OH * OW; i++)
      dx[am[i]] += d[i];
  }
}
