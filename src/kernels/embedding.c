/* Embedding lookup and its scatter-add backward. The backward gives each
 * thread a block of columns and walks the ids in order, so rows that share
 * an id are summed in the same order whatever the thread count. */
#include <omp.h>
#include <string.h>

#include "internal.h"
#include "loom/kernels.h"

#define EMB_COLS 16

void LOOM_ISA(loom_embedding_forward)(float *out, const int32_t *ids,
                                      const float *table, int N, int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++)
    memcpy(out + (int64_t)n * C, table + (int64_t)ids[n] * C,
           (size_t)C * sizeof(float));
}

void LOOM_ISA(loom_embedding_backward)(float *dtable, const float *dout,
                                       const int32_t *ids, int N, int C) {
  const int blocks = (C + EMB_COLS - 1) / EMB_COLS;
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * EMB_COLS;
    const int w = C - c0 < EMB_COLS ? C - c0 : EMB_COLS;
    for (int n = 0; n < N; n++) {
      float *t = dtable + (int64_t)ids[n] * C + c0;
      const float *d = dout + (int64_t)n * C + c0;
      for (int j = 0; j < w; j++)
        t[j] += d[j];
    }
  }
}
