/* Inverted dropout with counter-based masks keyed by (seed, module, step,
 * sample): the same masks whatever the thread count, rank or world size. */
#include "internal.h"

/* "DROP": the purpose word of dropout streams (init uses another). */
#define DROPOUT_PURPOSE 0x44524f5000000000ULL

typedef struct dropout {
  loom_module base;
  float p;
  uint64_t rng_id; /* this module's number among random modules */
  int64_t n, per;  /* elements, elements per sample */
  int64_t B;
  bool masked; /* the last forward applied a mask */
  /* Sequence parallelism: the input is part tp->rank of tp->size
   * contiguous parts of the micro-batch (NULL: all of it). */
  const loom_tp *sp;
  float *out;    /* (n) */
  uint8_t *mask; /* (n) */
} dropout;

static loom_status dropout_params(loom_module *m, loom_nn_visit *v) {
  ((dropout *)m)->rng_id = loom_nn_visit_rng_id(v);
  return LOOM_OK;
}

static loom_status dropout_plan(loom_module *m, loom_nn_plan *p,
                                const loom_shape *in, loom_shape *out) {
  dropout *d = (dropout *)m;
  LOOM_TRY(loom_nn_check_f32(m, in, 1, 0));
  d->n = loom_shape_numel(in);
  d->B = in->dim[0];
  d->per = d->n / d->B;
  *out = *in;
  d->out = loom_nn_plan_floats(p, d->n);
  d->mask = loom_nn_plan_act(p, (size_t)d->n);
  return LOOM_OK;
}

static loom_status dropout_forward(loom_module *m, loom_nn_ctx *ctx,
                                   const void *in, const float **out) {
  dropout *d = (dropout *)m;
  if (!ctx->training || d->p == 0.0f) {
    d->masked = false;
    *out = in; /* identity: no copy */
    return LOOM_OK;
  }
  const float *x = in;
  if (d->sp) {
    /* Element e of this rank's part is element g = rank n + e of the
     * whole micro-batch: sample g / (per T), draw g mod (per T) of that
     * sample's stream, as one rank's run draws it. */
    int64_t whole = d->per * d->sp->size, g0 = (int64_t)d->sp->rank * d->n;
    for (int64_t e = 0; e < d->n;) {
      int64_t g = g0 + e, b = g / whole, off = g % whole;
      int64_t len = whole - off < d->n - e ? whole - off : d->n - e;
      uint64_t stream =
          loom_rng_stream_id(DROPOUT_PURPOSE | d->rng_id, ctx->step,
                             ctx->sample_base + (uint64_t)b);
      loom_rng rng = loom_rng_init(ctx->seed, stream);
      loom_rng_seek(&rng, (uint64_t)off);
      loom_dropout_forward(d->out + e, d->mask + e, x + e, d->p, &rng, len);
      e += len;
    }
    d->masked = true;
    *out = d->out;
    return LOOM_OK;
  }
  for (int64_t b = 0; b < d->B; b++) {
    uint64_t stream = loom_rng_stream_id(DROPOUT_PURPOSE | d->rng_id, ctx->step,
                                         ctx->sample_base + (uint64_t)b);
    loom_rng rng = loom_rng_init(ctx->seed, stream);
    int64_t o = b * d->per;
    loom_dropout_forward(d->out + o, d->mask + o, x + o, d->p, &rng, d->per);
  }
  d->masked = true;
  *out = d->out;
  return LOOM_OK;
}

static loom_status dropout_backward(loom_module *m, loom_nn_ctx *ctx,
                                    const float *dout, float *dinp) {
  dropout *d = (dropout *)m;
  (void)ctx;
  if (!dinp)
    return LOOM_OK;
  if (d->masked)
    loom_dropout_backward(dinp, d->mask, dout, d->p, d->n);
  else
    loom_accumulate(dinp, dout, d->n);
  return LOOM_OK;
}

static void dropout_free(loom_module *m) { loom_free(m); }

static const loom_module_ops dropout_ops = {
    .name = "dropout",
    .params = dropout_params,
    .plan = dropout_plan,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .free = dropout_free,
};

loom_status loom_dropout_new(loom_module **out, float p) {
  if (!out)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_dropout_new: NULL out");
  *out = NULL;
  if (!(p >= 0.0f && p < 1.0f))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "dropout: probability %g outside [0, 1)", (double)p);
  dropout *d = loom_calloc(1, sizeof *d);
  if (!d)
    return LOOM_ERR_NOMEM;
  loom_module_init_base(&d->base, &dropout_ops);
  d->p = p;
  *out = &d->base;
  return LOOM_OK;
}

void loom_dropout_set_sp(loom_module *m, const loom_tp *tp) {
  if (m && m->ops == &dropout_ops && loom_tp_sp_ok(tp))
    ((dropout *)m)->sp = tp;
}
