/* kernels: the functions built once per instruction set. Every kernel file
 * but gemm_backend.c, conv_dnnl.c and dispatch.c is compiled once for each
 * instruction set of LOOM_ISA_LIST (CMakeLists.txt: base for x86-64-v2, avx2
 * with -mavx2 -mfma), with LOOM_ISA_SUFFIX naming the copy; its public
 * functions are defined as LOOM_ISA(name) and dispatch.c defines name() to
 * call the copy loom_cpu_isa() chose. A function missing here fails the
 * link (two definitions, or none), never silently. */
#ifndef LOOM_KERNELS_ISA_H
#define LOOM_KERNELS_ISA_H

#include "loom/kernels.h"

/* R(ret, name, (params), (args)) for a function that returns a value,
 * V(name, (params), (args)) for one that does not. */
/* clang-format off */
#define LOOM_KERNELS_ISA_FNS(R, V) \
  R(loom_status, loom_attention_forward, (float *out, float *att, const float *qkv, int B, int T, int C, int NH), (out, att, qkv, B, T, C, NH)) \
  R(loom_status, loom_attention_backward, (float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B, int T, int C, int NH), (dqkv, scratch, dout, qkv, att, B, T, C, NH)) \
  R(int64_t, loom_attention_half_scratch_floats, (int B, int T, int C, int NH), (B, T, C, NH)) \
  R(loom_status, loom_attention_forward_half, (loom_dtype dt, float *out, uint16_t *outh, uint16_t *att, const float *qkv, uint16_t *qkvh, int B, int T, int C, int NH, float *scratch), (dt, out, outh, att, qkv, qkvh, B, T, C, NH, scratch)) \
  R(loom_status, loom_attention_backward_half, (loom_dtype dt, float *dqkv, const float *dout, const float *qkv, const uint16_t *qkvh, const uint16_t *att, int B, int T, int C, int NH, float *scratch), (dt, dqkv, dout, qkv, qkvh, att, B, T, C, NH, scratch)) \
  R(int, loom_conv2d_out_h, (const loom_conv2d_dims *d), (d)) \
  R(int, loom_conv2d_out_w, (const loom_conv2d_dims *d), (d)) \
  R(int64_t, loom_conv2d_col_floats, (const loom_conv2d_dims *d), (d)) \
  R(int64_t, loom_conv2d_col_floats_used, (const loom_conv2d_dims *d), (d)) \
  R(loom_status, loom_conv2d_forward, (float *out, float *col, const float *inp, const float *weight, const float *bias, const loom_conv2d_dims *d), (out, col, inp, weight, bias, d)) \
  R(loom_status, loom_conv2d_backward, (float *dinp, float *dweight, float *dbias, float *col, const float *dout, const float *inp, const float *weight, const loom_conv2d_dims *d), (dinp, dweight, dbias, col, dout, inp, weight, d)) \
  V(loom_conv2d_forward_ref, (float *out, const float *inp, const float *weight, const float *bias, const loom_conv2d_dims *d), (out, inp, weight, bias, d)) \
  V(loom_add_forward, (float *out, const float *a, const float *b, int64_t n), (out, a, b, n)) \
  V(loom_accumulate, (float *y, const float *x, int64_t n), (y, x, n)) \
  V(loom_scale, (float *x, float s, int64_t n), (x, s, n)) \
  V(loom_relu_forward, (float *out, const float *inp, int64_t n), (out, inp, n)) \
  V(loom_relu_backward, (float *dinp, const float *inp, const float *dout, int64_t n), (dinp, inp, dout, n)) \
  V(loom_relu_backward_to, (float *dinp, const float *inp, const float *dout, int64_t n), (dinp, inp, dout, n)) \
  V(loom_gelu_forward, (float *out, const float *inp, int64_t n), (out, inp, n)) \
  V(loom_gelu_forward_half, (loom_dtype dt, uint16_t *out, const float *inp, int64_t n), (dt, out, inp, n)) \
  V(loom_relu_forward_half, (loom_dtype dt, uint16_t *out, const float *inp, int64_t n), (dt, out, inp, n)) \
  V(loom_gelu_backward, (float *dinp, const float *inp, const float *dout, int64_t n), (dinp, inp, dout, n)) \
  V(loom_gelu_backward_to, (float *dinp, const float *inp, const float *dout, int64_t n), (dinp, inp, dout, n)) \
  V(loom_dropout_forward, (float *out, uint8_t *mask, const float *inp, float p, loom_rng *rng, int64_t n), (out, mask, inp, p, rng, n)) \
  V(loom_dropout_backward, (float *dinp, const uint8_t *mask, const float *dout, float p, int64_t n), (dinp, mask, dout, p, n)) \
  V(loom_embedding_forward, (float *out, const int32_t *ids, const float *table, int N, int C), (out, ids, table, N, C)) \
  V(loom_embedding_backward, (float *dtable, const float *dout, const int32_t *ids, int N, int C), (dtable, dout, ids, N, C)) \
  V(loom_gemm_ref, (bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc), (trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) \
  R(loom_status, loom_gemm, (bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc), (trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) \
  V(loom_layernorm_forward, (float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int N, int C), (out, mean, rstd, inp, weight, bias, N, C)) \
  V(loom_layernorm_forward_half, (loom_dtype dt, uint16_t *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int N, int C), (dt, out, mean, rstd, inp, weight, bias, N, C)) \
  V(loom_layernorm_backward, (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, const float *mean, const float *rstd, int N, int C), (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C)) \
  V(loom_cvt_f32_to_bf16, (loom_bf16 *out, const float *in, int64_t n), (out, in, n)) \
  V(loom_cvt_bf16_to_f32, (float *out, const loom_bf16 *in, int64_t n), (out, in, n)) \
  V(loom_round_bf16, (float *out, const float *in, int64_t n), (out, in, n)) \
  V(loom_cvt_f32_to_f16, (loom_f16 *out, const float *in, int64_t n), (out, in, n)) \
  V(loom_cvt_f16_to_f32, (float *out, const loom_f16 *in, int64_t n), (out, in, n)) \
  V(loom_round_f16, (float *out, const float *in, int64_t n), (out, in, n)) \
  R(loom_status, loom_cvt_f32_to_half, (loom_dtype dt, uint16_t *out, const float *in, int64_t n), (dt, out, in, n)) \
  R(loom_status, loom_cvt_half_to_f32, (loom_dtype dt, float *out, const uint16_t *in, int64_t n), (dt, out, in, n)) \
  R(loom_status, loom_round_half, (loom_dtype dt, float *out, const float *in, int64_t n), (dt, out, in, n)) \
  R(loom_status, loom_round_half_serial, (loom_dtype dt, float *out, const float *in, int64_t n), (dt, out, in, n)) \
  R(int64_t, loom_gemm_half_scratch_floats, (int M, int N, int K), (M, N, K)) \
  R(loom_status, loom_gemm_half, (loom_dtype dt, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc, float *scratch), (dt, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, scratch)) \
  R(int64_t, loom_linear_half_scratch_floats, (int N, int C, int OC), (N, C, OC)) \
  R(loom_status, loom_linear_forward_half, (float *out, const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight, loom_dtype w_dtype, const float *bias, int N, int C, int OC, float *scratch), (out, inp, in_dtype, dt, weight, w_dtype, bias, N, C, OC, scratch)) \
  R(loom_status, loom_linear_backward_half, (float *dinp, float *dweight, float *dbias, const float *dout, const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight, loom_dtype w_dtype, int N, int C, int OC, float *scratch), (dinp, dweight, dbias, dout, inp, in_dtype, dt, weight, w_dtype, N, C, OC, scratch)) \
  R(loom_status, loom_linear_backward_half_gelu, (float *dinp, float *dweight, float *dbias, const float *dgelu, const float *pre, const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight, loom_dtype w_dtype, int N, int C, int OC, float *scratch), (dinp, dweight, dbias, dgelu, pre, inp, in_dtype, dt, weight, w_dtype, N, C, OC, scratch)) \
  R(int64_t, loom_conv2d_half_scratch_floats, (const loom_conv2d_dims *d), (d)) \
  R(loom_status, loom_conv2d_forward_half, (float *out, float *col, const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight, loom_dtype w_dtype, const float *bias, const loom_conv2d_dims *d, float *scratch), (out, col, inp, in_dtype, dt, weight, w_dtype, bias, d, scratch)) \
  R(loom_status, loom_conv2d_backward_half, (float *dinp, float *dweight, float *dbias, float *col, const float *dout, const void *inp, loom_dtype in_dtype, loom_dtype dt, const void *weight, loom_dtype w_dtype, const loom_conv2d_dims *d, float *scratch), (dinp, dweight, dbias, col, dout, inp, in_dtype, dt, weight, w_dtype, d, scratch)) \
  R(loom_status, loom_linear_forward, (float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC), (out, inp, weight, bias, N, C, OC)) \
  R(loom_status, loom_linear_backward, (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, int N, int C, int OC), (dinp, dweight, dbias, dout, inp, weight, N, C, OC)) \
  V(loom_maxpool2d_forward, (float *out, int32_t *argmax, const float *inp, int N, int C, int H, int W, int K, int S), (out, argmax, inp, N, C, H, W, K, S)) \
  V(loom_relu_maxpool2d_forward, (float *out, int32_t *argmax, const float *inp, int N, int C, int H, int W, int K, int S), (out, argmax, inp, N, C, H, W, K, S)) \
  V(loom_maxpool2d_backward, (float *dinp, const float *dout, const int32_t *argmax, int N, int C, int H, int W, int K, int S), (dinp, dout, argmax, N, C, H, W, K, S)) \
  V(loom_maxpool2d_backward_to, (float *dinp, const float *dout, const int32_t *argmax, int N, int C, int H, int W, int K, int S), (dinp, dout, argmax, N, C, H, W, K, S)) \
  V(loom_relu_maxpool2d_backward_to, (float *dinp, const float *dout, const int32_t *argmax, const float *inp, int N, int C, int H, int W, int K, int S), (dinp, dout, argmax, inp, N, C, H, W, K, S)) \
  V(loom_softmax_forward, (float *out, const float *inp, int N, int C), (out, inp, N, C)) \
  V(loom_softmax_backward, (float *dinp, const float *out, const float *dout, int N, int C), (dinp, out, dout, N, C)) \
  V(loom_log_softmax_forward, (float *out, const float *inp, int N, int C), (out, inp, N, C)) \
  V(loom_log_softmax_backward, (float *dinp, const float *out, const float *dout, int N, int C), (dinp, out, dout, N, C)) \
  V(loom_crossentropy_forward, (float *losses, float *probs, const float *logits, const int32_t *targets, int N, int V), (losses, probs, logits, targets, N, V)) \
  V(loom_crossentropy_backward, (float *dlogits, const float *probs, const int32_t *targets, const float *dloss, int N, int V), (dlogits, probs, targets, dloss, N, V)) \
  V(loom_row_max, (float *out, const float *x, int N, int V), (out, x, N, V)) \
  V(loom_exp_rows, (float *probs, float *sums, const float *logits, const float *max, int N, int V), (probs, sums, logits, max, N, V))
/* clang-format on */

LOOM_KERNELS_ISA_FNS(LOOM_ISA_DECL_R, LOOM_ISA_DECL_V) /* the copies */

#if defined(LOOM_ISA_SUFFIX)
/* Inside a copy: its own copy of the internal helpers that other kernel
 * files of the same copy call. */
#define loom_kern_gemm_serial_begin LOOM_ISA(loom_kern_gemm_serial_begin)
#define loom_kern_gemm_serial LOOM_ISA(loom_kern_gemm_serial)
#endif

#endif /* LOOM_KERNELS_ISA_H */
