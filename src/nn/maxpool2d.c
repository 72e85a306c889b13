/* Max pooling over (N,C,H,W), no padding; in a half model it hands its
 * output on in half when the module after it takes half (a convolution):
 * rounding keeps the order, so the max of the rounded values is the
 * rounded max. */
#include "internal.h"

typedef struct maxpool2d {
  loom_module base;
  int K, S;
  int N, C, H, W;
  void *out;       /* (N,C,OH,OW) f32, or half when handed on in half */
  int32_t *argmax; /* (N,C,OH,OW) */
  float *tmp;      /* (N,C,OH,OW) scratch: the f32 output before rounding */
} maxpool2d;

static loom_status maxpool2d_params(loom_module *m, loom_nn_visit *v) {
  (void)m;
  (void)v;
  return LOOM_OK;
}

static loom_status maxpool2d_plan(loom_module *m, loom_nn_plan *p,
                                  const loom_shape *in, loom_shape *out) {
  maxpool2d *mp = (maxpool2d *)m;
  char buf[96];
  LOOM_TRY(loom_nn_check_f32(m, in, 4, 0));
  if (in->ndim != 4 || in->dim[2] < mp->K || in->dim[3] < mp->K)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects (N,C,H,W) with H,W >= %d, got %s", mp->K,
                             loom_shape_str(in, buf, sizeof buf));
  LOOM_TRY(loom_nn_check_int(m, "input", loom_shape_numel(in)));
  mp->N = (int)in->dim[0];
  mp->C = (int)in->dim[1];
  mp->H = (int)in->dim[2];
  mp->W = (int)in->dim[3];
  int64_t dims[4] = {mp->N, mp->C, (mp->H - mp->K) / mp->S + 1,
                     (mp->W - mp->K) / mp->S + 1};
  *out = loom_shape_make(LOOM_F32, 4, dims);
  int64_t n = loom_shape_numel(out);
  mp->out = loom_nn_plan_out(p, m, n, out);
  mp->argmax = loom_nn_plan_act(p, (size_t)n * sizeof(int32_t));
  mp->tmp = NULL;
  if (m->out_half) {
    size_t mark = loom_nn_plan_scratch_mark(p);
    mp->tmp = loom_nn_plan_scratch_floats(p, n);
    loom_nn_plan_scratch_release(p, mark);
  }
  return LOOM_OK;
}

/* The f32 output's place: the output itself, or the scratch rounded into
 * it (finish). */
static float *pool_dst(const maxpool2d *mp) {
  return mp->base.out_half ? mp->tmp : (float *)mp->out;
}

static loom_status pool_finish(const maxpool2d *mp) {
  if (!mp->base.out_half)
    return LOOM_OK;
  return loom_cvt_f32_to_half(mp->base.out.dtype, mp->out, mp->tmp,
                              loom_shape_numel(&mp->base.out));
}

static loom_status maxpool2d_forward(loom_module *m, loom_nn_ctx *ctx,
                                     const void *in, const float **out) {
  maxpool2d *mp = (maxpool2d *)m;
  (void)ctx;
  loom_maxpool2d_forward(pool_dst(mp), mp->argmax, in, mp->N, mp->C, mp->H,
                         mp->W, mp->K, mp->S);
  LOOM_TRY(pool_finish(mp));
  *out = mp->out;
  return LOOM_OK;
}

static loom_status maxpool2d_backward(loom_module *m, loom_nn_ctx *ctx,
                                      const float *dout, float *dinp) {
  maxpool2d *mp = (maxpool2d *)m;
  (void)ctx;
  if (dinp)
    loom_maxpool2d_backward(dinp, dout, mp->argmax, mp->N, mp->C, mp->H, mp->W,
                            mp->K, mp->S);
  return LOOM_OK;
}

static loom_status maxpool2d_backward_to(loom_module *m, loom_nn_ctx *ctx,
                                         const float *dout, float *dinp) {
  maxpool2d *mp = (maxpool2d *)m;
  (void)ctx;
  loom_maxpool2d_backward_to(dinp, dout, mp->argmax, mp->N, mp->C, mp->H, mp->W,
                             mp->K, mp->S);
  return LOOM_OK;
}

static void maxpool2d_free(loom_module *m) { loom_free(m); }

static const loom_module_ops maxpool2d_ops = {
    .name = "maxpool2d",
    .params = maxpool2d_params,
    .plan = maxpool2d_plan,
    .forward = maxpool2d_forward,
    .backward = maxpool2d_backward,
    .free = maxpool2d_free,
    .backward_to = maxpool2d_backward_to,
};

bool loom_nn_relu_pool_fusable(const loom_module *relu,
                               const loom_module *pool) {
  if (!loom_nn_is_relu(relu) || !pool || pool->ops != &maxpool2d_ops)
    return false;
  const loom_shape *a = &relu->out, *b = &pool->in;
  return a->ndim == 4 && b->ndim == 4 && a->dtype == LOOM_F32 &&
         memcmp(a->dim, b->dim, 4 * sizeof a->dim[0]) == 0;
}

loom_status loom_nn_relu_pool_forward(loom_module *relu, loom_module *pool,
                                      const float *in, const float **out) {
  maxpool2d *mp = (maxpool2d *)pool;
  loom_nn_relu_set_input(relu, in);
  loom_relu_maxpool2d_forward(pool_dst(mp), mp->argmax, in, mp->N, mp->C, mp->H,
                              mp->W, mp->K, mp->S);
  LOOM_TRY(pool_finish(mp));
  *out = mp->out;
  return LOOM_OK;
}

loom_status loom_nn_relu_pool_backward_to(loom_module *relu, loom_module *pool,
                                          const float *dout, float *dinp) {
  maxpool2d *mp = (maxpool2d *)pool;
  loom_relu_maxpool2d_backward_to(dinp, dout, mp->argmax,
                                  loom_nn_relu_input(relu), mp->N, mp->C, mp->H,
                                  mp->W, mp->K, mp->S);
  return LOOM_OK;
}

loom_status loom_maxpool2d_new(loom_module **out, int K, int S) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_maxpool2d_new: NULL out");
  *out = NULL;
  if (K <= 0 || S <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "maxpool2d: kernel %d and stride %d must be positive", K,
                      S);
  maxpool2d *mp = loom_calloc(1, sizeof *mp);
  if (!mp)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&mp->base, &maxpool2d_ops);
  mp->K = K;
  mp->S = S;
  *out = &mp->base;
  return LOOM_OK;
}
