/* LayerNorm forward and backward over rows of (N, C), eps 1e-5. The
 * parameter gradients sum over rows in a fixed order (threads own column
 * blocks, never row ranges), so they do not depend on the thread count. */
#include <math.h>
#include <omp.h>

#include "internal.h"
#include "loom/kernels.h"

#define LN_EPS 1e-5f
/* Column blocks of the parameter-gradient pass (a multiple of LN_COLS, at
 * most LN_COLS_MAX wide) and the row chunk whose partial sums it adds (a
 * two-level sum keeps the rounding error small). */
#define LN_COLS 16
#define LN_COLS_MAX 1024
#define LN_ROWS 64
#define LN_STRIP_C_MAX 256

/* Rows of out (f32) or, with out NULL, of outh rounded to half type dt
 * as each row is computed, through a stack block: the bits of the f32
 * output then the conversion, in one pass. */
#define LN_HALF_BLOCK 256
static void ln_forward(float *out, uint16_t *outh, loom_dtype dt, float *mean,
                       float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C;
    const float m = loom_kern_sum(x, C) / (float)C;
    const float r = 1.0f / sqrtf(loom_kern_sqdev(x, m, C) / (float)C + LN_EPS);
    if (out) {
      float *o = out + (int64_t)n * C;
      for (int j = 0; j < C; j++)
        o[j] = fmaf((x[j] - m) * r, weight[j], bias[j]);
    } else {
      float buf[LN_HALF_BLOCK];
      for (int j0 = 0; j0 < C; j0 += LN_HALF_BLOCK) {
        const int w = C - j0 < LN_HALF_BLOCK ? C - j0 : LN_HALF_BLOCK;
        for (int j = 0; j < w; j++)
          buf[j] = fmaf((x[j0 + j] - m) * r, weight[j0 + j], bias[j0 + j]);
        LOOM_ISA(loom_kern_narrow)(dt, outh + (int64_t)n * C + j0, buf, w);
      }
    }
    mean[n] = m;
    rstd[n] = r;
  }
}

void LOOM_ISA(loom_layernorm_forward)(float *out, float *mean, float *rstd,
                                      const float *inp, const float *weight,
                                      const float *bias, int N, int C) {
  ln_forward(out, NULL, LOOM_F32, mean, rstd, inp, weight, bias, N, C);
}

void LOOM_ISA(loom_layernorm_forward_half)(loom_dtype dt, uint16_t *out,
                                           float *mean, float *rstd,
                                           const float *inp,
                                           const float *weight,
                                           const float *bias, int N, int C) {
  ln_forward(NULL, out, dt, mean, rstd, inp, weight, bias, N, C);
}

/* dinp: per row, from dnorm = dout * w:
 *   dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)). */
static void ln_dinp(float *dinp, const float *dout, const float *inp,
                    const float *weight, const float *mean, const float *rstd,
                    int N, int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
    float *di = dinp + (int64_t)n * C;
    const float m = mean[n], r = rstd[n];
    /* mean(dnorm) and mean(dnorm * norm), dnorm = d * w, norm = (x-m) r */
    const float mean_dn = loom_kern_dot(d, weight, C) / (float)C;
    const float mean_dnn = r * loom_kern_dot3c(d, weight, x, m, C) / (float)C;
    for (int j = 0; j < C; j++) {
      const float norm = (x[j] - m) * r;
      const float dn = d[j] * weight[j];
      di[j] = fmaf(r, dn - mean_dn - norm * mean_dnn, di[j]);
    }
  }
}

/* One chunk of rows [n0, n1) of the w columns from c: the chunk's sums from
 * zero, rows in order (in pw and pb, w floats each), added to tw and tb. */
static inline void ln_rows(float *tw, float *tb, float *pw, float *pb,
                           const float *dout, const float *inp,
                           const float *mean, const float *rstd, int n0, int n1,
                           int C, int c, int w) {
  for (int j = 0; j < w; j++)
    pw[j] = pb[j] = 0.0f;
  for (int n = n0; n < n1; n++) {
    const float *x = inp + (int64_t)n * C + c;
    const float *d = dout + (int64_t)n * C + c;
    const float m = mean[n], r = rstd[n];
    for (int j = 0; j < w; j++) {
      pw[j] = fmaf((x[j] - m) * r, d[j], pw[j]);
      pb[j] += d[j];
    }
  }
  for (int j = 0; j < w; j++) {
    tw[j] += pw[j];
    tb[j] += pb[j];
  }
}

/* The same for a strip of at most LN_COLS columns, a full strip's sums in
 * registers: the AVX2 code does ln_rows' operations in its order. */
static inline void ln_strip(float *tw, float *tb, const float *dout,
                            const float *inp, const float *mean,
                            const float *rstd, int n0, int n1, int C, int c,
                            int sw) {
#if defined(__AVX2__) && defined(__FMA__)
  if (sw == LN_COLS) {
    __m256 pw0 = _mm256_setzero_ps(), pw1 = pw0, pb0 = pw0, pb1 = pw0;
    for (int n = n0; n < n1; n++) {
      const float *x = inp + (int64_t)n * C + c;
      const float *d = dout + (int64_t)n * C + c;
      const __m256 m = _mm256_set1_ps(mean[n]), r = _mm256_set1_ps(rstd[n]);
      const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
      const __m256 x0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), m), r);
      const __m256 x1 =
          _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + 8), m), r);
      pw0 = _mm256_fmadd_ps(x0, d0, pw0);
      pw1 = _mm256_fmadd_ps(x1, d1, pw1);
      pb0 = _mm256_add_ps(pb0, d0);
      pb1 = _mm256_add_ps(pb1, d1);
    }
    _mm256_storeu_ps(tw, _mm256_add_ps(_mm256_loadu_ps(tw), pw0));
    _mm256_storeu_ps(tw + 8, _mm256_add_ps(_mm256_loadu_ps(tw + 8), pw1));
    _mm256_storeu_ps(tb, _mm256_add_ps(_mm256_loadu_ps(tb), pb0));
    _mm256_storeu_ps(tb + 8, _mm256_add_ps(_mm256_loadu_ps(tb + 8), pb1));
    return;
  }
#endif
  float pw[LN_COLS], pb[LN_COLS];
  ln_rows(tw, tb, pw, pb, dout, inp, mean, rstd, n0, n1, C, c, sw);
}

/* dweight += sum_n norm * dout, dbias += sum_n dout, per column the sums of
 * LN_ROWS rows from zero in order, then those sums in order: the same bits
 * whatever the thread count or the walk. Threads own blocks of columns (as
 * wide as the thread count allows, at most LN_COLS_MAX), walked a chunk of
 * rows at a time: for rows of at most LN_STRIP_C_MAX columns strip by strip
 * of LN_COLS columns (the strip's sums in registers), for longer rows a
 * whole row segment at a time (the sums in L1). Strips walked down all N
 * rows, as before, took 5x the forward's time at 4096x512 (a 2 KB stride
 * over 16 MB: a TLB miss a row). */
static void ln_dparams(float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *mean, const float *rstd,
                       int N, int C) {
  if (N <= 0 || C <= 0)
    return;
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
  int bw = (C + nt - 1) / nt;
  bw = (bw + LN_COLS - 1) / LN_COLS * LN_COLS;
  bw = bw > LN_COLS_MAX ? LN_COLS_MAX : bw;
  const int blocks = (C + bw - 1) / bw;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * bw;
    const int w = C - c0 < bw ? C - c0 : bw;
    float tw[LN_COLS_MAX], tb[LN_COLS_MAX], pw[LN_COLS_MAX], pb[LN_COLS_MAX];
    for (int j = 0; j < w; j++)
      tw[j] = tb[j] = 0.0f;
    for (int n0 = 0; n0 < N; n0 += LN_ROWS) {
      const int n1 = n0 + LN_ROWS < N ? n0 + LN_ROWS : N;
      if (C <= LN_STRIP_C_MAX) {
        for (int s0 = 0; s0 < w; s0 += LN_COLS)
          ln_strip(tw + s0, tb + s0, dout, inp, mean, rstd, n0, n1, C, c0 + s0,
                   w - s0 < LN_COLS ? w - s0 : LN_COLS);
        continue;
      }
      ln_rows(tw, tb, pw, pb, dout, inp, mean, rstd, n0, n1, C, c0, w);
    }
    for (int j = 0; j < w; j++) {
      if (dweight)
        dweight[c0 + j] += tw[j];
      if (dbias)
        dbias[c0 + j] += tb[j];
    }
  }
}

void LOOM_ISA(loom_layernorm_backward)(float *dinp, float *dweight,
                                       float *dbias, const float *dout,
                                       const float *inp, const float *weight,
                                       const float *mean, const float *rstd,
                                       int N, int C) {
  if (dinp)
    ln_dinp(dinp, dout, inp, weight, mean, rstd, N, C);
  if (dweight || dbias)
    ln_dparams(dweight, dbias, dout, inp, mean, rstd, N, C);
}
