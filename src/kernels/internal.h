/* kernels: private helpers shared by the kernel files (vectorisable exp,
 * fixed-order reductions, the serial GEMM used inside parallel loops). */
#ifndef LOOM_KERNELS_INTERNAL_H
#define LOOM_KERNELS_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"
#include "loom/kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* Elementwise loops fork threads only above this many elements: below it
 * the fork/join costs more than it saves. */
#define LOOM_KERN_PAR_MIN 32768

/* The sizes and leading dimensions of C (MxN) = op(A) op(B), row-major:
 * LOOM_OK, or the error naming `what` (gemm, gemm_bf16). */
static inline loom_status loom_kern_gemm_dims(const char *what, bool trans_a,
                                              bool trans_b, int M, int N, int K,
                                              int lda, int ldb, int ldc) {
  if (M < 0 || N < 0 || K < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "%s: negative size %dx%dx%d", what,
                      M, N, K);
  const int acols = trans_a ? M : K, bcols = trans_b ? K : N;
  if (lda < (acols > 1 ? acols : 1) || ldb < (bcols > 1 ? bcols : 1) ||
      ldc < (N > 1 ? N : 1))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s %dx%dx%d: leading dimensions lda=%d ldb=%d ldc=%d "
                      "too small (need >= %d, %d, %d)",
                      what, M, N, K, lda, ldb, ldc, acols, bcols, N);
  return LOOM_OK;
}
/* Lanes of the fixed-order reductions: 16 floats = one AVX-512 register or
 * two AVX2 ones. The result depends only on n, never on the thread count. */
#define LOOM_KERN_LANES 16

/* exp(x) in f32 with ~1 ulp error, written so that GCC vectorises loops
 * that call it (glibc's expf is a scalar call without -ffast-math).
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor
 * polynomial, 2^n built in the exponent bits. Results below ~exp(-87)
 * flush to 0; x > 88 returns exp(88) (callers pass x <= 0); NaN gives NaN. */
static inline float loom_kern_expf(float x) {
  /* Only selects of the form v = c ? k : v: GCC will not if-convert a
   * select whose arm could trap (-ftrapping-math), and the loop would stay
   * scalar. NaN fails every comparison, so it flows through to the result. */
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  /* n = round(xc / ln2) by the 1.5*2^23 shifter: t's low bits hold n. fmaf
   * rather than x*y+z keeps GCC from sinking the product into the arms of
   * the selects above (rintf, a call at that stage, stops if-conversion). */
  const float t = fmaf(xc, 1.44269504089f, 12582912.0f);
  const float n = t - 12582912.0f;
  float r = fmaf(-n, 0.693147182464599609375f, xc);
  r = fmaf(-n, -1.904654299957768e-09f, r);
  float p = 1.98412698e-4f; /* 1/7! */
  p = fmaf(p, r, 1.38888889e-3f);
  p = fmaf(p, r, 8.33333333e-3f);
  p = fmaf(p, r, 4.16666667e-2f);
  p = fmaf(p, r, 1.66666667e-1f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  uint32_t e = (tb - 0x4B400000u + 127u) << 23; /* 2^n */
  e = x < -87.0f ? 0u : e;                      /* underflow flushes to +0 */
  float s;
  memcpy(&s, &e, sizeof s);
  return p * s;
}

/* tanh(x) through exp(-2|x|); absolute error ~1e-7 (relative error grows
 * near 0, where tanh is small: fine for GELU, which adds it to 1). */
static inline float loom_kern_tanhf(float x) {
  const float a = fabsf(x);
  const float t = loom_kern_expf(-2.0f * a);
  return copysignf((1.0f - t) / (1.0f + t), x);
}

/* GELU, tanh form, as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3),
 * and its slope: d/dx x s(2u) = s + 2 x s (1 - s) u', s = sigmoid(2u),
 * u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2). One definition for every kernel
 * that computes them (elementwise.c, the fused ones of linear.c). */
#define LOOM_GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define LOOM_GELU_A 0.044715f
static inline float loom_kern_gelu(float x) {
  const float u = LOOM_GELU_S * fmaf(LOOM_GELU_A * x * x, x, x);
  return x / (1.0f + loom_kern_expf(-2.0f * u));
}
static inline float loom_kern_gelu_slope(float x) {
  const float u = LOOM_GELU_S * fmaf(LOOM_GELU_A * x * x, x, x);
  const float sg = 1.0f / (1.0f + loom_kern_expf(-2.0f * u));
  const float du = LOOM_GELU_S * fmaf(3.0f * LOOM_GELU_A, x * x, 1.0f);
  return fmaf(2.0f * x * sg * (1.0f - sg), du, sg);
}

/* Fixed-order reductions: LOOM_KERN_LANES (16) partial sums, lane j
 * taking x[j], x[j+16], ...; then a fixed tree (lanes j += j+8, j += j+4,
 * j += j+2, j += j+1); then the tail in order. The result depends on n
 * only, never on the thread count. The AVX2 code and the plain C code
 * compute exactly the same sums (GCC keeps a float[16] accumulator in
 * memory, a store-to-load chain per step, hence the intrinsics). */
#if defined(__AVX2__) && defined(__FMA__)
static inline float loom_kern_hsum16_(__m256 a, __m256 b) {
  const __m256 s8 = _mm256_add_ps(a, b);
  __m128 s4 =
      _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
  return _mm_cvtss_f32(s4);
}

static inline float loom_kern_sum(const float *x, int64_t n) {
  __m256 a = _mm256_setzero_ps(), b = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(x + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(x + i + 8));
  }
  float s = loom_kern_hsum16_(a, b);
  for (; i < n; i++)
    s += x[i];
  return s;
}

static inline float loom_kern_dot(const float *x, const float *y, int64_t n) {
  __m256 a = _mm256_setzero_ps(), b = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a);
    b = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8),
                        b);
  }
  float s = loom_kern_hsum16_(a, b);
  for (; i < n; i++)
    s = fmaf(x[i], y[i], s);
  return s;
}

/* sum((x - c)^2) */
static inline float loom_kern_sqdev(const float *x, float c, int64_t n) {
  const __m256 cv = _mm256_set1_ps(c);
  __m256 a = _mm256_setzero_ps(), b = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), cv);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), cv);
    a = _mm256_fmadd_ps(d0, d0, a);
    b = _mm256_fmadd_ps(d1, d1, b);
  }
  float s = loom_kern_hsum16_(a, b);
  for (; i < n; i++) {
    const float d = x[i] - c;
    s = fmaf(d, d, s);
  }
  return s;
}

/* sum((x * y) * (z - c)) */
static inline float loom_kern_dot3c(const float *x, const float *y,
                                    const float *z, float c, int64_t n) {
  const __m256 cv = _mm256_set1_ps(c);
  __m256 a = _mm256_setzero_ps(), b = a;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 p0 =
        _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
    const __m256 p1 =
        _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
    a = _mm256_fmadd_ps(p0, _mm256_sub_ps(_mm256_loadu_ps(z + i), cv), a);
    b = _mm256_fmadd_ps(p1, _mm256_sub_ps(_mm256_loadu_ps(z + i + 8), cv), b);
  }
  float s = loom_kern_hsum16_(a, b);
  for (; i < n; i++)
    s = fmaf(x[i] * y[i], z[i] - c, s);
  return s;
}

/* Maximum of x[0..n), n >= 1 (x > m ? x : m: a NaN is skipped unless it
 * comes first). */
static inline float loom_kern_max(const float *x, int64_t n) {
  float m = x[0];
  int64_t i = 0;
  if (n >= 16) {
    __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    for (i = 16; i + 16 <= n; i += 16) {
      a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
      b = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), b);
    }
    float lanes[16];
    _mm256_storeu_ps(lanes, a);
    _mm256_storeu_ps(lanes + 8, b);
    for (int j = 0; j < 16; j++)
      m = lanes[j] > m ? lanes[j] : m;
  }
  for (; i < n; i++)
    m = x[i] > m ? x[i] : m;
  return m;
}
#else
static inline float loom_kern_hsum16_(float *acc) {
  for (int w = LOOM_KERN_LANES / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++)
      acc[j] += acc[j + w];
  return acc[0];
}

static inline float loom_kern_sum(const float *x, int64_t n) {
  float acc[LOOM_KERN_LANES] = {0};
  int64_t i = 0;
  for (; i + LOOM_KERN_LANES <= n; i += LOOM_KERN_LANES)
    for (int j = 0; j < LOOM_KERN_LANES; j++)
      acc[j] += x[i + j];
  float s = loom_kern_hsum16_(acc);
  for (; i < n; i++)
    s += x[i];
  return s;
}

static inline float loom_kern_dot(const float *x, const float *y, int64_t n) {
  float acc[LOOM_KERN_LANES] = {0};
  int64_t i = 0;
  for (; i + LOOM_KERN_LANES <= n; i += LOOM_KERN_LANES)
    for (int j = 0; j < LOOM_KERN_LANES; j++)
      acc[j] = fmaf(x[i + j], y[i + j], acc[j]);
  float s = loom_kern_hsum16_(acc);
  for (; i < n; i++)
    s = fmaf(x[i], y[i], s);
  return s;
}

static inline float loom_kern_sqdev(const float *x, float c, int64_t n) {
  float acc[LOOM_KERN_LANES] = {0};
  int64_t i = 0;
  for (; i + LOOM_KERN_LANES <= n; i += LOOM_KERN_LANES)
    for (int j = 0; j < LOOM_KERN_LANES; j++) {
      const float d = x[i + j] - c;
      acc[j] = fmaf(d, d, acc[j]);
    }
  float s = loom_kern_hsum16_(acc);
  for (; i < n; i++) {
    const float d = x[i] - c;
    s = fmaf(d, d, s);
  }
  return s;
}

static inline float loom_kern_dot3c(const float *x, const float *y,
                                    const float *z, float c, int64_t n) {
  float acc[LOOM_KERN_LANES] = {0};
  int64_t i = 0;
  for (; i + LOOM_KERN_LANES <= n; i += LOOM_KERN_LANES)
    for (int j = 0; j < LOOM_KERN_LANES; j++)
      acc[j] = fmaf(x[i + j] * y[i + j], z[i + j] - c, acc[j]);
  float s = loom_kern_hsum16_(acc);
  for (; i < n; i++)
    s = fmaf(x[i] * y[i], z[i] - c, s);
  return s;
}

static inline float loom_kern_max(const float *x, int64_t n) {
  float m = x[0];
  int64_t i = 0;
  if (n >= LOOM_KERN_LANES) {
    float acc[LOOM_KERN_LANES];
    for (int j = 0; j < LOOM_KERN_LANES; j++)
      acc[j] = x[j];
    for (i = LOOM_KERN_LANES; i + LOOM_KERN_LANES <= n; i += LOOM_KERN_LANES)
      for (int j = 0; j < LOOM_KERN_LANES; j++)
        acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; j < LOOM_KERN_LANES; j++)
      m = acc[j] > m ? acc[j] : m;
  }
  for (; i < n; i++)
    m = x[i] > m ? x[i] : m;
  return m;
}
#endif

/* Threads for a loop over `work` units of roughly `grain` cost each: never
 * more than loom_threads(), never more than the work splits into. Only how
 * many threads run depends on this, never what a result is. */
static inline int loom_kern_nthreads(int64_t work, int64_t grain) {
  int t = loom_threads();
  int64_t most = grain > 0 ? work / grain : work;
  if (most < 1)
    most = 1;
  return most < t ? (int)most : t;
}

/* A thread that joins a loop of products (GEMM tiles, attention heads,
 * convolution chunks) should bring at least this many floating-point
 * operations, some 10-20 us at the rate small products run. On an idle
 * machine a fork and join costs about 3 us (a 128x10x512 GEMM: 50 us on one
 * thread, 28 on two), so that much work still pays; on a loaded one each join
 * waits for a thread the scheduler may not run for milliseconds, and forks
 * over less work made a tiny GPT's evaluation (attention over 8 heads of 16
 * tokens, 65 kFLOP) take minutes beside other jobs instead of seconds. */
#define LOOM_KERN_THREAD_FLOPS 0.5e6

/* Threads for `tasks` independent tasks of `flops` operations in all: at
 * most one a task and one per LOOM_KERN_THREAD_FLOPS. Like
 * loom_kern_nthreads, it decides only how many threads run. */
static inline int loom_kern_nthreads_flops(int64_t tasks, double flops) {
  const double by_work = flops / LOOM_KERN_THREAD_FLOPS;
  return loom_kern_nthreads(by_work < (double)tasks ? (int64_t)by_work : tasks,
                            1);
}

/* Floating-point operations of `products` of a convolution's GEMMs
 * (forward: 1; backward: 1 each for the input and the weight gradient). */
static inline double loom_kern_conv_flops(const loom_conv2d_dims *d,
                                          int products) {
  return 2.0 * products * d->N * loom_conv2d_out_h(d) * loom_conv2d_out_w(d) *
         d->OC * d->C * d->KH * d->KW;
}

/* ---- GEMM used by other kernels (gemm.c) */

/* One GEMM computed by the calling thread alone with the current backend,
 * for use inside the kernels' own parallel loops (attention, conv). Call
 * loom_kern_gemm_serial_begin() once before the parallel region: it makes
 * the vendor library single-threaded. Same contract as loom_gemm, no
 * argument checks. */
void loom_kern_gemm_serial_begin(void);
void loom_kern_gemm_serial(bool trans_a, bool trans_b, int M, int N, int K,
                           float alpha, const float *A, int lda, const float *B,
                           int ldb, float beta, float *C, int ldc);

/* ---- convolution */

/* Most chunks a convolution's batch is cut into: the parallelism a
 * convolution offers, and what its scratch is sized for. */
#define LOOM_CONV_SLOTS 16

/* The f32 and bf16 GEMMs' thread-count invariant grid (gemm_backend.c): tm
 * x tn tiles, gm x gn of them, K cut into gk chunks of kc (partials folded
 * in chunk order by loom_kern_gemm_fold: C = sum + beta C). A function of
 * (M, N, K) alone. */
typedef struct loom_kern_gemm_plan {
  int tm, tn, kc; /* tile extents */
  int gm, gn, gk; /* tile counts */
} loom_kern_gemm_plan;
void loom_kern_gemm_plan_make(int M, int N, int K, loom_kern_gemm_plan *p);
/* bias (N floats, or NULL): stands for every row of C's prior values
 * (what beta scales), as if copied there first. */
void loom_kern_gemm_fold(const float *part, int gk, int M, int N, float beta,
                         const float *bias, float *C, int ldc);
/* Runs the grid of (M, N, K) on loom_threads() threads: fn computes tile
 * C[i0.., j0..] (mm x nn, K range [k0, k0 + kk)) = alpha-scaled product +
 * beta c into c (stride ldc) on the calling thread, returning 0 or a
 * nonzero code (the last one seen goes to *rc; C is then unspecified).
 * K partials go to a buffer and are folded in chunk order. With bias (N
 * floats, or NULL), C's prior values are the bias in every row: each tile's
 * rows are set to it just before fn runs on them (while they are in
 * cache; the same bits as a pass over C first), or the fold takes it. */
typedef int (*loom_kern_tile_fn)(void *ctx, int i0, int j0, int k0, int mm,
                                 int nn, int kk, float beta, float *c, int ldc);
loom_status loom_kern_gemm_tiled(int M, int N, int K, float beta, float *C,
                                 int ldc, const float *bias,
                                 loom_kern_tile_fn fn, void *ctx, int *rc);

/* Half GEMM through oneDNN's matmul (matmul_dnnl.c): C(f32) = alpha op(A)
 * op(B) + beta C, A and B of half type dt (bf16, or f16 where the oneDNN
 * built in has f16 kernels for the CPU); thread-count invariant under
 * loom_gemm_get_deterministic. LOOM_ERR_UNSUPPORTED (C untouched) when
 * oneDNN has no fast kernel for a shape. probe: whether it has one at all
 * for dt (a bf16 unit: AVX512-BF16 or AMX; f16: AVX512-FP16 with oneDNN
 * 3.x). */
loom_status loom_kern_half_matmul(loom_dtype dt, bool ta, bool tb, int M, int N,
                                  int K, float alpha, const uint16_t *A,
                                  int lda, const uint16_t *B, int ldb,
                                  float beta, float *C, int ldc);
/* The same with a bias row: C = op(A) op(B) + bias (bias (N) f32, added
 * to each row by oneDNN as it stores C: C is not read). UNSUPPORTED (C
 * untouched) where the thread-count invariant grid would cut K. */
loom_status loom_kern_half_matmul_bias(loom_dtype dt, bool ta, bool tb, int M,
                                       int N, int K, const uint16_t *A, int lda,
                                       const uint16_t *B, int ldb,
                                       const float *bias, float *C, int ldc);
bool loom_kern_half_matmul_probe(loom_dtype dt);
/* One such GEMM on the calling thread alone, for a kernel's own parallel
 * loop (attention): its primitive is built for one thread, so the bits
 * depend on the shape alone. 0 on success, -1 when oneDNN has no fast
 * kernel for the shape (C untouched); _ok says which beforehand (call it
 * outside the parallel loop: it builds the primitive). */
bool loom_kern_half_matmul_serial_ok(loom_dtype dt, bool ta, bool tb, int M,
                                     int N, int K, float alpha, int lda,
                                     int ldb, float beta, int ldc);
int loom_kern_half_matmul_serial(loom_dtype dt, bool ta, bool tb, int M, int N,
                                 int K, float alpha, const uint16_t *A, int lda,
                                 const uint16_t *B, int ldb, float beta,
                                 float *C, int ldc);

/* oneDNN convolution primitives (conv_dnnl.c): the scratch floats they need
 * for these dims (0 when oneDNN is not built in or cannot do the shape), and
 * forward/backward with loom_conv2d_*'s contract, minus the bias gradient.
 * LOOM_ERR_UNSUPPORTED (with no message) means: use im2col. */
int64_t loom_kern_conv_dnnl_floats(const loom_conv2d_dims *d);
loom_status loom_kern_conv_dnnl_forward(float *out, float *col,
                                        const float *inp, const float *weight,
                                        const float *bias,
                                        const loom_conv2d_dims *d);
loom_status loom_kern_conv_dnnl_backward(float *dinp, float *dweight,
                                         float *col, const float *dout,
                                         const float *inp, const float *weight,
                                         const loom_conv2d_dims *d);
/* The same with input, weights and output gradient of half type dt
 * (results f32). */
loom_status loom_kern_conv_dnnl_forward_half(loom_dtype dt, float *out,
                                             float *col, const uint16_t *inp,
                                             const uint16_t *weight,
                                             const float *bias,
                                             const loom_conv2d_dims *d);
loom_status loom_kern_conv_dnnl_backward_half(loom_dtype dt, float *dinp,
                                              float *dweight, float *col,
                                              const uint16_t *dout,
                                              const uint16_t *inp,
                                              const uint16_t *weight,
                                              const loom_conv2d_dims *d);
/* Whether loom_conv2d_* would run these (valid) dims on oneDNN's
 * primitives (conv.c, one copy per instruction set). */
#ifdef LOOM_ISA_SUFFIX
bool LOOM_ISA(loom_kern_conv_use_dnnl)(const loom_conv2d_dims *d);
/* The linear layer's bias gradient, dbias += the column sums of dout(N,OC)
 * (dbias may be NULL), in the pass that also rounds dout to half type dt:
 * into h as half values, or (h NULL) into r as their f32 values (linear.c:
 * the f32 layer's sums, bit for bit). parts: NULL, or
 * loom_kern_bias_parts_floats(N, OC) floats of work space, which lets the
 * threads read whole rows (the same bits). pre (NULL: none): the gradient
 * summed and rounded is gelu'(pre) * dout (loom_gelu_backward_to's values,
 * never stored in f32), what a linear layer after a GELU is handed. */
int64_t LOOM_ISA(loom_kern_bias_parts_floats)(int N, int OC);
void LOOM_ISA(loom_kern_bias_grad_half)(float *dbias, const float *dout,
                                        const float *pre, int N, int OC,
                                        loom_dtype dt, uint16_t *h, float *r,
                                        float *parts);
/* C = op(A) op(B) + bias in every row (bias: N floats, or NULL for none),
 * as loom_gemm after the bias was copied into each row of C with beta 1,
 * the same bits, without that pass: the thread-count invariant grid sets
 * each tile to the bias just before its product (gemm.c). */
loom_status LOOM_ISA(loom_kern_gemm_bias)(bool trans_a, bool trans_b, int M,
                                          int N, int K, const float *A, int lda,
                                          const float *B, int ldb,
                                          const float *bias, float *C, int ldc);
/* Half conversions (half.c) on the calling thread alone, for kernels' own
 * parallel loops; dt bf16, else f16. The bits of loom_cvt_* and
 * loom_round_half. */
void LOOM_ISA(loom_kern_narrow)(loom_dtype dt, uint16_t *out, const float *in,
                                int64_t n);
void LOOM_ISA(loom_kern_widen)(loom_dtype dt, float *out, const uint16_t *in,
                               int64_t n);
void LOOM_ISA(loom_kern_round)(loom_dtype dt, float *out, const float *in,
                               int64_t n);
#endif

#endif /* LOOM_KERNELS_INTERNAL_H */
