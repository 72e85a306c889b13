/* Pre-LN transformer block: r = x + attn(ln1(x)); out = r + mlp(ln2(r)). */
#include "internal.h"

typedef struct block {
  loom_module base;
  int C;
  loom_module *ln1, *attn, *ln2, *mlp;
  int64_t n;   /* B*T*C */
  float *r;    /* (B,T,C) the first residual sum */
  float *out;  /* (B,T,C) */
  float *dr;   /* (B,T,C) scratch: gradient at r */
  float *dtmp; /* (B,T,C) scratch: gradient at a norm's output */
} block;

static loom_status block_params(loom_module *m, loom_nn_visit *v) {
  block *b = (block *)m;
  LOOM_TRY(loom_nn_visit_child(v, "ln1", b->ln1));
  LOOM_TRY(loom_nn_visit_child(v, "attn", b->attn));
  LOOM_TRY(loom_nn_visit_child(v, "ln2", b->ln2));
  return loom_nn_visit_child(v, "mlp", b->mlp);
}

/* Plans kid on `in`; `next` is the module its output feeds (it may take it
 * in half in a half model), NULL for the residual stream (f32). */
static loom_status plan_kid(loom_module *m, loom_nn_plan *p, loom_module *kid,
                            const loom_module *next, const loom_shape *in,
                            loom_shape *out) {
  size_t mark = loom_nn_plan_scratch_mark(p);
  p->out_half = loom_nn_takes_half(next, p);
  LOOM_TRY(loom_module_plan(kid, p, in, out));
  loom_nn_plan_scratch_release(p, mark);
  loom_shape same = *out;
  same.dtype = in->dtype;
  if (!loom_shape_equal(in, &same)) {
    char a[96], c[96];
    return loom_module_error(m, LOOM_ERR_INTERNAL, "%s maps %s to %s",
                             kid->path, loom_shape_str(in, a, sizeof a),
                             loom_shape_str(out, c, sizeof c));
  }
  return LOOM_OK;
}

static loom_status block_plan(loom_module *m, loom_nn_plan *p,
                              const loom_shape *in, loom_shape *out) {
  block *b = (block *)m;
  char buf[96];
  LOOM_TRY(loom_nn_check_f32(m, in, 3, b->C));
  if (in->ndim != 3)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects (B,T,%d), got %s", b->C,
                             loom_shape_str(in, buf, sizeof buf));
  b->n = loom_shape_numel(in);
  size_t mark = loom_nn_plan_scratch_mark(p);
  b->dr = loom_nn_plan_scratch_floats(p, b->n);
  b->dtmp = loom_nn_plan_scratch_floats(p, b->n);
  loom_shape s, u;
  LOOM_TRY(plan_kid(m, p, b->ln1, b->attn, in, &s));
  LOOM_TRY(plan_kid(m, p, b->attn, NULL, &s, &u));
  b->r = loom_nn_plan_floats(p, b->n);
  LOOM_TRY(plan_kid(m, p, b->ln2, b->mlp, in, &s));
  LOOM_TRY(plan_kid(m, p, b->mlp, NULL, &s, &u));
  b->out = loom_nn_plan_floats(p, b->n);
  loom_nn_plan_scratch_release(p, mark);
  *out = *in;
  return LOOM_OK;
}

static loom_status block_forward(loom_module *m, loom_nn_ctx *ctx,
                                 const void *in, const float **out) {
  block *b = (block *)m;
  const float *x = in, *t, *u; /* t: half data in a half model */
  LOOM_TRY(loom_module_forward(b->ln1, ctx, x, &t));
  LOOM_TRY(loom_module_forward(b->attn, ctx, t, &u));
  loom_add_forward(b->r, x, u, b->n);
  LOOM_TRY(loom_module_forward(b->ln2, ctx, b->r, &t));
  LOOM_TRY(loom_module_forward(b->mlp, ctx, t, &u));
  loom_add_forward(b->out, b->r, u, b->n);
  *out = b->out;
  return LOOM_OK;
}

static loom_status block_backward(loom_module *m, loom_nn_ctx *ctx,
                                  const float *dout, float *dinp) {
  block *b = (block *)m;
  size_t bytes = (size_t)b->n * sizeof(float);
  /* dr = dout + ln2'(mlp'(dout)) */
  memset(b->dtmp, 0, bytes);
  LOOM_TRY(loom_module_backward(b->mlp, ctx, dout, b->dtmp));
  memcpy(b->dr, dout, bytes);
  LOOM_TRY(loom_module_backward(b->ln2, ctx, b->dtmp, b->dr));
  /* dinp += dr + ln1'(attn'(dr)) */
  memset(b->dtmp, 0, bytes);
  LOOM_TRY(loom_module_backward(b->attn, ctx, b->dr, b->dtmp));
  if (dinp)
    loom_accumulate(dinp, b->dr, b->n);
  return loom_module_backward(b->ln1, ctx, b->dtmp, dinp);
}

static void block_free(loom_module *m) {
  block *b = (block *)m;
  loom_module_free(b->ln1);
  loom_module_free(b->attn);
  loom_module_free(b->ln2);
  loom_module_free(b->mlp);
  loom_free(b);
}

static const loom_module_ops block_ops = {
    .name = "transformer_block",
    .params = block_params,
    .plan = block_plan,
    .forward = block_forward,
    .backward = block_backward,
    .free = block_free,
};

loom_status loom_transformer_block_new(loom_module **out, int C, int NH,
                                       int mlp_ratio, bool bias,
                                       float dropout) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_transformer_block_new: NULL out");
  return loom_transformer_block_tp_new(out, C, NH, mlp_ratio, bias, dropout,
                                       NULL, false);
}

loom_status loom_transformer_block_tp_new(loom_module **out, int C, int NH,
                                          int mlp_ratio, bool bias,
                                          float dropout, const loom_tp *tp,
                                          int sp) {
  *out = NULL;
  if (mlp_ratio <= 0 || !(dropout >= 0.0f && dropout < 1.0f))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "transformer block: bad mlp ratio %d or dropout %g",
                      mlp_ratio, (double)dropout);
  block *b = loom_calloc(1, sizeof *b);
  if (!b)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&b->base, &block_ops);
  b->C = C;
  loom_status st;
  loom_module *attn = NULL, *drop = NULL;
  LOOM_TRY_GOTO(st, loom_layernorm_new(&b->ln1, C, bias), fail);
  LOOM_TRY_GOTO(st, loom_attention_tp_new(&attn, C, NH, bias, tp, sp), fail);
  if (dropout > 0.0f) {
    /* attention then dropout; "" keeps the names blocks.i.attn.qkv... */
    LOOM_TRY_GOTO(st, loom_sequential_new(&b->attn), fail);
    st = loom_sequential_add(b->attn, "", attn);
    attn = NULL;
    if (st != LOOM_OK)
      goto fail;
    LOOM_TRY_GOTO(st, loom_dropout_new(&drop, dropout), fail);
    if (sp)
      loom_dropout_set_sp(drop, tp);
    st = loom_sequential_add(b->attn, "drop", drop);
    if (st != LOOM_OK)
      goto fail;
  } else {
    b->attn = attn;
    attn = NULL;
  }
  LOOM_TRY_GOTO(st, loom_layernorm_new(&b->ln2, C, bias), fail);
  LOOM_TRY_GOTO(
      st, loom_mlp_tp_new(&b->mlp, C, mlp_ratio * C, bias, dropout, tp, sp),
      fail);
  b->ln1->attached = b->attn->attached = true;
  b->ln2->attached = b->mlp->attached = true;
  *out = &b->base;
  return LOOM_OK;
fail:
  loom_module_free(attn);
  block_free(&b->base);
  return st;
}
