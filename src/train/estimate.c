/* Memory per rank of a training config, by category, per strategy: what
 * loom estimate prints and the batch-size search uses. The formulas follow
 * what the trainer allocates (see the comments); the activations come from
 * planning the model itself for one micro-batch. */
#include <glob.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "loom/data.h"
#include "loom/kernels.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/parallel.h"
#include "trainer.h"

double loom_train_peak_rss(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0)
    return 0.0;
  return (double)ru.ru_maxrss * 1024.0; /* Linux: KiB */
}

/* Optimizer state buffers (f32, one element per parameter each). */
static int state_count(const loom_config *cfg) {
  loom_optim_opts oo = loom_optim_opts_default();
  oo.kind = cfg->optim.name;
  oo.momentum = cfg->optim.momentum;
  return loom_optim_opts_state_count(&oo);
}

/* The model's input for `rows` rows: images of Fashion-MNIST, or token
 * windows of model.context. */
static loom_shape input_shape(const loom_config *cfg, int64_t rows) {
  if (cfg->data.dataset == LOOM_CFG_DATASET_FASHION_MNIST) {
    int64_t d[4] = {rows, 1, 28, 28};
    return loom_shape_make(LOOM_F32, 4, d);
  }
  int64_t d[2] = {rows, cfg->model.context};
  return loom_shape_make(LOOM_I32, 2, d);
}

/* The data set as the trainer opens it (open_data in loop.c), from file
 * sizes alone: resident bytes, and the bytes of files it maps. */
static bool dataset_memory(const loom_config *cfg, double *resident,
                           double *mapped) {
  const loom_config_data *dc = &cfg->data;
  *resident = *mapped = 0;
  if (dc->dataset == LOOM_CFG_DATASET_FASHION_MNIST) {
    int64_t tr = 0, va = 0, n = 0;
    const char *dir = dc->path[0] ? dc->path : NULL;
    loom_status s = loom_fashion_bytes(dir, LOOM_SPLIT_TRAIN, &tr, &n);
    if (s == LOOM_OK)
      s = loom_fashion_bytes(dir, LOOM_SPLIT_VAL, &va, NULL);
    loom_clear_error();
    if (s != LOOM_OK)
      return false;
    *resident = (double)(tr + va) + 8.0 * (double)n;
    return true;
  }
  struct stat sb;
  if (dc->dataset == LOOM_CFG_DATASET_KJV) {
    char path[4096];
    if (dc->path[0])
      snprintf(path, sizeof path, "%s", dc->path);
    else if (loom_kjv_default_path(path, sizeof path) != LOOM_OK)
      path[0] = '\0';
    loom_clear_error();
    double bytes;
    if (path[0] && stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
      bytes = (double)sb.st_size;
    else if (!dc->path[0])
      bytes = LOOM_KJV_BYTES; /* not prepared yet: training writes it */
    else
      return false;
    /* Train and val split each read the whole file; one window a token
     * position in the sampler's order, about. */
    double windows = bytes / (double)(cfg->model.context + 1);
    *resident = 2.0 * bytes + 8.0 * windows;
    return true;
  }
  /* bin: every file of both patterns is mapped. */
  const char *pats[2] = {dc->path, dc->val_path};
  for (int i = 0; i < 2; i++) {
    glob_t g;
    if (!pats[i][0] || glob(pats[i], GLOB_ERR, NULL, &g) != 0)
      return false;
    for (size_t k = 0; k < g.gl_pathc; k++)
      if (stat(g.gl_pathv[k], &sb) == 0)
        *mapped += (double)sb.st_size;
    globfree(&g);
  }
  return true;
}

/* The loader's ring: the batch in use and data.prefetch ahead, each of the
 * rank's rows (f32 images and an int32 label, or int32 tokens and their
 * int32 targets); and the data set. */
static void loader_memory(const loom_config *cfg, int ranks,
                          loom_train_estimate *out) {
  const loom_config_parallel *pc = &cfg->parallel;
  double row = cfg->data.dataset == LOOM_CFG_DATASET_FASHION_MNIST
                   ? 28.0 * 28.0 * 4.0 + 4.0
                   : 8.0 * (double)cfg->model.context;
  int64_t rows = cfg->train.batch_size;
  if (pc->deterministic && pc->virtual_shards / ranks > 1)
    rows *= pc->virtual_shards / ranks;
  out->data_bytes = (double)(cfg->data.prefetch + 1) * (double)rows * row;
  out->dataset_known =
      dataset_memory(cfg, &out->dataset_bytes, &out->mapped_bytes);
  out->data_bytes += out->dataset_bytes;
}

/* The categories' sum into total_bytes. */
static loom_status total(loom_train_estimate *out) {
  out->total_bytes = out->param_bytes + out->grad_bytes + out->optim_bytes +
                     out->act_bytes + out->data_bytes + out->comm_bytes +
                     out->ckpt_bytes + out->process_bytes;
  return LOOM_OK;
}

static double process_bytes(int ranks) {
  return (LOOM_ESTIMATE_PROCESS_MB + (ranks > 1 ? LOOM_ESTIMATE_MPI_MB : 0) +
          (loom_dnnl_version() >= 300 ? LOOM_ESTIMATE_DNNL3_MB : 0)) *
         1024.0 * 1024.0;
}

/* The model one rank holds: with parallel.tp > 1 its tensor-parallel part
 * (the layout of tp rank 0; every rank's is the same size), built
 * shape_only. */
static loom_status no_start(void *user, int slot, float *buf, int64_t n,
                            loom_tp_op op) {
  (void)user, (void)slot, (void)buf, (void)n, (void)op;
  return LOOM_ERR_UNSUPPORTED; /* sizing only: nothing runs */
}

static loom_status no_wait(void *user, int slot) {
  (void)user, (void)slot;
  return LOOM_ERR_UNSUPPORTED;
}

static loom_status no_gather(void *user, int slot, const void *send, void *recv,
                             int64_t n, loom_dtype dt) {
  (void)user, (void)slot, (void)send, (void)recv, (void)n, (void)dt;
  return LOOM_ERR_UNSUPPORTED;
}

static loom_status no_move(void *user, int slot, const float *send, float *recv,
                           int64_t n) {
  (void)user, (void)slot, (void)send, (void)recv, (void)n;
  return LOOM_ERR_UNSUPPORTED;
}

/* tp: the caller's, living as long as *m (the modules keep a pointer to
 * it). */
static loom_status rank_model(const loom_config *cfg, loom_tp *tp,
                              loom_model **m) {
  loom_model_opts mo = loom_model_opts_default();
  mo.shape_only = true;
  *tp = (loom_tp){.size = (int)cfg->parallel.tp,
                  .rank = 0,
                  .start = no_start,
                  .wait = no_wait,
                  .gather = no_gather,
                  .scatter = no_move};
  return loom_train_model_make_tp(cfg, &mo, cfg->parallel.tp > 1 ? tp : NULL,
                                  m);
}

/* Transformer blocks among units [u0, u1) of m (a checkpointed segment
 * holds `every` of them). */
static int blocks_in(const loom_config *cfg, loom_model *m, int u0, int u1) {
  int every = 1, n = 0;
  if (loom_config_checkpoint_every(cfg->train.activation_checkpointing,
                                   &every) != LOOM_OK ||
      every < 1)
    every = 1;
  loom_module *root = loom_model_root(m);
  for (int u = u0; u < u1; u++) {
    const char *type = loom_module_type(loom_sequential_child(root, u));
    if (strcmp(type, "transformer_block") == 0)
      n++;
    else if (strcmp(type, "checkpoint") == 0)
      n += every;
  }
  return n;
}

/* The whole model's parameters (Psi) when m is this rank's part of it
 * (parallel.tp > 1: the layout alone, built again), else m's own. */
static loom_status whole_params(const loom_config *cfg, const loom_model *m,
                                int64_t *n) {
  *n = loom_model_num_params(m);
  if (cfg->parallel.tp <= 1)
    return LOOM_OK;
  loom_model *w = NULL;
  loom_model_opts wo = loom_model_opts_default();
  wo.shape_only = true;
  loom_status s = loom_train_model_make(cfg, &wo, &w);
  if (s != LOOM_OK)
    return loom_error_context(s, "estimate: the whole model");
  *n = loom_model_num_params(w);
  loom_model_free(w);
  return LOOM_OK;
}

/* Bytes a rank sends per step for tensor parallelism: per block, one
 * all-reduce of the (rows, context, d_model) activations for attention
 * and one for the MLP, in forward and again in backward (2 (T - 1) / T of
 * the buffer each); `passes` micro-batches of `rows`. */
static double tp_sent(const loom_config *cfg, int blocks, int64_t rows,
                      double passes) {
  const double T = (double)cfg->parallel.tp;
  if (T <= 1)
    return 0;
  const double act = 4.0 * (double)rows * (double)cfg->model.context *
                     (double)cfg->model.d_model;
  /* sequence parallelism: each all-reduce a reduce-scatter and an
   * all-gather, the same bytes, but in bf16/f16 the all-gathers (the
   * inputs of qkv and of the MLP's first layer, the output gradients of
   * the two row-parallel layers) carry 2-byte values; with regather the
   * inputs of qkv and of the MLP's first layer all-gathered once more in
   * backward */
  const bool sp = cfg->parallel.sequence_parallel;
  const double g =
      sp && cfg->train.precision != LOOM_CFG_PRECISION_F32 ? 0.5 : 1.0;
  double per_block =
      sp ? 4.0 * (1.0 + g) * (T - 1) / T * act : 4.0 * 2.0 * (T - 1) / T * act;
  if (sp && cfg->parallel.sequence_parallel_regather)
    per_block += 2.0 * g * (T - 1) / T * act;
  return passes * (double)blocks * per_block;
}

loom_status loom_train_estimate_memory(const loom_config *cfg, int ranks,
                                       loom_cfg_strategy strategy,
                                       loom_train_estimate *out) {
  if (!cfg || !out || ranks < 1)
    return loom_error(LOOM_ERR_INVALID_ARG, "estimate: bad arguments");
  memset(out, 0, sizeof *out);
  const loom_config_parallel *pc = &cfg->parallel;
  if (pc->pp > 1) {
    /* The stage that needs the most. */
    for (int st = 0; st < (int)pc->pp; st++) {
      loom_train_estimate e;
      LOOM_TRY(loom_train_estimate_stage(cfg, ranks, st, &e));
      if (st == 0 || e.total_bytes > out->total_bytes)
        *out = e;
    }
    return LOOM_OK;
  }
  if (strategy == LOOM_CFG_STRATEGY_AUTO)
    strategy = ranks > 1 || pc->deterministic ? LOOM_CFG_STRATEGY_DDP
                                              : LOOM_CFG_STRATEGY_NONE;
  if (strategy == LOOM_CFG_STRATEGY_NONE && ranks > 1)
    return loom_error(LOOM_ERR_CONFIG,
                      "estimate: parallel.strategy none trains on one rank "
                      "only (asked for %d)",
                      ranks);
  /* With tensor parallelism the data-parallel strategies run over the
   * ranks / tp replicas, each holding its part of the model. */
  const int T = (int)pc->tp;
  if (ranks % T != 0)
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.tp %d does not divide the %d ranks", T, ranks);
  const int tp_ranks = ranks;
  ranks /= T;
  out->strategy = strategy;
  out->available = true;
  out->ranks = tp_ranks;
  out->stages = 1;
  out->dp = ranks;
  out->instances = 1;
  /* One micro-batch at a time: train.batch_size rows, or its
   * parallel.micro_batches' share (in deterministic mode each virtual
   * shard in turn). */
  out->batch =
      cfg->train.batch_size / (pc->micro_batches > 1 ? pc->micro_batches : 1);

  /* The layout and the plan only: no parameter, gradient or activation
   * buffer is allocated, so a model larger than this machine can be sized. */
  loom_model *m = NULL;
  loom_tp tp;
  LOOM_TRY(rank_model(cfg, &tp, &m));
  /* with tensor parallelism, the whole model's count too: checkpoints
   * keep its layout */
  int64_t whole = 0;
  loom_status ws = whole_params(cfg, m, &whole);
  if (ws != LOOM_OK) {
    loom_model_free(m);
    return ws;
  }
  const double whole_n = (double)whole;
  const int blocks = blocks_in(cfg, m, 0, loom_model_num_units(m));
  const loom_shape in = input_shape(cfg, out->batch);
  size_t act = 0, scratch = 0;
  loom_status s = loom_model_act_bytes(m, &in, &act, &scratch);
  const double psi = (double)loom_model_num_params(m);
  /* ZeRO-3 holds a unit being used and the next one being gathered (units
   * of parallel.shard_unit). */
  double unit = 0, unit2 = 0;
  loom_zero3_opts zo = loom_zero3_opts_default();
  int nu = loom_model_num_units(m);
  int *group_of = loom_calloc((size_t)(nu ? nu : 1), sizeof(int));
  if (s == LOOM_OK && !group_of)
    s = LOOM_ERR_NOMEM;
  if (s == LOOM_OK)
    s = loom_config_shard_unit(pc->shard_unit, &zo.every, &zo.min_params);
  int ng = s == LOOM_OK ? loom_zero3_group_units(m, &zo, group_of) : 0;
  for (int g = 0; g < ng; g++) {
    double e = (double)loom_zero3_group_numel(m, group_of, g);
    if (e > unit) {
      unit2 = unit;
      unit = e;
    } else if (e > unit2) {
      unit2 = e;
    }
  }
  loom_free(group_of);
  loom_model_free(m);
  if (s != LOOM_OK)
    return loom_error_context(s, "estimate: planning the model");
  /* The model's output: logits of every row (every token for the GPT). */
  const double out_floats =
      cfg->model.name == LOOM_CFG_MODEL_GPT
          ? (double)out->batch * (double)cfg->model.context *
                (double)cfg->model.vocab / (double)T
          : (double)out->batch * 10.0; /* Fashion-MNIST's classes */

  const double f = 4.0; /* f32 */
  const double k = state_count(cfg);
  const bool ddp = strategy != LOOM_CFG_STRATEGY_NONE;
  const bool shard_grads = strategy == LOOM_CFG_STRATEGY_ZERO2 ||
                           strategy == LOOM_CFG_STRATEGY_ZERO3 ||
                           strategy == LOOM_CFG_STRATEGY_FSDP;
  const bool shard_params =
      strategy == LOOM_CFG_STRATEGY_ZERO3 || strategy == LOOM_CFG_STRATEGY_FSDP;
  const bool shard_optim =
      strategy != LOOM_CFG_STRATEGY_NONE && strategy != LOOM_CFG_STRATEGY_DDP;
  /* The largest slice: ceil(Psi / P). */
  const double slice = ranks > 1 ? (double)((int64_t)psi / ranks + 1) : psi;
  out->params = whole;              /* the model's, whatever the mesh */
  out->stage_params = (int64_t)psi; /* this rank's tensor-parallel part */
  out->unit_end = nu;
  /* ZeRO-3: the slice and the units gathered at once (the one computing
   * and the next), which may overlap the slice: at most all of them. */
  out->param_bytes =
      f * (shard_params && ranks > 1
               ? (slice + unit + unit2 < psi ? slice + unit + unit2 : psi)
               : psi);
  /* bf16/f16: the model's copy of every parameter in the half type
   * (loom_model_half_bytes: 2 bytes each, 4 on the conversion path, whose
   * copy holds the values in f32); ZeRO-3's follows its gathers (the units
   * present, always 2 bytes) */
  out->half = loom_train_precision_dtype(cfg);
  if (out->half != LOOM_F32) {
    const bool bound = shard_params && ranks > 1;
    out->half_copy_bytes = bound || loom_half_on_unit(out->half) ? 2 : 4;
    out->param_bytes +=
        out->half_copy_bytes *
        (bound ? (unit + unit2 < psi ? unit + unit2 : psi) : psi);
  }
  /* The model's own gradient buffer, or DDP's (shared memory) that
   * replaces it while DDP lives (the model's is freed then); sharded: the
   * slice and three buckets (two in flight and the one backward is
   * filling). */
  if (shard_grads && ranks > 1) {
    double cap = pc->bucket_mb * 1024.0 * 1024.0 / f;
    if (pc->bucket_mb <= 0 || psi / 8.0 < cap)
      cap = psi / 8.0; /* ddp's min_buckets */
    double g = slice + 3.0 * cap;
    out->grad_bytes = f * (g < psi ? g : psi);
  } else if (shard_grads) {
    out->grad_bytes = f * psi;
  } else {
    out->grad_bytes = f * psi;
  }
  out->optim_bytes = f * k * (shard_optim ? slice : psi);
  /* The arena (activations, scratch, the output's gradient) and the loss's
   * copy of the output (probabilities). */
  out->act_bytes = (double)(act + scratch) + 2.0 * f * out_floats;
  loader_memory(cfg, ranks, out);
  if (ddp && pc->deterministic) {
    int64_t shards = pc->virtual_shards / ranks;
    out->comm_bytes += f * psi * (double)(shards > 1 ? shards - 1 : 0);
  }
  if (ddp && pc->compress != LOOM_CFG_COMPRESS_NONE)
    out->comm_bytes += 2.0 * (shard_grads ? slice : psi);
  if (ddp && ranks > 1) {
    /* The staging slots of the shared-memory path: two per rank, each rank
     * maps all. */
    out->comm_bytes +=
        2.0 * ranks * (double)loom_comm_opts_default().chunk_bytes;
    /* A shared buffer's direct path has each rank write its part of every
     * other rank's buffer (the reduced gradient segment, the stepped
     * parameter slice): those pages of the others count in this rank's
     * resident set too (the same physical pages; ranks on one host). */
    const bool shared_grads = !shard_grads && !pc->deterministic;
    /* (with tensor parallelism each replica keeps its own parameters) */
    const bool shared_params = strategy == LOOM_CFG_STRATEGY_ZERO2 && T == 1;
    out->comm_bytes +=
        (double)(ranks - 1) / ranks * f * psi *
        ((shared_grads ? 1.0 : 0.0) + (shared_params ? 1.0 : 0.0));
  }
  /* Sent per step: an all-reduce of the gradients (DDP; ZeRO-1 too, then
   * the parameters' all-gather), their reduce-scatter and the parameters'
   * all-gather (ZeRO-2), and ZeRO-3's gather of every unit in forward and
   * again in backward of each micro-batch. */
  if (ddp && ranks > 1) {
    const double share = (double)(ranks - 1) / ranks;
    const double wire = pc->compress != LOOM_CFG_COMPRESS_NONE ? 2.0 : f;
    const double passes =
        (double)cfg->train.accumulate *
        (double)(pc->micro_batches > 1 ? pc->micro_batches : 1);
    if (strategy == LOOM_CFG_STRATEGY_DDP)
      out->sent_bytes = 2.0 * share * wire * psi;
    else if (shard_params)
      out->sent_bytes = share * (wire + 2.0 * passes * f) * psi;
    else if (shard_grads)
      out->sent_bytes = share * (wire + f) * psi;
    else
      out->sent_bytes = share * (2.0 * wire + f) * psi;
  }
  out->sent_bytes +=
      tp_sent(cfg, blocks, out->batch,
              (double)cfg->train.accumulate *
                  (double)(pc->micro_batches > 1 ? pc->micro_batches : 1));
  out->process_bytes = process_bytes(tp_ranks);
  if (cfg->checkpoint.enabled && (cfg->checkpoint.async || T > 1)) {
    /* The snapshot: the rank's checkpoint slice of the parameters and of
     * each optimizer state; with tensor parallelism always (the slice of
     * the whole layout, put together from the group), and with zero1-3
     * one state of the rank's whole part (zero3 makes it at each save
     * only: its peak). */
    out->ckpt_bytes = T > 1 ? f * (1.0 + k) * (whole_n / tp_ranks + 1.0) +
                                  (shard_optim ? f * psi : 0.0)
                            : f * (1.0 + k) * (ranks > 1 ? slice : psi);
  }
  return total(out);
}

/* Stage `stage` of a pipeline (docs/parallel.md): the units loom_pipe
 * gives it (the same partition, from the same costs or parallel.pp_split),
 * its own parameter range and the tied ones it reads, `instances` copies
 * of its part of the model each with an arena for one micro-batch, the
 * activation buffers between stages, and the data-parallel sum of its
 * range over the replicas. */
loom_status loom_train_estimate_stage(const loom_config *cfg, int ranks,
                                      int stage, loom_train_estimate *out) {
  if (!cfg || !out || ranks < 1)
    return loom_error(LOOM_ERR_INVALID_ARG, "estimate: bad arguments");
  memset(out, 0, sizeof *out);
  const loom_config_parallel *pc = &cfg->parallel;
  const int P = (int)pc->pp;
  if (stage < 0 || stage >= P)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "estimate: stage %d of parallel.pp %d", stage, P);
  if (ranks % P != 0 || (pc->dp > 0 && pc->dp * P * pc->tp != ranks))
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.dp %lld x parallel.pp %d is not the %d ranks "
                      "(parallel.dp 0: auto, ranks / parallel.pp)",
                      (long long)pc->dp, P, ranks);
  const int T = (int)pc->tp;
  if (ranks % (P * T) != 0)
    return loom_error(LOOM_ERR_CONFIG,
                      "parallel.tp %d x parallel.pp %d does not divide the %d "
                      "ranks",
                      T, P, ranks);
  const int D = ranks / (P * T);
  const int M = pc->micro_batches > 1 ? (int)pc->micro_batches : 1;
  /* zero1: the optimizer state of the stage's range cut among its
   * replicas, the cuts gathered after the step; zero2: also each piece of
   * the gradient reduced to the replica whose cut holds it (the rest given
   * back after the reduce, but the stage's gradient accumulates over the
   * micro-batches in full first: the peak below); zero3/fsdp: zero2's
   * sums, and only the cut of the parameters kept between steps (the
   * stage's whole for the step: the peak below, and zero2's bytes, the
   * gather moved to the start of the next step) */
  const bool zero3 = pc->strategy == LOOM_CFG_STRATEGY_ZERO3 ||
                     pc->strategy == LOOM_CFG_STRATEGY_FSDP;
  const bool zero2 = pc->strategy == LOOM_CFG_STRATEGY_ZERO2 || zero3;
  const bool zero1 = pc->strategy == LOOM_CFG_STRATEGY_ZERO1;
  const bool cut_optim = zero1 || zero2; /* the optimizer state cut */
  out->strategy = zero3   ? LOOM_CFG_STRATEGY_ZERO3
                  : zero2 ? LOOM_CFG_STRATEGY_ZERO2
                  : zero1 ? LOOM_CFG_STRATEGY_ZERO1
                  : D > 1 ? LOOM_CFG_STRATEGY_DDP
                          : LOOM_CFG_STRATEGY_NONE;
  out->available = true;
  out->ranks = ranks;
  out->stages = P;
  out->stage = stage;
  out->dp = D;
  out->batch = cfg->train.batch_size / M;
  out->instances = pc->pp_schedule == LOOM_CFG_PP_GPIPE ? M
                   : M < P - stage                      ? M
                                                        : P - stage;

  loom_model *m = NULL;
  loom_tp tp;
  LOOM_TRY(rank_model(cfg, &tp, &m));
  const int nu = loom_model_num_units(m);
  double *cost = loom_calloc((size_t)nu, sizeof *cost);
  int *first = loom_calloc((size_t)P + 1, sizeof *first);
  int64_t *cum = loom_calloc((size_t)nu + 1, sizeof *cum);
  int split[LOOM_CONFIG_LIST_MAX];
  loom_status s = cost && first && cum ? LOOM_OK : LOOM_ERR_NOMEM;
  if (s == LOOM_OK) {
    loom_train_unit_costs(cfg, m, cost);
    for (int i = 0; i < pc->pp_split.n; i++)
      split[i] = (int)pc->pp_split.v[i];
    s = loom_pipe_partition(nu, P, pc->pp_split.n > 0 ? split : NULL, cost,
                            first);
  }
  if (s == LOOM_OK)
    s = loom_pipe_own_bounds(m, cum);
  /* The stage's input (the units before it, dry-run) and output. */
  loom_shape x = input_shape(cfg, out->batch), y;
  loom_module *root = loom_model_root(m);
  for (int u = 0; s == LOOM_OK && u < first[stage]; u++)
    s = loom_nn_plan_dry((loom_module *)loom_sequential_child(root, u), &x, &x);
  y = x;
  for (int u = s == LOOM_OK ? first[stage] : 0;
       s == LOOM_OK && u < first[stage + 1]; u++)
    s = loom_nn_plan_dry((loom_module *)loom_sequential_child(root, u), &y, &y);
  size_t act = 0, scratch = 0;
  if (s == LOOM_OK)
    s = loom_model_set_unit_range(m, first[stage], first[stage + 1]);
  if (s == LOOM_OK)
    s = loom_model_act_bytes(m, &x, &act, &scratch);
  /* Borrowed (tied) ranges: those this stage reads from another, and
   * those others read from it (it keeps a buffer for their gradient). */
  double borrowed = 0, lent = 0;
  for (int st = 0; s == LOOM_OK && st < P; st++) {
    int64_t lo = cum[first[st]], hi = cum[first[st + 1]];
    for (int u = first[st]; u < first[st + 1]; u++) {
      int nr;
      const loom_range *r = loom_model_unit_ranges(m, u, &nr);
      for (int k = 0; k < nr; k++) {
        if (r[k].offset >= lo && r[k].offset + r[k].numel <= hi)
          continue;
        if (st == stage)
          borrowed += (double)r[k].numel;
        else if (r[k].offset >= cum[first[stage]] &&
                 r[k].offset + r[k].numel <= cum[first[stage + 1]])
          lent += (double)r[k].numel;
      }
    }
  }
  int blocks = 0;
  if (s == LOOM_OK) {
    blocks = blocks_in(cfg, m, first[stage], first[stage + 1]);
    s = whole_params(cfg, m, &out->params);
  }
  if (s == LOOM_OK) {
    out->unit_first = first[stage];
    out->unit_end = first[stage + 1];
    out->stage_params = cum[first[stage + 1]] - cum[first[stage]];
  }
  loom_free(cost);
  loom_free(first);
  loom_free(cum);
  loom_model_free(m);
  if (s != LOOM_OK)
    return loom_error_context(s, "estimate: planning pipeline stage %d", stage);

  const double f = 4.0; /* f32 */
  const double k = state_count(cfg);
  const double own = (double)out->stage_params;
  const double in_floats = stage > 0 ? (double)loom_shape_numel(&x) : 0;
  const double out_floats = (double)loom_shape_numel(&y);
  const bool last = stage == P - 1;
  /* The buffers are reserved for the whole model; only the stage's range
   * and what it borrows are touched. */
  out->param_bytes = f * (own + borrowed);
  /* bf16/f16: the instances' one half copy of the same ranges */
  out->half = loom_train_precision_dtype(cfg);
  if (out->half != LOOM_F32) {
    out->half_copy_bytes = 2;
    out->param_bytes += 2.0 * (own + borrowed);
  }
  out->grad_bytes = f * (own + borrowed);
  out->optim_bytes = f * k * (cut_optim ? own / D + 1.0 : own);
  /* Each instance's arena (activations, scratch, the output's gradient),
   * its input and the input's gradient from the stage before; the last
   * stage's loss keeps one micro-batch's probabilities. */
  out->act_bytes =
      (double)out->instances *
          ((double)(act + scratch) + f * out_floats + 2.0 * f * in_floats) +
      (last ? f * out_floats : 0);
  loader_memory(cfg, ranks, out);
  /* parallel.compress: the dp sum's 16-bit copy of the range (2 bytes an
   * element), else f32 in place */
  const bool wire16 = D > 1 && pc->compress != LOOM_CFG_COMPRESS_NONE;
  const double w = wire16 ? 2.0 : f;
  /* The owner's buffer for a borrowed range's gradient; the staging
   * slots of the shared-memory path; the wire copy. */
  out->comm_bytes = f * lent + (wire16 ? w * own : 0.0);
  if (ranks > 1)
    out->comm_bytes +=
        2.0 * ranks * (double)loom_comm_opts_default().chunk_bytes;
  /* Sent per step, every accumulation step running M micro-batches:
   * activations forward (all but the last stage), their gradients back
   * (all but the first), the borrowed gradients to their owner and the
   * new values back, the stage's range all-reduced over the replicas. */
  const double passes = (double)cfg->train.accumulate * (double)M;
  out->sent_bytes = passes * f * ((last ? 0 : out_floats) + in_floats) +
                    f * (borrowed + lent);
  /* ddp: an all-reduce, 2 (D-1)/D of the range (in the wire type w);
   * zero1: and the cuts' all-gather (f32); zero2: a reduce-scatter's
   * volume (w) and the all-gather */
  if (D > 1)
    out->sent_bytes += (double)(D - 1) / D * own *
                       (zero1   ? 2.0 * w + f
                        : zero2 ? w + f
                                : 2.0 * w);
  out->sent_bytes += tp_sent(cfg, blocks, out->batch, passes);
  out->process_bytes = process_bytes(ranks);
  /* the snapshot (always with tensor parallelism; zero1 then adds room
   * for one optimizer state of the stage's range) */
  if (cfg->checkpoint.enabled && (cfg->checkpoint.async || T > 1))
    out->ckpt_bytes =
        f * (1.0 + k) * (own / D + 1.0) + (T > 1 && cut_optim ? f * own : 0.0);
  return total(out);
}
