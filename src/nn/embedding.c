/* Token embedding, optionally plus a learned position embedding. */
#include "internal.h"

typedef struct embedding {
  loom_module base;
  int V, C, T_max;
  /* Tensor parallelism: this rank's rows [v0, v0 + V) of the whole
   * vocabulary of Vall ids (V = Vall and v0 = 0 without). */
  const loom_tp *tp;
  int v0, Vall;
  /* Sequence parallelism: the output is this rank's n = N / size rows of
   * the N looked up (tokens [rank n, (rank+1) n) of (B,T)), reduce-scattered
   * from `full`; backward all-gathers the output gradient into it. */
  bool sp;
  int n, tps;  /* tps: the group's size (planning reads no loom_tp) */
  float *full; /* (N,C) scratch */
  int N, B, T;
  const int32_t *ids; /* (N) = (B,T), kept from forward */
  float *out;         /* (N,C) */
} embedding;

static loom_status embedding_params(loom_module *m, loom_nn_visit *v) {
  embedding *e = (embedding *)m;
  loom_param_spec tok = {.name = "tok.weight",
                         .ndim = 2,
                         .shape = {e->V, e->C},
                         .role = LOOM_ROLE_EMBEDDING,
                         .fan_in = e->C,
                         .tp_split = e->tp ? LOOM_TP_ROWS : LOOM_TP_WHOLE};
  LOOM_TRY(loom_nn_visit_param(v, m, &tok));
  if (e->T_max > 0) {
    loom_param_spec pos = {.name = "pos.weight",
                           .ndim = 2,
                           .shape = {e->T_max, e->C},
                           .role = LOOM_ROLE_EMBEDDING,
                           .fan_in = e->C};
    LOOM_TRY(loom_nn_visit_param(v, m, &pos));
  }
  return LOOM_OK;
}

static loom_status embedding_plan(loom_module *m, loom_nn_plan *p,
                                  const loom_shape *in, loom_shape *out) {
  embedding *e = (embedding *)m;
  char buf[96];
  if (in->dtype != LOOM_I32 || in->ndim < 1 || in->ndim >= LOOM_MAX_DIMS)
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects int32 ids with 1 to %d dimensions, got "
                             "%s",
                             LOOM_MAX_DIMS - 1,
                             loom_shape_str(in, buf, sizeof buf));
  if (e->T_max > 0 && (in->ndim != 2 || in->dim[1] > e->T_max))
    return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                             "expects ids (B,T) with T <= %d, got %s", e->T_max,
                             loom_shape_str(in, buf, sizeof buf));
  int64_t N = loom_shape_numel(in);
  LOOM_TRY(loom_nn_check_int(m, "output", N * e->C));
  e->N = (int)N;
  e->B = (int)in->dim[0];
  e->T = in->ndim == 2 ? (int)in->dim[1] : 1;
  *out = *in;
  out->dtype = LOOM_F32;
  out->dim[out->ndim++] = e->C;
  if (e->sp) {
    int T = e->tps;
    if (in->ndim != 2 || e->T % T != 0)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "sequence parallelism over %d ranks needs ids "
                               "(B,T) with T a multiple of %d, got %s",
                               T, T, loom_shape_str(in, buf, sizeof buf));
    out->dim[1] /= T;
    e->n = e->N / T;
    e->out = loom_nn_plan_floats(p, (int64_t)e->n * e->C);
    size_t mark = loom_nn_plan_scratch_mark(p);
    e->full = loom_nn_plan_scratch_floats(p, N * e->C);
    loom_nn_plan_scratch_release(p, mark);
    return LOOM_OK;
  }
  e->out = loom_nn_plan_floats(p, N * e->C);
  return LOOM_OK;
}

static loom_status embedding_forward(loom_module *m, loom_nn_ctx *ctx,
                                     const void *in, const float **out) {
  embedding *e = (embedding *)m;
  const int32_t *ids = in;
  /* An id out of range would read outside the table: corrupt data must be
   * an error, not a crash. */
  for (int i = 0; i < e->N; i++)
    if ((uint32_t)ids[i] >= (uint32_t)e->Vall)
      return loom_module_error(m, LOOM_ERR_INVALID_ARG,
                               "id %d at position %d outside [0, %d)", ids[i],
                               i, e->Vall);
  e->ids = ids;
  if (e->tp) {
    /* this rank's rows, zeros for the others' ids; summed over the group
     * (x + 0 is x: the rows of one rank's run) */
    const float *tok = loom_nn_param(ctx, m, 0);
    size_t row = (size_t)e->C * sizeof(float);
    float *look = e->sp ? e->full : e->out; /* (N,C) */
    for (int i = 0; i < e->N; i++) {
      float *o = look + (int64_t)i * e->C;
      uint32_t k = (uint32_t)(ids[i] - e->v0);
      if (k < (uint32_t)e->V)
        memcpy(o, tok + (int64_t)k * e->C, row);
      else
        memset(o, 0, row);
    }
    if (e->sp)
      LOOM_TRY(
          loom_tp_reduce_scatter(e->tp, e->full, e->out, (int64_t)e->n * e->C));
    else
      LOOM_TRY(
          loom_tp_allreduce(e->tp, e->out, (int64_t)e->N * e->C, LOOM_TP_SUM));
  } else {
    loom_embedding_forward(e->out, ids, loom_nn_param(ctx, m, 0), e->N, e->C);
  }
  if (e->T_max > 0 && e->sp && e->tp) {
    /* row i is token g = rank n + i: position g mod T */
    const float *pos = loom_nn_param(ctx, m, 1); /* (T_max,C) */
    int64_t g0 = (int64_t)e->tp->rank * e->n;
    for (int i = 0; i < e->n; i++)
      loom_accumulate(e->out + (int64_t)i * e->C,
                      pos + ((g0 + i) % e->T) * e->C, e->C);
  } else if (e->T_max > 0) {
    const float *pos = loom_nn_param(ctx, m, 1); /* (T_max,C) */
    for (int b = 0; b < e->B; b++)
      loom_accumulate(e->out + (int64_t)b * e->T * e->C, pos,
                      (int64_t)e->T * e->C);
  }
  *out = e->out;
  return LOOM_OK;
}

static loom_status embedding_backward(loom_module *m, loom_nn_ctx *ctx,
                                      const float *dout, float *dinp) {
  embedding *e = (embedding *)m;
  (void)dinp; /* ids have no gradient */
  if (e->sp) {
    /* the rows' gradients from every rank, for this rank's vocabulary
     * rows; the position embedding's from this rank's rows only (a part:
     * the trainer sums it over the group) */
    LOOM_TRY(e->tp->gather(e->tp->user, 0, dout, e->full, (int64_t)e->n * e->C,
                           LOOM_F32));
    if (e->T_max > 0) {
      float *dpos = loom_nn_grad(ctx, m, 1);
      int64_t g0 = (int64_t)e->tp->rank * e->n;
      for (int i = 0; i < e->n; i++)
        loom_accumulate(dpos + ((g0 + i) % e->T) * e->C,
                        dout + (int64_t)i * e->C, e->C);
    }
    LOOM_TRY(e->tp->wait(e->tp->user, 0));
    float *dtok = loom_nn_grad(ctx, m, 0);
    for (int i = 0; i < e->N; i++) {
      uint32_t k = (uint32_t)(e->ids[i] - e->v0);
      if (k < (uint32_t)e->V)
        loom_accumulate(dtok + (int64_t)k * e->C, e->full + (int64_t)i * e->C,
                        e->C);
    }
    return LOOM_OK;
  }
  if (e->tp) {
    /* this rank's rows only, in the order of one rank's run */
    float *dtok = loom_nn_grad(ctx, m, 0);
    for (int i = 0; i < e->N; i++) {
      uint32_t k = (uint32_t)(e->ids[i] - e->v0);
      if (k < (uint32_t)e->V)
        loom_accumulate(dtok + (int64_t)k * e->C, dout + (int64_t)i * e->C,
                        e->C);
    }
  } else {
    loom_embedding_backward(loom_nn_grad(ctx, m, 0), dout, e->ids, e->N, e->C);
  }
  if (e->T_max > 0) {
    float *dpos = loom_nn_grad(ctx, m, 1);
    for (int b = 0; b < e->B; b++)
      loom_accumulate(dpos, dout + (int64_t)b * e->T * e->C,
                      (int64_t)e->T * e->C);
  }
  return LOOM_OK;
}

static void embedding_free(loom_module *m) { loom_free(m); }

static const loom_module_ops embedding_ops = {
    .name = "embedding",
    .params = embedding_params,
    .plan = embedding_plan,
    .forward = embedding_forward,
    .backward = embedding_backward,
    .free = embedding_free,
};

loom_status loom_embedding_new(loom_module **out, int V, int C, int T_max) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_embedding_new: NULL out");
  *out = NULL;
  if (V <= 0 || C <= 0 || T_max < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "embedding: bad sizes (vocab %d, dim %d, positions %d)",
                      V, C, T_max);
  embedding *e = loom_calloc(1, sizeof *e);
  if (!e)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&e->base, &embedding_ops);
  e->V = V;
  e->Vall = V;
  e->C = C;
  e->T_max = T_max;
  *out = &e->base;
  return LOOM_OK;
}

loom_status loom_embedding_tp_new(loom_module **out, int V, int C, int T_max,
                                  const loom_tp *tp, int sp) {
  if (!tp || tp->size <= 1)
    return loom_embedding_new(out, V, C, T_max);
  if (V % tp->size != 0 || tp->rank < 0 || tp->rank >= tp->size)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "embedding: a vocabulary of %d is not cut into %d "
                      "equal parts (rank %d)",
                      V, tp->size, tp->rank);
  LOOM_TRY(loom_embedding_new(out, V / tp->size, C, T_max));
  embedding *e = (embedding *)*out;
  e->tp = tp;
  e->Vall = V;
  e->v0 = tp->rank * (V / tp->size);
  e->sp = sp != LOOM_NN_SP_OFF;
  e->tps = tp->size;
  return LOOM_OK;
}
