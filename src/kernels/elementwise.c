/* Elementwise kernels: add, accumulate, scale, ReLU, GELU (tanh form) and
 * inverted dropout with counter-based masks. Each element is computed
 * alone, so threading never changes a result. */
#include <omp.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "internal.h"
#include "loom/kernels.h"

/* Elements per parallel chunk: big enough to amortise scheduling, small
 * enough to balance. */
#define EW_CHUNK 16384

/* Runs the statement (using i0, i1) over [0, n) in chunks, in parallel when n
 * is large. */
/* clang-format off */
#define EW_PARALLEL(n, ...)                                                    \
  do {                                                                         \
    const int64_t ew_n_ = (n);                                                 \
    const int64_t ew_chunks_ = (ew_n_ + EW_CHUNK - 1) / EW_CHUNK;              \
    const int ew_nt_ = loom_kern_nthreads(ew_n_, LOOM_KERN_PAR_MIN);           \
    _Pragma("omp parallel for num_threads(ew_nt_) schedule(static) if (ew_nt_ > 1)") \
    for (int64_t ew_c_ = 0; ew_c_ < ew_chunks_; ew_c_++) {                     \
      const int64_t i0 = ew_c_ * EW_CHUNK;                                     \
      const int64_t i1 = i0 + EW_CHUNK < ew_n_ ? i0 + EW_CHUNK : ew_n_;        \
      __VA_ARGS__;                                                             \
    }                                                                          \
  } while (0)
/* clang-format on */

void LOOM_ISA(loom_add_forward)(float *out, const float *a, const float *b,
                                int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      out[i] = a[i] + b[i];
  });
}

void LOOM_ISA(loom_accumulate)(float *y, const float *x, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      y[i] += x[i];
  });
}

void LOOM_ISA(loom_scale)(float *x, float s, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      x[i] *= s;
  });
}

/* out(n) of half type dt = F(inp) elementwise, rounded as it is computed:
 * a block at a time through a stack buffer, so the bits of the f32 kernel
 * then the conversion in one pass and one parallel region, without the
 * f32 output's write and read (ReLU's and GELU's half outputs). */
#define HALF_OUT_BLOCK 512
/* clang-format off */
#define HALF_OUT_PASS(dt, out, inp, n, F)                                      \
  EW_PARALLEL(n, {                                                             \
    float buf_[HALF_OUT_BLOCK];                                                \
    for (int64_t b0 = i0; b0 < i1; b0 += HALF_OUT_BLOCK) {                     \
      const int64_t m_ = i1 - b0 < HALF_OUT_BLOCK ? i1 - b0 : HALF_OUT_BLOCK;  \
      for (int64_t i = 0; i < m_; i++)                                         \
        buf_[i] = F((inp)[b0 + i]);                                            \
      LOOM_ISA(loom_kern_narrow)(dt, (out) + b0, buf_, m_);                    \
    }                                                                          \
  })
/* clang-format on */

static inline float relu1(float x) { return x > 0.0f ? x : 0.0f; }

void LOOM_ISA(loom_relu_forward)(float *out, const float *inp, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      out[i] = relu1(inp[i]);
  });
}

void LOOM_ISA(loom_relu_forward_half)(loom_dtype dt, uint16_t *out,
                                      const float *inp, int64_t n) {
  HALF_OUT_PASS(dt, out, inp, n, relu1);
}

void LOOM_ISA(loom_relu_backward)(float *dinp, const float *inp,
                                  const float *dout, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
  });
}

/* 0 + x, not x: a zeroed dinp plus -0 is +0, and the bits must match.
 * Intrinsics because GCC turns the constant-zero add into two stores on
 * branches and gives up vectorising. */
static void relu_to_run(float *dinp, const float *inp, const float *dout,
                        int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__AVX2__)
  const __m256 z = _mm256_setzero_ps();
  for (; i + 8 <= i1; i += 8) {
    const __m256 keep = _mm256_cmp_ps(_mm256_loadu_ps(inp + i), z, _CMP_GT_OQ);
    const __m256 g = _mm256_and_ps(keep, _mm256_loadu_ps(dout + i));
    _mm256_storeu_ps(dinp + i, _mm256_add_ps(z, g));
  }
#endif
  for (; i < i1; i++)
    dinp[i] = 0.0f + (inp[i] > 0.0f ? dout[i] : 0.0f);
}

void LOOM_ISA(loom_relu_backward_to)(float *dinp, const float *inp,
                                     const float *dout, int64_t n) {
  EW_PARALLEL(n, relu_to_run(dinp, inp, dout, i0, i1));
}

/* 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp and one division, no sign
 * juggling (loom_kern_gelu, internal.h). exp(-2u) saturates at exp(88) for
 * u <= -44, where gelu is -0. */
void LOOM_ISA(loom_gelu_forward)(float *out, const float *inp, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      out[i] = loom_kern_gelu(inp[i]);
  });
}

/* The same rounded to half type dt (out: n half values): the bits of
 * loom_gelu_forward then the conversion, in one pass. */
void LOOM_ISA(loom_gelu_forward_half)(loom_dtype dt, uint16_t *out,
                                      const float *inp, int64_t n) {
  HALF_OUT_PASS(dt, out, inp, n, loom_kern_gelu);
}

void LOOM_ISA(loom_gelu_backward)(float *dinp, const float *inp,
                                  const float *dout, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++) {
      const float d = loom_kern_gelu_slope(inp[i]);
      dinp[i] = fmaf(d, dout[i], dinp[i]);
    }
  });
}

void LOOM_ISA(loom_gelu_backward_to)(float *dinp, const float *inp,
                                     const float *dout, int64_t n) {
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++) {
      const float d = loom_kern_gelu_slope(inp[i]);
      dinp[i] = fmaf(d, dout[i], 0.0f);
    }
  });
}

/* Element i keeps its value when draw (counter + i) of the stream, as 24
 * bits, is >= ceil(p * 2^24): exactly loom_rng_uniform(r) >= p. */
void LOOM_ISA(loom_dropout_forward)(float *out, uint8_t *mask, const float *inp,
                                    float p, loom_rng *rng, int64_t n) {
  const uint64_t base = rng->counter;
  rng->counter += (uint64_t)n;
  if (!(p > 0.0f)) {
    EW_PARALLEL(n, {
      for (int64_t i = i0; i < i1; i++) {
        out[i] = inp[i];
        mask[i] = 1;
      }
    });
    return;
  }
  if (p >= 1.0f) {
    EW_PARALLEL(n, {
      for (int64_t i = i0; i < i1; i++) {
        out[i] = 0.0f;
        mask[i] = 0;
      }
    });
    return;
  }
  const uint32_t thresh = (uint32_t)ceil((double)p * 16777216.0);
  const float scale = 1.0f / (1.0f - p);
  const uint32_t key[2] = {(uint32_t)rng->seed, (uint32_t)(rng->seed >> 32)};
  const uint32_t s_lo = (uint32_t)rng->stream,
                 s_hi = (uint32_t)(rng->stream >> 32);
  EW_PARALLEL(n, {
    uint32_t words[4];
    uint64_t block = UINT64_MAX;
    for (int64_t i = i0; i < i1; i++) {
      const uint64_t v = base + (uint64_t)i;
      if (v / 4 != block) {
        block = v / 4;
        const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), s_lo,
                                 s_hi};
        loom_philox4x32(ctr, key, words);
      }
      const uint8_t keep = (words[v % 4] >> 8) >= thresh;
      mask[i] = keep;
      out[i] = inp[i] * ((float)keep * scale);
    }
  });
}

void LOOM_ISA(loom_dropout_backward)(float *dinp, const uint8_t *mask,
                                     const float *dout, float p, int64_t n) {
  if (p >= 1.0f)
    return; /* every element was dropped */
  const float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  EW_PARALLEL(n, {
    for (int64_t i = i0; i < i1; i++)
      dinp[i] = fmaf((float)mask[i] * scale, dout[i], dinp[i]);
  });
}
