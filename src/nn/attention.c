/* Causal multi-head self-attention: qkv projection, the attention kernel,
 * output projection. */
#include "internal.h"

typedef struct attention {
  loom_module base;
  int C, NH;
  /* The heads' width: C, or with tensor parallelism this rank's C / T
   * (NH / T heads of the same size; NH is then this rank's heads). */
  int CL;
  /* Sequence parallelism: the input and output are this rank's T / size
   * positions' worth of rows (qkv gathers, proj scatters). */
  int sp;
  loom_module *qkv, *proj; /* children: C -> 3CL, CL -> C */
  int B, T;
  const float *qkvo; /* (B,T,3C) the qkv child's output */
  float *att;        /* (B,NH,T,T) softmax probabilities */
  uint16_t *atth;    /* (B,NH,T,T) the same in the half type (half model) */
  void *y;           /* (B,T,CL) heads concatenated: f32, or the half type */
  uint16_t *qkvh;    /* (B,T,3CL) half model: qkv rounded, kept for backward */
  loom_dtype half;   /* LOOM_BF16, LOOM_F16, or LOOM_F32: none */
  float *dy;         /* (B,T,CL) scratch */
  float *dqkv;       /* (B,T,3CL) scratch */
  float *datt;       /* (B,NH,T,T) scratch of the kernel */
} attention;

static loom_status attention_params(loom_module *m, loom_nn_visit *v) {
  attention *a = (attention *)m;
  LOOM_TRY(loom_nn_visit_child(v, "qkv", a->qkv));
  return loom_nn_visit_child(v, "proj", a->proj);
}

static loom_status attention_plan(loom_module *m, loom_nn_plan *p,
                                  const loom_shape *in, loom_shape *out) {
  attention *a = (attention *)m;
  char buf[96];
  LOOM_TRY(loom_nn_check_float(m, p, in, 3, a->C));
  if (in->ndim != 3)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects (B,T,%d), got %s", a->C,
                             loom_shape_str(in, buf, sizeof buf));
  int64_t B = in->dim[0], T = in->dim[1] * (a->sp > 1 ? a->sp : 1);
  LOOM_TRY(loom_nn_check_int(m, "qkv", B * T * 3 * a->CL));
  LOOM_TRY(loom_nn_check_int(m, "attention matrix", B * a->NH * T * T));
  a->B = (int)B;
  a->T = (int)T;
  int64_t BTC = B * T * a->CL, BHTT = B * a->NH * T * T;
  size_t mark = loom_nn_plan_scratch_mark(p);
  a->dy = loom_nn_plan_scratch_floats(p, BTC);
  a->dqkv = loom_nn_plan_scratch_floats(p, 3 * BTC);
  a->half = p->half; /* the half kernel's scratch is its own size */
  a->datt = loom_nn_plan_scratch_floats(
      p, a->half != LOOM_F32
             ? loom_attention_half_scratch_floats(a->B, a->T, a->CL, a->NH)
             : BHTT);
  /* On the half unit the half qkv the forward's matmuls read is kept for
   * backward (which then rounds nothing again and never reads the f32
   * qkv), so the qkv projection's f32 output lives in scratch for the
   * forward call only: 2 bytes an element of qkv kept instead of 4. */
  const bool keep_half = loom_half_on_unit(a->half);
  loom_linear_set_out_scratch(a->qkv, keep_half);
  loom_shape s;
  size_t kid = loom_nn_plan_scratch_mark(p);
  LOOM_TRY(loom_module_plan(a->qkv, p, in, &s));
  loom_nn_plan_scratch_release(p, kid);
  a->qkvh = NULL;
  if (a->half != LOOM_F32) {
    a->atth = loom_nn_plan_act(p, (size_t)BHTT * sizeof(uint16_t));
    if (keep_half)
      a->qkvh = loom_nn_plan_act(p, (size_t)(3 * BTC) * sizeof(uint16_t));
  } else {
    a->att = loom_nn_plan_floats(p, BHTT);
  }
  /* proj, a linear layer, takes the heads in half */
  s = *in;
  s.dim[1] = T;
  s.dim[2] = a->CL;
  s.dtype = a->half;
  a->y = loom_nn_plan_act(p, (size_t)BTC * loom_dtype_size(s.dtype));
  LOOM_TRY(loom_module_plan(a->proj, p, &s, out));
  loom_nn_plan_scratch_release(p, mark);
  return LOOM_OK;
}

static loom_status attention_forward(loom_module *m, loom_nn_ctx *ctx,
                                     const void *in, const float **out) {
  attention *a = (attention *)m;
  LOOM_TRY(loom_module_forward(a->qkv, ctx, in, &a->qkvo));
  if (a->half != LOOM_F32) {
    /* the f32 heads in dy (free until backward), rounded into y as each
     * block is computed */
    LOOM_TRY(loom_attention_forward_half(a->half, a->dy, a->y, a->atth, a->qkvo,
                                         a->qkvh, a->B, a->T, a->CL, a->NH,
                                         a->datt));
  } else {
    LOOM_TRY(loom_attention_forward(a->y, a->att, a->qkvo, a->B, a->T, a->CL,
                                    a->NH));
  }
  return loom_module_forward(a->proj, ctx, a->y, out);
}

static loom_status attention_backward(loom_module *m, loom_nn_ctx *ctx,
                                      const float *dout, float *dinp) {
  attention *a = (attention *)m;
  int64_t BTC = (int64_t)a->B * a->T * a->CL;
  memset(a->dy, 0, (size_t)BTC * sizeof(float));
  LOOM_TRY(loom_module_backward(a->proj, ctx, dout, a->dy));
  memset(a->dqkv, 0, (size_t)(3 * BTC) * sizeof(float));
  if (a->half != LOOM_F32)
    LOOM_TRY(loom_attention_backward_half(a->half, a->dqkv, a->dy, a->qkvo,
                                          a->qkvh, a->atth, a->B, a->T, a->CL,
                                          a->NH, a->datt));
  else
    LOOM_TRY(loom_attention_backward(a->dqkv, a->datt, a->dy, a->qkvo, a->att,
                                     a->B, a->T, a->CL, a->NH));
  return loom_module_backward(a->qkv, ctx, a->dqkv, dinp);
}

static void attention_free(loom_module *m) {
  attention *a = (attention *)m;
  loom_module_free(a->qkv);
  loom_module_free(a->proj);
  loom_free(a);
}

static const loom_module_ops attention_ops = {
    .name = "attention",
    .params = attention_params,
    .plan = attention_plan,
    .forward = attention_forward,
    .backward = attention_backward,
    .free = attention_free,
    .half_in = true,
};

loom_status loom_attention_new(loom_module **out, int C, int NH, bool bias) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_attention_new: NULL out");
  return loom_attention_tp_new(out, C, NH, bias, NULL, false);
}

loom_status loom_attention_tp_new(loom_module **out, int C, int NH, bool bias,
                                  const loom_tp *tp, int sp) {
  *out = NULL;
  int T = tp && tp->size > 1 ? tp->size : 1;
  if (C <= 0 || NH <= 0 || C % NH != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "attention: width %d must be a positive multiple of "
                      "the %d heads",
                      C, NH);
  if (NH % T != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "attention: %d heads do not split over %d "
                      "tensor-parallel ranks",
                      NH, T);
  attention *a = loom_calloc(1, sizeof *a);
  if (!a)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&a->base, &attention_ops);
  a->C = C;
  a->NH = NH / T;
  a->CL = C / T;
  a->sp = sp && T > 1 ? T : 0;
  loom_status st;
  /* this rank's heads: its rows of q, of k and of v (three blocks), and
   * its columns of the output projection */
  LOOM_TRY_GOTO(st, loom_linear_col_new(&a->qkv, C, 3 * a->CL, bias, 3, tp, sp),
                fail);
  LOOM_TRY_GOTO(st, loom_linear_row_new(&a->proj, a->CL, C, bias, tp, sp),
                fail);
  loom_linear_set_resid_proj(a->proj, true);
  a->qkv->attached = a->proj->attached = true;
  *out = &a->base;
  return LOOM_OK;
fail:
  attention_free(&a->base);
  return st;
}
