/* The trainer's mesh and pipeline: replicas x stages of ranks, the GPT's
 * units cut into stages (loom_pipe), its steps, optimizer and evaluation. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loom/kernels.h"
#include "loom/nn.h"
#include "trainer.h"

/* The config's schedule names are the parallel layer's. */
_Static_assert((int)LOOM_CFG_PP_GPIPE == (int)LOOM_PIPE_GPIPE &&
                   (int)LOOM_CFG_PP_1F1B == (int)LOOM_PIPE_1F1B &&
                   (int)LOOM_CFG_PP_SCHEDULE_COUNT ==
                       (int)LOOM_PIPE_SCHEDULE_COUNT,
               "parallel.pp_schedule follows loom_pipe_schedule");

loom_status loom_train_mesh(loom_trainer *t) {
  const loom_config_parallel *pc = &t->cfg.parallel;
  int P = (int)pc->pp, T = (int)pc->tp;
  t->replica = t->rank;
  t->replicas = t->nranks;
  t->stage = 0;
  t->stages = 1;
  t->tp_rank = 0;
  t->tps = 1;
  LOOM_TRY(loom_train_check_world(&t->cfg, t->nranks));
  if (P == 1 && T == 1)
    return LOOM_OK;
  /* rank = (replica x P + stage) x T + tp_rank: a tensor-parallel group's
   * ranks neighbours (the same host first, as launchers place consecutive
   * ranks; its reductions run in every block), then a pipeline's stages,
   * the replicas apart. */
  t->tps = T;
  t->tp_rank = t->rank % T;
  t->stages = P;
  t->stage = t->rank / T % P;
  t->replica = t->rank / (T * P);
  t->replicas = t->nranks / (T * P);
  if (T > 1)
    LOOM_TRY(loom_group_split(t->world, t->rank / T, t->tp_rank, &t->tp_group));
  if (P > 1)
    LOOM_TRY(loom_group_split(t->world, t->replica * T + t->tp_rank, t->stage,
                              &t->pp_group));
  LOOM_TRY(loom_group_split(t->world, t->stage * T + t->tp_rank, t->replica,
                            &t->dp_group));
  return LOOM_OK;
}

/* ------------------------------------------------------------- building */

static loom_status make_instance(void *user, loom_model **out) {
  const loom_trainer *t = user;
  loom_model_opts mo = loom_model_opts_default();
  mo.shape_only = true;
  /* with tensor parallelism, this rank's part of the stage */
  return loom_train_model_make_tp(
      &t->cfg, &mo, t->tpg ? loom_tp_group_tp(t->tpg) : NULL, out);
}

/* The stages' bounds in the whole model's layout: a bound is where a
 * view begins (or the end), the same view in both layouts. */
static loom_status whole_bounds(loom_trainer *t) {
  t->whole_bounds = loom_calloc((size_t)t->stages + 1, sizeof(int64_t));
  if (!t->whole_bounds)
    return LOOM_ERR_NOMEM;
  if (!t->whole) {
    memcpy(t->whole_bounds, t->stage_bounds,
           ((size_t)t->stages + 1) * sizeof(int64_t));
    return LOOM_OK;
  }
  int nv = loom_model_num_views(t->model);
  for (int s = 0; s <= t->stages; s++) {
    int64_t b = t->stage_bounds[s];
    int i = 0;
    while (i < nv && loom_model_view(t->model, i)->offset < b)
      i++;
    t->whole_bounds[s] = i < nv ? loom_model_view(t->whole, i)->offset
                                : loom_model_num_params(t->whole);
  }
  return LOOM_OK;
}

/* Forward FLOPs per token of each unit of the GPT (backward is about
 * twice that everywhere, so the ratios hold): a block 24 C^2 (qkv, proj,
 * the 4x MLP) + 2 T C (attention, causal: half of 4 T C), the output
 * layer 2 C V, the embedding, norm and dropout a few C. */
void loom_train_unit_costs(const loom_config *cfg, const loom_model *m,
                           double *cost) {
  const loom_config_model *mc = &cfg->model;
  double C = (double)mc->d_model, T = (double)mc->context;
  double V = (double)mc->vocab;
  int n = loom_model_num_units(m), every = 1;
  if (loom_config_checkpoint_every(cfg->train.activation_checkpointing,
                                   &every) != LOOM_OK ||
      every < 1)
    every = 1;
  for (int u = 0; u < n; u++) {
    const char *name = loom_model_unit_name(m, u);
    const loom_module *root = loom_model_root((loom_model *)m);
    const char *type = loom_module_type(loom_sequential_child(root, u));
    if (strcmp(name, "head") == 0)
      cost[u] = 2 * C * V;
    else if (strcmp(type, "transformer_block") == 0)
      cost[u] = 24 * C * C + 2 * T * C;
    else if (strcmp(type, "checkpoint") == 0) /* K blocks, recomputed */
      cost[u] = (24 * C * C + 2 * T * C) * (double)every;
    else
      cost[u] = 4 * C;
  }
}

loom_status loom_train_pipe_new(loom_trainer *t, const loom_shape *input) {
  const loom_config_parallel *pc = &t->cfg.parallel;
  size_t n = (size_t)loom_model_num_params(t->model);
  size_t bytes = (n ? n : 1) * sizeof(float);
  /* Reserved: the pages of other stages' parameters are never touched. */
  t->pbuf = loom_vmem_new(bytes);
  t->gbuf = loom_vmem_new(bytes);
  if (!t->pbuf || !t->gbuf)
    return loom_error_context(LOOM_ERR_NOMEM, "the pipeline's buffers");
  loom_model_bind_params(t->model, t->pbuf);
  loom_model_bind_grads(t->model, t->gbuf);
  int nu = loom_model_num_units(t->model);
  double *cost = loom_calloc((size_t)nu, sizeof *cost);
  int split[LOOM_CONFIG_LIST_MAX];
  if (!cost)
    return LOOM_ERR_NOMEM;
  loom_train_unit_costs(&t->cfg, t->model, cost);
  for (int i = 0; i < pc->pp_split.n; i++)
    split[i] = (int)pc->pp_split.v[i];
  loom_pipe_opts o = loom_pipe_opts_default();
  o.micro_batches = t->micro;
  o.schedule = (loom_pipe_schedule)pc->pp_schedule;
  o.split = pc->pp_split.n > 0 ? split : NULL;
  o.unit_cost = cost;
  o.input = *input;
  o.input.dim[0] = t->batch / t->micro;
  o.chunk = (int64_t)(pc->bucket_mb * 1024 * 1024 / sizeof(float));
  o.compress = loom_train_compress_dtype(&t->cfg);
  loom_status s = loom_pipe_new(&t->pipe, t->model, t->pp_group, t->dp_group,
                                make_instance, t, &o);
  loom_free(cost);
  if (s != LOOM_OK)
    return loom_error_context(s, "pipeline stage %d", t->stage);
  t->stage_bounds = loom_calloc((size_t)t->stages + 1, sizeof(int64_t));
  if (!t->stage_bounds)
    return LOOM_ERR_NOMEM;
  loom_pipe_bounds(t->pipe, t->stage_bounds);
  LOOM_TRY(whole_bounds(t));
  if (t->zero >= 2 && t->replicas > 1) {
    /* zero2/3: each piece of the stage's gradient reduced to the replica
     * whose cut holds it */
    int64_t *c = loom_calloc((size_t)t->replicas + 1, sizeof *c);
    if (!c)
      return LOOM_ERR_NOMEM;
    for (int d = 0; d < t->replicas; d++)
      loom_train_pipe_cut(t, d, &c[d], &c[d + 1]);
    s = loom_pipe_set_cuts(t->pipe, c);
    /* tp 1: the norm's chunk sums of the stage, and each cut's count of
     * them (the cuts begin at whole chunks: loom_train_slice) */
    if (s == LOOM_OK && t->tps == 1) {
      const int64_t C = LOOM_GRAD_CHUNK;
      int64_t nc =
          (t->stage_bounds[t->stage + 1] - t->stage_bounds[t->stage] + C - 1) /
          C;
      t->z2_sums = loom_calloc((size_t)(nc ? nc : 1), sizeof *t->z2_sums);
      t->z2_counts = loom_calloc((size_t)t->replicas, sizeof *t->z2_counts);
      if (!t->z2_sums || !t->z2_counts)
        s = LOOM_ERR_NOMEM;
      for (int d = 0; d < t->replicas && s == LOOM_OK; d++)
        t->z2_counts[d] = (size_t)((c[d + 1] - c[d] + C - 1) / C);
    }
    loom_free(c);
    if (s != LOOM_OK)
      return loom_error_context(s, "pipeline stage %d", t->stage);
  }
  int u0, u1;
  loom_pipe_units(t->pipe, &u0, &u1);
  loom_log_file("pipeline stage %d of %d (replica %d of %d): units %d..%d "
                "(%s .. %s), parameters [%lld, %lld), %d instance(s)",
                t->stage, t->stages, t->replica, t->replicas, u0, u1 - 1,
                loom_model_unit_name(t->model, u0),
                loom_model_unit_name(t->model, u1 - 1),
                (long long)t->stage_bounds[t->stage],
                (long long)t->stage_bounds[t->stage + 1],
                loom_pipe_instances(t->pipe));
  if (t->rank == 0 && !t->opts.quiet) {
    char units[256];
    size_t off = 0;
    for (int s2 = 0; s2 < t->stages && off < sizeof units; s2++)
      off += (size_t)snprintf(
          units + off, sizeof units - off, "%s%lld", s2 ? " | " : "",
          (long long)(t->stage_bounds[s2 + 1] - t->stage_bounds[s2]));
    LOOM_INFO("pipeline parallel: %d stages x %d replica(s), schedule %s, "
              "%d micro-batches of %lld rows (bubble (P-1)/(M+P-1) = %.3f); "
              "parameters per stage: %s%s%s",
              t->stages, t->replicas, loom_pipe_schedule_name(o.schedule),
              t->micro, (long long)(t->batch / t->micro),
              loom_pipe_bubble_theory(t->stages, t->micro), units,
              t->replicas > 1 ? "; replicas' gradient sum in " : "",
              t->replicas > 1 ? loom_dtype_name(o.compress) : "");
  }
  return LOOM_OK;
}

void loom_train_pipe_free(loom_trainer *t) {
  loom_pipe_free(t->pipe);
  t->pipe = NULL;
  if (t->model) {
    loom_model_bind_params(t->model, NULL);
    loom_model_bind_grads(t->model, NULL);
  }
  size_t n = t->model ? (size_t)loom_model_num_params(t->model) : 0;
  size_t bytes = (n ? n : 1) * sizeof(float);
  loom_vmem_free(t->pbuf, bytes);
  loom_vmem_free(t->gbuf, bytes);
  t->pbuf = t->gbuf = NULL;
  loom_free(t->stage_bounds);
  loom_free(t->whole_bounds);
  t->stage_bounds = t->whole_bounds = NULL;
  loom_free(t->z2_sums);
  loom_free(t->z2_counts);
  t->z2_sums = NULL;
  t->z2_counts = NULL;
  loom_group_free(t->pp_group);
  loom_group_free(t->dp_group);
  t->pp_group = t->dp_group = NULL;
}

loom_status loom_train_pipe_init_params(loom_trainer *t) {
  int nr;
  const loom_range *r = loom_pipe_ranges(t->pipe, &nr);
  for (int i = 0; i < loom_model_num_views(t->model); i++) {
    const loom_param *v = loom_model_view(t->model, i);
    for (int k = 0; k < nr; k++)
      if (v->offset >= r[k].offset &&
          v->offset + v->numel <= r[k].offset + r[k].numel) {
        /* loom_model_init_view draws into the bound buffer */
        LOOM_TRY(loom_model_init_view(t->model, i));
        break;
      }
  }
  return LOOM_OK;
}

void loom_train_pipe_cut(const loom_trainer *t, int d, int64_t *lo,
                         int64_t *hi) {
  if (t->tps > 1)
    loom_train_tp_cut(t, d, lo, hi);
  else /* replica d's rank of this stage */
    loom_train_slice(t, d * t->stages + t->stage, lo, hi);
}

/* ---------------------------------------------------------------- steps */

/* What the pipeline's callbacks see of the step. */
typedef struct pipe_ctx {
  loom_trainer *t;
  const loom_batch *b;
  int64_t mb_rows; /* rows of a full micro-batch */
  int64_t total;   /* rows of the whole step, every replica's */
  double *sums;    /* SUM_N: this rank's loss statistics */
  uint64_t base;   /* global index of the batch's first row */
  double *part;    /* evaluation: the batch's loss, rows, correct */
} pipe_ctx;

static loom_status pipe_prepare(void *user, int mb, loom_model *inst,
                                loom_tensor *x) {
  pipe_ctx *c = user;
  int64_t lo = mb * c->mb_rows;
  /* Dropout keys: the global index of the micro-batch's first row, as
   * one rank running the same rows would use. */
  loom_model_set_step(inst, (uint64_t)c->t->step, c->base + (uint64_t)lo);
  if (!x)
    return LOOM_OK;
  int64_t n = c->b->size - lo < c->mb_rows ? c->b->size - lo : c->mb_rows;
  return loom_tensor_slice0(&c->b->x, lo, n, x);
}

static loom_status pipe_loss(void *user, int mb, const loom_tensor *y,
                             loom_tensor *dy) {
  pipe_ctx *c = user;
  loom_trainer *t = c->t;
  int64_t lo = mb * c->mb_rows;
  int64_t n = y->shape[0];
  const int32_t *tg =
      (const int32_t *)c->b->y.data + lo * (t->is_text ? c->b->y.shape[1] : 1);
  loom_xent_stats st;
  LOOM_TRY(loom_xent_forward(t->xent, y, tg, &st));
  double *u = c->part ? c->part : c->sums;
  /* a tensor-parallel group's ranks all have the loss: the first counts
   * it (train_step does so for the step's sums) */
  if (c->part && t->tp_rank > 0)
    u = NULL;
  if (u) {
    u[SUM_LOSS] += st.loss_sum;
    u[SUM_COUNT] += (double)st.count;
    u[SUM_CORRECT] += (double)st.correct;
  }
  if (!dy)
    return LOOM_OK;
  /* This micro-batch's mean loss weighed by its share of the step's rows:
   * the step's gradient is that of the mean over all its rows, as on one
   * rank (the replicas' gradients are then summed). */
  /* f16: weighed by the loss scale too (1 without) */
  return loom_xent_backward(t->xent, dy,
                            (float)((double)n / (double)c->total) *
                                loom_train_loss_scale(t));
}

loom_status loom_train_pipe_micro(loom_trainer *t, double *sums,
                                  loom_step_times *tm, int64_t *epoch) {
  int64_t total = loom_train_step_rows(t);
  int64_t *r = loom_calloc((size_t)t->micro, sizeof *r);
  if (!r)
    return LOOM_ERR_NOMEM;
  loom_status s = LOOM_OK;
  loom_pipe_io io = {pipe_prepare, pipe_loss, NULL, false};
  /* zero3: the stage's parameters whole for the step's micro-batches */
  double w0 = loom_time_now();
  LOOM_TRY_GOTO(s, loom_train_pipe_whole(t), done);
  tm->comm_wait += loom_time_now() - w0;
  for (int64_t m = 0; m < t->accumulate && s == LOOM_OK; m++) {
    io.last = m == t->accumulate - 1; /* the dp sum may start in it */
    const loom_batch *b;
    double late = t->n_faults > 0 ? loom_train_fault_data_delay(t) : 0;
    LOOM_TRY_GOTO(s, loom_loader_next(t->train_loader, &b), done);
    tm->data += b->wait_s + late;
    if (t->tracing) {
      double now = loom_time_now();
      loom_train_trace_step(t, "data wait", now - b->wait_s - late, now, NULL);
    }
    *epoch = b->epoch;
    pipe_ctx c = {.t = t,
                  .b = b,
                  .mb_rows = t->batch / t->micro,
                  .total = total,
                  .sums = sums};
    int64_t nb = loom_loader_batches_per_epoch(t->train_loader);
    int64_t gb = b->capacity * t->replicas;
    int64_t first =
        loom_loader_batch_first(t->train_loader, b->epoch, b->index);
    c.base = (uint64_t)(b->epoch * nb * gb + first + t->replica * b->capacity);
    for (int k = 0; k < t->micro; k++) {
      int64_t left = b->size - k * c.mb_rows;
      r[k] = left < 0 ? 0 : left > c.mb_rows ? c.mb_rows : left;
    }
    io.user = &c;
    loom_pipe_stats before, after;
    loom_pipe_get_stats(t->pipe, &before);
    s = loom_pipe_step(t->pipe, r, &io);
    loom_pipe_get_stats(t->pipe, &after);
    tm->forward += after.forward_s - before.forward_s;
    tm->backward += after.backward_s - before.backward_s;
    tm->pipe_wait += after.wait_s - before.wait_s;
    tm->pipe_step += after.step_s - before.step_s;
  }
done:
  loom_free(r);
  return s;
}

/* zero1 and zero2: each replica stepped its cut of the stage's range; every
 * replica gets the whole range (in place: its own cut is where it
 * belongs), before the tied weights go to the stage that borrows them. */
static loom_status zero1_gather(loom_trainer *t, float *params) {
  if (t->replicas == 1)
    return LOOM_OK;
  if (t->tps > 1) { /* the cuts of the rank's part of the stage's range */
    int64_t a, b, lo, hi;
    loom_train_tp_stepped(t, &a, &b);
    loom_train_tp_cut(t, t->replica, &lo, &hi);
    return loom_train_tp_gather_cuts(t, params + lo, params + a);
  }
  if (!t->zero_counts) {
    t->zero_counts = loom_calloc((size_t)t->replicas, sizeof *t->zero_counts);
    if (!t->zero_counts)
      return LOOM_ERR_NOMEM;
    for (int d = 0; d < t->replicas; d++) {
      int64_t lo, hi;
      loom_train_slice(t, d * t->stages + t->stage, &lo, &hi);
      t->zero_counts[d] = (size_t)(hi - lo);
    }
  }
  int64_t lo, hi;
  loom_train_slice(t, t->rank, &lo, &hi);
  loom_req req = LOOM_REQ_INIT;
  LOOM_TRY(loom_allgatherv(params + lo, params + t->stage_bounds[t->stage],
                           t->zero_counts, LOOM_F32, t->dp_group, &req));
  return loom_wait(&req);
}

/* Gives back the pages of buf (a reserved buffer of the model's layout)
 * in [lo, hi) outside [glo, ghi): the cut kept; the most resident before
 * into *peak. */
static void release_outside(const loom_trainer *t, float *buf, size_t *peak,
                            int64_t lo, int64_t hi, int64_t glo, int64_t ghi) {
  size_t all = (size_t)loom_model_num_params(t->model) * sizeof(float);
  size_t r = loom_vmem_resident(buf, 0, all);
  if (r > *peak)
    *peak = r;
  loom_vmem_release(buf, (size_t)lo * sizeof(float),
                    (size_t)glo * sizeof(float));
  loom_vmem_release(buf, (size_t)ghi * sizeof(float),
                    (size_t)hi * sizeof(float));
}

/* zero3: after the step, the stage's parameters outside the replica's cut
 * given back (the cut is what it stepped, keeps and saves); the most
 * resident before is the parameters' peak. */
static void zero3_release(loom_trainer *t, int64_t lo, int64_t hi, int64_t glo,
                          int64_t ghi) {
  release_outside(t, t->pbuf, &t->z3p_param_peak, lo, hi, glo, ghi);
  t->z3p_released = true;
}

loom_status loom_train_pipe_whole(loom_trainer *t) {
  if (!t->pipe || !t->z3p_released)
    return LOOM_OK;
  double t0 = loom_time_now();
  /* the replicas' cuts into place, then the tied weights to the stage
   * that borrows them (deferred from the step) */
  LOOM_TRY(zero1_gather(t, loom_model_params(t->model)));
  LOOM_TRY(loom_pipe_sync_params(t->pipe));
  loom_pipe_params_updated(t->pipe); /* the half copy made from these */
  t->z3p_released = false;
  if (t->tracing)
    loom_trace_span("train", "zero3 gather", t0, loom_time_now(), NULL);
  return LOOM_OK;
}

/* zero2, the global norm's sum of squares: each replica's chunks of the
 * stage's range (LOOM_GRAD_CHUNK each from its start; the cuts begin at
 * whole chunks, loom_train_slice), gathered over the replicas and added
 * in order as loom_grad_sumsq adds a range's chunks: the stage's sum as
 * ddp computes it, bit for bit; then over the stages. With tensor
 * parallelism the cut's views summed over the tp group and the replicas
 * (not ddp's bits). */
static loom_status zero2_sumsq(loom_trainer *t, int64_t lo, int64_t hi,
                               double *out) {
  double mine = 0;
  loom_req r = LOOM_REQ_INIT, rp = LOOM_REQ_INIT;
  if (t->tp_map) {
    LOOM_TRY(loom_train_tp_cut_sumsq(t, lo, hi, &mine));
  } else {
    const float *g = loom_model_grads(t->model);
    const int64_t C = LOOM_GRAD_CHUNK, a = t->stage_bounds[t->stage];
    int64_t nc = (t->stage_bounds[t->stage + 1] - a + C - 1) / C;
    int64_t c0 = (lo - a) / C;
    for (int64_t x = lo, c = c0; x < hi; x += C, c++)
      t->z2_sums[c] = loom_grad_sumsq(g + x, hi - x < C ? hi - x : C);
    LOOM_TRY(loom_allgatherv(t->z2_sums + c0, t->z2_sums, t->z2_counts,
                             LOOM_F64, t->dp_group, &r));
    LOOM_TRY(loom_wait(&r));
    for (int64_t c = 0; c < nc; c++)
      mine += t->z2_sums[c];
  }
  LOOM_TRY(loom_allreduce(&mine, out, 1, LOOM_F64, LOOM_SUM, t->pp_group, &rp));
  return loom_wait(&rp);
}

loom_status loom_train_pipe_optim(loom_trainer *t, float lr, double *gnorm,
                                  loom_step_times *tm) {
  double t0 = loom_time_now();
  loom_pipe_stats before, after;
  loom_pipe_get_stats(t->pipe, &before);
  LOOM_TRY(loom_pipe_finish_grads(t->pipe));
  float *params = loom_model_params(t->model);
  float *grads = loom_model_grads(t->model);
  int64_t lo, hi;
  loom_pipe_owned(t->pipe, &lo, &hi);
  /* [glo, ghi): where this rank holds the replicas' sum of the stage's
   * gradient; zero2: its cut only, the rest given back (its pages touched
   * again by the next step's backward) */
  int64_t glo = lo, ghi = hi;
  if (t->zero >= 2 && t->replicas > 1) {
    loom_train_pipe_cut(t, t->replica, &glo, &ghi);
    release_outside(t, t->gbuf, &t->z2_grad_peak, lo, hi, glo, ghi);
  }
  double clip = t->cfg.optim.grad_clip;
  /* f16: the stage's summed gradient unscaled; an inf or NaN on any rank
   * skips the step on every rank (the flag agreed over the world) */
  bool skip = false;
  LOOM_TRY(loom_train_tp_sp_grads(t, glo, ghi));
  LOOM_TRY(loom_train_scale_unscale(t, grads + glo, ghi - glo, &skip));
  if (!skip) {
    if (clip > 0) {
      double ss;
      if (t->zero >= 2 && t->replicas > 1) {
        LOOM_TRY(zero2_sumsq(t, glo, ghi, &ss));
      } else if (t->tp_map) {
        /* the stage's part: its cut views summed over the tp group, then
         * every stage's over the pipeline */
        double mine;
        loom_req r = LOOM_REQ_INIT;
        LOOM_TRY(loom_train_tp_grad_sumsq(t, lo, hi, &mine));
        LOOM_TRY(
            loom_allreduce(&mine, &ss, 1, LOOM_F64, LOOM_SUM, t->pp_group, &r));
        LOOM_TRY(loom_wait(&r));
      } else {
        LOOM_TRY(loom_pipe_grad_sumsq(t->pipe, &ss));
      }
      LOOM_TRY(
          loom_grad_clip_sumsq(grads + glo, ghi - glo, ss, (float)clip, gnorm));
    }
    LOOM_TRY(loom_optim_step(t->optim, params, grads, lr));
    if (t->zero == 3 && t->replicas > 1) {
      /* the cut kept, the rest gathered before the next use (with the
       * tied weights' sync) */
      zero3_release(t, lo, hi, glo, ghi);
    } else {
      if (t->zero >= 1)
        LOOM_TRY(zero1_gather(t, params));
      LOOM_TRY(loom_pipe_sync_params(t->pipe));
    }
    loom_pipe_params_updated(t->pipe); /* a new half copy at the next pass */
  }
  loom_pipe_get_stats(t->pipe, &after);
  double sync = after.sync_s - before.sync_s;
  tm->pp_dp_bytes = (double)(after.dp_wire_bytes - before.dp_wire_bytes);
  tm->comm_wait += sync;
  double t1 = loom_time_now();
  tm->optim += t1 - t0 - sync;
  if (t->tracing) {
    /* As without a pipeline, the optimizer's span holds the exchanges it
     * waits for (the tied weights', the replicas' sum): optim_s plus this
     * comm_wait_s (zero3's gather before the step has its own span). */
    char extra[48];
    snprintf(extra, sizeof extra, "\"comm_wait_s\":%.6f", sync);
    loom_train_trace_step(t, "optimizer", t0, t1, extra);
  }
  return LOOM_OK;
}

loom_status loom_train_pipe_eval(loom_trainer *t, const loom_batch *b,
                                 double *part) {
  int64_t mbr = t->cfg.train.batch_size / t->micro;
  int64_t *r = loom_calloc((size_t)t->micro, sizeof *r);
  if (!r)
    return LOOM_ERR_NOMEM;
  for (int k = 0; k < t->micro; k++) {
    int64_t left = b->size - k * mbr;
    r[k] = left < 0 ? 0 : left > mbr ? mbr : left;
  }
  pipe_ctx c = {.t = t, .b = b, .mb_rows = mbr, .total = 1, .part = part};
  loom_pipe_io io = {pipe_prepare, pipe_loss, &c, false};
  loom_status s = loom_train_pipe_whole(t);
  if (s == LOOM_OK)
    s = loom_pipe_forward(t->pipe, t->micro, r, &io);
  loom_free(r);
  return s;
}
