/* The trainer's tensor parallelism: the rank's part of the GPT, the whole
 * model's layout that checkpoints keep, the map between them, and what
 * the loop does differently with them (the draws, the gradient norm,
 * checkpoint slices, evaluation). */
#include <string.h>

#include "loom/ckpt.h"
#include "loom/nn.h"
#include "trainer.h"

loom_status loom_train_tp_new(loom_trainer *t) {
  LOOM_TRY(loom_tp_group_new(&t->tpg, t->tp_group));
  t->sp = t->cfg.parallel.sequence_parallel;
  const loom_tp *tp = loom_tp_group_tp(t->tpg);
  /* Drawn later from the whole model's streams (or read). A pipeline
   * stage's model holds the layout only (loom_train_pipe_new binds its
   * buffers). */
  loom_model_opts mo = loom_model_opts_default();
  mo.defer_init = true;
  mo.shape_only = t->stages > 1 || t->zero == 3; /* ZeRO-3 binds its own */
  LOOM_TRY(loom_train_model_make_tp(&t->cfg, &mo, tp, &t->model));
  loom_model_opts wo = loom_model_opts_default();
  wo.shape_only = true;
  LOOM_TRY(loom_train_model_make(&t->cfg, &wo, &t->whole));
  LOOM_TRY(loom_tp_map_new(&t->tp_map, t->model, t->whole, t->tps));
  int64_t mine = loom_model_num_params(t->model);
  int64_t all = loom_model_num_params(t->whole);
  loom_log_file("tensor parallel rank %d of %d (replica %d of %d): %lld of "
                "the %lld parameters",
                t->tp_rank, t->tps, t->replica, t->replicas, (long long)mine,
                (long long)all);
  if (t->rank == 0 && !t->opts.quiet)
    LOOM_INFO("tensor parallel: %d ranks a group x %d replica(s); %lld of "
              "the %lld parameters a rank (%.1f%%): the embedding and the "
              "output layer cut over the vocabulary, attention over the "
              "heads, the MLP over its hidden units%s",
              t->tps, t->replicas, (long long)mine, (long long)all,
              100.0 * (double)mine / (double)(all ? all : 1),
              !t->sp ? ""
              : t->cfg.parallel.sequence_parallel_regather
                  ? "; sequence parallel (norms, dropout and residual sums "
                    "on 1/tp of the tokens; inputs gathered again in "
                    "backward)"
                  : "; sequence parallel (norms, dropout and residual sums "
                    "on 1/tp of the tokens)");
  return LOOM_OK;
}

void loom_train_tp_free(loom_trainer *t) {
  loom_tp_map_free(t->tp_map);
  t->tp_map = NULL;
  loom_model_free(t->whole);
  t->whole = NULL;
}

/* The ranges of the rank's layout it holds: a pipeline stage's (owned and
 * borrowed), else all (NULL). */
static const loom_range *held(const loom_trainer *t, int *n) {
  *n = 0;
  return t->pipe ? loom_pipe_ranges(t->pipe, n) : NULL;
}

loom_status loom_train_tp_init_params(loom_trainer *t) {
  int nr;
  const loom_range *r = held(t, &nr);
  LOOM_TRY(loom_tp_map_init(t->tp_map, t->tp_rank, t->whole, r, nr,
                            loom_model_params(t->model)));
  loom_model_params_updated(t->model);
  return LOOM_OK;
}

loom_status loom_train_tp_grad_sumsq(loom_trainer *t, int64_t lo, int64_t hi,
                                     double *out) {
  return loom_tp_map_sumsq(t->tp_map, t->tp_group, loom_model_grads(t->model),
                           lo, hi, out);
}

loom_status loom_train_tp_slice(loom_trainer *t, const float *local,
                                int64_t base, float *dst) {
  int64_t lo[64] = {0}, hi[64] = {0}, *plo = lo, *phi = hi;
  if (t->tps > 64) {
    plo = loom_calloc(2 * (size_t)t->tps, sizeof *plo);
    if (!plo)
      return LOOM_ERR_NOMEM;
    phi = plo + t->tps;
  }
  /* the group's ranks are consecutive: each one's checkpoint slice */
  int first = t->rank - t->tp_rank;
  for (int p = 0; p < t->tps; p++)
    loom_train_slice(t, first + p, &plo[p], &phi[p]);
  loom_status s =
      loom_tp_map_gather(t->tp_map, t->tp_group, local, base, plo, phi, dst);
  if (plo != lo)
    loom_free(plo);
  return s;
}

loom_status loom_train_tp_cut_sumsq(loom_trainer *t, int64_t lo, int64_t hi,
                                    double *out) {
  double mine;
  LOOM_TRY(loom_train_tp_grad_sumsq(t, lo, hi, &mine));
  if (t->replicas == 1) {
    *out = mine;
    return LOOM_OK;
  }
  loom_req r = LOOM_REQ_INIT;
  LOOM_TRY(loom_allreduce(&mine, out, 1, LOOM_F64, LOOM_SUM, t->dp_group, &r));
  return loom_wait(&r);
}

void loom_train_tp_stepped(const loom_trainer *t, int64_t *a, int64_t *b) {
  if (t->pipe) {
    loom_pipe_owned(t->pipe, a, b);
    return;
  }
  *a = 0;
  *b = loom_model_num_params(t->model);
}

void loom_train_tp_cut(const loom_trainer *t, int d, int64_t *lo, int64_t *hi) {
  int64_t a, b;
  loom_train_tp_stepped(t, &a, &b);
  *lo = a + (b - a) * d / t->replicas;
  *hi = a + (b - a) * (d + 1) / t->replicas;
}

loom_status loom_train_tp_cuts_new(loom_trainer *t) {
  t->zero_counts = loom_calloc((size_t)t->replicas, sizeof *t->zero_counts);
  if (!t->zero_counts)
    return LOOM_ERR_NOMEM;
  for (int d = 0; d < t->replicas; d++) {
    int64_t lo, hi;
    loom_train_tp_cut(t, d, &lo, &hi);
    t->zero_counts[d] = (size_t)(hi - lo);
  }
  return LOOM_OK;
}

loom_status loom_train_tp_gather_cuts(loom_trainer *t, const float *cut,
                                      float *range) {
  if (!t->zero_counts)
    return loom_error(LOOM_ERR_INTERNAL, "zero with tensor parallelism: "
                                         "the cuts' counts were not made");
  loom_req req = LOOM_REQ_INIT;
  LOOM_TRY(
      loom_allgatherv(cut, range, t->zero_counts, LOOM_F32, t->dp_group, &req));
  return loom_wait(&req);
}

loom_status loom_train_tp_read_cut(loom_trainer *t, const loom_ckpt *c,
                                   const char *name, float *range, float *cut) {
  int64_t a, b, lo, hi;
  loom_train_tp_stepped(t, &a, &b);
  loom_train_tp_cut(t, t->replica, &lo, &hi);
  LOOM_TRY(loom_train_tp_read(t, c, name, range, a, b - a));
  memcpy(cut, range + (lo - a), (size_t)(hi - lo) * sizeof(float));
  return LOOM_OK;
}

typedef struct read_ctx {
  const loom_ckpt *c;
  const char *name;
} read_ctx;

static loom_status read_fetch(void *user, int view, int64_t begin, int64_t end,
                              float *dst) {
  (void)view;
  read_ctx *r = user;
  return loom_ckpt_read_range(r->c, r->name, begin, end, dst);
}

loom_status loom_train_tp_fill_cut(loom_trainer *t, const loom_ckpt *c) {
  int64_t lo, hi;
  loom_train_tp_cut(t, t->replica, &lo, &hi);
  float *p = loom_model_params(t->model);
  read_ctx r = {c, "params"};
  for (int i = 0; i < loom_model_num_views(t->model); i++) {
    const loom_param *v = loom_model_view(t->model, i);
    int64_t a = v->offset, b = v->offset + v->numel;
    if (b <= lo || a >= hi)
      continue; /* none of it is this replica's */
    /* the whole view (the map fills views whole), then what lies outside
     * the cut given back at once */
    loom_range only = {a, v->numel};
    LOOM_TRY(
        c ? loom_tp_map_fill(t->tp_map, t->tp_rank, &only, 1, read_fetch, &r, p,
                             0)
          : loom_tp_map_init(t->tp_map, t->tp_rank, t->whole, &only, 1, p));
    if (a < lo)
      loom_vmem_release(p, (size_t)a * sizeof(float),
                        (size_t)lo * sizeof(float));
    if (b > hi)
      loom_vmem_release(p, (size_t)hi * sizeof(float),
                        (size_t)b * sizeof(float));
  }
  return LOOM_OK;
}

loom_status loom_train_tp_read(loom_trainer *t, const loom_ckpt *c,
                               const char *name, float *local, int64_t base,
                               int64_t count) {
  read_ctx r = {c, name};
  int nr;
  const loom_range *rg = held(t, &nr);
  loom_range only = {base, count};
  if (count >= 0) { /* an optimizer state: its range only */
    rg = &only;
    nr = 1;
  }
  return loom_tp_map_fill(t->tp_map, t->tp_rank, rg, nr, read_fetch, &r, local,
                          base);
}

loom_status loom_train_tp_eval(loom_trainer *t, const loom_batch *b,
                               double *part) {
  loom_tensor logits;
  loom_xent_stats st;
  LOOM_TRY(loom_model_forward(t->model, &b->x, &logits));
  LOOM_TRY(
      loom_xent_forward(t->xent, &logits, (const int32_t *)b->y.data, &st));
  if (t->tp_rank == 0) { /* every rank of the group has the same sums */
    part[0] = st.loss_sum;
    part[1] = (double)st.count;
    part[2] = (double)st.correct;
  }
  return LOOM_OK;
}

/* The whole views within [lo, hi) of the rank's layout: counted (buf
 * NULL), packed from grads into buf, or unpacked from buf into grads.
 * Returns their elements. */
static int64_t whole_views(const loom_trainer *t, int64_t lo, int64_t hi,
                           float *grads, float *buf, bool unpack) {
  int64_t k = 0;
  for (int i = 0; i < loom_model_num_views(t->model); i++) {
    const loom_param *v = loom_model_view(t->model, i);
    int blocks;
    if (loom_model_view_tp(t->model, i, &blocks) != LOOM_TP_WHOLE)
      continue;
    /* its elements in [lo, hi): a ZeRO-2/3 cut may end inside a view (the
     * tp group's ranks have the same layout, so the same elements) */
    const int64_t a = v->offset > lo ? v->offset : lo;
    const int64_t b = v->offset + v->numel < hi ? v->offset + v->numel : hi;
    if (a >= b)
      continue;
    size_t bytes = (size_t)(b - a) * sizeof(float);
    if (buf && unpack)
      memcpy(grads + a, buf + k, bytes);
    else if (buf)
      memcpy(buf + k, grads + a, bytes);
    k += b - a;
  }
  return k;
}

/* Sequence parallelism: the whole parameters (layer norms, row-parallel
 * biases, the position embedding) were used on each rank's tokens only,
 * so each rank holds a part of their gradient; summed over the group
 * once a step, after accumulation and the replicas' sum, before clipping
 * and the optimizer: packed, one all-reduce, unpacked. Their elements in
 * [lo, hi) of the rank's layout (a pipeline stage's owned range, or under
 * ZeRO-2/3 the replica's cut, which the group's ranks share). */
loom_status loom_train_tp_sp_grads(loom_trainer *t, int64_t lo, int64_t hi) {
  if (!t->sp || !t->tp_map)
    return LOOM_OK;
  float *grads = loom_model_grads(t->model);
  int64_t n = whole_views(t, lo, hi, grads, NULL, false);
  if (n == 0)
    return LOOM_OK;
  float *buf = loom_malloc((size_t)n * sizeof *buf);
  if (!buf)
    return LOOM_ERR_NOMEM;
  whole_views(t, lo, hi, grads, buf, false);
  /* through the group's loom_tp: counted in its statistics */
  loom_status s =
      loom_tp_allreduce(loom_tp_group_tp(t->tpg), buf, n, LOOM_TP_SUM);
  if (s == LOOM_OK)
    whole_views(t, lo, hi, grads, buf, true);
  loom_free(buf);
  return s;
}
