/* loom kernels: CPU math in f32. Free functions, outputs first, raw pointers
 * and dimensions, no allocation. Backward kernels ADD into their gradient
 * outputs (+=), so one memset clears gradients and accumulation is free.
 *
 * Letters: B batch, T time (sequence), C channels / features, OC output
 * channels, NH heads, HS head size (C / NH), V vocabulary, N rows,
 * H W height width, KH KW kernel size. All arrays are row-major. */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/core.h"

#ifdef __cplusplus
extern "C" {
#endif
LOOM_API_BEGIN

/* ------------------------------------------------------------------ GEMM */

#define LOOM_GEMM_BACKEND_LIST(X)                                              \
  X(LOOM_GEMM_DNNL, "dnnl")                                                    \
  X(LOOM_GEMM_OPENBLAS, "openblas")                                            \
  X(LOOM_GEMM_NAIVE, "naive")

typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_GEMM_BACKEND_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_GEMM_BACKEND_COUNT
} loom_gemm_backend;

/* The backend in use: LOOM_GEMM env (dnnl|openblas|naive) on first use, else
 * the build default (dnnl when built with oneDNN). */
loom_gemm_backend loom_gemm_get_backend(void);
loom_status loom_gemm_set_backend(loom_gemm_backend b);
const char *loom_gemm_backend_name(loom_gemm_backend b);
loom_status loom_gemm_backend_parse(const char *name, loom_gemm_backend *out);

/* C(M,N) = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * A is (M,K) or, transposed, (K,M); B is (K,N) or (N,K); ld* are row
 * strides. Uses loom_threads() threads. */
loom_status loom_gemm(bool trans_a, bool trans_b, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc);
/* Thread-count invariance (on by default; LOOM_GEMM_DETERMINISTIC=0 turns
 * it off): dnnl_sgemm and OpenBLAS give bitwise different results at 1 and
 * 2 threads for some shapes (they split K, or change kernels, with the
 * thread count). When on, loom_gemm cuts C (and, for small C and long K,
 * the K sum) into a grid that depends only on (M, N, K), computes each tile
 * with the library on one thread under OpenMP, and adds K partials in a
 * fixed order: the same inputs give the same bits at any thread count.
 * When off, the library threads the GEMM itself. */
void loom_gemm_set_deterministic(bool on);
bool loom_gemm_get_deterministic(void);

/* The plain triple loop, accumulated in double: the reference of tests. */
void loom_gemm_ref(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta,
                   float *C, int ldc);

/* ---------------------------------------------------------------- linear */

/* out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias may be NULL. */
loom_status loom_linear_forward(float *out, const float *inp,
                                const float *weight, const float *bias, int N,
                                int C, int OC);
/* dinp(N,C) += dout @ weight; dweight(OC,C) += dout^T @ inp;
 * dbias(OC) += sum over rows of dout. Any gradient output may be NULL. */
loom_status loom_linear_backward(float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp,
                                 const float *weight, int N, int C, int OC);

/* ------------------------------------------------------------------ half */

/* Mixed precision (docs/precision.md): half storage of type bf16 (8
 * exponent bits, 8 significant bits) or f16 (5 exponent bits, 11
 * significant bits), 2 bytes an element. Conversions round to nearest
 * even; a NaN stays a NaN (made quiet, its top payload bits kept),
 * infinities stay, a value past the type's largest finite one rounds to
 * infinity (f16: |x| >= 65520), f16's subnormals are kept (never flushed).
 * The bits are those of core's scalar loom_f32_to_bf16 / loom_f32_to_f16,
 * on every instruction set (f16 uses F16C in the avx2 and avx512 copies).
 * Elementwise, any thread count, same bits. */
void loom_cvt_f32_to_bf16(loom_bf16 *out, const float *in, int64_t n);
void loom_cvt_bf16_to_f32(float *out, const loom_bf16 *in, int64_t n);
/* out = in rounded to bf16, kept in f32 (out may be in). */
void loom_round_bf16(float *out, const float *in, int64_t n);
void loom_cvt_f32_to_f16(loom_f16 *out, const float *in, int64_t n);
void loom_cvt_f16_to_f32(float *out, const loom_f16 *in, int64_t n);
/* out = in rounded to f16, kept in f32 (out may be in). */
void loom_round_f16(float *out, const float *in, int64_t n);
/* The same for the half type dt (LOOM_BF16 or LOOM_F16; another type is
 * LOOM_ERR_UNSUPPORTED). */
loom_status loom_cvt_f32_to_half(loom_dtype dt, uint16_t *out, const float *in,
                                 int64_t n);
loom_status loom_cvt_half_to_f32(loom_dtype dt, float *out, const uint16_t *in,
                                 int64_t n);
loom_status loom_round_half(loom_dtype dt, float *out, const float *in,
                            int64_t n);
/* The same on the calling thread alone, with no parallel region: for a
 * caller inside its own parallel loop (the optimizer, writing the model's
 * rounded copy block by block as it updates the parameters). */
loom_status loom_round_half_serial(loom_dtype dt, float *out, const float *in,
                                   int64_t n);

/* How the bf16 matmuls (GEMM and linear layer) run on this CPU. CONVERT:
 * operands converted on load to f32 and the f32 GEMM (every CPU; up to
 * the summation order what a bf16 unit with f32 accumulation gives).
 * AVX512_BF16 and AMX: oneDNN's matmul primitives on the CPU's bf16 unit,
 * built once per shape and cached, thread-count invariant as loom_gemm
 * (chosen when the GEMM backend is dnnl and the CPU has the unit;
 * LOOM_BF16_PATH=convert forces the conversion). A shape oneDNN has no
 * fast kernel for takes the conversion. f16: loom_f16_path below. */
#define LOOM_BF16_PATH_LIST(X)                                                 \
  X(LOOM_BF16_PATH_CONVERT, "convert")                                         \
  X(LOOM_BF16_PATH_AVX512_BF16, "avx512_bf16")                                 \
  X(LOOM_BF16_PATH_AMX, "amx")
typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_BF16_PATH_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_BF16_PATH_COUNT
} loom_bf16_path;
const char *loom_bf16_path_name(loom_bf16_path p);
/* The path the bf16 kernels take in this process (chosen at the first
 * call). set: another (tests, benchmarks); LOOM_ERR_UNSUPPORTED for a unit
 * this CPU or build lacks. */
loom_bf16_path loom_bf16_get_path(void);
loom_status loom_bf16_set_path(loom_bf16_path p);
/* One line for the start-up log of half type dt: "AVX2 (f32 arithmetic,
 * bf16 storage)", "F16C (f32 arithmetic, f16 storage)"; "?" for another
 * type. */
const char *loom_half_path_describe(loom_dtype dt);
/* How the f16 matmuls run. CONVERT: as bf16's (f32 arithmetic on the
 * values converted on load; F16C in the avx2 and avx512 copies).
 * AVX512_FP16: oneDNN's matmul and convolution primitives with f16
 * operands and f32 sums, as bf16's unit path, where the CPU has
 * AVX512-FP16 (Sapphire Rapids and later) and loom is built against a
 * oneDNN with f16 kernels for it (3.x: LOOM_DNNL_ROOT and
 * scripts/fetch-onednn3.sh; Debian's 2.6.3 has none). Chosen at the first
 * call; LOOM_F16_PATH=convert forces the conversion. */
#define LOOM_F16_PATH_LIST(X)                                                  \
  X(LOOM_F16_PATH_CONVERT, "convert")                                          \
  X(LOOM_F16_PATH_AVX512_FP16, "avx512_fp16")
typedef enum {
#define LOOM_X_ENUM(name, text) name,
  LOOM_F16_PATH_LIST(LOOM_X_ENUM)
#undef LOOM_X_ENUM
      LOOM_F16_PATH_COUNT
} loom_f16_path;
const char *loom_f16_path_name(loom_f16_path p);
loom_f16_path loom_f16_get_path(void);
/* Another path (tests, benchmarks); LOOM_ERR_UNSUPPORTED where this CPU or
 * build has no f16 unit. */
loom_status loom_f16_set_path(loom_f16_path p);
/* Whether matmuls of half type dt run on the CPU's unit in this process:
 * bf16 with loom_bf16_get_path() not convert, or f16 with
 * loom_f16_get_path() not convert. */
bool loom_half_on_unit(loom_dtype dt);
/* The oneDNN loom runs on (the one it was built against, LOOM_DNNL_ROOT):
 * major * 100 + minor, as 206 for 2.6 or 302 for 3.2; 0 without oneDNN. */
int loom_dnnl_version(void);

/* C(M,N) = alpha op(A) op(B) + beta C with A and B of half type dt (bf16
 * or f16) and C in f32: each product of two bf16 or two f16 values is
 * exact in f32, and the sums are f32 (so the result is the f32 GEMM of the
 * half values, up to the order of the sums; on this path, to the bit).
 * scratch: loom_gemm_half_scratch_floats(M, N, K) floats. Same contract as
 * loom_gemm otherwise (thread-count invariant). */
int64_t loom_gemm_half_scratch_floats(int M, int N, int K);
loom_status loom_gemm_half(loom_dtype dt, bool trans_a, bool trans_b, int M,
                           int N, int K, float alpha, const uint16_t *A,
                           int lda, const uint16_t *B, int ldb, float beta,
                           float *C, int ldc, float *scratch);

/* The linear layer with half operands of type dt: out(N,OC) = half(inp) @
 * weight^T + bias, where inp is f32 (rounded to dt here) or of type dt
 * (in_dtype), bias f32 or NULL, out f32. weight (OC,C) is of type dt, or
 * f32 holding values of dt (w_dtype LOOM_F32: values loom_round_half
 * made, as a model's copy on the conversion path holds them), which the
 * conversion path reads as they are, with no widening pass; an f32 weight
 * always takes that path. Other values are not rounded again: they are
 * the caller's to round.
 * Backward rounds dout to dt for the two matmuls (dinp += half(dout) @
 * weight, dweight += half(dout)^T @ half(inp), both f32 sums) and sums
 * dbias from the f32 dout, as the f32 layer does. scratch:
 * loom_linear_half_scratch_floats(N, C, OC) floats, for forward and
 * backward alike. */
int64_t loom_linear_half_scratch_floats(int N, int C, int OC);
loom_status loom_linear_forward_half(float *out, const void *inp,
                                     loom_dtype in_dtype, loom_dtype dt,
                                     const void *weight, loom_dtype w_dtype,
                                     const float *bias, int N, int C, int OC,
                                     float *scratch);
loom_status loom_linear_backward_half(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const void *inp,
                                      loom_dtype in_dtype, loom_dtype dt,
                                      const void *weight, loom_dtype w_dtype,
                                      int N, int C, int OC, float *scratch);
/* The same for a layer whose output feeds a GELU, given the gradient at
 * the GELU's output (dgelu) and the layer's output (pre, the GELU's
 * input): bit for bit loom_gelu_backward_to(d, pre, dgelu) then
 * loom_linear_backward_half(..., d, ...), without d written in f32 (the
 * GELU's backward, the rounding and the bias sum in one pass). */
loom_status loom_linear_backward_half_gelu(float *dinp, float *dweight,
                                           float *dbias, const float *dgelu,
                                           const float *pre, const void *inp,
                                           loom_dtype in_dtype, loom_dtype dt,
                                           const void *weight,
                                           loom_dtype w_dtype, int N, int C,
                                           int OC, float *scratch);

/* ----------------------------------------------------------- elementwise */

void loom_add_forward(float *out, const float *a, const float *b, int64_t n);
/* y += x */
void loom_accumulate(float *y, const float *x, int64_t n);
void loom_scale(float *x, float s, int64_t n);
void loom_relu_forward(float *out, const float *inp, int64_t n);
/* The same rounded to half type dt (bf16 or f16; out: n half values):
 * bit for bit loom_relu_forward then loom_cvt_f32_to_half, in one pass. */
void loom_relu_forward_half(loom_dtype dt, uint16_t *out, const float *inp,
                            int64_t n);
/* dinp += dout * (inp > 0) */
void loom_relu_backward(float *dinp, const float *inp, const float *dout,
                        int64_t n);
/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void loom_gelu_forward(float *out, const float *inp, int64_t n);
/* The same rounded to half type dt (bf16 or f16; out: n half values):
 * bit for bit loom_gelu_forward then loom_cvt_f32_to_half, in one pass. */
void loom_gelu_forward_half(loom_dtype dt, uint16_t *out, const float *inp,
                            int64_t n);
void loom_gelu_backward(float *dinp, const float *inp, const float *dout,
                        int64_t n);
/* The same two backward passes writing dinp instead of adding into it: the
 * bits of the adding form into a zeroed dinp, without clearing it first. */
void loom_relu_backward_to(float *dinp, const float *inp, const float *dout,
                           int64_t n);
void loom_gelu_backward_to(float *dinp, const float *inp, const float *dout,
                           int64_t n);
/* Inverted dropout: out = inp * mask / (1-p), mask(n) bytes of 0/1 drawn
 * from the counter-based stream `rng` (its counter advances by n). */
void loom_dropout_forward(float *out, uint8_t *mask, const float *inp, float p,
                          loom_rng *rng, int64_t n);
void loom_dropout_backward(float *dinp, const uint8_t *mask, const float *dout,
                           float p, int64_t n);

/* ------------------------------------------------- softmax and layernorm */

/* Row-wise over (N, C), numerically stable (max subtracted). */
void loom_softmax_forward(float *out, const float *inp, int N, int C);
/* dinp += out * (dout - sum(dout * out)) */
void loom_softmax_backward(float *dinp, const float *out, const float *dout,
                           int N, int C);
void loom_log_softmax_forward(float *out, const float *inp, int N, int C);
/* dinp += dout - exp(out) * sum(dout) */
void loom_log_softmax_backward(float *dinp, const float *out, const float *dout,
                               int N, int C);

/* out(N,C) = (inp - mean) * rstd * weight + bias; saves mean(N), rstd(N).
 * eps = 1e-5. */
void loom_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *inp, const float *weight,
                            const float *bias, int N, int C);
/* The same with out rounded to half type dt (bf16 or f16; N*C half
 * values): bit for bit loom_layernorm_forward then loom_cvt_f32_to_half,
 * in one pass. */
void loom_layernorm_forward_half(loom_dtype dt, uint16_t *out, float *mean,
                                 float *rstd, const float *inp,
                                 const float *weight, const float *bias, int N,
                                 int C);
void loom_layernorm_backward(float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp,
                             const float *weight, const float *mean,
                             const float *rstd, int N, int C);

/* ------------------------------------------------------------- attention */

/* Causal multi-head self-attention over qkv(B,T,3C) laid out as
 * [q heads | k heads | v heads] per token (head h of q at h*HS).
 * out(B,T,C): heads concatenated. Saves att(B,NH,T,T): the softmax
 * probabilities (entries above the diagonal are 0). Scale 1/sqrt(HS). */
loom_status loom_attention_forward(float *out, float *att, const float *qkv,
                                   int B, int T, int C, int NH);
/* dqkv(B,T,3C) += ...; scratch(B,NH,T,T) is working memory. */
loom_status loom_attention_backward(float *dqkv, float *scratch,
                                    const float *dout, const float *qkv,
                                    const float *att, int B, int T, int C,
                                    int NH);
/* The same in a half model, dt bf16 or f16 (docs/precision.md): the
 * matmuls on Q, K, V, P (and dO, dS) rounded to dt with f32 sums, softmax in
 * f32; out and dqkv f32; att(B,NH,T,T) saved in dt. The matmuls run on
 * the CPU's unit where loom_half_on_unit(dt); otherwise the rounded values
 * go through the f32 GEMM. scratch:
 * loom_attention_half_scratch_floats(B, T, C, NH) floats, for both.
 * Optional (NULL: not): outh(B,T,C) receives out rounded to dt, each block
 * of rows as it is computed (out is still written); qkvh(B,T,3C) receives
 * qkv rounded to dt in forward, and backward given it reads it instead of
 * rounding qkv again (qkv is then not read; the same bits). */
int64_t loom_attention_half_scratch_floats(int B, int T, int C, int NH);
loom_status loom_attention_forward_half(loom_dtype dt, float *out,
                                        uint16_t *outh, uint16_t *att,
                                        const float *qkv, uint16_t *qkvh, int B,
                                        int T, int C, int NH, float *scratch);
loom_status loom_attention_backward_half(loom_dtype dt, float *dqkv,
                                         const float *dout, const float *qkv,
                                         const uint16_t *qkvh,
                                         const uint16_t *att, int B, int T,
                                         int C, int NH, float *scratch);

/* ------------------------------------------------------------ embeddings */

/* out(N,C) = table[ids[n]]; ids must lie in [0, V). */
void loom_embedding_forward(float *out, const int32_t *ids, const float *table,
                            int N, int C);
/* dtable[ids[n]] += dout[n] (scatter-add, deterministic order). */
void loom_embedding_backward(float *dtable, const float *dout,
                             const int32_t *ids, int N, int C);

/* --------------------------------------------------------- cross entropy */

/* Fused softmax + negative log-likelihood over logits(N,V) with integer
 * targets(N). losses(N) per row; probs(N,V) saved for backward. A target
 * of -1 is ignored (loss 0, no gradient); any other target outside [0, V)
 * gives a NaN loss (and no gradient), so a data bug cannot train silently. */
void loom_crossentropy_forward(float *losses, float *probs, const float *logits,
                               const int32_t *targets, int N, int V);
/* dlogits += (probs - onehot(target)) * dloss[n] (dloss(N): gradient of the
 * objective with respect to each row's loss, e.g. 1/N for a mean). */
void loom_crossentropy_backward(float *dlogits, const float *probs,
                                const int32_t *targets, const float *dloss,
                                int N, int V);

/* The pieces of a vocabulary-parallel cross-entropy, whose softmax spans
 * the ranks' parts of each row: out(N) = the maximum of each row of
 * x(N,V); probs(N,V) = exp(logits - max[n]) and sums(N) their row sums
 * (the fixed-order sum of the softmax above). */
void loom_row_max(float *out, const float *x, int N, int V);
void loom_exp_rows(float *probs, float *sums, const float *logits,
                   const float *max, int N, int V);

/* ---------------------------------------------------------- convolution */

/* 2-D convolution over inp(N,C,H,W) with weight(OC,C,KH,KW), bias(OC) or
 * NULL, into out(N,OC,OH,OW), OH = (H + 2*pad - KH)/stride + 1 (same for W).
 * col is scratch of loom_conv2d_col_floats(...) floats (im2col). */
typedef struct loom_conv2d_dims {
  int N, C, H, W, OC, KH, KW, stride, pad;
} loom_conv2d_dims;

int loom_conv2d_out_h(const loom_conv2d_dims *d);
int loom_conv2d_out_w(const loom_conv2d_dims *d);
int64_t loom_conv2d_col_floats(const loom_conv2d_dims *d);
/* Of those, what the engine the GEMM backend picks now writes (the other
 * engine's room stays untouched: no resident pages). */
int64_t loom_conv2d_col_floats_used(const loom_conv2d_dims *d);
loom_status loom_conv2d_forward(float *out, float *col, const float *inp,
                                const float *weight, const float *bias,
                                const loom_conv2d_dims *d);
/* dinp, dweight, dbias may be NULL (dinp NULL for the first layer). */
loom_status loom_conv2d_backward(float *dinp, float *dweight, float *dbias,
                                 float *col, const float *dout,
                                 const float *inp, const float *weight,
                                 const loom_conv2d_dims *d);
/* The convolution with half operands of type dt, as the half linear
 * layer: inp is f32 (rounded to dt here) or of type dt (in_dtype), weight
 * (OC,C,KH,KW) of type dt or f32 holding values of dt (w_dtype, as the
 * linear layer's), bias f32 or NULL, out f32; the operands are
 * widened into scratch and the f32 kernels above run on them (same engine,
 * same bits as those kernels on rounded operands). Backward rounds dout to
 * dt for dinp and dweight and sums dbias from the f32 dout. scratch:
 * loom_conv2d_half_scratch_floats(d) floats (input, weight, output
 * gradient), col as above. */
int64_t loom_conv2d_half_scratch_floats(const loom_conv2d_dims *d);
loom_status loom_conv2d_forward_half(float *out, float *col, const void *inp,
                                     loom_dtype in_dtype, loom_dtype dt,
                                     const void *weight, loom_dtype w_dtype,
                                     const float *bias,
                                     const loom_conv2d_dims *d, float *scratch);
loom_status loom_conv2d_backward_half(
    float *dinp, float *dweight, float *dbias, float *col, const float *dout,
    const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight,
    loom_dtype w_dtype, const loom_conv2d_dims *d, float *scratch);
/* Direct 7-loop convolution: the reference of tests. */
void loom_conv2d_forward_ref(float *out, const float *inp, const float *weight,
                             const float *bias, const loom_conv2d_dims *d);

/* Max pooling over inp(N,C,H,W), window K, stride S, no padding, into
 * out(N,C,OH,OW) with OH = (H-K)/S + 1; argmax(N,C,OH,OW) saves the flat
 * index within the (H,W) plane of each maximum (first one on ties). */
void loom_maxpool2d_forward(float *out, int32_t *argmax, const float *inp,
                            int N, int C, int H, int W, int K, int S);
void loom_maxpool2d_backward(float *dinp, const float *dout,
                             const int32_t *argmax, int N, int C, int H, int W,
                             int K, int S);
/* Writes all of dinp (zeros where no maximum lies): the bits of the adding
 * form into a zeroed dinp. */
void loom_maxpool2d_backward_to(float *dinp, const float *dout,
                                const int32_t *argmax, int N, int C, int H,
                                int W, int K, int S);
/* Max pooling of relu(inp), as loom_relu_forward then
 * loom_maxpool2d_forward give it (values and argmax), without the ReLU's
 * output; and the backward of the pair into relu's input gradient, written
 * (the bits of loom_maxpool2d_backward_to then loom_relu_backward_to; inp
 * is relu's input). One pass over the large tensor each way instead of
 * three: conv, ReLU, pool stacks spend their time streaming it. */
void loom_relu_maxpool2d_forward(float *out, int32_t *argmax, const float *inp,
                                 int N, int C, int H, int W, int K, int S);
void loom_relu_maxpool2d_backward_to(float *dinp, const float *dout,
                                     const int32_t *argmax, const float *inp,
                                     int N, int C, int H, int W, int K, int S);

/* CPU features and the instruction set the kernels run with:
 * loom_cpu_get_features, loom_cpu_isa, loom_cpu_check (include/loom/core.h). */

LOOM_API_END
#ifdef __cplusplus
}
#endif
#endif /* LOOM_KERNELS_H */
