/* optim: the functions built once per instruction set. update.c and clip.c
 * are compiled once for each instruction set of LOOM_ISA_LIST
 * (CMakeLists.txt), with LOOM_ISA_SUFFIX naming the copy; dispatch.c
 * defines each name() to call the copy loom_cpu_isa() chose. A function
 * missing here fails the link, never silently. Included by internal.h. */
#ifndef LOOM_OPTIM_ISA_H
#define LOOM_OPTIM_ISA_H

#include "loom/optim.h"

/* R(ret, name, (params), (args)), V(name, (params), (args)): the
 * clipping API of loom/optim.h and the updates optim.c calls. */
/* clang-format off */
#define LOOM_OPTIM_ISA_FNS(R, V) \
  R(double, loom_grad_sumsq, (const float *g, int64_t n), (g, n)) \
  V(loom_grad_scale, (float *g, int64_t n, float s), (g, n, s)) \
  R(bool, loom_grad_has_nonfinite, (const float *g, int64_t n), (g, n)) \
  R(loom_status, loom_grad_clip_sumsq, (float *g, int64_t n, double sumsq, float max_norm, double *norm), (g, n, sumsq, max_norm, norm)) \
  R(loom_status, loom_grad_clip, (float *g, int64_t n, float max_norm, double *norm), (g, n, max_norm, norm)) \
  V(loom_optim_sgd_plain, (float *restrict p, const float *restrict g, int64_t n, float lr, float wd), (p, g, n, lr, wd)) \
  V(loom_optim_sgd_momentum, (float *restrict p, const float *restrict g, float *restrict buf, int64_t n, float lr, float wd, float mu, bool nesterov), (p, g, buf, n, lr, wd, mu, nesterov)) \
  V(loom_optim_adamw, (float *restrict p, const float *restrict g, float *restrict m, float *restrict v, int64_t n, const step_consts *k, bool decay), (p, g, m, v, n, k, decay))
/* clang-format on */

LOOM_OPTIM_ISA_FNS(LOOM_ISA_DECL_R, LOOM_ISA_DECL_V) /* the copies */

/* The updates (in the order of PyTorch's single-tensor optimizers; see
 * update.c), each calling the copy loom_cpu_isa() chose. */
void loom_optim_sgd_plain(float *restrict p, const float *restrict g, int64_t n,
                          float lr, float wd);
void loom_optim_sgd_momentum(float *restrict p, const float *restrict g,
                             float *restrict buf, int64_t n, float lr, float wd,
                             float mu, bool nesterov);
void loom_optim_adamw(float *restrict p, const float *restrict g,
                      float *restrict m, float *restrict v, int64_t n,
                      const step_consts *k, bool decay);

#endif /* LOOM_OPTIM_ISA_H */
