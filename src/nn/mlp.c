/* MLP of a transformer block: linear, GELU, linear, optional dropout. */
#include "internal.h"

typedef struct mlp {
  loom_module base;
  int C, H;
  loom_module *fc, *proj, *drop; /* drop may be NULL */
  int64_t N;
  int64_t NO;      /* the output's rows */
  int sp;          /* sequence parallelism: the group's size, else 0 */
  const float *h;  /* (N,H) fc output */
  void *g;         /* (N,H) GELU output: f32, or half in a half model */
  loom_dtype half; /* LOOM_BF16, LOOM_F16, or LOOM_F32: none */
  float *dg;       /* (N,H) scratch */
  float *dh;       /* (N,H) scratch; NULL when fc runs the GELU's backward */
  float *dd;       /* (N,C) scratch, with dropout */
} mlp;

static loom_status mlp_params(loom_module *m, loom_nn_visit *v) {
  mlp *p = (mlp *)m;
  LOOM_TRY(loom_nn_visit_child(v, "fc", p->fc));
  LOOM_TRY(loom_nn_visit_child(v, "proj", p->proj));
  if (p->drop)
    LOOM_TRY(loom_nn_visit_child(v, "drop", p->drop));
  return LOOM_OK;
}

static loom_status mlp_plan(loom_module *m, loom_nn_plan *pl,
                            const loom_shape *in, loom_shape *out) {
  mlp *p = (mlp *)m;
  LOOM_TRY(loom_nn_check_float(m, pl, in, 1, p->C));
  /* N: the hidden layer's rows (with sequence parallelism the whole
   * micro-batch's, fc gathering them); the output has the input's rows */
  p->N = loom_nn_rows(in) * (p->sp > 1 ? p->sp : 1);
  int64_t NH = p->N * p->H;
  size_t mark = loom_nn_plan_scratch_mark(pl);
  p->half = pl->half;
  p->dg = loom_nn_plan_scratch_floats(pl, NH);
  p->dh = loom_linear_gelu_fused(p->fc, p->half)
              ? NULL
              : loom_nn_plan_scratch_floats(pl, NH);
  p->dd =
      p->drop ? loom_nn_plan_scratch_floats(pl, loom_nn_rows(in) * p->C) : NULL;
  loom_shape s;
  size_t kid = loom_nn_plan_scratch_mark(pl);
  LOOM_TRY(loom_module_plan(p->fc, pl, in, &s));
  loom_nn_plan_scratch_release(pl, kid);
  /* proj, a linear layer, takes the GELU's output in half */
  s.dtype = p->half;
  p->g = loom_nn_plan_act(pl, (size_t)NH * loom_dtype_size(s.dtype));
  LOOM_TRY(loom_module_plan(p->proj, pl, &s, out));
  loom_nn_plan_scratch_release(pl, kid);
  if (p->drop)
    LOOM_TRY(loom_module_plan(p->drop, pl, out, out));
  p->NO = loom_nn_rows(out);
  loom_nn_plan_scratch_release(pl, mark);
  return LOOM_OK;
}

static loom_status mlp_forward(loom_module *m, loom_nn_ctx *ctx, const void *in,
                               const float **out) {
  mlp *p = (mlp *)m;
  LOOM_TRY(loom_module_forward(p->fc, ctx, in, &p->h));
  if (p->half != LOOM_F32) {
    /* the GELU rounded to half as it is computed */
    loom_gelu_forward_half(p->half, p->g, p->h, p->N * p->H);
  } else {
    loom_gelu_forward(p->g, p->h, p->N * p->H);
  }
  LOOM_TRY(loom_module_forward(p->proj, ctx, p->g, out));
  if (p->drop)
    LOOM_TRY(loom_module_forward(p->drop, ctx, *out, out));
  return LOOM_OK;
}

static loom_status mlp_backward(loom_module *m, loom_nn_ctx *ctx,
                                const float *dout, float *dinp) {
  mlp *p = (mlp *)m;
  int64_t NH = p->N * p->H;
  if (p->drop) {
    memset(p->dd, 0, (size_t)(p->NO * p->C) * sizeof(float));
    LOOM_TRY(loom_module_backward(p->drop, ctx, dout, p->dd));
    dout = p->dd;
  }
  memset(p->dg, 0, (size_t)NH * sizeof(float));
  LOOM_TRY(loom_module_backward(p->proj, ctx, dout, p->dg));
  /* in a half model fc runs the GELU's backward itself, fused */
  if (loom_linear_gelu_fused(p->fc, p->half))
    return loom_module_backward(p->fc, ctx, p->dg, dinp);
  loom_gelu_backward_to(p->dh, p->h, p->dg, NH);
  return loom_module_backward(p->fc, ctx, p->dh, dinp);
}

static void mlp_free(loom_module *m) {
  mlp *p = (mlp *)m;
  loom_module_free(p->fc);
  loom_module_free(p->proj);
  loom_module_free(p->drop);
  loom_free(p);
}

static const loom_module_ops mlp_ops = {
    .name = "mlp",
    .params = mlp_params,
    .plan = mlp_plan,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .free = mlp_free,
    .half_in = true,
};

loom_status loom_mlp_new(loom_module **out, int C, int hidden, bool bias,
                         float dropout) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_mlp_new: NULL out");
  return loom_mlp_tp_new(out, C, hidden, bias, dropout, NULL, false);
}

loom_status loom_mlp_tp_new(loom_module **out, int C, int hidden, bool bias,
                            float dropout, const loom_tp *tp, int sp) {
  *out = NULL;
  int T = tp && tp->size > 1 ? tp->size : 1;
  if (hidden % T != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "mlp: %d hidden units do not split over %d "
                      "tensor-parallel ranks",
                      hidden, T);
  hidden /= T; /* this rank's units */
  if (C <= 0 || hidden <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "mlp: bad sizes (%d, %d)", C,
                      hidden);
  if (!(dropout >= 0.0f && dropout < 1.0f))
    return loom_error(LOOM_ERR_INVALID_ARG, "mlp: dropout %g outside [0, 1)",
                      (double)dropout);
  mlp *p = loom_calloc(1, sizeof *p);
  if (!p)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&p->base, &mlp_ops);
  p->C = C;
  p->H = hidden;
  p->sp = sp && T > 1 ? T : 0;
  loom_status st;
  /* column-parallel in, row-parallel out: one reduction each way */
  LOOM_TRY_GOTO(st, loom_linear_col_new(&p->fc, C, hidden, bias, 1, tp, sp),
                fail);
  LOOM_TRY_GOTO(st, loom_linear_row_new(&p->proj, hidden, C, bias, tp, sp),
                fail);
  loom_linear_set_resid_proj(p->proj, true);
  loom_linear_set_gelu_after(p->fc, true);
  p->fc->attached = p->proj->attached = true;
  if (dropout > 0.0f) {
    LOOM_TRY_GOTO(st, loom_dropout_new(&p->drop, dropout), fail);
    p->drop->attached = true;
    if (sp)
      loom_dropout_set_sp(p->drop, tp);
  }
  *out = &p->base;
  return LOOM_OK;
fail:
  mlp_free(&p->base);
  return st;
}
