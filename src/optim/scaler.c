/* The dynamic loss scaler for f16 training (PyTorch GradScaler semantics). */
#include "loom/optim.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "internal.h"

loom_scaler loom_scaler_default(void) {
  loom_scaler s;
  memset(&s, 0, sizeof s);
  s.scale = 65536.0f;
  s.growth_factor = 2.0f;
  s.backoff_factor = 0.5f;
  s.growth_interval = 2000;
  s.good_steps = 0;
  return s;
}

loom_status loom_scaler_check(const loom_scaler *s) {
  if (!s)
    return loom_error(LOOM_ERR_INVALID_ARG, "scaler: NULL");
  if (!(s->scale >= FLT_MIN) || isinf(s->scale))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "scaler: scale must be finite and at least %g, the "
                      "smallest normal f32, whose reciprocal the unscaling "
                      "takes (got %g)",
                      (double)FLT_MIN, (double)s->scale);
  if (!(s->growth_factor > 1.0f) || isinf(s->growth_factor))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "scaler: growth_factor must be finite and > 1 (got %g)",
                      (double)s->growth_factor);
  if (!(s->backoff_factor > 0.0f && s->backoff_factor < 1.0f))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "scaler: backoff_factor must be in (0, 1) (got %g)",
                      (double)s->backoff_factor);
  if (s->growth_interval < 1)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "scaler: growth_interval must be >= 1 (got %lld)",
                      (long long)s->growth_interval);
  if (s->good_steps < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "scaler: good_steps must be >= 0 (got %lld)",
                      (long long)s->good_steps);
  return LOOM_OK;
}

bool loom_scaler_unscale(const loom_scaler *s, float *g, int64_t n) {
  if (!g || n <= 0)
    return false;
  float inv = (float)(1.0 / (double)s->scale);
  int bad = 0;
  int nt = loom_optim_threads_for(n);
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : bad)
  {
    int64_t lo, hi;
    loom_optim_part(0, n, omp_get_thread_num(), omp_get_num_threads(), &lo,
                    &hi);
    float *restrict x = g;
    int b = 0;
#pragma omp simd reduction(| : b)
    for (int64_t i = lo; i < hi; i++) {
      float y = x[i] * inv;
      uint32_t u;
      memcpy(&u, &y, sizeof u);
      b |= (u & 0x7f800000u) == 0x7f800000u;
      x[i] = y;
    }
    bad |= b;
  }
  return bad != 0;
}

loom_status loom_scaler_update(loom_scaler *s, bool found_inf) {
  /* a scaler the check refuses (a NaN scale, an interval of 0) is not
   * stepped on: its error, the state untouched */
  LOOM_TRY(loom_scaler_check(s));
  if (found_inf) {
    const float next = s->scale * s->backoff_factor;
    if (!(next >= FLT_MIN)) /* 1/next would overflow: no step could pass */
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "scaler: the scale %g cannot back off further (x%g "
                        "is below %g, the smallest normal f32): the "
                        "gradients hold an inf or NaN at any scale",
                        (double)s->scale, (double)s->backoff_factor,
                        (double)FLT_MIN);
    s->scale = next;
    s->good_steps = 0;
    return LOOM_OK;
  }
  if (++s->good_steps >= s->growth_interval) {
    float grown = s->scale * s->growth_factor;
    if (isfinite(grown))
      s->scale = grown;
    s->good_steps = 0;
  }
  return LOOM_OK;
}
