/* Activation checkpointing: a segment (one or more transformer blocks) that
 * keeps only its output from forward to backward. Its children's
 * activations live in the plan's recompute region, which every segment
 * reuses; backward runs the segment's forward again from its input (kept
 * by the module before it, as the protocol says) and then its backward.
 * Forward is deterministic and dropout's masks are keyed by (seed, module,
 * step, sample), so the recomputation and therefore the gradients are the
 * bits of training without it. */
#include "internal.h"

typedef struct segment {
  loom_module base;
  loom_module *f;
  int64_t n;      /* elements of the output */
  float *out;     /* (n): the only activation kept */
  const void *in; /* this forward's input */
} segment;

static loom_status segment_params(loom_module *m, loom_nn_visit *v) {
  return loom_nn_visit_child(v, "", ((segment *)m)->f);
}

static loom_status segment_plan(loom_module *m, loom_nn_plan *p,
                                const loom_shape *in, loom_shape *out) {
  segment *c = (segment *)m;
  if (p->recompute)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "a checkpointed segment inside another");
  p->recompute = true;
  p->rc_used = 0;
  size_t mark = loom_nn_plan_scratch_mark(p);
  loom_shape fo;
  loom_status s = loom_module_plan(c->f, p, in, &fo);
  loom_nn_plan_scratch_release(p, mark);
  p->recompute = false;
  LOOM_TRY(s);
  if (fo.dtype != LOOM_F32)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "a checkpointed segment must output f32");
  c->n = loom_shape_numel(&fo);
  *out = fo;
  c->out = loom_nn_plan_floats(p, c->n);
  return LOOM_OK;
}

static loom_status segment_forward(loom_module *m, loom_nn_ctx *ctx,
                                   const void *in, const float **out) {
  segment *c = (segment *)m;
  const float *y;
  LOOM_TRY(loom_module_forward(c->f, ctx, in, &y));
  memcpy(c->out, y, (size_t)c->n * sizeof(float));
  c->in = in;
  *out = c->out;
  return LOOM_OK;
}

/* The forward again, into the recompute region, for backward. */
static loom_status recompute(segment *c, loom_nn_ctx *ctx) {
  const float *y;
  return loom_module_forward(c->f, ctx, c->in, &y);
}

static loom_status segment_backward(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  segment *c = (segment *)m;
  LOOM_TRY(recompute(c, ctx));
  return loom_module_backward(c->f, ctx, dout, dinp);
}

static loom_status segment_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                       const float *dout, float *dinp) {
  segment *c = (segment *)m;
  LOOM_TRY(recompute(c, ctx));
  return loom_module_backward_to(c->f, ctx, dout, dinp);
}

static void segment_free(loom_module *m) {
  loom_module_free(((segment *)m)->f);
  loom_free(m);
}

static const loom_module_ops segment_ops = {
    .name = "checkpoint",
    .params = segment_params,
    .plan = segment_plan,
    .forward = segment_forward,
    .backward = segment_backward,
    .backward_to = segment_backward_to,
    .free = segment_free,
};

loom_status loom_checkpoint_new(loom_module **out, loom_module *f) {
  if (!out) {
    if (f && !f->attached)
      loom_module_free(f); /* taken over, freed on failure too */
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_checkpoint_new: NULL out");
  }
  *out = NULL;
  if (!f)
    return loom_error(LOOM_ERR_INVALID_ARG, "checkpoint: no module to wrap");
  if (f->attached) {
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "checkpoint: module %s already has a parent",
                      f->ops->name);
  }
  segment *c = loom_calloc(1, sizeof *c);
  if (!c) {
    loom_module_free(f);
    return LOOM_ERR_NOMEM;
  }
  loom_module_init_base(&c->base, &segment_ops);
  c->f = f;
  f->attached = true;
  f->parent = *out = &c->base;
  return LOOM_OK;
}
