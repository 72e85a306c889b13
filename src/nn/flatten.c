/* Flatten (N, d1, d2, ...) to (N, d1*d2*...): a view, no copy. */
#include "internal.h"

typedef struct flatten {
  loom_module base;
  int64_t n;
} flatten;

static loom_status flatten_params(loom_module *m, loom_nn_visit *v) {
  (void)m;
  (void)v;
  return LOOM_OK;
}

static loom_status flatten_plan(loom_module *m, loom_nn_plan *p,
                                const loom_shape *in, loom_shape *out) {
  flatten *f = (flatten *)m;
  (void)p;
  LOOM_TRY(loom_nn_check_f32(m, in, 1, 0));
  f->n = loom_shape_numel(in);
  int64_t dims[2] = {in->dim[0], f->n / in->dim[0]};
  *out = loom_shape_make(LOOM_F32, 2, dims);
  return LOOM_OK;
}

static loom_status flatten_forward(loom_module *m, loom_nn_ctx *ctx,
                                   const void *in, const float **out) {
  (void)m;
  (void)ctx;
  *out = in;
  return LOOM_OK;
}

static loom_status flatten_backward(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  (void)ctx;
  if (dinp)
    loom_accumulate(dinp, dout, ((flatten *)m)->n);
  return LOOM_OK;
}

static void flatten_free(loom_module *m) { loom_free(m); }

static const loom_module_ops flatten_ops = {
    .name = "flatten",
    .params = flatten_params,
    .plan = flatten_plan,
    .forward = flatten_forward,
    .backward = flatten_backward,
    .free = flatten_free,
};

loom_status loom_flatten_new(loom_module **out) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_flatten_new: NULL out");
  *out = NULL;
  flatten *f = loom_calloc(1, sizeof *f);
  if (!f)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&f->base, &flatten_ops);
  *out = &f->base;
  return LOOM_OK;
}
