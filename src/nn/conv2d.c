/* 2-D convolution over (N,C,H,W) by the im2col kernels (or oneDNN's, as
 * the kernels choose); in a half model (bf16, f16) by the same kernels on
 * operands rounded to that type (docs/precision.md). */
#include "internal.h"

typedef struct conv2d {
  loom_module base;
  int C, OC, K, stride, pad;
  bool bias;
  loom_conv2d_dims d;
  const void *in; /* (N,C,H,W) f32, or half in a half model; kept */
  float *out;     /* (N,OC,OH,OW) */
  float *col;     /* im2col scratch, loom_conv2d_col_floats(d) */
  /* half model: the operands in f32 (loom_conv2d_half_scratch_floats) */
  float *scratch;
  loom_dtype half; /* LOOM_BF16, LOOM_F16, or LOOM_F32: none */
} conv2d;

static loom_status conv2d_params(loom_module *m, loom_nn_visit *v) {
  conv2d *c = (conv2d *)m;
  int64_t fan_in = (int64_t)c->C * c->K * c->K;
  loom_param_spec w = {.name = "weight",
                       .ndim = 4,
                       .shape = {c->OC, c->C, c->K, c->K},
                       .role = LOOM_ROLE_WEIGHT,
                       .fan_in = fan_in};
  LOOM_TRY(loom_nn_visit_param(v, m, &w));
  if (c->bias) {
    loom_param_spec b = {.name = "bias",
                         .ndim = 1,
                         .shape = {c->OC},
                         .role = LOOM_ROLE_BIAS,
                         .fan_in = fan_in};
    LOOM_TRY(loom_nn_visit_param(v, m, &b));
  }
  return LOOM_OK;
}

static loom_status conv2d_plan(loom_module *m, loom_nn_plan *p,
                               const loom_shape *in, loom_shape *out) {
  conv2d *c = (conv2d *)m;
  char buf[96];
  LOOM_TRY(loom_nn_check_float(m, p, in, 4, 0));
  if (in->ndim != 4 || in->dim[1] != c->C)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects (N,%d,H,W), got %s", c->C,
                             loom_shape_str(in, buf, sizeof buf));
  int64_t H = in->dim[2], W = in->dim[3];
  if (H + 2 * c->pad < c->K || W + 2 * c->pad < c->K)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "input %s is smaller than the %dx%d kernel",
                             loom_shape_str(in, buf, sizeof buf), c->K, c->K);
  int64_t OH = (H + 2 * c->pad - c->K) / c->stride + 1;
  int64_t OW = (W + 2 * c->pad - c->K) / c->stride + 1;
  LOOM_TRY(loom_nn_check_int(m, "input", loom_shape_numel(in)));
  LOOM_TRY(loom_nn_check_int(m, "output", in->dim[0] * c->OC * OH * OW));
  c->d = (loom_conv2d_dims){.N = (int)in->dim[0],
                            .C = c->C,
                            .H = (int)H,
                            .W = (int)W,
                            .OC = c->OC,
                            .KH = c->K,
                            .KW = c->K,
                            .stride = c->stride,
                            .pad = c->pad};
  int64_t dims[4] = {in->dim[0], c->OC, OH, OW};
  *out = loom_shape_make(LOOM_F32, 4, dims);
  c->out = loom_nn_plan_floats(p, loom_shape_numel(out));
  c->col = loom_nn_plan_scratch_floats(
      p, p->touched ? loom_conv2d_col_floats_used(&c->d)
                    : loom_conv2d_col_floats(&c->d));
  c->half = p->half;
  c->scratch = c->half != LOOM_F32
                   ? loom_nn_plan_scratch_floats(
                         p, loom_conv2d_half_scratch_floats(&c->d))
                   : NULL;
  return LOOM_OK;
}

/* The weight as the half convolutions take it (*w, of type *wdt: the half
 * type, or f32 values of it on the conversion path). */
static loom_status conv_weight_half(conv2d *c, const loom_nn_ctx *ctx,
                                    const void **w, loom_dtype *wdt) {
  *w = loom_nn_param_half(ctx, &c->base, 0, wdt);
  if (!*w || ctx->half != c->half)
    return loom_module_error(&c->base, LOOM_ERR_INTERNAL, "no %s weights",
                             loom_dtype_name(c->half));
  return LOOM_OK;
}

static loom_status conv2d_forward(loom_module *m, loom_nn_ctx *ctx,
                                  const void *in, const float **out) {
  conv2d *c = (conv2d *)m;
  c->in = in;
  const float *b = c->bias ? loom_nn_param(ctx, m, 1) : NULL;
  if (c->half != LOOM_F32) {
    const void *w;
    loom_dtype wdt;
    LOOM_TRY(conv_weight_half(c, ctx, &w, &wdt));
    LOOM_TRY(loom_conv2d_forward_half(c->out, c->col, c->in, m->in.dtype,
                                      c->half, w, wdt, b, &c->d, c->scratch));
  } else {
    LOOM_TRY(loom_conv2d_forward(c->out, c->col, c->in,
                                 loom_nn_param(ctx, m, 0), b, &c->d));
  }
  *out = c->out;
  return LOOM_OK;
}

static loom_status conv2d_backward(loom_module *m, loom_nn_ctx *ctx,
                                   const float *dout, float *dinp) {
  conv2d *c = (conv2d *)m;
  float *db = c->bias ? loom_nn_grad(ctx, m, 1) : NULL;
  if (c->half != LOOM_F32) {
    const void *w;
    loom_dtype wdt;
    LOOM_TRY(conv_weight_half(c, ctx, &w, &wdt));
    return loom_conv2d_backward_half(dinp, loom_nn_grad(ctx, m, 0), db, c->col,
                                     dout, c->in, m->in.dtype, c->half, w, wdt,
                                     &c->d, c->scratch);
  }
  return loom_conv2d_backward(dinp, loom_nn_grad(ctx, m, 0), db, c->col, dout,
                              c->in, loom_nn_param(ctx, m, 0), &c->d);
}

static void conv2d_free(loom_module *m) { loom_free(m); }

static const loom_module_ops conv2d_ops = {
    .name = "conv2d",
    .params = conv2d_params,
    .plan = conv2d_plan,
    .forward = conv2d_forward,
    .backward = conv2d_backward,
    .free = conv2d_free,
    .half_in = true,
};

loom_status loom_conv2d_new(loom_module **out, int C, int OC, int K, int stride,
                            int pad, bool bias) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_conv2d_new: NULL out");
  *out = NULL;
  if (C <= 0 || OC <= 0 || K <= 0 || stride <= 0 || pad < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "conv2d: bad sizes (in %d, out %d, kernel %d, stride "
                      "%d, pad %d)",
                      C, OC, K, stride, pad);
  conv2d *c = loom_calloc(1, sizeof *c);
  if (!c)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&c->base, &conv2d_ops);
  c->C = C;
  c->OC = OC;
  c->K = K;
  c->stride = stride;
  c->pad = pad;
  c->bias = bias;
  *out = &c->base;
  return LOOM_OK;
}
