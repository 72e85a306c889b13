/* LayerNorm over the last dimension (eps 1e-5), with or without bias. */
#include "internal.h"

typedef struct layernorm {
  loom_module base;
  int C;
  bool bias;
  int N;
  const float *in; /* (N,C), kept from forward */
  void *out;       /* (N,C) f32, or half when handed on in half */
  float *mean;     /* (N) */
  float *rstd;     /* (N) */
  float *zeros;    /* (C) stands for the bias when there is none */
  float *dzeros;   /* (C) scratch: the kernel's bias gradient, dropped */
  float *dsink;    /* (N,C) scratch: input gradient nobody asked for */
} layernorm;

static loom_status layernorm_params(loom_module *m, loom_nn_visit *v) {
  layernorm *l = (layernorm *)m;
  loom_param_spec w = {.name = "weight",
                       .ndim = 1,
                       .shape = {l->C},
                       .role = LOOM_ROLE_NORM_WEIGHT};
  LOOM_TRY(loom_nn_visit_param(v, m, &w));
  if (l->bias) {
    loom_param_spec b = {.name = "bias",
                         .ndim = 1,
                         .shape = {l->C},
                         .role = LOOM_ROLE_NORM_BIAS};
    LOOM_TRY(loom_nn_visit_param(v, m, &b));
  }
  return LOOM_OK;
}

static loom_status layernorm_plan(loom_module *m, loom_nn_plan *p,
                                  const loom_shape *in, loom_shape *out) {
  layernorm *l = (layernorm *)m;
  LOOM_TRY(loom_nn_check_f32(m, in, 1, l->C));
  int64_t N = loom_nn_rows(in);
  LOOM_TRY(loom_nn_check_int(m, "input", N * l->C));
  l->N = (int)N;
  *out = *in;
  l->out = loom_nn_plan_out(p, m, N * l->C, out);
  l->mean = loom_nn_plan_floats(p, N);
  l->rstd = loom_nn_plan_floats(p, N);
  l->dsink = loom_nn_plan_scratch_floats(p, N * l->C);
  if (!l->bias) {
    l->zeros = loom_nn_plan_floats(p, l->C);
    l->dzeros = loom_nn_plan_scratch_floats(p, l->C);
    if (l->zeros)
      memset(l->zeros, 0, (size_t)l->C * sizeof(float));
  }
  return LOOM_OK;
}

static loom_status layernorm_forward(loom_module *m, loom_nn_ctx *ctx,
                                     const void *in, const float **out) {
  layernorm *l = (layernorm *)m;
  l->in = in;
  const float *b = l->bias ? loom_nn_param(ctx, m, 1) : l->zeros;
  /* half: rounded as each row is computed */
  if (m->out_half)
    loom_layernorm_forward_half(m->out.dtype, l->out, l->mean, l->rstd, l->in,
                                loom_nn_param(ctx, m, 0), b, l->N, l->C);
  else
    loom_layernorm_forward(l->out, l->mean, l->rstd, l->in,
                           loom_nn_param(ctx, m, 0), b, l->N, l->C);
  *out = l->out;
  return LOOM_OK;
}

static loom_status layernorm_backward(loom_module *m, loom_nn_ctx *ctx,
                                      const float *dout, float *dinp) {
  layernorm *l = (layernorm *)m;
  float *db = l->bias ? loom_nn_grad(ctx, m, 1) : l->dzeros;
  if (!l->bias)
    memset(l->dzeros, 0, (size_t)l->C * sizeof(float));
  if (!dinp)
    memset(l->dsink, 0, (size_t)l->N * l->C * sizeof(float));
  /* The kernel always computes the input gradient; park it in scratch when
   * nobody needs it (a model whose first module is a LayerNorm). */
  loom_layernorm_backward(dinp ? dinp : l->dsink, loom_nn_grad(ctx, m, 0), db,
                          dout, l->in, loom_nn_param(ctx, m, 0), l->mean,
                          l->rstd, l->N, l->C);
  return LOOM_OK;
}

static void layernorm_free(loom_module *m) { loom_free(m); }

static const loom_module_ops layernorm_ops = {
    .name = "layernorm",
    .params = layernorm_params,
    .plan = layernorm_plan,
    .forward = layernorm_forward,
    .backward = layernorm_backward,
    .free = layernorm_free,
};

loom_status loom_layernorm_new(loom_module **out, int C, bool bias) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_layernorm_new: NULL out");
  *out = NULL;
  if (C <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "layernorm: size %d", C);
  layernorm *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&l->base, &layernorm_ops);
  l->C = C;
  l->bias = bias;
  *out = &l->base;
  return LOOM_OK;
}
