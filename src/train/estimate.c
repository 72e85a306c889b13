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
#include "loom/optim.h"
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
    if (path[0] && stat(path, &sb) == 0)
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

loom_status loom_train_estimate_memory(const loom_config *cfg, int ranks,
                                       loom_cfg_strategy strategy,
                                       loom_train_estimate *out) {
  if (!cfg || !out || ranks < 1)
    return loom_error(LOOM_ERR_INVALID_ARG, "estimate: bad arguments");
  memset(out, 0, sizeof *out);
  const loom_config_parallel *pc = &cfg->parallel;
  if (strategy == LOOM_CFG_STRATEGY_AUTO)
    strategy = ranks > 1 || pc->deterministic ? LOOM_CFG_STRATEGY_DDP
                                              : LOOM_CFG_STRATEGY_NONE;
  if (strategy == LOOM_CFG_STRATEGY_NONE && ranks > 1)
    return loom_error(LOOM_ERR_CONFIG,
                      "estimate: parallel.strategy none trains on one rank "
                      "only (asked for %d)",
                      ranks);
  out->strategy = strategy;
  out->available = true;
  out->ranks = ranks;
  /* One micro-batch of train.batch_size rows at a time (in deterministic
   * mode each virtual shard in turn). */
  out->batch = cfg->train.batch_size;

  /* The layout and the plan only: no parameter, gradient or activation
   * buffer is allocated, so a model larger than this machine can be sized. */
  loom_model_opts mo = loom_model_opts_default();
  mo.shape_only = true;
  loom_model *m = NULL;
  LOOM_TRY(loom_train_model_make(cfg, &mo, &m));
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
                (double)cfg->model.vocab
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
  out->params = (int64_t)psi;
  /* ZeRO-3: the slice and the units gathered at once (the one computing
   * and the next), which may overlap the slice: at most all of them. */
  out->param_bytes =
      f * (shard_params && ranks > 1
               ? (slice + unit + unit2 < psi ? slice + unit + unit2 : psi)
               : psi);
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
  /* The loader's ring: the batch in use and data.prefetch ahead, each of
   * the rank's rows (f32 images and an int32 label, or int32 tokens and
   * their int32 targets). */
  {
    double row = cfg->data.dataset == LOOM_CFG_DATASET_FASHION_MNIST
                     ? 28.0 * 28.0 * 4.0 + 4.0
                     : 8.0 * (double)cfg->model.context;
    int64_t rows = cfg->train.batch_size;
    if (pc->deterministic && pc->virtual_shards / ranks > 1)
      rows *= pc->virtual_shards / ranks;
    out->data_bytes = (double)(cfg->data.prefetch + 1) * (double)rows * row;
  }
  out->dataset_known =
      dataset_memory(cfg, &out->dataset_bytes, &out->mapped_bytes);
  out->data_bytes += out->dataset_bytes;
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
    const bool shared_params = strategy == LOOM_CFG_STRATEGY_ZERO2;
    out->comm_bytes +=
        (double)(ranks - 1) / ranks * f * psi *
        ((shared_grads ? 1.0 : 0.0) + (shared_params ? 1.0 : 0.0));
  }
  out->process_bytes = LOOM_ESTIMATE_PROCESS_MB * 1024.0 * 1024.0;
  if (cfg->checkpoint.enabled && cfg->checkpoint.async)
    out->ckpt_bytes = f * (1.0 + k) * (ranks > 1 ? slice : psi);
  out->total_bytes = out->param_bytes + out->grad_bytes + out->optim_bytes +
                     out->act_bytes + out->data_bytes + out->comm_bytes +
                     out->ckpt_bytes + out->process_bytes;
  return LOOM_OK;
}
