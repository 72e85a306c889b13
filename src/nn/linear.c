/* Linear layers: out = in @ weight^T + bias; also the weight-tied variant
 * (a GPT's output layer reusing the token embedding). */
#include "internal.h"

typedef struct linear {
  loom_module base;
  int C, OC;
  bool bias, resid_proj;
  const loom_module *owner; /* tied: the module owning the weight */
  int owner_k;
  int N;
  const void *in; /* (N,C) f32, or half in a half model; kept from forward */
  float *out;     /* (N,OC) */
  /* half model: the operands in f32 (loom_linear_half_scratch_floats) */
  float *scratch;
  loom_dtype half; /* LOOM_BF16, LOOM_F16, or LOOM_F32: none */
} linear;

static loom_status linear_params(loom_module *m, loom_nn_visit *v) {
  linear *l = (linear *)m;
  if (l->owner) {
    const loom_param *w;
    LOOM_TRY(loom_nn_visit_view(v, l->owner, l->owner_k, &w));
    if (w->ndim != 2)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "tied weight '%s' is not 2-D", w->name);
    l->OC = (int)w->shape[0];
    l->C = (int)w->shape[1];
    return LOOM_OK;
  }
  loom_param_spec w = {.name = "weight",
                       .ndim = 2,
                       .shape = {l->OC, l->C},
                       .role = LOOM_ROLE_WEIGHT,
                       .fan_in = l->C,
                       .resid_proj = l->resid_proj};
  LOOM_TRY(loom_nn_visit_param(v, m, &w));
  if (l->bias) {
    loom_param_spec b = {.name = "bias",
                         .ndim = 1,
                         .shape = {l->OC},
                         .role = LOOM_ROLE_BIAS,
                         .fan_in = l->C};
    LOOM_TRY(loom_nn_visit_param(v, m, &b));
  }
  return LOOM_OK;
}

static loom_status linear_plan(loom_module *m, loom_nn_plan *p,
                               const loom_shape *in, loom_shape *out) {
  linear *l = (linear *)m;
  if (l->C <= 0)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "tied weight not resolved (not in a model)");
  LOOM_TRY(loom_nn_check_float(m, p, in, 1, l->C));
  int64_t N = loom_nn_rows(in);
  LOOM_TRY(loom_nn_check_int(m, "input", N * l->C));
  LOOM_TRY(loom_nn_check_int(m, "output", N * l->OC));
  l->N = (int)N;
  *out = *in;
  out->dtype = LOOM_F32;
  out->dim[out->ndim - 1] = l->OC;
  l->out = loom_nn_plan_floats(p, N * l->OC);
  l->half = p->half;
  l->scratch = NULL;
  if (l->half != LOOM_F32) {
    /* forward and backward each use it within the call */
    size_t mark = loom_nn_plan_scratch_mark(p);
    l->scratch = loom_nn_plan_scratch_floats(
        p, loom_linear_half_scratch_floats(l->N, l->C, l->OC));
    loom_nn_plan_scratch_release(p, mark);
  }
  return LOOM_OK;
}

static const float *linear_weight(const linear *l, const loom_nn_ctx *ctx) {
  return l->owner ? loom_nn_param(ctx, l->owner, l->owner_k)
                  : loom_nn_param(ctx, &l->base, 0);
}

static const uint16_t *linear_weight_half(const linear *l,
                                          const loom_nn_ctx *ctx) {
  return l->owner ? loom_nn_param_half(ctx, l->owner, l->owner_k)
                  : loom_nn_param_half(ctx, &l->base, 0);
}

static loom_status linear_forward(loom_module *m, loom_nn_ctx *ctx,
                                  const void *in, const float **out) {
  linear *l = (linear *)m;
  l->in = in;
  const float *b = l->bias ? loom_nn_param(ctx, m, 1) : NULL;
  if (l->half != LOOM_F32) {
    if (!ctx->params_half || ctx->half != l->half)
      return loom_module_error(m, LOOM_ERR_INTERNAL, "no %s weights",
                               loom_dtype_name(l->half));
    LOOM_TRY(loom_linear_forward_half(l->out, l->in, m->in.dtype, l->half,
                                      linear_weight_half(l, ctx), b, l->N, l->C,
                                      l->OC, l->scratch));
  } else {
    LOOM_TRY(loom_linear_forward(l->out, l->in, linear_weight(l, ctx), b, l->N,
                                 l->C, l->OC));
  }
  *out = l->out;
  return LOOM_OK;
}

static loom_status linear_backward(loom_module *m, loom_nn_ctx *ctx,
                                   const float *dout, float *dinp) {
  linear *l = (linear *)m;
  float *dw = l->owner ? loom_nn_grad(ctx, l->owner, l->owner_k)
                       : loom_nn_grad(ctx, m, 0);
  float *db = l->bias ? loom_nn_grad(ctx, m, 1) : NULL;
  if (l->half != LOOM_F32)
    return loom_linear_backward_half(dinp, dw, db, dout, l->in, m->in.dtype,
                                     l->half, linear_weight_half(l, ctx), l->N,
                                     l->C, l->OC, l->scratch);
  return loom_linear_backward(dinp, dw, db, dout, l->in, linear_weight(l, ctx),
                              l->N, l->C, l->OC);
}

static void linear_free(loom_module *m) { loom_free(m); }

static const loom_module_ops linear_ops = {
    .name = "linear",
    .params = linear_params,
    .plan = linear_plan,
    .forward = linear_forward,
    .backward = linear_backward,
    .free = linear_free,
    .half_in = true,
};

loom_status loom_linear_new(loom_module **out, int C, int OC, bool bias) {
  *out = NULL;
  if (C <= 0 || OC <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "linear: sizes must be positive (in %d, out %d)", C, OC);
  linear *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&l->base, &linear_ops);
  l->C = C;
  l->OC = OC;
  l->bias = bias;
  *out = &l->base;
  return LOOM_OK;
}

loom_status loom_linear_tied_new(loom_module **out, const loom_module *owner,
                                 int k) {
  *out = NULL;
  if (!owner || k < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "linear: tied weight needs an owner module");
  linear *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&l->base, &linear_ops);
  l->owner = owner;
  l->owner_k = k;
  *out = &l->base;
  return LOOM_OK;
}

void loom_linear_set_resid_proj(loom_module *m, bool on) {
  if (m && m->ops == &linear_ops)
    ((linear *)m)->resid_proj = on;
}
