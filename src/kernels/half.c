/* Half storage, bf16 or f16: f32 <-> bf16 and f32 <-> f16 conversions
 * (round to nearest even, a NaN stays a NaN), and the GEMM, linear layer
 * and 2-D convolution with half operands and f32 accumulation, computed
 * here by converting the operands on load into f32 and running the f32
 * kernels: the path of CPUs without bf16/f16 arithmetic. f16 conversions
 * use F16C in the avx2 and avx512 copies (which require it) and core's scalar
 * ones in the base copy; every copy gives the same bits. */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

/* Elements per parallel chunk of a conversion. */
#define CVT_CHUNK 16384

/* Runs body(i0, i1) over [0, n) in chunks, in parallel when n is large.
 * Each element is converted alone: threads never change a result. */
/* clang-format off */
#define CVT_PARALLEL(n, ...)                                                   \
  do {                                                                         \
    const int64_t cv_n_ = (n);                                                 \
    const int64_t cv_chunks_ = (cv_n_ + CVT_CHUNK - 1) / CVT_CHUNK;            \
    const int cv_nt_ = loom_kern_nthreads(cv_n_, LOOM_KERN_PAR_MIN);           \
    _Pragma("omp parallel for num_threads(cv_nt_) schedule(static) if (cv_nt_ > 1)") \
    for (int64_t cv_c_ = 0; cv_c_ < cv_chunks_; cv_c_++) {                     \
      const int64_t i0 = cv_c_ * CVT_CHUNK;                                    \
      const int64_t i1 = i0 + CVT_CHUNK < cv_n_ ? i0 + CVT_CHUNK : cv_n_;      \
      __VA_ARGS__;                                                             \
    }                                                                          \
  } while (0)
/* clang-format on */

/* ------------------------------------------------------------ scalar */

/* The rounding of loom_f32_to_bf16 (src/core/dtype.c): add 0x7fff plus the
 * lowest kept bit, drop the low half; a NaN keeps its top bits, made quiet. */
static inline uint16_t f2b(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float b2f(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* ------------------------------------------------------------ vectors */

#if defined(__AVX2__) && defined(__FMA__) &&                                   \
    !(defined(__AVX512F__) && defined(__AVX512BW__))
/* The avx2 copy's loops (the avx512 copy has its own below). 8 floats to 8
 * bf16 in the low 16 bits of each 32-bit lane. */
static inline __m256i f2b_8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
      16);
  const __m256i q =
      _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, q, nan);
}

static inline void f2b_16(uint16_t *out, const float *in) {
  const __m256i a = f2b_8(_mm256_loadu_ps(in));
  const __m256i b = f2b_8(_mm256_loadu_ps(in + 8));
  /* packus works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7; reorder */
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
  _mm256_storeu_si256((__m256i *)(void *)out, p);
}

static inline __m256 b2f_8(const uint16_t *in) {
  const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)in);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* On a CPU with AVX512-BF16 (Zen 4, Sapphire Rapids) the avx2 and avx512
 * copies convert 32 values an instruction (vcvtne2ps2bf16: the same
 * rounding and the same quiet NaN as f2b) and widen 16 at a time: 2.1x the
 * AVX2 loop's rate on 2M values, measured on Zen 4 (docs/precision.md). The
 * instruction flushes subnormal inputs to zero, which f2b does not, so a
 * block holding one takes the integer rounding instead: the bits are
 * f2b's on every CPU. LOOM_CVT_AVX512=0 turns it off (for measuring). */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static bool cvt512_on(void) {
  static atomic_int on = -1; /* threads racing compute the same answer */
  int v = atomic_load_explicit(&on, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("LOOM_CVT_AVX512");
    v = loom_cpu_get_features()->avx512_bf16 && !(e && strcmp(e, "0") == 0);
    atomic_store_explicit(&on, v, memory_order_relaxed);
  }
  return v != 0;
}

/* Whether any of the 16 values is subnormal (exponent 0, fraction not). */
T512 static inline __mmask16 subnormal16(__m512i u) {
  return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

/* f2b of 16 values with 512-bit integer operations (any input). */
T512 static inline __m256i f2b_16_int(__m512i u) {
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x7f800000));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                       _mm512_and_si512(hi, _mm512_set1_epi32(1))),
      16);
  r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

/* f2b over [i0, i1) by 32s; returns where it stopped. */
T512 static int64_t f2b_512(uint16_t *out, const float *in, int64_t i,
                            int64_t i1) {
  for (; i + 32 <= i1; i += 32) {
    const __m512i a = _mm512_loadu_si512((const void *)(in + i));
    const __m512i b = _mm512_loadu_si512((const void *)(in + i + 16));
    if (subnormal16(a) | subnormal16(b)) {
      _mm256_storeu_si256((__m256i *)(void *)(out + i), f2b_16_int(a));
      _mm256_storeu_si256((__m256i *)(void *)(out + i + 16), f2b_16_int(b));
    } else {
      const __m512bh h =
          _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(b), _mm512_castsi512_ps(a));
      _mm512_storeu_si512((void *)(out + i), (__m512i)h);
    }
  }
  return i;
}

#if !defined(__AVX512F__) || !defined(__AVX512BW__)
/* (The avx512 copy has its own loops for these two below, which need no
 * bf16 instruction.) b2f over [i0, i1) by 16s; returns where it stopped. */
T512 static int64_t b2f_512(float *out, const uint16_t *in, int64_t i,
                            int64_t i1) {
  for (; i + 16 <= i1; i += 16) {
    const __m256i h =
        _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
    _mm512_storeu_si512((void *)(out + i),
                        _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return i;
}

/* The round trip f2b then b2f by 16s; returns where it stopped. */
T512 static int64_t round_512(float *out, const float *in, int64_t i,
                              int64_t i1) {
  for (; i + 16 <= i1; i += 16) {
    const __m512i u = _mm512_loadu_si512((const void *)(in + i));
    const __m512i h = _mm512_cvtepu16_epi32(f2b_16_int(u));
    _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(h, 16));
  }
  return i;
}
#endif
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The avx512 copy, on any AVX-512 CPU (no bf16 instructions needed): f2b
 * then b2f of 16 values in their 32-bit lanes, the low half cleared: 8
 * operations for 16 values where the AVX2 loop takes about 22. On the Xeon
 * of docs/precision.md ("The conversion path's copy") a pass over 670K
 * values took the same time with either loop: memory bounds it there. */
static inline __m512i round_16(__m512i u) {
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
      hi);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
      _mm512_set1_epi32(0x7f800000));
  /* a NaN: its top half, made quiet (f2b's bits) */
  return _mm512_mask_or_epi32(r, nan, _mm512_and_si512(u, hi),
                              _mm512_set1_epi32(0x00400000));
}
#endif

static void cvt_f2b(uint16_t *out, const float *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if (cvt512_on()) /* vcvtne2ps2bf16 where the CPU has it */
    i = f2b_512(out, in, i, i1);
  for (; i + 16 <= i1; i += 16) {
    const __m512i r = round_16(_mm512_loadu_si512((const void *)(in + i)));
    _mm256_storeu_si256((__m256i *)(void *)(out + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (cvt512_on())
    i = f2b_512(out, in, i, i1);
  for (; i + 16 <= i1; i += 16)
    f2b_16(out + i, in + i);
#endif
  for (; i < i1; i++)
    out[i] = f2b(in[i]);
}

static void cvt_b2f(float *out, const uint16_t *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (; i + 16 <= i1; i += 16) {
    const __m256i h =
        _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
    _mm512_storeu_si512((void *)(out + i),
                        _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (cvt512_on())
    i = b2f_512(out, in, i, i1);
  for (; i + 8 <= i1; i += 8)
    _mm256_storeu_ps(out + i, b2f_8(in + i));
#endif
  for (; i < i1; i++)
    out[i] = b2f(in[i]);
}

static void cvt_round(float *out, const float *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (; i + 16 <= i1; i += 16)
    _mm512_storeu_si512((void *)(out + i),
                        round_16(_mm512_loadu_si512((const void *)(in + i))));
#elif defined(__AVX2__) && defined(__FMA__)
  if (cvt512_on())
    i = round_512(out, in, i, i1);
  for (; i + 8 <= i1; i += 8) {
    const __m256i h = f2b_8(_mm256_loadu_ps(in + i));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
#endif
  for (; i < i1; i++)
    out[i] = b2f(f2b(in[i]));
}

/* f16: F16C converts 8 at a time with the rounding of core's
 * loom_f32_to_f16 (nearest even, subnormals kept, NaN made quiet with its
 * top payload bits): the tails and the base copy use that one. */
static void cvt_f2h(uint16_t *out, const float *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__F16C__)
  for (; i + 8 <= i1; i += 8)
    _mm_storeu_si128(
        (__m128i *)(void *)(out + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < i1; i++)
    out[i] = loom_f32_to_f16(in[i]);
}

static void cvt_h2f(float *out, const uint16_t *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__F16C__)
  for (; i + 8 <= i1; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  (const __m128i *)(const void *)(in + i))));
#endif
  for (; i < i1; i++)
    out[i] = loom_f16_to_f32(in[i]);
}

static void cvt_round_h(float *out, const float *in, int64_t i0, int64_t i1) {
  int64_t i = i0;
#if defined(__F16C__)
  for (; i + 8 <= i1; i += 8)
    _mm256_storeu_ps(
        out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                                 _MM_FROUND_TO_NEAREST_INT)));
#endif
  for (; i < i1; i++)
    out[i] = loom_f16_to_f32(loom_f32_to_f16(in[i]));
}

void LOOM_ISA(loom_cvt_f32_to_bf16)(loom_bf16 *out, const float *in,
                                    int64_t n) {
  CVT_PARALLEL(n, cvt_f2b(out, in, i0, i1));
}

void LOOM_ISA(loom_cvt_bf16_to_f32)(float *out, const loom_bf16 *in,
                                    int64_t n) {
  CVT_PARALLEL(n, cvt_b2f(out, in, i0, i1));
}

void LOOM_ISA(loom_round_bf16)(float *out, const float *in, int64_t n) {
  CVT_PARALLEL(n, cvt_round(out, in, i0, i1));
}

void LOOM_ISA(loom_cvt_f32_to_f16)(loom_f16 *out, const float *in, int64_t n) {
  CVT_PARALLEL(n, cvt_f2h(out, in, i0, i1));
}

void LOOM_ISA(loom_cvt_f16_to_f32)(float *out, const loom_f16 *in, int64_t n) {
  CVT_PARALLEL(n, cvt_h2f(out, in, i0, i1));
}

void LOOM_ISA(loom_round_f16)(float *out, const float *in, int64_t n) {
  CVT_PARALLEL(n, cvt_round_h(out, in, i0, i1));
}

/* The same on the calling thread alone, for kernels' own parallel loops
 * (attention): no parallel region per call. f16 unless dt is bf16. */
void LOOM_ISA(loom_kern_narrow)(loom_dtype dt, uint16_t *out, const float *in,
                                int64_t n) {
  if (dt == LOOM_BF16)
    cvt_f2b(out, in, 0, n);
  else
    cvt_f2h(out, in, 0, n);
}

void LOOM_ISA(loom_kern_widen)(loom_dtype dt, float *out, const uint16_t *in,
                               int64_t n) {
  if (dt == LOOM_BF16)
    cvt_b2f(out, in, 0, n);
  else
    cvt_h2f(out, in, 0, n);
}

void LOOM_ISA(loom_kern_round)(loom_dtype dt, float *out, const float *in,
                               int64_t n) {
  if (dt == LOOM_BF16)
    cvt_round(out, in, 0, n);
  else
    cvt_round_h(out, in, 0, n);
}

static loom_status not_half(loom_dtype dt, const char *what) {
  return loom_error(LOOM_ERR_UNSUPPORTED,
                    "%s: %s is not a half type (bf16 or "
                    "f16)",
                    what, loom_dtype_name(dt));
}

/* The conversions of a half type: bf16's or f16's, NULL for another. */
typedef struct half_cvt {
  void (*narrow)(uint16_t *out, const float *in, int64_t n);
  void (*widen)(float *out, const uint16_t *in, int64_t n);
  void (*round)(float *out, const float *in, int64_t n);
} half_cvt;

static const half_cvt *cvt_of(loom_dtype dt) {
  static const half_cvt bf16 = {LOOM_ISA(loom_cvt_f32_to_bf16),
                                LOOM_ISA(loom_cvt_bf16_to_f32),
                                LOOM_ISA(loom_round_bf16)};
  static const half_cvt f16 = {LOOM_ISA(loom_cvt_f32_to_f16),
                               LOOM_ISA(loom_cvt_f16_to_f32),
                               LOOM_ISA(loom_round_f16)};
  return dt == LOOM_BF16 ? &bf16 : dt == LOOM_F16 ? &f16 : NULL;
}

loom_status LOOM_ISA(loom_cvt_f32_to_half)(loom_dtype dt, uint16_t *out,
                                           const float *in, int64_t n) {
  const half_cvt *c = cvt_of(dt);
  if (!c)
    return not_half(dt, "conversion from f32");
  c->narrow(out, in, n);
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_cvt_half_to_f32)(loom_dtype dt, float *out,
                                           const uint16_t *in, int64_t n) {
  const half_cvt *c = cvt_of(dt);
  if (!c)
    return not_half(dt, "conversion to f32");
  c->widen(out, in, n);
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_round_half)(loom_dtype dt, float *out,
                                      const float *in, int64_t n) {
  const half_cvt *c = cvt_of(dt);
  if (!c)
    return not_half(dt, "rounding");
  c->round(out, in, n);
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_round_half_serial)(loom_dtype dt, float *out,
                                             const float *in, int64_t n) {
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return not_half(dt, "rounding");
  LOOM_ISA(loom_kern_round)(dt, out, in, n);
  return LOOM_OK;
}

/* out(n) = the f32 values of in(n), which is f32 (rounded to half type dt
 * here) or of type dt (widened). */
static loom_status load_f32(float *out, const void *in, loom_dtype in_dt,
                            loom_dtype dt, int64_t n) {
  if (in_dt == LOOM_F32)
    return LOOM_ISA(loom_round_half)(dt, out, in, n);
  if (in_dt == dt)
    return LOOM_ISA(loom_cvt_half_to_f32)(dt, out, in, n);
  return loom_error(
      LOOM_ERR_UNSUPPORTED, "%s matmul: input of type %s (f32 or %s)",
      loom_dtype_name(dt), loom_dtype_name(in_dt), loom_dtype_name(dt));
}

/* ---------------------------------------------------------------- GEMM */

/* A half type on a CPU with its unit (loom_half_on_unit): oneDNN's matmul
 * (matmul_dnnl.c). */

int64_t LOOM_ISA(loom_gemm_half_scratch_floats)(int M, int N, int K) {
  return (int64_t)M * K + (int64_t)K * N;
}

/* rows x cols of a half matrix of type dt with row stride ld, widened into
 * a compact f32 one. */
static loom_status widen_matrix(loom_dtype dt, float *out, const uint16_t *in,
                                int rows, int cols, int ld) {
  if (ld == cols)
    return LOOM_ISA(loom_cvt_half_to_f32)(dt, out, in, (int64_t)rows * cols);
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return not_half(dt, "gemm_half");
  const bool bf = dt == LOOM_BF16;
  const int nt = loom_kern_nthreads((int64_t)rows * cols, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int r = 0; r < rows; r++) {
    if (bf)
      cvt_b2f(out + (int64_t)r * cols, in + (int64_t)r * ld, 0, cols);
    else
      cvt_h2f(out + (int64_t)r * cols, in + (int64_t)r * ld, 0, cols);
  }
  return LOOM_OK;
}

loom_status LOOM_ISA(loom_gemm_half)(loom_dtype dt, bool trans_a, bool trans_b,
                                     int M, int N, int K, float alpha,
                                     const uint16_t *A, int lda,
                                     const uint16_t *B, int ldb, float beta,
                                     float *C, int ldc, float *scratch) {
  LOOM_TRY(loom_kern_gemm_dims("gemm_half", trans_a, trans_b, M, N, K, lda, ldb,
                               ldc));
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return not_half(dt, "gemm_half");
  const int ar = trans_a ? K : M, ac = trans_a ? M : K;
  const int br = trans_b ? N : K, bc = trans_b ? K : N;
  if (M == 0 || N == 0)
    return LOOM_OK;
  if (K > 0 && alpha != 0.0f && (!A || !B || !scratch))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "gemm_half %dx%dx%d: NULL matrix or scratch", M, N, K);
  if (loom_half_on_unit(dt) && K > 0 && alpha != 0.0f) {
    loom_status s = loom_kern_half_matmul(dt, trans_a, trans_b, M, N, K, alpha,
                                          A, lda, B, ldb, beta, C, ldc);
    if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  float *a = scratch, *b = NULL;
  if (K > 0 && alpha != 0.0f) {
    b = scratch + (int64_t)M * K;
    LOOM_TRY(widen_matrix(dt, a, A, ar, ac, lda));
    LOOM_TRY(widen_matrix(dt, b, B, br, bc, ldb));
  }
  return LOOM_ISA(loom_gemm)(trans_a, trans_b, M, N, K, alpha, a,
                             ac > 1 ? ac : 1, b, bc > 1 ? bc : 1, beta, C, ldc);
}

/* -------------------------------------------------------------- linear */

int64_t LOOM_ISA(loom_linear_half_scratch_floats)(int N, int C, int OC) {
  return (int64_t)N * C + (int64_t)OC * C + (int64_t)N * OC;
}

/* The weight's n values in f32 for the conversion path: weight itself
 * when w_dtype is f32 (values of dt already, as the model's rounded copy
 * holds them: no pass), or widened from dt into buf. */
static loom_status weight_f32(const float **w, float *buf, const void *weight,
                              loom_dtype w_dtype, loom_dtype dt, int64_t n) {
  if (w_dtype == LOOM_F32) {
    *w = weight;
    return LOOM_OK;
  }
  if (w_dtype != dt)
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "%s matmul: weight of type %s (%s, or f32 holding %s "
                      "values)",
                      loom_dtype_name(dt), loom_dtype_name(w_dtype),
                      loom_dtype_name(dt), loom_dtype_name(dt));
  *w = buf;
  return LOOM_ISA(loom_cvt_half_to_f32)(dt, buf, weight, n);
}

/* x(n) as half type dt: in itself, or in (f32) rounded into buf. */
static loom_status as_half(const uint16_t **x, uint16_t *buf, const void *in,
                           loom_dtype in_dt, loom_dtype dt, int64_t n) {
  if (in_dt == dt) {
    *x = in;
    return LOOM_OK;
  }
  if (in_dt != LOOM_F32)
    return loom_error(
        LOOM_ERR_UNSUPPORTED, "%s matmul: input of type %s (f32 or %s)",
        loom_dtype_name(dt), loom_dtype_name(in_dt), loom_dtype_name(dt));
  *x = buf;
  return LOOM_ISA(loom_cvt_f32_to_half)(dt, buf, in, n);
}

loom_status LOOM_ISA(loom_linear_forward_half)(
    float *out, const void *inp, loom_dtype in_dtype, loom_dtype dt,
    const void *weight, loom_dtype w_dtype, const float *bias, int N, int C,
    int OC, float *scratch) {
  if (N < 0 || C < 0 || OC < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "half linear: negative size");
  if (w_dtype == dt && loom_half_on_unit(dt) && N > 0 && C > 0 && OC > 0) {
    /* out = inp @ W^T + bias on the unit: the bias added by oneDNN
     * as it stores the rows, or (a grid that cuts K) copied into out
     * first and the product added */
    const uint16_t *x;
    LOOM_TRY(
        as_half(&x, (uint16_t *)scratch, inp, in_dtype, dt, (int64_t)N * C));
    loom_status s = LOOM_ERR_UNSUPPORTED;
    if (bias) /* the bias added as oneDNN stores out, when it can */
      s = loom_kern_half_matmul_bias(dt, false, true, N, OC, C, x, C, weight, C,
                                     bias, out, OC);
    if (s != LOOM_ERR_UNSUPPORTED)
      return s;
    float beta = 0.0f;
    if (bias) {
      for (int n = 0; n < N; n++)
        memcpy(out + (int64_t)n * OC, bias, (size_t)OC * sizeof(float));
      beta = 1.0f;
    }
    s = loom_kern_half_matmul(dt, false, true, N, OC, C, 1.0f, x, C, weight, C,
                              beta, out, OC);
    if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  float *a = scratch; /* (N,C) */
  const float *w;     /* (OC,C) */
  LOOM_TRY(weight_f32(&w, scratch + (int64_t)N * C, weight, w_dtype, dt,
                      (int64_t)OC * C));
  LOOM_TRY(load_f32(a, inp, in_dtype, dt, (int64_t)N * C));
  return LOOM_ISA(loom_linear_forward)(out, a, w, bias, N, C, OC);
}

/* The bias pass's work space in the layer's scratch (N, C, OC: its
 * loom_linear_half_scratch_floats) from float `used` on, when it fits
 * there, else NULL (the pass then walks column blocks). */
static float *parts_in(float *scratch, int64_t used, int N, int C, int OC) {
  const int64_t total = LOOM_ISA(loom_linear_half_scratch_floats)(N, C, OC);
  return scratch && used + LOOM_ISA(loom_kern_bias_parts_floats)(N, OC) <= total
             ? scratch + used
             : NULL;
}

/* The unit's share of the backward: dinp += dout @ W and dweight +=
 * dout^T @ inp with dout and inp rounded to dt; each output it could
 * not do (no fast kernel for the shape) is left in *dinp / *dweight for
 * the conversion path, the others set to NULL. */
static loom_status linear_backward_unit(float **dinp, float **dweight,
                                        float **dbias, const float *dout,
                                        const float *pre, const void *inp,
                                        loom_dtype in_dtype, loom_dtype dt,
                                        const uint16_t *weight, int N, int C,
                                        int OC, float *scratch) {
  if ((!*dinp && !*dweight) || N == 0 || C == 0 || OC == 0)
    return LOOM_OK;
  uint16_t *d = (uint16_t *)scratch;   /* (N,OC) */
  uint16_t *buf = d + (int64_t)N * OC; /* (N,C) */
  /* the gradient rounded and the bias gradient summed in one pass, its
   * work space after d and buf */
  const int64_t used = ((int64_t)N * OC + (int64_t)N * C + 1) / 2;
  LOOM_ISA(loom_kern_bias_grad_half)
  (*dbias, dout, pre, N, OC, dt, d, NULL, parts_in(scratch, used, N, C, OC));
  *dbias = NULL;
  loom_status s;
  if (*dinp) {
    s = loom_kern_half_matmul(dt, false, false, N, C, OC, 1.0f, d, OC, weight,
                              C, 1.0f, *dinp, C);
    if (s == LOOM_OK)
      *dinp = NULL;
    else if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  if (*dweight) {
    const uint16_t *x;
    LOOM_TRY(as_half(&x, buf, inp, in_dtype, dt, (int64_t)N * C));
    s = loom_kern_half_matmul(dt, true, false, OC, C, N, 1.0f, d, OC, x, C,
                              1.0f, *dweight, C);
    if (s == LOOM_OK)
      *dweight = NULL;
    else if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  return LOOM_OK;
}

static loom_status linear_backward_half(float *dinp, float *dweight,
                                        float *dbias, const float *dout,
                                        const float *pre, const void *inp,
                                        loom_dtype in_dtype, loom_dtype dt,
                                        const void *weight, loom_dtype w_dtype,
                                        int N, int C, int OC, float *scratch) {
  if (N < 0 || C < 0 || OC < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "half linear: negative size");
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return not_half(dt, "linear backward");
  if (w_dtype == dt && loom_half_on_unit(dt))
    LOOM_TRY(linear_backward_unit(&dinp, &dweight, &dbias, dout, pre, inp,
                                  in_dtype, dt, weight, N, C, OC, scratch));
  float *d = scratch;                               /* (N,OC) */
  const float *w = d + (int64_t)N * OC;             /* (OC,C) */
  float *a = d + (int64_t)N * OC + (int64_t)OC * C; /* (N,C) */
  /* the gradient rounded (when a matmul is left) and the bias gradient
   * summed in one pass (the f32 layer's sums, from the f32 gradient) */
  if (dinp || dweight || dbias)
    LOOM_ISA(loom_kern_bias_grad_half)
  (dbias, dout, pre, N, OC, dt, NULL, dinp || dweight ? d : NULL,
   parts_in(scratch, (int64_t)N * OC, N, C, OC));
  if (dinp)
    LOOM_TRY(weight_f32(&w, d + (int64_t)N * OC, weight, w_dtype, dt,
                        (int64_t)OC * C));
  if (dweight)
    LOOM_TRY(load_f32(a, inp, in_dtype, dt, (int64_t)N * C));
  return LOOM_ISA(loom_linear_backward)(dinp, dweight, NULL, d, a, w, N, C, OC);
}

loom_status LOOM_ISA(loom_linear_backward_half)(
    float *dinp, float *dweight, float *dbias, const float *dout,
    const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight,
    loom_dtype w_dtype, int N, int C, int OC, float *scratch) {
  return linear_backward_half(dinp, dweight, dbias, dout, NULL, inp, in_dtype,
                              dt, weight, w_dtype, N, C, OC, scratch);
}

loom_status LOOM_ISA(loom_linear_backward_half_gelu)(
    float *dinp, float *dweight, float *dbias, const float *dgelu,
    const float *pre, const void *inp, loom_dtype in_dtype, loom_dtype dt,
    const void *weight, loom_dtype w_dtype, int N, int C, int OC,
    float *scratch) {
  if (!pre)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "half linear backward through a GELU: no pre-activation");
  return linear_backward_half(dinp, dweight, dbias, dgelu, pre, inp, in_dtype,
                              dt, weight, w_dtype, N, C, OC, scratch);
}

/* --------------------------------------------------------- convolution */

int64_t LOOM_ISA(loom_conv2d_half_scratch_floats)(const loom_conv2d_dims *d) {
  if (!d || d->stride < 1)
    return 0;
  const int64_t OH = LOOM_ISA(loom_conv2d_out_h)(d);
  const int64_t OW = LOOM_ISA(loom_conv2d_out_w)(d);
  return (int64_t)d->N * d->C * d->H * d->W +
         (int64_t)d->OC * d->C * d->KH * d->KW +
         (int64_t)d->N * d->OC * OH * OW;
}

loom_status LOOM_ISA(loom_conv2d_forward_half)(
    float *out, float *col, const void *inp, loom_dtype in_dtype, loom_dtype dt,
    const void *weight, loom_dtype w_dtype, const float *bias,
    const loom_conv2d_dims *d, float *scratch) {
  if (!d || d->stride < 1 || !scratch)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "half conv2d forward: bad dims or no scratch");
  const int64_t in_n = (int64_t)d->N * d->C * d->H * d->W;
  if (w_dtype == dt && loom_half_on_unit(dt) &&
      LOOM_ISA(loom_kern_conv_use_dnnl)(d)) {
    /* oneDNN's half convolution: half input and weights, f32 sums */
    const uint16_t *x;
    LOOM_TRY(as_half(&x, (uint16_t *)scratch, inp, in_dtype, dt, in_n));
    loom_status s =
        loom_kern_conv_dnnl_forward_half(dt, out, col, x, weight, bias, d);
    if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  float *a = scratch; /* (N,C,H,W) */
  const float *w;     /* (OC,C,KH,KW) */
  LOOM_TRY(weight_f32(&w, scratch + in_n, weight, w_dtype, dt,
                      (int64_t)d->OC * d->C * d->KH * d->KW));
  LOOM_TRY(load_f32(a, inp, in_dtype, dt, in_n));
  return LOOM_ISA(loom_conv2d_forward)(out, col, a, w, bias, d);
}

loom_status LOOM_ISA(loom_conv2d_backward_half)(
    float *dinp, float *dweight, float *dbias, float *col, const float *dout,
    const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight,
    loom_dtype w_dtype, const loom_conv2d_dims *d, float *scratch) {
  if (!d || d->stride < 1 || !scratch)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "half conv2d backward: bad dims or no scratch");
  const int64_t in_n = (int64_t)d->N * d->C * d->H * d->W;
  const int64_t w_n = (int64_t)d->OC * d->C * d->KH * d->KW;
  const int64_t out_n = (int64_t)d->N * d->OC * LOOM_ISA(loom_conv2d_out_h)(d) *
                        LOOM_ISA(loom_conv2d_out_w)(d);
  float *a = scratch;        /* (N,C,H,W) */
  const float *w = a + in_n; /* (OC,C,KH,KW) */
  float *g = a + in_n + w_n; /* (N,OC,OH,OW) */
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return not_half(dt, "conv2d backward");
  /* the bias gradient from the f32 gradient, as the f32 layer sums it */
  if (dbias)
    LOOM_TRY(LOOM_ISA(loom_conv2d_backward)(NULL, NULL, dbias, col, dout, NULL,
                                            NULL, d));
  if (!dinp && !dweight)
    return LOOM_OK;
  if (w_dtype == dt && loom_half_on_unit(dt) &&
      LOOM_ISA(loom_kern_conv_use_dnnl)(d)) {
    /* oneDNN's half convolution on the output gradient rounded to dt */
    uint16_t *g16 = (uint16_t *)(void *)(a + in_n); /* (N,OC,OH,OW) */
    const uint16_t *x = NULL;
    LOOM_TRY(LOOM_ISA(loom_cvt_f32_to_half)(dt, g16, dout, out_n));
    if (dweight)
      LOOM_TRY(as_half(&x, (uint16_t *)(void *)a, inp, in_dtype, dt, in_n));
    loom_status s = loom_kern_conv_dnnl_backward_half(dt, dinp, dweight, col,
                                                      g16, x, weight, d);
    if (s != LOOM_ERR_UNSUPPORTED)
      return s;
  }
  LOOM_TRY(LOOM_ISA(loom_round_half)(dt, g, dout, out_n));
  if (dinp)
    LOOM_TRY(weight_f32(&w, a + in_n, weight, w_dtype, dt, w_n));
  if (dweight)
    LOOM_TRY(load_f32(a, inp, in_dtype, dt, in_n));
  return LOOM_ISA(loom_conv2d_backward)(dinp, dweight, NULL, col, g, a, w, d);
}
