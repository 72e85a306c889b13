/* Linear layer: out = inp @ weight^T + bias through loom_gemm, and its
 * backward (two GEMMs and a fixed-order column sum for the bias). */
#include <omp.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

/* Row chunk of the bias-gradient sum, and the widest column block. */
#define LIN_ROWS 64
#define LIN_COLS_MAX 1024

loom_status LOOM_ISA(loom_linear_forward)(float *out, const float *inp,
                                          const float *weight,
                                          const float *bias, int N, int C,
                                          int OC) {
  if (N < 0 || C < 0 || OC < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "linear: negative size");
  /* out's rows set to the bias, then out += inp @ W^T: one pass over out,
   * the bias copied tile by tile as the grid makes them */
  loom_status st = LOOM_ISA(loom_kern_gemm_bias)(
      false, true, N, OC, C, inp, C > 0 ? C : 1, weight, C > 0 ? C : 1, bias,
      out, OC > 0 ? OC : 1);
  return st == LOOM_OK ? st : loom_error_context(st, "linear forward");
}

/* dbias(OC) += sum over the N rows of dout(N, OC): per column, the rows of
 * each chunk of LIN_ROWS added in order from zero, then the chunks' sums in
 * order from zero. dbias may be NULL (no sum). With h (or r) the same pass
 * also writes dout rounded to half type dt, as half values into h (or as
 * their f32 values into r): what the half matmuls of the backward take,
 * without a second read of dout. With pre, the gradient summed and rounded
 * is gelu'(pre) * dout (loom_gelu_backward_to's values), computed here.
 *
 * Two ways to walk, the same arithmetic for every column (so the same
 * bits): with `parts` (loom_kern_bias_parts_floats floats) threads take
 * whole 64-row chunks, reading rows front to back, each chunk's sums kept
 * in parts, then added in chunk order; without, threads take column blocks
 * at most LIN_COLS_MAX wide and walk down them, a row segment at a time (a
 * strided walk the prefetchers follow less well: kjv-gpt's bias sums took
 * twice as long with 256-wide blocks over 512 columns). */
static inline void bias_row(float *part, const float *dout, const float *pre,
                            int64_t at, int w, loom_dtype dt, uint16_t *h,
                            float *r, float *g) {
  const float *d = dout + at;
  if (pre) { /* the GELU's backward first, as loom_gelu_backward_to */
    const float *x = pre + at;
    for (int j = 0; j < w; j++)
      g[j] = fmaf(loom_kern_gelu_slope(x[j]), d[j], 0.0f);
    d = g;
  }
  if (part)
    for (int j = 0; j < w; j++)
      part[j] += d[j];
  if (h)
    LOOM_ISA(loom_kern_narrow)(dt, h + at, d, w);
  else if (r)
    LOOM_ISA(loom_kern_round)(dt, r + at, d, w);
}

int64_t LOOM_ISA(loom_kern_bias_parts_floats)(int N, int OC) {
  return (int64_t)((N + LIN_ROWS - 1) / LIN_ROWS) * OC;
}

static void bias_grad_half(float *dbias, const float *dout, const float *pre,
                           int N, int OC, loom_dtype dt, uint16_t *h, float *r,
                           float *parts) {
  const int nt = loom_kern_nthreads((int64_t)N * OC, LOOM_KERN_PAR_MIN);
  if (parts) {
    const int nch = (N + LIN_ROWS - 1) / LIN_ROWS;
    const int cblocks = (OC + LIN_COLS_MAX - 1) / LIN_COLS_MAX;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      float g[LIN_COLS_MAX];
#pragma omp for schedule(static)
      for (int c = 0; c < nch; c++) {
        float *part = dbias ? parts + (int64_t)c * OC : NULL;
        if (part)
          memset(part, 0, (size_t)OC * sizeof(float));
        const int n1 = (c + 1) * LIN_ROWS < N ? (c + 1) * LIN_ROWS : N;
        for (int n = c * LIN_ROWS; n < n1; n++)
          for (int c0 = 0; c0 < OC; c0 += LIN_COLS_MAX)
            bias_row(part ? part + c0 : NULL, dout, pre, (int64_t)n * OC + c0,
                     OC - c0 < LIN_COLS_MAX ? OC - c0 : LIN_COLS_MAX, dt, h, r,
                     g);
      }
      if (dbias) {
#pragma omp for schedule(static)
        for (int cb = 0; cb < cblocks; cb++) {
          const int c0 = cb * LIN_COLS_MAX;
          const int w = OC - c0 < LIN_COLS_MAX ? OC - c0 : LIN_COLS_MAX;
          float tot[LIN_COLS_MAX] = {0};
          for (int c = 0; c < nch; c++) {
            const float *part = parts + (int64_t)c * OC + c0;
            for (int j = 0; j < w; j++)
              tot[j] += part[j];
          }
          for (int j = 0; j < w; j++)
            dbias[c0 + j] += tot[j];
        }
      }
    }
    return;
  }
  int bw = (OC + nt - 1) / nt;
  bw = (bw + 15) / 16 * 16;
  bw = bw < 16 ? 16 : bw > LIN_COLS_MAX ? LIN_COLS_MAX : bw;
  const int blocks = (OC + bw - 1) / bw;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * bw;
    const int w = OC - c0 < bw ? OC - c0 : bw;
    float tot[LIN_COLS_MAX] = {0}, part[LIN_COLS_MAX], g[LIN_COLS_MAX];
    for (int n0 = 0; n0 < N; n0 += LIN_ROWS) {
      const int n1 = n0 + LIN_ROWS < N ? n0 + LIN_ROWS : N;
      for (int j = 0; j < w; j++)
        part[j] = 0.0f;
      for (int n = n0; n < n1; n++)
        bias_row(dbias ? part : NULL, dout, pre, (int64_t)n * OC + c0, w, dt, h,
                 r, g);
      for (int j = 0; j < w; j++)
        tot[j] += part[j];
    }
    if (dbias)
      for (int j = 0; j < w; j++)
        dbias[c0 + j] += tot[j];
  }
}

static void bias_grad(float *dbias, const float *dout, int N, int OC) {
  bias_grad_half(dbias, dout, NULL, N, OC, LOOM_F32, NULL, NULL, NULL);
}

void LOOM_ISA(loom_kern_bias_grad_half)(float *dbias, const float *dout,
                                        const float *pre, int N, int OC,
                                        loom_dtype dt, uint16_t *h, float *r,
                                        float *parts) {
  bias_grad_half(dbias, dout, pre, N, OC, dt, h, r, parts);
}

loom_status LOOM_ISA(loom_linear_backward)(float *dinp, float *dweight,
                                           float *dbias, const float *dout,
                                           const float *inp,
                                           const float *weight, int N, int C,
                                           int OC) {
  if (N < 0 || C < 0 || OC < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "linear: negative size");
  const int ldc = C > 0 ? C : 1, ldo = OC > 0 ? OC : 1;
  loom_status st;
  if (dinp && /* dinp(N,C) += dout(N,OC) @ weight(OC,C) */
      (st = loom_gemm(false, false, N, C, OC, 1.0f, dout, ldo, weight, ldc,
                      1.0f, dinp, ldc)) != LOOM_OK)
    return loom_error_context(st, "linear backward (dinp)");
  if (dweight && /* dweight(OC,C) += dout^T @ inp(N,C) */
      (st = loom_gemm(true, false, OC, C, N, 1.0f, dout, ldo, inp, ldc, 1.0f,
                      dweight, ldc)) != LOOM_OK)
    return loom_error_context(st, "linear backward (dweight)");
  if (dbias)
    bias_grad(dbias, dout, N, OC);
  return LOOM_OK;
}
