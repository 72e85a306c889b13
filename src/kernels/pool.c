/* 2-D max pooling (window K, stride S, no padding) and its backward, also
 * of relu(input) with the ReLU applied as values are read. One thread owns
 * a (n, c) plane, so overlapping windows (S < K) still add into the input
 * gradient in a fixed order. */
#include <omp.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "internal.h"
#include "loom/kernels.h"

#if defined(__AVX2__)
/* Even and odd elements of the 16 floats at p, each in order; with relu,
 * of relu(p[i]): max(x, 0) returns its second operand for NaN and for -0,
 * so it is exactly `x > 0 ? x : 0`. */
static inline void deinterleave(const float *p, bool relu, __m256 *even,
                                __m256 *odd) {
  __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  if (relu) {
    a = _mm256_max_ps(a, _mm256_setzero_ps());
    b = _mm256_max_ps(b, _mm256_setzero_ps());
  }
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
                          const float *r1, int oh, int W, int OW, bool relu) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i lane = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  int ow = 0;
  for (; ow + 8 <= OW; ow += 8) {
    const int i = 2 * ow;
    __m256 e0, o0, e1, o1;
    deinterleave(r0 + i, relu, &e0, &o0);
    deinterleave(r1 + i, relu, &e1, &o1);
    const __m256i top =
        _mm256_add_epi32(_mm256_set1_epi32(2 * oh * W + i), lane);
    const __m256i bot =
        _mm256_add_epi32(_mm256_set1_epi32((2 * oh + 1) * W + i), lane);
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

/* The same 4 outputs at a time from column ow (the rest of a row after the
 * 8-wide loop, and small planes). */
static inline void deinterleave4(const float *p, bool relu, __m128 *even,
                                 __m128 *odd) {
  __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4);
  if (relu) {
    a = _mm_max_ps(a, _mm_setzero_ps());
    b = _mm_max_ps(b, _mm_setzero_ps());
  }
  *even = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  *odd = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}

static inline void take_if_greater4(__m128 v, __m128i idx, __m128 *m,
                                    __m128i *best) {
  const __m128 c = _mm_cmp_ps(v, *m, _CMP_GT_OQ);
  *m = _mm_blendv_ps(*m, v, c);
  *best = _mm_castps_si128(
      _mm_blendv_ps(_mm_castsi128_ps(*best), _mm_castsi128_ps(idx), c));
}

static int pool2_row_sse(float *o, int32_t *am, const float *r0,
                         const float *r1, int oh, int W, int OW, int ow,
                         bool relu) {
  const __m128i one = _mm_set1_epi32(1), lane = _mm_setr_epi32(0, 2, 4, 6);
  for (; ow + 4 <= OW; ow += 4) {
    const int i = 2 * ow;
    __m128 e0, o0, e1, o1;
    deinterleave4(r0 + i, relu, &e0, &o0);
    deinterleave4(r1 + i, relu, &e1, &o1);
    const __m128i top = _mm_add_epi32(_mm_set1_epi32(2 * oh * W + i), lane);
    const __m128i bot =
        _mm_add_epi32(_mm_set1_epi32((2 * oh + 1) * W + i), lane);
    __m128 m = e0;
    __m128i best = top;
    take_if_greater4(o0, _mm_add_epi32(top, one), &m, &best);
    take_if_greater4(e1, bot, &m, &best);
    take_if_greater4(o1, _mm_add_epi32(bot, one), &m, &best);
    _mm_storeu_ps(o + ow, m);
    _mm_storeu_si128((__m128i *)(void *)(am + ow), best);
  }
  return ow;
}
#endif

/* relu as loom_relu_forward computes it */
static inline float rl(float x, bool relu) {
  return relu ? (x > 0.0f ? x : 0.0f) : x;
}

static inline void pool_forward(float *out, int32_t *argmax, const float *inp,
                                int N, int C, int H, int W, int K, int S,
                                bool relu) {
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
        ow0 =
            pool2_row_avx2(o + oh * OW, am + oh * OW, r0, r1, oh, W, OW, relu);
        ow0 = pool2_row_sse(o + oh * OW, am + oh * OW, r0, r1, oh, W, OW, ow0,
                            relu);
#endif
        for (int ow = ow0; ow < OW; ow++) {
          const int i = 2 * ow;
          const float a = rl(r0[i], relu), b = rl(r0[i + 1], relu);
          const float c = rl(r1[i], relu), e = rl(r1[i + 1], relu);
          float m = a;
          int best = 2 * oh * W + i;
          best = b > m ? best + 1 : best;
          m = b > m ? b : m;
          best = c > m ? (2 * oh + 1) * W + i : best;
          m = c > m ? c : m;
          best = e > m ? (2 * oh + 1) * W + i + 1 : best;
          m = e > m ? e : m;
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
        float m = rl(x[best], relu);
        for (int kh = 0; kh < K; kh++) {
          const float *row = x + (int64_t)(h0 + kh) * W + w0;
          for (int kw = 0; kw < K; kw++) {
            /* strict: the first maximum wins ties; selects, not branches
             * (a maximum's position is a coin toss for the predictor) */
            const float v = rl(row[kw], relu);
            best = v > m ? (h0 + kh) * W + w0 + kw : best;
            m = v > m ? v : m;
          }
        }
        o[oh * OW + ow] = m;
        am[oh * OW + ow] = best;
      }
  }
}

void LOOM_ISA(loom_maxpool2d_forward)(float *out, int32_t *argmax,
                                      const float *inp, int N, int C, int H,
                                      int W, int K, int S) {
  pool_forward(out, argmax, inp, N, C, H, W, K, S, false);
}

void LOOM_ISA(loom_relu_maxpool2d_forward)(float *out, int32_t *argmax,
                                           const float *inp, int N, int C,
                                           int H, int W, int K, int S) {
  pool_forward(out, argmax, inp, N, C, H, W, K, S, true);
}

void LOOM_ISA(loom_maxpool2d_backward)(float *dinp, const float *dout,
                                       const int32_t *argmax, int N, int C,
                                       int H, int W, int K, int S) {
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
void LOOM_ISA(loom_maxpool2d_backward_to)(float *dinp, const float *dout,
                                          const int32_t *argmax, int N, int C,
                                          int H, int W, int K, int S) {
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

/* 0 + (x > 0 ? g : 0) without a branch on the sign of x (a coin toss for
 * the predictor): g's bits masked. */
static inline float relu_grad(float x, float g) {
  uint32_t b;
  memcpy(&b, &g, sizeof b);
  b &= -(uint32_t)(x > 0.0f);
  float v;
  memcpy(&v, &b, sizeof v);
  return 0.0f + v;
}

#if defined(__AVX2__)
/* Row oh of a 2x2 stride-2 plane: every input of the row's windows written
 * (the argmax one gets relu_grad, the others +0), 8 windows at a time as
 * two rows of 16 contiguous floats, the rest one by one. */
static void relu_pool2_back_row(float *dx, const float *x, const float *d,
                                const int32_t *am, int oh, int W, int OW) {
  const __m256 z = _mm256_setzero_ps();
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i lane = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  float *d0 = dx + (int64_t)(2 * oh) * W, *d1 = d0 + W;
  const float *x0 = x + (int64_t)(2 * oh) * W, *x1 = x0 + W;
  int ow = 0;
  for (; ow + 8 <= OW; ow += 8) {
    const int i = 2 * ow;
    const __m256 g = _mm256_add_ps(z, _mm256_loadu_ps(d + ow));
    const __m256i a =
        _mm256_loadu_si256((const __m256i *)(const void *)(am + ow));
    const __m256i top =
        _mm256_add_epi32(_mm256_set1_epi32(2 * oh * W + i), lane);
    const __m256i bot =
        _mm256_add_epi32(_mm256_set1_epi32((2 * oh + 1) * W + i), lane);
    __m256 xe0, xo0, xe1, xo1;
    deinterleave(x0 + i, false, &xe0, &xo0);
    deinterleave(x1 + i, false, &xe1, &xo1);
    const __m256i idx[4] = {top, _mm256_add_epi32(top, one), bot,
                            _mm256_add_epi32(bot, one)};
    const __m256 xs[4] = {xe0, xo0, xe1, xo1};
    __m256 v[4];
    for (int k = 0; k < 4; k++) {
      const __m256 hit = _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, idx[k]));
      const __m256 pos = _mm256_cmp_ps(xs[k], z, _CMP_GT_OQ);
      v[k] = _mm256_add_ps(z, _mm256_and_ps(_mm256_and_ps(hit, pos), g));
    }
    /* back to input order: even, odd, even, odd... */
    for (int r = 0; r < 2; r++) {
      const __m256 lo = _mm256_unpacklo_ps(v[2 * r], v[2 * r + 1]);
      const __m256 hi = _mm256_unpackhi_ps(v[2 * r], v[2 * r + 1]);
      float *dst = r ? d1 : d0;
      _mm256_storeu_ps(dst + i, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(dst + i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  }
  for (; ow < OW; ow++) {
    const int j = am[ow];
    dx[j] = relu_grad(x[j], 0.0f + d[ow]);
  }
}
#endif

/* Windows that do not overlap (S >= K) send each input at most one output
 * gradient, so relu'(inp) applies as it lands: 0 + (0 + d) where the input
 * is positive, as the two `_to` passes compute it, in one pass over dinp
 * (cleared while the plane sits in L1) instead of three. */
void LOOM_ISA(loom_relu_maxpool2d_backward_to)(float *dinp, const float *dout,
                                               const int32_t *argmax,
                                               const float *inp, int N, int C,
                                               int H, int W, int K, int S) {
  if (S < K) {
    loom_maxpool2d_backward_to(dinp, dout, argmax, N, C, H, W, K, S);
    loom_relu_backward_to(dinp, inp, dinp, (int64_t)N * C * H * W);
    return;
  }
  const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
  const int64_t planes = (int64_t)N * C;
  const int nt = loom_kern_nthreads(planes * H * W, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = dinp + pl * H * W;
    const float *x = inp + pl * H * W;
    const float *d = dout + pl * OH * OW;
    const int32_t *am = argmax + pl * OH * OW;
    memset(dx, 0, (size_t)H * W * sizeof(float));
    int i0 = 0;
#if defined(__AVX2__)
    if (K == 2 && S == 2) {
      for (int oh = 0; oh < OH; oh++)
        relu_pool2_back_row(dx, x, d + oh * OW, am + oh * OW, oh, W, OW);
      i0 = OH * OW; /* the rows' tails were done by the row function */
    }
#endif
    for (int i = i0; i < OH * OW; i++) {
      const int j = am[i];
      dx[j] = relu_grad(x[j], 0.0f + d[i]);
    }
  }
}
