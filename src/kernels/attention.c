/* Causal multi-head self-attention, forward and backward. Each (b, h) pair
 * is one task for one thread: its score matrix is built block by block of
 * query rows with serial GEMMs that skip the keys a block cannot see (the
 * causal mask), so about 3/4 of the full T x T work is done for T = 2 RB.
 * Tasks write disjoint outputs, so threading never changes a result.
 * (A hand-written 4x16 AVX2 micro-kernel that visits only the causal half
 * measured no faster forward and 25% slower backward than these packed
 * GEMMs at the GPT shape, so it is not here.) */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

/* Query rows per block: block r sees keys [0, (r+1) RB). Smaller blocks skip
 * more masked work but make smaller, less efficient GEMMs. */
#define ATT_RB 64

static loom_status att_check(const char *what, int B, int T, int C, int NH) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "attention %s: bad shape B=%d T=%d C=%d NH=%d (C must "
                      "be a multiple of NH)",
                      what, B, T, C, NH);
  return LOOM_OK;
}

/* Keys [0, L) of row t are worked on whole: L = t+1 rounded up to 16
 * (at most T), so the vector loops have no scalar tails (most rows are
 * short). Callers have computed scores for all of [0, L). */
static int row_span(int t, int T) {
  const int L = (t + 16) / 16 * 16;
  return L < T ? L : T;
}

/* Row t of the scores: softmax over keys [0, t], zeros after. The masked
 * keys in (t, L) are set to -inf first: exp makes them exactly 0. */
static void causal_softmax_row(float *row, int t, int T) {
  const int L = row_span(t, T);
  for (int j = t + 1; j < L; j++)
    row[j] = -INFINITY;
  const float m = loom_kern_max(row, L);
  for (int j = 0; j < L; j++)
    row[j] = loom_kern_expf(row[j] - m);
  const float inv = 1.0f / loom_kern_sum(row, L);
  for (int j = 0; j < L; j++)
    row[j] *= inv;
  if (L < T)
    memset(row + L, 0, (size_t)(T - L) * sizeof(float));
}

/* Row t of dS = P * (dP - sum(P * dP)), from dP in d; P is 0 past t, so
 * the span [0, L) needs no mask; zeros after L. */
static void softmax_grad_row(float *d, const float *pr, int t, int T) {
  const int L = row_span(t, T);
  const float dot = loom_kern_dot(pr, d, L);
  for (int j = 0; j < L; j++)
    d[j] = pr[j] * (d[j] - dot);
  if (L < T)
    memset(d + L, 0, (size_t)(T - L) * sizeof(float));
}

/* ------------------------------------------------------------ kernels */

loom_status LOOM_ISA(loom_attention_forward)(float *out, float *att,
                                             const float *qkv, int B, int T,
                                             int C, int NH) {
  LOOM_TRY(att_check("forward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);
  const int tasks = B * NH;
  const int nt = loom_kern_nthreads(tasks, 1);
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int bh = 0; bh < tasks; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float *q =
        qkv + (int64_t)b * T * C3 + h * HS; /* (T, HS), stride 3C */
    const float *k = q + C, *v = q + 2 * C;
    float *a = att + (int64_t)bh * T * T;         /* (T, T) */
    float *o = out + (int64_t)b * T * C + h * HS; /* (T, HS), stride C */
    for (int r0 = 0; r0 < T; r0 += ATT_RB) {
      const int rows = T - r0 < ATT_RB ? T - r0 : ATT_RB, kend = r0 + rows;
      loom_kern_gemm_serial(false, true, rows, kend, HS, scale,
                            q + (int64_t)r0 * C3, C3, k, C3, 0.0f,
                            a + (int64_t)r0 * T, T);
      for (int t = r0; t < kend; t++)
        causal_softmax_row(a + (int64_t)t * T, t, T);
      loom_kern_gemm_serial(false, false, rows, HS, kend, 1.0f,
                            a + (int64_t)r0 * T, T, v, C3, 0.0f,
                            o + (int64_t)r0 * C, C);
    }
  }
  return LOOM_OK;
}

/* With S = scale Q K^T, P = softmax(S) (causal), O = P V:
 *   dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
 *   dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. */
loom_status LOOM_ISA(loom_attention_backward)(float *dqkv, float *scratch,
                                              const float *dout,
                                              const float *qkv,
                                              const float *att, int B, int T,
                                              int C, int NH) {
  LOOM_TRY(att_check("backward", B, T, C, NH));
  if (B == 0 || T == 0)
    return LOOM_OK;
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)HS);
  const int tasks = B * NH;
  const int nt = loom_kern_nthreads(tasks, 1);
  loom_kern_gemm_serial_begin();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int bh = 0; bh < tasks; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t tok = (int64_t)b * T;
    const float *q = qkv + tok * C3 + h * HS, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + tok * C3 + h * HS, *dk = dq + C, *dv = dq + 2 * C;
    const float *dO = dout + tok * C + h * HS;  /* (T, HS), stride C */
    const float *p = att + (int64_t)bh * T * T; /* (T, T) */
    float *ds = scratch + (int64_t)bh * T * T;  /* (T, T) */
    for (int r0 = 0; r0 < T; r0 += ATT_RB) {
      const int rows = T - r0 < ATT_RB ? T - r0 : ATT_RB, kend = r0 + rows;
      float *dsb = ds + (int64_t)r0 * T;
      const float *pb = p + (int64_t)r0 * T;
      loom_kern_gemm_serial(false, true, rows, kend, HS, 1.0f,
                            dO + (int64_t)r0 * C, C, v, C3, 0.0f, dsb, T);
      for (int t = r0; t < kend; t++) /* masked keys: zero, for the GEMMs */
        softmax_grad_row(ds + (int64_t)t * T, p + (int64_t)t * T, t, T);
      loom_kern_gemm_serial(false, false, rows, HS, kend, scale, dsb, T, k, C3,
                            1.0f, dq + (int64_t)r0 * C3, C3);
      loom_kern_gemm_serial(true, false, kend, HS, rows, scale, dsb, T,
                            q + (int64_t)r0 * C3, C3, 1.0f, dk, C3);
      loom_kern_gemm_serial(true, false, kend, HS, rows, 1.0f, pb, T,
                            dO + (int64_t)r0 * C, C, 1.0f, dv, C3);
    }
  }
  return LOOM_OK;
}
