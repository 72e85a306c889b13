/* ReLU, elementwise over any f32 shape. */
#include "internal.h"

typedef struct relu {
  loom_module base;
  int64_t n;
  const float *in; /* (n), kept from forward */
  void *out;       /* (n) f32, or half when handed on in half */
} relu;

static loom_status relu_params(loom_module *m, loom_nn_visit *v) {
  (void)m;
  (void)v;
  return LOOM_OK;
}

static loom_status relu_plan(loom_module *m, loom_nn_plan *p,
                             const loom_shape *in, loom_shape *out) {
  relu *r = (relu *)m;
  LOOM_TRY(loom_nn_check_f32(m, in, 1, 0));
  r->n = loom_shape_numel(in);
  *out = *in;
  /* Fused with the pooling after it (sequential.c): never written. */
  r->out = p->no_out ? NULL : loom_nn_plan_out(p, m, r->n, out);
  return LOOM_OK;
}

static loom_status relu_forward(loom_module *m, loom_nn_ctx *ctx,
                                const void *in, const float **out) {
  relu *r = (relu *)m;
  (void)ctx;
  r->in = in;
  if (m->out_half) {
    loom_relu_forward_half(m->out.dtype, r->out, r->in, r->n);
  } else {
    loom_relu_forward(r->out, r->in, r->n);
  }
  *out = r->out;
  return LOOM_OK;
}

static loom_status relu_backward(loom_module *m, loom_nn_ctx *ctx,
                                 const float *dout, float *dinp) {
  relu *r = (relu *)m;
  (void)ctx;
  if (dinp)
    loom_relu_backward(dinp, r->in, dout, r->n);
  return LOOM_OK;
}

static loom_status relu_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  relu *r = (relu *)m;
  (void)ctx;
  loom_relu_backward_to(dinp, r->in, dout, r->n);
  return LOOM_OK;
}

static void relu_free(loom_module *m) { loom_free(m); }

static const loom_module_ops relu_ops = {
    .name = "relu",
    .params = relu_params,
    .plan = relu_plan,
    .forward = relu_forward,
    .backward = relu_backward,
    .free = relu_free,
    .backward_to = relu_backward_to,
};

bool loom_nn_is_relu(const loom_module *m) { return m && m->ops == &relu_ops; }

void loom_nn_relu_set_input(loom_module *m, const float *in) {
  ((relu *)m)->in = in;
}

const float *loom_nn_relu_input(const loom_module *m) {
  return ((const relu *)m)->in;
}

loom_status loom_relu_new(loom_module **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_relu_new: NULL out");
  *out = NULL;
  relu *r = loom_calloc(1, sizeof *r);
  if (!r)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&r->base, &relu_ops);
  *out = &r->base;
  return LOOM_OK;
}
