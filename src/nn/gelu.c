/* GELU (tanh form), elementwise over any f32 shape. */
#include "internal.h"

typedef struct gelu {
  loom_module base;
  int64_t n;
  const float *in; /* (n), kept from forward */
  float *out;      /* (n) */
} gelu;

static loom_status gelu_params(loom_module *m, loom_nn_visit *v) {
  (void)m;
  (void)v;
  return LOOM_OK;
}

static loom_status gelu_plan(loom_module *m, loom_nn_plan *p,
                             const loom_shape *in, loom_shape *out) {
  gelu *r = (gelu *)m;
  LOOM_TRY(loom_nn_check_f32(m, in, 1, 0));
  r->n = loom_shape_numel(in);
  *out = *in;
  r->out = loom_nn_plan_floats(p, r->n);
  return LOOM_OK;
}

static loom_status gelu_forward(loom_module *m, loom_nn_ctx *ctx,
                                const void *in, const float **out) {
  gelu *r = (gelu *)m;
  (void)ctx;
  r->in = in;
  loom_gelu_forward(r->out, r->in, r->n);
  *out = r->out;
  return LOOM_OK;
}

static loom_status gelu_backward(loom_module *m, loom_nn_ctx *ctx,
                                 const float *dout, float *dinp) {
  gelu *r = (gelu *)m;
  (void)ctx;
  if (dinp)
    loom_gelu_backward(dinp, r->in, dout, r->n);
  return LOOM_OK;
}

static loom_status gelu_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  gelu *r = (gelu *)m;
  (void)ctx;
  loom_gelu_backward_to(dinp, r->in, dout, r->n);
  return LOOM_OK;
}

static void gelu_free(loom_module *m) { loom_free(m); }

static const loom_module_ops gelu_ops = {
    .name = "gelu",
    .params = gelu_params,
    .plan = gelu_plan,
    .forward = gelu_forward,
    .backward = gelu_backward,
    .free = gelu_free,
    .backward_to = gelu_backward_to,
};

loom_status loom_gelu_new(loom_module **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_gelu_new: NULL out");
  *out = NULL;
  gelu *r = loom_calloc(1, sizeof *r);
  if (!r)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&r->base, &gelu_ops);
  *out = &r->base;
  return LOOM_OK;
}
