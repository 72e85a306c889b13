/* Linear layers: out = in @ weight^T + bias; also the weight-tied variant
 * (a GPT's output layer reusing the token embedding). */
#include "internal.h"

typedef struct linear {
  loom_module base;
  int C, OC;
  bool bias, resid_proj;
  const loom_module *owner; /* tied: the module owning the weight */
  int owner_k;
  int N;
  const void *in; /* (N,C) f32, or half in a half model; kept from forward */
  float *out;     /* (N,OC) */
  /* half model: the operands in f32 (loom_linear_half_scratch_floats) */
  float *scratch;
  loom_dtype half;  /* LOOM_BF16, LOOM_F16, or LOOM_F32: none */
  bool gelu_after;  /* the output feeds a GELU (loom_linear_set_gelu_after) */
  bool out_scratch; /* the output in scratch (loom_linear_set_out_scratch) */
  /* Tensor parallelism (docs/parallel.md): column-parallel (this rank's
   * outputs; the input gradient is a partial sum, all-reduced in backward
   * through dx) or row-parallel (this rank's inputs; the output is a
   * partial sum, all-reduced in forward before the whole bias is added). */
  const loom_tp *tp;
  enum { TP_NONE, TP_COL, TP_ROW } tp_mode;
  int tp_blocks; /* column-parallel: dimension 0's blocks (qkv: 3) */
  float *dx;     /* (N,C) scratch: column-parallel, the partial dinp */
  /* Sequence parallelism (docs/parallel.md): the layer's input
   * (column-parallel) or output (row-parallel) is this rank's n = N / T
   * rows. Column: forward all-gathers the input into gin, backward
   * reduce-scatters the input gradient (dx into dxl). Row: forward
   * reduce-scatters the product (part) into out, then adds the bias to
   * the rank's rows; backward all-gathers the output gradient (into
   * gdout). N is the GEMM's rows, the whole micro-batch's. In a half
   * model the all-gathers carry what the half GEMMs round their operand
   * to anyway: the column layer's input in its own type (a norm's output:
   * half), the row layer's output gradient rounded to half (gh, widened
   * into gdout); the reduce-scatters sum f32 partial products, as plain
   * tensor parallelism's all-reduces do. */
  bool sp;
  bool regather;  /* column: gin is scratch, gathered again in backward */
  int n;          /* the rank's rows */
  int tps;        /* the group's size (planning reads no loom_tp) */
  void *gin;      /* (N,C) column: the gathered input (of type gdt), kept
                     for backward */
  loom_dtype gdt; /* column: the input's type, f32 or the half type */
  float *dxl;     /* (n,C) scratch, column: the rank's rows of dx summed */
  float *part;    /* (N,OC) scratch, row: this rank's partial product */
  float *gdout;   /* (N,OC) scratch, row: the gathered output gradient */
  uint16_t *gh;   /* (N,OC) scratch, row, half model: the same in half */
} linear;

static loom_status linear_params(loom_module *m, loom_nn_visit *v) {
  linear *l = (linear *)m;
  if (l->owner) {
    const loom_param *w;
    LOOM_TRY(loom_nn_visit_view(v, l->owner, l->owner_k, &w));
    if (w->ndim != 2)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "tied weight '%s' is not 2-D", w->name);
    l->OC = (int)w->shape[0];
    l->C = (int)w->shape[1];
    return LOOM_OK;
  }
  loom_param_spec w = {.name = "weight",
                       .ndim = 2,
                       .shape = {l->OC, l->C},
                       .role = LOOM_ROLE_WEIGHT,
                       .fan_in = l->C,
                       .resid_proj = l->resid_proj,
                       .tp_split = l->tp_mode == TP_COL   ? LOOM_TP_ROWS
                                   : l->tp_mode == TP_ROW ? LOOM_TP_COLS
                                                          : LOOM_TP_WHOLE,
                       .tp_blocks = l->tp_blocks};
  LOOM_TRY(loom_nn_visit_param(v, m, &w));
  if (l->bias) {
    /* a row-parallel layer's bias is added once, after the reduction */
    loom_param_spec b = {.name = "bias",
                         .ndim = 1,
                         .shape = {l->OC},
                         .role = LOOM_ROLE_BIAS,
                         .fan_in = l->C,
                         .tp_split = l->tp_mode == TP_COL ? LOOM_TP_ROWS
                                                          : LOOM_TP_WHOLE,
                         .tp_blocks = l->tp_blocks};
    LOOM_TRY(loom_nn_visit_param(v, m, &b));
  }
  return LOOM_OK;
}

static loom_status linear_plan(loom_module *m, loom_nn_plan *p,
                               const loom_shape *in, loom_shape *out) {
  linear *l = (linear *)m;
  if (l->C <= 0)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "tied weight not resolved (not in a model)");
  LOOM_TRY(loom_nn_check_float(m, p, in, 1, l->C));
  int64_t N = loom_nn_rows(in);
  *out = *in;
  out->dtype = LOOM_F32;
  out->dim[out->ndim - 1] = l->OC;
  l->dx = l->dxl = l->part = l->gdout = NULL;
  l->gin = NULL;
  l->gh = NULL;
  if (l->sp) {
    /* the rows' dimension (the sequence in (B,T,C)) is the one cut */
    int T = l->tps, d = in->ndim - 2;
    char buf[96];
    if (d < 0 || (l->tp_mode == TP_ROW && in->dim[d] % T != 0))
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "sequence parallelism over %d ranks needs "
                               "(..., rows, C) with rows a multiple of %d, "
                               "got %s",
                               T, T, loom_shape_str(in, buf, sizeof buf));
    if (l->tp_mode == TP_COL) {
      out->dim[d] *= T;
      l->n = (int)N;
      N *= T;
    } else {
      out->dim[d] /= T;
      l->n = (int)(N / T);
    }
  }
  LOOM_TRY(loom_nn_check_int(m, "input", N * l->C));
  LOOM_TRY(loom_nn_check_int(m, "output", N * l->OC));
  l->N = (int)N;
  l->half = p->half;
  l->scratch = NULL;
  if (l->sp && l->tp_mode == TP_COL) {
    /* the gathered input in the input's type: f32 floats, or half of
     * them for 2-byte elements */
    l->gdt = in->dtype;
    const int64_t gf = in->dtype == LOOM_F32 ? N * l->C : (N * l->C + 1) / 2;
    if (!l->regather)
      l->gin = loom_nn_plan_floats(p, gf);
    l->out = l->out_scratch ? loom_nn_plan_scratch_floats(p, N * l->OC)
                            : loom_nn_plan_floats(p, N * l->OC);
    size_t mark = loom_nn_plan_scratch_mark(p);
    if (l->regather) /* forward and backward each use it within the call */
      l->gin = loom_nn_plan_scratch_floats(p, gf);
    l->dx = loom_nn_plan_scratch_floats(p, N * l->C);
    l->dxl = loom_nn_plan_scratch_floats(p, (int64_t)l->n * l->C);
    if (l->half != LOOM_F32)
      l->scratch = loom_nn_plan_scratch_floats(
          p, loom_linear_half_scratch_floats(l->N, l->C, l->OC));
    loom_nn_plan_scratch_release(p, mark);
    return LOOM_OK;
  }
  if (l->sp && l->tp_mode == TP_ROW) {
    l->out = loom_nn_plan_floats(p, (int64_t)l->n * l->OC);
    size_t mark = loom_nn_plan_scratch_mark(p);
    /* forward uses part, backward gdout: never at once */
    l->part = loom_nn_plan_scratch_floats(p, N * l->OC);
    l->gdout = l->part;
    if (l->half != LOOM_F32) {
      l->gh = (uint16_t *)loom_nn_plan_scratch_floats(p, (N * l->OC + 1) / 2);
      l->scratch = loom_nn_plan_scratch_floats(
          p, loom_linear_half_scratch_floats(l->N, l->C, l->OC));
    }
    loom_nn_plan_scratch_release(p, mark);
    return LOOM_OK;
  }
  l->out = l->out_scratch ? loom_nn_plan_scratch_floats(p, N * l->OC)
                          : loom_nn_plan_floats(p, N * l->OC);
  /* Scratch used within a call: column-parallel's partial input gradient
   * (in flight while the weight's gradient is computed, so apart from the
   * half operands' room, which that computation uses) */
  size_t mark = loom_nn_plan_scratch_mark(p);
  if (l->tp_mode == TP_COL)
    l->dx = loom_nn_plan_scratch_floats(p, N * l->C);
  if (l->half != LOOM_F32)
    l->scratch = loom_nn_plan_scratch_floats(
        p, loom_linear_half_scratch_floats(l->N, l->C, l->OC));
  loom_nn_plan_scratch_release(p, mark);
  return LOOM_OK;
}

static const float *linear_weight(const linear *l, const loom_nn_ctx *ctx) {
  return l->owner ? loom_nn_param(ctx, l->owner, l->owner_k)
                  : loom_nn_param(ctx, &l->base, 0);
}

/* The weight as the half matmuls take it (*w, of type *wdt: the half
 * type, or f32 values of it on the conversion path). */
static loom_status linear_weight_half(const linear *l, const loom_nn_ctx *ctx,
                                      const void **w, loom_dtype *wdt) {
  *w = l->owner ? loom_nn_param_half(ctx, l->owner, l->owner_k, wdt)
                : loom_nn_param_half(ctx, &l->base, 0, wdt);
  if (!*w || ctx->half != l->half)
    return loom_module_error(&l->base, LOOM_ERR_INTERNAL, "no %s weights",
                             loom_dtype_name(l->half));
  return LOOM_OK;
}

/* out(N rows) = in @ W^T (+ b), in of type dt (f32, or the half type in a
 * half model), in f32 or on the half weights. */
static loom_status product_of(linear *l, loom_nn_ctx *ctx, float *out,
                              const void *in, loom_dtype dt, int N,
                              const float *b) {
  if (l->half == LOOM_F32)
    return loom_linear_forward(out, in, linear_weight(l, ctx), b, N, l->C,
                               l->OC);
  const void *w;
  loom_dtype wdt;
  LOOM_TRY(linear_weight_half(l, ctx, &w, &wdt));
  return loom_linear_forward_half(out, in, dt, l->half, w, wdt, b, N, l->C,
                                  l->OC, l->scratch);
}

/* out = in @ W^T (+ b), in f32 or on the half weights. */
static loom_status product(linear *l, loom_nn_ctx *ctx, const float *b) {
  return product_of(l, ctx, l->out, l->in, l->base.in.dtype, l->N, b);
}

static loom_status linear_forward(loom_module *m, loom_nn_ctx *ctx,
                                  const void *in, const float **out) {
  linear *l = (linear *)m;
  l->in = in;
  const float *b = l->bias ? loom_nn_param(ctx, m, 1) : NULL;
  if (l->sp && l->tp_mode == TP_COL) {
    /* every rank's rows, in rank order: the micro-batch's N */
    LOOM_TRY(
        loom_tp_allgather(l->tp, l->in, l->gin, (int64_t)l->n * l->C, l->gdt));
    LOOM_TRY(product_of(l, ctx, l->out, l->gin, l->gdt, l->N, b));
  } else if (l->sp && l->tp_mode == TP_ROW) {
    /* the sum of every rank's part, of this rank's rows only */
    LOOM_TRY(product_of(l, ctx, l->part, l->in, l->base.in.dtype, l->N, NULL));
    LOOM_TRY(
        loom_tp_reduce_scatter(l->tp, l->part, l->out, (int64_t)l->n * l->OC));
    if (b)
      for (int i = 0; i < l->n; i++)
        loom_accumulate(l->out + (int64_t)i * l->OC, b, l->OC);
  } else if (l->tp_mode == TP_ROW) {
    /* every rank's part of the product (f32 sums in either precision),
     * summed, then the bias once */
    LOOM_TRY(product(l, ctx, NULL));
    LOOM_TRY(
        loom_tp_allreduce(l->tp, l->out, (int64_t)l->N * l->OC, LOOM_TP_SUM));
    if (b)
      for (int i = 0; i < l->N; i++)
        loom_accumulate(l->out + (int64_t)i * l->OC, b, l->OC);
  } else {
    LOOM_TRY(product(l, ctx, b));
  }
  *out = l->out;
  return LOOM_OK;
}

/* The gradients asked for (NULL: not) of N rows of input in (of type
 * dt), in f32 or on the half weights. */
static loom_status gradients_of(linear *l, loom_nn_ctx *ctx, float *dinp,
                                float *dw, float *db, const float *dout,
                                const void *in, loom_dtype dt, int N) {
  if (l->half != LOOM_F32) {
    const void *w;
    loom_dtype wdt;
    LOOM_TRY(linear_weight_half(l, ctx, &w, &wdt));
    return loom_linear_backward_half(dinp, dw, db, dout, in, dt, l->half, w,
                                     wdt, N, l->C, l->OC, l->scratch);
  }
  return loom_linear_backward(dinp, dw, db, dout, in, linear_weight(l, ctx), N,
                              l->C, l->OC);
}

static bool gelu_fused(const linear *l, loom_dtype half) {
  return l->gelu_after && half != LOOM_F32 && l->tp_mode == TP_NONE && !l->sp;
}

/* The same of the layer's own input, N rows. */
static loom_status gradients(linear *l, loom_nn_ctx *ctx, float *dinp,
                             float *dw, float *db, const float *dout) {
  return gradients_of(l, ctx, dinp, dw, db, dout, l->in, l->base.in.dtype,
                      l->N);
}

static loom_status linear_backward(loom_module *m, loom_nn_ctx *ctx,
                                   const float *dout, float *dinp) {
  linear *l = (linear *)m;
  float *dw = l->owner ? loom_nn_grad(ctx, l->owner, l->owner_k)
                       : loom_nn_grad(ctx, m, 0);
  float *db = l->bias ? loom_nn_grad(ctx, m, 1) : NULL;
  if (l->sp && l->tp_mode == TP_COL && l->regather) {
    /* The input's rows gathered again (slot 1) while the input gradient of
     * the N rows, which needs only the weight, is computed; then its sum
     * over the group, of this rank's rows, (slot 0) travels while the
     * weight's gradient is computed from the gathered input. */
    int64_t nn = (int64_t)l->N * l->C;
    LOOM_TRY(l->tp->gather(l->tp->user, 1, l->in, l->gin, (int64_t)l->n * l->C,
                           l->gdt));
    loom_status s = LOOM_OK;
    if (dinp) {
      memset(l->dx, 0, (size_t)nn * sizeof(float));
      s = gradients_of(l, ctx, l->dx, NULL, NULL, dout, l->gin, l->gdt, l->N);
    }
    loom_status ws = l->tp->wait(l->tp->user, 1);
    LOOM_TRY(s);
    LOOM_TRY(ws);
    if (dinp)
      LOOM_TRY(
          l->tp->scatter(l->tp->user, 0, l->dx, l->dxl, (int64_t)l->n * l->C));
    s = gradients_of(l, ctx, NULL, dw, db, dout, l->gin, l->gdt, l->N);
    if (!dinp)
      return s;
    ws = l->tp->wait(l->tp->user, 0);
    LOOM_TRY(s);
    LOOM_TRY(ws);
    loom_accumulate(dinp, l->dxl, (int64_t)l->n * l->C);
    return LOOM_OK;
  }
  if (l->sp && l->tp_mode == TP_COL) {
    /* The input gradient of the N rows, summed over the group, of this
     * rank's rows only: posted first, it travels while the weight's
     * gradient is computed from the gathered input. */
    int64_t nn = (int64_t)l->N * l->C;
    if (dinp) {
      memset(l->dx, 0, (size_t)nn * sizeof(float));
      LOOM_TRY(
          gradients_of(l, ctx, l->dx, NULL, NULL, dout, l->gin, l->gdt, l->N));
      LOOM_TRY(
          l->tp->scatter(l->tp->user, 0, l->dx, l->dxl, (int64_t)l->n * l->C));
    }
    loom_status s =
        gradients_of(l, ctx, NULL, dw, db, dout, l->gin, l->gdt, l->N);
    if (!dinp)
      return s;
    loom_status ws = l->tp->wait(l->tp->user, 0);
    LOOM_TRY(s);
    LOOM_TRY(ws);
    loom_accumulate(dinp, l->dxl, (int64_t)l->n * l->C);
    return LOOM_OK;
  }
  if (l->sp && l->tp_mode == TP_ROW) {
    /* The bias's gradient from this rank's rows (a part: the trainer sums
     * it over the group; from the f32 gradient in any precision) while the
     * others' output gradients arrive. A half model's two matmuls round
     * the output gradient to half: it travels so rounded (in place, in
     * this rank's block) and is widened back exactly, so the matmuls see
     * the values of plain tensor parallelism in half the bytes. */
    const int64_t mine = (int64_t)l->n * l->OC;
    if (l->half != LOOM_F32) {
      uint16_t *at = l->gh + (int64_t)l->tp->rank * mine;
      LOOM_TRY(loom_cvt_f32_to_half(l->half, at, dout, mine));
      LOOM_TRY(l->tp->gather(l->tp->user, 0, at, l->gh, mine, l->half));
    } else {
      LOOM_TRY(l->tp->gather(l->tp->user, 0, dout, l->gdout, mine, LOOM_F32));
    }
    loom_status s = LOOM_OK;
    if (db)
      s = loom_linear_backward(NULL, NULL, db, dout, NULL, NULL, l->n, l->C,
                               l->OC);
    loom_status ws = l->tp->wait(l->tp->user, 0);
    LOOM_TRY(s);
    LOOM_TRY(ws);
    if (l->half != LOOM_F32)
      LOOM_TRY(loom_cvt_half_to_f32(l->half, l->gdout, l->gh,
                                    (int64_t)l->N * l->OC));
    return gradients_of(l, ctx, dinp, dw, NULL, l->gdout, l->in,
                        l->base.in.dtype, l->N);
  }
  if (l->tp_mode == TP_COL && dinp) {
    /* This rank's outputs give a part of the input gradient: its sum over
     * the group is posted first and travels while the weight's gradient is
     * computed. */
    int64_t n = (int64_t)l->N * l->C;
    memset(l->dx, 0, (size_t)n * sizeof(float));
    LOOM_TRY(gradients(l, ctx, l->dx, NULL, NULL, dout));
    LOOM_TRY(l->tp->start(l->tp->user, 0, l->dx, n, LOOM_TP_SUM));
    loom_status s = gradients(l, ctx, NULL, dw, db, dout);
    loom_status ws = l->tp->wait(l->tp->user, 0);
    LOOM_TRY(s);
    LOOM_TRY(ws);
    loom_accumulate(dinp, l->dx, n);
    return LOOM_OK;
  }
  if (gelu_fused(l, l->half)) {
    /* dout is the gradient at GELU(out): its backward runs in the pass
     * that rounds it */
    const void *w;
    loom_dtype wdt;
    LOOM_TRY(linear_weight_half(l, ctx, &w, &wdt));
    return loom_linear_backward_half_gelu(dinp, dw, db, dout, l->out, l->in,
                                          l->base.in.dtype, l->half, w, wdt,
                                          l->N, l->C, l->OC, l->scratch);
  }
  return gradients(l, ctx, dinp, dw, db, dout);
}

static void linear_free(loom_module *m) { loom_free(m); }

static const loom_module_ops linear_ops = {
    .name = "linear",
    .params = linear_params,
    .plan = linear_plan,
    .forward = linear_forward,
    .backward = linear_backward,
    .free = linear_free,
    .half_in = true,
};

loom_status loom_linear_new(loom_module **out, int C, int OC, bool bias) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_linear_new: NULL out");
  *out = NULL;
  if (C <= 0 || OC <= 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "linear: sizes must be positive (in %d, out %d)", C, OC);
  linear *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&l->base, &linear_ops);
  l->C = C;
  l->OC = OC;
  l->bias = bias;
  *out = &l->base;
  return LOOM_OK;
}

loom_status loom_linear_tied_new(loom_module **out, const loom_module *owner,
                                 int k) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_linear_tied_new: NULL out");
  *out = NULL;
  if (!owner || k < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "linear: tied weight needs an owner module");
  linear *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&l->base, &linear_ops);
  l->owner = owner;
  l->owner_k = k;
  *out = &l->base;
  return LOOM_OK;
}

static bool tp_ok(const loom_tp *tp) {
  return tp && tp->size > 1 && tp->start && tp->wait;
}

bool loom_tp_sp_ok(const loom_tp *tp) {
  return tp_ok(tp) && tp->gather && tp->scatter;
}

loom_status loom_linear_col_new(loom_module **out, int C, int OC, bool bias,
                                int blocks, const loom_tp *tp, int sp) {
  LOOM_TRY(loom_linear_new(out, C, OC, bias));
  if (tp_ok(tp)) {
    linear *l = (linear *)*out;
    l->tp = tp;
    l->tp_mode = TP_COL;
    l->tp_blocks = blocks > 0 ? blocks : 1;
    l->sp = sp != LOOM_NN_SP_OFF;
    l->tps = tp->size;
    l->regather = sp == LOOM_NN_SP_REGATHER;
  }
  return LOOM_OK;
}

loom_status loom_linear_row_new(loom_module **out, int C, int OC, bool bias,
                                const loom_tp *tp, int sp) {
  LOOM_TRY(loom_linear_new(out, C, OC, bias));
  if (tp_ok(tp)) {
    linear *l = (linear *)*out;
    l->tp = tp;
    l->tp_mode = TP_ROW;
    l->sp = sp != LOOM_NN_SP_OFF;
    l->tps = tp->size;
  }
  return LOOM_OK;
}

void loom_linear_set_tp_col(loom_module *m, const loom_tp *tp, int sp) {
  if (m && m->ops == &linear_ops && tp_ok(tp)) {
    linear *l = (linear *)m;
    l->tp = tp;
    l->tp_mode = TP_COL;
    l->tp_blocks = 1;
    l->sp = sp != LOOM_NN_SP_OFF;
    l->tps = tp->size;
    l->regather = sp == LOOM_NN_SP_REGATHER;
  }
}

loom_status loom_tp_allreduce(const loom_tp *tp, float *buf, int64_t n,
                              loom_tp_op op) {
  if (!tp || tp->size <= 1)
    return LOOM_OK;
  LOOM_TRY(tp->start(tp->user, 0, buf, n, op));
  return tp->wait(tp->user, 0);
}

loom_status loom_tp_allgather(const loom_tp *tp, const void *send, void *recv,
                              int64_t n, loom_dtype dt) {
  LOOM_TRY(tp->gather(tp->user, 0, send, recv, n, dt));
  return tp->wait(tp->user, 0);
}

loom_status loom_tp_reduce_scatter(const loom_tp *tp, const float *send,
                                   float *recv, int64_t n) {
  LOOM_TRY(tp->scatter(tp->user, 0, send, recv, n));
  return tp->wait(tp->user, 0);
}

void loom_linear_set_out_scratch(loom_module *m, bool on) {
  if (m && m->ops == &linear_ops)
    ((linear *)m)->out_scratch = on;
}

void loom_linear_set_gelu_after(loom_module *m, bool on) {
  if (m && m->ops == &linear_ops)
    ((linear *)m)->gelu_after = on;
}

bool loom_linear_gelu_fused(const loom_module *m, loom_dtype half) {
  return m && m->ops == &linear_ops && gelu_fused((const linear *)m, half);
}

void loom_linear_set_resid_proj(loom_module *m, bool on) {
  if (m && m->ops == &linear_ops)
    ((linear *)m)->resid_proj = on;
}
