/* Residual: out = in + f(in). */
#include "internal.h"

typedef struct residual {
  loom_module base;
  loom_module *f;
  int64_t n;
  float *out; /* (n) */
} residual;

static loom_status residual_params(loom_module *m, loom_nn_visit *v) {
  return loom_nn_visit_child(v, "", ((residual *)m)->f);
}

static loom_status residual_plan(loom_module *m, loom_nn_plan *p,
                                 const loom_shape *in, loom_shape *out) {
  residual *r = (residual *)m;
  char a[96], b[96];
  LOOM_TRY(loom_nn_check_f32(m, in, 1, 0));
  size_t mark = loom_nn_plan_scratch_mark(p);
  loom_shape fo;
  LOOM_TRY(loom_module_plan(r->f, p, in, &fo));
  loom_nn_plan_scratch_release(p, mark);
  if (!loom_shape_equal(&fo, in))
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "the branch maps %s to %s; a residual needs the "
                             "same shape",
                             loom_shape_str(in, a, sizeof a),
                             loom_shape_str(&fo, b, sizeof b));
  r->n = loom_shape_numel(in);
  *out = *in;
  r->out = loom_nn_plan_floats(p, r->n);
  return LOOM_OK;
}

static loom_status residual_forward(loom_module *m, loom_nn_ctx *ctx,
                                    const void *in, const float **out) {
  residual *r = (residual *)m;
  const float *y;
  LOOM_TRY(loom_module_forward(r->f, ctx, in, &y));
  loom_add_forward(r->out, in, y, r->n);
  *out = r->out;
  return LOOM_OK;
}

static loom_status residual_backward(loom_module *m, loom_nn_ctx *ctx,
                                     const float *dout, float *dinp) {
  residual *r = (residual *)m;
  LOOM_TRY(loom_module_backward(r->f, ctx, dout, dinp));
  if (dinp)
    loom_accumulate(dinp, dout, r->n);
  return LOOM_OK;
}

static void residual_free(loom_module *m) {
  loom_module_free(((residual *)m)->f);
  loom_free(m);
}

static const loom_module_ops residual_ops = {
    .name = "residual",
    .params = residual_params,
    .plan = residual_plan,
    .forward = residual_forward,
    .backward = residual_backward,
    .free = residual_free,
};

loom_status loom_residual_new(loom_module **out, loom_module *f) {
  if (!out) {
    if (f && !f->attached)
      loom_module_free(f); /* taken over, freed on failure too */
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_residual_new: NULL out");
  }
  *out = NULL;
  if (!f)
    return loom_error(LOOM_ERR_INVALID_ARG, "residual: no branch module");
  if (f->attached)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "residual: the branch (%s) already has a parent",
                      f->ops->name);
  residual *r = loom_calloc(1, sizeof *r);
  if (!r) {
    loom_module_free(f);
    return LOOM_ERR_NOMEM;
  }
  loom_module_init_base(&r->base, &residual_ops);
  r->f = f;
  f->attached = true;
  f->parent = *out = &r->base;
  return LOOM_OK;
}
