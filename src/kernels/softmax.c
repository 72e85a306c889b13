/* Row-wise softmax and log-softmax (max subtracted) with their backward,
 * and cross-entropy fused with softmax over integer targets. One thread
 * owns a row, so threading never changes a result. */
#include <math.h>
#include <omp.h>

#include "internal.h"
#include "loom/kernels.h"

/* probs(C) = softmax(x); returns log(sum exp(x - max)) and the max. */
static float softmax_row(float *o, const float *x, int C, float *max_out) {
  const float m = loom_kern_max(x, C);
  for (int j = 0; j < C; j++)
    o[j] = loom_kern_expf(x[j] - m);
  const float s = loom_kern_sum(o, C);
  const float inv = 1.0f / s;
  for (int j = 0; j < C; j++)
    o[j] *= inv;
  *max_out = m;
  return logf(s);
}

void LOOM_ISA(loom_softmax_forward)(float *out, const float *inp, int N,
                                    int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    float m;
    (void)softmax_row(out + (int64_t)n * C, inp + (int64_t)n * C, C, &m);
  }
}

void LOOM_ISA(loom_softmax_backward)(float *dinp, const float *out,
                                     const float *dout, int N, int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *o = out + (int64_t)n * C, *d = dout + (int64_t)n * C;
    float *di = dinp + (int64_t)n * C;
    const float s = loom_kern_dot(o, d, C);
    for (int j = 0; j < C; j++)
      di[j] = fmaf(o[j], d[j] - s, di[j]);
  }
}

void LOOM_ISA(loom_log_softmax_forward)(float *out, const float *inp, int N,
                                        int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C;
    float *o = out + (int64_t)n * C;
    const float m = loom_kern_max(x, C);
    for (int j = 0; j < C; j++)
      o[j] = loom_kern_expf(x[j] - m);
    const float ls = logf(loom_kern_sum(o, C));
    for (int j = 0; j < C; j++)
      o[j] = (x[j] - m) - ls;
  }
}

void LOOM_ISA(loom_log_softmax_backward)(float *dinp, const float *out,
                                         const float *dout, int N, int C) {
  const int nt = loom_kern_nthreads((int64_t)N * C, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *o = out + (int64_t)n * C, *d = dout + (int64_t)n * C;
    float *di = dinp + (int64_t)n * C;
    const float s = loom_kern_sum(d, C);
    for (int j = 0; j < C; j++)
      di[j] += d[j] - loom_kern_expf(o[j]) * s;
  }
}

/* loss = log(sum exp(x - m)) - (x[t] - m): no log of a rounded probability,
 * so a confident wrong answer costs its true (large) loss, not log(0). */
void LOOM_ISA(loom_crossentropy_forward)(float *losses, float *probs,
                                         const float *logits,
                                         const int32_t *targets, int N, int V) {
  const int nt = loom_kern_nthreads((int64_t)N * V, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *x = logits + (int64_t)n * V;
    float m;
    const float lse = softmax_row(probs + (int64_t)n * V, x, V, &m);
    const int32_t t = targets[n];
    if (t == -1)
      losses[n] = 0.0f;
    else if (t < 0 || t >= V)
      losses[n] = NAN; /* a bad target must show, not train silently */
    else
      losses[n] = lse - (x[t] - m);
  }
}

void LOOM_ISA(loom_crossentropy_backward)(float *dlogits, const float *probs,
                                          const int32_t *targets,
                                          const float *dloss, int N, int V) {
  const int nt = loom_kern_nthreads((int64_t)N * V, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const int32_t t = targets[n];
    if (t < 0 || t >= V)
      continue;
    const float *p = probs + (int64_t)n * V;
    float *d = dlogits + (int64_t)n * V;
    const float dl = dloss[n];
    for (int j = 0; j < V; j++)
      d[j] = fmaf(p[j], dl, d[j]);
    d[t] -= dl;
  }
}

void LOOM_ISA(loom_row_max)(float *out, const float *x, int N, int V) {
  const int nt = loom_kern_nthreads((int64_t)N * V, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++)
    out[n] = loom_kern_max(x + (int64_t)n * V, V);
}

void LOOM_ISA(loom_exp_rows)(float *probs, float *sums, const float *logits,
                             const float *max, int N, int V) {
  const int nt = loom_kern_nthreads((int64_t)N * V, LOOM_KERN_PAR_MIN);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int n = 0; n < N; n++) {
    const float *x = logits + (int64_t)n * V;
    float *o = probs + (int64_t)n * V;
    const float m = max[n];
    for (int j = 0; j < V; j++)
      o[j] = loom_kern_expf(x[j] - m);
    sums[n] = loom_kern_sum(o, V);
  }
}
