/* 2-D max pooling (window K, stride S, no padding) and its backward. One
 * thread owns a (n, c) plane, so overlapping windows (S < K) still add
 * into the input gradient in a fixed order. */
#include <omp.h>

#include "kernels/internal.h"
#include "loom/kernels.h"

void loom_maxpool2d_forward(float *out, int32_t *argmax, const float *inp,
                            int N, int C, int H, int W, int K, int S) {
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
        for (int ow = 0; ow < OW; ow++) {
          const int i = 2 * ow;
          float m = r0[i];
          int best = 2 * oh * W + i;
          best = r0[i + 1] > m ? best + 1 : best;
          m = r0[i + 1] > m ? r0[i + 1] : m;
          best = r1[i] > m ? (2 * oh + 1) * W + i : best;
          m = r1[i] > m ? r1[i] : m;
          best = r1[i + 1] > m ? (2 * oh + 1) * W + i + 1 : best;
          m = r1[i + 1] > m ? r1[i + 1] : m;
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
        float m = x[best];
        for (int kh = 0; kh < K; kh++) {
          const float *row = x + (int64_t)(h0 + kh) * W + w0;
          for (int kw = 0; kw < K; kw++) {
            /* strict: the first maximum wins ties; selects, not branches
             * (a maximum's position is a coin toss for the predictor) */
            const float v = row[kw];
            best = v > m ? (h0 + kh) * W + w0 + kw : best;
            m = v > m ? v : m;
          }
        }
        o[oh * OW + ow] = m;
        am[oh * OW + ow] = best;
      }
  }
}

void loom_maxpool2d_backward(float *dinp, const float *dout,
                             const int32_t *argmax, int N, int C, int H, int W,
                             int K, int S) {
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
