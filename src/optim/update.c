/* The optimizers' elementwise updates (SGD, SGD with momentum, AdamW), built
 * once per instruction set (isa.h); optim.c cuts the work and calls them. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "internal.h"

/* p(n) -= lr * (g + wd * p), PyTorch SGD without momentum. */
void LOOM_ISA(loom_optim_sgd_plain)(float *restrict p, const float *restrict g,
                                    int64_t n, float lr, float wd) {
  if (wd != 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      p[i] = p[i] - lr * (g[i] + wd * p[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      p[i] = p[i] - lr * g[i];
  }
}

/* buf(n) = mu * buf + d with d = g + wd * p; p -= lr * buf, or with Nesterov
 * p -= lr * (d + mu * buf). A zero buffer makes the first step buf = d, which
 * is PyTorch's first step. One loop per case keeps each branch-free. */
void LOOM_ISA(loom_optim_sgd_momentum)(float *restrict p,
                                       const float *restrict g,
                                       float *restrict buf, int64_t n, float lr,
                                       float wd, float mu, bool nesterov) {
  if (nesterov && wd != 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float d = g[i] + wd * p[i];
      float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] = p[i] - lr * (d + mu * b);
    }
  } else if (nesterov) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float d = g[i];
      float b = mu * buf[i] + d;
      buf[i] = b;
      p[i] = p[i] - lr * (d + mu * b);
    }
  } else if (wd != 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float b = mu * buf[i] + (g[i] + wd * p[i]);
      buf[i] = b;
      p[i] = p[i] - lr * b;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float b = mu * buf[i] + g[i];
      buf[i] = b;
      p[i] = p[i] - lr * b;
    }
  }
}

/* AdamW (Loshchilov & Hutter 2019) in the operation order of PyTorch's
 * single-tensor AdamW: p *= 1 - lr*wd; m = b1*m + (1-b1)*g;
 * v = b2*v + (1-b2)*g*g; p += -step_size * m / (sqrt(v)/sqrt(bc2) + eps).
 * The AVX and SSE bodies do the same IEEE operations in the same order as the
 * scalar tail (no FMA), so where a range is cut never changes a bit. It is
 * written with intrinsics because sqrtf, which may set errno, keeps the
 * compiler from vectorising the loop. */
void LOOM_ISA(loom_optim_adamw)(float *restrict p, const float *restrict g,
                                float *restrict m, float *restrict v, int64_t n,
                                const step_consts *k, bool decay) {
  float df = decay ? k->decay_factor : 1.0f;
  float b1 = k->b1, b2 = k->b2, omb1 = k->omb1, omb2 = k->omb2;
  float nss = k->neg_step_size, bc2s = k->bc2_sqrt, eps = k->eps;
  int64_t i = 0;
#if defined(__AVX__)
  const __m256 vdf = _mm256_set1_ps(df), vb1 = _mm256_set1_ps(b1),
               vb2 = _mm256_set1_ps(b2), vomb1 = _mm256_set1_ps(omb1),
               vomb2 = _mm256_set1_ps(omb2), vnss = _mm256_set1_ps(nss),
               vbc2s = _mm256_set1_ps(bc2s), veps = _mm256_set1_ps(eps);
  for (; i + 8 <= n; i += 8) {
    __m256 gi = _mm256_loadu_ps(g + i);
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)),
                              _mm256_mul_ps(vomb1, gi));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)),
                              _mm256_mul_ps(_mm256_mul_ps(vomb2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc2s), veps);
    __m256 pi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), vdf),
                              _mm256_mul_ps(vnss, _mm256_div_ps(mi, den)));
    _mm256_storeu_ps(p + i, pi);
  }
#elif defined(__SSE2__)
  const __m128 vdf = _mm_set1_ps(df), vb1 = _mm_set1_ps(b1),
               vb2 = _mm_set1_ps(b2), vomb1 = _mm_set1_ps(omb1),
               vomb2 = _mm_set1_ps(omb2), vnss = _mm_set1_ps(nss),
               vbc2s = _mm_set1_ps(bc2s), veps = _mm_set1_ps(eps);
  for (; i + 4 <= n; i += 4) {
    __m128 gi = _mm_loadu_ps(g + i);
    __m128 mi =
        _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(vomb1, gi));
    __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)),
                           _mm_mul_ps(_mm_mul_ps(vomb2, gi), gi));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    __m128 den = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), vbc2s), veps);
    __m128 pi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(p + i), vdf),
                           _mm_mul_ps(vnss, _mm_div_ps(mi, den)));
    _mm_storeu_ps(p + i, pi);
  }
#endif
  for (; i < n; i++) {
    float gi = g[i];
    float mi = b1 * m[i] + omb1 * gi;
    float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2s + eps;
    p[i] = p[i] * df + nss * (mi / denom);
  }
}
